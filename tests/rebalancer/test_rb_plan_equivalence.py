"""The optimised planner makes the same plans as the code it replaced.

tests/data/plan_golden.json.gz holds every plan of the closed-loop cases of plan_cases.py as
planned by commit 9143d61 (before the issue-16 indexes and incremental scoring), written by
scripts/plan_golden.py; re-baselined when the cost model began to charge SMT sibling sharing,
when it began to score memory bandwidth at offered load, and when the island_return candidate
came (one more rejected candidate in bandwidth_hog's first plan; the changes are listed in
those commits' messages). Actions, reasons, targets, victims, rejected candidates and planner state
must match exactly; numbers to 1e-9 relative (summation order may differ in the last bits).
"""

from __future__ import annotations

import copy
import gzip
import json
import math
from pathlib import Path
from typing import Any

import pytest

from plan_cases import all_cases

GOLDEN = Path(__file__).resolve().parents[1] / "data" / "plan_golden.json.gz"
REL = 1e-9


def _golden() -> dict[str, Any]:
    with gzip.open(GOLDEN, "rt") as f:
        return json.load(f)  # type: ignore[no-any-return]


def differences(old: Any, new: Any, path: str = "") -> list[str]:
    """Where `new` differs from `old` (floats within REL relative or 1e-12 absolute are equal)."""
    if isinstance(old, float) or isinstance(new, float):
        ok = isinstance(old, (int, float)) and isinstance(new, (int, float)) and \
            math.isclose(old, new, rel_tol=REL, abs_tol=1e-12)
        return [] if ok else [f"{path}: {old!r} != {new!r}"]
    if isinstance(old, dict) and isinstance(new, dict):
        if old.keys() != new.keys():
            return [f"{path}: keys {sorted(old.keys() ^ new.keys())} differ"]
        return [d for k in old for d in differences(old[k], new[k], f"{path}.{k}")]
    if isinstance(old, list) and isinstance(new, list):
        if len(old) != len(new):
            return [f"{path}: {len(old)} items != {len(new)}"]
        return [d for i, (a, b) in enumerate(zip(old, new)) for d in differences(a, b, f"{path}[{i}]")]
    return [] if old == new else [f"{path}: {old!r} != {new!r}"]


CASES = all_cases()


@pytest.mark.parametrize("name,run", CASES, ids=[n for n, _ in CASES])
def test_same_plans_as_before_the_optimisation(name: str, run: Any) -> None:
    # json round trip: tuples become lists and int keys strings, as in the golden file
    new = json.loads(json.dumps(run(), sort_keys=True))
    assert differences(_golden()[name], new, name) == []


def test_every_golden_case_is_still_run() -> None:
    assert sorted(_golden()) == sorted(n for n, _ in CASES)


def test_a_changed_target_or_number_is_a_difference() -> None:
    plans = _golden()["random_1"]
    moved = copy.deepcopy(plans)
    act = next(a for p in moved for a in p["actions"] if a["kind"] == "cpuset")
    act["to"] = act["to"] + ",999"
    nudged = copy.deepcopy(plans)
    act = next(a for p in nudged for a in p["actions"] if a["benefit"])
    act["benefit"] *= 1 + 1e-6
    assert differences(plans, plans) == []
    assert len(differences(plans, moved)) == 1 and len(differences(plans, nudged)) == 1
