"""Throughput of the GPU path: a Qwen3-0.6B-shaped random bf16 model, offline and over HTTP.

    python -m tools.bench.gpu_bench            # the GPU run (tools/gpu_check.sh calls it)
    python -m tools.bench.gpu_bench --small    # CPU-sized: the tiny model, 8 sequences,
                                               # lengths in [10, 40], torch attention

The model is built here, with no download: Qwen3-0.6B's shape (hidden 1024, 28 layers, 16
heads, 8 KV heads, head_dim 128, intermediate 3072, vocab 151936, tied embeddings) with random
bf16 weights written by torch, and the tiny checkpoint's tokenizer (``izh_trio.tiny``): ids it
does not know detokenize to nothing, which costs the HTTP path nothing it would not pay anyway.

Workload (vLLM's ``bench throughput`` random dataset): ``--num-seqs`` requests, input and output
lengths uniform in [``--min-len``, ``--max-len``], random prompt ids, ``ignore_eos``,
temperature 1. Offline, every request goes into an in-process ``EngineCore`` at once and the
core steps until all finish. Online, ``izh-trio serve`` runs the same requests, all at once,
as non-streaming ``/v1/completions`` calls. One JSON line of figures goes to stdout; progress
goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]

QWEN3_0_6B = dict(vocab_size=151936, hidden_size=1024, intermediate_size=3072,
                  num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8,
                  head_dim=128, max_position_embeddings=40960, rope_theta=1_000_000.0,
                  tie_word_embeddings=True)


def log(msg: str) -> None:
    print(f"[gpu_bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------- the model
def build_model(work: Path, small: bool, device: str) -> Path:
    """The tiny checkpoint (small), or the 0.6B-shaped one beside it (built once, reused)."""
    from izh_trio.tiny import make_tiny_checkpoint

    tiny = make_tiny_checkpoint(work / "tiny")
    if small:
        return tiny
    out = work / "qwen3-0.6b-random-bf16"
    if (out / "model.safetensors").is_file():
        return out
    import torch
    from safetensors.torch import save_file

    from izh_trio.tiny.checkpoint import TinySpec, generation_config, model_config
    from izh_trio.tiny.weights import weight_shapes

    spec = TinySpec(**QWEN3_0_6B)
    tmp = work / "qwen3-0.6b.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    config = model_config(spec) | {"torch_dtype": "bfloat16"}
    (tmp / "config.json").write_text(json.dumps(config, indent=2))
    (tmp / "generation_config.json").write_text(json.dumps(generation_config(spec), indent=2))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tiny / name, tmp / name)
    gen = torch.Generator(device=device).manual_seed(0)
    tensors = {}
    for name, shape in weight_shapes(spec).items():
        if name.endswith("norm.weight"):
            t = torch.ones(shape, dtype=torch.bfloat16)
        else:
            t = (torch.randn(shape, generator=gen, device=device) * spec.init_std)
            t = t.to(torch.bfloat16).cpu()
        tensors[name] = t
    save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    os.replace(tmp, out)
    log(f"wrote {out} ({sum(t.numel() for t in tensors.values()) / 1e6:.0f}M parameters)")
    return out


# ---------------------------------------------------------------------- the workload
def workload(args: argparse.Namespace, vocab: int) -> list[tuple[list[int], int]]:
    rng = np.random.default_rng(args.seed)
    ins = rng.integers(args.min_len, args.max_len + 1, size=args.num_seqs)
    outs = rng.integers(args.min_len, args.max_len + 1, size=args.num_seqs)
    return [(rng.integers(0, vocab, size=int(n)).tolist(), int(m)) for n, m in zip(ins, outs,
                                                                                  strict=True)]


def engine_settings(args: argparse.Namespace) -> dict[str, Any]:
    return dict(device=args.device, dtype=args.dtype, max_num_seqs=args.num_seqs,
                max_num_batched_tokens=args.max_num_batched_tokens, block_size=16,
                attention_backend=args.attention_backend)


# ---------------------------------------------------------------------- offline
def offline(model_dir: Path, args: argparse.Namespace, requests: list[tuple[list[int], int]]
            ) -> dict[str, Any]:
    import torch

    from izh_trio.engine.core import EngineCore
    from izh_trio.wire import AddRequest, EngineConfig, SamplingParams

    t0 = time.perf_counter()
    core = EngineCore(EngineConfig(model_dir=str(model_dir), **engine_settings(args)))
    startup = time.perf_counter() - t0
    log(f"engine core up in {startup:.1f}s: {core.runner.num_blocks} KV blocks, "
        f"{core.runner.attention.name} attention, CUDA graphs "
        f"{'on' if core.runner.graphs is not None else 'off'}")

    def run(core: EngineCore, reqs: list[tuple[list[int], int]], tag: str) -> dict[str, int]:
        got: dict[str, int] = {}
        for i, (ids, out_len) in enumerate(reqs):
            params = SamplingParams(max_tokens=out_len, temperature=1.0, top_p=1.0,
                                    ignore_eos=True, seed=None)
            failed = core.add_request(AddRequest(f"{tag}{i}", ids, params))
            assert failed is None, failed
            got[f"{tag}{i}"] = 0
        while core.has_work:
            for o in core.step():
                got[o.request_id] += len(o.new_token_ids)
        return got

    run(core, [(list(range(1, 40)), 8), (list(range(3, 20)), 4)], "warm")  # compile kernels
    if args.device.startswith("cuda"):
        torch.cuda.synchronize()
    steps0 = core.num_steps
    t0 = time.perf_counter()
    got = run(core, requests, "r")
    elapsed = time.perf_counter() - t0
    want = {f"r{i}": m for i, (_, m) in enumerate(requests)}
    assert got == want, "some requests did not produce exactly max_tokens tokens"
    n_out = sum(m for _, m in requests)
    n_in = sum(len(ids) for ids, _ in requests)
    result = {
        "offline_s": round(elapsed, 2),
        "offline_output_tok_s": round(n_out / elapsed, 1),
        "offline_total_tok_s": round((n_in + n_out) / elapsed, 1),
        "offline_steps": core.num_steps - steps0,
        "offline_preemptions": core.scheduler.num_preemptions,
        "engine_startup_s": round(startup, 1),
        "kv_blocks": core.runner.num_blocks,
        "attention_backend": core.runner.attention.name,
        "cuda_graphs": core.runner.graphs is not None,
    }
    return result


# ---------------------------------------------------------------------- over HTTP
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http(model_dir: Path, args: argparse.Namespace, requests: list[tuple[list[int], int]],
         work: Path) -> dict[str, Any]:
    import httpx
    import trio

    port = args.port or _free_port()
    s = engine_settings(args)
    cmd = [sys.executable, "-m", "izh_trio", "serve", "--model-dir", str(model_dir),
           "--port", str(port), "--device", s["device"], "--dtype", s["dtype"],
           "--max-num-seqs", str(s["max_num_seqs"]),
           "--max-num-batched-tokens", str(s["max_num_batched_tokens"]),
           "--block-size", str(s["block_size"]), "--log-level", "WARNING"]
    auto = "triton" if s["device"].startswith("cuda") else "torch"
    if args.attention_backend not in ("auto", auto):  # only pass the flag when it matters
        cmd += ["--attention-backend", args.attention_backend]
    env = os.environ | {"PYTHONPATH": os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    server_log = work / "server.log"
    log(f"starting: {' '.join(cmd)} (log: {server_log})")
    t0 = time.perf_counter()
    with open(server_log, "wb") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"server exited ({proc.returncode}):\n"
                                   + server_log.read_text()[-3000:])
            if time.perf_counter() - t0 > args.startup_timeout:
                raise RuntimeError("server did not become ready in time:\n"
                                   + server_log.read_text()[-3000:])
            try:
                if httpx.get(base + "/ready", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(1)
        startup = time.perf_counter() - t0
        log(f"server ready in {startup:.1f}s")
        model = httpx.get(base + "/v1/models", timeout=10).json()["data"][0]["id"]

        async def one(client: httpx.AsyncClient, ids: list[int], out_len: int) -> int:
            r = await client.post("/v1/completions", json={
                "model": model, "prompt": ids, "max_tokens": out_len, "temperature": 1.0,
                "top_p": 1.0, "ignore_eos": True})
            r.raise_for_status()
            return int(r.json()["usage"]["completion_tokens"])

        async def all_at_once(reqs: list[tuple[list[int], int]]) -> list[int]:
            counts = [0] * len(reqs)
            limits = httpx.Limits(max_connections=len(reqs) + 8)
            async with httpx.AsyncClient(base_url=base, timeout=None, limits=limits) as client:

                async def run(i: int) -> None:
                    counts[i] = await one(client, *reqs[i])

                async with trio.open_nursery() as nursery:
                    for i in range(len(reqs)):
                        nursery.start_soon(run, i)
            return counts

        trio.run(all_at_once, [(list(range(1, 40)), 8), (list(range(3, 20)), 4)])  # warm up
        t1 = time.perf_counter()
        counts = trio.run(all_at_once, requests)
        elapsed = time.perf_counter() - t1
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    assert counts == [m for _, m in requests], "HTTP completions came back short"
    n_out = sum(counts)
    n_in = sum(len(ids) for ids, _ in requests)
    return {"http_s": round(elapsed, 2), "http_output_tok_s": round(n_out / elapsed, 1),
            "http_total_tok_s": round((n_in + n_out) / elapsed, 1),
            "server_startup_s": round(startup, 1)}


# ---------------------------------------------------------------------- main
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--small", action="store_true",
                   help="CPU-sized: tiny model, 8 sequences, lengths in [10, 40], torch")
    p.add_argument("--num-seqs", type=int, default=None)
    p.add_argument("--min-len", type=int, default=None)
    p.add_argument("--max-len", type=int, default=None)
    p.add_argument("--device", default=None)
    p.add_argument("--dtype", default=None)
    p.add_argument("--attention-backend", default=None, choices=["auto", "torch", "triton"])
    p.add_argument("--max-num-batched-tokens", type=int, default=8192)
    p.add_argument("--skip-offline", action="store_true")
    p.add_argument("--skip-http", action="store_true")
    p.add_argument("--offline-only", action="store_true", help=argparse.SUPPRESS)  # the child
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--startup-timeout", type=float, default=300.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--work-dir", type=Path, default=Path("/tmp/izh_gpu_bench"))
    args = p.parse_args(argv)
    small = dict(num_seqs=8, min_len=10, max_len=40, device="cpu", dtype="float32",
                 attention_backend="torch")
    large = dict(num_seqs=256, min_len=100, max_len=1024, device="cuda", dtype="bfloat16",
                 attention_backend="auto")
    for key, value in (small if args.small else large).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.small and args.max_num_batched_tokens == 8192:
        args.max_num_batched_tokens = 256
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    t0 = time.perf_counter()
    args.work_dir.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {"bench": "small" if args.small else "qwen3-0.6b-shape-bf16",
                              "num_seqs": args.num_seqs, "lengths": [args.min_len, args.max_len]}
    import torch

    cuda = args.device.startswith("cuda")
    result["gpu"] = torch.cuda.get_device_name() if cuda else None
    model_dir = build_model(args.work_dir, args.small, args.device)
    vocab = json.loads((model_dir / "config.json").read_text())["vocab_size"]
    requests = workload(args, vocab)
    result["input_tokens"] = sum(len(ids) for ids, _ in requests)
    result["output_tokens"] = sum(m for _, m in requests)
    log(f"{args.num_seqs} requests, {result['input_tokens']} prompt and "
        f"{result['output_tokens']} output tokens")
    if args.offline_only:  # in the child process: print the offline figures and exit
        print(json.dumps(offline(model_dir, args, requests)), flush=True)
        return 0
    if not args.skip_offline:
        # A child process, so that its KV cache and graphs are gone before the server sizes its
        # own from free GPU memory.
        child = subprocess.run([sys.executable, "-m", "tools.bench.gpu_bench",
                                *(argv if argv is not None else sys.argv[1:]),
                                "--offline-only", "--skip-http"],
                               cwd=ROOT, stdout=subprocess.PIPE, text=True, check=True)
        result |= json.loads(child.stdout.strip().splitlines()[-1])
        log(f"offline: {result['offline_output_tok_s']} output tok/s")
    if not args.skip_http:
        result |= http(model_dir, args, requests, args.work_dir)
        log(f"http: {result['http_output_tok_s']} output tok/s")
    result["total_s"] = round(time.perf_counter() - t0, 1)
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
