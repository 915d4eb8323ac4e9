/* The row-wise operations of rowwise.c, for the other kernels of this folder (decoder.c). */
#ifndef EXACTSPEC_ROWWISE_H
#define EXACTSPEC_ROWWISE_H

#include <stdint.h>

void es_rms_norm(int path, int threads, const float *x, const float *weight, float eps, float *y, int M, int D);
void es_silu_mul(int path, int threads, const float *gate, const float *up, float *y, long count);
void es_silu_mul_rows(int path, int threads, const float *gate_up, float *y, int M, long F);
void es_rotary(int threads, float *x, const int64_t *positions, const float *cos_table, const float *sin_table,
               int M, int heads, int head_size);

#endif
