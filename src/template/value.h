/*
 * value.h - the dynamic values of the template engine: what a Jinja
 * expression evaluates to, with the Python semantics that show in rendered
 * text (str() of 1.0 is "1.0", True renders "True", dicts keep insertion
 * order, strings are indexed and measured in code points).
 *
 * A value is a small tagged struct passed by copy. Strings, lists, dicts,
 * namespaces and callables live on the heap with a reference count: a
 * function that "takes" a value consumes one reference, one that "borrows"
 * does not. Lists and dicts are never mutated once a template can see them
 * (transformers renders in Jinja's immutable sandbox), so only namespace
 * attribute assignment could form a cycle, and the interpreter refuses that.
 *
 * Non-goals: big integers (ints are int64 and overflow is an error), sets,
 * bytes, and Unicode case mapping beyond ASCII.
 */
#ifndef SB_TEMPLATE_VALUE_H
#define SB_TEMPLATE_VALUE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "switchboard.h"

/* Largest string (and rendered output) the engine builds, in bytes. */
#define SB_TPL_MAX_BYTES ((size_t)64 << 20)

typedef enum sb_tpl_kind {
    SB_TPL_UNDEFINED, /* Jinja's Undefined: renders "", falsy, iterates as empty */
    SB_TPL_NONE,
    SB_TPL_BOOL,
    SB_TPL_INT,
    SB_TPL_FLOAT,
    SB_TPL_STR,
    SB_TPL_LIST, /* also tuples (list.tuple) */
    SB_TPL_DICT,
    SB_TPL_NAMESPACE, /* namespace(): a dict whose attributes `set` may assign */
    SB_TPL_FUNC,      /* macro, caller, global function or bound method */
} sb_tpl_kind;

typedef struct sb_tpl_str {
    int32_t refs; /* < 0: immortal (constants of a parsed template) */
    bool ascii;   /* every byte < 0x80: byte index == code point index */
    size_t len;   /* bytes, without the NUL */
    char data[];  /* UTF-8, NUL-terminated */
} sb_tpl_str;

struct sb_tpl_list;
struct sb_tpl_dict;
struct sb_tpl_func;

typedef struct sb_tpl_val {
    sb_tpl_kind kind;
    union {
        bool b;
        int64_t i;
        double f;
        sb_tpl_str *s; /* STR; for UNDEFINED an optional hint ("'x' is undefined") */
        struct sb_tpl_list *l;
        struct sb_tpl_dict *d; /* DICT and NAMESPACE */
        struct sb_tpl_func *fn;
    };
} sb_tpl_val;

typedef struct sb_tpl_list {
    int32_t refs;
    bool tuple;     /* repr as (a, b) */
    uint16_t depth; /* 1 + deepest child container (bounded, see value.c) */
    size_t n, cap;
    sb_tpl_val *items;
} sb_tpl_list;

typedef struct sb_tpl_dict {
    int32_t refs;
    uint16_t depth; /* as sb_tpl_list.depth */
    size_t n, cap;
    sb_tpl_val *keys; /* in insertion order; lookups are linear (chat data is small) */
    sb_tpl_val *vals;
} sb_tpl_dict;

/* Callables (struct sb_tpl_func) belong to the interpreter, which defines
 * this; value.c calls it when the last reference goes. */
void sb_tpl_func_free(struct sb_tpl_func *fn);

/* ---- scalars (no allocation) ------------------------------------------- */

static inline sb_tpl_val sb_tpl_undef(void) { return (sb_tpl_val){.kind = SB_TPL_UNDEFINED}; }
static inline sb_tpl_val sb_tpl_none(void) { return (sb_tpl_val){.kind = SB_TPL_NONE}; }
static inline sb_tpl_val sb_tpl_bool(bool b) { return (sb_tpl_val){.kind = SB_TPL_BOOL, .b = b}; }
static inline sb_tpl_val sb_tpl_int(int64_t i) { return (sb_tpl_val){.kind = SB_TPL_INT, .i = i}; }
static inline sb_tpl_val sb_tpl_float(double f) { return (sb_tpl_val){.kind = SB_TPL_FLOAT, .f = f}; }

/* ---- reference counting ------------------------------------------------ */

/* Adds a reference and returns v (for `out = sb_tpl_retain(x)`). */
sb_tpl_val sb_tpl_retain(sb_tpl_val v);
void sb_tpl_release(sb_tpl_val v);
/* Makes a string immortal (shared by concurrent renders); freed only by
 * sb_tpl_free_immortal. */
void sb_tpl_make_immortal(sb_tpl_val v);
void sb_tpl_free_immortal(sb_tpl_val v);

/* ---- strings ----------------------------------------------------------- */

/* New string holding a copy of s[0..len). SB_ERR_UNSUPPORTED beyond
 * SB_TPL_MAX_BYTES, SB_ERR_NOMEM if allocation fails. */
sb_status sb_tpl_str_new(const char *s, size_t len, sb_tpl_val *out);
/* Length in code points (Python len()). */
size_t sb_tpl_str_chars(const sb_tpl_str *s);
/* Byte offset of code point `index` (0..chars) in s. */
size_t sb_tpl_str_offset(const sb_tpl_str *s, size_t index);
/* Decodes one code point at s[*pos] (invalid bytes decode as themselves)
 * and advances *pos. */
uint32_t sb_tpl_utf8_next(const char *s, size_t len, size_t *pos);
/* Appends the UTF-8 encoding of cp to out (at most 4 bytes); returns bytes written. */
size_t sb_tpl_utf8_put(uint32_t cp, char *out);
/* First occurrence of needle in hay (memmem), or NULL; an empty needle is found at hay. */
const char *sb_tpl_find_bytes(const char *hay, size_t hay_len, const char *needle, size_t needle_len);
/* Python str.isspace() for one code point. */
bool sb_tpl_is_space(uint32_t cp);

/* A growable byte buffer with the SB_TPL_MAX_BYTES cap. */
typedef struct sb_tpl_buf {
    char *p;
    size_t len, cap;
} sb_tpl_buf;
sb_status sb_tpl_buf_put(sb_tpl_buf *b, const char *s, size_t len);
sb_status sb_tpl_buf_puts(sb_tpl_buf *b, const char *s);
sb_status sb_tpl_buf_printf(sb_tpl_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Moves the contents into a new string value and empties the buffer. */
sb_status sb_tpl_buf_take(sb_tpl_buf *b, sb_tpl_val *out);
void sb_tpl_buf_free(sb_tpl_buf *b);

/* ---- lists and dicts ----------------------------------------------------- */

sb_status sb_tpl_list_new(size_t cap, bool tuple, sb_tpl_val *out);
/* Appends item, taking its reference (released on failure too). */
sb_status sb_tpl_list_push(sb_tpl_val list, sb_tpl_val item);
sb_status sb_tpl_dict_new(sb_tpl_kind kind, sb_tpl_val *out); /* DICT or NAMESPACE */
/* Sets key to val (Python semantics: an existing key keeps its position),
 * taking both references (released on failure too). */
sb_status sb_tpl_dict_set(sb_tpl_val dict, sb_tpl_val key, sb_tpl_val val);
/* Index of key in dict (Python equality), or -1. */
ptrdiff_t sb_tpl_dict_find(const sb_tpl_dict *d, sb_tpl_val key);
/* Borrowed lookup by string key; NULL if absent. */
const sb_tpl_val *sb_tpl_dict_get(const sb_tpl_dict *d, const char *key);

/* ---- Python semantics ---------------------------------------------------- */

bool sb_tpl_truthy(sb_tpl_val v);
/* Python ==, with Jinja's Undefined equal only to Undefined. */
bool sb_tpl_equal(sb_tpl_val a, sb_tpl_val b);
/* Python <, <=, ... ordering: *cmp receives -1, 0 or 1. False if the types
 * cannot be ordered (a TypeError in Python). */
bool sb_tpl_order(sb_tpl_val a, sb_tpl_val b, int *cmp);
/* Python type name for messages: "str", "int", "dict", "NoneType", "Undefined"... */
const char *sb_tpl_type_name(sb_tpl_val v);
/* Python str(v) and repr(v) appended to b. */
sb_status sb_tpl_write_str(sb_tpl_buf *b, sb_tpl_val v);
sb_status sb_tpl_write_repr(sb_tpl_buf *b, sb_tpl_val v);
/* Python repr of a float ("1.0", "0.1", "1e+20", "inf"). */
sb_status sb_tpl_write_float(sb_tpl_buf *b, double f);
/* str(v) as a string value (a new reference; strings are shared). */
sb_status sb_tpl_to_str(sb_tpl_val v, sb_tpl_val *out);

/* ---- JSON -------------------------------------------------------------- */

/* Options of Python's json.dumps as transformers' tojson passes them. */
typedef struct sb_tpl_json_opts {
    int indent;          /* < 0: no newlines (None) */
    bool ensure_ascii;   /* escape non-ASCII as \uXXXX */
    bool sort_keys;
    const char *item_sep; /* NULL: ", " (or "," with indent) */
    const char *key_sep;  /* NULL: ": " */
} sb_tpl_json_opts;

/* json.dumps(v) appended to b. Fails with SB_ERR_INVALID_ARG and *why set
 * (static text) for values JSON cannot hold (Undefined, callables). */
sb_status sb_tpl_write_json(sb_tpl_buf *b, sb_tpl_val v, const sb_tpl_json_opts *opts, const char **why);
/* Parses JSON text like Python's json.loads: integers without fraction or
 * exponent become ints, objects keep key order. `what` names the input in
 * error messages, which give the line and column. */
sb_status sb_tpl_json_parse(const char *text, size_t len, const char *what, sb_tpl_val *out, sb_error *err);

#endif
