"""Time the engine's decode step on a checkpoint, by batch size, thread count and dtype.

    python -m tools.micro.bench_decode_step MODEL_DIR [--dtype float32,bfloat16]
        [--batch 1,8,32] [--threads 1,2] [--context 128] [--steps 8] [--rounds 3]
        [--profile]

An in-process ``EngineCore`` (no HTTP) prefills ``batch`` random prompts of ``--context``
tokens, then runs decode steps; a round is ``--steps`` steps, and the figure is the best
round's milliseconds per step (rounds of every thread count interleave, so a machine that
slows mid-run slows them all). Threads are set for the whole step (``EngineConfig
.num_threads``). ``--profile`` prints torch's profile of one round per configuration: where
a step's time goes besides the matrix products. Make the 0.6B-shaped checkpoint with
``izh-trio make-tiny --shape qwen3-0.6b DIR``; this is the engine as it serves.

Beside each figure, the step's two bounds on this machine, measured first
(``tools.micro.bench_memory``): ``read`` is the weights' bytes over the read bandwidth (every
step streams them once: the bound of a small batch), ``math`` is the step's matrix FLOPs
(``2 * batch * parameters``, attention aside) over the matrix rate in the dtype (the bound of
a large batch); both at the figure's thread count.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from izh_trio.engine.core import EngineCore
from izh_trio.wire import AddRequest, EngineConfig, SamplingParams
from tools.micro.bench_memory import mm_gflops, read_gbps


def _core(model_dir: str, dtype: str, threads: int, batch: int, context: int, steps: int,
          rounds: int) -> EngineCore:
    tokens = batch * (context + steps * (rounds + 2) + 8)
    config = EngineConfig(model_dir=model_dir, dtype=dtype, num_threads=threads,
                          max_num_seqs=max(batch, 1), max_num_batched_tokens=2048,
                          num_kv_blocks=-(-tokens // 16) + batch,
                          max_model_len=context + steps * (rounds + 2) + 16)
    core = EngineCore(config)
    rng = np.random.default_rng(0)
    vocab = core.runner.model_config.vocab_size
    for i in range(batch):
        params = SamplingParams(max_tokens=steps * (rounds + 2) + 4, temperature=0.0,
                                ignore_eos=True)
        ids = rng.integers(0, vocab, size=context).tolist()
        assert core.add_request(AddRequest(f"r{i}", ids, params)) is None
    while any(s.num_computed_tokens < context for s in core.scheduler.running) \
            or core.scheduler.waiting:
        core.step()  # prefill (chunked by the token budget)
    core.step()
    return core


def _round(core: EngineCore, steps: int) -> float:
    start = time.perf_counter()
    for _ in range(steps):
        core.step()
    return (time.perf_counter() - start) / steps * 1e3


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model_dir")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--batch", default="1,8,32")
    p.add_argument("--threads", default="1,2")
    p.add_argument("--context", type=int, default=128)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--profile", action="store_true")
    a = p.parse_args()
    all_threads = [int(t) for t in a.threads.split(",")]
    read = {t: read_gbps(t) for t in all_threads}
    rate = {(d, t): mm_gflops(getattr(torch, d), t) for d in a.dtype.split(",")
            for t in all_threads}
    print("bounds: " + ", ".join(f"read {read[t]:.1f} GB/s on {t}" for t in all_threads) + "; "
          + ", ".join(f"{d} mm {r:.0f} GFLOP/s on {t}" for (d, t), r in rate.items()))
    print(f"{'dtype':9} {'batch':>5} {'threads':>7} {'ms/step':>8} {'tok/s':>7} "
          f"{'read ms':>8} {'math ms':>8}")
    for dtype in a.dtype.split(","):
        for batch in (int(b) for b in a.batch.split(",")):
            threads = [int(t) for t in a.threads.split(",")]
            cores = {t: _core(a.model_dir, dtype, t, batch, a.context, a.steps, a.rounds)
                     for t in threads}
            best = dict.fromkeys(threads, float("inf"))
            for _ in range(a.rounds):
                for t, core in cores.items():
                    # Threads are process-wide: set them for this core's round whatever the
                    # other core set last (its own record of them would skip the call).
                    core.threads = type(core.threads)(t, t)
                    torch.set_num_threads(t)
                    core._threads_now = t
                    best[t] = min(best[t], _round(core, a.steps))
            runner = next(iter(cores.values())).runner
            params = runner.weight_bytes // runner.dtype.itemsize
            for t in threads:
                read_ms = runner.weight_bytes / read[t] / 1e6
                math_ms = 2 * batch * params / rate[dtype, t] / 1e6
                print(f"{dtype:9} {batch:5} {t:7} {best[t]:8.1f} {batch * 1e3 / best[t]:7.1f} "
                      f"{read_ms:8.1f} {math_ms:8.1f}", flush=True)
                if a.profile:
                    with torch.profiler.profile() as prof:
                        _round(cores[t], a.steps)
                    print(prof.key_averages().table(sort_by="self_cpu_time_total",
                                                    row_limit=14))
            del cores


if __name__ == "__main__":
    main()
