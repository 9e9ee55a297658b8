"""``POST /v1/completions``: OpenAI's legacy completions (with vLLM's extensions)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

import attrs
from quart import Blueprint, Response, current_app, request

from izh_trio.frontend import sse
from izh_trio.frontend.errors import APIError
from izh_trio.frontend.fingerprint import system_fingerprint
from izh_trio.frontend.generation import (
    ChoiceDelta,
    ChoiceSpec,
    Generation,
    GenerationPlan,
    open_generation,
)
from izh_trio.frontend.openai_format import (
    TokenText,
    check_prompt,
    completion_logprobs,
    context_length_error,
    request_salt,
    sampling_params,
    usage,
)
from izh_trio.frontend.routes.common import (
    admit,
    checked_constraint,
    constrained,
    deadline_of,
    json_body,
    open_streamed,
    request_id,
    resolve_model,
    server_of,
)
from izh_trio.frontend.schemas import CompletionRequest, parse_body
from izh_trio.frontend.server import Server
from izh_trio.frontend.structured import request_constraint

bp = Blueprint("completions", __name__)


@attrs.define
class _Prompt:
    ids: list[int]
    text: str  # "" for an id prompt unless echo shows it


@attrs.define
class _ChoiceOut:
    """One choice as it accumulates (non-streaming) or streams (text so far, for offsets)."""

    prompt: _Prompt
    parts: list[str] = attrs.Factory(list)  # the text so far, joined once at the end
    text_len: int = 0
    token_ids: list[int] = attrs.Factory(list)
    logprob_entries: list = attrs.Factory(list)
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    num_output_tokens: int = 0
    num_cached_tokens: int = 0


@bp.post("/v1/completions")
async def completions() -> Any:
    arrival = time.monotonic()
    server = server_of(current_app)
    body = await json_body(request)
    req = parse_body(CompletionRequest, body)
    model, lora = resolve_model(server, req.model, req.lora)
    if req.best_of not in (None, req.n):
        raise APIError(400, "best_of is not supported (use n)", param="best_of")
    if req.suffix:
        raise APIError(400, "suffix is not supported by this model", param="suffix")
    salt = request_salt(req)
    prompts = await _prompts(server, req)
    constraint = await checked_constraint(server, request_constraint(body))
    # echo + logprobs reports the prompt's tokens too, so the engine must score them.
    prompt_lp = req.prompt_logprobs
    if req.echo and req.logprobs is not None:
        prompt_lp = max(prompt_lp or 0, req.logprobs)
    specs = [
        ChoiceSpec(
            index=pi * req.n + i, prompt_ids=p.ids,
            params=constrained(
                sampling_params(server, req, len(p.ids), max_tokens=req.max_tokens,
                                logprobs=req.logprobs, prompt_logprobs=prompt_lp, index=i),
                constraint),
            stop=req.stop, include_stop_str=req.include_stop_str_in_output,
            skip_special_tokens=req.skip_special_tokens,
        )
        for pi, p in enumerate(prompts) for i in range(req.n)
    ]
    job = GenerationPlan(specs, arrival, req.priority, salt, deadline_of(request, server), lora)
    ticket = admit(server, request, specs)
    head = {"id": request_id(request, "cmpl"), "object": "text_completion",
            "created": int(time.time()), "model": model,
            "system_fingerprint": await system_fingerprint(server)}
    outs = [_ChoiceOut(prompts[s.index // req.n]) for s in specs]
    render = _Renderer(req, TokenText(server.tokenizer.tokenizer))
    if req.stream:
        gen = await open_streamed(server, job, ticket)
        body = _stream(req, gen, outs, head, render)
        return Response(body, mimetype="text/event-stream",
                        headers=sse.HEADERS)
    with ticket:
        async with open_generation(server, job) as gen:
            while deltas := await gen.next():
                for d in deltas:
                    render.apply(outs[d.index], d)
    choices = [render.choice(i, out, "".join(out.parts)) for i, out in enumerate(outs)]
    return {**head, "choices": choices, "usage": _usage(outs, req.n)}


async def _prompts(server: Server, req: CompletionRequest) -> list[_Prompt]:
    """The prompts' ids, and the text echo shows; big ones tokenized off the event loop."""
    limit = server.ready.max_model_len
    for p in req.prompt:  # every size first: a batch with one huge prompt tokenizes none
        if isinstance(p, str):
            server.prompt_size.check(p, limit, param="prompt")
        elif len(p) > limit:
            raise context_length_error(limit, len(p), req.max_tokens)

    def work() -> list[_Prompt]:
        prompts = []
        for p in req.prompt:
            ids = server.tokenizer.encode(p, add_special_tokens=True) if isinstance(p, str) \
                else p
            check_prompt(server, ids, max_tokens=req.max_tokens)
            # The prompt's text is only shown by echo: don't decode id prompts for nothing.
            text = p if isinstance(p, str) else server.tokenizer.decode(ids) if req.echo else ""
            prompts.append(_Prompt(ids, text))
        return prompts

    return await server.offload.run(work, size=sum(map(len, req.prompt)))


def _usage(outs: list[_ChoiceOut], n: int) -> dict[str, Any]:
    firsts = outs[::n]  # one prompt counts once, however many samples it has
    return usage(sum(len(o.prompt.ids) for o in firsts),
                 sum(o.num_output_tokens for o in outs),
                 sum(o.num_cached_tokens for o in firsts))


class _Renderer:
    def __init__(self, req: CompletionRequest, text_of: TokenText) -> None:
        self.req = req
        self.text_of = text_of

    def apply(self, out: _ChoiceOut, d: ChoiceDelta) -> str:
        """Fold a delta into the choice; return the text this delta adds (echo included)."""
        text = d.text
        if d.first and self.req.echo:
            text = out.prompt.text + text
            if self.req.logprobs is not None:
                out.token_ids += out.prompt.ids
                # A deadline that passed before the engine scored the prompt leaves its
                # logprobs unknown: null, as the first token's, one entry per token still.
                scored = d.prompt_logprobs
                if scored is None:
                    scored = (None,) * (len(out.prompt.ids) - 1)
                out.logprob_entries += [None, *scored]
        out.parts.append(text)
        out.text_len += len(text)
        out.token_ids += d.token_ids
        if self.req.logprobs is not None:
            out.logprob_entries += d.logprobs or []
        out.finish_reason, out.stop_reason = d.finish_reason, d.stop_reason
        out.num_output_tokens, out.num_cached_tokens = d.num_output_tokens, d.num_cached_tokens
        return text

    def choice(self, index: int, out: _ChoiceOut, text: str, *, offset: int = 0,
               since: int = 0) -> dict[str, Any]:
        logprobs = None
        if self.req.logprobs is not None:
            logprobs = completion_logprobs(self.text_of, out.logprob_entries[since:], offset,
                                           out.token_ids[since:])
        return {"index": index, "text": text, "logprobs": logprobs,
                "finish_reason": out.finish_reason, "stop_reason": out.stop_reason}


async def _stream(
    req: CompletionRequest, gen: Generation, outs: list[_ChoiceOut], head: dict[str, Any],
    render: _Renderer,
) -> AsyncIterator[bytes]:
    opts = req.stream_options
    pending: list[bytes] = []  # events of this wake-up, sent as one write
    try:
        while deltas := await gen.next():
            for d in deltas:
                out = outs[d.index]
                offset, since = out.text_len, len(out.token_ids)
                text = render.apply(out, d)
                if not text and d.finish_reason is None and req.logprobs is None:
                    continue  # held back (a possible stop string) or half a character
                chunk = {**head, "choices": [render.choice(d.index, out, text,
                                                           offset=offset, since=since)]}
                if opts and opts.continuous_usage_stats:
                    chunk["usage"] = _usage(outs, req.n)
                elif opts and opts.include_usage:
                    chunk["usage"] = None  # as OpenAI: the totals come in a last chunk
                pending.append(sse.event(chunk))
            if pending and not gen.finished:  # the last ones go out with [DONE]
                yield b"".join(pending)
                pending.clear()
        if opts and opts.include_usage:
            pending.append(sse.event({**head, "choices": [], "usage": _usage(outs, req.n)}))
    except APIError as exc:  # the status line is gone: report in-band, then end the stream
        pending.append(sse.event(exc.body()))
    except Exception as exc:  # a bug, reported in-band too: the stream still ends as documented
        pending.append(sse.unexpected(exc))
    pending.append(sse.DONE)
    yield b"".join(pending)

