"""A kernel-faithful resctrl emulator for the tests (FUSE, see model.py for what it models).

`Emulator.start(...)` mounts the variant at a temporary directory in a subprocess and waits until
the mount answers; `stop()` unmounts with `fusermount3 -u` and reaps the process. The test drives
the monitoring counters through `set_counter()` and reads what was changed from `journal()`.
The emulator also writes what the node around it would show: a procfs `mounts` file naming the
mount as type resctrl with the variant's options, and a sysfs cache tree with the cache sizes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from .model import VARIANTS, Hardware, variant

HERE = Path(__file__).resolve().parent
__all__ = ["Emulator", "VARIANTS", "variant"]


class Emulator:
    def __init__(self, base: Path, name: str, **overrides: Any) -> None:
        self.name, self.overrides = name, overrides
        self.hw: Hardware = variant(name, **dict(overrides))
        self.mount = base / "resctrl"
        self.state = base / "state"
        self.procfs = base / "proc"
        self.sysfs = base / "sys"
        self.proc: subprocess.Popen[bytes] | None = None
        self.counters: dict[str, dict[str, dict[str, Any]]] = {}

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> Emulator:
        for d in (self.mount, self.state, self.procfs):
            d.mkdir(parents=True, exist_ok=True)
        self._write_node_files()
        cmd = [sys.executable, str(HERE / "fusefs.py"), "--mount", str(self.mount), "--variant",
               self.name, "--state", str(self.state), "--overrides", json.dumps(self.overrides)]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=open(self.state / "stderr.log", "wb"))
        deadline = time.monotonic() + 20
        while not os.path.ismount(self.mount):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"resctrl emulator did not mount: {(self.state / 'stderr.log').read_text()}")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        if os.path.ismount(self.mount):
            subprocess.run(["fusermount3", "-u", "-z", str(self.mount)], check=False,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if self.proc is not None:
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.proc = None

    # -- control API -------------------------------------------------------------------------

    def set_counter(self, group: str, event: str, value: int | str, domain: int | None = None) -> None:
        """Set a group's own counter ("" root, "g", "g/mon_groups/m"); domain None: every domain."""
        assert self.hw.mon is not None, f"variant {self.name} has no monitoring"
        domains = self.hw.mon.domains if domain is None else (domain,)
        per = self.counters.setdefault(group, {}).setdefault(event, {})
        for d in domains:
            per[str(d)] = value
        tmp = self.state / "counters.json.tmp"
        tmp.write_text(json.dumps(self.counters))
        os.replace(tmp, self.state / "counters.json")

    def journal(self) -> list[str]:
        path = self.state / "journal.log"
        return path.read_text().splitlines() if path.exists() else []

    def last_cmd_status(self) -> str:
        return (self.mount / "info" / "last_cmd_status").read_text().strip()

    # -- the node around the mount -------------------------------------------------------------

    def _write_node_files(self) -> None:
        opts = ",".join(["rw", "relatime", *self.hw.options])
        (self.procfs / "mounts").write_text(
            "sysfs /sys sysfs rw,nosuid,nodev,noexec,relatime 0 0\n"
            f"resctrl {self.mount} resctrl {opts} 0 0\n")
        levels = {c.level: c.domains for c in self.hw.caches}
        if self.hw.mon:
            levels.setdefault(3, self.hw.mon.domains)
        for cpu in range(self.hw.cpus):
            for index, (level, domains) in enumerate(sorted(levels.items(), reverse=True)):
                d = self.sysfs / f"devices/system/cpu/cpu{cpu}/cache/index{index + 2}"
                d.mkdir(parents=True, exist_ok=True)
                size_kib = self.hw.cache_bytes[level] // 1024
                dom = domains[cpu * len(domains) // self.hw.cpus]
                for name, value in (("level", level), ("type", "Unified"), ("id", dom), ("size", f"{size_kib}K")):
                    (d / name).write_text(f"{value}\n")
