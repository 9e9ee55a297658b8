"""Every prefix of a compact JSON text has a completion that parses."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from izh_trio.engine.json_closer import json_completion

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner,
                                                                max_size=4),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None)
@given(JSON, st.booleans())
def test_every_prefix_completes(value: object, ascii_only: bool) -> None:
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=ascii_only)
    for cut in range(len(text) + 1):
        completion = json_completion(text[:cut])
        assert completion is not None, text[:cut]
        json.loads(text[:cut] + completion)
    assert json_completion(text) == ""


def test_unreadable_text_is_none() -> None:
    assert json_completion('{"a":1}}') is None
    assert json_completion("{x") is None
    assert json_completion("{\"a\":nope") is None
