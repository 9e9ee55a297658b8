/* y[M, N] = x[M, K] @ W[N, K]^T (+ b[N]) in bf16 on CPUs with AVX512-BF16: vdpbf16ps
   multiplies a pair of x's columns, broadcast, by the same pair of 16 of W's rows and adds
   both products into fp32 lanes (one per output); one rounding to bf16 at the end, as
   oneDNN's bf16 matmul rounds. Built and called by cpu_linear_bf16.py with -fopenmp:
   torch's own libgomp (the same soname, loaded first) runs the threads, so this kernel
   shares torch's thread pool and follows torch.set_num_threads.

   Why not oneDNN: at the few rows of a decode step a linear is a read of its weight, and
   oneDNN reads its bf16 weights well under the machine's rate there. Here W is repacked
   once at load (cpu_linear_bf16.pack) into blocks of NB = 32 outputs, each block's
   column pairs in order, [N / NB][K / 2][NB][2], so each thread reads its share of W as
   one sequential stream, and up to TM rows of x are multiplied against it in one pass (no
   horizontal sums). More rows than TM take several passes over a block, a chunk of KC
   columns at a time so that the chunk is still in L1 for the next pass. */
#include <stdint.h>
#include <string.h>
#include <omp.h>
#define INLINE static inline __attribute__((always_inline))

enum { NB = 32,    /* outputs per block, two vectors of fp32 lanes (cpu_linear_bf16.BLOCK) */
       TM = 8,     /* x rows per pass: TM * 2 accumulators */
       KC = 256 }; /* columns per chunk when rows take several passes (16 KB of a block) */

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
   torch's OpenMP runtime (cpu_linear_bf16.py checks it before trusting the kernel). */
int max_threads(void) { return omp_get_max_threads(); }

#if defined(__AVX512BF16__) && defined(__AVX512BW__)
#include <immintrin.h>

int skinny_supported(void) { return 1; }

/* x's columns k, k + 1 of a row, in every 32-bit lane. */
INLINE __m512bh pair(const uint16_t *row, int64_t k) {
    uint32_t v;
    memcpy(&v, row + k, 4);
    return (__m512bh)_mm512_set1_epi32((int)v);
}

/* One column pair (k, k + 1) of a block against x rows [0, MB); last: k + 1 is the
   padding past an odd k_len, read as 0. */
INLINE void step(__m512 acc[][2], const uint16_t *x, int64_t k_len, const uint16_t *block,
                 int64_t k, int MB, int last) {
    const uint16_t *wk = block + k * NB;  /* (k / 2) * NB * 2 */
    __m512bh w0 = (__m512bh)_mm512_loadu_si512(wk);
    __m512bh w1 = (__m512bh)_mm512_loadu_si512(wk + 32);
    for (int m = 0; m < MB; m++) {
        __m512bh xv = last ? (__m512bh)_mm512_set1_epi32(x[m * k_len + k])
                           : pair(x + m * k_len, k);
        acc[m][0] = _mm512_dpbf16_ps(acc[m][0], xv, w0);
        acc[m][1] = _mm512_dpbf16_ps(acc[m][1], xv, w1);
    }
}

/* acc[m] += x rows [0, MB) (MB a constant once inlined) against a block's columns
   [k0, k1); acc starts from zero when fresh, else from part (fp32, [MB][NB]). The same
   span of W after this one is prefetched when ahead is set. */
INLINE void pass(const uint16_t *x, int64_t k_len, const uint16_t *block, int64_t k0,
                 int64_t k1, int MB, int fresh, int ahead, float *part) {
    __m512 acc[TM][2];
    for (int m = 0; m < MB; m++)
        for (int v = 0; v < 2; v++)
            acc[m][v] = fresh ? _mm512_setzero_ps() : _mm512_loadu_ps(part + m * NB + v * 16);
    const int64_t whole = k1 < (k_len & ~1) ? k1 : (k_len & ~1);  /* pairs wholly in x */
    const int64_t span = (k1 - k0) * NB;
    int64_t k = k0;
    if (ahead) {
        for (; k < whole; k += 2) {
            _mm_prefetch((const char *)(block + k * NB + span), _MM_HINT_T0);
            _mm_prefetch((const char *)(block + k * NB + span + 32), _MM_HINT_T0);
            step(acc, x, k_len, block, k, MB, 0);
        }
    } else {
        for (; k < whole; k += 2) step(acc, x, k_len, block, k, MB, 0);
    }
    if (k < k1) step(acc, x, k_len, block, k, MB, 1);
    for (int m = 0; m < MB; m++)
        for (int v = 0; v < 2; v++) _mm512_storeu_ps(part + m * NB + v * 16, acc[m][v]);
}

static void pass_rows(const uint16_t *x, int64_t k_len, const uint16_t *block, int64_t k0,
                      int64_t k1, int mb, int fresh, int ahead, float *part) {
    switch (mb) {
    case 1: pass(x, k_len, block, k0, k1, 1, fresh, ahead, part); return;
    case 2: pass(x, k_len, block, k0, k1, 2, fresh, ahead, part); return;
    case 3: pass(x, k_len, block, k0, k1, 3, fresh, ahead, part); return;
    case 4: pass(x, k_len, block, k0, k1, 4, fresh, ahead, part); return;
    case 5: pass(x, k_len, block, k0, k1, 5, fresh, ahead, part); return;
    case 6: pass(x, k_len, block, k0, k1, 6, fresh, ahead, part); return;
    case 7: pass(x, k_len, block, k0, k1, 7, fresh, ahead, part); return;
    default: pass(x, k_len, block, k0, k1, TM, fresh, ahead, part); return;
    }
}

/* Blocks [b0, b1) of W against every row of x. */
static void blocks(const uint16_t *x, const uint16_t *w, const uint16_t *bias, uint16_t *y,
                   int64_t m_len, int64_t n_len, int64_t k_len, int64_t b0, int64_t b1,
                   float *part /* [m_len][NB] */) {
    int64_t kp = (k_len + 1) / 2 * 2;
    int64_t chunk = m_len <= TM ? kp : KC;  /* one pass: stream the block once, unchunked */
    for (int64_t b = b0; b < b1; b++) {
        const uint16_t *block = w + b * NB * kp;
        for (int64_t k0 = 0; k0 < kp; k0 += chunk) {
            int64_t k1 = k0 + chunk < kp ? k0 + chunk : kp;
            for (int64_t m = 0; m < m_len; m += TM) {
                int mb = m_len - m < TM ? (int)(m_len - m) : TM;
                /* the first of several passes fetches the next chunk meanwhile (one
                   pass streams, and the hardware's prefetcher keeps up with it) */
                pass_rows(x + m * k_len, k_len, block, k0, k1, mb, k0 == 0,
                          m == 0 && m_len > TM, part + m * NB);
            }
        }
        for (int64_t m = 0; m < m_len; m++)
            for (int64_t j = 0; j < NB && b * NB + j < n_len; j++) {
                int64_t n = b * NB + j;
                float s = part[m * NB + j] + (bias ? widen_bf16(bias[n]) : 0.0f);
                y[m * n_len + n] = narrow_bf16(s);
            }
    }
}

/* y = x @ W^T (+ bias): x [m_len, k_len], W packed by cpu_linear_bf16.pack from
   [n_len, k_len], bias [n_len] or NULL, y [m_len, n_len]; bf16, contiguous. part: fp32
   scratch of slots * m_len * NB values; at most slots threads, as many as torch's
   (OpenMP's) thread count allows. W's blocks are split between the threads, each streaming
   its own. */
void linear_bf16(const uint16_t *x, const uint16_t *w, const uint16_t *bias, uint16_t *y,
                 int64_t m_len, int64_t n_len, int64_t k_len, float *part, int64_t slots) {
    int64_t total = (n_len + NB - 1) / NB;
    /* a small product is not worth waking the other threads for */
    int64_t threads = m_len * n_len * k_len >= (1 << 18) ? omp_get_max_threads() : 1;
    if (threads > slots) threads = slots;
    if (threads > total) threads = total;
    #pragma omp parallel num_threads((int)threads)
    {
        int t = omp_get_thread_num(), nt = omp_get_num_threads();
        blocks(x, w, bias, y, m_len, n_len, k_len, total * t / nt, total * (t + 1) / nt,
               part + (int64_t)t * m_len * NB);
    }
}

#else  /* no native bf16 dot product: cpu_linear_bf16.py keeps oneDNN's */
int skinny_supported(void) { return 0; }
void linear_bf16(const uint16_t *x, const uint16_t *w, const uint16_t *bias, uint16_t *y,
                 int64_t m_len, int64_t n_len, int64_t k_len, float *part, int64_t slots) {
    (void)x; (void)w; (void)bias; (void)y; (void)m_len; (void)n_len; (void)k_len;
    (void)part; (void)slots;
}
#endif
