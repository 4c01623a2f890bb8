/*
 * base.c - status strings, error messages and the allocator hook.
 */
#include "base.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *sb_status_str(sb_status status) {
    switch (status) {
#define SB_STATUS_CASE(name, value, text) \
    case name:                            \
        return text;
        SB_STATUS_LIST(SB_STATUS_CASE)
#undef SB_STATUS_CASE
    }
    return "unknown status";
}

sb_status sb_fail(sb_error *err, sb_status status, const char *fmt, ...) {
    if (err) {
        err->status = status;
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof(err->msg), fmt, ap);
        va_end(ap);
    }
    return status;
}

static void *libc_malloc(size_t size, void *user) {
    (void)user;
    return malloc(size);
}
static void *libc_realloc(void *ptr, size_t size, void *user) {
    (void)user;
    return realloc(ptr, size);
}
static void libc_free(void *ptr, void *user) {
    (void)user;
    free(ptr);
}

static sb_allocator allocator = {libc_malloc, libc_realloc, libc_free, NULL};

void sb_set_allocator(const sb_allocator *a) {
    if (a)
        allocator = *a;
    else
        allocator = (sb_allocator){libc_malloc, libc_realloc, libc_free, NULL};
}

void *sb_malloc(size_t size) { return allocator.malloc_fn(size ? size : 1, allocator.user); }

void *sb_calloc(size_t count, size_t size) {
    uint64_t total;
    if (sb_mul_overflows(count, size, &total) || total > SIZE_MAX)
        return NULL;
    void *p = sb_malloc((size_t)total);
    if (p)
        memset(p, 0, (size_t)total);
    return p;
}

void *sb_realloc(void *ptr, size_t size) { return allocator.realloc_fn(ptr, size ? size : 1, allocator.user); }

void sb_free(void *ptr) {
    if (ptr)
        allocator.free_fn(ptr, allocator.user);
}

char *sb_strndup(const char *s, size_t len) {
    char *p = sb_malloc(len + 1);
    if (p) {
        memcpy(p, s, len);
        p[len] = '\0';
    }
    return p;
}
