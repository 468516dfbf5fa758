"""The /proc/<pid>/arch_status parser on files captured on an AVX-512 machine."""

from __future__ import annotations

from pathlib import Path

import pytest

from collectors.archstatus import ArchStatus, parse_arch_status, summarize
from perfbalance.errors import ParseError

DATA = Path(__file__).resolve().parents[1] / "data" / "arch_status"


def parse(name: str) -> ArchStatus:
    return parse_arch_status((DATA / name).read_text(), source=name)


def test_numpy_exp_reports_elapsed_ms_since_last_avx512_use() -> None:
    assert parse("numpy-exp.txt") == ArchStatus(supported=True, avx512_elapsed_ms=200)


def test_sh_loop_counts_as_avx512_user_because_the_signal_is_coarse() -> None:
    assert parse("sh-loop.txt").used_within(1.0)


def test_minus_one_means_never_used() -> None:
    status = parse("never-used.txt")
    assert status.supported and status.avx512_elapsed_ms is None and not status.used_within(3600)


def test_empty_file_means_cpu_without_avx512() -> None:
    assert parse("no-avx512-cpu.txt") == ArchStatus(supported=False)


def test_malformed_value_names_the_field_and_value() -> None:
    with pytest.raises(ParseError, match="AVX512_elapsed_ms.*soon"):
        parse("malformed.txt")


def test_use_older_than_the_window_is_not_active() -> None:
    assert not parse("numpy-exp.txt").used_within(0.1)


def test_summary_counts_threads_active_in_the_window_and_skips_exited_ones() -> None:
    statuses = [parse("numpy-exp.txt"), parse("never-used.txt"), None, parse("no-avx512-cpu.txt")]
    window = summarize(statuses, 1.0)
    assert (window.threads, window.active, window.ratio) == (2, 1, 0.5)
