/* A decoder layer's elementwise ops on CPU, rounded as torch rounds them: qk_norm_rope_store,
   add_rms_norm, rms_norm, silu_mul for fp32 tensors, the same with a _bf16 suffix for bf16
   ones, and with _f16 for fp16 ones where the compiler has _Float16. Built and called by
   cpu_fused.py (with -ffp-contract=off). The arithmetic is fp32 in every dtype; in bf16 and
   fp16, every value torch would round to the model's dtype (an op's result) is rounded here
   at the same point (RB), so only the order of a sum of squares differs, and SiLU's e^x by
   an ulp or two.
   The kernels are written once, at the end of this file, which includes itself once per
   element type (T). Built with -fopenmp, the library binds to the OpenMP runtime torch
   loaded: a call over many rows (a prefill's) splits them between torch's threads, each row
   computed as on one thread, so the results do not depend on the count. */
#ifndef T
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <string.h>
#define INLINE static inline __attribute__((always_inline))

/* Values a call reads before its rows are split between threads (rows are the unit, so a
   lone row stays on the calling thread): below it, waking another costs about what it would
   save; eight rows of a 1,024-wide model take ~0.6 of the time on two
   (cpu_fused.PARALLEL_MIN_VALUES). */
enum { PARALLEL_MIN = 1 << 13 };

INLINE int threads_for(int64_t values, int64_t rows) {
    const int n = values >= PARALLEL_MIN ? omp_get_max_threads() : 1;
    return rows < n ? (int)rows : n;
}

INLINE float widen_bf16(uint16_t x) {  /* a bf16 is the upper half of an fp32's bits */
    uint32_t u = (uint32_t)x << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

INLINE uint16_t narrow_bf16(float f) {  /* round to nearest, ties to even, as torch does */
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return 0x7FC0;  /* NaN: torch's one */
    return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

/* e^x for SiLU, within a couple of ulp of torch's (SLEEF's) e^x: Cephes' polynomial on
   x - n ln 2, scaled by 2^n built in the exponent bits; branch-free, so that loops of it
   vectorise. x is clamped to where 2^n stays a normal float (e^x of -inf is then 2^-126). */
INLINE float exp_f32(float x) {
    x = x < -87.3f ? -87.3f : x > 88.3f ? 88.3f : x;
    /* n = round(x / ln 2): adding 1.5 * 2^23 leaves no bits below the unit (floorf would
       be a call, which no loop vectorises) */
    const float n = (x * 1.44269504f + 12582912.0f) - 12582912.0f;
    const float r = (x - n * 0.693359375f) + n * 2.12194440e-4f;  /* ln 2 in two parts */
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    const float e = p * (r * r) + r + 1.0f;
    const union { uint32_t u; float f; } scale = {(uint32_t)((int32_t)n + 127) << 23};
    return e * scale.f;
}

enum { R = 4 };  /* rows normed together (norm_rows) */

/* fp32 tensors: nothing to round. */
#define T float
#define LD(x) (x)
#define ST(f) (f)
#define RB(f) (f)
#define NAME(f) f
#include __FILE__  /* this file again (cbuild compiles it by its absolute path) */
#undef T
#undef LD
#undef ST
#undef RB
#undef NAME
/* bf16 tensors: widened on load, rounded where torch's bf16 ops round. */
#define T uint16_t
#define LD(x) widen_bf16(x)
#define ST(f) narrow_bf16(f)
#define RB(f) widen_bf16(narrow_bf16(f))
#define NAME(f) f##_bf16
#include __FILE__  /* this file again (cbuild compiles it by its absolute path) */
#undef T
#undef LD
#undef ST
#undef RB
#undef NAME
#if defined(__FLT16_MAX__)  /* the compiler's _Float16 (GCC 12+, clang): _f16 entries */
/* fp16 tensors: widened on load (exact), rounded to nearest even where torch's fp16 ops
   round (F16C's conversions on x86: no fp16 arithmetic is needed). */
#define T _Float16
#define LD(x) ((float)(x))
#define ST(f) ((_Float16)(f))
#define RB(f) ((float)(_Float16)(f))
#define NAME(f) f##_f16
#include __FILE__  /* this file again (cbuild compiles it by its absolute path) */
#endif

#else  /* T: the kernels for one element type */
#define sum_sq NAME(sum_sq)
#define inv_rms NAME(inv_rms)
#define scale NAME(scale)
#define rope NAME(rope)
#define norm_rows NAME(norm_rows)
#define qk_rows NAME(qk_rows)
#define qk_norm_rope_store NAME(qk_norm_rope_store)
#define add_rms_norm NAME(add_rms_norm)
#define rms_norm NAME(rms_norm)
#define silu_mul NAME(silu_mul)

INLINE float sum_sq(const T *restrict x, int64_t n) {
    float ss = 0.0f;
    #pragma omp simd reduction(+:ss)
    for (int64_t i = 0; i < n; i++) ss += LD(x[i]) * LD(x[i]);
    return ss;
}

INLINE float inv_rms(float sum_sq, int64_t n, float eps) {
    return 1.0f / sqrtf(sum_sq / (float)n + eps);
}

/* w * (x * r): the normed row is rounded to the model's dtype before the weight's product,
   as RMSNorm's ``self.weight * x.to(dtype)``; y, a head before RoPE, holds the product
   rounded as torch stores it. */
INLINE void scale(const T *restrict x, const T *restrict w, float r, int64_t n,
                  float *restrict y) {
    #pragma omp simd
    for (int64_t i = 0; i < n; i++) y[i] = RB(LD(w[i]) * RB(LD(x[i]) * r));
}

/* Rotate-half RoPE of one head: the first half pairs with -(second half), the second with
   the first; each product and the sum rounded as torch's ops in the model's dtype. */
INLINE void rope(const float *restrict y, const T *restrict c, const T *restrict s,
                 int64_t D, T *restrict out) {
    const int64_t h = D / 2;
    #pragma omp simd
    for (int64_t i = 0; i < h; i++)
        out[i] = ST(RB(y[i] * LD(c[i])) + RB(-y[i + h] * LD(s[i])));
    #pragma omp simd
    for (int64_t i = h; i < D; i++)
        out[i] = ST(RB(y[i] * LD(c[i])) + RB(y[i - h] * LD(s[i])));
}

/* Up to R rows of n values normed: their sums of squares first, so that the reductions and
   square roots of different rows overlap instead of each waiting on the last. */
INLINE void norm_rows(const T *x, const T *w, float eps, int64_t rows, int64_t n, T *out) {
    float r[R];
    for (int64_t j = 0; j < rows; j++) r[j] = sum_sq(x + j * n, n);
    for (int64_t j = 0; j < rows; j++) r[j] = inv_rms(r[j], n, eps);
    for (int64_t j = 0; j < rows; j++) {
        const T *restrict xj = x + j * n;
        T *restrict o = out + j * n;
        #pragma omp simd
        for (int64_t i = 0; i < n; i++) o[i] = ST(LD(w[i]) * RB(LD(xj[i]) * r[j]));
    }
}

/* The same for a token's heads, each then rotated into q or k. D is a constant in the
   specialised copies below: a head is then a few whole vectors, with no remainder loops. */
INLINE int64_t qk_rows(const T *qkv, const T *qw, const T *kw, float eps, const T *cos,
                       const T *sin, const int64_t *slots, T *q, T *k, T *kc, T *vc,
                       int64_t Tn, int64_t HQ, int64_t HKV, const int64_t D, int64_t nslots) {
    const int64_t H = HQ + HKV, row = (H + HKV) * D, kv = HKV * D;
    const int nt = threads_for(Tn * row, Tn);
    int64_t bad = 0;
    #pragma omp parallel for num_threads(nt) if(nt > 1) schedule(static) reduction(+:bad)
    for (int64_t t = 0; t < Tn; t++) {
        float r[H], y[D] __attribute__((aligned(64)));
        const T *x = qkv + t * row;
        if (qw) {
            for (int64_t h = 0; h < H; h++) r[h] = sum_sq(x + h * D, D);
            for (int64_t h = 0; h < H; h++) r[h] = inv_rms(r[h], D, eps);
        }
        for (int64_t h = 0; h < H; h++) {
            if (qw) {
                scale(x + h * D, h < HQ ? qw : kw, r[h], D, y);
            } else {  /* no norm (Llama's heads): rotated as they come */
                #pragma omp simd
                for (int64_t i = 0; i < D; i++) y[i] = LD(x[h * D + i]);
            }
            rope(y, cos + t * D, sin + t * D, D,
                 h < HQ ? q + (t * HQ + h) * D : k + (t * HKV + h - HQ) * D);
        }
        const int64_t slot = slots[t];
        if (slot < 0 || slot >= nslots) {
            bad++;
            continue;
        }
        memcpy(kc + slot * kv, k + t * kv, kv * sizeof(T));
        memcpy(vc + slot * kv, x + H * D, kv * sizeof(T));
    }
    return bad;
}

/* qkv: [Tn, (HQ + 2 HKV) D]; cos, sin: [Tn, D]; q: [Tn, HQ, D]; k: [Tn, HKV, D]; caches:
   [nslots, HKV, D]; qw and kw NULL: no norm, only RoPE and the store. Returns how many
   tokens had a slot outside [0, nslots) (not stored). */
int64_t qk_norm_rope_store(const T *qkv, const T *qw, const T *kw, float eps, const T *cos,
                           const T *sin, const int64_t *slots, T *q, T *k, T *kc, T *vc,
                           int64_t Tn, int64_t HQ, int64_t HKV, int64_t D, int64_t nslots) {
#define QK(d) qk_rows(qkv, qw, kw, eps, cos, sin, slots, q, k, kc, vc, Tn, HQ, HKV, d, nslots)
    return D == 64 ? QK(64) : D == 128 ? QK(128) : QK(D);
#undef QK
}

/* sum = residual + x (rounded as torch's add); out = norm(sum); all [Tn, N]. */
void add_rms_norm(const T *x, const T *residual, const T *w, float eps, T *sum, T *out,
                  int64_t Tn, int64_t N) {
    const int nt = threads_for(Tn * N, (Tn + R - 1) / R);
    #pragma omp parallel for num_threads(nt) if(nt > 1) schedule(static)
    for (int64_t t = 0; t < Tn; t += R) {
        const int64_t rows = Tn - t < R ? Tn - t : R;
        const T *restrict a = residual + t * N, *restrict b = x + t * N;
        T *restrict y = sum + t * N;
        #pragma omp simd
        for (int64_t i = 0; i < rows * N; i++) y[i] = ST(LD(a[i]) + LD(b[i]));
        norm_rows(y, w, eps, rows, N, out + t * N);
    }
}

/* out = silu(gate) * up, gate and up the halves of each row of gu [Tn, 2 I] (an MLP's
   gate_up product), out [Tn, I]: SiLU is x / (1 + e^-x) in fp32, rounded to T, then the
   product rounded, as torch's silu and mul round. */
void silu_mul(const T *gu, T *out, int64_t Tn, int64_t I) {
    const int nt = threads_for(Tn * 2 * I, Tn);
    #pragma omp parallel for num_threads(nt) if(nt > 1) schedule(static)
    for (int64_t t = 0; t < Tn; t++) {
        const T *restrict g = gu + t * 2 * I, *restrict u = g + I;
        T *restrict y = out + t * I;
        #pragma omp simd
        for (int64_t i = 0; i < I; i++) {
            const float x = LD(g[i]);
            y[i] = ST(RB(x / (1.0f + exp_f32(-x))) * LD(u[i]));
        }
    }
}

void rms_norm(const T *x, const T *w, float eps, T *out, int64_t Tn, int64_t N) {
    const int nt = threads_for(Tn * N, (Tn + R - 1) / R);
    #pragma omp parallel for num_threads(nt) if(nt > 1) schedule(static)
    for (int64_t t = 0; t < Tn; t += R)
        norm_rows(x + t * N, w, eps, Tn - t < R ? Tn - t : R, N, out + t * N);
}

#undef sum_sq
#undef inv_rms
#undef scale
#undef rope
#undef norm_rows
#undef qk_rows
#undef qk_norm_rope_store
#undef add_rms_norm
#undef rms_norm
#undef silu_mul
#endif  /* T */
