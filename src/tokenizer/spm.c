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
    size_t n_heap;
} spm_session;

static bool comes_first(const bigram *a, const bigram *b) {
    return a->score > b->score || (a->score == b->score && a->left < b->left);
}

static void heap_push(spm_session *ss, bigram b) {
    size_t i = ss->n_heap++;
    while (i > 0 && comes_first(&b, &ss->heap[(i - 1) / 2])) {
        ss->heap[i] = ss->heap[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    ss->heap[i] = b;
}

static bigram heap_pop(spm_session *ss) {
    bigram top = ss->heap[0], last = ss->heap[--ss->n_heap];
    size_t i = 0, n = ss->n_heap;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n)
            break;
        if (c + 1 < n && comes_first(&ss->heap[c + 1], &ss->heap[c]))
            c++;
        if (!comes_first(&ss->heap[c], &last))
            break;
        ss->heap[i] = ss->heap[c];
        i = c;
    }
    ss->heap[i] = last;
    return top;
}

static void try_pair(spm_session *ss, int32_t left, int32_t right) {
    if (left < 0 || right < 0)
        return;
    uint32_t size = ss->sym[left].n + ss->sym[right].n;
    int32_t id = sb__vocab_find(ss->v, ss->s + ss->sym[left].off, size);
    if (id >= 0)
        heap_push(ss, (bigram){ss->v->tokens[id].score, left, right, size});
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

static sb_status merge_and_emit(spm_session *ss, uint32_t n_bytes, sb__tok_out *out, sb_error *err) {
    int32_t n_sym = 0;
    for (uint32_t off = 0; off < n_bytes; n_sym++) {
        uint32_t n = SB_MIN(utf8_len((unsigned char)ss->s[off]), n_bytes - off);
        ss->sym[n_sym] = (symbol){n_sym - 1, off + n < n_bytes ? n_sym + 1 : -1, off, n};
        off += n;
    }
    for (int32_t i = 1; i < n_sym; i++)
        try_pair(ss, i - 1, i);

    while (ss->n_heap > 0) {
        bigram b = heap_pop(ss);
        symbol *l = &ss->sym[b.left], *r = &ss->sym[b.right];
        if (l->n == 0 || r->n == 0 || l->n + r->n != b.size)
            continue; /* one side was merged since this pair was queued */
        l->n += r->n;
        r->n = 0;
        l->next = r->next;
        if (r->next >= 0)
            ss->sym[r->next].prev = b.left;
        try_pair(ss, l->prev, b.left);
        try_pair(ss, b.left, l->next);
    }

    sb_status st = SB_OK;
    for (int32_t i = n_sym ? 0 : -1; st == SB_OK && i >= 0; i = ss->sym[i].next)
        st = emit_symbol(ss, &ss->sym[i], out, err);
    return st;
}

sb_status sb__spm_encode(const sb_vocab *v, const char *text, size_t len, bool after_special, sb__tok_out *out,
                         sb_error *err) {
    static const char space_mark[3] = {'\xe2', '\x96', '\x81'}; /* U+2581, SentencePiece's space */
    /* Escaped length <= 3 * (len + 1); symbols <= that; queued pairs < 3 * symbols
     * (one per initial neighbour pair, two per merge). */
    if (len > (size_t)INT32_MAX / 9 - 1)
        return sb_fail(err, SB_ERR_INVALID_ARG, "text of %zu bytes is too long to tokenize in one piece", len);
    size_t cap = 3 * (len + 1);
    char *s = sb_malloc(cap);
    symbol *sym = sb_malloc(cap * sizeof(*sym));
    bigram *heap = sb_malloc(3 * cap * sizeof(*heap));
    sb_status st;
    if (!s || !sym || !heap) {
        st = sb_fail(err, SB_ERR_NOMEM, "out of memory tokenizing %zu bytes", len);
    } else {
        size_t n = 0;
        if (after_special && v->add_space_prefix) {
            memcpy(s, space_mark, 3);
            n = 3;
        }
        for (size_t i = 0; i < len; i++) {
            if (text[i] == ' ') {
                memcpy(s + n, space_mark, 3);
                n += 3;
            } else {
                s[n++] = text[i];
            }
        }
        spm_session ss = {v, s, sym, heap, 0};
        st = merge_and_emit(&ss, (uint32_t)n, out, err);
    }
    sb_free(s);
    sb_free(sym);
    sb_free(heap);
    return st;
}
