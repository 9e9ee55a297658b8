"""``POST /v1/completions``: OpenAI's legacy completions, streamed or not."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any

from quart import Blueprint, Response, current_app, request

from izh_trio.frontend import sse
from izh_trio.frontend.admission import TicketedBody
from izh_trio.frontend.errors import APIError
from izh_trio.frontend.generation import check_prompt, generate, resolve_params
from izh_trio.frontend.routes.common import json_body, served_model, server_of
from izh_trio.frontend.schemas import CompletionRequest, parse_body
from izh_trio.frontend.server import Server

bp = Blueprint("completions", __name__)


def _usage(prompt: int, completion: int, cached: int) -> dict[str, Any]:
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached}}


@bp.post("/v1/completions")
async def completions() -> Any:
    arrival = time.monotonic()
    server = server_of(current_app)
    req = parse_body(CompletionRequest, await json_body(request))
    model = served_model(server, req.model)
    prompt_ids = (server.tokenizer.encode(req.prompt) if isinstance(req.prompt, str)
                  else req.prompt)
    check_prompt(server, prompt_ids)
    params = resolve_params(
        server, len(prompt_ids), max_tokens=req.max_tokens, temperature=req.temperature,
        top_p=req.top_p, top_k=req.top_k, min_p=req.min_p, seed=req.seed,
        ignore_eos=req.ignore_eos,
    )
    ticket = current_app.extensions["izh.admission"].admit()
    request_id = f"cmpl-{uuid.uuid4().hex}"
    head = {"id": request_id, "object": "text_completion", "created": int(time.time()),
            "model": model}
    if req.stream:
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        body = _stream(server, head, prompt_ids, params, arrival, include_usage)
        return Response(TicketedBody(body, ticket), mimetype="text/event-stream",
                        headers=sse.HEADERS)

    text, reason, usage = [], None, _usage(len(prompt_ids), 0, 0)
    with ticket:
        async with aclosing(generate(server, request_id, prompt_ids, params,
                                     arrival=arrival)) as gen:
            async for d in gen:
                text.append(d.text)
                reason = d.finish_reason
                usage = _usage(d.num_prompt_tokens, d.num_output_tokens, d.num_cached_tokens)
    choice = {"index": 0, "text": "".join(text), "logprobs": None, "finish_reason": reason,
              "stop_reason": None}
    return {**head, "choices": [choice], "usage": usage}


async def _stream(
    server: Server, head: dict[str, Any], prompt_ids: list[int], params: Any, arrival: float,
    include_usage: bool,
) -> AsyncIterator[bytes]:
    usage = None
    try:
        # aclosing: when quart closes this generator (client gone), the inner one closes too,
        # right now, and its open_stream exit queues the abort.
        async with aclosing(generate(server, head["id"], prompt_ids, params,
                                     arrival=arrival)) as gen:
            async for d in gen:
                choice = {"index": 0, "text": d.text, "logprobs": None,
                          "finish_reason": d.finish_reason, "stop_reason": None}
                yield sse.event({**head, "choices": [choice]})
                usage = _usage(d.num_prompt_tokens, d.num_output_tokens, d.num_cached_tokens)
        if include_usage and usage is not None:
            yield sse.event({**head, "choices": [], "usage": usage})
    except APIError as exc:  # the status line is gone: report in-band, then end the stream
        yield sse.event(exc.body())
    yield sse.DONE
