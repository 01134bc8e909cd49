/*
 * tests/test_serving_api.c — what the embedding API gives a server: stop strings, finish
 * reasons, max_tokens 0 (up to the context), the job callbacks (accepted, done) and the
 * runtime's serving statistics, read from another thread while the worker steps.
 */
#include <pthread.h>
#include <semaphore.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "golden.h"
#include "mmrt/mmrt.h"
#include "request_util.h"

#define FIXTURE "llava-tiny"

/* The vision stage's plugin when not the CPU's: the stages on two devices, where the
 * runtime's worker encodes on a vision thread of its own. */
static const char *g_vision_plugin;

static struct mmrt_runtime *open_rt(int64_t max_kv_tokens)
{
    char dir[4096];
    golden_fixture_path(dir, sizeof dir, FIXTURE);
    const struct mmrt_device_config devs[2] = {
        { .name = "cpu0", .plugin = "cpu", .pool_mb = 64 },
        { .name = "vis", .plugin = g_vision_plugin, .pool_mb = 64 },
    };
    const struct mmrt_config cfg = { .struct_size = sizeof cfg, .model_path = dir,
                                     .devices = devs, .n_devices = g_vision_plugin ? 2 : 1,
                                     .vision_device = g_vision_plugin ? "vis" : NULL,
                                     .max_kv_tokens = max_kv_tokens, .kv_page_tokens = 16 };
    struct mmrt_runtime *rt = NULL;
    char err[2048];
    if (mmrt_create(&cfg, &rt, err, sizeof err) != MMRT_OK)
        fail_msg("%s", err);
    return rt;
}

/* The fixture's first case: an image and a prompt. */
struct fixture_case {
    json_t *json;
    struct golden_images images;
    struct mmrt_request req;
};

static void case_load(struct fixture_case *fc)
{
    memset(fc, 0, sizeof *fc);
    fc->json = golden_expected_json(FIXTURE);
    fc->req = golden_case_request(json_array_get(json_object_get(fc->json, "cases"), 0),
                                  &fc->images);
    fc->req.struct_size = sizeof fc->req;
}

/* Everything a request streamed: ids and the text, concatenated. */
struct stream {
    int32_t ids[256];
    int n_ids;
    char text[8192];
    size_t len;
    int n_flush; /* calls with id −1 */
};

static bool on_text(void *user, int32_t id, const char *text)
{
    struct stream *s = user;
    if (id >= 0 && s->n_ids < 256)
        s->ids[s->n_ids++] = id;
    if (id < 0)
        s->n_flush++;
    size_t n = strlen(text);
    assert_true(s->len + n < sizeof s->text);
    memcpy(s->text + s->len, text, n);
    s->len += n;
    s->text[s->len] = '\0';
    return true;
}

static void run(struct mmrt_runtime *rt, const struct mmrt_request *req, struct stream *s,
                struct mmrt_result *res)
{
    memset(s, 0, sizeof *s);
    *res = (struct mmrt_result){ .struct_size = sizeof *res };
    if (mmrt_run(rt, req, on_text, s, res) != MMRT_OK)
        fail_msg("%s", mmrt_last_error(rt));
}

/* A stop string ends the answer before itself, wherever it falls across token pieces, and
 * says so in finish_reason; a stop string that never comes changes nothing (the text held
 * back for it is delivered at the end). */
static void test_stop_strings(void **state)
{
    (void)state;
    struct fixture_case fc;
    case_load(&fc);
    struct mmrt_runtime *rt = open_rt(0);
    struct mmrt_request req = fc.req;
    req.max_tokens = 24;
    struct stream full, got;
    struct mmrt_result res;
    run(rt, &req, &full, &res);
    assert_int_equal(res.finish_reason, MMRT_FINISH_LENGTH);
    assert_int_equal(res.n_tokens, 24);
    assert_true(full.len >= 8);
    /* Stop strings taken from the answer itself, at several places: the text before the
     * first occurrence is what must arrive. */
    for (size_t at = 1; at + 3 <= full.len; at += (full.len - 3) / 5 + 1) {
        /* Start and end on character boundaries (the answer is random-weight text). */
        size_t a = at, b = at + 3;
        while (a > 0 && ((unsigned char)full.text[a] & 0xC0) == 0x80)
            a--;
        while (b < full.len && ((unsigned char)full.text[b] & 0xC0) == 0x80)
            b++;
        char stop[64];
        snprintf(stop, sizeof stop, "%.*s", (int)(b - a), full.text + a);
        const char *stops[2] = { "\x01never", stop };
        req.stop = stops;
        req.n_stop = 2;
        run(rt, &req, &got, &res);
        const char *first = strstr(full.text, stop);
        assert_non_null(first);
        const size_t want = (size_t)(first - full.text);
        if (got.len != want || memcmp(got.text, full.text, want) != 0)
            fail_msg("stop '%s': got '%s', want the first %zu bytes of '%s'", stop, got.text,
                     want, full.text);
        assert_int_equal(res.finish_reason, MMRT_FINISH_STOP_STRING);
        assert_true(res.n_tokens <= 24);
        assert_memory_equal(got.ids, full.ids, (size_t)got.n_ids * sizeof(int32_t));
    }
    /* Only a prefix of a stop string at the very end: held back, then delivered. */
    char tail[64];
    snprintf(tail, sizeof tail, "%s\x01", full.text + full.len - 1);
    const char *stops[1] = { tail };
    req.stop = stops;
    req.n_stop = 1;
    run(rt, &req, &got, &res);
    assert_string_equal(got.text, full.text);
    assert_int_equal(res.finish_reason, MMRT_FINISH_LENGTH);
    /* Bad stop strings are refused naming the field. */
    const char *bad[2] = { "ok", "" };
    req.stop = bad;
    req.n_stop = 2;
    assert_int_equal(mmrt_run(rt, &req, NULL, NULL, &res), MMRT_ERR_INVALID_ARG);
    assert_non_null(strstr(mmrt_last_error(rt), "stop[1]"));
    const char *not_utf8[1] = { "a\xff" };
    req.stop = not_utf8;
    req.n_stop = 1;
    assert_int_equal(mmrt_run(rt, &req, NULL, NULL, &res), MMRT_ERR_INVALID_ARG);
    assert_non_null(strstr(mmrt_last_error(rt), "not valid UTF-8"));
    req.n_stop = MMRT_MAX_STOP + 1;
    assert_int_equal(mmrt_run(rt, &req, NULL, NULL, &res), MMRT_ERR_INVALID_ARG);
    mmrt_destroy(rt);
    json_decref(fc.json);
}

static bool stop_at_three(void *user, int32_t id, const char *text)
{
    (void)text;
    int *n = user;
    return id < 0 || ++*n < 3;
}

/* max_tokens 0 runs until the KV store (here smaller than the context) is full; a callback
 * that returns false ends with MMRT_FINISH_CALLER. */
static void test_finish_reasons(void **state)
{
    (void)state;
    struct fixture_case fc;
    case_load(&fc);
    struct mmrt_runtime *rt = open_rt(0);
    struct mmrt_request req = fc.req;
    req.max_tokens = 3;
    struct stream s;
    struct mmrt_result res;
    run(rt, &req, &s, &res);
    const int n_prompt = res.n_prompt_tokens;
    mmrt_destroy(rt);

    /* Room for the prompt and 21 more positions, rounded to whole pages of 16. */
    const int64_t kv = ((n_prompt + 21 + 15) / 16) * 16;
    rt = open_rt(kv);
    req.max_tokens = 0;
    run(rt, &req, &s, &res);
    assert_int_equal(res.finish_reason, MMRT_FINISH_LENGTH);
    assert_int_equal(res.n_tokens, kv - n_prompt);
    req.max_tokens = 16; /* the store holds 21 */
    int n = 0;
    res = (struct mmrt_result){ .struct_size = sizeof res };
    assert_int_equal(mmrt_run(rt, &req, stop_at_three, &n, &res), MMRT_OK);
    assert_int_equal(res.finish_reason, MMRT_FINISH_CALLER);
    assert_int_equal(res.n_tokens, 3);
    /* An old caller's result (struct_size 0: the first layout) never sees the new fields. */
    struct mmrt_result old[2];
    memset(old, 0x5a, sizeof old);
    old[0].struct_size = (uint32_t)offsetof(struct mmrt_result, finish_reason);
    req.max_tokens = 2;
    assert_int_equal(mmrt_run(rt, &req, NULL, NULL, &old[0]), MMRT_OK);
    const unsigned char *past = (const unsigned char *)&old[0] + old[0].struct_size;
    for (size_t i = 0; i < sizeof old[0] - old[0].struct_size; i++)
        assert_int_equal(past[i], 0x5a);
    mmrt_destroy(rt);
    json_decref(fc.json);
}

/* What the callbacks saw, for one job. */
struct events {
    pthread_mutex_t lock;
    int accepted, done, prompt_tokens, tokens_before_accept;
    int tokens;
    sem_t finished;
};

static bool ev_token(void *user, int32_t id, const char *text)
{
    (void)text;
    struct events *e = user;
    pthread_mutex_lock(&e->lock);
    if (id >= 0) {
        e->tokens++;
        if (!e->accepted)
            e->tokens_before_accept++;
    }
    pthread_mutex_unlock(&e->lock);
    return true;
}

static void ev_accepted(void *user, int n_prompt_tokens)
{
    struct events *e = user;
    pthread_mutex_lock(&e->lock);
    e->accepted++;
    e->prompt_tokens = n_prompt_tokens;
    pthread_mutex_unlock(&e->lock);
}

static void ev_done(void *user)
{
    struct events *e = user;
    pthread_mutex_lock(&e->lock);
    e->done++;
    pthread_mutex_unlock(&e->lock);
    sem_post(&e->finished);
}

static void events_init(struct events *e)
{
    memset(e, 0, sizeof *e);
    pthread_mutex_init(&e->lock, NULL);
    sem_init(&e->finished, 0, 0);
}

static void events_fini(struct events *e)
{
    pthread_mutex_destroy(&e->lock);
    sem_destroy(&e->finished);
}

/* on_accepted comes once, before any token, with the prompt's length; on_done once, last,
 * also for a job that fails before it is accepted (then without on_accepted). While jobs run,
 * mmrt_stats and mmrt_device_memory answer from this thread. */
static void test_job_callbacks_and_stats(void **state)
{
    (void)state;
    struct fixture_case fc;
    case_load(&fc);
    struct mmrt_runtime *rt = open_rt(0);
    struct mmrt_runtime_stats st = { .struct_size = sizeof st };
    assert_int_equal(mmrt_stats(rt, &st), MMRT_OK);
    assert_int_equal(st.requests_waiting + st.requests_running, 0);
    assert_true(st.kv_pages_total > 0);
    assert_true(st.ms_since_progress == 0);

    enum { N = 4 };
    struct events ev[N + 1];
    struct mmrt_job *jobs[N + 1];
    struct mmrt_request req = fc.req;
    req.max_tokens = 12;
    for (int i = 0; i < N; i++) {
        events_init(&ev[i]);
        const struct mmrt_job_callbacks cb = { .struct_size = sizeof cb, .on_token = ev_token,
                                               .on_accepted = ev_accepted, .on_done = ev_done,
                                               .user = &ev[i] };
        assert_int_equal(mmrt_submit_with(rt, &req, &cb, &jobs[i], NULL, 0), MMRT_OK);
    }
    /* A job whose image does not exist: done, never accepted. */
    events_init(&ev[N]);
    struct mmrt_request bad = req;
    bad.images = TEST_FILE("/nonexistent/y.png");
    const struct mmrt_job_callbacks cb = { .on_accepted = ev_accepted, .on_done = ev_done,
                                           .user = &ev[N] }; /* struct_size 0: this layout */
    assert_int_equal(mmrt_submit_with(rt, &bad, &cb, &jobs[N], NULL, 0), MMRT_OK);
    /* Read the figures while the worker steps: never more requests than submitted, pages
     * within the store. */
    bool saw_work = false;
    for (int polls = 0; polls < 100000; polls++) {
        assert_int_equal(mmrt_stats(rt, &st), MMRT_OK);
        assert_true(st.requests_waiting + st.requests_running <= N + 1);
        assert_true(st.kv_pages_used <= st.kv_pages_total);
        struct mmrt_memory_report mr = { .struct_size = sizeof mr };
        assert_int_equal(mmrt_device_memory(rt, 0, &mr), MMRT_OK);
        assert_true(mr.kv_pages_used <= mr.kv_pages_total);
        saw_work |= st.requests_running > 0;
        if (st.requests_waiting + st.requests_running == 0 && polls > 0)
            break;
    }
    (void)saw_work; /* the jobs may finish before the first poll on a fast machine */
    for (int i = 0; i <= N; i++) {
        sem_wait(&ev[i].finished);
        struct mmrt_result res = { .struct_size = sizeof res };
        const mmrt_status s = mmrt_wait(jobs[i], &res);
        assert_int_equal(ev[i].done, 1);
        if (i < N) {
            assert_int_equal(s, MMRT_OK);
            assert_int_equal(ev[i].accepted, 1);
            assert_int_equal(ev[i].tokens_before_accept, 0);
            assert_int_equal(ev[i].prompt_tokens, res.n_prompt_tokens);
            assert_int_equal(ev[i].tokens, 12);
            assert_int_equal(res.finish_reason, MMRT_FINISH_LENGTH);
            assert_true(res.queue_ms >= 0);
        } else {
            assert_int_not_equal(s, MMRT_OK);
            assert_int_equal(ev[i].accepted, 0);
            assert_int_equal(res.finish_reason, MMRT_FINISH_NONE);
        }
        events_fini(&ev[i]);
    }
    assert_int_equal(mmrt_stats(rt, &st), MMRT_OK);
    assert_int_equal(st.requests_waiting + st.requests_running, 0);
    assert_int_equal(st.kv_pages_used, 0);
    assert_true(st.engine_steps > 0);
    /* A too-small stats struct is refused, not overrun. */
    struct mmrt_runtime_stats tiny = { .struct_size = 4 };
    assert_int_equal(mmrt_stats(rt, &tiny), MMRT_ERR_INVALID_ARG);

    /* Jobs left to mmrt_destroy still get on_done (a server's waiting clients wake up). */
    events_init(&ev[0]);
    const struct mmrt_job_callbacks cb0 = { .on_done = ev_done, .user = &ev[0] };
    req.max_tokens = 200;
    assert_int_equal(mmrt_submit_with(rt, &req, &cb0, &jobs[0], NULL, 0), MMRT_OK);
    mmrt_destroy(rt);
    assert_int_equal(ev[0].done, 1);
    events_fini(&ev[0]);
    json_decref(fc.json);
}

/* The same with the vision stage on OpenCL: the worker's vision thread encodes while it
 * steps the engine on the CPU, and everything above holds; a job's tokens are those of its
 * solo run. */
static void test_job_callbacks_split_stages(void **state)
{
    g_vision_plugin = "opencl";
    test_job_callbacks_and_stats(state);
    struct fixture_case fc;
    case_load(&fc);
    struct mmrt_runtime *rt = open_rt(0);
    enum { N = 6 };
    struct stream solo, got[N];
    struct mmrt_result res;
    fc.req.max_tokens = 10;
    run(rt, &fc.req, &solo, &res);
    struct mmrt_job *jobs[N];
    for (int i = 0; i < N; i++) {
        memset(&got[i], 0, sizeof got[i]);
        assert_int_equal(mmrt_submit(rt, &fc.req, on_text, &got[i], &jobs[i], NULL, 0),
                         MMRT_OK);
    }
    for (int i = 0; i < N; i++) {
        res = (struct mmrt_result){ .struct_size = sizeof res };
        assert_int_equal(mmrt_wait(jobs[i], &res), MMRT_OK);
        assert_int_equal(got[i].n_ids, solo.n_ids);
        assert_memory_equal(got[i].ids, solo.ids, (size_t)solo.n_ids * sizeof solo.ids[0]);
        assert_true(res.vision_end_ms <= res.language_start_ms);
    }
    struct mmrt_runtime_stats st = { .struct_size = sizeof st };
    assert_int_equal(mmrt_stats(rt, &st), MMRT_OK);
    assert_int_equal(st.vision_batch_requests, N);
    assert_true(st.vision_batches >= 1 && st.vision_batches <= N);
    /* Destroyed with jobs waiting for (or in) their vision stage: each still ends. */
    for (int i = 0; i < N; i++)
        assert_int_equal(mmrt_submit(rt, &fc.req, on_text, &got[i], &jobs[i], NULL, 0),
                         MMRT_OK);
    mmrt_destroy(rt);
    json_decref(fc.json);
    g_vision_plugin = NULL;
}

int main(void)
{
    mmrt_set_log_sink(golden_quiet, NULL, MMRT_LOG_WARN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stop_strings),
        cmocka_unit_test(test_finish_reasons),
        cmocka_unit_test(test_job_callbacks_and_stats),
        cmocka_unit_test(test_job_callbacks_split_stages),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
