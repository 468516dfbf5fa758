"""`perfbalance run`: the agent itself (see docs/run-json.md for the --json lines)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from dataclasses import replace

from agent.config import Config, load_config, node_name
from perfbalance.errors import ConfigError, PerfbalanceError

log = logging.getLogger("perfbalance")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", metavar="FILE", help="YAML config (default: the embedded defaults); re-read when it changes")
    p.add_argument("--dry-run", action="store_true", help="plan but never act")
    p.add_argument("--cycles", type=int, metavar="N", help="run N collect -> plan -> act cycles, then exit")
    p.add_argument("--json", action="store_true", help="print one JSON object per cycle on its own line")
    p.add_argument("--interval", type=float, metavar="SECONDS", help="override agent.interval_seconds")
    p.add_argument("--node", help="node name for per-node overrides (default: NODE_NAME or hostname)")


def main(args: argparse.Namespace) -> int:
    from agent.persist.instance import InstanceLock, setup_logging
    from agent.loop import Agent

    node = args.node or node_name()
    try:
        config = load_config(args.config, node=node)
    except ConfigError as e:
        print(f"perfbalance: invalid configuration: {e}", file=sys.stderr)
        return 2
    if args.cycles is not None and args.cycles < 1:
        print(f"perfbalance: --cycles must be >= 1 (got {args.cycles})", file=sys.stderr)
        return 2
    if args.interval is not None and not 0.05 <= args.interval <= 3600:
        print(f"perfbalance: --interval must be in 0.05..3600 (got {args.interval})", file=sys.stderr)
        return 2

    def overrides(c: Config) -> Config:  # command-line flags outlive config reloads
        if args.interval is None:
            return c
        return replace(c, agent=replace(c.agent, interval_seconds=args.interval))

    config = overrides(config)
    setup_logging(config.agent.log_level, config.agent.log_format, stream=sys.stderr)
    try:
        lock = InstanceLock(config.agent.run_dir)
        lock.acquire()
    except PerfbalanceError as e:
        print(f"perfbalance: {e}", file=sys.stderr)
        return 1
    try:
        agent = Agent(config, node=node, config_path=args.config, dry_run=args.dry_run,
                      cycles=args.cycles, json_out=sys.stdout if args.json else None,
                      overrides=overrides)
        log.info("perfbalance starting on node %s (dry_run=%s)", node, agent.dry_run)
        return asyncio.run(agent.run())
    except PerfbalanceError as e:  # a startup requirement not met (e.g. resctrl.rdt: on)
        print(f"perfbalance: cannot start: {e}", file=sys.stderr)
        return 1
    finally:
        lock.release()
