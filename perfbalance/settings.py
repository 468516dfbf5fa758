"""Typed, validated configuration sections built from plain YAML mappings.

Each part of perfbalance declares its configuration as a frozen keyword-only dataclass whose
fields are made with `setting(...)` (default, doc, bounds). `build()` turns a mapping into that
dataclass, checking every value and rejecting unknown keys; errors name the file, the key path
and the value. `reference()` renders the documentation table of docs/config.md from the same
declarations, so the reference cannot drift from the code.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from perfbalance.errors import ConfigError

T = TypeVar("T")
_MISSING = dataclasses.MISSING


def setting(default: Any = _MISSING, doc: str = "", *, factory: Callable[[], Any] | None = None,
            min: float | None = None, max: float | None = None,
            check: Callable[[Any], str | None] | None = None) -> Any:
    """A dataclass field with documentation and bounds. `check` returns an error text or None."""
    meta = {"doc": doc, "min": min, "max": max, "check": check}
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def build(cls: type[T], data: Any, *, source: str = "config", path: str = "") -> T:
    """Build dataclass `cls` from a mapping, validating every key and value."""
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise ConfigError(source, path, data, "must be a mapping")
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    by_name = {str(k): k for k in data}  # YAML keys may be ints, None, dates: name them as text
    unknown = sorted(set(by_name) - set(fields))
    if unknown:
        k = unknown[0]
        raise ConfigError(source, _join(path, k), data[by_name[k]],
                          f"unknown key (known: {', '.join(sorted(fields))})")
    hints = typing.get_type_hints(cls)
    kwargs: dict[str, Any] = {}
    for name, f in fields.items():
        if name not in data:
            continue
        kpath = _join(path, name)
        value = _convert(hints[name], data[name], source, kpath)
        _check_bounds(f, value, source, kpath)
        kwargs[name] = value
    try:
        return cls(**kwargs)
    except ConfigError:
        raise
    except (TypeError, ValueError) as e:
        raise ConfigError(source, path, dict(data), str(e)) from None


def to_dict(obj: Any) -> Any:
    """The plain-data form of a built configuration (for dumps and merges)."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, Mapping):
        return {str(k): to_dict(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_dict(v) for v in obj]
    return obj


def reference(cls: type, prefix: str = "") -> list[tuple[str, str, str, str]]:
    """(key path, type, default, doc) for every setting, nested sections flattened."""
    rows: list[tuple[str, str, str, str]] = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        kpath = _join(prefix, f.name)
        if isinstance(tp, type) and dataclasses.is_dataclass(tp):
            rows.extend(reference(tp, kpath))
            continue
        if f.default is not _MISSING:
            default = f.default
        elif f.default_factory is not _MISSING:
            default = f.default_factory()
        else:
            default = "(required)"
        rows.append((kpath, _type_name(tp), _show(to_dict(default)), f.metadata.get("doc", "")))
    return rows


# -- internals ------------------------------------------------------------------------------

def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _check_bounds(f: dataclasses.Field[Any], value: Any, source: str, path: str) -> None:
    lo, hi, check = f.metadata.get("min"), f.metadata.get("max"), f.metadata.get("check")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if lo is not None and value < lo:
            raise ConfigError(source, path, value, f"must be >= {lo}")
        if hi is not None and value > hi:
            raise ConfigError(source, path, value, f"must be <= {hi}")
    if check is not None:
        problem = check(value)
        if problem:
            raise ConfigError(source, path, value, problem)


def _convert(tp: Any, value: Any, source: str, path: str) -> Any:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _convert(arg, value, source, path)
            except ConfigError as e:
                errors.append(e.reason)
        raise ConfigError(source, path, value, " or ".join(errors))
    if origin is typing.Literal:
        if isinstance(value, bool) and {"on", "off"} <= set(args):
            # YAML 1.1 reads a bare on/off (and yes/no) as true/false: keep the user's word.
            value = "on" if value else "off"
        if value not in args:
            raise ConfigError(source, path, value, f"must be one of {', '.join(map(repr, args))}")
        return value
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(source, path, value, "must be a list")
        item = args[0] if args else Any
        return tuple(_convert(item, v, source, f"{path}[{i}]") for i, v in enumerate(value))
    if origin in (dict, Mapping) or origin is typing.get_origin(Mapping[str, int]):
        if not isinstance(value, Mapping):
            raise ConfigError(source, path, value, "must be a mapping")
        kt, vt = args if args else (str, Any)
        return {_convert(kt, k, source, path): _convert(vt, v, source, _join(path, str(k)))
                for k, v in value.items()}
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return build(tp, value, source=source, path=path)
    return _scalar(tp, value, source, path)


def _scalar(tp: Any, value: Any, source: str, path: str) -> Any:
    if tp is Any:
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(source, path, value, "must be true or false")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(source, path, value, "must be an integer")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(source, path, value, "must be a number")
        if value != value or value in (float("inf"), float("-inf")):
            raise ConfigError(source, path, value, "must be finite")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(source, path, value, "must be a string")
        return value
    raise ConfigError(source, path, value, f"unsupported setting type {tp!r}")


def _type_name(tp: Any) -> str:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        return " | ".join(_type_name(a) for a in args)
    if origin is typing.Literal:
        return " | ".join(repr(a) for a in args)
    if origin in (list, tuple):
        return f"list of {_type_name(args[0])}" if args else "list"
    if origin in (dict, Mapping) or (origin is not None and args and len(args) == 2):
        return f"map of {_type_name(args[0])} to {_type_name(args[1])}"
    if tp is type(None):
        return "null"
    return getattr(tp, "__name__", str(tp))


def _show(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return repr(v) if v else '""'
    return str(v)
