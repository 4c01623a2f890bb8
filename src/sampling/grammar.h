/*
 * grammar.h - grammar-constrained sampling: GBNF grammars (as llama.cpp
 * writes them, so existing grammars work), a matcher that follows the text
 * generated so far, and the mask of tokens that can continue it.
 *
 * Three objects, from longest-lived to shortest:
 *   - sb_grammar_vocab: one per model vocabulary. The tokens' bytes (the
 *     tokenizer's pieces: SentencePiece's U+2581 as a space, <0xNN> byte
 *     tokens as their byte, byte-level BPE mapped back to bytes) in a trie,
 *     so that one walk tests every token sharing a prefix at once; and a
 *     small cache of compiled grammars by their text.
 *   - sb_grammar: a compiled grammar, immutable, reference-counted, shared
 *     by every sequence constrained by it. It owns the cache of token masks
 *     per parser stack (see grammar.c), which is what makes a constrained
 *     step cheap once a state has been seen.
 *   - sb_grammar_matcher: one per sequence: the parser's stacks (a
 *     pushdown automaton run on code points, as llama.cpp's) and a UTF-8
 *     character still incomplete at the end of the last token.
 *
 * The mask has a bit per token: set where the token's bytes can continue a
 * valid output. End-of-generation tokens are allowed only where the grammar
 * accepts the text so far; special tokens never otherwise. Grammars and
 * vocabularies may be used from many threads (the mask cache has a lock); a
 * matcher by one thread at a time.
 */
#ifndef SB_SAMPLING_GRAMMAR_H
#define SB_SAMPLING_GRAMMAR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "switchboard.h"

typedef struct sb_grammar_vocab sb_grammar_vocab;
typedef struct sb_grammar sb_grammar;
typedef struct sb_grammar_matcher sb_grammar_matcher;

/* Builds the token trie of `model`'s vocabulary (borrowed: must outlive it). */
sb_status sb_grammar_vocab_create(const sb_model_t *model, sb_grammar_vocab **out, sb_error *err);
/* Frees the vocabulary and drops its cache's references. */
void sb_grammar_vocab_free(sb_grammar_vocab *v);

/* Parses and compiles `len` bytes of GBNF text whose start rule is "root".
 * A syntax error, an undefined rule, a missing root or a left-recursive
 * rule fails with SB_ERR_INVALID_ARG and a message naming the line and
 * column. With a vocabulary the grammar can make masks and is cached by
 * its text (the same text gives the same grammar, new reference); without
 * (vocab NULL) only text can be matched, which the tests use. The caller
 * owns one reference. */
sb_status sb_grammar_create(sb_grammar_vocab *vocab, const char *text, size_t len, sb_grammar **out, sb_error *err);
sb_grammar *sb_grammar_ref(sb_grammar *g);
void sb_grammar_unref(sb_grammar *g);
/* Rules after compilation (groups and repetitions become rules), for tests. */
int32_t sb_grammar_n_rules(const sb_grammar *g);

/* A matcher at the start of the grammar; holds a reference to g. */
sb_status sb_grammar_matcher_create(sb_grammar *g, sb_grammar_matcher **out, sb_error *err);
void sb_grammar_matcher_free(sb_grammar_matcher *m);
/* The tokens allowed next: n_vocab bits (bit t of word t / 32), owned by
 * the matcher and valid until its next call. The grammar must have a
 * vocabulary. When no token can continue (a grammar no token sequence can
 * complete) the end-of-generation tokens are allowed, so that generation
 * ends rather than runs on. */
const uint32_t *sb_grammar_matcher_mask(sb_grammar_matcher *m);
/* Advances over a token's bytes (an end-of-generation token: only checks
 * that the grammar accepts). Returns false, the matcher unchanged, if the
 * token cannot continue the output. */
bool sb_grammar_matcher_accept_token(sb_grammar_matcher *m, int32_t token);
/* Advances over bytes of text; false (matcher unchanged) if they cannot
 * continue the output. */
bool sb_grammar_matcher_accept_text(sb_grammar_matcher *m, const char *text, size_t len);
/* Whether the bytes could be taken next (the matcher does not move). */
bool sb_grammar_matcher_can_take(sb_grammar_matcher *m, const char *text, size_t len);
/* Whether the text so far is a complete sentence of the grammar. */
bool sb_grammar_matcher_accepting(const sb_grammar_matcher *m);

#endif
