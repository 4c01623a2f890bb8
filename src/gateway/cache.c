/*
 * cache.c - the response cache's keys and its in-memory backend (see
 * cache.h); the Redis backend is cache_redis.c.
 *
 * Memory: a chained hash table on the key's first 8 bytes (the key is a
 * digest, so its bytes are already uniform) and one doubly-linked list in
 * use order, under one mutex held for a lookup and a copy. An entry's cost
 * is its value, its key and its bookkeeping, so the bound holds for many
 * small entries too.
 */
#include "gateway/cache.h"

#include <openssl/evp.h>
#include <pthread.h>
#include <string.h>
#include <time.h>

#include "base/base.h"
#include "gateway/cache_redis.h"

/* ---- keys ---------------------------------------------------------------- */

void sb_gw_hasher_init(sb_gw_hasher *h) {
    h->ctx = EVP_MD_CTX_new();
    h->failed = !h->ctx || EVP_DigestInit_ex(h->ctx, EVP_sha256(), NULL) != 1;
}

void sb_gw_hasher_update(sb_gw_hasher *h, const void *data, size_t len) {
    if (!h->failed && len && EVP_DigestUpdate(h->ctx, data, len) != 1)
        h->failed = true;
}

void sb_gw_hasher_field(sb_gw_hasher *h, const void *data, size_t len) {
    uint64_t n = len;
    sb_gw_hasher_update(h, &n, sizeof n);
    sb_gw_hasher_update(h, data, len);
}

bool sb_gw_hasher_final(sb_gw_hasher *h, sb_gw_cache_key *out) {
    unsigned n = 0;
    bool ok = !h->failed && EVP_DigestFinal_ex(h->ctx, out->b, &n) == 1 && n == sizeof out->b;
    EVP_MD_CTX_free(h->ctx);
    h->ctx = NULL;
    return ok;
}

/* ---- memory backend ---------------------------------------------------- */

typedef struct entry {
    struct entry *chain;       /* next in the hash bucket */
    struct entry *prev, *next; /* use order: head most recent */
    sb_gw_cache_key key;
    int64_t expires_ms;        /* monotonic */
    size_t len;
    uint8_t value[];
} entry;

struct sb_gw_cache {
    sb_gw_cache_params p;
    sb_redis *redis; /* NULL: the memory backend */
    pthread_mutex_t mu;
    entry **buckets;
    size_t n_buckets; /* a power of two */
    entry *head, *tail;
    sb_gw_cache_stats stats;
};

static int64_t now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static size_t entry_cost(size_t len) { return sizeof(entry) + len + sizeof(entry *); }

static entry **bucket_of(sb_gw_cache *c, const sb_gw_cache_key *key) {
    uint64_t h;
    memcpy(&h, key->b, sizeof h);
    return &c->buckets[h & (c->n_buckets - 1)];
}

static void lru_unlink(sb_gw_cache *c, entry *e) {
    if (e->prev)
        e->prev->next = e->next;
    else
        c->head = e->next;
    if (e->next)
        e->next->prev = e->prev;
    else
        c->tail = e->prev;
    e->prev = e->next = NULL;
}

static void lru_push_front(sb_gw_cache *c, entry *e) {
    e->prev = NULL;
    e->next = c->head;
    if (c->head)
        c->head->prev = e;
    c->head = e;
    if (!c->tail)
        c->tail = e;
}

/* Unlinks e from its bucket and the list and frees it. */
static void remove_entry(sb_gw_cache *c, entry *e) {
    for (entry **pp = bucket_of(c, &e->key); *pp; pp = &(*pp)->chain)
        if (*pp == e) {
            *pp = e->chain;
            break;
        }
    lru_unlink(c, e);
    c->stats.entries--;
    c->stats.bytes -= entry_cost(e->len);
    sb_free(e);
}

static entry *find(sb_gw_cache *c, const sb_gw_cache_key *key) {
    for (entry *e = *bucket_of(c, key); e; e = e->chain)
        if (memcmp(e->key.b, key->b, sizeof key->b) == 0)
            return e;
    return NULL;
}

/* Doubles the table when entries outnumber buckets; a failed allocation
 * keeps the old table (longer chains, still correct). */
static void maybe_grow(sb_gw_cache *c) {
    if (c->stats.entries < c->n_buckets)
        return;
    size_t n = c->n_buckets * 2;
    entry **b = sb_calloc(n, sizeof *b);
    if (!b)
        return;
    for (size_t i = 0; i < c->n_buckets; i++)
        for (entry *e = c->buckets[i], *next; e; e = next) {
            next = e->chain;
            uint64_t h;
            memcpy(&h, e->key.b, sizeof h);
            e->chain = b[h & (n - 1)];
            b[h & (n - 1)] = e;
        }
    sb_free(c->buckets);
    c->buckets = b;
    c->n_buckets = n;
}

static bool mem_get(sb_gw_cache *c, const sb_gw_cache_key *key, void **value, size_t *len) {
    bool hit = false;
    pthread_mutex_lock(&c->mu);
    entry *e = find(c, key);
    if (e && e->expires_ms <= now_ms()) {
        remove_entry(c, e);
        c->stats.expired++;
        e = NULL;
    }
    if (e && (*value = sb_malloc(e->len ? e->len : 1))) {
        memcpy(*value, e->value, e->len);
        *len = e->len;
        lru_unlink(c, e);
        lru_push_front(c, e);
        hit = true;
    }
    pthread_mutex_unlock(&c->mu);
    return hit;
}

static void mem_put(sb_gw_cache *c, const sb_gw_cache_key *key, const void *value, size_t len) {
    if (entry_cost(len) > c->p.max_bytes)
        return;
    entry *n = sb_malloc(sizeof *n + len);
    if (!n)
        return;
    memset(n, 0, sizeof *n);
    n->key = *key;
    n->len = len;
    n->expires_ms = now_ms() + c->p.ttl_ms;
    memcpy(n->value, value, len);
    pthread_mutex_lock(&c->mu);
    entry *old = find(c, key);
    if (old)
        remove_entry(c, old);
    while (c->tail && c->stats.bytes + entry_cost(len) > c->p.max_bytes) {
        remove_entry(c, c->tail);
        c->stats.evictions++;
    }
    entry **b = bucket_of(c, key);
    n->chain = *b;
    *b = n;
    lru_push_front(c, n);
    c->stats.entries++;
    c->stats.bytes += entry_cost(len);
    maybe_grow(c);
    pthread_mutex_unlock(&c->mu);
}

/* ---- the cache --------------------------------------------------------- */

sb_gw_cache_params sb_gw_cache_default_params(void) {
    return (sb_gw_cache_params){.backend = "memory", .max_bytes = SB_GW_CACHE_DEFAULT_BYTES,
                                .ttl_ms = SB_GW_CACHE_DEFAULT_TTL_MS, .timeout_ms = SB_GW_CACHE_REDIS_TIMEOUT_MS};
}

sb_status sb_gw_cache_create(const sb_gw_cache_params *p, sb_gw_cache **out, sb_error *err) {
    *out = NULL;
    const char *backend = p->backend ? p->backend : "memory";
    bool redis = strncmp(backend, "redis://", 8) == 0;
    if (!redis && strcmp(backend, "memory") != 0)
        return sb_fail(err, SB_ERR_INVALID_ARG, "cache: '%s' is not a cache backend (off, memory, redis://host:port)",
                       backend);
    if (p->ttl_ms <= 0)
        return sb_fail(err, SB_ERR_INVALID_ARG, "cache: the TTL must be positive");
    sb_gw_cache *c = sb_calloc(1, sizeof *c);
    if (!c || !(c->buckets = sb_calloc(64, sizeof *c->buckets))) {
        sb_free(c);
        return sb_fail(err, SB_ERR_NOMEM, "cache: out of memory");
    }
    c->n_buckets = 64;
    c->p = *p;
    c->p.backend = NULL; /* not kept: the caller's string */
    if (c->p.timeout_ms <= 0)
        c->p.timeout_ms = SB_GW_CACHE_REDIS_TIMEOUT_MS;
    pthread_mutex_init(&c->mu, NULL);
    if (redis) {
        sb_status st = sb_redis_create(backend, c->p.timeout_ms, &c->redis, err);
        if (st != SB_OK) {
            sb_gw_cache_free(c);
            return st;
        }
    }
    *out = c;
    return SB_OK;
}

void sb_gw_cache_free(sb_gw_cache *c) {
    if (!c)
        return;
    while (c->head)
        remove_entry(c, c->head);
    sb_redis_free(c->redis);
    pthread_mutex_destroy(&c->mu);
    sb_free(c->buckets);
    sb_free(c);
}

bool sb_gw_cache_get(sb_gw_cache *c, const sb_gw_cache_key *key, void **value, size_t *len) {
    *value = NULL;
    *len = 0;
    if (!c->redis)
        return mem_get(c, key, value, len);
    bool failed = false;
    bool hit = sb_gw__cache_redis_get(c->redis, key, value, len, &failed);
    if (failed) {
        pthread_mutex_lock(&c->mu);
        c->stats.backend_errors++;
        pthread_mutex_unlock(&c->mu);
    }
    return hit;
}

void sb_gw_cache_put(sb_gw_cache *c, const sb_gw_cache_key *key, const void *value, size_t len) {
    if (!c->redis) {
        mem_put(c, key, value, len);
        return;
    }
    if (!sb_gw__cache_redis_put(c->redis, key, value, len, c->p.ttl_ms)) {
        pthread_mutex_lock(&c->mu);
        c->stats.backend_errors++;
        pthread_mutex_unlock(&c->mu);
    }
}

bool sb_gw_cache_remote(const sb_gw_cache *c) { return c->redis != NULL; }

void sb_gw_cache_stats_get(sb_gw_cache *c, sb_gw_cache_stats *out) {
    pthread_mutex_lock(&c->mu);
    *out = c->stats;
    pthread_mutex_unlock(&c->mu);
}
