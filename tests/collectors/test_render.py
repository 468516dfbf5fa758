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


def test_dump_shows_every_program() -> None:
    text = bpf.dump()
    assert all(f"===== {name}:" in text for name in bpf.PROGRAMS)
