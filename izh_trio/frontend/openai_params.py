"""OpenAI's request fields (completions and chat alike) to engine parameters, checked."""

from __future__ import annotations

from izh_trio.frontend.errors import APIError
from izh_trio.frontend.schemas import SamplingFields
from izh_trio.frontend.server import Server
from izh_trio.wire import SamplingParams


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
    grammar: str | None = None,
) -> SamplingParams:
    """Request values over the checkpoint's generation defaults; check the context fits.
    ``grammar``: the output constraint's, checked (``serving.intake.checked_constraint``)."""
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
        grammar=grammar,
    )
