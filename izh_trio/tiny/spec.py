"""The tiny model's shape and initialisation: one frozen, validated value the checkpoint's
configs and weights are both written from."""

from __future__ import annotations

import attrs
from attrs import validators as v

from izh_trio.tiny.tokenizer import ALL_ADDED_TOKENS

_pos_int = [v.instance_of(int), v.gt(0)]
_pos_float = [v.instance_of(float), v.gt(0.0)]


@attrs.frozen
class TinySpec:
    """Shape and init of the tiny model; every field lands in config.json or the weights."""

    vocab_size: int = attrs.field(default=2000, validator=_pos_int)
    hidden_size: int = attrs.field(default=256, validator=_pos_int)
    intermediate_size: int = attrs.field(default=768, validator=_pos_int)
    num_hidden_layers: int = attrs.field(default=2, validator=_pos_int)
    num_attention_heads: int = attrs.field(default=4, validator=_pos_int)
    num_key_value_heads: int = attrs.field(default=2, validator=_pos_int)
    head_dim: int = attrs.field(default=64, validator=_pos_int)
    max_position_embeddings: int = attrs.field(default=4096, validator=_pos_int)
    rope_theta: float = attrs.field(default=1_000_000.0, converter=float, validator=_pos_float)
    rms_norm_eps: float = attrs.field(default=1e-6, converter=float, validator=_pos_float)
    tie_word_embeddings: bool = attrs.field(default=False, validator=v.instance_of(bool))
    seed: int = attrs.field(default=0, validator=[v.instance_of(int), v.ge(0)])
    init_std: float = attrs.field(default=0.02, converter=float, validator=_pos_float)
    #: BPE tokens learned from the corpus, at most ``vocab_size``; the rest up to the added
    #: tokens are fillers, each decoding to text (`` <1234>``) and never produced by encoding:
    #: a real model's vocabulary size without a corpus to learn it from, every id of which a
    #: random model may sample and a client sees as text. Default: all learned.
    learned_vocab: int | None = attrs.field(default=None, validator=v.optional(_pos_int))

    def __attrs_post_init__(self) -> None:
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_key_value_heads})"
            )
        if self.head_dim % 2:
            raise ValueError(f"head_dim ({self.head_dim}) must be even for rotary embeddings")
        smallest = 256 + len(ALL_ADDED_TOKENS)  # byte alphabet plus the added tokens
        if self.vocab_size < smallest:
            raise ValueError(f"vocab_size ({self.vocab_size}) must be at least {smallest}")
        if self.learned_vocab is not None and not smallest <= self.learned_vocab <= self.vocab_size:
            raise ValueError(f"learned_vocab ({self.learned_vocab}) must be from {smallest} to "
                             f"vocab_size ({self.vocab_size})")


#: Real models' shapes with the tiny tokenizer and random weights, for benchmarks
#: (``izh-trio make-tiny --shape NAME``); their weights are what costs, not their vocabulary.
SHAPES: dict[str, TinySpec] = {
    "qwen3-0.6b": TinySpec(vocab_size=151_936, learned_vocab=4096, hidden_size=1024,
                           intermediate_size=3072, num_hidden_layers=28,
                           num_attention_heads=16, num_key_value_heads=8, head_dim=128,
                           max_position_embeddings=40_960, tie_word_embeddings=True),
}
