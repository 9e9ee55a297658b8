"""Sampling parameters: what the frontend resolved, what the engine obeys.

The frontend fills every field (request values over ``generation_config.json`` defaults), so
the engine never has to guess; validation here catches a frontend bug before it reaches a kernel.
"""

from __future__ import annotations

from collections.abc import Iterable

import attrs
from attrs import validators as v

from izh_trio.wire.converters import ints

_non_negative = v.ge(0.0)


def _token_ids(_inst: object, attribute: attrs.Attribute[tuple[int, ...]],
               value: tuple[int, ...]) -> None:
    if any(not isinstance(t, int) or t < 0 for t in value):
        raise ValueError(f"{attribute.name} must hold non-negative token ids, got {value!r}")


def _bias_pairs(pairs: Iterable[tuple[int, float]]) -> tuple[tuple[int, float], ...]:
    return tuple((int(t), float(b)) for t, b in pairs)


@attrs.frozen
class SamplingParams:
    """One request's decoding recipe. ``temperature == 0`` means greedy."""

    max_tokens: int = attrs.field(default=16, validator=v.ge(1))
    temperature: float = attrs.field(default=1.0, converter=float, validator=_non_negative)
    top_p: float = attrs.field(default=1.0, converter=float, validator=[v.gt(0.0), v.le(1.0)])
    #: 0 (or -1, vLLM's spelling) disables top-k.
    top_k: int = attrs.field(default=0, validator=v.ge(-1))
    min_p: float = attrs.field(default=0.0, converter=float, validator=[v.ge(0.0), v.le(1.0)])
    #: A seed makes this request's samples independent of whatever else is in the batch.
    seed: int | None = attrs.field(default=None, validator=v.optional(v.instance_of(int)))
    ignore_eos: bool = False
    #: Extra ids that end the request; the checkpoint's eos ids are added by the engine.
    stop_token_ids: tuple[int, ...] = attrs.field(
        default=(), converter=ints, validator=_token_ids
    )
    min_tokens: int = attrs.field(default=0, validator=v.ge(0))
    #: HF-style: logits of tokens already in the prompt or output are divided (if positive) or
    #: multiplied (if negative) by this.
    repetition_penalty: float = attrs.field(default=1.0, converter=float, validator=v.gt(0.0))
    #: OpenAI-style, on output tokens: ``logit -= presence * seen + frequency * count``.
    presence_penalty: float = attrs.field(default=0.0, converter=float,
                                          validator=[v.ge(-2.0), v.le(2.0)])
    frequency_penalty: float = attrs.field(default=0.0, converter=float,
                                           validator=[v.ge(-2.0), v.le(2.0)])
    #: (token id, bias) pairs added to the logits before sampling.
    logit_bias: tuple[tuple[int, float], ...] = attrs.field(
        default=(), converter=_bias_pairs)
    #: Top logprobs to report per sampled token (0: only the sampled one); None: no logprobs.
    logprobs: int | None = attrs.field(default=None, validator=v.optional(v.ge(0)))
    #: The same for every prompt position after the first; None: none.
    prompt_logprobs: int | None = attrs.field(default=None, validator=v.optional(v.ge(0)))
    #: Guided decoding: an llguidance grammar (lark, or its JSON form) the output must match,
    #: and end within ``max_tokens``.
    grammar: str | None = None
    #: A thinking budget: once this many output tokens are out and none of them was
    #: ``think_end[0]``, the engine forces ``think_end`` as the next tokens (``think_budget.py``
    #: in the engine). None: no budget.
    think_budget: int | None = attrs.field(default=None, validator=v.optional(v.ge(1)))
    #: The tokens that close a think block (Qwen3: ``</think>``, ``\n\n``), forced in order.
    think_end: tuple[int, ...] = attrs.field(default=(), converter=ints, validator=_token_ids)

    def __attrs_post_init__(self) -> None:
        if self.think_budget is not None and not self.think_end:
            raise ValueError("think_budget needs think_end: the tokens that close a think block")
        if self.think_budget is not None and self.grammar is not None:
            raise ValueError("think_budget and grammar cannot be combined: a constrained "
                             "output has no room for a forced think end")

    @property
    def penalized(self) -> bool:
        return (self.repetition_penalty != 1.0 or self.presence_penalty != 0.0
                or self.frequency_penalty != 0.0)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1
