"""A ``POST /v1/responses`` body to the serving pipeline's :class:`Job`: its items rendered by
the chat template (with ``truncation: "auto"``, the oldest dropped until they fit), its tools,
format and reasoning as chat's, its sampling as every generation's."""

from __future__ import annotations

import uuid
from typing import Any

from quart import request

from izh_trio.frontend.admission import Ticket
from izh_trio.frontend.chat_parser import MARKERS, THINK_CLOSE, THINK_OPEN
from izh_trio.frontend.chat_prompt import chat_prompt_ids
from izh_trio.frontend.chat_template import with_reasoning_effort
from izh_trio.frontend.chat_tools import ToolPlan
from izh_trio.frontend.errors import APIError
from izh_trio.frontend.generation import ChoiceSpec, GenerationPlan
from izh_trio.frontend.openai_params import (
    check_prompt,
    request_salt,
    sampling_params,
)
from izh_trio.frontend.openai_shapes import TokenText
from izh_trio.frontend.responses.background import detach as run_detached
from izh_trio.frontend.responses.items import input_messages
from izh_trio.frontend.responses.options import reasoning_effort, text_format, tool_plan
from izh_trio.frontend.responses.output import ResponsesOutput
from izh_trio.frontend.responses.output_items import ReasoningTokens
from izh_trio.frontend.responses.request import ResponsesRequest
from izh_trio.frontend.responses.stored import continued, input_items, reachable
from izh_trio.frontend.responses.turn import Turn
from izh_trio.frontend.server import Server
from izh_trio.frontend.serving.api import Answer, Head, Job, Output
from izh_trio.frontend.serving.intake import (
    REQUEST_ID_HEADER,
    Intake,
    checked_constraint,
    resolve_model,
)
from izh_trio.frontend.structured import request_constraint
from izh_trio.wire import SamplingParams

#: vLLM's constraint fields, accepted beside ``text.format`` as chat accepts them.
_VLLM_CONSTRAINTS = ("structured_outputs", "guided_json", "guided_regex", "guided_choice",
                     "guided_grammar")


async def responses_job(intake: Intake[ResponsesRequest]) -> Job:
    server, req = intake.server, intake.req
    if req.input is None:
        raise APIError(400, "'input' is a required property", param="input")
    if intake.body.get("response_format") is not None:
        raise APIError(400, "response_format is chat's field; the Responses API's is "
                            "text.format", param="response_format")
    model, lora = resolve_model(server, req.model, req.lora)
    salt = request_salt(req)
    plan = tool_plan(req.tools, req.tool_choice, req.parallel_tool_calls, server.tool_format)
    requested, text_echo = text_format(req.text)
    vllm = request_constraint({k: intake.body[k] for k in _VLLM_CONSTRAINTS
                               if k in intake.body})
    if requested is not None and vllm is not None:
        raise APIError(400, f"give only one output constraint, not text.format and "
                            f"{vllm.param}", param=vllm.param)
    constraint = await checked_constraint(server, plan.constraint(requested or vllm))
    effort, reasoning_echo = reasoning_effort(req.reasoning)
    input_messages(req.input, None)  # the new input checked alone: its errors name input[i]
    turn = await _turn(server, req)
    # The conversation so far, then the new input; only this request's instructions. Earlier
    # reasoning goes in as reasoning_content and Qwen3's template decides, as it was trained:
    # it drops it before the last user message (this turn's prompt still extends the last
    # one's, so its blocks are prefix-cache hits) and keeps it within a tool loop.
    before = await continued(server, req.previous_response_id) \
        if req.previous_response_id is not None else []
    messages = input_messages(before + turn.input_items, req.instructions)
    prompt_ids = await fitted_prompt(server, req, plan, messages, effort)
    max_tokens = req.max_output_tokens
    try:
        check_prompt(server, prompt_ids, max_tokens=max_tokens)
        params = sampling_params(server, req, len(prompt_ids), max_tokens=max_tokens,
                                 logprobs=req.logprobs,
                                 grammar=None if constraint is None else constraint.grammar)
    except APIError as exc:  # named as the Responses API names its fields
        if exc.code == "context_length_exceeded":
            too_long = len(prompt_ids) >= server.ready.max_model_len
            exc.param = "input" if too_long else "max_output_tokens"
        elif exc.param == "prompt":
            exc.param = "input"
        raise
    tokenizer = server.tokenizer
    spec = ChoiceSpec(index=0, prompt_ids=prompt_ids, params=params, stop=req.stop,
                      include_stop_str=req.include_stop_str_in_output,
                      skip_special_tokens=req.skip_special_tokens,
                      keep_special=tokenizer.ids_of((*MARKERS, *plan.format.markers)))
    text_of = TokenText(tokenizer.tokenizer) if req.logprobs is not None else None
    think, unthink = (tokenizer.tokenizer.token_to_id(tag) for tag in (THINK_OPEN, THINK_CLOSE))
    echo = _echo(req, params, text=text_echo, reasoning=reasoning_echo)
    # A client's X-Request-Id names its request, not the response: a response's id is the
    # server's own (a store keys on it), and equals the request id only when that is fresh.
    given = bool(request.headers.get(REQUEST_ID_HEADER, "").strip())

    def output(head: Head) -> ResponsesOutput:
        response_id = f"resp_{uuid.uuid4().hex}" if given else head.id
        turn.output = ResponsesOutput(head, response_id, spec, plan, echo,
                                      reasoning=ReasoningTokens(think, unthink),
                                      logprobs=text_of, background=req.background)
        return turn.output

    async def detach(plan: GenerationPlan, ticket: Ticket, out: Output) -> Answer:
        return await run_detached(turn, plan, ticket, out, stream=req.stream)

    return Job(specs=[spec], model=model, lora=lora, priority=req.priority, cache_salt=salt,
               stream=req.stream, id_prefix="resp_", output=output, finish=turn.finish,
               detach=detach if req.background else None)


async def _turn(server: Server, req: ResponsesRequest) -> Turn:
    """What the store will keep of this response; a ``store: true`` one needs the store to
    answer now (a 503 before generating), a background one needs ``store: true``."""
    if req.background and not req.store:
        raise APIError(400, "background responses must be stored: set store to true",
                       param="background")
    if req.store:
        await reachable(server)
    return Turn(server, req.store, input_items(req.input), req.previous_response_id)


async def fitted_prompt(server: Server, req: ResponsesRequest, plan: ToolPlan,
                        messages: list[dict[str, Any]], effort: str | None) -> list[int]:
    """The prompt's ids. With ``truncation: "auto"``, a conversation too long for the context
    (with room for ``max_output_tokens``, or one token) loses its oldest messages, the fewest
    that make it fit, found by bisection; the instructions and the newest message stay."""
    if server.tokenizer.chat_template is None:
        raise APIError(400, "this model has no chat template; use /v1/completions",
                       param="input")
    if req.truncation != "auto":
        return await _render(server, req, plan, messages, effort)
    keep = 0 if req.instructions is None else 1
    limit = server.ready.max_model_len
    room = req.max_output_tokens or 1

    async def fitting(dropped: int) -> list[int] | None:
        try:
            ids = await _render(server, req, plan,
                                messages[:keep] + messages[keep + dropped:], effort)
        except APIError as exc:
            if exc.code != "context_length_exceeded":
                raise
            return None
        return ids if len(ids) + room <= limit else None

    low, high = 0, len(messages) - keep - 1  # drop at least low, at most high
    best = await fitting(low)
    if best is not None:
        return best
    best = await fitting(high)
    if best is None:
        raise APIError(400, f"the input does not fit in the model's context of {limit} "
                            "tokens even with only its newest message kept",
                       param="input", code="context_length_exceeded")
    while high - low > 1:  # fitting(low) fails, fitting(high) is best
        middle = (low + high) // 2
        ids = await fitting(middle)
        if ids is None:
            low = middle
        else:
            high, best = middle, ids
    return best


async def _render(server: Server, req: ResponsesRequest, plan: ToolPlan,
                  messages: list[dict[str, Any]], effort: str | None) -> list[int]:
    template = server.tokenizer.chat_template
    assert template is not None
    try:
        return await chat_prompt_ids(
            server, template, messages, tools=plan.tools, add_generation_prompt=True,
            continue_final_message=False,
            chat_template_kwargs=with_reasoning_effort(req.chat_template_kwargs, effort))
    except APIError as exc:  # chat names its messages; here they are the input
        if exc.param == "messages":
            exc.param = "input"
        raise


def _echo(req: ResponsesRequest, params: SamplingParams, *, text: dict[str, Any],
          reasoning: dict[str, Any]) -> dict[str, Any]:
    """The request's settings as the response object repeats them."""
    return {
        "instructions": req.instructions, "max_output_tokens": req.max_output_tokens,
        "max_tool_calls": req.max_tool_calls, "metadata": req.metadata or {},
        "parallel_tool_calls": req.parallel_tool_calls,
        "previous_response_id": req.previous_response_id,
        "prompt_cache_key": req.prompt_cache_key, "reasoning": reasoning,
        "safety_identifier": req.safety_identifier, "service_tier": "default",
        "store": req.store,
        "temperature": params.temperature, "text": text,
        "tool_choice": req.tool_choice if req.tool_choice is not None else "auto",
        "tools": req.tools or [], "top_logprobs": req.top_logprobs or 0,
        "top_p": params.top_p, "truncation": req.truncation, "user": req.user,
    }
