"""What a model family's file builds on: ``CausalLM``, the interface the model runner calls,
with the weight loading and the load-time module swaps every family shares, and
``DecoderStack``, the embedding, layers, final norm and head around a family's layers."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import ClassVar, TypeVar

import torch
from torch import nn

from izh_trio.engine import cpu_fused
from izh_trio.engine.attention import AttentionBackend, AttentionMetadata
from izh_trio.engine.loader import CheckpointError, ModelConfig
from izh_trio.engine.models.layers import KVCache, RMSNorm, RotaryEmbedding, Rotation

M = TypeVar("M", bound=nn.Module)


class CausalLM(nn.Module):
    """A decoder-only LM with Hugging Face's parameter names under ``model.`` (``lm_head``
    beside it). A family's subclass builds its modules, runs ``forward`` and
    ``compute_logits``, and fills in the tables below."""

    #: Our linear -> the checkpoint's linears stacked in its output columns, in that order:
    #: their weights are concatenated at load, and a LoRA adapter's parts land in their
    #: columns. The one place a family says how it packs its linears.
    packed_modules: ClassVar[Mapping[str, tuple[str, ...]]] = {}
    #: Module type -> a subclass running it on the compiled CPU kernels, overriding methods
    #: only (same parameters and children): swapped in at load by ``use_cpu_twins``.
    cpu_twins: ClassVar[Mapping[type[nn.Module], type[nn.Module]]] = {}

    def __init__(self, cfg: ModelConfig, max_positions: int) -> None:
        """``max_positions``: the longest sequence it will run (rotary tables are sized so)."""
        super().__init__()
        self.config = cfg

    @staticmethod
    def decoder_linears(cfg: ModelConfig) -> dict[str, tuple[int, int]]:
        """(in, out) features of each linear of a decoder layer, by its checkpoint name: the
        modules a LoRA adapter may target."""
        raise NotImplementedError

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                meta: AttentionMetadata, kv_caches: list[tuple[torch.Tensor, torch.Tensor]]
                ) -> torch.Tensor:
        """Hidden states [T, hidden] of a step's flattened tokens."""
        raise NotImplementedError

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits, fp32 for the sampler, of the rows that sample."""
        raise NotImplementedError

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Map Hugging Face names onto this module, packing linears as they arrive."""
        tied = self.config.tie_word_embeddings
        params = dict(self.named_parameters())
        part_of = {part: (packed, i) for packed, parts in self.packed_modules.items()
                   for i, part in enumerate(parts)}
        pending: dict[str, dict[int, torch.Tensor]] = {}
        stacked: dict[str, int] = {}  # pieces copied into each stacked parameter
        loaded: set[str] = set()
        for hf_name, tensor in weights:
            name = hf_name.removeprefix("model.")
            if name == "lm_head.weight" and tied:
                continue
            slot = self.stacked_slot(name)
            if slot is not None:  # one piece of a parameter that stacks many (MoE experts)
                name, index, pieces = slot
                if name not in params or params[name][index].shape != tensor.shape:
                    raise CheckpointError(f"unexpected weight {hf_name!r}")
                with torch.no_grad():
                    params[name][index].copy_(tensor)
                stacked[name] = stacked.get(name, 0) + 1
                if stacked[name] == pieces:
                    loaded.add(name)
                continue
            parts = name.split(".")
            if len(parts) >= 2 and parts[-2] in part_of:
                packed, idx = part_of[parts[-2]]
                target = ".".join([*parts[:-2], packed, parts[-1]])
                group = pending.setdefault(target, {})
                group[idx] = tensor
                if len(group) < len(self.packed_modules[packed]):
                    continue
                tensor, name = torch.cat([group[i] for i in sorted(group)]), target
                del pending[target]
            if name not in params:
                raise CheckpointError(f"unexpected weight {hf_name!r}")
            param = params[name]
            if param.shape != tensor.shape:
                raise CheckpointError(f"{hf_name}: shape {tuple(tensor.shape)}, "
                                      f"expected {tuple(param.shape)}")
            with torch.no_grad():
                param.copy_(tensor)
            loaded.add(name)
        missing = set(params) - loaded - ({"lm_head.weight"} if tied else set())
        if missing or pending:
            raise CheckpointError(f"checkpoint lacks weights: {sorted(missing | set(pending))}")

    def stacked_slot(self, name: str) -> tuple[str, tuple[int | slice, ...], int] | None:
        """Where a checkpoint tensor goes inside one of our parameters that stacks many of
        them (a mixture's experts): the parameter, the index of the piece in it, and how
        many pieces fill it. None: the tensor is a parameter of its own (the default)."""
        return None

    def use_cpu_twins(self, attention: AttentionBackend) -> int:
        """Swap every module with a twin in ``cpu_twins`` for it where the kernels can run:
        a dtype the kernels serve on CPU (``cpu_fused.serves``), and an attention backend
        whose KV store the twins may do (they store K/V in the pass that norms and rotates
        it). Returns how many."""
        weight = next(self.parameters())
        if not (attention.plain_kv_store and weight.device.type == "cpu"
                and cpu_fused.serves(weight.dtype)):
            return 0
        swapped = 0
        for name, module in list(self.named_modules()):
            twin = self.cpu_twins.get(type(module))
            if twin is not None:
                self.set_submodule(name, recast(module, twin), strict=True)
                swapped += 1
        return swapped


class DecoderStack(CausalLM):
    """Embedding -> N decoder layers (one rotary table for all) -> RMSNorm -> LM head, tied or
    not: every family here. A family gives its layer (``layer``), whose ``forward(x, rotation,
    meta, kv_cache, residual)`` takes and returns the hidden states as two tensors whose sum
    they are (``layers.DecoderLayer``)."""

    #: q, k and v are one linear, and so are an MLP's gate and up.
    packed_modules: ClassVar[Mapping[str, tuple[str, ...]]] = {
        "qkv_proj": ("q_proj", "k_proj", "v_proj"),
        "gate_up_proj": ("gate_proj", "up_proj"),
    }

    def __init__(self, cfg: ModelConfig, max_positions: int) -> None:
        super().__init__(cfg, max_positions)
        self.rope = RotaryEmbedding(cfg.head_dim, cfg.rope or cfg.rope_theta, max_positions)
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(self.layer(cfg, i) for i in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight

    def layer(self, cfg: ModelConfig, index: int) -> nn.Module:
        """Decoder layer ``index``."""
        raise NotImplementedError

    @staticmethod
    def decoder_linears(cfg: ModelConfig) -> dict[str, tuple[int, int]]:
        """Attention's q, k, v, o and a SwiGLU MLP's gate, up, down: the usual layer."""
        q, kv = cfg.num_attention_heads * cfg.head_dim, cfg.num_key_value_heads * cfg.head_dim
        h, i = cfg.hidden_size, cfg.intermediate_size
        return {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h),
                "gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h)}

    #: The layers as one compiled call for the steps it takes (``cpu_decode.DecodeLayers``,
    #: set by the runner on CPU): the same hidden states as the loop below, or None.
    decode_layers: Callable[[torch.Tensor, Rotation, AttentionMetadata, list[KVCache]],
                            tuple[torch.Tensor, torch.Tensor] | None] | None = None

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                meta: AttentionMetadata, kv_caches: list[KVCache]) -> torch.Tensor:
        h = self.embed_tokens(input_ids)
        rotation = self.rope.table(positions, h.dtype)
        if self.decode_layers is not None and (
                done := self.decode_layers(h, rotation, meta, kv_caches)) is not None:
            return done[1] + done[0]
        residual = None
        for layer, kv_cache in zip(self.layers, kv_caches, strict=True):
            h, residual = layer(h, rotation, meta, kv_cache, residual)
        return h if residual is None else residual + h

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Final norm and head for the rows that sample; fp32 for the sampler."""
        return self.lm_head(self.norm(hidden)).float()


def recast(module: nn.Module, cls: type[M]) -> M:
    """A ``cls`` sharing ``module``'s parameters, buffers, children and settings: ``cls`` is a
    subclass of ``module``'s type that only overrides methods, so nothing is copied."""
    assert issubclass(cls, type(module)), f"{cls.__name__} is no {type(module).__name__}"
    twin = cls.__new__(cls)
    twin.__dict__.update(module.__dict__)
    return twin
