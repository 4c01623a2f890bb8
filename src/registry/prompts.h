/*
 * prompts.h - the prompt library: reusable prompt templates with variables,
 * from the registry file (regfile.h, "prompts") and a small built-in set
 * compiled into the binary (story writing, marketing copy, code generation,
 * summarisation). A prompt in the file hides every built-in of its id.
 *
 * Template syntax: `{{name}}` (spaces inside the braces allowed: `{{ name }}`)
 * is replaced by the variable's value; a name is letters, digits, '_', '-'
 * and '.', not starting with a digit. `{{{{` writes a literal `{{` (a lone
 * `}}` needs no escape). Anything else after `{{` - an unterminated
 * placeholder, a bad name - is an error naming its byte offset.
 *
 * Variable values come from the request's `variables` object first, then the
 * prompt's defaults; strings are inserted as they are, numbers as JSON writes
 * them, booleans as true/false, and OpenAI's text input objects
 * ({"type": "input_text", "text": "..."}) as their text.
 */
#ifndef SB_REGISTRY_PROMPTS_H
#define SB_REGISTRY_PROMPTS_H

#include <stdbool.h>
#include <stddef.h>

#include <cjson/cJSON.h>

#include "registry/regfile.h"

/* Renders p with `variables` (a JSON object, or NULL for none). On success
 * *out is a NUL-terminated sb_malloc'd string the caller frees with sb_free.
 * Fails (SB_ERR_INVALID_ARG, *out NULL) for a variable with no value, a
 * variable given that the template does not use (a misspelt name would
 * otherwise be silently ignored), a value of another kind (images and files
 * included), or `variables` not an object; the message names the prompt and
 * the variable. */
sb_status sb_prompt_render(const sb_regfile_prompt *p, const cJSON *variables, char **out, sb_error *err);

/* Checks a template's syntax without rendering it (what the registry file's
 * validation runs on every prompt); on failure *offset is the byte offset of
 * the problem and err says what it is. */
sb_status sb_prompt_check(const char *template_text, size_t *offset, sb_error *err);

/* True if the template has a {{name}} placeholder. */
bool sb_prompt_uses(const char *template_text, const char *name);

/* The prompt of that id and version in rf (the file's and the built-ins it
 * does not override); version NULL = the latest. NULL if there is none. */
const sb_regfile_prompt *sb_prompt_find(const sb_regfile *rf, const char *id, const char *version);

/* sb_prompt_find with an error (SB_ERR_NOT_FOUND) that lists the ids, or the
 * versions of the id, that do exist. */
sb_status sb_prompt_lookup(const sb_regfile *rf, const char *id, const char *version, const sb_regfile_prompt **out,
                           sb_error *err);

/* Orders versions: numerically when both are numbers ("10" > "9"), else as
 * strings (strcmp). <0, 0, >0 like strcmp. */
int sb_prompt_version_cmp(const char *a, const char *b);

/* The built-in library as registry-file JSON ({"prompts": [...]}), parsed by
 * the registry file's own code into every sb_regfile. */
extern const char sb_prompt_builtin_json[];

#endif
