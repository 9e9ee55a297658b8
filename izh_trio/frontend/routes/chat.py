"""``POST /v1/chat/completions``: a chat request to choice specs (template, tools,
constraints); the answer is ``chat_output``'s, the rest the serving pipeline's."""

from __future__ import annotations

from izh_trio.frontend.chat_output import ChatOutput
from izh_trio.frontend.chat_parser import MARKERS
from izh_trio.frontend.chat_prompt import chat_prompt_ids
from izh_trio.frontend.chat_template import with_reasoning_effort
from izh_trio.frontend.chat_tools import ToolPlan, plan_tools
from izh_trio.frontend.errors import APIError
from izh_trio.frontend.generation import ChoiceSpec
from izh_trio.frontend.openai_params import check_prompt, request_salt, sampling_params
from izh_trio.frontend.openai_shapes import TokenText
from izh_trio.frontend.schemas import ChatCompletionRequest
from izh_trio.frontend.server import Server
from izh_trio.frontend.serving.api import Head, Job
from izh_trio.frontend.serving.intake import Intake, checked_constraint, resolve_model
from izh_trio.frontend.serving.pipeline import generation_route
from izh_trio.frontend.structured import request_constraint


async def chat_job(intake: Intake[ChatCompletionRequest]) -> Job:
    server, req = intake.server, intake.req
    if intake.body.get("chat_template") is not None:  # parse_body saw it is an object
        # Ignoring it would answer with the wrong template; running a client's Jinja is a
        # trust decision (vLLM refuses it too unless told to trust request templates).
        raise APIError(400, "a per-request chat_template is not accepted; the model's own "
                            "template is used", param="chat_template")
    model, lora = resolve_model(server, req.model, req.lora)
    salt = request_salt(req)
    if req.top_logprobs is not None and not req.logprobs:
        raise APIError(400, "top_logprobs requires logprobs to be true", param="top_logprobs")
    plan = plan_tools(req, server.tool_format)
    constraint = await checked_constraint(server,
                                          plan.constraint(request_constraint(intake.body)))
    prompt_ids = await render_prompt(server, req, plan)
    max_tokens = req.max_completion_tokens or req.max_tokens
    check_prompt(server, prompt_ids, max_tokens=max_tokens)
    logprobs = (req.top_logprobs or 0) if req.logprobs else None
    grammar = None if constraint is None else constraint.grammar
    specs = [
        ChoiceSpec(index=i, prompt_ids=prompt_ids,
                   params=sampling_params(server, req, len(prompt_ids), max_tokens=max_tokens,
                                          logprobs=logprobs, index=i, grammar=grammar),
                   stop=req.stop, include_stop_str=req.include_stop_str_in_output,
                   skip_special_tokens=req.skip_special_tokens,
                   keep_special=server.tokenizer.ids_of((*MARKERS, *plan.format.markers)))
        for i in range(req.n)
    ]
    text_of = TokenText(server.tokenizer.tokenizer) if req.logprobs else None

    def output(head: Head) -> ChatOutput:
        return ChatOutput(head, specs, plan, options=req.stream_options, logprobs=text_of)

    return Job(specs=specs, model=model, lora=lora, priority=req.priority, cache_salt=salt,
               stream=req.stream, id_prefix="chatcmpl-", output=output)


bp = generation_route("chat", "/v1/chat/completions", ChatCompletionRequest, chat_job)


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
