"""Paged decode attention for fp32 on CPU, reading K/V in place from the paged cache.

The torch path gathers every decoding sequence's K/V out of the cache in every layer, then
runs SDPA on the copy: at 256 sequences that copy is most of a step (memory-bound). This C
loop walks each sequence's block table instead and reads every K/V row once per KV head,
for all the query heads that share it (GQA), with an online softmax. It is compiled once
per machine with the system C compiler (cached, under a lock); with no compiler, or for
other dtypes, the engine keeps the torch path.
"""

from __future__ import annotations

import ctypes
import fcntl
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

log = logging.getLogger(__name__)

_SOURCE = r"""
#include <float.h>
#include <math.h>
#include <stdint.h>

/* q, out: [B, HQ, D]; kc, vc: [NB, BS, HKV, D]; tables: [B, W]; ctx: [B].
   Online softmax one block at a time: one rescale per block, one exp per score. */
void paged_decode(const float *q, const float *kc, const float *vc, const int64_t *tables,
                  const int64_t *ctx, float *out, int64_t B, int64_t HQ, int64_t HKV,
                  int64_t D, int64_t BS, int64_t W, float scale) {
    const int64_t G = HQ / HKV;
    float acc[G * D], m[G], l[G], s[G * BS];
    for (int64_t b = 0; b < B; b++) {
        for (int64_t g = 0; g < HKV; g++) {
            const float *qg = q + (b * HQ + g * G) * D;
            for (int64_t h = 0; h < G; h++) { m[h] = -FLT_MAX; l[h] = 0.0f; }
            for (int64_t i = 0; i < G * D; i++) acc[i] = 0.0f;
            for (int64_t t0 = 0; t0 < ctx[b]; t0 += BS) {
                const int64_t n = ctx[b] - t0 < BS ? ctx[b] - t0 : BS;
                const int64_t base = tables[b * W + t0 / BS] * BS;
                for (int64_t h = 0; h < G; h++) {
                    const float *qh = qg + h * D;
                    float mb = -FLT_MAX;
                    for (int64_t j = 0; j < n; j++) {
                        const float *k = kc + ((base + j) * HKV + g) * D;
                        float dot = 0.0f;
                        #pragma omp simd reduction(+:dot)
                        for (int64_t d = 0; d < D; d++) dot += qh[d] * k[d];
                        s[h * BS + j] = dot * scale;
                        mb = s[h * BS + j] > mb ? s[h * BS + j] : mb;
                    }
                    const float mx = mb > m[h] ? mb : m[h];
                    const float keep = expf(m[h] - mx);
                    float *a = acc + h * D, sum = 0.0f;
                    for (int64_t d = 0; d < D; d++) a[d] *= keep;
                    for (int64_t j = 0; j < n; j++) {
                        const float p = expf(s[h * BS + j] - mx);
                        const float *v = vc + ((base + j) * HKV + g) * D;
                        sum += p;
                        #pragma omp simd
                        for (int64_t d = 0; d < D; d++) a[d] += p * v[d];
                    }
                    l[h] = l[h] * keep + sum;
                    m[h] = mx;
                }
            }
            for (int64_t h = 0; h < G; h++) {
                float *o = out + (b * HQ + g * G + h) * D;
                const float inv = l[h] > 0.0f ? 1.0f / l[h] : 0.0f;
                for (int64_t d = 0; d < D; d++) o[d] = acc[h * D + d] * inv;
            }
        }
    }
}
"""

_lib: ctypes.CDLL | bool | None = None  # None: not tried yet; False: unavailable


def _build() -> ctypes.CDLL | bool:
    compiler = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if os.environ.get("IZH_CPU_ATTENTION", "1") == "0" or compiler is None:
        return False
    digest = hashlib.sha256((_SOURCE + compiler).encode()).hexdigest()[:16]
    cache = Path(os.environ.get("IZH_CACHE_DIR", Path.home() / ".cache" / "izh_trio"))
    cache.mkdir(parents=True, exist_ok=True)
    target = cache / f"cpu_attention-{digest}.so"
    with open(cache / "cpu_attention.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one compile per machine, however many engines
        if not target.exists():
            with tempfile.TemporaryDirectory(dir=cache) as tmp:
                src, so = Path(tmp) / "attn.c", Path(tmp) / "attn.so"
                src.write_text(_SOURCE)
                flags = ["-O3", "-march=native", "-fopenmp-simd", "-shared", "-fPIC"]
                done = subprocess.run([compiler, *flags, str(src), "-o", str(so), "-lm"],
                                      capture_output=True, text=True)
                if done.returncode != 0:
                    log.warning("CPU attention kernel did not compile; using torch's: %s",
                                done.stderr[-500:])
                    return False
                os.replace(so, target)
    lib = ctypes.CDLL(str(target))
    lib.paged_decode.restype = None
    lib.paged_decode.argtypes = [ctypes.c_void_p] * 6 + [ctypes.c_int64] * 6 + [ctypes.c_float]
    return lib


def available() -> bool:
    global _lib
    if _lib is None:
        try:
            _lib = _build()
        except OSError as exc:
            log.warning("CPU attention kernel unavailable: %s", exc)
            _lib = False
    return _lib is not False


def paged_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 tables: torch.Tensor, context_lens: torch.Tensor, scale: float
                 ) -> torch.Tensor:
    """q: [B, H_q, D] fp32; caches [NB, BS, H_kv, D]; tables [B, W] and lens [B] int64."""
    assert available() and q.dtype == k_cache.dtype == torch.float32
    assert tables.dtype == context_lens.dtype == torch.int64
    q = q.contiguous()
    tables, context_lens = tables.contiguous(), context_lens.contiguous()
    out = torch.empty_like(q)
    b, h_q, d = q.shape
    _, bs, h_kv, _ = k_cache.shape
    _lib.paged_decode(q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), tables.data_ptr(),
                      context_lens.data_ptr(), out.data_ptr(), b, h_q, h_kv, d, bs,
                      tables.shape[1], scale)
    return out
