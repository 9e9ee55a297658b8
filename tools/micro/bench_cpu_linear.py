"""Time the engine's linear layers on CPU: plain ``F.linear`` against the oneDNN-packed weight.

    python -m tools.micro.bench_cpu_linear [--hidden 256] [--intermediate 768] [--heads 4]
        [--kv-heads 2] [--head-dim 64] [--vocab 2000] [--rows 1,8,32,256,1024] [--rounds 5]

Single thread, as the engine's decode steps run torch. The shapes are one Qwen3 layer's fused
projections (qkv, o, gate_up, down) and the LM head; defaults are the tiny benchmark
checkpoint's (``izh_trio.tiny``'s defaults). Prints microseconds per call for both, summed
over the five shapes, for each row count (a decode step has one row per sequence), and the
ratio; each figure is the best of ``--rounds`` interleaved rounds.
"""

from __future__ import annotations

import argparse
import sys

import torch
from torch import nn

from izh_trio.engine.cpu_linear import pack_linears
from tools.micro.timing import best_of


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name, default in (("hidden", 256), ("intermediate", 768), ("heads", 4), ("kv-heads", 2),
                          ("head-dim", 64), ("vocab", 2000), ("rounds", 5)):
        p.add_argument(f"--{name}", type=int, default=default)
    p.add_argument("--rows", default="1,8,32,256,1024")
    a = p.parse_args()
    torch.set_num_threads(1)
    h, q, kv = a.hidden, a.heads * a.head_dim, a.kv_heads * a.head_dim
    shapes = {"qkv": (h, q + 2 * kv), "o": (q, h), "gate_up": (h, 2 * a.intermediate),
              "down": (a.intermediate, h), "lm_head": (h, a.vocab)}
    plain = nn.ModuleDict({k: nn.Linear(i, o, bias=False) for k, (i, o) in shapes.items()})
    packed = nn.ModuleDict({k: nn.Linear(i, o, bias=False) for k, (i, o) in shapes.items()})
    packed.load_state_dict(plain.state_dict())
    if pack_linears(packed) != len(shapes):
        sys.exit("oneDNN packing is unavailable on this build")
    print(f"{'rows':>6} {'F.linear µs':>12} {'oneDNN µs':>10} {'ratio':>6} {'GFLOPS':>7}")
    flops_per_row = 2 * sum(i * o for i, o in shapes.values())
    with torch.inference_mode():
        for rows in (int(r) for r in a.rows.split(",")):
            xs = {k: torch.randn(rows, i) for k, (i, _) in shapes.items()}
            best = best_of({name: lambda mods=mods, xs=xs: [mods[k](xs[k]) for k in shapes]
                            for name, mods in (("plain", plain), ("packed", packed))},
                           max(3, 20_000 // rows), a.rounds)
            print(f"{rows:>6} {best['plain']:>12.1f} {best['packed']:>10.1f} "
                  f"{best['packed'] / best['plain']:>6.2f} "
                  f"{flops_per_row * rows / best['packed'] / 1e3:>7.1f}")


if __name__ == "__main__":
    main()
