/*
 * regfile.c - reads and validates the registry file (regfile.h has the
 * format). cJSON parses the values; it keeps no positions, so one lexing
 * pass over the same text lists where each value starts, in document order,
 * which is the order of a pre-order walk of cJSON's tree (cJSON keeps
 * members in order, duplicates included). Zipping the two gives every item
 * its offset, and an offset its line and column, for the messages.
 *
 * Validation runs in phases - shapes and values entry by entry, then the
 * names (duplicates, references, loops), then the files on disk - and stops
 * at the first problem; nothing is kept from a file that fails.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/base.h"
#include "registry/prompts.h"
#include "registry/regfile.h"

#define MAX_FILE_BYTES (16u << 20)
#define MAX_NAME_BYTES 256
#define MAX_ENTRIES 4096 /* models, routes or prompts in one file */
#define MAX_LIST 256     /* aliases of a model, arms of a route */
#define MAX_STOP 16
#define MAX_CONTEXT (1 << 24)
#define MAX_PARALLEL 1024
#define MAX_DURATION_MS 1e15 /* ~31,000 years: anything longer is a typo */

/* ---- value positions ---------------------------------------------------- */

size_t sb__regfile_scan(const char *t, size_t len, size_t *offsets, size_t cap) {
    size_t n = 0, i = 0, key = SIZE_MAX;
    while (i < len) {
        unsigned char c = (unsigned char)t[i];
        /* cJSON takes every byte <= ' ' for white space */
        if (c <= ' ' || c == ',' || c == ':' || c == '}' || c == ']') {
            i++;
            continue;
        }
        size_t start = i;
        if (c == '"') {
            for (i++; i < len && t[i] != '"'; i++)
                if (t[i] == '\\')
                    i++;
            i++;
            size_t j = i;
            while (j < len && (unsigned char)t[j] <= ' ')
                j++;
            if (j < len && t[j] == ':') { /* a member's name: the member is recorded where it starts */
                key = start;
                i = j + 1;
                continue;
            }
        } else if (c == '{' || c == '[') {
            i++;
        } else { /* number or literal */
            while (i < len && (unsigned char)t[i] > ' ' && !strchr(",:]}", t[i]))
                i++;
        }
        if (n < cap)
            offsets[n] = key != SIZE_MAX ? key : start;
        n++;
        key = SIZE_MAX;
    }
    return n;
}

typedef struct pos_entry {
    const cJSON *item;
    size_t offset; /* of the member's name for an object member, else of the value */
} pos_entry;

typedef struct reader {
    const char *text; /* the whole file, NUL-terminated */
    size_t len;
    const char *name; /* what messages call the file */
    const char *dir;  /* relative paths resolve against it */
    size_t *newlines; /* offsets of every '\n', ascending */
    size_t n_newlines;
    pos_entry *pos; /* sorted by item */
    size_t n_pos;
    sb_error *err;
    sb_regfile *rf;
    const cJSON *root;
    const cJSON **model_obj; /* the JSON object of each rf->models[i] */
    const cJSON **route_obj;
    const cJSON **prompt_obj;
} reader;

static void offset_line_col(const reader *r, size_t off, int *line, int *col) {
    size_t lo = 0, hi = r->n_newlines; /* count of newlines before off */
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (r->newlines[mid] < off)
            lo = mid + 1;
        else
            hi = mid;
    }
    size_t line_start = lo ? r->newlines[lo - 1] + 1 : 0;
    int c = 1;
    for (size_t i = line_start; i < off && i < r->len; i++)
        c += ((unsigned char)r->text[i] & 0xC0) != 0x80; /* UTF-8 characters, not bytes */
    *line = (int)SB_MIN(lo + 1, (size_t)INT_MAX);
    *col = c;
}

static int cmp_pos(const void *a, const void *b) {
    uintptr_t x = (uintptr_t)((const pos_entry *)a)->item, y = (uintptr_t)((const pos_entry *)b)->item;
    return x < y ? -1 : x > y;
}

static void collect_items(const cJSON *item, const size_t *offsets, size_t n, size_t *k, pos_entry *out) {
    if (*k < n) {
        out[*k].item = item;
        out[*k].offset = offsets[*k];
    }
    ++*k;
    for (const cJSON *c = item->child; c; c = c->next)
        collect_items(c, offsets, n, k, out); /* depth bounded by cJSON's nesting limit */
}

/* Builds the line table and the item -> offset map. Lexer and cJSON always
 * agree on valid JSON (the fuzz harness checks it); if they ever did not,
 * messages would lack line numbers rather than name wrong ones. */
static sb_status map_positions(reader *r, const cJSON *root) {
    size_t nl = 0;
    for (size_t i = 0; i < r->len; i++)
        nl += r->text[i] == '\n';
    r->newlines = sb_calloc(nl + 1, sizeof(size_t));
    if (!r->newlines)
        return SB_ERR_NOMEM;
    for (size_t i = 0; i < r->len; i++)
        if (r->text[i] == '\n')
            r->newlines[r->n_newlines++] = i;
    if (!root)
        return SB_OK;
    size_t n = sb__regfile_scan(r->text, r->len, NULL, 0);
    size_t *offsets = sb_calloc(n + 1, sizeof(size_t));
    r->pos = sb_calloc(n + 1, sizeof(pos_entry));
    if (!offsets || !r->pos) {
        sb_free(offsets);
        return SB_ERR_NOMEM;
    }
    sb__regfile_scan(r->text, r->len, offsets, n);
    size_t k = 0;
    collect_items(root, offsets, n, &k, r->pos);
    sb_free(offsets);
    if (k != n)
        return SB_OK; /* n_pos stays 0: no positions */
    r->n_pos = n;
    qsort(r->pos, n, sizeof(pos_entry), cmp_pos);
    return SB_OK;
}

/* Line of item, 0 if unknown. */
static int item_line(const reader *r, const cJSON *item) {
    pos_entry key = {.item = item};
    const pos_entry *p = item ? bsearch(&key, r->pos, r->n_pos, sizeof(pos_entry), cmp_pos) : NULL;
    if (!p)
        return 0;
    int line, col;
    offset_line_col(r, p->offset, &line, &col);
    return line;
}

/* "FILE:LINE: FIELD: message" into r->err; returns status. */
static sb_status fail_at(reader *r, const cJSON *item, const char *field, sb_status status, const char *fmt, ...)
    SB_PRINTF(5, 6);
static sb_status fail_at(reader *r, const cJSON *item, const char *field, sb_status status, const char *fmt, ...) {
    char what[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof(what), fmt, ap);
    va_end(ap);
    int line = item_line(r, item);
    char where[32] = "";
    if (line)
        snprintf(where, sizeof(where), ":%d", line);
    return sb_fail(r->err, status, "%s%s: %s%s%s", r->name, where, field, *field ? ": " : "", what);
}

/* ---- small helpers -------------------------------------------------------- */

/* A field's path for messages ("models[1].context") into buf; one too long is cut. */
static const char *pathf(char *buf, size_t cap, const char *fmt, ...) SB_PRINTF(3, 4);
static const char *pathf(char *buf, size_t cap, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, cap, fmt, ap);
    va_end(ap);
    return buf;
}
static const char *field_path(char *buf, size_t cap, const char *path, const char *key) {
    return pathf(buf, cap, "%s%s%s", path, *path ? "." : "", key);
}
static const char *index_path(char *buf, size_t cap, const char *path, size_t i) {
    return pathf(buf, cap, "%s[%zu]", path, i);
}

static char *dup_str(const char *s) { return s ? sb_strndup(s, strlen(s)) : NULL; }

static const cJSON *member(const cJSON *obj, const char *key) { return cJSON_GetObjectItemCaseSensitive(obj, key); }

/* Every member of obj is one of allowed[] and appears once. */
static sb_status check_members(reader *r, const cJSON *obj, const char *path, const char *const *allowed,
                               size_t n_allowed) {
    for (const cJSON *c = obj->child; c; c = c->next) {
        bool known = false;
        for (size_t i = 0; i < n_allowed && !known; i++)
            known = strcmp(c->string, allowed[i]) == 0;
        if (!known)
            return fail_at(r, c, path, SB_ERR_FORMAT, "unknown field '%s'", c->string);
        for (const cJSON *p = obj->child; p != c; p = p->next)
            if (strcmp(p->string, c->string) == 0)
                return fail_at(r, c, path, SB_ERR_FORMAT, "duplicate field '%s' (first at line %d)", c->string,
                               item_line(r, p));
    }
    return SB_OK;
}

static sb_status expect_type(reader *r, const cJSON *v, const char *path, int type, const char *what) {
    if ((v->type & 0xFF) == type || (type == cJSON_True && cJSON_IsBool(v)))
        return SB_OK;
    return fail_at(r, v, path, SB_ERR_FORMAT, "expected %s, got %s", what, sb__json_kind(v));
}

static sb_status get_string(reader *r, const cJSON *v, const char *path, bool nonempty, char **out) {
    sb_status st = expect_type(r, v, path, cJSON_String, "a string");
    if (st)
        return st;
    if (nonempty && !*v->valuestring)
        return fail_at(r, v, path, SB_ERR_FORMAT, "must not be empty");
    sb_free(*out);
    *out = dup_str(v->valuestring);
    return *out ? SB_OK : SB_ERR_NOMEM;
}

/* A model, alias, route or prompt id: what clients type, so no control
 * characters, no surrounding spaces, and a sane length. */
static sb_status get_name(reader *r, const cJSON *v, const char *path, char **out) {
    sb_status st = get_string(r, v, path, true, out);
    if (st)
        return st;
    size_t len = strlen(*out);
    if (len > MAX_NAME_BYTES)
        return fail_at(r, v, path, SB_ERR_FORMAT, "name longer than %d bytes", MAX_NAME_BYTES);
    for (size_t i = 0; i < len; i++)
        if ((unsigned char)(*out)[i] < ' ' || (*out)[i] == 0x7f)
            return fail_at(r, v, path, SB_ERR_FORMAT, "name contains a control character (byte %zu)", i);
    if ((*out)[0] == ' ' || (*out)[len - 1] == ' ')
        return fail_at(r, v, path, SB_ERR_FORMAT, "name '%s' starts or ends with a space", *out);
    return SB_OK;
}

static sb_status get_number(reader *r, const cJSON *v, const char *path, double min, double max, bool min_open,
                            double *out) {
    sb_status st = expect_type(r, v, path, cJSON_Number, "a number");
    if (st)
        return st;
    double x = v->valuedouble;
    if (!(x >= min && x <= max) || (min_open && x == min))
        return fail_at(r, v, path, SB_ERR_FORMAT, "%g is out of range: expected a number %s %g and <= %g", x,
                       min_open ? ">" : ">=", min, max);
    *out = x;
    return SB_OK;
}

static sb_status get_int(reader *r, const cJSON *v, const char *path, int64_t min, int64_t max, int64_t *out) {
    sb_status st = expect_type(r, v, path, cJSON_Number, "an integer");
    if (st)
        return st;
    double x = v->valuedouble;
    if (x != floor(x) || !(x >= (double)min && x <= (double)max))
        return fail_at(r, v, path, SB_ERR_FORMAT, "%g is not an integer in [%lld, %lld]", x, (long long)min,
                       (long long)max);
    *out = (int64_t)x;
    return SB_OK;
}

static sb_status get_array(reader *r, const cJSON *v, const char *path, size_t max, size_t *n) {
    sb_status st = expect_type(r, v, path, cJSON_Array, "an array");
    if (st)
        return st;
    *n = (size_t)cJSON_GetArraySize(v);
    if (*n > max)
        return fail_at(r, v, path, SB_ERR_FORMAT, "%zu entries, more than the limit of %zu", *n, max);
    return SB_OK;
}

/* An array of strings (or, with allow_one, a single string) into *out. */
static sb_status get_strings(reader *r, const cJSON *v, const char *path, size_t max, bool allow_one, bool names,
                             char ***out, size_t *n_out) {
    size_t n = 1;
    sb_status st = SB_OK;
    if (!(allow_one && cJSON_IsString(v)) && (st = get_array(r, v, path, max, &n)))
        return st;
    char **list = sb_calloc(n ? n : 1, sizeof(char *));
    if (!list)
        return SB_ERR_NOMEM;
    *out = list;
    *n_out = 0;
    if (cJSON_IsString(v))
        return get_string(r, v, path, true, &list[(*n_out)++]);
    char buf[160];
    size_t i = 0;
    for (const cJSON *c = v->child; c; c = c->next, i++) {
        const char *p = index_path(buf, sizeof(buf), path, i);
        *n_out = i + 1; /* counted before it is read: a string read and then refused is freed with the rest */
        st = names ? get_name(r, c, p, &list[i]) : get_string(r, c, p, true, &list[i]);
        if (st)
            return st;
    }
    return SB_OK;
}

static bool duration_ms(double ms, bool negative, int64_t *out);

static sb_status get_duration(reader *r, const cJSON *v, const char *path, int64_t *ms) {
    if (cJSON_IsNumber(v)) { /* seconds */
        if (duration_ms(fabs(v->valuedouble) * 1000, v->valuedouble < 0, ms))
            return SB_OK;
        return fail_at(r, v, path, SB_ERR_FORMAT, "%g seconds is too long", v->valuedouble);
    }
    sb_status st =
        expect_type(r, v, path, cJSON_String, "a duration (\"30s\", \"5m\", \"1h\", \"0\", \"-1\") or seconds");
    if (st)
        return st;
    if (!sb_regfile_parse_duration(v->valuestring, ms))
        return fail_at(r, v, path, SB_ERR_FORMAT,
                       "bad duration '%s' (expected e.g. \"30s\", \"5m\", \"1h30m\", \"0\" or \"-1\")", v->valuestring);
    return SB_OK;
}

/* ---- durations ------------------------------------------------------------ */

/* Digits with an optional fraction ("1", "1.5", ".5"); *end after it. */
static bool plain_number(const char *s, double *out, const char **end) {
    const char *p = s;
    bool digits = false;
    while (*p >= '0' && *p <= '9')
        p++, digits = true;
    if (*p == '.')
        for (p++; *p >= '0' && *p <= '9'; p++)
            digits = true;
    if (!digits)
        return false;
    *out = strtod(s, NULL); /* only digits and '.': strtod cannot read more than the scan did */
    *end = p;
    return true;
}

/* A duration of ms milliseconds (>= 0) with its sign: negative (not -0) is
 * forever; false when too long to mean anything. */
static bool duration_ms(double ms, bool negative, int64_t *out) {
    if (!(ms <= MAX_DURATION_MS))
        return false;
    *out = negative && ms > 0 ? SB_REGFILE_FOREVER : (int64_t)llround(ms);
    return true;
}

bool sb_regfile_parse_duration(const char *s, int64_t *ms) {
    static const struct {
        const char *unit;
        double ms;
    } units[] = {{"ms", 1}, {"s", 1000}, {"m", 60e3}, {"h", 3600e3}}; /* "ms" before "m" */
    bool negative = *s == '-';
    const char *p = s + negative, *end;
    double total = 0, x;
    if (!plain_number(p, &x, &end))
        return false;
    if (*end == '\0') /* a bare number: seconds */
        return duration_ms(x * 1000, negative, ms);
    while (*p) {
        if (!plain_number(p, &x, &end))
            return false;
        size_t u = 0;
        while (u < SB_ARRAY_LEN(units) && strncmp(end, units[u].unit, strlen(units[u].unit)) != 0)
            u++;
        if (u == SB_ARRAY_LEN(units))
            return false;
        total += x * units[u].ms;
        p = end + strlen(units[u].unit);
    }
    return duration_ms(total, negative, ms);
}

/* ---- parameters ----------------------------------------------------------- */

typedef enum { P_FLOAT, P_INT32, P_U64 } param_kind;

static const struct param_spec {
    const char *key;
    uint32_t bit;
    param_kind kind;
    double min, max;
    bool min_open;
    size_t offset;
} param_specs[] = {
    {"temperature", SB_PARAM_TEMPERATURE, P_FLOAT, 0, 100, false, offsetof(sb_regfile_params, temperature)},
    {"top_k", SB_PARAM_TOP_K, P_INT32, 0, 1 << 30, false, offsetof(sb_regfile_params, top_k)},
    {"top_p", SB_PARAM_TOP_P, P_FLOAT, 0, 1, false, offsetof(sb_regfile_params, top_p)},
    {"min_p", SB_PARAM_MIN_P, P_FLOAT, 0, 1, false, offsetof(sb_regfile_params, min_p)},
    {"repeat_penalty", SB_PARAM_REPEAT_PENALTY, P_FLOAT, 0, 100, true, offsetof(sb_regfile_params, repeat_penalty)},
    {"repeat_last_n", SB_PARAM_REPEAT_LAST_N, P_INT32, -1, 1 << 20, false, offsetof(sb_regfile_params, repeat_last_n)},
    {"frequency_penalty", SB_PARAM_FREQUENCY_PENALTY, P_FLOAT, -2, 2, false,
     offsetof(sb_regfile_params, frequency_penalty)},
    {"presence_penalty", SB_PARAM_PRESENCE_PENALTY, P_FLOAT, -2, 2, false,
     offsetof(sb_regfile_params, presence_penalty)},
    {"seed", SB_PARAM_SEED, P_U64, 0, 9007199254740992.0 /* 2^53: what a JSON number holds exactly */, false,
     offsetof(sb_regfile_params, seed)},
    {"max_tokens", SB_PARAM_MAX_TOKENS, P_INT32, 1, 1 << 24, false, offsetof(sb_regfile_params, max_tokens)},
};

static sb_status get_params(reader *r, const cJSON *v, const char *path, sb_regfile_params *out) {
    sb_status st = expect_type(r, v, path, cJSON_Object, "an object");
    if (st)
        return st;
    const char *keys[SB_ARRAY_LEN(param_specs) + 1];
    for (size_t i = 0; i < SB_ARRAY_LEN(param_specs); i++)
        keys[i] = param_specs[i].key;
    keys[SB_ARRAY_LEN(param_specs)] = "stop";
    if ((st = check_members(r, v, path, keys, SB_ARRAY_LEN(keys))))
        return st;
    char buf[160];
    for (size_t i = 0; i < SB_ARRAY_LEN(param_specs); i++) {
        const struct param_spec *s = &param_specs[i];
        const cJSON *m = member(v, s->key);
        if (!m)
            continue;
        const char *p = field_path(buf, sizeof(buf), path, s->key);
        char *dst = (char *)out + s->offset;
        if (s->kind == P_FLOAT) {
            double x = 0;
            if ((st = get_number(r, m, p, s->min, s->max, s->min_open, &x)))
                return st;
            *(float *)dst = (float)x;
        } else {
            int64_t x = 0;
            if ((st = get_int(r, m, p, (int64_t)s->min, (int64_t)s->max, &x)))
                return st;
            if (s->kind == P_INT32)
                *(int32_t *)dst = (int32_t)x;
            else
                *(uint64_t *)dst = (uint64_t)x;
        }
        out->set |= s->bit;
    }
    const cJSON *stop = member(v, "stop");
    if (stop) {
        if ((st = get_strings(r, stop, field_path(buf, sizeof(buf), path, "stop"), MAX_STOP, true, false, &out->stop,
                              &out->n_stop)))
            return st;
        out->set |= SB_PARAM_STOP;
    }
    return SB_OK;
}

void sb_regfile_params_apply(const sb_regfile_params *p, sb_sampler_params *s) {
    if (p->set & SB_PARAM_TEMPERATURE)
        s->temperature = p->temperature;
    if (p->set & SB_PARAM_TOP_K)
        s->top_k = p->top_k;
    if (p->set & SB_PARAM_TOP_P)
        s->top_p = p->top_p;
    if (p->set & SB_PARAM_MIN_P)
        s->min_p = p->min_p;
    if (p->set & SB_PARAM_REPEAT_PENALTY)
        s->repeat_penalty = p->repeat_penalty;
    if (p->set & SB_PARAM_REPEAT_LAST_N)
        s->repeat_last_n = p->repeat_last_n;
    if (p->set & SB_PARAM_FREQUENCY_PENALTY)
        s->frequency_penalty = p->frequency_penalty;
    if (p->set & SB_PARAM_PRESENCE_PENALTY)
        s->presence_penalty = p->presence_penalty;
    if (p->set & SB_PARAM_SEED)
        s->seed = p->seed;
}

static void free_strings(char **list, size_t n) {
    for (size_t i = 0; i < n; i++)
        sb_free(list[i]);
    sb_free(list);
}

static void params_free(sb_regfile_params *p) { free_strings(p->stop, p->n_stop); }

/* ---- entries -------------------------------------------------------------- */

/* dir/path, or path when it is absolute. */
static char *resolve_path(const char *dir, const char *path) {
    if (path[0] == '/' || !dir)
        return dup_str(path);
    size_t a = strlen(dir), b = strlen(path);
    char *out = sb_malloc(a + b + 2);
    if (out)
        snprintf(out, a + b + 2, "%s/%s", dir, path);
    return out;
}

static sb_status get_path(reader *r, const cJSON *v, const char *path, char **out) {
    char *raw = NULL;
    sb_status st = get_string(r, v, path, true, &raw);
    if (st)
        return st;
    sb_free(*out);
    *out = resolve_path(r->dir, raw);
    sb_free(raw);
    return *out ? SB_OK : SB_ERR_NOMEM;
}

static void model_defaults(sb_regfile_model *m) {
    memset(m, 0, sizeof(*m));
    m->device = dup_str("cpu");
}

static void model_free(sb_regfile_model *m) {
    sb_free(m->name);
    sb_free(m->path);
    sb_free(m->device);
    free_strings(m->aliases, m->n_aliases);
    sb_free(m->system_prompt);
    sb_free(m->chat_template);
    sb_free(m->fallback);
    params_free(&m->params);
}

static sb_status parse_price(reader *r, const cJSON *v, const char *path, sb_regfile_model *m) {
    static const char *const keys[] = {"prompt", "completion"};
    sb_status st = expect_type(r, v, path, cJSON_Object, "an object");
    if (st || (st = check_members(r, v, path, keys, SB_ARRAY_LEN(keys))))
        return st;
    char buf[160];
    const cJSON *x;
    if ((x = member(v, "prompt")) &&
        (st = get_number(r, x, field_path(buf, sizeof(buf), path, "prompt"), 0, 1e12, false, &m->price_prompt)))
        return st;
    if ((x = member(v, "completion")) &&
        (st = get_number(r, x, field_path(buf, sizeof(buf), path, "completion"), 0, 1e12, false, &m->price_completion)))
        return st;
    return SB_OK;
}

static sb_status parse_model(reader *r, const cJSON *v, const char *path, sb_regfile_model *m) {
    static const char *const keys[] = {"name",       "path",     "device",        "aliases",       "context",
                                       "cache_type", "parallel", "system_prompt", "chat_template", "keep_alive",
                                       "pinned",     "price",    "fallback",      "parameters"};
    sb_status st = expect_type(r, v, path, cJSON_Object, "an object");
    if (st || (st = check_members(r, v, path, keys, SB_ARRAY_LEN(keys))))
        return st;
    m->line = item_line(r, v);
    char buf[160];
#define FIELD(key) field_path(buf, sizeof(buf), path, key)
    const cJSON *x;
    if (!(x = member(v, "name")))
        return fail_at(r, v, path, SB_ERR_FORMAT, "missing required field 'name'");
    if ((st = get_name(r, x, FIELD("name"), &m->name)))
        return st;
    if (!(x = member(v, "path")))
        return fail_at(r, v, path, SB_ERR_FORMAT, "missing required field 'path' (model '%s')", m->name);
    if ((st = get_path(r, x, FIELD("path"), &m->path)))
        return st;
    if ((x = member(v, "device"))) {
        if ((st = get_string(r, x, FIELD("device"), true, &m->device)))
            return st;
        if (strcmp(m->device, "cpu") != 0)
            return fail_at(r, x, FIELD("device"), SB_ERR_UNSUPPORTED,
                           "device '%s' is not available: no such backend (this build has 'cpu' only)", m->device);
    }
    if ((x = member(v, "aliases")) &&
        (st = get_strings(r, x, FIELD("aliases"), MAX_LIST, false, true, &m->aliases, &m->n_aliases)))
        return st;
    int64_t n;
    if ((x = member(v, "context"))) {
        if ((st = get_int(r, x, FIELD("context"), 0, MAX_CONTEXT, &n)))
            return st;
        m->context = (int32_t)n;
    }
    if ((x = member(v, "cache_type"))) {
        if ((st = expect_type(r, x, FIELD("cache_type"), cJSON_String, "a string")))
            return st;
        if (!sb_cache_type_parse(x->valuestring, &m->cache_type))
            return fail_at(r, x, FIELD("cache_type"), SB_ERR_FORMAT, "bad cache type '%s' (expected f32, f16 or q8_0)",
                           x->valuestring);
        m->has_cache_type = true;
    }
    if ((x = member(v, "parallel"))) {
        if ((st = get_int(r, x, FIELD("parallel"), 1, MAX_PARALLEL, &n)))
            return st;
        m->parallel = (int32_t)n;
    }
    if ((x = member(v, "system_prompt")) && (st = get_string(r, x, FIELD("system_prompt"), false, &m->system_prompt)))
        return st;
    if ((x = member(v, "chat_template")) && (st = get_path(r, x, FIELD("chat_template"), &m->chat_template)))
        return st;
    if ((x = member(v, "keep_alive"))) {
        if ((st = get_duration(r, x, FIELD("keep_alive"), &m->keep_alive_ms)))
            return st;
        m->has_keep_alive = true;
    }
    if ((x = member(v, "pinned"))) {
        if ((st = expect_type(r, x, FIELD("pinned"), cJSON_True, "true or false")))
            return st;
        m->pinned = cJSON_IsTrue(x);
    }
    if ((x = member(v, "price")) && (st = parse_price(r, x, FIELD("price"), m)))
        return st;
    if ((x = member(v, "fallback")) && (st = get_name(r, x, FIELD("fallback"), &m->fallback)))
        return st;
    if ((x = member(v, "parameters")) && (st = get_params(r, x, FIELD("parameters"), &m->params)))
        return st;
#undef FIELD
    return SB_OK;
}

static void route_free(sb_regfile_route *rt) {
    sb_free(rt->name);
    for (size_t i = 0; i < rt->n_split; i++)
        sb_free(rt->split[i].model);
    sb_free(rt->split);
}

static sb_status parse_route(reader *r, const cJSON *v, const char *path, sb_regfile_route *rt) {
    static const char *const keys[] = {"name", "split"}, *const arm_keys[] = {"model", "weight"};
    sb_status st = expect_type(r, v, path, cJSON_Object, "an object");
    if (st || (st = check_members(r, v, path, keys, SB_ARRAY_LEN(keys))))
        return st;
    rt->line = item_line(r, v);
    char buf[160], abuf[160], fbuf[200];
    const cJSON *x;
    if (!(x = member(v, "name")))
        return fail_at(r, v, path, SB_ERR_FORMAT, "missing required field 'name'");
    if ((st = get_name(r, x, field_path(buf, sizeof(buf), path, "name"), &rt->name)))
        return st;
    const cJSON *split = member(v, "split");
    if (!split)
        return fail_at(r, v, path, SB_ERR_FORMAT, "missing required field 'split' (route '%s')", rt->name);
    const char *spath = field_path(buf, sizeof(buf), path, "split");
    size_t n;
    if ((st = get_array(r, split, spath, MAX_LIST, &n)))
        return st;
    if (n == 0)
        return fail_at(r, split, spath, SB_ERR_FORMAT, "route '%s' splits between no models", rt->name);
    if (!(rt->split = sb_calloc(n, sizeof(sb_regfile_split))))
        return SB_ERR_NOMEM;
    for (const cJSON *arm = split->child; arm; arm = arm->next) {
        const char *apath = index_path(abuf, sizeof(abuf), spath, rt->n_split);
        sb_regfile_split *s = &rt->split[rt->n_split++];
        s->weight = 1;
        if ((st = expect_type(r, arm, apath, cJSON_Object, "an object")) ||
            (st = check_members(r, arm, apath, arm_keys, SB_ARRAY_LEN(arm_keys))))
            return st;
        if (!(x = member(arm, "model")))
            return fail_at(r, arm, apath, SB_ERR_FORMAT, "missing required field 'model'");
        if ((st = get_name(r, x, field_path(fbuf, sizeof(fbuf), apath, "model"), &s->model)))
            return st;
        if ((x = member(arm, "weight"))) {
            const char *wpath = field_path(fbuf, sizeof(fbuf), apath, "weight");
            if ((st = expect_type(r, x, wpath, cJSON_Number, "a number")))
                return st;
            if (x->valuedouble < 0)
                return fail_at(r, x, wpath, SB_ERR_FORMAT, "negative weight %g", x->valuedouble);
            if ((st = get_number(r, x, wpath, 0, 1e12, false, &s->weight)))
                return st;
        }
        rt->total_weight += s->weight;
    }
    if (!(rt->total_weight > 0))
        return fail_at(r, split, spath, SB_ERR_FORMAT, "the weights of route '%s' sum to 0", rt->name);
    return SB_OK;
}

static void prompt_free(sb_regfile_prompt *p) {
    sb_free(p->id);
    sb_free(p->version);
    sb_free(p->description);
    sb_free(p->template_text);
    sb_free(p->model);
    params_free(&p->params);
    cJSON_Delete(p->variables);
}

static sb_status parse_prompt(reader *r, const cJSON *v, const char *path, sb_regfile_prompt *p) {
    static const char *const keys[] = {"id", "version", "description", "template", "model", "parameters", "variables"};
    sb_status st = expect_type(r, v, path, cJSON_Object, "an object");
    if (st || (st = check_members(r, v, path, keys, SB_ARRAY_LEN(keys))))
        return st;
    p->line = item_line(r, v);
    char buf[160];
#define FIELD(key) field_path(buf, sizeof(buf), path, key)
    const cJSON *x;
    if (!(x = member(v, "id")))
        return fail_at(r, v, path, SB_ERR_FORMAT, "missing required field 'id'");
    if ((st = get_name(r, x, FIELD("id"), &p->id)))
        return st;
    if ((x = member(v, "version"))) {
        if (cJSON_IsNumber(x)) {
            char num[64];
            snprintf(num, sizeof(num), "%.17g", x->valuedouble);
            p->version = dup_str(num);
            if (!p->version)
                return SB_ERR_NOMEM;
        } else if ((st = expect_type(r, x, FIELD("version"), cJSON_String, "a string or a number")) ||
                   (st = get_name(r, x, FIELD("version"), &p->version)))
            return st;
    } else if (!(p->version = dup_str("1")))
        return SB_ERR_NOMEM;
    if ((x = member(v, "description"))) {
        if ((st = get_string(r, x, FIELD("description"), false, &p->description)))
            return st;
    } else if (!(p->description = dup_str("")))
        return SB_ERR_NOMEM;
    if (!(x = member(v, "template")))
        return fail_at(r, v, path, SB_ERR_FORMAT, "missing required field 'template' (prompt '%s')", p->id);
    if ((st = get_string(r, x, FIELD("template"), true, &p->template_text)))
        return st;
    size_t off;
    sb_error terr;
    if (sb_prompt_check(p->template_text, &off, &terr) != SB_OK)
        return fail_at(r, x, FIELD("template"), SB_ERR_FORMAT, "%s", terr.msg);
    if ((x = member(v, "model")) && (st = get_name(r, x, FIELD("model"), &p->model)))
        return st;
    if ((x = member(v, "parameters")) && (st = get_params(r, x, FIELD("parameters"), &p->params)))
        return st;
    if ((x = member(v, "variables"))) {
        const char *vpath = FIELD("variables");
        if ((st = expect_type(r, x, vpath, cJSON_Object, "an object")))
            return st;
        for (const cJSON *c = x->child; c; c = c->next) {
            if (!cJSON_IsString(c) && !cJSON_IsNumber(c) && !cJSON_IsBool(c))
                return fail_at(r, c, vpath, SB_ERR_FORMAT,
                               "variable '%s': expected a string, number or boolean, got %s", c->string, sb__json_kind(c));
            if (!sb_prompt_uses(p->template_text, c->string))
                return fail_at(r, c, vpath, SB_ERR_FORMAT, "variable '%s' is not used by the template", c->string);
            for (const cJSON *q = x->child; q != c; q = q->next)
                if (strcmp(q->string, c->string) == 0)
                    return fail_at(r, c, vpath, SB_ERR_FORMAT, "duplicate variable '%s'", c->string);
        }
        p->variables = cJSON_Duplicate(x, true);
    } else {
        p->variables = cJSON_CreateObject();
    }
#undef FIELD
    return p->variables ? SB_OK : SB_ERR_NOMEM;
}

/* ---- names ---------------------------------------------------------------- */

struct sb_regfile_name {
    const char *name;     /* borrowed from the entry */
    sb_regfile_kind kind; /* what it names */
    size_t index;         /* into rf->models or rf->routes */
    size_t alias;         /* index into the model's aliases; SIZE_MAX for the entry's own name */
    size_t order;         /* position in the table as built, for "first at" */
};

static int cmp_name(const void *a, const void *b) {
    const struct sb_regfile_name *x = a, *y = b;
    int c = strcmp(x->name, y->name);
    return c ? c : (x->order > y->order) - (x->order < y->order);
}

static sb_status build_names(sb_regfile *rf) {
    size_t n = rf->n_routes;
    for (size_t i = 0; i < rf->n_models; i++)
        n += 1 + rf->models[i].n_aliases;
    rf->names = sb_calloc(n ? n : 1, sizeof(*rf->names));
    if (!rf->names)
        return SB_ERR_NOMEM;
    for (size_t i = 0; i < rf->n_models; i++)
        for (size_t a = 0; a <= rf->models[i].n_aliases; a++) {
            bool own = a == rf->models[i].n_aliases; /* the name last: aliases first is no order anyone reads */
            rf->names[rf->n_names] = (struct sb_regfile_name){own ? rf->models[i].name : rf->models[i].aliases[a],
                                                              SB_REGFILE_MODEL, i, own ? SIZE_MAX : a, rf->n_names};
            rf->n_names++;
        }
    for (size_t i = 0; i < rf->n_routes; i++, rf->n_names++)
        rf->names[rf->n_names] =
            (struct sb_regfile_name){rf->routes[i].name, SB_REGFILE_ROUTE, i, SIZE_MAX, rf->n_names};
    qsort(rf->names, rf->n_names, sizeof(*rf->names), cmp_name);
    return SB_OK;
}

/* The JSON item and field path of a name entry, for messages. */
static const cJSON *name_item(const reader *r, const struct sb_regfile_name *e, char *path, size_t cap) {
    if (e->kind == SB_REGFILE_ROUTE) {
        snprintf(path, cap, "routes[%zu].name", e->index);
        return member(r->route_obj[e->index], "name");
    }
    const cJSON *obj = r->model_obj[e->index];
    if (e->alias == SIZE_MAX) {
        snprintf(path, cap, "models[%zu].name", e->index);
        return member(obj, "name");
    }
    snprintf(path, cap, "models[%zu].aliases[%zu]", e->index, e->alias);
    return cJSON_GetArrayItem(member(obj, "aliases"), (int)e->alias);
}

static void describe_name(const sb_regfile *rf, const struct sb_regfile_name *e, char *buf, size_t cap) {
    if (e->kind == SB_REGFILE_ROUTE)
        snprintf(buf, cap, "the name of route '%s'", e->name);
    else if (e->alias == SIZE_MAX)
        snprintf(buf, cap, "the name of model '%s'", e->name);
    else
        snprintf(buf, cap, "an alias of model '%s'", rf->models[e->index].name);
}

/* Names, aliases and route names are one namespace: the first name (in
 * table order) used twice is reported where its second use is. */
static sb_status check_duplicate_names(reader *r) {
    const sb_regfile *rf = r->rf;
    const struct sb_regfile_name *worst = NULL, *first = NULL;
    for (size_t i = 1; i < rf->n_names; i++) {
        const struct sb_regfile_name *a = &rf->names[i - 1], *b = &rf->names[i];
        if (strcmp(a->name, b->name) == 0 && (!worst || b->order < worst->order)) {
            worst = b;
            first = a;
            while (first > rf->names && strcmp((first - 1)->name, b->name) == 0)
                first--;
        }
    }
    if (!worst)
        return SB_OK;
    char path[160], what[160];
    describe_name(rf, first, what, sizeof(what));
    char fpath[160];
    int first_line = item_line(r, name_item(r, first, fpath, sizeof(fpath)));
    return fail_at(r, name_item(r, worst, path, sizeof(path)), path, SB_ERR_FORMAT,
                   "duplicate name '%s': already %s (line %d)", worst->name, what, first_line);
}

sb_regfile_kind sb_regfile_resolve(const sb_regfile *rf, const char *name, const sb_regfile_model **model,
                                   const sb_regfile_route **route) {
    if (model)
        *model = NULL;
    if (route)
        *route = NULL;
    size_t lo = 0, hi = rf->n_names;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(rf->names[mid].name, name);
        if (c == 0) {
            const struct sb_regfile_name *e = &rf->names[mid];
            if (e->kind == SB_REGFILE_MODEL && model)
                *model = &rf->models[e->index];
            if (e->kind == SB_REGFILE_ROUTE && route)
                *route = &rf->routes[e->index];
            return e->kind;
        }
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return SB_REGFILE_NONE;
}

/* ---- references and loops ------------------------------------------------- */

/* Graph nodes: models are 0..n_models-1, routes follow. SIZE_MAX = unknown. */
static size_t node_of(const sb_regfile *rf, const char *name) {
    const sb_regfile_model *m;
    const sb_regfile_route *rt;
    switch (sb_regfile_resolve(rf, name, &m, &rt)) {
    case SB_REGFILE_MODEL:
        return (size_t)(m - rf->models);
    case SB_REGFILE_ROUTE:
        return rf->n_models + (size_t)(rt - rf->routes);
    default:
        return SIZE_MAX;
    }
}

static size_t node_edges(const sb_regfile *rf, size_t node) {
    if (node < rf->n_models)
        return rf->models[node].fallback != NULL;
    return rf->routes[node - rf->n_models].n_split;
}

/* The name an edge refers to, its JSON item and field path. */
static const char *edge_ref(const reader *r, size_t node, size_t e, const cJSON **item, char *path, size_t cap) {
    const sb_regfile *rf = r->rf;
    if (node < rf->n_models) {
        snprintf(path, cap, "models[%zu].fallback", node);
        *item = member(r->model_obj[node], "fallback");
        return rf->models[node].fallback;
    }
    size_t j = node - rf->n_models;
    snprintf(path, cap, "routes[%zu].split[%zu].model", j, e);
    *item = member(cJSON_GetArrayItem(member(r->route_obj[j], "split"), (int)e), "model");
    return rf->routes[j].split[e].model;
}

static sb_status check_references(reader *r) {
    const sb_regfile *rf = r->rf;
    char path[160];
    const cJSON *item;
    if (rf->fallback && node_of(rf, rf->fallback) == SIZE_MAX)
        return fail_at(r, member(r->root, "fallback"), "fallback", SB_ERR_FORMAT,
                       "unknown model '%s' (no model, alias or route has that name)", rf->fallback);
    for (size_t node = 0; node < rf->n_models + rf->n_routes; node++)
        for (size_t e = 0; e < node_edges(rf, node); e++) {
            const char *ref = edge_ref(r, node, e, &item, path, sizeof(path));
            if (node_of(rf, ref) == SIZE_MAX)
                return fail_at(r, item, path, SB_ERR_FORMAT,
                               "unknown model '%s' (no model, alias or route has that name)", ref);
        }
    for (size_t i = 0; i < rf->n_prompts; i++)
        if (rf->prompts[i].model && node_of(rf, rf->prompts[i].model) == SIZE_MAX) {
            snprintf(path, sizeof(path), "prompts[%zu].model", i);
            return fail_at(r, member(r->prompt_obj[i], "model"), path, SB_ERR_FORMAT,
                           "unknown model '%s' (no model, alias or route has that name)", rf->prompts[i].model);
        }
    return SB_OK;
}

static const char *node_name(const sb_regfile *rf, size_t node) {
    return node < rf->n_models ? rf->models[node].name : rf->routes[node - rf->n_models].name;
}

/* The loop closed by the edge (top of stack -> node at stack[from]):
 * "fallback loop: a -> b -> a", naming aliases by what they stand for. */
static sb_status report_loop(reader *r, const size_t (*stack)[2], size_t depth, size_t from) {
    const sb_regfile *rf = r->rf;
    char chain[300] = "";
    size_t len = 0;
    bool fallbacks = false, routes = false;
    len += (size_t)snprintf(chain, sizeof(chain), "%s", node_name(rf, stack[from][0]));
    for (size_t k = from; k < depth; k++) {
        size_t node = stack[k][0], e = stack[k][1] - 1;
        const cJSON *item;
        char path[160];
        const char *ref = edge_ref(r, node, e, &item, path, sizeof(path));
        size_t target = node_of(rf, ref);
        const char *canonical = node_name(rf, target);
        if (len < sizeof(chain))
            len += (size_t)snprintf(chain + len, sizeof(chain) - len,
                                    strcmp(ref, canonical) ? " -> %s (alias of %s)" : " -> %s", ref, canonical);
        *(node < rf->n_models ? &fallbacks : &routes) = true;
    }
    const cJSON *item;
    char path[160];
    size_t top = depth - 1;
    edge_ref(r, stack[top][0], stack[top][1] - 1, &item, path, sizeof(path));
    return fail_at(r, item, path, SB_ERR_FORMAT, "%s loop: %s",
                   fallbacks && routes ? "fallback and route"
                   : fallbacks         ? "fallback"
                                       : "route",
                   chain);
}

/* A request follows fallbacks (a model that fails to load) and routes (a
 * virtual name picking an arm): a cycle would never end. Depth-first from
 * each node in file order, iteratively (chains can be as long as the file). */
static sb_status check_loops(reader *r) {
    const sb_regfile *rf = r->rf;
    size_t n = rf->n_models + rf->n_routes;
    unsigned char *state = sb_calloc(n + 1, 1);           /* 0 unseen, 1 on the stack, 2 done */
    size_t(*stack)[2] = sb_calloc(n + 1, sizeof(*stack)); /* node, next edge */
    sb_status st = state && stack ? SB_OK : SB_ERR_NOMEM;
    for (size_t start = 0; start < n && st == SB_OK; start++) {
        if (state[start])
            continue;
        size_t depth = 0;
        stack[depth][0] = start;
        stack[depth++][1] = 0;
        state[start] = 1;
        while (depth && st == SB_OK) {
            size_t node = stack[depth - 1][0], e = stack[depth - 1][1];
            if (e == node_edges(rf, node)) {
                state[node] = 2;
                depth--;
                continue;
            }
            stack[depth - 1][1]++;
            const cJSON *item;
            char path[160];
            size_t next = node_of(rf, edge_ref(r, node, e, &item, path, sizeof(path)));
            if (state[next] == 1) {
                size_t from = 0;
                while (stack[from][0] != next)
                    from++;
                st = report_loop(r, (const size_t(*)[2])stack, depth, from);
            } else if (state[next] == 0) {
                state[next] = 1;
                stack[depth][0] = next;
                stack[depth++][1] = 0;
            }
        }
    }
    sb_free(state);
    sb_free(stack);
    return st;
}

/* Two prompts with the same id and an equal version (sb_prompt_version_cmp). */
static sb_status check_prompt_versions(reader *r) {
    const sb_regfile *rf = r->rf;
    for (size_t i = 0; i < rf->n_prompts; i++)
        for (size_t j = 0; j < i; j++)
            if (strcmp(rf->prompts[i].id, rf->prompts[j].id) == 0 &&
                sb_prompt_version_cmp(rf->prompts[i].version, rf->prompts[j].version) == 0) {
                char path[64];
                snprintf(path, sizeof(path), "prompts[%zu]", i);
                return fail_at(r, r->prompt_obj[i], path, SB_ERR_FORMAT,
                               "duplicate prompt '%s' version '%s' (first at line %d)", rf->prompts[i].id,
                               rf->prompts[i].version, rf->prompts[j].line);
            }
    return SB_OK;
}

/* ---- files ---------------------------------------------------------------- */

/* Opens path to learn that it is a readable regular file and who it is. */
static sb_status stat_file(const char *path, sb_regfile_file_id *id, char *why, size_t cap) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat sbuf;
    if (fd < 0 || fstat(fd, &sbuf) != 0) {
        int e = errno;
        if (fd >= 0)
            close(fd);
        snprintf(why, cap, "%s", strerror(e));
        return e == ENOENT || e == ENOTDIR ? SB_ERR_NOT_FOUND : SB_ERR_IO;
    }
    close(fd);
    if (!S_ISREG(sbuf.st_mode)) {
        snprintf(why, cap, "%s", S_ISDIR(sbuf.st_mode) ? "is a directory" : "not a regular file");
        return SB_ERR_IO;
    }
    id->dev = (uint64_t)sbuf.st_dev;
    id->ino = (uint64_t)sbuf.st_ino;
    id->size = (uint64_t)sbuf.st_size;
    id->mtime_ns = (int64_t)sbuf.st_mtim.tv_sec * 1000000000 + sbuf.st_mtim.tv_nsec;
    return SB_OK;
}

static sb_status check_files(reader *r) {
    sb_regfile *rf = r->rf;
    char why[160], path[64];
    for (size_t i = 0; i < rf->n_models; i++) {
        sb_regfile_model *m = &rf->models[i];
        sb_status st = stat_file(m->path, &m->file, why, sizeof(why));
        if (st) {
            snprintf(path, sizeof(path), "models[%zu].path", i);
            return fail_at(r, member(r->model_obj[i], "path"), path, st, "model file '%s' of model '%s': %s", m->path,
                           m->name, why);
        }
        if (m->chat_template && (st = stat_file(m->chat_template, &m->chat_template_file, why, sizeof(why)))) {
            snprintf(path, sizeof(path), "models[%zu].chat_template", i);
            return fail_at(r, member(r->model_obj[i], "chat_template"), path, st,
                           "chat template '%s' of model '%s': %s", m->chat_template, m->name, why);
        }
    }
    return SB_OK;
}

/* ---- the whole file ------------------------------------------------------- */

/* Allocates n zeroed entries of size for an array member. */
static sb_status alloc_entries(reader *r, const cJSON *v, const char *path, size_t size, void **out, size_t *n,
                               const cJSON ***objs) {
    sb_status st = get_array(r, v, path, MAX_ENTRIES, n);
    if (st)
        return st;
    *out = sb_calloc(*n ? *n : 1, size);
    *objs = sb_calloc(*n ? *n : 1, sizeof(cJSON *));
    return *out && *objs ? SB_OK : SB_ERR_NOMEM;
}

static sb_status parse_entries(reader *r, bool registry) {
    static const char *const keys[] = {"fallback", "models", "routes", "prompts"};
    sb_regfile *rf = r->rf;
    const cJSON *root = r->root, *x;
    sb_status st = expect_type(r, root, "", cJSON_Object, "a JSON object");
    if (st || (st = check_members(r, root, "", keys + !registry * 3, registry ? 4 : 1)))
        return st;
    if ((x = member(root, "fallback")) && (st = get_name(r, x, "fallback", &rf->fallback)))
        return st;
    char path[64];
    size_t n;
    if (!(x = member(root, "models")) && registry)
        return fail_at(r, root, "", SB_ERR_FORMAT, "missing required field 'models'");
    if (x) {
        if ((st = alloc_entries(r, x, "models", sizeof(sb_regfile_model), (void **)&rf->models, &n, &r->model_obj)))
            return st;
        for (const cJSON *c = x->child; c; c = c->next, rf->n_models++) {
            sb_regfile_model *m = &rf->models[rf->n_models];
            model_defaults(m);
            r->model_obj[rf->n_models] = c;
            if (!m->device)
                return SB_ERR_NOMEM;
            if ((st = parse_model(r, c, index_path(path, sizeof(path), "models", rf->n_models), m))) {
                rf->n_models++; /* freed with the others */
                return st;
            }
        }
    }
    if ((x = member(root, "routes"))) {
        if ((st = alloc_entries(r, x, "routes", sizeof(sb_regfile_route), (void **)&rf->routes, &n, &r->route_obj)))
            return st;
        for (const cJSON *c = x->child; c; c = c->next) {
            r->route_obj[rf->n_routes] = c;
            sb_regfile_route *rt = &rf->routes[rf->n_routes++];
            if ((st = parse_route(r, c, index_path(path, sizeof(path), "routes", rf->n_routes - 1), rt)))
                return st;
        }
    }
    if ((x = member(root, "prompts"))) {
        if ((st = alloc_entries(r, x, "prompts", sizeof(sb_regfile_prompt), (void **)&rf->prompts, &n, &r->prompt_obj)))
            return st;
        for (const cJSON *c = x->child; c; c = c->next) {
            r->prompt_obj[rf->n_prompts] = c;
            sb_regfile_prompt *p = &rf->prompts[rf->n_prompts++];
            if ((st = parse_prompt(r, c, index_path(path, sizeof(path), "prompts", rf->n_prompts - 1), p)))
                return st;
        }
    }
    return SB_OK;
}

static bool token_char(char c) { return (unsigned char)c > ' ' && !strchr("{}[],:", c); }

/* Why cJSON stopped at off, in words a person fixing the file can use;
 * returns the offset to report. cJSON points past the first character of a
 * bad token (its string reader fails one byte in), so the report moves back
 * to where the token starts. */
static size_t syntax_hint(const char *t, size_t len, size_t off, char *buf, size_t cap) {
    size_t first = 0;
    while (first < len && (unsigned char)t[first] <= ' ')
        first++;
    if (first == len) {
        snprintf(buf, cap, "the file is empty (a registry is a JSON object)");
        return len;
    }
    if (off >= len) {
        snprintf(buf, cap, "unexpected end of file (a '{', '[' or '\"' left open?)");
        return len;
    }
    while (off > 0 && token_char(t[off - 1]))
        off--;
    size_t prev = off; /* one past the last non-blank before off */
    while (prev > 0 && (unsigned char)t[prev - 1] <= ' ')
        prev--;
    /* a trailing comma: cJSON stops at the bracket after it, or one further */
    size_t closes[2] = {off, prev > 0 ? prev - 1 : off};
    for (int k = 0; k < 2; k++) {
        size_t c = closes[k], comma = c;
        while (comma > 0 && (unsigned char)t[comma - 1] <= ' ')
            comma--;
        if ((t[c] == '}' || t[c] == ']') && comma > 0 && t[comma - 1] == ',') {
            snprintf(buf, cap, "trailing comma before '%c'", t[c]);
            return comma - 1;
        }
    }
    if (t[off] == '/' || t[off] == '#') {
        snprintf(buf, cap, "comments are not allowed in JSON");
    } else if (t[off] == '\'') {
        snprintf(buf, cap, "strings take double quotes, not single");
    } else if (t[off] == '"' && !memchr(t + off + 1, '"', strcspn(t + off + 1, "\n"))) {
        snprintf(buf, cap, "unterminated string");
    } else {
        char near[16];
        size_t n = 0;
        for (size_t i = off; i < len && n < sizeof(near) - 1 && t[i] != '\n'; i++)
            near[n++] = (unsigned char)t[i] < ' ' ? '?' : t[i];
        near[n] = '\0';
        bool value_before = prev > 0 && strchr("\"0123456789el}]", t[prev - 1]);
        snprintf(buf, cap, "unexpected text at '%s'%s", near,
                 value_before && strchr("\"{[", t[off]) ? " (missing ','?)" : "");
    }
    return off;
}

static void reader_free(reader *r) {
    sb_free(r->newlines);
    sb_free(r->pos);
    sb_free(r->model_obj);
    sb_free(r->route_obj);
    sb_free(r->prompt_obj);
}

/* Parses r->text (NUL-terminated, r->len bytes) into r->rf: syntax, then
 * every entry. *root receives cJSON's tree (the caller deletes it). */
static sb_status read_entries(reader *r, bool registry, cJSON **root) {
    *root = NULL;
    const char *nul = memchr(r->text, '\0', r->len);
    int line, col;
    if (nul) {
        r->len = (size_t)(nul - r->text); /* positions up to the NUL are all that matter */
        if (map_positions(r, NULL))
            return SB_ERR_NOMEM;
        offset_line_col(r, r->len, &line, &col);
        return sb_fail(r->err, SB_ERR_FORMAT, "%s:%d:%d: NUL byte in a JSON file", r->name, line, col);
    }
    const char *end = NULL;
    uint64_t failures = sb__alloc_failures();
    *root = cJSON_ParseWithOpts(r->text, &end, true);
    if (map_positions(r, *root))
        return SB_ERR_NOMEM;
    if (!*root && sb__alloc_failures() != failures)
        return sb_fail(r->err, SB_ERR_NOMEM, "%s: out of memory while parsing the JSON", r->name);
    if (!*root) {
        size_t off = end && end >= r->text ? (size_t)(end - r->text) : r->len;
        char hint[96];
        off = syntax_hint(r->text, r->len, off, hint, sizeof(hint));
        offset_line_col(r, off, &line, &col);
        return sb_fail(r->err, SB_ERR_FORMAT, "%s:%d:%d: JSON syntax error: %s", r->name, line, col, hint);
    }
    r->root = *root;
    return parse_entries(r, registry);
}

/* Appends the built-in prompts whose ids rf's own prompts do not use. */
static sb_status add_builtins(sb_regfile *rf, sb_error *err) {
    sb_regfile tmp = {0};
    reader r = {.text = sb_prompt_builtin_json,
                .len = strlen(sb_prompt_builtin_json),
                .name = "built-in prompts",
                .err = err,
                .rf = &tmp};
    cJSON *root;
    sb_status st = read_entries(&r, false, &root);
    if (!st)
        st = check_prompt_versions(&r);
    size_t n_file = rf->n_prompts;
    sb_regfile_prompt *all = st ? NULL : sb_realloc(rf->prompts, (n_file + tmp.n_prompts + 1) * sizeof(*all));
    if (!st && !all)
        st = SB_ERR_NOMEM;
    for (size_t i = 0; i < tmp.n_prompts; i++) {
        sb_regfile_prompt *p = &tmp.prompts[i];
        bool hidden = st != SB_OK;
        for (size_t j = 0; j < n_file && !hidden; j++)
            hidden = strcmp(all[j].id, p->id) == 0;
        if (hidden) {
            prompt_free(p);
            continue;
        }
        p->builtin = true;
        p->line = 0;
        all[rf->n_prompts++] = *p;
    }
    if (all)
        rf->prompts = all;
    sb_free(tmp.prompts);
    tmp.prompts = NULL;
    tmp.n_prompts = 0;
    reader_free(&r);
    cJSON_Delete(root);
    return st;
}

void sb_regfile_free(sb_regfile *rf) {
    if (!rf)
        return;
    for (size_t i = 0; i < rf->n_models; i++)
        model_free(&rf->models[i]);
    for (size_t i = 0; i < rf->n_routes; i++)
        route_free(&rf->routes[i]);
    for (size_t i = 0; i < rf->n_prompts; i++)
        prompt_free(&rf->prompts[i]);
    sb_free(rf->models);
    sb_free(rf->routes);
    sb_free(rf->prompts);
    sb_free(rf->names);
    sb_free(rf->fallback);
    sb_free(rf->path);
    sb_free(rf);
}

/* What every constructor ends with: the name index and the built-ins. */
static sb_status finish(sb_regfile *rf, sb_error *err) {
    if (build_names(rf))
        return sb_fail(err, SB_ERR_NOMEM, "out of memory indexing the registry's names");
    return add_builtins(rf, err);
}

sb_status sb_regfile_parse(const char *text, size_t len, const char *name, const char *dir, sb_regfile **out,
                           sb_error *err) {
    *out = NULL;
    sb_regfile *rf = sb_calloc(1, sizeof(*rf));
    char *copy = sb_malloc(len + 1);
    if (!rf || !copy) {
        sb_free(rf);
        sb_free(copy);
        return sb_fail(err, SB_ERR_NOMEM, "%s: out of memory", name);
    }
    memcpy(copy, text, len);
    copy[len] = '\0';
    size_t bom = len >= 3 && memcmp(copy, "\xEF\xBB\xBF", 3) == 0 ? 3 : 0;
    if (bom) /* blanks keep every offset, so lines and columns stay true */
        memset(copy, ' ', 3);
    reader r = {.text = copy, .len = len, .name = name, .dir = dir, .err = err, .rf = rf};
    cJSON *root;
    sb_status st = read_entries(&r, true, &root);
    if (!st && (st = build_names(rf)))
        sb_fail(err, st, "%s: out of memory", name);
    if (!st)
        st = check_duplicate_names(&r);
    if (!st)
        st = check_references(&r);
    if (!st)
        st = check_loops(&r);
    if (!st)
        st = check_prompt_versions(&r);
    if (!st)
        st = check_files(&r);
    if (!st)
        st = add_builtins(rf, err);
    if (st == SB_ERR_NOMEM)
        sb_fail(err, st, "%s: out of memory", name);
    reader_free(&r);
    cJSON_Delete(root);
    sb_free(copy);
    if (st) {
        sb_regfile_free(rf);
        return st;
    }
    *out = rf;
    return SB_OK;
}

/* The directory part of path, absolute when it can be made so (a server
 * that changes directory later still finds the models). */
static char *dir_of(const char *path) {
    const char *slash = strrchr(path, '/');
    char *dir = slash ? sb_strndup(path, slash == path ? 1 : (size_t)(slash - path)) : dup_str(".");
    char *abs = dir ? realpath(dir, NULL) : NULL; /* libc's malloc: copied below */
    if (abs) {
        sb_free(dir);
        dir = dup_str(abs);
        free(abs);
    }
    return dir;
}

sb_status sb_regfile_load(const char *path, sb_regfile **out, sb_error *err) {
    *out = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat sbuf;
    if (fd < 0 || fstat(fd, &sbuf) != 0) {
        int e = errno;
        if (fd >= 0)
            close(fd);
        return sb_fail(err, e == ENOENT ? SB_ERR_NOT_FOUND : SB_ERR_IO, "cannot open registry file '%s': %s", path,
                       strerror(e));
    }
    if (!S_ISREG(sbuf.st_mode) || sbuf.st_size > MAX_FILE_BYTES) {
        close(fd);
        return sb_fail(err, SB_ERR_IO, "registry file '%s': %s", path,
                       S_ISREG(sbuf.st_mode) ? "larger than 16 MiB" : "not a regular file");
    }
    size_t size = (size_t)sbuf.st_size, got = 0;
    char *text = sb_malloc(size + 1);
    while (text && got < size) {
        ssize_t n = read(fd, text + got, size - got);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        got += (size_t)n;
    }
    int e = errno;
    close(fd);
    if (!text)
        return sb_fail(err, SB_ERR_NOMEM, "registry file '%s': out of memory", path);
    if (got < size) {
        sb_free(text);
        return sb_fail(err, SB_ERR_IO, "cannot read registry file '%s': %s", path, strerror(e));
    }
    char *dir = dir_of(path);
    sb_status st = dir ? sb_regfile_parse(text, size, path, dir, out, err)
                       : sb_fail(err, SB_ERR_NOMEM, "registry file '%s': out of memory", path);
    sb_free(dir);
    sb_free(text);
    if (st == SB_OK && !((*out)->path = dup_str(path))) {
        sb_regfile_free(*out);
        *out = NULL;
        st = sb_fail(err, SB_ERR_NOMEM, "registry file '%s': out of memory", path);
    }
    return st;
}

/* Appends a model with defaults for everything but its name and file. */
static sb_status add_default_model(sb_regfile *rf, size_t *cap, const char *name, size_t name_len, char *path,
                                   const sb_regfile_file_id *id) {
    if (rf->n_models == *cap) {
        size_t ncap = *cap ? *cap * 2 : 8;
        sb_regfile_model *m = sb_realloc(rf->models, ncap * sizeof(*m));
        if (!m) {
            sb_free(path);
            return SB_ERR_NOMEM;
        }
        rf->models = m;
        *cap = ncap;
    }
    sb_regfile_model *m = &rf->models[rf->n_models++];
    model_defaults(m);
    m->path = path;
    m->file = *id;
    m->name = sb_strndup(name, name_len);
    return m->name && m->device ? SB_OK : SB_ERR_NOMEM;
}

static bool gguf_name(const char *file, size_t *stem) {
    size_t len = strlen(file);
    *stem = len - 5;
    return file[0] != '.' && len > 5 && strcmp(file + len - 5, ".gguf") == 0;
}

static int cmp_model_name(const void *a, const void *b) {
    return strcmp(((const sb_regfile_model *)a)->name, ((const sb_regfile_model *)b)->name);
}

sb_status sb_regfile_from_dir(const char *dir, sb_regfile **out, sb_error *err) {
    *out = NULL;
    DIR *d = opendir(dir);
    if (!d)
        return sb_fail(err, errno == ENOENT ? SB_ERR_NOT_FOUND : SB_ERR_IO, "cannot read model directory '%s': %s", dir,
                       strerror(errno));
    sb_regfile *rf = sb_calloc(1, sizeof(*rf));
    size_t cap = 0, stem;
    sb_status st = rf ? SB_OK : SB_ERR_NOMEM;
    struct dirent *de;
    while (st == SB_OK && (de = readdir(d))) {
        if (!gguf_name(de->d_name, &stem))
            continue;
        char *path = resolve_path(dir, de->d_name), why[160];
        sb_regfile_file_id id;
        if (!path)
            st = SB_ERR_NOMEM;
        else if (stat_file(path, &id, why, sizeof(why)) != SB_OK)
            sb_free(path); /* a directory, a dangling link, a file going away: not a model */
        else
            st = add_default_model(rf, &cap, de->d_name, stem, path, &id);
    }
    closedir(d);
    if (st == SB_OK) {
        if (rf->n_models)
            qsort(rf->models, rf->n_models, sizeof(*rf->models), cmp_model_name);
        st = finish(rf, err);
    } else {
        sb_fail(err, st, "model directory '%s': out of memory", dir);
    }
    if (st) {
        sb_regfile_free(rf);
        return st;
    }
    *out = rf;
    return SB_OK;
}

sb_status sb_regfile_one(const char *path, const char *name, sb_regfile **out, sb_error *err) {
    *out = NULL;
    char why[160];
    sb_regfile_file_id id;
    sb_status st = stat_file(path, &id, why, sizeof(why));
    if (st)
        return sb_fail(err, st, "model file '%s': %s", path, why);
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    size_t stem = strlen(base);
    if (!name && stem > 5 && strcmp(base + stem - 5, ".gguf") == 0)
        stem -= 5;
    sb_regfile *rf = sb_calloc(1, sizeof(*rf));
    char *copy = dup_str(path);
    size_t cap = 0;
    st = rf && copy ? add_default_model(rf, &cap, name ? name : base, name ? strlen(name) : stem, copy, &id)
                    : SB_ERR_NOMEM;
    if (!rf || !copy)
        sb_free(copy);
    if (st)
        sb_fail(err, st, "model file '%s': out of memory", path);
    else
        st = finish(rf, err);
    if (st) {
        sb_regfile_free(rf);
        return st;
    }
    *out = rf;
    return SB_OK;
}

/* ---- comparison ----------------------------------------------------------- */

static bool str_eq(const char *a, const char *b) { return a == b || (a && b && strcmp(a, b) == 0); }

static bool strings_eq(char *const *a, size_t na, char *const *b, size_t nb) {
    if (na != nb)
        return false;
    for (size_t i = 0; i < na; i++)
        if (!str_eq(a[i], b[i]))
            return false;
    return true;
}

static bool file_eq(const sb_regfile_file_id *a, const sb_regfile_file_id *b) {
    return a->dev == b->dev && a->ino == b->ino && a->size == b->size && a->mtime_ns == b->mtime_ns;
}

static bool params_eq(const sb_regfile_params *a, const sb_regfile_params *b) {
    if (a->set != b->set || !strings_eq(a->stop, a->n_stop, b->stop, b->n_stop) || a->max_tokens != b->max_tokens)
        return false;
    sb_sampler_params x = {0}, y = {0};
    sb_regfile_params_apply(a, &x);
    sb_regfile_params_apply(b, &y);
    return memcmp(&x, &y, sizeof(x)) == 0; /* both zeroed first: padding compares equal */
}

bool sb_regfile_model_same_load(const sb_regfile_model *a, const sb_regfile_model *b) {
    return str_eq(a->path, b->path) && file_eq(&a->file, &b->file) && str_eq(a->device, b->device) &&
           a->context == b->context && a->has_cache_type == b->has_cache_type &&
           (!a->has_cache_type || a->cache_type == b->cache_type) && a->parallel == b->parallel &&
           str_eq(a->chat_template, b->chat_template) &&
           (!a->chat_template || file_eq(&a->chat_template_file, &b->chat_template_file));
}

bool sb_regfile_equal_model(const sb_regfile_model *a, const sb_regfile_model *b) {
    return sb_regfile_model_same_load(a, b) && str_eq(a->name, b->name) &&
           strings_eq(a->aliases, a->n_aliases, b->aliases, b->n_aliases) &&
           str_eq(a->system_prompt, b->system_prompt) && a->has_keep_alive == b->has_keep_alive &&
           (!a->has_keep_alive || a->keep_alive_ms == b->keep_alive_ms) && a->pinned == b->pinned &&
           a->price_prompt == b->price_prompt && a->price_completion == b->price_completion &&
           str_eq(a->fallback, b->fallback) && params_eq(&a->params, &b->params);
}
