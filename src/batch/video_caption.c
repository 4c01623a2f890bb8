/*
 * video_caption.c - the captioners: what describes one keyframe image.
 *
 * A command (--captioner "CMD ARGS"): the line is split into words here
 * (blanks, '...' and "..." quotes, backslash escapes; no shell, so no
 * globbing, pipes or variables: a user who wants those writes
 * `sh -c '... "$0"'`, the image's path then being $0), the image's path
 * appended as the last argument; whatever it prints on stdout, trimmed, is
 * the caption. A non-zero exit, a signal, a timeout or an empty answer is an
 * error for that keyframe, with the command's last stderr line.
 *
 * An endpoint (--captioner http(s)://HOST[:PORT][/v1[/chat/completions]]):
 * any OpenAI-compatible vision chat API. One POST per image, its content a
 * text part (the prompt) and an image_url part carrying the JPEG as a
 * base64 data: URL; the caption is choices[0].message.content. 429 and 5xx
 * answers and transport failures are retried with exponential backoff
 * (Retry-After when the server sends one); other answers are errors with
 * the server's message.
 */
#define _GNU_SOURCE
#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <curl/curl.h>
#include <openssl/evp.h>
#include <utf8proc.h>

#include "base/base.h"
#include "batch/video-impl.h"

struct sb_video_captioner {
    const sb_video_params *p;
    char **words;  /* command: its words (sb__video_split_command) */
    int32_t argc;
    char *url;     /* endpoint: the full chat completions URL */
    char *auth;    /* "Authorization: Bearer ..." or NULL */
};

sb_status sb__video_split_command(const char *line, char ***argv, int32_t *argc, sb_error *err) {
    *argv = NULL;
    *argc = 0;
    size_t len = strlen(line);
    /* Worst case: every other character a word; the words live after the pointers. */
    size_t nptr = len / 2 + 3;
    char **v = sb_malloc(nptr * sizeof(char *) + len + nptr);
    if (!v)
        return sb_fail(err, SB_ERR_NOMEM, "out of memory");
    char *w = (char *)(v + nptr);
    int32_t n = 0;
    const char *s = line;
    for (;;) {
        while (*s == ' ' || *s == '\t' || *s == '\n')
            s++;
        if (!*s)
            break;
        v[n++] = w;
        char quote = 0;
        for (; *s && (quote || (*s != ' ' && *s != '\t' && *s != '\n')); s++) {
            if (quote && *s == quote)
                quote = 0;
            else if (!quote && (*s == '\'' || *s == '"'))
                quote = *s;
            else if (*s == '\\' && quote != '\'' && s[1])
                *w++ = *++s;
            else
                *w++ = *s;
        }
        *w++ = '\0';
        if (quote) {
            sb_free(v);
            return sb_fail(err, SB_ERR_INVALID_ARG, "--captioner '%.200s': unterminated %c quote", line, quote);
        }
    }
    if (n == 0) {
        sb_free(v);
        return sb_fail(err, SB_ERR_INVALID_ARG, "--captioner is empty");
    }
    v[n] = NULL;
    *argv = v;
    *argc = n;
    return SB_OK;
}

static bool is_url(const char *s) { return strncmp(s, "http://", 7) == 0 || strncmp(s, "https://", 8) == 0; }

static bool ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

/* Whether the command's program can be run (as posix_spawnp looks it up):
 * a misspelt captioner is the job's error, not one per keyframe. */
static bool runnable(const char *prog) {
    if (strchr(prog, '/'))
        return access(prog, X_OK) == 0;
    const char *path = getenv("PATH");
    for (const char *p = path ? path : "/usr/bin:/bin"; *p;) {
        size_t n = strcspn(p, ":");
        char full[4200];
        snprintf(full, sizeof full, "%.*s/%s", (int)n, n ? p : ".", prog);
        if (access(full, X_OK) == 0)
            return true;
        p += n + (p[n] == ':');
    }
    return false;
}

sb_status sb__video_captioner_create(const sb_video_params *p, sb_video_captioner **out, sb_error *err) {
    *out = NULL;
    sb_video_captioner *c = sb_calloc(1, sizeof *c);
    if (!c)
        return sb_fail(err, SB_ERR_NOMEM, "out of memory");
    c->p = p;
    sb_status st = SB_OK;
    if (is_url(p->captioner)) {
        char base[2048];
        snprintf(base, sizeof base, "%s", p->captioner);
        while (ends_with(base, "/"))
            base[strlen(base) - 1] = '\0';
        const char *tail = ends_with(base, "/chat/completions") ? "" : ends_with(base, "/v1") ? "/chat/completions"
                                                                                              : "/v1/chat/completions";
        size_t n = strlen(base) + strlen(tail) + 1;
        c->url = sb_malloc(n);
        if (c->url)
            snprintf(c->url, n, "%s%s", base, tail);
        const char *key = p->captioner_key;
        if (!key)
            key = getenv("SWITCHBOARD_CAPTIONER_KEY");
        if (key && *key) {
            size_t m = strlen(key) + 32;
            c->auth = sb_malloc(m);
            if (c->auth)
                snprintf(c->auth, m, "Authorization: Bearer %s", key);
        }
        if (!c->url || (key && *key && !c->auth))
            st = sb_fail(err, SB_ERR_NOMEM, "out of memory");
        else if (curl_global_init(CURL_GLOBAL_DEFAULT) != 0)
            st = sb_fail(err, SB_ERR_IO, "libcurl cannot start");
    } else {
        st = sb__video_split_command(p->captioner, &c->words, &c->argc, err);
        if (st == SB_OK && !runnable(c->words[0]))
            st = sb_fail(err, SB_ERR_NOT_FOUND, "--captioner: '%s' is not a program that can be run%s", c->words[0],
                         strchr(c->words[0], '/') ? "" : " (not found on PATH)");
    }
    if (st != SB_OK) {
        sb__video_captioner_free(c);
        return st;
    }
    *out = c;
    return SB_OK;
}

void sb__video_captioner_free(sb_video_captioner *c) {
    if (!c)
        return;
    if (c->url)
        curl_global_cleanup();
    sb_free(c->words);
    sb_free(c->url);
    sb_free(c->auth);
    sb_free(c);
}

/* The answer as a caption: valid UTF-8 (bad bytes become U+FFFD), lines
 * joined by spaces, trimmed. NULL when nothing is left (or no memory). */
static char *clean_caption(const char *s, size_t len) {
    char *out = sb_malloc(len * 3 + 1);
    if (!out)
        return NULL;
    size_t o = 0;
    for (size_t i = 0; i < len;) {
        utf8proc_int32_t cp;
        utf8proc_ssize_t r = utf8proc_iterate((const utf8proc_uint8_t *)s + i, (utf8proc_ssize_t)(len - i), &cp);
        if (r <= 0) {
            cp = 0xFFFD;
            r = 1;
        }
        if (cp == '\n' || cp == '\r' || cp == '\t')
            cp = ' ';
        if (cp == ' ' && (o == 0 || out[o - 1] == ' ')) {
            i += (size_t)r;
            continue;
        }
        if (cp < 0x20 && cp != ' ')
            cp = 0xFFFD;
        o += (size_t)utf8proc_encode_char(cp, (utf8proc_uint8_t *)out + o);
        i += (size_t)r;
    }
    while (o > 0 && out[o - 1] == ' ')
        o--;
    out[o] = '\0';
    if (o == 0) {
        sb_free(out);
        return NULL;
    }
    return out;
}

static sb_status caption_command(sb_video_captioner *c, const char *file, char **caption, sb_error *err) {
    char *argv[c->argc + 2];
    memcpy(argv, c->words, (size_t)c->argc * sizeof(char *));
    argv[c->argc] = (char *)file;
    argv[c->argc + 1] = NULL;
    sb_video_proc pr;
    sb_status st = sb__video_spawn(argv, c->p->captioner_timeout_s, &pr, err);
    if (st != SB_OK)
        return st;
    char why[300];
    sb__video_last_line(pr.errout, why, sizeof why);
    if (pr.timed_out)
        st = sb_fail(err, SB_ERR_IO, "captioner '%s' did not finish in %g s (killed)", c->words[0],
                     c->p->captioner_timeout_s);
    else if (!pr.exited || pr.status != 0)
        st = sb_fail(err, SB_ERR_IO, "captioner '%s' %s %d%s%s", c->words[0],
                     pr.exited ? "exited with status" : "was killed by signal", pr.exited ? pr.status : pr.status - 128,
                     *why ? ": " : "", why);
    else if (!(*caption = clean_caption(pr.out, strlen(pr.out))))
        st = sb_fail(err, SB_ERR_FORMAT, "captioner '%s' printed no caption%s%s", c->words[0], *why ? ": " : "", why);
    sb__video_proc_free(&pr);
    return st;
}

/* ---- the HTTP captioner ------------------------------------------------------ */

typedef struct http_buf {
    char *p;
    size_t len;
    bool failed;
} http_buf;

static size_t on_body(char *data, size_t size, size_t nmemb, void *user) {
    http_buf *b = user;
    size_t n = size * nmemb;
    if (b->len + n > (8u << 20)) { /* no caption is 8 MiB: stop reading */
        b->failed = true;
        return 0;
    }
    char *q = sb_realloc(b->p, b->len + n + 1);
    if (!q) {
        b->failed = true;
        return 0;
    }
    memcpy(q + b->len, data, n);
    b->p = q;
    b->len += n;
    b->p[b->len] = '\0';
    return n;
}

static size_t on_header(char *data, size_t size, size_t nmemb, void *user) {
    size_t n = size * nmemb;
    double *after = user;
    if (n > 12 && strncasecmp(data, "retry-after:", 12) == 0)
        *after = strtod(data + 12, NULL);
    return n;
}

/* The JSON request for one image; NULL without memory or when the file
 * cannot be read (err says which). */
static char *http_body(sb_video_captioner *c, const char *file, sb_error *err) {
    FILE *f = fopen(file, "rb");
    if (!f) {
        sb_fail(err, SB_ERR_IO, "%s: cannot read the keyframe image", file);
        return NULL;
    }
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *img = size > 0 ? sb_malloc((size_t)size) : NULL;
    size_t got = img ? fread(img, 1, (size_t)size, f) : 0;
    fclose(f);
    if (!img || got != (size_t)size) {
        sb_free(img);
        sb_fail(err, SB_ERR_IO, "%s: cannot read the keyframe image", file);
        return NULL;
    }
    const char prefix[] = "data:image/jpeg;base64,";
    size_t n64 = 4 * (((size_t)size + 2) / 3);
    char *url = sb_malloc(sizeof prefix + n64 + 1);
    if (url) {
        memcpy(url, prefix, sizeof prefix - 1);
        EVP_EncodeBlock((unsigned char *)url + sizeof prefix - 1, img, (int)size);
    }
    sb_free(img);
    cJSON *root = cJSON_CreateObject(), *msgs = cJSON_AddArrayToObject(root, "messages");
    cJSON *msg = cJSON_CreateObject(), *content = cJSON_AddArrayToObject(msg, "content");
    cJSON_AddItemToArray(msgs, msg);
    cJSON_AddStringToObject(msg, "role", "user");
    cJSON *text = cJSON_CreateObject(), *image = cJSON_CreateObject(), *iu = cJSON_AddObjectToObject(image, "image_url");
    cJSON_AddStringToObject(text, "type", "text");
    cJSON_AddStringToObject(text, "text", c->p->captioner_prompt);
    cJSON_AddStringToObject(image, "type", "image_url");
    cJSON_AddStringToObject(iu, "url", url ? url : "");
    cJSON_AddItemToArray(content, text);
    cJSON_AddItemToArray(content, image);
    if (c->p->captioner_model)
        cJSON_AddStringToObject(root, "model", c->p->captioner_model);
    cJSON_AddNumberToObject(root, "max_tokens", 120);
    cJSON_AddNumberToObject(root, "temperature", 0);
    char *body = url ? cJSON_PrintUnformatted(root) : NULL;
    cJSON_Delete(root);
    sb_free(url);
    if (!body)
        sb_fail(err, SB_ERR_NOMEM, "out of memory building the caption request");
    return body;
}

/* choices[0].message.content, or the error the server gave. */
static sb_status http_caption_of(const char *url, long code, const char *body, char **caption, sb_error *err) {
    cJSON *root = cJSON_Parse(body);
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(root, "error");
    const cJSON *msg = cJSON_GetObjectItemCaseSensitive(e, "message");
    const cJSON *ch = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(root, "choices"), 0);
    const cJSON *content =
        cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(ch, "message"), "content");
    sb_status st = SB_OK;
    if (code != 200)
        st = sb_fail(err, SB_ERR_IO, "captioner %s answered HTTP %ld: %.300s", url, code,
                     cJSON_IsString(msg) ? msg->valuestring : body);
    else if (!cJSON_IsString(content))
        st = sb_fail(err, SB_ERR_FORMAT, "captioner %s: the answer has no choices[0].message.content: %.200s", url,
                     body);
    else if (!(*caption = clean_caption(content->valuestring, strlen(content->valuestring))))
        st = sb_fail(err, SB_ERR_FORMAT, "captioner %s answered an empty caption", url);
    cJSON_Delete(root);
    return st;
}

static sb_status caption_http(sb_video_captioner *c, const char *file, char **caption, sb_error *err) {
    char *body = http_body(c, file, err);
    if (!body)
        return err->status;
    CURL *h = curl_easy_init();
    if (!h) {
        cJSON_free(body);
        return sb_fail(err, SB_ERR_NOMEM, "libcurl cannot make a handle");
    }
    struct curl_slist *hdrs = curl_slist_append(NULL, "Content-Type: application/json");
    if (c->auth)
        hdrs = curl_slist_append(hdrs, c->auth);
    sb_status st = SB_ERR_IO;
    for (int32_t attempt = 0;; attempt++) {
        http_buf b = {0};
        double after = -1;
        char curl_err[CURL_ERROR_SIZE] = "";
        curl_easy_reset(h);
        curl_easy_setopt(h, CURLOPT_URL, c->url);
        curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdrs);
        curl_easy_setopt(h, CURLOPT_POSTFIELDS, body);
        curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_body);
        curl_easy_setopt(h, CURLOPT_WRITEDATA, &b);
        curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, on_header);
        curl_easy_setopt(h, CURLOPT_HEADERDATA, &after);
        curl_easy_setopt(h, CURLOPT_ERRORBUFFER, curl_err);
        curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
        curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, 10000L);
        curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, (long)(c->p->captioner_timeout_s * 1e3));
        CURLcode rc = curl_easy_perform(h);
        long code = 0;
        curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &code);
        bool retry;
        if (rc != CURLE_OK) {
            st = sb_fail(err, SB_ERR_IO, "captioner %s: %s", c->url, *curl_err ? curl_err : curl_easy_strerror(rc));
            retry = !b.failed;
        } else {
            st = http_caption_of(c->url, code, b.p ? b.p : "", caption, err);
            retry = code == 429 || code >= 500;
        }
        sb_free(b.p);
        if (st == SB_OK || !retry || attempt >= c->p->captioner_retries)
            break;
        double wait = after >= 0 ? SB_MIN(after, 60.0) : SB_MIN(0.25 * pow(2, attempt), 8.0);
        struct timespec ts = {(time_t)wait, (long)((wait - floor(wait)) * 1e9)};
        nanosleep(&ts, NULL);
    }
    curl_slist_free_all(hdrs);
    curl_easy_cleanup(h);
    cJSON_free(body);
    return st;
}

sb_status sb__video_caption(sb_video_captioner *c, const char *file, char **caption, sb_error *err) {
    *caption = NULL;
    return c->url ? caption_http(c, file, caption, err) : caption_command(c, file, caption, err);
}
