"""A decoder layer's elementwise ops in fp32 on CPU, fused into three compiled C loops.

Between its GEMMs, a Qwen3 layer runs some sixty small torch ops: RMSNorm is six (square,
mean, add, rsqrt, multiply, multiply), RoPE six more for q and again for k, two
``index_copy_`` for the KV store, and the residual adds. At a decode batch of 32 each costs
4-8 µs of dispatch for almost no arithmetic, and at 256 each one streams its operands
through memory again. Here each group below is one C call, one pass over its rows (a
layer's three: ~28 µs instead of ~140 at 32 tokens, ~80 instead of ~330 at 256, on the
benchmark checkpoint; ``tools/bench_cpu_fused.py``):

* ``qk_norm_rope_store``: q and k heads normed (per head, over ``head_dim``) and rotated,
  k and v written into their paged-cache slots;
* ``add_rms_norm``: the residual add and the norm after it;
* ``rms_norm``: a norm alone (a layer's input norm, the final norm).

The arithmetic is torch's, rounding for rounding (``-ffp-contract=off``: no FMA where torch
rounds a product; the mean is the sum over ``n``, then ``1 / sqrt(mean + eps)``, ``x * r``,
then ``weight * that``), so only the order of the sum of squares differs: fp32 logits agree
with Hugging Face's as before. Plain loops that the compiler vectorises; one thread, as the
engine runs torch. Built once per machine (``cbuild``). These functions only run kernels: the
torch ops they replace live in one place, the model (``qwen3.py``), which decides once, when
it is built, to call them (fp32 on CPU, the library built, not ``IZH_CPU_FUSED=0``).
"""

from __future__ import annotations

import ctypes
import os

import torch

from izh_trio.engine import cbuild

_SOURCE = r"""
#include <math.h>
#include <stdint.h>
#include <string.h>
#define INLINE static inline __attribute__((always_inline))

INLINE float sum_sq(const float *restrict x, int64_t n) {
    float ss = 0.0f;
    #pragma omp simd reduction(+:ss)
    for (int64_t i = 0; i < n; i++) ss += x[i] * x[i];
    return ss;
}

INLINE float inv_rms(float sum_sq, int64_t n, float eps) {
    return 1.0f / sqrtf(sum_sq / (float)n + eps);
}

INLINE void scale(const float *restrict x, const float *restrict w, float r, int64_t n,
                  float *restrict y) {
    #pragma omp simd
    for (int64_t i = 0; i < n; i++) y[i] = w[i] * (x[i] * r);
}

/* Rotate-half RoPE of one head: the first half pairs with -(second half), the second with
   the first. */
INLINE void rope(const float *restrict y, const float *restrict c, const float *restrict s,
                 int64_t D, float *restrict out) {
    const int64_t h = D / 2;
    #pragma omp simd
    for (int64_t i = 0; i < h; i++) out[i] = y[i] * c[i] + -y[i + h] * s[i];
    #pragma omp simd
    for (int64_t i = h; i < D; i++) out[i] = y[i] * c[i] + y[i - h] * s[i];
}

/* Up to R rows of n floats normed: their sums of squares first, so that the reductions and
   square roots of different rows overlap instead of each waiting on the last. */
enum { R = 4 };
INLINE void norm_rows(const float *x, const float *w, float eps, int64_t rows, int64_t n,
                      float *out) {
    float r[R];
    for (int64_t j = 0; j < rows; j++) r[j] = sum_sq(x + j * n, n);
    for (int64_t j = 0; j < rows; j++) r[j] = inv_rms(r[j], n, eps);
    for (int64_t j = 0; j < rows; j++) scale(x + j * n, w, r[j], n, out + j * n);
}

/* The same for a token's heads, each then rotated into q or k. D is a constant in the
   specialised copies below: a head is then a few whole vectors, with no remainder loops. */
INLINE int64_t qk_rows(const float *qkv, const float *qw, const float *kw, float eps,
                       const float *cos, const float *sin, const int64_t *slots, float *q,
                       float *k, float *kc, float *vc, int64_t T, int64_t HQ, int64_t HKV,
                       const int64_t D, int64_t nslots) {
    const int64_t H = HQ + HKV, row = (H + HKV) * D, kv = HKV * D;
    float r[H], y[D] __attribute__((aligned(64)));
    int64_t bad = 0;
    for (int64_t t = 0; t < T; t++) {
        const float *x = qkv + t * row;
        for (int64_t h = 0; h < H; h++) r[h] = sum_sq(x + h * D, D);
        for (int64_t h = 0; h < H; h++) r[h] = inv_rms(r[h], D, eps);
        for (int64_t h = 0; h < H; h++) {
            scale(x + h * D, h < HQ ? qw : kw, r[h], D, y);
            rope(y, cos + t * D, sin + t * D, D,
                 h < HQ ? q + (t * HQ + h) * D : k + (t * HKV + h - HQ) * D);
        }
        const int64_t slot = slots[t];
        if (slot < 0 || slot >= nslots) {
            bad++;
            continue;
        }
        memcpy(kc + slot * kv, k + t * kv, kv * sizeof(float));
        memcpy(vc + slot * kv, x + H * D, kv * sizeof(float));
    }
    return bad;
}

/* qkv: [T, (HQ + 2 HKV) D]; cos, sin: [T, D]; q: [T, HQ, D]; k: [T, HKV, D]; caches:
   [nslots, HKV, D]. Returns how many tokens had a slot outside [0, nslots) (not stored). */
int64_t qk_norm_rope_store(const float *qkv, const float *qw, const float *kw, float eps,
                           const float *cos, const float *sin, const int64_t *slots,
                           float *q, float *k, float *kc, float *vc, int64_t T, int64_t HQ,
                           int64_t HKV, int64_t D, int64_t nslots) {
#define QK(d) qk_rows(qkv, qw, kw, eps, cos, sin, slots, q, k, kc, vc, T, HQ, HKV, d, nslots)
    return D == 64 ? QK(64) : D == 128 ? QK(128) : QK(D);
}

/* sum = residual + x; out = norm(sum); all [T, N]. */
void add_rms_norm(const float *x, const float *residual, const float *w, float eps,
                  float *sum, float *out, int64_t T, int64_t N) {
    for (int64_t t = 0; t < T; t += R) {
        const int64_t rows = T - t < R ? T - t : R;
        const float *restrict a = residual + t * N, *restrict b = x + t * N;
        float *restrict y = sum + t * N;
        #pragma omp simd
        for (int64_t i = 0; i < rows * N; i++) y[i] = a[i] + b[i];
        norm_rows(y, w, eps, rows, N, out + t * N);
    }
}

void rms_norm(const float *x, const float *w, float eps, float *out, int64_t T, int64_t N) {
    for (int64_t t = 0; t < T; t += R) norm_rows(x + t * N, w, eps, T - t < R ? T - t : R, N,
                                                 out + t * N);
}
"""

#: Flags beyond ``cbuild.FLAGS``: round every product as torch does (no FMA contraction).
EXTRA_FLAGS = ("-ffp-contract=off",)

_lib: ctypes.CDLL | bool | None = None  # None: not tried yet; False: unavailable
_P, _I, _F = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float


def _declare(lib: ctypes.CDLL) -> ctypes.CDLL:
    """Set the kernels' ctypes signatures on a library built from ``_SOURCE``."""
    lib.qk_norm_rope_store.restype = _I
    lib.qk_norm_rope_store.argtypes = [_P, _P, _P, _F, _P, _P, _P, _P, _P, _P, _P] + [_I] * 5
    lib.add_rms_norm.restype = None
    lib.add_rms_norm.argtypes = [_P, _P, _P, _F, _P, _P, _I, _I]
    lib.rms_norm.restype = None
    lib.rms_norm.argtypes = [_P, _P, _F, _P, _I, _I]
    return lib


def available() -> bool:
    """Whether the kernels are built (compiling them on the first ask); False with
    ``IZH_CPU_FUSED=0`` or no compiler."""
    global _lib
    if _lib is None:
        lib = None
        if os.environ.get("IZH_CPU_FUSED", "1") != "0":
            lib = cbuild.build("cpu_fused", _SOURCE, EXTRA_FLAGS, label="CPU fused kernels")
        _lib = _declare(lib) if lib is not None else False
    return _lib is not False


def _check(x: torch.Tensor) -> None:
    """The kernels take ``x``: fp32 on CPU, with the library built (the call's other tensors
    are checked by each wrapper)."""
    assert x.dtype == torch.float32 and x.is_cpu and available(), "not a tensor for the kernels"


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last dim of ``x`` [..., N], as ``qwen3.RMSNorm``."""
    _check(x)
    assert x.is_contiguous() and weight.is_contiguous() and weight.dtype == torch.float32
    out = torch.empty_like(x)
    n = x.shape[-1]
    _lib.rms_norm(x.data_ptr(), weight.data_ptr(), eps, out.data_ptr(), x.numel() // n, n)
    return out


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """``h = residual + x`` and ``rms_norm(h)``, both [..., N]: a layer's residual add and the
    norm after it, in one pass."""
    _check(x)
    assert x.is_contiguous() and residual.is_contiguous() and weight.is_contiguous()
    assert x.shape == residual.shape and residual.dtype == weight.dtype == torch.float32
    h, out = torch.empty_like(x), torch.empty_like(x)
    n = x.shape[-1]
    _lib.add_rms_norm(x.data_ptr(), residual.data_ptr(), weight.data_ptr(), eps, h.data_ptr(),
                      out.data_ptr(), x.numel() // n, n)
    return h, out


def qk_norm_rope_store(
    qkv: torch.Tensor, num_heads: int, num_kv_heads: int, q_norm: torch.Tensor,
    k_norm: torch.Tensor, eps: float, cos: torch.Tensor, sin: torch.Tensor,
    k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """From ``qkv`` [T, (H_q + 2 H_kv) D]: q and k normed per head and rotated (cos, sin:
    [T, 1, D], each token's position), k and v stored in the paged caches ([blocks,
    block_size, H_kv, D]) at ``slot_mapping`` [T] int64. Returns q [T, H_q, D] and k, v
    [T, H_kv, D] (v a view of ``qkv``), for attention over the fresh tokens. Every slot must
    be a slot of the cache: the torch backend's ``index_copy_`` demands it too (only CUDA
    graphs pad with -1, and they run the triton backend)."""
    t, d = qkv.shape[0], q_norm.shape[0]
    _check(qkv)
    row = (num_heads + 2 * num_kv_heads) * d
    slots = k_cache.shape[0] * k_cache.shape[1]
    assert qkv.is_contiguous() and qkv.shape == (t, row) and slot_mapping.shape == (t,)
    assert cos.is_contiguous() and sin.is_contiguous() and cos.shape == sin.shape == (t, 1, d)
    assert k_cache.is_contiguous() and v_cache.is_contiguous() and slot_mapping.is_contiguous()
    assert k_cache.shape == v_cache.shape and k_cache.shape[2:] == (num_kv_heads, d)
    assert q_norm.is_contiguous() and k_norm.is_contiguous() and slot_mapping.dtype == torch.int64
    assert q_norm.dtype == k_norm.dtype == cos.dtype == sin.dtype == k_cache.dtype \
        == v_cache.dtype == torch.float32
    q = torch.empty(t, num_heads, d, dtype=torch.float32)
    k = torch.empty(t, num_kv_heads, d, dtype=torch.float32)
    bad = _lib.qk_norm_rope_store(
        qkv.data_ptr(), q_norm.data_ptr(), k_norm.data_ptr(), eps, cos.data_ptr(),
        sin.data_ptr(), slot_mapping.data_ptr(), q.data_ptr(), k.data_ptr(),
        k_cache.data_ptr(), v_cache.data_ptr(), t, num_heads, num_kv_heads, d, slots)
    if bad:
        raise IndexError(f"{bad} of {t} KV slots outside the cache's {slots}")
    v = qkv.as_strided((t, num_kv_heads, d), (row, d, 1),
                       qkv.storage_offset() + (num_heads + num_kv_heads) * d)
    return q, k, v

