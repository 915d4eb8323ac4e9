/* Row-wise operations of the model's layers (rowwise.py calls these): each row's result depends only on
   that row, by a fixed sequence of float operations that is the same on the three paths (reference, AVX2,
   AVX-512), so the bits do not depend on the number of rows, the thread count or the path.

   rms_norm:  ss = sum_d x_d^2 (16 lanes, fused multiply-adds, the es_sum16 tree, tail elements one by
              one), inv = 1 / sqrtf(ss / D + eps), y_d = (x_d * inv) * w_d: Hugging Face's Qwen2RMSNorm
              order in float32 (x * rsqrt(mean(x^2) + eps), then times the weight), with an exact square
              root and division instead of an approximate reciprocal square root.
   silu_mul:  y = (g / (1 + es_exp(-g))) * u, element by element.
   rotary:    x1' = x1 * cos - x2 * sin, x2' = x2 * cos + x1 * sin over the two halves of each head (NeoX
              "rotate_half"), no fused multiply-add: the products and sums Hugging Face's
              q * cos + rotate_half(q) * sin rounds, from a cos/sin table the caller builds.
   Threads (es_run) take work items of whole rows (rms_norm, rotary) or of independent
   elements (silu_mul); one row's reduction is never split. An item holds at least ES_ROWWISE_ITEM floats,
   so a call of one or a few rows is one item and runs on the calling thread alone: handing it to the pool
   would cost about what it takes. */
#include <stdint.h>

#include "fixed_math.h"
#include "rowwise.h"

#define ES_ROWWISE_ITEM 8192

/* Rows per work item for rows of `floats` floats. */
static int64_t rows_per_item(int64_t floats) {
    return floats >= ES_ROWWISE_ITEM ? 1 : (ES_ROWWISE_ITEM + floats - 1) / (floats > 0 ? floats : 1);
}

/* ---------------------------------------------------------------- sum of squares of one row */

static float sumsq_ref(const float *x, int D) {
    int body = D & ~15;
    float lanes[16] = {0};
    for (int d = 0; d < body; d += 16)
        for (int l = 0; l < 16; l++) lanes[l] = fmaf(x[d + l], x[d + l], lanes[l]);
    float s = es_sum16_ref(lanes);
    for (int d = body; d < D; d++) s = fmaf(x[d], x[d], s);
    return s;
}

__attribute__((target("avx2,fma"))) static float sumsq_avx2(const float *x, int D) {
    int body = D & ~15;
    __m256 lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps();
    for (int d = 0; d < body; d += 16) {
        __m256 a = _mm256_loadu_ps(x + d), b = _mm256_loadu_ps(x + d + 8);
        lo = _mm256_fmadd_ps(a, a, lo);
        hi = _mm256_fmadd_ps(b, b, hi);
    }
    float s = es_sum16_avx2(lo, hi);
    for (int d = body; d < D; d++) s = fmaf(x[d], x[d], s);
    return s;
}

__attribute__((target("avx512f"))) static float sumsq_avx512(const float *x, int D) {
    int body = D & ~15;
    __m512 acc = _mm512_setzero_ps();
    for (int d = 0; d < body; d += 16) {
        __m512 a = _mm512_loadu_ps(x + d);
        acc = _mm512_fmadd_ps(a, a, acc);
    }
    float s = es_sum16_avx512(acc);
    for (int d = body; d < D; d++) s = fmaf(x[d], x[d], s);
    return s;
}

/* y = (x * inv) * w, element by element: plain multiplies, the same bits at any width. */
static void scale_row(const float *x, const float *w, float inv, float *y, int D) {
    for (int d = 0; d < D; d++) y[d] = (x[d] * inv) * w[d];
}

static void norm_row(int path, const float *x, const float *w, float eps, float *y, int D) {
    float ss = path == ES_PATH_AVX512 ? sumsq_avx512(x, D) : path == ES_PATH_AVX2 ? sumsq_avx2(x, D) : sumsq_ref(x, D);
    float variance = ss / (float)D;
    float inv = 1.0f / sqrtf(variance + eps);
    scale_row(x, w, inv, y, D);
}

typedef struct {
    int path, M, D;
    int64_t rows;
    const float *x, *weight;
    float *y;
    float eps;
} Norm;

/* Rows item * rows .. of rms_norm. */
static void norm_item(void *context, int64_t item) {
    Norm *a = context;
    int64_t end = (item + 1) * a->rows < a->M ? (item + 1) * a->rows : a->M;
    for (int64_t m = item * a->rows; m < end; m++)
        norm_row(a->path, a->x + (size_t)m * a->D, a->weight, a->eps, a->y + (size_t)m * a->D, a->D);
}

void es_rms_norm(int path, int threads, const float *x, const float *weight, float eps, float *y, int M, int D) {
    path = es_vector_path(path);
    Norm a = {.path = path, .M = M, .D = D, .x = x, .weight = weight, .y = y, .eps = eps};
    a.rows = rows_per_item(D);
    es_run(threads, (M + a.rows - 1) / a.rows, norm_item, &a);
}

/* ---------------------------------------------------------------- silu(gate) * up */

static void silu_mul_ref(const float *g, const float *u, float *y, long count) {
    for (long i = 0; i < count; i++) y[i] = (g[i] / (1.0f + es_exp_ref(-g[i]))) * u[i];
}

__attribute__((target("avx2,fma"))) static void silu_mul_avx2(const float *g, const float *u, float *y, long count) {
    long i = 0;
    __m256 one = _mm256_set1_ps(1.0f), zero = _mm256_setzero_ps();
    for (; i + 8 <= count; i += 8) {
        __m256 gv = _mm256_loadu_ps(g + i);
        __m256 e = es_exp_avx2(_mm256_sub_ps(zero, gv));
        _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_div_ps(gv, _mm256_add_ps(one, e)), _mm256_loadu_ps(u + i)));
    }
    silu_mul_ref(g + i, u + i, y + i, count - i);
}

__attribute__((target("avx512f"))) static void silu_mul_avx512(const float *g, const float *u, float *y, long count) {
    long i = 0;
    __m512 one = _mm512_set1_ps(1.0f), zero = _mm512_setzero_ps();
    for (; i + 16 <= count; i += 16) {
        __m512 gv = _mm512_loadu_ps(g + i);
        __m512 e = es_exp_avx512(_mm512_sub_ps(zero, gv));
        _mm512_storeu_ps(y + i, _mm512_mul_ps(_mm512_div_ps(gv, _mm512_add_ps(one, e)), _mm512_loadu_ps(u + i)));
    }
    silu_mul_ref(g + i, u + i, y + i, count - i);
}

typedef struct {
    int path;
    long count, chunk;
    const float *gate, *up;
    float *y;
} Silu;

static void silu_item(void *context, int64_t item) {
    Silu *a = context;
    long start = (long)item * a->chunk;
    long length = a->count - start < a->chunk ? a->count - start : a->chunk;
    if (a->path == ES_PATH_AVX512)
        silu_mul_avx512(a->gate + start, a->up + start, a->y + start, length);
    else if (a->path == ES_PATH_AVX2)
        silu_mul_avx2(a->gate + start, a->up + start, a->y + start, length);
    else
        silu_mul_ref(a->gate + start, a->up + start, a->y + start, length);
}

/* gate, up, y: [M, F] contiguous; the M * F elements are independent, so they are cut into equal items
   (a multiple of 16 elements) of at least ES_ROWWISE_ITEM elements. */
void es_silu_mul(int path, int threads, const float *gate, const float *up, float *y, long count) {
    path = es_vector_path(path);
    long items = count / ES_ROWWISE_ITEM > 1 ? count / ES_ROWWISE_ITEM : 1;
    long chunk = ((count + items - 1) / items + 15) & ~15L;
    Silu a = {.path = path, .count = count, .chunk = chunk > 0 ? chunk : 16, .gate = gate, .up = up, .y = y};
    es_run(threads, (count + a.chunk - 1) / a.chunk, silu_item, &a);
}

/* gate_up: [M, 2F] (row m's gate, then its up), y: [M, F]: silu_mul of each row's two halves without
   copying them apart; the items are es_silu_mul's cut of one row, so each element's operations are the same. */
typedef struct {
    int path;
    long F, chunk, per_row;
    const float *gate_up;
    float *y;
} SiluRows;

static void silu_rows_item(void *context, int64_t item) {
    SiluRows *a = context;
    long row = (long)(item / a->per_row), start = (long)(item % a->per_row) * a->chunk;
    long length = a->F - start < a->chunk ? a->F - start : a->chunk;
    Silu one = {.path = a->path,
                .count = length,
                .chunk = length,
                .gate = a->gate_up + (size_t)row * 2 * a->F + start,
                .up = a->gate_up + (size_t)row * 2 * a->F + a->F + start,
                .y = a->y + (size_t)row * a->F + start};
    silu_item(&one, 0);
}

void es_silu_mul_rows(int path, int threads, const float *gate_up, float *y, int M, long F) {
    path = es_vector_path(path);
    long items = F / ES_ROWWISE_ITEM > 1 ? F / ES_ROWWISE_ITEM : 1;
    long chunk = ((F + items - 1) / items + 15) & ~15L;
    SiluRows a = {.path = path, .F = F, .chunk = chunk > 0 ? chunk : 16, .gate_up = gate_up, .y = y};
    a.per_row = (F + a.chunk - 1) / a.chunk;
    es_run(threads, (int64_t)M * a.per_row, silu_rows_item, &a);
}

/* ---------------------------------------------------------------- rotary position embedding

   x: [M, heads, head_size] in place; positions: [M]; cos, sin: [table rows, head_size / 2], row p for
   position p. Elementwise multiplies and adds only: the same bits however the compiler vectorizes. */
typedef struct {
    int M, heads, head_size;
    int64_t rows;
    float *x;
    const int64_t *positions;
    const float *cos_table, *sin_table;
} Rotary;

static void rotary_item(void *context, int64_t item) {
    Rotary *a = context;
    int half = a->head_size / 2;
    int64_t end = (item + 1) * a->rows < a->M ? (item + 1) * a->rows : a->M;
    for (int64_t m = item * a->rows; m < end; m++) {
        const float *c = a->cos_table + (size_t)a->positions[m] * half;
        const float *s = a->sin_table + (size_t)a->positions[m] * half;
        for (int h = 0; h < a->heads; h++) {
            float *x1 = a->x + ((size_t)m * a->heads + h) * a->head_size;
            float *x2 = x1 + half;
            for (int d = 0; d < half; d++) {
                float p = x1[d], q = x2[d];
                x1[d] = p * c[d] - q * s[d];
                x2[d] = q * c[d] + p * s[d];
            }
        }
    }
}

void es_rotary(int threads, float *x, const int64_t *positions, const float *cos_table, const float *sin_table,
               int M, int heads, int head_size) {
    Rotary a = {.M = M,
                .heads = heads,
                .head_size = head_size,
                .rows = rows_per_item((int64_t)heads * head_size),
                .x = x,
                .positions = positions,
                .cos_table = cos_table,
                .sin_table = sin_table};
    es_run(threads, (M + a.rows - 1) / a.rows, rotary_item, &a);
}

/* ---------------------------------------------------------------- exp, element by element (for tests) */

__attribute__((target("avx2,fma"))) static void exp_avx2(const float *x, float *y, long count) {
    long i = 0;
    for (; i + 8 <= count; i += 8) _mm256_storeu_ps(y + i, es_exp_avx2(_mm256_loadu_ps(x + i)));
    for (; i < count; i++) y[i] = es_exp_ref(x[i]);
}

__attribute__((target("avx512f"))) static void exp_avx512(const float *x, float *y, long count) {
    long i = 0;
    for (; i + 16 <= count; i += 16) _mm512_storeu_ps(y + i, es_exp_avx512(_mm512_loadu_ps(x + i)));
    for (; i < count; i++) y[i] = es_exp_ref(x[i]);
}

void es_exp(int path, const float *x, float *y, long count) {
    path = es_vector_path(path);
    if (path == ES_PATH_AVX512)
        exp_avx512(x, y, count);
    else if (path == ES_PATH_AVX2)
        exp_avx2(x, y, count);
    else
        for (long i = 0; i < count; i++) y[i] = es_exp_ref(x[i]);
}
