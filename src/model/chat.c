/*
 * chat.c - chat prompts (see chat.h) on the template module.
 */
#include <stdio.h>
#include <string.h>

#include "base/base.h"
#include "model/chat.h"
#include "model/model.h"
#include "template/template.h"

struct sb_chat {
    const sb_model *model;
    sb_tpl *tpl;
    const char *bos, *eos; /* token texts (owned by the model), or NULL */
    char *source;          /* the template's text (tool-call syntax is told from it) */
    char what[256];        /* for sb_chat_describe */
};

static sb_chat *chat_alloc(const sb_model_t *model) {
    sb_chat *c = sb_calloc(1, sizeof *c);
    if (!c)
        return NULL;
    c->model = model;
    int32_t bos = sb_model_token_bos(model), eos = sb_model_token_eos(model);
    c->bos = bos >= 0 ? sb_token_text(model, bos) : NULL;
    c->eos = eos >= 0 ? sb_token_text(model, eos) : NULL;
    return c;
}

sb_status sb_chat_create(const sb_model_t *model, sb_chat **out, sb_error *err) {
    sb_chat *c = chat_alloc(model);
    if (!(*out = c))
        return sb_fail(err, SB_ERR_NOMEM, "chat template: out of memory");
    sb_gguf_str src;
    sb_error tpl_err;
    if (sb_gguf_get_str(model->gguf, "tokenizer.chat_template", &src, NULL) == SB_OK) {
        if (sb_tpl_parse(src.ptr, (size_t)src.len, &c->tpl, &tpl_err) == SB_OK) {
            snprintf(c->what, sizeof c->what, "the model's chat template");
            if (!(c->source = sb_strndup(src.ptr, (size_t)src.len))) {
                sb_chat_free(c);
                *out = NULL;
                return sb_fail(err, SB_ERR_NOMEM, "chat template: out of memory");
            }
            return SB_OK;
        }
        snprintf(c->what, sizeof c->what, "built-in ChatML: the model's template is not usable (%.180s)", tpl_err.msg);
    } else {
        snprintf(c->what, sizeof c->what, "built-in ChatML: the model has no chat template");
    }
    const char *chatml = sb_tpl_builtin_source("chatml");
    sb_status st = sb_tpl_parse(chatml, strlen(chatml), &c->tpl, err);
    if (st != SB_OK) {
        sb_chat_free(c);
        *out = NULL;
    }
    return st;
}

sb_status sb_chat_create_from(const sb_model_t *model, const char *src, size_t len, const char *origin, sb_chat **out,
                              sb_error *err) {
    sb_chat *c = chat_alloc(model);
    if (!(*out = c))
        return sb_fail(err, SB_ERR_NOMEM, "chat template: out of memory");
    sb_error tpl_err;
    if (sb_tpl_parse(src, len, &c->tpl, &tpl_err) != SB_OK) {
        sb_chat_free(c);
        *out = NULL;
        return sb_fail(err, tpl_err.status, "chat template %.200s: %.280s", origin, tpl_err.msg);
    }
    snprintf(c->what, sizeof c->what, "the chat template %.200s", origin);
    return SB_OK;
}

void sb_chat_free(sb_chat *chat) {
    if (!chat)
        return;
    sb_tpl_free(chat->tpl);
    sb_free(chat->source);
    sb_free(chat);
}

const char *sb_chat_describe(const sb_chat *chat) { return chat->what; }

const char *sb_chat_source(const sb_chat *chat) { return chat->source ? chat->source : sb_tpl_builtin_source("chatml"); }

sb_status sb_chat_tokenize(const sb_chat *chat, const char *messages_json, int32_t **ids, size_t *n, sb_error *err) {
    return sb_chat_tokenize_tools(chat, messages_json, NULL, ids, n, err);
}

sb_status sb_chat_tokenize_tools(const sb_chat *chat, const char *messages_json, const char *tools_json, int32_t **ids,
                                 size_t *n, sb_error *err) {
    *ids = NULL;
    *n = 0;
    sb_tpl_chat c = {
        .messages_json = messages_json,
        .tools_json = tools_json,
        .add_generation_prompt = true,
        .bos_token = chat->bos,
        .eos_token = chat->eos,
    };
    char *text;
    size_t len;
    sb_status st = sb_tpl_render_chat(chat->tpl, &c, &text, &len, err);
    if (st != SB_OK)
        return st;
    /* Templates that write the BOS text themselves (Llama 3, Mistral, ...)
     * must not get a second BOS token; llama.cpp strips it likewise. */
    bool add_bos = !(chat->bos && chat->bos[0] && strncmp(text, chat->bos, strlen(chat->bos)) == 0);
    size_t need = 0;
    sb_tokenize(chat->model, text, len, add_bos, true, NULL, 0, &need, NULL);
    if (!(*ids = sb_malloc((need + 1) * sizeof(int32_t))))
        st = sb_fail(err, SB_ERR_NOMEM, "chat prompt: out of memory");
    else
        st = sb_tokenize(chat->model, text, len, add_bos, true, *ids, need, n, err);
    sb_free(text);
    if (st != SB_OK) {
        sb_free(*ids);
        *ids = NULL;
    }
    return st;
}
