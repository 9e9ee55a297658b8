"""Time the engine's linear layers on CPU: plain ``F.linear``, oneDNN's packed weight, and
(fp32 on AVX-512, bf16 on AVX512-BF16, fp16 on AVX-512 with F16C) our own kernel's blocked
weight.

    python -m tools.micro.bench_cpu_linear [--dtype float32] [--threads 1] [--layers 1]
        [--hidden 256] [--intermediate 768] [--heads 4] [--kv-heads 2] [--head-dim 64]
        [--vocab 2000] [--rows 1,8,32,256,1024] [--rounds 5]

The shapes are a Qwen3 layer's fused projections (qkv, o, gate_up, down), ``--layers``
times, and the LM head; defaults are the tiny benchmark checkpoint's (``izh_trio.tiny``'s
defaults). Qwen3-0.6B's: ``--hidden 1024 --intermediate 3072 --heads 16 --kv-heads 8
--head-dim 128 --vocab 151936 --layers 28`` (then the weights are a decode step's, too many
for any cache, as when serving). Prints milliseconds per pass over all of them for each
row count (a decode step has one row per sequence), the best variant's GFLOP/s, and the
weights' read rate it implies; each figure is the best of ``--rounds`` interleaved rounds.
``--skip F.linear,oneDNN`` leaves variants out (torch's fp16 products on a CPU without fp16
arithmetic take seconds a pass at a real shape).
"""

from __future__ import annotations

import argparse
import sys

import torch
from torch import nn

from izh_trio.engine import cpu_linear, cpu_linear_blocked
from tools.micro.timing import MS, best_of


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name, default in (("hidden", 256), ("intermediate", 768), ("heads", 4), ("kv-heads", 2),
                          ("head-dim", 64), ("vocab", 2000), ("rounds", 5), ("threads", 1),
                          ("layers", 1)):
        p.add_argument(f"--{name}", type=int, default=default)
    p.add_argument("--rows", default="1,8,32,256,1024")
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    p.add_argument("--skip", default="", help="variants to leave out, comma-separated")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    dtype = getattr(torch, a.dtype)
    h, q, kv = a.hidden, a.heads * a.head_dim, a.kv_heads * a.head_dim
    shapes = [(h, q + 2 * kv), (q, h), (h, 2 * a.intermediate), (a.intermediate, h)] * a.layers
    shapes.append((h, a.vocab))
    plain = [nn.Linear(i, o, bias=False).to(dtype) for i, o in shapes]
    variants: dict[str, list[nn.Module]] = {"F.linear": list(plain)}
    with torch.no_grad():
        packed = [cpu_linear._pack(m) for m in plain]
        if all(m is not None for m in packed):
            variants["oneDNN"] = [m for m in packed if m is not None]
        if cpu_linear_blocked.available(dtype):
            ours = [cpu_linear_blocked.from_linear(m) for m in plain]
            if all(m is not None for m in ours):
                variants["ours"] = [m for m in ours if m is not None]
    if len(variants) == 1:
        sys.exit("neither oneDNN nor our kernel can pack this dtype here")
    for name in filter(None, a.skip.split(",")):
        variants.pop(name, None)
    weight_bytes = sum(i * o for i, o in shapes) * dtype.itemsize
    flops_per_row = 2 * sum(i * o for i, o in shapes)
    print(f"{a.dtype}, {a.threads} thread(s), {weight_bytes / 1e6:.0f} MB of weights; "
          "ms per pass over every linear")
    print(f"{'rows':>6} " + " ".join(f"{name:>9}" for name in variants)
          + f" {'best':>9} {'GFLOP/s':>8} {'GB/s':>6}")
    with torch.inference_mode():
        for rows in (int(r) for r in a.rows.split(",")):
            xs = [torch.randn(rows, i).to(dtype) for i, _ in shapes]
            best = best_of({name: lambda mods=mods, xs=xs: [
                                m(x) for m, x in zip(mods, xs, strict=True)]
                            for name, mods in variants.items()},
                           max(1, 2_000 // (rows * a.layers)), a.rounds, unit=MS)
            winner = min(best, key=best.__getitem__)
            seconds = best[winner] / MS
            print(f"{rows:>6} " + " ".join(f"{best[name]:>9.2f}" for name in variants)
                  + f" {winner:>9} {flops_per_row * rows / seconds / 1e9:>8.1f}"
                  f" {weight_bytes / seconds / 1e9:>6.1f}", flush=True)


if __name__ == "__main__":
    main()
