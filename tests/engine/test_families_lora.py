"""PEFT LoRA adapters on every family's checkpoint (made by transformers' own classes): greedy
tokens of a mixed batch (base and adapter requests together) equal peft's merged model's.

Dense families adapt all seven linears (attention and MLP); Qwen3-MoE its attention (the
experts and the dense layers' MLPs are not adapted: peft adapts transformers' fused experts
as ``target_parameters``, which is refused by name)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from izh_trio.engine.core import EngineCore
from izh_trio.engine.lora.adapter import LoraError, LoraTargets, load_adapter
from izh_trio.engine.models import resolve
from izh_trio.wire import AddRequest, EngineConfig, SamplingParams
from tests.engine.test_llama_qwen2 import PROMPTS, make_family
from tests.lora_helpers import ALL_SEVEN, greedy, merged_model, save_peft_lora

ATTENTION = ["q_proj", "k_proj", "v_proj", "o_proj"]
FAMILIES = {"llama-mha-biases-llama3": ALL_SEVEN, "qwen2-gqa": ALL_SEVEN,
            "mistral-window-32": ALL_SEVEN, "qwen3-moe-8x2": ATTENTION}
N = 8


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
           tiny_dir: Path) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("family-lora")
    base = make_family(request.param, root / "base", tiny_dir, initializer_range=0.1)
    adapter = save_peft_lora(root / "adapter", base, r=8, alpha=16,
                             targets=FAMILIES[request.param], seed=5)
    return base, adapter


def test_mixed_batch_equals_peft_merged(family: tuple[Path, Path]) -> None:
    base, adapter = family
    want = {}
    for name, path in (("base", None), ("lora", adapter)):
        model = merged_model(base, path)
        for i, ids in enumerate(PROMPTS[:3]):
            want[f"{name}-{i}"] = greedy(model, ids, N)
    core = EngineCore(EngineConfig(model_dir=str(base), num_kv_blocks=96, block_size=8,
                                   max_num_batched_tokens=64,
                                   lora_modules=(("lora", str(adapter)),)))
    params = SamplingParams(max_tokens=N, temperature=0.0, ignore_eos=True)
    for rid in want:
        name, i = rid.rsplit("-", 1)
        assert core.add_request(AddRequest(rid, PROMPTS[int(i)], params,
                                           lora_name=None if name == "base" else "lora")
                                ) is None
    got: dict[str, list[int]] = {rid: [] for rid in want}
    while core.has_work:
        for out in core.step():
            got[out.request_id] += out.new_token_ids
    assert got == want
    assert got["base-0"] != got["lora-0"]  # the adapter changes what is generated


def test_moe_experts_are_not_adapter_targets(tmp_path: Path, tiny_dir: Path) -> None:
    base = make_family("qwen3-moe-8x2", tmp_path / "base", tiny_dir)
    adapter = save_peft_lora(tmp_path / "adapter", base, r=4, alpha=8,
                             targets=["q_proj", "down_proj"], seed=1)
    config, model_cls = resolve(base)
    with pytest.raises(LoraError, match="target_parameters"):
        load_adapter("x", str(adapter), LoraTargets.of(model_cls, config), 16, torch.float32)
