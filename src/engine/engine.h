/*
 * engine.h - one model's serving engine: many generation requests at once
 * (continuous batching) over a paged KV cache with prefix sharing. The
 * engine owns its KV pool, scratch and sequences, not threads: it runs on
 * an executor (executor.h), whose one thread and pool step every engine of
 * the process in turn.
 *
 * Each step the scheduler forms one batch from the next token of every
 * running sequence plus chunks of waiting prompts, up to max_batch_tokens,
 * runs it through the model, samples, and reports to each request through
 * its callback. A step of decoding tokens alone runs either with every
 * product split by rows between the pool's threads, or as lanes, each
 * thread taking its share of the sequences through the layers alone
 * (sb_split_mode; by default whichever the engine measures faster).
 * Prompts that share a prefix (a system prompt, a chat history) reuse the
 * KV blocks already computed for it. When the cache is
 * full the lowest-priority, newest sequence is preempted (its blocks freed)
 * and resumed later by recomputing: requests are never failed for lack of
 * cache.
 *
 * Priorities (sb_gen_params.priority, higher first): waiting requests are
 * admitted by priority, then in arrival order, and batched in that order;
 * a waiting request that finds no free slot or blocks preempts a running
 * one of lower priority, which resumes later, not fails.
 *
 * Threads: submit/cancel/stats may be called from any thread. Callbacks run
 * on a thread of the executor (its scheduler's, or a pool thread stepping
 * the engine in a lane: one engine's callbacks never two at a time, but two
 * engines' may run at once) and must not block for long (copy the event and
 * return), nor free the engine they are called for; after a request's
 * SB_GEN_DONE event its callback is never called again and its id is dead.
 *
 * Batch invariance: a request's greedy output is identical whether it runs
 * alone or batched with others, because every kernel computes each
 * (row, token) result the same way whatever the batch holds.
 */
#ifndef SB_ENGINE_H
#define SB_ENGINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/executor.h"
#include "model/model.h"
#include "switchboard.h"

typedef struct sb_engine sb_engine;

/* What a profile of the engine's steps counts. */
typedef enum sb_profile_clock {
    SB_PROFILE_OFF,
    SB_PROFILE_WALL,       /* wall time: what a step takes, the pool's waits included */
    SB_PROFILE_THREAD_CPU, /* the stepping thread's CPU time: with one thread, the work alone,
                              steady on a loaded host (each reading is a system call) */
} sb_profile_clock;

/* How a decoding step's forward pass uses the pool's threads (engine.c, "lanes"). */
typedef enum sb_split_mode {
    SB_SPLIT_AUTO,  /* whichever of the two this engine measures faster, per batch size */
    SB_SPLIT_ROWS,  /* every product split by rows between the threads */
    SB_SPLIT_LANES, /* the sequences split between the threads, each through the layers alone,
                       whenever each thread gets two or more */
} sb_split_mode;

typedef struct sb_engine_params {
    int32_t n_ctx;            /* KV-cache positions shared by all sequences (one request may use all) */
    int32_t n_parallel;       /* most sequences running at once */
    int32_t max_batch_tokens; /* most tokens in one forward step */
    int32_t max_queue;        /* most requests waiting; beyond it submit fails with SB_ERR_BUSY */
    int32_t block_size;       /* KV positions per block (prefix sharing granularity) */
    sb_cache_type cache_type; /* what the KV cache holds keys and values in; F16 by default, as
                                 llama-server's: half of F32's memory per position, so twice the
                                 sequences or context fit, and attention reads half the bytes */
    sb_profile_clock profile; /* time the decoding steps (sb_engine_get_profile); off by default */
    sb_split_mode split;      /* decoding steps' threads; SB_SPLIT_AUTO by default */
} sb_engine_params;
sb_engine_params sb_engine_default_params(void);

typedef struct sb_gen_params {
    const int32_t *prompt; /* token ids, BOS included if the model wants one; copied */
    int32_t n_prompt;
    int32_t max_tokens;    /* generated tokens at most; <= 0: until the context is full */
    sb_sampler_params sampling;
    const char *const *stops; /* stop strings (copied); generation ends before the first match */
    size_t n_stops;
    int32_t top_logprobs;  /* > 0: report that many alternatives per token (at most 20) */
    bool logprobs;         /* report the chosen token's log-probability */
    bool ignore_eos;
    bool embedding;        /* no generation: report the mean-pooled, L2-normalized final hidden state */
    int32_t priority;      /* higher is served first, across the executor's engines too; 0: the default tier */
    struct sb_grammar *grammar; /* NULL, or the grammar the output must follow (each sequence
                                   gets its own matcher and reference; the caller keeps its own) */
} sb_gen_params;

typedef enum sb_finish {
    SB_FINISH_NONE = 0, /* not finished (token events) */
    SB_FINISH_STOP,     /* end-of-generation token or stop string */
    SB_FINISH_LENGTH,   /* max_tokens or the context is full */
    SB_FINISH_CANCELLED,
    SB_FINISH_ERROR,
} sb_finish;

typedef struct sb_top_logprob {
    int32_t token;
    float logprob;
} sb_top_logprob;

typedef struct sb_gen_event {
    enum { SB_GEN_TOKEN, SB_GEN_DONE } kind;
    /* SB_GEN_TOKEN: one generated token and the text it completes (may be
     * empty: part of a UTF-8 character, or held back by a stop string). */
    int32_t token;
    const char *text;
    size_t text_len;
    float logprob;               /* if requested */
    const sb_top_logprob *top;   /* n_top entries, most likely first */
    int32_t n_top;
    /* SB_GEN_DONE: why it ended, the text still held back (flushed), usage. */
    sb_finish finish;
    int32_t n_prompt;        /* prompt tokens */
    int32_t n_prompt_cached; /* of which reused from the prefix cache */
    int32_t n_generated;
    double ttft_s;           /* submit to first token (or to the embedding) */
    const float *embedding;  /* n_embd floats, for embedding requests */
    int32_t n_embd;
    const char *error;       /* SB_FINISH_ERROR: what went wrong */
} sb_gen_event;

typedef void (*sb_gen_cb)(void *user, const sb_gen_event *ev);

/* An engine for `model` on `exec` (both borrowed: they must outlive the
 * engine), registered with it so that its requests run from now on. */
sb_status sb_engine_create(const sb_model_t *model, const sb_engine_params *params, sb_executor *exec,
                           sb_engine **out, sb_error *err);
/* Cancels everything still queued or running (their callbacks get
 * SB_FINISH_CANCELLED, on the calling thread), deregisters from the
 * executor, waiting for a step of this engine in progress to end. */
void sb_engine_free(sb_engine *e);

/* Bytes sb_engine_create allocated: KV pool, forward scratch, block table,
 * batch arrays; counted from the allocations themselves. Per-request state
 * (token lists, samplers) comes on top and goes with the request. */
size_t sb_engine_memory(const sb_engine *e);

/* Queues a request. Fails with SB_ERR_INVALID_ARG for bad parameters (a
 * prompt longer than the context, an id outside the vocabulary), and with
 * SB_ERR_BUSY when the queue is full; then the callback is never called.
 * On success *id names the request for sb_engine_cancel. */
sb_status sb_engine_submit(sb_engine *e, const sb_gen_params *p, sb_gen_cb cb, void *user, uint64_t *id,
                           sb_error *err);
/* Ends a request (e.g. its client went away) within one step; its callback
 * gets SB_FINISH_CANCELLED unless it had already finished. Unknown ids are
 * ignored. */
void sb_engine_cancel(sb_engine *e, uint64_t id);
/* Ends every request submitted so far, as sb_engine_cancel does one. */
void sb_engine_cancel_all(sb_engine *e);

typedef struct sb_engine_stats {
    int32_t waiting, running; /* both 0: drained (a submitted request is always in one) */
    int32_t kv_blocks_used, kv_blocks_total, block_size;
    uint64_t prompt_tokens_computed; /* prompt positions run through the model */
    uint64_t prompt_tokens_cached;   /* prompt positions reused from the prefix cache */
    uint64_t generated_tokens;
    uint64_t preemptions;
    uint64_t steps;
} sb_engine_stats;
void sb_engine_get_stats(sb_engine *e, sb_engine_stats *out);

/* Where an engine created with params.profile spent its decoding steps of
 * n tokens (steps in which every token of the batch is the next one of a
 * sequence that samples: n sequences decoding), summed since creation;
 * seconds of the profile's clock on the thread that stepped it. Other steps (with
 * prompt chunks) are not counted. A step run as lanes counts lane 0's layers
 * and the output product in fwd, and the wait for the other lanes in
 * forward_s only. */
typedef struct sb_step_profile {
    uint64_t steps;
    double step_s;    /* the whole step */
    double plan_s;    /* requests in, admission, planning, blocks, the batch */
    double forward_s; /* the forward pass, broken down in fwd */
    double sample_s;  /* the sequences' sampling loop (on the pool) */
    double report_s;  /* accepting, detokenizing, stop strings, callbacks, finishing */
    sb_fwd_profile fwd;
} sb_step_profile;
#define SB_PROFILE_MAX_TOKENS 64
/* False (and *out zeroed) when the engine is not profiled or n is outside
 * 1..SB_PROFILE_MAX_TOKENS. */
bool sb_engine_get_profile(sb_engine *e, int32_t n_tokens, sb_step_profile *out);

#endif
