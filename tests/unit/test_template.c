/*
 * test_template.c - the Jinja chat-template engine (src/template/): every
 * rendering in ../shared/templates/expected.jsonl byte for byte (Python
 * Jinja2 3.1.6 as transformers runs it), the built-in templates against the
 * fixtures of the templates they rewrite, Jinja semantics case by case
 * (expected strings from Jinja2 3.1.6), the errors (line:column, unknown
 * filters, raise_exception, runaway templates) with no leaks, and the
 * `switchboard template` command.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>
#include <cmocka.h>

#include "base/base.h"
#include "template/template.h"
#include "testutil.h"

/* ---- helpers --------------------------------------------------------------------- */

static cJSON **lines;
static size_t n_lines;

static int load_expected(void **state) {
    (void)state;
    char *text = sb_test_read_file(sb_test_fixture("templates/expected.jsonl"), NULL);
    if (!text)
        return -1;
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        lines = realloc(lines, (n_lines + 1) * sizeof(*lines));
        lines[n_lines] = cJSON_Parse(line);
        if (!lines[n_lines++])
            return -1;
    }
    free(text);
    return 0;
}

static int free_expected(void **state) {
    (void)state;
    for (size_t i = 0; i < n_lines; i++)
        cJSON_Delete(lines[i]);
    free(lines);
    return 0;
}

static const char *str_field(const cJSON *obj, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

/* JSON text of a field (NULL if absent or null); caller frees. */
static char *json_field(const cJSON *obj, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    return v && !cJSON_IsNull(v) ? cJSON_PrintUnformatted(v) : NULL;
}

/* Renders src with the inputs of an expected.jsonl line. */
static sb_status render_line(const char *src, const cJSON *line, char **out, sb_error *err) {
    sb_tpl *tpl;
    sb_status st = sb_tpl_parse(src, strlen(src), &tpl, err);
    if (st)
        return st;
    char *messages = json_field(line, "messages"), *tools = json_field(line, "tools");
    sb_tpl_chat chat = {
        .messages_json = messages,
        .tools_json = tools,
        .add_generation_prompt = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(line, "add_generation_prompt")),
        .bos_token = str_field(line, "bos_token"),
        .eos_token = str_field(line, "eos_token"),
        .now = str_field(line, "now"),
    };
    st = sb_tpl_render_chat(tpl, &chat, out, NULL, err);
    free(messages);
    free(tools);
    sb_tpl_free(tpl);
    return st;
}

static char *read_template(const char *name) {
    char rel[256];
    snprintf(rel, sizeof(rel), "templates/%s", name);
    char *src = sb_test_read_file(sb_test_fixture(rel), NULL);
    assert_non_null(src);
    return src;
}

/* Prints where got and want first differ. */
static void show_diff(const char *what, const char *got, const char *want) {
    size_t i = 0;
    while (got[i] && got[i] == want[i])
        i++;
    size_t from = i > 40 ? i - 40 : 0;
    fprintf(stderr, "%s: differs at byte %zu\n  got:  ...%.80s\n  want: ...%.80s\n", what, i, got + from, want + from);
}

/* ---- the fixtures ---------------------------------------------------------------- */

static void test_expected_jsonl(void **state) {
    (void)state;
    size_t pass = 0;
    for (size_t i = 0; i < n_lines; i++) {
        const cJSON *line = lines[i];
        const char *name = str_field(line, "template"), *want = str_field(line, "output");
        char *src = read_template(name), *got = NULL;
        sb_error err = {0};
        sb_test_count_allocs_begin();
        sb_status st = render_line(src, line, &got, &err);
        char what[256];
        snprintf(what, sizeof(what), "%s / %s", name, str_field(line, "case"));
        if (st)
            fprintf(stderr, "%s: %s\n", what, err.msg);
        else if (strcmp(got, want) != 0)
            show_diff(what, got, want);
        else
            pass++;
        sb_free(got);
        sb_test_count_allocs_end();
        assert_int_equal(sb_test_live_bytes(), 0);
        free(src);
    }
    fprintf(stderr, "expected.jsonl: %zu/%zu renderings byte-identical\n", pass, n_lines);
    assert_int_equal(pass, n_lines);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_expected_jsonl),
    };
    return cmocka_run_group_tests(tests, load_expected, free_expected);
}
