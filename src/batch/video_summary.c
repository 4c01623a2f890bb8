/*
 * video_summary.c - a video's summary from its timestamped captions, by the
 * language model, map-reduce when they do not fit its context.
 *
 * The items are lines: "[00:12] a red car ..." for captions, then
 * "[00:00-00:30] ..." for the summaries of consecutive parts. Every request
 * is a system message and one user message (an instruction, then the
 * items); what the template and instruction take is measured with the
 * model's own tokenizer and chat template (sb_video_llm.count_chat), each
 * item with the tokenizer (count_text, plus one for its newline). With a
 * context of C tokens, O for the frame and S for the answer (max_tokens:
 * --summary-tokens, at most a third of what the frame leaves), a request
 * holds B = C - O - S tokens of items. When all items fit in B, one request
 * summarises the video. Otherwise they are packed in order into chunks of
 * at most B (sb__video_chunk), each chunk is summarised, and the chunk
 * summaries become the items of the next round: a summary of summaries,
 * recursively. No item may take more than B/2 (longer ones are cut), so
 * every chunk holds at least two items and each round at least halves them:
 * the rounds end. The chunks of a round are asked concurrently (up to four
 * at once), so the scheduler batches them.
 */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include <cjson/cJSON.h>

#include "base/base.h"
#include "batch/video-impl.h"

int32_t sb__video_chunk(const int32_t *cost, int32_t n, int32_t budget, int32_t *starts) {
    int32_t chunks = 0, used = 0;
    for (int32_t i = 0; i < n; i++) {
        if (i == 0 || used + cost[i] > budget) {
            starts[chunks++] = i;
            used = 0;
        }
        used += cost[i];
    }
    return chunks;
}

typedef struct item {
    double t0, t1;
    char *text; /* the line without its stamp */
} item;

static const char system_prompt[] = "You summarise videos.";
/* [captions or part summaries][the whole video or a part] */
static const char *const instructions[2][2] = {
    {"Keyframe descriptions of a video, with times. Summarise the video.",
     "Keyframe descriptions of part of a video, with times. Summarise this part."},
    {"Summaries of consecutive parts of a video, with times. Summarise the whole video.",
     "Summaries of consecutive parts of a video, with times. Summarise them as one."},
};

/* "[mm:ss]" or "[mm:ss-mm:ss]" then the text. */
static char *item_line(const item *it) {
    char a[32], b[32];
    sb__video_stamp(it->t0, a, sizeof a);
    sb__video_stamp(it->t1, b, sizeof b);
    size_t n = strlen(a) + strlen(b) + strlen(it->text) + 4;
    char *s = sb_malloc(n);
    if (!s)
        return NULL;
    if (it->t0 == it->t1)
        snprintf(s, n, "%s %s", a, it->text);
    else /* "[00:00]" and "[00:30]" as "[00:00-00:30]" */
        snprintf(s, n, "%.*s-%s %s", (int)strlen(a) - 1, a, b + 1, it->text);
    return s;
}

/* The messages of one request, as JSON text (cJSON_free). */
static char *messages_json(const char *instruction, const char *items) {
    cJSON *msgs = cJSON_CreateArray(), *sys = cJSON_CreateObject(), *user = cJSON_CreateObject();
    cJSON_AddItemToArray(msgs, sys);
    cJSON_AddItemToArray(msgs, user);
    cJSON_AddStringToObject(sys, "role", "system");
    cJSON_AddStringToObject(sys, "content", system_prompt);
    cJSON_AddStringToObject(user, "role", "user");
    size_t n = strlen(instruction) + strlen(items) + 3;
    char *content = sb_malloc(n);
    if (content)
        snprintf(content, n, "%s\n\n%s", instruction, items);
    cJSON_AddStringToObject(user, "content", content ? content : "");
    sb_free(content);
    char *s = content ? cJSON_PrintUnformatted(msgs) : NULL;
    cJSON_Delete(msgs);
    return s;
}

/* Cuts s (in place, on a character boundary) until it takes at most limit tokens. */
static void fit(const sb_video_llm *llm, char *s, int32_t limit) {
    for (int32_t cost = llm->count_text(llm->user, s); cost > limit && *s;) {
        size_t len = strlen(s), cut = (size_t)((double)len * limit / cost * 0.9);
        while (cut > 0 && ((unsigned char)s[cut] & 0xC0) == 0x80)
            cut--;
        s[cut] = '\0';
        cost = llm->count_text(llm->user, s);
    }
}

#define BUSY_RETRIES 8

typedef struct round_ctx {
    const sb_video_params *p;
    const sb_video_llm *llm;
    sb_video_item *v;
    int32_t max_tokens;
} round_ctx;

/* One request: the items [from, to) under `instruction`; the answer into *out. */
static sb_status ask(round_ctx *r, const char *instruction, char *const *lines, int32_t from, int32_t to, char **out,
                     sb_error *err) {
    size_t n = 1;
    for (int32_t i = from; i < to; i++)
        n += strlen(lines[i]) + 1;
    char *joined = sb_malloc(n), *w = joined;
    if (!joined)
        return sb_fail(err, SB_ERR_NOMEM, "out of memory");
    for (int32_t i = from; i < to; i++)
        w += sprintf(w, "%s%s", lines[i], i + 1 < to ? "\n" : "");
    *w = '\0';
    char *msgs = messages_json(instruction, joined);
    sb_free(joined);
    cJSON *body = cJSON_CreateObject();
    cJSON_AddStringToObject(body, "model", r->llm->model);
    cJSON_AddItemToObject(body, "messages", msgs ? cJSON_Parse(msgs) : cJSON_CreateArray());
    cJSON_AddNumberToObject(body, "max_tokens", r->max_tokens);
    cJSON_AddNumberToObject(body, "temperature", 0);
    cJSON_free(msgs);
    char *text = cJSON_PrintUnformatted(body);
    cJSON_Delete(body);
    if (!text)
        return sb_fail(err, SB_ERR_NOMEM, "out of memory");
    char *resp = NULL;
    int status = 0;
    sb_status st;
    /* 503: the queue is full or the model is loading; asked again after a
     * growing pause (0.1 s to 3.2 s), then the answer stands. */
    for (int attempt = 0;; attempt++) {
        st = r->llm->complete(r->llm->user, text, &status, &resp, err);
        if (st != SB_OK || status != 503 || attempt == BUSY_RETRIES)
            break;
        sb_free(resp);
        resp = NULL;
        double wait = SB_MIN(0.1 * (double)(1 << attempt), 3.2);
        struct timespec ts = {(time_t)wait, (long)((wait - (double)(time_t)wait) * 1e9)};
        nanosleep(&ts, NULL);
    }
    cJSON_free(text);
    if (st != SB_OK)
        return st;
    __atomic_fetch_add(&r->v->llm_calls, 1, __ATOMIC_RELAXED);
    cJSON *root = cJSON_Parse(resp);
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(root, "error");
    const cJSON *msg = cJSON_GetObjectItemCaseSensitive(e, "message");
    const cJSON *ch = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(root, "choices"), 0);
    const cJSON *content =
        cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(ch, "message"), "content");
    if (e || status != 200)
        st = sb_fail(err, SB_ERR_IO, "the model refused the summary request (HTTP %d): %.300s", status,
                     cJSON_IsString(msg) ? msg->valuestring : resp);
    else if (!cJSON_IsString(content))
        st = sb_fail(err, SB_ERR_FORMAT, "the model's answer has no choices[0].message.content: %.200s", resp);
    else if (!(*out = sb_strndup(content->valuestring, strlen(content->valuestring))))
        st = sb_fail(err, SB_ERR_NOMEM, "out of memory");
    cJSON_Delete(root);
    sb_free(resp);
    return st;
}

/* The chunks of one round are independent: up to SUMMARY_PARALLEL of them
 * are asked at once, so the scheduler batches them. */
#define SUMMARY_PARALLEL 4

typedef struct chunk_work {
    round_ctx *r;
    const char *instruction;
    char *const *lines;
    const int32_t *starts;
    int32_t n_lines, chunks;
    item *out;
    int next;              /* the next chunk to ask (atomic) */
    int failed;            /* set once a chunk failed (atomic): the others stop */
    pthread_mutex_t mu;
    sb_error err;          /* the first failure */
} chunk_work;

static void *chunk_worker(void *arg) {
    chunk_work *w = arg;
    for (int c; !__atomic_load_n(&w->failed, __ATOMIC_RELAXED) &&
                (c = __atomic_fetch_add(&w->next, 1, __ATOMIC_RELAXED)) < w->chunks;) {
        int32_t to = c + 1 < w->chunks ? w->starts[c + 1] : w->n_lines;
        sb_error e;
        if (ask(w->r, w->instruction, w->lines, w->starts[c], to, &w->out[c].text, &e) != SB_OK) {
            pthread_mutex_lock(&w->mu);
            if (!w->failed)
                w->err = e;
            __atomic_store_n(&w->failed, 1, __ATOMIC_RELAXED);
            pthread_mutex_unlock(&w->mu);
        }
    }
    return NULL;
}

static sb_status ask_chunks(round_ctx *r, const char *instruction, char *const *lines, int32_t n_lines,
                            const int32_t *starts, int32_t chunks, const item *items, item *out, sb_error *err) {
    chunk_work w = {r, instruction, lines, starts, n_lines, chunks, out, 0, 0, PTHREAD_MUTEX_INITIALIZER, {0}};
    for (int32_t c = 0; c < chunks; c++) {
        out[c].t0 = items[starts[c]].t0;
        out[c].t1 = items[(c + 1 < chunks ? starts[c + 1] : n_lines) - 1].t1;
    }
    pthread_t th[SUMMARY_PARALLEL - 1];
    int extra = 0;
    while (extra < SB_MIN(chunks, SUMMARY_PARALLEL) - 1 && pthread_create(&th[extra], NULL, chunk_worker, &w) == 0)
        extra++;
    chunk_worker(&w);
    for (int i = 0; i < extra; i++)
        pthread_join(th[i], NULL);
    pthread_mutex_destroy(&w.mu);
    if (w.failed)
        return sb_fail(err, w.err.status, "%s", w.err.msg);
    return SB_OK;
}

/* Prompt tokens of a request under `instruction` with no items. */
static int32_t frame_cost(const sb_video_llm *llm, const char *instruction) {
    char *m = messages_json(instruction, "");
    int32_t n = m ? llm->count_chat(llm->user, m) : -1;
    cJSON_free(m);
    return n;
}

static void free_items(item *it, int32_t n) {
    for (int32_t i = 0; i < n; i++)
        sb_free(it[i].text);
    sb_free(it);
}

/* One round over n items: either the summary (*done) or the chunk summaries
 * that replace the items. */
static sb_status round_once(round_ctx *r, int level, item **items, int32_t *n, bool *done, sb_error *err) {
    const sb_video_llm *llm = r->llm;
    int32_t frame = 0;
    for (int k = 0; k < 2; k++) {
        int32_t c = frame_cost(llm, instructions[level ? 1 : 0][k]);
        if (c < 0)
            return sb_fail(err, SB_ERR_IO, "cannot count the summary prompt's tokens");
        frame = SB_MAX(frame, c);
    }
    frame += 2; /* the items' joining newline and the tokenizer's merges across it */
    int32_t room = llm->n_ctx - frame;
    r->max_tokens = SB_MIN(r->p->summary_tokens, room / 3);
    int32_t budget = room - r->max_tokens;
    if (budget < 16)
        return sb_fail(err, SB_ERR_CONTEXT_FULL,
                       "the model's context (%d tokens) is too small: the summary prompt alone takes %d", llm->n_ctx,
                       frame);
    int32_t m = *n;
    char **lines = sb_calloc((size_t)m, sizeof *lines);
    int32_t *cost = sb_malloc((size_t)m * sizeof *cost), *starts = sb_malloc((size_t)m * sizeof *starts);
    sb_status st = lines && cost && starts ? SB_OK : sb_fail(err, SB_ERR_NOMEM, "out of memory");
    for (int32_t i = 0; i < m && st == SB_OK; i++) {
        if (!(lines[i] = item_line(&(*items)[i]))) {
            st = sb_fail(err, SB_ERR_NOMEM, "out of memory");
            break;
        }
        fit(llm, lines[i], budget / 2 - 1);
        cost[i] = llm->count_text(llm->user, lines[i]) + 1;
    }
    item *next = NULL;
    int32_t chunks = st == SB_OK ? sb__video_chunk(cost, m, budget, starts) : 0;
    if (st == SB_OK && chunks == 1) {
        st = ask(r, instructions[level ? 1 : 0][0], lines, 0, m, &r->v->summary, err);
        *done = true;
    } else if (st == SB_OK) {
        if (!(next = sb_calloc((size_t)chunks, sizeof *next)))
            st = sb_fail(err, SB_ERR_NOMEM, "out of memory");
        else
            st = ask_chunks(r, instructions[level ? 1 : 0][1], lines, m, starts, chunks, *items, next, err);
    }
    for (int32_t i = 0; lines && i < m; i++)
        sb_free(lines[i]);
    sb_free(lines);
    sb_free(cost);
    sb_free(starts);
    if (next) {
        free_items(*items, *n);
        *items = next;
        *n = chunks;
    }
    return st;
}

sb_status sb__video_summarize(const sb_video_params *p, const sb_video_llm *llm, sb_video_item *v, sb_error *err) {
    int32_t n = 0;
    item *items = sb_calloc((size_t)SB_MAX(v->n_kf, 1), sizeof *items);
    if (!items)
        return sb_fail(err, SB_ERR_NOMEM, "out of memory");
    for (int32_t k = 0; k < v->n_kf; k++) {
        if (!v->kf[k].caption)
            continue;
        items[n] = (item){v->kf[k].time, v->kf[k].time, sb_strndup(v->kf[k].caption, strlen(v->kf[k].caption))};
        if (!items[n++].text) {
            free_items(items, n);
            return sb_fail(err, SB_ERR_NOMEM, "out of memory");
        }
    }
    if (n == 0) {
        free_items(items, n);
        return sb_fail(err, SB_ERR_INVALID_ARG, "no keyframe has a caption to summarise");
    }
    round_ctx r = {p, llm, v, 0};
    bool done = false;
    sb_status st = SB_OK;
    for (int level = 0; st == SB_OK && !done; level++)
        st = round_once(&r, level, &items, &n, &done, err);
    free_items(items, n);
    return st;
}
