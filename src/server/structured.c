/*
 * structured.c - response_format, grammar and logit_bias (see structured.h).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "base/base.h"
#include "sampling/grammar.h"
#include "sampling/json_schema.h"
#include "server/server-impl.h"
#include "server/structured.h"

static bool refuse(sb_oai_err *e, const char *param, const char *code, const char *msg) {
    sb_oai_err_set(e, 400, "invalid_request_error", code, param, "%s", msg);
    return false;
}

bool sb__srv_grammar(sb_srv *srv, const char *gbnf, size_t len, const char *param, sb_oai_req *r, sb_oai_err *e) {
    sb_error err;
    sb_grammar_t *g;
    sb_status st = sb_held_grammar(r->held, gbnf, len, &g, &err);
    if (st == SB_ERR_NOMEM) {
        sb_oai_err_set(e, 500, "server_error", NULL, param, "%s", err.msg);
        return false;
    }
    if (st != SB_OK) {
        sb_oai_err_set(e, 400, "invalid_request_error", "invalid_grammar", param, "'%s': %s", param, err.msg);
        return false;
    }
    sb_grammar_free(r->grammar);
    r->grammar = g;
    return true;
}

bool sb__srv_schema_grammar(sb_srv *srv, const cJSON *schema, const char *param, sb_oai_req *r, sb_oai_err *e) {
    char *gbnf;
    size_t len;
    sb_error err;
    sb_status st = sb_json_schema_to_gbnf(schema, &gbnf, &len, &err);
    if (st == SB_ERR_NOMEM) {
        sb_oai_err_set(e, 500, "server_error", NULL, param, "%s", err.msg);
        return false;
    }
    if (st != SB_OK) {
        sb_oai_err_set(e, 400, "invalid_request_error", st == SB_ERR_UNSUPPORTED ? "unsupported_schema" : "invalid_schema",
                       param, "'%s': %s", param, err.msg);
        return false;
    }
    bool ok = sb__srv_grammar(srv, gbnf, len, param, r, e);
    sb_free(gbnf);
    return ok;
}

static bool parse_response_format(sb_srv *srv, const cJSON *rf, sb_oai_req *r, sb_oai_err *e) {
    const cJSON *type = cJSON_IsObject(rf) ? cJSON_GetObjectItemCaseSensitive(rf, "type") : NULL;
    if (!cJSON_IsString(type))
        return refuse(e, "response_format", "invalid_type", "'response_format' must be an object with a string 'type'");
    if (strcmp(type->valuestring, "text") == 0)
        return true;
    if (strcmp(type->valuestring, "json_object") == 0) {
        cJSON *any = cJSON_CreateObject();
        bool ok = any && cJSON_AddStringToObject(any, "type", "object") &&
                  sb__srv_schema_grammar(srv, any, "response_format", r, e);
        if (!any)
            sb_oai_err_set(e, 500, "server_error", NULL, "response_format", "out of memory");
        cJSON_Delete(any);
        return ok;
    }
    if (strcmp(type->valuestring, "json_schema") != 0) {
        sb_oai_err_set(e, 400, "invalid_request_error", "unsupported_value", "response_format",
                       "'response_format.type' must be 'text', 'json_object' or 'json_schema', got '%.64s'",
                       type->valuestring);
        return false;
    }
    const cJSON *js = cJSON_GetObjectItemCaseSensitive(rf, "json_schema");
    if (!cJSON_IsObject(js))
        return refuse(e, "response_format.json_schema", "invalid_type",
                      "'response_format.json_schema' must be an object with a 'schema'");
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(js, "name");
    if (name && !cJSON_IsString(name))
        return refuse(e, "response_format.json_schema.name", "invalid_type",
                      "'response_format.json_schema.name' must be a string");
    const cJSON *strict = cJSON_GetObjectItemCaseSensitive(js, "strict");
    if (strict && !cJSON_IsBool(strict) && !cJSON_IsNull(strict))
        return refuse(e, "response_format.json_schema.strict", "invalid_type",
                      "'response_format.json_schema.strict' must be a boolean");
    /* strict or not, what is accepted is enforced. Without a schema: any JSON object. */
    const cJSON *schema = cJSON_GetObjectItemCaseSensitive(js, "schema");
    if (!schema || cJSON_IsNull(schema)) {
        cJSON *any = cJSON_CreateObject();
        bool ok = any && cJSON_AddStringToObject(any, "type", "object") &&
                  sb__srv_schema_grammar(srv, any, "response_format.json_schema.schema", r, e);
        cJSON_Delete(any);
        return ok;
    }
    if (!cJSON_IsObject(schema) && !cJSON_IsBool(schema))
        return refuse(e, "response_format.json_schema.schema", "invalid_type",
                      "'response_format.json_schema.schema' must be a JSON Schema object");
    return sb__srv_schema_grammar(srv, schema, "response_format.json_schema.schema", r, e);
}

/* {"token id": bias, ...} */
static bool parse_logit_bias(sb_srv *srv, const cJSON *lb, sb_oai_req *r, sb_oai_err *e) {
    if (!cJSON_IsObject(lb))
        return refuse(e, "logit_bias", "invalid_type", "'logit_bias' must be an object of token ids to numbers");
    int n = cJSON_GetArraySize(lb);
    if (n == 0)
        return true;
    if (n > 1024)
        return refuse(e, "logit_bias", "invalid_value", "'logit_bias' has more than 1024 entries");
    r->logit_bias = sb_malloc((size_t)n * sizeof *r->logit_bias);
    if (!r->logit_bias) {
        sb_oai_err_set(e, 500, "server_error", NULL, "logit_bias", "out of memory");
        return false;
    }
    int32_t n_vocab = sb_model_n_vocab(sb_held_model(r->held));
    const cJSON *m;
    cJSON_ArrayForEach(m, lb) {
        char *end;
        long id = strtol(m->string, &end, 10);
        if (!m->string[0] || *end || id < 0 || id >= n_vocab) {
            sb_oai_err_set(e, 400, "invalid_request_error", "invalid_value", "logit_bias",
                           "'logit_bias' key '%.40s' is not a token id of this model (0..%d)", m->string,
                           (int)n_vocab - 1);
            return false;
        }
        if (!cJSON_IsNumber(m) || !(m->valuedouble >= -100 && m->valuedouble <= 100)) {
            sb_oai_err_set(e, 400, "invalid_request_error", "invalid_value", "logit_bias",
                           "'logit_bias' of token %ld must be a number in [-100, 100]", id);
            return false;
        }
        r->logit_bias[r->n_logit_bias++] = (sb_logit_bias){(int32_t)id, (float)m->valuedouble};
    }
    r->sampling.logit_bias = r->logit_bias;
    r->sampling.n_logit_bias = r->n_logit_bias;
    return true;
}

bool sb__srv_parse_constraints(sb_srv *srv, const cJSON *root, bool chat, sb_oai_req *r, sb_oai_err *e) {
    const cJSON *lb = cJSON_GetObjectItemCaseSensitive(root, "logit_bias");
    if (lb && !cJSON_IsNull(lb) && !parse_logit_bias(srv, lb, r, e))
        return false;
    const cJSON *rf = chat ? cJSON_GetObjectItemCaseSensitive(root, "response_format") : NULL;
    const cJSON *gr = cJSON_GetObjectItemCaseSensitive(root, "grammar");
    bool has_rf = rf && !cJSON_IsNull(rf);
    if (gr && !cJSON_IsNull(gr)) {
        if (!cJSON_IsString(gr))
            return refuse(e, "grammar", "invalid_type", "'grammar' must be a string of GBNF rules");
        const cJSON *rt = has_rf && cJSON_IsObject(rf) ? cJSON_GetObjectItemCaseSensitive(rf, "type") : NULL;
        if (has_rf && !(cJSON_IsString(rt) && strcmp(rt->valuestring, "text") == 0))
            return refuse(e, "grammar", "invalid_value", "'grammar' and a JSON 'response_format' cannot be combined");
        if (gr->valuestring[0])
            return sb__srv_grammar(srv, gr->valuestring, strlen(gr->valuestring), "grammar", r, e);
    }
    return !has_rf || parse_response_format(srv, rf, r, e);
}
