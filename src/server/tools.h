/*
 * tools.h - OpenAI tool calling through the model's own chat template.
 *
 * The request's `tools` go to the template (which writes them into the
 * prompt as the model was trained to read them); the model answers in its
 * family's syntax, which is parsed back into OpenAI `tool_calls`:
 *   - Llama 3.1 / 3.2: a JSON object {"name", "parameters"} as the whole
 *     answer (after <|python_tag|>, which is a control token and not text);
 *   - Qwen2.5 / Qwen3 / Hermes: <tool_call>{"name", "arguments"}</tool_call>
 *     blocks;
 *   - Mistral: [TOOL_CALLS] followed by a JSON array of {"name", "arguments"};
 *   - any other template: a JSON object {"name", "arguments"} (or an array
 *     of them) as the whole answer.
 * The family is recognised from the template's text.
 *
 * Enforcement: with tool_choice "required" or a named function, a grammar
 * built from the tools' parameter schemas makes the answer a call (of that
 * function) whose arguments validate. With "auto" the grammar lets free text
 * run until the family's opening marker and from there enforces a call
 * (Llama 3: an answer starting with '{' must be a call; the generic family
 * is parsed, not enforced). "none" renders no tools and enforces nothing.
 *
 * Streaming: text that may still open a call is held back; a call's text is
 * held until the answer ends and then sent as OpenAI sends calls: a delta
 * with the call's index, id, type and name, then deltas of its arguments.
 */
#ifndef SB_SRV_TOOLS_H
#define SB_SRV_TOOLS_H

#include <stdbool.h>
#include <stddef.h>

#include "server/buf.h"
#include "server/openai.h"

struct cJSON;

typedef enum sb_tool_family {
    SB_TOOLS_GENERIC,
    SB_TOOLS_LLAMA3,
    SB_TOOLS_HERMES,
    SB_TOOLS_MISTRAL,
} sb_tool_family;

/* The tool-call syntax a chat template's source implies. */
sb_tool_family sb__tools_family(const char *template_source);

/* Parses tools, tool_choice and parallel_tool_calls of a chat request into
 * r (tools_json for the template, the tool mode, and a grammar when the
 * choice is enforced). Must run before the prompt is rendered. */
bool sb__srv_parse_tools(sb_srv *srv, const struct cJSON *root, sb_oai_req *r, sb_oai_err *e);

/* Rewrites one message's tool_calls (OpenAI's, arguments as JSON text) into
 * what templates read (arguments as objects) in place; false with e set if
 * they are malformed. */
bool sb__tools_message(const struct cJSON *in, struct cJSON *out, int index, sb_oai_err *e);

/* Splits a whole answer into content (*content: sb_malloc'd, may be empty)
 * and OpenAI tool_calls (NULL if the answer is no call). */
struct cJSON *sb__tools_parse(sb_srv *srv, const sb_oai_req *r, const char *text, size_t len, char **content);

/* Streaming: feeds generated text and appends to *emit what may be shown
 * as content now (held back: what may still open a call). */
typedef struct sb_tool_stream {
    sb_srv_buf text; /* everything generated */
    size_t shown;    /* bytes of text already given out as content */
    bool in_call;    /* a call has opened: nothing more is content */
} sb_tool_stream;
void sb__tools_stream_push(const sb_oai_req *r, sb_tool_stream *ts, const char *text, size_t len, sb_srv_buf *emit);
void sb__tools_stream_free(sb_tool_stream *ts);

#endif
