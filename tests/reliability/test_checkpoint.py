"""The checkpoint of intentions: atomic, bounded, versioned; bad files refused; recovery table."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agent.persist.checkpoint import (FILE_NAME, VERSION, Checkpoint, CheckpointData, CheckpointError, PendingMove,
                              Placement, dumps, live_placements, parse_checkpoint, planner_seed, recover)
from perfbalance.cpuset import CpuSet
from perfbalance.model import Container, KubeletState


class Clock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def ctr(cid: str, cpus: str, *, cgroup: str | None = None, exclusive: bool = False,
        rdt: str = "", pod_uid: str = "", name: str = "") -> Container:
    return Container(id=cid, cgroup=cgroup or f"pods/{cid}", cpuset=CpuSet.parse(cpus),
                     exclusive=exclusive, rdt_class=rdt, pod_uid=pod_uid, name=name)


# -- recording and loading ---------------------------------------------------------------------

def test_begin_move_is_on_disk_before_returning(tmp_path: Path) -> None:
    ck = Checkpoint(str(tmp_path), node="n1")
    ck.begin_move("a", "pods/a", "0-1", "2-3", "cpuset", mems="0")
    data = Checkpoint(str(tmp_path)).load()
    assert data is not None
    assert data.pending[("a", "cpuset")].to == "2-3"
    assert data.node == "n1"


def test_end_move_turns_pending_into_a_timed_placement(tmp_path: Path) -> None:
    clock = Clock()
    ck = Checkpoint(str(tmp_path), clock=clock)
    ck.begin_move("a", "pods/a", "0-1", "2-3", mems="0")
    clock.t = 1005.0
    ck.end_move("a")
    data = Checkpoint(str(tmp_path)).load()
    assert data is not None and not data.pending
    assert data.placed[("a", "cpuset")] == Placement(container="a", cgroup="pods/a", kind="cpuset",
                                                     value="2-3", mems="0", time=1005.0)


def test_failed_move_leaves_the_old_placement(tmp_path: Path) -> None:
    ck = Checkpoint(str(tmp_path))
    ck.place("a", "pods/a", "0-1", mems="0", at=5.0)
    ck.begin_move("a", "pods/a", "0-1", "2-3")
    ck.end_move("a", ok=False)
    data = Checkpoint(str(tmp_path)).load()
    assert data is not None
    assert data.placed[("a", "cpuset")].value == "0-1" and not data.pending


def test_cpuset_and_class_placements_are_kept_apart(tmp_path: Path) -> None:
    ck = Checkpoint(str(tmp_path))
    ck.place("a", "pods/a", "0-1")
    ck.place("a", "pods/a", "gold", "rdt_class")
    assert set(ck.placed) == {("a", "cpuset"), ("a", "rdt_class")}
    assert ck.cpuset_placements() == {"a": ("pods/a", CpuSet.parse("0-1"), CpuSet())}


def test_retain_forgets_containers_that_left(tmp_path: Path) -> None:
    ck = Checkpoint(str(tmp_path))
    ck.place("a", "pods/a", "0")
    ck.place("b", "pods/b", "1")
    ck.begin_move("c", "pods/c", "0", "1")
    ck.set_cooldowns({"b": 2000.0, "c": 2000.0})
    ck.retain(["b"])
    data = Checkpoint(str(tmp_path)).load()
    assert data is not None
    assert set(data.placed) == {("b", "cpuset")} and not data.pending
    assert dict(data.cooldown_until) == {"b": 2000.0}


def test_retain_without_change_does_not_write(tmp_path: Path) -> None:
    ck = Checkpoint(str(tmp_path))
    ck.place("a", "pods/a", "0")
    before = os.stat(tmp_path / FILE_NAME).st_mtime_ns, ck.data.seq
    ck.retain(["a", "zzz"])
    assert (os.stat(tmp_path / FILE_NAME).st_mtime_ns, ck.data.seq) == before


def test_no_checkpoint_is_none_without_error(tmp_path: Path) -> None:
    ck = Checkpoint(str(tmp_path))
    assert ck.load() is None and ck.error is None


def test_size_is_bounded_by_dropping_the_oldest_placements(tmp_path: Path) -> None:
    clock = Clock(0.0)
    ck = Checkpoint(str(tmp_path), max_bytes=8192, clock=clock)
    for i in range(200):
        clock.t = float(i)
        ck.place(f"c{i:03d}", f"pods/c{i:03d}", "0-1")
    assert os.path.getsize(tmp_path / FILE_NAME) <= 8192
    kept = sorted(cid for cid, _ in ck.placed)
    assert kept and kept[-1] == "c199" and "c000" not in kept
    assert Checkpoint(str(tmp_path), max_bytes=8192).load() is not None


def test_unwritable_run_dir_is_a_checkpoint_error_and_memory_still_knows(tmp_path: Path) -> None:
    ck = Checkpoint(str(tmp_path / "missing"))
    with pytest.raises(CheckpointError, match="cannot write"):
        ck.place("a", "pods/a", "0")
    assert ("a", "cpuset") in ck.placed


# -- bad files: clear error, set aside, start from OS state ------------------------------------

def _valid_text() -> str:
    return dumps(CheckpointData(node="n", seq=3, placed={("a", "cpuset"): Placement(
        container="a", cgroup="pods/a", kind="cpuset", value="0-1", time=1.0)}))


@pytest.mark.parametrize("mutate, problem", [
    (lambda t: t[: len(t) // 2], "not JSON"),  # half-written
    (lambda t: "", "empty"),
    (lambda t: t.replace('"0-1"', '"0-3"'), "checksum mismatch"),  # damaged after writing
    (lambda t: t.replace(f'"version": {VERSION}', f'"version": {VERSION + 1}'), "newer than this agent"),
    (lambda t: json.dumps({"hello": 1}), "not a perfbalance-checkpoint"),
    (lambda t: "\xff\xfe garbage", "not JSON"),
    (lambda t: "[" * 100_000, "not usable JSON"),
], ids=["half-written", "empty", "damaged", "newer", "foreign", "garbage", "deep"])
def test_unusable_checkpoint_is_refused_and_set_aside(tmp_path: Path, mutate, problem: str) -> None:
    (tmp_path / FILE_NAME).write_text(mutate(_valid_text()))
    ck = Checkpoint(str(tmp_path))
    assert ck.load() is None
    assert ck.error is not None and problem in str(ck.error)
    assert (tmp_path / (FILE_NAME + ".bad")).exists() and not (tmp_path / FILE_NAME).exists()
    ck.place("b", "pods/b", "1")  # and the agent goes on with a fresh one
    assert set(Checkpoint(str(tmp_path)).load().placed) == {("b", "cpuset")}  # type: ignore[union-attr]


def test_symlinked_checkpoint_is_refused(tmp_path: Path) -> None:
    other = tmp_path / "other.json"
    other.write_text(_valid_text())
    os.symlink(other, tmp_path / FILE_NAME)
    ck = Checkpoint(str(tmp_path))
    assert ck.load() is None and "symlink" in str(ck.error)


def test_oversized_checkpoint_is_refused(tmp_path: Path) -> None:
    (tmp_path / FILE_NAME).write_text(" " * 5000 + _valid_text())
    ck = Checkpoint(str(tmp_path), max_bytes=4096)
    assert ck.load() is None and "larger than" in str(ck.error)


def test_stale_temp_files_of_a_killed_writer_are_removed(tmp_path: Path) -> None:
    (tmp_path / f"{FILE_NAME}.tmp.12345").write_text("partial")
    Checkpoint(str(tmp_path)).load()
    assert not (tmp_path / f"{FILE_NAME}.tmp.12345").exists()


def test_parse_roundtrip() -> None:
    text = _valid_text()
    assert dumps(parse_checkpoint(text)) == text


# -- SIGKILL at random points: always the old or the new version --------------------------------

WRITER = """
import sys
from agent.persist.checkpoint import Checkpoint
ck = Checkpoint(sys.argv[1], node="n")
i = 0
print("ready", flush=True)
while True:
    i += 1
    ck.begin_move(f"c{i % 50}", f"pods/c{i % 50}", "0-1", "2-3")
    ck.end_move(f"c{i % 50}")
"""


@pytest.mark.slow
def test_sigkill_mid_write_never_leaves_a_corrupt_checkpoint(tmp_path: Path) -> None:
    rng = random.Random(8)
    seqs = []
    for _ in range(25):
        p = subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path)], stdout=subprocess.PIPE,
                             cwd=str(Path(__file__).resolve().parents[2]))
        try:
            assert p.stdout is not None and p.stdout.readline().strip() == b"ready"
            time.sleep(rng.uniform(0.0, 0.05))
        finally:
            p.send_signal(signal.SIGKILL)
            p.wait(timeout=30)
        ck = Checkpoint(str(tmp_path), node="n")
        data = ck.load()
        assert ck.error is None, ck.error
        if data is not None:  # None only when killed before the very first rename
            seqs.append(data.seq)
            assert all(m.to == "2-3" for m in data.pending.values())
    assert len(seqs) >= 20 and max(seqs) > 1  # writes really happened between kills


# -- recovery decisions (pure) -----------------------------------------------------------------

def data_with(*moves: PendingMove) -> CheckpointData:
    return CheckpointData(pending={(m.container, m.kind): m for m in moves})


def move(cid: str, frm: str, to: str, kind: str = "cpuset") -> PendingMove:
    return PendingMove(container=cid, cgroup=f"pods/{cid}", kind=kind, frm=frm, to=to, mems="0",
                       started=1.0)


def test_recover_drops_a_move_of_a_container_that_is_gone() -> None:
    [s] = recover(data_with(move("a", "0-1", "2-3")), [])
    assert (s.action, s.reason) == ("drop", "container gone")


def test_recover_finishes_an_interrupted_move_whose_target_is_valid() -> None:
    [s] = recover(data_with(move("a", "0-1", "2-3")), [ctr("a", "0-1")], usable_cpus=CpuSet.parse("0-3"))
    assert (s.action, s.value, s.mems) == ("finish", "2-3", "0")


def test_recover_finishes_a_half_widened_v1_move() -> None:
    [s] = recover(data_with(move("a", "0-1", "2-3")), [ctr("a", "0-3")], usable_cpus=CpuSet.parse("0-3"))
    assert (s.action, s.value) == ("finish", "2-3")


def test_recover_records_a_move_already_at_its_target() -> None:
    [s] = recover(data_with(move("a", "0-1", "2-3")), [ctr("a", "2-3")])
    assert (s.action, s.reason) == ("finish", "already at the target")


def test_recover_reverts_when_the_target_became_reserved() -> None:
    [s] = recover(data_with(move("a", "0-1", "2-3")), [ctr("a", "0-3")], usable_cpus=CpuSet.parse("0-1"))
    assert (s.action, s.value) == ("revert", "0-1")


def test_recover_reverts_when_the_kubelet_dedicated_the_target_to_another() -> None:
    kubelet = KubeletState(policy="static", exclusive={("uid", "db"): CpuSet.parse("2")})
    [s] = recover(data_with(move("a", "0-1", "2-3")), [ctr("a", "0-1")], kubelet=kubelet)
    assert s.action == "revert" and "dedicated" in s.reason


def test_recover_drops_when_someone_else_rewrote_the_cpuset() -> None:
    [s] = recover(data_with(move("a", "0-1", "2-3")), [ctr("a", "0")])
    assert s.action == "drop" and "someone else" in s.reason


def test_recover_drops_when_the_container_changed_cgroup_or_became_exclusive() -> None:
    moved = ctr("a", "0-1", cgroup="pods/other")
    owned = ctr("a", "0-1", exclusive=True)
    assert recover(data_with(move("a", "0-1", "2-3")), [moved])[0].action == "drop"
    assert recover(data_with(move("a", "0-1", "2-3")), [owned])[0].action == "drop"


@pytest.mark.parametrize("now_class, classes, action", [
    ("gold", None, "finish"), ("", {"gold"}, "finish"), ("", {"silver"}, "revert"), ("bronze", None, "drop"),
])
def test_recover_rdt_class_moves(now_class: str, classes: set[str] | None, action: str) -> None:
    [s] = recover(data_with(move("a", "", "gold", "rdt_class")), [ctr("a", "0", rdt=now_class)], classes=classes)
    assert s.action == action


def test_placements_of_gone_or_changed_containers_are_not_live() -> None:
    data = CheckpointData(placed={
        (c, "cpuset"): Placement(container=c, cgroup=f"pods/{c}", kind="cpuset", value="0", time=1.0)
        for c in ("a", "b", "c")})
    live = live_placements(data, [ctr("a", "0"), ctr("b", "0", cgroup="pods/x")])
    assert set(live) == {("a", "cpuset")}


def test_planner_seed_carries_dwell_and_cooldown_over_a_restart() -> None:
    data = CheckpointData(placed={("a", "cpuset"): Placement(container="a", cgroup="pods/a", kind="cpuset",
                                                             value="0", time=990.0)},
                          cooldown_until={"a": 1200.0, "gone": 1200.0, "past": 10.0})
    state = planner_seed(data, [ctr("a", "0"), ctr("past", "0")], now=1000.0)
    assert dict(state.moved_at) == {"a": 990.0}
    assert dict(state.cooldown_until) == {"a": 1200.0}


def test_planner_does_not_move_a_container_placed_just_before_the_restart() -> None:
    """No thrash after restart: seeded from the checkpoint, the real planner honours dwell."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "rebalancer"))
    from rb_builders import avx_vs_scalar
    from agent.plan.runner import PolicyRunner
    from rebalancer import RebalancerConfig, plan

    s = avx_vs_scalar()
    assert plan(s, RebalancerConfig(), None, s.time).actions  # without the checkpoint: a move
    containers = [x.container for x in s.containers]
    placed = {(c.id, "cpuset"): Placement(container=c.id, cgroup=c.cgroup, kind="cpuset",
                                          value=str(c.cpuset), time=s.time - 10) for c in containers}
    runner = PolicyRunner()  # as the agent resumes the configured policy
    runner.resume("costmodel", planner_seed(CheckpointData(placed=placed), containers, now=s.time))
    out = runner.run(s, RebalancerConfig(), s.time)
    assert out.error == "" and out.plan.actions == () and any("dwell" in c["rejected"] for c in out.plan.considered)
