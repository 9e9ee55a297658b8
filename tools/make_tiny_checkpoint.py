"""Write the embedded tiny Qwen3 checkpoint (or a variant) to a directory.

    python tools/make_tiny_checkpoint.py OUT_DIR [--layers 2 --hidden 256 --vocab 2000 ...]

The defaults are the checkpoint ``izh-trio serve`` builds for itself; the flags make the
shapes used by benchmarks (e.g. ``--head-dim 64`` for vLLM's CPU attention).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from izh_trio.tiny import TinySpec, make_tiny_checkpoint


def main() -> None:
    d = TinySpec()
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", type=Path)
    p.add_argument("--vocab", type=int, default=d.vocab_size)
    p.add_argument("--hidden", type=int, default=d.hidden_size)
    p.add_argument("--intermediate", type=int, default=d.intermediate_size)
    p.add_argument("--layers", type=int, default=d.num_hidden_layers)
    p.add_argument("--heads", type=int, default=d.num_attention_heads)
    p.add_argument("--kv-heads", type=int, default=d.num_key_value_heads)
    p.add_argument("--head-dim", type=int, default=d.head_dim)
    p.add_argument("--tie", action="store_true", help="tie the LM head to the embeddings")
    p.add_argument("--seed", type=int, default=d.seed)
    a = p.parse_args()
    spec = TinySpec(vocab_size=a.vocab, hidden_size=a.hidden, intermediate_size=a.intermediate,
                    num_hidden_layers=a.layers, num_attention_heads=a.heads,
                    num_key_value_heads=a.kv_heads, head_dim=a.head_dim,
                    tie_word_embeddings=a.tie, seed=a.seed)
    print(make_tiny_checkpoint(a.out, spec))


if __name__ == "__main__":
    main()
