/*
 * fuzz_common.h - what the libFuzzer harnesses of tests/fuzz/ share: the
 * fixture directory, loading a fixture model once per process, and a
 * counting allocator (through sb_set_allocator) for heap-peak bounds.
 * Header-only so that each harness stays one file (CMake globs fuzz_*.c).
 */
#ifndef SB_FUZZ_COMMON_H
#define SB_FUZZ_COMMON_H

#include <stdio.h>
#include <stdlib.h>

#include "base/base.h"
#include "switchboard.h"

/* A fixture model (path under the fixtures directory), loaded once; aborts
 * when it is missing, since a harness without it would test nothing. */
static inline sb_model_t *fuzz_fixture_model(const char *relpath) {
    const char *dir = getenv("SB_SHARED_DIR");
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir ? dir : SB_SHARED_DIR, relpath);
    sb_model_t *m = NULL;
    sb_error err;
    if (sb_model_load(path, &m, &err) != SB_OK) {
        fprintf(stderr, "fuzz: cannot load fixture %s: %s\n", path, err.msg);
        abort();
    }
    return m;
}

/* ---- counting allocator ---- */

typedef struct fuzz_alloc_header {
    size_t size;
    size_t pad; /* keeps the payload 16-byte aligned */
} fuzz_alloc_header;

static size_t fuzz_live, fuzz_peak;

static inline void *fuzz_malloc(size_t size, void *user) {
    fuzz_alloc_header *h = malloc(sizeof *h + size);
    if (!h)
        return NULL;
    h->size = size;
    fuzz_live += size;
    if (fuzz_live > fuzz_peak)
        fuzz_peak = fuzz_live;
    return h + 1;
}

static inline void fuzz_free(void *p, void *user) {
    if (!p)
        return;
    fuzz_alloc_header *h = (fuzz_alloc_header *)p - 1;
    fuzz_live -= h->size;
    free(h);
}

static inline void *fuzz_realloc(void *p, size_t size, void *user) {
    if (!p)
        return fuzz_malloc(size, user);
    fuzz_alloc_header *h = (fuzz_alloc_header *)p - 1;
    size_t old = h->size;
    fuzz_alloc_header *n = realloc(h, sizeof *n + size);
    if (!n)
        return NULL;
    n->size = size;
    fuzz_live = fuzz_live - old + size;
    if (fuzz_live > fuzz_peak)
        fuzz_peak = fuzz_live;
    return n + 1;
}

/* Starts counting (from zero); fuzz_count_end() returns the peak. */
static inline void fuzz_count_begin(void) {
    fuzz_live = fuzz_peak = 0;
    sb_set_allocator(&(sb_allocator){fuzz_malloc, fuzz_realloc, fuzz_free, NULL});
}

static inline size_t fuzz_count_end(void) {
    sb_set_allocator(NULL);
    return fuzz_peak;
}

#endif
