"""One generation, engine stream to text deltas, shared by every OpenAI route.

The engine request lives exactly as long as the ``async for`` over :func:`generate`: a
disconnect, a deadline or any exception unwinds through ``open_stream`` and aborts it.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import attrs

from izh_trio.frontend.detokenizer import IncrementalDetokenizer
from izh_trio.frontend.engine_client import EngineUnavailable
from izh_trio.frontend.errors import APIError
from izh_trio.frontend.request_stream import EngineError
from izh_trio.frontend.server import Server
from izh_trio.wire import SamplingParams


@attrs.define
class TextDelta:
    text: str
    token_ids: list[int]
    finish_reason: str | None
    num_prompt_tokens: int
    num_output_tokens: int
    num_cached_tokens: int


def resolve_params(
    server: Server, prompt_len: int, *, max_tokens: int | None, temperature: float | None,
    top_p: float | None, top_k: int | None, min_p: float | None, seed: int | None,
    ignore_eos: bool,
) -> SamplingParams:
    """Request values over the checkpoint's generation defaults; check the context fits."""
    limit = server.ready.max_model_len
    if max_tokens is None:
        max_tokens = limit - prompt_len
    if prompt_len + max_tokens > limit:
        raise APIError(
            400,
            f"This model's maximum context length is {limit} tokens. However, you requested "
            f"{prompt_len + max_tokens} tokens ({prompt_len} in the messages, {max_tokens} in "
            f"the completion). Please reduce the length of the messages or completion.",
            param="max_tokens", code="context_length_exceeded",
        )
    d = server.tokenizer.defaults
    return SamplingParams(
        max_tokens=max_tokens,
        temperature=d.temperature if temperature is None else temperature,
        top_p=d.top_p if top_p is None else top_p,
        top_k=d.top_k if top_k is None else top_k,
        min_p=d.min_p if min_p is None else min_p,
        seed=seed,
        ignore_eos=ignore_eos,
    )


def check_prompt(server: Server, prompt_ids: list[int]) -> None:
    if not prompt_ids:
        raise APIError(400, "the prompt is empty", param="prompt")
    vocab = server.ready.model.vocab_size
    if any(not 0 <= t < vocab for t in prompt_ids):
        raise APIError(400, f"prompt token ids must be in [0, {vocab})", param="prompt")


async def generate(
    server: Server, request_id: str, prompt_ids: list[int], params: SamplingParams,
    *, arrival: float, skip_special_tokens: bool = True,
) -> AsyncIterator[TextDelta]:
    client, metrics = server.client, server.metrics
    detok = IncrementalDetokenizer(server.tokenizer.tokenizer, skip_special_tokens)
    last = None
    try:
        async with client.open_stream(request_id, prompt_ids, params) as stream:
            async for delta in stream:
                now = time.monotonic()
                if last is None:
                    metrics.ttft.observe(now - arrival)
                else:
                    metrics.itl.observe(now - last)
                last = now
                reason = delta.finish_reason.value if delta.finish_reason else None
                if reason is not None:
                    metrics.e2e.observe(now - arrival)
                    metrics.request_success.labels(finished_reason=reason).inc()
                yield TextDelta(detok.push(delta.token_ids), delta.token_ids, reason,
                                delta.num_prompt_tokens, delta.num_output_tokens,
                                delta.num_cached_tokens)
    except EngineUnavailable as exc:
        raise APIError(503, f"the engine is unavailable: {exc}") from None
    except EngineError as exc:
        if exc.rejected:
            raise APIError(400, str(exc)) from None
        raise APIError(500, f"the request failed in the engine: {exc}") from None
