"""LlamaIndex's ``OpenAILike`` against the server: chat, stream, complete (through chat, and
through /v1/completions with is_chat_model=False), tool calls with ``FunctionTool`` schemas,
and structured predictions (LlamaIndex forces a tool for them on an unknown model).
LlamaIndex reads tool arguments with a lenient partial-JSON parser and its structured
predictions hide the finish reason, so _witness notes what the server answered.
Usage: llamaindex_client.py BASE_URL MODEL (see _harness.py for the report).
"""

# No ``from __future__ import annotations``: FunctionTool builds its schema from the tool
# functions' annotations, which it cannot resolve when they are strings.
from typing import Any

import _harness as h
import _witness
import httpx
import openai
from _models import (
    FORCED_MAX_TOKENS,
    SEED,
    TEXT_MAX_TOKENS,
    WEATHER_QUESTION,
    Forecast,
    Location,
    Unit,
    arguments,
    finished,
)
from llama_index.core.base.llms.types import ChatResponse
from llama_index.core.llms import ChatMessage
from llama_index.core.program import FunctionCallingProgram
from llama_index.core.prompts import PromptTemplate
from llama_index.core.tools import FunctionTool
from llama_index.llms.openai_like import OpenAILike

BASE_URL, MODEL = h.args()
ANSWERS = _witness.ANSWERS


def llm(max_tokens: int = TEXT_MAX_TOKENS, is_chat_model: bool = True) -> OpenAILike:
    # Clients per case: an async one belongs to the event loop that made it.
    return OpenAILike(
        model=MODEL, api_base=BASE_URL + "/v1", api_key="unused", is_chat_model=is_chat_model,
        is_function_calling_model=True, context_window=2048, max_tokens=max_tokens,
        temperature=0, timeout=h.REQUEST_TIMEOUT, max_retries=0,
        additional_kwargs={"seed": SEED},
        http_client=httpx.Client(transport=_witness.Transport()),
        async_http_client=httpx.AsyncClient(transport=_witness.AsyncTransport()))


def get_weather(location: Location, unit: Unit = Unit.CELSIUS) -> str:
    """Get the current weather for a location."""
    return f"21 degrees {unit.value} in {location.city}"


def get_time(city: str) -> str:
    """Get the local time in a city."""
    return f"12:00 in {city}"


TOOLS = [FunctionTool.from_defaults(fn=get_weather), FunctionTool.from_defaults(fn=get_time)]
FORECAST_PROMPT = PromptTemplate("Give me a three-day weather forecast for {city}.")
HELLO = [ChatMessage(role="user", content="Say hello in five words.")]


def _start(obs: h.Obs) -> None:
    ANSWERS.clear()
    obs["answers"] = ANSWERS


def _usage(obs: h.Obs, response: Any) -> None:
    usage = getattr(response.raw, "usage", None)  # raw: the openai SDK's response
    obs["usage"] = usage
    assert usage, f"no usage in the raw response: {response.raw!r}"
    assert usage.prompt_tokens > 0 and usage.completion_tokens > 0, usage


def _check_calls(obs: h.Obs, llm_: OpenAILike, response: ChatResponse,
                 names: set[str]) -> None:
    """The calls as LlamaIndex selected them, checked against the schemas it sent."""
    selections = llm_.get_tool_calls_from_response(response, error_on_no_tool_call=False)
    obs["selections"] = [(s.tool_name, s.tool_kwargs) for s in selections]
    sent = {t.metadata.name: t.metadata.to_openai_tool()["function"]["parameters"]
            for t in TOOLS}
    assert selections, f"no tool call; content {response.message.content!r}"
    for call in ANSWERS[-1]["tool_calls"]:  # what the server sent, not the lenient parse
        assert call[0] in names, f"called {call[0]!r}, expected one of {names}"
        arguments(call[1], sent[call[0]])
    for s in selections:
        {t.metadata.name: t for t in TOOLS}[s.tool_name].metadata.fn_schema.model_validate(
            s.tool_kwargs)


def case_chat(obs: h.Obs) -> None:
    _start(obs)
    out = llm().chat(HELLO)
    obs["content"] = out.message.content
    assert isinstance(out.message.content, str)
    assert ANSWERS[-1]["finish"] in ("stop", "length"), ANSWERS
    _usage(obs, out)


def case_stream_chat_equals_chat(obs: h.Obs) -> None:
    _start(obs)
    plain = llm().chat(HELLO)
    parts = list(llm().stream_chat(HELLO))
    obs.update(plain=plain.message.content, streamed="".join(p.delta or "" for p in parts))
    assert parts and "".join(p.delta or "" for p in parts) == plain.message.content
    assert parts[-1].message.content == plain.message.content


def case_complete_through_chat(obs: h.Obs) -> None:
    _start(obs)
    out = llm().complete("The capital of France is")
    streamed = "".join(p.delta or "" for p in llm().stream_complete("The capital of France is"))
    obs.update(text=out.text, streamed=streamed)
    assert isinstance(out.text, str) and streamed == out.text


def case_complete_completions_endpoint(obs: h.Obs) -> None:
    text_llm = llm(is_chat_model=False)
    out = text_llm.complete("The capital of France is")
    streamed = "".join(p.delta or "" for p in text_llm.stream_complete("The capital of France is"))
    obs.update(text=out.text, streamed=streamed)
    assert getattr(out.raw, "object", None) == "text_completion", out.raw
    assert isinstance(out.text, str) and streamed == out.text
    _usage(obs, out)


def case_chat_with_tools_auto(obs: h.Obs) -> None:
    _start(obs)
    model = llm(FORCED_MAX_TOKENS)
    out = model.chat_with_tools(TOOLS, user_msg=WEATHER_QUESTION)
    obs["finish"] = ANSWERS[-1]["finish"]
    if ANSWERS[-1]["tool_calls"]:  # the model may call or answer
        _check_calls(obs, model, out, {"get_weather", "get_time"})
    assert ANSWERS[-1]["finish"] in ("stop", "length", "tool_calls"), ANSWERS


def case_chat_with_tools_required(obs: h.Obs) -> None:
    _start(obs)
    model = llm(FORCED_MAX_TOKENS)
    out = model.chat_with_tools(TOOLS, user_msg=WEATHER_QUESTION, tool_required=True)
    _check_calls(obs, model, out, {"get_weather", "get_time"})
    finished(ANSWERS[-1]["finish"], "tool_calls")
    _usage(obs, out)


def case_chat_with_tools_named(obs: h.Obs) -> None:
    _start(obs)
    model = llm(FORCED_MAX_TOKENS)
    out = model.chat_with_tools(TOOLS, user_msg=WEATHER_QUESTION, tool_choice="get_weather")
    _check_calls(obs, model, out, {"get_weather"})
    finished(ANSWERS[-1]["finish"], "tool_calls", "stop")


def case_stream_chat_with_tools_required(obs: h.Obs) -> None:
    _start(obs)
    model = llm(FORCED_MAX_TOKENS)
    plain = model.chat_with_tools(TOOLS, user_msg=WEATHER_QUESTION, tool_required=True)
    parts = list(model.stream_chat_with_tools(TOOLS, user_msg=WEATHER_QUESTION,
                                              tool_required=True))
    assert parts, "the stream was empty"
    _check_calls(obs, model, parts[-1], {"get_weather", "get_time"})
    assert ANSWERS[-1].get("streamed"), ANSWERS
    finished(ANSWERS[-1]["finish"], "tool_calls")
    streamed = [(s.tool_name, s.tool_kwargs) for s in model.get_tool_calls_from_response(
        parts[-1], error_on_no_tool_call=False)]
    assert streamed == [(s.tool_name, s.tool_kwargs) for s in model.get_tool_calls_from_response(
        plain, error_on_no_tool_call=False)]


def case_structured_predict(obs: h.Obs) -> None:
    _start(obs)
    out = llm(FORCED_MAX_TOKENS).structured_predict(Forecast, FORECAST_PROMPT, city="Paris")
    obs["parsed"] = out
    finished(ANSWERS[-1]["finish"], "tool_calls", "stop")
    assert isinstance(out, Forecast)
    # LlamaIndex parses leniently: the server's own arguments must be whole and valid.
    Forecast.model_validate_json(ANSWERS[-1]["tool_calls"][0][1])


def case_function_calling_program_stream(obs: h.Obs) -> None:
    # stream_structured_predict leaves tool_choice at auto (a real model calls, a random one
    # need not); the program under it, told to call, is what it streams through.
    _start(obs)
    program = FunctionCallingProgram.from_defaults(
        output_cls=Forecast, prompt=FORECAST_PROMPT, llm=llm(FORCED_MAX_TOKENS),
        tool_choice="Forecast")
    parts = list(program.stream_call(city="Paris"))
    obs["last"] = parts[-1] if parts else None
    assert parts, "the stream was empty"
    assert ANSWERS[-1].get("streamed"), ANSWERS
    finished(ANSWERS[-1]["finish"], "tool_calls", "stop")
    Forecast.model_validate(parts[-1].model_dump())


def case_as_structured_llm(obs: h.Obs) -> None:
    _start(obs)
    out = llm(FORCED_MAX_TOKENS).as_structured_llm(Forecast).chat(
        [ChatMessage(role="user", content="Forecast for Paris.")])
    obs["raw"] = out.raw
    finished(ANSWERS[-1]["finish"], "tool_calls", "stop")
    assert isinstance(out.raw, Forecast), out.raw


def case_unknown_model_is_not_found(obs: h.Obs) -> None:
    try:
        OpenAILike(model="no-such-model", api_base=BASE_URL + "/v1", api_key="unused",
                   is_chat_model=True, max_tokens=4, timeout=h.REQUEST_TIMEOUT,
                   max_retries=0).chat(HELLO)
    except openai.NotFoundError as exc:
        obs.update(status=exc.status_code, body=exc.body)
    else:
        raise AssertionError("no error for an unknown model")


async def case_achat_and_astream_chat(obs: h.Obs) -> None:
    _start(obs)
    plain = await llm().achat(HELLO)
    parts = [p async for p in await llm().astream_chat(HELLO)]
    obs.update(plain=plain.message.content, streamed="".join(p.delta or "" for p in parts))
    assert "".join(p.delta or "" for p in parts) == plain.message.content
    _usage(obs, plain)


async def case_acomplete(obs: h.Obs) -> None:
    out = await llm(is_chat_model=False).acomplete("The capital of France is")
    obs["text"] = out.text
    assert isinstance(out.text, str)
    _usage(obs, out)


async def case_achat_with_tools_named(obs: h.Obs) -> None:
    _start(obs)
    model = llm(FORCED_MAX_TOKENS)
    out = await model.achat_with_tools(TOOLS, user_msg=WEATHER_QUESTION,
                                       tool_choice="get_time")
    _check_calls(obs, model, out, {"get_time"})
    finished(ANSWERS[-1]["finish"], "tool_calls", "stop")


async def case_astructured_predict(obs: h.Obs) -> None:
    _start(obs)
    out = await llm(FORCED_MAX_TOKENS).astructured_predict(Forecast, FORECAST_PROMPT,
                                                           city="Paris")
    obs["parsed"] = out
    finished(ANSWERS[-1]["finish"], "tool_calls", "stop")
    assert isinstance(out, Forecast)


if __name__ == "__main__":
    h.run_cases(globals(), ["llama-index-llms-openai-like", "llama-index-llms-openai",
                            "llama-index-core", "openai"])
