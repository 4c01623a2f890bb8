/*
 * chat.c - chat prompt rendering (see chat.h) on the template module: the
 * model file's tokenizer.chat_template, parsed once, or the built-in ChatML
 * template when the file has none or one this engine cannot parse.
 */
#include <stdio.h>
#include <string.h>

#include "base/base.h"
#include "model/model.h"
#include "server/chat.h"
#include "template/template.h"

struct sb_srv_chat {
    sb_tpl *tpl;
    const char *bos, *eos; /* token texts (owned by the model), or NULL */
    char what[256];        /* for sb_srv_chat_describe */
};

sb_status sb_srv_chat_create(const sb_model_t *model, sb_srv_chat **out, sb_error *err) {
    sb_srv_chat *c = sb_calloc(1, sizeof *c);
    if (!(*out = c))
        return sb_fail(err, SB_ERR_NOMEM, "chat template: out of memory");
    int32_t bos = sb_model_token_bos(model), eos = sb_model_token_eos(model);
    c->bos = bos >= 0 ? sb_token_text(model, bos) : NULL;
    c->eos = eos >= 0 ? sb_token_text(model, eos) : NULL;
    sb_gguf_str src;
    sb_error tpl_err;
    if (sb_gguf_get_str(model->gguf, "tokenizer.chat_template", &src, NULL) == SB_OK) {
        if (sb_tpl_parse(src.ptr, (size_t)src.len, &c->tpl, &tpl_err) == SB_OK) {
            snprintf(c->what, sizeof c->what, "the model's chat template");
            return SB_OK;
        }
        snprintf(c->what, sizeof c->what, "built-in ChatML: the model's template is not usable (%.180s)", tpl_err.msg);
    } else {
        snprintf(c->what, sizeof c->what, "built-in ChatML: the model has no chat template");
    }
    const char *chatml = sb_tpl_builtin_source("chatml");
    sb_status st = sb_tpl_parse(chatml, strlen(chatml), &c->tpl, err);
    if (st != SB_OK) {
        sb_srv_chat_free(c);
        *out = NULL;
    }
    return st;
}

void sb_srv_chat_free(sb_srv_chat *chat) {
    if (!chat)
        return;
    sb_tpl_free(chat->tpl);
    sb_free(chat);
}

const char *sb_srv_chat_describe(const sb_srv_chat *chat) { return chat->what; }

sb_status sb_srv_chat_render(const sb_srv_chat *chat, const cJSON *messages, char **out, size_t *len,
                             sb_error *err) {
    char *json = cJSON_PrintUnformatted(messages);
    if (!json)
        return sb_fail(err, SB_ERR_NOMEM, "chat prompt: out of memory");
    sb_tpl_chat c = {
        .messages_json = json,
        .add_generation_prompt = true,
        .bos_token = chat->bos,
        .eos_token = chat->eos,
    };
    sb_status st = sb_tpl_render_chat(chat->tpl, &c, out, len, err);
    cJSON_free(json);
    return st;
}
