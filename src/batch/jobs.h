/*
 * jobs.h - the durable state of batch jobs: STATE_DIR/batch.db (SQLite in
 * WAL mode, opened by sb_db_open), shared by `switchboard batch` and the
 * server's /v1/batches.
 *
 * A job row says what ran (the input file's path, size and SHA-256, the
 * endpoint, the owner key), its status and when it entered each one. A
 * request row per input line says where the line is in the file, its
 * custom_id, and once done its output line and tokens. A job and all its
 * request rows are created in one transaction; each result is recorded in
 * its own, and only a recorded result counts as done: a process killed at
 * any moment leaves either no job or a job whose undone rows are exactly
 * the work left. `computations` counts, per row, the results ever recorded
 * for it (a row recorded twice would say 2: the durability test reads it).
 *
 * One store is one connection; its functions may be called from any thread
 * (they serialise on the store's mutex).
 */
#ifndef SB_BATCH_JOBS_H
#define SB_BATCH_JOBS_H

#include <stdbool.h>
#include <stdint.h>

#include "gateway/caller.h"
#include "switchboard.h"

typedef enum sb_batch_status {
    SB_BATCH_VALIDATING,
    SB_BATCH_IN_PROGRESS,
    SB_BATCH_FINALIZING,
    SB_BATCH_COMPLETED,
    SB_BATCH_FAILED,
    SB_BATCH_EXPIRED,
    SB_BATCH_CANCELLING,
    SB_BATCH_CANCELLED,
    SB_BATCH_N_STATUS
} sb_batch_status;

/* "validating", "in_progress", ... (OpenAI's names). */
const char *sb_batch_status_name(sb_batch_status s);

#define SB_BATCH_ID_MAX 64

typedef struct sb_batch_job {
    char id[SB_BATCH_ID_MAX];
    char owner[SB_GW_NAME_MAX];          /* the API key that made it; "" when keys are off */
    char input_file_id[SB_BATCH_ID_MAX]; /* server batches; "" for the CLI */
    char input_path[1024];
    int64_t input_size;
    char input_sha256[65];
    char endpoint[32];                   /* the one url every line must name; "" any (the CLI) */
    char completion_window[16];
    char *metadata;                      /* JSON object text or NULL (sb_malloc'd) */
    char *errors;                        /* job-level error message or NULL (sb_malloc'd) */
    char output_file_id[SB_BATCH_ID_MAX], error_file_id[SB_BATCH_ID_MAX];
    sb_batch_status status;
    int64_t at[SB_BATCH_N_STATUS];       /* unix time it entered each status; 0: never */
    int64_t expires_at;
    /* From the request rows (filled by sb_batch_job_get/list). */
    int64_t total, completed, failed;    /* failed: error lines and non-2xx answers */
    int64_t prompt_tokens, completion_tokens, computations;
} sb_batch_job;

void sb_batch_job_clear(sb_batch_job *j); /* frees metadata and errors */

/* One request row as created: where the line is and, for a line that
 * cannot run, its error output (then done at once, as failed). */
typedef struct sb_batch_item {
    int64_t line;     /* 1-based line number in the input file */
    int64_t offset;   /* byte offset of the line */
    int64_t length;   /* bytes, without the newline */
    char *custom_id;  /* borrowed; NULL when none */
    char *error_output; /* borrowed; NULL: the line is to run */
} sb_batch_item;

typedef struct sb_batch_store sb_batch_store;

sb_status sb_batch_store_open(const char *state_dir, sb_batch_store **out, sb_error *err);
void sb_batch_store_close(sb_batch_store *s);

/* Creates the job (status as in *job, created at job->at[VALIDATING]) and
 * its request rows, all or nothing. */
sb_status sb_batch_job_create(sb_batch_store *s, const sb_batch_job *job, const sb_batch_item *items, int64_t n,
                              sb_error *err);
/* SB_ERR_NOT_FOUND when there is no such job. */
sb_status sb_batch_job_get(sb_batch_store *s, const char *id, sb_batch_job *out, sb_error *err);
/* The jobs (newest first) after `after` (NULL: from the newest), of
 * `owner` (NULL: every owner's), at most `limit`; *has_more says whether
 * more follow. *out is sb_malloc'd (free each with sb_batch_job_clear). */
sb_status sb_batch_job_list(sb_batch_store *s, const char *owner, const char *after, int32_t limit,
                            sb_batch_job **out, int32_t *n, bool *has_more, sb_error *err);
/* The ids of jobs in one of the statuses given (oldest first; for the
 * server's worker after a restart). */
sb_status sb_batch_job_ids_in(sb_batch_store *s, const sb_batch_status *statuses, int n_statuses, char (**ids)[SB_BATCH_ID_MAX],
                              int32_t *n, sb_error *err);
/* Moves the job to `status` at time `now`; `errors` non-NULL sets its error. */
sb_status sb_batch_job_set_status(sb_batch_store *s, const char *id, sb_batch_status status, int64_t now,
                                  const char *errors, sb_error *err);
sb_status sb_batch_job_set_files(sb_batch_store *s, const char *id, const char *output_file_id,
                                 const char *error_file_id, sb_error *err);

/* The rows of a job still to run, in line order (*out sb_malloc'd; each
 * custom_id sb_malloc'd: free with sb_batch_items_free). */
sb_status sb_batch_pending(sb_batch_store *s, const char *job, sb_batch_item **out, int64_t *n, sb_error *err);
void sb_batch_items_free(sb_batch_item *items, int64_t n);

/* Records one result (its own transaction): `failed` says whether it is an
 * error line or a non-2xx answer. */
sb_status sb_batch_record(sb_batch_store *s, const char *job, int64_t line, bool failed, const char *output,
                          int64_t prompt_tokens, int64_t completion_tokens, sb_error *err);

/* Calls fn with every done row's output line in line order; which: 0 all,
 * 1 only succeeded, 2 only failed. Stops with fn's status when not SB_OK. */
typedef sb_status (*sb_batch_output_fn)(void *user, const char *output, sb_error *err);
sb_status sb_batch_outputs(sb_batch_store *s, const char *job, int which, sb_batch_output_fn fn, void *user,
                           sb_error *err);

/* For the other tables of batch.db (files.c): the connection, used between
 * _lock and _unlock only. */
struct sqlite3;
struct sqlite3 *sb__batch_store_lock(sb_batch_store *s);
void sb__batch_store_unlock(sb_batch_store *s);

#endif
