/*
 * main.c - the `switchboard` command: dispatches to one subcommand per file
 * (cmd_*.c) and holds the option parsing they share.
 */
#include <errno.h>
#include <stdbool.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/base.h"
#include "cli/cli.h"

static const char usage[] =
    "usage: switchboard <command> [options]\n"
    "\n"
    "commands:\n"
    "  run        generate text:  run -m FILE -p PROMPT [-n N] [--temp T] [--top-k K] [--top-p P]\n"
    "             [--min-p P] [--repeat-penalty R] [--seed S] [--threads N] [--ctx N] [--cache-type f32|f16|q8_0]\n"
    "             [--stop S] [--json]\n"
    "             [--chat [--system TEXT]]  (PROMPT is a user message, formatted by the chat template)\n"
    "  bench      measure speed like llama-bench:  bench -m FILE [-p 512] [-n 128] [-t THREADS] [-r REPS]\n"
    "             [--cache-type f32|f16|q8_0] [-o table|json] [--progress]\n"
    "  serve      OpenAI-compatible HTTP server:  serve -m FILE [--host 127.0.0.1] [--port 8080] [--ctx N]\n"
    "             [--parallel N] [--threads N] [--alias NAME] [--max-batch-tokens N] [--max-body BYTES]\n"
    "             [--max-queue N] [--timeout SECONDS] [--cache-type f32|f16|q8_0] [--quiet]\n"
    "             [--state-dir DIR] [--auth off|optional|required] [--redis redis://HOST:PORT] [--tiers SPEC]\n"
    "             [--cors ORIGINS] [--metrics-auth]   (keys, limits, tiers: docs/GATEWAY.md)\n"
    "  batch      run an OpenAI batch file, durably (a rerun resumes):  batch IN.jsonl -o OUT.jsonl\n"
    "             (-m FILE | --models REGISTRY) [--state-dir DIR] [--parallel N] [--threads N] [--quiet]\n"
    "  keys       API keys of a state directory (serve --state-dir):  keys create --name N [--tier T] [--rps N]\n"
    "             [--rpm N] [--tpm N] [--models a,b] [--expires DATE|+30d] [--admin] [--tiers SPEC] |\n"
    "             keys list | keys disable|enable|delete NAME   (each with [--state-dir DIR]; default\n"
    "             $XDG_STATE_HOME/switchboard, else ~/.local/state/switchboard; create prints the key last)\n"
    "  info       print the metadata and tensor table of a GGUF file:  info FILE\n"
    "  tokenize   print token ids as a JSON array:  tokenize -m FILE [--no-bos] [--special] [--pieces] [--] TEXT\n"
    "  template   render a chat template:  template (-m FILE | --file T.jinja | --builtin NAME) --messages M.json\n"
    "             [--tools T.json] [--kwargs K.json] [--no-generation-prompt] [--bos S] [--eos S] [--now TIME]\n"
    "  gen-model  write a random llama model:  gen-model --out FILE [--type f32|f16|bf16|q8_0|q4_0|...]\n"
    "             [--dim N] [--hidden N] [--layers N] [--heads N] [--kv-heads N] [--vocab N] [--ctx N] [--seed S]\n"
    "  quantize   quantize a model as llama.cpp's quantizer does:  quantize IN.gguf OUT.gguf TYPE [--threads N]\n"
    "             [--allow-requantize]   (TYPE: q8_0 q4_0 q4_1 q5_0 q5_1 q2_k q3_k_m q4_k_m q5_k_m q6_k)\n"
    "  usage      requests, tokens, cost and ratings a server recorded:  usage --state-dir DIR\n"
    "             [--by model|key|day] [--since YYYY-MM-DD]\n"
    "\n"
    "'--' ends a command's options: what follows is an operand even if it starts with '-'\n"
    "(switchboard tokenize -m FILE -- -x).\n";

int sb_cli_error(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("switchboard: error: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    return 1;
}

static void usage_error(const char *fmt, const char *arg) {
    fputs("switchboard: ", stderr);
    fprintf(stderr, fmt, arg);
    fputs(" (see 'switchboard --help')\n", stderr);
    exit(SB_EXIT_USAGE);
}

bool sb_cli_opt(int argc, char **argv, int *i, const char *name, const char **value) {
    if (strcmp(argv[*i], name) != 0)
        return false;
    if (*i + 1 >= argc)
        usage_error("option %s needs a value", name);
    *value = argv[++*i];
    return true;
}

bool sb_cli_end_of_options(int argc, char **argv, int i, int *operands) {
    if (strcmp(argv[i], "--") != 0)
        return false;
    if (operands)
        *operands = i + 1;
    else if (i + 1 < argc) {
        char msg[256];
        snprintf(msg, sizeof(msg), "%s: unexpected argument '%.64s' after '--' (this command takes options only)",
                 argv[0], argv[i + 1]);
        usage_error("%s", msg);
    }
    return true;
}

int64_t sb_cli_int(const char *opt, const char *value, int64_t min, int64_t max) {
    char *end;
    errno = 0;
    long long v = strtoll(value, &end, 10);
    if (errno || end == value || *end || v < min || v > max) {
        fprintf(stderr, "switchboard: option %s: '%s' is not an integer in [%lld, %lld]\n", opt, value,
                (long long)min, (long long)max);
        exit(SB_EXIT_USAGE);
    }
    return v;
}

float sb_cli_float(const char *opt, const char *value) {
    char *end;
    errno = 0;
    float v = strtof(value, &end);
    if (errno || end == value || *end || !isfinite(v)) {
        fprintf(stderr, "switchboard: option %s: '%s' is not a number\n", opt, value);
        exit(SB_EXIT_USAGE);
    }
    return v;
}

sb_cache_type sb_cli_cache_type(const char *opt, const char *value) {
    sb_cache_type t;
    if (!sb_cache_type_parse(value, &t)) {
        fprintf(stderr, "switchboard: option %s: '%s' is not a KV-cache type (f32, f16 or q8_0)\n", opt, value);
        exit(SB_EXIT_USAGE);
    }
    return t;
}

char *sb_cli_read_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    char *buf = NULL;
    size_t len = 0, cap = 0, n;
    char chunk[65536];
    while ((n = fread(chunk, 1, sizeof(chunk), f)) > 0) {
        if (len + n + 1 > cap) {
            cap = (len + n + 1) * 2;
            char *p = sb_realloc(buf, cap);
            if (!p) {
                sb_free(buf);
                fclose(f);
                return NULL;
            }
            buf = p;
        }
        memcpy(buf + len, chunk, n);
        len += n;
    }
    bool failed = ferror(f);
    fclose(f);
    if (failed) {
        sb_free(buf);
        return NULL;
    }
    if (!buf)
        buf = sb_malloc(1);
    if (buf)
        buf[len] = '\0';
    return buf;
}

double sb_cli_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int sb_cmd_bench(int argc, char **argv); /* cmd_bench.c */
int sb_cmd_template(int argc, char **argv); /* cmd_template.c */
int sb_cmd_serve(int argc, char **argv); /* cmd_serve.c */
int sb_cmd_quantize(int argc, char **argv); /* cmd_quantize.c */
int sb_cmd_usage(int argc, char **argv);    /* cmd_usage.c */
int sb_cmd_batch(int argc, char **argv); /* cmd_batch.c */
int sb_cmd_keys(int argc, char **argv); /* cmd_keys.c */

/* The library's diagnostics, as the CLI's own: on stderr, one line each. */
static void log_line(void *user, int level, const char *line) {
    (void)user;
    static const char *const names[] = {[SB_LOG_ERROR] = "error", [SB_LOG_WARN] = "warning", [SB_LOG_INFO] = "note"};
    fprintf(stderr, "switchboard: %s: %s\n", level >= 0 && (size_t)level < SB_ARRAY_LEN(names) ? names[level] : "note",
            line);
}

int main(int argc, char **argv) {
    sb_set_log_callback(log_line, NULL);
    static const struct {
        const char *name;
        int (*fn)(int, char **);
    } commands[] = {
        {"run", sb_cmd_run},
        {"info", sb_cmd_info},
        {"tokenize", sb_cmd_tokenize},
        {"gen-model", sb_cmd_gen_model},
        {"bench", sb_cmd_bench},
        {"template", sb_cmd_template},
        {"serve", sb_cmd_serve},
        {"quantize", sb_cmd_quantize},
        {"usage", sb_cmd_usage},
        {"batch", sb_cmd_batch},
        {"keys", sb_cmd_keys},
    };
    if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
        fputs(usage, argc < 2 ? stderr : stdout);
        return argc < 2 ? SB_EXIT_USAGE : 0;
    }
    /* `switchboard <command> --help`: the usage lists every command's options. */
    const bool wants_help = argc > 2 && (strcmp(argv[2], "--help") == 0 || strcmp(argv[2], "-h") == 0);
    for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
        if (strcmp(argv[1], commands[i].name) == 0) {
            if (wants_help) {
                fputs(usage, stdout);
                return 0;
            }
            return commands[i].fn(argc - 1, argv + 1);
        }
    usage_error("unknown command '%s'", argv[1]);
    return SB_EXIT_USAGE;
}
