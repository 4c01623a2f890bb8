/*
 * input.c - batch input lines checked, output lines rendered (see input.h).
 */
#include "batch/input.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include <cjson/cJSON.h>
#include <openssl/evp.h>

#include "base/base.h"

bool sb_batch_url_ok(const char *url) {
    return url && (strcmp(url, "/v1/chat/completions") == 0 || strcmp(url, "/v1/completions") == 0 ||
                   strcmp(url, "/v1/embeddings") == 0);
}

static bool refuse(sb_batch_line *out, const char *code, int64_t line_no, const char *fmt, const char *arg) {
    snprintf(out->code, sizeof out->code, "%s", code);
    int n = snprintf(out->message, sizeof out->message, "line %lld: ", (long long)line_no);
    snprintf(out->message + n, sizeof out->message - (size_t)n, fmt, arg);
    return false;
}

/* s as a short printable quote for a message ("...", control bytes dropped). */
static const char *quote(const char *s, char *buf, size_t cap) {
    size_t i = 0, j = 0;
    buf[j++] = '"';
    for (; s[i] && j + 5 < cap; i++)
        if ((unsigned char)s[i] >= 0x20)
            buf[j++] = s[i];
    if (s[i])
        memcpy(buf + j, "...", 3), j += 3;
    buf[j++] = '"';
    buf[j] = '\0';
    return buf;
}

static bool check(const cJSON *root, int64_t line_no, const char *endpoint, sb_batch_line *out) {
    char q[80];
    if (!cJSON_IsObject(root))
        return refuse(out, "invalid_json", line_no, "%s", "the line must be a JSON object");
    const cJSON *id = cJSON_GetObjectItemCaseSensitive(root, "custom_id");
    if (cJSON_IsString(id) && *id->valuestring && !(out->custom_id = sb_strndup(id->valuestring, strlen(id->valuestring))))
        return false;
    if (!out->custom_id)
        return refuse(out, "missing_custom_id", line_no, "%s",
                      id ? "custom_id must be a non-empty string" : "the line has no custom_id");
    const cJSON *method = cJSON_GetObjectItemCaseSensitive(root, "method");
    if (!cJSON_IsString(method) || strcmp(method->valuestring, "POST") != 0)
        return refuse(out, "invalid_method", line_no, "method must be \"POST\", got %s",
                      cJSON_IsString(method) ? quote(method->valuestring, q, sizeof q) : method ? "a non-string" : "none");
    const cJSON *url = cJSON_GetObjectItemCaseSensitive(root, "url");
    if (!cJSON_IsString(url) || !sb_batch_url_ok(url->valuestring))
        return refuse(out, "invalid_url", line_no,
                      "url %s is not a batch endpoint (/v1/chat/completions, /v1/completions, /v1/embeddings)",
                      cJSON_IsString(url) ? quote(url->valuestring, q, sizeof q) : "(missing)");
    if (endpoint && strcmp(url->valuestring, endpoint) != 0)
        return refuse(out, "mismatched_url", line_no, "url %s differs from the batch's endpoint",
                      quote(url->valuestring, q, sizeof q));
    snprintf(out->url, sizeof out->url, "%s", url->valuestring);
    const cJSON *body = cJSON_GetObjectItemCaseSensitive(root, "body");
    if (!cJSON_IsObject(body))
        return refuse(out, "invalid_body", line_no, "%s", body ? "body must be a JSON object" : "the line has no body");
    const cJSON *stream = cJSON_GetObjectItemCaseSensitive(body, "stream");
    if (cJSON_IsTrue(stream))
        return refuse(out, "invalid_body", line_no, "%s", "body.stream must not be true in a batch");
    char *text = cJSON_PrintUnformatted(body);
    if (text) {
        out->body = sb_strndup(text, strlen(text));
        cJSON_free(text);
    }
    return out->ok = out->body != NULL;
}

sb_status sb_batch_line_check(const char *s, size_t len, int64_t line_no, const char *endpoint, sb_batch_line *out,
                              sb_error *err) {
    memset(out, 0, sizeof *out);
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(s, len, &end, false);
    if (!root) {
        size_t at = end && end >= s && end <= s + len ? (size_t)(end - s) : 0;
        char what[64];
        snprintf(what, sizeof what, "%zu", at);
        refuse(out, "invalid_json", line_no, "the line is not valid JSON (error at byte %s)", what);
        return SB_OK;
    }
    while (end < s + len && (*end == ' ' || *end == '\t' || *end == '\r'))
        end++;
    bool ok = end == s + len ? check(root, line_no, endpoint, out)
                             : refuse(out, "invalid_json", line_no, "%s", "the line has more after its JSON value");
    cJSON_Delete(root);
    /* Every refusal wrote a code; a false result without one ran out of memory. */
    if (!ok && !out->code[0]) {
        sb_batch_line_free(out);
        return sb_fail(err, SB_ERR_NOMEM, "out of memory checking line %lld", (long long)line_no);
    }
    return SB_OK;
}

void sb_batch_line_free(sb_batch_line *l) {
    sb_free(l->custom_id);
    sb_free(l->body);
    memset(l, 0, sizeof *l);
}

static void hex_of(const unsigned char *d, size_t n, char *out) {
    static const char digits[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = digits[d[i] >> 4];
        out[2 * i + 1] = digits[d[i] & 15];
    }
    out[2 * n] = '\0';
}

void sb_batch_ids_make(const char *job_id, int64_t line_no, sb_batch_ids *out) {
    char key[160];
    int n = snprintf(key, sizeof key, "%s:%lld", job_id, (long long)line_no);
    unsigned char d[EVP_MAX_MD_SIZE];
    unsigned int dn = 0;
    EVP_Digest(key, (size_t)n, d, &dn, EVP_sha256(), NULL);
    hex_of(d, 12, out->hex);
    snprintf(out->line_id, sizeof out->line_id, "batch_req_%s", out->hex);
    snprintf(out->request_id, sizeof out->request_id, "req_%s", out->hex);
}

/* {"id":..., "custom_id":...} with response and error added by the caller. */
static cJSON *line_object(const sb_batch_ids *ids, const char *custom_id) {
    cJSON *o = cJSON_CreateObject();
    if (o && (!cJSON_AddStringToObject(o, "id", ids->line_id) ||
              !(custom_id ? cJSON_AddStringToObject(o, "custom_id", custom_id) : cJSON_AddNullToObject(o, "custom_id")))) {
        cJSON_Delete(o);
        return NULL;
    }
    return o;
}

static char *print_line(cJSON *o) {
    char *text = o ? cJSON_PrintUnformatted(o) : NULL;
    cJSON_Delete(o);
    char *out = text ? sb_strndup(text, strlen(text)) : NULL;
    cJSON_free(text);
    return out;
}

static int64_t usage_of(const cJSON *usage, const char *field) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(usage, field);
    return cJSON_IsNumber(v) ? (int64_t)v->valuedouble : 0;
}

char *sb_batch_output_response(const sb_batch_ids *ids, const char *custom_id, int status, const char *response_json,
                               int64_t *prompt_tokens, int64_t *completion_tokens) {
    *prompt_tokens = *completion_tokens = 0;
    cJSON *body = cJSON_Parse(response_json);
    cJSON *o = body ? line_object(ids, custom_id) : NULL;
    cJSON *resp = o ? cJSON_AddObjectToObject(o, "response") : NULL;
    if (!resp || !cJSON_AddNumberToObject(resp, "status_code", status) ||
        !cJSON_AddStringToObject(resp, "request_id", ids->request_id) || !cJSON_AddNullToObject(o, "error")) {
        cJSON_Delete(body);
        cJSON_Delete(o);
        return NULL;
    }
    cJSON *id = cJSON_GetObjectItemCaseSensitive(body, "id");
    if (cJSON_IsString(id)) { /* "chatcmpl-<random>": keep the prefix, make the rest the line's */
        const char *dash = strrchr(id->valuestring, '-');
        char fixed[96];
        snprintf(fixed, sizeof fixed, "%.*s-%s", dash ? (int)(dash - id->valuestring) : 0, id->valuestring, ids->hex);
        cJSON_ReplaceItemInObjectCaseSensitive(body, "id", cJSON_CreateString(dash ? fixed : ids->hex));
    }
    const cJSON *usage = cJSON_GetObjectItemCaseSensitive(body, "usage");
    *prompt_tokens = usage_of(usage, "prompt_tokens");
    *completion_tokens = usage_of(usage, "completion_tokens");
    cJSON_AddItemToObject(resp, "body", body);
    return print_line(o);
}

char *sb_batch_output_error(const sb_batch_ids *ids, const char *custom_id, int64_t line_no, const char *code,
                            const char *message) {
    cJSON *o = line_object(ids, custom_id);
    cJSON *e = o && cJSON_AddNullToObject(o, "response") ? cJSON_AddObjectToObject(o, "error") : NULL;
    if (!e || !cJSON_AddStringToObject(e, "code", code) || !cJSON_AddStringToObject(e, "message", message) ||
        !cJSON_AddNumberToObject(e, "line", (double)line_no)) {
        cJSON_Delete(o);
        return NULL;
    }
    return print_line(o);
}

sb_status sb_batch_file_sha256(const char *path, char hex[65], int64_t *size, sb_error *err) {
    FILE *f = fopen(path, "rb");
    if (!f)
        return sb_fail(err, SB_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    if (!ctx || !EVP_DigestInit_ex(ctx, EVP_sha256(), NULL)) {
        EVP_MD_CTX_free(ctx);
        fclose(f);
        return sb_fail(err, SB_ERR_NOMEM, "out of memory for SHA-256");
    }
    char buf[1 << 16];
    size_t n;
    int64_t total = 0;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0) {
        EVP_DigestUpdate(ctx, buf, n);
        total += (int64_t)n;
    }
    bool failed = ferror(f);
    fclose(f);
    unsigned char d[EVP_MAX_MD_SIZE];
    unsigned int dn = 0;
    EVP_DigestFinal_ex(ctx, d, &dn);
    EVP_MD_CTX_free(ctx);
    if (failed)
        return sb_fail(err, SB_ERR_IO, "%s: read error", path);
    hex_of(d, 32, hex);
    *size = total;
    return SB_OK;
}
