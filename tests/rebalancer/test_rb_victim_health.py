"""Victim health: measured run-queue waits pick victims, breached targets cost, measurements judge."""

from __future__ import annotations

from dataclasses import replace

import pytest

from perfbalance.cpuset import CpuSet
from perfbalance.model import Plan, Snapshot
from rebalancer import RebalancerConfig, plan
from rebalancer.evaluate import health_call
from rebalancer.health import TARGET_ANNOTATION, measure, noise, parse_duration, target_of

from rb_builders import sample, snap, topo

CFG = RebalancerConfig(settle_seconds=30.0, dwell_seconds=60.0, smoothing_alpha=1.0,
                       latency_targets={"-/pod-lat/lat": 0.002})


def rq(wait: float, p99: float, *, throttled: float = 0.0, waits: float = 500.0) -> dict[str, float]:
    return {"runqueue_wait_seconds_per_second": wait, "runqueue_latency_p99_seconds": p99,
            "runqueue_latency_mean_seconds": wait / waits, "runqueue_waits": waits,
            "cpu_throttled_seconds_per_second": throttled}


def shared(lat: dict[str, float], *, time: float = 1000.0, lat_cpus: str = "1") -> Snapshot:
    """A latency container (0.2 cores) pinned with two busy loops on CPU 1; CPUs 2-7 idle."""
    return snap(topo(), sample("lat", lat_cpus, request=200, cpu_usage_cores=0.2, **lat),
                sample("hog-a", "1", request=100, cpu_usage_cores=0.45, **rq(0.3, 0.05)),
                sample("hog-b", "1", request=100, cpu_usage_cores=0.45, **rq(0.3, 0.05)),
                time=time)


def after(s: Snapshot, p: Plan, time: float, **metrics: dict[str, float]) -> Snapshot:
    """`s` with the plan's cpuset actions applied, `time` later, with new metrics per container."""
    to = {a.container: a.to for a in p.actions if a.kind in ("cpuset", "rollback")}
    return replace(s, time=time, containers=tuple(
        replace(c, container=replace(c.container, cpuset=CpuSet.parse(to.get(c.id, str(c.container.cpuset)))),
                metrics={**c.metrics, **metrics.get(c.id, {})})
        for c in s.containers))


# --- pure pieces ---------------------------------------------------------------------------------

def test_health_is_the_run_queue_wait_and_its_score_the_share_of_wanted_cpu_time() -> None:
    h = measure({"cpu_usage_cores": 0.2, **rq(0.6, 0.03, throttled=0.1)})
    assert h is not None and h.source == "runqueue"
    assert (h.loss, h.p99, h.throttled) == (0.6, 0.03, 0.1)
    assert h.score == pytest.approx(0.25)


def test_without_bpf_cpu_pressure_stands_in_and_without_either_there_is_no_health() -> None:
    h = measure({"cpu_usage_cores": 0.5, "psi_cpu_some": 0.3})
    assert h is not None and (h.source, h.wait, h.p99) == ("psi", 0.3, None)
    assert measure({"cpu_usage_cores": 0.5}) is None


def test_p99_of_too_few_waits_is_not_used() -> None:
    h = measure(rq(0.01, 0.5, waits=3), min_waits=20)
    assert h is not None and h.p99 is None


def test_noise_is_the_window_to_window_standard_deviation_with_a_floor() -> None:
    assert noise([1.0, 2.0, 3.0], floor=0.0) == pytest.approx(1.0)
    assert noise([1.0, 1.0, 1.0], floor=0.01) == 0.01
    assert noise([5.0], floor=0.01) == 0.01  # too few windows to say


@pytest.mark.parametrize(("text", "seconds"), [("2ms", 0.002), ("500us", 0.0005), ("0.01", 0.01), ("1 s", 1.0)])
def test_targets_parse_as_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


def test_the_latency_sensitive_placement_hint_gets_the_default_target() -> None:
    c = sample("x", "0", request=100).container
    hinted = replace(c, annotations={"perfbalance.io/latency-sensitive": "true"})
    assert target_of(hinted, {}, default=0.005) == (0.005, "")
    assert target_of(c, {}, default=0.005) == (None, "")  # control: no hint, no target


def test_annotation_wins_over_selectors_and_a_bad_one_is_a_problem_not_a_crash() -> None:
    c = sample("x", "0", request=100).container
    assert target_of(c, {"-/pod-x/*": 0.005}) == (0.005, "")
    good = replace(c, annotations={TARGET_ANNOTATION: "1ms"})
    assert target_of(good, {"-/pod-x/*": 0.005}) == (0.001, "")
    bad = replace(c, annotations={TARGET_ANNOTATION: "soon"})
    target, problem = target_of(bad, {})
    assert target is None and TARGET_ANNOTATION in problem and "soon" in problem


# --- the planner picks victims by measured health --------------------------------------------------

def test_latency_container_over_its_target_is_moved_away_from_busy_loops() -> None:
    s = shared(rq(0.4, 0.040))  # p99 40 ms against a 2 ms target
    p = plan(s, CFG, None, s.time)
    moves = {a.container: a for a in p.actions if a.kind == "cpuset"}
    assert set(moves) == {"lat"} and 1 not in CpuSet.parse(moves["lat"].to).ids
    assert moves["lat"].detail["saved_latency"] > 0
    # its health loss: the wait plus the breach cost (40 ms / 2 ms - 1 = 19, capped at 10)
    assert p.state.pending[0].health_before == {"lat": pytest.approx(0.4 + 0.05 * 10)}


def test_a_healthy_container_without_a_target_is_left_alone() -> None:
    cfg = replace(CFG, latency_targets={})
    s = shared(rq(0.002, 0.0004))  # control: the same layout, no target, hardly any waiting
    assert [a for a in plan(s, cfg, None, s.time).actions if a.container == "lat"] == []


def test_a_container_getting_too_little_of_its_cpu_time_is_a_victim_without_a_target() -> None:
    cfg = replace(CFG, latency_targets={})
    s = shared(rq(0.6, 0.040))  # score 0.2 / 0.8 = 0.25 < victim_health_threshold
    assert "lat" in {a.container for a in plan(s, cfg, None, s.time).actions}


def test_a_container_waiting_behind_its_own_threads_is_not_a_victim() -> None:
    # control of the test above: the same poor score, but hog-a fills CPU 1 itself (0.9 of it)
    # and its co-runners take little: no move can cure that wait
    cfg = replace(CFG, latency_targets={})
    s = snap(topo(), sample("lat", "1", request=100, cpu_usage_cores=0.05, **rq(0.01, 0.001)),
             sample("hog-a", "1", request=100, cpu_usage_cores=0.9, **rq(1.5, 0.05)))
    assert plan(s, cfg, None, s.time).actions == ()


def test_a_bad_annotation_is_reported_and_planning_goes_on() -> None:
    s = shared(rq(0.4, 0.040))
    s = replace(s, containers=tuple(
        replace(c, container=replace(c.container, annotations={TARGET_ANNOTATION: "-3ms"})) if c.id == "hog-a" else c
        for c in s.containers))
    p = plan(s, CFG, None, s.time)
    assert any(TARGET_ANNOTATION in c.get("rejected", "") for c in p.considered)
    assert "lat" in {a.container for a in p.actions}


# --- the measurement judges the move ---------------------------------------------------------------

def settle(lat_after: dict[str, float]) -> tuple[Plan, Plan]:
    """The latency container moved, then measured `lat_after` once the move has settled."""
    s0 = shared(rq(0.4, 0.040))
    p1 = plan(s0, CFG, None, s0.time)
    later = after(s0, p1, s0.time + 40, lat=lat_after)
    return p1, plan(later, CFG, p1.state, later.time)


def test_a_move_whose_measured_wait_drops_as_predicted_is_kept_and_the_gain_is_measured() -> None:
    _, p2 = settle(rq(0.01, 0.0008))
    note = next(c for c in p2.considered if c.get("kind") == "evaluation")
    assert note["method"] == "health" and note["rejected"] == "kept: the move helped"
    # measured, not modelled: 0.4 s/s wait + 0.5 breach cost -> 0.01 s/s within the target
    assert note["realized"] == pytest.approx(0.89)


def test_a_move_the_measurement_contradicts_is_rolled_back_though_the_model_agrees() -> None:
    # The wait came from the container's own CPU quota: moving it changed nothing measured.
    p1, p2 = settle(rq(0.4, 0.040, throttled=0.6))
    rollbacks = [a for a in p2.actions if a.kind == "rollback"]
    assert [(a.container, a.to) for a in rollbacks] == [("lat", "1")]
    assert "throttled 60%" in rollbacks[0].reason
    assert "no measured improvement clearly beyond the noise band" in rollbacks[0].reason
    note = next(c for c in p2.considered if c.get("kind") == "evaluation")
    assert note["method"] == "health" and note["realized"] == pytest.approx(0.0)


def test_a_shortfall_inside_the_noise_band_is_not_a_contradiction() -> None:
    s0 = shared(rq(0.4, 0.040))
    state = plan(s0, CFG, None, s0.time - 10).state  # an earlier cycle (its move is not applied)
    state = replace(state, health_history={"lat": (0.0, 0.9, 0.0, 0.9, 0.1)}, pending=(), moved_at={})
    p1 = plan(s0, CFG, state, s0.time)
    assert p1.state.pending[0].health_band > 0.4
    later = after(s0, p1, s0.time + 40, lat=rq(0.3, 0.030))  # dropped less than predicted
    p2 = plan(later, CFG, p1.state, later.time)
    assert not [a for a in p2.actions if a.kind == "rollback"]


@pytest.mark.parametrize(("predicted", "measured", "call"), [
    (0.43, 0.045, "helped"),  # the demo's island: helped, far less than predicted
    (0.43, 0.43, "helped"),
    (0.43, -0.02, "worse"),
    (0.43, 0.0, "flat"),  # a clear prediction (>= 2 bands), nothing measured
    (0.43, 0.01, "flat"),
    (0.015, 0.0, "unclear"),  # inside the band, and the prediction only 1.5 bands wide
    # just past the band, a small part of the prediction: what noise gives now and then
    (0.88, 0.013, "flat"),  # like the quota-bound victim's move (e2e): 1.3 bands, 88 predicted
    (0.88, 0.0199, "flat"),
    (0.88, 0.02, "helped"),  # two bands: clearly beyond the noise, however short of 0.88
    (0.04, 0.013, "helped"),  # a third of the prediction: past rollback_fraction (0.25)
    (0.015, 0.011, "helped"),  # 73% of a narrow prediction
    (0.3, 0.013, "flat"),  # under two bands and under a quarter of a clear prediction
])
def test_the_measurement_decides_by_its_sign_beyond_the_noise_band(predicted: float, measured: float,
                                                                  call: str) -> None:
    assert health_call(predicted, measured, 0.01, CFG.health_clear_bands, CFG.rollback_fraction) == call


def test_a_move_that_helped_less_than_predicted_is_kept_and_the_shortfall_is_noted() -> None:
    # predicted: 0.9 s/s of loss (0.4 wait + 0.5 breach) down to ~0.02; measured: down to 0.8
    p1, p2 = settle(rq(0.3, 0.030))
    assert not [a for a in p2.actions if a.kind == "rollback"]
    note = next(c for c in p2.considered if c.get("kind") == "evaluation")
    assert note["rejected"] == "kept: the move helped, less than predicted", note
    assert note["realized"] == pytest.approx(0.1)
    assert note["realized"] < CFG.rollback_fraction * note["predicted"]  # the old rule rolled it back


@pytest.mark.parametrize(("wait", "kept"), [(0.392, False), (0.385, True)])
def test_a_drop_just_past_the_band_and_far_short_of_the_prediction_is_no_help(wait: float, kept: bool) -> None:
    # predicted ~0.88 s/s; the band, from the floor only (no history): 2 x 0.002 at decision,
    # x sqrt(2) at judgement = 0.0057 s/s. A drop of 0.008 (1.4 bands, under 1% of the
    # prediction) is what noise gives now and then: rolled back (the e2e quota test once kept
    # such a move, measured 0.0074). Control: 0.015 (2.7 bands) is clearly beyond the noise, so
    # the move helped, less than predicted.
    p1, p2 = settle(rq(wait, 0.040))
    assert p1.state.pending[0].health_band == pytest.approx(0.004)
    note = next(c for c in p2.considered if c.get("kind") == "evaluation")
    assert note["band"] == pytest.approx(0.004 * 2 ** 0.5, abs=1e-5)
    rollbacks = [a for a in p2.actions if a.kind == "rollback"]
    if kept:
        assert not rollbacks and note["rejected"] == "kept: the move helped, less than predicted", note
    else:
        assert [(a.container, a.to) for a in rollbacks] == [("lat", "1")]
        assert "no measured improvement clearly beyond the noise band" in rollbacks[0].reason
    assert note["realized"] == pytest.approx(0.4 - wait)


def test_a_move_after_which_the_victim_waits_longer_is_rolled_back() -> None:
    p1, p2 = settle(rq(0.6, 0.050))
    rollbacks = [a for a in p2.actions if a.kind == "rollback"]
    assert [(a.container, a.to) for a in rollbacks] == [("lat", "1")]
    assert "got worse beyond the noise band" in rollbacks[0].reason
    note = next(c for c in p2.considered if c.get("kind") == "evaluation")
    assert note["rejected"] == "rolled back" and note["realized"] == pytest.approx(-0.2)


def settle_through(waits: list[float]) -> Plan:
    """The latency container moved at t (no history yet: the floor band), then measured each
    10 s window with these waits (p99 30 ms, still over target) until judged at t + 30."""
    s0 = shared(rq(0.4, 0.040))
    p = plan(s0, CFG, None, s0.time)
    moved = p
    for i, w in enumerate(waits, start=1):
        later = after(s0, moved, s0.time + 10 * i, lat=rq(w, 0.030))
        p = plan(later, CFG, p.state, later.time)
    return p


def test_the_band_is_widened_to_the_noise_measured_since_the_move() -> None:
    # 0.05 s/s better at judgement, but the windows since the move swing by 0.2 s/s
    p = settle_through([0.30, 0.50, 0.35])
    note = next(c for c in p.considered if c.get("kind") == "evaluation")
    assert note["band"] > 0.2, note
    assert note["rejected"] == "rolled back", note
    assert "no measured improvement clearly beyond the noise band" in next(a.reason for a in p.actions if a.kind == "rollback")


def test_steady_windows_since_the_move_keep_the_floor_band() -> None:
    p = settle_through([0.35, 0.35, 0.35])  # control: the same drop, measured steadily
    note = next(c for c in p.considered if c.get("kind") == "evaluation")
    assert note["band"] < 0.01 and note["rejected"] == "kept: the move helped, less than predicted", note


def predicted_drop(s: Snapshot) -> float:
    (p,) = plan(s, CFG, None, s.time).state.pending
    return sum(b - p.health_predicted[v] for v, b in p.health_before.items())


def test_busy_cores_no_container_accounts_for_shrink_the_predicted_wait_drop() -> None:
    seen_only = shared(rq(0.4, 0.040))  # the containers use 1.1 of the node's 8 CPUs
    busy = replace(seen_only, node_metrics={"cpu_busy_cores": 1.1 + 6.0})  # 6 more unseen
    quiet = replace(seen_only, node_metrics={"cpu_busy_cores": 1.1})  # control: nothing unseen
    assert predicted_drop(quiet) == pytest.approx(predicted_drop(seen_only))
    assert predicted_drop(busy) < 0.8 * predicted_drop(seen_only)
