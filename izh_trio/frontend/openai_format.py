"""Request fields to engine parameters, and engine results to OpenAI's response shapes."""

from __future__ import annotations

from typing import Any

from tokenizers import Tokenizer

from izh_trio.frontend.errors import APIError
from izh_trio.frontend.schemas import SamplingFields
from izh_trio.frontend.server import Server
from izh_trio.wire import SamplingParams, TokenLogprobs

#: JSON has no -inf; like vLLM, report impossible tokens with a very low finite logprob.
_FLOOR = -9999.0


def check_prompt(server: Server, prompt_ids: list[int], *, max_tokens: int | None) -> None:
    if not prompt_ids:
        raise APIError(400, "the prompt is empty", param="prompt")
    limit = server.ready.max_model_len
    if len(prompt_ids) > limit:  # before the scan below: a client's ids may be millions
        raise context_length_error(limit, len(prompt_ids), max_tokens)
    vocab = server.ready.model.vocab_size
    if any(not 0 <= t < vocab for t in prompt_ids):
        raise APIError(400, f"prompt token ids must be in [0, {vocab})", param="prompt")


def context_length_error(limit: int, prompt_len: int, max_tokens: int | None) -> APIError:
    """The 400 for a prompt and completion that do not fit in the model's context."""
    if max_tokens is None:
        max_tokens = limit - prompt_len
    return APIError(
        400,
        f"This model's maximum context length is {limit} tokens. However, you requested "
        f"{prompt_len + max_tokens} tokens ({prompt_len} in the prompt, {max_tokens} for "
        f"the completion). Please reduce the length of the prompt or the completion.",
        param="max_tokens", code="context_length_exceeded",
    )


def request_salt(req: SamplingFields) -> str | None:
    """The prefix cache's salt: ``cache_salt``, or OpenAI's ``prompt_cache_key`` (the same
    partition under another name); both given and different is a 400."""
    if req.cache_salt is not None and req.prompt_cache_key is not None \
            and req.cache_salt != req.prompt_cache_key:
        raise APIError(400, "cache_salt and prompt_cache_key both name the prefix cache's "
                            "partition and differ; give one", param="prompt_cache_key")
    for name in ("cache_salt", "prompt_cache_key"):
        try:  # it crosses the engine pipe as UTF-8, which a lone surrogate cannot be
            (getattr(req, name) or "").encode()
        except UnicodeEncodeError:
            raise APIError(400, f"{name} must be valid Unicode text", param=name) from None
    return req.cache_salt if req.cache_salt is not None else req.prompt_cache_key


def sampling_params(
    server: Server, req: SamplingFields, prompt_len: int, *, max_tokens: int | None,
    logprobs: int | None = None, prompt_logprobs: int | None = None, index: int = 0,
) -> SamplingParams:
    """Request values over the checkpoint's generation defaults; check the context fits."""
    limit = server.ready.max_model_len
    if max_tokens is None:
        max_tokens = limit - prompt_len
    if max_tokens < 1 or prompt_len + max_tokens > limit:
        raise context_length_error(limit, prompt_len, max_tokens)
    vocab = server.ready.model.vocab_size
    for name, ids in (("stop_token_ids", req.stop_token_ids or ()),
                      ("logit_bias", [t for t, _ in req.logit_bias])):
        if any(not 0 <= t < vocab for t in ids):
            raise APIError(400, f"'{name}' token ids must be in [0, {vocab})", param=name)
    d = server.tokenizer.defaults
    seed = req.seed
    if seed is not None and index:  # n > 1 with a seed: distinct, still reproducible, samples
        seed += index
    return SamplingParams(
        max_tokens=max_tokens,
        temperature=d.temperature if req.temperature is None else req.temperature,
        top_p=d.top_p if req.top_p is None else req.top_p,
        top_k=d.top_k if req.top_k is None else req.top_k,
        min_p=d.min_p if req.min_p is None else req.min_p,
        seed=seed,
        ignore_eos=req.ignore_eos,
        stop_token_ids=tuple(req.stop_token_ids or ()),
        min_tokens=min(req.min_tokens, max_tokens),
        repetition_penalty=(d.repetition_penalty if req.repetition_penalty is None
                            else req.repetition_penalty),
        presence_penalty=req.presence_penalty,
        frequency_penalty=req.frequency_penalty,
        logit_bias=req.logit_bias,
        logprobs=logprobs,
        prompt_logprobs=prompt_logprobs,
    )


def usage(prompt: int, completion: int, cached: int) -> dict[str, Any]:
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached}}


class TokenText:
    """Token ids as the text clients see in logprobs, decoded one id at a time (cached)."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self._tokenizer = tokenizer
        self._cache: dict[int, str] = {}

    def __call__(self, token_id: int) -> str:
        text = self._cache.get(token_id)
        if text is None:
            text = self._cache[token_id] = self._tokenizer.decode([token_id],
                                                                  skip_special_tokens=False)
        return text


def _lp(value: float) -> float:
    return max(value, _FLOOR)


def completion_logprobs(
    text_of: TokenText, entries: list[TokenLogprobs | None], first_offset: int,
    token_ids: list[int],
) -> dict[str, Any]:
    """OpenAI's legacy shape; ``None`` entries (the first prompt token) get null values."""
    tokens, lps, tops, offsets = [], [], [], []
    offset = first_offset
    for token_id, entry in zip(token_ids, entries, strict=True):
        text = text_of(token_id)
        tokens.append(text)
        offsets.append(offset)
        offset += len(text)
        if entry is None:
            lps.append(None)
            tops.append(None)
            continue
        lps.append(_lp(entry.logprob))
        top = {text_of(t): _lp(lp) for t, lp in zip(entry.top_ids, entry.top_logprobs,
                                                     strict=True)}
        top.setdefault(text, _lp(entry.logprob))
        tops.append(top)
    return {"tokens": tokens, "token_logprobs": lps, "top_logprobs": tops,
            "text_offset": offsets}


def chat_logprobs(text_of: TokenText, entries: list[TokenLogprobs]) -> list[dict[str, Any]]:
    def item(token_id: int, logprob: float) -> dict[str, Any]:
        text = text_of(token_id)
        return {"token": text, "logprob": _lp(logprob), "bytes": list(text.encode())}

    return [{**item(e.token_id, e.logprob),
             "top_logprobs": [item(t, lp) for t, lp in zip(e.top_ids, e.top_logprobs,
                                                             strict=True)]}
            for e in entries]
