/*
 * matmul.c - matrix times activations on the thread pool, and row lookup.
 *
 * One parallel loop of two phases: every activation row is converted once to
 * the weights' vec_dot_type (as llama.cpp's CPU backend does before its dot
 * products), then the weight rows are cut into chunks that threads claim one
 * at a time; a chunk computes its rows for every token (the dispatch table's
 * gemm), so each weight row is read from memory once per call however many
 * tokens there are. Every kernel level computes each (row, token) result
 * exactly as the scalar reference does, so results depend neither on the
 * thread count, nor on the batch, nor on the CPU.
 */

#include "base/base.h"
#include "tensor/tensor.h"
#include "tensor/threadpool.h"

/* Bytes of one converted activation row: the vec_dot_type row, then the
 * packed gemm's terms when the matrices are packed. */
static size_t act_row_size(sb_type type, int64_t n_in, bool packed) {
    const sb_type_traits *t = sb_type_traits_of(type);
    const sb_packing *p = &sb_kernels_active()->packing[type];
    return sb_type_row_size(t->vec_dot_type, n_in) + (packed ? (size_t)(n_in / t->blck_size) * p->term_bytes : 0);
}

size_t sb_matmul_work_size(sb_type type, int64_t n_in, int64_t n_tok) {
    SB_ASSERT(sb_type_traits_of(type) && sb_type_traits_of(type)->vec_dot && n_tok >= 0);
    return act_row_size(type, n_in, sb_kernels_active()->packing[type].rows > 0) * (size_t)n_tok;
}

typedef struct matmul_part {
    sb_gemm_fn gemm;
    const char *w;
    size_t w_row;
    int64_t n_out, rows_per_chunk, first_chunk;
    float *y, *residual;
} matmul_part;

typedef struct matmul_job {
    sb_from_float_fn convert;
    void (*terms)(const void *x, int64_t n, void *dst); /* the packed gemm's, or NULL */
    size_t x_row, x_plain;                              /* converted row; its vec_dot_type part */
    int64_t n_in, n_tok;
    const float *x;
    const sb_matmul_prep *prep; /* or NULL */
    char *xq;
    matmul_part part[SB_MATMUL_MAX];
    int n_parts;
} matmul_job;

static void convert_row(void *arg, int64_t tok, int ith) {
    (void)ith;
    const matmul_job *j = arg;
    char *row = j->xq + (size_t)tok * j->x_row;
    const float *x = j->x + tok * j->n_in;
    if (j->prep) {
        float *out = j->prep->out + tok * j->n_in;
        j->prep->row(j->prep->ctx, tok, out, x, j->n_in);
        x = out;
    }
    j->convert(x, row, j->n_in);
    if (j->terms)
        j->terms(row, j->n_in, row + j->x_plain);
}

/* Chunk `chunk`'s rows. The pool gives each thread a range of adjacent
 * chunks, run in order, so the kernels' prefetch of the rows after a chunk
 * lands in the chunk the same thread takes next (1 stream +14%, 8 streams
 * +3-7% against threads taking turns, 110M Q4_0, 2 threads). */
static void dot_rows(void *arg, int64_t chunk, int ith) {
    (void)ith;
    const matmul_job *j = arg;
    const matmul_part *p = &j->part[0];
    while (p + 1 < j->part + j->n_parts && chunk >= p[1].first_chunk)
        p++;
    int64_t r0 = (chunk - p->first_chunk) * p->rows_per_chunk, r1 = r0 + p->rows_per_chunk;
    if (r1 > p->n_out)
        r1 = p->n_out;
    p->gemm(j->n_in, p->w + (size_t)r0 * p->w_row, p->w_row, r1 - r0, j->xq, j->x_row, j->n_tok, p->y + r0,
            (size_t)p->n_out);
    if (p->residual)
        for (int64_t t = 0; t < j->n_tok; t++)
            for (int64_t r = r0; r < r1; r++)
                p->residual[t * p->n_out + r] += p->y[t * p->n_out + r];
}

/* Rows per chunk: enough chunks that the threads end a loop together
 * (about 2 per thread: one to steal from a thread that started late),
 * few enough that a chunk's start (its first rows cold, its activations
 * read again) is a small part of it: with the activations' conversion in
 * the loop, 2 per thread measured 4% faster than 8 at 8 streams and 5% at
 * 1 (110M Q4_0, 2 threads, alternated; 1.1B and prompts unchanged), and 8
 * per thread 6% faster than 16 before. A descheduled thread holds up its
 * chunk until it runs again, whatever the size; a sustained neighbour
 * sends the loops to the caller alone (threadpool.c). A multiple of 16,
 * the largest tile and packing group. */
static int64_t chunk_rows(int64_t n_out, int n_threads) {
    int64_t rows = n_out / (2 * (int64_t)n_threads);
    rows = rows < 16 ? 16 : rows > 256 ? 256 : rows;
    return (rows + 15) / 16 * 16;
}

bool sb_weight_packable(sb_type type, int64_t n_in, int64_t n_out) {
    const sb_type_traits *t = sb_type_traits_of(type);
    const sb_packing *p = &sb_kernels_active()->packing[type];
    return t && t->vec_dot && p->rows > 0 && n_in > 0 && n_in % t->blck_size == 0 && n_out > 0 &&
           n_out % p->rows == 0;
}

int64_t sb_weight_pack_rows(sb_type type) {
    return sb_type_traits_of(type) ? sb_kernels_active()->packing[type].rows : 0;
}

void sb_weight_pack(sb_type type, const void *src, void *dst, int64_t n_in, int64_t n_out) {
    SB_ASSERT(sb_weight_packable(type, n_in, n_out));
    sb_kernels_active()->packing[type].pack(src, dst, n_in, n_out);
}

void sb_matmul_many(sb_threadpool *tp, const sb_matmul_dst *dst, int n, int64_t n_in, const float *x, int64_t n_tok,
                    const sb_matmul_prep *prep, void *work) {
    SB_ASSERT(n >= 1 && n <= SB_MATMUL_MAX);
    const sb_kernels *k = sb_kernels_active();
    const sb_type act = sb_type_traits_of(dst[0].type)->vec_dot_type;
    /* One activation format for all: the same vec_dot_type, and packed
     * matrices whose types share one kind of terms (they follow every row). */
    int packed_type = -1;
    bool one_format = true;
    for (int i = 0; i < n; i++) {
        one_format = one_format && sb_type_traits_of(dst[i].type)->vec_dot_type == act;
        if (dst[i].packed && k->packing[dst[i].type].terms) {
            one_format = one_format && (packed_type < 0 || k->packing[packed_type].terms == k->packing[dst[i].type].terms);
            packed_type = (int)dst[i].type;
        }
    }
    if (!one_format) {
        for (int m = 0; m < n; m++) /* the first prepares the rows, the others read them */
            sb_matmul_many(tp, &dst[m], 1, n_in, m > 0 && prep ? prep->out : x, n_tok, m > 0 ? NULL : prep, work);
        return;
    }
    matmul_job j = {
        .convert = k->act_from_float[act],
        .terms = packed_type >= 0 ? k->packing[packed_type].terms : NULL,
        .x_row = packed_type >= 0 ? act_row_size((sb_type)packed_type, n_in, true) : sb_type_row_size(act, n_in),
        .x_plain = sb_type_row_size(act, n_in),
        .n_in = n_in,
        .n_tok = n_tok,
        .x = x,
        .prep = prep,
        .xq = work,
        .n_parts = n,
    };
    int64_t n_chunks = 0;
    for (int i = 0; i < n; i++) {
        SB_ASSERT(sb_type_traits_of(dst[i].type)->vec_dot && n_in % sb_type_traits_of(dst[i].type)->blck_size == 0);
        SB_ASSERT(!dst[i].packed ||
               (k->packing[dst[i].type].rows > 0 && dst[i].n_out % k->packing[dst[i].type].rows == 0));
        matmul_part *p = &j.part[i];
        *p = (matmul_part){
            .gemm = dst[i].packed ? k->packing[dst[i].type].gemm : k->gemm[dst[i].type],
            .w = dst[i].w,
            .w_row = sb_type_row_size(dst[i].type, n_in),
            .n_out = dst[i].n_out,
            .rows_per_chunk = chunk_rows(dst[i].n_out, sb_threadpool_n_threads(tp)),
            .first_chunk = n_chunks,
            .y = dst[i].y,
            .residual = dst[i].residual,
        };
        n_chunks += (p->n_out + p->rows_per_chunk - 1) / p->rows_per_chunk;
    }
    sb_threadpool_for_then(tp, n_tok, convert_row, n_chunks, dot_rows, &j);
}

void sb_matmul(sb_threadpool *tp, sb_type type, const void *w, int64_t n_in, int64_t n_out, const float *x,
               int64_t n_tok, float *y, void *work) {
    sb_matmul_dst d = {.type = type, .w = w, .n_out = n_out, .y = y};
    sb_matmul_many(tp, &d, 1, n_in, x, n_tok, NULL, work);
}

/* The largest block of a packed type (Q6_K's 210 bytes). */
#define MAX_PACKED_BLOCK 256

void sb_get_row(sb_type type, const void *w, int64_t n_in, int64_t row, bool packed, float *out) {
    const sb_type_traits *t = sb_type_traits_of(type);
    SB_ASSERT(t && t->to_float && n_in % t->blck_size == 0);
    const size_t row_size = sb_type_row_size(type, n_in);
    if (!packed) {
        t->to_float((const char *)w + (size_t)row * row_size, out, n_in);
        return;
    }
    /* A block at a time: each back in the type's layout, then converted as
     * the unpacked row's would be (to_float works block by block). */
    const sb_packing *p = &sb_kernels_active()->packing[type];
    SB_ASSERT(p->row_block && t->type_size <= MAX_PACKED_BLOCK);
    const char *group = (const char *)w + (size_t)(row / p->rows) * (size_t)p->rows * row_size;
    uint8_t block[MAX_PACKED_BLOCK];
    for (int64_t b = 0; b < n_in / t->blck_size; b++) {
        p->row_block(group, n_in, (int)(row % p->rows), b, block);
        t->to_float(block, out + b * t->blck_size, t->blck_size);
    }
}
