/*
 * reqlog.h - the request log: one JSON object per line per request (what
 * the server writes is its business: src/server/account.c), appended to a
 * file that is rotated by size: when a line would take it past max_bytes,
 * FILE becomes FILE.1, FILE.1 becomes FILE.2 and so on up to
 * SB_GW_REQLOG_KEEP old files (the oldest is dropped), and a fresh FILE
 * starts. A line is written with one write(2) on an O_APPEND descriptor, so
 * lines never interleave; an I/O error is reported once per failure streak
 * and the server keeps serving.
 *
 * Threads: any; one mutex.
 */
#ifndef SB_GW_REQLOG_H
#define SB_GW_REQLOG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "switchboard.h"

#define SB_GW_REQLOG_KEEP 3
#define SB_GW_REQLOG_DEFAULT_MAX ((uint64_t)64 << 20)

typedef struct sb_gw_reqlog sb_gw_reqlog;

/* Opens (creating) `path` for appending; max_bytes 0: SB_GW_REQLOG_DEFAULT_MAX. */
sb_status sb_gw_reqlog_open(const char *path, uint64_t max_bytes, sb_gw_reqlog **out, sb_error *err);
void sb_gw_reqlog_close(sb_gw_reqlog *l);
/* Appends `len` bytes (one line, its newline included), rotating first when
 * needed. On failure returns false with err set, the first time after a
 * success only (later failures of the same streak return false quietly
 * with err->msg empty). */
bool sb_gw_reqlog_write(sb_gw_reqlog *l, const char *line, size_t len, sb_error *err);

#endif
