/*
 * api-internal.h - what the server and the CLI reach below the public API
 * (include/switchboard.h); for them only, not installed.
 *
 * The server builds its prompts itself (a chat with tools through the
 * model's template, the prompt library, the registry's system prompt and
 * defaults) and prices and caches answers by the serving entry's
 * configuration: those live in the registry's lease and file, which the
 * public API keeps opaque. Everything else goes through switchboard.h.
 */
#ifndef SB_API_INTERNAL_H
#define SB_API_INTERNAL_H

#include "switchboard.h"

struct sb_registry;
struct sb_reg_lease;

/* The registry behind the handle (its file: routes, the prompt library). */
struct sb_registry *sb__switchboard_registry(sb_switchboard_t *sb);
/* The lease a held model is: its chat formatter and registry entry; valid
 * while the held model is. */
const struct sb_reg_lease *sb__held_lease(const sb_held_t *h);

#endif
