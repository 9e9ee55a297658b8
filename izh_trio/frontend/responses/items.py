"""A response's input items as the chat messages the chat template renders.

``message`` items are messages (their ``input_text`` / ``output_text`` parts joined); an
assistant's turn (its ``reasoning``, ``message`` and ``function_call`` items, in order) is one
assistant message, its calls as ``tool_calls`` and its reasoning as ``reasoning_content``;
each ``function_call_output`` is a ``tool`` message answering its call. The messages are then
checked as chat's are (``chat_messages``), so an error names ``input[i]`` here and the rest
there.
"""

from __future__ import annotations

from typing import Any

from izh_trio.frontend.errors import APIError

ROLES = ("user", "system", "developer", "assistant")
#: Content parts that carry text: input in any message, output in an assistant's.
TEXT_PARTS = {"input_text": "text", "output_text": "text", "refusal": "refusal"}
#: Item types this server cannot take, and why: a 400 naming them, never silence.
UNSUPPORTED = {
    "item_reference": "send the item itself, or continue its response with "
                      "previous_response_id",
}


def _bad(where: str, problem: str) -> APIError:
    return APIError(400, f"{where}: {problem}", param="input")


def _text(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise _bad(where, "must be a string or an array of content parts")
    texts = []
    for i, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in TEXT_PARTS:
            shown = repr(kind) if isinstance(kind, str) else "a part without a string type"
            raise _bad(f"{where}[{i}]", f"content part {shown} is not supported: this "
                                        "server reads text only (input_text, output_text)")
        text = part.get(TEXT_PARTS[kind])
        if not isinstance(text, str):
            raise _bad(f"{where}[{i}].{TEXT_PARTS[kind]}", "must be a string")
        texts.append(text)
    return "\n".join(texts)


def _string(item: dict[str, Any], key: str, where: str) -> str:
    value = item.get(key)
    if not isinstance(value, str) or not value:
        raise _bad(f"{where}.{key}", "must be a non-empty string")
    return value


def _reasoning_text(item: dict[str, Any], where: str) -> str:
    """The reasoning's own text, else its summary's (what a client kept of it)."""
    for key, kind in (("content", "reasoning_text"), ("summary", "summary_text")):
        parts = item.get(key)
        if parts is None:
            continue
        if not isinstance(parts, list) or not all(
                isinstance(p, dict) and p.get("type") == kind and isinstance(p.get("text"), str)
                for p in parts):
            raise _bad(f"{where}.{key}", f"must be an array of {kind} parts")
        if parts:
            return "\n".join(p["text"] for p in parts)
    return ""


class _Conversation:
    """Messages as the items come: an assistant turn stays open for what follows in it."""

    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = []
        self._turn: dict[str, Any] | None = None  # the open assistant message

    def say(self, role: str, content: str) -> None:
        self._turn = None
        self.messages.append({"role": role, "content": content})

    def _assistant(self, fresh: bool) -> dict[str, Any]:
        if self._turn is None or fresh:
            self._turn = {"role": "assistant", "content": ""}
            self.messages.append(self._turn)
        return self._turn

    def think(self, text: str) -> None:
        turn = self._assistant(fresh=bool(self._turn and (self._turn["content"]
                                                          or "tool_calls" in self._turn)))
        turn["reasoning_content"] = turn.get("reasoning_content", "") + text

    def answer(self, text: str) -> None:
        turn = self._assistant(fresh=bool(self._turn and "tool_calls" in self._turn))
        turn["content"] += text

    def call(self, call: dict[str, Any]) -> None:
        self._assistant(fresh=False).setdefault("tool_calls", []).append(call)

    def output(self, call_id: str, content: str) -> None:
        self._turn = None
        self.messages.append({"role": "tool", "tool_call_id": call_id, "content": content})


def _item(conv: _Conversation, item: Any, where: str) -> None:
    if not isinstance(item, dict):
        raise _bad(where, "an input item must be an object")
    kind = item.get("type", "message" if "role" in item else None)
    if kind == "message":
        role = item.get("role")
        if role not in ROLES:
            raise _bad(f"{where}.role", f"must be one of {', '.join(ROLES)}")
        content = _text(item.get("content"), f"{where}.content")
        if role == "assistant":
            conv.answer(content)
        else:
            conv.say(role, content)
    elif kind == "reasoning":
        conv.think(_reasoning_text(item, where))
    elif kind == "function_call":
        arguments = item.get("arguments")
        if not isinstance(arguments, str):
            raise _bad(f"{where}.arguments", "must be a string of JSON")
        conv.call({"id": _string(item, "call_id", where), "type": "function",
                   "function": {"name": _string(item, "name", where), "arguments": arguments}})
    elif kind == "function_call_output":
        conv.output(_string(item, "call_id", where), _text(item.get("output"),
                                                           f"{where}.output"))
    elif isinstance(kind, str) and kind in UNSUPPORTED:
        raise _bad(where, f"item type {kind!r} is not supported: {UNSUPPORTED[kind]}")
    else:
        shown = repr(kind) if isinstance(kind, str) else "an item without a string type"
        raise _bad(where, f"item type {shown} is not supported: this server takes message, "
                          "function_call, function_call_output and reasoning items")


def input_messages(input_: Any, instructions: str | None) -> list[dict[str, Any]]:
    """The chat messages of a request's ``instructions`` and ``input``; 400 on misuse."""
    conv = _Conversation()
    if instructions is not None:
        conv.say("system", instructions)
    if isinstance(input_, str):
        conv.say("user", input_)
    elif isinstance(input_, list) and input_:
        for i, item in enumerate(input_):
            _item(conv, item, f"input[{i}]")
    else:
        raise APIError(400, "input must be a string or a non-empty array of items",
                       param="input")
    return conv.messages

