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
#define GROUP_MAX_EPS 1e-15f    /* ggml: a sub-block with |x| below this is all zero */

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

void sb__q8_K_to_float(const void *src, float *dst, int64_t n) {
    const sb_block_q8_K *blk = src;
    for (int64_t b = 0; b < n / SB_QK_K; b++, blk++, dst += SB_QK_K)
        for (int e = 0; e < SB_QK_K; e++)
            dst[e] = blk->d * (float)blk->qs[e];
}

/* ---- the scale searches of ggml's reference quantizers ------------------ */

/* Round to nearest, ties to even, as ggml's nearest_int: adding 1.5*2^23
 * leaves the rounded integer in the low mantissa bits. Valid for
 * |v| <= 2^22 (ggml asserts it); outside that range (and for NaN) it
 * returns the same garbage ggml's does, which is the point. */
static int nearest_int(float v) {
    const float t = v + 12582912.0f;
    int32_t i;
    memcpy(&i, &t, sizeof(i));
    return (i & 0x007fffff) - 0x00400000;
}

static int clamp_int(int v, int lo, int hi) {
    v = v < lo ? lo : v;
    return v > hi ? hi : v;
}

/*
 * make_qkx2_quants: the scale and min of a sub-block of n elements with
 * quants 0..nmax and least weighted error sum(w * err(scale*L + min - x)),
 * err = |.| (use_mad) or squared. Starts from the range [min(x,0), max(x)]
 * cut in nmax steps, then tries nstep+1 other step counts nmax + rmin +
 * 0.1*is, each with the least-squares scale and min for its rounding.
 * Returns the scale; *neg_min = -min (>= 0). L gets the quants.
 */
static float search_qkx2(int n, int nmax, const float *x, const float *w, uint8_t *L, float *neg_min, float rmin,
                         int nstep, bool use_mad) {
    uint8_t Laux[32];
    float min = x[0], max = x[0];
    float sum_w = w[0], sum_x = sum_w * x[0];
    for (int i = 1; i < n; i++) {
        if (x[i] < min)
            min = x[i];
        if (x[i] > max)
            max = x[i];
        sum_w += w[i];
        sum_x += w[i] * x[i];
    }
    if (min > 0)
        min = 0;
    if (max == min) {
        memset(L, 0, (size_t)n);
        *neg_min = -min;
        return 0.0f;
    }
    float iscale = (float)nmax / (max - min);
    float scale = 1 / iscale;
    float best_error = 0;
    for (int i = 0; i < n; i++) {
        L[i] = (uint8_t)clamp_int(nearest_int(iscale * (x[i] - min)), 0, nmax);
        float diff = scale * (float)L[i] + min - x[i];
        diff = use_mad ? fabsf(diff) : diff * diff;
        best_error += w[i] * diff;
    }
    for (int is = 0; is <= nstep; is++) {
        iscale = (rmin + 0.1f * (float)is + (float)nmax) / (max - min);
        float sum_l = 0, sum_l2 = 0, sum_xl = 0;
        for (int i = 0; i < n; i++) {
            const int l = clamp_int(nearest_int(iscale * (x[i] - min)), 0, nmax);
            Laux[i] = (uint8_t)l;
            sum_l += w[i] * (float)l;
            sum_l2 += w[i] * (float)l * (float)l;
            sum_xl += w[i] * (float)l * x[i];
        }
        const float D = sum_w * sum_l2 - sum_l * sum_l;
        if (D > 0) {
            float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
            float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
            if (this_min > 0) {
                this_min = 0;
                this_scale = sum_xl / sum_l2;
            }
            float cur_error = 0;
            for (int i = 0; i < n; i++) {
                float diff = this_scale * (float)Laux[i] + this_min - x[i];
                diff = use_mad ? fabsf(diff) : diff * diff;
                cur_error += w[i] * diff;
            }
            if (cur_error < best_error) {
                memcpy(L, Laux, (size_t)n);
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    *neg_min = -min;
    return scale;
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
 * make_q3_quants with do_rmse: symmetric quants -nmax..nmax-1 (stored
 * +nmax), weights x^2. Starts from the scale that maps the largest-
 * magnitude element to -nmax, then up to 5 passes move single quants while
 * that raises sumlx^2/suml2 (the least-squares fit). All-zero input gives
 * L = 0 (not nmax) and scale 0, as ggml.
 */
static float search_q3(int n, int nmax, const float *x, uint8_t *L) {
    int8_t l8[16];
    float amax, max = signed_absmax(n, x, &amax);
    if (amax < GROUP_MAX_EPS) {
        memset(L, 0, (size_t)n);
        return 0.0f;
    }
    const float iscale = (float)-nmax / max;
    float sumlx = 0, suml2 = 0;
    for (int i = 0; i < n; i++) {
        l8[i] = (int8_t)clamp_int(nearest_int(iscale * x[i]), -nmax, nmax - 1);
        const float w = x[i] * x[i];
        sumlx += w * x[i] * (float)l8[i];
        suml2 += w * (float)l8[i] * (float)l8[i];
    }
    for (int itry = 0; itry < 5; itry++) {
        int n_changed = 0;
        for (int i = 0; i < n; i++) {
            const float w = x[i] * x[i];
            float slx = sumlx - w * x[i] * (float)l8[i];
            if (slx > 0) {
                float sl2 = suml2 - w * (float)l8[i] * (float)l8[i];
                const int new_l = clamp_int(nearest_int(x[i] * sl2 / slx), -nmax, nmax - 1);
                if (new_l != l8[i]) {
                    slx += w * x[i] * (float)new_l;
                    sl2 += w * (float)new_l * (float)new_l;
                    if (sl2 > 0 && slx * slx * suml2 > sumlx * sumlx * sl2) {
                        l8[i] = (int8_t)new_l;
                        sumlx = slx;
                        suml2 = sl2;
                        n_changed++;
                    }
                }
            }
        }
        if (!n_changed)
            break;
    }
    for (int i = 0; i < n; i++)
        L[i] = (uint8_t)(l8[i] + nmax);
    return suml2 > 0.0f ? sumlx / suml2 : 0.0f;
}

/*
 * make_qx_quants with rmse_type 1 and no importance weights, for the 16
 * sub-blocks of 16 elements of a block at once (Q6_K's): symmetric quants
 * -nmax..nmax-1 (stored +nmax), weights x^2. Per sub-block it starts from
 * the scale that maps the largest-magnitude element to -nmax, then tries
 * -(nmax + 0.1*is), is = -9..9, keeping a rounding only if its
 * least-squares fit is better. All-zero input gives L = 0 and scale 0.
 *
 * A sub-block is a vector lane: the loops over sub-blocks j are the inner
 * ones, and each lane does ggml's operations on its sub-block in ggml's
 * order, so every vector width writes ggml's bytes (the search was 90% of
 * quantizing to Q6_K, one sub-block at a time).
 */
#define QX_N 16 /* sub-blocks per block, and elements per sub-block */

/* One candidate scale per sub-block: the rounded quants and the weighted
 * sums sum(w*x*l), sum(w*l*l), w = x^2. xt[i][j]: element i of sub-block j. */
static inline void qx_fit(int nmax, const float xt[restrict QX_N][QX_N], const float iscale[restrict QX_N],
                          int32_t l[restrict QX_N][QX_N], float sumlx[restrict QX_N], float suml2[restrict QX_N]) {
    for (int j = 0; j < QX_N; j++)
        sumlx[j] = suml2[j] = 0;
    for (int i = 0; i < QX_N; i++)
        for (int j = 0; j < QX_N; j++) {
            const float x = xt[i][j];
            const int q = clamp_int(nearest_int(iscale[j] * x), -nmax, nmax - 1);
            l[i][j] = q;
            const float w = x * x;
            sumlx[j] += w * x * (float)q;
            suml2[j] += w * (float)q * (float)q;
        }
}

SB_VECTOR_CLONES static void search_qx(int nmax, const float *x, float scale[QX_N], uint8_t *L) {
    float xt[QX_N][QX_N], max[QX_N], amax[QX_N], iscale[QX_N], sumlx[QX_N], suml2[QX_N], best[QX_N];
    int32_t l[QX_N][QX_N], lt[QX_N][QX_N]; /* int32, not bytes: lanes as wide as the floats' */
    for (int i = 0; i < QX_N; i++)
        for (int j = 0; j < QX_N; j++)
            xt[i][j] = x[QX_N * j + i];
    /* signed_absmax, lane by lane */
    for (int j = 0; j < QX_N; j++)
        max[j] = amax[j] = 0;
    for (int i = 0; i < QX_N; i++)
        for (int j = 0; j < QX_N; j++) {
            const float ax = fabsf(xt[i][j]);
            const bool more = ax > amax[j];
            max[j] = more ? xt[i][j] : max[j];
            amax[j] = more ? ax : amax[j];
        }

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
            s[j] = (uint8_t)((unsigned)nearest_int(iscale * scales[j]) | (unsigned)nearest_int(imin * mins[j]) << 4);
        sb__put_f16(blk + f->off_d, max_scale > 0 ? max_scale / 15.0f : 0.0f);
        sb__put_f16(blk + f->off_dmin, max_min > 0 ? max_min / 15.0f : 0.0f);
        return true;
    }
    case SCALES_K4: {
        const float iscale = max_scale > 0 ? 63.0f / max_scale : 0.0f;
        const float imin = max_min > 0 ? 63.0f / max_min : 0.0f;
        for (int j = 0; j < nsub; j++) {
            const uint8_t ls = SB_MIN(63, (uint8_t)nearest_int(iscale * scales[j]));
            const uint8_t lm = SB_MIN(63, (uint8_t)nearest_int(imin * mins[j]));
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
            const int8_t l8 = (int8_t)nearest_int(iscale * scales[j]);
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
            s[j] = (uint8_t)(int8_t)SB_MIN(127, nearest_int(iscale * scales[j]));
        return true;
    }
    }
    return true;
}

/* Step 1 of quantize_block for the searches that go sub-block by sub-block:
 * the scale (and min) of the n = f->sub elements at xs, and their quants. */
static void search_sub_block(const kfmt *f, const float *xs, float *scale, float *min, uint8_t *Ls) {
    if (f->search == SEARCH_Q3) {
        *scale = search_q3(f->sub, f->bias, xs, Ls);
        return;
    }
    float w[32];
    if (f->use_mad) { /* Q2_K: weights |x| */
        for (int i = 0; i < f->sub; i++)
            w[i] = fabsf(xs[i]);
    } else { /* Q4_K, Q5_K: weights rms(x) + |x| */
        float sum_x2 = 0;
        for (int i = 0; i < f->sub; i++)
            sum_x2 += xs[i] * xs[i];
        const float av_x = sqrtf(sum_x2 / (float)f->sub);
        for (int i = 0; i < f->sub; i++)
            w[i] = av_x + fabsf(xs[i]);
    }
    *scale = search_qkx2(f->sub, f->qmax, xs, w, Ls, min, f->rmin, f->nstep, f->use_mad);
}

static void quantize_block(const kfmt *f, const float *x, uint8_t *blk) {
    const int nsub = SB_QK_K / f->sub;
    uint8_t L[SB_QK_K];
    float scales[NSUB_MAX], mins[NSUB_MAX] = {0};
    memset(blk, 0, f->size);

    /* 1. Per sub-block: the best float scale (and min) and quants for it. */
    if (f->search == SEARCH_QX)
        search_qx(f->bias, x, scales, L); /* every sub-block at once */
    else
        for (int j = 0; j < nsub; j++)
            search_sub_block(f, x + f->sub * j, &scales[j], &mins[j], L + f->sub * j);

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
            const int l = nearest_int((x[i] + ml[j]) / dl[j]);
            L[i] = (uint8_t)(clamp_int(l, -f->bias, f->qmax - f->bias) + f->bias);
        }
    }

    /* 4. Pack. */
    pack_quants(f, blk, L);
}

static void quantize(const kfmt *f, const float *src, void *dst, int64_t n) {
    uint8_t *blk = dst;
    for (int64_t b = 0; b < n / SB_QK_K; b++, blk += f->size, src += SB_QK_K)
        quantize_block(f, src, blk);
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
            blk->qs[e] = (int8_t)SB_MIN(127, nearest_int(iscale * src[e]));
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
