"""Request bodies as attrs classes, structured by a strict cattrs converter.

Strict means JSON types are checked, not coerced: ``"max_tokens": "5"`` or ``true`` for an
integer is a 400 naming the field, as OpenAI does. Unknown fields are ignored.
"""


import re
from typing import Any, TypeVar

import attrs
import cattrs
from attrs import validators as v

from izh_trio.frontend.errors import APIError

T = TypeVar("T")

api_converter = cattrs.Converter()


def _strict(kind: type, check, label: str) -> None:
    def hook(value: Any, _type: type) -> Any:
        if not check(value):
            raise TypeError(f"expected {label}, got {type(value).__name__}")
        return kind(value)

    api_converter.register_structure_hook(kind, hook)


_strict(int, lambda x: isinstance(x, int) and not isinstance(x, bool), "an integer")
_strict(float, lambda x: isinstance(x, int | float) and not isinstance(x, bool), "a number")
_strict(bool, lambda x: isinstance(x, bool), "a boolean")
_strict(str, lambda x: isinstance(x, str), "a string")


def _prompt_hook(value: Any, _type: type) -> str | list[int]:
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(t, int) and not isinstance(t, bool)
                                       for t in value):
        return list(value)
    raise TypeError("expected a string or a list of token ids")


Prompt = str | list[int]
api_converter.register_structure_hook(Prompt, _prompt_hook)


@attrs.frozen
class StreamOptions:
    include_usage: bool = False


@attrs.frozen
class CompletionRequest:
    prompt: Prompt
    model: str | None = None
    max_tokens: int | None = attrs.field(default=16, validator=v.optional(v.ge(1)))
    temperature: float | None = attrs.field(default=None, validator=v.optional([v.ge(0),
                                                                              v.le(2)]))
    top_p: float | None = attrs.field(default=None, validator=v.optional([v.gt(0), v.le(1)]))
    top_k: int | None = attrs.field(default=None, validator=v.optional(v.ge(-1)))
    min_p: float | None = attrs.field(default=None, validator=v.optional([v.ge(0), v.le(1)]))
    seed: int | None = None
    ignore_eos: bool = False
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = attrs.field(default=1, validator=[v.ge(1), v.le(1)])
    user: str | None = None


def parse_body(cls: type[T], body: Any) -> T:
    """Build ``cls`` from a decoded JSON body, or raise a 400 that names the bad field."""
    if not isinstance(body, dict):
        raise APIError(400, "the request body must be a JSON object")
    values: dict[str, Any] = {}
    for field in attrs.fields(cls):
        if field.name not in body:
            if field.default is attrs.NOTHING:
                raise APIError(400, f"'{field.name}' is a required property", param=field.name)
            continue
        raw = body[field.name]
        try:
            values[field.name] = api_converter.structure(raw, field.type)
        except (cattrs.BaseValidationError, TypeError, ValueError) as exc:
            detail = _first_message(exc)
            raise APIError(400, f"invalid '{field.name}': {detail}", param=field.name) from None
    try:
        return cls(**values)
    except (TypeError, ValueError) as exc:
        match = re.match(r"'(\w+)'", str(exc))  # attrs validators name the field first
        raise APIError(400, str(exc), param=match[1] if match else None) from None


def _first_message(exc: BaseException) -> str:
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return str(exc)
