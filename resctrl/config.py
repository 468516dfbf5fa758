"""Configuration of RDT (the `resctrl:` section)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from perfbalance.settings import setting


@dataclass(frozen=True, kw_only=True)
class ResctrlConfig:
    rdt: Literal["on", "off", "auto"] = setting("auto", "on: fail startup when RDT is unusable; auto: use it when present; off: never touch resctrl.")
    group_prefix: str = setting("perfbalance.", "Prefix of every resctrl group perfbalance creates; it touches no other group.")
