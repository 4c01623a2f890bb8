/*
 * bench/tokenize.c - tokenizer throughput on ~1 MB of mixed-script text.
 *
 *   bench_tokenize [-m FILE.gguf] [-r REPS] [--text-out PATH] [--ids-out PATH] [--ids-in PATH]
 *
 * The text is built deterministically from the strings of
 * models/llama3-tokenizer.jsonl (every script, emoji, code, URLs, odd
 * white space) interleaved with plain English prose, which makes up most of
 * it. It is tokenized -r times (default 5) in one call each, with
 * add_special and parse_special off, as llama.cpp's llama_tokenize is called
 * by node-llama-cpp's model.tokenize(text); the best time is reported as
 * MB/s (1 MB = 10^6 bytes) on stdout as one JSON object.
 *
 * --text-out writes the text, for bench/llamacpp/tokenize.mjs to time
 * llama.cpp on the same bytes; --ids-out writes the ids (int32, little
 * endian); --ids-in compares them with ids written by tokenize.mjs and
 * reports the first difference. Default model: the Llama 3 vocabulary.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/base.h"
#include "gguf/gguf.h"
#include "tokenizer/vocab.h"

#ifndef SB_SHARED_DIR
#define SB_SHARED_DIR "../shared"
#endif

static const char *const english[] = {
    "The committee met on Tuesday to review the budget for the coming year. After a long discussion, "
    "the members agreed that the library would receive additional funding for its digital archive, "
    "while the sports program would have to wait until the next quarter. ",
    "She opened the window and listened to the rain falling on the roof. It had been years since she "
    "last visited the house by the lake, and everything looked smaller than she remembered. ",
    "To install the package, run the setup script and follow the instructions on the screen. If the "
    "installer reports a missing dependency, install it first and try again; most problems go away "
    "after a restart. ",
    "Researchers found that students who slept at least eight hours before an exam scored 12% higher "
    "on average than those who didn't. The study, published in 2023, followed 1,204 participants. ",
    "\"Are you sure?\" he asked. \"I've never seen anything like it, and I'm not sure we'll ever see it "
    "again.\" She laughed, shook her head, and walked back to the car.\n\n",
    "Chapter 3: The Long Road Home\n\nThe train left the station at 6:45 in the morning, carrying "
    "tired commuters, a few tourists with heavy bags, and a small dog that refused to sit still. ",
};

/* The "text" of every line of the jsonl file (a minimal reader: the text
 * field is the first string of each line). Returns the count. */
static size_t read_jsonl_texts(const char *path, char ***out) {
    FILE *f = fopen(path, "rb");
    if (!f)
        return 0;
    size_t n = 0, cap = 0;
    char **texts = NULL, line[65536];
    while (fgets(line, sizeof(line), f)) {
        const char *p = strstr(line, "\"text\":\"");
        if (!p)
            continue;
        p += 8;
        char *t = malloc(strlen(p) + 1), *w = t;
        for (; *p && *p != '"'; p++) {
            if (*p != '\\') {
                *w++ = *p;
                continue;
            }
            char e = *++p;
            if (e == 'n')
                *w++ = '\n';
            else if (e == 't')
                *w++ = '\t';
            else if (e == 'r')
                *w++ = '\r';
            else if (e == 'b')
                *w++ = '\b';
            else if (e == 'f')
                *w++ = '\f';
            else if (e == 'u') {
                unsigned cp = (unsigned)strtoul((char[5]){p[1], p[2], p[3], p[4], 0}, NULL, 16);
                p += 4;
                if (cp >= 0xD800 && cp < 0xDC00 && p[1] == '\\' && p[2] == 'u') {
                    unsigned lo = (unsigned)strtoul((char[5]){p[3], p[4], p[5], p[6], 0}, NULL, 16);
                    cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                    p += 6;
                }
                if (cp < 0x80) {
                    *w++ = (char)cp;
                } else if (cp < 0x800) {
                    *w++ = (char)(0xC0 | cp >> 6);
                    *w++ = (char)(0x80 | (cp & 0x3F));
                } else if (cp < 0x10000) {
                    *w++ = (char)(0xE0 | cp >> 12);
                    *w++ = (char)(0x80 | (cp >> 6 & 0x3F));
                    *w++ = (char)(0x80 | (cp & 0x3F));
                } else {
                    *w++ = (char)(0xF0 | cp >> 18);
                    *w++ = (char)(0x80 | (cp >> 12 & 0x3F));
                    *w++ = (char)(0x80 | (cp >> 6 & 0x3F));
                    *w++ = (char)(0x80 | (cp & 0x3F));
                }
            } else {
                *w++ = e;
            }
        }
        *w = '\0';
        if (n == cap) {
            cap = cap ? 2 * cap : 128;
            texts = realloc(texts, cap * sizeof(*texts));
        }
        texts[n++] = t;
    }
    fclose(f);
    *out = texts;
    return n;
}

/* ~1 MB: English paragraphs with a jsonl string after every few. */
static char *build_text(size_t target, size_t *len) {
    char **texts = NULL;
    size_t n_texts = read_jsonl_texts(SB_SHARED_DIR "/models/llama3-tokenizer.jsonl", &texts);
    if (n_texts == 0) {
        fprintf(stderr, "bench_tokenize: cannot read %s\n", SB_SHARED_DIR "/models/llama3-tokenizer.jsonl");
        exit(1);
    }
    char *buf = malloc(target + 65536);
    size_t n = 0;
    uint32_t x = 2463534242u; /* xorshift32 */
    for (size_t i = 0; n < target; i++) {
        x ^= x << 13, x ^= x >> 17, x ^= x << 5;
        const char *s = (i % 3 == 2) ? texts[x % n_texts] : english[x % SB_ARRAY_LEN(english)];
        size_t m = strlen(s);
        memcpy(buf + n, s, m);
        n += m;
        if (i % 3 == 2)
            buf[n++] = '\n';
    }
    for (size_t i = 0; i < n_texts; i++)
        free(texts[i]);
    free(texts);
    *len = n;
    return buf;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int main(int argc, char **argv) {
    const char *model = SB_SHARED_DIR "/models/llama3-vocab-tiny-random.gguf";
    const char *text_out = NULL, *ids_out = NULL, *ids_in = NULL;
    int reps = 5;
    for (int i = 1; i < argc; i += 2) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) {
            fprintf(stderr, "bench_tokenize: option %s needs a value\n", a);
            return 2;
        }
        if (!strcmp(a, "-m"))
            model = v;
        else if (!strcmp(a, "-r"))
            reps = atoi(v) > 0 ? atoi(v) : 1;
        else if (!strcmp(a, "--text-out"))
            text_out = v;
        else if (!strcmp(a, "--ids-out"))
            ids_out = v;
        else if (!strcmp(a, "--ids-in"))
            ids_in = v;
        else {
            fprintf(stderr, "usage: bench_tokenize [-m FILE] [-r REPS] [--text-out PATH] [--ids-out PATH] "
                            "[--ids-in PATH]\n");
            return 2;
        }
    }

    sb_error err = {0};
    sb_gguf *g = NULL;
    sb_vocab *v = NULL;
    double t0 = now_s();
    if (sb_gguf_open(model, &g, &err) != SB_OK || sb_vocab_load(g, &v, &err) != SB_OK) {
        fprintf(stderr, "bench_tokenize: %s: %s\n", model, err.msg);
        return 1;
    }
    double load_s = now_s() - t0;
    sb_gguf_close(g);

    size_t len;
    char *text = build_text(1000000, &len);
    if (text_out) {
        FILE *f = fopen(text_out, "wb");
        if (!f || fwrite(text, 1, len, f) != len || fclose(f) != 0) {
            fprintf(stderr, "bench_tokenize: cannot write %s\n", text_out);
            return 1;
        }
    }

    size_t cap = len + 16, n = 0;
    int32_t *ids = malloc(cap * sizeof(*ids));
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        t0 = now_s();
        if (sb_vocab_tokenize(v, text, len, false, false, ids, cap, &n, &err) != SB_OK) {
            fprintf(stderr, "bench_tokenize: %s\n", err.msg);
            return 1;
        }
        double dt = now_s() - t0;
        best = dt < best ? dt : best;
    }

    if (ids_out) {
        FILE *f = fopen(ids_out, "wb");
        if (!f || fwrite(ids, sizeof(*ids), n, f) != n || fclose(f) != 0) {
            fprintf(stderr, "bench_tokenize: cannot write %s\n", ids_out);
            return 1;
        }
    }
    long first_diff = -1, n_ref = -1;
    if (ids_in) {
        FILE *f = fopen(ids_in, "rb");
        if (!f) {
            fprintf(stderr, "bench_tokenize: cannot read %s\n", ids_in);
            return 1;
        }
        int32_t *ref = malloc(cap * sizeof(*ref));
        n_ref = (long)fread(ref, sizeof(*ref), cap, f);
        fclose(f);
        for (long i = 0; first_diff < 0 && i < (long)n && i < n_ref; i++)
            if (ref[i] != ids[i])
                first_diff = i;
        if (first_diff < 0 && n_ref != (long)n)
            first_diff = n_ref < (long)n ? n_ref : (long)n;
        free(ref);
    }

    printf("{\"engine\": \"switchboard\", \"model\": \"%s\", \"bytes\": %zu, \"tokens\": %zu, \"reps\": %d, "
           "\"best_s\": %.6f, \"mb_per_s\": %.2f, \"load_s\": %.3f",
           model, len, n, reps, best, (double)len / best / 1e6, load_s);
    if (ids_in)
        printf(", \"ref_tokens\": %ld, \"first_diff\": %ld", n_ref, first_diff);
    printf("}\n");
    free(ids);
    free(text);
    sb_vocab_free(v);
    return ids_in && first_diff >= 0 ? 3 : 0;
}
