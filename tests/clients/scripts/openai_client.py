"""The official ``openai`` Python SDK, sync and async, against the server.

Usage: openai_client.py BASE_URL MODEL (see _harness.py for the report).
"""

from __future__ import annotations

import json
from typing import Any

import _harness as h
import openai
from _models import (
    FORCED_MAX_TOKENS,
    FORECAST_QUESTION,
    SEED,
    TEXT_MAX_TOKENS,
    WEATHER_QUESTION,
    Forecast,
    GetTime,
    GetWeather,
    Note,
    arguments,
    finished,
)

BASE_URL, MODEL = h.args()
client = openai.OpenAI(base_url=BASE_URL + "/v1", api_key="unused", max_retries=0,
                       timeout=h.REQUEST_TIMEOUT)

HELLO = [{"role": "user", "content": "Say hello in five words."}]
WEATHER = [{"role": "user", "content": WEATHER_QUESTION}]
FORECAST = [{"role": "user", "content": FORECAST_QUESTION}]
PROMPT = "The capital of France is"


def _tool(name: str, model: type) -> dict[str, Any]:
    """A tool as people write it by hand from a pydantic model (not strict)."""
    return {"type": "function", "function": {"name": name, "description": model.__doc__,
                                             "parameters": model.model_json_schema()}}


TOOLS = [_tool("get_weather", GetWeather), _tool("get_time", GetTime)]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
SAMPLING: dict[str, Any] = {"temperature": 0, "seed": SEED}


def _usage(obs: h.Obs, usage: Any) -> None:
    obs["usage"] = usage
    assert usage is not None, "no usage"
    assert usage.prompt_tokens > 0 and usage.completion_tokens > 0, usage
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens, usage


def _check_calls(obs: h.Obs, message: Any, schemas: dict[str, Any] = SCHEMAS) -> list[Any]:
    calls = message.tool_calls or []
    obs["tool_calls"] = [(c.function.name, c.function.arguments) for c in calls]
    obs["content"] = message.content
    assert calls, f"no tool call parsed; content {message.content!r}"
    for call in calls:
        assert call.type == "function" and call.id, call
        assert call.function.name in schemas, f"unknown function {call.function.name!r}"
        arguments(call.function.arguments, schemas[call.function.name])
    return calls


def _chat(**kw: Any) -> Any:
    return client.chat.completions.create(model=MODEL, **{**SAMPLING, **kw})


def _streamed_chat(**kw: Any) -> tuple[str, list[dict[str, Any]], str | None, Any]:
    """Content, tool calls rebuilt from their deltas, finish reason and usage of a stream."""
    text, calls, finish, usage = [], {}, None, None
    with client.chat.completions.create(model=MODEL, stream=True,
                                        stream_options={"include_usage": True},
                                        **{**SAMPLING, **kw}) as stream:
        for chunk in stream:
            usage = chunk.usage or usage
            for choice in chunk.choices:
                text.append(choice.delta.content or "")
                for d in choice.delta.tool_calls or []:
                    call = calls.setdefault(d.index, {"id": None, "name": "", "arguments": ""})
                    call["id"] = d.id or call["id"]
                    if d.function is not None:
                        call["name"] += d.function.name or ""
                        call["arguments"] += d.function.arguments or ""
                finish = choice.finish_reason or finish
    return "".join(text), [calls[i] for i in sorted(calls)], finish, usage


def case_models_list(obs: h.Obs) -> None:
    ids = [m.id for m in client.models.list()]
    obs["ids"] = ids
    assert MODEL in ids


def case_chat(obs: h.Obs) -> None:
    out = _chat(messages=HELLO, max_tokens=TEXT_MAX_TOKENS)
    choice = out.choices[0]
    obs.update(content=choice.message.content, finish=choice.finish_reason, model=out.model)
    assert out.model == MODEL and out.object == "chat.completion"
    assert isinstance(choice.message.content, str) and choice.message.role == "assistant"
    assert choice.finish_reason in ("stop", "length")
    _usage(obs, out.usage)


def case_chat_stream_equals_plain(obs: h.Obs) -> None:
    plain = _chat(messages=HELLO, max_tokens=TEXT_MAX_TOKENS)
    text, calls, finish, usage = _streamed_chat(messages=HELLO, max_tokens=TEXT_MAX_TOKENS)
    obs.update(plain=plain.choices[0].message.content, streamed=text, finish=finish)
    assert text == plain.choices[0].message.content
    assert not calls and finish == plain.choices[0].finish_reason
    _usage(obs, usage)
    assert usage.completion_tokens == plain.usage.completion_tokens


def case_completions(obs: h.Obs) -> None:
    out = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=TEXT_MAX_TOKENS,
                                    **SAMPLING)
    obs.update(text=out.choices[0].text, finish=out.choices[0].finish_reason)
    assert out.object == "text_completion" and isinstance(out.choices[0].text, str)
    assert out.choices[0].finish_reason in ("stop", "length")
    _usage(obs, out.usage)


def case_completions_stream_equals_plain(obs: h.Obs) -> None:
    plain = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=TEXT_MAX_TOKENS,
                                      **SAMPLING)
    text, finish, usage = [], None, None
    with client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=TEXT_MAX_TOKENS,
                                   stream=True, stream_options={"include_usage": True},
                                   **SAMPLING) as stream:
        for chunk in stream:
            usage = chunk.usage or usage
            for choice in chunk.choices:
                text.append(choice.text)
                finish = choice.finish_reason or finish
    obs.update(plain=plain.choices[0].text, streamed="".join(text), finish=finish)
    assert "".join(text) == plain.choices[0].text
    assert finish == plain.choices[0].finish_reason
    _usage(obs, usage)


def case_explicit_nulls(obs: h.Obs) -> None:
    # Wrappers pass their unset settings through as None; the SDK sends them as JSON null,
    # which OpenAI's API takes as "not given" for every nullable field.
    out = client.chat.completions.create(
        model=MODEL, messages=HELLO, max_tokens=TEXT_MAX_TOKENS, temperature=0, seed=None,
        n=None, stop=None, top_p=None, presence_penalty=None, frequency_penalty=None,
        logit_bias=None, logprobs=None, top_logprobs=None, user=None, tools=None,
        tool_choice=None, parallel_tool_calls=None, response_format=None, stream=None,
        stream_options=None, max_completion_tokens=None, service_tier=None, store=None,
        metadata=None, reasoning_effort=None, modalities=None, prediction=None, audio=None)
    obs.update(content=out.choices[0].message.content)
    _usage(obs, out.usage)


def case_tools_auto(obs: h.Obs) -> None:
    out = _chat(messages=WEATHER, tools=TOOLS, tool_choice="auto", max_tokens=FORCED_MAX_TOKENS)
    choice = out.choices[0]
    obs.update(finish=choice.finish_reason, content=choice.message.content)
    # The model may answer or call; what it returns must be well-formed either way.
    if choice.message.tool_calls:
        _check_calls(obs, choice.message)
    assert choice.finish_reason in ("stop", "length", "tool_calls")
    if choice.finish_reason == "tool_calls":
        assert choice.message.tool_calls, "finish_reason tool_calls without a call"
    _usage(obs, out.usage)


def case_tools_required(obs: h.Obs) -> None:
    out = _chat(messages=WEATHER, tools=TOOLS, tool_choice="required",
                max_tokens=FORCED_MAX_TOKENS)
    choice = out.choices[0]
    obs["finish"] = choice.finish_reason
    _check_calls(obs, choice.message)
    finished(choice.finish_reason, "tool_calls")
    assert not (choice.message.content or "").strip(), choice.message.content
    _usage(obs, out.usage)


def case_tools_named(obs: h.Obs) -> None:
    out = _chat(messages=WEATHER, tools=TOOLS, max_tokens=FORCED_MAX_TOKENS,
                tool_choice={"type": "function", "function": {"name": "get_time"}})
    choice = out.choices[0]
    obs["finish"] = choice.finish_reason
    calls = _check_calls(obs, choice.message)
    assert {c.function.name for c in calls} == {"get_time"}
    finished(choice.finish_reason, "tool_calls", "stop")
    _usage(obs, out.usage)


def case_tools_required_stream_equals_plain(obs: h.Obs) -> None:
    kw = {"messages": WEATHER, "tools": TOOLS, "tool_choice": "required",
          "parallel_tool_calls": False, "max_tokens": FORCED_MAX_TOKENS}
    plain = _chat(**kw)
    text, calls, finish, usage = _streamed_chat(**kw)
    obs.update(streamed_calls=calls, streamed_content=text, finish=finish)
    plain_calls = _check_calls(obs, plain.choices[0].message)
    finished(finish, "tool_calls")
    assert [(c["name"], c["arguments"]) for c in calls] == [
        (c.function.name, c.function.arguments) for c in plain_calls]
    assert all(c["id"] for c in calls), calls
    _usage(obs, usage)


def case_tools_strict_parse(obs: h.Obs) -> None:
    # pydantic_function_tool: the SDK's strict schema ($defs, additionalProperties false),
    # parsed back into the model by the SDK itself.
    out = client.chat.completions.parse(
        model=MODEL, messages=WEATHER, tools=[openai.pydantic_function_tool(GetWeather)],
        tool_choice="required", max_tokens=FORCED_MAX_TOKENS, **SAMPLING)
    message = out.choices[0].message
    obs.update(finish=out.choices[0].finish_reason, content=message.content,
               tool_calls=[(c.function.name, c.function.arguments)
                           for c in message.tool_calls or []])
    assert message.tool_calls, "no tool call"
    assert isinstance(message.tool_calls[0].function.parsed_arguments, GetWeather)
    finished(out.choices[0].finish_reason, "tool_calls")


def case_tool_result_round_trip(obs: h.Obs) -> None:
    first = _chat(messages=WEATHER, tools=TOOLS, max_tokens=FORCED_MAX_TOKENS,
                  tool_choice={"type": "function", "function": {"name": "get_weather"}})
    call = _check_calls(obs, first.choices[0].message)[0]
    history = [*WEATHER, first.choices[0].message.model_dump(exclude_none=True),
               {"role": "tool", "tool_call_id": call.id, "content": '{"celsius": 21}'}]
    out = _chat(messages=history, tools=TOOLS, max_tokens=TEXT_MAX_TOKENS)
    obs.update(second=out.choices[0].message.content, finish=out.choices[0].finish_reason)
    assert out.choices[0].finish_reason in ("stop", "length", "tool_calls")
    _usage(obs, out.usage)


def case_parse_response_format(obs: h.Obs) -> None:
    out = client.chat.completions.parse(model=MODEL, messages=FORECAST, response_format=Forecast,
                                        max_tokens=FORCED_MAX_TOKENS, **SAMPLING)
    message = out.choices[0].message
    obs.update(content=message.content, finish=out.choices[0].finish_reason)
    finished(out.choices[0].finish_reason, "stop")
    assert isinstance(message.parsed, Forecast)


def case_json_schema_not_strict(obs: h.Obs) -> None:
    schema = Forecast.model_json_schema()
    out = _chat(messages=FORECAST, max_tokens=FORCED_MAX_TOKENS, response_format={
        "type": "json_schema", "json_schema": {"name": "forecast", "schema": schema}})
    obs.update(content=out.choices[0].message.content, finish=out.choices[0].finish_reason)
    finished(out.choices[0].finish_reason, "stop")
    arguments(out.choices[0].message.content, schema)


def case_json_object(obs: h.Obs) -> None:
    out = _chat(messages=FORECAST, max_tokens=FORCED_MAX_TOKENS,
                response_format={"type": "json_object"})
    obs.update(content=out.choices[0].message.content, finish=out.choices[0].finish_reason)
    finished(out.choices[0].finish_reason, "stop")
    Note.model_validate(json.loads(out.choices[0].message.content))


def case_parse_stream(obs: h.Obs) -> None:
    with client.chat.completions.stream(model=MODEL, messages=FORECAST, response_format=Forecast,
                                        max_tokens=FORCED_MAX_TOKENS, **SAMPLING) as stream:
        for _event in stream:
            pass
        final = stream.get_final_completion()
    obs.update(content=final.choices[0].message.content, finish=final.choices[0].finish_reason)
    finished(final.choices[0].finish_reason, "stop")
    assert isinstance(final.choices[0].message.parsed, Forecast)


def case_legacy_functions(obs: h.Obs) -> None:
    # The deprecated spelling some older clients still send: it must be honoured (a
    # function_call comes back), not silently dropped.
    fn = {"name": "get_weather", "description": GetWeather.__doc__,
          "parameters": GetWeather.model_json_schema()}
    out = _chat(messages=WEATHER, functions=[fn], function_call={"name": "get_weather"},
                max_tokens=FORCED_MAX_TOKENS)
    message = out.choices[0].message
    obs.update(content=message.content, function_call=message.function_call,
               tool_calls=message.tool_calls, finish=out.choices[0].finish_reason)
    assert message.function_call is not None, "no function_call in the answer"
    assert message.function_call.name == "get_weather"
    arguments(message.function_call.arguments, fn["parameters"])
    finished(out.choices[0].finish_reason, "function_call", "stop")


def case_reasoning_effort(obs: h.Obs) -> None:
    # Qwen3 thinks or it does not: "none" must reach the template (an empty think block in
    # the prompt), and the other efforts must be accepted.
    base = _chat(messages=HELLO, max_tokens=TEXT_MAX_TOKENS)
    off = _chat(messages=HELLO, max_tokens=TEXT_MAX_TOKENS, reasoning_effort="none")
    high = _chat(messages=HELLO, max_tokens=TEXT_MAX_TOKENS, reasoning_effort="high")
    obs.update(prompt_tokens={"default": base.usage.prompt_tokens,
                              "none": off.usage.prompt_tokens, "high": high.usage.prompt_tokens})
    assert off.usage.prompt_tokens != base.usage.prompt_tokens, "reasoning_effort was ignored"


def case_unknown_model_is_not_found(obs: h.Obs) -> None:
    try:
        client.chat.completions.create(model="no-such-model", messages=HELLO, max_tokens=4)
    except openai.NotFoundError as exc:
        obs.update(status=exc.status_code, body=exc.body)
    else:
        raise AssertionError("no error for an unknown model")


def case_bad_request(obs: h.Obs) -> None:
    try:
        _chat(messages=HELLO, max_tokens=4, temperature=5)
    except openai.BadRequestError as exc:
        obs.update(status=exc.status_code, body=exc.body)
        assert "temperature" in str(exc), str(exc)
    else:
        raise AssertionError("temperature 5 was accepted")


async def case_async_chat_and_stream(obs: h.Obs) -> None:
    aclient = openai.AsyncOpenAI(base_url=BASE_URL + "/v1", api_key="unused", max_retries=0,
                                 timeout=h.REQUEST_TIMEOUT)
    async with aclient:
        plain = await aclient.chat.completions.create(model=MODEL, messages=HELLO,
                                                      max_tokens=TEXT_MAX_TOKENS, **SAMPLING)
        text, usage = [], None
        stream = await aclient.chat.completions.create(
            model=MODEL, messages=HELLO, max_tokens=TEXT_MAX_TOKENS, stream=True,
            stream_options={"include_usage": True}, **SAMPLING)
        async for chunk in stream:
            usage = chunk.usage or usage
            text.extend(c.delta.content or "" for c in chunk.choices)
    obs.update(plain=plain.choices[0].message.content, streamed="".join(text))
    assert "".join(text) == plain.choices[0].message.content
    _usage(obs, plain.usage)
    _usage(obs, usage)


async def case_async_completions(obs: h.Obs) -> None:
    async with openai.AsyncOpenAI(base_url=BASE_URL + "/v1", api_key="unused", max_retries=0,
                                  timeout=h.REQUEST_TIMEOUT) as aclient:
        out = await aclient.completions.create(model=MODEL, prompt=PROMPT,
                                               max_tokens=TEXT_MAX_TOKENS, **SAMPLING)
    obs.update(text=out.choices[0].text)
    assert isinstance(out.choices[0].text, str)
    _usage(obs, out.usage)


async def case_async_tools_named_strict(obs: h.Obs) -> None:
    async with openai.AsyncOpenAI(base_url=BASE_URL + "/v1", api_key="unused", max_retries=0,
                                  timeout=h.REQUEST_TIMEOUT) as aclient:
        out = await aclient.chat.completions.parse(
            model=MODEL, messages=WEATHER, max_tokens=FORCED_MAX_TOKENS, **SAMPLING,
            tools=[openai.pydantic_function_tool(GetWeather, name="get_weather"),
                   openai.pydantic_function_tool(GetTime, name="get_time")],
            tool_choice={"type": "function", "function": {"name": "get_weather"}})
    message = out.choices[0].message
    obs.update(finish=out.choices[0].finish_reason, content=message.content,
               tool_calls=[(c.function.name, c.function.arguments)
                           for c in message.tool_calls or []])
    assert message.tool_calls, "no tool call"
    assert [c.function.name for c in message.tool_calls] == ["get_weather"]
    assert isinstance(message.tool_calls[0].function.parsed_arguments, GetWeather)
    finished(out.choices[0].finish_reason, "tool_calls", "stop")


async def case_async_parse_response_format(obs: h.Obs) -> None:
    async with openai.AsyncOpenAI(base_url=BASE_URL + "/v1", api_key="unused", max_retries=0,
                                  timeout=h.REQUEST_TIMEOUT) as aclient:
        out = await aclient.chat.completions.parse(
            model=MODEL, messages=FORECAST, response_format=Forecast,
            max_tokens=FORCED_MAX_TOKENS, **SAMPLING)
    obs.update(content=out.choices[0].message.content, finish=out.choices[0].finish_reason)
    finished(out.choices[0].finish_reason, "stop")
    assert isinstance(out.choices[0].message.parsed, Forecast)


if __name__ == "__main__":
    h.run_cases(globals(), ["openai", "pydantic"])
