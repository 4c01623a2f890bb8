/*
 * regfile.h - the registry file (`models.json`): what switchboard serves,
 * read into plain structs and validated whole. Pure data: nothing here loads
 * a model; the runtime (registry.c) reads these structs to load, route and
 * swap. A file that fails any check gives no sb_regfile at all, and the error
 * names the file, the line and the field, so a reload that fails leaves the
 * running registry as it was.
 *
 * The file (every field optional unless marked required):
 *
 *   {
 *     "fallback": "stories",          serves model names the registry does not know
 *     "models": [                     required (may be empty)
 *       {"name": "stories",           required; names, aliases and route names share one namespace
 *        "path": "stories260K.gguf",  required; relative to the registry file's directory
 *        "device": "cpu",             only "cpu" (the only backend); default "cpu"
 *        "aliases": ["tiny"],
 *        "context": 512,              KV-cache length; 0 or absent = the model's trained context
 *        "cache_type": "f16",         f32 | f16 | q8_0; absent = the server's default
 *        "parallel": 4,               sequences decoded together; absent = the server's default
 *        "system_prompt": "You are ...",
 *        "chat_template": "t.jinja",  a Jinja file (relative like path) replacing the GGUF's template
 *        "keep_alive": "5m",          duration ("500ms", "30s", "5m", "1h30m", "0", "-1") or seconds;
 *                                     negative = forever, 0 = unload as soon as idle;
 *                                     absent = the server's default
 *        "pinned": false,             never evicted to make room
 *        "price": {"prompt": 0.15, "completion": 0.60},   per million tokens
 *        "fallback": "other-model",   serves this model's requests when it fails to load
 *        "parameters": {PARAMS}}      default sampling for requests that do not set them
 *     ],
 *     "routes": [                     virtual models splitting traffic by weight (A/B tests)
 *       {"name": "story-ab",          required
 *        "split": [{"model": "stories", "weight": 80}, {"model": "stories-q8", "weight": 20}]}
 *     ],
 *     "prompts": [                    reusable prompts; an id here hides the built-in of that id
 *       {"id": "story",               required
 *        "version": "2",              string or number; default "1"
 *        "description": "...",
 *        "template": "Write a story about {{topic}}.",   required; see prompts.h for the syntax
 *        "model": "stories",          default model for requests naming this prompt
 *        "parameters": {PARAMS},
 *        "variables": {"topic": "a dragon"}}             defaults: strings, numbers or booleans
 *     ]
 *   }
 *
 *   PARAMS: temperature (>= 0), top_k (integer >= 0), top_p and min_p (0..1),
 *   repeat_penalty (> 0), repeat_last_n (integer >= -1), frequency_penalty and
 *   presence_penalty (-2..2), seed (integer >= 0), max_tokens (integer >= 1),
 *   stop (a string or an array of up to 16 strings).
 *
 * The minimal shape {"models": [{"name": ..., "path": ..., "device": "cpu"}]}
 * is a whole registry.
 *
 * Checks, each reported as "FILE:LINE: FIELD: what" (syntax errors as
 * "FILE:LINE:COL: ..."): JSON syntax, unknown and duplicate fields, wrong
 * types and out-of-range values, missing required fields, a duplicate name
 * (model, alias or route), a fallback, route or prompt naming an unknown
 * model, a loop through fallbacks and routes (aliases followed), a route
 * whose weights sum to 0 or with a negative weight, a bad duration, cache
 * type or device, a malformed prompt template, a duplicate prompt id and
 * version, and a model or template file that cannot be stat'ed (the message
 * gives the resolved path). The first problem in that order is reported.
 *
 * Ownership: an sb_regfile owns every string and array reachable from it
 * (all through sb_malloc); sb_regfile_free releases them together. It is
 * immutable after creation and may be read from any thread.
 */
#ifndef SB_REGISTRY_REGFILE_H
#define SB_REGISTRY_REGFILE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "switchboard.h"

/* keep_alive values (milliseconds otherwise). */
#define SB_REGFILE_FOREVER (-1)

/* Which sb_regfile_params fields the file set (bits of `set`). */
enum {
    SB_PARAM_TEMPERATURE = 1u << 0,
    SB_PARAM_TOP_K = 1u << 1,
    SB_PARAM_TOP_P = 1u << 2,
    SB_PARAM_MIN_P = 1u << 3,
    SB_PARAM_REPEAT_PENALTY = 1u << 4,
    SB_PARAM_REPEAT_LAST_N = 1u << 5,
    SB_PARAM_FREQUENCY_PENALTY = 1u << 6,
    SB_PARAM_PRESENCE_PENALTY = 1u << 7,
    SB_PARAM_SEED = 1u << 8,
    SB_PARAM_MAX_TOKENS = 1u << 9,
    SB_PARAM_STOP = 1u << 10,
};

/* Default generation parameters; only the fields whose bit is in `set` were
 * given, the others are zero. Layering (server defaults, then the model's,
 * then a prompt's, then the request's) is the caller's. */
typedef struct sb_regfile_params {
    uint32_t set; /* SB_PARAM_* bits */
    float temperature;
    int32_t top_k;
    float top_p;
    float min_p;
    float repeat_penalty;
    int32_t repeat_last_n;
    float frequency_penalty;
    float presence_penalty;
    uint64_t seed;
    int32_t max_tokens;
    char **stop; /* n_stop strings (owned) */
    size_t n_stop;
} sb_regfile_params;

/* Writes the sampling fields that p sets into s (others untouched);
 * max_tokens and stop are not sampling and stay for the caller to read. */
void sb_regfile_params_apply(const sb_regfile_params *p, sb_sampler_params *s);

/* What stat said about a file when the registry was read: the runtime
 * compares it with what it loaded to notice a file replaced or rewritten. */
typedef struct sb_regfile_file_id {
    uint64_t dev, ino, size;
    int64_t mtime_ns;
} sb_regfile_file_id;

typedef struct sb_regfile_model {
    char *name;              /* owned; never NULL */
    char *path;              /* owned; resolved against the registry's directory */
    sb_regfile_file_id file; /* of path, at read time */
    char *device;            /* owned; "cpu" */
    char **aliases;          /* n_aliases owned strings */
    size_t n_aliases;
    int32_t context;     /* 0 = the model's trained context */
    bool has_cache_type; /* false: the server's default */
    sb_cache_type cache_type;
    int32_t parallel;                      /* 0 = the server's default */
    char *system_prompt;                   /* owned; NULL = none */
    char *chat_template;                   /* owned, resolved path; NULL = the GGUF's own */
    sb_regfile_file_id chat_template_file; /* of chat_template, when set */
    bool has_keep_alive;                   /* false: the server's default */
    int64_t keep_alive_ms;                 /* SB_REGFILE_FOREVER, 0 (unload when idle) or milliseconds */
    bool pinned;
    double price_prompt;     /* per million prompt tokens; 0 if not given */
    double price_completion; /* per million completion tokens; 0 if not given */
    char *fallback;          /* owned; NULL = none; resolves (sb_regfile_resolve) */
    sb_regfile_params params;
    int line; /* of the entry in the file; 0 when not from a file */
} sb_regfile_model;

typedef struct sb_regfile_split {
    char *model;   /* owned; a model, alias or route name (resolves) */
    double weight; /* >= 0 */
} sb_regfile_split;

typedef struct sb_regfile_route {
    char *name;              /* owned */
    sb_regfile_split *split; /* n_split entries (owned) */
    size_t n_split;
    double total_weight; /* > 0 */
    int line;
} sb_regfile_route;

typedef struct sb_regfile_prompt {
    char *id;            /* owned */
    char *version;       /* owned; "1" when the file gave none */
    char *description;   /* owned; "" when the file gave none */
    char *template_text; /* owned; "{{name}}" placeholders, see prompts.h */
    char *model;         /* owned; NULL = the request's model */
    sb_regfile_params params;
    cJSON *variables; /* owned object of default values (strings, numbers, booleans); never NULL */
    bool builtin;     /* from the built-in library (prompts.c), not the file */
    int line;         /* 0 for built-ins */
} sb_regfile_prompt;

typedef struct sb_regfile {
    char *path;               /* owned; the file read, NULL for from_dir/one */
    char *fallback;           /* owned; NULL = unknown names are not found */
    sb_regfile_model *models; /* n_models, in file order */
    size_t n_models;
    sb_regfile_route *routes;
    size_t n_routes;
    sb_regfile_prompt *prompts; /* the file's, in file order, then the built-ins it does not override */
    size_t n_prompts;
    struct sb_regfile_name *names; /* private: every servable name, sorted, for sb_regfile_resolve */
    size_t n_names;
} sb_regfile;

/* Reads and validates the registry file at path. On success *out owns the
 * result (free with sb_regfile_free); on failure *out is NULL, err says
 * what and where, and the status is SB_ERR_IO (unreadable file),
 * SB_ERR_FORMAT (a check failed), SB_ERR_NOT_FOUND (a model or template file
 * missing) or SB_ERR_NOMEM. */
sb_status sb_regfile_load(const char *path, sb_regfile **out, sb_error *err);

/* The same from text in memory (len bytes, NUL not needed): `name` is what
 * messages call the file, relative paths resolve against `dir`. */
sb_status sb_regfile_parse(const char *text, size_t len, const char *name, const char *dir, sb_regfile **out,
                           sb_error *err);

/* A directory of GGUF files: one model per regular `*.gguf` file not
 * starting with '.', named after it without ".gguf", defaults for the rest,
 * in name order. An empty directory is an empty registry. */
sb_status sb_regfile_from_dir(const char *dir, sb_regfile **out, sb_error *err);

/* One model file (`-m FILE`): `name` NULL = the file's base name without ".gguf". */
sb_status sb_regfile_one(const char *path, const char *name, sb_regfile **out, sb_error *err);

void sb_regfile_free(sb_regfile *rf);

typedef enum sb_regfile_kind {
    SB_REGFILE_NONE = 0, /* no model, alias or route of that name */
    SB_REGFILE_MODEL,
    SB_REGFILE_ROUTE,
} sb_regfile_kind;

/* Maps a model name, alias or route name to its entry: sets *model or *route
 * (either may be NULL when the caller does not want it; the other is set to
 * NULL) and returns which. Does not apply rf->fallback: serving an unknown
 * name through it is the caller's decision (the response must say so). */
sb_regfile_kind sb_regfile_resolve(const sb_regfile *rf, const char *name, const sb_regfile_model **model,
                                   const sb_regfile_route **route);

/* Every field equal, the files' identities included. */
bool sb_regfile_equal_model(const sb_regfile_model *a, const sb_regfile_model *b);
/* An instance loaded for a can serve b unchanged: the same file (path and
 * identity), context, cache type, parallel, device and chat template. The
 * other fields (name, aliases, prices, parameters, keep_alive, ...) are read
 * per request and never need a reload. */
bool sb_regfile_model_same_load(const sb_regfile_model *a, const sb_regfile_model *b);

/* Parses a keep_alive duration: a sequence of <number><unit> with units ms,
 * s, m, h ("1h30m", "1.5s"), or a bare number of seconds ("300", "-1").
 * Negative = SB_REGFILE_FOREVER. false for anything else (or overflow). */
bool sb_regfile_parse_duration(const char *s, int64_t *ms);

/* Internal, for the fuzz harness: the offset where each JSON value of a
 * valid text starts (a member's: where its name starts), in document order;
 * writes at most cap and returns the count. */
size_t sb__regfile_scan(const char *text, size_t len, size_t *offsets, size_t cap);

#endif
