/*
 * test_base.c - the contracts src/base keeps for the rest: a failed
 * SB_ASSERT reaches the log callback with file and line and then the abort
 * hook, in every build type (this file may be built with NDEBUG: the check
 * stays); aligned blocks are aligned and go through the allocator hook;
 * so do cJSON's allocations, and a failed one is counted;
 * sb__alloc_measure counts what a thread allocates, nested.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>
#include <cjson/cJSON.h>

#include "base/base.h"
#include "testutil.h"

static jmp_buf escape;
static char logged[512], aborted[512];
static int logged_level = -1;

static void on_log(void *user, int level, const char *line) {
    (void)user;
    logged_level = level;
    snprintf(logged, sizeof(logged), "%s", line);
}

static void on_abort(const char *msg) {
    snprintf(aborted, sizeof(aborted), "%s", msg);
    longjmp(escape, 1);
}

static const int check_line = __LINE__ + 2; /* the SB_ASSERT below */
static int check_positive(int x) {
    SB_ASSERT(x > 0);
    return x;
}

static void test_assert_reports_and_aborts(void **state) {
    (void)state;
    sb_set_log_callback(on_log, NULL);
    sb_set_abort_hook(on_abort);
    assert_int_equal(check_positive(3), 3);
    assert_int_equal(logged_level, -1); /* a check that holds says nothing */
    if (setjmp(escape) == 0) {
        check_positive(-1);
        fail_msg("SB_ASSERT returned");
    }
    char want[256];
    snprintf(want, sizeof(want), "test_base.c:%d: check failed: x > 0", check_line);
    assert_non_null(strstr(logged, want));
    assert_int_equal(logged_level, SB_LOG_ERROR);
    assert_string_equal(aborted, logged);
    sb_set_abort_hook(NULL);
    sb_set_log_callback(NULL, NULL);
}

static void *refuse(size_t size, void *user) {
    (void)size, (void)user;
    return NULL;
}
static void *refuse_realloc(void *ptr, size_t size, void *user) {
    (void)ptr, (void)size, (void)user;
    return NULL;
}
static void never_free(void *ptr, void *user) { (void)ptr, (void)user; }

static void test_json_through_hook(void **state) {
    (void)state;
    sb_test_count_allocs_begin();
    cJSON *v = cJSON_Parse("{\"models\": [1, 2, \"three\"]}");
    assert_non_null(v);
    assert_true(sb_test_live_bytes() > 0);
    char *text = cJSON_PrintUnformatted(v);
    assert_string_equal(text, "{\"models\":[1,2,\"three\"]}");
    cJSON_free(text);
    cJSON_Delete(v);
    assert_int_equal(sb_test_live_bytes(), 0);
    sb_test_count_allocs_end();

    /* A parse that fails for want of memory is told apart from bad JSON. */
    const sb_allocator none = {refuse, refuse_realloc, never_free, NULL};
    uint64_t before = sb__alloc_failures();
    sb_set_allocator(&none);
    assert_null(cJSON_Parse("[1]"));
    sb_set_allocator(NULL);
    assert_true(sb__alloc_failures() > before);
    before = sb__alloc_failures();
    assert_null(cJSON_Parse("[1,"));
    assert_int_equal(sb__alloc_failures(), before);
}

static void test_aligned_alloc_through_hook(void **state) {
    (void)state;
    sb_test_count_allocs_begin();
    void *p[8];
    for (int i = 0; i < 8; i++) {
        size_t align = (size_t)8 << i;
        p[i] = sb_aligned_alloc(align, 100 + (size_t)i);
        assert_non_null(p[i]);
        assert_int_equal((uintptr_t)p[i] % align, 0);
        memset(p[i], 0xab, 100 + (size_t)i);
    }
    assert_true(sb_test_live_bytes() >= 8 * 100);
    for (int i = 0; i < 8; i++)
        sb_aligned_free(p[i]);
    assert_int_equal(sb_test_live_bytes(), 0);
    sb_aligned_free(NULL);
    sb_test_count_allocs_end();
    assert_null(sb_aligned_alloc(24, 8)); /* not a power of two */
    assert_null(sb_aligned_alloc(64, SIZE_MAX - 8));
}

static void test_alloc_measure_nests(void **state) {
    (void)state;
    size_t outer = 0, inner = 0;
    assert_null(sb__alloc_measure(&outer));
    void *a = sb_malloc(100);
    size_t *prev = sb__alloc_measure(&inner);
    assert_ptr_equal(prev, &outer);
    void *b = sb_calloc(10, 20);
    assert_ptr_equal(sb__alloc_measure(prev), &inner);
    void *c = sb_malloc(7);
    assert_ptr_equal(sb__alloc_measure(NULL), &outer);
    void *d = sb_malloc(1000); /* not counted */
    assert_int_equal(inner, 200);
    assert_int_equal(outer, 107);
    sb_free(a);
    sb_free(b);
    sb_free(c);
    sb_free(d);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_assert_reports_and_aborts),
        cmocka_unit_test(test_aligned_alloc_through_hook),
        cmocka_unit_test(test_json_through_hook),
        cmocka_unit_test(test_alloc_measure_nests),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
