/*
 * clock.h - the gateway's clock: monotonic microseconds for buckets,
 * backoffs and polls (never wall time, which jumps), and wall-clock
 * seconds for what is stored (a key's creation and expiry).
 */
#ifndef SB_GW_CLOCK_H
#define SB_GW_CLOCK_H

#include <stdint.h>
#include <time.h>

static inline int64_t sb_gw_now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

static inline int64_t sb_gw_wall_s(void) { return (int64_t)time(NULL); }

#endif
