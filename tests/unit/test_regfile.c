/*
 * test_regfile.c - the registry file (src/registry/regfile.c): the full
 * documented shape and the minimal one read field by field, every kind of
 * bad file rejected with the exact line and field, name resolution, the
 * change checks the runtime uses on reload, durations, model directories
 * and single files, and no leak or crash when any allocation fails.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <cmocka.h>

#include "base/base.h"
#include "registry/prompts.h"
#include "registry/regfile.h"
#include "testutil.h"

/* A scratch directory with two (empty) model files and a template. */
static const char *dir(void) {
    static char path[300];
    if (!path[0]) {
        snprintf(path, sizeof(path), "%s/regfile", sb_test_tmpdir());
        mkdir(path, 0700);
        const char *files[] = {"stories.gguf", "stories-q8.gguf", "t.jinja"};
        for (size_t i = 0; i < SB_ARRAY_LEN(files); i++) {
            char p[400];
            snprintf(p, sizeof(p), "%s/%s", path, files[i]);
            FILE *f = fopen(p, "w");
            assert_non_null(f);
            fputs("x", f);
            fclose(f);
        }
    }
    return path;
}

static const char *write_file(const char *name, const char *text) {
    static char path[400];
    snprintf(path, sizeof(path), "%s/%s", dir(), name);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
    return path;
}

static const char full_json[] =
    "{\n"                                                                            /* 1 */
    "  \"fallback\": \"stories\",\n"                                                 /* 2 */
    "  \"models\": [\n"                                                              /* 3 */
    "    {\"name\": \"stories\", \"path\": \"stories.gguf\", \"device\": \"cpu\",\n" /* 4 */
    "     \"aliases\": [\"tiny\", \"small\"], \"context\": 512, \"cache_type\": \"q8_0\", \"parallel\": 4,\n"
    "     \"system_prompt\": \"You are a storyteller.\", \"chat_template\": \"t.jinja\",\n"
    "     \"keep_alive\": \"5m\", \"pinned\": true, \"price\": {\"prompt\": 0.15, \"completion\": 0.6},\n"
    "     \"fallback\": \"stories-q8\",\n"
    "     \"parameters\": {\"temperature\": 0.8, \"top_k\": 40, \"top_p\": 0.95, \"min_p\": 0.05,\n"
    "                    \"repeat_penalty\": 1.1, \"repeat_last_n\": 64, \"frequency_penalty\": 0.5,\n"
    "                    \"presence_penalty\": -0.5, \"seed\": 7, \"max_tokens\": 256, \"stop\": [\"\\n\\n\", "
    "\"END\"]}},\n"
    "    {\"name\": \"stories-q8\", \"path\": \"stories-q8.gguf\", \"keep_alive\": -1}\n" /* 12 */
    "  ],\n"
    "  \"routes\": [{\"name\": \"story-ab\",\n" /* 14 */
    "              \"split\": [{\"model\": \"stories\", \"weight\": 80}, {\"model\": \"tiny\", \"weight\": 20}]}],\n"
    "  \"prompts\": [\n"
    "    {\"id\": \"story\", \"version\": 2, \"description\": \"A story.\", \"template\": \"Write about {{topic}}.\",\n"
    "     \"model\": \"story-ab\", \"parameters\": {\"temperature\": 1.2, \"stop\": \"THE END\"},\n"
    "     \"variables\": {\"topic\": \"a dragon\"}}\n"
    "  ]\n"
    "}\n";

static void test_full_shape(void **state) {
    (void)state;
    sb_regfile *rf;
    sb_error err;
    const char *path = write_file("full.json", full_json);
    assert_int_equal(sb_regfile_load(path, &rf, &err), SB_OK);
    assert_string_equal(rf->path, path);
    assert_string_equal(rf->fallback, "stories");
    assert_int_equal(rf->n_models, 2);
    const sb_regfile_model *m = &rf->models[0];
    char want[500];
    char *real = realpath(dir(), NULL);
    snprintf(want, sizeof(want), "%s/stories.gguf", real);
    assert_string_equal(m->path, want);
    snprintf(want, sizeof(want), "%s/t.jinja", real);
    assert_string_equal(m->chat_template, want);
    free(real);
    assert_string_equal(m->name, "stories");
    assert_string_equal(m->device, "cpu");
    assert_int_equal(m->n_aliases, 2);
    assert_string_equal(m->aliases[1], "small");
    assert_int_equal(m->context, 512);
    assert_true(m->has_cache_type);
    assert_int_equal(m->cache_type, SB_CACHE_Q8_0);
    assert_int_equal(m->parallel, 4);
    assert_string_equal(m->system_prompt, "You are a storyteller.");
    assert_true(m->has_keep_alive);
    assert_int_equal(m->keep_alive_ms, 300000);
    assert_true(m->pinned);
    assert_true(m->price_prompt == 0.15 && m->price_completion == 0.6);
    assert_string_equal(m->fallback, "stories-q8");
    assert_int_equal(m->line, 4);
    assert_int_equal(m->file.size, 1);
    const sb_regfile_params *p = &m->params;
    assert_int_equal(p->set, 0x7FF); /* every parameter given */
    assert_true(p->temperature == 0.8f && p->top_k == 40 && p->top_p == 0.95f && p->min_p == 0.05f);
    assert_true(p->repeat_penalty == 1.1f && p->repeat_last_n == 64 && p->frequency_penalty == 0.5f);
    assert_true(p->presence_penalty == -0.5f && p->seed == 7 && p->max_tokens == 256);
    assert_int_equal(p->n_stop, 2);
    assert_string_equal(p->stop[0], "\n\n");
    const sb_regfile_model *q8 = &rf->models[1];
    assert_int_equal(q8->keep_alive_ms, SB_REGFILE_FOREVER);
    assert_false(q8->has_cache_type);
    assert_int_equal(q8->line, 12);
    assert_int_equal(rf->n_routes, 1);
    assert_string_equal(rf->routes[0].name, "story-ab");
    assert_int_equal(rf->routes[0].n_split, 2);
    assert_string_equal(rf->routes[0].split[1].model, "tiny");
    assert_true(rf->routes[0].total_weight == 100);
    assert_int_equal(rf->routes[0].line, 14);
    /* the file's prompt first, then the built-ins whose ids it does not use */
    const sb_regfile_prompt *pr = &rf->prompts[0];
    assert_string_equal(pr->id, "story");
    assert_string_equal(pr->version, "2");
    assert_string_equal(pr->model, "story-ab");
    assert_false(pr->builtin);
    assert_int_equal(pr->line, 17);
    assert_int_equal(pr->params.set, SB_PARAM_TEMPERATURE | SB_PARAM_STOP);
    assert_string_equal(pr->params.stop[0], "THE END");
    assert_string_equal(cJSON_GetObjectItem(pr->variables, "topic")->valuestring, "a dragon");
    for (size_t i = 1; i < rf->n_prompts; i++) {
        assert_true(rf->prompts[i].builtin);
        assert_string_not_equal(rf->prompts[i].id, "story");
    }
    sb_regfile_free(rf);
}

static void test_minimal_shape(void **state) {
    (void)state;
    sb_regfile *rf;
    sb_error err;
    const char *path = write_file("minimal.json",
                                  "{\"models\": [{\"name\": \"m\", \"path\": \"stories.gguf\", \"device\": \"cpu\"}]}");
    assert_int_equal(sb_regfile_load(path, &rf, &err), SB_OK);
    const sb_regfile_model *m = &rf->models[0];
    assert_int_equal(m->context, 0);
    assert_false(m->has_cache_type || m->has_keep_alive || m->pinned);
    assert_int_equal(m->parallel, 0);
    assert_null(m->fallback);
    assert_null(m->chat_template);
    assert_null(m->system_prompt);
    assert_int_equal(m->params.set, 0);
    assert_null(rf->fallback);
    assert_int_equal(rf->n_routes, 0);
    assert_true(rf->n_prompts >= 4); /* the built-ins */
    sb_regfile_free(rf);
    /* an empty list of models is a registry (files may come later) */
    assert_int_equal(sb_regfile_load(write_file("empty.json", "{\"models\": []}"), &rf, &err), SB_OK);
    assert_int_equal(rf->n_models, 0);
    sb_regfile_free(rf);
}

/* One bad file: its text, and the message expected after "PATH:". */
typedef struct bad_case {
    const char *json;
    const char *want; /* "LINE: FIELD: message start" or "LINE:COL: ..." */
    sb_status status;
} bad_case;

#define M0 "{\"models\": [\n  {\"name\": \"a\", \"path\": \"stories.gguf\"}"
#define M0_END "]}"

static const bad_case bad_cases[] = {
    /* JSON syntax: line and column */
    {"{\"models\": [\n  {\"name\": \"a\",\n   \"path\": \"stories.gguf\",}]}",
     "3:26: JSON syntax error: trailing comma before '}'", SB_ERR_FORMAT},
    {M0 "\n  {\"name\": \"b\"}" M0_END,
     "3:3: JSON syntax error: unexpected text at '{\"name\": \"b\"}]}' (missing ','?)", SB_ERR_FORMAT},
    {M0 ",\n  {\"name\": \"b\", \"path\": \"stories.gguf}" M0_END, "3:25: JSON syntax error: unterminated string",
     SB_ERR_FORMAT},
    {"{\n  // a comment\n  \"models\": []}", "2:3: JSON syntax error: comments are not allowed in JSON", SB_ERR_FORMAT},
    {"{\"models\": [\n", "2:1: JSON syntax error: unexpected end of file", SB_ERR_FORMAT},
    {"\n\n", "3:1: JSON syntax error: the file is empty", SB_ERR_FORMAT},
    /* shape */
    {"[]", "1: expected a JSON object, got an array", SB_ERR_FORMAT},
    {"{\"routes\": []}", "1: missing required field 'models'", SB_ERR_FORMAT},
    {"{\"models\": {}}", "1: models: expected an array, got an object", SB_ERR_FORMAT},
    {"{\"models\": [],\n \"modles\": []}", "2: unknown field 'modles'", SB_ERR_FORMAT},
    {M0 ",\n  \"b\"" M0_END, "3: models[1]: expected an object, got a string", SB_ERR_FORMAT},
    {M0 ",\n\n  {\"name\": \"b\",\n   \"pathh\": \"stories.gguf\"}" M0_END, "5: models[1]: unknown field 'pathh'",
     SB_ERR_FORMAT},
    {M0 ",\n  {\"name\": \"b\", \"path\": \"stories.gguf\",\n   \"name\": \"c\"}" M0_END,
     "4: models[1]: duplicate field 'name' (first at line 3)", SB_ERR_FORMAT},
    {M0 ",\n  {\"path\": \"stories.gguf\"}" M0_END, "3: models[1]: missing required field 'name'", SB_ERR_FORMAT},
    {M0 ",\n  {\"name\": \"b\"}" M0_END, "3: models[1]: missing required field 'path' (model 'b')", SB_ERR_FORMAT},
    {M0 ",\n  {\"name\": \"\", \"path\": \"x\"}" M0_END, "3: models[1].name: must not be empty", SB_ERR_FORMAT},
    {M0 ",\n  {\"name\": 7, \"path\": \"x\"}" M0_END, "3: models[1].name: expected a string, got a number",
     SB_ERR_FORMAT},
    /* values */
    {M0 ",\n  {\"name\": \"b\", \"path\": \"x\",\n   \"context\": \"big\"}" M0_END,
     "4: models[1].context: expected an integer, got a string", SB_ERR_FORMAT},
    {M0 ",\n  {\"name\": \"b\", \"path\": \"x\",\n   \"context\": -5}" M0_END,
     "4: models[1].context: -5 is not an integer in [0, 16777216]", SB_ERR_FORMAT},
    {M0 ",\n  {\"name\": \"b\", \"path\": \"x\", \"parallel\": 1.5}" M0_END,
     "3: models[1].parallel: 1.5 is not an integer in [1, 1024]", SB_ERR_FORMAT},
    {M0 ",\n  {\"name\": \"b\", \"path\": \"x\",\n   \"cache_type\": \"q4_0\"}" M0_END,
     "4: models[1].cache_type: bad cache type 'q4_0' (expected f32, f16 or q8_0)", SB_ERR_FORMAT},
    {M0 ",\n  {\"name\": \"b\", \"path\": \"x\",\n   \"device\": \"cuda\"}" M0_END,
     "4: models[1].device: device 'cuda' is not available: no such backend", SB_ERR_UNSUPPORTED},
    {M0 ",\n  {\"name\": \"b\", \"path\": \"x\",\n   \"keep_alive\": \"5 minutes\"}" M0_END,
     "4: models[1].keep_alive: bad duration '5 minutes'", SB_ERR_FORMAT},
    {M0 ",\n  {\"name\": \"b\", \"path\": \"x\",\n   \"keep_alive\": true}" M0_END,
     "4: models[1].keep_alive: expected a duration", SB_ERR_FORMAT},
    {M0 ",\n  {\"name\": \"b\", \"path\": \"x\", \"pinned\": \"yes\"}" M0_END,
     "3: models[1].pinned: expected true or false, got a string", SB_ERR_FORMAT},
    {M0 ",\n  {\"name\": \"b\", \"path\": \"x\", \"price\": {\"prompt\": 1,\n    \"completoin\": 2}}" M0_END,
     "4: models[1].price: unknown field 'completoin'", SB_ERR_FORMAT},
    {M0 ",\n  {\"name\": \"b\", \"path\": \"x\", \"price\": {\"prompt\": -1}}" M0_END,
     "3: models[1].price.prompt: -1 is out of range", SB_ERR_FORMAT},
    {M0 ",\n  {\"name\": \"b\", \"path\": \"x\", \"parameters\": {\n    \"temperature\": -1}}" M0_END,
     "4: models[1].parameters.temperature: -1 is out of range: expected a number >= 0", SB_ERR_FORMAT},
    {M0 ",\n  {\"name\": \"b\", \"path\": \"x\", \"parameters\": {\"top_p\": 1.5}}" M0_END,
     "3: models[1].parameters.top_p: 1.5 is out of range", SB_ERR_FORMAT},
    {M0 ",\n  {\"name\": \"b\", \"path\": \"x\", \"parameters\": {\"repeat_penalty\": 0}}" M0_END,
     "3: models[1].parameters.repeat_penalty: 0 is out of range: expected a number > 0", SB_ERR_FORMAT},
    {M0 ",\n  {\"name\": \"b\", \"path\": \"x\", \"parameters\": {\"max_tokens\": 0}}" M0_END,
     "3: models[1].parameters.max_tokens: 0 is not an integer in [1, 16777216]", SB_ERR_FORMAT},
    {M0 ",\n  {\"name\": \"b\", \"path\": \"x\", \"parameters\": {\"stop\": [\"a\",\n   3]}}" M0_END,
     "4: models[1].parameters.stop[1]: expected a string, got a number", SB_ERR_FORMAT},
    {M0 ",\n  {\"name\": \"b\", \"path\": \"x\", \"parameters\": {\"temprature\": 1}}" M0_END,
     "3: models[1].parameters: unknown field 'temprature'", SB_ERR_FORMAT},
    {M0 ",\n  {\"name\": \"b\", \"path\": \"x\", \"aliases\": \"bee\"}" M0_END,
     "3: models[1].aliases: expected an array, got a string", SB_ERR_FORMAT},
    /* names */
    {M0 ",\n  {\"name\": \"b\", \"path\": \"x\", \"aliases\": [\"ok\",\n    \"b\\u0007d\"]}" M0_END,
     "4: models[1].aliases[1]: name contains a control character (byte 1)", SB_ERR_FORMAT},
    {M0 ",\n  {\"name\": \" b\", \"path\": \"x\"}" M0_END, "3: models[1].name: name ' b' starts or ends with a space",
     SB_ERR_FORMAT},
    {M0 ",\n  {\"name\": \"a\", \"path\": \"stories.gguf\"}" M0_END,
     "3: models[1].name: duplicate name 'a': already the name of model 'a' (line 2)", SB_ERR_FORMAT},
    {"{\"models\": [\n  {\"name\": \"a\", \"path\": \"stories.gguf\", \"aliases\": [\"x\"]},\n"
     "  {\"name\": \"b\", \"path\": \"stories.gguf\",\n   \"aliases\": [\"y\", \"x\"]}]}",
     "4: models[1].aliases[1]: duplicate name 'x': already an alias of model 'a' (line 2)", SB_ERR_FORMAT},
    {M0 "],\n \"routes\": [{\"name\": \"r\", \"split\": [{\"model\": \"a\"}]},\n  {\"name\": \"a\", \"split\": "
        "[{\"model\": "
        "\"a\"}]}]}",
     "4: routes[1].name: duplicate name 'a': already the name of model 'a' (line 2)", SB_ERR_FORMAT},
    /* references */
    {M0 "],\n \"fallback\": \"nobody\"}", "3: fallback: unknown model 'nobody'", SB_ERR_FORMAT},
    {M0 ",\n  {\"name\": \"b\", \"path\": \"stories.gguf\",\n   \"fallback\": \"c\"}" M0_END,
     "4: models[1].fallback: unknown model 'c'", SB_ERR_FORMAT},
    {M0 "],\n \"routes\": [{\"name\": \"r\", \"split\": [{\"model\": \"a\"},\n   {\"model\": \"zz\"}]}]}",
     "4: routes[0].split[1].model: unknown model 'zz'", SB_ERR_FORMAT},
    {M0 "],\n \"prompts\": [{\"id\": \"p\", \"template\": \"hi\",\n   \"model\": \"zz\"}]}",
     "4: prompts[0].model: unknown model 'zz'", SB_ERR_FORMAT},
    /* loops */
    {"{\"models\": [\n  {\"name\": \"a\", \"path\": \"stories.gguf\", \"fallback\": \"bee\"},\n"
     "  {\"name\": \"b\", \"path\": \"stories.gguf\", \"aliases\": [\"bee\"],\n   \"fallback\": \"a\"}]}",
     "4: models[1].fallback: fallback loop: a -> bee (alias of b) -> a", SB_ERR_FORMAT},
    {"{\"models\": [\n  {\"name\": \"a\", \"path\": \"stories.gguf\", \"aliases\": [\"self\"],\n   \"fallback\": "
     "\"self\"}]}",
     "3: models[0].fallback: fallback loop: a -> self (alias of a)", SB_ERR_FORMAT},
    {M0 "],\n \"routes\": [{\"name\": \"r1\", \"split\": [{\"model\": \"a\"}, {\"model\": \"r2\"}]},\n"
        "  {\"name\": \"r2\", \"split\": [\n    {\"model\": \"r1\"}]}]}",
     "5: routes[1].split[0].model: route loop: r1 -> r2 -> r1", SB_ERR_FORMAT},
    {"{\"models\": [\n  {\"name\": \"a\", \"path\": \"stories.gguf\", \"fallback\": \"r\"}],\n"
     " \"routes\": [{\"name\": \"r\", \"split\": [\n   {\"model\": \"a\"}]}]}",
     "4: routes[0].split[0].model: fallback and route loop: a -> r -> a", SB_ERR_FORMAT},
    /* routes */
    {M0 "],\n \"routes\": [{\"name\": \"r\",\n   \"split\": [{\"model\": \"a\", \"weight\": 0}]}]}",
     "4: routes[0].split: the weights of route 'r' sum to 0", SB_ERR_FORMAT},
    {M0 "],\n \"routes\": [{\"name\": \"r\", \"split\": [{\"model\": \"a\", \"weight\": 3},\n   {\"model\": \"a\", "
        "\"weight\": -1}]}]}",
     "4: routes[0].split[1].weight: negative weight -1", SB_ERR_FORMAT},
    {M0 "],\n \"routes\": [{\"name\": \"r\", \"split\": []}]}",
     "3: routes[0].split: route 'r' splits between no models", SB_ERR_FORMAT},
    {M0 "],\n \"routes\": [{\"name\": \"r\"}]}", "3: routes[0]: missing required field 'split' (route 'r')",
     SB_ERR_FORMAT},
    /* prompts */
    {M0 "],\n \"prompts\": [{\"id\": \"p\",\n   \"template\": \"Hi {{name\"}]}",
     "4: prompts[0].template: unterminated '{{' at offset 3", SB_ERR_FORMAT},
    {M0 "],\n \"prompts\": [{\"id\": \"p\"}]}", "3: prompts[0]: missing required field 'template' (prompt 'p')",
     SB_ERR_FORMAT},
    {M0 "],\n \"prompts\": [{\"id\": \"p\", \"template\": \"{{x}}\",\n   \"variables\": {\"y\": \"1\"}}]}",
     "4: prompts[0].variables: variable 'y' is not used by the template", SB_ERR_FORMAT},
    {M0 "],\n \"prompts\": [{\"id\": \"p\", \"template\": \"{{x}}\",\n   \"variables\": {\"x\": [1]}}]}",
     "4: prompts[0].variables: variable 'x': expected a string, number or boolean, got an array", SB_ERR_FORMAT},
    {M0 "],\n \"prompts\": [{\"id\": \"p\", \"version\": \"2\", \"template\": \"a\"},\n"
        "   {\"id\": \"p\", \"version\": 2, \"template\": \"b\"}]}",
     "4: prompts[1]: duplicate prompt 'p' version '2' (first at line 3)", SB_ERR_FORMAT},
    /* files */
    {M0 ",\n  {\"name\": \"b\",\n   \"path\": \"missing.gguf\"}" M0_END, "4: models[1].path: model file '",
     SB_ERR_NOT_FOUND},
    {M0 ",\n  {\"name\": \"b\", \"path\": \".\"}" M0_END, "3: models[1].path: model file '", SB_ERR_IO},
    {M0 ",\n  {\"name\": \"b\", \"path\": \"stories.gguf\",\n   \"chat_template\": \"none.jinja\"}" M0_END,
     "4: models[1].chat_template: chat template '", SB_ERR_NOT_FOUND},
};

static void test_bad_files(void **state) {
    (void)state;
    int failures = 0;
    for (size_t i = 0; i < SB_ARRAY_LEN(bad_cases); i++) {
        const bad_case *c = &bad_cases[i];
        const char *path = write_file("models.json", c->json);
        sb_regfile *rf = (sb_regfile *)1;
        sb_error err;
        sb_status st = sb_regfile_load(path, &rf, &err);
        char want[600];
        snprintf(want, sizeof(want), "%s:%s", path, c->want);
        if (st != c->status || strncmp(err.msg, want, strlen(want)) != 0 || err.status != st || rf) {
            print_error("case %zu: status %d, message\n  %s\nwanted %d,\n  %s\n", i, st, err.msg, c->status, want);
            failures++;
        }
    }
    assert_int_equal(failures, 0);
}

static void test_missing_file_names_resolved_path(void **state) {
    (void)state;
    sb_regfile *rf;
    sb_error err;
    const char *path = write_file("models.json", "{\"models\": [{\"name\": \"b\", \"path\": \"sub/missing.gguf\"}]}");
    assert_int_equal(sb_regfile_load(path, &rf, &err), SB_ERR_NOT_FOUND);
    char *real = realpath(dir(), NULL), want[600];
    snprintf(want, sizeof(want), "model file '%s/sub/missing.gguf' of model 'b': No such file or directory", real);
    free(real);
    assert_non_null(strstr(err.msg, want));
    /* absolute paths stay as written */
    const char *abs = "{\"models\": [{\"name\": \"b\", \"path\": \"/nonexistent/m.gguf\"}]}";
    assert_int_equal(sb_regfile_parse(abs, strlen(abs), "mem.json", "/tmp", &rf, &err), SB_ERR_NOT_FOUND);
    assert_non_null(strstr(err.msg, "mem.json:1: models[0].path: model file '/nonexistent/m.gguf'"));
    /* the registry file itself */
    assert_int_equal(sb_regfile_load("/nonexistent/models.json", &rf, &err), SB_ERR_NOT_FOUND);
    assert_string_equal(err.msg, "cannot open registry file '/nonexistent/models.json': No such file or directory");
}

static void test_positions(void **state) {
    (void)state;
    sb_regfile *rf;
    sb_error err;
    /* CRLF line ends, a byte-order mark, tabs and multi-byte characters before the error */
    const char text[] = "\xEF\xBB\xBF{\r\n\t\"models\": [\r\n\t{\"name\": \"caf\xC3\xA9\", \"path\": 1}]}";
    assert_int_equal(sb_regfile_parse(text, sizeof(text) - 1, "crlf.json", dir(), &rf, &err), SB_ERR_FORMAT);
    assert_string_equal(err.msg, "crlf.json:3: models[0].path: expected a string, got a number");
    const char syntax[] = "{\r\n\t\"models\": [\r\n\t{\"name\": \"caf\xC3\xA9\" \"path\": 1}]}";
    assert_int_equal(sb_regfile_parse(syntax, sizeof(syntax) - 1, "crlf.json", dir(), &rf, &err), SB_ERR_FORMAT);
    assert_string_equal(err.msg,
                        "crlf.json:3:18: JSON syntax error: unexpected text at '\"path\": 1}]}' (missing ','?)");
    /* a NUL byte is named where it is, not taken for the end */
    const char nul[] = "{\"models\": [\n  \0]}";
    assert_int_equal(sb_regfile_parse(nul, sizeof(nul) - 1, "nul.json", dir(), &rf, &err), SB_ERR_FORMAT);
    assert_string_equal(err.msg, "nul.json:2:3: NUL byte in a JSON file");
    /* the lexer finds every value cJSON does, in the same order */
    cJSON *root = cJSON_Parse(full_json);
    size_t offsets[256], n = sb__regfile_scan(full_json, strlen(full_json), offsets, 256);
    size_t count = 0;
    cJSON *stack[64] = {root};
    size_t depth = 1;
    while (depth) {
        cJSON *it = stack[--depth];
        count++;
        for (cJSON *c = it->next; c && depth < 64; c = NULL)
            stack[depth++] = c;
        if (it->child && depth < 64)
            stack[depth++] = it->child;
    }
    assert_int_equal(n, count);
    assert_int_equal(offsets[0], 0);
    assert_memory_equal(full_json + offsets[1], "\"fallback\"", 10);
    cJSON_Delete(root);
}

static void test_resolve(void **state) {
    (void)state;
    sb_regfile *rf;
    sb_error err;
    assert_int_equal(sb_regfile_load(write_file("full.json", full_json), &rf, &err), SB_OK);
    const sb_regfile_model *m;
    const sb_regfile_route *r;
    assert_int_equal(sb_regfile_resolve(rf, "stories", &m, &r), SB_REGFILE_MODEL);
    assert_ptr_equal(m, &rf->models[0]);
    assert_null(r);
    assert_int_equal(sb_regfile_resolve(rf, "small", &m, &r), SB_REGFILE_MODEL);
    assert_ptr_equal(m, &rf->models[0]);
    assert_int_equal(sb_regfile_resolve(rf, "stories-q8", &m, NULL), SB_REGFILE_MODEL);
    assert_ptr_equal(m, &rf->models[1]);
    assert_int_equal(sb_regfile_resolve(rf, "story-ab", &m, &r), SB_REGFILE_ROUTE);
    assert_ptr_equal(r, &rf->routes[0]);
    assert_null(m);
    assert_int_equal(sb_regfile_resolve(rf, "Stories", &m, &r), SB_REGFILE_NONE); /* names are exact */
    assert_null(m);
    assert_null(r);
    assert_int_equal(sb_regfile_resolve(rf, "", NULL, NULL), SB_REGFILE_NONE);
    sb_regfile_free(rf);
}

static void test_change_detection(void **state) {
    (void)state;
    sb_regfile *a, *b;
    sb_error err;
    const char *base = "{\"models\": [{\"name\": \"m\", \"path\": \"stories.gguf\", \"context\": %d, "
                       "\"parameters\": {\"temperature\": %s}, \"aliases\": [%s]}]}";
    char text[400];
    snprintf(text, sizeof(text), base, 256, "0.5", "");
    assert_int_equal(sb_regfile_parse(text, strlen(text), "a", dir(), &a, &err), SB_OK);
    assert_int_equal(sb_regfile_parse(text, strlen(text), "b", dir(), &b, &err), SB_OK);
    assert_true(sb_regfile_equal_model(&a->models[0], &b->models[0]));
    assert_true(sb_regfile_model_same_load(&a->models[0], &b->models[0]));
    sb_regfile_free(b);
    /* sampling defaults and aliases are read per request: no reload */
    snprintf(text, sizeof(text), base, 256, "0.7", "\"x\"");
    assert_int_equal(sb_regfile_parse(text, strlen(text), "b", dir(), &b, &err), SB_OK);
    assert_false(sb_regfile_equal_model(&a->models[0], &b->models[0]));
    assert_true(sb_regfile_model_same_load(&a->models[0], &b->models[0]));
    sb_regfile_free(b);
    /* a different context is a different instance */
    snprintf(text, sizeof(text), base, 512, "0.5", "");
    assert_int_equal(sb_regfile_parse(text, strlen(text), "b", dir(), &b, &err), SB_OK);
    assert_false(sb_regfile_model_same_load(&a->models[0], &b->models[0]));
    sb_regfile_free(b);
    /* so is the same path holding another file (rewritten in place: size and time change) */
    snprintf(text, sizeof(text), base, 256, "0.5", "");
    write_file("stories.gguf", "xy");
    assert_int_equal(sb_regfile_parse(text, strlen(text), "b", dir(), &b, &err), SB_OK);
    assert_false(sb_regfile_model_same_load(&a->models[0], &b->models[0]));
    assert_false(sb_regfile_equal_model(&a->models[0], &b->models[0]));
    write_file("stories.gguf", "x");
    sb_regfile_free(b);
    sb_regfile_free(a);
}

static void test_durations(void **state) {
    (void)state;
    static const struct {
        const char *text;
        int64_t ms;
    } good[] = {{"0", 0},
                {"-1", SB_REGFILE_FOREVER},
                {"-5m", SB_REGFILE_FOREVER},
                {"30s", 30000},
                {"5m", 300000},
                {"1h", 3600000},
                {"1h30m", 5400000},
                {"1.5s", 1500},
                {"250ms", 250},
                {"300", 300000},
                {"2.5", 2500},
                {"1m30s", 90000},
                {".5h", 1800000},
                {"-0", 0}};
    static const char *const bad[] = {"",     "-",     "s",   "5x",    "5 m",
                                      " 5m",  "5m ",   "1e3", "inf",   "nan",
                                      "0x10", "1h-5m", "5mm", "1..5s", "99999999999999999999h",
                                      "+5m"};
    for (size_t i = 0; i < SB_ARRAY_LEN(good); i++) {
        int64_t ms = 12345;
        if (!sb_regfile_parse_duration(good[i].text, &ms) || ms != good[i].ms)
            fail_msg("'%s' gave %lld, wanted %lld", good[i].text, (long long)ms, (long long)good[i].ms);
    }
    for (size_t i = 0; i < SB_ARRAY_LEN(bad); i++) {
        int64_t ms;
        if (sb_regfile_parse_duration(bad[i], &ms))
            fail_msg("'%s' was accepted as %lld ms", bad[i], (long long)ms);
    }
}

static void test_params_apply(void **state) {
    (void)state;
    sb_regfile_params p = {.set = SB_PARAM_TEMPERATURE | SB_PARAM_SEED, .temperature = 0.25f, .top_k = 99, .seed = 5};
    sb_sampler_params s = sb_sampler_default_params();
    int32_t top_k = s.top_k;
    sb_regfile_params_apply(&p, &s);
    assert_true(s.temperature == 0.25f);
    assert_int_equal(s.seed, 5);
    assert_int_equal(s.top_k, top_k); /* not set: untouched */
}

static void test_from_dir(void **state) {
    (void)state;
    char d[400], p[500];
    snprintf(d, sizeof(d), "%s/models-dir", sb_test_tmpdir());
    mkdir(d, 0700);
    const char *files[] = {"b.gguf", "a.gguf", ".partial.gguf", "notes.txt", ".gguf"};
    for (size_t i = 0; i < SB_ARRAY_LEN(files); i++) {
        snprintf(p, sizeof(p), "%s/%s", d, files[i]);
        fclose(fopen(p, "w"));
    }
    snprintf(p, sizeof(p), "%s/sub.gguf", d);
    mkdir(p, 0700);
    sb_regfile *rf;
    sb_error err;
    assert_int_equal(sb_regfile_from_dir(d, &rf, &err), SB_OK);
    assert_int_equal(rf->n_models, 2);
    assert_string_equal(rf->models[0].name, "a");
    assert_string_equal(rf->models[1].name, "b");
    snprintf(p, sizeof(p), "%s/a.gguf", d);
    assert_string_equal(rf->models[0].path, p);
    assert_string_equal(rf->models[0].device, "cpu");
    assert_null(rf->path);
    const sb_regfile_model *m;
    assert_int_equal(sb_regfile_resolve(rf, "b", &m, NULL), SB_REGFILE_MODEL);
    assert_true(sb_prompt_find(rf, "story", NULL) != NULL);
    sb_regfile_free(rf);
    snprintf(p, sizeof(p), "%s/sub.gguf", d);
    assert_int_equal(sb_regfile_from_dir(p, &rf, &err), SB_OK); /* empty */
    assert_int_equal(rf->n_models, 0);
    sb_regfile_free(rf);
    assert_int_equal(sb_regfile_from_dir("/nonexistent-dir", &rf, &err), SB_ERR_NOT_FOUND);
    assert_string_equal(err.msg, "cannot read model directory '/nonexistent-dir': No such file or directory");
    assert_null(rf);
}

static void test_one(void **state) {
    (void)state;
    sb_regfile *rf;
    sb_error err;
    char p[400];
    snprintf(p, sizeof(p), "%s/stories-q8.gguf", dir());
    assert_int_equal(sb_regfile_one(p, NULL, &rf, &err), SB_OK);
    assert_int_equal(rf->n_models, 1);
    assert_string_equal(rf->models[0].name, "stories-q8");
    assert_string_equal(rf->models[0].path, p);
    sb_regfile_free(rf);
    assert_int_equal(sb_regfile_one(p, "alias", &rf, &err), SB_OK);
    assert_string_equal(rf->models[0].name, "alias");
    sb_regfile_free(rf);
    assert_int_equal(sb_regfile_one("/nonexistent/x.gguf", NULL, &rf, &err), SB_ERR_NOT_FOUND);
    assert_string_equal(err.msg, "model file '/nonexistent/x.gguf': No such file or directory");
}

/* An allocator that fails the nth allocation (and every one after it). */
static size_t fail_at_n, n_allocs;
static void *failing_malloc(size_t size, void *user) { return ++n_allocs >= fail_at_n ? NULL : malloc(size); }
static void *failing_realloc(void *ptr, size_t size, void *user) {
    return ++n_allocs >= fail_at_n ? NULL : realloc(ptr, size);
}
static void plain_free(void *ptr, void *user) { free(ptr); }

static void test_allocation_failures(void **state) {
    (void)state;
    const char *path = write_file("full.json", full_json);
    const sb_allocator failing = {failing_malloc, failing_realloc, plain_free, NULL};
    for (fail_at_n = 1;; fail_at_n++) {
        n_allocs = 0;
        sb_set_allocator(&failing);
        sb_regfile *rf;
        sb_error err;
        sb_status st = sb_regfile_load(path, &rf, &err);
        sb_set_allocator(NULL);
        if (st == SB_OK) {
            sb_regfile_free(rf);
            break;
        }
        if (st != SB_ERR_NOMEM || !strstr(err.msg, "out of memory"))
            fail_msg("allocation %zu failing gave %d: %s", fail_at_n, st, err.msg);
        assert_null(rf);
    }
    assert_true(fail_at_n > 20); /* the loop did reach the deep allocations */
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_full_shape),
        cmocka_unit_test(test_minimal_shape),
        cmocka_unit_test(test_bad_files),
        cmocka_unit_test(test_missing_file_names_resolved_path),
        cmocka_unit_test(test_positions),
        cmocka_unit_test(test_resolve),
        cmocka_unit_test(test_change_detection),
        cmocka_unit_test(test_durations),
        cmocka_unit_test(test_params_apply),
        cmocka_unit_test(test_from_dir),
        cmocka_unit_test(test_one),
        cmocka_unit_test(test_allocation_failures),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
