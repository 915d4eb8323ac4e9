/* What every kernel of this folder shares (dispatch.c): the paths by number, which of them this CPU runs,
 * and the thread pool. */
#ifndef EXACTSPEC_DISPATCH_H
#define EXACTSPEC_DISPATCH_H

#include <stdint.h>

/* The paths, by number; paths.py names them. "amx" is the AVX-512 path whose int4 products of several
 * rows run on AMX tiles (matmul_int4.c); every other kernel runs its AVX-512 code on it. */
enum { ES_PATH_REFERENCE = 0, ES_PATH_AVX2 = 1, ES_PATH_AVX512 = 2, ES_PATH_AMX = 3, ES_PATH_COUNT = 4 };

/* The vector path a kernel without AMX code runs on `path`. */
static inline int es_vector_path(int path) { return path == ES_PATH_AMX ? ES_PATH_AVX512 : path; }

/* Bit i set when path i runs on this CPU. */
int es_cpu_paths(void);
/* The widest path this CPU runs. */
int es_best_path(void);

/* Run fn(ctx, i) for i < items on the calling thread and up to threads - 1 pool workers; items are
 * claimed one at a time, so which thread runs an item is not fixed, and an item must compute the same
 * bits on any of them. One item, or threads <= 1, runs on the caller alone. */
typedef void (*es_task_fn)(void *ctx, int64_t item);
void es_run(int threads, int64_t items, es_task_fn fn, void *ctx);

#endif
