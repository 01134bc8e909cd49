/*
 * server/chat.c — POST /v1/chat/completions on libmicrohttpd's suspended connections.
 *
 * One struct chat per request. Its life:
 *   body    the upload is gathered (413 over max_body_bytes, announced or not);
 *   submit  parsed (openai.h), checked against the queue (429) and submitted with callbacks;
 *           the connection is suspended;
 *   accept  the runtime says the request passed every check (on_accepted): a stream's 200
 *           and its first chunk go out now, so anything refused before (400 for a prompt over
 *           the context, an image that does not decode) is still a plain error response;
 *   tokens  each token becomes an SSE chunk (or text of the answer) and resumes the
 *           connection; the content reader suspends it again when it has nothing to send;
 *   done    the result gives the finish reason and usage; the job is waited for and freed.
 * A client that goes away (libmicrohttpd's completion notice, or a failed write of a stream's
 * keep-alive) cancels its job, whose pages return at once; the housekeeping thread waits for
 * such a job and frees the chat, so no libmicrohttpd thread ever blocks on the engine.
 *
 * A request for n choices (OpenAI's "n") runs n jobs, choice i with seed + i, each a sequence
 * of its own in the engine. Choice 0 goes first; the others are submitted when it has its
 * first token, so that its whole prompt is in the engine's prefix store (K/V and last
 * logits) and theirs is taken from there instead of prefilled n times (and its images are in
 * the vision-feature cache, where that is on). The chat is accepted when choice 0 is (the others are the same request,
 * so they pass the same checks: a stream need not wait for them) and done when every choice
 * is; a choice that ends before it is accepted (refused, or never submitted) cancels the
 * others, and any failure answers for the whole request.
 *
 * Locks: a chat's own lock guards its flags and buffers (taken by the handler, the content
 * reader and the job callbacks); the server's lock guards the list of chats with jobs and
 * each chat's job pointer (so a cancel never meets a freed job). Order: server, then chat,
 * then the runtime's own locks (the runtime never calls back holding one). mmrt_wait is
 * never called under a chat's lock: it waits for on_done, which takes it.
 */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "openai.h"
#include "server.h"
#include "text.h"

/* One of a chat's n choices: the user of its job's callbacks. */
struct choice {
    struct chat *c;
    int index;
    struct mmrt_job *job;          /* under the server's lock; NULL once waited for */
    /* under the chat's lock */
    bool accepted;
    double t_first;
    struct mmrt_text answer;       /* a non-streamed answer's text */
    /* logprobs: the entries (mmrt_chat_logprobs_entry) not yet sent, a stream's since its
     * last text chunk, a plain answer's all; NULL when the request did not ask */
    json_t *lp;
    bool lp_failed;                /* an entry could not be made: the answer stops */
    struct mmrt_result res;        /* once waited for */
};

struct chat {
    struct server *s;
    struct MHD_Connection *mc;
    pthread_mutex_t lock;
    double t0, t_last_out;
    /* the upload */
    char *body;
    size_t len, cap;
    bool too_large, answered;
    /* the request */
    struct mmrt_chat_request req;
    bool parsed, submitted;
    struct choice *ch;             /* n_ch of them, each with a job once submitted */
    int n_ch;
    uint64_t seed;                 /* choice i samples with seed + i */
    char id[48];
    long created;
    char vision_keys[8 * 65 + 8];  /* x-mmrt-vision-key */
    /* under the chat's lock */
    bool suspended, accepted, done, gone, claimed, stream_queued, stream_ended;
    bool launched;                 /* choices 1 … n − 1 submitted, or given up */
    int n_done;
    struct mmrt_text out;          /* SSE bytes not yet handed over, from out_off */
    size_t out_off;
    int fd;                        /* the client's socket, for noticing that it closed */
    struct chat *next_live, *next_orphan;
};

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static void chat_free(struct chat *c)
{
    if (c->parsed)
        mmrt_chat_request_free(&c->req);
    free(c->body);
    free(c->out.s);
    for (int i = 0; c->ch && i < c->n_ch; i++) {
        free(c->ch[i].answer.s);
        json_decref(c->ch[i].lp);
    }
    free(c->ch);
    pthread_mutex_destroy(&c->lock);
    free(c);
}

/* Takes c off the server's list and frees it (its job has been waited for). */
static void chat_release(struct chat *c)
{
    struct server *s = c->s;
    if (c->submitted) {
        pthread_mutex_lock(&s->lock);
        for (struct chat **p = &s->live; *p; p = &(*p)->next_live)
            if (*p == c) {
                *p = c->next_live;
                s->n_live--;
                break;
            }
        pthread_mutex_unlock(&s->lock);
    }
    chat_free(c);
}

/* With the chat's lock held. */
static void resume_locked(struct chat *c)
{
    if (c->suspended) {
        c->suspended = false;
        MHD_resume_connection(c->mc);
    }
}

static void suspend_locked(struct chat *c)
{
    c->suspended = true;
    MHD_suspend_connection(c->mc);
}

/* Appends "data: JSON\n\n" (json is consumed); false when out of memory. */
static bool add_event(struct chat *c, char *json)
{
    if (!json)
        return false;
    mmrt_text_add(&c->out, "data: ");
    mmrt_text_add(&c->out, json);
    mmrt_text_add(&c->out, "\n\n");
    free(json);
    return !c->out.failed;
}

static enum mmrt_outcome outcome_of(mmrt_status st)
{
    if (st == MMRT_OK)
        return MMRT_OUTCOME_OK;
    if (st == MMRT_ERR_CANCELLED)
        return MMRT_OUTCOME_CANCELLED;
    return mmrt_api_status_http(st) < 500 ? MMRT_OUTCOME_INVALID : MMRT_OUTCOME_FAILED;
}

/* The request's usage, every choice's tokens together. */
static struct mmrt_chat_usage usage_of(const struct chat *c)
{
    struct mmrt_chat_usage u = { .prompt_tokens = c->ch[0].res.n_prompt_tokens,
                                 .prediction = c->req.req.prediction != NULL };
    for (int i = 0; i < c->n_ch; i++) {
        u.completion_tokens += c->ch[i].res.n_tokens;
        u.accepted_prediction_tokens += c->ch[i].res.prediction_accepted;
        u.rejected_prediction_tokens += c->ch[i].res.prediction_rejected;
    }
    return u;
}

/* The choice whose failure answers for the request, or NULL: the first that failed for a
 * reason of its own, else the first cancelled (a refused choice cancels the others, and its
 * refusal is the answer whatever its index). */
static const struct choice *failed_choice(const struct chat *c)
{
    const struct choice *cancelled = NULL;
    for (int i = 0; i < c->n_ch; i++) {
        const mmrt_status st = c->ch[i].res.status;
        if (st != MMRT_OK && st != MMRT_ERR_CANCELLED)
            return &c->ch[i];
        if (st == MMRT_ERR_CANCELLED && !cancelled)
            cancelled = &c->ch[i];
    }
    return cancelled;
}

/* Waits for c's jobs (done, so at once), records their figures and forgets the jobs. */
static void wait_job(struct chat *c)
{
    struct server *s = c->s;
    bool waited = false;
    for (int i = 0; i < c->n_ch; i++) {
        struct choice *ch = &c->ch[i];
        pthread_mutex_lock(&s->lock);
        struct mmrt_job *j = ch->job;
        ch->job = NULL;
        pthread_mutex_unlock(&s->lock);
        if (!j)
            continue;
        ch->res = (struct mmrt_result){ .struct_size = sizeof ch->res };
        mmrt_wait(j, &ch->res);
        mmrt_metrics_request(&s->metrics, &ch->res,
                             ch->t_first > 0 ? ch->t_first - c->t0 : -1, now_ms() - c->t0);
        waited = true;
    }
    if (!waited)
        return;
    const struct choice *f = failed_choice(c);
    mmrt_metrics_outcome(&s->metrics, c->gone ? MMRT_OUTCOME_CANCELLED
                                              : outcome_of(f ? f->res.status : MMRT_OK));
}

/* Cancels every choice's job that is not waited for yet; the server's lock is held (the job
 * pointers). */
static void cancel_jobs_locked(struct chat *c)
{
    for (int i = 0; i < c->n_ch; i++)
        if (c->ch[i].job)
            mmrt_cancel(c->ch[i].job);
}

/* cancel_jobs_locked for a caller that holds no lock (one choice was refused). */
static void cancel_jobs(struct chat *c)
{
    pthread_mutex_lock(&c->s->lock);
    cancel_jobs_locked(c);
    pthread_mutex_unlock(&c->s->lock);
}

/* Choice ch has ended (its job's on_done, or it was never submitted): the chat's counts, the
 * cancel of the others when it ended unaccepted, and the resume, or the hand-over to the
 * housekeeping thread, when it was the last. No lock held. */
static void choice_ended(struct choice *ch)
{
    struct chat *c = ch->c;
    struct server *s = c->s;
    pthread_mutex_lock(&c->lock);
    c->done = ++c->n_done == c->n_ch;
    /* Refused before it was accepted (an image that does not decode, a prompt over the
     * context): the others would be refused too, or answer for nothing. */
    const bool refused = !ch->accepted && !c->done;
    const bool orphan = c->done && c->gone && !c->claimed;
    if (orphan)
        c->claimed = true;
    else if (c->done)
        resume_locked(c);
    pthread_mutex_unlock(&c->lock);
    /* c stays: a job is not done until its on_done returns, and the choices never submitted
     * end from choice 0's callbacks, so nobody waits the chat out and frees it meanwhile */
    if (refused)
        cancel_jobs(c);
    if (orphan) { /* the housekeeping thread waits for the jobs and frees the chat */
        pthread_mutex_lock(&s->lock);
        c->next_orphan = s->orphans;
        s->orphans = c;
        pthread_cond_signal(&s->wake);
        pthread_mutex_unlock(&s->lock);
    }
}

/* Submits choice i (the parsed request with seed + i; it is copied at submit). */
static mmrt_status submit_choice(struct chat *c, struct mmrt_runtime *rt, int i,
                                 struct mmrt_job **job, char *err, size_t err_size);

/* Choices [from, n) end without having run, with status st and message msg. */
static void end_unsubmitted(struct chat *c, int from, mmrt_status st, const char *msg)
{
    for (int i = from; i < c->n_ch; i++) {
        struct choice *ch = &c->ch[i];
        ch->res = (struct mmrt_result){ .struct_size = sizeof ch->res, .status = st };
        snprintf(ch->res.message, sizeof ch->res.message, "%s", msg);
        snprintf(ch->res.error, sizeof ch->res.error, "%s", msg);
        choice_ended(ch);
    }
}

/* From choice 0's first token: submits the other choices (once). A submit that fails ends
 * that choice and the ones after it unsubmitted, which cancels the rest. No lock held. */
static void launch_rest(struct chat *c)
{
    pthread_mutex_lock(&c->lock);
    const bool now = !c->launched, run = !c->gone;
    c->launched = true;
    pthread_mutex_unlock(&c->lock);
    if (!now)
        return;
    struct mmrt_runtime *rt = atomic_load(&c->s->rt);
    struct mmrt_job *jobs[MMRT_CHAT_MAX_CHOICES] = { NULL };
    char err[512] = "cancelled: the client went away";
    mmrt_status st = MMRT_ERR_CANCELLED;
    int k = 1;
    for (; run && k < c->n_ch; k++)
        if ((st = submit_choice(c, rt, k, &jobs[k], err, sizeof err)) != MMRT_OK)
            break;
    pthread_mutex_lock(&c->s->lock);
    pthread_mutex_lock(&c->lock);
    const bool gone = c->gone; /* while they were submitted: nobody cancelled them */
    pthread_mutex_unlock(&c->lock);
    for (int i = 1; i < k; i++)
        c->ch[i].job = jobs[i];
    if (gone)
        cancel_jobs_locked(c);
    pthread_mutex_unlock(&c->s->lock);
    end_unsubmitted(c, k, st, err);
}

/* Choice 0 ended before its first token: the others, not yet submitted, end as cancelled
 * (its own result says why). No lock held. */
static void give_up_rest(struct chat *c)
{
    pthread_mutex_lock(&c->lock);
    const bool now = !c->launched;
    c->launched = true;
    pthread_mutex_unlock(&c->lock);
    if (now)
        end_unsubmitted(c, 1, MMRT_ERR_CANCELLED, "cancelled: the first choice ended first");
}

/* ---- job callbacks (the runtime's worker thread) ---- */

static bool on_token(void *user, int32_t id, const char *text)
{
    struct choice *ch = user;
    struct chat *c = ch->c;
    pthread_mutex_lock(&c->lock);
    if (c->gone) {
        pthread_mutex_unlock(&c->lock);
        return false; /* nobody reads it: stop generating */
    }
    /* choice 0's first token: its prompt is prefilled, the others can share it */
    const bool launch = id >= 0 && ch->index == 0 && !c->launched;
    if (id >= 0 && ch->t_first == 0)
        ch->t_first = now_ms();
    bool ok = !ch->lp_failed;
    if (text[0] && c->req.stream) {
        ok &= add_event(c, mmrt_chat_chunk_json(c->id, c->created, c->s->conf.model_name,
                                                ch->index, NULL, text, NULL, NULL,
                                                c->req.include_usage, ch->lp));
        if (ch->lp)
            json_array_clear(ch->lp); /* sent with this chunk */
    } else if (text[0]) {
        mmrt_text_add(&ch->answer, text);
        ok &= !ch->answer.failed;
    }
    resume_locked(c);
    pthread_mutex_unlock(&c->lock);
    if (launch)
        launch_rest(c);
    return ok; /* out of memory: the answer ends here, the result says it was cut */
}

/* Each token's log-probabilities, just before its on_token: kept until the chunk (or the
 * answer) that carries them. */
static void on_logprobs(void *user, const struct mmrt_token_logprobs *lp)
{
    struct choice *ch = user;
    pthread_mutex_lock(&ch->c->lock);
    if (ch->lp && !ch->lp_failed)
        ch->lp_failed = json_array_append_new(ch->lp, mmrt_chat_logprobs_entry(lp)) != 0;
    pthread_mutex_unlock(&ch->c->lock);
}

static void on_accepted(void *user, int n_prompt_tokens)
{
    struct choice *ch = user;
    struct chat *c = ch->c;
    (void)n_prompt_tokens;
    pthread_mutex_lock(&c->lock);
    ch->accepted = true;
    c->accepted |= ch->index == 0;
    if (c->req.stream)
        add_event(c, mmrt_chat_chunk_json(c->id, c->created, c->s->conf.model_name, ch->index,
                                          "assistant", "", NULL, NULL, c->req.include_usage,
                                          NULL));
    resume_locked(c);
    pthread_mutex_unlock(&c->lock);
}

static void on_done(void *user)
{
    struct choice *ch = user;
    if (ch->index == 0)
        give_up_rest(ch->c); /* it ended before its first token: they never start */
    choice_ended(ch);
}

/* ---- the stream ---- */

static ssize_t read_stream(void *cls, uint64_t pos, char *buf, size_t max)
{
    (void)pos;
    struct chat *c = cls;
    pthread_mutex_lock(&c->lock);
    for (;;) {
        if (c->out.len > c->out_off) {
            size_t n = c->out.len - c->out_off;
            if (n > max)
                n = max;
            memcpy(buf, c->out.s + c->out_off, n);
            c->out_off += n;
            if (c->out_off == c->out.len)
                c->out.len = c->out_off = 0;
            c->t_last_out = now_ms();
            pthread_mutex_unlock(&c->lock);
            return (ssize_t)n;
        }
        if (c->stream_ended) {
            pthread_mutex_unlock(&c->lock);
            return MHD_CONTENT_READER_END_OF_STREAM;
        }
        if (!c->done) {
            suspend_locked(c);
            pthread_mutex_unlock(&c->lock);
            return 0;
        }
        c->claimed = true;
        pthread_mutex_unlock(&c->lock);
        wait_job(c);
        pthread_mutex_lock(&c->lock);
        const struct choice *f = failed_choice(c);
        if (!f) {
            struct mmrt_chat_usage u = usage_of(c);
            /* Each choice's last chunk. The tokens whose text never went out in a chunk (an
             * end token, the pieces of a stop string) have their entries here. */
            for (int i = 0; i < c->n_ch; i++) {
                const struct choice *ch = &c->ch[i];
                add_event(c, mmrt_chat_chunk_json(
                                 c->id, c->created, c->s->conf.model_name, ch->index, NULL,
                                 NULL, mmrt_finish_reason_name(ch->res.finish_reason), NULL,
                                 c->req.include_usage, ch->lp));
            }
            if (c->req.include_usage)
                add_event(c, mmrt_chat_chunk_json(c->id, c->created, c->s->conf.model_name, 0,
                                                  NULL, NULL, NULL, &u, true, NULL));
        } else {
            /* Failed after the 200 went out (a device error, the drain's cancel): the error
             * object as an event, as OpenAI-compatible servers send it. */
            struct mmrt_api_error e;
            mmrt_api_error_from_status(f->res.status, f->res.message, &e);
            add_event(c, mmrt_api_error_json(&e));
        }
        mmrt_text_add(&c->out, "data: [DONE]\n\n");
        c->stream_ended = true;
    }
}

static enum MHD_Result start_stream(struct chat *c)
{
    struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024,
                                                               read_stream, c, NULL);
    if (!r)
        return MHD_NO;
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
    MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    MHD_add_response_header(r, "X-Accel-Buffering", "no");
    if (c->vision_keys[0])
        MHD_add_response_header(r, "X-Mmrt-Vision-Key", c->vision_keys);
    enum MHD_Result ret = MHD_queue_response(c->mc, MHD_HTTP_OK, r);
    MHD_destroy_response(r);
    mmrt_metrics_http(&c->s->metrics, MHD_HTTP_OK);
    return ret;
}

/* A failure as the response (no stream started). */
static enum MHD_Result answer_error(struct chat *c, const struct mmrt_api_error *e)
{
    c->answered = true;
    return mmrt_http_json(c->s, c->mc, (unsigned)e->http_status, mmrt_api_error_json(e));
}

static enum MHD_Result answer_result(struct chat *c)
{
    const struct choice *f = failed_choice(c);
    if (f) {
        struct mmrt_api_error e;
        mmrt_api_error_from_status(f->res.status, f->res.message, &e);
        return answer_error(c, &e);
    }
    struct mmrt_chat_choice choices[MMRT_CHAT_MAX_CHOICES];
    const struct mmrt_chat_usage u = usage_of(c);
    for (int i = 0; i < c->n_ch; i++) {
        const struct choice *ch = &c->ch[i];
        choices[i] = (struct mmrt_chat_choice){
            .content = ch->answer.s ? ch->answer.s : "",
            .finish_reason = mmrt_finish_reason_name(ch->res.finish_reason),
            .logprobs = ch->lp,
        };
    }
    c->answered = true;
    char *body = mmrt_chat_completion_json(c->id, c->created, c->s->conf.model_name, choices,
                                           c->n_ch, &u);
    /* NULL body: mmrt_http_json_header answers 503 out of memory. */
    return mmrt_http_json_header(c->s, c->mc, MHD_HTTP_OK, body, "X-Mmrt-Vision-Key",
                                 c->vision_keys);
}

static void collect_vision_keys(struct chat *c)
{
    size_t o = 0;
    for (int i = 0; i < c->req.req.n_images && o + 66 < sizeof c->vision_keys; i++) {
        char k[65];
        if (mmrt_job_image_key(c->ch[0].job, i, k, sizeof k) != MMRT_OK || !k[0])
            break;
        o += (size_t)snprintf(c->vision_keys + o, sizeof c->vision_keys - o, "%s%s",
                              i ? "," : "", k);
    }
}

static mmrt_status submit_choice(struct chat *c, struct mmrt_runtime *rt, int i,
                                 struct mmrt_job **job, char *err, size_t err_size)
{
    const struct mmrt_job_callbacks cb = {
        .struct_size = sizeof cb, .on_token = on_token, .on_accepted = on_accepted,
        .on_done = on_done, .user = &c->ch[i], .on_logprobs = on_logprobs };
    c->req.req.seed = c->seed + (uint64_t)i;
    return mmrt_submit_with(rt, &c->req.req, &cb, job, err, err_size);
}

/* The body is complete: parse, check, submit, suspend. */
static enum MHD_Result submit(struct chat *c)
{
    struct server *s = c->s;
    struct mmrt_runtime *rt = atomic_load(&s->rt);
    struct mmrt_api_error e = { 0 };
    if (c->too_large) {
        mmrt_metrics_outcome(&s->metrics, MMRT_OUTCOME_INVALID);
        c->answered = true;
        char msg[128];
        snprintf(msg, sizeof msg, "the request body is larger than the %llu bytes this server "
                 "takes ([server] max_body_mb)", (unsigned long long)s->conf.max_body_bytes);
        return mmrt_http_error(s, c->mc, MHD_HTTP_CONTENT_TOO_LARGE, "invalid_request_error",
                               "request_too_large", NULL, msg);
    }
    const struct mmrt_chat_limits lim = { .model = s->conf.model_name,
                                          .max_images = s->max_images,
                                          .image_dir = s->conf.image_dir,
                                          .defaults = &s->sampling, .schemas = rt };
    if (mmrt_chat_request_parse(c->body ? c->body : "", c->len, &lim, &c->req, &e) !=
        MMRT_OK) {
        mmrt_metrics_outcome(&s->metrics, MMRT_OUTCOME_INVALID);
        return answer_error(c, &e);
    }
    c->parsed = true;
    free(c->body);
    c->body = NULL;
    if (mmrt_server_over_capacity(s, rt)) {
        mmrt_metrics_outcome(&s->metrics, MMRT_OUTCOME_REJECTED);
        c->answered = true;
        return mmrt_http_error(s, c->mc, MHD_HTTP_TOO_MANY_REQUESTS, "rate_limit_exceeded",
                               "queue_full", NULL, "too many requests are waiting; retry "
                               "after the Retry-After seconds");
    }
    snprintf(c->id, sizeof c->id, "chatcmpl-%016llx%08llx",
             (unsigned long long)atomic_fetch_add(&s->next_id, 1),
             (unsigned long long)(time(NULL) & 0xffffffff));
    c->created = (long)time(NULL);
    /* No seed: a fresh one, as OpenAI samples differently each time (a given seed makes the
     * answer reproducible). */
    if (!c->req.seed_given)
        c->req.req.seed = (uint64_t)atomic_fetch_add(&s->next_id, 1) * 0x9E3779B97F4A7C15ull ^
                          (uint64_t)time(NULL);
    c->n_ch = c->req.n;
    c->ch = calloc((size_t)c->n_ch, sizeof *c->ch);
    bool ok = c->ch != NULL;
    for (int i = 0; ok && i < c->n_ch; i++) {
        c->ch[i].c = c;
        c->ch[i].index = i;
        ok = !c->req.req.logprobs || (c->ch[i].lp = json_array()) != NULL;
    }
    if (!ok) { /* chat_free takes what was made */
        mmrt_api_error_from_status(MMRT_ERR_NO_MEMORY, NULL, &e);
        mmrt_metrics_outcome(&s->metrics, MMRT_OUTCOME_FAILED);
        return answer_error(c, &e);
    }
    char err[512];
    struct mmrt_job *job = NULL;
    c->seed = c->req.req.seed;
    c->launched = c->n_ch == 1;
    pthread_mutex_lock(&c->lock);
    mmrt_status st = submit_choice(c, rt, 0, &job, err, sizeof err);
    if (st != MMRT_OK) {
        pthread_mutex_unlock(&c->lock);
        mmrt_metrics_outcome(&s->metrics, outcome_of(st));
        mmrt_api_error_from_status(st, err, &e);
        return answer_error(c, &e);
    }
    /* The callbacks wait for this lock, so none can resume before the suspend. */
    pthread_mutex_lock(&s->lock);
    c->ch[0].job = job;
    c->submitted = true;
    c->next_live = s->live;
    s->live = c;
    s->n_live++;
    pthread_mutex_unlock(&s->lock);
    collect_vision_keys(c);
    suspend_locked(c);
    pthread_mutex_unlock(&c->lock);
    return MHD_YES;
}

enum MHD_Result mmrt_chat_handle(struct server *s, struct MHD_Connection *mc, void **con_cls,
                                 const char *upload, size_t *upload_size)
{
    struct chat *c = *con_cls;
    if (!c) {
        /* Refuse an announced oversized body before reading it. */
        const char *cl = MHD_lookup_connection_value(mc, MHD_HEADER_KIND,
                                                     MHD_HTTP_HEADER_CONTENT_LENGTH);
        if (cl) {
            errno = 0;
            char *end = NULL;
            unsigned long long n = strtoull(cl, &end, 10);
            if (errno || end == cl || *end || n > s->conf.max_body_bytes) {
                mmrt_metrics_outcome(&s->metrics, MMRT_OUTCOME_INVALID);
                return mmrt_http_error(s, mc, MHD_HTTP_CONTENT_TOO_LARGE,
                                       "invalid_request_error", "request_too_large", NULL,
                                       "the request body is larger than this server takes "
                                       "([server] max_body_mb)");
            }
        }
        c = calloc(1, sizeof *c);
        if (!c)
            return MHD_NO;
        c->s = s;
        c->mc = mc;
        c->t0 = now_ms();
        const union MHD_ConnectionInfo *ci =
            MHD_get_connection_info(mc, MHD_CONNECTION_INFO_CONNECTION_FD);
        c->fd = ci ? ci->connect_fd : -1;
        pthread_mutex_init(&c->lock, NULL);
        *con_cls = c;
        return MHD_YES;
    }
    if (*upload_size) {
        const size_t n = *upload_size;
        *upload_size = 0;
        if (c->too_large || c->answered)
            return MHD_YES;
        if (c->len + n > s->conf.max_body_bytes) {
            c->too_large = true; /* answered once the upload ends */
            free(c->body);
            c->body = NULL;
            c->len = c->cap = 0;
            return MHD_YES;
        }
        if (c->len + n + 1 > c->cap) {
            size_t cap = c->cap ? c->cap : 4096;
            while (cap < c->len + n + 1)
                cap *= 2;
            char *g = realloc(c->body, cap);
            if (!g)
                return MHD_NO;
            c->body = g;
            c->cap = cap;
        }
        memcpy(c->body + c->len, upload, n);
        c->len += n;
        return MHD_YES;
    }
    if (c->answered)
        return MHD_YES;
    if (!c->submitted)
        return submit(c);
    /* Resumed by a callback. */
    pthread_mutex_lock(&c->lock);
    if (c->req.stream && c->accepted && !c->stream_queued) {
        c->stream_queued = true;
        pthread_mutex_unlock(&c->lock);
        return start_stream(c);
    }
    if (!c->done || c->stream_queued) {
        suspend_locked(c);
        pthread_mutex_unlock(&c->lock);
        return MHD_YES;
    }
    c->claimed = true;
    pthread_mutex_unlock(&c->lock);
    wait_job(c);
    return answer_result(c);
}

void mmrt_chat_completed(struct server *s, void *con_cls, enum MHD_RequestTerminationCode why)
{
    struct chat *c = con_cls;
    (void)why;
    /* The server's lock first (the order), held until the jobs are cancelled: a chat whose
     * last job ends meanwhile becomes an orphan, which the housekeeping thread cannot take
     * (and free) before this lets go. */
    pthread_mutex_lock(&s->lock);
    pthread_mutex_lock(&c->lock);
    c->gone = true;
    const bool running = c->submitted && !c->done;
    const bool wait_here = c->submitted && c->done && !c->claimed;
    if (wait_here)
        c->claimed = true;
    /* Running jobs: the last to end makes the chat the orphan on_done hands to the
     * housekeeping thread. */
    const bool free_now = !running;
    if (running)
        cancel_jobs_locked(c);
    pthread_mutex_unlock(&c->lock);
    pthread_mutex_unlock(&s->lock);
    if (wait_here)
        wait_job(c);
    if (free_now)
        chat_release(c);
}

void mmrt_chat_reap(struct server *s)
{
    for (;;) {
        pthread_mutex_lock(&s->lock);
        struct chat *c = s->orphans;
        if (c)
            s->orphans = c->next_orphan;
        pthread_mutex_unlock(&s->lock);
        if (!c)
            return;
        wait_job(c);
        chat_release(c);
    }
}

/* Whether the peer closed its end: libmicrohttpd does not watch a suspended connection, so a
 * client that gives up on a queued or non-streamed request would otherwise hold its place
 * (and later its pages) until the answer is complete. The caller holds c's lock with
 * c->gone false, so the socket is still libmicrohttpd's and open. */
static bool peer_closed(const struct chat *c)
{
    if (c->fd < 0)
        return false;
    struct pollfd p = { .fd = c->fd, .events = POLLRDHUP };
    return poll(&p, 1, 0) == 1 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR));
}

void mmrt_chat_tick(struct server *s)
{
    const double t = now_ms();
    pthread_mutex_lock(&s->lock);
    for (struct chat *c = s->live; c; c = c->next_live) {
        pthread_mutex_lock(&c->lock);
        if (c->submitted && !c->done && !c->gone && c->suspended && peer_closed(c))
            cancel_jobs_locked(c); /* ends at the next step; the write fails */
        /* A stream that has said nothing for keepalive_s (waiting for a batch slot, or a
         * long prefill): a comment line, which also finds out whether the client is still
         * there. */
        if (c->stream_queued && !c->stream_ended && !c->gone && c->out.len == c->out_off &&
            t - (c->t_last_out > 0 ? c->t_last_out : c->t0) >= c->s->conf.keepalive_s * 1e3) {
            mmrt_text_add(&c->out, ": keep-alive\n\n");
            c->t_last_out = t;
            resume_locked(c);
        }
        pthread_mutex_unlock(&c->lock);
    }
    pthread_mutex_unlock(&s->lock);
}

void mmrt_chat_cancel_all(struct server *s)
{
    pthread_mutex_lock(&s->lock);
    for (struct chat *c = s->live; c; c = c->next_live)
        cancel_jobs_locked(c);
    pthread_mutex_unlock(&s->lock);
}
