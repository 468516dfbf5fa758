"""Run directory, single-instance lock and structured logs."""

from __future__ import annotations

import io
import json
import logging
import os
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.persist import instance


@pytest.fixture
def restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        yield
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)


def test_run_dir_created_with_mode_0755(tmp_path: Path) -> None:
    old = os.umask(0o077)
    try:
        d = instance.ensure_run_dir(str(tmp_path / "run" / "perfbalance"))
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(d).st_mode) == 0o755


def test_run_dir_that_is_a_file_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("")
    with pytest.raises(instance.InstanceError, match="not a directory"):
        instance.ensure_run_dir(str(tmp_path / "f"))


def test_lock_creates_run_dir_and_writes_pid(tmp_path: Path) -> None:
    run = tmp_path / "run"
    with instance.InstanceLock(str(run)) as lock:
        assert Path(lock.path).read_text().strip() == str(os.getpid())


def test_second_instance_fails_naming_the_pid(tmp_path: Path) -> None:
    with instance.InstanceLock(str(tmp_path)):
        with pytest.raises(instance.AlreadyRunning, match=f"pid {os.getpid()}"):
            instance.InstanceLock(str(tmp_path)).acquire()


def test_second_instance_in_another_process_fails(tmp_path: Path) -> None:
    code = ("import sys; from agent.persist import instance\n"
            "try:\n instance.InstanceLock(sys.argv[1]).acquire()\n"
            "except instance.AlreadyRunning as e:\n print(e); sys.exit(3)\n")
    with instance.InstanceLock(str(tmp_path)):
        r = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 3 and f"pid {os.getpid()}" in r.stdout


def test_lock_is_free_again_after_release(tmp_path: Path) -> None:
    instance.InstanceLock(str(tmp_path)).acquire().release()
    lock = instance.InstanceLock(str(tmp_path)).acquire()
    assert lock.held
    lock.release()


def test_json_logs_are_one_object_per_line_with_extra_fields(restore_logging: None) -> None:
    buf = io.StringIO()
    instance.setup_logging("info", "json", stream=buf)
    logging.getLogger("perfbalance.test").info("moved %s", "c1", extra={"container": "c1", "cpus": "0-1"})
    logging.getLogger("perfbalance.test").debug("hidden")
    lines = buf.getvalue().splitlines()
    assert len(lines) == 1
    rec = json.loads(lines[0])
    assert (rec["level"], rec["msg"], rec["container"], rec["cpus"]) == ("info", "moved c1", "c1", "0-1")


def test_text_logs_and_reconfigure_replaces_handler(restore_logging: None) -> None:
    buf = io.StringIO()
    instance.setup_logging("info", "json", stream=io.StringIO())
    instance.setup_logging("debug", "text", stream=buf)
    logging.getLogger("x").debug("hello")
    assert buf.getvalue().rstrip().endswith("DEBUG x: hello")
    assert sum(isinstance(h, instance._OurHandler) for h in logging.getLogger().handlers) == 1


def test_bad_level_is_an_error() -> None:
    with pytest.raises(ValueError, match="loud"):
        instance.setup_logging("loud", "json")
