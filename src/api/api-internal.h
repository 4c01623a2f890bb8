/*
 * api-internal.h - what the server and the CLI reach below the public API
 * (include/switchboard.h); for them only, not installed.
 *
 * The server builds its prompts itself (a chat with tools through the
 * model's template, the prompt library, the registry's system prompt and
 * defaults) and prices and caches answers by the serving entry's
 * configuration: those live in the registry's lease and file, which the
 * public API keeps opaque. This header is the server's one door to them
 * (src/server includes no registry header itself): from a held model's
 * lease the entry's configuration (sb_reg_lease_config: system prompt,
 * default parameters, prices, the file's identity for the response cache)
 * and its chat formatter (sb_reg_lease_chat: tools through the template);
 * from the registry its file (sb_registry_file_acquire: the prompt library,
 * with sb_prompt_lookup and sb_prompt_render). Everything else, routing,
 * generation, embeddings, grammars and administration included, goes
 * through switchboard.h.
 */
#ifndef SB_API_INTERNAL_H
#define SB_API_INTERNAL_H

#include "registry/prompts.h"
#include "registry/registry.h"
#include "switchboard.h"

/* The registry behind the handle (its file: routes, the prompt library). */
struct sb_registry *sb__switchboard_registry(sb_switchboard_t *sb);
/* The lease a held model is: its chat formatter and registry entry; valid
 * while the held model is. */
const struct sb_reg_lease *sb__held_lease(const sb_held_t *h);

#endif
