"""instructor against the server: pydantic models (enums, nested models, optional fields)
in each mode an OpenAI-compatible server can serve. TOOLS / TOOLS_STRICT force a named tool,
JSON_SCHEMA sends the schema as response_format; these are constrained by the server, so the
answer must validate. JSON mode only asks for some JSON object, so it gets the Note model,
which any object satisfies. Usage: instructor_client.py BASE_URL MODEL.
"""

from __future__ import annotations

from typing import Any

import _harness as h
import _witness
import httpx
import instructor
import openai
from _models import (
    FORCED_MAX_TOKENS,
    FORECAST_QUESTION,
    SEED,
    Forecast,
    Note,
    finished,
)
from instructor.core.exceptions import InstructorError, InstructorRetryException
from pydantic import BaseModel

BASE_URL, MODEL = h.args()
FORECAST = [{"role": "user", "content": FORECAST_QUESTION}]
NOTE = [{"role": "user", "content": "Write a note about Paris."}]
SAMPLING: dict[str, Any] = {"temperature": 0, "seed": SEED, "max_tokens": FORCED_MAX_TOKENS,
                            "max_retries": 0}  # one attempt: no re-asking a random model
#: instructor 1.17 validates a partial stream's final object strictly from a decoded dict,
#: where pydantic's strict mode refuses a string for an enum (its own bug, not the server's):
#: partial streams of enum-bearing models need strict=False, as its users pass.
PARTIAL = {**SAMPLING, "strict": False}


def _client(mode: instructor.Mode) -> Any:
    # _witness: a partial stream hides the finish reason
    return instructor.from_openai(
        openai.OpenAI(base_url=BASE_URL + "/v1", api_key="unused", max_retries=0,
                      timeout=h.REQUEST_TIMEOUT,
                      http_client=httpx.Client(transport=_witness.Transport())), mode=mode)


def _aclient(mode: instructor.Mode) -> Any:
    return instructor.from_openai(
        openai.AsyncOpenAI(base_url=BASE_URL + "/v1", api_key="unused", max_retries=0,
                           timeout=h.REQUEST_TIMEOUT), mode=mode)


def _observe(obs: h.Obs, exc: BaseException) -> None:
    """What the server said, when instructor gave up on it."""
    last = getattr(exc, "last_completion", None)
    if last is not None and hasattr(last, "choices"):
        choice = last.choices[0]
        obs.update(finish=choice.finish_reason, content=choice.message.content,
                   tool_calls=[(c.function.name, c.function.arguments)
                               for c in choice.message.tool_calls or []])


def _structured(obs: h.Obs, mode: instructor.Mode, model: type[BaseModel],
                messages: list[dict[str, str]]) -> None:
    try:
        parsed, completion = _client(mode).chat.completions.create_with_completion(
            model=MODEL, response_model=model, messages=messages, **SAMPLING)
    except InstructorError as exc:
        _observe(obs, exc)
        raise
    choice = completion.choices[0]
    obs.update(parsed=parsed, finish=choice.finish_reason, usage=completion.usage)
    assert isinstance(parsed, model), parsed
    finished(choice.finish_reason, "stop", "tool_calls")
    assert completion.usage and completion.usage.completion_tokens > 0, completion.usage


def case_tools(obs: h.Obs) -> None:
    _structured(obs, instructor.Mode.TOOLS, Forecast, FORECAST)


def case_tools_strict(obs: h.Obs) -> None:
    _structured(obs, instructor.Mode.TOOLS_STRICT, Forecast, FORECAST)


def case_json_schema(obs: h.Obs) -> None:
    _structured(obs, instructor.Mode.JSON_SCHEMA, Forecast, FORECAST)


def case_json(obs: h.Obs) -> None:
    _structured(obs, instructor.Mode.JSON, Note, NOTE)


def _partial(obs: h.Obs, mode: instructor.Mode) -> None:
    # instructor names the streamed tool after its Partial model, so the request (and the
    # answer) differs from create's: the last partial must be a whole, valid Forecast.
    _witness.ANSWERS.clear()
    parts = list(_client(mode).chat.completions.create_partial(
        model=MODEL, response_model=Forecast, messages=FORECAST, **PARTIAL))
    obs.update(last_part=parts[-1] if parts else None, parts=len(parts),
               answers=_witness.ANSWERS)
    assert parts, "no partial came"
    assert _witness.ANSWERS and _witness.ANSWERS[-1].get("streamed"), _witness.ANSWERS
    finished(_witness.ANSWERS[-1]["finish"], "stop", "tool_calls")
    Forecast.model_validate(parts[-1].model_dump())


def case_tools_partial_stream(obs: h.Obs) -> None:
    _partial(obs, instructor.Mode.TOOLS)


def case_json_schema_partial_stream(obs: h.Obs) -> None:
    _partial(obs, instructor.Mode.JSON_SCHEMA)


def case_unknown_model_is_not_found(obs: h.Obs) -> None:
    try:
        _client(instructor.Mode.TOOLS).chat.completions.create(
            model="no-such-model", response_model=Forecast, messages=FORECAST, **SAMPLING)
    except (openai.NotFoundError, InstructorRetryException) as exc:
        # instructor wraps the SDK's error in its own, with the SDK's as the cause
        cause = exc if isinstance(exc, openai.NotFoundError) else exc.__cause__
        obs.update(raised=type(exc).__name__, cause=repr(cause))
        assert isinstance(cause, openai.NotFoundError), repr(cause)
    else:
        raise AssertionError("no error for an unknown model")


async def case_async_tools(obs: h.Obs) -> None:
    try:
        parsed, completion = await _aclient(
            instructor.Mode.TOOLS).chat.completions.create_with_completion(
            model=MODEL, response_model=Forecast, messages=FORECAST, **SAMPLING)
    except InstructorError as exc:
        _observe(obs, exc)
        raise
    obs.update(parsed=parsed, finish=completion.choices[0].finish_reason)
    assert isinstance(parsed, Forecast)
    finished(completion.choices[0].finish_reason, "stop", "tool_calls")


async def case_async_json_schema(obs: h.Obs) -> None:
    try:
        parsed, completion = await _aclient(
            instructor.Mode.JSON_SCHEMA).chat.completions.create_with_completion(
            model=MODEL, response_model=Forecast, messages=FORECAST, **SAMPLING)
    except InstructorError as exc:
        _observe(obs, exc)
        raise
    obs.update(parsed=parsed, finish=completion.choices[0].finish_reason)
    assert isinstance(parsed, Forecast)
    finished(completion.choices[0].finish_reason, "stop")


if __name__ == "__main__":
    h.run_cases(globals(), ["instructor", "openai", "pydantic"])
