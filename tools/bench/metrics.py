"""From per-request outcomes to the numbers ``vllm bench serve`` reports, and a table."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from tools.bench.client import Outcome

LATENCIES = ("ttft", "tpot", "itl", "e2el")
STATS = ("mean", "median", "std", "p90", "p99")
MAX_ERRORS = 5


def _stats(name: str, seconds: list[float]) -> dict[str, float | None]:
    """Latency stats in ms; None where nothing was measured (say, every request failed)."""
    a = np.asarray(seconds, dtype=float) * 1000.0
    if a.size == 0:
        return {f"{s}_{name}_ms": None for s in STATS}
    return {f"mean_{name}_ms": float(a.mean()), f"median_{name}_ms": float(np.median(a)),
            f"std_{name}_ms": float(a.std()), f"p90_{name}_ms": float(np.percentile(a, 90)),
            f"p99_{name}_ms": float(np.percentile(a, 99))}


def _peaks(done: list[Outcome], duration: float) -> tuple[float, int]:
    """Peak output tok/s over a sliding 1 s window, and peak requests in flight.

    A chunk may carry several tokens (servers coalesce), so each request's tokens are
    spread evenly over its chunks. Runs shorter than 1 s use their duration as the window.
    """
    if not done or duration <= 0:
        return 0.0, 0
    events = sorted((t, o.output_tokens / len(o.chunk_times))
                    for o in done for t in o.chunk_times)
    window, best, inside, j = min(1.0, duration), 0.0, 0.0, 0
    for t, tokens in events:  # each window starts at a chunk: [t, t + window)
        while j < len(events) and events[j][0] < t + window:
            inside += events[j][1]
            j += 1
        best = max(best, inside / window)
        inside -= tokens
    edges = sorted([(o.start, 1) for o in done] + [(o.end, -1) for o in done])
    level = peak = 0
    for _, step in edges:  # at a tie the end (-1) sorts first: back-to-back is not overlap
        level += step
        peak = max(peak, level)
    return best, peak


def summarize(outcomes: list[Outcome], duration: float) -> dict[str, Any]:
    """Every metric of one run; throughputs count completed requests only."""
    done = [o for o in outcomes if o.ok]
    failed = [o for o in outcomes if not o.ok]
    n_in = sum(o.prompt_tokens or 0 for o in done)
    n_out = sum(o.output_tokens for o in done)
    per_s = (lambda x: x / duration) if duration > 0 else (lambda x: 0.0)
    peak_tok, peak_req = _peaks(done, duration)
    point: dict[str, Any] = {
        "completed": len(done), "failed": len(failed), "duration": duration,
        "total_input_tokens": n_in, "total_output_tokens": n_out,
        "request_throughput": per_s(len(done)), "output_throughput": per_s(n_out),
        "total_token_throughput": per_s(n_in + n_out),
        "max_output_tokens_per_s": peak_tok, "max_concurrent_requests": peak_req,
    }
    point |= _stats("ttft", [o.ttft for o in done])
    point |= _stats("tpot", [t for o in done if (t := o.tpot) is not None])
    point |= _stats("itl", [x for o in done for x in o.itls])
    point |= _stats("e2el", [o.e2e for o in done])
    point["errors"] = [o.error for o in failed[:MAX_ERRORS]]
    return point


def client_cpu(cpu_s: float, output_tokens: int) -> dict[str, float | None]:
    """The load generator's own CPU over a point: on a small box it competes with the server."""
    per_token = cpu_s / output_tokens * 1e6 if output_tokens else None
    return {"client_cpu_s": cpu_s, "client_cpu_us_per_token": per_token}


def point_name(point: dict[str, Any]) -> str:
    c, r = point.get("max_concurrency"), point.get("request_rate")
    parts = [f"c={c}" if c else "c=inf"]
    if r not in (None, "inf"):
        parts.append(f"r={r:g}")
    return " ".join(parts)


ROWS: list[tuple[str, str, str]] = [
    ("completed", "completed requests", "d"), ("failed", "failed requests", "d"),
    ("duration", "duration (s)", ".2f"),
    ("total_input_tokens", "input tokens", "d"), ("total_output_tokens", "output tokens", "d"),
    ("request_throughput", "request throughput (req/s)", ".2f"),
    ("output_throughput", "output throughput (tok/s)", ".1f"),
    ("total_token_throughput", "total throughput (tok/s)", ".1f"),
    ("max_output_tokens_per_s", "peak output (tok/s)", ".1f"),
    ("max_concurrent_requests", "peak concurrent requests", "d"),
] + [(f"{s}_{m}_ms", f"{s} {m.upper()} (ms)", ".2f")
     for m in LATENCIES for s in ("mean", "median", "p99")] + [
    ("client_cpu_s", "client CPU (s)", ".2f"),
    ("client_cpu_us_per_token", "client CPU per token (us)", ".1f"),
]


def _cell(value: Any, fmt: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return format(value, fmt)


def format_table(points: list[dict[str, Any]], title: str) -> str:
    """Metrics down, sweep points across: the one layout that reads well for 1 or 10 points."""
    heads = [point_name(p) for p in points]
    width = max(12, *(len(h) + 2 for h in heads))
    label_w = max(len(r[1]) for r in ROWS) + 2
    rule = "=" * (label_w + width * len(points))
    lines = [rule, title.center(len(rule)), rule,
             "".ljust(label_w) + "".join(h.rjust(width) for h in heads), "-" * len(rule)]
    for key, label, fmt in ROWS:
        lines.append(label.ljust(label_w)
                     + "".join(_cell(p.get(key), fmt).rjust(width) for p in points))
    lines.append(rule)
    for name, p in zip(heads, points, strict=True):
        if p["failed"]:
            lines.append(f"{name}: {p['failed']} failed; first errors:")
            lines += [f"  - {e}" for e in p["errors"]]
    return "\n".join(lines)
