"""A Responses request's input items, tools, format and reasoning, in chat's terms: in the
frontend alone, each refusal a 400 naming its field."""

from __future__ import annotations

from typing import Any

import pytest

from izh_trio.frontend.chat_messages import normalize_messages
from izh_trio.frontend.errors import APIError
from izh_trio.frontend.responses.items import input_messages
from izh_trio.frontend.responses.options import reasoning_effort, text_format, tool_plan
from izh_trio.frontend.responses.request import ResponsesRequest
from izh_trio.frontend.schemas import parse_body

TZ = {"type": "object", "properties": {"tz": {"enum": ["UTC", "CET"]}}}
GET_TIME = {"type": "function", "name": "get_time", "description": "The time.",
            "parameters": TZ, "strict": True}


def test_a_string_is_one_user_message_after_the_instructions() -> None:
    assert input_messages("hi", "Be brief.") == [{"role": "system", "content": "Be brief."},
                                                 {"role": "user", "content": "hi"}]


def test_an_assistant_turn_is_one_message_and_outputs_answer_their_calls() -> None:
    items = [
        {"role": "developer", "content": [{"type": "input_text", "text": "Rules."}]},
        {"type": "message", "role": "user", "content": [
            {"type": "input_text", "text": "What time"}, {"type": "input_text", "text": "?"}]},
        {"type": "reasoning", "id": "rs_1", "summary": [],
         "content": [{"type": "reasoning_text", "text": "Ask the tool."}]},
        {"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
         "content": [{"type": "output_text", "text": "Checking.", "annotations": []}]},
        {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "get_time",
         "arguments": '{"tz": "UTC"}', "status": "completed"},
        {"type": "function_call", "call_id": "call_2", "name": "get_time",
         "arguments": '{"tz": "CET"}'},
        {"type": "function_call_output", "call_id": "call_1", "output": "12:00"},
        {"type": "function_call_output", "call_id": "call_2",
         "output": [{"type": "input_text", "text": "13:00"}]},
        {"role": "assistant", "content": "It is noon."},
    ]
    messages = input_messages(items, None)
    assert messages == [
        {"role": "developer", "content": "Rules."},
        {"role": "user", "content": "What time\n?"},
        {"role": "assistant", "content": "Checking.", "reasoning_content": "Ask the tool.",
         "tool_calls": [
             {"id": "call_1", "type": "function",
              "function": {"name": "get_time", "arguments": '{"tz": "UTC"}'}},
             {"id": "call_2", "type": "function",
              "function": {"name": "get_time", "arguments": '{"tz": "CET"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "12:00"},
        {"role": "tool", "tool_call_id": "call_2", "content": "13:00"},
        {"role": "assistant", "content": "It is noon."},
    ]
    assert normalize_messages(messages)[2]["tool_calls"][0]["function"]["arguments"] == {
        "tz": "UTC"}


def test_reasoning_after_an_answer_opens_a_new_turn() -> None:
    messages = input_messages([
        {"role": "user", "content": "a"},
        {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
        {"type": "reasoning", "summary": [{"type": "summary_text", "text": "again"}]},
        {"type": "function_call", "call_id": "d", "name": "f", "arguments": "{}"},
    ], None)
    assert [m.get("reasoning_content") for m in messages[1:]] == [None, "again"]
    assert [len(m["tool_calls"]) for m in messages[1:]] == [1, 1]


@pytest.mark.parametrize(("items", "says"), [
    ([{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}],
     "'input_image' is not supported"),
    ([{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}],
     "'input_file' is not supported"),
    ([{"type": "item_reference", "id": "msg_1"}], "continue its response with"),
    ([{"type": "web_search_call", "id": "ws"}], "'web_search_call' is not supported"),
    ([{"role": "tool", "content": "x"}], "input[0].role"),
    ([{"type": "function_call", "call_id": "c", "name": "f", "arguments": {}}],
     "input[0].arguments"),
    ([{"type": "function_call_output", "output": "x"}], "input[0].call_id"),
    ([], "non-empty array"),
    (5, "non-empty array"),
])
def test_input_it_cannot_read_is_a_400_naming_input(items: Any, says: str) -> None:
    with pytest.raises(APIError) as err:
        input_messages(items, None)
    assert err.value.status == 400 and err.value.param == "input"
    assert says in err.value.message


def test_flat_function_tools_become_chats_and_a_named_choice_forces_one() -> None:
    plan = tool_plan([GET_TIME], {"type": "function", "name": "get_time"}, True)
    assert plan.tools == [{"type": "function", "function": {
        "name": "get_time", "description": "The time.", "parameters": TZ}}]
    assert plan.forced is not None and not plan.parallel
    assert tool_plan([GET_TIME], None, True).forced is None  # auto: offered, not forced
    assert tool_plan([GET_TIME], "none", True).tools is None
    other = {"type": "function", "name": "other"}
    allowed = tool_plan([GET_TIME, other], {"type": "allowed_tools", "mode": "required",
                                            "tools": [{"type": "function", "name": "other"}]},
                        False)
    assert [t["function"]["name"] for t in allowed.tools or ()] == ["other"]
    assert allowed.forced is not None


@pytest.mark.parametrize(("tools", "choice", "param", "says"), [
    ([{"type": "web_search"}], None, "tools", "'web_search' is not supported"),
    ([{"type": "code_interpreter", "container": "auto"}], None, "tools", "built-in"),
    ([{"type": "function"}], None, "tools", "tools[0].name"),
    ([GET_TIME], {"type": "file_search"}, "tool_choice", "'file_search' is not supported"),
    ([GET_TIME], {"type": "function", "name": "nope"}, "tool_choice", "not among"),
    (None, "required", "tool_choice", "needs tools"),
    ([GET_TIME], "sometimes", "tool_choice", "unknown tool_choice"),
])
def test_tools_it_cannot_run_are_a_400(tools: Any, choice: Any, param: str, says: str) -> None:
    with pytest.raises(APIError) as err:
        tool_plan(tools, choice, True)
    assert err.value.param == param and says in err.value.message, err.value.message


def test_text_format_is_the_response_format_constraint() -> None:
    assert text_format(None) == (None, {"format": {"type": "text"}, "verbosity": "medium"})
    schema = {"type": "object", "properties": {"a": {"type": "boolean"}}}
    constraint, echo = text_format({"format": {"type": "json_schema", "name": "A",
                                               "schema": schema, "strict": True}})
    assert constraint is not None and constraint.param == "text"
    assert constraint.json_schema == schema and echo["format"]["name"] == "A"
    constraint, _ = text_format({"format": {"type": "json_object"}})
    assert constraint is not None and constraint.json_schema == {"type": "object"}
    for bad in ({"format": {"type": "json_schema", "schema": schema}},
                {"format": {"type": "yaml"}}, {"verbosity": "loud"}, "json"):
        with pytest.raises(APIError) as err:
            text_format(bad)
        assert err.value.param == "text"


def test_reasoning_effort_and_summary() -> None:
    assert reasoning_effort(None) == (None, {"effort": None, "summary": None})
    assert reasoning_effort({"effort": "none", "summary": "auto"}) == (
        "none", {"effort": "none", "summary": "auto"})
    for bad in ({"effort": "extreme"}, {"summary": "long"}, "high"):
        with pytest.raises(APIError) as err:
            reasoning_effort(bad)
        assert err.value.param == "reasoning"


@pytest.mark.parametrize(("body", "param"), [
    ({"n": 2}, "n"), ({"previous_response_id": 1}, "previous_response_id"),
    ({"background": "yes"}, "background"), ({"include": ["x"]}, "include"),
    ({"truncation": "never"}, "truncation"), ({"metadata": {"k": 1}}, "metadata"),
    ({"max_output_tokens": 0}, "max_output_tokens"), ({"top_logprobs": 21}, "top_logprobs"),
    ({"store": "yes"}, "store"), ({"prompt": {"id": "p"}}, "prompt"),
])
def test_the_request_schema_names_the_bad_field(body: dict, param: str) -> None:
    with pytest.raises(APIError) as err:
        parse_body(ResponsesRequest, {"input": "hi", **body})
    assert err.value.param == param, err.value.message


def test_nulls_are_defaults_and_logprobs_need_include() -> None:
    req = parse_body(ResponsesRequest, {"input": "hi", "store": None, "background": None,
                                        "truncation": None, "n": None, "top_logprobs": 3})
    assert req.store and not req.background and req.truncation == "disabled"
    assert req.logprobs is None
    req = parse_body(ResponsesRequest, {"input": "hi", "top_logprobs": 3, "include": [
        "message.output_text.logprobs", "reasoning.encrypted_content"]})
    assert req.logprobs == 3
