"""Offline generation speed of every model family the engine serves, on one shape.

    python -m tools.micro.bench_families [--dtype float32] [--seqs 32] [--prompt 64]
        [--output 64] [--rounds 2] [--hidden 512] [--layers 4]

For each family, a checkpoint made by transformers' own classes (random weights, written
once under ``--dir``): ``hidden`` wide, ``layers`` deep, 8 query heads and 4 KV heads of 64,
an MLP 3x as wide, a 32,000-token vocabulary; Llama with ``llama3`` RoPE scaling, Qwen2 with
q/k/v biases, Mistral with a 4,096-token sliding window (longer than the run: the same
work as Llama's), Qwen3 with its q/k norms, and Qwen3-MoE with 8 experts of a quarter of
the MLP's width, top-2 (so about the dense MLP's arithmetic per token: half). An in-process
``EngineCore`` (no HTTP) takes ``--seqs`` random prompts at once and generates
``--output`` tokens for each (greedy, EOS ignored); the figure is output tokens per second
over the whole run (prefill included), the best of ``--rounds`` rounds that take the
families in turn (a machine that slows mid-run slows them all).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import torch

from izh_trio.engine.core import EngineCore
from izh_trio.tiny import TinySpec, make_tiny_checkpoint
from izh_trio.wire import AddRequest, EngineConfig, SamplingParams

FAMILIES = {  # name: (transformers config class, model class, their own fields)
    "llama": ("LlamaConfig", "LlamaForCausalLM", dict(
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 1024})),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {}),
    "mistral": ("MistralConfig", "MistralForCausalLM", dict(sliding_window=4096)),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {}),
    "qwen3-moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM", dict(
        num_experts=8, num_experts_per_tok=2, norm_topk_prob=True, decoder_sparse_step=1)),
}


def make_family(name: str, out: Path, hidden: int, layers: int) -> Path:
    """The family's checkpoint at ``out`` (made once), with the tiny tokenizer's files."""
    if (out / "config.json").exists():
        return out
    import transformers

    config_cls, model_cls, fields = FAMILIES[name]
    shape = dict(vocab_size=32000, hidden_size=hidden, intermediate_size=3 * hidden,
                 num_hidden_layers=layers, num_attention_heads=8, num_key_value_heads=4,
                 head_dim=64, max_position_embeddings=8192, tie_word_embeddings=False)
    if name == "qwen3-moe":
        fields = {**fields, "moe_intermediate_size": 3 * hidden // 4}
    config = getattr(transformers, config_cls)(**shape, **fields)
    torch.manual_seed(0)
    getattr(transformers, model_cls)(config).save_pretrained(out)
    tokenizer = out.parent / "tokenizer"
    if not (tokenizer / "tokenizer.json").exists():
        make_tiny_checkpoint(tokenizer, TinySpec())
    for path in tokenizer.iterdir():
        if path.name.startswith(("tokenizer", "special_tokens")):
            (out / path.name).write_bytes(path.read_bytes())
    return out


def run(model_dir: Path, dtype: str, seqs: int, prompt: int, output: int) -> float:
    """Output tokens per second of one whole run."""
    total = seqs * (prompt + output)
    core = EngineCore(EngineConfig(model_dir=str(model_dir), dtype=dtype, max_num_seqs=seqs,
                                   num_kv_blocks=-(-total // 16) + seqs,
                                   max_model_len=prompt + output + 16))
    rng = np.random.default_rng(0)
    params = SamplingParams(max_tokens=output, temperature=0.0, ignore_eos=True)
    start = time.perf_counter()
    for i in range(seqs):
        ids = rng.integers(100, 30000, size=prompt).tolist()
        assert core.add_request(AddRequest(f"r{i}", ids, params)) is None
    made = 0
    while core.has_work:
        made += sum(len(o.new_token_ids) for o in core.step())
    elapsed = time.perf_counter() - start
    assert made == seqs * output, made
    return made / elapsed


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dtype", default="float32")
    p.add_argument("--dir", type=Path, default=Path.home() / ".cache" / "izh-bench-families")
    p.add_argument("--families", default=",".join(FAMILIES))
    for name, default in (("seqs", 32), ("prompt", 64), ("output", 64), ("rounds", 2),
                          ("hidden", 512), ("layers", 4)):
        p.add_argument(f"--{name}", type=int, default=default)
    a = p.parse_args()
    names = a.families.split(",")
    dirs = {n: make_family(n, a.dir / f"{n}-h{a.hidden}-l{a.layers}", a.hidden, a.layers)
            for n in names}
    best = dict.fromkeys(names, 0.0)
    for _ in range(a.rounds):
        for name in names:
            best[name] = max(best[name], run(dirs[name], a.dtype, a.seqs, a.prompt, a.output))
    print(f"{a.dtype}, {a.seqs} sequences x {a.prompt} prompt + {a.output} output tokens, "
          f"hidden {a.hidden}, {a.layers} layers: output tokens/s (best of {a.rounds})")
    for name in names:
        print(f"  {name:10} {best[name]:8.1f}")


if __name__ == "__main__":
    main()
