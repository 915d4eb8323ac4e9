/* Fixed-order float helpers shared by attention.c and rowwise.c.

   Every helper exists once per path (plain C reference, AVX2+FMA, AVX-512F) and performs the same float
   operations in the same order on each, so the three paths give the same bits:

   - es_exp: exp(x) as a fixed sequence of multiplies, adds, fused multiply-adds and integer exponent
     arithmetic (Cody-Waite reduction by ln 2, Cephes' degree-5 polynomial, scaling by 2^n in two halves so
     that results down to the denormals and up to overflow round once). No libm call: its bits would depend
     on the C library and on whether it is vectorized.
   - es_sum16: the sum of 16 lanes by one tree, lane l + lane l+8, then l + l+4, then l + l+2, then 0 + 1.
     A reduction over a row keeps 16 lanes (element d in lane d % 16; AVX2 holds them as two 8-lane
     registers), ends with this tree, and adds any tail elements afterwards one by one.

   The clamps are written as `lo > x ? lo : x` and `hi < x ? hi : x`, the semantics of _mm*_max_ps(lo, x)
   and _mm*_min_ps(hi, x). */
#ifndef EXACTSPEC_FIXED_MATH_H
#define EXACTSPEC_FIXED_MATH_H

#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "dispatch.h" /* ES_PATH_*, es_run */

#define ES_EXP_LO -104.0f /* exp(-104) rounds to 0 in float32 */
#define ES_EXP_HI 89.0f   /* exp(89) overflows to inf */
#define ES_LOG2E 1.44269504088896341f
#define ES_ROUND_MAGIC 12582912.0f /* 1.5 * 2^23: adding and subtracting it rounds to an integer (ties even) */
#define ES_LN2_HI 0.693359375f
#define ES_LN2_LO -2.12194440e-4f
#define ES_P0 1.9875691500e-4f
#define ES_P1 1.3981999507e-3f
#define ES_P2 8.3334519073e-3f
#define ES_P3 4.1665795894e-2f
#define ES_P4 1.6666665459e-1f
#define ES_P5 5.0000001201e-1f


static inline float es_bits_to_float(int32_t bits) {
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* ---------------------------------------------------------------- reference (plain C) */

static inline float es_exp_ref(float x) {
    x = ES_EXP_LO > x ? ES_EXP_LO : x;
    x = ES_EXP_HI < x ? ES_EXP_HI : x;
    float t = x * ES_LOG2E;
    t = t + ES_ROUND_MAGIC;
    float n = t - ES_ROUND_MAGIC;
    float r = fmaf(n, -ES_LN2_HI, x);
    r = fmaf(n, -ES_LN2_LO, r);
    float z = r * r;
    float y = fmaf(ES_P0, r, ES_P1);
    y = fmaf(y, r, ES_P2);
    y = fmaf(y, r, ES_P3);
    y = fmaf(y, r, ES_P4);
    y = fmaf(y, r, ES_P5);
    y = fmaf(y, z, r);
    y = y + 1.0f;
    int32_t ni = (int32_t)n;
    int32_t n1 = ni >> 1;
    int32_t n2 = ni - n1;
    y = y * es_bits_to_float((n1 + 127) << 23);
    y = y * es_bits_to_float((n2 + 127) << 23);
    return y;
}

static inline float es_sum16_ref(const float a[16]) {
    float r8[8], r4[4];
    for (int l = 0; l < 8; l++) r8[l] = a[l] + a[l + 8];
    for (int l = 0; l < 4; l++) r4[l] = r8[l] + r8[l + 4];
    float r2_0 = r4[0] + r4[2];
    float r2_1 = r4[1] + r4[3];
    return r2_0 + r2_1;
}

/* ---------------------------------------------------------------- AVX2 + FMA */

__attribute__((target("avx2,fma"))) static inline __m256 es_exp_avx2(__m256 x) {
    x = _mm256_max_ps(_mm256_set1_ps(ES_EXP_LO), x);
    x = _mm256_min_ps(_mm256_set1_ps(ES_EXP_HI), x);
    __m256 magic = _mm256_set1_ps(ES_ROUND_MAGIC);
    __m256 t = _mm256_mul_ps(x, _mm256_set1_ps(ES_LOG2E));
    t = _mm256_add_ps(t, magic);
    __m256 n = _mm256_sub_ps(t, magic);
    __m256 r = _mm256_fmadd_ps(n, _mm256_set1_ps(-ES_LN2_HI), x);
    r = _mm256_fmadd_ps(n, _mm256_set1_ps(-ES_LN2_LO), r);
    __m256 z = _mm256_mul_ps(r, r);
    __m256 y = _mm256_fmadd_ps(_mm256_set1_ps(ES_P0), r, _mm256_set1_ps(ES_P1));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(ES_P2));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(ES_P3));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(ES_P4));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(ES_P5));
    y = _mm256_fmadd_ps(y, z, r);
    y = _mm256_add_ps(y, _mm256_set1_ps(1.0f));
    __m256i ni = _mm256_cvttps_epi32(n);
    __m256i n1 = _mm256_srai_epi32(ni, 1);
    __m256i n2 = _mm256_sub_epi32(ni, n1);
    __m256i bias = _mm256_set1_epi32(127);
    y = _mm256_mul_ps(y, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n1, bias), 23)));
    y = _mm256_mul_ps(y, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n2, bias), 23)));
    return y;
}

/* lo holds lanes 0-7, hi lanes 8-15. */
__attribute__((target("avx2,fma"))) static inline float es_sum16_avx2(__m256 lo, __m256 hi) {
    __m256 r8 = _mm256_add_ps(lo, hi);
    __m128 r4 = _mm_add_ps(_mm256_castps256_ps128(r8), _mm256_extractf128_ps(r8, 1));
    __m128 r2 = _mm_add_ps(r4, _mm_movehl_ps(r4, r4));
    __m128 r1 = _mm_add_ss(r2, _mm_shuffle_ps(r2, r2, 1));
    return _mm_cvtss_f32(r1);
}

/* ---------------------------------------------------------------- AVX-512F */

__attribute__((target("avx512f"))) static inline __m512 es_exp_avx512(__m512 x) {
    x = _mm512_max_ps(_mm512_set1_ps(ES_EXP_LO), x);
    x = _mm512_min_ps(_mm512_set1_ps(ES_EXP_HI), x);
    __m512 magic = _mm512_set1_ps(ES_ROUND_MAGIC);
    __m512 t = _mm512_mul_ps(x, _mm512_set1_ps(ES_LOG2E));
    t = _mm512_add_ps(t, magic);
    __m512 n = _mm512_sub_ps(t, magic);
    __m512 r = _mm512_fmadd_ps(n, _mm512_set1_ps(-ES_LN2_HI), x);
    r = _mm512_fmadd_ps(n, _mm512_set1_ps(-ES_LN2_LO), r);
    __m512 z = _mm512_mul_ps(r, r);
    __m512 y = _mm512_fmadd_ps(_mm512_set1_ps(ES_P0), r, _mm512_set1_ps(ES_P1));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(ES_P2));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(ES_P3));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(ES_P4));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(ES_P5));
    y = _mm512_fmadd_ps(y, z, r);
    y = _mm512_add_ps(y, _mm512_set1_ps(1.0f));
    __m512i ni = _mm512_cvttps_epi32(n);
    __m512i n1 = _mm512_srai_epi32(ni, 1);
    __m512i n2 = _mm512_sub_epi32(ni, n1);
    __m512i bias = _mm512_set1_epi32(127);
    y = _mm512_mul_ps(y, _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(n1, bias), 23)));
    y = _mm512_mul_ps(y, _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(n2, bias), 23)));
    return y;
}

__attribute__((target("avx512f"))) static inline float es_sum16_avx512(__m512 a) {
    __m256 lo = _mm512_castps512_ps256(a);
    __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1));
    __m256 r8 = _mm256_add_ps(lo, hi);
    __m128 r4 = _mm_add_ps(_mm256_castps256_ps128(r8), _mm256_extractf128_ps(r8, 1));
    __m128 r2 = _mm_add_ps(r4, _mm_movehl_ps(r4, r4));
    __m128 r1 = _mm_add_ss(r2, _mm_shuffle_ps(r2, r2, 1));
    return _mm_cvtss_f32(r1);
}

#endif
