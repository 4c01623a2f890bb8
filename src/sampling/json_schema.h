/*
 * json_schema.h - JSON Schema to GBNF: the grammar of the JSON texts a
 * schema accepts, for response_format json_schema and tool arguments.
 *
 * Every keyword that constrains is either enforced by the grammar or
 * refused: an unsupported keyword (or combination) fails with
 * SB_ERR_UNSUPPORTED and a message naming the keyword and its JSON path
 * ("#/properties/tags/items"), never silently ignored. Annotations (title,
 * description, examples, ...) are ignored. What is enforced, and how
 * (floats with bounds, formats, oneOf), is in docs/STRUCTURED.md.
 */
#ifndef SB_SAMPLING_JSON_SCHEMA_H
#define SB_SAMPLING_JSON_SCHEMA_H

#include <stddef.h>

#include "switchboard.h"

struct cJSON;

/* The GBNF text (sb_malloc'd, NUL-terminated; *len its length) whose root
 * rule matches what `schema` accepts, optionally followed by whitespace.
 * Fails with SB_ERR_UNSUPPORTED (a keyword that cannot be enforced) or
 * SB_ERR_INVALID_ARG (a malformed schema), err naming keyword and path. */
sb_status sb_json_schema_to_gbnf(const struct cJSON *schema, char **gbnf, size_t *len, sb_error *err);

/* The same with every rule name prefixed (the start rule is prefix +
 * "root"), so that several schemas' rules can share one grammar. */
sb_status sb_json_schema_to_gbnf_prefixed(const struct cJSON *schema, const char *prefix, char **gbnf, size_t *len,
                                          sb_error *err);

#endif
