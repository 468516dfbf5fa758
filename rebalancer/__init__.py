"""The planner: a pure function from a Snapshot (plus config, its own state and `now`) to a Plan.

No I/O, no asyncio, no globals: import-linter enforces that this package imports none of the
I/O packages (see pyproject.toml).
"""
