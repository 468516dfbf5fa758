"""`perfbalance bench plan`: decision quality and planning time, measured on the node simulator.

For every scenario of agent.bench.scenarios it scores four strategies (no rebalancing, the
placement-only AVX-512 tag, perfbalance in closed loop, the exhaustive optimum where feasible),
then checks its goals: within 5 % of the optimum, >= 90 % of the avoidable AVX-512
slowdown removed, no ping-pong over 10,000 noisy cycles, a 1000-container / 256-CPU plan in
<= 100 ms; and for the pods annotated with affinity or anti-affinity: every weighted anti-affine
pair apart at its scope in the final layout (while `none` leaves some together), no hard pair
ever together, every affine pair together wherever the optimum (which respects capacity and hard
terms) puts it together, and no ping-pong on those scenarios either. Planning time is CPU time of this process (time.process_time), the median of several
runs, so that other load on a shared host does not inflate it; wall time is reported beside it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any

from rebalancer import RebalancerConfig, plan
from agent.bench import scenarios as sc
from agent.bench.scenarios import Planner

AVX_SCENARIOS = ("avx512_vs_scalar_small", "avx512_vs_scalar", "kubelet_static", "churn")


def measure_plan_seconds(runs: int, planner: Planner = plan) -> tuple[dict[str, float], dict[str, float]]:
    """(CPU seconds, wall seconds) of one plan() call per size, median of `runs`."""
    cpu, wall = {}, {}
    config = RebalancerConfig()
    for name, containers, cpus in sc.timing_sizes():
        snap = sc.timing_snapshot(containers, cpus)
        c_runs, w_runs = [], []
        for _ in range(runs):
            t0, w0 = time.process_time(), time.perf_counter()
            planner(snap, config, None, 0.0)
            c_runs.append(time.process_time() - t0)
            w_runs.append(time.perf_counter() - w0)
        cpu[name], wall[name] = statistics.median(c_runs), statistics.median(w_runs)
    return cpu, wall


def scenario_results(planner: Planner = plan) -> tuple[list[dict[str, Any]], dict[str, float]]:
    rows, ideal = [], {}
    for make in sc.SCENARIOS + sc.AFFINITY_SCENARIOS:
        s = make()
        opt = sc.run_optimum(s)
        results = {"none": sc.run_none(s).to_json(), "placement_tag": sc.run_placement_tag(s).to_json(),
                   "perfbalance": sc.run_perfbalance(s, planner=planner).to_json(),
                   "optimum": opt.to_json() if opt is not None else None}
        rows.append({"name": s.name, "results": results})
        if s.name in AVX_SCENARIOS:
            ideal[s.name] = sc.ideal_without_avx_penalty(s).victim_slowdown
    return rows, ideal


def goals(rows: list[dict[str, Any]], ideal: dict[str, float], plan_cpu: dict[str, float],
          pingpong: dict[str, int]) -> dict[str, Any]:
    gap = {}
    removed = {}
    for r in rows:
        res = r["results"]
        if res["optimum"] is not None:
            gap[r["name"]] = round(1.0 - res["perfbalance"]["throughput"] / res["optimum"]["throughput"], 4)
        if r["name"] in ideal:
            avoidable = res["none"]["victim_slowdown"] - ideal[r["name"]]
            if avoidable > 1e-9:
                removed[r["name"]] = round(
                    (res["none"]["victim_slowdown"] - res["perfbalance"]["victim_slowdown"]) / avoidable, 4)
    return {
        "throughput_gap_to_optimum": gap,
        "within_5pct_of_optimum": all(g <= 0.05 for g in gap.values()),
        "avx512_slowdown_removed": removed,
        "avx512_90pct_removed": all(v >= 0.9 for v in removed.values()),
        "pingpong": pingpong,
        "no_pingpong": pingpong["moves_after_settling"] == 0,
        "plan_1000x256_le_100ms": plan_cpu.get("1000x256", 1.0) <= 0.1,
    }


def pair_goals(rows: list[dict[str, Any]], pingpong: dict[str, int]) -> dict[str, Any]:
    """The affinity goals, from the `pairs` each strategy's result carries (agent.bench.scenarios)."""
    counts: dict[str, dict[str, Any]] = {}
    apart = kept = together = True
    for r in rows:
        res = r["results"]
        pb = res["perfbalance"].get("pairs")
        if not pb:
            continue
        none, opt = res["none"]["pairs"], (res["optimum"] or {}).get("pairs")
        soft = [i for i, p in enumerate(pb) if p["kind"] == "anti-affinity" and not p["hard"]]
        hard = [i for i, p in enumerate(pb) if p["hard"]]
        aff = [i for i, p in enumerate(pb) if p["kind"] == "affinity" and (opt is None or opt[i]["ok"])]
        c = counts[r["name"]] = {k: {"of": len(ix), "perfbalance": sum(pb[i]["ok"] for i in ix),
                                     "none": sum(none[i]["ok"] for i in ix)}
                                 for k, ix in (("anti_apart", soft), ("hard_apart", hard),
                                               ("affinity_together", aff)) if ix}
        c["hard_rises"] = res["perfbalance"]["hard_rises"]
        apart &= all(v["perfbalance"] == v["of"] > v["none"] for k, v in c.items() if k == "anti_apart")
        kept &= c["hard_rises"] == 0 and all(v["perfbalance"] == v["of"] for k, v in c.items() if k == "hard_apart")
        together &= all(v["perfbalance"] == v["of"] for k, v in c.items() if k == "affinity_together")
    return {"pairs": counts, "anti_affinity_apart": apart, "hard_anti_affinity_kept": kept,
            "affinity_together": together, "affinity_pingpong": pingpong,
            "affinity_no_pingpong": all(v == 0 for v in pingpong.values())}


def run(args: argparse.Namespace) -> int:
    quick = bool(getattr(args, "quick", False))
    name = getattr(args, "policy", None) or "costmodel"
    if name == "costmodel":
        planner: Planner = plan
    else:
        from agent.plan.runner import planner as load_planner
        from rebalancer.policy import PolicyError

        try:
            planner = load_planner(name)
        except PolicyError as e:
            print(f"perfbalance bench plan: {e}", file=sys.stderr)
            return 2
    rows, ideal = scenario_results(planner)
    cycles = 500 if quick else 10_000
    early, late = sc.steady_moves(sc.avx512_large(), cycles=cycles, settle_cycles=50, planner=planner)
    pingpong = {"scenario": "avx512_vs_scalar", "cycles": cycles, "noise": 0.05,
                "moves_while_settling": early, "moves_after_settling": late}
    pair_cycles = 300 if quick else 2000
    steady = {make().name: sc.steady_moves(make(), cycles=pair_cycles, settle_cycles=50, planner=planner)[1]
              for make in sc.AFFINITY_SCENARIOS}
    cpu, wall = measure_plan_seconds(3 if quick else 7, planner)
    out = {"policy": name, "scenarios": rows, "plan_seconds": {k: round(v, 5) for k, v in cpu.items()},
           "plan_wall_seconds": {k: round(v, 5) for k, v in wall.items()},
           "goals": {**goals(rows, ideal, cpu, pingpong), **pair_goals(rows, steady)}}
    if getattr(args, "json", False):
        json.dump(out, sys.stdout)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(render(out))
    return 0


def _pairs_cell(res: dict[str, Any] | None) -> str:
    """`  pairs 2/3 as asked (hard rejoined 0x)` for results of annotated scenarios."""
    if not res or not res.get("pairs"):
        return ""
    ok = sum(p["ok"] for p in res["pairs"])
    return f"  pairs {ok}/{len(res['pairs'])} as asked (hard rejoined {res['hard_rises']}x)"


def render(out: dict[str, Any]) -> str:
    lines = [f"policy in closed loop ('perfbalance'): {out.get('policy', 'costmodel')}",
             f"{'scenario':<24} {'strategy':<14} {'victim slowdown':>16} {'throughput':>11}"]
    for r in out["scenarios"]:
        for strat in ("none", "placement_tag", "perfbalance", "optimum"):
            res = r["results"][strat]
            vals = (f"{res['victim_slowdown']:>15.1%} {res['throughput']:>11.3f}" if res
                    else f"{'n/a (too large)':>16} {'':>11}")
            lines.append(f"{r['name']:<24} {strat:<14} {vals}{_pairs_cell(res)}")
    lines.append("")
    for k, v in out["plan_seconds"].items():
        lines.append(f"plan {k:<9} {v * 1000:8.1f} ms CPU  ({out['plan_wall_seconds'][k] * 1000:.1f} ms wall)")
    lines.append("")
    for k, v in out["goals"].items():
        lines.append(f"{k}: {v}")
    return "\n".join(lines) + "\n"
