/*
 * tokutil.c - see tokutil.h.
 */
#include "tokutil.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "gguf/gguf.h"
#include "testutil.h"

sb_vocab *sb_test_load_vocab(const char *relpath) {
    sb_error err = {0};
    sb_gguf *g = NULL;
    if (sb_gguf_open(sb_test_fixture(relpath), &g, &err) != SB_OK)
        fail_msg("open %s: %s", relpath, err.msg);
    sb_vocab *v = NULL;
    if (sb_vocab_load(g, &v, &err) != SB_OK)
        fail_msg("vocab %s: %s", relpath, err.msg);
    sb_gguf_close(g);
    return v;
}

char *sb_test_detokenize(const sb_vocab *v, const int32_t *ids, size_t n, bool strip, bool render, size_t *len) {
    sb_error err = {0};
    size_t need = 0;
    assert_int_equal(sb_vocab_detokenize(v, ids, n, strip, render, NULL, 0, &need, &err), SB_ERR_INVALID_ARG);
    char *out = malloc(need + 1);
    assert_non_null(out);
    if (sb_vocab_detokenize(v, ids, n, strip, render, out, need + 1, len, &err) != SB_OK)
        fail_msg("detokenize: %s", err.msg);
    assert_int_equal(*len, need); /* the measured size is exact, clean-up included */
    return out;
}

bool sb_test_valid_utf8(const char *s, size_t n) {
    const unsigned char *p = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        unsigned c = p[i], lo = 0x80, hi = 0xBF;
        size_t need;
        if (c < 0x80)
            need = 0;
        else if (c >= 0xC2 && c <= 0xDF)
            need = 1;
        else if (c >= 0xE0 && c <= 0xEF)
            need = 2, lo = c == 0xE0 ? 0xA0 : 0x80, hi = c == 0xED ? 0x9F : 0xBF;
        else if (c >= 0xF0 && c <= 0xF4)
            need = 3, lo = c == 0xF0 ? 0x90 : 0x80, hi = c == 0xF4 ? 0x8F : 0xBF;
        else
            return false;
        for (size_t k = 1; k <= need; k++, lo = 0x80, hi = 0xBF)
            if (i + k >= n || p[i + k] < lo || p[i + k] > hi)
                return false;
        i += need + 1;
    }
    return true;
}

char *sb_test_stream(const sb_vocab *v, const int32_t *ids, size_t n, bool strip, bool render, size_t *len) {
    sb_error err = {0};
    sb_detok_t *d = NULL;
    assert_int_equal(sb_vocab_detok_create(v, strip, &d, &err), SB_OK);
    size_t cap = 64 + 512 * (n + 1), total = 0;
    char *all = malloc(cap), chunk[512];
    assert_non_null(all);
    for (size_t i = 0; i <= n; i++) {
        size_t k = i < n ? sb_vocab_detok_push(d, ids[i], render, chunk, sizeof(chunk))
                         : sb_vocab_detok_flush(d, chunk, sizeof(chunk));
        assert_true(k < sizeof(chunk));
        assert_int_equal(chunk[k], '\0');
        assert_true(sb_test_valid_utf8(chunk, k));
        memcpy(all + total, chunk, k);
        total += k;
    }
    assert_int_equal(sb_vocab_detok_flush(d, chunk, sizeof(chunk)), 0);
    sb_vocab_detok_free(d);
    *len = total;
    return all;
}

void sb_test_assert_ids(const int32_t *got, size_t n_got, const int32_t *want, size_t n_want) {
    assert_int_equal(n_got, n_want);
    for (size_t i = 0; i < n_want; i++)
        assert_int_equal(got[i], want[i]);
}

size_t sb_test_json_ids(const cJSON *arr, int32_t *ids, size_t cap) {
    size_t n = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, arr) {
        assert_true(n < cap);
        ids[n++] = (int32_t)e->valuedouble;
    }
    return n;
}
