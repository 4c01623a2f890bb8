/*
 * fuzz_tokenizer.c - tokenize, detokenize and the streaming detokenizer on
 * a SentencePiece vocabulary (stories260K) and a byte-level BPE one (qwen2);
 * the first input byte picks the vocabulary and the flags, the rest is the
 * text. Checked: every id is in the vocabulary; the streaming detokenizer,
 * fed one token at a time, gives exactly what sb_detokenize gives for the
 * whole list when that is valid UTF-8 (sb_detokenize passes byte tokens
 * through as they are, the streaming one makes invalid UTF-8 U+FFFD: see
 * docs/RELIABILITY.md); on the BPE vocabulary valid UTF-8 text comes back
 * unchanged.
 */
#include <stdint.h>
#include <string.h>

#include <utf8proc.h>

#include "fuzz_common.h"

static sb_model_t *spm, *bpe;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    spm = fuzz_fixture_model("models/stories260K.gguf");
    bpe = fuzz_fixture_model("models/qwen2-vocab-tiny-random.gguf");
    return 0;
}

static bool valid_utf8(const uint8_t *s, size_t n) {
    for (size_t i = 0; i < n;) {
        utf8proc_int32_t cp;
        utf8proc_ssize_t k = utf8proc_iterate(s + i, (utf8proc_ssize_t)(n - i), &cp);
        if (k <= 0)
            return false;
        i += (size_t)k;
    }
    return true;
}

static void fail(const char *what, const uint8_t *text, size_t n) {
    fprintf(stderr, "fuzz_tokenizer: %s for %zu bytes of text\n", what, n);
    abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size == 0 || size > 4096)
        return 0;
    uint8_t flags = data[0];
    const uint8_t *text = data + 1;
    size_t len = size - 1;
    sb_model_t *m = flags & 1 ? bpe : spm;
    bool add_special = flags & 2, parse_special = flags & 4, strip = flags & 8, render_special = flags & 16;
    size_t cap = len + 8, n = 0;
    int32_t *ids = sb_malloc(cap * sizeof *ids);
    if (!ids || sb_tokenize(m, (const char *)text, len, add_special, parse_special, ids, cap, &n, NULL) != SB_OK) {
        sb_free(ids);
        return 0;
    }
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= sb_model_n_vocab(m))
            fail("a token id outside the vocabulary", text, len);

    size_t out_cap = 64 * (n + 1) + 4 * len, whole_n = 0, stream_n = 0;
    char *whole = sb_malloc(out_cap), *stream = sb_malloc(out_cap);
    sb_detok_t *d = NULL;
    if (whole && stream &&
        sb_detokenize(m, ids, n, strip, render_special, whole, out_cap, &whole_n, NULL) == SB_OK &&
        sb_detok_create(m, strip, &d, NULL) == SB_OK) {
        for (size_t i = 0; i < n; i++)
            stream_n += sb_detok_push(d, ids[i], render_special, stream + stream_n, out_cap - stream_n);
        stream_n += sb_detok_flush(d, stream + stream_n, out_cap - stream_n);
        if (valid_utf8((const uint8_t *)whole, whole_n) && (stream_n != whole_n || memcmp(stream, whole, whole_n) != 0))
            fail("streaming detokenization differs from the whole list's", text, len);
        if (m == bpe && !add_special && !parse_special && !render_special && valid_utf8(text, len) &&
            (whole_n != len || memcmp(whole, text, len) != 0))
            fail("BPE round trip changed valid UTF-8 text", text, len);
    }
    sb_detok_free(d);
    sb_free(whole);
    sb_free(stream);
    sb_free(ids);
    return 0;
}
