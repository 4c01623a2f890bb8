/*
 * fuzz_openai.c - the OpenAI request parser (sb_oai_parse) for chat,
 * completions and embeddings, on the stories260K fixture with its chat
 * formatter. The first input byte picks the endpoint, the rest is the body.
 * Every refusal must render as a JSON error in valid UTF-8 (issue 17's D3).
 */
#include <stdint.h>
#include <string.h>

#include <cjson/cJSON.h>
#include <utf8proc.h>

#include "fuzz_common.h"
#include "server/buf.h"
#include "server/openai.h"
#include "server/server-impl.h"

static sb_srv srv;

/* A server without HTTP: the public API's handle over the fixture, which
 * the parser routes "model" through (the model loads on the first input
 * that names it and stays). */
int LLVMFuzzerInitialize(int *argc, char ***argv) {
    char path[4096];
    const char *dir = getenv("SB_SHARED_DIR");
    snprintf(path, sizeof path, "%s/models/stories260K.gguf", dir ? dir : SB_SHARED_DIR);
    sb_error err;
    sb_switchboard_params sp = sb_switchboard_default_params();
    sp.n_threads = 1;
    sp.keep_alive_s = -1;
    srv.p = sb_srv_default_params();
    if (sb_switchboard_open(path, &sp, &srv.sb, &err) != SB_OK) {
        fprintf(stderr, "fuzz_openai: %s\n", err.msg);
        abort();
    }
    return 0;
}

static bool valid_utf8(const char *s, size_t n) {
    for (size_t i = 0; i < n;) {
        utf8proc_int32_t cp;
        utf8proc_ssize_t k = utf8proc_iterate((const utf8proc_uint8_t *)s + i, (utf8proc_ssize_t)(n - i), &cp);
        if (k <= 0)
            return false;
        i += (size_t)k;
    }
    return true;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size == 0)
        return 0;
    static const sb_oai_kind kinds[] = {SB_OAI_CHAT, SB_OAI_COMPLETION, SB_OAI_EMBEDDING};
    sb_oai_kind kind = kinds[data[0] % 3];
    sb_oai_req req;
    sb_oai_err e;
    if (sb_oai_parse(&srv, kind, (const char *)data + 1, size - 1, &req, &e)) {
        sb_oai_req_free(&req);
        return 0;
    }
    sb_srv_buf b = {0};
    sb_oai_err_json(&e, &b);
    cJSON *j = b.failed ? NULL : cJSON_ParseWithLength(b.p, b.len);
    bool ok = b.failed || (j && valid_utf8(b.p, b.len));
    cJSON_Delete(j);
    if (!ok) {
        fprintf(stderr, "fuzz_openai: the error answer is not valid UTF-8 JSON: %.*s\n", (int)b.len, b.p);
        abort();
    }
    sb_srv_buf_free(&b);
    return 0;
}
