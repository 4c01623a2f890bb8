/*
 * template.h - chat templates: a Jinja interpreter that renders a model's
 * chat_template exactly as Hugging Face transformers' apply_chat_template
 * does with Python Jinja2 3.1 (trim_blocks and lstrip_blocks on, tojson and
 * raise_exception as transformers defines them, strftime_now on a clock the
 * caller may fix), plus a few built-in templates for common model families.
 *
 * Parse once, render many times: a parsed sb_tpl is read-only and may be
 * rendered from several threads at once. Every failure - a syntax error, a
 * construct or filter this engine lacks, raise_exception() in the template,
 * a runaway template (recursion, output size, step budget) - comes back as an
 * sb_status with a message naming the template line and column.
 *
 * Non-goals: template inheritance and includes ({% extends %}, {% include %},
 * {% import %}), autoescaping, async, and Jinja's i18n extension.
 */
#ifndef SB_TEMPLATE_H
#define SB_TEMPLATE_H

#include <stdbool.h>
#include <stddef.h>

#include "switchboard.h"

typedef struct sb_tpl sb_tpl;

/* Parses `len` bytes of Jinja source. On failure *out is NULL and err names
 * the line:column (SB_ERR_FORMAT for syntax errors, SB_ERR_UNSUPPORTED for
 * constructs this engine lacks). */
sb_status sb_tpl_parse(const char *src, size_t len, sb_tpl **out, sb_error *err);
void sb_tpl_free(sb_tpl *tpl);

/* What apply_chat_template passes to the template. */
typedef struct sb_tpl_chat {
    const char *messages_json; /* JSON array of {"role", "content", ...} objects */
    const char *tools_json;    /* JSON array or null, or NULL: `tools` is not defined */
    const char *extra_json;    /* JSON object of further variables (e.g. enable_thinking), or NULL */
    bool add_generation_prompt;
    const char *bos_token; /* NULL: `bos_token` is not defined */
    const char *eos_token; /* NULL: `eos_token` is not defined */
    const char *now;       /* strftime_now's clock, "YYYY-MM-DD[ T]HH:MM[:SS]"; NULL: local time */
} sb_tpl_chat;

/* Renders the conversation into *out (sb_malloc'd, NUL-terminated, freed by
 * the caller with sb_free; *out_len bytes without the NUL). On failure *out
 * is NULL: SB_ERR_INVALID_ARG for bad JSON input, raise_exception() and
 * type errors; SB_ERR_UNSUPPORTED for missing features and exceeded limits. */
sb_status sb_tpl_render_chat(const sb_tpl *tpl, const sb_tpl_chat *chat, char **out, size_t *out_len,
                             sb_error *err);

/* Jinja source of a built-in template (llama2, llama3, chatml, mistral,
 * gemma, phi3), or NULL for an unknown name. Static storage. */
const char *sb_tpl_builtin_source(const char *name);
/* The built-in names, comma-separated (for usage messages). */
const char *sb_tpl_builtin_names(void);

#endif
