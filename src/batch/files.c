/*
 * files.c - /v1/files' rows and contents (see files.h).
 */
#include "batch/files.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <sqlite3.h>

#include "base/base.h"
#include "gateway/db.h"

sb_status sb_batch_file_path(const char *state_dir, const char *name, char *out, size_t cap, sb_error *err) {
    if ((size_t)snprintf(out, cap, "%s/files", state_dir) >= cap)
        return sb_fail(err, SB_ERR_INVALID_ARG, "%s: the state directory's path is too long", state_dir);
    if (mkdir(out, 0700) != 0 && errno != EEXIST)
        return sb_fail(err, SB_ERR_IO, "%s: cannot create: %s", out, strerror(errno));
    if ((size_t)snprintf(out, cap, "%s/files/%s", state_dir, name) >= cap)
        return sb_fail(err, SB_ERR_INVALID_ARG, "%s: the state directory's path is too long", state_dir);
    return SB_OK;
}

sb_status sb_batch_file_add(sb_batch_store *s, const char *state_dir, const char *tmp_path, sb_batch_file *f,
                            sb_error *err) {
    sb_status st = sb_batch_file_path(state_dir, f->id, f->path, sizeof f->path, err);
    if (st != SB_OK)
        return st;
    if (rename(tmp_path, f->path) != 0)
        return sb_fail(err, SB_ERR_IO, "%s: cannot move to %s: %s", tmp_path, f->path, strerror(errno));
    sqlite3 *db = sb__batch_store_lock(s);
    sqlite3_stmt *q = NULL;
    if (sqlite3_prepare_v2(db,
                           "INSERT OR REPLACE INTO files(id, owner, filename, purpose, bytes, created_at, path)"
                           " VALUES(?,?,?,?,?,?,?)",
                           -1, &q, NULL) != SQLITE_OK) {
        st = sb_db_fail(db, err, "cannot prepare a statement");
    } else {
        sqlite3_bind_text(q, 1, f->id, -1, SQLITE_TRANSIENT);
        sqlite3_bind_text(q, 2, f->owner, -1, SQLITE_TRANSIENT);
        sqlite3_bind_text(q, 3, f->filename, -1, SQLITE_TRANSIENT);
        sqlite3_bind_text(q, 4, f->purpose, -1, SQLITE_TRANSIENT);
        sqlite3_bind_int64(q, 5, f->bytes);
        sqlite3_bind_int64(q, 6, f->created_at);
        sqlite3_bind_text(q, 7, f->path, -1, SQLITE_TRANSIENT);
        if (sqlite3_step(q) != SQLITE_DONE)
            st = sb_db_fail(db, err, "cannot record the file");
    }
    sqlite3_finalize(q);
    sb__batch_store_unlock(s);
    if (st != SB_OK)
        unlink(f->path);
    return st;
}

#define FILE_COLUMNS "id, owner, filename, purpose, bytes, created_at, path"

static void read_file_row(sqlite3_stmt *q, sb_batch_file *f) {
    memset(f, 0, sizeof *f);
    const char *v;
#define COPY(i, dst) snprintf(dst, sizeof dst, "%s", (v = (const char *)sqlite3_column_text(q, i)) ? v : "")
    COPY(0, f->id);
    COPY(1, f->owner);
    COPY(2, f->filename);
    COPY(3, f->purpose);
    COPY(6, f->path);
#undef COPY
    f->bytes = sqlite3_column_int64(q, 4);
    f->created_at = sqlite3_column_int64(q, 5);
}

sb_status sb_batch_file_get(sb_batch_store *s, const char *id, const char *owner, sb_batch_file *out, sb_error *err) {
    sqlite3 *db = sb__batch_store_lock(s);
    sqlite3_stmt *q = NULL;
    sb_status st = SB_OK;
    if (sqlite3_prepare_v2(db, "SELECT " FILE_COLUMNS " FROM files WHERE id = ? AND (?2 IS NULL OR owner = ?2)", -1,
                           &q, NULL) != SQLITE_OK) {
        st = sb_db_fail(db, err, "cannot prepare a statement");
    } else {
        sqlite3_bind_text(q, 1, id, -1, SQLITE_TRANSIENT);
        if (owner)
            sqlite3_bind_text(q, 2, owner, -1, SQLITE_TRANSIENT);
        int rc = sqlite3_step(q);
        if (rc == SQLITE_ROW)
            read_file_row(q, out);
        else
            st = rc == SQLITE_DONE ? sb_fail(err, SB_ERR_NOT_FOUND, "No such File object: %s", id)
                                   : sb_db_fail(db, err, "cannot read the file's row");
    }
    sqlite3_finalize(q);
    sb__batch_store_unlock(s);
    return st;
}

sb_status sb_batch_file_list(sb_batch_store *s, const char *owner, const char *purpose, const char *after,
                             int32_t limit, sb_batch_file **out, int32_t *n, bool *has_more, sb_error *err) {
    *out = NULL;
    *n = 0;
    *has_more = false;
    sb_batch_file *files = sb_calloc((size_t)limit + 1, sizeof *files);
    if (!files)
        return sb_fail(err, SB_ERR_NOMEM, "out of memory listing files");
    sqlite3 *db = sb__batch_store_lock(s);
    sqlite3_stmt *q = NULL;
    sb_status st = SB_OK;
    int32_t got = 0;
    if (sqlite3_prepare_v2(db,
                           "SELECT " FILE_COLUMNS " FROM files WHERE (?1 IS NULL OR owner = ?1)"
                           " AND (?2 IS NULL OR purpose = ?2)"
                           " AND (?3 IS NULL OR rowid < (SELECT rowid FROM files WHERE id = ?3))"
                           " ORDER BY rowid DESC LIMIT ?4",
                           -1, &q, NULL) != SQLITE_OK) {
        st = sb_db_fail(db, err, "cannot prepare a statement");
    } else {
        if (owner)
            sqlite3_bind_text(q, 1, owner, -1, SQLITE_TRANSIENT);
        if (purpose)
            sqlite3_bind_text(q, 2, purpose, -1, SQLITE_TRANSIENT);
        if (after)
            sqlite3_bind_text(q, 3, after, -1, SQLITE_TRANSIENT);
        sqlite3_bind_int(q, 4, limit + 1);
        int rc;
        while ((rc = sqlite3_step(q)) == SQLITE_ROW)
            read_file_row(q, &files[got++]);
        if (rc != SQLITE_DONE)
            st = sb_db_fail(db, err, "cannot list the files");
    }
    sqlite3_finalize(q);
    sb__batch_store_unlock(s);
    if (st != SB_OK) {
        sb_free(files);
        return st;
    }
    *has_more = got > limit;
    *n = SB_MIN(got, limit);
    *out = files;
    return SB_OK;
}

sb_status sb_batch_file_delete(sb_batch_store *s, const char *id, const char *owner, sb_error *err) {
    sb_batch_file f;
    sb_status st = sb_batch_file_get(s, id, owner, &f, err);
    if (st != SB_OK)
        return st;
    sqlite3 *db = sb__batch_store_lock(s);
    sqlite3_stmt *q = NULL;
    if (sqlite3_prepare_v2(db, "DELETE FROM files WHERE id = ?", -1, &q, NULL) != SQLITE_OK) {
        st = sb_db_fail(db, err, "cannot prepare a statement");
    } else {
        sqlite3_bind_text(q, 1, id, -1, SQLITE_TRANSIENT);
        if (sqlite3_step(q) != SQLITE_DONE)
            st = sb_db_fail(db, err, "cannot delete the file's row");
    }
    sqlite3_finalize(q);
    sb__batch_store_unlock(s);
    if (st == SB_OK && unlink(f.path) != 0 && errno != ENOENT)
        st = sb_fail(err, SB_ERR_IO, "%s: cannot remove: %s", f.path, strerror(errno));
    return st;
}
