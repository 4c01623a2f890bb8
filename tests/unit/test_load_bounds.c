/*
 * test_load_bounds.c - a model file cannot make the loader allocate more
 * than its size justifies, nor run longer: small crafted files that ask for
 * a huge block_count, tensor count, array length or string length, or whose
 * tensors share bytes, are refused at once (well under a second) with a
 * message naming the field, the heap peak (counted through the allocator
 * hook) near the file's own size and far under 100 MB; a valid file with
 * thousands of layers loads in time linear in its size.
 */
#define _GNU_SOURCE /* memmem */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "base/base.h"
#include "gguf/gguf.h"
#include "model/model.h"
#include "model/synth.h"
#include "testutil.h"

#define MB ((size_t)1 << 20)

typedef struct image {
    uint8_t *data;
    uint64_t size;
} image;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* A synthetic Q8_0 model of `layers` layers (dim 32) as a file image. */
static image small_model(int32_t layers) {
    sb_synth_params p = sb_synth_default_params();
    p.dim = 32;
    p.hidden = 64;
    p.layers = layers;
    p.heads = 4;
    p.kv_heads = 2;
    p.vocab = 300;
    p.type = SB_TYPE_Q8_0;
    sb_gguf_writer *w;
    image im;
    assert_int_equal(sb_synth_build(&p, &w, NULL), SB_OK);
    assert_int_equal(sb_gguf_writer_to_memory(w, &im.data, &im.size, NULL), SB_OK);
    sb_gguf_writer_free(w);
    return im;
}

/* File offset of the value of metadata `key` in im. */
static uint64_t value_at(const image *im, const char *key) {
    sb_gguf *g;
    assert_int_equal(sb_gguf_open_memory(im->data, im->size, &g, NULL), SB_OK);
    const sb_gguf_kv *kv = sb_gguf_find(g, key);
    assert_non_null(kv);
    uint64_t at = (uint64_t)(kv->value - im->data);
    sb_gguf_close(g);
    return at;
}

/* Loads im from memory: refused with a message containing `expect`, in
 * under a second, the heap peak within 64 KiB of the file size, no leak. */
static void expect_refused(const image *im, const char *what, const char *expect) {
    sb_error err = {0};
    sb_model *m = NULL;
    double t0 = now_s();
    sb_test_count_allocs_begin();
    sb_status st = sb__model_load_memory(im->data, im->size, &m, &err);
    sb_model_free(m);
    size_t live = sb_test_live_bytes();
    size_t peak = sb_test_count_allocs_end();
    double dt = now_s() - t0;
    fprintf(stderr, "%-44s %8llu bytes: %.3f s, heap peak %zu: %s\n", what, (unsigned long long)im->size, dt, peak,
            err.msg);
    assert_int_not_equal(st, SB_OK);
    assert_null(m);
    assert_non_null(strstr(err.msg, expect));
    assert_int_equal(live, 0);
    assert_true(peak <= im->size + 64 * 1024 && peak < 100 * MB);
    assert_true(dt < 1.0);
}

static void patch32(image *im, uint64_t at, uint32_t v) { memcpy(im->data + at, &v, 4); }
static void patch64(image *im, uint64_t at, uint64_t v) { memcpy(im->data + at, &v, 8); }

/* D1: block_count far beyond the tensors (the probe's files asked for 10 and 46 GB). */
static void test_huge_block_count(void **state) {
    (void)state;
    image im = small_model(2);
    uint64_t at = value_at(&im, "llama.block_count");
    uint32_t counts[] = {3, 1000, 10000000, 1u << 30};
    for (size_t i = 0; i < SB_ARRAY_LEN(counts); i++) {
        patch32(&im, at, counts[i]);
        char what[64];
        snprintf(what, sizeof what, "block_count %u", counts[i]);
        expect_refused(&im, what, "block_count");
    }
    /* Through the file path too, as the server loads it. */
    char path[256];
    snprintf(path, sizeof path, "%s/blocks.gguf", sb_test_tmpdir());
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(im.data, 1, im.size, f), im.size);
    fclose(f);
    sb_model_t *m = NULL;
    sb_error err;
    sb_test_count_allocs_begin();
    assert_int_not_equal(sb_model_load(path, &m, &err), SB_OK);
    size_t peak = sb_test_count_allocs_end();
    assert_true(peak < im.size + 64 * 1024);
    assert_non_null(strstr(err.msg, "llama.block_count 1073741824 needs at least"));
    remove(path);
    sb_free(im.data);
}

/* Enough tensors for the count, but not the last layer's. */
static void test_last_layer_missing(void **state) {
    (void)state;
    image im = small_model(4);
    uint64_t at = value_at(&im, "llama.block_count");
    patch32(&im, at, 5); /* 5 layers' required tensors would need 45; the file has 39 */
    expect_refused(&im, "block_count 5 of 4 layers", "needs at least");
    patch32(&im, at, 4);
    uint8_t *p = memmem(im.data, im.size, "blk.3.attn_norm.weight", 22);
    assert_non_null(p);
    p[4] = '9'; /* blk.9.attn_norm.weight: layer 3 has no norm */
    expect_refused(&im, "last layer's attn_norm renamed", "tensor 'blk.3.attn_norm.weight' of its last layer");
    sb_free(im.data);
}

/* Counts and lengths in the header that the bytes cannot hold. */
static void test_huge_counts_and_lengths(void **state) {
    (void)state;
    image im = small_model(1);
    uint8_t *orig = malloc(im.size);
    memcpy(orig, im.data, im.size);
    uint64_t huge[] = {1ull << 62, UINT64_MAX, 1ull << 32};
    for (size_t i = 0; i < SB_ARRAY_LEN(huge); i++) {
        memcpy(im.data, orig, im.size);
        patch64(&im, 8, huge[i]);
        expect_refused(&im, "tensor count", "tensor count");
        memcpy(im.data, orig, im.size);
        patch64(&im, 16, huge[i]);
        expect_refused(&im, "metadata count", "metadata count");
        memcpy(im.data, orig, im.size);
        uint64_t tokens = value_at(&im, "tokenizer.ggml.tokens"); /* element type, count, strings */
        patch64(&im, tokens - 8, huge[i]);
        expect_refused(&im, "token array length", "does not fit");
        memcpy(im.data, orig, im.size);
        patch64(&im, tokens, huge[i]); /* the first token's length */
        expect_refused(&im, "token string length", "past the end");
        memcpy(im.data, orig, im.size);
        uint64_t arch = value_at(&im, "general.architecture");
        patch64(&im, arch, huge[i]);
        expect_refused(&im, "architecture string length", "past the end");
    }
    free(orig);
    sb_free(im.data);
}

/* Tensors that each lie inside the data section but together claim more
 * than it holds (they share bytes): the packed copy would multiply the
 * file's size. Ten 4 KiB tensors, each grown to the whole 40 KiB section. */
static void test_overlapping_tensors(void **state) {
    (void)state;
    sb_gguf_writer *w = sb_gguf_writer_create();
    static float zeros[1024];
    for (int i = 0; i < 10; i++) {
        char name[8];
        snprintf(name, sizeof name, "t%d", i);
        sb_gguf_add_tensor(w, name, SB_TYPE_F32, 1, (const int64_t[]){1024}, zeros, sizeof zeros);
    }
    image im;
    assert_int_equal(sb_gguf_writer_to_memory(w, &im.data, &im.size, NULL), SB_OK);
    sb_gguf_writer_free(w);
    sb_gguf *g;
    assert_int_equal(sb_gguf_open_memory(im.data, im.size, &g, NULL), SB_OK);
    uint64_t ne_at[10];
    for (int i = 0; i < 10; i++)
        ne_at[i] = g->tensors[i].info_offset + 8 + g->tensors[i].name.len + 4;
    sb_gguf_close(g);
    for (int i = 0; i < 10; i++) {
        patch64(&im, ne_at[i], 10 * 1024);
        patch64(&im, ne_at[i] + 8 + 4, 0); /* after the dimension and the type: the offset */
    }
    sb_error err = {0};
    assert_int_not_equal(sb_gguf_open_memory(im.data, im.size, &g, &err), SB_OK);
    assert_non_null(strstr(err.msg, "tensor 't1'"));
    assert_non_null(strstr(err.msg, "tensors overlap"));
    sb_free(im.data);
}

/* D2: float32 token types far outside int64 (1.7e38, NaN) are refused as
 * token types, not converted with undefined behaviour. */
static void test_float_array_as_int(void **state) {
    (void)state;
    sb_gguf_writer *w = sb_gguf_writer_create();
    float v[] = {1.7e38f, -1.7e38f, __builtin_nanf(""), 3.9f, -2.5f, 9.3e18f};
    sb_gguf_set_arr(w, "f", SB_GGUF_FLOAT32, v, SB_ARRAY_LEN(v));
    uint64_t big[] = {UINT64_MAX};
    sb_gguf_set_arr(w, "u", SB_GGUF_UINT64, big, 1);
    uint8_t *data;
    uint64_t size;
    assert_int_equal(sb_gguf_writer_to_memory(w, &data, &size, NULL), SB_OK);
    sb_gguf_writer_free(w);
    sb_gguf *g;
    assert_int_equal(sb_gguf_open_memory(data, size, &g, NULL), SB_OK);
    const sb_gguf_kv *f = sb_gguf_find(g, "f"), *u = sb_gguf_find(g, "u");
    assert_true(sb_gguf_arr_i64(f, 0) == INT64_MAX);
    assert_true(sb_gguf_arr_i64(f, 1) == INT64_MIN);
    assert_true(sb_gguf_arr_i64(f, 2) == INT64_MIN);
    assert_int_equal(sb_gguf_arr_i64(f, 3), 3);
    assert_int_equal(sb_gguf_arr_i64(f, 4), -2);
    assert_true(sb_gguf_arr_i64(f, 5) == INT64_MAX);
    assert_true(sb_gguf_arr_i64(u, 0) == INT64_MAX);
    sb_gguf_close(g);
    sb_free(data);

    /* In a model: token types as huge floats name the token type. */
    image im = small_model(1);
    uint64_t types = value_at(&im, "tokenizer.ggml.token_type");
    patch32(&im, types - 12, SB_GGUF_FLOAT32);
    float huge = 1.7e38f;
    memcpy(im.data + types, &huge, 4);
    sb_error err = {0};
    sb_model *m = NULL;
    sb_status st = sb__model_load_memory(im.data, im.size, &m, &err);
    if (st == SB_OK) /* a reader may also accept float types it can convert; then the value must be sane */
        sb_model_free(m);
    else
        assert_non_null(strstr(err.msg, "token_type"));
    sb_free(im.data);
}

/* Thousands of layers (a valid file): binding every tensor by name is
 * hashed, so the load stays linear in the file (before the index it was
 * quadratic in the tensor count). The last layer's ffn_down is renamed, so
 * the loader binds all the others, then fails naming it. */
static void test_many_layers_linear(void **state) {
    (void)state;
    image im = small_model(3000);
    uint8_t *p = memmem(im.data, im.size, "blk.2999.ffn_down.weight", 24);
    assert_non_null(p);
    p[21] = 'x';
    expect_refused(&im, "3000 layers, the last ffn_down missing", "missing tensor 'blk.2999.ffn_down.weight'");
    sb_free(im.data);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_huge_block_count),     cmocka_unit_test(test_last_layer_missing),
        cmocka_unit_test(test_huge_counts_and_lengths), cmocka_unit_test(test_overlapping_tensors),
        cmocka_unit_test(test_float_array_as_int),   cmocka_unit_test(test_many_layers_linear),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
