"""The thinking budget, through the real engine core: the think end is forced exactly when the
budget is spent without one, never otherwise, and survives preemption; and its wire fields."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import tokenizers
import torch
import transformers

from izh_trio.engine.core import EngineCore
from izh_trio.engine.sequence import Sequence
from izh_trio.engine.think_budget import forced_token
from izh_trio.wire import (
    AddRequest,
    EngineConfig,
    FinishReason,
    FrameDecoder,
    RequestOutput,
    SamplingParams,
    encode_frame,
)

PROMPT = [12, 845, 77, 1203, 9, 401, 33]


@pytest.fixture(scope="module")
def core(tiny_dir: Path) -> EngineCore:
    return EngineCore(EngineConfig(model_dir=str(tiny_dir), num_kv_blocks=256, block_size=8))


@pytest.fixture(scope="module")
def think_end(tiny_dir: Path) -> tuple[int, int]:
    """What the frontend sends for Qwen3: the ids of ``</think>`` and of ``\\n\\n``."""
    tok = tokenizers.Tokenizer.from_file(str(tiny_dir / "tokenizer.json"))
    close = tok.token_to_id("</think>")
    (blank,) = tok.encode("\n\n", add_special_tokens=False).ids
    assert close is not None
    return close, blank


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


def generate(core: EngineCore, prompt: list[int], **params: Any) -> list[int]:
    outs = run(core, {"r": (prompt, SamplingParams(temperature=0, ignore_eos=True, **params))})
    return [t for o in outs["r"] for t in o.new_token_ids]


def test_budget_spent_forces_the_think_end(core: EngineCore, tiny_dir: Path,
                                           think_end: tuple[int, int]) -> None:
    budget, n = 6, 14
    natural = generate(core, PROMPT, max_tokens=n)
    assert think_end[0] not in natural  # the model never closes its block by itself
    outs = run(core, {"t": (PROMPT, SamplingParams(
        max_tokens=n, temperature=0, ignore_eos=True, logprobs=2,
        think_budget=budget, think_end=think_end))})["t"]
    got = [t for o in outs for t in o.new_token_ids]
    assert len(got) == n and outs[-1].finish_reason is FinishReason.LENGTH
    assert got[:budget] == natural[:budget]
    assert got[budget:budget + 2] == list(think_end)
    # Then sampling is free again: greedy from everything so far.
    assert got[budget + 2:] == generate(core, PROMPT + got[:budget + 2],
                                        max_tokens=n - budget - 2)
    # A forced token is reported under the step's own distribution, like a sampled one.
    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_dir).eval()
    with torch.inference_mode():
        ref = model(torch.tensor([PROMPT + got])).logits[0].log_softmax(-1)
    for i in (budget, budget + 1):
        (lp,) = outs[i].logprobs
        pos = len(PROMPT) - 1 + i
        assert lp.token_id == got[i]
        assert math.isclose(lp.logprob, ref[pos, got[i]].item(), abs_tol=1e-4)
        assert lp.rank == int((ref[pos] > ref[pos, got[i]]).sum()) + 1
        assert list(lp.top_ids) == ref[pos].topk(2).indices.tolist()
    assert outs[budget].logprobs[0].rank > 1  # not what greedy wanted
    assert outs[budget].logprobs[0].top_ids[0] == natural[budget]


def test_block_closed_within_the_budget_forces_nothing(core: EngineCore,
                                                       think_end: tuple[int, int]) -> None:
    budget, n = 6, 14
    natural = generate(core, PROMPT, max_tokens=n)
    early = natural[2]  # the model's own "think end", within the budget
    assert generate(core, PROMPT, max_tokens=n, think_budget=budget,
                    think_end=(early, think_end[1])) == natural
    # Closed on the budget's last token: still the model's own.
    last = natural[budget - 1]
    assert generate(core, PROMPT, max_tokens=n, think_budget=budget,
                    think_end=(last, think_end[1])) == natural


@pytest.mark.parametrize("max_tokens", [3, 5, 6])
def test_no_force_before_the_budget_is_spent(core: EngineCore, think_end: tuple[int, int],
                                             max_tokens: int) -> None:
    natural = generate(core, PROMPT, max_tokens=max_tokens)
    assert generate(core, PROMPT, max_tokens=max_tokens, think_budget=6,
                    think_end=think_end) == natural


def test_max_tokens_cuts_the_forced_end(core: EngineCore, think_end: tuple[int, int]) -> None:
    natural = generate(core, PROMPT, max_tokens=6)
    assert generate(core, PROMPT, max_tokens=7, think_budget=6,
                    think_end=think_end) == [*natural, think_end[0]]


def test_a_forced_stop_token_stops(core: EngineCore, think_end: tuple[int, int]) -> None:
    natural = generate(core, PROMPT, max_tokens=4)
    outs = run(core, {"s": (PROMPT, SamplingParams(
        max_tokens=20, temperature=0, ignore_eos=True, stop_token_ids=[think_end[0]],
        think_budget=4, think_end=think_end))})["s"]
    assert [t for o in outs for t in o.new_token_ids] == [*natural, think_end[0]]
    assert outs[-1].finish_reason is FinishReason.STOP
    assert outs[-1].stop_token_id == think_end[0]


def test_forcing_survives_preemption(tiny_dir: Path, think_end: tuple[int, int]) -> None:
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, 1990, (int(k),), generator=g).tolist()
               for k in torch.randint(3, 40, (10,), generator=g)]
    # Budgets chosen so that, as the scheduler runs today, requests are preempted just before
    # the forcing (r4), between its two tokens (r3, r5, r9) and before the budget (r6, r7, r8);
    # the outputs must match whatever the schedule.
    budgets = [4, 6, 8, 18, 14, 8, 16, 18, 20, 3]
    params = [SamplingParams(max_tokens=24, temperature=0, ignore_eos=True,
                             think_budget=b, think_end=think_end) for b in budgets]
    requests = {f"r{i}": (p, sp) for i, (p, sp) in enumerate(zip(prompts, params, strict=True))}
    roomy = EngineCore(EngineConfig(model_dir=str(tiny_dir), num_kv_blocks=256))
    alone = {rid: [t for o in run(roomy, {rid: req})[rid] for t in o.new_token_ids]
             for rid, req in requests.items()}
    # Few blocks and a small token budget: chunked prefill and preemption (recompute).
    tight = EngineCore(EngineConfig(model_dir=str(tiny_dir), num_kv_blocks=40, block_size=4,
                                    max_num_batched_tokens=32))
    crowded = {rid: [t for o in outs for t in o.new_token_ids]
               for rid, outs in run(tight, requests).items()}
    assert tight.scheduler.num_preemptions > 0
    assert crowded == alone
    for rid, sp in zip(requests, params, strict=True):
        budget = sp.think_budget
        assert budget is not None
        if think_end[0] not in alone[rid][:budget]:
            assert alone[rid][budget:budget + 2] == list(think_end)


def test_the_decision_depends_only_on_the_output() -> None:
    """What a recomputed sequence is told to produce, from its tokens alone."""
    end = (90, 91, 92)

    def forced(output: list[int], budget: int = 3) -> int | None:
        seq = Sequence(request_id="x", token_ids=[7, 8, *output], stop_token_ids=frozenset(),
                       params=SamplingParams(think_budget=budget, think_end=end))
        seq.num_prompt_tokens = 2
        return forced_token(seq)

    assert [forced([1] * n) for n in range(3)] == [None] * 3  # within the budget
    assert forced([1, 2, 3]) == 90
    assert forced([1, 2, 3, 90]) == 91
    assert forced([1, 2, 3, 90, 91]) == 92
    assert forced([1, 2, 3, 90, 91, 92]) is None  # the end is out: free again
    assert forced([1, 2, 3, 90, 91, 92, 5, 6]) is None
    assert forced([1, 90, 3]) is None  # closed by the model within the budget
    assert forced([1, 2, 90, 90]) is None  # ... on the budget's last token
    assert forced([90, 2, 3, 90, 91]) is None
    assert forced([1], budget=1) == 90
    assert forced([90], budget=1) is None
    seq = Sequence(request_id="x", token_ids=[7, 8, 1, 2, 3], stop_token_ids=frozenset(),
                   params=SamplingParams(think_end=end))  # no budget: think_end does nothing
    seq.num_prompt_tokens = 2
    assert forced_token(seq) is None


def test_think_end_outside_the_vocabulary_is_refused(core: EngineCore) -> None:
    vocab = core.runner.model_config.vocab_size
    failed = core.add_request(AddRequest("v", PROMPT, SamplingParams(
        think_budget=4, think_end=(1, vocab))))
    assert failed is not None and "think_end" in failed.message
    assert not core.has_work


# ---------------------------------------------------------------- the wire fields


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"think_budget": 0, "think_end": (5,)}, "think_budget"),
        ({"think_budget": 8}, "think_budget needs think_end"),
        ({"think_budget": 8, "think_end": ()}, "think_budget needs think_end"),
        ({"think_budget": 8, "think_end": (5,), "grammar": "start: /a+/"}, "cannot be combined"),
        ({"think_end": (5, -2)}, "think_end must hold non-negative token ids"),
    ],
    ids=repr,
)
def test_wire_validation(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        SamplingParams(**kwargs)


def test_wire_round_trip() -> None:
    params = SamplingParams(max_tokens=4096, temperature=0.6, think_budget=1024,
                            think_end=[151668, 271])
    assert params.think_end == (151668, 271)
    msg = AddRequest("r", (1, 2, 3), params)
    (back,) = FrameDecoder().feed(encode_frame([msg]))
    assert back == msg
    assert isinstance(back, AddRequest) and back.params.think_budget == 1024
    assert back.params.think_end == (151668, 271)
    # Without a budget the fields keep their defaults, and a think_end alone does nothing.
    assert SamplingParams().think_budget is None and SamplingParams().think_end == ()
    (plain,) = FrameDecoder().feed(encode_frame([AddRequest("p", (1,), SamplingParams())]))
    assert isinstance(plain, AddRequest) and plain.params.think_end == ()
