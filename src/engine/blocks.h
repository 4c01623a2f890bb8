/*
 * blocks.h - the KV block allocator with prefix caching.
 *
 * Blocks are reference-counted: a sequence holds one reference to each
 * block of its block table. A block filled completely with a known token
 * prefix can be published under the hash of that prefix (the hash chains
 * over all earlier blocks, so equal hashes mean equal prefixes); a later
 * sequence whose prompt starts with the same tokens takes a reference to it
 * instead of recomputing. Published blocks nobody holds stay cached and are
 * reclaimed least-recently-released first when the free list runs dry.
 */
#ifndef SB_BLOCKS_H
#define SB_BLOCKS_H

#include <stdbool.h>
#include <stdint.h>

#include "switchboard.h"

typedef struct sb_blocks sb_blocks;

sb_status sb_blocks_create(int32_t n_blocks, sb_blocks **out, sb_error *err);
void sb_blocks_free(sb_blocks *b);

/* A block for a new sequence position (one reference), or -1 if every block
 * is held by some sequence. May reclaim a cached block. */
int32_t sb_blocks_alloc(sb_blocks *b);
/* Drops one reference. */
void sb_blocks_release(sb_blocks *b, int32_t block);
/* The cached block published under `hash`, with a new reference, or -1. */
int32_t sb_blocks_lookup(sb_blocks *b, uint64_t hash);
/* Publishes a full block under the hash of the prefix it ends (ignored if
 * another block already holds that hash). */
void sb_blocks_publish(sb_blocks *b, int32_t block, uint64_t hash);

/* The hash of the prefix ending with a block of n tokens, given the hash of
 * the prefix before it (0 for the first block). */
uint64_t sb_blocks_hash(uint64_t prev, const int32_t *tokens, int32_t n);

int32_t sb_blocks_n_total(const sb_blocks *b);
int32_t sb_blocks_n_held(const sb_blocks *b); /* blocks some sequence references */

#endif
