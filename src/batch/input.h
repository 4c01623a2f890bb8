/*
 * input.h - one line of a batch input file, and one line of its output, in
 * the OpenAI Batch API's JSONL formats.
 *
 * Input: {"custom_id": "...", "method": "POST", "url": "/v1/chat/completions",
 * "body": {...}}. sb_batch_line_check says whether a line can run and, if
 * not, why (a code and a message naming the line and field). Output:
 * {"id": "batch_req_...", "custom_id": ..., "response": {"status_code",
 * "request_id", "body"} | null, "error": {"code", "message", "line"} | null}.
 *
 * Every id in an output line derives from the job's id and the line number
 * (sb_batch_ids), so a job that was killed and resumed writes the bytes an
 * uninterrupted run writes.
 */
#ifndef SB_BATCH_INPUT_H
#define SB_BATCH_INPUT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "switchboard.h"

/* The endpoints a batch line may name (OpenAI's batch endpoints). */
bool sb_batch_url_ok(const char *url);

typedef struct sb_batch_line {
    char *custom_id;   /* sb_malloc'd; NULL when the line has none (or it is not a string) */
    char url[32];      /* a batch endpoint when ok */
    char *body;        /* ok: the body object's JSON text (sb_malloc'd) */
    bool ok;
    char code[32];     /* !ok: invalid_json, missing_custom_id, invalid_method, invalid_url, ... */
    char message[400]; /* !ok: what is wrong, naming the line and the field */
} sb_batch_line;

/* Checks line number `line_no` (1-based; its text is s[0..len), without the
 * newline). `endpoint` non-NULL: every line must name that url (a server
 * batch's endpoint). Returns out->ok; out is filled either way and freed
 * with sb_batch_line_free. Only memory exhaustion is an sb_status failure. */
sb_status sb_batch_line_check(const char *s, size_t len, int64_t line_no, const char *endpoint, sb_batch_line *out,
                              sb_error *err);
void sb_batch_line_free(sb_batch_line *l);

/* The ids of line `line_no` of job `job_id`: "batch_req_<hex>" (the output
 * line), "req_<hex>" (the response's request id) and the hex itself (24
 * digits, for the response body's id), all from SHA-256(job id, line). */
typedef struct sb_batch_ids {
    char hex[25];
    char line_id[40];
    char request_id[32];
} sb_batch_ids;
void sb_batch_ids_make(const char *job_id, int64_t line_no, sb_batch_ids *out);

/* The output line (no newline; sb_malloc'd) for a response: `status` and
 * `response_json` as the endpoint answered. The body's "id" becomes
 * "<its prefix>-<ids.hex>" so reruns agree. *completion_tokens and
 * *prompt_tokens are its usage (0 when it has none). NULL: out of memory. */
char *sb_batch_output_response(const sb_batch_ids *ids, const char *custom_id, int status, const char *response_json,
                               int64_t *prompt_tokens, int64_t *completion_tokens);
/* The output line for a request that could not run (response null). */
char *sb_batch_output_error(const sb_batch_ids *ids, const char *custom_id, int64_t line_no, const char *code,
                            const char *message);

/* SHA-256 of a whole file as 64 hex digits, and its size. */
sb_status sb_batch_file_sha256(const char *path, char hex[65], int64_t *size, sb_error *err);

#endif
