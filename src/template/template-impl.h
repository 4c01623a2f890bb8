/*
 * template-impl.h - what the files of the template module share: tokens
 * (lexer.c), the syntax tree (parser.c), the interpreter state that the
 * built-in filters, tests and methods use (interp.c, builtins.c), and the
 * limits that keep any template from crashing or running away.
 *
 * The module renders Jinja templates as Python Jinja2 3.1 does inside Hugging
 * Face transformers' apply_chat_template: ImmutableSandboxedEnvironment with
 * trim_blocks and lstrip_blocks on, loopcontrols, no autoescape.
 */
#ifndef SB_TEMPLATE_IMPL_H
#define SB_TEMPLATE_IMPL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "template/template.h"
#include "template/value.h"

/* Limits. Nesting of syntax (parentheses, blocks) the parser accepts. */
#define SB_TPL_MAX_SYNTAX_DEPTH 100
/* Macro calls in progress at once (recursion). */
#define SB_TPL_MAX_CALL_DEPTH 64
/* Evaluation steps of one render: each node evaluated, each built-in called,
 * the size of the values they yield or take (sb_tpl_size_steps), and
 * SB_TPL_LOOP_STEPS per loop iteration. Real chat templates use
 * well under 1% of it. */
#define SB_TPL_MAX_STEPS 20000000ull
#define SB_TPL_LOOP_STEPS 16
/* Longest list range() or repetition builds (Jinja's sandbox MAX_RANGE). */
#define SB_TPL_MAX_RANGE 100000

/* ---- tokens (lexer.c) ------------------------------------------------------ */

typedef enum sb_tpl_tok {
    SB_TPL_TK_EOF,
    SB_TPL_TK_DATA,        /* template text between tags (val) */
    SB_TPL_TK_VAR_BEGIN,   /* {{ */
    SB_TPL_TK_VAR_END,     /* }} */
    SB_TPL_TK_BLOCK_BEGIN, /* {% */
    SB_TPL_TK_BLOCK_END,   /* %} */
    SB_TPL_TK_NAME,
    SB_TPL_TK_STRING, /* val: the decoded literal */
    SB_TPL_TK_INT,    /* val */
    SB_TPL_TK_FLOAT,  /* val */
    SB_TPL_TK_OP,     /* one of + - * / // % ** ~ [ ] ( ) { } == != > >= < <= = . : | , ; */
} sb_tpl_tok;

typedef struct sb_tpl_token {
    sb_tpl_tok type;
    uint32_t off, len; /* span in the (newline-normalized) source */
    sb_tpl_val val;
} sb_tpl_token;

/* Splits src into tokens applying Jinja's whitespace rules (trim_blocks,
 * lstrip_blocks, {%- -%}); comments are dropped and raw blocks become data.
 * The last token is EOF. The caller frees with sb_tpl_tokens_free. */
sb_status sb_tpl_lex(const char *src, size_t len, sb_tpl_token **out, size_t *n_out, sb_error *err);
void sb_tpl_tokens_free(sb_tpl_token *toks, size_t n);

/* "template:LINE:COL: " position of a source offset, for messages. */
void sb_tpl_position(const char *src, size_t off, int *line, int *col);

/* ---- syntax tree (parser.c) ------------------------------------------------ */

typedef enum sb_tpl_ntype {
    /* statements */
    SB_TPL_N_DATA,         /* val */
    SB_TPL_N_OUTPUT,       /* {{ a }} */
    SB_TPL_N_IF,           /* if a: body else alt (elif: alt holds one IF) */
    SB_TPL_N_FOR,          /* for a in b [if c]: body else alt */
    SB_TPL_N_SET,          /* a = b (a: NAME, TUPLE of NAMEs or NSREF) */
    SB_TPL_N_SET_BLOCK,    /* a = body rendered, through filter chain c */
    SB_TPL_N_MACRO,        /* name(args: NAMEs with default in a): body */
    SB_TPL_N_CALL_BLOCK,   /* a (a CALL) with caller(args): body */
    SB_TPL_N_FILTER_BLOCK, /* body rendered through filter chain c */
    SB_TPL_N_WITH,         /* args: NAMEs with value in a; body */
    SB_TPL_N_SCOPE,        /* body (transformers' {% generation %}) */
    SB_TPL_N_BREAK,
    SB_TPL_N_CONTINUE,
    /* expressions */
    SB_TPL_N_CONST,   /* val */
    SB_TPL_N_NAME,    /* name */
    SB_TPL_N_NSREF,   /* a.name as an assignment target (a: NAME) */
    SB_TPL_N_LIST,    /* args */
    SB_TPL_N_TUPLE,   /* args */
    SB_TPL_N_DICT,    /* args: PAIRs */
    SB_TPL_N_PAIR,    /* a: b */
    SB_TPL_N_GETATTR, /* a.name */
    SB_TPL_N_GETITEM, /* a[b] (b may be a SLICE) */
    SB_TPL_N_SLICE,   /* a:b:c, each optional */
    SB_TPL_N_CALL,    /* a(args, kwargs) */
    SB_TPL_N_KEYWORD, /* name=a */
    SB_TPL_N_FILTER,  /* a|name(args, kwargs); a NULL in filter blocks */
    SB_TPL_N_TEST,    /* a is name(args, kwargs) */
    SB_TPL_N_NOT,
    SB_TPL_N_NEG,
    SB_TPL_N_POS,
    SB_TPL_N_BINOP,   /* a op b, op one of + - * / // % ** */
    SB_TPL_N_CONCAT,  /* args joined with ~ */
    SB_TPL_N_AND,
    SB_TPL_N_OR,
    SB_TPL_N_COMPARE, /* a, then args: OPERANDs */
    SB_TPL_N_OPERAND, /* op a, op one of == != < <= > >= in notin */
    SB_TPL_N_COND,    /* a if b else c (c optional) */
} sb_tpl_ntype;

typedef struct sb_tpl_node sb_tpl_node;

typedef struct sb_tpl_nodes {
    sb_tpl_node **v;
    size_t n, cap;
} sb_tpl_nodes;

struct sb_tpl_fn_def;

struct sb_tpl_node {
    sb_tpl_ntype type;
    char op[8];     /* operator text for BINOP/OPERAND */
    uint32_t off;   /* source offset, for line:column in messages */
    char *name;     /* identifier, attribute, filter/test/macro/keyword name */
    sb_tpl_val val; /* CONST and DATA (immortal) */
    const struct sb_tpl_fn_def *fn; /* FILTER/TEST: resolved; NULL fails when run */
    sb_tpl_node *a, *b, *c;
    sb_tpl_nodes body, alt, args, kwargs;
};

struct sb_tpl {
    char *src; /* newline-normalized source, for positions in messages */
    size_t len;
    sb_tpl_nodes body;
};

/* ---- interpreter (interp.c) ------------------------------------------------ */

typedef struct sb_tpl_scope sb_tpl_scope;

typedef struct sb_tpl_interp {
    const sb_tpl *tpl;
    sb_error *err;
    sb_tpl_buf *out; /* where output goes (macro calls and set blocks swap it) */
    sb_tpl_scope *scope;
    int depth;            /* macro calls in progress */
    uint64_t steps;       /* work done, against SB_TPL_MAX_STEPS */
    struct tm now;        /* strftime_now's clock */
    int loop_ctl;         /* pending break (1) / continue (2) */
} sb_tpl_interp;

/* Arguments of a call, filter or test (besides the value filtered). */
typedef struct sb_tpl_args {
    sb_tpl_val *pos;
    size_t n_pos;
    const char **kw_names;
    sb_tpl_val *kw;
    size_t n_kw;
} sb_tpl_args;

/* A filter, test, method or global: self is the filtered/tested value, the
 * method's receiver, or undefined for globals. *out receives a new reference. */
typedef sb_status (*sb_tpl_fn)(sb_tpl_interp *it, const sb_tpl_node *at, sb_tpl_val self, const sb_tpl_args *args,
                               sb_tpl_val *out);

typedef struct sb_tpl_fn_def {
    const char *name;
    sb_tpl_fn fn;
    const char *params; /* accepted parameters, comma-separated, in order ("" none; NULL: any) */
} sb_tpl_fn_def;

typedef enum sb_tpl_func_kind {
    SB_TPL_FUNC_MACRO,  /* node: the MACRO; closure: the scope it was defined in */
    SB_TPL_FUNC_CALLER, /* node: the CALL_BLOCK; closure: the scope of the call */
    SB_TPL_FUNC_GLOBAL, /* def */
    SB_TPL_FUNC_METHOD, /* def, applied to self */
} sb_tpl_func_kind;

struct sb_tpl_func {
    int32_t refs; /* first, as value.c expects */
    sb_tpl_func_kind kind;
    const sb_tpl_node *node;
    sb_tpl_scope *closure;
    const sb_tpl_fn_def *def;
    sb_tpl_val self;
};

/* Renders body with vars (a DICT of the template's variables) into a
 * malloc'd (sb_malloc) NUL-terminated string. */
sb_status sb_tpl_render_vars(const sb_tpl *tpl, sb_tpl_val vars, const struct tm *now, char **out, size_t *out_len,
                             sb_error *err);

/* Records "template:LINE:COL: message" for node `at` in it->err; returns status. */
sb_status sb_tpl_fail(sb_tpl_interp *it, const sb_tpl_node *at, sb_status status, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* Jinja's getattr (obj.name): a dict key, a method, or undefined. */
sb_status sb_tpl_getattr(sb_tpl_interp *it, const sb_tpl_node *at, sb_tpl_val obj, const char *name, sb_tpl_val *out);

/* Charges `n` steps; fails once the render's budget is spent. */
sb_status sb_tpl_charge(sb_tpl_interp *it, const sb_tpl_node *at, uint64_t n);
/* Steps for handling a value of this size: 1 per 64 string bytes or 8 items. */
uint64_t sb_tpl_size_steps(sb_tpl_val v);

/* ---- built-ins (builtins.c) -------------------------------------------------- */

/* NULL if unknown. Methods are looked up by the receiver's kind. */
const sb_tpl_fn_def *sb_tpl_find_filter(const char *name);
const sb_tpl_fn_def *sb_tpl_find_test(const char *name);
const sb_tpl_fn_def *sb_tpl_find_method(sb_tpl_kind kind, const char *name);
const sb_tpl_fn_def *sb_tpl_find_global(const char *name);
/* Whether Jinja2 itself has a filter/test of this name (that this engine may lack). */
bool sb_tpl_jinja_has_filter(const char *name);
bool sb_tpl_jinja_has_test(const char *name);
/* Checks args against def->params (too many, unknown or repeated
 * keywords fail as Python's TypeError would), then calls def->fn. */
sb_status sb_tpl_invoke(sb_tpl_interp *it, const sb_tpl_node *at, const sb_tpl_fn_def *def, sb_tpl_val self,
                        const sb_tpl_args *args, sb_tpl_val *out);
/* Argument `i` (positional) or `name` (keyword) of args; false if absent. */
bool sb_tpl_arg(const sb_tpl_args *args, size_t i, const char *name, sb_tpl_val *out);
/* Iterates a value as Python's iter() would (list items, dict keys, string
 * characters, nothing for undefined) into a new list. */
sb_status sb_tpl_iterate(sb_tpl_interp *it, const sb_tpl_node *at, sb_tpl_val v, sb_tpl_val *out);

#endif
