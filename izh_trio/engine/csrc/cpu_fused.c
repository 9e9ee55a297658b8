/* A decoder layer's elementwise ops in fp32 on CPU, rounded as torch rounds them:
   qk_norm_rope_store, add_rms_norm, rms_norm. Built and called by cpu_fused.py
   (with -ffp-contract=off). */
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
