"""The OpenAI Agents SDK's ``OpenAIChatCompletionsModel`` against the server, tracing off.

``@function_tool`` tools (strict schemas with $defs: a nested model and an enum), forced by
``tool_choice``; ``output_type`` structured answers; run, run_sync and run_streamed. The SDK
hides finish reasons: _witness notes each answer the server gave on its way.
Usage: agents_client.py BASE_URL MODEL (see _harness.py for the report).
"""

from __future__ import annotations

import contextlib
import json
from typing import Any

import _harness as h
import jsonschema
import openai
from _models import (
    FORCED_MAX_TOKENS,
    FORECAST_QUESTION,
    SEED,
    TEXT_MAX_TOKENS,
    WEATHER_QUESTION,
    Forecast,
    Location,
    Unit,
    finished,
)
from _witness import ANSWERS, AsyncTransport
from agents import (
    Agent,
    FunctionTool,
    MaxTurnsExceeded,
    ModelSettings,
    OpenAIChatCompletionsModel,
    Runner,
    RunResult,
    RunResultStreaming,
    ToolCallItem,
    function_tool,
    set_tracing_disabled,
)
from openai.types.responses import ResponseTextDeltaEvent
from openai.types.shared import Reasoning

BASE_URL, MODEL = h.args()
set_tracing_disabled(True)

CALLED: list[tuple[str, Any]] = []  # the tools the SDK ran, with the arguments it parsed


def _model(name: str = MODEL) -> OpenAIChatCompletionsModel:
    # A client per case: its connections belong to the event loop that made them.
    client = openai.AsyncOpenAI(
        base_url=BASE_URL + "/v1", api_key="unused", max_retries=0, timeout=h.REQUEST_TIMEOUT,
        http_client=openai.DefaultAsyncHttpxClient(transport=AsyncTransport()))
    return OpenAIChatCompletionsModel(model=name, openai_client=client)


def _settings(**kw: Any) -> ModelSettings:
    return ModelSettings(**{"temperature": 0, "max_tokens": FORCED_MAX_TOKENS,
                            "include_usage": True, "extra_args": {"seed": SEED}, **kw})


@function_tool
def get_weather(location: Location, unit: Unit = Unit.CELSIUS) -> str:
    """Get the current weather for a location.

    Args:
        location: Where to look.
        unit: The temperature unit.
    """
    CALLED.append(("get_weather", {"location": location, "unit": unit}))
    assert isinstance(location, Location) and isinstance(unit, Unit)
    return f"21 degrees {unit.value} in {location.city}"


@function_tool
def get_time(city: str) -> str:
    """Get the local time in a city.

    Args:
        city: The city's name.
    """
    CALLED.append(("get_time", {"city": city}))
    return f"12:00 in {city}"


TOOLS: list[FunctionTool] = [get_weather, get_time]


def _agent(**kw: Any) -> Agent:
    return Agent(**{"name": "helper", "instructions": "You are terse.", "model": _model(),
                    "model_settings": _settings(max_tokens=TEXT_MAX_TOKENS), **kw})


def _start(obs: h.Obs) -> None:
    ANSWERS.clear()
    CALLED.clear()
    obs["answers"] = ANSWERS
    obs["called"] = CALLED


def _usage(obs: h.Obs, result: RunResult | RunResultStreaming) -> None:
    usage = result.context_wrapper.usage
    obs["usage"] = {"requests": usage.requests, "input_tokens": usage.input_tokens,
                    "output_tokens": usage.output_tokens}
    assert usage.requests >= 1 and usage.input_tokens > 0 and usage.output_tokens > 0, usage
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens, usage


def _check_tool_calls(obs: h.Obs, result: RunResult, names: set[str]) -> None:
    """The model's calls validate against the schemas the SDK sent, and the SDK ran them."""
    schemas = {t.name: t.params_json_schema for t in TOOLS}
    calls = [item.raw_item for item in result.new_items if isinstance(item, ToolCallItem)]
    obs["tool_calls"] = [(c.name, c.arguments) for c in calls]
    assert calls, f"no tool call; final output {result.final_output!r}"
    for call in calls:
        assert call.name in names, f"called {call.name!r}, expected one of {names}"
        jsonschema.validate(json.loads(call.arguments), schemas[call.name])
    assert [name for name, _ in CALLED] == [c.name for c in calls], CALLED


def case_run_sync(obs: h.Obs) -> None:
    _start(obs)
    result = Runner.run_sync(_agent(), "Say hello in five words.", max_turns=1)
    obs["final_output"] = result.final_output
    assert isinstance(result.final_output, str)
    _usage(obs, result)


async def case_run(obs: h.Obs) -> None:
    _start(obs)
    result = await Runner.run(_agent(), "Say hello in five words.", max_turns=1)
    obs["final_output"] = result.final_output
    assert isinstance(result.final_output, str)
    assert ANSWERS and ANSWERS[0]["finish"] in ("stop", "length"), ANSWERS
    _usage(obs, result)


async def case_run_streamed_equals_run(obs: h.Obs) -> None:
    _start(obs)
    plain = await Runner.run(_agent(), "Say hello in five words.", max_turns=1)
    streamed = Runner.run_streamed(_agent(), "Say hello in five words.", max_turns=1)
    deltas = [event.data.delta async for event in streamed.stream_events()
              if event.type == "raw_response_event"
              and isinstance(event.data, ResponseTextDeltaEvent)]
    obs.update(plain=plain.final_output, streamed="".join(deltas),
               final_output=streamed.final_output)
    assert ANSWERS[-1].get("streamed") and ANSWERS[-1]["finish"] in ("stop", "length"), ANSWERS
    assert "".join(deltas) == plain.final_output == streamed.final_output
    _usage(obs, streamed)


async def _tool_run(obs: h.Obs, tool_choice: str) -> RunResult:
    _start(obs)
    # After a tool call the SDK resets tool_choice to auto, so the run ends in text.
    agent = _agent(tools=TOOLS, model_settings=_settings(tool_choice=tool_choice))
    result = await Runner.run(agent, WEATHER_QUESTION, max_turns=4)
    obs["final_output"] = result.final_output
    return result


async def case_tool_choice_auto(obs: h.Obs) -> None:
    result = await _tool_run(obs, "auto")
    if any(isinstance(item, ToolCallItem) for item in result.new_items):  # call or answer
        _check_tool_calls(obs, result, {"get_weather", "get_time"})
    assert isinstance(result.final_output, str)
    _usage(obs, result)


async def case_tool_choice_required(obs: h.Obs) -> None:
    result = await _tool_run(obs, "required")
    _check_tool_calls(obs, result, {"get_weather", "get_time"})
    finished(ANSWERS[0]["finish"], "tool_calls")
    _usage(obs, result)


async def case_tool_choice_named(obs: h.Obs) -> None:
    result = await _tool_run(obs, "get_weather")
    _check_tool_calls(obs, result, {"get_weather"})
    finished(ANSWERS[0]["finish"], "tool_calls", "stop")


async def case_output_type(obs: h.Obs) -> None:
    _start(obs)
    agent = _agent(output_type=Forecast, model_settings=_settings())
    result = await Runner.run(agent, FORECAST_QUESTION, max_turns=1)
    obs["final_output"] = result.final_output
    finished(ANSWERS[0]["finish"], "stop")
    assert isinstance(result.final_output, Forecast), result.final_output
    _usage(obs, result)


async def case_output_type_streamed(obs: h.Obs) -> None:
    _start(obs)
    agent = _agent(output_type=Forecast, model_settings=_settings())
    streamed = Runner.run_streamed(agent, FORECAST_QUESTION, max_turns=1)
    async for _event in streamed.stream_events():
        pass
    obs["final_output"] = streamed.final_output
    finished(ANSWERS[0]["finish"], "stop")
    assert isinstance(streamed.final_output, Forecast), streamed.final_output
    _usage(obs, streamed)


async def case_tools_then_output_type(obs: h.Obs) -> None:
    # The SDK sends tools, the forced tool_choice and the output type's response_format in one
    # request (OpenAI accepts that): the answer is the forced call, valid, never a 400. One
    # turn is run: whether a random-weight model ever moves on to the structured answer, or
    # calls again (it may: the next turn offers calls beside the format), is its own affair.
    _start(obs)
    agent = _agent(tools=TOOLS, output_type=Forecast,
                   model_settings=_settings(tool_choice="required"))
    with contextlib.suppress(MaxTurnsExceeded):
        await Runner.run(agent, FORECAST_QUESTION, max_turns=1)
    assert ANSWERS, "no answer"
    first = ANSWERS[0]
    assert "status" not in first, first
    finished(first["finish"], "tool_calls")
    schemas = {t.name: t.params_json_schema for t in TOOLS}
    assert first["tool_calls"], first
    for name, arguments in first["tool_calls"]:
        jsonschema.validate(json.loads(arguments), schemas[name])
    assert [name for name, _ in CALLED] == [name for name, _ in first["tool_calls"]], CALLED


async def case_reasoning_effort(obs: h.Obs) -> None:
    # ModelSettings.reasoning reaches Chat Completions as reasoning_effort; for Qwen3 "none"
    # turns thinking off in the template (a longer prompt).
    _start(obs)
    base = await Runner.run(_agent(), "Say hello.", max_turns=1)
    off = await Runner.run(_agent(model_settings=_settings(
        max_tokens=TEXT_MAX_TOKENS, reasoning=Reasoning(effort="none"))), "Say hello.",
        max_turns=1)
    tokens = {"default": base.context_wrapper.usage.input_tokens,
              "none": off.context_wrapper.usage.input_tokens}
    obs["input_tokens"] = tokens
    assert tokens["none"] != tokens["default"], "reasoning effort was ignored"


async def case_unknown_model_is_not_found(obs: h.Obs) -> None:
    _start(obs)
    try:
        await Runner.run(_agent(model=_model("no-such-model")), "Hello", max_turns=1)
    except openai.NotFoundError as exc:
        obs.update(status=exc.status_code, body=exc.body)
    else:
        raise AssertionError("no error for an unknown model")


if __name__ == "__main__":
    h.run_cases(globals(), ["openai-agents", "openai", "pydantic"])
