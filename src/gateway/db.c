/*
 * db.c - opening the state directory's SQLite files (see db.h).
 */
#include "gateway/db.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "base/base.h"

sb_status sb_db_fail(sqlite3 *db, sb_error *err, const char *what) {
    int code = db ? sqlite3_errcode(db) & 0xff : SQLITE_CANTOPEN;
    const char *path = db ? sqlite3_db_filename(db, "main") : NULL;
    sb_status st = code == SQLITE_BUSY || code == SQLITE_LOCKED                           ? SB_ERR_BUSY
                   : code == SQLITE_CORRUPT || code == SQLITE_NOTADB                      ? SB_ERR_FORMAT
                   : code == SQLITE_NOMEM                                                 ? SB_ERR_NOMEM
                                                                                          : SB_ERR_IO;
    return sb_fail(err, st, "%s: %s (%s)%s", path && *path ? path : "database", what,
                   db ? sqlite3_errmsg(db) : "cannot open",
                   st == SB_ERR_BUSY ? ": another process holds the database locked" : "");
}

sb_status sb_db_exec(sqlite3 *db, const char *sql, sb_error *err) {
    if (sqlite3_exec(db, sql, NULL, NULL, NULL) != SQLITE_OK)
        return sb_db_fail(db, err, "cannot run a statement");
    return SB_OK;
}

/* mkdir -p: the default state directory (~/.local/state/switchboard) may
 * be the first thing under ~/.local. Parents get 0700 too. */
static int make_dirs(const char *dir) {
    char p[4096];
    if ((size_t)snprintf(p, sizeof p, "%s", dir) >= sizeof p)
        return ENAMETOOLONG;
    for (char *c = p + 1; *c; c++)
        if (*c == '/') {
            *c = '\0';
            if (mkdir(p, 0700) != 0 && errno != EEXIST)
                return errno;
            *c = '/';
        }
    return mkdir(p, 0700) != 0 && errno != EEXIST ? errno : 0;
}

sb_status sb_db_end(sqlite3 *db, sb_status st, sb_error *err) {
    if (st == SB_OK)
        st = sb_db_exec(db, "COMMIT", err);
    if (st != SB_OK) /* a failed COMMIT leaves the transaction open */
        sqlite3_exec(db, "ROLLBACK", NULL, NULL, NULL);
    return st;
}

sb_status sb_db_open(const char *dir, const char *file, const char *schema, sqlite3 **out, sb_error *err) {
    *out = NULL;
    int e = make_dirs(dir);
    if (e)
        return sb_fail(err, SB_ERR_IO, "%s: cannot create the state directory: %s", dir, strerror(e));
    char path[4096];
    if ((size_t)snprintf(path, sizeof path, "%s/%s", dir, file) >= sizeof path)
        return sb_fail(err, SB_ERR_INVALID_ARG, "%s: the state directory's path is too long", dir);
    sqlite3 *db = NULL;
    if (sqlite3_open_v2(path, &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX, NULL) !=
        SQLITE_OK) {
        sb_status st = sb_db_fail(db, err, "cannot open");
        sqlite3_close(db);
        return st;
    }
    sqlite3_busy_timeout(db, SB_DB_BUSY_TIMEOUT_MS);
    /* journal_mode answers with a row: a file that is no database fails here,
     * before the schema could be applied to it. */
    sb_status st = sb_db_exec(db, "PRAGMA journal_mode=WAL", err);
    if (st == SB_OK)
        st = sb_db_exec(db, "PRAGMA synchronous=NORMAL; PRAGMA foreign_keys=ON", err);
    if (st == SB_OK && schema)
        st = sb_db_exec(db, schema, err);
    if (st != SB_OK) {
        sqlite3_close(db);
        return st;
    }
    *out = db;
    return SB_OK;
}

void sb_db_close(sqlite3 *db) {
    if (db)
        sqlite3_close(db);
}
