/*
 * json_schema.c - JSON Schema to GBNF (see json_schema.h).
 *
 * One walk over the schema writes one GBNF expression per subschema, each
 * matching the JSON text of a value and the whitespace after it. Schemas
 * referenced by $ref, array items and property values get rules of their
 * own (a $ref's rule is registered before its body is written, so recursive
 * schemas become recursive rules); the shared pieces (strings, numbers, any
 * value) are written once at the end if used.
 *
 * Where a keyword's exact language is awkward in a grammar, the grammar
 * keeps to a subset of it that is still always valid: extra properties get
 * keys of plain characters only (an escape could spell a declared name),
 * patterns' '.' and negated classes never produce a quote, a backslash or a
 * control character, bounded numbers have no exponent, and dates keep to
 * days 1..28. What cannot be narrowed safely is refused, by keyword and path.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "base/base.h"
#include "sampling/json_schema.h"

#define MAX_STRING_LEN 512   /* longest minLength / maxLength a grammar spells out */
#define MAX_DEPTH 64          /* subschemas inside each other */
#define UNBOUNDED 999999999999999LL /* 15 digits: the most an unbounded number spells */

typedef struct {
    char *p;
    size_t n, cap;
    bool oom;
} sbuf;

static void put(sbuf *b, const char *s, size_t n) {
    if (b->oom)
        return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n + 1)
            cap *= 2;
        char *p = sb_realloc(b->p, cap);
        if (!p) {
            b->oom = true;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = '\0';
}

static void puts_(sbuf *b, const char *s) { put(b, s, strlen(s)); }

static void putf(sbuf *b, const char *fmt, ...) SB_PRINTF(2, 3);
static void putf(sbuf *b, const char *fmt, ...) {
    va_list ap, again;
    va_start(ap, fmt);
    va_copy(again, ap);
    char tmp[256];
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n >= (int)sizeof tmp) { /* long: print again into a buffer of its size */
        char *big = sb_malloc((size_t)n + 1);
        if (big) {
            vsnprintf(big, (size_t)n + 1, fmt, again);
            put(b, big, (size_t)n);
        } else {
            b->oom = true;
        }
        sb_free(big);
    } else if (n > 0) {
        put(b, tmp, (size_t)n);
    }
    va_end(again);
}

/* A GBNF string literal of n bytes. */
static void put_literal(sbuf *b, const char *s, size_t n) {
    puts_(b, "\"");
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\')
            putf(b, "\\%c", c);
        else if (c < 0x20 || c == 0x7F)
            putf(b, "\\x%02X", c);
        else
            put(b, (const char *)&c, 1);
    }
    puts_(b, "\"");
}

/* Shared rules, written once at the end when used. */
enum { P_SPACE = 1, P_CHAR = 2, P_STRING = 4, P_NUMBER = 8, P_INTEGER = 16, P_VALUE = 32, P_KCHAR = 64 };

static const char *const primitive_rules[] = {
    "space ::= | \" \"\n", /* compact, as OpenAI writes it; one optional blank between tokens */
    "char ::= [^\"\\\\\\x00-\\x1F\\x7F] | \"\\\\\" ([\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4})\n",
    "string ::= \"\\\"\" char* \"\\\"\" space\n",
    "number ::= \"-\"? (\"0\" | [1-9] [0-9]{0,15}) (\".\" [0-9]{1,16})? ([eE] [-+]? [0-9]{1,3})? space\n",
    "integer ::= \"-\"? (\"0\" | [1-9] [0-9]{0,15}) space\n",
    "value ::= object | array | string | number | (\"true\" | \"false\" | \"null\") space\n"
    "object ::= \"{\" space (string \":\" space value (\",\" space string \":\" space value)*)? \"}\" space\n"
    "array ::= \"[\" space (value (\",\" space value)*)? \"]\" space\n",
    "kchar ::= [^\"\\\\\\x00-\\x1F\\x7F]\n",
};

typedef struct {
    char *ref;
    int id;
} ref_rule;

typedef struct {
    const cJSON *root;
    sbuf rules;
    int next_id;
    ref_rule *refs;
    size_t n_refs, cap_refs;
    unsigned used;
    char path[512];
    size_t path_len;
    int depth;
    sb_error *err;
    sb_status st;
} ctx;

static bool failv(ctx *c, sb_status st, const char *fmt, va_list ap) {
    if (c->st != SB_OK)
        return false;
    char msg[400];
    vsnprintf(msg, sizeof msg, fmt, ap);
    c->st = sb_fail(c->err, st, "%s (at #%s)", msg, c->path);
    return false;
}

static bool unsupported(ctx *c, const char *fmt, ...) SB_PRINTF(2, 3);
static bool unsupported(ctx *c, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    failv(c, SB_ERR_UNSUPPORTED, fmt, ap);
    va_end(ap);
    return false;
}

static bool malformed(ctx *c, const char *fmt, ...) SB_PRINTF(2, 3);
static bool malformed(ctx *c, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    failv(c, SB_ERR_INVALID_ARG, fmt, ap);
    va_end(ap);
    return false;
}

/* Enters a child path (a JSON pointer segment, '~' and '/' escaped); returns the length to restore. */
static size_t enter(ctx *c, const char *seg) {
    size_t old = c->path_len;
    char esc[256];
    size_t n = 0;
    for (const char *s = seg; *s && n + 3 < sizeof esc; s++) {
        if (*s == '~' || *s == '/') {
            esc[n++] = '~';
            esc[n++] = *s == '~' ? '0' : '1';
        } else {
            esc[n++] = *s;
        }
    }
    esc[n] = '\0';
    int w = snprintf(c->path + old, sizeof c->path - old, "/%s", esc);
    c->path_len = SB_MIN(old + (size_t)SB_MAX(w, 0), sizeof c->path - 1);
    return old;
}

static void leave(ctx *c, size_t old) {
    c->path_len = old;
    c->path[old] = '\0';
}

static void use(ctx *c, sbuf *out, unsigned prim, const char *name) {
    c->used |= prim;
    puts_(out, name);
}

/* ---- keywords --------------------------------------------------------------- */

static const char *const annotations[] = {"title",    "description", "examples",  "default",   "$schema", "$id",
                                          "$comment", "deprecated",  "readOnly",  "writeOnly", "$defs",   "definitions",
                                          "strict",   NULL};
static const char *const handled[] = {"type",          "properties",       "required",         "additionalProperties",
                                      "enum",          "const",            "items",            "minItems",
                                      "maxItems",      "minLength",        "maxLength",        "pattern",
                                      "format",        "minimum",          "maximum",          "exclusiveMinimum",
                                      "exclusiveMaximum", "$ref",          "anyOf",            "oneOf",
                                      "allOf",         "nullable",         "uniqueItems",      "multipleOf",
                                      NULL};

static bool in_list(const char *const *list, const char *s) {
    for (; *list; list++)
        if (strcmp(*list, s) == 0)
            return true;
    return false;
}

static const cJSON *kw(const cJSON *s, const char *name) { return cJSON_GetObjectItemCaseSensitive(s, name); }

/* Whether s has a constraining keyword other than those in `except`. */
static const char *other_constraint(const cJSON *s, const char *const *except) {
    const cJSON *m;
    cJSON_ArrayForEach(m, s) if (!in_list(annotations, m->string) && !in_list(except, m->string)) return m->string;
    return NULL;
}

static bool gen(ctx *c, const cJSON *s, sbuf *out);

/* A rule of its own for schema s; appends its name. */
static bool gen_named(ctx *c, const cJSON *s, sbuf *out) {
    int id = c->next_id++;
    sbuf body = {0};
    bool ok = gen(c, s, &body);
    if (ok) {
        putf(&c->rules, "r%d ::= ", id);
        put(&c->rules, body.p, body.n);
        puts_(&c->rules, "\n");
        putf(out, "r%d", id);
    }
    c->rules.oom |= body.oom;
    sb_free(body.p);
    return ok;
}

/* ---- literals: const and enum ---------------------------------------------- */

static bool gen_literal(ctx *c, const cJSON *v, sbuf *out) {
    char *text = cJSON_PrintUnformatted(v);
    if (!text) {
        out->oom = true;
        return false;
    }
    puts_(out, "(");
    put_literal(out, text, strlen(text));
    puts_(out, " ");
    use(c, out, P_SPACE, "space");
    puts_(out, ")");
    cJSON_free(text);
    return true;
}

static bool type_matches(const char *type, const cJSON *v) {
    if (strcmp(type, "string") == 0)
        return cJSON_IsString(v);
    if (strcmp(type, "integer") == 0)
        return cJSON_IsNumber(v) && v->valuedouble == floor(v->valuedouble);
    if (strcmp(type, "number") == 0)
        return cJSON_IsNumber(v);
    if (strcmp(type, "boolean") == 0)
        return cJSON_IsBool(v);
    if (strcmp(type, "null") == 0)
        return cJSON_IsNull(v);
    if (strcmp(type, "object") == 0)
        return cJSON_IsObject(v);
    if (strcmp(type, "array") == 0)
        return cJSON_IsArray(v);
    return false;
}

/* Whether v is of one of the schema's types (no "type": any). */
static bool of_types(const cJSON *s, const cJSON *v) {
    const cJSON *t = kw(s, "type");
    if (!t)
        return true;
    if (cJSON_IsString(t))
        return type_matches(t->valuestring, v);
    const cJSON *x;
    cJSON_ArrayForEach(x, t) if (cJSON_IsString(x) && type_matches(x->valuestring, v)) return true;
    return false;
}

static bool gen_enum(ctx *c, const cJSON *s, const cJSON *e, sbuf *out) {
    size_t old = enter(c, "enum");
    if (!cJSON_IsArray(e) || !e->child) {
        malformed(c, "'enum' must be a non-empty array");
        leave(c, old);
        return false;
    }
    puts_(out, "(");
    int n = 0;
    const cJSON *v;
    cJSON_ArrayForEach(v, e) {
        if (!of_types(s, v))
            continue; /* a value the schema's type refuses can never validate */
        if (n++)
            puts_(out, " | ");
        if (!gen_literal(c, v, out))
            break;
    }
    puts_(out, ")");
    if (n == 0)
        unsupported(c, "no value of 'enum' is of the schema's 'type': nothing can validate");
    leave(c, old);
    return c->st == SB_OK;
}

/* ---- numbers ---------------------------------------------------------------- */

/* The numerals of the integers in [x, y], x and y of n digits each
 * (digit strings), no sign. */
static void digits_range(sbuf *o, const char *x, const char *y, int n) {
    if (n == 0)
        return;
    if (x[0] == y[0]) {
        putf(o, "[%c]", x[0]);
        if (n > 1) {
            puts_(o, " ");
            digits_range(o, x + 1, y + 1, n - 1);
        }
        return;
    }
    bool x_floor = true, y_ceil = true;
    for (int i = 1; i < n; i++) {
        x_floor &= x[i] == '0';
        y_ceil &= y[i] == '9';
    }
    char nines[24], zeros[24];
    memset(nines, '9', sizeof nines);
    memset(zeros, '0', sizeof zeros);
    puts_(o, "(");
    const char *sep = "";
    char lo = x[0], hi = y[0];
    if (!x_floor) {
        putf(o, "[%c] ", x[0]);
        digits_range(o, x + 1, nines, n - 1);
        lo++;
        sep = " | ";
    }
    if (!y_ceil)
        hi--;
    if (lo <= hi) {
        putf(o, "%s[%c-%c]", sep, lo, hi);
        if (n > 1)
            putf(o, " [0-9]{%d}", n - 1);
        sep = " | ";
    }
    if (!y_ceil) {
        putf(o, "%s[%c] ", sep, y[0]);
        digits_range(o, zeros, y + 1, n - 1);
    }
    puts_(o, ")");
}

static int n_digits(uint64_t v) {
    int n = 1;
    while (v >= 10) {
        v /= 10;
        n++;
    }
    return n;
}

/* The numerals (no sign, no leading zeros) of the integers in [lo, hi], lo <= hi. */
static void uint_range(sbuf *o, uint64_t lo, uint64_t hi) {
    puts_(o, "(");
    uint64_t p = 1;
    for (int d = 1; d <= n_digits(hi); d++, p *= 10) {
        uint64_t a = SB_MAX(lo, d == 1 ? 0 : p), b = SB_MIN(hi, p * 10 - 1);
        if (a > b)
            continue;
        char xs[24], ys[24];
        snprintf(xs, sizeof xs, "%llu", (unsigned long long)a);
        snprintf(ys, sizeof ys, "%llu", (unsigned long long)b);
        if (o->n && o->p[o->n - 1] != '(')
            puts_(o, " | ");
        digits_range(o, xs, ys, d);
    }
    puts_(o, ")");
}

/* The integers in [lo, hi] with their sign. */
static void int_range(sbuf *o, int64_t lo, int64_t hi) {
    puts_(o, "(");
    if (hi >= 0)
        uint_range(o, (uint64_t)SB_MAX(lo, 0), (uint64_t)hi);
    if (lo < 0) {
        if (hi >= 0)
            puts_(o, " | ");
        puts_(o, "\"-\" ");
        uint_range(o, (uint64_t)(hi < 0 ? -hi : 1), (uint64_t)-lo);
    }
    puts_(o, ")");
}

/* A bound keyword: false if present and not a number. */
static bool get_bound(ctx *c, const cJSON *s, const char *name, double *v, bool *present) {
    const cJSON *b = kw(s, name);
    *present = b != NULL;
    if (!b)
        return true;
    if (!cJSON_IsNumber(b) || !isfinite(b->valuedouble)) {
        size_t old = enter(c, name);
        malformed(c, "'%s' must be a number", name);
        leave(c, old);
        return false;
    }
    *v = b->valuedouble;
    return true;
}

/* The smallest and largest integers the bounds allow, within 15 digits. */
static bool int_bounds(ctx *c, const cJSON *s, int64_t *lo, int64_t *hi, bool *bounded) {
    double min = 0, max = 0, xmin = 0, xmax = 0;
    bool has_min, has_max, has_xmin, has_xmax;
    if (!get_bound(c, s, "minimum", &min, &has_min) || !get_bound(c, s, "maximum", &max, &has_max) ||
        !get_bound(c, s, "exclusiveMinimum", &xmin, &has_xmin) ||
        !get_bound(c, s, "exclusiveMaximum", &xmax, &has_xmax))
        return false;
    double l = -(double)UNBOUNDED, h = (double)UNBOUNDED;
    if (has_min)
        l = SB_MAX(l, ceil(min));
    if (has_xmin)
        l = SB_MAX(l, floor(xmin) + 1);
    if (has_max)
        h = SB_MIN(h, floor(max));
    if (has_xmax)
        h = SB_MIN(h, ceil(xmax) - 1);
    *bounded = has_min || has_max || has_xmin || has_xmax;
    if (l > h)
        return unsupported(c, "the bounds leave no integer within 15 digits: nothing can be generated");
    *lo = (int64_t)l;
    *hi = (int64_t)h;
    return true;
}

static bool check_multiple_of(ctx *c, const cJSON *s, bool integer) {
    const cJSON *m = kw(s, "multipleOf");
    if (!m)
        return true;
    if (integer && cJSON_IsNumber(m) && m->valuedouble == 1)
        return true;
    size_t old = enter(c, "multipleOf");
    unsupported(c, "'multipleOf' is not supported (only 1, on integers)");
    leave(c, old);
    return false;
}

static bool gen_integer(ctx *c, const cJSON *s, sbuf *out) {
    int64_t lo, hi;
    bool bounded;
    if (!check_multiple_of(c, s, true) || !int_bounds(c, s, &lo, &hi, &bounded))
        return false;
    if (!bounded) {
        use(c, out, P_INTEGER, "integer");
        return true;
    }
    puts_(out, "(");
    int_range(out, lo, hi);
    puts_(out, " ");
    use(c, out, P_SPACE, "space");
    puts_(out, ")");
    return true;
}

/* Bounded numbers: the integers in bounds exactly, and fractions only on
 * integer parts n where every n.f (or -n.f) is in bounds; no exponents. */
static bool gen_number(ctx *c, const cJSON *s, sbuf *out) {
    int64_t lo, hi;
    bool bounded;
    if (!check_multiple_of(c, s, false) || !int_bounds(c, s, &lo, &hi, &bounded))
        return false;
    if (!bounded) {
        use(c, out, P_NUMBER, "number");
        return true;
    }
    puts_(out, "(");
    int_range(out, lo, hi);
    if (SB_MAX(lo, 0) <= hi - 1) {
        puts_(out, " | ");
        uint_range(out, (uint64_t)SB_MAX(lo, 0), (uint64_t)(hi - 1));
        puts_(out, " \".\" [0-9]{1,15}");
    }
    if (SB_MAX(1, -hi) <= -lo - 1) {
        puts_(out, " | \"-\" ");
        uint_range(out, (uint64_t)SB_MAX(1, -hi), (uint64_t)(-lo - 1));
        puts_(out, " \".\" [0-9]{1,15}");
    }
    puts_(out, ") ");
    use(c, out, P_SPACE, "space");
    return true;
}

/* ---- strings: lengths, formats, patterns --------------------------------------- */

#define JCHAR "[^\"\\\\\\x00-\\x1F\\x7F]"

static const struct {
    const char *name, *gbnf;
} formats[] = {
    /* Days 1..28 are valid in every month and year. */
    {"date", "[0-9]{4} \"-\" (\"0\" [1-9] | \"1\" [0-2]) \"-\" (\"0\" [1-9] | \"1\" [0-9] | \"2\" [0-8])"},
    {"time", "([01] [0-9] | \"2\" [0-3]) \":\" [0-5] [0-9] \":\" [0-5] [0-9] (\".\" [0-9]{1,6})? (\"Z\" | [+-] ([01] "
             "[0-9] | \"2\" [0-3]) \":\" [0-5] [0-9])"},
    {"date-time", "[0-9]{4} \"-\" (\"0\" [1-9] | \"1\" [0-2]) \"-\" (\"0\" [1-9] | \"1\" [0-9] | \"2\" [0-8]) \"T\" "
                  "([01] [0-9] | \"2\" [0-3]) \":\" [0-5] [0-9] \":\" [0-5] [0-9] (\".\" [0-9]{1,6})? (\"Z\" | [+-] "
                  "([01] [0-9] | \"2\" [0-3]) \":\" [0-5] [0-9])"},
    {"uuid", "[0-9a-f]{8} \"-\" [0-9a-f]{4} \"-\" [0-9a-f]{4} \"-\" [0-9a-f]{4} \"-\" [0-9a-f]{12}"},
    {"email", "[a-z0-9]{1,20} (\".\" [a-z0-9]{1,20})? \"@\" [a-z0-9]{1,20} (\".\" [a-z]{2,6}){1,2}"},
    {"ipv4", "(\"25\" [0-5] | \"2\" [0-4] [0-9] | \"1\" [0-9] [0-9] | [1-9] [0-9] | [0-9]) (\".\" (\"25\" [0-5] | "
             "\"2\" [0-4] [0-9] | \"1\" [0-9] [0-9] | [1-9] [0-9] | [0-9])){3}"},
    {"uri", "\"https://\" [a-z0-9]{1,20} (\".\" [a-z]{2,6}){1,2} (\"/\" [a-zA-Z0-9_-]{1,20}){0,4}"},
};

typedef struct {
    ctx *c;
    const char *s;
    size_t pos, len;
} regex;

static bool re_alt(regex *re, sbuf *o);

/* A code point of the pattern as a JSON-escaped GBNF literal. */
static void re_put_char(sbuf *o, uint32_t cp, const char *utf8, size_t n) {
    if (cp == '"')
        puts_(o, "\"\\\\\\\"\"");
    else if (cp == '\\')
        puts_(o, "\"\\\\\\\\\"");
    else if (cp == '\n')
        puts_(o, "\"\\\\n\"");
    else if (cp == '\t')
        puts_(o, "\"\\\\t\"");
    else if (cp == '\r')
        puts_(o, "\"\\\\r\"");
    else if (cp < 0x20 || cp == 0x7F)
        putf(o, "\"\\\\u%04X\"", cp);
    else
        put_literal(o, utf8, n);
}

static int re_peek(const regex *re) { return re->pos < re->len ? (unsigned char)re->s[re->pos] : -1; }

static bool re_fail(regex *re, const char *what) {
    size_t old = enter(re->c, "pattern");
    unsupported(re->c, "'pattern' %s at offset %zu (a regex subset: literals, classes, groups, |, quantifiers, "
                "anchors ^ and $ around the whole)", what, re->pos);
    leave(re->c, old);
    return false;
}

/* One UTF-8 character of the pattern. */
static uint32_t re_utf8(regex *re, size_t *n) {
    const unsigned char *p = (const unsigned char *)re->s + re->pos;
    size_t left = re->len - re->pos;
    uint32_t cp = p[0];
    size_t k = 1;
    if (cp >= 0xC0 && left >= 2 && cp < 0xE0)
        cp = (cp & 0x1F) << 6 | (p[1] & 0x3F), k = 2;
    else if (cp >= 0xE0 && left >= 3 && cp < 0xF0)
        cp = (cp & 0x0F) << 12 | (p[1] & 0x3F) << 6 | (p[2] & 0x3F), k = 3;
    else if (cp >= 0xF0 && left >= 4)
        cp = (cp & 0x07) << 18 | (p[1] & 0x3F) << 12 | (p[2] & 0x3F) << 6 | (p[3] & 0x3F), k = 4;
    *n = k;
    return cp;
}

/* Class shorthands: \d \w \s and their negations, as GBNF class contents. */
static const char *shorthand(int c, bool *negated) {
    *negated = c == 'D' || c == 'W' || c == 'S';
    switch (c) {
    case 'd': case 'D': return "0-9";
    case 'w': case 'W': return "a-zA-Z0-9_";
    case 's': case 'S': return " ";
    default: return NULL;
    }
}

/* A GBNF class item for code point cp (escaped as \x / \u). */
static void class_cp(sbuf *o, uint32_t cp) {
    if (cp < 0x80 && cp > 0x20 && !strchr("\\]^-[\"", (int)cp))
        putf(o, "%c", (char)cp);
    else if (cp <= 0xFFFF)
        putf(o, "\\u%04X", cp);
    else
        putf(o, "\\U%08X", cp);
}

/* [...] after the '['. Positive classes drop '"', '\' and control
 * characters (they would need escapes); negated ones exclude them too. */
static bool re_class(regex *re, sbuf *o) {
    bool negate = re_peek(re) == '^';
    if (negate)
        re->pos++;
    sbuf items = {0};
    bool first = true;
    while (re_peek(re) != ']' || first) {
        first = false;
        if (re_peek(re) < 0) {
            sb_free(items.p);
            return re_fail(re, "has an unterminated class");
        }
        uint32_t lo;
        size_t n = 1;
        if (re_peek(re) == '\\') {
            re->pos++;
            int e = re_peek(re);
            bool neg;
            const char *sh = shorthand(e, &neg);
            if (sh) {
                if (neg) {
                    sb_free(items.p);
                    return re_fail(re, "has a negated shorthand inside a class");
                }
                puts_(&items, sh);
                re->pos++;
                continue;
            }
            if (e < 0 || (e >= '0' && e <= '9') || (e >= 'a' && e <= 'z' && e != 'n' && e != 't' && e != 'r')) {
                sb_free(items.p);
                return re_fail(re, "has an unsupported escape in a class");
            }
            lo = e == 'n' ? '\n' : e == 't' ? '\t' : e == 'r' ? '\r' : (uint32_t)e;
            re->pos++;
        } else {
            lo = re_utf8(re, &n);
            re->pos += n;
        }
        uint32_t hi = lo;
        if (re_peek(re) == '-' && re->pos + 1 < re->len && re->s[re->pos + 1] != ']') {
            re->pos++;
            if (re_peek(re) == '\\') {
                sb_free(items.p);
                return re_fail(re, "has an escaped range end");
            }
            hi = re_utf8(re, &n);
            re->pos += n;
            if (hi < lo) {
                sb_free(items.p);
                return re_fail(re, "has a range whose end is below its start");
            }
        }
        /* Clip to what a JSON string holds unescaped. */
        for (uint32_t a = lo; a <= hi;) {
            if (a < 0x20 || a == '"' || a == '\\' || a == 0x7F) {
                a++;
                continue;
            }
            uint32_t b = a;
            while (b < hi && !(b + 1 < 0x20 || b + 1 == '"' || b + 1 == '\\' || b + 1 == 0x7F))
                b++;
            class_cp(&items, a);
            if (b > a) {
                puts_(&items, "-");
                class_cp(&items, b);
            }
            if (b == hi)
                break;
            a = b + 1;
        }
    }
    re->pos++;
    if (negate) {
        putf(o, "[^%s\"\\\\\\x00-\\x1F\\x7F]", items.p ? items.p : "");
    } else if (!items.n) {
        sb_free(items.p);
        return re_fail(re, "has a class of only characters a JSON string must escape");
    } else {
        putf(o, "[%s]", items.p);
    }
    bool ok = !items.oom;
    sb_free(items.p);
    return ok;
}

static bool re_count(regex *re, int64_t *v) {
    if (!(re_peek(re) >= '0' && re_peek(re) <= '9'))
        return re_fail(re, "has a malformed {m,n}");
    *v = 0;
    while (re_peek(re) >= '0' && re_peek(re) <= '9') {
        *v = *v * 10 + (re_peek(re) - '0');
        re->pos++;
        if (*v > 1000)
            return re_fail(re, "repeats more than 1000 times");
    }
    return true;
}

static bool re_atom(regex *re, sbuf *o) {
    int c = re_peek(re);
    if (c == '(') {
        re->pos++;
        if (re_peek(re) == '?') {
            if (re->pos + 1 < re->len && re->s[re->pos + 1] == ':')
                re->pos += 2;
            else
                return re_fail(re, "has a lookaround or named group");
        }
        puts_(o, "(");
        if (!re_alt(re, o))
            return false;
        if (re_peek(re) != ')')
            return re_fail(re, "has an unclosed group");
        re->pos++;
        puts_(o, ")");
        return true;
    }
    if (c == '[') {
        re->pos++;
        return re_class(re, o);
    }
    if (c == '.') {
        re->pos++;
        puts_(o, JCHAR);
        return true;
    }
    if (c == '^' || c == '$')
        return re_fail(re, "has an anchor inside it");
    if (c == '\\') {
        re->pos++;
        int e = re_peek(re);
        bool neg;
        const char *sh = shorthand(e, &neg);
        re->pos++;
        if (sh) {
            if (neg)
                putf(o, "[^%s\"\\\\\\x00-\\x1F\\x7F]", sh);
            else
                putf(o, "[%s]", sh);
            return true;
        }
        if (e == 'n' || e == 't' || e == 'r') {
            re_put_char(o, e == 'n' ? '\n' : e == 't' ? '\t' : '\r', NULL, 0);
            return true;
        }
        if (e < 0 || (e >= '0' && e <= '9') || (e >= 'a' && e <= 'z') || (e >= 'A' && e <= 'Z'))
            return re_fail(re, "has an unsupported escape");
        char ch = (char)e;
        re_put_char(o, (uint32_t)e, &ch, 1);
        return true;
    }
    if (c == '*' || c == '+' || c == '?' || c == '{' || c == ')' || c == '|')
        return re_fail(re, "has a misplaced operator");
    size_t n;
    uint32_t cp = re_utf8(re, &n);
    re_put_char(o, cp, re->s + re->pos, n);
    re->pos += n;
    return true;
}

static bool re_seq(regex *re, sbuf *o) {
    bool any = false;
    while (re_peek(re) >= 0 && re_peek(re) != '|' && re_peek(re) != ')') {
        if (any)
            puts_(o, " ");
        puts_(o, "(");
        if (!re_atom(re, o))
            return false;
        puts_(o, ")");
        any = true;
        int q = re_peek(re);
        if (q == '*' || q == '+' || q == '?') {
            putf(o, "%c", q);
            re->pos++;
        } else if (q == '{') {
            re->pos++;
            int64_t lo, hi;
            if (!re_count(re, &lo))
                return false;
            hi = lo;
            if (re_peek(re) == ',') {
                re->pos++;
                hi = -1;
                if (re_peek(re) != '}' && !re_count(re, &hi))
                    return false;
            }
            if (re_peek(re) != '}' || (hi >= 0 && hi < lo))
                return re_fail(re, "has a malformed {m,n}");
            re->pos++;
            if (hi < 0)
                putf(o, "{%lld,}", (long long)lo);
            else
                putf(o, "{%lld,%lld}", (long long)lo, (long long)hi);
        }
        if (re_peek(re) == '?' && (q == '*' || q == '+' || q == '?' || q == '{'))
            re->pos++; /* lazy: the same language */
    }
    if (!any)
        puts_(o, "\"\"");
    return true;
}

static bool re_alt(regex *re, sbuf *o) {
    for (;;) {
        if (!re_seq(re, o))
            return false;
        if (re_peek(re) != '|')
            return true;
        re->pos++;
        puts_(o, " | ");
    }
}

/* A pattern (a search: unanchored ends take any characters). */
static bool gen_pattern(ctx *c, const char *pat, sbuf *out) {
    regex re = {c, pat, 0, strlen(pat)};
    bool head = re.len && pat[0] == '^';
    bool tail = re.len > (size_t)head && pat[re.len - 1] == '$' && (re.len < 2 || pat[re.len - 2] != '\\');
    if (head)
        re.pos = 1;
    if (tail)
        re.len--;
    puts_(out, "\"\\\"\" ");
    if (!head)
        puts_(out, JCHAR "* ");
    puts_(out, "(");
    if (!re_alt(&re, out))
        return false;
    if (re.pos != re.len)
        return re_fail(&re, "has an unmatched ')'");
    puts_(out, ")");
    if (!tail)
        puts_(out, " " JCHAR "*");
    puts_(out, " \"\\\"\" ");
    use(c, out, P_SPACE, "space");
    return true;
}

static bool get_count(ctx *c, const cJSON *s, const char *name, int64_t *v, bool *present) {
    const cJSON *n = kw(s, name);
    *present = n != NULL;
    if (!n)
        return true;
    if (!cJSON_IsNumber(n) || n->valuedouble < 0 || n->valuedouble != floor(n->valuedouble) || n->valuedouble > 1e9) {
        size_t old = enter(c, name);
        malformed(c, "'%s' must be a non-negative integer", name);
        leave(c, old);
        return false;
    }
    *v = (int64_t)n->valuedouble;
    return true;
}

static bool gen_string(ctx *c, const cJSON *s, sbuf *out) {
    int64_t min = 0, max = -1;
    bool has_min, has_max;
    if (!get_count(c, s, "minLength", &min, &has_min) || !get_count(c, s, "maxLength", &max, &has_max))
        return false;
    const cJSON *fmt = kw(s, "format"), *pat = kw(s, "pattern");
    const char *mixed = fmt && pat ? "'format' with 'pattern'" : (fmt || pat) && (has_min || has_max)
                                                                      ? "'minLength'/'maxLength' with 'format' or 'pattern'"
                                                                      : NULL;
    if (mixed)
        return unsupported(c, "%s is not supported", mixed);
    if (fmt) {
        size_t old = enter(c, "format");
        if (!cJSON_IsString(fmt))
            return malformed(c, "'format' must be a string");
        for (size_t i = 0; i < SB_ARRAY_LEN(formats); i++)
            if (strcmp(formats[i].name, fmt->valuestring) == 0) {
                leave(c, old);
                putf(out, "\"\\\"\" %s \"\\\"\" ", formats[i].gbnf);
                use(c, out, P_SPACE, "space");
                return true;
            }
        return unsupported(c, "'format' '%.60s' is not supported (date, time, date-time, uuid, email, ipv4, uri are)",
                           fmt->valuestring);
    }
    if (pat) {
        if (!cJSON_IsString(pat)) {
            size_t old = enter(c, "pattern");
            malformed(c, "'pattern' must be a string");
            leave(c, old);
            return false;
        }
        return gen_pattern(c, pat->valuestring, out);
    }
    if (max >= 0 && max < min)
        return unsupported(c, "'maxLength' is below 'minLength': nothing can validate");
    if (min > MAX_STRING_LEN)
        return unsupported(c, "'minLength' above %d is not supported", MAX_STRING_LEN);
    if (!has_min && !has_max) {
        use(c, out, P_STRING, "string");
        return true;
    }
    /* A longer maxLength is kept to MAX_STRING_LEN: shorter strings still validate. */
    c->used |= P_CHAR;
    if (max < 0)
        putf(out, "\"\\\"\" char{%lld,} \"\\\"\" ", (long long)min);
    else
        putf(out, "\"\\\"\" char{%lld,%lld} \"\\\"\" ", (long long)min, (long long)SB_MIN(max, MAX_STRING_LEN));
    use(c, out, P_SPACE, "space");
    return true;
}

/* ---- objects and arrays ----------------------------------------------------------- */

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* JSON string content (between the quotes) that is none of names[0..n)
 * (sorted, sharing their first `at` bytes), in plain characters. */
static void key_except(ctx *c, sbuf *o, char **names, size_t n, size_t at) {
    bool is_name = n && strlen(names[0]) == at;
    size_t i = is_name ? 1 : 0;
    puts_(o, "(");
    sbuf firsts = {0};
    const char *sep = "";
    while (i < n) {
        char ch = names[i][at];
        size_t j = i;
        while (j < n && names[j][at] == ch)
            j++;
        putf(o, "%s", sep);
        put_literal(o, &ch, 1);
        puts_(o, " ");
        key_except(c, o, names + i, j - i, at + 1);
        class_cp(&firsts, (uint8_t)ch);
        sep = " | ";
        i = j;
    }
    putf(o, "%s[^%s\"\\\\\\x00-\\x1F\\x7F] ", sep, firsts.p ? firsts.p : "");
    use(c, o, P_KCHAR, "kchar*");
    puts_(o, is_name ? ")" : ")?");
    o->oom |= firsts.oom;
    sb_free(firsts.p);
}

typedef struct {
    const char *name;
    const cJSON *schema; /* NULL: any value */
    bool required;
} prop;

/* One "key": value, appended to out. */
static bool gen_kv(ctx *c, const prop *p, sbuf *out) {
    cJSON *key = cJSON_CreateString(p->name);
    char *text = key ? cJSON_PrintUnformatted(key) : NULL;
    cJSON_Delete(key);
    if (!text) {
        out->oom = true;
        return false;
    }
    put_literal(out, text, strlen(text));
    cJSON_free(text);
    puts_(out, " space \":\" space ");
    c->used |= P_SPACE;
    if (!p->schema) {
        use(c, out, P_VALUE, "value");
        return true;
    }
    size_t old = enter(c, "properties");
    enter(c, p->name);
    bool ok = gen_named(c, p->schema, out);
    leave(c, old);
    return ok;
}

static bool gen_object(ctx *c, const cJSON *s, sbuf *out) {
    const cJSON *props = kw(s, "properties"), *req = kw(s, "required"), *add = kw(s, "additionalProperties");
    if (props && !cJSON_IsObject(props))
        return malformed(c, "'properties' must be an object");
    if (req && !cJSON_IsArray(req))
        return malformed(c, "'required' must be an array of strings");
    if (add && !cJSON_IsBool(add) && !cJSON_IsObject(add))
        return malformed(c, "'additionalProperties' must be a boolean or a schema");
    /* Without properties an object takes any members unless told otherwise;
     * with them, no others unless additionalProperties says so (fewer
     * members always validate). */
    bool any_extra = add ? cJSON_IsTrue(add) || cJSON_IsObject(add) : !props;
    const cJSON *extra_schema = cJSON_IsObject(add) ? add : NULL;
    int n_props = props ? cJSON_GetArraySize(props) : 0, n_req = req ? cJSON_GetArraySize(req) : 0;
    if (!props && !req && !add) {
        puts_(out, "object");
        c->used |= P_VALUE | P_STRING | P_NUMBER | P_SPACE;
        return true;
    }
    prop *ps = sb_calloc((size_t)(n_props + n_req) + 1, sizeof *ps);
    char **names = sb_calloc((size_t)(n_props + n_req) + 1, sizeof *names);
    if (!ps || !names) {
        sb_free(ps);
        sb_free(names);
        out->oom = true;
        return false;
    }
    int n = 0;
    const cJSON *m;
    if (props)
        cJSON_ArrayForEach(m, props) ps[n++] = (prop){m->string, m, false};
    bool ok = true;
    if (req)
        cJSON_ArrayForEach(m, req) {
            if (!cJSON_IsString(m)) {
                ok = malformed(c, "'required' must be an array of strings");
                break;
            }
            int k = 0;
            while (k < n && strcmp(ps[k].name, m->valuestring) != 0)
                k++;
            if (k == n) { /* required but not described: a value additionalProperties allows */
                if (add && cJSON_IsFalse(add)) {
                    ok = unsupported(c, "'required' names '%.60s', which 'additionalProperties': false forbids",
                                     m->valuestring);
                    break;
                }
                ps[n++] = (prop){m->valuestring, extra_schema, true};
            }
            ps[k].required = true;
        }
    for (int i = 0; ok && i < n; i++) {
        names[i] = (char *)ps[i].name;
        for (const char *q = ps[i].name; any_extra && *q; q++)
            if ((unsigned char)*q < 0x20 || (unsigned char)*q >= 0x7F || *q == '"' || *q == '\\')
                ok = unsupported(c, "extra properties beside a property name with non-ASCII or escaped characters "
                                    "('%.60s') are not supported", ps[i].name);
    }
    /* Required members first, in order; then the optional ones, each
     * optional, in order; then extra members. T_i is a non-empty,
     * comma-separated, ordered choice from optional i onwards. */
    int first_opt_rule = c->next_id;
    int n_opt = 0;
    for (int i = 0; i < n; i++)
        n_opt += !ps[i].required;
    int n_tail = n_opt + (any_extra ? 1 : 0);
    c->next_id += n_tail;
    puts_(out, "\"{\" space ");
    c->used |= P_SPACE;
    int n_req_written = 0;
    for (int i = 0; ok && i < n; i++) {
        if (!ps[i].required)
            continue;
        if (n_req_written++)
            puts_(out, " \",\" space ");
        ok = gen_kv(c, &ps[i], out);
    }
    if (ok && n_tail) {
        putf(out, n_req_written ? " (\",\" space r%d)?" : " r%d?", first_opt_rule);
        int k = 0;
        for (int i = 0; ok && i <= n; i++) {
            if (i < n && ps[i].required)
                continue;
            if (i == n && !any_extra)
                break;
            sbuf body = {0};
            if (i < n) {
                ok = gen_kv(c, &ps[i], &body);
            } else {
                /* Extra members: keys that are none of the names. */
                qsort(names, (size_t)n, sizeof *names, cmp_str);
                sbuf kv = {0};
                puts_(&kv, "\"\\\"\" ");
                key_except(c, &kv, names, (size_t)n, 0);
                puts_(&kv, " \"\\\"\" space \":\" space ");
                if (extra_schema) {
                    size_t old = enter(c, "additionalProperties");
                    ok = gen_named(c, extra_schema, &kv);
                    leave(c, old);
                } else {
                    use(c, &kv, P_VALUE, "value");
                }
                int id = c->next_id++;
                putf(&c->rules, "r%d ::= %s\n", id, kv.p ? kv.p : "");
                c->rules.oom |= kv.oom;
                sb_free(kv.p);
                putf(&body, "r%d (\",\" space r%d)*", id, id);
            }
            if (ok) {
                int me = first_opt_rule + k;
                if (k + 1 < n_tail)
                    putf(&c->rules, "r%d ::= %s (\",\" space r%d)? | r%d\n", me, body.p, me + 1, me + 1);
                else
                    putf(&c->rules, "r%d ::= %s\n", me, body.p);
            }
            c->rules.oom |= body.oom;
            sb_free(body.p);
            k++;
        }
    }
    puts_(out, " \"}\" space");
    sb_free(ps);
    sb_free(names);
    return ok;
}

static bool gen_array(ctx *c, const cJSON *s, sbuf *out) {
    int64_t min = 0, max = -1;
    bool has_min, has_max;
    if (!get_count(c, s, "minItems", &min, &has_min) || !get_count(c, s, "maxItems", &max, &has_max))
        return false;
    const cJSON *u = kw(s, "uniqueItems");
    if (u && !cJSON_IsFalse(u)) {
        size_t old = enter(c, "uniqueItems");
        unsupported(c, "'uniqueItems' is not supported");
        leave(c, old);
        return false;
    }
    if (max >= 0 && max < min)
        return unsupported(c, "'maxItems' is below 'minItems': nothing can validate");
    if (min > 1000 || max > 1000) /* a larger maxItems would also do as unbounded, but keep grammars small */
        max = max > 1000 ? -1 : max;
    if (min > 1000)
        return unsupported(c, "'minItems' above 1000 is not supported");
    const cJSON *items = kw(s, "items");
    sbuf item = {0};
    bool ok = true;
    if (items) {
        if (!cJSON_IsObject(items) && !cJSON_IsBool(items)) {
            sb_free(item.p);
            return malformed(c, "'items' must be a schema (an object or a boolean)");
        }
        size_t old = enter(c, "items");
        ok = gen_named(c, items, &item);
        leave(c, old);
    } else {
        use(c, &item, P_VALUE, "value");
    }
    if (ok) {
        puts_(out, "\"[\" space ");
        c->used |= P_SPACE;
        if (max != 0) {
            putf(out, "(%s", item.p);
            if (max < 0)
                putf(out, " (\",\" space %s){%lld,}", item.p, (long long)SB_MAX(min - 1, 0));
            else if (max > 1)
                putf(out, " (\",\" space %s){%lld,%lld}", item.p, (long long)SB_MAX(min - 1, 0), (long long)max - 1);
            puts_(out, min > 0 ? ")" : ")?");
        }
        puts_(out, " \"]\" space");
    }
    out->oom |= item.oom;
    sb_free(item.p);
    return ok;
}

/* ---- schemas -------------------------------------------------------------------- */

/* The schema at a local JSON pointer ("#", "#/$defs/x", ...), or NULL. */
static const cJSON *resolve(const cJSON *root, const char *ref) {
    if (ref[0] != '#')
        return NULL;
    const cJSON *at = root;
    const char *p = ref + 1;
    while (*p == '/' && at) {
        p++;
        char seg[256];
        size_t n = 0;
        while (*p && *p != '/' && n + 1 < sizeof seg) {
            if (p[0] == '~' && (p[1] == '0' || p[1] == '1')) {
                seg[n++] = p[1] == '0' ? '~' : '/';
                p += 2;
            } else {
                seg[n++] = *p++;
            }
        }
        seg[n] = '\0';
        at = cJSON_IsArray(at) ? cJSON_GetArrayItem(at, atoi(seg)) : kw(at, seg);
    }
    return *p ? NULL : at;
}

static bool gen_ref(ctx *c, const cJSON *s, const cJSON *ref, sbuf *out) {
    size_t old = enter(c, "$ref");
    if (!cJSON_IsString(ref))
        return malformed(c, "'$ref' must be a string");
    const char *extra = other_constraint(s, (const char *const[]){"$ref", NULL});
    if (extra) {
        leave(c, old);
        enter(c, extra);
        return unsupported(c, "'%s' beside '$ref' is not supported", extra);
    }
    for (size_t i = 0; i < c->n_refs; i++)
        if (strcmp(c->refs[i].ref, ref->valuestring) == 0) {
            putf(out, "r%d", c->refs[i].id);
            leave(c, old);
            return true;
        }
    const cJSON *target = resolve(c->root, ref->valuestring);
    if (!target)
        return unsupported(c, "'$ref' '%.100s' does not resolve within the schema (only local refs are supported)",
                           ref->valuestring);
    if (c->n_refs == c->cap_refs) {
        size_t cap = c->cap_refs ? c->cap_refs * 2 : 8;
        ref_rule *r = sb_realloc(c->refs, cap * sizeof *r);
        if (!r) {
            out->oom = true;
            return false;
        }
        c->refs = r;
        c->cap_refs = cap;
    }
    int id = c->next_id++;
    char *name = sb_strndup(ref->valuestring, strlen(ref->valuestring));
    if (!name) {
        out->oom = true;
        return false;
    }
    c->refs[c->n_refs++] = (ref_rule){name, id};
    sbuf body = {0};
    /* Errors inside name the referenced schema's own path. */
    char saved[sizeof c->path];
    size_t saved_len = c->path_len;
    memcpy(saved, c->path, sizeof saved);
    snprintf(c->path, sizeof c->path, "%s", ref->valuestring + 1);
    c->path_len = strlen(c->path);
    bool ok = gen(c, target, &body);
    memcpy(c->path, saved, sizeof saved);
    c->path_len = saved_len;
    if (ok) {
        putf(&c->rules, "r%d ::= ", id);
        put(&c->rules, body.p, body.n);
        puts_(&c->rules, "\n");
        putf(out, "r%d", id);
    }
    c->rules.oom |= body.oom;
    sb_free(body.p);
    leave(c, old);
    return ok;
}

/* The JSON types a schema can produce, as bits (for oneOf's check). */
static unsigned type_bits(const cJSON *s) {
    static const char *const names[] = {"string", "number", "integer", "boolean", "null", "object", "array"};
    if (!cJSON_IsObject(s))
        return 0x7F;
    const cJSON *cst = kw(s, "const"), *en = kw(s, "enum"), *t = kw(s, "type");
    unsigned bits = 0;
    if (cst || en) {
        const cJSON *v = cst ? cst : en->child;
        for (; v; v = cst ? NULL : v->next)
            for (size_t i = 0; i < SB_ARRAY_LEN(names); i++)
                if (i != 2 && type_matches(names[i], v))
                    bits |= 1u << i;
        return bits;
    }
    if (!t)
        return 0x7F;
    for (const cJSON *x = cJSON_IsArray(t) ? t->child : t; x; x = cJSON_IsArray(t) ? x->next : NULL)
        for (size_t i = 0; i < SB_ARRAY_LEN(names); i++)
            if (cJSON_IsString(x) && strcmp(x->valuestring, names[i]) == 0)
                bits |= 1u << i | (i == 2 ? 2u : 0); /* an integer is a number */
    return bits & ~4u;
}

/* oneOf is enforced as anyOf where no value can match two branches: their
 * types differ, or they are objects whose const discriminator differs. */
static bool one_of_disjoint(const cJSON *a, const cJSON *b) {
    if (!(type_bits(a) & type_bits(b)))
        return true;
    const cJSON *pa = kw(a, "properties"), *pb = kw(b, "properties");
    const cJSON *m;
    cJSON_ArrayForEach(m, pa) {
        const cJSON *ca = kw(m, "const"), *other = kw(pb, m->string), *cb = other ? kw(other, "const") : NULL;
        const cJSON *ra = kw(a, "required"), *rb = kw(b, "required");
        bool req_a = false, req_b = false;
        const cJSON *x;
        cJSON_ArrayForEach(x, ra) req_a |= cJSON_IsString(x) && strcmp(x->valuestring, m->string) == 0;
        cJSON_ArrayForEach(x, rb) req_b |= cJSON_IsString(x) && strcmp(x->valuestring, m->string) == 0;
        if (ca && cb && req_a && req_b && !cJSON_Compare(ca, cb, true))
            return true;
    }
    return false;
}

static bool gen_choice(ctx *c, const cJSON *s, const char *key, const cJSON *list, sbuf *out) {
    size_t old = enter(c, key);
    if (!cJSON_IsArray(list) || !list->child)
        return malformed(c, "'%s' must be a non-empty array of schemas", key);
    const char *extra = other_constraint(s, (const char *const[]){key, NULL});
    if (extra) {
        leave(c, old);
        enter(c, extra);
        return unsupported(c, "'%s' beside '%s' is not supported (move it into each branch)", extra, key);
    }
    bool one = strcmp(key, "oneOf") == 0;
    if (strcmp(key, "allOf") == 0 && list->child->next)
        return unsupported(c, "'allOf' with more than one schema is not supported");
    puts_(out, "(");
    int i = 0;
    const cJSON *b;
    bool ok = true;
    cJSON_ArrayForEach(b, list) {
        if (one)
            for (const cJSON *o = list->child; o != b && ok; o = o->next)
                if (!one_of_disjoint(o, b))
                    ok = unsupported(c, "'oneOf' whose branches may overlap is not supported (use anyOf, or "
                                        "branches of different types or with different const values of a required "
                                        "property)");
        char seg[16];
        snprintf(seg, sizeof seg, "%d", i);
        size_t o2 = enter(c, seg);
        if (ok && i++)
            puts_(out, " | ");
        ok = ok && gen(c, b, out);
        leave(c, o2);
        if (!ok)
            break;
    }
    puts_(out, ")");
    leave(c, old);
    return ok;
}

static bool gen_type(ctx *c, const cJSON *s, const char *type, sbuf *out) {
    if (strcmp(type, "string") == 0)
        return gen_string(c, s, out);
    if (strcmp(type, "integer") == 0)
        return gen_integer(c, s, out);
    if (strcmp(type, "number") == 0)
        return gen_number(c, s, out);
    if (strcmp(type, "boolean") == 0) {
        puts_(out, "(\"true\" | \"false\") ");
        use(c, out, P_SPACE, "space");
        return true;
    }
    if (strcmp(type, "null") == 0) {
        puts_(out, "\"null\" ");
        use(c, out, P_SPACE, "space");
        return true;
    }
    if (strcmp(type, "object") == 0)
        return gen_object(c, s, out);
    if (strcmp(type, "array") == 0)
        return gen_array(c, s, out);
    size_t old = enter(c, "type");
    malformed(c, "'type' '%.40s' is not a JSON Schema type", type);
    leave(c, old);
    return false;
}

/* The type a schema without "type" implies by its keywords, or NULL (any). */
static const char *implied_type(const cJSON *s) {
    static const struct {
        const char *kw, *type;
    } implies[] = {{"properties", "object"}, {"required", "object"},      {"additionalProperties", "object"},
                   {"items", "array"},       {"minItems", "array"},       {"maxItems", "array"},
                   {"minLength", "string"},  {"maxLength", "string"},     {"pattern", "string"},
                   {"format", "string"},     {"minimum", "number"},       {"maximum", "number"},
                   {"exclusiveMinimum", "number"}, {"exclusiveMaximum", "number"}};
    for (size_t i = 0; i < SB_ARRAY_LEN(implies); i++)
        if (kw(s, implies[i].kw))
            return implies[i].type;
    return NULL;
}

static bool gen(ctx *c, const cJSON *s, sbuf *out) {
    if (c->st != SB_OK)
        return false;
    if (cJSON_IsTrue(s)) {
        use(c, out, P_VALUE, "value");
        c->used |= P_STRING | P_NUMBER | P_SPACE | P_CHAR;
        return true;
    }
    if (cJSON_IsFalse(s))
        return unsupported(c, "the schema false accepts nothing");
    if (!cJSON_IsObject(s))
        return malformed(c, "a schema must be an object or a boolean");
    if (++c->depth > MAX_DEPTH)
        return unsupported(c, "schemas nested more than %d deep are not supported", MAX_DEPTH);
    const cJSON *m;
    cJSON_ArrayForEach(m, s) {
        if (!in_list(annotations, m->string) && !in_list(handled, m->string)) {
            size_t old = enter(c, m->string);
            unsupported(c, "the keyword '%.60s' is not supported", m->string);
            leave(c, old);
            c->depth--;
            return false;
        }
    }
    bool ok;
    const cJSON *nullable = kw(s, "nullable");
    bool or_null = cJSON_IsTrue(nullable);
    if (or_null) {
        puts_(out, "(\"null\" ");
        use(c, out, P_SPACE, "space");
        puts_(out, " | ");
    }
    const cJSON *t = kw(s, "type");
    if (kw(s, "$ref")) {
        ok = gen_ref(c, s, kw(s, "$ref"), out);
    } else if (kw(s, "const")) {
        ok = gen_literal(c, kw(s, "const"), out);
    } else if (kw(s, "enum")) {
        ok = gen_enum(c, s, kw(s, "enum"), out);
    } else if (kw(s, "anyOf") || kw(s, "oneOf") || kw(s, "allOf")) {
        const char *key = kw(s, "anyOf") ? "anyOf" : kw(s, "oneOf") ? "oneOf" : "allOf";
        ok = gen_choice(c, s, key, kw(s, key), out);
    } else if (cJSON_IsString(t)) {
        ok = gen_type(c, s, t->valuestring, out);
    } else if (cJSON_IsArray(t) && t->child) {
        puts_(out, "(");
        ok = true;
        for (const cJSON *x = t->child; x && ok; x = x->next) {
            if (!cJSON_IsString(x)) {
                size_t old = enter(c, "type");
                ok = malformed(c, "'type' must be a string or an array of strings");
                leave(c, old);
                break;
            }
            if (x != t->child)
                puts_(out, " | ");
            ok = gen_type(c, s, x->valuestring, out);
        }
        puts_(out, ")");
    } else if (t) {
        size_t old = enter(c, "type");
        ok = malformed(c, "'type' must be a string or a non-empty array of strings");
        leave(c, old);
    } else if (implied_type(s)) {
        ok = gen_type(c, s, implied_type(s), out);
    } else {
        use(c, out, P_VALUE, "value");
        c->used |= P_STRING | P_NUMBER | P_SPACE | P_CHAR;
        ok = true;
    }
    if (or_null)
        puts_(out, ")");
    c->depth--;
    return ok;
}

sb_status sb_json_schema_to_gbnf(const cJSON *schema, char **gbnf, size_t *len, sb_error *err) {
    *gbnf = NULL;
    *len = 0;
    ctx c = {.root = schema, .err = err, .st = SB_OK};
    sbuf root = {0};
    bool ok = gen(&c, schema, &root);
    sbuf all = {0};
    if (ok) {
        putf(&all, "root ::= %s\n", root.p ? root.p : "");
        put(&all, c.rules.p ? c.rules.p : "", c.rules.n);
        unsigned used = c.used;
        if (used & P_VALUE)
            used |= P_STRING | P_NUMBER | P_SPACE;
        if (used & P_STRING)
            used |= P_CHAR | P_SPACE;
        if (used & (P_NUMBER | P_INTEGER))
            used |= P_SPACE;
        for (size_t i = 0; i < SB_ARRAY_LEN(primitive_rules); i++)
            if (used & (1u << i))
                puts_(&all, primitive_rules[i]);
    }
    bool oom = root.oom || c.rules.oom || all.oom;
    sb_free(root.p);
    sb_free(c.rules.p);
    for (size_t i = 0; i < c.n_refs; i++)
        sb_free(c.refs[i].ref);
    sb_free(c.refs);
    if (!ok || oom) {
        sb_free(all.p);
        return ok ? sb_fail(err, SB_ERR_NOMEM, "json schema: out of memory") : c.st;
    }
    *gbnf = all.p;
    *len = all.n;
    return SB_OK;
}

/* Prefixes every rule name of GBNF text: identifiers outside literals,
 * classes, repetition counts and comments. */
static bool prefix_names(const char *in, size_t n, const char *prefix, sbuf *out) {
    size_t plen = strlen(prefix);
    for (size_t i = 0; i < n;) {
        char ch = in[i];
        if (ch == '"' || ch == '[') {
            char end = ch == '"' ? '"' : ']';
            size_t j = i + 1;
            while (j < n && in[j] != end)
                j += in[j] == '\\' ? 2 : 1;
            j = SB_MIN(j + 1, n);
            put(out, in + i, j - i);
            i = j;
        } else if (ch == '{' || ch == '#') {
            size_t j = i;
            while (j < n && in[j] != (ch == '{' ? '}' : '\n'))
                j++;
            j = SB_MIN(j + 1, n);
            put(out, in + i, j - i);
            i = j;
        } else if ((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '-' ||
                   ch == '_') {
            size_t j = i;
            while (j < n && ((in[j] >= 'a' && in[j] <= 'z') || (in[j] >= 'A' && in[j] <= 'Z') ||
                             (in[j] >= '0' && in[j] <= '9') || in[j] == '-' || in[j] == '_'))
                j++;
            put(out, prefix, plen);
            put(out, in + i, j - i);
            i = j;
        } else {
            put(out, &ch, 1);
            i++;
        }
    }
    return !out->oom;
}

sb_status sb_json_schema_to_gbnf_prefixed(const cJSON *schema, const char *prefix, char **gbnf, size_t *len,
                                          sb_error *err) {
    char *plain;
    size_t n;
    sb_status st = sb_json_schema_to_gbnf(schema, &plain, &n, err);
    if (st != SB_OK)
        return st;
    sbuf out = {0};
    bool ok = prefix_names(plain, n, prefix, &out);
    sb_free(plain);
    if (!ok) {
        sb_free(out.p);
        return sb_fail(err, SB_ERR_NOMEM, "json schema: out of memory");
    }
    *gbnf = out.p;
    *len = out.n;
    return SB_OK;
}
