"""A chat prompt's ids, for ``/v1/chat/completions`` and ``/tokenize``: sized, rendered and
tokenized, off the event loop when the conversation is big.

Rendering holds the GIL (jinja2 is Python, and a big string's copies and scans are single
calls), so a huge conversation is refused by its size before it is rendered: the messages'
text (``prompt_size.message_text``) must fit, then the rendered text, before tokenizing.
"""

from __future__ import annotations

from typing import Any

from izh_trio.frontend.chat_template import ChatTemplate
from izh_trio.frontend.offload import size_of
from izh_trio.frontend.prompt_size import message_text
from izh_trio.frontend.server import Server


async def chat_prompt_ids(
    server: Server, template: ChatTemplate, messages: Any, *, tools: Any,
    add_generation_prompt: bool, continue_final_message: bool, chat_template_kwargs: Any,
) -> list[int]:
    """The ids of ``messages`` rendered by ``template``, or a 400 (the conversation's
    shape, or its size: too long for the context, known before tokenizing)."""
    limit = server.ready.max_model_len
    sizes = server.prompt_size

    def work() -> list[int]:
        chars, ascii_only = message_text(messages)
        sizes.check_length(chars, limit, ascii_only=ascii_only, param="messages")
        prompt = template.render_prompt(
            messages, tools=tools, add_generation_prompt=add_generation_prompt,
            continue_final_message=continue_final_message,
            chat_template_kwargs=chat_template_kwargs, call_id=server.tool_format.history_id)
        sizes.check(prompt.text, limit, param="messages")
        return server.tokenizer.encode_prompt(prompt)

    return await server.offload.run(work, size=size_of((messages, tools, chat_template_kwargs)))
