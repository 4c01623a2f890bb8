/*
 * server-impl.h - the server object shared by the files of src/server/.
 *
 * Locking: `engine_lock` guards the `engine` pointer, not the engine (which
 * is thread-safe): submit, cancel and stats hold it for reading, and
 * sb_srv_stop takes it for writing to free the engine while no call is in
 * flight. `model` and `chat` are written once by sb_srv_load before `ready`
 * becomes true and stay valid until every connection thread has ended.
 */
#ifndef SB_SRV_SERVER_IMPL_H
#define SB_SRV_SERVER_IMPL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "engine/engine.h"
#include "model/chat.h"
#include "sampling/grammar.h"
#include "server/metrics.h"
#include "server/server.h"

struct MHD_Daemon;

struct sb_srv {
    sb_srv_params p;      /* as given (strings borrowed); host defaulted */
    char *id;             /* the model's public name (owned) */
    struct MHD_Daemon *daemon;
    uint16_t port;
    int64_t created;      /* unix time the server started: the model object's "created" */

    atomic_bool ready;    /* model loaded and engine running */
    sb_model_t *model;
    sb_chat *chat;
    sb_grammar_vocab *gvocab; /* the vocabulary's token trie and grammar cache (structured output) */
    int32_t n_embd;
    pthread_rwlock_t engine_lock;
    sb_engine *engine;    /* NULL before load and after stop */

    sb_srv_metrics metrics;
    atomic_uint_fast64_t counter; /* ids and default seeds */
    uint64_t salt;                /* mixed into ids and default seeds */
};

/* A fresh pseudo-random 64-bit number (distinct per call). */
uint64_t sb__srv_random(sb_srv *srv);
/* Logs one printf-style line through params.log. */
void sb__srv_log(sb_srv *srv, const char *fmt, ...) SB_PRINTF(2, 3);

#endif
