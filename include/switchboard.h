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
 * UTF-8 text; a character split across tokens is held back until whole. */
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
 * bytes needed (NUL excluded). Fails with SB_ERR_INVALID_ARG if cap <= that. */
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

#ifdef __cplusplus
}
#endif
#endif
