/*
 * video.c - the video summarisation job's pipeline (see video.h): the
 * input list, three stage threads joined by bounded queues, progress, and
 * the output.
 *
 *   extract --q--> caption --q--> summarise -> OUT.jsonl
 *
 * Every video passes through every stage in input order (one thread per
 * stage, FIFO queues), so the last stage writes the lines in input order as
 * it finishes them. A video already recorded done passes through untouched;
 * one that failed skips the work of the later stages. A queue holds at most
 * queue_depth videos: extraction runs ahead of generation by a few videos,
 * never by the whole job.
 *
 * The output is rewritten from the start on every run: the lines of the
 * videos recorded done come from the state, the others as they finish, so
 * however often the job was killed each video has exactly one line.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>

#include <cjson/cJSON.h>

#include "base/base.h"
#include "batch/video-impl.h"

sb_video_params sb_video_default_params(void) {
    return (sb_video_params){
        .captioner_prompt = "Describe this video frame in one sentence.",
        .captioner_timeout_s = 60,
        .captioner_retries = 3,
        .caption_parallel = 1,
        .scene_threshold = 0.3,
        .min_gap_s = 1.0,
        .max_keyframes = 16,
        .frame_width = 320,
        .ffmpeg_timeout_s = 600,
        .summary_tokens = 256,
        .queue_depth = 2,
    };
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---- bounded queues ------------------------------------------------------------ */

typedef struct queue {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    sb_video_item *head, *tail;
    int32_t n, cap;
    bool closed;
} queue;

static void queue_init(queue *q, int32_t cap) {
    memset(q, 0, sizeof *q);
    pthread_mutex_init(&q->mu, NULL);
    pthread_cond_init(&q->cv, NULL);
    q->cap = cap;
}

static void queue_destroy(queue *q) {
    pthread_mutex_destroy(&q->mu);
    pthread_cond_destroy(&q->cv);
}

/* Waits for room; a closed queue (the job failed to start) drops v. */
static void queue_push(queue *q, sb_video_item *v) {
    pthread_mutex_lock(&q->mu);
    while (q->n >= q->cap && !q->closed)
        pthread_cond_wait(&q->cv, &q->mu);
    if (q->closed) {
        pthread_mutex_unlock(&q->mu);
        sb__video_item_free(v);
        return;
    }
    v->next = NULL;
    if (q->tail)
        q->tail->next = v;
    else
        q->head = v;
    q->tail = v;
    q->n++;
    pthread_cond_broadcast(&q->cv);
    pthread_mutex_unlock(&q->mu);
}

/* The next video, or NULL once the queue is closed and empty. */
static sb_video_item *queue_pop(queue *q) {
    pthread_mutex_lock(&q->mu);
    while (!q->head && !q->closed)
        pthread_cond_wait(&q->cv, &q->mu);
    sb_video_item *v = q->head;
    if (v) {
        q->head = v->next;
        if (!q->head)
            q->tail = NULL;
        q->n--;
        pthread_cond_broadcast(&q->cv);
    }
    pthread_mutex_unlock(&q->mu);
    return v;
}

static void queue_close(queue *q) {
    pthread_mutex_lock(&q->mu);
    q->closed = true;
    pthread_cond_broadcast(&q->cv);
    pthread_mutex_unlock(&q->mu);
}

/* ---- the job -------------------------------------------------------------------- */

enum { EXTRACT, CAPTION, SUMMARIZE, N_STAGES };

typedef struct job {
    const sb_video_params *p;
    const sb_video_llm *llm;
    sb_video_store store;
    sb_video_captioner *captioner;
    FILE *out;
    char **paths;
    int32_t n;
    queue q[2]; /* extract -> caption, caption -> summarise */

    atomic_bool abort;       /* a job-level failure: every stage drains */
    pthread_mutex_t err_mu;
    sb_error err;            /* the first job-level failure */

    pthread_mutex_t progress_mu;
    pthread_cond_t progress_cv;
    bool finished;           /* the monitor thread stops */
    int32_t passed[N_STAGES]; /* videos each stage has handed on */
    sb_video_report r;
    double t0;
} job;

static void job_fail(job *j, const sb_error *e) {
    pthread_mutex_lock(&j->err_mu);
    if (!atomic_load(&j->abort))
        j->err = *e;
    atomic_store(&j->abort, true);
    pthread_mutex_unlock(&j->err_mu);
}

static void progress_line(job *j, bool final) {
    FILE *f = j->p->progress;
    if (!f)
        return;
    char line[256];
    snprintf(line, sizeof line, "video: extract %d/%d  caption %d/%d (%d frames)  summarise %d/%d  failed %d  %.1fs",
             j->passed[EXTRACT], j->n, j->passed[CAPTION], j->n, j->r.keyframes, j->passed[SUMMARIZE], j->n,
             j->r.failed, now_s() - j->t0);
    if (j->p->progress_tty)
        fprintf(f, "\r\033[K%s%s", line, final ? "\n" : "");
    else
        fprintf(f, "%s\n", line);
    fflush(f);
}

/* A stage handed video v on: counts it, and without a terminal says so. */
static void stage_passed(job *j, int stage, double busy) {
    pthread_mutex_lock(&j->progress_mu);
    j->passed[stage]++;
    j->r.busy_s[stage] += busy;
    if (!j->p->progress_tty)
        progress_line(j, false);
    pthread_mutex_unlock(&j->progress_mu);
}

/* On a terminal: the status line, redrawn four times a second. */
static void *monitor(void *arg) {
    job *j = arg;
    pthread_mutex_lock(&j->progress_mu);
    while (!j->finished) {
        progress_line(j, false);
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 250000000;
        if (ts.tv_nsec >= 1000000000)
            ts.tv_sec++, ts.tv_nsec -= 1000000000;
        pthread_cond_timedwait(&j->progress_cv, &j->progress_mu, &ts);
    }
    progress_line(j, true);
    pthread_mutex_unlock(&j->progress_mu);
    return NULL;
}

static void count(job *j, int32_t *field, int32_t by) {
    pthread_mutex_lock(&j->progress_mu);
    *field += by;
    pthread_mutex_unlock(&j->progress_mu);
}

/* ---- the stages -------------------------------------------------------------------- */

static void *extract_stage(void *arg) {
    job *j = arg;
    for (int32_t i = 0; i < j->n && !atomic_load(&j->abort); i++) {
        double t = now_s();
        sb_error e;
        sb_video_item *v = sb_calloc(1, sizeof *v);
        if (!v || !(v->path = sb_strndup(j->paths[i], strlen(j->paths[i])))) {
            sb__video_item_free(v);
            job_fail(j, &(sb_error){SB_ERR_NOMEM, "out of memory"});
            break;
        }
        v->idx = i;
        sb_status st = sb__video_store_load(&j->store, v, &e);
        if (st == SB_OK && v->state == SB_VIDEO_NEW) {
            char dir[4200];
            snprintf(dir, sizeof dir, "%s/v%05d", j->store.frames_dir, (int)i);
            st = sb__video_extract(j->p, v, dir, &e);
            if (st == SB_OK) {
                v->state = v->error ? SB_VIDEO_DONE : SB_VIDEO_EXTRACTED;
                st = v->error ? sb__video_store_done(&j->store, v, &e) : sb__video_store_extracted(&j->store, v, &e);
                count(j, &j->r.extracted, 1);
            }
        }
        if (st != SB_OK) {
            sb__video_item_free(v);
            job_fail(j, &e);
            break;
        }
        stage_passed(j, EXTRACT, now_s() - t);
        queue_push(&j->q[0], v);
    }
    queue_close(&j->q[0]);
    return NULL;
}

/* Captions keyframe k unless recorded, and records the caption or its error. */
static void caption_one(job *j, sb_video_item *v, int32_t k) {
    sb_video_kf *f = &v->kf[k];
    if (f->caption)
        return;
    sb_error e;
    sb_free(f->error);
    f->error = NULL;
    if (sb__video_caption(j->captioner, f->file, &f->caption, &e) != SB_OK) {
        f->error = sb_strndup(e.msg, strlen(e.msg));
        count(j, &j->r.caption_errors, 1);
    }
    count(j, &j->r.keyframes, 1);
    if (sb__video_store_caption(&j->store, v, k, &e) != SB_OK)
        job_fail(j, &e);
}

/* --caption-parallel workers share one video's keyframes. */
typedef struct caption_work {
    job *j;
    sb_video_item *v;
    atomic_int next;
} caption_work;

static void *caption_worker(void *arg) {
    caption_work *w = arg;
    for (int k; (k = atomic_fetch_add(&w->next, 1)) < w->v->n_kf && !atomic_load(&w->j->abort);)
        caption_one(w->j, w->v, k);
    return NULL;
}

static void *caption_stage(void *arg) {
    job *j = arg;
    sb_video_item *v;
    while ((v = queue_pop(&j->q[0])) != NULL) {
        if (atomic_load(&j->abort)) {
            sb__video_item_free(v);
            continue;
        }
        double t = now_s();
        int32_t todo = 0;
        for (int32_t k = 0; v->state == SB_VIDEO_EXTRACTED && k < v->n_kf; k++)
            todo += v->kf[k].caption == NULL;
        if (todo > 0) {
            caption_work w = {.j = j, .v = v};
            atomic_init(&w.next, 0);
            pthread_t th[64];
            int32_t extra = 0, want = SB_MIN(SB_MIN(j->p->caption_parallel, todo), (int32_t)SB_ARRAY_LEN(th)) - 1;
            while (extra < want && pthread_create(&th[extra], NULL, caption_worker, &w) == 0)
                extra++;
            caption_worker(&w);
            for (int32_t i = 0; i < extra; i++)
                pthread_join(th[i], NULL);
            count(j, &j->r.captioned, 1);
        }
        stage_passed(j, CAPTION, now_s() - t);
        queue_push(&j->q[1], v);
    }
    queue_close(&j->q[1]);
    return NULL;
}

/* The video's output line. */
static sb_status write_line(job *j, const sb_video_item *v, sb_error *err) {
    cJSON *o = cJSON_CreateObject(), *kfs;
    cJSON_AddStringToObject(o, "video", v->path);
    if (v->duration >= 0)
        cJSON_AddNumberToObject(o, "duration", v->duration);
    else
        cJSON_AddNullToObject(o, "duration");
    kfs = cJSON_AddArrayToObject(o, "keyframes");
    for (int32_t k = 0; k < v->n_kf; k++) {
        cJSON *f = cJSON_CreateObject();
        cJSON_AddNumberToObject(f, "time", v->kf[k].time);
        if (v->kf[k].caption)
            cJSON_AddStringToObject(f, "caption", v->kf[k].caption);
        else
            cJSON_AddNullToObject(f, "caption");
        if (v->kf[k].error)
            cJSON_AddStringToObject(f, "error", v->kf[k].error);
        cJSON_AddItemToArray(kfs, f);
    }
    if (v->summary)
        cJSON_AddStringToObject(o, "summary", v->summary);
    else
        cJSON_AddNullToObject(o, "summary");
    if (v->error) {
        cJSON *e = cJSON_AddObjectToObject(o, "error");
        cJSON_AddStringToObject(e, "stage", v->error_stage ? v->error_stage : "");
        cJSON_AddStringToObject(e, "message", v->error);
    } else {
        cJSON_AddNullToObject(o, "error");
    }
    cJSON_AddNumberToObject(o, "summary_requests", v->llm_calls);
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    if (!s)
        return sb_fail(err, SB_ERR_NOMEM, "out of memory");
    bool ok = fputs(s, j->out) >= 0 && fputc('\n', j->out) != EOF && fflush(j->out) == 0;
    cJSON_free(s);
    return ok ? SB_OK : sb_fail(err, SB_ERR_IO, "%s: cannot write: %s", j->p->output, strerror(errno));
}

static void summarize_one(job *j, sb_video_item *v) {
    const char *first_error = NULL;
    int32_t captioned = 0;
    for (int32_t k = 0; k < v->n_kf; k++) {
        captioned += v->kf[k].caption != NULL;
        if (!first_error)
            first_error = v->kf[k].error;
    }
    sb_error e;
    if (captioned == 0)
        sb__video_item_fail(v, "caption", "no keyframe could be captioned: %s", first_error ? first_error : "none");
    else if (sb__video_summarize(j->p, j->llm, v, &e) != SB_OK)
        sb__video_item_fail(v, "summarize", "%s", e.msg);
    count(j, &j->r.summarized, 1);
}

static void *summarize_stage(void *arg) {
    job *j = arg;
    sb_video_item *v;
    while ((v = queue_pop(&j->q[1])) != NULL) {
        if (!atomic_load(&j->abort)) {
            double t = now_s();
            sb_error e;
            sb_status st = SB_OK;
            if (v->state == SB_VIDEO_EXTRACTED) {
                int32_t calls = v->llm_calls;
                summarize_one(j, v);
                count(j, &j->r.llm_calls, v->llm_calls - calls);
                st = sb__video_store_done(&j->store, v, &e);
            }
            if (st == SB_OK)
                st = write_line(j, v, &e);
            if (st != SB_OK)
                job_fail(j, &e);
            count(j, v->error ? &j->r.failed : &j->r.ok, 1);
            stage_passed(j, SUMMARIZE, now_s() - t);
        }
        sb__video_item_free(v);
    }
    return NULL;
}

/* ---- the input ---------------------------------------------------------------------- */

static bool is_video_name(const char *name) {
    static const char *const ext[] = {".mp4", ".m4v", ".mov", ".mkv", ".webm", ".avi", ".mpg", ".mpeg",
                                      ".ts",  ".flv", ".wmv", ".ogv", ".3gp",  ".mts", ".gif"};
    size_t n = strlen(name);
    for (size_t i = 0; i < SB_ARRAY_LEN(ext); i++) {
        size_t m = strlen(ext[i]);
        if (n > m && strcasecmp(name + n - m, ext[i]) == 0)
            return true;
    }
    return false;
}

static int by_name(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static sb_status add_path(job *j, int32_t *cap, const char *dir, const char *name, size_t len, sb_error *err) {
    if (j->n == *cap) {
        *cap = *cap ? *cap * 2 : 64;
        char **q = sb_realloc(j->paths, (size_t)*cap * sizeof *q);
        if (!q)
            return sb_fail(err, SB_ERR_NOMEM, "out of memory");
        j->paths = q;
    }
    size_t n = (dir ? strlen(dir) + 1 : 0) + len + 1;
    char *s = sb_malloc(n);
    if (!s)
        return sb_fail(err, SB_ERR_NOMEM, "out of memory");
    snprintf(s, n, "%s%s%.*s", dir ? dir : "", dir ? "/" : "", (int)len, name);
    j->paths[j->n++] = s;
    return SB_OK;
}

/* A directory: its video files (by extension), sorted by name. A file: one
 * path a line (blank lines and lines starting with '#' skipped), in order. */
static sb_status read_input(job *j, const char *input, sb_error *err) {
    struct stat sb;
    if (stat(input, &sb) != 0)
        return sb_fail(err, SB_ERR_NOT_FOUND, "%s: %s", input, strerror(errno));
    int32_t cap = 0;
    sb_status st = SB_OK;
    if (S_ISDIR(sb.st_mode)) {
        DIR *d = opendir(input);
        if (!d)
            return sb_fail(err, SB_ERR_IO, "%s: cannot read the directory: %s", input, strerror(errno));
        struct dirent *e;
        while (st == SB_OK && (e = readdir(d)) != NULL)
            if (e->d_name[0] != '.' && is_video_name(e->d_name))
                st = add_path(j, &cap, input, e->d_name, strlen(e->d_name), err);
        closedir(d);
        if (st == SB_OK)
            qsort(j->paths, (size_t)j->n, sizeof *j->paths, by_name);
        if (st == SB_OK && j->n == 0)
            st = sb_fail(err, SB_ERR_NOT_FOUND, "%s: no video files (by extension: .mp4, .mkv, .webm, .mov, ...)",
                         input);
        return st;
    }
    FILE *f = fopen(input, "r");
    if (!f)
        return sb_fail(err, SB_ERR_IO, "%s: %s", input, strerror(errno));
    char *line = NULL;
    size_t lcap = 0;
    ssize_t len;
    int lineno = 0;
    while (st == SB_OK && (len = getline(&line, &lcap, f)) >= 0) {
        lineno++;
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r' || line[len - 1] == ' '))
            len--;
        const char *s = line;
        while (*s == ' ' || *s == '\t')
            s++, len--;
        if (len <= 0 || *s == '#')
            continue;
        if (memchr(s, '\0', (size_t)len))
            st = sb_fail(err, SB_ERR_FORMAT, "%s, line %d: a NUL byte in the path", input, lineno);
        else
            st = add_path(j, &cap, NULL, s, (size_t)len, err);
    }
    free(line); /* getline's, from libc */
    fclose(f);
    if (st == SB_OK && j->n == 0)
        st = sb_fail(err, SB_ERR_NOT_FOUND, "%s: the list names no video", input);
    return st;
}

/* The job's identity: the options that decide the results, then each input
 * with its size and modification time (a replaced file is another input). */
static char *fingerprint(const job *j) {
    const sb_video_params *p = j->p;
    size_t cap = 1024 + strlen(p->captioner) + (p->captioner_model ? strlen(p->captioner_model) : 0) +
                 strlen(j->llm->model);
    for (int32_t i = 0; i < j->n; i++)
        cap += strlen(j->paths[i]) + 64;
    char *s = sb_malloc(cap);
    if (!s)
        return NULL;
    size_t n = (size_t)snprintf(s, cap,
                                "scene threshold %.4f, min gap %.3f s, max keyframes %d, frame width %d\n"
                                "captioner %s (model %s)\nmodel %s, summary tokens %d\n",
                                p->scene_threshold, p->min_gap_s, (int)p->max_keyframes, (int)p->frame_width,
                                p->captioner, p->captioner_model ? p->captioner_model : "-", j->llm->model,
                                (int)p->summary_tokens);
    for (int32_t i = 0; i < j->n; i++) {
        struct stat sb;
        if (stat(j->paths[i], &sb) == 0)
            n += (size_t)snprintf(s + n, cap - n, "%s %lld bytes, modified %lld.%09ld\n", j->paths[i],
                                  (long long)sb.st_size, (long long)sb.st_mtim.tv_sec, (long)sb.st_mtim.tv_nsec);
        else
            n += (size_t)snprintf(s + n, cap - n, "%s (missing)\n", j->paths[i]);
    }
    return s;
}

/* ffmpeg and ffprobe answer -version: else the job cannot start. */
static sb_status check_tools(sb_error *err) {
    static const char *const tools[] = {"ffmpeg", "ffprobe"};
    for (size_t i = 0; i < SB_ARRAY_LEN(tools); i++) {
        char *argv[] = {(char *)tools[i], "-version", NULL};
        sb_video_proc pr;
        sb_status st = sb__video_spawn(argv, 30, &pr, err);
        if (st == SB_OK && (!pr.exited || pr.status != 0))
            st = sb_fail(err, SB_ERR_IO, "'%s -version' failed (exit status %d)", tools[i], pr.status);
        if (st == SB_OK)
            sb__video_proc_free(&pr);
        if (st != SB_OK)
            return sb_fail(err, st, "%s (video summarisation needs ffmpeg and ffprobe on PATH: apt-get install ffmpeg)",
                           err->msg);
    }
    return SB_OK;
}

sb_status sb_video_run(const sb_video_params *p, const sb_video_llm *llm, sb_video_report *report, sb_error *err) {
    job j = {.p = p, .llm = llm};
    memset(report, 0, sizeof *report);
    pthread_mutex_init(&j.err_mu, NULL);
    pthread_mutex_init(&j.progress_mu, NULL);
    pthread_cond_init(&j.progress_cv, NULL);
    queue_init(&j.q[0], SB_MAX(p->queue_depth, 1));
    queue_init(&j.q[1], SB_MAX(p->queue_depth, 1));
    char *fp = NULL;
    sb_status st = check_tools(err);
    if (st == SB_OK) /* before the state records the job: a misspelt captioner can be corrected */
        st = sb__video_captioner_create(p, &j.captioner, err);
    if (st == SB_OK)
        st = read_input(&j, p->input, err);
    if (st == SB_OK && !(fp = fingerprint(&j)))
        st = sb_fail(err, SB_ERR_NOMEM, "out of memory");
    if (st == SB_OK)
        st = sb__video_store_open(&j.store, p->state_dir, fp, err);
    if (st == SB_OK && mkdir(j.store.frames_dir, 0700) != 0 && errno != EEXIST)
        st = sb_fail(err, SB_ERR_IO, "%s: cannot create: %s", j.store.frames_dir, strerror(errno));
    if (st == SB_OK && !(j.out = fopen(p->output, "w")))
        st = sb_fail(err, SB_ERR_IO, "%s: cannot write: %s", p->output, strerror(errno));
    if (st == SB_OK) {
        j.r.videos = j.n;
        j.t0 = now_s(); /* the wall time is the pipeline's, set-up excluded */
        pthread_t th[N_STAGES], mon;
        void *(*const fns[N_STAGES])(void *) = {extract_stage, caption_stage, summarize_stage};
        int started = 0;
        bool monitoring = p->progress && p->progress_tty && pthread_create(&mon, NULL, monitor, &j) == 0;
        for (; started < N_STAGES; started++)
            if (pthread_create(&th[started], NULL, fns[started], &j) != 0)
                break;
        if (started < N_STAGES) { /* what did start drains */
            job_fail(&j, &(sb_error){SB_ERR_NOMEM, "cannot start the pipeline's threads"});
            queue_close(&j.q[0]);
            queue_close(&j.q[1]);
        }
        for (int k = 0; k < started; k++)
            pthread_join(th[k], NULL);
        pthread_mutex_lock(&j.progress_mu);
        j.finished = true;
        pthread_cond_broadcast(&j.progress_cv);
        pthread_mutex_unlock(&j.progress_mu);
        if (monitoring)
            pthread_join(mon, NULL);
        if (atomic_load(&j.abort))
            st = sb_fail(err, j.err.status, "%s", j.err.msg);
        if (fclose(j.out) != 0 && st == SB_OK)
            st = sb_fail(err, SB_ERR_IO, "%s: cannot write: %s", p->output, strerror(errno));
    }
    if (j.t0 > 0)
        j.r.wall_s = now_s() - j.t0;
    *report = j.r;
    sb__video_captioner_free(j.captioner);
    sb__video_store_close(&j.store);
    sb_free(fp);
    for (int32_t i = 0; i < j.n; i++)
        sb_free(j.paths[i]);
    sb_free(j.paths);
    queue_destroy(&j.q[0]);
    queue_destroy(&j.q[1]);
    pthread_cond_destroy(&j.progress_cv);
    pthread_mutex_destroy(&j.progress_mu);
    pthread_mutex_destroy(&j.err_mu);
    return st;
}
