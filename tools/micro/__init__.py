"""Micro-benchmarks: each CPU kernel against the torch ops it replaces, best of interleaved
rounds (``timing.best_of``). Run as ``python -m tools.micro.bench_cpu_attention --help``."""
