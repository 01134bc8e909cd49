/* server/metrics.c — recording and the Prometheus text exposition (metrics.h). */
#include "metrics.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text.h"

/* Bounds in seconds: token-level figures live between 1 ms and 1 s, request-level ones up
 * to minutes on a CPU. */
static const double fine[] = { 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1,
                               2.5 };
static const double coarse[] = { 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 25, 60,
                                 120, 300 };

static void hist_init(struct mmrt_histogram *h, const char *name, const char *help,
                      const double *bounds, int n)
{
    memset(h, 0, sizeof *h);
    h->name = name;
    h->help = help;
    h->n_bounds = n;
    memcpy(h->bounds, bounds, (size_t)n * sizeof *bounds);
}

#define N(a) ((int)(sizeof(a) / sizeof((a)[0])))

void mmrt_metrics_init(struct mmrt_metrics *m)
{
    memset(m, 0, sizeof *m);
    pthread_mutex_init(&m->lock, NULL);
    struct mmrt_histogram *h = m->hist;
    hist_init(&h[MMRT_HIST_TTFT], "mmrt_time_to_first_token_seconds",
              "Time from a request's arrival to its first generated token.", coarse,
              N(coarse));
    hist_init(&h[MMRT_HIST_QUEUE], "mmrt_queue_wait_seconds",
              "Time a request waited for the vision stage, a batch slot or KV pages.", coarse,
              N(coarse));
    hist_init(&h[MMRT_HIST_PREPROCESS], "mmrt_preprocess_seconds",
              "Image decoding and preprocessing per request (0 on a vision-cache hit).",
              coarse, N(coarse));
    hist_init(&h[MMRT_HIST_VISION], "mmrt_vision_seconds",
              "Vision tower per request (0 on a vision-cache hit).", coarse, N(coarse));
    hist_init(&h[MMRT_HIST_PREFILL], "mmrt_prefill_seconds",
              "From the first prefill chunk to the first token.", coarse, N(coarse));
    hist_init(&h[MMRT_HIST_DECODE_TOKEN], "mmrt_decode_token_seconds",
              "Time per generated token after the first (inter-token latency).", fine,
              N(fine));
    hist_init(&h[MMRT_HIST_E2E], "mmrt_request_seconds",
              "From a chat completion's arrival to its last token.", coarse, N(coarse));
}

void mmrt_metrics_destroy(struct mmrt_metrics *m)
{
    pthread_mutex_destroy(&m->lock);
}

static void observe(struct mmrt_histogram *h, double seconds)
{
    if (!(seconds >= 0))
        return;
    int b = 0;
    while (b < h->n_bounds && seconds > h->bounds[b])
        b++;
    h->counts[b]++;
    h->sum += seconds;
    h->count++;
}

void mmrt_metrics_outcome(struct mmrt_metrics *m, enum mmrt_outcome o)
{
    pthread_mutex_lock(&m->lock);
    m->outcomes[o]++;
    pthread_mutex_unlock(&m->lock);
}

void mmrt_metrics_http(struct mmrt_metrics *m, unsigned status)
{
    const unsigned c = status / 100;
    pthread_mutex_lock(&m->lock);
    if (c >= 1 && c <= 5)
        m->http[c]++;
    pthread_mutex_unlock(&m->lock);
}

void mmrt_metrics_request(struct mmrt_metrics *m, const struct mmrt_result *r, double ttft_ms,
                          double e2e_ms)
{
    pthread_mutex_lock(&m->lock);
    m->prompt_tokens += (uint64_t)(r->n_prompt_tokens > 0 ? r->n_prompt_tokens : 0);
    m->generated_tokens += (uint64_t)(r->n_tokens > 0 ? r->n_tokens : 0);
    if (ttft_ms >= 0)
        observe(&m->hist[MMRT_HIST_TTFT], ttft_ms / 1e3);
    observe(&m->hist[MMRT_HIST_QUEUE], r->queue_ms / 1e3);
    observe(&m->hist[MMRT_HIST_PREPROCESS], r->preprocess_ms / 1e3);
    observe(&m->hist[MMRT_HIST_VISION], r->vision_ms / 1e3);
    if (r->n_tokens > 0)
        observe(&m->hist[MMRT_HIST_PREFILL], r->prefill_ms / 1e3);
    /* One observation per token, so the histogram's quantiles are per token. */
    if (r->n_tokens > 1) {
        const double per = r->decode_ms / 1e3 / (r->n_tokens - 1);
        for (int i = 0; i < r->n_tokens - 1; i++)
            observe(&m->hist[MMRT_HIST_DECODE_TOKEN], per);
    }
    observe(&m->hist[MMRT_HIST_E2E], e2e_ms / 1e3);
    pthread_mutex_unlock(&m->lock);
}

static void addf(struct mmrt_text *t, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static void addf(struct mmrt_text *t, const char *fmt, ...)
{
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (n > 0)
        mmrt_text_addn(t, buf, (size_t)n < sizeof buf ? (size_t)n : sizeof buf - 1);
}

static void head(struct mmrt_text *t, const char *name, const char *type, const char *help)
{
    addf(t, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void one(struct mmrt_text *t, const char *name, const char *type, const char *help,
                double v)
{
    head(t, name, type, help);
    addf(t, "%s %.17g\n", name, v);
}

static void render_hist(struct mmrt_text *t, const struct mmrt_histogram *h)
{
    head(t, h->name, "histogram", h->help);
    uint64_t cum = 0;
    for (int b = 0; b < h->n_bounds; b++) {
        cum += h->counts[b];
        addf(t, "%s_bucket{le=\"%g\"} %llu\n", h->name, h->bounds[b], (unsigned long long)cum);
    }
    cum += h->counts[h->n_bounds];
    addf(t, "%s_bucket{le=\"+Inf\"} %llu\n", h->name, (unsigned long long)cum);
    addf(t, "%s_sum %.17g\n%s_count %llu\n", h->name, h->sum, h->name,
         (unsigned long long)h->count);
}

/* A device name as a label value: escaped as the text format requires. */
static void label(char *out, size_t size, const char *s)
{
    size_t o = 0;
    for (; *s && o + 3 < size; s++) {
        if (*s == '"' || *s == '\\')
            out[o++] = '\\';
        out[o++] = *s == '\n' ? ' ' : *s;
    }
    out[o] = '\0';
}

char *mmrt_metrics_render(struct mmrt_metrics *m, struct mmrt_runtime *rt, int ready)
{
    struct mmrt_text t = { 0 };
    static const char *const outcome[MMRT_OUTCOME_COUNT] = { "ok", "invalid", "rejected",
                                                             "failed", "cancelled" };
    pthread_mutex_lock(&m->lock);
    head(&t, "mmrt_requests_total", "counter", "Chat completions by outcome.");
    for (int i = 0; i < MMRT_OUTCOME_COUNT; i++)
        addf(&t, "mmrt_requests_total{outcome=\"%s\"} %llu\n", outcome[i],
             (unsigned long long)m->outcomes[i]);
    head(&t, "mmrt_http_responses_total", "counter", "HTTP responses by status class.");
    for (int c = 1; c <= 5; c++)
        addf(&t, "mmrt_http_responses_total{code=\"%dxx\"} %llu\n", c,
             (unsigned long long)m->http[c]);
    one(&t, "mmrt_prompt_tokens_total", "counter", "Prompt tokens of answered requests.",
        (double)m->prompt_tokens);
    one(&t, "mmrt_generation_tokens_total", "counter", "Tokens generated.",
        (double)m->generated_tokens);
    for (int i = 0; i < MMRT_HIST_COUNT; i++)
        render_hist(&t, &m->hist[i]);
    pthread_mutex_unlock(&m->lock);
    one(&t, "mmrt_ready", "gauge", "1 when the server takes requests (/health/ready).", ready);
    struct mmrt_runtime_stats st = { .struct_size = sizeof st };
    if (rt && mmrt_stats(rt, &st) == MMRT_OK) {
        one(&t, "mmrt_requests_running", "gauge", "Requests prefilling or decoding.",
            (double)st.requests_running);
        one(&t, "mmrt_requests_waiting", "gauge",
            "Requests waiting for the vision stage, a batch slot or KV pages.",
            (double)st.requests_waiting);
        one(&t, "mmrt_engine_steps_total", "counter", "Engine iterations.",
            (double)st.engine_steps);
        one(&t, "mmrt_preemptions_total", "counter",
            "Sequences preempted because KV pages ran out.", (double)st.preemptions);
        one(&t, "mmrt_kv_pages_used", "gauge", "KV cache pages held by requests.",
            (double)st.kv_pages_used);
        one(&t, "mmrt_kv_pages_total", "gauge", "KV cache pages in the store.",
            (double)st.kv_pages_total);
        one(&t, "mmrt_kv_page_tokens", "gauge", "Positions per KV page.",
            (double)st.kv_page_tokens);
        one(&t, "mmrt_vision_cache_entries", "gauge", "Images held by the vision-feature cache.",
            (double)st.vision_cache_entries);
        one(&t, "mmrt_vision_cache_bytes", "gauge", "Feature bytes the vision cache holds.",
            (double)st.vision_cache_bytes);
        one(&t, "mmrt_vision_cache_queries_total", "counter", "Vision-cache lookups.",
            (double)st.vision_cache_queries);
        one(&t, "mmrt_vision_cache_hits_total", "counter", "Vision-cache hits.",
            (double)st.vision_cache_hits);
        one(&t, "mmrt_vision_cache_evictions_total", "counter", "Vision-cache evictions.",
            (double)st.vision_cache_evictions);
        one(&t, "mmrt_prefix_cache_hits_total", "counter",
            "Requests that shared a cached prompt prefix's KV.", (double)st.prefix_cache_hits);
        one(&t, "mmrt_prefix_cache_reused_tokens_total", "counter",
            "Prompt tokens shared from cached prefixes, not prefilled.",
            (double)st.prefix_cache_reused_tokens);
        one(&t, "mmrt_prefix_cache_prompt_hits_total", "counter",
            "Requests whose whole prompt was cached: nothing prefilled.",
            (double)st.prefix_cache_prompt_hits);
        one(&t, "mmrt_json_schema_lookups_total", "counter",
            "Lookups of JSON answers' schemas in the compiled-schema cache.",
            (double)st.json_schema_lookups);
        one(&t, "mmrt_json_schema_compiles_total", "counter",
            "JSON schemas compiled because the cache did not hold them.",
            (double)st.json_schema_compiles);
        one(&t, "mmrt_draft_tokens_total", "counter",
            "Drafted tokens decode steps checked ([scheduler] draft_tokens).",
            (double)st.draft_tokens);
        one(&t, "mmrt_draft_accepted_total", "counter",
            "Drafted tokens the sequences took: decode steps saved.",
            (double)st.draft_accepted);
        one(&t, "mmrt_vision_batches_total", "counter",
            "Vision stages the worker ran (each for up to [scheduler] vision_batch requests).",
            (double)st.vision_batches);
        one(&t, "mmrt_vision_batch_requests_total", "counter",
            "Requests those vision stages encoded (÷ batches = the mean vision batch).",
            (double)st.vision_batch_requests);
        one(&t, "mmrt_image_kv_compressions_total", "counter",
            "Sequences whose image-token K/V were compressed after prefill.",
            (double)st.image_kv_compressions);
        one(&t, "mmrt_image_kv_dropped_tokens_total", "counter",
            "Image positions those sequences' KV caches gave up.",
            (double)st.image_kv_dropped_tokens);
        const int n = mmrt_device_count(rt);
        static const struct {
            const char *name, *help;
        } dev_metrics[] = {
            { "mmrt_pool_capacity_bytes", "Working pool reserved on the device." },
            { "mmrt_pool_bytes_in_use", "Pool bytes allocated now." },
            { "mmrt_pool_peak_bytes", "Most pool bytes allocated since start." },
            { "mmrt_pool_fragmentation", "1 - largest free block / free bytes." },
            { "mmrt_weight_bytes", "Weight bytes placed on the device." },
        };
        for (size_t k = 0; k < sizeof dev_metrics / sizeof dev_metrics[0]; k++) {
            head(&t, dev_metrics[k].name, "gauge", dev_metrics[k].help);
            for (int i = 0; i < n; i++) {
                struct mmrt_device_desc d;
                struct mmrt_memory_report mr = { .struct_size = sizeof mr };
                if (mmrt_device_describe(rt, i, &d) != MMRT_OK ||
                    mmrt_device_memory(rt, i, &mr) != MMRT_OK)
                    continue;
                const double v[] = { (double)mr.pool_capacity_bytes,
                                     (double)mr.pool_bytes_in_use, (double)mr.pool_peak_bytes,
                                     mr.pool_fragmentation, (double)mr.weight_bytes };
                char name[80], plugin[80];
                label(name, sizeof name, d.name);
                label(plugin, sizeof plugin, d.plugin);
                addf(&t, "%s{device=\"%s\",plugin=\"%s\"} %.17g\n", dev_metrics[k].name, name,
                     plugin, v[k]);
            }
        }
    }
    if (t.failed) {
        free(t.s);
        return NULL;
    }
    return t.s;
}
