"""Every configuration form: accepted and written exactly (the emulated kernel reads it back), or
refused at load naming the key, the value and the kernel's reason."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from perfbalance.errors import ConfigError, FeatureUnavailable
from resctrl.info import MountInfo, parse_mounts, read_info
from resctrl.resolve import resolve
from resctrl.schemata import Schemata
from rchelpers import config, open_on

DATA = Path(__file__).resolve().parent.parent / "data" / "resctrl"
SIZES = {(3, 0): 20 << 20, (3, 1): 20 << 20, (2, 0): 1 << 20, (2, 1): 1 << 20}  # 1 MiB per L3 way


def info_of(variant: str):
    mount = parse_mounts((DATA / variant / "mounts").read_text())
    assert mount is not None
    return read_info(MountInfo(path=str(DATA / variant), options=mount.options))


def gold(variant: str, text: str) -> Schemata:
    return resolve(config(text), info_of(variant), cache_bytes=SIZES).classes["gold"].schemata


ACCEPTED = [
    ("percent", "full", "classes: {gold: {l3: '50%'}}", "L3:0=3ff;1=3ff\n"),
    ("percent range", "full", "classes: {gold: {l3: '25%-50%'}}", "L3:0=3e0;1=3e0\n"),
    ("MiB", "full", "classes: {gold: {l3: 4MiB}}", "L3:0=f;1=f\n"),
    ("KiB rounds up to a way", "full", "classes: {gold: {l3: 1536KiB}}", "L3:0=3;1=3\n"),
    ("hex mask", "full", "classes: {gold: {l3: '0xff0'}}", "L3:0=ff0;1=ff0\n"),
    ("bit range", "full", "classes: {gold: {l3: '4-11'}}", "L3:0=ff0;1=ff0\n"),
    ("per cache id", "full", "classes: {gold: {l3: {all: '50%', 1: '0xf'}}}", "L3:0=3ff;1=f\n"),
    ("MB rounded up to granularity", "full", "classes: {gold: {mb: '45%'}}", "MB:0=50;1=50\n"),
    ("MB never below minimum", "full", "classes: {gold: {mb: '3%'}}", "MB:0=10;1=10\n"),
    ("MBps", "mba_mbps", "classes: {gold: {mb: 2000MBps}}", "MB:0=2000;1=2000\n"),
    ("CDP code and data", "cdp", "classes: {gold: {l3code: '0xf', l3data: '0xf0'}}", "L3CODE:0=f;1=f\nL3DATA:0=f0;1=f0\n"),
    ("l3 on a CDP node sets both", "cdp", "classes: {gold: {l3: '50%'}}", "L3CODE:0=3ff;1=3ff\nL3DATA:0=3ff;1=3ff\n"),
    ("L2 only", "l2_only", "classes: {gold: {l2: '50%'}}", "L2:0=f;1=f\n"),
]


@pytest.mark.parametrize(("form", "variant", "text", "want"), ACCEPTED, ids=[a[0] for a in ACCEPTED])
def test_form_resolves_to_exact_schemata(form: str, variant: str, text: str, want: str) -> None:
    assert gold(variant, text).format() == want


@pytest.mark.parametrize(("form", "variant", "text", "want"), ACCEPTED, ids=[a[0] for a in ACCEPTED])
def test_form_is_accepted_by_the_kernel(emulator, form: str, variant: str, text: str, want: str) -> None:
    emu = emulator(variant)
    setup = open_on(emu, text.replace("4MiB", "4MiB"))
    assert setup.manager is not None and not setup.report.degraded
    written = Schemata.parse((emu.mount / "perfbalance.gold" / "schemata").read_text())
    assert written.only(Schemata.parse(want).resources()) == Schemata.parse(want)


SEED_GROUPS = """
partitions:
  exclusive:
    l3: 50%
    classes:
      Guaranteed: {l3: 100%}
  shared:
    l3: 50%
    classes:
      Burstable: {l3: 100%}
      BestEffort: {l3: 50%}
qos_classes: {guaranteed: Guaranteed, burstable: Burstable, besteffort: BestEffort}
"""


def test_cri_resource_manager_resctrl_groups_example_is_expressible() -> None:
    r = resolve(config(SEED_GROUPS), info_of("full"))
    got = {n: c.schemata.format() for n, c in r.classes.items()}
    assert got == {"Guaranteed": "L3:0=3ff;1=3ff\n", "Burstable": "L3:0=ffc00;1=ffc00\n",
                   "BestEffort": "L3:0=7c00;1=7c00\n"}


def test_partitions_never_overlap_but_classes_inside_share() -> None:
    r = resolve(config(SEED_GROUPS), info_of("full"))
    exclusive = r.partitions["exclusive"].lines["L3"][0]
    shared = r.partitions["shared"].lines["L3"][0]
    assert exclusive & shared == 0
    assert r.classes["BestEffort"].schemata.lines["L3"][0] & r.classes["Burstable"].schemata.lines["L3"][0]


def test_seed_partitions_are_accepted_by_the_kernel(emulator) -> None:
    emu = emulator("full")
    setup = open_on(emu, SEED_GROUPS)
    assert setup.report is not None and set(setup.report.created) == {
        "perfbalance.Guaranteed", "perfbalance.Burstable", "perfbalance.BestEffort"}


def test_root_group_schemata_is_written(emulator) -> None:
    emu = emulator("full")
    open_on(emu, "root: {l3: '10-19', mb: '50%'}")
    assert (emu.mount / "schemata").read_text() == "L3:0=ffc00;1=ffc00\nMB:0= 50;1= 50\n"


def test_partition_mb_scales_class_mb() -> None:
    r = resolve(config("partitions: {p: {mb: '50%', classes: {gold: {mb: '50%'}}}}"), info_of("full"))
    assert r.classes["gold"].schemata.lines["MB"] == {0: 30, 1: 30}  # 25% rounded up to the granularity


def rejected(variant: str, text: str) -> ConfigError:
    with pytest.raises(ConfigError) as e:
        resolve(config(text), info_of(variant), cache_bytes=SIZES)
    return e.value


@pytest.mark.parametrize(("variant", "value", "line", "reason"), [
    ("full", "0x3c3", "L3:0=3c3\n", "The mask 3c3 has non-consecutive 1-bits"),
    ("full", "0x1fffff", "L3:0=1fffff\n", "Mask out of range"),
    ("l2_only", "0x1", "L2:0=1\n", "Need at least 2 bits in the mask"),
])
def test_bad_mask_is_refused_at_load_with_the_kernels_reason(emulator, variant: str, value: str, line: str, reason: str) -> None:
    key = "l2" if variant == "l2_only" else "l3"
    err = rejected(variant, f"classes: {{gold: {{{key}: '{value}'}}}}")
    assert reason in err.reason and err.path == f"resctrl.classes.gold.{key}" and err.value == value
    emu = emulator(variant)
    os.mkdir(emu.mount / "g")
    with pytest.raises(OSError) as kernel:
        (emu.mount / "g" / "schemata").write_text(line)
    assert kernel.value.errno == errno.EINVAL and emu.last_cmd_status() == reason


def test_unknown_cache_id_is_refused_where_the_kernel_gives_no_reason(emulator) -> None:
    err = rejected("full", "classes: {gold: {l3: {all: '50%', 5: '0xf'}}}")
    assert err.path == "resctrl.classes.gold.l3.5" and "cache id 5 does not exist" in err.reason
    emu = emulator("full")
    os.mkdir(emu.mount / "g")
    with pytest.raises(OSError) as kernel:
        (emu.mount / "g" / "schemata").write_text("L3:5=f\n")
    assert kernel.value.errno == errno.EINVAL and emu.last_cmd_status() == "ok"  # linux 6.6 parse_line


def test_more_mib_than_the_cache_has_is_refused() -> None:
    err = rejected("full", "classes: {gold: {l3: 30MiB}}")
    assert "needs 30 ways" in err.reason and err.value == "30MiB"


def test_mib_without_cache_size_is_refused() -> None:
    with pytest.raises(ConfigError, match="size of the L3 cache with id 0 is unknown"):
        resolve(config("classes: {gold: {l3: 4MiB}}"), info_of("full"), cache_bytes={})


def test_overlapping_partitions_are_refused() -> None:
    err = rejected("full", "partitions: {a: {l3: '0-9', classes: {x: {}}}, b: {l3: '5-14', classes: {y: {}}}}")
    assert err.path == "resctrl.partitions.b" and "overlaps partition 'a'" in err.reason


def test_partitions_larger_than_the_cache_are_refused() -> None:
    err = rejected("full", "partitions: {a: {l3: '60%', classes: {x: {}}}, b: {l3: '60%', classes: {y: {}}}}")
    assert err.path == "resctrl.partitions.b.l3" and "needs 12 ways" in err.reason and "only 8 are left" in err.reason


def test_required_mb_on_a_node_without_mb_is_refused() -> None:
    err = rejected("no_mb", "classes: {gold: {l3: '50%', mb: '50%', required: [mb]}}")
    assert err.path == "resctrl.classes.gold.mb" and "no memory bandwidth allocation" in err.reason


def test_preferred_mb_on_a_node_without_mb_is_dropped_with_a_warning() -> None:
    r = resolve(config("classes: {gold: {l3: '50%', mb: '50%'}}"), info_of("no_mb"))
    assert r.classes["gold"].schemata.resources() == ("L3",)
    assert any("resctrl.classes.gold.mb: ignored" in w for w in r.warnings)


def test_percent_mb_on_an_mbps_node_is_not_guessed() -> None:
    err = rejected("mba_mbps", "classes: {gold: {mb: '50%', required: [mb]}}")
    assert "MBps mode" in err.reason


def test_mbps_on_a_percent_node_needs_the_mount_option() -> None:
    err = rejected("full", "classes: {gold: {mb: 2000MBps, required: [mb]}}")
    assert "mba_MBps" in err.reason


def test_required_l3_on_the_mb_only_host_is_refused() -> None:
    err = rejected("mb_only", "classes: {gold: {l3: '50%', mb: '50%', required: [l3]}}")
    assert err.path == "resctrl.classes.gold.l3" and "no L3 cache allocation" in err.reason


def test_cdp_amounts_without_cdp_fall_back_to_l3() -> None:
    r = resolve(config("classes: {gold: {l3: '50%', l3code: '0xf'}}"), info_of("full"))
    assert r.classes["gold"].schemata.format() == "L3:0=3ff;1=3ff\n"
    assert any("l3code: ignored" in w and "-o cdp" in w for w in r.warnings)


@pytest.mark.parametrize(("text", "path", "value"), [
    ("classes: {gold: {l3: 50}}", "resctrl.classes.gold.l3", 50),
    ("classes: {gold: {l3: 'lots'}}", "resctrl.classes.gold.l3", "lots"),
    ("classes: {gold: {mb: '150%'}}", "resctrl.classes.gold.mb", "150%"),
    ("classes: {gold: {l3: {'x': '50%'}}}", "resctrl.classes.gold.l3", {"x": "50%"}),
    ("rdt: maybe", "resctrl.rdt", "maybe"),
    ("group_prefix: ../evil", "resctrl.group_prefix", "../evil"),
])
def test_syntax_errors_name_key_and_value(text: str, path: str, value: object) -> None:
    with pytest.raises(ConfigError) as e:
        config(text)
    assert e.value.path == path and e.value.value == value and e.value.source == "test.yaml"


@pytest.mark.parametrize("name", ["../etc", "a/b", ".", "..", "x" * 64, "with space", ".hidden"])
def test_class_names_that_could_be_paths_are_refused(name: str) -> None:
    with pytest.raises(ConfigError, match="is not allowed"):
        config(f"classes: {{'{name}': {{l3: '50%'}}}}")


def test_qos_default_must_name_a_configured_class() -> None:
    with pytest.raises(ConfigError, match="qos_classes.guaranteed: 'gold' is not a configured class"):
        config("classes: {silver: {l3: '50%'}}\nqos_classes: {guaranteed: gold}")


def test_rdt_on_fails_clearly_when_resctrl_is_not_mounted(tmp_path: Path) -> None:
    from resctrl.setup import open_resctrl
    (tmp_path / "mounts").write_text("proc /proc proc rw 0 0\n")
    with pytest.raises(FeatureUnavailable, match="resctrl is not mounted"):
        open_resctrl(config("rdt: 'on'"), procfs=str(tmp_path), sysfs=str(tmp_path))


def test_rdt_auto_runs_without_resctrl_and_says_why(tmp_path: Path) -> None:
    from resctrl.setup import open_resctrl
    (tmp_path / "mounts").write_text("proc /proc proc rw 0 0\n")
    setup = open_resctrl(config("rdt: auto"), procfs=str(tmp_path), sysfs=str(tmp_path))
    assert setup.manager is None and "not mounted" in setup.reason


def test_rdt_on_with_classes_fails_on_a_monitoring_only_node(emulator) -> None:
    emu = emulator("mon_only")
    with pytest.raises(FeatureUnavailable, match="no RDT allocation"):
        open_on(emu, "rdt: 'on'\nclasses: {gold: {l3: '50%'}}")


def test_rdt_off_never_touches_the_mount(emulator) -> None:
    emu = emulator("full")
    setup = open_on(emu, "rdt: 'off'\nclasses: {gold: {l3: '50%'}}")
    assert setup.manager is None and emu.journal() == []
