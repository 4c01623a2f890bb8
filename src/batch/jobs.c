/*
 * jobs.c - batch jobs and their request rows in STATE_DIR/batch.db (see
 * jobs.h). The files table of the server's /v1/files lives in the same
 * database (files.c) so that a batch and its files commit together.
 */
#include "batch/jobs.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "base/base.h"
#include "gateway/db.h"

static const char schema[] =
    "CREATE TABLE IF NOT EXISTS jobs("
    " id TEXT PRIMARY KEY, owner TEXT NOT NULL, input_file_id TEXT NOT NULL, input_path TEXT NOT NULL,"
    " input_size INTEGER NOT NULL, input_sha256 TEXT NOT NULL, endpoint TEXT NOT NULL,"
    " completion_window TEXT NOT NULL, metadata TEXT, errors TEXT,"
    " output_file_id TEXT NOT NULL DEFAULT '', error_file_id TEXT NOT NULL DEFAULT '',"
    " status TEXT NOT NULL, created_at INTEGER NOT NULL, in_progress_at INTEGER, finalizing_at INTEGER,"
    " completed_at INTEGER, failed_at INTEGER, expired_at INTEGER, cancelling_at INTEGER, cancelled_at INTEGER,"
    " expires_at INTEGER);"
    "CREATE TABLE IF NOT EXISTS requests("
    " job TEXT NOT NULL REFERENCES jobs(id) ON DELETE CASCADE, line INTEGER NOT NULL, custom_id TEXT,"
    " offset INTEGER NOT NULL, length INTEGER NOT NULL,"
    " state INTEGER NOT NULL," /* 0 to run, 1 succeeded, 2 failed */
    " output TEXT, prompt_tokens INTEGER NOT NULL DEFAULT 0, completion_tokens INTEGER NOT NULL DEFAULT 0,"
    " computations INTEGER NOT NULL DEFAULT 0,"
    " PRIMARY KEY(job, line)) WITHOUT ROWID;"
    "CREATE TABLE IF NOT EXISTS files("
    " id TEXT PRIMARY KEY, owner TEXT NOT NULL, filename TEXT NOT NULL, purpose TEXT NOT NULL,"
    " bytes INTEGER NOT NULL, created_at INTEGER NOT NULL, path TEXT NOT NULL);";

/* Column names of the status timestamps, in sb_batch_status order. */
static const char *const at_columns[SB_BATCH_N_STATUS] = {
    "created_at", "in_progress_at", "finalizing_at", "completed_at",
    "failed_at", "expired_at", "cancelling_at", "cancelled_at",
};
static const char *const status_names[SB_BATCH_N_STATUS] = {
    "validating", "in_progress", "finalizing", "completed", "failed", "expired", "cancelling", "cancelled",
};

const char *sb_batch_status_name(sb_batch_status s) {
    return (unsigned)s < SB_BATCH_N_STATUS ? status_names[s] : "unknown";
}

static sb_batch_status status_of(const char *name) {
    for (int i = 0; i < SB_BATCH_N_STATUS; i++)
        if (name && strcmp(name, status_names[i]) == 0)
            return (sb_batch_status)i;
    return SB_BATCH_FAILED;
}

struct sb_batch_store {
    sqlite3 *db;
    pthread_mutex_t mu;
};

sb_status sb_batch_store_open(const char *state_dir, sb_batch_store **out, sb_error *err) {
    *out = NULL;
    sb_batch_store *s = sb_calloc(1, sizeof *s);
    if (!s)
        return sb_fail(err, SB_ERR_NOMEM, "out of memory for the batch store");
    sb_status st = sb_db_open(state_dir, "batch.db", schema, &s->db, err);
    if (st != SB_OK) {
        sb_free(s);
        return st;
    }
    pthread_mutex_init(&s->mu, NULL);
    *out = s;
    return SB_OK;
}

void sb_batch_store_close(sb_batch_store *s) {
    if (!s)
        return;
    sb_db_close(s->db);
    pthread_mutex_destroy(&s->mu);
    sb_free(s);
}

struct sqlite3 *sb__batch_store_lock(sb_batch_store *s) {
    pthread_mutex_lock(&s->mu);
    return s->db;
}

void sb__batch_store_unlock(sb_batch_store *s) { pthread_mutex_unlock(&s->mu); }

void sb_batch_job_clear(sb_batch_job *j) {
    sb_free(j->metadata);
    sb_free(j->errors);
    j->metadata = j->errors = NULL;
}

/* Prepares sql; on failure fills err. */
static sqlite3_stmt *prepare(sqlite3 *db, const char *sql, sb_error *err) {
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(db, sql, -1, &st, NULL) != SQLITE_OK) {
        sb_db_fail(db, err, "cannot prepare a statement");
        return NULL;
    }
    return st;
}

static void bind_text(sqlite3_stmt *st, int i, const char *v) {
    if (v)
        sqlite3_bind_text(st, i, v, -1, SQLITE_TRANSIENT);
    else
        sqlite3_bind_null(st, i);
}

/* A time column: 0 is stored as NULL (never). */
static void bind_time(sqlite3_stmt *st, int i, int64_t t) {
    if (t)
        sqlite3_bind_int64(st, i, t);
    else
        sqlite3_bind_null(st, i);
}

/* Runs a statement that returns no row; finalizes it. */
static sb_status step_done(sqlite3 *db, sqlite3_stmt *st, const char *what, sb_error *err) {
    int rc = sqlite3_step(st);
    sb_status r = rc == SQLITE_DONE ? SB_OK : sb_db_fail(db, err, what);
    sqlite3_finalize(st);
    return r;
}

sb_status sb_batch_job_create(sb_batch_store *s, const sb_batch_job *j, const sb_batch_item *items, int64_t n,
                              sb_error *err) {
    sqlite3 *db = sb__batch_store_lock(s);
    sb_status r = sb_db_exec(db, "BEGIN IMMEDIATE", err);
    if (r != SB_OK) {
        sb__batch_store_unlock(s);
        return r;
    }
    sqlite3_stmt *st = prepare(db,
                               "INSERT INTO jobs(id, owner, input_file_id, input_path, input_size, input_sha256, endpoint,"
                               " completion_window, metadata, status, created_at, in_progress_at, expires_at)"
                               " VALUES(?,?,?,?,?,?,?,?,?,?,?,?,?)",
                               err);
    if (!st) {
        r = SB_ERR_IO;
    } else {
        bind_text(st, 1, j->id);
        bind_text(st, 2, j->owner);
        bind_text(st, 3, j->input_file_id);
        bind_text(st, 4, j->input_path);
        sqlite3_bind_int64(st, 5, j->input_size);
        bind_text(st, 6, j->input_sha256);
        bind_text(st, 7, j->endpoint);
        bind_text(st, 8, j->completion_window[0] ? j->completion_window : "24h");
        bind_text(st, 9, j->metadata);
        bind_text(st, 10, sb_batch_status_name(j->status));
        sqlite3_bind_int64(st, 11, j->at[SB_BATCH_VALIDATING]);
        bind_time(st, 12, j->at[SB_BATCH_IN_PROGRESS]);
        bind_time(st, 13, j->expires_at);
        r = step_done(db, st, "cannot create the job", err);
    }
    if (r == SB_OK && (st = prepare(db,
                                    "INSERT INTO requests(job, line, custom_id, offset, length, state, output,"
                                    " computations) VALUES(?,?,?,?,?,?,?,0)",
                                    err))) {
        for (int64_t i = 0; r == SB_OK && i < n; i++) {
            sqlite3_reset(st);
            bind_text(st, 1, j->id);
            sqlite3_bind_int64(st, 2, items[i].line);
            bind_text(st, 3, items[i].custom_id);
            sqlite3_bind_int64(st, 4, items[i].offset);
            sqlite3_bind_int64(st, 5, items[i].length);
            sqlite3_bind_int(st, 6, items[i].error_output ? 2 : 0);
            bind_text(st, 7, items[i].error_output);
            if (sqlite3_step(st) != SQLITE_DONE)
                r = sb_db_fail(db, err, "cannot create the job's requests");
        }
        sqlite3_finalize(st);
    } else if (r == SB_OK) {
        r = SB_ERR_IO;
    }
    r = sb_db_end(db, r, err);
    sb__batch_store_unlock(s);
    return r;
}

static void copy_col(sqlite3_stmt *st, int i, char *dst, size_t cap) {
    const unsigned char *v = sqlite3_column_text(st, i);
    snprintf(dst, cap, "%s", v ? (const char *)v : "");
}

static char *dup_col(sqlite3_stmt *st, int i) {
    const unsigned char *v = sqlite3_column_text(st, i);
    return v ? sb_strndup((const char *)v, strlen((const char *)v)) : NULL;
}

#define JOB_COLUMNS                                                                                                \
    "id, owner, input_file_id, input_path, input_size, input_sha256, endpoint, completion_window, metadata,"      \
    " errors, output_file_id, error_file_id, status, expires_at, created_at, in_progress_at, finalizing_at,"     \
    " completed_at, failed_at, expired_at, cancelling_at, cancelled_at"
#define JOB_AT_COLUMN 14 /* created_at's index; the others follow in sb_batch_status order */

static void read_job(sqlite3_stmt *st, sb_batch_job *j) {
    memset(j, 0, sizeof *j);
    copy_col(st, 0, j->id, sizeof j->id);
    copy_col(st, 1, j->owner, sizeof j->owner);
    copy_col(st, 2, j->input_file_id, sizeof j->input_file_id);
    copy_col(st, 3, j->input_path, sizeof j->input_path);
    j->input_size = sqlite3_column_int64(st, 4);
    copy_col(st, 5, j->input_sha256, sizeof j->input_sha256);
    copy_col(st, 6, j->endpoint, sizeof j->endpoint);
    copy_col(st, 7, j->completion_window, sizeof j->completion_window);
    j->metadata = dup_col(st, 8);
    j->errors = dup_col(st, 9);
    copy_col(st, 10, j->output_file_id, sizeof j->output_file_id);
    copy_col(st, 11, j->error_file_id, sizeof j->error_file_id);
    j->status = status_of((const char *)sqlite3_column_text(st, 12));
    j->expires_at = sqlite3_column_int64(st, 13);
    for (int i = 0; i < SB_BATCH_N_STATUS; i++)
        j->at[i] = sqlite3_column_int64(st, JOB_AT_COLUMN + i);
}

/* The request rows' sums into j. */
static sb_status read_counts(sqlite3 *db, sb_batch_job *j, sb_error *err) {
    sqlite3_stmt *st = prepare(db,
                               "SELECT count(*), total(state = 1), total(state = 2), total(prompt_tokens),"
                               " total(completion_tokens), total(computations) FROM requests WHERE job = ?",
                               err);
    if (!st)
        return SB_ERR_IO;
    bind_text(st, 1, j->id);
    sb_status r = SB_OK;
    if (sqlite3_step(st) == SQLITE_ROW) {
        j->total = sqlite3_column_int64(st, 0);
        j->completed = sqlite3_column_int64(st, 1);
        j->failed = sqlite3_column_int64(st, 2);
        j->prompt_tokens = sqlite3_column_int64(st, 3);
        j->completion_tokens = sqlite3_column_int64(st, 4);
        j->computations = sqlite3_column_int64(st, 5);
    } else {
        r = sb_db_fail(db, err, "cannot count the job's requests");
    }
    sqlite3_finalize(st);
    return r;
}

sb_status sb_batch_job_get(sb_batch_store *s, const char *id, sb_batch_job *out, sb_error *err) {
    memset(out, 0, sizeof *out);
    sqlite3 *db = sb__batch_store_lock(s);
    sqlite3_stmt *st = prepare(db, "SELECT " JOB_COLUMNS " FROM jobs WHERE id = ?", err);
    sb_status r = st ? SB_OK : SB_ERR_IO;
    if (st) {
        bind_text(st, 1, id);
        int rc = sqlite3_step(st);
        if (rc == SQLITE_ROW) {
            read_job(st, out);
            r = read_counts(db, out, err);
        } else {
            r = rc == SQLITE_DONE ? sb_fail(err, SB_ERR_NOT_FOUND, "no batch with id '%s'", id)
                                  : sb_db_fail(db, err, "cannot read the job");
        }
        sqlite3_finalize(st);
    }
    sb__batch_store_unlock(s);
    if (r != SB_OK)
        sb_batch_job_clear(out);
    return r;
}

sb_status sb_batch_job_list(sb_batch_store *s, const char *owner, const char *after, int32_t limit,
                            sb_batch_job **out, int32_t *n, bool *has_more, sb_error *err) {
    *out = NULL;
    *n = 0;
    *has_more = false;
    sb_batch_job *jobs = sb_calloc((size_t)limit + 1, sizeof *jobs);
    if (!jobs)
        return sb_fail(err, SB_ERR_NOMEM, "out of memory listing batches");
    sqlite3 *db = sb__batch_store_lock(s);
    sqlite3_stmt *st = prepare(db,
                               "SELECT " JOB_COLUMNS " FROM jobs WHERE (?1 IS NULL OR owner = ?1)"
                               " AND (?2 IS NULL OR rowid < (SELECT rowid FROM jobs WHERE id = ?2))"
                               " ORDER BY rowid DESC LIMIT ?3",
                               err);
    sb_status r = st ? SB_OK : SB_ERR_IO;
    int32_t got = 0;
    if (st) {
        bind_text(st, 1, owner);
        bind_text(st, 2, after);
        sqlite3_bind_int(st, 3, limit + 1);
        int rc;
        while ((rc = sqlite3_step(st)) == SQLITE_ROW && got <= limit)
            read_job(st, &jobs[got++]);
        if (rc != SQLITE_ROW && rc != SQLITE_DONE)
            r = sb_db_fail(db, err, "cannot list the jobs");
        sqlite3_finalize(st);
    }
    if (got > limit) {
        *has_more = true;
        sb_batch_job_clear(&jobs[--got]);
    }
    for (int32_t i = 0; r == SB_OK && i < got; i++)
        r = read_counts(db, &jobs[i], err);
    sb__batch_store_unlock(s);
    if (r != SB_OK) {
        for (int32_t i = 0; i < got; i++)
            sb_batch_job_clear(&jobs[i]);
        sb_free(jobs);
        return r;
    }
    *out = jobs;
    *n = got;
    return SB_OK;
}

sb_status sb_batch_job_ids_in(sb_batch_store *s, const sb_batch_status *statuses, int n_statuses,
                              char (**ids)[SB_BATCH_ID_MAX], int32_t *n, sb_error *err) {
    *ids = NULL;
    *n = 0;
    sqlite3 *db = sb__batch_store_lock(s);
    sqlite3_stmt *st = prepare(db, "SELECT id, status FROM jobs ORDER BY rowid", err);
    sb_status r = st ? SB_OK : SB_ERR_IO;
    int32_t cap = 0;
    int rc;
    while (st && r == SB_OK && (rc = sqlite3_step(st)) == SQLITE_ROW) {
        sb_batch_status status = status_of((const char *)sqlite3_column_text(st, 1));
        bool wanted = false;
        for (int i = 0; i < n_statuses; i++)
            wanted |= statuses[i] == status;
        if (!wanted)
            continue;
        if (*n == cap) {
            cap = cap ? 2 * cap : 16;
            void *grown = sb_realloc(*ids, (size_t)cap * sizeof **ids);
            if (!grown) {
                r = sb_fail(err, SB_ERR_NOMEM, "out of memory listing jobs");
                break;
            }
            *ids = grown;
        }
        copy_col(st, 0, (*ids)[(*n)++], SB_BATCH_ID_MAX);
    }
    if (st)
        sqlite3_finalize(st);
    sb__batch_store_unlock(s);
    if (r != SB_OK) {
        sb_free(*ids);
        *ids = NULL;
        *n = 0;
    }
    return r;
}

sb_status sb_batch_job_set_status(sb_batch_store *s, const char *id, sb_batch_status status, int64_t now,
                                  const char *errors, sb_error *err) {
    char sql[200];
    snprintf(sql, sizeof sql, "UPDATE jobs SET status = ?1, %s = ?2, errors = coalesce(?3, errors) WHERE id = ?4",
             at_columns[status]);
    sqlite3 *db = sb__batch_store_lock(s);
    sqlite3_stmt *st = prepare(db, sql, err);
    sb_status r = SB_ERR_IO;
    if (st) {
        bind_text(st, 1, sb_batch_status_name(status));
        sqlite3_bind_int64(st, 2, now);
        bind_text(st, 3, errors);
        bind_text(st, 4, id);
        r = step_done(db, st, "cannot update the job's status", err);
    }
    sb__batch_store_unlock(s);
    return r;
}

sb_status sb_batch_job_set_files(sb_batch_store *s, const char *id, const char *output_file_id,
                                 const char *error_file_id, sb_error *err) {
    sqlite3 *db = sb__batch_store_lock(s);
    sqlite3_stmt *st = prepare(db, "UPDATE jobs SET output_file_id = ?, error_file_id = ? WHERE id = ?", err);
    sb_status r = SB_ERR_IO;
    if (st) {
        bind_text(st, 1, output_file_id);
        bind_text(st, 2, error_file_id);
        bind_text(st, 3, id);
        r = step_done(db, st, "cannot record the job's files", err);
    }
    sb__batch_store_unlock(s);
    return r;
}

void sb_batch_items_free(sb_batch_item *items, int64_t n) {
    for (int64_t i = 0; items && i < n; i++)
        sb_free(items[i].custom_id);
    sb_free(items);
}

sb_status sb_batch_pending(sb_batch_store *s, const char *job, sb_batch_item **out, int64_t *n, sb_error *err) {
    *out = NULL;
    *n = 0;
    sqlite3 *db = sb__batch_store_lock(s);
    sqlite3_stmt *st = prepare(db,
                               "SELECT line, offset, length, custom_id FROM requests WHERE job = ? AND state = 0"
                               " ORDER BY line",
                               err);
    sb_status r = st ? SB_OK : SB_ERR_IO;
    int64_t cap = 0;
    int rc = SQLITE_DONE;
    if (st)
        bind_text(st, 1, job);
    while (st && r == SB_OK && (rc = sqlite3_step(st)) == SQLITE_ROW) {
        if (*n == cap) {
            cap = cap ? 2 * cap : 256;
            void *grown = sb_realloc(*out, (size_t)cap * sizeof **out);
            if (!grown) {
                r = sb_fail(err, SB_ERR_NOMEM, "out of memory listing the requests to run");
                break;
            }
            *out = grown;
        }
        sb_batch_item *it = &(*out)[(*n)++];
        *it = (sb_batch_item){.line = sqlite3_column_int64(st, 0),
                              .offset = sqlite3_column_int64(st, 1),
                              .length = sqlite3_column_int64(st, 2),
                              .custom_id = dup_col(st, 3)};
    }
    if (st && r == SB_OK && rc != SQLITE_DONE)
        r = sb_db_fail(db, err, "cannot list the requests to run");
    if (st)
        sqlite3_finalize(st);
    sb__batch_store_unlock(s);
    if (r != SB_OK) {
        sb_batch_items_free(*out, *n);
        *out = NULL;
        *n = 0;
    }
    return r;
}

sb_status sb_batch_record(sb_batch_store *s, const char *job, int64_t line, bool failed, const char *output,
                          int64_t prompt_tokens, int64_t completion_tokens, sb_error *err) {
    sqlite3 *db = sb__batch_store_lock(s);
    sqlite3_stmt *st = prepare(db,
                               "UPDATE requests SET state = ?, output = ?, prompt_tokens = ?, completion_tokens = ?,"
                               " computations = computations + 1 WHERE job = ? AND line = ?",
                               err);
    sb_status r = SB_ERR_IO;
    if (st) {
        sqlite3_bind_int(st, 1, failed ? 2 : 1);
        bind_text(st, 2, output);
        sqlite3_bind_int64(st, 3, prompt_tokens);
        sqlite3_bind_int64(st, 4, completion_tokens);
        bind_text(st, 5, job);
        sqlite3_bind_int64(st, 6, line);
        r = step_done(db, st, "cannot record a result", err);
    }
    sb__batch_store_unlock(s);
    return r;
}

sb_status sb_batch_outputs(sb_batch_store *s, const char *job, int which, sb_batch_output_fn fn, void *user,
                           sb_error *err) {
    sqlite3 *db = sb__batch_store_lock(s);
    sqlite3_stmt *st = prepare(db,
                               "SELECT output FROM requests WHERE job = ?1 AND state != 0"
                               " AND (?2 = 0 OR state = ?2) ORDER BY line",
                               err);
    sb_status r = st ? SB_OK : SB_ERR_IO;
    int rc = SQLITE_DONE;
    if (st) {
        bind_text(st, 1, job);
        sqlite3_bind_int(st, 2, which);
        while (r == SB_OK && (rc = sqlite3_step(st)) == SQLITE_ROW)
            r = fn(user, (const char *)sqlite3_column_text(st, 0), err);
        if (r == SB_OK && rc != SQLITE_DONE)
            r = sb_db_fail(db, err, "cannot read the job's results");
        sqlite3_finalize(st);
    }
    sb__batch_store_unlock(s);
    return r;
}
