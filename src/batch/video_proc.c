/*
 * video_proc.c - running ffmpeg, ffprobe and captioner commands: posix_spawn
 * with an argv array (never a shell), stdout and stderr read through pipes
 * until the child ends or its time is up, then killed.
 *
 * The stages spawn from several threads at once: every pipe is made
 * close-on-exec, so a child inherits only its own two ends (dup2'd onto 1
 * and 2), and another child holding a copy can never delay the EOF this
 * one's reader waits for.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "base/base.h"
#include "batch/video-impl.h"

extern char **environ;

#define OUTPUT_CAP (1u << 20)

typedef struct sink {
    char *p;
    size_t len, cap;
    bool failed;
} sink;

static void sink_add(sink *s, const char *data, size_t n) {
    if (s->failed || s->len >= OUTPUT_CAP)
        return;
    n = SB_MIN(n, OUTPUT_CAP - s->len);
    if (s->len + n + 1 > s->cap) {
        size_t cap = SB_MAX(s->cap * 2, s->len + n + 1);
        char *q = sb_realloc(s->p, cap);
        if (!q) {
            s->failed = true;
            return;
        }
        s->p = q, s->cap = cap;
    }
    memcpy(s->p + s->len, data, n);
    s->len += n;
    s->p[s->len] = '\0';
}

static char *sink_take(sink *s) {
    if (!s->p)
        s->p = sb_calloc(1, 1);
    return s->p;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

sb_status sb__video_spawn(char *const *argv, double timeout_s, sb_video_proc *out, sb_error *err) {
    memset(out, 0, sizeof *out);
    int pout[2] = {-1, -1}, perr[2] = {-1, -1};
    if (pipe2(pout, O_CLOEXEC) != 0 || pipe2(perr, O_CLOEXEC) != 0) {
        int e = errno;
        for (int i = 0; i < 2; i++) {
            if (pout[i] >= 0)
                close(pout[i]);
            if (perr[i] >= 0)
                close(perr[i]);
        }
        return sb_fail(err, SB_ERR_IO, "cannot run %s: pipe: %s", argv[0], strerror(e));
    }
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_adddup2(&fa, pout[1], 1);
    posix_spawn_file_actions_adddup2(&fa, perr[1], 2);
    /* The child starts with default signal handling and an empty mask,
     * whatever the calling thread blocks. */
    posix_spawnattr_t attr;
    posix_spawnattr_init(&attr);
    sigset_t none, all;
    sigemptyset(&none);
    sigfillset(&all);
    posix_spawnattr_setsigmask(&attr, &none);
    posix_spawnattr_setsigdefault(&attr, &all);
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
    pid_t pid;
    int rc = posix_spawnp(&pid, argv[0], &fa, &attr, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    posix_spawnattr_destroy(&attr);
    close(pout[1]);
    close(perr[1]);
    if (rc != 0) {
        close(pout[0]);
        close(perr[0]);
        return sb_fail(err, rc == ENOENT ? SB_ERR_NOT_FOUND : SB_ERR_IO, "cannot run '%s': %s", argv[0],
                       strerror(rc));
    }
    sink so = {0}, se = {0};
    struct pollfd fds[2] = {{.fd = pout[0], .events = POLLIN}, {.fd = perr[0], .events = POLLIN}};
    const double deadline = now_s() + timeout_s;
    int open_fds = 2;
    while (open_fds > 0) {
        double left = deadline - now_s();
        if (left <= 0) {
            out->timed_out = true;
            kill(pid, SIGKILL);
            break;
        }
        int n = poll(fds, 2, (int)SB_MIN(left * 1e3 + 1, 1000.0));
        if (n < 0 && errno != EINTR)
            break;
        for (int i = 0; i < 2 && n > 0; i++) {
            if (fds[i].fd < 0 || !(fds[i].revents & (POLLIN | POLLHUP | POLLERR)))
                continue;
            char buf[65536];
            ssize_t r = read(fds[i].fd, buf, sizeof buf);
            if (r > 0) {
                sink_add(i == 0 ? &so : &se, buf, (size_t)r);
            } else if (r == 0 || errno != EINTR) {
                close(fds[i].fd);
                fds[i].fd = -1;
                open_fds--;
            }
        }
    }
    for (int i = 0; i < 2; i++)
        if (fds[i].fd >= 0)
            close(fds[i].fd);
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
        ;
    out->exited = WIFEXITED(status) && !out->timed_out;
    out->status = WIFEXITED(status) ? WEXITSTATUS(status) : WIFSIGNALED(status) ? 128 + WTERMSIG(status) : -1;
    out->out = sink_take(&so);
    out->errout = sink_take(&se);
    if (!out->out || !out->errout || so.failed || se.failed) {
        sb__video_proc_free(out);
        return sb_fail(err, SB_ERR_NOMEM, "out of memory reading the output of %s", argv[0]);
    }
    return SB_OK;
}

void sb__video_proc_free(sb_video_proc *p) {
    sb_free(p->out);
    sb_free(p->errout);
    p->out = p->errout = NULL;
}

void sb__video_last_line(const char *text, char *out, size_t cap) {
    const char *end = text + strlen(text);
    while (end > text && (end[-1] == '\n' || end[-1] == '\r' || end[-1] == ' '))
        end--;
    const char *start = end;
    while (start > text && start[-1] != '\n')
        start--;
    size_t n = SB_MIN((size_t)(end - start), cap - 1);
    memcpy(out, start, n);
    out[n] = '\0';
}
