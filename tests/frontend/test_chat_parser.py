"""The chat output parser: the same answer however the text is split into deltas."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from izh_trio.frontend.chat_parser import ChatOutputParser, parse_all

CALL = ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Zürich", "n": [1, 2]}}'
        "\n</tool_call>")
TEXTS = [
    "<think>\nplan: call the tool</think>\n\nLet me check." + CALL + "\n" + CALL,
    "<think></think>\n\nNo tools here, just <b>content</b> and a < sign.",
    "Plain answer with </think> inside and <think> later.",
    CALL,
    "before " + CALL + " after",
    "<tool_call>\nnot json\n</tool_call> tail",
    "<think>unfinished thought",
    "text then <tool_call>\n{\"name\": \"f\", \"arguments\": {}}",  # cut off mid-call
    "<thi",
    "",
]


def _run(parts: list[str], tools: bool) -> tuple:
    p = ChatOutputParser(tools=tools)
    events = [e for part in parts for e in p.feed(part)] + p.finish()
    reasoning = "".join(e.text for e in events if e.kind == "reasoning")
    content = "".join(e.text for e in events if e.kind == "content")
    calls = [(e.call.name, e.call.arguments) for e in events if e.kind == "tool_call"]
    return reasoning, content, calls


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(TEXTS), st.booleans(), st.data())
def test_any_split_gives_the_whole_text_answer(text: str, tools: bool, data) -> None:
    cuts = sorted(data.draw(st.sets(st.integers(1, max(1, len(text) - 1)), max_size=12)))
    parts = [text[i:j] for i, j in zip([0, *cuts], [*cuts, len(text)], strict=True)]
    assert _run(parts, tools) == _run([text], tools)
    # one character at a time: every tag split at every position
    assert _run(list(text), tools) == _run([text], tools)


def test_reasoning_content_and_calls() -> None:
    reasoning, content, calls = parse_all(TEXTS[0], reasoning=True, tools=True)
    assert reasoning == "\nplan: call the tool"
    assert content == "Let me check."
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("get_weather", {"city": "Zürich", "n": [1, 2]})] * 2
    assert len({c.id for c in calls}) == 2


def test_empty_think_block_and_stray_tags() -> None:
    assert parse_all(TEXTS[1], reasoning=True, tools=True)[:2] == (
        "", "No tools here, just <b>content</b> and a < sign.")
    assert parse_all(TEXTS[2], reasoning=True, tools=True) == (None, TEXTS[2], [])


def test_without_tools_calls_stay_content() -> None:
    assert parse_all(CALL, reasoning=True, tools=False) == (None, CALL, [])


def test_malformed_or_unfinished_calls_are_content() -> None:
    assert parse_all(TEXTS[5], reasoning=True, tools=True) == (None, TEXTS[5], [])
    assert parse_all(TEXTS[7], reasoning=True, tools=True) == (None, TEXTS[7], [])


def test_unfinished_thought_is_all_reasoning() -> None:
    assert parse_all(TEXTS[6], reasoning=True, tools=True) == ("unfinished thought", "", [])


def test_a_prefix_of_think_that_never_completes_is_content() -> None:
    assert parse_all("<thi", reasoning=True, tools=True) == (None, "<thi", [])
