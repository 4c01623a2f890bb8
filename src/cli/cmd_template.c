/*
 * cmd_template.c - `switchboard template`: renders a chat template over a
 * conversation and prints the result byte for byte (no newline added), as
 * transformers' apply_chat_template(tokenize=False) would. The template
 * comes from a GGUF model (tokenizer.chat_template, with the model's BOS/EOS
 * token texts), a Jinja file, or a built-in name.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "cli/cli.h"
#include "gguf/gguf.h"
#include "template/template.h"

static const char usage_text[] =
    "usage: switchboard template (-m MODEL | --file T.jinja | --builtin NAME) --messages FILE.json\n"
    "       [--tools FILE.json] [--kwargs FILE.json] [--no-generation-prompt] [--bos S] [--eos S]\n"
    "       [--now 'YYYY-MM-DD HH:MM']\n";


/* Text of token tokenizer.ggml.<which>_token_id, or NULL if the model has none. */
static char *token_text(const sb_gguf *g, const char *which, sb_error *err) {
    char key[64];
    snprintf(key, sizeof(key), "tokenizer.ggml.%s_token_id", which);
    if (!sb_gguf_find(g, key))
        return NULL;
    uint32_t id;
    const sb_gguf_kv *tokens;
    if (sb_gguf_get_u32(g, key, &id, err) ||
        sb_gguf_get_arr(g, "tokenizer.ggml.tokens", SB_GGUF_STRING, &tokens, err))
        return NULL;
    if (id >= tokens->arr_n) {
        sb_fail(err, SB_ERR_FORMAT, "%s = %u is outside the vocabulary", key, id);
        return NULL;
    }
    sb_gguf_str *all = sb_calloc(tokens->arr_n, sizeof(*all));
    if (!all)
        return NULL;
    sb_gguf_arr_strings(tokens, all);
    char *text = sb_strndup(all[id].ptr, all[id].len);
    sb_free(all);
    return text;
}

/* Reads the chat template and BOS/EOS texts of a GGUF model. */
static sb_status load_model_template(const char *path, char **src, char **bos, char **eos, sb_error *err) {
    sb_gguf *g;
    sb_status st = sb_gguf_open(path, &g, err);
    if (st)
        return st;
    sb_gguf_str tpl;
    if ((st = sb_gguf_get_str(g, "tokenizer.chat_template", &tpl, err)) == SB_ERR_NOT_FOUND)
        sb_fail(err, st, "%s has no tokenizer.chat_template (use --file or --builtin)", path);
    if (!st && !(*src = sb_strndup(tpl.ptr, tpl.len)))
        st = sb_fail(err, SB_ERR_NOMEM, "out of memory");
    err->status = SB_OK;
    if (!st) {
        *bos = token_text(g, "bos", err);
        if (!err->status)
            *eos = token_text(g, "eos", err);
        st = err->status;
    }
    sb_gguf_close(g);
    return st;
}

int sb_cmd_template(int argc, char **argv) {
    const char *model = NULL, *file = NULL, *builtin = NULL, *messages = NULL, *tools = NULL, *kwargs = NULL;
    const char *bos = NULL, *eos = NULL, *now = NULL;
    bool gen_prompt = true;
    for (int i = 1; i < argc; i++) {
        if (sb_cli_end_of_options(argc, argv, i, NULL))
            break;
        if (sb_cli_opt(argc, argv, &i, "-m", &model) || sb_cli_opt(argc, argv, &i, "--model", &model) ||
            sb_cli_opt(argc, argv, &i, "--file", &file) || sb_cli_opt(argc, argv, &i, "--builtin", &builtin) ||
            sb_cli_opt(argc, argv, &i, "--messages", &messages) || sb_cli_opt(argc, argv, &i, "--tools", &tools) ||
            sb_cli_opt(argc, argv, &i, "--kwargs", &kwargs) || sb_cli_opt(argc, argv, &i, "--bos", &bos) ||
            sb_cli_opt(argc, argv, &i, "--eos", &eos) || sb_cli_opt(argc, argv, &i, "--now", &now))
            continue;
        if (strcmp(argv[i], "--no-generation-prompt") == 0) {
            gen_prompt = false;
            continue;
        }
        fprintf(stderr, "switchboard template: unknown option '%s'\n%s", argv[i], usage_text);
        return SB_EXIT_USAGE;
    }
    if (!messages || (!!model + !!file + !!builtin) != 1) {
        fputs(usage_text, stderr);
        return SB_EXIT_USAGE;
    }
    sb_error err = {0};
    char *src = NULL, *model_bos = NULL, *model_eos = NULL, *msgs = NULL, *tools_json = NULL, *kw_json = NULL;
    char *out = NULL;
    sb_tpl *tpl = NULL;
    int rc = 1;
    if (model) {
        if (load_model_template(model, &src, &model_bos, &model_eos, &err)) {
            sb_cli_error("%s", err.msg);
            goto done;
        }
    } else if (builtin) {
        const char *text = sb_tpl_builtin_source(builtin);
        if (!text) {
            fprintf(stderr, "switchboard template: unknown built-in template '%s' (known: %s)\n", builtin,
                    sb_tpl_builtin_names());
            rc = SB_EXIT_USAGE;
            goto done;
        }
        src = sb_strndup(text, strlen(text));
    } else if (!(src = sb_cli_read_file(file))) {
        sb_cli_error("cannot read %s", file);
        goto done;
    }
    const char *const inputs[] = {messages, tools, kwargs};
    char **const texts[] = {&msgs, &tools_json, &kw_json};
    for (size_t k = 0; k < 3; k++) {
        if (inputs[k] && !(*texts[k] = sb_cli_read_file(inputs[k]))) {
            sb_cli_error("cannot read %s", inputs[k]);
            goto done;
        }
    }
    if (!src || sb_tpl_parse(src, strlen(src), &tpl, &err)) {
        sb_cli_error("%s%s", model ? model : file ? file : builtin, src ? err.msg + strlen("template") : ": out of memory");
        goto done;
    }
    sb_tpl_chat chat = {
        .messages_json = msgs,
        .tools_json = tools_json,
        .extra_json = kw_json,
        .add_generation_prompt = gen_prompt,
        .bos_token = bos ? bos : model_bos,
        .eos_token = eos ? eos : model_eos,
        .now = now,
    };
    size_t len;
    if (sb_tpl_render_chat(tpl, &chat, &out, &len, &err)) {
        const char *msg = strncmp(err.msg, "template:", 9) == 0 ? err.msg + strlen("template") : NULL;
        if (msg)
            sb_cli_error("%s%s", model ? model : file ? file : builtin, msg);
        else
            sb_cli_error("%s", err.msg);
        goto done;
    }
    rc = fwrite(out, 1, len, stdout) == len && fflush(stdout) == 0 ? 0 : 1;
done:
    sb_free(out);
    sb_tpl_free(tpl);
    sb_free(src);
    sb_free(model_bos);
    sb_free(model_eos);
    sb_free(msgs);
    sb_free(tools_json);
    sb_free(kw_json);
    return rc;
}
