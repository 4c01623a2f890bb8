/*
 * buf.c - growable byte string (see buf.h).
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "server/buf.h"

static bool reserve(sb_srv_buf *b, size_t extra) {
    if (b->failed)
        return false;
    if (b->len + extra + 1 <= b->cap)
        return true;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + extra + 1) {
        if (cap > SIZE_MAX / 2) {
            b->failed = true;
            return false;
        }
        cap *= 2;
    }
    char *p = sb_realloc(b->p, cap);
    if (!p) {
        b->failed = true;
        return false;
    }
    b->p = p;
    b->cap = cap;
    return true;
}

void sb_srv_buf_append(sb_srv_buf *b, const char *s, size_t n) {
    if (n == 0 || !reserve(b, n))
        return;
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

void sb_srv_buf_puts(sb_srv_buf *b, const char *s) { sb_srv_buf_append(b, s, strlen(s)); }

void sb_srv_buf_printf(sb_srv_buf *b, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    char small[256];
    int n = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    if ((size_t)n < sizeof small) {
        sb_srv_buf_append(b, small, (size_t)n);
        return;
    }
    if (!reserve(b, (size_t)n))
        return;
    va_start(ap, fmt);
    vsnprintf(b->p + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
}

void sb_srv_buf_clear(sb_srv_buf *b) {
    b->len = 0;
    if (b->p)
        b->p[0] = '\0';
}

void sb_srv_buf_free(sb_srv_buf *b) {
    sb_free(b->p);
    *b = (sb_srv_buf){0};
}
