/*
 * tiers.h - priority classes: a key's tier is a scheduler priority
 * (sb_gen_params.priority, which the process-wide executor and each engine
 * honour: higher tiers are admitted and batched first and preempt lower
 * ones, which resume later), plus a bound on how many of the tier's
 * requests the server holds at once, running or waiting; past it a
 * request gets 503 with Retry-After instead of queueing without end.
 *
 * Spec (`--tiers`): NAME:PRIORITY[:MAX_IN_FLIGHT],... e.g.
 * "paid:10,free:0:32,batch:-10:16"; defaults SB_GW_TIERS_DEFAULT. The
 * default tier (keys created without --tier, every request when auth is
 * off or anonymous) is the first with priority 0, else the lowest.
 */
#ifndef SB_GW_TIERS_H
#define SB_GW_TIERS_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "gateway/caller.h"
#include "switchboard.h"

#define SB_GW_TIERS_DEFAULT "paid:10,free:0,batch:-10"
#define SB_GW_MAX_TIERS 16
#define SB_GW_TIER_IN_FLIGHT_DEFAULT 1024

typedef struct sb_gw_tier {
    char name[SB_GW_NAME_MAX];
    int32_t priority;
    int32_t max_in_flight;
    atomic_int in_flight;
} sb_gw_tier;

typedef struct sb_gw_tiers {
    sb_gw_tier t[SB_GW_MAX_TIERS];
    int n;
    int def; /* index of the default tier */
} sb_gw_tiers;

/* Parses spec (NULL or "": the defaults) into *out; a malformed spec fails
 * with SB_ERR_INVALID_ARG naming the part that is wrong. */
sb_status sb_gw_tiers_parse(const char *spec, sb_gw_tiers *out, sb_error *err);
/* The tier called name, or NULL. */
sb_gw_tier *sb_gw_tiers_find(sb_gw_tiers *tiers, const char *name);
/* "paid, free, batch" for messages. */
void sb_gw_tiers_names(const sb_gw_tiers *tiers, char *out, size_t cap);
/* Counts a request in; false (nothing counted) when the tier is full. */
bool sb_gw_tier_enter(sb_gw_tier *t);
void sb_gw_tier_leave(sb_gw_tier *t);

#endif
