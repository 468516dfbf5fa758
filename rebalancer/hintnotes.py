"""What the planner made of placement annotations, as `considered` entries of the plan.

`perfbalance plan`, `run --json` and the metrics show these: for every container annotated
AVX-512-heavy whether the annotation still holds, was confirmed by measurement or overruled by it
(and why), and for every affinity pair how much the two containers share now and what that costs.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from perfbalance.avx512 import avx512_heavy
from perfbalance.hints import avx512_hint
from rebalancer.affinity import overlap
from rebalancer.context import Context

MAX_PAIR_NOTES = 32


def hint_notes(ctx: Context, smoothed: Mapping[str, Mapping[str, float]]) -> list[dict[str, Any]]:
    return avx512_notes(ctx, smoothed) + _pairs(ctx)


def avx512_notes(ctx: Context, smoothed: Mapping[str, Mapping[str, float]]) -> list[dict[str, Any]]:
    out = []
    keys, thr = ctx.config.hint_keys(), ctx.config.avx512_heavy_threshold
    for s in ctx.snapshot.containers:
        if not s.container.annotations or avx512_hint(s.container, keys) is not True:
            continue
        x = smoothed.get(s.id, {}).get("avx512_heavy", 0.0)
        heavy = ctx.views[s.id].heavy
        if "avx512_heavy" not in s.metrics:
            state, why = "unmeasured", "pre-classified by annotation; no AVX-512 measurement to check it"
        elif heavy and avx512_heavy(s.metrics, thr):
            state, why = "confirmed", "annotation confirmed: 512-bit execution measured"
        elif heavy:
            state, why = "preclassified", "pre-classified by annotation; measurement takes over after smoothing"
        else:
            state, why = "overruled", (f"annotation overruled: no 512-bit execution measured (smoothed "
                                       f"avx512_heavy {x:.2f} <= threshold {thr:g})")
        out.append({"kind": "avx512_annotation", "container": s.id, "heavy": heavy, "state": state,
                    "avx512_heavy": round(x, 4), "reason": why})
    return out


def _pairs(ctx: Context) -> list[dict[str, Any]]:
    out = []
    for p in ctx.model.pairs[:MAX_PAIR_NOTES]:
        ov = overlap(ctx.idx, p, ctx.base.placement)
        out.append({"kind": p.kind, "container": p.a, "other": p.b, "scope": p.scope, "hard": p.hard,
                    "weight": p.weight, "overlap": round(ov, 4), "cost": round(p.signed_weight * ov, 6),
                    "reason": f"{p.kind} {p.term}: {p.a} and {p.b} share {ov:.0%} of their {p.scope} domains"})
    return out
