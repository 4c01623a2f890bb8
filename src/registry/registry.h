/*
 * registry.h - the models a process serves, by name: load on demand under a
 * memory budget, least-recently-used eviction, keep_alive, hot swap,
 * fallback and A/B routes.
 *
 * The registry is built from a registry file (models.json), a directory of
 * .gguf files or one .gguf file (src/registry/regfile.h parses all three)
 * and rebuilt from it by sb_registry_reload (SIGHUP, POST /admin/reload, or
 * the file watcher when params.watch is set). A bad file changes nothing:
 * the running registry keeps serving and the error names line and field.
 *
 * Instances. Each entry (a model name) has at most one current instance: a
 * loaded version of it (model, chat formatter, engine on the shared
 * executor). Requests hold a lease on the instance they were routed to for
 * their whole life, so a swap or an eviction never frees what a request
 * still uses: superseded instances are retired and freed by the janitor
 * thread once their last lease is gone (never on the thread that dropped it:
 * that may be an executor thread, inside an engine callback).
 *
 * Memory. An instance costs what it allocated, measured after load (model:
 * its private copy of the file's tensors and the packed weights; engine: KV
 * pool, scratch). Before a load the cost is estimated from the file's size
 * and its header (the KV pool it will need); idle instances (no lease, not
 * pinned) are evicted least recently used first until the estimate fits,
 * and a model that cannot fit even with everything idle evicted is refused
 * with SB_ERR_OVER_BUDGET and the numbers.
 *
 * Files. Models are loaded into private memory, never left mapped: a file
 * rewritten in place under a running model (truncated, then written) would
 * otherwise change, or fault, under requests still in flight. The price is
 * one read of the file at load (the page cache serves it) and no sharing of
 * the weights' pages with the page cache; a swap by rename and a rewrite in
 * place are then equally safe.
 *
 * Threads: every function may be called from any thread.
 */
#ifndef SB_REGISTRY_H
#define SB_REGISTRY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/engine.h"
#include "engine/executor.h"
#include "model/chat.h"
#include "registry/regfile.h"
#include "sampling/grammar.h"
#include "switchboard.h"

typedef struct sb_registry sb_registry;

typedef struct sb_registry_params {
    const char *source;     /* models.json, a directory of .gguf files, or one .gguf file (copied) */
    const char *model_id;   /* one .gguf file: the name it serves under (NULL: the file name) */
    size_t memory_budget;   /* bytes all loaded models may take; 0: 80% of the memory available at start */
    sb_engine_params engine; /* what an entry does not set (n_ctx 0: the model's trained context) */
    sb_executor *exec;      /* borrowed: the engines run on it */
    int64_t keep_alive_ms;  /* for entries without one: -1 forever, 0 unload when idle; default 5 minutes */
    bool watch;             /* reload when the source changes (inotify) */
    /* One line per load, eviction, swap and reload (no newline); any thread. NULL: silent. */
    void (*log)(void *user, const char *line);
    void *log_user;
} sb_registry_params;

/* Parses the source and starts the janitor (and watcher) thread; loads
 * nothing yet except pinned models. On failure *out is NULL and err names
 * the file, line and field. */
sb_registry_params sb_registry_default_params(void);
sb_status sb_registry_open(const sb_registry_params *params, sb_registry **out, sb_error *err);
/* Frees every instance (running requests are cancelled first). Leases must
 * have been released. NULL is a no-op. */
void sb_registry_free(sb_registry *reg);

/* Cancels every request of every loaded model (their callbacks get
 * SB_FINISH_CANCELLED): the first step of shutting down. */
void sb_registry_cancel_all(sb_registry *reg);

/* Re-reads the source. A bad source leaves everything as it was and fails
 * with err naming line and field. Changed entries whose model is loaded are
 * swapped before this returns (the new version loaded beside the old one
 * when the budget allows, else after the old one drained). */
sb_status sb_registry_reload(sb_registry *reg, sb_error *err);

/* ---- leases: one request's hold on the model that serves it -------------- */

typedef struct sb_reg_lease sb_reg_lease;

/* Routes `name` (a model, an alias, or a route: `user` picks the route's arm,
 * the same arm for the same user; NULL picks at random) to its instance,
 * loading it if needed (concurrent requests wait for the same load).
 * Unknown names and models that fail to load go to the fallback when the
 * registry names one (sb_reg_lease_fallback says so). Errors:
 * SB_ERR_MODEL_NOT_FOUND (err lists the servable names), SB_ERR_OVER_BUDGET
 * (the numbers), or the load's own error. */
sb_status sb_registry_acquire(sb_registry *reg, const char *name, const char *user, sb_reg_lease **out,
                              sb_error *err);
/* Ends the hold; `keep_alive_s` >= 0 overrides the model's keep_alive from
 * now on (a request's keep_alive, as in Ollama; -1 forever), < -1 keeps it. */
void sb_reg_lease_release(sb_reg_lease *lease, double keep_alive_s);
#define SB_REG_KEEP_ALIVE_UNCHANGED (-2.0)

const sb_model_t *sb_reg_lease_model(const sb_reg_lease *l);
const sb_chat *sb_reg_lease_chat(const sb_reg_lease *l);
/* The model's vocabulary as grammars see it (structured output), built at load. */
sb_grammar_vocab *sb_reg_lease_gvocab(const sb_reg_lease *l);
sb_engine *sb_reg_lease_engine(const sb_reg_lease *l);
/* The entry's configuration (defaults, system prompt, prices); valid while leased. */
const sb_regfile_model *sb_reg_lease_config(const sb_reg_lease *l);
/* The name of the model that serves (never an alias or a route). */
const char *sb_reg_lease_name(const sb_reg_lease *l);
/* The route's name when the request named a route, else NULL. */
const char *sb_reg_lease_route(const sb_reg_lease *l);
/* Why the fallback serves ("unknown model 'x'", "model 'x' failed to load: ..."), else NULL. */
const char *sb_reg_lease_fallback(const sb_reg_lease *l);
uint64_t sb_reg_lease_version(const sb_reg_lease *l);
/* The context the engine runs with (the entry's, else the trained one). */
int32_t sb_reg_lease_n_ctx(const sb_reg_lease *l);

/* ---- administration ---------------------------------------------------- */

typedef enum sb_reg_state {
    SB_REG_UNLOADED,
    SB_REG_LOADING,
    SB_REG_LOADED,
    SB_REG_FAILED, /* the last load failed: error says why; the next request retries */
} sb_reg_state;
const char *sb_reg_state_name(sb_reg_state s);

typedef struct sb_reg_info {
    char name[128];
    char path[512];
    sb_reg_state state;
    uint64_t version;      /* of the instance serving (a new one may be loading); bumped
                              whenever the entry or its file changes */
    size_t memory;         /* bytes, measured (0 when unloaded) */
    int32_t running, waiting;
    sb_engine_stats engine; /* loaded: its engine's figures */
    int32_t leases;        /* requests holding it */
    double last_used;      /* unix time; 0 never */
    double keep_alive_s;   /* -1 forever */
    bool pinned;
    char error[256];       /* the last load error, "" if none */
} sb_reg_info;

/* Fills up to cap entries (models only, registry order); returns how many
 * models there are. */
int32_t sb_registry_list(sb_registry *reg, sb_reg_info *out, int32_t cap);
/* Every name a client may use (models, aliases, routes), NUL-separated in
 * out (capacity cap); returns the count. */
int32_t sb_registry_names(sb_registry *reg, char *out, size_t cap);

/* Loads a model by name now (it then stays until its keep_alive), or
 * unloads it: new requests load it again, requests in flight finish on the
 * retired instance, which is freed after them. */
sb_status sb_registry_load(sb_registry *reg, const char *name, sb_error *err);
sb_status sb_registry_unload(sb_registry *reg, const char *name, sb_error *err);

typedef struct sb_reg_totals {
    size_t budget, used; /* bytes */
    uint64_t loads, evictions, swaps, load_failures, reloads;
} sb_reg_totals;
void sb_registry_totals(sb_registry *reg, sb_reg_totals *out);

/* The parsed source in force (prompts, routes), held until released. */
const sb_regfile *sb_registry_file_acquire(sb_registry *reg);
void sb_registry_file_release(sb_registry *reg, const sb_regfile *rf);

#endif
