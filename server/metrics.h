/*
 * server/metrics.h — the server's Prometheus metrics (docs/SERVING.md "Metrics").
 *
 * Counters and histograms the HTTP layer records per request, plus gauges read from the
 * runtime (mmrt_stats, mmrt_device_memory) when /metrics is scraped. One mutex guards the
 * recorded values: a request records a handful of numbers once, when it ends, so the lock
 * is never contended for long.
 */
#ifndef MMRT_SERVER_METRICS_H
#define MMRT_SERVER_METRICS_H

#include <pthread.h>
#include <stdint.h>

#include "mmrt/mmrt.h"

/* How a chat completion ended, as mmrt_requests_total{outcome} counts it. */
enum mmrt_outcome {
    MMRT_OUTCOME_OK,        /* answered (200) */
    MMRT_OUTCOME_INVALID,   /* refused as malformed or over a limit (4xx but 429) */
    MMRT_OUTCOME_REJECTED,  /* queue full or not ready (429, 503) */
    MMRT_OUTCOME_FAILED,    /* the runtime failed it (5xx) */
    MMRT_OUTCOME_CANCELLED, /* the client went away */
    MMRT_OUTCOME_COUNT
};

#define MMRT_HIST_BUCKETS 16

struct mmrt_histogram {
    const char *name, *help;
    int n_bounds;
    double bounds[MMRT_HIST_BUCKETS]; /* upper bounds in seconds, increasing; +Inf implied */
    uint64_t counts[MMRT_HIST_BUCKETS + 1];
    double sum;
    uint64_t count;
};

enum mmrt_hist_id {
    MMRT_HIST_TTFT,        /* arrival → first token */
    MMRT_HIST_QUEUE,       /* waiting rather than working (mmrt_result.queue_ms) */
    MMRT_HIST_PREPROCESS,
    MMRT_HIST_VISION,
    MMRT_HIST_PREFILL,
    MMRT_HIST_DECODE_TOKEN, /* per generated token after the first */
    MMRT_HIST_E2E,          /* arrival → last byte queued */
    MMRT_HIST_COUNT
};

struct mmrt_metrics {
    pthread_mutex_t lock;
    uint64_t outcomes[MMRT_OUTCOME_COUNT];
    uint64_t http[6];          /* responses by status class: 1xx … 5xx (index 1 … 5) */
    uint64_t prompt_tokens, generated_tokens;
    struct mmrt_histogram hist[MMRT_HIST_COUNT];
};

void mmrt_metrics_init(struct mmrt_metrics *m);
void mmrt_metrics_destroy(struct mmrt_metrics *m);

void mmrt_metrics_outcome(struct mmrt_metrics *m, enum mmrt_outcome o);
void mmrt_metrics_http(struct mmrt_metrics *m, unsigned status);
/* A finished request's figures; ttft_ms < 0 when no token came. */
void mmrt_metrics_request(struct mmrt_metrics *m, const struct mmrt_result *r, double ttft_ms,
                          double e2e_ms);

/* The whole exposition (text format 0.0.4), malloc'ed; NULL when out of memory. rt may be
 * NULL (still loading): then only the recorded values and mmrt_ready 0 appear. */
char *mmrt_metrics_render(struct mmrt_metrics *m, struct mmrt_runtime *rt, int ready);

#endif
