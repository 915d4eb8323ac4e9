/* int4 weights times a few float32 rows: what matmul_int4.c and dispatch.c share (README.md). */
#ifndef EXACTSPEC_MATMUL_INT4_H
#define EXACTSPEC_MATMUL_INT4_H

#include <stdint.h>

#include "dispatch.h"

/* Columns per tile: one 32-bit lane of a 512-bit register per column. */
#define ES_TILE 16

/* out[M, N] = x[M, K] times the packed weights (+ bias[N] when not NULL); 0, or a negative error:
 * -1 an argument is out of range, -2 the path does not run on this CPU, -3 no memory. */
int es_int4_matmul(int path, const float *x, int64_t m, int64_t k, int64_t n, int64_t block,
                   const uint8_t *weights, const float *scales, const uint8_t *zeros, const float *bias,
                   float *out, int threads);

/* Read `size` bytes at p with `threads` threads (a static split) and return their sum: the machine's read
 * bandwidth as the kernel reads (a benchmark's yardstick). */
uint64_t es_read_bytes(const uint8_t *p, int64_t size, int threads);

#endif
