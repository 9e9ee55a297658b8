"""``POST /v1/chat/completions``: chat template, constraints, generation, output parsing."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

import attrs
from quart import Blueprint, Response, current_app, request

from izh_trio.frontend import sse
from izh_trio.frontend.chat_parser import MARKERS, ChatOutputParser, Event, ToolCall
from izh_trio.frontend.chat_prompt import chat_prompt_ids
from izh_trio.frontend.chat_template import with_reasoning_effort
from izh_trio.frontend.chat_tools import ToolPlan, plan_tools
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
    chat_logprobs,
    check_prompt,
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
from izh_trio.frontend.schemas import ChatCompletionRequest, parse_body
from izh_trio.frontend.server import Server
from izh_trio.frontend.structured import request_constraint

bp = Blueprint("chat", __name__)


async def render_prompt(server: Server, req: ChatCompletionRequest, plan: ToolPlan
                        ) -> list[int]:
    template = server.tokenizer.chat_template
    if template is None:
        raise APIError(400, "this model has no chat template; use /v1/completions",
                       param="messages")
    return await chat_prompt_ids(server, template, req.messages, tools=plan.tools,
                                 add_generation_prompt=req.add_generation_prompt,
                                 continue_final_message=req.continue_final_message,
                                 chat_template_kwargs=with_reasoning_effort(
                                     req.chat_template_kwargs, req.reasoning_effort))


@bp.post("/v1/chat/completions")
async def chat_completions() -> Any:
    arrival = time.monotonic()
    server = server_of(current_app)
    body = await json_body(request)
    req = parse_body(ChatCompletionRequest, body)
    if body.get("chat_template") is not None:  # parse_body saw it is an object
        # Ignoring it would answer with the wrong template; running a client's Jinja is a
        # trust decision (vLLM refuses it too unless told to trust request templates).
        raise APIError(400, "a per-request chat_template is not accepted; the model's own "
                            "template is used", param="chat_template")
    model, lora = resolve_model(server, req.model, req.lora)
    salt = request_salt(req)
    if req.top_logprobs is not None and not req.logprobs:
        raise APIError(400, "top_logprobs requires logprobs to be true", param="top_logprobs")
    plan = plan_tools(req)
    constraint = await checked_constraint(server, plan.constraint(request_constraint(body)))
    prompt_ids = await render_prompt(server, req, plan)
    max_tokens = req.max_completion_tokens or req.max_tokens
    check_prompt(server, prompt_ids, max_tokens=max_tokens)
    logprobs = (req.top_logprobs or 0) if req.logprobs else None
    specs = [
        ChoiceSpec(index=i, prompt_ids=prompt_ids,
                   params=constrained(sampling_params(server, req, len(prompt_ids),
                                                      max_tokens=max_tokens,
                                                      logprobs=logprobs, index=i),
                                      constraint),
                   stop=req.stop, include_stop_str=req.include_stop_str_in_output,
                   skip_special_tokens=req.skip_special_tokens,
                   keep_special=server.tokenizer.ids_of(MARKERS))
        for i in range(req.n)
    ]
    job = GenerationPlan(specs, arrival, req.priority, salt, deadline_of(request, server), lora)
    ticket = admit(server, request, specs)
    head = {"id": request_id(request, "chatcmpl"), "object": "chat.completion",
            "created": int(time.time()), "model": model,
            "system_fingerprint": await system_fingerprint(server)}
    outs = [_ChoiceOut(plan, ChatOutputParser(tools=plan.parse)) for _ in specs]
    text_of = TokenText(server.tokenizer.tokenizer)
    if req.stream:
        gen = await open_streamed(server, job, ticket)
        stream = _stream(req, gen, outs, {**head, "object": "chat.completion.chunk"},
                         text_of, len(prompt_ids))
        return Response(stream, mimetype="text/event-stream",
                        headers=sse.HEADERS)
    with ticket:
        async with open_generation(server, job) as gen:
            while deltas := await gen.next():
                for d in deltas:
                    outs[d.index].fold(d)
    choices = [out.message_choice(i, text_of if req.logprobs else None)
               for i, out in enumerate(outs)]
    return {**head, "choices": choices, "usage": _usage(outs, len(prompt_ids))}


@attrs.define
class _ChoiceOut:
    plan: ToolPlan
    parser: ChatOutputParser
    reasoning: list[str] = attrs.Factory(list)
    content: list[str] = attrs.Factory(list)
    calls: list[ToolCall] = attrs.Factory(list)
    logprobs: list = attrs.Factory(list)
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    num_output_tokens: int = 0
    num_cached_tokens: int = 0

    def fold(self, d: ChoiceDelta) -> list[Event]:
        """Take a delta in; return the parsed events it completed."""
        events = self.parser.feed(d.text)
        if d.finish_reason is not None:
            events += self.parser.finish()
        for e in events:
            if e.kind == "tool_call":
                self.calls.append(e.call)
            else:
                (self.reasoning if e.kind == "reasoning" else self.content).append(e.text)
        self.logprobs += d.logprobs or []
        self.finish_reason = d.finish_reason
        if d.finish_reason == "stop" and self.calls:
            self.finish_reason = self.plan.finish_reason
        self.stop_reason = d.stop_reason
        self.num_output_tokens, self.num_cached_tokens = d.num_output_tokens, d.num_cached_tokens
        return events

    def message_choice(self, index: int, text_of: TokenText | None) -> dict[str, Any]:
        content = "".join(self.content)
        message: dict[str, Any] = {
            "role": "assistant",
            "content": None if self.calls and not content.strip() else content,
            **self.plan.message_fields(self.calls),
        }
        if self.reasoning:
            message["reasoning_content"] = "".join(self.reasoning)
        logprobs = {"content": chat_logprobs(text_of, self.logprobs)} if text_of else None
        return {"index": index, "message": message, "logprobs": logprobs,
                "finish_reason": self.finish_reason, "stop_reason": self.stop_reason}


def _usage(outs: list[_ChoiceOut], prompt_len: int) -> dict[str, Any]:
    return usage(prompt_len, sum(o.num_output_tokens for o in outs), outs[0].num_cached_tokens)


async def _stream(
    req: ChatCompletionRequest, gen: Generation, outs: list[_ChoiceOut], head: dict[str, Any],
    text_of: TokenText, prompt_len: int,
) -> AsyncIterator[bytes]:
    opts = req.stream_options
    continuous = bool(opts and opts.continuous_usage_stats)

    def chunk(index: int, delta: dict[str, Any], logprobs: Any = None,
              finish: str | None = None, stop_reason: Any = None) -> bytes:
        body = {**head, "choices": [{"index": index, "delta": delta, "logprobs": logprobs,
                                     "finish_reason": finish, "stop_reason": stop_reason}]}
        if continuous:
            body["usage"] = _usage(outs, prompt_len)
        elif opts and opts.include_usage:
            body["usage"] = None  # as OpenAI: the totals come in a last chunk
        return sse.event(body)

    pending: list[bytes] = []  # events of this wake-up, sent as one write
    try:
        while deltas := await gen.next():
            for d in deltas:
                out = outs[d.index]
                if d.first:  # OpenAI opens every choice with the role
                    pending.append(chunk(d.index, {"role": "assistant", "content": ""}))
                n_calls = len(out.calls)
                events = out.fold(d)
                lps = ({"content": chat_logprobs(text_of, d.logprobs or [])}
                       if req.logprobs else None)
                for e in events:
                    if e.kind == "tool_call":
                        for delta in out.plan.call_deltas(n_calls, e.call):
                            pending.append(chunk(d.index, delta))
                        n_calls += 1
                    else:
                        key = "content" if e.kind == "content" else "reasoning_content"
                        pending.append(chunk(d.index, {key: e.text}, lps))
                        lps = None
                if lps and lps["content"]:  # tokens whose text is still held back
                    pending.append(chunk(d.index, {"content": ""}, lps))
                if d.finish_reason is not None:
                    pending.append(chunk(d.index, {}, None, out.finish_reason,
                                         out.stop_reason))
            if pending and not gen.finished:  # the last ones go out with [DONE]
                yield b"".join(pending)
                pending.clear()
        if opts and opts.include_usage:
            pending.append(sse.event({**head, "choices": [],
                                      "usage": _usage(outs, prompt_len)}))
    except APIError as exc:  # the status line is gone: report in-band, then end the stream
        pending.append(sse.event(exc.body()))
    except Exception as exc:  # a bug, reported in-band too: the stream still ends as documented
        pending.append(sse.unexpected(exc))
    pending.append(sse.DONE)
    yield b"".join(pending)
