/*
 * cmd_usage.c - `switchboard usage`: the usage, cost and feedback a server
 * recorded in STATE_DIR/usage.db (src/gateway/usage.h), as a table grouped
 * by model (each A/B arm on its own line, with the route it served),
 * by key or by day. It reads the file while a server writes it (WAL).
 */
#include <stdio.h>
#include <string.h>

#include "base/base.h"
#include "cli/cli.h"
#include "gateway/usage.h"

static const char usage_usage[] =
    "usage: switchboard usage --state-dir DIR [--by model|key|day (model)] [--since YYYY-MM-DD]\n";

/* A mean, or "-" when there is nothing to average. */
static const char *mean(char *buf, size_t cap, double sum, int64_t n, const char *fmt) {
    if (n <= 0)
        return "-";
    snprintf(buf, cap, fmt, sum / (double)n);
    return buf;
}

int sb_cmd_usage(int argc, char **argv) {
    const char *dir = NULL, *by_name = "model", *since = NULL;
    for (int i = 1; i < argc; i++) {
        if (sb_cli_end_of_options(argc, argv, i, NULL))
            break;
        if (sb_cli_opt(argc, argv, &i, "--state-dir", &dir) || sb_cli_opt(argc, argv, &i, "--by", &by_name) ||
            sb_cli_opt(argc, argv, &i, "--since", &since))
            continue;
        fprintf(stderr, "switchboard usage: unknown option '%s'\n%s", argv[i], usage_usage);
        return SB_EXIT_USAGE;
    }
    sb_gw_usage_by by;
    if (!sb_gw_usage_by_parse(by_name, &by)) {
        fprintf(stderr, "switchboard usage: --by '%s' is not model, key or day\n", by_name);
        return SB_EXIT_USAGE;
    }
    if (since && !sb_gw_usage_day_valid(since)) {
        fprintf(stderr, "switchboard usage: --since '%s' is not a date YYYY-MM-DD\n", since);
        return SB_EXIT_USAGE;
    }
    if (!dir) {
        fprintf(stderr, "switchboard usage: give --state-dir DIR (the server's)\n%s", usage_usage);
        return SB_EXIT_USAGE;
    }
    sb_gw_usage *u;
    sb_gw_usage_row *rows;
    size_t n;
    sb_error err;
    if (sb_gw_usage_open(dir, &u, &err) != SB_OK)
        return sb_cli_error("%s", err.msg);
    sb_status st = sb_gw_usage_query(u, by, since, NULL, &rows, &n, &err);
    sb_gw_usage_close(u);
    if (st != SB_OK)
        return sb_cli_error("%s", err.msg);
    static const char *const heads[] = {[SB_GW_BY_MODEL] = "MODEL", [SB_GW_BY_KEY] = "KEY", [SB_GW_BY_DAY] = "DAY"};
    printf("%-24s %-16s %8s %10s %10s %10s %6s %6s %9s %9s %10s %7s %7s\n", heads[by], by == SB_GW_BY_MODEL ? "ROUTE" : "",
           "REQUESTS", "PROMPT", "COMPLETION", "CACHED", "HITS", "ERRORS", "LAT_MS", "TTFT_MS", "COST", "RATING",
           "RATINGS");
    for (size_t i = 0; i < n; i++) {
        const sb_gw_usage_row *r = &rows[i];
        char lat[32], ttft[32], rating[32];
        printf("%-24s %-16s %8lld %10lld %10lld %10lld %6lld %6lld %9s %9s %10.4f %7s %7lld\n",
               r->group[0] ? r->group : (by == SB_GW_BY_KEY ? "(anonymous)" : "-"), r->arm[0] ? r->arm : "-",
               (long long)r->requests, (long long)r->prompt, (long long)r->completion, (long long)r->cached,
               (long long)r->cache_hits, (long long)r->errors,
               mean(lat, sizeof lat, r->latency_ms_sum, r->latency_n, "%.1f"),
               mean(ttft, sizeof ttft, r->ttft_ms_sum, r->ttft_n, "%.1f"), r->cost,
               mean(rating, sizeof rating, r->rating_sum, r->rating_n, "%+.2f"), (long long)r->rating_n);
    }
    sb_free(rows);
    return 0;
}
