"""Our server against vLLM's CPU build on the same checkpoint, same client, interleaved.

    python -m tools.bench.compare_peers [--model-dir DIR | --shape qwen3-0.6b]
        [--dtype float32|bfloat16] [--workloads 32x32,...] [--rounds 2]
        [--mode paired|sequential]

    # issue 22's set: Qwen3-0.6B's shape (random weights, made here once), 8 and 1 streams
    python -m tools.bench.compare_peers --shape qwen3-0.6b --workloads 8x64,1x64
    # the same a wave at a time, many short rounds (two dtypes of ours: the ratio is bf16's)
    python -m tools.bench.compare_peers --shape qwen3-0.6b --workloads 8x64w,1x64w \
        --rounds 20 --warm-rounds 1 --servers izh@bfloat16,izh@float32

This machine's speed drifts by a third over minutes (every process's CPU per token, the
client's too, rises and falls together), so the two servers are best measured close together:

* ``paired`` (the default): both servers stay up on two ports; every round runs each workload
  on one and then the other, the order alternating between rounds, after the machine has gone
  quiet (a server may spin for a second after its last request). Each round gives a ratio
  from two runs a few seconds apart; the report adds the median of those per-round ratios.
  An idle server's CPU during the other's run is reported as ``peer_idle_cpu_pct``.
  ``--warm-rounds`` runs that many rounds first, unreported (for the ``w`` workloads, one
  wave each and no warm-up of their own: short runs, so that a pair of them mostly shares
  one pace of the machine's memory, and many rounds, so that the median ratio settles).
* ``sequential``: one server at a time, each round starts ours, runs every workload, stops
  it, then does the same for vLLM (``../shared/tools/vllm-cpu-peer``, installed on first use).

Each workload starts with one unmeasured wave of its own requests (as many as its concurrency,
at least 8), so that neither server is measured while it still pays one-time costs (lazy
compilation, first-touch memory, new connections): on a fresh server a 256-prompt 32x32 run
was ~20 % slower than the same run just after it. The report is the median over rounds per
server, and the ratios. Without ``--model-dir`` it writes the issue's reference checkpoint
(2 layers, hidden 256, head_dim 64, vocab 2000, fp32; vLLM's CPU attention needs head_dim >= 32),
or with ``--shape`` a real model's shape (``izh-trio make-tiny --shape``: 28 layers, hidden
1,024, a 151,936-token vocabulary for qwen3-0.6b), where the engine's arithmetic and memory traffic
decide. Both servers run in ``--dtype`` (vLLM through its own binary when it is not fp32, the
peer script's fixed dtype).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from izh_trio.tiny import SHAPES, TinySpec, make_tiny_checkpoint
from tools.bench import servers

ROOT = servers.ROOT
PEER = ROOT.parent / "shared" / "tools" / "vllm-cpu-peer"
WORKLOADS = {  # name: bench_serve arguments
    "32x32": ["--num-prompts", "256", "--concurrency", "32", "--input-len", "32",
              "--output-len", "32"],
    "256x128": ["--num-prompts", "768", "--concurrency", "256", "--input-len", "32",
                "--output-len", "128"],
    "1x128": ["--num-prompts", "12", "--concurrency", "1", "--input-len", "32",
              "--output-len", "128"],
    # For real shapes (a token per stream takes ~0.1 s): one warm-up wave, fewer prompts.
    "8x64": ["--num-prompts", "24", "--concurrency", "8", "--input-len", "32",
             "--output-len", "64", "--warmup", "8"],
    "1x64": ["--num-prompts", "4", "--concurrency", "1", "--input-len", "32",
             "--output-len", "64", "--warmup", "1"],
    # One wave each, for many short rounds (``--rounds 20 --warm-rounds 1``): two servers
    # this machine runs 15-40 s apart can land on its two memory read rates (28-36 or
    # 44-59 GB/s), a few seconds apart they mostly share one, and the order alternates.
    "8x64w": ["--num-prompts", "8", "--concurrency", "8", "--input-len", "32",
              "--output-len", "64", "--warmup", "0"],
    "1x64w": ["--num-prompts", "1", "--concurrency", "1", "--input-len", "32",
              "--output-len", "64", "--warmup", "0"],
    "smoke": ["--num-prompts", "8", "--concurrency", "4", "--input-len", "8",
              "--output-len", "4"],  # not a benchmark: the tool's own test
}
DEFAULT_WORKLOADS = "32x32,256x128,1x128"
METRICS = ("output_throughput", "median_ttft_ms", "median_itl_ms", "median_tpot_ms",
           "server_cpu_us_per_token", "client_cpu_us_per_token")


def _warmup(workload: list[str]) -> list[str]:
    """One wave of the workload's own requests (its concurrency, at least 8), unless it says."""
    if "--warmup" in workload:
        return []
    return ["--warmup", str(max(8, int(workload[workload.index("--concurrency") + 1])))]


def _command(kind: str, model_dir: Path, port: int, dtype: str = "float32") -> list[str]:
    """A server's command line; ``kind`` is ``izh`` or ``vllm``, ``@DTYPE`` after it overrides
    ``dtype`` (``izh@float32,izh@bfloat16`` compares our two dtypes)."""
    kind, _, own = kind.partition("@")
    dtype = own or dtype
    if kind == "izh":
        return [sys.executable, "-m", "izh_trio", "serve", "--model-dir", str(model_dir),
                "--port", str(port), "--dtype", dtype]
    if dtype == "float32":
        return [str(PEER), str(model_dir), str(port)]
    # The peer script serves fp32 only: its installed binary, with the script's other flags.
    vllm = Path(os.environ.get("IZH_PEERS", Path.home() / ".cache" / "izh-peers"))
    return ["env", "VLLM_TARGET_DEVICE=cpu",
            f"VLLM_CPU_KVCACHE_SPACE={os.environ.get('VLLM_CPU_KVCACHE_SPACE', '2')}",
            str(vllm / "vllm-cpu" / "bin" / "vllm"), "serve", str(model_dir), "--host",
            "127.0.0.1", "--port", str(port), "--max-model-len", "2048", "--dtype", dtype,
            "--served-model-name", model_dir.name]


def _measure(kind: str, name: str, port: int, proc: subprocess.Popen, out: Path,
             peer: subprocess.Popen | None = None) -> dict:
    """One run of a workload against one server: bench_serve's point, plus CPU figures."""
    cpu_before = servers.tree_cpu_s(proc.pid)
    peer_before = servers.tree_cpu_s(peer.pid) if peer is not None else 0.0
    started = time.monotonic()
    subprocess.run([*servers.tool("tools.bench.bench_serve"),
                    "--base-url", f"http://127.0.0.1:{port}",
                    *_warmup(WORKLOADS[name]),
                    "--no-progress", "--label", kind, "--result-json", str(out),
                    *WORKLOADS[name]], check=False, stdout=subprocess.DEVNULL, cwd=ROOT)
    point = json.loads(out.read_text())["points"][0]
    # Warm-up requests included: a small overestimate, the same for both.
    point["server_cpu_us_per_token"] = (
        1e6 * (servers.tree_cpu_s(proc.pid) - cpu_before) / max(1, point["total_output_tokens"]))
    if peer is not None:
        point["peer_idle_cpu_pct"] = (100 * (servers.tree_cpu_s(peer.pid) - peer_before)
                                      / (time.monotonic() - started))
    return point


def _record(results: dict, rnd: int, kind: str, name: str, point: dict) -> None:
    results.setdefault(name, {}).setdefault(kind, []).append(point)
    print(f"round {rnd} {kind:5} {name:8} " + "  ".join(
        f"{m}={point[m]:.1f}" for m in (*METRICS, "peer_idle_cpu_pct") if point.get(m) is not None),
        flush=True)


def sequential(kinds: list[str], names: list[str], rounds: int, model_dir: Path, port: int,
               out: Path, dtype: str = "float32") -> dict:
    results: dict[str, dict[str, list[dict]]] = {}
    for rnd in range(rounds):
        for kind in kinds:
            proc = servers.start(_command(kind, model_dir, port, dtype),
                                 out / f"{kind}-{rnd}.log")
            try:
                servers.wait_ready(port, proc)
                for name in names:
                    point = _measure(kind, name, port, proc, out / f"{kind}-{name}-{rnd}.json")
                    _record(results, rnd, kind, name, point)
            finally:
                servers.stop(proc)
    return results


def paired(kinds: list[str], names: list[str], rounds: int, model_dir: Path, port: int,
           out: Path, dtype: str = "float32", settle_timeout: float = 20.0,
           warm_rounds: int = 0) -> dict:
    commands = {kind: _command(kind, model_dir, port + i, dtype)
                for i, kind in enumerate(kinds)}
    return run_paired(commands, names, rounds, port, out, settle_timeout, warm_rounds)


def run_paired(commands: dict[str, list[str]], names: list[str], rounds: int, port: int,
               out: Path, settle_timeout: float = 20.0, warm_rounds: int = 0) -> dict:
    """Each server of ``commands`` (kind -> its command, serving on ``port`` + its index) up
    side by side; every round runs each workload on one and then the other, the order
    alternating between rounds, after the machine has gone quiet. The first
    ``warm_rounds`` rounds run unrecorded (for workloads without a warm-up of their own)."""
    kinds = list(commands)
    ports = {kind: port + i for i, kind in enumerate(kinds)}
    procs: dict[str, subprocess.Popen] = {}
    results: dict[str, dict[str, list[dict]]] = {}
    try:
        for kind in kinds:
            procs[kind] = servers.start(commands[kind], out / f"{kind}.log")
        for kind in kinds:
            servers.wait_ready(ports[kind], procs[kind])
        for rnd in range(-warm_rounds, rounds):
            for name in names:
                for kind in kinds if rnd % 2 == 0 else kinds[::-1]:
                    servers.settle(timeout=settle_timeout)
                    peer = next((procs[k] for k in kinds if k != kind), None)
                    point = _measure(kind, name, ports[kind], procs[kind],
                                     out / f"{kind}-{name}-{rnd}.json", peer)
                    if rnd >= 0:
                        _record(results, rnd, kind, name, point)
    finally:
        for proc in procs.values():
            servers.stop(proc)
    return results


def report(results: dict, out: Path, kinds: tuple[str, str] = ("izh", "vllm")) -> dict:
    """Medians per server, the ratio of the first's medians to the second's and, where both
    ran every round, the median of the per-round ratios."""
    summary: dict = {}
    a, b = kinds
    print(f"\n{'workload':10}{'metric':26}{a:>14}{b:>14}{'ratio':>8}{'per-round':>11}")
    for name, by_kind in results.items():
        for metric in METRICS:
            # A round can lack a metric (no inter-token gap when every answer came in one
            # chunk): medians are of the rounds that have it.
            med = {k: statistics.median(values) for k, pts in by_kind.items()
                   if (values := [pt[metric] for pt in pts if pt[metric] is not None])}
            ratio = (med[a] / med[b] if {a, b} <= med.keys() and med[b]
                     else None)  # a peer that sent everything in one chunk has ITL 0
            pairs = [x[metric] / y[metric] for x, y in
                     zip(by_kind.get(a, []), by_kind.get(b, []), strict=False)
                     if x[metric] is not None and y[metric]]
            per_round = statistics.median(pairs) if pairs else None
            summary.setdefault(name, {})[metric] = {**med, "ratio": ratio,
                                                    "per_round_ratio": per_round}
            print(f"{name:10}{metric:26}{med.get(a, float('nan')):14.1f}"
                  f"{med.get(b, float('nan')):14.1f}"
                  f"{ratio if ratio is not None else float('nan'):8.2f}"
                  f"{per_round if per_round is not None else float('nan'):11.2f}")
    summary["runs"] = results
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model-dir", type=Path)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--mode", choices=("paired", "sequential"), default="paired")
    p.add_argument("--port", type=int, default=8300, help="the first server's (paired: +1)")
    p.add_argument("--out", type=Path, default=ROOT / "bench-results" / "peers")
    p.add_argument("--servers", default="izh,vllm",
                   help="two of izh, vllm, each with an optional @DTYPE (the ratio: first/second)")
    p.add_argument("--workloads", default=DEFAULT_WORKLOADS, help=f"of {', '.join(WORKLOADS)}")
    p.add_argument("--warm-rounds", type=int, default=0,
                   help="paired: rounds run first and left out of the report")
    p.add_argument("--settle-timeout", type=float, default=20.0,
                   help="paired: at most this long waiting for a quiet machine before a run")
    p.add_argument("--shape", choices=sorted(SHAPES),
                   help="without --model-dir: a real model's shape, random weights")
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"),
                   help="both servers' (the checkpoint is fp32)")
    a = p.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    model_dir = a.model_dir or a.out / (a.shape or "tiny-qwen3")
    if a.model_dir is None:  # made once, reused (a finished build is checked, not redone)
        make_tiny_checkpoint(model_dir, SHAPES[a.shape] if a.shape else TinySpec())
    kinds = a.servers.split(",")
    args = (kinds, a.workloads.split(","), a.rounds, model_dir, a.port, a.out, a.dtype)
    results = (paired(*args, a.settle_timeout, a.warm_rounds) if a.mode == "paired"
               else sequential(*args))
    report(results, a.out, (kinds[0], kinds[1] if len(kinds) > 1 else "vllm"))


if __name__ == "__main__":
    main()
