"""Anthropic's ``system`` and ``messages`` as the chat messages a chat template renders.

A user turn's ``tool_result`` blocks become ``tool`` messages (before the turn's text, in the
order given), an assistant turn's ``tool_use`` blocks its ``tool_calls`` and its ``thinking``
blocks its ``reasoning_content`` (Qwen3's template keeps it within a tool loop and drops it
before a new user turn, as it was trained). Every ``tool_result`` must answer a ``tool_use`` of
the assistant turn just before it, as Anthropic requires. A conversation that ends with an
assistant turn is a prefill: the answer continues it.

Blocks this server cannot honour (images, documents, search results, server tools' results,
redacted thinking) are a 400 naming the block; ``cache_control`` markers are accepted and
change nothing (the prefix cache caches every prompt).
"""

from __future__ import annotations

import json
from typing import Any

import attrs

from izh_trio.frontend.chat_messages import normalize_messages
from izh_trio.frontend.errors import APIError


def _bad(where: str, problem: str, param: str = "messages") -> APIError:
    return APIError(400, f"{where}: {problem}", param=param)


def _string(block: dict[str, Any], key: str, where: str) -> str:
    value = block.get(key)
    if not isinstance(value, str):
        raise _bad(f"{where}.{key}", "must be a string")
    return value


def _blocks(content: Any, where: str) -> list[dict[str, Any]]:
    """A message's content as a list of blocks (a string is one text block)."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list):
        raise _bad(where, "must be a string or an array of content blocks")
    for i, block in enumerate(content):
        if not isinstance(block, dict) or not isinstance(block.get("type"), str):
            raise _bad(f"{where}[{i}]", "a content block must be an object with a string "
                                        "'type'")
    return content


def _unsupported(kind: str, where: str) -> APIError:
    return _bad(where, f"content blocks of type {kind!r} are not supported by this server "
                       "(text, tool_use, tool_result and thinking are)")


def _text(content: Any, where: str) -> str:
    """Text blocks (or a string) as one string."""
    texts = []
    for i, block in enumerate(_blocks(content, where)):
        if block["type"] != "text":
            raise _unsupported(block["type"], f"{where}[{i}]")
        texts.append(_string(block, "text", f"{where}[{i}]"))
    return "\n".join(texts)


def system_text(system: Any) -> str | None:
    """``system``, a string or text blocks, as one string (None: no system prompt)."""
    if system is None:
        return None
    try:
        return _text(system, "system")
    except APIError as exc:
        exc.param = "system"
        raise


@attrs.define
class _Conversation:
    messages: list[dict[str, Any]] = attrs.Factory(list)
    #: The ids of the last assistant turn's tool_use blocks, which the next turn may answer.
    open_calls: set[str] = attrs.Factory(set)

    def user(self, content: Any, where: str) -> None:
        texts: list[str] = []
        answered: set[str] = set()
        for i, block in enumerate(_blocks(content, f"{where}.content")):
            at, kind = f"{where}.content[{i}]", block["type"]
            if kind == "text":
                texts.append(_string(block, "text", at))
            elif kind == "tool_result":
                call_id = _string(block, "tool_use_id", at)
                if call_id not in self.open_calls or call_id in answered:
                    raise _bad(f"{at}.tool_use_id", f"{call_id!r} answers no tool_use block of "
                                                    "the assistant message just before it")
                answered.add(call_id)
                self.messages.append({"role": "tool", "tool_call_id": call_id,
                                      "content": self._result(block, at)})
            else:
                raise _unsupported(kind, at)
        self.open_calls = set()
        if texts or not answered:
            self.messages.append({"role": "user", "content": "\n".join(texts)})

    @staticmethod
    def _result(block: dict[str, Any], where: str) -> str:
        content = block.get("content", "")
        text = _text(content, f"{where}.content") if content is not None else ""
        is_error = block.get("is_error")
        if is_error is not None and not isinstance(is_error, bool):
            raise _bad(f"{where}.is_error", "must be a boolean")
        # The template has no error flag: the model reads that the call failed.
        return f"Error: {text}" if is_error else text

    def assistant(self, content: Any, where: str) -> None:
        texts: list[str] = []
        thoughts: list[str] = []
        calls: list[dict[str, Any]] = []
        for i, block in enumerate(_blocks(content, f"{where}.content")):
            at, kind = f"{where}.content[{i}]", block["type"]
            if kind == "text":
                texts.append(_string(block, "text", at))
            elif kind == "thinking":
                thoughts.append(_string(block, "thinking", at))
            elif kind == "tool_use":
                calls.append(self._call(block, at))
            else:
                raise _unsupported(kind, at)
        message: dict[str, Any] = {"role": "assistant", "content": "".join(texts)}
        if thoughts:
            message["reasoning_content"] = "\n".join(thoughts)
        if calls:
            message["tool_calls"] = calls
        self.messages.append(message)
        self.open_calls = {call["id"] for call in calls}

    @staticmethod
    def _call(block: dict[str, Any], where: str) -> dict[str, Any]:
        call_id, name = _string(block, "id", where), _string(block, "name", where)
        arguments = block.get("input")
        if not isinstance(arguments, dict):
            raise _bad(f"{where}.input", "must be an object")
        return {"id": call_id, "type": "function",
                "function": {"name": name, "arguments": json.dumps(arguments)}}


def chat_messages(system: Any, messages: Any) -> tuple[list[dict[str, Any]], bool]:
    """The chat messages of a Messages request, checked as chat's are (``chat_messages``),
    and whether the last one is an assistant turn to continue (a prefill)."""
    if not isinstance(messages, list) or not messages:
        raise _bad("messages", "must be a non-empty array of messages")
    conv = _Conversation()
    head = system_text(system)
    if head is not None:
        conv.messages.append({"role": "system", "content": head})
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            raise _bad(where, "must be an object with 'role' and 'content'")
        role = message.get("role")
        if "content" not in message:
            raise _bad(f"{where}.content", "is required")
        if role == "user":
            conv.user(message["content"], where)
        elif role == "assistant":
            conv.assistant(message["content"], where)
        else:
            shown = repr(role) if isinstance(role, str) else "missing or not a string"
            raise _bad(f"{where}.role", f"must be 'user' or 'assistant', not {shown} (the "
                                        "system prompt is the top-level 'system' field)")
    prefill = messages[-1].get("role") == "assistant"
    if prefill and "tool_calls" in conv.messages[-1]:
        raise _bad(f"messages[{len(messages) - 1}]", "a final assistant message (a prefill) "
                                                     "cannot end with tool_use blocks")
    return normalize_messages(conv.messages), prefill
