"""Make bcc work on a node whose kernel headers do not match, the way a DaemonSet must.

bcc compiles BPF C at load time and needs kernel headers. Production nodes rarely have headers
for the exact running kernel, and a DaemonSet sees the host only through mounts. Our programs use
tracepoint fields and helpers only (never kernel struct layouts), so any reasonably close header
tree compiles them; what matters is the *running* kernel's features, checked here as minimum
versions ("at least X", not "exactly X") and by looking for the tracepoints in tracefs.

Header search order (first hit wins, never silently none):
1. the host's `<modules>/<release>/build` (+ `source` when separate),
2. the nearest packaged headers under the search dirs (`linux-headers-*`, `kernels/*`); Debian
   splits a release into `-<flavour>` and `-common`: both are merged by symlinks into a private
   tree under `<run_dir>/kheaders/<release>`,
3. `<sysfs>/kernel/kheaders.tar.xz` (CONFIG_IKHEADERS) extracted into the run dir.
If none exists, `FeatureUnavailable` says what was searched.
"""

from __future__ import annotations

import ctypes
import logging
import os
import re
import sys
import tarfile
import tempfile
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal

from perfbalance.errors import FeatureUnavailable, ParseError, PerfbalanceError
from perfbalance.host import HostPaths
from perfbalance.safefs import read_bounded

log = logging.getLogger(__name__)

HeaderSource = Literal["host", "packaged", "kheaders"]


@dataclass(frozen=True, kw_only=True, order=True)
class KernelVersion:
    major: int
    minor: int
    patch: int = 0

    def __str__(self) -> str:
        return f"{self.major}.{self.minor}.{self.patch}"


@dataclass(frozen=True, kw_only=True)
class Headers:
    path: str  # what BCC_KERNEL_SOURCE points at
    source: HeaderSource
    release: str  # the release the headers were built for (may differ from the running one)
    parts: tuple[str, ...] = ()  # the directories merged into `path`

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "source": self.source, "release": self.release,
                "parts": list(self.parts)}


@dataclass(frozen=True, kw_only=True)
class Requirement:
    feature: str
    minimum: KernelVersion
    used_for: str


# Minimum kernel versions of what our programs use (kernel git history / bcc docs/kernel-versions.md).
REQUIREMENTS: tuple[Requirement, ...] = (
    Requirement(feature="tracepoint programs", minimum=KernelVersion(major=4, minor=7), used_for="all programs"),
    Requirement(feature="bpf_perf_event_read_value", minimum=KernelVersion(major=4, minor=15), used_for="PMU attribution"),
    Requirement(feature="bpf_get_current_cgroup_id", minimum=KernelVersion(major=4, minor=18), used_for="cgroup keys (else per-pid keys)"),
    Requirement(feature="BPF_MAP_LOOKUP_BATCH", minimum=KernelVersion(major=5, minor=6), used_for="batched map reads (else iteration)"),
    Requirement(feature="BPF_ENABLE_STATS", minimum=KernelVersion(major=5, minor=8), used_for="bench: ns per event"),
)

# Tracepoints the programs attach to: (category, event) -> the program that needs it.
TRACEPOINTS: dict[tuple[str, str], str] = {
    ("x86_fpu", "x86_fpu_regs_deactivated"): "avx512",
    ("sched", "sched_switch"): "pmu",
}

_RELEASE = re.compile(r"^(\d+)\.(\d+)(?:\.(\d+))?")
_PKG = re.compile(r"^linux-headers-(\d+)\.(\d+)(?:\.(\d+))?(?:-(.*))?$")


def parse_release(text: str) -> KernelVersion:
    """`6.18.44-fc-v595` -> 6.18.44."""
    m = _RELEASE.match(text.strip())
    if not m:
        raise ParseError("kernel release", text, "expected MAJOR.MINOR[.PATCH][-suffix]")
    return KernelVersion(major=int(m[1]), minor=int(m[2]), patch=int(m[3] or 0))


def check_kernel(version: KernelVersion) -> dict[str, dict[str, Any]]:
    """Each requirement: whether the running kernel is at least its minimum."""
    return {r.feature: {"ok": version >= r.minimum, "minimum": f">= {r.minimum.major}.{r.minimum.minor}",
                        "used_for": r.used_for} for r in REQUIREMENTS}


def kernel_ok(version: KernelVersion, feature: str) -> bool:
    return any(r.feature == feature and version >= r.minimum for r in REQUIREMENTS)


# Bounds of every host file read here (a corrupt or hostile file is an error, not a memory spike).
OSRELEASE_MAX_BYTES = 256  # /proc/sys/kernel/osrelease: __NEW_UTS_LEN is 64
MARKER_MAX_BYTES = 64 << 10  # our merged-headers marker: a few absolute paths
PROC_CGROUP_MAX_BYTES = 64 << 10  # /proc/<pid>/cgroup: one line per hierarchy
FDINFO_MAX_BYTES = 64 << 10  # /proc/self/fdinfo/<fd> of a BPF program: a dozen lines


def read_small(path: str, limit: int, what: str) -> str:
    """A whole host file of at most `limit` bytes; ParseError naming it beyond, OSError as is."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        raw = read_bounded(fd, limit, path)
    except OverflowError:
        raise ParseError(what, path, f"larger than {limit} bytes") from None
    finally:
        os.close(fd)
    return raw.decode("utf-8", errors="replace")


def running_release(host: HostPaths) -> str:
    """The running kernel's release (from procfs, so a container sees the host's)."""
    try:
        return read_small(os.path.join(host.procfs, "sys/kernel/osrelease"), OSRELEASE_MAX_BYTES,
                          "kernel release file").strip()
    except OSError:
        return os.uname().release


# --- headers -----------------------------------------------------------------------------------


def _is_tree(path: str) -> bool:
    return os.path.isdir(os.path.join(path, "include")) or os.path.isdir(os.path.join(path, "arch"))


def _has_linux_headers(path: str) -> bool:
    return os.path.isdir(os.path.join(path, "include", "linux"))


def host_headers(modules_root: str, release: str) -> tuple[str, ...] | None:
    """The host's build (and separate source) directories for exactly this release, if present."""
    build = os.path.join(modules_root, release, "build")
    source = os.path.join(modules_root, release, "source")
    if not _is_tree(build):
        return None
    if _is_tree(source) and os.path.realpath(source) != os.path.realpath(build):
        return (os.path.realpath(build), os.path.realpath(source))
    return (os.path.realpath(build),)


@dataclass(frozen=True, kw_only=True)
class Candidate:
    version: KernelVersion
    release: str
    parts: tuple[str, ...]  # arch/flavour tree first, then the shared (-common) tree


def packaged_candidates(names: Iterable[str], base: str) -> list[Candidate]:
    """Header packages among directory `names` of `base` (pure apart from the isdir checks)."""
    names = sorted(set(names))
    out: list[Candidate] = []
    for name in names:
        m = _PKG.match(name)
        if not m or (m[4] or "").endswith("common"):
            continue
        version = KernelVersion(major=int(m[1]), minor=int(m[2]), patch=int(m[3] or 0))
        release = name.removeprefix("linux-headers-")
        path = os.path.join(base, name)
        parts = [path]
        if not _has_linux_headers(path):
            partner = _common_partner(name, names)
            if partner is None:
                continue
            parts.append(os.path.join(base, partner))
        out.append(Candidate(version=version, release=release, parts=tuple(parts)))
    return out


def _common_partner(name: str, names: Sequence[str]) -> str | None:
    """Debian: linux-headers-6.1.0-57-amd64 + linux-headers-6.1.0-57-common; Ubuntu: ... + linux-headers-5.15.0-91."""
    stem = name.rsplit("-", 1)[0] if name.count("-") > 2 else name
    for partner in (f"{stem}-common", stem):
        if partner != name and partner in names:
            return partner
    return None


def nearest(candidates: Sequence[Candidate], running: KernelVersion) -> Candidate | None:
    """The closest version; ties go to the newer one (not older than needed is better)."""
    def distance(c: Candidate) -> tuple[int, int, int, int]:
        v = c.version
        return (abs(v.major - running.major), abs(v.minor - running.minor),
                abs(v.patch - running.patch), -(v.major * 1000 + v.minor))
    return min(candidates, key=distance, default=None)


def merge_trees(parts: Sequence[str], dest: str) -> str:
    """Symlink-merge directories into `dest`: earlier parts win, shared subdirectories recurse.

    A marker file records the parts; a matching tree is reused. A new tree is built beside
    `dest` and renamed into place, so concurrent agents (or tests) never see a half-built tree.
    """
    marker = "\n".join(os.path.realpath(p) for p in parts) + "\n"
    if _read_marker(dest) == marker:
        return dest
    tmp = f"{dest}.tmp.{os.getpid()}"
    _remove_tree(tmp)
    os.makedirs(tmp)
    _merge_into(list(parts), tmp)
    with open(os.path.join(tmp, MARKER), "w") as f:
        f.write(marker)
    _remove_tree(dest)
    try:
        os.rename(tmp, dest)
    except OSError:  # another process won the race with the same inputs
        _remove_tree(tmp)
    return dest


MARKER = ".perfbalance-parts"


def _read_marker(dest: str) -> str | None:
    try:
        return read_small(os.path.join(dest, MARKER), MARKER_MAX_BYTES, "merged headers marker")
    except (OSError, ParseError):
        return None  # absent, or not one of ours: the tree is rebuilt


def _merge_into(parts: list[str], dest: str) -> None:
    entries: dict[str, list[str]] = {}
    for part in parts:
        try:
            for name in sorted(os.listdir(part)):
                entries.setdefault(name, []).append(os.path.join(part, name))
        except OSError:
            continue
    for name, sources in entries.items():
        dirs = [s for s in sources if os.path.isdir(s)]
        if len(dirs) > 1:
            os.mkdir(os.path.join(dest, name))
            _merge_into(dirs, os.path.join(dest, name))
        else:
            os.symlink(os.path.realpath(sources[0]), os.path.join(dest, name))


def _remove_tree(path: str) -> None:
    """Remove a merged tree: only symlinks and the directories holding them (never follows links)."""
    if os.path.islink(path) or not os.path.isdir(path):
        if os.path.lexists(path):
            os.unlink(path)
        return
    for entry in os.scandir(path):
        if entry.is_dir(follow_symlinks=False):
            _remove_tree(entry.path)
        else:
            os.unlink(entry.path)
    os.rmdir(path)


def extract_kheaders(archive: str, dest: str) -> str:
    """Extract the kernel's own kheaders.tar.xz; members that would land outside `dest` are refused."""
    _remove_tree(dest)
    os.makedirs(dest, exist_ok=True)
    with tarfile.open(archive, "r:xz") as tar:
        members = tar.getmembers()
        for m in members:
            _check_member(m, archive)
        tar.extractall(dest, members=members)
    return dest


def _check_member(m: tarfile.TarInfo, archive: str) -> None:
    name = os.path.normpath(m.name)
    bad = (os.path.isabs(name) or name.startswith("..") or m.isdev()
           or ((m.issym() or m.islnk()) and (os.path.isabs(m.linkname) or
               os.path.normpath(os.path.join(os.path.dirname(name), m.linkname)).startswith(".."))))
    if bad:
        raise FeatureUnavailable("bpf", f"{archive}: refusing member {m.name!r} (escapes the target)")


def find_headers(host: HostPaths, release: str) -> Headers:
    """Headers for `release` in the documented order; FeatureUnavailable says what was searched."""
    private = os.path.join(host.run_dir, "kheaders", release)
    found = host_headers(host.modules, release)
    if found is not None:
        path = found[0] if len(found) == 1 else merge_trees(found, private)
        return Headers(path=path, source="host", release=release, parts=found)
    candidates = [c for d in host.headers_search for c in _scan(d)]
    best = nearest(candidates, parse_release(release))
    if best is not None:
        path = merge_trees(best.parts, private) if len(best.parts) > 1 else best.parts[0]
        return Headers(path=path, source="packaged", release=best.release, parts=best.parts)
    archive = os.path.join(host.sysfs, "kernel", "kheaders.tar.xz")
    if os.path.exists(archive):
        path = extract_kheaders(archive, private)
        return Headers(path=path, source="kheaders", release=release, parts=(archive,))
    raise FeatureUnavailable("bpf", (
        f"no kernel headers for {release}: none at {os.path.join(host.modules, release, 'build')}, "
        f"no linux-headers-* under {', '.join(host.headers_search) or '(no search dirs)'}, "
        f"no {archive} (try `modprobe kheaders`)"))


def _scan(base: str) -> list[Candidate]:
    try:
        names = os.listdir(base)
    except OSError:
        return []
    out = packaged_candidates(names, base)
    kernels = os.path.join(base, "kernels")  # RHEL/Fedora: /usr/src/kernels/<release>/
    if os.path.isdir(kernels):
        for name in sorted(os.listdir(kernels)):
            path = os.path.join(kernels, name)
            try:
                version = parse_release(name)
            except ParseError:
                continue
            if _has_linux_headers(path):
                out.append(Candidate(version=version, release=name, parts=(path,)))
    return out


# --- tracefs -----------------------------------------------------------------------------------


def tracefs_mounted(tracefs: str) -> bool:
    return os.path.isdir(os.path.join(tracefs, "events"))


def ensure_tracefs(tracefs: str, *, mount: bool = True) -> None:
    """Mount tracefs at `tracefs` when its events are not visible (needs CAP_SYS_ADMIN)."""
    if tracefs_mounted(tracefs) or not mount:
        if not tracefs_mounted(tracefs):
            raise FeatureUnavailable("bpf", f"tracefs not mounted at {tracefs}")
        return
    libc = ctypes.CDLL(None, use_errno=True)
    rc = libc.mount(b"nodev", tracefs.encode(), b"tracefs", ctypes.c_ulong(0), None)
    if rc != 0 or not tracefs_mounted(tracefs):
        err = ctypes.get_errno()
        raise FeatureUnavailable("bpf", f"tracefs not mounted at {tracefs} and mount failed: {os.strerror(err)}")
    log.info("mounted tracefs at %s", tracefs)


def tracepoint_exists(tracefs: str, category: str, event: str) -> bool:
    return os.path.isfile(os.path.join(tracefs, "events", category, event, "format"))


def tracepoints(tracefs: str) -> dict[str, bool]:
    return {f"{c}/{e}": tracepoint_exists(tracefs, c, e) for (c, e) in TRACEPOINTS}


# --- preparing and loading ---------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class BpfEnv:
    """What `prepare()` found: a compile environment for bcc on this host."""

    release: str
    version: KernelVersion
    headers: Headers
    bcc_version: str
    cgroup_keys: bool  # bpf_get_current_cgroup_id usable (and a v2 hierarchy exists)
    batch_reads: bool

    def load(self, text: str, cflags: Sequence[str] = ()) -> Any:
        """Compile and load BPF C with bcc; FeatureUnavailable quoting why it failed.

        bcc's exception says only "Failed to compile BPF module" or "Failed to load BPF program
        ...: Permission denied"; clang's diagnostics and the verifier log go to fd 2 from C++.
        That output is captured while bcc runs (then written to stderr unchanged), and the line
        that says why (clang's first `error:`, or the verifier's complaint) joins the reason.
        """
        bcc = _import_bcc()
        os.environ["BCC_KERNEL_SOURCE"] = self.headers.path
        error: Exception | None = None
        with _fd2_captured() as log:
            try:
                prog = bcc.BPF(text=text.encode(), cflags=list(cflags))
            except Exception as e:  # bcc raises bare Exception for compile/load/attach failures
                error = e
        if error is None:
            return prog
        why = load_error_line(log.text)
        raise FeatureUnavailable("bpf", f"bcc could not load the program: {_first_line(error)}"
                                        + (f": {why}" if why else ""))


LOAD_LOG_MAX_BYTES = 1 << 20  # what clang and the verifier print while bcc loads (kept from the start)


class _Captured:
    text = ""


@contextmanager
def _fd2_captured() -> Iterator[_Captured]:
    """Point fd 2 at a temporary file for the block; afterwards restore it, echo what was
    written (bounded) and keep it as `.text`. Only around program loads, at collector start."""
    out = _Captured()
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            yield out
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            data = tmp.read(LOAD_LOG_MAX_BYTES)
            if data:
                os.write(2, data)
            out.text = data.decode("utf-8", errors="replace")


_VERIFIER_END = re.compile(r"^processed \d+ insns")


def load_error_line(log: str) -> str:
    """The line of a bcc load log that says why: clang's first error, else the verifier's last
    complaint (the line before its "processed N insns" summary), else ""."""
    lines = [line.strip() for line in log.splitlines()]
    for line in lines:
        if ": error: " in line or line.startswith("error: "):
            return line[:300]
    for prev, line in zip(lines, lines[1:]):
        if _VERIFIER_END.match(line) and prev:
            return f"verifier: {prev[:300]}"
    return ""


def _import_bcc() -> Any:
    try:
        import bcc  # noqa: PLC0415 (optional dependency, imported where used)
    except ImportError as e:
        raise FeatureUnavailable("bpf", f"bcc is not importable ({e})") from None
    return bcc


def _first_line(e: BaseException) -> str:
    text = str(e).strip() or type(e).__name__
    return text.splitlines()[0][:300]


def bcc_version() -> str:
    try:
        return str(getattr(_import_bcc(), "__version__", "unknown"))
    except FeatureUnavailable:
        return ""


def prepare(host: HostPaths, *, mount_tracefs: bool = True, need: Sequence[str] = ()) -> BpfEnv:
    """Everything bcc needs, or FeatureUnavailable with the reason. `need`: tracepoint programs."""
    if not bcc_version():
        _import_bcc()
    release = running_release(host)
    version = parse_release(release)
    if not kernel_ok(version, "tracepoint programs"):
        raise FeatureUnavailable("bpf", f"kernel {release} is older than 4.7 (no BPF tracepoint programs)")
    ensure_tracefs(host.tracefs, mount=mount_tracefs)
    for (category, event), program in TRACEPOINTS.items():
        if program in need and not tracepoint_exists(host.tracefs, category, event):
            raise FeatureUnavailable("bpf", f"tracepoint {category}/{event} not in {host.tracefs}/events")
    headers = find_headers(host, release)
    return BpfEnv(release=release, version=version, headers=headers, bcc_version=bcc_version(),
                  cgroup_keys=kernel_ok(version, "bpf_get_current_cgroup_id") and _has_v2(host),
                  batch_reads=kernel_ok(version, "BPF_MAP_LOOKUP_BATCH"))


def _has_v2(host: HostPaths) -> bool:
    """A cgroup v2 hierarchy exists (pure v2 at the root, or hybrid's unified/)."""
    return any(os.path.isfile(os.path.join(host.cgroup, sub, "cgroup.controllers"))
               for sub in ("", "unified"))


def probe(host: HostPaths, *, mount_tracefs: bool = False) -> dict[str, Any]:
    """What `perfbalance doctor` shows about BPF on this node. Never raises."""
    try:
        release = running_release(host)
    except ParseError as e:
        release = f"unreadable ({e})"
    out: dict[str, Any] = {"available": False, "reason": "", "bcc_version": bcc_version(),
                           "kernel": {"release": release}, "tracefs": host.tracefs}
    try:
        version = parse_release(release)
        out["kernel"]["requirements"] = check_kernel(version)
        out["tracepoints"] = tracepoints(host.tracefs) if tracefs_mounted(host.tracefs) else {}
        env = prepare(host, mount_tracefs=mount_tracefs)
        out["headers"] = env.headers.to_json()
        out["cgroup_keys"] = env.cgroup_keys
        out["batch_reads"] = env.batch_reads
        out["tracepoints"] = tracepoints(host.tracefs)
        out["available"] = True
        out["reason"] = f"bcc {out['bcc_version']} with {env.headers.source} headers {env.headers.release}"
    except (FeatureUnavailable, ParseError, OSError) as e:
        out["reason"] = getattr(e, "reason", str(e))
    from collectors.perf import probe_events  # noqa: PLC0415 (perf imports this module)
    out["perf_events"] = probe_events()
    return out


# --- reading maps without destroying them -------------------------------------------------------


def read_table(table: Any, *, batch: bool, fields: Sequence[str]) -> dict[int, tuple[int, ...]]:
    """All entries of a bcc hash map as key -> flat tuple of `fields` (array fields flattened).

    One BPF_MAP_LOOKUP_BATCH syscall per 64k entries where the kernel has it (5.6+), else
    key-by-key iteration. Never deletes: rates are deltas against our previous read.
    """
    items: Iterable[tuple[Any, Any]]
    if batch:
        try:
            items = list(table.items_lookup_batch())
        except Exception:  # bcc raises bare Exception; EINVAL on kernels without batch ops
            items = list(table.items())
    else:
        items = list(table.items())
    return {int(getattr(k, "value", k)): _flatten(v, fields) for k, v in items}


def _flatten(value: Any, fields: Sequence[str]) -> tuple[int, ...]:
    out: list[int] = []
    for f in fields:
        v = getattr(value, f)
        if isinstance(v, int):
            out.append(v)
        else:
            out.extend(int(x) for x in v)
    return tuple(out)


class DeltaTable:
    """Deltas of cumulative per-key counters between two reads of a map.

    A key seen for the first time contributes everything it counted (it did not exist at the
    previous read, or the program was just loaded); a counter that went backwards (the entry was
    deleted and re-created) restarts from zero; keys that left the map are forgotten, so the
    table never outgrows the map.
    """

    def __init__(self) -> None:
        self._prev: dict[int, tuple[int, ...]] = {}

    def update(self, current: Mapping[int, tuple[int, ...]]) -> dict[int, tuple[int, ...]]:
        deltas: dict[int, tuple[int, ...]] = {}
        for key, cur in current.items():
            prev = self._prev.get(key)
            if prev is None or len(prev) != len(cur) or any(c < p for c, p in zip(cur, prev)):
                deltas[key] = cur
            elif cur != prev:
                deltas[key] = tuple(c - p for c, p in zip(cur, prev))
        self._prev = dict(current)
        return deltas

    def __len__(self) -> int:
        return len(self._prev)

    def keys(self) -> list[int]:
        return list(self._prev)

    def forget(self, keys: Iterable[int]) -> None:
        """Drop rows of keys deleted from the map (the table never holds a key the map lost)."""
        for k in keys:
            self._prev.pop(k, None)


# --- which map keys belong to which container ---------------------------------------------------


class KeyMap:
    """Map keys (v2 cgroup ids, or process ids on v1-only hosts) -> (container id, path).

    A container's cgroup id covers its descendants too (crun's `container/` child, CRI-O's
    `exec`): one stat plus one getdents per directory, since readdir returns each child's
    inode, which is its cgroup id. In pid mode, keys are the processes listed in the container's
    cgroups; map keys not found that way are looked up in /proc/<pid>/cgroup. `path` is what
    must exist for the key to be alive (the cgroup directory, or /proc/<pid>).
    """

    def __init__(self, cgroupfs: Any, *, pid_keys: bool, procfs: str = "/proc", max_depth: int = 4,
                 refresh_cycles: int = 10) -> None:
        self.cgroupfs, self.pid_keys, self.procfs, self.max_depth = cgroupfs, pid_keys, procfs, max_depth
        self.refresh_cycles = max(1, refresh_cycles)
        self._cycle = 0
        self._cache: dict[str, tuple[int, list[tuple[int, str]]]] = {}  # rel -> (expiry cycle, keys)

    def build(self, containers: Sequence[Any], map_keys: Iterable[int] = ()) -> dict[int, tuple[str, str]]:
        self._cycle += 1
        out: dict[int, tuple[str, str]] = {}
        for c in containers:
            try:
                keys = self._pids(c.cgroup) if self.pid_keys else self._cached_ids(c.cgroup)
            except (OSError, PerfbalanceError):
                continue  # vanished between discovery and now: normal churn
            for k, path in keys:
                out.setdefault(k, (c.id, path))
        live = {c.cgroup for c in containers}
        for rel in [r for r in self._cache if r not in live]:
            del self._cache[rel]
        if self.pid_keys:
            by_cgroup = {c.cgroup.strip("/"): c.id for c in containers}
            for k in map_keys:
                try:
                    cid = None if k in out else container_of_pid(self.procfs, k, by_cgroup)
                except ParseError:
                    continue  # a /proc/<pid>/cgroup beyond its bound: not attributable
                if cid:
                    out[k] = (cid, os.path.join(self.procfs, str(k)))
        return out

    def _cached_ids(self, rel: str) -> list[tuple[int, str]]:
        """Cgroup ids change only when a cgroup is re-created; re-walk each container every
        `refresh_cycles` cycles, staggered so that the cost spreads over cycles."""
        hit = self._cache.get(rel)
        if hit is not None and hit[0] > self._cycle:
            return hit[1]
        keys = self._ids(rel)
        stagger = 0 if hit is not None else hash(rel) % self.refresh_cycles
        self._cache[rel] = (self._cycle + self.refresh_cycles - stagger, keys)
        return keys

    def _ids(self, rel: str) -> list[tuple[int, str]]:
        top = self.cgroupfs.dir(rel, None)
        out = [(os.stat(top).st_ino, top)]
        stack = [(top, 0)]
        while stack:
            path, depth = stack.pop()
            if depth >= self.max_depth:
                continue
            with os.scandir(path) as it:
                for e in it:
                    if e.is_dir(follow_symlinks=False):
                        out.append((e.inode(), e.path))
                        stack.append((e.path, depth + 1))
        return out

    def _pids(self, rel: str) -> list[tuple[int, str]]:
        return [(pid, os.path.join(self.procfs, str(pid))) for pid in self.cgroupfs.pids(rel, recursive=True)]


def stale_keys(before: Mapping[int, tuple[str, str]], now: Mapping[int, tuple[str, str]]) -> list[int]:
    """Keys that belonged to a container last cycle and whose cgroup (or process) is gone."""
    return [k for k, (_, path) in before.items() if k not in now and not os.path.exists(path)]


# A sweep of what is alive starts every SWEEP_PERIOD_CYCLES cycles and visits at most
# SWEEP_BUDGET cgroups per cycle (about 6 us each on kernfs: one fstatat per child directory, plus
# an open and a getdents for the few that have children), so a node with 3000 cgroups costs one
# ~20 ms cycle in five, and a larger one spreads its sweep over several cycles.
SWEEP_PERIOD_CYCLES = 5
SWEEP_BUDGET = 2000


class LiveKeys:
    """Which map keys still name something that exists: a bounded, resumable sweep.

    Keys are v2 cgroup ids (the directory's inode, which readdir returns for free) or, in pid
    mode, process ids (one listing of procfs). A sweep takes the map's keys at its start as
    candidates and reports those it did not find alive when it ends. That is exact, not a
    heuristic: cgroup ids are never reused, and a cgroup alive from the start to the end of the
    sweep is always seen, because its ancestors cannot be removed while it exists, and a
    directory is descended into whenever its link count says it has subdirectories (kernfs keeps
    st_nlink = 2 + subdirectories; other filesystems' 1 or >2 are descended too). Live cgroups
    that no container owns (system services, pods created and removed between two discoveries)
    are thereby told apart from dead ones without being deleted and re-inserted every cycle.
    """

    def __init__(self, cgroupfs: Any, *, pid_keys: bool, procfs: str = "/proc",
                 period: int = SWEEP_PERIOD_CYCLES, budget: int = SWEEP_BUDGET) -> None:
        self.cgroupfs, self.pid_keys, self.procfs = cgroupfs, pid_keys, procfs
        self.period, self.budget = max(1, period), max(1, budget)
        self.sweeps = 0  # completed sweeps (for tests and `bench collect`)
        self._cycle = 0
        self._last_start: int | None = None
        self._running = False
        self._candidates: set[int] = set()
        self._seen: set[int] = set()
        self._stack: list[str] = []

    def step(self, keys: Iterable[int]) -> set[int]:
        """One cycle: start a sweep when due, advance it by at most `budget` cgroups, and when it
        completes return the candidates it did not find alive (else an empty set)."""
        self._cycle += 1
        if not self._running:
            if self._last_start is not None and self._cycle - self._last_start < self.period:
                return set()
            try:
                self._begin(keys)
            except (OSError, PerfbalanceError):
                self._running = False  # no v2 root or procfs this cycle: try again next period
                return set()
        if not self._advance():
            return set()
        dead = self._candidates - self._seen
        self._running, self._candidates, self._seen = False, set(), set()
        self.sweeps += 1
        return dead

    def _begin(self, keys: Iterable[int]) -> None:
        self._running, self._last_start = True, self._cycle
        self._candidates, self._seen = set(keys), set()
        if self.pid_keys:
            self._seen = {int(n) for n in os.listdir(self.procfs) if n.isdigit()}
            self._stack = []
            return
        root_fd = self.cgroupfs.open_dir("", None)
        try:
            self._seen.add(os.fstat(root_fd).st_ino)
        finally:
            os.close(root_fd)
        self._stack = [""]

    def _advance(self) -> bool:
        """Visit cgroups until the budget is spent; True when the sweep is complete."""
        visited = 0
        while self._stack and visited < self.budget:
            visited += self._visit(self._stack.pop())
        return not self._stack

    def _visit(self, rel: str) -> int:
        """Record the children of one v2 cgroup; queue those with children of their own."""
        try:
            fd = self.cgroupfs.open_dir(rel, None)
        except (OSError, PerfbalanceError):
            return 1  # removed meanwhile (its whole subtree is gone too), or refused
        n = 0
        try:
            with os.scandir(fd) as it:
                for e in it:
                    if not e.is_dir(follow_symlinks=False):
                        continue
                    n += 1
                    self._seen.add(e.inode())
                    if _may_have_subdirs(e):
                        self._stack.append(f"{rel}/{e.name}" if rel else e.name)
        except OSError:
            pass  # removed while listing: what was listed is still valid
        finally:
            os.close(fd)
        return max(n, 1)


def _may_have_subdirs(e: os.DirEntry[str]) -> bool:
    try:
        return e.stat(follow_symlinks=False).st_nlink != 2
    except OSError:
        return False  # removed since readdir


class CountingMap:
    """A BPF hash of cumulative counters, read non-destructively into per-key deltas."""

    def __init__(self, table: Any, *, fields: Sequence[str], batch: bool, max_keys: int,
                 live: LiveKeys | None = None) -> None:
        self.table, self.fields, self.batch, self.max_keys = table, tuple(fields), batch, max_keys
        self.live = live
        self._delta = DeltaTable()
        self.size = 0

    def deltas(self) -> dict[int, tuple[int, ...]]:
        rows = read_table(self.table, batch=self.batch, fields=self.fields)
        self.size = len(rows)
        return self._delta.update(rows)

    @property
    def nearly_full(self) -> bool:
        return self.size >= 0.8 * self.max_keys

    @property
    def rows(self) -> int:
        """Rows of the Python-side delta table (mirrors the map as of the last read and deletes)."""
        return len(self._delta)

    def delete(self, keys: Iterable[int]) -> int:
        """Delete entries (of vanished cgroups/processes) and our rows of them."""
        keys = list(keys)
        n = 0
        for k in keys:
            try:
                del self.table[self.table.Key(k)]
                n += 1
            except (KeyError, OSError):
                continue
        self._delta.forget(keys)
        self.size = max(0, self.size - n)
        return n

    def prune(self, before: Mapping[int, tuple[str, str]], now: Mapping[int, tuple[str, str]]) -> int:
        """Drop entries of vanished containers at once, entries of any other cgroup (or process)
        that no longer exists when a sweep of what is alive completes (LiveKeys), and, as a last
        resort when the map is nearly full, every entry no container owns."""
        doomed = set(stale_keys(before, now))
        if self.live is not None:
            doomed |= self.live.step(self._delta.keys())
        if self.nearly_full:
            doomed |= {k for k in self._delta.keys() if k not in now}
        return self.delete(doomed)


def parse_proc_cgroup(text: str) -> dict[str, str]:
    """/proc/<pid>/cgroup: controller (or "" for v2, "name=systemd") -> path."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        for ctrl in parts[1].split(",") if parts[1] else [""]:
            out[ctrl] = parts[2]
    return out


def container_of_pid(procfs: str, pid: int, by_cgroup: Mapping[str, str]) -> str | None:
    """The container whose cgroup (or an ancestor of the process's cgroup) matches, via /proc."""
    try:
        text = read_small(os.path.join(procfs, str(pid), "cgroup"), PROC_CGROUP_MAX_BYTES, "process cgroup file")
    except OSError:
        return None
    paths = parse_proc_cgroup(text)
    for path in paths.values():
        rel = path.strip("/")
        while rel:
            if rel in by_cgroup:
                return by_cgroup[rel]
            rel = rel.rpartition("/")[0]
    return None


class LogOnce:
    """Log each distinct message of a collector once (cadvisor logs missing features once)."""

    def __init__(self, logger: logging.Logger) -> None:
        self.logger = logger
        self._seen: set[str] = set()

    def warning(self, msg: str) -> None:
        if msg not in self._seen:
            self._seen.add(msg)
            self.logger.warning("%s", msg)


def bpf_stats_enable(procfs: str = "/proc") -> int:
    """BPF_ENABLE_STATS (5.8+): run_time_ns/run_cnt counted while the returned fd is open.

    Returns -1 when the kernel refuses; callers may then fall back to kernel.bpf_stats_enabled.
    """
    del procfs
    BPF_ENABLE_STATS, BPF_STATS_RUN_TIME = 32, 0
    attr = (ctypes.c_uint8 * 128)()
    ctypes.c_uint32.from_buffer(attr, 0).value = BPF_STATS_RUN_TIME
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    fd = libc.syscall(321 if os.uname().machine == "x86_64" else 280, BPF_ENABLE_STATS,
                      ctypes.byref(attr), ctypes.c_uint(ctypes.sizeof(attr)))
    return int(fd)


def parse_fdinfo(text: str) -> dict[str, str]:
    """/proc/<pid>/fdinfo/<fd> of a BPF program: prog_id, run_time_ns, run_cnt, ..."""
    out = {}
    for line in text.splitlines():
        k, sep, v = line.partition(":")
        if sep:
            out[k.strip()] = v.strip()
    return out


def prog_stats(procfs: str, fd: int) -> tuple[int, int]:
    """(run_time_ns, run_cnt) of a loaded program of this process."""
    info = parse_fdinfo(read_small(os.path.join(procfs, "self", "fdinfo", str(fd)), FDINFO_MAX_BYTES,
                                   "BPF program fdinfo"))
    return int(info.get("run_time_ns", 0)), int(info.get("run_cnt", 0))
