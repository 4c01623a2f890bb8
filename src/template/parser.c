/*
 * parser.c - tokens to a syntax tree, one function per rule of Jinja2's own
 * recursive-descent parser (same precedence: conditional, or, and, not,
 * comparisons, + -, ~, * / // %, **, unary, then postfix, filters and tests
 * bound to the operand), and sb_tpl_parse/sb_tpl_free.
 *
 * Filters and tests are resolved here. As in Jinja2, an unknown name is a
 * syntax error unless it sits inside an {% if %} or inline if, where it only
 * fails if that code runs; a filter Jinja2 has but this engine lacks also
 * fails only when run.
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "base/base.h"
#include "template/template-impl.h"

typedef struct parser {
    const char *src;
    sb_tpl_token *t;
    size_t n, i;
    int depth; /* syntax nesting, against SB_TPL_MAX_SYNTAX_DEPTH */
    sb_error *err;
} parser;

static sb_status parse_expression(parser *p, bool with_condexpr, sb_tpl_node **out);
static sb_status parse_tuple(parser *p, bool simplified, bool with_condexpr, const char *end_name,
                             bool explicit_parens, bool with_namespace, sb_tpl_node **out);
static sb_status parse_unary(parser *p, bool with_filter, sb_tpl_node **out);
static sb_status parse_primary(parser *p, bool with_namespace, sb_tpl_node **out);
static sb_status parse_postfix(parser *p, sb_tpl_node **node);
static sb_status parse_filter(parser *p, sb_tpl_node *input, bool start_inline, sb_tpl_node **out);
static sb_status subparse(parser *p, const char *const *end_names, sb_tpl_nodes *body);

/* ---- tree ----------------------------------------------------------------------- */

static void nodes_free(sb_tpl_nodes *l);

static void node_free(sb_tpl_node *n) {
    if (!n)
        return;
    sb_free(n->name);
    sb_tpl_free_immortal(n->val);
    node_free(n->a);
    node_free(n->b);
    node_free(n->c);
    nodes_free(&n->body);
    nodes_free(&n->alt);
    nodes_free(&n->args);
    nodes_free(&n->kwargs);
    sb_free(n);
}

static void nodes_free(sb_tpl_nodes *l) {
    for (size_t i = 0; i < l->n; i++)
        node_free(l->v[i]);
    sb_free(l->v);
    *l = (sb_tpl_nodes){0};
}

/* Appends n to l; frees n on failure. */
static sb_status nodes_push(sb_tpl_nodes *l, sb_tpl_node *n) {
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 4;
        sb_tpl_node **v = sb_realloc(l->v, cap * sizeof(*v));
        if (!v) {
            node_free(n);
            return SB_ERR_NOMEM;
        }
        l->v = v;
        l->cap = cap;
    }
    l->v[l->n++] = n;
    return SB_OK;
}

static sb_tpl_node *node_new(sb_tpl_ntype type, uint32_t off) {
    sb_tpl_node *n = sb_calloc(1, sizeof(*n));
    if (n) {
        n->type = type;
        n->off = off;
    }
    return n;
}

/* ---- tokens ---------------------------------------------------------------------- */

static sb_tpl_token *cur(parser *p) { return &p->t[p->i]; }
static sb_tpl_token *look(parser *p) { return &p->t[p->i + 1 < p->n ? p->i + 1 : p->n - 1]; }
static void next(parser *p) {
    if (p->i + 1 < p->n)
        p->i++;
}

static bool tok_is(const parser *p, const sb_tpl_token *t, sb_tpl_tok type, const char *text) {
    return t->type == type && (!text || (strlen(text) == t->len && memcmp(p->src + t->off, text, t->len) == 0));
}
static bool is_name(parser *p, const char *name) { return tok_is(p, cur(p), SB_TPL_TK_NAME, name); }
static bool is_op(parser *p, const char *op) { return tok_is(p, cur(p), SB_TPL_TK_OP, op); }
static bool skip_name(parser *p, const char *name) {
    if (!is_name(p, name))
        return false;
    next(p);
    return true;
}
static bool skip_op(parser *p, const char *op) {
    if (!is_op(p, op))
        return false;
    next(p);
    return true;
}

static sb_status fail_at(parser *p, uint32_t off, sb_status st, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static sb_status fail_at(parser *p, uint32_t off, sb_status st, const char *fmt, ...) {
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    int line, col;
    sb_tpl_position(p->src, off, &line, &col);
    return sb_fail(p->err, st, "template:%d:%d: %s", line, col, msg);
}

/* How Jinja names a token in "unexpected ..." messages. */
static void describe(parser *p, const sb_tpl_token *t, char *buf, size_t cap) {
    switch (t->type) {
    case SB_TPL_TK_EOF:
        snprintf(buf, cap, "end of template");
        break;
    case SB_TPL_TK_BLOCK_END:
        snprintf(buf, cap, "end of statement block");
        break;
    case SB_TPL_TK_VAR_END:
        snprintf(buf, cap, "end of print statement");
        break;
    case SB_TPL_TK_DATA:
        snprintf(buf, cap, "template data");
        break;
    default:
        snprintf(buf, cap, "'%.*s'", (int)SB_MIN(t->len, 40u), p->src + t->off);
    }
}

static sb_status unexpected(parser *p, const char *expected) {
    char what[64];
    describe(p, cur(p), what, sizeof(what));
    if (expected)
        return fail_at(p, cur(p)->off, SB_ERR_FORMAT, "expected %s, got %s", expected, what);
    return fail_at(p, cur(p)->off, SB_ERR_FORMAT, "unexpected %s", what);
}

static sb_status expect_op(parser *p, const char *op) {
    if (skip_op(p, op))
        return SB_OK;
    char want[16];
    snprintf(want, sizeof(want), "'%s'", op);
    return unexpected(p, want);
}

static sb_status expect_type(parser *p, sb_tpl_tok type, const char *what) {
    if (cur(p)->type != type)
        return unexpected(p, what);
    next(p);
    return SB_OK;
}

static char *tok_text(parser *p, const sb_tpl_token *t) { return sb_strndup(p->src + t->off, t->len); }

static sb_status enter(parser *p) {
    if (++p->depth > SB_TPL_MAX_SYNTAX_DEPTH)
        return fail_at(p, cur(p)->off, SB_ERR_UNSUPPORTED, "template nested more than %d levels deep",
                       SB_TPL_MAX_SYNTAX_DEPTH);
    return SB_OK;
}

/* New node of `type` at the current token with a and b as children;
 * frees a and b on failure. */
static sb_status make(parser *p, sb_tpl_ntype type, uint32_t off, sb_tpl_node *a, sb_tpl_node *b, sb_tpl_node **out) {
    (void)p;
    sb_tpl_node *n = node_new(type, off);
    if (!n) {
        node_free(a);
        node_free(b);
        *out = NULL;
        return SB_ERR_NOMEM;
    }
    n->a = a;
    n->b = b;
    *out = n;
    return SB_OK;
}

/* ---- expressions ------------------------------------------------------------------- */

static sb_status parse_list_literal(parser *p, bool dict, sb_tpl_node **out) {
    *out = NULL;
    uint32_t off = cur(p)->off;
    const char *close = dict ? "}" : "]";
    next(p);
    sb_tpl_node *n = node_new(dict ? SB_TPL_N_DICT : SB_TPL_N_LIST, off);
    if (!n)
        return SB_ERR_NOMEM;
    sb_status st = SB_OK;
    while (!is_op(p, close)) {
        if (n->args.n && (st = expect_op(p, ",")))
            break;
        if (is_op(p, close))
            break;
        sb_tpl_node *item, *val;
        if ((st = parse_expression(p, true, &item)))
            break;
        if (dict) {
            uint32_t key_off = item->off;
            if ((st = expect_op(p, ":"))) {
                node_free(item);
                break;
            }
            if ((st = parse_expression(p, true, &val))) {
                node_free(item);
                break;
            }
            if ((st = make(p, SB_TPL_N_PAIR, key_off, item, val, &item)))
                break;
        }
        if ((st = nodes_push(&n->args, item)))
            break;
    }
    if (!st)
        st = expect_op(p, close);
    if (st) {
        node_free(n);
        return st;
    }
    *out = n;
    return SB_OK;
}

static sb_status parse_primary(parser *p, bool with_namespace, sb_tpl_node **out) {
    *out = NULL;
    sb_tpl_token *t = cur(p);
    sb_tpl_node *n;
    sb_status st;
    switch (t->type) {
    case SB_TPL_TK_NAME: {
        static const char *const consts[] = {"true", "True", "false", "False", "none", "None"};
        for (size_t k = 0; k < SB_ARRAY_LEN(consts); k++) {
            if (tok_is(p, t, SB_TPL_TK_NAME, consts[k])) {
                next(p);
                if (!(n = node_new(SB_TPL_N_CONST, t->off)))
                    return SB_ERR_NOMEM;
                n->val = k < 2 ? sb_tpl_bool(true) : k < 4 ? sb_tpl_bool(false) : sb_tpl_none();
                *out = n;
                return SB_OK;
            }
        }
        next(p);
        if (!(n = node_new(SB_TPL_N_NAME, t->off)) || !(n->name = tok_text(p, t))) {
            node_free(n);
            return SB_ERR_NOMEM;
        }
        if (with_namespace && is_op(p, ".")) {
            next(p);
            sb_tpl_token *attr = cur(p);
            if ((st = expect_type(p, SB_TPL_TK_NAME, "a name"))) {
                node_free(n);
                return st;
            }
            if ((st = make(p, SB_TPL_N_NSREF, t->off, n, NULL, &n)))
                return st;
            if (!(n->name = tok_text(p, attr))) {
                node_free(n);
                return SB_ERR_NOMEM;
            }
        }
        *out = n;
        return SB_OK;
    }
    case SB_TPL_TK_STRING: {
        /* adjacent literals concatenate */
        sb_tpl_buf b = {0};
        st = SB_OK;
        while (cur(p)->type == SB_TPL_TK_STRING && !st) {
            st = sb_tpl_buf_put(&b, cur(p)->val.s->data, cur(p)->val.s->len);
            next(p);
        }
        if (!(n = node_new(SB_TPL_N_CONST, t->off)))
            st = SB_ERR_NOMEM;
        if (!st)
            st = sb_tpl_buf_take(&b, &n->val);
        sb_tpl_buf_free(&b);
        if (st) {
            node_free(n);
            return st;
        }
        sb_tpl_make_immortal(n->val);
        *out = n;
        return SB_OK;
    }
    case SB_TPL_TK_INT:
    case SB_TPL_TK_FLOAT:
        next(p);
        if (!(n = node_new(SB_TPL_N_CONST, t->off)))
            return SB_ERR_NOMEM;
        n->val = t->val;
        *out = n;
        return SB_OK;
    case SB_TPL_TK_OP:
        if (is_op(p, "(")) {
            next(p);
            if ((st = parse_tuple(p, false, true, NULL, true, false, out)))
                return st;
            if ((st = expect_op(p, ")"))) {
                node_free(*out);
                return st;
            }
            return SB_OK;
        }
        if (is_op(p, "["))
            return parse_list_literal(p, false, out);
        if (is_op(p, "{"))
            return parse_list_literal(p, true, out);
        return unexpected(p, NULL);
    default:
        return unexpected(p, NULL);
    }
}

static bool is_tuple_end(parser *p, const char *end_name) {
    sb_tpl_tok type = cur(p)->type;
    return type == SB_TPL_TK_VAR_END || type == SB_TPL_TK_BLOCK_END || type == SB_TPL_TK_EOF || is_op(p, ")") ||
           (end_name && is_name(p, end_name));
}

static sb_status parse_tuple(parser *p, bool simplified, bool with_condexpr, const char *end_name,
                             bool explicit_parens, bool with_namespace, sb_tpl_node **out) {
    *out = NULL;
    uint32_t off = cur(p)->off;
    sb_tpl_nodes items = {0};
    bool is_tuple = false;
    sb_status st = SB_OK;
    for (;;) {
        if (items.n && (st = expect_op(p, ",")))
            break;
        if (is_tuple_end(p, end_name))
            break;
        sb_tpl_node *item;
        st = simplified ? parse_primary(p, with_namespace, &item) : parse_expression(p, with_condexpr, &item);
        if (st || (st = nodes_push(&items, item)))
            break;
        if (!is_op(p, ","))
            break;
        is_tuple = true;
    }
    if (st) {
        nodes_free(&items);
        return st;
    }
    if (!is_tuple && items.n == 1) {
        *out = items.v[0];
        sb_free(items.v);
        return SB_OK;
    }
    if (!is_tuple && !explicit_parens) {
        nodes_free(&items);
        return unexpected(p, "an expression");
    }
    sb_tpl_node *n = node_new(SB_TPL_N_TUPLE, off);
    if (!n) {
        nodes_free(&items);
        return SB_ERR_NOMEM;
    }
    n->args = items;
    *out = n;
    return SB_OK;
}

/* (args, kwargs) of a call, filter or test into n->args / n->kwargs. */
static sb_status parse_call_args(parser *p, sb_tpl_node *n) {
    sb_status st = expect_op(p, "(");
    bool require_comma = false;
    while (!st && !is_op(p, ")")) {
        if (require_comma) {
            if ((st = expect_op(p, ",")))
                break;
            if (is_op(p, ")"))
                break;
        }
        if (is_op(p, "*") || is_op(p, "**"))
            return fail_at(p, cur(p)->off, SB_ERR_UNSUPPORTED, "*args and **kwargs in calls are not supported");
        sb_tpl_node *arg;
        if (cur(p)->type == SB_TPL_TK_NAME && tok_is(p, look(p), SB_TPL_TK_OP, "=")) {
            sb_tpl_token *key = cur(p);
            next(p);
            next(p);
            if ((st = parse_expression(p, true, &arg)))
                break;
            if ((st = make(p, SB_TPL_N_KEYWORD, key->off, arg, NULL, &arg)))
                break;
            if (!(arg->name = tok_text(p, key))) {
                node_free(arg);
                return SB_ERR_NOMEM;
            }
            st = nodes_push(&n->kwargs, arg);
        } else {
            if (n->kwargs.n)
                return fail_at(p, cur(p)->off, SB_ERR_FORMAT, "positional argument follows keyword argument");
            if ((st = parse_expression(p, true, &arg)))
                break;
            st = nodes_push(&n->args, arg);
        }
        require_comma = true;
    }
    return st ? st : expect_op(p, ")");
}

static sb_status parse_call(parser *p, sb_tpl_node **node) {
    sb_tpl_node *n;
    sb_status st = make(p, SB_TPL_N_CALL, (*node)->off, *node, NULL, &n);
    if (st) {
        *node = NULL;
        return st;
    }
    *node = n;
    return parse_call_args(p, n);
}

static sb_status parse_subscribed(parser *p, sb_tpl_node **out) {
    *out = NULL;
    uint32_t off = cur(p)->off;
    sb_tpl_node *parts[3] = {NULL, NULL, NULL};
    sb_status st = SB_OK;
    if (!is_op(p, ":")) {
        if ((st = parse_expression(p, true, &parts[0])))
            return st;
        if (!is_op(p, ":")) {
            *out = parts[0];
            return SB_OK;
        }
    }
    next(p); /* first ':' */
    if (!is_op(p, ":") && !is_op(p, "]") && !is_op(p, ","))
        st = parse_expression(p, true, &parts[1]);
    if (!st && skip_op(p, ":") && !is_op(p, "]") && !is_op(p, ","))
        st = parse_expression(p, true, &parts[2]);
    sb_tpl_node *n = st ? NULL : node_new(SB_TPL_N_SLICE, off);
    if (!n) {
        for (int k = 0; k < 3; k++)
            node_free(parts[k]);
        return st ? st : SB_ERR_NOMEM;
    }
    n->a = parts[0];
    n->b = parts[1];
    n->c = parts[2];
    *out = n;
    return SB_OK;
}

static sb_status parse_subscript(parser *p, sb_tpl_node **node) {
    uint32_t off = cur(p)->off;
    sb_status st;
    if (skip_op(p, ".")) {
        sb_tpl_token *attr = cur(p);
        if (attr->type == SB_TPL_TK_NAME) {
            next(p);
            if ((st = make(p, SB_TPL_N_GETATTR, off, *node, NULL, node)))
                return st;
            return (*node)->name = tok_text(p, attr), (*node)->name ? SB_OK : SB_ERR_NOMEM;
        }
        if (attr->type != SB_TPL_TK_INT)
            return unexpected(p, "a name or number");
        next(p);
        sb_tpl_node *idx = node_new(SB_TPL_N_CONST, attr->off);
        if (!idx)
            return SB_ERR_NOMEM;
        idx->val = attr->val;
        return make(p, SB_TPL_N_GETITEM, off, *node, idx, node);
    }
    next(p); /* '[' */
    sb_tpl_nodes args = {0};
    st = SB_OK;
    while (!is_op(p, "]")) {
        if (args.n && (st = expect_op(p, ",")))
            break;
        sb_tpl_node *arg;
        if ((st = parse_subscribed(p, &arg)) || (st = nodes_push(&args, arg)))
            break;
    }
    if (!st)
        st = expect_op(p, "]");
    sb_tpl_node *index = NULL;
    if (!st && args.n == 1) {
        index = args.v[0];
        args.n = 0;
    } else if (!st && !(index = node_new(SB_TPL_N_TUPLE, off))) {
        st = SB_ERR_NOMEM;
    } else if (!st) {
        index->args = args;
        args = (sb_tpl_nodes){0};
    }
    nodes_free(&args);
    if (st)
        return st;
    return make(p, SB_TPL_N_GETITEM, off, *node, index, node);
}

/* Ends a chain of postfix links (subscripts, calls, filters, tests): gives
 * back the nesting depth the links took and, on failure, frees the node. */
static sb_status end_chain(parser *p, int links, sb_status st, sb_tpl_node **node) {
    p->depth -= links;
    if (st && *node) {
        node_free(*node);
        *node = NULL;
    }
    return st;
}

/* On failure, *node has been freed and set to NULL. */
static sb_status parse_postfix(parser *p, sb_tpl_node **node) {
    int links = 0;
    sb_status st = SB_OK;
    for (;;) {
        if (is_op(p, ".") || is_op(p, "["))
            st = parse_subscript(p, node);
        else if (is_op(p, "("))
            st = parse_call(p, node);
        else
            break;
        if (st || (links++, st = enter(p)))
            break;
    }
    return end_chain(p, links, st, node);
}

static sb_status parse_dotted_name(parser *p, sb_tpl_node *n) {
    sb_tpl_token *t = cur(p);
    sb_status st = expect_type(p, SB_TPL_TK_NAME, "a name");
    if (st)
        return st;
    if (is_op(p, "."))
        return fail_at(p, cur(p)->off, SB_ERR_UNSUPPORTED, "dotted filter and test names are not supported");
    return (n->name = tok_text(p, t)) ? SB_OK : SB_ERR_NOMEM;
}

static sb_status parse_filter(parser *p, sb_tpl_node *input, bool start_inline, sb_tpl_node **out) {
    sb_status st = SB_OK;
    int links = 0;
    while (is_op(p, "|") || start_inline) {
        if (!start_inline)
            next(p);
        start_inline = false;
        sb_tpl_node *n = node_new(SB_TPL_N_FILTER, cur(p)->off);
        if (!n) {
            st = SB_ERR_NOMEM;
            break;
        }
        n->a = input;
        input = n;
        if ((st = parse_dotted_name(p, n)))
            break;
        n->fn = sb_tpl_find_filter(n->name);
        if (is_op(p, "(") && (st = parse_call_args(p, n)))
            break;
        if ((links++, st = enter(p)))
            break;
    }
    p->depth -= links;
    if (st) {
        node_free(input);
        return st;
    }
    *out = input;
    return SB_OK;
}

static sb_status parse_test(parser *p, sb_tpl_node **node) {
    uint32_t off = cur(p)->off;
    next(p); /* is */
    bool negated = skip_name(p, "not");
    sb_tpl_node *n;
    sb_status st = make(p, SB_TPL_N_TEST, off, *node, NULL, &n);
    *node = NULL;
    if (st)
        return st;
    if ((st = parse_dotted_name(p, n))) {
        node_free(n);
        return st;
    }
    n->fn = sb_tpl_find_test(n->name);
    sb_tpl_tok type = cur(p)->type;
    st = SB_OK;
    if (is_op(p, "(")) {
        st = parse_call_args(p, n);
    } else if ((type == SB_TPL_TK_NAME || type == SB_TPL_TK_STRING || type == SB_TPL_TK_INT ||
                type == SB_TPL_TK_FLOAT || is_op(p, "[") || is_op(p, "{")) &&
               !is_name(p, "else") && !is_name(p, "or") && !is_name(p, "and")) {
        if (is_name(p, "is")) {
            st = fail_at(p, cur(p)->off, SB_ERR_FORMAT, "you cannot chain multiple tests with is");
        } else {
            sb_tpl_node *arg;
            if (!(st = parse_primary(p, false, &arg)) && !(st = parse_postfix(p, &arg)))
                st = nodes_push(&n->args, arg);
        }
    }
    if (st) {
        node_free(n);
        return st;
    }
    if (negated && (st = make(p, SB_TPL_N_NOT, off, n, NULL, &n)))
        return st;
    *node = n;
    return SB_OK;
}

static sb_status parse_filter_expr(parser *p, sb_tpl_node **node) {
    sb_status st = SB_OK;
    int links = 0;
    for (;;) {
        if (is_op(p, "|")) {
            st = parse_filter(p, *node, false, node);
            if (st)
                *node = NULL;
        } else if (is_name(p, "is")) {
            st = parse_test(p, node);
        } else if (is_op(p, "(")) {
            st = parse_call(p, node);
        } else {
            break;
        }
        if (st || (links++, st = enter(p)))
            break;
    }
    return end_chain(p, links, st, node);
}

static sb_status parse_unary(parser *p, bool with_filter, sb_tpl_node **out) {
    *out = NULL;
    uint32_t off = cur(p)->off;
    sb_status st = enter(p);
    sb_tpl_node *n = NULL;
    if (!st) {
        if (skip_op(p, "-") || skip_op(p, "+")) {
            bool neg = p->src[off] == '-';
            if (!(st = parse_unary(p, false, &n)))
                st = make(p, neg ? SB_TPL_N_NEG : SB_TPL_N_POS, off, n, NULL, &n);
        } else {
            st = parse_primary(p, false, &n);
        }
    }
    if (!st)
        st = parse_postfix(p, &n);
    else
        n = NULL;
    if (!st && with_filter)
        st = parse_filter_expr(p, &n);
    p->depth--;
    *out = n;
    return st;
}

/* Binary levels, loosest first: each is a left-associative chain of the
 * next level's operands. */
typedef enum level { L_OR, L_AND, L_MATH1, L_CONCAT, L_MATH2, L_POW } level;

static sb_status parse_not(parser *p, sb_tpl_node **out);
static sb_status parse_compare(parser *p, sb_tpl_node **out);

static sb_status parse_level(parser *p, level lv, sb_tpl_node **out) {
    *out = NULL;
    static const char *const ops[][5] = {
        [L_OR] = {"or"}, [L_AND] = {"and"}, [L_MATH1] = {"+", "-"},
        [L_CONCAT] = {"~"}, [L_MATH2] = {"*", "/", "//", "%"}, [L_POW] = {"**"},
    };
    sb_status st = lv == L_OR ? parse_level(p, L_AND, out) : lv == L_AND ? parse_not(p, out)
                 : lv == L_POW ? parse_unary(p, true, out) : parse_level(p, (level)(lv + 1), out);
    int links = 0;
    sb_tpl_node *cat = NULL; /* the CONCAT node this chain builds */
    while (!st) {
        const char *op = NULL;
        uint32_t off = cur(p)->off;
        for (size_t k = 0; k < 5 && ops[lv][k] && !op; k++)
            if (lv <= L_AND ? is_name(p, ops[lv][k]) : is_op(p, ops[lv][k]))
                op = ops[lv][k];
        if (!op)
            break;
        next(p);
        if ((links++, st = enter(p)))
            break;
        sb_tpl_node *rhs;
        st = lv == L_OR ? parse_level(p, L_AND, &rhs) : lv == L_AND ? parse_not(p, &rhs)
           : lv == L_POW ? parse_unary(p, true, &rhs) : parse_level(p, (level)(lv + 1), &rhs);
        if (st)
            break;
        if (lv == L_CONCAT) {
            if (!cat) {
                cat = node_new(SB_TPL_N_CONCAT, off);
                if (!cat || (st = nodes_push(&cat->args, *out))) {
                    if (!cat)
                        node_free(*out);
                    node_free(cat);
                    *out = NULL;
                    node_free(rhs);
                    st = SB_ERR_NOMEM;
                    break;
                }
                *out = cat;
            }
            st = nodes_push(&(*out)->args, rhs);
            continue;
        }
        sb_tpl_ntype type = lv == L_OR ? SB_TPL_N_OR : lv == L_AND ? SB_TPL_N_AND : SB_TPL_N_BINOP;
        if ((st = make(p, type, off, *out, rhs, out))) {
            *out = NULL;
            break;
        }
        snprintf((*out)->op, sizeof((*out)->op), "%s", op);
    }
    p->depth -= links;
    if (st && *out) {
        node_free(*out);
        *out = NULL;
    }
    return st;
}

static sb_status parse_not(parser *p, sb_tpl_node **out) {
    *out = NULL;
    if (!is_name(p, "not"))
        return parse_compare(p, out);
    uint32_t off = cur(p)->off;
    next(p);
    sb_status st = enter(p);
    sb_tpl_node *n = NULL;
    if (!st && !(st = parse_not(p, &n)))
        st = make(p, SB_TPL_N_NOT, off, n, NULL, &n);
    p->depth--;
    *out = st ? NULL : n;
    return st;
}

static sb_status parse_compare(parser *p, sb_tpl_node **out) {
    *out = NULL;
    uint32_t off = cur(p)->off;
    sb_tpl_node *first, *cmp = NULL;
    sb_status st = parse_level(p, L_MATH1, &first);
    if (st)
        return st;
    static const char *const ops[] = {"==", "!=", ">", ">=", "<", "<="};
    for (;;) {
        const char *op = NULL;
        uint32_t op_off = cur(p)->off;
        for (size_t k = 0; k < SB_ARRAY_LEN(ops) && !op; k++)
            if (is_op(p, ops[k]))
                op = ops[k];
        if (op) {
            next(p);
        } else if (is_name(p, "in")) {
            next(p);
            op = "in";
        } else if (is_name(p, "not") && tok_is(p, look(p), SB_TPL_TK_NAME, "in")) {
            next(p);
            next(p);
            op = "notin";
        } else {
            break;
        }
        if (!cmp && (st = make(p, SB_TPL_N_COMPARE, off, first, NULL, &cmp)))
            return st;
        sb_tpl_node *rhs;
        if ((st = parse_level(p, L_MATH1, &rhs)) || (st = make(p, SB_TPL_N_OPERAND, op_off, rhs, NULL, &rhs)))
            break;
        snprintf(rhs->op, sizeof(rhs->op), "%s", op);
        if ((st = nodes_push(&cmp->args, rhs)))
            break;
    }
    if (st) {
        node_free(cmp ? cmp : first);
        return st;
    }
    *out = cmp ? cmp : first;
    return SB_OK;
}

static sb_status parse_condexpr(parser *p, sb_tpl_node **out) {
    *out = NULL;
    sb_status st = parse_level(p, L_OR, out);
    int links = 0;
    while (!st && is_name(p, "if")) {
        uint32_t off = cur(p)->off;
        next(p);
        if ((links++, st = enter(p)))
            break;
        sb_tpl_node *test, *alt = NULL, *n;
        if ((st = parse_level(p, L_OR, &test)))
            break;
        if (skip_name(p, "else") && (st = parse_condexpr(p, &alt))) {
            node_free(test);
            break;
        }
        if ((st = make(p, SB_TPL_N_COND, off, *out, test, &n))) {
            node_free(alt);
            *out = NULL;
            break;
        }
        n->c = alt;
        *out = n;
    }
    p->depth -= links;
    if (st) {
        node_free(*out);
        *out = NULL;
    }
    return st;
}

static sb_status parse_expression(parser *p, bool with_condexpr, sb_tpl_node **out) {
    *out = NULL;
    sb_status st = enter(p);
    if (!st)
        st = with_condexpr ? parse_condexpr(p, out) : parse_level(p, L_OR, out);
    p->depth--;
    return st;
}

/* ---- statements ----------------------------------------------------------------------- */

/* A NAME, a tuple of NAMEs, or (with_namespace) an NSREF. */
static sb_status parse_assign_target(parser *p, bool name_only, const char *end_name, bool with_namespace,
                                     sb_tpl_node **out) {
    uint32_t off = cur(p)->off;
    sb_status st;
    if (name_only) {
        sb_tpl_token *t = cur(p);
        if ((st = expect_type(p, SB_TPL_TK_NAME, "a name")))
            return st;
        sb_tpl_node *n = node_new(SB_TPL_N_NAME, t->off);
        if (!n || !(n->name = tok_text(p, t))) {
            node_free(n);
            return SB_ERR_NOMEM;
        }
        *out = n;
        return SB_OK;
    }
    if ((st = parse_tuple(p, true, true, end_name, false, with_namespace, out)))
        return st;
    sb_tpl_node *n = *out;
    bool ok = n->type == SB_TPL_N_NAME || n->type == SB_TPL_N_NSREF;
    if (n->type == SB_TPL_N_TUPLE) {
        ok = true;
        for (size_t k = 0; k < n->args.n; k++)
            ok = ok && n->args.v[k]->type == SB_TPL_N_NAME;
    }
    if (!ok) {
        node_free(n);
        *out = NULL;
        return fail_at(p, off, SB_ERR_FORMAT, "can't assign to this expression");
    }
    return SB_OK;
}

/* Skips an optional ':' then expects %} and parses the body up to one of
 * end_names (which stays current, or is consumed with drop_needle). */
static sb_status parse_statements(parser *p, const char *const *end_names, bool drop_needle, sb_tpl_nodes *body,
                                  const char *tag, uint32_t tag_off) {
    skip_op(p, ":");
    sb_status st = expect_type(p, SB_TPL_TK_BLOCK_END, "end of statement block");
    if (!st)
        st = subparse(p, end_names, body);
    if (!st && cur(p)->type == SB_TPL_TK_EOF) {
        char want[64] = "";
        for (size_t k = 0; end_names[k]; k++)
            snprintf(want + strlen(want), sizeof(want) - strlen(want), "%s'%s'", k ? " or " : "", end_names[k]);
        return fail_at(p, tag_off, SB_ERR_FORMAT, "'%s' block is never closed (expected %s)", tag, want);
    }
    if (!st && drop_needle)
        next(p);
    return st;
}

static sb_status parse_signature(parser *p, sb_tpl_node *n) {
    sb_status st = expect_op(p, "(");
    while (!st && !is_op(p, ")")) {
        if (n->args.n && (st = expect_op(p, ",")))
            break;
        sb_tpl_node *arg;
        if ((st = parse_assign_target(p, true, NULL, false, &arg)))
            break;
        if (skip_op(p, "=")) {
            if ((st = parse_expression(p, true, &arg->a))) {
                node_free(arg);
                break;
            }
        } else if (n->args.n && n->args.v[n->args.n - 1]->a) {
            node_free(arg);
            return fail_at(p, cur(p)->off, SB_ERR_FORMAT, "non-default argument follows default argument");
        }
        st = nodes_push(&n->args, arg);
    }
    return st ? st : expect_op(p, ")");
}

static sb_status parse_statement(parser *p, sb_tpl_node **out);

static sb_status parse_for(parser *p, sb_tpl_node *n) {
    static const char *const body_end[] = {"endfor", "else", NULL}, *const else_end[] = {"endfor", NULL};
    sb_status st = parse_assign_target(p, false, "in", false, &n->a);
    if (!st && !skip_name(p, "in"))
        st = unexpected(p, "'in'");
    if (!st)
        st = parse_tuple(p, false, false, "recursive", false, false, &n->b);
    if (!st && skip_name(p, "if"))
        st = parse_expression(p, true, &n->c);
    if (!st && is_name(p, "recursive"))
        st = fail_at(p, cur(p)->off, SB_ERR_UNSUPPORTED, "recursive for loops are not supported");
    if (!st)
        st = parse_statements(p, body_end, false, &n->body, "for", n->off);
    if (!st && is_name(p, "else")) {
        next(p);
        st = parse_statements(p, else_end, true, &n->alt, "for", n->off);
    } else if (!st) {
        next(p);
    }
    return st;
}

static sb_status parse_if(parser *p, sb_tpl_node *n) {
    static const char *const body_end[] = {"elif", "else", "endif", NULL}, *const else_end[] = {"endif", NULL};
    sb_status st = parse_tuple(p, false, false, NULL, false, false, &n->a);
    if (!st)
        st = parse_statements(p, body_end, false, &n->body, "if", n->off);
    if (st)
        return st;
    if (is_name(p, "elif")) {
        sb_tpl_node *elif = node_new(SB_TPL_N_IF, cur(p)->off);
        if (!elif)
            return SB_ERR_NOMEM;
        next(p);
        if ((st = nodes_push(&n->alt, elif)))
            return st;
        return parse_if(p, elif);
    }
    if (is_name(p, "else")) {
        next(p);
        return parse_statements(p, else_end, true, &n->alt, "if", n->off);
    }
    next(p); /* endif */
    return SB_OK;
}

static sb_status parse_set(parser *p, sb_tpl_node *n) {
    static const char *const end[] = {"endset", NULL};
    sb_status st = parse_assign_target(p, false, NULL, true, &n->a);
    if (st)
        return st;
    if (skip_op(p, "="))
        return parse_tuple(p, false, true, NULL, false, false, &n->b);
    n->type = SB_TPL_N_SET_BLOCK;
    if (is_op(p, "|") && (st = parse_filter(p, NULL, false, &n->c)))
        return st;
    return parse_statements(p, end, true, &n->body, "set", n->off);
}

static sb_status parse_statement(parser *p, sb_tpl_node **out) {
    sb_tpl_token *t = cur(p);
    if (t->type != SB_TPL_TK_NAME)
        return unexpected(p, "a tag name");
    static const struct {
        const char *tag;
        sb_tpl_ntype type;
    } tags[] = {
        {"for", SB_TPL_N_FOR},     {"if", SB_TPL_N_IF},         {"set", SB_TPL_N_SET},
        {"macro", SB_TPL_N_MACRO}, {"call", SB_TPL_N_CALL_BLOCK}, {"filter", SB_TPL_N_FILTER_BLOCK},
        {"with", SB_TPL_N_WITH},   {"generation", SB_TPL_N_SCOPE}, {"break", SB_TPL_N_BREAK},
        {"continue", SB_TPL_N_CONTINUE}, {"print", SB_TPL_N_OUTPUT},
    };
    sb_tpl_node *n = NULL;
    for (size_t k = 0; k < SB_ARRAY_LEN(tags) && !n; k++)
        if (tok_is(p, t, SB_TPL_TK_NAME, tags[k].tag) && !(n = node_new(tags[k].type, t->off)))
            return SB_ERR_NOMEM;
    if (!n) {
        static const char *const jinja_only[] = {"block", "extends", "include", "import", "from", "autoescape", "do"};
        for (size_t k = 0; k < SB_ARRAY_LEN(jinja_only); k++)
            if (tok_is(p, t, SB_TPL_TK_NAME, jinja_only[k]))
                return fail_at(p, t->off, SB_ERR_UNSUPPORTED, "the '%s' tag is not supported", jinja_only[k]);
        return fail_at(p, t->off, SB_ERR_FORMAT, "unknown tag '%.*s'", (int)SB_MIN(t->len, 40u), p->src + t->off);
    }
    next(p);
    sb_status st = enter(p);
    static const char *const end_macro[] = {"endmacro", NULL}, *const end_call[] = {"endcall", NULL},
                             *const end_filter[] = {"endfilter", NULL}, *const end_with[] = {"endwith", NULL},
                             *const end_gen[] = {"endgeneration", NULL};
    if (!st) {
        switch (n->type) {
        case SB_TPL_N_FOR:
            st = parse_for(p, n);
            break;
        case SB_TPL_N_IF:
            st = parse_if(p, n);
            break;
        case SB_TPL_N_SET:
            st = parse_set(p, n);
            break;
        case SB_TPL_N_MACRO: {
            sb_tpl_token *name = cur(p);
            if (!(st = expect_type(p, SB_TPL_TK_NAME, "a macro name")) && !(n->name = tok_text(p, name)))
                st = SB_ERR_NOMEM;
            if (!st && !(st = parse_signature(p, n)))
                st = parse_statements(p, end_macro, true, &n->body, "macro", n->off);
            break;
        }
        case SB_TPL_N_CALL_BLOCK:
            if (is_op(p, "("))
                st = parse_signature(p, n);
            if (!st)
                st = parse_expression(p, true, &n->a);
            if (!st && n->a->type != SB_TPL_N_CALL)
                st = fail_at(p, n->a->off, SB_ERR_FORMAT, "expected a call after 'call'");
            if (!st)
                st = parse_statements(p, end_call, true, &n->body, "call", n->off);
            break;
        case SB_TPL_N_FILTER_BLOCK:
            if (!(st = parse_filter(p, NULL, true, &n->c)))
                st = parse_statements(p, end_filter, true, &n->body, "filter", n->off);
            break;
        case SB_TPL_N_WITH:
            while (!st && cur(p)->type != SB_TPL_TK_BLOCK_END) {
                sb_tpl_node *target;
                if (n->args.n && (st = expect_op(p, ",")))
                    break;
                if ((st = parse_assign_target(p, true, NULL, false, &target)))
                    break;
                if ((st = nodes_push(&n->args, target)) || (st = expect_op(p, "=")))
                    break;
                st = parse_expression(p, true, &target->a);
            }
            if (!st)
                st = parse_statements(p, end_with, true, &n->body, "with", n->off);
            break;
        case SB_TPL_N_SCOPE:
            st = parse_statements(p, end_gen, true, &n->body, "generation", n->off);
            break;
        case SB_TPL_N_OUTPUT:
            st = parse_tuple(p, false, true, NULL, false, false, &n->a);
            break;
        default: /* break, continue */
            break;
        }
    }
    p->depth--;
    if (st) {
        node_free(n);
        return st;
    }
    *out = n;
    return SB_OK;
}

static sb_status subparse(parser *p, const char *const *end_names, sb_tpl_nodes *body) {
    sb_status st = SB_OK;
    for (;;) {
        sb_tpl_token *t = cur(p);
        sb_tpl_node *n = NULL;
        if (t->type == SB_TPL_TK_EOF)
            return SB_OK;
        if (t->type == SB_TPL_TK_DATA) {
            if (!(n = node_new(SB_TPL_N_DATA, t->off)))
                return SB_ERR_NOMEM;
            n->val = t->val; /* moves the text from token to tree */
            t->val = sb_tpl_none();
            sb_tpl_make_immortal(n->val);
            next(p);
        } else if (t->type == SB_TPL_TK_VAR_BEGIN) {
            next(p);
            sb_tpl_node *e;
            if ((st = parse_tuple(p, false, true, NULL, false, false, &e)))
                return st;
            if ((st = make(p, SB_TPL_N_OUTPUT, t->off, e, NULL, &n)))
                return st;
            if ((st = expect_type(p, SB_TPL_TK_VAR_END, "end of print statement"))) {
                node_free(n);
                return st;
            }
        } else if (t->type == SB_TPL_TK_BLOCK_BEGIN) {
            next(p);
            for (size_t k = 0; end_names && end_names[k]; k++)
                if (is_name(p, end_names[k]))
                    return SB_OK;
            if ((st = parse_statement(p, &n)))
                return st;
            if ((st = expect_type(p, SB_TPL_TK_BLOCK_END, "end of statement block"))) {
                node_free(n);
                return st;
            }
        } else {
            return unexpected(p, NULL);
        }
        if ((st = nodes_push(body, n)))
            return st;
    }
}

/* ---- name resolution ----------------------------------------------------------------- */

/* Fails on filters and tests neither this engine nor Jinja2 knows, outside
 * if-statements and inline ifs (Jinja2's "soft" frames), as Jinja2 does when
 * compiling. */
static sb_status check_names(parser *p, const sb_tpl_node *n, bool soft);

static sb_status check_list(parser *p, const sb_tpl_nodes *l, bool soft) {
    sb_status st = SB_OK;
    for (size_t i = 0; i < l->n && !st; i++)
        st = check_names(p, l->v[i], soft);
    return st;
}

static sb_status check_names(parser *p, const sb_tpl_node *n, bool soft) {
    if (!n)
        return SB_OK;
    if ((n->type == SB_TPL_N_FILTER || n->type == SB_TPL_N_TEST) && !n->fn && !soft) {
        bool filter = n->type == SB_TPL_N_FILTER;
        if (!(filter ? sb_tpl_jinja_has_filter(n->name) : sb_tpl_jinja_has_test(n->name)))
            return fail_at(p, n->off, SB_ERR_FORMAT, "no %s named '%s'", filter ? "filter" : "test", n->name);
    }
    bool inner_soft = soft;
    if (n->type == SB_TPL_N_IF || n->type == SB_TPL_N_COND)
        inner_soft = true;
    else if (n->type == SB_TPL_N_MACRO || n->type == SB_TPL_N_CALL_BLOCK || n->type == SB_TPL_N_FILTER_BLOCK ||
             n->type == SB_TPL_N_WITH || n->type == SB_TPL_N_SET_BLOCK)
        inner_soft = false;
    if (n->type == SB_TPL_N_FOR) { /* the iterable is in the outer frame, the rest inside the loop */
        sb_status st = check_names(p, n->b, soft);
        if (!st)
            st = check_names(p, n->c, false);
        if (!st)
            st = check_list(p, &n->body, false);
        return st ? st : check_list(p, &n->alt, false);
    }
    sb_status st = check_names(p, n->a, inner_soft);
    if (!st)
        st = check_names(p, n->b, inner_soft);
    if (!st)
        st = check_names(p, n->c, inner_soft);
    if (!st)
        st = check_list(p, &n->body, inner_soft);
    if (!st)
        st = check_list(p, &n->alt, inner_soft);
    if (!st)
        st = check_list(p, &n->args, inner_soft);
    return st ? st : check_list(p, &n->kwargs, inner_soft);
}

/* ---- entry points --------------------------------------------------------------------- */

/* Jinja2's view of the source: \r\n and \r become \n, and one trailing
 * newline is dropped (keep_trailing_newline=False). */
static char *normalize(const char *src, size_t len, size_t *out_len) {
    char *s = sb_malloc(len + 1);
    if (!s)
        return NULL;
    size_t o = 0;
    for (size_t i = 0; i < len; i++) {
        if (src[i] == '\r') {
            s[o++] = '\n';
            if (i + 1 < len && src[i + 1] == '\n')
                i++;
        } else {
            s[o++] = src[i];
        }
    }
    if (o && s[o - 1] == '\n')
        o--;
    s[o] = '\0';
    *out_len = o;
    return s;
}

sb_status sb_tpl_parse(const char *src, size_t len, sb_tpl **out, sb_error *err) {
    *out = NULL;
    if (len > SB_TPL_MAX_BYTES || len > UINT32_MAX)
        return sb_fail(err, SB_ERR_UNSUPPORTED, "template: %zu bytes is larger than the %zu-byte limit", len,
                       (size_t)SB_TPL_MAX_BYTES);
    sb_tpl *tpl = sb_calloc(1, sizeof(*tpl));
    if (!tpl || !(tpl->src = normalize(src, len, &tpl->len))) {
        sb_free(tpl);
        return sb_fail(err, SB_ERR_NOMEM, "template: out of memory");
    }
    parser p = {.src = tpl->src, .err = err};
    sb_status st = sb_tpl_lex(tpl->src, tpl->len, &p.t, &p.n, err);
    if (!st) {
        st = subparse(&p, NULL, &tpl->body);
        if (!st && cur(&p)->type != SB_TPL_TK_EOF)
            st = unexpected(&p, NULL);
        if (!st)
            st = check_list(&p, &tpl->body, false);
        if (st == SB_ERR_NOMEM)
            sb_fail(err, st, "template: out of memory");
        sb_tpl_tokens_free(p.t, p.n);
    }
    if (st) {
        sb_tpl_free(tpl);
        return st;
    }
    *out = tpl;
    return SB_OK;
}

void sb_tpl_free(sb_tpl *tpl) {
    if (!tpl)
        return;
    nodes_free(&tpl->body);
    sb_free(tpl->src);
    sb_free(tpl);
}
