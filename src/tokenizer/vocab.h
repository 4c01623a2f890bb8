/*
 * vocab.h - the tokenizer vocabulary read from GGUF metadata, and the
 * tokenizer and detokenizer built on it (the bodies of sb_tokenize and
 * sb_detok_* of switchboard.h).
 *
 * Behaviour follows llama.cpp's llama-vocab.cpp, which produced the test
 * vectors: special-token splitting, SentencePiece merging with byte
 * fallback, byte-level BPE with its pre-tokenizer regexes, token pieces, the
 * leading-space rule and BPE's clean-up of spaces. Each tokenizer family
 * (tokenizer.ggml.model) is one sb_vocab_kind with its own encoder file
 * (spm.c, bpe.c); vocab.c holds what they share.
 *
 * A vocabulary is read-only after sb_vocab_load and may be used from several
 * threads at once; an sb_detok_t is used by one thread at a time.
 */
#ifndef SB_TOKENIZER_VOCAB_H
#define SB_TOKENIZER_VOCAB_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gguf/gguf.h"
#include "switchboard.h"

typedef struct sb_vocab sb_vocab;

/* Reads tokenizer.ggml.* from gguf and builds the lookup tables. Copies what
 * it keeps, so gguf may be closed afterwards. On failure *out is NULL and err
 * names the offending key. */
sb_status sb_vocab_load(const sb_gguf *gguf, sb_vocab **out, sb_error *err);
void sb_vocab_free(sb_vocab *v);

int32_t sb_vocab_n_tokens(const sb_vocab *v);
int32_t sb_vocab_bos(const sb_vocab *v); /* -1 if none */
int32_t sb_vocab_eos(const sb_vocab *v); /* -1 if none */
bool sb_vocab_add_bos(const sb_vocab *v);
/* End of generation: EOS, EOT/EOM and the end markers llama.cpp knows by text. */
bool sb_vocab_is_eog(const sb_vocab *v, int32_t t);
/* The token's vocabulary string (NUL-terminated, owned by v), NULL if out of range. */
const char *sb_vocab_text(const sb_vocab *v, int32_t t);

/* As sb_tokenize in switchboard.h. */
sb_status sb_vocab_tokenize(const sb_vocab *v, const char *text, size_t len, bool add_special, bool parse_special,
                            int32_t *ids, size_t cap, size_t *n_out, sb_error *err);

/* As sb_detok_create / _push / _flush / _free in switchboard.h. The
 * detokenizer borrows v, which must outlive it. push and flush write at most
 * cap-1 bytes plus a NUL; what does not fit is kept and comes out of the next
 * push or flush (call flush until it returns 0 to drain a small buffer).
 * Ids outside the vocabulary produce nothing. */
sb_status sb_vocab_detok_create(const sb_vocab *v, bool strip_leading_space, sb_detok_t **out, sb_error *err);
size_t sb_vocab_detok_push(sb_detok_t *d, int32_t token, bool render_special, char *out, size_t cap);
size_t sb_vocab_detok_flush(sb_detok_t *d, char *out, size_t cap);
void sb_vocab_detok_free(sb_detok_t *d);

/* As sb_detokenize: the raw bytes of the pieces (llama_detokenize with
 * remove_special=false), which may be invalid UTF-8 if the ids are. BPE
 * vocabularies with clean_spaces (llama-bpe, gpt-2, default) then get
 * llama.cpp's clean-up of spaces before punctuation and contractions, and
 * *n_out is the cleaned length; the streaming detokenizer above does no
 * clean-up, like llama.cpp's token_to_piece. An id outside the vocabulary
 * fails with SB_ERR_INVALID_ARG. */
sb_status sb_vocab_detokenize(const sb_vocab *v, const int32_t *ids, size_t n, bool strip_leading_space,
                              bool render_special, char *out, size_t cap, size_t *n_out, sb_error *err);

/* ---- shared by the tokenizer's own files (vocab.c, spm.c, bpe.c, detok.c) */

/* Tokenizer families, by tokenizer.ggml.model. */
typedef enum sb_vocab_kind {
    SB_VOCAB_SPM, /* "llama": SentencePiece merges by score, byte fallback */
    SB_VOCAB_BPE, /* "gpt2": byte-level BPE, merges by rank after a regex pre-tokenizer */
} sb_vocab_kind;

typedef struct sb__bpe sb__bpe; /* bpe.c: pre-tokenizer, byte map and merge ranks */

/* Token attributes as llama.cpp keeps them: bits, because load-time fixes
 * add CONTROL to tokens whose type says NORMAL. The first six come from
 * tokenizer.ggml.token_type (1 NORMAL .. 6 BYTE; 0 = undefined = none). */
enum {
    SB_TOKEN_NORMAL = 1u << 0,
    SB_TOKEN_UNKNOWN = 1u << 1,
    SB_TOKEN_CONTROL = 1u << 2,
    SB_TOKEN_USER_DEFINED = 1u << 3,
    SB_TOKEN_UNUSED = 1u << 4,
    SB_TOKEN_BYTE = 1u << 5,
    SB_TOKEN_LSTRIP = 1u << 6, /* special token eats the whitespace before it */
    SB_TOKEN_RSTRIP = 1u << 7, /* ... and after it */
    SB_TOKEN_EOG = 1u << 8,    /* ends generation */
};

typedef struct sb_vocab_token {
    uint32_t text_off;  /* vocabulary string at v->text + text_off, NUL-terminated */
    uint32_t text_len;  /* bytes, NUL excluded */
    uint32_t piece_off; /* detokenized bytes (special tokens rendered) at v->pieces + piece_off */
    uint32_t piece_len;
    float score; /* SPM merge priority, higher first */
    uint32_t attr; /* SB_TOKEN_* bits */
} sb_vocab_token;

struct sb_vocab {
    sb_vocab_kind kind;
    int32_t n_tokens;
    sb_vocab_token *tokens; /* [n_tokens] */
    char *text;             /* every token's string, each followed by a NUL */
    char *pieces;           /* every token's piece, back to back */
    int32_t *hash;          /* open addressing: token id or -1; hash_mask + 1 slots */
    uint32_t hash_mask;
    int32_t *specials; /* ids split out of text before encoding, longest text first */
    int32_t n_specials;
    int32_t byte_token[256]; /* SPM byte fallback: <0xXX>, else the 1-byte token, else UNK, else -1 */
    int32_t bos, eos, unk; /* -1 if none */
    bool add_bos, add_eos;
    bool add_space_prefix; /* SPM dummy prefix: encode " " + text, strip it when decoding */
    bool clean_spaces;     /* BPE clean_up_tokenization_spaces in sb_vocab_detokenize (llama-bpe, gpt-2) */
    sb__bpe *bpe;          /* SB_VOCAB_BPE only, else NULL; owned */
    uint32_t max_text_len; /* longest token string: longer runs need no lookup */
    uint32_t max_piece_len;
};

/* Id of the token whose string is exactly text[0..len), or -1. */
int32_t sb__vocab_find(const sb_vocab *v, const char *text, size_t len);

/* Where encoders put ids: stored while they fit, always counted. */
typedef struct sb__tok_out {
    int32_t *ids;
    size_t cap;
    size_t n;
} sb__tok_out;

static inline void sb__tok_emit(sb__tok_out *o, int32_t id) {
    if (o->n < o->cap)
        o->ids[o->n] = id;
    o->n++;
}

/* spm.c: encodes one run of plain text (no special tokens inside);
 * after_special says whether it starts the text or follows a special token,
 * where SentencePiece puts its dummy-prefix space. */
sb_status sb__spm_encode(const sb_vocab *v, const char *text, size_t len, bool after_special, sb__tok_out *out,
                         sb_error *err);

/* bpe.c: reads tokenizer.ggml.pre and tokenizer.ggml.merges into v->bpe
 * (after the tokens are loaded) and sets v->clean_spaces; *add_bos_default
 * gets the pre-tokenizer's BOS default (true for llama-bpe), which
 * tokenizer.ggml.add_bos_token overrides. */
sb_status sb__bpe_load(sb_vocab *v, const sb_gguf *gguf, bool *add_bos_default, sb_error *err);
void sb__bpe_free(sb__bpe *bpe);

/* bpe.c: encodes one run of plain text (no special tokens inside). The
 * runs of one sb_vocab_tokenize call share *session (buffers and the cache
 * of encoded pre-tokens): it starts NULL, is created on first use and is
 * released with sb__bpe_session_free. A session belongs to one thread; the
 * vocabulary itself is only read. */
typedef struct sb__bpe_session sb__bpe_session;
sb_status sb__bpe_encode(const sb_vocab *v, sb__bpe_session **session, const char *text, size_t len,
                         sb__tok_out *out, sb_error *err);
void sb__bpe_session_free(sb__bpe_session *session);

/* bpe.c: the bytes a byte-level token string stands for (GPT-2's unicode
 * alphabet mapped back to bytes), written to dst unless dst is NULL; returns
 * the length. Characters outside the alphabet come out as llama.cpp writes
 * them ("[UNK_BYTE_0x<hex>" + the whole string + "]"), so the result may be
 * longer than the string. */
uint32_t sb__bpe_decode_piece(const char *s, uint32_t n, char *dst);

/* bpe.c: llama.cpp's clean_up_tokenization_spaces, in place on buf[0..n);
 * returns the new length (never larger). */
size_t sb__bpe_clean_spaces(char *buf, size_t n);

/* detok.c: fills v->pieces, piece_off/len and max_piece_len from the token
 * strings and attributes. */
sb_status sb__vocab_build_pieces(sb_vocab *v, sb_error *err);

#endif
