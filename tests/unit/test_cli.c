/*
 * test_cli.c - the `switchboard` command end to end: greedy generation of
 * every fixture and prompt in expected.json against llama.cpp's tokens, the
 * llama2.c story from the empty prompt, `info` on every fixture, `tokenize`,
 * and the one-line errors for files that are not models.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>
#include <cmocka.h>

#include "cli/cli.h"
#include "gguf/gguf.h"
#include "model/synth.h"
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

static char *fixture_path(const char *name) {
    char rel[256];
    snprintf(rel, sizeof(rel), "models/%s", name);
    return strdup(sb_test_fixture(rel));
}

/* Runs `switchboard run ... --json` (with the KV cache in `cache_type`)
 * and returns its parsed output. */
static cJSON *run_json(const char *model, const char *prompt, const char *n, const char *cache_type) {
    const char *args[] = {"run", "-m", model, "-p", prompt, "-n", n, "--temp", "0", "--json", "--cache-type", cache_type,
                          NULL};
    char *out, *err;
    int rc = sb_test_run_cli(args, &out, &err);
    if (rc != 0)
        fail_msg("switchboard run -m %s -p '%s' exited %d: %s", model, prompt, rc, err);
    cJSON *j = cJSON_Parse(out);
    if (!j)
        fail_msg("switchboard run printed no JSON: %s", out);
    free(out);
    free(err);
    return j;
}

static int count_equal_prefix(cJSON *a, cJSON *b) {
    int n = 0;
    while (n < cJSON_GetArraySize(a) && n < cJSON_GetArraySize(b) &&
           cJSON_GetArrayItem(a, n)->valueint == cJSON_GetArrayItem(b, n)->valueint)
        n++;
    return n;
}

static void test_greedy_matches_llamacpp(void **state) {
    (void)state;
    cJSON *model;
    cJSON_ArrayForEach(model, cJSON_GetObjectItem(expected, "models")) {
        char *path = fixture_path(model->string);
        cJSON *run;
        cJSON_ArrayForEach(run, cJSON_GetObjectItem(model, "runs")) {
            const char *prompt = cJSON_GetObjectItem(run, "prompt")->valuestring;
            int robust = cJSON_GetObjectItem(run, "robust_prefix")->valueint;
            cJSON *want = cJSON_GetObjectItem(run, "gen_ids");
            cJSON *got = run_json(path, prompt, "64", "f32");
            cJSON *prompt_ids = cJSON_GetObjectItem(got, "prompt_ids");
            assert_true(cJSON_Compare(prompt_ids, cJSON_GetObjectItem(run, "prompt_ids"), true));
            int same = count_equal_prefix(cJSON_GetObjectItem(got, "gen_ids"), want);
            fprintf(stderr, "%-30s %-18s: %2d/64 greedy tokens equal llama.cpp's (robust prefix %d)\n",
                    model->string, prompt, same, robust);
            assert_true(same >= robust);
            if (robust == 64) /* the whole text, as llama.cpp returns it */
                assert_string_equal(cJSON_GetObjectItem(got, "text")->valuestring,
                                    cJSON_GetObjectItem(run, "llamacpp_completion_text")->valuestring);
            cJSON_Delete(got);
        }
        free(path);
    }
}

static void test_llama2c_story(void **state) {
    (void)state;
    cJSON *ref = cJSON_GetObjectItem(
        cJSON_GetObjectItem(cJSON_GetObjectItem(expected, "models"), "stories260K.gguf"), "llama2c_reference");
    char *path = fixture_path("stories260K.gguf");
    cJSON *got = run_json(path, "", "200", "f32");
    assert_true(cJSON_Compare(cJSON_GetObjectItem(got, "gen_ids"), cJSON_GetObjectItem(ref, "gen_ids"), true));
    assert_string_equal(cJSON_GetObjectItem(got, "text")->valuestring, cJSON_GetObjectItem(ref, "text")->valuestring);
    cJSON_Delete(got);
    free(path);
}

/* An F16 KV cache: stories260K's greedy tokens stay llama.cpp's (with an
 * F16 cache llama.cpp's own 200 tokens do not change either, models/README). */
static void test_f16_cache_greedy(void **state) {
    (void)state;
    cJSON *model = cJSON_GetObjectItem(cJSON_GetObjectItem(expected, "models"), "stories260K.gguf");
    char *path = fixture_path("stories260K.gguf");
    cJSON *run;
    cJSON_ArrayForEach(run, cJSON_GetObjectItem(model, "runs")) {
        const char *prompt = cJSON_GetObjectItem(run, "prompt")->valuestring;
        cJSON *got = run_json(path, prompt, "64", "f16");
        assert_true(cJSON_Compare(cJSON_GetObjectItem(got, "gen_ids"), cJSON_GetObjectItem(run, "gen_ids"), true));
        cJSON_Delete(got);
    }
    free(path);
}

/* The library only hands its warnings to a log callback; the CLI's prints
 * them on stderr. */
static void test_library_warning_printed(void **state) {
    (void)state;
    char *path = fixture_path("stories260K.gguf");
    const char *args[] = {"run", "-m", path, "-p", "Once", "-n", "2", "--temp", "0", NULL};
    char *out, *err;
    setenv("SB_CPU", "sse9", 1);
    int rc = sb_test_run_cli(args, &out, &err);
    unsetenv("SB_CPU");
    assert_int_equal(rc, 0);
    assert_non_null(strstr(err, "switchboard: warning: SB_CPU=sse9 is not scalar, avx2, avx512 or amx; using "));
    free(out);
    free(err);
    free(path);
}

static void test_info_every_fixture(void **state) {
    (void)state;
    const char *files[] = {"stories260K.gguf", "stories260K-f16.gguf", "stories260K-q8_0.gguf",
                           "stories260K-q4_0.gguf", "llama2-vocab-tiny-random.gguf",
                           "llama3-vocab-tiny-random.gguf", "qwen2-vocab-tiny-random.gguf"};
    for (size_t i = 0; i < sizeof(files) / sizeof(files[0]); i++) {
        char *path = fixture_path(files[i]);
        const char *args[] = {"info", path, NULL};
        char *out, *err;
        assert_int_equal(sb_test_run_cli(args, &out, &err), 0);
        assert_non_null(strstr(out, "general.architecture"));
        assert_non_null(strstr(out, "\"llama\""));
        assert_non_null(strstr(out, "tokenizer.ggml.tokens"));
        assert_non_null(strstr(out, "token_embd.weight"));
        assert_non_null(strstr(out, "blk.0.attn_q.weight"));
        free(out);
        free(err);
        free(path);
    }
    char *path = fixture_path("stories260K-q4_0.gguf");
    const char *args[] = {"info", path, NULL};
    char *out, *err;
    assert_int_equal(sb_test_run_cli(args, &out, &err), 0);
    /* name, type, shape, offset, bytes of one tensor of each type */
    assert_non_null(strstr(out, "q4_0"));
    assert_non_null(strstr(out, "[64, 512]"));
    assert_non_null(strstr(out, "47 tensors"));
    free(out);
    free(err);
    free(path);
}

/* Runs `switchboard run -m path` and expects failure with exactly one line
 * on stderr containing `expect`. */
/* `switchboard run` on path (with --cache-type cache_type) fails with one
 * line on stderr that mentions `expect`. */
static void expect_run_error_with(const char *path, const char *cache_type, const char *expect) {
    const char *args[] = {"run", "-m", path, "-p", "hi", "-n", "4", "--cache-type", cache_type, NULL};
    char *out, *err;
    int rc = sb_test_run_cli(args, &out, &err);
    assert_int_not_equal(rc, 0);
    assert_true(rc < 128); /* exited, not killed */
    size_t len = strlen(err);
    assert_true(len > 0 && err[len - 1] == '\n');
    assert_null(memchr(err, '\n', len - 1)); /* one line */
    if (!strstr(err, expect))
        fail_msg("expected an error mentioning '%s', got: %s", expect, err);
    free(out);
    free(err);
}

static void expect_run_error(const char *path, const char *expect) { expect_run_error_with(path, "f32", expect); }

static void test_run_errors(void **state) {
    (void)state;
    char path[512];
    expect_run_error("/nonexistent/model.gguf", "No such file");
    expect_run_error(sb_test_tmpdir(), "directory");
    expect_run_error(sb_test_fixture("models/README.md"), "not a GGUF file");
    expect_run_error("/dev/null", "not a regular file");

    /* A well-formed GGUF whose architecture switchboard does not know. */
    sb_gguf_writer *w = sb_gguf_writer_create();
    sb_gguf_set_str(w, "general.architecture", "mamba");
    snprintf(path, sizeof(path), "%s/mamba.gguf", sb_test_tmpdir());
    assert_int_equal(sb_gguf_writer_save(w, path, NULL), SB_OK);
    sb_gguf_writer_free(w);
    expect_run_error(path, "unsupported architecture 'mamba'");

    snprintf(path, sizeof(path), "%s/empty.gguf", sb_test_tmpdir());
    fclose(fopen(path, "wb"));
    expect_run_error(path, "empty");

    /* stories260K's heads hold 8 values: no whole Q8_0 block. */
    expect_run_error_with(sb_test_fixture("models/stories260K.gguf"), "q8_0", "multiple of 32");
    expect_run_error_with(sb_test_fixture("models/stories260K.gguf"), "q4_0", "not a KV-cache type");
}

/* `switchboard <command> --help` prints the usage and succeeds, for every
 * command; an unknown command is still a usage error. */
static void test_command_help(void **state) {
    (void)state;
    static const char *const commands[] = {"run", "bench", "serve", "info", "tokenize", "template", "gen-model"};
    for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++) {
        const char *args[] = {commands[i], i % 2 ? "-h" : "--help", NULL};
        char *out = NULL, *err = NULL;
        assert_int_equal(sb_test_run_cli(args, &out, &err), 0);
        assert_non_null(strstr(out, "usage: switchboard <command>"));
        assert_non_null(strstr(out, commands[i]));
        free(out);
        free(err);
    }
    const char *bad[] = {"frobnicate", "--help", NULL};
    char *out = NULL, *err = NULL;
    assert_int_not_equal(sb_test_run_cli(bad, &out, &err), 0);
    assert_non_null(strstr(err, "unknown command 'frobnicate'"));
    free(out);
    free(err);
}

static void test_tokenize_command(void **state) {
    (void)state;
    char *path = fixture_path("stories260K.gguf");
    const char *args[] = {"tokenize", "-m", path, "Once upon a time", NULL};
    char *out, *err;
    assert_int_equal(sb_test_run_cli(args, &out, &err), 0);
    assert_string_equal(out, "[1,403,407,261,378]\n");
    free(out);
    free(err);
    const char *args2[] = {"tokenize", "-m", path, "--no-bos", "--pieces", "Once", NULL};
    assert_int_equal(sb_test_run_cli(args2, &out, &err), 0);
    assert_string_equal(out, "[[403,\"\xe2\x96\x81Once\"]]\n");
    free(out);
    free(err);
    free(path);
}

/* Runs the command and checks its exit status and that stderr holds `want_err` (if not NULL); returns stdout. */
static char *run_cli_expect(const char *const *args, int want_rc, const char *want_err) {
    char *out, *err;
    int rc = sb_test_run_cli(args, &out, &err);
    if (rc != want_rc || (want_err && !strstr(err, want_err)))
        fail_msg("switchboard %s ... exited %d (wanted %d), stderr: %s", args[0], rc, want_rc, err);
    free(err);
    return out;
}

/* `--` ends every command's options: after it, "-x" is text, not an option. */
static void test_end_of_options(void **state) {
    (void)state;
    char *path = fixture_path("stories260K.gguf");
    sb_model_t *model;
    sb_error e;
    assert_int_equal(sb_model_load(path, &model, &e), SB_OK);
    int32_t ids[16];
    size_t n;
    assert_int_equal(sb_tokenize(model, "-x", 2, true, false, ids, 16, &n, &e), SB_OK);
    sb_model_free(model);
    char want[128] = "[";
    for (size_t i = 0; i < n; i++)
        snprintf(want + strlen(want), sizeof(want) - strlen(want), "%s%d", i ? "," : "", ids[i]);
    strcat(want, "]\n");

    const char *dash[] = {"tokenize", "-m", path, "--", "-x", NULL};
    char *out = run_cli_expect(dash, 0, NULL);
    assert_string_equal(out, want);
    free(out);
    const char *opts_first[] = {"tokenize", "--pieces", "-m", path, "--no-bos", "--", "--", NULL};
    free(run_cli_expect(opts_first, 0, NULL)); /* a second `--` is the text */
    const char *no_dashes[] = {"tokenize", "-m", path, "-x", NULL};
    free(run_cli_expect(no_dashes, SB_EXIT_USAGE, "unknown option '-x'"));
    const char *two[] = {"tokenize", "-m", path, "--", "-x", "-y", NULL};
    free(run_cli_expect(two, SB_EXIT_USAGE, "more than one TEXT argument ('-y')"));
    /* an option's value may be "--": it does not end the options */
    const char *value[] = {"run", "-m", path, "-p", "--", "-n", "1", "--temp", "0", "--json", NULL};
    out = run_cli_expect(value, 0, NULL);
    cJSON *j = cJSON_Parse(out);
    assert_non_null(j);
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(j, "gen_ids")), 1);
    cJSON_Delete(j);
    free(out);
    const char *trailing[] = {"run", "-m", path, "-p", "hi", "-n", "1", "--json", "--", NULL};
    free(run_cli_expect(trailing, 0, NULL));
    const char *info[] = {"info", "--", path, NULL};
    free(run_cli_expect(info, 0, NULL));
    /* commands without operands refuse one after `--`, by name */
    static const char *const commands[] = {"run", "bench", "serve", "template", "gen-model"};
    for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++) {
        const char *args[] = {commands[i], "--", "-x", NULL};
        char msg[128];
        snprintf(msg, sizeof(msg), "%s: unexpected argument '-x' after '--'", commands[i]);
        free(run_cli_expect(args, SB_EXIT_USAGE, msg));
    }
    free(path);
}

static void test_gen_model_runs(void **state) {
    (void)state;
    char path[512];
    snprintf(path, sizeof(path), "%s/gen.gguf", sb_test_tmpdir());
    const char *types[] = {"f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1"};
    for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++) {
        const char *gen[] = {"gen-model", "--out", path, "--type", types[i], "--dim", "64", "--layers", "2",
                             "--vocab", "400", "--seed", "7", NULL};
        char *out, *err;
        assert_int_equal(sb_test_run_cli(gen, &out, &err), 0);
        free(out);
        free(err);
        cJSON *j = run_json(path, "hello world", "16", "f32");
        int n = cJSON_GetArraySize(cJSON_GetObjectItem(j, "gen_ids"));
        const char *stop = cJSON_GetObjectItem(j, "stop")->valuestring;
        assert_true(n == 16 || (n < 16 && strcmp(stop, "eos") == 0));
        cJSON_Delete(j);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_greedy_matches_llamacpp),
        cmocka_unit_test(test_llama2c_story),
        cmocka_unit_test(test_f16_cache_greedy),
        cmocka_unit_test(test_library_warning_printed),
        cmocka_unit_test(test_info_every_fixture),
        cmocka_unit_test(test_run_errors),
        cmocka_unit_test(test_command_help),
        cmocka_unit_test(test_tokenize_command),
        cmocka_unit_test(test_end_of_options),
        cmocka_unit_test(test_gen_model_runs),
    };
    return cmocka_run_group_tests(tests, load_expected, free_expected);
}
