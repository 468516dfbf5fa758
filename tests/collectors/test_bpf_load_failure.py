"""A BPF program that does not load (compile error, verifier refusal): the collector says why,
quoting the compiler's or the verifier's line, falls back where its mode allows, and the agent
runs on.

The broken programs are real: bcc compiles them with this host's headers and the kernel's
verifier refuses them; only the text `bpf.render` returns is replaced.
"""

from __future__ import annotations

import io
import json
import time

import pytest

import bpf
from collector_helpers import Cgroups
from collectors import perf
from collectors.bpfenv import loader
from collectors.avx512 import Avx512Collector
from collectors.config import Avx512Config, PerfConfig
from perfbalance.host import HostPaths

SOFTWARE = PerfConfig(events=("task_clock", "context_switches", "cpu_migrations"))
SYNTAX_ERROR = "int pb_broken( { not C at all\n"
SYNTAX_FIRST_LINE = "Failed to compile BPF module"
# Compiles, but dereferences a map lookup without a NULL check: the verifier refuses it.
VERIFIER_REFUSES = """
BPF_HASH(pb_broken, u64, u64, 16);
TRACEPOINT_PROBE(sched, sched_switch) {
    u64 key = 0;
    u64 *value = pb_broken.lookup(&key);
    return *value;
}
"""
VERIFIER_FIRST_LINE = "Permission denied"
VERIFIER_WHY = "verifier: R0 invalid mem access"

pytestmark = [pytest.mark.root, pytest.mark.bpf]


@pytest.fixture
def broken(monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    """broken(text): every program renders to `text` (what a bad template or define would do)."""
    def use(text: str) -> None:
        monkeypatch.setattr(bpf, "render", lambda name, defines: text)
    return use


# --- pure: finding the line that says why -----------------------------------------------------------

def test_compiler_error_line_is_found_in_the_load_log() -> None:
    log = ("In file included from <built-in>:2:\n/virtual/main.c:3:8: error: expected ')'\n"
           "int x( {\n       ^\n/virtual/main.c:3:22: error: second\n2 errors generated.\n")
    assert loader.load_error_line(log) == "/virtual/main.c:3:8: error: expected ')'"


def test_verifier_complaint_is_found_in_the_load_log() -> None:
    log = ("bpf: Failed to load program: Permission denied\n0: R1=ctx() R10=fp0\n"
           "7: (79) r0 = *(u64 *)(r0 +0)\nR0 invalid mem access 'map_value_or_null'\n"
           "processed 7 insns (limit 1000000) max_states_per_insn 0\n\nHINT: ...\n")
    assert loader.load_error_line(log) == "verifier: R0 invalid mem access 'map_value_or_null'"


# --- the collectors ------------------------------------------------------------------------------

def test_avx512_bpf_only_is_down_quoting_the_compiler_error(host: HostPaths, cgroups: Cgroups, broken) -> None:  # type: ignore[no-untyped-def]
    broken(SYNTAX_ERROR)
    col = Avx512Collector(config=Avx512Config(source="bpf"), host=host, cgroupfs=cgroups.fs)
    st = col.start()
    assert not st.up
    assert SYNTAX_FIRST_LINE in st.reason and "error: " in st.reason, st.reason
    assert col.collect([cgroups.new("x")], time.time()) == {}


@pytest.mark.avx512
def test_avx512_auto_falls_back_to_arch_status_quoting_the_verifier(host: HostPaths, cgroups: Cgroups, broken) -> None:  # type: ignore[no-untyped-def]
    broken(VERIFIER_REFUSES)
    col = Avx512Collector(config=Avx512Config(), host=host, cgroupfs=cgroups.fs)
    st = col.start()
    assert st.up and st.detail["source"] == "arch_status"
    assert VERIFIER_FIRST_LINE in st.reason and VERIFIER_WHY in st.reason, st.reason


def test_perf_bpf_mode_is_down_quoting_the_verifier(host: HostPaths, cgroups: Cgroups, broken) -> None:  # type: ignore[no-untyped-def]
    broken(VERIFIER_REFUSES)
    col = perf.BpfPerfCollector(config=SOFTWARE, host=host, cgroupfs=cgroups.fs)
    st = col.start()
    assert not st.up and VERIFIER_WHY in st.reason, st.reason
    assert col.perf_fds == 0  # the fds opened for the perf array are closed again


def test_perf_auto_falls_back_to_per_cgroup_events_quoting_the_compiler(host: HostPaths, cgroups: Cgroups, broken) -> None:  # type: ignore[no-untyped-def]
    broken(SYNTAX_ERROR)
    col = perf.make_collector(config=SOFTWARE, host=host, cgroupfs=cgroups.fs)
    try:
        st = col.start()
        assert st.up and st.detail["mode"] == "cgroup"
        assert "BPF mode unavailable" in st.reason and SYNTAX_FIRST_LINE in st.reason and "error: " in st.reason
    finally:
        col.close()


# --- the agent -------------------------------------------------------------------------------------

AGENT_CONFIG = """
agent: {{run_dir: {run_dir}, log_format: text, interval_seconds: 0.2}}
discovery: {{kubernetes: false, globs: ["{glob}"]}}
metrics: {{enabled: false}}
kubernetes: {{api: off}}
rebalancer: {{enabled: false}}
resctrl: {{rdt: off}}
"""


@pytest.mark.avx512
async def test_agent_keeps_cycling_with_every_bpf_program_broken(cgroups: Cgroups, broken, tmp_path) -> None:  # type: ignore[no-untyped-def]
    from agent.config import parse_config  # noqa: PLC0415 (the agent is only this test's concern)
    from agent.loop import Agent  # noqa: PLC0415

    broken(VERIFIER_REFUSES)
    c = cgroups.new("busy")
    cgroups.run(c, ["sleep", "30"])
    config = parse_config(AGENT_CONFIG.format(run_dir=tmp_path / "run", glob=c.cgroup), source="t.yaml", node="n")
    out = io.StringIO()
    agent = Agent(config, node="n", cycles=3, json_out=out)
    assert await agent.run() == 0
    reports = [json.loads(line) for line in out.getvalue().splitlines()]
    assert len(reports) == 3
    assert not [e for r in reports for e in r["errors"] if e.startswith("collector ")]
    status = reports[-1]["collectors"]
    assert status["avx512"]["up"] and VERIFIER_WHY in status["avx512"]["reason"]
    assert status["perf"]["up"] and "BPF mode unavailable" in status["perf"]["reason"]
    assert reports[-1]["containers"]  # it still measured the container
