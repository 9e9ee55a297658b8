"""``POST /tokenize`` and ``POST /detokenize`` in vLLM's shapes."""

from __future__ import annotations

from typing import Any

import attrs
from quart import Blueprint, current_app, request

from izh_trio.frontend.chat_prompt import chat_prompt_ids
from izh_trio.frontend.errors import APIError
from izh_trio.frontend.schemas import parse_body
from izh_trio.frontend.serving.intake import json_body, served_model, server_of

bp = Blueprint("tokenize", __name__)


@attrs.frozen(kw_only=True)
class TokenizeRequest:
    model: str | None = None
    prompt: str | None = None
    messages: Any = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template_kwargs: Any = None
    tools: Any = None
    add_special_tokens: bool = True
    return_token_strs: bool = False


@attrs.frozen(kw_only=True)
class DetokenizeRequest:
    tokens: list[int]
    model: str | None = None


@bp.post("/tokenize")
async def tokenize() -> Any:
    server = server_of(current_app)
    req = parse_body(TokenizeRequest, await json_body(request))
    served_model(server, req.model)
    if (req.prompt is None) == (req.messages is None):
        raise APIError(400, "give exactly one of 'prompt' or 'messages'", param="prompt")
    limit = server.ready.max_model_len
    if req.prompt is not None:
        # Like vLLM, /tokenize counts prompts longer than the context; one that its size
        # alone proves too long for it is refused as generation would refuse it, untokenized.
        server.prompt_size.check(req.prompt, limit, param="prompt")
        text = req.prompt
        ids = await server.offload.run(
            lambda: server.tokenizer.encode(text, add_special_tokens=req.add_special_tokens),
            size=len(text))
    else:
        template = server.tokenizer.chat_template
        if template is None:
            raise APIError(400, "this model has no chat template", param="messages")
        ids = await chat_prompt_ids(
            server, template, req.messages, tools=req.tools,
            add_generation_prompt=req.add_generation_prompt,
            continue_final_message=req.continue_final_message,
            chat_template_kwargs=req.chat_template_kwargs)
    strs = None
    if req.return_token_strs:
        vocab = server.tokenizer.tokenizer
        strs = await server.offload.run(lambda: [vocab.id_to_token(t) for t in ids],
                                        size=len(ids))
    return {"count": len(ids), "max_model_len": limit, "tokens": ids, "token_strs": strs}


@bp.post("/detokenize")
async def detokenize() -> Any:
    server = server_of(current_app)
    req = parse_body(DetokenizeRequest, await json_body(request))
    served_model(server, req.model)
    vocab = server.ready.model.vocab_size
    tokens = req.tokens

    def work() -> str:
        if any(not 0 <= t < vocab for t in tokens):
            raise APIError(400, f"token ids must be in [0, {vocab})", param="tokens")
        return server.tokenizer.decode(tokens, skip_special_tokens=False)

    return {"prompt": await server.offload.run(work, size=len(tokens))}
