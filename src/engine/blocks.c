/*
 * blocks.c - see blocks.h.
 *
 * Per block: a reference count, and for published blocks the hash they are
 * filed under. Free blocks (unreferenced, unpublished) sit on a stack;
 * unreferenced published blocks sit on an LRU list (doubly linked through
 * prev/next arrays) so that reclaiming one is O(1). The hash index is open
 * addressing with tombstones, sized to twice the block count.
 */
#include "engine/blocks.h"

#include "base/base.h"

#define NO_BLOCK (-1)
#define TOMBSTONE (-2)

struct sb_blocks {
    int32_t n_blocks, n_held;
    int32_t *refs;
    uint64_t *hash;       /* valid when published[b] */
    bool *published;
    int32_t *free_stack, n_free;
    int32_t *prev, *next; /* LRU of unreferenced published blocks */
    int32_t lru_head, lru_tail;
    int32_t *index;       /* hash slots: block id, NO_BLOCK or TOMBSTONE */
    int32_t index_cap;    /* power of two, at least twice n_blocks */
    int32_t n_tombs;      /* rebuilt before they can fill the free slots */
};

sb_status sb_blocks_create(int32_t n_blocks, sb_blocks **out, sb_error *err) {
    *out = NULL;
    sb_blocks *b = sb_calloc(1, sizeof(*b));
    if (!b)
        return sb_fail(err, SB_ERR_NOMEM, "out of memory");
    b->n_blocks = n_blocks;
    b->index_cap = 16;
    while (b->index_cap < 2 * n_blocks)
        b->index_cap *= 2;
    b->refs = sb_calloc((size_t)n_blocks, sizeof(int32_t));
    b->hash = sb_calloc((size_t)n_blocks, sizeof(uint64_t));
    b->published = sb_calloc((size_t)n_blocks, sizeof(bool));
    b->free_stack = sb_calloc((size_t)n_blocks, sizeof(int32_t));
    b->prev = sb_calloc((size_t)n_blocks, sizeof(int32_t));
    b->next = sb_calloc((size_t)n_blocks, sizeof(int32_t));
    b->index = sb_calloc((size_t)b->index_cap, sizeof(int32_t));
    if (!b->refs || !b->hash || !b->published || !b->free_stack || !b->prev || !b->next || !b->index) {
        sb_blocks_free(b);
        return sb_fail(err, SB_ERR_NOMEM, "out of memory for %d KV blocks", n_blocks);
    }
    for (int32_t i = 0; i < n_blocks; i++)
        b->free_stack[b->n_free++] = n_blocks - 1 - i; /* block 0 first */
    for (int32_t i = 0; i < b->index_cap; i++)
        b->index[i] = NO_BLOCK;
    b->lru_head = b->lru_tail = NO_BLOCK;
    *out = b;
    return SB_OK;
}

void sb_blocks_free(sb_blocks *b) {
    if (!b)
        return;
    sb_free(b->refs);
    sb_free(b->hash);
    sb_free(b->published);
    sb_free(b->free_stack);
    sb_free(b->prev);
    sb_free(b->next);
    sb_free(b->index);
    sb_free(b);
}

static void lru_remove(sb_blocks *b, int32_t blk) {
    if (b->prev[blk] != NO_BLOCK)
        b->next[b->prev[blk]] = b->next[blk];
    else
        b->lru_head = b->next[blk];
    if (b->next[blk] != NO_BLOCK)
        b->prev[b->next[blk]] = b->prev[blk];
    else
        b->lru_tail = b->prev[blk];
}

static void lru_push(sb_blocks *b, int32_t blk) {
    b->prev[blk] = b->lru_tail;
    b->next[blk] = NO_BLOCK;
    if (b->lru_tail != NO_BLOCK)
        b->next[b->lru_tail] = blk;
    else
        b->lru_head = blk;
    b->lru_tail = blk;
}

/* Slot of `hash` in the index, or of the first usable slot if absent. */
static int32_t index_find(const sb_blocks *b, uint64_t hash, bool for_insert) {
    int32_t mask = b->index_cap - 1, tomb = NO_BLOCK;
    for (int32_t i = (int32_t)(hash & (uint64_t)mask);; i = (i + 1) & mask) {
        int32_t blk = b->index[i];
        if (blk == NO_BLOCK)
            return for_insert && tomb != NO_BLOCK ? tomb : i;
        if (blk == TOMBSTONE) {
            if (tomb == NO_BLOCK)
                tomb = i;
        } else if (b->hash[blk] == hash) {
            return i;
        }
    }
}

/* Re-files every published block, dropping the tombstones. */
static void index_rebuild(sb_blocks *b) {
    for (int32_t i = 0; i < b->index_cap; i++)
        b->index[i] = NO_BLOCK;
    for (int32_t blk = 0; blk < b->n_blocks; blk++)
        if (b->published[blk])
            b->index[index_find(b, b->hash[blk], true)] = blk;
    b->n_tombs = 0;
}

static void unpublish(sb_blocks *b, int32_t blk) {
    int32_t slot = index_find(b, b->hash[blk], false);
    b->published[blk] = false;
    if (b->index[slot] == blk) {
        b->index[slot] = TOMBSTONE;
        if (++b->n_tombs > b->index_cap / 4)
            index_rebuild(b);
    }
}

int32_t sb_blocks_alloc(sb_blocks *b) {
    int32_t blk;
    if (b->n_free > 0) {
        blk = b->free_stack[--b->n_free];
    } else if (b->lru_head != NO_BLOCK) {
        blk = b->lru_head;
        lru_remove(b, blk);
        unpublish(b, blk);
    } else {
        return NO_BLOCK;
    }
    b->refs[blk] = 1;
    b->n_held++;
    return blk;
}

void sb_blocks_release(sb_blocks *b, int32_t blk) {
    if (--b->refs[blk] > 0)
        return;
    b->n_held--;
    if (b->published[blk])
        lru_push(b, blk);
    else
        b->free_stack[b->n_free++] = blk;
}

int32_t sb_blocks_lookup(sb_blocks *b, uint64_t hash) {
    int32_t blk = b->index[index_find(b, hash, false)];
    if (blk < 0)
        return NO_BLOCK;
    if (b->refs[blk]++ == 0) {
        lru_remove(b, blk);
        b->n_held++;
    }
    return blk;
}

void sb_blocks_publish(sb_blocks *b, int32_t blk, uint64_t hash) {
    if (b->published[blk] || b->index[index_find(b, hash, false)] >= 0)
        return;
    b->hash[blk] = hash;
    b->published[blk] = true;
    b->index[index_find(b, hash, true)] = blk;
}

uint64_t sb_blocks_hash(uint64_t prev, const int32_t *tokens, int32_t n) {
    uint64_t h = prev ^ 0x9e3779b97f4a7c15ull;
    for (int32_t i = 0; i < n; i++) {
        h ^= (uint64_t)(uint32_t)tokens[i];
        h *= 0x100000001b3ull;
        h ^= h >> 29;
    }
    return h ? h : 1; /* 0 means "no prefix" */
}

int32_t sb_blocks_n_total(const sb_blocks *b) { return b->n_blocks; }
int32_t sb_blocks_n_held(const sb_blocks *b) { return b->n_held; }
