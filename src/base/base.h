/*
 * base.h - what every module shares: error reporting into sb_error, the
 * replaceable allocator, and checked size arithmetic.
 *
 * Library code never exits or prints: it returns an sb_status and describes
 * the failure with sb_fail(). All heap memory goes through sb_malloc & co so
 * that tests can count it (the malformed-file corpus checks that no input
 * makes the loader allocate more than it holds).
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

/* Allocation through the process-wide hook; NULL on failure (never aborts). */
void *sb_malloc(size_t size);
void *sb_calloc(size_t count, size_t size); /* NULL also if count*size overflows */
void *sb_realloc(void *ptr, size_t size);
void sb_free(void *ptr);
char *sb_strndup(const char *s, size_t len);

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
#define SB_MIN(a, b) ((a) < (b) ? (a) : (b))
#define SB_MAX(a, b) ((a) > (b) ? (a) : (b))

/* A plain-C loop built for several x86 vector widths, one picked when the
 * program loads (gcc's function multi-versioning): for element-wise work
 * outside the kernel tables (the sampler's passes over the vocabulary, the
 * model's norms). Every version does the same operations in the same order,
 * so they give the same bytes as long as nothing contracts into an FMA. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define SB_VECTOR_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define SB_VECTOR_CLONES
#endif

#endif
