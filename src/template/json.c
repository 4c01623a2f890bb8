/*
 * json.c - JSON in and out of template values, as Python's json module does
 * it: json.loads for the chat input (ints stay ints, key order is kept) and
 * json.dumps for `tojson` (", "/": " separators, optional indent, non-ASCII
 * kept unless ensure_ascii).
 */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "template/value.h"

/* Deepest array/object nesting accepted in input. */
#define MAX_DEPTH 256

/* ---- parsing ------------------------------------------------------------------ */

typedef struct parser {
    const char *s;
    size_t len, pos;
    const char *what;
    sb_error *err;
} parser;

static sb_status parse_fail(parser *p, const char *msg) {
    size_t line = 1, col = 1;
    for (size_t i = 0; i < p->pos && i < p->len; i++) {
        if (p->s[i] == '\n') {
            line++;
            col = 1;
        } else if (((unsigned char)p->s[i] & 0xc0) != 0x80) {
            col++;
        }
    }
    return sb_fail(p->err, SB_ERR_INVALID_ARG, "%s: invalid JSON at line %zu column %zu: %s", p->what, line, col, msg);
}

static void skip_ws(parser *p) {
    while (p->pos < p->len && strchr(" \t\r\n", p->s[p->pos]) && p->s[p->pos])
        p->pos++;
}

static bool take(parser *p, const char *word) {
    size_t n = strlen(word);
    if (p->len - p->pos >= n && memcmp(p->s + p->pos, word, n) == 0) {
        p->pos += n;
        return true;
    }
    return false;
}

static int hex4(const char *s) {
    int v = 0;
    for (int i = 0; i < 4; i++) {
        char c = s[i];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0)
            return -1;
        v = v * 16 + d;
    }
    return v;
}

static sb_status parse_string(parser *p, sb_tpl_val *out) {
    sb_tpl_buf b = {0};
    sb_status st = SB_OK;
    p->pos++; /* opening quote */
    for (;;) {
        if (p->pos >= p->len) {
            st = parse_fail(p, "unterminated string");
            break;
        }
        size_t start = p->pos;
        while (p->pos < p->len && p->s[p->pos] != '"' && p->s[p->pos] != '\\' && (unsigned char)p->s[p->pos] >= 0x20)
            p->pos++;
        if ((st = sb_tpl_buf_put(&b, p->s + start, p->pos - start)))
            break;
        if (p->pos >= p->len)
            continue;
        char c = p->s[p->pos];
        if (c == '"') {
            p->pos++;
            st = sb_tpl_buf_take(&b, out);
            break;
        }
        if (c != '\\') {
            st = parse_fail(p, "control character in string");
            break;
        }
        if (p->pos + 1 >= p->len) {
            st = parse_fail(p, "unterminated string");
            break;
        }
        char e = p->s[p->pos + 1];
        const char *simple = strchr("\"\\/bfnrt", e);
        if (simple && e) {
            static const char map[] = "\"\\/\b\f\n\r\t";
            st = sb_tpl_buf_put(&b, &map[simple - "\"\\/bfnrt"], 1);
            p->pos += 2;
        } else if (e == 'u') {
            int cp = p->len - p->pos >= 6 ? hex4(p->s + p->pos + 2) : -1;
            if (cp < 0) {
                st = parse_fail(p, "invalid \\u escape");
                break;
            }
            p->pos += 6;
            if (cp >= 0xd800 && cp < 0xdc00 && p->len - p->pos >= 6 && p->s[p->pos] == '\\' &&
                p->s[p->pos + 1] == 'u') {
                int lo = hex4(p->s + p->pos + 2);
                if (lo >= 0xdc00 && lo < 0xe000) {
                    cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
                    p->pos += 6;
                }
            }
            char enc[4];
            st = sb_tpl_buf_put(&b, enc, sb_tpl_utf8_put((uint32_t)cp, enc));
        } else {
            st = parse_fail(p, "invalid escape");
        }
        if (st)
            break;
    }
    sb_tpl_buf_free(&b);
    return st;
}

static sb_status parse_number(parser *p, sb_tpl_val *out) {
    size_t start = p->pos;
    bool is_float = false;
    if (p->s[p->pos] == '-')
        p->pos++;
    if (p->pos >= p->len || !(p->s[p->pos] >= '0' && p->s[p->pos] <= '9'))
        return parse_fail(p, "invalid number");
    while (p->pos < p->len && ((p->s[p->pos] >= '0' && p->s[p->pos] <= '9') || strchr(".eE+-", p->s[p->pos]))) {
        if (strchr(".eE", p->s[p->pos]))
            is_float = true;
        p->pos++;
    }
    char tmp[64];
    size_t n = p->pos - start;
    if (n >= sizeof(tmp))
        return parse_fail(p, "number too long");
    memcpy(tmp, p->s + start, n);
    tmp[n] = '\0';
    char *end;
    if (!is_float) {
        errno = 0;
        long long v = strtoll(tmp, &end, 10);
        if (*end || errno)
            return parse_fail(p, "integer out of range");
        *out = sb_tpl_int(v);
        return SB_OK;
    }
    double d = strtod(tmp, &end);
    if (*end)
        return parse_fail(p, "invalid number");
    *out = sb_tpl_float(d);
    return SB_OK;
}

static sb_status parse_value(parser *p, int depth, sb_tpl_val *out);

static sb_status parse_container(parser *p, int depth, sb_tpl_val *out) {
    bool is_obj = p->s[p->pos] == '{';
    char close = is_obj ? '}' : ']';
    if (depth >= MAX_DEPTH)
        return parse_fail(p, "nested too deeply");
    sb_status st = is_obj ? sb_tpl_dict_new(SB_TPL_DICT, out) : sb_tpl_list_new(0, false, out);
    if (st)
        return st;
    p->pos++;
    skip_ws(p);
    if (p->pos < p->len && p->s[p->pos] == close) {
        p->pos++;
        return SB_OK;
    }
    for (;;) {
        sb_tpl_val key = sb_tpl_none(), val;
        skip_ws(p);
        if (is_obj) {
            if (p->pos >= p->len || p->s[p->pos] != '"') {
                st = parse_fail(p, "expected a string key");
                break;
            }
            if ((st = parse_string(p, &key)))
                break;
            skip_ws(p);
            if (p->pos >= p->len || p->s[p->pos] != ':') {
                sb_tpl_release(key);
                st = parse_fail(p, "expected ':'");
                break;
            }
            p->pos++;
        }
        if ((st = parse_value(p, depth + 1, &val))) {
            sb_tpl_release(key);
            break;
        }
        st = is_obj ? sb_tpl_dict_set(*out, key, val) : sb_tpl_list_push(*out, val);
        if (st)
            break;
        skip_ws(p);
        if (p->pos < p->len && p->s[p->pos] == ',') {
            p->pos++;
            continue;
        }
        if (p->pos < p->len && p->s[p->pos] == close) {
            p->pos++;
            return SB_OK;
        }
        st = parse_fail(p, is_obj ? "expected ',' or '}'" : "expected ',' or ']'");
        break;
    }
    sb_tpl_release(*out);
    *out = sb_tpl_none();
    return st;
}

static sb_status parse_value(parser *p, int depth, sb_tpl_val *out) {
    *out = sb_tpl_none();
    skip_ws(p);
    if (p->pos >= p->len)
        return parse_fail(p, "unexpected end of input");
    char c = p->s[p->pos];
    if (c == '{' || c == '[')
        return parse_container(p, depth, out);
    if (c == '"')
        return parse_string(p, out);
    if (c == '-' || (c >= '0' && c <= '9')) {
        if (take(p, "-Infinity")) {
            *out = sb_tpl_float(-INFINITY);
            return SB_OK;
        }
        return parse_number(p, out);
    }
    if (take(p, "true") || take(p, "false")) {
        *out = sb_tpl_bool(c == 't');
        return SB_OK;
    }
    if (take(p, "null"))
        return SB_OK;
    if (take(p, "NaN") || take(p, "Infinity")) {
        *out = sb_tpl_float(c == 'N' ? NAN : INFINITY);
        return SB_OK;
    }
    return parse_fail(p, "unexpected character");
}

sb_status sb_tpl_json_parse(const char *text, size_t len, const char *what, sb_tpl_val *out, sb_error *err) {
    parser p = {.s = text, .len = len, .what = what, .err = err};
    sb_status st = parse_value(&p, 0, out);
    if (st)
        return st;
    skip_ws(&p);
    if (p.pos < p.len) {
        sb_tpl_release(*out);
        *out = sb_tpl_none();
        return parse_fail(&p, "extra data after the value");
    }
    return SB_OK;
}

/* ---- dumping ------------------------------------------------------------------ */

static sb_status dump_string(sb_tpl_buf *b, const char *s, size_t len, bool ensure_ascii) {
    sb_status st = sb_tpl_buf_put(b, "\"", 1);
    for (size_t pos = 0; pos < len && !st;) {
        size_t start = pos;
        uint32_t c = sb_tpl_utf8_next(s, len, &pos);
        const char *esc = c == '"' ? "\\\"" : c == '\\' ? "\\\\" : c == '\n' ? "\\n" : c == '\r' ? "\\r"
                        : c == '\t' ? "\\t" : c == '\b' ? "\\b" : c == '\f' ? "\\f" : NULL;
        if (esc)
            st = sb_tpl_buf_puts(b, esc);
        else if (c < 0x20 || (ensure_ascii && c >= 0x80 && c < 0x10000))
            st = sb_tpl_buf_printf(b, "\\u%04x", (unsigned)c);
        else if (ensure_ascii && c >= 0x10000)
            st = sb_tpl_buf_printf(b, "\\u%04x\\u%04x", (unsigned)(0xd800 + ((c - 0x10000) >> 10)),
                                   (unsigned)(0xdc00 + ((c - 0x10000) & 0x3ff)));
        else
            st = sb_tpl_buf_put(b, s + start, pos - start);
    }
    return st ? st : sb_tpl_buf_put(b, "\"", 1);
}

static sb_status dump_newline(sb_tpl_buf *b, const sb_tpl_json_opts *o, int level) {
    if (o->indent < 0)
        return SB_OK;
    sb_status st = sb_tpl_buf_put(b, "\n", 1);
    for (int i = 0; i < level * o->indent && !st; i++)
        st = sb_tpl_buf_put(b, " ", 1);
    return st;
}

/* A dict key as json.dumps converts it (str, int, float, bool, None). */
static sb_status dump_key(sb_tpl_buf *b, sb_tpl_val k, const sb_tpl_json_opts *o, const char **why) {
    sb_tpl_buf tmp = {0};
    sb_status st;
    switch (k.kind) {
    case SB_TPL_STR:
        return dump_string(b, k.s->data, k.s->len, o->ensure_ascii);
    case SB_TPL_NONE:
        return sb_tpl_buf_puts(b, "\"null\"");
    case SB_TPL_BOOL:
        return sb_tpl_buf_puts(b, k.b ? "\"true\"" : "\"false\"");
    case SB_TPL_INT:
    case SB_TPL_FLOAT:
        st = sb_tpl_write_str(&tmp, k);
        if (!st)
            st = dump_string(b, tmp.p, tmp.len, false);
        sb_tpl_buf_free(&tmp);
        return st;
    default:
        *why = "keys must be str, int, float, bool or None";
        return SB_ERR_INVALID_ARG;
    }
}

static int key_cmp(const void *a, const void *b) {
    const sb_tpl_val *x = *(const sb_tpl_val *const *)a, *y = *(const sb_tpl_val *const *)b;
    int c = 0;
    sb_tpl_order(*x, *y, &c);
    return c;
}

static sb_status dump(sb_tpl_buf *b, sb_tpl_val v, const sb_tpl_json_opts *o, int level, const char **why) {
    const char *item_sep = o->item_sep ? o->item_sep : o->indent >= 0 ? "," : ", ";
    const char *key_sep = o->key_sep ? o->key_sep : ": ";
    sb_status st = SB_OK;
    switch (v.kind) {
    case SB_TPL_NONE:
        return sb_tpl_buf_puts(b, "null");
    case SB_TPL_BOOL:
        return sb_tpl_buf_puts(b, v.b ? "true" : "false");
    case SB_TPL_INT:
        return sb_tpl_write_str(b, v);
    case SB_TPL_FLOAT:
        if (isnan(v.f))
            return sb_tpl_buf_puts(b, "NaN");
        if (isinf(v.f))
            return sb_tpl_buf_puts(b, v.f < 0 ? "-Infinity" : "Infinity");
        return sb_tpl_write_float(b, v.f);
    case SB_TPL_STR:
        return dump_string(b, v.s->data, v.s->len, o->ensure_ascii);
    case SB_TPL_LIST:
        if (v.l->n == 0)
            return sb_tpl_buf_puts(b, "[]");
        st = sb_tpl_buf_puts(b, "[");
        for (size_t i = 0; i < v.l->n && !st; i++) {
            if (i)
                st = sb_tpl_buf_puts(b, item_sep);
            if (!st)
                st = dump_newline(b, o, level + 1);
            if (!st)
                st = dump(b, v.l->items[i], o, level + 1, why);
        }
        if (!st)
            st = dump_newline(b, o, level);
        return st ? st : sb_tpl_buf_puts(b, "]");
    case SB_TPL_DICT: {
        if (v.d->n == 0)
            return sb_tpl_buf_puts(b, "{}");
        /* Order of keys: insertion, or sorted (through an index array). */
        const sb_tpl_val **order = sb_calloc(v.d->n, sizeof(*order));
        if (!order)
            return SB_ERR_NOMEM;
        for (size_t i = 0; i < v.d->n; i++)
            order[i] = &v.d->keys[i];
        if (o->sort_keys)
            qsort(order, v.d->n, sizeof(*order), key_cmp);
        st = sb_tpl_buf_puts(b, "{");
        for (size_t i = 0; i < v.d->n && !st; i++) {
            size_t k = (size_t)(order[i] - v.d->keys);
            if (i)
                st = sb_tpl_buf_puts(b, item_sep);
            if (!st)
                st = dump_newline(b, o, level + 1);
            if (!st)
                st = dump_key(b, v.d->keys[k], o, why);
            if (!st)
                st = sb_tpl_buf_puts(b, key_sep);
            if (!st)
                st = dump(b, v.d->vals[k], o, level + 1, why);
        }
        sb_free(order);
        if (!st)
            st = dump_newline(b, o, level);
        return st ? st : sb_tpl_buf_puts(b, "}");
    }
    case SB_TPL_UNDEFINED:
        *why = "Object of type Undefined is not JSON serializable";
        return SB_ERR_INVALID_ARG;
    case SB_TPL_NAMESPACE:
        *why = "Object of type Namespace is not JSON serializable";
        return SB_ERR_INVALID_ARG;
    default:
        *why = "Object of type function is not JSON serializable";
        return SB_ERR_INVALID_ARG;
    }
}

sb_status sb_tpl_write_json(sb_tpl_buf *b, sb_tpl_val v, const sb_tpl_json_opts *opts, const char **why) {
    *why = NULL;
    return dump(b, v, opts, 0, why);
}
