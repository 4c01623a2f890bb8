/*
 * testutil.h - helpers shared by the unit tests: fixture paths, whole-file
 * reads, and a counting allocator for peak-heap checks.
 */
#ifndef SB_TESTUTIL_H
#define SB_TESTUTIL_H

#include <stddef.h>
#include <stdint.h>

/* Path of a file under the fixtures directory (../shared), e.g.
 * "models/stories260K.gguf". Fails the test, naming the path, if the
 * fixture is missing. Returned string is static (overwritten next call). */
const char *sb_test_fixture(const char *relpath);

/* Reads a whole file; NULL if it cannot. Caller frees with free(). */
char *sb_test_read_file(const char *path, size_t *size);

/* Counting allocator installed through sb_set_allocator. */
void sb_test_count_allocs_begin(void);
/* Uninstalls it; returns the peak number of live heap bytes since begin. */
size_t sb_test_count_allocs_end(void);
size_t sb_test_live_bytes(void);

/* A test that cannot run its comparison here (a CPU without the SIMD
 * level, a missing peer library): says why on stderr, remembers it and
 * skips (cmocka's skip). Mains return sb_test_exit(cmocka's result), which
 * is SB_TEST_SKIPPED when all passed but something was skipped, so that
 * CTest reports the executable as skipped (SKIP_RETURN_CODE), not passed. */
#define SB_TEST_SKIPPED 77
#define SB_TEST_SKIP(why)                       \
    do {                                        \
        sb_test_note_skip(__func__, (why));     \
        skip();                                 \
    } while (0)
void sb_test_note_skip(const char *test, const char *why);
int sb_test_exit(int failures);

/* Directory for temporary files of this test: created on demand, removed
 * with its contents when the process exits. */
const char *sb_test_tmpdir(void);


/* Runs the switchboard binary ($SB_BIN) with argv (NULL-terminated, without
 * the program name); captures stdout and stderr into malloc'd strings the
 * caller frees. Returns the exit status (128+signal if killed). */
int sb_test_run_cli(const char *const *args, char **out, char **err);

#endif
