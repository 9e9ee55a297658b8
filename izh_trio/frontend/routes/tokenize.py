"""``POST /tokenize`` and ``POST /detokenize`` in vLLM's shapes."""

from __future__ import annotations

from typing import Any

import attrs
from quart import Blueprint, current_app, request

from izh_trio.frontend.errors import APIError
from izh_trio.frontend.routes.common import json_body, served_model, server_of
from izh_trio.frontend.schemas import parse_body

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
    if req.prompt is not None:
        ids = server.tokenizer.tokenizer.encode(
            req.prompt, add_special_tokens=req.add_special_tokens).ids
    else:
        template = server.tokenizer.chat_template
        if template is None:
            raise APIError(400, "this model has no chat template", param="messages")
        ids = server.tokenizer.encode_prompt(template.render_prompt(
            req.messages, tools=req.tools, add_generation_prompt=req.add_generation_prompt,
            continue_final_message=req.continue_final_message,
            chat_template_kwargs=req.chat_template_kwargs))
    strs = ([server.tokenizer.tokenizer.id_to_token(t) for t in ids]
            if req.return_token_strs else None)
    return {"count": len(ids), "max_model_len": server.ready.max_model_len, "tokens": ids,
            "token_strs": strs}


@bp.post("/detokenize")
async def detokenize() -> Any:
    server = server_of(current_app)
    req = parse_body(DetokenizeRequest, await json_body(request))
    served_model(server, req.model)
    vocab = server.ready.model.vocab_size
    if any(not 0 <= t < vocab for t in req.tokens):
        raise APIError(400, f"token ids must be in [0, {vocab})", param="tokens")
    return {"prompt": server.tokenizer.decode(req.tokens, skip_special_tokens=False)}
