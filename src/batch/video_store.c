/*
 * video_store.c - the video job's state: state-dir/video.db (its own file,
 * apart from the batch runner's jobs, opened by sb_db_open: WAL, bounded
 * lock waits) and the keyframe images under state-dir/frames/vNNNNN/.
 *
 * Each stage commits what it finishes as it finishes it: a video's
 * keyframes in one transaction with its state (EXTRACTED) once their files
 * are in place, each caption when it arrives, the summary or the error
 * (DONE) last. A run killed at any point finds, on its next start, every
 * committed row and file; an extraction cut short left files but no rows,
 * and is done again (its directory emptied first).
 *
 * The job's identity: the fingerprint (every input path with its size and
 * modification time, and the options that decide the results) is recorded
 * by the first run; a later one with another fingerprint is refused, naming
 * the first difference, rather than mixing two jobs' results.
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "base/base.h"
#include "batch/video-impl.h"
#include "gateway/db.h"

static const char schema[] =
    "CREATE TABLE IF NOT EXISTS video_job(id INTEGER PRIMARY KEY CHECK (id = 1), fingerprint TEXT NOT NULL);"
    "CREATE TABLE IF NOT EXISTS video(idx INTEGER PRIMARY KEY, path TEXT NOT NULL, state INTEGER NOT NULL,"
    " duration REAL, summary TEXT, error_stage TEXT, error TEXT, llm_calls INTEGER NOT NULL DEFAULT 0);"
    "CREATE TABLE IF NOT EXISTS video_keyframe(video INTEGER NOT NULL, idx INTEGER NOT NULL, time REAL NOT NULL,"
    " score REAL NOT NULL, file TEXT NOT NULL, caption TEXT, error TEXT, PRIMARY KEY (video, idx));";

void sb__video_item_free(sb_video_item *v) {
    if (!v)
        return;
    for (int32_t k = 0; k < v->n_kf; k++) {
        sb_free(v->kf[k].file);
        sb_free(v->kf[k].caption);
        sb_free(v->kf[k].error);
    }
    sb_free(v->kf);
    sb_free(v->path);
    sb_free(v->summary);
    sb_free(v->error_stage);
    sb_free(v->error);
    sb_free(v);
}

static char *dup_str(const char *s) { return s ? sb_strndup(s, strlen(s)) : NULL; }

void sb__video_item_fail(sb_video_item *v, const char *stage, const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    sb_free(v->error_stage);
    sb_free(v->error);
    v->error_stage = dup_str(stage);
    v->error = dup_str(msg);
}

/* The first line where a and b differ, for the refusal. */
static void first_difference(const char *a, const char *b, char *out, size_t cap) {
    int line = 1;
    const char *la = a, *lb = b;
    while (*a && *a == *b) {
        if (*a == '\n')
            line++, la = a + 1, lb = b + 1;
        a++, b++;
    }
    int na = (int)strcspn(la, "\n"), nb = (int)strcspn(lb, "\n");
    snprintf(out, cap, "line %d of the job was '%.*s' and is now '%.*s'", line, SB_MIN(na, 200), la, SB_MIN(nb, 200),
             lb);
}

sb_status sb__video_store_open(sb_video_store *s, const char *state_dir, const char *fingerprint, sb_error *err) {
    memset(s, 0, sizeof *s);
    sb_status st = sb_db_open(state_dir, "video.db", schema, &s->db, err);
    if (st != SB_OK)
        return st;
    pthread_mutex_init(&s->mu, NULL);
    size_t n = strlen(state_dir) + 16;
    if (!(s->frames_dir = sb_malloc(n))) {
        sb__video_store_close(s);
        return sb_fail(err, SB_ERR_NOMEM, "out of memory");
    }
    snprintf(s->frames_dir, n, "%s/frames", state_dir);
    sqlite3_stmt *q = NULL;
    if (sqlite3_prepare_v2(s->db, "SELECT fingerprint FROM video_job WHERE id = 1", -1, &q, NULL) != SQLITE_OK) {
        st = sb_db_fail(s->db, err, "cannot read the job");
    } else if (sqlite3_step(q) == SQLITE_ROW) {
        const char *had = (const char *)sqlite3_column_text(q, 0);
        if (strcmp(had ? had : "", fingerprint) != 0) {
            char diff[600];
            first_difference(had ? had : "", fingerprint, diff, sizeof diff);
            st = sb_fail(err, SB_ERR_INVALID_ARG,
                         "%s/video.db holds another summarisation job (%s): rerun with the same input and options, "
                         "or use another --state-dir",
                         state_dir, diff);
        }
    } else {
        sqlite3_finalize(q);
        q = NULL;
        if (sqlite3_prepare_v2(s->db, "INSERT INTO video_job(id, fingerprint) VALUES (1, ?)", -1, &q, NULL) !=
                SQLITE_OK ||
            sqlite3_bind_text(q, 1, fingerprint, -1, SQLITE_STATIC) != SQLITE_OK || sqlite3_step(q) != SQLITE_DONE)
            st = sb_db_fail(s->db, err, "cannot record the job");
    }
    sqlite3_finalize(q);
    if (st != SB_OK)
        sb__video_store_close(s);
    return st;
}

void sb__video_store_close(sb_video_store *s) {
    if (!s->db)
        return;
    sb_db_close(s->db);
    pthread_mutex_destroy(&s->mu);
    sb_free(s->frames_dir);
    memset(s, 0, sizeof *s);
}

static void bind_text_or_null(sqlite3_stmt *q, int i, const char *s) {
    if (s)
        sqlite3_bind_text(q, i, s, -1, SQLITE_TRANSIENT);
    else
        sqlite3_bind_null(q, i);
}

static char *column_dup(sqlite3_stmt *q, int i) {
    const char *s = (const char *)sqlite3_column_text(q, i);
    return s ? dup_str(s) : NULL;
}

sb_status sb__video_store_load(sb_video_store *s, sb_video_item *v, sb_error *err) {
    pthread_mutex_lock(&s->mu);
    sb_status st = SB_OK;
    sqlite3_stmt *q = NULL;
    v->state = SB_VIDEO_NEW;
    v->duration = -1;
    if (sqlite3_prepare_v2(s->db,
                           "SELECT state, duration, summary, error_stage, error, llm_calls FROM video WHERE idx = ?",
                           -1, &q, NULL) != SQLITE_OK) {
        st = sb_db_fail(s->db, err, "cannot read a video's state");
        goto done;
    }
    sqlite3_bind_int(q, 1, v->idx);
    if (sqlite3_step(q) == SQLITE_ROW) {
        v->state = (sb_video_state)sqlite3_column_int(q, 0);
        v->duration = sqlite3_column_type(q, 1) == SQLITE_NULL ? -1 : sqlite3_column_double(q, 1);
        v->summary = column_dup(q, 2);
        v->error_stage = column_dup(q, 3);
        v->error = column_dup(q, 4);
        v->llm_calls = sqlite3_column_int(q, 5);
    }
    sqlite3_finalize(q);
    q = NULL;
    if (v->state == SB_VIDEO_NEW)
        goto done;
    if (sqlite3_prepare_v2(s->db, "SELECT count(*) FROM video_keyframe WHERE video = ?", -1, &q, NULL) != SQLITE_OK) {
        st = sb_db_fail(s->db, err, "cannot read a video's keyframes");
        goto done;
    }
    sqlite3_bind_int(q, 1, v->idx);
    int32_t n = sqlite3_step(q) == SQLITE_ROW ? sqlite3_column_int(q, 0) : 0;
    sqlite3_finalize(q);
    q = NULL;
    if (n > 0 && !(v->kf = sb_calloc((size_t)n, sizeof *v->kf))) {
        st = sb_fail(err, SB_ERR_NOMEM, "out of memory");
        goto done;
    }
    if (sqlite3_prepare_v2(s->db,
                           "SELECT time, score, file, caption, error FROM video_keyframe WHERE video = ? ORDER BY idx",
                           -1, &q, NULL) != SQLITE_OK) {
        st = sb_db_fail(s->db, err, "cannot read a video's keyframes");
        goto done;
    }
    sqlite3_bind_int(q, 1, v->idx);
    while (v->n_kf < n && sqlite3_step(q) == SQLITE_ROW) {
        sb_video_kf *f = &v->kf[v->n_kf++];
        f->time = sqlite3_column_double(q, 0);
        f->score = sqlite3_column_double(q, 1);
        const char *rel = (const char *)sqlite3_column_text(q, 2);
        size_t len = strlen(s->frames_dir) + strlen(rel ? rel : "") + 2;
        if ((f->file = sb_malloc(len)))
            snprintf(f->file, len, "%s/%s", s->frames_dir, rel ? rel : "");
        f->caption = column_dup(q, 3);
        f->error = column_dup(q, 4);
        if (!f->file)
            st = sb_fail(err, SB_ERR_NOMEM, "out of memory");
    }
done:
    sqlite3_finalize(q);
    pthread_mutex_unlock(&s->mu);
    return st;
}

/* Inserts or updates v's row with the given state. */
static bool put_video(sb_video_store *s, const sb_video_item *v, sb_video_state state) {
    sqlite3_stmt *q = NULL;
    bool ok = sqlite3_prepare_v2(s->db,
                                 "INSERT INTO video(idx, path, state, duration, summary, error_stage, error, llm_calls)"
                                 " VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT(idx) DO UPDATE SET path = excluded.path,"
                                 " state = excluded.state, duration = excluded.duration, summary = excluded.summary,"
                                 " error_stage = excluded.error_stage, error = excluded.error,"
                                 " llm_calls = excluded.llm_calls",
                                 -1, &q, NULL) == SQLITE_OK;
    if (ok) {
        sqlite3_bind_int(q, 1, v->idx);
        sqlite3_bind_text(q, 2, v->path, -1, SQLITE_TRANSIENT);
        sqlite3_bind_int(q, 3, (int)state);
        if (v->duration >= 0)
            sqlite3_bind_double(q, 4, v->duration);
        else
            sqlite3_bind_null(q, 4);
        bind_text_or_null(q, 5, v->summary);
        bind_text_or_null(q, 6, v->error_stage);
        bind_text_or_null(q, 7, v->error);
        sqlite3_bind_int(q, 8, v->llm_calls);
        ok = sqlite3_step(q) == SQLITE_DONE;
    }
    sqlite3_finalize(q);
    return ok;
}

sb_status sb__video_store_extracted(sb_video_store *s, const sb_video_item *v, sb_error *err) {
    pthread_mutex_lock(&s->mu);
    sb_status st = sb_db_exec(s->db, "BEGIN IMMEDIATE", err);
    if (st != SB_OK)
        goto out;
    sqlite3_stmt *del = NULL, *ins = NULL;
    bool ok = put_video(s, v, SB_VIDEO_EXTRACTED) &&
              sqlite3_prepare_v2(s->db, "DELETE FROM video_keyframe WHERE video = ?", -1, &del, NULL) == SQLITE_OK &&
              sqlite3_bind_int(del, 1, v->idx) == SQLITE_OK && sqlite3_step(del) == SQLITE_DONE &&
              sqlite3_prepare_v2(s->db,
                                 "INSERT INTO video_keyframe(video, idx, time, score, file) VALUES (?, ?, ?, ?, ?)", -1,
                                 &ins, NULL) == SQLITE_OK;
    size_t skip = strlen(s->frames_dir) + 1; /* stored relative to frames/ */
    for (int32_t k = 0; ok && k < v->n_kf; k++) {
        sqlite3_reset(ins);
        sqlite3_bind_int(ins, 1, v->idx);
        sqlite3_bind_int(ins, 2, k);
        sqlite3_bind_double(ins, 3, v->kf[k].time);
        sqlite3_bind_double(ins, 4, v->kf[k].score);
        sqlite3_bind_text(ins, 5, v->kf[k].file + skip, -1, SQLITE_TRANSIENT);
        ok = sqlite3_step(ins) == SQLITE_DONE;
    }
    sqlite3_finalize(del);
    sqlite3_finalize(ins);
    st = sb_db_end(s->db, ok ? SB_OK : sb_db_fail(s->db, err, "cannot record a video's keyframes"), err);
out:
    pthread_mutex_unlock(&s->mu);
    return st;
}

sb_status sb__video_store_caption(sb_video_store *s, const sb_video_item *v, int32_t k, sb_error *err) {
    pthread_mutex_lock(&s->mu);
    sqlite3_stmt *q = NULL;
    bool ok = sqlite3_prepare_v2(s->db, "UPDATE video_keyframe SET caption = ?, error = ? WHERE video = ? AND idx = ?",
                                 -1, &q, NULL) == SQLITE_OK;
    if (ok) {
        bind_text_or_null(q, 1, v->kf[k].caption);
        bind_text_or_null(q, 2, v->kf[k].error);
        sqlite3_bind_int(q, 3, v->idx);
        sqlite3_bind_int(q, 4, k);
        ok = sqlite3_step(q) == SQLITE_DONE;
    }
    sqlite3_finalize(q);
    sb_status st = ok ? SB_OK : sb_db_fail(s->db, err, "cannot record a caption");
    pthread_mutex_unlock(&s->mu);
    return st;
}

sb_status sb__video_store_done(sb_video_store *s, const sb_video_item *v, sb_error *err) {
    pthread_mutex_lock(&s->mu);
    sb_status st = put_video(s, v, SB_VIDEO_DONE) ? SB_OK : sb_db_fail(s->db, err, "cannot record a summary");
    pthread_mutex_unlock(&s->mu);
    return st;
}
