"""A small checkpoint of the agent's intentions, so a restart neither forgets nor thrashes.

The OS is the source of truth for where containers are (cgroupfs, resctrl, thread affinities).
What the OS cannot say is *why*: which placements are ours (for drift detection and dwell
times), and which move was half done when the agent died. So before each move the agent writes
`begin_move`, after it `end_move`, and the file `<run_dir>/checkpoint.json` holds:

- `placed`: (container id, kind) -> what we put there (cpuset + mems, or RDT class) and when;
- `pending`: moves begun and not ended (at most one per container and kind);
- `cooldown_until`: containers the planner must leave alone (after a rollback) until a time.

Writes are atomic (temp file in the same directory, fsync, rename, fsync of the directory), so a
SIGKILL or power loss leaves the old or the new version, never a mix; the body carries a SHA-256
so that a file damaged afterwards is recognised too. The file is bounded (MAX_BYTES, oldest
placements dropped first). A corrupt, half-written or newer-version checkpoint is refused with a
CheckpointError saying why, moved aside to `checkpoint.json.bad`, and the agent starts from OS
state alone: nothing in the checkpoint is ever trusted over what cgroupfs shows.

`recover()` is pure: given the checkpoint and the containers discovered now, it decides for each
half-done move whether to finish it, revert it, or drop it (see its docstring for the table).
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any, Literal

from perfbalance.cpuset import CpuSet
from perfbalance.errors import ParseError
from perfbalance.model import Container, KubeletState, PolicyState
from perfbalance.safefs import read_bounded

log = logging.getLogger(__name__)

FILE_NAME = "checkpoint.json"
FORMAT = "perfbalance-checkpoint"
VERSION = 1
MAX_BYTES = 1 << 20  # ~4000 containers' placements; bounded whatever happens
KINDS = ("cpuset", "rdt_class")
Kind = Literal["cpuset", "rdt_class"]
StepAction = Literal["finish", "revert", "drop"]


class CheckpointError(ParseError):
    """The checkpoint file cannot be used; the agent goes on from OS state alone."""

    def __init__(self, path: str, problem: str, value: object = "") -> None:
        super().__init__("checkpoint", value, problem, source=path)
        self.path, self.problem = path, problem


@dataclass(frozen=True, kw_only=True)
class Placement:
    """What the agent put where: a container's cpuset (with mems) or RDT class, and when."""

    container: str
    cgroup: str
    kind: str
    value: str  # cpuset list or class name
    mems: str = ""
    time: float  # unix seconds of the move

    def to_json(self) -> dict[str, Any]:
        return {"container": self.container, "cgroup": self.cgroup, "kind": self.kind,
                "value": self.value, "mems": self.mems, "time": self.time}


@dataclass(frozen=True, kw_only=True)
class PendingMove:
    """A move that was begun (written before acting) and has not been ended."""

    container: str
    cgroup: str
    kind: str
    frm: str
    to: str
    mems: str = ""
    started: float
    event_id: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"container": self.container, "cgroup": self.cgroup, "kind": self.kind,
                "from": self.frm, "to": self.to, "mems": self.mems, "started": self.started,
                "event_id": self.event_id}


@dataclass(frozen=True, kw_only=True)
class CheckpointData:
    version: int = VERSION
    written: float = 0.0
    pid: int = 0
    node: str = ""
    seq: int = 0  # incremented on every write (tests and logs tell versions apart)
    placed: Mapping[tuple[str, str], Placement] = field(default_factory=dict)
    pending: Mapping[tuple[str, str], PendingMove] = field(default_factory=dict)
    cooldown_until: Mapping[str, float] = field(default_factory=dict)

    def body(self) -> dict[str, Any]:
        return {"version": self.version, "written": self.written, "pid": self.pid, "node": self.node,
                "seq": self.seq,
                "placed": [p.to_json() for _, p in sorted(self.placed.items())],
                "pending": [m.to_json() for _, m in sorted(self.pending.items())],
                "cooldown_until": dict(sorted(self.cooldown_until.items()))}


# ---------------------------------------------------------------------------------------------
# pure: text <-> data
# ---------------------------------------------------------------------------------------------

def _digest(body: Mapping[str, Any]) -> str:
    canon = json.dumps(body, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(canon.encode()).hexdigest()


def dumps(data: CheckpointData) -> str:
    body = data.body()
    return json.dumps({"format": FORMAT, "sha256": _digest(body), **body}, indent=1,
                      allow_nan=False) + "\n"


def parse_checkpoint(text: str, *, path: str = FILE_NAME) -> CheckpointData:
    """Pure: checkpoint text -> CheckpointData; CheckpointError naming the problem otherwise."""
    if not text.strip():
        raise CheckpointError(path, "empty file")
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise CheckpointError(path, f"not JSON ({e.msg} at {e.pos}; half-written or damaged)") from None
    except (ValueError, RecursionError) as e:
        raise CheckpointError(path, f"not usable JSON ({type(e).__name__})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise CheckpointError(path, f"not a {FORMAT} file", str(doc)[:80])
    version = doc.get("version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise CheckpointError(path, "no valid version", version)
    if version > VERSION:
        raise CheckpointError(path, f"version {version} is newer than this agent understands "
                                    f"({VERSION}); written by a newer perfbalance?", version)
    body = {k: v for k, v in doc.items() if k not in ("format", "sha256")}
    try:
        digest = _digest(body)
    except (ValueError, TypeError):
        raise CheckpointError(path, "body is not canonical JSON") from None
    if doc.get("sha256") != digest:
        raise CheckpointError(path, "checksum mismatch (damaged after it was written)")
    try:
        return _data(body)
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise CheckpointError(path, f"bad content ({type(e).__name__}: {str(e)[:120]})") from None


def _data(body: Mapping[str, Any]) -> CheckpointData:
    placed = [Placement(container=str(p["container"]), cgroup=str(p["cgroup"]), kind=_kind(p["kind"]),
                        value=str(p["value"]), mems=str(p.get("mems", "")), time=float(p["time"]))
              for p in body.get("placed", [])]
    pending = [PendingMove(container=str(m["container"]), cgroup=str(m["cgroup"]), kind=_kind(m["kind"]),
                           frm=str(m["from"]), to=str(m["to"]), mems=str(m.get("mems", "")),
                           started=float(m["started"]), event_id=str(m.get("event_id", "")))
               for m in body.get("pending", [])]
    return CheckpointData(
        version=int(body["version"]), written=float(body.get("written", 0.0)),
        pid=int(body.get("pid", 0)), node=str(body.get("node", "")), seq=int(body.get("seq", 0)),
        placed={(p.container, p.kind): p for p in placed},
        pending={(m.container, m.kind): m for m in pending},
        cooldown_until={str(k): float(v) for k, v in dict(body.get("cooldown_until", {})).items()})


def _kind(value: Any) -> str:
    if value not in KINDS:
        raise ValueError(f"unknown kind {value!r}")
    return str(value)


# ---------------------------------------------------------------------------------------------
# atomic file I/O
# ---------------------------------------------------------------------------------------------

def write_atomic(path: str, text: str) -> None:
    """Write `text` to `path` so that readers see the old or the new content, never a mix."""
    directory = os.path.dirname(path) or "."
    tmp = f"{path}.tmp.{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        data = text.encode()
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        _unlink(tmp)
        raise
    os.close(fd)
    try:
        os.replace(tmp, path)
    except BaseException:
        _unlink(tmp)
        raise
    dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(dfd)  # the rename itself is durable only once the directory is
    finally:
        os.close(dfd)


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def read_checkpoint(path: str, *, limit: int = MAX_BYTES) -> CheckpointData | None:
    """The checkpoint at `path`; None when there is none; CheckpointError when unusable."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except FileNotFoundError:
        return None
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise CheckpointError(path, "is a symlink; refusing to follow it") from None
        raise CheckpointError(path, f"cannot open ({e.strerror})") from None
    try:
        raw = read_bounded(fd, limit, path)
    except OverflowError:
        raise CheckpointError(path, f"larger than {limit} bytes") from None
    except OSError as e:
        raise CheckpointError(path, f"cannot read ({e.strerror})") from None
    finally:
        os.close(fd)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise CheckpointError(path, f"not UTF-8 (byte {e.start})") from None
    return parse_checkpoint(text, path=path)


# ---------------------------------------------------------------------------------------------
# the agent's handle
# ---------------------------------------------------------------------------------------------

class Checkpoint:
    """The checkpoint in `run_dir`: load once at start, then record moves as they happen.

    Every mutating call writes the file before returning (so `begin_move` is durable before the
    agent touches a cgroup). Write failures raise CheckpointError (the caller logs it and goes on:
    a lost checkpoint costs a re-learned dwell time, never a wrong move).
    """

    def __init__(self, run_dir: str, *, node: str = "", max_bytes: int = MAX_BYTES,
                 clock: Callable[[], float] = time.time) -> None:
        self.run_dir, self.node, self.max_bytes, self.clock = run_dir, node, max_bytes, clock
        self.path = os.path.join(run_dir, FILE_NAME)
        self.error: CheckpointError | None = None  # why the last load() found nothing usable
        self._data = CheckpointData(node=node)

    # -- loading ----------------------------------------------------------------------------
    def load(self) -> CheckpointData | None:
        """The checkpoint left by the previous agent, or None (none, or unusable: see .error).

        An unusable file is renamed to `checkpoint.json.bad` (kept for a post-mortem) and a
        warning says why; stale temp files of a writer killed mid-write are removed.
        """
        self._remove_stale_temps()
        self.error = None
        try:
            data = read_checkpoint(self.path, limit=self.max_bytes)
        except CheckpointError as e:
            self.error = e
            log.warning("%s; starting from the OS state alone", e)
            self._set_aside()
            self._data = CheckpointData(node=self.node)
            return None
        self._data = data if data is not None else CheckpointData(node=self.node)
        return data

    def _remove_stale_temps(self) -> None:
        prefix = FILE_NAME + ".tmp."
        try:
            names = os.listdir(self.run_dir)
        except OSError:
            return
        for name in names:
            if name.startswith(prefix) and name[len(prefix):].isdigit():
                _unlink(os.path.join(self.run_dir, name))

    def _set_aside(self) -> None:
        try:
            os.replace(self.path, self.path + ".bad")
        except OSError as e:
            log.warning("cannot move the unusable checkpoint aside: %s", e.strerror)

    # -- what is known ----------------------------------------------------------------------
    @property
    def data(self) -> CheckpointData:
        return self._data

    @property
    def placed(self) -> Mapping[tuple[str, str], Placement]:
        """(container id, kind) -> Placement: what we put where, and when."""
        return dict(self._data.placed)

    @property
    def pending(self) -> Mapping[tuple[str, str], PendingMove]:
        return dict(self._data.pending)

    def cpuset_placements(self) -> dict[str, tuple[str, CpuSet, CpuSet]]:
        """container id -> (cgroup, cpus, mems) of our cpuset placements (CpusetActuator.adopt)."""
        out: dict[str, tuple[str, CpuSet, CpuSet]] = {}
        for (cid, kind), p in self._data.placed.items():
            if kind == "cpuset":
                try:
                    out[cid] = (p.cgroup, CpuSet.parse(p.value), CpuSet.parse(p.mems))
                except ParseError:
                    continue
        return out

    def class_placements(self) -> dict[str, tuple[str, str]]:
        """container id -> (cgroup, RDT class; "" for none) of the classes the planner chose
        (RdtNode.adopt)."""
        return {cid: (p.cgroup, p.value) for (cid, kind), p in self._data.placed.items() if kind == "rdt_class"}

    # -- recording --------------------------------------------------------------------------
    def begin_move(self, container_id: str, cgroup: str, frm: str, to: str, kind: str = "cpuset",
                   *, mems: str = "", event_id: str = "") -> None:
        """Record a move about to be made (durable before the first cgroup write)."""
        m = PendingMove(container=container_id, cgroup=cgroup, kind=_kind(kind), frm=frm, to=to,
                        mems=mems, started=self.clock(), event_id=event_id)
        self._commit(pending={**self._data.pending, (container_id, m.kind): m})

    def end_move(self, container_id: str, *, ok: bool = True, kind: str | None = None) -> None:
        """The move ended: on success `to` becomes the container's placement; either way it is
        no longer pending. `kind` None ends every pending move of the container."""
        pending = dict(self._data.pending)
        placed = dict(self._data.placed)
        for key in [k for k in pending if k[0] == container_id and kind in (None, k[1])]:
            m = pending.pop(key)
            if ok:
                placed[key] = Placement(container=m.container, cgroup=m.cgroup, kind=m.kind,
                                        value=m.to, mems=m.mems, time=self.clock())
        self._commit(pending=pending, placed=placed)

    def place(self, container_id: str, cgroup: str, value: str, kind: str = "cpuset", *,
              mems: str = "", at: float | None = None) -> None:
        """Record a placement directly (recovery adopting what it finished)."""
        p = Placement(container=container_id, cgroup=cgroup, kind=_kind(kind), value=value, mems=mems,
                      time=self.clock() if at is None else at)
        self._commit(placed={**self._data.placed, (container_id, p.kind): p})

    def forget(self, container_id: str) -> None:
        """Drop everything about one container (it is gone, or the kubelet owns it now)."""
        d = self._data
        ids = {k[0] for k in d.placed} | {k[0] for k in d.pending} | set(d.cooldown_until)
        self.retain(ids - {container_id})

    def retain(self, container_ids: Iterable[str]) -> None:
        """Keep only these containers (call after discovery); writes only when something went."""
        keep = set(container_ids)
        d = self._data
        placed = {k: v for k, v in d.placed.items() if k[0] in keep}
        pending = {k: v for k, v in d.pending.items() if k[0] in keep}
        cooldown = {k: v for k, v in d.cooldown_until.items() if k in keep}
        if (len(placed), len(pending), len(cooldown)) != (len(d.placed), len(d.pending), len(d.cooldown_until)):
            self._commit(placed=placed, pending=pending, cooldown_until=cooldown)

    def set_cooldowns(self, cooldown_until: Mapping[str, float]) -> None:
        """The planner's rollback cooldowns (PlannerState.cooldown_until); written on change."""
        new = {str(k): float(v) for k, v in cooldown_until.items()}
        if new != dict(self._data.cooldown_until):
            self._commit(cooldown_until=new)

    # -- writing ----------------------------------------------------------------------------
    def _commit(self, **changes: Any) -> None:
        data = replace(self._data, **changes, version=VERSION, written=self.clock(), pid=os.getpid(),
                       node=self.node, seq=self._data.seq + 1)
        text = dumps(data)
        while len(text.encode()) > self.max_bytes and data.placed:
            oldest = min(data.placed, key=lambda k: data.placed[k].time)
            data = replace(data, placed={k: v for k, v in data.placed.items() if k != oldest})
            text = dumps(data)
        self._data = data  # in memory even if the write fails: this run still knows
        try:
            write_atomic(self.path, text)
        except OSError as e:
            raise CheckpointError(self.path, f"cannot write ({e.strerror})") from None


# ---------------------------------------------------------------------------------------------
# pure: recovery decisions
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True, kw_only=True)
class RecoveryStep:
    """What to do about one half-done move found in the checkpoint."""

    container: str
    cgroup: str
    kind: str
    action: StepAction  # finish: apply `value`; revert: apply `value` (the old one); drop: nothing
    value: str = ""
    mems: str = ""
    reason: str = ""


def recover(data: CheckpointData, current: Iterable[Container], *, kubelet: KubeletState | None = None,
            usable_cpus: CpuSet | None = None, classes: Collection[str] | None = None) -> list[RecoveryStep]:
    """Decide, for each pending move, from what discovery sees now:

    | now                                                       | step                       |
    |-----------------------------------------------------------|----------------------------|
    | container not discovered                                  | drop (it is gone)          |
    | other cgroup under that id, or the kubelet now owns it    | drop (not ours to touch)   |
    | already at the target                                     | finish (record, no write)  |
    | at the source, or half-way (v1 widened to source|target), |                            |
    |   target still valid                                      | finish (apply the target)  |
    |   target no longer valid (reserved, dedicated, offline,   | revert (apply the source)  |
    |   unknown class)                                          |                            |
    | anything else (someone rewrote it meanwhile)              | drop (the OS state wins)   |

    `usable_cpus`: CPUs a container may get now (online minus reserved/isolated); None: any.
    `classes`: RDT classes that exist now; None: any.
    """
    by_id = {c.id: c for c in current}
    return [_step(m, by_id.get(m.container), kubelet or KubeletState(), usable_cpus, classes)
            for _, m in sorted(data.pending.items())]


def _step(m: PendingMove, c: Container | None, kubelet: KubeletState, usable: CpuSet | None,
          classes: Collection[str] | None) -> RecoveryStep:
    def step(action: StepAction, value: str, reason: str) -> RecoveryStep:
        return RecoveryStep(container=m.container, cgroup=m.cgroup, kind=m.kind, action=action,
                            value=value, mems=m.mems if action == "finish" else "", reason=reason)

    if c is None:
        return step("drop", "", "container gone")
    if c.cgroup != m.cgroup:
        return step("drop", "", f"container now lives in {c.cgroup}, not {m.cgroup}")
    if c.exclusive:
        return step("drop", "", "the kubelet dedicated CPUs to it; it owns it")
    if m.kind == "rdt_class":
        return _class_step(m, c, classes, step)
    return _cpuset_step(m, c, kubelet, usable, step)


def _cpuset_step(m: PendingMove, c: Container, kubelet: KubeletState, usable: CpuSet | None,
                 step: Callable[[StepAction, str, str], RecoveryStep]) -> RecoveryStep:
    try:
        frm, to = CpuSet.parse(m.frm), CpuSet.parse(m.to)
    except ParseError as e:
        return step("drop", "", f"unreadable move in the checkpoint: {e.reason}")
    if c.cpuset == to:
        return step("finish", m.to, "already at the target")
    if c.cpuset not in (frm, frm | to):
        return step("drop", "", f"cpuset is {c.cpuset or 'empty'}, neither {frm} nor {to}: someone else wrote it")
    problem = _cpus_problem(to, c, kubelet, usable)
    if not problem:
        return step("finish", m.to, "interrupted move, target still valid")
    if not frm or _cpus_problem(frm, c, kubelet, usable):
        return step("drop", "", f"target invalid ({problem}) and the source too")
    return step("revert", m.frm, f"target invalid: {problem}")


def _cpus_problem(cpus: CpuSet, c: Container, kubelet: KubeletState, usable: CpuSet | None) -> str:
    if not cpus:
        return "empty"
    if usable is not None and not cpus <= usable:
        return f"CPUs {cpus - usable} not usable now"
    others = kubelet.dedicated_to_others(c.pod_uid, c.name)
    if not cpus.isdisjoint(others):
        return f"CPUs {cpus & others} dedicated by the kubelet"
    return ""


def _class_step(m: PendingMove, c: Container, classes: Collection[str] | None,
                step: Callable[[StepAction, str, str], RecoveryStep]) -> RecoveryStep:
    if c.rdt_class == m.to:
        return step("finish", m.to, "already in the target class")
    if c.rdt_class != m.frm:
        return step("drop", "", f"class is {c.rdt_class!r}, neither {m.frm!r} nor {m.to!r}")
    if classes is None or m.to in classes:
        return step("finish", m.to, "interrupted move, class still exists")
    return step("revert", m.frm, f"class {m.to!r} no longer exists")


def live_placements(data: CheckpointData, current: Sequence[Container]) -> dict[tuple[str, str], Placement]:
    """The placements that still describe a discovered container in the same cgroup."""
    by_id = {c.id: c for c in current}
    return {k: p for k, p in data.placed.items()
            if (c := by_id.get(p.container)) is not None and c.cgroup == p.cgroup and not c.exclusive}


def planner_seed(data: CheckpointData, current: Sequence[Container], now: float) -> PolicyState:
    """The dwell times (moved_at) and cooldowns a policy resumes from after a restart."""
    live = live_placements(data, current)
    moved_at: dict[str, float] = {}
    for p in live.values():
        moved_at[p.container] = max(moved_at.get(p.container, 0.0), min(p.time, now))
    present = {c.id for c in current}
    cooldown = {cid: t for cid, t in data.cooldown_until.items() if cid in present and t > now}
    return PolicyState(moved_at=MappingProxyType(dict(sorted(moved_at.items()))),
                       cooldown_until=MappingProxyType(dict(sorted(cooldown.items()))))
