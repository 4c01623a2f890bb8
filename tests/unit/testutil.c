/*
 * testutil.c - see testutil.h.
 */
#define _XOPEN_SOURCE 700 /* nftw */
#include "testutil.h"

#include <errno.h>
#include <ftw.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "switchboard.h"

const char *sb_test_fixture(const char *relpath) {
    static char path[4096];
    const char *dir = getenv("SB_SHARED_DIR");
#ifdef SB_SHARED_DIR
    if (!dir)
        dir = SB_SHARED_DIR;
#endif
    if (!dir)
        dir = "../shared";
    snprintf(path, sizeof(path), "%s/%s", dir, relpath);
    if (access(path, R_OK) != 0)
        fail_msg("fixture missing: %s (set SB_SHARED_DIR to the shared/ folder)", path);
    return path;
}

char *sb_test_read_file(const char *path, size_t *size) {
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    if (buf) {
        buf[n] = '\0';
        if (size)
            *size = (size_t)n;
    }
    return buf;
}

/* Each block carries its size in a header so free can account for it. */
typedef struct {
    size_t size;
    size_t pad; /* keeps the payload 16-byte aligned */
} alloc_header;

static size_t live_bytes, peak_bytes;

static void *count_malloc(size_t size, void *user) {
    (void)user;
    alloc_header *h = malloc(sizeof(*h) + size);
    if (!h)
        return NULL;
    h->size = size;
    live_bytes += size;
    if (live_bytes > peak_bytes)
        peak_bytes = live_bytes;
    return h + 1;
}

static void count_free(void *ptr, void *user) {
    (void)user;
    if (!ptr)
        return;
    alloc_header *h = (alloc_header *)ptr - 1;
    live_bytes -= h->size;
    free(h);
}

static void *count_realloc(void *ptr, size_t size, void *user) {
    if (!ptr)
        return count_malloc(size, user);
    alloc_header *old = (alloc_header *)ptr - 1;
    size_t old_size = old->size;
    alloc_header *h = realloc(old, sizeof(*h) + size);
    if (!h)
        return NULL;
    h->size = size;
    live_bytes = live_bytes - old_size + size;
    if (live_bytes > peak_bytes)
        peak_bytes = live_bytes;
    return h + 1;
}

void sb_test_count_allocs_begin(void) {
    live_bytes = peak_bytes = 0;
    sb_allocator a = {count_malloc, count_realloc, count_free, NULL};
    sb_set_allocator(&a);
}

size_t sb_test_count_allocs_end(void) {
    sb_set_allocator(NULL);
    return peak_bytes;
}

size_t sb_test_live_bytes(void) { return live_bytes; }

static int n_skipped;

void sb_test_note_skip(const char *test, const char *why) {
    n_skipped++;
    fprintf(stderr, "SKIPPED: %s: %s\n", test, why);
}

int sb_test_exit(int failures) { return failures ? failures : n_skipped ? SB_TEST_SKIPPED : 0; }

static char tmpdir_path[64];
static pid_t tmpdir_owner;

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
    (void)st, (void)flag, (void)ftw;
    return remove(path) != 0 ? -1 : 0;
}

/* At exit of the process that made it (not of a forked child): the test's
 * files go with it, a few hundred MB of generated models for some. */
static void remove_tmpdir(void) {
    if (tmpdir_path[0] && getpid() == tmpdir_owner)
        nftw(tmpdir_path, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
}

const char *sb_test_tmpdir(void) {
    if (!tmpdir_path[0]) {
        snprintf(tmpdir_path, sizeof(tmpdir_path), "/tmp/sb-test-XXXXXX");
        if (!mkdtemp(tmpdir_path))
            fail_msg("cannot create a temporary directory in /tmp: %s", strerror(errno));
        tmpdir_owner = getpid();
        atexit(remove_tmpdir);
    }
    return tmpdir_path;
}

int sb_test_run_cli(const char *const *args, char **out, char **err) {
    const char *bin = getenv("SB_BIN");
    if (!bin)
        fail_msg("SB_BIN is not set: run this test through ctest");
    char out_path[300], err_path[300];
    snprintf(out_path, sizeof(out_path), "%s/cli.out", sb_test_tmpdir());
    snprintf(err_path, sizeof(err_path), "%s/cli.err", sb_test_tmpdir());
    const char *argv[64] = {bin};
    size_t n = 1;
    for (; args[n - 1] && n < 63; n++)
        argv[n] = args[n - 1];
    argv[n] = NULL;
    pid_t pid = fork();
    if (pid == 0) {
        freopen(out_path, "w", stdout);
        freopen(err_path, "w", stderr);
        execv(bin, (char *const *)argv);
        _exit(127);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    *out = sb_test_read_file(out_path, NULL);
    *err = sb_test_read_file(err_path, NULL);
    if (!*out)
        *out = calloc(1, 1);
    if (!*err)
        *err = calloc(1, 1);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}
