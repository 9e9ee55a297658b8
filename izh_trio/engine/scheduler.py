"""Continuous batching: which sequences run this step, and how many tokens each computes.

One rule covers prefill, chunked prefill and decode: a scheduled sequence computes
``min(tokens not yet in the cache, budget left)`` tokens. Running sequences go first, in
priority order; then waiting ones are admitted while the token budget, ``max_num_seqs`` and the
free blocks allow. When blocks run out, the lowest-priority running sequence is preempted by
recompute: its blocks are freed and it rejoins the waiting queue with its output so far.

With LoRA, a running sequence pins its adapter in a slot (``lora/slots.py``); a waiting one is
admitted only when its adapter is resident or a slot can be had (free, or an unpinned adapter
evicted). Otherwise admission stops there, as when blocks run out: order is kept and the
sequence runs once a running one finishes and unpins its adapter.
"""

from __future__ import annotations

import bisect

import attrs

from izh_trio.engine.block_manager import BlockManager
from izh_trio.engine.lora.slots import LoraSlots
from izh_trio.engine.sequence import Sequence, SequenceStatus
from izh_trio.wire import FinishReason


@attrs.frozen
class SchedulerConfig:
    max_num_seqs: int = attrs.field(validator=attrs.validators.ge(1))
    max_num_batched_tokens: int = attrs.field(validator=attrs.validators.ge(1))
    max_model_len: int = attrs.field(validator=attrs.validators.ge(1))


@attrs.frozen
class ScheduledSeq:
    seq: Sequence
    num_new_tokens: int

    @property
    def samples(self) -> bool:
        """Whether this chunk reaches the end of the sequence, so a token is sampled."""
        return self.seq.num_computed_tokens + self.num_new_tokens == self.seq.num_tokens


class Scheduler:
    def __init__(self, config: SchedulerConfig, block_manager: BlockManager,
                 loras: LoraSlots | None = None) -> None:
        self.config = config
        self.bm = block_manager
        self.loras = loras
        self.waiting: list[Sequence] = []  # sorted by sort_key
        # Sorted by sort_key too: kept so by insort, as a sequence's key never changes.
        self.running: list[Sequence] = []
        self.by_id: dict[str, Sequence] = {}
        self.num_preemptions = 0
        self._arrivals = 0

    # ------------------------------------------------------------------ membership
    def add(self, seq: Sequence) -> None:
        if seq.request_id in self.by_id:
            raise ValueError(f"request id {seq.request_id!r} is already in use")
        seq.arrival = self._arrivals
        self._arrivals += 1
        self.by_id[seq.request_id] = seq
        bisect.insort(self.waiting, seq, key=lambda s: s.sort_key)

    def abort(self, request_id: str) -> Sequence | None:
        seq = self.by_id.get(request_id)
        if seq is not None:
            self._retire(seq, FinishReason.ABORT)
        return seq

    def finish(self, seq: Sequence, reason: FinishReason) -> None:
        self._retire(seq, reason)

    def _retire(self, seq: Sequence, reason: FinishReason) -> None:
        if seq.status is SequenceStatus.RUNNING:
            self.running.remove(seq)
            self._unpin(seq)
        else:
            self.waiting.remove(seq)
        self.bm.free(seq)
        seq.finish(reason)
        del self.by_id[seq.request_id]

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    # ------------------------------------------------------------------ the step plan
    def schedule(self) -> list[ScheduledSeq]:
        plan: dict[Sequence, int] = {}
        budget = self.config.max_num_batched_tokens

        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            n = min(seq.num_tokens - seq.num_computed_tokens, budget)
            ok, refund = self._allocate(seq, n, plan)
            budget += refund
            if not ok:  # it preempted itself: it was the lowest priority left
                break
            plan[seq] = n
            budget -= n
            i += 1

        while self.waiting and budget > 0:
            seq = self.waiting[0]
            if seq.lora_id is not None and not (self.loras and
                                                self.loras.can_acquire(seq.lora_id)):
                break  # every slot's adapter is in use: wait for a running sequence to end
            if len(self.running) >= self.config.max_num_seqs:
                if not self._outranks_worst(seq):
                    break
                budget += plan.pop(self.running[-1], 0)
                self._preempt(self.running[-1])
            # Prompt logprobs need every prompt position computed: no cache hits for those.
            if not seq.block_table and seq.params.prompt_logprobs is None:
                self.bm.take_cached_prefix(seq)
            n = min(seq.num_tokens - seq.num_computed_tokens, budget)
            ok, refund = self._allocate(seq, n, plan)
            budget += refund
            if not ok:
                self.bm.free(seq)  # give back the prefix hits it took
                break
            self.waiting.pop(0)
            if seq.lora_id is not None:
                assert self.loras is not None, "a LoRA request reached an engine without LoRA"
                seq.lora_slot = self.loras.acquire(seq.lora_id)
            if not seq.num_output_tokens:
                # Prompt tokens served from the cache. Not after a preemption: the hits then
                # include the sequence's own output, and the count was already reported.
                seq.num_cached_tokens = seq.num_computed_tokens
            seq.transition(SequenceStatus.RUNNING)
            bisect.insort(self.running, seq, key=lambda s: s.sort_key)
            plan[seq] = n
            budget -= n

        return [ScheduledSeq(seq, n) for seq, n in plan.items()]

    def _allocate(self, seq: Sequence, n: int, plan: dict[Sequence, int]) -> tuple[bool, int]:
        """Allocate ``n`` slots, preempting lower-priority running sequences as needed.

        A running ``seq`` may preempt itself (it was the worst left); a waiting one only
        preempts sequences strictly below it. Returns (ok, token budget given back).
        """
        refund = 0
        while not self.bm.allocate_slots(seq, n):
            if not self.running:
                return False, refund
            victim = self.running[-1]
            if seq.status is SequenceStatus.WAITING and victim.sort_key <= seq.sort_key:
                return False, refund
            refund += plan.pop(victim, 0)
            self._preempt(victim)
            if victim is seq:
                return False, refund
        return True, refund

    def _outranks_worst(self, seq: Sequence) -> bool:
        return bool(self.running) and self.running[-1].sort_key > seq.sort_key

    def _preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self._unpin(seq)
        self.bm.free(seq)
        seq.transition(SequenceStatus.WAITING)
        bisect.insort(self.waiting, seq, key=lambda s: s.sort_key)
        self.num_preemptions += 1

    def _unpin(self, seq: Sequence) -> None:
        if seq.lora_slot is not None:
            assert self.loras is not None and seq.lora_id is not None
            self.loras.release(seq.lora_id)
            seq.lora_slot = None

    # ------------------------------------------------------------------ after the step
    def advance(self, item: ScheduledSeq, token: int | None) -> FinishReason | None:
        """Record a computed chunk (and its sampled token); return why it finished, if it did."""
        seq = item.seq
        seq.num_computed_tokens += item.num_new_tokens
        self.bm.register_full_blocks(seq)
        if token is None:
            return None
        ids = seq.token_ids
        ids.append(token)
        params = seq.params
        num_output = len(ids) - seq.num_prompt_tokens  # hot: once per sequence per step
        if num_output >= params.min_tokens and token in seq.stop_token_ids:
            seq.stop_token_id = token
            return FinishReason.STOP
        if num_output >= params.max_tokens or len(ids) >= self.config.max_model_len:
            return FinishReason.LENGTH
        return None
