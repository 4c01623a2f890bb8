/*
 * chat.c - chat prompt rendering (see chat.h): ChatML,
 *   <|im_start|>{role}\n{content}<|im_end|>\n ... <|im_start|>assistant\n
 * the format most instruction-tuned GGUF files use and the fallback for files
 * that carry no template.
 */
#include <string.h>

#include "base/base.h"
#include "server/buf.h"
#include "server/chat.h"

struct sb_srv_chat {
    const sb_model_t *model;
};

sb_status sb_srv_chat_create(const sb_model_t *model, sb_srv_chat **out, sb_error *err) {
    *out = sb_calloc(1, sizeof **out);
    if (!*out)
        return sb_fail(err, SB_ERR_NOMEM, "chat template: out of memory");
    (*out)->model = model;
    return SB_OK;
}

void sb_srv_chat_free(sb_srv_chat *chat) { sb_free(chat); }

const char *sb_srv_chat_describe(const sb_srv_chat *chat) { return "ChatML (built in)"; }

sb_status sb_srv_chat_render(const sb_srv_chat *chat, const cJSON *messages, char **out, size_t *len,
                             sb_error *err) {
    sb_srv_buf b = {0};
    const cJSON *m;
    cJSON_ArrayForEach(m, messages) {
        sb_srv_buf_puts(&b, "<|im_start|>");
        sb_srv_buf_puts(&b, cJSON_GetObjectItemCaseSensitive(m, "role")->valuestring);
        sb_srv_buf_puts(&b, "\n");
        sb_srv_buf_puts(&b, cJSON_GetObjectItemCaseSensitive(m, "content")->valuestring);
        sb_srv_buf_puts(&b, "<|im_end|>\n");
    }
    sb_srv_buf_puts(&b, "<|im_start|>assistant\n");
    if (b.failed) {
        sb_srv_buf_free(&b);
        return sb_fail(err, SB_ERR_NOMEM, "chat prompt: out of memory");
    }
    *out = b.p;
    *len = b.len;
    return SB_OK;
}
