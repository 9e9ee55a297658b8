/* y[M, N] = x[M, K] @ W[N, K]^T (+ b[N]) in fp32 (AVX-512), bf16 (AMX or AVX512-BF16) or fp16
   (AVX-512 and F16C), on a weight repacked once at load (cpu_linear_blocked.pack) into
   blocks of NB = 32 outputs whose columns lie in order: [N / NB][K][NB] in fp32 and fp16; in
   bf16, column pairs, [N / NB][K / 2][NB][2], since vdpbf16ps multiplies a pair of x's
   columns, broadcast, by the same pair of 16 of W's rows and adds both products into one
   fp32 lane per output. fp16 has no such product on most CPUs: its weights are widened
   (exactly) as they are loaded and multiplied in fp32. Sums are fp32; bf16 and fp16 round
   once at the end, as oneDNN's matmul does. Built and called by cpu_linear_blocked.py with
   -fopenmp: torch's own libgomp (the same soname, loaded first) runs the threads, so this
   kernel shares torch's thread pool and follows torch.set_num_threads.

   Why not oneDNN: at the few rows of a decode step a linear is a read of its weight, and
   oneDNN reads its packed weights well under the machine's rate there. Here each thread
   reads the blocks of W it takes as sequential streams, and up to TM rows of x are
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
       PF_BYTES = 4096,    /* how far ahead a lone pass prefetches its stream into L1 */
       PF_ROWS = 4,        /* from how many rows it does */
       PF_L2_BYTES = 8192, /* and into L2, this far ahead, from PF_L2_ROWS rows */
       PF_L2_ROWS = 6 };

/* The threads a parallel region here would get: torch's count when this library shares
   torch's OpenMP runtime (cpu_linear_blocked.py checks it before trusting the kernel). */
int max_threads(void) { return omp_get_max_threads(); }

#if defined(__AVX512F__)
#include <immintrin.h>
#include <stdlib.h>

/* 16-bit elements need AVX512-BW and VL (their masked loads and stores). bf16 is served
   wherever they are: multiplied by vdpbf16ps where the CPU has AVX512-BF16 (HAVE_BF16),
   else each pair widened as it streams (a shift and a mask: a bf16 is the upper half of an
   fp32) and multiplied in fp32, as fp16 is after F16C's conversion. */
#if defined(__AVX512BW__) && defined(__AVX512VL__)
#define HAVE_BW 1
#else
#define HAVE_BW 0
#endif
#if defined(__AVX512BF16__) && HAVE_BW
#define HAVE_BF16 1
#else
#define HAVE_BF16 0
#endif
#if defined(__F16C__) && HAVE_BW
#define HAVE_F16 1
#else
#define HAVE_F16 0
#endif
/* AMX's tile products (Sapphire Rapids and later): bf16 rows against W a 16-by-32 tile at a
   time, where vdpbf16ps takes as long in arithmetic as fp32's FMAs over the same products
   and the arithmetic, not the memory, then bounds a step of a few rows. */
#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && HAVE_BF16
#define HAVE_AMX 1
#include <sys/syscall.h>
#include <unistd.h>
#else
#define HAVE_AMX 0
#endif

/* A call's element type: of x, W, the bias and y alike (cpu_linear_blocked._DTYPE_BITS). */
typedef enum { F32, BF16, F16 } Kind;

INLINE int64_t esize(Kind kind) { return kind == F32 ? 4 : 2; }  /* bytes of an element */
INLINE int64_t group(Kind kind) { return kind == BF16 ? 2 : 1; }  /* W's columns a step takes */
/* x's columns a packed word holds: a bf16 pair for vdpbf16ps, else one fp32 value */
INLINE int64_t xgroup(Kind kind) { return kind == BF16 && HAVE_BF16 ? 2 : 1; }

/* Words [w0, w1) of x's rows, TM rows a group, laid out so that a step's TM broadcasts read
   one cache line: [M / TM][KP / G][TM][G] where G is a word's columns (xgroup: 2 for
   vdpbf16ps's bf16 pairs, else 1; bf16's K padded even: KP) and rows and columns past x's
   are zeros. A word is 4 bytes: one fp32 column, an fp16 or bf16 column widened to fp32, or
   a bf16 pair (an odd K's last pair is its last column and a zero). */
INLINE void pack_rows(const void *x, void *xt, int64_t m_len, int64_t k_len, int64_t kp,
                      int64_t w0, int64_t w1, Kind kind) {
    const int64_t words = kp / xgroup(kind), whole = k_len / xgroup(kind);
    const int64_t end = w1 < whole ? w1 : whole;
    for (int64_t row = 0; row < (m_len + TM - 1) / TM * TM; row++) {
        uint32_t *dst = (uint32_t *)xt + row / TM * words * TM + row % TM;
        if (row >= m_len) {
            for (int64_t k = w0; k < w1; k++) dst[k * TM] = 0;
            continue;
        }
        const char *src = (const char *)x + row * k_len * esize(kind);
#if HAVE_F16
        if (kind == F16) {
            for (int64_t k = w0; k < end; k++) {
                uint16_t h;
                memcpy(&h, src + 2 * k, 2);
                const float f = _cvtsh_ss(h);
                memcpy(dst + k * TM, &f, 4);
            }
            continue;
        }
#endif
        if (kind == BF16 && !HAVE_BF16) {
            for (int64_t k = w0; k < w1; k++) {
                uint16_t h = 0;  /* K odd: the padding column is a zero */
                if (k < k_len) memcpy(&h, src + 2 * k, 2);
                dst[k * TM] = (uint32_t)h << 16;
            }
            continue;
        }
        for (int64_t k = w0; k < end; k++) {
            uint32_t v;
            memcpy(&v, src + 4 * k, 4);
            dst[k * TM] = v;
        }
        if (whole < w1) {  /* bf16, K odd: little-endian, the last column is the pair's first */
            uint16_t last;
            memcpy(&last, src + 4 * whole, 2);
            dst[whole * TM] = last;
        }
    }
}

/* One step of a block against a group's rows [0, MB): column k (fp32, fp16), or columns k,
   k + 1 (bf16, k even), of W and of the packed rows. */
INLINE void step(__m512 acc[][2], const void *xt, const void *block, int64_t k, int MB,
                 Kind kind) {
    (void)kind;  /* fp32's only, without AVX512-BW */
#if HAVE_BF16
    if (kind == BF16) {
        const uint16_t *wk = (const uint16_t *)block + k * NB;  /* (k / 2) * NB * 2 */
        const uint16_t *xk = (const uint16_t *)xt + k * TM;     /* (k / 2) * TM * 2 */
        __m512bh w0 = (__m512bh)_mm512_loadu_si512(wk);
        __m512bh w1 = (__m512bh)_mm512_loadu_si512(wk + 32);
        for (int m = 0; m < MB; m++) {
            /* broadcast as a float: an integer broadcast (vpbroadcastd) feeding vdpbf16ps
               was 4 % slower where memory and arithmetic both bind (docs/benchmarks.rst) */
            float v;
            memcpy(&v, xk + m * 2, 4);
            __m512bh xv = (__m512bh)_mm512_set1_ps(v);
            acc[m][0] = _mm512_dpbf16_ps(acc[m][0], xv, w0);
            acc[m][1] = _mm512_dpbf16_ps(acc[m][1], xv, w1);
        }
        return;
    }
#elif HAVE_BW
    if (kind == BF16) {  /* each pair split into column k's values and column k + 1's */
        const uint16_t *wk = (const uint16_t *)block + k * NB;  /* (k / 2) * NB * 2 */
        const __m512i p0 = _mm512_loadu_si512(wk), p1 = _mm512_loadu_si512(wk + 32);
        const __m512i high = _mm512_set1_epi32((int)0xFFFF0000u);
        const __m512 e0 = _mm512_castsi512_ps(_mm512_slli_epi32(p0, 16));
        const __m512 o0 = _mm512_castsi512_ps(_mm512_and_si512(p0, high));
        const __m512 e1 = _mm512_castsi512_ps(_mm512_slli_epi32(p1, 16));
        const __m512 o1 = _mm512_castsi512_ps(_mm512_and_si512(p1, high));
        const float *xk = (const float *)xt + k * TM;  /* column k's rows, then k + 1's */
        for (int m = 0; m < MB; m++) {
            const __m512 xe = _mm512_set1_ps(xk[m]), xo = _mm512_set1_ps(xk[TM + m]);
            acc[m][0] = _mm512_fmadd_ps(xo, o0, _mm512_fmadd_ps(xe, e0, acc[m][0]));
            acc[m][1] = _mm512_fmadd_ps(xo, o1, _mm512_fmadd_ps(xe, e1, acc[m][1]));
        }
        return;
    }
#endif
    const float *xk = (const float *)xt + k * TM;
    __m512 w0, w1;
#if HAVE_F16
    if (kind == F16) {
        const uint16_t *wk = (const uint16_t *)block + k * NB;
        w0 = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)wk));
        w1 = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(wk + 16)));
    } else
#endif
    {
        const float *wk = (const float *)block + k * NB;
        w0 = _mm512_loadu_ps(wk), w1 = _mm512_loadu_ps(wk + 16);
    }
    for (int m = 0; m < MB; m++) {
        __m512 xv = _mm512_set1_ps(xk[m]);
        acc[m][0] = _mm512_fmadd_ps(xv, w0, acc[m][0]);
        acc[m][1] = _mm512_fmadd_ps(xv, w1, acc[m][1]);
    }
}

/* What a pass prefetches of W while it goes. */
typedef enum {
    AHEAD_NONE,   /* nothing: a later pass over a chunk already fetched */
    AHEAD_CHUNK,  /* the chunk after this one, into L2: the first of several passes over a
                     block */
    AHEAD_STREAM  /* PF_BYTES ahead from PF_ROWS rows: a lone pass, which streams W */
} Ahead;

/* Where a pass's sums go once its block is done: y's rows (ld values apart) from this block's
   first column, `valid` of the NB columns there (N need not fill the last block), plus the
   bias at the same columns (or none); rounded once to bf16 or fp16 in those dtypes. */
typedef struct {
    void *y;
    const void *bias;
    int64_t ld;
    int valid;
} Out;

/* y's 16 columns [16 v, 16 v + 16) of a row: sum + bias, in bf16 rounded to nearest, ties to
   even, NaN as torch's one (0x7FC0), as torch rounds; in fp16 to nearest even by F16C. */
INLINE void put(__m512 sum, Out o, int64_t row, int v, Kind kind) {
    (void)kind;  /* fp32's only, without AVX512-BW */
    const int lanes = o.valid - 16 * v < 0 ? 0 : o.valid - 16 * v > 16 ? 16 : o.valid - 16 * v;
    const __mmask16 mask = (__mmask16)((1u << lanes) - 1u);
    if (!lanes) return;
    const int64_t at = row * o.ld + 16 * v;
#if HAVE_F16
    if (kind == F16) {
        if (o.bias)
            sum = _mm512_add_ps(sum, _mm512_cvtph_ps(
                _mm256_maskz_loadu_epi16(mask, (const uint16_t *)o.bias + 16 * v)));
        _mm256_mask_storeu_epi16((uint16_t *)o.y + at, mask,
                                 _mm512_cvtps_ph(sum, _MM_FROUND_TO_NEAREST_INT |
                                                      _MM_FROUND_NO_EXC));
        return;
    }
#endif
#if HAVE_BW  /* its masked 16-bit loads and stores */
    if (kind == BF16) {
        if (o.bias) {
            __m512i b = _mm512_cvtepu16_epi32(
                _mm256_maskz_loadu_epi16(mask, (const uint16_t *)o.bias + 16 * v));
            sum = _mm512_add_ps(sum, _mm512_castsi512_ps(_mm512_slli_epi32(b, 16)));
        }
#if HAVE_BF16
        /* the CPU's own rounding (to nearest even), and torch's NaN: a few operations where
           the integer rounding takes a dozen, per 16 sums of every block */
        __m256i r = (__m256i)_mm512_cvtneps_pbh(sum);
        r = _mm256_mask_mov_epi16(r, _mm512_cmp_ps_mask(sum, sum, _CMP_UNORD_Q),
                                  _mm256_set1_epi16(0x7FC0));
        _mm256_mask_storeu_epi16((uint16_t *)o.y + at, mask, r);
#else
        __m512i u = _mm512_castps_si512(sum);
        __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
        __m512i r = _mm512_srli_epi32(
            _mm512_add_epi32(u, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7FFF))), 16);
        __mmask16 nan = _mm512_cmpgt_epu32_mask(
            _mm512_and_si512(u, _mm512_set1_epi32(0x7FFFFFFF)), _mm512_set1_epi32(0x7F800000));
        r = _mm512_mask_mov_epi32(r, nan, _mm512_set1_epi32(0x7FC0));
        _mm256_mask_storeu_epi16((uint16_t *)o.y + at, mask, _mm512_cvtepi32_epi16(r));
#endif
        return;
    }
#endif
    if (o.bias) sum = _mm512_add_ps(sum, _mm512_maskz_loadu_ps(mask, (const float *)o.bias + 16 * v));
    _mm512_mask_storeu_ps((float *)o.y + at, mask, sum);
}

/* acc[m] += a group's rows [0, MB) (MB a constant once inlined) against a block's columns
   [k0, k1); acc starts from zero when fresh, else from part (fp32, [MB][NB]), and goes back
   there, or to y when this pass ends the block (`last`). */
INLINE void pass(const void *xt, const void *block, int64_t k0, int64_t k1, int MB,
                 int fresh, int last, Ahead ahead, float *part, Out o, Kind kind) {
    __m512 acc[TM][2];
    for (int m = 0; m < MB; m++)
        for (int v = 0; v < 2; v++)
            acc[m][v] = fresh ? _mm512_setzero_ps() : _mm512_loadu_ps(part + m * NB + v * 16);
    const int64_t g = group(kind), size = esize(kind);
    const char *w = (const char *)block;
    const int64_t chunk = (k1 - k0) * NB * size;  /* bytes of this pass's chunk */
    if (ahead == AHEAD_STREAM && MB >= PF_L2_ROWS) {
        /* enough rows that the arithmetic no longer hides the misses L1 keeps in flight:
           into L2, from further ahead (tools/bench/results/cpu-kernels.md) */
        for (int64_t k = k0; k < k1; k += g) {
            _mm_prefetch(w + k * NB * size + PF_L2_BYTES, _MM_HINT_T1);
            _mm_prefetch(w + k * NB * size + PF_L2_BYTES + 64, _MM_HINT_T1);
            step(acc, xt, block, k, MB, kind);
        }
    } else if (ahead == AHEAD_CHUNK) {
        /* into L2: in L1 the next chunk would evict this one and the rows' columns, which
           the later passes over it read (tools/bench/results/cpu-kernels.md) */
        for (int64_t k = k0; k < k1; k += g) {
            _mm_prefetch(w + k * NB * size + chunk, _MM_HINT_T1);
            _mm_prefetch(w + k * NB * size + chunk + 64, _MM_HINT_T1);
            step(acc, xt, block, k, MB, kind);
        }
    } else if (ahead == AHEAD_STREAM && MB >= PF_ROWS) {
        for (int64_t k = k0; k < k1; k += g) {
            _mm_prefetch(w + k * NB * size + PF_BYTES, _MM_HINT_T0);
            _mm_prefetch(w + k * NB * size + PF_BYTES + 64, _MM_HINT_T0);
            step(acc, xt, block, k, MB, kind);
        }
    } else {  /* a lone row streams faster on the hardware's prefetcher alone */
        for (int64_t k = k0; k < k1; k += g) step(acc, xt, block, k, MB, kind);
    }
    for (int m = 0; m < MB; m++)
        for (int v = 0; v < 2; v++) {
            if (last) put(acc[m][v], o, m, v, kind);
            else _mm512_storeu_ps(part + m * NB + v * 16, acc[m][v]);
        }
}

INLINE void pass_rows(const void *xt, const void *block, int64_t k0, int64_t k1, int mb,
                      int fresh, int last, Ahead ahead, float *part, Out o, Kind kind) {
    switch (mb) {
#define ROWS(n) pass(xt, block, k0, k1, n, fresh, last, ahead, part, o, kind); return;
    case 1: ROWS(1)
    case 2: ROWS(2)
    case 3: ROWS(3)
    case 4: ROWS(4)
    case 5: ROWS(5)
    case 6: ROWS(6)
    case 7: ROWS(7)
    default: ROWS(TM)
#undef ROWS
    }
}

/* Blocks [b0, b1) of W against every row of x (packed: xt). */
INLINE void blocks(const void *xt, const void *w, const void *bias, void *y, int64_t m_len,
                   int64_t n_len, int64_t kp, int64_t b0, int64_t b1,
                   float *part /* [m_len][NB] */, Kind kind) {
    const int64_t size = esize(kind), words = kp / xgroup(kind);
    /* one pass streams the block once, unchunked */
    const int64_t chunk = m_len <= TM ? kp : CHUNK_BYTES / (NB * size);
    for (int64_t b = b0; b < b1; b++) {
        const char *block = (const char *)w + b * NB * kp * size;
        const int64_t col = b * NB;
        for (int64_t k0 = 0; k0 < kp; k0 += chunk) {
            int64_t k1 = k0 + chunk < kp ? k0 + chunk : kp;
            for (int64_t m = 0; m < m_len; m += TM) {
                int mb = m_len - m < TM ? (int)(m_len - m) : TM;
                Ahead ahead = m_len <= TM ? AHEAD_STREAM : m == 0 ? AHEAD_CHUNK : AHEAD_NONE;
                Out o = {(char *)y + (m * n_len + col) * size,
                         bias ? (const char *)bias + col * size : NULL, n_len,
                         n_len - col < NB ? (int)(n_len - col) : NB};
                pass_rows((const uint32_t *)xt + m * words, block, k0, k1, mb, k0 == 0,
                          k1 == kp, ahead, part + m * NB, o, kind);
            }
        }
    }
}

#if HAVE_AMX
enum { AMX_ROWS = 16, AMX_K = 32 };  /* a tile: 16 rows of 64 bytes, 32 bf16 columns */

/* Whether this process may use AMX: Linux hands out its tile state only to a process that
   asks (arch_prctl ARCH_REQ_XCOMP_PERM for XTILEDATA); asked once, on the first bf16 call.
   IZH_CPU_AMX=0 declines it (the vdpbf16ps loop then serves, as on CPUs without AMX). */
static int amx_allowed(void) {
    static int state = -1;  /* -1: not asked yet */
    int seen = __atomic_load_n(&state, __ATOMIC_ACQUIRE);
    if (seen < 0) {
        const char *env = getenv("IZH_CPU_AMX");
        seen = !(env && env[0] == '0') && syscall(SYS_arch_prctl, 0x1023 /* REQ_XCOMP_PERM */,
                                                  18 /* XFEATURE_XTILEDATA */) == 0;
        __atomic_store_n(&state, seen, __ATOMIC_RELEASE);
    }
    return seen;
}

/* Tiles 0 and 1: sums of a block's outputs [0, 16) and [16, 32) for `rows` rows of x;
   2: those rows' next 32 columns; 3 and 4: W's same 32 columns (16 pairs) of the two
   halves. The configuration is a thread's own: set again when the rows change. */
INLINE void amx_configure(int rows) {
    struct {
        uint8_t palette, start_row, reserved[14];
        uint16_t colsb[16];
        uint8_t rows[16];
    } config;
    memset(&config, 0, sizeof config);
    config.palette = 1;
    for (int t = 0; t < 5; t++) {
        config.colsb[t] = 64;
        config.rows[t] = (uint8_t)(t < 3 ? rows : AMX_ROWS);
    }
    _tile_loadconfig(&config);
}

/* Blocks [b0, b1) of W against x's rows (as given: [m_len][kp], kp a multiple of AMX_K),
   AMX_ROWS rows at a time. A k pair's row of a block is 32 outputs' pairs, 128 bytes: the
   first 64 are outputs [0, 16)'s pairs, which is the VNNI layout tdpbf16ps wants of B, so
   W's tiles load straight from the packed weight with a 128-byte stride. *shape: the rows
   this thread's tile configuration is for (0: none yet). */
INLINE void amx_blocks(const uint16_t *x, const void *w, const void *bias, void *y,
                       int64_t m_len, int64_t n_len, int64_t kp, int64_t b0, int64_t b1,
                       int *shape) {
    float sums[2][AMX_ROWS][16] __attribute__((aligned(64)));
    for (int64_t b = b0; b < b1; b++) {
        const char *block = (const char *)w + b * NB * kp * 2;
        const int64_t col = b * NB;
        for (int64_t m = 0; m < m_len; m += AMX_ROWS) {
            const int rows = m_len - m < AMX_ROWS ? (int)(m_len - m) : AMX_ROWS;
            if (rows != *shape) amx_configure(*shape = rows);
            _tile_zero(0);
            _tile_zero(1);
            for (int64_t k = 0; k < kp; k += AMX_K) {
                _tile_loadd(2, x + m * kp + k, kp * 2);
                _tile_loadd(3, block + k * NB * 2, NB * 4);
                _tile_loadd(4, block + k * NB * 2 + 64, NB * 4);
                _tile_dpbf16ps(0, 2, 3);
                _tile_dpbf16ps(1, 2, 4);
            }
            _tile_stored(0, sums[0], 64);
            _tile_stored(1, sums[1], 64);
            Out o = {(char *)y + (m * n_len + col) * 2, bias ? (const char *)bias + col * 2 : NULL,
                     n_len, n_len - col < NB ? (int)(n_len - col) : NB};
            for (int r = 0; r < rows; r++)
                for (int v = 0; v < 2; v++) put(_mm512_load_ps(sums[v][r]), o, r, v, BF16);
        }
    }
}
#endif

/* What is left of a thread's share of W's blocks: [lo, hi) as one word (lo in the low
   half), so that its owner taking from the front and another thread taking from the back
   never both get a block. A line each: the owner's claims do not bounce the others'. */
typedef struct {
    _Alignas(64) uint64_t range;
} Share;

/* Takes blocks [*b0, *b1) from the front of a share (its owner: a quarter of what is left,
   long runs while much is) or from its back (another thread: half); 0 when it is empty. */
INLINE int claim(Share *sh, int front, int64_t *b0, int64_t *b1) {
    uint64_t old = __atomic_load_n(&sh->range, __ATOMIC_RELAXED);
    for (;;) {
        const uint64_t lo = old & 0xFFFFFFFFu, hi = old >> 32;
        if (lo >= hi) return 0;
        const uint64_t left = hi - lo, take = front ? (left + 3) / 4 : (left + 1) / 2;
        const uint64_t now = front ? hi << 32 | (lo + take) : (hi - take) << 32 | lo;
        if (__atomic_compare_exchange_n(&sh->range, &old, now, 0, __ATOMIC_RELAXED,
                                        __ATOMIC_RELAXED)) {
            *b0 = (int64_t)(front ? lo : hi - take), *b1 = (int64_t)(front ? lo + take : hi);
            return 1;
        }
    }
}

/* W's blocks split between the threads, each streaming its own; 0, or -1 when the rows'
   scratch cannot be had. */
INLINE int linear(const void *x, const void *w, const void *bias, void *y, int64_t m_len,
                  int64_t n_len, int64_t k_len, float *part, int64_t slots, Kind kind) {
    const int64_t total = (n_len + NB - 1) / NB;
    const int64_t kp = (k_len + group(kind) - 1) / group(kind) * group(kind);
    const int64_t words = kp / xgroup(kind);  /* of 4 bytes, a row's packed columns */
#if HAVE_AMX
    /* AMX reads x's rows as they are, in whole tiles of columns */
    const int amx = kind == BF16 && k_len % AMX_K == 0 && amx_allowed();
#else
    const int amx = 0;
#endif
    void *xt = NULL;
    if (!amx && posix_memalign(&xt, 64, (size_t)((m_len + TM - 1) / TM * TM * words * 4)) != 0)
        return -1;
    /* a small product is not worth waking the other threads for */
    int64_t threads = m_len * n_len * k_len >= (1 << 18) ? omp_get_max_threads() : 1;
    if (threads > slots) threads = slots;
    if (threads > total) threads = total;
    /* Each thread streams its own contiguous share of W's blocks, front to back, a part of
       what is left at a time; one that runs out takes from the back of another's share,
       half of what is left there at a time. A thread the OS stops for a while (the HTTP
       process wants a core now and then) or that streams slower leaves the rest of its
       share to the others, at the cost of a block or so, rather than holding up the whole
       region; and each share stays one stream for the hardware's prefetcher. */
    Share shares[threads];
    for (int64_t t = 0; t < threads; t++)
        shares[t].range = (uint64_t)(total * (t + 1) / threads) << 32 |
                          (uint64_t)(total * t / threads);
    #pragma omp parallel num_threads((int)threads)
    {
        int t = omp_get_thread_num(), nt = omp_get_num_threads();
        /* every thread packs a share of the rows' columns, and multiplies all of them */
        if (!amx) {
            pack_rows(x, xt, m_len, k_len, kp, words * t / nt, words * (t + 1) / nt, kind);
            #pragma omp barrier
        }
        float *own = part ? part + (int64_t)t * m_len * NB : NULL;
        int64_t b0, b1;
#if HAVE_AMX
        int shape = 0;  /* the rows this thread's tiles are configured for */
#endif
        /* its own share first, then the others' in turn (every share: a region given fewer
           threads than asked leaves some without an owner) */
        for (int64_t v = 0; v < threads; v++) {
            Share *sh = &shares[(t + v) % threads];
            while (claim(sh, v == 0, &b0, &b1)) {
                /* each dtype's loop compiled on its own (the region is outlined: kind is a
                   variable there) */
#if HAVE_AMX
                if (amx) amx_blocks(x, w, bias, y, m_len, n_len, kp, b0, b1, &shape); else
#endif
                if (kind == BF16) blocks(xt, w, bias, y, m_len, n_len, kp, b0, b1, own, BF16);
                else if (kind == F16) blocks(xt, w, bias, y, m_len, n_len, kp, b0, b1, own, F16);
                else blocks(xt, w, bias, y, m_len, n_len, kp, b0, b1, own, F32);
            }
        }
#if HAVE_AMX
        if (shape) _tile_release();  /* a thread's tile state is heavy to switch: given back */
#endif
    }
    free(xt);
    return 0;
}

/* The dtypes served on this CPU, as bits: 1 fp32, 2 bf16, 4 fp16
   (cpu_linear_blocked._DTYPE_BITS); and 8 where bf16 is multiplied by vdpbf16ps rather than
   widened (cpu_linear_blocked.BF16_PRODUCTS). */
int supported(void) {
    return 1 | (HAVE_BW ? 2 : 0) | (HAVE_F16 ? 4 : 0) | (HAVE_BF16 ? 8 : 0);
}

/* Whether bf16 is multiplied in AMX's tiles here: built for a CPU with them, and this
   process allowed to use them (cpu_linear_blocked.bf16_in_tiles). */
int tiles(void) {
#if HAVE_AMX
    return amx_allowed();
#else
    return 0;
#endif
}

/* y = x @ W^T (+ bias): x [m_len, k_len], W packed by cpu_linear_blocked.pack from
   [n_len, k_len], bias [n_len] or NULL, y [m_len, n_len]; contiguous, all of one dtype.
   part: fp32 scratch of slots * m_len * NB values (NULL will do for m_len <= TM, one pass
   a block); at most slots threads, as many as
   torch's (OpenMP's) thread count allows. */
int linear_f32(const float *x, const float *w, const float *bias, float *y, int64_t m_len,
               int64_t n_len, int64_t k_len, float *part, int64_t slots) {
    return linear(x, w, bias, y, m_len, n_len, k_len, part, slots, F32);
}

int linear_bf16(const uint16_t *x, const uint16_t *w, const uint16_t *bias, uint16_t *y,
                int64_t m_len, int64_t n_len, int64_t k_len, float *part, int64_t slots) {
    return HAVE_BW ? linear(x, w, bias, y, m_len, n_len, k_len, part, slots, BF16) : -1;
}

int linear_f16(const uint16_t *x, const uint16_t *w, const uint16_t *bias, uint16_t *y,
               int64_t m_len, int64_t n_len, int64_t k_len, float *part, int64_t slots) {
    return HAVE_F16 ? linear(x, w, bias, y, m_len, n_len, k_len, part, slots, F16) : -1;
}

#else  /* no AVX-512: cpu_linear_blocked.py keeps oneDNN's */
int supported(void) { return 0; }
int tiles(void) { return 0; }
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
int linear_f16(const uint16_t *x, const uint16_t *w, const uint16_t *bias, uint16_t *y,
               int64_t m_len, int64_t n_len, int64_t k_len, float *part, int64_t slots) {
    return linear_bf16(x, w, bias, y, m_len, n_len, k_len, part, slots);
}
#endif
