/*
 * matmul.c - matrix times activations, and row lookup, on top of the type
 * table's kernels.
 *
 * This is the reference path: one thread, the table's scalar kernels. Each
 * activation row is converted once to the weights' vec_dot_type (as
 * llama.cpp's CPU backend does before its dot products), then every output
 * is one vec_dot. Threaded and SIMD versions are checked against it.
 */
#include <assert.h>

#include "tensor/tensor.h"

size_t sb_matmul_work_size(sb_type type, int64_t n_in, int64_t n_tok) {
    const sb_type_traits *t = sb_type_traits_of(type);
    assert(t && t->vec_dot && n_tok >= 0);
    return sb_type_row_size(t->vec_dot_type, n_in) * (size_t)n_tok;
}

void sb_matmul(sb_type type, const void *w, int64_t n_in, int64_t n_out, const float *x, int64_t n_tok, float *y,
               void *work) {
    const sb_type_traits *t = sb_type_traits_of(type);
    assert(t && t->vec_dot && n_in % t->blck_size == 0);
    const sb_type_traits *xt = sb_type_traits_of(t->vec_dot_type);
    const size_t w_row = sb_type_row_size(type, n_in);
    const size_t x_row = sb_type_row_size(t->vec_dot_type, n_in);
    char *xq = work;

    for (int64_t tok = 0; tok < n_tok; tok++)
        xt->act_from_float(x + tok * n_in, xq + (size_t)tok * x_row, n_in);

    /* Row-outer: a weight row is read from memory once for all tokens. */
    for (int64_t r = 0; r < n_out; r++) {
        const char *wr = (const char *)w + (size_t)r * w_row;
        for (int64_t tok = 0; tok < n_tok; tok++)
            y[tok * n_out + r] = t->vec_dot(n_in, wr, xq + (size_t)tok * x_row);
    }
}

void sb_get_row(sb_type type, const void *w, int64_t n_in, int64_t row, float *out) {
    const sb_type_traits *t = sb_type_traits_of(type);
    assert(t && t->to_float && n_in % t->blck_size == 0);
    t->to_float((const char *)w + (size_t)row * sb_type_row_size(type, n_in), out, n_in);
}
