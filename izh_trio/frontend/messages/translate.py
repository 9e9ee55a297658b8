"""A ``POST /v1/messages`` body to the serving pipeline's :class:`Job` (its conversation
rendered by the chat template, its tools and thinking as chat's, its sampling as every
generation's), and the same prompt counted for ``/v1/messages/count_tokens``."""

from __future__ import annotations

from typing import Any

import attrs
from quart import Blueprint

from izh_trio.frontend.chat_parser import MARKERS, THINK_CLOSE, THINK_OPEN
from izh_trio.frontend.chat_prompt import chat_prompt_ids
from izh_trio.frontend.chat_tools import ToolPlan
from izh_trio.frontend.errors import APIError
from izh_trio.frontend.generation import ChoiceSpec
from izh_trio.frontend.messages.conversation import chat_messages
from izh_trio.frontend.messages.options import Thinking, output_format, thinking, tool_plan
from izh_trio.frontend.messages.output import KEEPALIVE, MessagesOutput
from izh_trio.frontend.messages.request import CountTokensRequest, MessagesRequest, PromptFields
from izh_trio.frontend.openai_params import check_prompt, request_salt, sampling_params
from izh_trio.frontend.server import Server
from izh_trio.frontend.serving.api import Head, Job
from izh_trio.frontend.serving.intake import (
    Intake,
    checked_constraint,
    read_request,
    resolve_model,
)


@attrs.frozen
class Prompt:
    ids: list[int]
    plan: ToolPlan
    thinking: Thinking
    think_end: tuple[int, ...] = ()  # what closes the think block a budget opened


async def render(server: Server, req: PromptFields,
                 max_tokens: int | None) -> Prompt:
    """The request's prompt ids, its tool plan and its thinking, checked. Thinking with a
    budget (type ``enabled``) is thinking for sure: the prompt opens the think block, and
    the engine closes it when the budget is spent. Adaptive thinking is the model's choice."""
    plan = tool_plan(req.tools, req.tool_choice, server.tool_format)
    think = thinking(req.thinking, max_tokens)
    if think.enabled and plan.forced is not None:
        raise APIError(400, "thinking may not be enabled when tool_choice forces tool use "
                            "(type 'any' or 'tool')", param="thinking")
    if output_format(req.output_config) is not None and think.enabled:
        # The format's grammar holds from the first token: no think block could open.
        raise APIError(400, "thinking may not be enabled with output_config.format",
                       param="thinking")
    messages, prefill = chat_messages(req.system, req.messages)
    if think.budget is not None and prefill:
        raise APIError(400, "a final assistant message (a prefill) cannot be continued with "
                            "thinking enabled", param="thinking")
    template = server.tokenizer.chat_template
    if template is None:
        raise APIError(400, "this model has no chat template; use /v1/completions",
                       param="messages")
    kwargs = req.chat_template_kwargs
    if isinstance(kwargs, dict | None) and (req.thinking is not None or "enable_thinking"
                                           not in (kwargs or {})):
        kwargs = {**(kwargs or {}), "enable_thinking": think.enabled}
    # (kwargs of the wrong type: the template's 400 to report)
    ids = await chat_prompt_ids(server, template, messages, tools=plan.tools,
                                add_generation_prompt=not prefill,
                                continue_final_message=prefill, chat_template_kwargs=kwargs)
    if think.budget is None:
        return Prompt(ids, plan, think)
    tokenizer = server.tokenizer
    tags = [tokenizer.tokenizer.token_to_id(tag) for tag in (THINK_OPEN, THINK_CLOSE)]
    if None in tags:
        raise APIError(400, f"this model has no {THINK_OPEN} and {THINK_CLOSE} tokens, so a "
                            "thinking budget cannot be enforced", param="thinking")
    opener = tokenizer.encode(THINK_OPEN + "\n")
    if ids[-len(opener):] != opener:  # (a thinking model's own template may open it)
        ids = [*ids, *opener]
    return Prompt(ids, plan, think, think_end=tuple(tokenizer.encode(THINK_CLOSE + "\n\n")))


async def messages_job(intake: Intake[MessagesRequest]) -> Job:
    server, req = intake.server, intake.req
    model, lora = resolve_model(server, req.model, req.lora)
    salt = request_salt(req)
    prompt = await render(server, req, req.max_tokens)
    constraint = await checked_constraint(
        server, prompt.plan.constraint(output_format(req.output_config)))
    try:
        check_prompt(server, prompt.ids, max_tokens=req.max_tokens)
    except APIError as exc:
        exc.param = "messages" if exc.param == "prompt" else exc.param
        raise
    params = sampling_params(server, req, len(prompt.ids), max_tokens=req.max_tokens,
                             grammar=None if constraint is None else constraint.grammar)
    if prompt.thinking.budget is not None:
        params = attrs.evolve(params, think_budget=prompt.thinking.budget,
                              think_end=prompt.think_end)
    spec = ChoiceSpec(index=0, prompt_ids=prompt.ids, params=params, stop=req.stops,
                      include_stop_str=False, skip_special_tokens=True,
                      keep_special=server.tokenizer.ids_of(
                          (*MARKERS, *prompt.plan.format.markers)))
    plan, think = prompt.plan, prompt.thinking

    def output(head: Head) -> MessagesOutput:
        return MessagesOutput(head, spec, plan, show_thinking=think.shown,
                              opened=think.budget is not None)

    return Job(specs=[spec], model=model, lora=lora, priority=req.priority, cache_salt=salt,
               stream=req.stream, id_prefix="msg_", output=output, keepalive=KEEPALIVE)


def add_count_tokens(bp: Blueprint) -> None:
    async def count_tokens() -> dict[str, Any]:
        intake = await read_request(CountTokensRequest)
        resolve_model(intake.server, intake.req.model, None)
        prompt = await render(intake.server, intake.req, None)
        return {"input_tokens": len(prompt.ids)}

    bp.add_url_rule("/v1/messages/count_tokens", "count_tokens", count_tokens,
                    methods=["POST"])
