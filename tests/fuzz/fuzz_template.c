/*
 * fuzz_template.c - the Jinja interpreter: the input is a template's
 * source, parsed and rendered with a fixed conversation (system, user,
 * assistant, a tool list), as a model's chat template would be. Syntax
 * errors, runaway loops and recursion must end in an sb_status within the
 * interpreter's budgets; never a crash, hang or leak.
 */
#include <stdint.h>

#include "base/base.h"
#include "template/template.h"

static const char messages[] =
    "[{\"role\":\"system\",\"content\":\"You are terse.\"},"
    "{\"role\":\"user\",\"content\":\"Hi \\u00e9\\u4e2d \\ud83d\\ude00\"},"
    "{\"role\":\"assistant\",\"content\":\"Hello.\",\"tool_calls\":[{\"function\":{\"name\":\"f\",\"arguments\":{\"a\":1}}}]},"
    "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"more\"}]}]";
static const char tools[] = "[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"type\":\"object\"}}}]";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    sb_tpl *tpl = NULL;
    if (sb_tpl_parse((const char *)data, size, &tpl, NULL) != SB_OK)
        return 0;
    sb_tpl_chat chat = {.messages_json = messages, .tools_json = size % 2 ? tools : NULL,
                        .extra_json = "{\"enable_thinking\":false}", .add_generation_prompt = true,
                        .bos_token = "<s>", .eos_token = "</s>", .now = "2026-01-02 03:04:05"};
    char *out = NULL;
    size_t n = 0;
    if (sb_tpl_render_chat(tpl, &chat, &out, &n, NULL) == SB_OK && out[n] != '\0')
        __builtin_trap(); /* the output is NUL-terminated */
    sb_free(out);
    sb_tpl_free(tpl);
    return 0;
}
