/*
 * quantize.c - quantizes a GGUF model with llama.cpp's own quantizer
 * (llama_model_quantize in the libllama that node-llama-cpp ships), so the
 * benchmark files are exactly what llama.cpp users would run.
 *
 *   quantize LIBLLAMA IN.gguf OUT.gguf FTYPE [THREADS]
 *
 * FTYPE is a llama_ftype number (1 F16, 2 Q4_0, 7 Q8_0, 15 Q4_K_M, 17 Q5_K_M,
 * 18 Q6_K) or one of those names. The library is dlopen'd, not linked: its
 * parameter struct differs from current llama.h, so it is treated as an
 * opaque blob (see ../../../shared/docs/LLAMACPP-ORACLE.md): the default
 * params are returned by value into a generously sized buffer, and only the
 * first two int32 fields, nthread and ftype, are changed.
 */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* Larger than any version of llama_model_quantize_params (about 80 bytes):
 * a struct this size is returned through a hidden pointer, and the callee
 * writes only its own fields. */
typedef struct qparams_blob {
    int32_t nthread;
    int32_t ftype;
    unsigned char rest[1016];
} qparams_blob;

typedef qparams_blob (*default_params_fn)(void);
typedef uint32_t (*quantize_fn)(const char *in, const char *out, const qparams_blob *params);
typedef void (*backend_init_fn)(void);
typedef void (*log_cb)(int level, const char *text, void *user);
typedef void (*log_set_fn)(log_cb cb, void *user);

static const struct {
    const char *name;
    int32_t ftype;
} ftypes[] = {
    {"f16", 1}, {"q4_0", 2}, {"q4_1", 3}, {"q8_0", 7}, {"q5_0", 8}, {"q5_1", 9}, {"q2_k", 10},
    {"q3_k_s", 11}, {"q3_k_m", 12}, {"q3_k_l", 13}, {"q4_k_s", 14}, {"q4_k_m", 15}, {"q5_k_s", 16}, {"q5_k_m", 17}, {"q6_k", 18},
    {"iq4_nl", 25}, {"iq4_xs", 30},
};

static void quiet_log(int level, const char *text, void *user) {
    (void)user;
    if (level >= 4) /* GGML_LOG_LEVEL_ERROR and above (not DEBUG/INFO/WARN/CONT) */
        fputs(text, stderr);
}

static int32_t parse_ftype(const char *s) {
    for (size_t i = 0; i < sizeof(ftypes) / sizeof(ftypes[0]); i++)
        if (strcasecmp(s, ftypes[i].name) == 0)
            return ftypes[i].ftype;
    char *end;
    long v = strtol(s, &end, 10);
    return (end != s && *end == '\0' && v > 0 && v < 1000) ? (int32_t)v : -1;
}

int main(int argc, char **argv) {
    if (argc < 5 || argc > 6) {
        fprintf(stderr, "usage: %s LIBLLAMA IN.gguf OUT.gguf FTYPE [THREADS]\n", argv[0]);
        return 2;
    }
    int32_t ftype = parse_ftype(argv[4]);
    if (ftype < 0) {
        fprintf(stderr, "quantize: unknown file type '%s'\n", argv[4]);
        return 2;
    }
    void *lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        fprintf(stderr, "quantize: %s\n", dlerror());
        return 1;
    }
    default_params_fn defaults = (default_params_fn)dlsym(lib, "llama_model_quantize_default_params");
    quantize_fn quantize = (quantize_fn)dlsym(lib, "llama_model_quantize");
    backend_init_fn init = (backend_init_fn)dlsym(lib, "llama_backend_init");
    log_set_fn log_set = (log_set_fn)dlsym(lib, "llama_log_set");
    if (!defaults || !quantize) {
        fprintf(stderr, "quantize: %s lacks llama_model_quantize or its default params\n", argv[1]);
        return 1;
    }
    if (log_set && !getenv("QUANTIZE_VERBOSE"))
        log_set(quiet_log, NULL);
    if (init)
        init();
    qparams_blob p = defaults();
    /* Sanity check of the layout: nthread defaults to 0 (all cores) and ftype
     * to a small llama_ftype (Q8_0 = 7 in this build, Q5_1 = 9 in older ones). */
    if (p.nthread != 0 || p.ftype <= 0 || p.ftype > 64) {
        fprintf(stderr, "quantize: unexpected default params (nthread %d, ftype %d); layout changed?\n", p.nthread,
                p.ftype);
        return 1;
    }
    p.ftype = ftype;
    if (argc == 6)
        p.nthread = atoi(argv[5]);
    uint32_t rc = quantize(argv[2], argv[3], &p);
    if (rc != 0) {
        fprintf(stderr, "quantize: llama_model_quantize(%s -> %s, ftype %d) failed (%u)\n", argv[2], argv[3], ftype,
                rc);
        return 1;
    }
    return 0;
}
