/*
 * cmd_serve.c - `switchboard serve`: the OpenAI-compatible HTTP server
 * (src/server/) on a registry of models (--models models.json or a
 * directory of .gguf files; -m FILE is a one-model registry) until SIGINT or
 * SIGTERM; SIGHUP re-reads the registry. It listens first and reads the
 * registry after, so /health answers 503 meanwhile; the bound address is
 * printed as "listening on http://HOST:PORT" (with --port 0 the kernel
 * picks the port and this line says which). --state-dir turns on the Files
 * and Batch APIs, whose batches continue after a restart on the same one.
 */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "registry/regfile.h"
#include "server/server.h"

static const char serve_usage[] =
    "usage: switchboard serve (-m FILE [--alias NAME] | --models models.json|DIR) [--host 127.0.0.1] [--port 8080]\n"
    "                         [--memory-budget SIZE[K|M|G]] [--keep-alive DURATION (5m)] [--no-watch]\n"
    "                         [--ctx N (the model's trained context)] [--parallel N] [--threads N]\n"
    "                         [--max-batch-tokens N] [--max-body BYTES] [--max-queue N]\n"
    "                         [--timeout SECONDS] [--cache-type f32|f16|q8_0 (f16)] [--quiet]\n"
    "                         [--max-connections N (1024)] [--header-timeout SECONDS (10)] [--body-timeout SECONDS (60)]\n"
    "                         [--state-dir DIR (keys.db; with it given also usage.db, /v1/files, /v1/batches)]\n"
    "                         [--max-file-bytes SIZE (512M)] [--request-log FILE] [--request-log-max-bytes SIZE (64M)]\n"
    "                         [--cache off|memory|redis://HOST:PORT (off)] [--cache-bytes SIZE (256M)] [--cache-ttl DURATION (1h)]\n"
    "                         [--log-prompts] [--auth off|optional|required (required while any key exists, else off)]\n"
    "                         [--redis redis://HOST:PORT (rate limits shared by replicas)] [--metrics-auth]\n"
    "                         [--tiers NAME:PRIORITY[:MAX_IN_FLIGHT],... (paid:10,free:0,batch:-10)] [--cors ORIGINS|*]\n"
    "  without --state-dir keys live in $XDG_STATE_HOME/switchboard (else ~/.local/state/switchboard)\n"
    "  keys, limits, tiers, cache and usage: switchboard keys --help, docs/GATEWAY.md\n";

/* "8G", "512M", "100000": bytes; exits with a usage error otherwise. */
static size_t parse_size(const char *opt, const char *v) {
    char *end;
    double x = strtod(v, &end);
    double mult = 1;
    if (*end == 'K' || *end == 'k')
        mult = 1024.0, end++;
    else if (*end == 'M' || *end == 'm')
        mult = 1024.0 * 1024.0, end++;
    else if (*end == 'G' || *end == 'g')
        mult = 1024.0 * 1024.0 * 1024.0, end++;
    if ((*end == 'B' || *end == 'b') && end[1] == '\0')
        end++;
    if (end == v || *end || !(x > 0) || x * mult > 1e18) {
        fprintf(stderr, "switchboard serve: %s '%s' is not a size (bytes, or with a K/M/G suffix)\n", opt, v);
        exit(SB_EXIT_USAGE);
    }
    return (size_t)(x * mult);
}

static void log_line(void *user, const char *line) { fprintf(stderr, "switchboard serve: %s\n", line); }

/* Access lines are dropped with --quiet; start-up and errors still print. */
static void log_quiet(void *user, const char *line) {
    if (strncmp(line, "GET ", 4) != 0 && strncmp(line, "POST ", 5) != 0)
        log_line(user, line);
}

int sb_cmd_serve(int argc, char **argv) {
    sb_srv_params p = sb_srv_default_params();
    const char *v, *model = NULL, *models = NULL;
    bool quiet = false;
    p.engine.n_ctx = 0; /* each model's trained context, unless --ctx or its registry entry says otherwise */
    for (int i = 1; i < argc; i++) {
        if (sb_cli_end_of_options(argc, argv, i, NULL))
            break;
        if (sb_cli_opt(argc, argv, &i, "-m", &model) || sb_cli_opt(argc, argv, &i, "--model", &model) ||
            sb_cli_opt(argc, argv, &i, "--models", &models) || sb_cli_opt(argc, argv, &i, "--host", &p.host) ||
            sb_cli_opt(argc, argv, &i, "--alias", &p.model_id) || sb_cli_opt(argc, argv, &i, "--state-dir", &p.state_dir))
            continue;
        if (sb_cli_opt(argc, argv, &i, "--memory-budget", &v))
            p.memory_budget = parse_size("--memory-budget", v);
        else if (sb_cli_opt(argc, argv, &i, "--keep-alive", &v)) {
            int64_t ms;
            if (!sb_regfile_parse_duration(v, &ms)) {
                fprintf(stderr, "switchboard serve: --keep-alive '%s' is not a duration (30s, 5m, 1h, 0, -1)\n", v);
                return SB_EXIT_USAGE;
            }
            p.keep_alive_ms = ms;
        } else if (sb_cli_opt(argc, argv, &i, "--cache-ttl", &v)) {
            if (!sb_regfile_parse_duration(v, &p.cache_ttl_ms) || p.cache_ttl_ms <= 0) {
                fprintf(stderr, "switchboard serve: --cache-ttl '%s' is not a positive duration (500ms, 30s, 5m, 1h)\n", v);
                return SB_EXIT_USAGE;
            }
        } else if (sb_cli_opt(argc, argv, &i, "--cache", &p.cache) || sb_cli_opt(argc, argv, &i, "--request-log", &p.request_log))
            continue;
        else if (sb_cli_opt(argc, argv, &i, "--cache-bytes", &v))
            p.cache_bytes = parse_size("--cache-bytes", v);
        else if (sb_cli_opt(argc, argv, &i, "--request-log-max-bytes", &v))
            p.request_log_max_bytes = parse_size("--request-log-max-bytes", v);
        else if (strcmp(argv[i], "--log-prompts") == 0)
            p.log_prompts = true;
        else if (strcmp(argv[i], "--no-watch") == 0)
            p.watch = false;
        else
        if (sb_cli_opt(argc, argv, &i, "--port", &v))
            p.port = (uint16_t)sb_cli_int("--port", v, 0, 65535);
        else if (sb_cli_opt(argc, argv, &i, "-c", &v) || sb_cli_opt(argc, argv, &i, "--ctx", &v))
            p.engine.n_ctx = (int32_t)sb_cli_int("--ctx", v, 16, 1 << 24);
        else if (sb_cli_opt(argc, argv, &i, "-np", &v) || sb_cli_opt(argc, argv, &i, "--parallel", &v))
            p.engine.n_parallel = (int32_t)sb_cli_int("--parallel", v, 1, 4096);
        else if (sb_cli_opt(argc, argv, &i, "-t", &v) || sb_cli_opt(argc, argv, &i, "--threads", &v))
            p.n_threads = (int32_t)sb_cli_int("--threads", v, 1, 1024);
        else if (sb_cli_opt(argc, argv, &i, "--max-batch-tokens", &v))
            p.engine.max_batch_tokens = (int32_t)sb_cli_int("--max-batch-tokens", v, 1, 1 << 20);
        else if (sb_cli_opt(argc, argv, &i, "--max-queue", &v))
            p.engine.max_queue = (int32_t)sb_cli_int("--max-queue", v, 1, 1 << 20);
        else if (sb_cli_opt(argc, argv, &i, "--max-body", &v))
            p.max_body = (size_t)sb_cli_int("--max-body", v, 1, INT64_C(1) << 32);
        else if (sb_cli_opt(argc, argv, &i, "--max-file-bytes", &v))
            p.max_file_bytes = parse_size("--max-file-bytes", v);
        else if (sb_cli_opt(argc, argv, &i, "--cache-type", &v))
            p.engine.cache_type = sb_cli_cache_type("--cache-type", v);
        else if (sb_cli_opt(argc, argv, &i, "--timeout", &v))
            p.timeout_s = (uint32_t)sb_cli_int("--timeout", v, 1, 86400);
        else if (sb_cli_opt(argc, argv, &i, "--max-connections", &v))
            p.max_connections = (uint32_t)sb_cli_int("--max-connections", v, 1, 1 << 20);
        else if (sb_cli_opt(argc, argv, &i, "--header-timeout", &v))
            p.header_timeout_s = (uint32_t)sb_cli_int("--header-timeout", v, 1, 86400);
        else if (sb_cli_opt(argc, argv, &i, "--body-timeout", &v))
            p.body_timeout_s = (uint32_t)sb_cli_int("--body-timeout", v, 1, 86400);
        else if (strcmp(argv[i], "--quiet") == 0)
            quiet = true;
        else if (sb_cli_opt(argc, argv, &i, "--redis", &p.redis) ||
                 sb_cli_opt(argc, argv, &i, "--tiers", &p.tiers) || sb_cli_opt(argc, argv, &i, "--cors", &p.cors))
            continue;
        else if (sb_cli_opt(argc, argv, &i, "--auth", &v)) {
            if (!sb_gw_parse_auth(v, &p.auth)) {
                fprintf(stderr, "switchboard serve: --auth '%s': use off, optional or required\n", v);
                return SB_EXIT_USAGE;
            }
        } else if (strcmp(argv[i], "--metrics-auth") == 0)
            p.metrics_auth = true;
        else {
            fprintf(stderr, "switchboard serve: unknown option '%s'\n%s", argv[i], serve_usage);
            return SB_EXIT_USAGE;
        }
    }
    if (!model == !models) {
        fprintf(stderr, "switchboard serve: give one of -m FILE or --models REGISTRY\n%s", serve_usage);
        return SB_EXIT_USAGE;
    }
    p.models = model ? model : models;
    p.log = quiet ? log_quiet : log_line;

    /* Every thread started from here on inherits this mask, so the signals
     * reach only sigwait below; SIGPIPE from a vanished client is ignored. */
    sigset_t stop_signals;
    sigemptyset(&stop_signals);
    sigaddset(&stop_signals, SIGINT);
    sigaddset(&stop_signals, SIGTERM);
    sigaddset(&stop_signals, SIGHUP);
    pthread_sigmask(SIG_BLOCK, &stop_signals, NULL);
    signal(SIGPIPE, SIG_IGN);

    sb_srv *srv;
    sb_error err;
    if (sb_srv_start(&p, &srv, &err) != SB_OK)
        return sb_cli_error("%s", err.msg);
    fprintf(stderr, "switchboard serve: listening on http://%s:%u (registry %s)\n", p.host, (unsigned)sb_srv_port(srv),
            p.models);
    double t0 = sb_cli_now();
    if (sb_srv_load(srv, &err) != SB_OK) {
        sb_srv_stop(srv);
        return sb_cli_error("%s", err.msg);
    }
    fprintf(stderr, "switchboard serve: ready in %.2fs\n", sb_cli_now() - t0);

    int sig = 0;
    while (sigwait(&stop_signals, &sig) == 0 && sig == SIGHUP) {
        if (sb_srv_reload(srv, &err) != SB_OK)
            fprintf(stderr, "switchboard serve: SIGHUP: the registry is unchanged: %s\n", err.msg);
        else
            fprintf(stderr, "switchboard serve: SIGHUP: registry reloaded\n");
    }
    fprintf(stderr, "switchboard serve: %s, stopping\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
    sb_srv_stop(srv);
    return 0;
}
