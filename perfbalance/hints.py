"""Placement hints from pod annotations: AVX-512 pre-classification, affinity and anti-affinity.

Measurement needs a window before it can call a container AVX-512-heavy; an annotation lets the
owner say so up front (`perfbalance.io/avx512: "true"`), and measurement takes over after the
planner's usual smoothing. Affinity and anti-affinity name other containers by pod labels and/or
container name, with a scope (core, l3, numa) and a weight in the cost model's unit (core-seconds
per second); anti-affinity marked hard is a constraint, not a cost. Grammar (docs/classes.md):

    perfbalance.io/anti-affinity: "app=db@numa*0.5; container=cache@core!"
    perfbalance.io/affinity: "app=web,tier=front@l3"

    term     := selector "@" scope ["*" weight] ["!"]     (terms separated by ";")
    selector := key=value {"," key=value}                 (pod labels; the key `container` is the
                                                           container name)

A pod-level key applies to every container of the pod, `<key>.container.<name>` to one. Values
that do not parse are reported by the agent naming the pod, the key and the value, and ignored by
the planner (pure functions here, used by both).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from perfbalance.model import Container
from perfbalance.names import LABEL_VALUE, QUALIFIED_NAME, is_name

Scope = Literal["core", "l3", "numa"]
SCOPES: tuple[Scope, ...] = ("core", "l3", "numa")
DEFAULT_WEIGHT = 0.1  # core-seconds per second: about the gain of one typical separation
# Label keys/values as Kubernetes allows them ([prefix/]name, values up to 63 characters).
_TRUE, _FALSE = ("true", "yes", "1", "on"), ("false", "no", "0", "off")


@dataclass(frozen=True, kw_only=True)
class AffinityTerm:
    kind: Literal["affinity", "anti-affinity"]
    labels: tuple[tuple[str, str], ...] = ()
    container: str = ""  # container name ("" matches any)
    scope: Scope = "l3"
    weight: float = DEFAULT_WEIGHT
    hard: bool = False

    def matches(self, c: Container) -> bool:
        if self.container and c.name != self.container:
            return False
        return all(c.labels.get(k) == v for k, v in self.labels)

    def describe(self) -> str:
        sel = ",".join([f"{k}={v}" for k, v in self.labels] + ([f"container={self.container}"] if self.container else []))
        return f"{sel}@{self.scope}!" if self.hard else f"{sel}@{self.scope}*{self.weight:g}"  # hard: no weight


def lookup(c: Container, key: str) -> tuple[str, str] | None:
    """(key used, value): the container-level key `<key>.container.<name>` first, then `key`."""
    for k in ((f"{key}.container.{c.name}",) if c.name else ()) + (key,):
        if k in c.annotations:
            return k, c.annotations[k]
    return None


def parse_bool(value: str) -> bool:
    v = value.strip().lower()
    if v in _TRUE:
        return True
    if v in _FALSE:
        return False
    raise ValueError(f"expected true or false, not {value!r}")


def parse_affinity(value: str, kind: Literal["affinity", "anti-affinity"]) -> tuple[AffinityTerm, ...]:
    """The terms of one annotation value; ValueError saying which term and why."""
    terms = [t.strip() for t in value.split(";")]
    if not any(terms):
        raise ValueError("no term (expected e.g. 'app=db@numa*0.5')")
    return tuple(_term(t, kind) for t in terms if t)


def _term(text: str, kind: Literal["affinity", "anti-affinity"]) -> AffinityTerm:
    sel, at, rest = text.partition("@")
    if not at:
        raise ValueError(f"term {text!r}: missing '@scope' (core, l3 or numa)")
    hard = rest.endswith("!")
    scope, star, weight_text = rest.removesuffix("!").partition("*")
    if scope not in SCOPES:
        raise ValueError(f"term {text!r}: scope {scope!r} is not one of core, l3, numa")
    if hard and kind == "affinity":
        raise ValueError(f"term {text!r}: only anti-affinity can be hard ('!')")
    weight = _weight(weight_text, text) if star else DEFAULT_WEIGHT
    labels, container = _selector(sel, text)
    return AffinityTerm(kind=kind, labels=labels, container=container, scope=scope,  # type: ignore[arg-type]
                        weight=weight, hard=hard)


def _weight(text: str, term: str) -> float:
    try:
        w = float(text)
    except ValueError:
        raise ValueError(f"term {term!r}: weight {text!r} is not a number") from None
    if not math.isfinite(w) or w <= 0 or w > 100:
        raise ValueError(f"term {term!r}: weight {text!r} must be in (0, 100]")
    return w


def _selector(sel: str, term: str) -> tuple[tuple[tuple[str, str], ...], str]:
    labels, container = [], ""
    for part in (p.strip() for p in sel.split(",")):
        k, eq, v = part.partition("=")
        k, v = k.strip(), v.strip()
        if not eq or not is_name(k, QUALIFIED_NAME) or not is_name(v, LABEL_VALUE):
            raise ValueError(f"term {term!r}: selector {part!r} is not label=value or container=name")
        if k == "container":
            container = v
        else:
            labels.append((k, v))
    if not labels and not container:
        raise ValueError(f"term {term!r}: empty selector")
    return tuple(sorted(labels)), container


@dataclass(frozen=True, kw_only=True)
class HintKeys:
    avx512: str = "perfbalance.io/avx512"
    affinity: str = "perfbalance.io/affinity"
    anti_affinity: str = "perfbalance.io/anti-affinity"


def avx512_hint(c: Container, keys: HintKeys) -> bool | None:
    """The container's AVX-512 annotation (None: absent or unparsable)."""
    got = lookup(c, keys.avx512)
    if got is None:
        return None
    try:
        return parse_bool(got[1])
    except ValueError:
        return None


def affinity_terms(c: Container, keys: HintKeys) -> tuple[AffinityTerm, ...]:
    """Both kinds of terms of a container; an unparsable annotation contributes nothing."""
    out: list[AffinityTerm] = []
    for key, kind in ((keys.affinity, "affinity"), (keys.anti_affinity, "anti-affinity")):
        got = lookup(c, key)
        if got is None:
            continue
        try:
            out += parse_affinity(got[1], kind)  # type: ignore[arg-type]
        except ValueError:
            continue
    return tuple(out)


def problems(c: Container, keys: HintKeys) -> list[str]:
    """One line per unparsable hint annotation, naming the pod, the key and the value."""
    out = []
    checks = ((keys.avx512, parse_bool), (keys.affinity, lambda v: parse_affinity(v, "affinity")),
              (keys.anti_affinity, lambda v: parse_affinity(v, "anti-affinity")))
    for key, parse in checks:
        got = lookup(c, key)
        if got is None:
            continue
        try:
            parse(got[1])
        except ValueError as e:
            out.append(f"{_who(c)}: annotation {got[0]}={got[1]!r}: {e}; ignored")
    return out


def _who(c: Container) -> str:
    if c.pod:
        return f"pod {c.namespace + '/' if c.namespace else ''}{c.pod} container {c.name or c.id[:12]}"
    return f"container {c.id[:64]}"

