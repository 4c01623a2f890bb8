/*
 * gguf_read.c - the GGUF parser and its accessors.
 *
 * The header is walked three times by one function, parse():
 *   1. validate every field and find where the data section starts;
 *   2. validate every tensor against the data section's bounds;
 *   3. (only for a file that passed both) record keys and tensors.
 * So nothing is allocated for a file until all its counts and lengths are
 * known to fit in it, and each check lives in exactly one place.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/base.h"
#include "gguf/gguf.h"
#include "tensor/tensor.h"

static const char *const vtype_names[SB_GGUF_VTYPE_COUNT] = {
    "uint8", "int8", "uint16", "int16", "uint32", "int32", "float32",
    "bool", "string", "array", "uint64", "int64", "float64",
};

const char *sb_gguf_vtype_name(sb_gguf_vtype type) {
    return (unsigned)type < SB_GGUF_VTYPE_COUNT ? vtype_names[type] : "invalid";
}

size_t sb_gguf_vtype_size(sb_gguf_vtype type) {
    switch (type) {
    case SB_GGUF_UINT8: case SB_GGUF_INT8: case SB_GGUF_BOOL: return 1;
    case SB_GGUF_UINT16: case SB_GGUF_INT16: return 2;
    case SB_GGUF_UINT32: case SB_GGUF_INT32: case SB_GGUF_FLOAT32: return 4;
    case SB_GGUF_UINT64: case SB_GGUF_INT64: case SB_GGUF_FLOAT64: return 8;
    default: return 0;
    }
}

/* ---- cursor over the file image ---- */

typedef struct cursor {
    const uint8_t *base;
    uint64_t size;
    uint64_t pos;
    sb_error *err;
} cursor;

static sb_status truncated(cursor *c, uint64_t need, const char *what) {
    return sb_fail(c->err, SB_ERR_FORMAT, "truncated: %s at offset %llu needs %llu bytes, file has %llu", what,
                   (unsigned long long)c->pos, (unsigned long long)need, (unsigned long long)(c->size - c->pos));
}

static sb_status take(cursor *c, uint64_t n, const char *what, const uint8_t **out) {
    if (n > c->size - c->pos)
        return truncated(c, n, what);
    *out = c->base + c->pos;
    c->pos += n;
    return SB_OK;
}

static sb_status read_u32(cursor *c, const char *what, uint32_t *v) {
    const uint8_t *p = NULL;
    sb_status st = take(c, 4, what, &p);
    if (st == SB_OK)
        memcpy(v, p, 4);
    return st;
}

static sb_status read_u64(cursor *c, const char *what, uint64_t *v) {
    const uint8_t *p = NULL;
    sb_status st = take(c, 8, what, &p);
    if (st == SB_OK)
        memcpy(v, p, 8);
    return st;
}

static sb_status read_str(cursor *c, const char *what, sb_gguf_str *s) {
    uint64_t at = c->pos, len;
    const uint8_t *p = NULL;
    sb_status st = read_u64(c, what, &len);
    if (st != SB_OK)
        return st;
    if (len > c->size - c->pos)
        return sb_fail(c->err, SB_ERR_FORMAT, "%s at offset %llu has length %llu, past the end of the file (%llu bytes)",
                       what, (unsigned long long)at, (unsigned long long)len, (unsigned long long)c->size);
    take(c, len, what, &p);
    s->ptr = (const char *)p;
    s->len = len;
    return SB_OK;
}

/* Skips one metadata value of `type` (elements of an array when in_array). */
static sb_status skip_value(cursor *c, sb_gguf_vtype type, const char *key, sb_gguf_vtype *arr_type, uint64_t *arr_n) {
    uint64_t at = c->pos;
    const uint8_t *p = NULL;
    size_t size = sb_gguf_vtype_size(type);
    if (size) {
        sb_status st = take(c, size, "metadata value", &p);
        if (st == SB_OK && type == SB_GGUF_BOOL && *p > 1)
            return sb_fail(c->err, SB_ERR_FORMAT, "metadata '%s' at offset %llu: bool value %u is not 0 or 1", key,
                           (unsigned long long)at, *p);
        return st;
    }
    if (type == SB_GGUF_STRING) {
        sb_gguf_str s;
        return read_str(c, "metadata string value", &s);
    }
    if (type != SB_GGUF_ARRAY)
        return sb_fail(c->err, SB_ERR_FORMAT, "metadata '%s' at offset %llu: unknown value type %u", key,
                       (unsigned long long)at, (unsigned)type);
    uint32_t et;
    uint64_t n;
    sb_status st = read_u32(c, "array element type", &et);
    if (st == SB_OK)
        st = read_u64(c, "array length", &n);
    if (st != SB_OK)
        return st;
    if (et == SB_GGUF_ARRAY || et >= SB_GGUF_VTYPE_COUNT)
        return sb_fail(c->err, SB_ERR_FORMAT, "metadata '%s' at offset %llu: unsupported array element type %u", key,
                       (unsigned long long)at, et);
    *arr_type = et;
    *arr_n = n;
    size_t esize = sb_gguf_vtype_size(et);
    /* Every element takes at least `min` bytes, so a count that cannot fit
     * in the rest of the file is rejected before any loop runs. */
    uint64_t min = esize ? esize : 8;
    if (n > (c->size - c->pos) / min)
        return sb_fail(c->err, SB_ERR_FORMAT,
                       "metadata '%s' at offset %llu: array of %llu %s elements does not fit in the %llu bytes left",
                       key, (unsigned long long)at, (unsigned long long)n, sb_gguf_vtype_name(et),
                       (unsigned long long)(c->size - c->pos));
    if (esize && et != SB_GGUF_BOOL)
        return take(c, n * esize, "array data", &p);
    for (uint64_t i = 0; i < n; i++) {
        sb_gguf_vtype unused_t;
        uint64_t unused_n;
        st = skip_value(c, et, key, &unused_t, &unused_n);
        if (st != SB_OK)
            return st;
    }
    return SB_OK;
}

static bool str_eq(sb_gguf_str s, const char *z) { return s.len == strlen(z) && memcmp(s.ptr, z, s.len) == 0; }

/* Parses the header. `fill` records entries into g->kv / g->tensors (sized
 * by an earlier pass); g->data_offset == 0 means it is not known yet, and
 * tensor bounds are then not checked. */
static sb_status parse(sb_gguf *g, sb_error *err, bool fill) {
    cursor c = {g->base, g->size, 0, err};
    uint32_t magic, version;
    uint64_t n_tensors, n_kv;
    sb_status st = read_u32(&c, "magic", &magic);
    if (st != SB_OK)
        return st;
    if (magic != SB_GGUF_MAGIC)
        return sb_fail(err, SB_ERR_FORMAT, "not a GGUF file: bad magic 0x%08x at offset 0 (expected \"GGUF\")", magic);
    if ((st = read_u32(&c, "version", &version)) != SB_OK)
        return st;
    if (version != 2 && version != 3)
        return sb_fail(err, SB_ERR_UNSUPPORTED, "unsupported GGUF version %u at offset 4 (supported: 2, 3)", version);
    if ((st = read_u64(&c, "tensor count", &n_tensors)) != SB_OK || (st = read_u64(&c, "metadata count", &n_kv)) != SB_OK)
        return st;
    g->version = version;

    /* A metadata entry takes at least 13 bytes (key length, type, one byte);
     * a tensor info at least 32 (name length, n_dims, one dim, type, offset). */
    if (n_kv > (c.size - c.pos) / 13)
        return sb_fail(err, SB_ERR_FORMAT, "metadata count %llu at offset 16 cannot fit in a %llu-byte file",
                       (unsigned long long)n_kv, (unsigned long long)c.size);
    if (n_tensors > (c.size - c.pos) / 32)
        return sb_fail(err, SB_ERR_FORMAT, "tensor count %llu at offset 8 cannot fit in a %llu-byte file",
                       (unsigned long long)n_tensors, (unsigned long long)c.size);

    uint32_t alignment = SB_GGUF_DEFAULT_ALIGNMENT;
    uint64_t tensor_bytes = 0; /* the data all tensors claim, at most the data section's size */
    for (uint64_t i = 0; i < n_kv; i++) {
        sb_gguf_kv kv = {.offset = c.pos};
        uint32_t type;
        char what[64];
        snprintf(what, sizeof(what), "key of metadata entry %llu", (unsigned long long)i);
        if ((st = read_str(&c, what, &kv.key)) != SB_OK)
            return st;
        if (kv.key.len == 0 || kv.key.len > 65535)
            return sb_fail(err, SB_ERR_FORMAT, "metadata entry %llu at offset %llu: key length %llu is not in 1..65535",
                           (unsigned long long)i, (unsigned long long)kv.offset, (unsigned long long)kv.key.len);
        char key[96];
        snprintf(key, sizeof(key), "%.*s", (int)SB_MIN(kv.key.len, 80), kv.key.ptr);
        if ((st = read_u32(&c, "metadata value type", &type)) != SB_OK)
            return st;
        if (type >= SB_GGUF_VTYPE_COUNT)
            return sb_fail(err, SB_ERR_FORMAT, "metadata '%s' at offset %llu: unknown value type %u", key,
                           (unsigned long long)kv.offset, type);
        kv.type = type;
        /* Array values start after the element type and count. */
        uint64_t value_at = c.pos + (type == SB_GGUF_ARRAY ? 12 : 0);
        if ((st = skip_value(&c, kv.type, key, &kv.arr_type, &kv.arr_n)) != SB_OK)
            return st;
        kv.value = g->base + value_at;
        kv.value_bytes = c.pos - value_at;
        if (str_eq(kv.key, "general.alignment")) {
            if (kv.type != SB_GGUF_UINT32)
                return sb_fail(err, SB_ERR_FORMAT, "metadata 'general.alignment' has type %s, expected uint32",
                               sb_gguf_vtype_name(kv.type));
            memcpy(&alignment, kv.value, 4);
            if (alignment == 0 || (alignment & (alignment - 1)) != 0)
                return sb_fail(err, SB_ERR_FORMAT, "metadata 'general.alignment' = %u is not a power of two", alignment);
        }
        if (fill)
            g->kv[i] = kv;
    }

    for (uint64_t i = 0; i < n_tensors; i++) {
        uint64_t at = c.pos;
        sb_gguf_tensor t = {.info_offset = at};
        char what[64];
        snprintf(what, sizeof(what), "name of tensor %llu", (unsigned long long)i);
        if ((st = read_str(&c, what, &t.name)) != SB_OK)
            return st;
        char name[96];
        snprintf(name, sizeof(name), "%.*s", (int)SB_MIN(t.name.len, 80), t.name.ptr);
        if (t.name.len == 0 || t.name.len > 255)
            return sb_fail(err, SB_ERR_FORMAT, "tensor %llu at offset %llu: name length %llu is not in 1..255",
                           (unsigned long long)i, (unsigned long long)at, (unsigned long long)t.name.len);
        if ((st = read_u32(&c, "tensor dimension count", &t.n_dims)) != SB_OK)
            return st;
        if (t.n_dims < 1 || t.n_dims > SB_GGUF_MAX_DIMS)
            return sb_fail(err, SB_ERR_FORMAT, "tensor '%s' at offset %llu: %u dimensions (supported: 1..%d)", name,
                           (unsigned long long)at, t.n_dims, SB_GGUF_MAX_DIMS);
        uint64_t n_elems = 1;
        for (uint32_t d = 0; d < SB_GGUF_MAX_DIMS; d++) {
            uint64_t ne = 1;
            if (d < t.n_dims && (st = read_u64(&c, "tensor dimension", &ne)) != SB_OK)
                return st;
            if (ne == 0 || ne > INT64_MAX || sb_mul_overflows(n_elems, ne, &n_elems) || n_elems > INT64_MAX)
                return sb_fail(err, SB_ERR_FORMAT, "tensor '%s' at offset %llu: dimension %u = %llu is zero or overflows",
                               name, (unsigned long long)at, d, (unsigned long long)ne);
            t.ne[d] = (int64_t)ne;
        }
        if ((st = read_u32(&c, "tensor type", &t.type)) != SB_OK || (st = read_u64(&c, "tensor offset", &t.offset)) != SB_OK)
            return st;
        const sb_type_traits *tr = sb_type_traits_of(t.type);
        if (!tr)
            return sb_fail(err, SB_ERR_FORMAT, "tensor '%s' at offset %llu: unknown type id %u", name,
                           (unsigned long long)at, t.type);
        if (t.ne[0] % tr->blck_size != 0)
            return sb_fail(err, SB_ERR_FORMAT, "tensor '%s': row of %lld elements is not a multiple of the %s block (%u)",
                           name, (long long)t.ne[0], tr->name, tr->blck_size);
        if (sb_mul_overflows(n_elems / tr->blck_size, tr->type_size, &t.nbytes))
            return sb_fail(err, SB_ERR_FORMAT, "tensor '%s': size overflows", name);
        if (t.offset % alignment != 0)
            return sb_fail(err, SB_ERR_FORMAT, "tensor '%s': data offset %llu is not a multiple of the alignment %u", name,
                           (unsigned long long)t.offset, alignment);
        if (g->data_offset) {
            uint64_t end;
            if (sb_add_overflows(t.offset, t.nbytes, &end) || end > g->size - g->data_offset)
                return sb_fail(err, SB_ERR_FORMAT,
                               "tensor '%s': data [%llu, +%llu bytes) lies past the end of the data section (%llu bytes)",
                               name, (unsigned long long)t.offset, (unsigned long long)t.nbytes,
                               (unsigned long long)(g->size - g->data_offset));
            /* Tensors sharing bytes would let a small file stand for more
             * weights than it holds (and the packed copy grow past it). */
            if (sb_add_overflows(tensor_bytes, t.nbytes, &tensor_bytes) || tensor_bytes > g->size - g->data_offset)
                return sb_fail(err, SB_ERR_FORMAT,
                               "tensor '%s' at offset %llu: the tensors up to it claim more bytes than the %llu of the "
                               "data section (tensors overlap)",
                               name, (unsigned long long)at, (unsigned long long)(g->size - g->data_offset));
            t.data = g->base + g->data_offset + t.offset;
        }
        if (fill)
            g->tensors[i] = t;
    }

    uint64_t data_offset = (c.pos + alignment - 1) / alignment * alignment;
    if (n_tensors > 0 && data_offset > c.size)
        return sb_fail(err, SB_ERR_FORMAT, "truncated: data section should start at offset %llu, file has %llu bytes",
                       (unsigned long long)data_offset, (unsigned long long)c.size);
    g->n_kv = n_kv;
    g->n_tensors = n_tensors;
    g->alignment = alignment;
    g->data_offset = data_offset;
    return SB_OK;
}

static uint64_t hash_str(sb_gguf_str s) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (uint64_t i = 0; i < s.len; i++)
        h = (h ^ (uint8_t)s.ptr[i]) * 1099511628211ull;
    return h;
}

static bool same_str(sb_gguf_str a, sb_gguf_str b) { return a.len == b.len && memcmp(a.ptr, b.ptr, a.len) == 0; }

/* The name of item i of n strings `stride` apart. */
static const sb_gguf_str *name_at(const void *items, size_t stride, uint64_t i) {
    return (const sb_gguf_str *)((const char *)items + i * stride);
}

/* Builds an open-addressing index (slot: item index + 1, 0 empty) over n
 * names, reporting the first that occurs twice. Lookups through it keep a
 * loader that asks for every tensor of every layer linear in the file. */
static sb_status build_index(const void *items, uint64_t n, size_t stride, const char *what, sb_gguf_index *out,
                             sb_error *err) {
    uint64_t cap = 16;
    while (cap < 2 * n)
        cap *= 2;
    out->cap = cap;
    out->slots = sb_calloc(cap, sizeof(*out->slots));
    if (!out->slots)
        return sb_fail(err, SB_ERR_NOMEM, "out of memory indexing %s names", what);
    for (uint64_t i = 0; i < n; i++) {
        const sb_gguf_str *s = name_at(items, stride, i);
        for (uint64_t h = hash_str(*s) & (cap - 1);; h = (h + 1) & (cap - 1)) {
            if (!out->slots[h]) {
                out->slots[h] = i + 1;
                break;
            }
            if (same_str(*name_at(items, stride, out->slots[h] - 1), *s))
                return sb_fail(err, SB_ERR_FORMAT, "duplicate %s name '%.*s'", what, (int)SB_MIN(s->len, 80), s->ptr);
        }
    }
    return SB_OK;
}

/* The item named z, or NULL. */
static const void *index_find(const sb_gguf_index *ix, const void *items, size_t stride, const char *z) {
    sb_gguf_str key = {z, strlen(z)};
    if (!ix->slots)
        return NULL;
    for (uint64_t h = hash_str(key) & (ix->cap - 1); ix->slots[h]; h = (h + 1) & (ix->cap - 1)) {
        const sb_gguf_str *s = name_at(items, stride, ix->slots[h] - 1);
        if (same_str(*s, key))
            return s;
    }
    return NULL;
}

sb_status sb_gguf_open_memory(const void *data, uint64_t size, sb_gguf **out, sb_error *err) {
    *out = NULL;
    sb_gguf probe = {.base = data, .size = size, .fd = -1};
    sb_status st = parse(&probe, err, false);
    if (st == SB_OK)
        st = parse(&probe, err, false); /* now with data_offset: tensor bounds */
    if (st != SB_OK)
        return st;
    sb_gguf *g = sb_calloc(1, sizeof(*g));
    if (!g)
        return sb_fail(err, SB_ERR_NOMEM, "out of memory");
    *g = probe;
    g->kv = sb_calloc(probe.n_kv, sizeof(*g->kv));
    g->tensors = sb_calloc(probe.n_tensors, sizeof(*g->tensors));
    if (!g->kv || !g->tensors) {
        sb_gguf_close(g);
        return sb_fail(err, SB_ERR_NOMEM, "out of memory for %llu metadata entries and %llu tensors",
                       (unsigned long long)probe.n_kv, (unsigned long long)probe.n_tensors);
    }
    st = parse(g, err, true);
    if (st == SB_OK)
        st = build_index(g->kv, g->n_kv, sizeof(*g->kv), "metadata key", &g->kv_index, err);
    if (st == SB_OK)
        st = build_index(g->tensors, g->n_tensors, sizeof(*g->tensors), "tensor", &g->tensor_index, err);
    if (st != SB_OK) {
        sb_gguf_close(g);
        return st;
    }
    *out = g;
    return SB_OK;
}

/* Reads len bytes at offset off of fd; a short read means the file shrank
 * under us (it was truncated or rewritten while being read). */
static sb_status read_at(int fd, void *dst, uint64_t len, uint64_t off, sb_error *err) {
    for (uint64_t done = 0; done < len;) {
        ssize_t n = pread(fd, (uint8_t *)dst + done, (size_t)SB_MIN(len - done, (uint64_t)1 << 30), (off_t)(off + done));
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return sb_fail(err, SB_ERR_IO, "cannot read %llu bytes at offset %llu: %s", (unsigned long long)len,
                           (unsigned long long)off, n == 0 ? "the file shrank while it was read" : strerror(errno));
        done += (uint64_t)n;
    }
    return SB_OK;
}

/* A private image's header: read into the front of `image` until the parse
 * of what was read finds the data section inside it. The header's length is
 * only known once it is parsed, so the read doubles from 4 MiB; a parse that
 * fails on the whole file is the file's real error. */
static sb_status read_header(int fd, uint8_t *image, uint64_t size, sb_error *err) {
    uint64_t have = 0;
    for (uint64_t want = SB_MIN(size, (uint64_t)4 << 20);; want = SB_MIN(size, want * 2)) {
        sb_status st = read_at(fd, image + have, want - have, have, err);
        if (st != SB_OK)
            return st;
        have = want;
        sb_gguf probe = {.base = image, .size = have, .fd = -1};
        st = parse(&probe, err, false);
        if ((st == SB_OK && probe.data_offset <= have) || have == size)
            return st;
    }
}

static sb_status open_fd(const char *path, int fd, uint64_t size, bool private_copy, sb_gguf **out, sb_error *err) {
    void *map = private_copy ? mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0)
                             : mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (map == MAP_FAILED)
        return sb_fail(err, SB_ERR_IO, "%s: cannot map %llu bytes: %s", path, (unsigned long long)size, strerror(errno));
    sb_status st = private_copy ? read_header(fd, map, size, err) : SB_OK;
    if (st == SB_OK)
        st = sb_gguf_open_memory(map, size, out, err);
    if (st != SB_OK) {
        munmap(map, size);
        return st;
    }
    (*out)->mapped = true;
    (*out)->fd = private_copy ? fd : -1;
    return SB_OK;
}

static sb_status open_file(const char *path, bool private_copy, sb_gguf **out, sb_error *err) {
    *out = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return sb_fail(err, SB_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat stt;
    sb_status st = SB_OK;
    if (fstat(fd, &stt) != 0 || !S_ISREG(stt.st_mode))
        st = sb_fail(err, SB_ERR_IO, "%s: not a regular file%s", path, S_ISDIR(stt.st_mode) ? " (it is a directory)" : "");
    else if (stt.st_size == 0)
        st = sb_fail(err, SB_ERR_FORMAT, "%s: empty file, not a GGUF model", path);
    else
        st = open_fd(path, fd, (uint64_t)stt.st_size, private_copy, out, err);
    if (st != SB_OK || !private_copy)
        close(fd);
    if (st != SB_OK && err && !strstr(err->msg, path)) {
        char inner[sizeof(err->msg)];
        memcpy(inner, err->msg, sizeof(inner));
        sb_fail(err, st, "%s: %s", path, inner);
    }
    return st;
}

sb_status sb_gguf_open(const char *path, sb_gguf **out, sb_error *err) { return open_file(path, false, out, err); }

sb_status sb_gguf_open_private(const char *path, sb_gguf **out, sb_error *err) {
    return open_file(path, true, out, err);
}

/* ---- tensor data of a private image ----------------------------------------- */

const void *sb_gguf_bytes(const sb_gguf *g, const void *data, size_t len, void *buf, sb_error *err) {
    if (g->fd < 0)
        return data;
    uint64_t off = (uint64_t)((const uint8_t *)data - g->base);
    return read_at(g->fd, buf, len, off, err) == SB_OK ? buf : NULL;
}

void sb_gguf_drop(sb_gguf *g, const void *data, size_t len) {
    const uint8_t *lo = data, *hi = lo + len;
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        sb_gguf_tensor *t = &g->tensors[i];
        const uint8_t *p = t->data;
        if (p >= lo && p + t->nbytes <= hi)
            t->dropped = true;
    }
    /* A mapping's copy leaves memory; a caller's buffer is not ours to zero. */
    if (g->mapped)
        sb__advise_inside(data, len, (uintptr_t)sysconf(_SC_PAGESIZE), MADV_DONTNEED);
}

/* One thread's share of sb_gguf_fill: tensors [begin, end). */
typedef struct fill_part {
    const sb_gguf *g;
    size_t begin, end;
    sb_status st;
    sb_error err;
} fill_part;

static size_t left_to_read(const void *g, size_t i) {
    const sb_gguf_tensor *t = &((const sb_gguf *)g)->tensors[i];
    return t->dropped ? 0 : (size_t)t->nbytes;
}

static void *fill_part_run(void *arg) {
    fill_part *p = arg;
    for (size_t i = p->begin; i < p->end && p->st == SB_OK; i++) {
        const sb_gguf_tensor *t = &p->g->tensors[i];
        if (left_to_read(p->g, i) > 0)
            p->st = read_at(p->g->fd, (void *)t->data, t->nbytes, (uint64_t)((const uint8_t *)t->data - p->g->base),
                            &p->err);
    }
    return NULL;
}

sb_status sb_gguf_fill(sb_gguf *g, sb_error *err) {
    if (g->fd < 0)
        return SB_OK;
    /* On the load's threads. Not advised for huge pages, unlike the packed
     * copy: for a 1.1B Q8_0 image (1.2 GB unpacked) half of such loads took
     * 0.9-2.2 s against 0.3-0.5 without (measured, not traced further). */
    size_t ends[SB_LOAD_THREADS];
    const int n_parts = sb__load_split((size_t)g->n_tensors, left_to_read, g, ends);
    fill_part parts[SB_LOAD_THREADS];
    for (int k = 0; k < n_parts; k++)
        parts[k] = (fill_part){.g = g, .begin = k ? ends[k - 1] : 0, .end = ends[k]};
    sb__load_run(fill_part_run, parts, sizeof(parts[0]), n_parts);
    sb_status st = SB_OK;
    for (int k = 0; k < n_parts && st == SB_OK; k++)
        if ((st = parts[k].st) != SB_OK && err)
            *err = parts[k].err;
    close(g->fd);
    g->fd = -1;
    if (st == SB_OK)
        mprotect((void *)g->base, g->size, PROT_READ);
    return st;
}

size_t sb_gguf_resident_bytes(const sb_gguf *g) {
    if (!g->mapped)
        return 0;
    size_t page = (size_t)sysconf(_SC_PAGESIZE), n_pages = (g->size + page - 1) / page, resident = 0;
    unsigned char vec[4096];
    for (size_t first = 0; first < n_pages; first += sizeof vec) {
        size_t n = SB_MIN(sizeof vec, n_pages - first);
        if (mincore((void *)(g->base + first * page), n * page, vec) != 0)
            return g->size; /* cannot tell: count all of it */
        for (size_t i = 0; i < n; i++)
            resident += vec[i] & 1;
    }
    return SB_MIN(resident * page, (size_t)g->size);
}

void sb_gguf_close(sb_gguf *g) {
    if (!g)
        return;
    if (g->mapped)
        munmap((void *)g->base, g->size);
    if (g->fd >= 0)
        close(g->fd);
    sb_free(g->kv);
    sb_free(g->tensors);
    sb_free(g->kv_index.slots);
    sb_free(g->tensor_index.slots);
    sb_free(g);
}

/* ---- accessors ---- */

/* The key and the name are the first members, so the index's string is the entry. */
_Static_assert(offsetof(sb_gguf_kv, key) == 0 && offsetof(sb_gguf_tensor, name) == 0, "name first");

const sb_gguf_kv *sb_gguf_find(const sb_gguf *g, const char *key) {
    return index_find(&g->kv_index, g->kv, sizeof(*g->kv), key);
}

const sb_gguf_tensor *sb_gguf_find_tensor(const sb_gguf *g, const char *name) {
    return index_find(&g->tensor_index, g->tensors, sizeof(*g->tensors), name);
}

/* Reads a numeric value of any scalar type at p; false for non-numeric types. */
static bool numeric_at(sb_gguf_vtype type, const uint8_t *p, int64_t *iv, double *fv, bool *is_int) {
    union { uint8_t u8; int8_t i8; uint16_t u16; int16_t i16; uint32_t u32; int32_t i32; float f32;
            uint64_t u64; int64_t i64; double f64; } v;
    size_t size = sb_gguf_vtype_size(type);
    if (!size)
        return false;
    memcpy(&v, p, size);
    *is_int = true;
    switch (type) {
    case SB_GGUF_UINT8: case SB_GGUF_BOOL: *iv = v.u8; break;
    case SB_GGUF_INT8: *iv = v.i8; break;
    case SB_GGUF_UINT16: *iv = v.u16; break;
    case SB_GGUF_INT16: *iv = v.i16; break;
    case SB_GGUF_UINT32: *iv = v.u32; break;
    case SB_GGUF_INT32: *iv = v.i32; break;
    case SB_GGUF_INT64: *iv = v.i64; break;
    case SB_GGUF_UINT64:
        if (v.u64 > INT64_MAX) {
            *is_int = false;
            *fv = (double)v.u64;
            return true;
        }
        *iv = (int64_t)v.u64;
        break;
    case SB_GGUF_FLOAT32: *is_int = false; *fv = v.f32; return true;
    case SB_GGUF_FLOAT64: *is_int = false; *fv = v.f64; return true;
    default: return false;
    }
    *fv = (double)*iv;
    return true;
}

static sb_status find_typed(const sb_gguf *g, const char *key, const sb_gguf_kv **out, sb_error *err) {
    *out = sb_gguf_find(g, key);
    if (!*out)
        return sb_fail(err, SB_ERR_NOT_FOUND, "missing metadata '%s'", key);
    return SB_OK;
}

static sb_status wrong_type(const sb_gguf_kv *kv, const char *key, const char *expected, sb_error *err) {
    return sb_fail(err, SB_ERR_FORMAT, "metadata '%s' at offset %llu has type %s, expected %s", key,
                   (unsigned long long)kv->offset, sb_gguf_vtype_name(kv->type), expected);
}

sb_status sb_gguf_get_i64(const sb_gguf *g, const char *key, int64_t *out, sb_error *err) {
    const sb_gguf_kv *kv;
    sb_status st = find_typed(g, key, &kv, err);
    if (st != SB_OK)
        return st;
    int64_t iv;
    double fv;
    bool is_int;
    if (kv->type == SB_GGUF_BOOL || !numeric_at(kv->type, kv->value, &iv, &fv, &is_int) || !is_int)
        return wrong_type(kv, key, "an integer", err);
    *out = iv;
    return SB_OK;
}

sb_status sb_gguf_get_u32(const sb_gguf *g, const char *key, uint32_t *out, sb_error *err) {
    int64_t v = 0;
    sb_status st = sb_gguf_get_i64(g, key, &v, err);
    if (st != SB_OK)
        return st;
    if (v < 0 || v > UINT32_MAX)
        return sb_fail(err, SB_ERR_FORMAT, "metadata '%s' = %lld is out of range", key, (long long)v);
    *out = (uint32_t)v;
    return SB_OK;
}

sb_status sb_gguf_get_f32(const sb_gguf *g, const char *key, float *out, sb_error *err) {
    const sb_gguf_kv *kv;
    sb_status st = find_typed(g, key, &kv, err);
    if (st != SB_OK)
        return st;
    int64_t iv;
    double fv;
    bool is_int;
    if (kv->type == SB_GGUF_BOOL || !numeric_at(kv->type, kv->value, &iv, &fv, &is_int))
        return wrong_type(kv, key, "a number", err);
    *out = (float)fv;
    return SB_OK;
}

sb_status sb_gguf_get_bool(const sb_gguf *g, const char *key, bool *out, sb_error *err) {
    const sb_gguf_kv *kv;
    sb_status st = find_typed(g, key, &kv, err);
    if (st != SB_OK)
        return st;
    if (kv->type != SB_GGUF_BOOL)
        return wrong_type(kv, key, "bool", err);
    *out = kv->value[0] != 0;
    return SB_OK;
}

sb_status sb_gguf_get_str(const sb_gguf *g, const char *key, sb_gguf_str *out, sb_error *err) {
    const sb_gguf_kv *kv;
    sb_status st = find_typed(g, key, &kv, err);
    if (st != SB_OK)
        return st;
    if (kv->type != SB_GGUF_STRING)
        return wrong_type(kv, key, "string", err);
    memcpy(&out->len, kv->value, 8);
    out->ptr = (const char *)kv->value + 8;
    return SB_OK;
}

sb_status sb_gguf_get_u32_or(const sb_gguf *g, const char *key, uint32_t def, uint32_t *out, sb_error *err) {
    *out = def;
    return sb_gguf_find(g, key) ? sb_gguf_get_u32(g, key, out, err) : SB_OK;
}

sb_status sb_gguf_get_f32_or(const sb_gguf *g, const char *key, float def, float *out, sb_error *err) {
    *out = def;
    return sb_gguf_find(g, key) ? sb_gguf_get_f32(g, key, out, err) : SB_OK;
}

sb_status sb_gguf_get_bool_or(const sb_gguf *g, const char *key, bool def, bool *out, sb_error *err) {
    *out = def;
    return sb_gguf_find(g, key) ? sb_gguf_get_bool(g, key, out, err) : SB_OK;
}

sb_status sb_gguf_get_arr(const sb_gguf *g, const char *key, sb_gguf_vtype elem, const sb_gguf_kv **out, sb_error *err) {
    sb_status st = find_typed(g, key, out, err);
    if (st != SB_OK)
        return st;
    if ((*out)->type != SB_GGUF_ARRAY || (*out)->arr_type != elem) {
        char expected[48];
        snprintf(expected, sizeof(expected), "array of %s", sb_gguf_vtype_name(elem));
        if ((*out)->type == SB_GGUF_ARRAY)
            return sb_fail(err, SB_ERR_FORMAT, "metadata '%s' is an array of %s, expected %s", key,
                           sb_gguf_vtype_name((*out)->arr_type), expected);
        return wrong_type(*out, key, expected, err);
    }
    return SB_OK;
}

/* fv toward zero, saturating at int64's range; NaN as INT64_MIN (what no
 * caller accepts as a count, an id or a type). */
static int64_t f64_to_i64(double fv) {
    if (!(fv == fv) || fv <= -9223372036854775808.0)
        return INT64_MIN;
    if (fv >= 9223372036854775808.0)
        return INT64_MAX;
    return (int64_t)fv;
}

int64_t sb_gguf_arr_i64(const sb_gguf_kv *kv, uint64_t i) {
    int64_t iv = 0;
    double fv = 0;
    bool is_int = true;
    numeric_at(kv->arr_type, kv->value + i * sb_gguf_vtype_size(kv->arr_type), &iv, &fv, &is_int);
    return is_int ? iv : f64_to_i64(fv);
}

double sb_gguf_arr_f64(const sb_gguf_kv *kv, uint64_t i) {
    int64_t iv;
    double fv = 0;
    bool is_int;
    numeric_at(kv->arr_type, kv->value + i * sb_gguf_vtype_size(kv->arr_type), &iv, &fv, &is_int);
    return fv;
}

void sb_gguf_arr_strings(const sb_gguf_kv *kv, sb_gguf_str *out) {
    const uint8_t *p = kv->value;
    for (uint64_t i = 0; i < kv->arr_n; i++) {
        memcpy(&out[i].len, p, 8);
        out[i].ptr = (const char *)p + 8;
        p += 8 + out[i].len;
    }
}

double sb_gguf_kv_f64(const sb_gguf_kv *kv) {
    int64_t iv;
    double fv = 0;
    bool is_int;
    numeric_at(kv->type, kv->value, &iv, &fv, &is_int);
    return fv;
}
