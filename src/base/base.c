/*
 * base.c - status strings, error messages, the allocator hook, the log
 * callback and the abort hook.
 */
#include "base.h"

#include <cjson/cJSON.h>

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

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

static _Thread_local size_t *tally;      /* see sb__alloc_measure */
static _Thread_local uint64_t n_failed; /* see sb__alloc_failures */

/* cJSON's allocations (request bodies, registry files, tool schemas) are
 * the library's too: the hook covers them. cJSON's hooks are process-wide,
 * like ours, so an embedder's own cJSON use follows its allocator as well. */
static void *json_malloc(size_t size) { return sb_malloc(size); }
static void json_free(void *ptr) { sb_free(ptr); }

void sb_set_allocator(const sb_allocator *a) {
    if (a) {
        allocator = *a;
        cJSON_InitHooks(&(cJSON_Hooks){json_malloc, json_free});
    } else {
        allocator = (sb_allocator){libc_malloc, libc_realloc, libc_free, NULL};
        cJSON_InitHooks(NULL);
    }
}

uint64_t sb__alloc_failures(void) { return n_failed; }

size_t *sb__alloc_measure(size_t *t) {
    size_t *prev = tally;
    tally = t;
    return prev;
}

void *sb_malloc(size_t size) {
    if (tally)
        *tally += size;
    void *p = allocator.malloc_fn(size ? size : 1, allocator.user);
    if (!p)
        n_failed++;
    return p;
}

void *sb_calloc(size_t count, size_t size) {
    uint64_t total;
    if (sb_mul_overflows(count, size, &total) || total > SIZE_MAX)
        return NULL;
    void *p = sb_malloc((size_t)total);
    if (p)
        memset(p, 0, (size_t)total);
    return p;
}

void *sb_realloc(void *ptr, size_t size) {
    if (tally)
        *tally += size;
    void *p = allocator.realloc_fn(ptr, size ? size : 1, allocator.user);
    if (!p)
        n_failed++;
    return p;
}

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

/* The hook has no aligned entry: over-allocate, and keep the pointer the
 * hook returned just below the aligned address. */
void *sb_aligned_alloc(size_t align, size_t size) {
    uint64_t total;
    if (align < sizeof(void *) || (align & (align - 1)) || sb_add_overflows(size, align + sizeof(void *), &total) ||
        total > SIZE_MAX)
        return NULL;
    char *raw = sb_malloc((size_t)total);
    if (!raw)
        return NULL;
    void **p = (void **)sb_align_up((uintptr_t)raw + sizeof(void *), align);
    p[-1] = raw;
    return p;
}

void sb_aligned_free(void *ptr) {
    if (ptr)
        sb_free(((void **)ptr)[-1]);
}

/* ---- diagnostics -------------------------------------------------------- */

static sb_log_fn log_fn;
static void *log_user;
static sb_abort_fn abort_fn;

void sb_set_log_callback(sb_log_fn fn, void *user) {
    log_fn = fn;
    log_user = user;
}

void sb__log(int level, const char *fmt, ...) {
    if (!log_fn)
        return;
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof(line), fmt, ap);
    va_end(ap);
    log_fn(log_user, level, line);
}

void sb_set_abort_hook(sb_abort_fn fn) { abort_fn = fn; }

void sb__check_failed(const char *file, int line, const char *cond) {
    char msg[512];
    snprintf(msg, sizeof(msg), "%s:%d: check failed: %s", file, line, cond);
    sb__log(SB_LOG_ERROR, "%s", msg);
    if (abort_fn)
        abort_fn(msg);
    abort();
}

void sb__advise_inside(const void *p, size_t size, uintptr_t unit, int advice) {
    const uintptr_t lo = sb_align_up((uintptr_t)p, unit), hi = sb_align_down((uintptr_t)p + size, unit);
    if (hi > lo)
        madvise((void *)lo, hi - lo, advice);
}

int sb__load_split(size_t n, size_t (*size)(const void *ctx, size_t i), const void *ctx,
                   size_t ends[SB_LOAD_THREADS]) {
    const long cores = sysconf(_SC_NPROCESSORS_ONLN);
    const int n_parts = (int)SB_MAX(1, SB_MIN(SB_MIN((long)SB_LOAD_THREADS, cores), (long)n));
    size_t bytes = 0;
    for (size_t i = 0; i < n; i++)
        bytes += size(ctx, i);
    size_t i = 0, acc = 0;
    for (int k = 0; k < n_parts; k++) {
        const size_t until = bytes / (size_t)n_parts * (size_t)(k + 1);
        while (i < n && (k == n_parts - 1 || acc < until))
            acc += size(ctx, i++);
        ends[k] = i;
    }
    return n_parts;
}

void sb__load_run(void *(*fn)(void *part), void *parts, size_t part_size, int n) {
    SB_ASSERT(n >= 1 && n <= SB_LOAD_THREADS);
    pthread_t threads[SB_LOAD_THREADS];
    bool started[SB_LOAD_THREADS] = {false};
    for (int k = 1; k < n; k++)
        started[k] = pthread_create(&threads[k], NULL, fn, (char *)parts + (size_t)k * part_size) == 0;
    fn(parts);
    for (int k = 1; k < n; k++) {
        if (started[k])
            pthread_join(threads[k], NULL);
        else
            fn((char *)parts + (size_t)k * part_size); /* no thread to be had: here, then */
    }
}
