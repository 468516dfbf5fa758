"""tracefs: mounted (or mounted by us), and which tracepoints our programs attach to exist."""

from __future__ import annotations

import ctypes
import logging
import os
from collections.abc import Iterable

import bpf
from perfbalance.errors import FeatureUnavailable

log = logging.getLogger(__name__)


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
    """Every tracepoint of every program (bpf.PROGRAMS): "category/event" -> exists."""
    return {f"{c}/{e}": tracepoint_exists(tracefs, c, e) for (c, e) in bpf.all_tracepoints()}


def missing_tracepoint(tracefs: str, programs: Iterable[str]) -> str | None:
    """The first tracepoint of `programs` that tracefs lacks, as "category/event", else None."""
    for name in programs:
        for category, event in bpf.PROGRAMS[name].tracepoints:
            if not tracepoint_exists(tracefs, category, event):
                return f"{category}/{event}"
    return None
