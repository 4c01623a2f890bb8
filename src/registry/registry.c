/*
 * registry.c - the registry runtime (see registry.h): entries, instances,
 * leases, the memory budget, reloads and the janitor thread.
 *
 * State, all guarded by reg->mu:
 *   snap      the parsed source in force (refcounted: entries, instances and
 *             callers of sb_registry_file_acquire hold it);
 *   entries   one per model of the snapshot, in file order; an entry has at
 *             most one current instance (`cur`, LOADING or LOADED);
 *   insts     every instance alive: current ones, and retired ones (swapped
 *             out, unloaded or evicted) that wait for their last lease.
 * `used` is what the live instances cost: measured for loaded ones, the
 * estimate for those loading. Loads run without the lock; requests for a
 * model that is loading wait on `cv`, which is broadcast whenever a load
 * ends, a lease ends or an instance is freed.
 */
#include <errno.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/base.h"
#include "gguf/gguf.h"
#include "model/model.h"
#include "registry/registry.h"

/* How long the watcher waits after the last change before reloading: an
 * editor's save or a copy arrives as several events. */
#define WATCH_SETTLE_MS 300
/* The janitor's tick: keep_alive is enforced to about this. */
#define JANITOR_TICK_MS 250
/* Routes may name routes; regfile rejects loops, this bounds the walk anyway. */
#define MAX_ROUTE_DEPTH 8

typedef struct snap {
    struct snap *next; /* in reg->snaps */
    sb_regfile *rf;
    int32_t refs;
} snap;

typedef struct entry entry;

typedef struct inst {
    struct inst *next; /* in reg->insts */
    entry *entry;      /* NULL once retired */
    snap *snap;        /* holds cfg alive */
    const sb_regfile_model *cfg;
    uint64_t version;
    sb_reg_state state; /* LOADING or LOADED */
    bool retired;       /* no new leases; freed when refs reaches 0 */
    int32_t refs;       /* leases */
    size_t est, mem;    /* estimated before load, measured after */
    size_t mem_model;   /* of mem, the weights' */
    int32_t n_ctx;
    double last_used;   /* unix time */
    int64_t keep_alive_ms;
    sb_model_t *model;
    sb_chat *chat;
    sb_grammar_vocab *gvocab;
    sb_engine *engine;
} inst;

struct entry {
    snap *snap;
    const sb_regfile_model *cfg;
    uint64_t version;
    inst *cur;                  /* LOADING or LOADED; requests go here */
    inst *next;                 /* a new version loading beside cur (a hot swap) */
    bool failed;                /* the last load of this version failed */
    char error[256];
    double last_used;
};

struct sb_reg_lease {
    sb_registry *reg;
    inst *inst;
    snap *snap;                 /* holds cfg alive */
    const sb_regfile_model *cfg;
    char route[128];            /* "" unless the request named a route */
    char fallback[320];
};

struct sb_registry {
    sb_registry_params p;
    char *source, *model_id;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_mutex_t reload_mu; /* one reload at a time */
    snap *snap;     /* in force */
    snap *snaps;    /* every snapshot alive, the one in force included */
    entry **entries;
    size_t n_entries;
    inst *insts;
    size_t budget, used;
    /* An evicted model's packed weights, kept (not counted in used) for the
     * load that evicted it: reused, they spare that load faulting in and
     * zeroing fresh pages. Lives only while loads_making_room > 0. */
    void *spare;
    int32_t loads_making_room;
    sb_reg_totals totals;
    uint64_t rng;
    uint64_t next_version;

    pthread_t janitor;
    bool janitor_started, stop;
    int inotify_fd; /* -1 when not watching */
};

/* ---- small helpers ---------------------------------------------------------- */

static double unix_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void reg_log(sb_registry *reg, const char *fmt, ...) SB_PRINTF(2, 3);
static void reg_log(sb_registry *reg, const char *fmt, ...) {
    if (!reg->p.log)
        return;
    char line[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    reg->p.log(reg->p.log_user, line);
}

static uint64_t mix64(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static uint64_t hash_str(const char *s) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a, then mixed: stable across runs */
    for (; *s; s++)
        h = (h ^ (uint8_t)*s) * 1099511628211ull;
    return mix64(h);
}

static const char *mib(size_t bytes, char *buf, size_t cap) {
    snprintf(buf, cap, "%.1f MiB", (double)bytes / (1024.0 * 1024.0));
    return buf;
}

/* 80% of what the kernel says is available now: a safe share that leaves
 * room for the page cache and whatever else the machine runs. */
static size_t default_budget(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    unsigned long long kb = 0;
    char line[256];
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1)
            break;
    if (f)
        fclose(f);
    if (kb == 0)
        kb = (unsigned long long)sysconf(_SC_PHYS_PAGES) * (unsigned long long)sysconf(_SC_PAGESIZE) / 1024;
    return (size_t)(kb * 1024 / 10 * 8);
}

/* ---- snapshots ---------------------------------------------------------------- */

static snap *snap_hold(snap *s) {
    s->refs++;
    return s;
}

/* Called with mu held. */
static void snap_drop(sb_registry *reg, snap *s) {
    if (!s || --s->refs > 0)
        return;
    for (snap **pp = &reg->snaps; *pp; pp = &(*pp)->next)
        if (*pp == s) {
            *pp = s->next;
            break;
        }
    sb_regfile_free(s->rf);
    sb_free(s);
}

/* A new snapshot holding rf (taken over), with one reference; with mu held. */
static snap *snap_create(sb_registry *reg, sb_regfile *rf) {
    snap *s = sb_calloc(1, sizeof *s);
    if (!s) {
        sb_regfile_free(rf);
        return NULL;
    }
    s->rf = rf;
    s->refs = 1;
    s->next = reg->snaps;
    reg->snaps = s;
    return s;
}

static sb_status read_source(sb_registry *reg, sb_regfile **out, sb_error *err) {
    struct stat st;
    if (stat(reg->source, &st) != 0)
        return sb_fail(err, SB_ERR_IO, "%s: cannot read the registry: %s", reg->source, strerror(errno));
    if (S_ISDIR(st.st_mode))
        return sb_regfile_from_dir(reg->source, out, err);
    size_t n = strlen(reg->source);
    if (n > 5 && strcmp(reg->source + n - 5, ".gguf") == 0)
        return sb_regfile_one(reg->source, reg->model_id, out, err);
    return sb_regfile_load(reg->source, out, err);
}

/* ---- instances ------------------------------------------------------------------ */

/* The context an entry runs with: its own, the server's, or the trained one. */
static int32_t entry_n_ctx(const sb_registry *reg, const sb_regfile_model *cfg, int32_t n_ctx_train) {
    if (cfg->context > 0)
        return cfg->context;
    if (reg->p.engine.n_ctx > 0)
        return reg->p.engine.n_ctx;
    return n_ctx_train > 0 ? n_ctx_train : 4096;
}

static sb_engine_params engine_params(const sb_registry *reg, const sb_regfile_model *cfg, int32_t n_ctx) {
    sb_engine_params ep = reg->p.engine;
    ep.n_ctx = n_ctx;
    if (cfg->has_cache_type)
        ep.cache_type = cfg->cache_type;
    if (cfg->parallel > 0)
        ep.n_parallel = cfg->parallel;
    return ep;
}

static size_t cache_elem_bytes(sb_cache_type t) { return t == SB_CACHE_F32 ? 4 : t == SB_CACHE_F16 ? 2 : 1; }

/* What loading cfg will cost, before loading it: the file (weights end up
 * in memory once, packed or not) and the KV pool its header implies. The
 * scratch and the vocabulary are small against these and are covered by
 * the measured figure that replaces this estimate once loaded. */
static size_t estimate_cost(const sb_registry *reg, const sb_regfile_model *cfg) {
    sb_gguf *g;
    if (sb_gguf_open(cfg->path, &g, NULL) != SB_OK)
        return (size_t)cfg->file.size; /* the load will fail and say why */
    size_t cost = (size_t)g->size;
    sb_gguf_str arch;
    uint32_t n_layer = 0, n_embd = 0, n_head = 1, n_head_kv = 0, n_ctx_train = 0, key_len = 0, n_ff = 0;
    if (sb_gguf_get_str(g, "general.architecture", &arch, NULL) == SB_OK && arch.len < 64) {
        char key[128], a[64];
        memcpy(a, arch.ptr, (size_t)arch.len);
        a[arch.len] = '\0';
        struct { const char *suffix; uint32_t *v; } dims[] = {
            {"block_count", &n_layer}, {"embedding_length", &n_embd}, {"attention.head_count", &n_head},
            {"attention.head_count_kv", &n_head_kv}, {"context_length", &n_ctx_train}, {"attention.key_length", &key_len},
            {"feed_forward_length", &n_ff}};
        for (size_t i = 0; i < SB_ARRAY_LEN(dims); i++) {
            snprintf(key, sizeof key, "%s.%s", a, dims[i].suffix);
            sb_gguf_get_u32_or(g, key, *dims[i].v, dims[i].v, NULL);
        }
    }
    const sb_gguf_kv *tokens = sb_gguf_find(g, "tokenizer.ggml.tokens");
    uint64_t n_vocab = tokens && tokens->type == SB_GGUF_ARRAY ? tokens->arr_n : 0;
    sb_gguf_close(g);
    if (n_head == 0)
        n_head = 1;
    if (n_head_kv == 0)
        n_head_kv = n_head;
    uint64_t head_dim = key_len ? key_len : n_embd / n_head;
    sb_engine_params ep = engine_params(reg, cfg, entry_n_ctx(reg, cfg, (int32_t)n_ctx_train));
    uint64_t kv = 2ull * n_layer * (uint64_t)ep.n_ctx * n_head_kv * head_dim * cache_elem_bytes(ep.cache_type);
    /* The forward pass's activations for a full batch, and its logits. */
    uint64_t scratch = (uint64_t)ep.max_batch_tokens * 4 * (6ull * n_embd + 3ull * n_ff + n_vocab);
    return cost + (size_t)kv + (size_t)scratch;
}

static sb_status read_text_file(const char *path, char **out, size_t *len, sb_error *err) {
    FILE *f = fopen(path, "rb");
    if (!f)
        return sb_fail(err, SB_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    size_t cap = 4096, n = 0;
    char *buf = sb_malloc(cap);
    for (size_t k; buf && (k = fread(buf + n, 1, cap - n, f)) > 0;) {
        n += k;
        if (n == cap) {
            char *b = sb_realloc(buf, cap * 2);
            if (!b) {
                sb_free(buf);
                buf = NULL;
                break;
            }
            buf = b;
            cap *= 2;
        }
    }
    bool bad = ferror(f);
    fclose(f);
    if (!buf || bad) {
        sb_free(buf);
        return sb_fail(err, bad ? SB_ERR_IO : SB_ERR_NOMEM, "%s: cannot read", path);
    }
    *out = buf;
    *len = n;
    return SB_OK;
}

/* Loads i's model (packing into `region`, owned, when not NULL), chat
 * formatter and engine (without the lock). */
static sb_status inst_build(sb_registry *reg, inst *i, void *region, sb_error *err) {
    const sb_regfile_model *cfg = i->cfg;
    if (strcmp(cfg->device, "cpu") != 0) {
        sb_free(region);
        return sb_fail(err, SB_ERR_UNSUPPORTED, "model '%s': device '%s' has no backend (only cpu)", cfg->name,
                       cfg->device);
    }
    sb_model_params mp = sb_model_default_params();
    mp.private_copy = true; /* see registry.h, "Files" */
    sb_status st = sb__model_load_reusing(cfg->path, &mp, region, &i->model, err);
    if (st == SB_OK && cfg->chat_template) {
        char *text = NULL;
        size_t len = 0;
        st = read_text_file(cfg->chat_template, &text, &len, err);
        if (st == SB_OK) {
            st = sb_chat_create_from(i->model, text, len, cfg->chat_template, &i->chat, err);
            sb_free(text);
        }
    } else if (st == SB_OK) {
        st = sb_chat_create(i->model, &i->chat, err);
    }
    if (st == SB_OK)
        st = sb_grammar_vocab_create(i->model, &i->gvocab, err);
    if (st == SB_OK) {
        i->n_ctx = entry_n_ctx(reg, cfg, sb_model_n_ctx_train(i->model));
        sb_engine_params ep = engine_params(reg, cfg, i->n_ctx);
        st = sb_engine_create(i->model, &ep, reg->p.exec, &i->engine, err);
    }
    if (st == SB_OK) {
        i->mem_model = sb_model_memory(i->model);
        i->mem = i->mem_model + sb_engine_memory(i->engine);
    }
    return st;
}

/* Frees what inst_build made (without the lock; nobody else can reach i). */
static void inst_destroy(inst *i) {
    sb_engine_free(i->engine);
    sb_grammar_vocab_free(i->gvocab);
    sb_chat_free(i->chat);
    sb_model_free(i->model);
    sb_free(i);
}

static void insts_unlink(sb_registry *reg, inst *i) {
    for (inst **pp = &reg->insts; *pp; pp = &(*pp)->next)
        if (*pp == i) {
            *pp = i->next;
            return;
        }
}

/* Makes i unreachable for new requests; with mu held. */
static void inst_retire(sb_registry *reg, inst *i) {
    if (i->entry && i->entry->cur == i)
        i->entry->cur = NULL;
    if (i->entry && i->entry->next == i)
        i->entry->next = NULL;
    i->entry = NULL;
    i->retired = true;
}

/* Frees every retired instance without leases, dropping mu meanwhile;
 * returns whether any was freed. */
static bool reap(sb_registry *reg) {
    bool any = false;
    for (;;) {
        inst *dead = NULL;
        for (inst *i = reg->insts; i && !dead; i = i->next)
            if (i->retired && i->refs == 0 && i->state == SB_REG_LOADED)
                dead = i;
        if (!dead)
            return any;
        insts_unlink(reg, dead);
        reg->used -= dead->mem;
        if (reg->loads_making_room > 0 && !reg->spare)
            reg->spare = sb__model_take_packed(dead->model);
        snap *s = dead->snap;
        pthread_mutex_unlock(&reg->mu);
        inst_destroy(dead);
        pthread_mutex_lock(&reg->mu);
        snap_drop(reg, s);
        pthread_cond_broadcast(&reg->cv);
        any = true;
    }
}

/* The least recently used loaded instance nobody holds, not pinned. */
static inst *lru_idle(sb_registry *reg) {
    inst *best = NULL;
    for (inst *i = reg->insts; i; i = i->next)
        if (!i->retired && i->state == SB_REG_LOADED && i->refs == 0 && !i->cfg->pinned &&
            (!best || i->last_used < best->last_used))
            best = i;
    return best;
}

/* Frees memory until `need` more bytes fit the budget: retired instances
 * that drained, then idle ones, least recently used first; waits for
 * retired instances still in use when they would make room. Evicts nothing
 * when even evicting everything idle would not make room. With mu held
 * (dropped while freeing or waiting). */
static sb_status make_room(sb_registry *reg, const char *name, size_t need, sb_error *err) {
    for (;;) {
        reap(reg);
        if (reg->used + need <= reg->budget)
            return SB_OK;
        size_t idle = 0, draining = 0, pinned = 0;
        for (inst *i = reg->insts; i; i = i->next) {
            size_t cost = i->state == SB_REG_LOADED ? i->mem : i->est;
            if (i->retired)
                draining += cost;
            else if (i->state == SB_REG_LOADED && i->cfg->pinned)
                pinned += cost;
            else if (i->state == SB_REG_LOADED && i->refs == 0)
                idle += cost;
        }
        if (reg->used - idle - draining + need > reg->budget) {
            char a[32], b[32], c[32], d[32], e[32];
            return sb_fail(err, SB_ERR_OVER_BUDGET,
                           "model '%s' needs about %s but the memory budget is %s: %s in use, of which %s pinned "
                           "and %s serving requests or loading, which cannot be evicted",
                           name, mib(need, a, sizeof a), mib(reg->budget, b, sizeof b), mib(reg->used, c, sizeof c),
                           mib(pinned, d, sizeof d), mib(reg->used - idle - draining - pinned, e, sizeof e));
        }
        inst *victim = lru_idle(reg);
        if (!victim) {
            pthread_cond_wait(&reg->cv, &reg->mu); /* a retired instance's last request will end */
            continue;
        }
        reg_log(reg, "evicting '%s' (idle for %.1fs) to make room for '%s'", victim->cfg->name,
                unix_now() - victim->last_used, name);
        reg->totals.evictions++;
        inst_retire(reg, victim);
    }
}

/* Ends a load's claim on reg->spare: the last load making room frees one
 * nobody took. With mu held, dropped meanwhile. */
static void drop_spare(sb_registry *reg) {
    if (--reg->loads_making_room > 0 || !reg->spare)
        return;
    void *p = reg->spare;
    reg->spare = NULL;
    pthread_mutex_unlock(&reg->mu);
    sb_free(p);
    pthread_mutex_lock(&reg->mu);
}

/* Frees an instance that never served (a failed or abandoned load); with
 * mu held, dropped meanwhile. */
static void inst_discard(sb_registry *reg, inst *i) {
    insts_unlink(reg, i);
    snap *s = i->snap;
    pthread_mutex_unlock(&reg->mu);
    inst_destroy(i);
    pthread_mutex_lock(&reg->mu);
    snap_drop(reg, s);
}

/* Loads a new instance of e's version. With mu held; returns with it held,
 * but e may be gone by then (a reload replaced it): after the first unlock
 * only the instance's own entry pointer is trusted. When e has a loaded
 * instance, the new one loads beside it (a hot swap; if both do not fit
 * the budget, the old one retires first and the new one loads once it has
 * drained) and replaces it when ready. */
static sb_status load_entry(sb_registry *reg, entry *e, sb_error *err) {
    inst *i = sb_calloc(1, sizeof *i);
    if (!i)
        return sb_fail(err, SB_ERR_NOMEM, "out of memory");
    i->entry = e;
    i->snap = snap_hold(e->snap);
    i->cfg = e->cfg;
    i->version = e->version;
    i->state = SB_REG_LOADING;
    i->keep_alive_ms = i->cfg->has_keep_alive ? i->cfg->keep_alive_ms : reg->p.keep_alive_ms;
    i->next = reg->insts;
    reg->insts = i;
    if (e->cur)
        e->next = i;
    else
        e->cur = i; /* requests wait for this load */
    pthread_mutex_unlock(&reg->mu);
    i->est = estimate_cost(reg, i->cfg);
    pthread_mutex_lock(&reg->mu);

    reg->loads_making_room++;
    sb_status st = make_room(reg, i->cfg->name, i->est, err);
    if (st == SB_ERR_OVER_BUDGET && i->entry && i->entry->cur && i->entry->cur != i) {
        inst *old = i->entry->cur;
        reg_log(reg, "'%s': no room for two versions; version %llu drains first", i->cfg->name,
                (unsigned long long)old->version);
        inst_retire(reg, old);
        i->entry->cur = i;
        i->entry->next = NULL;
        st = make_room(reg, i->cfg->name, i->est, err);
    }
    void *region = st == SB_OK ? reg->spare : NULL;
    reg->spare = NULL;
    drop_spare(reg);
    double t0 = unix_now();
    if (st == SB_OK) {
        reg->used += i->est;
        pthread_mutex_unlock(&reg->mu);
        st = inst_build(reg, i, region, err);
        pthread_mutex_lock(&reg->mu);
        reg->used -= i->est;
    }
    entry *owner = i->entry; /* NULL if a reload dropped this load */
    if (st != SB_OK) {
        reg->totals.load_failures++;
        if (owner) {
            inst_retire(reg, i);
            owner->failed = true;
            snprintf(owner->error, sizeof owner->error, "%.255s", err ? err->msg : sb_status_str(st));
        }
        reg_log(reg, "cannot load '%s': %s", i->cfg->name, err ? err->msg : sb_status_str(st));
        inst_discard(reg, i);
        pthread_cond_broadcast(&reg->cv);
        return st;
    }
    reg->used += i->mem;
    if (reg->used > reg->budget && (st = make_room(reg, i->cfg->name, 0, err)) != SB_OK) {
        /* Measured, it costs more than estimated, and nothing idle makes up for it. */
        reg->used -= i->mem;
        reg->totals.load_failures++;
        if (i->entry)
            inst_retire(reg, i);
        inst_discard(reg, i);
        pthread_cond_broadcast(&reg->cv);
        return st;
    }
    i->state = SB_REG_LOADED;
    i->last_used = unix_now();
    reg->totals.loads++;
    if (owner) {
        if (owner->cur && owner->cur != i) {
            inst_retire(reg, owner->cur);
            reg->totals.swaps++;
        }
        owner->cur = i;
        owner->next = NULL;
        owner->failed = false;
        owner->error[0] = '\0';
    }
    char a[32], b[32], c[32];
    reg_log(reg, "loaded '%s' version %llu in %.0f ms: %s (weights %s; estimated %s), %d positions", i->cfg->name,
            (unsigned long long)i->version, (unix_now() - t0) * 1e3, mib(i->mem, a, sizeof a),
            mib(i->mem_model, c, sizeof c), mib(i->est, b, sizeof b), (int)i->n_ctx);
    if (!owner)
        inst_retire(reg, i); /* reaped: nobody can reach it */
    pthread_cond_broadcast(&reg->cv);
    return SB_OK;
}

/* ---- entries ---------------------------------------------------------------------- */

static entry *find_entry(sb_registry *reg, const char *name) {
    for (size_t k = 0; k < reg->n_entries; k++)
        if (strcmp(reg->entries[k]->cfg->name, name) == 0)
            return reg->entries[k];
    return NULL;
}

/* The names a client may use, for a not-found message. */
static void names_list(sb_registry *reg, char *out, size_t cap) {
    const sb_regfile *rf = reg->snap->rf;
    size_t n = 0;
    out[0] = '\0';
    for (size_t k = 0; k < rf->n_models + rf->n_routes && n + 4 < cap; k++) {
        const char *name = k < rf->n_models ? rf->models[k].name : rf->routes[k - rf->n_models].name;
        int w = snprintf(out + n, cap - n, "%s'%s'", n ? ", " : "", name);
        n = w < 0 ? cap : SB_MIN(cap - 1, n + (size_t)w);
    }
    if (n == 0)
        snprintf(out, cap, "none: the registry is empty");
}

/* Picks a route's arm: by the user's hash (sticky) or at random. */
static const char *route_pick(sb_registry *reg, const sb_regfile_route *r, const char *user) {
    uint64_t h = user && *user ? hash_str(user) ^ hash_str(r->name) : mix64(reg->rng++);
    double u = (double)(h >> 11) * (1.0 / 9007199254740992.0), acc = 0;
    for (size_t k = 0; k < r->n_split; k++) {
        acc += r->split[k].weight / r->total_weight;
        if (u < acc)
            return r->split[k].model;
    }
    return r->split[r->n_split - 1].model;
}

/* Resolves name to a model entry through aliases and routes (not the
 * fallback). NULL if unknown. */
static entry *resolve(sb_registry *reg, const char *name, const char *user, const char **route) {
    *route = NULL;
    for (int depth = 0; depth < MAX_ROUTE_DEPTH; depth++) {
        const sb_regfile_model *m;
        const sb_regfile_route *r;
        sb_regfile_kind k = sb_regfile_resolve(reg->snap->rf, name, &m, &r);
        if (k == SB_REGFILE_MODEL)
            return find_entry(reg, m->name);
        if (k != SB_REGFILE_ROUTE)
            return NULL;
        if (!*route)
            *route = r->name;
        name = route_pick(reg, r, user);
    }
    return NULL;
}

static void entries_free(sb_registry *reg, entry **es, size_t n) {
    for (size_t k = 0; k < n; k++) {
        snap_drop(reg, es[k]->snap);
        sb_free(es[k]);
    }
    sb_free(es);
}

/* Builds the entries of a new snapshot, keeping the instances whose load
 * still serves the new entry; with mu held. Fills swap[] with the entries
 * whose loaded model must be reloaded (a new version). */
static sb_status install(sb_registry *reg, snap *s, entry ***swap, size_t *n_swap, sb_error *err) {
    const sb_regfile *rf = s->rf;
    entry **es = sb_calloc(rf->n_models + 1, sizeof *es);
    entry **sw = sb_calloc(rf->n_models + 1, sizeof *sw);
    if (!es || !sw) {
        sb_free(es);
        sb_free(sw);
        return sb_fail(err, SB_ERR_NOMEM, "out of memory");
    }
    for (size_t k = 0; k < rf->n_models; k++) {
        if (!(es[k] = sb_calloc(1, sizeof *es[k]))) { /* before anything moves: a failure changes nothing */
            for (size_t j = 0; j < k; j++)
                sb_free(es[j]);
            sb_free(es);
            sb_free(sw);
            return sb_fail(err, SB_ERR_NOMEM, "out of memory");
        }
    }
    size_t ns = 0;
    for (size_t k = 0; k < rf->n_models; k++) {
        const sb_regfile_model *cfg = &rf->models[k];
        entry *old = find_entry(reg, cfg->name);
        entry *e = es[k];
        e->snap = snap_hold(s);
        e->cfg = cfg;
        bool same = old && sb_regfile_model_same_load(old->cfg, cfg);
        e->version = same ? old->version : ++reg->next_version;
        if (!old)
            continue;
        e->last_used = old->last_used;
        if (same) {
            e->failed = old->failed;
            memcpy(e->error, old->error, sizeof e->error);
        }
        /* The instance moves over if it serves the new entry as it is, or
         * is loaded (it serves until the new version replaces it); a load
         * of the old version still in progress is dropped below. */
        inst *i = old->cur;
        if (!i || (!same && i->state != SB_REG_LOADED))
            continue;
        old->cur = NULL;
        i->entry = e;
        e->cur = i;
        if (same) {
            i->cfg = cfg; /* prices, parameters, keep_alive: read per request */
            snap_drop(reg, i->snap);
            i->snap = snap_hold(s);
            if (cfg->has_keep_alive)
                i->keep_alive_ms = cfg->keep_alive_ms;
        } else {
            sw[ns++] = e; /* swapped by the caller, outside the lock */
        }
    }
    /* Entries that are gone, or whose loading instance is now stale. */
    for (inst *i = reg->insts; i; i = i->next) {
        bool current = false;
        for (size_t k = 0; k < rf->n_models && !current; k++)
            current = es[k]->cur == i;
        if (!current && !i->retired)
            inst_retire(reg, i);
    }
    entries_free(reg, reg->entries, reg->n_entries);
    snap_drop(reg, reg->snap);
    reg->snap = snap_hold(s);
    reg->entries = es;
    reg->n_entries = rf->n_models;
    *swap = sw;
    *n_swap = ns;
    pthread_cond_broadcast(&reg->cv);
    return SB_OK;
}

/* Reads the source and installs it; loads the new versions of swapped
 * entries. Without mu. */
static sb_status reload(sb_registry *reg, sb_error *err) {
    pthread_mutex_lock(&reg->reload_mu);
    sb_regfile *rf;
    sb_status st = read_source(reg, &rf, err);
    if (st != SB_OK) {
        pthread_mutex_unlock(&reg->reload_mu);
        return st;
    }
    pthread_mutex_lock(&reg->mu);
    snap *s = snap_create(reg, rf);
    entry **swap = NULL;
    size_t n_swap = 0;
    st = s ? install(reg, s, &swap, &n_swap, err) : sb_fail(err, SB_ERR_NOMEM, "out of memory");
    if (st == SB_OK)
        reg->totals.reloads++;
    snap_drop(reg, s); /* install took its own reference */
    for (size_t k = 0; k < n_swap; k++) {
        /* Entries live while reload_mu is held: only reloads replace them. */
        entry *e = swap[k];
        if (!e->cur || e->cur->state != SB_REG_LOADED || e->cur->version == e->version || e->next)
            continue;
        reg_log(reg, "'%s' changed: loading version %llu beside version %llu", e->cfg->name,
                (unsigned long long)e->version, (unsigned long long)e->cur->version);
        sb_error lerr;
        load_entry(reg, e, &lerr); /* a failure keeps the old version serving; its error is in e */
    }
    /* Pinned models are always loaded. */
    for (size_t k = 0; k < reg->n_entries; k++) {
        entry *e = reg->entries[k];
        sb_error lerr;
        if (e->cfg->pinned && !e->cur && !e->failed)
            load_entry(reg, e, &lerr);
    }
    pthread_mutex_unlock(&reg->mu);
    sb_free(swap);
    pthread_mutex_unlock(&reg->reload_mu);
    return st;
}

/* ---- the janitor: frees, keep_alive, file watching --------------------------------- */

static void expire_idle(sb_registry *reg) {
    double now = unix_now();
    for (inst *i = reg->insts; i; i = i->next) {
        if (i->retired || i->state != SB_REG_LOADED || i->refs > 0 || i->cfg->pinned || i->keep_alive_ms < 0)
            continue;
        if ((now - i->last_used) * 1e3 >= (double)i->keep_alive_ms) {
            reg_log(reg, "unloading '%s': idle for %.1fs (keep_alive %.1fs)", i->cfg->name, now - i->last_used,
                    (double)i->keep_alive_ms / 1e3);
            inst_retire(reg, i);
        }
    }
}

/* Adds an inotify watch on the directory of every file the registry reads. */
static void watch_dirs(sb_registry *reg) {
    if (reg->inotify_fd < 0)
        return;
    const uint32_t mask = IN_CLOSE_WRITE | IN_MOVED_TO | IN_MOVED_FROM | IN_CREATE | IN_DELETE | IN_ATTRIB;
    struct stat st;
    if (stat(reg->source, &st) == 0 && S_ISDIR(st.st_mode)) {
        inotify_add_watch(reg->inotify_fd, reg->source, mask);
        return;
    }
    char dir[4096];
    const sb_regfile *rf = reg->snap->rf;
    for (size_t k = 0; k <= rf->n_models; k++) {
        const char *path = k == 0 ? reg->source : rf->models[k - 1].path;
        const char *slash = strrchr(path, '/');
        if (!slash)
            snprintf(dir, sizeof dir, ".");
        else
            snprintf(dir, sizeof dir, "%.*s", (int)(slash - path == 0 ? 1 : slash - path), path);
        inotify_add_watch(reg->inotify_fd, dir, mask); /* adding a watched directory again is harmless */
    }
}

/* Drains inotify events; true if any arrived. */
static bool drain_events(int fd) {
    char buf[8192] __attribute__((aligned(__alignof__(struct inotify_event))));
    bool any = false;
    for (;;) {
        ssize_t n = read(fd, buf, sizeof buf);
        if (n <= 0)
            return any;
        any = true;
    }
}

static void *janitor_main(void *arg) {
    sb_registry *reg = arg;
    double changed_at = 0; /* when the last unprocessed change arrived */
    for (;;) {
        if (reg->inotify_fd >= 0) {
            struct pollfd p = {.fd = reg->inotify_fd, .events = POLLIN};
            if (poll(&p, 1, JANITOR_TICK_MS) > 0 && drain_events(reg->inotify_fd))
                changed_at = unix_now();
        }
        pthread_mutex_lock(&reg->mu);
        if (reg->inotify_fd < 0 && !reg->stop) {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_nsec += JANITOR_TICK_MS * 1000000L;
            ts.tv_sec += ts.tv_nsec / 1000000000L;
            ts.tv_nsec %= 1000000000L;
            pthread_cond_timedwait(&reg->cv, &reg->mu, &ts);
        }
        if (reg->stop) {
            pthread_mutex_unlock(&reg->mu);
            return NULL;
        }
        expire_idle(reg);
        reap(reg);
        pthread_mutex_unlock(&reg->mu);
        if (changed_at > 0 && (unix_now() - changed_at) * 1e3 >= WATCH_SETTLE_MS) {
            changed_at = 0;
            sb_error err;
            if (reload(reg, &err) != SB_OK)
                reg_log(reg, "reload after a change on disk failed, the registry is unchanged: %s", err.msg);
            pthread_mutex_lock(&reg->mu);
            watch_dirs(reg);
            pthread_mutex_unlock(&reg->mu);
        }
    }
}

/* ---- public ---------------------------------------------------------------------- */

sb_registry_params sb_registry_default_params(void) {
    return (sb_registry_params){.engine = sb_engine_default_params(), .keep_alive_ms = 5 * 60 * 1000};
}

sb_status sb_registry_open(const sb_registry_params *params, sb_registry **out, sb_error *err) {
    *out = NULL;
    if (!params->source || !params->exec)
        return sb_fail(err, SB_ERR_INVALID_ARG, "registry: no source or no executor given");
    sb_registry *reg = sb_calloc(1, sizeof *reg);
    if (!reg)
        return sb_fail(err, SB_ERR_NOMEM, "registry: out of memory");
    reg->p = *params;
    reg->inotify_fd = -1;
    reg->source = sb_strndup(params->source, strlen(params->source));
    reg->model_id = params->model_id ? sb_strndup(params->model_id, strlen(params->model_id)) : NULL;
    reg->p.source = reg->source;
    reg->p.model_id = reg->model_id;
    reg->budget = params->memory_budget ? params->memory_budget : default_budget();
    reg->rng = mix64((uint64_t)time(NULL) ^ (uint64_t)(uintptr_t)reg);
    pthread_mutex_init(&reg->mu, NULL);
    pthread_cond_init(&reg->cv, NULL);
    pthread_mutex_init(&reg->reload_mu, NULL);
    sb_regfile *rf = NULL;
    sb_status st = reg->source && (!params->model_id || reg->model_id) ? SB_OK
                                                                       : sb_fail(err, SB_ERR_NOMEM, "out of memory");
    if (st == SB_OK)
        st = read_source(reg, &rf, err);
    if (st == SB_OK) { /* the first install is a reload over nothing */
        pthread_mutex_lock(&reg->mu);
        snap *s = snap_create(reg, rf);
        entry **swap = NULL;
        size_t n_swap;
        st = s ? install(reg, s, &swap, &n_swap, err) : sb_fail(err, SB_ERR_NOMEM, "out of memory");
        snap_drop(reg, s);
        pthread_mutex_unlock(&reg->mu);
        sb_free(swap);
    }
    if (st == SB_OK && params->watch) {
        reg->inotify_fd = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
        watch_dirs(reg);
    }
    if (st == SB_OK && pthread_create(&reg->janitor, NULL, janitor_main, reg) != 0)
        st = sb_fail(err, SB_ERR_NOMEM, "registry: cannot start its thread");
    else if (st == SB_OK)
        reg->janitor_started = true;
    if (st != SB_OK) {
        sb_registry_free(reg);
        return st;
    }
    pthread_mutex_lock(&reg->mu);
    for (size_t k = 0; k < reg->n_entries; k++) {
        sb_error lerr;
        if (reg->entries[k]->cfg->pinned)
            load_entry(reg, reg->entries[k], &lerr);
    }
    pthread_mutex_unlock(&reg->mu);
    char a[32];
    reg_log(reg, "registry %s: %zu models, memory budget %s", reg->source, reg->n_entries,
            mib(reg->budget, a, sizeof a));
    *out = reg;
    return SB_OK;
}

void sb_registry_free(sb_registry *reg) {
    if (!reg)
        return;
    if (reg->janitor_started) {
        pthread_mutex_lock(&reg->mu);
        reg->stop = true;
        pthread_cond_broadcast(&reg->cv);
        pthread_mutex_unlock(&reg->mu);
        pthread_join(reg->janitor, NULL);
    }
    if (reg->inotify_fd >= 0)
        close(reg->inotify_fd);
    pthread_mutex_lock(&reg->mu);
    while (reg->insts) {
        inst *i = reg->insts;
        reg->insts = i->next;
        snap *s = i->snap;
        pthread_mutex_unlock(&reg->mu);
        inst_destroy(i);
        pthread_mutex_lock(&reg->mu);
        snap_drop(reg, s);
    }
    entries_free(reg, reg->entries, reg->n_entries);
    snap_drop(reg, reg->snap);
    pthread_mutex_unlock(&reg->mu);
    pthread_mutex_destroy(&reg->mu);
    pthread_cond_destroy(&reg->cv);
    pthread_mutex_destroy(&reg->reload_mu);
    sb_free(reg->source);
    sb_free(reg->model_id);
    sb_free(reg);
}

void sb_registry_cancel_all(sb_registry *reg) {
    pthread_mutex_lock(&reg->mu);
    for (inst *i = reg->insts; i; i = i->next)
        if (i->state == SB_REG_LOADED)
            sb_engine_cancel_all(i->engine);
    pthread_mutex_unlock(&reg->mu);
}

sb_status sb_registry_reload(sb_registry *reg, sb_error *err) {
    sb_status st = reload(reg, err);
    if (st == SB_OK) {
        pthread_mutex_lock(&reg->mu);
        watch_dirs(reg);
        pthread_mutex_unlock(&reg->mu);
    }
    return st;
}

/* Where a request for `name` goes when its model cannot serve: the
 * model's fallback, else the registry's; NULL if none or already used. */
static const char *fallback_for(sb_registry *reg, const entry *e, const sb_reg_lease *l) {
    const char *fb = e && e->cfg->fallback ? e->cfg->fallback : reg->snap->rf->fallback;
    if (!fb || l->fallback[0] || (e && strcmp(fb, e->cfg->name) == 0))
        return NULL;
    return fb;
}

/* Finds, loading if needed, the instance serving `name`; with mu held.
 * Every wait or load drops the lock, after which the name is routed again
 * from the snapshot then in force (a reload may have replaced it). */
static sb_status acquire_locked(sb_registry *reg, const char *name, const char *user, sb_reg_lease *l,
                                sb_error *err) {
    const char *requested = name;
    for (int hops = 0;;) {
        const char *route;
        entry *e = resolve(reg, name, user, &route);
        const char *fb = fallback_for(reg, e, l);
        if (!e && fb && hops++ < MAX_ROUTE_DEPTH) {
            snprintf(l->fallback, sizeof l->fallback, "unknown model '%.200s'", requested);
            name = fb;
            continue;
        }
        if (!e) {
            char names[400];
            names_list(reg, names, sizeof names);
            return sb_fail(err, SB_ERR_MODEL_NOT_FOUND, "The model '%.200s' does not exist; available: %s", requested,
                           names);
        }
        inst *i = e->cur;
        if (i && i->state == SB_REG_LOADED) {
            i->refs++;
            i->last_used = e->last_used = unix_now();
            l->inst = i;
            l->snap = snap_hold(i->snap);
            l->cfg = i->cfg;
            snprintf(l->route, sizeof l->route, "%s", route ? route : "");
            return SB_OK;
        }
        if (i || e->next) { /* loading: wait for it */
            pthread_cond_wait(&reg->cv, &reg->mu);
            continue;
        }
        sb_status st;
        if (e->failed)
            st = sb_fail(err, SB_ERR_UNSUPPORTED, "model '%s' failed to load: %s", e->cfg->name, e->error);
        else if ((st = load_entry(reg, e, err)) == SB_OK)
            continue; /* route again: the loaded instance is found above */
        fb = st == SB_ERR_OVER_BUDGET ? NULL : fallback_for(reg, find_entry(reg, name), l);
        if (!fb || hops++ >= MAX_ROUTE_DEPTH)
            return st;
        snprintf(l->fallback, sizeof l->fallback, "model '%.60s' failed to load: %.230s", name,
                 err ? err->msg : sb_status_str(st));
        name = fb;
    }
}

sb_status sb_registry_acquire(sb_registry *reg, const char *name, const char *user, sb_reg_lease **out,
                              sb_error *err) {
    *out = NULL;
    sb_reg_lease *l = sb_calloc(1, sizeof *l);
    if (!l)
        return sb_fail(err, SB_ERR_NOMEM, "out of memory");
    l->reg = reg;
    pthread_mutex_lock(&reg->mu);
    sb_status st = acquire_locked(reg, name, user, l, err);
    pthread_mutex_unlock(&reg->mu);
    if (st != SB_OK) {
        sb_free(l);
        return st;
    }
    *out = l;
    return SB_OK;
}

void sb_reg_lease_release(sb_reg_lease *l, double keep_alive_s) {
    if (!l)
        return;
    sb_registry *reg = l->reg;
    pthread_mutex_lock(&reg->mu);
    inst *i = l->inst;
    i->last_used = unix_now();
    if (keep_alive_s >= -1.0)
        i->keep_alive_ms = keep_alive_s < 0 ? SB_REGFILE_FOREVER : (int64_t)(keep_alive_s * 1e3);
    snap_drop(reg, l->snap);
    /* The janitor frees a drained retired instance: this may be the executor
     * thread, inside an engine callback, where freeing an engine deadlocks. */
    if (--i->refs == 0)
        pthread_cond_broadcast(&reg->cv);
    pthread_mutex_unlock(&reg->mu);
    sb_free(l);
}

const sb_model_t *sb_reg_lease_model(const sb_reg_lease *l) { return l->inst->model; }
const sb_chat *sb_reg_lease_chat(const sb_reg_lease *l) { return l->inst->chat; }
sb_grammar_vocab *sb_reg_lease_gvocab(const sb_reg_lease *l) { return l->inst->gvocab; }
sb_engine *sb_reg_lease_engine(const sb_reg_lease *l) { return l->inst->engine; }
const sb_regfile_model *sb_reg_lease_config(const sb_reg_lease *l) { return l->cfg; }
const char *sb_reg_lease_name(const sb_reg_lease *l) { return l->cfg->name; }
const char *sb_reg_lease_route(const sb_reg_lease *l) { return l->route[0] ? l->route : NULL; }
const char *sb_reg_lease_fallback(const sb_reg_lease *l) { return l->fallback[0] ? l->fallback : NULL; }
uint64_t sb_reg_lease_version(const sb_reg_lease *l) { return l->inst->version; }
int32_t sb_reg_lease_n_ctx(const sb_reg_lease *l) { return l->inst->n_ctx; }

const char *sb_reg_state_name(sb_reg_state s) {
    switch (s) {
    case SB_REG_UNLOADED: return "unloaded";
    case SB_REG_LOADING: return "loading";
    case SB_REG_LOADED: return "loaded";
    case SB_REG_FAILED: return "failed";
    }
    return "unknown";
}

int32_t sb_registry_list(sb_registry *reg, sb_reg_info *out, int32_t cap) {
    pthread_mutex_lock(&reg->mu);
    int32_t n = (int32_t)reg->n_entries;
    for (int32_t k = 0; k < n && k < cap; k++) {
        const entry *e = reg->entries[k];
        const inst *i = e->cur;
        sb_reg_info *o = &out[k];
        memset(o, 0, sizeof *o);
        snprintf(o->name, sizeof o->name, "%s", e->cfg->name);
        snprintf(o->path, sizeof o->path, "%s", e->cfg->path);
        o->state = i ? i->state : e->failed ? SB_REG_FAILED : SB_REG_UNLOADED;
        o->version = i && i->state == SB_REG_LOADED ? i->version : e->version; /* what serves now */
        o->pinned = e->cfg->pinned;
        o->last_used = e->last_used;
        int64_t ka = e->cfg->has_keep_alive ? e->cfg->keep_alive_ms : reg->p.keep_alive_ms;
        o->keep_alive_s = ka < 0 ? -1 : (double)ka / 1e3;
        snprintf(o->error, sizeof o->error, "%s", e->error);
        if (i && i->state == SB_REG_LOADED) {
            sb_engine_get_stats(i->engine, &o->engine);
            o->memory = i->mem;
            o->running = o->engine.running;
            o->waiting = o->engine.waiting;
            o->leases = i->refs;
            o->keep_alive_s = i->keep_alive_ms < 0 ? -1 : (double)i->keep_alive_ms / 1e3;
        }
    }
    pthread_mutex_unlock(&reg->mu);
    return n;
}

int32_t sb_registry_names(sb_registry *reg, char *out, size_t cap) {
    pthread_mutex_lock(&reg->mu);
    const sb_regfile *rf = reg->snap->rf;
    int32_t count = 0;
    size_t n = 0;
    for (size_t k = 0; k < rf->n_models + rf->n_routes; k++) {
        const sb_regfile_model *m = k < rf->n_models ? &rf->models[k] : NULL;
        size_t n_names = m ? 1 + m->n_aliases : 1;
        for (size_t a = 0; a < n_names; a++) {
            const char *name = !m ? rf->routes[k - rf->n_models].name : a == 0 ? m->name : m->aliases[a - 1];
            size_t len = strlen(name) + 1;
            if (n + len <= cap) {
                memcpy(out + n, name, len);
                n += len;
                count++;
            }
        }
    }
    pthread_mutex_unlock(&reg->mu);
    return count;
}

sb_status sb_registry_load(sb_registry *reg, const char *name, sb_error *err) {
    sb_reg_lease *l;
    sb_status st = sb_registry_acquire(reg, name, NULL, &l, err);
    if (st == SB_OK && sb_reg_lease_fallback(l)) {
        st = sb_fail(err, SB_ERR_MODEL_NOT_FOUND, "cannot load '%.200s': %s", name, sb_reg_lease_fallback(l));
    }
    sb_reg_lease_release(l, SB_REG_KEEP_ALIVE_UNCHANGED);
    return st;
}

sb_status sb_registry_unload(sb_registry *reg, const char *name, sb_error *err) {
    pthread_mutex_lock(&reg->mu);
    const char *route;
    entry *e = resolve(reg, name, NULL, &route);
    sb_status st = SB_OK;
    if (!e || route)
        st = sb_fail(err, SB_ERR_MODEL_NOT_FOUND, "no model named '%.200s' (routes cannot be unloaded)", name);
    else if (e->cur && e->cur->state == SB_REG_LOADED) {
        reg_log(reg, "unloading '%s' (asked)", e->cfg->name);
        inst_retire(reg, e->cur);
        reap(reg);
    }
    pthread_mutex_unlock(&reg->mu);
    return st;
}

void sb_registry_totals(sb_registry *reg, sb_reg_totals *out) {
    pthread_mutex_lock(&reg->mu);
    *out = reg->totals;
    out->budget = reg->budget;
    out->used = reg->used;
    pthread_mutex_unlock(&reg->mu);
}

const sb_regfile *sb_registry_file_acquire(sb_registry *reg) {
    pthread_mutex_lock(&reg->mu);
    snap *s = snap_hold(reg->snap);
    pthread_mutex_unlock(&reg->mu);
    return s->rf;
}

void sb_registry_file_release(sb_registry *reg, const sb_regfile *rf) {
    pthread_mutex_lock(&reg->mu);
    for (snap *s = reg->snaps; s; s = s->next)
        if (s->rf == rf) {
            snap_drop(reg, s);
            break;
        }
    pthread_mutex_unlock(&reg->mu);
}
