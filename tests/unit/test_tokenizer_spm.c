/*
 * test_tokenizer_spm.c - the SentencePiece tokenizer and the detokenizer
 * against llama.cpp's output (models/tokenizer-llama-spm.jsonl and the
 * prompt_ids of models/expected.json), plus streaming, special tokens,
 * malformed input and vocabulary validation on small synthetic vocabularies.
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
#include "testutil.h"
#include "tokutil.h"
#include "tokenizer/vocab.h"

static size_t tokenize(const sb_vocab *v, const char *text, size_t len, bool add_special, bool parse_special,
                       int32_t *ids, size_t cap) {
    sb_error err = {0};
    size_t n = 0;
    if (sb_vocab_tokenize(v, text, len, add_special, parse_special, ids, cap, &n, &err) != SB_OK)
        fail_msg("tokenize: %s", err.msg);
    return n;
}

/* ---- llama.cpp reference vectors ---------------------------------------- */

static void test_llama2_vocab_metadata(void **state) {
    (void)state;
    sb_vocab *v = sb_test_load_vocab("models/llama2-vocab-tiny-random.gguf");
    assert_int_equal(sb_vocab_n_tokens(v), 32000);
    assert_int_equal(sb_vocab_bos(v), 1);
    assert_int_equal(sb_vocab_eos(v), 2);
    assert_true(sb_vocab_add_bos(v)); /* no add_bos_token key: the SPM default */
    assert_string_equal(sb_vocab_text(v, 1), "<s>");
    assert_string_equal(sb_vocab_text(v, 15043), "\xe2\x96\x81Hello");
    assert_null(sb_vocab_text(v, 32000));
    assert_null(sb_vocab_text(v, -1));
    assert_true(sb_vocab_is_eog(v, 2));
    assert_false(sb_vocab_is_eog(v, 1));
    assert_false(sb_vocab_is_eog(v, 32000));
    sb_vocab_free(v);
}

static void test_llama2_jsonl(void **state) {
    (void)state;
    sb_vocab *v = sb_test_load_vocab("models/llama2-vocab-tiny-random.gguf");
    char *data = sb_test_read_file(sb_test_fixture("models/tokenizer-llama-spm.jsonl"), NULL);
    assert_non_null(data);
    int lines = 0, ids_ok = 0, detok_ok = 0, stream_ok = 0, stream_checked = 0;
    for (char *line = strtok(data, "\n"); line; line = strtok(NULL, "\n")) {
        cJSON *j = cJSON_Parse(line);
        assert_non_null(j);
        const char *text = cJSON_GetObjectItem(j, "text")->valuestring;
        const char *want_detok = cJSON_GetObjectItem(j, "detok")->valuestring;
        int32_t want[512], got[512];
        size_t n_want = sb_test_json_ids(cJSON_GetObjectItem(j, "ids"), want, 512);
        size_t n_got = tokenize(v, text, strlen(text), false, false, got, 512);
        lines++;
        if (n_got == n_want && memcmp(got, want, n_want * sizeof(*want)) == 0)
            ids_ok++;
        else
            print_message("ids differ for %s\n", line);

        size_t len, slen;
        char *d = sb_test_detokenize(v, want, n_want, true, false, &len);
        if (len == strlen(want_detok) && memcmp(d, want_detok, len) == 0)
            detok_ok++;
        else
            print_message("detok differs for %s: got '%s'\n", line, d);
        if (sb_test_valid_utf8(d, len)) {
            stream_checked++;
            char *s = sb_test_stream(v, want, n_want, true, false, &slen);
            stream_ok += slen == len && memcmp(s, d, len) == 0;
            free(s);
        }
        free(d);
        cJSON_Delete(j);
    }
    print_message("tokenizer-llama-spm.jsonl: ids %d/%d, detok %d/%d, stream %d/%d\n", ids_ok, lines, detok_ok, lines,
                  stream_ok, stream_checked);
    assert_int_equal(lines, 82);
    assert_int_equal(ids_ok, lines);
    assert_int_equal(detok_ok, lines);
    assert_int_equal(stream_ok, stream_checked);
    free(data);
    sb_vocab_free(v);
}

static void test_expected_prompt_ids(void **state) {
    (void)state;
    char *data = sb_test_read_file(sb_test_fixture("models/expected.json"), NULL);
    assert_non_null(data);
    cJSON *root = cJSON_Parse(data);
    assert_non_null(root);
    int runs = 0;
    const cJSON *model;
    cJSON_ArrayForEach(model, cJSON_GetObjectItem(root, "models")) {
        char path[256];
        snprintf(path, sizeof(path), "models/%s", model->string);
        sb_vocab *v = sb_test_load_vocab(path);
        const cJSON *run;
        cJSON_ArrayForEach(run, cJSON_GetObjectItem(model, "runs")) {
            const char *prompt = cJSON_GetObjectItem(run, "prompt")->valuestring;
            int32_t want[64], got[64];
            size_t n_want = sb_test_json_ids(cJSON_GetObjectItem(run, "prompt_ids"), want, 64);
            for (int parse_special = 0; parse_special < 2; parse_special++) {
                size_t n_got = tokenize(v, prompt, strlen(prompt), true, parse_special, got, 64);
                sb_test_assert_ids(got, n_got, want, n_want);
            }
            size_t i = 0;
            const cJSON *tok;
            cJSON_ArrayForEach(tok, cJSON_GetObjectItem(run, "prompt_tokens"))
                assert_string_equal(sb_vocab_text(v, want[i++]), tok->valuestring);
            runs++;
        }
        sb_vocab_free(v);
    }
    print_message("expected.json prompt_ids: %d/%d runs\n", runs, runs);
    assert_int_equal(runs, 20);
    cJSON_Delete(root);
    free(data);
}

/* ---- special tokens, buffers, detokenizer edge cases -------------------- */

static void test_special_tokens(void **state) {
    (void)state;
    sb_vocab *v = sb_test_load_vocab("models/llama2-vocab-tiny-random.gguf");
    int32_t ids[64];
    const char *t = "<s>Hello</s>";
    size_t n = tokenize(v, t, strlen(t), false, true, ids, 64);
    sb_test_assert_ids(ids, n, (const int32_t[]){1, 15043, 2}, 3); /* dummy prefix after <s> */

    t = "Hello<s>world";
    n = tokenize(v, t, strlen(t), true, true, ids, 64);
    sb_test_assert_ids(ids, n, (const int32_t[]){1, 15043, 1, 3186}, 4);

    /* without parse_special the same text is plain text: no id 1 or 2 inside */
    n = tokenize(v, t, strlen(t), false, false, ids, 64);
    assert_true(n > 3);
    for (size_t i = 0; i < n; i++)
        assert_true(ids[i] > 2);

    /* control tokens are hidden unless rendered; the leading space survives a BOS */
    const int32_t seq[] = {1, 15043, 2};
    size_t len;
    char *s = sb_test_detokenize(v, seq, 3, true, false, &len);
    assert_string_equal(s, " Hello");
    free(s);
    s = sb_test_detokenize(v, seq, 3, true, true, &len);
    assert_string_equal(s, "<s> Hello</s>");
    free(s);
    s = sb_test_detokenize(v, seq + 1, 2, true, false, &len);
    assert_string_equal(s, "Hello");
    free(s);
    s = sb_test_detokenize(v, seq + 1, 2, false, false, &len);
    assert_string_equal(s, " Hello");
    free(s);
    sb_vocab_free(v);
}

static void test_buffers_and_bad_args(void **state) {
    (void)state;
    sb_vocab *v = sb_test_load_vocab("models/llama2-vocab-tiny-random.gguf");
    sb_error err = {0};
    int32_t ids[8];
    size_t n = 99;
    assert_int_equal(sb_vocab_tokenize(v, "", 0, false, false, NULL, 0, &n, &err), SB_OK);
    assert_int_equal(n, 0);
    assert_int_equal(sb_vocab_tokenize(v, "", 0, true, false, ids, 8, &n, &err), SB_OK);
    sb_test_assert_ids(ids, n, (const int32_t[]){1}, 1);
    assert_int_equal(sb_vocab_tokenize(v, "Hello world", 11, true, false, NULL, 0, &n, &err), SB_ERR_INVALID_ARG);
    assert_int_equal(n, 3);
    assert_int_equal(sb_vocab_tokenize(v, "Hello world", 11, true, false, ids, 2, &n, &err), SB_ERR_INVALID_ARG);
    sb_test_assert_ids(ids, 2, (const int32_t[]){1, 15043}, 2);
    assert_int_equal(sb_vocab_tokenize(v, "Hello world", 11, true, false, ids, 3, &n, &err), SB_OK);
    assert_int_equal(sb_vocab_tokenize(v, NULL, 3, true, false, ids, 3, &n, &err), SB_ERR_INVALID_ARG);

    char out[16];
    const int32_t seq[] = {15043, 3186};
    assert_int_equal(sb_vocab_detokenize(v, seq, 2, true, false, out, 11, &n, &err), SB_ERR_INVALID_ARG);
    assert_int_equal(n, 11);
    const int32_t bad[] = {15043, 32000};
    assert_int_equal(sb_vocab_detokenize(v, bad, 2, true, false, out, sizeof(out), &n, &err), SB_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "32000"));
    sb_vocab_free(v);
}

static void test_invalid_utf8_input(void **state) {
    (void)state;
    sb_vocab *v = sb_test_load_vocab("models/llama2-vocab-tiny-random.gguf");
    static const char *const inputs[] = {"\xff", "\xe4\x41", "a\xc3", "\xf0\x9f\x98", "\x80\x80 x", "\xed\xa0\x80",
                                         "x\xf4\x90\x80\x80y", "\xc0\xaf"};
    for (size_t k = 0; k < SB_ARRAY_LEN(inputs); k++) {
        const char *t = inputs[k];
        int32_t ids[64];
        size_t n = tokenize(v, t, strlen(t), false, false, ids, 64);
        size_t len, slen;
        char *d = sb_test_detokenize(v, ids, n, true, false, &len);
        assert_int_equal(len, strlen(t)); /* byte fallback gives the bytes back */
        assert_memory_equal(d, t, len);
        char *s = sb_test_stream(v, ids, n, true, false, &slen); /* every chunk checked to be valid UTF-8 */
        assert_true(sb_test_valid_utf8(s, slen));
        free(s);
        free(d);
    }
    /* "\xe4" announces 3 bytes, so llama.cpp's cut takes "A" along into byte fallback */
    int32_t ids[8];
    size_t n = tokenize(v, "\xe4\x41", 2, false, false, ids, 8);
    sb_test_assert_ids(ids, n, (const int32_t[]){29871, 0xE4 + 3, 0x41 + 3}, 3);
    sb_vocab_free(v);
}

static void test_stream_holds_split_characters(void **state) {
    (void)state;
    sb_vocab *v = sb_test_load_vocab("models/llama2-vocab-tiny-random.gguf");
    sb_error err = {0};
    sb_detok_t *d = NULL;
    char out[64];
    assert_int_equal(sb_vocab_detok_create(v, true, &d, &err), SB_OK);
    /* U+1F600 as four byte tokens: nothing until the last one */
    const int32_t grin[] = {0xF0 + 3, 0x9F + 3, 0x98 + 3, 0x80 + 3};
    for (int i = 0; i < 3; i++)
        assert_int_equal(sb_vocab_detok_push(d, grin[i], false, out, sizeof(out)), 0);
    assert_int_equal(sb_vocab_detok_push(d, grin[3], false, out, sizeof(out)), 4);
    assert_string_equal(out, "\xf0\x9f\x98\x80");
    /* a truncated character becomes U+FFFD at flush */
    assert_int_equal(sb_vocab_detok_push(d, grin[0], false, out, sizeof(out)), 0);
    assert_int_equal(sb_vocab_detok_push(d, grin[1], false, out, sizeof(out)), 0);
    assert_int_equal(sb_vocab_detok_flush(d, out, sizeof(out)), 3);
    assert_string_equal(out, "\xef\xbf\xbd");
    /* ... or as soon as it cannot be completed */
    assert_int_equal(sb_vocab_detok_push(d, 0xE4 + 3, false, out, sizeof(out)), 0);
    assert_int_equal(sb_vocab_detok_push(d, 15043, false, out, sizeof(out)), 9);
    assert_string_equal(out, "\xef\xbf\xbd Hello");
    /* a small buffer gets whole characters only; the rest waits */
    for (int i = 0; i < 4; i++)
        sb_vocab_detok_push(d, grin[i], false, out, 0);
    assert_int_equal(sb_vocab_detok_flush(d, out, 4), 0);
    assert_int_equal(sb_vocab_detok_flush(d, out, 5), 4);
    assert_int_equal(sb_vocab_detok_flush(d, out, 5), 0);
    /* ids outside the vocabulary produce nothing */
    assert_int_equal(sb_vocab_detok_push(d, 32000, false, out, sizeof(out)), 0);
    assert_int_equal(sb_vocab_detok_push(d, -5, false, out, sizeof(out)), 0);
    sb_vocab_detok_free(d);

    /* only the first token loses its space */
    assert_int_equal(sb_vocab_detok_create(v, true, &d, &err), SB_OK);
    assert_int_equal(sb_vocab_detok_push(d, 15043, false, out, sizeof(out)), 5);
    assert_int_equal(sb_vocab_detok_push(d, 3186, false, out, sizeof(out)), 6);
    assert_string_equal(out, " world");
    sb_vocab_detok_free(d);
    sb_vocab_free(v);
}

static void test_long_inputs(void **state) {
    (void)state;
    sb_vocab *v = sb_test_load_vocab("models/llama2-vocab-tiny-random.gguf");
    /* a run of one letter and a long pseudo-random text: quadratic merging would crawl */
    static const char *const alphabet[] = {"a", "b", "c", "d", "e", "f", "g", "h", "i", "j",
                                           " ", "k", "l", "m", "n", "o", "p", "\n", "\xc3\xa9"};
    size_t cap = 200000, len;
    char *t = malloc(cap);
    assert_non_null(t);
    for (int round = 0; round < 2; round++) {
        uint32_t x = 12345;
        for (len = 0; len + 2 <= cap;) {
            x = x * 1103515245u + 12345u;
            const char *c = round == 0 ? "a" : alphabet[(x >> 16) % SB_ARRAY_LEN(alphabet)];
            memcpy(t + len, c, strlen(c));
            len += strlen(c);
        }
        sb_error err = {0};
        size_t need = 0;
        assert_int_equal(sb_vocab_tokenize(v, t, len, false, false, NULL, 0, &need, &err), SB_ERR_INVALID_ARG);
        int32_t *ids = malloc(need * sizeof(*ids));
        assert_non_null(ids);
        assert_int_equal(tokenize(v, t, len, false, false, ids, need), need);
        size_t dlen;
        char *d = sb_test_detokenize(v, ids, need, true, false, &dlen);
        assert_int_equal(dlen, len);
        assert_memory_equal(d, t, len);
        free(d);
        free(ids);
    }
    free(t);
    sb_vocab_free(v);
}

/* ---- synthetic vocabularies --------------------------------------------- */

/* A small SPM vocabulary: <unk> <s> </s>, the 256 byte tokens (ids 3..258),
 * then the extra tokens (ids 259...), with optional variations. */
typedef struct synth {
    const char *const *extra;
    const float *scores;
    const int32_t *types; /* NULL: all NORMAL */
    size_t n_extra;
    const char *model;      /* tokenizer.ggml.model; NULL: "llama" */
    const char *name;       /* general.name; NULL: none */
    int n_scores;           /* 0: one per token */
    bool scores_as_strings; /* wrong element type */
    int64_t bos;            /* tokenizer.ggml.bos_token_id; 0: no key */
    int bad_type_at;        /* token whose type is set to 9; 0: none */
    bool no_prefix_no_bos_eos; /* add_space_prefix false, add_bos false, add_eos true */
} synth;

static sb_status load_synthetic(const synth *sy, sb_vocab **out, sb_error *err) {
    size_t n = 3 + 256 + sy->n_extra;
    const char **tokens = calloc(n, sizeof(*tokens));
    float *scores = calloc(n, sizeof(*scores));
    int32_t *types = calloc(n, sizeof(*types));
    char(*bytes)[8] = calloc(256, sizeof(*bytes));
    assert_true(tokens && scores && types && bytes);
    tokens[0] = "<unk>", tokens[1] = "<s>", tokens[2] = "</s>";
    types[0] = 2, types[1] = 3, types[2] = 3;
    for (int b = 0; b < 256; b++) {
        snprintf(bytes[b], 8, "<0x%02X>", b);
        tokens[3 + b] = bytes[b];
        types[3 + b] = 6;
    }
    for (size_t i = 0; i < sy->n_extra; i++) {
        tokens[259 + i] = sy->extra[i];
        scores[259 + i] = sy->scores[i];
        types[259 + i] = sy->types ? sy->types[i] : 1;
    }
    if (sy->bad_type_at)
        types[sy->bad_type_at] = 9;
    sb_gguf_writer *w = sb_gguf_writer_create();
    assert_non_null(w);
    sb_gguf_set_str(w, "general.architecture", "llama");
    if (sy->name)
        sb_gguf_set_str(w, "general.name", sy->name);
    sb_gguf_set_str(w, "tokenizer.ggml.model", sy->model ? sy->model : "llama");
    sb_gguf_set_arr_str(w, "tokenizer.ggml.tokens", tokens, n);
    if (sy->scores_as_strings)
        sb_gguf_set_arr_str(w, "tokenizer.ggml.scores", tokens, n);
    else
        sb_gguf_set_arr(w, "tokenizer.ggml.scores", SB_GGUF_FLOAT32, scores, sy->n_scores ? (uint64_t)sy->n_scores : n);
    sb_gguf_set_arr(w, "tokenizer.ggml.token_type", SB_GGUF_INT32, types, n);
    if (sy->bos)
        sb_gguf_set_u32(w, "tokenizer.ggml.bos_token_id", (uint32_t)sy->bos);
    if (sy->no_prefix_no_bos_eos) {
        sb_gguf_set_bool(w, "tokenizer.ggml.add_space_prefix", false);
        sb_gguf_set_bool(w, "tokenizer.ggml.add_bos_token", false);
        sb_gguf_set_bool(w, "tokenizer.ggml.add_eos_token", true);
    }
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
    free(tokens);
    free(scores);
    free(types);
    free(bytes);
    return st;
}

#define SP "\xe2\x96\x81"

static void test_merge_order(void **state) {
    (void)state;
    /* ids: 259 ▁, 260 a, 261 b, 262 c, 263 ab, 264 bc */
    static const char *const tok[] = {SP, "a", "b", "c", "ab", "bc"};
    float scores[] = {0, 0, 0, 0, -1, -1};
    sb_error err = {0};
    sb_vocab *v = NULL;
    int32_t ids[16];
    synth sy = {.extra = tok, .scores = scores, .n_extra = 6};
    assert_int_equal(load_synthetic(&sy, &v, &err), SB_OK);
    size_t n = tokenize(v, "abc", 3, false, false, ids, 16);
    sb_test_assert_ids(ids, n, (const int32_t[]){259, 263, 262}, 3); /* equal scores: leftmost pair first */
    sb_vocab_free(v);

    scores[5] = -0.5f;
    assert_int_equal(load_synthetic(&sy, &v, &err), SB_OK);
    n = tokenize(v, "abc", 3, false, false, ids, 16);
    sb_test_assert_ids(ids, n, (const int32_t[]){259, 260, 264}, 3); /* higher score wins */
    n = tokenize(v, "abxc", 4, false, false, ids, 16);
    sb_test_assert_ids(ids, n, (const int32_t[]){259, 263, 'x' + 3, 262}, 4); /* unknown char: byte token */
    sb_vocab_free(v);
}

static void test_user_defined_and_options(void **state) {
    (void)state;
    static const char *const tok[] = {SP, "a", "<tag>", "<|im_end|>"};
    const float scores[] = {0, 0, 0, 0};
    const int32_t types[] = {1, 1, 4, 1}; /* <tag> USER_DEFINED; <|im_end|> mistyped NORMAL */
    sb_error err = {0};
    sb_vocab *v = NULL;
    int32_t ids[16];
    synth sy = {.extra = tok, .scores = scores, .types = types, .n_extra = 4};
    assert_int_equal(load_synthetic(&sy, &v, &err), SB_OK);
    /* user-defined tokens are split out even without parse_special */
    size_t n = tokenize(v, "a<tag>a", 7, false, false, ids, 16);
    sb_test_assert_ids(ids, n, (const int32_t[]){259, 260, 261, 259, 260}, 5);
    size_t len;
    char *s = sb_test_detokenize(v, ids, n, true, false, &len);
    assert_string_equal(s, "a<tag> a");
    free(s);
    /* <|im_end|> becomes a control token that ends generation */
    assert_true(sb_vocab_is_eog(v, 262));
    n = tokenize(v, "<|im_end|>", 10, false, true, ids, 16);
    sb_test_assert_ids(ids, n, (const int32_t[]){262}, 1);
    s = sb_test_detokenize(v, ids, n, true, false, &len);
    assert_string_equal(s, "");
    free(s);
    sb_vocab_free(v);

    sy.no_prefix_no_bos_eos = true;
    assert_int_equal(load_synthetic(&sy, &v, &err), SB_OK);
    assert_false(sb_vocab_add_bos(v));
    n = tokenize(v, "a a", 3, true, false, ids, 16);
    sb_test_assert_ids(ids, n, (const int32_t[]){260, 259, 260, 2}, 4); /* no dummy prefix; EOS added */
    s = sb_test_detokenize(v, (const int32_t[]){259, 260}, 2, true, false, &len);
    assert_string_equal(s, " a"); /* nothing to strip without the prefix */
    free(s);
    sb_vocab_free(v);
}

static void test_phi3_rstrip(void **state) {
    (void)state;
    static const char *const tok[] = {SP, "a", "<|end|>"};
    const float scores[] = {0, 0, 0};
    const int32_t types[] = {1, 1, 3};
    sb_error err = {0};
    sb_vocab *v = NULL;
    int32_t ids[16];
    synth sy = {.extra = tok, .scores = scores, .types = types, .n_extra = 3, .name = "Phi-3 mini"};
    assert_int_equal(load_synthetic(&sy, &v, &err), SB_OK);
    size_t n = tokenize(v, "<|end|> \n a", 11, false, true, ids, 16);
    sb_test_assert_ids(ids, n, (const int32_t[]){261, 259, 260}, 3); /* whitespace after <|end|> dropped */
    n = tokenize(v, "<s> a", 5, false, true, ids, 16);
    sb_test_assert_ids(ids, n, (const int32_t[]){1, 259, 259, 260}, 4); /* but not after <s> */
    sb_vocab_free(v);
}

static void test_validation_errors(void **state) {
    (void)state;
    static const char *const tok[] = {"a"};
    const float scores[] = {0};
    static const struct {
        synth sy;
        sb_status status;
        const char *needle;
    } cases[] = {
        {{.n_scores = 4}, SB_ERR_FORMAT, "tokenizer.ggml.scores has 4 entries but tokenizer.ggml.tokens has 260"},
        {{.bos = 260}, SB_ERR_FORMAT, "tokenizer.ggml.bos_token_id = 260 is outside the vocabulary (0..259)"},
        {{.bad_type_at = 7}, SB_ERR_FORMAT, "tokenizer.ggml.token_type[7] = 9"},
        {{.model = "bert"}, SB_ERR_UNSUPPORTED, "tokenizer.ggml.model 'bert'"},
        {{.scores_as_strings = true}, SB_ERR_FORMAT, "tokenizer.ggml.scores"},
    };
    for (size_t i = 0; i < SB_ARRAY_LEN(cases); i++) {
        sb_error err = {0};
        sb_vocab *v = (sb_vocab *)&err;
        synth sy = cases[i].sy;
        sy.extra = tok, sy.scores = scores, sy.n_extra = 1;
        assert_int_equal(load_synthetic(&sy, &v, &err), cases[i].status);
        assert_null(v);
        if (!strstr(err.msg, cases[i].needle))
            fail_msg("case %zu: '%s' does not mention '%s'", i, err.msg, cases[i].needle);
    }
    /* a duplicate token string */
    static const char *const dup[] = {"a", "a"};
    const float dup_scores[] = {0, 0};
    sb_error err = {0};
    sb_vocab *v = NULL;
    synth sy = {.extra = dup, .scores = dup_scores, .n_extra = 2};
    assert_int_equal(load_synthetic(&sy, &v, &err), SB_ERR_FORMAT);
    assert_non_null(strstr(err.msg, "duplicate token 'a' at ids 259 and 260"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_llama2_vocab_metadata),
        cmocka_unit_test(test_llama2_jsonl),
        cmocka_unit_test(test_expected_prompt_ids),
        cmocka_unit_test(test_special_tokens),
        cmocka_unit_test(test_buffers_and_bad_args),
        cmocka_unit_test(test_invalid_utf8_input),
        cmocka_unit_test(test_stream_holds_split_characters),
        cmocka_unit_test(test_long_inputs),
        cmocka_unit_test(test_merge_order),
        cmocka_unit_test(test_user_defined_and_options),
        cmocka_unit_test(test_phi3_rstrip),
        cmocka_unit_test(test_validation_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
