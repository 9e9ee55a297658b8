"""LiteLLM against the server, through both of its routes to an OpenAI-compatible server: the
``openai/`` provider (the openai SDK underneath) and ``hosted_vllm/`` (LiteLLM's own HTTP
handler and vLLM parameter mapping). Usage: litellm_client.py BASE_URL MODEL.
"""

from __future__ import annotations

import json
from typing import Any

import _harness as h
import litellm
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
litellm.telemetry = False
litellm.suppress_debug_info = True  # its "Give Feedback" banner on every error
litellm.num_retries = 0

HELLO = [{"role": "user", "content": "Say hello in five words."}]
WEATHER = [{"role": "user", "content": WEATHER_QUESTION}]
FORECAST = [{"role": "user", "content": FORECAST_QUESTION}]
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": GetWeather.__doc__,
                                      "parameters": GetWeather.model_json_schema()}},
    openai.pydantic_function_tool(GetTime, name="get_time"),  # a strict one beside it
]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}


def _kw(provider: str, **kw: Any) -> dict[str, Any]:
    return {"model": f"{provider}/{MODEL}", "api_base": BASE_URL + "/v1", "api_key": "unused",
            "timeout": h.REQUEST_TIMEOUT, "num_retries": 0, "temperature": 0, "seed": SEED,
            "max_tokens": TEXT_MAX_TOKENS, **kw}


def _usage(obs: h.Obs, usage: Any) -> None:
    obs["usage"] = usage
    assert usage is not None, "no usage"
    assert usage.prompt_tokens > 0 and usage.completion_tokens > 0, usage
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens, usage


def _check_calls(obs: h.Obs, message: Any) -> list[Any]:
    calls = message.tool_calls or []
    obs.update(tool_calls=[(c.function.name, c.function.arguments) for c in calls],
               content=message.content)
    assert calls, f"no tool call parsed; content {message.content!r}"
    for call in calls:
        assert call.id and call.function.name in SCHEMAS, call
        arguments(call.function.arguments, SCHEMAS[call.function.name])
    return calls


def _completion(obs: h.Obs, provider: str) -> None:
    out = litellm.completion(**_kw(provider, messages=HELLO))
    choice = out.choices[0]
    obs.update(content=choice.message.content, finish=choice.finish_reason)
    assert isinstance(choice.message.content, str)
    assert choice.finish_reason in ("stop", "length")
    _usage(obs, out.usage)


def _stream_equals_completion(obs: h.Obs, provider: str) -> None:
    plain = litellm.completion(**_kw(provider, messages=HELLO))
    chunks = list(litellm.completion(**_kw(provider, messages=HELLO, stream=True,
                                           stream_options={"include_usage": True})))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    rebuilt = litellm.stream_chunk_builder(chunks, messages=HELLO)
    obs.update(plain=plain.choices[0].message.content, streamed=text,
               finish=rebuilt.choices[0].finish_reason)
    assert text == plain.choices[0].message.content
    assert rebuilt.choices[0].finish_reason == plain.choices[0].finish_reason
    _usage(obs, rebuilt.usage)
    assert rebuilt.usage.completion_tokens == plain.usage.completion_tokens


def _tools(obs: h.Obs, provider: str, tool_choice: Any) -> None:
    out = litellm.completion(**_kw(provider, messages=WEATHER, tools=TOOLS,
                                   tool_choice=tool_choice, max_tokens=FORCED_MAX_TOKENS))
    choice = out.choices[0]
    obs["finish"] = choice.finish_reason
    if tool_choice == "auto":  # the model may call or answer
        if choice.message.tool_calls:
            _check_calls(obs, choice.message)
        assert choice.finish_reason in ("stop", "length", "tool_calls")
        return
    calls = _check_calls(obs, choice.message)
    if isinstance(tool_choice, dict):
        assert {c.function.name for c in calls} == {tool_choice["function"]["name"]}
        finished(choice.finish_reason, "tool_calls", "stop")
    else:
        finished(choice.finish_reason, "tool_calls")
    _usage(obs, out.usage)


def _tools_stream(obs: h.Obs, provider: str) -> None:
    kw = _kw(provider, messages=WEATHER, tools=TOOLS, tool_choice="required",
             parallel_tool_calls=False, max_tokens=FORCED_MAX_TOKENS)
    plain = litellm.completion(**kw)
    chunks = list(litellm.completion(**kw, stream=True, stream_options={"include_usage": True}))
    rebuilt = litellm.stream_chunk_builder(chunks, messages=WEATHER)
    obs["plain_calls"] = [(c.function.name, c.function.arguments)
                          for c in plain.choices[0].message.tool_calls or []]
    calls = _check_calls(obs, rebuilt.choices[0].message)
    assert [(c.function.name, c.function.arguments) for c in calls] == obs["plain_calls"]
    finished(rebuilt.choices[0].finish_reason, "tool_calls")
    _usage(obs, rebuilt.usage)


def _response_format(obs: h.Obs, provider: str, fmt: Any) -> None:
    out = litellm.completion(**_kw(provider, messages=FORECAST, response_format=fmt,
                                   max_tokens=FORCED_MAX_TOKENS))
    content = out.choices[0].message.content
    obs.update(content=content, finish=out.choices[0].finish_reason)
    finished(out.choices[0].finish_reason, "stop")
    if fmt == {"type": "json_object"}:
        Note.model_validate(json.loads(content))
    else:
        Forecast.model_validate_json(content)
    _usage(obs, out.usage)


def _reasoning_effort(obs: h.Obs, provider: str) -> None:
    # "none" must reach Qwen3's template (thinking off: an empty think block in the prompt).
    base = litellm.completion(**_kw(provider, messages=HELLO))
    off = litellm.completion(**_kw(provider, messages=HELLO, reasoning_effort="none"))
    obs["prompt_tokens"] = {"default": base.usage.prompt_tokens,
                            "none": off.usage.prompt_tokens}
    assert off.usage.prompt_tokens != base.usage.prompt_tokens, "reasoning_effort was ignored"


def _unknown_model(obs: h.Obs, provider: str) -> None:
    try:
        litellm.completion(**{**_kw(provider, messages=HELLO, max_tokens=4),
                              "model": f"{provider}/no-such-model"})
    except litellm.NotFoundError as exc:
        obs.update(status=exc.status_code, message=exc.message)
    else:
        raise AssertionError("no error for an unknown model")


def _bad_request(obs: h.Obs, provider: str) -> None:
    try:
        litellm.completion(**_kw(provider, messages=HELLO, max_tokens=4, temperature=5))
    except litellm.BadRequestError as exc:
        obs.update(status=exc.status_code, message=exc.message)
        assert "temperature" in exc.message, exc.message
    else:
        raise AssertionError("temperature 5 was accepted")


async def _acompletion_and_stream(obs: h.Obs, provider: str) -> None:
    plain = await litellm.acompletion(**_kw(provider, messages=HELLO))
    stream = await litellm.acompletion(**_kw(provider, messages=HELLO, stream=True,
                                             stream_options={"include_usage": True}))
    chunks = [c async for c in stream]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    obs.update(plain=plain.choices[0].message.content, streamed=text)
    assert text == plain.choices[0].message.content
    _usage(obs, plain.usage)
    _usage(obs, litellm.stream_chunk_builder(chunks, messages=HELLO).usage)


async def _atools_named(obs: h.Obs, provider: str) -> None:
    out = await litellm.acompletion(**_kw(
        provider, messages=WEATHER, tools=TOOLS, max_tokens=FORCED_MAX_TOKENS,
        tool_choice={"type": "function", "function": {"name": "get_time"}}))
    calls = _check_calls(obs, out.choices[0].message)
    obs["finish"] = out.choices[0].finish_reason
    assert {c.function.name for c in calls} == {"get_time"}
    finished(out.choices[0].finish_reason, "tool_calls", "stop")


def case_openai_completion(obs: h.Obs) -> None:
    _completion(obs, "openai")


def case_openai_stream_equals_completion(obs: h.Obs) -> None:
    _stream_equals_completion(obs, "openai")


def case_openai_text_completion(obs: h.Obs) -> None:
    # For "openai/" LiteLLM calls the server's own /v1/completions.
    kw = _kw("openai", prompt="The capital of France is")
    plain = litellm.text_completion(**kw)
    streamed = "".join(c.choices[0].text or "" for c in litellm.text_completion(
        **kw, stream=True) if c.choices)
    obs.update(plain=plain.choices[0].text, streamed=streamed, object=plain.object)
    assert isinstance(plain.choices[0].text, str) and streamed == plain.choices[0].text
    _usage(obs, plain.usage)


def case_openai_tools_auto(obs: h.Obs) -> None:
    _tools(obs, "openai", "auto")


def case_openai_tools_required(obs: h.Obs) -> None:
    _tools(obs, "openai", "required")


def case_openai_tools_named(obs: h.Obs) -> None:
    _tools(obs, "openai", {"type": "function", "function": {"name": "get_weather"}})


def case_openai_tools_required_stream(obs: h.Obs) -> None:
    _tools_stream(obs, "openai")


def case_openai_response_format_pydantic(obs: h.Obs) -> None:
    _response_format(obs, "openai", Forecast)


def case_openai_response_format_json_schema(obs: h.Obs) -> None:
    _response_format(obs, "openai", {"type": "json_schema", "json_schema": {
        "name": "forecast", "schema": Forecast.model_json_schema()}})


def case_openai_response_format_json_object(obs: h.Obs) -> None:
    _response_format(obs, "openai", {"type": "json_object"})


def case_openai_reasoning_effort(obs: h.Obs) -> None:
    _reasoning_effort(obs, "openai")


def case_openai_unknown_model_is_not_found(obs: h.Obs) -> None:
    _unknown_model(obs, "openai")


def case_openai_bad_request(obs: h.Obs) -> None:
    _bad_request(obs, "openai")


def case_hosted_vllm_completion(obs: h.Obs) -> None:
    _completion(obs, "hosted_vllm")


def case_hosted_vllm_stream_equals_completion(obs: h.Obs) -> None:
    _stream_equals_completion(obs, "hosted_vllm")


def case_hosted_vllm_tools_auto(obs: h.Obs) -> None:
    _tools(obs, "hosted_vllm", "auto")


def case_hosted_vllm_tools_required(obs: h.Obs) -> None:
    _tools(obs, "hosted_vllm", "required")


def case_hosted_vllm_tools_named(obs: h.Obs) -> None:
    _tools(obs, "hosted_vllm", {"type": "function", "function": {"name": "get_weather"}})


def case_hosted_vllm_tools_required_stream(obs: h.Obs) -> None:
    _tools_stream(obs, "hosted_vllm")


def case_hosted_vllm_response_format_pydantic(obs: h.Obs) -> None:
    _response_format(obs, "hosted_vllm", Forecast)


def case_hosted_vllm_response_format_json_schema(obs: h.Obs) -> None:
    _response_format(obs, "hosted_vllm", {"type": "json_schema", "json_schema": {
        "name": "forecast", "schema": Forecast.model_json_schema()}})


def case_hosted_vllm_response_format_json_object(obs: h.Obs) -> None:
    _response_format(obs, "hosted_vllm", {"type": "json_object"})


def case_hosted_vllm_reasoning_effort(obs: h.Obs) -> None:
    _reasoning_effort(obs, "hosted_vllm")


def case_hosted_vllm_unknown_model_is_not_found(obs: h.Obs) -> None:
    _unknown_model(obs, "hosted_vllm")


def case_hosted_vllm_bad_request(obs: h.Obs) -> None:
    _bad_request(obs, "hosted_vllm")


async def case_openai_acompletion_and_stream(obs: h.Obs) -> None:
    await _acompletion_and_stream(obs, "openai")


async def case_openai_atext_completion(obs: h.Obs) -> None:
    out = await litellm.atext_completion(**_kw("openai", prompt="The capital of France is"))
    obs["text"] = out.choices[0].text
    assert isinstance(out.choices[0].text, str)
    _usage(obs, out.usage)


async def case_openai_atools_named(obs: h.Obs) -> None:
    await _atools_named(obs, "openai")


async def case_hosted_vllm_acompletion_and_stream(obs: h.Obs) -> None:
    await _acompletion_and_stream(obs, "hosted_vllm")


async def case_hosted_vllm_atools_named(obs: h.Obs) -> None:
    await _atools_named(obs, "hosted_vllm")


if __name__ == "__main__":
    h.run_cases(globals(), ["litellm", "openai"])
