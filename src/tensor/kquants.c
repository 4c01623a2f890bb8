/*
 * kquants.c - the K-quant formats Q2_K, Q3_K, Q4_K, Q5_K, Q6_K and their
 * activation type Q8_K: dequantization, ggml's reference quantizers, and
 * reference dot products against Q8_K.
 *
 * Everything here must agree with ggml to the bit (tests/unit/
 * test_ggml_oracle.c checks it against llama.cpp's own library):
 *   - to_float gives the floats of ggml's dequantize_row_*;
 *   - from_float writes the bytes of ggml's quantize_row_*_ref, which
 *     searches per sub-block for the scale (and min) of least weighted error
 *     (make_qkx2_quants, make_q3_quants, make_qx_quants), quantizes those
 *     scales against the block's F16 super-scale, then re-rounds every
 *     element against the scale it will actually be read back with;
 *   - vec_dot follows the float order of llama.cpp's repacked Q4_K kernels
 *     for every format: one integer sum per block (see "dot products"
 *     below; for the others llama.cpp runs another order).
 *
 * The five weight formats are described by data (kfmt): where their F16
 * scales and packed sub-block scales sit, how the bits of a quant are split
 * across bit planes, and the knobs of the scale search. One piece of code
 * then reads, dequantizes, quantizes and dots them all; the switches on the
 * format are only where ggml's formats genuinely differ (scale packing,
 * the scale search, the order of a dot product's float steps).
 */
#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <string.h>

#include "base/base.h"
#include "tensor/kquants.h"
#include "tensor/tensor-impl.h"

#define NSUB_MAX (SB_QK_K / 16) /* most sub-blocks a block has */

/* ---- format descriptions ------------------------------------------------ */

/* How a format packs its sub-block scales (and mins) and F16 super-scales. */
typedef enum {
    SCALES_Q2,   /* 16 bytes: scale in the low nibble, min in the high */
    SCALES_Q3,   /* 12 bytes: 16 6-bit values, stored +32 */
    SCALES_K4,   /* 12 bytes: 8 6-bit scales + 8 6-bit mins (Q4_K, Q5_K) */
    SCALES_Q6,   /* 16 int8 */
} scale_kind;

/* How the scale search of ggml's quantizer picks a sub-block's scale. */
typedef enum {
    SEARCH_QKX2, /* make_qkx2_quants: scale and min, least weighted error */
    SEARCH_Q3,   /* make_q3_quants: symmetric, iterative refinement */
    SEARCH_QX,   /* make_qx_quants: symmetric, scan of 18 nearby scales */
} search_kind;

/*
 * A bit plane holding `bits` bits of every quant. The plane is cut into
 * chunks of `run` bytes; a chunk holds run*(8/bits) consecutive elements,
 * the first `run` of them in the lowest bits of its bytes, the next `run`
 * in the next bits, and so on. Element e of the block therefore sits at
 *   byte  off + (e / (run*8/bits)) * run + e % run,
 *   shift bits * ((e % (run*8/bits)) / run).
 * All K-quant layouts are one or two such planes (ggml's loops that pack
 * L[j + l], L[j + l + 32], ... into one byte).
 */
typedef struct {
    uint8_t off;  /* byte offset in the block */
    uint8_t bits; /* 1, 2 or 4; 0 = no such plane */
    uint8_t run;  /* bytes per run */
} plane;

typedef struct kfmt {
    uint8_t size;       /* bytes per block */
    uint8_t sub;        /* elements per sub-block: 16 or 32 */
    uint8_t off_d;      /* F16 d */
    int8_t off_dmin;    /* F16 dmin, -1 if the format has no mins */
    uint8_t off_scales; /* packed sub-block scales */
    scale_kind scales;
    plane lo, hi;       /* quant = lo | hi << lo.bits, 0..qmax */
    uint8_t qmax;       /* 2^bits - 1 */
    uint8_t bias;       /* value = quant - bias (Q3_K 4, Q6_K 32) */
    /* Scale search of the reference quantizer. */
    search_kind search;
    float rmin;         /* SEARCH_QKX2: first scale tried is (qmax + rmin) / range, */
    uint8_t nstep;      /*   then nstep more in steps of 0.1 */
    bool use_mad;       /* SEARCH_QKX2: error is |diff| (Q2_K) rather than diff^2 */
} kfmt;

static const kfmt fmt_q2_K = {
    .size = sizeof(sb_block_q2_K), .sub = 16,
    .off_d = offsetof(sb_block_q2_K, d), .off_dmin = offsetof(sb_block_q2_K, dmin),
    .off_scales = offsetof(sb_block_q2_K, scales), .scales = SCALES_Q2,
    .lo = {offsetof(sb_block_q2_K, qs), 2, 32}, .qmax = 3,
    .search = SEARCH_QKX2, .rmin = -0.5f, .nstep = 15, .use_mad = true,
};

static const kfmt fmt_q3_K = {
    .size = sizeof(sb_block_q3_K), .sub = 16,
    .off_d = offsetof(sb_block_q3_K, d), .off_dmin = -1,
    .off_scales = offsetof(sb_block_q3_K, scales), .scales = SCALES_Q3,
    .lo = {offsetof(sb_block_q3_K, qs), 2, 32}, .hi = {offsetof(sb_block_q3_K, hmask), 1, 32},
    .qmax = 7, .bias = 4,
    .search = SEARCH_Q3,
};

static const kfmt fmt_q4_K = {
    .size = sizeof(sb_block_q4_K), .sub = 32,
    .off_d = offsetof(sb_block_q4_K, d), .off_dmin = offsetof(sb_block_q4_K, dmin),
    .off_scales = offsetof(sb_block_q4_K, scales), .scales = SCALES_K4,
    .lo = {offsetof(sb_block_q4_K, qs), 4, 32}, .qmax = 15,
    .search = SEARCH_QKX2, .rmin = -1.0f, .nstep = 20,
};

static const kfmt fmt_q5_K = {
    .size = sizeof(sb_block_q5_K), .sub = 32,
    .off_d = offsetof(sb_block_q5_K, d), .off_dmin = offsetof(sb_block_q5_K, dmin),
    .off_scales = offsetof(sb_block_q5_K, scales), .scales = SCALES_K4,
    .lo = {offsetof(sb_block_q5_K, qs), 4, 32}, .hi = {offsetof(sb_block_q5_K, qh), 1, 32},
    .qmax = 31,
    .search = SEARCH_QKX2, .rmin = -0.5f, .nstep = 15,
};

static const kfmt fmt_q6_K = {
    .size = sizeof(sb_block_q6_K), .sub = 16,
    .off_d = offsetof(sb_block_q6_K, d), .off_dmin = -1,
    .off_scales = offsetof(sb_block_q6_K, scales), .scales = SCALES_Q6,
    .lo = {offsetof(sb_block_q6_K, ql), 4, 64}, .hi = {offsetof(sb_block_q6_K, qh), 2, 32},
    .qmax = 63, .bias = 32,
    .search = SEARCH_QX,
};

/* ---- reading and writing blocks ---------------------------------------- */


/* Loops over the elements e of a block with the byte and shift of their
 * bits in plane p (see plane), chunk by chunk, run by run, so that no
 * division is needed per element. */
#define PLANE_FOR_EACH(p, byte, shift, e)                                                                    \
    for (int chunk_ = 0, per_ = (p)->run * (8 / (p)->bits); chunk_ < SB_QK_K / per_; chunk_++)               \
        for (int slot_ = 0; slot_ < 8 / (p)->bits; slot_++)                                                   \
            for (int i_ = 0, byte = (p)->off + chunk_ * (p)->run, shift = (p)->bits * slot_,                   \
                     e = chunk_ * per_ + slot_ * (p)->run;                                                    \
                 i_ < (p)->run; i_++, byte++, e++)

/* The stored quants 0..qmax of a block. */
static void unpack_quants(const kfmt *f, const uint8_t *blk, uint8_t q[SB_QK_K]) {
    const int lo_mask = (1 << f->lo.bits) - 1, hi_mask = (1 << f->hi.bits) - 1;
    PLANE_FOR_EACH(&f->lo, byte, shift, e)
        q[e] = blk[byte] >> shift & lo_mask;
    if (f->hi.bits) {
        PLANE_FOR_EACH(&f->hi, byte, shift, e)
            q[e] |= (blk[byte] >> shift & hi_mask) << f->lo.bits;
    }
}

/* Stores quants 0..qmax; the planes must be zero beforehand. */
static void pack_quants(const kfmt *f, uint8_t *blk, const uint8_t q[SB_QK_K]) {
    const int lo_mask = (1 << f->lo.bits) - 1;
    PLANE_FOR_EACH(&f->lo, byte, shift, e)
        blk[byte] |= (uint8_t)((q[e] & lo_mask) << shift);
    if (f->hi.bits) {
        PLANE_FOR_EACH(&f->hi, byte, shift, e)
            blk[byte] |= (uint8_t)((q[e] >> f->lo.bits) << shift);
    }
}

/* The integer sub-block scales and mins of a block (mins 0 if none). */
static void unpack_scales(const kfmt *f, const uint8_t *blk, int sc[NSUB_MAX], int m[NSUB_MAX]) {
    const uint8_t *s = blk + f->off_scales;
    const int nsub = SB_QK_K / f->sub;
    for (int j = 0; j < nsub; j++) {
        m[j] = 0;
        switch (f->scales) {
        case SCALES_Q2:
            sc[j] = s[j] & 0xf;
            m[j] = s[j] >> 4;
            break;
        case SCALES_Q3:
            sc[j] = sb__q3_scale(s, j) - 32;
            break;
        case SCALES_K4:
            sb__k4_scale_min(s, j, &sc[j], &m[j]);
            break;
        case SCALES_Q6:
            sc[j] = (int8_t)s[j];
            break;
        }
    }
}

/* The float scale dl and offset ml of every sub-block: element value
 * x = dl * (q - bias) - ml, as ggml computes them (dl = d*sc, ml = dmin*m). */
static void block_scales(const kfmt *f, const uint8_t *blk, float dl[NSUB_MAX], float ml[NSUB_MAX]) {
    int sc[NSUB_MAX], m[NSUB_MAX];
    const float d = sb__get_f16(blk + f->off_d);
    const float dmin = f->off_dmin >= 0 ? sb__get_f16(blk + f->off_dmin) : 0.0f;
    unpack_scales(f, blk, sc, m);
    for (int j = 0; j < SB_QK_K / f->sub; j++) {
        dl[j] = d * (float)sc[j];
        ml[j] = dmin * (float)m[j];
    }
}

/* ---- dequantization ----------------------------------------------------- */

/* As ggml's dequantize_row_*: x = dl*q - ml, or dl*q without mins (Q6_K's
 * d * sc[j] * q is (d*sc)*q in C, the same dl*q). */
static void dequantize(const kfmt *f, const void *src, float *dst, int64_t n) {
    const uint8_t *blk = src;
    uint8_t q[SB_QK_K];
    float dl[NSUB_MAX], ml[NSUB_MAX];
    for (int64_t b = 0; b < n / SB_QK_K; b++, blk += f->size, dst += SB_QK_K) {
        block_scales(f, blk, dl, ml);
        unpack_quants(f, blk, q);
        for (int e = 0; e < SB_QK_K; e++) {
            const float v = dl[e / f->sub] * (float)(q[e] - f->bias);
            dst[e] = f->off_dmin >= 0 ? v - ml[e / f->sub] : v;
        }
    }
}

void sb__q2_K_to_float(const void *src, float *dst, int64_t n) { dequantize(&fmt_q2_K, src, dst, n); }
void sb__q3_K_to_float(const void *src, float *dst, int64_t n) { dequantize(&fmt_q3_K, src, dst, n); }
void sb__q4_K_to_float(const void *src, float *dst, int64_t n) { dequantize(&fmt_q4_K, src, dst, n); }
void sb__q5_K_to_float(const void *src, float *dst, int64_t n) { dequantize(&fmt_q5_K, src, dst, n); }
void sb__q6_K_to_float(const void *src, float *dst, int64_t n) { dequantize(&fmt_q6_K, src, dst, n); }
void sb__q6_K_quants(const void *blk, uint8_t q[SB_QK_K]) { unpack_quants(&fmt_q6_K, blk, q); }

void sb__q6_K_set_quants(void *blk, const uint8_t q[SB_QK_K]) {
    sb_block_q6_K *b = blk;
    memset(b->ql, 0, sizeof(b->ql));
    memset(b->qh, 0, sizeof(b->qh));
    pack_quants(&fmt_q6_K, blk, q);
}

void sb__q8_K_to_float(const void *src, float *dst, int64_t n) {
    const sb_block_q8_K *blk = src;
    for (int64_t b = 0; b < n / SB_QK_K; b++, blk++, dst += SB_QK_K)
        for (int e = 0; e < SB_QK_K; e++)
            dst[e] = blk->d * (float)blk->qs[e];
}

/* ---- the scale searches of ggml's reference quantizers ------------------ */

static int clamp_int(int v, int lo, int hi) {
    v = v < lo ? lo : v;
    return v > hi ? hi : v;
}

/* The searches of ggml's quantizers below work on 16 sub-blocks at once,
 * one per vector lane: their loops over the lanes j are the inner ones, and
 * each lane does ggml's operations on its sub-block in ggml's order, so
 * that every vector width writes ggml's bytes. (Lanes of 16: gcc unrolls
 * loops of 8 whole before it vectorises, and then vectorises the loop
 * around them instead, with in-order reductions: Q4_K's search 3x slower
 * with the 8 sub-blocks of one block.) */
#define SEARCH_LANES 16

/* xt[i][j] = element i of the j-th of SEARCH_LANES sub-blocks of n elements at x. */
static inline void lanes_of(int n, const float *x, float xt[][SEARCH_LANES]) {
    for (int i = 0; i < n; i++)
        for (int j = 0; j < SEARCH_LANES; j++)
            xt[i][j] = x[n * j + i];
}

/*
 * make_qkx2_quants, with the weights ggml gives it (|x| for Q2_K; for Q4_K
 * and Q5_K rms(x) + |x|, the rms over the sub-block), for 16 sub-blocks
 * at once: the scale and min of each sub-block of n elements
 * with quants 0..nmax and least weighted error sum(w * err(scale*L + min -
 * x)), err = |.| (use_mad) or squared. Starts from the range [min(x,0),
 * max(x)] cut in nmax steps, then tries nstep+1 other step counts nmax +
 * rmin + 0.1*is, each with the least-squares scale and min for its
 * rounding (a better one also moves the min the next candidates start
 * from). scale[j], neg_min[j] = -min (>= 0) and L get sub-block j's.
 *
 * Lanes whose range is empty compute garbage, then take ggml's answer for
 * them: quants 0, scale 0. The 16 sub-blocks have n elements: Q2_K 16
 * with use_mad (a block), Q4_K and Q5_K 32 without (two blocks); the
 * callers below fix both, so that the loops have no branches.
 */
#define QKX2_N 32
static inline __attribute__((always_inline)) void qkx2_lanes(const int n, const bool use_mad,
                                                             const kfmt *f, const float *x, float *scale,
                                                             float *neg_min, uint8_t *L) {
    float xt[QKX2_N][SEARCH_LANES], w[QKX2_N][SEARCH_LANES];   /* element i of lane j at [i][j] */
    int32_t lb[QKX2_N][SEARCH_LANES], la[QKX2_N][SEARCH_LANES]; /* best and candidate quants */
    float min[SEARCH_LANES], max[SEARCH_LANES], sum_w[SEARCH_LANES], sum_x[SEARCH_LANES], iscale[SEARCH_LANES],
        sc[SEARCH_LANES], best[SEARCH_LANES], min0[SEARCH_LANES];
    const int nmax = f->qmax;
    lanes_of(n, x, xt);
    if (use_mad) {
        for (int i = 0; i < n; i++)
            for (int j = 0; j < SEARCH_LANES; j++)
                w[i][j] = fabsf(xt[i][j]);
    } else {
        float sum_x2[SEARCH_LANES], av_x[SEARCH_LANES];
        for (int j = 0; j < SEARCH_LANES; j++)
            sum_x2[j] = 0;
        for (int i = 0; i < n; i++)
            for (int j = 0; j < SEARCH_LANES; j++)
                sum_x2[j] += xt[i][j] * xt[i][j];
        for (int j = 0; j < SEARCH_LANES; j++)
            av_x[j] = sqrtf(sum_x2[j] / (float)n);
        for (int i = 0; i < n; i++)
            for (int j = 0; j < SEARCH_LANES; j++)
                w[i][j] = av_x[j] + fabsf(xt[i][j]);
    }

    for (int j = 0; j < SEARCH_LANES; j++) {
        min[j] = max[j] = xt[0][j];
        sum_w[j] = w[0][j];
        sum_x[j] = sum_w[j] * xt[0][j];
    }
    for (int i = 1; i < n; i++)
        for (int j = 0; j < SEARCH_LANES; j++) {
            min[j] = xt[i][j] < min[j] ? xt[i][j] : min[j];
            max[j] = xt[i][j] > max[j] ? xt[i][j] : max[j];
            sum_w[j] += w[i][j];
            sum_x[j] += w[i][j] * xt[i][j];
        }
    for (int j = 0; j < SEARCH_LANES; j++) {
        min[j] = min[j] > 0 ? 0 : min[j];
        min0[j] = min[j];
        iscale[j] = (float)nmax / (max[j] - min[j]);
        sc[j] = 1 / iscale[j];
        best[j] = 0;
    }
    for (int i = 0; i < n; i++)
        for (int j = 0; j < SEARCH_LANES; j++) {
            const int l = clamp_int(sb__nearest_int(iscale[j] * (xt[i][j] - min[j])), 0, nmax);
            lb[i][j] = l;
            float diff = sc[j] * (float)l + min[j] - xt[i][j];
            diff = use_mad ? fabsf(diff) : diff * diff;
            best[j] += w[i][j] * diff;
        }

    for (int is = 0; is <= f->nstep; is++) {
        float sum_l[SEARCH_LANES], sum_l2[SEARCH_LANES], sum_xl[SEARCH_LANES], ts[SEARCH_LANES], tm[SEARCH_LANES],
            cur[SEARCH_LANES];
        int32_t take[SEARCH_LANES]; /* 0 or 1, not bool: lanes as wide as the floats' */
        for (int j = 0; j < SEARCH_LANES; j++) {
            iscale[j] = (f->rmin + 0.1f * (float)is + (float)nmax) / (max[j] - min[j]);
            sum_l[j] = sum_l2[j] = sum_xl[j] = cur[j] = 0;
        }
        for (int i = 0; i < n; i++)
            for (int j = 0; j < SEARCH_LANES; j++) {
                const int l = clamp_int(sb__nearest_int(iscale[j] * (xt[i][j] - min[j])), 0, nmax);
                la[i][j] = l;
                sum_l[j] += w[i][j] * (float)l;
                sum_l2[j] += w[i][j] * (float)l * (float)l;
                sum_xl[j] += w[i][j] * (float)l * xt[i][j];
            }
        for (int j = 0; j < SEARCH_LANES; j++) {
            const float D = sum_w[j] * sum_l2[j] - sum_l[j] * sum_l[j];
            const float this_min = (sum_l2[j] * sum_x[j] - sum_l[j] * sum_xl[j]) / D;
            const bool positive = this_min > 0;
            ts[j] = positive ? sum_xl[j] / sum_l2[j] : (sum_w[j] * sum_xl[j] - sum_x[j] * sum_l[j]) / D;
            tm[j] = positive ? 0 : this_min;
            take[j] = D > 0; /* and, below, a smaller error */
        }
        for (int i = 0; i < n; i++)
            for (int j = 0; j < SEARCH_LANES; j++) {
                float diff = ts[j] * (float)la[i][j] + tm[j] - xt[i][j];
                diff = use_mad ? fabsf(diff) : diff * diff;
                cur[j] += w[i][j] * diff;
            }
        for (int j = 0; j < SEARCH_LANES; j++) {
            take[j] &= cur[j] < best[j];
            best[j] = take[j] ? cur[j] : best[j];
            sc[j] = take[j] ? ts[j] : sc[j];
            min[j] = take[j] ? tm[j] : min[j];
        }
        for (int i = 0; i < n; i++)
            for (int j = 0; j < SEARCH_LANES; j++)
                lb[i][j] = take[j] ? la[i][j] : lb[i][j];
    }

    for (int j = 0; j < SEARCH_LANES; j++) {
        const bool flat = max[j] == min0[j];
        scale[j] = flat ? 0.0f : sc[j];
        neg_min[j] = flat ? -min0[j] : -min[j];
        for (int i = 0; i < n; i++)
            L[n * j + i] = flat ? 0 : (uint8_t)lb[i][j];
    }
}

SB_VECTOR_CLONES static void search_qkx2_q2(const kfmt *f, const float *x, float *scale, float *neg_min, uint8_t *L) {
    qkx2_lanes(16, true, f, x, scale, neg_min, L);
}

SB_VECTOR_CLONES static void search_qkx2_q45(const kfmt *f, const float *x, float *scale, float *neg_min,
                                            uint8_t *L) {
    qkx2_lanes(32, false, f, x, scale, neg_min, L);
}

/* The first element of largest magnitude (0 if all are 0). */
static float signed_absmax(int n, const float *x, float *amax) {
    float max = 0;
    *amax = 0;
    for (int i = 0; i < n; i++) {
        if (fabsf(x[i]) > *amax) {
            *amax = fabsf(x[i]);
            max = x[i];
        }
    }
    return max;
}

/*
 * make_qx_quants with rmse_type 1 and no importance weights, for the 16
 * sub-blocks of 16 elements of a block at once (Q6_K's): symmetric quants
 * -nmax..nmax-1 (stored +nmax), weights x^2. Per sub-block it starts from
 * the scale that maps the largest-magnitude element to -nmax, then tries
 * -(nmax + 0.1*is), is = -9..9, keeping a rounding only if its
 * least-squares fit is better. All-zero input gives L = 0 and scale 0.
 * (One sub-block at a time, this search was 90% of quantizing to Q6_K.)
 */
#define QX_N 16 /* sub-blocks per block, and elements per sub-block (Q3_K's and Q6_K's) */
_Static_assert(QX_N == SEARCH_LANES, "a Q3_K or Q6_K block is one search");

/* The elements transposed, xt[i][j] = element i of sub-block j, and each
 * sub-block's first element of largest magnitude, max[j] (0 if all are 0),
 * and that magnitude, amax[j]. */
static inline void qx_lanes(const float *x, float xt[restrict QX_N][QX_N], float max[restrict QX_N],
                            float amax[restrict QX_N]) {
    lanes_of(QX_N, x, xt);
    for (int j = 0; j < QX_N; j++)
        max[j] = amax[j] = 0;
    for (int i = 0; i < QX_N; i++)
        for (int j = 0; j < QX_N; j++) {
            const float ax = fabsf(xt[i][j]);
            const bool more = ax > amax[j];
            max[j] = more ? xt[i][j] : max[j];
            amax[j] = more ? ax : amax[j];
        }
}

/* One candidate scale per sub-block: the rounded quants and the weighted
 * sums sum(w*x*l), sum(w*l*l), w = x^2. xt[i][j]: element i of sub-block j. */
static inline void qx_fit(int nmax, const float xt[restrict QX_N][QX_N], const float iscale[restrict QX_N],
                          int32_t l[restrict QX_N][QX_N], float sumlx[restrict QX_N], float suml2[restrict QX_N]) {
    for (int j = 0; j < QX_N; j++)
        sumlx[j] = suml2[j] = 0;
    for (int i = 0; i < QX_N; i++)
        for (int j = 0; j < QX_N; j++) {
            const float x = xt[i][j];
            const int q = clamp_int(sb__nearest_int(iscale[j] * x), -nmax, nmax - 1);
            l[i][j] = q;
            const float w = x * x;
            sumlx[j] += w * x * (float)q;
            suml2[j] += w * (float)q * (float)q;
        }
}

SB_VECTOR_CLONES static void search_qx(int nmax, const float *x, float scale[QX_N], uint8_t *L) {
    float xt[QX_N][QX_N], max[QX_N], amax[QX_N], iscale[QX_N], sumlx[QX_N], suml2[QX_N], best[QX_N];
    int32_t l[QX_N][QX_N], lt[QX_N][QX_N]; /* int32, not bytes: lanes as wide as the floats' */
    qx_lanes(x, xt, max, amax);
    for (int j = 0; j < QX_N; j++)
        iscale[j] = (float)-nmax / max[j];
    qx_fit(nmax, xt, iscale, l, sumlx, suml2);
    for (int i = 0; i < QX_N; i++)
        for (int j = 0; j < QX_N; j++)
            lt[i][j] = l[i][j] + nmax;
    for (int j = 0; j < QX_N; j++) {
        scale[j] = suml2[j] != 0 ? sumlx[j] / suml2[j] : 0.0f;
        best[j] = scale[j] * sumlx[j];
    }
    for (int is = -9; is <= 9; is++) {
        if (is == 0)
            continue;
        for (int j = 0; j < QX_N; j++)
            iscale[j] = -((float)nmax + 0.1f * (float)is) / max[j];
        qx_fit(nmax, xt, iscale, l, sumlx, suml2);
        bool better[QX_N];
        for (int j = 0; j < QX_N; j++)
            better[j] = suml2[j] > 0 && sumlx[j] * sumlx[j] > best[j] * suml2[j];
        for (int i = 0; i < QX_N; i++)
            for (int j = 0; j < QX_N; j++)
                lt[i][j] = better[j] ? l[i][j] + nmax : lt[i][j];
        for (int j = 0; j < QX_N; j++) {
            const float s = sumlx[j] / suml2[j]; /* taken only where suml2 > 0 */
            scale[j] = better[j] ? s : scale[j];
            best[j] = better[j] ? s * sumlx[j] : best[j];
        }
    }

    /* Sub-blocks below ggml's threshold: all zero (their lanes computed garbage). */
    for (int j = 0; j < QX_N; j++) {
        const bool zero = amax[j] < GROUP_MAX_EPS;
        scale[j] = zero ? 0.0f : scale[j];
        for (int i = 0; i < QX_N; i++)
            L[QX_N * j + i] = zero ? 0 : (uint8_t)lt[i][j];
    }
}

/*
 * make_q3_quants with do_rmse, for the 16 sub-blocks of 16 elements of a
 * block at once (Q3_K's), a lane each as search_qx: symmetric quants
 * -nmax..nmax-1 (stored +nmax), weights x^2. Starts from the scale that
 * maps the largest-magnitude element to -nmax, then up to 5 passes move
 * single quants while that raises sumlx^2/suml2 (the least-squares fit).
 * A lane whose pass moved nothing would move nothing in the next either,
 * so all lanes run until no lane moves, as ggml's loop stops for each.
 * All-zero input gives L = 0 (not nmax) and scale 0, as ggml.
 */
SB_VECTOR_CLONES static void search_q3(int nmax, const float *x, float scale[QX_N], uint8_t *L) {
    float xt[QX_N][QX_N], max[QX_N], amax[QX_N], iscale[QX_N], sumlx[QX_N], suml2[QX_N];
    int32_t l[QX_N][QX_N];
    qx_lanes(x, xt, max, amax);
    for (int j = 0; j < QX_N; j++)
        iscale[j] = (float)-nmax / max[j];
    qx_fit(nmax, xt, iscale, l, sumlx, suml2);
    for (int itry = 0; itry < 5; itry++) {
        int32_t moved = 0;
        for (int i = 0; i < QX_N; i++)
            for (int j = 0; j < QX_N; j++) {
                const float xi = xt[i][j], w = xi * xi;
                const int li = l[i][j];
                float slx = sumlx[j] - w * xi * (float)li;
                float sl2 = suml2[j] - w * (float)li * (float)li;
                const int new_l = clamp_int(sb__nearest_int(xi * sl2 / slx), -nmax, nmax - 1);
                const int tried = (slx > 0) & (new_l != li); /* &, not &&: no branches */
                slx += w * xi * (float)new_l;
                sl2 += w * (float)new_l * (float)new_l;
                const int take = tried & (sl2 > 0) & (slx * slx * suml2[j] > sumlx[j] * sumlx[j] * sl2);
                l[i][j] = take ? new_l : li;
                sumlx[j] = take ? slx : sumlx[j];
                suml2[j] = take ? sl2 : suml2[j];
                moved |= take;
            }
        if (!moved)
            break;
    }
    for (int j = 0; j < QX_N; j++) {
        const bool zero = amax[j] < GROUP_MAX_EPS;
        scale[j] = zero ? 0.0f : suml2[j] > 0.0f ? sumlx[j] / suml2[j] : 0.0f;
        for (int i = 0; i < QX_N; i++)
            L[QX_N * j + i] = zero ? 0 : (uint8_t)(l[i][j] + nmax);
    }
}

/* ---- quantization (ggml's quantize_row_*_ref) ---------------------------- */

/*
 * Quantizes the block's float sub-block scales (and mins) to the format's
 * integers against the block's F16 super-scale(s), writing both. Returns
 * false if the whole block is to be zero (Q6_K with all scales ~0).
 * The casts reproduce ggml's stores into uint8_t/int8_t, wrap-around
 * included, for the degenerate negative scales make_qkx2_quants can return.
 */
static bool encode_scales(const kfmt *f, uint8_t *blk, const float *scales, const float *mins) {
    const int nsub = SB_QK_K / f->sub;
    uint8_t *s = blk + f->off_scales;
    float max_scale = 0, max_min = 0, amax = 0;
    for (int j = 0; j < nsub; j++) {
        if (f->scales == SCALES_Q3 || f->scales == SCALES_Q6) {
            /* symmetric: the scale of largest magnitude, with its sign */
            if (fabsf(scales[j]) > amax) {
                amax = fabsf(scales[j]);
                max_scale = scales[j];
            }
        } else {
            /* with mins: scales and mins are >= 0 (up to degenerate cases) */
            if (scales[j] > max_scale)
                max_scale = scales[j];
            if (mins[j] > max_min)
                max_min = mins[j];
        }
    }
    switch (f->scales) {
    case SCALES_Q2: {
        const float iscale = max_scale > 0 ? 15.0f / max_scale : 0.0f;
        const float imin = max_min > 0 ? 15.0f / max_min : 0.0f;
        for (int j = 0; j < nsub; j++)
            s[j] = (uint8_t)((unsigned)sb__nearest_int(iscale * scales[j]) | (unsigned)sb__nearest_int(imin * mins[j]) << 4);
        sb__put_f16(blk + f->off_d, max_scale > 0 ? max_scale / 15.0f : 0.0f);
        sb__put_f16(blk + f->off_dmin, max_min > 0 ? max_min / 15.0f : 0.0f);
        return true;
    }
    case SCALES_K4: {
        const float iscale = max_scale > 0 ? 63.0f / max_scale : 0.0f;
        const float imin = max_min > 0 ? 63.0f / max_min : 0.0f;
        for (int j = 0; j < nsub; j++) {
            const uint8_t ls = SB_MIN(63, (uint8_t)sb__nearest_int(iscale * scales[j]));
            const uint8_t lm = SB_MIN(63, (uint8_t)sb__nearest_int(imin * mins[j]));
            if (j < 4) {
                s[j] = ls;
                s[j + 4] = lm;
            } else {
                s[j + 4] = (uint8_t)((ls & 0xf) | (lm & 0xf) << 4);
                s[j - 4] |= (uint8_t)((ls >> 4) << 6);
                s[j] |= (uint8_t)((lm >> 4) << 6);
            }
        }
        sb__put_f16(blk + f->off_d, max_scale / 63.0f);
        sb__put_f16(blk + f->off_dmin, max_min / 63.0f);
        return true;
    }
    case SCALES_Q3: {
        if (max_scale == 0) {
            sb__put_f16(blk + f->off_d, 0.0f);
            return true;
        }
        const float iscale = -32.0f / max_scale;
        for (int j = 0; j < nsub; j++) {
            const int8_t l8 = (int8_t)sb__nearest_int(iscale * scales[j]);
            const int l = clamp_int(l8, -32, 31) + 32;
            if (j < 8)
                s[j] = (uint8_t)(l & 0xf);
            else
                s[j - 8] |= (uint8_t)((l & 0xf) << 4);
            s[8 + j % 4] |= (uint8_t)((l >> 4) << (2 * (j / 4)));
        }
        sb__put_f16(blk + f->off_d, 1 / iscale);
        return true;
    }
    case SCALES_Q6: {
        if (amax < GROUP_MAX_EPS)
            return false;
        const float iscale = -128.0f / max_scale;
        sb__put_f16(blk + f->off_d, 1 / iscale);
        for (int j = 0; j < nsub; j++)
            s[j] = (uint8_t)(int8_t)SB_MIN(127, sb__nearest_int(iscale * scales[j]));
        return true;
    }
    }
    return true;
}

/* 1. For each sub-block of the SEARCH_LANES / nsub consecutive blocks at x:
 *    the best float scale (and min) and quants for it. */
static void search_blocks(const kfmt *f, const float *x, float *scales, float *mins, uint8_t *L) {
    switch (f->search) {
    case SEARCH_QX: search_qx(f->bias, x, scales, L); break;
    case SEARCH_QKX2:
        SB_ASSERT(f->use_mad == (f->sub == 16)); /* Q2_K, or Q4_K and Q5_K */
        (f->use_mad ? search_qkx2_q2 : search_qkx2_q45)(f, x, scales, mins, L);
        break;
    case SEARCH_Q3: search_q3(f->bias, x, scales, L); break;
    }
}

/* 2-4. One block from its sub-blocks' search results; L is overwritten. */
static void finish_block(const kfmt *f, const float *x, const float *scales, const float *mins, uint8_t *L,
                         uint8_t *blk) {
    const int nsub = SB_QK_K / f->sub;
    memset(blk, 0, f->size);

    /* 2. Quantize the scales; Q6_K blocks of negligible scale stay all zero. */
    if (!encode_scales(f, blk, scales, mins))
        return;

    /* 3. Re-round each element against the scale it will be read back with;
     *    sub-blocks whose scale came out 0 keep the search's quants. */
    float dl[NSUB_MAX], ml[NSUB_MAX];
    block_scales(f, blk, dl, ml);
    for (int j = 0; j < nsub; j++) {
        if (dl[j] == 0.0f)
            continue;
        for (int i = f->sub * j; i < f->sub * (j + 1); i++) {
            /* (x + ml)/dl; without mins ml is 0 and x + 0 rounds the same as x */
            const int l = sb__nearest_int((x[i] + ml[j]) / dl[j]);
            L[i] = (uint8_t)(clamp_int(l, -f->bias, f->qmax - f->bias) + f->bias);
        }
    }

    /* 4. Pack. */
    pack_quants(f, blk, L);
}

/* Blocks are searched SEARCH_LANES sub-blocks at a time (two blocks of
 * Q4_K or Q5_K, one of the others); a row's odd last block is searched
 * beside zeros, whose results are dropped. */
static void quantize(const kfmt *f, const float *src, void *dst, int64_t n) {
    const int nsub = SB_QK_K / f->sub, per = SEARCH_LANES / nsub;
    const int64_t nb = n / SB_QK_K;
    float pad[2 * SB_QK_K], scales[SEARCH_LANES], mins[SEARCH_LANES];
    uint8_t L[2 * SB_QK_K];
    SB_ASSERT(per >= 1 && per <= 2 && per * nsub == SEARCH_LANES);
    for (int64_t b = 0; b < nb; b += per) {
        const int here = nb - b < per ? (int)(nb - b) : per;
        const float *x = src + b * SB_QK_K;
        if (here < per) {
            memcpy(pad, x, (size_t)here * SB_QK_K * sizeof(float));
            memset(pad + here * SB_QK_K, 0, (size_t)(per - here) * SB_QK_K * sizeof(float));
            x = pad;
        }
        memset(mins, 0, sizeof(mins));
        search_blocks(f, x, scales, mins, L);
        for (int k = 0; k < here; k++)
            finish_block(f, x + k * SB_QK_K, scales + k * nsub, mins + k * nsub, L + k * SB_QK_K,
                         (uint8_t *)dst + (size_t)(b + k) * f->size);
    }
}

void sb__q2_K_from_float_ref(const float *src, void *dst, int64_t n) { quantize(&fmt_q2_K, src, dst, n); }
void sb__q3_K_from_float_ref(const float *src, void *dst, int64_t n) { quantize(&fmt_q3_K, src, dst, n); }
void sb__q4_K_from_float_ref(const float *src, void *dst, int64_t n) { quantize(&fmt_q4_K, src, dst, n); }
void sb__q5_K_from_float_ref(const float *src, void *dst, int64_t n) { quantize(&fmt_q5_K, src, dst, n); }
void sb__q6_K_from_float_ref(const float *src, void *dst, int64_t n) { quantize(&fmt_q6_K, src, dst, n); }

/* quantize_row_q8_K_ref: d = max/-127 with max the first element of largest
 * magnitude, q = nearest-even(x * -127/max) (so max maps to -127), and the
 * sum of every 16 quants. */
void sb__q8_K_from_float_ref(const float *src, void *dst, int64_t n) {
    sb_block_q8_K *blk = dst;
    for (int64_t b = 0; b < n / SB_QK_K; b++, blk++, src += SB_QK_K) {
        float amax;
        const float max = signed_absmax(SB_QK_K, src, &amax);
        memset(blk, 0, sizeof(*blk));
        if (amax == 0)
            continue;
        const float iscale = -127.0f / max;
        for (int e = 0; e < SB_QK_K; e++)
            blk->qs[e] = (int8_t)SB_MIN(127, sb__nearest_int(iscale * src[e]));
        for (int j = 0; j < SB_QK_K / 16; j++) {
            int sum = 0;
            for (int e = 16 * j; e < 16 * (j + 1); e++)
                sum += blk->qs[e];
            blk->bsums[j] = (int16_t)sum;
        }
        blk->d = 1 / iscale;
    }
}

/* ---- dot products with Q8_K ---------------------------------------------- */

/*
 * The order of llama.cpp's repacked Q4_K kernels (ggml_gemv_q4_K_8x8_q8_K
 * and its gemm, what its x86 CPU backend runs Q4_K matrices with once it has
 * interleaved their rows at load), for every format: per block one exact
 * integer sum
 *   isum = sum_j sc_j * sum over sub-block j of (q - bias) * x
 * and, for the formats with mins, imin = sum_j m_j * (the activation
 * quants' sum over sub-block j, from bsums), then
 *   acc  = fma((float)isum, d_w*d_x, acc),  accm = fma((float)imin, dmin_w*d_x, accm),
 * and acc - accm at the end (acc alone without mins). One float step per
 * block and row is what lets a vector lane hold a whole row
 * (x86/kquants-x86.h), as for Q4_0. For Q4_K this is llama.cpp's own
 * arithmetic (test_ggml_oracle checks it bit for bit). For the others
 * llama.cpp's x86 backend runs its vec_dot kernels (8 float lanes per
 * block, a halving sum at the end; its repacked Q2_K only on AVX-512), so
 * our results differ from its in the last bits: the oracle test bounds the
 * difference, bench/check-distributions and tests/oracle/kquants.mjs
 * measure it end to end. |isum| < 2^31 for every format: at most
 * 16 * 128 * 16 * 32 * 128 (Q6_K).
 */
static float dot_block(const kfmt *f, int64_t n, const void *w, const void *x) {
    const uint8_t *wb = w;
    const sb_block_q8_K *xb = x;
    const bool mins = f->off_dmin >= 0;
    const int nsub = SB_QK_K / f->sub, bs_per_sub = f->sub / 16;
    float acc = 0, accm = 0;
    uint8_t q[SB_QK_K];
    int sc[NSUB_MAX], m[NSUB_MAX];
    for (int64_t b = 0; b < n / SB_QK_K; b++, wb += f->size, xb++) {
        unpack_scales(f, wb, sc, m);
        unpack_quants(f, wb, q);
        int32_t isum = 0, imin = 0;
        for (int j = 0; j < nsub; j++) {
            int32_t s = 0;
            for (int e = f->sub * j; e < f->sub * (j + 1); e++)
                s += (q[e] - f->bias) * xb->qs[e];
            isum += sc[j] * s;
            for (int k = j * bs_per_sub; k < (j + 1) * bs_per_sub; k++)
                imin += m[j] * xb->bsums[k];
        }
        acc = fmaf((float)isum, sb__get_f16(wb + f->off_d) * xb->d, acc);
        if (mins)
            accm = fmaf((float)imin, sb__get_f16(wb + f->off_dmin) * xb->d, accm);
    }
    return mins ? acc - accm : acc;
}

float sb__vec_dot_q2_K_q8_K_ref(int64_t n, const void *w, const void *x) { return dot_block(&fmt_q2_K, n, w, x); }
float sb__vec_dot_q3_K_q8_K_ref(int64_t n, const void *w, const void *x) { return dot_block(&fmt_q3_K, n, w, x); }
float sb__vec_dot_q4_K_q8_K_ref(int64_t n, const void *w, const void *x) { return dot_block(&fmt_q4_K, n, w, x); }
float sb__vec_dot_q5_K_q8_K_ref(int64_t n, const void *w, const void *x) { return dot_block(&fmt_q5_K, n, w, x); }
float sb__vec_dot_q6_K_q8_K_ref(int64_t n, const void *w, const void *x) { return dot_block(&fmt_q6_K, n, w, x); }
