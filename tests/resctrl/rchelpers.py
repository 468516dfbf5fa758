"""Helpers shared by the resctrl tests (a module of its own: conftest is not importable by name)."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml

from agent.act.rdt import RdtNode
from agent.wiring import Parts
from emulator import Emulator
from perfbalance.settings import build
from resctrl.config import ResctrlConfig
from resctrl.setup import ResctrlSetup, open_resctrl

@contextmanager
def full_emulator(path: Path) -> Iterator[Emulator]:
    """The emulator of a full RDT machine at `path`, stopped on the way out (skip without FUSE)."""
    if not os.path.exists("/dev/fuse"):
        pytest.skip("resctrl emulator needs /dev/fuse")
    e = Emulator(path, "full").start()
    try:
        yield e
    finally:
        e.stop()


def emulated_parts(emu: Emulator, made: list[Parts] | None = None) -> Callable[..., Parts]:
    """An agent parts factory whose resctrl mount table and caches are the emulator's; each part
    built is appended to `made` when given."""

    class EmulatedRdt(Parts):
        def _make_resctrl(self) -> RdtNode:
            host = dataclasses.replace(self.host, procfs=str(emu.procfs), sysfs=str(emu.sysfs))
            return RdtNode(self.config, host, self.cgfs, source="t.yaml")

    def factory(c: Any, n: Any, s: Any) -> Parts:
        part = EmulatedRdt(c, n, config_source=s)
        if made is not None:
            made.append(part)
        return part

    return factory


THREADS_SRC = """
import sys, threading, time
n = int(sys.argv[1])
for _ in range(n):
    threading.Thread(target=time.sleep, args=(3600,), daemon=True).start()
print("ready", flush=True)
for line in sys.stdin:
    if line.strip() == "more":
        threading.Thread(target=time.sleep, args=(3600,), daemon=True).start()
        print("ready", flush=True)
"""



class Threaded:
    """A real python process with several threads (all sleeping: no CPU)."""

    def __init__(self, threads: int) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", THREADS_SRC, str(threads)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None and self.proc.stdout.readline().strip() == "ready"

    @property
    def pid(self) -> int:
        return self.proc.pid

    def tids(self) -> list[int]:
        return sorted(int(t) for t in os.listdir(f"/proc/{self.pid}/task"))

    def spawn_thread(self) -> None:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write("more\n")
        self.proc.stdin.flush()
        assert self.proc.stdout.readline().strip() == "ready"

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()



def config(text: str) -> ResctrlConfig:
    return build(ResctrlConfig, yaml.safe_load(text) or {}, source="test.yaml", path="resctrl")


def open_on(emu: Emulator, text: str = "") -> ResctrlSetup:
    return open_resctrl(config(text), procfs=str(emu.procfs), sysfs=str(emu.sysfs), source="test.yaml")
