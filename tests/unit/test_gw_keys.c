/*
 * test_gw_keys.c - API keys (src/gateway/keys.c): the raw key's form and
 * that only its keyed hash reaches the disk, lookup (a key one character
 * off, a prefix, an oversized one never match), unique and valid names,
 * disable/enable/delete seen by a second, watching handle within a poll,
 * the secret surviving a reopen, allowed models, expiry parsing, and a
 * corrupt keys.db refused with its path named.
 */
#define _GNU_SOURCE /* memmem */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "base/base.h"
#include "gateway/keys.h"
#include "testutil.h"

static const char *fresh_dir(const char *name) {
    static char path[400];
    snprintf(path, sizeof path, "%s/%s", sb_test_tmpdir(), name);
    char cmd[500];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", path);
    assert_int_equal(system(cmd), 0);
    return path;
}

static sb_gw_key spec(const char *name) {
    sb_gw_key k = {0};
    snprintf(k.name, sizeof k.name, "%s", name);
    snprintf(k.tier, sizeof k.tier, "free");
    k.rps = 5;
    return k;
}

/* Whether any file under dir contains needle. */
static bool dir_contains(const char *dir, const char *needle) {
    const char *suffixes[] = {"", "-wal", "-shm"};
    for (size_t i = 0; i < SB_ARRAY_LEN(suffixes); i++) {
        char p[500];
        snprintf(p, sizeof p, "%s/%s%s", dir, SB_GW_KEYS_FILE, suffixes[i]);
        size_t n;
        char *data = sb_test_read_file(p, &n);
        if (!data)
            continue;
        bool found = memmem(data, n, needle, strlen(needle)) != NULL;
        free(data);
        if (found)
            return true;
    }
    return false;
}

static void test_create_lookup(void **state) {
    (void)state;
    const char *dir = fresh_dir("keys-basic");
    sb_gw_keys *ks = NULL;
    assert_int_equal(sb_gw_keys_open(dir, false, NULL, NULL, &ks, NULL), SB_OK);
    assert_int_equal(sb_gw_keys_count(ks), 0);
    char raw[SB_GW_KEY_LEN + 1], raw2[SB_GW_KEY_LEN + 1];
    sb_gw_key k = spec("alice");
    snprintf(k.models, sizeof k.models, "a,bb");
    assert_int_equal(sb_gw_keys_create(ks, &k, raw, sizeof raw, NULL), SB_OK);
    assert_int_equal(strlen(raw), SB_GW_KEY_LEN);
    assert_memory_equal(raw, SB_GW_KEY_PREFIX, strlen(SB_GW_KEY_PREFIX));
    sb_gw_key b = spec("bob");
    b.admin = true;
    assert_int_equal(sb_gw_keys_create(ks, &b, raw2, sizeof raw2, NULL), SB_OK);
    assert_string_not_equal(raw, raw2);
    assert_int_equal(sb_gw_keys_count(ks), 2);

    sb_gw_key got;
    assert_true(sb_gw_keys_lookup(ks, raw, strlen(raw), &got));
    assert_string_equal(got.name, "alice");
    assert_true(got.enabled);
    assert_false(got.admin);
    assert_int_equal(got.rps, 5);
    assert_true(got.created > 0);
    assert_true(sb_gw_keys_lookup(ks, raw2, strlen(raw2), &got));
    assert_string_equal(got.name, "bob");
    assert_true(got.admin);
    /* One character off, a prefix, a longer string, nothing, oversized. */
    char off[SB_GW_KEY_LEN + 2];
    memcpy(off, raw, sizeof raw);
    off[SB_GW_KEY_LEN - 1] = off[SB_GW_KEY_LEN - 1] == '0' ? '1' : '0';
    assert_false(sb_gw_keys_lookup(ks, off, strlen(off), &got));
    assert_false(sb_gw_keys_lookup(ks, raw, strlen(raw) - 1, &got));
    memcpy(off, raw, sizeof raw);
    strcat(off, "x");
    assert_false(sb_gw_keys_lookup(ks, off, strlen(off), &got));
    assert_false(sb_gw_keys_lookup(ks, "", 0, &got));
    char big[SB_GW_KEY_MAX_LEN + 2];
    memset(big, 'a', sizeof big);
    assert_false(sb_gw_keys_lookup(ks, big, sizeof big, &got));
    assert_true(sb_gw_keys_find(ks, "alice", &got));
    assert_false(sb_gw_keys_find(ks, "carol", &got));

    /* Names: unique, and plain. */
    sb_error err = {0};
    assert_int_equal(sb_gw_keys_create(ks, &k, raw2, sizeof raw2, &err), SB_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "exists already"));
    sb_gw_key bad = spec("has space");
    assert_int_equal(sb_gw_keys_create(ks, &bad, raw2, sizeof raw2, &err), SB_ERR_INVALID_ARG);
    bad = spec("");
    assert_int_equal(sb_gw_keys_create(ks, &bad, raw2, sizeof raw2, &err), SB_ERR_INVALID_ARG);
    bad = spec("neg");
    bad.tpm = -1;
    assert_int_equal(sb_gw_keys_create(ks, &bad, raw2, sizeof raw2, &err), SB_ERR_INVALID_ARG);

    /* Only the hash is stored. */
    assert_false(dir_contains(dir, raw));
    assert_false(dir_contains(dir, raw + strlen(SB_GW_KEY_PREFIX)));
    struct stat st;
    char p[500];
    snprintf(p, sizeof p, "%s/%s", dir, SB_GW_KEYS_FILE);
    assert_int_equal(stat(p, &st), 0);
    assert_int_equal(st.st_mode & 077, 0);

    /* Reopened: the secret is the same, so the key still matches. */
    sb_gw_keys_close(ks);
    assert_int_equal(sb_gw_keys_open(dir, false, NULL, NULL, &ks, NULL), SB_OK);
    assert_true(sb_gw_keys_lookup(ks, raw, strlen(raw), &got));
    assert_true(sb_gw_key_allows(&got, "a"));
    assert_true(sb_gw_key_allows(&got, "bb"));
    assert_false(sb_gw_key_allows(&got, "b"));
    assert_false(sb_gw_key_allows(&got, "a,bb"));
    assert_false(sb_gw_key_allows(&got, ""));
    got.models[0] = '\0';
    assert_true(sb_gw_key_allows(&got, "anything"));

    sb_gw_key *list;
    size_t n;
    assert_int_equal(sb_gw_keys_list(ks, &list, &n, NULL), SB_OK);
    assert_int_equal(n, 2);
    assert_string_equal(list[0].name, "alice");
    assert_string_equal(list[0].models, "a,bb");
    sb_free(list);
    sb_gw_keys_close(ks);
}

/* A server's handle (watching) sees the CLI's handle's changes. */
static void test_watch(void **state) {
    (void)state;
    const char *dir = fresh_dir("keys-watch");
    sb_gw_keys *cli = NULL, *srv = NULL;
    assert_int_equal(sb_gw_keys_open(dir, false, NULL, NULL, &cli, NULL), SB_OK);
    assert_int_equal(sb_gw_keys_open(dir, true, NULL, NULL, &srv, NULL), SB_OK);
    char raw[SB_GW_KEY_LEN + 1];
    sb_gw_key k = spec("w");
    assert_int_equal(sb_gw_keys_create(cli, &k, raw, sizeof raw, NULL), SB_OK);
    sb_gw_key got;
    int waited = 0;
    while (!sb_gw_keys_lookup(srv, raw, strlen(raw), &got) && waited < 2000) {
        usleep(10000);
        waited += 10;
    }
    assert_true(waited <= 2 * SB_GW_KEYS_POLL_MS + 100);
    assert_int_equal(sb_gw_keys_set_enabled(cli, "w", false, NULL), SB_OK);
    for (waited = 0; waited < 2000; waited += 10) {
        assert_true(sb_gw_keys_lookup(srv, raw, strlen(raw), &got));
        if (!got.enabled)
            break;
        usleep(10000);
    }
    assert_false(got.enabled);
    assert_int_equal(sb_gw_keys_set_enabled(cli, "w", true, NULL), SB_OK);
    assert_int_equal(sb_gw_keys_delete(cli, "w", NULL), SB_OK);
    sb_error err = {0};
    assert_int_equal(sb_gw_keys_delete(cli, "w", &err), SB_ERR_NOT_FOUND);
    assert_int_equal(sb_gw_keys_set_enabled(cli, "nobody", true, &err), SB_ERR_NOT_FOUND);
    assert_int_equal(sb_gw_keys_refresh(srv, NULL), SB_OK);
    assert_false(sb_gw_keys_lookup(srv, raw, strlen(raw), &got));
    sb_gw_keys_close(srv);
    sb_gw_keys_close(cli);
}

static void test_corrupt(void **state) {
    (void)state;
    const char *dir = fresh_dir("keys-corrupt");
    mkdir(dir, 0700);
    char p[500];
    snprintf(p, sizeof p, "%s/%s", dir, SB_GW_KEYS_FILE);
    FILE *f = fopen(p, "w");
    for (int i = 0; i < 200; i++)
        fputs("this is not a database. ", f);
    fclose(f);
    sb_gw_keys *ks = NULL;
    sb_error err = {0};
    assert_int_equal(sb_gw_keys_open(dir, true, NULL, NULL, &ks, &err), SB_ERR_FORMAT);
    assert_null(ks);
    assert_non_null(strstr(err.msg, p));
}

static void test_expiry(void **state) {
    (void)state;
    int64_t t;
    assert_true(sb_gw_parse_expiry("2030-01-02", 0, &t));
    assert_int_equal(t, 1893542400);
    assert_true(sb_gw_parse_expiry("2030-01-02T03:04:05Z", 0, &t));
    assert_int_equal(t, 1893542400 + 3 * 3600 + 4 * 60 + 5);
    assert_true(sb_gw_parse_expiry("+90s", 1000, &t));
    assert_int_equal(t, 1090);
    assert_true(sb_gw_parse_expiry("+2d", 0, &t));
    assert_int_equal(t, 2 * 86400);
    assert_true(sb_gw_parse_expiry("+3h", 0, &t) && t == 3 * 3600);
    assert_true(sb_gw_parse_expiry("+5m", 0, &t) && t == 300);
    const char *bad[] = {"", "2030", "2030-02-30", "2030-13-01", "2030-01-02T03:04:05", "2030-01-02 03:04:05Z",
                         "2030-01-02x", "+", "+5", "+5y", "+-5s", "+0s", "+5ss", "tomorrow", "1969-12-31"};
    for (size_t i = 0; i < SB_ARRAY_LEN(bad); i++)
        assert_false(sb_gw_parse_expiry(bad[i], 0, &t));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_create_lookup),
        cmocka_unit_test(test_watch),
        cmocka_unit_test(test_corrupt),
        cmocka_unit_test(test_expiry),
    };
    return sb_test_exit(cmocka_run_group_tests(tests, NULL, NULL));
}
