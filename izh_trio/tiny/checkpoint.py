"""Build a tiny random-weight Qwen3 checkpoint in Hugging Face layout, without any download.

Tests and local runs need a real-shaped checkpoint (tokenizer, configs, safetensors) that loads
with both this project's engine and ``transformers``. This module must never import torch: it
runs inside the HTTP frontend process.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import attrs

from izh_trio.tiny.spec import TinySpec
from izh_trio.tiny.tokenizer import ALL_ADDED_TOKENS, tokenizer_config, train_tokenizer
from izh_trio.tiny.weights import write_weights

# Bump when the spec defaults or the file format change, so stale caches are not reused.
FORMAT_VERSION = 2
TINY_DIR_NAME = f"tiny-qwen3-v{FORMAT_VERSION}"
CHECKPOINT_FILES: tuple[str, ...] = (
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
)
# Written last inside the temp dir; its presence (with a matching spec) means "complete".
_MARKER = ".izh_tiny_complete.json"

def _token_ids(vocab_size: int) -> dict[str, int]:
    """Added tokens sit right after the BPE vocab, in ALL_ADDED_TOKENS order."""
    first = vocab_size - len(ALL_ADDED_TOKENS)
    return {tok: first + i for i, tok in enumerate(ALL_ADDED_TOKENS)}


def model_config(spec: TinySpec) -> dict[str, Any]:
    """``config.json`` as Qwen3 checkpoints write it."""
    ids = _token_ids(spec.vocab_size)
    return {
        "architectures": ["Qwen3ForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": ids["<|endoftext|>"],
        "eos_token_id": ids["<|im_end|>"],
        "head_dim": spec.head_dim,
        "hidden_act": "silu",
        "hidden_size": spec.hidden_size,
        "initializer_range": spec.init_std,
        "intermediate_size": spec.intermediate_size,
        "max_position_embeddings": spec.max_position_embeddings,
        "max_window_layers": spec.num_hidden_layers,
        "model_type": "qwen3",
        "num_attention_heads": spec.num_attention_heads,
        "num_hidden_layers": spec.num_hidden_layers,
        "num_key_value_heads": spec.num_key_value_heads,
        "rms_norm_eps": spec.rms_norm_eps,
        "rope_scaling": None,
        "rope_theta": spec.rope_theta,
        "sliding_window": None,
        "tie_word_embeddings": spec.tie_word_embeddings,
        "torch_dtype": "float32",
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": spec.vocab_size,
    }


def generation_config(spec: TinySpec) -> dict[str, Any]:
    """Qwen3's shipped sampling defaults (thinking mode)."""
    ids = _token_ids(spec.vocab_size)
    return {
        "bos_token_id": ids["<|endoftext|>"],
        "do_sample": True,
        "eos_token_id": [ids["<|im_end|>"], ids["<|endoftext|>"]],
        "pad_token_id": ids["<|endoftext|>"],
        "temperature": 0.6,
        "top_k": 20,
        "top_p": 0.95,
    }


def _write_json(path: Path, obj: Any) -> None:
    """Sorted keys and a fixed layout so two builds are byte-identical."""
    text = json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
    path.write_text(text, encoding="utf-8")


def _marker_payload(spec: TinySpec) -> dict[str, Any]:
    return {"format_version": FORMAT_VERSION, "spec": attrs.asdict(spec)}


def _is_complete(out_dir: Path, spec: TinySpec) -> bool:
    """True when out_dir holds a finished build of exactly this spec."""
    try:
        marker = json.loads((out_dir / _MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    if marker != _marker_payload(spec):
        return False
    return all((out_dir / name).is_file() for name in CHECKPOINT_FILES)


def _write_all(dest: Path, spec: TinySpec) -> None:
    tok = train_tokenizer(spec.vocab_size, spec.learned_vocab)
    expected = _token_ids(spec.vocab_size)
    actual = {t: tok.token_to_id(t) for t in ALL_ADDED_TOKENS}
    if actual != expected:
        raise RuntimeError(f"added token ids {actual} differ from the layout {expected}")
    (dest / "tokenizer.json").write_text(tok.to_str(pretty=True) + "\n", encoding="utf-8")
    _write_json(dest / "tokenizer_config.json", tokenizer_config(tok, spec.max_position_embeddings))
    _write_json(dest / "config.json", model_config(spec))
    _write_json(dest / "generation_config.json", generation_config(spec))
    write_weights(spec, dest / "model.safetensors")
    _write_json(dest / _MARKER, _marker_payload(spec))


DEFAULT_SPEC = TinySpec()


def make_tiny_checkpoint(out_dir: Path | str, spec: TinySpec = DEFAULT_SPEC) -> Path:
    """Build the checkpoint into ``out_dir`` atomically; return it as-is if already built.

    Files are written to a temp dir beside ``out_dir`` and renamed into place, so readers never
    see a half-written checkpoint. ``out_dir`` may be missing or empty; a non-empty directory that
    is not a finished build of ``spec`` is refused rather than overwritten.
    """
    out = Path(out_dir)
    if _is_complete(out, spec):
        return out
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise FileExistsError(f"{out} exists and is not a tiny checkpoint of this spec")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
    try:
        _write_all(tmp, spec)
        # mkdtemp makes 0700 and safetensors writes 0600; make the result readable like any cache.
        tmp.chmod(0o755)
        for path in tmp.iterdir():
            path.chmod(0o644)
        try:
            os.replace(tmp, out)  # atomic; succeeds over a missing or empty directory
        except OSError:
            if _is_complete(out, spec):  # another builder finished first
                return out
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # nothing left to remove after a rename
    return out


def cache_root() -> Path:
    """``$IZH_CACHE_DIR``, else ``~/.cache/izh_trio``."""
    env = os.environ.get("IZH_CACHE_DIR")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "izh_trio"


def default_tiny_dir() -> Path:
    """The shared cached tiny checkpoint, built on first use.

    A ``flock`` on a lock file beside it makes concurrent processes wait for one build instead
    of racing; a stale directory (older format or spec) is discarded and rebuilt.
    """
    spec = DEFAULT_SPEC
    root = cache_root()
    out = root / TINY_DIR_NAME
    if _is_complete(out, spec):
        return out
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f"{TINY_DIR_NAME}.lock", "a+b") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file is closed
        if not _is_complete(out, spec):
            if out.exists():
                stale = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".stale", dir=root))
                os.replace(out, stale / out.name)
                shutil.rmtree(stale, ignore_errors=True)
            make_tiny_checkpoint(out, spec)
    return out
