/*
 * heap.h - the binary heap the tokenizers queue their merge candidates in
 * (SentencePiece bigrams, BPE pairs), written once for both element types.
 *
 * SB__HEAP(prefix, T, first) defines, in the including file:
 *   bool prefix_push(T **items, size_t *n, size_t *cap, T item)
 *       adds item, growing the array (doubling); false only when out of memory;
 *   T prefix_pop(T *items, size_t *n)
 *       removes and returns the element that comes first (*n > 0);
 * where first(const T *a, const T *b) says whether a leaves before b. The
 * callers' orders are total (ties broken by position), so which candidate
 * pops next never depends on insertion order.
 */
#ifndef SB_TOKENIZER_HEAP_H
#define SB_TOKENIZER_HEAP_H

#include <stdbool.h>
#include <stddef.h>

#include "base/base.h"

#define SB__HEAP(prefix, T, first)                                                                               \
    static bool prefix##_push(T **items, size_t *n, size_t *cap, T item) {                                       \
        if (*n == *cap) {                                                                                        \
            size_t cap2 = *cap ? 2 * *cap : 16;                                                                  \
            T *grown = sb_realloc(*items, cap2 * sizeof(T));                                                     \
            if (!grown)                                                                                          \
                return false;                                                                                    \
            *items = grown;                                                                                      \
            *cap = cap2;                                                                                         \
        }                                                                                                        \
        T *h = *items;                                                                                           \
        size_t i = (*n)++;                                                                                       \
        while (i > 0 && first(&item, &h[(i - 1) / 2])) {                                                         \
            h[i] = h[(i - 1) / 2];                                                                               \
            i = (i - 1) / 2;                                                                                     \
        }                                                                                                        \
        h[i] = item;                                                                                             \
        return true;                                                                                             \
    }                                                                                                            \
    static T prefix##_pop(T *h, size_t *n) {                                                                     \
        T top = h[0], last = h[--*n];                                                                            \
        size_t i = 0;                                                                                            \
        for (;;) {                                                                                               \
            size_t c = 2 * i + 1;                                                                                \
            if (c >= *n)                                                                                         \
                break;                                                                                           \
            if (c + 1 < *n && first(&h[c + 1], &h[c]))                                                           \
                c++;                                                                                             \
            if (!first(&h[c], &last))                                                                            \
                break;                                                                                           \
            h[i] = h[c];                                                                                         \
            i = c;                                                                                               \
        }                                                                                                        \
        h[i] = last;                                                                                             \
        return top;                                                                                              \
    }

#endif
