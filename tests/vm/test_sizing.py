"""vCPUs from VMM overhead + containers' limits in milli-CPU, rounded up once."""

from __future__ import annotations

import pytest

from perfbalance.model import Container
from rebalancer.vm import VmLayoutError, sandbox_vcpus, vcpus_needed


@pytest.mark.parametrize("overhead,limits,vcpus", [
    (0, [], 1),  # overhead 0 and no limits -> 1
    (750, [250], 1),  # 0.75 + 0.25 -> 1
    (750, [1200], 2),  # 0.75 + 1.2 -> 2
    (500, [250], 1),  # Kata #7623's example: 1 + ceil(0.25) = 2 was the bug
    (0, [1000, 1000], 2),
    (0, [1001], 2),
    (250, [None, 500], 1),  # no limit adds nothing
    (1000, [300, 300, 300, 300], 3),  # 2.2 -> 3, not 1 + 4 x 1 = 5
])
def test_vcpus_are_rounded_up_once(overhead, limits, vcpus):
    assert vcpus_needed(overhead_mcpu=overhead, limits_mcpu=limits) == vcpus


def test_sandbox_vcpus_reads_container_limits():
    cs = [Container(id="a", cgroup="p/a", limit_mcpu=250), Container(id="b", cgroup="p/b", limit_mcpu=None),
          Container(id="c", cgroup="p/c", limit_mcpu=1200)]
    assert sandbox_vcpus(cs, overhead_mcpu=750) == 3  # 0.75 + 0.25 + 1.2 = 2.2


@pytest.mark.parametrize("overhead,limits", [(-1, []), (0, [-5])])
def test_negative_amounts_are_refused(overhead, limits):
    with pytest.raises(VmLayoutError):
        vcpus_needed(overhead_mcpu=overhead, limits_mcpu=limits)
