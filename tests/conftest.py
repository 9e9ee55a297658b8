"""Shared fixtures: real checkpoints on disk, built once per test session."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from izh_trio.tiny import make_tiny_checkpoint


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "timing: acts on requests while they run, or bounds how long something "
        "takes; written to pass on a machine of any speed (paced engine, waits for states), "
        "and run by .ci/run pinned to one core and with every core busy")


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "generation_config.json")


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Our embedded checkpoint: untied head, trained tokenizer, Qwen3 chat template."""
    return make_tiny_checkpoint(tmp_path_factory.mktemp("ckpt") / "tiny")


def save_transformers_qwen3(
    out: Path, tokenizer_dir: Path, *, tie: bool = True, seed: int = 0, **overrides: object
) -> Path:
    """A random Qwen3 written by transformers' own save_pretrained, with our tokenizer files."""
    import torch
    import transformers

    fields = dict(vocab_size=2000, hidden_size=128, intermediate_size=384, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                  max_position_embeddings=2048, tie_word_embeddings=tie, rope_theta=10000.0,
                  eos_token_id=1993, bos_token_id=1991)
    fields.update(overrides)
    config = transformers.Qwen3Config(**fields)
    torch.manual_seed(seed)
    model = transformers.Qwen3ForCausalLM(config)
    model.save_pretrained(out)
    for name in TOKENIZER_FILES:
        shutil.copy(tokenizer_dir / name, out / name)
    return out


@pytest.fixture(scope="session")
def hf_dir(tmp_path_factory: pytest.TempPathFactory, tiny_dir: Path) -> Path:
    """A transformers-made Qwen3 with a tied head, as Qwen3-0.6B has."""
    return save_transformers_qwen3(tmp_path_factory.mktemp("ckpt") / "hf-qwen3", tiny_dir)


#: Tags a hub tokenizer.json may mark special while tokenizer_config.json says they are not.
MARKERS = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>",
           "</think>")


def save_disagreeing_tokenizer(tokenizer_dir: Path, out: Path) -> Path:
    """The tokenizer re-saved by transformers' ``save_pretrained``, then given what some hub
    checkpoints carry: ``tokenizer.json`` marks the chat markers special while the config's
    ``added_tokens_decoder`` (which transformers honours) says they are not."""
    import transformers

    transformers.AutoTokenizer.from_pretrained(tokenizer_dir).save_pretrained(out)
    path = out / "tokenizer.json"
    data = json.loads(path.read_text())
    decoder = {}
    for token in data["added_tokens"]:
        decoder[str(token["id"])] = {k: v for k, v in token.items() if k != "id"}
        if token["content"] in MARKERS:
            token["special"] = True
    path.write_text(json.dumps(data, ensure_ascii=False))
    config_path = out / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["added_tokens_decoder"] = decoder
    config_path.write_text(json.dumps(config, indent=2, ensure_ascii=False))
    return out


@pytest.fixture(scope="session")
def hub_dir(tmp_path_factory: pytest.TempPathFactory, tiny_dir: Path) -> Path:
    """A transformers-made Qwen3 (tied head) whose tokenizer files were written by
    transformers too, with the tokenizer.json/config disagreement on the chat markers."""
    out = tmp_path_factory.mktemp("ckpt") / "hub-qwen3"
    save_transformers_qwen3(out, tiny_dir)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (out / name).unlink()
    save_disagreeing_tokenizer(tiny_dir, out)
    return out
