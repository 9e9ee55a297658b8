"""The closer finds, from any reachable state of a grammar, tokens that end it validly.

States are reached by random walks over the grammar's own mask (any allowed token, special
tokens and broken-off multi-byte characters included); from each, the path must be allowed
token by token and leave the matcher where the output may end (then an eos, or stopped).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import llguidance
import numpy as np
import pytest
from llguidance.numpy import allocate_token_bitmask, fill_next_token_bitmask

from izh_trio.engine.grammar_closer import GrammarCloser
from izh_trio.frontend.structured import json_schema_grammar, regex_grammar, tool_call_grammar

COLOR = {"enum": ["red", "green", "blue"], "title": "Color", "type": "string"}
PERSON = {  # as pydantic writes a model with an enum and a nested model
    "$defs": {"Color": COLOR, "Address": {
        "properties": {"street": {"title": "Street", "type": "string"},
                       "zip": {"anyOf": [{"type": "integer"}, {"type": "null"}]}},
        "required": ["street", "zip"], "title": "Address", "type": "object"}},
    "properties": {"name": {"type": "string"}, "color": {"$ref": "#/$defs/Color"},
                   "address": {"$ref": "#/$defs/Address", "description": "where"},
                   "tags": {"items": {"type": "string"}, "type": "array"}},
    "required": ["name", "color", "address", "tags"], "title": "Person", "type": "object",
}
TREE = {"type": "object", "properties": {"v": {"type": "number"}, "kids": {
    "type": "array", "items": {"$ref": "#"}}}, "required": ["v", "kids"]}
MATRIX = {"type": "object", "properties": {"m": {"type": "array", "items": {
    "type": "array", "items": {"type": "number"}, "minItems": 2}, "minItems": 1}},
    "required": ["m"]}
GRAMMARS = {
    "person": json_schema_grammar(PERSON, "x"),
    "tree": json_schema_grammar(TREE, "x"),
    "matrix": json_schema_grammar(MATRIX, "x"),
    "any_object": json_schema_grammar({"type": "object"}, "x"),
    "tool_calls": tool_call_grammar(
        [{"type": "function", "function": {"name": "who", "parameters": PERSON}},
         {"type": "function", "function": {"name": "grow", "parameters": TREE}}],
        only=None, parallel=True),
    "email": regex_grammar(r"[a-z]+@[a-z]+\.(com|org)", "x"),
    "repeat": regex_grammar(r"(ab)+c", "x"),
}


@pytest.fixture(scope="module")
def tokenizer(tiny_dir: Path) -> llguidance.LLTokenizer:
    config = json.loads((tiny_dir / "config.json").read_text())
    return llguidance.LLTokenizer((tiny_dir / "tokenizer.json").read_text(),
                                  n_vocab=config["vocab_size"], eos_token=[config["eos_token_id"]])


def _allowed(matcher: llguidance.LLMatcher, vocab: int) -> np.ndarray:
    mask = allocate_token_bitmask(1, vocab)
    fill_next_token_bitmask(matcher, mask, 0)
    bits = np.unpackbits(mask.view(np.uint8), bitorder="little")[:vocab]
    return np.flatnonzero(bits)


def _check_path(matcher: llguidance.LLMatcher, path: list[int], eos: int) -> None:
    for token in path:
        assert not matcher.is_stopped()
        assert token in _allowed(matcher, matcher_vocab(matcher)), token
        matcher.consume_token(token)
    assert matcher.is_stopped() or not path or path[-1] == eos


def matcher_vocab(matcher: llguidance.LLMatcher) -> int:
    return matcher.vocab_size if hasattr(matcher, "vocab_size") else VOCAB


VOCAB = 2000


@pytest.mark.parametrize("name", sorted(GRAMMARS))
def test_every_reachable_state_has_a_valid_ending(name: str, tokenizer) -> None:
    closer = GrammarCloser(tokenizer, VOCAB)
    rng = random.Random(name)
    for _walk in range(12):
        matcher = llguidance.LLMatcher(tokenizer, GRAMMARS[name])
        for _step in range(rng.randint(0, 60)):
            allowed = [t for t in _allowed(matcher, VOCAB) if t != tokenizer.eos_token]
            if matcher.is_stopped() or not allowed:
                break
            matcher.consume_token(int(rng.choice(allowed)))
        if matcher.is_stopped():
            continue
        path = closer.path(matcher)
        assert path is not None, name
        assert not matcher.is_error()
        _check_path(matcher, path, tokenizer.eos_token)
        if path and path[-1] == tokenizer.eos_token:
            assert matcher.is_accepting()


def test_the_path_leaves_the_matcher_untouched(tokenizer) -> None:
    closer = GrammarCloser(tokenizer, VOCAB)
    matcher = llguidance.LLMatcher(tokenizer, GRAMMARS["person"])
    prefix = tokenizer.tokenize_str('{"name":"Ada","color":"gr')
    assert matcher.consume_tokens(prefix)
    path = closer.path(matcher)
    # a top-level JSON value stops its grammar: no eos follows
    assert tokenizer.decode_str(path) == 'een","address":{"street":"","zip":0},"tags":[]}'
    assert closer.path(matcher) == path  # the same state again
    assert matcher.consume_tokens(tokenizer.tokenize_str('een"'))


def test_an_ending_inside_a_multibyte_character(tokenizer) -> None:
    """Cut after the first byte of a three-byte character: the path completes the
    character before it closes the string."""
    closer = GrammarCloser(tokenizer, VOCAB)
    matcher = llguidance.LLMatcher(tokenizer, GRAMMARS["person"])
    raw = '{"name":"日'.encode()
    assert matcher.consume_tokens(tokenizer.tokenize_bytes(raw[:-2]))
    path = closer.path(matcher)
    text = (raw[:-2] + tokenizer.decode_bytes(path)).decode()
    assert json.loads(text)["name"][0] != "\ufffd"


def test_no_ending_is_none(tokenizer) -> None:
    closer = GrammarCloser(tokenizer, VOCAB)
    # Every output is longer than a walk may go, and no byte of it is forced...
    matcher = llguidance.LLMatcher(tokenizer, regex_grammar("[ab]{600}", "x"))
    assert closer.path(matcher) is None
    # ...while a forced stretch is taken whole, however long.
    matcher = llguidance.LLMatcher(tokenizer, regex_grammar("a{600}", "x"))
    assert tokenizer.decode_str(closer.path(matcher)) == "a" * 600
