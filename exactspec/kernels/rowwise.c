/* Row-wise operations of the model's layers (rowwise.py calls these): each row's result depends only on
   that row, by a fixed sequence of float operations that is the same on the three paths (reference, AVX2,
   AVX-512), so the bits do not depend on the number of rows, the thread count or the path.

   rms_norm:  ss = sum_d x_d^2 (16 lanes, fused multiply-adds, the es_sum16 tree, tail elements one by
              one), inv = 1 / sqrtf(ss / D + eps), y_d = (x_d * inv) * w_d: Hugging Face's Qwen2RMSNorm
              order in float32 (x * rsqrt(mean(x^2) + eps), then times the weight), with an exact square
              root and division instead of an approximate reciprocal square root.
   add_rms_norm: residual_d = residual_d + x_d in place, then rms_norm of the new residual.
   silu_mul:  y = (g / (1 + es_exp(-g))) * u, element by element.
   rotary:    x1' = x1 * cos - x2 * sin, x2' = x2 * cos + x1 * sin over the two halves of each head (NeoX
              "rotate_half"), no fused multiply-add: the products and sums Hugging Face's
              q * cos + rotate_half(q) * sin rounds, from a cos/sin table the caller builds.
   Threads split over rows (rms_norm, rotary) or over independent elements (silu_mul); one row's
   reduction is never split. */
#include <omp.h>
#include <stdint.h>

#include "fixed_math.h"

int es_rowwise_best_path(void) { return es_best_path(); }

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

void es_rms_norm(int path, int threads, const float *x, const float *weight, float eps, float *y, int M, int D) {
#pragma omp parallel for num_threads(threads) schedule(static) if (M > 1)
    for (int m = 0; m < M; m++) norm_row(path, x + (size_t)m * D, weight, eps, y + (size_t)m * D, D);
}

void es_add_rms_norm(int path, int threads, const float *x, float *residual, const float *weight, float eps,
                     float *y, int M, int D) {
#pragma omp parallel for num_threads(threads) schedule(static) if (M > 1)
    for (int m = 0; m < M; m++) {
        float *r = residual + (size_t)m * D;
        const float *xr = x + (size_t)m * D;
        for (int d = 0; d < D; d++) r[d] = r[d] + xr[d];
        norm_row(path, r, weight, eps, y + (size_t)m * D, D);
    }
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

#define ES_SILU_CHUNK 2048

/* gate, up, y: [M, F] contiguous; the M * F elements are independent, so they are cut into chunks. */
void es_silu_mul(int path, int threads, const float *gate, const float *up, float *y, long count) {
    long chunks = (count + ES_SILU_CHUNK - 1) / ES_SILU_CHUNK;
#pragma omp parallel for num_threads(threads) schedule(static) if (chunks > 1)
    for (long c = 0; c < chunks; c++) {
        long start = c * ES_SILU_CHUNK;
        long length = count - start < ES_SILU_CHUNK ? count - start : ES_SILU_CHUNK;
        if (path == ES_PATH_AVX512)
            silu_mul_avx512(gate + start, up + start, y + start, length);
        else if (path == ES_PATH_AVX2)
            silu_mul_avx2(gate + start, up + start, y + start, length);
        else
            silu_mul_ref(gate + start, up + start, y + start, length);
    }
}

/* ---------------------------------------------------------------- rotary position embedding

   x: [M, heads, head_size] in place; positions: [M]; cos, sin: [table rows, head_size / 2], row p for
   position p. Elementwise multiplies and adds only: the same bits however the compiler vectorizes. */
void es_rotary(int threads, float *x, const int64_t *positions, const float *cos_table, const float *sin_table,
               int M, int heads, int head_size) {
    int half = head_size / 2;
#pragma omp parallel for num_threads(threads) schedule(static) if (M > 1)
    for (int m = 0; m < M; m++) {
        const float *c = cos_table + (size_t)positions[m] * half;
        const float *s = sin_table + (size_t)positions[m] * half;
        for (int h = 0; h < heads; h++) {
            float *x1 = x + ((size_t)m * heads + h) * head_size;
            float *x2 = x1 + half;
            for (int d = 0; d < half; d++) {
                float a = x1[d], b = x2[d];
                x1[d] = a * c[d] - b * s[d];
                x2[d] = b * c[d] + a * s[d];
            }
        }
    }
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
    if (path == ES_PATH_AVX512)
        exp_avx512(x, y, count);
    else if (path == ES_PATH_AVX2)
        exp_avx2(x, y, count);
    else
        for (long i = 0; i < count; i++) y[i] = es_exp_ref(x[i]);
}
