/*
 * streaming.c - text as it is generated: a per-token callback, called on
 * this thread, printing each piece the moment the engine produces it.
 *
 *   ./streaming model.gguf "Once upon a time"
 */
#include <stdio.h>

#include <switchboard.h>

static bool print_piece(void *user, const sb_stream_event *ev) {
    int *tokens = user;
    fwrite(ev->text, 1, ev->text_len, stdout);
    fflush(stdout);
    if (ev->done)
        printf("\n[finish: %s, %d tokens]\n", sb_finish_reason_str(ev->finish), ev->n_generated);
    else
        ++*tokens;
    return true; /* false would cancel the generation */
}

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
    int tokens = 0;
    sb_sampler_params sp = sb_sampler_default_params();
    sp.seed = 42;
    sb_infer_params p = sb_infer_default_params();
    p.sampling = &sp;
    p.max_tokens = 48;
    p.on_event = print_piece;
    p.user_data = &tokens;
    sb_result res;
    sb_status st = sb_switchboard_complete(sb, argc > 2 ? argv[2] : "Once upon a time", &p, &res, &err);
    if (st == SB_OK) {
        printf("[%d token events; the whole text is %zu bytes]\n", tokens, res.text_len);
        sb_result_free(&res);
    } else {
        fprintf(stderr, "complete: %s\n", err.msg);
    }
    sb_switchboard_free(sb);
    return st == SB_OK && tokens > 0 ? 0 : 1;
}
