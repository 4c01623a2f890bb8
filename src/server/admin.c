/*
 * admin.c - the administration routes (see admin.h) over the public API's
 * administration calls (switchboard.h).
 */
#include <string.h>

#include <cjson/cJSON.h>

#include "base/base.h"
#include "server/admin.h"
#include "server/server-impl.h"

static void put_json(sb_srv_buf *out, cJSON *o) {
    char *text = o ? cJSON_PrintUnformatted(o) : NULL;
    if (text)
        sb_srv_buf_puts(out, text);
    else
        out->failed = true;
    cJSON_free(text);
    cJSON_Delete(o);
}

static cJSON *model_info_json(const sb_model_info *m) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "name", m->name);
    cJSON_AddStringToObject(o, "path", m->path);
    cJSON_AddStringToObject(o, "state", sb_model_state_str(m->state));
    cJSON_AddNumberToObject(o, "version", (double)m->version);
    cJSON_AddNumberToObject(o, "memory_bytes", (double)m->memory);
    cJSON_AddNumberToObject(o, "running", m->running);
    cJSON_AddNumberToObject(o, "waiting", m->waiting);
    cJSON_AddNumberToObject(o, "requests_in_flight", m->in_flight);
    if (m->last_used > 0)
        cJSON_AddNumberToObject(o, "last_used", m->last_used);
    else
        cJSON_AddNullToObject(o, "last_used");
    cJSON_AddNumberToObject(o, "keep_alive", m->keep_alive_s);
    cJSON_AddBoolToObject(o, "pinned", m->pinned);
    if (m->error[0])
        cJSON_AddStringToObject(o, "error", m->error);
    else
        cJSON_AddNullToObject(o, "error");
    return o;
}

static void models_json(sb_srv *srv, sb_srv_buf *out) {
    int32_t n = sb_switchboard_list(srv->sb, NULL, 0);
    sb_model_info *info = sb_calloc((size_t)(n > 0 ? n : 1), sizeof *info);
    if (!info) {
        out->failed = true;
        return;
    }
    n = SB_MIN(n, sb_switchboard_list(srv->sb, info, n));
    sb_switchboard_totals t;
    sb_switchboard_get_totals(srv->sb, &t);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "object", "list");
    cJSON *data = cJSON_AddArrayToObject(o, "data");
    for (int32_t i = 0; i < n; i++)
        cJSON_AddItemToArray(data, model_info_json(&info[i]));
    cJSON *mem = cJSON_AddObjectToObject(o, "memory");
    cJSON_AddNumberToObject(mem, "budget_bytes", (double)t.budget);
    cJSON_AddNumberToObject(mem, "used_bytes", (double)t.used);
    cJSON_AddNumberToObject(o, "loads", (double)t.loads);
    cJSON_AddNumberToObject(o, "evictions", (double)t.evictions);
    cJSON_AddNumberToObject(o, "swaps", (double)t.swaps);
    cJSON_AddNumberToObject(o, "reloads", (double)t.reloads);
    sb_free(info);
    put_json(out, o);
}

/* A registry failure as an answer. */
static bool fail(sb_oai_err *e, sb_status st, const sb_error *err) {
    if (st == SB_ERR_MODEL_NOT_FOUND)
        sb_oai_err_set(e, 404, "invalid_request_error", "model_not_found", "model", "%s", err->msg);
    else if (st == SB_ERR_OVER_BUDGET)
        sb_oai_err_set(e, 507, "server_error", "insufficient_storage", "model", "%s", err->msg);
    else if (st == SB_ERR_FORMAT || st == SB_ERR_NOT_FOUND || st == SB_ERR_IO || st == SB_ERR_UNSUPPORTED ||
             st == SB_ERR_INVALID_ARG)
        sb_oai_err_set(e, 400, "invalid_request_error", "invalid_registry", NULL, "%s", err->msg);
    else
        sb_oai_err_set(e, 500, "server_error", NULL, NULL, "%s", err->msg);
    return false;
}

bool sb_srv_admin(sb_srv *srv, const char *url, sb_srv_buf *out, sb_oai_err *e) {
    sb_error err;
    if (strcmp(url, "/admin/models") == 0) {
        models_json(srv, out);
        return true;
    }
    if (strcmp(url, "/admin/reload") == 0) {
        sb_status st = sb_srv_reload(srv, &err);
        if (st != SB_OK)
            return fail(e, st, &err);
        models_json(srv, out);
        return true;
    }
    /* /admin/models/{name}/load or /unload */
    const char *name = url + strlen("/admin/models/");
    const char *slash = strrchr(name, '/');
    char model[256];
    if (!slash || slash == name || (size_t)(slash - name) >= sizeof model ||
        (strcmp(slash, "/load") != 0 && strcmp(slash, "/unload") != 0)) {
        sb_oai_err_set(e, 404, "invalid_request_error", "unknown_url", NULL,
                       "Invalid URL (POST %.200s): use /admin/models/{name}/load or /admin/models/{name}/unload", url);
        return false;
    }
    memcpy(model, name, (size_t)(slash - name));
    model[slash - name] = '\0';
    sb_status st = strcmp(slash, "/load") == 0 ? sb_switchboard_load(srv->sb, model, &err)
                                               : sb_switchboard_unload(srv->sb, model, &err);
    if (st != SB_OK)
        return fail(e, st, &err);
    models_json(srv, out);
    return true;
}

void sb_srv_admin_prompts_json(const sb_regfile *rf, sb_srv_buf *out) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "object", "list");
    cJSON *data = cJSON_AddArrayToObject(o, "data");
    for (size_t i = 0; i < rf->n_prompts; i++) {
        const sb_regfile_prompt *p = &rf->prompts[i];
        cJSON *j = cJSON_CreateObject();
        cJSON_AddStringToObject(j, "id", p->id);
        cJSON_AddStringToObject(j, "object", "prompt");
        cJSON_AddStringToObject(j, "version", p->version);
        cJSON_AddStringToObject(j, "description", p->description);
        cJSON_AddStringToObject(j, "template", p->template_text);
        cJSON_AddItemToObject(j, "variables", cJSON_Duplicate(p->variables, true));
        if (p->model)
            cJSON_AddStringToObject(j, "model", p->model);
        else
            cJSON_AddNullToObject(j, "model");
        cJSON_AddBoolToObject(j, "builtin", p->builtin);
        cJSON_AddItemToArray(data, j);
    }
    put_json(out, o);
}
