/*
 * cmd_quantize.c - `switchboard quantize IN.gguf OUT.gguf TYPE [--threads N]
 * [--allow-requantize]`: writes IN with its weights quantized as llama.cpp's
 * quantizer (llama_model_quantize, no importance matrix) does: the same type
 * for every tensor (src/tensor/quantize.c's rules), the same bytes (the type
 * table's reference quantizers), the same general.file_type and
 * general.quantization_version; the other metadata is copied as it is and
 * the tensors are written in llama.cpp's order (by name).
 *
 * The file is written to OUT.tmp-<pid> and renamed when complete, so a full
 * disk or an error leaves no partial OUT; an OUT that exists and is not a
 * regular file (a device, a pipe) is written in place, never replaced. An input whose weights are already
 * quantized is refused unless --allow-requantize (they are then dequantized
 * first, which loses accuracy: a warning says so).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/base.h"
#include "cli/cli.h"
#include "gguf/gguf.h"
#include "tensor/quantize.h"
#include "tensor/threadpool.h"

static const char usage[] = "usage: switchboard quantize IN.gguf OUT.gguf TYPE [--threads N] [--allow-requantize]\n";

static bool is_float_type(uint32_t t) { return t == SB_TYPE_F32 || t == SB_TYPE_F16 || t == SB_TYPE_BF16; }

/* A tensor's name as a C string (names are at most 64 bytes in GGUF). */
static void tensor_name(const sb_gguf_tensor *t, char *out, size_t cap) {
    const size_t n = t->name.len < cap - 1 ? (size_t)t->name.len : cap - 1;
    memcpy(out, t->name.ptr, n);
    out[n] = '\0';
}

static const sb_gguf *sort_file; /* qsort has no context argument */
static int by_name(const void *a, const void *b) {
    const sb_gguf_str *x = &sort_file->tensors[*(const uint64_t *)a].name;
    const sb_gguf_str *y = &sort_file->tensors[*(const uint64_t *)b].name;
    const int c = memcmp(x->ptr, y->ptr, x->len < y->len ? x->len : y->len);
    return c ? c : (x->len > y->len) - (x->len < y->len);
}

static bool key_is(const sb_gguf_kv *kv, const char *key) {
    return kv->key.len == strlen(key) && memcmp(kv->key.ptr, key, kv->key.len) == 0;
}

/* The counts llama.cpp's rules need: block count, heads per KV head,
 * attention value matrices, whether there is an output matrix. */
static sb_status make_plan(const sb_gguf *in, const sb_quant_ftype *ft, sb_quant_plan *p, sb_error *err) {
    *p = (sb_quant_plan){.ft = ft, .n_gqa = 1};
    sb_gguf_str arch;
    sb_status st = sb_gguf_get_str(in, "general.architecture", &arch, err);
    if (st != SB_OK)
        return st;
    char key[160];
    uint32_t v, heads = 0, kv_heads = 0;
    snprintf(key, sizeof(key), "%.*s.block_count", (int)(arch.len < 100 ? arch.len : 100), arch.ptr);
    if ((st = sb_gguf_get_u32(in, key, &v, err)) != SB_OK)
        return st;
    p->n_layer = (int32_t)v;
    snprintf(key, sizeof(key), "%.*s.attention.head_count", (int)(arch.len < 100 ? arch.len : 100), arch.ptr);
    if (sb_gguf_get_u32_or(in, key, 0, &heads, err) != SB_OK)
        return err->status;
    snprintf(key, sizeof(key), "%.*s.attention.head_count_kv", (int)(arch.len < 100 ? arch.len : 100), arch.ptr);
    if (sb_gguf_get_u32_or(in, key, heads, &kv_heads, err) != SB_OK)
        return err->status;
    if (heads && kv_heads)
        p->n_gqa = (int32_t)(heads / kv_heads);
    for (uint64_t i = 0; i < in->n_tensors; i++) {
        char name[128];
        tensor_name(&in->tensors[i], name, sizeof(name));
        p->n_attn_v += strstr(name, "attn_v.weight") || strstr(name, "attn_qkv.weight") || strstr(name, "attn_kv_b.weight");
        p->has_output |= strcmp(name, "output.weight") == 0;
    }
    return SB_OK;
}

/* One line of progress on stderr: redrawn in place on a terminal, else at
 * every tenth of the tensors. */
static void progress(uint64_t done, uint64_t total, const char *name, bool tty) {
    static uint64_t last_tenth = 0;
    if (!tty && done < total && done * 10 / total == last_tenth)
        return;
    last_tenth = done * 10 / total;
    char bar[31];
    const int full = (int)(done * 30 / total);
    for (int i = 0; i < 30; i++)
        bar[i] = i < full ? '#' : '.';
    bar[30] = '\0';
    fprintf(stderr, "%squantize: [%s] %3llu/%llu %-40s%s", tty ? "\r" : "", bar, (unsigned long long)done,
            (unsigned long long)total, name, tty && done < total ? "" : "\n");
}

typedef struct run {
    const char *in_path, *out_path;
    const sb_quant_ftype *ft;
    int threads;
    bool allow_requantize;
} run;

static sb_status quantize_file(const run *o, sb_gguf *in, sb_gguf_writer *w, sb_threadpool *tp, sb_error *err) {
    sb_quant_plan plan;
    sb_status st = make_plan(in, o->ft, &plan, err);
    if (st != SB_OK)
        return st;
    for (uint64_t i = 0; i < in->n_kv; i++) {
        const sb_gguf_kv *kv = &in->kv[i];
        if (key_is(kv, "general.file_type") || key_is(kv, "general.quantization_version"))
            continue;
        if (key_is(kv, "general.alignment") && kv->type == SB_GGUF_UINT32)
            sb_gguf_set_u32(w, "general.alignment", (uint32_t)sb_gguf_kv_f64(kv));
        else
            sb_gguf_copy_kv(w, kv);
    }
    sb_gguf_set_u32(w, "general.quantization_version", SB_QUANT_VERSION);
    sb_gguf_set_u32(w, "general.file_type", o->ft->ftype);

    uint64_t *order = sb_calloc(in->n_tensors ? in->n_tensors : 1, sizeof(uint64_t));
    if (!order)
        return sb_fail(err, SB_ERR_NOMEM, "out of memory");
    for (uint64_t i = 0; i < in->n_tensors; i++)
        order[i] = i;
    sort_file = in;
    qsort(order, in->n_tensors, sizeof(uint64_t), by_name);

    const bool tty = isatty(2);
    bool warned = false;
    for (uint64_t k = 0; k < in->n_tensors && st == SB_OK; k++) {
        const sb_gguf_tensor *t = &in->tensors[order[k]];
        char name[128];
        tensor_name(t, name, sizeof(name));
        bool quantize;
        sb_type type;
        sb_quant_choose(&plan, name, t->n_dims, t->ne, (sb_type)t->type, &quantize, &type);
        progress(k, in->n_tensors, name, tty);
        if (!quantize) {
            sb_gguf_add_tensor(w, name, t->type, t->n_dims, t->ne, t->data, t->nbytes);
            continue;
        }
        if (!is_float_type(t->type)) {
            if (!o->allow_requantize) {
                st = sb_fail(err, SB_ERR_INVALID_ARG,
                             "%s: tensor %s is already quantized (%s); requantizing loses accuracy "
                             "(--allow-requantize to do it anyway)",
                             o->in_path, name, sb_type_traits_of(t->type) ? sb_type_traits_of(t->type)->name : "?");
                break;
            }
            if (!warned)
                fprintf(stderr, "switchboard: warning: requantizing %s from %s: the result is worse than quantizing "
                                "the original float weights\n",
                        o->in_path, sb_type_traits_of(t->type) ? sb_type_traits_of(t->type)->name : "?");
            warned = true;
        }
        const int64_t n_in = t->ne[0], nrows = (int64_t)(t->nbytes / sb_type_row_size((sb_type)t->type, n_in));
        const size_t bytes = sb_type_row_size(type, n_in) * (size_t)nrows;
        void *buf = sb_malloc(bytes ? bytes : 1);
        if (!buf) {
            st = sb_fail(err, SB_ERR_NOMEM, "out of memory for %zu bytes of %s", bytes, name);
            break;
        }
        st = sb_quant_rows(tp, (sb_type)t->type, t->data, type, buf, n_in, nrows, err);
        if (st == SB_OK)
            sb_gguf_add_tensor(w, name, type, t->n_dims, t->ne, buf, bytes);
        sb_free(buf);
    }
    if (st == SB_OK)
        progress(in->n_tensors, in->n_tensors, "", tty);
    sb_free(order);
    return st;
}

int sb_cmd_quantize(int argc, char **argv) {
    run o = {.threads = (int)sysconf(_SC_NPROCESSORS_ONLN)};
    const char *pos[3] = {0}, *v;
    int n_pos = 0, operands = argc;
    for (int i = 1; i < argc; i++) {
        if (sb_cli_end_of_options(argc, argv, i, &operands))
            break;
        if (sb_cli_opt(argc, argv, &i, "--threads", &v) || sb_cli_opt(argc, argv, &i, "-t", &v))
            o.threads = (int)sb_cli_int("--threads", v, 1, 256);
        else if (strcmp(argv[i], "--allow-requantize") == 0)
            o.allow_requantize = true;
        else if (argv[i][0] == '-' && argv[i][1] != '\0') {
            fprintf(stderr, "switchboard quantize: unknown option '%s'\n%s", argv[i], usage);
            return SB_EXIT_USAGE;
        } else if (n_pos < 3)
            pos[n_pos++] = argv[i];
        else {
            fprintf(stderr, "switchboard quantize: unexpected argument '%s'\n%s", argv[i], usage);
            return SB_EXIT_USAGE;
        }
    }
    for (int i = operands; i < argc; i++) { /* after '--' */
        if (n_pos == 3) {
            fprintf(stderr, "switchboard quantize: unexpected argument '%s'\n%s", argv[i], usage);
            return SB_EXIT_USAGE;
        }
        pos[n_pos++] = argv[i];
    }
    if (n_pos < 3) {
        fprintf(stderr, "switchboard quantize: %s\n%s", n_pos < 2 ? "IN and OUT files are needed" : "TYPE is missing",
                usage);
        return SB_EXIT_USAGE;
    }
    o.in_path = pos[0];
    o.out_path = pos[1];
    if (!(o.ft = sb_quant_ftype_find(pos[2]))) {
        fprintf(stderr, "switchboard quantize: unknown TYPE '%s' (one of: %s)\n", pos[2], sb_quant_ftype_names());
        return SB_EXIT_USAGE;
    }
    if (strcmp(o.in_path, o.out_path) == 0)
        return sb_cli_error("OUT must not be IN (%s): the input is read while the output is written", o.in_path);

    sb_error err = {0};
    sb_gguf *in = NULL;
    sb_gguf_writer *w = NULL;
    sb_threadpool *tp = NULL;
    char tmp[4096];
    struct stat sb;
    const bool in_place = stat(o.out_path, &sb) == 0 && !S_ISREG(sb.st_mode);
    if (in_place)
        snprintf(tmp, sizeof(tmp), "%s", o.out_path);
    else
        snprintf(tmp, sizeof(tmp), "%s.tmp-%ld", o.out_path, (long)getpid());
    const double t0 = sb_cli_now();
    sb_status st = sb_gguf_open(o.in_path, &in, &err);
    if (st == SB_OK && !(w = sb_gguf_writer_create()))
        st = sb_fail(&err, SB_ERR_NOMEM, "out of memory");
    if (st == SB_OK)
        st = sb_threadpool_create(o.threads, &tp, &err);
    if (st == SB_OK)
        st = quantize_file(&o, in, w, tp, &err);
    if (st == SB_OK && (st = sb_gguf_writer_save(w, tmp, &err)) != SB_OK && !in_place)
        unlink(tmp);
    if (st == SB_OK && !in_place && rename(tmp, o.out_path) != 0) {
        st = sb_fail(&err, SB_ERR_IO, "%s: cannot rename %s to it", o.out_path, tmp);
        unlink(tmp);
    }
    sb_threadpool_free(tp);
    sb_gguf_writer_free(w);
    sb_gguf_close(in);
    if (st != SB_OK)
        return sb_cli_error("%s", err.msg);
    fprintf(stderr, "quantize: %s -> %s (%s, file type %u) in %.2f s with %d threads\n", o.in_path, o.out_path,
            o.ft->name, o.ft->ftype, sb_cli_now() - t0, o.threads);
    return 0;
}
