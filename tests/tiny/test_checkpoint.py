"""The tiny checkpoint must load in transformers like a real Qwen3 and build reproducibly."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from importlib.resources import files
from pathlib import Path

import attrs
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors import safe_open

from izh_trio.tiny import TinySpec, default_tiny_dir, make_tiny_checkpoint
from izh_trio.tiny.checkpoint import CHECKPOINT_FILES, TINY_DIR_NAME
from izh_trio.tiny.weights import weight_shapes

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

ADDED = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
    "<think>",
    "</think>",
]
SAMPLES = [
    "Hello, world!",
    "naïve café — 你好\uff0c世界 🦙🎉👩‍👩‍👧 ünïcödé",
    "  leading spaces\ttabs\r\nCRLF\n\n\ntrailing   ",
    '{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}',
    "<|im_start|>user\nhi<|im_end|>\n<think>\nhmm\n</think>\n\n<tool_call>x</tool_call>",
    "",
]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_checkpoint(tmp_path_factory.mktemp("tiny") / "ckpt")


@pytest.fixture(scope="module")
def hf_tok(ckpt: Path):
    return transformers.AutoTokenizer.from_pretrained(ckpt)


@pytest.fixture(scope="module")
def raw_tok(ckpt: Path):
    return tokenizers.Tokenizer.from_file(str(ckpt / "tokenizer.json"))


def _read_json(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def test_layout_and_configs(ckpt: Path) -> None:
    assert {p.name for p in ckpt.iterdir()} >= set(CHECKPOINT_FILES)
    cfg = _read_json(ckpt / "config.json")
    spec = TinySpec()
    assert cfg["architectures"] == ["Qwen3ForCausalLM"]
    assert cfg["model_type"] == "qwen3"
    assert cfg["vocab_size"] == spec.vocab_size == 2000
    assert (cfg["bos_token_id"], cfg["eos_token_id"]) == (1991, 1993)
    gen = _read_json(ckpt / "generation_config.json")
    assert gen["eos_token_id"] == [1993, 1991]
    assert gen["pad_token_id"] == 1991
    assert (gen["temperature"], gen["top_p"], gen["top_k"]) == (0.6, 0.95, 20)
    tcfg = _read_json(ckpt / "tokenizer_config.json")
    template = files("izh_trio.tiny").joinpath("qwen3_chat_template.jinja").read_text("utf-8")
    assert tcfg["chat_template"] == template
    decoder = {
        int(k): (v["content"], v["special"]) for k, v in tcfg["added_tokens_decoder"].items()
    }
    assert decoder == {1991 + i: (t, i < 3) for i, t in enumerate(ADDED)}


def test_added_tokens_are_single_ids(hf_tok) -> None:
    assert len(hf_tok) == 2000
    for i, token in enumerate(ADDED):
        assert hf_tok.encode(token, add_special_tokens=False) == [1991 + i]
        assert hf_tok.convert_tokens_to_ids(token) == 1991 + i
    assert (hf_tok.eos_token, hf_tok.eos_token_id) == ("<|im_end|>", 1993)
    assert (hf_tok.pad_token, hf_tok.pad_token_id) == ("<|endoftext|>", 1991)
    assert hf_tok.bos_token is None


def test_json_pieces_are_learned(raw_tok) -> None:
    """Tool-call text should not fall apart into bytes, or engine tests get very long prompts."""
    for piece in ['{"', '":', "name", "arguments"]:
        assert len(raw_tok.encode(piece).ids) == 1, piece


@pytest.mark.parametrize("text", SAMPLES)
def test_roundtrip_and_agreement(hf_tok, raw_tok, text: str) -> None:
    ids = hf_tok.encode(text, add_special_tokens=False)
    assert ids == raw_tok.encode(text, add_special_tokens=False).ids
    assert hf_tok.decode(ids) == text


@settings(max_examples=150, deadline=None)
@given(text=st.text(max_size=60))
def test_roundtrip_any_text(hf_tok, raw_tok, text: str) -> None:
    """Byte-level BPE covers every byte, so only NFC normalization may change the text."""
    ids = raw_tok.encode(text, add_special_tokens=False).ids
    assert hf_tok.decode(ids) == raw_tok.normalizer.normalize_str(text)
    assert raw_tok.decode(ids, skip_special_tokens=False) == raw_tok.normalizer.normalize_str(text)


def test_chat_template(hf_tok) -> None:
    messages = [{"role": "user", "content": "hi"}]
    rendered = hf_tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert rendered == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    no_think = hf_tok.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True, enable_thinking=False
    )
    assert no_think.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_weights_file(ckpt: Path) -> None:
    spec = TinySpec()
    with safe_open(str(ckpt / "model.safetensors"), framework="numpy") as f:
        assert f.metadata() == {"format": "pt"}
        names = set(f.keys())
        assert names == set(weight_shapes(spec))
        # The default is untied: tied random embeddings make greedy decoding echo its input.
        assert "lm_head.weight" in names
        for name in names:
            t = f.get_tensor(name)
            assert t.dtype == np.float32
            assert t.shape == weight_shapes(spec)[name]
        np.testing.assert_array_equal(f.get_tensor("model.layers.0.self_attn.q_norm.weight"), 1)
        emb = f.get_tensor("model.embed_tokens.weight")
        assert abs(float(emb.std()) - spec.init_std) < 1e-3


def test_transformers_loads_model(ckpt: Path, hf_tok) -> None:
    torch = pytest.importorskip("torch")
    model, info = transformers.AutoModelForCausalLM.from_pretrained(ckpt, output_loading_info=True)
    assert not info["missing_keys"]
    assert not info["unexpected_keys"]
    assert not info.get("mismatched_keys")
    assert type(model).__name__ == "Qwen3ForCausalLM"
    assert model.config.vocab_size == len(hf_tok)
    assert model.lm_head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr()
    ids = torch.tensor([hf_tok.encode("hello world", add_special_tokens=False)])
    with torch.no_grad():
        logits = model(ids).logits
    assert logits.shape == (1, ids.shape[1], 2000)
    assert torch.isfinite(logits).all()


def test_tied_spec_has_no_lm_head(tmp_path: Path) -> None:
    spec = TinySpec(vocab_size=600, num_hidden_layers=1, tie_word_embeddings=True, seed=3)
    out = make_tiny_checkpoint(tmp_path / "tied", spec)
    with safe_open(str(out / "model.safetensors"), framework="numpy") as f:
        assert "lm_head.weight" not in set(f.keys())
    assert tokenizers.Tokenizer.from_file(str(out / "tokenizer.json")).get_vocab_size() == 600
    assert _read_json(out / "config.json")["eos_token_id"] == 593


def test_build_is_deterministic(ckpt: Path, tmp_path: Path) -> None:
    again = make_tiny_checkpoint(tmp_path / "again")
    for name in CHECKPOINT_FILES:
        assert (again / name).read_bytes() == (ckpt / name).read_bytes(), name


def test_no_torch_and_thread_count_independent(ckpt: Path, tmp_path: Path) -> None:
    """The frontend imports this; it must not pull in torch, and rayon threads must not matter."""
    script = textwrap.dedent(
        """
        import sys
        import izh_trio.tiny
        izh_trio.tiny.make_tiny_checkpoint(sys.argv[1])
        assert "torch" not in sys.modules, "izh_trio.tiny imported torch"
        """
    )
    out = tmp_path / "sub"
    env = {**os.environ, "RAYON_NUM_THREADS": "3"}
    proc = subprocess.run(
        [sys.executable, "-c", script, str(out)], env=env, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == ""  # importing `this` would have printed the Zen of Python
    assert (out / "tokenizer.json").read_bytes() == (ckpt / "tokenizer.json").read_bytes()


def test_existing_dirs(ckpt: Path, tmp_path: Path) -> None:
    mtime = (ckpt / "model.safetensors").stat().st_mtime_ns
    assert make_tiny_checkpoint(ckpt) == ckpt
    assert (ckpt / "model.safetensors").stat().st_mtime_ns == mtime
    assert not [p for p in ckpt.parent.iterdir() if p.name.startswith(".")]  # no temp leftovers
    empty = tmp_path / "empty"
    empty.mkdir()
    assert (make_tiny_checkpoint(empty) / "config.json").is_file()
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError):
        make_tiny_checkpoint(foreign)
    with pytest.raises(FileExistsError):  # complete, but for another spec
        make_tiny_checkpoint(ckpt, TinySpec(seed=1))


def test_default_tiny_dir_caches(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("IZH_CACHE_DIR", str(tmp_path))
    first = default_tiny_dir()
    assert first == tmp_path / TINY_DIR_NAME
    mtime = (first / "model.safetensors").stat().st_mtime_ns
    assert default_tiny_dir() == first
    assert (first / "model.safetensors").stat().st_mtime_ns == mtime


def test_default_tiny_dir_replaces_stale(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("IZH_CACHE_DIR", str(tmp_path))
    stale = tmp_path / TINY_DIR_NAME
    stale.mkdir()
    (stale / "config.json").write_text("{}")
    out = default_tiny_dir()
    assert out == stale
    assert _read_json(out / "config.json")["model_type"] == "qwen3"


def test_default_tiny_dir_concurrent(tmp_path: Path) -> None:
    script = "import izh_trio.tiny as t; print(t.default_tiny_dir())"
    env = {**os.environ, "IZH_CACHE_DIR": str(tmp_path)}
    procs = [
        subprocess.Popen([sys.executable, "-c", script], env=env, stdout=subprocess.PIPE, text=True)
        for _ in range(3)
    ]
    outs = {p.communicate(timeout=120)[0].strip() for p in procs}
    assert all(p.returncode == 0 for p in procs)
    assert outs == {str(tmp_path / TINY_DIR_NAME)}
    leftovers = {p.name for p in tmp_path.iterdir()}
    assert leftovers == {TINY_DIR_NAME, f"{TINY_DIR_NAME}.lock"}


def test_spec_validation() -> None:
    with pytest.raises(ValueError, match="multiple"):
        TinySpec(num_attention_heads=4, num_key_value_heads=3)
    with pytest.raises(ValueError):
        TinySpec(hidden_size=0)
    with pytest.raises(ValueError):
        TinySpec(init_std=-1.0)
    with pytest.raises(ValueError):
        TinySpec(vocab_size=100)
    with pytest.raises(TypeError):
        TinySpec(hidden_size=256.0)  # type: ignore[arg-type]
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        TinySpec().seed = 1  # type: ignore[misc]
    assert TinySpec(rope_theta=10_000).rope_theta == 10_000.0


def test_filler_tokens(tmp_path: Path) -> None:
    """A vocabulary larger than the corpus teaches: the learned BPE encodes text as a
    tokenizer of the learned size does, every filler id decodes to its own text (transformers
    agrees), and the added tokens stay at the end, where the configs say."""
    torch = pytest.importorskip("torch")
    spec = TinySpec(vocab_size=700, learned_vocab=600, num_hidden_layers=1, seed=4)
    out = make_tiny_checkpoint(tmp_path / "filled", spec)
    plain = make_tiny_checkpoint(tmp_path / "plain", TinySpec(vocab_size=600, num_hidden_layers=1))
    filled = tokenizers.Tokenizer.from_file(str(out / "tokenizer.json"))
    learned = tokenizers.Tokenizer.from_file(str(plain / "tokenizer.json"))
    assert filled.get_vocab_size() == 700 and _read_json(out / "config.json")["vocab_size"] == 700
    text = f"{json.__doc__} {textwrap.__doc__} x <5> 591 {{\"a\": [1, 2.5]}}"  # no added token
    assert filled.encode(text, add_special_tokens=False).ids == \
        learned.encode(text, add_special_tokens=False).ids
    hf = transformers.AutoTokenizer.from_pretrained(out)
    for i in (591, 640, 690):
        assert filled.decode([i]) == hf.decode([i]) == f" <{i}>"
    assert _read_json(out / "config.json")["eos_token_id"] == filled.token_to_id("<|im_end|>") > 690
    model = transformers.AutoModelForCausalLM.from_pretrained(out)
    with torch.no_grad():
        assert model(torch.tensor([[1, 2, 3]])).logits.shape == (1, 3, 700)
    with pytest.raises(ValueError, match="learned_vocab"):
        TinySpec(vocab_size=600, learned_vocab=601)


def test_named_shapes_are_valid_specs() -> None:
    from izh_trio.tiny import SHAPES

    spec = SHAPES["qwen3-0.6b"]
    assert (spec.vocab_size, spec.hidden_size, spec.num_hidden_layers) == (151_936, 1024, 28)
    params = sum(int(np.prod(s)) for s in weight_shapes(spec).values())
    assert 590e6 < params < 600e6  # Qwen3-0.6B's 596 M, its embedding tied to the head
