/*
 * structured.h - the request fields that constrain what a chat or
 * completion may generate: `response_format` (json_object, json_schema),
 * `grammar` (GBNF text, as llama-server takes it) and `logit_bias`.
 *
 * A constraint that is accepted is enforced (a grammar masks every step);
 * one that cannot be is refused with a 400 naming it: an unsupported JSON
 * Schema keyword by keyword and path, a bad grammar by line and column.
 */
#ifndef SB_SRV_STRUCTURED_H
#define SB_SRV_STRUCTURED_H

#include <stdbool.h>

#include "server/openai.h"

struct cJSON;

/* Parses the fields into r->grammar (a reference r owns) and
 * r->logit_bias; with `chat`, response_format too. On failure fills e. */
bool sb__srv_parse_constraints(sb_srv *srv, const struct cJSON *root, bool chat, sb_oai_req *r, sb_oai_err *e);

/* A grammar for r from GBNF text (param names the field in errors). */
bool sb__srv_grammar(sb_srv *srv, const char *gbnf, size_t len, const char *param, sb_oai_req *r, sb_oai_err *e);

/* Compiles a JSON schema to r->grammar; a refused keyword is a 400 on param. */
bool sb__srv_schema_grammar(sb_srv *srv, const struct cJSON *schema, const char *param, sb_oai_req *r,
                            sb_oai_err *e);

#endif
