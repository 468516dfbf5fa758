"""Shared value types of perfbalance: CPU sets, topology, containers, snapshots and plans.

Everything that crosses a boundary between collectors, the planner and the actuators is one of
these immutable types, so that data flows one way and the planner can stay a pure function.
This package imports nothing else of perfbalance.
"""

try:  # written from git by setuptools-scm when the package is built or installed
    from perfbalance._version import __version__
except ImportError:  # a source tree never installed: ask the installed metadata, if any
    from importlib.metadata import PackageNotFoundError, version

    try:
        __version__ = version("perfbalance")
    except PackageNotFoundError:
        __version__ = "0+unknown"
