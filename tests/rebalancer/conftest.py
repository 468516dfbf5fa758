"""Fixtures for planner tests (builders live in rb_builders.py)."""

from __future__ import annotations

import pytest

from rebalancer import RebalancerConfig


@pytest.fixture
def config() -> RebalancerConfig:
    return RebalancerConfig()
