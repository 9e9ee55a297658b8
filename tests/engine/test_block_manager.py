"""BlockManager: all-or-nothing allocation, reference counts, and the prefix cache."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from izh_trio.engine.block_manager import BlockManager, chain_hash
from izh_trio.engine.sequence import Sequence
from izh_trio.wire import SamplingParams


def make_seq(rid: str, tokens: list[int], salt: str | None = None) -> Sequence:
    return Sequence(
        request_id=rid,
        token_ids=list(tokens),
        params=SamplingParams(max_tokens=8),
        stop_token_ids=frozenset(),
        cache_salt=salt,
    )


def compute(bm: BlockManager, seq: Sequence, n: int | None = None) -> None:
    """Allocate and 'compute' ``n`` more tokens (default: all the rest), as a step would."""
    if n is None:
        n = seq.num_tokens - seq.num_computed_tokens
    assert bm.allocate_slots(seq, n)
    seq.num_computed_tokens += n
    bm.register_full_blocks(seq)


def admit(bm: BlockManager, seq: Sequence) -> int:
    """Admit a fresh sequence the way the scheduler does: prefix hits, then the rest."""
    hit = bm.take_cached_prefix(seq)
    compute(bm, seq)
    return hit


def ref_counts(bm: BlockManager, seq: Sequence) -> list[int]:
    return [bm.blocks[b].ref_count for b in seq.block_table]


PROMPT = list(range(100, 110))  # 10 tokens: two full blocks of 4, and 2 over


# ---------------------------------------------------------------- allocation


def test_rejects_an_empty_pool() -> None:
    with pytest.raises(ValueError):
        BlockManager(0, 4)
    with pytest.raises(ValueError):
        BlockManager(4, 0)


def test_blocks_needed_rounds_up() -> None:
    bm = BlockManager(8, 4)
    assert [bm.blocks_needed(n) for n in range(10)] == [0, 1, 1, 1, 1, 2, 2, 2, 2, 3]


def test_fresh_manager_is_idle() -> None:
    bm = BlockManager(5, 4)
    assert bm.num_blocks == bm.num_free_blocks == 5
    assert bm.usage == 0.0
    assert bm.prefix_hit_rate == 0.0
    bm.check_invariants([])


def test_allocation_is_all_or_nothing() -> None:
    bm = BlockManager(4, 4)
    a = make_seq("a", range(9))  # three blocks
    assert bm.allocate_slots(a, 9)
    assert len(a.block_table) == 3 and bm.num_free_blocks == 1
    assert ref_counts(bm, a) == [1, 1, 1]

    b = make_seq("b", range(5))  # two blocks, one free: nothing is taken
    assert not bm.allocate_slots(b, 5)
    assert b.block_table == [] and bm.num_free_blocks == 1
    bm.check_invariants([a, b])

    assert bm.allocate_slots(b, 4)  # one block fits
    assert len(b.block_table) == 1 and bm.num_free_blocks == 0
    assert set(a.block_table).isdisjoint(b.block_table)
    assert not bm.allocate_slots(make_seq("c", [1]), 1)
    bm.check_invariants([a, b])


def test_allocation_grows_only_when_a_block_fills() -> None:
    bm = BlockManager(4, 4)
    seq = make_seq("s", range(3))
    compute(bm, seq)
    assert len(seq.block_table) == 1
    seq.token_ids.append(7)
    compute(bm, seq, 1)  # fourth token: same block
    assert len(seq.block_table) == 1
    assert bm.allocate_slots(seq, 0)  # nothing new: nothing taken
    assert len(seq.block_table) == 1
    seq.token_ids.append(8)
    compute(bm, seq, 1)  # fifth token: a second block
    assert len(seq.block_table) == 2
    assert bm.num_free_blocks == 2
    bm.check_invariants([seq])


def test_free_returns_every_block() -> None:
    bm = BlockManager(6, 4)
    a, b = make_seq("a", range(9)), make_seq("b", range(50, 55))
    compute(bm, a)
    compute(bm, b)
    assert bm.num_free_blocks == 1
    bm.free(a)
    assert a.block_table == [] and a.num_computed_tokens == 0
    assert a.num_published_blocks == 0
    assert bm.num_free_blocks == 4
    bm.check_invariants([b])
    bm.free(b)
    bm.free(b)  # an empty table: nothing to drop
    assert bm.num_free_blocks == bm.num_blocks
    bm.check_invariants([])


def test_usage_counts_only_referenced_blocks() -> None:
    bm = BlockManager(8, 4)
    a = make_seq("a", PROMPT)
    compute(bm, a)
    assert bm.usage == pytest.approx(3 / 8)
    bm.free(a)
    # Two full blocks stay cached after the free, but nobody references them.
    assert bm.usage == 0.0
    assert admit(bm, make_seq("probe", PROMPT)) == 8


def test_check_invariants_notices_a_missing_table() -> None:
    bm = BlockManager(4, 4)
    a = make_seq("a", range(5))
    compute(bm, a)
    with pytest.raises(AssertionError):
        bm.check_invariants([])
    with pytest.raises(AssertionError):
        bm.check_invariants([a, a])


# ---------------------------------------------------------------- prefix cache


def test_second_sequence_reuses_full_blocks() -> None:
    bm = BlockManager(8, 4)
    a = make_seq("a", PROMPT)
    assert admit(bm, a) == 0
    b = make_seq("b", PROMPT)
    assert bm.take_cached_prefix(b) == 8
    assert b.num_computed_tokens == 8
    assert b.block_table == a.block_table[:2]
    assert ref_counts(bm, a) == [2, 2, 1]
    assert bm.num_free_blocks == 5  # hits cost no new blocks
    compute(bm, b)  # the last two tokens get a block of b's own
    assert b.block_table[2] != a.block_table[2]
    assert bm.num_free_blocks == 4
    bm.check_invariants([a, b])
    assert bm.prefix_hits == 8 and bm.prefix_queries == 20
    assert bm.prefix_hit_rate == pytest.approx(0.4)


def test_shared_blocks_outlive_one_owner() -> None:
    bm = BlockManager(8, 4)
    a, b = make_seq("a", PROMPT), make_seq("b", PROMPT)
    admit(bm, a)
    admit(bm, b)
    shared = a.block_table[:2]
    bm.free(a)
    assert [bm.blocks[i].ref_count for i in shared] == [1, 1]
    bm.check_invariants([b])
    bm.free(b)
    assert bm.num_free_blocks == bm.num_blocks
    bm.check_invariants([])


@pytest.mark.parametrize(("length", "hit"), [(1, 0), (4, 0), (5, 4), (8, 4), (9, 8), (12, 8)])
def test_at_least_one_token_is_left_to_compute(length: int, hit: int) -> None:
    bm = BlockManager(8, 4)
    tokens = list(range(length))
    admit(bm, make_seq("a", tokens))
    b = make_seq("b", tokens)
    assert bm.take_cached_prefix(b) == hit
    assert b.num_computed_tokens == hit < b.num_tokens


def test_hits_stop_at_the_first_different_block() -> None:
    bm = BlockManager(8, 4)
    admit(bm, make_seq("a", PROMPT))
    b = make_seq("b", [*PROMPT[:4], 0, *PROMPT[5:]])  # block 2 differs
    assert bm.take_cached_prefix(b) == 4
    c = make_seq("c", [0, *PROMPT[1:]])  # block 1 differs: block 2 can't match either
    assert bm.take_cached_prefix(c) == 0


def test_hash_chain_covers_everything_before_the_block() -> None:
    bm = BlockManager(8, 2)
    admit(bm, make_seq("a", [1, 2, 3, 4, 5]))
    # The same second block after a different first one is not a hit.
    assert bm.take_cached_prefix(make_seq("b", [9, 9, 3, 4, 5])) == 0
    after_first = chain_hash(chain_hash(None, [1, 2], None), [3, 4], None)
    assert chain_hash(None, [3, 4], None) != after_first


def test_different_salt_gets_no_hits() -> None:
    bm = BlockManager(16, 4)
    admit(bm, make_seq("a", PROMPT, salt="tenant-1"))
    assert bm.take_cached_prefix(make_seq("b", PROMPT, salt="tenant-2")) == 0
    assert bm.take_cached_prefix(make_seq("c", PROMPT)) == 0
    assert bm.take_cached_prefix(make_seq("d", PROMPT, salt="tenant-1")) == 8


def test_no_salt_differs_from_every_salt_even_the_empty_one() -> None:
    bm = BlockManager(16, 4)
    admit(bm, make_seq("a", PROMPT))
    assert bm.take_cached_prefix(make_seq("b", PROMPT, salt="")) == 0
    assert bm.take_cached_prefix(make_seq("c", PROMPT, salt="x")) == 0
    assert bm.take_cached_prefix(make_seq("d", PROMPT)) == 8
    admit(bm, make_seq("e", PROMPT, salt=""))
    assert bm.take_cached_prefix(make_seq("f", PROMPT, salt="")) == 8
    assert bm.take_cached_prefix(make_seq("g", PROMPT, salt="\0")) == 0


def test_freed_blocks_stay_cached() -> None:
    bm = BlockManager(4, 4)
    a = make_seq("a", PROMPT)
    admit(bm, a)
    cached = a.block_table[:2]
    bm.free(a)
    b = make_seq("b", PROMPT)
    assert bm.take_cached_prefix(b) == 8
    assert b.block_table == cached
    assert bm.num_free_blocks == 2  # the hits came off the free list
    bm.check_invariants([b])


def test_a_hit_block_is_not_evicted_while_referenced() -> None:
    bm = BlockManager(4, 4)
    a = make_seq("a", PROMPT)
    admit(bm, a)
    bm.free(a)
    b = make_seq("b", PROMPT)
    assert bm.take_cached_prefix(b) == 8
    filler = make_seq("filler", range(500, 508))
    assert bm.allocate_slots(filler, 8)  # takes exactly the two blocks b does not hold
    assert not bm.allocate_slots(make_seq("more", [1]), 1)
    assert ref_counts(bm, b) == [1, 1]
    bm.check_invariants([b, filler])
    # Still cached, so a third request shares them.
    c = make_seq("c", PROMPT)
    assert bm.take_cached_prefix(c) == 8
    assert ref_counts(bm, c) == [2, 2]
    bm.check_invariants([b, filler, c])


def test_evicted_blocks_are_no_longer_hits() -> None:
    bm = BlockManager(3, 4)
    a = make_seq("a", PROMPT)
    admit(bm, a)
    bm.free(a)
    other = make_seq("other", range(500, 512))  # needs all three blocks
    compute(bm, other)
    bm.free(other)
    assert bm.take_cached_prefix(make_seq("b", PROMPT)) == 0
    # The other prompt is what the cache holds now.
    assert bm.take_cached_prefix(make_seq("o2", [*range(500, 512), 1])) == 12


def test_unhashed_blocks_are_evicted_first_then_deepest_first() -> None:
    bm = BlockManager(4, 4)
    a = make_seq("a", PROMPT)  # blocks: full, full, partial (never published)
    admit(bm, a)
    full0, full1, partial = a.block_table
    bm.free(a)

    # Two new blocks: the never-used block and a's partial one go first.
    x = make_seq("x", range(500, 508))
    compute(bm, x)
    assert partial in x.block_table
    assert not {full0, full1} & set(x.block_table)
    probe = make_seq("p1", PROMPT)
    assert bm.take_cached_prefix(probe) == 8
    bm.free(probe)

    # One more: the deeper cached block goes before the one it extends.
    y = make_seq("y", range(600, 603))
    compute(bm, y)
    assert y.block_table == [full1]
    probe = make_seq("p2", PROMPT)
    assert bm.take_cached_prefix(probe) == 4
    bm.free(probe)

    z = make_seq("z", [7])
    compute(bm, z)
    assert z.block_table == [full0]
    assert bm.take_cached_prefix(make_seq("p3", PROMPT)) == 0
    bm.check_invariants([x, y, z])


def test_least_recently_freed_cached_block_is_evicted_first() -> None:
    bm = BlockManager(4, 4)
    a, b = make_seq("a", [1, 1, 1, 1, 0]), make_seq("b", [2, 2, 2, 2, 0])
    # Each holds one full published block plus a partial one.
    admit(bm, a)
    bm.free(a)
    admit(bm, b)
    bm.free(b)
    # Free list now: b's partial, the never-used block, a's full one, then b's full one.
    c = make_seq("c", range(300, 312))
    assert bm.allocate_slots(c, 9)  # three blocks: the two unhashed ones, then a's
    assert bm.take_cached_prefix(make_seq("a2", [1, 1, 1, 1, 0])) == 0
    bm.free(c)
    b2 = make_seq("b2", [2, 2, 2, 2, 0])
    assert bm.take_cached_prefix(b2) == 4
    bm.check_invariants([b2])


def test_only_computed_full_blocks_are_published() -> None:
    bm = BlockManager(8, 4)
    a = make_seq("a", PROMPT)
    assert bm.allocate_slots(a, 10)  # the table covers the prompt ...
    a.num_computed_tokens = 6  # ... but a chunk of 6 tokens was computed
    bm.register_full_blocks(a)
    probe = make_seq("p", PROMPT)
    assert bm.take_cached_prefix(probe) == 4
    bm.free(probe)
    a.num_computed_tokens = 10
    bm.register_full_blocks(a)
    assert bm.take_cached_prefix(make_seq("q", PROMPT)) == 8


def test_the_same_content_computed_twice_is_cached_once() -> None:
    bm = BlockManager(8, 4)
    a, b = make_seq("a", PROMPT), make_seq("b", PROMPT)
    # Both prefill together: neither can hit the other.
    assert bm.take_cached_prefix(a) == 0
    assert bm.take_cached_prefix(b) == 0
    compute(bm, a)
    compute(bm, b)
    assert set(a.block_table).isdisjoint(b.block_table)
    bm.check_invariants([a, b])
    c = make_seq("c", PROMPT)
    assert bm.take_cached_prefix(c) == 8
    assert c.block_table == a.block_table[:2]
    bm.free(a)
    bm.free(b)
    bm.free(c)
    bm.check_invariants([])
    # b's duplicate blocks were never published: they are evicted before a's.
    d = make_seq("d", range(700, 724))
    assert bm.allocate_slots(d, 24)
    e = make_seq("e", PROMPT)
    assert bm.take_cached_prefix(e) == 8
    bm.check_invariants([d, e])


def test_generated_tokens_extend_the_chain() -> None:
    """A preempted sequence finds its own prompt and output blocks when it comes back."""
    bm = BlockManager(8, 4)
    seq = make_seq("s", PROMPT)
    admit(bm, seq)
    for token in (1, 2, 3):  # decode: each sampled token is computed by the next step
        seq.token_ids.append(token)
        compute(bm, seq, 1)
    seq.token_ids.append(4)  # sampled, not computed yet
    assert seq.num_tokens == 14 and seq.num_computed_tokens == 13
    bm.free(seq)  # preempted
    assert bm.take_cached_prefix(seq) == 12
    assert seq.num_computed_tokens == 12
    compute(bm, seq)
    bm.check_invariants([seq])


def test_prefix_caching_can_be_disabled() -> None:
    bm = BlockManager(8, 4, enable_prefix_caching=False)
    a = make_seq("a", PROMPT)
    admit(bm, a)
    b = make_seq("b", PROMPT)
    assert bm.take_cached_prefix(b) == 0
    assert b.block_table == []
    bm.free(a)
    assert bm.take_cached_prefix(make_seq("c", PROMPT)) == 0
    assert all(block.hash is None for block in bm.blocks)


@settings(max_examples=150, deadline=None)
@given(
    block_size=st.integers(1, 6),
    first=st.lists(st.integers(0, 2), min_size=1, max_size=30),
    second=st.lists(st.integers(0, 2), min_size=1, max_size=30),
    same_salt=st.booleans(),
)
def test_hit_is_the_longest_shared_run_of_full_blocks(
    block_size: int, first: list[int], second: list[int], same_salt: bool
) -> None:
    bm = BlockManager(64, block_size)
    a = make_seq("a", first, salt="s")
    admit(bm, a)
    b = make_seq("b", second, salt="s" if same_salt else "t")
    hit = bm.take_cached_prefix(b)

    common = 0
    while common < min(len(first), len(second)) and first[common] == second[common]:
        common += 1
    # Only blocks a filled, that b shares in full, and that leave b a token to compute.
    blocks = min(common, len(first), len(second) - 1) // block_size if same_salt else 0
    assert hit == blocks * block_size
    assert hit < b.num_tokens
    assert b.block_table == a.block_table[:blocks]
    bm.check_invariants([a, b])
    bm.free(a)
    bm.free(b)
    assert bm.num_free_blocks == bm.num_blocks
    assert bm.usage == 0.0
