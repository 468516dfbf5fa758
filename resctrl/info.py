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
from perfbalance.safefs import RDTGROUP_SUPER_MAGIC, SafeTree, UnsafePath, fs_magic, magic_name, read_text
from resctrl.schemata import Schemata

CACHE_RESOURCES = ("L3", "L3CODE", "L3DATA", "L2", "L2CODE", "L2DATA")
MBA_MAX_MBPS = 4294967295  # the kernel's "unlimited" in mba_MBps mode
_MON_DIR = re.compile(r"^mon_(L3|L2)_(\d+)$")


@dataclass(frozen=True, kw_only=True)
class MountInfo:
    path: str
    options: frozenset[str] = frozenset()
    fstype: str = ""  # as the mount table says ("resctrl"); "" when the mount was given, not found

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
            return MountInfo(path=path, options=frozenset(fields[3].split(",")), fstype="resctrl")
    return None


def parse_int(text: str, what: str, *, base: int = 10, source: str = "") -> int:
    try:
        value = int(text.strip(), base)
    except ValueError:
        raise ParseError(what, text, "not a number", source=source) from None
    if value < 0:
        raise ParseError(what, text, "negative", source=source)
    return value


def required(files: Mapping[str, str], name: str, *, source: str = "") -> str:
    """The text of info file `name`, or a ParseError naming the file that is missing."""
    try:
        return files[name]
    except KeyError:
        where = f"{source}/{name}" if source else name
        have = ", ".join(sorted(files)) or "none"
        raise ParseError("resctrl info file", where, f"missing (files present: {have})", source=source) from None


def parse_cache_info(name: str, files: Mapping[str, str], domains: tuple[int, ...], *, source: str = "") -> CacheInfo:
    return CacheInfo(
        name=name, domains=domains,
        cbm_mask=parse_int(required(files, "cbm_mask", source=source), "cbm_mask", base=16, source=source),
        min_cbm_bits=parse_int(required(files, "min_cbm_bits", source=source), "min_cbm_bits", source=source),
        num_closids=parse_int(required(files, "num_closids", source=source), "num_closids", source=source),
        shareable_bits=parse_int(files.get("shareable_bits", "0"), "shareable_bits", base=16, source=source),
        sparse_masks=files.get("sparse_masks", "0").strip() == "1",
    )


def parse_mb_info(files: Mapping[str, str], domains: tuple[int, ...], *, mbps: bool, source: str = "") -> MbInfo:
    return MbInfo(
        domains=domains, mbps=mbps,
        num_closids=parse_int(required(files, "num_closids", source=source), "num_closids", source=source),
        bandwidth_gran=max(1, parse_int(required(files, "bandwidth_gran", source=source), "bandwidth_gran", source=source)),
        min_bandwidth=parse_int(required(files, "min_bandwidth", source=source), "min_bandwidth", source=source),
        delay_linear=files.get("delay_linear", "1").strip() == "1",
    )


def parse_mon_info(files: Mapping[str, str], domains: tuple[int, ...], *, source: str = "") -> MonInfo:
    return MonInfo(
        domains=domains,
        num_rmids=parse_int(required(files, "num_rmids", source=source), "num_rmids", source=source),
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

FUSE_SUPER_MAGIC = 0x65735546  # include/uapi/linux/magic.h
INFO_MAX_READ = 1 << 16  # an info file or the root schemata (a line per domain)
MOUNTS_MAX_READ = 1 << 22  # /proc/mounts of a node with many container mounts
SYSFS_MAX_READ = 1 << 12  # a sysfs attribute is at most a page


def find_mount(procfs: str) -> MountInfo | None:
    """The resctrl mount from <procfs>/mounts (pass the host's /proc), or None."""
    try:
        return parse_mounts(read_text(os.path.join(procfs, "mounts"), MOUNTS_MAX_READ, "mount table"))
    except OSError:
        return None


def open_tree(mount: MountInfo, verify_fs: bool | None = None) -> SafeTree:
    """The mount as a SafeTree (no symlinks, no mount crossings), with the statfs check decided:

    - True: every opened file must be on resctrl (RDTGROUP_SUPER_MAGIC); False: never checked;
    - None (auto): checked when the filesystem at the mount path is resctrl. When the mount table
      names resctrl there (`fstype`) but another filesystem is found, the only one accepted
      (unchecked) is FUSE, the emulator tests/resctrl/emulator mounts; anything else (a tmpfs, a
      mis-set hostPath) is refused with UnsafePath. A mount given directly (captured trees in
      tests, fstype "") is read unchecked.
    """
    if verify_fs is not None:
        return SafeTree(mount.path, magic=RDTGROUP_SUPER_MAGIC if verify_fs else None)
    try:
        found = fs_magic(mount.path)
    except OSError as e:
        raise FeatureUnavailable("resctrl", f"cannot statfs {mount.path}: {e.strerror}") from None
    if found == RDTGROUP_SUPER_MAGIC:
        return SafeTree(mount.path, magic=RDTGROUP_SUPER_MAGIC)
    if mount.fstype == "resctrl" and found != FUSE_SUPER_MAGIC:
        raise UnsafePath(mount.path, f"the mount table names resctrl here, but it is a {magic_name(found)} filesystem")
    return SafeTree(mount.path)


def read_info(mount: MountInfo, *, verify_fs: bool | None = None) -> ResctrlInfo:
    """Read info/, the root schemata and mon_data; FeatureUnavailable when it is not resctrl."""
    try:
        tree = open_tree(mount, verify_fs)
        dirs = tree.subdirs("info")
    except UnsafePath as e:
        raise FeatureUnavailable("resctrl", str(e)) from None
    except OSError as e:
        raise FeatureUnavailable("resctrl", f"cannot read {tree.path('info')}: {e.strerror}") from None
    files = {d: _read_dir(tree, f"info/{d}") for d in dirs}
    root = _read(tree, "schemata") if tree.exists("schemata") else ""
    mon_dirs = tree.subdirs("mon_data") if tree.isdir("mon_data") else []
    return build_info(mount, files, root, mon_dirs)


def _read(tree: SafeTree, rel: str) -> str:
    try:
        return tree.read(rel, INFO_MAX_READ).decode(errors="replace")
    except OverflowError:
        raise ParseError("resctrl file", tree.path(rel), f"larger than {INFO_MAX_READ} bytes") from None
    except UnsafePath as e:
        raise FeatureUnavailable("resctrl", str(e)) from None


def _read_dir(tree: SafeTree, rel: str) -> dict[str, str]:
    """Every regular file of one info directory (symlinks are not files here)."""
    out = {}
    fd = tree.open(rel, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with os.scandir(fd) as it:
            names = [e.name for e in it if e.is_file(follow_symlinks=False)]
    finally:
        os.close(fd)
    for name in names:
        try:
            out[name] = _read(tree, f"{rel}/{name}")
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
        level, ident = (int(read_text(os.path.join(path, n), SYSFS_MAX_READ, "cache attribute")) for n in ("level", "id"))
        kind = read_text(os.path.join(path, "type"), SYSFS_MAX_READ, "cache attribute").strip()
        size = parse_size(read_text(os.path.join(path, "size"), SYSFS_MAX_READ, "cache attribute"))
    except (OSError, ValueError):
        return None
    if kind not in ("Unified", "Data") or (level == 1 and kind != "Data"):
        return None
    return (level, ident), size


_SIZE = re.compile(r"^(\d+)([KMG]?)$")


def parse_size(text: str) -> int:
    """sysfs cache size: "20480K", "1024K", "32M"; ParseError for anything else ("" included)."""
    m = _SIZE.match(text.strip().upper())
    if m is None:
        raise ParseError("cache size", text[:40], "expected digits with an optional K, M or G suffix")
    return int(m[1]) * {"": 1, "K": 1024, "M": 1024 ** 2, "G": 1024 ** 3}[m[2]]
