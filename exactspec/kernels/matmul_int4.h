/* int4 weights times a few float32 rows: what matmul_int4.c and dispatch.c share (README.md). */
#ifndef EXACTSPEC_MATMUL_INT4_H
#define EXACTSPEC_MATMUL_INT4_H

#include <stdint.h>

/* The paths, by number; paths.py names them. */
enum { ES_PATH_REFERENCE = 0, ES_PATH_AVX2 = 1, ES_PATH_AVX512 = 2, ES_PATH_COUNT = 3 };

/* Columns per tile: one 32-bit lane of a 512-bit register per column. */
#define ES_TILE 16

/* Bit i set when path i runs on this CPU (dispatch.c). */
int es_cpu_paths(void);
/* The widest path this CPU runs (dispatch.c). */
int es_best_path(void);

/* Run fn(ctx, i) for i < items on the calling thread and up to threads - 1 pool workers (dispatch.c). */
typedef void (*es_task_fn)(void *ctx, int64_t item);
void es_run(int threads, int64_t items, es_task_fn fn, void *ctx);

/* out[M, N] = x[M, K] times the packed weights (+ bias[N] when not NULL); 0, or a negative error:
 * -1 an argument is out of range, -2 the path does not run on this CPU, -3 no memory. */
int es_int4_matmul(int path, const float *x, int64_t m, int64_t k, int64_t n, int64_t block,
                   const uint8_t *weights, const float *scales, const uint8_t *zeros, const float *bias,
                   float *out, int threads);

/* Read `size` bytes at p with `threads` threads (a static split) and return their sum: the machine's read
 * bandwidth as the kernel reads (a benchmark's yardstick). */
uint64_t es_read_bytes(const uint8_t *p, int64_t size, int threads);

#endif
