"""Fixtures of the reliability room: temp cgroup trees, real cgroups, both cleaned up."""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "agent"))  # fakecg, realcg: the foundations' tree builders
