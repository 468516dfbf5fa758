"""`perfbalance plan SNAPSHOT.json`: run the planner on a saved snapshot and explain the plan.

The file holds a Snapshot (docs/snapshot-format.md) or lines of `perfbalance run --json` output;
with several lines the last one is planned. A malformed file is a clear error naming the field
(exit code 2), never a traceback. Besides the actions and the rejected candidates it explains the
placement annotations (rebalancer.explain.hints): every affinity / anti-affinity pair now and
after the plan, and every AVX-512 pre-classification; from a `run --json` line it also shows the
running agent's own AVX-512 verdict, which has the history (smoothing) a single snapshot lacks.
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
MAX_PAIRS_SHOWN = 20  # text output; --json lists every pair


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("snapshot", metavar="SNAPSHOT.json", help="a snapshot, or `perfbalance run --json` output (last line is used)")
    p.add_argument("--json", action="store_true", help="print the plan as one JSON object")
    p.add_argument("--config", metavar="FILE", help="YAML config whose `rebalancer:` section is used (default: built-in)")
    p.add_argument("--now", type=float, metavar="SECONDS", help="planning time (default: the snapshot's time)")
    p.add_argument("--policy", metavar="NAME", help="the policy to plan with (default: rebalancer.policy of --config, "
                                                    "else costmodel); any installed in the perfbalance.policies entry points")


def load_snapshot(path: str) -> Snapshot:
    """Read `path` and parse its (last non-empty) line or whole text as a Snapshot."""
    return load_document(path)[0]


def load_document(path: str) -> tuple[Snapshot, Any]:
    """The Snapshot of `path` and the JSON document it came from (a `run --json` line has more)."""
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
    return parse_document(text, source=path)


def parse_snapshot_text(text: str, *, source: str) -> Snapshot:
    return parse_document(text, source=source)[0]


def parse_document(text: str, *, source: str) -> tuple[Snapshot, Any]:
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
    return Snapshot.from_json(data, source=source), data


def recorded_avx512(data: Any) -> dict[str, dict[str, Any]]:
    """The running agent's `avx512_annotation` entries of a `run --json` line, by container (entries
    that are not well-formed are left out: they only add to the explanation)."""
    out: dict[str, dict[str, Any]] = {}
    entries = data.get("considered") if isinstance(data, dict) else None
    for c in entries if isinstance(entries, list) else ():
        if (isinstance(c, dict) and c.get("kind") == "avx512_annotation" and isinstance(c.get("container"), str)
                and isinstance(c.get("state"), str) and isinstance(c.get("reason", ""), str)):
            out[c["container"]] = {"state": c["state"], "reason": c.get("reason", ""),
                                   **({"cycle": data["cycle"]} if isinstance(data.get("cycle"), int) else {})}
    return out


def main(args: argparse.Namespace) -> int:
    from agent.config import load_config
    from agent.plan.runner import planner
    from agent.snapshot.derive import with_derived
    from rebalancer import RebalancerConfig
    from rebalancer.policy import PolicyError

    try:
        if args.now is not None and not math.isfinite(args.now):
            raise ParseError("--now", args.now, "must be finite")
        raw, document = load_document(args.snapshot)
        snapshot = with_derived(raw)  # the values the agent derives, as it would
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
    from rebalancer.explain import explain, hints

    # The explanation of what was not done reads the cost model's reasoning: for it only.
    why, skipped = (explain(snapshot, config, None, now, result) if name == "costmodel"
                    else ("" if result.actions else f"policy {name!r} planned none", ()))
    notes = hints(snapshot, config, None, now, result)  # what any plan does to the annotated pairs
    recorded = recorded_avx512(document)
    notes["avx512"] = [{**n, **({"recorded": recorded[n["container"]]} if n["container"] in recorded else {})}
                       for n in notes["avx512"]]
    if args.json:
        try:  # JSON has no Infinity or NaN: refuse to print invalid JSON
            text = json.dumps(plan_json(result, seconds, why, skipped, notes), allow_nan=False)
        except ValueError:
            print(f"perfbalance plan: {args.snapshot}: the plan holds a non-finite number "
                  "(metrics too large to compute with)", file=sys.stderr)
            return 2
        sys.stdout.write(text + "\n")
    else:
        sys.stdout.write(render(snapshot, result, seconds, why, skipped, notes))
    return 0


def plan_json(result: Plan, seconds: float, why: str = "",
              skipped: Sequence[Mapping[str, Any]] = (),
              notes: Mapping[str, Sequence[Mapping[str, Any]]] | None = None) -> dict[str, Any]:
    """`considered`: the planner's rejected candidates, then every container that was no
    candidate at all (kind "skipped"); `no_candidate`: why the planner had nothing to score;
    `hints`: the affinity pairs and AVX-512 pre-classifications (rebalancer.explain.hints)."""
    return {"time": result.time, "plan_seconds": round(seconds, 6), "actions": result.to_json(),
            "considered": [dict(c) for c in (*result.considered, *skipped)],
            **({"no_candidate": why} if why else {}),
            "hints": {k: [n if isinstance(n, str) else dict(n) for n in v]
                      for k, v in (notes or {"pairs": [], "avx512": [], "problems": []}).items()}}


def _is_hint_note(c: Mapping[str, Any]) -> bool:
    """The planner's own notes on annotations (rebalancer.hintnotes): shown in their own section."""
    return c.get("kind") == "avx512_annotation" or "overlap" in c


def render_hints(notes: Mapping[str, Sequence[Mapping[str, Any]]]) -> list[str]:
    from rebalancer.affinity import HARD_WEIGHT

    out: list[str] = []
    pairs, avx, bad = notes.get("pairs", ()), notes.get("avx512", ()), notes.get("problems", ())
    if pairs:
        out += ["", "affinity and anti-affinity "
                f"(cost-model term in core-s/s: + costs, - earns; hard: {HARD_WEIGHT:g} x share):"]
        out += [_pair_line(p) for p in pairs[:MAX_PAIRS_SHOWN]]
        if len(pairs) > MAX_PAIRS_SHOWN:
            out.append(f"- ... and {len(pairs) - MAX_PAIRS_SHOWN} more (--json lists every one)")
    if avx:
        out += ["", "AVX-512 pre-classification (annotation):"]
        for n in avx:
            out.append(f"- {n['who']}: {n['state']} ({n['reason']})")
            rec = n.get("recorded")
            if rec:
                at = f" at cycle {rec['cycle']}" if "cycle" in rec else ""
                out.append(f"  running agent{at}: {rec['state']} ({rec['reason']})")
    if bad:
        out += ["", "placement annotations ignored:"] + [f"- {line}" for line in bad]
    return out


def _pair_line(p: Mapping[str, Any]) -> str:
    kind = ("hard " if p["hard"] else "") + str(p["kind"])
    weight = "hard" if p["hard"] else f"weight {p['weight']:g}"

    def state(ov: float, term: float, ok: bool) -> str:
        return f"they share {ov:.0%} of their {p['scope']} domains, term {term:+.4g}, {'satisfied' if ok else 'not satisfied'}"
    return (f"- {kind} {p['who']} / {p['other_who']} ({p['term']}; {p['scope']}, {weight}): "
            f"now {state(p['overlap_now'], p['term_now'], p['satisfied_now'])}; "
            f"after the plan {state(p['overlap_after'], p['term_after'], p['satisfied_after'])}")


def render(snapshot: Snapshot, result: Plan, seconds: float, why: str = "",
           skipped: Sequence[Mapping[str, Any]] = (),
           notes: Mapping[str, Sequence[Mapping[str, Any]]] | None = None) -> str:
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
    rejected = [c for c in result.considered if not _is_hint_note(c)]
    if rejected:
        out += ["", "considered and not done:"]
        for c in rejected:
            what = c.get("reason") or c.get("decision", "")
            nums = f" [net {c['net']:.4f}]" if "net" in c else ""
            out.append(f"- {c.get('kind')} {c.get('container', '')}: {what} -> {c.get('rejected')}{nums}")
    if skipped:
        out += ["", "no candidate:"]
        out += [f"- {c['container']}: {str(c['rejected']).removeprefix('no candidate: ')}"
                for c in skipped[:MAX_SKIPPED_SHOWN]]
        if len(skipped) > MAX_SKIPPED_SHOWN:
            out.append(f"- ... and {len(skipped) - MAX_SKIPPED_SHOWN} more (--json lists every one)")
    out += render_hints(notes or {})
    return "\n".join(out) + "\n"
