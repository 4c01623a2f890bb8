/*
 * video_frames.c - a video's keyframes: ffprobe reads its duration (and
 * refuses what is no video), then one ffmpeg pass decodes it with
 *     select='eq(n,0)+gt(scene,T)', metadata=print:file=-, scale=W:-2
 * writing every frame that passes (the first frame and each scene change)
 * as a small JPEG and printing its pts_time and scene score on stdout. The
 * candidates are then thinned (sb__video_select: strongest first, a minimum
 * gap, a cap; the first frame always), the kept files renamed kf_NNNN.jpg and
 * the others removed. One decode, however many scene changes.
 *
 * Thinning by strength rather than spreading evenly: a cap is for videos with
 * many cuts, and the strongest changes are the ones a summary needs; the
 * gap stops a flicker or a fade from spending the cap on one moment.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "base/base.h"
#include "batch/video-impl.h"

sb_status sb__video_parse_scenes(const char *text, sb_video_cand **out, int32_t *n, sb_error *err) {
    *out = NULL;
    *n = 0;
    int32_t cap = 0, line = 0;
    sb_video_cand *c = NULL;
    for (const char *p = text; *p;) {
        const char *eol = strchr(p, '\n');
        size_t len = eol ? (size_t)(eol - p) : strlen(p);
        line++;
        char buf[256];
        size_t m = SB_MIN(len, sizeof buf - 1);
        memcpy(buf, p, m);
        buf[m] = '\0';
        p += len + (eol != NULL);
        const char *pt = strstr(buf, "pts_time:");
        if (strncmp(buf, "frame:", 6) == 0) {
            char *end = NULL;
            double t = pt ? strtod(pt + 9, &end) : NAN;
            if (!pt || end == pt + 9 || !isfinite(t)) {
                sb_free(c);
                return sb_fail(err, SB_ERR_FORMAT, "ffmpeg's frame list, line %d: no pts_time in '%.80s'", line, buf);
            }
            if (*n == cap) {
                cap = cap ? cap * 2 : 16;
                sb_video_cand *q = sb_realloc(c, (size_t)cap * sizeof *c);
                if (!q) {
                    sb_free(c);
                    return sb_fail(err, SB_ERR_NOMEM, "out of memory for %d frames", cap);
                }
                c = q;
            }
            c[*n] = (sb_video_cand){.time = t, .score = *n == 0 ? INFINITY : 0};
            ++*n;
        } else if (strncmp(buf, "lavfi.scene_score=", 18) == 0) {
            char *end;
            double s = strtod(buf + 18, &end);
            if (*n == 0 || end == buf + 18 || !isfinite(s)) {
                sb_free(c);
                return sb_fail(err, SB_ERR_FORMAT, "ffmpeg's frame list, line %d: '%.80s' %s", line, buf,
                               *n == 0 ? "comes before any frame" : "is no score");
            }
            if (*n > 1)
                c[*n - 1].score = s;
        }
        /* anything else ffmpeg prints there (other metadata keys) is not ours */
    }
    *out = c;
    return SB_OK;
}

typedef struct ranked {
    int32_t i;
    double score, time;
} ranked;

static int by_strength(const void *a, const void *b) {
    const ranked *x = a, *y = b;
    if (x->score != y->score)
        return x->score > y->score ? -1 : 1;
    return x->time < y->time ? -1 : x->time > y->time; /* equal scores: the earlier first */
}

static int by_index(const void *a, const void *b) { return *(const int32_t *)a - *(const int32_t *)b; }

int32_t sb__video_select(const sb_video_cand *c, int32_t n, double min_gap_s, int32_t max, int32_t *keep) {
    ranked *r = n > 0 ? sb_malloc((size_t)n * sizeof *r) : NULL;
    if (!r)
        return 0;
    for (int32_t i = 0; i < n; i++)
        r[i] = (ranked){i, c[i].score, c[i].time};
    qsort(r, (size_t)n, sizeof *r, by_strength);
    int32_t k = 0;
    for (int32_t i = 0; i < n && k < max; i++) {
        bool near = false;
        for (int32_t j = 0; j < k && !near; j++)
            near = fabs(c[keep[j]].time - r[i].time) < min_gap_s;
        if (!near)
            keep[k++] = r[i].i;
    }
    sb_free(r);
    qsort(keep, (size_t)k, sizeof *keep, by_index); /* candidates come in time order */
    return k;
}

void sb__video_stamp(double t, char *out, size_t cap) {
    long s = t > 0 ? (long)t : 0;
    if (s >= 3600)
        snprintf(out, cap, "[%ld:%02ld:%02ld]", s / 3600, s / 60 % 60, s % 60);
    else
        snprintf(out, cap, "[%02ld:%02ld]", s / 60, s % 60);
}

/* Empties dir of the files a killed run may have left (it has no
 * subdirectories), making it when missing. */
static sb_status clean_dir(const char *dir, sb_error *err) {
    if (mkdir(dir, 0700) != 0 && errno != EEXIST)
        return sb_fail(err, SB_ERR_IO, "%s: cannot create: %s", dir, strerror(errno));
    DIR *d = opendir(dir);
    if (!d)
        return sb_fail(err, SB_ERR_IO, "%s: cannot read: %s", dir, strerror(errno));
    struct dirent *e;
    char path[4096];
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.')
            continue;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        unlink(path);
    }
    closedir(d);
    return SB_OK;
}

/* Why a tool failed on the video, from its stderr's last line. */
static void tool_failed(sb_video_item *v, const char *stage, const char *tool, const sb_video_proc *pr,
                        double timeout_s) {
    char why[300];
    sb__video_last_line(pr->errout, why, sizeof why);
    if (pr->timed_out)
        sb__video_item_fail(v, stage, "%s did not finish in %g s", tool, timeout_s);
    else
        sb__video_item_fail(v, stage, "%s cannot read the video (exit status %d): %s", tool, pr->status,
                            *why ? why : "no message");
}

/* ffprobe: the duration, and whether there is a video stream at all. */
static sb_status probe(const sb_video_params *p, sb_video_item *v, sb_error *err) {
    /* "file:" keeps a name like "-x" or "http:..." a local file's. */
    char fileurl[4200];
    snprintf(fileurl, sizeof fileurl, "file:%s", v->path);
    char *argv[] = {"ffprobe", "-v", "error", "-show_entries", "stream=codec_type:format=duration", "-of", "json",
                    fileurl, NULL};
    sb_video_proc pr;
    sb_status st = sb__video_spawn(argv, p->ffmpeg_timeout_s, &pr, err);
    if (st != SB_OK)
        return st;
    if (!pr.exited || pr.status != 0) {
        tool_failed(v, "probe", "ffprobe", &pr, p->ffmpeg_timeout_s);
        sb__video_proc_free(&pr);
        return SB_OK;
    }
    cJSON *root = cJSON_Parse(pr.out);
    sb__video_proc_free(&pr);
    const cJSON *streams = cJSON_GetObjectItemCaseSensitive(root, "streams"), *s;
    bool video = false;
    cJSON_ArrayForEach(s, streams) {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(s, "codec_type");
        video |= cJSON_IsString(type) && strcmp(type->valuestring, "video") == 0;
    }
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(root, "format");
    const cJSON *dur = cJSON_GetObjectItemCaseSensitive(fmt, "duration");
    v->duration = cJSON_IsString(dur) ? strtod(dur->valuestring, NULL) : -1;
    if (!root)
        sb__video_item_fail(v, "probe", "ffprobe's answer is not JSON");
    else if (!video)
        sb__video_item_fail(v, "probe", "the file has no video stream");
    cJSON_Delete(root);
    return SB_OK;
}

sb_status sb__video_extract(const sb_video_params *p, sb_video_item *v, const char *dir, sb_error *err) {
    sb_status st = probe(p, v, err);
    if (st != SB_OK || v->error)
        return st;
    if ((st = clean_dir(dir, err)) != SB_OK)
        return st;
    char filter[256], pattern[4200], fileurl[4200];
    snprintf(filter, sizeof filter, "select='eq(n\\,0)+gt(scene\\,%.4f)',metadata=print:file=-,scale=%d:-2",
             p->scene_threshold, (int)p->frame_width);
    snprintf(pattern, sizeof pattern, "%s/c%%05d.jpg", dir);
    snprintf(fileurl, sizeof fileurl, "file:%s", v->path);
    char *argv[] = {"ffmpeg", "-nostdin", "-hide_banner", "-loglevel", "error", "-i", fileurl, "-map", "0:v:0",
                    "-vf", filter, "-fps_mode", "vfr", "-q:v", "4", "-f", "image2", pattern, NULL};
    sb_video_proc pr;
    if ((st = sb__video_spawn(argv, p->ffmpeg_timeout_s, &pr, err)) != SB_OK)
        return st;
    sb_video_cand *c = NULL;
    int32_t n = 0;
    if (!pr.exited || pr.status != 0) {
        tool_failed(v, "extract", "ffmpeg", &pr, p->ffmpeg_timeout_s);
    } else {
        sb_error perr;
        if (sb__video_parse_scenes(pr.out, &c, &n, &perr) != SB_OK)
            sb__video_item_fail(v, "extract", "%s", perr.msg);
        else if (n == 0)
            sb__video_item_fail(v, "extract", "ffmpeg decoded no frame of the video");
    }
    sb__video_proc_free(&pr);
    if (v->error) {
        sb_free(c);
        return SB_OK;
    }
    int32_t *keep = sb_malloc((size_t)n * sizeof *keep);
    v->kf = keep ? sb_calloc((size_t)n, sizeof *v->kf) : NULL;
    if (!v->kf) {
        sb_free(keep);
        sb_free(c);
        return sb_fail(err, SB_ERR_NOMEM, "out of memory for %d keyframes", n);
    }
    int32_t k = sb__video_select(c, n, p->min_gap_s, p->max_keyframes, keep);
    char from[4200], to[4200];
    for (int32_t i = 0, j = 0; i < n && st == SB_OK; i++) {
        snprintf(from, sizeof from, "%s/c%05d.jpg", dir, (int)i + 1);
        if (j < k && keep[j] == i) {
            snprintf(to, sizeof to, "%s/kf%04d.jpg", dir, (int)j);
            sb_video_kf *f = &v->kf[j++];
            f->time = c[i].time;
            f->score = c[i].score;
            f->file = sb_strndup(to, strlen(to));
            if (!f->file)
                st = sb_fail(err, SB_ERR_NOMEM, "out of memory");
            else if (rename(from, to) != 0)
                st = sb_fail(err, SB_ERR_IO, "%s: ffmpeg wrote no such frame: %s", from, strerror(errno));
            v->n_kf = j;
        } else {
            unlink(from);
        }
    }
    sb_free(keep);
    sb_free(c);
    return st;
}
