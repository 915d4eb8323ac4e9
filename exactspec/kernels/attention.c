/* Attention of a few queries over their own cells of a KV cache (attention.py calls es_attend).

   Cache layout, per layer: keys and values each [slots, kv_heads, capacity, head_size] float32, so one
   (slot, KV head) is a contiguous run of cells.

   Each (query, head) pair is done by one thread from start to end, over its query's own cell list
   (increasing cell ids) in list order (a work item is one query's heads that share a KV head, or a part
   of them when there are few queries and many threads; see attend_group):
     s_j = dot(q, k_j) * scale      dot: 16 lanes (element d in lane d % 16, fused multiply-add), the
                                    es_sum16 tree, then the tail elements d >= head_size & ~15 one by one
     m   = max_j s_j
     e_j = es_exp(s_j - m)
     den = sum_j e_j                16 lanes (cell j in lane j % 16, the list padded with zeros to a
                                    multiple of 16), then the es_sum16 tree
     out = (sum_j e_j * v_j) / den  per element d, fused multiply-adds in list order, then one division
   Nothing in that sequence reads another query, the number of queries or the number of threads, so a
   query's output has the same bits alone, among others, in any order and on any thread count; and the
   three paths (reference, AVX2, AVX-512) perform the same operations, so they agree bit for bit too. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>

#include "attention.h"
#include "fixed_math.h"

/* Below this many multiply-adds (cells x heads x head_size, over all queries) a call runs on the calling
   thread alone: handing work to the pool costs a few microseconds, what such a call takes in all. */
#define ES_ATTN_SMALL 65536

/* ---------------------------------------------------------------- scores: s_j = dot(q, k_j) * scale */

static void scores_ref(const float *q, const float *keys, const int32_t *cells, int length, int head_size,
                       float scale, float *s) {
    int body = head_size & ~15;
    for (int j = 0; j < length; j++) {
        const float *k = keys + (size_t)cells[j] * head_size;
        float lanes[16] = {0};
        for (int d = 0; d < body; d += 16)
            for (int l = 0; l < 16; l++) lanes[l] = fmaf(q[d + l], k[d + l], lanes[l]);
        float dot = es_sum16_ref(lanes);
        for (int d = body; d < head_size; d++) dot = fmaf(q[d], k[d], dot);
        s[j] = dot * scale;
    }
}

__attribute__((target("avx2,fma"))) static void scores_avx2(const float *q, const float *keys,
                                                            const int32_t *cells, int length, int head_size,
                                                            float scale, float *s) {
    int body = head_size & ~15;
    int j = 0;
    for (; j + 2 <= length; j += 2) { /* two cells at a time: independent chains */
        const float *k0 = keys + (size_t)cells[j] * head_size;
        const float *k1 = keys + (size_t)cells[j + 1] * head_size;
        __m256 a0 = _mm256_setzero_ps(), b0 = _mm256_setzero_ps();
        __m256 a1 = _mm256_setzero_ps(), b1 = _mm256_setzero_ps();
        for (int d = 0; d < body; d += 16) {
            __m256 qa = _mm256_loadu_ps(q + d), qb = _mm256_loadu_ps(q + d + 8);
            a0 = _mm256_fmadd_ps(qa, _mm256_loadu_ps(k0 + d), a0);
            b0 = _mm256_fmadd_ps(qb, _mm256_loadu_ps(k0 + d + 8), b0);
            a1 = _mm256_fmadd_ps(qa, _mm256_loadu_ps(k1 + d), a1);
            b1 = _mm256_fmadd_ps(qb, _mm256_loadu_ps(k1 + d + 8), b1);
        }
        float dot0 = es_sum16_avx2(a0, b0), dot1 = es_sum16_avx2(a1, b1);
        for (int d = body; d < head_size; d++) {
            dot0 = fmaf(q[d], k0[d], dot0);
            dot1 = fmaf(q[d], k1[d], dot1);
        }
        s[j] = dot0 * scale;
        s[j + 1] = dot1 * scale;
    }
    for (; j < length; j++) {
        const float *k0 = keys + (size_t)cells[j] * head_size;
        __m256 a0 = _mm256_setzero_ps(), b0 = _mm256_setzero_ps();
        for (int d = 0; d < body; d += 16) {
            a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + d), _mm256_loadu_ps(k0 + d), a0);
            b0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + d + 8), _mm256_loadu_ps(k0 + d + 8), b0);
        }
        float dot0 = es_sum16_avx2(a0, b0);
        for (int d = body; d < head_size; d++) dot0 = fmaf(q[d], k0[d], dot0);
        s[j] = dot0 * scale;
    }
}

__attribute__((target("avx512f"))) static void scores_avx512(const float *q, const float *keys,
                                                             const int32_t *cells, int length, int head_size,
                                                             float scale, float *s) {
    int body = head_size & ~15;
    int j = 0;
    for (; j + 4 <= length; j += 4) { /* four cells at a time: independent chains */
        const float *k0 = keys + (size_t)cells[j] * head_size;
        const float *k1 = keys + (size_t)cells[j + 1] * head_size;
        const float *k2 = keys + (size_t)cells[j + 2] * head_size;
        const float *k3 = keys + (size_t)cells[j + 3] * head_size;
        __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
        __m512 a2 = _mm512_setzero_ps(), a3 = _mm512_setzero_ps();
        for (int d = 0; d < body; d += 16) {
            __m512 qv = _mm512_loadu_ps(q + d);
            a0 = _mm512_fmadd_ps(qv, _mm512_loadu_ps(k0 + d), a0);
            a1 = _mm512_fmadd_ps(qv, _mm512_loadu_ps(k1 + d), a1);
            a2 = _mm512_fmadd_ps(qv, _mm512_loadu_ps(k2 + d), a2);
            a3 = _mm512_fmadd_ps(qv, _mm512_loadu_ps(k3 + d), a3);
        }
        float dot0 = es_sum16_avx512(a0), dot1 = es_sum16_avx512(a1);
        float dot2 = es_sum16_avx512(a2), dot3 = es_sum16_avx512(a3);
        for (int d = body; d < head_size; d++) {
            dot0 = fmaf(q[d], k0[d], dot0);
            dot1 = fmaf(q[d], k1[d], dot1);
            dot2 = fmaf(q[d], k2[d], dot2);
            dot3 = fmaf(q[d], k3[d], dot3);
        }
        s[j] = dot0 * scale;
        s[j + 1] = dot1 * scale;
        s[j + 2] = dot2 * scale;
        s[j + 3] = dot3 * scale;
    }
    for (; j < length; j++) {
        const float *k0 = keys + (size_t)cells[j] * head_size;
        __m512 a0 = _mm512_setzero_ps();
        for (int d = 0; d < body; d += 16) a0 = _mm512_fmadd_ps(_mm512_loadu_ps(q + d), _mm512_loadu_ps(k0 + d), a0);
        float dot0 = es_sum16_avx512(a0);
        for (int d = body; d < head_size; d++) dot0 = fmaf(q[d], k0[d], dot0);
        s[j] = dot0 * scale;
    }
}

/* ---------------------------------------------------------------- softmax weights: e_j, den
   s holds `padded` = length rounded up to 16 entries, the pad set to -inf (exp gives exactly 0 there);
   e_j overwrites s_j. Returns den. */

/* The maximum is the same number in any order (scores are not NaN; +0 and -0 give the same weights), so the
   vector paths take it lane-wise. */
static float max_ref(const float *s, int length) {
    float m = s[0];
    for (int j = 1; j < length; j++) m = s[j] > m ? s[j] : m;
    return m;
}

__attribute__((target("avx2,fma"))) static float max_avx2(const float *s, int length) {
    int j = 0;
    float m = s[0];
    if (length >= 8) {
        __m256 mv = _mm256_loadu_ps(s);
        for (j = 8; j + 8 <= length; j += 8) mv = _mm256_max_ps(mv, _mm256_loadu_ps(s + j));
        float lanes[8];
        _mm256_storeu_ps(lanes, mv);
        m = max_ref(lanes, 8);
    }
    for (; j < length; j++) m = s[j] > m ? s[j] : m;
    return m;
}

__attribute__((target("avx512f"))) static float max_avx512(const float *s, int length) {
    int j = 0;
    float m = s[0];
    if (length >= 16) {
        __m512 mv = _mm512_loadu_ps(s);
        for (j = 16; j + 16 <= length; j += 16) mv = _mm512_max_ps(mv, _mm512_loadu_ps(s + j));
        float lanes[16];
        _mm512_storeu_ps(lanes, mv);
        m = max_ref(lanes, 16);
    }
    for (; j < length; j++) m = s[j] > m ? s[j] : m;
    return m;
}

static float weights_ref(float *s, int padded, float m) {
    float lanes[16] = {0};
    for (int j = 0; j < padded; j += 16)
        for (int l = 0; l < 16; l++) {
            float e = es_exp_ref(s[j + l] - m);
            s[j + l] = e;
            lanes[l] = lanes[l] + e;
        }
    return es_sum16_ref(lanes);
}

__attribute__((target("avx2,fma"))) static float weights_avx2(float *s, int padded, float m) {
    __m256 mv = _mm256_set1_ps(m);
    __m256 lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps();
    for (int j = 0; j < padded; j += 16) {
        __m256 e0 = es_exp_avx2(_mm256_sub_ps(_mm256_loadu_ps(s + j), mv));
        __m256 e1 = es_exp_avx2(_mm256_sub_ps(_mm256_loadu_ps(s + j + 8), mv));
        _mm256_storeu_ps(s + j, e0);
        _mm256_storeu_ps(s + j + 8, e1);
        lo = _mm256_add_ps(lo, e0);
        hi = _mm256_add_ps(hi, e1);
    }
    return es_sum16_avx2(lo, hi);
}

__attribute__((target("avx512f"))) static float weights_avx512(float *s, int padded, float m) {
    __m512 mv = _mm512_set1_ps(m);
    __m512 acc = _mm512_setzero_ps();
    for (int j = 0; j < padded; j += 16) {
        __m512 e = es_exp_avx512(_mm512_sub_ps(_mm512_loadu_ps(s + j), mv));
        _mm512_storeu_ps(s + j, e);
        acc = _mm512_add_ps(acc, e);
    }
    return es_sum16_avx512(acc);
}

/* ---------------------------------------------------------------- acc += sum_j e_j v_j
   acc (head_size floats) carries the sums from one block of cells to the next: storing and reloading a
   float is exact, so the per-element chain of fused multiply-adds over the list is the same however the
   list is cut into blocks. */

static void mix_ref(const float *e, const float *values, const int32_t *cells, int length, int head_size,
                    float *acc) {
    for (int j = 0; j < length; j++) {
        const float *v = values + (size_t)cells[j] * head_size;
        for (int d = 0; d < head_size; d++) acc[d] = fmaf(e[j], v[d], acc[d]);
    }
}

__attribute__((target("avx2,fma"))) static void mix_avx2(const float *e, const float *values,
                                                         const int32_t *cells, int length, int head_size,
                                                         float *acc) {
    int d = 0;
    for (; d + 64 <= head_size; d += 64) { /* eight accumulators: eight independent chains over j */
        __m256 c0 = _mm256_loadu_ps(acc + d), c1 = _mm256_loadu_ps(acc + d + 8);
        __m256 c2 = _mm256_loadu_ps(acc + d + 16), c3 = _mm256_loadu_ps(acc + d + 24);
        __m256 c4 = _mm256_loadu_ps(acc + d + 32), c5 = _mm256_loadu_ps(acc + d + 40);
        __m256 c6 = _mm256_loadu_ps(acc + d + 48), c7 = _mm256_loadu_ps(acc + d + 56);
        for (int j = 0; j < length; j++) {
            const float *v = values + (size_t)cells[j] * head_size + d;
            __m256 w = _mm256_set1_ps(e[j]);
            c0 = _mm256_fmadd_ps(w, _mm256_loadu_ps(v), c0);
            c1 = _mm256_fmadd_ps(w, _mm256_loadu_ps(v + 8), c1);
            c2 = _mm256_fmadd_ps(w, _mm256_loadu_ps(v + 16), c2);
            c3 = _mm256_fmadd_ps(w, _mm256_loadu_ps(v + 24), c3);
            c4 = _mm256_fmadd_ps(w, _mm256_loadu_ps(v + 32), c4);
            c5 = _mm256_fmadd_ps(w, _mm256_loadu_ps(v + 40), c5);
            c6 = _mm256_fmadd_ps(w, _mm256_loadu_ps(v + 48), c6);
            c7 = _mm256_fmadd_ps(w, _mm256_loadu_ps(v + 56), c7);
        }
        _mm256_storeu_ps(acc + d, c0);
        _mm256_storeu_ps(acc + d + 8, c1);
        _mm256_storeu_ps(acc + d + 16, c2);
        _mm256_storeu_ps(acc + d + 24, c3);
        _mm256_storeu_ps(acc + d + 32, c4);
        _mm256_storeu_ps(acc + d + 40, c5);
        _mm256_storeu_ps(acc + d + 48, c6);
        _mm256_storeu_ps(acc + d + 56, c7);
    }
    for (; d + 8 <= head_size; d += 8) {
        __m256 c0 = _mm256_loadu_ps(acc + d);
        for (int j = 0; j < length; j++)
            c0 = _mm256_fmadd_ps(_mm256_set1_ps(e[j]), _mm256_loadu_ps(values + (size_t)cells[j] * head_size + d), c0);
        _mm256_storeu_ps(acc + d, c0);
    }
    for (; d < head_size; d++) {
        float c = acc[d];
        for (int j = 0; j < length; j++) c = fmaf(e[j], values[(size_t)cells[j] * head_size + d], c);
        acc[d] = c;
    }
}

__attribute__((target("avx512f"))) static void mix_avx512(const float *e, const float *values,
                                                          const int32_t *cells, int length, int head_size,
                                                          float *acc) {
    int d = 0;
    for (; d + 128 <= head_size; d += 128) { /* eight accumulators: eight independent chains over j */
        __m512 c0 = _mm512_loadu_ps(acc + d), c1 = _mm512_loadu_ps(acc + d + 16);
        __m512 c2 = _mm512_loadu_ps(acc + d + 32), c3 = _mm512_loadu_ps(acc + d + 48);
        __m512 c4 = _mm512_loadu_ps(acc + d + 64), c5 = _mm512_loadu_ps(acc + d + 80);
        __m512 c6 = _mm512_loadu_ps(acc + d + 96), c7 = _mm512_loadu_ps(acc + d + 112);
        for (int j = 0; j < length; j++) {
            const float *v = values + (size_t)cells[j] * head_size + d;
            __m512 w = _mm512_set1_ps(e[j]);
            c0 = _mm512_fmadd_ps(w, _mm512_loadu_ps(v), c0);
            c1 = _mm512_fmadd_ps(w, _mm512_loadu_ps(v + 16), c1);
            c2 = _mm512_fmadd_ps(w, _mm512_loadu_ps(v + 32), c2);
            c3 = _mm512_fmadd_ps(w, _mm512_loadu_ps(v + 48), c3);
            c4 = _mm512_fmadd_ps(w, _mm512_loadu_ps(v + 64), c4);
            c5 = _mm512_fmadd_ps(w, _mm512_loadu_ps(v + 80), c5);
            c6 = _mm512_fmadd_ps(w, _mm512_loadu_ps(v + 96), c6);
            c7 = _mm512_fmadd_ps(w, _mm512_loadu_ps(v + 112), c7);
        }
        _mm512_storeu_ps(acc + d, c0);
        _mm512_storeu_ps(acc + d + 16, c1);
        _mm512_storeu_ps(acc + d + 32, c2);
        _mm512_storeu_ps(acc + d + 48, c3);
        _mm512_storeu_ps(acc + d + 64, c4);
        _mm512_storeu_ps(acc + d + 80, c5);
        _mm512_storeu_ps(acc + d + 96, c6);
        _mm512_storeu_ps(acc + d + 112, c7);
    }
    for (; d + 16 <= head_size; d += 16) {
        __m512 c0 = _mm512_loadu_ps(acc + d);
        for (int j = 0; j < length; j++)
            c0 = _mm512_fmadd_ps(_mm512_set1_ps(e[j]), _mm512_loadu_ps(values + (size_t)cells[j] * head_size + d), c0);
        _mm512_storeu_ps(acc + d, c0);
    }
    for (; d < head_size; d++) {
        float c = acc[d];
        for (int j = 0; j < length; j++) c = fmaf(e[j], values[(size_t)cells[j] * head_size + d], c);
        acc[d] = c;
    }
}

/* Three heads at once (their weights e0, e1, e2, accumulators a0, a1, a2), each value vector loaded once
   for the three: per element the same chain of fused multiply-adds as mix_avx512 / mix_avx2. Needs
   head_size a multiple of 128 (AVX-512) or 32 (AVX2). */
#define ES_MIX3_STEP(VEC, FMA, LOAD, SET1, W, OFF)                                                         \
    do {                                                                                                   \
        VEC v0 = LOAD(v + (OFF)), v1 = LOAD(v + (OFF) + W), v2 = LOAD(v + (OFF) + 2 * W);                 \
        VEC v3 = LOAD(v + (OFF) + 3 * W);                                                                  \
        x0 = FMA(w0, v0, x0), x1 = FMA(w0, v1, x1), x2 = FMA(w0, v2, x2), x3 = FMA(w0, v3, x3);          \
        y0 = FMA(w1, v0, y0), y1 = FMA(w1, v1, y1), y2 = FMA(w1, v2, y2), y3 = FMA(w1, v3, y3);          \
        z0 = FMA(w2, v0, z0), z1 = FMA(w2, v1, z1), z2 = FMA(w2, v2, z2), z3 = FMA(w2, v3, z3);          \
    } while (0)

__attribute__((target("avx512f"))) static void mix3_avx512(const float *e0, const float *e1, const float *e2,
                                                           const float *values, const int32_t *cells,
                                                           int length, int head_size, float *a0, float *a1,
                                                           float *a2) {
    for (int d = 0; d < head_size; d += 64) {
        __m512 x0 = _mm512_loadu_ps(a0 + d), x1 = _mm512_loadu_ps(a0 + d + 16);
        __m512 x2 = _mm512_loadu_ps(a0 + d + 32), x3 = _mm512_loadu_ps(a0 + d + 48);
        __m512 y0 = _mm512_loadu_ps(a1 + d), y1 = _mm512_loadu_ps(a1 + d + 16);
        __m512 y2 = _mm512_loadu_ps(a1 + d + 32), y3 = _mm512_loadu_ps(a1 + d + 48);
        __m512 z0 = _mm512_loadu_ps(a2 + d), z1 = _mm512_loadu_ps(a2 + d + 16);
        __m512 z2 = _mm512_loadu_ps(a2 + d + 32), z3 = _mm512_loadu_ps(a2 + d + 48);
        for (int j = 0; j < length; j++) {
            const float *v = values + (size_t)cells[j] * head_size + d;
            __m512 w0 = _mm512_set1_ps(e0[j]), w1 = _mm512_set1_ps(e1[j]), w2 = _mm512_set1_ps(e2[j]);
            ES_MIX3_STEP(__m512, _mm512_fmadd_ps, _mm512_loadu_ps, _mm512_set1_ps, 16, 0);
        }
        _mm512_storeu_ps(a0 + d, x0), _mm512_storeu_ps(a0 + d + 16, x1);
        _mm512_storeu_ps(a0 + d + 32, x2), _mm512_storeu_ps(a0 + d + 48, x3);
        _mm512_storeu_ps(a1 + d, y0), _mm512_storeu_ps(a1 + d + 16, y1);
        _mm512_storeu_ps(a1 + d + 32, y2), _mm512_storeu_ps(a1 + d + 48, y3);
        _mm512_storeu_ps(a2 + d, z0), _mm512_storeu_ps(a2 + d + 16, z1);
        _mm512_storeu_ps(a2 + d + 32, z2), _mm512_storeu_ps(a2 + d + 48, z3);
    }
}

__attribute__((target("avx2,fma"))) static void mix3_avx2(const float *e0, const float *e1, const float *e2,
                                                          const float *values, const int32_t *cells, int length,
                                                          int head_size, float *a0, float *a1, float *a2) {
    for (int d = 0; d < head_size; d += 32) {
        __m256 x0 = _mm256_loadu_ps(a0 + d), x1 = _mm256_loadu_ps(a0 + d + 8);
        __m256 x2 = _mm256_loadu_ps(a0 + d + 16), x3 = _mm256_loadu_ps(a0 + d + 24);
        __m256 y0 = _mm256_loadu_ps(a1 + d), y1 = _mm256_loadu_ps(a1 + d + 8);
        __m256 y2 = _mm256_loadu_ps(a1 + d + 16), y3 = _mm256_loadu_ps(a1 + d + 24);
        __m256 z0 = _mm256_loadu_ps(a2 + d), z1 = _mm256_loadu_ps(a2 + d + 8);
        __m256 z2 = _mm256_loadu_ps(a2 + d + 16), z3 = _mm256_loadu_ps(a2 + d + 24);
        for (int j = 0; j < length; j++) {
            const float *v = values + (size_t)cells[j] * head_size + d;
            __m256 w0 = _mm256_set1_ps(e0[j]), w1 = _mm256_set1_ps(e1[j]), w2 = _mm256_set1_ps(e2[j]);
            ES_MIX3_STEP(__m256, _mm256_fmadd_ps, _mm256_loadu_ps, _mm256_set1_ps, 8, 0);
        }
        _mm256_storeu_ps(a0 + d, x0), _mm256_storeu_ps(a0 + d + 8, x1);
        _mm256_storeu_ps(a0 + d + 16, x2), _mm256_storeu_ps(a0 + d + 24, x3);
        _mm256_storeu_ps(a1 + d, y0), _mm256_storeu_ps(a1 + d + 8, y1);
        _mm256_storeu_ps(a1 + d + 16, y2), _mm256_storeu_ps(a1 + d + 24, y3);
        _mm256_storeu_ps(a2 + d, z0), _mm256_storeu_ps(a2 + d + 8, z1);
        _mm256_storeu_ps(a2 + d + 16, z2), _mm256_storeu_ps(a2 + d + 24, z3);
    }
}

/* ---------------------------------------------------------------- a group of heads of one query

   The `count` query heads h0 .. h0+count-1 of one query that read the same KV head. Each head's
   operations are exactly those of the header; the group only changes which memory is warm: the cells
   are taken in blocks small enough to stay in L1, and every head of the group runs over a block before
   the next block is read, so a block of keys (then of values) comes from memory once for the group.
   How many heads share a work item (es_attend picks it from the thread count) therefore changes the
   time, never the bits. */

static void scores_path(int path, const float *q, const float *keys, const int32_t *cells, int length,
                        int head_size, float scale, float *s) {
    if (path == ES_PATH_AVX512)
        scores_avx512(q, keys, cells, length, head_size, scale, s);
    else if (path == ES_PATH_AVX2)
        scores_avx2(q, keys, cells, length, head_size, scale, s);
    else
        scores_ref(q, keys, cells, length, head_size, scale, s);
}

static void mix_path(int path, const float *e, const float *values, const int32_t *cells, int length,
                     int head_size, float *acc) {
    if (path == ES_PATH_AVX512)
        mix_avx512(e, values, cells, length, head_size, acc);
    else if (path == ES_PATH_AVX2)
        mix_avx2(e, values, cells, length, head_size, acc);
    else
        mix_ref(e, values, cells, length, head_size, acc);
}

static void attend_group(int path, const float *q, int count, const float *keys, const float *values,
                         const int32_t *cells, int length, int head_size, float scale, float *scratch,
                         size_t stride, float *out) {
    if (length == 0) {
        for (size_t x = 0; x < (size_t)count * head_size; x++) out[x] = 0.0f;
        return;
    }
    int padded = (length + 15) & ~15;
    int block = 32768 / (int)(sizeof(float) * head_size); /* cells per block: 32 KB of keys */
    block = block < 16 ? 16 : block;
    for (int j0 = 0; j0 < length; j0 += block) {
        int n = length - j0 < block ? length - j0 : block;
        for (int b = 0; b < count; b++)
            scores_path(path, q + (size_t)b * head_size, keys, cells + j0, n, head_size, scale,
                        scratch + b * stride + j0);
    }
    for (int b = 0; b < count; b++) {
        float *s = scratch + b * stride;
        float m = path == ES_PATH_AVX512 ? max_avx512(s, length)
                  : path == ES_PATH_AVX2   ? max_avx2(s, length)
                                           : max_ref(s, length);
        for (int j = length; j < padded; j++) s[j] = -INFINITY;
        float den = path == ES_PATH_AVX512 ? weights_avx512(s, padded, m)
                    : path == ES_PATH_AVX2 ? weights_avx2(s, padded, m)
                                           : weights_ref(s, padded, m);
        s[padded] = den; /* kept beside the weights until the division */
        for (int d = 0; d < head_size; d++) out[(size_t)b * head_size + d] = 0.0f;
    }
    for (int j0 = 0; j0 < length; j0 += block) {
        int n = length - j0 < block ? length - j0 : block;
        int b = 0;
        int triples = (path == ES_PATH_AVX512 && head_size % 64 == 0) || (path == ES_PATH_AVX2 && head_size % 32 == 0);
        for (; triples && b + 3 <= count; b += 3) {
            const float *e = scratch + b * stride + j0;
            float *o = out + (size_t)b * head_size;
            if (path == ES_PATH_AVX512)
                mix3_avx512(e, e + stride, e + 2 * stride, values, cells + j0, n, head_size, o, o + head_size,
                            o + 2 * head_size);
            else
                mix3_avx2(e, e + stride, e + 2 * stride, values, cells + j0, n, head_size, o, o + head_size,
                          o + 2 * head_size);
        }
        for (; b < count; b++)
            mix_path(path, scratch + b * stride + j0, values, cells + j0, n, head_size, out + (size_t)b * head_size);
    }
    for (int b = 0; b < count; b++) {
        float den = scratch[b * stride + padded];
        float *o = out + (size_t)b * head_size;
        for (int d = 0; d < head_size; d++) o[d] = o[d] / den;
    }
}

static int check_cells(const int32_t *cells, int length, int capacity) {
    for (int j = 0; j < length; j++) {
        if (cells[j] < 0 || cells[j] >= capacity) return ES_ATTN_ERROR_CELL;
        if (j > 0 && cells[j] <= cells[j - 1]) return ES_ATTN_ERROR_ORDER;
    }
    return 0;
}

/* A thread's score buffer, kept between calls (pool workers live as long as the process; a caller thread's
   buffer is freed when it exits). */
typedef struct {
    size_t floats;
    float *data;
} Scratch;

static pthread_key_t scratch_key;
static pthread_once_t scratch_once = PTHREAD_ONCE_INIT;

static void scratch_free(void *p) {
    Scratch *scratch = p;
    free(scratch->data);
    free(scratch);
}

static void scratch_key_make(void) { pthread_key_create(&scratch_key, scratch_free); }

/* This thread's buffer of at least `floats` floats (64-byte aligned), or NULL when out of memory. */
static float *thread_scratch(size_t floats) {
    pthread_once(&scratch_once, scratch_key_make);
    Scratch *scratch = pthread_getspecific(scratch_key);
    if (scratch == NULL) {
        scratch = calloc(1, sizeof *scratch);
        if (scratch == NULL || pthread_setspecific(scratch_key, scratch) != 0) {
            free(scratch);
            return NULL;
        }
    }
    if (scratch->floats < floats) {
        free(scratch->data);
        scratch->data = aligned_alloc(64, (floats * sizeof(float) + 63) & ~(size_t)63);
        scratch->floats = scratch->data == NULL ? 0 : floats;
    }
    return scratch->data;
}

/* One call's arguments, for its work items (attend_item). */
typedef struct {
    int path, kv_heads, group, per_item, splits, head_size;
    const float *keys, *values, *queries;
    int heads;
    const int32_t *query_slots, *offsets, *cells;
    float scale;
    float *out;
    size_t stride, cell_stride;
    atomic_int failed;
} Attend;

/* Work item w: query w / (kv_heads * splits), one KV head's query heads (or a part of them). */
static void attend_item(void *context, int64_t w) {
    Attend *a = context;
    float *scratch = thread_scratch(a->stride * a->per_item);
    if (scratch == NULL) {
        atomic_store(&a->failed, 1);
        return;
    }
    int i = (int)(w / ((int64_t)a->kv_heads * a->splits));
    int rest = (int)(w % ((int64_t)a->kv_heads * a->splits));
    int kv = rest / a->splits, h0 = kv * a->group + (rest % a->splits) * a->per_item;
    int count = kv * a->group + a->group - h0 < a->per_item ? kv * a->group + a->group - h0 : a->per_item;
    size_t base = ((size_t)a->query_slots[i] * a->kv_heads + (size_t)kv) * a->cell_stride;
    size_t first = ((size_t)i * a->heads + h0) * a->head_size;
    attend_group(a->path, a->queries + first, count, a->keys + base, a->values + base,
                 a->cells + a->offsets[i], a->offsets[i + 1] - a->offsets[i], a->head_size, a->scale, scratch,
                 a->stride, a->out + first);
}

/* keys, values: one layer of the cache, [slots, kv_heads, capacity, head_size].
   queries, out: [n, heads, head_size]. query_slots: [n]. offsets: [n + 1]; query i's cells are
   cells[offsets[i] .. offsets[i + 1]). Returns 0, or an ES_ATTN_ERROR_* code (nothing then is promised
   about out). */
int es_attend(int path, int threads, const float *keys, const float *values, int slots, int kv_heads, int capacity,
              int head_size, const float *queries, int n, int heads, const int32_t *query_slots,
              const int32_t *offsets, const int32_t *cells, float scale, float *out) {
    if (path < 0 || path >= ES_PATH_COUNT || !(es_cpu_paths() & (1 << path))) return ES_ATTN_ERROR_PATH;
    path = es_vector_path(path);
    int group = heads / kv_heads;
    int longest = 0;
    int64_t total = 0;
    for (int i = 0; i < n; i++) {
        if (query_slots[i] < 0 || query_slots[i] >= slots) return ES_ATTN_ERROR_SLOT;
        int length = offsets[i + 1] - offsets[i];
        if (length < 0) return ES_ATTN_ERROR_ORDER;
        int error = check_cells(cells + offsets[i], length, capacity);
        if (error) return error;
        longest = length > longest ? length : longest;
        total += length;
    }
    if (total * heads * head_size < ES_ATTN_SMALL) threads = 1;
    /* Heads per work item: the whole group when there are enough (query, KV head) pairs to keep every
       thread busy, else fewer, down to one head per item. */
    int per_item = group;
    while (per_item > 1 && (long)n * kv_heads * ((group + per_item - 1) / per_item) < threads) per_item--;
    Attend a = {.path = path,
                .kv_heads = kv_heads,
                .group = group,
                .per_item = per_item,
                .splits = (group + per_item - 1) / per_item,
                .head_size = head_size,
                .keys = keys,
                .values = values,
                .queries = queries,
                .heads = heads,
                .query_slots = query_slots,
                .offsets = offsets,
                .cells = cells,
                .scale = scale,
                .out = out,
                .stride = (size_t)((longest + 15) & ~15) + 16, /* a head's scores, then its denominator */
                .cell_stride = (size_t)capacity * head_size};
    atomic_init(&a.failed, 0);
    es_run(threads, (int64_t)n * kv_heads * a.splits, attend_item, &a);
    return atomic_load(&a.failed) ? ES_ATTN_ERROR_MEMORY : 0;
}
