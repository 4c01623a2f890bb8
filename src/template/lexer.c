/*
 * lexer.c - Jinja source to tokens, following Jinja2's lexer rule for rule:
 * template text is cut at {{ {% {#; `-` on a tag strips all whitespace on
 * that side; with lstrip_blocks the spaces before a block or comment tag on
 * its own line go; with trim_blocks the newline after a block or comment tag
 * goes; `+` turns both off. Inside tags: names, numbers, string literals with
 * Python escapes, and operators, with }} and %} ignored inside brackets.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "template/template-impl.h"

typedef struct lexer {
    const char *s;
    size_t len, pos;
    bool line_starting; /* the previous tag end ended with a newline (or at start) */
    sb_tpl_token *toks;
    size_t n, cap;
    char stack[SB_TPL_MAX_SYNTAX_DEPTH]; /* expected closing brackets */
    size_t depth;
    sb_error *err;
} lexer;

void sb_tpl_position(const char *src, size_t off, int *line, int *col) {
    *line = 1;
    *col = 1;
    for (size_t i = 0; i < off; i++) {
        if (src[i] == '\n') {
            ++*line;
            *col = 1;
        } else if (((unsigned char)src[i] & 0xc0) != 0x80) {
            ++*col;
        }
    }
}

static sb_status lex_fail(lexer *lx, size_t off, sb_status st, const char *msg, const char *arg) {
    int line, col;
    sb_tpl_position(lx->s, off, &line, &col);
    return sb_fail(lx->err, st, "template:%d:%d: %s%s", line, col, msg, arg ? arg : "");
}

static sb_status emit(lexer *lx, sb_tpl_tok type, size_t off, size_t len, sb_tpl_val val) {
    if (lx->n == lx->cap) {
        size_t cap = lx->cap ? lx->cap * 2 : 64;
        sb_tpl_token *t = sb_realloc(lx->toks, cap * sizeof(*t));
        if (!t) {
            sb_tpl_release(val);
            return SB_ERR_NOMEM;
        }
        lx->toks = t;
        lx->cap = cap;
    }
    lx->toks[lx->n++] = (sb_tpl_token){.type = type, .off = (uint32_t)off, .len = (uint32_t)len, .val = val};
    return SB_OK;
}

static sb_status emit_data(lexer *lx, size_t start, size_t end) {
    if (end <= start)
        return SB_OK;
    sb_tpl_val v;
    sb_status st = sb_tpl_str_new(lx->s + start, end - start, &v);
    return st ? st : emit(lx, SB_TPL_TK_DATA, start, end - start, v);
}

/* Python whitespace (str.isspace) starting at pos: its length in bytes, 0 if none. */
static size_t space_at(const char *s, size_t len, size_t pos) {
    if (pos >= len)
        return 0;
    size_t p = pos;
    uint32_t c = sb_tpl_utf8_next(s, len, &p);
    return sb_tpl_is_space(c) ? p - pos : 0;
}

static size_t skip_spaces(const char *s, size_t len, size_t pos) {
    size_t n;
    while ((n = space_at(s, len, pos)))
        pos += n;
    return pos;
}

/* End of text[start..end) once trailing whitespace is removed (str.rstrip). */
static size_t rstrip_end(const char *s, size_t start, size_t end) {
    while (end > start) {
        size_t p = end - 1;
        while (p > start && ((unsigned char)s[p] & 0xc0) == 0x80)
            p--;
        size_t q = p;
        if (!sb_tpl_is_space(sb_tpl_utf8_next(s, end, &q)) || q != end)
            break;
        end = p;
    }
    return end;
}

/* Jinja's OptionalLStrip: the text before a tag whose sign is `sign`
 * ('-', '+' or 0), for a block/comment tag (lstrip applies) or not. */
static size_t data_end(lexer *lx, size_t start, size_t end, char sign, bool lstrip) {
    if (sign == '-')
        return rstrip_end(lx->s, start, end);
    if (sign == '+' || !lstrip)
        return end;
    size_t l_pos = end;
    while (l_pos > start && lx->s[l_pos - 1] != '\n')
        l_pos--;
    if (l_pos == start && !lx->line_starting)
        return end;
    if (l_pos < end && skip_spaces(lx->s, end, l_pos) == end)
        return l_pos;
    return end;
}

static bool starts(const lexer *lx, size_t pos, const char *lit) {
    size_t n = strlen(lit);
    return pos <= lx->len && lx->len - pos >= n && memcmp(lx->s + pos, lit, n) == 0;
}

/* After a block or comment end: `-` eats all whitespace, plain eats one
 * newline (trim_blocks), `+` nothing. Sets line_starting. */
static void after_tag_end(lexer *lx, char sign, bool trim) {
    size_t start = lx->pos;
    if (sign == '-')
        lx->pos = skip_spaces(lx->s, lx->len, lx->pos);
    else if (sign != '+' && trim && lx->pos < lx->len && lx->s[lx->pos] == '\n')
        lx->pos++;
    lx->line_starting = lx->pos > start && lx->s[lx->pos - 1] == '\n';
}

/* ---- literals ---------------------------------------------------------------- */

static int hex_digit(char c) {
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

/* Decodes a string literal's body (Python unicode-escape). */
static sb_status decode_string(lexer *lx, size_t start, size_t end, sb_tpl_val *out) {
    sb_tpl_buf b = {0};
    sb_status st = SB_OK;
    for (size_t i = start; i < end && !st;) {
        char c = lx->s[i];
        if (c != '\\' || i + 1 >= end) {
            st = sb_tpl_buf_put(&b, &c, 1);
            i++;
            continue;
        }
        char e = lx->s[i + 1];
        const char *simple = strchr("\\'\"abfnrtv", e);
        if (e == '\n') {
            i += 2; /* line continuation */
        } else if (simple && e) {
            static const char map[] = "\\'\"\a\b\f\n\r\t\v";
            st = sb_tpl_buf_put(&b, &map[simple - "\\'\"abfnrtv"], 1);
            i += 2;
        } else if (e >= '0' && e <= '7') {
            uint32_t v = 0;
            size_t j = i + 1;
            for (int k = 0; k < 3 && j < end && lx->s[j] >= '0' && lx->s[j] <= '7'; k++, j++)
                v = v * 8 + (uint32_t)(lx->s[j] - '0');
            char enc[4];
            st = sb_tpl_buf_put(&b, enc, sb_tpl_utf8_put(v, enc));
            i = j;
        } else if (e == 'x' || e == 'u' || e == 'U') {
            int digits = e == 'x' ? 2 : e == 'u' ? 4 : 8;
            uint32_t v = 0;
            for (int k = 0; k < digits; k++) {
                int d = i + 2 + (size_t)k < end ? hex_digit(lx->s[i + 2 + (size_t)k]) : -1;
                if (d < 0)
                    return sb_tpl_buf_free(&b), lex_fail(lx, i, SB_ERR_FORMAT, "truncated escape in string literal", NULL);
                v = v * 16 + (uint32_t)d;
            }
            if (v > 0x10ffff)
                return sb_tpl_buf_free(&b), lex_fail(lx, i, SB_ERR_FORMAT, "illegal Unicode character in string literal", NULL);
            char enc[4];
            st = sb_tpl_buf_put(&b, enc, sb_tpl_utf8_put(v, enc));
            i += 2 + (size_t)digits;
        } else if (e == 'N') {
            sb_tpl_buf_free(&b);
            return lex_fail(lx, i, SB_ERR_UNSUPPORTED, "\\N{...} escapes are not supported", NULL);
        } else {
            st = sb_tpl_buf_put(&b, lx->s + i, 2); /* unknown escapes stay as written */
            i += 2;
        }
    }
    if (!st)
        st = sb_tpl_buf_take(&b, out);
    sb_tpl_buf_free(&b);
    return st;
}

static bool is_digit(char c) { return c >= '0' && c <= '9'; }
static bool is_name_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }

/* Digits with single underscores between them: end of the run, or pos if none. */
static size_t digits_end(const lexer *lx, size_t pos) {
    if (pos >= lx->len || !is_digit(lx->s[pos]))
        return pos;
    size_t p = pos + 1;
    while (p < lx->len) {
        if (is_digit(lx->s[p]))
            p++;
        else if (lx->s[p] == '_' && p + 1 < lx->len && is_digit(lx->s[p + 1]))
            p += 2;
        else
            break;
    }
    return p;
}

/* A number literal at lx->pos (float_re, then integer_re). */
static sb_status lex_number(lexer *lx) {
    size_t start = lx->pos, p = digits_end(lx, start);
    bool is_float = false;
    size_t q = p;
    if (q < lx->len && lx->s[q] == '.' && digits_end(lx, q + 1) > q + 1) {
        q = digits_end(lx, q + 1);
        is_float = true;
    }
    if (q < lx->len && (lx->s[q] == 'e' || lx->s[q] == 'E')) {
        size_t r = q + 1;
        if (r < lx->len && (lx->s[r] == '+' || lx->s[r] == '-'))
            r++;
        if (digits_end(lx, r) > r) {
            q = digits_end(lx, r);
            is_float = true;
        }
    }
    if (start > 0 && lx->s[start - 1] == '.')
        is_float = false; /* float_re's (?<!\.) */
    size_t end = is_float ? q : p;
    char tmp[64];
    size_t n = 0;
    for (size_t i = start; i < end && n + 1 < sizeof(tmp); i++)
        if (lx->s[i] != '_')
            tmp[n++] = lx->s[i];
    tmp[n] = '\0';
    if (end - start >= sizeof(tmp) - 1)
        return lex_fail(lx, start, SB_ERR_FORMAT, "number literal too long", NULL);
    lx->pos = end;
    if (is_float)
        return emit(lx, SB_TPL_TK_FLOAT, start, end - start, sb_tpl_float(strtod(tmp, NULL)));
    /* 0x / 0o / 0b prefixes */
    int base = 10;
    if (lx->s[start] == '0' && start + 1 < lx->len && lx->s[start + 1] && strchr("xXoObB", lx->s[start + 1])) {
        base = (lx->s[start + 1] | 0x20) == 'x' ? 16 : (lx->s[start + 1] | 0x20) == 'o' ? 8 : 2;
        end = start + 2;
        while (end < lx->len && (hex_digit(lx->s[end]) >= 0 || lx->s[end] == '_'))
            end++;
        n = 0;
        for (size_t i = start + 2; i < end && n + 1 < sizeof(tmp); i++)
            if (lx->s[i] != '_')
                tmp[n++] = lx->s[i];
        tmp[n] = '\0';
        lx->pos = end;
    } else if (tmp[0] == '0' && n > 1 && strspn(tmp, "0") != n) {
        return lex_fail(lx, start, SB_ERR_FORMAT, "leading zeros in a decimal integer literal", NULL);
    }
    char *stop;
    errno = 0;
    long long v = strtoll(tmp, &stop, base);
    if (errno || *stop || !tmp[0])
        return lex_fail(lx, start, SB_ERR_FORMAT, "invalid integer literal", NULL);
    return emit(lx, SB_TPL_TK_INT, start, end - start, sb_tpl_int(v));
}

/* ---- tags --------------------------------------------------------------------- */

static const char *const operators[] = {"//", "**", "==", "!=", ">=", "<=", "+", "-", "/", "*", "%", "~", "[", "]",
                                        "(",  ")",  "{",  "}",  ">",  "<",  "=", ".", ":", "|", ",", ";"};

/* Tokens inside {{ }} (var) or {% %} until the end tag. */
static sb_status lex_tag(lexer *lx, bool var, size_t tag_off) {
    sb_status st;
    lx->depth = 0;
    for (;;) {
        if (lx->pos >= lx->len)
            return lex_fail(lx, tag_off, SB_ERR_FORMAT, var ? "'{{' is never closed by '}}'" : "'{%' is never closed by '%}'",
                            NULL);
        size_t p = lx->pos;
        if (lx->depth == 0) {
            const char *close = var ? "}}" : "%}";
            char sign = 0;
            bool end = false;
            if (!var && starts(lx, p, "+%}"))
                sign = '+', end = true;
            else if ((var && starts(lx, p, "-}}")) || (!var && starts(lx, p, "-%}")))
                sign = '-', end = true;
            else if (starts(lx, p, close))
                end = true;
            if (end) {
                lx->pos = p + 2 + (sign ? 1 : 0);
                if ((st = emit(lx, var ? SB_TPL_TK_VAR_END : SB_TPL_TK_BLOCK_END, p, lx->pos - p, sb_tpl_none())))
                    return st;
                after_tag_end(lx, sign, !var);
                return SB_OK;
            }
        }
        size_t sp = space_at(lx->s, lx->len, p);
        if (sp) {
            lx->pos = skip_spaces(lx->s, lx->len, p);
            continue;
        }
        char c = lx->s[p];
        if (is_digit(c)) {
            if ((st = lex_number(lx)))
                return st;
            continue;
        }
        if (is_name_start(c)) {
            size_t q = p + 1;
            while (q < lx->len && (is_name_start(lx->s[q]) || is_digit(lx->s[q])))
                q++;
            lx->pos = q;
            if ((st = emit(lx, SB_TPL_TK_NAME, p, q - p, sb_tpl_none())))
                return st;
            continue;
        }
        if (c == '\'' || c == '"') {
            size_t q = p + 1;
            while (q < lx->len && lx->s[q] != c)
                q += lx->s[q] == '\\' ? 2 : 1;
            if (q >= lx->len)
                return lex_fail(lx, p, SB_ERR_FORMAT, "unterminated string literal", NULL);
            sb_tpl_val v;
            if ((st = decode_string(lx, p + 1, q, &v)))
                return st;
            lx->pos = q + 1;
            if ((st = emit(lx, SB_TPL_TK_STRING, p, q + 1 - p, v)))
                return st;
            continue;
        }
        const char *op = NULL;
        for (size_t i = 0; i < SB_ARRAY_LEN(operators) && !op; i++)
            if (starts(lx, p, operators[i]))
                op = operators[i];
        if (!op) {
            char what[8] = {0};
            size_t q = p;
            sb_tpl_utf8_next(lx->s, lx->len, &q);
            memcpy(what, lx->s + p, SB_MIN(q - p, sizeof(what) - 2));
            return lex_fail(lx, p, SB_ERR_FORMAT, "unexpected character ", what);
        }
        if (strchr("([{", op[0])) {
            if (lx->depth == SB_TPL_MAX_SYNTAX_DEPTH)
                return lex_fail(lx, p, SB_ERR_UNSUPPORTED, "brackets nested too deeply", NULL);
            lx->stack[lx->depth++] = op[0] == '(' ? ')' : op[0] == '[' ? ']' : '}';
        } else if (strchr(")]}", op[0])) {
            if (lx->depth == 0 || lx->stack[lx->depth - 1] != op[0])
                return lex_fail(lx, p, SB_ERR_FORMAT, "unexpected ", op);
            lx->depth--;
        }
        lx->pos = p + strlen(op);
        if ((st = emit(lx, SB_TPL_TK_OP, p, strlen(op), sb_tpl_none())))
            return st;
    }
}

/* Comment body up to #} (with its sign). */
static sb_status lex_comment(lexer *lx, size_t tag_off) {
    for (size_t p = lx->pos; p < lx->len; p++) {
        char sign = 0;
        if ((lx->s[p] == '-' || lx->s[p] == '+') && starts(lx, p + 1, "#}"))
            sign = lx->s[p];
        else if (!starts(lx, p, "#}"))
            continue;
        lx->pos = p + 2 + (sign ? 1 : 0);
        after_tag_end(lx, sign, true);
        return SB_OK;
    }
    return lex_fail(lx, tag_off, SB_ERR_FORMAT, "missing end of comment tag", NULL);
}

/* `{%[-+]? raw [-]?%}` at p: its end offset (and the sign), or 0. */
static size_t raw_begin(const lexer *lx, size_t p, const char *word, char *close_sign) {
    size_t q = p + 2;
    if (q < lx->len && (lx->s[q] == '-' || lx->s[q] == '+'))
        q++;
    q = skip_spaces(lx->s, lx->len, q);
    if (!starts(lx, q, word))
        return 0;
    q = skip_spaces(lx->s, lx->len, q + strlen(word));
    *close_sign = 0;
    if (q < lx->len && (lx->s[q] == '-' || lx->s[q] == '+')) {
        *close_sign = lx->s[q];
        q++;
    }
    return starts(lx, q, "%}") ? q + 2 : 0;
}

static sb_status lex_raw(lexer *lx, size_t tag_off) {
    for (size_t p = lx->pos; p + 1 < lx->len; p++) {
        char sign;
        size_t end;
        if (!starts(lx, p, "{%") || !(end = raw_begin(lx, p, "endraw", &sign)))
            continue;
        char open_sign = lx->s[p + 2] == '-' || lx->s[p + 2] == '+' ? lx->s[p + 2] : 0;
        sb_status st = emit_data(lx, lx->pos, data_end(lx, lx->pos, p, open_sign, true));
        if (st)
            return st;
        lx->pos = end;
        after_tag_end(lx, sign, true);
        return SB_OK;
    }
    return lex_fail(lx, tag_off, SB_ERR_FORMAT, "missing end of raw directive", NULL);
}

static sb_status lex_all(lexer *lx) {
    sb_status st;
    while (lx->pos < lx->len) {
        /* next tag start */
        size_t p = lx->pos;
        const char *hit = NULL;
        for (; p + 1 < lx->len; p++) {
            if (lx->s[p] == '{' && strchr("{%#", lx->s[p + 1]) && lx->s[p + 1]) {
                hit = lx->s + p;
                break;
            }
        }
        if (!hit)
            return emit_data(lx, lx->pos, lx->len);
        char kind = hit[1];
        char sign = p + 2 < lx->len && (hit[2] == '-' || hit[2] == '+') ? hit[2] : 0;
        char raw_sign;
        size_t raw_end = kind == '%' ? raw_begin(lx, p, "raw", &raw_sign) : 0;
        if ((st = emit_data(lx, lx->pos, data_end(lx, lx->pos, p, sign, kind != '{'))))
            return st;
        lx->pos = p + 2 + (sign ? 1 : 0);
        lx->line_starting = false;
        if (raw_end) {
            lx->pos = raw_end;
            if (raw_sign == '-')
                lx->pos = skip_spaces(lx->s, lx->len, lx->pos);
            if ((st = lex_raw(lx, p)))
                return st;
        } else if (kind == '#') {
            if ((st = lex_comment(lx, p)))
                return st;
        } else {
            bool var = kind == '{';
            if ((st = emit(lx, var ? SB_TPL_TK_VAR_BEGIN : SB_TPL_TK_BLOCK_BEGIN, p, lx->pos - p, sb_tpl_none())))
                return st;
            if ((st = lex_tag(lx, var, p)))
                return st;
        }
    }
    return SB_OK;
}

sb_status sb_tpl_lex(const char *src, size_t len, sb_tpl_token **out, size_t *n_out, sb_error *err) {
    lexer lx = {.s = src, .len = len, .line_starting = true, .err = err};
    sb_status st = lex_all(&lx);
    if (!st)
        st = emit(&lx, SB_TPL_TK_EOF, len, 0, sb_tpl_none());
    if (st) {
        if (st == SB_ERR_NOMEM)
            sb_fail(err, st, "template: out of memory");
        sb_tpl_tokens_free(lx.toks, lx.n);
        *out = NULL;
        *n_out = 0;
        return st;
    }
    *out = lx.toks;
    *n_out = lx.n;
    return SB_OK;
}

void sb_tpl_tokens_free(sb_tpl_token *toks, size_t n) {
    for (size_t i = 0; i < n; i++)
        sb_tpl_release(toks[i].val);
    sb_free(toks);
}
