"""A chat request's tools, in either of OpenAI's spellings, and its calls in the matching shape.

``tools`` / ``tool_choice`` answer with ``message.tool_calls`` and ``finish_reason:
"tool_calls"``. The deprecated ``functions`` / ``function_call``, which older clients still
send, offer the same tools to the model and force a named function the same way (a grammar),
but answer as OpenAI answers them: one ``message.function_call`` ({name, arguments}),
``finish_reason: "function_call"``, streamed as ``delta.function_call``.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import attrs

from izh_trio.frontend.chat_messages import normalize_tools
from izh_trio.frontend.chat_parser import ToolCall
from izh_trio.frontend.errors import APIError
from izh_trio.frontend.offload import size_of
from izh_trio.frontend.schemas import ChatCompletionRequest
from izh_trio.frontend.structured import Constraint
from izh_trio.frontend.tool_formats import HERMES, OutputParser, ToolFormat


@attrs.frozen
class ToolPlan:
    """What the request's tools and its choice among them mean for this generation."""

    tools: list[dict[str, Any]] | None  # shown to the template (None for a choice of "none")
    parse: bool  # look for calls in the output
    forced: Constraint | None  # forced calls: "required" or a named function
    legacy: bool = False  # functions / function_call: answer in their shape
    parallel: bool = False  # several calls may follow one another
    format: ToolFormat = HERMES  # the checkpoint's call syntax

    def parser(self) -> OutputParser:
        """A parser of one output: its calls looked for only where tools were offered."""
        return self.format.parser(tools=self.parse)

    def constraint(self, requested: Constraint | None) -> Constraint | None:
        """The output's one constraint, given the one its format fields ask for.

        A response format shapes a text answer. A forced call is no text answer, so the call
        grammar alone applies (OpenAI accepts both, and agent frameworks send both). With
        tools offered freely, a JSON format becomes the alternative to calling: the model may
        call, or answer in that format. Other formats (a regex, a grammar) leave no room for
        calls."""
        if self.forced is not None:
            return self.forced
        if requested is None or not self.parse or requested.json_schema is None:
            return requested
        assert self.tools is not None
        return Constraint(requested.param, None, requested.json_schema, write=partial(
            self.format.grammar, self.tools, only=None, parallel=self.parallel,
            or_json=requested.json_schema, param="functions" if self.legacy else "tools"),
            size=size_of((self.tools, requested.json_schema)))

    @property
    def finish_reason(self) -> str:
        """The finish_reason of a choice that stopped after its calls."""
        return "function_call" if self.legacy else "tool_calls"

    def message_fields(self, calls: list[ToolCall]) -> dict[str, Any]:
        """The calls in a message; nothing at all without calls, as OpenAI's messages."""
        if not calls:
            return {}
        if self.legacy:  # a legacy message carries one call; a model's further ones are lost
            return {"function_call": {"name": calls[0].name, "arguments": calls[0].arguments}}
        return {"tool_calls": [{"id": c.id, "type": "function",
                                "function": {"name": c.name, "arguments": c.arguments}}
                               for c in calls]}

    def call_deltas(self, index: int, call: ToolCall) -> list[dict[str, Any]]:
        """The stream deltas of the ``index``-th call: id, type and name first, then the
        arguments (OpenAI's order)."""
        if self.legacy:
            if index:
                return []
            return [{"function_call": {"name": call.name, "arguments": ""}},
                    {"function_call": {"arguments": call.arguments}}]
        return [{"tool_calls": [{"index": index, "id": call.id, "type": "function",
                                 "function": {"name": call.name, "arguments": ""}}]},
                {"tool_calls": [{"index": index, "function": {"arguments": call.arguments}}]}]


def plan_tools(req: ChatCompletionRequest, fmt: ToolFormat = HERMES) -> ToolPlan:
    """What ``req``'s tools mean, for a checkpoint whose calls are written in ``fmt``."""
    legacy = [name for name in ("functions", "function_call") if getattr(req, name) is not None]
    if not legacy:
        named = _named_tool(req.tool_choice)
        return _plan(normalize_tools(req.tools), req.tool_choice, named, fmt,
                     parallel=req.parallel_tool_calls, params=("tools", "tool_choice"))
    if req.tools is not None or req.tool_choice is not None:
        raise APIError(400, "give functions/function_call (deprecated) or tools/tool_choice, "
                            "not both", param=legacy[0])
    choice = req.function_call
    named = _named_function(choice)
    if named is not None:
        choice = "named"
    # A legacy message holds one call, so even an unforced choice makes no parallel calls.
    return _plan(_functions(req.functions), choice, named, fmt, parallel=False,
                 params=("functions", "function_call"), legacy=True)


def _named_tool(choice: Any) -> str | None:
    if isinstance(choice, dict):
        fn = choice.get("function")
        name = fn.get("name") if isinstance(fn, dict) else None
        if choice.get("type") != "function" or not isinstance(name, str):
            raise APIError(400, "tool_choice must be 'none', 'auto', 'required' or "
                                '{"type": "function", "function": {"name": ...}}',
                           param="tool_choice")
        return name
    if choice is not None and choice not in ("none", "auto", "required"):
        raise APIError(400, f"unknown tool_choice {choice!r}", param="tool_choice")
    return None


def _named_function(choice: Any) -> str | None:
    if isinstance(choice, dict):
        name = choice.get("name")
        if not isinstance(name, str):
            raise APIError(400, "function_call must be 'none', 'auto' or {\"name\": ...}",
                           param="function_call")
        return name
    if choice is not None and choice not in ("none", "auto"):
        raise APIError(400, f"unknown function_call {choice!r}", param="function_call")
    return None


def _functions(functions: Any) -> list[dict[str, Any]] | None:
    """The legacy function list as tools, checked with errors that name ``functions``."""
    if functions is None:
        return None
    if not isinstance(functions, list):
        raise APIError(400, "functions must be an array of function definitions",
                       param="functions")
    for i, fn in enumerate(functions):
        if not isinstance(fn, dict):
            raise APIError(400, f"functions[{i}]: must be an object", param="functions")
        try:
            normalize_tools([{"type": "function", "function": fn}])
        except APIError as exc:
            raise APIError(400, exc.message.replace("tools[0].function", f"functions[{i}]"),
                           param="functions") from None
    return normalize_tools([{"type": "function", "function": fn} for fn in functions])


def _plan(tools: list[dict[str, Any]] | None, choice: Any, named: str | None,
          fmt: ToolFormat, *, parallel: bool, params: tuple[str, str],
          legacy: bool = False) -> ToolPlan:
    tools_param, choice_param = params
    parallel = parallel and fmt.parallel_calls
    if choice is None:
        choice = "auto" if tools else "none"
    if choice == "none":
        return ToolPlan(None, False, None, legacy, format=fmt)
    if not tools:
        raise APIError(400, f"{choice_param} {choice if named is None else named!r} needs "
                            f"{tools_param}", param=choice_param)
    if named is not None and named not in {t["function"]["name"] for t in tools}:
        raise APIError(400, f"{choice_param} names {named!r}, which is not among the "
                            f"{tools_param}", param=choice_param)
    forced = named is not None or choice == "required"
    constraint = (Constraint(choice_param, write=partial(
        fmt.grammar, tools, only=named, parallel=parallel and named is None,
        param=tools_param), size=size_of(tools)) if forced else None)
    return ToolPlan(tools, True, constraint, legacy, parallel=parallel and named is None,
                    format=fmt)
