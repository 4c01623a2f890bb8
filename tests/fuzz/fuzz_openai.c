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
#include "model/chat.h"
#include "model/model.h"
#include "server/buf.h"
#include "server/openai.h"
#include "server/server-impl.h"

static sb_srv srv;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    srv.p = sb_srv_default_params();
    srv.model = fuzz_fixture_model("models/stories260K.gguf");
    sb_error err;
    if (sb_chat_create(srv.model, &srv.chat, &err) != SB_OK)
        abort();
    srv.id = "stories260K";
    srv.n_embd = srv.model->hp.n_embd;
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
