"""The `perfbalance` command line.

Each subcommand lives in its own module exposing `add_arguments(parser)` and `main(args) -> int`;
modules are imported only when their subcommand runs, so `perfbalance doctor` works on a node
where, say, bcc is missing.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from perfbalance import __version__

# name -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "run": ("agent.cli.run", "run the agent: collect -> plan -> act cycles"),
    "doctor": ("agent.cli.doctor", "what this node offers and what the agent will use"),
    "plan": ("agent.cli.plan", "run the planner on a saved snapshot and explain the plan"),
    "demo": ("agent.cli.demo", "start demo workloads in real cgroups and show the agent at work"),
    "bench": ("agent.cli.bench", "measure collection cost and decision quality"),
    "config": ("agent.cli.config", "validate a config file or print the configuration reference"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="perfbalance", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"perfbalance {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name, (module, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.set_defaults(_module=module)
        try:
            importlib.import_module(module).add_arguments(p)
        except ModuleNotFoundError as e:
            if e.name != module:
                raise
            p.set_defaults(_missing=True)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if getattr(args, "_missing", False):
        print(f"perfbalance {args.command}: not available in this build", file=sys.stderr)
        return 2
    try:
        return int(importlib.import_module(args._module).main(args) or 0)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
