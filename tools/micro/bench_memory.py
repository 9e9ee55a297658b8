"""The machine's bounds for a decode step: memory read bandwidth and matrix arithmetic rate.

    python -m tools.micro.bench_memory [--gib 1] [--threads 1,2] [--rounds 5]

Read bandwidth: ``torch.sum`` over a ``--gib`` fp32 tensor (far beyond the caches), the way a
decode step streams its weights once; GB/s per thread count. Arithmetic: a 1024-row fp32 and
bf16 matrix product (``torch.mm``, 1024 x 1024 x 4096), GFLOP/s per thread count. The weight-read
bound of a single-stream decode step is the weights' bytes over the read bandwidth; the
arithmetic bound of a B-sequence step is ``2 * B * params`` FLOPs over the rate
(``tools.micro.bench_decode_step`` prints both beside its measured steps).
"""

from __future__ import annotations

import argparse

import torch

from tools.micro.timing import MS, best_of

MM_SHAPE = (1024, 1024, 4096)


def read_gbps(threads: int, gib: float = 1.0, rounds: int = 5) -> float:
    """GB/s of one streaming read over ``gib`` of memory on ``threads`` threads."""
    torch.set_num_threads(threads)
    big = torch.rand(int(gib * (1 << 30)) // 4)
    ms = best_of({"read": lambda: big.sum()}, 3, rounds, MS)["read"]
    return big.nbytes / ms / 1e6


def mm_gflops(dtype: torch.dtype, threads: int, rounds: int = 5) -> float:
    """GFLOP/s of a large matrix product in ``dtype`` on ``threads`` threads."""
    torch.set_num_threads(threads)
    m, k, n = MM_SHAPE
    x, w = torch.randn(m, k, dtype=dtype), torch.randn(k, n, dtype=dtype)
    ms = best_of({"mm": lambda: torch.mm(x, w)}, 3, rounds, MS)["mm"]
    return 2 * m * k * n / ms / 1e6


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gib", type=float, default=1.0)
    p.add_argument("--threads", default="1,2")
    p.add_argument("--rounds", type=int, default=5)
    a = p.parse_args()
    for threads in (int(t) for t in a.threads.split(",")):
        line = f"threads {threads}: read {read_gbps(threads, a.gib, a.rounds):6.1f} GB/s"
        for dtype in (torch.float32, torch.bfloat16):
            rate = mm_gflops(dtype, threads, a.rounds)
            line += f", {str(dtype).removeprefix('torch.')} mm {rate:6.1f} GFLOP/s"
        print(line, flush=True)


if __name__ == "__main__":
    main()
