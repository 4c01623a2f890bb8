/*
 * test_prompts.c - the prompt library (src/registry/prompts.c): rendering
 * with request values and defaults, the escape, every template and variable
 * error with its offset or name, versions, the file overriding built-ins by
 * id, and the built-in library itself.
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
#include "registry/prompts.h"
#include "registry/regfile.h"
#include "testutil.h"

/* A prompt with a template and defaults given as JSON text. */
static sb_regfile_prompt make(const char *template_text, const char *defaults) {
    sb_regfile_prompt p = {.id = "t", .version = "1", .template_text = (char *)template_text};
    p.variables = cJSON_Parse(defaults ? defaults : "{}");
    return p;
}

/* Renders and returns the text (or the error message), sb_malloc'd. */
static char *render(const char *template_text, const char *defaults, const char *vars, sb_status want) {
    sb_regfile_prompt p = make(template_text, defaults);
    cJSON *v = vars ? cJSON_Parse(vars) : NULL;
    char *out = NULL;
    sb_error err;
    sb_status st = sb_prompt_render(&p, v, &out, &err);
    cJSON_Delete(v);
    cJSON_Delete(p.variables);
    if (st != want)
        fail_msg("'%s' rendered with status %d (%s), wanted %d", template_text, st, st ? err.msg : out, want);
    if (st) {
        assert_null(out);
        out = sb_strndup(err.msg, strlen(err.msg));
    }
    return out;
}

static void expect(const char *template_text, const char *defaults, const char *vars, sb_status status,
                   const char *want) {
    char *got = render(template_text, defaults, vars, status);
    if (strcmp(got, want) != 0)
        fail_msg("'%s': got\n  %s\nwanted\n  %s", template_text, got, want);
    sb_free(got);
}

static void test_render(void **state) {
    (void)state;
    expect("Write a story about {{topic}}.", "{\"topic\": \"a dragon\"}", NULL, SB_OK, "Write a story about a dragon.");
    expect("Write a story about {{topic}}.", "{\"topic\": \"a dragon\"}", "{\"topic\": \"a cat\"}", SB_OK,
           "Write a story about a cat.");
    expect("{{ a }}+{{a}}={{\tsum\t}}", NULL, "{\"a\": 2, \"sum\": 4.5}", SB_OK, "2+2=4.5");
    expect("{{x}} {{y}} {{z}}", NULL, "{\"x\": true, \"y\": false, \"z\": 0.1}", SB_OK, "true false 0.1");
    /* OpenAI's reusable prompts send text variables as input_text objects */
    expect("Hi {{name}}", NULL, "{\"name\": {\"type\": \"input_text\", \"text\": \"Jane\"}}", SB_OK, "Hi Jane");
    expect("{{big}}", NULL, "{\"big\": 12345678901234}", SB_OK, "12345678901234");
    expect("{{n}}", NULL, "{\"n\": -3}", SB_OK, "-3");
    expect("no variables", NULL, NULL, SB_OK, "no variables");
    expect("", NULL, "{}", SB_OK, "");
    /* values are inserted as they are: a value holding braces is not expanded again */
    expect("{{a}}", "{\"a\": \"{{b}}\"}", NULL, SB_OK, "{{b}}");
    /* names: letters, digits, '_', '-', '.' */
    expect("{{user.first_name}} {{user-id2}}", NULL, "{\"user.first_name\": \"Ada\", \"user-id2\": 7}", SB_OK, "Ada 7");
    /* the escape, and braces that need none */
    expect("{{{{topic}} is {{topic}}", NULL, "{\"topic\": \"x\"}", SB_OK, "{{topic}} is x");
    expect("a }} b { c {x} }", NULL, NULL, SB_OK, "a }} b { c {x} }");
    expect("{{{{{{{{", NULL, NULL, SB_OK, "{{{{");
    expect("multi\nline {{v}}\n", NULL, "{\"v\": \"\\u00e9\"}", SB_OK, "multi\nline \xC3\xA9\n");
}

static void test_render_errors(void **state) {
    (void)state;
    expect("Hello {{name}}, {{greeting}}", "{\"name\": \"Ada\"}", NULL, SB_ERR_INVALID_ARG,
           "prompt 't' version '1': variable 'greeting' (at offset 16) has no value and no default");
    expect("Hello {{name", NULL, NULL, SB_ERR_INVALID_ARG,
           "prompt 't' version '1': unterminated '{{' at offset 6 (write '{{{{' for a literal '{{')");
    expect("Hi {{first name}}", NULL, NULL, SB_ERR_INVALID_ARG,
           "prompt 't' version '1': bad placeholder '{{first name}}' at offset 3 (a name is letters, digits, '_', '-' "
           "and '.'; write '{{{{' "
           "for a literal '{{')");
    expect("Hi {{}}", NULL, NULL, SB_ERR_INVALID_ARG,
           "prompt 't' version '1': bad placeholder '{{}}' at offset 3 (a name is letters, digits, '_', '-' and '.'; "
           "write '{{{{' for a "
           "literal '{{')");
    expect("{{{x}}}", NULL, "{\"x\": 1}", SB_ERR_INVALID_ARG,
           "prompt 't' version '1': bad placeholder '{{{x}}' at offset 0 (a name is letters, digits, '_', '-' and '.'; "
           "write '{{{{' for a "
           "literal '{{')");
    expect("{{9lives}}", NULL, NULL, SB_ERR_INVALID_ARG,
           "prompt 't' version '1': bad placeholder '{{9lives}}' at offset 0 (a name is letters, digits, '_', '-' and "
           "'.'; write '{{{{' for "
           "a literal '{{')");
    expect("About {{topic}} and {{style}}; {{topic}}", NULL, "{\"topc\": \"x\"}", SB_ERR_INVALID_ARG,
           "prompt 't' version '1': variable 'topc' is not used by the template (it uses: topic, style)");
    expect("plain", NULL, "{\"x\": 1}", SB_ERR_INVALID_ARG,
           "prompt 't' version '1': variable 'x' is not used by the template (it uses: none)");
    static const char kinds[] = "prompt 't' version '1': variable 'x' must be a string, number, boolean or "
                                "{\"type\": \"input_text\", \"text\": ...}";
    expect("{{x}}", NULL, "{\"x\": {\"a\": 1}}", SB_ERR_INVALID_ARG, kinds);
    expect("{{x}}", NULL, "{\"x\": null}", SB_ERR_INVALID_ARG, kinds);
    expect("{{x}}", NULL, "{\"x\": {\"type\": \"input_image\", \"image_url\": \"http://x\"}}", SB_ERR_INVALID_ARG,
           kinds);
    expect("{{x}}", NULL, "[1]", SB_ERR_INVALID_ARG, "prompt 't' version '1': variables must be an object");
}

static void test_check_and_uses(void **state) {
    (void)state;
    size_t off = 99;
    sb_error err;
    assert_int_equal(sb_prompt_check("ok {{a}} {{{{ }}", &off, &err), SB_OK);
    assert_int_equal(sb_prompt_check("ok {{a}} {{b", &off, &err), SB_ERR_INVALID_ARG);
    assert_int_equal(off, 9);
    assert_int_equal(sb_prompt_check("{{a b}}", &off, &err), SB_ERR_INVALID_ARG);
    assert_int_equal(off, 0);
    assert_true(sb_prompt_uses("x {{ a }} y", "a"));
    assert_false(sb_prompt_uses("x {{ab}} y", "a"));
    assert_false(sb_prompt_uses("x {{{{a}} y", "a")); /* escaped: literal text */
    assert_false(sb_prompt_uses("x {{a", "a"));
}

static void test_version_order(void **state) {
    (void)state;
    assert_true(sb_prompt_version_cmp("10", "9") > 0); /* numbers as numbers */
    assert_true(sb_prompt_version_cmp("2", "2.0") == 0);
    assert_true(sb_prompt_version_cmp("1.5", "1.25") > 0);
    assert_true(sb_prompt_version_cmp("-1", "0") < 0);
    assert_true(sb_prompt_version_cmp("beta", "alpha") > 0); /* else as strings */
    assert_true(sb_prompt_version_cmp("v10", "v9") < 0);
    assert_true(sb_prompt_version_cmp("2", "beta") < 0);
    assert_true(sb_prompt_version_cmp("1.2.3", "1.10.0") > 0); /* not numbers: strcmp */
    assert_true(sb_prompt_version_cmp("x", "x") == 0);
}

static const char registry[] =
    "{\"models\": [],\n"
    " \"prompts\": [\n"
    "  {\"id\": \"story\", \"version\": 2, \"template\": \"v2 about {{topic}}\", \"variables\": {\"topic\": \"x\"}},\n"
    "  {\"id\": \"story\", \"version\": \"10\", \"template\": \"v10 about {{topic}}\"},\n"
    "  {\"id\": \"story\", \"version\": \"9\", \"template\": \"v9\"},\n"
    "  {\"id\": \"named\", \"version\": \"alpha\", \"template\": \"a\"},\n"
    "  {\"id\": \"named\", \"version\": \"beta\", \"template\": \"b\"},\n"
    "  {\"id\": \"one\", \"template\": \"default version\"}\n"
    " ]}\n";

static void test_find(void **state) {
    (void)state;
    sb_regfile *rf;
    sb_error err;
    assert_int_equal(sb_regfile_parse(registry, strlen(registry), "p.json", "/tmp", &rf, &err), SB_OK);
    assert_string_equal(sb_prompt_find(rf, "story", NULL)->version, "10");
    assert_string_equal(sb_prompt_find(rf, "story", "2")->template_text, "v2 about {{topic}}");
    assert_string_equal(sb_prompt_find(rf, "story", "2.0")->version, "2");
    assert_string_equal(sb_prompt_find(rf, "named", NULL)->version, "beta");
    assert_string_equal(sb_prompt_find(rf, "one", NULL)->version, "1");
    assert_null(sb_prompt_find(rf, "story", "3"));
    assert_null(sb_prompt_find(rf, "nope", NULL));
    /* the file's "story" hides the built-in one, every version of it */
    for (size_t i = 0; i < rf->n_prompts; i++)
        if (strcmp(rf->prompts[i].id, "story") == 0)
            assert_false(rf->prompts[i].builtin);
    assert_null(sb_prompt_find(rf, "story", "1"));
    /* the other built-ins are still there */
    const sb_regfile_prompt *p;
    assert_int_equal(sb_prompt_lookup(rf, "summarize", NULL, &p, &err), SB_OK);
    assert_true(p->builtin);
    assert_int_equal(sb_prompt_lookup(rf, "story", "3", &p, &err), SB_ERR_NOT_FOUND);
    assert_null(p);
    assert_string_equal(err.msg, "prompt 'story' has no version '3' (versions: 2, 10, 9)");
    assert_int_equal(sb_prompt_lookup(rf, "nope", NULL, &p, &err), SB_ERR_NOT_FOUND);
    assert_string_equal(err.msg, "no prompt 'nope' (prompts: story, named, one, marketing-copy, code, summarize)");
    sb_regfile_free(rf);
}

/* Every built-in renders once its variables without defaults are given,
 * and carries the parameters its task wants. */
static void test_builtins(void **state) {
    (void)state;
    sb_regfile *rf;
    sb_error err;
    const char *none = "{\"models\": []}";
    assert_int_equal(sb_regfile_parse(none, strlen(none), "none.json", "/tmp", &rf, &err), SB_OK);
    static const struct {
        const char *id, *vars, *contains;
        float max_temperature;
    } cases[] = {
        {"story", "{}", "a lighthouse keeper", 2},
        {"story", "{\"topic\": \"a robot learning to paint\", \"length\": 200}", "under 200 words", 2},
        {"marketing-copy", "{\"product\": \"a solar lantern\", \"benefit\": \"light for 12 hours\"}",
         "light for 12 hours", 1.5},
        {"code", "{\"task\": \"parses a CSV file\"}", "Write Python code that parses a CSV file.", 0.5},
        {"code", "{\"task\": \"reverses a list\", \"language\": \"C\"}", "Write C code", 0.5},
        {"summarize", "{\"text\": \"The meeting moved to Tuesday.\"}", "Text:\nThe meeting moved to Tuesday.", 0.5},
    };
    for (size_t i = 0; i < SB_ARRAY_LEN(cases); i++) {
        const sb_regfile_prompt *p = sb_prompt_find(rf, cases[i].id, NULL);
        assert_non_null(p);
        assert_true(p->builtin);
        assert_null(p->model);
        assert_true(*p->description);
        assert_true(p->params.set & SB_PARAM_TEMPERATURE);
        assert_true(p->params.set & SB_PARAM_MAX_TOKENS);
        assert_true(p->params.temperature <= cases[i].max_temperature);
        cJSON *v = cJSON_Parse(cases[i].vars);
        char *out;
        if (sb_prompt_render(p, v, &out, &err) != SB_OK)
            fail_msg("built-in '%s': %s", cases[i].id, err.msg);
        if (!strstr(out, cases[i].contains))
            fail_msg("built-in '%s' rendered '%s', which lacks '%s'", cases[i].id, out, cases[i].contains);
        sb_free(out);
        cJSON_Delete(v);
    }
    /* the variables without defaults are what a caller must give */
    const sb_regfile_prompt *p = sb_prompt_find(rf, "marketing-copy", NULL);
    char *out;
    assert_int_equal(sb_prompt_render(p, NULL, &out, &err), SB_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "variable 'product'"));
    sb_regfile_free(rf);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_render),         cmocka_unit_test(test_render_errors),
        cmocka_unit_test(test_check_and_uses), cmocka_unit_test(test_version_order),
        cmocka_unit_test(test_find),           cmocka_unit_test(test_builtins),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
