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
