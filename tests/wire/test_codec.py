"""The frame codec: exact round trips, incremental decoding, and no guessing on bad input."""

from __future__ import annotations

import struct
import types
import typing
from typing import Any

import attrs
import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from izh_trio.wire import codec
from izh_trio.wire import messages as m
from izh_trio.wire.codec import (
    HEADER_SIZE,
    MAX_FRAME_SIZE,
    FrameDecoder,
    ProtocolError,
    converter,
    decode_payload,
    encode_frame,
)
from izh_trio.wire.sampling import SamplingParams

# ---------------------------------------------------------------- strategies

token_ids = st.lists(st.integers(0, 2**31 - 1), max_size=6)
counts = st.integers(0, 2**40)
texts = st.text(max_size=12)
int64 = st.integers(-(2**63), 2**63 - 1)
unit = st.floats(0.0, 1.0, allow_nan=False)

#: (think_budget, think_end): none, or a budget with the tokens it forces.
thinking = st.just((None, ())) | st.tuples(st.integers(1, 2**31),
                                          st.lists(st.integers(0, 2**31 - 1), min_size=1,
                                                   max_size=3))


def _sampling_params(thinking: tuple[int | None, list[int]], **kwargs: Any) -> SamplingParams:
    budget, end = thinking
    return SamplingParams(think_budget=budget, think_end=end, **kwargs)


sampling_params = st.builds(
    _sampling_params,
    thinking=thinking,
    max_tokens=st.integers(1, 2**31),
    temperature=st.floats(0.0, 100.0, allow_nan=False),
    top_p=st.floats(0.0, 1.0, exclude_min=True),
    top_k=st.integers(-1, 2**20),
    min_p=unit,
    seed=st.none() | int64,
    ignore_eos=st.booleans(),
    stop_token_ids=token_ids,
    min_tokens=st.integers(0, 2**20),
)

model_infos = st.builds(
    m.ModelInfo,
    vocab_size=counts,
    dtype=texts,
    eos_token_ids=token_ids,
)

request_outputs = st.builds(
    m.RequestOutput,
    request_id=texts,
    new_token_ids=token_ids,
    num_prompt_tokens=counts,
    num_output_tokens=counts,
    num_cached_tokens=counts,
    finish_reason=st.none() | st.sampled_from(m.FinishReason),
)

#: One strategy per tagged class; a class added to the protocol must be added here too.
STRATEGIES: dict[type, st.SearchStrategy[Any]] = {
    m.AddRequest: st.builds(
        m.AddRequest,
        request_id=texts,
        prompt_token_ids=token_ids,
        params=sampling_params,
        priority=int64,
        cache_salt=st.none() | texts,
        lora_name=st.none() | texts,
    ),
    m.Abort: st.builds(m.Abort, request_ids=st.lists(texts, max_size=4)),
    m.Shutdown: st.builds(m.Shutdown),
    m.Ready: st.builds(
        m.Ready,
        max_model_len=counts,
        model=model_infos,
    ),
    m.StepOutputs: st.builds(m.StepOutputs, outputs=st.lists(request_outputs, max_size=5)),
    m.RequestFailed: st.builds(m.RequestFailed, request_id=texts, message=texts),
    m.Stats: st.builds(
        m.Stats,
        num_running=counts,
        num_waiting=counts,
        kv_cache_usage=unit,
        num_preemptions=counts,
        num_steps=counts,
        prompt_tokens_total=counts,
        generation_tokens_total=counts,
    ),
    m.Fatal: st.builds(m.Fatal, message=texts),
    m.LoadLora: st.builds(m.LoadLora, op_id=texts, name=texts, path=texts),
    m.UnloadLora: st.builds(m.UnloadLora, op_id=texts, name=texts),
    m.LoraUpdated: st.builds(m.LoraUpdated, op_id=texts, error=st.none() | texts),
}
messages = st.one_of(*STRATEGIES.values())

FULL_PARAMS = SamplingParams(
    max_tokens=77,
    temperature=0.7,
    top_p=0.9,
    top_k=40,
    min_p=0.05,
    seed=1234,
    ignore_eos=True,
    stop_token_ids=(5, 6, 7),
    min_tokens=3,
    think_budget=512,
    think_end=(151668, 271),
)

#: Concrete values of every tagged class, each nested class and optional field filled in.
EXAMPLES: list[Any] = [
    m.AddRequest("req-1", (1, 2, 3, 4), FULL_PARAMS, priority=-3, cache_salt="tenant-ä",
                 lora_name="sql-adapter"),
    m.AddRequest("req-2", [9], SamplingParams()),
    m.Abort(("req-1", "req-2")),
    m.Abort(()),
    m.Shutdown(),
    m.Ready(
        max_model_len=4096,
        model=m.ModelInfo(151936, "bfloat16", (151643, 151645)),
    ),
    m.StepOutputs(
        (
            m.RequestOutput("a", (11,), 5, 1),
            m.RequestOutput("b", (12, 13), 7, 2, num_cached_tokens=4),
            *(
                m.RequestOutput(f"r-{reason.value}", (), 3, 9, 2, reason)
                for reason in m.FinishReason
            ),
        )
    ),
    m.StepOutputs(()),
    m.RequestFailed("req-3", "the prompt is empty"),
    m.Stats(
        num_running=2,
        num_waiting=5,
        kv_cache_usage=0.375,
        num_preemptions=1,
        num_steps=42,
        prompt_tokens_total=1000,
        generation_tokens_total=250,
    ),
    m.Fatal("CUDA error: device-side assert triggered"),
    m.LoadLora("op-1", "sql-adapter", "/adapters/sql"),
    m.UnloadLora("op-2", "sql-adapter"),
    m.LoraUpdated("op-1", "LoRA adapter 'sql-adapter': DoRA (use_dora) is not supported"),
    m.LoraUpdated("op-2"),
]


def frame(payload: bytes) -> bytes:
    return struct.pack(">I", len(payload)) + payload


def packed(body: Any) -> bytes:
    """A hand-built frame around any msgpack-able value."""
    return frame(msgpack.packb(body, use_bin_type=True))


def decode_all(data: bytes) -> list[Any]:
    decoder = FrameDecoder()
    out = decoder.feed(data)
    assert decoder.pending == 0
    return out


# ---------------------------------------------------------------- round trips


def test_every_tagged_class_has_a_strategy_and_an_example() -> None:
    assert set(STRATEGIES) == set(codec._TAGGED)
    assert {type(msg) for msg in EXAMPLES} == set(codec._TAGGED)
    assert len(set(codec._TAGGED)) == len(codec._TAGGED)


@pytest.mark.parametrize("msg", EXAMPLES, ids=lambda msg: type(msg).__name__)
def test_example_round_trips(msg: Any) -> None:
    (back,) = decode_all(encode_frame([msg]))
    assert back == msg
    assert type(back) is type(msg)


def test_step_outputs_keep_every_finish_reason() -> None:
    step = next(msg for msg in EXAMPLES if isinstance(msg, m.StepOutputs) and msg.outputs)
    (back,) = decode_all(encode_frame([step]))
    reasons = [out.finish_reason for out in back.outputs]
    assert reasons == [None, None, *m.FinishReason]
    assert all(isinstance(r, m.FinishReason) for r in reasons[2:])
    assert [out.finished for out in back.outputs] == [False, False, True, True, True]


def test_empty_frame() -> None:
    data = encode_frame([])
    assert len(data) > HEADER_SIZE
    assert decode_all(data) == []


def test_examples_share_one_frame_in_order() -> None:
    assert decode_all(encode_frame(EXAMPLES)) == EXAMPLES


@settings(max_examples=150, deadline=None)
@given(st.lists(messages, max_size=6))
def test_random_messages_round_trip(msgs: list[Any]) -> None:
    back = decode_all(encode_frame(msgs))
    assert back == msgs
    assert [type(x) for x in back] == [type(x) for x in msgs]


@settings(max_examples=30, deadline=None)
@given(st.lists(messages, min_size=1, max_size=3))
def test_byte_at_a_time(msgs: list[Any]) -> None:
    data = encode_frame(msgs)
    decoder = FrameDecoder()
    out: list[Any] = []
    for i in range(len(data)):
        got = decoder.feed(data[i : i + 1])
        if i < len(data) - 1:
            assert got == []
            assert decoder.pending == i + 1
        out.extend(got)
    assert out == msgs
    assert decoder.pending == 0


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(messages, max_size=3), max_size=5), st.data())
def test_concatenated_frames_decode_in_order(frames: list[list[Any]], data: st.DataObject) -> None:
    stream = b"".join(encode_frame(msgs) for msgs in frames)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=8)))
    decoder = FrameDecoder()
    out: list[Any] = []
    for start, end in zip([0, *cuts], [*cuts, len(stream)], strict=True):
        out.extend(decoder.feed(stream[start:end]))
    assert out == [msg for msgs in frames for msg in msgs]
    assert decoder.pending == 0


def test_pending_after_partial_frame() -> None:
    data = encode_frame(EXAMPLES[:3])
    decoder = FrameDecoder()
    assert decoder.pending == 0
    assert decoder.feed(data[:2]) == []
    assert decoder.pending == 2  # half a header
    assert decoder.feed(data[2:-1]) == []
    assert decoder.pending == len(data) - 1  # all but the last payload byte
    assert decoder.feed(data[-1:]) == EXAMPLES[:3]
    assert decoder.pending == 0
    # A whole frame followed by part of the next: the whole one comes out, the rest waits.
    assert decoder.feed(data + data[:7]) == EXAMPLES[:3]
    assert decoder.pending == 7


def test_feeding_nothing_is_harmless() -> None:
    decoder = FrameDecoder()
    assert decoder.feed(b"") == []
    assert decoder.pending == 0


# ---------------------------------------------------------------- framing errors


@pytest.mark.parametrize("size", [MAX_FRAME_SIZE + 1, 2**32 - 1])
def test_oversized_length_prefix(size: int) -> None:
    # Rejected from the header alone: the decoder must not wait for 4 GiB that never come.
    with pytest.raises(ProtocolError):
        FrameDecoder().feed(struct.pack(">I", size))


def test_length_prefix_at_the_limit_waits() -> None:
    decoder = FrameDecoder()
    assert decoder.feed(struct.pack(">I", MAX_FRAME_SIZE) + b"\x90") == []
    assert decoder.pending == HEADER_SIZE + 1


def test_limit_is_enforced_on_both_sides(monkeypatch: pytest.MonkeyPatch) -> None:
    msg = m.Fatal("x" * 200)
    data = encode_frame([msg])
    monkeypatch.setattr(codec, "MAX_FRAME_SIZE", 100)
    with pytest.raises(ProtocolError):
        encode_frame([msg])
    with pytest.raises(ProtocolError):
        FrameDecoder().feed(data[:HEADER_SIZE])
    assert decode_all(encode_frame([m.Fatal("short")])) == [m.Fatal("short")]


@pytest.mark.parametrize(
    "payload",
    [
        b"",  # a zero-length frame holds no msgpack value at all
        b"\xc1",  # the one byte msgpack never uses
        b"\x92\x01",  # an array of two that holds one item
        b"\xa3ab",  # a string cut short
        b"\xa2\xff\xfe",  # a string that is not UTF-8
        b"\x90\x90",  # two values where one belongs
        b"\x91\x92\x01\x81\x01\x02",  # a map with an integer key (not allowed)
    ],
)
def test_garbage_msgpack(payload: bytes) -> None:
    with pytest.raises(ProtocolError):
        FrameDecoder().feed(frame(payload))
    with pytest.raises(ProtocolError):
        decode_payload(payload)


@pytest.mark.parametrize("body", [{}, {"0": {}}, 0, "messages", None, True, 1.5, b"\x90"])
def test_payload_not_a_list(body: Any) -> None:
    with pytest.raises(ProtocolError):
        FrameDecoder().feed(packed(body))


SHUTDOWN_TAG = codec._TAG_OF[m.Shutdown]
ABORT_TAG = codec._TAG_OF[m.Abort]


@pytest.mark.parametrize(
    "entry",
    [
        SHUTDOWN_TAG,
        [],
        [SHUTDOWN_TAG],
        [SHUTDOWN_TAG, {}, {}],
        {"0": {}},
        [str(SHUTDOWN_TAG), {}],
        [float(SHUTDOWN_TAG), {}],
        [None, {}],
        [True, {"request_ids": ["a"]}],  # a bool is not a tag, even though True == 1
        [SHUTDOWN_TAG, []],
        [SHUTDOWN_TAG, None],
        [SHUTDOWN_TAG, "{}"],
        [ABORT_TAG, [["a"]]],
        [ABORT_TAG, ["request_ids", ["a"]]],
    ],
)
def test_entry_not_tag_and_map(entry: Any) -> None:
    with pytest.raises(ProtocolError):
        decode_all(packed([entry]))


def test_one_bad_entry_spoils_the_frame() -> None:
    good = [SHUTDOWN_TAG, {}]
    assert decode_all(packed([good])) == [m.Shutdown()]
    with pytest.raises(ProtocolError):
        decode_all(packed([good, [SHUTDOWN_TAG, None], good]))


@pytest.mark.parametrize("tag", [len(codec._TAGGED), len(codec._TAGGED) + 7, -1, 2**40])
def test_unknown_tag(tag: int) -> None:
    with pytest.raises(ProtocolError, match="tag"):
        decode_all(packed([[tag, {}]]))


# ---------------------------------------------------------------- field errors


def _resolved_fields(cls: type) -> tuple[attrs.Attribute, ...]:
    attrs.resolve_types(cls)
    return attrs.fields(cls)


def _wrong_values(tp: Any) -> list[Any]:
    """Values of the wrong msgpack type for a field annotated ``tp``."""
    optional = False
    if isinstance(tp, types.UnionType) or typing.get_origin(tp) is typing.Union:
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        assert len(args) == 1, tp
        (tp,), optional = args, True
    maybe_none = [] if optional else [None]
    if tp is bool:
        return [1, 0, "true", "", 1.0, *maybe_none]
    if tp is int:
        return ["7", 7.5, 7.0, True, False, [7], b"7", *maybe_none]
    if tp is float:
        return ["0.5", True, [0.5], *maybe_none]
    if tp is str:
        return [5, 5.5, True, ["a"], {"a": "b"}, b"bytes", *maybe_none]
    if isinstance(tp, type) and issubclass(tp, m.FinishReason):
        return ["bogus", "STOP", 1, True, ["stop"], *maybe_none]
    if attrs.has(tp):
        return [5, "x", [], [1, 2], True, *maybe_none]
    if typing.get_origin(tp) is tuple:
        item = typing.get_args(tp)[0]
        return ["ab", {"a": 1}, 3, *([x] for x in _wrong_values(item)), *maybe_none]
    raise AssertionError(f"no wrong values for {tp!r}")


def _field_paths(cls: type, prefix: tuple[Any, ...] = ()) -> list[tuple[tuple[Any, ...], Any]]:
    """(path into the unstructured body, annotated type) for every field, nested ones too."""
    out: list[tuple[tuple[Any, ...], Any]] = []
    for field in _resolved_fields(cls):
        path = (*prefix, field.name)
        out.append((path, field.type))
        if attrs.has(field.type):
            out.extend(_field_paths(field.type, path))
        elif typing.get_origin(field.type) is tuple and attrs.has(typing.get_args(field.type)[0]):
            out.extend(_field_paths(typing.get_args(field.type)[0], (*path, 0)))
    return out


def _nested_classes(cls: type) -> list[tuple[tuple[Any, ...], type]]:
    """(path, class) for the message and every attrs class inside it."""
    return (
        [((), cls)]
        + [(path, tp) for path, tp in _field_paths(cls) if attrs.has(tp)]
        + [
            ((*path, 0), typing.get_args(tp)[0])
            for path, tp in _field_paths(cls)
            if typing.get_origin(tp) is tuple and attrs.has(typing.get_args(tp)[0])
        ]
    )


def _body(msg: Any) -> Any:
    return converter.unstructure(msg)


def _get(body: Any, path: tuple[Any, ...]) -> Any:
    for key in path:
        body = body[key]
    return body


def _frame_with(msg: Any, body: Any) -> bytes:
    return packed([[codec._TAG_OF[type(msg)], body]])


def _cases(make: Any) -> list[Any]:
    """Cases for the map-encoded messages; the positional hot ones are tested further down."""
    cases = []
    for msg in EXAMPLES:
        if type(msg) in codec._POSITIONAL:
            continue
        for case in make(msg):
            cases.append(pytest.param(msg, *case, id=f"{type(msg).__name__}-{case[0]}"))
    return cases


def _wrong_type_cases(msg: Any) -> list[tuple[str, tuple[Any, ...], Any]]:
    body = _body(msg)
    out = []
    for path, tp in _field_paths(type(msg)):
        try:
            _get(body, path)
        except IndexError:  # an empty tuple in this example: nothing to corrupt
            continue
        for i, wrong in enumerate(_wrong_values(tp)):
            out.append((f"{'.'.join(map(str, path))}#{i}", path, wrong))
    return out


def _set(body: Any, path: tuple[Any, ...], value: Any) -> None:
    _get(body, path[:-1])[path[-1]] = value


@pytest.mark.parametrize(("msg", "label", "path", "wrong"), _cases(_wrong_type_cases))
def test_wrong_field_type(msg: Any, label: str, path: tuple[Any, ...], wrong: Any) -> None:
    body = _body(msg)
    _set(body, path, wrong)
    with pytest.raises(ProtocolError, match=type(msg).__name__):
        decode_all(_frame_with(msg, body))


def _missing_cases(msg: Any) -> list[tuple[str, tuple[Any, ...]]]:
    body = _body(msg)
    out = []
    for prefix, cls in _nested_classes(type(msg)):
        try:
            _get(body, prefix)
        except IndexError:
            continue
        for field in _resolved_fields(cls):
            if field.default is attrs.NOTHING:
                path = (*prefix, field.name)
                out.append(("/".join(map(str, path)), path))
    return out


@pytest.mark.parametrize(("msg", "label", "path"), _cases(_missing_cases))
def test_missing_field(msg: Any, label: str, path: tuple[Any, ...]) -> None:
    body = _body(msg)
    del _get(body, path[:-1])[path[-1]]
    with pytest.raises(ProtocolError, match=type(msg).__name__):
        decode_all(_frame_with(msg, body))


def _extra_cases(msg: Any) -> list[tuple[str, tuple[Any, ...]]]:
    body = _body(msg)
    out = []
    for prefix, _cls in _nested_classes(type(msg)):
        try:
            _get(body, prefix)
        except IndexError:
            continue
        out.append(("/".join(map(str, (*prefix, "extra"))), prefix))
    return out


@pytest.mark.parametrize(("msg", "label", "prefix"), _cases(_extra_cases))
@pytest.mark.parametrize("value", [None, 0, "new in v2"])
def test_extra_field(msg: Any, label: str, prefix: tuple[Any, ...], value: Any) -> None:
    body = _body(msg)
    _get(body, prefix)["added_in_a_later_version"] = value
    with pytest.raises(ProtocolError, match=type(msg).__name__):
        decode_all(_frame_with(msg, body))


def test_optional_fields_may_be_left_out() -> None:
    """Fields with defaults are optional on the wire; the defaults come back."""
    body = {"request_id": "r", "prompt_token_ids": [1, 2], "params": {}}
    assert decode_all(packed([[codec._TAG_OF[m.AddRequest], body]])) == [
        m.AddRequest("r", (1, 2), SamplingParams())
    ]


def test_an_int_is_accepted_for_a_float() -> None:
    """msgpack packs 1.0 as a float, but an integer where a float belongs loses nothing."""
    body = _body(m.Stats(1, 2, 0.5, 3, 4)) | {"kv_cache_usage": 1}
    (back,) = decode_all(packed([[codec._TAG_OF[m.Stats], body]]))
    assert back == m.Stats(1, 2, 1.0, 3, 4)
    assert isinstance(back.kv_cache_usage, float)


@pytest.mark.parametrize(
    "params",
    [
        {"temperature": -1.0},
        {"temperature": float("nan")},
        {"top_p": 0.0},
        {"top_p": 1.5},
        {"top_k": -2},
        {"min_p": -0.1},
        {"min_p": 1.01},
        {"max_tokens": 0},
        {"max_tokens": -5},
        {"min_tokens": -1},
        {"stop_token_ids": [3, -1]},
        {"think_budget": 0, "think_end": [5]},
        {"think_budget": 8},
        {"think_budget": 8, "think_end": []},
        {"think_budget": 8, "think_end": [5], "grammar": "start: /a+/"},
        {"think_end": [-1]},
    ],
    ids=repr,
)
def test_sampling_params_validated_inside_add_request(params: dict[str, Any]) -> None:
    body = {"request_id": "r", "prompt_token_ids": [1], "params": params}
    with pytest.raises(ProtocolError, match="AddRequest"):
        decode_all(packed([[codec._TAG_OF[m.AddRequest], body]]))


# ---------------------------------------------------------------- SamplingParams


@pytest.mark.parametrize(
    "kwargs",
    [
        {"top_p": 0},
        {"top_p": 0.0},
        {"top_p": 1.0000001},
        {"top_p": 2},
        {"max_tokens": 0},
        {"max_tokens": -1},
        {"temperature": -0.01},
        {"top_k": -2},
        {"min_p": -0.5},
        {"min_p": 1.5},
        {"min_tokens": -1},
        {"stop_token_ids": (-1,)},
        {"stop_token_ids": (1, 2, -3)},
        {"stop_token_ids": ("1",)},
        {"stop_token_ids": (1.5,)},
        {"seed": 1.5},
        {"seed": "7"},
        {"temperature": "warm"},
        {"think_budget": 0, "think_end": (5,)},
        {"think_budget": -3, "think_end": (5,)},
        {"think_budget": 8},
        {"think_budget": 8, "think_end": ()},
        {"think_budget": 8, "think_end": (5,), "grammar": "start: /a+/"},
        {"think_end": (5, -1)},
        {"think_end": ("5",)},
    ],
    ids=repr,
)
def test_sampling_params_rejects(kwargs: dict[str, Any]) -> None:
    with pytest.raises((ValueError, TypeError)):
        SamplingParams(**kwargs)


def test_sampling_params_accepts_edges() -> None:
    p = SamplingParams(top_p=1, temperature=0, top_k=-1, min_p=1, max_tokens=1, seed=-5)
    assert p.top_p == 1.0 and isinstance(p.top_p, float)
    assert p.greedy
    assert SamplingParams(top_k=1, temperature=0.8).greedy
    assert not SamplingParams(temperature=0.8).greedy
    assert SamplingParams(stop_token_ids=[0, 3]).stop_token_ids == (0, 3)


# ---------------------------------------------------------------- positional hot messages

_LP = m.TokenLogprobs(3, -0.5, 2, (3, 9), (-0.5, -1.25))
_STEP = m.StepOutputs((
    m.RequestOutput("a", (1, 2), 3, 2, 1, m.FinishReason.STOP, 2, (_LP,), (_LP, _LP),
                    (0.25, 0.5)),
    m.RequestOutput("b", (7,), 5, 1),
))


def test_step_outputs_travel_as_arrays() -> None:
    (entry,) = msgpack.unpackb(encode_frame([_STEP])[4:])
    assert entry[0] == codec._TAG_OF[m.StepOutputs]
    assert entry[1][1] == ["b", [7], 5, 1, 0, None, None, None, None, None]
    assert entry[1][0][9] == [0.25, 0.5]
    assert decode_all(encode_frame([_STEP])) == [_STEP]


@pytest.mark.parametrize(("index", "wrong"), [
    (0, 5), (1, "12"), (1, [1, "2"]), (1, [True]), (2, 3.0), (3, None), (4, "0"),
    (5, "STOP"), (5, 1), (6, "2"), (7, {}), (7, [[1, 2]]), (7, [[3, -0.5, 2, [3], ["x"]]]),
    (8, "x"), (8, [[3, 1, 2, [], []]]), (9, [1.0]), (9, [1, 2.0]), (9, "x"),
])
def test_positional_output_with_a_wrong_value(index: int, wrong: Any) -> None:
    body = converter.unstructure(_STEP)
    body[0][index] = wrong
    with pytest.raises(ProtocolError, match="StepOutputs"):
        decode_all(packed([[codec._TAG_OF[m.StepOutputs], body]]))


@pytest.mark.parametrize("change", ["short", "long", "map", "not-a-list"])
def test_positional_output_with_a_wrong_shape(change: str) -> None:
    body = converter.unstructure(_STEP)
    if change == "short":
        body[0] = body[0][:-1]
    elif change == "long":
        body[0] = [*body[0], "added_in_a_later_version"]
    elif change == "map":
        body = {"outputs": body}
    else:
        body[0] = "a"
    with pytest.raises(ProtocolError, match="StepOutputs"):
        decode_all(packed([[codec._TAG_OF[m.StepOutputs], body]]))


def test_a_map_message_sent_as_an_array_is_refused() -> None:
    body = list(converter.unstructure(m.Stats(1, 2, 0.5, 3, 4)).values())
    with pytest.raises(ProtocolError, match="Stats"):
        decode_all(packed([[codec._TAG_OF[m.Stats], body]]))
