"""bpf.render: the exact text bcc compiles, from the shipped C and defines (pure)."""

from __future__ import annotations

import pytest

import bpf
from perfbalance.errors import ParseError


def test_render_prepends_defines_before_the_program() -> None:
    text = bpf.render("pmu", {"PB_NEVENTS": 3, "PB_NCPU": 2})
    head, _, body = text.partition("\n\n")
    assert "#define PB_NCPU 2" in head and "#define PB_NEVENTS 3" in head
    assert body == bpf.template("pmu")


def test_boolean_define_is_a_flag_and_false_is_omitted() -> None:
    assert "#define PB_KEY_PID\n" in bpf.render("avx512", {"PB_KEY_PID": True})
    assert "PB_KEY_PID" not in bpf.render("avx512", {"PB_KEY_PID": False}).partition("\n\n")[0]


def test_render_is_pure_same_input_same_text() -> None:
    assert bpf.render("avx512", {"PB_MAX_KEYS": 64}) == bpf.render("avx512", {"PB_MAX_KEYS": 64})


def test_unknown_define_is_rejected_with_its_name() -> None:
    with pytest.raises(ParseError, match="PB_NCPU"):
        bpf.render("avx512", {"PB_NCPU": 2})


def test_define_value_must_not_inject_code() -> None:
    with pytest.raises(ParseError, match="PB_MAX_KEYS"):
        bpf.render("avx512", {"PB_MAX_KEYS": "1; evil()"})


@pytest.mark.parametrize("defines", [{"PB_X\n": 1}, {"PB_X": "KEY\n"}])
def test_a_define_name_or_value_with_a_trailing_newline_is_refused(defines: dict) -> None:
    with pytest.raises(ParseError, match="PB_X"):
        bpf.render_text("int x;", defines, name="t")


def test_unknown_program_is_rejected() -> None:
    with pytest.raises(ParseError, match="nosuch"):
        bpf.render("nosuch", {})


def test_avx512_program_reads_only_tracepoint_fields_and_helpers() -> None:
    text = bpf.template("avx512")
    assert "args->xfeatures" in text and "bpf_get_current_cgroup_id" in text
    assert "struct task_struct" not in text and "struct fpu" not in text


def test_cflags_are_the_rendered_defines_as_d_flags() -> None:
    assert bpf.cflags("runqlat", {"PB_MAX_KEYS": 64, "PB_KEY_PID": True, "PB_TASK_BITS": 16}) == [
        "-DPB_KEY_PID", "-DPB_MAX_KEYS=64", "-DPB_TASK_BITS=16"]


def test_dump_bpf_renders_each_enabled_program_with_the_collectors_defines(tmp_path) -> None:
    from collectors import avx512, doctor, runqlat
    from collectors.config import Avx512Config, CollectorsConfig, PerfConfig, RunqlatConfig
    from perfbalance import cpus
    from perfbalance.host import HostPaths

    (tmp_path / "proc/sys/kernel").mkdir(parents=True)
    (tmp_path / "proc/sys/kernel/osrelease").write_text("6.1.0\n")
    (tmp_path / "cgroup").mkdir()
    (tmp_path / "cgroup/cgroup.controllers").write_text("cpu cpuset\n")
    host = HostPaths(procfs=str(tmp_path / "proc"), cgroup=str(tmp_path / "cgroup"), sysfs=str(tmp_path / "sys"))
    config = CollectorsConfig(avx512=Avx512Config(max_keys=128), perf=PerfConfig(mode="off"),
                              runqlat=RunqlatConfig(max_keys=256))  # no BTF under sys/: wakeup stamps
    programs = doctor.rendered_programs(config, host)
    assert [p.name for p in programs] == ["avx512", "runqlat"]  # perf off: no pmu program
    want = {"avx512": avx512.bpf_defines(config.avx512, pid_keys=False),
            "runqlat": runqlat.bpf_defines(config.runqlat, pid_keys=False, ncpu=cpus.possible_cpus(str(tmp_path / "sys")))}
    for p in programs:
        assert p.text == bpf.render(p.name, want[p.name])
        assert f"-DPB_MAX_KEYS={want[p.name]['PB_MAX_KEYS']}" in p.cflags
    text = doctor.dump_text(programs)
    assert "cflags: -DPB_FLUSH=32 -DPB_MAX_KEYS=128" in text and bpf.template("runqlat") in text


def test_dump_bpf_renders_runqlat_with_the_offsets_this_kernels_btf_gives(tmp_path) -> None:
    from collectors import doctor
    from collectors.config import CollectorsConfig, PerfConfig, RunqlatConfig
    from perfbalance.host import HostPaths
    from tests.collectors.btf_builder import kernel_like

    (tmp_path / "proc/sys/kernel").mkdir(parents=True)
    (tmp_path / "proc/sys/kernel/osrelease").write_text("6.1.0\n")
    (tmp_path / "sys/kernel/btf").mkdir(parents=True)
    (tmp_path / "sys/kernel/btf/vmlinux").write_bytes(kernel_like())
    host = HostPaths(procfs=str(tmp_path / "proc"), cgroup=str(tmp_path / "nocgroup"), sysfs=str(tmp_path / "sys"))
    for method, sched_info in (("auto", True), ("wakeup_stamps", False)):  # control: asked for the stamps
        config = CollectorsConfig(perf=PerfConfig(mode="off"), runqlat=RunqlatConfig(method=method))
        rq = next(p for p in doctor.rendered_programs(config, host) if p.name == "runqlat")
        assert ("-DPB_SCHEDINFO" in rq.cflags) is sched_info, (method, rq.cflags)
        assert ("-DPB_OFF_LAST_QUEUED=1048" in rq.cflags) is sched_info
        assert ("-DPB_TASK_BITS=16" in rq.cflags) is not sched_info


def test_dump_bpf_keys_by_process_where_no_v2_hierarchy_exists(tmp_path) -> None:
    from collectors import doctor
    from collectors.config import CollectorsConfig, PerfConfig
    from perfbalance.host import HostPaths

    (tmp_path / "proc/sys/kernel").mkdir(parents=True)
    (tmp_path / "proc/sys/kernel/osrelease").write_text("6.1.0\n")
    host = HostPaths(procfs=str(tmp_path / "proc"), cgroup=str(tmp_path / "nocgroup"))
    programs = doctor.rendered_programs(CollectorsConfig(perf=PerfConfig(mode="off")), host)
    assert all("-DPB_KEY_PID" in p.cflags for p in programs)
