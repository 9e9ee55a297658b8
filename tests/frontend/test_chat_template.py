"""The chat-template layer renders exactly what transformers renders, and 400s client mistakes."""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from izh_trio.frontend.chat_template import ChatTemplate, normalize_messages
from izh_trio.frontend.errors import APIError
from izh_trio.frontend.tokenizer import ModelTokenizer

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name, e.g. Zürich"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "Local time <HH:MM> & zone.",
        "parameters": {"type": "object", "properties": {"tz": {"type": "string"}}},
    },
}
CALLS = [
    {"id": "call_1", "type": "function",
     "function": {"name": "get_weather", "arguments": '{"city": "Zürich", "unit": "celsius"}'}},
    {"id": "call_2", "type": "function",
     "function": {"name": "get_time", "arguments": '{"tz":"Europe/Zurich"}'}},
]
TOOL_TURN = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Weather and time in Zürich?"},
    {"role": "assistant", "content": None, "tool_calls": CALLS},
    {"role": "tool", "tool_call_id": "call_1", "content": '{"temp": 21}'},
    {"role": "tool", "tool_call_id": "call_2", "name": "get_time", "content": "14:05"},
]


@pytest.fixture(scope="module")
def hf_tok(tiny_dir: Path) -> Any:
    import transformers

    return transformers.AutoTokenizer.from_pretrained(tiny_dir)


@pytest.fixture(scope="module")
def ours(tiny_dir: Path) -> ChatTemplate:
    template = ChatTemplate.from_tokenizer_config(ModelTokenizer(tiny_dir).config)
    assert template is not None
    return template


def for_transformers(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What a transformers user passes: dict arguments, no nulls, text parts joined."""
    out = copy.deepcopy(messages)
    for m in out:
        if m.get("role") == "developer":
            m["role"] = "system"
        if isinstance(m.get("content"), list):
            m["content"] = "\n".join(p["text"] for p in m["content"])
        if m.get("content") is None:
            m["content"] = ""
        for call in m.get("tool_calls") or ():
            call["function"]["arguments"] = json.loads(call["function"]["arguments"])
    return out


def assert_same(hf_tok: Any, ours: ChatTemplate, messages: list[dict[str, Any]], *,
                tools: list[dict[str, Any]] | None = None, add_generation_prompt: bool = True,
                continue_final_message: bool = False, **kwargs: Any) -> str:
    expected = hf_tok.apply_chat_template(
        for_transformers(messages), tools=tools, tokenize=False,
        add_generation_prompt=add_generation_prompt,
        continue_final_message=continue_final_message, **kwargs)
    got = ours.render(messages, tools=tools, add_generation_prompt=add_generation_prompt,
                      continue_final_message=continue_final_message,
                      chat_template_kwargs=kwargs or None)
    assert got == expected
    return got


def test_frontend_module_imports_neither_torch_nor_transformers() -> None:
    import subprocess

    code = ("import sys, izh_trio.frontend.chat_template as m; "
            "assert 'torch' not in sys.modules and 'transformers' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_system_and_user(hf_tok: Any, ours: ChatTemplate, add_generation_prompt: bool) -> None:
    text = assert_same(hf_tok, ours, [{"role": "system", "content": "Be brief."},
                                      {"role": "user", "content": "Hi"}],
                       add_generation_prompt=add_generation_prompt)
    assert text.endswith("<|im_start|>assistant\n") == add_generation_prompt


def test_multi_turn(hf_tok: Any, ours: ChatTemplate) -> None:
    assert_same(hf_tok, ours, [
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "4."},
        {"role": "user", "content": "And 3+3?"},
        {"role": "assistant", "content": "<think>\nadd\n</think>\n\n6."},
        {"role": "user", "content": "Thanks"},
    ])


@pytest.mark.parametrize("enable_thinking", [True, False])
def test_enable_thinking(hf_tok: Any, ours: ChatTemplate, enable_thinking: bool) -> None:
    text = assert_same(hf_tok, ours, [{"role": "user", "content": "Hi"}],
                       enable_thinking=enable_thinking)
    assert text.endswith("<think>\n\n</think>\n\n") != enable_thinking


def test_reasoning_content_history(hf_tok: Any, ours: ChatTemplate) -> None:
    messages = [
        {"role": "user", "content": "Pick a number"},
        {"role": "assistant", "content": "7", "reasoning_content": "\nLucky seven.\n"},
    ]
    text = assert_same(hf_tok, ours, messages, add_generation_prompt=False)
    assert "<think>\nLucky seven.\n</think>\n\n7" in text
    assert_same(hf_tok, ours, [*messages, {"role": "user", "content": "Another"}])


def test_tools_list(hf_tok: Any, ours: ChatTemplate) -> None:
    text = assert_same(hf_tok, ours, [{"role": "system", "content": "S"},
                                      {"role": "user", "content": "Weather?"}],
                       tools=[WEATHER, TIME])
    assert "e.g. Zürich" in text and "<HH:MM> & zone" in text  # no \u escapes, no HTML escapes


def test_tool_calls_and_grouped_tool_responses(hf_tok: Any, ours: ChatTemplate) -> None:
    text = assert_same(hf_tok, ours, TOOL_TURN, tools=[WEATHER, TIME])
    assert '"arguments": {"tz": "Europe/Zurich"}' in text  # re-serialised from the string
    assert text.count("<|im_start|>user") == 2  # both tool results share one user turn
    assert_same(hf_tok, ours, [*TOOL_TURN, {"role": "assistant", "content": "21°C, 14:05."},
                               {"role": "user", "content": "Thanks"}], tools=[WEATHER, TIME])


def test_tool_calls_with_content_and_thinking_off(hf_tok: Any, ours: ChatTemplate) -> None:
    messages = copy.deepcopy(TOOL_TURN)
    messages[2]["content"] = "Let me check."
    assert_same(hf_tok, ours, messages, tools=[WEATHER], enable_thinking=False)


def test_text_parts_and_developer_role(hf_tok: Any, ours: ChatTemplate) -> None:
    assert_same(hf_tok, ours, [
        {"role": "developer", "content": [{"type": "text", "text": "Rule one."},
                                          {"type": "text", "text": "Rule two."}]},
        {"role": "user", "content": [{"type": "text", "text": "Hello"}]},
    ])


@pytest.mark.parametrize("content", ["The answer is", "Sure: ", "<think>\nhmm\n</think>\n\nSo"])
def test_continue_final_message(hf_tok: Any, ours: ChatTemplate, content: str) -> None:
    text = assert_same(hf_tok, ours, [{"role": "user", "content": "Go on"},
                                      {"role": "assistant", "content": content}],
                       add_generation_prompt=False, continue_final_message=True)
    assert not text.endswith("<|im_end|>\n")


def test_normalize_messages_shapes() -> None:
    out = normalize_messages([
        {"role": "developer", "content": "d", "name": "ops"},
        {"role": "assistant", "content": None, "reasoning": "r", "refusal": None,
         "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "content": [{"type": "text", "text": "ok"}], "tool_call_id": "c1"},
    ])
    assert out == [
        {"role": "system", "content": "d", "name": "ops"},
        {"role": "assistant", "content": "", "reasoning_content": "r",
         "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": {}}}]},
        {"role": "tool", "content": "ok", "tool_call_id": "c1"},
    ]


def _user(content: Any) -> list[dict[str, Any]]:
    return [{"role": "user", "content": content}]


@pytest.mark.parametrize(("messages", "needle"), [
    (None, "non-empty array"),
    ([], "non-empty array"),
    ({"role": "user", "content": "x"}, "non-empty array"),
    (["hello"], "messages[0]: must be an object"),
    ([{"role": "wizard", "content": "x"}], "'wizard'"),
    ([{"content": "x"}], "role"),
    (_user(42), "messages[0].content: must be a string or an array"),
    (_user(None), "needs content"),
    ([{"role": "user"}], "needs content"),
    ([{"role": "assistant", "content": None}], "needs content"),
    ([{"role": "tool", "tool_call_id": "c"}], "needs content"),
    ([{"role": "system", "content": {"text": "x"}}], "messages[0].content"),
    (_user([{"type": "text", "text": 5}]), "messages[0].content[0].text: must be a string"),
    (_user([{"text": "no type"}]), "'type'"),
    (_user(["bare string"]), "content part must be an object"),
    (_user([{"type": "text", "text": "a"},
            {"type": "image_url", "image_url": {"url": "http://x/y.png"}},
            {"type": "input_audio", "input_audio": {"data": "", "format": "wav"}}]),
     "'image_url', 'input_audio'"),
    (_user([{"type": "file", "file": {}}]), "'file'"),
    (_user([{"type": "refusal", "refusal": "no"}]), "'refusal'"),
    (_user([{"type": "hologram"}]), "'hologram'"),
    ([{"role": "assistant", "content": "", "tool_calls": {"id": "x"}}],
     "tool_calls: must be an array"),
    ([{"role": "assistant", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{oops"}}]}],
     "messages[0].tool_calls[0].function.arguments: is not valid JSON"),
    ([{"role": "assistant", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": "[1, 2]"}}]}],
     "JSON object"),
    ([{"role": "assistant", "tool_calls": [
        {"id": "c", "type": "function", "function": {"arguments": "{}"}}]}], "name"),
    ([{"role": "assistant", "tool_calls": [
        {"id": "c", "type": "retrieval", "function": {"name": "f", "arguments": "{}"}}]}],
     "'retrieval'"),
    ([{"role": "user", "content": "x", "tool_calls": []}], "only assistant"),
    ([{"role": "assistant", "content": "x", "reasoning_content": 3}], "reasoning_content"),
    ([{"role": "tool", "content": "x", "tool_call_id": 7}], "tool_call_id"),
])
def test_bad_messages_are_400(messages: Any, needle: str) -> None:
    with pytest.raises(APIError) as info:
        normalize_messages(messages)
    assert info.value.status == 400
    assert info.value.param == "messages"
    assert needle in info.value.message


@pytest.mark.parametrize(("tools", "needle"), [
    ({"type": "function"}, "tools must be an array"),
    (["get_weather"], "tools[0]: must be an object with type 'function'"),
    ([{"type": "code_interpreter"}], "type 'function'"),
    ([{"type": "function"}], "tools[0].function: must be an object"),
    ([{"type": "function", "function": {"description": "d"}}], "tools[0].function.name"),
    ([{"type": "function", "function": {"name": "f", "parameters": "x"}}], "parameters"),
    ([{"type": "function", "function": {"name": "f", "description": 1}}], "description"),
])
def test_bad_tools_are_400(ours: ChatTemplate, tools: Any, needle: str) -> None:
    with pytest.raises(APIError) as info:
        ours.render(_user("hi"), tools=tools)
    assert info.value.status == 400
    assert info.value.param == "tools"
    assert needle in info.value.message


@pytest.mark.parametrize("kwargs", [{"messages": []}, {"tools": []},
                                    {"add_generation_prompt": False}, ["enable_thinking"]])
def test_template_kwargs_cannot_override(ours: ChatTemplate, kwargs: Any) -> None:
    with pytest.raises(APIError) as info:
        ours.render(_user("hi"), chat_template_kwargs=kwargs)
    assert info.value.status == 400
    assert info.value.param == "chat_template_kwargs"


def test_continue_needs_no_generation_prompt_and_an_assistant_message(ours: ChatTemplate) -> None:
    messages = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
    with pytest.raises(APIError, match="cannot both be true") as info:
        ours.render(messages, add_generation_prompt=True, continue_final_message=True)
    assert info.value.status == 400
    with pytest.raises(APIError, match="assistant message") as info:
        ours.render(_user("a"), add_generation_prompt=False, continue_final_message=True)
    assert info.value.status == 400


def test_raise_exception_is_400() -> None:
    with pytest.raises(APIError) as info:
        ChatTemplate("{{ raise_exception('boom') }}", {}).render(_user("x"))
    assert info.value.status == 400
    assert info.value.message == "chat template error: boom"


@pytest.mark.parametrize("source", [
    "{{ ''.__class__.__mro__ }}",
    "{{ messages[0].content.__class__.__base__.__subclasses__() }}",
    "{{ cycler.__init__.__globals__ }}",
    "{{ messages.append(1) }}",
    "{{ messages[0].content.startswith() }}",
    "{{ undefined_thing.attr }}",
    "{{ messages[0].content + 1 }}",
])
def test_unsafe_or_failing_templates_are_400(source: str) -> None:
    with pytest.raises(APIError, match=r"^chat template error: ") as info:
        ChatTemplate(source, {}).render(_user("x"))
    assert info.value.status == 400


def test_template_that_does_not_compile() -> None:
    with pytest.raises(ValueError, match="does not compile"):
        ChatTemplate("{% for m in messages %}{{ m.content }}", {})


def test_helpers_and_variables() -> None:
    source = ("{{ bos_token }}|{{ eos_token is defined }}|{{ x | tojson }}|"
              "{{ x | tojson(indent=1, sort_keys=true) }}|{{ x | tojson(separators=(',', ':')) }}|"
              "{{ strftime_now('%Y') | length }}|{% for i in [1, 2, 3] %}{% if i == 2 %}"
              "{% break %}{% endif %}{{ i }}{% endfor %}|{{ tools }}|{{ flag }}")
    text = ChatTemplate(source, {"bos_token": "<s>", "eos_token": None}).render(
        _user("x"), chat_template_kwargs={"x": {"b": "é<&>", "a": 1}, "flag": False})
    assert text == ('<s>|False|{"b": "é<&>", "a": 1}|{\n "a": 1,\n "b": "é<&>"\n}|'
                    '{"b":"é<&>","a":1}|4|1|None|False')


def test_from_tokenizer_config_forms() -> None:
    assert ChatTemplate.from_tokenizer_config({}) is None
    named = {"chat_template": [{"name": "tool_use", "template": "T"},
                               {"name": "default", "template": "D{{ eos_token }}"}],
             "eos_token": {"content": "</s>", "__type": "AddedToken"}}
    template = ChatTemplate.from_tokenizer_config(named)
    assert template is not None
    assert template.render(_user("x")) == "D</s>"
    assert ChatTemplate.from_tokenizer_config({"chat_template": [{"name": "rag",
                                                                  "template": "R"}]}) is None
