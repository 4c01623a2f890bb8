/*
 * cmd_info.c - `switchboard info FILE`: the metadata and tensor table of
 * any GGUF file (not only models switchboard can run).
 */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "gguf/gguf.h"
#include "tensor/tensor.h"

#define ARRAY_PREVIEW 8

/* Prints a string with JSON-style escapes, cut at max bytes. */
static void print_str(sb_gguf_str s, uint64_t max) {
    putchar('"');
    for (uint64_t i = 0; i < s.len && i < max; i++) {
        unsigned char ch = (unsigned char)s.ptr[i];
        if (ch == '"' || ch == '\\')
            printf("\\%c", ch);
        else if (ch == '\n')
            fputs("\\n", stdout);
        else if (ch < 0x20)
            printf("\\u%04x", ch);
        else
            putchar(ch);
    }
    putchar('"');
    if (s.len > max)
        printf("...(%" PRIu64 " bytes)", s.len);
}

static void print_scalar(sb_gguf_vtype type, const uint8_t *p) {
    sb_gguf_kv kv = {.type = type, .value = p};
    switch (type) {
    case SB_GGUF_BOOL: fputs(*p ? "true" : "false", stdout); break;
    case SB_GGUF_FLOAT32:
    case SB_GGUF_FLOAT64: printf("%.9g", sb_gguf_kv_f64(&kv)); break;
    case SB_GGUF_UINT64: {
        uint64_t v;
        memcpy(&v, p, 8);
        printf("%" PRIu64, v);
        break;
    }
    default: printf("%.0f", sb_gguf_kv_f64(&kv)); break;
    }
}

static void print_value(const sb_gguf_kv *kv) {
    if (kv->type == SB_GGUF_STRING) {
        sb_gguf_str s;
        memcpy(&s.len, kv->value, 8);
        s.ptr = (const char *)kv->value + 8;
        print_str(s, 200);
        return;
    }
    if (kv->type != SB_GGUF_ARRAY) {
        print_scalar(kv->type, kv->value);
        return;
    }
    putchar('[');
    const uint8_t *p = kv->value;
    for (uint64_t i = 0; i < kv->arr_n && i < ARRAY_PREVIEW; i++) {
        if (i)
            fputs(", ", stdout);
        if (kv->arr_type == SB_GGUF_STRING) {
            sb_gguf_str s;
            memcpy(&s.len, p, 8);
            s.ptr = (const char *)p + 8;
            print_str(s, 40);
            p += 8 + s.len;
        } else {
            print_scalar(kv->arr_type, p);
            p += sb_gguf_vtype_size(kv->arr_type);
        }
    }
    if (kv->arr_n > ARRAY_PREVIEW)
        fputs(", ...", stdout);
    putchar(']');
}

int sb_cmd_info(int argc, char **argv) {
    int first = 1; /* FILE, or the argument after `--` */
    if (argc > 1)
        sb_cli_end_of_options(argc, argv, 1, &first);
    if (argc - first != 1) {
        fputs("usage: switchboard info [--] FILE\n", stderr);
        return SB_EXIT_USAGE;
    }
    const char *path = argv[first];
    sb_gguf *g;
    sb_error err;
    if (sb_gguf_open(path, &g, &err) != SB_OK)
        return sb_cli_error("%s", err.msg);
    printf("file: %s\n", path);
    printf("gguf version %u, %" PRIu64 " bytes, %" PRIu64 " metadata entries, %" PRIu64
           " tensors, alignment %u, data at offset %" PRIu64 "\n",
           g->version, g->size, g->n_kv, g->n_tensors, g->alignment, g->data_offset);
    printf("\nmetadata:\n");
    for (uint64_t i = 0; i < g->n_kv; i++) {
        const sb_gguf_kv *kv = &g->kv[i];
        char type[48];
        if (kv->type == SB_GGUF_ARRAY)
            snprintf(type, sizeof(type), "%s[%" PRIu64 "]", sb_gguf_vtype_name(kv->arr_type), kv->arr_n);
        else
            snprintf(type, sizeof(type), "%s", sb_gguf_vtype_name(kv->type));
        printf("  %-44.*s %-16s ", (int)kv->key.len, kv->key.ptr, type);
        print_value(kv);
        putchar('\n');
    }
    printf("\ntensors:\n  %-36s %-6s %-24s %12s %12s\n", "name", "type", "shape", "offset", "bytes");
    uint64_t total = 0;
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const sb_gguf_tensor *t = &g->tensors[i];
        char shape[64];
        int o = snprintf(shape, sizeof(shape), "[");
        for (uint32_t d = 0; d < t->n_dims; d++)
            o += snprintf(shape + o, sizeof(shape) - (size_t)o, "%s%" PRId64, d ? ", " : "", t->ne[d]);
        snprintf(shape + o, sizeof(shape) - (size_t)o, "]");
        printf("  %-36.*s %-6s %-24s %12" PRIu64 " %12" PRIu64 "\n", (int)t->name.len, t->name.ptr,
               sb_type_traits_of(t->type)->name, shape, t->offset, t->nbytes);
        total += t->nbytes;
    }
    printf("\n%" PRIu64 " tensors, %" PRIu64 " bytes of tensor data\n", g->n_tensors, total);
    sb_gguf_close(g);
    return 0;
}
