/*
 * detok.c - token pieces, and detokenizing: whole sequences and streams.
 *
 * A token's piece is the bytes it stands for: for SentencePiece, the string
 * with U+2581 turned back into spaces, a <0xXX> byte token as that byte; for
 * byte-level BPE, the string mapped back through GPT-2's byte alphabet; and a
 * special token as its text (shown only when asked). Pieces are built once
 * at load. Detokenizing concatenates them and, when decoding from the start
 * of a text, drops one leading space of the first piece (the dummy prefix),
 * exactly as llama_detokenize(remove_special=false); BPE vocabularies that
 * ask for it (llama-bpe, gpt-2) then get llama.cpp's clean-up of spaces
 * before punctuation and contractions. The streaming detokenizer, like
 * llama.cpp's token_to_piece, does no clean-up.
 *
 * The streaming detokenizer emits only whole UTF-8 characters: bytes that
 * may still become a character wait for the next token; bytes that cannot
 * become one are replaced by U+FFFD, one per maximal ill-formed subpart
 * (Unicode's recommended practice), so for valid text the stream and the
 * whole-sequence result are identical.
 */
#include <string.h>

#include "base/base.h"
#include "tokenizer/vocab.h"

/* ---- pieces ------------------------------------------------------------- */

static int hex_digit(char c) {
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    return -1;
}

static uint32_t copy_text(const char *s, uint32_t n, char *dst) {
    if (dst)
        memcpy(dst, s, n);
    return n;
}

/* Writes the piece of token t at dst, or only measures it when dst is NULL,
 * and returns its length. */
static uint32_t make_piece(const sb_vocab *v, const sb_vocab_token *t, char *dst) {
    const char *s = v->text + t->text_off;
    uint32_t n = t->text_len;
    if (t->attr & (SB_TOKEN_CONTROL | SB_TOKEN_UNKNOWN | SB_TOKEN_USER_DEFINED))
        return copy_text(s, n, dst);
    if ((t->attr & SB_TOKEN_NORMAL) && v->kind == SB_VOCAB_BPE)
        return sb__bpe_decode_piece(s, n, dst);
    if (t->attr & SB_TOKEN_NORMAL) {
        uint32_t w = 0;
        for (uint32_t i = 0; i < n; i++, w++) {
            char c = s[i];
            if (i + 2 < n && memcmp(s + i, "\xe2\x96\x81", 3) == 0) {
                c = ' ';
                i += 2;
            }
            if (dst)
                dst[w] = c;
        }
        return w;
    }
    if (t->attr & SB_TOKEN_BYTE) {
        int hi = n == 6 && memcmp(s, "<0x", 3) == 0 && s[5] == '>' ? hex_digit(s[3]) : -1;
        int lo = hi >= 0 ? hex_digit(s[4]) : -1;
        if (lo < 0) /* not "<0xXX>": show what the vocabulary says */
            return copy_text(s, n, dst);
        if (dst)
            dst[0] = (char)(hi * 16 + lo);
        return 1;
    }
    return 0; /* UNUSED and undefined tokens decode to nothing */
}

sb_status sb__vocab_build_pieces(sb_vocab *v, sb_error *err) {
    /* Pieces are measured first: a BPE piece with a character outside the
     * byte alphabet is longer than its text. */
    uint64_t total = 0;
    for (int32_t i = 0; i < v->n_tokens; i++)
        total += make_piece(v, &v->tokens[i], NULL);
    if (total >= UINT32_MAX)
        return sb_fail(err, SB_ERR_FORMAT, "the vocabulary's pieces take %llu bytes, more than 4 GiB",
                       (unsigned long long)total);
    v->pieces = sb_malloc((size_t)total + 1);
    if (!v->pieces)
        return sb_fail(err, SB_ERR_NOMEM, "out of memory for the vocabulary's pieces");
    uint32_t off = 0;
    v->max_piece_len = 0;
    for (int32_t i = 0; i < v->n_tokens; i++) {
        sb_vocab_token *t = &v->tokens[i];
        t->piece_off = off;
        t->piece_len = make_piece(v, t, v->pieces + off);
        off += t->piece_len;
        v->max_piece_len = SB_MAX(v->max_piece_len, t->piece_len);
    }
    return SB_OK;
}

/* The bytes token `id` (in range) adds to the output. */
static const char *piece_of(const sb_vocab *v, int32_t id, bool render_special, size_t *len) {
    const sb_vocab_token *t = &v->tokens[id];
    if (!render_special && (t->attr & (SB_TOKEN_CONTROL | SB_TOKEN_UNKNOWN))) {
        *len = 0;
        return "";
    }
    *len = t->piece_len;
    return v->pieces + t->piece_off;
}

/* Drops the dummy-prefix space from the first piece of a text. */
static const char *strip_space(const char *p, size_t *len) {
    if (*len > 0 && p[0] == ' ') {
        (*len)--;
        return p + 1;
    }
    return p;
}

/* ---- whole sequences ---------------------------------------------------- */

/* Concatenates the pieces of ids, storing the first `cap` bytes at out (no
 * NUL) and counting all of them in *total. */
static sb_status concat_pieces(const sb_vocab *v, const int32_t *ids, size_t n, bool strip_leading_space,
                               bool render_special, char *out, size_t cap, size_t *total, sb_error *err) {
    bool strip = strip_leading_space && v->add_space_prefix;
    *total = 0;
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= v->n_tokens)
            return sb_fail(err, SB_ERR_INVALID_ARG, "sb_detokenize: token %d at index %zu is outside the vocabulary (0..%d)",
                           (int)ids[i], i, (int)v->n_tokens - 1);
        size_t len;
        const char *p = piece_of(v, ids[i], render_special, &len);
        if (strip)
            p = strip_space(p, &len);
        strip = false; /* only the first token, even if it decodes to nothing */
        if (*total < cap)
            memcpy(out + *total, p, SB_MIN(len, cap - *total));
        *total += len;
    }
    return SB_OK;
}

sb_status sb_vocab_detokenize(const sb_vocab *v, const int32_t *ids, size_t n, bool strip_leading_space,
                              bool render_special, char *out, size_t cap, size_t *n_out, sb_error *err) {
    if (!v || !n_out || (!ids && n) || (!out && cap))
        return sb_fail(err, SB_ERR_INVALID_ARG, "sb_detokenize: NULL vocabulary, ids, out or n_out");
    *n_out = 0;
    size_t total = 0;
    sb_status st;
    if (!v->clean_spaces) {
        st = concat_pieces(v, ids, n, strip_leading_space, render_special, out, cap ? cap - 1 : 0, &total, err);
        if (st != SB_OK)
            return st;
    } else {
        /* The clean-up looks at the whole text, so it runs on a full copy;
         * then *n_out is the exact cleaned length even when out is too small. */
        size_t raw;
        if ((st = concat_pieces(v, ids, n, strip_leading_space, render_special, NULL, 0, &raw, err)) != SB_OK)
            return st;
        char *tmp = sb_malloc(raw ? raw : 1);
        if (!tmp)
            return sb_fail(err, SB_ERR_NOMEM, "sb_detokenize: out of memory for %zu bytes", raw);
        concat_pieces(v, ids, n, strip_leading_space, render_special, tmp, raw, &raw, err);
        total = sb__bpe_clean_spaces(tmp, raw);
        if (cap)
            memcpy(out, tmp, SB_MIN(total, cap - 1));
        sb_free(tmp);
    }
    if (cap)
        out[SB_MIN(total, cap - 1)] = '\0';
    *n_out = total;
    if (total >= cap)
        return sb_fail(err, SB_ERR_INVALID_ARG, "sb_detokenize: the text needs %zu bytes plus a NUL, the buffer holds %zu",
                       total, cap);
    return SB_OK;
}

/* ---- streaming ---------------------------------------------------------- */

struct sb_detok {
    const sb_vocab *v;
    bool strip_next; /* the next piece starts the text: drop its dummy-prefix space */
    char *held;      /* bytes not emitted yet: an unfinished character, or what did not fit */
    size_t n_held, cap_held;
};

typedef enum { UTF8_VALID, UTF8_INVALID, UTF8_INCOMPLETE } utf8_kind;

/* Classifies the character starting at p (r > 0 bytes available); *n gets
 * the bytes it spans, or, if invalid, the length of its maximal ill-formed
 * subpart; INCOMPLETE means the r bytes are a valid start of a character. */
static utf8_kind utf8_next(const unsigned char *p, size_t r, size_t *n) {
    unsigned c = p[0], lo = 0x80, hi = 0xBF;
    size_t need;
    if (c < 0x80) {
        *n = 1;
        return UTF8_VALID;
    } else if (c >= 0xC2 && c <= 0xDF) {
        need = 1;
    } else if (c >= 0xE0 && c <= 0xEF) {
        need = 2;
        lo = c == 0xE0 ? 0xA0 : 0x80; /* no overlong forms */
        hi = c == 0xED ? 0x9F : 0xBF; /* no surrogates */
    } else if (c >= 0xF0 && c <= 0xF4) {
        need = 3;
        lo = c == 0xF0 ? 0x90 : 0x80;
        hi = c == 0xF4 ? 0x8F : 0xBF; /* nothing above U+10FFFF */
    } else {
        *n = 1;
        return UTF8_INVALID;
    }
    for (size_t k = 1; k <= need; k++) {
        if (k >= r) {
            *n = k;
            return UTF8_INCOMPLETE;
        }
        if (p[k] < lo || p[k] > hi) {
            *n = k;
            return UTF8_INVALID;
        }
        lo = 0x80;
        hi = 0xBF;
    }
    *n = need + 1;
    return UTF8_VALID;
}

/* Moves whole characters from held to out (at most cap-1 bytes, then a NUL);
 * with `final`, an unfinished character is emitted as U+FFFD too. */
static size_t drain(sb_detok_t *d, char *out, size_t cap, bool final) {
    static const char replacement[3] = {'\xef', '\xbf', '\xbd'}; /* U+FFFD */
    const unsigned char *h = (const unsigned char *)d->held;
    size_t limit = cap ? cap - 1 : 0, w = 0, i = 0;
    while (i < d->n_held) {
        size_t n;
        utf8_kind kind = utf8_next(h + i, d->n_held - i, &n);
        if (kind == UTF8_INCOMPLETE && !final)
            break;
        const char *src = kind == UTF8_VALID ? d->held + i : replacement;
        size_t m = kind == UTF8_VALID ? n : sizeof(replacement);
        if (w + m > limit)
            break;
        memcpy(out + w, src, m);
        w += m;
        i += n;
    }
    memmove(d->held, d->held + i, d->n_held - i);
    d->n_held -= i;
    if (cap)
        out[w] = '\0';
    return w;
}

sb_status sb_vocab_detok_create(const sb_vocab *v, bool strip_leading_space, sb_detok_t **out, sb_error *err) {
    *out = NULL;
    sb_detok_t *d = sb_calloc(1, sizeof(*d));
    /* Room for any piece plus an unfinished character, so pushes into a
     * large enough buffer never reallocate. */
    size_t cap = (size_t)v->max_piece_len + 8;
    char *held = sb_malloc(cap);
    if (!d || !held) {
        sb_free(d);
        sb_free(held);
        return sb_fail(err, SB_ERR_NOMEM, "out of memory for a detokenizer");
    }
    *d = (sb_detok_t){v, strip_leading_space && v->add_space_prefix, held, 0, cap};
    *out = d;
    return SB_OK;
}

size_t sb_vocab_detok_push(sb_detok_t *d, int32_t token, bool render_special, char *out, size_t cap) {
    if (token >= 0 && token < d->v->n_tokens) {
        size_t len;
        const char *p = piece_of(d->v, token, render_special, &len);
        if (d->strip_next)
            p = strip_space(p, &len);
        d->strip_next = false;
        if (d->n_held + len > d->cap_held) {
            size_t cap_held = SB_MAX(2 * d->cap_held, d->n_held + len);
            char *held = sb_realloc(d->held, cap_held);
            if (held) {
                d->held = held;
                d->cap_held = cap_held;
            } else {
                len = 0; /* out of memory: this piece is lost, the stream stays valid */
            }
        }
        memcpy(d->held + d->n_held, p, len);
        d->n_held += len;
    }
    return drain(d, out, cap, false);
}

size_t sb_vocab_detok_flush(sb_detok_t *d, char *out, size_t cap) { return drain(d, out, cap, true); }

void sb_vocab_detok_free(sb_detok_t *d) {
    if (d)
        sb_free(d->held);
    sb_free(d);
}
