/*
 * spm.c - the SentencePiece encoder of "llama" vocabularies (Llama 1/2,
 * Mistral v1, stories260K), matching llama.cpp's llm_tokenizer_spm.
 *
 * The text, with every ASCII space written as U+2581 and one more in front
 * when it starts the input or follows a special token, is cut into UTF-8
 * characters. Then, repeatedly, the adjacent pair whose concatenation is a
 * token with the highest score is merged (leftmost first on equal scores)
 * until no adjacent pair forms a token. Candidate pairs wait in a max-heap;
 * a pair made stale by a later merge is recognised because its recorded
 * length no longer matches its two symbols, so each merge costs O(log n).
 * Symbols that are not tokens become <0xXX> byte tokens.
 *
 * Invalid UTF-8 is cut exactly as llama.cpp cuts it (the lead byte's high
 * nibble alone gives the length), so such input still encodes, via bytes.
 */
#include <string.h>

#include "base/base.h"
#include "tokenizer/heap.h"
#include "tokenizer/vocab.h"

/* A run of the escaped text; merged-away symbols have n == 0. */
typedef struct symbol {
    int32_t prev, next; /* neighbours in the live chain, -1 at the ends */
    uint32_t off, n;    /* bytes [off, off+n) of the escaped text */
} symbol;

typedef struct bigram {
    float score;         /* of the token the pair would become */
    int32_t left, right; /* symbol indices */
    uint32_t size;       /* bytes of the pair when queued */
} bigram;

typedef struct spm_session {
    const sb_vocab *v;
    const char *s; /* escaped text */
    symbol *sym;
    bigram *heap; /* max-heap by (score, then lower left) */
    size_t n_heap, cap_heap;
} spm_session;

static bool comes_first(const bigram *a, const bigram *b) {
    return a->score > b->score || (a->score == b->score && a->left < b->left);
}

SB__HEAP(bigram_heap, bigram, comes_first)

/* Queues the pair if it forms a token; false only when out of memory. */
static bool try_pair(spm_session *ss, int32_t left, int32_t right) {
    if (left < 0 || right < 0)
        return true;
    uint32_t size = ss->sym[left].n + ss->sym[right].n;
    if (size > ss->v->max_text_len)
        return true;
    int32_t id = sb__vocab_find(ss->v, ss->s + ss->sym[left].off, size);
    return id < 0 || bigram_heap_push(&ss->heap, &ss->n_heap, &ss->cap_heap, (bigram){ss->v->tokens[id].score, left, right, size});
}

/* Bytes of the UTF-8 character a lead byte announces, as llama.cpp's
 * unicode_len_utf8: continuation and invalid bytes count as one. */
static uint32_t utf8_len(unsigned char c) {
    static const uint8_t by_high_nibble[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
    return by_high_nibble[c >> 4];
}

static sb_status emit_symbol(spm_session *ss, const symbol *sym, sb__tok_out *out, sb_error *err) {
    int32_t id = sb__vocab_find(ss->v, ss->s + sym->off, sym->n);
    if (id >= 0) {
        sb__tok_emit(out, id);
        return SB_OK;
    }
    for (uint32_t i = 0; i < sym->n; i++) {
        unsigned char b = (unsigned char)ss->s[sym->off + i];
        if (ss->v->byte_token[b] < 0)
            return sb_fail(err, SB_ERR_UNSUPPORTED,
                           "the vocabulary cannot encode byte 0x%02X (no <0x%02X>, no 1-byte token, no UNK)", b, b);
        sb__tok_emit(out, ss->v->byte_token[b]);
    }
    return SB_OK;
}

static sb_status merge_and_emit(spm_session *ss, int32_t n_sym, sb__tok_out *out, sb_error *err) {
    bool ok = true;
    for (int32_t i = 1; ok && i < n_sym; i++)
        ok = try_pair(ss, i - 1, i);
    while (ok && ss->n_heap > 0) {
        bigram b = bigram_heap_pop(ss->heap, &ss->n_heap);
        symbol *l = &ss->sym[b.left], *r = &ss->sym[b.right];
        if (l->n == 0 || r->n == 0 || l->n + r->n != b.size)
            continue; /* one side was merged since this pair was queued */
        l->n += r->n;
        r->n = 0;
        l->next = r->next;
        if (r->next >= 0)
            ss->sym[r->next].prev = b.left;
        ok = try_pair(ss, l->prev, b.left) && try_pair(ss, b.left, l->next);
    }
    if (!ok)
        return sb_fail(err, SB_ERR_NOMEM, "out of memory merging %d symbols", (int)n_sym);

    sb_status st = SB_OK;
    for (int32_t i = n_sym ? 0 : -1; st == SB_OK && i >= 0; i = ss->sym[i].next)
        st = emit_symbol(ss, &ss->sym[i], out, err);
    return st;
}

/* Writes the text with spaces as U+2581 (and the dummy prefix) into s, or
 * only measures it when s is NULL; returns the length. */
static size_t escape(const sb_vocab *v, const char *text, size_t len, bool after_special, char *s) {
    static const char space_mark[3] = {'\xe2', '\x96', '\x81'}; /* U+2581, SentencePiece's space */
    size_t n = 0;
    if (after_special && v->add_space_prefix) {
        if (s)
            memcpy(s, space_mark, 3);
        n = 3;
    }
    for (size_t i = 0; i < len; i++) {
        if (text[i] == ' ') {
            if (s)
                memcpy(s + n, space_mark, 3);
            n += 3;
        } else {
            if (s)
                s[n] = text[i];
            n++;
        }
    }
    return n;
}

sb_status sb__spm_encode(const sb_vocab *v, const char *text, size_t len, bool after_special, sb__tok_out *out,
                         sb_error *err) {
    size_t n_bytes = escape(v, text, len, after_special, NULL);
    if (n_bytes > INT32_MAX)
        return sb_fail(err, SB_ERR_INVALID_ARG, "text of %zu bytes is too long to tokenize in one piece", len);
    char *s = sb_malloc(n_bytes);
    if (!s)
        return sb_fail(err, SB_ERR_NOMEM, "out of memory tokenizing %zu bytes", len);
    escape(v, text, len, after_special, s);

    int32_t n_sym = 0;
    for (size_t off = 0; off < n_bytes; n_sym++)
        off += SB_MIN(utf8_len((unsigned char)s[off]), n_bytes - off);
    size_t cap_heap = (size_t)n_sym + 1; /* grows on demand; rarely needed */
    spm_session ss = {v, s, sb_malloc((size_t)n_sym * sizeof(symbol)), sb_malloc(cap_heap * sizeof(bigram)), 0,
                      cap_heap};
    sb_status st;
    if (!ss.sym || !ss.heap) {
        st = sb_fail(err, SB_ERR_NOMEM, "out of memory tokenizing %zu bytes", len);
    } else {
        uint32_t off = 0;
        for (int32_t i = 0; i < n_sym; i++) {
            uint32_t n = SB_MIN(utf8_len((unsigned char)s[off]), (uint32_t)n_bytes - off);
            ss.sym[i] = (symbol){i - 1, i + 1 < n_sym ? i + 1 : -1, off, n};
            off += n;
        }
        st = merge_and_emit(&ss, n_sym, out, err);
    }
    sb_free(s);
    sb_free(ss.sym);
    sb_free(ss.heap);
    return st;
}
