/*
 * engine.c - one model's scheduling: continuous batching over the paged KV
 * cache, stepped by the executor's thread (executor.c).
 *
 * Requests arrive on `incoming` (any thread) and move, on the executor
 * thread, to `waiting` and then `running` (at most n_parallel). Both are
 * kept in order of priority, highest first; within a priority `waiting` is
 * FIFO (a preempted sequence goes back first, to resume before newcomers)
 * and `running` is in admission order, so its last entry is always the
 * lowest-priority, newest sequence: the one to preempt. One step:
 *   1. drop cancelled requests, admit waiting ones (taking their cached
 *      prefix blocks) in order; a waiting request of higher priority than a
 *      running one preempts it when no slot or blocks are free;
 *   2. plan the batch in `running` order: one token for every sequence that
 *      is decoding, then prompt chunks, within max_batch_tokens; give every
 *      planned position a KV block, preempting the last sequence when none
 *      is left;
 *   3. run the forward pass once for the whole batch;
 *   4. for each sequence that got logits: sample, detokenize, match stop
 *      strings, report, and finish it if it is done; publish the blocks it
 *      filled for prefix sharing.
 * The engine lock guards `incoming`, the cancellation list and the
 * statistics; the forward pass and the callbacks run without it.
 */
#include <math.h>
#include <pthread.h>
#include <string.h>
#include <time.h>

#include "base/base.h"
#include "engine/blocks.h"
#include "engine/engine.h"
#include "engine/executor.h"
#include "model/model.h"
#include "sampling/grammar.h"
#include "sampling/stop.h"

#define MAX_TOP_LOGPROBS 20

typedef struct seq {
    uint64_t id;
    sb_gen_cb cb;
    void *user;
    struct seq *next; /* in incoming / waiting */
    sb_gen_params p;  /* stops and prompt pointers are not kept: see below */

    int32_t *tokens; /* prompt, then generated tokens */
    int32_t n_tokens, cap_tokens, n_prompt;
    int32_t n_computed; /* positions whose keys and values are in the cache */
    int32_t *blocks;    /* block table */
    int32_t n_blocks;
    int32_t n_published; /* leading blocks published for prefix sharing */
    uint64_t prefix_hash; /* hash of the first n_published blocks */
    int32_t n_cached;     /* prompt positions taken from the prefix cache */
    int32_t n_generated;
    int64_t admitted;     /* admission order; among equal priorities preemption takes the highest */

    sb_sampler_t *sampler;
    sb_grammar_matcher *grammar; /* NULL: unconstrained */
    sb_detok_t *detok;
    sb_stop_t *stop;
    char *text; /* detokenizer + stop-matcher output of one step */
    size_t text_cap;
    float *embd_sum; /* embedding requests: sum of final hidden states */

    double t_submit, t_first;
    bool cancelled;
    int32_t planned; /* tokens in this step's batch */

    /* This step's sample, drawn in parallel with the other sequences'. */
    const float *logits;
    int32_t sampled;
    float sampled_logprob;
    sb_top_logprob top[MAX_TOP_LOGPROBS];
    int32_t n_top;
} seq;

/* The two ways a decoding step can use the pool ("lanes" below). */
enum split_way { SPLIT_BY_ROWS, SPLIT_BY_LANES };

/* How decoding steps of one size have run, each way (split_way). */
typedef struct split_stats {
    double mean_s[2];    /* running mean of the forward pass and sampling, wall seconds */
    int32_t runs[2];     /* steps counted in the mean, up to SPLIT_MEMORY */
    int32_t since_probe; /* steps of the faster way since the slower last ran */
    int32_t probe_left;  /* steps of the slower way the current probe still runs */
    bool probing;        /* the current step is a probe's */
} split_stats;

struct sb_engine {
    const sb_model *model;
    sb_engine_params p;
    sb_executor *exec;
    sb_threadpool *pool; /* the current step's: the executor's, or NULL (a lane's thread alone) */
    bool registered;
    size_t memory;       /* bytes allocated by sb_engine_create */
    sb_kv kv;
    sb_forward fwd;      /* the pool's passes, and lane 0's */
    sb_forward *lane_fwd; /* lanes 1..n_lanes-1 (see "lanes" below) */
    int32_t n_lanes;     /* the pool's threads */
    split_stats *split;  /* n_parallel + 1, by the step's tokens */
    enum split_way last_way; /* the previous decoding step's, whatever its size */
    float *lane_out;     /* (n_parallel, n_embd): the lanes' final normed states */
    sb_blocks *blocks;
    sb_batch_token *batch;
    seq **running; /* n_parallel slots: priority, then admission order */
    int32_t n_running;
    seq *waiting, *waiting_tail; /* priority, then FIFO */
    int64_t n_admitted;
    seq **sampling;  /* n_parallel: the sequences sampled this step */
    float *logprobs; /* (executor threads, n_vocab) scratch */

    pthread_mutex_t lock;
    seq *incoming, *incoming_tail; /* guarded by lock */
    int32_t n_queued; /* submitted, not running (incoming + waiting); guarded by lock */
    uint64_t next_id;
    uint64_t *cancels; /* guarded by lock */
    int32_t n_cancels, cap_cancels;
    bool cancel_all; /* sb_engine_cancel_all asked; guarded by lock */
    sb_engine_stats stats; /* guarded by lock */
    sb_step_profile *profile; /* (SB_PROFILE_MAX_TOKENS + 1) by batch size, guarded by lock; NULL: not profiled */
    sb_fwd_profile step_fwd;  /* the current step's forward pass, when profiled */
};

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

sb_engine_params sb_engine_default_params(void) {
    return (sb_engine_params){.n_ctx = 4096, .n_parallel = 8, .max_batch_tokens = 512, .max_queue = 256,
                              .block_size = 16, .cache_type = SB_CACHE_F16};
}

/* ---- sequences ------------------------------------------------------------ */

static void seq_free(seq *s) {
    if (!s)
        return;
    sb_sampler_free(s->sampler);
    sb_grammar_matcher_free(s->grammar);
    sb_detok_free(s->detok);
    sb_stop_free(s->stop);
    sb_free(s->tokens);
    sb_free(s->blocks);
    sb_free(s->text);
    sb_free(s->embd_sum);
    sb_free(s);
}

static sb_status seq_create(const sb_engine *e, const sb_gen_params *p, seq **out, sb_error *err) {
    const sb_model *m = e->model;
    *out = NULL;
    if (p->n_prompt <= 0)
        return sb_fail(err, SB_ERR_INVALID_ARG, "the prompt is empty");
    if (p->n_prompt >= e->p.n_ctx)
        return sb_fail(err, SB_ERR_INVALID_ARG, "the prompt has %d tokens; the context holds %d", p->n_prompt,
                       e->p.n_ctx);
    for (int32_t i = 0; i < p->n_prompt; i++)
        if (p->prompt[i] < 0 || p->prompt[i] >= m->hp.n_vocab)
            return sb_fail(err, SB_ERR_INVALID_ARG, "prompt token %d at index %d is outside the vocabulary",
                           p->prompt[i], i);
    if (p->top_logprobs < 0 || p->top_logprobs > MAX_TOP_LOGPROBS)
        return sb_fail(err, SB_ERR_INVALID_ARG, "top_logprobs must be in 0..%d, got %d", MAX_TOP_LOGPROBS,
                       p->top_logprobs);
    seq *s = sb_calloc(1, sizeof(*s));
    if (!s)
        return sb_fail(err, SB_ERR_NOMEM, "out of memory");
    s->p = *p;
    s->p.prompt = NULL;
    s->p.stops = NULL;
    s->p.grammar = NULL;
    s->p.sampling.logit_bias = NULL; /* copied by the sampler */
    s->n_prompt = s->n_tokens = p->n_prompt;
    s->cap_tokens = p->n_prompt + 64;
    s->tokens = sb_malloc((size_t)s->cap_tokens * sizeof(int32_t));
    s->blocks = sb_malloc(((size_t)e->p.n_ctx / e->p.block_size + 2) * sizeof(int32_t));
    s->text_cap = 512;
    s->text = sb_malloc(s->text_cap);
    sb_status st = SB_OK;
    if (!s->tokens || !s->blocks || !s->text)
        st = sb_fail(err, SB_ERR_NOMEM, "out of memory");
    if (st == SB_OK && p->embedding && !(s->embd_sum = sb_calloc((size_t)m->hp.n_embd, sizeof(float))))
        st = sb_fail(err, SB_ERR_NOMEM, "out of memory");
    if (st == SB_OK && !p->embedding) {
        st = sb_sampler_create(&p->sampling, m->hp.n_vocab, &s->sampler, err);
        if (st == SB_OK)
            st = sb_detok_create(m, false, &s->detok, err);
        if (st == SB_OK)
            st = sb_stop_create(p->stops, p->n_stops, &s->stop, err);
        if (st == SB_OK && p->grammar)
            st = sb_grammar_matcher_create(p->grammar, &s->grammar, err);
    }
    if (st != SB_OK) {
        seq_free(s);
        return st;
    }
    memcpy(s->tokens, p->prompt, (size_t)p->n_prompt * sizeof(int32_t));
    for (int32_t i = 0; s->sampler && i < p->n_prompt; i++)
        sb_sampler_accept(s->sampler, p->prompt[i]);
    *out = s;
    return SB_OK;
}

/* Gives back every block (the KV stays cached where it was published). */
static void seq_drop_blocks(sb_engine *e, seq *s) {
    for (int32_t i = 0; i < s->n_blocks; i++)
        sb_blocks_release(e->blocks, s->blocks[i]);
    s->n_blocks = s->n_published = 0;
    s->n_computed = 0;
    s->prefix_hash = 0;
}

/* Takes the longest cached prefix of the sequence's tokens, in whole
 * blocks, leaving at least one token to compute (its logits are needed). */
static void seq_take_prefix(sb_engine *e, seq *s) {
    int32_t bs = e->p.block_size;
    while ((s->n_blocks + 1) * bs <= s->n_tokens - 1) {
        uint64_t h = sb_blocks_hash(s->prefix_hash, s->tokens + (size_t)s->n_blocks * bs, bs);
        int32_t blk = sb_blocks_lookup(e->blocks, h);
        if (blk < 0)
            break;
        s->blocks[s->n_blocks++] = blk;
        s->n_published = s->n_blocks;
        s->prefix_hash = h;
    }
    s->n_computed = s->n_blocks * bs;
    if (s->n_generated == 0)
        s->n_cached = SB_MIN(s->n_computed, s->n_prompt);
}

/* Publishes the blocks the sequence has completely computed. */
static void seq_publish(sb_engine *e, seq *s) {
    int32_t bs = e->p.block_size;
    while ((s->n_published + 1) * bs <= s->n_computed) {
        s->prefix_hash = sb_blocks_hash(s->prefix_hash, s->tokens + (size_t)s->n_published * bs, bs);
        sb_blocks_publish(e->blocks, s->blocks[s->n_published], s->prefix_hash);
        s->n_published++;
    }
}

static bool seq_append_token(seq *s, int32_t tok) {
    if (s->n_tokens == s->cap_tokens) {
        int32_t cap = s->cap_tokens * 2;
        int32_t *t = sb_realloc(s->tokens, (size_t)cap * sizeof(int32_t));
        if (!t)
            return false;
        s->tokens = t;
        s->cap_tokens = cap;
    }
    s->tokens[s->n_tokens++] = tok;
    return true;
}

/* ---- events ----------------------------------------------------------------- */

static void finish(sb_engine *e, seq *s, sb_finish why, const char *error) {
    sb_gen_event ev = {.kind = SB_GEN_DONE, .finish = why, .n_prompt = s->n_prompt, .n_prompt_cached = s->n_cached,
                       .n_generated = s->n_generated, .error = error};
    size_t n = 0;
    if (s->detok && why != SB_FINISH_CANCELLED && why != SB_FINISH_ERROR) {
        /* What the detokenizer and the stop matcher still hold is text. */
        char piece[64];
        size_t k = sb_detok_flush(s->detok, piece, sizeof(piece));
        if (s->text_cap >= k + sb_stop_max_len(s->stop) + 1) {
            n = sb_stop_push(s->stop, piece, k, s->text, s->text_cap, NULL);
            n += sb_stop_flush(s->stop, s->text + n, s->text_cap - n);
        }
    }
    ev.text = s->text;
    ev.text_len = n;
    if (s->embd_sum) {
        ev.embedding = s->embd_sum;
        ev.n_embd = e->model->hp.n_embd;
    }
    ev.ttft_s = s->t_first > 0 ? s->t_first - s->t_submit : 0;
    seq_drop_blocks(e, s);
    pthread_mutex_lock(&e->lock);
    e->stats.running = e->n_running; /* before the callback: whoever it wakes sees the request gone */
    pthread_mutex_unlock(&e->lock);
    s->cb(s->user, &ev);
}

/* log-softmax of logits into out; returns the chosen token's. */
static float log_softmax(int32_t n, const float *logits, int32_t tok, float *out) {
    float max = logits[0];
    for (int32_t i = 1; i < n; i++)
        max = logits[i] > max ? logits[i] : max;
    double sum = 0;
    for (int32_t i = 0; i < n; i++)
        sum += exp((double)(logits[i] - max));
    float lse = max + (float)log(sum);
    for (int32_t i = 0; i < n; i++)
        out[i] = logits[i] - lse;
    return out[tok];
}

/* The k most likely of n_vocab log-probabilities, most likely first (k <= 20). */
static int32_t top_k(int32_t n_vocab, const float *logprobs, int32_t k, sb_top_logprob *out) {
    int32_t n = 0;
    for (int32_t i = 0; i < n_vocab; i++) {
        float lp = logprobs[i];
        if (n == k && lp <= out[n - 1].logprob)
            continue;
        int32_t j = n < k ? n++ : k - 1;
        while (j > 0 && out[j - 1].logprob < lp) {
            out[j] = out[j - 1];
            j--;
        }
        out[j] = (sb_top_logprob){i, lp};
    }
    return n;
}

/* Chunk i of the step's sampling loop: draws sequence i's next token (and
 * its log-probabilities if asked) from its logits. Samplers are per
 * sequence, so sequences sample on any thread, in parallel. */
static void sample_one(void *arg, int64_t i, int ith) {
    sb_engine *e = arg;
    seq *s = e->sampling[i];
    const int32_t n_vocab = e->model->hp.n_vocab;
    const uint32_t *allowed = s->grammar ? sb_grammar_matcher_mask(s->grammar) : NULL;
    s->sampled = sb_sampler_sample_masked(s->sampler, s->logits, allowed);
    s->n_top = 0;
    if (s->p.logprobs || s->p.top_logprobs > 0) {
        float *lp = e->logprobs + (size_t)ith * n_vocab;
        s->sampled_logprob = log_softmax(n_vocab, s->logits, s->sampled, lp);
        s->n_top = top_k(n_vocab, lp, s->p.top_logprobs, s->top);
    }
}

/* Reports the token sample_one drew for a sequence whose tokens are all
 * computed; returns false when the sequence has finished (and been freed by
 * its owner: the caller removes it). */
static bool advance(sb_engine *e, seq *s, sb_finish *why) {
    const sb_model *m = e->model;
    int32_t tok = s->sampled;
    if (s->t_first == 0)
        s->t_first = now_s();
    if (sb_model_token_is_eog(m, tok) && !s->p.ignore_eos) {
        *why = SB_FINISH_STOP;
        return false;
    }
    if (!seq_append_token(s, tok)) {
        *why = SB_FINISH_ERROR;
        return false;
    }
    sb_sampler_accept(s->sampler, tok);
    if (s->grammar)
        sb_grammar_matcher_accept_token(s->grammar, tok); /* the mask allowed it */
    s->n_generated++;
    sb_gen_event ev = {.kind = SB_GEN_TOKEN, .token = tok};
    if (s->p.logprobs || s->p.top_logprobs > 0) {
        ev.logprob = s->sampled_logprob;
        ev.n_top = s->n_top;
        ev.top = s->top;
    }
    char piece[256];
    size_t k = sb_detok_push(s->detok, tok, false, piece, sizeof(piece));
    bool stopped = false;
    size_t need = k + sb_stop_max_len(s->stop) + 1;
    if (need > s->text_cap) {
        char *t = sb_realloc(s->text, need);
        if (!t) {
            *why = SB_FINISH_ERROR;
            return false;
        }
        s->text = t;
        s->text_cap = need;
    }
    ev.text = s->text;
    ev.text_len = sb_stop_push(s->stop, piece, k, s->text, s->text_cap, &stopped);
    s->cb(s->user, &ev);
    if (stopped) {
        *why = SB_FINISH_STOP;
        return false;
    }
    if ((s->p.max_tokens > 0 && s->n_generated >= s->p.max_tokens) || s->n_tokens >= e->p.n_ctx) {
        *why = SB_FINISH_LENGTH;
        return false;
    }
    return true;
}

/* ---- scheduling ------------------------------------------------------------- */

static void remove_running(sb_engine *e, int32_t i) {
    memmove(&e->running[i], &e->running[i + 1], (size_t)(e->n_running - i - 1) * sizeof(seq *));
    e->n_running--;
}

/* Puts s in `running` after every sequence of its priority or higher (it is
 * the newest). */
static void insert_running(sb_engine *e, seq *s) {
    int32_t i = e->n_running;
    while (i > 0 && e->running[i - 1]->p.priority < s->p.priority)
        i--;
    memmove(&e->running[i + 1], &e->running[i], (size_t)(e->n_running - i) * sizeof(seq *));
    e->running[i] = s;
    e->n_running++;
}

/* Puts s in `waiting` after the sequences of higher priority and, unless it
 * resumes a preempted one, after those of its own (FIFO). */
static void insert_waiting(sb_engine *e, seq *s, bool resume) {
    seq **pp = &e->waiting;
    if (!resume && e->waiting_tail && e->waiting_tail->p.priority >= s->p.priority)
        pp = &e->waiting_tail->next; /* the usual case: at the end */
    while (*pp && ((*pp)->p.priority > s->p.priority || (!resume && (*pp)->p.priority == s->p.priority)))
        pp = &(*pp)->next;
    s->next = *pp;
    *pp = s;
    if (!s->next)
        e->waiting_tail = s;
}

/* Frees running sequence i's blocks and queues it to resume first among its
 * priority (its tokens so far become the prompt it recomputes). */
static void preempt(sb_engine *e, int32_t i) {
    seq *s = e->running[i];
    seq_drop_blocks(e, s);
    s->planned = 0;
    remove_running(e, i);
    insert_waiting(e, s, true);
    pthread_mutex_lock(&e->lock);
    e->stats.preemptions++;
    e->n_queued++;
    e->stats.running = e->n_running; /* with n_queued: never both seen lower */
    pthread_mutex_unlock(&e->lock);
}

/* Gives sequence s blocks for positions up to n_computed + n - 1; on
 * exhaustion preempts the last running sequence, the lowest-priority newest
 * (possibly s itself, then false). */
static bool reserve(sb_engine *e, seq *s, int32_t n) {
    int32_t bs = e->p.block_size;
    while (s->n_blocks * bs < s->n_computed + n) {
        int32_t blk = sb_blocks_alloc(e->blocks);
        if (blk >= 0) {
            s->blocks[s->n_blocks++] = blk;
            continue;
        }
        int32_t victim = e->n_running - 1; /* at or after s in running[] */
        bool self = e->running[victim] == s;
        preempt(e, victim);
        if (self)
            return false;
    }
    return true;
}

void sb__engine_take_incoming(sb_engine *e) {
    pthread_mutex_lock(&e->lock);
    for (seq *s = e->incoming, *next; s; s = next) {
        next = s->next;
        insert_waiting(e, s, false);
    }
    e->incoming = e->incoming_tail = NULL;
    /* Cancellations: mark; the step drops them. */
    for (int32_t i = 0; e->cancel_all && i < e->n_running; i++)
        e->running[i]->cancelled = true;
    for (seq *s = e->waiting; e->cancel_all && s; s = s->next)
        s->cancelled = true;
    e->cancel_all = false;
    for (int32_t c = 0; c < e->n_cancels; c++) {
        for (int32_t i = 0; i < e->n_running; i++)
            if (e->running[i]->id == e->cancels[c])
                e->running[i]->cancelled = true;
        for (seq *s = e->waiting; s; s = s->next)
            if (s->id == e->cancels[c])
                s->cancelled = true;
    }
    e->n_cancels = 0;
    pthread_mutex_unlock(&e->lock);
}

static void drop_cancelled(sb_engine *e) {
    for (int32_t i = 0; i < e->n_running;) {
        seq *s = e->running[i];
        if (!s->cancelled) {
            i++;
            continue;
        }
        remove_running(e, i);
        finish(e, s, SB_FINISH_CANCELLED, NULL);
        seq_free(s);
    }
    for (seq **pp = &e->waiting; *pp;) {
        seq *s = *pp;
        if (!s->cancelled) {
            e->waiting_tail = s;
            pp = &s->next;
            continue;
        }
        *pp = s->next;
        pthread_mutex_lock(&e->lock);
        e->n_queued--;
        pthread_mutex_unlock(&e->lock);
        finish(e, s, SB_FINISH_CANCELLED, NULL);
        seq_free(s);
    }
    if (!e->waiting)
        e->waiting_tail = NULL;
}

/* Admits waiting sequences in order while there are slots and free blocks
 * for all of a sequence's tokens so far: admitting one that would only
 * preempt another at once is churn, not progress. Where there is no room, a
 * sequence of higher priority than the last running one preempts it. */
static void admit(sb_engine *e) {
    int32_t n = 0, bs = e->p.block_size;
    uint64_t cached = 0;
    while (e->waiting) {
        seq *s = e->waiting;
        int32_t need = (s->n_tokens + bs - 1) / bs;
        bool room = e->n_running < e->p.n_parallel &&
                    (e->n_running == 0 || need <= sb_blocks_n_total(e->blocks) - sb_blocks_n_held(e->blocks));
        if (!room && e->running[e->n_running - 1]->p.priority < s->p.priority) {
            preempt(e, e->n_running - 1); /* it queues behind s */
            continue;
        }
        if (!room)
            break;
        e->waiting = s->next;
        if (!e->waiting)
            e->waiting_tail = NULL;
        s->next = NULL;
        s->admitted = e->n_admitted++;
        seq_take_prefix(e, s);
        if (s->n_generated == 0)
            cached += (uint64_t)s->n_cached;
        insert_running(e, s);
        n++;
    }
    pthread_mutex_lock(&e->lock);
    e->n_queued -= n;
    e->stats.running = e->n_running; /* with n_queued: never both seen lower */
    e->stats.prompt_tokens_cached += cached;
    pthread_mutex_unlock(&e->lock);
}

bool sb__engine_has_work(const sb_engine *e, int32_t *priority) {
    /* Both lists are in priority order: their heads are the most urgent. */
    int32_t p = e->waiting ? e->waiting->p.priority : INT32_MIN;
    if (e->n_running > 0)
        p = SB_MAX(p, e->running[0]->p.priority);
    *priority = p;
    return e->waiting || e->n_running > 0;
}

/* Adds a decoding step of n tokens to the profile: at[0..4] are when it
 * started, its forward pass started and ended, its sampling ended, and it
 * ended. */
static void profile_step(sb_engine *e, int32_t n, const double at[5]) {
    if (n > SB_PROFILE_MAX_TOKENS)
        return;
    sb_step_profile *p = &e->profile[n];
    const sb_fwd_profile *f = &e->step_fwd;
    pthread_mutex_lock(&e->lock);
    p->steps++;
    p->step_s += at[4] - at[0];
    p->plan_s += at[1] - at[0];
    p->forward_s += at[2] - at[1];
    p->sample_s += at[3] - at[2];
    p->report_s += at[4] - at[3];
    for (int i = 0; i < SB_FWD_N_PARTS; i++)
        p->fwd.part_s[i] += f->part_s[i];
    for (int i = 0; i < SB_TYPE_COUNT; i++) {
        p->fwd.type_s[i] += f->type_s[i];
        p->fwd.type_packed[i] |= f->type_packed[i];
    }
    p->fwd.head_type = f->head_type;
    p->fwd.head_packed = f->head_packed;
    pthread_mutex_unlock(&e->lock);
}

/* ---- lanes ------------------------------------------------------------------- */

/* A decoding step of many sequences can run its forward pass either on
 * the pool, every product split by rows between the threads, or as lanes:
 * each thread takes its share of the sequences through the layers alone,
 * with nothing handed between threads inside them; the output matrix is
 * then one product on the pool for every token. Split by rows, every
 * product ends with each thread reading the activations the others wrote,
 * and the parallel loops wait for the slowest thread about ten times per
 * layer; lanes pay none of that, but each thread reads every layer weight
 * itself, for fewer tokens at a time. Which is faster depends on the
 * model's size, the batch, and where the host placed the threads, so each
 * engine measures both, per batch size: each way runs until it has
 * SPLIT_WARM steps of that size, then the faster (by a running mean of
 * the last SPLIT_MEMORY), and the slower again for SPLIT_PROBE_STEPS every
 * SPLIT_PROBE steps, as the host and the contexts change; a probe's time
 * weighs half its way's mean, which it has not kept up. (This VM's host
 * moves the two threads between sharing a last-level cache and not,
 * minute by minute, and that reverses which way is faster; weighed like
 * the others, it would take ~8 probes, over a second at 8 streams, to
 * notice.) The first step after a change of way is not counted: it finds
 * the caches as the other way left them (a lane, presumably, the KV rows
 * the other thread wrote; 110M Q4_0, 8 streams: +0.2-0.4 ms, 6-12%), and
 * counting it, as the first version did, made lanes look slower than
 * rows while they ran 2-9% faster forced. Lanes need at least
 * two tokens each: one token a lane, measured as two one-thread processes
 * of one stream each, ran 27-36% below the pool's split of 2 streams
 * (110M Q4_K_M and Q4_0, 2 threads). Results are the same either way:
 * every (row, token) result is computed alike whatever the batch and the
 * threads. */
#define SPLIT_WARM 4
#define SPLIT_MEMORY 8
#define SPLIT_PROBE 64
#define SPLIT_PROBE_STEPS 2 /* the first not counted */

/* Whether a step of n tokens, n_sampling of which sample, may run as lanes:
 * on the pool (not a lane of the executor's), every token decoding. */
static bool can_split(const sb_engine *e, int32_t n, int32_t n_sampling) {
    return e->pool && e->n_lanes > 1 && n == n_sampling && n >= 2 * e->n_lanes;
}

static enum split_way faster_way(const split_stats *s) {
    return s->mean_s[SPLIT_BY_LANES] < s->mean_s[SPLIT_BY_ROWS] ? SPLIT_BY_LANES : SPLIT_BY_ROWS;
}

/* Warm-up runs each way's steps back to back (rows, then lanes), so that
 * only its first step meets the other way's caches. */
static enum split_way choose_split(sb_engine *e, int32_t n) {
    if (e->p.split != SB_SPLIT_AUTO)
        return e->p.split == SB_SPLIT_LANES ? SPLIT_BY_LANES : SPLIT_BY_ROWS;
    split_stats *s = &e->split[n];
    for (int way = 0; way < 2; way++)
        if (s->runs[way] < SPLIT_WARM)
            return (enum split_way)way;
    const enum split_way fast = faster_way(s), slow = fast == SPLIT_BY_LANES ? SPLIT_BY_ROWS : SPLIT_BY_LANES;
    if (s->probe_left == 0 && ++s->since_probe >= SPLIT_PROBE) {
        s->since_probe = 0;
        s->probe_left = SPLIT_PROBE_STEPS;
    }
    s->probing = s->probe_left > 0;
    if (!s->probing)
        return fast;
    s->probe_left--;
    return slow;
}

static void record_split(sb_engine *e, int32_t n, enum split_way way, double seconds) {
    split_stats *s = &e->split[n];
    if (way != e->last_way)
        return;
    if (s->runs[way] < SPLIT_MEMORY)
        s->runs[way]++;
    s->mean_s[way] += (seconds - s->mean_s[way]) / (s->probing ? 2 : s->runs[way]);
}

/* Lane l's share of a step's n tokens: [lane_begin(l), lane_begin(l + 1)). */
static int32_t lane_begin(int32_t n, int64_t lane, int32_t n_lanes) { return (int32_t)(n * lane / n_lanes); }

typedef struct lane_job {
    sb_engine *e;
    int32_t n; /* the batch's tokens, every one sampling */
} lane_job;

/* Lane `lane`: its share of the batch through the layers on this thread
 * alone, its final normed states into lane_out. */
static void run_lane(void *arg, int64_t lane, int ith) {
    (void)ith;
    const lane_job *j = arg;
    sb_engine *e = j->e;
    const int32_t b0 = lane_begin(j->n, lane, e->n_lanes), b1 = lane_begin(j->n, lane + 1, e->n_lanes);
    sb_forward *f = lane == 0 ? &e->fwd : &e->lane_fwd[lane - 1];
    sb_forward_layers(f, &e->kv, e->batch + b0, b1 - b0, e->lane_out + (size_t)b0 * e->model->hp.n_embd);
}

/* The step's forward pass and sampling of n tokens, n_sampling of which
 * sample, the way choose_split says. The output matrix is one product on
 * the pool either way: lanes would each read all of it (110M Q4_K_M, 8
 * streams: 20 MB, the lane's slowest product), where the pool reads it
 * once for all the tokens. */
static void forward_and_sample(sb_engine *e, int32_t n, int32_t n_sampling, double *at) {
    const clockid_t clock = e->fwd.prof_clock;
    const bool may_split = can_split(e, n, n_sampling), measured = may_split && e->p.split == SB_SPLIT_AUTO;
    const enum split_way way = may_split ? choose_split(e, n) : SPLIT_BY_ROWS;
    const double t0 = measured ? now_s() : 0;
    if (e->profile) {
        e->step_fwd = (sb_fwd_profile){0};
        at[1] = sb__clock_s(clock);
    }
    if (way == SPLIT_BY_LANES) {
        lane_job j = {e, n};
        e->fwd.pool = NULL;
        sb_threadpool_for_each_thread(e->pool, run_lane, &j);
        e->fwd.pool = e->pool;
        sb_forward_logits(&e->fwd, e->lane_out, n);
    } else {
        sb_forward_run(&e->fwd, &e->kv, e->batch, n);
    }
    if (e->profile) /* with lanes, lane 0's layers; the wait for the others in forward_s */
        at[2] = sb__clock_s(clock);
    /* Logits rows are in batch order; the sequences sample together. */
    for (int32_t i = 0; i < n_sampling; i++)
        e->sampling[i]->logits = e->fwd.logits + (size_t)i * e->model->hp.n_vocab;
    sb_threadpool_for(e->pool, n_sampling, sample_one, e);
    if (e->profile)
        at[3] = sb__clock_s(clock);
    if (measured)
        record_split(e, n, way, now_s() - t0);
    e->last_way = way;
}

/* One scheduling step. */
static void step(sb_engine *e) {
    const clockid_t clock = e->fwd.prof_clock;
    double at[5] = {e->profile ? sb__clock_s(clock) : 0};
    sb__engine_take_incoming(e);
    drop_cancelled(e);
    admit(e);
    if (e->n_running == 0)
        return;

    /* Plan: decoding sequences first (one token each), then prompt chunks. */
    int32_t budget = e->p.max_batch_tokens;
    for (int pass = 0; pass < 2; pass++) {
        for (int32_t i = 0; i < e->n_running && budget > 0; i++) {
            seq *s = e->running[i];
            int32_t pending = s->n_tokens - s->n_computed;
            bool decoding = pending == 1 && s->n_generated > 0;
            if ((pass == 0) != decoding)
                continue;
            s->planned = SB_MIN(pending, budget);
            budget -= s->planned;
        }
    }
    /* Blocks for every planned position, oldest sequence first. */
    for (int32_t i = 0; i < e->n_running; i++) {
        seq *s = e->running[i];
        if (s->planned && !reserve(e, s, s->planned))
            i--; /* s was preempted: running[i] is the next one */
    }

    /* The batch; a sequence whose last token is in it gets logits and samples. */
    int32_t n = 0, n_sampling = 0;
    for (int32_t i = 0; i < e->n_running; i++) {
        seq *s = e->running[i];
        for (int32_t t = 0; t < s->planned; t++) {
            int32_t pos = s->n_computed + t;
            bool samples = pos == s->n_tokens - 1 && !s->p.embedding;
            e->batch[n++] = (sb_batch_token){.token = s->tokens[pos], .pos = pos, .blocks = s->blocks,
                                             .want_logits = samples, .want_embd = s->p.embedding};
            if (samples)
                e->sampling[n_sampling++] = s;
        }
    }
    if (n == 0)
        return;
    forward_and_sample(e, n, n_sampling, at);

    int32_t bi = 0;
    uint64_t computed = 0, generated = 0;
    for (int32_t i = 0; i < e->n_running;) {
        seq *s = e->running[i];
        int32_t fed = s->planned;
        s->planned = 0;
        if (fed == 0) {
            i++;
            continue;
        }
        if (s->n_generated == 0)
            computed += (uint64_t)SB_MAX(0, SB_MIN(s->n_computed + fed, s->n_prompt) - s->n_computed);
        if (s->embd_sum)
            for (int32_t t = 0; t < fed; t++)
                for (int32_t d = 0; d < e->model->hp.n_embd; d++)
                    s->embd_sum[d] += e->fwd.embd[(size_t)(bi + t) * e->model->hp.n_embd + d];
        bi += fed;
        s->n_computed += fed;
        seq_publish(e, s);
        bool done_prompt = s->n_computed == s->n_tokens;
        sb_finish why = SB_FINISH_NONE;
        if (done_prompt && s->embd_sum) {
            double norm = 0;
            for (int32_t d = 0; d < e->model->hp.n_embd; d++)
                norm += (double)s->embd_sum[d] * s->embd_sum[d];
            float inv = norm > 0 ? (float)(1.0 / sqrt(norm)) : 0.0f;
            for (int32_t d = 0; d < e->model->hp.n_embd; d++)
                s->embd_sum[d] *= inv; /* the mean's direction: the 1/n cancels */
            s->t_first = now_s();
            why = SB_FINISH_STOP;
        } else if (done_prompt) {
            bool more = advance(e, s, &why);
            generated++;
            if (more)
                why = SB_FINISH_NONE;
        }
        if (why != SB_FINISH_NONE) {
            remove_running(e, i);
            finish(e, s, why, why == SB_FINISH_ERROR ? "out of memory" : NULL);
            seq_free(s);
        } else {
            i++;
        }
    }

    pthread_mutex_lock(&e->lock);
    e->stats.prompt_tokens_computed += computed;
    e->stats.generated_tokens += generated;
    e->stats.steps++;
    pthread_mutex_unlock(&e->lock);
    if (e->profile && n == n_sampling) {
        at[4] = sb__clock_s(clock);
        profile_step(e, n, at);
    }
}

void sb__engine_step(sb_engine *e, sb_threadpool *pool) {
    e->pool = e->fwd.pool = pool;
    step(e);
    pthread_mutex_lock(&e->lock);
    e->stats.kv_blocks_used = sb_blocks_n_held(e->blocks);
    pthread_mutex_unlock(&e->lock);
}

/* ---- public ----------------------------------------------------------------- */

sb_status sb_engine_create(const sb_model_t *model, const sb_engine_params *params, sb_executor *exec,
                           sb_engine **out, sb_error *err) {
    *out = NULL;
    sb_engine_params p = params ? *params : sb_engine_default_params();
    if (p.split < SB_SPLIT_AUTO || p.split > SB_SPLIT_LANES)
        return sb_fail(err, SB_ERR_INVALID_ARG, "unknown split mode %d", (int)p.split);
    if (p.n_ctx <= 0 || p.n_parallel <= 0 || p.max_batch_tokens <= 0 || p.max_queue <= 0 || p.block_size <= 0)
        return sb_fail(err, SB_ERR_INVALID_ARG, "engine parameters must be positive (n_ctx %d, parallel %d, batch %d, "
                       "queue %d, block %d)", p.n_ctx, p.n_parallel, p.max_batch_tokens, p.max_queue, p.block_size);
    if (!exec)
        return sb_fail(err, SB_ERR_INVALID_ARG, "an engine needs an executor to run on");
    p.n_ctx = (p.n_ctx + p.block_size - 1) / p.block_size * p.block_size;
    p.max_batch_tokens = SB_MAX(p.max_batch_tokens, p.n_parallel); /* every running sequence can decode */
    size_t memory = 0, *outer = sb__alloc_measure(&memory);
    sb_engine *e = sb_calloc(1, sizeof(*e));
    if (!e) {
        sb__alloc_measure(outer);
        return sb_fail(err, SB_ERR_NOMEM, "out of memory");
    }
    e->model = model;
    e->p = p;
    e->exec = exec;
    e->pool = sb__executor_pool(exec);
    pthread_mutex_init(&e->lock, NULL);
    int32_t n_blocks = p.n_ctx / p.block_size;
    sb_status st = sb_kv_init(&e->kv, model, n_blocks, p.block_size, p.cache_type, err);
    if (st == SB_OK)
        st = sb_forward_init(&e->fwd, model, e->pool, p.max_batch_tokens, p.n_parallel, p.n_ctx, err);
    /* Lanes after lane 0 (e->fwd) hold the largest share of a decoding step. */
    e->n_lanes = sb_threadpool_n_threads(e->pool);
    const int32_t lane_tokens = (p.n_parallel + e->n_lanes - 1) / e->n_lanes;
    if (st == SB_OK && e->n_lanes > 1) {
        e->lane_fwd = sb_calloc((size_t)e->n_lanes - 1, sizeof(sb_forward));
        e->split = sb_calloc((size_t)p.n_parallel + 1, sizeof(split_stats));
        e->lane_out = sb_malloc((size_t)p.n_parallel * model->hp.n_embd * sizeof(float));
        if (!e->lane_fwd || !e->split || !e->lane_out)
            st = sb_fail(err, SB_ERR_NOMEM, "out of memory");
        for (int32_t l = 0; st == SB_OK && l < e->n_lanes - 1; l++) /* no logits: the output product is the pool's */
            st = sb_forward_init(&e->lane_fwd[l], model, NULL, lane_tokens, 1, p.n_ctx, err);
    }
    if (st == SB_OK)
        st = sb_blocks_create(n_blocks, &e->blocks, err);
    if (st == SB_OK) {
        e->batch = sb_calloc((size_t)p.max_batch_tokens, sizeof(*e->batch));
        e->running = sb_calloc((size_t)p.n_parallel, sizeof(seq *));
        e->sampling = sb_malloc((size_t)p.n_parallel * sizeof(seq *));
        e->logprobs = sb_malloc((size_t)sb_threadpool_n_threads(e->pool) * model->hp.n_vocab * sizeof(float));
        if (p.profile && (e->profile = sb_calloc(SB_PROFILE_MAX_TOKENS + 1, sizeof(*e->profile)))) {
            e->fwd.prof = &e->step_fwd;
            e->fwd.prof_clock = p.profile == SB_PROFILE_THREAD_CPU ? CLOCK_THREAD_CPUTIME_ID : CLOCK_MONOTONIC;
        }
        if (!e->batch || !e->running || !e->sampling || !e->logprobs || (p.profile && !e->profile))
            st = sb_fail(err, SB_ERR_NOMEM, "out of memory");
    }
    sb__alloc_measure(outer);
    e->memory = memory;
    e->stats.kv_blocks_total = n_blocks;
    e->stats.block_size = p.block_size;
    if (st == SB_OK)
        st = sb__executor_add(exec, e, err);
    if (st != SB_OK) {
        sb_engine_free(e);
        return st;
    }
    e->registered = true;
    *out = e;
    return SB_OK;
}

void sb_engine_free(sb_engine *e) {
    if (!e)
        return;
    if (e->registered)
        sb__executor_remove(e->exec, e);
    /* Everything still queued or running ends as cancelled. */
    sb__engine_take_incoming(e);
    for (int32_t i = 0; i < e->n_running; i++)
        e->running[i]->cancelled = true;
    for (seq *s = e->waiting; s; s = s->next)
        s->cancelled = true;
    if (e->running)
        drop_cancelled(e);
    sb_free(e->batch);
    sb_free(e->running);
    sb_free(e->logprobs);
    sb_free(e->sampling);
    sb_free(e->profile);
    sb_free(e->cancels);
    sb_blocks_free(e->blocks);
    sb_forward_free(&e->fwd);
    for (int32_t l = 0; e->lane_fwd && l < e->n_lanes - 1; l++)
        sb_forward_free(&e->lane_fwd[l]);
    sb_free(e->lane_fwd);
    sb_free(e->split);
    sb_free(e->lane_out);
    sb_kv_free(&e->kv);
    pthread_mutex_destroy(&e->lock);
    sb_free(e);
}

size_t sb_engine_memory(const sb_engine *e) { return e->memory; }

sb_status sb_engine_submit(sb_engine *e, const sb_gen_params *p, sb_gen_cb cb, void *user, uint64_t *id,
                           sb_error *err) {
    seq *s;
    sb_status st = seq_create(e, p, &s, err);
    if (st != SB_OK)
        return st;
    s->cb = cb;
    s->user = user;
    s->t_submit = now_s();
    pthread_mutex_lock(&e->lock);
    if (e->n_queued >= e->p.max_queue) {
        pthread_mutex_unlock(&e->lock);
        seq_free(s);
        return sb_fail(err, SB_ERR_BUSY, "%d requests are already waiting (the queue holds %d)", e->p.max_queue,
                       e->p.max_queue);
    }
    s->id = ++e->next_id;
    if (e->incoming_tail)
        e->incoming_tail->next = s;
    else
        e->incoming = s;
    e->incoming_tail = s;
    e->n_queued++;
    if (id)
        *id = s->id;
    pthread_mutex_unlock(&e->lock);
    sb__executor_kick(e->exec);
    return SB_OK;
}

void sb_engine_cancel(sb_engine *e, uint64_t id) {
    pthread_mutex_lock(&e->lock);
    if (e->n_cancels == e->cap_cancels) {
        int32_t cap = e->cap_cancels ? 2 * e->cap_cancels : 16;
        uint64_t *c = sb_realloc(e->cancels, (size_t)cap * sizeof(uint64_t));
        if (!c) {
            pthread_mutex_unlock(&e->lock);
            return;
        }
        e->cancels = c;
        e->cap_cancels = cap;
    }
    /* A request still in `incoming` is cancelled once it moves to waiting. */
    e->cancels[e->n_cancels++] = id;
    pthread_mutex_unlock(&e->lock);
    sb__executor_kick(e->exec);
}

void sb_engine_cancel_all(sb_engine *e) {
    pthread_mutex_lock(&e->lock);
    e->cancel_all = true;
    pthread_mutex_unlock(&e->lock);
    sb__executor_kick(e->exec);
}

bool sb_engine_get_profile(sb_engine *e, int32_t n_tokens, sb_step_profile *out) {
    *out = (sb_step_profile){0};
    if (!e->profile || n_tokens < 1 || n_tokens > SB_PROFILE_MAX_TOKENS)
        return false;
    pthread_mutex_lock(&e->lock);
    *out = e->profile[n_tokens];
    pthread_mutex_unlock(&e->lock);
    return true;
}

void sb_engine_get_stats(sb_engine *e, sb_engine_stats *out) {
    pthread_mutex_lock(&e->lock);
    *out = e->stats;
    out->waiting = e->n_queued; /* counted at submit: a request is never in neither count */
    pthread_mutex_unlock(&e->lock);
}
