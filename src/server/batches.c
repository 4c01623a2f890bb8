/*
 * batches.c - /v1/files and /v1/batches, and the worker that runs batches
 * (see batches.h).
 *
 * Uploads are multipart/form-data (as the OpenAI SDKs send them), parsed as
 * they stream in by libmicrohttpd's post processor: the "file" part goes
 * straight to a temporary file under STATE_DIR/files/, so a large upload
 * never sits in memory, and the whole body is bounded by --max-file-bytes
 * (413 past it). The file becomes a File object once it checks as JSONL.
 *
 * A batch is created with its request rows (runner.h's sb_batch_prepare)
 * in status "validating" and handed to the worker, one batch at a time,
 * oldest first: in_progress while the runner executes its rows,
 * finalizing while the output file (the lines that succeeded) and the
 * error file (the rest, as OpenAI splits them) are written, then
 * completed. Cancelling stops taking rows; what was recorded is still
 * written out. Output file ids derive from the batch id, so finalizing
 * again after a crash replaces rather than duplicates them.
 *
 * Ownership: each file and batch records the caller's key (caller.key, ""
 * when keys are off); a key sees and touches only its own, and anything
 * else is a 404, as if it did not exist.
 */
#include "server/batches.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "base/base.h"
#include "batch/files.h"
#include "batch/input.h"
#include "batch/jobs.h"
#include "batch/runner.h"
#include "server/inproc.h"

#define WINDOW_S (24 * 3600) /* completion_window "24h", the only one OpenAI offers */
#define DEFAULT_PARALLEL 8

typedef struct sb_srv_batches {
    sb_srv *srv;
    sb_batch_store *store;
    pthread_t thread;
    bool started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool wake;                         /* work may be waiting (under mu) */
    char current[SB_BATCH_ID_MAX];     /* the batch the worker runs (under mu) */
    atomic_bool stop;                  /* the server is stopping */
    atomic_bool interrupt;             /* the running batch takes no more rows (stop, or its cancel) */
} sb_srv_batches;

static int64_t now_unix(void) { return (int64_t)time(NULL); }

/* ---- who asks ---------------------------------------------------------- */

/* The caller of an HTTP request, as the gateway authenticated it: its key
 * name owns the files and batches it makes ("" anonymous, auth off). */
static void caller_of(const sb_srv_http *q, sb_gw_caller *out) { *out = *sb__srv_http_caller(q); }

/* ---- answers ------------------------------------------------------------ */

static enum MHD_Result respond_cjson(sb_srv *srv, struct MHD_Connection *conn, sb_srv_http *q, const char *url,
                                     unsigned status, cJSON *o) {
    char *text = o ? cJSON_PrintUnformatted(o) : NULL;
    cJSON_Delete(o);
    if (!text)
        return MHD_NO;
    sb_srv_buf b = {0};
    sb_srv_buf_puts(&b, text);
    cJSON_free(text);
    enum MHD_Result r = sb__srv_respond_json(srv, conn, q, url, status, &b);
    sb_srv_buf_free(&b);
    return r;
}

static enum MHD_Result respond_fail(sb_srv *srv, struct MHD_Connection *conn, sb_srv_http *q, const char *url,
                                    unsigned status, const char *code, const char *param, const char *fmt, ...)
    SB_PRINTF(8, 9);

static enum MHD_Result respond_fail(sb_srv *srv, struct MHD_Connection *conn, sb_srv_http *q, const char *url,
                                    unsigned status, const char *code, const char *param, const char *fmt, ...) {
    char msg[500];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    sb_oai_err e;
    sb_oai_err_set(&e, status, status >= 500 ? "server_error" : "invalid_request_error", code, param, "%s", msg);
    return sb__srv_respond_error(srv, conn, q, url, &e);
}

/* A store failure as an answer: 404 for what is not there (or not the caller's). */
static enum MHD_Result respond_status(sb_srv *srv, struct MHD_Connection *conn, sb_srv_http *q, const char *url,
                                      sb_status st, const sb_error *err) {
    if (st == SB_ERR_NOT_FOUND)
        return respond_fail(srv, conn, q, url, MHD_HTTP_NOT_FOUND, "not_found", NULL, "%s", err->msg);
    return respond_fail(srv, conn, q, url, MHD_HTTP_INTERNAL_SERVER_ERROR, NULL, NULL, "%s", err->msg);
}

/* The state is there and the server ready; otherwise answers why not. */
static bool usable(sb_srv *srv, struct MHD_Connection *conn, sb_srv_http *q, const char *url, enum MHD_Result *r) {
    if (!atomic_load(&srv->ready)) {
        *r = sb__srv_respond_not_ready(srv, conn, q, url);
        return false;
    }
    if (!srv->batches) {
        *r = respond_fail(srv, conn, q, url, MHD_HTTP_NOT_FOUND, "unknown_url", NULL,
                          "%s needs a state directory: start the server with --state-dir DIR", url);
        return false;
    }
    return true;
}

/* ?limit= within [1, max] (default def), or false after answering 400. */
static bool query_limit(sb_srv *srv, struct MHD_Connection *conn, sb_srv_http *q, const char *url, int32_t def,
                        int32_t max, int32_t *out, enum MHD_Result *r) {
    const char *v = MHD_lookup_connection_value(conn, MHD_GET_ARGUMENT_KIND, "limit");
    *out = def;
    if (!v)
        return true;
    char *end;
    long n = strtol(v, &end, 10);
    if (*v && !*end && n >= 1 && n <= max) {
        *out = (int32_t)n;
        return true;
    }
    *r = respond_fail(srv, conn, q, url, MHD_HTTP_BAD_REQUEST, "invalid_value", "limit",
                      "limit must be an integer from 1 to %d", (int)max);
    return false;
}

static void add_time(cJSON *o, const char *name, int64_t t) {
    if (t)
        cJSON_AddNumberToObject(o, name, (double)t);
    else
        cJSON_AddNullToObject(o, name);
}

static void add_id(cJSON *o, const char *name, const char *id) {
    if (id && *id)
        cJSON_AddStringToObject(o, name, id);
    else
        cJSON_AddNullToObject(o, name);
}

static cJSON *file_json(const sb_batch_file *f) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", f->id);
    cJSON_AddStringToObject(o, "object", "file");
    cJSON_AddNumberToObject(o, "bytes", (double)f->bytes);
    cJSON_AddNumberToObject(o, "created_at", (double)f->created_at);
    cJSON_AddStringToObject(o, "filename", f->filename);
    cJSON_AddStringToObject(o, "purpose", f->purpose);
    cJSON_AddStringToObject(o, "status", "processed");
    cJSON_AddNullToObject(o, "status_details");
    return o;
}

static cJSON *batch_json(const sb_batch_job *j) {
    static const char *const at_names[SB_BATCH_N_STATUS] = {
        [SB_BATCH_VALIDATING] = "created_at",     [SB_BATCH_IN_PROGRESS] = "in_progress_at",
        [SB_BATCH_FINALIZING] = "finalizing_at",  [SB_BATCH_COMPLETED] = "completed_at",
        [SB_BATCH_FAILED] = "failed_at",          [SB_BATCH_EXPIRED] = "expired_at",
        [SB_BATCH_CANCELLING] = "cancelling_at",  [SB_BATCH_CANCELLED] = "cancelled_at",
    };
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", j->id);
    cJSON_AddStringToObject(o, "object", "batch");
    cJSON_AddStringToObject(o, "endpoint", j->endpoint);
    if (j->errors) {
        cJSON *errors = cJSON_AddObjectToObject(o, "errors");
        cJSON_AddStringToObject(errors, "object", "list");
        cJSON *e = cJSON_CreateObject();
        cJSON_AddStringToObject(e, "code", "batch_failed");
        cJSON_AddStringToObject(e, "message", j->errors);
        cJSON_AddNullToObject(e, "param");
        cJSON_AddNullToObject(e, "line");
        cJSON_AddItemToArray(cJSON_AddArrayToObject(errors, "data"), e);
    } else {
        cJSON_AddNullToObject(o, "errors");
    }
    cJSON_AddStringToObject(o, "input_file_id", j->input_file_id);
    cJSON_AddStringToObject(o, "completion_window", j->completion_window);
    cJSON_AddStringToObject(o, "status", sb_batch_status_name(j->status));
    add_id(o, "output_file_id", j->output_file_id);
    add_id(o, "error_file_id", j->error_file_id);
    for (int i = 0; i < SB_BATCH_N_STATUS; i++)
        add_time(o, at_names[i], j->at[i]);
    add_time(o, "expires_at", j->expires_at);
    cJSON *counts = cJSON_AddObjectToObject(o, "request_counts");
    cJSON_AddNumberToObject(counts, "total", (double)j->total);
    cJSON_AddNumberToObject(counts, "completed", (double)j->completed);
    cJSON_AddNumberToObject(counts, "failed", (double)j->failed);
    cJSON *meta = j->metadata ? cJSON_Parse(j->metadata) : NULL;
    if (meta)
        cJSON_AddItemToObject(o, "metadata", meta);
    else
        cJSON_AddNullToObject(o, "metadata");
    return o;
}

/* {"object": "list", "data": [...], "first_id", "last_id", "has_more"}; takes data. */
static cJSON *list_json(cJSON *data, bool has_more) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "object", "list");
    int n = cJSON_GetArraySize(data);
    cJSON_AddItemToObject(o, "data", data);
    cJSON *first = cJSON_GetArrayItem(data, 0), *last = cJSON_GetArrayItem(data, n - 1);
    add_id(o, "first_id", first ? cJSON_GetStringValue(cJSON_GetObjectItem(first, "id")) : NULL);
    add_id(o, "last_id", last ? cJSON_GetStringValue(cJSON_GetObjectItem(last, "id")) : NULL);
    cJSON_AddBoolToObject(o, "has_more", has_more);
    return o;
}

/* "/v1/files/ID" or "/v1/files/ID/SUFFIX": ID into id (false if malformed); *rest the suffix or "". */
static bool path_id(const char *url, const char *prefix, char *id, size_t cap, const char **rest) {
    const char *p = url + strlen(prefix);
    const char *slash = strchr(p, '/');
    size_t n = slash ? (size_t)(slash - p) : strlen(p);
    *rest = slash ? slash + 1 : "";
    if (n == 0 || n >= cap)
        return false;
    memcpy(id, p, n);
    id[n] = '\0';
    return true;
}

static void random_id(sb_srv *srv, const char *prefix, char *out, size_t cap) {
    snprintf(out, cap, "%s%016llx%08llx", prefix, (unsigned long long)sb__srv_random(srv),
             (unsigned long long)(sb__srv_random(srv) & 0xffffffffu));
}

/* ---- uploads ------------------------------------------------------------- */

typedef struct upload {
    sb_srv *srv;
    struct MHD_PostProcessor *pp;
    char tmp[1024]; /* the file part's temporary file ("" until it starts) */
    int fd;
    int64_t bytes;
    char filename[256];
    char purpose[64];
    size_t purpose_len;
    int files;      /* "file" parts seen */
    char why[700];  /* the first problem; "" none */
} upload;

static void upload_free(void *p) {
    upload *u = p;
    if (u->pp)
        MHD_destroy_post_processor(u->pp);
    if (u->fd >= 0)
        close(u->fd);
    if (u->tmp[0])
        unlink(u->tmp); /* still there: the upload did not become a file */
    sb_free(u);
}

static enum MHD_Result on_part(void *cls, enum MHD_ValueKind kind, const char *key, const char *filename,
                               const char *content_type, const char *transfer_encoding, const char *data,
                               uint64_t off, size_t size) {
    upload *u = cls;
    if (u->why[0])
        return MHD_YES; /* already refused: let the rest stream by */
    if (key && strcmp(key, "purpose") == 0) {
        if (u->purpose_len + size >= sizeof u->purpose) {
            snprintf(u->why, sizeof u->why, "purpose is too long");
            return MHD_YES;
        }
        memcpy(u->purpose + u->purpose_len, data, size);
        u->purpose_len += size;
        u->purpose[u->purpose_len] = '\0';
        return MHD_YES;
    }
    if (!key || strcmp(key, "file") != 0)
        return MHD_YES; /* other fields are ignored, as OpenAI does */
    if (off == 0 && (u->fd < 0 || u->bytes > 0)) { /* a file part begins */
        if (++u->files > 1) {
            snprintf(u->why, sizeof u->why, "the upload has more than one file part; send one");
            return MHD_YES;
        }
        snprintf(u->filename, sizeof u->filename, "%s", filename && *filename ? filename : "upload.jsonl");
        char name[64];
        random_id(u->srv, "upload-", name, sizeof name);
        strcat(name, ".tmp");
        sb_error err;
        if (sb_batch_file_path(u->srv->p.state_dir, name, u->tmp, sizeof u->tmp, &err) != SB_OK ||
            (u->fd = open(u->tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600)) < 0) {
            snprintf(u->why, sizeof u->why, "cannot store the upload: %s", u->tmp[0] ? strerror(errno) : err.msg);
            u->tmp[0] = '\0';
            return MHD_NO;
        }
    }
    for (size_t done = 0; done < size;) {
        ssize_t w = write(u->fd, data + done, size - done);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            snprintf(u->why, sizeof u->why, "cannot store the upload: %s", strerror(errno));
            return MHD_NO;
        }
        done += (size_t)w;
    }
    u->bytes += (int64_t)size;
    return MHD_YES;
}

bool sb__srv_files_upload(sb_srv *srv, struct MHD_Connection *conn, sb_srv_http *q, const char *data, size_t n) {
    upload *u = sb__srv_http_upload(q);
    if (!u) {
        if (!(u = sb_calloc(1, sizeof *u)))
            return false;
        u->srv = srv;
        u->fd = -1;
        sb__srv_http_set_upload(q, u, upload_free);
        if (!srv->batches)
            snprintf(u->why, sizeof u->why, "/v1/files needs a state directory: start the server with --state-dir DIR");
        else if (!(u->pp = MHD_create_post_processor(conn, 64 * 1024, on_part, u)))
            snprintf(u->why, sizeof u->why, "the body must be multipart/form-data with a 'file' and a 'purpose' field");
    }
    if (u->pp && !u->why[0] && MHD_post_process(u->pp, data, n) != MHD_YES && !u->why[0])
        snprintf(u->why, sizeof u->why, "the multipart/form-data body is malformed");
    return true;
}

/* Whether the file is JSONL at all: some line is a JSON object. A line
 * that is not (bad JSON, no valid request) becomes an error line of the
 * batch, as `switchboard batch` makes it; a file with none (CSV, a binary,
 * nothing) is refused here, naming its first line. */
static bool check_jsonl(const char *path, char *why, size_t cap) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(why, cap, "cannot read the upload back: %s", strerror(errno));
        return false;
    }
    char *line = NULL;
    size_t len = 0, cap_line = 0;
    int64_t line_no = 0, first_bad = 0;
    bool object = false, nomem = false;
    int c;
    do {
        c = fgetc(f);
        if (c != '\n' && c != EOF) {
            if (len + 1 >= cap_line) {
                size_t ncap = cap_line ? 2 * cap_line : 4096;
                char *grown = sb_realloc(line, ncap);
                if (!grown) {
                    nomem = true;
                    break;
                }
                line = grown;
                cap_line = ncap;
            }
            line[len++] = (char)c;
            continue;
        }
        if (c == EOF && len == 0)
            break;
        line_no++;
        size_t n = len;
        len = 0;
        while (n && (line[n - 1] == '\r' || line[n - 1] == ' ' || line[n - 1] == '\t'))
            n--;
        if (n == 0)
            continue;
        cJSON *v = cJSON_ParseWithLength(line, n);
        object = cJSON_IsObject(v);
        cJSON_Delete(v);
        if (!object && !first_bad)
            first_bad = line_no;
    } while (!object && c != EOF);
    fclose(f);
    sb_free(line);
    if (nomem)
        snprintf(why, cap, "out of memory checking the upload");
    else if (!object && first_bad)
        snprintf(why, cap, "the file is not JSONL: no line is a JSON object (line %lld is not)", (long long)first_bad);
    else if (!object)
        snprintf(why, cap, "the file is empty: a batch input has one JSON request per line");
    return object;
}

enum MHD_Result sb__srv_files_create(sb_srv *srv, struct MHD_Connection *conn, sb_srv_http *q, const char *url) {
    enum MHD_Result r;
    if (!usable(srv, conn, q, url, &r))
        return r;
    upload *u = sb__srv_http_upload(q);
    if (u && u->pp && !u->why[0] && MHD_destroy_post_processor(u->pp) != MHD_YES)
        snprintf(u->why, sizeof u->why, "the multipart/form-data body ends early");
    if (u)
        u->pp = NULL;
    if (!u)
        return respond_fail(srv, conn, q, url, MHD_HTTP_BAD_REQUEST, "invalid_request", NULL,
                            "the body is empty: send multipart/form-data with a 'file' and a 'purpose' field");
    if (u->why[0])
        return respond_fail(srv, conn, q, url, MHD_HTTP_BAD_REQUEST, "invalid_request", NULL, "%s", u->why);
    if (!u->purpose_len)
        return respond_fail(srv, conn, q, url, MHD_HTTP_BAD_REQUEST, "missing_required_parameter", "purpose",
                            "purpose is required (\"batch\")");
    if (strcmp(u->purpose, "batch") != 0)
        return respond_fail(srv, conn, q, url, MHD_HTTP_BAD_REQUEST, "invalid_value", "purpose",
                            "purpose '%.40s' is not supported: this server keeps files for batches only (\"batch\")",
                            u->purpose);
    if (!u->tmp[0])
        return respond_fail(srv, conn, q, url, MHD_HTTP_BAD_REQUEST, "missing_required_parameter", "file",
                            "the upload has no 'file' part");
    close(u->fd);
    u->fd = -1;
    char why[200];
    if (!check_jsonl(u->tmp, why, sizeof why))
        return respond_fail(srv, conn, q, url, MHD_HTTP_BAD_REQUEST, "invalid_file_format", "file", "%s", why);
    sb_gw_caller caller;
    caller_of(q, &caller);
    sb_batch_file f = {.bytes = u->bytes, .created_at = now_unix()};
    random_id(srv, "file-", f.id, sizeof f.id);
    snprintf(f.owner, sizeof f.owner, "%s", caller.key);
    snprintf(f.filename, sizeof f.filename, "%s", u->filename);
    snprintf(f.purpose, sizeof f.purpose, "batch");
    sb_error err;
    sb_status st = sb_batch_file_add(srv->batches->store, srv->p.state_dir, u->tmp, &f, &err);
    if (st != SB_OK)
        return respond_status(srv, conn, q, url, st, &err);
    u->tmp[0] = '\0'; /* it is the file now */
    return respond_cjson(srv, conn, q, url, MHD_HTTP_OK, file_json(&f));
}

/* ---- files ----------------------------------------------------------------- */

enum MHD_Result sb__srv_files_list(sb_srv *srv, struct MHD_Connection *conn, sb_srv_http *q, const char *url) {
    enum MHD_Result r;
    int32_t limit;
    if (!usable(srv, conn, q, url, &r) || !query_limit(srv, conn, q, url, 10000, 10000, &limit, &r))
        return r;
    sb_gw_caller caller;
    caller_of(q, &caller);
    sb_batch_file *files;
    int32_t n;
    bool more;
    sb_error err;
    sb_status st = sb_batch_file_list(srv->batches->store, caller.key, MHD_lookup_connection_value(conn, MHD_GET_ARGUMENT_KIND, "purpose"),
                                      MHD_lookup_connection_value(conn, MHD_GET_ARGUMENT_KIND, "after"), limit, &files,
                                      &n, &more, &err);
    if (st != SB_OK)
        return respond_status(srv, conn, q, url, st, &err);
    cJSON *data = cJSON_CreateArray();
    for (int32_t i = 0; i < n; i++)
        cJSON_AddItemToArray(data, file_json(&files[i]));
    sb_free(files);
    return respond_cjson(srv, conn, q, url, MHD_HTTP_OK, list_json(data, more));
}

/* GET /v1/files/{id} and /v1/files/{id}/content. */
enum MHD_Result sb__srv_files_get(sb_srv *srv, struct MHD_Connection *conn, sb_srv_http *q, const char *url) {
    enum MHD_Result r;
    if (!usable(srv, conn, q, url, &r))
        return r;
    char id[SB_BATCH_ID_MAX];
    const char *rest;
    if (!path_id(url, "/v1/files/", id, sizeof id, &rest) || (*rest && strcmp(rest, "content") != 0))
        return respond_fail(srv, conn, q, url, MHD_HTTP_NOT_FOUND, "unknown_url", NULL,
                            "Invalid URL (GET %.200s): use /v1/files/{id} or /v1/files/{id}/content", url);
    sb_gw_caller caller;
    caller_of(q, &caller);
    sb_batch_file f;
    sb_error err;
    sb_status st = sb_batch_file_get(srv->batches->store, id, caller.key, &f, &err);
    if (st != SB_OK)
        return respond_status(srv, conn, q, url, st, &err);
    if (!*rest)
        return respond_cjson(srv, conn, q, url, MHD_HTTP_OK, file_json(&f));
    int fd = open(f.path, O_RDONLY | O_CLOEXEC);
    struct stat sb;
    if (fd < 0 || fstat(fd, &sb) != 0) {
        if (fd >= 0)
            close(fd);
        return respond_fail(srv, conn, q, url, MHD_HTTP_INTERNAL_SERVER_ERROR, NULL, NULL,
                            "the content of %s is missing (%s)", id, strerror(errno));
    }
    struct MHD_Response *resp = MHD_create_response_from_fd((uint64_t)sb.st_size, fd); /* takes fd */
    if (!resp) {
        close(fd);
        return MHD_NO;
    }
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "application/octet-stream");
    return sb__srv_respond(srv, conn, q, url, MHD_HTTP_OK, resp);
}

enum MHD_Result sb__srv_files_delete(sb_srv *srv, struct MHD_Connection *conn, sb_srv_http *q, const char *url) {
    enum MHD_Result r;
    if (!usable(srv, conn, q, url, &r))
        return r;
    char id[SB_BATCH_ID_MAX];
    const char *rest;
    if (!path_id(url, "/v1/files/", id, sizeof id, &rest) || *rest)
        return respond_fail(srv, conn, q, url, MHD_HTTP_NOT_FOUND, "unknown_url", NULL,
                            "Invalid URL (DELETE %.200s): use /v1/files/{id}", url);
    sb_gw_caller caller;
    caller_of(q, &caller);
    sb_error err;
    sb_status st = sb_batch_file_delete(srv->batches->store, id, caller.key, &err);
    if (st != SB_OK)
        return respond_status(srv, conn, q, url, st, &err);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", id);
    cJSON_AddStringToObject(o, "object", "file");
    cJSON_AddBoolToObject(o, "deleted", true);
    return respond_cjson(srv, conn, q, url, MHD_HTTP_OK, o);
}

/* ---- batches ---------------------------------------------------------------- */

static void wake_worker(sb_srv_batches *b) {
    pthread_mutex_lock(&b->mu);
    b->wake = true;
    pthread_cond_signal(&b->cv);
    pthread_mutex_unlock(&b->mu);
}

/* A string field of the create body, or NULL when absent; false (after answering 400) when not a string. */
static bool string_field(const cJSON *body, const char *name, const char **out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(body, name);
    *out = cJSON_IsString(v) ? v->valuestring : NULL;
    return !v || cJSON_IsString(v);
}

/* metadata: null or an object of at most 16 string values (OpenAI's limits: keys 64, values 512 chars). */
static bool metadata_ok(const cJSON *m, char *why, size_t cap) {
    if (!m || cJSON_IsNull(m))
        return true;
    if (!cJSON_IsObject(m)) {
        snprintf(why, cap, "metadata must be an object of strings");
        return false;
    }
    int n = 0;
    for (const cJSON *kv = m->child; kv; kv = kv->next, n++) {
        if (!cJSON_IsString(kv) || strlen(kv->string) > 64 || strlen(kv->valuestring) > 512) {
            snprintf(why, cap, "metadata['%.64s'] must be a string of at most 512 characters (keys at most 64)",
                     kv->string);
            return false;
        }
    }
    if (n > 16) {
        snprintf(why, cap, "metadata has %d keys; at most 16", n);
        return false;
    }
    return true;
}

enum MHD_Result sb__srv_batches_create(sb_srv *srv, struct MHD_Connection *conn, sb_srv_http *q, const char *url) {
    enum MHD_Result r;
    if (!usable(srv, conn, q, url, &r))
        return r;
    const sb_srv_buf *raw = sb__srv_http_body(q);
    cJSON *body = raw->p ? cJSON_ParseWithLength(raw->p, raw->len) : NULL;
    if (!cJSON_IsObject(body)) {
        cJSON_Delete(body);
        return respond_fail(srv, conn, q, url, MHD_HTTP_BAD_REQUEST, "invalid_json", NULL,
                            "the request body must be a JSON object");
    }
    const char *input_file_id, *endpoint, *window;
    const cJSON *metadata = cJSON_GetObjectItemCaseSensitive(body, "metadata");
    char why[300] = "";
    const char *param = NULL;
    if (!string_field(body, "input_file_id", &input_file_id) || !input_file_id)
        param = "input_file_id", snprintf(why, sizeof why, "input_file_id is required (a string: the id of a file uploaded with purpose \"batch\")");
    else if (!string_field(body, "endpoint", &endpoint) || !sb_batch_url_ok(endpoint))
        param = "endpoint", snprintf(why, sizeof why, "endpoint must be /v1/chat/completions, /v1/completions or /v1/embeddings");
    else if (!string_field(body, "completion_window", &window) || !window || strcmp(window, "24h") != 0)
        param = "completion_window", snprintf(why, sizeof why, "completion_window must be \"24h\"");
    else if (!metadata_ok(metadata, why, sizeof why))
        param = "metadata";
    if (param) {
        cJSON_Delete(body);
        return respond_fail(srv, conn, q, url, MHD_HTTP_BAD_REQUEST, "invalid_value", param, "%s", why);
    }
    sb_gw_caller caller;
    caller_of(q, &caller);
    sb_batch_file f;
    sb_error err;
    sb_status st = sb_batch_file_get(srv->batches->store, input_file_id, caller.key, &f, &err);
    if (st == SB_OK && strcmp(f.purpose, "batch") != 0)
        st = sb_fail(&err, SB_ERR_INVALID_ARG, "file %s has purpose '%s'; a batch's input needs purpose \"batch\"",
                     f.id, f.purpose);
    sb_batch_job j = {.status = SB_BATCH_VALIDATING};
    if (st == SB_OK) {
        random_id(srv, "batch_", j.id, sizeof j.id);
        snprintf(j.owner, sizeof j.owner, "%s", caller.key);
        snprintf(j.input_file_id, sizeof j.input_file_id, "%s", f.id);
        snprintf(j.input_path, sizeof j.input_path, "%s", f.path);
        snprintf(j.endpoint, sizeof j.endpoint, "%s", endpoint);
        snprintf(j.completion_window, sizeof j.completion_window, "24h");
        j.at[SB_BATCH_VALIDATING] = now_unix();
        j.expires_at = j.at[SB_BATCH_VALIDATING] + WINDOW_S;
        char *meta = metadata && cJSON_IsObject(metadata) ? cJSON_PrintUnformatted(metadata) : NULL;
        j.metadata = meta;
        st = sb_batch_file_sha256(f.path, j.input_sha256, &j.input_size, &err);
        if (st == SB_OK)
            st = sb_batch_prepare(srv->batches->store, &j, &err);
        cJSON_free(meta);
        j.metadata = NULL;
    }
    cJSON_Delete(body);
    if (st == SB_ERR_INVALID_ARG || st == SB_ERR_FORMAT)
        return respond_fail(srv, conn, q, url, MHD_HTTP_BAD_REQUEST, "invalid_value", "input_file_id", "%s", err.msg);
    if (st != SB_OK)
        return respond_status(srv, conn, q, url, st, &err);
    sb_batch_job made;
    if ((st = sb_batch_job_get(srv->batches->store, j.id, &made, &err)) != SB_OK)
        return respond_status(srv, conn, q, url, st, &err);
    sb__srv_log(srv, "batch %s: created from %s (%lld requests, %lld bad lines)", made.id, made.input_file_id,
                (long long)made.total, (long long)made.failed);
    wake_worker(srv->batches);
    r = respond_cjson(srv, conn, q, url, MHD_HTTP_OK, batch_json(&made));
    sb_batch_job_clear(&made);
    return r;
}

enum MHD_Result sb__srv_batches_list(sb_srv *srv, struct MHD_Connection *conn, sb_srv_http *q, const char *url) {
    enum MHD_Result r;
    int32_t limit;
    if (!usable(srv, conn, q, url, &r) || !query_limit(srv, conn, q, url, 20, 100, &limit, &r))
        return r;
    sb_gw_caller caller;
    caller_of(q, &caller);
    sb_batch_job *jobs;
    int32_t n;
    bool more;
    sb_error err;
    sb_status st = sb_batch_job_list(srv->batches->store, caller.key,
                                     MHD_lookup_connection_value(conn, MHD_GET_ARGUMENT_KIND, "after"), limit, &jobs,
                                     &n, &more, &err);
    if (st != SB_OK)
        return respond_status(srv, conn, q, url, st, &err);
    cJSON *data = cJSON_CreateArray();
    for (int32_t i = 0; i < n; i++) {
        cJSON_AddItemToArray(data, batch_json(&jobs[i]));
        sb_batch_job_clear(&jobs[i]);
    }
    sb_free(jobs);
    return respond_cjson(srv, conn, q, url, MHD_HTTP_OK, list_json(data, more));
}

/* The caller's batch named by the path, or false after answering. */
static bool owned_batch(sb_srv *srv, struct MHD_Connection *conn, sb_srv_http *q, const char *url, const char **rest,
                        sb_batch_job *out, enum MHD_Result *r) {
    char id[SB_BATCH_ID_MAX];
    if (!path_id(url, "/v1/batches/", id, sizeof id, rest)) {
        *r = respond_fail(srv, conn, q, url, MHD_HTTP_NOT_FOUND, "unknown_url", NULL, "Invalid URL (%.200s)", url);
        return false;
    }
    sb_gw_caller caller;
    caller_of(q, &caller);
    sb_error err;
    sb_status st = sb_batch_job_get(srv->batches->store, id, out, &err);
    if (st == SB_OK && strcmp(out->owner, caller.key) != 0) {
        sb_batch_job_clear(out);
        st = sb_fail(&err, SB_ERR_NOT_FOUND, "no batch with id '%s'", id);
    }
    if (st != SB_OK) {
        *r = respond_status(srv, conn, q, url, st, &err);
        return false;
    }
    return true;
}

enum MHD_Result sb__srv_batches_get(sb_srv *srv, struct MHD_Connection *conn, sb_srv_http *q, const char *url) {
    enum MHD_Result r;
    const char *rest;
    sb_batch_job j;
    if (!usable(srv, conn, q, url, &r) || !owned_batch(srv, conn, q, url, &rest, &j, &r))
        return r;
    if (*rest)
        r = respond_fail(srv, conn, q, url, MHD_HTTP_NOT_FOUND, "unknown_url", NULL,
                         "Invalid URL (GET %.200s): use /v1/batches/{id}", url);
    else
        r = respond_cjson(srv, conn, q, url, MHD_HTTP_OK, batch_json(&j));
    sb_batch_job_clear(&j);
    return r;
}

enum MHD_Result sb__srv_batches_cancel(sb_srv *srv, struct MHD_Connection *conn, sb_srv_http *q, const char *url) {
    enum MHD_Result r;
    const char *rest;
    sb_batch_job j;
    if (!usable(srv, conn, q, url, &r) || !owned_batch(srv, conn, q, url, &rest, &j, &r))
        return r;
    sb_srv_batches *b = srv->batches;
    sb_error err;
    sb_status st = SB_OK;
    if (strcmp(rest, "cancel") != 0) {
        r = respond_fail(srv, conn, q, url, MHD_HTTP_NOT_FOUND, "unknown_url", NULL,
                         "Invalid URL (POST %.200s): use /v1/batches/{id}/cancel", url);
    } else if (j.status == SB_BATCH_VALIDATING || j.status == SB_BATCH_IN_PROGRESS) {
        /* Under mu: the worker cannot pass between the status change and the interrupt. */
        pthread_mutex_lock(&b->mu);
        st = sb_batch_job_set_status(b->store, j.id, SB_BATCH_CANCELLING, now_unix(), NULL, &err);
        if (st == SB_OK && strcmp(b->current, j.id) == 0)
            atomic_store(&b->interrupt, true);
        b->wake = true;
        pthread_cond_signal(&b->cv);
        pthread_mutex_unlock(&b->mu);
        char id[SB_BATCH_ID_MAX];
        memcpy(id, j.id, sizeof id);
        sb_batch_job_clear(&j);
        if (st == SB_OK)
            st = sb_batch_job_get(b->store, id, &j, &err);
        r = st == SB_OK ? respond_cjson(srv, conn, q, url, MHD_HTTP_OK, batch_json(&j))
                        : respond_status(srv, conn, q, url, st, &err);
    } else if (j.status == SB_BATCH_CANCELLING || j.status == SB_BATCH_CANCELLED) {
        r = respond_cjson(srv, conn, q, url, MHD_HTTP_OK, batch_json(&j));
    } else {
        r = respond_fail(srv, conn, q, url, MHD_HTTP_CONFLICT, "invalid_state", NULL,
                         "batch %s is %s: only a validating or in_progress batch can be cancelled", j.id,
                         sb_batch_status_name(j.status));
    }
    sb_batch_job_clear(&j);
    return r;
}

/* ---- the worker ------------------------------------------------------------ */

static sb_status exec_inproc(void *user, const char *url, const char *body, size_t len, const sb_gw_caller *caller,
                             int *status, char **json, sb_error *err) {
    return sb_srv_execute(user, url, body, len, caller, status, json, err);
}

/* Writes the rows of `which` (1 succeeded, 2 failed) as the file `name_suffix` of
 * the batch, *file_id its id ("" when there is no such row). */
static sb_status write_result_file(sb_srv_batches *b, const sb_batch_job *j, int which, int64_t rows,
                                   const char *suffix, char *file_id, sb_error *err) {
    file_id[0] = '\0';
    if (rows == 0)
        return SB_OK;
    sb_batch_ids ids; /* from the batch id: finalizing twice writes the same file */
    sb_batch_ids_make(j->id, -which, &ids);
    sb_batch_file f = {.created_at = now_unix()};
    snprintf(f.id, sizeof f.id, "file-%s", ids.hex);
    snprintf(f.owner, sizeof f.owner, "%s", j->owner);
    snprintf(f.filename, sizeof f.filename, "%s_%s.jsonl", j->id, suffix);
    snprintf(f.purpose, sizeof f.purpose, "batch_output");
    char name[96], tmp[1024];
    snprintf(name, sizeof name, "%s.tmp", f.id);
    sb_status st = sb_batch_file_path(b->srv->p.state_dir, name, tmp, sizeof tmp, err);
    if (st == SB_OK)
        st = sb_batch_write(b->store, j->id, which, tmp, err);
    struct stat sbuf;
    if (st == SB_OK && stat(tmp, &sbuf) == 0)
        f.bytes = (int64_t)sbuf.st_size;
    if (st == SB_OK)
        st = sb_batch_file_add(b->store, b->srv->p.state_dir, tmp, &f, err);
    if (st == SB_OK)
        snprintf(file_id, SB_BATCH_ID_MAX, "%s", f.id);
    return st;
}

/* The output and error files of what was recorded, then `final`. */
static sb_status finish(sb_srv_batches *b, const char *id, sb_batch_status final, sb_error *err) {
    sb_batch_job j;
    sb_status st = sb_batch_job_get(b->store, id, &j, err);
    if (st != SB_OK)
        return st;
    char out_id[SB_BATCH_ID_MAX], err_id[SB_BATCH_ID_MAX];
    if (final == SB_BATCH_COMPLETED && j.status != SB_BATCH_FINALIZING)
        st = sb_batch_job_set_status(b->store, id, SB_BATCH_FINALIZING, now_unix(), NULL, err);
    if (st == SB_OK)
        st = write_result_file(b, &j, 1, j.completed, "output", out_id, err);
    if (st == SB_OK)
        st = write_result_file(b, &j, 2, j.failed, "error", err_id, err);
    if (st == SB_OK)
        st = sb_batch_job_set_files(b->store, id, out_id, err_id, err);
    if (st == SB_OK)
        st = sb_batch_job_set_status(b->store, id, final, now_unix(), NULL, err);
    if (st == SB_OK)
        sb__srv_log(b->srv, "batch %s: %s (%lld completed, %lld failed of %lld)", id, sb_batch_status_name(final),
                    (long long)j.completed, (long long)j.failed, (long long)j.total);
    sb_batch_job_clear(&j);
    return st;
}

/* Takes one batch as far as it goes now. */
static void process(sb_srv_batches *b, const char *id) {
    pthread_mutex_lock(&b->mu);
    snprintf(b->current, sizeof b->current, "%s", id);
    atomic_store(&b->interrupt, atomic_load(&b->stop));
    pthread_mutex_unlock(&b->mu);
    sb_batch_job j;
    sb_error err;
    sb_status st = sb_batch_job_get(b->store, id, &j, &err);
    if (st == SB_OK && j.status != SB_BATCH_CANCELLING && now_unix() > j.expires_at && j.expires_at) {
        st = finish(b, id, SB_BATCH_EXPIRED, &err);
    } else if (st == SB_OK && (j.status == SB_BATCH_VALIDATING || j.status == SB_BATCH_IN_PROGRESS)) {
        if (j.status == SB_BATCH_VALIDATING)
            st = sb_batch_job_set_status(b->store, id, SB_BATCH_IN_PROGRESS, now_unix(), NULL, &err);
        int32_t parallel = b->srv->p.engine.n_parallel > 0 ? b->srv->p.engine.n_parallel : DEFAULT_PARALLEL;
        sb_batch_run_params rp = {
            .store = b->store, .job_id = id, .exec = exec_inproc, .exec_user = b->srv, .parallel = parallel,
            .priority = SB_BATCH_PRIORITY, .stop = &b->interrupt,
        };
        if (st == SB_OK && (st = sb_batch_run(&rp, NULL, &err)) != SB_OK && !atomic_load(&b->stop)) {
            sb__srv_log(b->srv, "batch %s: failed: %s", id, err.msg);
            sb_batch_job_set_status(b->store, id, SB_BATCH_FAILED, now_unix(), err.msg, &err);
        }
        sb_batch_job_clear(&j);
        if (st == SB_OK && !atomic_load(&b->stop) && (st = sb_batch_job_get(b->store, id, &j, &err)) == SB_OK) {
            if (j.status == SB_BATCH_CANCELLING)
                st = finish(b, id, SB_BATCH_CANCELLED, &err);
            else if (j.completed + j.failed == j.total)
                st = finish(b, id, SB_BATCH_COMPLETED, &err);
        }
    } else if (st == SB_OK && j.status == SB_BATCH_FINALIZING) {
        st = finish(b, id, SB_BATCH_COMPLETED, &err);
    } else if (st == SB_OK && j.status == SB_BATCH_CANCELLING) {
        st = finish(b, id, SB_BATCH_CANCELLED, &err);
    }
    if (st != SB_OK && !atomic_load(&b->stop))
        sb__srv_log(b->srv, "batch %s: %s", id, err.msg);
    sb_batch_job_clear(&j);
    pthread_mutex_lock(&b->mu);
    b->current[0] = '\0';
    pthread_mutex_unlock(&b->mu);
}

static void *worker_main(void *arg) {
    sb_srv_batches *b = arg;
    static const sb_batch_status live[] = {SB_BATCH_VALIDATING, SB_BATCH_IN_PROGRESS, SB_BATCH_FINALIZING,
                                           SB_BATCH_CANCELLING};
    for (;;) {
        pthread_mutex_lock(&b->mu);
        while (!b->wake && !atomic_load(&b->stop))
            pthread_cond_wait(&b->cv, &b->mu);
        b->wake = false;
        pthread_mutex_unlock(&b->mu);
        if (atomic_load(&b->stop))
            return NULL;
        char(*ids)[SB_BATCH_ID_MAX] = NULL;
        int32_t n = 0;
        sb_error err;
        if (sb_batch_job_ids_in(b->store, live, (int)SB_ARRAY_LEN(live), &ids, &n, &err) != SB_OK)
            sb__srv_log(b->srv, "batches: %s", err.msg);
        for (int32_t i = 0; i < n && !atomic_load(&b->stop); i++)
            process(b, ids[i]);
        sb_free(ids);
    }
}

sb_status sb__srv_batches_open(sb_srv *srv, sb_error *err) {
    if (!srv->p.state_dir)
        return SB_OK;
    sb_srv_batches *b = sb_calloc(1, sizeof *b);
    if (!b)
        return sb_fail(err, SB_ERR_NOMEM, "out of memory for the batches");
    sb_status st = sb_batch_store_open(srv->p.state_dir, &b->store, err);
    if (st != SB_OK) {
        sb_free(b);
        return st;
    }
    b->srv = srv;
    pthread_mutex_init(&b->mu, NULL);
    pthread_cond_init(&b->cv, NULL);
    b->wake = true; /* whatever a previous run left unfinished */
    if (pthread_create(&b->thread, NULL, worker_main, b) != 0) {
        pthread_cond_destroy(&b->cv);
        pthread_mutex_destroy(&b->mu);
        sb_batch_store_close(b->store);
        sb_free(b);
        return sb_fail(err, SB_ERR_IO, "cannot start the batch worker thread");
    }
    b->started = true;
    srv->batches = b;
    return SB_OK;
}

void sb__srv_batches_interrupt(sb_srv *srv) {
    sb_srv_batches *b = srv->batches;
    if (!b)
        return;
    pthread_mutex_lock(&b->mu);
    atomic_store(&b->stop, true);
    atomic_store(&b->interrupt, true);
    pthread_cond_signal(&b->cv);
    pthread_mutex_unlock(&b->mu);
}

void sb__srv_batches_close(sb_srv *srv) {
    sb_srv_batches *b = srv->batches;
    if (!b)
        return;
    sb__srv_batches_interrupt(srv);
    if (b->started)
        pthread_join(b->thread, NULL);
    srv->batches = NULL;
    pthread_cond_destroy(&b->cv);
    pthread_mutex_destroy(&b->mu);
    sb_batch_store_close(b->store);
    sb_free(b);
}
