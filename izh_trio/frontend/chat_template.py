"""Render a checkpoint's Jinja chat template into a prompt, as transformers would, without it.

The HTTP process must not import transformers or torch, so this reproduces the parts of
``apply_chat_template(..., tokenize=False)`` that decide the prompt text: the sandboxed
environment, its ``tojson``/``raise_exception``/``strftime_now`` helpers, the variables a
template sees, and ``continue_final_message``. Client mistakes come out as 400s.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime
from typing import Any, NoReturn

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

from izh_trio.frontend.chat_messages import normalize_messages, normalize_tools
from izh_trio.frontend.errors import APIError
from izh_trio.frontend.prompt_literals import Literals, RenderedPrompt
from izh_trio.frontend.schemas import REASONING_EFFORTS

__all__ = ["ChatTemplate", "normalize_messages", "normalize_tools", "with_reasoning_effort"]

# The named special tokens transformers hands every template (``special_tokens_map``).
SPECIAL_TOKEN_KEYS = (
    "bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token",
)
# Variables the server sets itself; chat_template_kwargs may not replace them.
RESERVED_VARIABLES = frozenset({"messages", "tools", "add_generation_prompt"})
# Appended to the final message to find where its content ends in the rendered text.
_CONTINUE_MARK = "<<izh_trio:continue_final_message>>"
# Python errors a template can raise on data it did not expect (e.g. ``str + int``).
_RENDER_ERRORS = (
    jinja2.TemplateError, TypeError, ValueError, AttributeError, KeyError, IndexError,
    ZeroDivisionError, OverflowError,
)


def _raise_exception(message: str) -> NoReturn:
    """Lets a template reject a conversation it cannot format (e.g. roles out of order)."""
    raise jinja2.TemplateError(message)


def _tojson(
    value: Any, ensure_ascii: bool = False, indent: int | None = None,
    separators: tuple[str, str] | None = None, sort_keys: bool = False,
) -> str:
    """transformers' ``tojson``: plain ``json.dumps``; Jinja's own HTML-escapes ``<``, ``&``..."""
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    """Some templates (Llama 3) print today's date into the system prompt."""
    return datetime.now().strftime(fmt)


def _token_text(value: Any) -> str | None:
    """A special token from tokenizer_config.json: a string or a serialised AddedToken."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


class ChatTemplate:
    """One compiled chat template; ``render`` turns a request's messages into prompt text."""

    def __init__(self, source: str, special_tokens: dict[str, str | None]) -> None:
        env = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
        )
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = _strftime_now
        try:
            self._template = env.from_string(source)
        except jinja2.TemplateError as exc:
            raise ValueError(f"chat template does not compile: {exc}") from exc
        self.source = source
        # Unset tokens stay undefined, as transformers leaves them out of special_tokens_map.
        self.special_tokens = {k: v for k, v in special_tokens.items() if v is not None}
        #: The special tokens' texts, kept literal in client strings (``prompt_literals``);
        #: the tokenizer sets them once it is loaded.
        self.special_texts: frozenset[str] = frozenset()

    @classmethod
    def from_tokenizer_config(cls, config: dict[str, Any]) -> ChatTemplate | None:
        """The template in a tokenizer_config.json, or None when it has none (or no ``default``)."""
        source = config.get("chat_template")
        if isinstance(source, list):  # [{"name": ..., "template": ...}, ...]
            named = {t.get("name"): t.get("template") for t in source if isinstance(t, dict)}
            source = named.get("default")
        if not isinstance(source, str):
            return None
        tokens = {key: _token_text(config.get(key)) for key in SPECIAL_TOKEN_KEYS}
        return cls(source, tokens)

    def render(
        self, messages: Any, *, tools: Any = None, add_generation_prompt: bool = True,
        continue_final_message: bool = False, chat_template_kwargs: Any = None,
        call_id: Callable[[str], str] | None = None,
    ) -> str:
        """The prompt text for ``messages`` (raw from the request body; validated here)."""
        return self.render_prompt(
            messages, tools=tools, add_generation_prompt=add_generation_prompt,
            continue_final_message=continue_final_message,
            chat_template_kwargs=chat_template_kwargs, call_id=call_id).text

    def render_prompt(
        self, messages: Any, *, tools: Any = None, add_generation_prompt: bool = True,
        continue_final_message: bool = False, chat_template_kwargs: Any = None,
        call_id: Callable[[str], str] | None = None,
    ) -> RenderedPrompt:
        """The prompt for ``messages``, with the spans where the client's strings hold
        special-token text (to be encoded as text, not as control tokens). ``call_id``: the
        id the template is shown for each tool call id of the conversation (a family's
        template may accept only its own shape of id)."""
        if add_generation_prompt and continue_final_message:
            raise APIError(400, "add_generation_prompt and continue_final_message cannot both be "
                                "true", param="continue_final_message")
        chat = normalize_messages(messages)
        if call_id is not None:
            _rename_calls(chat, call_id)
        kwargs = _template_kwargs(chat_template_kwargs)
        tool_list = normalize_tools(tools)
        variables = {**self.special_tokens, **kwargs, "messages": chat, "tools": tool_list,
                     "add_generation_prompt": add_generation_prompt}
        if continue_final_message:
            final = chat[-1]
            if final["role"] != "assistant" or "tool_calls" in final:
                raise APIError(400, "continue_final_message needs the last message to be an "
                                    "assistant message without tool_calls", param="messages")
            final["content"] += _CONTINUE_MARK
        literals = Literals(self.special_texts)  # everything but the template's own tokens
        escaped = {**self.special_tokens, **literals.escape(kwargs),
                   "messages": literals.escape(chat), "tools": literals.escape(tool_list),
                   "add_generation_prompt": add_generation_prompt}
        text = self._render(escaped, continue_final_message)
        if not literals.used:
            return RenderedPrompt(text)
        prompt = literals.restore(text)
        # Only a template that copies client text as it is lets its spans be known: the text
        # must be exactly what the template makes of the strings themselves.
        if prompt.text != self._render(variables, continue_final_message):
            raise APIError(400, "the chat template transforms message text that contains "
                                "special-token text, so that text cannot be kept literal; "
                                "remove the special-token text", param="messages")
        return prompt

    def _render(self, variables: dict[str, Any], continue_final_message: bool) -> str:
        try:
            text = self._template.render(**variables)
        except _RENDER_ERRORS as exc:
            raise APIError(400, f"chat template error: {exc}", param="messages") from exc
        if continue_final_message:
            end = text.rfind(_CONTINUE_MARK)
            if end < 0:
                raise APIError(400, "chat template error: the template does not render the final "
                                    "message's content, so it cannot be continued",
                               param="messages")
            text = text[:end]
        return text


def _rename_calls(chat: list[dict[str, Any]], call_id: Callable[[str], str]) -> None:
    for message in chat:
        for call in message.get("tool_calls", ()):
            if "id" in call:
                call["id"] = call_id(call["id"])
        if "tool_call_id" in message:
            message["tool_call_id"] = call_id(message["tool_call_id"])


def with_reasoning_effort(kwargs: Any, reasoning_effort: str | None) -> Any:
    """``chat_template_kwargs`` with the ``enable_thinking`` that OpenAI's
    ``reasoning_effort`` asks for, unless the client set ``enable_thinking`` there itself."""
    if reasoning_effort is None or not (kwargs is None or isinstance(kwargs, dict)):
        return kwargs  # a kwargs of the wrong type is render's 400 to report
    return {"enable_thinking": REASONING_EFFORTS[reasoning_effort], **(kwargs or {})}


def _template_kwargs(kwargs: Any) -> dict[str, Any]:
    """``chat_template_kwargs`` as extra template variables (e.g. ``enable_thinking``)."""
    if kwargs is None:
        return {}
    if not isinstance(kwargs, dict):
        raise APIError(400, "chat_template_kwargs must be an object", param="chat_template_kwargs")
    clash = sorted(RESERVED_VARIABLES.intersection(kwargs))
    if clash:
        raise APIError(400, f"chat_template_kwargs may not set {', '.join(clash)}",
                       param="chat_template_kwargs")
    return kwargs
