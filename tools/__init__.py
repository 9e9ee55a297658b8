"""Developer tools, run from the repository root as modules (``python -m tools.bench.bench_serve``).

``bench/``: the maintained benchmarks (load generator, peer comparison, GPU throughput) and
their results; ``micro/``: micro-benchmarks of the CPU kernels; ``studies/``: one-off decision
studies and floor probes, with what they found; ``deploy/``: deployment examples.
"""
