/*
 * tokutil.h - helpers shared by the tokenizer tests (SentencePiece and
 * BPE): loading a fixture's vocabulary, whole and streaming detokenization
 * with their invariants checked, and id-array comparisons.
 */
#ifndef SB_TOKUTIL_H
#define SB_TOKUTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "tokenizer/vocab.h"

/* The vocabulary of a fixture GGUF (the file is closed again: the
 * vocabulary must not depend on it). Fails the test on error. */
sb_vocab *sb_test_load_vocab(const char *relpath);

/* Whole-sequence detokenization into a malloc'd string; checks that the
 * measuring call reports the exact size. */
char *sb_test_detokenize(const sb_vocab *v, const int32_t *ids, size_t n, bool strip, bool render, size_t *len);

/* Pushes ids one at a time, checking that every chunk is valid UTF-8 and
 * NUL-terminated; returns the concatenation of the chunks and the flush. */
char *sb_test_stream(const sb_vocab *v, const int32_t *ids, size_t n, bool strip, bool render, size_t *len);

bool sb_test_valid_utf8(const char *s, size_t n);
void sb_test_assert_ids(const int32_t *got, size_t n_got, const int32_t *want, size_t n_want);
/* Reads a JSON array of integers into ids (cap entries); returns the count. */
size_t sb_test_json_ids(const cJSON *arr, int32_t *ids, size_t cap);

#endif
