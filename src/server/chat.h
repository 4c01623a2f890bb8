/*
 * chat.h - turns chat messages into the prompt text the model was trained
 * on. Built once at load from the model file (its tokenizer.chat_template),
 * then rendered from any number of threads.
 */
#ifndef SB_SRV_CHAT_H
#define SB_SRV_CHAT_H

#include <stddef.h>

#include <cjson/cJSON.h>

#include "switchboard.h"

typedef struct sb_srv_chat sb_srv_chat;

/* Prepares the prompt formatter for `model` (borrowed; must outlive it). */
sb_status sb_srv_chat_create(const sb_model_t *model, sb_srv_chat **out, sb_error *err);
void sb_srv_chat_free(sb_srv_chat *chat);
/* What renders prompts, for the start-up log ("ChatML (built in)"). */
const char *sb_srv_chat_describe(const sb_srv_chat *chat);

/* Renders `messages` (a JSON array of {"role", "content": string} objects,
 * already validated) followed by the assistant's generation prompt. *out is
 * sb_malloc'd and NUL-terminated (*len bytes without it); the caller frees
 * it with sb_free. */
sb_status sb_srv_chat_render(const sb_srv_chat *chat, const cJSON *messages, char **out, size_t *len,
                             sb_error *err);

#endif
