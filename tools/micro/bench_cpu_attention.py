"""Time the CPU paged decode kernel against the torch path it replaces, on one decode shape.

    python -m tools.micro.bench_cpu_attention [--batch 256] [--min-ctx 100] [--max-ctx 160]
        [--heads 4] [--kv-heads 2] [--head-dim 64] [--block-size 16] [--iters 50]
        [--rounds 5] [--no-torch] [--dtype bfloat16] [--layers 28]
    python -m tools.micro.bench_cpu_attention --module /tmp/old_cpu_attention.py --module package
    python -m tools.micro.bench_cpu_attention --prefill 32 --batch 32 --min-ctx 32 --max-ctx 32 \
        [--threads 2]

Single thread, as the engine runs torch, and glibc told to keep freed memory as the engine
process does (``process.keep_freed_memory``: otherwise every call's fresh 1 MB output
page-faults, which is not what the engine pays). The cache's blocks are handed out in a random
order, as after a while of admitting and finishing requests, so no call gets the hardware
prefetcher's help across blocks for free. Prints milliseconds per call for the compiled
kernel and for the torch path (gather K/V out of the cache with ``index_select``, then SDPA
with an additive mask, as the ``torch`` attention backend does), the K/V
bytes each call has to read and the rate it read them at, and the largest difference
between the two outputs. ``--module`` (repeatable) loads ``cpu_attention`` from a file
instead (``package``: the package's own), to compare an older kernel with the current one;
their rounds are interleaved, so a busy machine slows them alike. Each figure is the best
round of ``--rounds``. ``--dtype bfloat16`` times a bf16 cache (q and output stay fp32, as
the engine calls it, q holding bf16 values); ``--layers N`` gives each call N caches to go
through, one after another as a step's layers do, so that the K/V is not in the caches from
the call before (figures are still per layer).

``--prefill N`` times a step of ``--batch`` prefill chunks of N query rows instead (each
continuing to a context drawn from ``--min-ctx``..``--max-ctx``, at least N: equal to N is a
fresh prompt), through the engine's own ``cpu`` attention backend (``attention/cpu_kernel.py``):
the chunks' rows in one kernel call against one SDPA call a chunk, with
``--threads`` torch threads (the engine prefills with two on two cores). That is the
measurement behind ``cpu_kernel.IN_PLACE_PREFILL_WORK``.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import sys
from collections.abc import Callable
from types import ModuleType

import torch
import torch.nn.functional as F

from izh_trio.engine import cpu_attention
from izh_trio.engine.attention import ChunkSpec, StepAttention, cpu_kernel
from izh_trio.engine.process import keep_freed_memory
from tools.micro.timing import MS, best_of


def _load(path: str) -> ModuleType:
    if path == "package":
        return cpu_attention
    spec = importlib.util.spec_from_file_location(f"bench_kernel_{abs(hash(path))}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--min-ctx", type=int, default=100)
    p.add_argument("--max-ctx", type=int, default=160)
    p.add_argument("--heads", type=int, default=4, help="query heads")
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--iters", type=int, default=50, help="calls a round (torch: a fifth)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--module", action="append",
                   help="a cpu_attention.py to time instead of the package's (repeatable)")
    p.add_argument("--no-torch", action="store_true", help="time only the kernel")
    p.add_argument("--prefill", type=int, default=0, metavar="N",
                   help="time prefill chunks of N rows instead of decodes")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    p.add_argument("--layers", type=int, default=1, help="caches a call goes through")
    args = p.parse_args(argv)

    torch.set_num_threads(args.threads)
    keep_freed_memory()
    if args.prefill:
        return _prefill(args)
    kernels = {path: _load(path) for path in args.module or ["package"]}
    if not all(k.available() for k in kernels.values()):
        print("the C kernel is unavailable (no compiler?)", file=sys.stderr)
        return 1
    g = torch.Generator().manual_seed(args.seed)
    b, bs, h_q, h_kv, d = args.batch, args.block_size, args.heads, args.kv_heads, args.head_dim
    lens = torch.randint(args.min_ctx, args.max_ctx + 1, (b,), generator=g)
    width = int((lens.max() + bs - 1) // bs)
    num_blocks = b * width + 1
    dtype = getattr(torch, args.dtype)
    caches = [(torch.randn(num_blocks, bs, h_kv, d, generator=g).to(dtype),
               torch.randn(num_blocks, bs, h_kv, d, generator=g).to(dtype))
              for _ in range(args.layers)]
    k_cache, v_cache = caches[-1]  # the one a call's answer comes from, for the check
    tables = torch.randperm(num_blocks, generator=g)[: b * width].view(b, width)
    # a bf16 model's q is bf16 values (widened for the kernel), which the kernel may use
    q = torch.randn(b, h_q, d, generator=g).to(dtype).float()
    scale = d**-0.5

    positions = torch.arange(width * bs)
    bias = torch.zeros(b, 1, 1, width * bs).masked_fill(
        (positions[None, :] >= lens[:, None])[:, None, None, :], float("-inf"))

    def with_torch() -> torch.Tensor:
        kd = torch.index_select(k_cache, 0, tables.flatten()).float().view(
            b, -1, h_kv, d).transpose(1, 2)
        vd = torch.index_select(v_cache, 0, tables.flatten()).float().view(
            b, -1, h_kv, d).transpose(1, 2)
        qd = q.view(b, h_kv, h_q // h_kv, d)
        return F.scaled_dot_product_attention(qd, kd, vd, attn_mask=bias,
                                              scale=scale).reshape(b, h_q, d)

    def every_layer(kernel: ModuleType) -> torch.Tensor:
        for k, v in caches:
            out = kernel.paged_decode(q, k, v, tables, lens, scale)
        return out

    fns: dict[str, Callable[[], torch.Tensor]] = {
        f"C kernel ({path})": functools.partial(every_layer, k) for path, k in kernels.items()}
    iters = dict.fromkeys(fns, args.iters)
    if not args.no_torch:
        fns["torch"], iters["torch"] = with_torch, max(1, args.iters // 5)

    kv_bytes = int(lens.sum()) * h_kv * d * dtype.itemsize * 2
    print(f"B={b} ctx=[{args.min_ctx},{args.max_ctx}] (mean {lens.float().mean():.1f}) "
          f"H_q={h_q} H_kv={h_kv} D={d} block={bs} {args.dtype}: {kv_bytes / 1e6:.1f} MB of "
          f"K/V per call, {args.layers} cache(s) a round")
    for name, ms in best_of(fns, iters, args.rounds, MS).items():
        ms = ms / args.layers if name != "torch" else ms
        print(f"{name:40s} {ms:8.3f} ms/call  {kv_bytes / ms / 1e6:6.1f} GB/s of K/V")
    if not args.no_torch:
        want = with_torch()
        for name, fn in fns.items():
            if fn is not with_torch:
                print(f"max |{name} - torch| = {(fn() - want).abs().max().item():.2e}")
    return 0


def _prefill(args: argparse.Namespace) -> int:
    """A step of prefill chunks through the engine's attention: kernel rows against SDPA."""
    g = torch.Generator().manual_seed(args.seed)
    n, bs, h_q, h_kv, d = args.prefill, args.block_size, args.heads, args.kv_heads, args.head_dim
    lens = torch.randint(max(n, args.min_ctx), max(n, args.max_ctx) + 1, (args.batch,),
                         generator=g).tolist()
    width = max(-(-c // bs) for c in lens)
    num_blocks = args.batch * width + 1
    order = torch.randperm(num_blocks, generator=g).tolist()
    chunks = [ChunkSpec(query_start=i * n, query_len=n, context_len=c,
                        block_table=order[i * width : i * width + -(-c // bs)])
              for i, c in enumerate(lens)]
    step = StepAttention(slots=list(range(n * args.batch)), prefills=chunks, decodes=[],
                         block_size=bs)
    k_cache = torch.randn(num_blocks, bs, h_kv, d, generator=g)
    v_cache = torch.randn(num_blocks, bs, h_kv, d, generator=g)
    q = torch.randn(n * args.batch, h_q, d, generator=g)
    k = torch.randn(n * args.batch, h_kv, d, generator=g)  # a fresh chunk's own K/V
    v = torch.randn(n * args.batch, h_kv, d, generator=g)
    for c in chunks:
        if c.context_len == n:  # fresh: what attention reads from k/v is what the cache holds
            for i in range(n):
                k_cache[c.block_table[i // bs], i % bs] = k[c.query_start + i]
                v_cache[c.block_table[i // bs], i % bs] = v[c.query_start + i]

    def timed(work: int) -> Callable[[], torch.Tensor]:
        cpu_kernel.IN_PLACE_PREFILL_WORK = work
        meta = cpu_kernel.CPU_KERNEL_BACKEND.build_metadata(step, torch.device("cpu"), h_kv)
        return functools.partial(meta.paged_attention, q, k, v, k_cache, v_cache,
                                 d**-0.5)

    fns = {"kernel rows": timed(1 << 62), "SDPA per chunk": timed(0)}
    print(f"{args.batch} prefill chunks of {n} rows, context [{min(lens)}, {max(lens)}], "
          f"H_q={h_q} H_kv={h_kv} D={d} block={bs}, {args.threads} thread(s); "
          f"rows x context = {n * lens[0]} for the first")
    for name, ms in best_of(fns, max(1, args.iters // 5), args.rounds, MS).items():
        print(f"{name:40s} {ms:8.3f} ms/call")
    a, b = (fn() for fn in fns.values())
    print(f"max |kernel rows - SDPA| = {(a - b).abs().max().item():.2e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
