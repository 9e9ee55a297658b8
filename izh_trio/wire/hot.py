"""Positional encodings for the per-step messages.

A ``StepOutputs`` frame goes out every engine step with one ``RequestOutput`` per running
request, so it is the protocol's hot path: those travel as flat arrays, not maps, and are
checked field by field on the way in (as strictly as the generic decoder checks the rest).
"""

from __future__ import annotations

from typing import Any

from izh_trio.wire.messages import FinishReason, RequestOutput, StepOutputs, TokenLogprobs

_REASONS = {r.value: r for r in FinishReason}


def _ints(value: Any, what: str) -> tuple[int, ...]:
    if type(value) is not list or not all(type(t) is int for t in value):
        raise TypeError(f"{what} must be an array of integers")
    return tuple(value)


def _int(value: Any, what: str) -> int:
    if type(value) is not int:
        raise TypeError(f"{what} must be an integer")
    return value


def _lp_out(t: TokenLogprobs) -> list[Any]:
    return [t.token_id, t.logprob, t.rank, list(t.top_ids), list(t.top_logprobs)]


def _lp_in(v: Any) -> TokenLogprobs:
    if type(v) is not list or len(v) != 5:
        raise TypeError("a TokenLogprobs must be an array of 5")
    token, logprob, rank, ids, lps = v
    if type(logprob) is not float or type(lps) is not list or not all(
            type(x) is float for x in lps):
        raise TypeError("logprobs must be floats")
    return TokenLogprobs(_int(token, "token_id"), logprob, _int(rank, "rank"),
                         _ints(ids, "top_ids"), tuple(lps))


def _lps_in(v: Any) -> tuple[TokenLogprobs, ...]:
    if type(v) is not list:
        raise TypeError("logprobs must be an array or null")
    return tuple(_lp_in(x) for x in v)


def _timing_in(v: Any) -> tuple[float, float]:
    if type(v) is not list or len(v) != 2 or not all(type(x) is float for x in v):
        raise TypeError("first_token_timing must be an array of 2 floats or null")
    return v[0], v[1]


def unstructure_output(o: RequestOutput) -> list[Any]:
    return [
        o.request_id, list(o.new_token_ids), o.num_prompt_tokens, o.num_output_tokens,
        o.num_cached_tokens, o.finish_reason.value if o.finish_reason else None,
        o.stop_token_id,
        None if o.logprobs is None else [_lp_out(t) for t in o.logprobs],
        None if o.prompt_logprobs is None else [_lp_out(t) for t in o.prompt_logprobs],
        None if o.first_token_timing is None else list(o.first_token_timing),
    ]


def structure_output(v: Any) -> RequestOutput:
    if type(v) is not list or len(v) != 10:
        raise TypeError("a RequestOutput must be an array of 10")
    rid, ids, n_prompt, n_out, n_cached, reason, stop, lps, prompt_lps, timing = v
    if type(rid) is not str:
        raise TypeError("request_id must be a string")
    if reason is not None and reason not in _REASONS:
        raise ValueError(f"unknown finish_reason {reason!r}")
    if stop is not None:
        _int(stop, "stop_token_id")
    return RequestOutput(
        rid, _ints(ids, "new_token_ids"), _int(n_prompt, "num_prompt_tokens"),
        _int(n_out, "num_output_tokens"), _int(n_cached, "num_cached_tokens"),
        _REASONS[reason] if reason is not None else None, stop,
        # mostly null, and this runs for every token: no call to say so
        None if lps is None else _lps_in(lps),
        None if prompt_lps is None else _lps_in(prompt_lps),
        None if timing is None else _timing_in(timing),
    )


def unstructure_step(s: StepOutputs) -> list[list[Any]]:
    return [unstructure_output(o) for o in s.outputs]


def structure_step(v: Any) -> StepOutputs:
    if type(v) is not list:
        raise TypeError("StepOutputs must be an array")
    return StepOutputs(tuple(structure_output(o) for o in v))
