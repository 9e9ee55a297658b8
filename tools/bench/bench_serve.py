"""Load generator for any OpenAI-compatible server, reporting what ``vllm bench serve`` does.

    python -m tools.bench.bench_serve --base-url http://127.0.0.1:8000 --model NAME \\
        --concurrency 1,8,32 --num-prompts 200 --input-len 512 --output-len 128 \\
        --result-json mine.json --plot mine.png --label mine
    python -m tools.bench.bench_serve plot mine.json vllm.json --out cmp.png

Every request streams, so TTFT, ITL and TPOT are what a client sees, network included.
Each point also reports the client's own CPU (``client_cpu_us_per_token``): on a small box
the load generator shares the cores with the server it measures.
A comma list for ``--concurrency`` runs one point per value with the same prompts.
Exit status: 0 when every request completed; 3 when some failed (the table and the JSON
still carry them, with the first errors); 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import json
import math
import resource
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import numpy as np
import trio

from tools.bench.client import Outcome, stream_one
from tools.bench.http import HTTPClient
from tools.bench.metrics import client_cpu, format_table, point_name, summarize
from tools.bench.plot import plot_results
from tools.bench.workload import ServerInfo, arrival_offsets, build_payloads, discover

PATHS = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}
EXIT_FAILURES = 3


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def _concurrencies(text: str) -> list[int | None]:
    """``"1,8,32"`` -> a sweep; ``"inf"`` or ``"0"`` -> no client-side cap."""
    out: list[int | None] = []
    for part in text.split(","):
        part = part.strip().lower()
        if part in ("inf", "0", "none"):
            out.append(None)
        elif part.isdigit():
            out.append(int(part))
        else:
            raise argparse.ArgumentTypeError(f"not a concurrency: {part!r}")
    return out


def _base_url(text: str) -> str:
    """Scheme and host only: a trailing ``/v1`` is dropped so either spelling works."""
    parts = urlsplit(text)
    if parts.scheme == "https":
        raise argparse.ArgumentTypeError(
            f"https is not supported: the streaming client speaks plain http only ({text!r})")
    if parts.scheme != "http" or not parts.netloc:
        raise argparse.ArgumentTypeError(f"not an http URL: {text!r}")
    base = text.rstrip("/")
    return base[:-3] if base.endswith("/v1") else base


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--base-url", type=_base_url, default="http://127.0.0.1:8000")
    p.add_argument("--model", default=None, help="default: the first of GET /v1/models")
    p.add_argument("--endpoint", choices=sorted(PATHS), default="completions")
    p.add_argument("--num-prompts", type=int, default=100, help="requests per sweep point")
    p.add_argument("--concurrency", type=_concurrencies, default=[None],
                   help="max requests in flight; a comma list is a sweep")
    p.add_argument("--request-rate", type=float, default=math.inf,
                   help="Poisson arrivals per second; inf sends them all at once")
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--range-ratio", type=float, default=0.0,
                   help="lengths uniform in [L*(1-r), L*(1+r)]")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--vocab-size", type=int, default=2000,
                   help="random prompt ids stay below this minus 10 (when no /tokenize)")
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--ignore-eos", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--api-key", default=None, help="sent as a Bearer token")
    p.add_argument("--timeout", type=float, default=600.0, help="per request, seconds")
    p.add_argument("--warmup", type=int, default=0, help="unmeasured requests first")
    p.add_argument("--label", default=None, help="name in the JSON and the plot legend")
    p.add_argument("--result-json", type=Path, default=None)
    p.add_argument("--plot", type=Path, default=None, help="PNG of the sweep")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=True)
    a = p.parse_args(argv)
    if a.num_prompts < 1 or a.input_len < 1 or a.output_len < 1 or a.warmup < 0:
        p.error("--num-prompts, --input-len and --output-len must be >= 1, --warmup >= 0")
    if not 0.0 <= a.range_ratio < 1.0 or not a.request_rate > 0 or not a.timeout > 0:
        p.error("need 0 <= --range-ratio < 1, --request-rate > 0 and --timeout > 0")
    return a


def _progress_bar(total: int, desc: str, enabled: bool) -> Any:
    """tqdm on stderr, or a stand-in with the same ``update``/``close`` when off or missing."""
    class _Null:
        def update(self, _n: int = 1) -> None: ...
        def close(self) -> None: ...

    if not enabled:
        return _Null()
    try:
        from tqdm import tqdm
    except ImportError:
        return _Null()
    return tqdm(total=total, desc=desc, unit="req", file=sys.stderr, leave=False)


def _cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


async def run_point(
    client: HTTPClient, path: str, payloads: list[dict[str, Any]], *,
    concurrency: int | None, rate: float, seed: int, timeout: float, progress: bool,
) -> dict[str, Any]:
    """One sweep point: start requests at their arrival times, at most ``concurrency`` open."""
    n = len(payloads)
    offsets = arrival_offsets(np.random.default_rng(seed), n, rate)
    gate = trio.Semaphore(concurrency or n)
    outcomes: list[Outcome] = [Outcome() for _ in range(n)]
    point: dict[str, Any] = {"max_concurrency": concurrency,
                             "request_rate": "inf" if math.isinf(rate) else rate}
    bar = _progress_bar(n, point_name(point), progress)

    async def one(i: int) -> None:
        async with gate:
            outcomes[i] = await stream_one(client, path, payloads[i], timeout)
        bar.update(1)

    point["started_at"] = _now()
    cpu0 = _cpu_s()
    t0 = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for i, offset in enumerate(offsets):
            delay = t0 + offset - time.perf_counter()
            if delay > 0:
                await trio.sleep(delay)
            nursery.start_soon(one, i)
    duration = time.perf_counter() - t0
    cpu = _cpu_s() - cpu0
    bar.close()
    point |= summarize(outcomes, duration)
    return point | client_cpu(cpu, point["total_output_tokens"])


def _headers(args: argparse.Namespace) -> dict[str, str]:
    return {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}


def _client(args: argparse.Namespace, connections: int) -> httpx.AsyncClient:
    """For the few probes only: HTTP/1.1, no proxies (only ``--base-url``)."""
    return httpx.AsyncClient(
        base_url=args.base_url, headers=_headers(args), http1=True, http2=False, trust_env=False,
        limits=httpx.Limits(max_connections=connections, max_keepalive_connections=connections),
        timeout=httpx.Timeout(args.timeout, connect=min(args.timeout, 30.0)))


async def benchmark(args: argparse.Namespace) -> dict[str, Any]:
    """Discover, warm up, run every point; returns the result document."""
    started = _now()
    cap = max((c or args.num_prompts) for c in args.concurrency)
    # Probes get their own connections: a 404 to a POST whose body is still in flight can
    # leave a hypercorn keep-alive connection stuck, and the first request would hang on it.
    async with _client(args, 2) as probe:
        info: ServerInfo = await discover(probe, args.model)
    # The streamed requests go through tools.bench.http: httpx cost ~90 us of CPU per token.
    async with HTTPClient(args.base_url, headers=_headers(args), max_connections=cap,
                          connect_timeout=min(args.timeout, 30.0)) as client:
        if info.note:
            print(f"note: {info.note}", file=sys.stderr)
        if not info.model:
            raise SystemExit("error: no --model given and GET /v1/models did not name one")
        payloads = build_payloads(
            info, endpoint=args.endpoint, n=args.num_prompts, input_len=args.input_len,
            output_len=args.output_len, range_ratio=args.range_ratio, seed=args.seed,
            vocab_size=args.vocab_size, temperature=args.temperature,
            ignore_eos=args.ignore_eos)
        path = PATHS[args.endpoint]
        if args.warmup:
            warm = [payloads[i % len(payloads)] for i in range(args.warmup)]
            w = await run_point(client, path, warm, concurrency=args.concurrency[0],
                                rate=math.inf, seed=args.seed, timeout=args.timeout,
                                progress=False)
            print(f"warmup: {w['completed']} completed, {w['failed']} failed", file=sys.stderr)
        points = []
        for c in args.concurrency:
            points.append(await run_point(client, path, payloads, concurrency=c,
                                          rate=args.request_rate, seed=args.seed,
                                          timeout=args.timeout, progress=args.progress))
    config = {k: v for k, v in vars(args).items() if k not in ("api_key", "plot", "result_json")}
    config |= {"concurrency": args.concurrency, "model": info.model,
               "request_rate": "inf" if math.isinf(args.request_rate) else args.request_rate}
    source = ("words" if args.endpoint == "chat"
              else "tokenize" if info.corpus_ids else "random-ids")
    return {
        "schema_version": 1, "tool": "tools.bench.bench_serve",
        "label": args.label or f"{info.model}@{urlsplit(args.base_url).netloc}",
        "base_url": args.base_url, "model": info.model, "endpoint": args.endpoint,
        "started_at": started, "finished_at": _now(), "config": config,
        "server": {"max_model_len": info.max_model_len, "prompt_source": source,
                   "note": info.note},
        "points": points,
    }


def plot_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="bench_serve.py plot",
                                description="draw result JSONs onto one figure")
    p.add_argument("results", nargs="+", type=Path)
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args(argv)
    docs = [json.loads(r.read_text()) for r in a.results]
    print(plot_results(docs, a.out))
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["plot"]:
        return plot_main(argv[1:])
    args = parse_args(argv)
    doc = trio.run(benchmark, args)
    print(format_table(doc["points"], f"{doc['label']} - {doc['endpoint']} - {doc['base_url']}"))
    if args.result_json:
        args.result_json.parent.mkdir(parents=True, exist_ok=True)
        args.result_json.write_text(json.dumps(doc, indent=2, default=str) + "\n")
        print(f"wrote {args.result_json}")
    if args.plot:
        print(f"wrote {plot_results([doc], args.plot)}")
    return EXIT_FAILURES if any(p["failed"] for p in doc["points"]) else 0


if __name__ == "__main__":
    sys.exit(main())
