"""What to send: server discovery, random prompts, lengths and Poisson arrival times."""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from typing import Any

import httpx
import numpy as np

# Plain words for chat prompts and for the text we tokenize to find valid token ids.
_WORD_TEXT = """time year people way day man thing woman life child world school state family
student group country problem hand part place case week company system program question
work government number night point home water room mother area money story fact month lot
right study book eye job word business issue side kind head house service friend father
power hour game line end member law car city community name president team minute idea
kid body information back parent face others level office door health person art war
history party result change morning reason research girl guy moment air teacher force
education river stone light green quick slow bright small large early late open close"""
WORDS = tuple(_WORD_TEXT.split())


@dataclass
class ServerInfo:
    """What the server told us; every field has a fallback so a dead URL still runs."""

    model: str
    max_model_len: int | None = None
    corpus_ids: list[int] | None = None  # valid ids from /tokenize, when the server has it
    tokens_per_word: float = 1.0
    note: str = ""


async def discover(client: httpx.AsyncClient, model: str | None) -> ServerInfo:
    """Ask ``/v1/models`` (and vLLM's ``/tokenize``, if there) what the model accepts."""
    info = ServerInfo(model=model or "")
    try:
        r = await client.get("/v1/models", timeout=10)
        r.raise_for_status()
        cards = r.json().get("data") or []
        card = next((c for c in cards if c.get("id") == model), cards[0] if cards else {})
        info.model = model or card.get("id", "")
        info.max_model_len = card.get("max_model_len")
    except (httpx.HTTPError, ValueError) as exc:
        info.note = f"GET /v1/models failed ({type(exc).__name__}: {exc})"
    if not info.model:
        return info
    text = " ".join(np.random.default_rng(0).choice(WORDS, 4000))
    try:
        r = await client.post("/tokenize", timeout=30, json={
            "model": info.model, "prompt": text, "add_special_tokens": False})
        if r.status_code == 200 and r.json().get("tokens"):
            info.corpus_ids = [int(t) for t in r.json()["tokens"]]
            info.tokens_per_word = len(info.corpus_ids) / 4000
    except (httpx.HTTPError, ValueError):
        pass
    return info


def lengths(rng: np.random.Generator, n: int, mean: int, ratio: float) -> list[int]:
    """Uniform integers in [mean*(1-ratio), mean*(1+ratio)], at least 1."""
    lo = max(1, math.floor(mean * (1 - ratio)))
    hi = max(lo, math.ceil(mean * (1 + ratio)))
    return [int(x) for x in rng.integers(lo, hi + 1, size=n)]


def build_payloads(
    info: ServerInfo, *, endpoint: str, n: int, input_len: int, output_len: int,
    range_ratio: float, seed: int, vocab_size: int, temperature: float, ignore_eos: bool,
) -> list[dict[str, Any]]:
    """``n`` request bodies, the same for a given seed so sweep points compare like for like."""
    rng = np.random.default_rng(seed)
    ins = lengths(rng, n, input_len, range_ratio)
    outs = lengths(rng, n, output_len, range_ratio)
    longest = max(i + o for i, o in zip(ins, outs, strict=True))
    if info.max_model_len and longest > info.max_model_len:
        print(f"warning: some prompts + outputs exceed max_model_len {info.max_model_len}",
              file=sys.stderr)
    payloads = []
    for i, o in zip(ins, outs, strict=True):
        body: dict[str, Any] = {
            "model": info.model, "max_tokens": o, "temperature": temperature,
            "stream": True, "stream_options": {"include_usage": True}, "ignore_eos": ignore_eos,
        }
        if endpoint == "chat":
            words = rng.choice(WORDS, max(1, round(i / info.tokens_per_word)))
            body["messages"] = [{"role": "user", "content": " ".join(words)}]
        elif info.corpus_ids:  # windows of real tokenized text: valid ids by construction
            ids = info.corpus_ids * (1 + i // len(info.corpus_ids))
            start = int(rng.integers(0, len(ids) - i + 1))
            body["prompt"] = ids[start:start + i]
        else:  # stay clear of the special tokens that sit at the top of the vocabulary
            body["prompt"] = [int(t) for t in rng.integers(0, max(1, vocab_size - 10), size=i)]
        payloads.append(body)
    return payloads


def arrival_offsets(rng: np.random.Generator, n: int, rate: float) -> list[float]:
    """Start times in seconds from the run's start: a Poisson process, or all at 0 for inf."""
    if math.isinf(rate):
        return [0.0] * n
    return [float(x) for x in np.cumsum(rng.exponential(1.0 / rate, size=n))]
