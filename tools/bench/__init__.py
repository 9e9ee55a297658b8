"""Helpers of ``tools/bench_serve.py``: workload, streaming client, metrics, plots.

Split out so each piece stays small enough to read on its own; only the CLI imports them.
"""
