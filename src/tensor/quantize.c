/*
 * quantize.c - llama.cpp's quantization rules and the row conversion behind
 * `switchboard quantize` (see quantize.h).
 *
 * The rules are those of llama.cpp's llama_tensor_get_type and
 * llama_model_quantize_impl for dense llama-style models without an
 * importance matrix (its defaults: no pure mode, output quantized, no type
 * overrides). Left out, because nothing here writes them: mixture-of-experts
 * and 70B special cases, the IQ types but IQ4_NL and IQ4_XS (the two that
 * need no importance matrix), the TQ types, the _s/_l variants.
 */
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "tensor/quantize.h"

static const sb_quant_ftype ftypes[] = {
    {"q4_0", 2, SB_TYPE_Q4_0},    {"q4_1", 3, SB_TYPE_Q4_1},    {"q8_0", 7, SB_TYPE_Q8_0},
    {"q5_0", 8, SB_TYPE_Q5_0},    {"q5_1", 9, SB_TYPE_Q5_1},    {"q2_k", 10, SB_TYPE_Q2_K},
    {"q3_k_m", 12, SB_TYPE_Q3_K}, {"q4_k_m", 15, SB_TYPE_Q4_K}, {"q5_k_m", 17, SB_TYPE_Q5_K},
    {"q6_k", 18, SB_TYPE_Q6_K},   {"iq4_nl", 25, SB_TYPE_IQ4_NL}, {"iq4_xs", 30, SB_TYPE_IQ4_XS},
};

const sb_quant_ftype *sb_quant_ftype_find(const char *name) {
    static const struct {
        const char *alias, *name;
    } aliases[] = {{"q3_k", "q3_k_m"}, {"q4_k", "q4_k_m"}, {"q5_k", "q5_k_m"}};
    for (size_t i = 0; i < sizeof(aliases) / sizeof(aliases[0]); i++)
        if (strcasecmp(name, aliases[i].alias) == 0)
            name = aliases[i].name;
    for (size_t i = 0; i < sizeof(ftypes) / sizeof(ftypes[0]); i++)
        if (strcasecmp(name, ftypes[i].name) == 0)
            return &ftypes[i];
    return NULL;
}

const char *sb_quant_ftype_names(void) {
    return "q8_0, q4_0, q4_1, q5_0, q5_1, q2_k, q3_k_m (q3_k), q4_k_m (q4_k), q5_k_m (q5_k), q6_k, iq4_nl, "
           "iq4_xs";
}

static bool ends_with(const char *s, const char *suffix) {
    const size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

static bool has(const char *s, const char *part) { return strstr(s, part) != NULL; }

/* llama.cpp's use_more_bits: the first and last eighth of the layers and
 * every third one between. */
static bool use_more_bits(int i, int n) { return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2; }

/* llama_tensor_get_type, for the file types of the table. */
static sb_type tensor_type(sb_quant_plan *p, const char *name, const int64_t *ne) {
    const uint32_t ft = p->ft->ftype;
    const bool iq4 = ft == 25 || ft == 30; /* IQ4_NL, IQ4_XS */
    sb_type t = p->ft->type;
    const bool is_output = strcmp(name, "output.weight") == 0 || (!p->has_output && strcmp(name, "token_embd.weight") == 0);
    if (is_output) {
        if (ne[0] % sb_type_traits_of(t)->blck_size != 0)
            return SB_TYPE_Q8_0;
        return t == SB_TYPE_Q8_0 ? t : SB_TYPE_Q6_K;
    }
    if (has(name, "attn_v.weight")) {
        if (ft == 10) /* Q2_K */
            t = p->n_gqa >= 4 ? SB_TYPE_Q4_K : SB_TYPE_Q3_K;
        else if (ft == 12) /* Q3_K_M */
            t = p->i_attn_v < 2 ? SB_TYPE_Q5_K : SB_TYPE_Q4_K;
        else if (iq4 && p->n_gqa >= 4)
            t = SB_TYPE_Q5_K;
        else if ((ft == 15 || ft == 17) && use_more_bits(p->i_attn_v, p->n_attn_v))
            t = SB_TYPE_Q6_K;
        p->i_attn_v++;
    } else if (has(name, "ffn_down")) {
        const int i = p->i_ffn_down, n = p->n_layer;
        if (ft == 10)
            t = SB_TYPE_Q3_K;
        else if (ft == 12)
            t = i < n / 16 ? SB_TYPE_Q5_K : SB_TYPE_Q4_K;
        else if ((ft == 15 || ft == 17) && use_more_bits(i, n))
            t = SB_TYPE_Q6_K;
        else if (iq4 && i < n / 8)
            t = SB_TYPE_Q5_K;
        p->i_ffn_down++;
    } else if (has(name, "attn_output.weight")) {
        if (ft == 10)
            t = SB_TYPE_Q3_K;
        else if (ft == 12)
            t = SB_TYPE_Q4_K;
    } else if (has(name, "attn_qkv.weight")) {
        if (ft == 12)
            t = SB_TYPE_Q4_K;
        else if (ft == 15)
            t = SB_TYPE_Q5_K;
        else if (ft == 17)
            t = SB_TYPE_Q6_K;
    }
    return t;
}

void sb_quant_choose(sb_quant_plan *p, const char *name, uint32_t n_dims, const int64_t *ne, sb_type src,
                     bool *quantize, sb_type *type) {
    *type = src;
    *quantize = ends_with(name, "weight") && n_dims >= 2 && !has(name, "_norm.weight") &&
                !has(name, "ffn_gate_inp.weight") && strcmp(name, "position_embd.weight") != 0 &&
                strcmp(name, "token_types.weight") != 0;
    if (!*quantize)
        return;
    sb_type t = tensor_type(p, name, ne);
    /* Rows that the chosen type's blocks do not divide: llama.cpp's fallbacks. */
    if (ne[0] % sb_type_traits_of(t)->blck_size != 0) {
        switch (t) {
        case SB_TYPE_Q4_K: t = SB_TYPE_Q5_0; break;
        case SB_TYPE_Q5_K: t = SB_TYPE_Q5_1; break;
        case SB_TYPE_Q6_K: t = SB_TYPE_Q8_0; break;
        case SB_TYPE_IQ4_XS: t = SB_TYPE_IQ4_NL; break;
        /* IQ4_NL before llama.cpp's quantizer changed it (files made
         * then have it; switchboard runs them) */
        case SB_TYPE_Q2_K:
        case SB_TYPE_Q3_K: t = SB_TYPE_Q4_0; break;
        default: t = SB_TYPE_F16; break;
        }
        if (ne[0] % sb_type_traits_of(t)->blck_size != 0)
            t = SB_TYPE_F16;
    }
    *type = t;
    *quantize = t != src;
}

typedef struct quant_job {
    const sb_type_traits *from, *to;
    const uint8_t *src;
    uint8_t *dst;
    size_t src_row, dst_row;
    int64_t n_in, nrows, rows_per_chunk;
    float **buf; /* per thread, n_in floats */
} quant_job;

static void quant_chunk(void *arg, int64_t chunk, int ith) {
    const quant_job *j = arg;
    float *f = j->buf[ith];
    for (int64_t r = chunk * j->rows_per_chunk; r < j->nrows && r < (chunk + 1) * j->rows_per_chunk; r++) {
        const uint8_t *in = j->src + (size_t)r * j->src_row;
        const float *row = (const float *)in;
        if (j->from->to_float != sb_type_traits_of(SB_TYPE_F32)->to_float || ((uintptr_t)in % sizeof(float)) != 0) {
            j->from->to_float(in, f, j->n_in);
            row = f;
        }
        j->to->from_float(row, j->dst + (size_t)r * j->dst_row, j->n_in);
    }
}

sb_status sb_quant_rows(sb_threadpool *tp, sb_type src_type, const void *src, sb_type dst_type, void *dst,
                        int64_t n_in, int64_t nrows, sb_error *err) {
    const int nt = sb_threadpool_n_threads(tp);
    quant_job j = {
        .from = sb_type_traits_of(src_type),
        .to = sb_type_traits_of(dst_type),
        .src = src,
        .dst = dst,
        .src_row = sb_type_row_size(src_type, n_in),
        .dst_row = sb_type_row_size(dst_type, n_in),
        .n_in = n_in,
        .nrows = nrows,
        .rows_per_chunk = nrows / (8 * (int64_t)nt) > 1 ? nrows / (8 * (int64_t)nt) : 1,
    };
    if (!j.from || !j.from->to_float || !j.to || !j.to->from_float || !j.src_row || !j.dst_row)
        return sb_fail(err, SB_ERR_UNSUPPORTED, "cannot convert %s to %s", j.from ? j.from->name : "?",
                       j.to ? j.to->name : "?");
    sb_status st = SB_OK;
    if (!(j.buf = sb_calloc((size_t)nt, sizeof(float *))))
        return sb_fail(err, SB_ERR_NOMEM, "out of memory");
    for (int i = 0; i < nt && st == SB_OK; i++)
        if (!(j.buf[i] = sb_malloc((size_t)n_in * sizeof(float))))
            st = sb_fail(err, SB_ERR_NOMEM, "out of memory for a row of %lld floats", (long long)n_in);
    if (st == SB_OK)
        sb_threadpool_for(tp, (nrows + j.rows_per_chunk - 1) / j.rows_per_chunk, quant_chunk, &j);
    for (int i = 0; i < nt; i++)
        sb_free(j.buf[i]);
    sb_free(j.buf);
    return st;
}
