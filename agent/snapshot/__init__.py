"""Collectors -> one Snapshot per sample window."""
