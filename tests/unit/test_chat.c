/*
 * test_chat.c - `switchboard run --chat` for each model family: a random
 * model of the family's architecture, generated with the family's real
 * vocabulary and chat template, must receive exactly the family's prompt
 * format (written out by hand here, independently of the template engine)
 * token by token, and answer.
 */
#include <setjmp.h>
#include <stdbool.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>
#include <cmocka.h>

#include "testutil.h"

typedef struct family {
    const char *name, *arch, *vocab, *template_file; /* template NULL: the vocabulary file's own */
    const char *system;                               /* NULL: the template takes no system message */
    const char *expected;                             /* the prompt text for user message "Hello" */
    bool starts_with_bos_text;
} family;

static const family families[] = {
    {"llama3", "llama", "llama3", "meta-llama-Meta-Llama-3-8B-Instruct.jinja", "Be brief.",
     "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
     "<|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n",
     true},
    {"qwen2.5", "qwen2", "qwen2", NULL, "Be brief.",
     "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n", false},
    {"qwen3", "qwen3", "qwen2", "Qwen-Qwen3-0.6B.jinja", "Be brief.",
     "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n", false},
    {"phi3.5", "phi3", "llama2", "microsoft-Phi-3.5-mini-instruct.jinja", "Be brief.",
     "<|system|>\nBe brief.<|end|>\n<|user|>\nHello<|end|>\n<|assistant|>\n", false},
    {"gemma2", "gemma2", "llama2", "google-gemma-2-2b-it.jinja", NULL,
     "<s><start_of_turn>user\nHello<end_of_turn>\n<start_of_turn>model\n", true},
    {"mistral", "llama", "llama2", "mistralai-Mistral-7B-Instruct-v0.2.jinja", NULL, "<s>[INST] Hello [/INST]", true},
};

static char *run_cli(const char *const *args) {
    char *out, *err;
    int rc = sb_test_run_cli(args, &out, &err);
    if (rc != 0)
        fail_msg("switchboard %s %s exited %d: %s", args[0], args[1], rc, err);
    free(err);
    return out;
}

static void test_family_prompt_formats(void **state) {
    (void)state;
    for (size_t f = 0; f < sizeof(families) / sizeof(families[0]); f++) {
        const family *fam = &families[f];
        char model[512], vocab[512], tpl[512];
        snprintf(model, sizeof(model), "%s/chat-%s.gguf", sb_test_tmpdir(), fam->name);
        snprintf(vocab, sizeof(vocab), "models/%s-vocab-tiny-random.gguf", fam->vocab);
        strcpy(vocab, sb_test_fixture(vocab));
        const char *gen[24] = {"gen-model", "--out", model, "--arch", fam->arch, "--vocab-from", vocab, "--dim",
                               "64", "--hidden", "128", "--heads", "4", "--kv-heads", "2", "--layers", "1", NULL};
        if (fam->template_file) {
            snprintf(tpl, sizeof(tpl), "templates/%s", fam->template_file);
            strcpy(tpl, sb_test_fixture(tpl));
            gen[17] = "--chat-template";
            gen[18] = tpl;
            gen[19] = NULL;
        }
        free(run_cli(gen));

        const char *run[16] = {"run", "-m", model, "--chat", "-p", "Hello", "-n", "8", "--temp", "0", "--json",
                               "-t", "1", NULL};
        if (fam->system) {
            run[13] = "--system";
            run[14] = fam->system;
            run[15] = NULL;
        }
        char *out = run_cli(run);
        cJSON *got = cJSON_Parse(out);
        free(out);
        assert_non_null(got);

        const char *tok[] = {"tokenize", "-m", model, "--special", fam->starts_with_bos_text ? "--no-bos" : fam->expected,
                             fam->starts_with_bos_text ? fam->expected : NULL, NULL};
        out = run_cli(tok);
        cJSON *want = cJSON_Parse(out);
        free(out);
        bool same = cJSON_Compare(cJSON_GetObjectItem(got, "prompt_ids"), want, true);
        int n_gen = cJSON_GetArraySize(cJSON_GetObjectItem(got, "gen_ids"));
        const char *stop = cJSON_GetObjectItem(got, "stop")->valuestring;
        fprintf(stderr, "%-8s %-7s prompt format %s (%d tokens), answered %d tokens (%s)\n", fam->name, fam->arch,
                same ? "exact" : "DIFFERS", cJSON_GetArraySize(want), n_gen, stop);
        if (!same) {
            char *a = cJSON_PrintUnformatted(cJSON_GetObjectItem(got, "prompt_ids")), *b = cJSON_PrintUnformatted(want);
            fail_msg("%s: run --chat sent %s, the family's format is %s", fam->name, a, b);
        }
        assert_true(n_gen > 0 || strcmp(stop, "eos") == 0);
        cJSON_Delete(got);
        cJSON_Delete(want);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_family_prompt_formats),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
