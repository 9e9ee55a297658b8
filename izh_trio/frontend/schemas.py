"""Request bodies as attrs classes, structured by a strict cattrs converter.

Strict means JSON types are checked, not coerced: ``"max_tokens": "5"`` or ``true`` for an
integer is a 400 naming the field, as OpenAI does. Unknown fields are ignored. Range checks
are attrs validators; their messages name the field, and so does the error's ``param``.
In the completions requests an explicit ``null`` is the field's default, as in OpenAI's API
(whose clients send null for "unset"); a required field given as null is still a 400.
"""

import re
import typing
from collections.abc import Callable
from typing import Any, ClassVar, TypeVar

import attrs
import cattrs
from attrs import validators as v

from izh_trio.frontend.errors import APIError, forget_tracebacks, innermost_message
from izh_trio.frontend.field_checks import refused

T = TypeVar("T", bound=attrs.AttrsInstance)
Hook = Callable[[Any], Any]

api_converter = cattrs.Converter()


def _strict(kind: type, check: Callable[[Any], bool], label: str) -> None:
    def hook(value: Any, _type: type) -> Any:
        if not check(value):
            raise TypeError(f"expected {label}, got {_json_type(value)}")
        return kind(value)

    api_converter.register_structure_hook(kind, hook)


def _json_type(value: Any) -> str:
    names = {bool: "boolean", int: "integer", float: "number", str: "string", list: "array",
             dict: "object", type(None): "null"}
    return names.get(type(value), type(value).__name__)


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_int64(x: Any) -> bool:
    """Every integer field crosses the engine pipe as msgpack: it must fit in 64 bits."""
    return _is_int(x) and -(2**63) <= x < 2**63


_strict(int, _is_int64, "a 64-bit integer")
_strict(float, lambda x: isinstance(x, int | float) and not isinstance(x, bool), "a number")
_strict(bool, lambda x: isinstance(x, bool), "a boolean")
_strict(str, lambda x: isinstance(x, str), "a string")


def _hook(tp: Any) -> Callable[[Hook], Hook]:
    """Register ``fn(value)`` as the structure hook of the type alias ``tp``."""

    def register(fn: Hook) -> Hook:
        api_converter.register_structure_hook_func(lambda t: t == tp, lambda value, _t: fn(value))
        return fn

    return register


#: A completions prompt, normalised to a batch: each item is text or token ids.
PromptBatch = list[str | list[int]]


@_hook(PromptBatch)
def _prompt(value: Any) -> PromptBatch:
    def ids(x: Any) -> bool:
        return isinstance(x, list) and all(_is_int(t) for t in x)

    if isinstance(value, str):
        return [value]
    if ids(value) and value:
        return [list(value)]
    if isinstance(value, list) and value and all(isinstance(p, str) or ids(p) for p in value):
        return [p if isinstance(p, str) else list(p) for p in value]
    raise TypeError("expected a string, an array of token ids, or a non-empty array of either")


StopStrings = tuple[str, ...]


@_hook(StopStrings)
def _stop(value: Any) -> StopStrings:
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    if isinstance(value, list) and all(isinstance(s, str) for s in value):
        return tuple(value)
    raise TypeError("expected a string or an array of strings")


LogitBias = tuple[tuple[int, float], ...]


@_hook(LogitBias)
def _logit_bias(value: Any) -> LogitBias:
    if value is None:
        return ()
    if not isinstance(value, dict):
        raise TypeError("expected an object mapping token ids to biases")
    out = []
    for key, bias in value.items():
        if not re.fullmatch(r"\d+", str(key)):
            raise ValueError(f"{key!r} is not a token id")
        if isinstance(bias, bool) or not isinstance(bias, int | float) or not -100 <= bias <= 100:
            raise ValueError(f"the bias for {key} must be a number in [-100, 100]")
        out.append((int(key), float(bias)))
    return tuple(out)


def _opt(*validators: Any) -> Any:
    return v.optional(list(validators))


@attrs.frozen
class StreamOptions:
    include_usage: bool = False
    continuous_usage_stats: bool = False


@_hook(StreamOptions)
def _stream_options(value: Any) -> StreamOptions:
    """Members given as null take their defaults, like the request's own fields."""
    if not isinstance(value, dict):
        raise TypeError(f"expected an object, got {_json_type(value)}")
    given = {}
    for field in attrs.fields(StreamOptions):
        assert field.type is not None  # every field is annotated
        if value.get(field.name) is not None:
            try:
                given[field.name] = api_converter.structure(value[field.name], field.type)
            except TypeError as exc:
                raise TypeError(f"{field.name}: {exc}") from None
    return StreamOptions(**given)


#: reasoning_effort -> the chat template's enable_thinking (Qwen3 thinks or it does not).
REASONING_EFFORTS = {"none": False, "minimal": False, "low": True, "medium": True,
                     "high": True, "xhigh": True, "max": True}


def _string_map(_inst: Any, attr: "attrs.Attribute[Any]", value: Any) -> None:
    if value is not None and not (isinstance(value, dict)
                                  and all(isinstance(x, str) for x in value.values())):
        raise TypeError(f"'{attr.name}' must be an object whose values are strings")


def _text_modality(_inst: Any, attr: "attrs.Attribute[Any]", value: Any) -> None:
    if value is not None and not isinstance(value, list):
        raise TypeError(f"'{attr.name}' must be an array of strings")
    for modality in value or ():
        if modality == "audio":
            raise ValueError(f"'{attr.name}' may only ask for \"text\": this server does not "
                             "generate audio")
        if modality != "text":
            raise ValueError(f"'{attr.name}' entries must be \"text\" or \"audio\", not "
                             f"{modality!r}")


@attrs.frozen(kw_only=True)
class SamplingFields:
    """What completions and chat completions share: sampling and request handling."""

    #: parse_body: an explicit null is the field's default (OpenAI declares them nullable).
    null_means_default: ClassVar[bool] = True

    model: str | None = None
    n: int = attrs.field(default=1, validator=[v.ge(1), v.le(16)])
    temperature: float | None = attrs.field(default=None, validator=_opt(v.ge(0), v.le(2)))
    top_p: float | None = attrs.field(default=None, validator=_opt(v.gt(0), v.le(1)))
    top_k: int | None = attrs.field(default=None, validator=_opt(v.ge(-1)))
    min_p: float | None = attrs.field(default=None, validator=_opt(v.ge(0), v.le(1)))
    seed: int | None = None
    presence_penalty: float = attrs.field(default=0.0, validator=[v.ge(-2), v.le(2)])
    frequency_penalty: float = attrs.field(default=0.0, validator=[v.ge(-2), v.le(2)])
    repetition_penalty: float | None = attrs.field(default=None, validator=_opt(v.gt(0),
                                                                                v.le(10)))
    logit_bias: LogitBias = ()
    min_tokens: int = attrs.field(default=0, validator=v.ge(0))
    ignore_eos: bool = False
    stop: StopStrings = ()
    stop_token_ids: list[int] | None = None
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    stream: bool = False
    stream_options: StreamOptions | None = None
    priority: int = 0
    cache_salt: str | None = attrs.field(default=None, validator=_opt(v.min_len(1)))
    #: OpenAI's spelling of a prefix-cache partition: the cache salt, when cache_salt is unset.
    prompt_cache_key: str | None = attrs.field(default=None, validator=_opt(v.min_len(1)))
    #: A LoRA adapter to run with (as ``model`` naming the adapter does).
    lora: str | None = None
    user: str | None = None


@attrs.frozen(kw_only=True)
class CompletionRequest(SamplingFields):
    prompt: PromptBatch
    max_tokens: int | None = attrs.field(default=16, validator=_opt(v.ge(1)))
    echo: bool = False
    logprobs: int | None = attrs.field(default=None, validator=_opt(v.ge(0), v.le(20)))
    prompt_logprobs: int | None = attrs.field(default=None, validator=_opt(v.ge(0), v.le(20)))
    best_of: int | None = None
    suffix: str | None = None


@attrs.frozen(kw_only=True)
class ChatCompletionRequest(SamplingFields):
    messages: Any
    max_tokens: int | None = attrs.field(default=None, validator=_opt(v.ge(1)))
    max_completion_tokens: int | None = attrs.field(default=None, validator=_opt(v.ge(1)))
    logprobs: bool = False
    top_logprobs: int | None = attrs.field(default=None, validator=_opt(v.ge(0), v.le(20)))
    tools: Any = None
    tool_choice: Any = None
    parallel_tool_calls: bool = True
    response_format: Any = None  # checked by structured.request_grammar
    chat_template_kwargs: Any = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    functions: Any = None  # the legacy tools: checked and translated by chat_tools
    function_call: Any = None  # the legacy tool_choice
    reasoning_effort: str | None = attrs.field(default=None,
                                               validator=_opt(v.in_(tuple(REASONING_EFFORTS))))
    # Informational: checked, then unused; none of them changes the answer here.
    service_tier: str | None = None
    metadata: Any = attrs.field(default=None, validator=_string_map)
    store: bool | None = None
    safety_identifier: str | None = None
    verbosity: str | None = attrs.field(default=None,
                                        validator=_opt(v.in_(("low", "medium", "high"))))
    modalities: Any = attrs.field(default=None, validator=_text_modality)
    # Each would change the answer, and this server cannot do it: a 400, not silence.
    audio: Any = attrs.field(default=None, validator=refused("this server generates text "
                                                                "only"))
    prediction: Any = attrs.field(default=None, validator=refused("predicted outputs are not "
                                                                     "implemented"))
    web_search_options: Any = attrs.field(default=None, validator=refused(
        "this server cannot search the web"))


def parse_body(cls: type[T], body: Any) -> T:
    """Build ``cls`` from a decoded JSON body, or raise a 400 that names the bad field."""
    if not isinstance(body, dict):
        raise APIError(400, "the request body must be a JSON object")
    null_means_default = getattr(cls, "null_means_default", False)
    values: dict[str, Any] = {}
    for field in attrs.fields(attrs.resolve_types(cls)):
        if field.name not in body:
            if field.default is attrs.NOTHING:
                raise APIError(400, f"'{field.name}' is a required property", param=field.name)
            continue
        raw = body[field.name]
        if raw is None:
            if field.default is attrs.NOTHING:
                raise APIError(400, f"'{field.name}' is required and may not be null",
                               param=field.name)
            # A field whose type admits None and whose default is not None gives null a
            # meaning of its own (completions' max_tokens: whatever the context leaves).
            if field.default is None or (null_means_default and not _admits_none(field.type)):
                continue
        try:
            values[field.name] = api_converter.structure(raw, field.type)
        except Exception as exc:  # whatever a client's value breaks is the client's 400
            detail = innermost_message(exc)
            forget_tracebacks(exc)
            raise APIError(400, f"invalid '{field.name}': {detail}", param=field.name) from None
    try:
        return cls(**values)
    except (TypeError, ValueError) as exc:
        # attrs' in_ validator puts its message first among several arguments.
        message = exc.args[0] if exc.args and isinstance(exc.args[0], str) else str(exc)
        match = re.search(r"'(\w+)'", message)  # attrs validators quote the field's name
        raise APIError(400, message, param=match[1] if match else None) from None


def _admits_none(tp: Any) -> bool:
    return type(None) in typing.get_args(tp)
