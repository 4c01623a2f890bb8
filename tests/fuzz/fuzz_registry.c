/*
 * fuzz_registry.c - libFuzzer harness for the registry file reader
 * (src/registry/regfile.c) and the prompt templates (prompts.c).
 *
 * Each input is read as a registry file whose relative paths resolve in a
 * scratch directory holding one model file, "m.gguf" (seeds in
 * corpus/registry/ name it, so inputs that pass every check reach the end).
 * Beyond "no crash, no leak, no hang", it aborts when an invariant breaks:
 *  - the position lexer and cJSON disagree on where the values of a valid
 *    JSON text start (every message's line number rests on this);
 *  - a registry that was accepted does not resolve its own names, or a
 *    model does not compare equal to itself;
 *  - an accepted prompt's template fails its syntax check.
 * The input is also tried as a prompt template and as a duration.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "base/base.h"
#include "registry/prompts.h"
#include "registry/regfile.h"

static char scratch[64], model_path[128];

static void remove_scratch(void) {
    unlink(model_path);
    rmdir(scratch);
}

static void make_scratch(void) {
    snprintf(scratch, sizeof(scratch), "/tmp/fuzz-registry-XXXXXX");
    if (!mkdtemp(scratch)) {
        perror("fuzz_registry: cannot create its scratch directory /tmp/fuzz-registry-XXXXXX");
        abort();
    }
    snprintf(model_path, sizeof(model_path), "%s/m.gguf", scratch);
    FILE *f = fopen(model_path, "w");
    if (f)
        fclose(f);
    atexit(remove_scratch);
}

static size_t count_items(const cJSON *item) {
    size_t n = 1;
    for (const cJSON *c = item->child; c; c = c->next)
        n += count_items(c);
    return n;
}

/* The first character each item's recorded offset must point at. */
static void check_offsets(const cJSON *item, const char *text, const size_t *offsets, size_t *k) {
    char c = text[offsets[(*k)++]];
    bool ok;
    if (item->string)
        ok = c == '"'; /* a member: where its name starts */
    else if (cJSON_IsObject(item))
        ok = c == '{';
    else if (cJSON_IsArray(item))
        ok = c == '[';
    else if (cJSON_IsString(item))
        ok = c == '"';
    else if (cJSON_IsNumber(item))
        ok = c == '-' || (c >= '0' && c <= '9');
    else
        ok = c == 't' || c == 'f' || c == 'n';
    if (!ok)
        abort();
    for (const cJSON *ch = item->child; ch; ch = ch->next)
        check_offsets(ch, text, offsets, k);
}

static void check_lexer(char *text, size_t len) {
    if (memchr(text, '\0', len))
        return;
    if (len >= 3 && memcmp(text, "\xEF\xBB\xBF", 3) == 0) /* cJSON skips a byte-order mark; the reader blanks it */
        memset(text, ' ', 3);
    cJSON *root = cJSON_ParseWithOpts(text, NULL, true);
    if (!root)
        return;
    size_t n = count_items(root);
    size_t *offsets = malloc(n * sizeof(size_t));
    if (offsets) {
        if (sb__regfile_scan(text, len, offsets, n) != n)
            abort();
        size_t k = 0;
        check_offsets(root, text, offsets, &k);
        free(offsets);
    }
    cJSON_Delete(root);
}

static void check_accepted(const sb_regfile *rf) {
    for (size_t i = 0; i < rf->n_models; i++) {
        const sb_regfile_model *m = &rf->models[i], *got;
        if (sb_regfile_resolve(rf, m->name, &got, NULL) != SB_REGFILE_MODEL || got != m)
            abort();
        for (size_t a = 0; a < m->n_aliases; a++)
            if (sb_regfile_resolve(rf, m->aliases[a], &got, NULL) != SB_REGFILE_MODEL || got != m)
                abort();
        if (!sb_regfile_equal_model(m, m) || !sb_regfile_model_same_load(m, m))
            abort();
    }
    for (size_t i = 0; i < rf->n_routes; i++) {
        const sb_regfile_route *r;
        if (sb_regfile_resolve(rf, rf->routes[i].name, NULL, &r) != SB_REGFILE_ROUTE || r != &rf->routes[i])
            abort();
    }
    for (size_t i = 0; i < rf->n_prompts; i++) {
        const sb_regfile_prompt *p = &rf->prompts[i];
        size_t off;
        sb_error err;
        if (sb_prompt_check(p->template_text, &off, &err) != SB_OK)
            abort();
        char *out;
        if (sb_prompt_render(p, p->variables, &out, &err) == SB_OK)
            sb_free(out);
        if (sb_prompt_find(rf, p->id, p->version) == NULL)
            abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!scratch[0])
        make_scratch();
    char *text = malloc(size + 1);
    if (!text)
        return 0;
    memcpy(text, data, size);
    text[size] = '\0';

    char *copy = malloc(size + 1);
    if (copy) {
        memcpy(copy, text, size + 1);
        check_lexer(copy, size);
        free(copy);
    }

    sb_regfile *rf;
    sb_error err;
    if (sb_regfile_parse(text, size, "fuzz.json", scratch, &rf, &err) == SB_OK) {
        check_accepted(rf);
        sb_regfile_free(rf);
    } else if (rf != NULL || err.msg[0] == '\0') {
        abort();
    }

    /* the bytes as a template, with no variables and with a few */
    sb_regfile_prompt p = {.id = "fuzz", .version = "1", .template_text = text};
    cJSON *vars = cJSON_Parse("{\"a\": \"x\", \"topic\": 1}");
    char *out;
    if (sb_prompt_render(&p, NULL, &out, &err) == SB_OK)
        sb_free(out);
    if (sb_prompt_render(&p, vars, &out, &err) == SB_OK)
        sb_free(out);
    cJSON_Delete(vars);

    int64_t ms;
    sb_regfile_parse_duration(text, &ms);
    free(text);
    return 0;
}
