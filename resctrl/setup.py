"""Startup: the tri-state `rdt: on | off | auto` knob turned into a running manager, or a reason.

`on` means the operator relies on RDT: startup fails (FeatureUnavailable) when resctrl is not
mounted, offers nothing, or has no allocation while classes are configured. `auto` uses what is
there and says what it skipped. `off` never touches the mount. A configuration the node cannot
honour (a hard requirement, an amount the kernel would refuse) is a ConfigError in every mode.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from perfbalance.errors import FeatureUnavailable, ParseError
from resctrl.config import ResctrlConfig
from resctrl.fs import ResctrlFs
from resctrl.info import MountInfo, ResctrlInfo, cache_sizes, find_mount, read_info
from resctrl.manager import ResctrlManager, StartReport
from resctrl.resolve import resolve


@dataclass(frozen=True, kw_only=True)
class ResctrlSetup:
    manager: ResctrlManager | None
    report: StartReport | None = None
    reason: str = ""  # why there is no manager (rdt off, not mounted, ...)


def open_resctrl(cfg: ResctrlConfig, *, procfs: str, sysfs: str, mount: MountInfo | None = None,
                 source: str = "config", cache_bytes: Mapping[tuple[int, int], int] | None = None) -> ResctrlSetup:
    """Discover, resolve, and start the manager. Raises FeatureUnavailable (rdt: on) or ConfigError."""
    if cfg.rdt == "off":
        return ResctrlSetup(manager=None, reason="rdt: off")
    info, why = _discover(procfs, mount)
    if info is not None and cfg.rdt == "on" and cfg.class_names() and not info.alloc_capable:
        info, why = None, f"rdt: on with classes configured, but this node has no RDT allocation (resctrl offers: {info.describe()})"
    if info is None:
        if cfg.rdt == "on":
            raise FeatureUnavailable("resctrl", why)
        return ResctrlSetup(manager=None, reason=why)
    resolution = resolve(cfg, info, cache_bytes=cache_sizes(sysfs) if cache_bytes is None else cache_bytes, source=source)
    manager = ResctrlManager(fs=ResctrlFs(mount=info.mount), info=info, resolution=resolution, prefix=cfg.group_prefix,
                             monitor_containers=cfg.monitor_containers, max_mon_groups=cfg.max_mon_groups)
    return ResctrlSetup(manager=manager, report=manager.start())


def _discover(procfs: str, mount: MountInfo | None) -> tuple[ResctrlInfo | None, str]:
    mount = mount or find_mount(procfs)
    if mount is None:
        return None, f"resctrl is not mounted (no resctrl line in {procfs}/mounts; mount -t resctrl resctrl /sys/fs/resctrl)"
    try:
        info = read_info(mount)
    except FeatureUnavailable as e:
        return None, e.reason
    except (ParseError, OSError) as e:  # a malformed or unreadable info file: say which, run without
        return None, f"resctrl at {mount.path} unreadable: {e}"
    if not info.alloc_capable and not info.mon_capable:
        return None, f"resctrl at {mount.path} offers neither allocation nor monitoring"
    return info, ""
