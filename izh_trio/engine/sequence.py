"""A request as the engine sees it: tokens, KV blocks, and where it is in its lifecycle."""

from __future__ import annotations

import enum
import time

import attrs

from izh_trio.wire import FinishReason, SamplingParams, TokenLogprobs


class SequenceStatus(enum.Enum):
    """WAITING -> RUNNING -> FINISHED, with RUNNING -> WAITING on preemption."""

    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


_TRANSITIONS = {
    SequenceStatus.WAITING: {SequenceStatus.RUNNING, SequenceStatus.FINISHED},
    SequenceStatus.RUNNING: {SequenceStatus.WAITING, SequenceStatus.FINISHED},
    SequenceStatus.FINISHED: set(),
}


@attrs.define(eq=False, repr=False)
class Sequence:
    request_id: str
    token_ids: list[int]  # prompt, then every generated token
    params: SamplingParams
    #: The eos ids plus the request's stop ids; empty when ``ignore_eos`` drops the eos part.
    stop_token_ids: frozenset[int]
    priority: int = 0
    arrival: int = 0  # tie-break within a priority: first come, first served
    cache_salt: str | None = None
    #: The LoRA adapter's load id (see ``lora/manager.py``); None: the base model.
    lora_id: int | None = None
    num_prompt_tokens: int = attrs.field(init=False)
    status: SequenceStatus = attrs.field(init=False, default=SequenceStatus.WAITING)
    #: Tokens whose K/V is in the cache; the next step computes from here.
    num_computed_tokens: int = attrs.field(init=False, default=0)
    #: Prompt tokens served from the prefix cache at first admission.
    num_cached_tokens: int = attrs.field(init=False, default=0)
    block_table: list[int] = attrs.field(init=False, factory=list)
    #: Hash chain of this sequence's full blocks, filled lazily by the block manager.
    block_hashes: list[bytes] = attrs.field(init=False, factory=list)
    #: Leading blocks of the table already offered to the prefix cache.
    num_published_blocks: int = attrs.field(init=False, default=0)
    finish_reason: FinishReason | None = attrs.field(init=False, default=None)
    #: The eos or stop token that ended it.
    stop_token_id: int | None = attrs.field(init=False, default=None)
    #: Prompt logprobs gathered chunk by chunk, sent with the first token.
    prompt_logprobs: list[TokenLogprobs] = attrs.field(init=False, factory=list)
    #: The LoRA slot its adapter occupies, set while it runs (the scheduler pins it).
    lora_slot: int | None = attrs.field(init=False, default=None)
    #: When the core took it, and when a step first ran it (its queue and prefill times).
    added_at: float = attrs.field(init=False, factory=time.monotonic)
    scheduled_at: float | None = attrs.field(init=False, default=None)

    def __attrs_post_init__(self) -> None:
        self.num_prompt_tokens = len(self.token_ids)

    def __repr__(self) -> str:
        return (
            f"<Sequence {self.request_id} {self.status.name} computed="
            f"{self.num_computed_tokens}/{self.num_tokens} blocks={len(self.block_table)}>"
        )

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def sort_key(self) -> tuple[int, int]:
        return (self.priority, self.arrival)

    def transition(self, new: SequenceStatus) -> None:
        if new not in _TRANSITIONS[self.status]:
            raise RuntimeError(f"{self!r}: illegal transition to {new.name}")
        self.status = new

    def finish(self, reason: FinishReason) -> None:
        self.transition(SequenceStatus.FINISHED)
        self.finish_reason = reason
