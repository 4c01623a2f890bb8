/*
 * batch.c - several prompts at once: batch_infer submits them together, so
 * the engine decodes them in the same forward passes, and returns the
 * results in the prompts' order.
 *
 *   ./batch model.gguf
 */
#include <stdio.h>

#include <switchboard.h>

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s MODEL.gguf|models.json|DIR\n", argv[0]);
        return 2;
    }
    sb_error err;
    sb_switchboard_t *sb;
    if (sb_switchboard_open(argv[1], NULL, &sb, &err) != SB_OK) {
        fprintf(stderr, "open: %s\n", err.msg);
        return 1;
    }
    const char *prompts[] = {"Once upon a time", "The little dog", "One day, Lily", "The sun was"};
    enum { N = sizeof prompts / sizeof prompts[0] };
    sb_sampler_params greedy = sb_sampler_default_params();
    greedy.temperature = 0;
    sb_infer_params p = sb_infer_default_params();
    p.sampling = &greedy;
    p.max_tokens = 24;
    sb_result results[N];
    sb_profile whole;
    sb_status st = sb_switchboard_batch_infer(sb, prompts, N, &p, results, &whole, &err);
    if (st == SB_OK) {
        for (int i = 0; i < N; i++) {
            printf("%d. %s -> %s\n", i + 1, prompts[i], results[i].text);
            sb_result_free(&results[i]);
        }
        printf("[%d prompts, %d tokens generated in %.3f s: %.1f tokens/s together]\n", N, whole.n_generated,
               whole.total_s, whole.gen_tps);
    } else {
        fprintf(stderr, "batch: %s\n", err.msg);
    }
    sb_switchboard_free(sb);
    return st == SB_OK ? 0 : 1;
}
