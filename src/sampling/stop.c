/*
 * stop.c - see stop.h.
 *
 * The matcher keeps the longest tail of the text seen so far that is a
 * prefix of some stop string; any match must start inside that tail, so
 * everything before it is safe to emit. Bytes are handled one at a time,
 * which is what makes a match surface on the byte that completes it. The
 * cost per byte is O(stop strings x longest stop string^2) comparisons,
 * small for the handful of short strings a request carries.
 */
#include "sampling/stop.h"

#include <string.h>

#include "base/base.h"

typedef struct {
    char *text; /* owned copy */
    size_t len; /* > 0 */
} stop_string;

struct sb_stop {
    stop_string *stops; /* (n_stops) */
    size_t n_stops;
    size_t max_len; /* longest stop string */
    char *held;     /* (max_len + 1) tail that may begin a stop string */
    size_t n_held;  /* < max_len between calls */
    bool stopped;   /* a stop string completed; output is over */
};

sb_status sb_stop_create(const char *const *stops, size_t n, sb_stop_t **out, sb_error *err) {
    *out = NULL;
    for (size_t i = 0; i < n; i++)
        if (!stops[i] || !stops[i][0])
            return sb_fail(err, SB_ERR_INVALID_ARG, "stop strings: string %zu of %zu is %s", i, n,
                           stops[i] ? "empty" : "NULL");

    sb_stop_t *s = sb_calloc(1, sizeof(*s));
    if (!s)
        return sb_fail(err, SB_ERR_NOMEM, "stop strings: out of memory");
    s->stops = sb_calloc(n, sizeof(*s->stops));
    bool ok = s->stops != NULL;
    for (size_t i = 0; ok && i < n; i++) {
        size_t len = strlen(stops[i]);
        s->stops[i] = (stop_string){sb_strndup(stops[i], len), len};
        s->n_stops = i + 1; /* so that free releases what was copied so far */
        ok = s->stops[i].text != NULL;
        s->max_len = SB_MAX(s->max_len, len);
    }
    if (ok) {
        s->held = sb_malloc(s->max_len + 1);
        ok = s->held != NULL;
    }
    if (!ok) {
        sb_stop_free(s);
        return sb_fail(err, SB_ERR_NOMEM, "stop strings: out of memory");
    }
    *out = s;
    return SB_OK;
}

void sb_stop_free(sb_stop_t *s) {
    if (!s)
        return;
    for (size_t i = 0; i < s->n_stops; i++)
        sb_free(s->stops[i].text);
    sb_free(s->stops);
    sb_free(s->held);
    sb_free(s);
}

size_t sb_stop_max_len(const sb_stop_t *s) { return s->max_len; }

/* Appends bytes to out[0..*n_out), keeping room for the NUL; see the cap
 * contract in stop.h for why dropping the excess is acceptable. */
static void emit(char *out, size_t cap, size_t *n_out, const char *bytes, size_t len) {
    if (cap == 0)
        return;
    size_t room = cap - 1 - *n_out;
    size_t n = SB_MIN(len, room);
    memcpy(out + *n_out, bytes, n);
    *n_out += n;
    out[*n_out] = '\0';
}

/* Where in held the earliest stop string ending at held's last byte starts,
 * or n_held if none ends there. */
static size_t completed_match(const sb_stop_t *s) {
    size_t start = s->n_held;
    for (size_t i = 0; i < s->n_stops; i++) {
        const stop_string *stop = &s->stops[i];
        if (stop->len <= s->n_held && s->n_held - stop->len < start &&
            memcmp(s->held + s->n_held - stop->len, stop->text, stop->len) == 0)
            start = s->n_held - stop->len;
    }
    return start;
}

/* Whether held[from..n_held) is the beginning of some stop string. */
static bool begins_stop(const sb_stop_t *s, size_t from) {
    size_t len = s->n_held - from;
    for (size_t i = 0; i < s->n_stops; i++)
        if (s->stops[i].len >= len && memcmp(s->held + from, s->stops[i].text, len) == 0)
            return true;
    return false;
}

size_t sb_stop_push(sb_stop_t *s, const char *text, size_t len, char *out, size_t cap, bool *stopped) {
    size_t n_out = 0;
    if (cap > 0)
        out[0] = '\0';
    for (size_t i = 0; i < len && !s->stopped; i++) {
        s->held[s->n_held++] = text[i];
        size_t match = completed_match(s);
        if (match < s->n_held) {
            emit(out, cap, &n_out, s->held, match);
            s->n_held = 0;
            s->stopped = true;
            break;
        }
        /* Release the bytes before the longest tail that may begin a stop
         * string. That tail is shorter than max_len, since a whole stop
         * string would have matched above. */
        size_t keep_from = 0;
        while (keep_from < s->n_held && !begins_stop(s, keep_from))
            keep_from++;
        emit(out, cap, &n_out, s->held, keep_from);
        memmove(s->held, s->held + keep_from, s->n_held - keep_from);
        s->n_held -= keep_from;
    }
    if (stopped)
        *stopped = s->stopped;
    return n_out;
}

size_t sb_stop_flush(sb_stop_t *s, char *out, size_t cap) {
    size_t n_out = 0;
    if (cap > 0)
        out[0] = '\0';
    emit(out, cap, &n_out, s->held, s->n_held);
    s->n_held = 0;
    s->stopped = false;
    return n_out;
}
