"""Collectors: each contributes per-container metrics to one timestamped sample window.

A collector is started once, asked to `collect()` once per interval with the containers of this
window, and reports whether it is up and why not. It never crashes the agent: when it cannot
start (no PMU, no resctrl, no BPF) it says so once and returns nothing.
"""
