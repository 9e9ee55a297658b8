"""The models the client scripts hand to their libraries, shaped as people write them.

Pydantic with an enum and a nested model (so every library emits ``$defs``/``$ref``), an
optional field (``anyOf`` with null), unbounded strings and lists, no ``additionalProperties``:
the server must cope with schemas as libraries generate them, not hand-tuned ones.
"""

from __future__ import annotations

import json
from enum import StrEnum
from typing import Any

import jsonschema
from pydantic import BaseModel, Field

#: Enough for a forced call or a structured answer to close, on a server that makes it close.
FORCED_MAX_TOKENS = 200
#: Plain text: whatever the model says, cut here.
TEXT_MAX_TOKENS = 64
SEED = 1234

WEATHER_QUESTION = "What is the weather in Paris, in celsius? Use the tools."
FORECAST_QUESTION = "Give me a three-day weather forecast for Paris as JSON."


class Unit(StrEnum):
    CELSIUS = "celsius"
    FAHRENHEIT = "fahrenheit"


class Sky(StrEnum):
    SUNNY = "sunny"
    CLOUDY = "cloudy"
    RAIN = "rain"


class Location(BaseModel):
    """A place on Earth."""

    city: str = Field(description="The city's name")
    country: str | None = Field(default=None, description="ISO 3166 country code")


class GetWeather(BaseModel):
    """Get the current weather for a location."""

    location: Location
    unit: Unit = Unit.CELSIUS


class GetTime(BaseModel):
    """Get the local time in a city."""

    city: str


class Day(BaseModel):
    weekday: str
    high: float
    sky: Sky | None = None


class Forecast(BaseModel):
    """A short weather forecast."""

    location: Location
    unit: Unit
    days: list[Day]


class Note(BaseModel):
    """For JSON *object* modes, where only the server's "some JSON object" is enforced: every
    field is optional, so any object a random-weight model writes is a valid Note."""

    title: str | None = None
    tags: list[str] = []


def arguments(raw: str | dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    """Tool-call arguments as a dict, validated against the JSON schema the client sent."""
    args = json.loads(raw) if isinstance(raw, str) else raw
    assert isinstance(args, dict), f"arguments are not a JSON object: {raw!r}"
    jsonschema.validate(args, schema)
    return args


def finished(finish_reason: str | None, *allowed: str) -> None:
    """A forced call or structured answer must close by itself, not be cut by max_tokens."""
    assert finish_reason in allowed, (
        f"finish_reason {finish_reason!r}, expected one of {allowed} (the output was cut off "
        "or never closed)" if finish_reason == "length" else
        f"finish_reason {finish_reason!r}, expected one of {allowed}")
