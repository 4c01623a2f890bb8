/*
 * base.h - what every module shares: error reporting into sb_error, the
 * replaceable allocator, the log callback, checks of programmer errors, and
 * checked size arithmetic.
 *
 * Library code never exits or prints: it returns an sb_status and describes
 * the failure with sb_fail(); diagnostics go to the embedder's log callback,
 * and only a broken invariant (SB_ASSERT) ends the process. All heap memory
 * goes through sb_malloc & co so that tests can count it (the malformed-file
 * corpus checks that no input makes the loader allocate more than it holds)
 * and an engine can say what it costs (sb__alloc_measure).
 */
#ifndef SB_BASE_H
#define SB_BASE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "switchboard.h"

#if defined(__GNUC__)
#define SB_PRINTF(fmt_idx, args_idx) __attribute__((format(printf, fmt_idx, args_idx)))
#else
#define SB_PRINTF(fmt_idx, args_idx)
#endif

/* Records status and a printf-style message in err (if not NULL); returns status. */
sb_status sb_fail(sb_error *err, sb_status status, const char *fmt, ...) SB_PRINTF(3, 4);

struct cJSON;
/* A JSON value's type as messages name it: "a string", "an array", "null" (NULL too). */
const char *sb__json_kind(const struct cJSON *v);

/* Allocation through the process-wide hook; NULL on failure (never aborts). */
void *sb_malloc(size_t size);
void *sb_calloc(size_t count, size_t size); /* NULL also if count*size overflows */
void *sb_realloc(void *ptr, size_t size);
void sb_free(void *ptr);
char *sb_strndup(const char *s, size_t len);

/* size bytes at an address that is a multiple of align (a power of two),
 * through the same hook; NULL on failure. Free with sb_aligned_free. */
void *sb_aligned_alloc(size_t align, size_t size);
void sb_aligned_free(void *ptr);

/* Measures what an object really costs: from this call on, the size of
 * every allocation this thread makes through the hook is added to *tally
 * (a realloc adds its new size) until the next call; NULL stops. Returns
 * the tally that was counting before, so measurements nest: restore it. */
size_t *sb__alloc_measure(size_t *tally);

/* How many allocations through the hook have failed on this thread: a
 * parser that returns NULL for both bad input and no memory (cJSON) is
 * told apart by comparing the count around the call. */
uint64_t sb__alloc_failures(void);

/* A line to the embedder's log callback (see sb_set_log_callback). */
void sb__log(int level, const char *fmt, ...) SB_PRINTF(2, 3);

/* A check of a programmer error (never of input: input gets an sb_status),
 * kept in every build type: on failure the log callback gets
 * "FILE:LINE: check failed: COND" and the abort hook runs. */
#define SB_ASSERT(cond) ((cond) ? (void)0 : sb__check_failed(__FILE__, __LINE__, #cond))
_Noreturn void sb__check_failed(const char *file, int line, const char *cond);

/* a*b and a+b that report overflow instead of wrapping. */
static inline bool sb_mul_overflows(uint64_t a, uint64_t b, uint64_t *out) {
    return __builtin_mul_overflow(a, b, out);
}
static inline bool sb_add_overflows(uint64_t a, uint64_t b, uint64_t *out) {
    return __builtin_add_overflow(a, b, out);
}

#define SB_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

/* x rounded down / up to a multiple of a, a power of two. */
static inline uintptr_t sb_align_down(uintptr_t x, uintptr_t a) { return x & ~(a - 1); }
static inline uintptr_t sb_align_up(uintptr_t x, uintptr_t a) { return sb_align_down(x + a - 1, a); }

/* madvise() over the whole `unit`s inside [p, p + size), if any: the pages
 * that belong to that range alone. */
void sb__advise_inside(const void *p, size_t size, uintptr_t unit, int advice);

/* A load's work over threads (reading a private image, packing weights):
 * copying out of the page cache and packing are the whole of a warm load,
 * and they scale until memory bandwidth. At most this many parts. */
#define SB_LOAD_THREADS 4
/* Splits items 0..n, item i weighing size(ctx, i) bytes, into parts of
 * about equal bytes, one per thread to be had (at most SB_LOAD_THREADS, no
 * more than the cores or the items, at least one): part k ends before item
 * ends[k] and begins at ends[k - 1] (part 0 at 0). Returns the parts. */
int sb__load_split(size_t n, size_t (*size)(const void *ctx, size_t i), const void *ctx,
                   size_t ends[SB_LOAD_THREADS]);
/* Runs fn on each of n parts (n <= SB_LOAD_THREADS), part k at (char *)parts
 * + k * part_size: part 0 on the caller, the others on threads of their own
 * (one whose thread cannot start runs on the caller afterwards). Returns when
 * all have run. */
void sb__load_run(void *(*fn)(void *part), void *parts, size_t part_size, int n);
#define SB_MIN(a, b) ((a) < (b) ? (a) : (b))
#define SB_MAX(a, b) ((a) > (b) ? (a) : (b))

/* A plain-C loop built for several x86 vector widths, one picked when the
 * program loads (gcc's function multi-versioning): for element-wise work
 * outside the kernel tables (the sampler's passes over the vocabulary, the
 * model's norms). Every version does the same operations in the same order,
 * so they give the same bytes as long as nothing contracts into an FMA
 * (test_vector_clones checks it: a file that starts using this joins its
 * SB_CLONED_SOURCES in tests/CMakeLists.txt, and what it computes joins the
 * test's digests). */
#if defined(SB_VECTOR_CLONE_LEVEL)
/* One version only, chosen at build time: how tests/unit/test_vector_clones.c
 * runs the versions this CPU would not pick (1: the baseline, 2: AVX2). */
#if SB_VECTOR_CLONE_LEVEL == 2
#define SB_VECTOR_CLONES __attribute__((target("avx2")))
#else
#define SB_VECTOR_CLONES
#endif
#elif defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define SB_VECTOR_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define SB_VECTOR_CLONES
#endif

#endif
