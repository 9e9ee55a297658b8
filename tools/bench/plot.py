"""Sweep plots: output throughput and median TTFT against concurrency, one line per label."""

from __future__ import annotations

from math import nan
from pathlib import Path
from typing import Any


def _x(point: dict[str, Any], doc: dict[str, Any]) -> int:
    """Unlimited concurrency is drawn at the request count, its effective bound."""
    return point.get("max_concurrency") or doc["config"]["num_prompts"]


def plot_results(docs: list[dict[str, Any]], out: Path) -> Path:
    """Draw every result document onto one PNG, so two servers' sweeps sit side by side."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on a server
    import matplotlib.pyplot as plt

    fig, (ax_tp, ax_ttft) = plt.subplots(1, 2, figsize=(11, 4.2))
    ticks: set[int] = set()
    for doc in docs:
        points = sorted(doc["points"], key=lambda p: _x(p, doc))
        xs = [_x(p, doc) for p in points]
        ticks.update(xs)
        label = doc.get("label") or doc.get("base_url", "?")
        for ax, key in ((ax_tp, "output_throughput"), (ax_ttft, "median_ttft_ms")):
            ys = [nan if p.get(key) is None else p[key] for p in points]  # all-failed points
            ax.plot(xs, ys, marker="o", label=label)
    for ax, ylabel in ((ax_tp, "output throughput (tok/s)"), (ax_ttft, "median TTFT (ms)")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(sorted(ticks), [str(t) for t in sorted(ticks)])
        ax.minorticks_off()
        ax.set_xlabel("concurrency")
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
        ax.legend()
    cfg = docs[0]["config"] if docs else {}
    fig.suptitle(f"{cfg.get('endpoint', '')}: input {cfg.get('input_len')} / output "
                 f"{cfg.get('output_len')} tokens, {cfg.get('num_prompts')} prompts per point")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
