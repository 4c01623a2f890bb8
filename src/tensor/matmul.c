/*
 * matmul.c - matrix times activations on the thread pool, and row lookup.
 *
 * Two parallel loops: every activation row is converted once to the weights'
 * vec_dot_type (as llama.cpp's CPU backend does before its dot products),
 * then the weight rows are cut into chunks that threads claim one at a time;
 * a chunk computes its rows for every token (the dispatch table's gemm), so
 * each weight row is read from memory once per call however many tokens
 * there are. Every kernel level computes each (row, token) result exactly
 * as the scalar reference does, so results depend neither on the thread
 * count, nor on the batch, nor on the CPU.
 */
#include <assert.h>

#include "tensor/tensor.h"
#include "tensor/threadpool.h"

size_t sb_matmul_work_size(sb_type type, int64_t n_in, int64_t n_tok) {
    const sb_type_traits *t = sb_type_traits_of(type);
    assert(t && t->vec_dot && n_tok >= 0);
    return sb_type_row_size(t->vec_dot_type, n_in) * (size_t)n_tok;
}

typedef struct matmul_job {
    sb_gemm_fn gemm;
    sb_from_float_fn convert;
    const char *w;
    size_t w_row, x_row;
    int64_t n_in, n_out, n_tok, rows_per_chunk;
    const float *x;
    char *xq;
    float *y;
} matmul_job;

static void convert_row(void *arg, int64_t tok, int ith) {
    (void)ith;
    const matmul_job *j = arg;
    j->convert(j->x + tok * j->n_in, j->xq + (size_t)tok * j->x_row, j->n_in);
}

static void dot_rows(void *arg, int64_t chunk, int ith) {
    (void)ith;
    const matmul_job *j = arg;
    int64_t r0 = chunk * j->rows_per_chunk, r1 = r0 + j->rows_per_chunk;
    if (r1 > j->n_out)
        r1 = j->n_out;
    j->gemm(j->n_in, j->w + (size_t)r0 * j->w_row, j->w_row, r1 - r0, j->xq, j->x_row, j->n_tok, j->y + r0,
            (size_t)j->n_out);
}

/* Rows per chunk: enough chunks that a descheduled thread holds up little
 * work (about 16 per thread), few enough that claiming costs nothing. */
static int64_t chunk_rows(int64_t n_out, int n_threads) {
    int64_t rows = n_out / (16 * (int64_t)n_threads);
    rows = rows < 4 ? 4 : rows > 256 ? 256 : rows;
    return (rows + 3) / 4 * 4;
}

void sb_matmul(sb_threadpool *tp, sb_type type, const void *w, int64_t n_in, int64_t n_out, const float *x,
               int64_t n_tok, float *y, void *work) {
    const sb_type_traits *t = sb_type_traits_of(type);
    const sb_kernels *k = sb_kernels_active();
    assert(t && t->vec_dot && n_in % t->blck_size == 0);
    matmul_job j = {
        .gemm = k->gemm[type],
        .convert = k->act_from_float[t->vec_dot_type],
        .w = w,
        .w_row = sb_type_row_size(type, n_in),
        .x_row = sb_type_row_size(t->vec_dot_type, n_in),
        .n_in = n_in,
        .n_out = n_out,
        .n_tok = n_tok,
        .rows_per_chunk = chunk_rows(n_out, sb_threadpool_n_threads(tp)),
        .x = x,
        .xq = work,
        .y = y,
    };
    sb_threadpool_for(tp, n_tok, convert_row, &j);
    sb_threadpool_for(tp, (n_out + j.rows_per_chunk - 1) / j.rows_per_chunk, dot_rows, &j);
}

void sb_get_row(sb_type type, const void *w, int64_t n_in, int64_t row, float *out) {
    const sb_type_traits *t = sb_type_traits_of(type);
    assert(t && t->to_float && n_in % t->blck_size == 0);
    t->to_float((const char *)w + (size_t)row * sb_type_row_size(type, n_in), out, n_in);
}
