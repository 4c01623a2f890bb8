/*
 * cpu.c - the kernel dispatch table: which ISA level this CPU runs (CPUID
 * and XGETBV, capped by SB_CPU), and one table of gemm / activation kernels
 * per level, built once.
 *
 * The scalar level is the type table's reference kernels (a gemm that calls
 * vec_dot per output); the x86 levels start as a copy of it and override the
 * entries they have SIMD kernels for, so a type without a SIMD kernel (yet)
 * still works at every level.
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "tensor/tensor-impl.h"

#if defined(__x86_64__)
#include <cpuid.h>
#endif
#include <unistd.h>
#if defined(__linux__)
#include <sys/syscall.h>
#endif

/* ---- scalar level ------------------------------------------------------ */

/* Row-outer: a weight row is read once for all tokens. */
static void gemm_ref(sb_vec_dot_fn dot, int64_t n, const void *w, size_t w_stride, int64_t nr, const void *x,
                     size_t x_stride, int64_t nt, float *y, size_t ldy) {
    for (int64_t r = 0; r < nr; r++) {
        const char *wr = (const char *)w + (size_t)r * w_stride;
        for (int64_t t = 0; t < nt; t++)
            y[(size_t)t * ldy + (size_t)r] = dot(n, wr, (const char *)x + (size_t)t * x_stride);
    }
}

/* sb_gemm_fn carries no type, so the scalar level has one small wrapper per
 * type id around its vec_dot; entries are used only where the type table
 * has a vec_dot, so types gaining one later get a scalar gemm for free. */
#define GEMM_REF(id)                                                                                             \
    static void gemm_ref_##id(int64_t n, const void *w, size_t ws, int64_t nr, const void *x, size_t xs,        \
                              int64_t nt, float *y, size_t ldy) {                                               \
        gemm_ref(sb_type_traits_of(id)->vec_dot, n, w, ws, nr, x, xs, nt, y, ldy);                              \
    }
#define GEMM_REF_10(d)                                                                                           \
    GEMM_REF(d##0) GEMM_REF(d##1) GEMM_REF(d##2) GEMM_REF(d##3) GEMM_REF(d##4) GEMM_REF(d##5) GEMM_REF(d##6)     \
        GEMM_REF(d##7) GEMM_REF(d##8) GEMM_REF(d##9)
GEMM_REF(0) GEMM_REF(1) GEMM_REF(2) GEMM_REF(3) GEMM_REF(4) GEMM_REF(5) GEMM_REF(6) GEMM_REF(7) GEMM_REF(8)
GEMM_REF(9) GEMM_REF_10(1) GEMM_REF_10(2) GEMM_REF_10(3)

static const sb_gemm_fn gemm_ref_by_id[] = {
    gemm_ref_0,  gemm_ref_1,  gemm_ref_2,  gemm_ref_3,  gemm_ref_4,  gemm_ref_5,  gemm_ref_6,  gemm_ref_7,
    gemm_ref_8,  gemm_ref_9,  gemm_ref_10, gemm_ref_11, gemm_ref_12, gemm_ref_13, gemm_ref_14, gemm_ref_15,
    gemm_ref_16, gemm_ref_17, gemm_ref_18, gemm_ref_19, gemm_ref_20, gemm_ref_21, gemm_ref_22, gemm_ref_23,
    gemm_ref_24, gemm_ref_25, gemm_ref_26, gemm_ref_27, gemm_ref_28, gemm_ref_29, gemm_ref_30, gemm_ref_31,
    gemm_ref_32, gemm_ref_33, gemm_ref_34, gemm_ref_35, gemm_ref_36, gemm_ref_37, gemm_ref_38, gemm_ref_39,
};
_Static_assert(sizeof(gemm_ref_by_id) / sizeof(gemm_ref_by_id[0]) == SB_TYPE_COUNT, "one wrapper per type id");

/* The references for every KV-cache type: rows dequantized by the type's
 * to_float (a piece at a time), then multiplied and added, rounded
 * separately; rows converted by the type's act_from_float. */
#define AXPY_PIECE 1024 /* a multiple of every block size */
static void axpy_ref(sb_type type, int64_t n, int64_t nr, const float *a, const void *x, size_t x_stride, float *y) {
    const sb_type_traits *t = sb_type_traits_of(type);
    float v[AXPY_PIECE];
    for (int64_t r = 0; r < nr; r++)
        for (int64_t i0 = 0; i0 < n; i0 += AXPY_PIECE) {
            const int64_t len = n - i0 < AXPY_PIECE ? n - i0 : AXPY_PIECE;
            t->to_float((const char *)x + (size_t)r * x_stride + sb_type_row_size(type, i0), v, len);
            for (int64_t i = 0; i < len; i++)
                y[i0 + i] += a[r] * v[i];
        }
}

static void store_rows_ref(sb_type type, int64_t n, int64_t nr, const float *src, void *dst, size_t dst_stride) {
    for (int64_t r = 0; r < nr; r++)
        sb_type_traits_of(type)->act_from_float(src + (size_t)r * (size_t)n, (char *)dst + (size_t)r * dst_stride, n);
}

#define KV_REF(name, id)                                                                                          \
    static void axpy_ref_##name(int64_t n, int64_t nr, const float *a, const void *x, size_t xs, float *y) {    \
        axpy_ref(id, n, nr, a, x, xs, y);                                                                         \
    }                                                                                                             \
    static void store_rows_ref_##name(int64_t n, int64_t nr, const float *src, void *dst, size_t ds) {          \
        store_rows_ref(id, n, nr, src, dst, ds);                                                                  \
    }
KV_REF(f32, SB_TYPE_F32)
KV_REF(f16, SB_TYPE_F16)
KV_REF(q8_0, SB_TYPE_Q8_0)

static void fill_scalar(sb_kernels *k) {
    memset(k, 0, sizeof(*k));
    k->level = SB_CPU_SCALAR;
    k->axpy[SB_TYPE_F32] = axpy_ref_f32;
    k->axpy[SB_TYPE_F16] = axpy_ref_f16;
    k->axpy[SB_TYPE_Q8_0] = axpy_ref_q8_0;
    k->store_rows[SB_TYPE_F32] = store_rows_ref_f32;
    k->store_rows[SB_TYPE_F16] = store_rows_ref_f16;
    k->store_rows[SB_TYPE_Q8_0] = store_rows_ref_q8_0;
    k->swiglu = sb__swiglu_ref;
    k->softmax = sb__softmax_ref;
    for (uint32_t id = 0; id < SB_TYPE_COUNT; id++) {
        const sb_type_traits *t = sb_type_traits_of(id);
        if (!t)
            continue;
        if (t->vec_dot)
            k->gemm[id] = gemm_ref_by_id[id];
        k->act_from_float[id] = t->act_from_float;
    }
}

/* ---- CPU detection ----------------------------------------------------- */

#if defined(__x86_64__)
/* XCR0: which register states the OS saves on a context switch. */
static uint64_t xgetbv0(void) {
    uint32_t eax, edx;
    __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
    return (uint64_t)edx << 32 | eax;
}

/* GFNI (one byte-wise bit-matrix product): CPUID leaf 7, ECX bit 8. */
static bool detect_gfni(void) {
    unsigned a, b, c, d;
    return __get_cpuid_count(7, 0, &a, &b, &c, &d) && (c >> 8 & 1);
}

/* AMX-INT8 tiles: CPUID leaf 7 EDX bits 24 (AMX-TILE) and 25 (AMX-INT8),
 * the OS saving the tile state (XCR0 bits 17, 18), and Linux's permission
 * for this process to use it (arch_prctl ARCH_REQ_XCOMP_PERM, once; a
 * kernel that refuses leaves the AVX-512 level, and says so in the log). */
static bool detect_amx(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !(d >> 24 & 1) || !(d >> 25 & 1))
        return false;
    if ((xgetbv0() & 0x60000) != 0x60000)
        return false;
#if defined(__linux__)
    enum { ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18 };
    if (syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0)
        return true;
    sb__log(SB_LOG_WARN, "the CPU has AMX tiles but the kernel refused this process their state (arch_prctl: %s); "
                         "running the avx512 level", strerror(errno));
    return false;
#else
    return false;
#endif
}

static sb_cpu_level detect_level(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d))
        return SB_CPU_SCALAR;
    const bool fma = c >> 12 & 1, osxsave = c >> 27 & 1, avx = c >> 28 & 1, f16c = c >> 29 & 1;
    if (!osxsave || !avx)
        return SB_CPU_SCALAR;
    const uint64_t xcr0 = xgetbv0();
    if ((xcr0 & 0x6) != 0x6) /* SSE and AVX state */
        return SB_CPU_SCALAR;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d))
        return SB_CPU_SCALAR;
    const bool avx2 = b >> 5 & 1, f = b >> 16 & 1, bw = b >> 30 & 1, vl = b >> 31 & 1, vnni = c >> 11 & 1;
    if (!avx2 || !fma || !f16c)
        return SB_CPU_SCALAR;
    if (f && bw && vl && vnni && (xcr0 & 0xe0) == 0xe0) /* opmask, ZMM0-15 upper halves, ZMM16-31 */
        return detect_gfni() && detect_amx() ? SB_CPU_AMX : SB_CPU_AVX512;
    return SB_CPU_AVX2;
}
#else
static sb_cpu_level detect_level(void) { return SB_CPU_SCALAR; }
#endif

/* Single-token tiles (decoding) prefetch differently while a model larger
 * than the last-level cache is loaded, on Intel (kernels-x86.h, pf_to_l2):
 * there the L1 copy of the next group of rows (tens of KB ahead) of weights
 * that stream from DRAM was evicted before its use (AMX VM, 1.1B tg: Q8_0
 * 23.1/22.5 -> 25.5/24.7 t/s into L2, Q4_K_M 37.0/37.8 -> 41.5/41.7), while
 * a model the L3 holds (110M, 480 MB L3) decoded 2-10% slower so. Batches
 * keep L1 (3-5% slower into L2), and so do other CPUs (the Zen 5 VMs were
 * tuned with L1). A count of such models loaded, so that it ends with the
 * last one's unloading. */
atomic_int sb__decode_from_dram;

static bool cpu_is_intel(void) {
#if defined(__x86_64__)
    unsigned a, b, c, d; /* CPUID leaf 0's vendor string, "GenuineIntel" */
    return __get_cpuid(0, &a, &b, &c, &d) && b == 0x756e6547 && d == 0x49656e69 && c == 0x6c65746e;
#else
    return false;
#endif
}

static bool streams_from_dram(size_t bytes) {
    long llc = sysconf(_SC_LEVEL3_CACHE_SIZE);
    if (llc <= 0)
        llc = sysconf(_SC_LEVEL2_CACHE_SIZE);
    return llc > 0 && bytes > (size_t)llc && cpu_is_intel();
}

void sb_kernels_weights_loaded(size_t bytes) {
    if (streams_from_dram(bytes))
        atomic_fetch_add_explicit(&sb__decode_from_dram, 1, memory_order_relaxed);
}

void sb_kernels_weights_unloaded(size_t bytes) {
    if (streams_from_dram(bytes))
        atomic_fetch_sub_explicit(&sb__decode_from_dram, 1, memory_order_relaxed);
}

/* ---- the tables -------------------------------------------------------- */

static pthread_once_t once = PTHREAD_ONCE_INIT;
static sb_kernels tables[SB_CPU_LEVEL_COUNT];
static sb_cpu_level cpu_level;    /* best level this CPU runs */
static sb_cpu_level active_level; /* cpu_level capped by SB_CPU */

static const char *const level_names[SB_CPU_LEVEL_COUNT] = {"scalar", "avx2", "avx512", "amx"};

const char *sb_cpu_level_name(sb_cpu_level level) {
    return (int)level >= 0 && (int)level < SB_CPU_LEVEL_COUNT ? level_names[level] : "?";
}

static void init(void) {
    cpu_level = detect_level();
    fill_scalar(&tables[SB_CPU_SCALAR]);
#if defined(__x86_64__)
    if (cpu_level >= SB_CPU_AVX2) {
        tables[SB_CPU_AVX2] = tables[SB_CPU_SCALAR];
        tables[SB_CPU_AVX2].level = SB_CPU_AVX2;
        sb__kernels_fill_avx2(&tables[SB_CPU_AVX2]);
    }
    if (cpu_level >= SB_CPU_AVX512) {
        tables[SB_CPU_AVX512] = tables[SB_CPU_SCALAR];
        tables[SB_CPU_AVX512].level = SB_CPU_AVX512;
        tables[SB_CPU_AVX512].gfni = detect_gfni();
        sb__kernels_fill_avx512(&tables[SB_CPU_AVX512]);
    }
    if (cpu_level >= SB_CPU_AMX) {
        tables[SB_CPU_AMX] = tables[SB_CPU_AVX512];
        tables[SB_CPU_AMX].level = SB_CPU_AMX;
        sb__kernels_fill_amx(&tables[SB_CPU_AMX]);
    }
#endif
    active_level = cpu_level;
    const char *env = getenv("SB_CPU");
    if (env && *env) {
        int want = -1;
        for (int i = 0; i < SB_CPU_LEVEL_COUNT; i++)
            if (strcmp(env, level_names[i]) == 0)
                want = i;
        if (want < 0)
            sb__log(SB_LOG_WARN, "SB_CPU=%s is not scalar, avx2, avx512 or amx; using %s", env, level_names[cpu_level]);
        else if (want > (int)cpu_level)
            sb__log(SB_LOG_WARN, "SB_CPU=%s but this CPU runs at most %s; using %s", env, level_names[cpu_level],
                    level_names[cpu_level]);
        else
            active_level = (sb_cpu_level)want;
    }
}

const sb_kernels *sb_kernels_active(void) {
    pthread_once(&once, init);
    return &tables[active_level];
}

const sb_kernels *sb_kernels_for(sb_cpu_level level) {
    pthread_once(&once, init);
    if ((int)level < 0 || (int)level > (int)cpu_level)
        return NULL;
    return &tables[level];
}
