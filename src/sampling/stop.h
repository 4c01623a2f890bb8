/*
 * stop.h - streaming matcher for stop strings ("\nUser:", "</s>", ...).
 *
 * Generated text arrives a piece at a time and a stop string may be split
 * across pieces, so the matcher holds back any tail that could still grow
 * into a stop string and releases it as soon as it cannot. Generation should
 * end when a push reports stopped; the stop string itself and anything after
 * it are never emitted. Used by the CLI and the server.
 *
 * Matching is on bytes. A match is reported the moment a stop string is
 * complete, so the result does not depend on how the text was split into
 * pieces; when several stop strings complete on the same byte, the one that
 * starts earliest wins (the longest, so the least text leaks out).
 *
 * A matcher is used by one thread at a time.
 */
#ifndef SB_SAMPLING_STOP_H
#define SB_SAMPLING_STOP_H

#include <stdbool.h>
#include <stddef.h>

#include "switchboard.h"

typedef struct sb_stop sb_stop_t;

/* Creates a matcher for n NUL-terminated stop strings, which are copied.
 * With n == 0 (stops may then be NULL) every byte passes straight through.
 * A NULL or empty stop string fails with SB_ERR_INVALID_ARG; on failure *out
 * is NULL and err says which string was wrong. */
sb_status sb_stop_create(const char *const *stops, size_t n, sb_stop_t **out, sb_error *err);
void sb_stop_free(sb_stop_t *stop);

/* Length in bytes of the longest stop string (0 with none). The matcher
 * never holds back more than this minus one. */
size_t sb_stop_max_len(const sb_stop_t *stop);

/* Feeds len bytes of generated text. Writes to out (capacity cap, always
 * NUL-terminated if cap > 0) the text that can no longer be part of a stop
 * string and returns its length, NUL excluded. When a stop string completes,
 * the text before it is written, *stopped (if not NULL) becomes true, and
 * the rest of this push and every later push is discarded (they return 0).
 * cap >= len + sb_stop_max_len(stop) + 1 always suffices; with less, the
 * output is cut at cap - 1 bytes and the rest is lost. */
size_t sb_stop_push(sb_stop_t *stop, const char *text, size_t len, char *out, size_t cap, bool *stopped);

/* Ends the stream: writes the held-back tail (a partial match that never
 * completed is ordinary text) and returns its length, or 0 after a stop.
 * cap >= sb_stop_max_len(stop) + 1 always suffices. Afterwards the matcher
 * is as new (nothing held, not stopped), ready for another stream. */
size_t sb_stop_flush(sb_stop_t *stop, char *out, size_t cap);

#endif
