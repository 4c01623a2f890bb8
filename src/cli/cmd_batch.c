/*
 * cmd_batch.c - `switchboard batch IN.jsonl -o OUT.jsonl`: an OpenAI Batch
 * API input file run through the registry's scheduler in this process (a
 * server without a socket, server/inproc.h), durably (src/batch/): the state
 * directory (--state-dir, default OUT.jsonl.state) records every result as
 * it comes, so the same command run again after a kill continues where the
 * last run stopped, and the output file is written from the records, in
 * input order, once every request has its line.
 *
 * One state directory holds one job: an input whose content changed since
 * the job was made is refused (its SHA-256 is the job's identity), and a
 * second process on the same directory is refused while the first runs.
 * `--summarize` is the video pipeline's (cmd_summarize.c): this command
 * hands its whole command line over.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <time.h>
#include <unistd.h>

#include "batch/input.h"
#include "batch/jobs.h"
#include "batch/runner.h"
#include "cli/cli.h"
#include "server/inproc.h"
#include "server/server.h"

static const char batch_usage[] =
    "usage: switchboard batch IN.jsonl -o OUT.jsonl (-m FILE | --models REGISTRY) [--state-dir DIR (OUT.jsonl.state)]\n"
    "                         [--parallel N (8)] [--threads N] [--ctx N] [--cache-type f32|f16|q8_0] [--quiet]\n"
    "       switchboard batch --summarize DIR|LIST -o OUT.jsonl --captioner CMD|URL ...  (video summaries)\n";


static atomic_bool interrupted;

static void on_signal(int sig) {
    (void)sig;
    atomic_store(&interrupted, true);
}

typedef struct progress_view {
    bool tty, quiet;
    double last_draw;
} progress_view;

static void format_eta(double s, char *out, size_t cap) {
    if (!(s >= 0) || s > 360000)
        snprintf(out, cap, "--:--");
    else if (s >= 3600)
        snprintf(out, cap, "%d:%02d:%02d", (int)s / 3600, (int)s / 60 % 60, (int)s % 60);
    else
        snprintf(out, cap, "%d:%02d", (int)s / 60, (int)s % 60);
}

static void draw(progress_view *v, const sb_batch_progress *p, bool final) {
    double now = sb_cli_now();
    if (v->quiet || (!final && now - v->last_draw < (v->tty ? 0.1 : 2.0)))
        return;
    v->last_draw = now;
    double rate = p->elapsed_s > 0 ? (double)p->computed / p->elapsed_s : 0;
    double tps = p->elapsed_s > 0 ? (double)p->completion_tokens / p->elapsed_s : 0;
    char eta[24];
    format_eta(rate > 0 ? (double)(p->total - p->done) / rate : -1, eta, sizeof eta);
    int pct = p->total ? (int)(100 * p->done / p->total) : 100;
    if (v->tty) {
        char bar[31];
        int fill = p->total ? (int)(30 * p->done / p->total) : 30;
        for (int i = 0; i < 30; i++)
            bar[i] = i < fill ? '#' : '.';
        bar[30] = '\0';
        fprintf(stderr, "\r[%s] %lld/%lld %3d%%  %.0f tok/s  ETA %s  failures %lld  ", bar, (long long)p->done,
                (long long)p->total, pct, tps, eta, (long long)p->failed);
        if (final)
            fputc('\n', stderr);
    } else {
        fprintf(stderr, "switchboard batch: %lld/%lld (%d%%), %.0f tok/s, ETA %s, %lld failed\n", (long long)p->done,
                (long long)p->total, pct, tps, eta, (long long)p->failed);
    }
    fflush(stderr);
}

static void on_progress(void *user, const sb_batch_progress *p) { draw(user, p, false); }

static sb_status exec_inproc(void *user, const char *url, const char *body, size_t len, const sb_gw_caller *caller,
                             int *status, char **json, sb_error *err) {
    return sb_srv_execute(user, url, body, len, caller, status, json, err);
}

static void log_line(void *user, const char *line) {
    if (!*(const bool *)user)
        fprintf(stderr, "switchboard batch: %s\n", line);
}

/* The state directory's lock: one process per job at a time. The fd stays
 * open (and the lock held) until the process ends. */
static int lock_state(const char *dir) {
    char path[4200];
    snprintf(path, sizeof path, "%s/lock", dir);
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0)
        return sb_cli_error("%s: cannot open: %s", path, strerror(errno));
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        close(fd);
        return sb_cli_error("%s: another `switchboard batch` is running on this state directory", dir);
    }
    return 0;
}

/* The job of this state directory for `in`: found (same content) or made. */
static int find_or_create_job(sb_batch_store *store, const char *in, const char *state_dir, sb_batch_job *job) {
    sb_error err;
    char sha[65];
    int64_t size;
    if (sb_batch_file_sha256(in, sha, &size, &err) != SB_OK)
        return sb_cli_error("%s", err.msg);
    sb_batch_job *jobs;
    int32_t n;
    bool more;
    if (sb_batch_job_list(store, NULL, NULL, 1, &jobs, &n, &more, &err) != SB_OK)
        return sb_cli_error("%s", err.msg);
    if (n > 0) {
        *job = jobs[0];
        sb_free(jobs);
        if (strcmp(job->input_sha256, sha) != 0) {
            sb_cli_error("%s holds the job of %s (%lld bytes, sha256 %.16s...), but %s is %lld bytes, sha256 "
                         "%.16s...: the input changed; restore it or use another --state-dir",
                         state_dir, job->input_path, (long long)job->input_size, job->input_sha256, in,
                         (long long)size, sha);
            sb_batch_job_clear(job);
            return 1;
        }
        return 0;
    }
    sb_free(jobs);
    memset(job, 0, sizeof *job);
    snprintf(job->id, sizeof job->id, "batch_%.24s", sha); /* the content's: reruns anywhere name lines alike */
    snprintf(job->input_path, sizeof job->input_path, "%s", in);
    snprintf(job->input_sha256, sizeof job->input_sha256, "%s", sha);
    job->input_size = size;
    job->status = SB_BATCH_IN_PROGRESS;
    job->at[SB_BATCH_VALIDATING] = job->at[SB_BATCH_IN_PROGRESS] = (int64_t)time(NULL);
    char id[SB_BATCH_ID_MAX];
    memcpy(id, job->id, sizeof id);
    if (sb_batch_prepare(store, job, &err) != SB_OK || sb_batch_job_get(store, id, job, &err) != SB_OK)
        return sb_cli_error("%s", err.msg);
    return 0;
}

/* Runs what is left of the job on the in-process server. */
static int run_job(sb_batch_store *store, const sb_batch_job *job, sb_srv_params *sp, int32_t parallel,
                   progress_view *view, sb_batch_progress *prog) {
    sb_srv *srv;
    sb_error err;
    if (sb_srv_start(sp, &srv, &err) != SB_OK || sb_srv_load(srv, &err) != SB_OK) {
        sb_srv_stop(srv);
        return sb_cli_error("%s", err.msg);
    }
    sb_batch_run_params rp = {
        .store = store, .job_id = job->id, .exec = exec_inproc, .exec_user = srv, .parallel = parallel,
        .priority = SB_BATCH_PRIORITY, .stop = &interrupted, .progress = on_progress, .progress_user = view,
    };
    sb_status st = sb_batch_run(&rp, prog, &err);
    sb_srv_stop(srv);
    draw(view, prog, true);
    if (st != SB_OK)
        return sb_cli_error("%s (what was done is kept: run the same command again to continue)", err.msg);
    return 0;
}

/* Every request has its line: the output file from the records, the job
 * completed, the summary. */
static int finish_job(sb_batch_store *store, const char *id, const char *out, const sb_batch_progress *prog) {
    sb_batch_job job;
    sb_error err;
    if (sb_batch_job_get(store, id, &job, &err) != SB_OK)
        return sb_cli_error("%s", err.msg);
    int rc = 0;
    if (job.completed + job.failed < job.total)
        rc = sb_cli_error("%lld requests are still not done; run the same command again",
                          (long long)(job.total - job.completed - job.failed));
    else if (sb_batch_write(store, id, 0, out, &err) != SB_OK ||
             sb_batch_job_set_status(store, id, SB_BATCH_COMPLETED, (int64_t)time(NULL), NULL, &err) != SB_OK)
        rc = sb_cli_error("%s", err.msg);
    if (rc == 0) {
        double tps = prog->elapsed_s > 0 ? (double)prog->completion_tokens / prog->elapsed_s : 0;
        fprintf(stderr,
                "switchboard batch: done: %lld requests (%lld succeeded, %lld failed) in %s; computed %lld this run "
                "(%lld tokens in %.1f s, %.0f tok/s); %lld computations recorded in all\n",
                (long long)job.total, (long long)job.completed, (long long)job.failed, out, (long long)prog->computed,
                (long long)prog->completion_tokens, prog->elapsed_s, tps, (long long)job.computations);
    }
    sb_batch_job_clear(&job);
    return rc;
}

int sb_cmd_batch(int argc, char **argv) {
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--summarize") == 0)
            return sb_cli_batch_summarize(argc, argv); /* cmd_summarize.c: the video pipeline */
    sb_srv_params sp = sb_srv_default_params();
    sp.no_listen = true;
    sp.watch = false;
    sp.keep_alive_ms = -1; /* the model stays loaded for the whole job */
    sp.engine.n_ctx = 0;
    const char *v, *in = NULL, *out = NULL, *model = NULL, *models = NULL, *state_dir = NULL;
    int32_t parallel = 8;
    bool quiet = false;
    int operands = argc;
    for (int i = 1; i < argc; i++) {
        if (sb_cli_end_of_options(argc, argv, i, &operands))
            break;
        if (sb_cli_opt(argc, argv, &i, "-o", &out) || sb_cli_opt(argc, argv, &i, "--output", &out) ||
            sb_cli_opt(argc, argv, &i, "-m", &model) || sb_cli_opt(argc, argv, &i, "--model", &model) ||
            sb_cli_opt(argc, argv, &i, "--models", &models) || sb_cli_opt(argc, argv, &i, "--state-dir", &state_dir))
            continue;
        if (sb_cli_opt(argc, argv, &i, "-np", &v) || sb_cli_opt(argc, argv, &i, "--parallel", &v))
            parallel = (int32_t)sb_cli_int("--parallel", v, 1, 4096);
        else if (sb_cli_opt(argc, argv, &i, "-t", &v) || sb_cli_opt(argc, argv, &i, "--threads", &v))
            sp.n_threads = (int32_t)sb_cli_int("--threads", v, 1, 1024);
        else if (sb_cli_opt(argc, argv, &i, "-c", &v) || sb_cli_opt(argc, argv, &i, "--ctx", &v))
            sp.engine.n_ctx = (int32_t)sb_cli_int("--ctx", v, 16, 1 << 24);
        else if (sb_cli_opt(argc, argv, &i, "--cache-type", &v))
            sp.engine.cache_type = sb_cli_cache_type("--cache-type", v);
        else if (strcmp(argv[i], "--quiet") == 0)
            quiet = true;
        else if (argv[i][0] == '-' && argv[i][1]) {
            fprintf(stderr, "switchboard batch: unknown option '%s'\n%s", argv[i], batch_usage);
            return SB_EXIT_USAGE;
        } else if (!in)
            in = argv[i];
        else {
            fprintf(stderr, "switchboard batch: one input file only ('%s' and '%s')\n%s", in, argv[i], batch_usage);
            return SB_EXIT_USAGE;
        }
    }
    for (int i = operands; i < argc && !in; i++)
        in = argv[i];
    if (!in || !out || !model == !models) {
        fprintf(stderr, "switchboard batch: give IN.jsonl, -o OUT.jsonl and one of -m FILE or --models REGISTRY\n%s",
                batch_usage);
        return SB_EXIT_USAGE;
    }
    char default_state[4200];
    if (!state_dir) {
        snprintf(default_state, sizeof default_state, "%s.state", out);
        state_dir = default_state;
    }
    sp.models = model ? model : models;
    sp.engine.n_parallel = parallel;
    sp.log = log_line;
    sp.log_user = &quiet;
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);

    sb_batch_store *store;
    sb_error err;
    if (sb_batch_store_open(state_dir, &store, &err) != SB_OK)
        return sb_cli_error("%s", err.msg);
    sb_batch_job job;
    int rc = lock_state(state_dir);
    if (rc == 0)
        rc = find_or_create_job(store, in, state_dir, &job);
    if (rc != 0) {
        sb_batch_store_close(store);
        return rc;
    }
    int64_t done = job.completed + job.failed;
    if (!quiet)
        fprintf(stderr, "switchboard batch: job %s: %lld requests, %lld done, %lld to run (state %s)\n", job.id,
                (long long)job.total, (long long)done, (long long)(job.total - done), state_dir);
    progress_view view = {.tty = isatty(STDERR_FILENO), .quiet = quiet};
    sb_batch_progress prog = {.total = job.total, .done = done, .failed = job.failed, .done_at_start = done};
    char id[SB_BATCH_ID_MAX];
    snprintf(id, sizeof id, "%s", job.id);
    if (done < job.total)
        rc = run_job(store, &job, &sp, parallel, &view, &prog);
    sb_batch_job_clear(&job);
    if (rc == 0 && atomic_load(&interrupted)) {
        fprintf(stderr, "switchboard batch: interrupted with %lld of %lld done; run the same command again to continue\n",
                (long long)prog.done, (long long)prog.total);
        rc = 130;
    }
    if (rc == 0)
        rc = finish_job(store, id, out, &prog);
    sb_batch_store_close(store);
    return rc;
}
