/*
 * cmd_tokenize.c - `switchboard tokenize -m FILE [--no-bos] [--special]
 * [--pieces] [--] TEXT`: the token ids of TEXT as one JSON array on one line
 * (with --pieces, an array of [id, "piece"] pairs).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "cli/cli.h"
#include "switchboard.h"

/* TEXT, the one operand: false, after saying so, for a second one. */
static bool take_text(const char **text, const char *arg) {
    if (*text) {
        fprintf(stderr, "switchboard tokenize: more than one TEXT argument ('%s')\n", arg);
        return false;
    }
    *text = arg;
    return true;
}

int sb_cmd_tokenize(int argc, char **argv) {
    const char *model_path = NULL, *text = NULL;
    bool add_bos = true, special = false, pieces = false;
    int operands = argc;
    for (int i = 1; i < argc; i++) {
        if (sb_cli_end_of_options(argc, argv, i, &operands))
            break;
        if (sb_cli_opt(argc, argv, &i, "-m", &model_path) || sb_cli_opt(argc, argv, &i, "--model", &model_path))
            continue;
        if (strcmp(argv[i], "--no-bos") == 0)
            add_bos = false;
        else if (strcmp(argv[i], "--special") == 0)
            special = true;
        else if (strcmp(argv[i], "--pieces") == 0)
            pieces = true;
        else if (argv[i][0] == '-' && argv[i][1] != '\0' && !text) {
            fprintf(stderr, "switchboard tokenize: unknown option '%s'\n", argv[i]);
            return SB_EXIT_USAGE;
        } else if (!take_text(&text, argv[i]))
            return SB_EXIT_USAGE;
    }
    for (int i = operands; i < argc; i++) /* after `--`: text even if it starts with '-' */
        if (!take_text(&text, argv[i]))
            return SB_EXIT_USAGE;
    if (!model_path || !text) {
        fputs("usage: switchboard tokenize -m FILE [--no-bos] [--special] [--pieces] [--] TEXT\n", stderr);
        return SB_EXIT_USAGE;
    }
    sb_model_t *model;
    sb_error err;
    if (sb_model_load(model_path, &model, &err) != SB_OK)
        return sb_cli_error("%s", err.msg);
    size_t len = strlen(text), n = 0;
    sb_tokenize(model, text, len, add_bos, special, NULL, 0, &n, NULL);
    int32_t *ids = malloc((n + 1) * sizeof(int32_t));
    int rc = 0;
    if (!ids || sb_tokenize(model, text, len, add_bos, special, ids, n, &n, &err) != SB_OK) {
        rc = sb_cli_error("%s", ids ? err.msg : "out of memory");
    } else {
        cJSON *arr = cJSON_CreateArray();
        for (size_t i = 0; i < n; i++) {
            cJSON *id = cJSON_CreateNumber(ids[i]);
            if (pieces) {
                cJSON *pair = cJSON_CreateArray();
                cJSON_AddItemToArray(pair, id);
                cJSON_AddItemToArray(pair, cJSON_CreateString(sb_token_text(model, ids[i])));
                id = pair;
            }
            cJSON_AddItemToArray(arr, id);
        }
        char *s = cJSON_PrintUnformatted(arr);
        puts(s);
        cJSON_free(s);
        cJSON_Delete(arr);
    }
    free(ids);
    sb_model_free(model);
    return rc;
}
