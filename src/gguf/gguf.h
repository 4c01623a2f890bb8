/*
 * gguf.h - reading and writing GGUF files (versions 2 and 3).
 *
 * Reader: the file is mapped read-only; keys, string values and tensor data
 * are slices of that mapping, valid until sb_gguf_close(). Parsing validates
 * the whole header before allocating anything, so a malformed file is
 * rejected with a message naming the offset and field, and no count in the
 * file can make the reader allocate more than the file holds.
 *
 * Writer: collects metadata and tensors in memory and writes a file that
 * llama.cpp reads (used by the synthetic model generator and the tests).
 */
#ifndef SB_GGUF_H
#define SB_GGUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "switchboard.h"

#define SB_GGUF_MAGIC 0x46554747u /* "GGUF" little-endian */
#define SB_GGUF_DEFAULT_ALIGNMENT 32
#define SB_GGUF_MAX_DIMS 4

/* Metadata value types, numbered as in the GGUF specification. */
typedef enum sb_gguf_vtype {
    SB_GGUF_UINT8 = 0,
    SB_GGUF_INT8 = 1,
    SB_GGUF_UINT16 = 2,
    SB_GGUF_INT16 = 3,
    SB_GGUF_UINT32 = 4,
    SB_GGUF_INT32 = 5,
    SB_GGUF_FLOAT32 = 6,
    SB_GGUF_BOOL = 7,
    SB_GGUF_STRING = 8,
    SB_GGUF_ARRAY = 9,
    SB_GGUF_UINT64 = 10,
    SB_GGUF_INT64 = 11,
    SB_GGUF_FLOAT64 = 12,
    SB_GGUF_VTYPE_COUNT
} sb_gguf_vtype;

const char *sb_gguf_vtype_name(sb_gguf_vtype type);

/* A length-delimited string inside the mapping (not NUL-terminated). */
typedef struct sb_gguf_str {
    const char *ptr;
    uint64_t len;
} sb_gguf_str;

typedef struct sb_gguf_kv {
    sb_gguf_str key;
    sb_gguf_vtype type;
    sb_gguf_vtype arr_type; /* element type when type == SB_GGUF_ARRAY */
    uint64_t arr_n;         /* element count when type == SB_GGUF_ARRAY */
    const uint8_t *value;   /* first byte of the value (of the first element for arrays) */
    uint64_t value_bytes;   /* bytes from `value` to the end of the value */
    uint64_t offset;        /* file offset of the key, for messages */
} sb_gguf_kv;

typedef struct sb_gguf_tensor {
    sb_gguf_str name;
    uint32_t n_dims;
    int64_t ne[SB_GGUF_MAX_DIMS]; /* ne[0] contiguous; unused dims are 1 */
    uint32_t type;                /* ggml type id (sb_type) */
    uint64_t offset;              /* relative to the start of the data section */
    uint64_t nbytes;
    const void *data;     /* inside the mapping */
    uint64_t info_offset; /* file offset of the tensor's header entry */
    bool dropped;         /* its bytes were consumed elsewhere (sb_gguf_drop): never read again */
} sb_gguf_tensor;

/* Names to entries (see gguf_read.c): slot = entry index + 1, 0 empty. */
typedef struct sb_gguf_index {
    uint64_t *slots;
    uint64_t cap; /* a power of two */
} sb_gguf_index;

typedef struct sb_gguf {
    uint32_t version;
    uint64_t n_kv;
    sb_gguf_kv *kv;
    uint64_t n_tensors;
    sb_gguf_tensor *tensors;
    uint32_t alignment;
    uint64_t data_offset; /* file offset of the tensor data section */
    const uint8_t *base;  /* the mapping (or caller buffer) */
    uint64_t size;
    bool mapped; /* base came from mmap (the file's, or a private copy's) and is unmapped on close */
    int fd;      /* a private image whose tensor data is not read yet (until sb_gguf_fill); else -1 */
    sb_gguf_index kv_index, tensor_index;
} sb_gguf;

/* Maps and parses `path`. On failure *out is NULL and err names the problem. */
sb_status sb_gguf_open(const char *path, sb_gguf **out, sb_error *err);
/* Opens `path` as a private image: once sb_gguf_fill has run, the result
 * never reads the file again, so the file may be replaced, rewritten or
 * truncated while it is in use. Only the header is read now; tensor data is
 * read by sb_gguf_bytes (into the caller's buffer: weights that are repacked
 * elsewhere never occupy the image) and by sb_gguf_fill (the rest, into the
 * image). Until sb_gguf_fill, tensor data must be reached through those two. */
sb_status sb_gguf_open_private(const char *path, sb_gguf **out, sb_error *err);
/* The `len` bytes of tensor data at `data` (a tensor's data pointer, or
 * inside one): `data` itself when they are in memory, else read from the
 * file into `buf` (len bytes), which is returned. NULL with err set when the
 * file no longer holds them (it shrank or failed while being read). */
const void *sb_gguf_bytes(const sb_gguf *gguf, const void *data, size_t len, void *buf, sb_error *err);
/* Says that the tensors inside [data, data+len) were copied elsewhere and
 * are not read again: a mapping's pages are released, a private image never
 * reads them. */
void sb_gguf_drop(sb_gguf *gguf, const void *data, size_t len);
/* A private image: reads every tensor not dropped into the image and closes
 * the file. A no-op for other opens. */
sb_status sb_gguf_fill(sb_gguf *gguf, sb_error *err);
/* Bytes of an opened file's image that are in memory now (0 for a caller's buffer). */
size_t sb_gguf_resident_bytes(const sb_gguf *gguf);
/* Parses a file image held by the caller, who keeps it alive until close. */
sb_status sb_gguf_open_memory(const void *data, uint64_t size, sb_gguf **out, sb_error *err);
void sb_gguf_close(sb_gguf *gguf);

/* Lookup by name (hashed); NULL if absent. */
const sb_gguf_kv *sb_gguf_find(const sb_gguf *gguf, const char *key);
const sb_gguf_tensor *sb_gguf_find_tensor(const sb_gguf *gguf, const char *name);

/* Typed getters. Each fails with SB_ERR_NOT_FOUND if the key is absent (use
 * the _or variants for optional keys) and SB_ERR_FORMAT if it holds another
 * type; integer getters accept any integer type whose value fits. */
sb_status sb_gguf_get_u32(const sb_gguf *gguf, const char *key, uint32_t *out, sb_error *err);
sb_status sb_gguf_get_i64(const sb_gguf *gguf, const char *key, int64_t *out, sb_error *err);
sb_status sb_gguf_get_f32(const sb_gguf *gguf, const char *key, float *out, sb_error *err);
sb_status sb_gguf_get_bool(const sb_gguf *gguf, const char *key, bool *out, sb_error *err);
sb_status sb_gguf_get_str(const sb_gguf *gguf, const char *key, sb_gguf_str *out, sb_error *err);
/* Optional keys: absent -> *out = def and SB_OK; wrong type -> SB_ERR_FORMAT. */
sb_status sb_gguf_get_u32_or(const sb_gguf *gguf, const char *key, uint32_t def, uint32_t *out, sb_error *err);
sb_status sb_gguf_get_f32_or(const sb_gguf *gguf, const char *key, float def, float *out, sb_error *err);
sb_status sb_gguf_get_bool_or(const sb_gguf *gguf, const char *key, bool def, bool *out, sb_error *err);

/* Arrays: checks that `key` is an array of `elem` and returns its length.
 * Elements of fixed-size type are read with sb_gguf_arr_elem; strings by
 * walking with sb_gguf_arr_strings (which fills n slices, n = *count). */
sb_status sb_gguf_get_arr(const sb_gguf *gguf, const char *key, sb_gguf_vtype elem, const sb_gguf_kv **out,
                          sb_error *err);
/* Element i of a numeric array as int64 / double (any numeric type; a
 * float as int64 goes toward zero, saturating; NaN gives INT64_MIN). */
int64_t sb_gguf_arr_i64(const sb_gguf_kv *kv, uint64_t i);
double sb_gguf_arr_f64(const sb_gguf_kv *kv, uint64_t i);
/* Fills out[0..kv->arr_n) with the strings of a (validated) string array. */
void sb_gguf_arr_strings(const sb_gguf_kv *kv, sb_gguf_str *out);

/* Size in bytes of one value of a scalar type (0 for STRING/ARRAY). */
size_t sb_gguf_vtype_size(sb_gguf_vtype type);
/* Scalar value of kv (numeric or bool) as double; kv must be scalar numeric. */
double sb_gguf_kv_f64(const sb_gguf_kv *kv);

/* ---- writer ---- */

typedef struct sb_gguf_writer sb_gguf_writer;

sb_gguf_writer *sb_gguf_writer_create(void); /* NULL if out of memory */
void sb_gguf_writer_free(sb_gguf_writer *w);
/* Setters copy their arguments. Errors (out of memory) are remembered and
 * reported by sb_gguf_writer_save, so call sites need no checks. */
void sb_gguf_set_u32(sb_gguf_writer *w, const char *key, uint32_t v);
void sb_gguf_set_i32(sb_gguf_writer *w, const char *key, int32_t v);
void sb_gguf_set_f32(sb_gguf_writer *w, const char *key, float v);
void sb_gguf_set_bool(sb_gguf_writer *w, const char *key, bool v);
void sb_gguf_set_str(sb_gguf_writer *w, const char *key, const char *v);
/* Array of fixed-size elements (n values of elem's size) or of strings. */
void sb_gguf_set_arr(sb_gguf_writer *w, const char *key, sb_gguf_vtype elem, const void *values, uint64_t n);
void sb_gguf_set_arr_str(sb_gguf_writer *w, const char *key, const char *const *values, uint64_t n);
/* Copies a metadata entry of an open file (e.g. a vocabulary). */
void sb_gguf_copy_kv(sb_gguf_writer *w, const sb_gguf_kv *kv);
/* Adds a tensor; `data` (nbytes, already in the tensor's type) is copied. */
void sb_gguf_add_tensor(sb_gguf_writer *w, const char *name, uint32_t type, uint32_t n_dims, const int64_t *ne,
                        const void *data, uint64_t nbytes);
/* Writes the file (version 3, alignment from general.alignment or 32). */
sb_status sb_gguf_writer_save(sb_gguf_writer *w, const char *path, sb_error *err);
/* Serializes into a heap buffer the caller frees with sb_free. */
sb_status sb_gguf_writer_to_memory(sb_gguf_writer *w, uint8_t **out, uint64_t *size, sb_error *err);

#endif
