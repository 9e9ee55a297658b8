/* y[M, N] = x[M, K] @ W[N, K]^T (+ b[N]) in fp32 (AVX-512) or bf16 (AVX512-BF16), on a
   weight repacked once at load (cpu_linear_blocked.pack) into blocks of NB = 32 outputs
   whose columns lie in order: [N / NB][K][NB] in fp32; in bf16, column pairs,
   [N / NB][K / 2][NB][2], since vdpbf16ps multiplies a pair of x's columns, broadcast, by
   the same pair of 16 of W's rows and adds both products into one fp32 lane per output.
   Sums are fp32; bf16 rounds once at the end, as oneDNN's bf16 matmul does. Built and
   called by cpu_linear_blocked.py with -fopenmp: torch's own libgomp (the same soname,
   loaded first) runs the threads, so this kernel shares torch's thread pool and follows
   torch.set_num_threads.

   Why not oneDNN: at the few rows of a decode step a linear is a read of its weight, and
   oneDNN reads its packed weights well under the machine's rate there. Here each thread
   reads its share of W's blocks as one sequential stream, and up to TM rows of x are
   multiplied against it in one pass (no horizontal sums). More rows than TM take several
   passes over a block, a chunk of CHUNK_BYTES at a time so that the chunk is still in L1
   for the next pass. */
#include <stdint.h>
#include <string.h>
#include <omp.h>
#define INLINE static inline __attribute__((always_inline))

enum { NB = 32,    /* outputs per block, two vectors of fp32 lanes (cpu_linear_blocked.BLOCK) */
       TM = 8,     /* x rows per pass: TM * 2 accumulators */
       CHUNK_BYTES = 16384, /* of a block per chunk when rows take several passes */
       PF_BYTES = 4096,    /* how far ahead a lone pass prefetches its stream */
       PF_ROWS = 4 };      /* from how many rows it does */

INLINE uint16_t narrow_bf16(float f) {  /* round to nearest, ties to even, as torch does */
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return 0x7FC0;  /* NaN: torch's one */
    return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

INLINE float widen_bf16(uint16_t x) {
    uint32_t u = (uint32_t)x << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* The threads a parallel region here would get: torch's count when this library shares
   torch's OpenMP runtime (cpu_linear_blocked.py checks it before trusting the kernel). */
int max_threads(void) { return omp_get_max_threads(); }

#if defined(__AVX512F__)
#include <immintrin.h>
#include <stdlib.h>

#if defined(__AVX512BF16__) && defined(__AVX512BW__)
#define HAVE_BF16 1
#else
#define HAVE_BF16 0
#endif

/* x's rows, TM at a time, laid out so that a step's TM broadcasts read one cache line:
   [M / TM][KP / G][TM][G] where G is a step's columns (1 in fp32; in bf16 a pair, K padded
   even: KP) and rows past M are zeros. */
INLINE void pack_rows(const void *x, void *xt, int64_t m_len, int64_t k_len, int64_t kp,
                      int bf16) {
    int64_t groups = (m_len + TM - 1) / TM;
    for (int64_t grp = 0; grp < groups; grp++)
        for (int r = 0; r < TM; r++) {
            int64_t row = grp * TM + r;
            for (int64_t k = 0; k < kp; k++) {
                int in = row < m_len && k < k_len;
                if (bf16)
                    ((uint16_t *)xt)[grp * kp * TM + (k & ~1) * TM + r * 2 + (k & 1)] =
                        in ? ((const uint16_t *)x)[row * k_len + k] : 0;
                else
                    ((float *)xt)[grp * kp * TM + k * TM + r] =
                        in ? ((const float *)x)[row * k_len + k] : 0.0f;
            }
        }
}

/* One step of a block against a group's rows [0, MB): column k (fp32), or columns k, k + 1
   (bf16, k even), of W and of the packed rows. */
INLINE void step(__m512 acc[][2], const void *xt, const void *block, int64_t k, int MB,
                 int bf16) {
#if HAVE_BF16
    if (bf16) {
        const uint16_t *wk = (const uint16_t *)block + k * NB;  /* (k / 2) * NB * 2 */
        const uint16_t *xk = (const uint16_t *)xt + k * TM;     /* (k / 2) * TM * 2 */
        __m512bh w0 = (__m512bh)_mm512_loadu_si512(wk);
        __m512bh w1 = (__m512bh)_mm512_loadu_si512(wk + 32);
        for (int m = 0; m < MB; m++) {
            uint32_t v;
            memcpy(&v, xk + m * 2, 4);
            __m512bh xv = (__m512bh)_mm512_set1_epi32((int)v);
            acc[m][0] = _mm512_dpbf16_ps(acc[m][0], xv, w0);
            acc[m][1] = _mm512_dpbf16_ps(acc[m][1], xv, w1);
        }
        return;
    }
#endif
    (void)bf16;
    const float *wk = (const float *)block + k * NB, *xk = (const float *)xt + k * TM;
    __m512 w0 = _mm512_loadu_ps(wk), w1 = _mm512_loadu_ps(wk + 16);
    for (int m = 0; m < MB; m++) {
        __m512 xv = _mm512_set1_ps(xk[m]);
        acc[m][0] = _mm512_fmadd_ps(xv, w0, acc[m][0]);
        acc[m][1] = _mm512_fmadd_ps(xv, w1, acc[m][1]);
    }
}

/* What a pass prefetches of W while it goes. */
typedef enum {
    AHEAD_NONE,   /* nothing: a later pass over a chunk already fetched */
    AHEAD_CHUNK,  /* the chunk after this one: the first of several passes over a block */
    AHEAD_STREAM  /* PF_BYTES ahead from PF_ROWS rows: a lone pass, which streams W */
} Ahead;

/* acc[m] += a group's rows [0, MB) (MB a constant once inlined) against a block's columns
   [k0, k1); acc starts from zero when fresh, else from part (fp32, [MB][NB]). */
INLINE void pass(const void *xt, const void *block, int64_t k0, int64_t k1, int MB,
                 int fresh, Ahead ahead, float *part, int bf16) {
    __m512 acc[TM][2];
    for (int m = 0; m < MB; m++)
        for (int v = 0; v < 2; v++)
            acc[m][v] = fresh ? _mm512_setzero_ps() : _mm512_loadu_ps(part + m * NB + v * 16);
    const int g = bf16 ? 2 : 1;  /* columns a step takes */
    const char *w = (const char *)block;
    const int64_t size = bf16 ? 2 : 4;
    const int64_t span = ahead == AHEAD_CHUNK ? (k1 - k0) * NB * size : PF_BYTES;
    /* a lone row streams faster on the hardware's prefetcher alone */
    if (ahead == AHEAD_CHUNK || (ahead == AHEAD_STREAM && MB >= PF_ROWS)) {
        for (int64_t k = k0; k < k1; k += g) {
            _mm_prefetch(w + k * NB * size + span, _MM_HINT_T0);
            _mm_prefetch(w + k * NB * size + span + 64, _MM_HINT_T0);
            step(acc, xt, block, k, MB, bf16);
        }
    } else {
        for (int64_t k = k0; k < k1; k += g) step(acc, xt, block, k, MB, bf16);
    }
    for (int m = 0; m < MB; m++)
        for (int v = 0; v < 2; v++) _mm512_storeu_ps(part + m * NB + v * 16, acc[m][v]);
}

INLINE void pass_rows(const void *xt, const void *block, int64_t k0, int64_t k1, int mb,
                      int fresh, Ahead ahead, float *part, int bf16) {
    switch (mb) {
    case 1: pass(xt, block, k0, k1, 1, fresh, ahead, part, bf16); return;
    case 2: pass(xt, block, k0, k1, 2, fresh, ahead, part, bf16); return;
    case 3: pass(xt, block, k0, k1, 3, fresh, ahead, part, bf16); return;
    case 4: pass(xt, block, k0, k1, 4, fresh, ahead, part, bf16); return;
    case 5: pass(xt, block, k0, k1, 5, fresh, ahead, part, bf16); return;
    case 6: pass(xt, block, k0, k1, 6, fresh, ahead, part, bf16); return;
    case 7: pass(xt, block, k0, k1, 7, fresh, ahead, part, bf16); return;
    default: pass(xt, block, k0, k1, TM, fresh, ahead, part, bf16); return;
    }
}

/* Blocks [b0, b1) of W against every row of x (packed: xt). */
INLINE void blocks(const void *xt, const void *w, const void *bias, void *y, int64_t m_len,
                   int64_t n_len, int64_t kp, int64_t b0, int64_t b1,
                   float *part /* [m_len][NB] */, int bf16) {
    const int64_t size = bf16 ? 2 : 4;
    /* one pass streams the block once, unchunked */
    const int64_t chunk = m_len <= TM ? kp : CHUNK_BYTES / (NB * size);
    for (int64_t b = b0; b < b1; b++) {
        const char *block = (const char *)w + b * NB * kp * size;
        for (int64_t k0 = 0; k0 < kp; k0 += chunk) {
            int64_t k1 = k0 + chunk < kp ? k0 + chunk : kp;
            for (int64_t m = 0; m < m_len; m += TM) {
                int mb = m_len - m < TM ? (int)(m_len - m) : TM;
                Ahead ahead = m_len <= TM ? AHEAD_STREAM : m == 0 ? AHEAD_CHUNK : AHEAD_NONE;
                pass_rows((const char *)xt + m * kp * size, block, k0, k1, mb, k0 == 0,
                          ahead, part + m * NB, bf16);
            }
        }
        for (int64_t m = 0; m < m_len; m++)
            for (int64_t j = 0; j < NB && b * NB + j < n_len; j++) {
                int64_t n = b * NB + j;
                if (bf16) {
                    float s = part[m * NB + j] +
                              (bias ? widen_bf16(((const uint16_t *)bias)[n]) : 0.0f);
                    ((uint16_t *)y)[m * n_len + n] = narrow_bf16(s);
                } else {
                    ((float *)y)[m * n_len + n] =
                        part[m * NB + j] + (bias ? ((const float *)bias)[n] : 0.0f);
                }
            }
    }
}

/* W's blocks split between the threads, each streaming its own; 0, or -1 when the rows'
   scratch cannot be had. */
INLINE int linear(const void *x, const void *w, const void *bias, void *y, int64_t m_len,
                  int64_t n_len, int64_t k_len, float *part, int64_t slots, int bf16) {
    const int64_t total = (n_len + NB - 1) / NB, size = bf16 ? 2 : 4;
    const int64_t kp = bf16 ? (k_len + 1) / 2 * 2 : k_len;
    void *xt = NULL;
    if (posix_memalign(&xt, 64, (size_t)((m_len + TM - 1) / TM * TM * kp * size)) != 0)
        return -1;
    pack_rows(x, xt, m_len, k_len, kp, bf16);
    /* a small product is not worth waking the other threads for */
    int64_t threads = m_len * n_len * k_len >= (1 << 18) ? omp_get_max_threads() : 1;
    if (threads > slots) threads = slots;
    if (threads > total) threads = total;
    #pragma omp parallel num_threads((int)threads)
    {
        int t = omp_get_thread_num(), nt = omp_get_num_threads();
        int64_t b0 = total * t / nt, b1 = total * (t + 1) / nt;
        float *own = part + (int64_t)t * m_len * NB;
        /* each dtype's loop compiled on its own (the region is outlined: bf16 is a
           variable there) */
        if (bf16) blocks(xt, w, bias, y, m_len, n_len, kp, b0, b1, own, 1);
        else blocks(xt, w, bias, y, m_len, n_len, kp, b0, b1, own, 0);
    }
    free(xt);
    return 0;
}

/* The dtypes served on this CPU, as bits: 1 fp32, 2 bf16 (cpu_linear_blocked._DTYPE_BITS). */
int supported(void) { return HAVE_BF16 ? 3 : 1; }

/* y = x @ W^T (+ bias): x [m_len, k_len], W packed by cpu_linear_blocked.pack from
   [n_len, k_len], bias [n_len] or NULL, y [m_len, n_len]; contiguous, all of one dtype.
   part: fp32 scratch of slots * m_len * NB values; at most slots threads, as many as
   torch's (OpenMP's) thread count allows. */
int linear_f32(const float *x, const float *w, const float *bias, float *y, int64_t m_len,
               int64_t n_len, int64_t k_len, float *part, int64_t slots) {
    return linear(x, w, bias, y, m_len, n_len, k_len, part, slots, 0);
}

int linear_bf16(const uint16_t *x, const uint16_t *w, const uint16_t *bias, uint16_t *y,
                int64_t m_len, int64_t n_len, int64_t k_len, float *part, int64_t slots) {
    return HAVE_BF16 ? linear(x, w, bias, y, m_len, n_len, k_len, part, slots, 1) : -1;
}

#else  /* no AVX-512: cpu_linear_blocked.py keeps oneDNN's */
int supported(void) { return 0; }
int linear_f32(const float *x, const float *w, const float *bias, float *y, int64_t m_len,
               int64_t n_len, int64_t k_len, float *part, int64_t slots) {
    (void)x; (void)w; (void)bias; (void)y; (void)m_len; (void)n_len; (void)k_len;
    (void)part; (void)slots;
    return -1;
}
int linear_bf16(const uint16_t *x, const uint16_t *w, const uint16_t *bias, uint16_t *y,
                int64_t m_len, int64_t n_len, int64_t k_len, float *part, int64_t slots) {
    (void)x; (void)w; (void)bias; (void)y; (void)m_len; (void)n_len; (void)k_len;
    (void)part; (void)slots;
    return -1;
}
#endif
