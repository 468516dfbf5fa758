"""`perfbalance bench collect|plan`: measured costs and decision quality (docs/benchmarks.md)."""

from __future__ import annotations

import argparse
import importlib

TARGETS = {"collect": "agent.bench.collect", "plan": "agent.bench.plan"}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("target", choices=sorted(TARGETS), help="what to measure")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--quick", action="store_true", help="smaller sizes, for a smoke test")
    p.add_argument("--policy", metavar="NAME", help="plan: the policy run in closed loop in place of the cost model "
                                                    "(the 'perfbalance' strategy); any installed policy")


def main(args: argparse.Namespace) -> int:
    return int(importlib.import_module(TARGETS[args.target]).run(args) or 0)
