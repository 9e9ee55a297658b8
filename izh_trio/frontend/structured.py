"""Structured outputs: a request's constraints as one llguidance grammar, checked up front.

Accepted spellings (one per request): OpenAI's ``response_format`` (``json_object``,
``json_schema``), vLLM's ``structured_outputs`` object (``json``, ``regex``, ``choice``,
``grammar``, ``json_object``) and its older ``guided_json`` / ``guided_regex`` /
``guided_choice`` / ``guided_grammar`` fields, and tool calls forced by ``tool_choice``.
JSON is compact (no free whitespace), so a bounded schema always closes in bounded tokens.

Grammars are written here, in pure Python, in llguidance's own text forms (the JSON form
its ``grammar_from_json_schema`` and ``grammar_from_regex`` write, and Lark), after the
bounds of ``grammar_limits`` are checked. Nothing of llguidance runs in this process: each
grammar is compiled once, before the request is admitted, by a grammar worker
(``grammar_pool``) exactly as the engine will compile it; one it cannot compile is a 400.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from typing import Any

import attrs

from izh_trio.frontend import json_input
from izh_trio.frontend.errors import APIError
from izh_trio.frontend.grammar_lark import check_lark
from izh_trio.frontend.grammar_limits import (
    check_choices,
    check_regex,
    check_schema,
    check_schema_totals,
)
from izh_trio.frontend.offload import size_of
from izh_trio.frontend.schema_refs import DATA_KEYWORDS, SCHEMA_MAPS

_JSON_OPTIONS = {"whitespace_flexible": False}


def _schema(schema: Any, param: str) -> dict[str, Any] | bool:
    if isinstance(schema, str):
        try:  # strictly, as the body itself (json_input): this JSON is the client's too
            schema = json_input.loads(schema)
        except json_input.JSONInputError as exc:
            raise APIError(400, f"the JSON schema is not valid JSON: {exc}", param=param) from None
    if not isinstance(schema, dict | bool):
        raise APIError(400, "a JSON schema must be an object", param=param)
    return schema


def _dumps(value: Any, param: str) -> str:
    try:
        return json.dumps(value, separators=(",", ":"), allow_nan=False)
    except ValueError:  # NaN or an infinity, which a JSON body may carry but JSON cannot
        raise APIError(400, "the JSON schema holds a number JSON cannot represent (NaN or "
                            "an infinity)", param=param) from None


def _top_level(name: str, json_schema: str, lark: str | None) -> str:
    """llguidance's JSON grammar form, as its ``grammar_from_*`` functions write it."""
    return (f'{{"grammars":[{{"name":"{name}","json_schema":{json_schema},'
            f'"lark_grammar":{json.dumps(lark)}}}],"max_tokens":null}}')


def json_schema_grammar(schema: Any, param: str) -> str:
    """``grammar_from_json_schema(schema, defaults=_JSON_OPTIONS)``: the options are merged
    under the schema's own ``x-guidance`` (its keys win)."""
    schema = _schema(schema, param)
    if not isinstance(schema, dict):  # as llguidance: true/false have no place for options
        raise APIError(400, "invalid JSON schema: an object is needed, not true or false",
                       param=param)
    check_schema(schema, param)
    own = schema.get("x-guidance")
    schema = {**schema, "x-guidance": {**_JSON_OPTIONS, **own} if isinstance(own, dict)
              else _JSON_OPTIONS}
    return _top_level("json_schema", _dumps(schema, param), None)


def json_constraint(schema: Any, param: str) -> Constraint:
    """A JSON schema constraint, which keeps its schema (to be offered beside tool calls)."""
    schema = _schema(schema, param)
    return deferred(param, json_schema_grammar, schema, schema)


def regex_to_lark(regex: str) -> str:
    """The regex as the body of a Lark ``/.../`` terminal (llguidance's ``regex_to_lark``,
    Unicode semantics): ``/`` and control characters escaped, a lone trailing backslash
    dropped."""
    out, escaped = [], False
    for c in regex:
        was, escaped = escaped, False
        if c == "/":
            out.append("\\/")
        elif c in "\n\r\t":
            out.append({"\n": "\\n", "\r": "\\r", "\t": "\\t"}[c])
        elif c == "\\" and not was:
            escaped = True
        else:
            out.append("\\" + c if was else c)
    return "".join(out)


def regex_grammar(regex: Any, param: str) -> str:
    if not isinstance(regex, str):
        raise APIError(400, "a regex must be a string", param=param)
    check_regex(regex, param)
    return _top_level("regex", "null", f"start: /{regex_to_lark(regex)}/")


def choice_grammar(choices: Any, param: str) -> str:
    if not (isinstance(choices, list) and choices):
        raise APIError(400, "choices must be a non-empty array of non-empty strings",
                       param=param)
    check_choices(choices, param)  # first: a huge list is refused before it is read
    if not all(isinstance(c, str) and c for c in choices):
        raise APIError(400, "choices must be a non-empty array of non-empty strings",
                       param=param)
    # One terminal, not one rule of alternatives: llguidance's parser holds at most 2,000
    # items in a row, and 2,000 alternative rules fail at the first token; its lexer takes
    # the alternatives of one terminal in a single automaton.
    return "start: CHOICE\nCHOICE: " + " | ".join(json.dumps(c, ensure_ascii=False)
                                                  for c in choices)


def lark_grammar(grammar: Any, param: str) -> str:
    if not isinstance(grammar, str) or not grammar.strip():
        raise APIError(400, "a grammar must be a non-empty string (Lark syntax)", param=param)
    check_lark(grammar, param)
    return grammar




def rerooted(schema: Any, base: str) -> Any:
    """``schema`` with its local references (``#``, ``#/$defs/...``, ``#/definitions/...``,
    any ``#/pointer``) made to point below ``base``, where it will be placed in a larger
    document. A pydantic model's ``$defs`` and recursive ``#`` references keep working
    once the schema is nested."""
    if isinstance(schema, list):
        return [rerooted(item, base) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key == "$ref" and isinstance(value, str) and value.startswith("#"):
            out[key] = base + value[1:]
        elif key in DATA_KEYWORDS:
            out[key] = value
        elif key in SCHEMA_MAPS and isinstance(value, dict):  # names -> schemas
            out[key] = {name: rerooted(sub, base) for name, sub in value.items()}
        else:
            out[key] = rerooted(value, base)
    return out


def tool_call_schema(tools: list[dict[str, Any]], *, only: str | None, param: str = "tools",
                     args_key: str = "arguments", or_json: dict[str, Any] | bool | None = None,
                     embed_answer: bool = True) -> dict[str, Any]:
    """One JSON schema for a call of any offered tool (or of ``only``):
    ``{"name": <const>, <args_key>: <its parameters>}``, with, given ``or_json``, that answer
    schema as a further alternative (``$defs/answer``) unless ``embed_answer`` is false (the
    caller offers it as a rule of its own; it is still bounded with the tools).

    Each tool's parameters become ``$defs/tool_<i>`` of one document, their own references
    re-rooted there, so that ``$defs``/``definitions`` and recursion resolve as they would
    in the schema alone. The schemas are bounded (``grammar_limits``) one by one and
    together; an error names ``param`` (``tools``, or the legacy ``functions``)."""
    variants: list[dict[str, Any]] = []
    defs: dict[str, Any] = {}
    sizes = []
    if or_json is not None:
        sizes.append(check_schema(or_json, param, "the response format's schema"))
    for i, tool in enumerate(tools):
        fn = tool["function"]
        if only is not None and fn["name"] != only:
            continue
        params = fn.get("parameters") or {"type": "object"}
        sizes.append(check_schema(params, param, f"the parameters schema of {param}[{i}]"))
        defs[f"tool_{i}"] = rerooted(params, f"#/$defs/tool_{i}")
        variants.append({
            "type": "object",
            "properties": {"name": {"const": fn["name"]},
                           args_key: {"$ref": f"#/$defs/tool_{i}"}},
            "required": ["name", args_key],
            "additionalProperties": False,
        })
    check_schema_totals(sizes, param, "the tools' parameter schemas")
    if embed_answer and or_json is not None and or_json is not False:  # false: no answer
        defs["answer"] = rerooted(or_json, "#/$defs/answer") if isinstance(or_json, dict) \
            else {}
        variants.append({"$ref": "#/$defs/answer"})
    return {"anyOf": variants, "$defs": defs, "x-guidance": _JSON_OPTIONS}


def json_answer(or_json: dict[str, Any] | bool) -> str:
    """The Lark rule of a JSON answer in the response format, beside free calls."""
    answer = {**(or_json if isinstance(or_json, dict) else {}), "x-guidance": _JSON_OPTIONS}
    return f"answer: %json {json.dumps(answer)}"


def tool_call_grammar(tools: list[dict[str, Any]], *, only: str | None, parallel: bool,
                      or_json: dict[str, Any] | bool | None = None,
                      param: str = "tools") -> str:
    """Qwen3's native calls: ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``,
    or, given ``or_json``, alternatively one JSON value of that schema (a text answer in the
    response format the request asked for)."""
    schema = tool_call_schema(tools, only=only, param=param, or_json=or_json,
                              embed_answer=False)
    calls = 'call ("\\n" call)*' if parallel else "call"
    start = f"start: {calls}"
    if or_json is not None and or_json is not False:  # (false admits no answer at all)
        start = f"start: ({calls}) | answer\n{json_answer(or_json)}"
    return f'{start}\ncall: <tool_call> "\\n" %json {json.dumps(schema)} "\\n" </tool_call>\n'


@attrs.frozen
class Constraint:
    """A request's output constraint: the field it came from, its grammar, and for a JSON
    schema constraint the schema itself.

    The grammar may be left to ``write``: its input's bounds are checked and the grammar is
    written on first need, which ``checked_constraint`` makes happen off the event loop for
    a big input (``size``: ``offload.size_of`` of it)."""

    param: str
    _grammar: str | None = None
    json_schema: dict[str, Any] | bool | None = None
    write: Callable[[], str] | None = attrs.field(default=None, kw_only=True, eq=False,
                                                  repr=False)
    size: int = attrs.field(default=0, kw_only=True)

    @property
    def grammar(self) -> str:
        if self._grammar is not None:
            return self._grammar
        assert self.write is not None
        return self.write()

    def written(self) -> Constraint:
        """This constraint with its grammar written (or a 400 for an input over a bound)."""
        return self if self._grammar is not None else attrs.evolve(
            self, grammar=self.grammar, write=None)


def deferred(param: str, make: Callable[[Any, str], str], value: Any,
             json_schema: dict[str, Any] | bool | None = None) -> Constraint:
    """A constraint whose grammar ``make(value, param)`` writes when it is needed."""
    return Constraint(param, None, json_schema, write=functools.partial(make, value, param),
                      size=size_of(value))


def _one(found: list[Constraint]) -> Constraint | None:
    if len(found) > 1:
        names = ", ".join(c.param for c in found)
        raise APIError(400, f"give only one output constraint, not several ({names})",
                       param=found[1].param)
    return found[0] if found else None


def request_constraint(body: dict[str, Any]) -> Constraint | None:
    """The constraint named by the raw request's fields, or None."""
    found: list[Constraint] = []
    fmt = body.get("response_format")
    if fmt is not None:
        if not isinstance(fmt, dict) or fmt.get("type") not in ("text", "json_object",
                                                                 "json_schema"):
            raise APIError(400, "response_format.type must be 'text', 'json_object' or "
                                "'json_schema'", param="response_format")
        if fmt["type"] == "json_object":
            found.append(json_constraint({"type": "object"}, "response_format"))
        elif fmt["type"] == "json_schema":
            spec = fmt.get("json_schema")
            if not isinstance(spec, dict) or "schema" not in spec:
                raise APIError(400, "response_format.json_schema.schema is required",
                               param="response_format")
            found.append(json_constraint(spec["schema"], "response_format"))
    so = body.get("structured_outputs")
    if so is not None:
        if not isinstance(so, dict):
            raise APIError(400, "structured_outputs must be an object",
                           param="structured_outputs")
        if so.get("json") is not None:
            found.append(json_constraint(so["json"], "structured_outputs"))
        makers = {"regex": regex_grammar, "choice": choice_grammar, "grammar": lark_grammar}
        for key, make in makers.items():
            if so.get(key) is not None:
                found.append(deferred("structured_outputs", make, so[key]))
        if so.get("json_object"):
            found.append(json_constraint({"type": "object"}, "structured_outputs"))
    if body.get("guided_json") is not None:
        found.append(json_constraint(body["guided_json"], "guided_json"))
    legacy = {"guided_regex": regex_grammar, "guided_choice": choice_grammar,
              "guided_grammar": lark_grammar}
    for key, make in legacy.items():
        if body.get(key) is not None:
            found.append(deferred(key, make, body[key]))
    return _one(found)
