/* attention.c's es_attend, for the other kernels of this folder (decoder.c). */
#ifndef EXACTSPEC_ATTENTION_H
#define EXACTSPEC_ATTENTION_H

#include <stdint.h>

#define ES_ATTN_ERROR_CELL 1  /* a cell id outside [0, capacity) */
#define ES_ATTN_ERROR_ORDER 2 /* a cell list not strictly increasing */
#define ES_ATTN_ERROR_SLOT 3  /* a slot outside [0, slots) */
#define ES_ATTN_ERROR_MEMORY 4
#define ES_ATTN_ERROR_PATH 5 /* a path this CPU does not run */

int es_attend(int path, int threads, const float *keys, const float *values, int slots, int kv_heads, int capacity,
              int head_size, const float *queries, int n, int heads, const int32_t *query_slots,
              const int32_t *offsets, const int32_t *cells, float scale, float *out);

#endif
