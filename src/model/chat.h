/*
 * chat.h - turns chat messages into the prompt tokens a model was trained
 * on: its tokenizer.chat_template (parsed once) or, when the file has none
 * or one the template engine cannot parse, the built-in ChatML template,
 * rendered with the generation prompt and tokenized with special tokens
 * parsed and BOS added exactly once. Used by `switchboard run --chat` and
 * the server. A sb_chat is read-only after creation and may be used from
 * any number of threads.
 */
#ifndef SB_CHAT_H
#define SB_CHAT_H

#include <stddef.h>
#include <stdint.h>

#include "switchboard.h"

typedef struct sb_chat sb_chat;

/* Prepares the formatter for `model` (borrowed; must outlive it). */
sb_status sb_chat_create(const sb_model_t *model, sb_chat **out, sb_error *err);
/* The same with the template `src` (len bytes; `origin` names it in
 * messages, e.g. its file) instead of the model's: one that does not parse
 * is an error, not a fallback to ChatML. */
sb_status sb_chat_create_from(const sb_model_t *model, const char *src, size_t len, const char *origin, sb_chat **out,
                              sb_error *err);
void sb_chat_free(sb_chat *chat);
/* What renders prompts, for logs ("the model's chat template", ...). */
const char *sb_chat_describe(const sb_chat *chat);

/* Renders `messages_json` (a JSON array of {"role", "content"} objects)
 * followed by the assistant's generation prompt, and tokenizes it. *ids is
 * sb_malloc'd (freed by the caller with sb_free), *n its length. Fails with
 * SB_ERR_INVALID_ARG when the template cannot render these messages
 * (raise_exception, bad JSON) and SB_ERR_UNSUPPORTED for template features
 * the engine lacks; err says why. */
sb_status sb_chat_tokenize(const sb_chat *chat, const char *messages_json, int32_t **ids, size_t *n, sb_error *err);
/* The same with the request's tools (a JSON array, or NULL for none) given
 * to the template, which writes them into the prompt. Messages may carry
 * tool_calls and tool results (role "tool"). */
sb_status sb_chat_tokenize_tools(const sb_chat *chat, const char *messages_json, const char *tools_json, int32_t **ids,
                                 size_t *n, sb_error *err);
/* The template's Jinja text (the built-in ChatML when the model has none). */
const char *sb_chat_source(const sb_chat *chat);

#endif
