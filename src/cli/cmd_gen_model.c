/*
 * cmd_gen_model.c - `switchboard gen-model`: writes a llama-shaped GGUF
 * with seeded random weights and a byte-level SentencePiece vocabulary
 * (see src/model/synth.h). Defaults give a tiny model; the benchmark shapes
 * are spelled out with the options.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "cli/cli.h"
#include "model/synth.h"

static const char usage[] =
    "usage: switchboard gen-model --out FILE [--arch llama|qwen2|qwen3|phi3|gemma2] [--vocab-from FILE.gguf]\n"
    "       [--type f32|f16|bf16|q8_0|q4_0|q4_1|q5_0|q5_1] [--dim N]\n"
    "       [--hidden N] [--layers N] [--heads N] [--kv-heads N] [--vocab N] [--ctx N] [--seed S]\n"
    "       [--rope-base F] [--name NAME] [--chat-template FILE.jinja]\n";


int sb_cmd_gen_model(int argc, char **argv) {
    sb_synth_params p = sb_synth_default_params();
    char *template_text = NULL;
    const char *out = NULL, *v;
    for (int i = 1; i < argc; i++) {
        if (sb_cli_end_of_options(argc, argv, i, NULL))
            break;
        if (sb_cli_opt(argc, argv, &i, "--out", &out) || sb_cli_opt(argc, argv, &i, "--name", &p.name) ||
            sb_cli_opt(argc, argv, &i, "--arch", &p.arch) || sb_cli_opt(argc, argv, &i, "--vocab-from", &p.vocab_from))
            continue;
        if (sb_cli_opt(argc, argv, &i, "--chat-template", &v)) {
            sb_free(template_text);
            if (!(template_text = sb_cli_read_file(v)))
                return sb_cli_error("--chat-template: cannot read '%s'", v);
            p.chat_template = template_text;
        } else if (sb_cli_opt(argc, argv, &i, "--type", &v)) {
            const sb_type_traits *tr = NULL;
            for (uint32_t t = 0; t < SB_TYPE_COUNT && !tr; t++)
                if (sb_type_traits_of(t) && strcmp(sb_type_traits_of(t)->name, v) == 0 && sb_type_can_matmul(t)) {
                    tr = sb_type_traits_of(t);
                    p.type = (sb_type)t;
                }
            if (!tr) {
                fprintf(stderr, "switchboard gen-model: unknown or unsupported --type '%s'\n", v);
                return SB_EXIT_USAGE;
            }
        } else if (sb_cli_opt(argc, argv, &i, "--dim", &v))
            p.dim = (int32_t)sb_cli_int("--dim", v, 2, 1 << 16);
        else if (sb_cli_opt(argc, argv, &i, "--hidden", &v))
            p.hidden = (int32_t)sb_cli_int("--hidden", v, 1, 1 << 18);
        else if (sb_cli_opt(argc, argv, &i, "--layers", &v))
            p.layers = (int32_t)sb_cli_int("--layers", v, 1, 1024);
        else if (sb_cli_opt(argc, argv, &i, "--heads", &v))
            p.heads = (int32_t)sb_cli_int("--heads", v, 1, 1024);
        else if (sb_cli_opt(argc, argv, &i, "--kv-heads", &v))
            p.kv_heads = (int32_t)sb_cli_int("--kv-heads", v, 1, 1024);
        else if (sb_cli_opt(argc, argv, &i, "--vocab", &v))
            p.vocab = (int32_t)sb_cli_int("--vocab", v, 260, 1 << 20);
        else if (sb_cli_opt(argc, argv, &i, "--ctx", &v))
            p.ctx = (int32_t)sb_cli_int("--ctx", v, 1, 1 << 24);
        else if (sb_cli_opt(argc, argv, &i, "--seed", &v))
            p.seed = (uint64_t)sb_cli_int("--seed", v, 0, INT64_MAX);
        else if (sb_cli_opt(argc, argv, &i, "--rope-base", &v))
            p.rope_base = sb_cli_float("--rope-base", v);
        else {
            fprintf(stderr, "switchboard gen-model: unknown option '%s'\n%s", argv[i], usage);
            return SB_EXIT_USAGE;
        }
    }
    if (!out) {
        fputs(usage, stderr);
        return SB_EXIT_USAGE;
    }
    sb_error err;
    int rc = sb_synth_write(&p, out, &err) == SB_OK ? 0 : sb_cli_error("%s", err.msg);
    sb_free(template_text);
    return rc;
}
