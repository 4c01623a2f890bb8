/*
 * tools.c - tool calling: requests, call grammars, parsing answers (see
 * tools.h).
 */
#include <stdio.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "base/base.h"
#include "sampling/grammar.h"
#include "sampling/json_schema.h"
#include "server/server-impl.h"
#include "server/structured.h"
#include "server/tools.h"

/* Calls in one answer beyond the first, at most: a model that never stops
 * calling still ends. */
#define MAX_MORE_CALLS "7"

/* ---- families --------------------------------------------------------------- */

sb_tool_family sb__tools_family(const char *src) {
    if (strstr(src, "<tool_call>"))
        return SB_TOOLS_HERMES;
    if (strstr(src, "[TOOL_CALLS]"))
        return SB_TOOLS_MISTRAL;
    if (strstr(src, "<|python_tag|>") || strstr(src, "ipython"))
        return SB_TOOLS_LLAMA3;
    return SB_TOOLS_GENERIC;
}

/* What opens a call in free text (NULL: the answer's first character). */
static const char *trigger(sb_tool_family f) {
    return f == SB_TOOLS_HERMES ? "<tool_call>" : f == SB_TOOLS_MISTRAL ? "[TOOL_CALLS]" : NULL;
}

/* The key of a call's arguments. */
static const char *args_key(sb_tool_family f) { return f == SB_TOOLS_LLAMA3 ? "parameters" : "arguments"; }

static bool refuse(sb_oai_err *e, const char *param, const char *code, const char *fmt, const char *arg) {
    sb_oai_err_set(e, 400, "invalid_request_error", code, param, fmt, arg);
    return false;
}

/* ---- grammars -------------------------------------------------------------------- */

/* Free text up to the trigger, then rule `after`: KMP states as rules
 * free-0 .. free-(k-1), each of which may also end the text. */
static void free_until(sb_srv_buf *g, const char *t, const char *after) {
    size_t k = strlen(t);
    char chars[64] = {0};
    size_t n_chars = 0;
    for (size_t i = 0; i < k; i++)
        if (!memchr(chars, t[i], n_chars) && n_chars + 1 < sizeof chars)
            chars[n_chars++] = t[i];
    for (size_t i = 0; i < k; i++) {
        sb_srv_buf_printf(g, "free-%zu ::= | ", i); /* the text may end anywhere */
        for (size_t c = 0; c < n_chars; c++) {
            /* The longest prefix of t that ends the text seen plus this character. */
            size_t next = 0;
            for (size_t len = SB_MIN(i + 1, k); len > 0 && !next; len--) {
                if (len - 1 > i)
                    continue;
                bool match = t[len - 1] == chars[c] && memcmp(t, t + i + 1 - len, len - 1) == 0;
                if (match)
                    next = len;
            }
            sb_srv_buf_printf(g, "\"\\x%02X\" ", (unsigned char)chars[c]);
            if (next == k)
                sb_srv_buf_printf(g, "%s | ", after);
            else
                sb_srv_buf_printf(g, "free-%zu | ", next);
        }
        sb_srv_buf_puts(g, "[^");
        for (size_t c = 0; c < n_chars; c++)
            sb_srv_buf_printf(g, "\\x%02X", (unsigned char)chars[c]);
        sb_srv_buf_puts(g, "] free-0\n");
    }
}

/* The grammar of the answer for the request's tool mode; NULL with e set
 * on failure (a parameter schema refused). */
static char *call_grammar(const cJSON *tools, const char *only, sb_tool_family f, bool parallel, bool free_text,
                          sb_oai_err *e) {
    sb_srv_buf g = {0};
    sb_srv_buf calls = {0};
    int i = 0, n = 0;
    const cJSON *t;
    cJSON_ArrayForEach(t, tools) {
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(t, "function");
        const char *name = cJSON_GetObjectItemCaseSensitive(fn, "name")->valuestring;
        const cJSON *params = cJSON_GetObjectItemCaseSensitive(fn, "parameters");
        i++;
        if (only && strcmp(only, name) != 0)
            continue;
        cJSON *any = NULL;
        if (!params || cJSON_IsNull(params))
            params = any = cJSON_Parse("{\"type\":\"object\"}");
        char prefix[32], *args;
        size_t len;
        snprintf(prefix, sizeof prefix, "t%d-", i);
        sb_error err;
        sb_status st = sb_json_schema_to_gbnf_prefixed(params, prefix, &args, &len, &err);
        cJSON_Delete(any);
        if (st != SB_OK) {
            char param[96];
            snprintf(param, sizeof param, "tools[%d].function.parameters", i - 1);
            sb_oai_err_set(e, st == SB_ERR_NOMEM ? 500 : 400, st == SB_ERR_NOMEM ? "server_error" : "invalid_request_error",
                           st == SB_ERR_UNSUPPORTED ? "unsupported_schema" : "invalid_schema", param, "'%s': %s", param,
                           err.msg);
            sb_srv_buf_free(&g);
            sb_srv_buf_free(&calls);
            return NULL;
        }
        sb_srv_buf_append(&g, args, len);
        sb_free(args);
        /* {"name": "x", "arguments": ...}: the name as JSON text, then as a GBNF literal. */
        cJSON *js = cJSON_CreateString(name);
        char *quoted = cJSON_PrintUnformatted(js);
        cJSON_Delete(js);
        sb_srv_buf_printf(&calls, "%s\"{\\\"name\\\": ", n++ ? " | " : "");
        for (const char *q = quoted; q && *q; q++)
            sb_srv_buf_printf(&calls, *q == '"' || *q == '\\' ? "\\%c" : "%c", *q);
        sb_srv_buf_printf(&calls, ", \\\"%s\\\": \" t%d-root \"}\"", args_key(f), i);
        cJSON_free(quoted);
    }
    sb_srv_buf_printf(&g, "call ::= %s\n", calls.p ? calls.p : "\"\"");
    sb_srv_buf_free(&calls);
    switch (f) {
    case SB_TOOLS_HERMES:
        sb_srv_buf_printf(&g, "calls ::= \"\\n\" call \"\\n</tool_call>\"%s\n",
                          parallel ? " (\"\\n<tool_call>\\n\" call \"\\n</tool_call>\"){0," MAX_MORE_CALLS "}" : "");
        if (free_text)
            free_until(&g, "<tool_call>", "calls");
        sb_srv_buf_puts(&g, free_text ? "root ::= free-0\n" : "root ::= \"<tool_call>\" calls\n");
        break;
    case SB_TOOLS_MISTRAL:
        sb_srv_buf_printf(&g, "calls ::= \"[\" call%s \"]\"\n", parallel ? " (\", \" call){0," MAX_MORE_CALLS "}" : "");
        if (free_text)
            free_until(&g, "[TOOL_CALLS]", "calls");
        sb_srv_buf_puts(&g, free_text ? "root ::= free-0\n" : "root ::= \"[TOOL_CALLS]\" calls\n");
        break;
    case SB_TOOLS_LLAMA3: /* one call: the template renders no more */
        sb_srv_buf_puts(&g, free_text ? "root ::= call | ([^{] .*)?\n" : "root ::= call\n");
        break;
    case SB_TOOLS_GENERIC:
        sb_srv_buf_printf(&g, "root ::= %s\n", parallel ? "call | \"[\" call (\", \" call){0," MAX_MORE_CALLS "} \"]\"" : "call");
        break;
    }
    if (g.failed) {
        sb_srv_buf_free(&g);
        sb_oai_err_set(e, 500, "server_error", NULL, "tools", "out of memory");
        return NULL;
    }
    return g.p;
}

/* ---- requests ------------------------------------------------------------------- */

static bool check_tools(const cJSON *tools, sb_oai_err *e) {
    if (!cJSON_IsArray(tools))
        return refuse(e, "tools", "invalid_type", "'tools' must be an array of {\"type\": \"function\", ...}%s", "");
    if (cJSON_GetArraySize(tools) > 128)
        return refuse(e, "tools", "invalid_value", "'tools' has more than 128 entries%s", "");
    int i = 0;
    const cJSON *t;
    cJSON_ArrayForEach(t, tools) {
        char param[64];
        snprintf(param, sizeof param, "tools[%d]", i++);
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(t, "type");
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(t, "function");
        if (!cJSON_IsObject(t) || !cJSON_IsString(type) || strcmp(type->valuestring, "function") != 0 ||
            !cJSON_IsObject(fn))
            return refuse(e, param, "invalid_value", "'%s' must be {\"type\": \"function\", \"function\": {...}}", param);
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(fn, "name");
        if (!cJSON_IsString(name) || !name->valuestring[0] || strlen(name->valuestring) > 64 ||
            strspn(name->valuestring, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.") !=
                strlen(name->valuestring))
            return refuse(e, param, "invalid_value",
                          "'%s.function.name' must be 1 to 64 letters, digits, '_', '-' or '.'", param);
        const cJSON *params = cJSON_GetObjectItemCaseSensitive(fn, "parameters");
        if (params && !cJSON_IsNull(params) && !cJSON_IsObject(params))
            return refuse(e, param, "invalid_type", "'%s.function.parameters' must be a JSON Schema object", param);
    }
    return true;
}

static const cJSON *find_tool(const cJSON *tools, const char *name) {
    const cJSON *t;
    cJSON_ArrayForEach(t, tools) {
        const cJSON *n = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(t, "function"), "name");
        if (cJSON_IsString(n) && strcmp(n->valuestring, name) == 0)
            return t;
    }
    return NULL;
}

bool sb__srv_parse_tools(sb_srv *srv, const cJSON *root, sb_oai_req *r, sb_oai_err *e) {
    const cJSON *tools = cJSON_GetObjectItemCaseSensitive(root, "tools");
    const cJSON *choice = cJSON_GetObjectItemCaseSensitive(root, "tool_choice");
    const cJSON *par = cJSON_GetObjectItemCaseSensitive(root, "parallel_tool_calls");
    bool has_tools = tools && !cJSON_IsNull(tools) && !(cJSON_IsArray(tools) && !tools->child);
    if (tools && !cJSON_IsNull(tools) && !check_tools(tools, e))
        return false;
    if (par && !cJSON_IsNull(par) && !cJSON_IsBool(par))
        return refuse(e, "parallel_tool_calls", "invalid_type", "'parallel_tool_calls' must be a boolean%s", "");
    r->parallel_tools = !cJSON_IsFalse(par);
    r->tool_mode = has_tools ? SB_OAI_TOOLS_AUTO : SB_OAI_TOOLS_NONE;
    const char *only = NULL;
    if (choice && !cJSON_IsNull(choice)) {
        if (cJSON_IsString(choice) && strcmp(choice->valuestring, "none") == 0) {
            r->tool_mode = SB_OAI_TOOLS_NONE;
        } else if (cJSON_IsString(choice) && strcmp(choice->valuestring, "auto") == 0) {
        } else if (cJSON_IsString(choice) && strcmp(choice->valuestring, "required") == 0) {
            r->tool_mode = SB_OAI_TOOLS_REQUIRED;
        } else if (cJSON_IsObject(choice)) {
            const cJSON *fn = cJSON_GetObjectItemCaseSensitive(choice, "function");
            const cJSON *name = cJSON_GetObjectItemCaseSensitive(fn, "name");
            if (!cJSON_IsString(name))
                return refuse(e, "tool_choice", "invalid_value",
                              "'tool_choice' must be none, auto, required or {\"type\": \"function\", \"function\": "
                              "{\"name\": ...}}%s", "");
            if (!has_tools || !find_tool(tools, name->valuestring))
                return refuse(e, "tool_choice", "invalid_value", "'tool_choice' names '%.64s', which is not in 'tools'",
                              name->valuestring);
            r->tool_mode = SB_OAI_TOOLS_REQUIRED;
            only = name->valuestring;
        } else {
            return refuse(e, "tool_choice", "invalid_value",
                          "'tool_choice' must be none, auto, required or {\"type\": \"function\", \"function\": "
                          "{\"name\": ...}}%s", "");
        }
        if (r->tool_mode == SB_OAI_TOOLS_REQUIRED && !has_tools)
            return refuse(e, "tool_choice", "invalid_value", "'tool_choice' asks for a call, but there are no 'tools'%s",
                          "");
    }
    if (r->tool_mode == SB_OAI_TOOLS_NONE)
        return true;
    r->tool_family = sb__tools_family(sb_chat_source(sb_reg_lease_chat(r->lease)));
    /* A named function is one call, as OpenAI answers it; Llama 3's template renders one per turn. */
    if (only || r->tool_family == SB_TOOLS_LLAMA3)
        r->parallel_tools = false;
    if (!(r->tools = cJSON_Duplicate(tools, true)) || !(r->tools_json = cJSON_PrintUnformatted(tools))) {
        sb_oai_err_set(e, 500, "server_error", NULL, "tools", "out of memory");
        return false;
    }
    bool free_text = r->tool_mode == SB_OAI_TOOLS_AUTO;
    if (free_text && r->tool_family == SB_TOOLS_GENERIC)
        return true; /* no marker to start enforcing at: the answer is parsed */
    if (r->grammar)
        return refuse(e, "tools", "invalid_value",
                      "'tools' (unless tool_choice is none) cannot be combined with 'grammar' or a JSON "
                      "'response_format'%s", "");
    char *gbnf = call_grammar(tools, only, r->tool_family, r->parallel_tools, free_text, e);
    if (!gbnf)
        return false;
    bool ok = sb__srv_grammar(srv, gbnf, strlen(gbnf), "tools", r, e);
    sb_free(gbnf);
    return ok;
}

bool sb__tools_message(const cJSON *in, cJSON *out, int index, sb_oai_err *e) {
    const cJSON *calls = cJSON_GetObjectItemCaseSensitive(in, "tool_calls");
    if (calls && !cJSON_IsNull(calls)) {
        char param[96];
        snprintf(param, sizeof param, "messages[%d].tool_calls", index);
        if (!cJSON_IsArray(calls))
            return refuse(e, param, "invalid_type", "'%s' must be an array", param);
        cJSON *copy = cJSON_CreateArray();
        cJSON_AddItemToObject(out, "tool_calls", copy);
        const cJSON *c;
        cJSON_ArrayForEach(c, calls) {
            const cJSON *fn = cJSON_GetObjectItemCaseSensitive(c, "function");
            const cJSON *name = cJSON_GetObjectItemCaseSensitive(fn, "name");
            const cJSON *args = cJSON_GetObjectItemCaseSensitive(fn, "arguments");
            const cJSON *id = cJSON_GetObjectItemCaseSensitive(c, "id");
            if (!cJSON_IsString(name))
                return refuse(e, param, "invalid_value", "'%s' entries need function.name", param);
            cJSON *o = cJSON_CreateObject(), *f = cJSON_CreateObject();
            if (cJSON_IsString(id))
                cJSON_AddStringToObject(o, "id", id->valuestring);
            cJSON_AddStringToObject(o, "type", "function");
            cJSON_AddStringToObject(f, "name", name->valuestring);
            /* Templates write arguments with tojson: they want the object, not its text. */
            cJSON *parsed = cJSON_IsString(args) ? cJSON_Parse(args->valuestring) : NULL;
            if (parsed)
                cJSON_AddItemToObject(f, "arguments", parsed);
            else if (args)
                cJSON_AddItemToObject(f, "arguments", cJSON_Duplicate(args, true));
            else
                cJSON_AddItemToObject(f, "arguments", cJSON_CreateObject());
            cJSON_AddItemToObject(o, "function", f);
            cJSON_AddItemToArray(copy, o);
        }
    }
    const cJSON *id = cJSON_GetObjectItemCaseSensitive(in, "tool_call_id");
    if (cJSON_IsString(id))
        cJSON_AddStringToObject(out, "tool_call_id", id->valuestring);
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(in, "name");
    if (cJSON_IsString(name))
        cJSON_AddStringToObject(out, "name", name->valuestring);
    return true;
}

/* ---- answers ---------------------------------------------------------------------- */

/* A call {name, arguments|parameters} of a declared tool as an OpenAI tool call. */
static cJSON *openai_call(sb_srv *srv, const sb_oai_req *r, const cJSON *c) {
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(c, "name");
    const cJSON *args = cJSON_GetObjectItemCaseSensitive(c, "arguments");
    if (!args)
        args = cJSON_GetObjectItemCaseSensitive(c, "parameters");
    if (!cJSON_IsString(name) || !find_tool(r->tools, name->valuestring) || (args && !cJSON_IsObject(args)))
        return NULL;
    char id[40];
    uint64_t x = sb__srv_random(srv);
    static const char digits[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    /* Mistral's templates check that ids are 9 characters. */
    size_t n = r->tool_family == SB_TOOLS_MISTRAL ? 9 : 24, at = 0;
    if (r->tool_family != SB_TOOLS_MISTRAL)
        at = (size_t)snprintf(id, sizeof id, "call_");
    for (size_t i = 0; i < n; i++, x = x * 6364136223846793005ull + 1442695040888963407ull)
        id[at++] = digits[(x >> 33) % 62];
    id[at] = '\0';
    cJSON *o = cJSON_CreateObject(), *f = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", id);
    cJSON_AddStringToObject(o, "type", "function");
    cJSON_AddStringToObject(f, "name", name->valuestring);
    char *text = args ? cJSON_PrintUnformatted(args) : NULL;
    cJSON_AddStringToObject(f, "arguments", text ? text : "{}");
    cJSON_free(text);
    cJSON_AddItemToObject(o, "function", f);
    return o;
}

/* Adds the calls of a JSON value (a call or an array of calls) to out;
 * false if it is not made only of calls. */
static bool add_calls(sb_srv *srv, const sb_oai_req *r, const cJSON *v, cJSON *out) {
    if (cJSON_IsObject(v)) {
        cJSON *c = openai_call(srv, r, v);
        if (c)
            cJSON_AddItemToArray(out, c);
        return c != NULL;
    }
    if (!cJSON_IsArray(v) || !v->child)
        return false;
    const cJSON *x;
    cJSON_ArrayForEach(x, v) if (!add_calls(srv, r, x, out)) return false;
    return true;
}

static const char *skip_ws(const char *p, const char *end) {
    while (p < end && (*p == ' ' || *p == '\n' || *p == '\t' || *p == '\r'))
        p++;
    return p;
}

cJSON *sb__tools_parse(sb_srv *srv, const sb_oai_req *r, const char *text, size_t len, char **content) {
    const char *end = text + len, *start = NULL;
    cJSON *calls = cJSON_CreateArray();
    bool ok = false;
    const char *t = trigger(r->tool_family);
    if (t) {
        const char *at = len ? strstr(text, t) : NULL;
        if (at) {
            start = at;
            const char *p = at;
            ok = true;
            while (ok && p && p < end) { /* one or more blocks */
                p = skip_ws(p, end);
                if (p == end)
                    break;
                if ((size_t)(end - p) < strlen(t) || strncmp(p, t, strlen(t)) != 0) {
                    ok = false;
                    break;
                }
                p += strlen(t);
                const char *parse_end = NULL;
                cJSON *v = cJSON_ParseWithLengthOpts(p, (size_t)(end - p), &parse_end, false);
                ok = v && add_calls(srv, r, v, calls);
                cJSON_Delete(v);
                p = parse_end;
                if (ok && r->tool_family == SB_TOOLS_HERMES) {
                    p = skip_ws(p, end);
                    if ((size_t)(end - p) >= 12 && strncmp(p, "</tool_call>", 12) == 0)
                        p += 12;
                }
            }
        }
    } else {
        start = skip_ws(text, end);
        const char *parse_end = NULL;
        cJSON *v = start < end && (*start == '{' || *start == '[')
                       ? cJSON_ParseWithLengthOpts(start, (size_t)(end - start), &parse_end, false)
                       : NULL;
        ok = v && skip_ws(parse_end, end) == end && add_calls(srv, r, v, calls);
        cJSON_Delete(v);
    }
    if (!ok || !calls->child) {
        cJSON_Delete(calls);
        *content = sb_strndup(text, len);
        return NULL;
    }
    /* Text before the call is content (trailing blanks dropped). */
    size_t n = (size_t)(start - text);
    while (n && (text[n - 1] == ' ' || text[n - 1] == '\n'))
        n--;
    *content = sb_strndup(text, n);
    return calls;
}

/* ---- streaming --------------------------------------------------------------------- */

void sb__tools_stream_push(const sb_oai_req *r, sb_tool_stream *ts, const char *text, size_t len, sb_srv_buf *emit) {
    sb_srv_buf_append(&ts->text, text, len);
    if (ts->in_call || r->tool_mode == SB_OAI_TOOLS_REQUIRED) {
        ts->in_call = true;
        return;
    }
    const char *all = ts->text.p ? ts->text.p : "";
    size_t n = ts->text.len;
    const char *t = trigger(r->tool_family);
    size_t safe;
    if (t) {
        const char *at = strstr(all + ts->shown, t);
        if (at) {
            safe = (size_t)(at - all);
            ts->in_call = true;
        } else { /* hold back a tail that may grow into the trigger */
            size_t k = strlen(t), hold = 0;
            for (size_t h = SB_MIN(k - 1, n); h > 0 && !hold; h--)
                if (memcmp(all + n - h, t, h) == 0)
                    hold = h;
            safe = n - hold;
        }
    } else { /* the answer's first non-blank character decides */
        const char *p = skip_ws(all, all + n);
        if (p == all + n) {
            safe = 0;
        } else if (*p == '{' || *p == '[') {
            safe = 0;
            ts->in_call = true;
        } else {
            safe = n;
        }
    }
    if (safe > ts->shown) {
        sb_srv_buf_append(emit, all + ts->shown, safe - ts->shown);
        ts->shown = safe;
    }
}

void sb__tools_stream_free(sb_tool_stream *ts) { sb_srv_buf_free(&ts->text); }
