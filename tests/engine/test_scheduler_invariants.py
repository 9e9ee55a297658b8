"""Scheduler + BlockManager under random adds, aborts and steps: the invariants always hold.

No model: a step's "sampled" token is random, and ``advance`` is called as the engine core
calls it. Small block pools and budgets force chunked prefill, preemption and prefix hits.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from izh_trio.engine.block_manager import BlockManager
from izh_trio.engine.scheduler import ScheduledSeq, Scheduler, SchedulerConfig
from izh_trio.engine.sequence import Sequence, SequenceStatus
from izh_trio.wire import FinishReason, SamplingParams

ALPHABET = st.integers(0, 2)  # a tiny alphabet makes shared prefixes (and hits) common


@st.composite
def prompts(draw: st.DrawFn, max_len: int = 40) -> list[int]:
    """A short pattern repeated to a length drawn evenly, so long prompts are common too."""
    length = draw(st.integers(1, max_len))
    pattern = draw(st.lists(ALPHABET, min_size=1, max_size=4))
    return (pattern * length)[:length]


def make_seq(
    rid: str, prompt: list[int], max_tokens: int, priority: int = 0, salt: str | None = None
) -> Sequence:
    return Sequence(
        request_id=rid,
        token_ids=list(prompt),
        params=SamplingParams(max_tokens=max_tokens),
        stop_token_ids=frozenset(),
        priority=priority,
        cache_salt=salt,
    )


def make_scheduler(
    num_blocks: int, block_size: int, max_num_seqs: int, max_num_batched_tokens: int
) -> Scheduler:
    bm = BlockManager(num_blocks, block_size)
    # As the model runner does: the context never exceeds what the pool can hold.
    config = SchedulerConfig(max_num_seqs, max_num_batched_tokens, num_blocks * block_size)
    return Scheduler(config, bm)


def check_plan(sched: Scheduler, plan: list[ScheduledSeq], had_work: bool) -> None:
    """What one ``schedule()`` returned, checked before the step runs."""
    cfg, bm = sched.config, sched.bm
    if had_work:
        assert plan, "there is work but nothing was scheduled"
    seqs = [item.seq for item in plan]
    assert len({id(s) for s in seqs}) == len(seqs), "a sequence scheduled twice"
    assert sum(item.num_new_tokens for item in plan) <= cfg.max_num_batched_tokens
    assert len(plan) <= cfg.max_num_seqs
    assert len(sched.running) <= cfg.max_num_seqs
    running = {id(s) for s in sched.running}
    for item in plan:
        seq = item.seq
        assert item.num_new_tokens >= 1
        assert seq.status is SequenceStatus.RUNNING and id(seq) in running
        assert seq.num_computed_tokens + item.num_new_tokens <= seq.num_tokens
        # Exactly the blocks the chunk's context needs: the model runner passes whole tables.
        context = seq.num_computed_tokens + item.num_new_tokens
        assert len(seq.block_table) == bm.blocks_needed(context), (seq, item)


def run_step(
    sched: Scheduler, rng: random.Random, tokens: dict[str, list[int]]
) -> list[tuple[Sequence, FinishReason]]:
    """One engine step: schedule, 'sample', advance, finish. ``tokens`` records outputs."""
    had_work = sched.has_work
    plan = sched.schedule()
    check_plan(sched, plan, had_work)
    samples = [item.samples for item in plan]  # before advance moves num_computed_tokens
    finished = []
    for item, sampled in zip(plan, samples, strict=True):
        seq = item.seq
        token = rng.randrange(3) if sampled else None
        before = seq.num_computed_tokens
        reason = sched.advance(item, token)
        assert seq.num_computed_tokens == before + item.num_new_tokens
        if token is None:
            assert reason is None
            continue
        tokens[seq.request_id].append(token)
        assert seq.output_token_ids == tokens[seq.request_id]
        if reason is not None:
            # No stop tokens, and the context limit is never the tighter one.
            assert reason is FinishReason.LENGTH
            assert seq.num_output_tokens == seq.params.max_tokens
            sched.finish(seq, reason)
            assert seq.status is SequenceStatus.FINISHED and seq.finish_reason is reason
            assert seq.block_table == []
            finished.append((seq, reason))
        else:
            assert seq.num_output_tokens < seq.params.max_tokens
    return finished


def check_state(sched: Scheduler, live: dict[str, Sequence], tokens: dict[str, list[int]]) -> None:
    bm = sched.bm
    bm.check_invariants(list(live.values()))
    waiting, running = sched.waiting, sched.running
    assert len(waiting) + len(running) == len(live)
    assert {id(s) for s in waiting} | {id(s) for s in running} == {id(s) for s in live.values()}
    assert sched.by_id == live
    assert sched.has_work == bool(live)
    assert [s.sort_key for s in waiting] == sorted(s.sort_key for s in waiting)
    assert [s.sort_key for s in running] == sorted(s.sort_key for s in running)
    assert len(running) <= sched.config.max_num_seqs
    for seq in waiting:
        assert seq.status is SequenceStatus.WAITING
        # A waiting sequence holds nothing: preemption gave everything back.
        assert seq.block_table == [] and seq.num_computed_tokens == 0
    for seq in running:
        assert seq.status is SequenceStatus.RUNNING
        assert seq.num_computed_tokens < seq.num_tokens  # one token always left to feed
        assert len(seq.block_table) >= bm.blocks_needed(seq.num_computed_tokens)
    for rid, seq in live.items():
        assert seq.request_id == rid
        assert seq.output_token_ids == tokens[rid]  # preemption keeps the output
        assert seq.num_output_tokens < seq.params.max_tokens
        assert 0 <= seq.num_cached_tokens < seq.num_prompt_tokens
    referenced = {b for seq in live.values() for b in seq.block_table}
    assert bm.num_free_blocks == bm.num_blocks - len(referenced)
    assert bm.usage == pytest.approx(len(referenced) / bm.num_blocks)


class SchedulerMachine(RuleBasedStateMachine):
    @initialize(
        num_blocks=st.integers(4, 24),
        block_size=st.integers(2, 8),
        max_num_seqs=st.integers(1, 8),
        max_num_batched_tokens=st.integers(1, 64),
        seed=st.integers(0, 2**32 - 1),
    )
    def setup(
        self,
        num_blocks: int,
        block_size: int,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        seed: int,
    ) -> None:
        self.sched = make_scheduler(num_blocks, block_size, max_num_seqs, max_num_batched_tokens)
        self.bm = self.sched.bm
        self.rng = random.Random(seed)
        self.live: dict[str, Sequence] = {}
        self.tokens: dict[str, list[int]] = {}
        self.prompts: dict[str, list[int]] = {}
        self.next_id = 0

    @rule(
        prompt=prompts(),
        max_tokens=st.integers(1, 24),
        priority=st.integers(-2, 2),
        salt=st.none() | st.sampled_from(["", "tenant-a", "tenant-b"]),
    )
    def add(self, prompt: list[int], max_tokens: int, priority: int, salt: str | None) -> None:
        # The engine core rejects what could never fit (max_model_len is clamped to the
        # pool); here a too-long request is cut down instead, so the rule always adds.
        capacity = self.bm.num_blocks * self.bm.block_size
        max_tokens = min(max_tokens, capacity - 1)
        prompt = prompt[: capacity - max_tokens]
        assert self.bm.blocks_needed(len(prompt) + max_tokens) <= self.bm.num_blocks
        rid = f"req-{self.next_id}"
        self.next_id += 1
        seq = make_seq(rid, prompt, max_tokens, priority, salt)
        self.sched.add(seq)
        self.live[rid] = seq
        self.tokens[rid] = []
        self.prompts[rid] = list(prompt)
        with pytest.raises(ValueError):
            self.sched.add(make_seq(rid, prompt, max_tokens))

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def abort(self, data: st.DataObject) -> None:
        rid = data.draw(st.sampled_from(sorted(self.live)))
        seq = self.live.pop(rid)
        assert self.sched.abort(rid) is seq
        assert seq.status is SequenceStatus.FINISHED
        assert seq.finish_reason is FinishReason.ABORT
        assert seq.block_table == []
        assert self.sched.abort(rid) is None  # twice is a no-op

    @rule()
    def abort_unknown(self) -> None:
        assert self.sched.abort("no-such-request") is None

    @rule(n=st.integers(1, 12))
    def step(self, n: int) -> None:
        for _ in range(n):
            for seq, _reason in run_step(self.sched, self.rng, self.tokens):
                del self.live[seq.request_id]
            check_state(self.sched, self.live, self.tokens)

    @invariant()
    def consistent(self) -> None:
        check_state(self.sched, self.live, self.tokens)
        for rid, seq in self.live.items():
            assert seq.token_ids[: seq.num_prompt_tokens] == self.prompts[rid]

    def teardown(self) -> None:
        if not hasattr(self, "sched"):
            return
        for rid in list(self.live):
            assert self.sched.abort(rid) is not None
        self.live.clear()
        check_state(self.sched, self.live, self.tokens)
        assert not self.sched.has_work
        assert self.sched.schedule() == []
        assert self.bm.num_free_blocks == self.bm.num_blocks
        assert self.bm.usage == 0.0


SchedulerMachine.TestCase.settings = settings(
    max_examples=200, stateful_step_count=50, deadline=None
)
TestScheduler = SchedulerMachine.TestCase


# ---------------------------------------------------------------- run to completion


def run_to_completion(
    sched: Scheduler, seqs: list[Sequence], rng: random.Random, max_steps: int = 5000
) -> list[str]:
    """Steps until nothing is left; returns request ids in the order they finished."""
    live = {seq.request_id: seq for seq in seqs}
    tokens: dict[str, list[int]] = {rid: [] for rid in live}
    for seq in seqs:
        sched.add(seq)
    order = []
    for _ in range(max_steps):
        if not sched.has_work:
            break
        for seq, _reason in run_step(sched, rng, tokens):
            del live[seq.request_id]
            order.append(seq.request_id)
        check_state(sched, live, tokens)
    else:
        pytest.fail(f"no progress after {max_steps} steps: {sched.running} {sched.waiting}")
    assert not live
    return order


requests = st.lists(
    st.tuples(
        prompts(max_len=24),
        st.integers(1, 16),  # max_tokens
        st.integers(-1, 1),  # priority
    ),
    min_size=1,
    max_size=10,
)


@settings(max_examples=60, deadline=None)
@given(
    num_blocks=st.integers(4, 12),
    block_size=st.integers(2, 4),
    max_num_seqs=st.integers(1, 8),
    max_num_batched_tokens=st.integers(1, 64),
    reqs=requests,
    seed=st.integers(0, 2**32 - 1),
)
def test_every_request_finishes_with_max_tokens(
    num_blocks: int,
    block_size: int,
    max_num_seqs: int,
    max_num_batched_tokens: int,
    reqs: list[tuple[list[int], int, int]],
    seed: int,
) -> None:
    sched = make_scheduler(num_blocks, block_size, max_num_seqs, max_num_batched_tokens)
    capacity = num_blocks * block_size
    seqs = []
    for i, (prompt, max_tokens, priority) in enumerate(reqs):
        max_tokens = min(max_tokens, capacity - 1)
        seqs.append(make_seq(f"r{i}", prompt[: capacity - max_tokens], max_tokens, priority))
    order = run_to_completion(sched, seqs, random.Random(seed))
    assert sorted(order) == sorted(s.request_id for s in seqs)
    for seq in seqs:
        assert seq.status is SequenceStatus.FINISHED
        assert seq.finish_reason is FinishReason.LENGTH
        assert seq.num_output_tokens == seq.params.max_tokens
    assert sched.bm.num_free_blocks == sched.bm.num_blocks
    assert sched.bm.usage == 0.0


def test_heavy_preemption_still_finishes_everything() -> None:
    # Each request alone needs the whole pool by its end: they can't all run together.
    sched = make_scheduler(num_blocks=4, block_size=2, max_num_seqs=4, max_num_batched_tokens=64)
    seqs = [make_seq(f"r{i}", [i % 3, 1], max_tokens=6) for i in range(6)]
    order = run_to_completion(sched, seqs, random.Random(0))
    assert sched.num_preemptions > 0
    assert len(order) == 6
    assert all(s.num_output_tokens == 6 for s in seqs)


def test_priority_preempts_with_one_slot() -> None:
    sched = make_scheduler(num_blocks=16, block_size=4, max_num_seqs=1, max_num_batched_tokens=32)
    rng = random.Random(1)
    low = make_seq("low", [0, 1, 2, 0, 1], max_tokens=8, priority=0)
    live = {"low": low}
    tokens: dict[str, list[int]] = {"low": []}
    sched.add(low)
    for _ in range(3):
        run_step(sched, rng, tokens)
    assert low.status is SequenceStatus.RUNNING and low.num_output_tokens == 3
    kept = list(low.output_token_ids)

    high = make_seq("high", [2, 2, 2], max_tokens=4, priority=-1)
    sched.add(high)
    live["high"] = high
    tokens["high"] = []
    plan = sched.schedule()
    check_plan(sched, plan, True)
    assert [item.seq for item in plan] == [high]
    assert sched.running == [high] and sched.waiting == [low]
    assert sched.num_preemptions == 1
    assert low.output_token_ids == kept and low.block_table == []
    for item in plan:
        run_item = item.samples
        sched.advance(item, rng.randrange(3) if run_item else None)
        tokens[item.seq.request_id] = list(item.seq.output_token_ids)
    check_state(sched, live, tokens)

    order = []
    while sched.has_work:
        for seq, _ in run_step(sched, rng, tokens):
            del live[seq.request_id]
            order.append(seq.request_id)
        check_state(sched, live, tokens)
    assert order == ["high", "low"]
    assert high.num_output_tokens == 4 and low.num_output_tokens == 8
    assert low.output_token_ids[:3] == kept


def test_equal_priority_is_first_come_first_served() -> None:
    sched = make_scheduler(num_blocks=16, block_size=4, max_num_seqs=1, max_num_batched_tokens=32)
    rng = random.Random(2)
    first = make_seq("first", [0, 1], max_tokens=3)
    tokens: dict[str, list[int]] = {"first": [], "second": []}
    sched.add(first)
    run_step(sched, rng, tokens)
    second = make_seq("second", [1, 0], max_tokens=3)
    sched.add(second)
    order = []
    while sched.has_work:
        order += [seq.request_id for seq, _ in run_step(sched, rng, tokens)]
    assert order == ["first", "second"]
    assert sched.num_preemptions == 0


def test_waiting_request_never_preempts_a_better_one() -> None:
    # Blocks are the limit here, not max_num_seqs: the better request keeps its blocks.
    sched = make_scheduler(num_blocks=4, block_size=2, max_num_seqs=8, max_num_batched_tokens=64)
    rng = random.Random(3)
    tokens: dict[str, list[int]] = {"best": [], "worse": []}
    best = make_seq("best", [0, 1, 2, 0, 1], max_tokens=3, priority=-5)
    sched.add(best)
    run_step(sched, rng, tokens)  # best holds 3 of 4 blocks
    worse = make_seq("worse", [2, 2, 2], max_tokens=2, priority=5)
    sched.add(worse)
    plan = sched.schedule()
    assert [item.seq for item in plan] == [best]
    assert sched.waiting == [worse] and sched.num_preemptions == 0


def test_better_request_preempts_for_blocks() -> None:
    sched = make_scheduler(num_blocks=4, block_size=2, max_num_seqs=8, max_num_batched_tokens=64)
    rng = random.Random(4)
    tokens: dict[str, list[int]] = {"worse": [], "best": []}
    worse = make_seq("worse", [0, 1, 2, 0, 1], max_tokens=3, priority=5)
    sched.add(worse)
    run_step(sched, rng, tokens)
    best = make_seq("best", [2, 2, 2], max_tokens=2, priority=-5)
    sched.add(best)
    plan = sched.schedule()
    assert [item.seq for item in plan] == [best]
    assert sched.waiting == [worse] and sched.num_preemptions == 1
    assert worse.output_token_ids == tokens["worse"] and len(tokens["worse"]) == 1


def test_chunked_prefill_respects_the_budget() -> None:
    sched = make_scheduler(num_blocks=16, block_size=4, max_num_seqs=4, max_num_batched_tokens=5)
    seq = make_seq("long", [1] * 23, max_tokens=2)
    tokens: dict[str, list[int]] = {"long": []}
    sched.add(seq)
    chunks = []
    while sched.has_work:
        plan = sched.schedule()
        check_plan(sched, plan, True)
        chunks.append([(item.num_new_tokens, item.samples) for item in plan])
        for item, sampled in [(item, item.samples) for item in plan]:
            token = 1 if sampled else None
            if token is not None:
                tokens["long"].append(token)
            if (reason := sched.advance(item, token)) is not None:
                sched.finish(item.seq, reason)
    assert chunks == [
        [(5, False)],
        [(5, False)],
        [(5, False)],
        [(5, False)],
        [(3, True)],  # prefill done: the first token
        [(1, True)],  # decode: the second
    ]
    assert seq.output_token_ids == [1, 1]


def test_second_request_starts_from_the_cached_prefix() -> None:
    sched = make_scheduler(num_blocks=16, block_size=4, max_num_seqs=4, max_num_batched_tokens=64)
    rng = random.Random(5)
    prompt = [0, 1, 2, 0, 1, 2, 0, 1, 2, 0]  # two full blocks and two tokens
    tokens: dict[str, list[int]] = {"a": [], "b": [], "c": []}
    a = make_seq("a", prompt, max_tokens=2)
    sched.add(a)
    run_step(sched, rng, tokens)
    b = make_seq("b", prompt, max_tokens=2)
    c = make_seq("c", prompt, max_tokens=2, salt="other")
    sched.add(b)
    sched.add(c)
    plan = {item.seq.request_id: item.num_new_tokens for item in sched.schedule()}
    assert plan == {"a": 1, "b": 2, "c": 10}
    assert b.num_cached_tokens == 8 and c.num_cached_tokens == 0
    assert b.block_table[:2] == a.block_table[:2]
