/*
 * admin.h - the administration routes and the prompt library's listing:
 * GET /admin/models (every model's state, version, memory, requests, last
 * use, last load error), POST /admin/models/{name}/load and .../unload,
 * POST /admin/reload (re-read the registry: a bad file is a 400 naming line
 * and field, and changes nothing), GET /v1/prompts.
 */
#ifndef SB_SRV_ADMIN_H
#define SB_SRV_ADMIN_H

#include <stdbool.h>

#include "api/api-internal.h"
#include "server/buf.h"
#include "server/openai.h"

typedef struct sb_srv sb_srv;

/* Answers an /admin/... request for `url` (the method was routed already):
 * true with the JSON body in out, or false with the error in e. */
bool sb_srv_admin(sb_srv *srv, const char *url, sb_srv_buf *out, sb_oai_err *e);

/* GET /v1/prompts: {"object": "list", "data": [{id, version, description,
 * template, variables, model, builtin}, ...]}. */
void sb_srv_admin_prompts_json(const sb_regfile *rf, sb_srv_buf *out);

#endif
