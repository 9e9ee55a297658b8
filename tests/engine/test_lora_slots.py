"""LoRA slot residency (pins, LRU eviction) and the scheduler's use of it; no model."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from izh_trio.engine.block_manager import BlockManager
from izh_trio.engine.lora.slots import LoraSlots
from izh_trio.engine.scheduler import Scheduler, SchedulerConfig
from izh_trio.engine.sequence import Sequence
from izh_trio.wire import SamplingParams


def test_pinned_adapters_stay_and_idle_ones_go_least_recent_first() -> None:
    loads: list[tuple[int, int]] = []
    slots = LoraSlots(2, lambda slot, lora_id: loads.append((slot, lora_id)))
    assert slots.acquire(1) == 0 and slots.acquire(2) == 1
    assert slots.acquire(1) == 0 and loads == [(0, 1), (1, 2)]  # resident: no load
    assert not slots.can_acquire(3)  # both pinned
    slots.release(2)
    slots.release(1)
    slots.release(1)  # 1 went idle after 2: 2 is the least recently used
    assert slots.can_acquire(3) and slots.acquire(3) == 1 and slots.slot_of(2) is None
    assert slots.acquire(2) == 0 and loads[-1] == (0, 2)  # evicts 1, the only idle one
    assert slots.pinned == {3: 1, 2: 1}
    with pytest.raises(AssertionError):
        slots.release(1)


def test_forget_frees_a_slot_now_or_at_the_last_release() -> None:
    slots = LoraSlots(1, lambda slot, lora_id: None)
    slots.acquire(1)
    slots.forget(1)  # pinned: stays until released
    assert slots.slot_of(1) == 0 and not slots.can_acquire(2)
    slots.release(1)
    assert slots.slot_of(1) is None and slots.acquire(2) == 0


def _seq(rid: str, lora_id: int | None, rng: random.Random) -> Sequence:
    return Sequence(request_id=rid, token_ids=[rng.randrange(3) for _ in range(rng.randint(1, 9))],
                    params=SamplingParams(max_tokens=rng.randint(1, 6)),
                    stop_token_ids=frozenset(), lora_id=lora_id)


@pytest.mark.parametrize("seed", range(20))
def test_scheduler_never_runs_more_adapters_than_slots(seed: int) -> None:
    rng = random.Random(seed)
    num_slots = rng.randint(1, 2)
    slots = LoraSlots(num_slots, lambda slot, lora_id: None)
    sched = Scheduler(SchedulerConfig(max_num_seqs=rng.randint(1, 6), max_num_batched_tokens=8,
                                      max_model_len=64), BlockManager(12, 2), slots)
    added = 0
    for step in range(400):
        if step < 200 and rng.random() < 0.4:
            sched.add(_seq(f"r{added}", rng.choice([None, 1, 2, 3]), rng))
            added += 1
        if sched.running and rng.random() < 0.05:
            sched.abort(rng.choice(sched.running).request_id)
        plan = sched.schedule()
        running = [s for s in sched.running if s.lora_id is not None]
        assert len({s.lora_id for s in running}) <= num_slots
        assert Counter(s.lora_id for s in running) == Counter(slots.pinned)
        for seq in running:
            assert seq.lora_slot == slots.slot_of(seq.lora_id)
        for seq in sched.waiting:
            assert seq.lora_slot is None
        for item in plan:
            token = rng.randrange(3) if item.samples else None
            reason = sched.advance(item, token)
            if reason is not None:
                sched.finish(item.seq, reason)
        if step >= 200 and not sched.has_work:
            break
    assert not sched.has_work, "sequences waiting for an adapter slot never ran"
    assert not slots.pinned
