"""Paged attention in plain torch: the CPU backend, and the reference the Triton kernels match.

The K/V cache of a layer is ``[num_blocks, block_size, num_kv_heads, head_dim]``; a sequence's
tokens live in the blocks its block table names, in order. One step's tokens arrive flattened:
prefill chunks first (any length, possibly continuing a cached prefix), then one token per
decoding sequence. Decodes are batched into one masked SDPA call; prefill chunks run one SDPA
call each. In fp32 on CPU the compiled kernel (``cpu_attention.py``) takes the decodes and
the short prefill chunks in one call a layer instead: a chunk's query rows are decode rows
that each see the cache up to their own position (the chunk's K/V are stored before
attention runs), so fresh prompts, prefix-cache hits and chunked prefill need no copies.

The model runner describes a step's attention once, backend-neutrally (``StepAttention``);
each backend turns that into its own metadata, once per step, and every layer reads it. The
backends (this one, ``torch``, and ``triton`` in ``attention_triton.py``) share one call
signature: ``store_kv(k, v, k_cache, v_cache, slot_mapping)`` and
``paged_attention(q, k, v, k_cache, v_cache, meta, scale)``.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable
from typing import Any, NamedTuple

import attrs
import torch
import torch.nn.functional as F

from izh_trio.engine import cpu_attention


class ChunkSpec(NamedTuple):
    """One sequence's share of a step, as plain ints (no tensors yet). A named tuple: one is
    built per sequence per step, and it builds in half an attrs class's time."""

    query_start: int  # offset in the flattened step
    query_len: int
    context_len: int  # tokens in the cache after this step, the new ones included
    block_table: list[int]  # the blocks covering ``context_len`` tokens


@attrs.frozen
class StepAttention:
    """What every backend needs to know about a step: prefill chunks first, then decodes."""

    slots: list[int]  # flat cache slot of each new token
    prefills: list[ChunkSpec]
    decodes: list[ChunkSpec]  # query_len 1 each
    block_size: int

    @property
    def num_prefill_tokens(self) -> int:
        return sum(c.query_len for c in self.prefills)


@attrs.frozen
class PrefillChunk:
    query_start: int  # offset in the flattened step
    query_len: int
    context_len: int  # tokens in the cache after this chunk, the chunk's own included
    #: [num_blocks] int64; None for a fresh chunk (nothing cached before it), which attends
    #: to its own K/V and never reads the cache
    block_table: torch.Tensor | None
    in_place: bool = False  # the compiled kernel takes its rows (when the dtype is fp32)


#: A prefill chunk goes to the compiled kernel when its query rows times its context tokens
#: stay under this. The kernel reads K/V once per query row, SDPA once per tile of rows, but
#: SDPA costs ~45 us a call, one per chunk and layer, and with two threads each call is a
#: parallel region whose barrier stalls while another process holds the second core (a step
#: of 32 fresh 32-token prompts took 170-190 ms instead of ~30 next to a busy process). The
#: crossover, fp32, 4 heads of 64 (GQA 2), ``tools/bench_cpu_attention.py --prefill N``:
#: 16 x 1024 and 128 x 128 (rows x context) take 0.80x and 0.87x of SDPA's time, 64 x 256
#: ~1.1x, 32 x 1024 1.1x, 256 x 256 1.0x; fresh 32-token prompts 0.45x.
IN_PLACE_PREFILL_WORK = 16384


@attrs.frozen
class AttentionMetadata:
    """Built once per step, read by every layer."""

    slot_mapping: torch.Tensor  # [T] int64: block_id * block_size + offset of each new token
    prefills: tuple[PrefillChunk, ...]
    num_prefill_tokens: int
    decode_block_tables: torch.Tensor | None  # [B, max_blocks] int64, padded with block 0
    #: [B, 1, 1, max_blocks * block_size]: 0 where a decode attends, -inf past its context.
    #: Additive and built once per step, so no layer converts a boolean mask again.
    decode_bias: torch.Tensor | None
    decode_context_lens: torch.Tensor | None = None  # [B] int64
    #: The compiled CPU kernel's rows (fp32 on CPU, when it built): the in-place prefill
    #: chunks' rows, then the decodes. ``decode_block_tables`` and ``decode_context_lens``
    #: are then the last B rows of these.
    in_place_tables: torch.Tensor | None = None  # [R, max_blocks] int64
    in_place_context_lens: torch.Tensor | None = None  # [R] int64: each row's own context
    in_place_start: int = 0  # the rows are ``in_place_start:`` of the step ...
    in_place_rows: torch.Tensor | None = None  # ... unless these [R] int64 rows are given

    @property
    def in_place(self) -> bool:
        return self.in_place_tables is not None


def in_place_ok() -> bool:
    """Whether the compiled CPU decode kernel can be used (built once, on first ask)."""
    return cpu_attention.available()


def long_tensor(values: list[int], device: torch.device) -> torch.Tensor:
    """An int64 tensor of ``values``. Through ``array``, ~3x faster than ``torch.tensor`` on a
    list of ints (it inspects each one): this runs several times every step."""
    if not values:
        return torch.empty(0, dtype=torch.long, device=device)
    return torch.frombuffer(array("q", values), dtype=torch.long).to(device)


def build_metadata(step: StepAttention, device: torch.device, num_kv_heads: int = 1
                   ) -> AttentionMetadata:
    in_place = device.type == "cpu" and bool(step.decodes or step.prefills) and in_place_ok()
    chunks = tuple(
        PrefillChunk(query_start=c.query_start, query_len=c.query_len, context_len=c.context_len,
                     block_table=(long_tensor(c.block_table, device)
                                  if c.context_len > c.query_len else None),
                     in_place=in_place and c.query_len * c.context_len <= IN_PLACE_PREFILL_WORK)
        for c in step.prefills
    )
    if in_place:
        return _in_place_metadata(step, chunks, device)
    decode_tables = decode_bias = ctx = None
    if step.decodes:
        width = max(len(c.block_table) for c in step.decodes)
        flat: list[int] = []  # the tables, each padded with block 0 to ``width``
        for c in step.decodes:
            flat += c.block_table
            flat += [0] * (width - len(c.block_table))
        decode_tables = long_tensor(flat, device).view(len(step.decodes), width)
        ctx = long_tensor([c.context_len for c in step.decodes], device)
        decode_bias = _decode_bias(ctx, width * step.block_size)
    return AttentionMetadata(
        slot_mapping=long_tensor(step.slots, device),
        prefills=chunks,
        num_prefill_tokens=step.num_prefill_tokens,
        decode_block_tables=decode_tables,
        decode_bias=decode_bias,
        decode_context_lens=ctx,
    )


def _in_place_metadata(step: StepAttention, chunks: tuple[PrefillChunk, ...],
                       device: torch.device) -> AttentionMetadata:
    """One table row per kernel row: a prefill chunk's rows share its table and see the
    cache up to their own position; a decode is one row."""
    kernel_chunks = [c for c, p in zip(step.prefills, chunks, strict=True) if p.in_place]
    width = max((len(c.block_table) for c in (*kernel_chunks, *step.decodes)), default=1)
    flat: list[int] = []
    ctx: list[int] = []
    rows: list[int] = []
    for c in kernel_chunks:
        n = c.query_len
        flat += (c.block_table + [0] * (width - len(c.block_table))) * n
        ctx += range(c.context_len - n + 1, c.context_len + 1)
        rows += range(c.query_start, c.query_start + n)
    for c in step.decodes:
        flat += c.block_table
        flat += [0] * (width - len(c.block_table))
        ctx.append(c.context_len)
    total = len(step.slots)
    start = total - len(ctx)  # contiguous when the kernel's rows are the step's last ones
    contiguous = not rows or rows == list(range(start, start + len(rows)))
    if not contiguous:
        rows += (c.query_start for c in step.decodes)
    tables = long_tensor(flat, device).view(len(ctx), width) if ctx else None
    lens = long_tensor(ctx, device) if ctx else None
    b = len(step.decodes)
    return AttentionMetadata(
        slot_mapping=long_tensor(step.slots, device),
        prefills=chunks,
        num_prefill_tokens=step.num_prefill_tokens,
        decode_block_tables=tables[len(ctx) - b:] if b else None,
        decode_bias=None,  # the kernel stops at each context itself
        decode_context_lens=lens[len(ctx) - b:] if b else None,
        in_place_tables=tables,
        in_place_context_lens=lens,
        in_place_start=start,
        in_place_rows=None if contiguous else long_tensor(rows, device),
    )


def _decode_bias(context_lens: torch.Tensor, width: int) -> torch.Tensor:
    positions = torch.arange(width, device=context_lens.device)
    past = (positions[None, :] >= context_lens[:, None])[:, None, None, :]
    return torch.zeros(past.shape, device=context_lens.device).masked_fill_(past, float("-inf"))


def store_kv(
    k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Write the step's new K/V ([T, H_kv, D]) into their cache slots."""
    k_cache.view(-1, *k_cache.shape[2:]).index_copy_(0, slot_mapping, k)
    v_cache.view(-1, *v_cache.shape[2:]).index_copy_(0, slot_mapping, v)


def _gather(cache: torch.Tensor, block_table: torch.Tensor) -> torch.Tensor:
    """[..., num_blocks] table -> [..., num_blocks * block_size, H_kv, D] contiguous K or V."""
    blocks = cache[block_table]
    return blocks.flatten(-4, -3)


def paged_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
    k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata, scale: float,
) -> torch.Tensor:
    """q: [T, H_q, D]; k, v: [T, H_kv, D] (already stored). Returns [T, H_q, D]."""
    out = torch.empty_like(q)
    kernel = meta.in_place and q.dtype == k_cache.dtype == torch.float32
    for chunk in meta.prefills:
        if kernel and chunk.in_place:
            continue
        s, n = chunk.query_start, chunk.query_len
        qc = q[s : s + n].transpose(0, 1).unsqueeze(0)  # [1, H_q, n, D]
        if chunk.context_len == n:  # nothing cached before it: attend to the fresh K/V
            kc, vc, mask, causal = k[s : s + n], v[s : s + n], None, True
        else:
            ctx = chunk.context_len
            kc = _gather(k_cache, chunk.block_table)[:ctx]
            vc = _gather(v_cache, chunk.block_table)[:ctx]
            rows = torch.arange(ctx - n, ctx, device=q.device).unsqueeze(1)
            mask = torch.arange(ctx, device=q.device).unsqueeze(0) <= rows
            causal = False
        o = F.scaled_dot_product_attention(
            qc, kc.transpose(0, 1).unsqueeze(0), vc.transpose(0, 1).unsqueeze(0),
            attn_mask=mask, is_causal=causal, scale=scale, enable_gqa=True,
        )
        out[s : s + n] = o.squeeze(0).transpose(0, 1)
    if kernel and meta.in_place_tables is not None:
        rows = slice(meta.in_place_start, None) if meta.in_place_rows is None else \
            meta.in_place_rows
        out[rows] = cpu_attention.paged_decode(q[rows], k_cache, v_cache, meta.in_place_tables,
                                               meta.in_place_context_lens, scale)
    elif meta.decode_block_tables is not None:
        s = meta.num_prefill_tokens
        tables = meta.decode_block_tables
        b, h_kv = tables.shape[0], k_cache.shape[2]
        # GQA without copies: the query heads sharing a KV head are that head's "query rows".
        qd = q[s:].view(b, h_kv, q.shape[1] // h_kv, q.shape[2])  # [B, H_kv, G, D]
        kd = _gather_flat(k_cache, tables).transpose(1, 2)  # [B, H_kv, L, D]
        vd = _gather_flat(v_cache, tables).transpose(1, 2)
        bias = meta.decode_bias  # None when planned in place but the dtype is not fp32
        if bias is None:
            bias = _decode_bias(meta.decode_context_lens, kd.shape[2])
        o = F.scaled_dot_product_attention(qd, kd, vd, attn_mask=bias, scale=scale)
        out[s:] = o.reshape(b, q.shape[1], q.shape[2])
    return out


def _gather_flat(cache: torch.Tensor, tables: torch.Tensor) -> torch.Tensor:
    """[B, W] block tables -> [B, W * block_size, H_kv, D]; index_select beats fancy indexing."""
    b, w = tables.shape
    return torch.index_select(cache, 0, tables.flatten()).view(b, w * cache.shape[1],
                                                               *cache.shape[2:])


@attrs.frozen
class AttentionBackend:
    """One attention implementation: its per-step metadata builder and its two layer calls."""

    name: str
    build_metadata: Callable[[StepAttention, torch.device, int], Any]  # (step, device, H_kv)
    store_kv: Callable[..., None]
    paged_attention: Callable[..., torch.Tensor]


TORCH_BACKEND = AttentionBackend("torch", build_metadata, store_kv, paged_attention)
BACKEND_NAMES = ("auto", "torch", "triton")


def resolve_backend_name(name: str, device: torch.device) -> str:
    """``auto``: the Triton kernels on CUDA, plain torch anywhere else."""
    if name not in BACKEND_NAMES:
        raise ValueError(f"unknown attention backend {name!r}; expected one of {BACKEND_NAMES}")
    if name == "auto":
        return "triton" if device.type == "cuda" else "torch"
    return name


def get_backend(name: str, device: torch.device) -> AttentionBackend:
    """The backend for ``name`` (``auto`` resolved for ``device``); triton is imported lazily."""
    if resolve_backend_name(name, device) == "torch":
        return TORCH_BACKEND
    from izh_trio.engine.attention_triton import TRITON_BACKEND

    return TRITON_BACKEND
