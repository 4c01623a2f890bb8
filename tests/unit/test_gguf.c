/*
 * test_gguf.c - the GGUF reader and writer: a writer/reader round trip of
 * every metadata type, the fixtures' headers, and a corpus of over 200
 * malformed files (each section truncated at its boundaries, absurd counts,
 * bad types, offsets past the end, overflowing sizes, duplicates, missing
 * metadata). Every malformed file must be rejected by sb_model_load with a
 * message that names the problem, without crashing (the suite runs again
 * under ASan+UBSan) and without allocating more than the file holds.
 */
#define _GNU_SOURCE /* memmem */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "base/base.h"
#include "gguf/gguf.h"
#include "model/synth.h"
#include "tensor/tensor.h"
#include "testutil.h"

static void test_roundtrip_all_types(void **state) {
    (void)state;
    sb_gguf_writer *w = sb_gguf_writer_create();
    uint8_t u8s[3] = {1, 2, 255};
    int16_t i16s[2] = {-5, 7};
    double f64s[2] = {1.5, -2.25};
    const char *strs[3] = {"a", "", "ünïcødé"};
    sb_gguf_set_u32(w, "k.u32", 123456);
    sb_gguf_set_i32(w, "k.i32", -42);
    sb_gguf_set_f32(w, "k.f32", 0.5f);
    sb_gguf_set_bool(w, "k.bool", true);
    sb_gguf_set_str(w, "k.str", "hello");
    sb_gguf_set_arr(w, "k.u8s", SB_GGUF_UINT8, u8s, 3);
    sb_gguf_set_arr(w, "k.i16s", SB_GGUF_INT16, i16s, 2);
    sb_gguf_set_arr(w, "k.f64s", SB_GGUF_FLOAT64, f64s, 2);
    sb_gguf_set_arr_str(w, "k.strs", strs, 3);
    float data[64];
    for (int i = 0; i < 64; i++)
        data[i] = (float)i;
    int64_t ne[2] = {32, 2};
    sb_gguf_add_tensor(w, "t0", SB_TYPE_F32, 2, ne, data, sizeof(data));
    sb_gguf_add_tensor(w, "t1", SB_TYPE_F32, 1, ne, data, 32 * sizeof(float));
    uint8_t *img;
    uint64_t size;
    sb_error err;
    assert_int_equal(sb_gguf_writer_to_memory(w, &img, &size, &err), SB_OK);
    sb_gguf_writer_free(w);

    sb_gguf *g;
    assert_int_equal(sb_gguf_open_memory(img, size, &g, &err), SB_OK);
    assert_int_equal(g->version, 3);
    assert_int_equal(g->n_kv, 9);
    assert_int_equal(g->n_tensors, 2);
    uint32_t u;
    int64_t i64;
    float f;
    bool b;
    sb_gguf_str s;
    assert_int_equal(sb_gguf_get_u32(g, "k.u32", &u, NULL), SB_OK);
    assert_int_equal(u, 123456);
    assert_int_equal(sb_gguf_get_i64(g, "k.i32", &i64, NULL), SB_OK);
    assert_int_equal(i64, -42);
    assert_int_equal(sb_gguf_get_u32(g, "k.i32", &u, &err), SB_ERR_FORMAT); /* negative into u32 */
    assert_int_equal(sb_gguf_get_f32(g, "k.f32", &f, NULL), SB_OK);
    assert_true(f == 0.5f);
    assert_int_equal(sb_gguf_get_bool(g, "k.bool", &b, NULL), SB_OK);
    assert_true(b);
    assert_int_equal(sb_gguf_get_str(g, "k.str", &s, NULL), SB_OK);
    assert_int_equal(s.len, 5);
    assert_memory_equal(s.ptr, "hello", 5);
    assert_int_equal(sb_gguf_get_str(g, "k.u32", &s, &err), SB_ERR_FORMAT);
    assert_non_null(strstr(err.msg, "k.u32"));
    assert_int_equal(sb_gguf_get_u32(g, "missing", &u, &err), SB_ERR_NOT_FOUND);
    assert_non_null(strstr(err.msg, "missing"));
    assert_int_equal(sb_gguf_get_u32_or(g, "missing", 7, &u, NULL), SB_OK);
    assert_int_equal(u, 7);

    const sb_gguf_kv *kv;
    assert_int_equal(sb_gguf_get_arr(g, "k.u8s", SB_GGUF_UINT8, &kv, NULL), SB_OK);
    assert_int_equal(kv->arr_n, 3);
    assert_int_equal(sb_gguf_arr_i64(kv, 2), 255);
    assert_int_equal(sb_gguf_get_arr(g, "k.i16s", SB_GGUF_INT16, &kv, NULL), SB_OK);
    assert_int_equal(sb_gguf_arr_i64(kv, 0), -5);
    assert_int_equal(sb_gguf_get_arr(g, "k.f64s", SB_GGUF_FLOAT64, &kv, NULL), SB_OK);
    assert_true(sb_gguf_arr_f64(kv, 1) == -2.25);
    assert_int_equal(sb_gguf_get_arr(g, "k.strs", SB_GGUF_UINT8, &kv, &err), SB_ERR_FORMAT);
    assert_int_equal(sb_gguf_get_arr(g, "k.strs", SB_GGUF_STRING, &kv, NULL), SB_OK);
    sb_gguf_str out[3];
    sb_gguf_arr_strings(kv, out);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(out[i].len, strlen(strs[i]));
        assert_memory_equal(out[i].ptr, strs[i], out[i].len);
    }
    const sb_gguf_tensor *t = sb_gguf_find_tensor(g, "t0");
    assert_non_null(t);
    assert_int_equal(t->ne[0], 32);
    assert_int_equal(t->ne[1], 2);
    assert_int_equal(t->nbytes, sizeof(data));
    assert_int_equal((uintptr_t)t->data % 32, (uintptr_t)img % 32);
    assert_memory_equal(t->data, data, sizeof(data));
    t = sb_gguf_find_tensor(g, "t1");
    assert_int_equal(t->n_dims, 1);
    assert_int_equal(t->offset % 32, 0);
    assert_null(sb_gguf_find_tensor(g, "t2"));
    sb_gguf_close(g);
    sb_free(img);
}

static void test_fixture_headers(void **state) {
    (void)state;
    const char *files[] = {"models/stories260K.gguf", "models/stories260K-f16.gguf", "models/stories260K-q8_0.gguf",
                           "models/stories260K-q4_0.gguf", "models/llama2-vocab-tiny-random.gguf",
                           "models/llama3-vocab-tiny-random.gguf", "models/qwen2-vocab-tiny-random.gguf"};
    for (size_t i = 0; i < SB_ARRAY_LEN(files); i++) {
        sb_gguf *g;
        sb_error err;
        assert_int_equal(sb_gguf_open(sb_test_fixture(files[i]), &g, &err), SB_OK);
        assert_int_equal(g->version, 3);
        assert_int_equal(g->alignment, 32);
        sb_gguf_str arch;
        assert_int_equal(sb_gguf_get_str(g, "general.architecture", &arch, NULL), SB_OK);
        assert_memory_equal(arch.ptr, "llama", 5);
        assert_non_null(sb_gguf_find_tensor(g, "token_embd.weight"));
        sb_gguf_close(g);
    }
    sb_gguf *g;
    assert_int_equal(sb_gguf_open(sb_test_fixture("models/stories260K.gguf"), &g, NULL), SB_OK);
    assert_int_equal(g->n_tensors, 47);
    sb_gguf_close(g);
}

/* ---- the malformed corpus ---------------------------------------------- */

typedef struct image {
    uint8_t *data;
    uint64_t size;
} image;

typedef struct corpus {
    image valid;
    sb_gguf *g; /* parsed valid image, for offsets */
    int count, failures;
    size_t worst_extra; /* max over files of peak heap - file size */
    char path[256];
} corpus;

static uint64_t rd64(const image *im, uint64_t at) {
    uint64_t v;
    memcpy(&v, im->data + at, 8);
    return v;
}

/* A message says where: it names an offset, a quoted field, tensor or key,
 * a metadata key of the file, or the file being empty. */
static bool names_where(const char *msg) {
    return strstr(msg, "offset ") || strchr(msg, '\'') || strstr(msg, "llama.") || strstr(msg, "tokenizer.") ||
           strstr(msg, "empty file");
}

/* Loads one malformed image as a model file; it must fail with a message
 * containing `expect` (a fragment naming the problem; "" where the damage
 * can surface as several problems) that says where. */
static void check_bad(corpus *c, const uint8_t *data, uint64_t size, const char *what, const char *expect) {
    FILE *f = fopen(c->path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(data, 1, size, f), size);
    fclose(f);
    sb_error err = {0};
    sb_model_t *m = NULL;
    sb_test_count_allocs_begin();
    sb_status st = sb_model_load(c->path, &m, &err);
    bool loaded = m != NULL;
    sb_model_free(m);
    size_t live = sb_test_live_bytes();
    size_t peak = sb_test_count_allocs_end();
    c->count++;
    size_t extra = peak > size ? peak - size : 0;
    if (extra > c->worst_extra)
        c->worst_extra = extra;
    bool ok = st != SB_OK && !loaded && err.msg[0] && strstr(err.msg, expect) && names_where(err.msg) && live == 0 &&
              peak <= size + 64 * 1024;
    if (!ok) {
        c->failures++;
        fprintf(stderr, "malformed case '%s' (%llu bytes): status %d, peak heap %zu, leaked %zu, message: %s\n", what,
                (unsigned long long)size, st, peak, live, err.msg);
        fprintf(stderr, "  expected a failure mentioning '%s'\n", expect);
    }
}

/* A copy of the valid image with `len` bytes at `at` replaced. */
static void check_patch(corpus *c, uint64_t at, const void *bytes, size_t len, const char *what, const char *expect) {
    uint8_t *d = malloc(c->valid.size);
    memcpy(d, c->valid.data, c->valid.size);
    memcpy(d + at, bytes, len);
    check_bad(c, d, c->valid.size, what, expect);
    free(d);
}

static void check_patch64(corpus *c, uint64_t at, uint64_t v, const char *what, const char *expect) {
    check_patch(c, at, &v, 8, what, expect);
}

static void check_patch32(corpus *c, uint64_t at, uint32_t v, const char *what, const char *expect) {
    check_patch(c, at, &v, 4, what, expect);
}

static void check_truncated(corpus *c, uint64_t len, const char *section) {
    char what[96];
    snprintf(what, sizeof(what), "truncated to %llu bytes (%s)", (unsigned long long)len, section);
    /* Cutting into the header reports a truncation (or a length/count that
     * runs past the end); cutting into tensor data reports the tensor. */
    const char *expect = len == 0 ? "empty" : len < c->g->data_offset ? "" : "past the end";
    check_bad(c, c->valid.data, len, what, expect);
}

static const sb_gguf_kv *kv_named(corpus *c, const char *key) {
    const sb_gguf_kv *kv = sb_gguf_find(c->g, key);
    assert_non_null(kv);
    return kv;
}

/* Replaces the bytes of a string in the valid image by another of the same length. */
static void check_rename(corpus *c, const char *from, const char *to, const char *what, const char *expect) {
    size_t n = strlen(from);
    assert_int_equal(n, strlen(to));
    const uint8_t *p = memmem(c->valid.data, c->valid.size, from, n);
    assert_non_null(p);
    check_patch(c, (uint64_t)(p - c->valid.data), to, n, what, expect);
}

static void test_malformed_corpus(void **state) {
    (void)state;
    corpus c = {0};
    snprintf(c.path, sizeof(c.path), "%s/malformed.gguf", sb_test_tmpdir());
    sb_synth_params p = sb_synth_default_params();
    p.dim = 32;
    p.hidden = 64;
    p.layers = 1;
    p.heads = 4;
    p.kv_heads = 2;
    p.vocab = 300;
    p.type = SB_TYPE_Q8_0;
    sb_gguf_writer *w;
    assert_int_equal(sb_synth_build(&p, &w, NULL), SB_OK);
    assert_int_equal(sb_gguf_writer_to_memory(w, &c.valid.data, &c.valid.size, NULL), SB_OK);
    sb_gguf_writer_free(w);
    assert_int_equal(sb_gguf_open_memory(c.valid.data, c.valid.size, &c.g, NULL), SB_OK);

    /* The valid image itself loads (the corpus is relative to a good file). */
    FILE *f = fopen(c.path, "wb");
    fwrite(c.valid.data, 1, c.valid.size, f);
    fclose(f);
    sb_model_t *m;
    sb_error err;
    assert_int_equal(sb_model_load(c.path, &m, &err), SB_OK);
    sb_model_free(m);

    /* 1. Truncation at every section boundary, and one byte either side. */
    uint64_t bounds[4096];
    size_t nb = 0;
    uint64_t fixed[] = {0, 4, 8, 16, 24};
    for (size_t i = 0; i < SB_ARRAY_LEN(fixed); i++)
        bounds[nb++] = fixed[i];
    for (uint64_t i = 0; i < c.g->n_kv; i++) {
        const sb_gguf_kv *kv = &c.g->kv[i];
        bounds[nb++] = kv->offset;                                    /* key length */
        bounds[nb++] = kv->offset + 8 + kv->key.len;                  /* value type */
        bounds[nb++] = (uint64_t)(kv->value - c.valid.data);          /* value */
    }
    for (uint64_t i = 0; i < c.g->n_tensors; i++) {
        const sb_gguf_tensor *t = &c.g->tensors[i];
        uint64_t dims_at = t->info_offset + 8 + t->name.len + 4;
        bounds[nb++] = t->info_offset;
        bounds[nb++] = dims_at;                        /* dimensions */
        bounds[nb++] = dims_at + 8 * t->n_dims;        /* type */
        bounds[nb++] = dims_at + 8 * t->n_dims + 4;    /* offset */
        bounds[nb++] = c.g->data_offset + t->offset;   /* data */
        bounds[nb++] = c.g->data_offset + t->offset + t->nbytes / 2;
    }
    bounds[nb++] = c.g->data_offset;
    for (size_t i = 0; i < nb; i++) {
        for (int d = -1; d <= 1; d++) {
            uint64_t len = bounds[i] + (uint64_t)d;
            if (bounds[i] == 0 && d < 0)
                continue;
            if (len < c.valid.size)
                check_truncated(&c, len, "section boundary");
        }
    }
    const sb_gguf_tensor *last = &c.g->tensors[c.g->n_tensors - 1];
    check_truncated(&c, c.g->data_offset + last->offset + last->nbytes - 1, "last byte of tensor data");

    /* 2. The file header. */
    check_patch32(&c, 0, 0x46554746, "bad magic", "bad magic");
    check_patch32(&c, 0, 0x67676a74, "ggjt magic", "not a GGUF file");
    uint32_t versions[] = {0, 1, 4, 0xffffffff};
    for (size_t i = 0; i < SB_ARRAY_LEN(versions); i++)
        check_patch32(&c, 4, versions[i], "bad version", "unsupported GGUF version");
    uint64_t counts[] = {UINT64_MAX, 1ull << 63, 1ull << 32, 1000000};
    for (size_t i = 0; i < SB_ARRAY_LEN(counts); i++) {
        check_patch64(&c, 8, counts[i], "absurd tensor count", "tensor count");
        check_patch64(&c, 16, counts[i], "absurd metadata count", "metadata count");
    }
    check_patch64(&c, 8, c.g->n_tensors + 1, "one tensor too many", "");
    check_patch64(&c, 16, c.g->n_kv + 1, "one metadata entry too many", "");
    check_patch64(&c, 16, c.g->n_kv - 1, "one metadata entry too few", "");
    check_patch64(&c, 8, 0, "no tensors", "missing tensor");

    /* 3. Every metadata entry: key length, value type, string/array lengths. */
    for (uint64_t i = 0; i < c.g->n_kv; i++) {
        const sb_gguf_kv *kv = &c.g->kv[i];
        uint64_t type_at = kv->offset + 8 + kv->key.len;
        check_patch64(&c, kv->offset, UINT64_MAX, "key length = 2^64-1", "past the end");
        check_patch64(&c, kv->offset, c.valid.size, "key length = file size", "past the end");
        check_patch64(&c, kv->offset, 0, "empty key", "key length 0");
        check_patch32(&c, type_at, 13, "value type 13", "unknown value type 13");
        check_patch32(&c, type_at, 0xffffffff, "value type 2^32-1", "unknown value type");
        if (kv->type == SB_GGUF_STRING) {
            check_patch64(&c, type_at + 4, UINT64_MAX - 3, "string length overflow", "past the end");
            check_patch64(&c, type_at + 4, c.valid.size - type_at, "string length past end", "past the end");
        }
        if (kv->type == SB_GGUF_ARRAY) {
            check_patch32(&c, type_at + 4, SB_GGUF_ARRAY, "nested array", "unsupported array element type");
            check_patch32(&c, type_at + 4, 77, "array element type 77", "unsupported array element type");
            check_patch64(&c, type_at + 8, UINT64_MAX, "array count 2^64-1", "does not fit");
            check_patch64(&c, type_at + 8, 1ull << 61, "array count 2^61", "does not fit");
            check_patch64(&c, type_at + 8, kv->arr_n + 1, "array count one too many", "");
        }
        if (kv->type == SB_GGUF_BOOL)
            check_patch(&c, (uint64_t)(kv->value - c.valid.data), "\x02", 1, "bool value 2", "not 0 or 1");
    }
    const sb_gguf_kv *align = kv_named(&c, "general.alignment");
    uint64_t align_at = (uint64_t)(align->value - c.valid.data);
    check_patch32(&c, align_at, 0, "alignment 0", "not a power of two");
    check_patch32(&c, align_at, 48, "alignment 48", "not a power of two");
    check_patch32(&c, align_at, 64, "alignment 64 (tensors misaligned)", "alignment");
    check_patch32(&c, align_at - 4, SB_GGUF_INT32, "alignment as int32", "expected uint32");

    /* 4. Every tensor info: dimensions, type, offset. */
    for (uint64_t i = 0; i < c.g->n_tensors; i++) {
        const sb_gguf_tensor *t = &c.g->tensors[i];
        uint64_t ndims_at = t->info_offset + 8 + t->name.len, dims_at = ndims_at + 4;
        uint64_t type_at = dims_at + 8 * t->n_dims, off_at = type_at + 4;
        check_patch64(&c, t->info_offset, UINT64_MAX, "tensor name length 2^64-1", "past the end");
        check_patch64(&c, t->info_offset, 0, "empty tensor name", "name length 0");
        check_patch32(&c, ndims_at, 0, "0 dimensions", "0 dimensions");
        check_patch32(&c, ndims_at, 5, "5 dimensions", "5 dimensions");
        check_patch32(&c, ndims_at, 0x7fffffff, "2^31 dimensions", "dimensions");
        check_patch64(&c, dims_at, 0, "zero dimension", "is zero or overflows");
        check_patch64(&c, dims_at, 1ull << 62, "dimension 2^62", "");
        check_patch64(&c, dims_at, UINT64_MAX, "dimension 2^64-1", "is zero or overflows");
        if (t->n_dims == 2)
            check_patch64(&c, dims_at + 8, 1ull << 40, "2^40 rows (size overflow)", "");
        check_patch32(&c, type_at, 4, "retired type id 4", "unknown type id 4");
        check_patch32(&c, type_at, 40, "type id 40", "unknown type id 40");
        check_patch32(&c, type_at, 0xffffffff, "type id 2^32-1", "unknown type id");
        check_patch64(&c, off_at, rd64(&c.valid, off_at) + 1, "misaligned data offset", "not a multiple of the alignment");
        check_patch64(&c, off_at, c.valid.size, "data offset = file size", "past the end");
        check_patch64(&c, off_at, UINT64_MAX - 31, "data offset overflow", "past the end");
    }
    /* A type whose rows do not split into blocks, and one we cannot compute. */
    const sb_gguf_tensor *tq = sb_gguf_find_tensor(c.g, "blk.0.attn_q.weight");
    uint64_t tq_type_at = tq->info_offset + 8 + tq->name.len + 4 + 8 * tq->n_dims;
    check_patch32(&c, tq_type_at, SB_TYPE_Q4_K, "q4_K rows of 32", "not a multiple of the q4_K block");

    /* 5. Duplicates, missing and wrong metadata, missing tensors. */
    check_rename(&c, "blk.0.attn_k.weight", "blk.0.attn_q.weight", "duplicate tensor name", "duplicate tensor name");
    check_rename(&c, "general.file_type", "llama.block_count", "duplicate metadata key", "duplicate metadata key");
    check_rename(&c, "llama.block_count", "llama.block_cpunt", "missing block_count", "missing metadata 'llama.block_count'");
    check_rename(&c, "llama.embedding_length", "llama.embedding_lengtx", "missing embedding_length", "missing metadata");
    check_rename(&c, "general.architecture", "general.architecturx", "missing architecture", "general.architecture");
    check_rename(&c, "tokenizer.ggml.tokens", "tokenizer.ggml.tokenz", "missing vocabulary", "tokenizer.ggml.tokens");
    check_rename(&c, "output_norm.weight", "output_norm.weighx", "missing output_norm", "missing tensor 'output_norm.weight'");
    check_rename(&c, "blk.0.ffn_down.weight", "blk.0.ffn_down.weighx", "missing ffn_down", "missing tensor");
    check_rename(&c, "token_embd.weight", "token_embd.weighx", "missing token_embd", "missing tensor 'token_embd.weight'");
    const sb_gguf_kv *arch = kv_named(&c, "general.architecture");
    check_patch(&c, (uint64_t)(arch->value - c.valid.data) + 8, "gptx2", 5, "unknown architecture", "unsupported architecture 'gptx2'");
    const sb_gguf_kv *heads = kv_named(&c, "llama.attention.head_count");
    check_patch32(&c, (uint64_t)(heads->value - c.valid.data), 3, "head_count not dividing dim", "not a multiple");
    check_patch32(&c, (uint64_t)(heads->value - c.valid.data), 0, "head_count 0", "out of range");
    check_patch32(&c, (uint64_t)(heads->value - c.valid.data) - 4, SB_GGUF_STRING, "head_count as string", "");
    const sb_gguf_kv *blocks = kv_named(&c, "llama.block_count");
    check_patch32(&c, (uint64_t)(blocks->value - c.valid.data), 2, "block_count larger than the tensors", "block_count 2 needs at least");
    check_patch32(&c, (uint64_t)(blocks->value - c.valid.data), 0xffffffff, "block_count 2^32-1", "out of range");
    const sb_gguf_kv *embd = kv_named(&c, "llama.embedding_length");
    check_patch32(&c, (uint64_t)(embd->value - c.valid.data), 64, "embedding_length disagreeing with tensors", "shape");
    const sb_gguf_kv *types = kv_named(&c, "tokenizer.ggml.token_type");
    check_patch32(&c, (uint64_t)(types->value - c.valid.data) - 8 - 4, SB_GGUF_FLOAT32, "token types as float", "");
    const sb_gguf_kv *bos = kv_named(&c, "tokenizer.ggml.bos_token_id");
    check_patch32(&c, (uint64_t)(bos->value - c.valid.data), 100000, "bos id out of range", "bos");

    /* 6. Garbage: random bytes after a valid magic and version. */
    uint8_t junk[4096];
    uint64_t x = 12345;
    for (int k = 0; k < 16; k++) {
        for (size_t i = 0; i < sizeof(junk); i++)
            junk[i] = (uint8_t)((x = x * 6364136223846793005ull + 1442695040888963407ull) >> 56);
        memcpy(junk, "GGUF\3\0\0\0", 8);
        check_bad(&c, junk, sizeof(junk), "random bytes after the header", "");
    }

    fprintf(stderr, "malformed corpus: %d files, %d failures; largest heap peak beyond the file size: %zu bytes\n",
            c.count, c.failures, c.worst_extra);
    assert_true(c.count >= 200);
    assert_int_equal(c.failures, 0);
    unlink(c.path);
    sb_gguf_close(c.g);
    sb_free(c.valid.data);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roundtrip_all_types),
        cmocka_unit_test(test_fixture_headers),
        cmocka_unit_test(test_malformed_corpus),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
