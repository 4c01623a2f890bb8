/*
 * gguf_write.c - builds GGUF v3 files in memory and writes them out.
 *
 * Metadata is serialized as it is set (one growing byte buffer), tensors are
 * kept as copies until save, when their offsets are laid out with the file's
 * alignment. The first error (out of memory) is remembered and reported by
 * save, which keeps the generator's long lists of setters free of checks.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "base/base.h"
#include "gguf/gguf.h"

typedef struct bytes {
    uint8_t *data;
    uint64_t len, cap;
} bytes;

typedef struct pending_tensor {
    char *name;
    uint32_t type, n_dims;
    int64_t ne[SB_GGUF_MAX_DIMS];
    uint8_t *data;
    uint64_t nbytes;
} pending_tensor;

struct sb_gguf_writer {
    bytes kv;
    uint64_t n_kv;
    pending_tensor *tensors;
    uint64_t n_tensors, cap_tensors;
    uint32_t alignment;
    bool failed;
};

static void put(sb_gguf_writer *w, bytes *b, const void *p, uint64_t n) {
    if (w->failed || n == 0) /* nothing to copy: p may be NULL (a file without tensors) */
        return;
    if (b->len + n > b->cap) {
        uint64_t cap = b->cap ? b->cap : 4096;
        while (cap < b->len + n)
            cap *= 2;
        uint8_t *d = sb_realloc(b->data, cap);
        if (!d) {
            w->failed = true;
            return;
        }
        b->data = d;
        b->cap = cap;
    }
    memcpy(b->data + b->len, p, n);
    b->len += n;
}

static void put_u32(sb_gguf_writer *w, bytes *b, uint32_t v) { put(w, b, &v, 4); }
static void put_u64(sb_gguf_writer *w, bytes *b, uint64_t v) { put(w, b, &v, 8); }
static void put_str(sb_gguf_writer *w, bytes *b, const char *s) {
    uint64_t n = strlen(s);
    put_u64(w, b, n);
    put(w, b, s, n);
}

sb_gguf_writer *sb_gguf_writer_create(void) {
    sb_gguf_writer *w = sb_calloc(1, sizeof(*w));
    if (w)
        w->alignment = SB_GGUF_DEFAULT_ALIGNMENT;
    return w;
}

void sb_gguf_writer_free(sb_gguf_writer *w) {
    if (!w)
        return;
    for (uint64_t i = 0; i < w->n_tensors; i++) {
        sb_free(w->tensors[i].name);
        sb_free(w->tensors[i].data);
    }
    sb_free(w->tensors);
    sb_free(w->kv.data);
    sb_free(w);
}

static void put_key(sb_gguf_writer *w, const char *key, sb_gguf_vtype type) {
    put_str(w, &w->kv, key);
    put_u32(w, &w->kv, type);
    w->n_kv++;
}

void sb_gguf_set_u32(sb_gguf_writer *w, const char *key, uint32_t v) {
    put_key(w, key, SB_GGUF_UINT32);
    put_u32(w, &w->kv, v);
    if (strcmp(key, "general.alignment") == 0)
        w->alignment = v;
}

void sb_gguf_set_i32(sb_gguf_writer *w, const char *key, int32_t v) {
    put_key(w, key, SB_GGUF_INT32);
    put(w, &w->kv, &v, 4);
}

void sb_gguf_set_f32(sb_gguf_writer *w, const char *key, float v) {
    put_key(w, key, SB_GGUF_FLOAT32);
    put(w, &w->kv, &v, 4);
}

void sb_gguf_set_bool(sb_gguf_writer *w, const char *key, bool v) {
    uint8_t b = v;
    put_key(w, key, SB_GGUF_BOOL);
    put(w, &w->kv, &b, 1);
}

void sb_gguf_set_str(sb_gguf_writer *w, const char *key, const char *v) {
    put_key(w, key, SB_GGUF_STRING);
    put_str(w, &w->kv, v);
}

void sb_gguf_set_arr(sb_gguf_writer *w, const char *key, sb_gguf_vtype elem, const void *values, uint64_t n) {
    put_key(w, key, SB_GGUF_ARRAY);
    put_u32(w, &w->kv, elem);
    put_u64(w, &w->kv, n);
    put(w, &w->kv, values, n * sb_gguf_vtype_size(elem));
}

void sb_gguf_set_arr_str(sb_gguf_writer *w, const char *key, const char *const *values, uint64_t n) {
    put_key(w, key, SB_GGUF_ARRAY);
    put_u32(w, &w->kv, SB_GGUF_STRING);
    put_u64(w, &w->kv, n);
    for (uint64_t i = 0; i < n; i++)
        put_str(w, &w->kv, values[i]);
}

void sb_gguf_copy_kv(sb_gguf_writer *w, const sb_gguf_kv *kv) {
    put_u64(w, &w->kv, kv->key.len);
    put(w, &w->kv, kv->key.ptr, kv->key.len);
    put_u32(w, &w->kv, kv->type);
    w->n_kv++;
    if (kv->type == SB_GGUF_ARRAY) {
        put_u32(w, &w->kv, kv->arr_type);
        put_u64(w, &w->kv, kv->arr_n);
    }
    put(w, &w->kv, kv->value, kv->value_bytes);
}

void sb_gguf_add_tensor(sb_gguf_writer *w, const char *name, uint32_t type, uint32_t n_dims, const int64_t *ne,
                        const void *data, uint64_t nbytes) {
    if (w->failed)
        return;
    if (w->n_tensors == w->cap_tensors) {
        uint64_t cap = w->cap_tensors ? 2 * w->cap_tensors : 64;
        pending_tensor *t = sb_realloc(w->tensors, cap * sizeof(*t));
        if (!t) {
            w->failed = true;
            return;
        }
        w->tensors = t;
        w->cap_tensors = cap;
    }
    pending_tensor *t = &w->tensors[w->n_tensors];
    *t = (pending_tensor){.name = sb_strndup(name, strlen(name)), .type = type, .n_dims = n_dims, .nbytes = nbytes};
    t->data = sb_malloc(nbytes);
    if (!t->name || !t->data) {
        sb_free(t->name);
        sb_free(t->data);
        w->failed = true;
        return;
    }
    for (uint32_t d = 0; d < SB_GGUF_MAX_DIMS; d++)
        t->ne[d] = d < n_dims ? ne[d] : 1;
    memcpy(t->data, data, nbytes);
    w->n_tensors++;
}

static uint64_t align_up(uint64_t x, uint32_t a) { return (x + a - 1) / a * a; }

static const uint8_t zeros[256];

static void put_padding(sb_gguf_writer *w, bytes *b, uint32_t alignment) {
    for (uint64_t pad = align_up(b->len, alignment) - b->len; pad > 0;) {
        uint64_t n = SB_MIN(pad, sizeof(zeros));
        put(w, b, zeros, n);
        pad -= n;
    }
}

static bool write_zeros(FILE *f, uint64_t n) {
    for (; n > 0; n -= SB_MIN(n, sizeof(zeros)))
        if (fwrite(zeros, 1, SB_MIN(n, sizeof(zeros)), f) != SB_MIN(n, sizeof(zeros)))
            return false;
    return true;
}

/* Magic, counts, metadata and tensor infos, padded to the data section. */
static void build_header(sb_gguf_writer *w, bytes *b) {
    put_u32(w, b, SB_GGUF_MAGIC);
    put_u32(w, b, 3);
    put_u64(w, b, w->n_tensors);
    put_u64(w, b, w->n_kv);
    put(w, b, w->kv.data, w->kv.len);
    uint64_t offset = 0;
    for (uint64_t i = 0; i < w->n_tensors; i++) {
        const pending_tensor *t = &w->tensors[i];
        put_str(w, b, t->name);
        put_u32(w, b, t->n_dims);
        for (uint32_t d = 0; d < t->n_dims; d++)
            put_u64(w, b, (uint64_t)t->ne[d]);
        put_u32(w, b, t->type);
        put_u64(w, b, offset);
        offset = align_up(offset + t->nbytes, w->alignment);
    }
    put_padding(w, b, w->alignment);
}

static sb_status out_of_memory(sb_error *err) {
    return sb_fail(err, SB_ERR_NOMEM, "out of memory while building a GGUF file");
}

sb_status sb_gguf_writer_to_memory(sb_gguf_writer *w, uint8_t **out, uint64_t *size, sb_error *err) {
    bytes b = {0};
    build_header(w, &b);
    for (uint64_t i = 0; i < w->n_tensors; i++) {
        put(w, &b, w->tensors[i].data, w->tensors[i].nbytes);
        put_padding(w, &b, w->alignment);
    }
    if (w->failed) {
        sb_free(b.data);
        return out_of_memory(err);
    }
    *out = b.data;
    *size = b.len;
    return SB_OK;
}

/* Streams the tensors to the file instead of building the image in memory:
 * generated benchmark models are gigabytes. */
sb_status sb_gguf_writer_save(sb_gguf_writer *w, const char *path, sb_error *err) {
    bytes header = {0};
    build_header(w, &header);
    if (w->failed) {
        sb_free(header.data);
        return out_of_memory(err);
    }
    FILE *f = fopen(path, "wb");
    if (!f) {
        sb_free(header.data);
        return sb_fail(err, SB_ERR_IO, "%s: cannot create: %s", path, strerror(errno));
    }
    bool ok = fwrite(header.data, 1, header.len, f) == header.len;
    for (uint64_t i = 0; i < w->n_tensors && ok; i++) {
        const pending_tensor *t = &w->tensors[i];
        uint64_t pad = align_up(t->nbytes, w->alignment) - t->nbytes;
        ok = fwrite(t->data, 1, t->nbytes, f) == t->nbytes && write_zeros(f, pad);
    }
    ok = (fclose(f) == 0) && ok;
    sb_free(header.data);
    if (!ok)
        return sb_fail(err, SB_ERR_IO, "%s: write failed: %s", path, strerror(errno));
    return SB_OK;
}
