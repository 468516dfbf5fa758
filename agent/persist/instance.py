"""Process hygiene for the agent: its run directory, a single instance per node, structured logs.

Two agents on one node would fight over the same cpusets and resctrl groups, so the agent takes
an exclusive flock on `<run_dir>/perfbalance.lock` and writes its pid there; a second one fails
at once with a message naming the holder. flock (not a pid file alone) is released by the kernel
when the holder dies, so a crash never leaves a stale lock behind. Logs are JSON lines by
default (one object per event, extra fields kept) so that `kubectl logs` can be filtered.
"""

from __future__ import annotations

import datetime as _dt
import fcntl
import json
import logging
import os
import sys
from types import TracebackType
from typing import Any, TextIO

from perfbalance.errors import PerfbalanceError

LOCK_NAME = "perfbalance.lock"
RUN_DIR_MODE = 0o755


class InstanceError(PerfbalanceError):
    """The run directory or the instance lock cannot be had."""


class AlreadyRunning(InstanceError):
    def __init__(self, path: str, pid: int | None) -> None:
        self.path, self.pid = path, pid
        who = f"pid {pid}" if pid else "another process"
        super().__init__(f"perfbalance is already running on this node ({who} holds {path})")


def ensure_run_dir(path: str) -> str:
    """Create the run directory (mode 0755) if missing; refuse a non-directory."""
    existed = os.path.isdir(path)
    try:
        os.makedirs(path, mode=RUN_DIR_MODE, exist_ok=True)
        if not existed:
            os.chmod(path, RUN_DIR_MODE)  # makedirs' mode is filtered by the umask
    except FileExistsError:
        raise InstanceError(f"run directory {path} exists and is not a directory") from None
    except OSError as e:
        raise InstanceError(f"cannot create run directory {path}: {e.strerror}") from None
    if not os.path.isdir(path):
        raise InstanceError(f"run directory {path} exists and is not a directory")
    return path


def _read_pid(fd: int) -> int | None:
    try:
        text = os.pread(fd, 32, 0).decode("ascii", errors="replace").strip()
        return int(text) if text.isdigit() else None
    except OSError:
        return None


class InstanceLock:
    """An exclusive flock on <run_dir>/perfbalance.lock holding our pid (context manager)."""

    def __init__(self, run_dir: str) -> None:
        self.run_dir = run_dir
        self.path = os.path.join(run_dir, LOCK_NAME)
        self._fd: int | None = None

    def acquire(self) -> InstanceLock:
        ensure_run_dir(self.run_dir)
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as e:
            raise InstanceError(f"cannot open lock {self.path}: {e.strerror}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid = _read_pid(fd)
            os.close(fd)
            raise AlreadyRunning(self.path, pid) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        """Unlock (the file stays: removing it would race with a starting successor)."""
        if self._fd is None:
            return
        try:
            os.ftruncate(self._fd, 0)
        except OSError:
            pass
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        os.close(self._fd)
        self._fd = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def __enter__(self) -> InstanceLock:
        return self.acquire()

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.release()


# ---------------------------------------------------------------------------------------------
# logging
# ---------------------------------------------------------------------------------------------

_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, msg, any `extra=` fields, exc."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": _dt.datetime.fromtimestamp(record.created, _dt.timezone.utc)
            .isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_"):
                out[key] = value
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str, ensure_ascii=False)


TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class _OurHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Marks the handler setup_logging installed, so a second call replaces it."""


def setup_logging(level: str = "info", fmt: str = "json", *, stream: TextIO | None = None) -> logging.Handler:
    """Configure the root logger: `fmt` "json" (JSON lines) or "text"; callable again on reload."""
    numeric = logging.getLevelName(level.upper())
    if not isinstance(numeric, int):
        raise ValueError(f"unknown log level {level!r} (debug, info, warning, error)")
    if fmt not in ("json", "text"):
        raise ValueError(f"unknown log format {fmt!r} (json, text)")
    root = logging.getLogger()
    for h in list(root.handlers):
        if isinstance(h, _OurHandler):
            root.removeHandler(h)
    handler = _OurHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    root.addHandler(handler)
    root.setLevel(numeric)
    return handler


def reconfigure_logging(level: str, fmt: str) -> None:
    """A reloaded `agent.log_level`/`log_format`: the root logger's level at once, and the format
    of the handler setup_logging installed (on the stream it writes to); without that handler
    (the agent embedded in a program with its own logging) only the level changes."""
    ours = [h for h in logging.getLogger().handlers if isinstance(h, _OurHandler)]
    if ours:
        setup_logging(level, fmt, stream=ours[0].stream)
        return
    numeric = logging.getLevelName(level.upper())
    if not isinstance(numeric, int):
        raise ValueError(f"unknown log level {level!r} (debug, info, warning, error)")
    logging.getLogger().setLevel(numeric)
