"""Benchmarks: the node simulator, its scenarios, and what `perfbalance bench` measures."""
