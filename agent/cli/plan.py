"""`perfbalance plan SNAPSHOT.json`: run the planner on a saved snapshot and explain the plan.

The file holds a Snapshot (docs/snapshot-format.md) or lines of `perfbalance run --json` output;
with several lines the last one is planned. A malformed file is a clear error naming the field
(exit code 2), never a traceback.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

from perfbalance import jsonfields as jf
from perfbalance.errors import ConfigError, ParseError
from perfbalance.model import Plan, Snapshot
from perfbalance.safefs import read_file

MAX_SNAPSHOT_BYTES = 64 << 20
MAX_SKIPPED_SHOWN = 20  # text output; --json lists every container


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("snapshot", metavar="SNAPSHOT.json", help="a snapshot, or `perfbalance run --json` output (last line is used)")
    p.add_argument("--json", action="store_true", help="print the plan as one JSON object")
    p.add_argument("--config", metavar="FILE", help="YAML config whose `rebalancer:` section is used (default: built-in)")
    p.add_argument("--now", type=float, metavar="SECONDS", help="planning time (default: the snapshot's time)")
    p.add_argument("--policy", metavar="NAME", help="the policy to plan with (default: rebalancer.policy of --config, "
                                                    "else costmodel); any installed in the perfbalance.policies entry points")


def load_snapshot(path: str) -> Snapshot:
    """Read `path` and parse its (last non-empty) line or whole text as a Snapshot."""
    try:
        raw = read_file(path, MAX_SNAPSHOT_BYTES)
    except OverflowError:
        raise ParseError("snapshot file", path, f"larger than {MAX_SNAPSHOT_BYTES} bytes") from None
    except OSError as e:
        raise ParseError("snapshot file", path, f"cannot read ({e.strerror})") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ParseError("snapshot file", path, f"not UTF-8 (byte {e.start})") from None
    return parse_snapshot_text(text, source=path)


def parse_snapshot_text(text: str, *, source: str) -> Snapshot:
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if not lines:
        raise ParseError("snapshot", "", "file is empty", source=source)
    try:
        data = jf.loads(text, source=source)  # one document (possibly pretty-printed)
    except jf.JsonSyntaxError:
        if len(lines) == 1:
            raise
        source = f"{source}: line {len(lines)}"  # `perfbalance run --json` lines: the last cycle
        data = jf.loads(lines[-1], source=source)
    return Snapshot.from_json(data, source=source)


def main(args: argparse.Namespace) -> int:
    from agent.config import load_config
    from agent.plan.runner import planner
    from agent.snapshot.derive import with_derived
    from rebalancer import RebalancerConfig
    from rebalancer.policy import PolicyError

    try:
        if args.now is not None and not math.isfinite(args.now):
            raise ParseError("--now", args.now, "must be finite")
        snapshot = with_derived(load_snapshot(args.snapshot))  # the values the agent derives, as it would
        config = load_config(args.config).rebalancer if args.config else RebalancerConfig()
        name = getattr(args, "policy", None) or config.policy
        plan = planner(name)
        now = args.now if args.now is not None else snapshot.time
        t0 = time.perf_counter()
        result = plan(snapshot, config, None, now)
        seconds = time.perf_counter() - t0
    except (ParseError, ConfigError, PolicyError) as e:
        print(f"perfbalance plan: {e}", file=sys.stderr)
        return 2
    from rebalancer.explain import explain

    # The explanation of what was not done reads the cost model's reasoning: for it only.
    why, skipped = (explain(snapshot, config, None, now, result) if name == "costmodel"
                    else ("" if result.actions else f"policy {name!r} planned none", ()))
    if args.json:
        try:  # JSON has no Infinity or NaN: refuse to print invalid JSON
            text = json.dumps(plan_json(result, seconds, why, skipped), allow_nan=False)
        except ValueError:
            print(f"perfbalance plan: {args.snapshot}: the plan holds a non-finite number "
                  "(metrics too large to compute with)", file=sys.stderr)
            return 2
        sys.stdout.write(text + "\n")
    else:
        sys.stdout.write(render(snapshot, result, seconds, why, skipped))
    return 0


def plan_json(result: Plan, seconds: float, why: str = "",
              skipped: Sequence[Mapping[str, Any]] = ()) -> dict[str, Any]:
    """`considered`: the planner's rejected candidates, then every container that was no
    candidate at all (kind "skipped"); `no_candidate`: why the planner had nothing to score."""
    return {"time": result.time, "plan_seconds": round(seconds, 6), "actions": result.to_json(),
            "considered": [dict(c) for c in (*result.considered, *skipped)],
            **({"no_candidate": why} if why else {})}


def render(snapshot: Snapshot, result: Plan, seconds: float, why: str = "",
           skipped: Sequence[Mapping[str, Any]] = ()) -> str:
    out = [f"snapshot of {snapshot.node or 'node'} at {snapshot.time:.0f}: "
           f"{len(snapshot.containers)} containers on {len(snapshot.topology.cpus)} CPUs "
           f"({snapshot.topology.cpu_model or 'unknown CPU'}); planned in {seconds * 1000:.1f} ms", ""]
    if not result.actions:
        out.append(f"no actions: {why}" if why else
                   "no actions: no candidate pays for its cost or passes the constraints (see below)")
    for i, a in enumerate(result.actions, 1):
        out.append(f"{i}. {a.kind} {a.container}: {a.frm or '-'} -> {a.to}"
                   + (f" (mems {a.mems})" if a.mems else ""))
        out.append(f"   why: {a.reason}")
        if a.benefit or a.victims:
            out.append(f"   benefit {a.benefit:.4f} - cost {a.cost:.4f} = net {a.net:.4f} core-s/s; "
                       f"victims: {', '.join(a.victims) or '-'}")
    if result.considered:
        out += ["", "considered and not done:"]
        for c in result.considered:
            what = c.get("reason") or c.get("decision", "")
            nums = f" [net {c['net']:.4f}]" if "net" in c else ""
            out.append(f"- {c.get('kind')} {c.get('container', '')}: {what} -> {c.get('rejected')}{nums}")
    if skipped:
        out += ["", "no candidate:"]
        out += [f"- {c['container']}: {str(c['rejected']).removeprefix('no candidate: ')}"
                for c in skipped[:MAX_SKIPPED_SHOWN]]
        if len(skipped) > MAX_SKIPPED_SHOWN:
            out.append(f"- ... and {len(skipped) - MAX_SKIPPED_SHOWN} more (--json lists every one)")
    return "\n".join(out) + "\n"
