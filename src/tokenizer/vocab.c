/*
 * vocab.c - the vocabulary: loading and validating tokenizer.ggml.* from
 * GGUF, the text-to-id hash table, and the tokenizer front end shared by all
 * tokenizer families (BOS/EOS, and cutting special-token text out of the
 * input before the family's encoder sees it).
 *
 * Where llama.cpp repairs metadata by token text (end-of-generation markers
 * typed NORMAL, Phi-3's whitespace-eating special tokens), this file does the
 * same, so that tokenization and stopping agree with it. Unlike llama.cpp it
 * rejects out-of-range special ids instead of ignoring them with a warning.
 */
#include "tokenizer/vocab.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"

/* ---- tokenizer families ------------------------------------------------ */

/* Defaults llama.cpp assumes when the GGUF does not say (ids are disabled
 * when the vocabulary is too small for them). */
static const struct {
    const char *model; /* tokenizer.ggml.model */
    sb_vocab_kind kind;
    int32_t bos, eos, unk;
    bool add_bos, add_space_prefix;
} families[] = {
    {"llama", SB_VOCAB_SPM, 1, 2, 0, true, true},
    {"gpt2", SB_VOCAB_BPE, 11, 11, -1, false, false}, /* add_bos: see sb__bpe_load */
};

/* Scratch state one tokenize call keeps across its text runs. */
typedef struct encode_state {
    sb__bpe_session *bpe;
} encode_state;

static sb_status encode_text(const sb_vocab *v, encode_state *es, const char *text, size_t len, bool after_special,
                             sb__tok_out *out, sb_error *err) {
    switch (v->kind) {
    case SB_VOCAB_SPM:
        return sb__spm_encode(v, text, len, after_special, out, err);
    case SB_VOCAB_BPE:
        return sb__bpe_encode(v, &es->bpe, text, len, out, err);
    }
    return sb_fail(err, SB_ERR_UNSUPPORTED, "tokenizer kind %d has no encoder", (int)v->kind);
}

/* ---- text -> id hash table ---------------------------------------------- */

static uint32_t hash_bytes(const char *s, size_t len) {
    uint32_t h = 2166136261u; /* FNV-1a */
    for (size_t i = 0; i < len; i++)
        h = (h ^ (uint8_t)s[i]) * 16777619u;
    return h;
}

static bool text_is(const sb_vocab *v, int32_t id, const char *s, size_t len) {
    const sb_vocab_token *t = &v->tokens[id];
    return t->text_len == len && memcmp(v->text + t->text_off, s, len) == 0;
}

int32_t sb__vocab_find(const sb_vocab *v, const char *s, size_t len) {
    for (uint32_t i = hash_bytes(s, len) & v->hash_mask;; i = (i + 1) & v->hash_mask) {
        int32_t id = v->hash[i];
        if (id < 0 || text_is(v, id, s, len))
            return id;
    }
}

/* Returns the id already holding this text, or -1 after inserting id. */
static int32_t hash_insert(sb_vocab *v, int32_t id) {
    const sb_vocab_token *t = &v->tokens[id];
    const char *s = v->text + t->text_off;
    uint32_t i = hash_bytes(s, t->text_len) & v->hash_mask;
    for (; v->hash[i] >= 0; i = (i + 1) & v->hash_mask)
        if (text_is(v, v->hash[i], s, t->text_len))
            return v->hash[i];
    v->hash[i] = id;
    return -1;
}

/* ---- loading ------------------------------------------------------------ */

static sb_status no_memory(sb_error *err, const char *what) {
    return sb_fail(err, SB_ERR_NOMEM, "out of memory for the vocabulary's %s", what);
}

static sb_status read_family(sb_vocab *v, const sb_gguf *g, size_t *family, sb_error *err) {
    sb_gguf_str model;
    sb_status st = sb_gguf_get_str(g, "tokenizer.ggml.model", &model, err);
    if (st != SB_OK)
        return st;
    for (size_t i = 0; i < SB_ARRAY_LEN(families); i++) {
        if (strlen(families[i].model) == model.len && memcmp(families[i].model, model.ptr, model.len) == 0) {
            v->kind = families[i].kind;
            *family = i;
            return SB_OK;
        }
    }
    int shown = model.len > 64 ? 64 : (int)model.len;
    return sb_fail(err, SB_ERR_UNSUPPORTED,
                   "tokenizer.ggml.model '%.*s' is not supported (supported: 'llama', SentencePiece; "
                   "'gpt2', byte-level BPE)", shown,
                   model.ptr);
}

/* Copies the token strings into one NUL-separated block and indexes them. */
static sb_status read_tokens(sb_vocab *v, const sb_gguf *g, sb_error *err) {
    const char *key = "tokenizer.ggml.tokens";
    const sb_gguf_kv *kv;
    sb_status st = sb_gguf_get_arr(g, key, SB_GGUF_STRING, &kv, err);
    if (st != SB_OK)
        return st;
    if (kv->arr_n == 0 || kv->arr_n > INT32_MAX / 2)
        return sb_fail(err, SB_ERR_FORMAT, "%s has %llu entries, expected 1..%d", key, (unsigned long long)kv->arr_n,
                       INT32_MAX / 2);
    int32_t n = (int32_t)kv->arr_n;
    sb_gguf_str *strs = sb_calloc((size_t)n, sizeof(*strs));
    v->tokens = sb_calloc((size_t)n, sizeof(*v->tokens));
    if (!strs || !v->tokens) {
        sb_free(strs);
        return no_memory(err, "token table");
    }
    v->n_tokens = n;
    sb_gguf_arr_strings(kv, strs);

    /* llama.cpp renames empty strings "[EMPTY_<id>]"; sized here with room for any id. */
    static const size_t empty_name_max = sizeof("[EMPTY_2147483647]");
    uint64_t total = 0;
    for (int32_t i = 0; i < n; i++)
        total += (strs[i].len ? strs[i].len : empty_name_max) + 1;
    if (total > UINT32_MAX) {
        sb_free(strs);
        return sb_fail(err, SB_ERR_FORMAT, "%s holds %llu bytes of text, more than 4 GiB", key,
                       (unsigned long long)total);
    }
    v->text = sb_malloc((size_t)total);
    uint32_t slots = 1;
    while (slots < 2u * (uint32_t)n)
        slots <<= 1;
    v->hash = sb_malloc(slots * sizeof(*v->hash));
    if (!v->text || !v->hash) {
        sb_free(strs);
        return no_memory(err, "token strings");
    }
    v->hash_mask = slots - 1;
    memset(v->hash, 0xff, slots * sizeof(*v->hash));

    uint32_t off = 0;
    for (int32_t i = 0; i < n; i++) {
        sb_vocab_token *t = &v->tokens[i];
        t->text_off = off;
        if (strs[i].len) {
            memcpy(v->text + off, strs[i].ptr, strs[i].len);
            t->text_len = (uint32_t)strs[i].len;
        } else {
            t->text_len = (uint32_t)snprintf(v->text + off, empty_name_max, "[EMPTY_%d]", (int)i);
        }
        v->text[off + t->text_len] = '\0';
        v->max_text_len = SB_MAX(v->max_text_len, t->text_len);
        off += t->text_len + 1;
        int32_t other = hash_insert(v, i);
        if (other >= 0) {
            sb_free(strs);
            return sb_fail(err, SB_ERR_FORMAT, "%s: duplicate token '%.64s' at ids %d and %d", key,
                           v->text + t->text_off, (int)other, (int)i);
        }
    }
    sb_free(strs);
    return SB_OK;
}

/* An optional per-token array must have exactly one entry per token. */
static sb_status find_per_token(const sb_vocab *v, const sb_gguf *g, const char *key, sb_gguf_vtype elem,
                                sb_gguf_vtype alt_elem, const sb_gguf_kv **out, sb_error *err) {
    *out = sb_gguf_find(g, key);
    if (!*out)
        return SB_OK;
    sb_gguf_vtype want = (*out)->type == SB_GGUF_ARRAY && (*out)->arr_type == alt_elem ? alt_elem : elem;
    sb_status st = sb_gguf_get_arr(g, key, want, out, err);
    if (st != SB_OK)
        return st;
    if ((*out)->arr_n != (uint64_t)v->n_tokens)
        return sb_fail(err, SB_ERR_FORMAT, "%s has %llu entries but tokenizer.ggml.tokens has %d", key,
                       (unsigned long long)(*out)->arr_n, (int)v->n_tokens);
    return SB_OK;
}

static sb_status read_scores_and_types(sb_vocab *v, const sb_gguf *g, sb_error *err) {
    const sb_gguf_kv *scores, *types;
    sb_status st = find_per_token(v, g, "tokenizer.ggml.scores", SB_GGUF_FLOAT32, SB_GGUF_INT32, &scores, err);
    if (st == SB_OK)
        st = find_per_token(v, g, "tokenizer.ggml.token_type", SB_GGUF_INT32, SB_GGUF_INT32, &types, err);
    if (st != SB_OK)
        return st;
    for (int32_t i = 0; i < v->n_tokens; i++) {
        sb_vocab_token *t = &v->tokens[i];
        t->score = scores ? (float)sb_gguf_arr_f64(scores, (uint64_t)i) : 0.0f;
        int64_t type = types ? sb_gguf_arr_i64(types, (uint64_t)i) : 1;
        if (type < 0 || type > 6)
            return sb_fail(err, SB_ERR_FORMAT, "tokenizer.ggml.token_type[%d] = %lld, expected 0..6", (int)i,
                           (long long)type);
        /* 0 (undefined) gets no bits: such tokens decode to nothing, as in llama.cpp. */
        t->attr = type ? 1u << (type - 1) : 0;
    }
    return SB_OK;
}

/* A special-token id: the key's value if present (must be a token), else the
 * family default if the vocabulary has it, else -1. */
static sb_status read_id(const sb_vocab *v, const sb_gguf *g, const char *key, int32_t def, int32_t *out,
                         sb_error *err) {
    *out = def >= 0 && def < v->n_tokens ? def : -1;
    if (!sb_gguf_find(g, key))
        return SB_OK;
    int64_t id;
    sb_status st = sb_gguf_get_i64(g, key, &id, err);
    if (st != SB_OK)
        return st;
    if (id < 0 || id >= v->n_tokens)
        return sb_fail(err, SB_ERR_FORMAT, "%s = %lld is outside the vocabulary (0..%d)", key, (long long)id,
                       (int)v->n_tokens - 1);
    *out = (int32_t)id;
    return SB_OK;
}

static sb_status read_specials(sb_vocab *v, const sb_gguf *g, size_t family, bool add_bos_default, sb_error *err) {
    int32_t eot, eom, pad;
    sb_status st;
    if ((st = read_id(v, g, "tokenizer.ggml.bos_token_id", families[family].bos, &v->bos, err)) != SB_OK ||
        (st = read_id(v, g, "tokenizer.ggml.eos_token_id", families[family].eos, &v->eos, err)) != SB_OK ||
        (st = read_id(v, g, "tokenizer.ggml.unknown_token_id", families[family].unk, &v->unk, err)) != SB_OK ||
        (st = read_id(v, g, "tokenizer.ggml.padding_token_id", -1, &pad, err)) != SB_OK ||
        (st = read_id(v, g, "tokenizer.ggml.eot_token_id", -1, &eot, err)) != SB_OK ||
        (st = read_id(v, g, "tokenizer.ggml.eom_token_id", -1, &eom, err)) != SB_OK)
        return st;
    if ((st = sb_gguf_get_bool_or(g, "tokenizer.ggml.add_bos_token", add_bos_default, &v->add_bos, err)) !=
            SB_OK ||
        (st = sb_gguf_get_bool_or(g, "tokenizer.ggml.add_eos_token", false, &v->add_eos, err)) != SB_OK ||
        (st = sb_gguf_get_bool_or(g, "tokenizer.ggml.add_space_prefix", families[family].add_space_prefix,
                                  &v->add_space_prefix, err)) != SB_OK)
        return st;
    if (v->add_bos && v->bos < 0)
        return sb_fail(err, SB_ERR_FORMAT, "tokenizer.ggml.add_bos_token is true but there is no BOS token "
                                           "(tokenizer.ggml.bos_token_id)");
    if (v->add_eos && v->eos < 0)
        return sb_fail(err, SB_ERR_FORMAT, "tokenizer.ggml.add_eos_token is true but there is no EOS token "
                                           "(tokenizer.ggml.eos_token_id)");
    const int32_t ends[] = {v->eos, eot, eom};
    for (size_t i = 0; i < SB_ARRAY_LEN(ends); i++)
        if (ends[i] >= 0)
            v->tokens[ends[i]].attr |= SB_TOKEN_EOG;
    return SB_OK;
}

/* Tokens llama.cpp recognises by their text alone, because converters often
 * leave them typed NORMAL: all become CONTROL (so they are matched as special
 * tokens and hidden when decoding), and the end markers among them (end of
 * turn/text/message, and the FIM pad/repo/file-separator tokens) end
 * generation. */
static const struct {
    const char *text;
    bool eog;
} marker_tokens[] = {
    {"<|eot_id|>", true}, {"<|im_end|>", true}, {"<|end|>", true}, {"<|return|>", true}, {"<|call|>", true},
    {"<|flush|>", true}, {"<|calls|>", true}, {"<end_of_turn>", true}, {"<|endoftext|>", true}, {"</s>", true},
    {"<|eom_id|>", true}, {"<EOT>", true}, {"_<EOT>", true}, {"[EOT]", true}, {"[EOS]", true},
    {"<|end_of_text|>", true}, {"<end_of_utterance>", true}, {"<eos>", true}, {"<turn|>", true},
    {"<|tool_response>", true}, {"<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>", true},
    {"[e~[", true},
    {"<|fim_pad|>", true}, {"<fim-pad>", true}, {"<fim_pad>", true}, {"<PAD>", true}, {"[PAD]", true},
    {"<|fim_repo|>", true}, {"<|repo_name|>", true}, {"<fim-repo>", true}, {"<REPO>", true},
    {"<reponame>", true}, {"<|file_sep|>", true},
    {"<|fim_prefix|>", false}, {"<fim-prefix>", false}, {"<fim_prefix>", false},
    {"<\xef\xbd\x9c" "fim\xe2\x96\x81" "begin\xef\xbd\x9c>", false}, {"<PRE>", false}, {"\xe2\x96\x81<PRE>", false},
    {"<|code_prefix|>", false}, {"<|prefix|>", false},
    {"<|fim_suffix|>", false}, {"<fim-suffix>", false}, {"<fim_suffix>", false},
    {"<\xef\xbd\x9c" "fim\xe2\x96\x81hole\xef\xbd\x9c>", false}, {"<SUF>", false}, {"\xe2\x96\x81<SUF>", false},
    {"<|code_suffix|>", false}, {"<|suffix|>", false},
    {"<|fim_middle|>", false}, {"<fim-middle>", false}, {"<fim_middle>", false},
    {"<\xef\xbd\x9c" "fim\xe2\x96\x81" "end\xef\xbd\x9c>", false}, {"<MID>", false}, {"\xe2\x96\x81<MID>", false},
    {"<|code_middle|>", false}, {"<|middle|>", false},
};

static int32_t find_cstr(const sb_vocab *v, const char *s) { return sb__vocab_find(v, s, strlen(s)); }

static void apply_marker_tokens(sb_vocab *v) {
    for (size_t i = 0; i < SB_ARRAY_LEN(marker_tokens); i++) {
        int32_t id = find_cstr(v, marker_tokens[i].text);
        if (id >= 0)
            v->tokens[id].attr |= SB_TOKEN_CONTROL | (marker_tokens[i].eog ? SB_TOKEN_EOG : 0);
    }
}

static bool is_special(const sb_vocab_token *t) {
    return (t->attr & (SB_TOKEN_CONTROL | SB_TOKEN_USER_DEFINED | SB_TOKEN_UNKNOWN)) != 0;
}

static bool contains_ci(const char *s, size_t len, const char *needle) {
    size_t m = strlen(needle);
    for (size_t i = 0; i + m <= len; i++) {
        size_t k = 0;
        while (k < m && (s[i + k] | 0x20) == needle[k])
            k++;
        if (k == m)
            return true;
    }
    return false;
}

/* llama.cpp's rule for Phi-3 (recognised by general.name): its special
 * tokens, and "</s>", swallow the whitespace that follows them, except
 * <unk>, <s> and <|endoftext|>. */
static void apply_phi3_rstrip(sb_vocab *v, const sb_gguf *g) {
    sb_gguf_str name;
    if (sb_gguf_get_str(g, "general.name", &name, NULL) != SB_OK)
        return; /* absent or not a string: not Phi-3 */
    if (!contains_ci(name.ptr, (size_t)name.len, "phi-3") && !contains_ci(name.ptr, (size_t)name.len, "phi3"))
        return;
    for (int32_t i = 0; i < v->n_tokens; i++)
        if (is_special(&v->tokens[i]))
            v->tokens[i].attr |= SB_TOKEN_RSTRIP;
    int32_t id = find_cstr(v, "</s>");
    if (id >= 0)
        v->tokens[id].attr |= SB_TOKEN_RSTRIP;
    static const char *const keep[] = {"<unk>", "<s>", "<|endoftext|>"};
    for (size_t i = 0; i < SB_ARRAY_LEN(keep); i++)
        if ((id = find_cstr(v, keep[i])) >= 0)
            v->tokens[id].attr &= ~(uint32_t)SB_TOKEN_RSTRIP;
}

static int compare_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* The tokens cut out of text before encoding, longest first (ties by id) so
 * that a special token containing another wins, as in llama.cpp. */
static sb_status build_specials(sb_vocab *v, sb_error *err) {
    int32_t n = 0;
    for (int32_t i = 0; i < v->n_tokens; i++)
        n += is_special(&v->tokens[i]);
    uint64_t *keys = sb_calloc((size_t)n + 1, sizeof(*keys));
    v->specials = sb_calloc((size_t)n + 1, sizeof(*v->specials));
    if (!keys || !v->specials) {
        sb_free(keys);
        return no_memory(err, "special-token list");
    }
    n = 0;
    for (int32_t i = 0; i < v->n_tokens; i++)
        if (is_special(&v->tokens[i]))
            keys[n++] = (uint64_t)(UINT32_MAX - v->tokens[i].text_len) << 32 | (uint32_t)i;
    qsort(keys, (size_t)n, sizeof(*keys), compare_u64);
    for (int32_t i = 0; i < n; i++)
        v->specials[i] = (int32_t)(keys[i] & UINT32_MAX);
    v->n_specials = n;
    sb_free(keys);
    return SB_OK;
}

static void build_byte_tokens(sb_vocab *v) {
    for (int b = 0; b < 256; b++) {
        char name[8], raw = (char)b;
        snprintf(name, sizeof(name), "<0x%02X>", b);
        int32_t id = find_cstr(v, name);
        if (id < 0)
            id = sb__vocab_find(v, &raw, 1);
        v->byte_token[b] = id >= 0 ? id : v->unk;
    }
}

static sb_status load(sb_vocab *v, const sb_gguf *g, sb_error *err) {
    size_t family = 0;
    sb_status st;
    if ((st = read_family(v, g, &family, err)) != SB_OK || (st = read_tokens(v, g, err)) != SB_OK ||
        (st = read_scores_and_types(v, g, err)) != SB_OK)
        return st;
    bool add_bos_default = families[family].add_bos;
    if (v->kind == SB_VOCAB_BPE && (st = sb__bpe_load(v, g, &add_bos_default, err)) != SB_OK)
        return st;
    if ((st = read_specials(v, g, family, add_bos_default, err)) != SB_OK)
        return st;
    apply_marker_tokens(v);
    apply_phi3_rstrip(v, g);
    if ((st = build_specials(v, err)) != SB_OK)
        return st;
    build_byte_tokens(v);
    return sb__vocab_build_pieces(v, err);
}

sb_status sb_vocab_load(const sb_gguf *g, sb_vocab **out, sb_error *err) {
    *out = NULL;
    sb_vocab *v = sb_calloc(1, sizeof(*v));
    if (!v)
        return no_memory(err, "header");
    sb_status st = load(v, g, err);
    if (st != SB_OK) {
        sb_vocab_free(v);
        return st;
    }
    *out = v;
    return SB_OK;
}

void sb_vocab_free(sb_vocab *v) {
    if (!v)
        return;
    sb_free(v->tokens);
    sb_free(v->text);
    sb_free(v->pieces);
    sb_free(v->hash);
    sb_free(v->specials);
    sb__bpe_free(v->bpe);
    sb_free(v);
}

/* ---- accessors ---------------------------------------------------------- */

int32_t sb_vocab_n_tokens(const sb_vocab *v) { return v->n_tokens; }
int32_t sb_vocab_bos(const sb_vocab *v) { return v->bos; }
int32_t sb_vocab_eos(const sb_vocab *v) { return v->eos; }
bool sb_vocab_add_bos(const sb_vocab *v) { return v->add_bos; }

bool sb_vocab_is_eog(const sb_vocab *v, int32_t t) {
    return t >= 0 && t < v->n_tokens && (v->tokens[t].attr & SB_TOKEN_EOG);
}

const char *sb_vocab_text(const sb_vocab *v, int32_t t) {
    return t >= 0 && t < v->n_tokens ? v->text + v->tokens[t].text_off : NULL;
}

/* ---- special-token splitting -------------------------------------------- */

/* A stretch of the input: plain text [off, off+len), or one special token. */
typedef struct fragment {
    int32_t token; /* -1 for text */
    size_t off, len;
} fragment;

typedef struct fragment_list {
    fragment *items;
    size_t n, cap;
} fragment_list;

static bool push_fragment(fragment_list *l, int32_t token, size_t off, size_t len) {
    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 8;
        fragment *items = sb_realloc(l->items, cap * sizeof(*items));
        if (!items)
            return false;
        l->items = items;
        l->cap = cap;
    }
    l->items[l->n++] = (fragment){token, off, len};
    return true;
}

/* Offset of the first occurrence of needle in hay, or SIZE_MAX. */
static size_t find_bytes(const char *hay, size_t n, const char *needle, size_t m) {
    for (size_t i = 0; m && i + m <= n; i++) {
        const char *p = memchr(hay + i, needle[0], n - m - i + 1);
        if (!p)
            break;
        i = (size_t)(p - hay);
        if (memcmp(p, needle, m) == 0)
            return i;
    }
    return SIZE_MAX;
}

/* C-locale isspace, which llama.cpp's strip rules use. */
static bool is_c_space(char c) { return c == ' ' || (c >= '\t' && c <= '\r'); }

/* Cuts every occurrence of one special token out of the text fragments of
 * `in`, leftmost first, appending the result to `out`. */
static bool split_on(const sb_vocab *v, const char *text, const fragment_list *in, int32_t id, fragment_list *out) {
    const sb_vocab_token *t = &v->tokens[id];
    const char *s = v->text + t->text_off;
    for (size_t f = 0; f < in->n; f++) {
        fragment fr = in->items[f];
        if (fr.token >= 0 || fr.len < t->text_len) {
            if (!push_fragment(out, fr.token, fr.off, fr.len))
                return false;
            continue;
        }
        size_t off = fr.off, len = fr.len;
        while (len > 0) {
            size_t at = find_bytes(text + off, len, s, t->text_len);
            if (at == SIZE_MAX)
                break;
            size_t left = at;
            if (t->attr & SB_TOKEN_LSTRIP)
                while (left > 0 && is_c_space(text[off + left - 1]))
                    left--;
            if (left > 0 && !push_fragment(out, -1, off, left))
                return false;
            if (!push_fragment(out, id, 0, 0))
                return false;
            off += at + t->text_len;
            len -= at + t->text_len;
            if (t->attr & SB_TOKEN_RSTRIP)
                for (; len > 0 && is_c_space(text[off]); off++)
                    len--;
        }
        if (len > 0 && !push_fragment(out, -1, off, len))
            return false;
    }
    return true;
}

/* Splits text into plain-text runs and special tokens. CONTROL and UNKNOWN
 * tokens are recognised only with parse_special; USER_DEFINED tokens always
 * are (llama.cpp, after Hugging Face's added tokens). */
static sb_status split_specials(const sb_vocab *v, const char *text, size_t len, bool parse_special,
                                fragment_list *out, sb_error *err) {
    fragment_list spare = {0};
    bool ok = push_fragment(out, -1, 0, len);
    for (int32_t i = 0; ok && i < v->n_specials; i++) {
        int32_t id = v->specials[i];
        const sb_vocab_token *t = &v->tokens[id];
        if (!parse_special && (t->attr & (SB_TOKEN_CONTROL | SB_TOKEN_UNKNOWN)))
            continue;
        if (t->text_len > len)
            continue;
        spare.n = 0;
        ok = split_on(v, text, out, id, &spare);
        fragment_list tmp = *out;
        *out = spare;
        spare = tmp;
    }
    sb_free(spare.items);
    return ok ? SB_OK : sb_fail(err, SB_ERR_NOMEM, "out of memory splitting special tokens");
}

/* ---- tokenize ------------------------------------------------------------ */

sb_status sb_vocab_tokenize(const sb_vocab *v, const char *text, size_t len, bool add_special, bool parse_special,
                            int32_t *ids, size_t cap, size_t *n_out, sb_error *err) {
    if (!v || !n_out || (!text && len) || (!ids && cap))
        return sb_fail(err, SB_ERR_INVALID_ARG, "sb_tokenize: NULL vocabulary, text, ids or n_out");
    *n_out = 0;
    sb__tok_out out = {ids, cap, 0};
    if (add_special && v->add_bos)
        sb__tok_emit(&out, v->bos);
    sb_status st = SB_OK;
    if (len) {
        fragment_list frags = {0};
        encode_state es = {0};
        st = split_specials(v, text, len, parse_special, &frags, err);
        bool after_special = true;
        for (size_t i = 0; st == SB_OK && i < frags.n; i++) {
            const fragment *f = &frags.items[i];
            if (f->token >= 0) {
                sb__tok_emit(&out, f->token);
                after_special = true;
            } else {
                st = encode_text(v, &es, text + f->off, f->len, after_special, &out, err);
                after_special = false;
            }
        }
        sb_free(frags.items);
        sb__bpe_session_free(es.bpe);
        if (st != SB_OK)
            return st;
    }
    if (add_special && v->add_eos)
        sb__tok_emit(&out, v->eos);
    *n_out = out.n;
    if (out.n > cap)
        return sb_fail(err, SB_ERR_INVALID_ARG, "sb_tokenize: the text needs %zu tokens, the buffer holds %zu",
                       out.n, cap);
    return SB_OK;
}
