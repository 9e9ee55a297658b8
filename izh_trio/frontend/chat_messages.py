"""Validate OpenAI chat ``messages`` and ``tools`` into the plain shape chat templates expect.

Everything a client can get wrong is caught here, as a 400 naming the field, so that a
template only ever sees strings where it expects strings (Qwen3's template calls string
methods on ``content`` and would otherwise fail with an opaque render error).
"""

from __future__ import annotations

import json
from typing import Any

from izh_trio.frontend import json_input
from izh_trio.frontend.errors import APIError

ROLES = ("system", "developer", "user", "assistant", "tool", "function")


def _bad(where: str, problem: str, param: str = "messages") -> APIError:
    return APIError(400, f"{where}: {problem}", param=param)


def _kind(value: Any) -> str:
    """The JSON name of a value's type, for error messages a client can act on."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    names: dict[type, str] = {str: "string", list: "array", dict: "object"}
    return names.get(type(value), type(value).__name__)


def _text_of(content: Any, where: str) -> str:
    """A string, or the ``text`` parts of a typed-part list joined by newlines (as vLLM does)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise _bad(where, f"must be a string or an array of content parts, not {_kind(content)}")
    texts: list[str] = []
    unsupported: list[str] = []
    for i, part in enumerate(content):
        if not isinstance(part, dict):
            raise _bad(f"{where}[{i}]", f"a content part must be an object, not {_kind(part)}")
        kind = part.get("type")
        if not isinstance(kind, str):
            raise _bad(f"{where}[{i}]", "a content part needs a string 'type'")
        if kind != "text":
            if kind not in unsupported:
                unsupported.append(kind)
            continue
        text = part.get("text")
        if not isinstance(text, str):
            raise _bad(f"{where}[{i}].text", f"must be a string, not {_kind(text)}")
        texts.append(text)
    if unsupported:
        names = ", ".join(repr(k) for k in unsupported)
        raise _bad(where, f"unsupported content part type(s) {names}; only 'text' is accepted")
    return "\n".join(texts)


def _tool_call(call: Any, where: str) -> dict[str, Any]:
    """One ``tool_calls`` entry, with its JSON-string ``arguments`` parsed into an object."""
    if not isinstance(call, dict):
        raise _bad(where, f"must be an object, not {_kind(call)}")
    if call.get("type", "function") != "function":
        raise _bad(f"{where}.type", f"unsupported tool call type {call.get('type')!r}")
    function = call.get("function")
    if not isinstance(function, dict):
        raise _bad(f"{where}.function", "must be an object with 'name' and 'arguments'")
    name = function.get("name")
    if not isinstance(name, str) or not name:
        raise _bad(f"{where}.function.name", "must be a non-empty string")
    arguments = function.get("arguments")
    if isinstance(arguments, str):
        try:  # strictly, as the body itself: this JSON is the client's too
            arguments = json_input.loads(arguments)
        except json_input.JSONInputError as exc:
            raise _bad(f"{where}.function.arguments", f"is not valid JSON ({exc})") from None
    if not isinstance(arguments, dict):
        raise _bad(f"{where}.function.arguments", "must encode a JSON object")
    out: dict[str, Any] = {"type": "function", "function": {"name": name, "arguments": arguments}}
    if call.get("id") is not None:
        if not isinstance(call["id"], str):
            raise _bad(f"{where}.id", f"must be a string, not {_kind(call['id'])}")
        out = {"id": call["id"], **out}
    return out


def _optional_str(message: dict[str, Any], key: str, where: str) -> str | None:
    value = message.get(key)
    if value is not None and not isinstance(value, str):
        raise _bad(f"{where}.{key}", f"must be a string, not {_kind(value)}")
    return value


def _message(message: Any, where: str) -> dict[str, Any]:
    if not isinstance(message, dict):
        raise _bad(where, f"must be an object, not {_kind(message)}")
    role = message.get("role")
    if role not in ROLES:
        shown = repr(role) if isinstance(role, str) else _kind(role)
        raise _bad(f"{where}.role", f"unsupported role {shown}; expected one of {', '.join(ROLES)}")
    # The legacy function-calling roles are the tool ones, as templates only know those.
    out: dict[str, Any] = {"role": {"developer": "system", "function": "tool"}.get(role, role)}
    content = message.get("content")
    calls = message.get("tool_calls")
    if calls is not None and role != "assistant":
        raise _bad(f"{where}.tool_calls", "only assistant messages may carry tool_calls")
    if message.get("function_call") is not None:  # the legacy spelling of one tool call
        if role != "assistant" or calls is not None:
            raise _bad(f"{where}.function_call", "only an assistant message without tool_calls "
                                                 "may carry function_call")
        calls = [_tool_call({"function": message["function_call"]}, f"{where}.function_call")]
    elif role == "assistant" and calls is not None:
        if not isinstance(calls, list):
            raise _bad(f"{where}.tool_calls", f"must be an array, not {_kind(calls)}")
        calls = [_tool_call(c, f"{where}.tool_calls[{i}]") for i, c in enumerate(calls)]
    if content is None:
        if role != "assistant" or not calls:
            raise _bad(f"{where}.content", f"a {role} message needs content")
        content = ""  # Qwen3's template concatenates content: a missing one would not render
    out["content"] = _text_of(content, f"{where}.content")
    if role == "assistant":
        reasoning = _optional_str(message, "reasoning_content", where)
        if reasoning is None:  # newer vLLM responses name it 'reasoning'; clients echo it back
            reasoning = _optional_str(message, "reasoning", where)
        if reasoning is not None:
            out["reasoning_content"] = reasoning
        if calls:
            out["tool_calls"] = calls
    if role == "tool" and (call_id := _optional_str(message, "tool_call_id", where)) is not None:
        out["tool_call_id"] = call_id
    if (name := _optional_str(message, "name", where)) is not None:
        out["name"] = name
    return out


def normalize_messages(messages: Any) -> list[dict[str, Any]]:
    """Validate a request's ``messages`` into fresh dicts with string ``content``; 400 on misuse."""
    if not isinstance(messages, list) or not messages:
        raise APIError(400, "messages must be a non-empty array of message objects",
                       param="messages")
    return [_message(m, f"messages[{i}]") for i, m in enumerate(messages)]


def normalize_tools(tools: Any) -> list[dict[str, Any]] | None:
    """Check ``tools`` is a list of function definitions; returned as given, as transformers does.

    The client's key order is kept, since templates print each tool with ``tojson``.
    """
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise APIError(400, f"tools must be an array, not {_kind(tools)}", param="tools")
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(tool, dict) or tool.get("type") != "function":
            raise _bad(where, "must be an object with type 'function'", "tools")
        function = tool.get("function")
        if not isinstance(function, dict):
            raise _bad(f"{where}.function", "must be an object", "tools")
        if not isinstance(function.get("name"), str) or not function["name"]:
            raise _bad(f"{where}.function.name", "must be a non-empty string", "tools")
        for key, kind, what in (("description", str, "a string"),
                                ("parameters", dict, "a JSON Schema object")):
            if function.get(key) is not None and not isinstance(function[key], kind):
                raise _bad(f"{where}.function.{key}", f"must be {what}", "tools")
    copied: list[dict[str, Any]] = json.loads(json.dumps(tools))  # a private deep copy
    return copied
