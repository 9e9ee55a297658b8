/* Paged decode attention on CPU, reading K/V in place: paged_decode (an fp32 cache),
   paged_decode_bf16 (a bf16 one) and paged_decode_f16 (an fp16 one, where the compiler has
   _Float16); q, scores, sums and out stay fp32. Built and called by
   cpu_attention.py (its docstring tells the design). The kernel proper is written once, at
   the end of this file, which includes itself once per cache element type (KV_T). */
#ifndef KV_T
#include <math.h>
#include <stdint.h>
#include <omp.h>
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define AVX512 1
#include <immintrin.h>
#endif
#define INLINE static inline __attribute__((always_inline))
#define LANES(k) ((k) >= 16 ? 0xFFFF : (1u << (k)) - 1)  /* the first k of 16 lanes */

/* q, out: [B, HQ, D]; kc, vc: [NB, BS, HKV, D]; tables: [B, W]; ctx: [B]. A block of a
   cache is contiguous (BS * HKV * D elements). Steps (*b, *blk) to the next block this call
   reads; returns where it starts and sets *bytes to what it holds (0: past the last one). */
static int64_t advance(int64_t *b, int64_t *blk, const int64_t *tables, const int64_t *ctx,
                       int64_t B, int64_t W, int64_t BS, int64_t row, int64_t esize,
                       int64_t *bytes) {
    *bytes = 0;
    if (*b >= B) return 0;
    if (++*blk * BS >= ctx[*b]) {
        *blk = 0;
        do { if (++*b >= B) return 0; } while (ctx[*b] <= 0);
    }
    *bytes = (ctx[*b] - *blk * BS < BS ? ctx[*b] - *blk * BS : BS) * row * esize;
    return tables[*b * W + *blk] * BS * row;
}

/* What a pass warms of the block after this one: the part of each of its rows (K and V)
   that the same pass will read there, so that every pass's rows arrive a block ahead. */
typedef struct {
    const char *k, *v;  /* the next block's first row, at this pass's heads */
    int64_t rows, stride, span;  /* its rows, bytes from row to row, bytes a row read */
} Next;

INLINE void warm(Next nx, int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1 && r < nx.rows; r++) {
        const char *k = nx.k + r * nx.stride, *v = nx.v + r * nx.stride;
        /* the lines the span touches: from the one it starts in */
        const int64_t lead = (int64_t)((uintptr_t)k & 63);
        for (int64_t o = -lead; o < nx.span; o += 64) {
            __builtin_prefetch(k + o, 0, 2);
            __builtin_prefetch(v + o, 0, 2);
        }
    }
}

INLINE uint16_t f32_bf16(float f) {  /* rounded to nearest, ties to even (finite f) */
    union { float f; uint32_t u; } v = {.f = f};
    return (uint16_t)((v.u + 0x7FFF + ((v.u >> 16) & 1)) >> 16);
}

INLINE float bf16_f32(uint16_t x) {  /* a bf16 is the upper half of an fp32's bits */
    union { uint32_t u; float f; } v = {.u = (uint32_t)x << 16};
    return v.f;
}

#ifdef AVX512
#define SET1 _mm512_set1_ps
#define ZERO _mm512_setzero_ps()
#define MASK(c) ((c) < NC - 1 ? 0xFFFF : tail)  /* vector c of a row of D floats */
#define TAIL const __mmask16 tail = LANES(D - 16 * (NC - 1))

INLINE __m512 exp16(__m512 x) {  /* 2^n e^r, |r| <= ln2 / 2, degree-7 Taylor: ~1 ulp */
    x = _mm512_max_ps(x, SET1(-100.0f));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, SET1(1.44269504f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m512 r = _mm512_fnmadd_ps(n, SET1(-2.12194440e-4f),
                                      _mm512_fnmadd_ps(n, SET1(0.693359375f), x));
    const float c[] = {1.0f / 720, 1.0f / 120, 1.0f / 24, 1.0f / 6, 0.5f, 1.0f, 1.0f};
    __m512 p = SET1(1.0f / 5040);
    for (int i = 0; i < 7; i++) p = _mm512_fmadd_ps(p, r, SET1(c[i]));
    return _mm512_scalef_ps(p, n);
}

/* A transpose-and-add tree turns 16 tokens' lane-wise products into their 16 scores: fold2
   leaves lanes alternating a, b; fold4 a, b, c, d in each 128 bits; two fold_lanes of four
   fold4s give the sums in order: 3 shuffles and adds a token, not 8 dependent ones. */
INLINE __m512 fold2(__m512 a, __m512 b) {
    return _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));
}
INLINE __m512 fold4(__m512 a, __m512 b) {
    const __m512d x = _mm512_castps_pd(a), y = _mm512_castps_pd(b);
    return _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(x, y)),
                         _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)));
}
INLINE __m512 fold_lanes(__m512 a, __m512 b) {
    return _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x88), _mm512_shuffle_f32x4(a, b, 0xDD));
}

INLINE float softmax(float *p, int64_t n, float *m, float *l) {
    __m512 mv = SET1(-INFINITY), sv = ZERO;
    for (int64_t j0 = 0; j0 < n; j0 += 16)
        mv = _mm512_mask_max_ps(mv, LANES(n - j0), mv, _mm512_load_ps(p + j0));
    const float mx = fmaxf(*m, _mm512_reduce_max_ps(mv));
    for (int64_t j0 = 0; j0 < n; j0 += 16) {
        const __m512 e = _mm512_maskz_mov_ps(
            LANES(n - j0), exp16(_mm512_sub_ps(_mm512_load_ps(p + j0), SET1(mx))));
        _mm512_store_ps(p + j0, e);
        sv = _mm512_add_ps(sv, e);
    }
    /* the running max mostly holds from block to block: then nothing to rescale */
    const float keep = mx == *m ? 1.0f : _mm512_cvtss_f32(exp16(SET1(*m - mx)));
    *l = *l * keep + _mm512_reduce_add_ps(sv), *m = mx;
    return keep;
}

#else
INLINE float softmax(float *p, int64_t n, float *m, float *l) {
    float mx = *m, sum = 0.0f;
    for (int64_t j = 0; j < n; j++) mx = fmaxf(mx, p[j]);
    for (int64_t j = 0; j < n; j++) sum += p[j] = expf(p[j] - mx);
    const float keep = expf(*m - mx);
    *l = *l * keep + sum, *m = mx;
    return keep;
}

#endif

/* The kernel, once per cache element type: fp32, and bf16 (widened to fp32 on load). */
#define KV_T float
#define KV_F32(x) (x)
#define KV_LOAD(m, p) _mm512_maskz_loadu_ps(m, p)
#define KV_NAME(f) f
#include __FILE__  /* this file again (cbuild compiles it by its absolute path) */
#undef KV_T
#undef KV_F32
#undef KV_LOAD
#undef KV_NAME
#define KV_T uint16_t
#define KV_F32(x) bf16_f32(x)
#define KV_LOAD(m, p) _mm512_castsi512_ps( \
    _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p)), 16))
#define KV_NAME(f) f##_bf16
#if defined(AVX512) && defined(__AVX512BF16__)
#define KV_PAIRS 1  /* q . k as vdpbf16ps over bf16 pairs: q is bf16 already (cpu_decode.c) */
#endif
#include __FILE__  /* this file again (cbuild compiles it by its absolute path) */
#undef KV_T
#undef KV_F32
#undef KV_LOAD
#undef KV_NAME
#undef KV_PAIRS
#if defined(__FLT16_MAX__) && (!defined(AVX512) || defined(__F16C__))
/* an fp16 cache (the compiler's _Float16): widened by F16C's conversion as it is loaded */
#define KV_T _Float16
#define KV_F32(x) ((float)(x))
#define KV_LOAD(m, p) _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p))
#define KV_NAME(f) f##_f16
#include __FILE__  /* this file again (cbuild compiles it by its absolute path) */
#endif

#else  /* KV_T: the kernel for one element type */
#define dot KV_NAME(dot)
#define scores KV_NAME(scores)
#define accumulate KV_NAME(accumulate)
#define decode KV_NAME(decode)
#define paged_decode KV_NAME(paged_decode)
#define decode_some KV_NAME(decode_some)

/* Per block, three steps on HN query heads, G of them to a KV head (rows of qs and acc are
   NC * 16 floats, zero-padded past D; p holds bsr scores a head): scores, then for each
   head an online-softmax step that turns them into weights and returns the old weights'
   scale, then acc = acc * keep + weights @ V while the next block's rows for the same
   pass are warmed (nx). Head h of the pass reads K and V at off[h] in a row. */
#ifdef AVX512
INLINE __m512 dot(const KV_T *k, const float *q, int NC, __mmask16 tail) {
    __m512 a = _mm512_mul_ps(_mm512_load_ps(q), KV_LOAD(MASK(0), k));
    for (int c = 1; c < NC; c++)
        a = _mm512_fmadd_ps(_mm512_load_ps(q + 16 * c),
                            KV_LOAD(MASK(c), k + 16 * c), a);
    return a;
}

INLINE void scores(const KV_T *k, int64_t stride, int64_t n, const float *qs, float *p,
                   int64_t bsr, const int HN, const int NC, int64_t D, const int64_t *off) {
    TAIL;
    for (int h0 = 0; h0 < HN; h0 += 8) {
        const int hn = HN - h0 < 8 ? HN - h0 : 8;
        const float *qh = qs + h0 * NC * 16;
        for (int64_t j0 = 0; j0 < n; j0 += 16) {
            __m512 u[8][4], t[8][2];
            for (int i = 0; i < 8; i++) {
                const int64_t j = j0 + 2 * i;
                for (int h = 0; h < hn; h++) {
                    const KV_T *kh = k + j * stride + off[h0 + h];
                    const float *qhh = qh + h * NC * 16;
                    t[h][i & 1] = fold2(j < n ? dot(kh, qhh, NC, tail) : ZERO,
                                        j + 1 < n ? dot(kh + stride, qhh, NC, tail) : ZERO);
                }
                for (int h = 0; i & 1 && h < hn; h++) u[h][i / 2] = fold4(t[h][0], t[h][1]);
            }
            for (int h = 0; h < hn; h++)
                _mm512_store_ps(p + (h0 + h) * bsr + j0, fold_lanes(fold_lanes(u[h][0], u[h][1]),
                                                                    fold_lanes(u[h][2], u[h][3])));
        }
    }
}

#ifdef KV_PAIRS
#define dotp KV_NAME(dotp)
#define scores_pairs KV_NAME(scores_pairs)
/* q . k over NC2 vectors of 32 bf16: vdpbf16ps adds each lane's pair of products, so q's
   pairs (zeros past D) meet k's in place, with no widening of k. */
INLINE __m512 dotp(const uint16_t *k, const uint16_t *qb, int NC2, __mmask32 tail) {
    __m512 a = ZERO;
    for (int c = 0; c < NC2; c++) {
        const __m512i kv = c < NC2 - 1 ? _mm512_loadu_si512(k + 32 * c)
                                       : _mm512_maskz_loadu_epi16(tail, k + 32 * c);
        a = _mm512_dpbf16_ps(a, (__m512bh)_mm512_load_si512(qb + 32 * c), (__m512bh)kv);
    }
    return a;
}

/* scores() for bf16 pairs, a head at a time, the scale applied to the sums. `whole`: a
   block's rows fill whole groups of 16 (BS % 16 == 0), so the rows past n can be read (what
   they give is masked off by softmax) and the loop has no branches. */
INLINE void scores_pairs(const uint16_t *k, int64_t stride, int64_t n, const uint16_t *qb,
                         float *p, int64_t bsr, const int HN, const int NC2, int64_t D,
                         const int64_t *off, float scale, int whole) {
    const int64_t last = D - 32 * (NC2 - 1);
    const __mmask32 tail = last >= 32 ? 0xFFFFFFFFu : (1u << last) - 1;
    for (int h = 0; h < HN; h++)
        for (int64_t j0 = 0; j0 < n; j0 += 16) {
            const uint16_t *kh = k + j0 * stride + off[h], *qh = qb + h * NC2 * 32;
            __m512 u[4];
#pragma GCC unroll 4
            for (int i = 0; i < 4; i++) {
                __m512 t[2];
#pragma GCC unroll 2
                for (int e = 0; e < 2; e++) {
                    const int64_t j = 4 * i + 2 * e;
                    t[e] = fold2(whole || j0 + j < n ? dotp(kh + j * stride, qh, NC2, tail) : ZERO,
                                 whole || j0 + j + 1 < n
                                     ? dotp(kh + (j + 1) * stride, qh, NC2, tail) : ZERO);
                }
                u[i] = fold4(t[0], t[1]);
            }
            _mm512_store_ps(p + h * bsr + j0,
                            _mm512_mul_ps(SET1(scale), fold_lanes(fold_lanes(u[0], u[1]),
                                                                  fold_lanes(u[2], u[3]))));
        }
}
#endif

INLINE void accumulate(const KV_T *v, int64_t stride, int64_t n, const float *p, int64_t bsr,
                       const float *keep, float *acc, Next nx, const int HN, const int NC,
                       int64_t D, const int64_t *off) {
    /* Tiles of HT heads x CT vectors, at most 16 accumulators: in registers when there is
       one tile and HN and NC are known. */
    const int HT = HN < 16 ? HN : 16, CT = 16 / HT < NC ? 16 / HT : NC;
    TAIL;
#define TILE for (int c = c0; c < (c0 + CT < NC ? c0 + CT : NC); c++) \
        for (int h = h0; h < (h0 + HT < HN ? h0 + HT : HN); h++)
#define A a[(h - h0) * CT + c - c0]
    for (int h0 = 0; h0 < HN; h0 += HT)
        for (int c0 = 0; c0 < NC; c0 += CT) {
            __m512 a[16];
            TILE A = _mm512_mul_ps(_mm512_load_ps(acc + (h * NC + c) * 16), SET1(keep[h]));
            for (int64_t j = 0; j < n; j++) {
                __m512 x = ZERO;  /* a V vector, loaded once for the heads that share it */
                if (h0 + c0 == 0) warm(nx, j, j == n - 1 ? nx.rows : j + 1);
                TILE {
                    if (h == h0 || off[h] != off[h - 1])
                        x = KV_LOAD(MASK(c), v + j * stride + off[h] + 16 * c);
                    A = _mm512_fmadd_ps(SET1(p[h * bsr + j]), x, A);
                }
            }
            TILE _mm512_store_ps(acc + (h * NC + c) * 16, A);
        }
}
#else  /* portable: what the compiler makes of plain loops */
INLINE void scores(const KV_T *k, int64_t stride, int64_t n, const float *qs, float *p,
                   int64_t bsr, const int HN, const int NC, int64_t D, const int64_t *off) {
    for (int64_t j = 0; j < n; j++)
        for (int h = 0; h < HN; h++) {
            const KV_T *kh = k + j * stride + off[h];
            float s = 0.0f;
            #pragma omp simd reduction(+:s)
            for (int64_t d = 0; d < D; d++) s += qs[h * NC * 16 + d] * KV_F32(kh[d]);
            p[h * bsr + j] = s;
        }
}

INLINE void accumulate(const KV_T *v, int64_t stride, int64_t n, const float *p, int64_t bsr,
                       const float *keep, float *acc, Next nx, const int HN, const int NC,
                       int64_t D, const int64_t *off) {
    for (int h = 0; h < HN; h++)
        for (int64_t d = 0; d < D; d++) acc[h * NC * 16 + d] *= keep[h];
    for (int64_t j = 0; j < n; j++) {
        warm(nx, j, j == n - 1 ? nx.rows : j + 1);
        for (int h = 0; h < HN; h++) {
            float *a = acc + h * NC * 16, w = p[h * bsr + j];
            const KV_T *x = v + j * stride + off[h];
            #pragma omp simd
            for (int64_t d = 0; d < D; d++) a[d] += w * KV_F32(x[d]);
        }
    }
}
#endif


INLINE void decode(const float *q, const KV_T *kc, const KV_T *vc, const int64_t *tables,
                   const int64_t *ctx, float *out, int64_t B, int64_t HQ, int64_t HKV,
                   int64_t D, int64_t BS, int64_t W, float scale, const int HN, const int G,
                   const int NC) {
    const int64_t bsr = (BS + 15) / 16 * 16, row = HKV * D;
    const int64_t rb = row * (int64_t)sizeof(KV_T);  /* bytes a row */
    float qs[HQ * NC * 16] __attribute__((aligned(64)));
#ifdef KV_PAIRS
    const int NC2 = (NC + 1) / 2;  /* vectors of 32 bf16 a row of D */
    uint16_t qb[HQ * NC2 * 32] __attribute__((aligned(64)));
#endif
    float acc[HQ * NC * 16] __attribute__((aligned(64)));
    float p[HN * bsr] __attribute__((aligned(64)));
    float m[HQ], l[HQ], keep[HN];
    int64_t off[HN];  /* where a pass's heads find their KV head in a row */
    for (int h = 0; h < HN; h++) off[h] = h / G * D;
    /* The next block goes to L2 a pass at a time, each pass warming its own heads' share
       of the next block's rows as it goes over this block's V rows: issued all at once at
       the start of a block, the same prefetches did not help (measured on Zen 4). */
    int64_t pb = 0, pblk = -1, bytes;
    advance(&pb, &pblk, tables, ctx, B, W, BS, row, sizeof(KV_T), &bytes);  /* the first */
    for (int64_t b = 0; b < B; b++) {
#ifdef KV_PAIRS
        /* q is bf16 in a bf16 model (cpu_decode.c widens it): then its pairs are exact and
           q . k can run on them; any other q keeps the fp32 products */
        int exact = 1;
#endif
        for (int64_t h = 0; h < HQ; h++) {
            m[h] = -INFINITY, l[h] = 0.0f;
            for (int64_t d = 0; d < NC * 16; d++) {
                qs[h * NC * 16 + d] = d < D ? q[(b * HQ + h) * D + d] * scale : 0.0f;
                acc[h * NC * 16 + d] = 0.0f;
            }
#ifdef KV_PAIRS
            for (int64_t d = 0; d < NC2 * 32; d++) {
                const float x = d < D ? q[(b * HQ + h) * D + d] : 0.0f;
                qb[h * NC2 * 32 + d] = f32_bf16(x);
                exact &= bf16_f32(qb[h * NC2 * 32 + d]) == x;
            }
#endif
        }
        for (int64_t blk = 0; blk * BS < ctx[b]; blk++) {
            const int64_t n = ctx[b] - blk * BS < BS ? ctx[b] - blk * BS : BS;
            const int64_t base = tables[b * W + blk] * BS * row;
            const int64_t at = advance(&pb, &pblk, tables, ctx, B, W, BS, row, sizeof(KV_T),
                                     &bytes);
            for (int64_t h0 = 0; h0 < HQ; h0 += HN) {
                const int64_t kv = h0 / G * D;
                const Next nx = {(const char *)(kc + at + kv), (const char *)(vc + at + kv),
                                 bytes / rb, rb, HN / G * D * (int64_t)sizeof(KV_T)};
#ifdef KV_PAIRS
                if (exact)
                    scores_pairs(kc + base + kv, row, n, qb + h0 * NC2 * 32, p, bsr, HN, NC2, D,
                                 off, scale, BS % 16 == 0);
                else
#endif
                scores(kc + base + kv, row, n, qs + h0 * NC * 16, p, bsr, HN, NC, D, off);
                for (int h = 0; h < HN; h++)
                    keep[h] = softmax(p + h * bsr, n, m + h0 + h, l + h0 + h);
                accumulate(vc + base + kv, row, n, p, bsr, keep, acc + h0 * NC * 16, nx, HN,
                           NC, D, off);
            }
        }
        for (int64_t h = 0; h < HQ; h++) {
            const float inv = l[h] > 0.0f ? 1.0f / l[h] : 0.0f;
            for (int64_t d = 0; d < D; d++) out[(b * HQ + h) * D + d] = acc[h * NC * 16 + d] * inv;
        }
    }
}

static void decode_some(const float *q, const KV_T *kc, const KV_T *vc, const int64_t *tables,
                        const int64_t *ctx, float *out, int64_t B, int64_t HQ, int64_t HKV,
                        int64_t D, int64_t BS, int64_t W, float scale) {
    /* Query heads go in passes of HN = T * G, the heads of T consecutive KV heads, so that
       one pass reads T heads' share of each row: T the largest divisor of HKV whose pass
       keeps its accumulators in registers (HN * NC <= 16). */
    const int64_t G = HQ / HKV, NC = (D + 15) / 16;
    int64_t T = 16 / (G * NC) > 1 ? 16 / (G * NC) : 1;
    while (HKV % T) T--;
#define CASE(hn, nc) else if (T * G == hn && NC == nc) \
        decode(q, kc, vc, tables, ctx, out, B, HQ, HKV, D, BS, W, scale, hn, G, nc);
    /* Two shapes get their own copy, loops unrolled and accumulators in registers: the
       tiny checkpoint's (4 heads of 64, GQA 2) and GQA 2 at 128. Each costs 0.2-0.5 s of
       compiling, paid at the first decode step of a fresh cache. */
    if (0) {}
    CASE(4, 4) CASE(2, 8)
    else decode(q, kc, vc, tables, ctx, out, B, HQ, HKV, D, BS, W, scale, T * G, G, NC);
}

/* Every sequence's attention, the sequences split between torch's threads (this library
   runs on torch's OpenMP runtime) in runs of about equal context, each thread reading its
   own sequences' rows. A batch with little context to read stays on the calling thread. */
void paged_decode(const float *q, const KV_T *kc, const KV_T *vc, const int64_t *tables,
                  const int64_t *ctx, float *out, int64_t B, int64_t HQ, int64_t HKV,
                  int64_t D, int64_t BS, int64_t W, float scale) {
    int64_t total = 0;
    for (int64_t b = 0; b < B; b++) total += ctx[b];
    int threads = B > 1 && total * HKV * D >= (1 << 18) ? omp_get_max_threads() : 1;
    if (threads > B) threads = (int)B;
    #pragma omp parallel num_threads(threads)
    {
        const int t = omp_get_thread_num(), nt = omp_get_num_threads();
        /* the sequences whose context starts in this thread's share of the total */
        int64_t b0 = 0, b1 = 0, seen = 0;
        for (int64_t b = 0; b < B; b++) {
            if (seen * nt < total * t) b0 = b + 1;
            if (seen * nt < total * (t + 1)) b1 = b + 1;
            seen += ctx[b];
        }
        if (t == nt - 1) b1 = B;
        if (b1 > b0)
            decode_some(q + b0 * HQ * D, kc, vc, tables + b0 * W, ctx + b0, out + b0 * HQ * D,
                        b1 - b0, HQ, HKV, D, BS, W, scale);
    }
}
#undef dot
#undef scores
#undef accumulate
#undef decode
#undef paged_decode
#undef decode_some
#undef dotp
#undef scores_pairs
#endif  /* KV_T */
