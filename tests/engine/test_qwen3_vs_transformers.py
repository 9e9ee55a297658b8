"""Our Qwen3 against Hugging Face transformers' on the same checkpoint files (fp32)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import transformers

from izh_trio.engine.block_manager import BlockManager
from izh_trio.engine.core import EngineCore
from izh_trio.engine.model_runner import ModelRunner
from izh_trio.engine.scheduler import ScheduledSeq
from izh_trio.engine.sequence import Sequence
from izh_trio.wire import AddRequest, EngineConfig, SamplingParams

ATOL = 1e-4


@pytest.fixture(scope="module", params=["hf_tied", "tiny_untied"])
def checkpoint(request: pytest.FixtureRequest) -> Path:
    return request.getfixturevalue("hf_dir" if request.param == "hf_tied" else "tiny_dir")


@pytest.fixture(scope="module")
def reference(checkpoint: Path) -> transformers.PreTrainedModel:
    return transformers.AutoModelForCausalLM.from_pretrained(checkpoint,
                                                             dtype=torch.float32).eval()


@torch.inference_mode()
def _ref_logits(model: transformers.PreTrainedModel, ids: list[int]) -> torch.Tensor:
    return model(torch.tensor([ids])).logits[0].float()


def _seq(rid: str, ids: list[int]) -> Sequence:
    return Sequence(request_id=rid, token_ids=list(ids), params=SamplingParams(),
                    stop_token_ids=frozenset())


def _run(runner: ModelRunner, bm: BlockManager, plan: list[tuple[Sequence, int]]):
    """One engine step over (sequence, new tokens) pairs, as the scheduler would issue it."""
    items = []
    for seq, n in plan:
        assert bm.allocate_slots(seq, n)
        items.append(ScheduledSeq(seq, n))
    step = runner.execute(items)
    for item in items:
        item.seq.num_computed_tokens += item.num_new_tokens
    return {item.seq.request_id: row for item, row in zip(step.sampling, step.sample,
                                                          strict=True)}


def test_prefill_then_decode_logits_match(checkpoint: Path, reference) -> None:
    runner = ModelRunner(EngineConfig(model_dir=str(checkpoint), num_kv_blocks=64, block_size=4))
    bm = BlockManager(runner.num_blocks, 4, enable_prefix_caching=False)
    prompts = {"a": [11, 400, 7, 1500, 33, 2, 901, 45, 12], "b": [1800, 5],
               "c": list(range(100, 131))}
    seqs = {rid: _seq(rid, ids) for rid, ids in prompts.items()}
    # Mixed step: a whole prefill for a, b; a first chunk of c (no logits for it yet).
    out = _run(runner, bm, [(seqs["a"], 9), (seqs["b"], 2), (seqs["c"], 10)])
    assert set(out) == {"a", "b"}
    out |= _run(runner, bm, [(seqs["c"], 21)])  # the rest of c, attending to its cached chunk
    for _ in range(6):  # decode steps, batched, through the paged cache
        for rid, seq in seqs.items():
            expected = _ref_logits(reference, seq.token_ids)[-1]
            torch.testing.assert_close(out[rid], expected, atol=ATOL, rtol=0)
            seq.token_ids.append(int(expected.argmax()))
        out = _run(runner, bm, [(s, 1) for s in seqs.values()])


def test_greedy_alone_equals_greedy_in_a_batch(checkpoint: Path, reference) -> None:
    def generate(prompts: list[list[int]], **cfg: int) -> tuple[list[list[int]], int]:
        core = EngineCore(EngineConfig(model_dir=str(checkpoint), **cfg))
        params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
        for i, ids in enumerate(prompts):
            assert core.add_request(AddRequest(f"r{i}", ids, params)) is None
        got: dict[str, list[int]] = {f"r{i}": [] for i in range(len(prompts))}
        while core.has_work:
            for o in core.step():
                got[o.request_id] += o.new_token_ids
        assert core.block_manager.usage == 0.0
        return [got[f"r{i}"] for i in range(len(prompts))], core.scheduler.num_preemptions

    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 1990, (int(n),), generator=g).tolist()
               for n in torch.randint(3, 40, (12,), generator=g)]
    alone = [generate([p], num_kv_blocks=64)[0][0] for p in prompts[:3]]
    # Many at once, with a tight token budget (chunked prefill) and few blocks (preemption).
    batched, preemptions = generate(prompts, num_kv_blocks=40, block_size=4,
                                    max_num_batched_tokens=32)
    assert preemptions > 0
    assert batched[:3] == alone
    for ids, out in zip(prompts[:3], alone, strict=True):
        ref = reference.generate(torch.tensor([ids]), max_new_tokens=24, do_sample=False,
                                 min_new_tokens=24)[0, len(ids):].tolist()
        assert out == ref
