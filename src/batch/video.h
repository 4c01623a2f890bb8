/*
 * video.h - the video summarisation job (`switchboard batch --summarize`):
 * for each video, keyframes by ffmpeg's scene-change detection (always the
 * first frame, a minimum gap, a cap), a caption per keyframe from a
 * configurable captioner (a command or an OpenAI-compatible vision endpoint),
 * then a summary of the timestamped captions by the language model,
 * map-reduce when they do not fit its context. One JSON line per video, in
 * input order.
 *
 * The three stages run as a pipeline (video.c): one thread each, bounded
 * queues between them, so decoding and captioning of later videos overlap
 * with generation for earlier ones. Everything a stage finishes is committed
 * to state-dir/video.db (video_store.c) as it completes: a killed run,
 * started again with the same input and options, extracts, captions and
 * summarises only what was not recorded.
 *
 * The language model is reached through sb_video_llm, a callback that runs
 * one /v1/chat/completions body (the CLI passes the in-process server, at
 * the batch priority; tests may pass anything), so nothing here depends on
 * the server.
 *
 * Files: video.c (the pipeline, progress, output), video_frames.c (ffprobe,
 * ffmpeg, the scene list, keyframe selection), video_caption.c (the
 * captioners), video_summary.c (prompts, chunking, map-reduce),
 * video_store.c (SQLite state), video_proc.c (subprocesses).
 */
#ifndef SB_VIDEO_H
#define SB_VIDEO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "switchboard.h"

/* ---- the language model ---------------------------------------------------- */

typedef struct sb_video_llm {
    /* Runs one /v1/chat/completions request body; on SB_OK *response is the
     * response JSON (sb_malloc'd, the caller frees it) and *http_status its
     * status, the answer an OpenAI error object unless 200 (503: busy or
     * loading, retried). Called from several threads at once. */
    sb_status (*complete)(void *user, const char *body, int *http_status, char **response, sb_error *err);
    /* Prompt tokens `messages_json` (a JSON array of chat messages) takes
     * once rendered by the model's chat template, and tokens plain `text`
     * takes; < 0 when it cannot be counted (an error then). */
    int32_t (*count_chat)(void *user, const char *messages_json);
    int32_t (*count_text)(void *user, const char *text);
    void *user;
    const char *model;  /* the "model" of every request */
    int32_t n_ctx;      /* the context the model runs with */
} sb_video_llm;

/* ---- options ----------------------------------------------------------------- */

typedef struct sb_video_params {
    const char *input;        /* a directory (its video files, sorted) or a list file (one path a line) */
    const char *output;       /* OUT.jsonl */
    const char *state_dir;    /* video.db and frames/ */
    const char *captioner;    /* a command line, or an http(s):// vision chat endpoint */
    const char *captioner_model; /* HTTP: the request's "model" */
    const char *captioner_key;   /* HTTP: the bearer key; NULL: none */
    const char *captioner_prompt; /* what the captioner is asked (HTTP) */
    double captioner_timeout_s;  /* per keyframe (command) or per attempt (HTTP) */
    int32_t captioner_retries;   /* HTTP 429/5xx and transport errors: attempts after the first */
    int32_t caption_parallel;    /* keyframes of a video captioned at once (at most 64) */
    double scene_threshold;   /* ffmpeg's scene score above which a frame is a scene change (0..1) */
    double min_gap_s;         /* keyframes at least this far apart */
    int32_t max_keyframes;    /* per video; the strongest changes are kept */
    int32_t frame_width;      /* keyframe images are scaled to this width (pixels) */
    double ffmpeg_timeout_s;  /* per ffprobe/ffmpeg run */
    int32_t summary_tokens;   /* max_tokens of each summary request */
    int32_t queue_depth;      /* videos waiting between two stages */
    bool progress_tty;        /* a live status line (a terminal) rather than plain lines */
    FILE *progress;           /* where progress goes (stderr); NULL: nowhere */
} sb_video_params;
sb_video_params sb_video_default_params(void);

/* What a run did: the job's figures, for the final summary and tests. */
typedef struct sb_video_report {
    int32_t videos, ok, failed;
    int32_t extracted, captioned, summarized;     /* work done in this run (not resumed from the state) */
    int32_t keyframes, caption_errors, llm_calls; /* in this run */
    double busy_s[3];                             /* extract, caption, summarise: time spent working */
    double wall_s;
} sb_video_report;

/* Runs the whole job; SB_OK when every video has its line in the output
 * (failed videos included). Errors: the input cannot be read, the state is
 * another job's (a changed input list or options), the output cannot be
 * written, ffmpeg/ffprobe missing. */
sb_status sb_video_run(const sb_video_params *p, const sb_video_llm *llm, sb_video_report *report, sb_error *err);

/* ---- pieces, exposed for the unit tests ------------------------------------ */

/* A frame ffmpeg's select filter let through: its time and scene score. */
typedef struct sb_video_cand {
    double time;
    double score;
} sb_video_cand;

/* Parses what `-vf select=...,metadata=print:file=-` prints ("frame:N pts:P
 * pts_time:T" lines, each followed by "lavfi.scene_score=S"): one candidate
 * per frame, in output order, the i-th being the (i+1)-th image file. The
 * first frame's score is taken as +infinity (it is always kept). *out is
 * sb_malloc'd. A line that does not parse fails naming its line number. */
sb_status sb__video_parse_scenes(const char *text, sb_video_cand **out, int32_t *n, sb_error *err);

/* Chooses keyframes among n candidates: the strongest first (the first frame
 * above all), each kept only if it is at least min_gap_s from every one kept
 * so far, until max are kept. Writes the kept indices, in time order, to
 * keep (n entries of room) and returns how many. */
int32_t sb__video_select(const sb_video_cand *c, int32_t n, double min_gap_s, int32_t max, int32_t *keep);

/* Packs items of the given costs, in order, into consecutive chunks whose
 * total is at most budget (an item over the budget alone in its chunk).
 * Writes each chunk's first index to starts (n entries of room); returns
 * the number of chunks (0 for no items). */
int32_t sb__video_chunk(const int32_t *cost, int32_t n, int32_t budget, int32_t *starts);

/* "[mm:ss]" or "[h:mm:ss]" for a time in seconds (rounded down). */
void sb__video_stamp(double t, char *out, size_t cap);

/* Splits a command line into words: blanks separate, '...' and "..." quote,
 * a backslash escapes the next character; no other shell syntax. *argv is
 * sb_malloc'd, NULL-terminated, its strings in the same block: one sb_free.
 * Fails on an unterminated quote or an empty line. */
sb_status sb__video_split_command(const char *line, char ***argv, int32_t *argc, sb_error *err);

#endif
