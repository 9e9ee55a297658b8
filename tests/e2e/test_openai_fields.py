"""OpenAI's request fields as real clients send them: null for "unset", the legacy function
calling, reasoning_effort, prompt_cache_key, informational and refused fields; and the
response's system_fingerprint and message shape. Against the real server and engine.
"""

from __future__ import annotations

import json
import re

import httpx
import jsonschema
import openai
import pytest

MODEL = "qwen3-test"
HI = [{"role": "user", "content": "What time is it?"}]
# Seeded and eos-free: two requests that mean the same give the same text.
SAME = {"max_tokens": 4, "seed": 7, "ignore_eos": True}
TZ = {"type": "object", "properties": {"tz": {"enum": ["UTC", "CET"]}}, "required": ["tz"],
      "additionalProperties": False}
GET_TIME = {"name": "get_time", "description": "The time in a zone.", "parameters": TZ}
FP = re.compile(r"fp_[0-9a-f]{10}")


@pytest.fixture(scope="module")
def client(server: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=server + "/v1", api_key="unused", max_retries=0)


def post(server: str, route: str, body: dict) -> httpx.Response:
    return httpx.post(f"{server}/v1/{route}", json=body, timeout=120)


def text_of(route: str, out: dict) -> str:
    choice = out["choices"][0]
    return choice["text"] if route == "completions" else choice["message"]["content"]


def events(server: str, route: str, body: dict) -> list[dict]:
    with httpx.stream("POST", f"{server}/v1/{route}", json={**body, "stream": True},
                      timeout=120) as r:
        assert r.status_code == 200, r.read()
        datas = [line[len("data: "):] for line in r.iter_lines() if line]
    assert datas[-1] == "[DONE]"
    return [json.loads(d) for d in datas[:-1]]


# --- null is the default --------------------------------------------------------------------

SHARED_NULLS = ["n", "stream", "logprobs", "presence_penalty", "frequency_penalty", "stop",
                "temperature", "top_p", "logit_bias", "stream_options", "user", "seed",
                "prompt_cache_key", "cache_salt", "top_k", "min_p", "repetition_penalty",
                "min_tokens", "stop_token_ids", "include_stop_str_in_output",
                "skip_special_tokens", "priority", "response_format", "ignore_eos"]
CHAT_NULLS = ["top_logprobs", "parallel_tool_calls", "max_completion_tokens", "tools",
              "tool_choice", "functions", "function_call", "reasoning_effort", "service_tier",
              "metadata", "store", "safety_identifier", "verbosity", "modalities", "audio",
              "prediction", "web_search_options", "chat_template_kwargs",
              "add_generation_prompt", "continue_final_message"]
COMPLETION_NULLS = ["echo", "best_of", "suffix", "prompt_logprobs"]


def base(route: str) -> dict:
    return {"prompt": "Once upon a time"} if route == "completions" else {"messages": HI}


@pytest.fixture(scope="module")
def expected(server: str) -> dict[str, str]:
    """Each route's text for SAME with nothing else set."""
    return {route: text_of(route, post(server, route, {**base(route), **SAME}).json())
            for route in ("completions", "chat/completions")}


@pytest.mark.parametrize(("route", "field"), [
    *[("completions", f) for f in SHARED_NULLS + COMPLETION_NULLS],
    *[("chat/completions", f) for f in SHARED_NULLS + CHAT_NULLS],
])
def test_null_is_the_default(server: str, expected: dict[str, str], route: str,
                             field: str) -> None:
    r = post(server, route, {**base(route), **SAME, field: None})
    assert r.status_code == 200, r.text
    out = r.json()
    assert len(out["choices"]) == 1
    if field not in ("seed", "ignore_eos"):  # without them the text is free to differ
        assert text_of(route, out) == expected[route]
        assert out["usage"]["completion_tokens"] == 4


@pytest.mark.parametrize("route", ["completions", "chat/completions"])
def test_null_stream_options_members_are_their_defaults(server: str, route: str) -> None:
    chunks = events(server, route, {**base(route), **SAME, "stream_options": {
        "include_usage": True, "continuous_usage_stats": None}})
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 4
    assert all(c["usage"] is None for c in chunks[:-1])  # continuous_usage_stats: off
    chunks = events(server, route, {**base(route), **SAME, "stream_options": {
        "include_usage": None, "continuous_usage_stats": None}})
    assert chunks[-1]["choices"] and all(c.get("usage") is None for c in chunks)


def test_the_sdk_sends_none_as_null_and_gets_the_defaults(server: str,
                                                          expected: dict[str, str]) -> None:
    sent: list[dict] = []
    capture = httpx.Client(event_hooks={"request": [lambda r: sent.append(json.loads(
        r.read()))]})
    client = openai.OpenAI(base_url=server + "/v1", api_key="unused", max_retries=0,
                           http_client=capture)
    out = client.chat.completions.create(
        model=MODEL, messages=HI, max_tokens=4, seed=7, extra_body={"ignore_eos": True},
        n=None, stream=None, logprobs=None, top_logprobs=None, presence_penalty=None,
        frequency_penalty=None, parallel_tool_calls=None, stop=None, temperature=None,
        top_p=None, stream_options=None, logit_bias=None, max_completion_tokens=None,
        reasoning_effort=None, service_tier=None, metadata=None, store=None,
        prompt_cache_key=None, safety_identifier=None, verbosity=None, modalities=None,
        audio=None, prediction=None)
    assert out.choices[0].message.content == expected["chat/completions"]
    done = client.completions.create(
        model=MODEL, prompt="Once upon a time", max_tokens=4, seed=7,
        extra_body={"ignore_eos": True}, n=None, stream=None, echo=None, logprobs=None,
        best_of=None, presence_penalty=None, frequency_penalty=None, stop=None,
        temperature=None, top_p=None, suffix=None, stream_options=None, logit_bias=None)
    assert done.choices[0].text == expected["completions"]
    assert sent[0]["n"] is None and sent[0]["reasoning_effort"] is None  # nulls went out
    assert sent[1]["echo"] is None and sent[1]["stream_options"] is None


@pytest.mark.parametrize(("route", "field"), [("completions", "prompt"),
                                              ("chat/completions", "messages")])
def test_a_required_field_given_as_null_is_a_400_naming_it(server: str, route: str,
                                                           field: str) -> None:
    r = post(server, route, {**base(route), field: None, "max_tokens": 1})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == field


# --- fields accepted, honoured or refused ---------------------------------------------------

@pytest.mark.parametrize(("body", "param"), [
    ({"audio": {"voice": "alloy", "format": "wav"}, "modalities": ["text"]}, "audio"),
    ({"modalities": ["text", "audio"]}, "modalities"),
    ({"modalities": ["image"]}, "modalities"),
    ({"modalities": "text"}, "modalities"),
    ({"web_search_options": {"search_context_size": "low"}}, "web_search_options"),
    ({"prediction": {"type": "content", "content": "It is noon."}}, "prediction"),
    ({"reasoning_effort": "extreme"}, "reasoning_effort"),
    ({"verbosity": "loud"}, "verbosity"),
    ({"metadata": {"k": 1}}, "metadata"),
    ({"metadata": ["k"]}, "metadata"),
    ({"store": "yes"}, "store"),
    ({"service_tier": 1}, "service_tier"),
    ({"safety_identifier": 1}, "safety_identifier"),
    ({"user": 1}, "user"),
    ({"prompt_cache_key": 5}, "prompt_cache_key"),
    ({"prompt_cache_key": "a", "cache_salt": "b"}, "prompt_cache_key"),
    ({"functions": [GET_TIME], "tools": [{"type": "function", "function": GET_TIME}]},
     "functions"),
    ({"functions": [GET_TIME], "tool_choice": "auto"}, "functions"),
    ({"function_call": "auto", "tools": [{"type": "function", "function": GET_TIME}]},
     "function_call"),
    ({"functions": [GET_TIME], "function_call": {"name": "get_weather"}}, "function_call"),
    ({"functions": [GET_TIME], "function_call": "required"}, "function_call"),
    ({"function_call": {"name": "get_time"}}, "function_call"),
    ({"functions": {"get_time": GET_TIME}}, "functions"),
    ({"functions": [{"name": "", "parameters": TZ}]}, "functions"),
    ({"functions": [{"name": "f", "parameters": "TZ"}]}, "functions"),
])
def test_fields_that_cannot_be_honoured_are_a_400_naming_them(client: openai.OpenAI,
                                                              body: dict, param: str) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=MODEL, messages=HI, max_tokens=1,
                                       extra_body=body)
    assert err.value.param == param, err.value.message


def test_informational_fields_change_nothing(client: openai.OpenAI,
                                             expected: dict[str, str]) -> None:
    out = client.chat.completions.create(
        model=MODEL, messages=HI, max_tokens=4, seed=7, extra_body={"ignore_eos": True},
        service_tier="auto", user="u-1", metadata={"team": "a"}, store=True,
        safety_identifier="hashed-user", verbosity="low", modalities=["text"])
    assert out.choices[0].message.content == expected["chat/completions"]
    done = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=4,
                                     seed=7, extra_body={"ignore_eos": True}, user="u-1")
    assert done.choices[0].text == expected["completions"]


def _prompt_tokens(client: openai.OpenAI, **kwargs: object) -> int:
    out = client.chat.completions.create(model=MODEL, messages=HI, max_tokens=1, **kwargs)
    return out.usage.prompt_tokens


def test_reasoning_effort_switches_the_templates_thinking(client: openai.OpenAI) -> None:
    thinking = _prompt_tokens(client)
    off = _prompt_tokens(client, extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    assert off > thinking  # the empty <think></think> block
    for effort in ("none", "minimal"):
        assert _prompt_tokens(client, reasoning_effort=effort) == off, effort
    for effort in ("low", "medium", "high"):
        assert _prompt_tokens(client, reasoning_effort=effort) == thinking, effort
    # An explicit enable_thinking is the more specific request, and wins.
    assert _prompt_tokens(client, reasoning_effort="none", extra_body={
        "chat_template_kwargs": {"enable_thinking": True}}) == thinking
    assert _prompt_tokens(client, reasoning_effort="high", extra_body={
        "chat_template_kwargs": {"enable_thinking": False}}) == off


def test_reasoning_effort_none_renders_what_enable_thinking_false_does(server: str) -> None:
    """The same prompt, not only as many tokens: the same greedy answer token by token."""
    body = {"messages": HI, "max_tokens": 6, "temperature": 0, "ignore_eos": True,
            "logprobs": True}
    effort = post(server, "chat/completions", {**body, "reasoning_effort": "none"}).json()
    kwargs = post(server, "chat/completions", {**body, "chat_template_kwargs": {
        "enable_thinking": False}}).json()
    lps = [[e["logprob"] for e in out["choices"][0]["logprobs"]["content"]]
           for out in (effort, kwargs)]
    assert lps[0] == pytest.approx(lps[1], abs=1e-4)
    assert effort["usage"] == kwargs["usage"]


@pytest.mark.parametrize("route", ["completions", "chat/completions"])
def test_prompt_cache_key_partitions_the_prefix_cache_like_cache_salt(server: str,
                                                                      route: str) -> None:
    if route == "completions":
        body = {"prompt": list(range(1000, 1600)), "max_tokens": 1}
    else:
        words = " ".join(f"w{i}" for i in range(300))
        body = {"messages": [{"role": "user", "content": words}], "max_tokens": 1}

    def cached(**extra: str) -> tuple[int, int]:
        usage = post(server, route, {**body, **extra}).json()["usage"]
        return usage["prompt_tokens_details"]["cached_tokens"], usage["prompt_tokens"]

    first, n = cached(prompt_cache_key="tenant-a")
    assert first == 0 and n > 200
    full = (n - 1) // 16 * 16
    assert cached(prompt_cache_key="tenant-a") == (full, n)
    assert cached(prompt_cache_key="tenant-b") == (0, n)  # another key: nothing shared
    assert cached(cache_salt="tenant-a") == (full, n)  # the same partition by either name
    assert cached(cache_salt="tenant-a", prompt_cache_key="tenant-a") == (full, n)
    assert cached() == (0, n)  # nor with requests that give no key


# --- the legacy function calling -------------------------------------------------------------

def test_a_named_function_call_is_forced_and_answered_in_the_legacy_shape(
        client: openai.OpenAI, server: str) -> None:
    for seed in range(4):
        out = client.chat.completions.create(
            model=MODEL, messages=HI, functions=[GET_TIME], function_call={"name": "get_time"},
            temperature=1.0, seed=seed, max_tokens=200)
        choice = out.choices[0]
        assert choice.finish_reason == "function_call"
        assert choice.message.content is None and choice.message.tool_calls is None
        assert choice.message.function_call.name == "get_time"
        jsonschema.validate(json.loads(choice.message.function_call.arguments), TZ)
        raw = post(server, "chat/completions", {
            "messages": HI, "functions": [GET_TIME], "function_call": {"name": "get_time"},
            "temperature": 1.0, "seed": seed, "max_tokens": 200}).json()
        message = raw["choices"][0]["message"]
        assert "tool_calls" not in message  # OpenAI's legacy shape has no tool_calls key
        assert message["function_call"] == choice.message.function_call.model_dump()


def test_a_streamed_function_call_reassembles_to_the_plain_one(client: openai.OpenAI) -> None:
    kwargs = dict(model=MODEL, messages=HI, functions=[GET_TIME],
                  function_call={"name": "get_time"}, temperature=1.0, seed=3, max_tokens=200)
    whole = client.chat.completions.create(**kwargs).choices[0]
    name, arguments, finish = "", "", None
    for chunk in client.chat.completions.create(**kwargs, stream=True):
        for c in chunk.choices:
            assert not c.delta.content and not c.delta.tool_calls
            finish = c.finish_reason or finish
            if c.delta.function_call is not None:
                name += c.delta.function_call.name or ""
                arguments += c.delta.function_call.arguments or ""
    assert finish == whole.finish_reason == "function_call"
    assert (name, arguments) == (whole.message.function_call.name,
                                 whole.message.function_call.arguments)


def test_functions_are_the_tools_to_the_template(client: openai.OpenAI) -> None:
    """functions and function_call "auto"/"none" render exactly what tools and tool_choice do,
    and so does a legacy conversation (function_call message, function role) its tools form."""
    tools = [{"type": "function", "function": GET_TIME}]
    assert _prompt_tokens(client, functions=[GET_TIME]) \
        == _prompt_tokens(client, tools=tools) \
        == _prompt_tokens(client, functions=[GET_TIME], function_call="auto")
    assert _prompt_tokens(client, functions=[GET_TIME], function_call="none") \
        == _prompt_tokens(client)
    legacy = [*HI, {"role": "assistant", "content": None,
                    "function_call": {"name": "get_time", "arguments": '{"tz": "UTC"}'}},
              {"role": "function", "name": "get_time", "content": "12:00"}]
    current = [*HI, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function",
         "function": {"name": "get_time", "arguments": '{"tz": "UTC"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "12:00"}]
    out = [client.chat.completions.create(model=MODEL, messages=messages, max_tokens=1,
                                          **spelling)
           for messages, spelling in ((legacy, {"functions": [GET_TIME]}),
                                      (current, {"tools": tools}))]
    assert out[0].usage.prompt_tokens == out[1].usage.prompt_tokens
    assert out[0].choices[0].finish_reason in ("length", "stop", "function_call")


# --- the response's shape --------------------------------------------------------------------

def test_system_fingerprint_is_one_value_in_every_response_and_chunk(server: str) -> None:
    seen = set()
    for route in ("completions", "chat/completions"):
        body = {**base(route), **SAME, "n": 2}
        seen.add(post(server, route, body).json()["system_fingerprint"])
        chunks = events(server, route, {**body, "stream_options": {"include_usage": True}})
        # Deltas may coalesce when the client reads slowly: count content chunks, not tokens.
        assert any(c["choices"] for c in chunks[:-1])
        assert chunks[-1]["choices"] == []  # the usage chunk has it too
        seen.update(c["system_fingerprint"] for c in chunks)
    assert len(seen) == 1 and FP.fullmatch(seen.pop())


def test_a_message_without_calls_has_no_tool_calls_key(client: openai.OpenAI,
                                                       server: str) -> None:
    tools = [{"type": "function", "function": GET_TIME}]
    for extra in ({}, {"tools": tools, "tool_choice": "none"}):
        out = post(server, "chat/completions", {"messages": HI, **SAME, **extra}).json()
        assert "tool_calls" not in out["choices"][0]["message"]
        assert "function_call" not in out["choices"][0]["message"]
    forced = client.chat.completions.create(model=MODEL, messages=HI, tools=tools,
                                            tool_choice="required", max_tokens=200, seed=1,
                                            temperature=1.0)
    assert forced.choices[0].message.tool_calls and forced.choices[0].finish_reason \
        == "tool_calls"
    assert forced.system_fingerprint and FP.fullmatch(forced.system_fingerprint)
