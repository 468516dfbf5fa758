"""Read the kubelet CPU manager's checkpoint (`cpu_manager_state`) to learn which CPUs it owns.

With the static policy the kubelet gives Guaranteed containers with integer CPU requests
dedicated ("exclusive") CPUs and keeps everyone else on `defaultCpuSet`. perfbalance must never
put another container on those CPUs, so it reads this file every cycle. It never writes it (the
kubelet owns it and verifies its checksum; a foreign write makes the kubelet refuse to start).

Formats accepted (keys case-insensitive, unknown keys ignored, checksum not verified):
- V1: `{"policyName", "defaultCpuSet", "entries": {containerID: cpus}}` (kubelet <= 1.17);
  entries are keyed by container id, kept as ("", <container id>);
- V2: `"entries": {podUID: {containerName: cpus}}`;
- V3: the same shape under `"podEntries"` (merged with `entries`);
- V4: `{"data": "<a JSON string holding one of the above>"}`.

A missing file means the CPU manager is off (policy "none"). A half-written, garbled or newer
file is a KubeletStateError naming the file and the problem; `KubeletStateReader` keeps the last
good state in force when that happens.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from perfbalance.cpuset import CpuSet
from perfbalance.errors import ParseError
from perfbalance.model import KubeletState
from perfbalance.safefs import read_file

log = logging.getLogger(__name__)

STATE_FILE = "cpu_manager_state"
MAX_STATE_BYTES = 4 << 20
MAX_VERSION = 4
KNOWN_POLICIES = ("none", "static")


class KubeletStateError(ParseError):
    """cpu_manager_state could not be understood; the last good state should stay in force."""

    def __init__(self, path: str, problem: str, value: object = "") -> None:
        super().__init__("kubelet cpu_manager_state", value, problem, source=path)
        self.path, self.problem = path, problem


def _lower_keys(d: Mapping[str, Any], path: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = str(k).lower()
        if key in out:
            raise KubeletStateError(path, f"key {key!r} appears twice with different case", k)
        out[key] = v
    return out


def _version(doc: Mapping[str, Any], path: str) -> int | None:
    raw = doc.get("version", doc.get("apiversion"))
    if raw is None:
        return None
    text = str(raw)[:20].lower().removeprefix("v")
    if not (text.isascii() and text.isdigit()):  # "²".isdigit() is True but int("²") fails
        raise KubeletStateError(path, "unrecognised version", raw)
    if int(text) > MAX_VERSION:
        raise KubeletStateError(path, f"version {raw} is newer than supported (V1-V{MAX_VERSION})", raw)
    return int(text)


def _unwrap_data(doc: dict[str, Any], path: str) -> dict[str, Any]:
    """V4: the payload is a JSON document inside the `data` string."""
    data = doc.get("data")
    if data is None:
        return doc
    if not isinstance(data, str):
        raise KubeletStateError(path, "'data' must be a JSON string (V4)", type(data).__name__)
    try:
        inner = json.loads(data)
    except json.JSONDecodeError as e:
        raise KubeletStateError(path, f"'data' is not JSON ({e.msg} at {e.pos})", data[:80]) from None
    except (ValueError, RecursionError) as e:  # huge integer literal, nesting beyond the decoder
        raise KubeletStateError(path, f"'data' is not usable JSON ({type(e).__name__})", data[:80]) from None
    if not isinstance(inner, Mapping):
        raise KubeletStateError(path, "'data' must hold a JSON object", data[:80])
    merged = {**{k: v for k, v in doc.items() if k != "data"}, **_lower_keys(inner, path)}
    _version(merged, path)
    return merged


def _cpus(text: Any, path: str, where: str) -> CpuSet:
    if not isinstance(text, str):
        raise KubeletStateError(path, f"{where} must be a CPU list string", text)
    try:
        return CpuSet.parse(text, source=f"{path}: {where}")
    except ParseError as e:
        raise KubeletStateError(path, f"{where}: {e.reason}", text) from None


def _entries(raw: Any, path: str, key: str) -> dict[tuple[str, str], CpuSet]:
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise KubeletStateError(path, f"{key!r} must be an object", type(raw).__name__)
    out: dict[tuple[str, str], CpuSet] = {}
    for outer, inner in raw.items():
        if isinstance(inner, str):  # V1: container id -> cpus
            out[("", str(outer))] = _cpus(inner, path, f"{key}.{outer}")
        elif isinstance(inner, Mapping):  # V2+: pod uid -> container name -> cpus
            for name, cpus in inner.items():
                out[(str(outer), str(name))] = _cpus(cpus, path, f"{key}.{outer}.{name}")
        else:
            raise KubeletStateError(path, f"{key}.{outer} must be a string or an object", inner)
    return out


def parse_cpu_manager_state(text: str, *, path: str = STATE_FILE) -> KubeletState:
    """Pure: the checkpoint text -> KubeletState (see the module docstring for formats)."""
    if not text.strip():
        raise KubeletStateError(path, "file is empty (being written?)")
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as e:
        raise KubeletStateError(path, f"not JSON ({e.msg} at line {e.lineno} column {e.colno}; "
                                      "half-written?)", text[max(0, e.pos - 20): e.pos + 20]) from None
    except (ValueError, RecursionError) as e:  # huge integer literal, nesting beyond the decoder
        raise KubeletStateError(path, f"not usable JSON ({type(e).__name__}: {str(e)[:80]})") from None
    if not isinstance(raw, Mapping):
        raise KubeletStateError(path, "top level must be a JSON object", type(raw).__name__)
    doc = _lower_keys(raw, path)
    _version(doc, path)
    doc = _unwrap_data(doc, path)
    policy = doc.get("policyname")
    if not isinstance(policy, str) or not policy:
        raise KubeletStateError(path, "no 'policyName': not a CPU manager checkpoint", sorted(doc))
    policy = policy.lower()
    if policy not in KNOWN_POLICIES:
        log.warning("%s: unknown CPU manager policy %r; reading its entries as exclusive", path, policy)
    default = _cpus(doc.get("defaultcpuset", ""), path, "defaultCpuSet")
    exclusive = {**_entries(doc.get("entries"), path, "entries"),
                 **_entries(doc.get("podentries"), path, "podEntries")}
    if policy == "none":
        exclusive = {}
    return KubeletState(policy=policy, default_cpuset=default, exclusive=exclusive)


def state_path(kubelet_root: str) -> str:
    return os.path.join(kubelet_root, STATE_FILE)


def read_cpu_manager_state(kubelet_root: str) -> KubeletState:
    """Read `<kubelet_root>/cpu_manager_state`; missing file -> policy none."""
    path = state_path(kubelet_root)
    try:
        raw = read_file(path, MAX_STATE_BYTES)
    except FileNotFoundError:
        return KubeletState()
    except OverflowError:
        raise KubeletStateError(path, f"larger than {MAX_STATE_BYTES} bytes") from None
    except OSError as e:
        raise KubeletStateError(path, f"cannot read ({e.strerror})") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise KubeletStateError(path, f"not UTF-8 (byte {e.start})") from None
    return parse_cpu_manager_state(text, path=path)


@dataclass
class KubeletStateReader:
    """Re-reads the checkpoint each cycle; on error keeps the last good state and says why once."""

    kubelet_root: str
    state: KubeletState = field(default_factory=KubeletState)
    last_error: KubeletStateError | None = None
    errors_total: int = 0

    def read(self) -> KubeletState:
        try:
            new = read_cpu_manager_state(self.kubelet_root)
        except KubeletStateError as e:
            self.errors_total += 1
            if self.last_error is None or str(e) != str(self.last_error):
                log.warning("%s; keeping the last good CPU manager state (policy %s)", e, self.state.policy)
            self.last_error = e
            return self.state
        if self.last_error is not None:
            log.info("%s readable again (policy %s)", state_path(self.kubelet_root), new.policy)
        self.last_error, self.state = None, new
        return new
