"""Benchmarks: tasks, the timing protocol, runners and reports."""
