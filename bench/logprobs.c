/*
 * logprobs.c - switchboard's next-token log-probabilities along a given
 * token sequence (teacher forcing), for comparison with llama.cpp's
 * (bench/llamacpp/distributions.mjs).
 *
 *   bench_logprobs -m MODEL -o OUT.f32 [-t THREADS] ID ID ...
 *
 * Feeds the ids one at a time (sb_ctx_eval with n = 1) and, after each,
 * writes log_softmax(logits) (n_vocab float32, computed in double) to OUT:
 * the file is n_ids rows of n_vocab little-endian floats, row i being the
 * distribution of the token that follows ids[0..i]. On success prints one
 * JSON line {"n_vocab":V,"n_pos":N} to stdout; on failure one line on stderr
 * and exit status 1 (2 for usage errors).
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "switchboard.h"

static int usage(void) {
    fputs("usage: bench_logprobs -m MODEL -o OUT.f32 [-t THREADS] ID ID ...\n", stderr);
    return 2;
}

static bool parse_i32(const char *s, long min, long max, int32_t *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < min || v > max)
        return false;
    *out = (int32_t)v;
    return true;
}

/* out[i] = x[i] - log(sum(exp(x))), in double. */
static void log_softmax(const float *x, int32_t n, float *out) {
    double max = x[0];
    for (int32_t i = 1; i < n; i++)
        max = x[i] > max ? x[i] : max;
    double sum = 0.0;
    for (int32_t i = 0; i < n; i++)
        sum += exp((double)x[i] - max);
    double lse = max + log(sum);
    for (int32_t i = 0; i < n; i++)
        out[i] = (float)((double)x[i] - lse);
}

int main(int argc, char **argv) {
    const char *model_path = NULL, *out_path = NULL;
    int32_t n_threads = 0;
    int32_t *ids = calloc((size_t)argc, sizeof(int32_t));
    int32_t n_ids = 0;
    if (!ids)
        return 1;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "-m") == 0 && i + 1 < argc)
            model_path = argv[++i];
        else if (strcmp(argv[i], "-o") == 0 && i + 1 < argc)
            out_path = argv[++i];
        else if (strcmp(argv[i], "-t") == 0 && i + 1 < argc) {
            if (!parse_i32(argv[++i], 1, 1024, &n_threads)) {
                free(ids);
                return usage();
            }
        } else if (!parse_i32(argv[i], 0, INT32_MAX, &ids[n_ids++])) {
            fprintf(stderr, "bench_logprobs: '%s' is not a token id\n", argv[i]);
            free(ids);
            return usage();
        }
    }
    if (!model_path || !out_path || n_ids == 0) {
        free(ids);
        return usage();
    }

    int rc = 1;
    sb_error err;
    sb_model_t *model = NULL;
    sb_ctx_t *ctx = NULL;
    float *row = NULL;
    FILE *f = NULL;
    if (sb_model_load(model_path, &model, &err) != SB_OK) {
        fprintf(stderr, "bench_logprobs: %s\n", err.msg);
        goto done;
    }
    int32_t n_vocab = sb_model_n_vocab(model);
    sb_ctx_params cp = {.n_ctx = n_ids + 16, .n_threads = n_threads};
    if (sb_ctx_create(model, &cp, &ctx, &err) != SB_OK) {
        fprintf(stderr, "bench_logprobs: %s\n", err.msg);
        goto done;
    }
    row = malloc((size_t)n_vocab * sizeof(float));
    f = fopen(out_path, "wb");
    if (!row || !f) {
        fprintf(stderr, "bench_logprobs: cannot write %s: %s\n", out_path, strerror(errno));
        goto done;
    }
    for (int32_t i = 0; i < n_ids; i++) {
        if (sb_ctx_eval(ctx, &ids[i], 1, &err) != SB_OK) {
            fprintf(stderr, "bench_logprobs: position %d: %s\n", i, err.msg);
            goto done;
        }
        log_softmax(sb_ctx_logits(ctx), n_vocab, row);
        if (fwrite(row, sizeof(float), (size_t)n_vocab, f) != (size_t)n_vocab) {
            fprintf(stderr, "bench_logprobs: write to %s failed\n", out_path);
            goto done;
        }
    }
    if (fclose(f) != 0) {
        f = NULL;
        fprintf(stderr, "bench_logprobs: write to %s failed\n", out_path);
        goto done;
    }
    f = NULL;
    printf("{\"n_vocab\":%d,\"n_pos\":%d}\n", n_vocab, n_ids);
    rc = 0;
done:
    if (f)
        fclose(f);
    free(row);
    sb_ctx_free(ctx);
    sb_model_free(model);
    free(ids);
    return rc;
}
