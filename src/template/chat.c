/*
 * chat.c - the chat layer: the variables apply_chat_template hands a chat
 * template (messages, tools, add_generation_prompt, bos/eos tokens, extra
 * keyword arguments) built from JSON, the clock of strftime_now, and the
 * built-in templates.
 *
 * The built-in templates are short rewrites of the model families' published
 * templates; the tests render them against the fixtures of the originals.
 */
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "base/base.h"
#include "template/template-impl.h"

/* ---- the clock ------------------------------------------------------------------- */

/* Day of the week (0 = Sunday) of a proleptic Gregorian date. */
static int weekday(int y, int m, int d) {
    static const int t[] = {0, 3, 2, 5, 0, 3, 5, 1, 4, 6, 2, 4};
    if (m < 3)
        y--;
    return (y + y / 4 - y / 100 + y / 400 + t[m - 1] + d) % 7;
}

static bool leap(int y) { return (y % 4 == 0 && y % 100 != 0) || y % 400 == 0; }

/* "YYYY-MM-DD", optionally followed by ' ' or 'T' and "HH:MM[:SS]". */
static sb_status parse_now(const char *s, struct tm *tm, sb_error *err) {
    int y, mo, d, h = 0, mi = 0, sec = 0, n = 0;
    char sep = 0;
    memset(tm, 0, sizeof(*tm));
    int got = sscanf(s, "%4d-%2d-%2d%n", &y, &mo, &d, &n);
    bool ok = got == 3;
    if (ok && s[n]) {
        int m = 0;
        sep = s[n];
        ok = (sep == ' ' || sep == 'T') && sscanf(s + n + 1, "%2d:%2d%n", &h, &mi, &m) == 2;
        if (ok && s[n + 1 + m] == ':') {
            int m2 = 0;
            ok = sscanf(s + n + 1 + m + 1, "%2d%n", &sec, &m2) == 1 && !s[n + 1 + m + 1 + m2];
        } else if (ok) {
            ok = !s[n + 1 + m];
        }
    }
    static const int mdays[] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    ok = ok && y >= 1 && mo >= 1 && mo <= 12 && d >= 1 && d <= mdays[mo - 1] + (mo == 2 && leap(y)) && h < 24 &&
         mi < 60 && sec < 60 && h >= 0 && mi >= 0 && sec >= 0;
    if (!ok)
        return sb_fail(err, SB_ERR_INVALID_ARG, "now: '%s' is not a time of the form YYYY-MM-DD HH:MM[:SS]", s);
    tm->tm_year = y - 1900;
    tm->tm_mon = mo - 1;
    tm->tm_mday = d;
    tm->tm_hour = h;
    tm->tm_min = mi;
    tm->tm_sec = sec;
    tm->tm_wday = weekday(y, mo, d);
    int yday = d - 1;
    for (int i = 0; i < mo - 1; i++)
        yday += mdays[i] + (i == 1 && leap(y));
    tm->tm_yday = yday;
    tm->tm_isdst = -1;
    return SB_OK;
}

/* ---- variables --------------------------------------------------------------------- */

static sb_status set_str(sb_tpl_val vars, const char *key, const char *text) {
    sb_tpl_val k, v;
    sb_status st = sb_tpl_str_new(key, strlen(key), &k);
    if (st)
        return st;
    if ((st = sb_tpl_str_new(text, strlen(text), &v))) {
        sb_tpl_release(k);
        return st;
    }
    return sb_tpl_dict_set(vars, k, v);
}

static sb_status set_json(sb_tpl_val vars, const char *key, const char *json, sb_tpl_kind want, sb_error *err) {
    sb_tpl_val v, k;
    sb_status st = sb_tpl_json_parse(json, strlen(json), key, &v, err);
    if (st)
        return st;
    if (v.kind != want && !(want == SB_TPL_LIST && v.kind == SB_TPL_NONE && strcmp(key, "tools") == 0)) {
        sb_tpl_release(v);
        return sb_fail(err, SB_ERR_INVALID_ARG, "%s: expected a JSON %s", key, want == SB_TPL_LIST ? "array" : "object");
    }
    if (want == SB_TPL_DICT) { /* extra keyword arguments: merge */
        for (size_t i = 0; i < v.d->n && !st; i++)
            st = sb_tpl_dict_set(vars, sb_tpl_retain(v.d->keys[i]), sb_tpl_retain(v.d->vals[i]));
        sb_tpl_release(v);
        return st;
    }
    if ((st = sb_tpl_str_new(key, strlen(key), &k))) {
        sb_tpl_release(v);
        return st;
    }
    return sb_tpl_dict_set(vars, k, v);
}

sb_status sb_tpl_render_chat(const sb_tpl *tpl, const sb_tpl_chat *chat, char **out, size_t *out_len,
                             sb_error *err) {
    *out = NULL;
    if (out_len)
        *out_len = 0;
    if (!chat->messages_json)
        return sb_fail(err, SB_ERR_INVALID_ARG, "messages: missing");
    struct tm now;
    if (chat->now) {
        sb_status st = parse_now(chat->now, &now, err);
        if (st)
            return st;
    } else {
        time_t t = time(NULL);
        localtime_r(&t, &now);
    }
    sb_tpl_val vars, key;
    sb_status st = sb_tpl_dict_new(SB_TPL_DICT, &vars);
    if (!st)
        st = set_json(vars, "messages", chat->messages_json, SB_TPL_LIST, err);
    if (!st && chat->tools_json)
        st = set_json(vars, "tools", chat->tools_json, SB_TPL_LIST, err);
    if (!st && !(st = sb_tpl_str_new("add_generation_prompt", strlen("add_generation_prompt"), &key)))
        st = sb_tpl_dict_set(vars, key, sb_tpl_bool(chat->add_generation_prompt));
    if (!st && chat->bos_token)
        st = set_str(vars, "bos_token", chat->bos_token);
    if (!st && chat->eos_token)
        st = set_str(vars, "eos_token", chat->eos_token);
    if (!st && chat->extra_json)
        st = set_json(vars, "extra", chat->extra_json, SB_TPL_DICT, err);
    if (st == SB_ERR_NOMEM)
        sb_fail(err, st, "template: out of memory");
    else if (st == SB_ERR_UNSUPPORTED)
        sb_fail(err, st, "template input nested too deeply or too large");
    if (!st)
        st = sb_tpl_render_vars(tpl, vars, &now, out, out_len, err);
    sb_tpl_release(vars);
    return st;
}

/* ---- built-in templates ----------------------------------------------------------------- */

#define ALTERNATE                                                                                                  \
    "{%- if (m.role == 'user') != (loop.index0 % 2 == 0) -%}"                                                      \
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"                 \
    "{%- endif -%}\n"

static const struct {
    const char *name, *source;
} builtins[] = {
    {"llama2", /* Llama 2 chat: system prompt folded into the first [INST] */
     "{%- if messages[0].role == 'system' -%}\n"
     "{%- set system = '<<SYS>>\\n' + messages[0].content + '\\n<</SYS>>\\n\\n' -%}\n"
     "{%- set messages = messages[1:] -%}\n"
     "{%- else -%}{%- set system = '' -%}{%- endif -%}\n"
     "{%- for m in messages -%}\n" ALTERNATE
     "{%- if m.role == 'user' -%}\n"
     "{{ bos_token + '[INST] ' + ((system if loop.first else '') + m.content).strip() + ' [/INST]' }}\n"
     "{%- elif m.role == 'assistant' -%}{{ ' ' + m.content.strip() + ' ' + eos_token }}{%- endif -%}\n"
     "{%- endfor -%}"},
    {"llama3", /* Llama 3 instruct */
     "{%- for m in messages -%}\n"
     "{{ (bos_token if loop.first else '') + '<|start_header_id|>' + m.role + '<|end_header_id|>\\n\\n'"
     " + m.content | trim + '<|eot_id|>' }}\n"
     "{%- endfor -%}\n"
     "{%- if add_generation_prompt -%}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif -%}"},
    {"chatml", /* ChatML (Qwen, Hermes, ...) without tools */
     "{%- for m in messages -%}{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{%- endfor -%}\n"
     "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}{%- endif -%}"},
    {"mistral", /* Mistral 7B Instruct v0.1/v0.2, Mixtral: no system role */
     "{{- bos_token -}}\n"
     "{%- for m in messages -%}\n" ALTERNATE
     "{%- if m.role == 'user' -%}{{ '[INST] ' + m.content + ' [/INST]' }}\n"
     "{%- elif m.role == 'assistant' -%}{{ m.content + eos_token }}\n"
     "{%- else -%}{{ raise_exception('Only user and assistant roles are supported!') }}{%- endif -%}\n"
     "{%- endfor -%}"},
    {"gemma", /* Gemma 2: no system role, the assistant is "model" */
     "{{- bos_token -}}\n"
     "{%- if messages[0].role == 'system' -%}{{ raise_exception('System role not supported') }}{%- endif -%}\n"
     "{%- for m in messages -%}\n" ALTERNATE
     "{{ '<start_of_turn>' + ('model' if m.role == 'assistant' else m.role) + '\\n' + m.content | trim"
     " + '<end_of_turn>\\n' }}\n"
     "{%- endfor -%}\n"
     "{%- if add_generation_prompt -%}{{ '<start_of_turn>model\\n' }}{%- endif -%}"},
    {"phi3", /* Phi-3 / Phi-3.5 mini instruct */
     "{%- for m in messages -%}\n"
     "{%- if (m.role == 'system' and m.content) or m.role in ['user', 'assistant'] -%}\n"
     "{{ '<|' + m.role + '|>\\n' + m.content + '<|end|>\\n' }}\n"
     "{%- endif -%}\n"
     "{%- endfor -%}\n"
     "{%- if add_generation_prompt -%}{{ '<|assistant|>\\n' }}{%- else -%}{{ eos_token }}{%- endif -%}"},
};

const char *sb_tpl_builtin_source(const char *name) {
    for (size_t i = 0; i < SB_ARRAY_LEN(builtins); i++)
        if (strcmp(builtins[i].name, name) == 0)
            return builtins[i].source;
    return NULL;
}

const char *sb_tpl_builtin_names(void) { return "llama2, llama3, chatml, mistral, gemma, phi3"; }
