/*
 * keys.c - API keys in SQLite, cached in memory (see keys.h).
 *
 * Why a fast keyed hash and not bcrypt/scrypt/argon2: those are slow on
 * purpose because passwords are guessable (a few tens of bits), so each
 * guess against a stolen hash must be expensive. These keys are 192 bits
 * from RAND_bytes: nobody can enumerate them however fast the hash, so
 * SHA-256 already makes a stolen database useless, and a hash that costs
 * about a microsecond keeps authentication off the request's latency.
 * The per-database HMAC secret adds that equal keys never hash alike in
 * two state directories, and that nobody without the file can compute
 * where a key would sit in the in-memory table (the probe's timing then
 * says nothing about which keys exist; the final comparison is constant
 * time anyway).
 */
#include "gateway/keys.h"

#include <ctype.h>
#include <errno.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "base/base.h"
#include "gateway/clock.h"
#include "gateway/db.h"

#define HASH_LEN 32

static const char schema[] =
    "CREATE TABLE IF NOT EXISTS meta(k TEXT PRIMARY KEY, v BLOB NOT NULL);"
    "CREATE TABLE IF NOT EXISTS keys("
    " name TEXT PRIMARY KEY, hash BLOB NOT NULL UNIQUE, tier TEXT NOT NULL,"
    " rps INTEGER NOT NULL DEFAULT 0, rpm INTEGER NOT NULL DEFAULT 0, tpm INTEGER NOT NULL DEFAULT 0,"
    " models TEXT NOT NULL DEFAULT '', expires INTEGER NOT NULL DEFAULT 0,"
    " enabled INTEGER NOT NULL DEFAULT 1, admin INTEGER NOT NULL DEFAULT 0, created INTEGER NOT NULL);";

/* The keys as last read: an immutable snapshot, swapped whole on reload. */
typedef struct key_table {
    sb_gw_key *keys;
    uint8_t (*hashes)[HASH_LEN];
    size_t n;
    int32_t *slots;   /* cap entries by hash: an index into keys, or -1 */
    int32_t *by_name; /* cap entries by name (the same way) */
    size_t cap;       /* a power of two, at least twice n */
} key_table;

struct sb_gw_keys {
    pthread_mutex_t db_mu; /* the connection is used by one thread at a time */
    sqlite3 *db;
    uint8_t secret[32];
    int64_t data_version;  /* the last one read; -1 before the first load */

    pthread_rwlock_t table_mu;
    key_table *table;

    void (*log)(void *user, const char *line);
    void *log_user;
    bool reload_failing;   /* the last reload failed (said once, until one succeeds) */

    bool watching;
    pthread_t thread;
    pthread_mutex_t stop_mu;
    pthread_cond_t stop_cv;
    bool stop;
};

static void table_free(key_table *t) {
    if (!t)
        return;
    sb_free(t->keys);
    sb_free(t->hashes);
    sb_free(t->slots);
    sb_free(t->by_name);
    sb_free(t);
}

static uint64_t slot_of(const uint8_t *hash) {
    uint64_t h;
    memcpy(&h, hash, sizeof h);
    return h;
}

uint64_t sb_gw_name_hash(const char *s) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

static void hash_key(const sb_gw_keys *ks, const char *raw, size_t len, uint8_t out[HASH_LEN]) {
    unsigned int n = HASH_LEN;
    HMAC(EVP_sha256(), ks->secret, (int)sizeof ks->secret, (const unsigned char *)raw, len, out, &n);
}

static void copy_text(char *dst, size_t cap, const unsigned char *src) {
    snprintf(dst, cap, "%s", src ? (const char *)src : "");
}

/* Reads every key into a fresh table. Caller holds db_mu. */
static sb_status read_table(sb_gw_keys *ks, key_table **out, sb_error *err) {
    *out = NULL;
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(ks->db,
                           "SELECT name, hash, tier, rps, rpm, tpm, models, expires, enabled, admin, created "
                           "FROM keys ORDER BY name",
                           -1, &st, NULL) != SQLITE_OK)
        return sb_db_fail(ks->db, err, "cannot read the keys");
    key_table *t = sb_calloc(1, sizeof *t);
    size_t cap = 0;
    sb_status status = t ? SB_OK : sb_fail(err, SB_ERR_NOMEM, "out of memory for the keys");
    int rc;
    while (status == SB_OK && (rc = sqlite3_step(st)) == SQLITE_ROW) {
        if (t->n == cap) {
            cap = cap ? cap * 2 : 16;
            sb_gw_key *k = sb_realloc(t->keys, cap * sizeof *k);
            if (k)
                t->keys = k;
            uint8_t(*h)[HASH_LEN] = k ? sb_realloc(t->hashes, cap * sizeof *h) : NULL;
            if (h)
                t->hashes = h;
            if (!k || !h) {
                status = sb_fail(err, SB_ERR_NOMEM, "out of memory for the keys");
                break;
            }
        }
        sb_gw_key *k = &t->keys[t->n];
        memset(k, 0, sizeof *k);
        copy_text(k->name, sizeof k->name, sqlite3_column_text(st, 0));
        if (sqlite3_column_bytes(st, 1) != HASH_LEN) { /* not one we wrote: never matches anything */
            continue;
        }
        memcpy(t->hashes[t->n], sqlite3_column_blob(st, 1), HASH_LEN);
        copy_text(k->tier, sizeof k->tier, sqlite3_column_text(st, 2));
        k->rps = sqlite3_column_int64(st, 3);
        k->rpm = sqlite3_column_int64(st, 4);
        k->tpm = sqlite3_column_int64(st, 5);
        copy_text(k->models, sizeof k->models, sqlite3_column_text(st, 6));
        k->expires = sqlite3_column_int64(st, 7);
        k->enabled = sqlite3_column_int(st, 8) != 0;
        k->admin = sqlite3_column_int(st, 9) != 0;
        k->created = sqlite3_column_int64(st, 10);
        t->n++;
    }
    if (status == SB_OK && rc != SQLITE_DONE)
        status = sb_db_fail(ks->db, err, "cannot read the keys");
    sqlite3_finalize(st);
    if (status == SB_OK) {
        t->cap = 16;
        while (t->cap < 2 * t->n)
            t->cap *= 2;
        t->slots = sb_malloc(t->cap * sizeof *t->slots);
        t->by_name = sb_malloc(t->cap * sizeof *t->by_name);
        if (!t->slots || !t->by_name)
            status = sb_fail(err, SB_ERR_NOMEM, "out of memory for the keys");
    }
    if (status != SB_OK) {
        table_free(t);
        return status;
    }
    memset(t->slots, 0xff, t->cap * sizeof *t->slots);
    memset(t->by_name, 0xff, t->cap * sizeof *t->by_name);
    for (size_t i = 0; i < t->n; i++) {
        size_t s = slot_of(t->hashes[i]) & (t->cap - 1);
        while (t->slots[s] >= 0)
            s = (s + 1) & (t->cap - 1);
        t->slots[s] = (int32_t)i;
        for (s = sb_gw_name_hash(t->keys[i].name) & (t->cap - 1); t->by_name[s] >= 0; s = (s + 1) & (t->cap - 1))
            ;
        t->by_name[s] = (int32_t)i;
    }
    *out = t;
    return SB_OK;
}

static sb_status query_int(sqlite3 *db, const char *sql, int64_t *out, sb_error *err) {
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(db, sql, -1, &st, NULL) != SQLITE_OK)
        return sb_db_fail(db, err, "cannot read the database's version");
    int rc = sqlite3_step(st);
    if (rc == SQLITE_ROW)
        *out = sqlite3_column_int64(st, 0);
    sqlite3_finalize(st);
    return rc == SQLITE_ROW ? SB_OK : sb_db_fail(db, err, "cannot read the database's version");
}

/* Reloads when the file changed since the last read (force: always). */
static sb_status reload(sb_gw_keys *ks, bool force, sb_error *err) {
    pthread_mutex_lock(&ks->db_mu);
    int64_t version = 0;
    sb_status st = query_int(ks->db, "PRAGMA data_version", &version, err);
    key_table *t = NULL;
    if (st == SB_OK && (force || version != ks->data_version)) {
        st = read_table(ks, &t, err);
        if (st == SB_OK)
            ks->data_version = version;
    }
    pthread_mutex_unlock(&ks->db_mu);
    if (t) {
        pthread_rwlock_wrlock(&ks->table_mu);
        key_table *old = ks->table;
        ks->table = t;
        pthread_rwlock_unlock(&ks->table_mu);
        table_free(old);
    }
    return st;
}

sb_status sb_gw_keys_refresh(sb_gw_keys *ks, sb_error *err) { return reload(ks, false, err); }

static void *watch_main(void *arg) {
    sb_gw_keys *ks = arg;
    pthread_mutex_lock(&ks->stop_mu);
    while (!ks->stop) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        ts.tv_nsec += SB_GW_KEYS_POLL_MS * 1000000L;
        ts.tv_sec += ts.tv_nsec / 1000000000L;
        ts.tv_nsec %= 1000000000L;
        pthread_cond_timedwait(&ks->stop_cv, &ks->stop_mu, &ts);
        if (ks->stop)
            break;
        pthread_mutex_unlock(&ks->stop_mu);
        sb_error err = {0};
        sb_status st = reload(ks, false, &err);
        if (st != SB_OK && !ks->reload_failing && ks->log) {
            char line[700];
            snprintf(line, sizeof line, "keys: %s; serving the keys last read", err.msg);
            ks->log(ks->log_user, line);
        }
        ks->reload_failing = st != SB_OK;
        pthread_mutex_lock(&ks->stop_mu);
    }
    pthread_mutex_unlock(&ks->stop_mu);
    return NULL;
}

/* The database's HMAC secret, made on first use. Caller holds db_mu. */
static sb_status load_secret(sb_gw_keys *ks, sb_error *err) {
    uint8_t fresh[sizeof ks->secret];
    if (RAND_bytes(fresh, (int)sizeof fresh) != 1)
        return sb_fail(err, SB_ERR_IO, "keys: the system's random generator failed");
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(ks->db, "INSERT OR IGNORE INTO meta(k, v) VALUES('hmac_secret', ?)", -1, &st, NULL) !=
        SQLITE_OK)
        return sb_db_fail(ks->db, err, "cannot store the key secret");
    sqlite3_bind_blob(st, 1, fresh, (int)sizeof fresh, SQLITE_TRANSIENT);
    int rc = sqlite3_step(st);
    sqlite3_finalize(st);
    OPENSSL_cleanse(fresh, sizeof fresh);
    /* Read-only access (a lock held elsewhere) still works when the secret exists. */
    if (rc != SQLITE_DONE && rc != SQLITE_READONLY && (rc & 0xff) != SQLITE_BUSY)
        return sb_db_fail(ks->db, err, "cannot store the key secret");
    if (sqlite3_prepare_v2(ks->db, "SELECT v FROM meta WHERE k = 'hmac_secret'", -1, &st, NULL) != SQLITE_OK)
        return sb_db_fail(ks->db, err, "cannot read the key secret");
    rc = sqlite3_step(st);
    bool ok = rc == SQLITE_ROW && sqlite3_column_bytes(st, 0) == (int)sizeof ks->secret;
    if (ok)
        memcpy(ks->secret, sqlite3_column_blob(st, 0), sizeof ks->secret);
    sqlite3_finalize(st);
    if (rc != SQLITE_ROW && rc != SQLITE_DONE)
        return sb_db_fail(ks->db, err, "cannot read the key secret");
    if (!ok)
        return sb_fail(err, SB_ERR_FORMAT, "%s: the key secret is missing or damaged (meta.hmac_secret)",
                       sqlite3_db_filename(ks->db, "main"));
    return SB_OK;
}

sb_status sb_gw_keys_open(const char *state_dir, bool watch, void (*log)(void *user, const char *line),
                          void *log_user, sb_gw_keys **out, sb_error *err) {
    *out = NULL;
    sb_gw_keys *ks = sb_calloc(1, sizeof *ks);
    if (!ks)
        return sb_fail(err, SB_ERR_NOMEM, "out of memory for the keys");
    pthread_mutex_init(&ks->db_mu, NULL);
    pthread_rwlock_init(&ks->table_mu, NULL);
    pthread_mutex_init(&ks->stop_mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&ks->stop_cv, &ca);
    pthread_condattr_destroy(&ca);
    ks->log = log;
    ks->log_user = log_user;
    ks->data_version = -1;
    sb_status st = sb_db_open(state_dir, SB_GW_KEYS_FILE, schema, &ks->db, err);
    /* The file holds the HMAC secret: readable by its owner only (SQLite
     * gives the -wal and -shm files the same mode). */
    if (st == SB_OK)
        chmod(sqlite3_db_filename(ks->db, "main"), 0600);
    if (st == SB_OK)
        st = load_secret(ks, err);
    if (st == SB_OK)
        st = reload(ks, true, err);
    if (st == SB_OK && watch) {
        if (pthread_create(&ks->thread, NULL, watch_main, ks) != 0)
            st = sb_fail(err, SB_ERR_NOMEM, "keys: cannot start the thread that watches %s", SB_GW_KEYS_FILE);
        else
            ks->watching = true;
    }
    if (st != SB_OK) {
        sb_gw_keys_close(ks);
        return st;
    }
    *out = ks;
    return SB_OK;
}

void sb_gw_keys_close(sb_gw_keys *ks) {
    if (!ks)
        return;
    if (ks->watching) {
        pthread_mutex_lock(&ks->stop_mu);
        ks->stop = true;
        pthread_cond_signal(&ks->stop_cv);
        pthread_mutex_unlock(&ks->stop_mu);
        pthread_join(ks->thread, NULL);
    }
    sb_db_close(ks->db);
    table_free(ks->table);
    OPENSSL_cleanse(ks->secret, sizeof ks->secret);
    pthread_mutex_destroy(&ks->db_mu);
    pthread_rwlock_destroy(&ks->table_mu);
    pthread_mutex_destroy(&ks->stop_mu);
    pthread_cond_destroy(&ks->stop_cv);
    sb_free(ks);
}

/* Runs a one-row change on name; SB_ERR_NOT_FOUND when no row matched. */
static sb_status change(sb_gw_keys *ks, const char *sql, const char *name, int arg, sb_error *err) {
    pthread_mutex_lock(&ks->db_mu);
    sqlite3_stmt *st = NULL;
    sb_status status = SB_OK;
    if (sqlite3_prepare_v2(ks->db, sql, -1, &st, NULL) != SQLITE_OK) {
        status = sb_db_fail(ks->db, err, "cannot change a key");
    } else {
        sqlite3_bind_text(st, 1, name, -1, SQLITE_TRANSIENT);
        if (sqlite3_bind_parameter_count(st) > 1)
            sqlite3_bind_int(st, 2, arg);
        if (sqlite3_step(st) != SQLITE_DONE)
            status = sb_db_fail(ks->db, err, "cannot change a key");
        else if (sqlite3_changes(ks->db) == 0)
            status = sb_fail(err, SB_ERR_NOT_FOUND, "no key is called '%s' (switchboard keys list)", name);
    }
    sqlite3_finalize(st);
    pthread_mutex_unlock(&ks->db_mu);
    return status == SB_OK ? reload(ks, true, err) : status;
}

sb_status sb_gw_keys_set_enabled(sb_gw_keys *ks, const char *name, bool enabled, sb_error *err) {
    return change(ks, "UPDATE keys SET enabled = ?2 WHERE name = ?1", name, enabled, err);
}

sb_status sb_gw_keys_delete(sb_gw_keys *ks, const char *name, sb_error *err) {
    return change(ks, "DELETE FROM keys WHERE name = ?1", name, 0, err);
}

static bool name_ok(const char *s) {
    if (!*s || strlen(s) >= SB_GW_NAME_MAX)
        return false;
    for (; *s; s++)
        if (!isalnum((unsigned char)*s) && !strchr("-_.@", *s))
            return false;
    return true;
}

sb_status sb_gw_keys_create(sb_gw_keys *ks, const sb_gw_key *spec, char *raw, size_t cap, sb_error *err) {
    if (!name_ok(spec->name))
        return sb_fail(err, SB_ERR_INVALID_ARG,
                       "key name '%.80s': 1 to %d letters, digits or - _ . @", spec->name, SB_GW_NAME_MAX - 1);
    if (spec->rps < 0 || spec->rpm < 0 || spec->tpm < 0)
        return sb_fail(err, SB_ERR_INVALID_ARG, "key '%s': limits cannot be negative (0: no limit)", spec->name);
    if (cap < SB_GW_KEY_LEN + 1)
        return sb_fail(err, SB_ERR_INVALID_ARG, "keys: the buffer for the raw key is too small");
    uint8_t rnd[SB_GW_KEY_RANDOM_BYTES];
    if (RAND_bytes(rnd, (int)sizeof rnd) != 1)
        return sb_fail(err, SB_ERR_IO, "keys: the system's random generator failed");
    size_t off = (size_t)snprintf(raw, cap, "%s", SB_GW_KEY_PREFIX);
    for (size_t i = 0; i < sizeof rnd; i++)
        off += (size_t)snprintf(raw + off, cap - off, "%02x", rnd[i]);
    OPENSSL_cleanse(rnd, sizeof rnd);
    uint8_t hash[HASH_LEN];
    hash_key(ks, raw, off, hash);

    pthread_mutex_lock(&ks->db_mu);
    sqlite3_stmt *st = NULL;
    sb_status status = SB_OK;
    if (sqlite3_prepare_v2(ks->db,
                           "INSERT INTO keys(name, hash, tier, rps, rpm, tpm, models, expires, enabled, admin, created)"
                           " VALUES(?, ?, ?, ?, ?, ?, ?, ?, 1, ?, ?)",
                           -1, &st, NULL) != SQLITE_OK) {
        status = sb_db_fail(ks->db, err, "cannot add a key");
    } else {
        sqlite3_bind_text(st, 1, spec->name, -1, SQLITE_TRANSIENT);
        sqlite3_bind_blob(st, 2, hash, HASH_LEN, SQLITE_TRANSIENT);
        sqlite3_bind_text(st, 3, spec->tier, -1, SQLITE_TRANSIENT);
        sqlite3_bind_int64(st, 4, spec->rps);
        sqlite3_bind_int64(st, 5, spec->rpm);
        sqlite3_bind_int64(st, 6, spec->tpm);
        sqlite3_bind_text(st, 7, spec->models, -1, SQLITE_TRANSIENT);
        sqlite3_bind_int64(st, 8, spec->expires);
        sqlite3_bind_int(st, 9, spec->admin);
        sqlite3_bind_int64(st, 10, sb_gw_wall_s());
        int rc = sqlite3_step(st);
        if (rc == SQLITE_CONSTRAINT)
            status = sb_fail(err, SB_ERR_INVALID_ARG, "a key called '%s' exists already", spec->name);
        else if (rc != SQLITE_DONE)
            status = sb_db_fail(ks->db, err, "cannot add a key");
    }
    sqlite3_finalize(st);
    pthread_mutex_unlock(&ks->db_mu);
    if (status != SB_OK) {
        OPENSSL_cleanse(raw, cap);
        raw[0] = '\0';
        return status;
    }
    return reload(ks, true, err);
}

sb_status sb_gw_keys_list(sb_gw_keys *ks, sb_gw_key **out, size_t *n, sb_error *err) {
    *out = NULL;
    *n = 0;
    pthread_mutex_lock(&ks->db_mu);
    key_table *t = NULL;
    sb_status st = read_table(ks, &t, err);
    pthread_mutex_unlock(&ks->db_mu);
    if (st != SB_OK)
        return st;
    *out = t->keys;
    *n = t->n;
    t->keys = NULL;
    table_free(t);
    return SB_OK;
}

size_t sb_gw_keys_count(sb_gw_keys *ks) {
    pthread_rwlock_rdlock(&ks->table_mu);
    size_t n = ks->table ? ks->table->n : 0;
    pthread_rwlock_unlock(&ks->table_mu);
    return n;
}

bool sb_gw_keys_lookup(sb_gw_keys *ks, const char *raw, size_t len, sb_gw_key *out) {
    if (len == 0 || len > SB_GW_KEY_MAX_LEN)
        return false;
    uint8_t hash[HASH_LEN];
    hash_key(ks, raw, len, hash);
    bool found = false;
    pthread_rwlock_rdlock(&ks->table_mu);
    const key_table *t = ks->table;
    if (t && t->n) {
        for (size_t s = slot_of(hash) & (t->cap - 1); t->slots[s] >= 0; s = (s + 1) & (t->cap - 1)) {
            int32_t i = t->slots[s];
            if (CRYPTO_memcmp(t->hashes[i], hash, HASH_LEN) == 0) {
                *out = t->keys[i];
                found = true;
                break;
            }
        }
    }
    pthread_rwlock_unlock(&ks->table_mu);
    return found;
}

bool sb_gw_keys_find(sb_gw_keys *ks, const char *name, sb_gw_key *out) {
    bool found = false;
    pthread_rwlock_rdlock(&ks->table_mu);
    const key_table *t = ks->table;
    if (t && t->n)
        for (size_t s = sb_gw_name_hash(name) & (t->cap - 1); !found && t->by_name[s] >= 0; s = (s + 1) & (t->cap - 1))
            if (strcmp(t->keys[t->by_name[s]].name, name) == 0) {
                *out = t->keys[t->by_name[s]];
                found = true;
            }
    pthread_rwlock_unlock(&ks->table_mu);
    return found;
}

bool sb_gw_key_allows(const sb_gw_key *k, const char *model) {
    if (!k->models[0])
        return true;
    size_t ml = strlen(model);
    for (const char *p = k->models; *p;) {
        size_t n = strcspn(p, ",");
        if (n == ml && strncmp(p, model, n) == 0)
            return true;
        p += n;
        if (*p == ',')
            p++;
    }
    return false;
}

bool sb_gw_parse_expiry(const char *s, int64_t now, int64_t *out) {
    if (s[0] == '+') {
        char *end;
        errno = 0;
        long long n = strtoll(s + 1, &end, 10);
        int64_t unit = *end == 's' ? 1 : *end == 'm' ? 60 : *end == 'h' ? 3600 : *end == 'd' ? 86400 : 0;
        if (end == s + 1 || errno || n <= 0 || !unit || end[1] || n > (int64_t)1e12 / unit)
            return false;
        *out = now + n * unit;
        return true;
    }
    struct tm tm = {0};
    char tail[4] = "";
    int used = 0;
    if (sscanf(s, "%4d-%2d-%2d%n", &tm.tm_year, &tm.tm_mon, &tm.tm_mday, &used) != 3 || used != 10)
        return false;
    if (s[10] == 'T') {
        int used2 = 0;
        if (sscanf(s + 11, "%2d:%2d:%2d%n%3s", &tm.tm_hour, &tm.tm_min, &tm.tm_sec, &used2, tail) < 3 || used2 != 8 ||
            strcmp(tail, "Z") != 0)
            return false;
    } else if (s[10]) {
        return false;
    }
    if (tm.tm_year < 1970 || tm.tm_mon < 1 || tm.tm_mon > 12 || tm.tm_mday < 1 || tm.tm_mday > 31 ||
        tm.tm_hour > 23 || tm.tm_min > 59 || tm.tm_sec > 60)
        return false;
    int mday = tm.tm_mday, mon = tm.tm_mon;
    tm.tm_year -= 1900;
    tm.tm_mon -= 1;
    time_t t = timegm(&tm);
    struct tm check;
    gmtime_r(&t, &check);
    if (check.tm_mday != mday || check.tm_mon != mon - 1) /* 2026-02-30 */
        return false;
    *out = (int64_t)t;
    return true;
}
