"""`perfbalance config`: validate a file, or print the reference of every setting."""

from __future__ import annotations

import argparse
import sys

import yaml

from agent.config import Config, load_config, node_name
from perfbalance.errors import ConfigError
from perfbalance.settings import reference, to_dict


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--check", metavar="FILE", help="validate FILE (with this node's overrides)")
    g.add_argument("--defaults", action="store_true", help="print the embedded default config as YAML")
    g.add_argument("--reference", action="store_true", help="print the settings reference (Markdown)")
    p.add_argument("--node", default=None, help="node name for per-node overrides (default: NODE_NAME or hostname)")


def render_reference() -> str:
    lines = ["| key | type | default | meaning |", "|---|---|---|---|"]
    for path, tp, default, doc in reference(Config):
        cells = (f"`{path}`", tp, f"`{default}`", doc)
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines) + "\n"


def main(args: argparse.Namespace) -> int:
    if args.defaults:
        sys.stdout.write(yaml.safe_dump(to_dict(Config()), sort_keys=False))
        return 0
    if args.reference:
        sys.stdout.write(render_reference())
        return 0
    try:
        load_config(args.check, node=args.node or node_name())
    except ConfigError as e:
        print(f"invalid: {e}", file=sys.stderr)
        return 1
    print(f"{args.check}: valid")
    return 0
