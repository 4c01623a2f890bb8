/*
 * runner.c - preparing, running and writing out batch jobs (see runner.h).
 *
 * Workers take rows in line order from a shared cursor, read their line
 * from the input file (pread at the recorded offset), check it again for
 * its body, execute it, and record the output line in its own
 * transaction. A 503 (the model still loading, the queue full) is not an
 * answer but a reason to wait and try again; anything else, a 400 for an
 * invalid body included, is the request's answer.
 */
#include "batch/runner.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/base.h"
#include "batch/input.h"

/* A request answered 503 is tried again after this, this many times. */
#define RETRY_DELAY_NS 200000000L
#define RETRY_LIMIT 300

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---- prepare: the input file into request rows ------------------------- */

typedef struct prep {
    sb_batch_item *items; /* custom_id and error_output owned here */
    int64_t n, cap;
} prep;

static void prep_free(prep *p) {
    for (int64_t i = 0; i < p->n; i++) {
        sb_free(p->items[i].custom_id);
        sb_free(p->items[i].error_output);
    }
    sb_free(p->items);
}

static sb_status prep_add(prep *p, const char *job_id, const char *endpoint, const char *line, size_t len,
                          int64_t line_no, int64_t offset, sb_error *err) {
    if (p->n == p->cap) {
        int64_t cap = p->cap ? 2 * p->cap : 256;
        sb_batch_item *grown = sb_realloc(p->items, (size_t)cap * sizeof *grown);
        if (!grown)
            return sb_fail(err, SB_ERR_NOMEM, "out of memory reading the batch input");
        p->items = grown;
        p->cap = cap;
    }
    sb_batch_line l;
    sb_status st = sb_batch_line_check(line, len, line_no, endpoint, &l, err);
    if (st != SB_OK)
        return st;
    sb_batch_item *it = &p->items[p->n++];
    *it = (sb_batch_item){.line = line_no, .offset = offset, .length = (int64_t)len, .custom_id = l.custom_id};
    l.custom_id = NULL;
    if (!l.ok) {
        sb_batch_ids ids;
        sb_batch_ids_make(job_id, line_no, &ids);
        if (!(it->error_output = sb_batch_output_error(&ids, it->custom_id, line_no, l.code, l.message)))
            st = sb_fail(err, SB_ERR_NOMEM, "out of memory reading the batch input");
    }
    sb_batch_line_free(&l);
    return st;
}

static int by_custom_id(const void *a, const void *b) {
    const sb_batch_item *x = *(sb_batch_item *const *)a, *y = *(sb_batch_item *const *)b;
    int c = strcmp(x->custom_id, y->custom_id);
    return c ? c : (x->line > y->line) - (x->line < y->line);
}

/* A custom_id met again on a later line: that line becomes an error line
 * (the first one runs). */
static sb_status mark_duplicates(prep *p, const char *job_id, sb_error *err) {
    sb_batch_item **order = sb_malloc((size_t)(p->n ? p->n : 1) * sizeof *order);
    if (!order)
        return sb_fail(err, SB_ERR_NOMEM, "out of memory checking custom_ids");
    int64_t m = 0;
    for (int64_t i = 0; i < p->n; i++)
        if (p->items[i].custom_id)
            order[m++] = &p->items[i];
    qsort(order, (size_t)m, sizeof *order, by_custom_id);
    sb_status st = SB_OK;
    for (int64_t i = 1; st == SB_OK && i < m; i++) {
        sb_batch_item *it = order[i], *first = order[i - 1];
        if (strcmp(it->custom_id, first->custom_id) != 0 || it->error_output)
            continue;
        /* order[i-1] may itself be a duplicate: the message names the first line of all. */
        int64_t k = i - 1;
        while (k > 0 && strcmp(order[k - 1]->custom_id, it->custom_id) == 0)
            k--;
        char msg[400];
        snprintf(msg, sizeof msg, "line %lld: custom_id is the same as line %lld's; custom_ids must be unique",
                 (long long)it->line, (long long)order[k]->line);
        sb_batch_ids ids;
        sb_batch_ids_make(job_id, it->line, &ids);
        if (!(it->error_output = sb_batch_output_error(&ids, it->custom_id, it->line, "duplicate_custom_id", msg)))
            st = sb_fail(err, SB_ERR_NOMEM, "out of memory checking custom_ids");
    }
    sb_free(order);
    return st;
}

static bool blank(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (s[i] != ' ' && s[i] != '\t' && s[i] != '\r')
            return false;
    return true;
}

/* One line of the input, without its newline: a request unless blank. */
static sb_status end_line(prep *p, const sb_batch_job *job, char *line, size_t len, int64_t line_no, int64_t offset,
                          sb_error *err) {
    if (len && line[len - 1] == '\r')
        len--;
    if (blank(line, len))
        return SB_OK;
    return prep_add(p, job->id, job->endpoint[0] ? job->endpoint : NULL, line, len, line_no, offset, err);
}

sb_status sb_batch_prepare(sb_batch_store *store, const sb_batch_job *job, sb_error *err) {
    FILE *f = fopen(job->input_path, "rb");
    if (!f)
        return sb_fail(err, SB_ERR_IO, "%s: cannot open: %s", job->input_path, strerror(errno));
    prep p = {0};
    char *line = NULL;
    size_t len = 0, cap = 0, got;
    int64_t line_no = 1, offset = 0; /* of the line being read */
    sb_status st = SB_OK;
    char chunk[1 << 16];
    while (st == SB_OK && (got = fread(chunk, 1, sizeof chunk, f)) > 0) {
        for (size_t i = 0; st == SB_OK && i < got; i++) {
            if (chunk[i] == '\n') {
                st = end_line(&p, job, line, len, line_no++, offset, err);
                offset += (int64_t)len + 1;
                len = 0;
                continue;
            }
            if (len + 1 >= cap) {
                size_t ncap = cap ? 2 * cap : 4096;
                char *grown = sb_realloc(line, ncap);
                if (!grown) {
                    st = sb_fail(err, SB_ERR_NOMEM, "out of memory: line %lld is too long", (long long)line_no);
                    break;
                }
                line = grown;
                cap = ncap;
            }
            line[len++] = chunk[i];
        }
    }
    if (st == SB_OK && ferror(f))
        st = sb_fail(err, SB_ERR_IO, "%s: read error", job->input_path);
    if (st == SB_OK && len > 0) /* the last line without its newline */
        st = end_line(&p, job, line, len, line_no, offset, err);
    fclose(f);
    sb_free(line);
    if (st == SB_OK && p.n == 0)
        st = sb_fail(err, SB_ERR_FORMAT, "%s: no requests (the file is empty or has only blank lines)", job->input_path);
    if (st == SB_OK)
        st = mark_duplicates(&p, job->id, err);
    if (st == SB_OK)
        st = sb_batch_job_create(store, job, p.items, p.n, err);
    prep_free(&p);
    return st;
}

/* ---- run ------------------------------------------------------------------ */

typedef struct run {
    const sb_batch_run_params *p;
    sb_batch_job job;
    int fd;               /* the input file */
    sb_batch_item *items; /* to run, in line order */
    int64_t n;
    pthread_mutex_t mu;
    int64_t next;         /* the next item a worker takes (under mu) */
    sb_batch_progress prog; /* (under mu) */
    double t0;
    bool failed;          /* a job-level failure: workers stop (under mu) */
    sb_error err;         /* its message */
} run;

static bool stopping(const run *r) { return r->p->stop && atomic_load(r->p->stop); }

static void fail_run(run *r, const sb_error *err) {
    pthread_mutex_lock(&r->mu);
    if (!r->failed) {
        r->failed = true;
        r->err = *err;
    }
    pthread_mutex_unlock(&r->mu);
}

/* Line `it` read back from the input file and checked for its body. */
static sb_status read_line(run *r, const sb_batch_item *it, sb_batch_line *out, sb_error *err) {
    char *buf = sb_malloc((size_t)it->length + 1);
    if (!buf)
        return sb_fail(err, SB_ERR_NOMEM, "out of memory for line %lld", (long long)it->line);
    ssize_t got = pread(r->fd, buf, (size_t)it->length, (off_t)it->offset);
    sb_status st = got == (ssize_t)it->length ? sb_batch_line_check(buf, (size_t)it->length, it->line,
                                                                    r->job.endpoint[0] ? r->job.endpoint : NULL, out, err)
                                              : sb_fail(err, SB_ERR_IO, "%s: cannot read line %lld back: %s",
                                                        r->job.input_path, (long long)it->line,
                                                        got < 0 ? strerror(errno) : "the file is shorter");
    sb_free(buf);
    if (st == SB_OK && !out->ok) {
        st = sb_fail(err, SB_ERR_FORMAT, "%s changed under the job: line %lld no longer checks (%s)",
                     r->job.input_path, (long long)it->line, out->message);
        sb_batch_line_free(out);
    }
    return st;
}

/* One request executed until it has an answer (a 503 is tried again). */
static sb_status execute(run *r, const sb_batch_line *l, const sb_gw_caller *caller, int *status, char **json,
                         sb_error *err) {
    for (int attempt = 0;; attempt++) {
        sb_status st = r->p->exec(r->p->exec_user, l->url, l->body, strlen(l->body), caller, status, json, err);
        if (st != SB_OK || *status != 503 || attempt == RETRY_LIMIT || stopping(r))
            return st;
        sb_free(*json);
        *json = NULL;
        nanosleep(&(struct timespec){.tv_nsec = RETRY_DELAY_NS}, NULL);
    }
}

static sb_status run_one(run *r, const sb_batch_item *it, sb_error *err) {
    sb_batch_line l;
    sb_status st = read_line(r, it, &l, err);
    if (st != SB_OK)
        return st;
    sb_batch_ids ids;
    sb_batch_ids_make(r->job.id, it->line, &ids);
    sb_gw_caller caller = {.priority = r->p->priority};
    snprintf(caller.key, sizeof caller.key, "%s", r->job.owner);
    snprintf(caller.tier, sizeof caller.tier, "%s", SB_BATCH_TIER);
    snprintf(caller.request_id, sizeof caller.request_id, "%s", ids.request_id);
    int status = 0;
    char *json = NULL;
    st = execute(r, &l, &caller, &status, &json, err);
    char *output = NULL;
    int64_t prompt_tokens = 0, completion_tokens = 0;
    if (st == SB_OK && !stopping(r) &&
        !(output = sb_batch_output_response(&ids, l.custom_id, status, json, &prompt_tokens, &completion_tokens)))
        st = sb_fail(err, SB_ERR_NOMEM, "out of memory for line %lld's output", (long long)it->line);
    sb_free(json);
    sb_batch_line_free(&l);
    if (!output) /* failed, or stopping: the answer is not recorded and the row stays to run */
        return st;
    bool failed = status < 200 || status > 299;
    st = sb_batch_record(r->p->store, r->job.id, it->line, failed, output, prompt_tokens, completion_tokens, err);
    sb_free(output);
    if (st == SB_OK) {
        pthread_mutex_lock(&r->mu);
        r->prog.done++;
        r->prog.failed += failed;
        r->prog.computed++;
        r->prog.completion_tokens += completion_tokens;
        r->prog.last_prompt_tokens = prompt_tokens;
        r->prog.last_completion_tokens = completion_tokens;
        r->prog.elapsed_s = now_s() - r->t0;
        if (r->p->progress)
            r->p->progress(r->p->progress_user, &r->prog);
        pthread_mutex_unlock(&r->mu);
    }
    return st;
}

static void *worker(void *arg) {
    run *r = arg;
    for (;;) {
        pthread_mutex_lock(&r->mu);
        bool take = !r->failed && r->next < r->n && !stopping(r);
        int64_t i = take ? r->next++ : -1;
        pthread_mutex_unlock(&r->mu);
        if (!take)
            return NULL;
        sb_error err;
        if (run_one(r, &r->items[i], &err) != SB_OK) {
            fail_run(r, &err);
            return NULL;
        }
    }
}

sb_status sb_batch_run(const sb_batch_run_params *p, sb_batch_progress *out, sb_error *err) {
    run r = {.p = p, .fd = -1};
    sb_status st = sb_batch_job_get(p->store, p->job_id, &r.job, err);
    if (st != SB_OK)
        return st;
    if ((st = sb_batch_pending(p->store, p->job_id, &r.items, &r.n, err)) != SB_OK) {
        sb_batch_job_clear(&r.job);
        return st;
    }
    r.prog = (sb_batch_progress){.total = r.job.total, .done = r.job.completed + r.job.failed,
                                 .failed = r.job.failed, .done_at_start = r.job.completed + r.job.failed};
    r.t0 = now_s();
    if (r.n > 0 && (r.fd = open(r.job.input_path, O_RDONLY | O_CLOEXEC)) < 0)
        st = sb_fail(err, SB_ERR_IO, "%s: cannot open: %s", r.job.input_path, strerror(errno));
    pthread_mutex_init(&r.mu, NULL);
    int32_t n_workers = (int32_t)SB_MIN((int64_t)SB_MAX(p->parallel, 1), r.n);
    pthread_t *threads = st == SB_OK ? sb_calloc((size_t)(n_workers ? n_workers : 1), sizeof *threads) : NULL;
    if (st == SB_OK && !threads)
        st = sb_fail(err, SB_ERR_NOMEM, "out of memory for %d workers", (int)n_workers);
    int32_t started = 0;
    for (; st == SB_OK && started < n_workers; started++)
        if (pthread_create(&threads[started], NULL, worker, &r) != 0) {
            sb_error e;
            sb_fail(&e, SB_ERR_IO, "cannot start a batch worker thread");
            fail_run(&r, &e);
            break;
        }
    for (int32_t i = 0; i < started; i++)
        pthread_join(threads[i], NULL);
    sb_free(threads);
    if (st == SB_OK && r.failed) {
        st = r.err.status;
        if (err)
            *err = r.err;
    }
    r.prog.elapsed_s = now_s() - r.t0;
    if (out)
        *out = r.prog;
    pthread_mutex_destroy(&r.mu);
    if (r.fd >= 0)
        close(r.fd);
    sb_batch_items_free(r.items, r.n);
    sb_batch_job_clear(&r.job);
    return st;
}

/* ---- write ---------------------------------------------------------------- */

static sb_status write_line(void *user, const char *output, sb_error *err) {
    FILE *f = user;
    if (fputs(output ? output : "", f) == EOF || fputc('\n', f) == EOF)
        return sb_fail(err, SB_ERR_IO, "cannot write the output: %s", strerror(errno));
    return SB_OK;
}

sb_status sb_batch_write(sb_batch_store *store, const char *job, int which, const char *path, sb_error *err) {
    char tmp[4200];
    if ((size_t)snprintf(tmp, sizeof tmp, "%s.partial", path) >= sizeof tmp)
        return sb_fail(err, SB_ERR_INVALID_ARG, "%s: the path is too long", path);
    FILE *f = fopen(tmp, "wb");
    if (!f)
        return sb_fail(err, SB_ERR_IO, "%s: cannot create: %s", tmp, strerror(errno));
    sb_status st = sb_batch_outputs(store, job, which, write_line, f, err);
    if (st == SB_OK && (fflush(f) != 0 || fsync(fileno(f)) != 0))
        st = sb_fail(err, SB_ERR_IO, "%s: cannot write: %s", tmp, strerror(errno));
    if (fclose(f) != 0 && st == SB_OK)
        st = sb_fail(err, SB_ERR_IO, "%s: cannot write: %s", tmp, strerror(errno));
    if (st == SB_OK && rename(tmp, path) != 0)
        st = sb_fail(err, SB_ERR_IO, "%s: cannot rename to %s: %s", tmp, path, strerror(errno));
    if (st != SB_OK)
        unlink(tmp);
    return st;
}
