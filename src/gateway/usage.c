/*
 * usage.c - usage, cost and feedback in usage.db (see usage.h).
 */
#include "gateway/usage.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "base/base.h"
#include "gateway/db.h"

static const char schema[] =
    "CREATE TABLE IF NOT EXISTS usage("
    " day TEXT NOT NULL, key TEXT NOT NULL, model TEXT NOT NULL, requested TEXT NOT NULL,"
    " requests INTEGER NOT NULL DEFAULT 0, prompt_tokens INTEGER NOT NULL DEFAULT 0,"
    " completion_tokens INTEGER NOT NULL DEFAULT 0, cached_tokens INTEGER NOT NULL DEFAULT 0,"
    " cache_hits INTEGER NOT NULL DEFAULT 0, errors INTEGER NOT NULL DEFAULT 0,"
    " latency_ms_sum REAL NOT NULL DEFAULT 0, latency_n INTEGER NOT NULL DEFAULT 0,"
    " ttft_ms_sum REAL NOT NULL DEFAULT 0, ttft_n INTEGER NOT NULL DEFAULT 0, cost REAL NOT NULL DEFAULT 0,"
    " rating_sum REAL NOT NULL DEFAULT 0, rating_n INTEGER NOT NULL DEFAULT 0,"
    " PRIMARY KEY(day, key, model, requested));"
    "CREATE TABLE IF NOT EXISTS completions("
    " id TEXT PRIMARY KEY, day TEXT NOT NULL, key TEXT NOT NULL, model TEXT NOT NULL, requested TEXT NOT NULL,"
    " created INTEGER NOT NULL);"
    "CREATE TABLE IF NOT EXISTS feedback("
    " id TEXT PRIMARY KEY REFERENCES completions(id), rating REAL NOT NULL, comment TEXT, created INTEGER NOT NULL);";

static const char add_sql[] =
    "INSERT INTO usage(day, key, model, requested, requests, prompt_tokens, completion_tokens, cached_tokens,"
    " cache_hits, errors, latency_ms_sum, latency_n, ttft_ms_sum, ttft_n, cost)"
    " VALUES(?1, ?2, ?3, ?4, 1, ?5, ?6, ?7, ?8, ?9, ?10, 1, ?11, ?12, ?13)"
    " ON CONFLICT(day, key, model, requested) DO UPDATE SET requests = requests + 1,"
    " prompt_tokens = prompt_tokens + ?5, completion_tokens = completion_tokens + ?6,"
    " cached_tokens = cached_tokens + ?7, cache_hits = cache_hits + ?8, errors = errors + ?9,"
    " latency_ms_sum = latency_ms_sum + ?10, latency_n = latency_n + 1, ttft_ms_sum = ttft_ms_sum + ?11,"
    " ttft_n = ttft_n + ?12, cost = cost + ?13";
static const char completion_sql[] =
    "INSERT OR REPLACE INTO completions(id, day, key, model, requested, created) VALUES(?1, ?2, ?3, ?4, ?5, ?6)";

struct sb_gw_usage {
    pthread_mutex_t mu;
    sqlite3 *db;
    sqlite3_stmt *add, *completion; /* prepared once: the writer's per-request statements */
};

void sb_gw_usage_day(int64_t t, char out[11]) {
    time_t tt = (time_t)t;
    struct tm tm;
    gmtime_r(&tt, &tm);
    strftime(out, 11, "%Y-%m-%d", &tm);
}

bool sb_gw_usage_day_valid(const char *s) {
    int y, m, d;
    char tail;
    return s && strlen(s) == 10 && sscanf(s, "%4d-%2d-%2d%c", &y, &m, &d, &tail) == 3 && s[4] == '-' &&
           s[7] == '-' && m >= 1 && m <= 12 && d >= 1 && d <= 31;
}

bool sb_gw_usage_by_parse(const char *s, sb_gw_usage_by *out) {
    static const char *const names[] = {[SB_GW_BY_MODEL] = "model", [SB_GW_BY_KEY] = "key", [SB_GW_BY_DAY] = "day"};
    for (size_t i = 0; i < SB_ARRAY_LEN(names); i++)
        if (s && strcmp(s, names[i]) == 0) {
            *out = (sb_gw_usage_by)i;
            return true;
        }
    return false;
}

sb_status sb_gw_usage_open(const char *dir, sb_gw_usage **out, sb_error *err) {
    *out = NULL;
    sb_gw_usage *u = sb_calloc(1, sizeof *u);
    if (!u)
        return sb_fail(err, SB_ERR_NOMEM, "usage: out of memory");
    pthread_mutex_init(&u->mu, NULL);
    sb_status st = sb_db_open(dir, SB_GW_USAGE_FILE, schema, &u->db, err);
    if (st == SB_OK && (sqlite3_prepare_v2(u->db, add_sql, -1, &u->add, NULL) != SQLITE_OK ||
                        sqlite3_prepare_v2(u->db, completion_sql, -1, &u->completion, NULL) != SQLITE_OK))
        st = sb_db_fail(u->db, err, "cannot prepare the usage statements");
    if (st != SB_OK) {
        sb_gw_usage_close(u);
        return st;
    }
    *out = u;
    return SB_OK;
}

void sb_gw_usage_close(sb_gw_usage *u) {
    if (!u)
        return;
    sqlite3_finalize(u->add);
    sqlite3_finalize(u->completion);
    pthread_mutex_destroy(&u->mu);
    sb_db_close(u->db);
    sb_free(u);
}

static bool step_done(sqlite3_stmt *s) {
    int rc = sqlite3_step(s);
    sqlite3_reset(s);
    return rc == SQLITE_DONE;
}

static bool add_one(sb_gw_usage *u, const sb_gw_usage_rec *r) {
    char day[11];
    sb_gw_usage_day(r->time_s, day);
    sqlite3_stmt *s = u->add;
    sqlite3_clear_bindings(s);
    sqlite3_bind_text(s, 1, day, -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(s, 2, r->key ? r->key : "", -1, SQLITE_STATIC);
    sqlite3_bind_text(s, 3, r->model ? r->model : "", -1, SQLITE_STATIC);
    sqlite3_bind_text(s, 4, r->requested ? r->requested : "", -1, SQLITE_STATIC);
    sqlite3_bind_int64(s, 5, r->prompt);
    sqlite3_bind_int64(s, 6, r->completion);
    sqlite3_bind_int64(s, 7, r->cached);
    sqlite3_bind_int(s, 8, r->cache_hit);
    sqlite3_bind_int(s, 9, r->error);
    sqlite3_bind_double(s, 10, r->latency_ms);
    sqlite3_bind_double(s, 11, r->ttft_ms >= 0 ? r->ttft_ms : 0);
    sqlite3_bind_int(s, 12, r->ttft_ms >= 0);
    sqlite3_bind_double(s, 13, r->cost);
    if (!step_done(s))
        return false;
    if (!r->id)
        return true;
    s = u->completion;
    sqlite3_clear_bindings(s);
    sqlite3_bind_text(s, 1, r->id, -1, SQLITE_STATIC);
    sqlite3_bind_text(s, 2, day, -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(s, 3, r->key ? r->key : "", -1, SQLITE_STATIC);
    sqlite3_bind_text(s, 4, r->model ? r->model : "", -1, SQLITE_STATIC);
    sqlite3_bind_text(s, 5, r->requested ? r->requested : "", -1, SQLITE_STATIC);
    sqlite3_bind_int64(s, 6, r->time_s);
    return step_done(s);
}

sb_status sb_gw_usage_record(sb_gw_usage *u, const sb_gw_usage_rec *recs, size_t n, sb_error *err) {
    pthread_mutex_lock(&u->mu);
    sb_status st = sb_db_exec(u->db, "BEGIN IMMEDIATE", err);
    for (size_t i = 0; st == SB_OK && i < n; i++)
        if (!add_one(u, &recs[i]))
            st = sb_db_fail(u->db, err, "cannot record usage");
    st = sb_db_end(u->db, st, err);
    pthread_mutex_unlock(&u->mu);
    return st;
}

/* Runs `sql` with text parameters (NULL binds NULL); SQLITE_ROW or SQLITE_DONE on success. */
static int run(sqlite3 *db, const char *sql, sqlite3_stmt **keep, int n, const char *const *texts) {
    sqlite3_stmt *s;
    if (sqlite3_prepare_v2(db, sql, -1, &s, NULL) != SQLITE_OK)
        return SQLITE_ERROR;
    for (int i = 0; i < n; i++)
        sqlite3_bind_text(s, i + 1, texts[i], -1, SQLITE_STATIC);
    int rc = sqlite3_step(s);
    if (keep && rc == SQLITE_ROW)
        *keep = s;
    else
        sqlite3_finalize(s);
    return rc;
}

static sb_status feedback_locked(sb_gw_usage *u, const char *id, const char *key, double rating, const char *comment,
                                 char model_out[SB_GW_USAGE_NAME_MAX], sb_error *err) {
    sqlite3_stmt *s = NULL;
    const char *args[] = {id, key};
    int rc = run(u->db,
                 key ? "SELECT day, key, model, requested FROM completions WHERE id = ?1 AND key = ?2"
                     : "SELECT day, key, model, requested FROM completions WHERE id = ?1",
                 &s, key ? 2 : 1, args);
    if (rc == SQLITE_DONE)
        return sb_fail(err, SB_ERR_NOT_FOUND, "no completion has the id '%.100s'", id);
    if (rc != SQLITE_ROW)
        return sb_db_fail(u->db, err, "cannot look the completion up");
    char row[4][SB_GW_USAGE_NAME_MAX];
    for (int i = 0; i < 4; i++)
        snprintf(row[i], sizeof row[i], "%s", (const char *)sqlite3_column_text(s, i));
    sqlite3_finalize(s);
    snprintf(model_out, SB_GW_USAGE_NAME_MAX, "%s", row[2]);

    /* A second rating replaces the first: its old value leaves the sums. */
    double old = 0;
    bool had = false;
    if (sqlite3_prepare_v2(u->db, "SELECT rating FROM feedback WHERE id = ?1", -1, &s, NULL) != SQLITE_OK)
        return sb_db_fail(u->db, err, "cannot read the feedback");
    sqlite3_bind_text(s, 1, id, -1, SQLITE_STATIC);
    if ((had = sqlite3_step(s) == SQLITE_ROW))
        old = sqlite3_column_double(s, 0);
    sqlite3_finalize(s);

    if (sqlite3_prepare_v2(u->db, "INSERT OR REPLACE INTO feedback(id, rating, comment, created) VALUES(?1, ?2, ?3, ?4)",
                           -1, &s, NULL) != SQLITE_OK)
        return sb_db_fail(u->db, err, "cannot store the feedback");
    sqlite3_bind_text(s, 1, id, -1, SQLITE_STATIC);
    sqlite3_bind_double(s, 2, rating);
    if (comment)
        sqlite3_bind_text(s, 3, comment, -1, SQLITE_STATIC);
    sqlite3_bind_int64(s, 4, (int64_t)time(NULL));
    if (!step_done(s)) {
        sqlite3_finalize(s);
        return sb_db_fail(u->db, err, "cannot store the feedback");
    }
    sqlite3_finalize(s);

    if (sqlite3_prepare_v2(u->db,
                           "UPDATE usage SET rating_sum = rating_sum + ?1, rating_n = rating_n + ?2"
                           " WHERE day = ?3 AND key = ?4 AND model = ?5 AND requested = ?6",
                           -1, &s, NULL) != SQLITE_OK)
        return sb_db_fail(u->db, err, "cannot count the feedback");
    sqlite3_bind_double(s, 1, rating - old);
    sqlite3_bind_int(s, 2, had ? 0 : 1);
    for (int i = 0; i < 4; i++)
        sqlite3_bind_text(s, 3 + i, row[i], -1, SQLITE_STATIC);
    bool ok = step_done(s);
    sqlite3_finalize(s);
    return ok ? SB_OK : sb_db_fail(u->db, err, "cannot count the feedback");
}

sb_status sb_gw_usage_feedback(sb_gw_usage *u, const char *id, const char *key, double rating, const char *comment,
                               char model_out[SB_GW_USAGE_NAME_MAX], sb_error *err) {
    pthread_mutex_lock(&u->mu);
    sb_status st = sb_db_exec(u->db, "BEGIN IMMEDIATE", err);
    if (st == SB_OK)
        st = feedback_locked(u, id, key, rating, comment, model_out, err);
    st = sb_db_end(u->db, st, err);
    pthread_mutex_unlock(&u->mu);
    return st;
}

sb_status sb_gw_usage_query(sb_gw_usage *u, sb_gw_usage_by by, const char *since, const char *key,
                            sb_gw_usage_row **rows, size_t *n, sb_error *err) {
    *rows = NULL;
    *n = 0;
    static const char *const groups[] = {[SB_GW_BY_MODEL] = "model, CASE WHEN requested = model THEN '' ELSE requested END",
                                         [SB_GW_BY_KEY] = "key, ''", [SB_GW_BY_DAY] = "day, ''"};
    char sql[1024];
    snprintf(sql, sizeof sql,
             "SELECT %s, SUM(requests), SUM(prompt_tokens), SUM(completion_tokens), SUM(cached_tokens),"
             " SUM(cache_hits), SUM(errors), SUM(latency_ms_sum), SUM(latency_n), SUM(ttft_ms_sum), SUM(ttft_n),"
             " SUM(cost), SUM(rating_sum), SUM(rating_n) FROM usage"
             " WHERE (?1 IS NULL OR day >= ?1) AND (?2 IS NULL OR key = ?2) GROUP BY 1, 2 ORDER BY 1, 2",
             groups[by]);
    pthread_mutex_lock(&u->mu);
    sqlite3_stmt *s;
    sb_status st = SB_OK;
    if (sqlite3_prepare_v2(u->db, sql, -1, &s, NULL) != SQLITE_OK) {
        st = sb_db_fail(u->db, err, "cannot read usage");
        pthread_mutex_unlock(&u->mu);
        return st;
    }
    sqlite3_bind_text(s, 1, since, -1, SQLITE_STATIC); /* NULL binds NULL */
    sqlite3_bind_text(s, 2, key, -1, SQLITE_STATIC);
    size_t cap = 0;
    int rc;
    while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
        if (*n == cap) {
            size_t nc = cap ? cap * 2 : 16;
            sb_gw_usage_row *r = sb_realloc(*rows, nc * sizeof *r);
            if (!r) {
                st = sb_fail(err, SB_ERR_NOMEM, "usage: out of memory");
                break;
            }
            *rows = r;
            cap = nc;
        }
        sb_gw_usage_row *r = &(*rows)[(*n)++];
        memset(r, 0, sizeof *r);
        snprintf(r->group, sizeof r->group, "%s", (const char *)sqlite3_column_text(s, 0));
        snprintf(r->arm, sizeof r->arm, "%s", (const char *)sqlite3_column_text(s, 1));
        int64_t *ints[] = {&r->requests, &r->prompt, &r->completion, &r->cached, &r->cache_hits, &r->errors};
        for (int i = 0; i < 6; i++)
            *ints[i] = sqlite3_column_int64(s, 2 + i);
        r->latency_ms_sum = sqlite3_column_double(s, 8);
        r->latency_n = sqlite3_column_int64(s, 9);
        r->ttft_ms_sum = sqlite3_column_double(s, 10);
        r->ttft_n = sqlite3_column_int64(s, 11);
        r->cost = sqlite3_column_double(s, 12);
        r->rating_sum = sqlite3_column_double(s, 13);
        r->rating_n = sqlite3_column_int64(s, 14);
    }
    if (st == SB_OK && rc != SQLITE_DONE)
        st = sb_db_fail(u->db, err, "cannot read usage");
    sqlite3_finalize(s);
    pthread_mutex_unlock(&u->mu);
    if (st != SB_OK) {
        sb_free(*rows);
        *rows = NULL;
        *n = 0;
    }
    return st;
}
