/*
 * test_grammar.c - GBNF grammars: parsing (the example grammars of
 * tests/fixtures/grammars, which cover what llama.cpp's json, arithmetic,
 * list and c grammars use; errors with line and column), text matching
 * (repetitions, classes, UTF-8 split across calls), and token masks on the
 * real vocabularies (SentencePiece with byte fallback, Llama 3 and Qwen2
 * byte-level BPE): every mask is checked against testing each token on its
 * own, and random walks through the masks end in text the grammar accepts
 * (for JSON, text cJSON parses).
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
#include "base/rng.h"
#include "model/model.h"
#include "sampling/grammar.h"
#include "testutil.h"

static char *read_grammar(const char *name, size_t *len) {
    char path[4096];
    const char *here = __FILE__;
    const char *slash = strrchr(here, '/');
    snprintf(path, sizeof path, "%.*s/../fixtures/grammars/%s", (int)(slash - here), here, name);
    char *text = sb_test_read_file(path, len);
    if (!text)
        fail_msg("cannot read %s", path);
    return text;
}

static sb_grammar *compile(sb_grammar_vocab *v, const char *text, size_t len) {
    sb_grammar *g = NULL;
    sb_error err = {0};
    if (sb_grammar_create(v, text, len, &g, &err) != SB_OK)
        fail_msg("grammar: %s\n%.*s", err.msg, (int)len, text);
    return g;
}

static sb_grammar *fixture(sb_grammar_vocab *v, const char *name) {
    size_t len;
    char *text = read_grammar(name, &len);
    sb_grammar *g = compile(v, text, len);
    free(text);
    return g;
}

/* 1: the whole text is a sentence; 0: a valid prefix only; -1: rejected. */
static int match(sb_grammar *g, const char *text) {
    sb_grammar_matcher *m;
    assert_int_equal(sb_grammar_matcher_create(g, &m, NULL), SB_OK);
    int r = !sb_grammar_matcher_accept_text(m, text, strlen(text)) ? -1 : sb_grammar_matcher_accepting(m) ? 1 : 0;
    sb_grammar_matcher_free(m);
    return r;
}

static void expect(sb_grammar *g, const char *text, int want) {
    int got = match(g, text);
    if (got != want)
        fail_msg("'%s': got %d, want %d", text, got, want);
}

static void test_examples_parse_and_match(void **state) {
    (void)state;
    sb_grammar *json = fixture(NULL, "json.gbnf");
    expect(json, "{\"a\": [1, 2.5e3, \"x\\u00e9\", true], \"b\": {\"c\": null}}", 1);
    expect(json, "{}", 1);
    expect(json, "{\"caf\xc3\xa9\": -0.5}", 1);
    expect(json, "{\"a\"", 0);
    expect(json, "{\"a\" 1}", -1);
    expect(json, "[1]", -1); /* the root is an object */
    expect(json, "{\"a\": 01}", -1);
    expect(json, "{\"a\":\"\x01\"}", -1);
    sb_grammar_unref(json);

    sb_grammar *arith = fixture(NULL, "arithmetic.gbnf");
    expect(arith, "a+b*(c-2)= x\n", 1);
    expect(arith, "1+=2\n", -1);
    expect(arith, "1+2", 0);
    sb_grammar_unref(arith);

    sb_grammar *list = fixture(NULL, "list.gbnf");
    expect(list, "- milk\n- w\xc3\xb6rld\n", 1);
    expect(list, "- \n", -1);
    expect(list, "-x", -1);
    expect(list, "- a\xe2\x80\xa8", -1); /* U+2028 is excluded */
    sb_grammar_unref(list);

    sb_grammar *c = fixture(NULL, "c.gbnf");
    expect(c, "int main(){int x = 1;while(x<10){x = x+1;}return x;}", 1);
    expect(c, "int f(int a){/* note */return a*2;}float g(){}", 1);
    expect(c, "int main(){return;}", -1);
    sb_grammar_unref(c);
}

static void test_repetition_and_classes(void **state) {
    (void)state;
    const char *src = "root ::= \"a\"{2,3} [^a-c\\n]? x{0,2} \"!\"\nx ::= [0-9] | \"\\u00e9\"\n";
    sb_grammar *g = compile(NULL, src, strlen(src));
    expect(g, "aa!", 1);
    expect(g, "aaa!", 1);
    expect(g, "a!", -1);
    expect(g, "aaaa!", -1);
    expect(g, "aaz1\xc3\xa9!", 1);
    expect(g, "aab!", -1);
    expect(g, "aa1234!", -1);
    sb_grammar_unref(g);

    src = "root ::= ( \"ab\" )+ \"c\"? # comment\n";
    g = compile(NULL, src, strlen(src));
    expect(g, "ab", 1);
    expect(g, "ababc", 1);
    expect(g, "aba", 0);
    expect(g, "abcab", -1);
    sb_grammar_unref(g);

    /* A multi-byte character fed a byte at a time. */
    src = "root ::= [\\u00e0-\\u00ff] \"\xe2\x82\xac\"\n";
    g = compile(NULL, src, strlen(src));
    sb_grammar_matcher *m;
    assert_int_equal(sb_grammar_matcher_create(g, &m, NULL), SB_OK);
    const char *text = "\xc3\xa9\xe2\x82\xac";
    for (size_t i = 0; i < strlen(text); i++) {
        assert_false(sb_grammar_matcher_accepting(m));
        assert_true(sb_grammar_matcher_accept_text(m, text + i, 1));
    }
    assert_true(sb_grammar_matcher_accepting(m));
    sb_grammar_matcher_free(m);
    expect(g, "\xc3\xbf\xe2\x82\xac", 1);
    expect(g, "\xc2\xa9", -1);  /* U+00A9 is below the range */
    expect(g, "\xc3", 0);       /* a prefix of a character in the range */
    expect(g, "\xff", -1);      /* not UTF-8 */
    sb_grammar_unref(g);
}

static void test_errors_name_line_and_column(void **state) {
    (void)state;
    static const struct {
        const char *src, *want;
    } cases[] = {
        {"root ::= foo\n", "line 1, column 10: the rule 'foo' is used but never defined"},
        {"root ::= \"abc\n", "line 1, column 10: unterminated string literal"},
        {"root ::= [abc\n", "unterminated character class"},
        {"root ::= x\nx ::= x \"a\"\n", "the rule 'x' is left-recursive"},
        {"root ::= \"a\"\n\nfoo ::= \"b\" )\n", "line 3, column 13: unmatched ')'"},
        {"a ::= \"x\"\n", "there is no 'root' rule"},
        {"root ::= \"a\"\nroot ::= \"b\"\n", "line 2, column 1: this rule is defined twice"},
        {"root ::= \"a\"{3,2}\n", "maximum is below its minimum"},
        {"root ::= * \"a\"\n", "line 1, column 10: a repetition operator must follow a symbol"},
        {"root ::= \"\\q\"\n", "line 1, column 11: unknown escape"},
        {"root ::= (\"a\"\n", "expected ')'"},
        {"root = \"a\"\n", "line 1, column 6: expected '::='"},
        {"root ::= (\"a\"?)*\n", "left-recursive"},
        {"root ::= [z-a]\n", "below its start"},
    };
    for (size_t i = 0; i < SB_ARRAY_LEN(cases); i++) {
        sb_grammar *g = NULL;
        sb_error err = {0};
        sb_status st = sb_grammar_create(NULL, cases[i].src, strlen(cases[i].src), &g, &err);
        assert_int_equal(st, SB_ERR_INVALID_ARG);
        assert_null(g);
        if (!strstr(err.msg, cases[i].want))
            fail_msg("'%s': message '%s' lacks '%s'", cases[i].src, err.msg, cases[i].want);
    }
}

/* ---- masks on real vocabularies ------------------------------------------ */

static bool bit(const uint32_t *mask, int32_t t) { return mask[t >> 5] >> (t & 31) & 1; }

/* Tokens' bits against testing each token alone: every token of a small
 * vocabulary, every 7th of a large one. */
static void check_mask(const sb_model_t *model, sb_grammar_matcher *m, const uint32_t *mask) {
    const sb_vocab *v = model->vocab;
    bool accepting = sb_grammar_matcher_accepting(m);
    int32_t stride = v->n_tokens > 10000 ? 7 : 1;
    for (int32_t t = 0; t < v->n_tokens; t++) {
        if (t % stride)
            continue;
        const sb_vocab_token *tk = &v->tokens[t];
        bool want;
        if (sb_vocab_is_eog(v, t))
            want = accepting;
        else if (!(tk->attr & (SB_TOKEN_NORMAL | SB_TOKEN_BYTE | SB_TOKEN_USER_DEFINED)) || tk->piece_len == 0)
            want = false;
        else
            want = sb_grammar_matcher_can_take(m, v->pieces + tk->piece_off, tk->piece_len);
        if (bit(mask, t) != want)
            fail_msg("token %d ('%s'): mask says %d, the matcher %d", t, v->text + tk->text_off, bit(mask, t), want);
    }
}

/* Random walks through the masks: each step draws an allowed token (an end
 * token as soon as one is allowed after `min_len` steps); the text must be
 * a sentence when an end token is drawn. Returns how many walks ended. */
static int random_walks(const sb_model_t *model, sb_grammar *g, int walks, int max_steps, int n_checked, bool json) {
    int ended = 0;
    int32_t n_vocab = sb_model_n_vocab(model);
    int32_t *allowed = malloc((size_t)n_vocab * sizeof(int32_t));
    for (int w = 0; w < walks; w++) {
        sb_rng rng;
        sb_rng_seed(&rng, (uint64_t)w + 1);
        sb_grammar_matcher *m;
        assert_int_equal(sb_grammar_matcher_create(g, &m, NULL), SB_OK);
        char text[1 << 14];
        size_t len = 0;
        for (int step = 0; step < max_steps; step++) {
            const uint32_t *mask = sb_grammar_matcher_mask(m);
            if (step < n_checked && w == 0)
                check_mask(model, m, mask);
            int32_t n = 0, eog = -1;
            for (int32_t t = 0; t < n_vocab; t++)
                if (bit(mask, t)) {
                    if (sb_model_token_is_eog(model, t))
                        eog = t;
                    else
                        allowed[n++] = t;
                }
            if (eog >= 0 && (step >= 8 || n == 0)) {
                assert_true(sb_grammar_matcher_accepting(m));
                assert_true(sb_grammar_matcher_accept_token(m, eog));
                text[len] = '\0';
                if (json) {
                    cJSON *j = cJSON_Parse(text);
                    if (!j)
                        fail_msg("not JSON: '%s'", text);
                    cJSON_Delete(j);
                }
                ended++;
                break;
            }
            assert_true(n > 0);
            /* Prefer short tokens, so that walks finish: the shortest of a few draws. */
            int32_t best = allowed[(int32_t)(sb_rng_uniform(&rng) * n)];
            for (int k = 0; k < 3; k++) {
                int32_t t = allowed[(int32_t)(sb_rng_uniform(&rng) * n)];
                if (model->vocab->tokens[t].piece_len < model->vocab->tokens[best].piece_len)
                    best = t;
            }
            const sb_vocab_token *tk = &model->vocab->tokens[best];
            if (len + tk->piece_len + 1 >= sizeof text)
                break;
            memcpy(text + len, model->vocab->pieces + tk->piece_off, tk->piece_len);
            len += tk->piece_len;
            if (!sb_grammar_matcher_accept_token(m, best))
                fail_msg("token %d was in the mask but is refused", best);
        }
        sb_grammar_matcher_free(m);
    }
    free(allowed);
    return ended;
}

static void masks_on(const char *fixture_path) {
    sb_model_t *model;
    sb_error err = {0};
    if (sb_model_load(sb_test_fixture(fixture_path), &model, &err) != SB_OK)
        fail_msg("%s: %s", fixture_path, err.msg);
    sb_grammar_vocab *v;
    assert_int_equal(sb_grammar_vocab_create(model, &v, NULL), SB_OK);
    static const char *const names[] = {"json.gbnf", "arithmetic.gbnf", "list.gbnf", "c.gbnf"};
    for (size_t i = 0; i < SB_ARRAY_LEN(names); i++) {
        sb_grammar *g = fixture(v, names[i]);
        sb_grammar *again = fixture(v, names[i]);
        assert_ptr_equal(g, again); /* cached by text */
        sb_grammar_unref(again);
        int ended = random_walks(model, g, 4, 200, 2, i == 0);
        if (i == 0 && ended == 0)
            fail_msg("%s: no JSON walk ended", fixture_path);
        sb_grammar_unref(g);
    }
    /* UTF-8 split across tokens: a grammar of one 3-byte character. */
    const char *src = "root ::= \"\xe2\x82\xac\" [\\u4e00-\\u9fff]\n";
    sb_grammar *g = compile(v, src, strlen(src));
    assert_int_equal(random_walks(model, g, 4, 20, 4, false), 4);
    sb_grammar_unref(g);
    sb_grammar_vocab_free(v);
    sb_model_free(model);
}

static void test_masks_spm_stories(void **state) {
    (void)state;
    masks_on("models/stories260K.gguf");
}

static void test_masks_spm_llama2(void **state) {
    (void)state;
    masks_on("models/llama2-vocab-tiny-random.gguf");
}

static void test_masks_bpe_llama3(void **state) {
    (void)state;
    masks_on("models/llama3-vocab-tiny-random.gguf");
}

static void test_masks_bpe_qwen2(void **state) {
    (void)state;
    masks_on("models/qwen2-vocab-tiny-random.gguf");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_examples_parse_and_match),
        cmocka_unit_test(test_repetition_and_classes),
        cmocka_unit_test(test_errors_name_line_and_column),
        cmocka_unit_test(test_masks_spm_stories),
        cmocka_unit_test(test_masks_spm_llama2),
        cmocka_unit_test(test_masks_bpe_llama3),
        cmocka_unit_test(test_masks_bpe_qwen2),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
