"""Tool parameters keep their own references once nested in the call grammar."""

from __future__ import annotations

import json
from pathlib import Path

import llguidance
import pytest

from izh_trio.frontend.structured import rerooted, tool_call_grammar

COLOR = {"enum": ["red", "green"], "type": "string"}
PARAMS = {
    "$defs": {"Color": COLOR, "Node": {"type": "object", "properties": {
        "v": {"type": "integer"}, "next": {"anyOf": [{"$ref": "#/$defs/Node"},
                                                     {"type": "null"}]}}, "required": ["v"]}},
    "definitions": {"Old": {"type": "boolean"}},
    "type": "object",
    "properties": {
        "color": {"$ref": "#/$defs/Color", "description": "a $ref beside a description"},
        "node": {"$ref": "#/$defs/Node"},
        "old": {"$ref": "#/definitions/Old"},
        "again": {"anyOf": [{"$ref": "#"}, {"type": "null"}]},
        # property names that are keywords elsewhere, and data that looks like a reference
        "enum": {"type": "string", "default": "x"},
        "$ref": {"const": {"$ref": "#/not/a/reference"}},
    },
    "required": ["color", "node", "old", "again", "enum", "$ref"],
}


def test_references_are_moved_and_data_is_not() -> None:
    moved = rerooted(PARAMS, "#/$defs/tool_3")
    props = moved["properties"]
    assert props["color"] == {"$ref": "#/$defs/tool_3/$defs/Color",
                              "description": "a $ref beside a description"}
    assert props["old"] == {"$ref": "#/$defs/tool_3/definitions/Old"}
    assert props["again"]["anyOf"][0] == {"$ref": "#/$defs/tool_3"}
    assert moved["$defs"]["Node"]["properties"]["next"]["anyOf"][0] == {
        "$ref": "#/$defs/tool_3/$defs/Node"}
    assert props["$ref"] == {"const": {"$ref": "#/not/a/reference"}}
    assert props["enum"] == PARAMS["properties"]["enum"]


@pytest.fixture(scope="module")
def tokenizer(tiny_dir: Path) -> llguidance.LLTokenizer:
    return llguidance.LLTokenizer((tiny_dir / "tokenizer.json").read_text())


@pytest.mark.parametrize("only", [None, "second"])
def test_calls_with_references_match_the_grammar(tokenizer, only: str | None) -> None:
    tools = [{"type": "function", "function": {"name": n, "parameters": PARAMS}}
             for n in ("first", "second")]
    grammar = tool_call_grammar(tools, only=only, parallel=False)
    assert not llguidance.LLMatcher.validate_grammar(grammar, tokenizer)
    args = {"color": "green", "node": {"v": 1, "next": {"v": 2, "next": None}}, "old": True,
            "again": {"color": "red", "node": {"v": 3}, "old": False, "again": None,
                      "enum": "", "$ref": {"$ref": "#/not/a/reference"}},
            "enum": "e", "$ref": {"$ref": "#/not/a/reference"}}
    call = json.dumps({"name": "second", "arguments": args}, separators=(",", ":"))
    matcher = llguidance.LLMatcher(tokenizer, grammar)
    ids = [tokenizer.tokenize_str("<tool_call>")[0], *tokenizer.tokenize_str(f"\n{call}\n"),
           tokenizer.tokenize_str("</tool_call>")[0]]
    assert matcher.try_consume_tokens(ids) == len(ids), matcher.get_error()
    assert matcher.is_accepting()
    # an enum value the referenced definition does not allow stops the call
    wrong = [ids[0], *tokenizer.tokenize_str("\n" + call.replace('"green"', '"blue"'))]
    assert llguidance.LLMatcher(tokenizer, grammar).try_consume_tokens(wrong) < len(wrong)


def test_a_json_answer_beside_free_calls(tokenizer) -> None:
    """tool_choice auto with a JSON response format: a call, or an answer in the format."""
    tools = [{"type": "function", "function": {"name": "first", "parameters": PARAMS}}]
    answer = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    grammar = tool_call_grammar(tools, only=None, parallel=True, or_json=answer)
    assert not llguidance.LLMatcher.validate_grammar(grammar, tokenizer)

    def ends(ids: list[int]) -> bool:
        matcher = llguidance.LLMatcher(tokenizer, grammar)
        return matcher.try_consume_tokens(ids) == len(ids) and matcher.is_accepting()

    call = tokenizer.tokenize_str("<tool_call>")[:1] + tokenizer.tokenize_str(
        '\n{"name":"first","arguments":{"color":"red","node":{"v":1},"old":true,"again":null,'
        '"enum":"","$ref":{"$ref":"#/not/a/reference"}}}\n') + tokenizer.tokenize_str(
        "</tool_call>")[:1]
    assert ends(call)
    assert ends(tokenizer.tokenize_str('{"n":12}'))
    assert not ends(tokenizer.tokenize_str('{"m":12}'))
