"""``POST /v1/completions``: OpenAI's legacy completions (with vLLM's extensions), a request
to choice specs; the answer is ``completion_output``'s, the rest the serving pipeline's."""

from __future__ import annotations

from izh_trio.frontend.completion_output import CompletionOutput, Prompt
from izh_trio.frontend.errors import APIError
from izh_trio.frontend.generation import ChoiceSpec
from izh_trio.frontend.openai_params import (
    check_prompt,
    context_length_error,
    request_salt,
    sampling_params,
)
from izh_trio.frontend.openai_shapes import TokenText
from izh_trio.frontend.schemas import CompletionRequest
from izh_trio.frontend.server import Server
from izh_trio.frontend.serving.api import Head, Job
from izh_trio.frontend.serving.intake import Intake, checked_constraint, resolve_model
from izh_trio.frontend.serving.pipeline import generation_route
from izh_trio.frontend.structured import request_constraint


async def completion_job(intake: Intake[CompletionRequest]) -> Job:
    server, req = intake.server, intake.req
    model, lora = resolve_model(server, req.model, req.lora)
    if req.best_of not in (None, req.n):
        raise APIError(400, "best_of is not supported (use n)", param="best_of")
    if req.suffix:
        raise APIError(400, "suffix is not supported by this model", param="suffix")
    salt = request_salt(req)
    prompts = await _prompts(server, req)
    constraint = await checked_constraint(server, request_constraint(intake.body))
    grammar = None if constraint is None else constraint.grammar
    # echo + logprobs reports the prompt's tokens too, so the engine must score them.
    prompt_lp = req.prompt_logprobs
    if req.echo and req.logprobs is not None:
        prompt_lp = max(prompt_lp or 0, req.logprobs)
    specs = [
        ChoiceSpec(
            index=pi * req.n + i, prompt_ids=p.ids, prompt_index=pi,
            params=sampling_params(server, req, len(p.ids), max_tokens=req.max_tokens,
                                   logprobs=req.logprobs, prompt_logprobs=prompt_lp, index=i,
                                   grammar=grammar),
            stop=req.stop, include_stop_str=req.include_stop_str_in_output,
            skip_special_tokens=req.skip_special_tokens,
        )
        for pi, p in enumerate(prompts) for i in range(req.n)
    ]
    text_of = TokenText(server.tokenizer.tokenizer)

    def output(head: Head) -> CompletionOutput:
        return CompletionOutput(head, specs, prompts, req, text_of)

    return Job(specs=specs, model=model, lora=lora, priority=req.priority, cache_salt=salt,
               stream=req.stream, id_prefix="cmpl-", output=output)


bp = generation_route("completions", "/v1/completions", CompletionRequest, completion_job)


async def _prompts(server: Server, req: CompletionRequest) -> list[Prompt]:
    """The prompts' ids, and the text echo shows; big ones tokenized off the event loop."""
    limit = server.ready.max_model_len
    for p in req.prompt:  # every size first: a batch with one huge prompt tokenizes none
        if isinstance(p, str):
            server.prompt_size.check(p, limit, param="prompt")
        elif len(p) > limit:
            raise context_length_error(limit, len(p), req.max_tokens)

    def work() -> list[Prompt]:
        prompts = []
        for p in req.prompt:
            ids = server.tokenizer.encode(p, add_special_tokens=True) if isinstance(p, str) \
                else p
            check_prompt(server, ids, max_tokens=req.max_tokens)
            # The prompt's text is only shown by echo: don't decode id prompts for nothing.
            text = p if isinstance(p, str) else server.tokenizer.decode(ids) if req.echo else ""
            prompts.append(Prompt(ids, text))
        return prompts

    return await server.offload.run(work, size=sum(map(len, req.prompt)))
