/*
 * door.c - the server's front door: the listening socket, and every new
 * connection until its first request head has fully arrived and passed the
 * checks libmicrohttpd would otherwise answer with HTML of its own.
 *
 * One thread polls the listening socket and all connections still sending
 * their head, so a thousand clients trickling a byte a second cost a poll
 * entry each, not a thread each, and are closed when --header-timeout runs
 * out. Heads are read with MSG_PEEK (SO_RCVLOWAT wakes the thread only when
 * more bytes than already seen are in), so a complete head is still unread
 * when the connection is handed to libmicrohttpd (MHD_add_connection), which
 * then serves it with a thread per connection. Refusals are OpenAI-style
 * JSON: 400 (malformed head, conflicting Content-Length), 408 (too slow),
 * 414 (URL too long), 431 (headers too large), 505 (HTTP version), 503 (past
 * --max-connections). A refused connection is read out briefly after the
 * answer so that closing it does not reset the answer away.
 *
 * Requests after the first on a kept-alive connection are libmicrohttpd's
 * alone; under load (half the connection cap in use) every answer closes
 * its connection, so each new request comes through here.
 */
#define _GNU_SOURCE /* accept4, pipe2, memmem, POLLRDHUP */
#include <errno.h>
#include <arpa/inet.h>
#include <fcntl.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <microhttpd.h>

#include "base/base.h"
#include "server/door.h"
#include "server/openai.h"
#include "server/server-impl.h"

#define HEAD_MAX (32 * 1024) /* request line and headers */
#define URL_MAX 8192
#define DRAIN_S 2.0          /* how long a refused connection is read out */

typedef struct guest {
    int fd;
    bool refused;    /* answered; reading out until EOF or the deadline */
    int lowat;       /* SO_RCVLOWAT set: wake when more than this many bytes are in */
    double deadline;
    struct sockaddr_storage addr;
    socklen_t addrlen;
} guest;

struct sb_srv_door {
    sb_srv *srv;
    struct MHD_Daemon *daemon;
    int listen_fd, wake[2];
    uint16_t port;
    pthread_t thread;
    bool running;
    atomic_bool stop;
    atomic_int active; /* connections libmicrohttpd holds */
    guest *guests;     /* connections at the door */
    size_t n_guests, cap;
    char *peek;        /* HEAD_MAX + 1 bytes */
};

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

sb_status sb_srv_door_open(sb_srv *srv, const struct sockaddr *addr, socklen_t len, sb_srv_door **out, sb_error *err) {
    *out = NULL;
    sb_srv_door *d = sb_calloc(1, sizeof *d);
    if (!d || !(d->peek = sb_malloc(HEAD_MAX + 1))) {
        sb_free(d);
        return sb_fail(err, SB_ERR_NOMEM, "server: out of memory");
    }
    d->srv = srv;
    d->wake[0] = d->wake[1] = -1;
    atomic_init(&d->stop, false);
    atomic_init(&d->active, 0);
    int one = 1;
    d->listen_fd = socket(addr->sa_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (d->listen_fd < 0 || setsockopt(d->listen_fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0 ||
        bind(d->listen_fd, addr, len) != 0 || listen(d->listen_fd, 4096) != 0 || pipe2(d->wake, O_CLOEXEC | O_NONBLOCK) != 0) {
        int e = errno;
        sb_srv_door_free(d);
        return sb_fail(err, SB_ERR_IO, "server: cannot listen on %s:%u: %s", srv->p.host, (unsigned)srv->p.port,
                       strerror(e));
    }
    struct sockaddr_storage bound;
    socklen_t blen = sizeof bound;
    getsockname(d->listen_fd, (struct sockaddr *)&bound, &blen);
    d->port = ntohs(bound.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&bound)->sin6_port
                                                : ((struct sockaddr_in *)&bound)->sin_port);
    *out = d;
    return SB_OK;
}

uint16_t sb_srv_door_port(const sb_srv_door *d) { return d->port; }

bool sb_srv_door_busy(const sb_srv_door *d) {
    return d && (unsigned)atomic_load(&d->active) >= (d->srv->p.max_connections + 1) / 2;
}

void sb_srv_door_on_connection(void *cls, struct MHD_Connection *conn, void **socket_context,
                               enum MHD_ConnectionNotificationCode toe) {
    sb_srv_door *d = cls;
    atomic_fetch_add(&d->active, toe == MHD_CONNECTION_NOTIFY_STARTED ? 1 : -1);
}

/* ---- answers -------------------------------------------------------------- */

static void set_lowat(guest *g, int n) {
    if (g->lowat != n && setsockopt(g->fd, SOL_SOCKET, SO_RCVLOWAT, &n, sizeof n) == 0)
        g->lowat = n;
}

/* Answers g with an error (the connection closes) and starts reading it out. */
static void refuse(sb_srv_door *d, guest *g, unsigned status, const char *code, const char *fmt, ...) SB_PRINTF(5, 6);
static void refuse(sb_srv_door *d, guest *g, unsigned status, const char *code, const char *fmt, ...) {
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    sb_oai_err e;
    sb_oai_err_set(&e, status, status >= 500 ? "server_error" : "invalid_request_error", code, NULL, "%s", msg);
    sb_srv_buf body = {0};
    sb_oai_err_json(&e, &body);
    char head[256];
    int n = snprintf(head, sizeof head,
                     "HTTP/1.1 %u %s\r\nContent-Type: application/json\r\nContent-Length: %zu\r\nConnection: close\r\n%s\r\n",
                     status, MHD_get_reason_phrase_for(status), body.len, status == 503 ? "Retry-After: 1\r\n" : "");
    /* Small enough for any socket buffer: one non-blocking send each. */
    if (send(g->fd, head, (size_t)n, MSG_NOSIGNAL) == n && !body.failed)
        send(g->fd, body.p, body.len, MSG_NOSIGNAL);
    sb_srv_buf_free(&body);
    shutdown(g->fd, SHUT_WR);
    /* What was only peeked at is read now: closing with unread bytes would reset the answer away. */
    while (recv(g->fd, d->peek, HEAD_MAX, 0) > 0) {
    }
    sb_srv_metrics_request(&d->srv->metrics, SB_SRV_EP_OTHER, status);
    sb__srv_log(d->srv, "http: refused a connection: %u %s", status, msg);
    g->refused = true;
    g->deadline = now_s() + DRAIN_S;
    set_lowat(g, 1);
}

/* ---- the head -------------------------------------------------------------- */

static bool is_tchar(unsigned char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || strchr("!#$%&'*+-.^_`|~", c);
}

/* Checks a complete head (ending in CRLF CRLF) and answers it if it is bad;
 * true when it may go on to libmicrohttpd. */
static bool check_head(sb_srv_door *d, guest *g, const char *h, size_t n) {
    const char *eol = memchr(h, '\r', n), *end = h + n;
    const char *sp1 = memchr(h, ' ', (size_t)(eol - h));
    const char *sp2 = sp1 ? memchr(sp1 + 1, ' ', (size_t)(eol - sp1 - 1)) : NULL;
    if (!sp1 || !sp2 || sp1 == h || sp2 == sp1 + 1 || eol[1] != '\n') {
        refuse(d, g, 400, "invalid_request", "the request line is not 'METHOD TARGET HTTP/1.x'");
        return false;
    }
    for (const char *p = h; p < sp1; p++)
        if (!is_tchar((unsigned char)*p)) {
            refuse(d, g, 400, "invalid_request", "the request method has a character not allowed in it");
            return false;
        }
    for (const char *p = sp1 + 1; p < sp2; p++)
        if ((unsigned char)*p <= ' ' || *p == 0x7f) {
            refuse(d, g, 400, "invalid_request", "the request target has a control character or space in it");
            return false;
        }
    size_t vlen = (size_t)(eol - sp2 - 1);
    if (vlen != 8 || memcmp(sp2 + 1, "HTTP/1.", 7) != 0 || (sp2[8] != '0' && sp2[8] != '1')) {
        bool http = vlen >= 5 && memcmp(sp2 + 1, "HTTP/", 5) == 0;
        refuse(d, g, http ? 505 : 400, http ? "http_version_not_supported" : "invalid_request",
               http ? "this server speaks HTTP/1.0 and HTTP/1.1" : "the request line does not end in an HTTP version");
        return false;
    }
    bool http11 = sp2[8] == '1', host = false, chunked = false;
    const char *cl = NULL;
    size_t cl_len = 0;
    for (const char *line = eol + 2; line < end - 2;) {
        const char *le = memchr(line, '\r', (size_t)(end - line));
        const char *colon = memchr(line, ':', (size_t)(le - line));
        if (le[1] != '\n' || !colon || colon == line) {
            refuse(d, g, 400, "invalid_request", "a header line is not 'Name: value'");
            return false;
        }
        for (const char *p = line; p < colon; p++)
            if (!is_tchar((unsigned char)*p)) {
                refuse(d, g, 400, "invalid_request", "a header name has a character not allowed in it");
                return false;
            }
        const char *v = colon + 1, *ve = le;
        for (const char *p = v; p < ve; p++)
            if ((unsigned char)*p < ' ' && *p != '\t') {
                refuse(d, g, 400, "invalid_request", "a header value has a control character in it");
                return false;
            }
        while (v < ve && (*v == ' ' || *v == '\t'))
            v++;
        while (ve > v && (ve[-1] == ' ' || ve[-1] == '\t'))
            ve--;
        size_t name_len = (size_t)(colon - line);
        if (name_len == 4 && strncasecmp(line, "host", 4) == 0)
            host = true;
        if (name_len == 17 && strncasecmp(line, "transfer-encoding", 17) == 0)
            chunked = true;
        if (name_len == 14 && strncasecmp(line, "content-length", 14) == 0) {
            size_t k = 0;
            while (k < (size_t)(ve - v) && v[k] >= '0' && v[k] <= '9')
                k++;
            if (k == 0 || k != (size_t)(ve - v) || k > 19) {
                refuse(d, g, 400, "invalid_request", "the Content-Length header is not a number of bytes");
                return false;
            }
            if (cl && (cl_len != k || memcmp(cl, v, k) != 0)) {
                refuse(d, g, 400, "invalid_request", "the request has two different Content-Length headers");
                return false;
            }
            cl = v;
            cl_len = k;
        }
        line = le + 2;
    }
    if (cl && chunked) {
        refuse(d, g, 400, "invalid_request", "the request has both Content-Length and Transfer-Encoding");
        return false;
    }
    if (http11 && !host) {
        refuse(d, g, 400, "invalid_request", "an HTTP/1.1 request needs a Host header");
        return false;
    }
    return true;
}

/* More bytes arrived for g: hand it over, refuse it or keep waiting. Returns
 * false when g left the door (handed over or closed). */
static bool on_readable(sb_srv_door *d, guest *g, short revents) {
    if (g->refused) {
        ssize_t r = recv(g->fd, d->peek, HEAD_MAX, 0);
        return r > 0 || (r < 0 && (errno == EAGAIN || errno == EINTR));
    }
    ssize_t n = recv(g->fd, d->peek, HEAD_MAX + 1, MSG_PEEK);
    if (n < 0)
        return errno == EAGAIN || errno == EINTR;
    if (n == 0)
        return false;
    const char *h = d->peek;
    const char *eol = memchr(h, '\n', (size_t)n);
    if ((eol ? (size_t)(eol - h) : (size_t)n) > URL_MAX + 64) {
        refuse(d, g, 414, "url_too_long", "the request line is longer than %d bytes", URL_MAX);
        return true;
    }
    char *term = memmem(h, (size_t)n, "\r\n\r\n", 4);
    if (!term) {
        if (n > HEAD_MAX)
            refuse(d, g, 431, "headers_too_large", "the request headers are larger than %d bytes", HEAD_MAX);
        else if (revents & (POLLRDHUP | POLLHUP))
            return false; /* the client stopped sending before its head was complete */
        else
            set_lowat(g, (int)n + 1);
        return true;
    }
    if (!check_head(d, g, h, (size_t)(term - h) + 4))
        return true;
    int one = 1;
    setsockopt(g->fd, SOL_SOCKET, SO_RCVLOWAT, &one, sizeof one);
    MHD_add_connection(d->daemon, g->fd, (struct sockaddr *)&g->addr, g->addrlen); /* closes it on failure */
    g->fd = -1;
    return false;
}

static void on_accept(sb_srv_door *d) {
    for (;;) {
        guest g = {.addrlen = sizeof g.addr, .lowat = 1};
        g.fd = accept4(d->listen_fd, (struct sockaddr *)&g.addr, &g.addrlen, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (g.fd < 0)
            return; /* EAGAIN, or out of descriptors: the backlog waits */
        if (d->n_guests == d->cap) {
            size_t cap = d->cap ? 2 * d->cap : 64;
            guest *gs = sb_realloc(d->guests, cap * sizeof *gs);
            if (!gs) {
                close(g.fd);
                return;
            }
            d->guests = gs;
            d->cap = cap;
        }
        /* The idle timeout bounds a silent head too. */
        g.deadline = now_s() + SB_MIN(d->srv->p.header_timeout_s, d->srv->p.timeout_s);
        guest *ng = &d->guests[d->n_guests++];
        *ng = g;
        if ((size_t)atomic_load(&d->active) + d->n_guests > d->srv->p.max_connections)
            refuse(d, ng, 503, "too_many_connections",
                   "the server has %u connections open (--max-connections); retry shortly", d->srv->p.max_connections);
    }
}

static void *door_main(void *arg) {
    sb_srv_door *d = arg;
    struct pollfd *pfds = NULL;
    size_t pcap = 0;
    while (!atomic_load(&d->stop)) {
        if (pcap < d->n_guests + 2) {
            pcap = d->n_guests + 64;
            struct pollfd *p = sb_realloc(pfds, pcap * sizeof *p);
            if (!p)
                break;
            pfds = p;
        }
        pfds[0] = (struct pollfd){.fd = d->wake[0], .events = POLLIN};
        /* Past the cap, new connections wait in the backlog until some close. */
        bool full = d->n_guests >= (size_t)d->srv->p.max_connections + 64;
        pfds[1] = (struct pollfd){.fd = full ? -1 : d->listen_fd, .events = POLLIN};
        double now = now_s(), next = now + 1.0;
        for (size_t i = 0; i < d->n_guests; i++) {
            pfds[i + 2] = (struct pollfd){.fd = d->guests[i].fd, .events = POLLIN | POLLRDHUP};
            next = SB_MIN(next, d->guests[i].deadline);
        }
        int timeout_ms = next > now ? (int)((next - now) * 1000) + 1 : 0;
        if (poll(pfds, d->n_guests + 2, timeout_ms) < 0 && errno != EINTR)
            break;
        now = now_s();
        size_t kept = 0, n = d->n_guests;
        for (size_t i = 0; i < n; i++) {
            guest *g = &d->guests[i];
            bool stay = true;
            if (pfds[i + 2].revents)
                stay = on_readable(d, g, pfds[i + 2].revents);
            if (stay && now >= g->deadline) {
                if (g->refused)
                    stay = false;
                else
                    refuse(d, g, 408, "request_timeout", "the request head did not arrive within %u s (--header-timeout)",
                           SB_MIN(d->srv->p.header_timeout_s, d->srv->p.timeout_s));
            }
            if (!stay && g->fd >= 0)
                close(g->fd);
            if (stay)
                d->guests[kept++] = *g;
        }
        d->n_guests = kept;
        if (pfds[1].revents)
            on_accept(d);
    }
    sb_free(pfds);
    return NULL;
}

sb_status sb_srv_door_run(sb_srv_door *d, struct MHD_Daemon *daemon, sb_error *err) {
    d->daemon = daemon;
    if (pthread_create(&d->thread, NULL, door_main, d) != 0)
        return sb_fail(err, SB_ERR_IO, "server: cannot start the accepting thread");
    d->running = true;
    return SB_OK;
}

void sb_srv_door_stop(sb_srv_door *d) {
    if (!d)
        return;
    if (d->running) {
        atomic_store(&d->stop, true);
        ssize_t w = write(d->wake[1], "x", 1);
        (void)w;
        pthread_join(d->thread, NULL);
        d->running = false;
    }
    for (size_t i = 0; i < d->n_guests; i++)
        close(d->guests[i].fd);
    d->n_guests = 0;
    for (int i = 0; i < 2; i++)
        if (d->wake[i] >= 0)
            close(d->wake[i]);
    d->wake[0] = d->wake[1] = -1;
    if (d->listen_fd >= 0)
        close(d->listen_fd);
    d->listen_fd = -1;
}

void sb_srv_door_free(sb_srv_door *d) {
    if (!d)
        return;
    sb_srv_door_stop(d);
    sb_free(d->guests);
    sb_free(d->peek);
    sb_free(d);
}
