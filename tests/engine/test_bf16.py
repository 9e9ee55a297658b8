"""bf16 on CPU against transformers' own bf16 model on the same checkpoint: logits within
bf16's rounding, greedy tokens equal wherever transformers' choice is not a near-tie; and the
dtype ``auto`` picks."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import transformers

from izh_trio.engine.core import EngineCore
from izh_trio.engine.loader import cpu_has_native_bf16, resolve_dtype
from izh_trio.wire import AddRequest, EngineConfig, SamplingParams
from tests.conftest import save_transformers_qwen3
from tests.engine.logits import every_position

CPU = torch.device("cpu")
PROMPTS = [[3, 141, 59, 265, 358, 979, 323, 846], [1200, 7, 7, 7, 88], list(range(40, 140))]
MORE_PROMPTS = [[5, 6], [1500, 300, 20, 1700, 11, 400], list(range(900, 960, 3))]
#: bf16 keeps 8 bits of mantissa, and rounds where each implementation orders its operations:
#: transformers' own bf16 logits are ~0.01 from its fp32 ones on these checkpoints (logits
#: of std ~0.2), and ours about as far from its bf16 ones.
LOGIT_TOLERANCE = 0.02


@pytest.mark.parametrize(("setting", "checkpoint", "native", "want"), [
    ("auto", torch.float32, True, torch.float32),  # an fp32 checkpoint asked for fp32
    ("auto", torch.bfloat16, True, torch.bfloat16),
    ("auto", torch.bfloat16, False, torch.float32),  # emulated bf16 is slower than fp32
    ("auto", torch.float16, True, torch.bfloat16),
    ("auto", torch.float16, False, torch.float32),
    ("float32", torch.bfloat16, True, torch.float32),
    ("bfloat16", torch.float32, False, torch.bfloat16),  # asked for: done, however slow
])
def test_auto_dtype_on_cpu(setting: str, checkpoint: torch.dtype, native: bool,
                           want: torch.dtype) -> None:
    assert resolve_dtype(setting, checkpoint, CPU, native_bf16=native) == want


def test_auto_dtype_elsewhere_is_the_checkpoints() -> None:
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        assert resolve_dtype("auto", dtype, torch.device("cuda"), native_bf16=False) == dtype


@pytest.fixture(scope="module", params=["hd32-tied", "hd128-untied"])
def bf16_dir(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
             tiny_dir: Path) -> Path:
    shape = {} if request.param == "hd32-tied" else {
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 128, "tie": False}
    out = tmp_path_factory.mktemp("bf16") / request.param
    return save_transformers_qwen3(out, tiny_dir, seed=5, dtype="bfloat16", **shape)


def _engine(model_dir: Path) -> EngineCore:
    return EngineCore(EngineConfig(model_dir=str(model_dir), dtype="bfloat16", num_kv_blocks=64))


def _greedy(core: EngineCore, prompt: list[int], n: int, tag: str) -> list[int]:
    core.add_request(AddRequest(tag, prompt, SamplingParams(max_tokens=n, temperature=0.0,
                                                            ignore_eos=True)))
    out: list[int] = []
    while core.has_work:
        for o in core.step():
            out += o.new_token_ids
    return out


def test_logits_match_transformers_bf16(bf16_dir: Path) -> None:
    """Each prompt's logits at every position (prefill) and at a decode step through the
    paged cache, against transformers' bf16 forward of the same tokens."""
    core = _engine(bf16_dir)
    assert core.runner.dtype == core.runner.kv_caches[0][0].dtype == torch.bfloat16
    model = transformers.AutoModelForCausalLM.from_pretrained(bf16_dir, dtype=torch.bfloat16)
    for i, prompt in enumerate(PROMPTS):
        core.add_request(AddRequest(f"p{i}", prompt, SamplingParams(
            max_tokens=2, temperature=0.0, ignore_eos=True, prompt_logprobs=0)))
        tokens: list[int] = []
        while core.has_work:
            for o in core.step():
                tokens += o.new_token_ids
        with torch.inference_mode():
            ref = model(torch.tensor([prompt + tokens[:1]])).logits[0].float()
        ours = every_position(core.runner, prompt + tokens[:1])
        torch.testing.assert_close(ours, ref, atol=LOGIT_TOLERANCE, rtol=0)


@pytest.mark.skipif(not cpu_has_native_bf16(), reason="bf16 is emulated on this CPU")
def test_greedy_tokens_match_transformers_generate(bf16_dir: Path) -> None:
    """Token for token with ``generate`` in bf16, up to the first step where transformers'
    top two logits are closer than bf16 can tell apart (a near-tie either side may take)."""
    core = _engine(bf16_dir)
    model = transformers.AutoModelForCausalLM.from_pretrained(bf16_dir, dtype=torch.bfloat16)
    compared = 0
    for i, prompt in enumerate(PROMPTS + MORE_PROMPTS):
        ours = _greedy(core, prompt, 16, f"g{i}")
        with torch.inference_mode():
            gen = model.generate(torch.tensor([prompt]), max_new_tokens=16, do_sample=False,
                                 output_scores=True, return_dict_in_generate=True,
                                 eos_token_id=None, pad_token_id=0)
        theirs = gen.sequences[0, len(prompt):].tolist()
        for step, score in enumerate(gen.scores):
            top = score[0].float().topk(2).values
            if top[0] - top[1] < 2 * LOGIT_TOLERANCE:
                break
            assert ours[step] == theirs[step], (i, step, ours, theirs)
            compared += 1
    assert compared >= 8, "too few decisive steps to say anything"
