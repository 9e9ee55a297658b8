"""bf16 and fp16 on CPU against transformers' own model in the same dtype on the same
checkpoint: logits within that dtype's rounding, greedy tokens equal wherever transformers'
choice is not a near-tie; and the dtype ``auto`` picks."""

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
#: of std ~0.2), and ours about as far from its bf16 ones. fp16 keeps 11 bits: eight times
#: closer.
LOGIT_TOLERANCE = {"bfloat16": 0.02, "float16": 0.0025}


@pytest.mark.parametrize(("setting", "checkpoint", "native", "fp16", "hardware", "want"), [
    # an fp32 checkpoint asked for fp32
    ("auto", torch.float32, True, True, True, torch.float32),
    ("auto", torch.bfloat16, True, True, True, torch.bfloat16),
    ("auto", torch.bfloat16, True, True, False, torch.bfloat16),  # widened as it streams
    ("auto", torch.bfloat16, False, True, False, torch.float32),  # emulated: slower than fp32
    ("auto", torch.float16, True, True, True, torch.bfloat16),  # as vLLM's CPU backend does
    ("auto", torch.float16, True, True, False, torch.float16),  # widened either way: exact
    ("auto", torch.float16, False, True, False, torch.float16),
    ("auto", torch.float16, True, False, False, torch.bfloat16),  # no fp16 kernels here
    ("auto", torch.float16, False, False, False, torch.float32),  # torch's fp16 is slower
    ("float32", torch.bfloat16, True, True, True, torch.float32),
    # asked for: done, however slow
    ("bfloat16", torch.float32, False, False, False, torch.bfloat16),
    ("float16", torch.bfloat16, True, False, True, torch.float16),
])
def test_auto_dtype_on_cpu(setting: str, checkpoint: torch.dtype, native: bool, fp16: bool,
                           hardware: bool, want: torch.dtype) -> None:
    assert resolve_dtype(setting, checkpoint, CPU, native_bf16=native, fp16_kernels=fp16,
                         bf16_hardware=hardware) == want


def test_auto_dtype_elsewhere_is_the_checkpoints() -> None:
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        assert resolve_dtype("auto", dtype, torch.device("cuda"), native_bf16=False) == dtype


@pytest.fixture(scope="module", params=["bfloat16", "float16"])
def half(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(scope="module", params=["hd32-tied", "hd128-untied"])
def half_dir(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
             tiny_dir: Path, half: str) -> Path:
    shape = {} if request.param == "hd32-tied" else {
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 128, "tie": False}
    out = tmp_path_factory.mktemp(half) / request.param
    return save_transformers_qwen3(out, tiny_dir, seed=5, dtype=half, **shape)


def _engine(model_dir: Path, half: str) -> EngineCore:
    return EngineCore(EngineConfig(model_dir=str(model_dir), dtype=half, num_kv_blocks=64))


def _greedy(core: EngineCore, prompt: list[int], n: int, tag: str) -> list[int]:
    core.add_request(AddRequest(tag, prompt, SamplingParams(max_tokens=n, temperature=0.0,
                                                            ignore_eos=True)))
    out: list[int] = []
    while core.has_work:
        for o in core.step():
            out += o.new_token_ids
    return out


def test_logits_match_transformers(half_dir: Path, half: str) -> None:
    """Each prompt's logits at every position (prefill) and at a decode step through the
    paged cache, against transformers' forward of the same tokens in the same dtype."""
    core = _engine(half_dir, half)
    dtype = getattr(torch, half)
    assert core.runner.dtype == core.runner.kv_caches[0][0].dtype == dtype
    model = transformers.AutoModelForCausalLM.from_pretrained(half_dir, dtype=dtype)
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
        torch.testing.assert_close(ours, ref, atol=LOGIT_TOLERANCE[half], rtol=0)


def test_greedy_tokens_match_transformers_generate(half_dir: Path, half: str) -> None:
    """Token for token with ``generate`` in the same dtype, up to the first step where
    transformers' top two logits are closer than that dtype can tell apart (a near-tie either
    side may take)."""
    if half == "bfloat16" and not cpu_has_native_bf16():
        pytest.skip("bf16 is emulated on this CPU")
    core = _engine(half_dir, half)
    model = transformers.AutoModelForCausalLM.from_pretrained(half_dir, dtype=getattr(torch, half))
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
            if top[0] - top[1] < 2 * LOGIT_TOLERANCE[half]:
                break
            assert ours[step] == theirs[step], (i, step, ours, theirs)
            compared += 1
    assert compared >= 8, "too few decisive steps to say anything"
