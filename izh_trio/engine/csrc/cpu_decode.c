/* A decode step's decoder layers, all of them in one call: the same kernels the model's CPU
   twins call one by one from Python (cpu_fused.c, cpu_linear_blocked.c, cpu_attention.c), in
   the same order on the same buffers, chained here so that a step of a few rows does not pay
   some twenty Python calls a layer. Built and called by models/cpu_decode.py, which hands
   over the kernels' own entry points (Kernels) and each layer's tensors (Layer); the results
   are bitwise the Python path's. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef void (*rms_norm_fn)(const void *x, const void *w, float eps, void *out, int64_t rows,
                            int64_t n);
typedef void (*add_rms_norm_fn)(const void *x, const void *residual, const void *w, float eps,
                                void *sum, void *out, int64_t rows, int64_t n);
typedef int64_t (*qk_fn)(const void *qkv, const void *qw, const void *kw, float eps,
                         const void *cos, const void *sin, const int64_t *slots, void *q,
                         void *k, void *kc, void *vc, int64_t rows, int64_t hq, int64_t hkv,
                         int64_t d, int64_t nslots);
typedef void (*silu_mul_fn)(const void *gu, void *out, int64_t rows, int64_t i);
typedef int (*linear_fn)(const void *x, const void *w, const void *bias, void *y, int64_t m,
                         int64_t n, int64_t k, float *part, int64_t slots);
typedef void (*attention_fn)(const float *q, const void *kc, const void *vc,
                             const int64_t *tables, const int64_t *ctx, float *out, int64_t b,
                             int64_t hq, int64_t hkv, int64_t d, int64_t bs, int64_t w,
                             float scale);

typedef struct {  /* the kernels, each the entry for the model's dtype */
    rms_norm_fn rms_norm;
    add_rms_norm_fn add_rms_norm;
    qk_fn qk_norm_rope_store;
    silu_mul_fn silu_mul;
    linear_fn linear;
    attention_fn attention;
} Kernels;

typedef struct {  /* the model's shape, and the linear kernel's rows a pass and outputs a
                    block (its fp32 scratch is needed past a pass: threads x rows x block) */
    int64_t hidden, heads, kv_heads, head_dim, intermediate, block_size, cache_slots;
    int64_t rows_per_pass, linear_block;
    float eps, qk_eps, scale;
    int64_t element;  /* the model's dtype: 0 fp32, 1 bf16, 2 fp16 (cpu_decode._ELEMENT) */
} Shape;

typedef struct {  /* one layer's tensors: packed weights, biases or NULL, norms, caches */
    const void *input_norm, *post_norm, *q_norm, *k_norm;  /* q_norm, k_norm: NULL (Llama) */
    const void *qkv, *qkv_bias, *o, *o_bias, *gate_up, *gate_up_bias, *down, *down_bias;
    void *k_cache, *v_cache;
} Layer;

typedef struct {  /* the step: `rows` rows, each with its own table row and context (a
                    decode, or a row of a prompt chunk short enough for the kernel) */
    int64_t rows, table_width, threads;
    const void *cos, *sin;  /* [rows, D] in the model's dtype */
    const int64_t *slots, *tables, *context_lens;
} Step;

/* bf16 -> fp32, exactly (a bf16 is the upper half of an fp32) */
static void widen(const uint16_t *restrict x, uint32_t *restrict y, int64_t n) {
    #pragma omp simd
    for (int64_t i = 0; i < n; i++) y[i] = (uint32_t)x[i] << 16;
}

/* fp32 -> bf16 as torch rounds: to nearest, ties to even; NaN as 0x7FC0 */
static void narrow(const uint32_t *restrict x, uint16_t *restrict y, int64_t n) {
    #pragma omp simd
    for (int64_t i = 0; i < n; i++) {
        const uint32_t u = x[i];
        const uint16_t r = (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
        y[i] = (u & 0x7FFFFFFFu) > 0x7F800000u ? (uint16_t)0x7FC0 : r;
    }
}

/* fp16 <-> fp32 (the compiler's _Float16, F16C on x86): widening is exact, narrowing rounds
   to nearest even, as torch's .to(float16) does */
static void widen_f16(const void *restrict x, float *restrict y, int64_t n) {
#if defined(__FLT16_MAX__)
    const _Float16 *restrict h = x;
    #pragma omp simd
    for (int64_t i = 0; i < n; i++) y[i] = (float)h[i];
#else
    (void)x, (void)y, (void)n;  /* never called: cpu_decode.py needs the fused kernels' fp16 */
#endif
}

static void narrow_f16(const float *restrict x, void *restrict y, int64_t n) {
#if defined(__FLT16_MAX__)
    _Float16 *restrict h = y;
    #pragma omp simd
    for (int64_t i = 0; i < n; i++) h[i] = (_Float16)x[i];
#else
    (void)x, (void)y, (void)n;
#endif
}

/* Every layer on x [rows, hidden] (the embeddings); writes the last layer's MLP output to
   `mlp` and the residual stream to `residual`, whose sum is the stack's output, as
   DecoderStack.forward adds them. Returns 0; the count of slots outside the cache (nothing
   more was done after the layer that found them); -1 without memory. */
int64_t decode_layers(const Kernels *kern, const Shape *s, const Layer *layers,
                      int64_t num_layers, const Step *st, const void *x, void *mlp,
                      void *residual) {
    const int64_t m = st->rows, h = s->hidden, d = s->head_dim, size = s->element ? 2 : 4;
    const int64_t q_len = s->heads * d, kv_len = s->kv_heads * d, qkv_len = q_len + 2 * kv_len;
    const int64_t i2 = 2 * s->intermediate;
    /* one allocation for every buffer, each 64-byte aligned */
    const int64_t words[] = {m * h, m * h, m * h, m * h, m * qkv_len, m * q_len, m * kv_len,
                             m * q_len, m * i2, m * s->intermediate};
    enum { STREAM_A, STREAM_B, O, NORMED, QKV, Q, K, ATT, GU, ACT, COUNT };
    int64_t at[COUNT + 1] = {0};
    for (int i = 0; i < COUNT; i++) at[i + 1] = at[i] + (words[i] * size + 63) / 64 * 64;
    const int64_t fp32_len = s->element ? m * q_len : 0;  /* q and the output, widened */
    const int64_t part_len = m > s->rows_per_pass ? st->threads * m * s->linear_block : 0;
    char *buf = NULL;
    if (posix_memalign((void **)&buf, 64, (size_t)(at[COUNT] + 4 * (2 * fp32_len + part_len)))
        != 0)
        return -1;
#define AT(i) ((void *)(buf + at[i]))
    void *normed = AT(NORMED), *qkv = AT(QKV), *q = AT(Q), *k = AT(K), *att = AT(ATT);
    void *o = AT(O), *gu = AT(GU), *act = AT(ACT);
    float *qf = (float *)AT(COUNT), *af = qf + fp32_len, *part = part_len ? af + fp32_len : NULL;
    /* The residual stream: the embeddings before the first layer, then each add's sum, in
       whichever of two buffers the stream is not in now (the add reads one, writes the other). */
    const void *res = x;
#define NEXT (res == AT(STREAM_A) ? AT(STREAM_B) : AT(STREAM_A))
    int64_t status = -1;  /* a linear's rows could not be had, until the layers are done */
    for (int64_t l = 0; l < num_layers; l++) {
        const Layer *ly = &layers[l];
        if (l == 0) {
            kern->rms_norm(x, ly->input_norm, s->eps, normed, m, h);
        } else {
            void *sum = NEXT;
            kern->add_rms_norm(mlp, res, ly->input_norm, s->eps, sum, normed, m, h);
            res = sum;
        }
        if (kern->linear(normed, ly->qkv, ly->qkv_bias, qkv, m, qkv_len, h, part, st->threads))
            goto done;
        const int64_t bad = kern->qk_norm_rope_store(
            qkv, ly->q_norm, ly->k_norm, s->qk_eps, st->cos, st->sin, st->slots, q, k,
            ly->k_cache, ly->v_cache, m, s->heads, s->kv_heads, d, s->cache_slots);
        if (bad) {
            status = bad;
            goto done;
        }
        if (s->element) {  /* the kernel's q and output are fp32, as cpu_attention.py widens */
            if (s->element == 2) widen_f16(q, qf, m * q_len);
            else widen((const uint16_t *)q, (uint32_t *)qf, m * q_len);
            kern->attention(qf, ly->k_cache, ly->v_cache, st->tables, st->context_lens, af, m,
                            s->heads, s->kv_heads, d, s->block_size, st->table_width, s->scale);
            if (s->element == 2) narrow_f16(af, att, m * q_len);
            else narrow((const uint32_t *)af, (uint16_t *)att, m * q_len);
        } else {
            kern->attention((const float *)q, ly->k_cache, ly->v_cache, st->tables,
                            st->context_lens, (float *)att, m, s->heads, s->kv_heads, d,
                            s->block_size, st->table_width, s->scale);
        }
        if (kern->linear(att, ly->o, ly->o_bias, o, m, h, q_len, part, st->threads)) goto done;
        void *sum = NEXT;
        kern->add_rms_norm(o, res, ly->post_norm, s->eps, sum, normed, m, h);
        res = sum;
        if (kern->linear(normed, ly->gate_up, ly->gate_up_bias, gu, m, i2, h, part,
                         st->threads))
            goto done;
        kern->silu_mul(gu, act, m, s->intermediate);
        if (kern->linear(act, ly->down, ly->down_bias, mlp, m, h, s->intermediate, part,
                         st->threads))
            goto done;
    }
    memcpy(residual, res, (size_t)(m * h * size));
    status = 0;
done:
#undef NEXT
#undef AT
    free(buf);
    return status;
}
