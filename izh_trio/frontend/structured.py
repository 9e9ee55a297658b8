"""Structured outputs: a request's constraints as one llguidance grammar, checked up front.

Accepted spellings (one per request): OpenAI's ``response_format`` (``json_object``,
``json_schema``), vLLM's ``structured_outputs`` object (``json``, ``regex``, ``choice``,
``grammar``, ``json_object``) and its older ``guided_json`` / ``guided_regex`` /
``guided_choice`` / ``guided_grammar`` fields, and tool calls forced by ``tool_choice``.
JSON is compact (no free whitespace), so a bounded schema always closes in bounded tokens.
A grammar that does not compile is a 400 before the request is admitted.
"""

from __future__ import annotations

import json
from typing import Any

import attrs
import llguidance

from izh_trio.frontend.errors import APIError

_JSON_OPTIONS = {"whitespace_flexible": False}


def _schema(schema: Any, param: str) -> dict[str, Any] | bool:
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as exc:
            raise APIError(400, f"the JSON schema is not valid JSON: {exc}", param=param) from None
    if not isinstance(schema, dict | bool):
        raise APIError(400, "a JSON schema must be an object", param=param)
    return schema


def json_schema_grammar(schema: Any, param: str) -> str:
    try:
        return llguidance.LLMatcher.grammar_from_json_schema(_schema(schema, param),
                                                              defaults=_JSON_OPTIONS)
    except (ValueError, RuntimeError, TypeError) as exc:
        raise APIError(400, f"invalid JSON schema: {exc}", param=param) from None


def json_constraint(schema: Any, param: str) -> Constraint:
    """A JSON schema constraint, which keeps its schema (to be offered beside tool calls)."""
    return Constraint(param, json_schema_grammar(schema, param), _schema(schema, param))


def regex_grammar(regex: Any, param: str) -> str:
    if not isinstance(regex, str):
        raise APIError(400, "a regex must be a string", param=param)
    return llguidance.LLMatcher.grammar_from_regex(regex)


def choice_grammar(choices: Any, param: str) -> str:
    if not (isinstance(choices, list) and choices and all(isinstance(c, str) and c
                                                           for c in choices)):
        raise APIError(400, "choices must be a non-empty array of non-empty strings",
                       param=param)
    return "start: " + " | ".join(json.dumps(c, ensure_ascii=False) for c in choices)


def lark_grammar(grammar: Any, param: str) -> str:
    if not isinstance(grammar, str) or not grammar.strip():
        raise APIError(400, "a grammar must be a non-empty string (Lark syntax)", param=param)
    return grammar


#: Keywords whose values are data, not schemas: a "$ref" key inside them is not a reference.
_DATA_KEYWORDS = frozenset({"const", "enum", "default", "examples"})
#: Keywords whose values map names to schemas: a property may be called "enum" or "default".
_SCHEMA_MAPS = frozenset({"properties", "patternProperties", "$defs", "definitions",
                          "dependentSchemas"})


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
        elif key in _DATA_KEYWORDS:
            out[key] = value
        elif key in _SCHEMA_MAPS and isinstance(value, dict):  # names -> schemas
            out[key] = {name: rerooted(sub, base) for name, sub in value.items()}
        else:
            out[key] = rerooted(value, base)
    return out


def tool_call_grammar(tools: list[dict[str, Any]], *, only: str | None, parallel: bool,
                      or_json: dict[str, Any] | bool | None = None) -> str:
    """Qwen3's native calls: ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``,
    or, given ``or_json``, alternatively one JSON value of that schema (a text answer in the
    response format the request asked for).

    Each tool's parameters become ``$defs/tool_<i>`` of one document, their own references
    re-rooted there, so that ``$defs``/``definitions`` and recursion resolve as they would
    in the schema alone."""
    variants, defs = [], {}
    for i, tool in enumerate(tools):
        fn = tool["function"]
        if only is not None and fn["name"] != only:
            continue
        params = fn.get("parameters") or {"type": "object"}
        defs[f"tool_{i}"] = rerooted(params, f"#/$defs/tool_{i}")
        variants.append({
            "type": "object",
            "properties": {"name": {"const": fn["name"]},
                           "arguments": {"$ref": f"#/$defs/tool_{i}"}},
            "required": ["name", "arguments"],
            "additionalProperties": False,
        })
    schema = {"anyOf": variants, "$defs": defs, "x-guidance": _JSON_OPTIONS}
    calls = 'call ("\\n" call)*' if parallel else "call"
    start = f"start: {calls}"
    if or_json is not None and or_json is not False:  # (false admits no answer at all)
        answer = {**(or_json if isinstance(or_json, dict) else {}), "x-guidance": _JSON_OPTIONS}
        start = f"start: ({calls}) | answer\nanswer: %json {json.dumps(answer)}"
    return f'{start}\ncall: <tool_call> "\\n" %json {json.dumps(schema)} "\\n" </tool_call>\n'


@attrs.frozen
class Constraint:
    """A request's output constraint: the grammar, the field it came from, and for a JSON
    schema constraint the schema itself."""

    param: str
    grammar: str
    json_schema: dict[str, Any] | bool | None = None


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
                found.append(Constraint("structured_outputs", make(so[key], "structured_outputs")))
        if so.get("json_object"):
            found.append(json_constraint({"type": "object"}, "structured_outputs"))
    if body.get("guided_json") is not None:
        found.append(json_constraint(body["guided_json"], "guided_json"))
    legacy = {"guided_regex": regex_grammar, "guided_choice": choice_grammar,
              "guided_grammar": lark_grammar}
    for key, make in legacy.items():
        if body.get(key) is not None:
            found.append(Constraint(key, make(body[key], key)))
    return _one(found)


def check_grammar(grammar: str, tokenizer: llguidance.LLTokenizer, param: str) -> None:
    error = llguidance.LLMatcher.validate_grammar(grammar, tokenizer)
    if error:
        raise APIError(400, f"invalid {param}: {error.strip()}", param=param)
