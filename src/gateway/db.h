/*
 * db.h - the SQLite databases under --state-dir (API keys, usage, batch
 * jobs): one way to open them, so that every one is in WAL mode (readers
 * never wait for the writer; a killed process loses no committed row), waits a
 * bounded time for a lock instead of failing at once, and says which file is
 * wrong and how when it cannot be used.
 *
 * A connection belongs to one thread at a time (SQLite's "multi-thread"
 * mode); callers that share one serialise on their own mutex.
 */
#ifndef SB_GW_DB_H
#define SB_GW_DB_H

#include <sqlite3.h>

#include "switchboard.h"

/* How long a statement waits for another process's lock before it fails
 * with SQLITE_BUSY (then reported as SB_ERR_BUSY). */
#define SB_DB_BUSY_TIMEOUT_MS 2000

/* Opens (creating when missing) DIR/FILE, makes DIR when missing, switches
 * to WAL and runs `schema` (idempotent SQL: CREATE TABLE IF NOT EXISTS ...).
 * A file that is not a database, or a corrupt one, fails with SB_ERR_FORMAT
 * naming the path; a locked one with SB_ERR_BUSY. */
sb_status sb_db_open(const char *dir, const char *file, const char *schema, sqlite3 **out, sb_error *err);
/* Closes; NULL is a no-op. */
void sb_db_close(sqlite3 *db);
/* Maps the connection's last error to a status and message that name `what`
 * (the operation) and the database's path. */
sb_status sb_db_fail(sqlite3 *db, sb_error *err, const char *what);
/* Runs SQL without results (BEGIN, COMMIT, a schema); errors via sb_db_fail. */
sb_status sb_db_exec(sqlite3 *db, const char *sql, sb_error *err);
/* Ends the transaction a BEGIN started: commits when st is SB_OK (and
 * returns the commit's status), else rolls back and returns st. */
sb_status sb_db_end(sqlite3 *db, sb_status st, sb_error *err);

#endif
