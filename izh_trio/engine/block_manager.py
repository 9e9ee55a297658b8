"""Paged KV-cache bookkeeping: fixed-size blocks, reference counts, and the prefix cache.

Plain Python, no torch: the scheduler's invariants are tested without a model.

A full block is named by a hash chain, ``sha256(parent || salt || adapter || token ids)``,
so two sequences share a block only when every token before it is equal too (and their cache
salts and LoRA adapters match: the first block carries both, the rest inherit them). Freed
blocks keep their hash and stay reusable until they are evicted, least recently freed first.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict

import attrs

from izh_trio.engine.sequence import Sequence


@attrs.define(eq=False)
class Block:
    block_id: int
    ref_count: int = 0
    #: Set once the block is full and registered in the prefix cache.
    hash: bytes | None = None


def chain_hash(parent: bytes | None, token_ids: list[int], salt: str | None,
               lora_id: int | None = None) -> bytes:
    h = hashlib.sha256(parent or b"\0" * 32)
    if parent is None and salt is not None:
        # Length-prefixed, so that even the empty salt differs from no salt.
        data = salt.encode()
        h.update(len(data).to_bytes(8, "little") + data)
    if parent is None and lora_id is not None:
        # Tagged: read as a salt length, b"lora..." would be gigabytes, so no salt collides.
        h.update(b"lora" + lora_id.to_bytes(8, "little"))
    h.update(array("q", token_ids).tobytes())
    return h.digest()


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True):
        if num_blocks < 1 or block_size < 1:
            raise ValueError("need at least one block of at least one token")
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        # Unreferenced blocks in eviction order (front = evict first).
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self._cached: dict[bytes, int] = {}
        self.prefix_queries = 0  # prompt tokens looked up
        self.prefix_hits = 0  # of those, tokens found

    # ------------------------------------------------------------------ queries
    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def usage(self) -> float:
        """Fraction of blocks referenced by live sequences (cached-but-free ones don't count)."""
        return 1.0 - len(self._free) / len(self.blocks)

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    # ------------------------------------------------------------------ prefix cache
    def _hashes(self, seq: Sequence, num_full_blocks: int) -> list[bytes]:
        bs = self.block_size
        hashes = seq.block_hashes
        while len(hashes) < num_full_blocks:
            i = len(hashes)
            parent = hashes[-1] if hashes else None
            hashes.append(chain_hash(parent, seq.token_ids[i * bs : (i + 1) * bs], seq.cache_salt,
                                     seq.lora_id))
        return hashes

    def take_cached_prefix(self, seq: Sequence) -> int:
        """Attach the longest cached prefix to a fresh sequence; returns its token count.

        At least one token is always left to compute: the step needs it to produce logits.
        """
        assert not seq.block_table and seq.num_computed_tokens == 0, seq
        if not self.enable_prefix_caching:
            return 0
        max_blocks = (seq.num_tokens - 1) // self.block_size
        self.prefix_queries += seq.num_tokens
        for h in self._hashes(seq, max_blocks):
            block_id = self._cached.get(h)
            if block_id is None:
                break
            block = self.blocks[block_id]
            if block.ref_count == 0:
                del self._free[block_id]
            block.ref_count += 1
            seq.block_table.append(block_id)
        seq.num_published_blocks = len(seq.block_table)
        hit = len(seq.block_table) * self.block_size
        self.prefix_hits += hit
        seq.num_computed_tokens = hit
        return hit

    def register_full_blocks(self, seq: Sequence) -> None:
        """Publish blocks that became full (and computed) so later requests can reuse them."""
        if not self.enable_prefix_caching:
            return
        num_full = seq.num_computed_tokens // self.block_size
        if num_full <= seq.num_published_blocks:
            return
        hashes = self._hashes(seq, num_full)
        for i in range(seq.num_published_blocks, num_full):
            block = self.blocks[seq.block_table[i]]
            if block.hash is None and hashes[i] not in self._cached:
                block.hash = hashes[i]
                self._cached[hashes[i]] = block.block_id
        seq.num_published_blocks = num_full

    # ------------------------------------------------------------------ allocation
    def allocate_slots(self, seq: Sequence, num_new_tokens: int) -> bool:
        """Grow the block table to hold ``num_new_tokens`` more; all or nothing.

        Called for every scheduled sequence every step, but a decode needs a new block only
        once every ``block_size`` tokens: the common case returns at once.
        """
        need = self.blocks_needed(seq.num_computed_tokens + num_new_tokens) - len(seq.block_table)
        if need <= 0:
            return True
        if need > len(self._free):
            return False
        for _ in range(need):
            block_id, _ = self._free.popitem(last=False)
            block = self.blocks[block_id]
            if block.hash is not None:  # evict it from the prefix cache
                del self._cached[block.hash]
                block.hash = None
            block.ref_count = 1
            seq.block_table.append(block_id)
        return True

    def free(self, seq: Sequence) -> None:
        """Drop the sequence's references; blocks nobody else holds become free."""
        # Deepest blocks first, so they are evicted before the shared prefix they extend.
        for block_id in reversed(seq.block_table):
            block = self.blocks[block_id]
            block.ref_count -= 1
            assert block.ref_count >= 0, f"block {block_id} double-freed"
            if block.ref_count == 0:
                self._free[block_id] = None
                if block.hash is None:  # worthless once free: reuse it first
                    self._free.move_to_end(block_id, last=False)
        seq.block_table.clear()
        seq.num_computed_tokens = 0
        seq.num_published_blocks = 0

    @property
    def prefix_hit_rate(self) -> float:
        return self.prefix_hits / self.prefix_queries if self.prefix_queries else 0.0

    def check_invariants(self, live: list[Sequence]) -> None:
        """Every block is either free or referenced exactly as often as tables name it."""
        refs = [0] * len(self.blocks)
        for seq in live:
            for block_id in seq.block_table:
                refs[block_id] += 1
        for block in self.blocks:
            assert block.ref_count == refs[block.block_id], (block, refs[block.block_id])
            assert (block.ref_count == 0) == (block.block_id in self._free), block
        for h, block_id in self._cached.items():
            assert self.blocks[block_id].hash == h
