/*
 * caller.h - who is asking: what the gateway's admission (keys, tiers)
 * decides about a request and every later stage (scheduler priority,
 * response cache, usage, request log, batch ownership) reads.
 *
 * Filled once per request before its body is parsed; plain data, copied by
 * value, strings owned by the struct.
 */
#ifndef SB_GW_CALLER_H
#define SB_GW_CALLER_H

#include <stdbool.h>
#include <stdint.h>

#define SB_GW_NAME_MAX 64

typedef struct sb_gw_caller {
    char key[SB_GW_NAME_MAX];  /* the API key's name; "" when the request carries none (auth off) */
    char tier[SB_GW_NAME_MAX]; /* its tier's name ("paid", "free", "batch", ...) */
    int32_t priority;          /* the tier's scheduler priority: sb_gen_params.priority */
    char request_id[SB_GW_NAME_MAX]; /* x-request-id: the client's own, or one the server made */
    bool admitted;             /* sb_gw_admit let it in: sb_gw_settle must follow, once */
    int64_t reserved_tokens;   /* what the token bucket holds for it until then */
} sb_gw_caller;

#endif
