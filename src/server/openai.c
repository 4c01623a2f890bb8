/*
 * openai.c - OpenAI request parsing and response building (see openai.h).
 *
 * Sections: errors; field access with type checks; prompts (chat messages,
 * completion prompts, embedding inputs) to tokens; the three request
 * parsers; whole answers; streamed chunks; models.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include <cjson/cJSON.h>
#include <utf8proc.h>

#include "base/base.h"
#include "server/openai.h"
#include "server/server-impl.h"
#include "server/structured.h"
#include "server/tools.h"

/* ---- errors -------------------------------------------------------------- */

const char *sb_oai_quote(const char *s, size_t len, size_t max, char *out, size_t cap) {
    static const char more[] = "...";
    size_t n = 0, limit = SB_MIN(max, cap - sizeof more); /* room for "..." and the NUL */
    for (size_t i = 0; i < len;) {
        utf8proc_int32_t cp;
        utf8proc_ssize_t k = utf8proc_iterate((const utf8proc_uint8_t *)s + i, (utf8proc_ssize_t)(len - i), &cp);
        if (k < 0) { /* an invalid byte stands for itself as U+FFFD */
            cp = 0xFFFD;
            k = 1;
        }
        utf8proc_uint8_t enc[4];
        utf8proc_ssize_t m = utf8proc_encode_char(cp, enc);
        if (n + (size_t)m > limit) {
            memcpy(out + n, more, sizeof more);
            return out;
        }
        memcpy(out + n, enc, (size_t)m);
        n += (size_t)m;
        i += (size_t)k;
    }
    out[n] = '\0';
    return out;
}

void sb_oai_err_set(sb_oai_err *e, unsigned status, const char *type, const char *code, const char *param,
                    const char *fmt, ...) {
    e->status = status;
    e->type = type;
    e->code = code;
    /* A param may be a path through the client's keys: valid UTF-8 too. */
    param = param ? param : "";
    sb_oai_quote(param, strlen(param), sizeof e->param - 4, e->param, sizeof e->param);
    char raw[sizeof e->message];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(raw, sizeof raw, fmt, ap);
    va_end(ap);
    /* Whatever a message quotes (the client's bytes, a tokenizer's or a
     * template's message), the answer is valid UTF-8 and cut between
     * characters. */
    sb_oai_quote(raw, strlen(raw), sizeof e->message - 4, e->message, sizeof e->message);
}

/* Appends the JSON text of item (unformatted) to out and deletes it. */
static void put_json(sb_srv_buf *out, cJSON *item) {
    char *s = item ? cJSON_PrintUnformatted(item) : NULL;
    if (s)
        sb_srv_buf_puts(out, s);
    else
        out->failed = true;
    cJSON_free(s);
    cJSON_Delete(item);
}

void sb_oai_err_json(const sb_oai_err *e, sb_srv_buf *out) {
    cJSON *root = cJSON_CreateObject();
    cJSON *o = cJSON_AddObjectToObject(root, "error");
    cJSON_AddStringToObject(o, "message", e->message);
    cJSON_AddStringToObject(o, "type", e->type ? e->type : "invalid_request_error");
    if (e->param[0])
        cJSON_AddStringToObject(o, "param", e->param);
    else
        cJSON_AddNullToObject(o, "param");
    if (e->code)
        cJSON_AddStringToObject(o, "code", e->code);
    else
        cJSON_AddNullToObject(o, "code");
    put_json(out, root);
}

static bool invalid(sb_oai_err *e, const char *param, const char *code, const char *fmt, ...) SB_PRINTF(4, 5);
static bool invalid(sb_oai_err *e, const char *param, const char *code, const char *fmt, ...) {
    char msg[sizeof e->message];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    sb_oai_err_set(e, 400, "invalid_request_error", code, param, "%s", msg);
    return false;
}

/* ---- fields ---------------------------------------------------------------- */

/* The member `name` of obj, or NULL if absent or null. */
static const cJSON *field(const cJSON *obj, const char *name) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, name);
    return v && !cJSON_IsNull(v) ? v : NULL;
}

static bool bad_type(sb_oai_err *e, const char *param, const char *want, const cJSON *v) {
    return invalid(e, param, "invalid_type", "'%s' must be %s, got %s", param, want, sb__json_kind(v));
}

static bool get_float(const cJSON *obj, const char *name, double lo, double hi, float *out, sb_oai_err *e) {
    const cJSON *v = field(obj, name);
    if (!v)
        return true;
    if (!cJSON_IsNumber(v))
        return bad_type(e, name, "a number", v);
    if (!(v->valuedouble >= lo && v->valuedouble <= hi))
        return invalid(e, name, "invalid_value", "'%s' must be between %g and %g, got %g", name, lo, hi,
                       v->valuedouble);
    *out = (float)v->valuedouble;
    return true;
}

static bool is_integer(const cJSON *v) { return cJSON_IsNumber(v) && v->valuedouble == floor(v->valuedouble); }

/* *present (if not NULL) tells whether the field was given. */
static bool get_int(const cJSON *obj, const char *name, double lo, double hi, int64_t *out, bool *present,
                    sb_oai_err *e) {
    const cJSON *v = field(obj, name);
    if (present)
        *present = v != NULL;
    if (!v)
        return true;
    if (!is_integer(v))
        return bad_type(e, name, "an integer", v);
    if (!(v->valuedouble >= lo && v->valuedouble <= hi))
        return invalid(e, name, "invalid_value", "'%s' must be between %.0f and %.0f, got %.0f", name, lo, hi,
                       v->valuedouble);
    *out = (int64_t)v->valuedouble;
    return true;
}

static bool get_bool(const cJSON *obj, const char *name, bool *out, sb_oai_err *e) {
    const cJSON *v = field(obj, name);
    if (!v)
        return true;
    if (!cJSON_IsBool(v))
        return bad_type(e, name, "a boolean", v);
    *out = cJSON_IsTrue(v);
    return true;
}

static bool check_string(const cJSON *obj, const char *name, sb_oai_err *e) {
    const cJSON *v = field(obj, name);
    return !v || cJSON_IsString(v) || bad_type(e, name, "a string", v);
}

/* Given a value that asks for something: not null, false, "" or empty. */
static bool asks(const cJSON *v) {
    if (!v || cJSON_IsNull(v) || cJSON_IsFalse(v))
        return false;
    if (cJSON_IsString(v))
        return v->valuestring[0] != '\0';
    if (cJSON_IsArray(v) || cJSON_IsObject(v))
        return v->child != NULL;
    return true;
}

static bool refuse_unsupported(const cJSON *root, const char *const *names, sb_oai_err *e) {
    for (; *names; names++)
        if (asks(cJSON_GetObjectItemCaseSensitive(root, *names)))
            return invalid(e, *names, "unsupported_parameter", "'%s' is not supported by switchboard", *names);
    return true;
}

/* ---- prompts ------------------------------------------------------------- */

/* Tokenizes text into a new list, BOS per the model when add_bos. */
static bool tokenize(const sb_model_t *model, const char *text, size_t len, bool add_bos, bool parse_special, int32_t **ids,
                     int32_t *n, const char *param, sb_oai_err *e) {
    size_t need = 0;
    sb_error err;
    int32_t probe[1];
    sb_status st = sb_tokenize(model, text, len, add_bos, parse_special, probe, 0, &need, &err);
    if (st != SB_OK && st != SB_ERR_INVALID_ARG)
        return invalid(e, param, "invalid_value", "'%s' cannot be tokenized: %s", param, err.msg);
    if (need == 0)
        return invalid(e, param, "invalid_value", "'%s' is empty", param);
    if (need > INT32_MAX / 2 || !(*ids = sb_malloc(need * sizeof(int32_t)))) {
        sb_oai_err_set(e, 500, "server_error", NULL, param, "out of memory tokenizing '%s'", param);
        return false;
    }
    if (sb_tokenize(model, text, len, add_bos, parse_special, *ids, need, &need, &err) != SB_OK) {
        sb_free(*ids);
        *ids = NULL;
        return invalid(e, param, "invalid_value", "'%s' cannot be tokenized: %s", param, err.msg);
    }
    *n = (int32_t)need;
    return true;
}

/* An array of token ids, each checked against the vocabulary. */
static bool token_list(const sb_model_t *model, const cJSON *arr, int32_t **ids, int32_t *n, const char *param, sb_oai_err *e) {
    int size = cJSON_GetArraySize(arr);
    if (size == 0)
        return invalid(e, param, "invalid_value", "'%s' is empty", param);
    if (!(*ids = sb_malloc((size_t)size * sizeof(int32_t)))) {
        sb_oai_err_set(e, 500, "server_error", NULL, param, "out of memory for '%s'", param);
        return false;
    }
    int32_t n_vocab = sb_model_n_vocab(model);
    int i = 0;
    const cJSON *t;
    cJSON_ArrayForEach(t, arr) {
        if (!is_integer(t) || t->valuedouble < 0 || t->valuedouble >= n_vocab) {
            sb_free(*ids);
            *ids = NULL;
            if (!is_integer(t))
                return invalid(e, param, "invalid_type", "'%s[%d]' must be a token id (an integer), got %s", param,
                               i, sb__json_kind(t));
            return invalid(e, param, "invalid_value", "'%s[%d]' is %.0f, not a token id of this model (0..%d)", param,
                           i, t->valuedouble, (int)n_vocab - 1);
        }
        (*ids)[i++] = (int32_t)t->valuedouble;
    }
    *n = size;
    return true;
}

static bool alloc_prompts(sb_oai_req *r, int32_t n, const char *param, sb_oai_err *e) {
    r->prompts = sb_calloc((size_t)n, sizeof *r->prompts);
    r->prompt_lens = sb_calloc((size_t)n, sizeof *r->prompt_lens);
    if (!r->prompts || !r->prompt_lens) {
        sb_oai_err_set(e, 500, "server_error", NULL, param, "out of memory for %d prompts", (int)n);
        return false;
    }
    r->n_prompts = n;
    return true;
}

/* A completion prompt or embedding input: a string, an array of strings, an
 * array of token ids, or an array of token-id arrays. */
static bool parse_prompts(const cJSON *root, const char *name, sb_oai_req *r, sb_oai_err *e) {
    const sb_model_t *model = sb_held_model(r->held);
    const cJSON *v = field(root, name);
    if (v && cJSON_IsObject(v) && r->library_text) /* a reference to the prompt library, rendered */
        return alloc_prompts(r, 1, name, e) && tokenize(model, r->library_text, strlen(r->library_text), true, true,
                                                        &r->prompts[0], &r->prompt_lens[0], name, e);
    if (!v)
        return invalid(e, name, "missing_required_parameter", "you must provide '%s'", name);
    const char *want = "a string, an array of strings, an array of token ids or an array of token-id arrays";
    if (cJSON_IsString(v)) {
        if (!alloc_prompts(r, 1, name, e))
            return false;
        return tokenize(model, v->valuestring, strlen(v->valuestring), true, true, &r->prompts[0], &r->prompt_lens[0],
                        name, e);
    }
    if (!cJSON_IsArray(v))
        return bad_type(e, name, want, v);
    int size = cJSON_GetArraySize(v);
    if (size == 0)
        return invalid(e, name, "invalid_value", "'%s' is an empty array", name);
    if (cJSON_IsNumber(v->child)) {
        if (!alloc_prompts(r, 1, name, e))
            return false;
        return token_list(model, v, &r->prompts[0], &r->prompt_lens[0], name, e);
    }
    if (size > SB_OAI_MAX_CHOICES)
        return invalid(e, name, "invalid_value", "'%s' has %d entries; at most %d are allowed", name, size,
                       SB_OAI_MAX_CHOICES);
    if (!alloc_prompts(r, size, name, e))
        return false;
    int i = 0;
    const cJSON *item;
    cJSON_ArrayForEach(item, v) {
        char param[64];
        snprintf(param, sizeof param, "%s[%d]", name, i);
        if (cJSON_IsString(item)) {
            if (!tokenize(model, item->valuestring, strlen(item->valuestring), true, true, &r->prompts[i],
                          &r->prompt_lens[i], param, e))
                return false;
        } else if (cJSON_IsArray(item)) {
            if (!token_list(model, item, &r->prompts[i], &r->prompt_lens[i], param, e))
                return false;
        } else {
            return bad_type(e, param, "a string or an array of token ids", item);
        }
        i++;
    }
    return true;
}

/* Validates chat messages into a new array of {"role", "content": string}.
 * `optional`: a library prompt stands before them, so there may be none. */
static cJSON *normalize_messages(const cJSON *root, bool optional, sb_oai_err *e) {
    const cJSON *msgs = field(root, "messages");
    if (!msgs && optional)
        return cJSON_CreateArray();
    if (!msgs) {
        invalid(e, "messages", "missing_required_parameter", "you must provide 'messages'");
        return NULL;
    }
    if (!cJSON_IsArray(msgs)) {
        bad_type(e, "messages", "an array", msgs);
        return NULL;
    }
    if (!msgs->child) {
        invalid(e, "messages", "invalid_value", "'messages' must not be empty");
        return NULL;
    }
    cJSON *out = cJSON_CreateArray();
    sb_srv_buf text = {0};
    int i = 0;
    const cJSON *m;
    cJSON_ArrayForEach(m, msgs) {
        char param[96];
        snprintf(param, sizeof param, "messages[%d]", i);
        if (!cJSON_IsObject(m)) {
            bad_type(e, param, "an object", m);
            goto fail;
        }
        snprintf(param, sizeof param, "messages[%d].role", i);
        const cJSON *role = field(m, "role");
        if (!role) {
            invalid(e, param, "missing_required_parameter", "'%s' is missing", param);
            goto fail;
        }
        if (!cJSON_IsString(role)) {
            bad_type(e, param, "a string", role);
            goto fail;
        }
        const char *r = role->valuestring;
        if (strcmp(r, "function") == 0) {
            invalid(e, param, "unsupported_value", "'%s' is 'function' (deprecated): use 'tool' messages", param);
            goto fail;
        }
        if (strcmp(r, "system") && strcmp(r, "developer") && strcmp(r, "user") && strcmp(r, "assistant") &&
            strcmp(r, "tool")) {
            char q[80];
            invalid(e, param, "invalid_value",
                    "'%s' must be one of system, developer, user, assistant, tool; got '%s'", param,
                    sb_oai_quote(r, strlen(r), 64, q, sizeof q));
            goto fail;
        }
        static const char *const unsupported[] = {"function_call", "audio", NULL};
        for (const char *const *u = unsupported; *u; u++)
            if (asks(cJSON_GetObjectItemCaseSensitive(m, *u))) {
                snprintf(param, sizeof param, "messages[%d].%s", i, *u);
                invalid(e, param, "unsupported_parameter", "'%s' is not supported by switchboard", param);
                goto fail;
            }
        snprintf(param, sizeof param, "messages[%d].content", i);
        const cJSON *content = field(m, "content");
        sb_srv_buf_clear(&text);
        if (!content) {
            if (strcmp(r, "assistant") != 0) {
                invalid(e, param, "missing_required_parameter", "'%s' is missing", param);
                goto fail;
            }
        } else if (cJSON_IsString(content)) {
            sb_srv_buf_puts(&text, content->valuestring);
        } else if (cJSON_IsArray(content)) {
            int j = 0;
            const cJSON *part;
            cJSON_ArrayForEach(part, content) {
                snprintf(param, sizeof param, "messages[%d].content[%d]", i, j);
                const cJSON *type = cJSON_IsObject(part) ? field(part, "type") : NULL;
                const cJSON *t = cJSON_IsObject(part) ? field(part, "text") : NULL;
                if (!cJSON_IsObject(part) || !cJSON_IsString(type)) {
                    invalid(e, param, "invalid_type", "'%s' must be an object with a string 'type'", param);
                    goto fail;
                }
                if (strcmp(type->valuestring, "text") != 0) {
                    char q[80];
                    invalid(e, param, "unsupported_value",
                            "'%s' has type '%s'; switchboard supports only 'text' content parts", param,
                            sb_oai_quote(type->valuestring, strlen(type->valuestring), 64, q, sizeof q));
                    goto fail;
                }
                if (!cJSON_IsString(t)) {
                    snprintf(param, sizeof param, "messages[%d].content[%d].text", i, j);
                    bad_type(e, param, "a string", t ? t : part);
                    goto fail;
                }
                sb_srv_buf_puts(&text, t->valuestring);
                j++;
            }
        } else {
            bad_type(e, param, "a string or an array of content parts", content);
            goto fail;
        }
        snprintf(param, sizeof param, "messages[%d].name", i);
        const cJSON *name = field(m, "name");
        if (name && !cJSON_IsString(name)) {
            bad_type(e, param, "a string", name);
            goto fail;
        }
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "role", strcmp(r, "developer") == 0 ? "system" : r);
        cJSON_AddStringToObject(o, "content", text.p ? text.p : "");
        cJSON_AddItemToArray(out, o);
        if (!sb__tools_message(m, o, i, e))
            goto fail;
        i++;
    }
    if (text.failed) {
        sb_oai_err_set(e, 500, "server_error", NULL, "messages", "out of memory reading 'messages'");
        goto fail;
    }
    sb_srv_buf_free(&text);
    return out;
fail:
    sb_srv_buf_free(&text);
    cJSON_Delete(out);
    return NULL;
}

/* Puts a message with `role` and `content` at position `at` of msgs. */
static void insert_message(cJSON *msgs, int at, const char *role, const char *content) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "role", role);
    cJSON_AddStringToObject(o, "content", content);
    cJSON_InsertItemInArray(msgs, at, o);
}

/* The messages the template renders: the library prompt's text first (as
 * the user's), and the model's system prompt when the request has none. */
static cJSON *chat_messages(const cJSON *root, const sb_oai_req *r, sb_oai_err *e) {
    cJSON *msgs = normalize_messages(root, r->library_text != NULL, e);
    if (!msgs)
        return NULL;
    if (r->library_text)
        insert_message(msgs, 0, "user", r->library_text);
    const char *sys = sb_reg_lease_config(r->lease)->system_prompt;
    const cJSON *first = cJSON_GetArrayItem(msgs, 0);
    const cJSON *role = first ? cJSON_GetObjectItemCaseSensitive(first, "role") : NULL;
    if (sys && !(cJSON_IsString(role) && strcmp(role->valuestring, "system") == 0))
        insert_message(msgs, 0, "system", sys);
    return msgs;
}

/* Renders and tokenizes the chat prompt into r->prompts[0]. */
static bool chat_prompt(const cJSON *root, sb_oai_req *r, sb_oai_err *e) {
    cJSON *msgs = chat_messages(root, r, e);
    if (!msgs)
        return false;
    char *json = cJSON_PrintUnformatted(msgs);
    cJSON_Delete(msgs);
    if (!json || !alloc_prompts(r, 1, "messages", e)) {
        if (!json)
            sb_oai_err_set(e, 500, "server_error", NULL, "messages", "out of memory");
        cJSON_free(json);
        return false;
    }
    int32_t *ids;
    size_t n;
    sb_error err;
    sb_status st = sb_chat_tokenize_tools(sb_reg_lease_chat(r->lease), json, r->tools_json, &ids, &n, &err);
    cJSON_free(json);
    if (st == SB_ERR_NOMEM) {
        sb_oai_err_set(e, 500, "server_error", NULL, "messages", "%s", err.msg);
        return false;
    }
    if (st != SB_OK)
        return invalid(e, "messages", "invalid_value", "the chat template cannot render these messages: %s", err.msg);
    if (n == 0) {
        sb_free(ids);
        return invalid(e, "messages", "invalid_value", "'messages' renders to an empty prompt");
    }
    r->prompts[0] = ids;
    r->prompt_lens[0] = (int32_t)n;
    return true;
}

/* ---- requests ------------------------------------------------------------ */

static bool parse_stop(const cJSON *root, sb_oai_req *r, sb_oai_err *e) {
    const cJSON *v = field(root, "stop");
    if (!v)
        return true;
    const char *want = "a string or an array of strings";
    const cJSON *item = v;
    if (cJSON_IsArray(v)) {
        if (cJSON_GetArraySize(v) > SB_OAI_MAX_STOPS)
            return invalid(e, "stop", "invalid_value", "'stop' has %d entries; at most %d are allowed",
                           cJSON_GetArraySize(v), SB_OAI_MAX_STOPS);
        item = v->child;
    } else if (!cJSON_IsString(v)) {
        return bad_type(e, "stop", want, v);
    }
    for (; item; item = cJSON_IsArray(v) ? item->next : NULL) {
        if (!cJSON_IsString(item))
            return bad_type(e, "stop", want, item);
        if (!item->valuestring[0])
            continue;
        if (!(r->stops[r->n_stops] = sb_strndup(item->valuestring, strlen(item->valuestring)))) {
            sb_oai_err_set(e, 500, "server_error", NULL, "stop", "out of memory for 'stop'");
            return false;
        }
        r->n_stops++;
    }
    return true;
}

/* Default stop strings (the registry's), replacing earlier defaults. */
static bool copy_stops(const sb_regfile_params *p, sb_oai_req *r, sb_oai_err *e) {
    for (size_t i = 0; i < r->n_stops; i++)
        sb_free(r->stops[i]);
    r->n_stops = 0;
    for (size_t i = 0; i < p->n_stop && i < SB_OAI_MAX_STOPS; i++) {
        if (!(r->stops[i] = sb_strndup(p->stop[i], strlen(p->stop[i])))) {
            sb_oai_err_set(e, 500, "server_error", NULL, "stop", "out of memory for 'stop'");
            return false;
        }
        r->n_stops++;
    }
    return true;
}

/* The sampling and length parameters chat and completions share. */
static bool parse_generation(sb_srv *srv, const cJSON *root, sb_oai_req *r, sb_oai_err *e) {
    sb_sampler_params *sp = &r->sampling;
    *sp = sb_sampler_default_params();
    /* OpenAI's defaults: plain sampling at temperature 1, no truncation. */
    sp->temperature = 1.0f;
    sp->top_k = 0;
    sp->top_p = 1.0f;
    sp->min_p = 0.0f;
    /* Then the model's defaults from the registry, then the library prompt's; the request's own fields last. */
    const sb_regfile_params *layers[] = {&sb_reg_lease_config(r->lease)->params, r->library ? &r->library->params : NULL};
    bool seed_given = false, max_given = false;
    int64_t seed = 0;
    for (size_t i = 0; i < SB_ARRAY_LEN(layers); i++) {
        if (!layers[i])
            continue;
        sb_regfile_params_apply(layers[i], sp);
        if (layers[i]->set & SB_PARAM_MAX_TOKENS)
            r->max_tokens = layers[i]->max_tokens;
        if (layers[i]->set & SB_PARAM_SEED) {
            seed = (int64_t)layers[i]->seed;
            seed_given = true;
        }
        if ((layers[i]->set & SB_PARAM_STOP) && !field(root, "stop") && !copy_stops(layers[i], r, e))
            return false;
    }
    int64_t top_k = sp->top_k, n = 1, max_tokens = r->max_tokens, max_completion = 0;
    if (!get_float(root, "temperature", 0, 2, &sp->temperature, e) || !get_float(root, "top_p", 0, 1, &sp->top_p, e) ||
        !get_float(root, "min_p", 0, 1, &sp->min_p, e) ||
        !get_float(root, "presence_penalty", -2, 2, &sp->presence_penalty, e) ||
        !get_float(root, "frequency_penalty", -2, 2, &sp->frequency_penalty, e) ||
        !get_float(root, "repetition_penalty", 0.01, 10, &sp->repeat_penalty, e) ||
        !get_int(root, "top_k", 0, 1 << 30, &top_k, NULL, e) || !get_int(root, "n", 1, SB_OAI_MAX_CHOICES, &n, NULL, e) ||
        !get_int(root, "max_tokens", 1, 1 << 30, &max_tokens, &max_given, e) ||
        !get_int(root, "max_completion_tokens", 1, 1 << 30, &max_completion, &max_given, e) ||
        !get_int(root, "seed", -9.2e18, 9.2e18, &seed, &seed_given, e) || !get_bool(root, "stream", &r->stream, e) ||
        !check_string(root, "user", e) || !parse_stop(root, r, e))
        return false;
    if (max_given) /* max_completion_tokens, the newer name, wins over max_tokens */
        max_tokens = max_completion;
    sp->top_k = (int32_t)top_k;
    sp->seed = seed_given ? (uint64_t)seed : sb__srv_random(srv);
    r->n = (int32_t)n;
    r->max_tokens = (int32_t)max_tokens;
    const cJSON *so = field(root, "stream_options");
    if (so) {
        if (!cJSON_IsObject(so))
            return bad_type(e, "stream_options", "an object", so);
        const cJSON *iu = field(so, "include_usage");
        if (iu && !cJSON_IsBool(iu))
            return bad_type(e, "stream_options.include_usage", "a boolean", iu);
        r->include_usage = cJSON_IsTrue(iu);
    }
    return true;
}

/* A reference to the prompt library ({"id", "version", "variables"}) in
 * `name` (chat: "prompt"; completions: "prompt" when it is an object):
 * looked up and rendered into r->library_text. */
static bool library_prompt(sb_srv *srv, const cJSON *root, const char *name, sb_oai_req *r, sb_oai_err *e) {
    const cJSON *ref = field(root, name);
    if (!ref || !cJSON_IsObject(ref))
        return true;
    const cJSON *id = field(ref, "id"), *version = field(ref, "version"), *vars = field(ref, "variables");
    char param[64], ver[64] = "";
    snprintf(param, sizeof param, "%s.id", name);
    if (!cJSON_IsString(id))
        return id ? bad_type(e, param, "a string", id) : invalid(e, param, "missing_required_parameter", "'%s' is missing", param);
    if (cJSON_IsNumber(version))
        snprintf(ver, sizeof ver, "%.15g", version->valuedouble);
    else if (cJSON_IsString(version))
        snprintf(ver, sizeof ver, "%.63s", version->valuestring);
    else if (version && !cJSON_IsNull(version))
        return bad_type(e, "prompt.version", "a string or a number", version);
    r->reg = sb__switchboard_registry(srv->sb);
    r->library_file = sb_registry_file_acquire(r->reg);
    sb_error err;
    if (sb_prompt_lookup(r->library_file, id->valuestring, ver[0] ? ver : NULL, &r->library, &err) != SB_OK) {
        sb_oai_err_set(e, 404, "invalid_request_error", "prompt_not_found", param, "%s", err.msg);
        return false;
    }
    if (sb_prompt_render(r->library, vars, &r->library_text, &err) != SB_OK) {
        snprintf(param, sizeof param, "%s.variables", name);
        return invalid(e, param, "invalid_value", "%s", err.msg);
    }
    return true;
}

/* "keep_alive" as Ollama takes it: seconds, or a duration ("5m"); negative
 * keeps the model loaded, 0 unloads it when the request ends. */
static bool get_keep_alive(const cJSON *root, sb_oai_req *r, sb_oai_err *e) {
    const cJSON *v = field(root, "keep_alive");
    int64_t ms;
    if (!v)
        return true;
    if (cJSON_IsNumber(v) && isfinite(v->valuedouble) && fabs(v->valuedouble) < 1e12)
        ms = v->valuedouble < 0 ? SB_REGFILE_FOREVER : (int64_t)(v->valuedouble * 1e3);
    else if (!cJSON_IsString(v) || !sb_regfile_parse_duration(v->valuestring, &ms))
        return invalid(e, "keep_alive", "invalid_value",
                       "'keep_alive' must be a number of seconds or a duration such as \"5m\" or \"-1\"");
    r->keep_alive_s = ms < 0 ? -1.0 : (double)ms / 1e3;
    return true;
}

/* 404 for a name the registry does not know: the name quoted (the
 * client's bytes, cut on a character), then the names there are. */
static void not_found(sb_srv *srv, const char *name, sb_oai_err *e) {
    char q[216], names[1024], list[400] = "";
    int32_t n = sb_switchboard_models(srv->sb, names, sizeof names);
    size_t len = 0;
    const char *p = names;
    for (int32_t i = 0; i < n && len + 8 < sizeof list; i++, p += strlen(p) + 1) {
        int w = snprintf(list + len, sizeof list - len, "%s'%s'", i ? ", " : "", p);
        len = w < 0 ? sizeof list : SB_MIN(sizeof list - 1, len + (size_t)w);
    }
    sb_oai_err_set(e, 404, "invalid_request_error", "model_not_found", "model",
                   "The model '%s' does not exist; available: %s", sb_oai_quote(name, strlen(name), 200, q, sizeof q),
                   n ? list : "none (the registry is empty)");
}

/* The model that serves: the request's "model" (or its library prompt's),
 * routed by the registry, loading it if needed. */
static bool route_model(sb_srv *srv, const cJSON *root, sb_oai_req *r, sb_oai_err *e) {
    const cJSON *m = field(root, "model"), *user = field(root, "user");
    const char *name = cJSON_IsString(m) ? m->valuestring : !m && r->library ? r->library->model : NULL;
    if (!name && !m)
        return invalid(e, "model", "missing_required_parameter", "you must provide a model parameter");
    if (!name)
        return bad_type(e, "model", "a string", m);
    if (user && !cJSON_IsString(user))
        return bad_type(e, "user", "a string", user);
    sb_error err;
    sb_status st = sb_switchboard_acquire(srv->sb, name, user ? user->valuestring : NULL, &r->held, &err);
    if (st == SB_ERR_MODEL_NOT_FOUND)
        not_found(srv, name, e);
    else if (st == SB_ERR_OVER_BUDGET)
        sb_oai_err_set(e, 507, "server_error", "insufficient_storage", "model", "%s", err.msg);
    else if (st == SB_ERR_NOMEM)
        sb_oai_err_set(e, 500, "server_error", NULL, "model", "%s", err.msg);
    else if (st != SB_OK)
        sb_oai_err_set(e, 503, "server_error", "model_unavailable", "model", "%s", err.msg);
    if (st != SB_OK)
        return false;
    r->lease = sb__held_lease(r->held);
    return get_keep_alive(root, r, e);
}

static bool parse_chat(sb_srv *srv, const cJSON *root, sb_oai_req *r, sb_oai_err *e) {
    static const char *const unsupported[] = {"functions", "function_call", "audio", "prediction", "web_search_options",
                                              NULL};
    if (!refuse_unsupported(root, unsupported, e) || !library_prompt(srv, root, "prompt", r, e) ||
        !route_model(srv, root, r, e))
        return false;
    const cJSON *mod = field(root, "modalities");
    if (mod) {
        if (!cJSON_IsArray(mod))
            return bad_type(e, "modalities", "an array", mod);
        const cJSON *x;
        cJSON_ArrayForEach(x, mod) if (!cJSON_IsString(x) || strcmp(x->valuestring, "text") != 0) return invalid(
            e, "modalities", "unsupported_value", "'modalities' other than 'text' are not supported by switchboard");
    }
    int64_t top = 0;
    r->max_tokens = 0; /* chat: until the end of generation or the context */
    if (!parse_generation(srv, root, r, e) || !get_bool(root, "logprobs", &r->logprobs, e) ||
        !get_int(root, "top_logprobs", 0, 20, &top, NULL, e) || !sb__srv_parse_constraints(srv, root, true, r, e) ||
        !sb__srv_parse_tools(srv, root, r, e))
        return false;
    if (top > 0 && !r->logprobs)
        return invalid(e, "top_logprobs", "invalid_value", "'top_logprobs' needs 'logprobs' set to true");
    r->top_logprobs = (int32_t)top;
    if (!chat_prompt(root, r, e))
        return false;
    /* Without max_tokens, a chat answer may run to the end of the model's context. */
    int32_t n_ctx = sb_held_n_ctx(r->held);
    if (r->max_tokens <= 0 && n_ctx > r->prompt_lens[0])
        r->max_tokens = n_ctx - r->prompt_lens[0];
    return true;
}

static bool parse_completion(sb_srv *srv, const cJSON *root, sb_oai_req *r, sb_oai_err *e) {
    static const char *const unsupported[] = {"suffix", "echo", NULL};
    if (!refuse_unsupported(root, unsupported, e) || !library_prompt(srv, root, "prompt", r, e) ||
        !route_model(srv, root, r, e))
        return false;
    int64_t lp = 0, best_of = 1;
    bool lp_given = false;
    r->max_tokens = 16; /* OpenAI's default for completions */
    if (!parse_generation(srv, root, r, e) || !get_int(root, "logprobs", 0, 20, &lp, &lp_given, e) ||
        !get_int(root, "best_of", 1, SB_OAI_MAX_CHOICES, &best_of, NULL, e) ||
        !sb__srv_parse_constraints(srv, root, false, r, e))
        return false;
    if (best_of != 1 && best_of != r->n)
        return invalid(e, "best_of", "unsupported_value", "'best_of' other than n is not supported by switchboard");
    r->logprobs = lp_given;
    r->top_logprobs = (int32_t)lp;
    return parse_prompts(root, "prompt", r, e);
}

static bool parse_embedding(sb_srv *srv, const cJSON *root, sb_oai_req *r, sb_oai_err *e) {
    if (!route_model(srv, root, r, e))
        return false;
    const cJSON *fmt = field(root, "encoding_format");
    if (fmt) {
        if (!cJSON_IsString(fmt))
            return bad_type(e, "encoding_format", "a string", fmt);
        if (strcmp(fmt->valuestring, "base64") == 0)
            r->base64 = true;
        else if (strcmp(fmt->valuestring, "float") != 0)
            return invalid(e, "encoding_format", "invalid_value", "'encoding_format' must be 'float' or 'base64'");
    }
    const int32_t n_embd = sb_model_n_embd(sb_held_model(r->held));
    int64_t dims = n_embd;
    if (!get_int(root, "dimensions", 1, 1 << 30, &dims, NULL, e))
        return false;
    if (dims != n_embd)
        return invalid(e, "dimensions", "unsupported_value",
                       "'dimensions' %lld is not supported: this model's embeddings have %d", (long long)dims,
                       (int)n_embd);
    r->n = 1;
    r->sampling = sb_sampler_default_params();
    return parse_prompts(root, "input", r, e);
}

/* ---- NUL characters -------------------------------------------------------- */

/* cJSON keeps strings NUL-terminated, so a NUL inside one (a raw 0 byte or
 * \u0000) would silently cut a prompt, a role or a model name short: such
 * requests are refused, naming the field. */

/* Offset of the first NUL the body's strings would hold, or len if none. */
static size_t find_nul(const char *body, size_t len) {
    for (size_t i = 0; i < len; i++) {
        if (body[i] == '\0' || (body[i] == '\\' && len - i >= 6 && memcmp(body + i + 1, "u0000", 5) == 0))
            return i;
        if (body[i] == '\\')
            i++; /* the escaped character is no escape itself */
    }
    return len;
}

/* Appends ".key" or "[i]" to path. */
static void path_push(char *path, size_t cap, const cJSON *parent, const cJSON *child, int i) {
    size_t n = strlen(path);
    if (cJSON_IsArray(parent)) {
        snprintf(path + n, cap - n, "[%d]", i);
    } else {
        char q[80];
        snprintf(path + n, cap - n, "%s%s", n ? "." : "", sb_oai_quote(child->string, strlen(child->string), 64, q, sizeof q));
    }
}

/* The path of the first value whose string (or key) `cut` holds shorter than
 * `whole` (the same JSON, its NULs replaced by U+0001). */
static bool nul_path(const cJSON *whole, const cJSON *cut, char *path, size_t cap) {
    if (cJSON_IsString(whole))
        return strcmp(whole->valuestring, cut->valuestring) != 0;
    size_t n = strlen(path);
    int i = 0;
    for (const cJSON *a = whole->child, *b = cut->child; a && b; a = a->next, b = b->next, i++) {
        path_push(path, cap, whole, a, i);
        if ((a->string && strcmp(a->string, b->string) != 0) || nul_path(a, b, path, cap))
            return true;
        path[n] = '\0';
    }
    return false;
}

static bool refuse_nul(const char *body, size_t len, const cJSON *root, size_t at, sb_oai_err *e) {
    char path[128] = "";
    char *copy = sb_malloc(len);
    if (copy) {
        memcpy(copy, body, len);
        for (size_t i = at; i < len; i++) {
            if (copy[i] == '\0')
                copy[i] = 1;
            else if (copy[i] == '\\' && len - i >= 6 && memcmp(copy + i + 1, "u0000", 5) == 0)
                copy[i + 5] = '1';
            if (copy[i] == '\\')
                i++;
        }
        cJSON *whole = cJSON_ParseWithLength(copy, len);
        if (whole && !nul_path(whole, root, path, sizeof path))
            path[0] = '\0';
        cJSON_Delete(whole);
        sb_free(copy);
    }
    if (!path[0])
        return invalid(e, NULL, "invalid_value", "a string of the request holds a NUL character (at byte %zu); "
                       "switchboard does not accept NULs in strings", at);
    return invalid(e, path, "invalid_value", "'%s' holds a NUL character (\\u0000, first at byte %zu of the body); "
                   "switchboard does not accept NULs in strings", path, at);
}

bool sb_oai_parse(sb_srv *srv, sb_oai_kind kind, const char *body, size_t len, sb_oai_req *out, sb_oai_err *e) {
    memset(out, 0, sizeof *out);
    out->kind = kind;
    out->keep_alive_s = SB_KEEP_ALIVE_UNCHANGED;
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(body, len, &end, false);
    if (!root) {
        size_t at = end && end >= body && end <= body + len ? (size_t)(end - body) : 0;
        invalid(e, NULL, "invalid_json",
                len == 0 ? "the request body is empty; expected a JSON object"
                         : "the request body is not valid JSON (error at byte %zu)",
                at);
        return false;
    }
    while (end < body + len && (*end == ' ' || *end == '\t' || *end == '\r' || *end == '\n'))
        end++;
    bool ok;
    size_t nul;
    if (end != body + len)
        ok = invalid(e, NULL, "invalid_json", "the request body has more after its JSON value (at byte %zu)",
                     (size_t)(end - body));
    else if (!cJSON_IsObject(root))
        ok = invalid(e, NULL, "invalid_json", "the request body must be a JSON object, got %s", sb__json_kind(root));
    else if ((nul = find_nul(body, len)) < len)
        ok = refuse_nul(body, len, root, nul, e);
    else if (kind == SB_OAI_CHAT)
        ok = parse_chat(srv, root, out, e);
    else if (kind == SB_OAI_COMPLETION)
        ok = parse_completion(srv, root, out, e);
    else
        ok = parse_embedding(srv, root, out, e);
    cJSON_Delete(root);
    if (ok && (int64_t)out->n * out->n_prompts > SB_OAI_MAX_CHOICES)
        ok = invalid(e, "n", "invalid_value", "n (%d) times the prompts (%d) is more than %d choices", (int)out->n,
                     (int)out->n_prompts, SB_OAI_MAX_CHOICES);
    if (!ok) {
        sb_oai_req_free(out);
        return false;
    }
    out->n_choices = out->n * out->n_prompts;
    return true;
}

void sb_oai_req_free(sb_oai_req *r) {
    for (int32_t i = 0; r->prompts && i < r->n_prompts; i++)
        sb_free(r->prompts[i]);
    sb_free(r->prompts);
    sb_free(r->prompt_lens);
    for (size_t i = 0; i < r->n_stops; i++)
        sb_free(r->stops[i]);
    /* The grammar may point into the serving model's vocabulary tables: it goes first. */
    sb_grammar_free(r->grammar);
    sb_free(r->logit_bias);
    cJSON_Delete(r->tools);
    cJSON_free(r->tools_json);
    sb_held_release(r->held, r->keep_alive_s);
    if (r->library_file)
        sb_registry_file_release(r->reg, r->library_file);
    sb_free(r->library_text);
    memset(r, 0, sizeof *r);
}

void sb_oai_inputs(const sb_oai_req *r, sb_input *inputs, sb_infer_params *params) {
    for (int32_t c = 0; c < r->n_choices; c++) {
        int32_t p = c / r->n;
        inputs[c] = (sb_input){.kind = SB_INPUT_TOKENS, .tokens = r->prompts[p], .n_tokens = (size_t)r->prompt_lens[p],
                               .seed_offset = (uint64_t)(c % r->n)};
    }
    *params = sb_infer_default_params();
    /* Everything resolved already (the registry's and the library prompt's
     * defaults applied): the API adds none of its own. The stop list is
     * never NULL, so an empty one stays empty. */
    params->sampling = &r->sampling;
    params->max_tokens = r->max_tokens > 0 ? r->max_tokens : -1; /* <= 0: until the context is full */
    params->stops = (const char *const *)r->stops;
    params->n_stops = r->n_stops;
    params->logprobs = r->logprobs;
    params->top_logprobs = r->top_logprobs;
    params->embedding = r->kind == SB_OAI_EMBEDDING;
    params->grammar = r->grammar;
    params->priority = r->caller.priority;
    params->keep_alive_s = r->keep_alive_s;
}

/* ---- answers ------------------------------------------------------------- */

bool sb_oai_resp_init(sb_oai_resp *r, sb_srv *srv, const sb_oai_req *req) {
    memset(r, 0, sizeof *r);
    r->srv = srv;
    r->req = req;
    r->created = (int64_t)time(NULL);
    snprintf(r->id, sizeof r->id, "%s%016llx", req->kind == SB_OAI_CHAT ? "chatcmpl-" : "cmpl-",
             (unsigned long long)sb__srv_random(srv));
    sb_held_served(req->held, &r->served);
    r->choices = sb_calloc((size_t)req->n_choices, sizeof *r->choices);
    return r->choices != NULL;
}

void sb_oai_resp_free(sb_oai_resp *r) {
    for (int32_t i = 0; r->choices && i < r->req->n_choices; i++) {
        sb_oai_choice *c = &r->choices[i];
        sb_srv_buf_free(&c->text);
        cJSON_Delete(c->logprobs);
        sb_free(c->embedding);
        sb_free(c->error);
        if (c->tools)
            sb__tools_stream_free(c->tools);
        sb_free(c->tools);
    }
    sb_free(r->choices);
    r->choices = NULL;
}

static const char *finish_reason(sb_finish_reason f) { return f == SB_FINISHED_LENGTH ? "length" : "stop"; }

/* A token's text as OpenAI shows it in logprobs (leading space included). */
static void token_piece(const sb_model_t *model, int32_t token, char *buf, size_t cap) {
    size_t n = 0;
    if (sb_detokenize(model, &token, 1, false, true, buf, cap, &n, NULL) != SB_OK)
        buf[0] = '\0';
}

static cJSON *bytes_json(const char *s) {
    cJSON *a = cJSON_CreateArray();
    for (const unsigned char *p = (const unsigned char *)s; *p; p++)
        cJSON_AddItemToArray(a, cJSON_CreateNumber(*p));
    return a;
}

/* Chat: one entry of logprobs.content. */
static cJSON *chat_logprob(const sb_model_t *model, const sb_stream_event *ev) {
    char piece[256];
    cJSON *o = cJSON_CreateObject();
    token_piece(model, ev->token, piece, sizeof piece);
    cJSON_AddStringToObject(o, "token", piece);
    cJSON_AddNumberToObject(o, "logprob", ev->logprob);
    cJSON_AddItemToObject(o, "bytes", bytes_json(piece));
    cJSON *top = cJSON_AddArrayToObject(o, "top_logprobs");
    for (int32_t i = 0; i < ev->n_top; i++) {
        cJSON *t = cJSON_CreateObject();
        token_piece(model, ev->top[i].token, piece, sizeof piece);
        cJSON_AddStringToObject(t, "token", piece);
        cJSON_AddNumberToObject(t, "logprob", ev->top[i].logprob);
        cJSON_AddItemToObject(t, "bytes", bytes_json(piece));
        cJSON_AddItemToArray(top, t);
    }
    return o;
}

/* Completions: appends one token to a {tokens, token_logprobs, top_logprobs, text_offset} object. */
static void completion_logprob(const sb_model_t *model, cJSON *lp, const sb_stream_event *ev, size_t offset) {
    char piece[256];
    token_piece(model, ev->token, piece, sizeof piece);
    cJSON_AddItemToArray(cJSON_GetObjectItemCaseSensitive(lp, "tokens"), cJSON_CreateString(piece));
    cJSON_AddItemToArray(cJSON_GetObjectItemCaseSensitive(lp, "token_logprobs"), cJSON_CreateNumber(ev->logprob));
    cJSON *top = cJSON_CreateObject();
    for (int32_t i = 0; i < ev->n_top; i++) {
        token_piece(model, ev->top[i].token, piece, sizeof piece);
        if (!cJSON_GetObjectItemCaseSensitive(top, piece))
            cJSON_AddNumberToObject(top, piece, ev->top[i].logprob);
    }
    cJSON_AddItemToArray(cJSON_GetObjectItemCaseSensitive(lp, "top_logprobs"), top);
    cJSON_AddItemToArray(cJSON_GetObjectItemCaseSensitive(lp, "text_offset"), cJSON_CreateNumber((double)offset));
}

static cJSON *completion_logprobs_new(void) {
    cJSON *lp = cJSON_CreateObject();
    cJSON_AddArrayToObject(lp, "tokens");
    cJSON_AddArrayToObject(lp, "token_logprobs");
    cJSON_AddArrayToObject(lp, "top_logprobs");
    cJSON_AddArrayToObject(lp, "text_offset");
    return lp;
}

/* Records a done event's outcome in its choice (an embedding or error
 * copied: the event's pointers last only until the next one). */
static void record_done(sb_oai_resp *r, sb_oai_choice *c, const sb_stream_event *ev) {
    c->done = true;
    c->finish = ev->finish;
    c->n_prompt = ev->n_prompt;
    c->n_cached = ev->n_prompt_cached;
    c->n_generated = ev->n_generated;
    if (ev->embedding && ev->n_embd > 0 && (c->embedding = sb_malloc((size_t)ev->n_embd * sizeof(float)))) {
        memcpy(c->embedding, ev->embedding, (size_t)ev->n_embd * sizeof(float));
        c->n_embd = ev->n_embd;
    }
    if (ev->error)
        c->error = sb_strndup(ev->error, strlen(ev->error));
    r->n_done++;
}

void sb_oai_resp_add(sb_oai_resp *r, const sb_stream_event *ev) {
    sb_oai_choice *c = &r->choices[ev->index];
    if (!ev->done && r->req->logprobs) {
        if (r->req->kind == SB_OAI_CHAT) {
            if (!c->logprobs)
                c->logprobs = cJSON_CreateArray();
            cJSON_AddItemToArray(c->logprobs, chat_logprob(sb_held_model(r->req->held), ev));
        } else {
            if (!c->logprobs)
                c->logprobs = completion_logprobs_new();
            completion_logprob(sb_held_model(r->req->held), c->logprobs, ev, c->text.len);
        }
    }
    sb_srv_buf_append(&c->text, ev->text, ev->text_len);
    if (ev->done)
        record_done(r, c, ev);
}

static cJSON *usage_json(const sb_oai_resp *r) {
    int64_t prompt = 0, cached = 0, generated = 0;
    for (int32_t i = 0; i < r->req->n_choices; i++) {
        const sb_oai_choice *c = &r->choices[i];
        if (i % r->req->n == 0) { /* the prompt counts once, however many choices it has */
            prompt += c->n_prompt;
            cached += c->n_cached;
        }
        generated += c->n_generated;
    }
    cJSON *u = cJSON_CreateObject();
    cJSON_AddNumberToObject(u, "prompt_tokens", (double)prompt);
    if (r->req->kind != SB_OAI_EMBEDDING)
        cJSON_AddNumberToObject(u, "completion_tokens", (double)generated);
    cJSON_AddNumberToObject(u, "total_tokens", (double)(prompt + generated));
    if (r->req->kind != SB_OAI_EMBEDDING)
        cJSON_AddNumberToObject(cJSON_AddObjectToObject(u, "prompt_tokens_details"), "cached_tokens", (double)cached);
    return u;
}

/* What routing did, when it did more than serve the model asked for: the
 * fallback's reason, the route (A/B) the request named. */
static void add_metadata(const sb_oai_resp *r, cJSON *o) {
    const sb_served *s = &r->served;
    if (!s->fallback && !s->route[0])
        return;
    cJSON *m = cJSON_AddObjectToObject(o, "metadata");
    if (s->fallback)
        cJSON_AddStringToObject(m, "fallback", s->fallback_reason);
    if (s->route[0])
        cJSON_AddStringToObject(m, "route", s->route);
}

/* The fields every chat/completion object and chunk starts with. */
static cJSON *envelope(const sb_oai_resp *r, const char *object) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", r->id);
    cJSON_AddStringToObject(o, "object", object);
    cJSON_AddNumberToObject(o, "created", (double)r->created);
    cJSON_AddStringToObject(o, "model", r->served.model);
    cJSON_AddNullToObject(o, "system_fingerprint");
    add_metadata(r, o);
    return o;
}

static const char b64_digits[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/* An embedding as JSON text: a float array, or a string of base64 little-endian float32. */
static cJSON *embedding_json(const float *v, int32_t n, bool base64) {
    sb_srv_buf b = {0};
    if (base64) {
        const unsigned char *p = (const unsigned char *)v; /* x86-64 and ARM Linux are little-endian */
        size_t len = (size_t)n * sizeof(float);
        sb_srv_buf_puts(&b, "\"");
        for (size_t i = 0; i < len; i += 3) {
            uint32_t x = (uint32_t)p[i] << 16 | (i + 1 < len ? (uint32_t)p[i + 1] << 8 : 0) |
                         (i + 2 < len ? p[i + 2] : 0);
            char q[4] = {b64_digits[x >> 18 & 63], b64_digits[x >> 12 & 63],
                         i + 1 < len ? b64_digits[x >> 6 & 63] : '=', i + 2 < len ? b64_digits[x & 63] : '='};
            sb_srv_buf_append(&b, q, 4);
        }
        sb_srv_buf_puts(&b, "\"");
    } else {
        sb_srv_buf_puts(&b, "[");
        for (int32_t i = 0; i < n; i++)
            sb_srv_buf_printf(&b, i ? ",%.9g" : "%.9g", isfinite(v[i]) ? (double)v[i] : 0.0);
        sb_srv_buf_puts(&b, "]");
    }
    cJSON *raw = b.failed ? NULL : cJSON_CreateRaw(b.p);
    sb_srv_buf_free(&b);
    return raw;
}

static cJSON *embeddings_body(const sb_oai_resp *r) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "object", "list");
    cJSON *data = cJSON_AddArrayToObject(o, "data");
    for (int32_t i = 0; i < r->req->n_choices; i++) {
        cJSON *d = cJSON_CreateObject();
        cJSON_AddStringToObject(d, "object", "embedding");
        cJSON_AddNumberToObject(d, "index", i);
        cJSON_AddItemToObject(d, "embedding", embedding_json(r->choices[i].embedding, r->choices[i].n_embd, r->req->base64));
        cJSON_AddItemToArray(data, d);
    }
    cJSON_AddStringToObject(o, "model", r->served.model);
    add_metadata(r, o);
    cJSON_AddItemToObject(o, "usage", usage_json(r));
    return o;
}

bool sb_oai_resp_body(sb_oai_resp *r, sb_srv_buf *out, sb_oai_err *e) {
    for (int32_t i = 0; i < r->req->n_choices; i++) {
        const sb_oai_choice *c = &r->choices[i];
        if (c->finish == SB_FINISHED_CANCELLED) { /* nobody else cancels a waiting request: the server stops */
            sb_oai_err_set(e, 503, "server_error", "server_stopping", NULL, "the server is stopping");
            return false;
        }
        if (c->finish == SB_FINISHED_ERROR || !c->done || c->text.failed ||
            (r->req->kind == SB_OAI_EMBEDDING && !c->embedding)) {
            sb_oai_err_set(e, 500, "server_error", NULL, NULL, "generation failed: %s",
                           c->error ? c->error : "out of memory");
            return false;
        }
    }
    cJSON *o;
    if (r->req->kind == SB_OAI_EMBEDDING) {
        o = embeddings_body(r);
    } else {
        bool chat = r->req->kind == SB_OAI_CHAT;
        o = envelope(r, chat ? "chat.completion" : "text_completion");
        cJSON *choices = cJSON_AddArrayToObject(o, "choices");
        for (int32_t i = 0; i < r->req->n_choices; i++) {
            sb_oai_choice *c = &r->choices[i];
            cJSON *ch = cJSON_CreateObject();
            cJSON_AddNumberToObject(ch, "index", i);
            cJSON *calls = NULL;
            if (chat) {
                cJSON *msg = cJSON_AddObjectToObject(ch, "message");
                cJSON_AddStringToObject(msg, "role", "assistant");
                char *content = NULL;
                if (r->req->tool_mode != SB_OAI_TOOLS_NONE)
                    calls = sb__tools_parse(r->srv, r->req, c->text.p ? c->text.p : "", c->text.len, &content);
                if (calls && (!content || !content[0]))
                    cJSON_AddNullToObject(msg, "content");
                else
                    cJSON_AddStringToObject(msg, "content", content ? content : c->text.p ? c->text.p : "");
                sb_free(content);
                cJSON_AddNullToObject(msg, "refusal");
                if (calls)
                    cJSON_AddItemToObject(msg, "tool_calls", calls);
            } else {
                cJSON_AddStringToObject(ch, "text", c->text.p ? c->text.p : "");
            }
            if (r->req->logprobs) {
                cJSON *lp = c->logprobs ? c->logprobs : chat ? cJSON_CreateArray() : completion_logprobs_new();
                c->logprobs = NULL;
                if (chat) {
                    cJSON *wrap = cJSON_CreateObject();
                    cJSON_AddItemToObject(wrap, "content", lp);
                    cJSON_AddNullToObject(wrap, "refusal");
                    lp = wrap;
                }
                cJSON_AddItemToObject(ch, "logprobs", lp);
            } else {
                cJSON_AddNullToObject(ch, "logprobs");
            }
            cJSON_AddStringToObject(ch, "finish_reason", calls ? "tool_calls" : finish_reason(c->finish));
            cJSON_AddItemToArray(choices, ch);
        }
        cJSON_AddItemToObject(o, "usage", usage_json(r));
    }
    put_json(out, o);
    if (out->failed) {
        sb_oai_err_set(e, 500, "server_error", NULL, NULL, "out of memory building the response");
        return false;
    }
    return true;
}

/* ---- streamed chunks ------------------------------------------------------ */

static void sse(sb_srv_buf *out, cJSON *item) {
    sb_srv_buf_puts(out, "data: ");
    put_json(out, item);
    sb_srv_buf_puts(out, "\n\n");
}

/* Appends a chunk with one choice: for chat the `delta` object (taken), for completions `text`. */
static void chunk(sb_oai_resp *r, int32_t index, cJSON *delta, const char *text, cJSON *logprobs, const char *finish,
                  sb_srv_buf *out) {
    bool chat = r->req->kind == SB_OAI_CHAT;
    cJSON *o = envelope(r, chat ? "chat.completion.chunk" : "text_completion");
    cJSON *ch = cJSON_CreateObject();
    cJSON_AddNumberToObject(ch, "index", index);
    if (chat)
        cJSON_AddItemToObject(ch, "delta", delta);
    else
        cJSON_AddStringToObject(ch, "text", text);
    if (logprobs)
        cJSON_AddItemToObject(ch, "logprobs", logprobs);
    else
        cJSON_AddNullToObject(ch, "logprobs");
    if (finish)
        cJSON_AddStringToObject(ch, "finish_reason", finish);
    else
        cJSON_AddNullToObject(ch, "finish_reason");
    cJSON_AddItemToArray(cJSON_AddArrayToObject(o, "choices"), ch);
    if (r->req->include_usage)
        cJSON_AddNullToObject(o, "usage");
    sse(out, o);
}

static cJSON *content_delta(const char *text) {
    cJSON *d = cJSON_CreateObject();
    cJSON_AddStringToObject(d, "content", text);
    return d;
}

/* A streamed chat answer with tools: content is sent while it cannot still
 * open a call; at the end, the calls, each as a delta with its id and name
 * and then a delta of its arguments. Returns whether ev ends the choice;
 * *finish becomes "tool_calls" when it made calls. */
static bool tools_chunk(sb_oai_resp *r, sb_oai_choice *c, const sb_stream_event *ev, cJSON *lp, sb_srv_buf *out,
                        const char **finish) {
    if (!c->tools && !(c->tools = sb_calloc(1, sizeof *c->tools))) {
        out->failed = true;
        cJSON_Delete(lp);
        return ev->done;
    }
    sb_srv_buf emit = {0};
    sb__tools_stream_push(r->req, c->tools, ev->text, ev->text_len, &emit);
    cJSON *calls = NULL;
    if (ev->done && ev->finish != SB_FINISHED_ERROR && ev->finish != SB_FINISHED_CANCELLED) {
        sb_tool_stream *ts = c->tools;
        char *content = NULL;
        calls = sb__tools_parse(r->srv, r->req, ts->text.p ? ts->text.p : "", ts->text.len, &content);
        size_t n = content ? strlen(content) : 0;
        if (n > ts->shown)
            sb_srv_buf_append(&emit, content + ts->shown, n - ts->shown);
        sb_free(content);
    }
    if (emit.len || lp)
        chunk(r, ev->index, content_delta(emit.p ? emit.p : ""), NULL, lp, NULL, out);
    sb_srv_buf_free(&emit);
    int i = 0;
    cJSON *call;
    cJSON_ArrayForEach(call, calls) {
        cJSON *fn = cJSON_GetObjectItemCaseSensitive(call, "function");
        cJSON *args = cJSON_DetachItemFromObjectCaseSensitive(fn, "arguments");
        cJSON_AddStringToObject(fn, "arguments", "");
        cJSON *head = cJSON_CreateObject(), *d = cJSON_CreateObject();
        cJSON_AddNumberToObject(head, "index", i);
        for (cJSON *f = call->child; f; f = f->next)
            cJSON_AddItemToObject(head, f->string, cJSON_Duplicate(f, true));
        cJSON_AddItemToArray(cJSON_AddArrayToObject(d, "tool_calls"), head);
        chunk(r, ev->index, d, NULL, NULL, NULL, out);
        cJSON *part = cJSON_CreateObject(), *d2 = cJSON_CreateObject(), *f2 = cJSON_CreateObject();
        cJSON_AddNumberToObject(part, "index", i++);
        cJSON_AddItemToObject(f2, "arguments", args);
        cJSON_AddItemToObject(part, "function", f2);
        cJSON_AddItemToArray(cJSON_AddArrayToObject(d2, "tool_calls"), part);
        chunk(r, ev->index, d2, NULL, NULL, NULL, out);
    }
    if (calls)
        *finish = "tool_calls";
    cJSON_Delete(calls);
    return ev->done;
}

void sb_oai_resp_start(sb_oai_resp *r, sb_srv_buf *out) {
    for (int32_t i = 0; r->req->kind == SB_OAI_CHAT && i < r->req->n_choices; i++) {
        cJSON *d = cJSON_CreateObject();
        cJSON_AddStringToObject(d, "role", "assistant");
        cJSON_AddStringToObject(d, "content", "");
        chunk(r, i, d, NULL, NULL, NULL, out);
    }
}

bool sb_oai_resp_chunk(sb_oai_resp *r, const sb_stream_event *ev, sb_srv_buf *out) {
    sb_oai_choice *c = &r->choices[ev->index];
    bool chat = r->req->kind == SB_OAI_CHAT;
    cJSON *lp = NULL;
    if (!ev->done && r->req->logprobs) {
        if (chat) {
            lp = cJSON_CreateObject();
            cJSON_AddItemToArray(cJSON_AddArrayToObject(lp, "content"), chat_logprob(sb_held_model(r->req->held), ev));
            cJSON_AddNullToObject(lp, "refusal");
        } else {
            lp = completion_logprobs_new();
            completion_logprob(sb_held_model(r->req->held), lp, ev, c->text_offset);
        }
    }
    c->text_offset += ev->text_len;
    const char *finish = NULL;
    if (chat && r->req->tool_mode != SB_OAI_TOOLS_NONE) {
        if (!tools_chunk(r, c, ev, lp, out, &finish))
            return false;
    } else {
        if (ev->text_len || lp)
            chunk(r, ev->index, chat ? content_delta(ev->text) : NULL, ev->text, lp, NULL, out);
        if (!ev->done)
            return false;
    }
    c->done = true;
    c->finish = ev->finish;
    c->n_prompt = ev->n_prompt;
    c->n_cached = ev->n_prompt_cached;
    c->n_generated = ev->n_generated;
    r->n_done++;
    if (ev->finish == SB_FINISHED_ERROR || ev->finish == SB_FINISHED_CANCELLED) {
        sb_oai_err e;
        if (ev->finish == SB_FINISHED_CANCELLED) /* only the server stopping cancels a stream that still has its client */
            sb_oai_err_set(&e, 503, "server_error", "server_stopping", NULL, "the server is stopping");
        else
            sb_oai_err_set(&e, 500, "server_error", NULL, NULL, "generation failed: %s",
                           ev->error ? ev->error : "unknown");
        sb_srv_buf_puts(out, "data: ");
        sb_oai_err_json(&e, out);
        sb_srv_buf_puts(out, "\n\n");
    } else {
        chunk(r, ev->index, chat ? cJSON_CreateObject() : NULL, "", NULL, finish ? finish : finish_reason(ev->finish),
              out);
    }
    if (r->n_done < r->req->n_choices)
        return false;
    if (r->req->include_usage) {
        cJSON *o = envelope(r, chat ? "chat.completion.chunk" : "text_completion");
        cJSON_AddArrayToObject(o, "choices");
        cJSON_AddItemToObject(o, "usage", usage_json(r));
        sse(out, o);
    }
    sb_srv_buf_puts(out, "data: [DONE]\n\n");
    return true;
}

/* ---- models -------------------------------------------------------------- */

static cJSON *model_json(const sb_srv *srv, const char *id) {
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "id", id);
    cJSON_AddStringToObject(m, "object", "model");
    cJSON_AddNumberToObject(m, "created", (double)srv->created);
    cJSON_AddStringToObject(m, "owned_by", "switchboard");
    return m;
}

bool sb_oai_models_json(sb_srv *srv, const char *id, sb_srv_buf *out) {
    char names[16384];
    int32_t n = sb_switchboard_models(srv->sb, names, sizeof names);
    cJSON *list = id ? NULL : cJSON_CreateObject();
    cJSON *data = list ? cJSON_AddArrayToObject(list, "data") : NULL;
    if (list)
        cJSON_AddStringToObject(list, "object", "list");
    const char *name = names;
    for (int32_t i = 0; i < n; i++, name += strlen(name) + 1) {
        if (data) {
            cJSON_AddItemToArray(data, model_json(srv, name));
        } else if (strcmp(name, id) == 0) {
            put_json(out, model_json(srv, name));
            return true;
        }
    }
    if (list)
        put_json(out, list);
    return list != NULL;
}
