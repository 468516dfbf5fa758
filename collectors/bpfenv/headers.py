"""Kernel headers for bcc on a node whose headers do not match the running kernel.

bcc compiles BPF C at load time and needs kernel headers. Production nodes rarely have headers
for the exact running kernel, and a DaemonSet sees the host only through mounts. Our programs use
tracepoint fields and helpers only, so any reasonably close header tree compiles them.

Header search order (first hit wins, never silently none):
1. the host's `<modules>/<release>/build` (+ `source` when separate),
2. the nearest packaged headers under the search dirs (`linux-headers-*`, `kernels/*`); Debian
   splits a release into `-<flavour>` and `-common`: both are merged by symlinks into a private
   tree under `<run_dir>/kheaders/<release>`,
3. `<sysfs>/kernel/kheaders.tar.xz` (CONFIG_IKHEADERS) extracted into the run dir.
If none exists, `FeatureUnavailable` says what was searched.
"""

from __future__ import annotations

import os
import re
import tarfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from collectors.bpfenv.kernel import KernelVersion, parse_release
from perfbalance.errors import FeatureUnavailable, ParseError
from perfbalance.host import HostPaths
from perfbalance.safefs import read_text

HeaderSource = Literal["host", "packaged", "kheaders"]


@dataclass(frozen=True, kw_only=True)
class Headers:
    path: str  # what BCC_KERNEL_SOURCE points at
    source: HeaderSource
    release: str  # the release the headers were built for (may differ from the running one)
    parts: tuple[str, ...] = ()  # the directories merged into `path`

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "source": self.source, "release": self.release,
                "parts": list(self.parts)}


_PKG = re.compile(r"^linux-headers-(\d+)\.(\d+)(?:\.(\d+))?(?:-(.*))?$")
MARKER_MAX_BYTES = 64 << 10  # our merged-headers marker: a few absolute paths


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
        return read_text(os.path.join(dest, MARKER), MARKER_MAX_BYTES, "merged headers marker")
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
