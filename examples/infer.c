/*
 * infer.c - the smallest use of libswitchboard: open a model (or a registry)
 * and complete a prompt.
 *
 *   cc infer.c $(pkg-config --cflags --libs switchboard) -o infer
 *   ./infer model.gguf "Once upon a time"
 */
#include <stdio.h>

#include <switchboard.h>

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s MODEL.gguf|models.json|DIR [PROMPT]\n", argv[0]);
        return 2;
    }
    sb_error err;
    sb_switchboard_t *sb;
    if (sb_switchboard_open(argv[1], NULL, &sb, &err) != SB_OK) {
        fprintf(stderr, "open: %s\n", err.msg);
        return 1;
    }
    sb_sampler_params greedy = sb_sampler_default_params();
    greedy.temperature = 0; /* the same answer every run */
    sb_infer_params p = sb_infer_default_params();
    p.sampling = &greedy;
    p.max_tokens = 32;
    sb_result res;
    sb_status st = sb_switchboard_complete(sb, argc > 2 ? argv[2] : "Once upon a time", &p, &res, &err);
    if (st == SB_OK) {
        printf("%s\n", res.text);
        printf("[model %s, %d prompt + %d generated tokens, finish: %s]\n", res.served.model, res.n_prompt,
               res.n_generated, sb_finish_reason_str(res.finish));
        sb_result_free(&res);
    } else {
        fprintf(stderr, "complete: %s (%s)\n", err.msg, sb_status_str(st));
    }
    sb_switchboard_free(sb);
    return st == SB_OK ? 0 : 1;
}
