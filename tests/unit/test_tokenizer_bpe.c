/*
 * test_tokenizer_bpe.c - the byte-level BPE tokenizer ("gpt2" vocabularies)
 * and its detokenizer against llama.cpp's output for the real Llama 3 and
 * Qwen2 vocabularies (models/llama3-tokenizer.jsonl, qwen2-tokenizer.jsonl),
 * plus BOS/EOG metadata, model loading, the other pre-tokenizers, malformed
 * input, streaming, the clean-up of spaces and merge rules on small
 * synthetic vocabularies.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>
#include <cmocka.h>

#include "base/base.h"
#include "gguf/gguf.h"
#include "switchboard.h"
#include "testutil.h"
#include "tokutil.h"
#include "tokenizer/vocab.h"

#define LLAMA3 "models/llama3-vocab-tiny-random.gguf"
#define QWEN2 "models/qwen2-vocab-tiny-random.gguf"

/* Tokenizes into a malloc'd array sized by a first measuring call. */
static int32_t *tokenize(const sb_vocab *v, const char *text, size_t len, bool add_special, bool parse_special,
                         size_t *n) {
    sb_error err = {0};
    sb_status st = sb_vocab_tokenize(v, text, len, add_special, parse_special, NULL, 0, n, &err);
    if (st != SB_OK && !(st == SB_ERR_INVALID_ARG && *n > 0))
        fail_msg("tokenize: %s", err.msg);
    int32_t *ids = malloc((*n + 1) * sizeof(*ids));
    assert_non_null(ids);
    size_t n2 = 0;
    if (sb_vocab_tokenize(v, text, len, add_special, parse_special, ids, *n, &n2, &err) != SB_OK)
        fail_msg("tokenize: %s", err.msg);
    assert_int_equal(n2, *n);
    return ids;
}

static bool same_ids(const int32_t *a, size_t na, const int32_t *b, size_t nb) {
    return na == nb && (na == 0 || memcmp(a, b, na * sizeof(*a)) == 0);
}

static bool same_text(const char *a, size_t na, const char *b) {
    return na == strlen(b) && memcmp(a, b, na) == 0;
}

/* ---- llama.cpp reference vectors ---------------------------------------- */

typedef struct jsonl_counts {
    int lines, ids, ids_special, detok, detok_special, stream, split_chars;
} jsonl_counts;

static jsonl_counts run_jsonl(const char *model, const char *jsonl) {
    sb_vocab *v = sb_test_load_vocab(model);
    char *data = sb_test_read_file(sb_test_fixture(jsonl), NULL);
    assert_non_null(data);
    jsonl_counts c = {0};
    for (char *line = strtok(data, "\n"); line; line = strtok(NULL, "\n")) {
        cJSON *j = cJSON_Parse(line);
        assert_non_null(j);
        const cJSON *jt = cJSON_GetObjectItem(j, "text");
        const char *text = jt->valuestring;
        int32_t want[1024], want_sp[1024];
        size_t n_want = sb_test_json_ids(cJSON_GetObjectItem(j, "ids"), want, 1024);
        size_t n_want_sp = sb_test_json_ids(cJSON_GetObjectItem(j, "ids_special"), want_sp, 1024);
        c.lines++;

        size_t n;
        int32_t *got = tokenize(v, text, strlen(text), false, false, &n);
        if (same_ids(got, n, want, n_want))
            c.ids++;
        else
            print_message("ids differ for %s\n", line);
        free(got);
        got = tokenize(v, text, strlen(text), false, true, &n);
        if (same_ids(got, n, want_sp, n_want_sp))
            c.ids_special++;
        else
            print_message("ids_special differ for %s\n", line);
        free(got);

        size_t len;
        char *d = sb_test_detokenize(v, want, n_want, false, false, &len);
        if (same_text(d, len, cJSON_GetObjectItem(j, "detok")->valuestring))
            c.detok++;
        else
            print_message("detok differs for %s: got '%.*s'\n", line, (int)len, d);
        free(d);
        d = sb_test_detokenize(v, want_sp, n_want_sp, false, true, &len);
        if (same_text(d, len, cJSON_GetObjectItem(j, "detok_special")->valuestring))
            c.detok_special++;
        else
            print_message("detok_special differs for %s: got '%.*s'\n", line, (int)len, d);
        free(d);

        /* The stream gives the pieces as they are (no clean-up, like
         * llama.cpp's token_to_piece), holding back split characters. */
        bool clean = v->clean_spaces;
        v->clean_spaces = false;
        d = sb_test_detokenize(v, want_sp, n_want_sp, false, true, &len);
        v->clean_spaces = clean;
        size_t slen;
        char *s = sb_test_stream(v, want_sp, n_want_sp, false, true, &slen);
        c.stream += slen == len && memcmp(s, d, len) == 0;
        for (size_t i = 0; i < n_want_sp; i++) {
            const sb_vocab_token *t = &v->tokens[want_sp[i]];
            c.split_chars += !sb_test_valid_utf8(v->pieces + t->piece_off, t->piece_len);
        }
        free(s);
        free(d);
        cJSON_Delete(j);
    }
    print_message("%s: ids %d/%d, ids_special %d/%d, detok %d/%d, detok_special %d/%d, stream %d/%d\n", jsonl, c.ids,
                  c.lines, c.ids_special, c.lines, c.detok, c.lines, c.detok_special, c.lines, c.stream, c.lines);
    free(data);
    sb_vocab_free(v);
    return c;
}

static void check_jsonl(const char *model, const char *jsonl) {
    jsonl_counts c = run_jsonl(model, jsonl);
    assert_int_equal(c.lines, 114);
    assert_int_equal(c.ids, c.lines);
    assert_int_equal(c.ids_special, c.lines);
    assert_int_equal(c.detok, c.lines);
    assert_int_equal(c.detok_special, c.lines);
    assert_int_equal(c.stream, c.lines);
    assert_true(c.split_chars > 0); /* some tokens hold part of a character */
}

static void test_llama3_jsonl(void **state) {
    (void)state;
    check_jsonl(LLAMA3, "models/llama3-tokenizer.jsonl");
}

static void test_qwen2_jsonl(void **state) {
    (void)state;
    check_jsonl(QWEN2, "models/qwen2-tokenizer.jsonl");
}

/* ---- metadata, BOS, EOG, loading ---------------------------------------- */

static void check_eog(const sb_vocab *v, const int32_t *want, size_t n_want) {
    size_t k = 0;
    for (int32_t t = 0; t < sb_vocab_n_tokens(v); t++) {
        if (!sb_vocab_is_eog(v, t))
            continue;
        assert_true(k < n_want);
        assert_int_equal(t, want[k++]);
    }
    assert_int_equal(k, n_want);
}

static void test_metadata_bos_eog(void **state) {
    (void)state;
    size_t n;
    int32_t *ids;

    sb_vocab *v = sb_test_load_vocab(LLAMA3);
    assert_int_equal(sb_vocab_n_tokens(v), 128256);
    assert_int_equal(sb_vocab_bos(v), 128000);
    assert_int_equal(sb_vocab_eos(v), 128009);
    assert_true(sb_vocab_add_bos(v));
    check_eog(v, (const int32_t[]){128001, 128008, 128009}, 3);
    ids = tokenize(v, "Hello world", 11, false, false, &n);
    sb_test_assert_ids(ids, n, (const int32_t[]){9906, 1917}, 2);
    free(ids);
    ids = tokenize(v, "Hello world", 11, true, false, &n);
    sb_test_assert_ids(ids, n, (const int32_t[]){128000, 9906, 1917}, 3);
    free(ids);
    ids = tokenize(v, "", 0, true, true, &n);
    sb_test_assert_ids(ids, n, (const int32_t[]){128000}, 1);
    free(ids);
    ids = tokenize(v, "1234567", 7, false, false, &n);
    sb_test_assert_ids(ids, n, (const int32_t[]){4513, 10961, 22}, 3);
    free(ids);
    /* with parse_special the BOS text is BOS too; without, it is text */
    ids = tokenize(v, "<|begin_of_text|>Hi", 19, true, true, &n);
    sb_test_assert_ids(ids, n, (const int32_t[]){128000, 128000, 13347}, 3);
    free(ids);
    ids = tokenize(v, "<|begin_of_text|>Hi", 19, false, false, &n);
    assert_true(n > 2);
    for (size_t i = 0; i < n; i++)
        assert_true(ids[i] < 128000);
    free(ids);
    sb_vocab_free(v);

    v = sb_test_load_vocab(QWEN2);
    assert_int_equal(sb_vocab_n_tokens(v), 151936);
    assert_int_equal(sb_vocab_bos(v), 151643);
    assert_int_equal(sb_vocab_eos(v), 151645);
    assert_false(sb_vocab_add_bos(v));
    check_eog(v, (const int32_t[]){128247, 151643, 151645, 151662, 151663, 151664}, 6);
    ids = tokenize(v, "Hello world", 11, true, false, &n);
    sb_test_assert_ids(ids, n, (const int32_t[]){9707, 1879}, 2);
    free(ids);
    ids = tokenize(v, "", 0, true, false, &n);
    assert_int_equal(n, 0);
    free(ids);
    ids = tokenize(v, "1234567", 7, false, false, &n);
    sb_test_assert_ids(ids, n, (const int32_t[]){16, 17, 18, 19, 20, 21, 22}, 7);
    free(ids);
    /* "</s>" is an ordinary token typed NORMAL, forced to CONTROL by its text */
    ids = tokenize(v, "</s>", 4, false, true, &n);
    sb_test_assert_ids(ids, n, (const int32_t[]){128247}, 1);
    size_t len;
    char *d = sb_test_detokenize(v, ids, n, false, false, &len);
    assert_int_equal(len, 0);
    free(d);
    free(ids);
    sb_vocab_free(v);
}

static void test_models_load(void **state) {
    (void)state;
    static const char *const models[] = {LLAMA3, QWEN2};
    static const char *const want[] = {"[128000,9906,1917]", "[9707,1879]"};
    for (size_t i = 0; i < SB_ARRAY_LEN(models); i++) {
        sb_error err = {0};
        sb_model_t *m = NULL;
        if (sb_model_load(sb_test_fixture(models[i]), &m, &err) != SB_OK)
            fail_msg("sb_model_load %s: %s", models[i], err.msg);
        int32_t ids[8];
        size_t n = 0;
        assert_int_equal(sb_tokenize(m, "Hello world", 11, true, false, ids, 8, &n, &err), SB_OK);
        assert_int_equal(n, i == 0 ? 3 : 2);
        sb_model_free(m);

        char *path = strdup(sb_test_fixture(models[i]));
        const char *args[] = {"tokenize", "-m", path, "Hello world", NULL};
        char *out, *errs;
        int rc = sb_test_run_cli(args, &out, &errs);
        if (rc != 0)
            fail_msg("switchboard tokenize -m %s exited %d: %s", path, rc, errs);
        assert_non_null(strstr(out, want[i]));
        free(out);
        free(errs);
        free(path);
    }
}

/* ---- malformed input, streaming, long input ------------------------------ */

static void test_invalid_utf8_input(void **state) {
    (void)state;
    sb_vocab *v = sb_test_load_vocab(LLAMA3);
    static const char *const inputs[] = {"\xff",         "\xe4\x41", "a\xc3", "\xf0\x9f\x98", "\x80\x80 x",
                                         "\xed\xa0\x80", "x\xf4\x90\x80\x80y", "\xc0\xaf", "\xf8\x88\x80\x80\x80"};
    for (size_t k = 0; k < SB_ARRAY_LEN(inputs); k++) {
        const char *t = inputs[k];
        size_t n, len, slen;
        int32_t *ids = tokenize(v, t, strlen(t), false, false, &n);
        assert_true(n > 0);
        char *d = sb_test_detokenize(v, ids, n, false, false, &len);
        char *s = sb_test_stream(v, ids, n, false, false, &slen); /* every chunk checked to be valid UTF-8 */
        free(s);
        free(d);
        free(ids);
    }
    /* a bad byte reads as U+FFFD, an overlong "/" as "/", as in llama.cpp */
    size_t n, len;
    int32_t *ids = tokenize(v, "\xff", 1, false, false, &n);
    char *d = sb_test_detokenize(v, ids, n, false, false, &len);
    assert_string_equal(d, "\xef\xbf\xbd");
    free(d);
    free(ids);
    int32_t *want = tokenize(v, "a/", 2, false, false, &n);
    size_t n2;
    ids = tokenize(v, "a\xc0\xaf", 3, false, false, &n2);
    sb_test_assert_ids(ids, n2, want, n);
    free(want);
    free(ids);
    /* a surrogate keeps its bytes */
    ids = tokenize(v, "\xed\xa0\x80", 3, false, false, &n);
    d = sb_test_detokenize(v, ids, n, false, false, &len);
    assert_int_equal(len, 3);
    assert_memory_equal(d, "\xed\xa0\x80", 3);
    free(d);
    free(ids);
    sb_vocab_free(v);
}

static void test_stream_holds_split_characters(void **state) {
    (void)state;
    sb_vocab *v = sb_test_load_vocab(LLAMA3);
    const char *t = "\xf0\x9f\xa6\x99 \xe4\xbd\xa0\xe5\xa5\xbd"; /* U+1F999 (not one token), then Chinese */
    size_t n;
    int32_t *ids = tokenize(v, t, strlen(t), false, false, &n);
    assert_true(n >= 3);
    sb_error err = {0};
    sb_detok_t *d = NULL;
    assert_int_equal(sb_vocab_detok_create(v, false, &d, &err), SB_OK);
    char out[64], all[64] = "";
    size_t total = 0;
    bool held = false;
    for (size_t i = 0; i < n; i++) {
        size_t k = sb_vocab_detok_push(d, ids[i], false, out, sizeof(out));
        held |= k == 0;
        memcpy(all + total, out, k + 1);
        total += k;
    }
    assert_true(held); /* the emoji's first token alone is not a whole character */
    assert_int_equal(sb_vocab_detok_flush(d, out, sizeof(out)), 0);
    assert_string_equal(all, t);
    sb_vocab_detok_free(d);
    free(ids);
    sb_vocab_free(v);
}

static void test_long_inputs(void **state) {
    (void)state;
    static const char *const alphabet[] = {"a", "b", "c", "d", "e", " ", " ", "\n", "1", "2", "'s", ",",
                                           "\xc3\xa9", "\xe4\xbd\xa0", "\xf0\x9f\x98\x80", "  ", "\t", "."};
    size_t cap = 300000, len;
    char *t = malloc(cap);
    assert_non_null(t);
    static const char *const models[] = {LLAMA3, QWEN2};
    for (size_t mi = 0; mi < SB_ARRAY_LEN(models); mi++) {
        sb_vocab *v = sb_test_load_vocab(models[mi]);
        for (int round = 0; round < 3; round++) {
            uint32_t x = 12345;
            for (len = 0; len + 8 <= cap;) {
                x = x * 1103515245u + 12345u;
                /* one long letter run, one long CJK run (a single pre-token), then a mix */
                const char *c = round == 0 ? "a" : round == 1 ? "\xe4\xbd\xa0" : alphabet[(x >> 16) % SB_ARRAY_LEN(alphabet)];
                memcpy(t + len, c, strlen(c));
                len += strlen(c);
            }
            size_t n, dlen;
            int32_t *ids = tokenize(v, t, len, false, false, &n);
            bool clean = v->clean_spaces;
            v->clean_spaces = false;
            char *d = sb_test_detokenize(v, ids, n, false, false, &dlen);
            v->clean_spaces = clean;
            assert_int_equal(dlen, len);
            assert_memory_equal(d, t, len);
            free(d);
            free(ids);
        }
        sb_vocab_free(v);
    }
    free(t);
}

/* ---- clean-up of spaces -------------------------------------------------- */

static void test_clean_spaces(void **state) {
    (void)state;
    static const char *const cases[][2] = {
        {"a != b", "a!= b"},
        {"'s 're 've 'll 'd 'm 't", "'s're've 'll 'd'm 't"},
        {"x ' ' y", "x'' y"},
        {"a ' b", "a'b"},
        {"Hello , world . Yes ! Really ?", "Hello, world. Yes! Really?"},
        {"", ""},
        {" ", " "},
        {" .", "."},
        {"' ' '", "'''"}, /* the blanked space stops the second " ' " (llama.cpp's quirk) */
        {"x .", "x."},
        {"a 'le", "a 'le"},
        {"a 're", "a're"},
        {"a 'r", "a 'r"},
    };
    for (size_t i = 0; i < SB_ARRAY_LEN(cases); i++) {
        char buf[64];
        size_t n = strlen(cases[i][0]);
        memcpy(buf, cases[i][0], n + 1);
        n = sb__bpe_clean_spaces(buf, n);
        buf[n] = '\0';
        assert_string_equal(buf, cases[i][1]);
    }
}

/* ---- synthetic vocabularies and other pre-tokenizers --------------------- */

/* A GGUF image with the tokenizer of `base` but tokenizer.ggml.pre = pre
 * (NULL: no key), loaded as a vocabulary. */
static sb_status load_with_pre(const char *base, const char *pre, sb_vocab **out, sb_error *err) {
    sb_gguf *g = NULL;
    assert_int_equal(sb_gguf_open(sb_test_fixture(base), &g, err), SB_OK);
    sb_gguf_writer *w = sb_gguf_writer_create();
    assert_non_null(w);
    static const char *const keys[] = {"tokenizer.ggml.model", "tokenizer.ggml.tokens", "tokenizer.ggml.token_type",
                                       "tokenizer.ggml.merges", "tokenizer.ggml.bos_token_id",
                                       "tokenizer.ggml.eos_token_id"};
    for (size_t i = 0; i < SB_ARRAY_LEN(keys); i++)
        sb_gguf_copy_kv(w, sb_gguf_find(g, keys[i]));
    if (pre)
        sb_gguf_set_str(w, "tokenizer.ggml.pre", pre);
    uint8_t *image = NULL;
    uint64_t size = 0;
    assert_int_equal(sb_gguf_writer_to_memory(w, &image, &size, err), SB_OK);
    sb_gguf_writer_free(w);
    sb_gguf_close(g);
    assert_int_equal(sb_gguf_open_memory(image, size, &g, err), SB_OK);
    sb_status st = sb_vocab_load(g, out, err);
    sb_gguf_close(g);
    sb_free(image);
    return st;
}

/* The byte strings of the pieces of ids, joined with '|'. */
static void pieces(const sb_vocab *v, const int32_t *ids, size_t n, char *buf, size_t cap) {
    size_t w = 0;
    for (size_t i = 0; i < n; i++) {
        const sb_vocab_token *t = &v->tokens[ids[i]];
        assert_true(w + t->piece_len + 2 < cap);
        if (i)
            buf[w++] = '|';
        memcpy(buf + w, v->pieces + t->piece_off, t->piece_len);
        w += t->piece_len;
    }
    buf[w] = '\0';
}

static void test_other_pre_tokenizers(void **state) {
    (void)state;
    static const char *const pres[] = {NULL,           "default",        "gpt-2",   "gpt2",         "deepseek-llm",
                                       "deepseek-coder", "falcon",       "starcoder", "llama3",     "qwen2",
                                       "stablelm2",      "dbrx",         "command-r"};
    char *data = sb_test_read_file(sb_test_fixture("models/llama3-tokenizer.jsonl"), NULL);
    assert_non_null(data);
    for (size_t p = 0; p < SB_ARRAY_LEN(pres); p++) {
        sb_error err = {0};
        sb_vocab *v = NULL;
        if (load_with_pre(LLAMA3, pres[p], &v, &err) != SB_OK)
            fail_msg("pre %s: %s", pres[p] ? pres[p] : "(none)", err.msg);
        assert_false(sb_vocab_add_bos(v) && p != 8); /* only llama3 defaults to BOS */
        /* every text survives the round trip (up to the clean-up of spaces) */
        char *copy = strdup(data);
        int lines = 0;
        for (char *line = strtok(copy, "\n"); line; line = strtok(NULL, "\n"), lines++) {
            cJSON *j = cJSON_Parse(line);
            const char *text = cJSON_GetObjectItem(j, "text")->valuestring;
            size_t n, len, tlen = strlen(text);
            int32_t *ids = tokenize(v, text, tlen, false, false, &n);
            char *d = sb_test_detokenize(v, ids, n, false, false, &len);
            char *want = strdup(text);
            if (v->clean_spaces)
                tlen = sb__bpe_clean_spaces(want, tlen);
            if (len != tlen || memcmp(d, want, len) != 0)
                fail_msg("pre %s: round trip of %s gives '%s'", pres[p] ? pres[p] : "(none)", line, d);
            free(want);
            free(d);
            free(ids);
            cJSON_Delete(j);
        }
        assert_int_equal(lines, 114);
        free(copy);

        /* pre-token boundaries show in the pieces */
        static const struct {
            const char *pre, *text, *want;
        } splits[] = {
            {"default", "1234567", "123|456|7"},
            {"falcon", "a+=b", "a|+=|b"},
            {"qwen2", "1234567", "1|2|3|4|5|6|7"},
            {"starcoder", "x12", "x|1|2"},
            {"deepseek-llm", "ab\n\ncd", "ab|\n|\n|cd"},
            {"deepseek-coder", "x1234", "x|1|2|3|4"},
        };
        for (size_t s = 0; s < SB_ARRAY_LEN(splits); s++) {
            if (!pres[p] || strcmp(pres[p], splits[s].pre) != 0)
                continue;
            size_t n;
            char buf[256];
            int32_t *ids = tokenize(v, splits[s].text, strlen(splits[s].text), false, false, &n);
            pieces(v, ids, n, buf, sizeof(buf));
            assert_string_equal(buf, splits[s].want);
            free(ids);
        }
        sb_vocab_free(v);
    }
    free(data);

    sb_error err = {0};
    sb_vocab *v = NULL;
    assert_int_equal(load_with_pre(LLAMA3, "no-such-pre", &v, &err), SB_ERR_UNSUPPORTED);
    assert_null(v);
    assert_non_null(strstr(err.msg, "'no-such-pre'"));
}

/* A small byte-level vocabulary: the given tokens and merges, all NORMAL. */
static sb_status load_synthetic(const char *const *tokens, size_t n_tokens, const char *const *merges,
                                size_t n_merges, const char *pre, sb_vocab **out, sb_error *err) {
    sb_gguf_writer *w = sb_gguf_writer_create();
    assert_non_null(w);
    sb_gguf_set_str(w, "general.architecture", "llama");
    sb_gguf_set_str(w, "tokenizer.ggml.model", "gpt2");
    sb_gguf_set_str(w, "tokenizer.ggml.pre", pre);
    sb_gguf_set_arr_str(w, "tokenizer.ggml.tokens", tokens, n_tokens);
    sb_gguf_set_u32(w, "tokenizer.ggml.bos_token_id", 0);
    if (merges)
        sb_gguf_set_arr_str(w, "tokenizer.ggml.merges", merges, n_merges);
    uint8_t *image = NULL;
    uint64_t size = 0;
    assert_int_equal(sb_gguf_writer_to_memory(w, &image, &size, err), SB_OK);
    sb_gguf_writer_free(w);
    sb_gguf *g = NULL;
    assert_int_equal(sb_gguf_open_memory(image, size, &g, err), SB_OK);
    *out = NULL;
    sb_status st = sb_vocab_load(g, out, err);
    sb_gguf_close(g);
    sb_free(image);
    return st;
}

static void test_merge_rules(void **state) {
    (void)state;
    /* ids: 0 a, 1 b, 2 c, 3 ab, 4 bc, 5 abc, 6 aa */
    static const char *const tok[] = {"a", "b", "c", "ab", "bc", "abc", "aa"};
    sb_error err = {0};
    sb_vocab *v = NULL;
    size_t n;
    int32_t *ids;

    /* lowest rank first */
    static const char *const m1[] = {"b c", "a b"};
    assert_int_equal(load_synthetic(tok, 7, m1, 2, "qwen2", &v, &err), SB_OK);
    ids = tokenize(v, "abc", 3, false, false, &n);
    sb_test_assert_ids(ids, n, (const int32_t[]){0, 4}, 2);
    free(ids);
    sb_vocab_free(v);
    static const char *const m2[] = {"a b", "b c", "a a", "ab c"};
    assert_int_equal(load_synthetic(tok, 7, m2, 4, "qwen2", &v, &err), SB_OK);
    ids = tokenize(v, "abc", 3, false, false, &n);
    sb_test_assert_ids(ids, n, (const int32_t[]){5}, 1);
    free(ids);
    /* equal ranks: leftmost first */
    ids = tokenize(v, "aaa", 3, false, false, &n);
    sb_test_assert_ids(ids, n, (const int32_t[]){6, 0}, 2);
    free(ids);
    /* a character without a token is dropped (llama.cpp's byte fallback finds no byte token) */
    ids = tokenize(v, "axb", 3, false, false, &n);
    sb_test_assert_ids(ids, n, (const int32_t[]){0, 1}, 2);
    free(ids);
    sb_vocab_free(v);

    /* a merge whose result is not a token falls back to the single bytes that are */
    static const char *const tok3[] = {"a", "b", "ab"};
    static const char *const m3[] = {"a b", "ab c", "nospace", " x"};
    assert_int_equal(load_synthetic(tok3, 3, m3, 4, "qwen2", &v, &err), SB_OK);
    ids = tokenize(v, "abc", 3, false, false, &n);
    sb_test_assert_ids(ids, n, (const int32_t[]){0, 1}, 2); /* ab+c = "abc" is no token: bytes a, b (c has none) */
    free(ids);
    sb_vocab_free(v);
    static const char *const m4[] = {"a b", "ab c"};
    static const char *const tok4[] = {"a", "b", "ab", "c"};
    assert_int_equal(load_synthetic(tok4, 4, m4, 2, "qwen2", &v, &err), SB_OK);
    ids = tokenize(v, "abc", 3, false, false, &n);
    sb_test_assert_ids(ids, n, (const int32_t[]){0, 1, 3}, 3); /* "abc" missing: its bytes a, b, c */
    free(ids);
    sb_vocab_free(v);

    /* ignore_merges (llama-bpe): a pre-token that is a token skips merging */
    static const char *const m5[] = {"a b"};
    assert_int_equal(load_synthetic(tok, 7, m5, 1, "llama-bpe", &v, &err), SB_OK);
    assert_true(sb_vocab_add_bos(v)); /* llama-bpe's default */
    ids = tokenize(v, "abc", 3, false, false, &n);
    sb_test_assert_ids(ids, n, (const int32_t[]){5}, 1);
    free(ids);
    sb_vocab_free(v);
    assert_int_equal(load_synthetic(tok, 7, m5, 1, "qwen2", &v, &err), SB_OK);
    ids = tokenize(v, "abc", 3, false, false, &n);
    sb_test_assert_ids(ids, n, (const int32_t[]){3, 2}, 2);
    free(ids);
    sb_vocab_free(v);

    /* no merges key */
    assert_int_equal(load_synthetic(tok, 7, NULL, 0, "qwen2", &v, &err), SB_ERR_FORMAT);
    assert_non_null(strstr(err.msg, "tokenizer.ggml.merges"));
}

static void test_byte_alphabet_pieces(void **state) {
    (void)state;
    /* Ġ (U+0120) is a space, Ċ (U+010A) a newline, ĉ (U+0109) a tab, Ń (U+0143) byte 0xAD; a
     * character outside the alphabet is written as llama.cpp writes it */
    char buf[128];
    uint32_t n = sb__bpe_decode_piece("\xc4\xa0x\xc4\x8a\xc4\x89\xc5\x83", 9, buf);
    assert_int_equal(n, 5);
    assert_memory_equal(buf, " x\n\t\xad", 5);
    n = sb__bpe_decode_piece("a\xe2\x96\x81", 4, NULL);
    assert_int_equal(n, 1 + 12 + 6 + 4 + 1);
    n = sb__bpe_decode_piece("a\xe2\x96\x81", 4, buf);
    buf[n] = '\0';
    assert_string_equal(buf, "a[UNK_BYTE_0xe29681a\xe2\x96\x81]");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_llama3_jsonl),
        cmocka_unit_test(test_qwen2_jsonl),
        cmocka_unit_test(test_metadata_bos_eog),
        cmocka_unit_test(test_models_load),
        cmocka_unit_test(test_invalid_utf8_input),
        cmocka_unit_test(test_stream_holds_split_characters),
        cmocka_unit_test(test_long_inputs),
        cmocka_unit_test(test_clean_spaces),
        cmocka_unit_test(test_other_pre_tokenizers),
        cmocka_unit_test(test_merge_rules),
        cmocka_unit_test(test_byte_alphabet_pieces),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
