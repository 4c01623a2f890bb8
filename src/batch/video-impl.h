/*
 * video-impl.h - what the files of the video job share (see video.h):
 * subprocesses, the state store, the captioners and the summariser.
 */
#ifndef SB_VIDEO_IMPL_H
#define SB_VIDEO_IMPL_H

#include <pthread.h>
#include <sqlite3.h>

#include "batch/video.h"

/* ---- subprocesses (video_proc.c) ------------------------------------------- */

/* What a finished child left: its stdout and stderr (NUL-terminated,
 * sb_malloc'd, each cut at 1 MiB), how it ended. */
typedef struct sb_video_proc {
    char *out, *errout;
    int status;     /* exit status when exited */
    bool exited;    /* false: killed by a signal (or by the timeout) */
    bool timed_out;
} sb_video_proc;

/* Runs argv[0] (looked up on PATH) with argv, stdin from /dev/null, no
 * shell, and waits at most timeout_s (then kills it). Fails only when it
 * cannot be started (err names the program); how it ended is in *out.
 * Safe to call from several threads. */
sb_status sb__video_spawn(char *const *argv, double timeout_s, sb_video_proc *out, sb_error *err);
void sb__video_proc_free(sb_video_proc *p);
/* The last non-empty line of a child's stderr (ffmpeg puts the reason
 * there), trimmed, into out. */
void sb__video_last_line(const char *text, char *out, size_t cap);

/* ---- state (video_store.c) --------------------------------------------------- */

typedef enum sb_video_state {
    SB_VIDEO_NEW = 0,
    SB_VIDEO_EXTRACTED = 1, /* keyframes recorded; captions as they complete */
    SB_VIDEO_DONE = 2,      /* summary or error recorded: its line is final */
} sb_video_state;

typedef struct sb_video_kf {
    double time, score;
    char *file;    /* the image under the state dir */
    char *caption; /* NULL until captioned */
    char *error;   /* the last captioning error, NULL if none */
} sb_video_kf;

/* One video as the stages pass it along. */
typedef struct sb_video_item {
    int32_t idx;
    char *path;
    sb_video_state state;
    double duration; /* < 0 unknown */
    sb_video_kf *kf;
    int32_t n_kf;
    char *summary;
    char *error_stage, *error; /* a failure of the video: the stage and message */
    int32_t llm_calls;
    struct sb_video_item *next; /* queue link */
} sb_video_item;
void sb__video_item_free(sb_video_item *v);
/* Records the video as failed at `stage` with a printf-style message. */
void sb__video_item_fail(sb_video_item *v, const char *stage, const char *fmt, ...) SB_PRINTF(3, 4);

typedef struct sb_video_store {
    sqlite3 *db;
    pthread_mutex_t mu; /* the stages share the connection */
    char *frames_dir;   /* state-dir/frames */
} sb_video_store;

/* Opens state-dir/video.db and checks it belongs to this job: a state
 * without a job takes `fingerprint` (the input list and the options that
 * decide the results); a different one is refused, err naming the first
 * line that differs. */
sb_status sb__video_store_open(sb_video_store *s, const char *state_dir, const char *fingerprint, sb_error *err);
void sb__video_store_close(sb_video_store *s);
/* Fills v (idx and path set) from what is recorded: state, duration,
 * keyframes with their captions, summary or error. */
sb_status sb__video_store_load(sb_video_store *s, sb_video_item *v, sb_error *err);
/* Commits v's keyframes (state EXTRACTED) and duration in one transaction. */
sb_status sb__video_store_extracted(sb_video_store *s, const sb_video_item *v, sb_error *err);
/* Commits keyframe k's caption (or its error). */
sb_status sb__video_store_caption(sb_video_store *s, const sb_video_item *v, int32_t k, sb_error *err);
/* Commits the final state: summary or error (state DONE). */
sb_status sb__video_store_done(sb_video_store *s, const sb_video_item *v, sb_error *err);

/* ---- keyframes (video_frames.c) --------------------------------------------- */

/* Probes v->path and extracts its keyframes into dir (made, emptied first),
 * filling v->duration and v->kf. A video ffprobe/ffmpeg cannot read fails
 * the video (sb__video_item_fail), not the job: the return is SB_OK then;
 * only a missing ffmpeg or an unwritable dir is an error. */
sb_status sb__video_extract(const sb_video_params *p, sb_video_item *v, const char *dir, sb_error *err);

/* ---- captions (video_caption.c) --------------------------------------------- */

typedef struct sb_video_captioner sb_video_captioner;
sb_status sb__video_captioner_create(const sb_video_params *p, sb_video_captioner **out, sb_error *err);
void sb__video_captioner_free(sb_video_captioner *c);
/* The caption of the image at `file`: *caption sb_malloc'd (trimmed,
 * never empty), or an error saying what the captioner did. */
sb_status sb__video_caption(sb_video_captioner *c, const char *file, char **caption, sb_error *err);

/* ---- summaries (video_summary.c) -------------------------------------------- */

/* Summarises v's captioned keyframes into v->summary (map-reduce when they
 * do not fit), counting requests in v->llm_calls; a failure of the model
 * fails the video. */
sb_status sb__video_summarize(const sb_video_params *p, const sb_video_llm *llm, sb_video_item *v, sb_error *err);

#endif
