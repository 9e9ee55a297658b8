"""How the model runner flattens a step plan into the lists the model and attention read."""

from __future__ import annotations

from pathlib import Path

import torch

from izh_trio.engine.attention import ChunkSpec, long_tensor
from izh_trio.engine.block_manager import BlockManager
from izh_trio.engine.model_runner import ModelRunner
from izh_trio.engine.scheduler import ScheduledSeq
from izh_trio.engine.sequence import Sequence
from izh_trio.wire import EngineConfig, SamplingParams

BS = 4


def _seq(rid: str, ids: list[int], prompt_logprobs: int | None = None) -> Sequence:
    return Sequence(request_id=rid, token_ids=list(ids),
                    params=SamplingParams(prompt_logprobs=prompt_logprobs),
                    stop_token_ids=frozenset())


def _slots(seq: Sequence, start: int, end: int) -> list[int]:
    return [seq.block_table[p // BS] * BS + p % BS for p in range(start, end)]


def test_long_tensor() -> None:
    cpu = torch.device("cpu")
    got = long_tensor([3, -1, 2**40], cpu)
    assert got.dtype == torch.long and got.tolist() == [3, -1, 2**40]
    empty = long_tensor([], cpu)
    assert empty.dtype == torch.long and empty.shape == (0,)


def test_prepare_puts_prefills_first_and_finds_each_row(tiny_dir: Path) -> None:
    runner = ModelRunner(EngineConfig(model_dir=str(tiny_dir), num_kv_blocks=32,
                                      block_size=BS))
    bm = BlockManager(runner.num_blocks, BS)
    a = _seq("a", list(range(10, 20)), prompt_logprobs=1)  # first chunk of 6: no sample
    b = _seq("b", list(range(30, 36)))  # prefilled, one token out: a decode
    c = _seq("c", list(range(40, 45)), prompt_logprobs=1)  # a one-token prompt chunk
    d = _seq("d", [50, 51, 52])  # a whole prompt: samples
    assert bm.allocate_slots(b, 6)
    b.num_computed_tokens = 6
    b.token_ids.append(99)
    plan = [(b, 1), (a, 6), (c, 1), (d, 3)]  # schedule order: the running decode first
    for seq, n in plan:
        assert bm.allocate_slots(seq, n)
    d.lora_slot = 2
    batch = [ScheduledSeq(seq, n) for seq, n in plan]

    step = runner._prepare(batch)

    # Rows: a 0-5, d 6-8 (prefills, in plan order), then b 9 and c 10 (one-token chunks).
    assert step.input_ids == [*range(10, 16), 50, 51, 52, 99, 40]
    assert step.positions == [*range(6), 0, 1, 2, 6, 0]
    att = step.attention
    assert att.slots == _slots(a, 0, 6) + _slots(d, 0, 3) + _slots(b, 6, 7) + _slots(c, 0, 1)
    assert att.prefills == [ChunkSpec(0, 6, 6, a.block_table), ChunkSpec(6, 3, 3, d.block_table)]
    assert att.decodes == [ChunkSpec(9, 1, 7, b.block_table), ChunkSpec(10, 1, 1, c.block_table)]
    assert step.sample_rows == [8, 9]
    assert [item.seq for item in step.sampling] == [d, b]
    # Every row of a's chunk predicts a prompt token; c's one row predicts its second.
    assert step.prompt_rows == [(a, 0, 6), (c, 10, 1)]
    assert step.lora_spans == [(2, 6, 3)]


def test_execute_returns_sample_and_prompt_logits(tiny_dir: Path) -> None:
    runner = ModelRunner(EngineConfig(model_dir=str(tiny_dir), num_kv_blocks=32,
                                      block_size=BS))
    bm = BlockManager(runner.num_blocks, BS)
    a = _seq("a", list(range(10, 20)), prompt_logprobs=1)
    b = _seq("b", [5, 6, 7])
    for seq in (a, b):
        assert bm.allocate_slots(seq, seq.num_tokens)
    out = runner.execute([ScheduledSeq(a, 10), ScheduledSeq(b, 3)])
    vocab = runner.model_config.vocab_size
    assert out.sample.shape == (2, vocab)
    assert [item.seq for item in out.sampling] == [a, b]
    assert list(out.prompt) == [a] and out.prompt[a].shape == (9, vocab)
    # Then a pure decode step: every row samples, and no prompt is scored any more.
    for seq, n in ((a, 10), (b, 3)):
        seq.num_computed_tokens = n
        seq.token_ids.append(1)
        assert bm.allocate_slots(seq, 1)
    decode = runner.execute([ScheduledSeq(a, 1), ScheduledSeq(b, 1)])
    assert decode.sample.shape == (2, vocab) and decode.prompt == {}
