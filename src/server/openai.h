/*
 * openai.h - the OpenAI API's request and response shapes: parsing a
 * /v1/chat/completions, /v1/completions or /v1/embeddings body into token
 * prompts and the public API's parameters (switchboard.h), and building the
 * JSON answers (whole, or as server-sent-event chunks) from its events.
 *
 * Parsing is strict where OpenAI is: a field of the wrong type or out of
 * range is a 400 naming it, and fields OpenAI defines but switchboard does
 * not implement (audio, prediction, ...) are refused by name rather than
 * silently ignored. Fields OpenAI does not define are ignored.
 */
#ifndef SB_SRV_OPENAI_H
#define SB_SRV_OPENAI_H

#include <stdbool.h>
#include <stdint.h>

#include "api/api-internal.h"
#include "gateway/caller.h"
#include "server/buf.h"
#include "switchboard.h"

typedef struct sb_srv sb_srv;

typedef enum sb_oai_kind { SB_OAI_CHAT, SB_OAI_COMPLETION, SB_OAI_EMBEDDING } sb_oai_kind;

#define SB_OAI_MAX_STOPS 16
#define SB_OAI_MAX_CHOICES 128 /* n times the prompts (or embedding inputs) of one request */

/* An error answer: HTTP status and the fields of {"error": {...}}. */
typedef struct sb_oai_err {
    unsigned status;
    char message[600];
    char param[128];  /* "" renders as null */
    const char *type; /* "invalid_request_error", "server_error" */
    const char *code; /* NULL renders as null */
} sb_oai_err;

/* s[0..len) for quoting in a message: valid UTF-8 (an invalid byte becomes
 * U+FFFD), at most max bytes cut between characters, then "..."; into out
 * (cap > 4), which it returns. */
const char *sb_oai_quote(const char *s, size_t len, size_t max, char *out, size_t cap);
/* Sets e to an error (message printf-style, made valid UTF-8 by
 * sb_oai_quote); param may be NULL. */
void sb_oai_err_set(sb_oai_err *e, unsigned status, const char *type, const char *code, const char *param,
                    const char *fmt, ...) SB_PRINTF(6, 7);
/* Appends {"error": {...}} to out. */
void sb_oai_err_json(const sb_oai_err *e, sb_srv_buf *out);

/* A parsed request. Every pointer is owned (sb_malloc'd) and freed by sb_oai_req_free. */
typedef struct sb_oai_req {
    sb_oai_kind kind;
    bool stream;
    bool include_usage;    /* stream_options.include_usage */
    int32_t n;             /* choices per prompt */
    int32_t n_prompts;     /* prompts (completions may send several; embeddings: inputs) */
    int32_t n_choices;     /* n * n_prompts; choice c uses prompt c / n */
    int32_t **prompts;     /* n_prompts token lists */
    int32_t *prompt_lens;
    int32_t max_tokens;    /* <= 0: until the context is full */
    sb_sampler_params sampling; /* the seed is the first choice's; choice c adds c % n */
    char *stops[SB_OAI_MAX_STOPS];
    size_t n_stops;
    bool logprobs;
    int32_t top_logprobs;
    bool base64;           /* embeddings: encoding_format "base64" */
    sb_held_t *held;       /* the model that serves it, held until the request is freed */
    const sb_reg_lease *lease; /* the held model's (its chat template and registry entry) */
    double keep_alive_s;   /* the request's keep_alive, or SB_KEEP_ALIVE_UNCHANGED */
    struct sb_registry *reg;               /* where library_file came from */
    const sb_regfile *library_file;        /* held while library points into it */
    const sb_regfile_prompt *library;      /* the library prompt the request names, or NULL */
    char *library_text;                    /* it, rendered */
    sb_grammar_t *grammar;      /* a reference, or NULL: response_format, grammar, tools */
    enum { SB_OAI_TOOLS_NONE, SB_OAI_TOOLS_AUTO, SB_OAI_TOOLS_REQUIRED } tool_mode;
    int tool_family;            /* sb_tool_family (server/tools.h) */
    bool parallel_tools;
    struct cJSON *tools;        /* the request's tools (owned), unless tool_mode is NONE */
    char *tools_json;           /* their JSON text, for the chat template (cJSON_free) */
    sb_logit_bias *logit_bias;  /* n_logit_bias entries (sampling points here) */
    int32_t n_logit_bias;
    sb_gw_caller caller;        /* who asks (src/gateway/caller.h); zeroed: anonymous, priority 0 */
} sb_oai_req;

/* Parses `len` bytes of body for an endpoint of `kind`. On failure fills e
 * (400 bad JSON or parameter, 404 unknown model) and returns false; *out is
 * then empty (sb_oai_req_free is still allowed). */
bool sb_oai_parse(sb_srv *srv, sb_oai_kind kind, const char *body, size_t len, sb_oai_req *out, sb_oai_err *e);
void sb_oai_req_free(sb_oai_req *r);
/* The public API's call for r: one input per choice (inputs[c] prompts
 * c / n, its seed apart by c % n) and the parameters (pointers into r). */
void sb_oai_inputs(const sb_oai_req *r, sb_input *inputs, sb_infer_params *params);

/* One choice's results as they accumulate. */
typedef struct sb_oai_choice {
    sb_srv_buf text;
    struct cJSON *logprobs; /* chat: the "content" array; completions: the logprobs object */
    size_t text_offset;     /* completions logprobs: bytes of text so far */
    bool done;
    sb_finish_reason finish;
    int32_t n_prompt, n_cached, n_generated;
    float *embedding;       /* owned */
    int32_t n_embd;
    char *error;            /* owned; SB_FINISHED_ERROR */
    struct sb_tool_stream *tools; /* streaming with tools: what is held back (owned) */
} sb_oai_choice;

/* The answer being built for one request. */
typedef struct sb_oai_resp {
    sb_srv *srv;
    const sb_oai_req *req; /* borrowed */
    char id[48];           /* "chatcmpl-..." / "cmpl-..." */
    int64_t created;
    sb_served served;      /* the model that serves and why (the "model" and "metadata" fields) */
    int32_t n_done;
    sb_oai_choice *choices; /* req->n_choices */
} sb_oai_resp;

/* Returns false if out of memory. */
bool sb_oai_resp_init(sb_oai_resp *r, sb_srv *srv, const sb_oai_req *req);
void sb_oai_resp_free(sb_oai_resp *r);

/* Whole answers: feed every event, then render. _body returns false with e
 * set when a choice failed in the engine (500) or memory ran out. */
void sb_oai_resp_add(sb_oai_resp *r, const sb_stream_event *ev);
bool sb_oai_resp_body(sb_oai_resp *r, sb_srv_buf *out, sb_oai_err *e);

/* Streaming: _start appends what can be sent before any token (the chat
 * role chunks); _chunk appends the SSE lines ("data: {...}\n\n") one event makes to
 * out; after the last choice's DONE, the usage chunk (if asked for) and
 * "data: [DONE]\n\n". Returns true once that end has been appended. */
void sb_oai_resp_start(sb_oai_resp *r, sb_srv_buf *out);
bool sb_oai_resp_chunk(sb_oai_resp *r, const sb_stream_event *ev, sb_srv_buf *out);

/* Body of GET /v1/models (id NULL: every name a client may use) or of
 * GET /v1/models/{id}; false (nothing appended) if no name is id. */
bool sb_oai_models_json(sb_srv *srv, const char *id, sb_srv_buf *out);

#endif
