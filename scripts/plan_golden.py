"""Write tests/data/plan_golden.json.gz: the plans of every case in tests/rebalancer/plan_cases.py.

Run it with the planner whose plans are the reference on PYTHONPATH, e.g. a worktree of the
commit before a planner optimisation:
    PYTHONPATH=/path/to/old/tree:tests/rebalancer python3 scripts/plan_golden.py OUT
"""

from __future__ import annotations

import gzip
import json
import sys

from plan_cases import all_cases


def main(out: str) -> None:
    data = {name: run() for name, run in all_cases()}
    with gzip.open(out, "wt") as f:
        json.dump(data, f, sort_keys=True)
    print(f"{out}: {len(data)} cases, {sum(len(v) for v in data.values())} plans")


if __name__ == "__main__":
    main(sys.argv[1])
