/*
 * fuzz_gguf.c - the GGUF reader and the whole model load from memory
 * (architecture, tensors, vocabulary, packing). Any input must be refused
 * with a message or loaded; never a crash, leak or undefined behaviour, and
 * the heap peak stays within what the input's size justifies (the bound of
 * issue 17: 16 bytes per input byte plus 1 MiB). A loaded model also
 * tokenizes and detokenizes a line.
 */
#include <stdint.h>
#include <string.h>

#include "fuzz_common.h"
#include "gguf/gguf.h"
#include "model/model.h"

/* Reads every accessor of every entry: what a caller of the reader may do. */
static void walk(const sb_gguf *g) {
    for (uint64_t i = 0; i < g->n_kv; i++) {
        const sb_gguf_kv *kv = &g->kv[i];
        char key[300];
        snprintf(key, sizeof key, "%.*s", (int)SB_MIN(kv->key.len, 256), kv->key.ptr);
        int64_t iv;
        float fv;
        bool bv;
        sb_gguf_str sv;
        uint32_t uv;
        const sb_gguf_kv *arr;
        sb_gguf_get_i64(g, key, &iv, NULL);
        sb_gguf_get_u32(g, key, &uv, NULL);
        sb_gguf_get_f32(g, key, &fv, NULL);
        sb_gguf_get_bool(g, key, &bv, NULL);
        sb_gguf_get_str(g, key, &sv, NULL);
        if (kv->type != SB_GGUF_ARRAY && kv->type != SB_GGUF_STRING)
            (void)sb_gguf_kv_f64(kv);
        if (kv->type == SB_GGUF_ARRAY && sb_gguf_get_arr(g, key, kv->arr_type, &arr, NULL) == SB_OK) {
            if (kv->arr_type == SB_GGUF_STRING) {
                sb_gguf_str *s = sb_calloc(kv->arr_n + 1, sizeof *s);
                if (s)
                    sb_gguf_arr_strings(kv, s);
                sb_free(s);
            } else if (sb_gguf_vtype_size(kv->arr_type)) {
                for (uint64_t j = 0; j < kv->arr_n && j < 64; j++) {
                    (void)sb_gguf_arr_i64(kv, j);
                    (void)sb_gguf_arr_f64(kv, j);
                }
            }
        }
    }
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        if (memchr(g->tensors[i].name.ptr, '\0', g->tensors[i].name.len))
            continue; /* a name with a NUL inside cannot be asked for as a C string */
        char name[300];
        snprintf(name, sizeof name, "%.*s", (int)g->tensors[i].name.len, g->tensors[i].name.ptr);
        if (sb_gguf_find_tensor(g, name) != &g->tensors[i])
            abort(); /* names are unique, so the index finds each */
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_count_begin();
    sb_gguf *g = NULL;
    if (sb_gguf_open_memory(data, size, &g, NULL) == SB_OK)
        walk(g);
    sb_gguf_close(g);
    sb_model *m = NULL;
    sb_error err;
    if (sb__model_load_memory(data, size, &m, &err) == SB_OK) {
        int32_t ids[64];
        size_t n = 0;
        char out[512];
        if (sb_tokenize(m, "Hello world, fuzz!", 18, true, true, ids, 64, &n, NULL) == SB_OK)
            sb_detokenize(m, ids, n, true, false, out, sizeof out, &n, NULL);
    }
    sb_model_free(m);
    size_t peak = fuzz_count_end();
    if (peak > 16 * size + ((size_t)1 << 20)) {
        fprintf(stderr, "fuzz_gguf: a %zu-byte input took a heap peak of %zu bytes\n", size, peak);
        abort();
    }
    return 0;
}
