"""The bounds on output constraints, without a server: what real clients send passes (and
compiles), what is over a bound is a 400 naming the field; the grammars written in Python
are llguidance's own; library errors reach clients without internals."""

from __future__ import annotations

import enum
import json
from pathlib import Path
from typing import Any, Literal

import llguidance
import pydantic
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from izh_trio.frontend.errors import APIError
from izh_trio.frontend.grammar_check import public_message
from izh_trio.frontend.grammar_lark import check_lark
from izh_trio.frontend.grammar_limits import (
    MAX_GRAMMAR_DEPTH,
    MAX_REF_DEPTH,
    MAX_REGEX_REPEAT,
    MAX_SCHEMA_DEPTH,
    MAX_SCHEMA_REFS,
    check_choices,
    check_regex,
    check_schema,
    repeat_cost,
)
from izh_trio.frontend.structured import json_schema_grammar, regex_grammar, tool_call_grammar

FAST = settings(max_examples=60, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def refused(fn: Any, *args: Any) -> APIError:
    with pytest.raises(APIError) as info:
        fn(*args)
    assert info.value.status == 400
    return info.value


@pytest.fixture(scope="module")
def tokenizer(tiny_dir: Path) -> llguidance.LLTokenizer:
    config = json.loads((tiny_dir / "config.json").read_text())
    eos = config["eos_token_id"]
    return llguidance.LLTokenizer((tiny_dir / "tokenizer.json").read_text(),
                                  n_vocab=config["vocab_size"],
                                  eos_token=[eos] if isinstance(eos, int) else eos)


def compiles(tokenizer: llguidance.LLTokenizer, grammar: str) -> None:
    matcher = llguidance.LLMatcher(tokenizer, grammar)
    matcher.compute_bitmask()
    assert not matcher.is_error(), matcher.get_error()[:500]


# ---------------------------------------------------------------- schemas

LEAVES = st.sampled_from([
    {"type": "string"}, {"type": "integer", "minimum": 0, "maximum": 99}, {"type": "boolean"},
    {"type": "string", "pattern": "^[a-z]{1,8}$"}, {"enum": ["a", "b", {"$ref": "#/nope"}]},
    {"type": "number"}, {"type": "null"}, {"type": "string", "maxLength": 12},
])
NAMES = st.text("abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=8)


def _object(children: st.SearchStrategy) -> st.SearchStrategy:
    return st.dictionaries(NAMES, children, min_size=1, max_size=4).map(
        lambda props: {"type": "object", "properties": props, "required": sorted(props)[:1]})


SCHEMAS = st.recursive(LEAVES, lambda children: st.one_of(
    _object(children),
    children.map(lambda item: {"type": "array", "items": item, "maxItems": 3}),
    st.lists(children, min_size=1, max_size=3).map(lambda alts: {"anyOf": alts}),
), max_leaves=25)


@st.composite
def with_definitions(draw: st.DrawFn) -> dict:
    """A root and definitions that refer to each other (recursion included), as pydantic
    writes nested and recursive models."""
    n = draw(st.integers(1, 6))
    defs = {}
    for i in range(n):
        body = draw(SCHEMAS)
        target = draw(st.integers(0, n - 1))
        defs[f"M{i}"] = {"type": "object", "properties": {
            "value": body, "next": {"anyOf": [{"$ref": f"#/$defs/M{target}"}, {"type": "null"}]}}}
    return {"$ref": "#/$defs/M0", "$defs": defs}


@FAST
@given(st.one_of(SCHEMAS, with_definitions()))
def test_schemas_under_the_bounds_pass_and_compile(tokenizer: llguidance.LLTokenizer,
                                                    schema: dict) -> None:
    check_schema(schema, "guided_json")
    compiles(tokenizer, json_schema_grammar(schema, "guided_json"))


WRAPPERS = [
    lambda ref: ref,
    lambda ref: {"type": "object", "properties": {"x": ref}, "required": ["x"]},
    lambda ref: {"type": "array", "items": ref},
    lambda ref: {"anyOf": [ref, {"type": "null"}]},
    lambda ref: {"allOf": [ref], "description": "d"},
    lambda ref: {"type": "object", "additionalProperties": ref},
]


@FAST
@given(st.integers(MAX_REF_DEPTH + 1, MAX_SCHEMA_REFS - 1), st.sampled_from(range(6)),
       st.sampled_from(["guided_json", "response_format", "tools"]), st.booleans())
def test_reference_chains_past_the_bound_are_refused(length: int, wrapper: int, param: str,
                                                     backwards: bool) -> None:
    """However each link nests and in whatever order the definitions are written."""
    wrap = WRAPPERS[wrapper]
    order = reversed(range(length)) if backwards else range(length)
    defs: dict = {f"d{i}": wrap({"$ref": f"#/$defs/d{i + 1}"}) for i in order}
    defs[f"d{length}"] = {"type": "string"}
    error = refused(check_schema, {"$ref": "#/$defs/d0", "$defs": defs}, param)
    assert error.param == param and "levels deep" in error.message


@pytest.mark.parametrize("name", ["enum", "default", "const", "$defs", "$ref", "pattern"])
def test_a_chain_behind_keyword_named_properties_is_seen(name: str) -> None:
    """A property may be called "enum" or "$defs": its schema is still a schema."""
    defs: dict = {f"d{i}": {"type": "object", "properties": {name: {"$ref": f"#/$defs/d{i + 1}"}}}
                  for i in range(300)}
    defs["d300"] = {"type": "string", "pattern": "a"}
    error = refused(check_schema, {"$ref": "#/$defs/d0", "$defs": defs}, "guided_json")
    assert "levels deep" in error.message
    hidden = {"type": "object", "properties": {name: {"type": "string", "pattern": "a{99999}"}}}
    assert "repeats too much" in refused(check_schema, hidden, "guided_json").message


@FAST
@given(st.integers(MAX_SCHEMA_DEPTH // 2 + 1, 200), st.sampled_from(["guided_json", "tools"]))
def test_nesting_past_the_bound_is_refused(levels: int, param: str) -> None:
    schema: dict = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"a": schema}}
    error = refused(check_schema, schema, param)
    assert error.param == param and "nests deeper" in error.message


def test_reference_and_size_counts_are_bounded() -> None:
    many = {"type": "object", "$defs": {"s": {"type": "string"}},
            "properties": {f"p{i}": {"$ref": "#/$defs/s"} for i in range(MAX_SCHEMA_REFS + 1)}}
    assert "$refs" in refused(check_schema, many, "guided_json").message
    big = {"type": "object", "properties": {"a": {"description": "x" * 300_000}}}
    assert "too large" in refused(check_schema, big, "guided_json").message
    wide = {"type": "object", "properties": {f"p{i}": {} for i in range(2001)}}
    assert "properties" in refused(check_schema, wide, "guided_json").message
    # "$ref" and "pattern" inside data are data: not references, not regexes
    check_schema({"const": {"$ref": "#/x" * 10, "pattern": "a{99999999}"},
                  "enum": [{"$ref": "#"}] * 2000}, "guided_json")


def test_a_recursive_tree_and_a_union_of_many_stay_shallow() -> None:
    types = {f"T{i}": {"type": "object", "properties": {"l": {"$ref": "#/$defs/Expr"},
                                                         "r": {"$ref": "#/$defs/Expr"}}}
             for i in range(300)}
    types["Expr"] = {"anyOf": [{"$ref": f"#/$defs/T{i}"} for i in range(300)]}
    check_schema({"$ref": "#/$defs/Expr", "$defs": types}, "guided_json")


class Colour(enum.Enum):
    RED = "red"
    GREEN = "green"


class Address(pydantic.BaseModel):
    street: str = pydantic.Field(description="The street and number, as written on a letter.")
    postcode: str = pydantic.Field(pattern=r"^[0-9]{5}(-[0-9]{4})?$")
    country: Literal["FR", "DE", "US"] = "FR"


class Node(pydantic.BaseModel):
    name: str
    children: list[Node] = []


def _wide_model(fields: int) -> type[pydantic.BaseModel]:
    kinds: list[Any] = [str, int, float, bool, Address | None, list[Address], Colour,
                        dict[str, int], Node]
    return pydantic.create_model("Wide", **{
        f"field_{i}": (kinds[i % len(kinds)], pydantic.Field(
            default=None, description=f"Field number {i}, described as pydantic writes it."))
        for i in range(fields)})


def test_real_client_schemas_pass_and_compile(tokenizer: llguidance.LLTokenizer) -> None:
    """A pydantic model of 400 fields (nested, recursive, enums, patterns), as instructor
    or LangChain send it, alone and as three forced tools."""
    schema = _wide_model(400).model_json_schema()
    check_schema(schema, "response_format")
    compiles(tokenizer, json_schema_grammar(schema, "response_format"))
    tools = [{"type": "function", "function": {"name": f"t{i}", "parameters": schema}}
             for i in range(3)]
    compiles(tokenizer, tool_call_grammar(tools, only=None, parallel=True))


# ---------------------------------------------------------------- regexes, choices, Lark

ATOMS = st.sampled_from(["a", "[a-z]", "\\d", "\\{", "\\p{L}", ".", "[{}]"])


@st.composite
def counted(draw: st.DrawFn, depth: int = 0) -> tuple[str, int]:
    """A regex and its expected cost: counts multiply inward, add along."""
    parts, cost = [], 0
    for _ in range(draw(st.integers(1, 3))):
        if depth < 2 and draw(st.booleans()):
            inner, inner_cost = draw(counted(depth + 1))
            atom, atom_cost = f"({inner})", inner_cost
        else:
            atom, atom_cost = draw(ATOMS), 0
        quantifier = draw(st.sampled_from(["", "*", "+", "?", "{n}", "{n,}", "{m,n}"]))
        n = draw(st.integers(1, 40))
        if "n" in quantifier:
            parts.append(atom + quantifier.replace("n", str(n)).replace("m", "1"))
            cost += n * max(atom_cost, 1)
        else:
            parts.append(atom + quantifier)
            cost += atom_cost
    return "".join(parts), cost


@FAST
@given(counted())
def test_regex_repetitions_are_counted_as_the_lexer_unrolls_them(case: tuple[str, int]
                                                                 ) -> None:
    regex, cost = case
    assert repeat_cost(regex) == cost
    if cost <= MAX_REGEX_REPEAT:
        check_regex(regex, "guided_regex")
    else:
        assert "repeats too much" in refused(check_regex, regex, "guided_regex").message


@FAST
@given(st.integers(MAX_REGEX_REPEAT + 1, 10**30), st.sampled_from(["{n}", "{1,n}", "{n,}"]),
       st.sampled_from(["a", "(ab|cd)", "[0-9]"]))
def test_regex_counts_past_the_bound_are_refused(n: int, quantifier: str, atom: str) -> None:
    regex = "^" + atom + quantifier.replace("n", str(n)) + "$"
    error = refused(check_regex, regex, "guided_regex")
    assert error.param == "guided_regex" and "repeats too much" in error.message
    schema = {"type": "object", "properties": {"s": {"type": "string", "pattern": regex}}}
    assert "pattern" in refused(check_schema, schema, "guided_json").message


def test_choices_are_bounded_before_they_are_read() -> None:
    assert "too many" in refused(check_choices, [0] * 100_000, "guided_choice").message
    check_choices([f"c{i}" for i in range(4096)], "guided_choice")


JSON_LARK = r"""
// JSON, as the Lark documentation writes it
?start: value
?value: object | array | string | SIGNED_NUMBER -> number | "true" -> true | "null"
array  : "[" [value ("," value)*] "]"
object : "{" [pair ("," pair)*] "}"
pair   : string ":" value
string : ESCAPED_STRING
%import common.ESCAPED_STRING
%import common.SIGNED_NUMBER
"""
ARITHMETIC = """
start: sum
?sum: product | sum "+" product -> add | sum "-" product -> sub
?product: atom | product "*" atom -> mul | product "/" atom -> div
?atom: NUMBER -> number | "-" atom -> neg | NAME -> var | "(" sum ")"
NUMBER: /[0-9]{1,10}(\\.[0-9]{1,6})?/
NAME: /[a-z_]{1,32}/
call: %json {"type": "object", "properties": {"f": {"type": "string"}}}
"""


@pytest.mark.parametrize("grammar", [JSON_LARK, ARITHMETIC])
def test_real_grammars_pass_and_compile(tokenizer: llguidance.LLTokenizer,
                                        grammar: str) -> None:
    check_lark(grammar, "guided_grammar")
    compiles(tokenizer, grammar)


@FAST
@given(st.integers(1, 40), st.integers(0, 8))
def test_rule_chains_are_measured_as_they_nest(tokenizer: llguidance.LLTokenizer,
                                               length: int, groups: int) -> None:
    """A chain of rules, each holding the next inside ``groups`` groups: within the bound it
    passes, over it it is refused, whatever the order the rules are written in."""
    rules = [f"r{i}: " + "(" * groups + f'"a" r{i + 1} | "b"' + ")" * groups
             for i in range(length * 8)]
    depth = 1 + len(rules) * (groups + 1) + 1
    grammar = "\n".join(["start: r0", *reversed(rules), f'r{len(rules)}: "x"'])
    if depth <= MAX_GRAMMAR_DEPTH:
        check_lark(grammar, "guided_grammar")
        compiles(tokenizer, grammar)
    else:
        error = refused(check_lark, grammar, "guided_grammar")
        assert f"nests {depth} levels" in error.message


# ---------------------------------------------------------------- llguidance's own forms

@FAST
@given(st.one_of(SCHEMAS, with_definitions()),
       st.sampled_from([None, {"whitespace_flexible": True}, {"item_separator": ", "}, 5]))
def test_schema_grammars_are_llguidances_own(schema: dict, options: Any) -> None:
    if options is not None:
        schema = {**schema, "x-guidance": options}
    ours = json.loads(json_schema_grammar(schema, "x"))
    theirs = json.loads(llguidance.LLMatcher.grammar_from_json_schema(
        schema, defaults={"whitespace_flexible": False}))
    assert ours == theirs


@FAST
@given(st.text(st.characters(exclude_categories=("Cs",)), max_size=40)
       | st.text("ab\\/\n\r\t{}dDwWsS.", max_size=20))
def test_regex_grammars_are_llguidances_own(regex: str) -> None:
    assert json.loads(regex_grammar(regex, "x")) == json.loads(
        llguidance.LLMatcher.grammar_from_regex(regex))


def test_library_errors_lose_their_internals(tokenizer: llguidance.LLTokenizer) -> None:
    matcher = llguidance.LLMatcher(tokenizer, "start: " + '"a"' * 70_000)
    assert "panic" in matcher.get_error()  # the raw error is the panic and its backtrace
    assert public_message(matcher.get_error()) == \
        "the grammar is too large or too complex to compile"
    raw = ("unknown name: x at /home/ci/.cargo/registry/src/llguidance-1.9/src/lark.rs:12:5"
           "\n<state>\nTokens: ...</state>")
    assert public_message(raw) == "unknown name: x at"
    assert len(public_message("bad grammar " * 1000)) <= 600
