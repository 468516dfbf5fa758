"""The small error hierarchy of perfbalance.

Errors are raised at the boundary where a file or syscall is touched and carry the thing and the
value that went wrong, so that a log line or an `errors` entry of `perfbalance run --json` is
enough to act on.
"""

from __future__ import annotations

import errno as _errno


class PerfbalanceError(Exception):
    """Base of every error perfbalance raises on purpose."""


class ParseError(PerfbalanceError, ValueError):
    """Text from the kernel, a file or a user could not be parsed; says what and where."""

    def __init__(self, what: str, value: object, reason: str, *, source: str = "") -> None:
        self.what, self.value, self.reason, self.source = what, value, reason, source
        where = f" in {source}" if source else ""
        super().__init__(f"{what}{where}: {reason}: {_shown(value)}")


def _shown(value: object, limit: int = 200) -> str:
    """repr() of a value from outside, bounded: a message stays one readable line (repr of an
    int beyond the int-str limit raises ValueError, of absurd nesting RecursionError)."""
    try:
        r = repr(value)
    except (ValueError, RecursionError):
        r = f"<{type(value).__name__}>"
    return r if len(r) <= limit else r[:limit] + "..."


class ConfigError(PerfbalanceError, ValueError):
    """A configuration value is invalid: names the file, the key path and the value."""

    def __init__(self, source: str, path: str, value: object, reason: str) -> None:
        self.source, self.path, self.value, self.reason = source, path, value, reason
        super().__init__(f"{source}: {path or '<root>'}: {reason} (got {value!r})")


class FeatureUnavailable(PerfbalanceError):
    """A node feature (BPF, PMU, resctrl, ...) cannot be used here; `reason` says why."""

    def __init__(self, feature: str, reason: str) -> None:
        self.feature, self.reason = feature, reason
        super().__init__(f"{feature} unavailable: {reason}")


class ContainerGone(PerfbalanceError):
    """The container (or its cgroup or process) vanished while we were working on it."""

    def __init__(self, container: str, detail: str = "") -> None:
        self.container, self.detail = container, detail
        super().__init__(f"container {container} is gone" + (f": {detail}" if detail else ""))


_CPUSET_HINTS = {
    _errno.EACCES: "not a subset of the parent's cpuset (widen the parent first)",
    _errno.EBUSY: "a child cgroup uses CPUs outside the new set (shrink children first)",
    _errno.ENOSPC: "the set is empty for a cgroup that has tasks",
    _errno.EINVAL: "the kernel rejected the value (offline or nonexistent CPUs/nodes?)",
    _errno.ERANGE: "a CPU or node id beyond what this kernel has (nr_cpu_ids)",
}


class CpusetError(PerfbalanceError):
    """A cpuset write was refused by the kernel."""

    def __init__(self, err: int, container: str, path: str, value: str) -> None:
        self.errno, self.container, self.path, self.value = err, container, path, value
        name = _errno.errorcode.get(err, str(err))
        hint = _CPUSET_HINTS.get(err, "")
        super().__init__(
            f"cpuset write for {container} refused ({name}): {path} <- {value!r}"
            + (f": {hint}" if hint else "")
        )

    @property
    def permanent(self) -> bool:
        """EINVAL/ERANGE will not go away by retrying the same value; the others may."""
        return self.errno in (_errno.EINVAL, _errno.ERANGE)


class ResctrlError(PerfbalanceError):
    """A resctrl operation failed; carries the kernel's `info/last_cmd_status`."""

    def __init__(self, op: str, path: str, err: int, last_cmd_status: str = "") -> None:
        self.op, self.path, self.errno, self.last_cmd_status = op, path, err, last_cmd_status
        name = _errno.errorcode.get(err, str(err))
        status = f": last_cmd_status: {last_cmd_status.strip()}" if last_cmd_status.strip() else ""
        super().__init__(f"resctrl {op} {path} failed ({name}){status}")
