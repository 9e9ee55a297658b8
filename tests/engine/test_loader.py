"""Checkpoint spellings the loader must accept, each checked against transformers' logits."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import transformers

from izh_trio.engine.block_manager import BlockManager
from izh_trio.engine.loader import CheckpointError, ModelConfig
from izh_trio.engine.model_runner import ModelRunner
from izh_trio.engine.models import resolve
from izh_trio.engine.scheduler import ScheduledSeq
from izh_trio.engine.sequence import Sequence
from izh_trio.wire import EngineConfig, SamplingParams
from tests.conftest import save_transformers_qwen3

PROMPT = [3, 141, 59, 265, 358, 979, 323, 846]


def _last_logits(model_dir: Path, *, decode: bool = False, **cfg: object) -> torch.Tensor:
    """The prompt's last logits; with ``decode``, its prefix prefilled and its last token
    decoded through the paged cache."""
    runner = ModelRunner(EngineConfig(model_dir=str(model_dir), num_kv_blocks=8, **cfg))
    seq = Sequence(request_id="x", token_ids=list(PROMPT), params=SamplingParams(),
                   stop_token_ids=frozenset())
    bm = BlockManager(runner.num_blocks, runner.block_size)
    assert bm.allocate_slots(seq, len(PROMPT))
    if not decode:
        return runner.execute([ScheduledSeq(seq, len(PROMPT))]).sample[0]
    runner.execute([ScheduledSeq(seq, len(PROMPT) - 1)])
    seq.num_computed_tokens = len(PROMPT) - 1
    return runner.execute([ScheduledSeq(seq, 1)]).sample[0]


def _reference(model_dir: Path, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).eval()
    with torch.inference_mode():
        return model(torch.tensor([PROMPT])).logits[0, -1].float()


def test_sharded_untied_checkpoint(tmp_path: Path, tiny_dir: Path) -> None:
    d = save_transformers_qwen3(tmp_path / "m", tiny_dir, tie=False, seed=3)
    model = transformers.AutoModelForCausalLM.from_pretrained(d)
    model.save_pretrained(tmp_path / "sharded", max_shard_size="400KB")
    sharded = tmp_path / "sharded"
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        (sharded / name).write_bytes((d / name).read_bytes())
    assert (sharded / "model.safetensors.index.json").is_file()
    assert len(list(sharded.glob("model-*.safetensors"))) > 1
    torch.testing.assert_close(_last_logits(sharded), _reference(d), atol=1e-4, rtol=0)


def test_old_config_spelling(tmp_path: Path, tiny_dir: Path) -> None:
    """transformers < 4.56 wrote ``rope_theta`` and ``torch_dtype`` at the top level."""
    d = save_transformers_qwen3(tmp_path / "m", tiny_dir, rope_theta=50000.0)
    raw = json.loads((d / "config.json").read_text())
    expected = _reference(d)
    theta = raw.pop("rope_parameters")["rope_theta"]
    raw["rope_theta"] = theta
    raw["torch_dtype"] = raw.pop("dtype", "float32")
    (d / "config.json").write_text(json.dumps(raw))
    cfg = ModelConfig.from_dir(d)
    assert cfg.rope_theta == 50000.0 and cfg.dtype == torch.float32
    torch.testing.assert_close(_last_logits(d), expected, atol=1e-4, rtol=0)


def test_bfloat16_checkpoint(tmp_path: Path, tiny_dir: Path) -> None:
    d = save_transformers_qwen3(tmp_path / "m", tiny_dir, dtype="bfloat16")
    model = transformers.AutoModelForCausalLM.from_pretrained(d, dtype=torch.bfloat16)
    model.save_pretrained(d)
    assert ModelConfig.from_dir(d).dtype == torch.bfloat16
    # bf16 rounding differs with operation order: compare to fp32 math on the same weights,
    # through prefill and through the decode path (which is not the fp32 CPU kernel's).
    for decode in (False, True):
        torch.testing.assert_close(_last_logits(d, decode=decode), _reference(d, torch.float32),
                                   atol=0.05, rtol=0)
    # fp32 serving of the same bf16 weights matches the fp32 reference tightly.
    torch.testing.assert_close(_last_logits(d, dtype="float32"), _reference(d), atol=1e-4,
                               rtol=0)


def test_eos_ids_come_from_generation_config(hf_dir: Path) -> None:
    assert ModelConfig.from_dir(hf_dir).eos_token_ids == (1993, 1991)


@pytest.mark.parametrize("edit", [{"model_type": "llama"}, {"torch_dtype": "int8", "dtype": None},
                                  {"rope_parameters": {"rope_type": "longrope", "factor": 4.0}},
                                  {"rope_parameters": {"rope_type": "llama3", "factor": 8.0}}])
def test_unsupported_configs_are_clear_errors(tmp_path: Path, hf_dir: Path, edit: dict) -> None:
    raw = json.loads((hf_dir / "config.json").read_text())
    raw.update(edit)
    raw = {k: v for k, v in raw.items() if v is not None}
    (tmp_path / "config.json").write_text(json.dumps(raw))
    with pytest.raises(CheckpointError):
        resolve(tmp_path)
