"""Time the fused CPU elementwise kernels against the torch ops they replace, per layer.

    python -m tools.micro.bench_cpu_fused [--tokens 32 256] [--hidden 256] [--heads 4]
        [--kv-heads 2] [--head-dim 64] [--intermediate 512] [--block-size 16]
        [--dtype float32] [--threads 1] [--iters 200] [--rounds 5]

For each token count, one decoder layer's share: ``rms_norm`` (the input norm),
``qk_norm_rope_store`` (q/k norms, RoPE, the KV store into a paged cache at random slots),
``add_rms_norm`` (the residual add and the norm after attention) and ``silu_mul`` (the MLP's
SiLU times up), each against the torch ops of ``models/`` and the torch attention backend's
``store_kv`` that the model runs without the kernels, on ``--threads`` of torch's threads
(the kernels split a call's rows between them from ``cpu_fused.PARALLEL_MIN_VALUES``
values). Prints microseconds per call (best round of ``--rounds``, rounds interleaved so a
busy machine slows both alike) and the largest difference between the two results.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

import torch
import torch.nn.functional as F

from izh_trio.engine import cpu_fused
from izh_trio.engine.attention.torch_sdpa import store_kv
from izh_trio.engine.models.layers import RMSNorm, RotaryEmbedding, apply_rope
from tools.micro.timing import best_of

Result = torch.Tensor | tuple[torch.Tensor, ...]


def _diff(a: Result, b: Result) -> float:
    a, b = (a,) if isinstance(a, torch.Tensor) else a, (b,) if isinstance(b, torch.Tensor) else b
    return max((x - y).abs().max().item() for x, y in zip(a, b, strict=True))


def _cases(t: int, args: argparse.Namespace
           ) -> dict[str, tuple[Callable[[], Result], Callable[[], Result]]]:
    """name -> (torch ops, fused call) on one layer's tensors for ``t`` tokens."""
    g = torch.Generator().manual_seed(t)
    h_q, h_kv, d, n = args.heads, args.kv_heads, args.head_dim, args.hidden
    dtype = getattr(torch, args.dtype)
    x, residual = (torch.randn(t, n, generator=g).to(dtype) for _ in range(2))
    norm, q_norm, k_norm = RMSNorm(n, 1e-6), RMSNorm(d, 1e-6), RMSNorm(d, 1e-6)
    for m in (norm, q_norm, k_norm):
        m.weight.data = torch.randn(m.weight.shape, generator=g)
        m.to(dtype)
    qkv = torch.randn(t, (h_q + 2 * h_kv) * d, generator=g).to(dtype)
    gate_up = torch.randn(t, 2 * args.intermediate, generator=g).to(dtype)
    rope = RotaryEmbedding(d, 1e6, 4096)
    cos, sin = rope.table(torch.randint(0, 4096, (t,), generator=g), dtype)
    blocks = (t + args.block_size - 1) // args.block_size * 4
    k_cache = torch.zeros(blocks, args.block_size, h_kv, d, dtype=dtype)
    v_cache = torch.zeros_like(k_cache)
    slots = torch.randperm(blocks * args.block_size, generator=g)[:t]

    def qk_torch() -> Result:
        q, k, v = qkv.split([h_q * d, h_kv * d, h_kv * d], dim=-1)
        q = apply_rope(q_norm(q.view(t, h_q, d)), (cos, sin))
        k = apply_rope(k_norm(k.view(t, h_kv, d)), (cos, sin))
        v = v.view(t, h_kv, d)
        store_kv(k, v, k_cache, v_cache, slots)
        return q, k, v

    def add_torch() -> Result:
        h = residual + x
        return h, norm(h)

    def silu_torch() -> Result:
        gate, up = gate_up.chunk(2, dim=-1)
        return F.silu(gate) * up

    return {
        "rms_norm": (lambda: norm(x),
                     lambda: cpu_fused.rms_norm(x, norm.weight, norm.eps)),
        "qk_norm_rope_store": (qk_torch, lambda: cpu_fused.qk_norm_rope_store(
            qkv, h_q, h_kv, q_norm.weight, k_norm.weight, 1e-6, cos, sin, k_cache, v_cache,
            slots)),
        "add_rms_norm": (add_torch,
                         lambda: cpu_fused.add_rms_norm(x, residual, norm.weight, norm.eps)),
        "silu_mul": (silu_torch, lambda: cpu_fused.silu_mul(gate_up)),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tokens", type=int, nargs="+", default=[32, 256])
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--heads", type=int, default=4, help="query heads")
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--intermediate", type=int, default=512)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--iters", type=int, default=200)
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args(argv)

    torch.set_num_threads(args.threads)
    if not cpu_fused.available():
        print("the C kernels are unavailable (no compiler?)", file=sys.stderr)
        return 1
    print(f"hidden={args.hidden} H_q={args.heads} H_kv={args.kv_heads} D={args.head_dim} "
          f"I={args.intermediate} {args.dtype}, {args.threads} thread(s), µs per call "
          "(torch ops -> fused)")
    with torch.inference_mode():
        for t in args.tokens:
            total_torch = total_fused = 0.0
            for name, (ref, fused) in _cases(t, args).items():
                us = best_of({"torch": ref, "fused": fused}, args.iters, args.rounds)
                total_torch, total_fused = total_torch + us["torch"], total_fused + us["fused"]
                print(f"T={t:4d} {name:20s} {us['torch']:8.1f} -> {us['fused']:6.1f}  "
                      f"x{us['torch'] / us['fused']:5.1f}  max diff {_diff(ref(), fused()):.1e}")
            print(f"T={t:4d} {'a layer (all four)':20s} {total_torch:8.1f} -> {total_fused:6.1f}"
                  f"  x{total_torch / total_fused:5.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
