/*
 * cmd_summarize.c - `switchboard batch --summarize DIR|LIST`: the video
 * summarisation job (src/batch/video.h) on an in-process server (no socket;
 * server/inproc.h), its summary requests at the batch tier's priority, the
 * prompt sizes counted with the serving model's tokenizer and chat template.
 * cmd_batch.c hands `batch` over here when --summarize is given.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/base.h"
#include "batch/runner.h"
#include "batch/video.h"
#include "cli/cli.h"
#include "api/api-internal.h"
#include "model/chat.h"
#include "registry/registry.h"
#include "server/inproc.h"
#include "server/server-impl.h"

static const char summarize_usage[] =
    "usage: switchboard batch --summarize DIR|LIST -o OUT.jsonl --captioner CMD|URL (-m FILE | --models REGISTRY)\n"
    "                         [--model NAME] [--state-dir DIR (OUT.jsonl.state)] [--ctx N] [--threads N]\n"
    "                         [--scene T (0.3)] [--min-gap SECONDS (1)] [--max-keyframes N (16)] [--frame-width PX (320)]\n"
    "                         [--summary-tokens N (256)] [--queue N (2)] [--ffmpeg-timeout SECONDS (600)]\n"
    "                         [--captioner-model NAME] [--captioner-key KEY (or $SWITCHBOARD_CAPTIONER_KEY)]\n"
    "                         [--captioner-prompt TEXT] [--captioner-timeout SECONDS (60)] [--captioner-retries N (3)]\n"
    "                         [--caption-parallel N (1)] [--quiet]\n"
    "  DIR: its video files (.mp4 .mkv .webm .mov ...), by name; LIST: a file with one path a line.\n"
    "  CMD is run with the keyframe image's path as its last argument and prints the caption;\n"
    "  URL is an OpenAI-compatible vision chat endpoint.\n";

/* The model the summaries go to, held for the whole job: its tokenizer and
 * template size the prompts. */
typedef struct llm_ctx {
    sb_srv *srv;
    sb_held_t *held;
    const sb_reg_lease *lease; /* the held model's: its chat template */
    sb_gw_caller caller;
} llm_ctx;

static sb_status complete(void *user, const char *body, int *http_status, char **response, sb_error *err) {
    llm_ctx *c = user;
    return sb_srv_execute(c->srv, "/v1/chat/completions", body, strlen(body), &c->caller, http_status, response, err);
}

static int32_t count_chat(void *user, const char *messages) {
    llm_ctx *c = user;
    int32_t *ids = NULL;
    size_t n = 0;
    sb_error err;
    sb_status st = sb_chat_tokenize(sb_reg_lease_chat(c->lease), messages, &ids, &n, &err);
    sb_free(ids);
    return st == SB_OK ? (int32_t)n : -1;
}

static int32_t count_text(void *user, const char *text) {
    llm_ctx *c = user;
    size_t n = 0;
    sb_error err;
    sb_status st = sb_tokenize(sb_reg_lease_model(c->lease), text, strlen(text), false, false, NULL, 0, &n, &err);
    return st == SB_OK || st == SB_ERR_INVALID_ARG ? (int32_t)n : -1; /* cap 0: the count, with INVALID_ARG */
}

static void log_line(void *user, const char *line) { fprintf(stderr, "switchboard batch: %s\n", line); }

/* The name a one-model source serves under: the file's name without .gguf. */
static const char *default_model(sb_srv *srv, char *buf, size_t cap) {
    sb_model_info info[2];
    if (sb_switchboard_list(srv->sb, info, 2) != 1)
        return NULL;
    snprintf(buf, cap, "%s", info[0].name);
    return buf;
}

static void print_report(const sb_video_report *r) {
    double sum = r->busy_s[0] + r->busy_s[1] + r->busy_s[2];
    fprintf(stderr,
            "switchboard batch: %d videos (%d ok, %d failed); this run: %d extracted, %d keyframes captioned (%d "
            "errors), %d summarised in %d requests\n"
            "switchboard batch: busy extract %.2fs, caption %.2fs, summarise %.2fs: %.2fs of work in %.2fs wall "
            "(overlap %.2fx)\n",
            r->videos, r->ok, r->failed, r->extracted, r->keyframes, r->caption_errors, r->summarized, r->llm_calls,
            r->busy_s[0], r->busy_s[1], r->busy_s[2], sum, r->wall_s, r->wall_s > 0 ? sum / r->wall_s : 0);
}

int sb_cli_batch_summarize(int argc, char **argv) {
    sb_video_params vp = sb_video_default_params();
    sb_srv_params sp = sb_srv_default_params();
    sp.engine.n_ctx = 0;
    sp.no_listen = true;
    sp.keep_alive_ms = -1;
    const char *v, *model = NULL, *models = NULL, *name = NULL;
    bool quiet = false;
    char state[4200];
    for (int i = 1; i < argc; i++) {
        if (sb_cli_end_of_options(argc, argv, i, NULL))
            break;
        if (sb_cli_opt(argc, argv, &i, "--summarize", &vp.input) || sb_cli_opt(argc, argv, &i, "-o", &vp.output) ||
            sb_cli_opt(argc, argv, &i, "--output", &vp.output) ||
            sb_cli_opt(argc, argv, &i, "--captioner", &vp.captioner) || sb_cli_opt(argc, argv, &i, "-m", &model) ||
            sb_cli_opt(argc, argv, &i, "--models", &models) || sb_cli_opt(argc, argv, &i, "--model", &name) ||
            sb_cli_opt(argc, argv, &i, "--state-dir", &vp.state_dir) ||
            sb_cli_opt(argc, argv, &i, "--captioner-model", &vp.captioner_model) ||
            sb_cli_opt(argc, argv, &i, "--captioner-key", &vp.captioner_key) ||
            sb_cli_opt(argc, argv, &i, "--captioner-prompt", &vp.captioner_prompt))
            continue;
        if (sb_cli_opt(argc, argv, &i, "--ctx", &v))
            sp.engine.n_ctx = (int32_t)sb_cli_int("--ctx", v, 16, 1 << 24);
        else if (sb_cli_opt(argc, argv, &i, "--threads", &v))
            sp.n_threads = (int32_t)sb_cli_int("--threads", v, 1, 1024);
        else if (sb_cli_opt(argc, argv, &i, "--scene", &v))
            vp.scene_threshold = sb_cli_float("--scene", v);
        else if (sb_cli_opt(argc, argv, &i, "--min-gap", &v))
            vp.min_gap_s = sb_cli_float("--min-gap", v);
        else if (sb_cli_opt(argc, argv, &i, "--max-keyframes", &v))
            vp.max_keyframes = (int32_t)sb_cli_int("--max-keyframes", v, 1, 10000);
        else if (sb_cli_opt(argc, argv, &i, "--frame-width", &v))
            vp.frame_width = (int32_t)sb_cli_int("--frame-width", v, 16, 8192);
        else if (sb_cli_opt(argc, argv, &i, "--summary-tokens", &v))
            vp.summary_tokens = (int32_t)sb_cli_int("--summary-tokens", v, 1, 1 << 20);
        else if (sb_cli_opt(argc, argv, &i, "--queue", &v))
            vp.queue_depth = (int32_t)sb_cli_int("--queue", v, 1, 1024);
        else if (sb_cli_opt(argc, argv, &i, "--ffmpeg-timeout", &v))
            vp.ffmpeg_timeout_s = (double)sb_cli_int("--ffmpeg-timeout", v, 1, 86400);
        else if (sb_cli_opt(argc, argv, &i, "--captioner-timeout", &v))
            vp.captioner_timeout_s = (double)sb_cli_int("--captioner-timeout", v, 1, 86400);
        else if (sb_cli_opt(argc, argv, &i, "--caption-parallel", &v))
            vp.caption_parallel = (int32_t)sb_cli_int("--caption-parallel", v, 1, 64);
        else if (sb_cli_opt(argc, argv, &i, "--captioner-retries", &v))
            vp.captioner_retries = (int32_t)sb_cli_int("--captioner-retries", v, 0, 100);
        else if (strcmp(argv[i], "--quiet") == 0)
            quiet = true;
        else {
            fprintf(stderr, "switchboard batch: unknown option '%s'\n%s", argv[i], summarize_usage);
            return SB_EXIT_USAGE;
        }
    }
    const char *missing = !vp.input ? "--summarize DIR|LIST" : !vp.output ? "-o OUT.jsonl"
                                                           : !vp.captioner ? "--captioner CMD|URL"
                                                                           : NULL;
    if (missing || !model == !models) {
        fprintf(stderr, "switchboard batch: %s\n%s", missing ? missing : "give one of -m FILE or --models REGISTRY",
                summarize_usage);
        return SB_EXIT_USAGE;
    }
    if (!(vp.scene_threshold > 0 && vp.scene_threshold < 1) || vp.min_gap_s < 0) {
        fprintf(stderr, "switchboard batch: --scene must be in (0, 1) and --min-gap at least 0\n");
        return SB_EXIT_USAGE;
    }
    if (!vp.state_dir) {
        snprintf(state, sizeof state, "%s.state", vp.output);
        vp.state_dir = state;
    }
    vp.progress = quiet ? NULL : stderr;
    vp.progress_tty = isatty(STDERR_FILENO);
    sp.models = model ? model : models;
    sp.log = quiet ? NULL : log_line;
    signal(SIGPIPE, SIG_IGN); /* a captioner endpoint that hangs up is an error, not the end */

    sb_srv *srv = NULL;
    sb_error err;
    llm_ctx ctx = {0};
    char name_buf[256];
    int rc = 1;
    if (sb_srv_start(&sp, &srv, &err) != SB_OK || sb_srv_load(srv, &err) != SB_OK) {
        sb_cli_error("%s", err.msg);
        goto done;
    }
    if (!name && !(name = default_model(srv, name_buf, sizeof name_buf))) {
        sb_cli_error("%s serves several models: say which summarises with --model NAME", sp.models);
        goto done;
    }
    if (sb_switchboard_acquire(srv->sb, name, NULL, &ctx.held, &err) != SB_OK) {
        sb_cli_error("%s", err.msg);
        goto done;
    }
    ctx.lease = sb__held_lease(ctx.held);
    ctx.srv = srv;
    snprintf(ctx.caller.tier, sizeof ctx.caller.tier, "%s", SB_BATCH_TIER);
    ctx.caller.priority = SB_BATCH_PRIORITY;
    snprintf(ctx.caller.request_id, sizeof ctx.caller.request_id, "video-summarize");
    sb_video_llm llm = {
        .complete = complete,
        .count_chat = count_chat,
        .count_text = count_text,
        .user = &ctx,
        .model = sb_reg_lease_name(ctx.lease),
        .n_ctx = sb_held_n_ctx(ctx.held),
    };
    sb_video_report report;
    sb_status st = sb_video_run(&vp, &llm, &report, &err);
    if (!quiet)
        print_report(&report);
    if (st != SB_OK)
        sb_cli_error("%s", err.msg);
    else
        rc = 0;
done:
    sb_held_release(ctx.held, SB_KEEP_ALIVE_UNCHANGED);
    sb_srv_stop(srv);
    return rc;
}
