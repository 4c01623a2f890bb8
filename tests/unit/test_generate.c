/*
 * test_generate.c - the forward pass against its references, through the
 * library API: llama2.c run.c's float32 logits for "<s> Once upon a time" on
 * stories260K, and llama.cpp's first-step probabilities (softmax of the
 * logits after each prompt) for every fixture in expected.json. The greedy
 * token sequences are checked through the command line in test_cli.c.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>
#include <cmocka.h>

#include "switchboard.h"
#include "testutil.h"

static cJSON *expected;

static int load_expected(void **state) {
    (void)state;
    char *text = sb_test_read_file(sb_test_fixture("models/expected.json"), NULL);
    expected = cJSON_Parse(text);
    free(text);
    return expected ? 0 : -1;
}

static int free_expected(void **state) {
    (void)state;
    cJSON_Delete(expected);
    return 0;
}

static sb_model_t *load_fixture(const char *name) {
    char rel[256];
    snprintf(rel, sizeof(rel), "models/%s", name);
    sb_model_t *m = NULL;
    sb_error err;
    if (sb_model_load(sb_test_fixture(rel), &m, &err) != SB_OK)
        fail_msg("loading %s: %s", name, err.msg);
    return m;
}

static void test_runc_logits(void **state) {
    (void)state;
    cJSON *ref = cJSON_GetObjectItem(
        cJSON_GetObjectItem(cJSON_GetObjectItem(cJSON_GetObjectItem(expected, "models"), "stories260K.gguf"),
                            "llama2c_reference"),
        "logits_once_upon_a_time");
    assert_non_null(ref);
    sb_model_t *m = load_fixture("stories260K.gguf");
    sb_ctx_t *ctx;
    assert_int_equal(sb_ctx_create(m, NULL, &ctx, NULL), SB_OK);
    const int32_t tokens[5] = {1, 403, 407, 261, 378};
    cJSON *rows = cJSON_IsArray(ref) ? ref : cJSON_GetObjectItem(ref, "logits");
    assert_int_equal(cJSON_GetArraySize(rows), 5);
    double worst = 0;
    for (int pos = 0; pos < 5; pos++) {
        assert_int_equal(sb_ctx_eval(ctx, &tokens[pos], 1, NULL), SB_OK);
        const float *logits = sb_ctx_logits(ctx);
        cJSON *row = cJSON_GetArrayItem(rows, pos);
        assert_int_equal(cJSON_GetArraySize(row), 512);
        for (int i = 0; i < 512; i++) {
            double d = fabs(logits[i] - cJSON_GetArrayItem(row, i)->valuedouble);
            worst = d > worst ? d : worst;
        }
    }
    fprintf(stderr, "run.c logits: max |difference| %.3g over 5 positions x 512\n", worst);
    assert_true(worst < 1e-4);
    sb_ctx_free(ctx);
    sb_model_free(m);
}

/* The logits after "<s> Once upon a time" (5 tokens) into out[5 * n_vocab]. */
static void eval_once_upon(sb_model_t *m, float *out) {
    sb_ctx_t *ctx;
    assert_int_equal(sb_ctx_create(m, NULL, &ctx, NULL), SB_OK);
    const int32_t tokens[5] = {1, 403, 407, 261, 378};
    const int32_t n_vocab = sb_model_n_vocab(m);
    for (int pos = 0; pos < 5; pos++) {
        assert_int_equal(sb_ctx_eval(ctx, &tokens[pos], 1, NULL), SB_OK);
        memcpy(out + (size_t)pos * n_vocab, sb_ctx_logits(ctx), (size_t)n_vocab * sizeof *out);
    }
    sb_ctx_free(ctx);
}

/* A private load never reads its file again: the copy it came from is
 * truncated and overwritten before the model runs, and the logits are the
 * mapped original's to the bit. Every stored type the fixtures have: F32
 * (nothing repacked), F16, Q8_0 and Q4_0 (repacked while loading). */
static void test_private_image_outlives_file(void **state) {
    (void)state;
    const char *names[] = {"stories260K.gguf", "stories260K-f16.gguf", "stories260K-q8_0.gguf", "stories260K-q4_0.gguf"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        char rel[64], copy[512];
        snprintf(rel, sizeof rel, "models/%s", names[i]);
        size_t size;
        char *bytes = sb_test_read_file(sb_test_fixture(rel), &size);
        assert_non_null(bytes);
        snprintf(copy, sizeof copy, "%s/private-%s", sb_test_tmpdir(), names[i]);
        FILE *f = fopen(copy, "wb");
        assert_non_null(f);
        assert_int_equal(fwrite(bytes, 1, size, f), size);
        fclose(f);

        sb_model_params p = sb_model_default_params();
        p.private_copy = true;
        sb_model_t *priv = NULL, *mapped = load_fixture(names[i]);
        sb_error err;
        if (sb_model_load_with(copy, &p, &priv, &err) != SB_OK)
            fail_msg("private load of %s: %s", copy, err.msg);
        f = fopen(copy, "wb"); /* truncated, then other bytes */
        assert_non_null(f);
        memset(bytes, 0x5a, size / 2);
        fwrite(bytes, 1, size / 2, f);
        fclose(f);

        const size_t n = 5 * (size_t)sb_model_n_vocab(mapped);
        float *want = malloc(n * sizeof *want), *got = malloc(n * sizeof *got);
        eval_once_upon(mapped, want);
        eval_once_upon(priv, got);
        assert_memory_equal(want, got, n * sizeof *want);
        free(want);
        free(got);
        free(bytes);
        sb_model_free(priv);
        sb_model_free(mapped);
        remove(copy);
    }
}

/* Softmax probability of `token` under logits. */
static double prob_of(const float *logits, int32_t n, int32_t token) {
    double max = logits[0], sum = 0;
    for (int32_t i = 1; i < n; i++)
        max = logits[i] > max ? logits[i] : max;
    for (int32_t i = 0; i < n; i++)
        sum += exp(logits[i] - max);
    return exp(logits[token] - max) / sum;
}

static void test_first_step_distribution(void **state) {
    (void)state;
    cJSON *model;
    cJSON_ArrayForEach(model, cJSON_GetObjectItem(expected, "models")) {
        sb_model_t *m = load_fixture(model->string);
        sb_ctx_t *ctx;
        assert_int_equal(sb_ctx_create(m, NULL, &ctx, NULL), SB_OK);
        bool quantized = strstr(model->string, "q4_0") || strstr(model->string, "q8_0");
        double worst = 0;
        cJSON *run;
        cJSON_ArrayForEach(run, cJSON_GetObjectItem(model, "runs")) {
            cJSON *ids = cJSON_GetObjectItem(run, "prompt_ids");
            int32_t n = cJSON_GetArraySize(ids), toks[64];
            for (int32_t i = 0; i < n; i++)
                toks[i] = cJSON_GetArrayItem(ids, i)->valueint;
            sb_ctx_reset(ctx);
            assert_int_equal(sb_ctx_eval(ctx, toks, n, NULL), SB_OK);
            cJSON *pair;
            cJSON_ArrayForEach(pair, cJSON_GetObjectItem(run, "first_step_top5")) {
                int32_t tok = cJSON_GetArrayItem(pair, 0)->valueint;
                double want = cJSON_GetArrayItem(pair, 1)->valuedouble;
                double got = prob_of(sb_ctx_logits(ctx), sb_model_n_vocab(m), tok);
                worst = fabs(got - want) > worst ? fabs(got - want) : worst;
            }
        }
        fprintf(stderr, "%s: first-step top-5 probabilities within %.3g of llama.cpp's\n", model->string, worst);
        assert_true(worst < (quantized ? 2e-2 : 1e-4));
        sb_ctx_free(ctx);
        sb_model_free(m);
    }
}

static void test_context_limit(void **state) {
    (void)state;
    sb_model_t *m = load_fixture("stories260K.gguf");
    sb_ctx_params p = sb_ctx_default_params();
    p.n_ctx = 8;
    sb_ctx_t *ctx;
    assert_int_equal(sb_ctx_create(m, &p, &ctx, NULL), SB_OK);
    int32_t toks[9] = {1, 403, 407, 261, 378, 1, 2, 3, 4};
    sb_error err;
    assert_int_equal(sb_ctx_eval(ctx, toks, 9, &err), SB_ERR_CONTEXT_FULL);
    assert_non_null(strstr(err.msg, "context"));
    assert_int_equal(sb_ctx_n_past(ctx), 0);
    assert_int_equal(sb_ctx_eval(ctx, toks, 8, NULL), SB_OK);
    assert_int_equal(sb_ctx_eval(ctx, toks, 1, &err), SB_ERR_CONTEXT_FULL);
    int32_t bad = 512;
    sb_ctx_reset(ctx);
    assert_int_equal(sb_ctx_eval(ctx, &bad, 1, &err), SB_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "vocabulary"));
    sb_ctx_free(ctx);
    sb_model_free(m);
}

/* Evaluating a prompt in one batch or token by token gives the same logits. */
static void test_batched_equals_sequential(void **state) {
    (void)state;
    sb_model_t *m = load_fixture("stories260K-q8_0.gguf");
    sb_ctx_t *a, *b;
    assert_int_equal(sb_ctx_create(m, NULL, &a, NULL), SB_OK);
    assert_int_equal(sb_ctx_create(m, NULL, &b, NULL), SB_OK);
    int32_t toks[20];
    for (int i = 0; i < 20; i++)
        toks[i] = i == 0 ? 1 : 259 + (i * 37) % 250;
    assert_int_equal(sb_ctx_eval(a, toks, 20, NULL), SB_OK);
    for (int i = 0; i < 20; i++)
        assert_int_equal(sb_ctx_eval(b, &toks[i], 1, NULL), SB_OK);
    assert_memory_equal(sb_ctx_logits(a), sb_ctx_logits(b), 512 * sizeof(float));
    sb_ctx_free(a);
    sb_ctx_free(b);
    sb_model_free(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_runc_logits),
        cmocka_unit_test(test_first_step_distribution),
        cmocka_unit_test(test_context_limit),
        cmocka_unit_test(test_batched_equals_sequential),
        cmocka_unit_test(test_private_image_outlives_file),
    };
    return cmocka_run_group_tests(tests, load_expected, free_expected);
}
