"""Judging past moves: did the victims gain what the cost model predicted? If not, roll back.

PARTIES judges an action after 0.5 s and reverts it when it did not help; we do the same after
`settle_seconds` (long enough for the EWMA to forget the pre-move windows).

Realized gain, in core-seconds per second, per victim:
* with a PMU: u_now x (1 - ips_before / ips_now), where ips = instructions per CPU-second
  (captures both a frequency loss, e.g. an AVX-512 license, and extra stalls; IPC alone would
  miss the frequency);
* without one (software events only, as on a VM): the drop of the victim's modelled loss,
  recomputed from the fresh measurements and the placement actually in force. This proxy checks
  that the move took effect and that the conditions it was made for still hold (the aggressor
  still runs, the victim still runs where predicted); it cannot see a model error.

Measured health (rebalancer/health.py) judges first wherever the victims have it: the drop of
their measured health loss (run-queue wait plus breached target, s/s, smoothed) against the drop
predicted at decision time, with a noise band from each victim's window-to-window variation
before the move, widened at judgement to the variation of the windows since the move. The
measurement decides by its sign, beyond the band (`health_call`):

* it dropped beyond the band, and either reached `rollback_fraction` of the prediction or
  dropped at least `health_clear_bands` bands: the move helped and is kept, also when it helped
  less than predicted (the shortfall is in the judgement: realized vs predicted, exported as
  ever). A drop just past the band that is also a small part of the prediction is what noise
  alone gives now and then (the band is `health_noise_sigmas` wide), so it counts as inside the
  band (below);
* it rose beyond the band: the move made the victims worse, it is rolled back;
* it stayed inside the band although the prediction was clear (at least `health_clear_bands`
  bands): the move did not do what it was made for, it is rolled back;
* it stayed inside the band and the prediction was not clear: the measurement cannot tell, the
  PMU or model check decides.

A rollback by the measurement happens whatever the model says of itself. With a PMU, the
instructions-per-second check must pass as well. A predicted change inside the noise band cannot
be measured, and the older checks decide alone.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from perfbalance.cpuset import CpuSet
from perfbalance.model import Action, Judgement
from rebalancer.constraints import requests_fit
from rebalancer.context import Context
from rebalancer.health import Health, measure, noise
from rebalancer.state import Pending


def judge_pending(ctx: Context) -> tuple[list[Action], list[Pending], dict[str, float], list[Judgement]]:
    """(rollback actions, still-pending evaluations, container -> cooldown-until, judgements)."""
    rollbacks: list[Action] = []
    kept: list[Pending] = []
    cooldown: dict[str, float] = {}
    judgements: list[Judgement] = []
    for p in ctx.state.pending:
        if ctx.now < p.time + ctx.config.settle_seconds:
            kept.append(p)
            continue
        problem = _not_in_force(ctx, p)
        if problem:
            judgements.append(Judgement(decision=p.decision, outcome=problem))
            continue
        verdict = judge(ctx, p)
        undo = None if verdict.ok else _rollback(ctx, p, verdict)
        outcome = (_kept(verdict) if verdict.ok else
                   "rollback blocked by a constraint" if undo is None else "rolled back")
        judgements.append(Judgement(decision=p.decision, outcome=outcome, predicted=verdict.predicted,
                                    realized=verdict.realized, method=verdict.method, band=verdict.band))
        if undo:
            rollbacks += undo
            for m in p.moves:
                cooldown[m.container] = ctx.now + ctx.config.cooldown_seconds
    return rollbacks, kept, cooldown, judgements


def _kept(v: Verdict) -> str:
    if v.call == "unclear":
        return "kept: no change beyond the noise band, the model check decided"
    return "kept: the move helped, less than predicted" if v.short else "kept: the move helped"


def _not_in_force(ctx: Context, p: Pending) -> str:
    by_id = ctx.snapshot.by_id()
    for m in p.moves:
        s = by_id.get(m.container)
        if s is None:
            return f"{m.container} is gone; nothing to judge"
        now = s.container.rdt_class if m.kind == "rdt_class" else str(s.container.cpuset)
        if now != m.to:
            return f"{m.container} is at {now!r}, not {m.to!r} (not applied or changed since)"
    return ""


@dataclass(frozen=True, kw_only=True)
class Verdict:
    ok: bool
    predicted: float  # gain, s/s (health) or core-s/s
    realized: float
    method: str  # "health", "health+pmu", "pmu" or "model"
    band: float | None = None  # noise band of the health measurement
    why: str = ""  # what the measurement shows beside the numbers (its call, own throttling)
    short: bool = False  # kept although it gained less than rollback_fraction of the prediction
    call: str = ""  # health_call's verdict, "" when health did not judge


HealthCall = Literal["helped", "worse", "flat", "unclear"]


def health_call(predicted: float, measured: float, band: float, clear_bands: float,
                fraction: float) -> HealthCall:
    """What the measured drop of the victims' health loss says of the predicted one (both s/s,
    `band` the noise band): "helped" (dropped beyond the band, and by at least `fraction` of the
    prediction or `clear_bands` bands), "worse" (rose beyond the band), "flat" (no such drop where
    one of at least `clear_bands` bands was predicted) or "unclear" (no such drop, the prediction
    too narrow to tell)."""
    if measured > band and (measured >= fraction * predicted or measured >= clear_bands * band):
        return "helped"
    if measured < -band:
        return "worse"
    return "flat" if predicted >= clear_bands * band else "unclear"


CALLS = {"worse": "the victims' measured health got worse beyond the noise band",
         "flat": "no measured improvement clearly beyond the noise band where a clear one was predicted",
         "unclear": "the measured change is inside the noise band; the model check decided"}


def judge(ctx: Context, p: Pending) -> Verdict:
    """Measured health where the victims have it and the predicted change is measurable; the
    PMU or model check otherwise (and the PMU check as well when it exists)."""
    realized, how = realized_gain(ctx, p)
    model_ok = realized >= ctx.config.rollback_fraction * p.predicted
    health = health_gain(ctx, p)
    if health is None:
        return Verdict(ok=model_ok, predicted=p.predicted, realized=realized, method=how)
    predicted, measured = health
    band = settled_band(ctx, p)
    call = health_call(predicted, measured, band, ctx.config.health_clear_bands, ctx.config.rollback_fraction)
    ok = call == "helped" or (call == "unclear" and model_ok)
    why = "; ".join(x for x in (CALLS.get(call, ""), _throttled(ctx, p)) if x)
    return Verdict(ok=ok and (model_ok or how != "pmu"), predicted=predicted, realized=measured,
                   method="health+pmu" if how == "pmu" else "health", band=band, why=why,
                   short=measured < ctx.config.rollback_fraction * predicted, call=call)


def health_gain(ctx: Context, p: Pending) -> tuple[float, float] | None:
    """(predicted, measured) drop of the victims' health loss (run-queue wait plus breached
    target, s/s); None when a victim lost its measurement or the predicted drop is inside the
    noise band (not measurable)."""
    now = {v: ctx.measured_loss(v) for v in p.health_before}
    if not now or any(x is None for x in now.values()):
        return None
    predicted = sum(b - p.health_predicted.get(v, b) for v, b in p.health_before.items())
    if predicted <= p.health_band:
        return None
    measured = sum(b - (now[v] or 0.0) for v, b in p.health_before.items())
    return predicted, measured


def settled_band(ctx: Context, p: Pending) -> float:
    """The noise band of the judgement: the one recorded at decision time, widened to the
    window-to-window variation of the victims' raw health loss since the move (a decision taken
    in the first windows had no history, only the noise floor, to set its band). The measured
    change is a difference of two windows, so that variation counts sqrt(2) times."""
    cfg = ctx.config
    n = _windows_since(ctx, p)
    if n < 3:
        return p.health_band
    var = 0.0
    for v in p.health_before:
        now = ctx.measured_loss(v, _raw(ctx, v))
        since = (*ctx.state.health_history.get(v, ()), *(() if now is None else (now,)))[-n:]
        var += noise(since, floor=cfg.health_noise_floor) ** 2
    return max(p.health_band, cfg.health_noise_sigmas * math.sqrt(2.0 * var))


def _windows_since(ctx: Context, p: Pending) -> int:
    """Sample windows since the decision: by the agent's cycle numbers, else by time (a slow
    cycle makes a window longer than the interval)."""
    if p.cycle > 0 and ctx.snapshot.cycle > p.cycle:
        return ctx.snapshot.cycle - p.cycle
    return round((ctx.now - p.time) / ctx.snapshot.window) if ctx.snapshot.window > 0 else 0


def _raw(ctx: Context, cid: str) -> Health | None:
    s = ctx.snapshot.by_id().get(cid)
    return None if s is None else measure(s.metrics, min_waits=ctx.config.health_min_waits)


def _throttled(ctx: Context, p: Pending) -> str:
    """Victims held back by their own CFS quota (a wait no placement can cure)."""
    out = [f"{v} throttled {ctx.health[v].throttled:.0%} of the time by its own CPU quota"
           for v in sorted(p.health_before) if v in ctx.health and ctx.health[v].throttled >= 0.05]
    return "; ".join(out)


def realized_gain(ctx: Context, p: Pending) -> tuple[float, str]:
    """(core-seconds per second the victims gained, "pmu" or "model")."""
    views = ctx.views
    victims = [v for v in p.victims if v in views]
    if victims and all(v in p.baseline_ips and views[v].ips_per_core for v in victims):
        gain = 0.0
        for v in victims:
            now = views[v].ips_per_core or 0.0
            gain += views[v].usage * (1.0 - p.baseline_ips[v] / now)
        return gain, "pmu"
    gain = 0.0
    for v in victims:
        gain += p.baseline_loss.get(v, 0.0) - ctx.model.container_loss(ctx.base_eval, ctx.base, v)
    return gain, "model"


def _rollback(ctx: Context, p: Pending, v: Verdict) -> list[Action] | None:
    by_id = ctx.snapshot.by_id()
    placement: dict[str, frozenset[int]] = dict(ctx.base.placement)
    out: list[Action] = []
    measured = (f"measured health loss of the victims dropped {v.realized:.4f} s/s, predicted "
                f"{v.predicted:.4f} (noise band {v.band:.4f})" if v.band is not None else
                f"victims gained {v.realized:.4f} core-s/s, predicted {v.predicted:.4f}")
    reason = f"rollback of {p.decision} ({p.reason}): {measured}" + (f"; {v.why}" if v.why else "")
    realized = v.realized
    for m in p.moves:
        if m.kind == "cpuset":
            c = by_id[m.container].container
            cpus = CpuSet.parse(m.frm).ids
            forbidden = ctx.snapshot.reserved.ids | ctx.snapshot.kubelet.dedicated_to_others(c.pod_uid, c.name).ids
            if not cpus or cpus & forbidden or not cpus <= ctx.idx.online:
                return None
            placement[m.container] = cpus
        out.append(Action(kind="rollback", container=m.container, frm=m.to, to=m.frm,
                          mems=m.mems_frm if m.kind == "cpuset" else "", undoes=m.kind,
                          decision=p.decision, reason=reason, victims=p.victims,
                          detail={"predicted": v.predicted, "realized": realized}))
    return out if _fits(ctx, placement, out) else None


def _fits(ctx: Context, placement: Mapping[str, frozenset[int]], actions: list[Action]) -> bool:
    return all(requests_fit(placement, ctx.requests, CpuSet.parse(a.to).ids, ctx.sandboxes)
               for a in actions if a.undoes == "cpuset")
