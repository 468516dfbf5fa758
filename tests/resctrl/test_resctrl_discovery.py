"""Discovery parsers on plain captured trees (tests/data/resctrl/<variant>, see emulator/capture.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from perfbalance.errors import FeatureUnavailable, ParseError
from resctrl.info import MountInfo, cache_sizes, find_mount, parse_mounts, parse_size, read_info
from resctrl.schemata import Schemata, is_contiguous, mask_problem

DATA = Path(__file__).resolve().parent.parent / "data" / "resctrl"


def info_of(variant: str):
    mount = parse_mounts((DATA / variant / "mounts").read_text())
    assert mount is not None
    return read_info(MountInfo(path=str(DATA / variant), options=mount.options))


def test_mount_line_gives_path_and_options() -> None:
    text = "proc /proc proc rw 0 0\nresctrl /sys/fs/resctrl resctrl rw,relatime,cdp,mba_MBps 0 0\n"
    m = parse_mounts(text)
    assert m is not None and m.path == "/sys/fs/resctrl" and m.cdp and m.mba_mbps and not m.cdpl2


def test_no_resctrl_line_means_not_mounted(tmp_path: Path) -> None:
    (tmp_path / "mounts").write_text("sysfs /sys sysfs rw 0 0\n")
    assert find_mount(str(tmp_path)) is None


def test_full_host_has_l3_mb_and_mbm() -> None:
    info = info_of("full")
    l3 = info.caches["L3"]
    assert (l3.cbm_mask, l3.min_cbm_bits, l3.num_closids, l3.shareable_bits, l3.domains) == (0xFFFFF, 1, 16, 0xC0000, (0, 1))
    assert info.mb is not None and (info.mb.bandwidth_gran, info.mb.min_bandwidth, info.mb.mbps) == (10, 10, False)
    assert info.mon is not None and info.mon.mbm and info.mon.domains == (0, 1)
    assert info.num_closids == 8  # the minimum over L3 (16) and MB (8), as closid_init takes it


def test_cdp_host_has_code_and_data_with_half_the_closids() -> None:
    info = info_of("cdp")
    assert set(info.caches) == {"L3CODE", "L3DATA"} and info.num_closids == 8 and info.mount.cdp


def test_mb_only_host_offers_no_cache_allocation() -> None:
    info = info_of("mb_only")
    assert not info.caches and info.mb is not None and info.mb.domains == (0, 1, 2, 3) and info.alloc_capable


def test_mon_only_host_is_not_alloc_capable() -> None:
    info = info_of("mon_only")
    assert not info.alloc_capable and info.mon_capable and info.num_closids == 0


def test_mba_mbps_mount_option_switches_mb_to_mbps() -> None:
    info = info_of("mba_mbps")
    assert info.mb is not None and info.mb.mbps and info.mb.max_value == 4294967295


def test_l2_only_host_has_min_cbm_bits_2_and_no_monitoring() -> None:
    info = info_of("l2_only")
    assert info.caches["L2"].min_cbm_bits == 2 and info.mon is None


def test_missing_info_directory_is_feature_unavailable(tmp_path: Path) -> None:
    with pytest.raises(FeatureUnavailable, match="cannot read"):
        read_info(MountInfo(path=str(tmp_path)))


def test_garbage_in_info_file_names_the_file(tmp_path: Path) -> None:
    (tmp_path / "info" / "L3").mkdir(parents=True)
    for name, value in (("cbm_mask", "fffff"), ("min_cbm_bits", "one"), ("num_closids", "16")):
        (tmp_path / "info" / "L3" / name).write_text(value + "\n")
    (tmp_path / "schemata").write_text("L3:0=fffff\n")
    with pytest.raises(ParseError, match="min_cbm_bits in info/L3"):
        read_info(MountInfo(path=str(tmp_path)))


def test_schemata_parse_tolerates_kernel_padding_and_formats_minimally() -> None:
    s = Schemata.parse("L3CODE:0=000ff;1=fffff\n    MB:0= 50;1=100\n")
    assert s.lines["L3CODE"] == {0: 0xFF, 1: 0xFFFFF} and s.lines["MB"] == {0: 50, 1: 100}
    assert s.format() == "L3CODE:0=ff;1=fffff\nMB:0=50;1=100\n"


def test_schemata_parse_rejects_missing_equals() -> None:
    with pytest.raises(ParseError, match="expected 'id=value'"):
        Schemata.parse("L3:0fff\n")


@pytest.mark.parametrize(("mask", "problem"), [
    (0xF7, "The mask f7 has non-consecutive 1-bits"),
    (0, "Mask out of range"),
    (0x100000, "Mask out of range"),
    (0x1, "Need at least 2 bits in the mask"),
    (0xF0, ""),
])
def test_mask_problems_use_the_kernels_words(mask: int, problem: str) -> None:
    assert mask_problem(mask, cbm_mask=0xFFFFF, min_cbm_bits=2) == problem


def test_contiguity() -> None:
    assert is_contiguous(0b0111000) and not is_contiguous(0b0101) and not is_contiguous(0)


def test_sysfs_cache_sizes(tmp_path: Path) -> None:
    for cpu, ident in ((0, 0), (1, 1)):
        d = tmp_path / f"devices/system/cpu/cpu{cpu}/cache/index3"
        d.mkdir(parents=True)
        for name, value in (("level", "3"), ("id", str(ident)), ("type", "Unified"), ("size", "20480K")):
            (d / name).write_text(value + "\n")
    assert cache_sizes(str(tmp_path)) == {(3, 0): 20 << 20, (3, 1): 20 << 20}
    assert parse_size("32M") == 32 << 20
