"""LangChain's ``ChatOpenAI`` and ``OpenAI`` (langchain-openai) against the server.

Tools go through ``bind_tools`` as LangChain converts them (``@tool`` functions and pydantic
models, $refs inlined); structured output through ``with_structured_output`` in each of its
methods. Usage: langchain_client.py BASE_URL MODEL (see _harness.py for the report).
"""

from __future__ import annotations

import operator
from functools import reduce
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
    Location,
    Note,
    Unit,
    arguments,
    finished,
)
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool
from langchain_core.utils.function_calling import convert_to_openai_tool
from langchain_openai import ChatOpenAI, OpenAI

BASE_URL, MODEL = h.args()


def chat(max_tokens: int = TEXT_MAX_TOKENS, **kw: Any) -> ChatOpenAI:
    return ChatOpenAI(model=MODEL, base_url=BASE_URL + "/v1", api_key="unused",
                      temperature=0, seed=SEED, max_tokens=max_tokens, timeout=h.REQUEST_TIMEOUT,
                      max_retries=0, stream_usage=True, **kw)


@tool
def get_weather(location: Location, unit: Unit = Unit.CELSIUS) -> str:
    """Get the current weather for a location.

    Args:
        location: Where to look.
        unit: The temperature unit.
    """
    return f"21 degrees {unit.value} in {location.city}"


TOOLS = [get_weather, GetTime]
#: What bind_tools sends for each tool, to validate the arguments against.
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"]
           for t in map(convert_to_openai_tool, TOOLS)}
HELLO = [HumanMessage("Say hello in five words.")]
WEATHER = [HumanMessage(WEATHER_QUESTION)]
FORECAST = [HumanMessage(FORECAST_QUESTION)]


def _usage(obs: h.Obs, message: BaseMessage) -> None:
    usage = getattr(message, "usage_metadata", None)
    obs["usage"] = usage
    assert usage, "no usage_metadata"
    assert usage["input_tokens"] > 0 and usage["output_tokens"] > 0, usage
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"], usage


def _finish(message: BaseMessage) -> str | None:
    return message.response_metadata.get("finish_reason")


def _check_calls(obs: h.Obs, message: AIMessage) -> list[dict[str, Any]]:
    obs.update(tool_calls=message.tool_calls, invalid_tool_calls=message.invalid_tool_calls,
               content=message.content, finish=_finish(message))
    assert not message.invalid_tool_calls, f"unparsable calls: {message.invalid_tool_calls}"
    assert message.tool_calls, f"no tool call parsed; content {message.content!r}"
    for call in message.tool_calls:
        assert call["name"] in SCHEMAS, f"unknown tool {call['name']!r}"
        assert call["id"], call
        arguments(call["args"], SCHEMAS[call["name"]])
        if call["name"] == "get_weather":
            get_weather.args_schema.model_validate(call["args"])
        else:
            GetTime.model_validate(call["args"])
    return message.tool_calls


def _aggregate(chunks: list[Any]) -> Any:
    assert chunks, "the stream was empty"
    return reduce(operator.add, chunks)


def case_invoke(obs: h.Obs) -> None:
    out = chat().invoke(HELLO)
    obs.update(content=out.content, finish=_finish(out))
    assert isinstance(out, AIMessage) and isinstance(out.content, str)
    assert _finish(out) in ("stop", "length")
    _usage(obs, out)


def case_stream_equals_invoke(obs: h.Obs) -> None:
    plain = chat().invoke(HELLO)
    streamed = _aggregate(list(chat().stream(HELLO)))
    obs.update(plain=plain.content, streamed=streamed.content, finish=_finish(streamed))
    assert streamed.content == plain.content
    assert _finish(streamed) == _finish(plain)
    _usage(obs, streamed)


def case_batch(obs: h.Obs) -> None:
    outs = chat().batch([HELLO, WEATHER, "Count to three."])
    obs["contents"] = [o.content for o in outs]
    assert len(outs) == 3 and all(isinstance(o.content, str) for o in outs)
    for out in outs:
        _usage(obs, out)


def case_completions_llm(obs: h.Obs) -> None:
    llm = OpenAI(model=MODEL, base_url=BASE_URL + "/v1", api_key="unused", temperature=0,
                 seed=SEED, max_tokens=TEXT_MAX_TOKENS, timeout=h.REQUEST_TIMEOUT, max_retries=0)
    plain = llm.invoke("The capital of France is")
    streamed = "".join(llm.stream("The capital of France is"))
    result = llm.generate(["The capital of France is"])
    obs.update(plain=plain, streamed=streamed, llm_output=result.llm_output)
    assert isinstance(plain, str) and streamed == plain
    usage = (result.llm_output or {}).get("token_usage") or {}
    assert usage.get("prompt_tokens", 0) > 0 and usage.get("completion_tokens", 0) > 0, usage


def case_bind_tools_auto(obs: h.Obs) -> None:
    out = chat(FORCED_MAX_TOKENS).bind_tools(TOOLS, tool_choice="auto").invoke(WEATHER)
    obs.update(finish=_finish(out), content=out.content)
    if out.tool_calls or out.invalid_tool_calls:  # the model may call or answer
        _check_calls(obs, out)
    assert _finish(out) in ("stop", "length", "tool_calls")
    _usage(obs, out)


def case_bind_tools_required(obs: h.Obs) -> None:
    # LangChain spells "required" as "any".
    out = chat(FORCED_MAX_TOKENS).bind_tools(TOOLS, tool_choice="any").invoke(WEATHER)
    _check_calls(obs, out)
    finished(_finish(out), "tool_calls")
    _usage(obs, out)


def case_bind_tools_named(obs: h.Obs) -> None:
    out = chat(FORCED_MAX_TOKENS).bind_tools(TOOLS, tool_choice="get_weather").invoke(WEATHER)
    calls = _check_calls(obs, out)
    assert {c["name"] for c in calls} == {"get_weather"}
    finished(_finish(out), "tool_calls", "stop")


def case_bind_tools_named_pydantic_strict(obs: h.Obs) -> None:
    llm = chat(FORCED_MAX_TOKENS).bind_tools(TOOLS, tool_choice="GetTime", strict=True)
    out = llm.invoke(WEATHER)
    calls = _check_calls(obs, out)
    assert {c["name"] for c in calls} == {"GetTime"}
    finished(_finish(out), "tool_calls", "stop")


def case_bind_tools_required_stream_equals_invoke(obs: h.Obs) -> None:
    llm = chat(FORCED_MAX_TOKENS).bind_tools(TOOLS, tool_choice="required",
                                             parallel_tool_calls=False)
    plain = llm.invoke(WEATHER)
    streamed = _aggregate(list(llm.stream(WEATHER)))
    obs["plain_calls"] = plain.tool_calls
    calls = _check_calls(obs, streamed)
    assert [(c["name"], c["args"]) for c in calls] == [
        (c["name"], c["args"]) for c in plain.tool_calls]
    finished(_finish(streamed), "tool_calls")
    _usage(obs, streamed)


def case_tool_result_round_trip(obs: h.Obs) -> None:
    llm = chat(FORCED_MAX_TOKENS).bind_tools(TOOLS, tool_choice="get_weather")
    first = llm.invoke(WEATHER)
    call = _check_calls(obs, first)[0]
    result = get_weather.invoke(call)  # LangChain runs the tool on the parsed call
    assert isinstance(result, ToolMessage), result
    out = chat().bind_tools(TOOLS).invoke([*WEATHER, first, result])
    obs.update(tool_result=result.content, second=out.content, finish=_finish(out))
    assert _finish(out) in ("stop", "length", "tool_calls")
    _usage(obs, out)


def _structured(obs: h.Obs, result: dict[str, Any], schema: type) -> Any:
    raw = result["raw"]
    obs.update(content=raw.content, tool_calls=getattr(raw, "tool_calls", None),
               finish=_finish(raw), parsed=result["parsed"],
               parsing_error=repr(result["parsing_error"]) if result["parsing_error"] else None)
    finished(_finish(raw), "stop", "tool_calls")
    assert result["parsing_error"] is None, result["parsing_error"]
    assert isinstance(result["parsed"], schema), result["parsed"]
    return result["parsed"]


def case_structured_json_schema(obs: h.Obs) -> None:
    llm = chat(FORCED_MAX_TOKENS).with_structured_output(Forecast, method="json_schema",
                                                         include_raw=True)
    _structured(obs, llm.invoke(FORECAST), Forecast)


def case_structured_json_schema_strict(obs: h.Obs) -> None:
    llm = chat(FORCED_MAX_TOKENS).with_structured_output(Forecast, method="json_schema",
                                                         strict=True, include_raw=True)
    _structured(obs, llm.invoke(FORECAST), Forecast)


def case_structured_json_schema_dict(obs: h.Obs) -> None:
    # A plain JSON schema (what people paste in) comes back as a dict.
    schema = {"title": "forecast", **Forecast.model_json_schema()}
    llm = chat(FORCED_MAX_TOKENS).with_structured_output(schema, method="json_schema",
                                                         include_raw=True)
    arguments(_structured(obs, llm.invoke(FORECAST), dict), Forecast.model_json_schema())


def case_structured_function_calling(obs: h.Obs) -> None:
    llm = chat(FORCED_MAX_TOKENS).with_structured_output(Forecast, method="function_calling",
                                                         include_raw=True)
    _structured(obs, llm.invoke(FORECAST), Forecast)


def case_structured_json_mode(obs: h.Obs) -> None:
    llm = chat(FORCED_MAX_TOKENS).with_structured_output(Note, method="json_mode",
                                                         include_raw=True)
    _structured(obs, llm.invoke([HumanMessage("Return a note as a JSON object.")]), Note)


def case_structured_stream(obs: h.Obs) -> None:
    llm = chat(FORCED_MAX_TOKENS).with_structured_output(Forecast, method="json_schema")
    parts = list(llm.stream(FORECAST))
    obs["last"] = parts[-1] if parts else None
    assert parts and isinstance(parts[-1], Forecast), parts[-1:]


def case_unknown_model_is_not_found(obs: h.Obs) -> None:
    llm = ChatOpenAI(model="no-such-model", base_url=BASE_URL + "/v1", api_key="unused",
                     max_tokens=4, timeout=h.REQUEST_TIMEOUT, max_retries=0)
    try:
        llm.invoke(HELLO)
    except openai.NotFoundError as exc:
        obs.update(status=exc.status_code, body=exc.body)
    else:
        raise AssertionError("no error for an unknown model")


async def case_ainvoke_and_astream(obs: h.Obs) -> None:
    plain = await chat().ainvoke(HELLO)
    streamed = _aggregate([c async for c in chat().astream(HELLO)])
    obs.update(plain=plain.content, streamed=streamed.content)
    assert streamed.content == plain.content
    _usage(obs, plain)
    _usage(obs, streamed)


async def case_async_bind_tools_named(obs: h.Obs) -> None:
    out = await chat(FORCED_MAX_TOKENS).bind_tools(TOOLS, tool_choice="get_weather").ainvoke(
        WEATHER)
    calls = _check_calls(obs, out)
    assert {c["name"] for c in calls} == {"get_weather"}
    finished(_finish(out), "tool_calls", "stop")


async def case_async_structured_json_schema(obs: h.Obs) -> None:
    llm = chat(FORCED_MAX_TOKENS).with_structured_output(Forecast, method="json_schema",
                                                         include_raw=True)
    _structured(obs, await llm.ainvoke(FORECAST), Forecast)


if __name__ == "__main__":
    h.run_cases(globals(), ["langchain-openai", "langchain-core", "openai"])
