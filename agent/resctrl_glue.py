"""RDT on this node: the resctrl manager, its actuator and monitoring, or nothing, with a reason.

`resctrl.rdt: off` never touches resctrl; `auto` uses it when mounted; `on` makes startup fail
clearly when it is unusable (cri-resource-manager's tri-state knob).
"""

from __future__ import annotations

import logging
from typing import Any

from agent.config import Config
from perfbalance.errors import FeatureUnavailable
from perfbalance.host import HostPaths

log = logging.getLogger("perfbalance.resctrl")


def make_resctrl(config: Config, host: HostPaths) -> Any:
    if config.resctrl.rdt == "off":
        return None
    from resctrl.info import find_mount

    mount = find_mount(host.procfs)
    if mount is None:
        if config.resctrl.rdt == "on":
            raise FeatureUnavailable("resctrl", "resctrl.rdt is 'on' but resctrl is not mounted")
        log.info("resctrl not mounted: RDT classes and monitoring off (resctrl.rdt: auto)")
        return None
    raise FeatureUnavailable("resctrl", "wiring pending")
