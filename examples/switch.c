/*
 * switch.c - switching the default model by name, with the registry's
 * fallback serving names it does not know (when it names one). Every
 * answer says which model served it.
 *
 *   ./switch models.json stories tiny no-such-model
 */
#include <stdio.h>

#include <switchboard.h>

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s models.json|DIR NAME...\n", argv[0]);
        return 2;
    }
    sb_error err;
    sb_switchboard_t *sb;
    if (sb_switchboard_open(argv[1], NULL, &sb, &err) != SB_OK) {
        fprintf(stderr, "open: %s\n", err.msg);
        return 1;
    }
    sb_sampler_params greedy = sb_sampler_default_params();
    greedy.temperature = 0;
    sb_infer_params p = sb_infer_default_params();
    p.sampling = &greedy;
    p.max_tokens = 12;
    int failures = 0;
    for (int i = 2; i < argc; i++) {
        sb_served served;
        sb_status st = sb_switchboard_set_default(sb, argv[i], &served, &err);
        if (st != SB_OK) { /* SB_ERR_MODEL_NOT_FOUND when there is no fallback: the default stays */
            printf("%s: %s: %s\n", argv[i], sb_status_str(st), err.msg);
            failures++;
            continue;
        }
        if (served.fallback)
            printf("%s: served by the fallback '%s' (%s)\n", argv[i], served.model, served.fallback_reason);
        else
            printf("%s: served by '%s'\n", argv[i], served.model);
        sb_result res;
        if (sb_switchboard_complete(sb, "Once upon a time", &p, &res, &err) != SB_OK) {
            fprintf(stderr, "complete: %s\n", err.msg);
            sb_switchboard_free(sb);
            return 1;
        }
        printf("  [%s%s] %s\n", res.served.model, res.served.fallback ? ", fallback" : "", res.text);
        sb_result_free(&res);
    }
    char dflt[128];
    sb_switchboard_get_default(sb, dflt, sizeof dflt);
    printf("default model now: %s; %d name(s) not found\n", dflt, failures);
    sb_switchboard_free(sb);
    return 0;
}
