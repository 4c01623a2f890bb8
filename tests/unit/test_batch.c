/*
 * test_batch.c - the batch jobs (src/batch/): every kind of bad input line
 * refused with its code and line, the output lines' shape and
 * deterministic ids, the job store across reopening (counts, pending rows,
 * results in line order, listing, statuses), and the runner over a fake
 * endpoint (503s retried, the stop flag leaving unrecorded rows to run).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cjson/cJSON.h>
#include <cmocka.h>

#include "base/base.h"
#include "batch/input.h"
#include "batch/jobs.h"
#include "batch/runner.h"
#include "testutil.h"

static void check_line(const char *text, const char *endpoint, const char *code, const char *needle) {
    sb_batch_line l;
    sb_error err;
    assert_int_equal(sb_batch_line_check(text, strlen(text), 7, endpoint, &l, &err), SB_OK);
    if (!code) {
        if (!l.ok)
            fail_msg("'%s' refused: %s", text, l.message);
    } else {
        assert_false(l.ok);
        if (strcmp(l.code, code) != 0 || !strstr(l.message, needle) || strncmp(l.message, "line 7: ", 8) != 0)
            fail_msg("'%s': got %s '%s', want %s with '%s'", text, l.code, l.message, code, needle);
    }
    sb_batch_line_free(&l);
}

static void test_line_checks(void **state) {
    (void)state;
    const char *good = "{\"custom_id\":\"a\",\"method\":\"POST\",\"url\":\"/v1/completions\",\"body\":{\"prompt\":\"x\"}}";
    check_line(good, NULL, NULL, NULL);
    check_line(good, "/v1/completions", NULL, NULL);
    check_line("{\"custom_id\":\"a\",", NULL, "invalid_json", "not valid JSON");
    check_line("{\"custom_id\":\"a\"} x", NULL, "invalid_json", "more after");
    check_line("[1,2]", NULL, "invalid_json", "JSON object");
    check_line("{\"method\":\"POST\",\"url\":\"/v1/completions\",\"body\":{}}", NULL, "missing_custom_id", "no custom_id");
    check_line("{\"custom_id\":5,\"method\":\"POST\",\"url\":\"/v1/completions\",\"body\":{}}", NULL, "missing_custom_id",
               "non-empty string");
    check_line("{\"custom_id\":\"\",\"method\":\"POST\",\"url\":\"/v1/completions\",\"body\":{}}", NULL,
               "missing_custom_id", "non-empty string");
    check_line("{\"custom_id\":\"a\",\"method\":\"GET\",\"url\":\"/v1/completions\",\"body\":{}}", NULL, "invalid_method",
               "\"GET\"");
    check_line("{\"custom_id\":\"a\",\"url\":\"/v1/completions\",\"body\":{}}", NULL, "invalid_method", "none");
    check_line("{\"custom_id\":\"a\",\"method\":\"POST\",\"url\":\"/v1/images\",\"body\":{}}", NULL, "invalid_url",
               "/v1/images");
    check_line("{\"custom_id\":\"a\",\"method\":\"POST\",\"body\":{}}", NULL, "invalid_url", "(missing)");
    check_line("{\"custom_id\":\"a\",\"method\":\"POST\",\"url\":\"/v1/embeddings\",\"body\":{}}", "/v1/completions",
               "mismatched_url", "/v1/embeddings");
    check_line("{\"custom_id\":\"a\",\"method\":\"POST\",\"url\":\"/v1/completions\",\"body\":\"x\"}", NULL,
               "invalid_body", "JSON object");
    check_line("{\"custom_id\":\"a\",\"method\":\"POST\",\"url\":\"/v1/completions\"}", NULL, "invalid_body", "no body");
    check_line("{\"custom_id\":\"a\",\"method\":\"POST\",\"url\":\"/v1/completions\",\"body\":{\"stream\":true}}", NULL,
               "invalid_body", "stream");

    sb_batch_line l;
    sb_error err;
    assert_int_equal(sb_batch_line_check(good, strlen(good), 1, NULL, &l, &err), SB_OK);
    assert_string_equal(l.custom_id, "a");
    assert_string_equal(l.url, "/v1/completions");
    assert_string_equal(l.body, "{\"prompt\":\"x\"}");
    sb_batch_line_free(&l);
}

static void test_output_lines(void **state) {
    (void)state;
    sb_batch_ids a, b, c;
    sb_batch_ids_make("batch_x", 3, &a);
    sb_batch_ids_make("batch_x", 3, &b);
    sb_batch_ids_make("batch_x", 4, &c);
    assert_string_equal(a.line_id, b.line_id);
    assert_string_not_equal(a.line_id, c.line_id);
    assert_int_equal(strlen(a.hex), 24);
    assert_int_equal(strncmp(a.line_id, "batch_req_", 10), 0);

    int64_t pt, ct;
    char *line = sb_batch_output_response(&a, "c1", 200,
                                          "{\"id\":\"chatcmpl-123abc\",\"created\":5,\"usage\":{\"prompt_tokens\":9,"
                                          "\"completion_tokens\":4}}",
                                          &pt, &ct);
    assert_non_null(line);
    assert_int_equal(pt, 9);
    assert_int_equal(ct, 4);
    char want[600];
    snprintf(want, sizeof want,
             "{\"id\":\"%s\",\"custom_id\":\"c1\",\"response\":{\"status_code\":200,\"request_id\":\"%s\",\"body\":"
             "{\"id\":\"chatcmpl-%s\",\"created\":5,\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":4}}},"
             "\"error\":null}",
             a.line_id, a.request_id, a.hex);
    assert_string_equal(line, want);
    sb_free(line);

    line = sb_batch_output_error(&c, NULL, 4, "invalid_json", "line 4: bad");
    snprintf(want, sizeof want,
             "{\"id\":\"%s\",\"custom_id\":null,\"response\":null,\"error\":{\"code\":\"invalid_json\","
             "\"message\":\"line 4: bad\",\"line\":4}}",
             c.line_id);
    assert_string_equal(line, want);
    sb_free(line);
}

static const char *state_dir(const char *name) {
    static char path[300];
    snprintf(path, sizeof path, "%s/%s", sb_test_tmpdir(), name);
    return path;
}

static void write_input(const char *path, const char *text) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

/* Lines 1, 2, 5, 6 run; 3 is bad JSON; 4 is blank; 7 repeats line 1's custom_id. */
static const char input_text[] =
    "{\"custom_id\":\"a\",\"method\":\"POST\",\"url\":\"/v1/completions\",\"body\":{\"prompt\":\"1\"}}\n"
    "{\"custom_id\":\"b\",\"method\":\"POST\",\"url\":\"/v1/completions\",\"body\":{\"prompt\":\"2\"}}\r\n"
    "{oops\n"
    "   \n"
    "{\"custom_id\":\"c\",\"method\":\"POST\",\"url\":\"/v1/completions\",\"body\":{\"prompt\":\"3\"}}\n"
    "{\"custom_id\":\"d\",\"method\":\"POST\",\"url\":\"/v1/completions\",\"body\":{\"prompt\":\"4\"}}\n"
    "{\"custom_id\":\"a\",\"method\":\"POST\",\"url\":\"/v1/completions\",\"body\":{\"prompt\":\"5\"}}";

static void make_job(sb_batch_store *s, const char *id, const char *owner, const char *input) {
    sb_batch_job j = {.status = SB_BATCH_IN_PROGRESS};
    snprintf(j.id, sizeof j.id, "%s", id);
    snprintf(j.owner, sizeof j.owner, "%s", owner);
    snprintf(j.input_path, sizeof j.input_path, "%s", input);
    sb_error err;
    assert_int_equal(sb_batch_file_sha256(input, j.input_sha256, &j.input_size, &err), SB_OK);
    j.at[SB_BATCH_VALIDATING] = 100;
    j.at[SB_BATCH_IN_PROGRESS] = 101;
    if (sb_batch_prepare(s, &j, &err) != SB_OK)
        fail_msg("%s", err.msg);
}

static sb_status collect(void *user, const char *output, sb_error *err) {
    char *buf = user;
    strcat(buf, output);
    strcat(buf, "\n");
    return SB_OK;
}

static void test_store(void **state) {
    (void)state;
    const char *dir = state_dir("store");
    char input[400];
    mkdir(dir, 0700);
    snprintf(input, sizeof input, "%s/in.jsonl", dir);
    write_input(input, input_text);
    sb_batch_store *s;
    sb_error err;
    assert_int_equal(sb_batch_store_open(dir, &s, &err), SB_OK);
    make_job(s, "batch_1", "alice", input);

    sb_batch_job j;
    assert_int_equal(sb_batch_job_get(s, "batch_1", &j, &err), SB_OK);
    assert_int_equal(j.total, 6);
    assert_int_equal(j.failed, 2); /* the bad JSON and the duplicate */
    assert_int_equal(j.completed, 0);
    assert_int_equal(j.input_size, (int64_t)strlen(input_text));
    assert_int_equal(j.status, SB_BATCH_IN_PROGRESS);
    assert_int_equal(j.at[SB_BATCH_VALIDATING], 100);
    assert_string_equal(j.owner, "alice");
    sb_batch_job_clear(&j);
    assert_int_equal(sb_batch_job_get(s, "nope", &j, &err), SB_ERR_NOT_FOUND);

    sb_batch_item *items;
    int64_t n;
    assert_int_equal(sb_batch_pending(s, "batch_1", &items, &n, &err), SB_OK);
    assert_int_equal(n, 4);
    int64_t want_lines[] = {1, 2, 5, 6};
    for (int i = 0; i < 4; i++)
        assert_int_equal(items[i].line, want_lines[i]);
    assert_string_equal(items[1].custom_id, "b");
    assert_int_equal(items[1].length, (int64_t)strcspn(input_text + items[1].offset, "\r")); /* no \r */
    sb_batch_items_free(items, n);

    /* Results recorded out of order survive reopening; output is in line order. */
    assert_int_equal(sb_batch_record(s, "batch_1", 5, false, "L5", 1, 2, &err), SB_OK);
    assert_int_equal(sb_batch_record(s, "batch_1", 1, true, "L1", 0, 0, &err), SB_OK);
    sb_batch_store_close(s);
    assert_int_equal(sb_batch_store_open(dir, &s, &err), SB_OK);
    assert_int_equal(sb_batch_pending(s, "batch_1", &items, &n, &err), SB_OK);
    assert_int_equal(n, 2);
    assert_int_equal(items[0].line, 2);
    assert_int_equal(items[1].line, 6);
    sb_batch_items_free(items, n);
    assert_int_equal(sb_batch_job_get(s, "batch_1", &j, &err), SB_OK);
    assert_int_equal(j.completed, 1);
    assert_int_equal(j.failed, 3);
    assert_int_equal(j.completion_tokens, 2);
    assert_int_equal(j.computations, 2);
    sb_batch_job_clear(&j);
    static char out[4096];
    out[0] = '\0';
    assert_int_equal(sb_batch_outputs(s, "batch_1", 1, collect, out, &err), SB_OK);
    assert_string_equal(out, "L5\n");
    out[0] = '\0';
    assert_int_equal(sb_batch_outputs(s, "batch_1", 0, collect, out, &err), SB_OK);
    assert_non_null(strstr(out, "L1\n"));
    assert_true(strstr(out, "L1\n") < strstr(out, "invalid_json"));
    assert_true(strstr(out, "invalid_json") < strstr(out, "L5\n"));
    assert_true(strstr(out, "L5\n") < strstr(out, "duplicate_custom_id"));
    assert_non_null(strstr(out, "same as line 1's"));

    /* Statuses, listing by owner with a cursor, ids by status. */
    make_job(s, "batch_2", "bob", input);
    make_job(s, "batch_3", "alice", input);
    assert_int_equal(sb_batch_job_set_status(s, "batch_2", SB_BATCH_CANCELLING, 200, NULL, &err), SB_OK);
    assert_int_equal(sb_batch_job_set_status(s, "batch_2", SB_BATCH_FAILED, 201, "it broke", &err), SB_OK);
    assert_int_equal(sb_batch_job_get(s, "batch_2", &j, &err), SB_OK);
    assert_int_equal(j.status, SB_BATCH_FAILED);
    assert_int_equal(j.at[SB_BATCH_CANCELLING], 200);
    assert_int_equal(j.at[SB_BATCH_FAILED], 201);
    assert_string_equal(j.errors, "it broke");
    sb_batch_job_clear(&j);
    sb_batch_job *list;
    int32_t got;
    bool more;
    assert_int_equal(sb_batch_job_list(s, "alice", NULL, 1, &list, &got, &more, &err), SB_OK);
    assert_int_equal(got, 1);
    assert_true(more);
    assert_string_equal(list[0].id, "batch_3");
    sb_batch_job_clear(&list[0]);
    sb_free(list);
    assert_int_equal(sb_batch_job_list(s, "alice", "batch_3", 10, &list, &got, &more, &err), SB_OK);
    assert_int_equal(got, 1);
    assert_false(more);
    assert_string_equal(list[0].id, "batch_1");
    sb_batch_job_clear(&list[0]);
    sb_free(list);
    assert_int_equal(sb_batch_job_list(s, NULL, NULL, 10, &list, &got, &more, &err), SB_OK);
    assert_int_equal(got, 3);
    for (int i = 0; i < got; i++)
        sb_batch_job_clear(&list[i]);
    sb_free(list);
    char(*ids)[SB_BATCH_ID_MAX];
    int32_t n_ids;
    sb_batch_status running[] = {SB_BATCH_IN_PROGRESS};
    assert_int_equal(sb_batch_job_ids_in(s, running, 1, &ids, &n_ids, &err), SB_OK);
    assert_int_equal(n_ids, 2);
    assert_string_equal(ids[0], "batch_1");
    assert_string_equal(ids[1], "batch_3");
    sb_free(ids);

    /* An input with no request is refused, and leaves no job. */
    write_input(input, "\n  \n");
    sb_batch_job e = {.status = SB_BATCH_IN_PROGRESS};
    snprintf(e.id, sizeof e.id, "batch_empty");
    snprintf(e.input_path, sizeof e.input_path, "%s", input);
    assert_int_equal(sb_batch_prepare(s, &e, &err), SB_ERR_FORMAT);
    assert_non_null(strstr(err.msg, "no requests"));
    assert_int_equal(sb_batch_job_get(s, "batch_empty", &j, &err), SB_ERR_NOT_FOUND);
    sb_batch_store_close(s);
}

/* A fake endpoint: echoes the prompt; line "2"'s first two attempts get a 503. */
typedef struct fake {
    atomic_int calls, busy_left;
    atomic_bool *stop_after_first;
} fake;

static sb_status fake_exec(void *user, const char *url, const char *body, size_t len, const sb_gw_caller *caller,
                           int *status, char **json, sb_error *err) {
    fake *f = user;
    atomic_fetch_add(&f->calls, 1);
    assert_int_equal(caller->priority, SB_BATCH_PRIORITY);
    assert_string_equal(caller->tier, "batch");
    assert_int_equal(strncmp(caller->request_id, "req_", 4), 0);
    if (strstr(body, "\"2\"") && atomic_fetch_sub(&f->busy_left, 1) > 0) {
        *status = 503;
        *json = sb_strndup("{\"error\":{}}", 12);
        return SB_OK;
    }
    if (f->stop_after_first)
        atomic_store(f->stop_after_first, true);
    char text[200];
    snprintf(text, sizeof text, "{\"id\":\"cmpl-1\",\"echo\":%.*s,\"usage\":{\"completion_tokens\":3}}", (int)len, body);
    *status = strstr(body, "\"4\"") ? 400 : 200;
    *json = sb_strndup(text, strlen(text));
    return SB_OK;
}

static void test_runner(void **state) {
    (void)state;
    const char *dir = state_dir("runner");
    char input[400], out_path[400];
    mkdir(dir, 0700);
    snprintf(input, sizeof input, "%s/in.jsonl", dir);
    snprintf(out_path, sizeof out_path, "%s/out.jsonl", dir);
    write_input(input, input_text);
    sb_batch_store *s;
    sb_error err;
    assert_int_equal(sb_batch_store_open(dir, &s, &err), SB_OK);
    make_job(s, "batch_r", "", input);

    /* Stopped after the first answer: that one is recorded (or dropped), the rest stay to run. */
    atomic_bool stop = false;
    fake f = {.busy_left = 2, .stop_after_first = &stop};
    sb_batch_run_params p = {.store = s, .job_id = "batch_r", .exec = fake_exec, .exec_user = &f, .parallel = 1,
                             .priority = SB_BATCH_PRIORITY, .stop = &stop};
    sb_batch_progress prog;
    assert_int_equal(sb_batch_run(&p, &prog, &err), SB_OK);
    assert_int_equal(prog.computed, 0); /* the stop came with the answer: not recorded */
    sb_batch_item *items;
    int64_t n;
    assert_int_equal(sb_batch_pending(s, "batch_r", &items, &n, &err), SB_OK);
    assert_int_equal(n, 4);
    sb_batch_items_free(items, n);

    f.stop_after_first = NULL;
    atomic_store(&stop, false);
    p.parallel = 3;
    assert_int_equal(sb_batch_run(&p, &prog, &err), SB_OK);
    assert_int_equal(prog.computed, 4);
    assert_int_equal(prog.done, 6);
    assert_int_equal(prog.failed, 3); /* bad JSON, duplicate, the 400 */
    assert_int_equal(prog.completion_tokens, 12);
    assert_int_equal(atomic_load(&f.calls), 1 + 2 + 4); /* the dropped one, two 503s, four answers */

    assert_int_equal(sb_batch_write(s, "batch_r", 0, out_path, &err), SB_OK);
    size_t size;
    char *text = sb_test_read_file(out_path, &size);
    assert_non_null(text);
    int lines = 0;
    for (size_t i = 0; i < size; i++)
        lines += text[i] == '\n';
    assert_int_equal(lines, 6);
    assert_non_null(strstr(text, "\"custom_id\":\"b\",\"response\":{\"status_code\":200"));
    assert_non_null(strstr(text, "\"status_code\":400"));
    free(text);
    sb_batch_store_close(s);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_line_checks),
        cmocka_unit_test(test_output_lines),
        cmocka_unit_test(test_store),
        cmocka_unit_test(test_runner),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
