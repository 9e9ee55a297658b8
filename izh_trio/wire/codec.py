"""Length-prefixed msgpack frames of tagged messages.

A frame is ``u32 big-endian length`` + msgpack ``[[tag, body], ...]``: one frame carries every
message of one engine step, so the pipe sees one write per step, not one per request.
Anything that does not decode exactly is a :class:`ProtocolError`; the reader stops rather
than guess where the next frame starts.
"""

from __future__ import annotations

import struct
import typing
from collections.abc import Iterable
from typing import Any

import cattrs
import msgpack
from cattrs.preconf.msgpack import make_converter

from izh_trio.wire import hot
from izh_trio.wire import messages as m

_LEN = struct.Struct(">I")
HEADER_SIZE = _LEN.size
#: A step's frame for thousands of requests is well under this; anything larger is corruption.
MAX_FRAME_SIZE = 64 << 20

# Tags are part of the protocol: append, never reorder.
_TAGGED: tuple[type, ...] = (
    m.AddRequest,
    m.Abort,
    m.Shutdown,
    m.Ready,
    m.StepOutputs,
    m.RequestFailed,
    m.Stats,
    m.Fatal,
    m.LoadLora,
    m.UnloadLora,
    m.LoraUpdated,
)
_TAG_OF = {cls: tag for tag, cls in enumerate(_TAGGED)}

#: Unknown keys are an error: a field this side does not know is a version mismatch, not noise.
converter = make_converter(forbid_extra_keys=True)


# cattrs' default hooks coerce (``str(x)``, ``int("5")``, ``bool("no")``, a string as a tuple of
# characters); on the wire a value of the wrong type is an error, like an unknown key. One
# call per field, the check inlined: the frontend decodes a Stats of a dozen fields every step.
def _exact(kind: type) -> None:
    def hook(value: Any, _type: type) -> Any:
        if type(value) is not kind:  # a value of exactly its type needs no conversion
            raise TypeError(f"expected {kind.__name__}, got {type(value).__name__}")
        return value

    converter.register_structure_hook(kind, hook)


for _kind in (int, bool, str):
    _exact(_kind)


def _float(value: Any, _type: type) -> float:
    if type(value) is float:
        return value
    if type(value) is int:  # an int where a float belongs loses nothing
        return float(value)
    raise TypeError(f"expected float, got {type(value).__name__}")


converter.register_structure_hook(float, _float)


def _is_homogeneous_tuple(tp: Any) -> bool:
    args = typing.get_args(tp)
    return typing.get_origin(tp) is tuple and len(args) == 2 and args[1] is Ellipsis


@converter.register_structure_hook_factory(_is_homogeneous_tuple)
def _strict_tuple(tp: Any) -> typing.Callable[[Any, Any], tuple[Any, ...]]:
    item = typing.get_args(tp)[0]
    if item in (int, str):  # prompts, Stats' arrays: one pass, not a converter call per item
        only = frozenset({item})
        message = f"expected an array of {'integers' if item is int else 'strings'}"

        def scalars(value: Any, _type: Any) -> tuple[Any, ...]:
            # the items' set of types, built in C: no Python frame per item
            if type(value) is not list or not {*map(type, value)} <= only:
                raise TypeError(message)
            return tuple(value)

        return scalars

    def hook(value: Any, _type: Any) -> tuple[Any, ...]:
        if type(value) is not list:
            raise TypeError(f"expected an array, got {type(value).__name__}")
        return tuple(converter.structure(x, item) for x in value)

    return hook


_POSITIONAL = frozenset({m.StepOutputs})
converter.register_unstructure_hook(m.StepOutputs, hot.unstructure_step)
converter.register_structure_hook(m.StepOutputs, lambda v, _t: hot.structure_step(v))
converter.register_unstructure_hook(m.RequestOutput, hot.unstructure_output)
converter.register_structure_hook(m.RequestOutput, lambda v, _t: hot.structure_output(v))


class ProtocolError(Exception):
    """The byte stream is not a valid frame sequence."""


def encode_frame(messages: Iterable[m.Message]) -> bytes:
    body = [[_TAG_OF[type(msg)], converter.unstructure(msg)] for msg in messages]
    payload: bytes = msgpack.packb(body, use_bin_type=True)
    if len(payload) > MAX_FRAME_SIZE:
        raise ProtocolError(f"frame of {len(payload)} bytes exceeds {MAX_FRAME_SIZE}")
    return _LEN.pack(len(payload)) + payload


def decode_payload(payload: bytes) -> list[m.Message]:
    try:
        body = msgpack.unpackb(payload, raw=False, strict_map_key=True)
    except Exception as exc:  # msgpack raises several unrelated types
        raise ProtocolError(f"undecodable frame payload: {exc}") from exc
    if not isinstance(body, list):
        raise ProtocolError(f"frame payload is {type(body).__name__}, not a list")
    out: list[m.Message] = []
    for item in body:
        if not (
            isinstance(item, list)
            and len(item) == 2
            and type(item[0]) is int  # not a bool
            and isinstance(item[1], dict | list)  # a list: the positional hot messages
        ):
            raise ProtocolError(f"malformed message entry {item!r:.80}")
        tag, fields = item
        if not 0 <= tag < len(_TAGGED):
            raise ProtocolError(f"unknown message tag {tag}")
        cls = _TAGGED[tag]
        if (type(fields) is list) != (cls in _POSITIONAL):
            raise ProtocolError(f"malformed {cls.__name__}: wrong container for its fields")
        try:
            out.append(converter.structure(fields, cls))
        except (cattrs.BaseValidationError, TypeError, ValueError) as exc:
            name = _TAGGED[tag].__name__
            raise ProtocolError(f"malformed {name}: {exc!r:.300}") from exc
    return out


class FrameDecoder:
    """Incremental decoder: feed it bytes as they arrive, get whole messages back."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes | bytearray) -> list[m.Message]:
        self._buf += data
        out: list[m.Message] = []
        while len(self._buf) >= HEADER_SIZE:
            (size,) = _LEN.unpack_from(self._buf)
            if size > MAX_FRAME_SIZE:
                raise ProtocolError(f"frame length {size} exceeds {MAX_FRAME_SIZE}")
            end = HEADER_SIZE + size
            if len(self._buf) < end:
                break
            payload = bytes(self._buf[HEADER_SIZE:end])
            del self._buf[:end]
            out.extend(decode_payload(payload))
        return out

    @property
    def pending(self) -> int:
        """Bytes of an incomplete frame; non-zero at EOF means the peer died mid-write."""
        return len(self._buf)
