"""Names that become paths, labels or source text: one check, used wherever a name is validated.

A class name (RDT, block I/O, real time) becomes one directory level below a hierarchy the agent
writes; a resctrl group prefix is the start of such a level; a cgroup or control-file name is one
path element; a label value goes to the API server; a C identifier goes into a BPF program. Every
rule is applied with `fullmatch`: with `re.match`, `$` also matches before a final newline, so
"gold\\n" would pass as "gold" and then be written with its newline (Python `re` documentation,
"$": "or just before the newline at the end of the string").
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class NameRule:
    """What one kind of name may be: a pattern (matched whole), in words, and reserved forms."""

    kind: str
    pattern: re.Pattern[str]
    says: str
    reserved: frozenset[str] = frozenset()  # whole names that are not allowed
    reserved_prefixes: tuple[str, ...] = ()


CLASS = NameRule(kind="class name", pattern=re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,62}"),
                 says="letters, digits, '_' and '-', starting with a letter or digit, at most 63 characters")
GROUP_PREFIX = NameRule(kind="group prefix", pattern=re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,31}"),
                        says="letters, digits, '_', '-' or '.', starting with a letter or digit, at most "
                             "32 characters, not starting with 'info' or 'mon_'",
                        reserved_prefixes=("info", "mon_"))
# One path element as the kernel allows it, minus control characters (they cannot be logged or
# labelled safely): no '/', not '.' or '..', at most NAME_MAX (255) bytes.
PATH_ELEMENT = NameRule(kind="path element", pattern=re.compile(r"[^/\x00-\x1f\x7f]{1,255}"),
                        says="one path element (no '/', at most 255 characters), not '.' or '..'",
                        reserved=frozenset({".", ".."}))
LABEL_VALUE = NameRule(kind="label value", pattern=re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?"),
                       says="at most 63 letters, digits, '-', '_' or '.', alphanumeric at both ends")
# A Kubernetes qualified name (annotation and label keys): [DNS-subdomain prefix/]name.
QUALIFIED_NAME = NameRule(kind="annotation or label key",
                          pattern=re.compile(r"([A-Za-z0-9][A-Za-z0-9.-]{0,252}/)?[A-Za-z0-9]([A-Za-z0-9_.-]{0,61}[A-Za-z0-9])?"),
                          says="a Kubernetes annotation key ([prefix/]name)")
C_IDENTIFIER = NameRule(kind="C identifier", pattern=re.compile(r"[A-Za-z_][A-Za-z0-9_]*"),
                        says="letters, digits and '_', not starting with a digit")


def name_problem(name: object, rule: NameRule = CLASS) -> str | None:
    """Why `name` cannot be a name of `rule`'s kind, or None when it can."""
    if not isinstance(name, str):
        return f"{name!r} is not a string"
    if any(ord(ch) < 32 or ord(ch) == 127 for ch in name):
        return f"{name!r} is not allowed: it contains control characters"
    if rule is not QUALIFIED_NAME and ("/" in name or ".." in name.split("/")):
        return f"{name!r} is not allowed: it contains '/' or '..'"
    reserved = name in rule.reserved or bool(rule.reserved_prefixes and name.startswith(rule.reserved_prefixes))
    if reserved or not rule.pattern.fullmatch(name):
        return f"{name!r} is not allowed: {rule.says}"
    return None


def is_name(name: object, rule: NameRule = CLASS) -> bool:
    return name_problem(name, rule) is None


__all__ = ["C_IDENTIFIER", "CLASS", "GROUP_PREFIX", "LABEL_VALUE", "NameRule", "PATH_ELEMENT",
           "QUALIFIED_NAME", "is_name", "name_problem"]
