"""Discovery: where resctrl is mounted and what the node's RDT hardware offers.

Everything perfbalance decides about RDT is checked against this first, so that a configuration
the kernel would refuse is refused at load with the reason, instead of failing at write time
(cri-resource-manager wrote `L3:` lines on a host with only MB and got a bare EINVAL). The files
are those of resctrl.rst "Info directory": info/<L3|L2|L3CODE|L3DATA|L2CODE|L2DATA>/{cbm_mask,
min_cbm_bits, num_closids, shareable_bits, sparse_masks}, info/MB/{bandwidth_gran, min_bandwidth,
delay_linear, num_closids}, info/L3_MON/{num_rmids, mon_features, max_threshold_occupancy}; the
domains come from the root group's schemata and the mon_data directory names (mon_L3_<id>).
Readers are one small function per file; parsers are pure.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from perfbalance.errors import FeatureUnavailable, ParseError
from resctrl.schemata import Schemata

CACHE_RESOURCES = ("L3", "L3CODE", "L3DATA", "L2", "L2CODE", "L2DATA")
MBA_MAX_MBPS = 4294967295  # the kernel's "unlimited" in mba_MBps mode
_MON_DIR = re.compile(r"^mon_(L3|L2)_(\d+)$")


@dataclass(frozen=True, kw_only=True)
class MountInfo:
    path: str
    options: frozenset[str] = frozenset()

    @property
    def cdp(self) -> bool:
        return "cdp" in self.options

    @property
    def cdpl2(self) -> bool:
        return "cdpl2" in self.options

    @property
    def mba_mbps(self) -> bool:
        return "mba_MBps" in self.options


@dataclass(frozen=True, kw_only=True)
class CacheInfo:
    name: str  # schema name as written in schemata: L3, L3CODE, ...
    cbm_mask: int
    min_cbm_bits: int
    num_closids: int
    shareable_bits: int = 0
    sparse_masks: bool = False
    domains: tuple[int, ...] = ()

    @property
    def cbm_len(self) -> int:
        return self.cbm_mask.bit_length()

    @property
    def level(self) -> int:
        return int(self.name[1])


@dataclass(frozen=True, kw_only=True)
class MbInfo:
    num_closids: int
    bandwidth_gran: int
    min_bandwidth: int
    delay_linear: bool = True
    mbps: bool = False  # mounted with -o mba_MBps: values are MBps, not percent
    domains: tuple[int, ...] = ()

    @property
    def max_value(self) -> int:
        return MBA_MAX_MBPS if self.mbps else 100


@dataclass(frozen=True, kw_only=True)
class MonInfo:
    num_rmids: int
    features: tuple[str, ...]
    max_threshold_occupancy: int = 0
    domains: tuple[int, ...] = ()

    @property
    def mbm(self) -> bool:
        return "mbm_total_bytes" in self.features or "mbm_local_bytes" in self.features


@dataclass(frozen=True, kw_only=True)
class ResctrlInfo:
    mount: MountInfo
    caches: Mapping[str, CacheInfo] = field(default_factory=dict)
    mb: MbInfo | None = None
    mon: MonInfo | None = None

    @property
    def alloc_capable(self) -> bool:
        return bool(self.caches) or self.mb is not None

    @property
    def mon_capable(self) -> bool:
        return self.mon is not None

    @property
    def num_closids(self) -> int:
        """CLOSIDs usable by groups: the minimum over resources (closid_init), root included."""
        ids = [c.num_closids for c in self.caches.values()] + ([self.mb.num_closids] if self.mb else [])
        return min(ids) if ids else 0

    def resources(self) -> tuple[str, ...]:
        return tuple(self.caches) + (("MB",) if self.mb else ())

    def describe(self) -> str:
        parts = list(self.resources()) + (["L3_MON"] if self.mon else [])
        return ", ".join(parts) if parts else "nothing"


# -- pure parsers ---------------------------------------------------------------------------

def parse_mounts(text: str) -> MountInfo | None:
    """The first resctrl mount in /proc/mounts text, or None."""
    for line in text.splitlines():
        fields = line.split()
        if len(fields) >= 4 and fields[2] == "resctrl":
            path = fields[1].replace("\\040", " ")
            return MountInfo(path=path, options=frozenset(fields[3].split(",")))
    return None


def parse_int(text: str, what: str, *, base: int = 10, source: str = "") -> int:
    try:
        value = int(text.strip(), base)
    except ValueError:
        raise ParseError(what, text, "not a number", source=source) from None
    if value < 0:
        raise ParseError(what, text, "negative", source=source)
    return value


def parse_cache_info(name: str, files: Mapping[str, str], domains: tuple[int, ...], *, source: str = "") -> CacheInfo:
    return CacheInfo(
        name=name, domains=domains,
        cbm_mask=parse_int(files["cbm_mask"], "cbm_mask", base=16, source=source),
        min_cbm_bits=parse_int(files["min_cbm_bits"], "min_cbm_bits", source=source),
        num_closids=parse_int(files["num_closids"], "num_closids", source=source),
        shareable_bits=parse_int(files.get("shareable_bits", "0"), "shareable_bits", base=16, source=source),
        sparse_masks=files.get("sparse_masks", "0").strip() == "1",
    )


def parse_mb_info(files: Mapping[str, str], domains: tuple[int, ...], *, mbps: bool, source: str = "") -> MbInfo:
    return MbInfo(
        domains=domains, mbps=mbps,
        num_closids=parse_int(files["num_closids"], "num_closids", source=source),
        bandwidth_gran=max(1, parse_int(files["bandwidth_gran"], "bandwidth_gran", source=source)),
        min_bandwidth=parse_int(files["min_bandwidth"], "min_bandwidth", source=source),
        delay_linear=files.get("delay_linear", "1").strip() == "1",
    )


def parse_mon_info(files: Mapping[str, str], domains: tuple[int, ...], *, source: str = "") -> MonInfo:
    return MonInfo(
        domains=domains,
        num_rmids=parse_int(files["num_rmids"], "num_rmids", source=source),
        features=tuple(f for f in files.get("mon_features", "").split() if f),
        max_threshold_occupancy=parse_int(files.get("max_threshold_occupancy", "0"), "max_threshold_occupancy", source=source),
    )


def parse_mon_domains(names: list[str]) -> tuple[int, ...]:
    """Domain ids from mon_data directory names (mon_L3_00, mon_L3_01, ...)."""
    return tuple(sorted(int(m.group(2)) for n in names if (m := _MON_DIR.match(n)) and m.group(1) == "L3"))


def build_info(mount: MountInfo, info_files: Mapping[str, Mapping[str, str]], root_schemata: str,
               mon_dirs: list[str]) -> ResctrlInfo:
    """ResctrlInfo from the contents of info/<dir>/<file>, the root schemata and mon_data names."""
    schemata = Schemata.parse(root_schemata, source=f"{mount.path}/schemata")
    caches = {}
    for name in CACHE_RESOURCES:
        if name in info_files:
            doms = tuple(sorted(schemata.lines.get(name, {})))
            caches[name] = parse_cache_info(name, info_files[name], doms, source=f"info/{name}")
    mb = None
    if "MB" in info_files:
        doms = tuple(sorted(schemata.lines.get("MB", {})))
        mb = parse_mb_info(info_files["MB"], doms, mbps=mount.mba_mbps, source="info/MB")
    mon = None
    if "L3_MON" in info_files:
        mon = parse_mon_info(info_files["L3_MON"], parse_mon_domains(mon_dirs), source="info/L3_MON")
    return ResctrlInfo(mount=mount, caches=caches, mb=mb, mon=mon)


# -- readers ---------------------------------------------------------------------------------

def read_text(path: str, limit: int = 1 << 16) -> str:
    with open(path, "rb") as f:
        return f.read(limit).decode(errors="replace")


def find_mount(procfs: str) -> MountInfo | None:
    """The resctrl mount from <procfs>/mounts (pass the host's /proc), or None."""
    try:
        return parse_mounts(read_text(os.path.join(procfs, "mounts"), 1 << 22))
    except OSError:
        return None


def read_info(mount: MountInfo) -> ResctrlInfo:
    """Read info/, the root schemata and mon_data; FeatureUnavailable when it is not resctrl."""
    info_dir = os.path.join(mount.path, "info")
    try:
        dirs = sorted(d for d in os.listdir(info_dir) if os.path.isdir(os.path.join(info_dir, d)))
    except OSError as e:
        raise FeatureUnavailable("resctrl", f"cannot read {info_dir}: {e.strerror}") from None
    files = {d: _read_dir(os.path.join(info_dir, d)) for d in dirs}
    schemata_path = os.path.join(mount.path, "schemata")
    root = read_text(schemata_path) if os.path.exists(schemata_path) else ""
    mon_data = os.path.join(mount.path, "mon_data")
    mon_dirs = os.listdir(mon_data) if os.path.isdir(mon_data) else []
    return build_info(mount, files, root, mon_dirs)


def _read_dir(path: str) -> dict[str, str]:
    out = {}
    for name in os.listdir(path):
        full = os.path.join(path, name)
        if os.path.isfile(full):
            try:
                out[name] = read_text(full)
            except OSError:
                continue
    return out


def cache_sizes(sysfs: str) -> dict[tuple[int, int], int]:
    """(cache level, cache id) -> bytes, from <sysfs>/devices/system/cpu/cpu*/cache/index*."""
    base = os.path.join(sysfs, "devices/system/cpu")
    out: dict[tuple[int, int], int] = {}
    try:
        cpus = [c for c in os.listdir(base) if re.fullmatch(r"cpu\d+", c)]
    except OSError:
        return out
    for cpu in cpus:
        cache_dir = os.path.join(base, cpu, "cache")
        for index in os.listdir(cache_dir) if os.path.isdir(cache_dir) else []:
            entry = _cache_entry(os.path.join(cache_dir, index))
            if entry is not None:
                out[entry[0]] = entry[1]
    return out


def _cache_entry(path: str) -> tuple[tuple[int, int], int] | None:
    try:
        level = int(read_text(os.path.join(path, "level")))
        ident = int(read_text(os.path.join(path, "id")))
        kind = read_text(os.path.join(path, "type")).strip()
        size = parse_size(read_text(os.path.join(path, "size")))
    except (OSError, ValueError):
        return None
    if kind not in ("Unified", "Data") or (level == 1 and kind != "Data"):
        return None
    return (level, ident), size


def parse_size(text: str) -> int:
    """sysfs cache size: "20480K", "1024K", "32M"."""
    t = text.strip().upper()
    mult = {"K": 1024, "M": 1024 ** 2, "G": 1024 ** 3}.get(t[-1:], 1)
    return int(t[:-1] if t[-1:] in "KMG" else t) * mult
