/*
 * test_video.c - the video job's pure pieces (src/batch/video*.c): ffmpeg's
 * frame list parsed (and its malformed lines refused by line), keyframe
 * selection (the first frame always, strongest first, the minimum gap, the
 * cap, time order), the map-reduce chunking, time stamps, the captioner
 * command's word splitting, and the summariser's rounds against a fake model
 * (how many requests a small context takes, and that every request fits).
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>
#include <cmocka.h>

#include "base/base.h"
#include "batch/video-impl.h"
#include "testutil.h"

static void parse_scenes(void **state) {
    const char *text = "frame:0    pts:0       pts_time:0\n"
                       "lavfi.scene_score=0.000000\n"
                       "frame:1    pts:20480   pts_time:2\n"
                       "lavfi.scene_score=0.400000\n"
                       "lavfi.other=1\n"
                       "frame:2    pts:51200   pts_time:5.04\n"
                       "lavfi.scene_score=0.903561\n";
    sb_video_cand *c;
    int32_t n;
    sb_error err;
    assert_int_equal(sb__video_parse_scenes(text, &c, &n, &err), SB_OK);
    assert_int_equal(n, 3);
    assert_true(isinf(c[0].score));
    assert_true(c[0].time == 0);
    assert_true(fabs(c[1].time - 2) < 1e-9 && fabs(c[1].score - 0.4) < 1e-9);
    assert_true(fabs(c[2].time - 5.04) < 1e-9 && fabs(c[2].score - 0.903561) < 1e-9);
    sb_free(c);

    assert_int_equal(sb__video_parse_scenes("", &c, &n, &err), SB_OK);
    assert_int_equal(n, 0);
    sb_free(c);

    assert_int_equal(sb__video_parse_scenes("frame:0 pts:0 pts_time:0\nframe:1 pts:5\n", &c, &n, &err), SB_ERR_FORMAT);
    assert_non_null(strstr(err.msg, "line 2"));
    assert_int_equal(sb__video_parse_scenes("lavfi.scene_score=0.5\n", &c, &n, &err), SB_ERR_FORMAT);
    assert_non_null(strstr(err.msg, "line 1"));
    assert_int_equal(sb__video_parse_scenes("frame:0 pts_time:0\nlavfi.scene_score=x\n", &c, &n, &err),
                     SB_ERR_FORMAT);
    assert_non_null(strstr(err.msg, "line 2"));
}

static void select_keyframes(void **state) {
    /* the first frame, then changes at 0.5 (weak, near the first), 3, 3.4 (stronger than 3), 7, 9 */
    sb_video_cand c[] = {{0, INFINITY}, {0.5, 0.9}, {3, 0.5}, {3.4, 0.8}, {7, 0.35}, {9, 0.6}};
    int32_t keep[6];
    int32_t k = sb__video_select(c, 6, 1.0, 16, keep);
    /* 0.5 is within 1 s of the first frame; 3 within 1 s of the stronger 3.4 */
    assert_int_equal(k, 4);
    assert_int_equal(keep[0], 0);
    assert_int_equal(keep[1], 3);
    assert_int_equal(keep[2], 4);
    assert_int_equal(keep[3], 5);

    /* a cap of 3: the weakest (7 s) goes; the order stays by time */
    k = sb__video_select(c, 6, 1.0, 3, keep);
    assert_int_equal(k, 3);
    assert_int_equal(keep[0], 0);
    assert_int_equal(keep[1], 3);
    assert_int_equal(keep[2], 5);

    /* no gap: everything under the cap */
    assert_int_equal(sb__video_select(c, 6, 0, 16, keep), 6);
    /* a cap of 1: only the first frame, however strong the others */
    assert_int_equal(sb__video_select(c, 6, 0, 1, keep), 1);
    assert_int_equal(keep[0], 0);
    /* a huge gap: only the first frame */
    assert_int_equal(sb__video_select(c, 6, 100, 16, keep), 1);
    assert_int_equal(sb__video_select(c, 0, 1, 16, keep), 0);
}

static void chunking(void **state) {
    int32_t starts[8];
    const int32_t cost[] = {3, 4, 2, 5, 1, 6};
    assert_int_equal(sb__video_chunk(cost, 6, 100, starts), 1);
    assert_int_equal(starts[0], 0);
    /* budget 7: [3 4] [2 5] [1 6] */
    assert_int_equal(sb__video_chunk(cost, 6, 7, starts), 3);
    assert_int_equal(starts[1], 2);
    assert_int_equal(starts[2], 4);
    /* budget 6: [3] [4 2] [5 1] [6] */
    assert_int_equal(sb__video_chunk(cost, 6, 6, starts), 4);
    assert_int_equal(starts[1], 1);
    assert_int_equal(starts[2], 3);
    assert_int_equal(starts[3], 5);
    /* an item over the budget is alone in its chunk */
    const int32_t big[] = {2, 9, 2};
    assert_int_equal(sb__video_chunk(big, 3, 5, starts), 3);
    assert_int_equal(sb__video_chunk(cost, 0, 5, starts), 0);
}

static void stamps(void **state) {
    char s[32];
    sb__video_stamp(0, s, sizeof s);
    assert_string_equal(s, "[00:00]");
    sb__video_stamp(72.9, s, sizeof s);
    assert_string_equal(s, "[01:12]");
    sb__video_stamp(3725, s, sizeof s);
    assert_string_equal(s, "[1:02:05]");
    sb__video_stamp(-1, s, sizeof s);
    assert_string_equal(s, "[00:00]");
}

static void split_command(void **state) {
    char **argv;
    int32_t argc;
    sb_error err;
    assert_int_equal(sb__video_split_command("  node  cap.js --x 'a b' \"c\\\"d\" e\\ f ''", &argv, &argc, &err),
                     SB_OK);
    assert_int_equal(argc, 7);
    assert_string_equal(argv[0], "node");
    assert_string_equal(argv[1], "cap.js");
    assert_string_equal(argv[2], "--x");
    assert_string_equal(argv[3], "a b");
    assert_string_equal(argv[4], "c\"d");
    assert_string_equal(argv[5], "e f");
    assert_string_equal(argv[6], "");
    assert_null(argv[7]);
    sb_free(argv);
    assert_int_equal(sb__video_split_command("a 'b", &argv, &argc, &err), SB_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "unterminated"));
    assert_int_equal(sb__video_split_command("   ", &argv, &argc, &err), SB_ERR_INVALID_ARG);
}

/* ---- the summariser on a fake model: one token a byte ------------------------- */

/* The summariser calls from several threads: counters are atomic, and a
 * request that would not fit is counted, not asserted there. */
typedef struct fake {
    int32_t calls, max_prompt, n_ctx, overflows;
    int32_t busy; /* answer 503 this many times first */
    bool refuse;
} fake;

static int32_t count_text(void *user, const char *text) { return (int32_t)strlen(text); }

/* The messages' contents plus 20 tokens of template. */
static int32_t count_chat(void *user, const char *messages) {
    cJSON *m = cJSON_Parse(messages), *x;
    int32_t n = 20;
    cJSON_ArrayForEach(x, m) n += (int32_t)strlen(cJSON_GetObjectItem(x, "content")->valuestring);
    cJSON_Delete(m);
    return n;
}

/* Answers "summary N" and records the largest prompt (it must fit with max_tokens). */
static sb_status complete(void *user, const char *body, int *http_status, char **response, sb_error *err) {
    fake *f = user;
    if (f->busy > 0 && __atomic_fetch_sub(&f->busy, 1, __ATOMIC_RELAXED) > 0) { /* "busy": asked again */
        *http_status = 503;
        *response = sb_strndup("{\"error\":{\"message\":\"busy\"}}", 27);
        return SB_OK;
    }
    *http_status = f->refuse ? 400 : 200;
    cJSON *b = cJSON_Parse(body);
    char *msgs = cJSON_PrintUnformatted(cJSON_GetObjectItem(b, "messages"));
    int32_t prompt = count_chat(f, msgs), max_tokens = cJSON_GetObjectItem(b, "max_tokens")->valueint;
    cJSON_free(msgs);
    cJSON_Delete(b);
    if (prompt + max_tokens > f->n_ctx)
        __atomic_fetch_add(&f->overflows, 1, __ATOMIC_RELAXED);
    for (int32_t m = __atomic_load_n(&f->max_prompt, __ATOMIC_RELAXED);
         prompt > m && !__atomic_compare_exchange_n(&f->max_prompt, &m, prompt, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED);)
        ;
    int32_t call = __atomic_add_fetch(&f->calls, 1, __ATOMIC_RELAXED);
    char text[200];
    if (f->refuse)
        snprintf(text, sizeof text, "{\"error\":{\"message\":\"no\"}}");
    else
        snprintf(text, sizeof text, "{\"choices\":[{\"message\":{\"content\":\"summary %d\"}}]}", call);
    *response = sb_strndup(text, strlen(text));
    return SB_OK;
}

static sb_video_item *captioned_video(int32_t n) {
    sb_video_item *v = sb_calloc(1, sizeof *v);
    v->kf = sb_calloc((size_t)n, sizeof *v->kf);
    v->n_kf = n;
    for (int32_t k = 0; k < n; k++) {
        char c[64];
        snprintf(c, sizeof c, "a frame showing thing number %d", (int)k);
        v->kf[k].time = 2.0 * k;
        v->kf[k].caption = sb_strndup(c, strlen(c));
    }
    return v;
}

static int32_t summarize_with(int32_t n_ctx, int32_t n_captions, fake *f) {
    *f = (fake){.n_ctx = n_ctx};
    sb_video_llm llm = {complete, count_chat, count_text, f, "m", n_ctx};
    sb_video_params p = sb_video_default_params();
    p.summary_tokens = 40;
    sb_video_item *v = captioned_video(n_captions);
    sb_error err;
    assert_int_equal(sb__video_summarize(&p, &llm, v, &err), SB_OK);
    assert_non_null(v->summary);
    assert_int_equal(v->llm_calls, f->calls);
    assert_int_equal(f->overflows, 0);
    int32_t calls = v->llm_calls;
    sb__video_item_free(v);
    return calls;
}

static void map_reduce(void **state) {
    fake f;
    /* a large context: one request */
    assert_int_equal(summarize_with(8192, 10, &f), 1);
    /* 10 captions of ~39 tokens in a 400-token context: the frame takes
     * 20 + 21 + ~80 (instruction), the answer 40, leaving ~240: six chunks
     * of one or two captions... then summaries of summaries */
    int32_t calls = summarize_with(400, 10, &f);
    assert_true(calls > 2);
    assert_true(f.max_prompt + 40 <= 400);
    /* the more captions, the more requests; always more than the chunks alone */
    assert_true(summarize_with(400, 40, &f) > calls);
    /* too small a context for the frame itself: an error, no request */
    sb_video_llm llm = {complete, count_chat, count_text, &f, "m", 100};
    f = (fake){.n_ctx = 100};
    sb_video_params p = sb_video_default_params();
    sb_video_item *v = captioned_video(3);
    sb_error err;
    assert_int_equal(sb__video_summarize(&p, &llm, v, &err), SB_ERR_CONTEXT_FULL);
    assert_non_null(strstr(err.msg, "too small"));
    assert_int_equal(f.calls, 0);
    sb__video_item_free(v);
    /* 503 (busy, loading) is asked again: the video is not failed for it */
    f = (fake){.n_ctx = 8192, .busy = 2};
    llm.n_ctx = 8192;
    v = captioned_video(3);
    assert_int_equal(sb__video_summarize(&p, &llm, v, &err), SB_OK);
    assert_int_equal(f.calls, 1);
    assert_int_equal(v->llm_calls, 1);
    sb__video_item_free(v);
    /* the model's error is the video's, with its message */
    f = (fake){.n_ctx = 8192, .refuse = true};
    llm.n_ctx = 8192;
    v = captioned_video(3);
    assert_int_equal(sb__video_summarize(&p, &llm, v, &err), SB_ERR_IO);
    assert_non_null(strstr(err.msg, "no"));
    sb__video_item_free(v);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(parse_scenes), cmocka_unit_test(select_keyframes), cmocka_unit_test(chunking),
        cmocka_unit_test(stamps),       cmocka_unit_test(split_command),    cmocka_unit_test(map_reduce),
    };
    return sb_test_exit(cmocka_run_group_tests(tests, NULL, NULL));
}
