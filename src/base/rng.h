/*
 * rng.h - a small seeded pseudo-random generator (xoshiro256**, seeded
 * through splitmix64), identical on every platform, for sampling and for
 * the synthetic model generator. Not for anything secret.
 */
#ifndef SB_RNG_H
#define SB_RNG_H

#include <math.h>
#include <stdint.h>

typedef struct sb_rng {
    uint64_t s[4];
} sb_rng;

static inline uint64_t sb_splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static inline void sb_rng_seed(sb_rng *r, uint64_t seed) {
    for (int i = 0; i < 4; i++)
        r->s[i] = sb_splitmix64(&seed);
}

static inline uint64_t sb_rng_next(sb_rng *r) {
    uint64_t *s = r->s;
    uint64_t x = s[1] * 5;
    uint64_t result = ((x << 7) | (x >> 57)) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = (s[3] << 45) | (s[3] >> 19);
    return result;
}

/* Uniform in [0, 1) with 53 bits of precision. */
static inline double sb_rng_uniform(sb_rng *r) { return (double)(sb_rng_next(r) >> 11) * 0x1.0p-53; }

/* Standard normal (Box-Muller; one value per call keeps the state simple). */
static inline float sb_rng_normal(sb_rng *r) {
    double u1 = sb_rng_uniform(r), u2 = sb_rng_uniform(r);
    return (float)(sqrt(-2.0 * log(1.0 - u1)) * cos(6.283185307179586 * u2));
}

#endif
