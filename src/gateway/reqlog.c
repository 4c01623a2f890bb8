/*
 * reqlog.c - the size-rotated request log (see reqlog.h).
 */
#include "gateway/reqlog.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/base.h"

struct sb_gw_reqlog {
    pthread_mutex_t mu;
    char *path;
    uint64_t max_bytes;
    int fd;
    uint64_t size; /* of the current file */
    bool failing;  /* the last write failed (reported already) */
};

static sb_status open_file(sb_gw_reqlog *l, sb_error *err) {
    l->fd = open(l->path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    if (l->fd < 0)
        return sb_fail(err, SB_ERR_IO, "request log %s: cannot open: %s", l->path, strerror(errno));
    struct stat st;
    l->size = fstat(l->fd, &st) == 0 ? (uint64_t)st.st_size : 0;
    return SB_OK;
}

sb_status sb_gw_reqlog_open(const char *path, uint64_t max_bytes, sb_gw_reqlog **out, sb_error *err) {
    *out = NULL;
    sb_gw_reqlog *l = sb_calloc(1, sizeof *l);
    if (!l || !(l->path = sb_strndup(path, strlen(path)))) {
        sb_free(l);
        return sb_fail(err, SB_ERR_NOMEM, "request log: out of memory");
    }
    l->max_bytes = max_bytes ? max_bytes : SB_GW_REQLOG_DEFAULT_MAX;
    sb_status st = open_file(l, err);
    if (st != SB_OK) {
        sb_free(l->path);
        sb_free(l);
        return st;
    }
    pthread_mutex_init(&l->mu, NULL);
    *out = l;
    return SB_OK;
}

void sb_gw_reqlog_close(sb_gw_reqlog *l) {
    if (!l)
        return;
    if (l->fd >= 0)
        close(l->fd);
    pthread_mutex_destroy(&l->mu);
    sb_free(l->path);
    sb_free(l);
}

/* FILE.(k-1) -> FILE.k from the oldest down, FILE -> FILE.1, a new FILE. */
static sb_status rotate(sb_gw_reqlog *l, sb_error *err) {
    size_t n = strlen(l->path) + 16;
    char from[4096], to[4096];
    if (n > sizeof from)
        return sb_fail(err, SB_ERR_INVALID_ARG, "request log %s: the path is too long to rotate", l->path);
    for (int k = SB_GW_REQLOG_KEEP; k >= 1; k--) {
        if (k == 1)
            snprintf(from, sizeof from, "%s", l->path);
        else
            snprintf(from, sizeof from, "%s.%d", l->path, k - 1);
        snprintf(to, sizeof to, "%s.%d", l->path, k);
        if (rename(from, to) != 0 && errno != ENOENT)
            return sb_fail(err, SB_ERR_IO, "request log: cannot rename %s to %s: %s", from, to, strerror(errno));
    }
    close(l->fd);
    return open_file(l, err);
}

bool sb_gw_reqlog_write(sb_gw_reqlog *l, const char *line, size_t len, sb_error *err) {
    err->msg[0] = '\0';
    pthread_mutex_lock(&l->mu);
    sb_status st = SB_OK;
    if (l->fd < 0 || (l->size > 0 && l->size + len > l->max_bytes))
        st = l->fd < 0 ? open_file(l, err) : rotate(l, err);
    if (st == SB_OK) {
        ssize_t w = write(l->fd, line, len);
        if (w == (ssize_t)len)
            l->size += len;
        else
            st = sb_fail(err, SB_ERR_IO, "request log %s: cannot write: %s", l->path,
                         w < 0 ? strerror(errno) : "short write");
    }
    bool report = st != SB_OK && !l->failing;
    l->failing = st != SB_OK;
    if (st != SB_OK && !report)
        err->msg[0] = '\0';
    pthread_mutex_unlock(&l->mu);
    return st == SB_OK;
}
