"""One BPF program that counts per key into a hash with per-CPU pending slots, as a collector's
lifecycle: what the avx512 and runqlat collectors share.

`CountingProgram.load` checks the node (`prepare`), compiles the program with the collector's
defines, and wraps the counts map in a `CountingMap` that reads the pending slots after it and
prunes keys of cgroups (or processes) that are gone; `close` detaches. The key kind is v2 cgroup
ids where the node can give them, process ids otherwise (or as the caller forces).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import bpf
from collectors.bpfenv.keys import KeyMap, KeyMaps, LiveKeys
from collectors.bpfenv.loader import prepare
from collectors.bpfenv.maps import CountingMap, PendingSlots
from collectors.bpfenv.rawtp import RawTracepoint, attach
from perfbalance.host import HostPaths
from perfbalance.model import CollectorStatus


class CountingProgram:
    """Base of a collector whose data is one BPF counting program (collectors.base.Collector's
    status and close; the subclass adds start and collect)."""

    def __init__(self, *, host: HostPaths, cgroupfs: Any, pid_keys: bool | None, keymaps: KeyMaps | None) -> None:
        self.host, self.cgroupfs = host, cgroupfs
        self._force_pid_keys = pid_keys
        self.keymaps = keymaps  # shared with the other BPF collectors: one walk per cycle
        self._bpf: Any = None
        self._raw: RawTracepoint | None = None  # a tp_btf program of the object, attached by us
        self._map: CountingMap | None = None
        self._keys: KeyMap | None = None
        self._status = CollectorStatus(up=False, reason="not started")
        self.defines: dict[str, bpf.DefineValue] = {}

    def load(self, program: str, defines_of: Callable[[bool], dict[str, bpf.DefineValue]], *, counts: str,
             pending: str, counts_field: str, fields: Sequence[str], max_keys: int,
             ways_field: str | None = None, raw_tp: tuple[str, int, str] | None = None,
             **detail: Any) -> CollectorStatus:
        """Compile and attach bpf/<program>.bpf.c; `counts` is its hash, `pending` its array of
        not yet flushed counts (see PendingSlots for `ways_field`); `raw_tp` (function, BTF id of btf_trace_<event>, event):
        a function of it to attach as a tp_btf program (bcc attaches the TRACEPOINT_PROBEs).
        Raises FeatureUnavailable, PerfbalanceError or OSError."""
        env = prepare(self.host, need=[program])
        pid_keys = not env.cgroup_keys if self._force_pid_keys is None else self._force_pid_keys
        self.defines = defines_of(pid_keys)
        self._bpf = env.load(bpf.render(program, self.defines))
        if raw_tp is not None:
            try:
                self._raw = attach(self._bpf, raw_tp[0], btf_id=raw_tp[1], event=raw_tp[2])
            except BaseException:
                self._bpf.cleanup()
                self._bpf = None
                raise
        live = LiveKeys(self.cgroupfs, pid_keys=pid_keys, procfs=self.host.procfs)
        self._map = CountingMap(self._bpf[counts.encode()], fields=fields, batch=env.batch_reads,
                                max_keys=max_keys, live=live, name=counts,
                                pending=PendingSlots(self._bpf[pending.encode()], key_field="key",
                                                     counts_field=counts_field, fields=fields,
                                                     ways_field=ways_field))
        self._keys = (self.keymaps or KeyMaps(self.cgroupfs, procfs=self.host.procfs)).get(pid_keys=pid_keys)
        return self._set(True, "", source="bpf", keys="pid" if pid_keys else "cgroup_id",
                         headers=env.headers.source, headers_release=env.headers.release, **detail)

    def status(self) -> CollectorStatus:
        return self._status

    def close(self) -> None:
        if self._raw is not None:
            self._raw.close()
            self._raw = None
        if self._bpf is not None:
            self._bpf.cleanup()
            self._bpf = None
        self._map = None
        if self._status.up:
            self._set(False, "closed")

    def _set(self, up: bool, reason: str, **detail: Any) -> CollectorStatus:
        self._status = CollectorStatus(up=up, reason=reason, detail=detail)
        return self._status
