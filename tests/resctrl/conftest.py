"""Fixtures for the resctrl tests: the FUSE emulator per hardware variant, real threaded processes.

This machine has no RDT hardware. The emulator (tests/resctrl/emulator) runs the same code path
the agent runs on a real mount: open/write/read/mkdir/rmdir/flock on a mounted filesystem, with
the kernel's validation and errors. Processes are real (python with threads) and their thread ids
are checked by the emulator against /proc like the kernel does.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from emulator import Emulator
from rchelpers import Threaded


def _fuse_usable() -> str:
    if not os.path.exists("/dev/fuse"):
        return "no /dev/fuse"
    if shutil.which("fusermount3") is None:
        return "fusermount3 not installed (apt fuse3)"
    return ""


@pytest.fixture
def emulator() -> Iterator[Callable[..., Emulator]]:
    """emulator("full", num_closids=4) -> a mounted Emulator; all unmounted at the end."""
    why = _fuse_usable()
    if why:
        pytest.skip(f"resctrl emulator needs FUSE: {why}")
    started: list[Emulator] = []
    bases: list[str] = []

    def start(name: str, **overrides: object) -> Emulator:
        base = tempfile.mkdtemp(prefix=f"pbtest-resctrl-{os.getpid()}-")
        bases.append(base)
        emu = Emulator(Path(base), name, **overrides)
        started.append(emu)
        return emu.start()

    try:
        yield start
    finally:
        for emu in started:
            emu.stop()
        for base in bases:
            shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def threaded() -> Iterator[Callable[[int], Threaded]]:
    procs: list[Threaded] = []

    def spawn(threads: int = 4) -> Threaded:
        p = Threaded(threads)
        procs.append(p)
        return p

    try:
        yield spawn
    finally:
        for p in procs:
            p.stop()
