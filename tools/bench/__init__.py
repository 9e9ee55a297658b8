"""The maintained benchmarks and their helpers; figures they produced are in ``results/``.

``bench_serve``: a load generator for any OpenAI-compatible server; ``compare_peers``: ours
against vLLM-CPU, paired; ``gpu_bench``: the GPU path's throughput. The other modules are
``bench_serve``'s pieces (workload, streaming client, metrics, plots) and ``compare_peers``'s
server handling, split so each stays small enough to read on its own.
"""
