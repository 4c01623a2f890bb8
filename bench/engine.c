/*
 * engine.c - the scheduler's throughput without the HTTP server: N requests
 * submitted at once to one engine (or to each of two engines on one
 * executor), aggregate generated tokens per second.
 *
 *   bench_engine -m MODEL [-m MODEL2] [-t THREADS] [-s 1,4,8,16] [-n TOKENS] [-r REPS] [--temp T]
 *                [--cache-type f32|f16|q8_0] [--alternate REQUESTS] [--alt-tokens N] [--steps-per-turn N]
 *                [--profile 1|2] [--split auto|rows|lanes]
 *
 * For every stream count S: S requests (prompts of 4..15 pseudo-random ids
 * after BOS, so the prompts differ as the server benchmark's do), each
 * generating exactly TOKENS tokens (ignore_eos), all submitted together.
 * The decode rate, as llama.cpp's benchmarks time it (tg, and the decoding
 * of batched-bench), leaves the prompts out: the tokens generated after
 * every stream has its first one, per second from that moment to the last
 * completion. The rate with the prompts, S * TOKENS / (time from submission
 * to the last completion), is printed beside it: 8 streams' prompts are
 * 5..12 tokens each, the single stream's 5, so at 32 tokens per stream the
 * prompts are about a sixth of the 8 streams' work and a fourteenth of the
 * single stream's. Sampling is the server's
 * default for OpenAI requests: temperature T (0.8), no top-k, top-p or
 * min-p, a seed per request. Each S runs as REPS pairs, one stream then S
 * streams, after a warm-up of each: prints the medians of both rates and
 * the median of the pairs' ratios S / 1 (paired: this VM's speed drifts
 * by tens of percent within seconds with its neighbours' load, and a ratio
 * of two separate sweeps measured the drift), per wall second, per CPU
 * second of the process (see below) and with the prompts. bench/serve-load.mjs
 * measures the same through HTTP; the gap between the two is the server's
 * cost.
 *
 * With two models, both engines share one executor of THREADS threads, and
 * each S runs as pairs: S streams on the first model alone, then S streams
 * on each model at once (aggregate t/s of both); the ratio of each pair,
 * median over REPS. --alternate R then times R requests in a row (a short
 * prompt, --alt-tokens tokens each, default 4): all to the first model,
 * then alternating between the two; the paired difference in ms per
 * request is what switching between loaded models costs. Every figure of
 * the comparison is printed twice: per wall second, and per CPU second of
 * the process (steadier on a shared machine: it leaves out the time the
 * neighbours' threads hold the cores).
 *
 * --split sets the engine's sb_split_mode: how its decoding steps use the
 * threads (engine.c, "lanes"; by default each engine measures both ways).
 *
 * --profile 1 then prints where a decoding step of each stream count went
 * (the engine's sb_engine_get_profile, first model, warm-ups included; 2:
 * in the executor thread's CPU time, which with -t 1 is the work alone):
 * ms per step of planning, each part of the forward pass (products by
 * weight type, the output matrix, attention, ...), sampling and reporting.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/engine.h"

#define MAX_STREAMS 64
#define MAX_REPS 32

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

struct waiter;
typedef struct stream {
    struct waiter *w;
    bool started; /* has its first token */
} stream;

/* The requests of one run: how many are still going, and the decoding
 * phase (from the moment every one has its first token). A step reports
 * its sequences in admission order, so the last to start is reported last
 * in its step and the others' tokens of that step are not counted. */
typedef struct waiter {
    pthread_mutex_t lock;
    pthread_cond_t done;
    int remaining, not_started;
    double decode_t0;      /* when the last one got its first token */
    long decode_tokens;    /* tokens generated after decode_t0 */
    stream s[2 * MAX_STREAMS];
} waiter;

static void waiter_init(waiter *w, int requests) {
    *w = (waiter){.remaining = requests, .not_started = requests};
    pthread_mutex_init(&w->lock, NULL);
    pthread_cond_init(&w->done, NULL);
    for (int i = 0; i < 2 * MAX_STREAMS; i++)
        w->s[i].w = w;
}

static void on_event(void *user, const sb_gen_event *ev) {
    stream *st = user;
    waiter *w = st->w;
    pthread_mutex_lock(&w->lock);
    if (ev->kind == SB_GEN_TOKEN && !st->started) {
        st->started = true;
        if (--w->not_started == 0)
            w->decode_t0 = now_s();
    } else if (ev->kind == SB_GEN_TOKEN && w->not_started == 0)
        w->decode_tokens++;
    else if (ev->kind == SB_GEN_DONE && --w->remaining == 0)
        pthread_cond_signal(&w->done);
    pthread_mutex_unlock(&w->lock);
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* S requests (prompt seeded by rep and i) to engine e, counted by w from
 * its stream `first` on. Returns how many were submitted (all, unless one
 * failed). */
static int submit_streams(sb_engine *e, const sb_model_t *m, waiter *w, int first, int streams, int tokens,
                          float temp, int rep) {
    const int32_t n_vocab = sb_model_n_vocab(m), bos = sb_model_token_bos(m);
    uint64_t x = 0x9e3779b97f4a7c15ull ^ (uint64_t)rep;
    for (int i = 0; i < streams; i++) {
        int32_t prompt[16];
        sb_gen_params p = {0};
        int32_t n = 5 + i % 11;
        prompt[0] = bos >= 0 ? bos : 1;
        for (int32_t k = 1; k < n; k++) {
            x ^= x >> 12, x ^= x << 25, x ^= x >> 27;
            prompt[k] = (int32_t)((x * 0x2545f4914f6cdd1dull >> 33) % (uint64_t)(n_vocab - 3)) + 3;
        }
        p.prompt = prompt; /* copied by submit */
        p.n_prompt = n;
        p.max_tokens = tokens;
        p.ignore_eos = true;
        p.sampling = sb_sampler_default_params();
        p.sampling.temperature = temp;
        p.sampling.top_k = 0;
        p.sampling.top_p = 1.0f;
        p.sampling.min_p = 0.0f;
        p.sampling.seed = (uint64_t)(i + 1);
        sb_error err = {0};
        if (sb_engine_submit(e, &p, on_event, &w->s[first + i], NULL, &err) != SB_OK) {
            fprintf(stderr, "bench_engine: submit: %s\n", err.msg);
            return i;
        }
    }
    return streams;
}

static void wait_all(waiter *w) {
    pthread_mutex_lock(&w->lock);
    while (w->remaining > 0)
        pthread_cond_wait(&w->done, &w->lock);
    pthread_mutex_unlock(&w->lock);
}

/* One run of S concurrent requests to each of the first n engines, all
 * submitted together; returns the aggregate decode rate (t/s; 0 when no
 * token followed the first ones), or < 0, and sets *with_prompts to the
 * rate from submission. */
static double run_streams(sb_engine **e, sb_model_t **m, int n, int streams, int tokens, float temp, int rep,
                          double *with_prompts) {
    waiter w;
    waiter_init(&w, n * streams);
    double t0 = now_s();
    for (int k = 0; k < n; k++) {
        int sent = submit_streams(e[k], m[k], &w, k * streams, streams, tokens, temp, rep);
        if (sent < streams) {
            /* what was submitted still runs: wait for it before the waiter goes */
            pthread_mutex_lock(&w.lock);
            w.remaining -= (streams - sent) + (n - k - 1) * streams;
            pthread_mutex_unlock(&w.lock);
            wait_all(&w);
            return -1;
        }
    }
    wait_all(&w);
    double t1 = now_s();
    *with_prompts = n * streams * (double)tokens / (t1 - t0);
    return w.decode_tokens > 0 ? (double)w.decode_tokens / (t1 - w.decode_t0) : 0;
}

/* R requests one after another, request r to engine r % n, each a short
 * prompt and `tokens` tokens; returns the mean milliseconds per request. */
static double run_sequential(sb_engine **e, sb_model_t **m, int n, int requests, int tokens, int rep) {
    double t0 = now_s();
    for (int r = 0; r < requests; r++) {
        waiter w;
        waiter_init(&w, 1);
        if (submit_streams(e[r % n], m[r % n], &w, 0, 1, tokens, 0.8f, rep * requests + r) < 1)
            return -1;
        wait_all(&w);
    }
    return (now_s() - t0) * 1e3 / requests;
}

/* Median, min and max of n values (sorts them). */
static void summarize(double *v, int n, double out[3]) {
    qsort(v, (size_t)n, sizeof(double), cmp_double);
    out[0] = v[n / 2], out[1] = v[0], out[2] = v[n - 1];
}

typedef struct bench {
    sb_engine *e[2];
    sb_model_t *m[2];
    int n_models, streams, tokens, requests;
    float temp;
    double second; /* the last run's second figure: the rate with the prompts, or again ms per request */
} bench;

/* One run of a comparison's baseline (variant 0) or candidate (1),
 * repetition rep (< 0: a warm-up): its figure, or < 0 (and b->second). */
typedef double (*run_fn)(bench *b, int variant, int rep);
/* One model: a single stream against S streams (decode t/s). */
static double streams_fn(bench *b, int variant, int rep) {
    return run_streams(b->e, b->m, 1, variant ? b->streams : 1, b->tokens, b->temp, rep, &b->second);
}
/* Two models: S streams on the first against S on each at once (aggregate decode t/s). */
static double models_fn(bench *b, int variant, int rep) {
    return run_streams(b->e, b->m, variant ? b->n_models : 1, b->streams, b->tokens, b->temp, rep, &b->second);
}
/* Requests in a row to the first model, against alternating between the models (ms each). */
static double sequential_fn(bench *b, int variant, int rep) {
    return b->second = run_sequential(b->e, b->m, variant ? b->n_models : 1, b->requests, b->tokens, rep);
}

static double cpu_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* The figures of a comparison: [per wall clock, per process CPU time, the
 * run's second figure per wall clock][baseline, candidate, their paired
 * ratio or difference][median, min, max]. */
typedef double figures[3][3][3];

/* REPS pairs of runs, the baseline then the candidate, after a warm-up of each:
 * the two figures' medians, and the median of the pairs' ratios (or
 * differences): paired, so that a neighbour's load drifting across the
 * sweep does not pass for a difference between the two. Each figure also
 * per CPU second of this process instead of per wall second: on a shared
 * machine, where the wall clock counts the neighbours' time slices too,
 * that is the steadier measure of what the work costs. */
static bool compare(bench *b, run_fn f, int reps, bool ratio, figures out) {
    double v[3][3][MAX_REPS];
    f(b, 0, -1);
    f(b, 1, -1);
    for (int k = 0; k < reps; k++)
        for (int which = 0; which < 2; which++) {
            double w0 = now_s(), c0 = cpu_s();
            double fig = f(b, which, k);
            double wall = now_s() - w0, cpu = cpu_s() - c0;
            if (fig < 0)
                return false;
            v[0][which][k] = fig;
            /* t/s scale by wall / cpu, ms per request by cpu / wall */
            v[1][which][k] = ratio ? fig * wall / cpu : fig * cpu / wall;
            v[2][which][k] = b->second;
        }
    for (int c = 0; c < 3; c++) {
        for (int k = 0; k < reps; k++)
            v[c][2][k] = ratio ? v[c][1][k] / v[c][0][k] : v[c][1][k] - v[c][0][k];
        for (int i = 0; i < 3; i++)
            summarize(v[c][i], reps, out[c][i]);
    }
    return true;
}

static bool parse_int(const char *s, long min, long max, int *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || (*end && *end != ',') || v < min || v > max)
        return false;
    *out = (int)v;
    return true;
}

/* The process's threads, from /proc/self/status; -1 if unreadable. */
static int process_threads(void) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    int n = -1;
    while (f && fgets(line, sizeof(line), f))
        if (sscanf(line, "Threads: %d", &n) == 1)
            break;
    if (f)
        fclose(f);
    return n;
}

/* One row of the profile table: a label and ms per step for each stream count. */
static void profile_row(const char *label, const double *sec, const sb_step_profile *p, int n) {
    printf("| %s |", label);
    for (int k = 0; k < n; k++)
        printf(" %.3f |", p[k].steps ? sec[k] * 1e3 / (double)p[k].steps : 0.0);
    printf("\n");
}

/* The profile of the decoding steps of each stream count in `counts`. */
static void print_profile(sb_engine *e, const int *counts, int n, int clock) {
    sb_step_profile p[MAX_STREAMS + 1];
    double v[MAX_STREAMS + 1] = {0};
    printf("\n| ms per decoding step (%s) |", clock == SB_PROFILE_THREAD_CPU ? "executor thread's CPU" : "wall");
    for (int k = 0; k < n; k++) {
        sb_engine_get_profile(e, counts[k], &p[k]);
        printf(" %d stream%s (%llu steps) |", counts[k], counts[k] > 1 ? "s" : "", (unsigned long long)p[k].steps);
    }
    printf("\n|--|");
    for (int k = 0; k < n; k++)
        printf("--:|");
    printf("\n");
#define ROW(label, expr)                                                                                               \
    do {                                                                                                               \
        for (int k = 0; k < n; k++)                                                                                    \
            v[k] = (expr);                                                                                             \
        profile_row(label, v, p, n);                                                                                   \
    } while (0)
    ROW("whole step", p[k].step_s);
    ROW("planning", p[k].plan_s);
    ROW("forward pass", p[k].forward_s);
    char label[96];
    for (int t = 0; t < SB_TYPE_COUNT; t++) {
        bool used = false;
        for (int k = 0; k < n; k++)
            used = used || p[k].fwd.type_s[t] > 0;
        if (!used)
            continue;
        snprintf(label, sizeof(label), "- layers' products, %s%s", sb_type_traits_of((uint32_t)t)->name,
                 p[0].fwd.type_packed[t] ? " (packed)" : "");
        ROW(label, p[k].fwd.type_s[t]);
    }
    snprintf(label, sizeof(label), "- output matrix, %s%s", sb_type_traits_of(p[0].fwd.head_type)->name,
             p[0].fwd.head_packed ? " (packed)" : "");
    ROW(label, p[k].fwd.part_s[SB_FWD_HEAD]);
    ROW("- attention", p[k].fwd.part_s[SB_FWD_ATTENTION]);
    ROW("- KV placement (RoPE, stores)", p[k].fwd.part_s[SB_FWD_PLACE]);
    ROW("- norms, embedding, RoPE angles", p[k].fwd.part_s[SB_FWD_NORMS]);
    ROW("- gated activation", p[k].fwd.part_s[SB_FWD_GLU]);
    ROW("- other (biases, splits)", p[k].fwd.part_s[SB_FWD_OTHER]);
    double parts[MAX_STREAMS + 1] = {0};
    for (int k = 0; k < n; k++) {
        for (int i = 0; i < SB_FWD_N_PARTS; i++)
            parts[k] += p[k].fwd.part_s[i];
    }
    ROW("- not in a part", p[k].forward_s - parts[k]);
    ROW("sampling", p[k].sample_s);
    ROW("reporting", p[k].report_s);
#undef ROW
}

static bool parse_split(const char *v, sb_split_mode *out) {
    static const char *const names[] = {"auto", "rows", "lanes"};
    for (int i = 0; i < 3; i++)
        if (strcmp(v, names[i]) == 0) {
            *out = (sb_split_mode)i;
            return true;
        }
    return false;
}

static const char usage[] =
    "usage: bench_engine -m MODEL [-m MODEL2] [-t THREADS] [-s 1,4,8,16] [-n TOKENS] [-r REPS] [--temp T]\n"
    "                    [--cache-type f32|f16|q8_0] [--alternate REQUESTS] [--alt-tokens N] [--steps-per-turn N]\n"
    "                    [--profile 1|2] [--split auto|rows|lanes]\n";

int main(int argc, char **argv) {
    const char *paths[2] = {NULL, NULL}, *list = "1,4,8,16";
    int n_models = 0, threads = 2, tokens = 64, reps = 3, alternate = 0, alt_tokens = 4, steps_per_turn = 1;
    int profile = 0, counts[MAX_STREAMS], n_counts = 0;
    float temp = 0.8f;
    sb_cache_type cache_type = sb_engine_default_params().cache_type; /* the server's */
    sb_split_mode split = SB_SPLIT_AUTO;
    for (int i = 1; i < argc; i += 2) { /* every option takes a value */
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        bool ok = v != NULL;
        if (ok && strcmp(a, "-m") == 0 && n_models < 2)
            paths[n_models++] = v;
        else if (ok && strcmp(a, "-t") == 0)
            ok = parse_int(v, 1, 256, &threads);
        else if (ok && strcmp(a, "-s") == 0)
            list = v;
        else if (ok && strcmp(a, "-n") == 0)
            ok = parse_int(v, 1, 100000, &tokens);
        else if (ok && strcmp(a, "-r") == 0)
            ok = parse_int(v, 1, MAX_REPS, &reps);
        else if (ok && strcmp(a, "--temp") == 0)
            temp = strtof(v, NULL);
        else if (ok && strcmp(a, "--cache-type") == 0)
            ok = sb_cache_type_parse(v, &cache_type);
        else if (ok && strcmp(a, "--alternate") == 0)
            ok = parse_int(v, 1, 100000, &alternate);
        else if (ok && strcmp(a, "--alt-tokens") == 0)
            ok = parse_int(v, 1, 100000, &alt_tokens);
        else if (ok && strcmp(a, "--steps-per-turn") == 0)
            ok = parse_int(v, 1, 100000, &steps_per_turn);
        else if (ok && strcmp(a, "--profile") == 0)
            ok = parse_int(v, 0, 2, &profile);
        else if (ok && strcmp(a, "--split") == 0)
            ok = parse_split(v, &split);
        else
            ok = false;
        if (!ok) {
            fputs(usage, stderr);
            return 2;
        }
    }
    if (n_models == 0) {
        fputs("bench_engine: -m MODEL is required\n", stderr);
        return 2;
    }
    sb_error err = {0};
    bench b = {.n_models = n_models, .tokens = tokens, .temp = temp};
    sb_executor *x = NULL;
    sb_executor_params xp = {.n_threads = threads, .steps_per_turn = steps_per_turn};
    int status = sb_executor_create(&xp, &x, &err) == SB_OK ? 0 : 1;
    sb_engine_params ep = sb_engine_default_params();
    ep.n_parallel = MAX_STREAMS;
    ep.cache_type = cache_type;
    ep.profile = (sb_profile_clock)profile;
    ep.split = split;
    for (int k = 0; k < n_models && status == 0; k++)
        if (sb_model_load(paths[k], &b.m[k], &err) != SB_OK || sb_engine_create(b.m[k], &ep, x, &b.e[k], &err) != SB_OK)
            status = 1;
    if (status) {
        fprintf(stderr, "bench_engine: %s\n", err.msg);
        goto done;
    }
    printf("executor threads %d, process threads %d (the caller and the executor's), %d steps per turn\n\n",
           sb_executor_n_threads(x), process_threads(), steps_per_turn);
    static const char *const clocks[3] = {"wall s, decoding", "CPU s, decoding", "wall s, with prompts"};
    if (n_models == 1)
        printf("| streams | 1 stream: decode t/s | S streams | min | max | S / 1, paired median | min | max |"
               " per CPU s: S / 1 | with prompts: S / 1 |\n|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n");
    else
        printf("| streams per model | per | one model t/s (min-max) | two models at once t/s (min-max) |"
               " two / one, paired (min-max) |\n|--:|--|--:|--:|--:|\n");
    for (const char *s = list; s && *s; s = strchr(s, ',') ? strchr(s, ',') + 1 : NULL) {
        if (!parse_int(s, 1, MAX_STREAMS, &b.streams)) {
            fprintf(stderr, "bench_engine: bad stream count in -s %s (1..%d)\n", list, MAX_STREAMS);
            status = 2;
            break;
        }
        if (n_counts < MAX_STREAMS)
            counts[n_counts++] = b.streams;
        figures fg;
        if (!compare(&b, n_models == 1 ? streams_fn : models_fn, reps, true, fg)) {
            status = 1;
            break;
        }
        if (n_models == 1)
            printf("| %d | %.1f | %.1f | %.1f | %.1f | %.2f | %.2f | %.2f | %.2f | %.2f |\n", b.streams, fg[0][0][0],
                   fg[0][1][0], fg[0][1][1], fg[0][1][2], fg[0][2][0], fg[0][2][1], fg[0][2][2], fg[1][2][0],
                   fg[2][2][0]);
        else
            for (int c = 0; c < 3; c++)
                printf("| %d | %s | %.1f (%.1f-%.1f) | %.1f (%.1f-%.1f) | %.3f (%.3f-%.3f) |\n", b.streams,
                       clocks[c], fg[c][0][0], fg[c][0][1], fg[c][0][2], fg[c][1][0], fg[c][1][1], fg[c][1][2],
                       fg[c][2][0], fg[c][2][1], fg[c][2][2]);
        fflush(stdout);
    }
    if (status == 0 && profile) {
        /* one model's pairs ran a single stream beside every S: its column first */
        int shown[MAX_STREAMS + 1], n_shown = 0;
        if (n_models == 1)
            shown[n_shown++] = 1;
        for (int k = 0; k < n_counts; k++)
            if (n_models > 1 || counts[k] != 1)
                shown[n_shown++] = counts[k];
        print_profile(b.e[0], shown, n_shown, profile);
    }
    if (status == 0 && alternate > 0) {
        /* What a switch between loaded models adds to a request: one after
         * another, all to one model, then alternating between two. */
        figures fg;
        b.requests = alternate;
        b.tokens = alt_tokens;
        if (!compare(&b, sequential_fn, reps, false, fg))
            status = 1;
        else {
            printf("\n| requests in a row (%d tokens each) | per | ms/request, one model | ms/request, alternating %d models |"
                   " added ms, paired (min-max) |\n|--:|--|--:|--:|--:|\n",
                   alt_tokens, n_models);
            for (int c = 0; c < 2; c++)
                printf("| %d | %s | %.3f (%.3f-%.3f) | %.3f (%.3f-%.3f) | %+.3f (%+.3f-%+.3f) |\n", alternate,
                       c ? "CPU" : "wall", fg[c][0][0], fg[c][0][1], fg[c][0][2], fg[c][1][0], fg[c][1][1], fg[c][1][2],
                       fg[c][2][0], fg[c][2][1], fg[c][2][2]);
        }
    }
done:
    for (int k = 0; k < 2; k++) {
        sb_engine_free(b.e[k]);
        sb_model_free(b.m[k]);
    }
    sb_executor_free(x);
    return status;
}
