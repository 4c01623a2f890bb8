/*
 * builtins.c - what templates call by name: Jinja2's filters and tests, the
 * Python methods of str, list and dict that Jinja2's sandbox allows, and the
 * globals (range, namespace, dict, and transformers' raise_exception and
 * strftime_now). Each is one function with Jinja2's parameter names, found
 * through tables at the end of the file.
 *
 * Methods that would mutate a list or dict fail, as in transformers'
 * ImmutableSandboxedEnvironment. Case mapping (upper, lower, title) covers
 * ASCII only.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "template/template-impl.h"

#define FN(name) static sb_status name(sb_tpl_interp *it, const sb_tpl_node *at, sb_tpl_val self, const sb_tpl_args *args, sb_tpl_val *out)

/* ---- arguments ------------------------------------------------------------------ */

bool sb_tpl_arg(const sb_tpl_args *args, size_t i, const char *name, sb_tpl_val *out) {
    if (i < args->n_pos) {
        *out = args->pos[i];
        return true;
    }
    for (size_t k = 0; name && k < args->n_kw; k++)
        if (strcmp(args->kw_names[k], name) == 0) {
            *out = args->kw[k];
            return true;
        }
    return false;
}

/* Index of `name` in the comma-separated list, or -1. */
static int param_index(const char *params, const char *name) {
    size_t len = strlen(name);
    int i = 0;
    for (const char *p = params; *p; i++) {
        const char *end = strchr(p, ',');
        size_t n = end ? (size_t)(end - p) : strlen(p);
        if (n == len && memcmp(p, name, n) == 0)
            return i;
        p += n + (end ? 1 : 0);
    }
    return -1;
}

sb_status sb_tpl_invoke(sb_tpl_interp *it, const sb_tpl_node *at, const sb_tpl_fn_def *def, sb_tpl_val self,
                        const sb_tpl_args *args, sb_tpl_val *out) {
    *out = sb_tpl_none();
    if (def->params) {
        int n_params = def->params[0] ? 1 : 0;
        for (const char *p = def->params; *p; p++)
            n_params += *p == ',';
        if (args->n_pos > (size_t)n_params)
            return sb_tpl_fail(it, at, SB_ERR_INVALID_ARG, "%s() takes at most %d argument(s) (%zu given)", def->name,
                               n_params, args->n_pos);
        for (size_t k = 0; k < args->n_kw; k++) {
            int i = param_index(def->params, args->kw_names[k]);
            if (i < 0)
                return sb_tpl_fail(it, at, SB_ERR_INVALID_ARG, "%s() got an unexpected keyword argument '%s'", def->name,
                                   args->kw_names[k]);
            if ((size_t)i < args->n_pos)
                return sb_tpl_fail(it, at, SB_ERR_INVALID_ARG, "%s() got multiple values for argument '%s'", def->name,
                                   args->kw_names[k]);
        }
    }
    uint64_t steps = 1 + sb_tpl_size_steps(self);
    for (size_t i = 0; i < args->n_pos; i++)
        steps += sb_tpl_size_steps(args->pos[i]);
    sb_status st = sb_tpl_charge(it, at, steps);
    return st ? st : def->fn(it, at, self, args, out);
}

static sb_status need_str(sb_tpl_interp *it, const sb_tpl_node *at, sb_tpl_val v, const char *what) {
    if (v.kind == SB_TPL_STR)
        return SB_OK;
    if (v.kind == SB_TPL_UNDEFINED && v.s)
        return sb_tpl_fail(it, at, SB_ERR_INVALID_ARG, "%s", v.s->data);
    return sb_tpl_fail(it, at, SB_ERR_INVALID_ARG, "%s must be a string, not '%s'", what, sb_tpl_type_name(v));
}

static sb_status need_int(sb_tpl_interp *it, const sb_tpl_node *at, sb_tpl_val v, const char *what, int64_t *out) {
    *out = 0;
    if (v.kind == SB_TPL_INT || v.kind == SB_TPL_BOOL) {
        *out = v.kind == SB_TPL_INT ? v.i : v.b;
        return SB_OK;
    }
    return sb_tpl_fail(it, at, SB_ERR_INVALID_ARG, "%s must be an integer, not '%s'", what, sb_tpl_type_name(v));
}

static sb_status new_str(const char *s, size_t len, sb_tpl_val *out) { return sb_tpl_str_new(s, len, out); }

static sb_status take_buf(sb_tpl_buf *b, sb_status st, sb_tpl_val *out) {
    if (!st)
        st = sb_tpl_buf_take(b, out);
    sb_tpl_buf_free(b);
    return st;
}

/* ---- iteration ------------------------------------------------------------------- */

sb_status sb_tpl_iterate(sb_tpl_interp *it, const sb_tpl_node *at, sb_tpl_val v, sb_tpl_val *out) {
    sb_status st;
    switch (v.kind) {
    case SB_TPL_LIST:
        if (!v.l->tuple) {
            *out = sb_tpl_retain(v);
            return SB_OK;
        }
        st = sb_tpl_list_new(v.l->n, false, out);
        for (size_t i = 0; i < v.l->n && !st; i++)
            st = sb_tpl_list_push(*out, sb_tpl_retain(v.l->items[i]));
        return st;
    case SB_TPL_DICT:
        st = sb_tpl_list_new(v.d->n, false, out);
        for (size_t i = 0; i < v.d->n && !st; i++)
            st = sb_tpl_list_push(*out, sb_tpl_retain(v.d->keys[i]));
        return st;
    case SB_TPL_STR:
        st = sb_tpl_list_new(0, false, out);
        for (size_t pos = 0; pos < v.s->len && !st;) {
            size_t start = pos;
            sb_tpl_val ch;
            sb_tpl_utf8_next(v.s->data, v.s->len, &pos);
            if (!(st = new_str(v.s->data + start, pos - start, &ch)))
                st = sb_tpl_list_push(*out, ch);
        }
        return st;
    case SB_TPL_UNDEFINED:
        return sb_tpl_list_new(0, false, out);
    default:
        *out = sb_tpl_none();
        return sb_tpl_fail(it, at, SB_ERR_INVALID_ARG, "'%s' object is not iterable", sb_tpl_type_name(v));
    }
}

/* ---- string helpers ------------------------------------------------------------------ */

static bool in_chars(uint32_t c, const sb_tpl_str *chars) {
    if (!chars)
        return sb_tpl_is_space(c);
    for (size_t pos = 0; pos < chars->len;)
        if (sb_tpl_utf8_next(chars->data, chars->len, &pos) == c)
            return true;
    return false;
}

/* Python str.strip/lstrip/rstrip(chars) on s. */
static sb_status strip(const sb_tpl_str *s, const sb_tpl_str *chars, bool left, bool right, sb_tpl_val *out) {
    size_t a = 0, b = s->len;
    while (left && a < b) {
        size_t p = a;
        if (!in_chars(sb_tpl_utf8_next(s->data, b, &p), chars))
            break;
        a = p;
    }
    while (right && b > a) {
        size_t p = b - 1;
        while (p > a && ((unsigned char)s->data[p] & 0xc0) == 0x80)
            p--;
        size_t q = p;
        if (!in_chars(sb_tpl_utf8_next(s->data, b, &q), chars))
            break;
        b = p;
    }
    return new_str(s->data + a, b - a, out);
}

/* Simple case mapping of one code point: ASCII, Latin-1, Latin Extended-A,
 * Greek and Cyrillic (not Unicode's full tables: no special casing). */
static uint32_t case_map(uint32_t c, bool upper) {
    if (upper) {
        if ((c >= 'a' && c <= 'z') || (c >= 0xe0 && c <= 0xfe && c != 0xf7) || (c >= 0x3b1 && c <= 0x3c9 && c != 0x3c2) ||
            (c >= 0x430 && c <= 0x44f))
            return c - 32;
        if (c == 0x3c2)
            return 0x3a3;
        if (c == 0xff)
            return 0x178;
        if (c >= 0x450 && c <= 0x45f)
            return c - 80;
        if (((c >= 0x100 && c <= 0x137) || (c >= 0x14a && c <= 0x177)) && (c & 1))
            return c - 1;
        if (((c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17e)) && !(c & 1))
            return c - 1;
        return c;
    }
    if ((c >= 'A' && c <= 'Z') || (c >= 0xc0 && c <= 0xde && c != 0xd7) || (c >= 0x391 && c <= 0x3a9 && c != 0x3a2) ||
        (c >= 0x410 && c <= 0x42f))
        return c + 32;
    if (c == 0x178)
        return 0xff;
    if (c >= 0x400 && c <= 0x40f)
        return c + 80;
    if (((c >= 0x100 && c <= 0x137) || (c >= 0x14a && c <= 0x177)) && !(c & 1))
        return c + 1;
    if (((c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17e)) && (c & 1))
        return c + 1;
    return c;
}

static bool is_cased(uint32_t c) { return case_map(c, true) != c || case_map(c, false) != c; }

typedef enum casing {
    UPPER,
    LOWER,
    TITLE,       /* Python str.title(): a letter after an uncased character starts a word */
    JINJA_TITLE, /* Jinja's |title: words start after -, whitespace, ( { [ < */
    CAPITALIZE,
} casing;

static sb_status change_case(const sb_tpl_str *s, casing how, sb_tpl_val *out) {
    sb_tpl_buf b = {0};
    sb_status st = SB_OK;
    bool word_start = true;
    for (size_t pos = 0; pos < s->len && !st;) {
        uint32_t c = sb_tpl_utf8_next(s->data, s->len, &pos), m;
        switch (how) {
        case UPPER:
            m = case_map(c, true);
            break;
        case LOWER:
            m = case_map(c, false);
            break;
        case CAPITALIZE:
            m = case_map(c, word_start);
            word_start = false;
            break;
        case TITLE:
            m = case_map(c, word_start);
            word_start = !is_cased(c);
            break;
        default:
            m = case_map(c, word_start);
            word_start = sb_tpl_is_space(c) || (c < 0x80 && strchr("-({[<", (int)c));
            break;
        }
        char enc[4];
        if (how == UPPER && c == 0xdf) /* sharp s has no single upper case */
            st = sb_tpl_buf_put(&b, "SS", 2);
        else
            st = sb_tpl_buf_put(&b, enc, sb_tpl_utf8_put(m, enc));
    }
    return take_buf(&b, st, out);
}

/* str(v) as a borrowed-or-new string in *out (a new reference either way). */
static sb_status to_str(sb_tpl_val v, sb_tpl_val *out) { return sb_tpl_to_str(v, out); }

/* ---- filters ---------------------------------------------------------------------- */

FN(f_trim) {
    sb_tpl_val s, chars = sb_tpl_none();
    sb_tpl_arg(args, 0, "chars", &chars);
    if (chars.kind != SB_TPL_NONE && chars.kind != SB_TPL_STR)
        return need_str(it, at, chars, "trim() chars");
    sb_status st = to_str(self, &s);
    if (!st)
        st = strip(s.s, chars.kind == SB_TPL_STR ? chars.s : NULL, true, true, out);
    sb_tpl_release(s);
    return st;
}

static sb_status length_of(sb_tpl_interp *it, const sb_tpl_node *at, sb_tpl_val v, int64_t *n) {
    *n = 0;
    switch (v.kind) {
    case SB_TPL_STR:
        *n = (int64_t)sb_tpl_str_chars(v.s);
        return SB_OK;
    case SB_TPL_LIST:
        *n = (int64_t)v.l->n;
        return SB_OK;
    case SB_TPL_DICT:
        *n = (int64_t)v.d->n;
        return SB_OK;
    case SB_TPL_UNDEFINED:
        *n = 0;
        return SB_OK;
    default:
        return sb_tpl_fail(it, at, SB_ERR_INVALID_ARG, "object of type '%s' has no len()", sb_tpl_type_name(v));
    }
}

FN(f_length) {
    int64_t n;
    sb_status st = length_of(it, at, self, &n);
    *out = sb_tpl_int(n);
    return st;
}

FN(f_tojson) {
    sb_tpl_json_opts o = {.indent = -1};
    sb_tpl_val v;
    if (sb_tpl_arg(args, 0, "ensure_ascii", &v))
        o.ensure_ascii = sb_tpl_truthy(v);
    if (sb_tpl_arg(args, 1, "indent", &v) && v.kind != SB_TPL_NONE) {
        int64_t indent;
        sb_status st = need_int(it, at, v, "tojson() indent", &indent);
        if (st)
            return st;
        o.indent = indent < 0 ? 0 : indent > 64 ? 64 : (int)indent;
    }
    if (sb_tpl_arg(args, 2, "separators", &v) && v.kind != SB_TPL_NONE) {
        if (v.kind != SB_TPL_LIST || v.l->n != 2 || v.l->items[0].kind != SB_TPL_STR || v.l->items[1].kind != SB_TPL_STR)
            return sb_tpl_fail(it, at, SB_ERR_INVALID_ARG, "tojson() separators must be a pair of strings");
        o.item_sep = v.l->items[0].s->data;
        o.key_sep = v.l->items[1].s->data;
    }
    if (sb_tpl_arg(args, 3, "sort_keys", &v))
        o.sort_keys = sb_tpl_truthy(v);
    sb_tpl_buf b = {0};
    const char *why;
    sb_status st = sb_tpl_write_json(&b, self, &o, &why);
    if (st == SB_ERR_INVALID_ARG) {
        sb_tpl_buf_free(&b);
        return sb_tpl_fail(it, at, st, "tojson: %s", why);
    }
    return take_buf(&b, st, out);
}

/* Jinja2's attribute getter: "a.b.0" looks up each part as an item, then as
 * an attribute (environment.getitem). */
static sb_status get_path(sb_tpl_interp *it, const sb_tpl_node *at, sb_tpl_val obj, const char *path, sb_tpl_val *out) {
    sb_tpl_val cur = sb_tpl_retain(obj);
    sb_status st = SB_OK;
    for (const char *p = path; !st;) {
        const char *dot = strchr(p, '.');
        size_t n = dot ? (size_t)(dot - p) : strlen(p);
        char part[128];
        snprintf(part, sizeof(part), "%.*s", (int)SB_MIN(n, sizeof(part) - 1), p);
        sb_tpl_val next = sb_tpl_undef();
        char *end;
        long idx = strtol(part, &end, 10);
        if (*part && !*end && cur.kind == SB_TPL_LIST) {
            if (idx < 0)
                idx += (long)cur.l->n;
            if (idx >= 0 && (size_t)idx < cur.l->n)
                next = sb_tpl_retain(cur.l->items[idx]);
        } else if (cur.kind == SB_TPL_DICT && sb_tpl_dict_get(cur.d, part)) {
            next = sb_tpl_retain(*sb_tpl_dict_get(cur.d, part));
        } else {
            st = sb_tpl_getattr(it, at, cur, part, &next);
        }
        sb_tpl_release(cur);
        cur = next;
        if (!dot)
            break;
        p = dot + 1;
    }
    if (st) {
        sb_tpl_release(cur);
        return st;
    }
    *out = cur;
    return SB_OK;
}

FN(f_join) {
    sb_tpl_val sep = sb_tpl_none(), attr = sb_tpl_none(), items;
    sb_tpl_arg(args, 0, "d", &sep);
    sb_tpl_arg(args, 1, "attribute", &attr);
    if (sep.kind != SB_TPL_NONE && sep.kind != SB_TPL_STR)
        return need_str(it, at, sep, "join() separator");
    if (attr.kind != SB_TPL_NONE && attr.kind != SB_TPL_STR)
        return need_str(it, at, attr, "join() attribute");
    sb_status st = sb_tpl_iterate(it, at, self, &items);
    if (st)
        return st;
    sb_tpl_buf b = {0};
    for (size_t i = 0; i < items.l->n && !st; i++) {
        if (i && sep.kind == SB_TPL_STR)
            st = sb_tpl_buf_put(&b, sep.s->data, sep.s->len);
        sb_tpl_val item = sb_tpl_retain(items.l->items[i]);
        if (!st && attr.kind == SB_TPL_STR) {
            sb_tpl_val got;
            st = get_path(it, at, item, attr.s->data, &got);
            sb_tpl_release(item);
            item = got;
        }
        if (!st)
            st = sb_tpl_write_str(&b, item);
        sb_tpl_release(item);
    }
    sb_tpl_release(items);
    return take_buf(&b, st, out);
}

static sb_status case_filter(sb_tpl_val self, casing how, sb_tpl_val *out) {
    sb_tpl_val s;
    sb_status st = to_str(self, &s);
    if (!st)
        st = change_case(s.s, how, out);
    sb_tpl_release(s);
    return st;
}
FN(f_upper) { return case_filter(self, UPPER, out); }
FN(f_lower) { return case_filter(self, LOWER, out); }
FN(f_title) { return case_filter(self, JINJA_TITLE, out); }
FN(f_capitalize) { return case_filter(self, CAPITALIZE, out); }

FN(f_default) {
    sb_tpl_val def = sb_tpl_none(), boolean = sb_tpl_bool(false);
    bool has_def = sb_tpl_arg(args, 0, "default_value", &def);
    sb_tpl_arg(args, 1, "boolean", &boolean);
    if (self.kind == SB_TPL_UNDEFINED || (sb_tpl_truthy(boolean) && !sb_tpl_truthy(self))) {
        if (has_def) {
            *out = sb_tpl_retain(def);
            return SB_OK;
        }
        return new_str("", 0, out);
    }
    *out = sb_tpl_retain(self);
    return SB_OK;
}

static sb_status pairs(sb_tpl_val d, sb_tpl_val *out) {
    sb_status st = sb_tpl_list_new(d.d->n, false, out);
    for (size_t i = 0; i < d.d->n && !st; i++) {
        sb_tpl_val pair;
        if ((st = sb_tpl_list_new(2, true, &pair)))
            break;
        sb_tpl_list_push(pair, sb_tpl_retain(d.d->keys[i]));
        sb_tpl_list_push(pair, sb_tpl_retain(d.d->vals[i]));
        st = sb_tpl_list_push(*out, pair);
    }
    return st;
}

FN(f_items) {
    if (self.kind == SB_TPL_UNDEFINED)
        return sb_tpl_list_new(0, false, out);
    if (self.kind != SB_TPL_DICT)
        return sb_tpl_fail(it, at, SB_ERR_INVALID_ARG, "can only get item pairs from a mapping");
    return pairs(self, out);
}

FN(f_list) {
    sb_tpl_val items;
    sb_status st = sb_tpl_iterate(it, at, self, &items);
    if (st)
        return st;
    if (items.l == self.l && self.kind == SB_TPL_LIST) { /* a copy, not the same list */
        sb_tpl_release(items);
        st = sb_tpl_list_new(self.l->n, false, out);
        for (size_t i = 0; i < self.l->n && !st; i++)
            st = sb_tpl_list_push(*out, sb_tpl_retain(self.l->items[i]));
        return st;
    }
    *out = items;
    return SB_OK;
}

FN(f_string) { return to_str(self, out); }

FN(f_first) {
    sb_tpl_val items;
    sb_status st = sb_tpl_iterate(it, at, self, &items);
    if (st)
        return st;
    if (items.l->n)
        *out = sb_tpl_retain(items.l->items[0]);
    else
        *out = sb_tpl_undef();
    sb_tpl_release(items);
    return SB_OK;
}

FN(f_last) {
    sb_tpl_val items;
    sb_status st = sb_tpl_iterate(it, at, self, &items);
    if (st)
        return st;
    if (items.l->n)
        *out = sb_tpl_retain(items.l->items[items.l->n - 1]);
    else
        *out = sb_tpl_undef();
    sb_tpl_release(items);
    return SB_OK;
}

/* select/reject/selectattr/rejectattr: keep the items whose (attribute's)
 * test result equals `keep`. Arguments: [attribute,] test name, test args. */
static sb_status select_items(sb_tpl_interp *it, const sb_tpl_node *at, sb_tpl_val self, const sb_tpl_args *args,
                              bool by_attr, bool keep, sb_tpl_val *out) {
    size_t first = by_attr ? 1 : 0;
    const char *attr = NULL;
    if (by_attr) {
        if (args->n_pos < 1 || args->pos[0].kind != SB_TPL_STR)
            return sb_tpl_fail(it, at, SB_ERR_INVALID_ARG, "the attribute filters need an attribute name");
        attr = args->pos[0].s->data;
    }
    const sb_tpl_fn_def *test = NULL;
    if (args->n_pos > first) {
        if (args->pos[first].kind != SB_TPL_STR)
            return need_str(it, at, args->pos[first], "test name");
        if (!(test = sb_tpl_find_test(args->pos[first].s->data)))
            return sb_tpl_fail(it, at, SB_ERR_UNSUPPORTED, "no test named '%s'", args->pos[first].s->data);
    }
    sb_tpl_args targs = {.pos = args->pos + SB_MIN(args->n_pos, first + 1),
                         .n_pos = args->n_pos > first + 1 ? args->n_pos - first - 1 : 0};
    sb_tpl_val items;
    sb_status st = sb_tpl_iterate(it, at, self, &items);
    if (st)
        return st;
    st = sb_tpl_list_new(0, false, out);
    for (size_t i = 0; i < items.l->n && !st; i++) {
        sb_tpl_val v = sb_tpl_retain(items.l->items[i]), r = sb_tpl_none();
        if (attr) {
            sb_tpl_val got;
            st = get_path(it, at, v, attr, &got);
            sb_tpl_release(v);
            v = got;
        }
        if (!st)
            st = test ? sb_tpl_invoke(it, at, test, v, &targs, &r) : SB_OK;
        bool pass = test ? sb_tpl_truthy(r) : sb_tpl_truthy(v);
        sb_tpl_release(v);
        sb_tpl_release(r);
        if (!st && pass == keep)
            st = sb_tpl_list_push(*out, sb_tpl_retain(items.l->items[i]));
    }
    sb_tpl_release(items);
    return st;
}
FN(f_select) { return select_items(it, at, self, args, false, true, out); }
FN(f_reject) { return select_items(it, at, self, args, false, false, out); }
FN(f_selectattr) { return select_items(it, at, self, args, true, true, out); }
FN(f_rejectattr) { return select_items(it, at, self, args, true, false, out); }

FN(f_map) {
    sb_tpl_val def = sb_tpl_undef();
    const char *path = NULL;
    const sb_tpl_fn_def *filter = NULL;
    bool has_def = false;
    for (size_t k = 0; k < args->n_kw; k++) {
        if (strcmp(args->kw_names[k], "attribute") == 0 && args->kw[k].kind == SB_TPL_STR)
            path = args->kw[k].s->data;
        else if (strcmp(args->kw_names[k], "default") == 0)
            def = args->kw[k], has_def = true;
        else
            return sb_tpl_fail(it, at, SB_ERR_INVALID_ARG, "map() got an unexpected keyword argument '%s'",
                               args->kw_names[k]);
    }
    if (!path) {
        if (args->n_pos < 1 || args->pos[0].kind != SB_TPL_STR)
            return sb_tpl_fail(it, at, SB_ERR_INVALID_ARG, "map() needs a filter name or attribute=");
        if (!(filter = sb_tpl_find_filter(args->pos[0].s->data)))
            return sb_tpl_fail(it, at, SB_ERR_UNSUPPORTED, "no filter named '%s'", args->pos[0].s->data);
    }
    sb_tpl_args fargs = {.pos = args->pos + (args->n_pos ? 1 : 0), .n_pos = args->n_pos ? args->n_pos - 1 : 0};
    sb_tpl_val items;
    sb_status st = sb_tpl_iterate(it, at, self, &items);
    if (st)
        return st;
    st = sb_tpl_list_new(items.l->n, false, out);
    for (size_t i = 0; i < items.l->n && !st; i++) {
        sb_tpl_val v;
        if (path) {
            st = get_path(it, at, items.l->items[i], path, &v);
            if (!st && v.kind == SB_TPL_UNDEFINED && has_def) {
                sb_tpl_release(v);
                v = sb_tpl_retain(def);
            }
        } else {
            st = sb_tpl_invoke(it, at, filter, items.l->items[i], &fargs, &v);
        }
        if (!st)
            st = sb_tpl_list_push(*out, v);
    }
    sb_tpl_release(items);
    return st;
}

/* Python str.replace(old, new, count). */
static sb_status replace(const sb_tpl_str *s, const sb_tpl_str *old, const sb_tpl_str *rep, int64_t count,
                         sb_tpl_val *out) {
    sb_tpl_buf b = {0};
    sb_status st = SB_OK;
    size_t pos = 0;
    int64_t done = 0;
    if (old->len == 0) { /* inserts rep between every character */
        for (size_t p = 0; !st;) {
            if (count < 0 || done < count) {
                st = sb_tpl_buf_put(&b, rep->data, rep->len);
                done++;
            }
            if (p >= s->len || st)
                break;
            size_t q = p;
            sb_tpl_utf8_next(s->data, s->len, &q);
            st = sb_tpl_buf_put(&b, s->data + p, q - p);
            p = q;
        }
        return take_buf(&b, st, out);
    }
    while (!st && (count < 0 || done < count)) {
        const char *hit = sb_tpl_find_bytes(s->data + pos, s->len - pos, old->data, old->len);
        if (!hit)
            break;
        size_t at = (size_t)(hit - s->data);
        if (!(st = sb_tpl_buf_put(&b, s->data + pos, at - pos)))
            st = sb_tpl_buf_put(&b, rep->data, rep->len);
        pos = at + old->len;
        done++;
    }
    if (!st)
        st = sb_tpl_buf_put(&b, s->data + pos, s->len - pos);
    return take_buf(&b, st, out);
}

static sb_status do_replace(sb_tpl_interp *it, const sb_tpl_node *at, sb_tpl_val s, const sb_tpl_args *args,
                            const char *count_name, sb_tpl_val *out) {
    sb_tpl_val old = sb_tpl_none(), rep = sb_tpl_none(), count = sb_tpl_none();
    sb_tpl_arg(args, 0, "old", &old);
    sb_tpl_arg(args, 1, "new", &rep);
    sb_tpl_arg(args, 2, count_name, &count);
    sb_status st = need_str(it, at, old, "replace() old");
    if (!st)
        st = need_str(it, at, rep, "replace() new");
    int64_t n = -1;
    if (!st && count.kind != SB_TPL_NONE)
        st = need_int(it, at, count, "replace() count", &n);
    return st ? st : replace(s.s, old.s, rep.s, n, out);
}

FN(f_replace) {
    sb_tpl_val s;
    sb_status st = to_str(self, &s);
    if (!st)
        st = do_replace(it, at, s, args, "count", out);
    sb_tpl_release(s);
    return st;
}

FN(f_int) {
    sb_tpl_val def = sb_tpl_int(0);
    sb_tpl_arg(args, 0, "default", &def);
    if (self.kind == SB_TPL_INT || self.kind == SB_TPL_BOOL) {
        *out = sb_tpl_int(self.kind == SB_TPL_INT ? self.i : self.b);
        return SB_OK;
    }
    if (self.kind == SB_TPL_FLOAT && isfinite(self.f) && fabs(self.f) < 9.2e18) {
        *out = sb_tpl_int((int64_t)self.f);
        return SB_OK;
    }
    if (self.kind == SB_TPL_STR) {
        char *end;
        errno = 0;
        long long v = strtoll(self.s->data, &end, 10);
        while (*end && sb_tpl_is_space((unsigned char)*end))
            end++;
        if (!errno && end != self.s->data && !*end) {
            *out = sb_tpl_int(v);
            return SB_OK;
        }
        double d = strtod(self.s->data, &end);
        while (*end && sb_tpl_is_space((unsigned char)*end))
            end++;
        if (end != self.s->data && !*end && isfinite(d) && fabs(d) < 9.2e18) {
            *out = sb_tpl_int((int64_t)d);
            return SB_OK;
        }
    }
    *out = sb_tpl_retain(def);
    return SB_OK;
}

FN(f_float) {
    sb_tpl_val def = sb_tpl_float(0.0);
    sb_tpl_arg(args, 0, "default", &def);
    if (self.kind == SB_TPL_INT || self.kind == SB_TPL_BOOL || self.kind == SB_TPL_FLOAT) {
        *out = sb_tpl_float(self.kind == SB_TPL_FLOAT ? self.f : self.kind == SB_TPL_INT ? (double)self.i : self.b);
        return SB_OK;
    }
    if (self.kind == SB_TPL_STR) {
        char *end;
        double d = strtod(self.s->data, &end);
        while (*end && sb_tpl_is_space((unsigned char)*end))
            end++;
        if (end != self.s->data && !*end) {
            *out = sb_tpl_float(d);
            return SB_OK;
        }
    }
    *out = sb_tpl_retain(def);
    return SB_OK;
}

FN(f_abs) {
    if (self.kind == SB_TPL_INT && self.i != INT64_MIN)
        *out = sb_tpl_int(self.i < 0 ? -self.i : self.i);
    else if (self.kind == SB_TPL_BOOL)
        *out = sb_tpl_int(self.b);
    else if (self.kind == SB_TPL_FLOAT)
        *out = sb_tpl_float(fabs(self.f));
    else
        return sb_tpl_fail(it, at, SB_ERR_INVALID_ARG, "bad operand type for abs(): '%s'", sb_tpl_type_name(self));
    return SB_OK;
}

FN(f_round) {
    sb_tpl_val prec = sb_tpl_int(0), method = sb_tpl_none();
    sb_tpl_arg(args, 0, "precision", &prec);
    sb_tpl_arg(args, 1, "method", &method);
    int64_t p;
    sb_status st = need_int(it, at, prec, "round() precision", &p);
    if (st)
        return st;
    if (self.kind != SB_TPL_INT && self.kind != SB_TPL_BOOL && self.kind != SB_TPL_FLOAT)
        return sb_tpl_fail(it, at, SB_ERR_INVALID_ARG, "round() needs a number, not '%s'", sb_tpl_type_name(self));
    double x = self.kind == SB_TPL_FLOAT ? self.f : self.kind == SB_TPL_INT ? (double)self.i : self.b;
    double scale = pow(10.0, (double)(p < -300 ? -300 : p > 300 ? 300 : p));
    const char *m = method.kind == SB_TPL_STR ? method.s->data : "common";
    double r;
    if (strcmp(m, "ceil") == 0)
        r = ceil(x * scale) / scale;
    else if (strcmp(m, "floor") == 0)
        r = floor(x * scale) / scale;
    else if (strcmp(m, "common") == 0)
        r = nearbyint(x * scale) / scale; /* Python's round(): half to even */
    else
        return sb_tpl_fail(it, at, SB_ERR_INVALID_ARG, "method must be common, ceil or floor");
    *out = sb_tpl_float(r);
    return SB_OK;
}

FN(f_reverse) {
    if (self.kind == SB_TPL_STR) {
        sb_tpl_buf b = {0};
        sb_status st = SB_OK;
        for (size_t end = self.s->len; end > 0 && !st;) {
            size_t p = end - 1;
            while (p > 0 && ((unsigned char)self.s->data[p] & 0xc0) == 0x80)
                p--;
            st = sb_tpl_buf_put(&b, self.s->data + p, end - p);
            end = p;
        }
        return take_buf(&b, st, out);
    }
    sb_tpl_val items;
    sb_status st = sb_tpl_iterate(it, at, self, &items);
    if (st)
        return st;
    st = sb_tpl_list_new(items.l->n, false, out);
    for (size_t i = items.l->n; i > 0 && !st; i--)
        st = sb_tpl_list_push(*out, sb_tpl_retain(items.l->items[i - 1]));
    sb_tpl_release(items);
    return st;
}

/* Sort keys: the value (or its attribute), lowercased if a string and not case sensitive. */
typedef struct sort_item {
    sb_tpl_val key, item;
} sort_item;

/* -1, 0 or 1; sets *failed for keys Python cannot order. */
static int sort_cmp(const sort_item *a, const sort_item *b, bool *failed) {
    int c = 0;
    if (!sb_tpl_order(a->key, b->key, &c))
        *failed = true;
    return c == 2 ? 0 : c;
}

static sb_status sorted(sb_tpl_interp *it, const sb_tpl_node *at, sb_tpl_val items, const char *attr, bool case_sensitive,
                        bool reverse, bool by_value, sb_tpl_val *out) {
    size_t n = items.l->n;
    sort_item *v = sb_calloc(n + 1, sizeof(*v));
    if (!v)
        return SB_ERR_NOMEM;
    sb_status st = SB_OK;
    size_t filled = 0;
    for (; filled < n && !st; filled++) {
        sb_tpl_val item = items.l->items[filled], key;
        if (by_value) /* dictsort by value: item is a (k, v) pair */
            key = sb_tpl_retain(item.l->items[1]);
        else if (attr)
            st = get_path(it, at, item, attr, &key);
        else
            key = sb_tpl_retain(item);
        if (st)
            break;
        if (!case_sensitive && key.kind == SB_TPL_STR) {
            sb_tpl_val low;
            st = change_case(key.s, LOWER, &low);
            sb_tpl_release(key);
            key = st ? sb_tpl_none() : low;
        }
        v[filled] = (sort_item){key, item};
    }
    if (!st) {
        /* a stable insertion sort, as Python's sort is stable (lists are small) */
        bool failed = false;
        for (size_t i = 1; i < n; i++) {
            sort_item cur = v[i];
            size_t j = i;
            while (j > 0) {
                int c = sort_cmp(&v[j - 1], &cur, &failed);
                if (reverse ? c >= 0 : c <= 0)
                    break;
                v[j] = v[j - 1];
                j--;
            }
            v[j] = cur;
        }
        if (failed)
            st = sb_tpl_fail(it, at, SB_ERR_INVALID_ARG, "'<' not supported between the items being sorted");
    }
    if (!st)
        st = sb_tpl_list_new(n, false, out);
    for (size_t i = 0; i < n && !st; i++)
        st = sb_tpl_list_push(*out, sb_tpl_retain(v[i].item));
    for (size_t i = 0; i < filled; i++)
        sb_tpl_release(v[i].key);
    sb_free(v);
    return st;
}

FN(f_sort) {
    sb_tpl_val reverse = sb_tpl_bool(false), cs = sb_tpl_bool(false), attr = sb_tpl_none(), items;
    sb_tpl_arg(args, 0, "reverse", &reverse);
    sb_tpl_arg(args, 1, "case_sensitive", &cs);
    sb_tpl_arg(args, 2, "attribute", &attr);
    sb_status st = sb_tpl_iterate(it, at, self, &items);
    if (st)
        return st;
    st = sorted(it, at, items, attr.kind == SB_TPL_STR ? attr.s->data : NULL, sb_tpl_truthy(cs), sb_tpl_truthy(reverse),
                false, out);
    sb_tpl_release(items);
    return st;
}

FN(f_dictsort) {
    sb_tpl_val cs = sb_tpl_bool(false), by = sb_tpl_none(), reverse = sb_tpl_bool(false), items;
    sb_tpl_arg(args, 0, "case_sensitive", &cs);
    sb_tpl_arg(args, 1, "by", &by);
    sb_tpl_arg(args, 2, "reverse", &reverse);
    if (self.kind != SB_TPL_DICT)
        return sb_tpl_fail(it, at, SB_ERR_INVALID_ARG, "dictsort() needs a mapping, not '%s'", sb_tpl_type_name(self));
    bool by_value = by.kind == SB_TPL_STR && strcmp(by.s->data, "value") == 0;
    sb_status st = pairs(self, &items);
    if (!st)
        st = sorted(it, at, items, by_value ? NULL : "0", sb_tpl_truthy(cs), sb_tpl_truthy(reverse), by_value, out);
    sb_tpl_release(items);
    return st;
}

FN(f_unique) {
    sb_tpl_val cs = sb_tpl_bool(false), attr = sb_tpl_none(), items;
    sb_tpl_arg(args, 0, "case_sensitive", &cs);
    sb_tpl_arg(args, 1, "attribute", &attr);
    sb_status st = sb_tpl_iterate(it, at, self, &items);
    if (st)
        return st;
    sb_tpl_val seen;
    if ((st = sb_tpl_list_new(0, false, &seen))) {
        sb_tpl_release(items);
        return st;
    }
    st = sb_tpl_list_new(0, false, out);
    for (size_t i = 0; i < items.l->n && !st; i++) {
        sb_tpl_val key;
        if (attr.kind == SB_TPL_STR)
            st = get_path(it, at, items.l->items[i], attr.s->data, &key);
        else
            key = sb_tpl_retain(items.l->items[i]);
        if (!st && !sb_tpl_truthy(cs) && key.kind == SB_TPL_STR) {
            sb_tpl_val low;
            st = change_case(key.s, LOWER, &low);
            sb_tpl_release(key);
            key = st ? sb_tpl_none() : low;
        }
        bool dup = false;
        for (size_t j = 0; j < seen.l->n && !dup; j++)
            dup = sb_tpl_equal(seen.l->items[j], key);
        if (st || dup) {
            sb_tpl_release(key);
            continue;
        }
        if (!(st = sb_tpl_list_push(seen, key)))
            st = sb_tpl_list_push(*out, sb_tpl_retain(items.l->items[i]));
    }
    sb_tpl_release(seen);
    sb_tpl_release(items);
    return st;
}

static sb_status extreme(sb_tpl_interp *it, const sb_tpl_node *at, sb_tpl_val self, const sb_tpl_args *args, bool max,
                         sb_tpl_val *out) {
    sb_tpl_val cs = sb_tpl_bool(false), attr = sb_tpl_none(), items, s;
    sb_tpl_arg(args, 0, "case_sensitive", &cs);
    sb_tpl_arg(args, 1, "attribute", &attr);
    sb_status st = sb_tpl_iterate(it, at, self, &items);
    if (st)
        return st;
    st = sorted(it, at, items, attr.kind == SB_TPL_STR ? attr.s->data : NULL, sb_tpl_truthy(cs), false, false, &s);
    sb_tpl_release(items);
    if (st)
        return st;
    *out = s.l->n ? sb_tpl_retain(s.l->items[max ? s.l->n - 1 : 0]) : sb_tpl_undef();
    sb_tpl_release(s);
    return SB_OK;
}
FN(f_min) { return extreme(it, at, self, args, false, out); }
FN(f_max) { return extreme(it, at, self, args, true, out); }

FN(f_sum) {
    sb_tpl_val attr = sb_tpl_none(), start = sb_tpl_int(0), items;
    sb_tpl_arg(args, 0, "attribute", &attr);
    sb_tpl_arg(args, 1, "start", &start);
    sb_status st = sb_tpl_iterate(it, at, self, &items);
    if (st)
        return st;
    bool is_float = start.kind == SB_TPL_FLOAT;
    double fsum = start.kind == SB_TPL_FLOAT ? start.f : start.kind == SB_TPL_INT ? (double)start.i : 0;
    int64_t isum = start.kind == SB_TPL_INT ? start.i : 0;
    for (size_t i = 0; i < items.l->n && !st; i++) {
        sb_tpl_val v;
        if (attr.kind == SB_TPL_STR)
            st = get_path(it, at, items.l->items[i], attr.s->data, &v);
        else
            v = sb_tpl_retain(items.l->items[i]);
        if (st)
            break;
        if (v.kind == SB_TPL_FLOAT)
            is_float = true, fsum += v.f;
        else if (v.kind == SB_TPL_INT || v.kind == SB_TPL_BOOL) {
            int64_t x = v.kind == SB_TPL_INT ? v.i : v.b;
            fsum += (double)x;
            if (__builtin_add_overflow(isum, x, &isum))
                st = sb_tpl_fail(it, at, SB_ERR_UNSUPPORTED, "integer overflow in sum()");
        } else {
            st = sb_tpl_fail(it, at, SB_ERR_INVALID_ARG, "unsupported operand type(s) for +: 'int' and '%s'",
                             sb_tpl_type_name(v));
        }
        sb_tpl_release(v);
    }
    sb_tpl_release(items);
    *out = is_float ? sb_tpl_float(fsum) : sb_tpl_int(isum);
    return st;
}

FN(f_indent) {
    sb_tpl_val width = sb_tpl_int(4), first = sb_tpl_bool(false), blank = sb_tpl_bool(false), s;
    sb_tpl_arg(args, 0, "width", &width);
    sb_tpl_arg(args, 1, "first", &first);
    sb_tpl_arg(args, 2, "blank", &blank);
    sb_tpl_buf pad = {0};
    sb_status st = SB_OK;
    if (width.kind == SB_TPL_STR) {
        st = sb_tpl_buf_put(&pad, width.s->data, width.s->len);
    } else {
        int64_t w;
        if ((st = need_int(it, at, width, "indent() width", &w)))
            return st;
        for (int64_t i = 0; i < w && i < 256 && !st; i++)
            st = sb_tpl_buf_put(&pad, " ", 1);
    }
    if (!st)
        st = sb_tpl_buf_put(&pad, "", 0);
    if (!st)
        st = to_str(self, &s);
    if (st) {
        sb_tpl_buf_free(&pad);
        return st;
    }
    /* Jinja2 3.1: lines after the first get the indent unless blank (or
     * blank=True); first=True indents the first line too. */
    sb_tpl_buf b = {0};
    const char *p = s.s->data, *end = p + s.s->len;
    if (sb_tpl_truthy(first))
        st = sb_tpl_buf_put(&b, pad.p, pad.len);
    for (bool first_line = true; !st; first_line = false) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        size_t n = nl ? (size_t)(nl - p) : (size_t)(end - p);
        if (!first_line && (n > 0 || sb_tpl_truthy(blank)))
            st = sb_tpl_buf_put(&b, pad.p, pad.len);
        if (!st)
            st = sb_tpl_buf_put(&b, p, n + (nl ? 1 : 0));
        if (!nl)
            break;
        p = nl + 1;
    }
    sb_tpl_release(s);
    sb_tpl_buf_free(&pad);
    return take_buf(&b, st, out);
}

FN(f_safe) {
    (void)it, (void)at, (void)args;
    *out = sb_tpl_retain(self);
    return SB_OK;
}

FN(f_escape) {
    sb_tpl_val s;
    sb_status st = to_str(self, &s);
    if (st)
        return st;
    sb_tpl_buf b = {0};
    for (size_t i = 0; i < s.s->len && !st; i++) {
        char c = s.s->data[i];
        const char *e = c == '&' ? "&amp;" : c == '<' ? "&lt;" : c == '>' ? "&gt;" : c == '"' ? "&#34;" : c == '\'' ? "&#39;" : NULL;
        st = e ? sb_tpl_buf_puts(&b, e) : sb_tpl_buf_put(&b, &c, 1);
    }
    sb_tpl_release(s);
    return take_buf(&b, st, out);
}

FN(f_attr) {
    sb_tpl_val name;
    if (!sb_tpl_arg(args, 0, "name", &name) || name.kind != SB_TPL_STR)
        return sb_tpl_fail(it, at, SB_ERR_INVALID_ARG, "attr() needs an attribute name");
    return sb_tpl_getattr(it, at, self, name.s->data, out);
}

FN(f_wordcount) {
    sb_tpl_val s;
    sb_status st = to_str(self, &s);
    if (st)
        return st;
    int64_t n = 0;
    bool in_word = false;
    for (size_t pos = 0; pos < s.s->len;) {
        uint32_t c = sb_tpl_utf8_next(s.s->data, s.s->len, &pos);
        bool w = c >= 0x80 || (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
        if (w && !in_word)
            n++;
        in_word = w;
    }
    sb_tpl_release(s);
    *out = sb_tpl_int(n);
    return SB_OK;
}

/* ---- tests ------------------------------------------------------------------------------ */

static sb_status yes(bool b, sb_tpl_val *out) {
    *out = sb_tpl_bool(b);
    return SB_OK;
}

FN(t_defined) { return yes(self.kind != SB_TPL_UNDEFINED, out); }
FN(t_undefined) { return yes(self.kind == SB_TPL_UNDEFINED, out); }
FN(t_none) { return yes(self.kind == SB_TPL_NONE, out); }
FN(t_string) { return yes(self.kind == SB_TPL_STR, out); }
FN(t_mapping) { return yes(self.kind == SB_TPL_DICT, out); }
FN(t_iterable) {
    return yes(self.kind == SB_TPL_STR || self.kind == SB_TPL_LIST || self.kind == SB_TPL_DICT ||
                   self.kind == SB_TPL_UNDEFINED,
               out);
}
FN(t_sequence) {
    return yes(self.kind == SB_TPL_STR || self.kind == SB_TPL_LIST || self.kind == SB_TPL_DICT ||
                   self.kind == SB_TPL_UNDEFINED,
               out);
}
FN(t_number) { return yes(self.kind == SB_TPL_INT || self.kind == SB_TPL_FLOAT || self.kind == SB_TPL_BOOL, out); }
FN(t_integer) { return yes(self.kind == SB_TPL_INT, out); }
FN(t_float) { return yes(self.kind == SB_TPL_FLOAT, out); }
FN(t_boolean) { return yes(self.kind == SB_TPL_BOOL, out); }
FN(t_true) { return yes(self.kind == SB_TPL_BOOL && self.b, out); }
FN(t_false) { return yes(self.kind == SB_TPL_BOOL && !self.b, out); }
FN(t_callable) { return yes(self.kind == SB_TPL_FUNC, out); }
FN(t_escaped) { return yes(false, out); }

static sb_status test_compare(sb_tpl_interp *it, const sb_tpl_node *at, sb_tpl_val self, const sb_tpl_args *args,
                              const char *op, sb_tpl_val *out) {
    sb_tpl_val other = sb_tpl_none();
    if (!sb_tpl_arg(args, 0, "other", &other))
        return sb_tpl_fail(it, at, SB_ERR_INVALID_ARG, "the comparison test needs a value to compare with");
    if (op[0] == '=' || op[0] == '!')
        return yes(sb_tpl_equal(self, other) == (op[0] == '='), out);
    int c;
    if (!sb_tpl_order(self, other, &c))
        return sb_tpl_fail(it, at, SB_ERR_INVALID_ARG, "'%s' not supported between instances of '%s' and '%s'", op,
                           sb_tpl_type_name(self), sb_tpl_type_name(other));
    if (c == 2)
        return yes(false, out);
    return yes(op[0] == '<' ? (op[1] ? c <= 0 : c < 0) : (op[1] ? c >= 0 : c > 0), out);
}
FN(t_eq) { return test_compare(it, at, self, args, "==", out); }
FN(t_ne) { return test_compare(it, at, self, args, "!=", out); }
FN(t_lt) { return test_compare(it, at, self, args, "<", out); }
FN(t_le) { return test_compare(it, at, self, args, "<=", out); }
FN(t_gt) { return test_compare(it, at, self, args, ">", out); }
FN(t_ge) { return test_compare(it, at, self, args, ">=", out); }

FN(t_in) {
    sb_tpl_val seq = sb_tpl_none();
    sb_tpl_arg(args, 0, "seq", &seq);
    if (seq.kind == SB_TPL_STR) {
        sb_status st = need_str(it, at, self, "'in <string>' left operand");
        return st ? st : yes(sb_tpl_find_bytes(seq.s->data, seq.s->len, self.s->data, self.s->len) != NULL, out);
    }
    if (seq.kind == SB_TPL_DICT)
        return yes(sb_tpl_dict_find(seq.d, self) >= 0, out);
    sb_tpl_val items;
    sb_status st = sb_tpl_iterate(it, at, seq, &items);
    if (st)
        return st;
    bool found = false;
    for (size_t i = 0; i < items.l->n && !found; i++)
        found = sb_tpl_equal(self, items.l->items[i]);
    sb_tpl_release(items);
    return yes(found, out);
}

static sb_status int_test(sb_tpl_interp *it, const sb_tpl_node *at, sb_tpl_val self, int64_t *v) {
    *v = 0;
    if (self.kind == SB_TPL_INT || self.kind == SB_TPL_BOOL) {
        *v = self.kind == SB_TPL_INT ? self.i : self.b;
        return SB_OK;
    }
    return sb_tpl_fail(it, at, SB_ERR_INVALID_ARG, "this test needs an integer, not '%s'", sb_tpl_type_name(self));
}
FN(t_odd) {
    int64_t v;
    sb_status st = int_test(it, at, self, &v);
    return st ? st : yes(v % 2 != 0, out);
}
FN(t_even) {
    int64_t v;
    sb_status st = int_test(it, at, self, &v);
    return st ? st : yes(v % 2 == 0, out);
}
FN(t_divisibleby) {
    int64_t v, d;
    sb_tpl_val num = sb_tpl_none();
    sb_tpl_arg(args, 0, "num", &num);
    sb_status st = int_test(it, at, self, &v);
    if (!st)
        st = need_int(it, at, num, "divisibleby() num", &d);
    if (!st && d == 0)
        st = sb_tpl_fail(it, at, SB_ERR_INVALID_ARG, "integer modulo by zero");
    return st ? st : yes(d == -1 || v % d == 0, out);
}
FN(t_sameas) {
    sb_tpl_val other = sb_tpl_none();
    sb_tpl_arg(args, 0, "other", &other);
    bool same = self.kind == other.kind;
    if (same && self.kind >= SB_TPL_STR)
        same = self.s == other.s; /* identity of heap objects */
    else if (same)
        same = sb_tpl_equal(self, other);
    return yes(same, out);
}
/* Python's str.islower() / isupper() over ASCII letters: some cased letter,
 * none of the other case. */
static sb_status case_test(sb_tpl_val self, bool upper, sb_tpl_val *out) {
    if (self.kind != SB_TPL_STR)
        return yes(false, out);
    bool cased = false;
    for (size_t i = 0; i < self.s->len; i++) {
        char c = self.s->data[i];
        bool lo = c >= 'a' && c <= 'z', up = c >= 'A' && c <= 'Z';
        if (upper ? lo : up)
            return yes(false, out);
        cased = cased || lo || up;
    }
    return yes(cased, out);
}
FN(t_lower) { return case_test(self, false, out); }
FN(t_upper) { return case_test(self, true, out); }
FN(t_filter) { return yes(self.kind == SB_TPL_STR && sb_tpl_find_filter(self.s->data), out); }
FN(t_test) { return yes(self.kind == SB_TPL_STR && sb_tpl_find_test(self.s->data), out); }

/* ---- str methods -------------------------------------------------------------------------- */

static sb_status strip_method(sb_tpl_interp *it, const sb_tpl_node *at, sb_tpl_val self, const sb_tpl_args *args,
                              bool left, bool right, sb_tpl_val *out) {
    sb_tpl_val chars = sb_tpl_none();
    sb_tpl_arg(args, 0, "chars", &chars);
    if (chars.kind != SB_TPL_NONE && chars.kind != SB_TPL_STR)
        return need_str(it, at, chars, "strip() chars");
    return strip(self.s, chars.kind == SB_TPL_STR ? chars.s : NULL, left, right, out);
}
FN(m_strip) { return strip_method(it, at, self, args, true, true, out); }
FN(m_lstrip) { return strip_method(it, at, self, args, true, false, out); }
FN(m_rstrip) { return strip_method(it, at, self, args, false, true, out); }

FN(m_split) {
    sb_tpl_val sep = sb_tpl_none(), maxv = sb_tpl_int(-1);
    sb_tpl_arg(args, 0, "sep", &sep);
    sb_tpl_arg(args, 1, "maxsplit", &maxv);
    int64_t max;
    sb_status st = need_int(it, at, maxv, "split() maxsplit", &max);
    if (!st && sep.kind != SB_TPL_NONE && (st = need_str(it, at, sep, "split() separator")))
        return st;
    if (!st && sep.kind == SB_TPL_STR && sep.s->len == 0)
        st = sb_tpl_fail(it, at, SB_ERR_INVALID_ARG, "empty separator");
    if (st)
        return st;
    const sb_tpl_str *s = self.s;
    st = sb_tpl_list_new(0, false, out);
    sb_tpl_val part;
    if (sep.kind == SB_TPL_STR) {
        size_t pos = 0;
        int64_t done = 0;
        while (!st && (max < 0 || done < max)) {
            const char *hit = sb_tpl_find_bytes(s->data + pos, s->len - pos, sep.s->data, sep.s->len);
            if (!hit)
                break;
            size_t end = (size_t)(hit - s->data);
            if (!(st = new_str(s->data + pos, end - pos, &part)))
                st = sb_tpl_list_push(*out, part);
            pos = end + sep.s->len;
            done++;
        }
        if (!st && !(st = new_str(s->data + pos, s->len - pos, &part)))
            st = sb_tpl_list_push(*out, part);
        return st;
    }
    /* whitespace runs; no empty strings */
    size_t pos = 0;
    int64_t done = 0;
    while (!st) {
        while (pos < s->len) {
            size_t q = pos;
            if (!sb_tpl_is_space(sb_tpl_utf8_next(s->data, s->len, &q)))
                break;
            pos = q;
        }
        if (pos >= s->len)
            break;
        size_t end = pos;
        if (max >= 0 && done >= max) {
            end = s->len;
            while (end > pos) { /* the rest, without trailing whitespace */
                size_t p = end - 1;
                while (p > pos && ((unsigned char)s->data[p] & 0xc0) == 0x80)
                    p--;
                size_t q = p;
                if (!sb_tpl_is_space(sb_tpl_utf8_next(s->data, end, &q)))
                    break;
                end = p;
            }
        } else {
            while (end < s->len) {
                size_t q = end;
                if (sb_tpl_is_space(sb_tpl_utf8_next(s->data, s->len, &q)))
                    break;
                end = q;
            }
        }
        if (!(st = new_str(s->data + pos, end - pos, &part)))
            st = sb_tpl_list_push(*out, part);
        pos = end;
        done++;
        if (end == s->len)
            break;
    }
    return st;
}

static sb_status affix(sb_tpl_interp *it, const sb_tpl_node *at, sb_tpl_val self, const sb_tpl_args *args, bool suffix,
                       sb_tpl_val *out) {
    sb_tpl_val what = sb_tpl_none();
    sb_tpl_arg(args, 0, suffix ? "suffix" : "prefix", &what);
    size_t n = what.kind == SB_TPL_LIST ? what.l->n : 1;
    for (size_t i = 0; i < n; i++) {
        sb_tpl_val a = what.kind == SB_TPL_LIST ? what.l->items[i] : what;
        sb_status st = need_str(it, at, a, suffix ? "endswith() argument" : "startswith() argument");
        if (st)
            return st;
        if (a.s->len <= self.s->len &&
            memcmp(self.s->data + (suffix ? self.s->len - a.s->len : 0), a.s->data, a.s->len) == 0)
            return yes(true, out);
    }
    return yes(false, out);
}
FN(m_startswith) { return affix(it, at, self, args, false, out); }
FN(m_endswith) { return affix(it, at, self, args, true, out); }
FN(m_replace) { return do_replace(it, at, self, args, "count", out); }
FN(m_upper) { return change_case(self.s, UPPER, out); }
FN(m_lower) { return change_case(self.s, LOWER, out); }
FN(m_title) { return change_case(self.s, TITLE, out); }
FN(m_capitalize) { return change_case(self.s, CAPITALIZE, out); }

FN(m_find) {
    sb_tpl_val sub = sb_tpl_none();
    sb_tpl_arg(args, 0, "sub", &sub);
    sb_status st = need_str(it, at, sub, "find() argument");
    if (st)
        return st;
    const char *hit = sb_tpl_find_bytes(self.s->data, self.s->len, sub.s->data, sub.s->len);
    if (!hit) {
        *out = sb_tpl_int(-1);
        return SB_OK;
    }
    size_t chars = 0; /* byte offset to code point index */
    for (size_t pos = 0; pos < (size_t)(hit - self.s->data); chars++)
        sb_tpl_utf8_next(self.s->data, self.s->len, &pos);
    *out = sb_tpl_int((int64_t)chars);
    return SB_OK;
}

FN(m_count) {
    sb_tpl_val sub = sb_tpl_none();
    sb_tpl_arg(args, 0, "sub", &sub);
    sb_status st = need_str(it, at, sub, "count() argument");
    if (st)
        return st;
    if (sub.s->len == 0) {
        *out = sb_tpl_int((int64_t)sb_tpl_str_chars(self.s) + 1);
        return SB_OK;
    }
    int64_t n = 0;
    for (size_t pos = 0;;) {
        const char *hit = sb_tpl_find_bytes(self.s->data + pos, self.s->len - pos, sub.s->data, sub.s->len);
        if (!hit)
            break;
        n++;
        pos = (size_t)(hit - self.s->data) + sub.s->len;
    }
    *out = sb_tpl_int(n);
    return SB_OK;
}

FN(m_join) {
    sb_tpl_val seq = sb_tpl_none(), items;
    sb_tpl_arg(args, 0, "iterable", &seq);
    sb_status st = sb_tpl_iterate(it, at, seq, &items);
    if (st)
        return st;
    sb_tpl_buf b = {0};
    for (size_t i = 0; i < items.l->n && !st; i++) {
        if ((st = need_str(it, at, items.l->items[i], "join() item")))
            break;
        if (i)
            st = sb_tpl_buf_put(&b, self.s->data, self.s->len);
        if (!st)
            st = sb_tpl_buf_put(&b, items.l->items[i].s->data, items.l->items[i].s->len);
    }
    sb_tpl_release(items);
    return take_buf(&b, st, out);
}

static sb_status char_class(sb_tpl_val self, int which, sb_tpl_val *out) {
    if (self.s->len == 0)
        return yes(false, out);
    for (size_t pos = 0; pos < self.s->len;) {
        uint32_t c = sb_tpl_utf8_next(self.s->data, self.s->len, &pos);
        bool digit = c >= '0' && c <= '9', alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c >= 0x80;
        bool ok = which == 0 ? digit : which == 1 ? alpha : which == 2 ? digit || alpha : sb_tpl_is_space(c);
        if (!ok)
            return yes(false, out);
    }
    return yes(true, out);
}
FN(m_isdigit) { return char_class(self, 0, out); }
FN(m_isalpha) { return char_class(self, 1, out); }
FN(m_isalnum) { return char_class(self, 2, out); }
FN(m_isspace) { return char_class(self, 3, out); }

/* ---- list and dict methods ------------------------------------------------------------------- */

FN(m_index) {
    sb_tpl_val x = sb_tpl_none();
    sb_tpl_arg(args, 0, "value", &x);
    for (size_t i = 0; i < self.l->n; i++)
        if (sb_tpl_equal(self.l->items[i], x)) {
            *out = sb_tpl_int((int64_t)i);
            return SB_OK;
        }
    return sb_tpl_fail(it, at, SB_ERR_INVALID_ARG, "value is not in list");
}

FN(m_list_count) {
    sb_tpl_val x = sb_tpl_none();
    sb_tpl_arg(args, 0, "value", &x);
    int64_t n = 0;
    for (size_t i = 0; i < self.l->n; i++)
        n += sb_tpl_equal(self.l->items[i], x);
    *out = sb_tpl_int(n);
    return SB_OK;
}

FN(m_items) { return pairs(self, out); }

FN(m_keys) {
    sb_status st = sb_tpl_list_new(self.d->n, false, out);
    for (size_t i = 0; i < self.d->n && !st; i++)
        st = sb_tpl_list_push(*out, sb_tpl_retain(self.d->keys[i]));
    return st;
}

FN(m_values) {
    sb_status st = sb_tpl_list_new(self.d->n, false, out);
    for (size_t i = 0; i < self.d->n && !st; i++)
        st = sb_tpl_list_push(*out, sb_tpl_retain(self.d->vals[i]));
    return st;
}

FN(m_get) {
    sb_tpl_val key = sb_tpl_none(), def = sb_tpl_none();
    sb_tpl_arg(args, 0, "key", &key);
    sb_tpl_arg(args, 1, "default", &def);
    ptrdiff_t i = sb_tpl_dict_find(self.d, key);
    *out = sb_tpl_retain(i >= 0 ? self.d->vals[i] : def);
    return SB_OK;
}

/* Mutating methods: refused as by Jinja2's ImmutableSandboxedEnvironment. */
FN(m_unsafe) {
    (void)args, (void)out;
    return sb_tpl_fail(it, at, SB_ERR_INVALID_ARG, "access to a method that modifies a %s is unsafe (the template "
                                                   "environment is immutable, as in transformers)",
                       sb_tpl_type_name(self));
}

/* ---- globals -------------------------------------------------------------------------------- */

FN(g_range) {
    int64_t a[3] = {0, 0, 1};
    if (args->n_pos < 1 || args->n_pos > 3 || args->n_kw)
        return sb_tpl_fail(it, at, SB_ERR_INVALID_ARG, "range() takes 1 to 3 integer arguments");
    for (size_t i = 0; i < args->n_pos; i++) {
        sb_status st = need_int(it, at, args->pos[i], "range() argument", &a[args->n_pos == 1 ? 1 : i]);
        if (st)
            return st;
    }
    if (a[2] == 0)
        return sb_tpl_fail(it, at, SB_ERR_INVALID_ARG, "range() arg 3 must not be zero");
    double count = ceil(((double)a[1] - (double)a[0]) / (double)a[2]);
    if (count > SB_TPL_MAX_RANGE)
        return sb_tpl_fail(it, at, SB_ERR_UNSUPPORTED, "range() is too big (more than %d items)", SB_TPL_MAX_RANGE);
    sb_status st = sb_tpl_list_new(count > 0 ? (size_t)count : 0, false, out);
    for (int64_t v = a[0]; !st && (a[2] > 0 ? v < a[1] : v > a[1]); v += a[2])
        st = sb_tpl_list_push(*out, sb_tpl_int(v));
    return st;
}

/* namespace(...) and dict(...): a mapping from dict arguments and keywords. */
static sb_status make_mapping(sb_tpl_interp *it, const sb_tpl_node *at, const sb_tpl_args *args, sb_tpl_kind kind,
                              sb_tpl_val *out) {
    sb_status st = sb_tpl_dict_new(kind, out);
    for (size_t i = 0; i < args->n_pos && !st; i++) {
        sb_tpl_val d = args->pos[i];
        if (d.kind != SB_TPL_DICT)
            return sb_tpl_fail(it, at, SB_ERR_INVALID_ARG, "expected a mapping, not '%s'", sb_tpl_type_name(d));
        for (size_t k = 0; k < d.d->n && !st; k++)
            st = sb_tpl_dict_set(*out, sb_tpl_retain(d.d->keys[k]), sb_tpl_retain(d.d->vals[k]));
    }
    for (size_t k = 0; k < args->n_kw && !st; k++) {
        sb_tpl_val key;
        if (!(st = new_str(args->kw_names[k], strlen(args->kw_names[k]), &key)))
            st = sb_tpl_dict_set(*out, key, sb_tpl_retain(args->kw[k]));
    }
    return st;
}
FN(g_namespace) { return make_mapping(it, at, args, SB_TPL_NAMESPACE, out); }
FN(g_dict) { return make_mapping(it, at, args, SB_TPL_DICT, out); }

FN(g_raise_exception) {
    (void)out;
    sb_tpl_val msg = sb_tpl_none(), s;
    sb_tpl_arg(args, 0, "message", &msg);
    sb_status st = to_str(msg, &s);
    if (st)
        return st;
    st = sb_tpl_fail(it, at, SB_ERR_INVALID_ARG, "raise_exception: %s", s.s->data);
    sb_tpl_release(s);
    return st;
}

FN(g_strftime_now) {
    sb_tpl_val fmt = sb_tpl_none();
    sb_tpl_arg(args, 0, "format", &fmt);
    sb_status st = need_str(it, at, fmt, "strftime_now() format");
    if (st)
        return st;
    char buf[512];
    size_t n = fmt.s->len ? strftime(buf, sizeof(buf), fmt.s->data, &it->now) : 0;
    if (fmt.s->len && n == 0)
        return sb_tpl_fail(it, at, SB_ERR_UNSUPPORTED, "strftime_now() result is empty or too long");
    return new_str(buf, n, out);
}

/* ---- tables -------------------------------------------------------------------------------- */

static const sb_tpl_fn_def filters[] = {
    {"abs", f_abs, ""},
    {"attr", f_attr, "name"},
    {"capitalize", f_capitalize, ""},
    {"count", f_length, ""},
    {"d", f_default, "default_value,boolean"},
    {"default", f_default, "default_value,boolean"},
    {"dictsort", f_dictsort, "case_sensitive,by,reverse"},
    {"e", f_escape, ""},
    {"escape", f_escape, ""},
    {"first", f_first, ""},
    {"float", f_float, "default"},
    {"forceescape", f_escape, ""},
    {"indent", f_indent, "width,first,blank"},
    {"int", f_int, "default"},
    {"items", f_items, ""},
    {"join", f_join, "d,attribute"},
    {"last", f_last, ""},
    {"length", f_length, ""},
    {"list", f_list, ""},
    {"lower", f_lower, ""},
    {"map", f_map, NULL},
    {"max", f_max, "case_sensitive,attribute"},
    {"min", f_min, "case_sensitive,attribute"},
    {"reject", f_reject, NULL},
    {"rejectattr", f_rejectattr, NULL},
    {"replace", f_replace, "old,new,count"},
    {"reverse", f_reverse, ""},
    {"round", f_round, "precision,method"},
    {"safe", f_safe, ""},
    {"select", f_select, NULL},
    {"selectattr", f_selectattr, NULL},
    {"sort", f_sort, "reverse,case_sensitive,attribute"},
    {"string", f_string, ""},
    {"sum", f_sum, "attribute,start"},
    {"title", f_title, ""},
    {"tojson", f_tojson, "ensure_ascii,indent,separators,sort_keys"},
    {"trim", f_trim, "chars"},
    {"unique", f_unique, "case_sensitive,attribute"},
    {"upper", f_upper, ""},
    {"wordcount", f_wordcount, ""},
};

static const sb_tpl_fn_def tests[] = {
    {"!=", t_ne, "other"},
    {"<", t_lt, "other"},
    {"<=", t_le, "other"},
    {"==", t_eq, "other"},
    {">", t_gt, "other"},
    {">=", t_ge, "other"},
    {"boolean", t_boolean, ""},
    {"callable", t_callable, ""},
    {"defined", t_defined, ""},
    {"divisibleby", t_divisibleby, "num"},
    {"eq", t_eq, "other"},
    {"equalto", t_eq, "other"},
    {"escaped", t_escaped, ""},
    {"even", t_even, ""},
    {"false", t_false, ""},
    {"filter", t_filter, ""},
    {"float", t_float, ""},
    {"ge", t_ge, "other"},
    {"greaterthan", t_gt, "other"},
    {"gt", t_gt, "other"},
    {"in", t_in, "seq"},
    {"integer", t_integer, ""},
    {"iterable", t_iterable, ""},
    {"le", t_le, "other"},
    {"lessthan", t_lt, "other"},
    {"lower", t_lower, ""},
    {"lt", t_lt, "other"},
    {"mapping", t_mapping, ""},
    {"ne", t_ne, "other"},
    {"none", t_none, ""},
    {"number", t_number, ""},
    {"odd", t_odd, ""},
    {"sameas", t_sameas, "other"},
    {"sequence", t_sequence, ""},
    {"string", t_string, ""},
    {"test", t_test, ""},
    {"true", t_true, ""},
    {"undefined", t_undefined, ""},
    {"upper", t_upper, ""},
};

static const sb_tpl_fn_def str_methods[] = {
    {"capitalize", m_capitalize, ""}, {"count", m_count, "sub"},
    {"endswith", m_endswith, "suffix"}, {"find", m_find, "sub"},
    {"isalnum", m_isalnum, ""},       {"isalpha", m_isalpha, ""},
    {"isdigit", m_isdigit, ""},       {"isspace", m_isspace, ""},
    {"join", m_join, "iterable"},     {"lower", m_lower, ""},
    {"lstrip", m_lstrip, "chars"},    {"replace", m_replace, "old,new,count"},
    {"rstrip", m_rstrip, "chars"},    {"split", m_split, "sep,maxsplit"},
    {"startswith", m_startswith, "prefix"}, {"strip", m_strip, "chars"},
    {"title", m_title, ""},           {"upper", m_upper, ""},
};

static const sb_tpl_fn_def list_methods[] = {
    {"append", m_unsafe, NULL}, {"clear", m_unsafe, NULL},   {"count", m_list_count, "value"},
    {"extend", m_unsafe, NULL}, {"index", m_index, "value"}, {"insert", m_unsafe, NULL},
    {"pop", m_unsafe, NULL},    {"remove", m_unsafe, NULL},  {"reverse", m_unsafe, NULL},
    {"sort", m_unsafe, NULL},
};

static const sb_tpl_fn_def dict_methods[] = {
    {"clear", m_unsafe, NULL},      {"get", m_get, "key,default"}, {"items", m_items, ""},
    {"keys", m_keys, ""},           {"pop", m_unsafe, NULL},       {"popitem", m_unsafe, NULL},
    {"setdefault", m_unsafe, NULL}, {"update", m_unsafe, NULL},    {"values", m_values, ""},
};

static const sb_tpl_fn_def globals[] = {
    {"dict", g_dict, NULL},
    {"namespace", g_namespace, NULL},
    {"raise_exception", g_raise_exception, "message"},
    {"range", g_range, NULL},
    {"strftime_now", g_strftime_now, "format"},
};

static const sb_tpl_fn_def *find(const sb_tpl_fn_def *defs, size_t n, const char *name) {
    for (size_t i = 0; i < n; i++)
        if (strcmp(defs[i].name, name) == 0)
            return &defs[i];
    return NULL;
}

const sb_tpl_fn_def *sb_tpl_find_filter(const char *name) { return find(filters, SB_ARRAY_LEN(filters), name); }
const sb_tpl_fn_def *sb_tpl_find_test(const char *name) { return find(tests, SB_ARRAY_LEN(tests), name); }
const sb_tpl_fn_def *sb_tpl_find_global(const char *name) { return find(globals, SB_ARRAY_LEN(globals), name); }

const sb_tpl_fn_def *sb_tpl_find_method(sb_tpl_kind kind, const char *name) {
    switch (kind) {
    case SB_TPL_STR:
        return find(str_methods, SB_ARRAY_LEN(str_methods), name);
    case SB_TPL_LIST:
        return find(list_methods, SB_ARRAY_LEN(list_methods), name);
    case SB_TPL_DICT:
        return find(dict_methods, SB_ARRAY_LEN(dict_methods), name);
    default:
        return NULL;
    }
}

static bool listed(const char *const *names, size_t n, const char *name) {
    for (size_t i = 0; i < n; i++)
        if (strcmp(names[i], name) == 0)
            return true;
    return false;
}

bool sb_tpl_jinja_has_filter(const char *name) {
    static const char *const jinja[] = {"batch",    "center",   "filesizeformat", "format",   "groupby",
                                        "pprint",   "random",   "slice",          "striptags", "truncate",
                                        "urlencode", "urlize",  "wordwrap",       "xmlattr"};
    return sb_tpl_find_filter(name) || listed(jinja, SB_ARRAY_LEN(jinja), name);
}

bool sb_tpl_jinja_has_test(const char *name) { return sb_tpl_find_test(name) != NULL; }
