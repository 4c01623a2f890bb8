/*
 * cmd_keys.c - `switchboard keys`: the API keys of a state directory
 * (src/gateway/keys.h), the same one `serve --state-dir` reads; a running
 * server picks up every change within a second.
 *
 *   keys create --name N [--tier T] [--rps R] [--rpm R] [--tpm T] [--models a,b]
 *               [--expires DATE|+DURATION] [--admin] [--tiers SPEC]
 *   keys list
 *   keys disable|enable|delete NAME
 *
 * create prints the key's settings, then the raw key alone on the last
 * line: the only time it is ever shown (only its hash is stored).
 */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "base/base.h"
#include "cli/cli.h"
#include "gateway/gateway.h"
#include "gateway/keys.h"
#include "gateway/limits.h"
#include "gateway/tiers.h"

static const char keys_usage[] =
    "usage: switchboard keys create --name NAME [--tier TIER] [--rps N] [--rpm N] [--tpm N] [--models a,b]\n"
    "                               [--expires YYYY-MM-DD|YYYY-MM-DDTHH:MM:SSZ|+N(s|m|h|d)] [--admin]\n"
    "                               [--tiers SPEC (the server's --tiers; default paid:10,free:0,batch:-10)]\n"
    "       switchboard keys list\n"
    "       switchboard keys disable|enable|delete NAME\n"
    "  every form takes --state-dir DIR (default: the one serve uses, $XDG_STATE_HOME/switchboard,\n"
    "  else ~/.local/state/switchboard). Limits are per key, 0 (the default) means none. An --admin\n"
    "  key may also use /admin/... (and /metrics with serve --metrics-auth). The raw key is printed once,\n"
    "  alone on the last line of create's output.\n";

static void when(int64_t t, char *out, size_t cap) {
    if (!t) {
        snprintf(out, cap, "never");
        return;
    }
    time_t tt = (time_t)t;
    struct tm tm;
    gmtime_r(&tt, &tm);
    strftime(out, cap, "%Y-%m-%dT%H:%M:%SZ", &tm);
}

static int create(sb_gw_keys *ks, int argc, char **argv) {
    sb_gw_key k = {0};
    const char *name = NULL, *tier = NULL, *models = "", *expires = NULL, *tiers_spec = NULL, *v;
    for (int i = 0; i < argc; i++) {
        if (sb_cli_end_of_options(argc, argv, i, NULL))
            break;
        if (sb_cli_opt(argc, argv, &i, "--name", &name) || sb_cli_opt(argc, argv, &i, "--tier", &tier) ||
            sb_cli_opt(argc, argv, &i, "--models", &models) || sb_cli_opt(argc, argv, &i, "--expires", &expires) ||
            sb_cli_opt(argc, argv, &i, "--tiers", &tiers_spec))
            continue;
        if (sb_cli_opt(argc, argv, &i, "--rps", &v))
            k.rps = sb_cli_int("--rps", v, 0, SB_GW_LIMIT_MAX);
        else if (sb_cli_opt(argc, argv, &i, "--rpm", &v))
            k.rpm = sb_cli_int("--rpm", v, 0, SB_GW_LIMIT_MAX);
        else if (sb_cli_opt(argc, argv, &i, "--tpm", &v))
            k.tpm = sb_cli_int("--tpm", v, 0, SB_GW_LIMIT_MAX);
        else if (strcmp(argv[i], "--admin") == 0)
            k.admin = true;
        else {
            fprintf(stderr, "switchboard keys create: unknown option '%s'\n%s", argv[i], keys_usage);
            return SB_EXIT_USAGE;
        }
    }
    if (!name) {
        fprintf(stderr, "switchboard keys create: --name is required\n%s", keys_usage);
        return SB_EXIT_USAGE;
    }
    sb_gw_tiers tiers;
    sb_error err;
    if (sb_gw_tiers_parse(tiers_spec, &tiers, &err) != SB_OK)
        return sb_cli_error("%s", err.msg);
    if (!tier)
        tier = tiers.t[tiers.def].name;
    if (!sb_gw_tiers_find(&tiers, tier)) {
        char names[400];
        sb_gw_tiers_names(&tiers, names, sizeof names);
        return sb_cli_error("keys create: unknown tier '%s' (tiers: %s; a server started with other --tiers: "
                            "give the same --tiers here)",
                            tier, names);
    }
    if (strlen(models) >= sizeof k.models)
        return sb_cli_error("keys create: --models is longer than %zu bytes", sizeof k.models - 1);
    for (const char *c = models; *c; c++)
        if (*c == ' ' || (unsigned char)*c < 0x20 || (c[0] == ',' && (c[1] == ',' || c[1] == '\0' || c == models)))
            return sb_cli_error("keys create: --models '%s' is not a comma-separated list of model names", models);
    if (expires && !sb_gw_parse_expiry(expires, (int64_t)time(NULL), &k.expires))
        return sb_cli_error("keys create: --expires '%s' is not YYYY-MM-DD, YYYY-MM-DDTHH:MM:SSZ or +N with s, m, h "
                            "or d",
                            expires);
    if (strlen(name) >= sizeof k.name)
        return sb_cli_error("keys create: --name is longer than %zu characters", sizeof k.name - 1);
    snprintf(k.name, sizeof k.name, "%s", name);
    snprintf(k.tier, sizeof k.tier, "%s", tier);
    snprintf(k.models, sizeof k.models, "%s", models);
    char raw[SB_GW_KEY_LEN + 1];
    if (sb_gw_keys_create(ks, &k, raw, sizeof raw, &err) != SB_OK)
        return sb_cli_error("%s", err.msg);
    char exp[32];
    when(k.expires, exp, sizeof exp);
    printf("created key '%s': tier %s, %" PRId64 " rps, %" PRId64 " rpm, %" PRId64 " tpm (0: no limit), models %s, "
           "expires %s%s\n",
           k.name, k.tier, k.rps, k.rpm, k.tpm, k.models[0] ? k.models : "all", exp, k.admin ? ", admin" : "");
    printf("this key is shown once; only its hash is stored:\n%s\n", raw);
    memset(raw, 0, sizeof raw);
    return 0;
}

static int list(sb_gw_keys *ks) {
    sb_gw_key *keys;
    size_t n;
    sb_error err;
    if (sb_gw_keys_list(ks, &keys, &n, &err) != SB_OK)
        return sb_cli_error("%s", err.msg);
    printf("%-24s %-8s %8s %8s %10s %-8s %-7s %-20s %-20s %s\n", "NAME", "TIER", "RPS", "RPM", "TPM", "STATE", "ADMIN",
           "CREATED", "EXPIRES", "MODELS");
    int64_t now = (int64_t)time(NULL);
    for (size_t i = 0; i < n; i++) {
        const sb_gw_key *k = &keys[i];
        char created[32], exp[32];
        when(k->created, created, sizeof created);
        when(k->expires, exp, sizeof exp);
        const char *state = !k->enabled ? "disabled" : k->expires && now >= k->expires ? "expired" : "enabled";
        printf("%-24s %-8s %8" PRId64 " %8" PRId64 " %10" PRId64 " %-8s %-7s %-20s %-20s %s\n", k->name, k->tier,
               k->rps, k->rpm, k->tpm, state, k->admin ? "yes" : "no", created, exp,
               k->models[0] ? k->models : "all");
    }
    sb_free(keys);
    return 0;
}

int sb_cmd_keys(int argc, char **argv) {
    /* --state-dir may come anywhere; the action is the first operand. */
    const char *state_dir = NULL, *action = NULL;
    char *rest[64];
    int n_rest = 0;
    for (int i = 1; i < argc; i++) {
        if (sb_cli_opt(argc, argv, &i, "--state-dir", &state_dir))
            continue;
        if (!action && argv[i][0] != '-')
            action = argv[i];
        else if (n_rest < (int)SB_ARRAY_LEN(rest))
            rest[n_rest++] = argv[i];
        else
            return sb_cli_error("keys: too many arguments");
    }
    bool named = action && (strcmp(action, "disable") == 0 || strcmp(action, "enable") == 0 ||
                            strcmp(action, "delete") == 0);
    if (!action || !(named || strcmp(action, "create") == 0 || strcmp(action, "list") == 0)) {
        fprintf(stderr, "switchboard keys: %s%s%s\n%s", action ? "unknown action '" : "give an action",
                action ? action : "", action ? "'" : "", keys_usage);
        return SB_EXIT_USAGE;
    }
    if ((named && (n_rest != 1 || rest[0][0] == '-')) || (strcmp(action, "list") == 0 && n_rest)) {
        fprintf(stderr, "switchboard keys %s: %s\n%s", action, named ? "give one key NAME" : "takes no arguments",
                keys_usage);
        return SB_EXIT_USAGE;
    }
    if (!state_dir)
        state_dir = sb_gw_default_state_dir();
    sb_gw_keys *ks;
    sb_error err;
    if (sb_gw_keys_open(state_dir, false, NULL, NULL, &ks, &err) != SB_OK)
        return sb_cli_error("%s", err.msg);
    int rc = 0;
    if (strcmp(action, "create") == 0)
        rc = create(ks, n_rest, rest);
    else if (strcmp(action, "list") == 0)
        rc = list(ks);
    else {
        sb_status st = strcmp(action, "delete") == 0 ? sb_gw_keys_delete(ks, rest[0], &err)
                                                     : sb_gw_keys_set_enabled(ks, rest[0], action[0] == 'e', &err);
        if (st != SB_OK)
            rc = sb_cli_error("%s", err.msg);
        else
            printf("key '%s' %s\n", rest[0], strcmp(action, "delete") == 0 ? "deleted" : action[0] == 'e' ? "enabled" : "disabled");
    }
    sb_gw_keys_close(ks);
    return rc;
}
