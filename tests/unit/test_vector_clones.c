/*
 * test_vector_clones.c - the loops built for several vector widths
 * (SB_VECTOR_CLONES, base.h: gcc picks one version when the program loads)
 * give the same bytes at every width.
 *
 * A CPU only ever runs the widest version it has, so this file is built
 * three times: as this test, linked with the library (the version this CPU
 * picks), and as two probes, test_vector_clones_avx2 and
 * test_vector_clones_baseline, which compile the cloned sources themselves
 * at one level (SB_VECTOR_CLONE_LEVEL) and print the digests below. The
 * test computes the same digests and requires each probe's to equal its
 * own, item by item:
 *   - every weight type's quantizer on inputs of several kinds (kquants.c's
 *     scale searches; the legacy types for completeness);
 *   - every F16 value widened to F32 (types.c);
 *   - seeded draws over a 32,000-token vocabulary with and without filters
 *     (sampler.c's passes over the logits);
 *   - stories260K's logits after five tokens (forward.c's norms and
 *     rotations; the kernels under them are bit-identical at every level
 *     by their own tests).
 * The probes' paths come in SB_CLONE_PROBES (colon-separated), set by
 * tests/CMakeLists.txt.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "base/base.h"
#include "switchboard.h"
#include "tensor/tensor.h"
#include "testutil.h"

#define N_ITEMS 64

typedef struct digest_item {
    char name[48];
    uint64_t hash;
} digest_item;

typedef struct digests {
    digest_item item[N_ITEMS];
    int n;
} digests;

static uint64_t fnv1a(uint64_t h, const void *p, size_t n) {
    const uint8_t *b = p;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

static void add(digests *d, const char *name, const void *p, size_t n) {
    if (d->n == N_ITEMS)
        return;
    digest_item *it = &d->item[d->n++];
    snprintf(it->name, sizeof(it->name), "%s", name);
    it->hash = fnv1a(0xcbf29ce484222325ull, p, n);
}

/* ---- what is digested ---------------------------------------------------- */

static uint32_t lcg(uint32_t *s) {
    *s = *s * 1664525u + 1013904223u;
    return *s >> 8;
}

/* Rows of n elements of several kinds: smooth noise, a wide dynamic range,
 * sub-blocks of very different sizes, exact ties, zero runs, negatives only. */
static void weight_rows(float *x, int64_t n, int64_t rows) {
    uint32_t s = 12345;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t i = 0; i < n; i++) {
            float u = (float)lcg(&s) / (float)(1u << 24) * 2.0f - 1.0f;
            float v;
            switch (r % 6) {
            case 0: v = u; break;
            case 1: v = u * exp2f((float)(i % 40) - 20.0f); break;
            case 2: v = u * ((i / 16) % 3 == 0 ? 100.0f : 0.01f); break;
            case 3: v = (float)((int)(u * 4.0f)) * 0.25f; break;
            case 4: v = (i / 32) % 2 ? 0.0f : u; break;
            default: v = -fabsf(u) - 0.5f; break;
            }
            x[r * n + i] = v;
        }
}

static void digest_quantizers(digests *d) {
    static const sb_type types[] = {SB_TYPE_Q4_0, SB_TYPE_Q4_1, SB_TYPE_Q5_0, SB_TYPE_Q5_1, SB_TYPE_Q8_0,
                                    SB_TYPE_Q2_K, SB_TYPE_Q3_K, SB_TYPE_Q4_K, SB_TYPE_Q5_K, SB_TYPE_Q6_K,
                                    SB_TYPE_IQ4_NL, SB_TYPE_IQ4_XS, SB_TYPE_F16, SB_TYPE_BF16};
    enum { N = 3 * 256, ROWS = 12 };
    static float x[ROWS * N];
    static uint8_t q[ROWS * N * 4];
    weight_rows(x, N, ROWS);
    for (size_t k = 0; k < SB_ARRAY_LEN(types); k++) {
        const sb_type_traits *t = sb_type_traits_of(types[k]);
        const size_t row = sb_type_row_size(types[k], N);
        for (int r = 0; r < ROWS; r++)
            t->from_float(x + (size_t)r * N, q + (size_t)r * row, N);
        char name[48];
        snprintf(name, sizeof(name), "quantize-%s", t->name);
        add(d, name, q, row * ROWS);
    }
}

static void digest_f16(digests *d) {
    static uint16_t h[65536];
    static float f[65536];
    for (uint32_t i = 0; i < 65536; i++)
        h[i] = (uint16_t)i;
    sb_type_traits_of(SB_TYPE_F16)->to_float(h, f, 65536);
    add(d, "f16-to-f32", f, sizeof(f));
}

static void digest_draws(digests *d, const char *name, sb_sampler_params p) {
    enum { N = 32000, LEN = 200 };
    static float logits[N];
    static int32_t out[LEN];
    sb_sampler_t *s = NULL;
    if (sb_sampler_create(&p, N, &s, NULL) != SB_OK)
        return;
    uint32_t st = 7;
    for (int i = 0; i < LEN; i++) {
        for (int v = 0; v < N; v++)
            logits[v] = (float)lcg(&st) / (float)(1u << 24) * 12.0f - 6.0f;
        out[i] = sb_sampler_sample(s, logits);
        sb_sampler_accept(s, out[i]);
    }
    sb_sampler_free(s);
    add(d, name, out, sizeof(out));
}

static void digest_sampler(digests *d) {
    sb_sampler_params p = sb_sampler_default_params();
    p.seed = 42;
    digest_draws(d, "draws-defaults", p);
    p.top_k = 0;
    p.top_p = 1.0f;
    p.min_p = 0.0f;
    p.temperature = 0.8f;
    digest_draws(d, "draws-whole-vocabulary", p);
    p.top_p = 0.9f;
    p.min_p = 0.02f;
    p.temperature = 1.3f;
    digest_draws(d, "draws-top-p-min-p", p);
}

static void digest_forward(digests *d) {
    sb_model_t *m = NULL;
    sb_ctx_t *ctx = NULL;
    if (sb_model_load(sb_test_fixture("models/stories260K.gguf"), &m, NULL) != SB_OK)
        return;
    if (sb_ctx_create(m, NULL, &ctx, NULL) == SB_OK) {
        const int32_t tokens[5] = {1, 403, 407, 261, 378};
        uint64_t h = 0xcbf29ce484222325ull;
        for (int pos = 0; pos < 5; pos++) {
            if (sb_ctx_eval(ctx, &tokens[pos], 1, NULL) != SB_OK)
                break;
            h = fnv1a(h, sb_ctx_logits(ctx), (size_t)sb_model_n_vocab(m) * sizeof(float));
        }
        add(d, "stories260K-logits", &h, sizeof(h));
        sb_ctx_free(ctx);
    }
    sb_model_free(m);
}

static void compute(digests *d) {
    d->n = 0;
    digest_quantizers(d);
    digest_f16(d);
    digest_sampler(d);
    digest_forward(d);
}

#ifdef SB_CLONE_PROBE

int main(void) {
    digests d;
    compute(&d);
    for (int i = 0; i < d.n; i++)
        printf("%s %016llx\n", d.item[i].name, (unsigned long long)d.item[i].hash);
    return 0;
}

#else

/* The probe's digests, from its output. */
static void run_probe(const char *path, digests *d) {
    char cmd[4200];
    snprintf(cmd, sizeof(cmd), "'%s'", path);
    FILE *p = popen(cmd, "r");
    if (!p)
        fail_msg("cannot run the probe %s", path);
    d->n = 0;
    char name[48];
    unsigned long long h;
    while (d->n < N_ITEMS && fscanf(p, "%47s %llx", name, &h) == 2) {
        snprintf(d->item[d->n].name, sizeof(d->item[d->n].name), "%s", name);
        d->item[d->n++].hash = h;
    }
    int rc = pclose(p);
    if (rc != 0)
        fail_msg("the probe %s exited with status %d", path, rc);
}

static void test_every_version_gives_the_same_bytes(void **state) {
    (void)state;
    const char *env = getenv("SB_CLONE_PROBES");
    if (!env || !*env)
        fail_msg("SB_CLONE_PROBES is not set (tests/CMakeLists.txt sets it to the probes' paths)");
    static digests mine, theirs;
    compute(&mine);
    /* quantizers, F16, three samplers, the model */
    assert_int_equal(mine.n, 14 + 1 + 3 + 1);
    char paths[4096];
    snprintf(paths, sizeof(paths), "%s", env);
    int probes = 0;
    for (char *save = NULL, *path = strtok_r(paths, ":", &save); path; path = strtok_r(NULL, ":", &save)) {
#if defined(__x86_64__) && defined(__GNUC__)
        /* a CPU without AVX2 cannot run that probe (nor pick that version) */
        if (strstr(path, "level2") && !__builtin_cpu_supports("avx2")) {
            probes++;
            continue;
        }
#endif
        run_probe(path, &theirs);
        if (theirs.n != mine.n)
            fail_msg("%s printed %d digests, this test computes %d", path, theirs.n, mine.n);
        for (int i = 0; i < mine.n; i++) {
            assert_string_equal(theirs.item[i].name, mine.item[i].name);
            if (theirs.item[i].hash != mine.item[i].hash)
                fail_msg("%s: the version built by %s gives %016llx, the one this CPU runs %016llx", mine.item[i].name,
                         path, (unsigned long long)theirs.item[i].hash, (unsigned long long)mine.item[i].hash);
        }
        probes++;
    }
    assert_int_equal(probes, 2);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_version_gives_the_same_bytes),
    };
    return sb_test_exit(cmocka_run_group_tests(tests, NULL, NULL));
}

#endif
