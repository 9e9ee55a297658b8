"""Sampling semantics through the real engine core, and the logits processors exactly."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import transformers

from izh_trio.engine.core import EngineCore
from izh_trio.engine.logits_processors import process_logits
from izh_trio.engine.sequence import Sequence
from izh_trio.wire import AddRequest, EngineConfig, FinishReason, RequestOutput, SamplingParams


@pytest.fixture(scope="module")
def core(tiny_dir: Path) -> EngineCore:
    return EngineCore(EngineConfig(model_dir=str(tiny_dir), num_kv_blocks=256, block_size=8))


def run(core: EngineCore, requests: dict[str, tuple[list[int], SamplingParams]]
        ) -> dict[str, list[RequestOutput]]:
    for rid, (prompt, params) in requests.items():
        assert core.add_request(AddRequest(rid, prompt, params)) is None
    out: dict[str, list[RequestOutput]] = {rid: [] for rid in requests}
    while core.has_work:
        for o in core.step():
            out[o.request_id].append(o)
    assert core.block_manager.usage == 0.0
    return out


def tokens(outs: list[RequestOutput]) -> list[int]:
    return [t for o in outs for t in o.new_token_ids]


PROMPT = [12, 845, 77, 1203, 9, 401, 33]


def test_logprobs_match_transformers(core: EngineCore, tiny_dir: Path) -> None:
    params = SamplingParams(max_tokens=6, temperature=0.7, seed=5, logprobs=3,
                            prompt_logprobs=2, ignore_eos=True)
    outs = run(core, {"a": (PROMPT, params)})["a"]
    ids = PROMPT + tokens(outs)
    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_dir).eval()
    with torch.inference_mode():
        ref = model(torch.tensor([ids])).logits[0].log_softmax(-1)
    # Sampled tokens: the raw model distribution (before temperature), like vLLM.
    for i, o in enumerate(outs):
        (lp,) = o.logprobs
        pos = len(PROMPT) - 1 + i
        assert lp.token_id == ids[pos + 1]
        assert math.isclose(lp.logprob, ref[pos, lp.token_id].item(), abs_tol=1e-4)
        assert lp.rank == int((ref[pos] > ref[pos, lp.token_id]).sum()) + 1
        top = ref[pos].topk(3)
        assert list(lp.top_ids) == top.indices.tolist()
        assert all(math.isclose(a, b, abs_tol=1e-4)
                   for a, b in zip(lp.top_logprobs, top.values.tolist(), strict=True))
    # Prompt logprobs: once, with the first token; one per prompt position after the first.
    prompt_lps = outs[0].prompt_logprobs
    assert all(o.prompt_logprobs is None for o in outs[1:])
    assert [p.token_id for p in prompt_lps] == PROMPT[1:]
    for pos, p in enumerate(prompt_lps):
        assert math.isclose(p.logprob, ref[pos, PROMPT[pos + 1]].item(), abs_tol=1e-4)
        assert len(p.top_ids) == 2


def test_prompt_logprobs_survive_chunked_prefill(tiny_dir: Path) -> None:
    prompt = list(range(300, 340))
    params = SamplingParams(max_tokens=1, temperature=0, prompt_logprobs=0)
    whole = run(EngineCore(EngineConfig(model_dir=str(tiny_dir), num_kv_blocks=64)),
                {"a": (prompt, params)})["a"][0].prompt_logprobs
    chunked = run(EngineCore(EngineConfig(model_dir=str(tiny_dir), num_kv_blocks=64,
                                          max_num_batched_tokens=7)),
                  {"a": (prompt, params)})["a"][0].prompt_logprobs
    assert len(whole) == len(chunked) == len(prompt) - 1
    for a, b in zip(whole, chunked, strict=True):
        assert a.token_id == b.token_id and math.isclose(a.logprob, b.logprob, abs_tol=1e-4)


def test_seeded_sampling_is_batch_invariant(core: EngineCore) -> None:
    params = SamplingParams(max_tokens=12, temperature=1.0, top_p=0.9, top_k=40, seed=42,
                            ignore_eos=True)
    alone = tokens(run(core, {"s": (PROMPT, params)})["s"])
    noise = {f"n{i}": ([5 + i, 6, 7], SamplingParams(max_tokens=5 + i, temperature=1.0))
             for i in range(6)}
    crowded = run(core, {**noise, "s": (PROMPT, params)})
    assert tokens(crowded["s"]) == alone
    other_seed = tokens(run(core, {"s": (PROMPT, SamplingParams(
        max_tokens=12, temperature=1.0, top_p=0.9, top_k=40, seed=43, ignore_eos=True))})["s"])
    assert other_seed != alone


def test_logit_bias_forces_and_forbids(core: EngineCore) -> None:
    forced = run(core, {"f": (PROMPT, SamplingParams(max_tokens=5, temperature=0,
                                                     logit_bias=[(777, 100.0)],
                                                     ignore_eos=True))})["f"]
    assert tokens(forced) == [777] * 5
    greedy = tokens(run(core, {"g": (PROMPT, SamplingParams(max_tokens=1, temperature=0))})["g"])
    banned = tokens(run(core, {"b": (PROMPT, SamplingParams(
        max_tokens=1, temperature=0, logit_bias=[(greedy[0], -100.0)]))})["b"])
    assert banned != greedy


def test_stop_token_ids_and_min_tokens(core: EngineCore) -> None:
    # Make token 777 certain: it stops the request at once, and is reported as stop_reason.
    bias = [(777, 100.0)]
    outs = run(core, {"s": (PROMPT, SamplingParams(max_tokens=10, temperature=0,
                                                   logit_bias=bias, stop_token_ids=[777]))})["s"]
    assert tokens(outs) == [777]
    assert outs[-1].finish_reason is FinishReason.STOP and outs[-1].stop_token_id == 777
    # min_tokens: the stop token can't even be sampled until 4 tokens exist.
    outs = run(core, {"m": (PROMPT, SamplingParams(max_tokens=10, temperature=0, min_tokens=4,
                                                   logit_bias=bias, stop_token_ids=[777]))})["m"]
    got = tokens(outs)
    assert len(got) == 5 and 777 not in got[:4] and got[4] == 777


def _seq(prompt: list[int], output: list[int], **params: object) -> Sequence:
    s = Sequence(request_id="x", token_ids=prompt + output, params=SamplingParams(**params),
                 stop_token_ids=frozenset({0}))
    s.num_prompt_tokens = len(prompt)
    return s


def test_penalties_exactly() -> None:
    vocab = 10
    logits = torch.linspace(-2.0, 2.5, vocab).repeat(3, 1)
    seqs = [
        _seq([1, 2], [7, 7, 3], repetition_penalty=1.5),
        _seq([1], [4, 4, 4, 9], presence_penalty=0.5, frequency_penalty=0.25),
        _seq([5], [5], min_tokens=3, logit_bias=[(6, 2.0)]),
    ]
    got = process_logits(logits, seqs)
    want = logits.clone()
    for t in {1, 2, 7, 3}:
        want[0, t] = want[0, t] / 1.5 if want[0, t] > 0 else want[0, t] * 1.5
    for t, n in {4: 3, 9: 1}.items():
        want[1, t] -= 0.25 * n + 0.5
    want[2, 0] = float("-inf")  # stop token masked below min_tokens
    want[2, 6] += 2.0
    torch.testing.assert_close(got, want)
    assert torch.equal(logits, torch.linspace(-2.0, 2.5, vocab).repeat(3, 1))  # input untouched
