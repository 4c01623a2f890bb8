/*
 * fuzz_tokenizer.c - tokenize, detokenize and the streaming detokenizer on
 * a SentencePiece vocabulary (stories260K) and a byte-level BPE one (qwen2);
 * the first input byte picks the vocabulary and the flags, the rest is the
 * text. Checked: every id is in the vocabulary; the streaming detokenizer,
 * fed one token at a time, gives what sb_detokenize gives for the whole list
 * with each maximal ill-formed UTF-8 subpart replaced by U+FFFD (the
 * contract in switchboard.h: sb_detokenize returns the tokens' exact bytes,
 * as llama.cpp's detokenizer does, the stream valid UTF-8); on the BPE
 * vocabulary valid UTF-8 text comes back unchanged.
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

/* Whether the k bytes at s begin some well-formed character: an oracle
 * independent of detok.c's, through utf8proc. The first continuation byte
 * is the only one whose range depends on the lead (E0, ED, F0, F4), so
 * trying its range ends with 0x80 for the rest covers every completion. */
static bool starts_character(const uint8_t *s, size_t k) {
    static const uint8_t next[] = {0x80, 0x8F, 0x90, 0x9F, 0xA0, 0xBF};
    for (size_t len = k + 1; len <= 4; len++)
        for (size_t j = 0; j < sizeof next; j++) {
            uint8_t c[4];
            memcpy(c, s, k);
            for (size_t i = k; i < len; i++)
                c[i] = i == k && k == 1 ? next[j] : 0x80;
            if (valid_utf8(c, len))
                return true;
        }
    return false;
}

/* s with each maximal ill-formed subpart (Unicode's definition: the longest
 * start of a character that does not finish, else one byte) replaced by
 * U+FFFD, into out (3 * n bytes suffice); returns its length. */
static size_t replace_ill_formed(const uint8_t *s, size_t n, uint8_t *out) {
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        utf8proc_int32_t cp;
        utf8proc_ssize_t k = utf8proc_iterate(s + i, (utf8proc_ssize_t)(n - i), &cp);
        if (k > 0) {
            memcpy(out + o, s + i, (size_t)k);
            o += (size_t)k;
            i += (size_t)k;
            continue;
        }
        size_t bad = 1;
        while (bad < 3 && i + bad < n && starts_character(s + i, bad + 1))
            bad++;
        memcpy(out + o, "\xef\xbf\xbd", 3);
        o += 3;
        i += bad;
    }
    return o;
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
        uint8_t *expected = sb_malloc(3 * whole_n + 1);
        size_t expected_n = expected ? replace_ill_formed((const uint8_t *)whole, whole_n, expected) : 0;
        if (expected && (stream_n != expected_n || memcmp(stream, expected, expected_n) != 0))
            fail("streaming detokenization differs from the whole list's with U+FFFD for ill-formed bytes", text, len);
        sb_free(expected);
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
