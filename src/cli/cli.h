/*
 * cli.h - shared pieces of the `switchboard` command: the subcommand entry
 * points and strict option-value parsing (a bad value is one clear line on
 * stderr and exit status 2, never a silent default).
 */
#ifndef SB_CLI_H
#define SB_CLI_H

#include <stdbool.h>
#include <stdint.h>

#include "switchboard.h"

int sb_cmd_run(int argc, char **argv);
int sb_cmd_info(int argc, char **argv);
int sb_cmd_tokenize(int argc, char **argv);
int sb_cmd_gen_model(int argc, char **argv);

/* Exit status for usage errors (bad option or value). */
#define SB_EXIT_USAGE 2

/* Prints "switchboard: error: ..." and returns 1 (for `return sb_cli_error(...)`). */
int sb_cli_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* If argv[*i] is `name`, consumes it and its value into *value and returns
 * true; exits with a usage error if the value is missing. */
bool sb_cli_opt(int argc, char **argv, int *i, const char *name, const char **value);
/* `--` ends a command's options, as POSIX utilities do: if argv[i] is `--`,
 * returns true (the option loop then stops) and sets *operands to i + 1,
 * from where every argument is an operand, even one starting with '-'.
 * Commands that take no operands pass NULL: an argument after `--` is then
 * a usage error naming it. */
bool sb_cli_end_of_options(int argc, char **argv, int i, int *operands);
/* Parse a whole string as a number, or exit with a usage error naming opt. */
int64_t sb_cli_int(const char *opt, const char *value, int64_t min, int64_t max);
float sb_cli_float(const char *opt, const char *value);
/* "f32" or "f16" (--cache-type), or exit with a usage error naming opt. */
sb_cache_type sb_cli_cache_type(const char *opt, const char *value);

/* A whole file as a NUL-terminated string (sb_malloc'd, freed with
 * sb_free), or NULL if it cannot be read. */
char *sb_cli_read_file(const char *path);

/* Seconds from a monotonic clock. */
double sb_cli_now(void);

/* `switchboard batch --summarize ...`: the video pipeline (cmd_summarize.c). */
int sb_cli_batch_summarize(int argc, char **argv);

#endif
