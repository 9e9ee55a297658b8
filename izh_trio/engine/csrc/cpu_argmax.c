/* Row-wise argmax of fp32 logits, answering exactly as torch.argmax(dim=-1):
   argmax_rows. Built and called by cpu_argmax.py. */
#include <math.h>
#include <stdint.h>
#ifdef __AVX512F__
#include <immintrin.h>
#endif

static int64_t first_nan(const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        if (x[i] != x[i]) return i;
    return -1;
}

#ifdef __AVX512F__
/* Per lane: the largest value seen and the index where it was first seen (a strictly
   greater value replaces it, so the earliest of equals stays); then the lanes holding the
   row's maximum give up their smallest index. NaNs never compare greater: a row with one is
   sent to first_nan. Lanes past the row's end read -inf and never win over index 0. */
static int64_t argmax_row(const float *x, int64_t n) {
    const __m512i step = _mm512_set1_epi32(16);
    __m512i idx = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    __m512 best = _mm512_set1_ps(-INFINITY);
    __m512i where = idx;
    __mmask16 nan = 0;
    for (int64_t i = 0; i < n; i += 16, idx = _mm512_add_epi32(idx, step)) {
        const __mmask16 live = n - i >= 16 ? 0xFFFF : (__mmask16)((1u << (n - i)) - 1);
        const __m512 v = _mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY), live, x + i);
        nan |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
        const __mmask16 up = _mm512_cmp_ps_mask(v, best, _CMP_GT_OQ);
        best = _mm512_mask_mov_ps(best, up, v);
        where = _mm512_mask_mov_epi32(where, up, idx);
    }
    if (nan) return first_nan(x, n);
    const float top = _mm512_reduce_max_ps(best);
    const __mmask16 at = _mm512_cmp_ps_mask(best, _mm512_set1_ps(top), _CMP_EQ_OQ);
    return _mm512_mask_reduce_min_epi32(at, where);
}
#else
static int64_t argmax_row(const float *x, int64_t n) {
    const int64_t nan = first_nan(x, n);
    if (nan >= 0) return nan;
    int64_t at = 0;
    for (int64_t i = 1; i < n; i++)
        if (x[i] > x[at]) at = i;
    return at;
}
#endif

void argmax_rows(const float *x, int64_t rows, int64_t n, int64_t *out) {
    for (int64_t r = 0; r < rows; r++) out[r] = argmax_row(x + r * n, n);
}
