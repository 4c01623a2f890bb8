/*
 * cmd_bench.c - `switchboard bench`: prompt-processing and generation speed,
 * in the manner of llama-bench, so the two engines can be compared figure for
 * figure.
 *
 *   pp<P>  P tokens (BOS, then P-1 pseudo-random ids from a fixed seed) in one
 *          sb_ctx_eval call on an empty context. t/s = P / eval time;
 *          ttft_ms = the eval time (time to process the prompt).
 *   tg<N>  a 16-token prompt (BOS + 15 pseudo-random ids), then N single-token
 *          evals, each feeding back the greedy argmax of the previous logits.
 *          t/s = N / total time of the N evals (the prompt and the argmax are
 *          not timed); ttft_ms = prompt eval + the first single-token eval.
 *
 * Every test runs once to warm up (page in the weights, touch the KV cache)
 * and then REPS times, each on the same context after sb_ctx_reset (an empty
 * KV cache, as llama-bench clears its memory between repetitions). Reported:
 * the median, min and max of t/s over the repetitions and the median ttft.
 * peak_rss_mb is getrusage's ru_maxrss after the test (process-wide peak).
 * The type column is the file's general.file_type, named as llama.cpp names
 * its quantizer targets. With --progress, each run (rep=0 is the warm-up)
 * prints a "bench-progress test=... rep=... secs=... t_s=..." line to stderr,
 * so a caller that has to kill a slow run still learns its speed.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "cli/cli.h"
#include "gguf/gguf.h"
#include "switchboard.h"

#define TG_PROMPT 16

typedef struct bench_opts {
    const char *model;
    int32_t n_prompt, n_gen, n_threads, reps;
    sb_cache_type cache_type;
    bool json, progress;
} bench_opts;

/* One finished test: a row of the table or an object of the JSON array. */
typedef struct bench_result {
    char test[32];
    double ts_median, ts_min, ts_max, ttft_ms, rss_mb;
} bench_result;

/* What the file says about itself, read with the GGUF reader. */
typedef struct model_desc {
    char type[32];
    double size_mib;
    uint64_t n_params;
} model_desc;

static void parse_opts(int argc, char **argv, bench_opts *o) {
    const char *v;
    for (int i = 1; i < argc; i++) {
        if (sb_cli_end_of_options(argc, argv, i, NULL))
            break;
        if (sb_cli_opt(argc, argv, &i, "-m", &o->model) || sb_cli_opt(argc, argv, &i, "--model", &o->model))
            continue;
        if (sb_cli_opt(argc, argv, &i, "-p", &v) || sb_cli_opt(argc, argv, &i, "--n-prompt", &v))
            o->n_prompt = (int32_t)sb_cli_int("-p", v, 0, 1 << 20);
        else if (sb_cli_opt(argc, argv, &i, "-n", &v) || sb_cli_opt(argc, argv, &i, "--n-gen", &v))
            o->n_gen = (int32_t)sb_cli_int("-n", v, 0, 1 << 20);
        else if (sb_cli_opt(argc, argv, &i, "-t", &v) || sb_cli_opt(argc, argv, &i, "--threads", &v))
            o->n_threads = (int32_t)sb_cli_int("-t", v, 1, 1024);
        else if (sb_cli_opt(argc, argv, &i, "-r", &v) || sb_cli_opt(argc, argv, &i, "--repetitions", &v))
            o->reps = (int32_t)sb_cli_int("-r", v, 1, 1000);
        else if (sb_cli_opt(argc, argv, &i, "--cache-type", &v))
            o->cache_type = sb_cli_cache_type("--cache-type", v);
        else if (sb_cli_opt(argc, argv, &i, "-o", &v) || sb_cli_opt(argc, argv, &i, "--output", &v)) {
            if (strcmp(v, "json") != 0 && strcmp(v, "table") != 0) {
                fprintf(stderr, "switchboard bench: option -o: '%s' is not 'table' or 'json'\n", v);
                exit(SB_EXIT_USAGE);
            }
            o->json = strcmp(v, "json") == 0;
        } else if (strcmp(argv[i], "--progress") == 0)
            o->progress = true;
        else {
            fprintf(stderr, "switchboard bench: unknown option '%s' (see 'switchboard --help')\n", argv[i]);
            exit(SB_EXIT_USAGE);
        }
    }
    if (!o->model) {
        fputs("usage: switchboard bench -m FILE [-p 512] [-n 128] [-t THREADS] [-r REPS] [-o table|json] [--progress]\n",
              stderr);
        exit(SB_EXIT_USAGE);
    }
}

/* llama.cpp's names for general.file_type (enum llama_ftype). */
static const char *ftype_name(uint32_t ft) {
    static const char *const names[] = {
        [0] = "f32",      [1] = "f16",      [2] = "q4_0",    [3] = "q4_1",    [4] = "q4_1_some_f16",
        [7] = "q8_0",     [8] = "q5_0",     [9] = "q5_1",    [10] = "q2_k",   [11] = "q3_k_s",
        [12] = "q3_k_m",  [13] = "q3_k_l",  [14] = "q4_k_s", [15] = "q4_k_m", [16] = "q5_k_s",
        [17] = "q5_k_m",  [18] = "q6_k",    [19] = "iq2_xxs", [20] = "iq2_xs", [21] = "q2_k_s",
        [22] = "iq3_xs",  [23] = "iq3_xxs", [24] = "iq1_s",  [25] = "iq4_nl", [26] = "iq3_s",
        [27] = "iq3_m",   [28] = "iq2_s",   [29] = "iq2_m",  [30] = "iq4_xs", [31] = "iq1_m",
        [32] = "bf16",    [36] = "tq1_0",   [37] = "tq2_0",
    };
    return ft < sizeof(names) / sizeof(names[0]) ? names[ft] : NULL;
}

static sb_status describe(const char *path, model_desc *d, sb_error *err) {
    sb_gguf *g;
    sb_status st = sb_gguf_open(path, &g, err);
    if (st != SB_OK)
        return st;
    uint32_t ft;
    snprintf(d->type, sizeof(d->type), "unknown");
    if (sb_gguf_get_u32(g, "general.file_type", &ft, NULL) == SB_OK) {
        const char *name = ftype_name(ft);
        if (name)
            snprintf(d->type, sizeof(d->type), "%s", name);
        else
            snprintf(d->type, sizeof(d->type), "ftype%u", ft);
    }
    uint64_t bytes = 0;
    d->n_params = 0;
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const sb_gguf_tensor *t = &g->tensors[i];
        uint64_t n = 1;
        for (uint32_t k = 0; k < t->n_dims; k++)
            n *= (uint64_t)t->ne[k];
        d->n_params += n;
        bytes += t->nbytes;
    }
    d->size_mib = (double)bytes / (1024.0 * 1024.0);
    sb_gguf_close(g);
    return SB_OK;
}

/* xorshift64*: the same ids on every run and machine. */
static uint64_t next_rand(uint64_t *s) {
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * 0x2545F4914F6CDD1DULL;
}

/* BOS (when the model has one), then pseudo-random ids below n_vocab. */
static void fill_tokens(const sb_model_t *m, int32_t *ids, int32_t n) {
    uint64_t s = 0x5eed5b0a4dULL;
    int32_t n_vocab = sb_model_n_vocab(m), bos = sb_model_token_bos(m);
    for (int32_t i = 0; i < n; i++)
        ids[i] = (int32_t)(next_rand(&s) % (uint64_t)n_vocab);
    if (n > 0 && bos >= 0)
        ids[0] = bos;
}

static int32_t argmax(const float *x, int32_t n) {
    int32_t best = 0;
    for (int32_t i = 1; i < n; i++)
        if (x[i] > x[best])
            best = i;
    return best;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int32_t n) {
    qsort(v, (size_t)n, sizeof(double), cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static double peak_rss_mb(void) {
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) != 0)
        return 0.0;
    return (double)ru.ru_maxrss / 1024.0; /* Linux reports KiB */
}

/* One repetition of pp: *secs = eval time, *ttft = the same. */
static sb_status run_pp(sb_ctx_t *ctx, const int32_t *ids, int32_t n, double *secs, double *ttft, sb_error *err) {
    sb_ctx_reset(ctx);
    double t0 = sb_cli_now();
    sb_status st = sb_ctx_eval(ctx, ids, n, err);
    *secs = *ttft = sb_cli_now() - t0;
    return st;
}

/* One repetition of tg: *secs = time of the n single-token evals, *ttft =
 * prompt eval + the first of them. */
static sb_status run_tg(sb_ctx_t *ctx, const int32_t *prompt, int32_t n_vocab, int32_t n, double *secs,
                        double *ttft, sb_error *err) {
    sb_ctx_reset(ctx);
    double t0 = sb_cli_now();
    sb_status st = sb_ctx_eval(ctx, prompt, TG_PROMPT, err);
    double t_prompt = sb_cli_now() - t0, gen = 0.0;
    for (int32_t i = 0; i < n && st == SB_OK; i++) {
        int32_t tok = argmax(sb_ctx_logits(ctx), n_vocab);
        double t1 = sb_cli_now();
        st = sb_ctx_eval(ctx, &tok, 1, err);
        gen += sb_cli_now() - t1;
        if (i == 0)
            *ttft = t_prompt + gen;
    }
    *secs = gen;
    return st;
}

/* Warm-up plus reps repetitions of one test, summarized into *r. */
static sb_status run_test(sb_ctx_t *ctx, const sb_model_t *m, bool is_pp, int32_t n, int32_t reps, bool progress,
                          const int32_t *ids, bench_result *r, sb_error *err) {
    double *ts = malloc((size_t)reps * sizeof(double)), *tt = malloc((size_t)reps * sizeof(double));
    sb_status st = SB_OK;
    if (!ts || !tt) {
        st = SB_ERR_NOMEM;
        snprintf(err->msg, sizeof(err->msg), "out of memory");
        goto done;
    }
    snprintf(r->test, sizeof(r->test), "%s%d", is_pp ? "pp" : "tg", n);
    for (int32_t rep = -1; rep < reps && st == SB_OK; rep++) {
        double secs = 0.0, ttft = 0.0;
        st = is_pp ? run_pp(ctx, ids, n, &secs, &ttft, err)
                   : run_tg(ctx, ids, sb_model_n_vocab(m), n, &secs, &ttft, err);
        if (rep >= 0) {
            ts[rep] = secs > 0.0 ? (double)n / secs : 0.0;
            tt[rep] = ttft * 1e3;
        }
        if (progress && st == SB_OK) {
            fprintf(stderr, "bench-progress test=%s rep=%d reps=%d secs=%.4f t_s=%.3f ttft_ms=%.3f\n", r->test, rep + 1,
                    reps, secs, secs > 0.0 ? (double)n / secs : 0.0, ttft * 1e3);
            fflush(stderr);
        }
    }
    if (st == SB_OK) {
        r->ts_median = median(ts, reps);
        r->ts_min = ts[0];
        r->ts_max = ts[reps - 1];
        r->ttft_ms = median(tt, reps);
        r->rss_mb = peak_rss_mb();
    }
done:
    free(ts);
    free(tt);
    return st;
}

static void print_table_header(void) {
    printf("| %-32s | %-8s | %9s | %7s | %-7s | %10s | %10s | %10s | %9s | %8s |\n", "model", "type", "size MiB",
           "threads", "test", "t/s median", "t/s min", "t/s max", "ttft ms", "rss MiB");
    printf("|%s|%s|%s|%s|%s|%s|%s|%s|%s|%s|\n", "----------------------------------", "----------",
           "----------:", "--------:", "---------", "-----------:", "-----------:", "-----------:", "----------:",
           "---------:");
}

static void print_table_row(const char *model, const model_desc *d, int32_t threads, const bench_result *r) {
    const char *base = strrchr(model, '/');
    base = base ? base + 1 : model;
    printf("| %-32.32s | %-8s | %9.1f | %7d | %-7s | %10.2f | %10.2f | %10.2f | %9.2f | %8.1f |\n", base, d->type,
           d->size_mib, threads, r->test, r->ts_median, r->ts_min, r->ts_max, r->ttft_ms, r->rss_mb);
    fflush(stdout);
}

static cJSON *result_json(const bench_opts *o, const model_desc *d, int32_t threads, const bench_result *r) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "model", o->model);
    cJSON_AddStringToObject(j, "type", d->type);
    cJSON_AddNumberToObject(j, "size_mib", d->size_mib);
    cJSON_AddNumberToObject(j, "n_params", (double)d->n_params);
    cJSON_AddNumberToObject(j, "threads", threads);
    cJSON_AddStringToObject(j, "cache_type", sb_cache_type_name(o->cache_type));
    cJSON_AddStringToObject(j, "test", r->test);
    cJSON_AddNumberToObject(j, "reps", o->reps);
    cJSON_AddNumberToObject(j, "t_s_median", r->ts_median);
    cJSON_AddNumberToObject(j, "t_s_min", r->ts_min);
    cJSON_AddNumberToObject(j, "t_s_max", r->ts_max);
    cJSON_AddNumberToObject(j, "ttft_ms", r->ttft_ms);
    cJSON_AddNumberToObject(j, "peak_rss_mb", r->rss_mb);
    return j;
}

int sb_cmd_bench(int argc, char **argv) {
    bench_opts o = {.n_prompt = 512, .n_gen = 128, .reps = 5};
    parse_opts(argc, argv, &o);
    int32_t threads = o.n_threads;
    if (threads == 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        threads = n > 0 ? (int32_t)n : 1;
    }

    model_desc d;
    sb_model_t *m = NULL;
    sb_ctx_t *ctx = NULL;
    int32_t *ids = NULL;
    cJSON *arr = NULL;
    sb_error err = {0};
    int rc = 1;
    if (describe(o.model, &d, &err) != SB_OK || sb_model_load(o.model, &m, &err) != SB_OK) {
        sb_cli_error("%s", err.msg);
        goto done;
    }
    int32_t n_ids = o.n_prompt > TG_PROMPT ? o.n_prompt : TG_PROMPT;
    int32_t need = o.n_prompt > TG_PROMPT + o.n_gen ? o.n_prompt : TG_PROMPT + o.n_gen;
    sb_ctx_params cp = {.n_ctx = need + 16, .n_threads = threads, .cache_type = o.cache_type};
    ids = malloc((size_t)n_ids * sizeof(int32_t));
    if (!ids) {
        sb_cli_error("out of memory");
        goto done;
    }
    fill_tokens(m, ids, n_ids);
    if (sb_ctx_create(m, &cp, &ctx, &err) != SB_OK) {
        sb_cli_error("%s", err.msg);
        goto done;
    }
    if (o.json)
        arr = cJSON_CreateArray();
    else
        print_table_header();
    for (int k = 0; k < 2; k++) {
        bool is_pp = k == 0;
        int32_t n = is_pp ? o.n_prompt : o.n_gen;
        if (n == 0)
            continue;
        bench_result r = {0};
        if (run_test(ctx, m, is_pp, n, o.reps, o.progress, ids, &r, &err) != SB_OK) {
            sb_cli_error("%s%d: %s", is_pp ? "pp" : "tg", n, err.msg);
            goto done;
        }
        if (o.json)
            cJSON_AddItemToArray(arr, result_json(&o, &d, threads, &r));
        else
            print_table_row(o.model, &d, threads, &r);
    }
    if (o.json) {
        char *s = cJSON_PrintUnformatted(arr);
        puts(s);
        cJSON_free(s);
    }
    rc = 0;
done:
    cJSON_Delete(arr);
    sb_ctx_free(ctx);
    sb_model_free(m);
    free(ids);
    return rc;
}
