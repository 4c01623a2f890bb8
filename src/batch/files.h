/*
 * files.h - the files of the server's /v1/files: uploaded batch inputs and
 * the batches' output and error files, each a file under STATE_DIR/files/
 * named by its id, and a row in batch.db's files table (owner, name,
 * purpose, size, time).
 *
 * An upload is written to a temporary file first and becomes a file only
 * when its row is committed (sb_batch_file_add renames it into place), so a
 * crash mid-upload leaves no half file that a batch could name.
 */
#ifndef SB_BATCH_FILES_H
#define SB_BATCH_FILES_H

#include <stdbool.h>
#include <stdint.h>

#include "batch/jobs.h"

typedef struct sb_batch_file {
    char id[SB_BATCH_ID_MAX];
    char owner[SB_GW_NAME_MAX];
    char filename[256];
    char purpose[32];  /* "batch" (uploads), "batch_output" (results) */
    int64_t bytes;
    int64_t created_at;
    char path[1024];   /* where its content is */
} sb_batch_file;

/* STATE_DIR/files/NAME into out (cap bytes); makes the directory. */
sb_status sb_batch_file_path(const char *state_dir, const char *name, char *out, size_t cap, sb_error *err);

/* Moves the content at `tmp_path` to the file's place (f->path is set from
 * state_dir and f->id) and records the row (replacing one of the same id). */
sb_status sb_batch_file_add(sb_batch_store *s, const char *state_dir, const char *tmp_path, sb_batch_file *f,
                            sb_error *err);
/* SB_ERR_NOT_FOUND when there is no such file, or `owner` (non-NULL) is not its owner. */
sb_status sb_batch_file_get(sb_batch_store *s, const char *id, const char *owner, sb_batch_file *out, sb_error *err);
/* Newest first, after the file `after` (NULL: from the newest), at most
 * limit; purpose NULL: any. *out sb_malloc'd. */
sb_status sb_batch_file_list(sb_batch_store *s, const char *owner, const char *purpose, const char *after,
                             int32_t limit, sb_batch_file **out, int32_t *n, bool *has_more, sb_error *err);
/* Removes the row and the content. SB_ERR_NOT_FOUND as sb_batch_file_get. */
sb_status sb_batch_file_delete(sb_batch_store *s, const char *id, const char *owner, sb_error *err);

#endif
