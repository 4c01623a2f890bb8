/*
 * profiler.c - what a call cost: every call measures itself (load time,
 * time to first token, speeds, token counts, memory), returned with the
 * result and readable afterwards with sb_switchboard_last_profile.
 *
 *   ./profiler model.gguf
 */
#include <stdio.h>

#include <switchboard.h>

static void print_profile(const char *what, const sb_profile *p) {
    printf("%s:\n", what);
    printf("  load      %8.2f ms\n", p->load_s * 1e3);
    printf("  ttft      %8.2f ms\n", p->ttft_s * 1e3);
    printf("  total     %8.2f ms\n", p->total_s * 1e3);
    printf("  prompt    %8d tokens (%d cached), %.1f tokens/s\n", p->n_prompt, p->n_prompt_cached, p->prompt_tps);
    printf("  generated %8d tokens, %.1f tokens/s\n", p->n_generated, p->gen_tps);
    printf("  memory    %8.1f MiB resident, %.1f MiB peak; models %.1f of %.1f MiB budget\n",
           p->rss_bytes / 1048576.0, p->peak_rss_bytes / 1048576.0, p->models_bytes / 1048576.0,
           p->budget_bytes / 1048576.0);
}

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
    sb_sampler_params greedy = sb_sampler_default_params();
    greedy.temperature = 0;
    sb_infer_params p = sb_infer_default_params();
    p.sampling = &greedy;
    p.max_tokens = 64;
    p.ignore_eos = true; /* a fixed length, so that runs compare */
    sb_status st = SB_OK;
    /* The first call loads the model; the second finds it loaded (and its prompt cached). */
    for (int run = 0; run < 2 && st == SB_OK; run++) {
        sb_result res;
        if ((st = sb_switchboard_complete(sb, "Once upon a time", &p, &res, &err)) != SB_OK)
            break;
        print_profile(run == 0 ? "first call (loads the model)" : "second call", &res.profile);
        sb_result_free(&res);
    }
    if (st == SB_OK) {
        sb_profile last;
        sb_switchboard_last_profile(sb, &last);
        printf("last_profile: %d generated tokens\n", last.n_generated);
    } else {
        fprintf(stderr, "complete: %s\n", err.msg);
    }
    sb_switchboard_free(sb);
    return st == SB_OK ? 0 : 1;
}
