"""Each family's tool-call syntax: its parser (any split of the text gives the same calls and
text), its forced-call grammar (what it lets a model write parses with that family's parser
and validates against the tool's schema), its call ids, and the choice of the format from a
checkpoint's template and tokens."""

from __future__ import annotations

import json
import random
import re
from importlib.resources import files
from pathlib import Path

import jsonschema
import llguidance
import pytest
from tokenizers import AddedToken, Tokenizer

from izh_trio.frontend.chat_parser import ToolCall
from izh_trio.frontend.tool_formats import ToolFormat, choose_tool_format
from izh_trio.frontend.tool_formats.hermes import Hermes
from izh_trio.frontend.tool_formats.llama3_json import Llama3Json
from izh_trio.frontend.tool_formats.mistral import Mistral

TEMPLATES = Path(__file__).parent.parent / "templates"
#: Qwen3's official template, as the package ships it (the embedded model's)
QWEN3 = Path(str(files("izh_trio.tiny").joinpath("qwen3_chat_template.jinja")))


def run(fmt: ToolFormat, pieces: list[str], *, tools: bool = True
        ) -> tuple[str, str, list[tuple[str, dict]]]:
    """(reasoning, content, calls) of the text fed in ``pieces``."""
    parser = fmt.parser(tools=tools)
    events = [e for piece in pieces for e in parser.feed(piece)] + parser.finish()
    reasoning = "".join(e.text for e in events if e.kind == "reasoning")
    content = "".join(e.text for e in events if e.kind == "content")
    calls = [e.call for e in events if e.call is not None]
    assert calls == parser.calls
    return reasoning, content, [(c.name, json.loads(c.arguments)) for c in calls]


def every_split(fmt: ToolFormat, text: str, *, tools: bool = True) -> tuple:
    """The answer to the whole text, checked equal for every two-way split and for one
    character at a time."""
    whole = run(fmt, [text], tools=tools)
    for i in range(len(text) + 1):
        assert run(fmt, [text[:i], text[i:]], tools=tools) == whole, i
    assert run(fmt, list(text), tools=tools) == whole
    return whole


LLAMA, MISTRAL = Llama3Json(), Mistral(marker_id=None)
W = {"city": "Paris", "n": [1, {"a": "}"}]}


@pytest.mark.parametrize(("text", "content", "calls"), [
    ('{"name": "get", "parameters": {"city": "Paris", "n": [1, {"a": "}"}]}}', "",
     [("get", W)]),
    ('<|python_tag|>{"name": "get", "arguments": {"city": "Paris", "n": [1, {"a": "}"}]}}',
     "", [("get", W)]),
    ('  {"name": "a", "parameters": {}} ; {"name": "b", "parameters": {"x": 1}}\n', "",
     [("a", {}), ("b", {"x": 1})]),
    ('{"name": "a", "parameters": "{\\"x\\": 2}"}', "", [("a", {"x": 2})]),
    ("The answer is {not json}", "The answer is {not json}", []),
    ('{"answer": 42}', '{"answer": 42}', []),  # JSON that is no call is content
    ('{"name": "a", "parameters": {"x": ', '{"name": "a", "parameters": {"x": ', []),
    ('{"name": "a", "parameters": {}} and then text', " and then text", [("a", {})]),
    ("<|python_t", "<|python_t", []),
    ("<|python_tag|>", "", []),
    ("", "", []),
])
def test_llama3_json_calls(text: str, content: str, calls: list) -> None:
    assert every_split(LLAMA, text) == ("", content, calls)


def test_llama3_json_without_tools_is_all_content() -> None:
    text = '{"name": "a", "parameters": {}}'
    assert every_split(LLAMA, text, tools=False) == ("", text, [])


@pytest.mark.parametrize(("text", "content", "calls"), [
    ('[TOOL_CALLS][{"name": "get", "arguments": {"city": "Paris", "n": [1, {"a": "}"}]}}]',
     "", [("get", W)]),
    ('Let me look. [TOOL_CALLS] [{"name": "a", "arguments": {}}, '
     '{"name": "b", "arguments": {"x": [1]}}]', "Let me look. ", [("a", {}), ("b", {"x": [1]})]),
    ('[TOOL_CALLS]{"name": "a", "arguments": {}}', "", [("a", {})]),
    ('[TOOL_CALLS][{"name": "a", "arguments": {"x": ', '[TOOL_CALLS][{"name": "a", "arguments": '
     '{"x": ', []),
    ('[TOOL_CALLS][{"nom": "a"}] tail', '[TOOL_CALLS][{"nom": "a"}] tail', []),
    ("[TOOL_CALLS] nope", "[TOOL_CALLS] nope", []),
    ("plain [TOOL_CALL text", "plain [TOOL_CALL text", []),
    ("[TOOL_CA", "[TOOL_CA", []),
])
def test_mistral_calls(text: str, content: str, calls: list) -> None:
    assert every_split(MISTRAL, text) == ("", content, calls)


def test_mistral_ids_are_nine_alphanumerics_and_hermes_ids_are_openais() -> None:
    text = '[TOOL_CALLS][{"name": "a", "arguments": {}}, {"name": "b", "arguments": {}}]'
    parser = MISTRAL.parser(tools=True)
    parser.feed(text)
    parser.finish()
    ids = [c.id for c in parser.calls]
    assert len(ids) == 2 and len(set(ids)) == 2
    assert all(re.fullmatch(r"[A-Za-z0-9]{9}", i) for i in ids)
    assert re.fullmatch(r"call_[0-9a-f]{24}", Hermes().call_id())
    assert re.fullmatch(r"call_[0-9a-f]{24}", LLAMA.call_id())


def test_hermes_reasoning_only_where_the_family_thinks() -> None:
    text = '<think>hm</think>\n\n<tool_call>\n{"name": "a", "arguments": {}}\n</tool_call>'
    assert every_split(Hermes(reasoning=True), text) == ("hm", "", [("a", {})])
    # Qwen2.5 has no think block: the same text is content up to the call
    assert every_split(Hermes(reasoning=False), text) == ("", "<think>hm</think>\n\n",
                                                         [("a", {})])


def test_the_format_is_read_from_the_checkpoint() -> None:
    def no_tokens(text: str) -> int | None:
        return None

    llama = (TEMPLATES / "llama3.1_instruct.jinja").read_text()
    mistral = (TEMPLATES / "mistral7b_instruct_v0.3.jinja").read_text()
    assert isinstance(choose_tool_format("auto", llama, no_tokens), Llama3Json)
    chosen = choose_tool_format("auto", mistral, {"[TOOL_CALLS]": 5}.get)
    assert isinstance(chosen, Mistral) and chosen.marker_id == 5
    qwen3 = choose_tool_format("auto", QWEN3.read_text(), no_tokens)
    assert isinstance(qwen3, Hermes) and qwen3.reasoning
    qwen25 = choose_tool_format("auto", (TEMPLATES / "qwen2.5_instruct.jinja").read_text(),
                                {"<think>": 9, "[TOOL_CALLS]": 5}.get)  # the template wins
    assert isinstance(qwen25, Hermes) and not qwen25.reasoning
    # a template that says nothing of tools: the tokens decide, else hermes as before
    plain = "{% for m in messages %}{{ m.content }}{% endfor %}"
    assert isinstance(choose_tool_format("auto", plain, {"[TOOL_CALLS]": 5}.get), Mistral)
    assert isinstance(choose_tool_format("auto", plain, {"<|python_tag|>": 7}.get),
                      Llama3Json)
    fallback = choose_tool_format("auto", None, no_tokens)
    assert isinstance(fallback, Hermes) and not fallback.reasoning
    # the setting overrides what the checkpoint says
    assert isinstance(choose_tool_format("hermes", llama, no_tokens), Hermes)
    assert isinstance(choose_tool_format("mistral", llama, no_tokens), Mistral)


# --- forced calls: the grammar's text is the family's syntax, and validates ---------------

COLOR = {"enum": ["red", "green"], "title": "Color", "type": "string"}
PYDANTIC = {  # as pydantic writes a model: $defs, titles, enums, no additionalProperties
    "$defs": {"Color": COLOR,
              "Place": {"properties": {"city": {"maxLength": 8, "title": "City",
                                                "type": "string"},
                                       "zip": {"anyOf": [{"maximum": 999, "minimum": 0,
                                                          "type": "integer"},
                                                         {"type": "null"}]}},
                        "required": ["city", "zip"], "title": "Place", "type": "object"}},
    "properties": {"color": {"$ref": "#/$defs/Color"}, "place": {"$ref": "#/$defs/Place"},
                   "days": {"maximum": 7, "minimum": 1, "title": "Days", "type": "integer"}},
    "required": ["color", "place", "days"], "title": "Args", "type": "object",
}
TIME = {"type": "object", "properties": {"tz": {"enum": ["UTC", "CET"]}}, "required": ["tz"],
        "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "paint", "parameters": PYDANTIC}},
         {"type": "function", "function": {"name": "get_time", "parameters": TIME}}]
SCHEMAS = {"paint": PYDANTIC, "get_time": TIME}


@pytest.fixture(scope="module")
def vocab(tiny_dir: Path) -> tuple[Tokenizer, llguidance.LLTokenizer]:
    """The tiny tokenizer with the families' marker tokens added, as their checkpoints have."""
    tok = Tokenizer.from_file(str(tiny_dir / "tokenizer.json"))
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t in ("[TOOL_CALLS]", "<|python_tag|>")])
    return tok, llguidance.LLTokenizer(tok.to_str())


def walk(grammar: str, vocab: tuple[Tokenizer, llguidance.LLTokenizer], seed: int) -> str:
    """What a random model held to ``grammar`` writes: random allowed tokens until the
    grammar is done (tokens that close a string or an object are favoured, to end soon)."""
    tok, lltok = vocab
    matcher = llguidance.LLMatcher(lltok, grammar)
    assert not matcher.is_error(), matcher.get_error()
    rng = random.Random(seed)
    ids: list[int] = []
    size = tok.get_vocab_size(with_added_tokens=True)
    for _ in range(600):
        if matcher.is_accepting():
            return tok.decode(ids, skip_special_tokens=False)
        mask = matcher.compute_bitmask()
        allowed = [i for i in range(size) if mask[i // 8] >> (i % 8) & 1]
        closing = [i for i in allowed if any(c in tok.id_to_token(i) for c in '"}]')]
        pick = rng.choice(closing if closing and rng.random() < 0.5 else allowed)
        assert matcher.consume_token(pick), matcher.get_error()
        ids.append(pick)
    raise AssertionError("the walk did not finish")


@pytest.mark.parametrize("fmt", [Hermes(), LLAMA, "mistral"], ids=["hermes", "llama3_json",
                                                                    "mistral"])
@pytest.mark.parametrize("only", [None, "paint"])
def test_forced_calls_parse_and_validate(fmt: ToolFormat | str, only: str | None,
                                         vocab) -> None:
    if fmt == "mistral":
        fmt = Mistral(marker_id=vocab[0].token_to_id("[TOOL_CALLS]"))
    assert isinstance(fmt, ToolFormat)
    parallel = fmt.parallel_calls and only is None
    grammar = fmt.grammar(TOOLS, only=only, parallel=parallel)
    assert not llguidance.LLMatcher.validate_grammar(grammar, vocab[1])
    for seed in range(6):
        text = walk(grammar, vocab, seed)
        reasoning, content, calls = run(fmt, [text])
        assert (reasoning, content.strip()) == ("", ""), text
        assert calls and (parallel or len(calls) == 1), text
        for name, args in calls:
            assert only in (None, name)
            jsonschema.validate(args, SCHEMAS[name])


def test_a_llama_call_is_its_template_spelling(vocab) -> None:
    """The forced text is what the official template writes back for that call."""
    grammar = LLAMA.grammar(TOOLS, only="get_time", parallel=False)
    text = walk(grammar, vocab, 0)
    [(name, args)] = run(LLAMA, [text])[2]
    call = ToolCall("x", name, json.dumps(args))
    assert json.loads(text) == {"name": call.name, "parameters": json.loads(call.arguments)}


def test_mistral_is_shown_nine_alphanumeric_ids_for_any_client_id() -> None:
    from izh_trio.frontend.chat_template import ChatTemplate
    from izh_trio.frontend.errors import APIError

    template = ChatTemplate((TEMPLATES / "mistral7b_instruct_v0.3.jinja").read_text(),
                            {"bos_token": "<s>", "eos_token": "</s>"})
    turn = [{"role": "user", "content": "hi"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "toolu_01A09q90qw90lq917835lq9", "type": "function",
                 "function": {"name": "get_time", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "toolu_01A09q90qw90lq917835lq9", "content": "12"}]
    with pytest.raises(APIError, match="length 9"):
        template.render(turn, tools=TOOLS)
    shown = MISTRAL.history_id("toolu_01A09q90qw90lq917835lq9")
    assert re.fullmatch(r"[A-Za-z0-9]{9}", shown)
    assert shown == MISTRAL.history_id("toolu_01A09q90qw90lq917835lq9")
    assert shown != MISTRAL.history_id("toolu_01A09q90qw90lq917835lq8")
    assert MISTRAL.history_id("a1B2c3D4e") == "a1B2c3D4e"  # its own ids are kept
    text = template.render(turn, tools=TOOLS, call_id=MISTRAL.history_id)
    assert f'"id": "{shown}"}}]</s>[TOOL_RESULTS]{{"content": 12, "call_id": "{shown}"}}' \
        in text
    assert Hermes().history_id("call_x") == "call_x"


@pytest.mark.parametrize("name", ["hermes", "llama3_json", "mistral"])
def test_free_calls_beside_a_json_answer(name: str, vocab) -> None:
    """tool_choice auto with a JSON response format: the grammar lets the model call in its
    family's syntax, or answer in the format; either reads back as what it is."""
    fmt = {"hermes": Hermes(), "llama3_json": LLAMA,
           "mistral": Mistral(marker_id=vocab[0].token_to_id("[TOOL_CALLS]"))}[name]
    answer = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0,
                                                     "maximum": 9}},
              "required": ["n"], "additionalProperties": False}
    grammar = fmt.grammar(TOOLS, only=None, parallel=fmt.parallel_calls, or_json=answer)
    assert not llguidance.LLMatcher.validate_grammar(grammar, vocab[1])
    kinds = set()
    for seed in range(16):
        text = walk(grammar, vocab, seed)
        _, content, calls = run(fmt, [text])
        if calls:
            assert not content.strip(), text
            for tool, args in calls:
                jsonschema.validate(args, SCHEMAS[tool])
        else:
            jsonschema.validate(json.loads(content), answer)
        kinds.add(bool(calls))
    assert kinds == {True, False}  # both ways out were taken
