/* int4 weights times a few float32 rows, each row's bits independent of the others (README.md).
 *
 * The definition, for row r and column n, with the K axis cut into blocks b of `block` values:
 *   activations: sa = max|x[r, block b]| / 127, qa = round-half-even(x * (1 / sa)) in -127..127,
 *                asum = sum of qa over the block (all zeros when sa is 0 or not a normal float);
 *   t_b  = sum_k q[n, k] * qa[r, k] - z[n, b] * asum[r, b]     (exact int32)
 *   acc  = fmaf((float)t_b, s[n, b] * sa[r, b], acc)            (b increasing, acc from 0.0f)
 *   out  = acc (+ bias[n], one float add).
 * Every path performs exactly these float operations in this order for every (r, n), so the paths, the
 * row count, the row's place, the thread count and the tiling cannot change a bit.
 *
 * Packed weights (int4.py builds them): N padded to tiles of 16 columns, K to whole blocks. For tile t
 * and block b, `weights` holds 8 * block bytes at ((t * nb + b) * 8 * block): chunk c (64 bytes, c <
 * block / 8) covers the block's K offsets 8c..8c+7; its byte 4j + i holds column j's value at offset
 * 8c + i in the low nibble and at 8c + 4 + i in the high nibble. So a 32-bit lane j holds 4 consecutive
 * K values of column j, what an u8 x s8 -> s32 dot product of 4 wants. `scales` holds 16 floats and
 * `zeros` 16 bytes per (t, b), in the same order.
 */
#include "matmul_int4.h"

#include <float.h>
#include <immintrin.h>
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#define ES_ROWS 16 /* rows per pass over a tile: all of a call's rows when it has at most 16 */
#ifndef ES_PREFETCH
#define ES_PREFETCH 4096 /* bytes ahead of the weights being read that are asked for */
#endif
/* Where a product of R rows asks for the weights ahead: one or two rows stream best with lines asked for
 * into L1 4 KB ahead; from 3 rows on, the arithmetic between the loads leaves time to ask 8 KB ahead, into
 * L2 (README.md, Loop order, has the measurements). Only the timing of loads changes, never an operation.
 * R is a constant once inlined. */
#define ES_PREFETCH_ROWS(R, p)                                              \
    do {                                                                    \
        if ((R) <= 2)                                                       \
            _mm_prefetch((const char *)(p) + ES_PREFETCH, _MM_HINT_T0);     \
        else                                                                \
            _mm_prefetch((const char *)(p) + 2 * ES_PREFETCH, _MM_HINT_T1); \
    } while (0)

/* Quantized activations of a call: qa [M][kp] int8, sa [M][nb], asum [M][nb] (and as floats, exact). */
typedef struct {
    int8_t *qa;
    float *sa;
    int32_t *asum;
    float *asumf;
    int64_t kp, nb;
} acts_t;

/* The scale of a block whose largest magnitude is amax, and its inverse; 0 when the block quantizes to
 * zeros (amax 0, or a scale that is not a normal float, whose inverse could overflow). */
static inline void block_scale(float amax, float *sa, float *inv) {
    float s = amax / 127.0f;
    if (!(s >= FLT_MIN) || !(s <= FLT_MAX)) {
        *sa = 0.0f;
        *inv = 0.0f;
        return;
    }
    *sa = s;
    *inv = 1.0f / s;
}

static inline int8_t quantize_one(float v, float inv) {
    float q = nearbyintf(v * inv); /* the current rounding mode: half to even, as cvtps2dq */
    if (q > 127.0f) q = 127.0f;
    if (q < -127.0f) q = -127.0f;
    return (int8_t)q;
}

/* ---------------------------------------------------------------------------------------------------
 * The reference path: plain C, the definition.
 */

static void quantize_block_reference(const float *x, int64_t len, int64_t block, int8_t *qa, float *sa,
                                     int32_t *asum) {
    float amax = 0.0f;
    for (int64_t i = 0; i < len; i++) amax = fmaxf(amax, fabsf(x[i]));
    float inv;
    block_scale(amax, sa, &inv);
    int32_t sum = 0;
    for (int64_t i = 0; i < block; i++) {
        qa[i] = (i < len && *sa != 0.0f) ? quantize_one(x[i], inv) : 0;
        sum += qa[i];
    }
    *asum = sum;
}

static inline int weight_at(const uint8_t *weights, int64_t nb, int64_t block, int64_t n, int64_t k) {
    int64_t t = n / ES_TILE, j = n % ES_TILE, b = k / block, o = k % block;
    const uint8_t *chunk = weights + (t * nb + b) * 8 * block + (o / 8) * 64;
    uint8_t byte = chunk[4 * j + (o % 4)];
    return (o % 8) < 4 ? (byte & 15) : (byte >> 4);
}

static void tile_reference(int64_t t, int64_t r0, int rows, const acts_t *a, int64_t block,
                           const uint8_t *weights, const float *scales, const uint8_t *zeros,
                           float facc[ES_ROWS][ES_TILE]) {
    for (int r = 0; r < rows; r++) {
        for (int j = 0; j < ES_TILE; j++) {
            int64_t n = t * ES_TILE + j;
            float acc = 0.0f;
            for (int64_t b = 0; b < a->nb; b++) {
                const int8_t *qa = a->qa + (r0 + r) * a->kp + b * block;
                int32_t idot = 0;
                for (int64_t o = 0; o < block; o++) idot += weight_at(weights, a->nb, block, n, b * block + o) * qa[o];
                int64_t tb = t * a->nb + b;
                int32_t term = idot - (int32_t)zeros[tb * ES_TILE + j] * a->asum[(r0 + r) * a->nb + b];
                acc = fmaf((float)term, scales[tb * ES_TILE + j] * a->sa[(r0 + r) * a->nb + b], acc);
            }
            facc[r][j] = acc;
        }
    }
}

/* ---------------------------------------------------------------------------------------------------
 * The AVX2 (+FMA) path: 8 columns per 256-bit register, u8 x s8 pairs (vpmaddubsw, at most 2 * 15 * 127
 * = 3810 each, eight of them summed in int16 <= 30480) widened with vpmaddwd by ones.
 */

#define AVX2 __attribute__((target("avx2,fma")))
#define AVX2_INLINE static inline __attribute__((always_inline, target("avx2,fma")))

static AVX2 void quantize_block_avx2(const float *x, int64_t len, int64_t block, int8_t *qa, float *sa,
                                     int32_t *asum) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 vmax = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= len; i += 8) vmax = _mm256_max_ps(vmax, _mm256_andnot_ps(sign, _mm256_loadu_ps(x + i)));
    float lanes[8];
    _mm256_storeu_ps(lanes, vmax);
    float amax = 0.0f;
    for (int l = 0; l < 8; l++) amax = fmaxf(amax, lanes[l]);
    for (; i < len; i++) amax = fmaxf(amax, fabsf(x[i]));
    float inv;
    block_scale(amax, sa, &inv);
    if (*sa == 0.0f) {
        memset(qa, 0, (size_t)block);
        *asum = 0;
        return;
    }
    const __m256 vinv = _mm256_set1_ps(inv);
    const __m256i lo = _mm256_set1_epi32(-127), hi = _mm256_set1_epi32(127);
    __m256i vsum = _mm256_setzero_si256();
    i = 0;
    for (; i + 8 <= len; i += 8) {
        __m256i q = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + i), vinv));
        q = _mm256_min_epi32(_mm256_max_epi32(q, lo), hi);
        vsum = _mm256_add_epi32(vsum, q);
        int32_t w[8];
        _mm256_storeu_si256((__m256i *)w, q);
        for (int l = 0; l < 8; l++) qa[i + l] = (int8_t)w[l];
    }
    int32_t sums[8];
    _mm256_storeu_si256((__m256i *)sums, vsum);
    int32_t sum = 0;
    for (int l = 0; l < 8; l++) sum += sums[l];
    for (; i < len; i++) {
        qa[i] = quantize_one(x[i], inv);
        sum += qa[i];
    }
    for (; i < block; i++) qa[i] = 0;
    *asum = sum;
}

static inline int32_t load4(const int8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* facc[r][8h..8h+7] += one block's terms for rows r < R of half h, from their integer sums idot[r]:
 * t - z * asum in float (exact: block_avx512 says why), times s * sa, fused into the accumulator. The
 * one sequence of float operations of every AVX2 kernel below. */
AVX2_INLINE void finish_avx2(const int R, int h, const __m256i *idot, const float *sa, const float *asum,
                             int64_t nb, const float *s, const uint8_t *z, float facc[ES_ROWS][ES_TILE]) {
    const __m256 zv = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(z + 8 * h))));
    const __m256 sv = _mm256_loadu_ps(s + 8 * h);
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) {
        __m256 term = _mm256_fnmadd_ps(zv, _mm256_set1_ps(asum[r * nb]), _mm256_cvtepi32_ps(idot[r]));
        __m256 scale = _mm256_mul_ps(sv, _mm256_set1_ps(sa[r * nb]));
        __m256 f = _mm256_loadu_ps(&facc[r][8 * h]);
        _mm256_storeu_ps(&facc[r][8 * h], _mm256_fmadd_ps(term, scale, f));
    }
}

/* Rows r < R of one tile and block, 8 columns (half h of the tile): integer dot products, then the
 * fused multiply-add into facc. R is a constant after inlining, so the accumulators live in registers. */
AVX2_INLINE void block_avx2(const int R, int h, const uint8_t *w, int64_t block, const int8_t *qa, int64_t kp,
                            const float *sa, const float *asum, int64_t nb, const float *s, const uint8_t *z,
                            float facc[ES_ROWS][ES_TILE]) {
    const __m256i mask = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
    __m256i acc[4];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_si256();
    for (int64_t sc = 0; sc < block / 32; sc++) {
        __m256i part[4];
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) part[r] = _mm256_setzero_si256();
#pragma GCC unroll 1 /* unrolled, gcc computes every product first and spills them */
        for (int c = 0; c < 4; c++) {
            if (h == 0) ES_PREFETCH_ROWS(R, w + sc * 256 + c * 64);
            __m256i v = _mm256_loadu_si256((const __m256i *)(w + sc * 256 + c * 64 + h * 32));
            __m256i low = _mm256_and_si256(v, mask), high = _mm256_and_si256(_mm256_srli_epi16(v, 4), mask);
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) {
                const int8_t *a = qa + r * kp + sc * 32 + c * 8;
                part[r] = _mm256_add_epi16(part[r], _mm256_maddubs_epi16(low, _mm256_set1_epi32(load4(a))));
                part[r] = _mm256_add_epi16(part[r], _mm256_maddubs_epi16(high, _mm256_set1_epi32(load4(a + 4))));
            }
        }
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) acc[r] = _mm256_add_epi32(acc[r], _mm256_madd_epi16(part[r], ones));
    }
    finish_avx2(R, h, acc, sa, asum, nb, s, z, facc);
}

/* Rows r < R <= 2 of one tile and block, all 16 columns (two 8-column halves): each 64-byte chunk is
 * loaded and unpacked once into 4 registers, and each row's 4 activations are broadcast once for both
 * halves. Per 32 K values the u8 x s8 pairs (vpmaddubsw, at most 2 * 15 * 127 = 3810 each, eight of them
 * summed in int16 <= 30480) are widened with vpmaddwd by ones into the row's int32 sums. R is a constant
 * after inlining, so the accumulators live in registers. */
AVX2_INLINE void pair_avx2(const int R, const uint8_t *w, int64_t block, const int8_t *qa, int64_t kp,
                            const float *sa, const float *asum, int64_t nb, const float *s, const uint8_t *z,
                            float facc[ES_ROWS][ES_TILE]) {
    const __m256i mask = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
    __m256i acc[2][2]; /* [half][row] */
#pragma GCC unroll 2
    for (int r = 0; r < R; r++) acc[0][r] = acc[1][r] = _mm256_setzero_si256();
    for (int64_t sc = 0; sc < block / 32; sc++) {
        __m256i part[2][2];
#pragma GCC unroll 2
        for (int r = 0; r < R; r++) part[0][r] = part[1][r] = _mm256_setzero_si256();
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++) {
            const uint8_t *chunk = w + sc * 256 + c * 64;
            ES_PREFETCH_ROWS(R, chunk);
            __m256i va = _mm256_loadu_si256((const __m256i *)chunk);
            __m256i vb = _mm256_loadu_si256((const __m256i *)(chunk + 32));
            __m256i la = _mm256_and_si256(va, mask), ha = _mm256_and_si256(_mm256_srli_epi16(va, 4), mask);
            __m256i lb = _mm256_and_si256(vb, mask), hb = _mm256_and_si256(_mm256_srli_epi16(vb, 4), mask);
#pragma GCC unroll 2
            for (int r = 0; r < R; r++) {
                const int8_t *a = qa + r * kp + sc * 32 + c * 8;
                __m256i a0 = _mm256_set1_epi32(load4(a)), a1 = _mm256_set1_epi32(load4(a + 4));
                part[0][r] = _mm256_add_epi16(part[0][r], _mm256_add_epi16(_mm256_maddubs_epi16(la, a0),
                                                                           _mm256_maddubs_epi16(ha, a1)));
                part[1][r] = _mm256_add_epi16(part[1][r], _mm256_add_epi16(_mm256_maddubs_epi16(lb, a0),
                                                                           _mm256_maddubs_epi16(hb, a1)));
            }
        }
#pragma GCC unroll 2
        for (int r = 0; r < R; r++) {
            acc[0][r] = _mm256_add_epi32(acc[0][r], _mm256_madd_epi16(part[0][r], ones));
            acc[1][r] = _mm256_add_epi32(acc[1][r], _mm256_madd_epi16(part[1][r], ones));
        }
    }
#pragma GCC unroll 2
    for (int h = 0; h < 2; h++) finish_avx2(R, h, acc[h], sa, asum, nb, s, z, facc);
}

static AVX2 void tile_avx2(int64_t t, int64_t r0, int rows, const acts_t *a, int64_t block,
                           const uint8_t *weights, const float *scales, const uint8_t *zeros,
                           float facc[ES_ROWS][ES_TILE]) {
    for (int64_t b = 0; b < a->nb; b++) {
        int64_t tb = t * a->nb + b;
        const uint8_t *w = weights + tb * 8 * block;
        const float *s = scales + tb * ES_TILE;
        const uint8_t *z = zeros + tb * ES_TILE;
        for (int r = 0; r < rows; r += 4) {
            const int8_t *qa = a->qa + (r0 + r) * a->kp + b * block;
            const float *sa = a->sa + (r0 + r) * a->nb + b;
            const float *asum = a->asumf + (r0 + r) * a->nb + b;
            float(*f)[ES_TILE] = facc + r;
            switch (rows - r < 4 ? rows - r : 4) {
            case 1: pair_avx2(1, w, block, qa, a->kp, sa, asum, a->nb, s, z, f); break;
            case 2: pair_avx2(2, w, block, qa, a->kp, sa, asum, a->nb, s, z, f); break;
            case 3:
                for (int h = 0; h < 2; h++) block_avx2(3, h, w, block, qa, a->kp, sa, asum, a->nb, s, z, f);
                break;
            default:
                for (int h = 0; h < 2; h++) block_avx2(4, h, w, block, qa, a->kp, sa, asum, a->nb, s, z, f);
                break;
            }
        }
    }
}

/* ---------------------------------------------------------------------------------------------------
 * The AVX-512 (F, BW, VL) + VNNI path: 16 columns per 512-bit register, vpdpbusd (u8 x s8, 4 per lane).
 */

#define AVX512 __attribute__((target("avx2,fma,avx512f,avx512bw,avx512vl,avx512vnni")))
#define AVX512_INLINE \
    static inline __attribute__((always_inline, target("avx2,fma,avx512f,avx512bw,avx512vl,avx512vnni")))

/* Rows r < R of one tile and block: the 8 unpacked registers of 32 K values serve every row. With at most
 * 4 rows, each row sums into two registers (even and odd groups of 4 K values) so that its chain of
 * dependent vpdpbusd is half as long; integer sums, so the split changes nothing. The zero-point term is
 * subtracted in float: t, z * asum and their difference are integers below 2^24, so exact, and the
 * result is the definition's (float)(idot - z * asum). */
AVX512_INLINE void block_avx512(const int R, const uint8_t *w, int64_t block, const int8_t *qa, int64_t kp,
                                const float *sa, const float *asum, int64_t nb, const float *s,
                                const uint8_t *z, float facc[ES_ROWS][ES_TILE]) {
    const __m512i mask = _mm512_set1_epi8(0x0F);
    const int split = R <= 4;
    __m512i acc[ES_ROWS], odd[4];
#pragma GCC unroll 16
    for (int r = 0; r < R; r++) acc[r] = _mm512_setzero_si512();
#pragma GCC unroll 4
    for (int r = 0; r < 4; r++) odd[r] = _mm512_setzero_si512();
    for (int64_t sc = 0; sc < block / 32; sc++) {
        __m512i u[8];
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++) {
            ES_PREFETCH_ROWS(R, w + sc * 256 + c * 64);
            __m512i v = _mm512_loadu_si512((const void *)(w + sc * 256 + c * 64));
            u[2 * c] = _mm512_and_si512(v, mask);
            u[2 * c + 1] = _mm512_and_si512(_mm512_srli_epi16(v, 4), mask);
        }
#pragma GCC unroll 8
        for (int g = 0; g < 8; g++) {
#pragma GCC unroll 16
            for (int r = 0; r < R; r++) {
                __m512i a = _mm512_set1_epi32(load4(qa + r * kp + sc * 32 + g * 4));
                if (split && (g & 1))
                    odd[r] = _mm512_dpbusd_epi32(odd[r], u[g], a);
                else
                    acc[r] = _mm512_dpbusd_epi32(acc[r], u[g], a);
            }
        }
    }
    const __m512 zv = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)z)));
    const __m512 sv = _mm512_loadu_ps(s);
#pragma GCC unroll 16
    for (int r = 0; r < R; r++) {
        __m512i idot = split ? _mm512_add_epi32(acc[r], odd[r]) : acc[r];
        __m512 term = _mm512_fnmadd_ps(zv, _mm512_set1_ps(asum[r * nb]), _mm512_cvtepi32_ps(idot));
        __m512 scale = _mm512_mul_ps(sv, _mm512_set1_ps(sa[r * nb]));
        __m512 f = _mm512_loadu_ps(facc[r]);
        _mm512_storeu_ps(facc[r], _mm512_fmadd_ps(term, scale, f));
    }
}

#define ES_CASE(R) \
    case R: block_avx512(R, w, block, qa, a->kp, sa, asum, a->nb, s, z, facc); break;

static AVX512 void tile_avx512(int64_t t, int64_t r0, int rows, const acts_t *a, int64_t block,
                               const uint8_t *weights, const float *scales, const uint8_t *zeros,
                               float facc[ES_ROWS][ES_TILE]) {
    for (int64_t b = 0; b < a->nb; b++) {
        int64_t tb = t * a->nb + b;
        const uint8_t *w = weights + tb * 8 * block;
        const float *s = scales + tb * ES_TILE;
        const uint8_t *z = zeros + tb * ES_TILE;
        const int8_t *qa = a->qa + r0 * a->kp + b * block;
        const float *sa = a->sa + r0 * a->nb + b;
        const float *asum = a->asumf + r0 * a->nb + b;
        switch (rows) {
            ES_CASE(1) ES_CASE(2) ES_CASE(3) ES_CASE(4) ES_CASE(5) ES_CASE(6) ES_CASE(7) ES_CASE(8)
            ES_CASE(9) ES_CASE(10) ES_CASE(11) ES_CASE(12) ES_CASE(13) ES_CASE(14) ES_CASE(15)
            default: block_avx512(16, w, block, qa, a->kp, sa, asum, a->nb, s, z, facc); break;
        }
    }
}

/* ---------------------------------------------------------------------------------------------------
 * The AMX path (Sapphire Rapids and later): the AVX-512 path whose products of many rows run on tiles.
 * A block's integer dot products for 16 rows and the tile's 16 columns are one tile C = A B summed by
 * tdpbsud (s8 x u8 -> s32, exact): A holds the rows' quantized activations (read in place), B the block's
 * unpacked weights, whose layout is already the one AMX wants (row i of B: the 16 columns' 4 values at K
 * offsets 4i..4i+3, what one unpacked 64-byte chunk half holds), loaded once for all the call's rows. C
 * is then finished by exactly the float operations of block_avx512, so the bits are the other paths'.
 * With few rows the unpacked weights' trip through memory costs more than the vpdpbusd it saves, and
 * blocks under 128 (a tile product of 32 K values or fewer, finished block by block) need more rows to
 * repay it: below 8 rows, or 32 for smaller blocks (measured: README.md), tile_avx512 runs.
 */

#define AMX __attribute__((target("avx2,fma,avx512f,avx512bw,avx512vl,avx512vnni,amx-tile,amx-int8")))
#ifndef ES_AMX_MIN_ROWS
#define ES_AMX_MIN_ROWS 8
#endif
#ifndef ES_AMX_MIN_ROWS_SMALL_BLOCKS
#define ES_AMX_MIN_ROWS_SMALL_BLOCKS 32
#endif

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tile_config_t;

/* The tiles: 0 and 1 hold C of alternate groups of 16 rows (so that one group's product overlaps the
 * last one's finishing), 2 C of a last, shorter group; 3, 4 and 5 their A; 6 and 7 B, a block's weights
 * in chunks of kc K values (two chunks for blocks of 128), loaded once for every group. */
static AMX void amx_configure(int last_rows, int kc) {
    tile_config_t config __attribute__((aligned(64)));
    memset(&config, 0, sizeof config);
    config.palette = 1;
    for (int tile = 0; tile < 6; tile++) {
        int rows = tile % 3 == 2 ? last_rows : 16;
        config.rows[tile] = (uint8_t)rows;
        config.colsb[tile] = tile < 3 ? 64 : (uint16_t)kc; /* C: rows x 16 int32; A: rows x kc int8 */
    }
    for (int tile = 6; tile < 8; tile++) config.rows[tile] = (uint8_t)(kc / 4), config.colsb[tile] = 64;
    _tile_loadconfig(&config);
}

#define AMX_INLINE \
    static inline __attribute__((always_inline, target("avx2,fma,avx512f,avx512bw,avx512vl,avx512vnni,amx-tile,amx-int8")))

/* A block's weights unpacked to B's rows: chunk c gives rows 2c (low nibbles) and 2c + 1 (high). */
AMX_INLINE void amx_unpack(const uint8_t *w, int64_t block, uint8_t *unpacked) {
    const __m512i mask = _mm512_set1_epi8(0x0F);
    for (int64_t c = 0; c < block / 8; c++) {
        _mm_prefetch((const char *)(w + c * 64 + ES_PREFETCH), _MM_HINT_T0);
        __m512i v = _mm512_loadu_si512((const void *)(w + c * 64));
        _mm512_store_si512((void *)(unpacked + 128 * c), _mm512_and_si512(v, mask));
        _mm512_store_si512((void *)(unpacked + 128 * c + 64), _mm512_and_si512(_mm512_srli_epi16(v, 4), mask));
    }
}

/* One group's integer sums over the block into dots: C (tile `c`) = A (tile `c` + 3, the group's rows of
 * qa, chunk by chunk) times B (tiles 6 and 7). Tile numbers must be constants: `c` is, once inlined. */
AMX_INLINE void amx_group(const int c, const int chunks, const int8_t *qa, int64_t kp, int kc, int32_t *dots) {
#define ES_GROUP(C, A)                                       \
    _tile_zero(C);                                           \
    _tile_loadd(A, qa, kp);                                  \
    _tile_dpbsud(C, A, 6);                                   \
    if (chunks > 1) {                                        \
        _tile_loadd(A, qa + kc, kp);                         \
        _tile_dpbsud(C, A, 7);                               \
    }                                                        \
    _tile_stored(C, dots, 64);
    if (c == 0) {
        ES_GROUP(0, 3)
    } else if (c == 1) {
        ES_GROUP(1, 4)
    } else {
        ES_GROUP(2, 5)
    }
#undef ES_GROUP
}

/* facc[r] += block b's terms for `rows` rows: block_avx512's float operations, in its order. */
static inline __attribute__((always_inline, target("avx2,fma,avx512f,avx512bw,avx512vl,avx512vnni")))
void amx_finish(int64_t tb, int64_t r0, int rows, const acts_t *a, int64_t b, const float *scales,
                const uint8_t *zeros, const int32_t *dots, float (*facc)[ES_TILE]) {
    const __m512 zv = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(zeros + tb * ES_TILE))));
    const __m512 sv = _mm512_loadu_ps(scales + tb * ES_TILE);
    const float *sa = a->sa + r0 * a->nb + b, *asum = a->asumf + r0 * a->nb + b;
    for (int r = 0; r < rows; r++) {
        __m512i idot = _mm512_load_si512((const void *)(dots + r * ES_TILE));
        __m512 term = _mm512_fnmadd_ps(zv, _mm512_set1_ps(asum[r * a->nb]), _mm512_cvtepi32_ps(idot));
        __m512 scale = _mm512_mul_ps(sv, _mm512_set1_ps(sa[r * a->nb]));
        __m512 f = _mm512_loadu_ps(facc[r0 + r]);
        _mm512_storeu_ps(facc[r0 + r], _mm512_fmadd_ps(term, scale, f));
    }
}

/* Tile t's products for all m rows into facc [m][16]: per block, the weights are unpacked and loaded
 * into B once, and every group of 16 rows (then the last, shorter one) takes its tile product. */
static AMX void tile_amx(int64_t t, int64_t m, const acts_t *a, int64_t block, const uint8_t *weights,
                         const float *scales, const uint8_t *zeros, float (*facc)[ES_TILE]) {
    const int kc = block < 64 ? (int)block : 64, chunks = (int)(block / kc);
    const int64_t full = m / 16 * 16;
    uint8_t unpacked[2][32 * 64] __attribute__((aligned(64)));
    int32_t dots[3][ES_ROWS * ES_TILE] __attribute__((aligned(64)));
    memset(facc, 0, (size_t)m * ES_TILE * sizeof(float));
    for (int64_t b = 0; b < a->nb; b++) {
        int64_t tb = t * a->nb + b;
        uint8_t *u = unpacked[b & 1];
        amx_unpack(weights + tb * 8 * block, block, u);
        _tile_loadd(6, u, 64);
        if (chunks > 1) _tile_loadd(7, u + kc * 16, 64);
        const int8_t *qa = a->qa + b * block;
        for (int64_t r0 = 0; r0 < full; r0 += 32) {
            amx_group(0, chunks, qa + r0 * a->kp, a->kp, kc, dots[0]);
            if (r0 + 16 < full) amx_group(1, chunks, qa + (r0 + 16) * a->kp, a->kp, kc, dots[1]);
            amx_finish(tb, r0, 16, a, b, scales, zeros, dots[0], facc);
            if (r0 + 16 < full) amx_finish(tb, r0 + 16, 16, a, b, scales, zeros, dots[1], facc);
        }
        if (full < m) {
            amx_group(2, chunks, qa + full * a->kp, a->kp, kc, dots[2]);
            amx_finish(tb, full, (int)(m - full), a, b, scales, zeros, dots[2], facc);
        }
    }
}

/* ---------------------------------------------------------------------------------------------------
 * The driver: threads over column tiles only (es_run, dispatch.c); per tile, at most 16 rows per pass.
 */

typedef void (*tile_fn)(int64_t, int64_t, int, const acts_t *, int64_t, const uint8_t *, const float *,
                        const uint8_t *, float[ES_ROWS][ES_TILE]);
typedef void (*quantize_fn)(const float *, int64_t, int64_t, int8_t *, float *, int32_t *);

/* One scratch per calling thread, grown as needed, for the quantized activations. */
static _Thread_local void *scratch;
static _Thread_local size_t scratch_size;

typedef struct {
    acts_t a;
    tile_fn tile;
    quantize_fn quantize;
    const float *x, *scales, *bias;
    const uint8_t *weights, *zeros;
    float *out;
    int64_t m, k, n, block, tiles, per_item;
} call_t;

static void quantize_item(void *ctx, int64_t item) {
    call_t *c = ctx;
    int64_t end = (item + 1) * c->per_item < c->m * c->a.nb ? (item + 1) * c->per_item : c->m * c->a.nb;
    for (int64_t i = item * c->per_item; i < end; i++) {
        int64_t r = i / c->a.nb, b = i % c->a.nb;
        int64_t len = c->k - b * c->block < c->block ? c->k - b * c->block : c->block;
        c->quantize(c->x + r * c->k + b * c->block, len, c->block, c->a.qa + r * c->a.kp + b * c->block,
                    c->a.sa + i, c->a.asum + i);
        c->a.asumf[i] = (float)c->a.asum[i];
    }
}

static void tiles_item(void *ctx, int64_t item) {
    call_t *c = ctx;
    float facc[ES_ROWS][ES_TILE] __attribute__((aligned(64)));
    int64_t end = (item + 1) * c->per_item < c->tiles ? (item + 1) * c->per_item : c->tiles;
    for (int64_t t = item * c->per_item; t < end; t++) {
        int64_t n0 = t * ES_TILE;
        int cols = c->n - n0 < ES_TILE ? (int)(c->n - n0) : ES_TILE;
        for (int64_t r0 = 0; r0 < c->m; r0 += ES_ROWS) {
            int rows = c->m - r0 < ES_ROWS ? (int)(c->m - r0) : ES_ROWS;
            memset(facc, 0, sizeof facc);
            c->tile(t, r0, rows, &c->a, c->block, c->weights, c->scales, c->zeros, facc);
            for (int r = 0; r < rows; r++) {
                float *o = c->out + (r0 + r) * c->n + n0;
                if (c->bias)
                    for (int j = 0; j < cols; j++) o[j] = facc[r][j] + c->bias[n0 + j];
                else
                    for (int j = 0; j < cols; j++) o[j] = facc[r][j];
            }
        }
    }
}

/* The amx path's items: all the call's rows of each tile, at most ES_AMX_ROWS at a time (tile_amx). */
#define ES_AMX_ROWS 256

static AMX void tiles_item_amx(void *ctx, int64_t item) {
    call_t *c = ctx;
    float facc[ES_AMX_ROWS][ES_TILE] __attribute__((aligned(64)));
    int64_t end = (item + 1) * c->per_item < c->tiles ? (item + 1) * c->per_item : c->tiles;
    /* Only the call's last group of rows can be shorter than 16 (ES_AMX_ROWS is a multiple of 16). */
    int64_t last = c->m % 16, kc = c->block < 64 ? c->block : 64;
    amx_configure(last ? (int)last : 16, (int)kc);
    for (int64_t t = item * c->per_item; t < end; t++) {
        int64_t n0 = t * ES_TILE;
        int cols = c->n - n0 < ES_TILE ? (int)(c->n - n0) : ES_TILE;
        for (int64_t r0 = 0; r0 < c->m; r0 += ES_AMX_ROWS) {
            int64_t rows = c->m - r0 < ES_AMX_ROWS ? c->m - r0 : ES_AMX_ROWS;
            acts_t part = c->a; /* rows r0.. of the activations */
            part.qa += r0 * part.kp, part.sa += r0 * part.nb, part.asumf += r0 * part.nb;
            tile_amx(t, rows, &part, c->block, c->weights, c->scales, c->zeros, facc);
            for (int64_t r = 0; r < rows; r++) {
                float *o = c->out + (r0 + r) * c->n + n0;
                if (c->bias)
                    for (int j = 0; j < cols; j++) o[j] = facc[r][j] + c->bias[n0 + j];
                else
                    for (int j = 0; j < cols; j++) o[j] = facc[r][j];
            }
        }
    }
    _tile_release();
}

/* Items per thread: enough that a late or slow thread leaves little undone, few enough that claiming
 * them (one atomic each) costs nothing. */
#define ES_ITEMS_PER_THREAD 16

int es_int4_matmul(int path, const float *x, int64_t m, int64_t k, int64_t n, int64_t block,
                   const uint8_t *weights, const float *scales, const uint8_t *zeros, const float *bias,
                   float *out, int threads) {
    if (m < 0 || k < 1 || n < 1 || (block != 32 && block != 64 && block != 128) || threads < 1) return -1;
    if (path < 0 || path >= ES_PATH_COUNT) return -1;
    if (!(es_cpu_paths() & (1 << path))) return -2;
    if (m == 0) return 0;
    call_t c = {.x = x, .scales = scales, .bias = bias, .weights = weights, .zeros = zeros, .out = out,
                .m = m, .k = k, .n = n, .block = block};
    c.tile = path == ES_PATH_AVX512 || path == ES_PATH_AMX ? tile_avx512
             : path == ES_PATH_AVX2                        ? tile_avx2
                                                           : tile_reference;
    c.quantize = path == ES_PATH_REFERENCE ? quantize_block_reference : quantize_block_avx2;
    c.a.nb = (k + block - 1) / block;
    c.a.kp = c.a.nb * block;
    size_t need = (size_t)(m * c.a.kp) + (size_t)(m * c.a.nb) * (2 * sizeof(float) + sizeof(int32_t)) + 64;
    if (need > scratch_size) {
        free(scratch);
        scratch = malloc(need);
        scratch_size = scratch ? need : 0;
        if (!scratch) return -3;
    }
    c.a.sa = (float *)scratch;
    c.a.asumf = c.a.sa + m * c.a.nb;
    c.a.asum = (int32_t *)(c.a.asumf + m * c.a.nb);
    c.a.qa = (int8_t *)(c.a.asum + m * c.a.nb);
    /* The activations first: a few microseconds for a verification pass, so on this thread unless big. */
    int64_t pieces = m * c.a.nb;
    int quantizers = m * k < (1 << 16) ? 1 : threads;
    c.per_item = (pieces + quantizers * ES_ITEMS_PER_THREAD - 1) / (quantizers * ES_ITEMS_PER_THREAD);
    es_run(quantizers, (pieces + c.per_item - 1) / c.per_item, quantize_item, &c);
    c.tiles = (n + ES_TILE - 1) / ES_TILE;
    c.per_item = (c.tiles + threads * ES_ITEMS_PER_THREAD - 1) / (threads * ES_ITEMS_PER_THREAD);
    int amx_min_rows = block >= 128 ? ES_AMX_MIN_ROWS : ES_AMX_MIN_ROWS_SMALL_BLOCKS;
    int tiles_of_amx = path == ES_PATH_AMX && m >= amx_min_rows;
    es_run(threads, (c.tiles + c.per_item - 1) / c.per_item, tiles_of_amx ? tiles_item_amx : tiles_item, &c);
    return 0;
}

/* ---------------------------------------------------------------------------------------------------
 * For the benchmark: read `size` bytes on `threads` threads, split as the matmul splits its tiles, and
 * return their sum, so that the machine's read bandwidth is measured the way the kernel reads.
 */

static AVX2 uint64_t read_avx2(const uint8_t *p, int64_t size) {
    __m256i s0 = _mm256_setzero_si256(), s1 = _mm256_setzero_si256();
    int64_t i = 0;
    for (; i + 128 <= size; i += 128) {
        s0 = _mm256_add_epi64(s0, _mm256_sad_epu8(_mm256_loadu_si256((const __m256i *)(p + i)),
                                                  _mm256_loadu_si256((const __m256i *)(p + i + 32))));
        s1 = _mm256_add_epi64(s1, _mm256_sad_epu8(_mm256_loadu_si256((const __m256i *)(p + i + 64)),
                                                  _mm256_loadu_si256((const __m256i *)(p + i + 96))));
    }
    uint64_t lanes[4];
    _mm256_storeu_si256((__m256i *)lanes, _mm256_add_epi64(s0, s1));
    uint64_t sum = lanes[0] + lanes[1] + lanes[2] + lanes[3];
    for (; i < size; i++) sum += p[i];
    return sum;
}

typedef struct {
    const uint8_t *p;
    int64_t size, parts;
    int wide;
    _Atomic uint64_t total;
} read_t;

static void read_item(void *ctx, int64_t item) {
    read_t *r = ctx;
    int64_t begin = r->size * item / r->parts, end = r->size * (item + 1) / r->parts;
    uint64_t sum = 0;
    if (r->wide)
        sum = read_avx2(r->p + begin, end - begin);
    else
        for (int64_t i = begin; i < end; i++) sum += r->p[i];
    atomic_fetch_add(&r->total, sum);
}

uint64_t es_read_bytes(const uint8_t *p, int64_t size, int threads) {
    read_t r = {.p = p, .size = size, .parts = (int64_t)threads * ES_ITEMS_PER_THREAD};
    r.wide = (es_cpu_paths() & (1 << ES_PATH_AVX2)) != 0;
    atomic_init(&r.total, 0);
    es_run(threads, r.parts, read_item, &r);
    return atomic_load(&r.total);
}
