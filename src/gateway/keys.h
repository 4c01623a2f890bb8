/*
 * keys.h - API keys: who may call the server, at which tier, within which
 * limits, on which models. Stored in STATE_DIR/keys.db (SQLite, through
 * sb_db_open), written by `switchboard keys ...` and read by the server.
 *
 * A raw key ("sk-sb-" and 48 hex digits: 192 random bits) is shown once, at
 * creation; the database keeps only HMAC-SHA-256(secret, key), the secret
 * being 32 random bytes made with the database. The server keeps every key
 * in memory (an open-addressed table on the first bytes of the hash, the
 * whole hash then compared with CRYPTO_memcmp) and a thread polls
 * SQLite's data_version every SB_GW_KEYS_POLL_MS, so a `keys disable` in
 * another process takes effect within that. A reload that fails (a file
 * damaged while serving, a lock held past the busy timeout) keeps the
 * keys last read and says why once through the log callback.
 */
#ifndef SB_GW_KEYS_H
#define SB_GW_KEYS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gateway/caller.h"
#include "switchboard.h"

#define SB_GW_KEYS_FILE "keys.db"
#define SB_GW_KEYS_POLL_MS 200
#define SB_GW_KEY_PREFIX "sk-sb-"
#define SB_GW_KEY_RANDOM_BYTES 24
#define SB_GW_KEY_LEN (sizeof SB_GW_KEY_PREFIX - 1 + 2 * SB_GW_KEY_RANDOM_BYTES)
#define SB_GW_KEY_MAX_LEN 256 /* longer credentials are refused before hashing */
#define SB_GW_MODELS_MAX 512

typedef struct sb_gw_key {
    char name[SB_GW_NAME_MAX];
    char tier[SB_GW_NAME_MAX];
    int64_t rps, rpm, tpm;          /* requests per second, per minute, tokens per minute; 0: no limit */
    char models[SB_GW_MODELS_MAX];  /* comma-separated model names; "": every model */
    int64_t expires;                /* unix seconds; 0: never */
    int64_t created;                /* unix seconds */
    bool enabled;
    bool admin;                     /* may use /admin/... (and /metrics when private) */
} sb_gw_key;

typedef struct sb_gw_keys sb_gw_keys;

/* Opens (creating) STATE_DIR/keys.db. With `watch`, starts the thread that
 * picks up other processes' changes (the server); without, the caller only
 * writes and lists (the CLI). `log` gets reload failures (may be NULL). */
sb_status sb_gw_keys_open(const char *state_dir, bool watch, void (*log)(void *user, const char *line),
                          void *log_user, sb_gw_keys **out, sb_error *err);
void sb_gw_keys_close(sb_gw_keys *ks);

/* Adds a key (spec's name, tier, limits, models, expiry, admin; created and
 * enabled are set here) and writes the raw key, NUL-terminated, into raw
 * (cap >= SB_GW_KEY_LEN + 1). A name in use fails with SB_ERR_INVALID_ARG. */
sb_status sb_gw_keys_create(sb_gw_keys *ks, const sb_gw_key *spec, char *raw, size_t cap, sb_error *err);
/* Enables or disables, or deletes, the key called name (SB_ERR_NOT_FOUND if none). */
sb_status sb_gw_keys_set_enabled(sb_gw_keys *ks, const char *name, bool enabled, sb_error *err);
sb_status sb_gw_keys_delete(sb_gw_keys *ks, const char *name, sb_error *err);
/* Every key by name, sb_malloc'd into *out (free with sb_free). */
sb_status sb_gw_keys_list(sb_gw_keys *ks, sb_gw_key **out, size_t *n, sb_error *err);

/* Keys in memory (the server's view; 0 before the first load). */
size_t sb_gw_keys_count(sb_gw_keys *ks);
/* Finds the key whose raw form is raw[0..len) and copies it into *out.
 * False when there is none (enabled or expired are the caller's checks). */
bool sb_gw_keys_lookup(sb_gw_keys *ks, const char *raw, size_t len, sb_gw_key *out);
/* The key called name, from memory (false if none). */
bool sb_gw_keys_find(sb_gw_keys *ks, const char *name, sb_gw_key *out);
/* Re-reads the database now if another process changed it (what the watch
 * thread does every SB_GW_KEYS_POLL_MS). */
sb_status sb_gw_keys_refresh(sb_gw_keys *ks, sb_error *err);

/* Whether the key may use `model` (its models list names it, or is empty). */
bool sb_gw_key_allows(const sb_gw_key *k, const char *model);
/* A string's FNV-1a hash, for the in-memory tables keyed by key name. */
uint64_t sb_gw_name_hash(const char *s);
/* Parses an expiry: "YYYY-MM-DD" (midnight UTC), "YYYY-MM-DDTHH:MM:SSZ", or
 * "+N" with s, m, h or d (from now). Returns false on anything else. */
bool sb_gw_parse_expiry(const char *s, int64_t now, int64_t *out);

#endif
