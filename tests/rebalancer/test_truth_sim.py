"""The independent simulator (agent.bench.truth): its building blocks against hand-computed cases,
where it must disagree with the planner-side simulator (and where it must not), the goals judged
through it, and the import-linter contract that keeps it apart from the planner."""

from __future__ import annotations

import ast
import dataclasses
import json
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

from agent.bench import judge, plan as bench_plan, scenarios as sc, truth
from agent.bench.sim import MIB, Workload
from agent.bench.truth import memory, sched
from perfbalance.topology import synthetic

ROOT = Path(__file__).resolve().parents[2]
TOPO = synthetic(packages=1, cores_per_node=2, threads_per_core=2)  # cores {0,2} {1,3}


def _machine(**kw: object) -> truth.Machine:
    return truth.Machine.from_topology(TOPO, **kw)


# -- the AVX-512 licence window ----------------------------------------------------------------------

def _licensed_seconds(avx_cpu: int, avx_on_steps: int, *, avx512: bool = True) -> float:
    m = _machine(dt_s=0.5e-3, window_s=10e-3, licence_hold_s=1.3e-3)  # hold = ceil(2.6) = 3 steps
    jobs = [truth.Job(id="avx", threads=1, avx512=avx512), truth.Job(id="web", threads=1)]
    awake = {("avx", 0): [s < avx_on_steps for s in range(20)], ("web", 0): [True] * 20}
    use = sched.run(m, jobs, {"avx": frozenset({avx_cpu}), "web": frozenset({0})}, awake)
    return sum(t for (lic, _), t in use["web"].by_state.items() if lic)


def test_licence_is_held_after_the_last_512_bit_step_then_released() -> None:
    # AVX-512 on the sibling for steps 0-3, then held for 3 more steps: 7 of 20 steps licensed
    assert _licensed_seconds(2, 4) == pytest.approx(7 * 0.5e-3)


def test_no_licence_without_512_bit_code_or_on_another_core() -> None:  # the controls
    assert _licensed_seconds(2, 4, avx512=False) == 0.0
    assert _licensed_seconds(1, 4) == 0.0  # CPU 1 is another physical core


def test_the_sibling_of_a_busy_thread_is_marked_shared() -> None:
    m = _machine(window_s=5e-3)
    jobs = [truth.Job(id="a", threads=1), truth.Job(id="b", threads=1)]
    apart = sched.run(m, jobs, {"a": frozenset({0}), "b": frozenset({1})})
    paired = sched.run(m, jobs, {"a": frozenset({0}), "b": frozenset({2})})
    assert set(apart["a"].by_state) == {(False, False)} and set(paired["a"].by_state) == {(False, True)}


def test_cfs_weights_share_a_contended_cpu() -> None:
    m = _machine(window_s=0.1)
    jobs = [truth.Job(id="big", threads=1, weight=3.0), truth.Job(id="small", threads=1, weight=1.0)]
    use = sched.run(m, jobs, {"big": frozenset({0}), "small": frozenset({0})})
    assert use["big"].run_s / use["small"].run_s == pytest.approx(3.0, rel=0.05)


def _displaced(topo_kw: dict[str, int]) -> sched.Usage:
    """`mover` (CPUs 0 and 1) runs on CPU 0 until `pinned` (CPU 0 only) wakes at step 10: a job
    waking from sleep is served first, so `mover` moves to CPU 1 and stays there."""
    m = truth.Machine.from_topology(synthetic(packages=1, cores_per_node=2, **topo_kw), window_s=10e-3)
    jobs = [truth.Job(id="mover", threads=1), truth.Job(id="pinned", threads=1)]
    awake = {("mover", 0): [True] * 20, ("pinned", 0): [10 <= s < 15 for s in range(20)]}
    return sched.run(m, jobs, {"mover": frozenset({0, 1}), "pinned": frozenset({0})}, awake)["mover"]


def test_a_displaced_thread_migrates_once_across_l3_domains() -> None:
    use = _displaced({"l3_per_package": 2})  # CPU 0 and CPU 1 in different L3 domains
    assert (use.cross_l3_migrations, use.hot_migrations) == (1, 0)
    assert use.by_l3 == pytest.approx({0: 5e-3, 1: 5e-3})


def test_within_one_l3_domain_the_same_move_is_a_cache_hot_one() -> None:  # the control
    use = _displaced({})
    assert (use.cross_l3_migrations, use.hot_migrations) == (0, 1)


def test_migration_refill_is_taken_off_the_run_time() -> None:
    m = _machine(refill_bytes_per_s=10e9)
    j = truth.Job(id="j", threads=1, working_set=20 * MIB)
    use = sched.Usage(run_s=0.05, by_state={(False, False): 0.05}, by_l3={0: 0.05}, by_node={0: 0.05},
                      cross_l3_migrations=2, hot_migrations=0, distance={})
    # two moves, each reloading 20 MiB at 10 GB/s: 4.19 ms of 50 ms
    assert truth._lost(m, j, use, {0: 32 * MIB}) == pytest.approx(2 * 20 * MIB / 10e9 / 0.05)


# -- LLC and memory --------------------------------------------------------------------------------

def test_a_small_working_set_keeps_only_what_it_uses_the_rest_goes_to_the_other() -> None:
    m = _machine(l3_bytes=8 * MIB)
    jobs = {"small": truth.Job(id="small", threads=1, working_set=2 * MIB),
            "big": truth.Job(id="big", threads=1, working_set=100 * MIB)}
    occ = memory.domain_occupancy(m, jobs, {"small": 1e6, "big": 1e6}, set())
    assert occ["small"] == pytest.approx(2 * MIB) and occ["big"] == pytest.approx(6 * MIB)
    both_big = {k: truth.Job(id=k, threads=1, working_set=100 * MIB) for k in jobs}
    occ = memory.domain_occupancy(m, both_big, {"small": 1e6, "big": 1e6}, set())  # control: no cap
    assert occ["small"] == pytest.approx(4 * MIB) and occ["big"] == pytest.approx(4 * MIB)


def test_a_restricted_rdt_class_holds_at_most_its_ways() -> None:
    m = _machine(l3_bytes=11 * MIB, llc_ways=11, restricted_ways=2)
    jobs = {k: truth.Job(id=k, threads=1, working_set=100 * MIB) for k in ("thrasher", "kv")}
    occ = memory.domain_occupancy(m, jobs, {"thrasher": 9e6, "kv": 1e6}, {"thrasher"})
    assert occ["thrasher"] == pytest.approx(2 * MIB) and occ["kv"] == pytest.approx(9 * MIB)


def test_misses_follow_the_square_root_rule_and_stop_at_the_working_set() -> None:
    m = _machine()
    j = truth.Job(id="j", threads=1, mpki_ref=10.0, ref_cache=4 * MIB, working_set=16 * MIB)
    assert memory.mpki(j, 16 * MIB, m) == pytest.approx(5.0)  # 4x the cache, half the misses
    assert memory.mpki(j, 64 * MIB, m) == pytest.approx(5.0)  # flat beyond the working set


def test_loaded_latency_is_flat_then_linear_then_steep() -> None:
    f = memory.latency_factor
    assert (f(0.2), f(0.4), f(0.6), f(0.8)) == pytest.approx((1.0, 1.0, 1.5, 2.0))
    assert f(0.9) == pytest.approx(4.0) and f(0.95) == pytest.approx(8.0) and f(2.0) == f(0.99)


def test_a_loaded_node_slows_its_memory_bound_jobs() -> None:
    def slowdown(mpki: float, bandwidth: float) -> float:
        jobs = [truth.Job(id=f"s{i}", threads=1, mpki_ref=mpki, working_set=4096 * MIB, victim=True) for i in range(2)]
        return truth.score(_machine(bandwidth_per_node=bandwidth), jobs, {"s0": frozenset({0}), "s1": frozenset({1})})[0]
    assert slowdown(60.0, 4e9) > slowdown(60.0, 4e12) + 0.1  # the shared L3 alone costs the idle node's
    assert slowdown(0.0, 4e9) == pytest.approx(0.0, abs=1e-9)  # control: no misses, no queue


# -- disagreeing with the planner-side simulator -----------------------------------------------------

def _two_jobs(cpus_a: int, cpus_b: int) -> dict[str, object]:
    node = sc._node(TOPO)
    ws = [Workload(id="a", demand=1.0, request_mcpu=1000), Workload(id="b", demand=1.0, request_mcpu=1000)]
    return judge.disagreement(node, ws, {"a": frozenset({cpus_a}), "b": frozenset({cpus_b})})


def test_smt_siblings_are_where_the_two_simulators_disagree() -> None:
    d = _two_jobs(0, 2)  # the two siblings of one core: sim counts two full CPUs
    assert d["sim"]["throughput"] == pytest.approx(2.0)  # type: ignore[index]
    assert d["truth"]["throughput"] == pytest.approx(2 * 0.62, rel=0.01)  # type: ignore[index]
    assert d["drives"]["throughput"] == "smt"  # type: ignore[index]


def test_two_cores_are_where_they_agree() -> None:  # the control
    d = _two_jobs(0, 1)
    assert d["difference"]["throughput"] == pytest.approx(0.0, abs=0.005)  # type: ignore[index]
    assert d["drives"]["throughput"].startswith("none")  # type: ignore[index]


# -- the goals, judged by it -------------------------------------------------------------------------

def test_perfbalance_removes_the_licence_share_of_the_victims_slowdown_by_truth() -> None:
    s = sc.avx512_small()
    none, pb = sc.run_none(s, bench_plan.JUDGES), sc.run_perfbalance(s, judges=bench_plan.JUDGES)
    share = {k: r.judged["truth"][0] - r.judged["truth_no_licence"][0] for k, r in (("none", none), ("pb", pb))}
    assert share["none"] > 0.01  # the control: left where they started, the licence costs the victims
    assert share["pb"] <= 0.1 * share["none"]


def test_perfbalance_is_within_5_percent_of_truths_own_optimum() -> None:
    s = sc.bandwidth_hog()
    pb, opt = sc.run_perfbalance(s, judges=bench_plan.JUDGES), sc.run_optimum(s, judge.score)
    none = sc.run_none(s, bench_plan.JUDGES)
    assert opt is not None and pb.judged["truth"][1] >= 0.95 * opt.throughput
    assert none.judged["truth"][1] < 0.95 * opt.throughput  # control: not rebalancing misses it


def test_goals_by_truth_use_truths_numbers_and_say_when_one_is_missed() -> None:
    row = {"name": "avx512_vs_scalar",
           "results": {"none": {"victim_slowdown": 0.1, "throughput": 7.0}, "optimum": None,
                       "perfbalance": {"victim_slowdown": 0.0, "throughput": 8.0}},
           "truth": {"none": {"victim_slowdown": 0.3, "throughput": 5.0}, "optimum": {"throughput": 6.0},
                     "perfbalance": {"victim_slowdown": 0.28, "throughput": 5.5},
                     "licence_slowdown": {"none": 0.04, "perfbalance": 0.02}}}
    ping = {"moves_after_settling": 0}
    by_truth = bench_plan.goals([row], {"avx512_vs_scalar": {"sim": 0.0}}, {}, ping)
    by_sim = bench_plan.goals([row], {"avx512_vs_scalar": {"sim": 0.0}}, {}, ping, model="sim")
    assert by_truth["avx512_slowdown_removed"] == {"avx512_vs_scalar": 0.5} and not by_truth["avx512_90pct_removed"]
    assert by_truth["throughput_gap_to_optimum"] == {"avx512_vs_scalar": 0.0833}
    assert not by_truth["within_5pct_of_optimum"]
    assert by_sim["avx512_slowdown_removed"] == {"avx512_vs_scalar": 1.0} and by_sim["avx512_90pct_removed"]


def test_a_gain_the_planner_model_claims_and_truth_refutes_is_a_loss_against_none() -> None:
    def row(name: str, sim: tuple[float, float], tru: tuple[float, float]) -> dict[str, Any]:
        return {"name": name, "results": {"none": {"throughput": sim[0]}, "perfbalance": {"throughput": sim[1]},
                                          "optimum": None},
                "truth": {"none": {"throughput": tru[0]}, "perfbalance": {"throughput": tru[1]}, "optimum": None}}
    rows = [row("refuted", (7.0, 7.4), (6.9, 6.7)), row("confirmed", (7.0, 7.4), (6.9, 7.1)),
            row("no_claim", (7.0, 7.0), (6.9, 6.7)), row("within_noise", (7.0, 7.4), (6.9, 6.89))]
    assert bench_plan.worse_than_none(rows) == {"refuted": 0.029, "within_noise": 0.0014}
    g = bench_plan.goals(rows, {}, {}, {"moves_after_settling": 0})
    assert not g["never_worse_than_none"]
    assert bench_plan.goals(rows[1:], {}, {}, {"moves_after_settling": 0})["never_worse_than_none"]


def test_the_planner_settles_on_truths_observations() -> None:
    early, late = sc.steady_moves(sc.avx512_small(), cycles=120, settle_cycles=40,
                                  observe=bench_plan._truth_observer())
    assert early > 0 and late == 0  # it acts on what truth reports (control), then stays put


# -- kept apart from the planner ---------------------------------------------------------------------

def test_truth_imports_only_the_standard_library_value_types_and_itself() -> None:
    allowed = ("agent.bench.truth", "perfbalance.topology", "perfbalance.cpuset", "perfbalance.model", "__future__")
    for path in (ROOT / "agent/bench/truth").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            for n in names:
                assert n.startswith(allowed) or n.split(".")[0] in sys.stdlib_module_names, (path.name, n)


CONTRACT = "the independent simulator shares nothing with the planner (agent.bench.truth)"


def test_the_contract_is_kept() -> None:
    out = subprocess.run([str(ROOT / ".venv/bin/lint-imports")], cwd=ROOT, capture_output=True, text=True,
                         env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert f"{CONTRACT} KEPT" in " ".join(out.stdout.split()) and out.returncode == 0


def test_the_contract_breaks_when_truth_imports_the_planner_indirectly(tmp_path: Path) -> None:
    text = (ROOT / "pyproject.toml").read_text()
    block = text[text.index('[[tool.importlinter.contracts]]\nname = "' + CONTRACT):]
    forbidden = tomllib.loads(block)["tool"]["importlinter"]["contracts"][0]["forbidden_modules"]
    roots = sorted({m.split(".")[0] for m in forbidden} | {"agent"})
    (tmp_path / "pyproject.toml").write_text(f"[tool.importlinter]\nroot_packages = {roots!r}\n\n" + block)
    for mod in [*forbidden, "agent.bench.truth"]:
        parts = mod.split(".")
        for i in range(1, len(parts) + 1):
            (tmp_path / "/".join(parts[:i])).mkdir(exist_ok=True)
            (tmp_path / "/".join(parts[:i]) / "__init__.py").touch()
    (tmp_path / "agent/bench/scenarios/__init__.py").write_text("import rebalancer\n")
    (tmp_path / "agent/bench/truth/__init__.py").write_text("from agent.bench import scenarios\n")

    def lint() -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(ROOT / ".venv/bin/lint-imports")], cwd=tmp_path, capture_output=True, text=True,
                              env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"})
    out = lint()
    assert out.returncode != 0 and "BROKEN" in out.stdout
    (tmp_path / "agent/bench/truth/__init__.py").write_text("import math\n")  # control: stdlib only
    assert lint().returncode == 0


@pytest.mark.slow
def test_bench_plan_reports_both_simulators_and_their_disagreement(capsys: pytest.CaptureFixture[str]) -> None:
    from agent.cli import main

    assert main(["bench", "plan", "--quick", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    row = next(r for r in out["scenarios"] if r["name"] == "avx512_vs_scalar_small")
    d = row["disagreement"]
    assert d["difference"]["throughput"] == pytest.approx(d["truth"]["throughput"] - d["sim"]["throughput"], abs=2e-4)
    assert d["drives"]["throughput"] in truth.ELEMENTS and set(d["left_without"]) == set(truth.ELEMENTS)
    assert out["goals"]["pingpong"]["observed_on"] == "truth"
    assert out["goals_planner_model"]["pingpong"]["observed_on"] == "sim"
    assert "within_5pct_of_optimum_observing_truth" in out["goals"]
    text = bench_plan.render(out)
    assert "where the simulators disagree" in text and "judged by the independent simulator" in text


def test_each_element_switched_off_changes_only_its_own_parameter() -> None:
    m = _machine()
    jobs = [truth.Job(id="a", threads=1, partners=("b",)), truth.Job(id="b", threads=1)]
    for element, field, off in [("licence", "licence_loss", 0.0), ("smt", "smt_speed", 1.0), ("llc", "llc_alpha", 0.0),
                                ("bandwidth", "bandwidth_per_node", 1e18), ("remote", "remote_extra_s", 0.0),
                                ("migration", "refill_bytes_per_s", 1e30)]:
        n, js = truth.neutral(m, jobs, element)
        assert getattr(n, field) == off != getattr(m, field), element
        assert n == dataclasses.replace(m, **{field: off}) and js == tuple(jobs)
    n, js = truth.neutral(m, jobs, "transfers")
    assert n == m and [j.partners for j in js] == [(), ()]
    with pytest.raises(ValueError, match="unknown model element 'heat'"):
        truth.neutral(m, jobs, "heat")
