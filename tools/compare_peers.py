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
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

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


def _start(kind: str, model_dir: Path, port: int, log: Path) -> subprocess.Popen:
    if kind == "izh":
        cmd = [sys.executable, "-m", "izh_trio", "serve", "--model-dir", str(model_dir),
               "--port", str(port)]
    else:
        cmd = [str(PEER), str(model_dir), str(port)]
    return subprocess.Popen(cmd, stdout=log.open("wb"), stderr=subprocess.STDOUT,
                            start_new_session=True)


def _wait_ready(port: int, proc: subprocess.Popen, timeout: float = 900) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    raise RuntimeError("server did not start")


def _tree_cpu_s(root: int) -> float:
    """User + system CPU seconds of ``root`` and all its live descendants (Linux /proc)."""
    tick, total, todo = os.sysconf("SC_CLK_TCK"), 0.0, [root]
    while todo:
        pid = todo.pop()
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick
            # Children hang off the thread that spawned them, not always the main one.
            children = {int(c) for task in Path(f"/proc/{pid}/task").iterdir()
                        for c in (task / "children").read_text().split()}
        except OSError:  # gone meanwhile
            continue
        todo += children
    return total


def _stop(proc: subprocess.Popen) -> None:
    os.killpg(proc.pid, signal.SIGINT)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


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
            proc = _start(kind, model_dir, a.port, a.out / f"{kind}-{rnd}.log")
            try:
                _wait_ready(a.port, proc)
                for name in a.workloads.split(","):
                    out = a.out / f"{kind}-{name}-{rnd}.json"
                    cpu_before = _tree_cpu_s(proc.pid)
                    subprocess.run([sys.executable, str(ROOT / "tools" / "bench_serve.py"),
                                    "--base-url", f"http://127.0.0.1:{a.port}",
                                    "--warmup", str(_warmup(WORKLOADS[name])),
                                    "--no-progress", "--label", kind, "--result-json", str(out),
                                    *WORKLOADS[name]], check=False, stdout=subprocess.DEVNULL)
                    point = json.loads(out.read_text())["points"][0]
                    # Warm-up requests included: a small overestimate, the same for both.
                    point["server_cpu_us_per_token"] = (
                        1e6 * (_tree_cpu_s(proc.pid) - cpu_before)
                        / max(1, point["total_output_tokens"]))
                    results.setdefault(name, {}).setdefault(kind, []).append(point)
                    print(f"round {rnd} {kind:5} {name:8} " + "  ".join(
                        f"{m}={point[m]:.1f}" for m in METRICS if point.get(m) is not None),
                        flush=True)
            finally:
                _stop(proc)
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
