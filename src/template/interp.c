/*
 * interp.c - executes the syntax tree: scopes (one per loop iteration,
 * macro call and block, as Jinja2's frames), statements, and expressions
 * with Python's operator semantics and Jinja2's Undefined (missing names and
 * keys evaluate to undefined; using one as an object, number or callable is
 * an error, as with Jinja2's default Undefined).
 *
 * Runaway templates end with an error, never a crash: macro recursion is
 * capped at SB_TPL_MAX_CALL_DEPTH, work at SB_TPL_MAX_STEPS, and every
 * string at SB_TPL_MAX_BYTES.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "base/base.h"
#include "template/template-impl.h"

struct sb_tpl_scope {
    int32_t refs;
    sb_tpl_scope *parent; /* a counted reference */
    sb_tpl_val vars;      /* DICT, or NONE once the scope has ended */
};

static sb_status exec_body(sb_tpl_interp *it, const sb_tpl_nodes *body);
static sb_status eval(sb_tpl_interp *it, const sb_tpl_node *n, sb_tpl_val *out);

/* ---- errors --------------------------------------------------------------------- */

sb_status sb_tpl_fail(sb_tpl_interp *it, const sb_tpl_node *at, sb_status status, const char *fmt, ...) {
    char msg[448];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    int line = 0, col = 0;
    if (at)
        sb_tpl_position(it->tpl->src, at->off, &line, &col);
    return sb_fail(it->err, status, "template:%d:%d: %s", line, col, msg);
}

/* Using an undefined value where a real one is needed (Jinja2's UndefinedError). */
static sb_status undefined_error(sb_tpl_interp *it, const sb_tpl_node *at, sb_tpl_val v) {
    return sb_tpl_fail(it, at, SB_ERR_INVALID_ARG, "%s", v.s ? v.s->data : "undefined value");
}

/* An undefined value carrying the message of Jinja2's UndefinedError. */
static sb_status make_undefined(sb_tpl_val *out, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static sb_status make_undefined(sb_tpl_val *out, const char *fmt, ...) {
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    sb_tpl_val s;
    sb_status st = sb_tpl_str_new(msg, (size_t)n < sizeof(msg) ? (size_t)n : sizeof(msg) - 1, &s);
    *out = sb_tpl_undef();
    if (!st)
        out->s = s.s;
    return st;
}

static sb_status missing_attr(sb_tpl_val obj, const char *name, sb_tpl_val *out) {
    return make_undefined(out, "'%s object' has no attribute '%s'", obj.kind == SB_TPL_NONE ? "None" : sb_tpl_type_name(obj),
                          name);
}

sb_status sb_tpl_charge(sb_tpl_interp *it, const sb_tpl_node *at, uint64_t n) {
    it->steps += n;
    if (it->steps > SB_TPL_MAX_STEPS)
        return sb_tpl_fail(it, at, SB_ERR_UNSUPPORTED, "template exceeds the limit of %llu evaluation steps",
                           (unsigned long long)SB_TPL_MAX_STEPS);
    return SB_OK;
}

uint64_t sb_tpl_size_steps(sb_tpl_val v) {
    switch (v.kind) {
    case SB_TPL_STR:
        return v.s->len / 64;
    case SB_TPL_LIST:
        return v.l->n / 8;
    case SB_TPL_DICT:
    case SB_TPL_NAMESPACE:
        return v.d->n / 8;
    default:
        return 0;
    }
}

/* ---- scopes ------------------------------------------------------------------------ */

static void scope_unref(sb_tpl_scope *s) {
    while (s && --s->refs == 0) {
        sb_tpl_scope *parent = s->parent;
        sb_tpl_release(s->vars);
        sb_free(s);
        s = parent;
    }
}

/* Enters a new scope whose parent is `parent` (it->scope when NULL). Scopes
 * nest as a stack: whoever pushes saves it->scope and pops back to it. */
static sb_status scope_push(sb_tpl_interp *it, sb_tpl_scope *parent) {
    sb_tpl_scope *s = sb_calloc(1, sizeof(*s));
    if (!s || sb_tpl_dict_new(SB_TPL_DICT, &s->vars)) {
        sb_free(s);
        return SB_ERR_NOMEM;
    }
    s->refs = 1;
    s->parent = parent ? parent : it->scope;
    s->parent->refs++;
    it->scope = s;
    return SB_OK;
}

/* Leaves the current scope, returning to `prev`: its variables are dropped
 * now (which breaks the cycle scope -> macro -> closure -> scope). */
static void scope_pop(sb_tpl_interp *it, sb_tpl_scope *prev) {
    sb_tpl_scope *s = it->scope;
    it->scope = prev;
    sb_tpl_val vars = s->vars;
    s->vars = sb_tpl_none();
    sb_tpl_release(vars);
    scope_unref(s);
}

static sb_status scope_set(sb_tpl_interp *it, const char *name, sb_tpl_val v) {
    sb_tpl_val key;
    sb_status st = sb_tpl_str_new(name, strlen(name), &key);
    if (st) {
        sb_tpl_release(v);
        return st;
    }
    return sb_tpl_dict_set(it->scope->vars, key, v);
}

void sb_tpl_func_free(struct sb_tpl_func *fn) {
    scope_unref(fn->closure);
    sb_tpl_release(fn->self);
    sb_free(fn);
}

static sb_status func_new(sb_tpl_func_kind kind, sb_tpl_val *out) {
    struct sb_tpl_func *fn = sb_calloc(1, sizeof(*fn));
    if (!fn)
        return SB_ERR_NOMEM;
    fn->refs = 1;
    fn->kind = kind;
    fn->self = sb_tpl_undef();
    *out = (sb_tpl_val){.kind = SB_TPL_FUNC, .fn = fn};
    return SB_OK;
}

static sb_status lookup(sb_tpl_interp *it, const char *name, sb_tpl_val *out) {
    for (sb_tpl_scope *s = it->scope; s; s = s->parent) {
        if (s->vars.kind != SB_TPL_DICT)
            continue;
        const sb_tpl_val *v = sb_tpl_dict_get(s->vars.d, name);
        if (v) {
            *out = sb_tpl_retain(*v);
            return SB_OK;
        }
    }
    const sb_tpl_fn_def *def = sb_tpl_find_global(name);
    if (def) {
        sb_status st = func_new(SB_TPL_FUNC_GLOBAL, out);
        if (!st)
            out->fn->def = def;
        return st;
    }
    return make_undefined(out, "'%s' is undefined", name);
}

/* ---- attribute and item access -------------------------------------------------------- */

static sb_status method(sb_tpl_val obj, const char *name, bool *found, sb_tpl_val *out) {
    const sb_tpl_fn_def *def = sb_tpl_find_method(obj.kind, name);
    *found = def != NULL;
    if (!def)
        return SB_OK;
    sb_status st = func_new(SB_TPL_FUNC_METHOD, out);
    if (!st) {
        out->fn->def = def;
        out->fn->self = sb_tpl_retain(obj);
    }
    return st;
}

sb_status sb_tpl_getattr(sb_tpl_interp *it, const sb_tpl_node *at, sb_tpl_val obj, const char *name, sb_tpl_val *out) {
    *out = sb_tpl_undef();
    if (obj.kind == SB_TPL_UNDEFINED)
        return undefined_error(it, at, obj);
    bool found;
    sb_status st = method(obj, name, &found, out);
    if (st || found)
        return st;
    if (obj.kind == SB_TPL_DICT || obj.kind == SB_TPL_NAMESPACE) {
        const sb_tpl_val *v = sb_tpl_dict_get(obj.d, name);
        if (v) {
            *out = sb_tpl_retain(*v);
            return SB_OK;
        }
    }
    return missing_attr(obj, name, out);
}

/* Python's slice.indices(): normalized start, stop, step for a length. */
static bool slice_indices(sb_tpl_val vs[3], int64_t len, int64_t *start, int64_t *stop, int64_t *step) {
    *step = vs[2].kind == SB_TPL_NONE ? 1 : vs[2].i;
    if (*step == 0)
        return false;
    int64_t lo = *step < 0 ? -1 : 0, hi = *step < 0 ? len - 1 : len;
    for (int k = 0; k < 2; k++) {
        int64_t *dst = k == 0 ? start : stop;
        if (vs[k].kind == SB_TPL_NONE) {
            *dst = (*step < 0) == (k == 0) ? hi : lo;
            continue;
        }
        int64_t v = vs[k].i;
        if (v < 0) {
            v += len;
            if (v < lo)
                v = lo;
        } else if (v > hi) {
            v = hi;
        }
        *dst = v;
    }
    return true;
}

static sb_status get_slice(sb_tpl_interp *it, const sb_tpl_node *at, sb_tpl_val obj, sb_tpl_val vs[3],
                           sb_tpl_val *out) {
    for (int k = 0; k < 3; k++) {
        if (vs[k].kind == SB_TPL_BOOL)
            vs[k] = sb_tpl_int(vs[k].b);
        if (vs[k].kind != SB_TPL_INT && vs[k].kind != SB_TPL_NONE)
            return sb_tpl_fail(it, at, SB_ERR_INVALID_ARG, "slice indices must be integers or None, not %s",
                               sb_tpl_type_name(vs[k]));
    }
    if (obj.kind == SB_TPL_UNDEFINED)
        return undefined_error(it, at, obj);
    int64_t start, stop, step;
    if (obj.kind == SB_TPL_LIST) {
        if (!slice_indices(vs, (int64_t)obj.l->n, &start, &stop, &step))
            return sb_tpl_fail(it, at, SB_ERR_INVALID_ARG, "slice step cannot be zero");
        sb_status st = sb_tpl_list_new(0, obj.l->tuple, out);
        for (int64_t i = start; !st && (step > 0 ? i < stop : i > stop); i += step)
            st = sb_tpl_list_push(*out, sb_tpl_retain(obj.l->items[i]));
        return st;
    }
    if (obj.kind != SB_TPL_STR) {
        *out = sb_tpl_undef();
        return SB_OK;
    }
    const sb_tpl_str *s = obj.s;
    size_t chars = sb_tpl_str_chars(s);
    if (!slice_indices(vs, (int64_t)chars, &start, &stop, &step))
        return sb_tpl_fail(it, at, SB_ERR_INVALID_ARG, "slice step cannot be zero");
    if (step == 1) {
        size_t a = start < stop ? sb_tpl_str_offset(s, (size_t)start) : 0;
        size_t b = start < stop ? sb_tpl_str_offset(s, (size_t)stop) : 0;
        return sb_tpl_str_new(s->data + a, b - a, out);
    }
    /* any step: code point offsets, then pick */
    size_t *offs = sb_calloc(chars + 1, sizeof(*offs));
    if (!offs)
        return SB_ERR_NOMEM;
    size_t pos = 0;
    for (size_t i = 0; i < chars; i++) {
        offs[i] = pos;
        sb_tpl_utf8_next(s->data, s->len, &pos);
    }
    offs[chars] = s->len;
    sb_tpl_buf b = {0};
    sb_status st = SB_OK;
    for (int64_t i = start; !st && (step > 0 ? i < stop : i > stop); i += step)
        st = sb_tpl_buf_put(&b, s->data + offs[i], offs[i + 1] - offs[i]);
    sb_free(offs);
    if (!st)
        st = sb_tpl_buf_take(&b, out);
    sb_tpl_buf_free(&b);
    return st;
}

static sb_status getitem(sb_tpl_interp *it, const sb_tpl_node *at, sb_tpl_val obj, sb_tpl_val key, sb_tpl_val *out) {
    *out = sb_tpl_undef();
    if (obj.kind == SB_TPL_UNDEFINED)
        return undefined_error(it, at, obj);
    if (obj.kind == SB_TPL_DICT) {
        ptrdiff_t i = sb_tpl_dict_find(obj.d, key);
        if (i >= 0) {
            *out = sb_tpl_retain(obj.d->vals[i]);
            return SB_OK;
        }
    } else if ((obj.kind == SB_TPL_LIST || obj.kind == SB_TPL_STR) &&
               (key.kind == SB_TPL_INT || key.kind == SB_TPL_BOOL)) {
        int64_t i = key.kind == SB_TPL_INT ? key.i : key.b;
        int64_t n = obj.kind == SB_TPL_LIST ? (int64_t)obj.l->n : (int64_t)sb_tpl_str_chars(obj.s);
        if (i < 0)
            i += n;
        if (i >= 0 && i < n) {
            if (obj.kind == SB_TPL_LIST) {
                *out = sb_tpl_retain(obj.l->items[i]);
                return SB_OK;
            }
            size_t a = sb_tpl_str_offset(obj.s, (size_t)i), b = a;
            sb_tpl_utf8_next(obj.s->data, obj.s->len, &b);
            return sb_tpl_str_new(obj.s->data + a, b - a, out);
        }
        return make_undefined(out, "%s index out of range", obj.kind == SB_TPL_LIST ? "list" : "string");
    }
    if (key.kind == SB_TPL_STR) /* obj['name'] falls back to obj.name */
        return sb_tpl_getattr(it, at, obj, key.s->data, out);
    sb_tpl_buf b = {0};
    sb_status st = sb_tpl_write_repr(&b, key);
    if (!st)
        st = make_undefined(out, "'%s object' has no attribute %.200s", sb_tpl_type_name(obj), b.p);
    sb_tpl_buf_free(&b);
    return st;
}

/* ---- operators ----------------------------------------------------------------------- */

static bool numeric(sb_tpl_val v) { return v.kind == SB_TPL_INT || v.kind == SB_TPL_BOOL || v.kind == SB_TPL_FLOAT; }
static double to_double(sb_tpl_val v) { return v.kind == SB_TPL_FLOAT ? v.f : v.kind == SB_TPL_INT ? (double)v.i : v.b; }
static int64_t to_int(sb_tpl_val v) { return v.kind == SB_TPL_INT ? v.i : v.kind == SB_TPL_BOOL ? v.b : 0; }

static sb_status type_error(sb_tpl_interp *it, const sb_tpl_node *at, const char *op, sb_tpl_val a, sb_tpl_val b) {
    return sb_tpl_fail(it, at, SB_ERR_INVALID_ARG, "unsupported operand type(s) for %s: '%s' and '%s'", op,
                       sb_tpl_type_name(a), sb_tpl_type_name(b));
}

/* seq * n for strings and lists. */
static sb_status repeat(sb_tpl_interp *it, const sb_tpl_node *at, sb_tpl_val seq, int64_t n, sb_tpl_val *out) {
    if (n < 0)
        n = 0;
    size_t unit = seq.kind == SB_TPL_STR ? seq.s->len : seq.l->n;
    if (unit && (uint64_t)n > (seq.kind == SB_TPL_STR ? SB_TPL_MAX_BYTES : SB_TPL_MAX_RANGE) / unit)
        return sb_tpl_fail(it, at, SB_ERR_UNSUPPORTED, "repetition result is too large");
    if (seq.kind == SB_TPL_STR) {
        sb_tpl_buf b = {0};
        sb_status st = SB_OK;
        for (int64_t i = 0; i < n && !st; i++)
            st = sb_tpl_buf_put(&b, seq.s->data, seq.s->len);
        if (!st)
            st = sb_tpl_buf_take(&b, out);
        sb_tpl_buf_free(&b);
        return st;
    }
    sb_status st = sb_tpl_list_new(0, seq.l->tuple, out);
    for (int64_t i = 0; i < n && !st; i++)
        for (size_t j = 0; j < seq.l->n && !st; j++)
            st = sb_tpl_list_push(*out, sb_tpl_retain(seq.l->items[j]));
    return st;
}

static sb_status binop(sb_tpl_interp *it, const sb_tpl_node *at, const char *op, sb_tpl_val a, sb_tpl_val b,
                       sb_tpl_val *out) {
    *out = sb_tpl_none();
    if (a.kind == SB_TPL_UNDEFINED)
        return undefined_error(it, at, a);
    if (b.kind == SB_TPL_UNDEFINED)
        return undefined_error(it, at, b);
    char c = op[0];
    bool both_int = (a.kind == SB_TPL_INT || a.kind == SB_TPL_BOOL) && (b.kind == SB_TPL_INT || b.kind == SB_TPL_BOOL);
    if (numeric(a) && numeric(b)) {
        int64_t x = to_int(a), y = to_int(b), r = 0;
        double fx = to_double(a), fy = to_double(b);
        if (c == '+' || c == '-' || (c == '*' && !op[1])) {
            if (both_int) {
                bool ovf = c == '+' ? __builtin_add_overflow(x, y, &r)
                         : c == '-' ? __builtin_sub_overflow(x, y, &r) : __builtin_mul_overflow(x, y, &r);
                if (ovf)
                    return sb_tpl_fail(it, at, SB_ERR_UNSUPPORTED, "integer overflow in '%s'", op);
                *out = sb_tpl_int(r);
            } else {
                *out = sb_tpl_float(c == '+' ? fx + fy : c == '-' ? fx - fy : fx * fy);
            }
            return SB_OK;
        }
        if (c == '/' || c == '%') {
            if (both_int ? y == 0 : fy == 0.0)
                return sb_tpl_fail(it, at, SB_ERR_INVALID_ARG, "%s by zero",
                                   c == '%' ? "modulo" : op[1] ? "integer division" : "division");
            if (c == '/' && !op[1]) {
                *out = sb_tpl_float(fx / fy);
            } else if (both_int) {
                if (x == INT64_MIN && y == -1)
                    return sb_tpl_fail(it, at, SB_ERR_UNSUPPORTED, "integer overflow in '%s'", op);
                int64_t q = x / y, m = x % y;
                if (m != 0 && ((m < 0) != (y < 0))) {
                    q--;
                    m += y;
                }
                *out = sb_tpl_int(c == '%' ? m : q);
            } else {
                double m = fmod(fx, fy);
                if (m != 0 && ((m < 0) != (fy < 0)))
                    m += fy;
                *out = sb_tpl_float(c == '%' ? m : floor(fx / fy));
            }
            return SB_OK;
        }
        /* ** */
        if (both_int && y >= 0) {
            int64_t base = x, e = y;
            r = 1;
            while (e > 0) {
                if ((e & 1) && __builtin_mul_overflow(r, base, &r))
                    return sb_tpl_fail(it, at, SB_ERR_UNSUPPORTED, "integer overflow in '**'");
                e >>= 1;
                if (e && __builtin_mul_overflow(base, base, &base))
                    return sb_tpl_fail(it, at, SB_ERR_UNSUPPORTED, "integer overflow in '**'");
            }
            *out = sb_tpl_int(r);
            return SB_OK;
        }
        if (fx == 0.0 && fy < 0)
            return sb_tpl_fail(it, at, SB_ERR_INVALID_ARG, "0.0 cannot be raised to a negative power");
        *out = sb_tpl_float(pow(fx, fy));
        return SB_OK;
    }
    if (c == '+' && a.kind == SB_TPL_STR && b.kind == SB_TPL_STR) {
        sb_tpl_buf buf = {0};
        sb_status st = sb_tpl_buf_put(&buf, a.s->data, a.s->len);
        if (!st)
            st = sb_tpl_buf_put(&buf, b.s->data, b.s->len);
        if (!st)
            st = sb_tpl_buf_take(&buf, out);
        sb_tpl_buf_free(&buf);
        return st;
    }
    if (c == '+' && a.kind == SB_TPL_LIST && b.kind == SB_TPL_LIST && a.l->tuple == b.l->tuple) {
        sb_status st = sb_tpl_list_new(a.l->n + b.l->n, a.l->tuple, out);
        for (size_t i = 0; i < a.l->n && !st; i++)
            st = sb_tpl_list_push(*out, sb_tpl_retain(a.l->items[i]));
        for (size_t i = 0; i < b.l->n && !st; i++)
            st = sb_tpl_list_push(*out, sb_tpl_retain(b.l->items[i]));
        return st;
    }
    if (c == '*' && !op[1]) {
        bool a_seq = a.kind == SB_TPL_STR || a.kind == SB_TPL_LIST, b_seq = b.kind == SB_TPL_STR || b.kind == SB_TPL_LIST;
        if (a_seq && (b.kind == SB_TPL_INT || b.kind == SB_TPL_BOOL))
            return repeat(it, at, a, to_int(b), out);
        if (b_seq && (a.kind == SB_TPL_INT || a.kind == SB_TPL_BOOL))
            return repeat(it, at, b, to_int(a), out);
    }
    if (c == '+' && a.kind == SB_TPL_STR)
        return sb_tpl_fail(it, at, SB_ERR_INVALID_ARG, "can only concatenate str (not \"%s\") to str",
                           sb_tpl_type_name(b));
    if (c == '%' && a.kind == SB_TPL_STR)
        return sb_tpl_fail(it, at, SB_ERR_UNSUPPORTED, "printf-style string formatting with '%%' is not supported");
    return type_error(it, at, op, a, b);
}

static sb_status contains(sb_tpl_interp *it, const sb_tpl_node *at, sb_tpl_val item, sb_tpl_val container, bool *out) {
    *out = false;
    switch (container.kind) {
    case SB_TPL_STR:
        if (item.kind != SB_TPL_STR)
            return sb_tpl_fail(it, at, SB_ERR_INVALID_ARG, "'in <string>' requires string as left operand, not %s",
                               sb_tpl_type_name(item));
        *out = sb_tpl_find_bytes(container.s->data, container.s->len, item.s->data, item.s->len) != NULL;
        return SB_OK;
    case SB_TPL_LIST:
        for (size_t i = 0; i < container.l->n && !*out; i++)
            *out = sb_tpl_equal(item, container.l->items[i]);
        return SB_OK;
    case SB_TPL_DICT:
        *out = sb_tpl_dict_find(container.d, item) >= 0;
        return SB_OK;
    case SB_TPL_UNDEFINED:
        return SB_OK;
    default:
        return sb_tpl_fail(it, at, SB_ERR_INVALID_ARG, "argument of type '%s' is not iterable",
                           sb_tpl_type_name(container));
    }
}

static sb_status compare(sb_tpl_interp *it, const sb_tpl_node *at, const char *op, sb_tpl_val a, sb_tpl_val b,
                         bool *out) {
    if (strcmp(op, "==") == 0 || strcmp(op, "!=") == 0) {
        *out = sb_tpl_equal(a, b) == (op[0] == '=');
        return SB_OK;
    }
    if (strcmp(op, "in") == 0 || strcmp(op, "notin") == 0) {
        sb_status st = contains(it, at, a, b, out);
        if (op[0] == 'n')
            *out = !*out;
        return st;
    }
    if (a.kind == SB_TPL_UNDEFINED)
        return undefined_error(it, at, a);
    if (b.kind == SB_TPL_UNDEFINED)
        return undefined_error(it, at, b);
    int c;
    if (!sb_tpl_order(a, b, &c))
        return sb_tpl_fail(it, at, SB_ERR_INVALID_ARG, "'%s' not supported between instances of '%s' and '%s'", op,
                           sb_tpl_type_name(a), sb_tpl_type_name(b));
    if (c == 2) { /* NaN */
        *out = false;
        return SB_OK;
    }
    *out = op[0] == '<' ? (op[1] ? c <= 0 : c < 0) : (op[1] ? c >= 0 : c > 0);
    return SB_OK;
}

/* ---- calls ----------------------------------------------------------------------------- */

static void args_free(sb_tpl_args *a) {
    for (size_t i = 0; i < a->n_pos; i++)
        sb_tpl_release(a->pos[i]);
    for (size_t i = 0; i < a->n_kw; i++)
        sb_tpl_release(a->kw[i]);
    sb_free(a->pos);
    sb_free(a->kw);
    sb_free(a->kw_names);
    *a = (sb_tpl_args){0};
}

/* Evaluates n->args and n->kwargs, with room for `extra_kw` more keywords. */
static sb_status eval_args(sb_tpl_interp *it, const sb_tpl_node *n, size_t extra_kw, sb_tpl_args *a) {
    *a = (sb_tpl_args){0};
    a->pos = sb_calloc(n->args.n + 1, sizeof(*a->pos));
    a->kw = sb_calloc(n->kwargs.n + extra_kw + 1, sizeof(*a->kw));
    a->kw_names = sb_calloc(n->kwargs.n + extra_kw + 1, sizeof(*a->kw_names));
    if (!a->pos || !a->kw || !a->kw_names) {
        args_free(a);
        return SB_ERR_NOMEM;
    }
    sb_status st = SB_OK;
    for (size_t i = 0; i < n->args.n && !st; i++)
        if (!(st = eval(it, n->args.v[i], &a->pos[i])))
            a->n_pos++;
    for (size_t i = 0; i < n->kwargs.n && !st; i++) {
        a->kw_names[i] = n->kwargs.v[i]->name;
        if (!(st = eval(it, n->kwargs.v[i]->a, &a->kw[i])))
            a->n_kw++;
    }
    if (st)
        args_free(a);
    return st;
}

/* Runs a macro or a call block's caller: binds arguments in a new scope
 * under the closure and renders the body into a string. */
static sb_status call_macro(sb_tpl_interp *it, const sb_tpl_node *at, struct sb_tpl_func *fn, const sb_tpl_args *args,
                            sb_tpl_val *out) {
    const sb_tpl_node *m = fn->node;
    const char *name = m->type == SB_TPL_N_MACRO ? m->name : "caller";
    if (it->depth >= SB_TPL_MAX_CALL_DEPTH)
        return sb_tpl_fail(it, at, SB_ERR_UNSUPPORTED, "macro calls nested deeper than %d (runaway recursion in '%s'?)",
                           SB_TPL_MAX_CALL_DEPTH, name);
    if (args->n_pos > m->args.n)
        return sb_tpl_fail(it, at, SB_ERR_INVALID_ARG, "macro '%s' takes not more than %zu argument(s)", name,
                           m->args.n);
    sb_tpl_scope *saved = it->scope;
    sb_status st = scope_push(it, fn->closure);
    if (st)
        return st;
    for (size_t k = 0; k < args->n_kw && !st; k++) {
        bool known = strcmp(args->kw_names[k], "caller") == 0;
        for (size_t i = 0; i < m->args.n && !known; i++)
            known = strcmp(m->args.v[i]->name, args->kw_names[k]) == 0;
        if (!known)
            st = sb_tpl_fail(it, at, SB_ERR_INVALID_ARG, "macro '%s' takes no keyword argument '%s'", name,
                             args->kw_names[k]);
        else if (strcmp(args->kw_names[k], "caller") == 0)
            st = scope_set(it, "caller", sb_tpl_retain(args->kw[k]));
    }
    for (size_t i = 0; i < m->args.n && !st; i++) {
        const sb_tpl_node *param = m->args.v[i];
        sb_tpl_val v = sb_tpl_undef();
        bool given = i < args->n_pos;
        if (given)
            v = sb_tpl_retain(args->pos[i]);
        for (size_t k = 0; k < args->n_kw && !given; k++)
            if (strcmp(args->kw_names[k], param->name) == 0) {
                v = sb_tpl_retain(args->kw[k]);
                given = true;
            }
        if (!given && param->a)
            st = eval(it, param->a, &v);
        else if (!given)
            st = make_undefined(&v, "parameter '%s' was not provided", param->name);
        if (!st)
            st = scope_set(it, param->name, v);
    }
    sb_tpl_buf buf = {0}, *saved_out = it->out;
    if (!st) {
        it->depth++;
        it->out = &buf;
        st = exec_body(it, &m->body);
        it->loop_ctl = 0;
        it->out = saved_out;
        it->depth--;
    }
    if (!st)
        st = sb_tpl_buf_take(&buf, out);
    sb_tpl_buf_free(&buf);
    scope_pop(it, saved);
    return st;
}

/* Calls a callable value with args. */
static sb_status call(sb_tpl_interp *it, const sb_tpl_node *at, sb_tpl_val fn, const sb_tpl_args *args,
                      sb_tpl_val *out) {
    *out = sb_tpl_none();
    if (fn.kind == SB_TPL_UNDEFINED)
        return undefined_error(it, at, fn);
    if (fn.kind != SB_TPL_FUNC)
        return sb_tpl_fail(it, at, SB_ERR_INVALID_ARG, "'%s' object is not callable", sb_tpl_type_name(fn));
    switch (fn.fn->kind) {
    case SB_TPL_FUNC_MACRO:
    case SB_TPL_FUNC_CALLER:
        return call_macro(it, at, fn.fn, args, out);
    default:
        return sb_tpl_invoke(it, at, fn.fn->def, fn.fn->self, args, out);
    }
}

/* A CALL node, optionally with a `caller` keyword (call blocks). */
static sb_status eval_call(sb_tpl_interp *it, const sb_tpl_node *n, sb_tpl_val caller, sb_tpl_val *out) {
    sb_tpl_val fn;
    sb_status st = eval(it, n->a, &fn);
    if (st)
        return st;
    sb_tpl_args args;
    bool with_caller = caller.kind == SB_TPL_FUNC;
    if (!(st = eval_args(it, n, with_caller, &args))) {
        if (with_caller) {
            args.kw_names[args.n_kw] = "caller";
            args.kw[args.n_kw++] = sb_tpl_retain(caller);
        }
        st = call(it, n, fn, &args, out);
        args_free(&args);
    }
    sb_tpl_release(fn);
    return st;
}

/* Applies a FILTER or TEST node to `input` (borrowed). */
static sb_status apply(sb_tpl_interp *it, const sb_tpl_node *n, sb_tpl_val input, sb_tpl_val *out) {
    bool filter = n->type == SB_TPL_N_FILTER;
    if (!n->fn) {
        bool jinja = filter ? sb_tpl_jinja_has_filter(n->name) : sb_tpl_jinja_has_test(n->name);
        return sb_tpl_fail(it, n, jinja ? SB_ERR_UNSUPPORTED : SB_ERR_INVALID_ARG,
                           jinja ? "the '%s' %s is not supported" : "no %2$s named '%1$s'", n->name,
                           filter ? "filter" : "test");
    }
    sb_tpl_args args;
    sb_status st = eval_args(it, n, 0, &args);
    if (st)
        return st;
    st = sb_tpl_invoke(it, n, n->fn, input, &args, out);
    args_free(&args);
    return st;
}

/* A chain of FILTER nodes whose innermost input is NULL (filter blocks). */
static sb_status apply_chain(sb_tpl_interp *it, const sb_tpl_node *chain, sb_tpl_val input, sb_tpl_val *out) {
    if (!chain) {
        *out = sb_tpl_retain(input);
        return SB_OK;
    }
    sb_tpl_val inner;
    sb_status st = apply_chain(it, chain->a, input, &inner);
    if (st)
        return st;
    st = apply(it, chain, inner, out);
    sb_tpl_release(inner);
    return st;
}

/* ---- expressions ----------------------------------------------------------------------- */

static sb_status eval_items(sb_tpl_interp *it, const sb_tpl_nodes *items, bool tuple, sb_tpl_val *out) {
    sb_status st = sb_tpl_list_new(items->n, tuple, out);
    for (size_t i = 0; i < items->n && !st; i++) {
        sb_tpl_val v;
        if (!(st = eval(it, items->v[i], &v)))
            st = sb_tpl_list_push(*out, v);
    }
    return st;
}

static sb_status eval_inner(sb_tpl_interp *it, const sb_tpl_node *n, sb_tpl_val *out) {
    sb_tpl_val a = sb_tpl_none(), b = sb_tpl_none();
    sb_status st = SB_OK;
    switch (n->type) {
    case SB_TPL_N_CONST:
        *out = sb_tpl_retain(n->val);
        return SB_OK;
    case SB_TPL_N_NAME:
        return lookup(it, n->name, out);
    case SB_TPL_N_LIST:
    case SB_TPL_N_TUPLE:
        return eval_items(it, &n->args, n->type == SB_TPL_N_TUPLE, out);
    case SB_TPL_N_DICT:
        st = sb_tpl_dict_new(SB_TPL_DICT, out);
        for (size_t i = 0; i < n->args.n && !st; i++) {
            if ((st = eval(it, n->args.v[i]->a, &a)))
                break;
            if ((st = eval(it, n->args.v[i]->b, &b))) {
                sb_tpl_release(a);
                break;
            }
            if (a.kind == SB_TPL_LIST || a.kind == SB_TPL_DICT || a.kind == SB_TPL_UNDEFINED) {
                st = sb_tpl_fail(it, n->args.v[i], SB_ERR_INVALID_ARG, "unhashable type: '%s'", sb_tpl_type_name(a));
                sb_tpl_release(a);
                sb_tpl_release(b);
                break;
            }
            st = sb_tpl_dict_set(*out, a, b);
        }
        return st;
    case SB_TPL_N_GETATTR:
        if (!(st = eval(it, n->a, &a)))
            st = sb_tpl_getattr(it, n, a, n->name, out);
        sb_tpl_release(a);
        return st;
    case SB_TPL_N_GETITEM:
        if ((st = eval(it, n->a, &a)))
            return st;
        if (n->b->type == SB_TPL_N_SLICE) {
            sb_tpl_val vs[3] = {sb_tpl_none(), sb_tpl_none(), sb_tpl_none()};
            const sb_tpl_node *parts[3] = {n->b->a, n->b->b, n->b->c};
            for (int k = 0; k < 3 && !st; k++)
                if (parts[k])
                    st = eval(it, parts[k], &vs[k]);
            if (!st)
                st = get_slice(it, n, a, vs, out);
            for (int k = 0; k < 3; k++)
                sb_tpl_release(vs[k]);
        } else if (!(st = eval(it, n->b, &b))) {
            st = getitem(it, n, a, b, out);
        }
        sb_tpl_release(a);
        sb_tpl_release(b);
        return st;
    case SB_TPL_N_CALL:
        return eval_call(it, n, sb_tpl_none(), out);
    case SB_TPL_N_FILTER:
    case SB_TPL_N_TEST:
        if ((st = eval(it, n->a, &a)))
            return st;
        st = apply(it, n, a, out);
        sb_tpl_release(a);
        return st;
    case SB_TPL_N_NOT:
        if (!(st = eval(it, n->a, &a)))
            *out = sb_tpl_bool(!sb_tpl_truthy(a));
        sb_tpl_release(a);
        return st;
    case SB_TPL_N_NEG:
    case SB_TPL_N_POS:
        if ((st = eval(it, n->a, &a)))
            return st;
        if (a.kind == SB_TPL_UNDEFINED)
            st = undefined_error(it, n, a);
        else if (!numeric(a))
            st = sb_tpl_fail(it, n, SB_ERR_INVALID_ARG, "bad operand type for unary %c: '%s'",
                             n->type == SB_TPL_N_NEG ? '-' : '+', sb_tpl_type_name(a));
        else if (n->type == SB_TPL_N_POS)
            *out = a.kind == SB_TPL_BOOL ? sb_tpl_int(a.b) : a;
        else if (a.kind == SB_TPL_FLOAT)
            *out = sb_tpl_float(-a.f);
        else if (to_int(a) == INT64_MIN)
            st = sb_tpl_fail(it, n, SB_ERR_UNSUPPORTED, "integer overflow in unary -");
        else
            *out = sb_tpl_int(-to_int(a));
        sb_tpl_release(a);
        return st;
    case SB_TPL_N_BINOP:
        if (!(st = eval(it, n->a, &a)) && !(st = eval(it, n->b, &b)))
            st = binop(it, n, n->op, a, b, out);
        sb_tpl_release(a);
        sb_tpl_release(b);
        return st;
    case SB_TPL_N_CONCAT: {
        sb_tpl_buf buf = {0};
        for (size_t i = 0; i < n->args.n && !st; i++) {
            if (!(st = eval(it, n->args.v[i], &a)))
                st = sb_tpl_write_str(&buf, a);
            sb_tpl_release(a);
        }
        if (!st)
            st = sb_tpl_buf_take(&buf, out);
        sb_tpl_buf_free(&buf);
        return st;
    }
    case SB_TPL_N_AND:
    case SB_TPL_N_OR:
        if ((st = eval(it, n->a, &a)))
            return st;
        if (sb_tpl_truthy(a) == (n->type == SB_TPL_N_OR)) {
            *out = a;
            return SB_OK;
        }
        sb_tpl_release(a);
        return eval(it, n->b, out);
    case SB_TPL_N_COMPARE: {
        if ((st = eval(it, n->a, &a)))
            return st;
        bool result = true;
        for (size_t i = 0; i < n->args.n && result && !st; i++) {
            const sb_tpl_node *operand = n->args.v[i];
            if ((st = eval(it, operand->a, &b)))
                break;
            st = compare(it, operand, operand->op, a, b, &result);
            sb_tpl_release(a);
            a = b;
            b = sb_tpl_none();
        }
        sb_tpl_release(a);
        *out = sb_tpl_bool(result);
        return st;
    }
    case SB_TPL_N_COND:
        if ((st = eval(it, n->b, &a)))
            return st;
        bool take = sb_tpl_truthy(a);
        sb_tpl_release(a);
        if (take)
            return eval(it, n->a, out);
        if (n->c)
            return eval(it, n->c, out);
        return make_undefined(out, "the inline if-expression evaluated to false and no else section was defined");
    default:
        return sb_tpl_fail(it, n, SB_ERR_FORMAT, "this is not an expression");
    }
}

static sb_status eval(sb_tpl_interp *it, const sb_tpl_node *n, sb_tpl_val *out) {
    *out = sb_tpl_none();
    sb_status st = sb_tpl_charge(it, n, 1);
    if (!st)
        st = eval_inner(it, n, out);
    if (!st) /* work in proportion to the size of what was built or read */
        st = sb_tpl_charge(it, n, sb_tpl_size_steps(*out));
    if (st) {
        sb_tpl_release(*out);
        *out = sb_tpl_none();
    }
    return st;
}

/* ---- statements ------------------------------------------------------------------------ */

static sb_status write_value(sb_tpl_interp *it, const sb_tpl_node *at, sb_tpl_val v) {
    sb_status st = sb_tpl_charge(it, at, sb_tpl_size_steps(v));
    if (!st)
        st = sb_tpl_write_str(it->out, v);
    if (st == SB_ERR_UNSUPPORTED)
        return sb_tpl_fail(it, at, st, "output exceeds %zu bytes", (size_t)SB_TPL_MAX_BYTES);
    return st;
}

/* Whether `v` is, or holds, the namespace `ns` (assigning it would form a cycle). */
static bool holds(sb_tpl_val v, const sb_tpl_dict *ns) {
    if ((v.kind == SB_TPL_DICT || v.kind == SB_TPL_NAMESPACE) && v.d == ns)
        return true;
    if (v.kind == SB_TPL_LIST) {
        for (size_t i = 0; i < v.l->n; i++)
            if (holds(v.l->items[i], ns))
                return true;
    } else if (v.kind == SB_TPL_DICT || v.kind == SB_TPL_NAMESPACE) {
        for (size_t i = 0; i < v.d->n; i++)
            if (holds(v.d->vals[i], ns))
                return true;
    }
    return false;
}

/* Binds target (NAME, TUPLE of NAMEs or NSREF) to v, taking v's reference. */
static sb_status assign(sb_tpl_interp *it, const sb_tpl_node *target, sb_tpl_val v) {
    if (target->type == SB_TPL_N_NAME)
        return scope_set(it, target->name, v);
    if (target->type == SB_TPL_N_NSREF) {
        sb_tpl_val ns;
        sb_status st = lookup(it, target->a->name, &ns);
        if (!st && ns.kind != SB_TPL_NAMESPACE)
            st = sb_tpl_fail(it, target, SB_ERR_INVALID_ARG, "cannot assign attribute on non-namespace object");
        else if (!st && holds(v, ns.d))
            st = sb_tpl_fail(it, target, SB_ERR_UNSUPPORTED, "assigning a namespace into itself is not supported");
        if (!st) {
            sb_tpl_val key;
            if (!(st = sb_tpl_str_new(target->name, strlen(target->name), &key))) {
                st = sb_tpl_dict_set(ns, key, v);
                v = sb_tpl_none();
            }
            if (st == SB_ERR_UNSUPPORTED)
                st = sb_tpl_fail(it, target, st, "value nested too deeply");
        }
        sb_tpl_release(ns);
        sb_tpl_release(v);
        return st;
    }
    /* tuple unpacking */
    sb_tpl_val items;
    sb_status st = v.kind == SB_TPL_UNDEFINED ? undefined_error(it, target, v) : sb_tpl_iterate(it, target, v, &items);
    sb_tpl_release(v);
    if (st)
        return st;
    size_t want = target->args.n, got = items.l->n;
    if (got != want)
        st = sb_tpl_fail(it, target, SB_ERR_INVALID_ARG,
                         got > want ? "too many values to unpack (expected %zu)"
                                    : "not enough values to unpack (expected %zu, got %zu)",
                         want, got);
    for (size_t i = 0; i < want && !st; i++)
        st = scope_set(it, target->args.v[i]->name, sb_tpl_retain(items.l->items[i]));
    sb_tpl_release(items);
    return st;
}

/* Names of the fields of `loop`, made once per for statement. */
static const char *const loop_fields[] = {"index", "index0", "revindex", "revindex0", "first", "last",
                                          "length", "depth", "depth0", "previtem", "nextitem"};
#define N_LOOP_FIELDS (sizeof(loop_fields) / sizeof(loop_fields[0]))

/* The `loop` variable of iteration i of n items (keys: strings of loop_fields). */
static sb_status loop_var(const sb_tpl_list *items, size_t i, const sb_tpl_val *keys, sb_tpl_val *out) {
    size_t n = items->n;
    sb_tpl_val vals[N_LOOP_FIELDS] = {
        sb_tpl_int((int64_t)i + 1),     sb_tpl_int((int64_t)i),
        sb_tpl_int((int64_t)(n - i)),   sb_tpl_int((int64_t)(n - i - 1)),
        sb_tpl_bool(i == 0),            sb_tpl_bool(i + 1 == n),
        sb_tpl_int((int64_t)n),         sb_tpl_int(1),
        sb_tpl_int(0),                  i > 0 ? items->items[i - 1] : sb_tpl_undef(),
        i + 1 < n ? items->items[i + 1] : sb_tpl_undef(),
    };
    sb_status st = sb_tpl_dict_new(SB_TPL_NAMESPACE, out); /* attribute access; not a mapping */
    for (size_t k = 0; k < N_LOOP_FIELDS && !st; k++)
        if (vals[k].kind != SB_TPL_UNDEFINED) /* absent: loop.previtem is undefined on the first pass */
            st = sb_tpl_dict_set(*out, sb_tpl_retain(keys[k]), sb_tpl_retain(vals[k]));
    return st;
}

static sb_status exec_for(sb_tpl_interp *it, const sb_tpl_node *n) {
    sb_tpl_val seq, items;
    sb_status st = eval(it, n->b, &seq);
    if (st)
        return st;
    st = sb_tpl_iterate(it, n->b, seq, &items);
    sb_tpl_release(seq);
    if (st)
        return st;
    sb_tpl_scope *saved = it->scope;
    if (n->c) { /* for x in xs if cond: filter first, so loop.* counts the kept items */
        sb_tpl_val kept;
        st = sb_tpl_list_new(0, false, &kept);
        for (size_t i = 0; i < items.l->n && !st; i++) {
            if ((st = scope_push(it, NULL)))
                break;
            sb_tpl_val ok = sb_tpl_none();
            if (!(st = assign(it, n->a, sb_tpl_retain(items.l->items[i]))) && !(st = eval(it, n->c, &ok)) &&
                sb_tpl_truthy(ok))
                st = sb_tpl_list_push(kept, sb_tpl_retain(items.l->items[i]));
            sb_tpl_release(ok);
            scope_pop(it, saved);
        }
        sb_tpl_release(items);
        items = kept;
        if (st) {
            sb_tpl_release(items);
            return st;
        }
    }
    sb_tpl_val keys[N_LOOP_FIELDS];
    size_t n_keys = 0;
    for (; n_keys < N_LOOP_FIELDS && !st; n_keys++)
        st = sb_tpl_str_new(loop_fields[n_keys], strlen(loop_fields[n_keys]), &keys[n_keys]);
    for (size_t i = 0; i < items.l->n && !st; i++) {
        if ((st = sb_tpl_charge(it, n, SB_TPL_LOOP_STEPS)) || (st = scope_push(it, NULL)))
            break;
        sb_tpl_val loop;
        if (!(st = loop_var(items.l, i, keys, &loop)) && !(st = scope_set(it, "loop", loop)) &&
            !(st = assign(it, n->a, sb_tpl_retain(items.l->items[i]))))
            st = exec_body(it, &n->body);
        scope_pop(it, saved);
        int ctl = it->loop_ctl;
        it->loop_ctl = 0;
        if (ctl == 1)
            break;
    }
    for (size_t k = 0; k < n_keys; k++)
        sb_tpl_release(keys[k]);
    if (!st && items.l->n == 0 && n->alt.n) {
        if (!(st = scope_push(it, NULL)))
            st = exec_body(it, &n->alt);
        scope_pop(it, saved);
    }
    sb_tpl_release(items);
    return st;
}

/* Renders body in a new scope into a string. */
static sb_status render_block(sb_tpl_interp *it, const sb_tpl_nodes *body, sb_tpl_val *out) {
    sb_tpl_scope *saved = it->scope;
    sb_tpl_buf buf = {0}, *saved_out = it->out;
    sb_status st = scope_push(it, NULL);
    if (st)
        return st;
    it->out = &buf;
    st = exec_body(it, body);
    it->out = saved_out;
    scope_pop(it, saved);
    if (!st)
        st = sb_tpl_buf_take(&buf, out);
    sb_tpl_buf_free(&buf);
    return st;
}

static sb_status exec_stmt(sb_tpl_interp *it, const sb_tpl_node *n) {
    sb_tpl_val v = sb_tpl_none(), r = sb_tpl_none();
    sb_status st = sb_tpl_charge(it, n, 1);
    if (st)
        return st;
    sb_tpl_scope *saved = it->scope;
    switch (n->type) {
    case SB_TPL_N_DATA:
        return write_value(it, n, n->val);
    case SB_TPL_N_OUTPUT:
        if (!(st = eval(it, n->a, &v)))
            st = write_value(it, n, v);
        break;
    case SB_TPL_N_IF:
        if ((st = eval(it, n->a, &v)))
            return st;
        st = exec_body(it, sb_tpl_truthy(v) ? &n->body : &n->alt);
        break;
    case SB_TPL_N_FOR:
        return exec_for(it, n);
    case SB_TPL_N_SET:
        if (!(st = eval(it, n->b, &v))) {
            st = assign(it, n->a, v);
            v = sb_tpl_none();
        }
        break;
    case SB_TPL_N_SET_BLOCK:
        if (!(st = render_block(it, &n->body, &v)) && !(st = apply_chain(it, n->c, v, &r))) {
            st = assign(it, n->a, r);
            r = sb_tpl_none();
        }
        break;
    case SB_TPL_N_FILTER_BLOCK:
        if (!(st = render_block(it, &n->body, &v)) && !(st = apply_chain(it, n->c, v, &r)))
            st = write_value(it, n, r);
        break;
    case SB_TPL_N_MACRO:
    case SB_TPL_N_CALL_BLOCK:
        if ((st = func_new(n->type == SB_TPL_N_MACRO ? SB_TPL_FUNC_MACRO : SB_TPL_FUNC_CALLER, &v)))
            return st;
        v.fn->node = n;
        v.fn->closure = it->scope;
        it->scope->refs++;
        if (n->type == SB_TPL_N_MACRO) {
            st = scope_set(it, n->name, v);
            v = sb_tpl_none();
        } else if (!(st = eval_call(it, n->a, v, &r))) {
            st = write_value(it, n, r);
        }
        break;
    case SB_TPL_N_WITH: {
        sb_tpl_val vals;
        if ((st = sb_tpl_list_new(n->args.n, false, &vals)))
            return st;
        for (size_t i = 0; i < n->args.n && !st; i++)
            if (!(st = eval(it, n->args.v[i]->a, &v)))
                st = sb_tpl_list_push(vals, v);
        v = sb_tpl_none();
        if (!st && !(st = scope_push(it, NULL))) {
            for (size_t i = 0; i < n->args.n && !st; i++)
                st = scope_set(it, n->args.v[i]->name, sb_tpl_retain(vals.l->items[i]));
            if (!st)
                st = exec_body(it, &n->body);
            scope_pop(it, saved);
        }
        sb_tpl_release(vals);
        break;
    }
    case SB_TPL_N_SCOPE:
        return exec_body(it, &n->body);
    case SB_TPL_N_BREAK:
    case SB_TPL_N_CONTINUE:
        it->loop_ctl = n->type == SB_TPL_N_BREAK ? 1 : 2;
        return SB_OK;
    default:
        return sb_tpl_fail(it, n, SB_ERR_FORMAT, "this is not a statement");
    }
    sb_tpl_release(v);
    sb_tpl_release(r);
    return st;
}

static sb_status exec_body(sb_tpl_interp *it, const sb_tpl_nodes *body) {
    for (size_t i = 0; i < body->n; i++) {
        sb_status st = exec_stmt(it, body->v[i]);
        if (st || it->loop_ctl)
            return st;
    }
    return SB_OK;
}

/* ---- entry ---------------------------------------------------------------------------- */

sb_status sb_tpl_render_vars(const sb_tpl *tpl, sb_tpl_val vars, const struct tm *now, char **out, size_t *out_len,
                             sb_error *err) {
    *out = NULL;
    if (out_len)
        *out_len = 0;
    if (err)
        err->msg[0] = '\0';
    sb_tpl_buf buf = {0};
    sb_tpl_interp it = {.tpl = tpl, .err = err, .out = &buf, .now = *now};
    /* The caller's variables form the outermost scope; the template's own
     * top-level assignments go to a scope inside it. */
    sb_tpl_scope *globals = sb_calloc(1, sizeof(*globals));
    if (!globals)
        return sb_fail(err, SB_ERR_NOMEM, "template: out of memory");
    globals->refs = 1;
    globals->vars = sb_tpl_retain(vars);
    it.scope = globals;
    sb_status st = scope_push(&it, NULL);
    if (!st) {
        st = exec_body(&it, &tpl->body);
        scope_pop(&it, globals);
    }
    scope_unref(globals);
    if (!st && buf.len == 0)
        st = sb_tpl_buf_put(&buf, "", 0);
    if (st) {
        if (st == SB_ERR_NOMEM)
            sb_fail(err, st, "template: out of memory");
        else if (err && !err->msg[0])
            sb_fail(err, st, "template: output exceeds %zu bytes", (size_t)SB_TPL_MAX_BYTES);
        sb_tpl_buf_free(&buf);
        return st;
    }
    *out = buf.p;
    if (out_len)
        *out_len = buf.len;
    return SB_OK;
}
