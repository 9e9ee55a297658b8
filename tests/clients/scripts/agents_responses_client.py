"""The OpenAI Agents SDK's default model, which speaks the Responses API, against the server.

The SDK is given the server as its default OpenAI client and left on its default API
(``/v1/responses``): agents name their model by a string, as people write them. An agent with
a ``@function_tool`` tool runs to completion (the first turn's call forced with ``required``;
the SDK resets the choice after it), and streamed up to the tool's answer; an ``output_type``
answer validates, streamed as plain; a run continues the previous one by
``previous_response_id``, served from the prefix cache. Tracing off.
Usage: agents_responses_client.py BASE_URL MODEL (see _harness.py for the report).
"""

from __future__ import annotations

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
)
from agents import (
    Agent,
    FunctionTool,
    ModelSettings,
    Runner,
    RunResult,
    RunResultStreaming,
    ToolCallItem,
    ToolCallOutputItem,
    function_tool,
    set_default_openai_api,
    set_default_openai_client,
    set_tracing_disabled,
)
from openai.types.responses import ResponseTextDeltaEvent

BASE_URL, MODEL = h.args()
set_tracing_disabled(True)

CALLED: list[str] = []  # the tools the SDK ran


def _use_server() -> None:
    # A client per case: its connections belong to the event loop that made them.
    client = openai.AsyncOpenAI(base_url=BASE_URL + "/v1", api_key="unused", max_retries=0,
                                timeout=h.REQUEST_TIMEOUT)
    set_default_openai_client(client, use_for_tracing=False)
    set_default_openai_api("responses")  # the SDK's default, said out loud


@function_tool
def get_weather(location: Location, unit: Unit = Unit.CELSIUS) -> str:
    """Get the current weather for a location.

    Args:
        location: Where to look.
        unit: The temperature unit.
    """
    CALLED.append("get_weather")
    assert isinstance(location, Location) and isinstance(unit, Unit)
    return f"21 degrees {unit.value} in {location.city}"


TOOLS: list[FunctionTool] = [get_weather]


def _agent(**kw: Any) -> Agent:
    settings = ModelSettings(temperature=0, max_tokens=TEXT_MAX_TOKENS,
                             extra_body={"seed": SEED})
    return Agent(**{"name": "helper", "instructions": "You are terse.", "model": MODEL,
                    "model_settings": settings, **kw})


def _start(obs: h.Obs) -> None:
    _use_server()
    CALLED.clear()
    obs["called"] = CALLED


def _tool_agent() -> Agent:
    return _agent(tools=TOOLS, model_settings=ModelSettings(
        temperature=0, max_tokens=FORCED_MAX_TOKENS, tool_choice="required",
        extra_body={"seed": SEED}))


def _check_run_with_a_tool(obs: h.Obs, result: RunResult | RunResultStreaming) -> None:
    calls = [item.raw_item for item in result.new_items if isinstance(item, ToolCallItem)]
    outputs = [item for item in result.new_items if isinstance(item, ToolCallOutputItem)]
    obs.update(final_output=result.final_output, responses=len(result.raw_responses),
               calls=[(c.name, c.arguments) for c in calls])
    assert calls and outputs, f"no tool round trip: {result.new_items!r}"
    schema = get_weather.params_json_schema
    for call in calls:
        jsonschema.validate(json.loads(call.arguments), schema)
    assert ["get_weather"] * len(calls) == CALLED, CALLED
    # the run went on after the tool's output and ended in a text answer
    assert isinstance(result.final_output, str), result.final_output
    assert len(result.raw_responses) >= 2, result.raw_responses
    usage = result.context_wrapper.usage
    assert usage.requests == len(result.raw_responses) and usage.input_tokens > 0, usage


async def case_agent_with_a_tool_runs_to_completion(obs: h.Obs) -> None:
    _start(obs)
    result = await Runner.run(_tool_agent(), WEATHER_QUESTION, max_turns=4)
    _check_run_with_a_tool(obs, result)


async def case_agent_with_a_tool_streamed(obs: h.Obs) -> None:
    # The SDK fails a stream whose terminal event is response.incomplete, which free text from
    # a random-weight model always is (it never says eos): this run stops at the tool's answer.
    _start(obs)
    agent = _tool_agent().clone(tool_use_behavior="stop_on_first_tool")
    streamed = Runner.run_streamed(agent, WEATHER_QUESTION, max_turns=2)
    kinds = [event.type async for event in streamed.stream_events()]
    calls = [item.raw_item for item in streamed.new_items if isinstance(item, ToolCallItem)]
    obs.update(event_kinds=sorted(set(kinds)), final_output=streamed.final_output,
               calls=[(c.name, c.arguments) for c in calls])
    assert "raw_response_event" in kinds and "run_item_stream_event" in kinds, kinds
    assert calls and ["get_weather"] * len(calls) == CALLED, (calls, CALLED)
    for call in calls:
        jsonschema.validate(json.loads(call.arguments), get_weather.params_json_schema)
    assert str(streamed.final_output).startswith("21 degrees "), streamed.final_output


def _forecast_agent() -> Agent:
    return _agent(output_type=Forecast, model_settings=ModelSettings(
        temperature=0, max_tokens=FORCED_MAX_TOKENS, extra_body={"seed": SEED}))


async def case_output_type_streamed_equals_run(obs: h.Obs) -> None:
    _start(obs)
    plain = await Runner.run(_forecast_agent(), FORECAST_QUESTION, max_turns=1)
    streamed = Runner.run_streamed(_forecast_agent(), FORECAST_QUESTION, max_turns=1)
    deltas = [event.data.delta async for event in streamed.stream_events()
              if event.type == "raw_response_event"
              and isinstance(event.data, ResponseTextDeltaEvent)]
    obs.update(plain=plain.final_output, streamed="".join(deltas))
    assert isinstance(streamed.final_output, Forecast), streamed.final_output
    assert streamed.final_output == plain.final_output
    assert Forecast.model_validate_json("".join(deltas)) == plain.final_output


async def case_output_type(obs: h.Obs) -> None:
    _start(obs)
    result = await Runner.run(_forecast_agent(), FORECAST_QUESTION, max_turns=1)
    obs["final_output"] = result.final_output
    assert isinstance(result.final_output, Forecast), result.final_output


async def case_previous_response_id_continues_a_run(obs: h.Obs) -> None:
    _start(obs)
    first = await Runner.run(_agent(), "My name is Ada.", max_turns=1)
    response_id = first.last_response_id
    assert response_id and response_id.startswith("resp_"), response_id
    second = await Runner.run(_agent(), "What is my name?", max_turns=1,
                              previous_response_id=response_id)
    usage = second.context_wrapper.usage
    obs.update(first=first.final_output, second=second.final_output,
               cached=usage.input_tokens_details.cached_tokens,
               input_tokens=usage.input_tokens)
    # the stored turn was carried: the prompt holds it, and the prefix cache served it
    assert usage.input_tokens > first.context_wrapper.usage.input_tokens, usage
    assert usage.input_tokens_details.cached_tokens > 0, usage


if __name__ == "__main__":
    h.run_cases(globals(), ["openai-agents", "openai", "pydantic"])
