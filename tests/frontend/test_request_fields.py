"""OpenAI's request fields in the frontend alone: null as the default, the legacy functions'
translation, reasoning_effort's template switch, and the system fingerprint's inputs."""

from __future__ import annotations

import gc
from pathlib import Path

import pytest

from izh_trio.frontend.chat_parser import ToolCall
from izh_trio.frontend.chat_template import with_reasoning_effort
from izh_trio.frontend.chat_tools import plan_tools
from izh_trio.frontend.errors import APIError
from izh_trio.frontend.fingerprint import compute
from izh_trio.frontend.routes.tokenize import DetokenizeRequest
from izh_trio.frontend.schemas import ChatCompletionRequest, CompletionRequest, parse_body
from tests.refcycles import cyclic_collector_off

HI = [{"role": "user", "content": "hi"}]
GET_TIME = {"name": "get_time", "parameters": {"type": "object"}}


@pytest.mark.parametrize("body", [
    {"messages": HI, "stop_token_ids": [1, "x"]},
    {"messages": HI, "stream_options": {"include_usage": [1]}},
    {"messages": HI, "logit_bias": {"1": "x"}},
], ids=["list", "nested", "map"])
def test_a_bad_value_leaves_no_garbage_cycle(body: dict) -> None:
    """cattrs keeps a group's members in a list local to the frame that raised the group: a
    400 that kept those tracebacks left a reference cycle for the cyclic collector."""
    with cyclic_collector_off():
        with pytest.raises(APIError):
            parse_body(ChatCompletionRequest, body)
        assert gc.collect() == 0


def test_null_is_the_default_but_keeps_a_meaning_of_its_own() -> None:
    req = parse_body(CompletionRequest, {"prompt": "x", "n": None, "echo": None,
                                         "presence_penalty": None, "max_tokens": None,
                                         "stream_options": {"include_usage": None}})
    assert (req.n, req.echo, req.presence_penalty) == (1, False, 0.0)
    assert req.stream_options.include_usage is False
    assert req.max_tokens is None  # null: whatever the context leaves, not the default 16
    assert parse_body(CompletionRequest, {"prompt": "x"}).max_tokens == 16


def test_routes_outside_completions_keep_null_strict() -> None:
    with pytest.raises(APIError) as err:
        parse_body(DetokenizeRequest, {"tokens": None})
    assert err.value.param == "tokens"


def test_legacy_functions_are_tools_answered_in_their_shape() -> None:
    req = parse_body(ChatCompletionRequest, {"messages": HI, "functions": [GET_TIME],
                                             "function_call": {"name": "get_time"}})
    plan = plan_tools(req)
    assert plan.legacy and plan.tools == [{"type": "function", "function": GET_TIME}]
    assert plan.forced is not None and plan.forced.param == "function_call"
    assert plan.forced.grammar.startswith("start: call\n")  # one call, not several
    call = ToolCall("call_1", "get_time", '{"tz": "UTC"}')
    assert plan.message_fields([call]) == {"function_call": {"name": "get_time",
                                                             "arguments": '{"tz": "UTC"}'}}
    assert plan.message_fields([]) == {} and plan.finish_reason == "function_call"
    assert plan_tools(parse_body(ChatCompletionRequest, {"messages": HI})).message_fields(
        []) == {}


@pytest.mark.parametrize(("kwargs", "effort", "want"), [
    (None, None, None),
    (None, "none", {"enable_thinking": False}),
    (None, "minimal", {"enable_thinking": False}),
    ({"x": 1}, "high", {"enable_thinking": True, "x": 1}),
    ({"enable_thinking": True}, "none", {"enable_thinking": True}),
    ("not an object", "none", "not an object"),  # render reports it
])
def test_reasoning_effort_sets_enable_thinking_unless_given(kwargs, effort, want) -> None:
    assert with_reasoning_effort(kwargs, effort) == want


def test_the_fingerprint_follows_the_model_and_only_it(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text('{"hidden_size": 8}')
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(b"header" + bytes(200_000))
    first = compute("m", tmp_path, "float32")
    assert first.startswith("fp_") and len(first) == 13
    assert compute("m", tmp_path, "float32") == first
    assert compute("other", tmp_path, "float32") != first
    assert compute("m", tmp_path, "bfloat16") != first
    weights.write_bytes(b"header" + bytes(199_999) + b"\1")  # other weights, same size
    assert compute("m", tmp_path, "float32") != first
