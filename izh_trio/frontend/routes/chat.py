"""``POST /v1/chat/completions``: the chat template, then generation, in OpenAI's shapes."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

import attrs
from quart import Blueprint, Response, current_app, request

from izh_trio.frontend import sse
from izh_trio.frontend.admission import TicketedBody
from izh_trio.frontend.errors import APIError
from izh_trio.frontend.generation import ChoiceSpec, open_generation
from izh_trio.frontend.openai_format import (
    TokenText,
    chat_logprobs,
    check_prompt,
    sampling_params,
    usage,
)
from izh_trio.frontend.routes.common import (
    check_salt,
    json_body,
    request_id,
    served_model,
    server_of,
)
from izh_trio.frontend.schemas import ChatCompletionRequest, parse_body
from izh_trio.frontend.server import Server

bp = Blueprint("chat", __name__)


@attrs.define
class _ChoiceOut:
    content: str = ""
    logprobs: list = attrs.Factory(list)
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    num_output_tokens: int = 0
    num_cached_tokens: int = 0


def render_chat_prompt(server: Server, req: ChatCompletionRequest) -> list[int]:
    """Messages through the checkpoint's chat template, then the tokenizer."""
    template = server.tokenizer.chat_template
    if template is None:
        raise APIError(400, "this model has no chat template; use /v1/completions",
                       param="messages")
    if req.tool_choice not in (None, "none", "auto"):
        raise APIError(400, "tool_choice 'required' and named functions are not supported yet",
                       param="tool_choice")
    fmt = (req.response_format or {}).get("type", "text")
    if fmt != "text":
        raise APIError(400, f"response_format {fmt!r} is not supported yet",
                       param="response_format")
    tools = None if req.tool_choice == "none" else req.tools
    text = template.render(req.messages, tools=tools,
                           add_generation_prompt=req.add_generation_prompt,
                           continue_final_message=req.continue_final_message,
                           chat_template_kwargs=req.chat_template_kwargs)
    return server.tokenizer.encode(text)


@bp.post("/v1/chat/completions")
async def chat_completions() -> Any:
    arrival = time.monotonic()
    server = server_of(current_app)
    req = parse_body(ChatCompletionRequest, await json_body(request))
    model = served_model(server, req.model)
    check_salt(req.cache_salt)
    if req.top_logprobs is not None and not req.logprobs:
        raise APIError(400, "top_logprobs requires logprobs to be true", param="top_logprobs")
    prompt_ids = render_chat_prompt(server, req)
    check_prompt(server, prompt_ids)
    max_tokens = req.max_completion_tokens or req.max_tokens
    logprobs = (req.top_logprobs or 0) if req.logprobs else None
    specs = [
        ChoiceSpec(index=i, prompt_ids=prompt_ids,
                   params=sampling_params(server, req, len(prompt_ids), max_tokens=max_tokens,
                                          logprobs=logprobs, index=i),
                   stop=req.stop, include_stop_str=req.include_stop_str_in_output,
                   skip_special_tokens=req.skip_special_tokens)
        for i in range(req.n)
    ]
    ticket = current_app.extensions["izh.admission"].admit()
    head = {"id": request_id(request, "chatcmpl"), "object": "chat.completion",
            "created": int(time.time()), "model": model}
    outs = [_ChoiceOut() for _ in specs]
    text_of = TokenText(server.tokenizer.tokenizer)
    if req.stream:
        body = _stream(server, req, specs, outs, {**head, "object": "chat.completion.chunk"},
                       text_of, len(prompt_ids), arrival)
        return Response(TicketedBody(body, ticket), mimetype="text/event-stream",
                        headers=sse.HEADERS)
    with ticket:
        async with open_generation(server, specs, arrival=arrival, priority=req.priority,
                                   cache_salt=req.cache_salt) as gen:
            while deltas := await gen.next():
                for d in deltas:
                    out = outs[d.index]
                    out.content += d.text
                    out.logprobs += d.logprobs or []
                    _finish(out, d)
    choices = [{"index": i, "message": {"role": "assistant", "content": out.content,
                                        "tool_calls": []},
                "logprobs": {"content": chat_logprobs(text_of, out.logprobs)} if req.logprobs
                else None,
                "finish_reason": out.finish_reason, "stop_reason": out.stop_reason}
               for i, out in enumerate(outs)]
    return {**head, "choices": choices, "usage": _usage(outs, len(prompt_ids))}


def _finish(out: _ChoiceOut, d: Any) -> None:
    out.finish_reason, out.stop_reason = d.finish_reason, d.stop_reason
    out.num_output_tokens, out.num_cached_tokens = d.num_output_tokens, d.num_cached_tokens


def _usage(outs: list[_ChoiceOut], prompt_len: int) -> dict[str, Any]:
    return usage(prompt_len, sum(o.num_output_tokens for o in outs),
                 outs[0].num_cached_tokens)


async def _stream(
    server: Server, req: ChatCompletionRequest, specs: list[ChoiceSpec], outs: list[_ChoiceOut],
    head: dict[str, Any], text_of: TokenText, prompt_len: int, arrival: float,
) -> AsyncIterator[bytes]:
    opts = req.stream_options
    continuous = bool(opts and opts.continuous_usage_stats)

    def chunk(index: int, delta: dict[str, Any], logprobs: Any = None,
              finish: str | None = None, stop_reason: Any = None) -> bytes:
        body = {**head, "choices": [{"index": index, "delta": delta, "logprobs": logprobs,
                                     "finish_reason": finish, "stop_reason": stop_reason}]}
        if continuous:
            body["usage"] = _usage(outs, prompt_len)
        return sse.event(body)

    try:
        async with open_generation(server, specs, arrival=arrival, priority=req.priority,
                                   cache_salt=req.cache_salt) as gen:
            while deltas := await gen.next():
                for d in deltas:
                    out = outs[d.index]
                    _finish(out, d)
                    if d.first:  # OpenAI opens every choice with the role
                        yield chunk(d.index, {"role": "assistant", "content": ""})
                    lps = ({"content": chat_logprobs(text_of, d.logprobs or [])}
                           if req.logprobs else None)
                    if d.text or (lps and lps["content"]):
                        yield chunk(d.index, {"content": d.text}, lps)
                    if d.finish_reason is not None:
                        yield chunk(d.index, {}, None, d.finish_reason, d.stop_reason)
        if opts and opts.include_usage:
            yield sse.event({**head, "choices": [], "usage": _usage(outs, prompt_len)})
    except APIError as exc:  # the status line is gone: report in-band, then end the stream
        yield sse.event(exc.body())
    yield sse.DONE
