/* One pass of a Qwen2/Llama-style decoder in one call (decoder.py calls these): the operations of
   models/native/forward.py's `forward`, in its order, each done by this folder's kernels.

     x = embedding[tokens]                                        [T, D]
     per layer l:
       h = rms_norm(x, input_norm)
       qkv = h @ Wqkv (+ bias)        q, k, v = the three column ranges, copied apart
       rotary(q), rotary(k)           at each token's position, from the model's cos/sin table
       cache[l][slot, :, cell] = k, v for every token, then
       a = attend(q, each token's visible cells)
       x = x + a @ Wo                 element by element
       h = rms_norm(x, post_norm)
       g = silu(gu[:, :F]) * gu[:, F:]   gu = h @ Wgate_up
       x = x + g @ Wdown
     logits = rms_norm(x[wanted], final_norm) @ Wlm

   Every float operation is the one forward.py asks its kernels for (the same functions, the same
   arguments), and the residual adds are single float32 additions as torch's; the rest is copying. So the
   logits are forward.py's bits on every path and thread count (the tests assert it with `==`), and keep
   its batch invariance (README.md).

   The weights are the caller's: es_decoder_new and es_decoder_layer keep pointers, not copies. Scratch
   buffers grow with the tokens of a pass and are kept between calls; one decoder runs one pass at a time. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "attention.h"
#include "dispatch.h"
#include "matmul_int4.h"
#include "rowwise.h"

/* Errors es_decoder_run returns (attention's own codes, 1..5, pass through). */
#define ES_DECODER_ERROR_ARGUMENT -1 /* a token, slot, cell, position or wanted index out of range */
#define ES_DECODER_ERROR_PATH -2
#define ES_DECODER_ERROR_MEMORY -3
#define ES_DECODER_ERROR_ORDER -4 /* offsets that decrease, or a cell list that does not increase */

typedef struct {
    const uint8_t *packed, *zeros;
    const float *scales;
    int64_t n, k, block;
} Int4;

typedef struct {
    const float *input_norm, *qkv_bias, *post_norm;
    Int4 qkv, output, gate_up, down;
} Layer;

typedef struct {
    int layers, hidden, heads, kv_heads, head_size, intermediate;
    int64_t vocab, embedding_rows;
    float eps, scale;
    const float *embedding, *final_norm;
    Int4 lm_head;
    Layer *layer;
    /* Scratch for `room` tokens (and `wanted_room` wanted rows). */
    int64_t room, wanted_room;
    float *x, *h, *qkv, *q, *k, *v, *attended, *gate_up, *gated, *y, *last, *last_normed;
    int64_t *positions;
} Decoder;

static Int4 int4(const uint8_t *packed, const float *scales, const uint8_t *zeros, int64_t n, int64_t k,
                 int64_t block) {
    return (Int4){.packed = packed, .scales = scales, .zeros = zeros, .n = n, .k = k, .block = block};
}

void *es_decoder_new(int layers, int hidden, int heads, int kv_heads, int head_size, int intermediate,
                     int64_t vocab, float eps, float scale, const float *embedding, int64_t embedding_rows,
                     const float *final_norm, const uint8_t *lm_packed, const float *lm_scales,
                     const uint8_t *lm_zeros, int64_t lm_block) {
    if (layers < 1 || hidden < 1 || heads < 1 || kv_heads < 1 || heads % kv_heads || head_size < 2 ||
        head_size % 2 || intermediate < 1 || vocab < 1)
        return NULL;
    Decoder *d = calloc(1, sizeof *d);
    if (!d) return NULL;
    d->layer = calloc((size_t)layers, sizeof *d->layer);
    if (!d->layer) {
        free(d);
        return NULL;
    }
    d->layers = layers, d->hidden = hidden, d->heads = heads, d->kv_heads = kv_heads;
    d->head_size = head_size, d->intermediate = intermediate, d->vocab = vocab;
    d->eps = eps, d->scale = scale, d->embedding = embedding, d->embedding_rows = embedding_rows;
    d->final_norm = final_norm;
    d->lm_head = int4(lm_packed, lm_scales, lm_zeros, vocab, hidden, lm_block);
    return d;
}

/* Layer `index`'s weights: norms [D], q/k/v ((H + 2 kvH) hd outputs) with its bias (or NULL), output
   (D outputs), gate/up (2 F outputs, gate first), down (D outputs); each int4 product as packed, scales,
   zeros and its block. */
int es_decoder_layer(void *decoder, int index, const float *input_norm, const float *post_norm,
                     const float *qkv_bias, const uint8_t *qkv_packed, const float *qkv_scales,
                     const uint8_t *qkv_zeros, int64_t qkv_block, const uint8_t *output_packed,
                     const float *output_scales, const uint8_t *output_zeros, int64_t output_block,
                     const uint8_t *gate_up_packed, const float *gate_up_scales, const uint8_t *gate_up_zeros,
                     int64_t gate_up_block, const uint8_t *down_packed, const float *down_scales,
                     const uint8_t *down_zeros, int64_t down_block) {
    Decoder *d = decoder;
    if (index < 0 || index >= d->layers) return ES_DECODER_ERROR_ARGUMENT;
    int64_t D = d->hidden, F = d->intermediate, attention = (int64_t)d->heads * d->head_size;
    int64_t qkv = attention + 2 * (int64_t)d->kv_heads * d->head_size;
    d->layer[index] = (Layer){
        .input_norm = input_norm,
        .post_norm = post_norm,
        .qkv_bias = qkv_bias,
        .qkv = int4(qkv_packed, qkv_scales, qkv_zeros, qkv, D, qkv_block),
        .output = int4(output_packed, output_scales, output_zeros, D, attention, output_block),
        .gate_up = int4(gate_up_packed, gate_up_scales, gate_up_zeros, 2 * F, D, gate_up_block),
        .down = int4(down_packed, down_scales, down_zeros, D, F, down_block),
    };
    return 0;
}

static void free_scratch(Decoder *d) {
    float **buffers[] = {&d->x, &d->h,      &d->qkv,   &d->q, &d->k,    &d->v,
                         &d->attended, &d->gate_up, &d->gated, &d->y, &d->last, &d->last_normed};
    for (size_t i = 0; i < sizeof buffers / sizeof *buffers; i++) {
        free(*buffers[i]);
        *buffers[i] = NULL;
    }
    free(d->positions);
    d->positions = NULL;
    d->room = d->wanted_room = 0;
}

void es_decoder_free(void *decoder) {
    Decoder *d = decoder;
    if (!d) return;
    free_scratch(d);
    free(d->layer);
    free(d);
}

/* floats of 64-byte aligned memory (a whole number of cache lines). */
static float *floats(int64_t count) {
    size_t bytes = ((size_t)(count > 0 ? count : 1) * sizeof(float) + 63) & ~(size_t)63;
    return aligned_alloc(64, bytes);
}

/* Scratch for `tokens` tokens and `wanted` rows of logits; 0, or -3 (out of memory: none is kept). */
static int reserve(Decoder *d, int64_t tokens, int64_t wanted) {
    if (tokens <= d->room && wanted <= d->wanted_room) return 0;
    tokens = tokens > d->room ? tokens : d->room;
    wanted = wanted > d->wanted_room ? wanted : d->wanted_room;
    free_scratch(d);
    int64_t D = d->hidden, F = d->intermediate, attention = (int64_t)d->heads * d->head_size;
    int64_t kv = (int64_t)d->kv_heads * d->head_size;
    d->x = floats(tokens * D), d->h = floats(tokens * D), d->y = floats(tokens * D);
    d->qkv = floats(tokens * (attention + 2 * kv));
    d->q = floats(tokens * attention), d->attended = floats(tokens * attention);
    d->k = floats(tokens * kv), d->v = floats(tokens * kv);
    d->gate_up = floats(tokens * 2 * F), d->gated = floats(tokens * F);
    d->last = floats(wanted * D), d->last_normed = floats(wanted * D);
    d->positions = malloc((size_t)(tokens > 0 ? tokens : 1) * sizeof(int64_t));
    if (!d->x || !d->h || !d->y || !d->qkv || !d->q || !d->attended || !d->k || !d->v || !d->gate_up ||
        !d->gated || !d->last || !d->last_normed || !d->positions) {
        free_scratch(d);
        return ES_DECODER_ERROR_MEMORY;
    }
    d->room = tokens, d->wanted_room = wanted;
    return 0;
}

static int matmul(int path, int threads, const float *x, int64_t m, const Int4 *w, const float *bias, float *out) {
    int status = es_int4_matmul(path, x, m, w->k, w->n, w->block, w->packed, w->scales, w->zeros, bias, out,
                                threads);
    return status == -2 ? ES_DECODER_ERROR_PATH : status == -3 ? ES_DECODER_ERROR_MEMORY : status ? -1 : 0;
}

/* x += y, element by element (torch's x + y: one float32 addition each). */
static void add(float *x, const float *y, int64_t count) {
    for (int64_t i = 0; i < count; i++) x[i] = x[i] + y[i];
}

/* Every index of the pass in range and every cell list increasing, before anything is written. */
static int check(const Decoder *d, int slots, int capacity, int64_t table_rows, int64_t count,
                 const int64_t *tokens, const int32_t *token_slots, const int32_t *positions,
                 const int32_t *cells, const int32_t *offsets, const int32_t *visible, int64_t visible_count,
                 int64_t wanted_count, const int64_t *wanted) {
    if (offsets[0] != 0 || offsets[count] > visible_count) return ES_DECODER_ERROR_ORDER;
    for (int64_t t = 0; t < count; t++) {
        if (tokens[t] < 0 || tokens[t] >= d->embedding_rows || token_slots[t] < 0 || token_slots[t] >= slots ||
            positions[t] < 0 || positions[t] >= table_rows || cells[t] < 0 || cells[t] >= capacity)
            return ES_DECODER_ERROR_ARGUMENT;
        if (offsets[t + 1] < offsets[t]) return ES_DECODER_ERROR_ORDER;
        for (int32_t j = offsets[t]; j < offsets[t + 1]; j++) {
            if (visible[j] < 0 || visible[j] >= capacity) return ES_DECODER_ERROR_ARGUMENT;
            if (j > offsets[t] && visible[j] <= visible[j - 1]) return ES_DECODER_ERROR_ORDER;
        }
    }
    for (int64_t w = 0; w < wanted_count; w++)
        if (wanted[w] < 0 || wanted[w] >= count) return ES_DECODER_ERROR_ARGUMENT;
    return 0;
}

/* One pass of `count` tokens (forward.py's PassPlan: tokens, their slots, rotary positions, cells, and the
   CSR lists offsets/visible of the cells each attends to) over the cache `keys`/`values` ([layers, slots,
   kv_heads, capacity, head_size] float32), writing each token's keys and values into its cell; the logits
   of tokens `wanted` into logits [wanted_count, columns]: the output layer's first `columns` outputs (each
   column's bits are the same whatever the number computed). cos_table, sin_table: [table_rows,
   head_size / 2].
   Returns 0, or an error (ES_DECODER_ERROR_*, or attention's code), then the cache may be part written. */
int es_decoder_run(void *decoder, int path, int threads, float *keys, float *values, int slots, int capacity,
                   const float *cos_table, const float *sin_table, int64_t table_rows, int64_t count,
                   const int64_t *tokens, const int32_t *token_slots, const int32_t *positions,
                   const int32_t *cells, const int32_t *offsets, const int32_t *visible, int64_t visible_count,
                   int64_t wanted_count, const int64_t *wanted, int64_t columns, float *logits) {
    Decoder *d = decoder;
    if (path < 0 || path >= ES_PATH_COUNT || !(es_cpu_paths() & (1 << path))) return ES_DECODER_ERROR_PATH;
    if (threads < 1 || count < 0 || wanted_count < 0 || count > INT32_MAX || columns < 1 || columns > d->vocab)
        return ES_DECODER_ERROR_ARGUMENT;
    if (count == 0) return wanted_count ? ES_DECODER_ERROR_ARGUMENT : 0;
    int status = check(d, slots, capacity, table_rows, count, tokens, token_slots, positions, cells, offsets,
                       visible, visible_count, wanted_count, wanted);
    if (status) return status;
    if ((status = reserve(d, count, wanted_count))) return status;
    const int T = (int)count, D = d->hidden, H = d->heads, kvH = d->kv_heads, hd = d->head_size;
    const int64_t F = d->intermediate, attention = (int64_t)H * hd, kv = (int64_t)kvH * hd;
    const int64_t row = attention + 2 * kv;
    const size_t layer_floats = (size_t)slots * kvH * capacity * hd;
    for (int t = 0; t < T; t++) {
        memcpy(d->x + (size_t)t * D, d->embedding + (size_t)tokens[t] * D, (size_t)D * sizeof(float));
        d->positions[t] = positions[t];
    }
    for (int l = 0; l < d->layers; l++) {
        const Layer *L = &d->layer[l];
        float *layer_keys = keys + l * layer_floats, *layer_values = values + l * layer_floats;
        es_rms_norm(path, threads, d->x, L->input_norm, d->eps, d->h, T, D);
        if ((status = matmul(path, threads, d->h, T, &L->qkv, L->qkv_bias, d->qkv))) return status;
        for (int t = 0; t < T; t++) {
            const float *source = d->qkv + (size_t)t * row;
            memcpy(d->q + (size_t)t * attention, source, (size_t)attention * sizeof(float));
            memcpy(d->k + (size_t)t * kv, source + attention, (size_t)kv * sizeof(float));
            memcpy(d->v + (size_t)t * kv, source + attention + kv, (size_t)kv * sizeof(float));
        }
        es_rotary(threads, d->q, d->positions, cos_table, sin_table, T, H, hd);
        es_rotary(threads, d->k, d->positions, cos_table, sin_table, T, kvH, hd);
        for (int t = 0; t < T; t++)
            for (int g = 0; g < kvH; g++) {
                size_t cell = (((size_t)token_slots[t] * kvH + g) * capacity + cells[t]) * hd;
                size_t from = ((size_t)t * kvH + g) * hd;
                memcpy(layer_keys + cell, d->k + from, (size_t)hd * sizeof(float));
                memcpy(layer_values + cell, d->v + from, (size_t)hd * sizeof(float));
            }
        status = es_attend(path, threads, layer_keys, layer_values, slots, kvH, capacity, hd, d->q, T, H,
                           token_slots, offsets, visible, d->scale, d->attended);
        if (status) return status;
        if ((status = matmul(path, threads, d->attended, T, &L->output, NULL, d->y))) return status;
        add(d->x, d->y, (int64_t)T * D);
        es_rms_norm(path, threads, d->x, L->post_norm, d->eps, d->h, T, D);
        if ((status = matmul(path, threads, d->h, T, &L->gate_up, NULL, d->gate_up))) return status;
        es_silu_mul_rows(path, threads, d->gate_up, d->gated, T, (long)F);
        if ((status = matmul(path, threads, d->gated, T, &L->down, NULL, d->y))) return status;
        add(d->x, d->y, (int64_t)T * D);
    }
    if (wanted_count == 0) return 0;
    for (int64_t w = 0; w < wanted_count; w++)
        memcpy(d->last + (size_t)w * D, d->x + (size_t)wanted[w] * D, (size_t)D * sizeof(float));
    es_rms_norm(path, threads, d->last, d->final_norm, d->eps, d->last_normed, (int)wanted_count, D);
    Int4 head = d->lm_head;
    head.n = columns; /* the first tiles, the same packed layout */
    return matmul(path, threads, d->last_normed, wanted_count, &head, NULL, logits);
}
