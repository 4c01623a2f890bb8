/*
 * buf.h - a growable byte string for building response bodies and SSE
 * output. Appends that cannot allocate set `failed` and do nothing more, so a
 * builder checks once at the end instead of after every append.
 */
#ifndef SB_SRV_BUF_H
#define SB_SRV_BUF_H

#include <stdbool.h>
#include <stddef.h>

#include "base/base.h"

typedef struct sb_srv_buf {
    char *p;     /* NUL-terminated when len > 0; sb_malloc'd, freed by sb_srv_buf_free */
    size_t len;  /* bytes, without the NUL */
    size_t cap;  /* bytes allocated */
    bool failed; /* an append ran out of memory: the contents are incomplete */
} sb_srv_buf;

void sb_srv_buf_append(sb_srv_buf *b, const char *s, size_t n);
void sb_srv_buf_puts(sb_srv_buf *b, const char *s);
void sb_srv_buf_printf(sb_srv_buf *b, const char *fmt, ...) SB_PRINTF(2, 3);
/* Forgets the contents, keeping the allocation. */
void sb_srv_buf_clear(sb_srv_buf *b);
void sb_srv_buf_free(sb_srv_buf *b);

#endif
