"""The strict JSON parser for client input: what it keeps, what it refuses, what it names."""

from __future__ import annotations

import json
import time
from collections.abc import Callable

import hypothesis.strategies as st
import pytest
from hypothesis import given, settings

from izh_trio.frontend import protocol_errors
from izh_trio.frontend.json_input import MAX_DEPTH, JSONInputError, loads

_TEXT = st.text(st.characters(blacklist_categories=("Cs",)))
_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1)
    | st.floats(allow_nan=False, allow_infinity=False) | _TEXT,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_TEXT, inner, max_size=4),
    max_leaves=30)


@settings(max_examples=300, deadline=None)
@given(value=_JSON, ascii_only=st.booleans())
def test_valid_json_reads_as_the_standard_library_reads_it(value: object,
                                                           ascii_only: bool) -> None:
    text = json.dumps(value, ensure_ascii=ascii_only)
    assert loads(text.encode()) == json.loads(text)
    assert loads(text) == json.loads(text)


def _nest(depth: int) -> str:
    return "[" * depth + "]" * depth


@pytest.mark.parametrize("kind", ["array", "object"])
def test_nesting_is_allowed_to_the_limit_and_no_further(kind: str) -> None:
    def doc(depth: int) -> str:
        if kind == "array":
            return _nest(depth)
        return '{"a":' * (depth - 1) + "{}" + "}" * (depth - 1)

    loads(doc(MAX_DEPTH))
    with pytest.raises(JSONInputError, match="nested more than"):
        loads(doc(MAX_DEPTH + 1))
    loads('{"x": ' + _nest(MAX_DEPTH - 1) + "}")
    with pytest.raises(JSONInputError) as refused:
        loads('{"ok": [[1]], "x": ' + _nest(MAX_DEPTH) + "}")
    assert refused.value.field == "x"


@pytest.mark.parametrize(("raw", "field", "says"), [
    (b'{"a": 1, "b": "\\ud800"}', "b", "surrogate"),
    (b'{"a": "\\udc00"}', "a", "surrogate"),
    (b'{"a": ["\\ude00\\ud83d"]}', "a", "surrogate"),
    (b'{"k\\ud800": 1}', "k\\ud800", "surrogate"),
    (b'{"a": 1, "t": NaN}', "t", "NaN"),
    (b'{"t": -Infinity}', "t", "NaN"),
    (b'{"n": ' + b"9" * 5000 + b"}", "n", "too large"),
    (b'{"n": 1e999}', "n", "too large"),
    (b'{"a": "caf\xe9"}', "a", "UTF-8"),
    (b'\xef\xbb\xbf{"a": 1}', None, "byte-order mark"),
    (b'{"a": ' + b"[" * 2000 + b"]" * 2000 + b"}", "a", "nested"),
    (b"[" * 2000 + b"]" * 2000, None, "nested"),
    (b'{"a": 1', None, ""),
    (b'{"a": "x"} {}', None, ""),
    (b'["\\ud800"]', None, "surrogate"),
])
def test_refusals_name_the_problem_and_the_field(raw: bytes, field: str | None,
                                                 says: str) -> None:
    with pytest.raises(JSONInputError) as refused:
        loads(raw)
    assert says in refused.value.message, refused.value.message
    assert "(line 1, column " in refused.value.message  # all of these are parse errors
    assert refused.value.field == field
    refused.value.message.encode("utf-8")  # an error body can always carry it


def test_surrogate_pairs_are_text() -> None:
    assert loads(b'"\\ud83d\\ude00"') == "\U0001f600"


def _best_of(runs: int, fn: Callable[[], object]) -> float:
    """The shortest of ``runs`` timings: the run the machine's load disturbed least."""
    best = float("inf")
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


@pytest.mark.timing
def test_a_wide_body_is_checked_in_a_fraction_of_its_parse() -> None:
    """A million small arrays: the depth check walks a level at a time, in C. Compared with
    the standard parser on the same machine, each at its best of three, so the machine's
    speed cancels out and a busy neighbour cannot make one side look slow."""
    raw = b'{"prompt": [' + b"[1]," * 1_000_000 + b"[1]]}"
    baseline = _best_of(3, lambda: json.loads(raw))
    assert _best_of(3, lambda: loads(raw)) < 3 * baseline + 0.5


def test_hypercorns_own_errors_are_shaped() -> None:
    import hypercorn.protocol

    assert protocol_errors.install()
    assert protocol_errors.install()  # idempotent
    assert hypercorn.protocol.H11Protocol is protocol_errors.ShapedH11Protocol
