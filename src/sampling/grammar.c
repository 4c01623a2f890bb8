/*
 * grammar.c - GBNF parsing, the pushdown matcher and token masks (see
 * grammar.h).
 *
 * Compiled form. Every rule is a list of alternatives, every alternative a
 * sequence of elements ending in E_END, all in one array, so that a parser
 * position is one index: the element to match next. An element is a
 * character set (E_CHARS: ranges, maybe negated) or a rule reference
 * (E_RULE). Groups and repetitions become anonymous rules while parsing
 * (x* is r ::= x r | ; x{2,4} is x x (x (x)?)?), as llama.cpp does.
 *
 * Matching. The parser state is a set of stacks of positions, the top of
 * each a character set: the ways the text so far can continue. Consuming a
 * code point keeps the stacks whose top matches it, advances their top, and
 * expands it again (a reference pushes its rule's alternatives, an E_END
 * pops) until every top is a character set; an empty stack means the text
 * may end here. Left recursion would expand forever and is refused when the
 * grammar is compiled. Bytes are fed one at a time; a UTF-8 character not
 * yet complete is kept beside the stacks.
 *
 * Masks. Each grammar grows a DFA on the fly: a state is one interned
 * (stack set, incomplete character) pair, and each state keeps its 256 byte
 * transitions as they are first needed. A token mask is then a walk of the
 * vocabulary's trie (tokens sorted by bytes, stored in preorder) where each
 * node costs one transition lookup, and a dead transition skips the whole
 * subtree: every token that shares a prefix is tested once for it. The
 * mask of a state is kept with it (as a list of allowed tokens, of refused
 * tokens, or a bitmap, whichever is smallest). Inside a JSON string, say,
 * one character loops back to the same state, so the first walk costs about
 * a lookup per trie node and later steps in that state a copy of its mask.
 * When the states take more memory than a cap, they are all dropped and
 * grown again.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "model/model.h"
#include "sampling/grammar.h"
#include "tokenizer/vocab.h"

#define MAX_STACK 1024         /* positions in one stack: deeper nesting is refused */
#define MAX_REPEAT 100000      /* the largest count of {m,n} */
#define MAX_NESTING 256        /* parentheses inside each other */
#define DFA_CAP_BYTES (64u << 20) /* a grammar's DFA states, transitions and masks */
#define VOCAB_CACHE 16         /* compiled grammars kept per vocabulary */

enum { E_END, E_CHARS, E_RULE };

typedef struct {
    int32_t kind;
    int32_t arg; /* E_CHARS: the set; E_RULE: the rule */
} elem;

typedef struct {
    uint32_t ascii[4]; /* membership of code points 0..127, negation applied */
    uint32_t first, n; /* ranges[first .. first + n) */
    bool negate;
} charset;

typedef struct {
    uint32_t lo, hi;
} range;

typedef struct {
    int32_t first_alt, n_alts; /* alt_start[first_alt ..] */
} rule;

/* A UTF-8 character still incomplete: its bits so far and bytes to come. */
typedef struct {
    uint32_t value;
    uint32_t remaining;
} partial;

/* A set of stacks: entries [len, hash, positions...] back to back. */
typedef struct {
    int32_t *v;
    size_t n, cap;
    int32_t count;
    bool oom;
} sset;

/* Masks are stored in whichever form is smallest. */
enum { MASK_ALLOWED, MASK_REFUSED, MASK_BITS };

typedef struct {
    uint32_t hash;
    uint32_t key_off, key_len; /* in dfa.keys: partial value, remaining, then the sset's entries */
    int32_t *trans;            /* 256 next states, -2 not yet known, -1 dead; NULL until needed */
    int32_t mask_kind, mask_n; /* -1: no mask yet */
    uint32_t *mask;
    bool accepting;
} dstate;

typedef struct {
    dstate *states;
    int32_t n_states, cap_states;
    int32_t *table; /* open addressing over states: id or -1 */
    uint32_t table_mask;
    int32_t *keys;
    size_t n_keys, cap_keys;
    size_t bytes;
} dfa;

struct sb_grammar {
    atomic_int refs;
    elem *elems;
    int32_t n_elems;
    int32_t *alt_start;
    rule *rules;
    int32_t n_rules;
    charset *sets;
    range *ranges;
    int32_t root;
    sb_grammar_vocab *vocab; /* NULL: text matching only */
    char *text;              /* the source, the cache's key */
    size_t text_len;
    pthread_mutex_t lock; /* guards dfa */
    dfa dfa;
};

struct sb_grammar_vocab {
    const sb_model_t *model;
    int32_t n_vocab, n_words;
    /* The trie in preorder; node 0 is the root (the empty prefix). */
    uint8_t *byte;
    uint16_t *depth;
    int32_t *size; /* nodes in the subtree, the node included */
    int32_t *tok_first, *tok_n;
    int32_t *toks;
    int32_t n_nodes, max_depth;
    uint32_t *eog; /* bits of the end-of-generation tokens */
    pthread_mutex_t lock; /* guards the cache */
    sb_grammar *cache[VOCAB_CACHE];
    uint64_t used[VOCAB_CACHE], clock;
};

/* Scratch for advancing stack sets. */
typedef struct {
    sset a, b;
    int32_t *todo; /* stacks waiting to be expanded: [positions..., len] */
    size_t n_todo, cap_todo;
    int32_t work[MAX_STACK];
    bool oom;
} scratch;

struct sb_grammar_matcher {
    sb_grammar *g;
    sset cur;
    partial part;
    scratch s;
    uint32_t *mask; /* n_words */
    int32_t *walk;  /* DFA state per trie depth */
};

/* ---- growable arrays ------------------------------------------------------ */

static bool grow(void **p, size_t *cap, size_t need, size_t size) {
    if (need <= *cap)
        return true;
    size_t c = *cap ? *cap : 16;
    while (c < need)
        c *= 2;
    void *q = sb_realloc(*p, c * size);
    if (!q)
        return false;
    *p = q;
    *cap = c;
    return true;
}

/* ---- character sets ------------------------------------------------------- */

static bool set_has(const sb_grammar *g, const charset *cs, uint32_t cp) {
    if (cp < 128)
        return cs->ascii[cp >> 5] >> (cp & 31) & 1;
    bool in = false;
    for (uint32_t i = 0; i < cs->n && !in; i++)
        in = cp >= g->ranges[cs->first + i].lo && cp <= g->ranges[cs->first + i].hi;
    return in != cs->negate;
}

/* Whether some code point in [lo, hi] is in the set. */
static bool set_meets(const sb_grammar *g, const charset *cs, uint32_t lo, uint32_t hi) {
    const range *r = g->ranges + cs->first;
    if (!cs->negate) {
        for (uint32_t i = 0; i < cs->n; i++)
            if (r[i].lo <= hi && r[i].hi >= lo)
                return true;
        return false;
    }
    /* Negated: look for a point of [lo, hi] no range covers. */
    uint32_t cp = lo;
    for (uint32_t pass = 0; pass <= cs->n; pass++) {
        bool moved = false;
        for (uint32_t i = 0; i < cs->n; i++)
            if (r[i].lo <= cp && r[i].hi >= cp) {
                if (r[i].hi >= hi)
                    return false;
                cp = r[i].hi + 1;
                moved = true;
            }
        if (!moved)
            return true;
    }
    return true;
}

/* ---- stack sets ----------------------------------------------------------- */

static uint32_t hash_ints(const int32_t *p, size_t n, uint32_t h) {
    for (size_t i = 0; i < n; i++)
        h = (h ^ (uint32_t)p[i]) * 16777619u;
    return h;
}

static void sset_clear(sset *s) {
    s->n = 0;
    s->count = 0;
}

static void sset_add(sset *s, const int32_t *st, int32_t len) {
    int32_t h = (int32_t)hash_ints(st, (size_t)len, 2166136261u);
    for (size_t i = 0; i < s->n; i += 2 + (size_t)s->v[i])
        if (s->v[i] == len && s->v[i + 1] == h && memcmp(s->v + i + 2, st, (size_t)len * sizeof(int32_t)) == 0)
            return;
    if (!grow((void **)&s->v, &s->cap, s->n + 2 + (size_t)len, sizeof(int32_t))) {
        s->oom = true;
        return;
    }
    s->v[s->n] = len;
    s->v[s->n + 1] = h;
    memcpy(s->v + s->n + 2, st, (size_t)len * sizeof(int32_t));
    s->n += 2 + (size_t)len;
    s->count++;
}

static bool sset_copy(sset *dst, const sset *src) {
    if (!grow((void **)&dst->v, &dst->cap, src->n, sizeof(int32_t)))
        return false;
    if (src->n)
        memcpy(dst->v, src->v, src->n * sizeof(int32_t));
    dst->n = src->n;
    dst->count = src->count;
    return true;
}

static bool sset_accepting(const sset *s) {
    for (size_t i = 0; i < s->n; i += 2 + (size_t)s->v[i])
        if (s->v[i] == 0)
            return true;
    return false;
}

static void push_todo(scratch *sc, const int32_t *st, int32_t len, int32_t top) {
    if (len + 1 > MAX_STACK)
        return; /* nesting this deep is not followed */
    if (!grow((void **)&sc->todo, &sc->cap_todo, sc->n_todo + (size_t)len + 2, sizeof(int32_t))) {
        sc->oom = true;
        return;
    }
    if (len)
        memcpy(sc->todo + sc->n_todo, st, (size_t)len * sizeof(int32_t));
    sc->todo[sc->n_todo + (size_t)len] = top;
    sc->todo[sc->n_todo + (size_t)len + 1] = len + 1;
    sc->n_todo += (size_t)len + 2;
}

/* Expands every stack waiting in sc->todo until each top is a character
 * set (or the stack is empty), adding the results to out. */
static void expand_todo(const sb_grammar *g, scratch *sc, sset *out) {
    int32_t *w = sc->work;
    while (sc->n_todo) {
        int32_t n = sc->todo[sc->n_todo - 1];
        sc->n_todo -= (size_t)n + 1;
        memcpy(w, sc->todo + sc->n_todo, (size_t)n * sizeof(int32_t));
        for (;;) {
            if (n == 0) {
                sset_add(out, w, 0);
                break;
            }
            int32_t p = w[n - 1];
            const elem *e = &g->elems[p];
            if (e->kind == E_END) {
                n--;
                continue;
            }
            if (e->kind == E_CHARS) {
                sset_add(out, w, n);
                break;
            }
            n--;
            if (g->elems[p + 1].kind != E_END) /* at an alternative's end the reference is a tail call */
                w[n++] = p + 1;
            const rule *r = &g->rules[e->arg];
            for (int32_t a = 1; a < r->n_alts; a++)
                push_todo(sc, w, n, g->alt_start[r->first_alt + a]);
            if (n + 1 > MAX_STACK)
                break;
            w[n++] = g->alt_start[r->first_alt];
        }
    }
}

/* out = the stacks of `in` advanced over code point cp. */
static void advance(const sb_grammar *g, const sset *in, uint32_t cp, scratch *sc, sset *out) {
    sset_clear(out);
    for (size_t i = 0; i < in->n; i += 2 + (size_t)in->v[i]) {
        int32_t len = in->v[i];
        if (len == 0)
            continue;
        const int32_t *st = in->v + i + 2;
        int32_t p = st[len - 1];
        if (set_has(g, &g->sets[g->elems[p].arg], cp))
            push_todo(sc, st, len - 1, p + 1);
    }
    expand_todo(g, sc, out);
}

/* Whether some stack can take a code point in [lo, hi]. */
static bool can_take(const sb_grammar *g, const sset *in, uint32_t lo, uint32_t hi) {
    for (size_t i = 0; i < in->n; i += 2 + (size_t)in->v[i]) {
        int32_t len = in->v[i];
        if (len && set_meets(g, &g->sets[g->elems[in->v[i + 1 + len]].arg], lo, hi))
            return true;
    }
    return false;
}

/* Feeds byte b to an incomplete character: 1 completes code point *cp, 0
 * still incomplete, -1 not UTF-8. */
static int feed_byte(partial *pt, uint8_t b, uint32_t *cp) {
    if (pt->remaining == 0) {
        if (b < 0x80) {
            *cp = b;
            return 1;
        }
        if ((b & 0xE0) == 0xC0 && b >= 0xC2)
            *pt = (partial){b & 0x1Fu, 1};
        else if ((b & 0xF0) == 0xE0)
            *pt = (partial){b & 0x0Fu, 2};
        else if ((b & 0xF8) == 0xF0 && b <= 0xF4)
            *pt = (partial){b & 0x07u, 3};
        else
            return -1;
        return 0;
    }
    /* The first continuation byte also refuses overlong forms, surrogates
     * and code points past U+10FFFF (Unicode's table of well-formed UTF-8). */
    uint8_t lo = 0x80, hi = 0xBF;
    if (pt->remaining == 2 && pt->value == 0x0)
        lo = 0xA0;
    else if (pt->remaining == 2 && pt->value == 0xD)
        hi = 0x9F;
    else if (pt->remaining == 3 && pt->value == 0x0)
        lo = 0x90;
    else if (pt->remaining == 3 && pt->value == 0x4)
        hi = 0x8F;
    if (b < lo || b > hi)
        return -1;
    pt->value = pt->value << 6 | (b & 0x3Fu);
    if (--pt->remaining)
        return 0;
    *cp = pt->value;
    pt->value = 0;
    return 1;
}

/* One byte from (in, *pt): 1 with out the new stacks, 0 when the character
 * is still incomplete but can still be taken (in stays the state), -1 dead. */
static int step_byte(const sb_grammar *g, const sset *in, partial *pt, uint8_t b, scratch *sc, sset *out) {
    uint32_t cp;
    int r = feed_byte(pt, b, &cp);
    if (r < 0)
        return -1;
    if (r == 0) {
        /* The code points the character can still become: well-formed
         * ones only (no overlong forms, surrogates or beyond U+10FFFF). */
        uint32_t bits = 6 * pt->remaining;
        uint32_t lo = pt->value << bits, hi = lo | ((1u << bits) - 1);
        if (pt->remaining == 2 && pt->value == 0)
            lo = 0x800;
        if (pt->remaining == 3 && pt->value == 0)
            lo = 0x10000;
        if (pt->remaining == 2 && pt->value == 0xD)
            hi = 0xD7FF;
        hi = SB_MIN(hi, 0x10FFFFu);
        return can_take(g, in, lo, hi) ? 0 : -1;
    }
    advance(g, in, cp, sc, out);
    return out->count ? 1 : -1;
}

/* ---- parsing -------------------------------------------------------------- */

typedef struct {
    char *name; /* NULL for the rules groups and repetitions make */
    size_t name_len;
    elem *e; /* E_CHARS / E_RULE, alternatives separated by E_END */
    size_t n, cap;
    bool defined;
    size_t ref_at; /* where it was first referenced */
} prule;

typedef struct {
    const char *src;
    size_t len, pos;
    prule *rules;
    size_t n_rules, cap_rules;
    charset *sets;
    size_t n_sets, cap_sets;
    range *ranges;
    size_t n_ranges, cap_ranges;
    sb_error *err;
    sb_status st;
    int nesting;
} parser;

static void where(const parser *ps, size_t at, int *line, int *col) {
    *line = 1;
    *col = 1;
    for (size_t i = 0; i < at && i < ps->len; i++) {
        if (ps->src[i] == '\n') {
            (*line)++;
            *col = 1;
        } else if (((unsigned char)ps->src[i] & 0xC0) != 0x80) {
            (*col)++;
        }
    }
}

static bool fail_at(parser *ps, size_t at, const char *what) {
    if (ps->st != SB_OK)
        return false;
    int line, col;
    where(ps, at, &line, &col);
    ps->st = sb_fail(ps->err, SB_ERR_INVALID_ARG, "grammar: line %d, column %d: %s", line, col, what);
    return false;
}

static bool nomem(parser *ps) {
    if (ps->st == SB_OK)
        ps->st = sb_fail(ps->err, SB_ERR_NOMEM, "grammar: out of memory");
    return false;
}

static int peek(const parser *ps, size_t off) {
    return ps->pos + off < ps->len ? (unsigned char)ps->src[ps->pos + off] : -1;
}

/* Skips blanks and comments; newlines too when newline_ok. */
static void skip_space(parser *ps, bool newline_ok) {
    for (;;) {
        int c = peek(ps, 0);
        if (c == ' ' || c == '\t' || ((c == '\n' || c == '\r') && newline_ok)) {
            ps->pos++;
        } else if (c == '#') {
            while (peek(ps, 0) >= 0 && peek(ps, 0) != '\n')
                ps->pos++;
        } else {
            return;
        }
    }
}

static bool is_name_char(int c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
}

static int32_t add_rule(parser *ps, const char *name, size_t name_len) {
    if (!grow((void **)&ps->rules, &ps->cap_rules, ps->n_rules + 1, sizeof(prule)))
        return nomem(ps), -1;
    prule *r = &ps->rules[ps->n_rules];
    memset(r, 0, sizeof *r);
    if (name && !(r->name = sb_strndup(name, name_len)))
        return nomem(ps), -1;
    r->name_len = name_len;
    return (int32_t)ps->n_rules++;
}

static int32_t rule_named(parser *ps, const char *name, size_t len, size_t at) {
    for (size_t i = 0; i < ps->n_rules; i++)
        if (ps->rules[i].name && ps->rules[i].name_len == len && memcmp(ps->rules[i].name, name, len) == 0)
            return (int32_t)i;
    int32_t id = add_rule(ps, name, len);
    if (id >= 0)
        ps->rules[id].ref_at = at;
    return id;
}

static bool emit(parser *ps, int32_t r, int32_t kind, int32_t arg) {
    prule *pr = &ps->rules[r];
    if (!grow((void **)&pr->e, &pr->cap, pr->n + 1, sizeof(elem)))
        return nomem(ps);
    pr->e[pr->n++] = (elem){kind, arg};
    return true;
}

static int32_t add_set(parser *ps, const range *rs, size_t n, bool negate) {
    if (!grow((void **)&ps->sets, &ps->cap_sets, ps->n_sets + 1, sizeof(charset)) ||
        !grow((void **)&ps->ranges, &ps->cap_ranges, ps->n_ranges + n, sizeof(range)))
        return nomem(ps), -1;
    charset *cs = &ps->sets[ps->n_sets];
    memset(cs, 0, sizeof *cs);
    cs->first = (uint32_t)ps->n_ranges;
    cs->n = (uint32_t)n;
    cs->negate = negate;
    if (n)
        memcpy(ps->ranges + ps->n_ranges, rs, n * sizeof(range));
    ps->n_ranges += n;
    for (uint32_t cp = 0; cp < 128; cp++) {
        bool in = false;
        for (size_t i = 0; i < n; i++)
            in |= cp >= rs[i].lo && cp <= rs[i].hi;
        if (in != negate)
            cs->ascii[cp >> 5] |= 1u << (cp & 31);
    }
    return (int32_t)ps->n_sets++;
}

/* One UTF-8 character of the source; -1 if malformed. */
static int64_t source_char(parser *ps) {
    partial pt = {0, 0};
    uint32_t cp;
    size_t start = ps->pos;
    while (ps->pos < ps->len) {
        int r = feed_byte(&pt, (uint8_t)ps->src[ps->pos++], &cp);
        if (r > 0)
            return cp;
        if (r < 0)
            break;
    }
    ps->pos = start;
    return -1;
}

static int hexval(int c) {
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

/* A character inside "..." or [...], escapes decoded; -1 after an error. */
static int64_t literal_char(parser *ps) {
    size_t at = ps->pos;
    if (peek(ps, 0) != '\\') {
        int64_t c = source_char(ps);
        if (c < 0)
            fail_at(ps, at, "the grammar is not valid UTF-8");
        return c;
    }
    ps->pos++;
    int c = peek(ps, 0);
    ps->pos++;
    int digits = c == 'x' ? 2 : c == 'u' ? 4 : c == 'U' ? 8 : 0;
    if (digits) {
        uint32_t v = 0;
        for (int i = 0; i < digits; i++) {
            int h = hexval(peek(ps, 0));
            if (h < 0)
                return fail_at(ps, ps->pos, "expected a hexadecimal digit in the escape"), -1;
            v = v * 16 + (uint32_t)h;
            ps->pos++;
        }
        if (v > 0x10FFFF)
            return fail_at(ps, at, "the escape is beyond U+10FFFF"), -1;
        return v;
    }
    switch (c) {
    case 'n': return '\n';
    case 'r': return '\r';
    case 't': return '\t';
    case '0': return 0;
    case '\\': case '"': case '\'': case '[': case ']': case '-': case '^': case '/': case '.': case '(': case ')':
    case '{': case '}': case '|': case '*': case '+': case '?':
        return c;
    default:
        return fail_at(ps, at, "unknown escape"), -1;
    }
}

static bool parse_alternates(parser *ps, int32_t r);

/* A symbol's elements are rule r's from `start`: moves them into a rule of
 * their own (unless they are one element already) and returns that element. */
static bool symbol_elem(parser *ps, int32_t r, size_t start, elem *out) {
    prule *pr = &ps->rules[r];
    if (pr->n - start == 1) {
        *out = pr->e[start];
        return true;
    }
    int32_t sub = add_rule(ps, NULL, 0);
    if (sub < 0)
        return false;
    pr = &ps->rules[r];
    for (size_t i = start; i < pr->n; i++)
        if (!emit(ps, sub, pr->e[i].kind, pr->e[i].arg))
            return false;
    ps->rules[sub].defined = true;
    *out = (elem){E_RULE, sub};
    return true;
}

/* Replaces rule r's last symbol (from start) by its repetition {lo, hi}
 * (hi < 0: unbounded). */
static bool repeat(parser *ps, int32_t r, size_t start, int64_t lo, int64_t hi) {
    elem x;
    if (!symbol_elem(ps, r, start, &x))
        return false;
    ps->rules[r].n = start;
    for (int64_t i = 0; i < lo; i++)
        if (!emit(ps, r, x.kind, x.arg))
            return false;
    if (hi < 0) { /* t ::= x t | (empty) */
        int32_t t = add_rule(ps, NULL, 0);
        if (t < 0 || !emit(ps, t, x.kind, x.arg) || !emit(ps, t, E_RULE, t) || !emit(ps, t, E_END, 0) ||
            !emit(ps, t, E_END, 0))
            return false;
        ps->rules[t].defined = true;
        return emit(ps, r, E_RULE, t);
    }
    /* Optional copies nest: t1 ::= x | ; tk ::= x t(k-1) | ; then tk. */
    int32_t prev = -1;
    for (int64_t i = lo; i < hi; i++) {
        int32_t t = add_rule(ps, NULL, 0);
        if (t < 0 || !emit(ps, t, x.kind, x.arg) || (prev >= 0 && !emit(ps, t, E_RULE, prev)) ||
            !emit(ps, t, E_END, 0) || !emit(ps, t, E_END, 0))
            return false;
        ps->rules[t].defined = true;
        prev = t;
    }
    return prev < 0 || emit(ps, r, E_RULE, prev);
}

static bool parse_count(parser *ps, int64_t *out) {
    if (!(peek(ps, 0) >= '0' && peek(ps, 0) <= '9'))
        return fail_at(ps, ps->pos, "expected a number in the repetition");
    int64_t v = 0;
    while (peek(ps, 0) >= '0' && peek(ps, 0) <= '9') {
        v = v * 10 + (peek(ps, 0) - '0');
        ps->pos++;
        if (v > MAX_REPEAT)
            return fail_at(ps, ps->pos, "the repetition count is too large (at most 100000)");
    }
    *out = v;
    return true;
}

/* {m}, {m,}, {m,n} after the '{'. */
static bool parse_braces(parser *ps, int32_t r, size_t start) {
    size_t at = ps->pos - 1;
    int64_t lo, hi;
    skip_space(ps, true);
    if (!parse_count(ps, &lo))
        return false;
    skip_space(ps, true);
    hi = lo;
    if (peek(ps, 0) == ',') {
        ps->pos++;
        skip_space(ps, true);
        hi = -1;
        if (peek(ps, 0) != '}' && !parse_count(ps, &hi))
            return false;
        skip_space(ps, true);
    }
    if (peek(ps, 0) != '}')
        return fail_at(ps, ps->pos, "expected '}' to close the repetition");
    ps->pos++;
    if (hi >= 0 && hi < lo)
        return fail_at(ps, at, "the repetition's maximum is below its minimum");
    return repeat(ps, r, start, lo, hi);
}

static bool parse_class(parser *ps, int32_t r) {
    size_t at = ps->pos++;
    bool negate = peek(ps, 0) == '^';
    if (negate)
        ps->pos++;
    range *v = NULL;
    size_t n = 0, cap = 0;
    bool ok = true;
    while (ok && peek(ps, 0) != ']') {
        if (peek(ps, 0) < 0) {
            ok = fail_at(ps, at, "unterminated character class");
            break;
        }
        size_t item_at = ps->pos;
        int64_t lo = literal_char(ps), hi = lo;
        if (lo >= 0 && peek(ps, 0) == '-' && peek(ps, 1) != ']' && peek(ps, 1) >= 0) {
            ps->pos++;
            hi = literal_char(ps);
            if (hi >= 0 && hi < lo)
                ok = fail_at(ps, item_at, "the range's end is below its start");
        }
        if (lo < 0 || hi < 0)
            ok = false;
        else if (ok && !grow((void **)&v, &cap, n + 1, sizeof(range)))
            ok = nomem(ps);
        else if (ok)
            v[n++] = (range){(uint32_t)lo, (uint32_t)hi};
    }
    int32_t set = -1;
    if (ok) {
        ps->pos++;
        set = add_set(ps, v, n, negate);
    }
    sb_free(v);
    return set >= 0 && emit(ps, r, E_CHARS, set);
}

static bool parse_sequence(parser *ps, int32_t r, bool nested) {
    size_t last = SIZE_MAX; /* where the last symbol's elements start in rule r */
    for (;;) {
        int c = peek(ps, 0);
        size_t at = ps->pos;
        size_t start = ps->rules[r].n;
        if (c == '"') {
            ps->pos++;
            while (peek(ps, 0) != '"') {
                if (peek(ps, 0) < 0 || peek(ps, 0) == '\n')
                    return fail_at(ps, at, "unterminated string literal");
                int64_t ch = literal_char(ps);
                if (ch < 0)
                    return false;
                range one = {(uint32_t)ch, (uint32_t)ch};
                int32_t set = add_set(ps, &one, 1, false);
                if (set < 0 || !emit(ps, r, E_CHARS, set))
                    return false;
            }
            ps->pos++;
            last = start;
        } else if (c == '[') {
            if (!parse_class(ps, r))
                return false;
            last = start;
        } else if (c == '.') {
            ps->pos++;
            int32_t set = add_set(ps, NULL, 0, true);
            if (set < 0 || !emit(ps, r, E_CHARS, set))
                return false;
            last = start;
        } else if (is_name_char(c)) {
            size_t b = ps->pos;
            while (is_name_char(peek(ps, 0)))
                ps->pos++;
            int32_t ref = rule_named(ps, ps->src + b, ps->pos - b, b);
            if (ref < 0 || !emit(ps, r, E_RULE, ref))
                return false;
            last = start;
        } else if (c == '(') {
            if (++ps->nesting > MAX_NESTING)
                return fail_at(ps, at, "parentheses nest too deeply");
            ps->pos++;
            skip_space(ps, true);
            int32_t sub = add_rule(ps, NULL, 0);
            if (sub < 0 || !parse_alternates(ps, sub))
                return false;
            ps->rules[sub].defined = true;
            if (peek(ps, 0) != ')')
                return fail_at(ps, at, "expected ')' to close this group");
            ps->pos++;
            ps->nesting--;
            if (!emit(ps, r, E_RULE, sub))
                return false;
            last = start;
        } else if (c == '*' || c == '+' || c == '?' || c == '{') {
            if (last == SIZE_MAX)
                return fail_at(ps, at, "a repetition operator must follow a symbol");
            ps->pos++;
            bool ok = c == '{'   ? parse_braces(ps, r, last)
                      : c == '*' ? repeat(ps, r, last, 0, -1)
                      : c == '+' ? repeat(ps, r, last, 1, -1)
                                 : repeat(ps, r, last, 0, 1);
            if (!ok)
                return false;
            last = SIZE_MAX;
        } else if (c == '<' || c == '!') {
            return fail_at(ps, at, "token references (<...>) are not supported");
        } else {
            return true;
        }
        skip_space(ps, nested);
    }
}

static bool parse_alternates(parser *ps, int32_t r) {
    for (;;) {
        if (!parse_sequence(ps, r, ps->nesting > 0) || !emit(ps, r, E_END, 0))
            return false;
        if (peek(ps, 0) != '|')
            return true;
        ps->pos++;
        skip_space(ps, true);
    }
}

static bool parse_rule(parser *ps) {
    size_t at = ps->pos;
    while (is_name_char(peek(ps, 0)))
        ps->pos++;
    if (ps->pos == at)
        return fail_at(ps, at, "expected a rule name");
    size_t name_end = ps->pos;
    skip_space(ps, false);
    if (!(peek(ps, 0) == ':' && peek(ps, 1) == ':' && peek(ps, 2) == '='))
        return fail_at(ps, ps->pos, "expected '::=' after the rule name");
    ps->pos += 3;
    skip_space(ps, true);
    int32_t r = rule_named(ps, ps->src + at, name_end - at, at);
    if (r < 0)
        return false;
    if (ps->rules[r].defined)
        return fail_at(ps, at, "this rule is defined twice");
    ps->rules[r].defined = true;
    if (!parse_alternates(ps, r))
        return false;
    int c = peek(ps, 0);
    if (c == '\r' && peek(ps, 1) == '\n')
        c = peek(ps, 1), ps->pos++;
    if (c >= 0 && c != '\n')
        return fail_at(ps, ps->pos, c == ')' ? "unmatched ')'" : "unexpected character");
    return true;
}

/* ---- compiling ------------------------------------------------------------ */

static void parser_free(parser *ps) {
    for (size_t i = 0; i < ps->n_rules; i++) {
        sb_free(ps->rules[i].name);
        sb_free(ps->rules[i].e);
    }
    sb_free(ps->rules);
    sb_free(ps->sets);
    sb_free(ps->ranges);
}

/* Left recursion: a rule reachable from itself through the leftmost symbols
 * of its alternatives, past nullable ones. Returns a rule on such a cycle,
 * -1 if there is none, -2 if out of memory. A depth-first search whose
 * frames remember the alternative and element they are at. */
typedef struct {
    int32_t rule, alt, pos;
} lr_frame;

static int32_t left_recursive(const sb_grammar *g, const bool *nullable) {
    int32_t n = g->n_rules;
    uint8_t *mark = sb_calloc((size_t)n, 1); /* 0 new, 1 on the path, 2 done */
    lr_frame *path = sb_malloc((size_t)n * sizeof(lr_frame));
    int32_t found = -1;
    if (!mark || !path)
        found = -2;
    for (int32_t s = 0; s < n && found == -1; s++) {
        if (mark[s])
            continue;
        mark[s] = 1;
        path[0] = (lr_frame){s, 0, g->alt_start[g->rules[s].first_alt]};
        int32_t depth = 1;
        while (depth > 0 && found == -1) {
            lr_frame *f = &path[depth - 1];
            const rule *ru = &g->rules[f->rule];
            int32_t next = -1;
            while (next < 0 && f->alt < ru->n_alts) {
                const elem *e = &g->elems[f->pos];
                if (e->kind == E_RULE)
                    next = e->arg;
                if (e->kind == E_RULE && nullable[e->arg]) {
                    f->pos++;
                } else if (++f->alt < ru->n_alts) {
                    f->pos = g->alt_start[ru->first_alt + f->alt];
                }
            }
            if (next < 0) {
                mark[f->rule] = 2;
                depth--;
            } else if (mark[next] == 1) {
                found = next;
            } else if (mark[next] == 0) {
                mark[next] = 1;
                path[depth++] = (lr_frame){next, 0, g->alt_start[g->rules[next].first_alt]};
            }
        }
    }
    sb_free(mark);
    sb_free(path);
    return found;
}


static sb_status compile(parser *ps, sb_grammar *g, sb_error *err) {
    int32_t root = -1;
    for (size_t i = 0; i < ps->n_rules; i++) {
        prule *r = &ps->rules[i];
        if (!r->defined) {
            char what[160];
            snprintf(what, sizeof what, "the rule '%.*s' is used but never defined", (int)SB_MIN(r->name_len, 100),
                     r->name);
            fail_at(ps, r->ref_at, what);
            return ps->st;
        }
        if (r->name && r->name_len == 4 && memcmp(r->name, "root", 4) == 0)
            root = (int32_t)i;
    }
    if (root < 0)
        return sb_fail(err, SB_ERR_INVALID_ARG, "grammar: there is no 'root' rule");
    size_t n_elems = 0, n_alts = 0;
    for (size_t i = 0; i < ps->n_rules; i++) {
        n_elems += ps->rules[i].n;
        for (size_t j = 0; j < ps->rules[i].n; j++)
            n_alts += ps->rules[i].e[j].kind == E_END;
    }
    g->n_rules = (int32_t)ps->n_rules;
    g->elems = sb_malloc((n_elems + 1) * sizeof(elem));
    g->alt_start = sb_malloc((n_alts + 1) * sizeof(int32_t));
    g->rules = sb_malloc(ps->n_rules * sizeof(rule));
    if (!g->elems || !g->alt_start || !g->rules)
        return sb_fail(err, SB_ERR_NOMEM, "grammar: out of memory");
    int32_t e = 0, a = 0;
    for (size_t i = 0; i < ps->n_rules; i++) {
        prule *pr = &ps->rules[i];
        g->rules[i] = (rule){a, 0};
        for (size_t j = 0; j < pr->n; j++) {
            if (j == 0 || pr->e[j - 1].kind == E_END) {
                g->alt_start[a++] = e;
                g->rules[i].n_alts++;
            }
            g->elems[e++] = pr->e[j];
        }
    }
    g->elems[e] = (elem){E_END, 0};
    g->n_elems = e;
    g->root = root;
    g->sets = ps->sets;
    g->ranges = ps->ranges;
    ps->sets = NULL;
    ps->ranges = NULL;

    /* Nullable rules, to a fixed point. */
    bool *nullable = sb_calloc((size_t)g->n_rules, sizeof(bool));
    if (!nullable)
        return sb_fail(err, SB_ERR_NOMEM, "grammar: out of memory");
    for (bool changed = true; changed;) {
        changed = false;
        for (int32_t r = 0; r < g->n_rules; r++) {
            if (nullable[r])
                continue;
            for (int32_t k = 0; k < g->rules[r].n_alts && !nullable[r]; k++) {
                int32_t p = g->alt_start[g->rules[r].first_alt + k];
                while (g->elems[p].kind == E_RULE && nullable[g->elems[p].arg])
                    p++;
                if (g->elems[p].kind == E_END)
                    nullable[r] = changed = true;
            }
        }
    }
    int32_t lr = left_recursive(g, nullable);
    sb_free(nullable);
    if (lr == -2)
        return sb_fail(err, SB_ERR_NOMEM, "grammar: out of memory");
    if (lr >= 0) {
        /* Name the rule, or the named rule an anonymous one was written in. */
        const prule *pr = &ps->rules[lr];
        if (pr->name) {
            char what[160];
            snprintf(what, sizeof what, "the rule '%.*s' is left-recursive (it can start with itself)",
                     (int)SB_MIN(pr->name_len, 100), pr->name);
            fail_at(ps, pr->ref_at, what);
            return ps->st;
        }
        return sb_fail(err, SB_ERR_INVALID_ARG,
                       "grammar: a group or repetition is left-recursive (it can start with itself: a repeated "
                       "symbol that can be empty?)");
    }
    return SB_OK;
}

static sb_status parse_grammar(const char *text, size_t len, sb_grammar *g, sb_error *err) {
    parser ps = {.src = text, .len = len, .err = err, .st = SB_OK};
    skip_space(&ps, true);
    while (ps.pos < ps.len && ps.st == SB_OK) {
        if (!parse_rule(&ps))
            break;
        skip_space(&ps, true);
    }
    sb_status st = ps.st == SB_OK ? compile(&ps, g, err) : ps.st;
    parser_free(&ps);
    return st;
}

/* ---- the DFA -------------------------------------------------------------- */

static void dfa_free(dfa *d) {
    for (int32_t i = 0; i < d->n_states; i++) {
        sb_free(d->states[i].trans);
        sb_free(d->states[i].mask);
    }
    sb_free(d->states);
    sb_free(d->table);
    sb_free(d->keys);
    memset(d, 0, sizeof *d);
}

/* The state of (stacks, pt), added if new; -1 dead (no stacks), -3 out of memory. */
static int32_t dfa_intern(dfa *d, const sset *s, partial pt) {
    if (s->count == 0)
        return -1;
    uint32_t head[2] = {pt.value, pt.remaining};
    uint32_t h = hash_ints((const int32_t *)head, 2, 2166136261u);
    h = hash_ints(s->v, s->n, h);
    size_t key_len = s->n + 2;
    if (d->table) {
        for (uint32_t i = h & d->table_mask;; i = (i + 1) & d->table_mask) {
            int32_t id = d->table[i];
            if (id < 0)
                break;
            const dstate *st = &d->states[id];
            const int32_t *k = d->keys + st->key_off;
            if (st->hash == h && st->key_len == key_len && (uint32_t)k[0] == pt.value &&
                (uint32_t)k[1] == pt.remaining && memcmp(k + 2, s->v, s->n * sizeof(int32_t)) == 0)
                return id;
        }
    }
    /* Add: keep the table at most half full. */
    if ((size_t)(d->n_states + 1) * 2 > (size_t)(d->table ? d->table_mask + 1 : 0)) {
        uint32_t size = d->table ? (d->table_mask + 1) * 2 : 1024;
        int32_t *t = sb_malloc(size * sizeof(int32_t));
        if (!t)
            return -3;
        memset(t, 0xff, size * sizeof(int32_t));
        for (int32_t id = 0; id < d->n_states; id++) {
            uint32_t i = d->states[id].hash & (size - 1);
            while (t[i] >= 0)
                i = (i + 1) & (size - 1);
            t[i] = id;
        }
        sb_free(d->table);
        d->table = t;
        d->table_mask = size - 1;
        d->bytes += size * sizeof(int32_t) / 2;
    }
    size_t cap_states = (size_t)d->cap_states;
    if (!grow((void **)&d->states, &cap_states, (size_t)d->n_states + 1, sizeof(dstate)) ||
        !grow((void **)&d->keys, &d->cap_keys, d->n_keys + key_len, sizeof(int32_t)))
        return -3;
    d->cap_states = (int32_t)cap_states;
    int32_t id = d->n_states++;
    d->states[id] = (dstate){.hash = h, .key_off = (uint32_t)d->n_keys, .key_len = (uint32_t)key_len,
                             .mask_kind = -1, .accepting = pt.remaining == 0 && sset_accepting(s)};
    d->keys[d->n_keys] = (int32_t)pt.value;
    d->keys[d->n_keys + 1] = (int32_t)pt.remaining;
    memcpy(d->keys + d->n_keys + 2, s->v, s->n * sizeof(int32_t));
    d->n_keys += key_len;
    d->bytes += sizeof(dstate) + key_len * sizeof(int32_t);
    uint32_t i = h & d->table_mask;
    while (d->table[i] >= 0)
        i = (i + 1) & d->table_mask;
    d->table[i] = id;
    return id;
}

/* The state's stacks into s and its incomplete character. */
static bool dfa_load(const dfa *d, int32_t id, sset *s, partial *pt) {
    const dstate *st = &d->states[id];
    const int32_t *k = d->keys + st->key_off;
    *pt = (partial){(uint32_t)k[0], (uint32_t)k[1]};
    size_t n = st->key_len - 2;
    if (!grow((void **)&s->v, &s->cap, n, sizeof(int32_t)))
        return false;
    memcpy(s->v, k + 2, n * sizeof(int32_t));
    s->n = n;
    s->count = 0;
    for (size_t i = 0; i < n; i += 2 + (size_t)s->v[i])
        s->count++;
    return true;
}

/* The state after byte b from state id: a state, -1 dead, -3 out of memory. */
static int32_t dfa_next(const sb_grammar *g, dfa *d, int32_t id, uint8_t b, scratch *sc) {
    if (!d->states[id].trans) {
        int32_t *t = sb_malloc(256 * sizeof(int32_t));
        if (!t)
            return -3;
        for (int i = 0; i < 256; i++)
            t[i] = -2;
        d->states[id].trans = t;
        d->bytes += 256 * sizeof(int32_t);
    }
    int32_t next = d->states[id].trans[b];
    if (next != -2)
        return next;
    partial pt;
    if (!dfa_load(d, id, &sc->a, &pt))
        return -3;
    sc->oom = false;
    sc->a.oom = sc->b.oom = false;
    int r = step_byte(g, &sc->a, &pt, b, sc, &sc->b);
    if (sc->oom || sc->b.oom)
        return -3;
    next = r < 0 ? -1 : dfa_intern(d, r > 0 ? &sc->b : &sc->a, pt);
    if (next == -3)
        return -3;
    d->states[id].trans[b] = next;
    return next;
}

/* ---- masks ---------------------------------------------------------------- */

/* Walks the trie from DFA state `start` and sets the bits of the tokens
 * whose bytes it can take (bits cleared first). False if out of memory. */
static bool walk(sb_grammar *g, int32_t start, scratch *sc, int32_t *at_depth, uint32_t *bits) {
    const sb_grammar_vocab *v = g->vocab;
    memset(bits, 0, (size_t)v->n_words * sizeof(uint32_t));
    at_depth[0] = start;
    for (int32_t i = 1; i < v->n_nodes;) {
        int32_t s = dfa_next(g, &g->dfa, at_depth[v->depth[i] - 1], v->byte[i], sc);
        if (s == -3)
            return false;
        if (s < 0) {
            i += v->size[i];
            continue;
        }
        for (int32_t k = 0; k < v->tok_n[i]; k++) {
            int32_t t = v->toks[v->tok_first[i] + k];
            bits[t >> 5] |= 1u << (t & 31);
        }
        at_depth[v->depth[i]] = s;
        i++;
    }
    return true;
}

/* Keeps a walk's bits with the state, in the smallest form. */
static bool store_mask(sb_grammar *g, int32_t id, const uint32_t *bits) {
    const sb_grammar_vocab *v = g->vocab;
    int32_t n_on = 0;
    for (int32_t w = 0; w < v->n_words; w++)
        n_on += __builtin_popcount(bits[w]);
    int32_t n_off = v->n_vocab - n_on;
    int32_t kind = MASK_BITS, n = v->n_words;
    if (n_on <= n && n_on <= n_off)
        kind = MASK_ALLOWED, n = n_on;
    else if (n_off <= n)
        kind = MASK_REFUSED, n = n_off;
    uint32_t *m = sb_malloc((size_t)SB_MAX(n, 1) * sizeof(uint32_t));
    if (!m)
        return false;
    if (kind == MASK_BITS) {
        memcpy(m, bits, (size_t)n * sizeof(uint32_t));
    } else {
        int32_t j = 0;
        for (int32_t t = 0; t < v->n_vocab; t++)
            if ((bits[t >> 5] >> (t & 31) & 1) == (kind == MASK_ALLOWED))
                m[j++] = (uint32_t)t;
    }
    dstate *st = &g->dfa.states[id];
    st->mask = m;
    st->mask_kind = kind;
    st->mask_n = n;
    g->dfa.bytes += (size_t)n * sizeof(uint32_t);
    return true;
}

static void load_mask(const sb_grammar_vocab *v, const dstate *st, uint32_t *out) {
    if (st->mask_kind == MASK_BITS) {
        memcpy(out, st->mask, (size_t)v->n_words * sizeof(uint32_t));
        return;
    }
    bool refused = st->mask_kind == MASK_REFUSED;
    memset(out, refused ? 0xff : 0, (size_t)v->n_words * sizeof(uint32_t));
    if (refused && (v->n_vocab & 31))
        out[v->n_words - 1] = (1u << (v->n_vocab & 31)) - 1;
    for (int32_t i = 0; i < st->mask_n; i++) {
        uint32_t t = st->mask[i];
        if (refused)
            out[t >> 5] &= ~(1u << (t & 31));
        else
            out[t >> 5] |= 1u << (t & 31);
    }
    if (refused) /* end-of-generation tokens are not in the trie: never "allowed" by a walk */
        for (int32_t w = 0; w < v->n_words; w++)
            out[w] &= ~v->eog[w];
}

/* ---- vocabulary ----------------------------------------------------------- */

typedef struct {
    const char *bytes;
    uint32_t len;
    int32_t id;
} tokbytes;

static int cmp_tokbytes(const void *pa, const void *pb) {
    const tokbytes *a = pa, *b = pb;
    int c = memcmp(a->bytes, b->bytes, SB_MIN(a->len, b->len));
    if (c)
        return c;
    if (a->len != b->len)
        return a->len < b->len ? -1 : 1;
    return a->id < b->id ? -1 : 1;
}

/* Builds the subtree of the tokens [lo, hi) sharing their first d bytes,
 * whose node is `node`; returns the next free node. */
static int32_t build_trie(sb_grammar_vocab *v, const tokbytes *tb, int32_t lo, int32_t hi, int32_t d, int32_t node,
                          int32_t *n_toks) {
    v->tok_first[node] = *n_toks;
    while (lo < hi && (int32_t)tb[lo].len == d)
        v->toks[(*n_toks)++] = tb[lo++].id;
    v->tok_n[node] = *n_toks - v->tok_first[node];
    int32_t next = node + 1;
    while (lo < hi) {
        uint8_t b = (uint8_t)tb[lo].bytes[d];
        int32_t end = lo;
        while (end < hi && (uint8_t)tb[end].bytes[d] == b)
            end++;
        v->byte[next] = b;
        v->depth[next] = (uint16_t)(d + 1);
        next = build_trie(v, tb, lo, end, d + 1, next, n_toks);
        lo = end;
    }
    v->size[node] = next - node;
    return next;
}

sb_status sb_grammar_vocab_create(const sb_model_t *model, sb_grammar_vocab **out, sb_error *err) {
    *out = NULL;
    const sb_vocab *sv = model->vocab;
    sb_grammar_vocab *v = sb_calloc(1, sizeof *v);
    if (!v)
        return sb_fail(err, SB_ERR_NOMEM, "grammar: out of memory");
    v->model = model;
    v->n_vocab = sb_model_n_vocab(model);
    v->n_words = (v->n_vocab + 31) / 32;
    pthread_mutex_init(&v->lock, NULL);
    int32_t n_tok = SB_MIN(sv->n_tokens, v->n_vocab);
    tokbytes *tb = sb_malloc((size_t)SB_MAX(n_tok, 1) * sizeof *tb);
    v->eog = sb_calloc((size_t)v->n_words, sizeof(uint32_t));
    if (!tb || !v->eog) {
        sb_free(tb);
        sb_grammar_vocab_free(v);
        return sb_fail(err, SB_ERR_NOMEM, "grammar: out of memory for the vocabulary");
    }
    /* Text tokens only: control tokens never match a grammar; end markers
     * are allowed separately, where the grammar accepts. */
    int32_t n = 0;
    size_t total = 0;
    for (int32_t t = 0; t < n_tok; t++) {
        const sb_vocab_token *tk = &sv->tokens[t];
        if (sb_vocab_is_eog(sv, t)) {
            v->eog[t >> 5] |= 1u << (t & 31);
            continue;
        }
        if (!(tk->attr & (SB_TOKEN_NORMAL | SB_TOKEN_BYTE | SB_TOKEN_USER_DEFINED)) || tk->piece_len == 0 ||
            tk->piece_len > 65535)
            continue;
        tb[n++] = (tokbytes){sv->pieces + tk->piece_off, tk->piece_len, t};
        total += tk->piece_len;
        v->max_depth = SB_MAX(v->max_depth, (int32_t)tk->piece_len);
    }
    qsort(tb, (size_t)n, sizeof *tb, cmp_tokbytes);
    size_t cap = total + 1;
    v->byte = sb_malloc(cap);
    v->depth = sb_malloc(cap * sizeof(uint16_t));
    v->size = sb_malloc(cap * sizeof(int32_t));
    v->tok_first = sb_malloc(cap * sizeof(int32_t));
    v->tok_n = sb_malloc(cap * sizeof(int32_t));
    v->toks = sb_malloc((size_t)SB_MAX(n, 1) * sizeof(int32_t));
    if (!v->byte || !v->depth || !v->size || !v->tok_first || !v->tok_n || !v->toks) {
        sb_free(tb);
        sb_grammar_vocab_free(v);
        return sb_fail(err, SB_ERR_NOMEM, "grammar: out of memory for the vocabulary's trie");
    }
    int32_t n_toks = 0;
    v->byte[0] = 0;
    v->depth[0] = 0;
    v->n_nodes = build_trie(v, tb, 0, n, 0, 0, &n_toks);
    sb_free(tb);
    *out = v;
    return SB_OK;
}

void sb_grammar_vocab_free(sb_grammar_vocab *v) {
    if (!v)
        return;
    for (int i = 0; i < VOCAB_CACHE; i++)
        if (v->cache[i]) {
            v->cache[i]->vocab = NULL; /* the cache's reference: the grammar no longer makes masks */
            sb_grammar_unref(v->cache[i]);
        }
    sb_free(v->byte);
    sb_free(v->depth);
    sb_free(v->size);
    sb_free(v->tok_first);
    sb_free(v->tok_n);
    sb_free(v->toks);
    sb_free(v->eog);
    pthread_mutex_destroy(&v->lock);
    sb_free(v);
}

/* ---- grammars ------------------------------------------------------------- */

static void grammar_free(sb_grammar *g) {
    sb_free(g->elems);
    sb_free(g->alt_start);
    sb_free(g->rules);
    sb_free(g->sets);
    sb_free(g->ranges);
    sb_free(g->text);
    dfa_free(&g->dfa);
    pthread_mutex_destroy(&g->lock);
    sb_free(g);
}

/* Looks text up in the vocabulary's cache (a new reference), or NULL. */
static sb_grammar *cache_find(sb_grammar_vocab *v, const char *text, size_t len) {
    sb_grammar *found = NULL;
    pthread_mutex_lock(&v->lock);
    for (int i = 0; i < VOCAB_CACHE && !found; i++)
        if (v->cache[i] && v->cache[i]->text_len == len && memcmp(v->cache[i]->text, text, len) == 0) {
            found = sb_grammar_ref(v->cache[i]);
            v->used[i] = ++v->clock;
        }
    pthread_mutex_unlock(&v->lock);
    return found;
}

/* Keeps g in the cache, in place of the least recently used. */
static void cache_put(sb_grammar_vocab *v, sb_grammar *g) {
    pthread_mutex_lock(&v->lock);
    int victim = 0;
    for (int i = 0; i < VOCAB_CACHE; i++)
        if (!v->cache[i] || v->used[i] < v->used[victim]) {
            victim = i;
            if (!v->cache[i])
                break;
        }
    sb_grammar *old = v->cache[victim];
    v->cache[victim] = sb_grammar_ref(g);
    v->used[victim] = ++v->clock;
    pthread_mutex_unlock(&v->lock);
    sb_grammar_unref(old);
}

sb_status sb_grammar_create(sb_grammar_vocab *vocab, const char *text, size_t len, sb_grammar **out, sb_error *err) {
    *out = NULL;
    if (vocab && (*out = cache_find(vocab, text, len)))
        return SB_OK;
    sb_grammar *g = sb_calloc(1, sizeof *g);
    if (!g)
        return sb_fail(err, SB_ERR_NOMEM, "grammar: out of memory");
    atomic_init(&g->refs, 1);
    pthread_mutex_init(&g->lock, NULL);
    g->text = sb_strndup(text, len);
    g->text_len = len;
    sb_status st = g->text ? parse_grammar(text, len, g, err) : sb_fail(err, SB_ERR_NOMEM, "grammar: out of memory");
    if (st != SB_OK) {
        grammar_free(g);
        return st;
    }
    g->vocab = vocab;
    if (vocab)
        cache_put(vocab, g);
    *out = g;
    return SB_OK;
}

sb_grammar *sb_grammar_ref(sb_grammar *g) {
    if (g)
        atomic_fetch_add(&g->refs, 1);
    return g;
}

void sb_grammar_unref(sb_grammar *g) {
    if (g && atomic_fetch_sub(&g->refs, 1) == 1)
        grammar_free(g);
}

int32_t sb_grammar_n_rules(const sb_grammar *g) { return g->n_rules; }

/* ---- matchers ------------------------------------------------------------- */

static void scratch_free(scratch *sc) {
    sb_free(sc->a.v);
    sb_free(sc->b.v);
    sb_free(sc->todo);
}

sb_status sb_grammar_matcher_create(sb_grammar *g, sb_grammar_matcher **out, sb_error *err) {
    *out = NULL;
    sb_grammar_matcher *m = sb_calloc(1, sizeof *m);
    if (!m)
        return sb_fail(err, SB_ERR_NOMEM, "grammar: out of memory");
    m->g = sb_grammar_ref(g);
    if (g->vocab) {
        m->mask = sb_malloc((size_t)g->vocab->n_words * sizeof(uint32_t));
        m->walk = sb_malloc(((size_t)g->vocab->max_depth + 1) * sizeof(int32_t));
    }
    const rule *root = &g->rules[g->root];
    for (int32_t a = 0; a < root->n_alts; a++)
        push_todo(&m->s, NULL, 0, g->alt_start[root->first_alt + a]);
    expand_todo(g, &m->s, &m->cur);
    if ((g->vocab && (!m->mask || !m->walk)) || m->s.oom || m->cur.oom) {
        sb_grammar_matcher_free(m);
        return sb_fail(err, SB_ERR_NOMEM, "grammar: out of memory");
    }
    *out = m;
    return SB_OK;
}

void sb_grammar_matcher_free(sb_grammar_matcher *m) {
    if (!m)
        return;
    sb_free(m->cur.v);
    scratch_free(&m->s);
    sb_free(m->mask);
    sb_free(m->walk);
    sb_grammar_unref(m->g);
    sb_free(m);
}

bool sb_grammar_matcher_accepting(const sb_grammar_matcher *m) {
    return m->part.remaining == 0 && sset_accepting(&m->cur);
}

/* Runs text from the current state; with commit, the matcher moves there. */
static bool run_text(sb_grammar_matcher *m, const char *text, size_t len, bool commit) {
    scratch *sc = &m->s;
    sset x = {0}, y = {0};
    if (!sset_copy(&x, &m->cur)) {
        sb_free(x.v);
        return false;
    }
    partial pt = m->part;
    bool ok = true;
    for (size_t i = 0; i < len && ok; i++) {
        int r = step_byte(m->g, &x, &pt, (uint8_t)text[i], sc, &y);
        ok = r >= 0 && !sc->oom && !y.oom;
        if (r > 0) {
            sset t = x;
            x = y;
            y = t;
        }
    }
    if (ok && commit) {
        sset t = m->cur;
        m->cur = x;
        x = t;
        m->part = pt;
    }
    sc->oom = false;
    sb_free(x.v);
    sb_free(y.v);
    return ok;
}

bool sb_grammar_matcher_accept_text(sb_grammar_matcher *m, const char *text, size_t len) {
    return run_text(m, text, len, true);
}

bool sb_grammar_matcher_can_take(sb_grammar_matcher *m, const char *text, size_t len) {
    return run_text(m, text, len, false);
}

bool sb_grammar_matcher_accept_token(sb_grammar_matcher *m, int32_t token) {
    const sb_grammar_vocab *v = m->g->vocab;
    if (!v || token < 0 || token >= v->n_vocab)
        return false;
    if (v->eog[token >> 5] >> (token & 31) & 1)
        return sb_grammar_matcher_accepting(m);
    const sb_vocab *sv = v->model->vocab;
    if (token >= sv->n_tokens)
        return false;
    const sb_vocab_token *tk = &sv->tokens[token];
    if (!(tk->attr & (SB_TOKEN_NORMAL | SB_TOKEN_BYTE | SB_TOKEN_USER_DEFINED)) || tk->piece_len == 0)
        return false;
    return sb_grammar_matcher_accept_text(m, sv->pieces + tk->piece_off, tk->piece_len);
}

/* The current state's mask into m->mask, under the grammar's lock; false
 * if out of memory. */
static bool state_mask(sb_grammar_matcher *m) {
    sb_grammar *g = m->g;
    dfa *d = &g->dfa;
    if (d->bytes > DFA_CAP_BYTES)
        dfa_free(d);
    int32_t id = dfa_intern(d, &m->cur, m->part);
    if (id == -3)
        return false;
    if (id == -1) { /* no stacks at all: nothing continues */
        memset(m->mask, 0, (size_t)g->vocab->n_words * sizeof(uint32_t));
        return true;
    }
    if (d->states[id].mask_kind < 0) {
        if (!walk(g, id, &m->s, m->walk, m->mask) || !store_mask(g, id, m->mask))
            return false;
    } else {
        load_mask(g->vocab, &d->states[id], m->mask);
    }
    if (d->states[id].accepting)
        for (int32_t w = 0; w < g->vocab->n_words; w++)
            m->mask[w] |= g->vocab->eog[w];
    return true;
}

const uint32_t *sb_grammar_matcher_mask(sb_grammar_matcher *m) {
    const sb_grammar_vocab *v = m->g->vocab;
    pthread_mutex_lock(&m->g->lock);
    bool ok = state_mask(m);
    if (!ok) { /* out of memory: drop the DFA and try once from nothing */
        dfa_free(&m->g->dfa);
        ok = state_mask(m);
    }
    pthread_mutex_unlock(&m->g->lock);
    uint32_t any = 0;
    for (int32_t w = 0; ok && w < v->n_words; w++)
        any |= m->mask[w];
    if (!ok || !any) /* nothing can continue: let generation end */
        memcpy(m->mask, v->eog, (size_t)v->n_words * sizeof(uint32_t));
    return m->mask;
}
