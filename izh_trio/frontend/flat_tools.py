"""Function tools of the flat shapes (Anthropic's custom tools, the Responses API's function
tools), checked and turned into chat's ``{"type": "function", "function": {...}}``, which the
tool planner reads."""

from __future__ import annotations

from typing import Any

import attrs

from izh_trio.frontend.errors import APIError


@attrs.frozen
class ToolShape:
    """What one API calls a function tool."""

    kind: str  #: its ``type``
    default_kind: str | None  #: the type a tool without one has (None: it needs one)
    schema_key: str  #: where its parameters' JSON Schema stands
    schema_required: bool
    elsewhere: str  #: the API's built-in tools, named in the refusal of one
    #: keys besides name, description, schema and strict a tool may have; None: any
    extras: frozenset[str] | None = None
    nullable: bool = True  #: whether a null description, schema or strict means "not given"

    def to_chat(self, tool: Any, where: str) -> dict[str, Any]:
        """*tool* as chat's function tool, or a 400 naming the member at *where*."""
        if not isinstance(tool, dict):
            raise _bad(f"{where}: must be an object")
        kind = tool.get("type", self.default_kind)
        if kind != self.kind:
            shown = repr(kind) if isinstance(kind, str) else "a tool without a string type"
            raise _bad(f"{where}: tool type {shown} is not supported: this server runs no "
                       f"{self.elsewhere}; give {self.kind} tools")
        name = tool.get("name")
        if not isinstance(name, str) or not name:
            raise _bad(f"{where}.name: must be a non-empty string")
        if self.schema_required and not isinstance(tool.get(self.schema_key), dict):
            raise _bad(f"{where}.{self.schema_key}: must be a JSON Schema object")
        function: dict[str, Any] = {"name": name}
        for key, into, kind_of, what in (
                ("description", "description", str, "a string"),
                (self.schema_key, "parameters", dict, "a JSON Schema object"),
                ("strict", None, bool, "a boolean")):
            value = tool.get(key)
            given = key in tool if not self.nullable else value is not None
            if given and not isinstance(value, kind_of):
                raise _bad(f"{where}.{key}: must be {what}")
            if value is not None and into is not None:
                function[into] = value
        if self.extras is not None:
            unknown = set(tool) - {"name", "description", self.schema_key, "strict", "type",
                                   *self.extras}
            if unknown:
                raise _bad(f"{where}: unknown fields {sorted(unknown)}")
        return {"type": "function", "function": function}


def _bad(problem: str) -> APIError:
    return APIError(400, problem, param="tools")
