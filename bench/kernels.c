/*
 * bench/kernels.c - micro-benchmark of the gemm kernels at each ISA level
 * this CPU runs, one thread. Not a test: it prints numbers for
 * docs/PERFORMANCE.md.
 *
 *   bench_kernels [n_in [n_out [n_tok [types]]]]
 *     defaults 2048 5632 512, all types; types is a list like q4_0,q8_0,f16
 *
 * Decode (one token): GB/s of weights streamed, twice: "hot" re-reads one
 * matrix (it fits a large L3), "cold" walks distinct copies spanning about
 * 1 GiB so the weights come from DRAM as in a real model. Prompt (n_tok
 * tokens): GFLOP/s, 2*n_in*n_out*n_tok per call; the scalar level runs on
 * fewer rows to keep it short. Outputs are checked against the scalar level
 * on the way.
 *
 * Environment: SB_BENCH_CPUTIME=1 times with this thread's CPU time (steadier
 * on a shared machine); SB_BENCH_PROMPT=1 runs the prompt figure only;
 * SB_BENCH_CHUNK=rows makes the prompt calls that many rows each, like
 * matmul's chunks (default: all rows in one call); SB_BENCH_COLD=1 gives
 * each prompt call a different copy of the weights, so that they come from
 * DRAM as in a model's forward pass; SB_BENCH_SPAN_MB=N makes the copies
 * span N MiB instead of 1 GiB (does a working set of that size stay in the
 * last-level cache between passes?).
 *
 * A level that packs the type (sb_kernels.packing, done once when a model
 * loads) gets a second line, "<level>+p", measured on packed copies.
 */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tensor/tensor.h"

/* Wall time; or this thread's CPU time with SB_BENCH_CPUTIME=1, steadier
 * on a shared machine (time spent descheduled is not counted). */
static double now(void) {
    static int cputime = -1;
    struct timespec ts;
    if (cputime < 0)
        cputime = getenv("SB_BENCH_CPUTIME") && atoi(getenv("SB_BENCH_CPUTIME")) == 1;
    clock_gettime(cputime ? CLOCK_THREAD_CPUTIME_ID : CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static uint64_t rng = 88172645463325252ull;
static uint64_t rnd(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}
static float rnd_float(void) { return (float)((double)(rnd() >> 11) * 0x1p-52 - 1.0); }

/* A weight matrix of `type`: random floats through the type's quantizer. */
static void make_weights(sb_type type, int64_t n, int64_t rows, uint8_t *dst) {
    const sb_type_traits *t = sb_type_traits_of(type);
    const size_t rs = sb_type_row_size(type, n);
    float *src = malloc((size_t)n * sizeof(float));
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t i = 0; i < n; i++)
            src[i] = rnd_float();
        t->from_float(src, dst + (size_t)r * rs, n);
    }
    free(src);
}

static const sb_type types[] = {SB_TYPE_Q4_0, SB_TYPE_Q4_1, SB_TYPE_Q5_0, SB_TYPE_Q5_1,
                                SB_TYPE_Q8_0, SB_TYPE_F16,  SB_TYPE_BF16, SB_TYPE_F32,
                                SB_TYPE_Q4_K, SB_TYPE_Q6_K, SB_TYPE_Q5_K, SB_TYPE_Q2_K, SB_TYPE_Q3_K,
                                SB_TYPE_IQ4_NL, SB_TYPE_IQ4_XS};

int main(int argc, char **argv) {
    const int64_t n = argc > 1 ? atoll(argv[1]) : 2048;
    const int64_t nr = argc > 2 ? atoll(argv[2]) : 5632;
    const int64_t nt = argc > 3 ? atoll(argv[3]) : 512;
    /* SB_BENCH_PROMPT=1: the prompt figure only (no decode runs, no cold copies). */
    const bool prompt_only = getenv("SB_BENCH_PROMPT") && atoi(getenv("SB_BENCH_PROMPT")) == 1;
    /* SB_BENCH_CHUNK=rows: prompt calls of that many rows each, as matmul's chunks (default: all rows at once). */
    const int64_t chunk_rows = getenv("SB_BENCH_CHUNK") && atoll(getenv("SB_BENCH_CHUNK")) > 0 ? atoll(getenv("SB_BENCH_CHUNK")) : nr;
    /* SB_BENCH_COLD=1: each prompt call on a different copy of the weights (from DRAM, as in a model). */
    const bool prompt_cold = getenv("SB_BENCH_COLD") && atoi(getenv("SB_BENCH_COLD")) == 1;
    /* SB_BENCH_SPAN_MB=N: the cold copies span N MiB instead of 1 GiB (a working set that may stay
     * in a last-level cache between passes, as a thread's share of a model's layers might). */
    const long span_mb = getenv("SB_BENCH_SPAN_MB") && atol(getenv("SB_BENCH_SPAN_MB")) > 0
                             ? atol(getenv("SB_BENCH_SPAN_MB"))
                             : 1024;
    const size_t cold_bytes = prompt_only && !prompt_cold ? 0 : (size_t)span_mb << 20;
    printf("gemm kernels, one thread, n_in=%lld n_out=%lld, prompt n_tok=%lld\n", (long long)n, (long long)nr,
           (long long)nt);
    printf("%-7s %-6s %12s %12s %14s\n", "level", "type", "decode hot", "decode cold", "prompt");
    for (size_t ti = 0; ti < sizeof(types) / sizeof(types[0]); ti++) {
        const sb_type type = types[ti];
        if (argc > 4 && !strstr(argv[4], sb_type_traits_of(type)->name))
            continue;
        const sb_type_traits *t = sb_type_traits_of(type), *xt = sb_type_traits_of(t->vec_dot_type);
        const size_t ws = sb_type_row_size(type, n), x_plain = sb_type_row_size(t->vec_dot_type, n);
        /* Room for a packed layout's terms after each activation row. */
        size_t xs = x_plain;
        for (int lv = 0; lv < SB_CPU_LEVEL_COUNT; lv++) {
            const sb_kernels *k = sb_kernels_for((sb_cpu_level)lv);
            const size_t row = x_plain + (k ? (size_t)(n / t->blck_size) * k->packing[type].term_bytes : 0);
            xs = row > xs ? row : xs;
        }
        const size_t mat = ws * (size_t)nr;
        const size_t copies = cold_bytes / mat > 1 ? cold_bytes / mat : 2;
        uint8_t *wf = malloc(mat * copies), *x = malloc(xs * (size_t)nt);
        float *src = malloc((size_t)n * sizeof(float));
        float *y = malloc(sizeof(float) * (size_t)nr * (size_t)nt), *y_ref = malloc(sizeof(float) * (size_t)nr);
        if (!wf || !x || !src || !y || !y_ref) {
            fprintf(stderr, "out of memory\n");
            return 1;
        }
        make_weights(type, n, nr, wf);
        for (size_t c = 1; c < copies; c++) /* copies, so the page cache can't share them */
            memcpy(wf + c * mat, wf, mat);
        for (int64_t tk = 0; tk < nt; tk++) {
            for (int64_t i = 0; i < n; i++)
                src[i] = rnd_float();
            xt->act_from_float(src, x + (size_t)tk * xs, n);
        }
        sb_kernels_for(SB_CPU_SCALAR)->gemm[type](n, wf, ws, nr, x, xs, 1, y_ref, (size_t)nr);

        for (int variant = 0; variant < 2 * SB_CPU_LEVEL_COUNT; variant++) {
            const int lv = variant / 2;
            const bool packed = variant % 2;
            const sb_kernels *k = sb_kernels_for((sb_cpu_level)lv);
            if (!k || (packed && (k->packing[type].rows == 0 || nr % k->packing[type].rows != 0)))
                continue;
            const sb_gemm_fn g = packed ? k->packing[type].gemm : k->gemm[type];
            uint8_t *w = packed ? malloc(mat * copies) : wf;
            if (!w) {
                fprintf(stderr, "out of memory\n");
                return 1;
            }
            for (size_t c = 0; packed && c < copies; c++)
                k->packing[type].pack(wf + c * mat, w + c * mat, n, nr);
            for (int64_t tk = 0; packed && k->packing[type].terms && tk < nt; tk++)
                k->packing[type].terms(x + (size_t)tk * xs, n, x + (size_t)tk * xs + x_plain);
            /* Packed calls start at a group. */
            const int64_t chunk = packed ? (chunk_rows + k->packing[type].rows - 1) / k->packing[type].rows *
                                               k->packing[type].rows
                                         : chunk_rows;
            g(n, w, ws, nr, x, xs, 1, y, (size_t)nr);
            if (memcmp(y, y_ref, sizeof(float) * (size_t)nr) != 0)
                printf("  (%s %s differs from scalar!)\n", sb_cpu_level_name(k->level), t->name);

            /* Each figure is the best of 5 runs: the machine may be shared. */
            double hot = 0, cold = 0, gflops = 0;
            const int64_t pr = lv == SB_CPU_SCALAR ? (nr < 64 ? nr : 64) : nr; /* prompt rows */
            for (int run = 0; run < 5; run++) {
                int reps = 0;
                double t0, el;
                if (prompt_only)
                    goto prompt;
                /* Decode, hot: the same matrix again and again. */
                t0 = now();
                do {
                    g(n, w, ws, nr, x, xs, 1, y, (size_t)nr);
                    reps++;
                } while ((el = now() - t0) < 0.1);
                hot = fmax(hot, (double)mat * reps / el * 1e-9);
                /* Decode, cold: a different copy each call. */
                reps = 0;
                t0 = now();
                do {
                    g(n, w + (size_t)((run * 7 + reps) % (int)copies) * mat, ws, nr, x, xs, 1, y, (size_t)nr);
                    reps++;
                } while ((el = now() - t0) < 0.2);
                cold = fmax(cold, (double)mat * reps / el * 1e-9);
            prompt:
                /* Prompt: nt tokens at once. */
                reps = 0;
                t0 = now();
                do {
                    const uint8_t *wc = w + (prompt_cold ? (size_t)((run * 7 + reps) % (int)copies) * mat : 0);
                    for (int64_t r0 = 0; r0 < pr; r0 += chunk)
                        g(n, wc + (size_t)r0 * ws, ws, pr - r0 < chunk ? pr - r0 : chunk, x, xs, nt, y + r0, (size_t)pr);
                    reps++;
                } while ((el = now() - t0) < 0.2);
                gflops = fmax(gflops, 2.0 * (double)n * (double)pr * (double)nt * reps / el * 1e-9);
            }
            char name[16];
            snprintf(name, sizeof(name), "%s%s", sb_cpu_level_name(k->level), packed ? "+p" : "");
            printf("%-7s %-6s %8.1f GB/s %8.1f GB/s %8.1f GFLOP/s\n", name, t->name, hot, cold, gflops);
            fflush(stdout);
            if (packed)
                free(w);
        }
        free(wf);
        free(x);
        free(src);
        free(y);
        free(y_ref);
    }
    return 0;
}
