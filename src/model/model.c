/*
 * model.c - loading a GGUF file into an sb_model (the vocabulary, then the
 * architecture's hyper-parameters and weights, see arch.c), and the public
 * model and tokenizer entry points of switchboard.h, which forward to the
 * tokenizer module.
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>

#include "base/base.h"
#include "model/model.h"

/* ---- packed matrices -------------------------------------------------------- */

/* The model's matrices the active kernels pack, into out[] (room for
 * 8 per layer + 1), the output last. An output tied to the embedding table
 * is packed too, and the table's rows are then looked up in the packed
 * layout (sb_get_row): unpacked, such a Q6_K matrix ran the AVX2 dot
 * products, 2.4x slower at 8 streams. */
static size_t packable(sb_model *m, sb_weight **out) {
    size_t n = 0;
    for (int32_t il = 0; il < m->hp.n_layer; il++) {
        sb_layer *l = &m->layers[il];
        sb_weight *w[] = {&l->wq, &l->wk, &l->wv, &l->wqkv, &l->wo, &l->w_gate, &l->w_up, &l->w_down};
        for (size_t i = 0; i < SB_ARRAY_LEN(w); i++)
            if (w[i]->data && sb_weight_packable(w[i]->type, w[i]->n_in, w[i]->n_out))
                out[n++] = w[i];
    }
    if (m->output.data && sb_weight_packable(m->output.type, m->output.n_in, m->output.n_out))
        out[n++] = &m->output;
    return n;
}

static size_t weight_size(const sb_weight *w) { return sb_type_row_size(w->type, w->n_in) * (size_t)w->n_out; }

/* Bytes a private image reads and packs at a time: whole packing groups of
 * about this size, so that the read's copy lands in this core's L2 and the
 * packing reads it from there (a whole matrix, 53 MB for a 1.1B model's
 * output, went to DRAM and back: copying from the page cache and packing
 * were ~40% of a warm load). */
#define PACK_SLICE_BYTES ((size_t)256 << 10)

/* Rows of one slice of w: whole groups, at least one. */
static int64_t slice_rows(const sb_weight *w) {
    const int64_t group = sb_weight_pack_rows(w->type);
    const int64_t groups = (int64_t)(PACK_SLICE_BYTES / (sb_type_row_size(w->type, w->n_in) * (size_t)group));
    return SB_MIN(w->n_out, SB_MAX((int64_t)1, groups) * group);
}

static size_t slice_bytes(const sb_weight *w) { return sb_type_row_size(w->type, w->n_in) * (size_t)slice_rows(w); }

/* One thread's share of the packing: weights [begin, end) of list, each
 * into its place dst[i] in m->packed. */
typedef struct pack_part {
    sb_model *m;
    sb_weight **list;
    uint8_t *const *dst;
    size_t begin, end;
    sb_status st;
    sb_error err;
} pack_part;

/* Packs w into dst a slice at a time, reading a private image's slices
 * through staging. */
static sb_status pack_weight(sb_gguf *g, const sb_weight *w, uint8_t *dst, void *staging, sb_error *err) {
    const size_t row = sb_type_row_size(w->type, w->n_in);
    const int64_t step = slice_rows(w);
    for (int64_t r = 0; r < w->n_out; r += step) {
        const int64_t n = SB_MIN(step, w->n_out - r);
        const size_t off = (size_t)r * row;
        const void *src = sb_gguf_bytes(g, (const uint8_t *)w->data + off, (size_t)n * row, staging, err);
        if (!src)
            return SB_ERR_IO;
        sb_weight_pack(w->type, src, dst + off, w->n_in, n);
    }
    return SB_OK;
}

/* Packs a part, and tells the file's image it will not read those weights
 * again. A private image's weights are read through one slice-sized buffer
 * per part. */
static void *pack_part_run(void *arg) {
    pack_part *p = arg;
    if (p->begin == p->end)
        return NULL;
    void *staging = NULL;
    size_t buf = 0;
    for (size_t i = p->begin; i < p->end; i++)
        buf = SB_MAX(buf, slice_bytes(p->list[i]));
    if (p->m->gguf->fd >= 0 && !(staging = sb_malloc(buf))) {
        p->st = sb_fail(&p->err, SB_ERR_NOMEM, "out of memory for a %zu-byte read buffer", buf);
        return NULL;
    }
    for (size_t i = p->begin; i < p->end; i++) {
        sb_weight *w = p->list[i];
        if ((p->st = pack_weight(p->m->gguf, w, p->dst[i], staging, &p->err)) != SB_OK)
            break;
        sb_gguf_drop(p->m->gguf, w->data, weight_size(w));
        w->data = p->dst[i];
        w->packed = true;
    }
    sb_free(staging);
    return NULL;
}

static size_t listed_size(const void *list, size_t i) { return weight_size(((sb_weight *const *)list)[i]); }

/* Packs list's weights into their places dst[] on the load's threads, in
 * parts of about equal bytes. */
static sb_status pack_all(sb_model *m, sb_weight **list, size_t n, uint8_t *const *dst, sb_error *err) {
    size_t ends[SB_LOAD_THREADS];
    const int n_parts = sb__load_split(n, listed_size, list, ends);
    pack_part parts[SB_LOAD_THREADS];
    for (int k = 0; k < n_parts; k++)
        parts[k] = (pack_part){.m = m, .list = list, .dst = dst, .begin = k ? ends[k - 1] : 0, .end = ends[k]};
    sb__load_run(pack_part_run, parts, sizeof(parts[0]), n_parts);
    for (int k = 0; k < n_parts; k++)
        if (parts[k].st != SB_OK) {
            if (err)
                *err = parts[k].err;
            return parts[k].st;
        }
    return SB_OK;
}

/* Copies the weights in list (packed for the kernels) and then the
 * embedding table into m->packed from dst on, each 64-byte aligned. */
static sb_status copy_weights(sb_model *m, sb_weight **list, size_t n, sb_weight *embd, uint8_t *dst,
                              sb_error *err) {
    uint8_t **places = sb_calloc(n + 1, sizeof *places);
    if (!places)
        return sb_fail(err, SB_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < n; i++) {
        places[i] = dst;
        dst += sb_align_up(weight_size(list[i]), 64);
    }
    sb_status st = n > 0 ? pack_all(m, list, n, places, err) : SB_OK;
    sb_free(places);
    if (st != SB_OK || !embd)
        return st;
    const void *src = sb_gguf_bytes(m->gguf, embd->data, weight_size(embd), dst, err);
    if (!src)
        return SB_ERR_IO;
    if (src != dst)
        memcpy(dst, src, weight_size(embd));
    sb_gguf_drop(m->gguf, embd->data, weight_size(embd));
    if (m->output.data == embd->data) /* tied: the output matrix is the same table */
        m->output.data = dst;
    embd->data = dst;
    return SB_OK;
}

sb_status sb_model_pack(sb_model *m, sb_error *err) {
    sb_weight **list = sb_calloc((size_t)m->hp.n_layer * 8 + 1, sizeof(*list));
    if (!list)
        return sb_fail(err, SB_ERR_NOMEM, "out of memory");
    const bool tied = m->tok_embd.data && m->output.data == m->tok_embd.data;
    const size_t n = packable(m, list);
    const bool embd_packed = tied && n > 0 && list[n - 1] == &m->output;
    /* The token embedding table is copied as it is, after the packed
     * matrices (unless it is the packed output): a token's row is a random
     * one, and in the file's mapping each lookup missed the TLB on 4 KiB
     * pages (in a virtual machine a two-level page walk: 3-10 us per row,
     * 30 us per one-token step). */
    sb_weight *embd = m->tok_embd.data && !embd_packed ? &m->tok_embd : NULL;
    size_t total = embd ? sb_align_up(weight_size(embd), 64) : 0;
    for (size_t i = 0; i < n; i++) /* each copy 64-byte aligned, for the kernels' vector loads */
        total += sb_align_up(weight_size(list[i]), 64);
    m->packed_bytes = total > 0 ? total + 63 : 0;
    if (m->reuse && total > 0) { /* resized in place where the allocator can (glibc: mremap) */
        if ((m->packed = sb_realloc(m->reuse, total + 63)))
            m->reuse = NULL;
    } else if (total > 0) {
        m->packed = sb_malloc(total + 63);
    }
    if (total > 0 && !m->packed) {
        sb_free(list);
        return sb_fail(err, SB_ERR_NOMEM, "out of memory for %zu bytes of packed weights and the embedding table", total);
    }
    uint8_t *dst = (uint8_t *)sb_align_up((uintptr_t)m->packed, 64);
    /* Huge pages where the system gives them on request: the kernels stream
     * the whole copy every token, and 4 KiB pages cost a TLB miss each. */
    sb__advise_inside(dst, total, (uintptr_t)2 << 20, MADV_HUGEPAGE);
    sb_status st = copy_weights(m, list, n, embd, dst, err);
    sb_free(list);
    if (st == SB_OK && embd_packed)
        m->tok_embd = m->output;
    if (st == SB_OK) {
        sb_kernels_weights_loaded(total);
        m->counted_bytes = total;
    }
    /* What was not copied (norms, unpacked matrices) is read into a private image now. */
    return st == SB_OK ? sb_gguf_fill(m->gguf, err) : st;
}

/* ---- loading ------------------------------------------------------------------ */

/* Everything after the GGUF is open: m->gguf is set; on failure the caller frees m. */
static sb_status load_parsed(sb_model *m, sb_error *err) {
    sb_status st = sb_arch_load(m, err);
    if (st == SB_OK)
        st = sb_vocab_load(m->gguf, &m->vocab, err);
    if (st == SB_OK && sb_vocab_n_tokens(m->vocab) != m->hp.n_vocab)
        st = sb_fail(err, SB_ERR_FORMAT, "the vocabulary has %d tokens but token_embd.weight has %d rows",
                     sb_vocab_n_tokens(m->vocab), m->hp.n_vocab);
    if (st == SB_OK)
        st = sb_model_pack(m, err);
    return st;
}

sb_model_params sb_model_default_params(void) { return (sb_model_params){.private_copy = false}; }

sb_status sb_model_load(const char *path, sb_model_t **out, sb_error *err) {
    return sb_model_load_with(path, NULL, out, err);
}

sb_status sb_model_load_with(const char *path, const sb_model_params *params, sb_model_t **out, sb_error *err) {
    return sb__model_load_reusing(path, params, NULL, out, err);
}

sb_status sb__model_load_reusing(const char *path, const sb_model_params *params, void *region, sb_model **out,
                                 sb_error *err) {
    *out = NULL;
    sb_model_params p = params ? *params : sb_model_default_params();
    sb_model *m = sb_calloc(1, sizeof(*m));
    if (!m) {
        sb_free(region);
        return sb_fail(err, SB_ERR_NOMEM, "out of memory");
    }
    m->reuse = region;
    sb_status st = p.private_copy ? sb_gguf_open_private(path, &m->gguf, err) : sb_gguf_open(path, &m->gguf, err);
    if (st == SB_OK)
        st = load_parsed(m, err);
    if (st != SB_OK) {
        /* Messages from the GGUF reader already carry the path. */
        if (err && m->gguf) {
            char inner[sizeof(err->msg)];
            memcpy(inner, err->msg, sizeof(inner));
            sb_fail(err, st, "%s: %s", path, inner);
        }
        sb_model_free(m);
        return st;
    }
    sb_free(m->reuse); /* nothing to pack: not needed */
    m->reuse = NULL;
    *out = m;
    return SB_OK;
}

void *sb__model_take_packed(sb_model *m) {
    void *p = m->packed;
    m->packed = NULL;
    m->packed_bytes = 0;
    return p;
}

sb_status sb__model_load_memory(const void *data, uint64_t size, sb_model **out, sb_error *err) {
    *out = NULL;
    sb_model *m = sb_calloc(1, sizeof(*m));
    if (!m)
        return sb_fail(err, SB_ERR_NOMEM, "out of memory");
    sb_status st = sb_gguf_open_memory(data, size, &m->gguf, err);
    if (st == SB_OK)
        st = load_parsed(m, err);
    if (st != SB_OK) {
        sb_model_free(m);
        return st;
    }
    *out = m;
    return SB_OK;
}

void sb_model_free(sb_model_t *m) {
    if (!m)
        return;
    if (m->counted_bytes)
        sb_kernels_weights_unloaded(m->counted_bytes);
    sb_vocab_free(m->vocab);
    sb_free(m->layers);
    sb_free(m->packed);
    sb_free(m->reuse);
    sb_gguf_close(m->gguf);
    sb_free(m);
}

size_t sb_model_memory(const sb_model_t *m) { return m->packed_bytes + sb_gguf_resident_bytes(m->gguf); }

int32_t sb_model_n_vocab(const sb_model_t *m) { return m->hp.n_vocab; }
int32_t sb_model_n_ctx_train(const sb_model_t *m) { return m->hp.n_ctx_train; }
int32_t sb_model_n_embd(const sb_model_t *m) { return m->hp.n_embd; }
int32_t sb_model_token_bos(const sb_model_t *m) { return sb_vocab_bos(m->vocab); }
int32_t sb_model_token_eos(const sb_model_t *m) { return sb_vocab_eos(m->vocab); }
bool sb_model_add_bos(const sb_model_t *m) { return sb_vocab_add_bos(m->vocab); }
bool sb_model_token_is_eog(const sb_model_t *m, int32_t t) { return sb_vocab_is_eog(m->vocab, t); }

sb_status sb_tokenize(const sb_model_t *m, const char *text, size_t len, bool add_special, bool parse_special,
                      int32_t *ids, size_t cap, size_t *n_out, sb_error *err) {
    return sb_vocab_tokenize(m->vocab, text, len, add_special, parse_special, ids, cap, n_out, err);
}

const char *sb_token_text(const sb_model_t *m, int32_t t) { return sb_vocab_text(m->vocab, t); }

sb_status sb_detok_create(const sb_model_t *m, bool strip_leading_space, sb_detok_t **out, sb_error *err) {
    return sb_vocab_detok_create(m->vocab, strip_leading_space, out, err);
}

size_t sb_detok_push(sb_detok_t *d, int32_t t, bool render_special, char *out, size_t cap) {
    return sb_vocab_detok_push(d, t, render_special, out, cap);
}

size_t sb_detok_flush(sb_detok_t *d, char *out, size_t cap) { return sb_vocab_detok_flush(d, out, cap); }

void sb_detok_free(sb_detok_t *d) { sb_vocab_detok_free(d); }

sb_status sb_detokenize(const sb_model_t *m, const int32_t *ids, size_t n, bool strip_leading_space,
                        bool render_special, char *out, size_t cap, size_t *n_out, sb_error *err) {
    return sb_vocab_detokenize(m->vocab, ids, n, strip_leading_space, render_special, out, cap, n_out, err);
}
