"""A Messages request's tools, tool choice and thinking, in chat's terms.

Anthropic's tools (``{"name", "description", "input_schema"}``) become chat's function tools and
go through chat's own tool planning (``chat_tools``), so that every API offers, forces and
parses calls the same way: ``tool_choice`` ``auto``, ``any`` (chat's ``required``), ``tool``
(a named function) and ``none``; ``disable_parallel_tool_use`` is chat's
``parallel_tool_calls: false``. Server tools (web search, code execution, bash, the text
editor, computer use...) are a 400: this server runs none.

``thinking`` is Qwen3's switch: ``enabled`` (with a budget the engine enforces by closing the
think block when it is spent), ``adaptive`` or ``disabled``; absent, it is off. ``output_config``'s
``format`` is a JSON schema constraint, as chat's ``response_format``.
"""

from __future__ import annotations

from typing import Any

import attrs

from izh_trio.frontend.chat_tools import ToolPlan, plan_tools
from izh_trio.frontend.errors import APIError
from izh_trio.frontend.flat_tools import ToolShape
from izh_trio.frontend.schemas import ChatCompletionRequest
from izh_trio.frontend.structured import Constraint, json_constraint
from izh_trio.frontend.tool_formats import HERMES, ToolFormat

#: Anthropic's custom tools; cache_control changes nothing here.
_TOOLS = ToolShape(kind="custom", default_kind="custom", schema_key="input_schema",
                   schema_required=True, extras=frozenset({"cache_control"}), nullable=False,
                   elsewhere="server tools (web search, code execution, bash, text editor, "
                             "computer use...)")


def _bad(param: str, problem: str) -> APIError:
    return APIError(400, problem, param=param)


def _chat_choice(choice: Any) -> tuple[Any, bool]:
    """The chat spelling of a tool choice, and whether parallel calls are allowed."""
    if choice is None:
        return None, True
    if not isinstance(choice, dict) or not isinstance(choice.get("type"), str):
        raise _bad("tool_choice", 'tool_choice must be an object such as {"type": "auto"}')
    kind = choice["type"]
    disable = choice.get("disable_parallel_tool_use", False)
    if not isinstance(disable, bool) or (disable and kind == "none"):
        raise _bad("tool_choice", "tool_choice.disable_parallel_tool_use must be a boolean "
                                  "(and not given with type 'none')")
    extra = set(choice) - {"type", "disable_parallel_tool_use", "name"}
    if extra or (kind != "tool" and "name" in choice):
        raise _bad("tool_choice", f"tool_choice has fields {sorted(set(choice) - {'type'})} "
                                  f"that type {kind!r} does not take")
    if kind == "tool":
        if not isinstance(choice.get("name"), str):
            raise _bad("tool_choice", 'tool_choice of type "tool" needs a string "name"')
        return {"type": "function", "function": {"name": choice["name"]}}, not disable
    chat = {"auto": "auto", "any": "required", "none": "none"}.get(kind)
    if chat is None:
        raise _bad("tool_choice", f"tool_choice type {kind!r} is not one of auto, any, tool, "
                                  "none")
    return chat, not disable


def tool_plan(tools: Any, choice: Any, fmt: ToolFormat = HERMES) -> ToolPlan:
    """Chat's plan for these tools: what the template shows, what is forced."""
    if tools is not None and not isinstance(tools, list):
        raise _bad("tools", "tools must be an array")
    chat_tools = None if tools is None else [_TOOLS.to_chat(t, f"tools[{i}]")
                                             for i, t in enumerate(tools)]
    chat_choice, parallel = _chat_choice(choice)
    try:
        return plan_tools(ChatCompletionRequest(messages=None, tools=chat_tools or None,
                                                tool_choice=chat_choice,
                                                parallel_tool_calls=parallel), fmt)
    except APIError as exc:  # said in this API's words
        if exc.param == "tool_choice":
            exc.message = exc.message.replace("'required'", "'any'")
        raise


@attrs.frozen
class Thinking:
    enabled: bool
    budget: int | None = None  # output tokens the think block may take (None: unbounded)
    shown: bool = True  # display "omitted": the blocks come back empty


_THINKING = ("enabled", "adaptive", "between_tools", "disabled")


def thinking(value: Any, max_tokens: int | None) -> Thinking:
    """``thinking``, checked. ``enabled`` needs a ``budget_tokens`` below ``max_tokens`` (so
    that the answer has room after the thinking; no minimum here: a small model thinks
    shorter than Anthropic's 1,024). ``adaptive`` and ``between_tools`` leave the length to
    the model: Qwen3 thinks as it was trained, before each answer."""
    if value is None:
        return Thinking(False)
    kind = value.get("type") if isinstance(value, dict) else None
    if kind not in _THINKING:
        raise _bad("thinking", "thinking must be an object whose type is one of "
                               f"{', '.join(_THINKING)}")
    allowed = {"type"} | ({"display"} if kind in ("enabled", "adaptive") else set()) | (
        {"budget_tokens"} if kind == "enabled" else set())
    if set(value) - allowed:
        raise _bad("thinking", f"thinking of type {kind!r} takes only "
                               f"{', '.join(sorted(allowed))}")
    display = value.get("display")
    if display not in (None, "summarized", "omitted"):
        raise _bad("thinking", "thinking.display must be 'summarized' or 'omitted'")
    if kind == "disabled":
        return Thinking(False)
    budget = value.get("budget_tokens")
    if kind == "enabled":
        if isinstance(budget, bool) or not isinstance(budget, int):
            raise _bad("thinking", "thinking of type 'enabled' needs an integer budget_tokens")
        if budget < 1 or (max_tokens is not None and budget >= max_tokens):
            raise _bad("thinking", f"thinking.budget_tokens must be at least 1 and less than "
                                   f"max_tokens ({max_tokens})")
    return Thinking(True, budget, shown=display != "omitted")


_EFFORTS = ("low", "medium", "high", "xhigh", "max")


def output_format(config: Any) -> Constraint | None:
    """``output_config``: its ``format`` (a JSON schema) is the output's constraint; its
    ``effort`` is accepted and changes nothing (the model has no such dial)."""
    if config is None:
        return None
    if not isinstance(config, dict) or set(config) - {"effort", "format"}:
        raise _bad("output_config", "output_config is an object with 'effort' and 'format'")
    if config.get("effort") not in (None, *_EFFORTS):
        raise _bad("output_config", f"output_config.effort must be one of {', '.join(_EFFORTS)}")
    fmt = config.get("format")
    if fmt is None:
        return None
    if not isinstance(fmt, dict) or fmt.get("type") != "json_schema" or set(fmt) != {
            "type", "schema"}:
        raise _bad("output_config", 'output_config.format must be {"type": "json_schema", '
                                    '"schema": {...}}')
    return json_constraint(fmt["schema"], "output_config")
