"""A response's tools, tool choice, text format and reasoning, in chat's terms.

Responses spell a function tool flat (``{"type": "function", "name", "parameters"}``) and name
one in ``tool_choice`` as ``{"type": "function", "name"}``; chat nests both under
``function``. Translated, they go through chat's own tool planning (``chat_tools``), so that
both APIs offer, force and parse calls the same way. ``text.format`` is the response format
(the same constraint chat's ``response_format`` gives); ``reasoning.effort`` switches Qwen3's
thinking as chat's ``reasoning_effort`` does.
"""

from __future__ import annotations

from typing import Any

from izh_trio.frontend.chat_tools import ToolPlan, plan_tools
from izh_trio.frontend.errors import APIError
from izh_trio.frontend.flat_tools import ToolShape
from izh_trio.frontend.schemas import REASONING_EFFORTS, ChatCompletionRequest
from izh_trio.frontend.structured import Constraint, json_constraint
from izh_trio.frontend.tool_formats import HERMES, ToolFormat

SUMMARIES = ("auto", "concise", "detailed")
VERBOSITIES = ("low", "medium", "high")


def _bad(param: str, problem: str) -> APIError:
    return APIError(400, problem, param=param)


_TOOLS = ToolShape(kind="function", default_kind=None, schema_key="parameters",
                   schema_required=False,
                   elsewhere="built-in tools (web search, file search, computer use, code "
                             "interpreter, image generation, MCP...)")


def _chat_choice(choice: Any, tools: list[dict[str, Any]] | None
                 ) -> tuple[Any, list[dict[str, Any]] | None]:
    """The chat spelling of a tool choice, and the tools it leaves offered."""
    if choice is None or isinstance(choice, str):
        return choice, tools  # none/auto/required, or chat's 400 for another string
    if not isinstance(choice, dict):
        raise _bad("tool_choice", "tool_choice must be 'none', 'auto', 'required' or an "
                                  "object")
    kind = choice.get("type")
    if kind == "function":
        if not isinstance(choice.get("name"), str):
            raise _bad("tool_choice", 'tool_choice must be {"type": "function", "name": ...}')
        return {"type": "function", "function": {"name": choice["name"]}}, tools
    if kind == "allowed_tools":
        mode, allowed = choice.get("mode"), choice.get("tools")
        if mode not in ("auto", "required") or not isinstance(allowed, list):
            raise _bad("tool_choice", "allowed_tools needs mode 'auto' or 'required' and an "
                                      "array of tools")
        names = {t.get("name") for t in allowed if isinstance(t, dict)
                 and t.get("type") == "function"}
        if len(names) != len(allowed):
            raise _bad("tool_choice", "allowed_tools may list function tools only, "
                                      '{"type": "function", "name": ...}')
        return mode, [t for t in tools or () if t["function"]["name"] in names]
    shown = repr(kind) if isinstance(kind, str) else "an object without a string type"
    raise _bad("tool_choice", f"tool_choice {shown} is not supported: this server runs no "
                              "built-in tools; choose 'none', 'auto', 'required', a function "
                              "or allowed_tools")


def tool_plan(tools: Any, choice: Any, parallel: bool, fmt: ToolFormat = HERMES) -> ToolPlan:
    """Chat's plan for these Responses tools: what the template shows, what is forced."""
    if tools is not None and not isinstance(tools, list):
        raise _bad("tools", "tools must be an array")
    chat_tools = None if tools is None else [_TOOLS.to_chat(t, f"tools[{i}]")
                                             for i, t in enumerate(tools)]
    chat_choice, offered = _chat_choice(choice, chat_tools)
    return plan_tools(ChatCompletionRequest(messages=None, tools=offered,
                                            tool_choice=chat_choice,
                                            parallel_tool_calls=parallel), fmt)


def text_format(text: Any) -> tuple[Constraint | None, dict[str, Any]]:
    """``text.format``'s constraint (None for plain text), and ``text`` as a response echoes
    it."""
    if text is None:
        return None, {"format": {"type": "text"}, "verbosity": "medium"}
    if not isinstance(text, dict):
        raise _bad("text", "text must be an object")
    verbosity = text.get("verbosity")
    if verbosity is not None and verbosity not in VERBOSITIES:
        raise _bad("text", f"text.verbosity must be one of {', '.join(VERBOSITIES)}")
    fmt = text.get("format")
    echo = {"format": fmt or {"type": "text"}, "verbosity": verbosity or "medium"}
    if fmt is None:
        return None, echo
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "text":
        return None, echo
    if kind == "json_object":
        return json_constraint({"type": "object"}, "text"), echo
    if kind != "json_schema":
        raise _bad("text", "text.format.type must be 'text', 'json_object' or 'json_schema'")
    if not isinstance(fmt.get("name"), str) or "schema" not in fmt:
        raise _bad("text", "text.format of type json_schema needs a string 'name' and a "
                           "'schema'")
    if fmt.get("strict") is not None and not isinstance(fmt["strict"], bool):
        raise _bad("text", "text.format.strict must be a boolean")
    return json_constraint(fmt["schema"], "text"), echo


def reasoning_effort(reasoning: Any) -> tuple[str | None, dict[str, Any]]:
    """``reasoning.effort``, and ``reasoning`` as a response echoes it.

    A summary is accepted and answered with the reasoning itself: the reasoning item's
    ``content`` carries the model's whole reasoning text, and its ``summary`` is empty."""
    if reasoning is None:
        return None, {"effort": None, "summary": None}
    if not isinstance(reasoning, dict):
        raise _bad("reasoning", "reasoning must be an object")
    effort = reasoning.get("effort")
    if effort is not None and effort not in REASONING_EFFORTS:
        raise _bad("reasoning", f"reasoning.effort must be one of "
                                f"{', '.join(REASONING_EFFORTS)}")
    summary = reasoning.get("summary", reasoning.get("generate_summary"))
    if summary is not None and summary not in SUMMARIES:
        raise _bad("reasoning", f"reasoning.summary must be one of {', '.join(SUMMARIES)}")
    return effort, {"effort": effort, "summary": summary}
