"""Decoded JSON read field by field, each error naming the field path and the value.

A snapshot file comes from outside (`perfbalance plan FILE`), so it may hold anything JSON can:
integer literals longer than Python converts (its int-str limit of 4300 digits makes `json`
raise ValueError), nesting deeper than the decoder's recursion limit (RecursionError),
`1e999` (infinity), values of the wrong type. `loads` turns the first two into a ParseError
naming where they are; the readers check type and range of one value at `At(path)` so that
`containers[3].metrics.cpu` is in the message, never a traceback.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from perfbalance.cpuset import CpuSet
from perfbalance.errors import ParseError

I64 = (-(1 << 63), (1 << 63) - 1)
MAX_INT_DIGITS = 40  # longer than any value in range; such literals are not converted at all
MAX_DEPTH = 256  # deeper nesting is reported, with the path to it, when the decoder gives up
_SHOWN_LEVELS = 6  # path components shown for a too-deep value
_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{},:]')


class LongInt:
    """An integer literal of more than MAX_INT_DIGITS digits, kept unconverted."""

    __slots__ = ("digits",)

    def __init__(self, digits: int) -> None:
        self.digits = digits

    def __repr__(self) -> str:
        return f"<integer of {self.digits} digits>"


class JsonSyntaxError(ParseError):
    """The text is not JSON at all (as opposed to JSON the decoder cannot hold)."""


@dataclass(frozen=True)
class At:
    """Where a value sits: its source (a file name) and its field path in the document."""

    source: str = ""
    path: str = ""

    def key(self, name: str) -> At:
        return At(self.source, f"{self.path}.{name}" if self.path else name)

    def index(self, i: int) -> At:
        return At(self.source, f"{self.path}[{i}]")

    def error(self, value: object, reason: str) -> ParseError:
        return ParseError(self.path or "document", value, reason, source=self.source)


def loads(text: str, *, source: str = "") -> Any:
    """json.loads, with long integer literals kept as LongInt and the two decoder failures
    that are not syntax errors (too long an integer, too deep a nesting) as ParseError."""
    try:
        return json.loads(text, parse_int=_parse_int)
    except json.JSONDecodeError as e:
        raise JsonSyntaxError("JSON", text[:80], f"not JSON ({e})", source=source) from None
    except RecursionError:
        raise _too_deep(text, source) from None
    except ValueError as e:
        raise ParseError("JSON", text[:80], f"not usable JSON ({e})", source=source) from None


def _parse_int(literal: str) -> int | LongInt:
    digits = len(literal.lstrip("-"))
    return int(literal) if digits <= MAX_INT_DIGITS else LongInt(digits)


def _too_deep(text: str, source: str) -> ParseError:
    """The field path (first few levels) where nesting passes MAX_DEPTH."""
    stack: list[list[Any]] = []  # [bracket, key or index]
    pending = ""
    for m in _TOKEN.finditer(text):
        tok = m.group()
        if tok in "[{":
            stack.append([tok, 0 if tok == "[" else None])
            if len(stack) > MAX_DEPTH:
                path = "".join(_step(k, v) for k, v in stack[:_SHOWN_LEVELS]).lstrip(".")
                return ParseError(path + "...", text[m.start():m.start() + 20],
                                  f"JSON nested deeper than {MAX_DEPTH} levels", source=source)
        elif tok in "]}":
            stack = stack[:-1]
        elif tok == "," and stack and stack[-1][0] == "[":
            stack[-1][1] += 1
        elif tok == ":" and stack:
            stack[-1][1] = pending
        elif tok.startswith('"'):
            pending = tok[1:-1]
    return ParseError("JSON", text[:20], "nested too deep for the decoder", source=source)


def _step(bracket: str, where: Any) -> str:
    return f"[{where}]" if bracket == "[" else f".{where}" if where is not None else ""


# -- readers: one value, its type and range ---------------------------------------------------

def obj(v: Any, at: At) -> Mapping[str, Any]:
    if not isinstance(v, Mapping):
        raise at.error(_kind(v), "must be an object")
    return v


def arr(v: Any, at: At) -> Sequence[Any]:
    if not isinstance(v, list):
        raise at.error(_kind(v), "must be a list")
    return v


def integer(v: Any, at: At, *, lo: int = I64[0], hi: int = I64[1]) -> int:
    """An integer in lo..hi (integral floats and decimal strings convert, as int() does)."""
    if isinstance(v, LongInt):
        raise at.error(v, f"out of range {lo}..{hi}")
    if isinstance(v, bool) or not isinstance(v, (int, float, str)):
        raise at.error(_kind(v), "must be an integer")
    try:
        i = int(v)
    except (ValueError, OverflowError):  # "x", a 5000-digit string, NaN, infinity
        raise at.error(v, "must be an integer") from None
    if not lo <= i <= hi:
        raise at.error(v, f"out of range {lo}..{hi}")
    return i


def number(v: Any, at: At) -> float:
    """A finite number (decimal strings convert, as float() does)."""
    if isinstance(v, LongInt):
        raise at.error(v, "too large")
    if isinstance(v, bool) or not isinstance(v, (int, float, str)):
        raise at.error(_kind(v), "must be a number")
    try:
        f = float(v)
    except (ValueError, OverflowError):  # "noon"; int beyond float range
        raise at.error(v, "must be a number") from None
    if not math.isfinite(f):
        raise at.error(v, "must be finite")
    return f


def metric(v: Any, at: At) -> float:
    """A measured value: a finite JSON number (strings are not numbers here)."""
    if isinstance(v, (bool, str)):
        raise at.error(v, "must be a number")
    return number(v, at)


def text(v: Any, at: At) -> str:
    """A string; other scalars convert as str() does, objects and lists are refused."""
    if isinstance(v, (Mapping, list, LongInt)):
        raise at.error(_kind(v), "must be a string")
    return v if isinstance(v, str) else str(v)


def strings(v: Any, at: At) -> dict[str, str]:
    """An object of strings (annotations, labels)."""
    return {str(k): text(x, at.key(str(k))) for k, x in obj(v, at).items()}


def cpus(v: Any, at: At) -> CpuSet:
    """A CPU (or NUMA node) list in the kernel's syntax, "0-3,8"."""
    s = text(v, at)
    try:
        return CpuSet.parse(s)
    except ParseError as e:
        raise at.error(s, f"{e.what}: {e.reason}") from None


def _kind(v: Any) -> object:
    """A short stand-in for a value too big to show (objects, lists)."""
    if isinstance(v, Mapping):
        return f"<object of {len(v)} keys>"
    if isinstance(v, list):
        return f"<list of {len(v)} items>"
    return v
