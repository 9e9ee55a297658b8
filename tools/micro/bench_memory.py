"""The machine's bounds for a decode step: memory read bandwidth and matrix arithmetic rate.

    python -m tools.micro.bench_memory [--gib 1] [--threads 1,2] [--rounds 5]

Read bandwidth: ``torch.sum`` over a ``--gib`` fp32 tensor (far beyond the caches), the way a
decode step streams its weights once; GB/s per thread count. Arithmetic: a 1024-row fp32 and
bf16 matrix product (``torch.mm``, 1024 x 1024 x 4096), GFLOP/s per thread count. The weight-read
bound of a single-stream decode step is the weights' bytes over the read bandwidth; the
arithmetic bound of a B-sequence step is ``2 * B * params`` FLOPs over the rate.
"""

from __future__ import annotations

import argparse

import torch

from tools.micro.timing import MS, best_of


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gib", type=float, default=1.0)
    p.add_argument("--threads", default="1,2")
    p.add_argument("--rounds", type=int, default=5)
    a = p.parse_args()
    big = torch.rand(int(a.gib * (1 << 30)) // 4)
    mats = {dt: (torch.randn(1024, 1024, dtype=dt), torch.randn(1024, 4096, dtype=dt))
            for dt in (torch.float32, torch.bfloat16)}
    for threads in (int(t) for t in a.threads.split(",")):
        torch.set_num_threads(threads)
        read_ms = best_of({"read": lambda: big.sum()}, 3, a.rounds, MS)["read"]
        line = f"threads {threads}: read {big.nbytes / read_ms / 1e6:6.1f} GB/s"
        for dt, (x, w) in mats.items():
            ms = best_of({"mm": lambda x=x, w=w: torch.mm(x, w)}, 3, a.rounds, MS)["mm"]
            rate = 2 * 1024 * 1024 * 4096 / ms / 1e6
            line += f", {str(dt).removeprefix('torch.')} mm {rate:6.1f} GFLOP/s"
        print(line, flush=True)


if __name__ == "__main__":
    main()
