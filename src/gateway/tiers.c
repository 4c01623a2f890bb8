/*
 * tiers.c - parsing tiers and counting their requests (see tiers.h).
 */
#include "gateway/tiers.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"

static bool parse_int(const char *s, size_t len, long lo, long hi, int32_t *out) {
    char buf[24];
    if (len == 0 || len >= sizeof buf)
        return false;
    memcpy(buf, s, len);
    buf[len] = '\0';
    char *end;
    errno = 0;
    long v = strtol(buf, &end, 10);
    if (*end || errno || v < lo || v > hi)
        return false;
    *out = (int32_t)v;
    return true;
}

sb_status sb_gw_tiers_parse(const char *spec, sb_gw_tiers *out, sb_error *err) {
    memset(out, 0, sizeof *out);
    if (!spec || !*spec)
        spec = SB_GW_TIERS_DEFAULT;
    for (const char *p = spec; *p;) {
        size_t n = strcspn(p, ",");
        const char *c1 = memchr(p, ':', n);
        if (out->n == SB_GW_MAX_TIERS)
            return sb_fail(err, SB_ERR_INVALID_ARG, "--tiers: at most %d tiers", SB_GW_MAX_TIERS);
        sb_gw_tier *t = &out->t[out->n];
        size_t nl = c1 ? (size_t)(c1 - p) : n;
        bool ok = c1 && nl > 0 && nl < sizeof t->name;
        for (size_t i = 0; ok && i < nl; i++)
            ok = (p[i] >= 'a' && p[i] <= 'z') || (p[i] >= '0' && p[i] <= '9') || p[i] == '-' || p[i] == '_';
        t->max_in_flight = SB_GW_TIER_IN_FLIGHT_DEFAULT;
        if (ok) {
            memcpy(t->name, p, nl);
            const char *c2 = memchr(c1 + 1, ':', (size_t)(p + n - c1 - 1));
            const char *pe = c2 ? c2 : p + n;
            ok = parse_int(c1 + 1, (size_t)(pe - c1 - 1), -1000000, 1000000, &t->priority) &&
                 (!c2 || parse_int(c2 + 1, (size_t)(p + n - c2 - 1), 1, 1 << 20, &t->max_in_flight));
        }
        if (!ok)
            return sb_fail(err, SB_ERR_INVALID_ARG,
                           "--tiers: '%.*s' is not NAME:PRIORITY[:MAX_IN_FLIGHT] (a lower-case name, an integer "
                           "priority, at most 1048576 in flight), e.g. paid:10,free:0:32",
                           (int)SB_MIN(n, 80), p);
        for (int i = 0; i < out->n; i++)
            if (strcmp(out->t[i].name, t->name) == 0)
                return sb_fail(err, SB_ERR_INVALID_ARG, "--tiers: '%s' is named twice", t->name);
        atomic_init(&t->in_flight, 0);
        out->n++;
        p += n;
        if (*p == ',')
            p++;
    }
    if (out->n == 0)
        return sb_fail(err, SB_ERR_INVALID_ARG, "--tiers: no tier given");
    out->def = -1;
    for (int i = 0; i < out->n && out->def < 0; i++)
        if (out->t[i].priority == 0)
            out->def = i;
    if (out->def < 0) {
        out->def = 0;
        for (int i = 1; i < out->n; i++)
            if (out->t[i].priority < out->t[out->def].priority)
                out->def = i;
    }
    return SB_OK;
}

sb_gw_tier *sb_gw_tiers_find(sb_gw_tiers *tiers, const char *name) {
    for (int i = 0; i < tiers->n; i++)
        if (strcmp(tiers->t[i].name, name) == 0)
            return &tiers->t[i];
    return NULL;
}

void sb_gw_tiers_names(const sb_gw_tiers *tiers, char *out, size_t cap) {
    size_t off = 0;
    out[0] = '\0';
    for (int i = 0; i < tiers->n && off < cap; i++)
        off += (size_t)snprintf(out + off, cap - off, "%s%s", i ? ", " : "", tiers->t[i].name);
}

bool sb_gw_tier_enter(sb_gw_tier *t) {
    if (atomic_fetch_add(&t->in_flight, 1) >= t->max_in_flight) {
        atomic_fetch_sub(&t->in_flight, 1);
        return false;
    }
    return true;
}

void sb_gw_tier_leave(sb_gw_tier *t) { atomic_fetch_sub(&t->in_flight, 1); }
