"""Our server against vLLM's CPU build on the same checkpoint, same client, interleaved.

    python tools/compare_peers.py [--model-dir DIR] [--rounds 2] [--out bench-results/peers]

One server runs at a time (an idle peer still takes CPU on a 2-core machine): each round starts
ours, runs every workload, stops it, then does the same for vLLM (``../shared/tools/vllm-cpu-peer``,
installed on first use). Each workload starts with one unmeasured wave of its own requests
(as many as its concurrency, at least 8), so that neither server is measured while it still
pays one-time costs (lazy compilation, first-touch memory, new connections): on a fresh server
a 256-prompt 32x32 run was ~20 % slower than the same run just after it. The report is the
median over rounds per server, and the ratios.
Without ``--model-dir`` it writes the issue's reference checkpoint (2 layers, hidden 256,
head_dim 64, vocab 2000, fp32; vLLM's CPU attention needs head_dim >= 32).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

from bench import servers

ROOT = Path(__file__).resolve().parents[1]
PEER = ROOT.parent / "shared" / "tools" / "vllm-cpu-peer"
WORKLOADS = {  # name: bench_serve arguments
    "32x32": ["--num-prompts", "256", "--concurrency", "32", "--input-len", "32",
              "--output-len", "32"],
    "256x128": ["--num-prompts", "768", "--concurrency", "256", "--input-len", "32",
                "--output-len", "128"],
    "1x128": ["--num-prompts", "12", "--concurrency", "1", "--input-len", "32",
              "--output-len", "128"],
}
METRICS = ("output_throughput", "median_ttft_ms", "median_itl_ms", "median_tpot_ms",
           "server_cpu_us_per_token", "client_cpu_us_per_token")


def _warmup(workload: list[str]) -> int:
    """One wave of the workload's own requests: its concurrency, at least 8."""
    return max(8, int(workload[workload.index("--concurrency") + 1]))


def _command(kind: str, model_dir: Path, port: int) -> list[str]:
    if kind == "izh":
        return [sys.executable, "-m", "izh_trio", "serve", "--model-dir", str(model_dir),
                "--port", str(port)]
    return [str(PEER), str(model_dir), str(port)]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model-dir", type=Path)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--port", type=int, default=8300)
    p.add_argument("--out", type=Path, default=ROOT / "bench-results" / "peers")
    p.add_argument("--servers", default="izh,vllm")
    p.add_argument("--workloads", default=",".join(WORKLOADS))
    a = p.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    model_dir = a.model_dir or a.out / "tiny-qwen3"
    if a.model_dir is None and not (model_dir / "config.json").is_file():
        subprocess.run([sys.executable, str(ROOT / "tools" / "make_tiny_checkpoint.py"),
                        str(model_dir)], check=True)
    results: dict[str, dict[str, list[dict]]] = {}
    for rnd in range(a.rounds):
        for kind in a.servers.split(","):
            proc = servers.start(_command(kind, model_dir, a.port), a.out / f"{kind}-{rnd}.log")
            try:
                servers.wait_ready(a.port, proc)
                for name in a.workloads.split(","):
                    out = a.out / f"{kind}-{name}-{rnd}.json"
                    cpu_before = servers.tree_cpu_s(proc.pid)
                    subprocess.run([sys.executable, str(ROOT / "tools" / "bench_serve.py"),
                                    "--base-url", f"http://127.0.0.1:{a.port}",
                                    "--warmup", str(_warmup(WORKLOADS[name])),
                                    "--no-progress", "--label", kind, "--result-json", str(out),
                                    *WORKLOADS[name]], check=False, stdout=subprocess.DEVNULL)
                    point = json.loads(out.read_text())["points"][0]
                    # Warm-up requests included: a small overestimate, the same for both.
                    point["server_cpu_us_per_token"] = (
                        1e6 * (servers.tree_cpu_s(proc.pid) - cpu_before)
                        / max(1, point["total_output_tokens"]))
                    results.setdefault(name, {}).setdefault(kind, []).append(point)
                    print(f"round {rnd} {kind:5} {name:8} " + "  ".join(
                        f"{m}={point[m]:.1f}" for m in METRICS if point.get(m) is not None),
                        flush=True)
            finally:
                servers.stop(proc)
    report = {}
    print(f"\n{'workload':10}{'metric':20}{'izh':>12}{'vllm':>12}{'izh/vllm':>10}")
    for name, by_kind in results.items():
        for metric in METRICS:
            med = {k: statistics.median(pt[metric] for pt in pts) for k, pts in by_kind.items()}
            ratio = (med["izh"] / med["vllm"] if {"izh", "vllm"} <= med.keys() and med["vllm"]
                     else None)  # a peer that sent everything in one chunk has ITL 0
            report.setdefault(name, {})[metric] = {**med, "ratio": ratio}
            print(f"{name:10}{metric:20}{med.get('izh', float('nan')):12.1f}"
                  f"{med.get('vllm', float('nan')):12.1f}"
                  f"{ratio if ratio is not None else float('nan'):10.2f}")
    (a.out / "summary.json").write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
