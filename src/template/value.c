/*
 * value.c - template values: reference counting, strings and UTF-8, lists
 * and ordered dicts, and the Python semantics of truth, equality, ordering,
 * str() and repr() that show in rendered text.
 */
#include "template/value.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"

/* Deepest list/dict nesting a value may have (keeps every recursive walk,
 * including release, within a bounded stack). */
#define MAX_NEST 512

/* ---- reference counting ---------------------------------------------------- */

static int32_t *refs_of(sb_tpl_val v) {
    switch (v.kind) {
    case SB_TPL_STR:
        return &v.s->refs;
    case SB_TPL_UNDEFINED:
        return v.s ? &v.s->refs : NULL;
    case SB_TPL_LIST:
        return &v.l->refs;
    case SB_TPL_DICT:
    case SB_TPL_NAMESPACE:
        return &v.d->refs;
    case SB_TPL_FUNC:
        return (int32_t *)v.fn; /* sb_tpl_func starts with its count */
    default:
        return NULL;
    }
}

sb_tpl_val sb_tpl_retain(sb_tpl_val v) {
    int32_t *r = refs_of(v);
    if (r && *r >= 0)
        ++*r;
    return v;
}

static void dict_free(sb_tpl_dict *d) {
    for (size_t i = 0; i < d->n; i++) {
        sb_tpl_release(d->keys[i]);
        sb_tpl_release(d->vals[i]);
    }
    sb_free(d->keys);
    sb_free(d->vals);
    sb_free(d);
}

void sb_tpl_release(sb_tpl_val v) {
    int32_t *r = refs_of(v);
    if (!r || *r < 0 || --*r > 0)
        return;
    switch (v.kind) {
    case SB_TPL_LIST:
        for (size_t i = 0; i < v.l->n; i++)
            sb_tpl_release(v.l->items[i]);
        sb_free(v.l->items);
        sb_free(v.l);
        break;
    case SB_TPL_DICT:
    case SB_TPL_NAMESPACE:
        dict_free(v.d);
        break;
    case SB_TPL_FUNC:
        sb_tpl_func_free(v.fn);
        break;
    default: /* strings, and the hint string of an Undefined */
        sb_free(v.s);
        break;
    }
}

void sb_tpl_make_immortal(sb_tpl_val v) {
    if (v.kind == SB_TPL_STR)
        v.s->refs = -1;
}

void sb_tpl_free_immortal(sb_tpl_val v) {
    if (v.kind == SB_TPL_STR)
        sb_free(v.s);
}

/* ---- strings and UTF-8 ------------------------------------------------------ */

sb_status sb_tpl_str_new(const char *s, size_t len, sb_tpl_val *out) {
    *out = sb_tpl_none();
    if (len > SB_TPL_MAX_BYTES)
        return SB_ERR_UNSUPPORTED;
    sb_tpl_str *str = sb_malloc(sizeof(*str) + len + 1);
    if (!str)
        return SB_ERR_NOMEM;
    str->refs = 1;
    str->len = len;
    str->ascii = true;
    for (size_t i = 0; i < len; i++)
        if ((unsigned char)s[i] >= 0x80) {
            str->ascii = false;
            break;
        }
    if (len)
        memcpy(str->data, s, len);
    str->data[len] = '\0';
    *out = (sb_tpl_val){.kind = SB_TPL_STR, .s = str};
    return SB_OK;
}

uint32_t sb_tpl_utf8_next(const char *s, size_t len, size_t *pos) {
    const unsigned char *p = (const unsigned char *)s + *pos;
    size_t left = len - *pos;
    uint32_t c = p[0];
    size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (n <= 1 || n > left) {
        *pos += 1;
        return c;
    }
    uint32_t cp = c & (0x7f >> n);
    for (size_t i = 1; i < n; i++) {
        if ((p[i] & 0xc0) != 0x80) {
            *pos += 1;
            return c;
        }
        cp = (cp << 6) | (p[i] & 0x3f);
    }
    *pos += n;
    return cp;
}

size_t sb_tpl_utf8_put(uint32_t cp, char *out) {
    unsigned char *o = (unsigned char *)out;
    if (cp < 0x80) {
        o[0] = (unsigned char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (unsigned char)(0xc0 | (cp >> 6));
        o[1] = (unsigned char)(0x80 | (cp & 0x3f));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (unsigned char)(0xe0 | (cp >> 12));
        o[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3f));
        o[2] = (unsigned char)(0x80 | (cp & 0x3f));
        return 3;
    }
    o[0] = (unsigned char)(0xf0 | (cp >> 18));
    o[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3f));
    o[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3f));
    o[3] = (unsigned char)(0x80 | (cp & 0x3f));
    return 4;
}

size_t sb_tpl_str_chars(const sb_tpl_str *s) {
    if (s->ascii)
        return s->len;
    size_t n = 0;
    for (size_t pos = 0; pos < s->len; n++)
        sb_tpl_utf8_next(s->data, s->len, &pos);
    return n;
}

size_t sb_tpl_str_offset(const sb_tpl_str *s, size_t index) {
    if (s->ascii)
        return index < s->len ? index : s->len;
    size_t pos = 0;
    for (size_t i = 0; i < index && pos < s->len; i++)
        sb_tpl_utf8_next(s->data, s->len, &pos);
    return pos;
}

const char *sb_tpl_find_bytes(const char *hay, size_t hay_len, const char *needle, size_t needle_len) {
    if (needle_len == 0)
        return hay;
    for (size_t i = 0; i + needle_len <= hay_len; i++)
        if (hay[i] == needle[0] && memcmp(hay + i, needle, needle_len) == 0)
            return hay + i;
    return NULL;
}

bool sb_tpl_is_space(uint32_t c) {
    return (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xa0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 || c == 0x202f || c == 0x205f || c == 0x3000;
}

/* Python's str.isprintable() for non-ASCII code points, except that
 * unassigned code points count as printable (no Unicode database here). */
static bool is_printable(uint32_t c) {
    static const uint32_t ranges[][2] = {
        {0x80, 0xA0},       {0xAD, 0xAD},       {0x600, 0x605},     {0x61C, 0x61C},     {0x6DD, 0x6DD},
        {0x70F, 0x70F},     {0x890, 0x891},     {0x8E2, 0x8E2},     {0x1680, 0x1680},   {0x180E, 0x180E},
        {0x2000, 0x200F},   {0x2028, 0x202F},   {0x205F, 0x2064},   {0x2066, 0x206F},   {0x3000, 0x3000},
        {0xD800, 0xF8FF},   {0xFEFF, 0xFEFF},   {0xFFF9, 0xFFFB},   {0x110BD, 0x110BD}, {0x110CD, 0x110CD},
        {0x13430, 0x13438}, {0x1BCA0, 0x1BCA3}, {0x1D173, 0x1D17A}, {0xE0001, 0xE0001}, {0xE0020, 0xE007F},
        {0xF0000, 0xFFFFD}, {0x100000, 0x10FFFD},
    };
    for (size_t i = 0; i < SB_ARRAY_LEN(ranges); i++)
        if (c >= ranges[i][0] && c <= ranges[i][1])
            return false;
    return true;
}

/* ---- buffers ------------------------------------------------------------------ */

sb_status sb_tpl_buf_put(sb_tpl_buf *b, const char *s, size_t len) {
    if (len > SB_TPL_MAX_BYTES - b->len)
        return SB_ERR_UNSUPPORTED;
    if (b->len + len + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap < b->len + len + 1)
            cap *= 2;
        char *p = sb_realloc(b->p, cap);
        if (!p)
            return SB_ERR_NOMEM;
        b->p = p;
        b->cap = cap;
    }
    if (len)
        memcpy(b->p + b->len, s, len);
    b->len += len;
    b->p[b->len] = '\0';
    return SB_OK;
}

sb_status sb_tpl_buf_puts(sb_tpl_buf *b, const char *s) { return sb_tpl_buf_put(b, s, strlen(s)); }

sb_status sb_tpl_buf_printf(sb_tpl_buf *b, const char *fmt, ...) {
    char tmp[128];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof(tmp), fmt, ap);
    va_end(ap);
    return sb_tpl_buf_put(b, tmp, n < 0 ? 0 : (size_t)n < sizeof(tmp) ? (size_t)n : sizeof(tmp) - 1);
}

sb_status sb_tpl_buf_take(sb_tpl_buf *b, sb_tpl_val *out) {
    sb_status st = sb_tpl_str_new(b->p ? b->p : "", b->len, out);
    b->len = 0;
    return st;
}

void sb_tpl_buf_free(sb_tpl_buf *b) {
    sb_free(b->p);
    *b = (sb_tpl_buf){0};
}

/* ---- lists and dicts ---------------------------------------------------------- */

/* Nesting depth of v if it is a container, else 0. */
static unsigned depth_of(sb_tpl_val v) {
    if (v.kind == SB_TPL_LIST)
        return v.l->depth;
    if (v.kind == SB_TPL_DICT || v.kind == SB_TPL_NAMESPACE)
        return v.d->depth;
    return 0;
}

sb_status sb_tpl_list_new(size_t cap, bool tuple, sb_tpl_val *out) {
    *out = sb_tpl_none();
    sb_tpl_list *l = sb_calloc(1, sizeof(*l));
    sb_tpl_val *items = cap ? sb_calloc(cap, sizeof(*items)) : NULL;
    if (!l || (cap && !items)) {
        sb_free(l);
        sb_free(items);
        return SB_ERR_NOMEM;
    }
    *l = (sb_tpl_list){.refs = 1, .tuple = tuple, .depth = 1, .cap = cap, .items = items};
    *out = (sb_tpl_val){.kind = SB_TPL_LIST, .l = l};
    return SB_OK;
}

sb_status sb_tpl_list_push(sb_tpl_val list, sb_tpl_val item) {
    sb_tpl_list *l = list.l;
    unsigned d = depth_of(item) + 1;
    if (d > MAX_NEST) {
        sb_tpl_release(item);
        return SB_ERR_UNSUPPORTED;
    }
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 4;
        sb_tpl_val *items = sb_realloc(l->items, cap * sizeof(*items));
        if (!items) {
            sb_tpl_release(item);
            return SB_ERR_NOMEM;
        }
        l->items = items;
        l->cap = cap;
    }
    l->items[l->n++] = item;
    if (d > l->depth)
        l->depth = (uint16_t)d;
    return SB_OK;
}

sb_status sb_tpl_dict_new(sb_tpl_kind kind, sb_tpl_val *out) {
    sb_tpl_dict *d = sb_calloc(1, sizeof(*d));
    if (!d) {
        *out = sb_tpl_none();
        return SB_ERR_NOMEM;
    }
    d->refs = 1;
    d->depth = 1;
    *out = (sb_tpl_val){.kind = kind, .d = d};
    return SB_OK;
}

ptrdiff_t sb_tpl_dict_find(const sb_tpl_dict *d, sb_tpl_val key) {
    for (size_t i = 0; i < d->n; i++)
        if (sb_tpl_equal(d->keys[i], key))
            return (ptrdiff_t)i;
    return -1;
}

const sb_tpl_val *sb_tpl_dict_get(const sb_tpl_dict *d, const char *key) {
    size_t len = strlen(key);
    for (size_t i = 0; i < d->n; i++)
        if (d->keys[i].kind == SB_TPL_STR && d->keys[i].s->len == len && memcmp(d->keys[i].s->data, key, len) == 0)
            return &d->vals[i];
    return NULL;
}

sb_status sb_tpl_dict_set(sb_tpl_val dict, sb_tpl_val key, sb_tpl_val val) {
    sb_tpl_dict *d = dict.d;
    unsigned depth = depth_of(val) + 1;
    if (depth > MAX_NEST) {
        sb_tpl_release(key);
        sb_tpl_release(val);
        return SB_ERR_UNSUPPORTED;
    }
    if (depth > d->depth)
        d->depth = (uint16_t)depth;
    ptrdiff_t at = sb_tpl_dict_find(d, key);
    if (at >= 0) {
        sb_tpl_release(key);
        sb_tpl_release(d->vals[at]);
        d->vals[at] = val;
        return SB_OK;
    }
    if (d->n == d->cap) {
        size_t cap = d->cap ? d->cap * 2 : 4;
        sb_tpl_val *keys = sb_realloc(d->keys, cap * sizeof(*keys));
        if (keys)
            d->keys = keys;
        sb_tpl_val *vals = keys ? sb_realloc(d->vals, cap * sizeof(*vals)) : NULL;
        if (!vals) {
            sb_tpl_release(key);
            sb_tpl_release(val);
            return SB_ERR_NOMEM;
        }
        d->vals = vals;
        d->cap = cap;
    }
    d->keys[d->n] = key;
    d->vals[d->n] = val;
    d->n++;
    return SB_OK;
}

/* ---- Python semantics -------------------------------------------------------- */

static bool is_number(sb_tpl_val v) { return v.kind == SB_TPL_BOOL || v.kind == SB_TPL_INT || v.kind == SB_TPL_FLOAT; }

static double as_double(sb_tpl_val v) {
    return v.kind == SB_TPL_FLOAT ? v.f : v.kind == SB_TPL_INT ? (double)v.i : (double)v.b;
}

static int64_t as_int(sb_tpl_val v) { return v.kind == SB_TPL_INT ? v.i : (int64_t)v.b; }

bool sb_tpl_truthy(sb_tpl_val v) {
    switch (v.kind) {
    case SB_TPL_UNDEFINED:
    case SB_TPL_NONE:
        return false;
    case SB_TPL_BOOL:
        return v.b;
    case SB_TPL_INT:
        return v.i != 0;
    case SB_TPL_FLOAT:
        return v.f != 0.0;
    case SB_TPL_STR:
        return v.s->len > 0;
    case SB_TPL_LIST:
        return v.l->n > 0;
    case SB_TPL_DICT:
        return v.d->n > 0;
    default:
        return true;
    }
}

bool sb_tpl_equal(sb_tpl_val a, sb_tpl_val b) {
    if (is_number(a) && is_number(b)) {
        if (a.kind != SB_TPL_FLOAT && b.kind != SB_TPL_FLOAT)
            return as_int(a) == as_int(b);
        return as_double(a) == as_double(b);
    }
    if (a.kind != b.kind)
        return false;
    switch (a.kind) {
    case SB_TPL_UNDEFINED:
    case SB_TPL_NONE:
        return true;
    case SB_TPL_STR:
        return a.s->len == b.s->len && memcmp(a.s->data, b.s->data, a.s->len) == 0;
    case SB_TPL_LIST:
        if (a.l->tuple != b.l->tuple || a.l->n != b.l->n)
            return false;
        for (size_t i = 0; i < a.l->n; i++)
            if (!sb_tpl_equal(a.l->items[i], b.l->items[i]))
                return false;
        return true;
    case SB_TPL_DICT:
        if (a.d->n != b.d->n)
            return false;
        for (size_t i = 0; i < a.d->n; i++) {
            ptrdiff_t j = sb_tpl_dict_find(b.d, a.d->keys[i]);
            if (j < 0 || !sb_tpl_equal(a.d->vals[i], b.d->vals[j]))
                return false;
        }
        return true;
    case SB_TPL_NAMESPACE:
        return a.d == b.d;
    case SB_TPL_FUNC:
        return a.fn == b.fn;
    default:
        return false;
    }
}

bool sb_tpl_order(sb_tpl_val a, sb_tpl_val b, int *cmp) {
    if (is_number(a) && is_number(b)) {
        if (a.kind != SB_TPL_FLOAT && b.kind != SB_TPL_FLOAT) {
            int64_t x = as_int(a), y = as_int(b);
            *cmp = x < y ? -1 : x > y;
        } else {
            double x = as_double(a), y = as_double(b);
            if (isnan(x) || isnan(y))
                *cmp = 2; /* unordered: every comparison is false */
            else
                *cmp = x < y ? -1 : x > y;
        }
        return true;
    }
    if (a.kind == SB_TPL_STR && b.kind == SB_TPL_STR) {
        size_t n = SB_MIN(a.s->len, b.s->len);
        int c = memcmp(a.s->data, b.s->data, n); /* UTF-8 byte order is code point order */
        *cmp = c < 0 ? -1 : c > 0 ? 1 : a.s->len < b.s->len ? -1 : a.s->len > b.s->len;
        return true;
    }
    if (a.kind == SB_TPL_LIST && b.kind == SB_TPL_LIST && a.l->tuple == b.l->tuple) {
        for (size_t i = 0; i < a.l->n && i < b.l->n; i++)
            if (!sb_tpl_equal(a.l->items[i], b.l->items[i]))
                return sb_tpl_order(a.l->items[i], b.l->items[i], cmp);
        *cmp = a.l->n < b.l->n ? -1 : a.l->n > b.l->n;
        return true;
    }
    return false;
}

const char *sb_tpl_type_name(sb_tpl_val v) {
    switch (v.kind) {
    case SB_TPL_UNDEFINED:
        return "Undefined";
    case SB_TPL_NONE:
        return "NoneType";
    case SB_TPL_BOOL:
        return "bool";
    case SB_TPL_INT:
        return "int";
    case SB_TPL_FLOAT:
        return "float";
    case SB_TPL_STR:
        return "str";
    case SB_TPL_LIST:
        return v.l->tuple ? "tuple" : "list";
    case SB_TPL_DICT:
        return "dict";
    case SB_TPL_NAMESPACE:
        return "Namespace";
    default:
        return "function";
    }
}

sb_status sb_tpl_write_float(sb_tpl_buf *b, double f) {
    if (isnan(f))
        return sb_tpl_buf_puts(b, "nan");
    if (isinf(f))
        return sb_tpl_buf_puts(b, f < 0 ? "-inf" : "inf");
    /* Shortest digits that read back as f, as Python's repr finds them. */
    char tmp[40];
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(tmp, sizeof(tmp), "%.*e", prec - 1, f);
        if (strtod(tmp, NULL) == f)
            break;
    }
    char digits[24];
    size_t nd = 0;
    const char *p = tmp;
    bool neg = *p == '-';
    if (neg)
        p++;
    for (; *p && *p != 'e'; p++)
        if (*p != '.')
            digits[nd++] = *p;
    int exp = atoi(p + 1);
    while (nd > 1 && digits[nd - 1] == '0')
        nd--;
    char out[64];
    size_t o = 0;
    if (neg)
        out[o++] = '-';
    if (exp >= -4 && exp < 16) {
        if (exp < 0) {
            out[o++] = '0';
            out[o++] = '.';
            for (int i = -1; i > exp; i--)
                out[o++] = '0';
            for (size_t i = 0; i < nd; i++)
                out[o++] = digits[i];
        } else {
            for (int i = 0; i <= exp; i++)
                out[o++] = (size_t)i < nd ? digits[i] : '0';
            out[o++] = '.';
            if ((size_t)exp + 1 < nd)
                for (size_t i = (size_t)exp + 1; i < nd; i++)
                    out[o++] = digits[i];
            else
                out[o++] = '0';
        }
    } else {
        out[o++] = digits[0];
        if (nd > 1) {
            out[o++] = '.';
            for (size_t i = 1; i < nd; i++)
                out[o++] = digits[i];
        }
        o += (size_t)snprintf(out + o, sizeof(out) - o, "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
    }
    return sb_tpl_buf_put(b, out, o);
}

static sb_status write_str_repr(sb_tpl_buf *b, const sb_tpl_str *s) {
    bool has_single = memchr(s->data, '\'', s->len) != NULL;
    bool has_double = memchr(s->data, '"', s->len) != NULL;
    char quote = has_single && !has_double ? '"' : '\'';
    sb_status st = sb_tpl_buf_put(b, &quote, 1);
    for (size_t pos = 0; pos < s->len && st == SB_OK;) {
        size_t start = pos;
        uint32_t c = sb_tpl_utf8_next(s->data, s->len, &pos);
        if (c == (uint32_t)quote || c == '\\')
            st = sb_tpl_buf_printf(b, "\\%c", (char)c);
        else if (c == '\n')
            st = sb_tpl_buf_puts(b, "\\n");
        else if (c == '\r')
            st = sb_tpl_buf_puts(b, "\\r");
        else if (c == '\t')
            st = sb_tpl_buf_puts(b, "\\t");
        else if (c < 0x20 || c == 0x7f || (c >= 0x80 && c < 0x100 && !is_printable(c)))
            st = sb_tpl_buf_printf(b, "\\x%02x", (unsigned)c);
        else if (c >= 0x100 && !is_printable(c))
            st = sb_tpl_buf_printf(b, c < 0x10000 ? "\\u%04x" : "\\U%08x", (unsigned)c);
        else
            st = sb_tpl_buf_put(b, s->data + start, pos - start);
    }
    return st ? st : sb_tpl_buf_put(b, &quote, 1);
}

sb_status sb_tpl_write_repr(sb_tpl_buf *b, sb_tpl_val v) {
    sb_status st = SB_OK;
    switch (v.kind) {
    case SB_TPL_STR:
        return write_str_repr(b, v.s);
    case SB_TPL_LIST:
        st = sb_tpl_buf_puts(b, v.l->tuple ? "(" : "[");
        for (size_t i = 0; i < v.l->n && !st; i++) {
            if (i)
                st = sb_tpl_buf_puts(b, ", ");
            if (!st)
                st = sb_tpl_write_repr(b, v.l->items[i]);
        }
        if (!st && v.l->tuple && v.l->n == 1)
            st = sb_tpl_buf_puts(b, ",");
        return st ? st : sb_tpl_buf_puts(b, v.l->tuple ? ")" : "]");
    case SB_TPL_DICT:
    case SB_TPL_NAMESPACE:
        st = sb_tpl_buf_puts(b, v.kind == SB_TPL_DICT ? "{" : "<Namespace {");
        for (size_t i = 0; i < v.d->n && !st; i++) {
            if (i)
                st = sb_tpl_buf_puts(b, ", ");
            if (!st)
                st = sb_tpl_write_repr(b, v.d->keys[i]);
            if (!st)
                st = sb_tpl_buf_puts(b, ": ");
            if (!st)
                st = sb_tpl_write_repr(b, v.d->vals[i]);
        }
        return st ? st : sb_tpl_buf_puts(b, v.kind == SB_TPL_DICT ? "}" : "}>");
    case SB_TPL_UNDEFINED:
        return sb_tpl_buf_puts(b, "Undefined");
    default:
        return sb_tpl_write_str(b, v);
    }
}

sb_status sb_tpl_write_str(sb_tpl_buf *b, sb_tpl_val v) {
    switch (v.kind) {
    case SB_TPL_UNDEFINED:
        return SB_OK;
    case SB_TPL_NONE:
        return sb_tpl_buf_puts(b, "None");
    case SB_TPL_BOOL:
        return sb_tpl_buf_puts(b, v.b ? "True" : "False");
    case SB_TPL_INT:
        return sb_tpl_buf_printf(b, "%lld", (long long)v.i);
    case SB_TPL_FLOAT:
        return sb_tpl_write_float(b, v.f);
    case SB_TPL_STR:
        return sb_tpl_buf_put(b, v.s->data, v.s->len);
    case SB_TPL_FUNC:
        return sb_tpl_buf_puts(b, "<function>");
    default:
        return sb_tpl_write_repr(b, v);
    }
}

sb_status sb_tpl_to_str(sb_tpl_val v, sb_tpl_val *out) {
    if (v.kind == SB_TPL_STR) {
        *out = sb_tpl_retain(v);
        return SB_OK;
    }
    sb_tpl_buf b = {0};
    sb_status st = sb_tpl_write_str(&b, v);
    if (!st)
        st = sb_tpl_buf_take(&b, out);
    else
        *out = sb_tpl_none();
    sb_tpl_buf_free(&b);
    return st;
}
