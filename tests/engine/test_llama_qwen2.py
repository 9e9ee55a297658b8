"""Llama and Qwen2 checkpoints made by transformers' own classes: our fp32 logits against
theirs (every prompt position, and decode through the paged cache), greedy tokens against
``generate``, and the families the registry knows."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
import transformers

from izh_trio.engine.core import EngineCore
from izh_trio.engine.loader import CheckpointError
from izh_trio.engine.models import FAMILIES, resolve
from izh_trio.wire import AddRequest, EngineConfig, SamplingParams
from tests.conftest import TOKENIZER_FILES
from tests.engine.logits import every_position

PROMPTS = [[3, 141, 59, 265, 358, 979, 323, 846], list(range(40, 140)), [1200, 7],
           [(7 * i) % 1900 + 50 for i in range(200)]]  # 200 tokens: far past a 32-token window
BASE = dict(vocab_size=2000, hidden_size=128, intermediate_size=384, num_hidden_layers=2,
            max_position_embeddings=512, rope_theta=10000.0, eos_token_id=1993,
            bos_token_id=1991, initializer_range=0.05)
LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
SHAPES = {
    "llama-gqa-tied": ("LlamaConfig", "LlamaForCausalLM",
                       dict(num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                            tie_word_embeddings=True)),
    "llama-mha-biases-llama3": ("LlamaConfig", "LlamaForCausalLM",
                                dict(num_attention_heads=4, num_key_value_heads=4,
                                     attention_bias=True, mlp_bias=True,
                                     tie_word_embeddings=False, rope_scaling=LLAMA3_ROPE)),
    "llama-linear-rope": ("LlamaConfig", "LlamaForCausalLM",
                          dict(num_attention_heads=4, num_key_value_heads=1,
                               tie_word_embeddings=False,
                               rope_scaling={"rope_type": "linear", "factor": 2.0})),
    "qwen2-gqa": ("Qwen2Config", "Qwen2ForCausalLM",
                  dict(num_attention_heads=4, num_key_value_heads=2,
                       tie_word_embeddings=False)),
    "qwen2-yarn": ("Qwen2Config", "Qwen2ForCausalLM",
                   dict(num_attention_heads=4, num_key_value_heads=2,
                        tie_word_embeddings=False,
                        rope_scaling={"rope_type": "yarn", "factor": 4.0,
                                      "original_max_position_embeddings": 64})),
    "mistral-window-32": ("MistralConfig", "MistralForCausalLM",
                          dict(num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                               tie_word_embeddings=False, sliding_window=32)),
    "qwen3-moe-8x2": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM",
                      dict(num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                           tie_word_embeddings=False, num_experts=8, num_experts_per_tok=2,
                           moe_intermediate_size=64, norm_topk_prob=True, mlp_only_layers=[0],
                           decoder_sparse_step=1)),
    "qwen2-tied": ("Qwen2Config", "Qwen2ForCausalLM",
                   dict(num_attention_heads=8, num_key_value_heads=2,
                        tie_word_embeddings=True)),
}


def make_family(shape: str, out: Path, tiny_dir: Path, **overrides: object) -> Path:
    """A checkpoint of ``SHAPES[shape]`` saved by transformers (random weights, biases
    too), with the tiny test tokenizer."""
    config_cls, model_cls, fields = SHAPES[shape]
    config = getattr(transformers, config_cls)(**{**BASE, **fields, **overrides})
    torch.manual_seed(7)
    model = getattr(transformers, model_cls)(config)
    with torch.no_grad():  # biases start at zero: give them values, so they must be loaded
        for name, p in model.named_parameters():
            if name.endswith(".bias"):
                p.normal_(0, 0.05)
    model.save_pretrained(out)
    for name in TOKENIZER_FILES:
        shutil.copy(tiny_dir / name, out / name)
    return out


@pytest.fixture(scope="module", params=sorted(SHAPES))
def family_dir(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
               tiny_dir: Path) -> Path:
    return make_family(request.param, tmp_path_factory.mktemp("families") / request.param,
                       tiny_dir)


def _reference(model_dir: Path, ids: list[int]) -> torch.Tensor:
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    with torch.inference_mode():
        return model(torch.tensor([ids])).logits[0]


def _engine(model_dir: Path, **cfg: object) -> EngineCore:
    return EngineCore(EngineConfig(model_dir=str(model_dir), num_kv_blocks=96, block_size=8,
                                   **cfg))


def test_logits_match_transformers(family_dir: Path) -> None:
    core = _engine(family_dir)
    expected = json.loads((family_dir / "config.json").read_text())["architectures"][0]
    assert type(core.runner.model).__name__ == expected
    # on CPU the attention's RoPE and KV store run on the fused kernel, as Qwen3's do
    assert any(type(m).__name__ == "CpuAttention" for m in core.runner.model.modules())
    for ids in PROMPTS:
        torch.testing.assert_close(every_position(core.runner, ids), _reference(family_dir, ids),
                                   atol=1e-4, rtol=0)


def test_greedy_tokens_match_generate_alone_and_in_a_batch(family_dir: Path) -> None:
    model = transformers.AutoModelForCausalLM.from_pretrained(family_dir, dtype=torch.float32)
    want = {}
    for i, ids in enumerate(PROMPTS):
        with torch.inference_mode():
            out = model.generate(torch.tensor([ids]), max_new_tokens=10, do_sample=False,
                                 eos_token_id=None, pad_token_id=0)
        want[f"g{i}"] = out[0, len(ids):].tolist()
    core = _engine(family_dir, max_num_batched_tokens=64)  # chunked prefill for the long one
    got: dict[str, list[int]] = {k: [] for k in want}
    for i, ids in enumerate(PROMPTS):  # all at once: a mixed batch
        core.add_request(AddRequest(f"g{i}", ids, SamplingParams(max_tokens=10,
                                                                 temperature=0.0,
                                                                 ignore_eos=True)))
    while core.has_work:
        for o in core.step():
            got[o.request_id] += o.new_token_ids
    assert got == want


def test_an_unknown_architecture_is_named_with_the_supported_ones(tmp_path: Path,
                                                                  hf_dir: Path) -> None:
    shutil.copytree(hf_dir, tmp_path / "m")
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    config["architectures"] = ["GPTNeoXForCausalLM"]
    (tmp_path / "m" / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError) as err:
        resolve(tmp_path / "m")
    assert "GPTNeoXForCausalLM" in str(err.value)
    assert all(name in str(err.value) for name in FAMILIES)
    assert "\n" not in str(err.value)
