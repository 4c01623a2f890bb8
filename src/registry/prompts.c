/*
 * prompts.c - rendering prompt templates, finding prompts by id and version,
 * and the built-in library (prompts.h has the syntax). The built-ins are
 * written in the registry file's own format and read by its code
 * (regfile.c), so they pass the same checks a user's prompts do.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "registry/prompts.h"

const char sb_prompt_builtin_json[] =
    "{\"prompts\": [\n"
    " {\"id\": \"story\", \"version\": \"1\",\n"
    "  \"description\": \"A short story with a beginning, a middle and an end.\",\n"
    "  \"template\": \"Write a short story about {{topic}} for {{audience}}. The tone is {{tone}}. Keep it under "
    "{{length}} words, give the main character a name and a wish, and end with the wish granted or lost.\",\n"
    "  \"parameters\": {\"temperature\": 0.9, \"top_p\": 0.95, \"min_p\": 0.05, \"repeat_penalty\": 1.1, "
    "\"max_tokens\": 700},\n"
    "  \"variables\": {\"topic\": \"a lighthouse keeper who finds a message in a bottle\", \"audience\": \"readers of "
    "all ages\", \"tone\": \"warm\", \"length\": 400}},\n"
    " {\"id\": \"marketing-copy\", \"version\": \"1\",\n"
    "  \"description\": \"A headline, two short paragraphs and a call to action for a product.\",\n"
    "  \"template\": \"Write marketing copy for {{product}}, aimed at {{audience}}. Lead with its main benefit: "
    "{{benefit}}. The voice is {{tone}}; no exaggerated claims. Give a headline of at most ten words, two short "
    "paragraphs, and end with this call to action: {{call_to_action}}\",\n"
    "  \"parameters\": {\"temperature\": 0.8, \"top_p\": 0.9, \"presence_penalty\": 0.3, \"max_tokens\": 400},\n"
    "  \"variables\": {\"audience\": \"busy professionals\", \"tone\": \"confident and friendly\", "
    "\"call_to_action\": \"Try it free today.\"}},\n"
    " {\"id\": \"code\", \"version\": \"1\",\n"
    "  \"description\": \"A complete, runnable piece of code for a task, then a short explanation.\",\n"
    "  \"template\": \"Write {{language}} code that {{task}}. Answer with one complete, runnable code block, then "
    "one paragraph explaining how it works. Follow the language's usual conventions, handle errors, and comment "
    "only what the code does not say itself.\",\n"
    "  \"parameters\": {\"temperature\": 0.2, \"top_p\": 0.95, \"max_tokens\": 1024},\n"
    "  \"variables\": {\"language\": \"Python\"}},\n"
    " {\"id\": \"summarize\", \"version\": \"1\",\n"
    "  \"description\": \"A summary of a text, as long and for whom the caller says.\",\n"
    "  \"template\": \"Summarize the text below as {{length}} for {{audience}}. Keep names, numbers and "
    "conclusions; leave out examples and repetition; add nothing the text does not say.\\n\\nText:\\n{{text}}\\n\\n"
    "Summary:\",\n"
    "  \"parameters\": {\"temperature\": 0.3, \"top_p\": 0.9, \"max_tokens\": 300},\n"
    "  \"variables\": {\"length\": \"three bullet points\", \"audience\": \"a reader in a hurry\"}}\n"
    "]}\n";

/* ---- template syntax ------------------------------------------------------ */

/* A run of literal text, or a placeholder's name; both point into the template. */
typedef struct piece {
    bool var;
    size_t start, len;
    size_t offset; /* of the piece's first byte in the template ("{{" for a placeholder) */
} piece;

static bool name_char(char c, bool first) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' ||
           (!first && ((c >= '0' && c <= '9') || c == '-' || c == '.'));
}

/* The next piece from *pos: 1, or 0 at the end, or -1 with err set (the
 * offset in *bad). */
static int next_piece(const char *t, size_t *pos, piece *p, size_t *bad, sb_error *err) {
    size_t i = *pos;
    if (!t[i])
        return 0;
    p->offset = i;
    if (strncmp(t + i, "{{{{", 4) == 0) { /* the escape: a literal "{{" */
        *p = (piece){false, i, 2, i};
        *pos = i + 4;
        return 1;
    }
    if (strncmp(t + i, "{{", 2) != 0) {
        const char *open = strstr(t + i, "{{");
        size_t end = open ? (size_t)(open - t) : i + strlen(t + i);
        *p = (piece){false, i, end - i, i};
        *pos = end;
        return 1;
    }
    const char *close = strstr(t + i + 2, "}}");
    if (!close) {
        *bad = i;
        sb_fail(err, SB_ERR_INVALID_ARG, "unterminated '{{' at offset %zu (write '{{{{' for a literal '{{')", i);
        return -1;
    }
    size_t s = i + 2, e = (size_t)(close - t);
    while (s < e && (t[s] == ' ' || t[s] == '\t'))
        s++;
    while (e > s && (t[e - 1] == ' ' || t[e - 1] == '\t'))
        e--;
    bool ok = s < e;
    for (size_t k = s; k < e && ok; k++)
        ok = name_char(t[k], k == s);
    if (!ok) {
        *bad = i;
        int n = (int)SB_MIN((size_t)(close - t) + 2 - i, 64);
        sb_fail(err, SB_ERR_INVALID_ARG,
                "bad placeholder '%.*s' at offset %zu (a name is letters, digits, '_', '-' and '.'; write '{{{{' for "
                "a literal '{{')",
                n, t + i, i);
        return -1;
    }
    *p = (piece){true, s, e - s, i};
    *pos = (size_t)(close - t) + 2;
    return 1;
}

sb_status sb_prompt_check(const char *template_text, size_t *offset, sb_error *err) {
    size_t pos = 0;
    piece p;
    int r;
    while ((r = next_piece(template_text, &pos, &p, offset, err)) > 0)
        ;
    return r < 0 ? SB_ERR_INVALID_ARG : SB_OK;
}

static bool piece_is(const char *t, const piece *p, const char *name) {
    return p->var && strlen(name) == p->len && memcmp(t + p->start, name, p->len) == 0;
}

bool sb_prompt_uses(const char *template_text, const char *name) {
    size_t pos = 0, bad;
    piece p;
    while (next_piece(template_text, &pos, &p, &bad, NULL) > 0)
        if (piece_is(template_text, &p, name))
            return true;
    return false;
}

/* ---- rendering ------------------------------------------------------------ */

/* Numbers as JSON would write them: integers without a fraction, others
 * with the fewest digits that read back the same. */
static void format_number(double x, char *buf, size_t cap) {
    if (x == floor(x) && fabs(x) < 1e15) {
        snprintf(buf, cap, "%.0f", x);
        return;
    }
    snprintf(buf, cap, "%.15g", x);
    if (strtod(buf, NULL) != x)
        snprintf(buf, cap, "%.17g", x);
}

/* The text of a variable's value (buf holds formatted numbers): a string,
 * number or boolean, or OpenAI's {"type": "input_text", "text": ...}; NULL
 * for anything else. */
static const char *value_text(const cJSON *v, char *buf, size_t cap) {
    if (cJSON_IsString(v))
        return v->valuestring;
    if (cJSON_IsBool(v))
        return cJSON_IsTrue(v) ? "true" : "false";
    if (cJSON_IsNumber(v)) {
        format_number(v->valuedouble, buf, cap);
        return buf;
    }
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(v, "type"),
                *text = cJSON_GetObjectItemCaseSensitive(v, "text");
    if (cJSON_IsObject(v) && cJSON_IsString(type) && strcmp(type->valuestring, "input_text") == 0 &&
        cJSON_IsString(text))
        return text->valuestring;
    return NULL;
}

/* The member of obj (NULL allowed) named by the len bytes at name. */
static const cJSON *find_var(const cJSON *obj, const char *name, size_t len) {
    for (const cJSON *c = obj ? obj->child : NULL; c; c = c->next)
        if (strlen(c->string) == len && memcmp(c->string, name, len) == 0)
            return c;
    return NULL;
}

/* "a, b, c": the variables the template uses, for messages. */
static void list_variables(const char *t, char *buf, size_t cap) {
    size_t pos = 0, bad, len = 0;
    piece p;
    buf[0] = '\0';
    while (next_piece(t, &pos, &p, &bad, NULL) > 0 && len < cap) {
        if (!p.var)
            continue;
        bool seen = false; /* once each, however often it is used */
        size_t q = 0;
        piece o;
        while (!seen && q < p.offset && next_piece(t, &q, &o, &bad, NULL) > 0)
            seen = o.var && o.len == p.len && memcmp(t + o.start, t + p.start, p.len) == 0 && o.offset < p.offset;
        if (!seen)
            len += (size_t)snprintf(buf + len, cap - len, "%s%.*s", len ? ", " : "", (int)p.len, t + p.start);
    }
    if (!buf[0])
        snprintf(buf, cap, "none");
}

/* The request's variables: an object of values of a kind value_text takes,
 * each used by the template. */
static sb_status check_request(const sb_regfile_prompt *p, const cJSON *variables, sb_error *err) {
    if (!variables)
        return SB_OK;
    if (!cJSON_IsObject(variables))
        return sb_fail(err, SB_ERR_INVALID_ARG, "prompt '%s' version '%s': variables must be an object", p->id,
                       p->version);
    for (const cJSON *v = variables->child; v; v = v->next) {
        char num[64];
        if (!value_text(v, num, sizeof(num)))
            return sb_fail(err, SB_ERR_INVALID_ARG,
                           "prompt '%s' version '%s': variable '%s' must be a string, number, boolean or "
                           "{\"type\": \"input_text\", \"text\": ...}",
                           p->id, p->version, v->string);
        if (!sb_prompt_uses(p->template_text, v->string)) {
            char used[256];
            list_variables(p->template_text, used, sizeof(used));
            return sb_fail(err, SB_ERR_INVALID_ARG,
                           "prompt '%s' version '%s': variable '%s' is not used by the template (it uses: %s)", p->id,
                           p->version, v->string, used);
        }
    }
    return SB_OK;
}

/* One pass of rendering: the bytes into buf (NULL: only counted) and their
 * count into *len. */
static sb_status expand(const sb_regfile_prompt *p, const cJSON *variables, char *buf, size_t *len, sb_error *err) {
    const char *t = p->template_text;
    size_t pos = 0, bad;
    piece pc;
    int r;
    *len = 0;
    while ((r = next_piece(t, &pos, &pc, &bad, err)) > 0) {
        const char *s = t + pc.start;
        size_t n = pc.len;
        char num[64];
        if (pc.var) {
            const cJSON *v = find_var(variables, s, n);
            if (!v)
                v = find_var(p->variables, s, n);
            if (!v)
                return sb_fail(err, SB_ERR_INVALID_ARG,
                               "prompt '%s' version '%s': variable '%.*s' (at offset %zu) has no value and no default",
                               p->id, p->version, (int)n, s, pc.offset);
            if (!(s = value_text(v, num, sizeof(num)))) /* a default of a prompt built in code */
                return sb_fail(err, SB_ERR_INVALID_ARG, "prompt '%s' version '%s': variable '%.*s' has no text", p->id,
                               p->version, (int)pc.len, t + pc.start);
            n = strlen(s);
        }
        if (buf)
            memcpy(buf + *len, s, n);
        *len += n;
    }
    return r < 0 ? SB_ERR_INVALID_ARG : SB_OK;
}

sb_status sb_prompt_render(const sb_regfile_prompt *p, const cJSON *variables, char **out, sb_error *err) {
    *out = NULL;
    size_t bad, len;
    sb_error terr;
    if (sb_prompt_check(p->template_text, &bad, &terr) != SB_OK)
        return sb_fail(err, SB_ERR_INVALID_ARG, "prompt '%s' version '%s': %s", p->id, p->version, terr.msg);
    sb_status st = check_request(p, variables, err);
    if (st || (st = expand(p, variables, NULL, &len, err)))
        return st;
    char *buf = sb_malloc(len + 1);
    if (!buf)
        return sb_fail(err, SB_ERR_NOMEM, "prompt '%s': out of memory rendering %zu bytes", p->id, len);
    if ((st = expand(p, variables, buf, &len, err))) {
        sb_free(buf);
        return st;
    }
    buf[len] = '\0';
    *out = buf;
    return SB_OK;
}

/* ---- finding -------------------------------------------------------------- */

static bool as_number(const char *s, double *out) {
    if (!((*s >= '0' && *s <= '9') || *s == '-' || *s == '.'))
        return false;
    char *end;
    *out = strtod(s, &end);
    return *end == '\0' && isfinite(*out);
}

int sb_prompt_version_cmp(const char *a, const char *b) {
    double x, y;
    if (as_number(a, &x) && as_number(b, &y))
        return (x > y) - (x < y);
    return strcmp(a, b);
}

const sb_regfile_prompt *sb_prompt_find(const sb_regfile *rf, const char *id, const char *version) {
    const sb_regfile_prompt *best = NULL;
    for (size_t i = 0; i < rf->n_prompts; i++) {
        const sb_regfile_prompt *p = &rf->prompts[i];
        if (strcmp(p->id, id) != 0)
            continue;
        if (version && sb_prompt_version_cmp(p->version, version) == 0)
            return p;
        if (!version && (!best || sb_prompt_version_cmp(p->version, best->version) > 0))
            best = p;
    }
    return best;
}

sb_status sb_prompt_lookup(const sb_regfile *rf, const char *id, const char *version, const sb_regfile_prompt **out,
                           sb_error *err) {
    if ((*out = sb_prompt_find(rf, id, version)))
        return SB_OK;
    char known[300];
    size_t len = 0;
    bool id_known = sb_prompt_find(rf, id, NULL) != NULL;
    known[0] = '\0';
    for (size_t i = 0; i < rf->n_prompts && len < sizeof(known); i++) {
        const sb_regfile_prompt *p = &rf->prompts[i];
        bool listed = false; /* each id once */
        for (size_t j = 0; j < i && !id_known && !listed; j++)
            listed = strcmp(rf->prompts[j].id, p->id) == 0;
        if (!listed && (!id_known || strcmp(p->id, id) == 0))
            len += (size_t)snprintf(known + len, sizeof(known) - len, "%s%s", len ? ", " : "",
                                    id_known ? p->version : p->id);
    }
    if (id_known)
        return sb_fail(err, SB_ERR_NOT_FOUND, "prompt '%s' has no version '%s' (versions: %s)", id, version, known);
    return sb_fail(err, SB_ERR_NOT_FOUND, "no prompt '%s' (prompts: %s)", id, len ? known : "none");
}
