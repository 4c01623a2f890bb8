/*
 * switchboard.h - the public C API of the switchboard inference engine.
 *
 * Everything a program embedding switchboard needs: loading a GGUF model,
 * tokenizing, evaluating tokens in an inference context (which owns the KV
 * cache), and sampling. Handles are opaque; each `_create`/`_load` has a
 * matching `_free`. Every function that can fail returns an sb_status (0 on
 * success, negative on failure) and, when given a non-NULL sb_error, writes a
 * one-line message there saying what was wrong and where.
 *
 * Threading: a model is read-only after load and may be shared by contexts
 * on different threads; a context or sampler is used by one thread at a time.
 */
#ifndef SWITCHBOARD_H
#define SWITCHBOARD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* libswitchboard is built with every symbol hidden except what this header
 * declares: the shared library exports exactly the public API. */
#if defined(__GNUC__)
#pragma GCC visibility push(default)
#endif

/* One list drives the enum and sb_status_str(), so they cannot drift. */
#define SB_STATUS_LIST(X)                                                   \
    X(SB_OK, 0, "success")                                                  \
    X(SB_ERR_IO, -1, "input/output error")                                  \
    X(SB_ERR_NOMEM, -2, "out of memory")                                    \
    X(SB_ERR_FORMAT, -3, "malformed file")                                  \
    X(SB_ERR_UNSUPPORTED, -4, "unsupported feature")                        \
    X(SB_ERR_INVALID_ARG, -5, "invalid argument")                           \
    X(SB_ERR_CONTEXT_FULL, -6, "context length exceeded")                   \
    X(SB_ERR_NOT_FOUND, -7, "not found")                                    \
    X(SB_ERR_BUSY, -8, "busy: too many requests waiting")                   \
    X(SB_ERR_MODEL_NOT_FOUND, -9, "no such model")                          \
    X(SB_ERR_OVER_BUDGET, -10, "the model does not fit the memory budget")

typedef enum sb_status {
#define SB_STATUS_ENUM(name, value, text) name = value,
    SB_STATUS_LIST(SB_STATUS_ENUM)
#undef SB_STATUS_ENUM
} sb_status;

/* Static text for a status; never NULL (unknown values give "unknown status"). */
const char *sb_status_str(sb_status status);

/* Detail of the last failure of a call that was handed this struct. */
typedef struct sb_error {
    sb_status status;
    char msg[512]; /* one line, NUL-terminated, names the file/offset/field */
} sb_error;

/* Process-wide allocator hook, set once at start-up before any other call.
 * Library allocations go through it (mmap'd weights do not). NULL restores
 * the C library's malloc/realloc/free. */
typedef struct sb_allocator {
    void *(*malloc_fn)(size_t size, void *user);
    void *(*realloc_fn)(void *ptr, size_t size, void *user);
    void (*free_fn)(void *ptr, void *user);
    void *user;
} sb_allocator;
void sb_set_allocator(const sb_allocator *allocator);

/* Where the library's diagnostics go: it never writes to stderr itself. A
 * line is one message without a newline (a warning such as SB_CPU naming a
 * level this CPU lacks; the failed check before the abort hook runs). May be
 * called from any thread. Set once at start-up, like the allocator; NULL
 * (the default) drops every line. */
typedef enum sb_log_level { SB_LOG_ERROR = 0, SB_LOG_WARN = 1, SB_LOG_INFO = 2 } sb_log_level;
typedef void (*sb_log_fn)(void *user, int level, const char *line);
void sb_set_log_callback(sb_log_fn fn, void *user);

/* Called when the library catches a programmer error (a broken internal
 * invariant, or a misuse such as freeing an executor that still has
 * engines), after the message went to the log callback. It must not return
 * (it may longjmp); if it does, the library calls abort(). NULL restores
 * plain abort(). These checks stay in every build type. */
typedef void (*sb_abort_fn)(const char *msg);
void sb_set_abort_hook(sb_abort_fn fn);

/* ---- model ------------------------------------------------------------- */

typedef struct sb_model sb_model_t;

/* Maps the GGUF file at `path` read-only and prepares the model and its
 * tokenizer. Weights stay in the mapping; nothing is copied to the heap.
 * On failure *out is NULL and err says why. */
sb_status sb_model_load(const char *path, sb_model_t **out, sb_error *err);
void sb_model_free(sb_model_t *model);

typedef struct sb_model_params {
    /* Read the file into private memory instead of mapping it: the model then
     * never reads the file again, so it may be replaced or rewritten in place
     * while the model serves (a mapping would change, or fault, under it).
     * Costs one read of the file at load. */
    bool private_copy;
} sb_model_params;
sb_model_params sb_model_default_params(void);
/* sb_model_load with parameters (NULL: the defaults, as sb_model_load). */
sb_status sb_model_load_with(const char *path, const sb_model_params *params, sb_model_t **out, sb_error *err);
/* Bytes the model holds in memory now: its packed weights and embedding
 * copy, and the part of the file's image that is resident (measured with
 * mincore, so a mapped file's pages count only once read). */
size_t sb_model_memory(const sb_model_t *model);

int32_t sb_model_n_vocab(const sb_model_t *model);
int32_t sb_model_n_ctx_train(const sb_model_t *model);
int32_t sb_model_n_embd(const sb_model_t *model); /* width of the hidden state (and of embeddings) */
int32_t sb_model_token_bos(const sb_model_t *model); /* -1 if none */
int32_t sb_model_token_eos(const sb_model_t *model); /* -1 if none */
bool sb_model_add_bos(const sb_model_t *model);
/* True if generation should stop at this token (EOS and other end markers). */
bool sb_model_token_is_eog(const sb_model_t *model, int32_t token);

/* ---- tokenizer --------------------------------------------------------- */

/* Tokenizes `len` bytes of `text`. With add_special, BOS is prepended when
 * the vocabulary asks for it; with parse_special, special-token text such as
 * "<s>" becomes its token instead of plain text. Writes at most `cap` ids;
 * *n_out receives the number of ids the text needs, so a caller can size the
 * buffer by calling with cap 0 first. Fails with SB_ERR_INVALID_ARG if cap
 * is too small (ids then holds the first cap ids). */
sb_status sb_tokenize(const sb_model_t *model, const char *text, size_t len, bool add_special,
                      bool parse_special, int32_t *ids, size_t cap, size_t *n_out, sb_error *err);

/* The vocabulary string of a token as stored in the model (NUL-terminated,
 * owned by the model), or NULL for an id out of range. */
const char *sb_token_text(const sb_model_t *model, int32_t token);

/* Streaming detokenizer: feed tokens one by one and receive only complete
 * UTF-8 text; a character split across tokens is held back until whole.
 * Its output is always valid UTF-8: bytes that do not form a character
 * (byte-fallback tokens such as <0xF8>) become U+FFFD, one per maximal
 * ill-formed subpart, so text meant for JSON or a terminal can use it as it
 * is. Otherwise it is exactly sb_detokenize's output, piece by piece. */
typedef struct sb_detok sb_detok_t;
/* `strip_leading_space`: drop the SentencePiece dummy-prefix space of the
 * first piece (true when decoding a text from its beginning). */
sb_status sb_detok_create(const sb_model_t *model, bool strip_leading_space, sb_detok_t **out,
                          sb_error *err);
/* Appends the text of `token` that is complete so far to out (capacity cap,
 * NUL-terminated); returns the number of bytes written, excluding the NUL.
 * cap >= 256 always suffices for one token (what does not fit is kept for the
 * next call). With render_special, control tokens
 * produce their text. */
size_t sb_detok_push(sb_detok_t *detok, int32_t token, bool render_special, char *out, size_t cap);
/* Emits what is held back (a truncated character becomes U+FFFD). */
size_t sb_detok_flush(sb_detok_t *detok, char *out, size_t cap);
void sb_detok_free(sb_detok_t *detok);

/* Whole-sequence detokenization into a caller buffer; *n_out receives the
 * bytes needed (NUL excluded). Fails with SB_ERR_INVALID_ARG if cap <= that.
 * The tokens' exact bytes, as llama.cpp's llama_detokenize gives them: not
 * necessarily valid UTF-8 (byte-fallback tokens pass through as bytes), so
 * that tokenizing the result gives the same bytes back. */
sb_status sb_detokenize(const sb_model_t *model, const int32_t *ids, size_t n, bool strip_leading_space,
                        bool render_special, char *out, size_t cap, size_t *n_out, sb_error *err);

/* ---- inference context ------------------------------------------------- */

typedef struct sb_ctx sb_ctx_t;

/* What the KV cache holds keys and values in. F32 is exact attention (the
 * default, what the fixtures' llama.cpp answers were computed with); F16
 * halves the cache and the bytes attention reads (llama.cpp's default), Q8_0
 * (blocks of 32 int8 and a scale, as llama.cpp's q8_0 cache) halves them
 * again. Queries meet keys converted as for the keys' type's dot products,
 * as in llama.cpp. Q8_0 needs a head size that is a multiple of 32. */
typedef enum sb_cache_type { SB_CACHE_F32 = 0, SB_CACHE_F16 = 1, SB_CACHE_Q8_0 = 2 } sb_cache_type;
/* "f32" / "f16" / "q8_0"; false for any other name. */
bool sb_cache_type_parse(const char *name, sb_cache_type *out);
const char *sb_cache_type_name(sb_cache_type type);

typedef struct sb_ctx_params {
    int32_t n_ctx;            /* KV-cache length in tokens; 0 = the model's training context */
    int32_t n_threads;        /* worker threads; 0 = one per online core */
    sb_cache_type cache_type; /* SB_CACHE_F32 unless set */
} sb_ctx_params;
sb_ctx_params sb_ctx_default_params(void);

sb_status sb_ctx_create(const sb_model_t *model, const sb_ctx_params *params, sb_ctx_t **out,
                        sb_error *err);
void sb_ctx_free(sb_ctx_t *ctx);

/* Appends `n` tokens at the current position and computes the logits after
 * the last one. Fails with SB_ERR_CONTEXT_FULL (the context unchanged) if the
 * tokens do not fit, SB_ERR_INVALID_ARG for an id outside the vocabulary. */
sb_status sb_ctx_eval(sb_ctx_t *ctx, const int32_t *tokens, int32_t n, sb_error *err);
/* Logits (n_vocab floats) after the last evaluated token; owned by ctx and
 * overwritten by the next sb_ctx_eval. NULL before the first eval. */
const float *sb_ctx_logits(const sb_ctx_t *ctx);
int32_t sb_ctx_n_past(const sb_ctx_t *ctx);
int32_t sb_ctx_n_ctx(const sb_ctx_t *ctx);
/* Forgets every token (the KV cache becomes empty). */
void sb_ctx_reset(sb_ctx_t *ctx);

/* ---- sampling ---------------------------------------------------------- */

typedef struct sb_sampler sb_sampler_t;

/* A bias added to one token's logit before sampling (OpenAI's logit_bias). */
typedef struct sb_logit_bias {
    int32_t token;
    float bias; /* -100 .. 100; -100 bans the token */
} sb_logit_bias;

typedef struct sb_sampler_params {
    float temperature;        /* <= 0: greedy (argmax, lowest id on ties) */
    int32_t top_k;            /* <= 0: off */
    float top_p;              /* >= 1: off */
    float min_p;              /* <= 0: off */
    float repeat_penalty;     /* 1: off; llama.cpp semantics */
    int32_t repeat_last_n;    /* window of recent tokens the penalties look at */
    float frequency_penalty;  /* 0: off; OpenAI semantics */
    float presence_penalty;   /* 0: off; OpenAI semantics */
    uint64_t seed;            /* same seed + same logits = same tokens */
    const sb_logit_bias *logit_bias; /* n_logit_bias entries, copied by create; NULL: none */
    int32_t n_logit_bias;
} sb_sampler_params;
sb_sampler_params sb_sampler_default_params(void);

sb_status sb_sampler_create(const sb_sampler_params *params, int32_t n_vocab, sb_sampler_t **out,
                            sb_error *err);
void sb_sampler_free(sb_sampler_t *sampler);
/* Picks the next token from logits (n_vocab floats, not modified). */
int32_t sb_sampler_sample(sb_sampler_t *sampler, const float *logits);
/* The same among the tokens whose bit is set in `allowed` (n_vocab bits,
 * bit t of word t / 32; NULL: all), e.g. a grammar's mask: the others are
 * banned before penalties' results, filters and the draw see them. */
int32_t sb_sampler_sample_masked(sb_sampler_t *sampler, const float *logits, const uint32_t *allowed);
/* Records a token of the sequence (prompt or generated) for the penalties. */
void sb_sampler_accept(sb_sampler_t *sampler, int32_t token);


/* ==== switchboard: the high-level API ==================================== */
/*
 * Models by name, in-process, as the server serves them: open a registry (a
 * models.json, a directory of .gguf files, or one .gguf file), then complete
 * text or chat by model name. Models load on demand under a memory budget
 * (least recently used idle models are evicted to make room), every model
 * runs on one process-wide executor of n_threads compute threads, and
 * requests to the same model are batched together by its engine.
 *
 * Routing. A call names a model (params.model) or uses the default
 * (sb_switchboard_set_default). A name may be a model, an alias, or a route
 * of the registry file (an A/B split: params.user keeps a user on one arm).
 * An unknown name, or a model that fails to load, is served by the
 * registry's fallback when it names one; otherwise the call fails with
 * SB_ERR_MODEL_NOT_FOUND (the message lists the servable names). A model
 * that cannot fit the budget fails with SB_ERR_OVER_BUDGET and the numbers.
 * Every result names the model that actually served and whether (and why)
 * a fallback did.
 *
 * Three ways to generate, one path underneath:
 *   - blocking: sb_switchboard_complete / _chat / _chat_messages fill an
 *     sb_result (the whole text, finish reason, usage, profile);
 *   - streaming: the same calls with params.on_event set call it once per
 *     token (and once at the end) on the calling thread, never on an engine
 *     thread, so the callback may block or print; returning false cancels;
 *   - pull: sb_switchboard_submit returns an sb_request whose events the
 *     caller takes with sb_request_next at its own pace (with a timeout),
 *     and may cancel at any time. The blocking calls are this loop.
 * sb_switchboard_batch_infer submits several prompts as one request (one
 * engine submission each, all at once, so the engine batches them) and
 * returns their results in order.
 *
 * For an HTTP server (how src/server/ is built on this API): a connection
 * thread routes the body's model (sb_switchboard_acquire: a held model),
 * builds its inputs with it (prompt tokens through its tokenizer and
 * template: SB_INPUT_TOKENS; a grammar for its vocabulary), submits them
 * on it (n choices or several prompts = several inputs of one submit,
 * seed_offset apart), names the serving model from sb_held_served (the
 * model field and headers), then pulls sb_request_next (streaming) or
 * waits with sb_request_wait (whole answers) with a short timeout between
 * checks of its socket (sb_request_cancel when the client went away). Each
 * event carries the token, its text, logprob and alternatives (their text
 * via sb_token_text on sb_request_model, valid while the request lives),
 * and the last one the finish reason, usage and any embedding: exactly
 * what an SSE chunk or a JSON response is built from. Its admin pages are
 * sb_switchboard_list, _load, _unload and _get_totals.
 *
 * Profiles. Every call measures itself into an sb_profile: the time routing
 * and loading took (load_s: ~0 when the model was loaded already), time to
 * first token, prompt and generation speed, token counts, and the process's
 * memory (resident now and peak, and what the loaded models take). Blocking
 * calls return it in sb_result.profile (batch_infer: each result its own,
 * plus the whole batch's); sb_switchboard_last_profile reads the profile of
 * the last call that finished on this handle, whichever kind it was (a
 * pulled request's when it is freed), so a profile can be read "around"
 * any call without passing a struct.
 *
 * Threads: every function may be called from any thread, and calls may run
 * concurrently on one handle (that is how requests get batched). An
 * sb_request is used by one thread at a time.
 */

typedef struct sb_switchboard sb_switchboard_t;
typedef struct sb_request sb_request_t;

typedef struct sb_switchboard_params {
    int32_t n_threads;        /* compute threads for every model together; 0 = online cores */
    size_t memory_budget;     /* bytes all loaded models may take; 0 = 80% of available memory */
    const char *model_name;   /* one .gguf file: the name it serves under (NULL: the file's name) */
    const char *default_model; /* NULL: the registry's first model */
    int32_t n_ctx;            /* per model, unless its entry says; 0 = its trained context */
    int32_t n_parallel;       /* sequences one model decodes together; 0 = the engine's default */
    sb_cache_type cache_type; /* KV cache of models whose entry does not say; default F16 */
    double keep_alive_s;      /* idle time before a model is unloaded; < 0 forever (the default) */
    bool watch;               /* reload the registry when its file or directory changes */
    int32_t max_batch_tokens; /* most tokens in one forward step of a model; 0 = the engine's default */
    int32_t max_queue;        /* most requests waiting per model (more fail with SB_ERR_BUSY); 0 = default */
    /* One line per load, eviction, swap and reload (no newline), from any
     * thread; NULL: silent. */
    void (*log)(void *user, const char *line);
    void *log_user;
} sb_switchboard_params;
sb_switchboard_params sb_switchboard_default_params(void);

/* Opens `path` (models.json, a directory of .gguf files, or one .gguf
 * file); params NULL = the defaults. Loads nothing yet except pinned
 * models. On failure *out is NULL and err names the file, line and field. */
sb_status sb_switchboard_open(const char *path, const sb_switchboard_params *params, sb_switchboard_t **out,
                              sb_error *err);
/* Every call must have returned and every sb_request been freed (a
 * programmer error otherwise); generations the engine still owes freed
 * requests are cancelled and waited for. NULL is a no-op. */
void sb_switchboard_free(sb_switchboard_t *sb);

/* Re-reads the registry source; a bad one changes nothing (err says where). */
sb_status sb_switchboard_reload(sb_switchboard_t *sb, sb_error *err);

/* Cancels every generation running or waiting on every model (their done
 * events say SB_FINISHED_CANCELLED): the first step of shutting down while
 * callers still wait on requests. */
void sb_switchboard_cancel_all(sb_switchboard_t *sb);

/* Every name a call may use (models, aliases, routes), NUL-separated in out
 * (capacity cap, truncated to whole names); returns how many there are. */
int32_t sb_switchboard_models(sb_switchboard_t *sb, char *out, size_t cap);

/* Who served a call: the model (never an alias or route) and, when the
 * fallback served instead of the name asked for, why. */
typedef struct sb_served {
    char model[128];
    char route[128];           /* the route the name was, else "" */
    bool fallback;
    char fallback_reason[256]; /* "unknown model 'x'", "model 'x' failed to load: ...", else "" */
} sb_served;

/* Makes `name` the model of calls that name none, loading it now. Fails
 * with SB_ERR_MODEL_NOT_FOUND (the default unchanged) unless the registry
 * knows the name or has a fallback for it; *served (may be NULL) says which
 * model serves it now. The name is kept, not the fallback: once the named
 * model appears (a reload), it serves. */
sb_status sb_switchboard_set_default(sb_switchboard_t *sb, const char *name, sb_served *served, sb_error *err);
/* The default model's name as set (a copy into out, capacity cap). */
void sb_switchboard_get_default(sb_switchboard_t *sb, char *out, size_t cap);

/* ---- administration ---------------------------------------------------- */

typedef enum sb_model_state {
    SB_MODEL_UNLOADED,
    SB_MODEL_LOADING,
    SB_MODEL_LOADED,
    SB_MODEL_FAILED, /* the last load failed (error says why); the next call retries */
} sb_model_state;
/* "unloaded", "loading", "loaded", "failed". */
const char *sb_model_state_str(sb_model_state s);

/* One model of the registry as it is now (what an admin page shows). */
typedef struct sb_model_info {
    char name[128];
    char path[512];
    sb_model_state state;
    uint64_t version;       /* of the loaded version; bumped when the entry or its file changes */
    size_t memory;          /* bytes it takes, measured (0 when unloaded) */
    int32_t running;        /* sequences being generated */
    int32_t waiting;        /* submissions waiting to start */
    int32_t in_flight;      /* calls and requests holding it */
    double last_used;       /* unix time; 0 never */
    double keep_alive_s;    /* idle time before it unloads; -1 forever */
    bool pinned;
    char error[256];        /* the last load error, "" if none */
    /* loaded: its engine's figures since the load */
    int32_t kv_blocks_used, kv_blocks_total, block_size;
    uint64_t prompt_tokens_computed; /* prompt positions run through the model */
    uint64_t prompt_tokens_cached;   /* prompt positions reused from the prefix cache */
    uint64_t generated_tokens;
    uint64_t preemptions;   /* sequences preempted for lack of KV cache, recomputed later */
    uint64_t steps;         /* forward steps */
} sb_model_info;

/* Fills up to cap entries (models only, not aliases or routes, in registry
 * order); returns how many models there are (call with cap 0 to size). */
int32_t sb_switchboard_list(sb_switchboard_t *sb, sb_model_info *out, int32_t cap);

/* Loads a model by name now (it then stays until its keep_alive), or
 * unloads it (calls in flight finish on it; it is freed after them; the
 * next call loads it again). SB_ERR_MODEL_NOT_FOUND for an unknown name,
 * SB_ERR_OVER_BUDGET when it cannot fit. */
sb_status sb_switchboard_load(sb_switchboard_t *sb, const char *name, sb_error *err);
sb_status sb_switchboard_unload(sb_switchboard_t *sb, const char *name, sb_error *err);

typedef struct sb_switchboard_totals {
    size_t budget, used;    /* bytes: the memory budget, what the loaded models take */
    uint64_t loads, load_failures, evictions, swaps, reloads;
} sb_switchboard_totals;
void sb_switchboard_get_totals(sb_switchboard_t *sb, sb_switchboard_totals *out);

/* ---- generation -------------------------------------------------------- */

/* Why a generation ended; sb_finish_reason_str gives OpenAI's words
 * ("stop", "length", ...). */
typedef enum sb_finish_reason {
    SB_FINISHED_NOT = 0,   /* not finished (token events) */
    SB_FINISHED_STOP,      /* an end-of-generation token or a stop string */
    SB_FINISHED_LENGTH,    /* max_tokens, or the context is full */
    SB_FINISHED_CANCELLED, /* the caller cancelled */
    SB_FINISHED_ERROR,     /* the engine failed: the event's error says why */
} sb_finish_reason;
const char *sb_finish_reason_str(sb_finish_reason r);

typedef struct sb_token_logprob {
    int32_t token;
    float logprob;
} sb_token_logprob;

/* One event of a generation. Pointers are valid until the next event is
 * taken (or the callback returns). */
typedef struct sb_stream_event {
    int32_t index;         /* which input of the submit (a batch's prompt) */
    bool done;             /* the last event of this input */
    /* token events: one generated token and the text it completes (may be
     * empty: part of a UTF-8 character, or held back by a stop string) */
    int32_t token;
    const char *text;      /* text_len bytes, NUL-terminated; never NULL */
    size_t text_len;
    float logprob;         /* params.logprobs */
    const sb_token_logprob *top; /* n_top alternatives, most likely first (params.top_logprobs) */
    int32_t n_top;
    /* done: why, the text held back until now (in text), and usage */
    sb_finish_reason finish;
    int32_t n_prompt, n_prompt_cached, n_generated;
    double ttft_s;         /* submit to first token */
    const char *error;     /* SB_FINISHED_ERROR: what went wrong, else NULL */
    const float *embedding; /* done of an embedding (params.embedding): n_embd floats, else NULL */
    int32_t n_embd;
    double time_s;         /* when the engine produced it, seconds after the submit */
} sb_stream_event;

/* Called on the calling thread for every event; return false to cancel
 * (a done event with SB_FINISHED_CANCELLED follows). */
typedef bool (*sb_stream_fn)(void *user, const sb_stream_event *ev);

#define SB_KEEP_ALIVE_UNCHANGED (-2.0)

/* A grammar the output must follow (structured output), compiled for one
 * model's vocabulary: see sb_held_grammar. Shared by any number of
 * requests on that model; each takes its own reference. */
typedef struct sb_grammar sb_grammar_t;

typedef struct sb_infer_params {
    const char *model;         /* NULL: the default model */
    const char *user;          /* keeps a user on one arm of an A/B route; NULL: random */
    /* NULL: the model's defaults from the registry over sb_sampler_default_params() */
    const sb_sampler_params *sampling;
    int32_t max_tokens;        /* 0: the model's default from the registry, else to the end of
                                  generation or of the context; < 0: to the end always */
    const char *const *stops;  /* n_stops stop strings (NULL and 0: the model's defaults); the text
                                  ends before the first match */
    size_t n_stops;
    bool logprobs;             /* events carry the chosen token's log-probability */
    int32_t top_logprobs;      /* and this many alternatives (at most 20) */
    bool ignore_eos;
    int32_t priority;          /* higher is served first, across models too */
    double keep_alive_s;       /* after the call the model stays loaded this long (< 0 forever);
                                  SB_KEEP_ALIVE_UNCHANGED: its configured keep_alive */
    const sb_grammar_t *grammar; /* NULL, or what every output must match (compiled for the
                                    model that serves: sb_held_submit on that held model) */
    bool embedding;            /* no generation: each input's done event carries its embedding
                                  (the mean-pooled, L2-normalised final hidden state) */
    sb_stream_fn on_event;     /* blocking calls: per-token callback (streaming); NULL: none */
    void *user_data;
} sb_infer_params;
sb_infer_params sb_infer_default_params(void);

typedef struct sb_profile {
    double load_s;          /* routing the name and loading the model (~0 when already loaded) */
    double ttft_s;          /* submit to the first token (a batch: the first of any prompt) */
    double total_s;         /* the whole call, load included */
    double prompt_tps;      /* prompt tokens computed (not cached) per second of ttft_s */
    double gen_tps;         /* generated tokens per second after the first token */
    int32_t n_prompt;       /* prompt tokens (a batch: all prompts together) */
    int32_t n_prompt_cached; /* of which reused from the prefix cache */
    int32_t n_generated;
    size_t rss_bytes;       /* the process's resident memory at the end of the call */
    size_t peak_rss_bytes;  /* the process's peak resident memory so far (VmHWM) */
    size_t models_bytes;    /* what the loaded models take, measured (the budget's "used") */
    size_t budget_bytes;    /* the memory budget */
} sb_profile;

typedef struct sb_result {
    char *text;             /* the generated text, NUL-terminated (freed by sb_result_free) */
    size_t text_len;
    sb_finish_reason finish;
    int32_t n_prompt, n_prompt_cached, n_generated;
    sb_served served;
    sb_profile profile;
} sb_result;
/* Frees what the result owns (not the struct); safe on a zeroed result. */
void sb_result_free(sb_result *r);

/* A chat message; content is plain text. */
typedef struct sb_chat_message {
    const char *role;       /* "system", "user", "assistant" */
    const char *content;
} sb_chat_message;

/* Generates from a text prompt (tokenized with BOS as the model wants it,
 * special-token text parsed). params NULL = the defaults. On failure
 * *result holds nothing to free and err says why. */
sb_status sb_switchboard_complete(sb_switchboard_t *sb, const char *prompt, const sb_infer_params *params,
                                  sb_result *result, sb_error *err);
/* Generates the assistant's answer to `messages_json`, a JSON array of
 * {"role", "content"} objects, through the model's chat template; the
 * registry's system prompt for the model goes first when the messages have
 * no system message. */
sb_status sb_switchboard_chat(sb_switchboard_t *sb, const char *messages_json, const sb_infer_params *params,
                              sb_result *result, sb_error *err);
/* The same with the messages as structs. */
sb_status sb_switchboard_chat_messages(sb_switchboard_t *sb, const sb_chat_message *messages, size_t n_messages,
                                       const sb_infer_params *params, sb_result *result, sb_error *err);

/* Runs n text prompts together on one model: all submitted at once, so the
 * engine batches them, results[i] for prompts[i]. params.on_event, if set,
 * gets every prompt's events (ev->index says which). batch (may be NULL)
 * receives the whole batch's profile. On failure no result holds anything. */
sb_status sb_switchboard_batch_infer(sb_switchboard_t *sb, const char *const *prompts, size_t n,
                                     const sb_infer_params *params, sb_result *results, sb_profile *batch,
                                     sb_error *err);

/* The profile of the last call that finished on this handle (zeros before). */
void sb_switchboard_last_profile(sb_switchboard_t *sb, sb_profile *out);

/* ---- pulled requests --------------------------------------------------- */

typedef enum sb_input_kind {
    SB_INPUT_TEXT,      /* text: a completion prompt */
    SB_INPUT_CHAT_JSON, /* text: a JSON array of messages */
    SB_INPUT_CHAT,      /* messages, n_messages */
    SB_INPUT_TOKENS,    /* tokens, n_tokens: prompt ids as they are (BOS included if wanted) */
} sb_input_kind;

typedef struct sb_input {
    sb_input_kind kind;
    const char *text;
    const sb_chat_message *messages;
    size_t n_messages;
    const int32_t *tokens;
    size_t n_tokens;
    uint64_t seed_offset; /* added to the sampling seed: n choices of one prompt sample apart */
} sb_input;

/* Submits n inputs as one request on one model (params.on_event is not
 * used: take the events with sb_request_next). On failure nothing stays
 * submitted, *out is NULL and err says why (an input's error names its
 * index). */
sb_status sb_switchboard_submit(sb_switchboard_t *sb, const sb_input *inputs, size_t n, const sb_infer_params *params,
                                sb_request_t **out, sb_error *err);
/* Waits up to timeout_ms (< 0: without limit) for the next event of any
 * input, in the order they happened. Returns true with *ev filled (valid
 * until the next call), false on timeout or when every input is done and
 * its events were taken. */
bool sb_request_next(sb_request_t *req, int64_t timeout_ms, sb_stream_event *ev);
/* Waits up to timeout_ms (< 0: without limit) until an input's done event
 * is queued, leaving every event queued for sb_request_next; true when one
 * is (or every input has ended). A caller that wants whole answers waits
 * here: it is woken once per input, not once per token. */
bool sb_request_wait(sb_request_t *req, int64_t timeout_ms);
/* True once every input's done event has been taken. */
bool sb_request_finished(const sb_request_t *req);
/* Ends every input within one engine step (their done events follow). */
void sb_request_cancel(sb_request_t *req);
/* Who serves it. */
void sb_request_served(const sb_request_t *req, sb_served *out);
/* The model that serves it, valid while the request lives (for
 * sb_token_text of logprob alternatives, sb_detokenize, ...). */
const sb_model_t *sb_request_model(const sb_request_t *req);
/* The request's profile so far (final once finished). */
void sb_request_profile(const sb_request_t *req, sb_profile *out);
/* Cancels what still runs and frees; the model's hold goes once the engine
 * is done with it. NULL is a no-op. */
void sb_request_free(sb_request_t *req);

/* ---- held models: route first, then submit ------------------------------- */
/*
 * sb_switchboard_submit routes the name and submits in one call. A caller
 * that must see the model before it builds its inputs (tokenize with it,
 * count a prompt against its context, compile a grammar for its
 * vocabulary) routes first: sb_switchboard_acquire holds the model that
 * serves (loading it if needed) until sb_held_release, and sb_held_submit
 * submits on exactly that model, even if a reload swapped or a route would
 * now pick another. A request keeps its model held for its own life, so
 * the held model may be released as soon as the last submit returned.
 */

typedef struct sb_held sb_held_t;

/* Routes `model` (NULL: the default) as a call would, `user` picking a
 * route's arm. Errors as sb_switchboard_submit's. */
sb_status sb_switchboard_acquire(sb_switchboard_t *sb, const char *model, const char *user, sb_held_t **out,
                                 sb_error *err);
const sb_model_t *sb_held_model(const sb_held_t *h);
/* The context its engine runs with (the registry entry's, else trained). */
int32_t sb_held_n_ctx(const sb_held_t *h);
void sb_held_served(const sb_held_t *h, sb_served *out);
/* sb_switchboard_submit on this model (params.model and params.user are not used). */
sb_status sb_held_submit(sb_held_t *h, const sb_input *inputs, size_t n, const sb_infer_params *params,
                         sb_request_t **out, sb_error *err);
/* Compiles a GBNF grammar (llama.cpp's syntax, root rule "root") or a JSON
 * schema (the grammar of the JSON texts it allows) for this model's
 * vocabulary. SB_ERR_INVALID_ARG (err names line and column, or the schema
 * path) for a bad one, SB_ERR_UNSUPPORTED for schema features not
 * implemented. */
sb_status sb_held_grammar(sb_held_t *h, const char *gbnf, size_t len, sb_grammar_t **out, sb_error *err);
sb_status sb_held_json_schema(sb_held_t *h, const char *schema_json, sb_grammar_t **out, sb_error *err);
/* Drops the caller's reference (requests using it keep theirs). NULL is a no-op. */
void sb_grammar_free(sb_grammar_t *g);
/* Ends the caller's hold; keep_alive_s as sb_infer_params.keep_alive_s
 * (SB_KEEP_ALIVE_UNCHANGED: as configured). NULL is a no-op. */
void sb_held_release(sb_held_t *h, double keep_alive_s);

#if defined(__GNUC__)
#pragma GCC visibility pop
#endif

#ifdef __cplusplus
}
#endif
#endif
