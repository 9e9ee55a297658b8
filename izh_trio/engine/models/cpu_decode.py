"""A decode step's decoder layers in one compiled call, on CPU in fp32, bf16 or fp16.

A Qwen3 or Llama layer on the CPU twins is nine kernel calls (two norms with their residual
adds, four linears, the q/k norm, RoPE and KV store, attention, SiLU times up), each behind a
Python wrapper that checks, allocates and converts: some 20 µs to 50 µs a call, which at a few
decode rows on a 28-layer model is several milliseconds a step that no kernel spends.
``csrc/cpu_decode.c`` calls the same kernels in the same order on the same kinds of buffers,
so its results are bitwise the Python path's (``tests/engine/test_cpu_decode.py``); Python
now makes one call a step.

It runs only where every piece is the one it chains: the model a ``DecoderStack`` of plain
``DecoderLayer``s whose norms, attention (Llama's or Qwen3's) and MLP are the CPU twins and
whose linears are on the blocked kernel (a small model's oneDNN linears keep the blocked one
for up to ``ROWS_PER_PASS`` rows: only such steps run here), and the step one whose every row
is the attention kernel's (``CpuKernelMetadata`` with no SDPA chunk). Anything else (LoRA, a
mixture of experts, a sliding window, a long prompt chunk) takes the modules' own path, as
does everything with ``IZH_CPU_DECODE=0``. The model's tensors are held here, so the
addresses handed to C stay theirs.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import cast

import torch
from torch import nn

from izh_trio.engine import cbuild, cpu_attention, cpu_fused, cpu_linear_blocked
from izh_trio.engine.attention.cpu_kernel import CpuKernelMetadata
from izh_trio.engine.cpu_linear import PackedLinear
from izh_trio.engine.loader import cpu_kernels_serve
from izh_trio.engine.models import llama, qwen3
from izh_trio.engine.models.base import DecoderStack
from izh_trio.engine.models.layers import CpuMLP, CpuRMSNorm, DecoderLayer, KVCache, Rotation

_P, _I, _F = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float

Spec = dict[str, torch.Tensor | None]  # a layer's tensors, by _Layer's field names
#: What every layer must share, the one shape the call is told: hidden size, heads, KV heads,
#: head size, intermediate size, norm eps, q/k norm eps (0: none), attention scale.
Dims = tuple[int, int, int, int, int, float, float, float]


class _Kernels(ctypes.Structure):  # csrc/cpu_decode.c's Kernels
    _fields_ = [(name, _P) for name in ("rms_norm", "add_rms_norm", "qk_norm_rope_store",
                                        "silu_mul", "linear", "attention")]


class _Shape(ctypes.Structure):
    _fields_ = [*((name, _I) for name in ("hidden", "heads", "kv_heads", "head_dim",
                                          "intermediate", "block_size", "cache_slots",
                                          "rows_per_pass", "linear_block")),
                ("eps", _F), ("qk_eps", _F), ("scale", _F), ("element", _I)]


#: The model's dtype as csrc/cpu_decode.c's Shape.element names it.
_ELEMENT = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}


_LAYER_TENSORS = ("input_norm", "post_norm", "q_norm", "k_norm", "qkv", "qkv_bias", "o",
                  "o_bias", "gate_up", "gate_up_bias", "down", "down_bias")


class _Layer(ctypes.Structure):
    _fields_ = [(name, _P) for name in (*_LAYER_TENSORS, "k_cache", "v_cache")]


class _Step(ctypes.Structure):
    _fields_ = [("rows", _I), ("table_width", _I), ("threads", _I),
                *((name, _P) for name in ("cos", "sin", "slots", "tables", "context_lens"))]


_KERNEL = cbuild.Kernel(
    "cpu_decode", label="CPU decode layers", switch="IZH_CPU_DECODE",
    signatures={"decode_layers": (_I, [_P] * 3 + [_I] + [_P] * 4)})


def _blocked(linear: nn.Module) -> tuple[cpu_linear_blocked.BlockedLinear, bool] | None:
    """The blocked kernel's copy of a linear, and whether it serves every row count (not
    only a decode step's few, as beside a small model's oneDNN copy)."""
    if type(linear) is cpu_linear_blocked.BlockedLinear:
        return linear, True
    if type(linear) is PackedLinear:
        blocked = getattr(linear.few, "__self__", None)
        if type(blocked) is cpu_linear_blocked.BlockedLinear:
            return blocked, False
    return None


def _ptr(t: torch.Tensor | None) -> int | None:
    return t.data_ptr() if t is not None else None


class DecodeLayers:
    """The compiled layers of one model, called by ``DecoderStack.forward`` each step: the
    hidden states it would have computed, or None for a step it does not take."""

    def __init__(self, kernels: _Kernels, shape: _Shape, layers: Sequence[Spec],
                 max_rows: int | None, dtype: torch.dtype) -> None:
        self._kernels, self._shape, self._dtype, self._max_rows = kernels, shape, dtype, max_rows
        self._tensors = layers  # held: their addresses are in _layers
        self._layers = (_Layer * len(layers))()
        for spec, out in zip(layers, self._layers, strict=True):
            for name in _LAYER_TENSORS:
                setattr(out, name, _ptr(spec[name]))
        self._caches: list[KVCache] = []

    def _bind(self, kv_caches: list[KVCache]) -> None:
        """Each layer's caches (the runner keeps one list; anything else binds afresh)."""
        self._caches = list(kv_caches)
        for (k, v), out in zip(self._caches, self._layers, strict=True):
            assert k.is_contiguous() and v.is_contiguous() and k.dtype == v.dtype == self._dtype
            assert k.shape == v.shape and k.shape[2:] == (self._shape.kv_heads,
                                                          self._shape.head_dim)
            out.k_cache, out.v_cache = k.data_ptr(), v.data_ptr()
        k = self._caches[0][0]
        self._shape.block_size, self._shape.cache_slots = k.shape[1], k.shape[0] * k.shape[1]

    def __call__(self, x: torch.Tensor, rotation: Rotation, meta: object,
                 kv_caches: list[KVCache]) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The last layer's MLP output and the residual stream, as the layers return them;
        None unless every row of the step is the attention kernel's."""
        if not (type(meta) is CpuKernelMetadata and not meta.prefills and meta.start == 0
                and meta.rows is None and meta.tables is not None
                and meta.context_lens is not None and x.dtype == self._dtype):
            return None
        rows = x.shape[0]
        if self._max_rows is not None and rows > self._max_rows:
            return None
        if len(kv_caches) != len(self._caches) or any(
                a is not b for a, b in zip(kv_caches, self._caches, strict=True)):
            self._bind(kv_caches)
        cos, sin = rotation
        tables, lens, slots = meta.tables, meta.context_lens, meta.slot_mapping
        assert x.is_contiguous() and cos.is_contiguous() and sin.is_contiguous()
        assert cos.dtype == self._dtype and tables.is_contiguous() and lens.is_contiguous()
        assert slots.is_contiguous() and slots.dtype == tables.dtype == torch.int64
        assert tables.shape[0] == lens.shape[0] == slots.shape[0] == rows
        assert cos.shape == sin.shape == (rows, 1, self._shape.head_dim)
        step = _Step(rows, tables.shape[1], torch.get_num_threads(), cos.data_ptr(),
                     sin.data_ptr(), slots.data_ptr(), tables.data_ptr(), lens.data_ptr())
        mlp, residual = torch.empty_like(x), torch.empty_like(x)
        bad = _KERNEL.lib.decode_layers(
            ctypes.byref(self._kernels), ctypes.byref(self._shape), self._layers,
            len(self._layers), ctypes.byref(step), x.data_ptr(), mlp.data_ptr(),
            residual.data_ptr())
        if bad > 0:
            raise IndexError(f"{bad} of {rows} KV slots outside the cache's "
                             f"{self._shape.cache_slots}")
        if bad:
            raise MemoryError("no memory for the decode layers' buffers")
        return mlp, residual


def _layer(layer: nn.Module, dtype: torch.dtype) -> tuple[Spec, Dims, bool] | None:
    """A layer's tensors and shape, and whether its linears take every row count; None
    unless each of its modules is exactly the one the call stands for."""
    if type(layer) is not DecoderLayer:
        return None
    attention, mlp = layer.self_attn, layer.mlp
    norm_in, norm_post = layer.input_layernorm, layer.post_attention_layernorm
    if not (type(norm_in) is type(norm_post) is CpuRMSNorm and type(mlp) is CpuMLP
            and type(attention) in (llama.CpuAttention, qwen3.CpuAttention)
            and norm_in.eps == norm_post.eps):
        return None
    attn = cast(llama.Attention, attention)
    linears = [_blocked(m) for m in (attn.qkv_proj, attn.o_proj, mlp.gate_up_proj,
                                     mlp.down_proj)]
    found = [b for b in linears if b is not None and b[0].packed.dtype == dtype]
    if len(found) != len(linears):
        return None
    (qkv, _), (o, _), (gate_up, _), (down, _) = found
    q_norm = k_norm = None
    qk_eps = 0.0
    if type(attention) is qwen3.CpuAttention:
        q_norm, k_norm = attention.q_norm.weight, attention.k_norm.weight
        qk_eps = attention.q_norm.eps
    spec: Spec = {
        "input_norm": norm_in.weight, "post_norm": norm_post.weight, "q_norm": q_norm,
        "k_norm": k_norm, "qkv": qkv.packed, "qkv_bias": qkv.bias, "o": o.packed,
        "o_bias": o.bias, "gate_up": gate_up.packed, "gate_up_bias": gate_up.bias,
        "down": down.packed, "down_bias": down.bias}
    dims = (norm_in.weight.shape[0], attn.num_heads, attn.num_kv_heads, attn.head_dim,
            down.in_features, norm_in.eps, qk_eps, attn.scale)
    return spec, dims, all(every for _, every in found)


def build(model: nn.Module) -> DecodeLayers | None:
    """The compiled layers for ``model``, or None where any piece of it is not one they
    chain (then its modules run as they are)."""
    if not isinstance(model, DecoderStack) or not len(model.layers):
        return None
    dtype = model.embed_tokens.weight.dtype
    if model.embed_tokens.weight.device.type != "cpu":
        return None
    if not (cpu_kernels_serve(dtype) and _KERNEL.available()):
        return None
    layers = [_layer(layer, dtype) for layer in model.layers]
    if any(got is None for got in layers):
        return None
    specs, dims, every = zip(*cast(list[tuple[Spec, Dims, bool]], layers), strict=True)
    if len(set(dims)) != 1:
        return None
    hidden, heads, kv_heads, head_dim, intermediate, eps, qk_eps, scale = dims[0]
    kernels = _Kernels(
        cpu_fused.entry("rms_norm", dtype), cpu_fused.entry("add_rms_norm", dtype),
        cpu_fused.entry("qk_norm_rope_store", dtype), cpu_fused.entry("silu_mul", dtype),
        cpu_linear_blocked.entry(dtype), cpu_attention.entry(dtype))
    shape = _Shape(hidden, heads, kv_heads, head_dim, intermediate, 0, 0,
                   cpu_linear_blocked.ROWS_PER_PASS, cpu_linear_blocked.BLOCK, eps, qk_eps,
                   scale, _ELEMENT[dtype])
    return DecodeLayers(kernels, shape, specs,
                        None if all(every) else cpu_linear_blocked.ROWS_PER_PASS, dtype)
