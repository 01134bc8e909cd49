/*
 * tools/bench/main.c — mmrt-bench: a vision-language request on a real published shape with
 * synthetic weights, timed per stage and held to this machine's limits measured in the same
 * run (bench.h says which limit goes with which stage).
 *
 * Run: probes → load (mmrt_create on the cached synthetic checkpoint, placement from --conf
 * or everything on one CPU device) → warm-up requests → `repeat` measured rounds of `batch`
 * requests, the probes run again before each round and after the last. Figures are medians
 * over every measured request; each limit is the best any probe saw (a neighbour taking
 * bandwidth during the run lowers the figure and may lower some probes, but the limit never
 * gets credit for it), and the lowest probe is reported next to it to show the spread.
 * Every request gets its own synthetic image, so no cache keyed on image bytes can skip
 * the vision stage of a later one. --vision-cache adds a phase that does the opposite: after
 * the rounds, `repeat` fresh images each run twice in a row, a vision-cache miss and then a
 * hit, and the time to first token of each (from the mmrt_run call to the first token's
 * callback) is reported, with the hit/miss ratio next to the 0.5 the serving issue asks for.
 *
 * Before any work (no checkpoint written, no probe run) the run is refused, exit status 2,
 * when: the shape is unknown; the runtime's model registry has no implementation of the
 * shape's model type; the cache folder cannot be written; the checkpoint would not fit the
 * free disk space there; the weights would not fit the memory available to this process (the
 * CPU plugin keeps them in host memory); or a pool set by --conf is smaller than the weights
 * of the stage placed on it. A placement the runtime refuses when it loads the model (an
 * op or weight dtype a plugin lacks) is exit status 2 as well; a kernel that refuses a dtype
 * only while running fails the request (exit status 1, with its message).
 *
 * --dry-run stops before all of that and prints what the run would use: the checkpoint's
 * config.json and tensor list, its size, the image plan, the work and the pool sizes.
 *
 * Exit status: 0 success; 1 the run failed; 2 usage, configuration, or a shape this build
 * cannot run.
 */
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#include "bench.h"
#include "engine.h"
#include "formats/conf.h"
#include "mmrt/mmrt.h"
#include "model.h"
#include "pool_budget.h"
#include "quant.h"

enum { EXIT_RUN_FAILED = 1, EXIT_USAGE = 2 };

#define MAX_DEVS 8

/* Tokens the chat template and the special tokens add around the user prompt and the image
 * (Qwen2-VL's default system prompt is the longest: about 60 byte-level tokens), for
 * sizing pools only. */
#define TEMPLATE_TOKENS 128

struct options {
    const char *shape, *conf, *cache;
    int64_t layers;
    enum bench_dtype dtype;
    int image_size, prompt_tokens, gen_tokens, batch, repeat, warmup, probe_mb, probe_passes;
    int concurrency;
    int vision_batch; /* [scheduler] vision_batch; 0 = the runtime's default */
    bool json, quiet, limits_only, dry_run, mix, vision_cache;
    enum mmrt_kv_dtype kv_dtype; /* --kv-dtype */
    enum mmrt_weight_format weights; /* --weights */
    int threads;
    double image_kv_keep;            /* --image-kv-keep; 0 = off */
    enum mmrt_image_kv_policy image_kv_policy;
    float temperature, top_p;        /* --temperature (0 = greedy), --top-p */
    int top_k;                       /* --top-k (0 = off) */
    int response_format;             /* --response-format (enum mmrt_response_format) */
    int draft_tokens, draft_rows;    /* --draft-tokens, --draft-rows (0: off, the default) */
    bool prediction;                 /* --prediction */
    bool solo;                       /* --solo */
};

static void usage(FILE *f)
{
    fprintf(f,
            "usage: mmrt-bench [options]\n"
            "  --shape NAME        %s (default llava-1.5-7b)\n"
            "  --layers N          cut both towers to N layers (default: all)\n"
            "  --dtype T           f32|f16|bf16 weights (default f16)\n"
            "  --conf FILE         deploy.ini for placement ([device.*], [stage.*]; its [model]\n"
            "                      and [run] are ignored); default: everything on the cpu plugin\n"
            "  --image-size N      synthetic input image N×N pixels (default: LLaVA its config\n"
            "                      size, 336; Qwen2-VL 448, 256 image tokens; Fuyu 1080, the\n"
            "                      processor's largest unresized square, 1332 image tokens)\n"
            "  --prompt-tokens N   user prompt of exactly N tokens (default 32)\n"
            "  --gen-tokens N      tokens to generate (default 32; the synthetic model never\n"
            "                      stops early)\n"
            "  --batch N, --requests N\n"
            "                      requests per round, all submitted at once to the engine\n"
            "                      through mmrt_run_batch (default 1)\n"
            "  --concurrency N     sequences the engine runs at once ([scheduler] max_batch,\n"
            "                      1..32; default: the round's requests, at most 32)\n"
            "  --kv-dtype T        f32|f16|fp8|int8 KV cache ([model] kv_dtype; default f32)\n"
            "  --vision-batch N    requests whose vision stages run together ([scheduler]\n"
            "                      vision_batch, 1..32; default the runtime's, 1)\n"
            "  --weights W         checkpoint|int8|int4|int4-g64|int4-g32: matmul weights as\n"
            "                      --dtype writes them, or quantized at load ([model] weights;\n"
            "                      default checkpoint)\n"
            "  --image-kv-keep R   image-token KV compression after prefill: each layer and\n"
            "                      head keeps R (0 < R ≤ 1) of the image tokens' K/V ([model]\n"
            "                      image_kv_keep; default 1, off)\n"
            "  --image-kv-policy P key_norm_high|key_norm_low|random|pool2x2 ([model]\n"
            "                      image_kv_policy; default the runtime's)\n"
            "  --temperature T     sample at temperature T, request i with seed i (default 0:\n"
            "                      greedy); --top-k K and --top-p P cut the candidates as in\n"
            "                      a request (defaults 0 and 1: off)\n"
            "  --response-format F text|json_object: each answer held to one JSON object (the\n"
            "                      token mask's cost, docs/ENGINE.md \"JSON answers\";\n"
            "                      default text)\n"
            "  --draft-tokens N    speculative decoding: up to N drafted tokens per sequence\n"
            "                      and step, looked up in the sequence itself ([scheduler]\n"
            "                      draft_tokens, 0..31; default 0: off); --draft-rows R: the\n"
            "                      rows a decode step may reach with them (default N + 1)\n"
            "  --prediction        each measured request carries as its prediction\n"
            "                      (mmrt_request.prediction) the answer it gave in an\n"
            "                      unmeasured run before: an answer asked for again\n"
            "  --mix               vary the requests of a round: image sizes ½, ¾, 1 and 1¼ ×\n"
            "                      --image-size, prompts ½, 1, 2 and 4 × --prompt-tokens\n"
            "  --solo              after each round its first request again, alone: one\n"
            "                      sequence's decode rate measured minutes from the batch's,\n"
            "                      and the batched rate as a multiple of it\n"
            "  --repeat N          measured rounds; figures are medians (default 3)\n"
            "  --vision-cache      then time to first token of a vision-cache miss and of a\n"
            "                      hit: --repeat fresh images, each run twice (1 token)\n"
            "  --warmup N          unmeasured requests first (default 1)\n"
            "  --cache DIR         synthetic checkpoints (default ~/.cache/mmrt-bench)\n"
            "  --probe-mb N        read-bandwidth probe buffer (default 1024 MiB)\n"
            "  --limits-only       only measure and print the limits (--threads N, default:\n"
            "                      all CPUs), no model\n"
            "  --dry-run           print the checkpoint (config, tensors, size), the image\n"
            "                      plan, the work and the pool sizes; write and run nothing\n"
            "  --json              one JSON record on stdout instead of the table\n"
            "  --quiet             no progress lines on stderr\n",
            bench_shape_names());
}

static int parse_int(const char *flag, const char *arg, long lo, long hi, int *out)
{
    char *end;
    errno = 0;
    long v = strtol(arg, &end, 10);
    if (errno || end == arg || *end || v < lo || v > hi) {
        fprintf(stderr, "mmrt-bench: %s \"%s\": expected an integer from %ld to %ld\n", flag, arg,
                lo, hi);
        return -1;
    }
    *out = (int)v;
    return 0;
}

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* --mix: request k of a round takes image size factor MIX_IMAGE[k % 4] and prompt factor
 * MIX_PROMPT[(k / 4) % 4] (in quarters), so a round of 16 has every pair once. */
static const int MIX_IMAGE[4] = { 2, 3, 4, 5 }, MIX_PROMPT[4] = { 2, 4, 8, 16 };

static int mix_image(const struct options *o, int k)
{
    if (!o->mix)
        return o->image_size;
    int v = o->image_size * MIX_IMAGE[k % 4] / 4;
    return v < 28 ? 28 : v;
}

static int mix_prompt(const struct options *o, int k)
{
    return o->mix ? o->prompt_tokens * MIX_PROMPT[(k / 4) % 4] / 4 : o->prompt_tokens;
}

/* When each request's tokens arrived, from the batch callback. */
struct latency {
    double t0;          /* the round's start */
    double *first, *last; /* [n_req] ms since t0; 0 until the first token */
    double *gaps;       /* inter-token gaps of every request */
    size_t n_gaps, cap_gaps;
    double *times;      /* [n_req][per_req]: when each token arrived */
    int *n_times, per_req;
    int base;           /* request index of the round's first request */
};

/* Decode throughput of one round while every one of its requests decodes: from the last
 * first token to the first last token, the tokens that arrived in between over that time
 * (0 tokens when the window is empty, e.g. one token each). */
static void decode_window(const struct latency *l, int base, int n, double *tokens,
                          double *ms)
{
    double t0 = 0, t1 = INFINITY;
    for (int i = base; i < base + n; i++) {
        t0 = l->first[i] > t0 ? l->first[i] : t0;
        t1 = l->last[i] < t1 ? l->last[i] : t1;
    }
    *tokens = 0;
    *ms = t1 > t0 ? t1 - t0 : 0;
    for (int i = base; i < base + n && *ms > 0; i++)
        for (int k = 0; k < l->n_times[i]; k++)
            *tokens += l->times[(size_t)i * (size_t)l->per_req + (size_t)k] > t0 &&
                       l->times[(size_t)i * (size_t)l->per_req + (size_t)k] <= t1;
}

static bool on_bench_token(void *user, int request, int32_t id, const char *text)
{
    struct latency *l = user;
    (void)text;
    if (id < 0)
        return true;
    const int i = l->base + request;
    const double t = now_ms() - l->t0;
    if (l->n_times[i] < l->per_req)
        l->times[(size_t)i * (size_t)l->per_req + (size_t)l->n_times[i]++] = t;
    if (l->first[i] == 0)
        l->first[i] = t;
    else if (l->n_gaps < l->cap_gaps)
        l->gaps[l->n_gaps++] = t - l->last[i];
    l->last[i] = t;
    return true;
}

/* An answer's text as it streams (--prediction). */
struct text_buf {
    char *s;
    size_t len, cap;
    bool failed;
};

static bool on_text(void *user, int32_t id, const char *text)
{
    struct text_buf *b = user;
    (void)id;
    const size_t n = strlen(text);
    if (b->len + n + 1 > b->cap) {
        const size_t cap = 2 * (b->len + n + 1);
        char *g = realloc(b->s, cap);
        if (!g) {
            b->failed = true;
            return false;
        }
        b->s = g;
        b->cap = cap;
    }
    memcpy(b->s + b->len, text, n + 1);
    b->len += n;
    return true;
}

static bool g_quiet;

static void progress(const char *line)
{
    if (!g_quiet)
        fprintf(stderr, "mmrt-bench: %s\n", line);
}

static void log_sink(void *user, enum mmrt_log_level level, const char *who, const char *msg)
{
    (void)user;
    (void)level;
    fprintf(stderr, "mmrt-bench: [%s] %s\n", who ? who : "mmrt", msg);
}

static void cpu_model(char *out, size_t size)
{
    snprintf(out, size, "unknown CPU");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f)
        return;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        char *v = strchr(line, ':');
        if (strncmp(line, "model name", 10) != 0 || !v)
            continue;
        v++;
        while (*v == ' ' || *v == '\t')
            v++;
        v[strcspn(v, "\r\n")] = '\0';
        snprintf(out, size, "%s", v);
        break;
    }
    fclose(f);
}

/* CPU seconds this process has used (all threads, user + system). */
static double cpu_seconds(void)
{
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) != 0)
        return 0;
    return (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec * 1e-6 +
           (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec * 1e-6;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
    if (n <= 0)
        return NAN;
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* The q-quantile (nearest rank) of v[n], sorted in place. */
static double quantile(double *v, size_t n, double q)
{
    if (n == 0)
        return NAN;
    qsort(v, n, sizeof *v, cmp_double);
    size_t k = (size_t)ceil(q * (double)n);
    return v[k > 0 ? k - 1 : 0];
}

/* ---- --vision-cache ------------------------------------------------------------------------ */

/* When one request's first token came, from its mmrt_run call. */
struct first_token {
    double t0, ms;
    int32_t id;
};

static bool on_first_token(void *user, int32_t id, const char *text)
{
    struct first_token *f = user;
    (void)text;
    if (id >= 0 && f->ms < 0) {
        f->ms = now_ms() - f->t0;
        f->id = id;
    }
    return true;
}

/* What the --vision-cache phase measured. */
struct cache_phase {
    int pairs;
    double miss_ttft_ms, hit_ttft_ms;         /* medians */
    double miss_vision_ms, miss_preprocess_ms; /* medians of what the hits skipped */
    uint64_t queries, hits;                    /* the runtime's counters over the phase */
    uint64_t prefix_hits, prefix_reused_tokens; /* prefix reuse over the phase (engine.h) */
};

/* --repeat fresh images, each a miss then a hit (one token each); the tokens must agree and
 * every second run must be a hit. Returns 0, or -1 with the reason in err. */
static int run_cache_phase(struct mmrt_runtime *rt, const struct options *o, const char *ckpt,
                           const char *prompt, struct cache_phase *out, char *err,
                           size_t err_size)
{
    const int n = o->repeat;
    double *v = calloc((size_t)n * 4, sizeof *v);
    if (!v) {
        snprintf(err, err_size, "out of memory");
        return -1;
    }
    double *miss = v, *hit = v + n, *vis = v + 2 * n, *pre = v + 3 * n;
    struct mmrt_runtime_stats s0 = { .struct_size = sizeof s0 }, s1 = s0;
    mmrt_stats(rt, &s0);
    int rc = 0;
    for (int k = 0; k < n && rc == 0; k++) {
        char path[4200];
        snprintf(path, sizeof path, "%s/vcache-%d-%d.png", ckpt, o->image_size, k);
        if (bench_synth_image(path, o->image_size, (uint32_t)(1000000 + k), err, err_size) != 0) {
            rc = -1;
            break;
        }
        const struct mmrt_image_input in = { .path = path };
        const struct mmrt_request req = { .images = &in, .n_images = 1, .prompt = prompt,
                                          .max_tokens = 1, .top_p = 1.0f };
        struct first_token f[2];
        for (int t = 0; t < 2 && rc == 0; t++) {
            struct mmrt_result res = { .struct_size = sizeof res };
            f[t] = (struct first_token){ .t0 = now_ms(), .ms = -1 };
            if (mmrt_run(rt, &req, on_first_token, &f[t], &res) != MMRT_OK || f[t].ms < 0) {
                snprintf(err, err_size, "vision-cache %s request: %s", t ? "hit" : "miss",
                         mmrt_last_error(rt));
                rc = -1;
            } else if (t == 0) {
                vis[k] = res.vision_ms;
                pre[k] = res.preprocess_ms;
            }
        }
        if (rc == 0 && f[0].id != f[1].id) {
            snprintf(err, err_size, "vision-cache hit gave token %d, the miss %d", f[1].id,
                     f[0].id);
            rc = -1;
        }
        miss[k] = f[0].ms;
        hit[k] = f[1].ms;
        remove(path);
    }
    mmrt_stats(rt, &s1);
    if (rc == 0 && s1.vision_cache_hits - s0.vision_cache_hits != (uint64_t)n) {
        snprintf(err, err_size, "vision cache: %llu hits in %d repeated requests (is it off?)",
                 (unsigned long long)(s1.vision_cache_hits - s0.vision_cache_hits), n);
        rc = -1;
    }
    if (rc == 0)
        *out = (struct cache_phase){
            .pairs = n, .miss_ttft_ms = median(miss, n), .hit_ttft_ms = median(hit, n),
            .miss_vision_ms = median(vis, n), .miss_preprocess_ms = median(pre, n),
            .queries = s1.vision_cache_queries - s0.vision_cache_queries,
            .hits = s1.vision_cache_hits - s0.vision_cache_hits,
            .prefix_hits = s1.prefix_cache_hits - s0.prefix_cache_hits,
            .prefix_reused_tokens = s1.prefix_cache_reused_tokens -
                                    s0.prefix_cache_reused_tokens,
        };
    free(v);
    return rc;
}

/* ---- placement ----------------------------------------------------------------------------- */

struct placement {
    struct mmrt_conf *conf;                  /* NULL without --conf */
    struct mmrt_device_config dev[MAX_DEVS];
    struct mmrt_option *opts[MAX_DEVS];
    int n_dev;
    int vision, language;                    /* device indices */
    bool pool_given[MAX_DEVS];
};

/* "1234 GFLOP/s", or why there is no AMX figure. Returns a static buffer. */
static const char *amx_text(const struct bench_limits *l, bool low)
{
    static char buf[192];
    if (l->amx_gflops > 0)
        snprintf(buf, sizeof buf, "%.0f GFLOP/s", low ? l->amx_gflops_low : l->amx_gflops);
    else
        snprintf(buf, sizeof buf, "none (%s)", l->amx_why);
    return buf;
}

/* Whether the CPU plugin's device name lists this choice whole: "+bf16_dot:amx" followed by
 * the end of its kernels' part (']') or the next choice ('+'), never by more of a longer
 * unit's name (cpu_plugin.c writes the part). */
static bool names_choice(const char *device_name, const char *choice)
{
    for (const char *p = strstr(device_name, choice); p; p = strstr(p + 1, choice)) {
        const char next = p[strlen(choice)];
        if (next == ']' || next == '+')
            return true;
    }
    return false;
}

/* The unit whose peak holds a CPU stage: the one the CPU plugin says it runs BF16 weights on
 * (its device name lists "+bf16_dot:amx" or "+bf16_dot:avx512_bf16"), so the limit follows
 * what ran, not what the option asked for; everything else runs f32 FMAs. A unit this
 * process could not probe falls back to the FMA peak. */
static const char *peak_unit(const char *device_name, int dtype, const struct bench_limits *l,
                             double *peak)
{
    if (dtype == BENCH_BF16 && names_choice(device_name, "+bf16_dot:amx") &&
        l->amx_gflops > 0) {
        *peak = l->amx_gflops;
        return "AMX bf16";
    }
    if (dtype == BENCH_BF16 && names_choice(device_name, "+bf16_dot:avx512_bf16") &&
        l->bf16_gflops > 0) {
        *peak = l->bf16_gflops;
        return "bf16 dot";
    }
    *peak = l->f32_gflops;
    return "f32 FMA";
}

static const char *dev_option(const struct placement *p, int i, const char *key)
{
    for (int k = 0; k < p->dev[i].n_options; k++)
        if (strcmp(p->dev[i].options[k].key, key) == 0)
            return p->dev[i].options[k].value;
    return NULL;
}

static int load_placement(const char *conf_path, struct placement *p)
{
    static const struct mmrt_option none[1];
    memset(p, 0, sizeof *p);
    if (!conf_path) {
        p->dev[0] = (struct mmrt_device_config){ .name = "cpu0", .plugin = "cpu",
                                                 .options = none, .n_options = 0 };
        p->n_dev = 1;
        return 0;
    }
    struct mmrt_error e = { 0 };
    if (mmrt_conf_load(conf_path, &p->conf, &e) != MMRT_OK) {
        fprintf(stderr, "mmrt-bench: %s\n", e.msg);
        return -1;
    }
    if (p->conf->n_devices > MAX_DEVS) {
        fprintf(stderr, "mmrt-bench: %s: at most %d devices\n", conf_path, MAX_DEVS);
        return -1;
    }
    for (int i = 0; i < p->conf->n_devices; i++) {
        const struct mmrt_conf_device *cd = &p->conf->devices[i];
        p->opts[i] = calloc((size_t)cd->n_options + 1, sizeof *p->opts[i]);
        if (!p->opts[i]) {
            fprintf(stderr, "mmrt-bench: out of memory\n");
            return -1;
        }
        for (int k = 0; k < cd->n_options; k++)
            p->opts[i][k] = (struct mmrt_option){ cd->options[k].key, cd->options[k].value };
        p->dev[i] = (struct mmrt_device_config){ .name = cd->name, .plugin = cd->plugin,
                                                 .index = cd->index, .pool_mb = cd->pool_mb,
                                                 .options = p->opts[i],
                                                 .n_options = cd->n_options };
        p->pool_given[i] = cd->pool_mb != 0; /* "pool_mb = auto" is not a given size */
    }
    p->n_dev = p->conf->n_devices;
    for (int s = 0; s < 2; s++) {
        const struct mmrt_conf_stage *cs = s ? &p->conf->language : &p->conf->vision;
        int idx = 0;
        for (int i = 0; cs->present && cs->device && i < p->n_dev; i++)
            if (strcmp(p->dev[i].name, cs->device) == 0)
                idx = i;
        *(s ? &p->language : &p->vision) = idx;
    }
    return 0;
}

static void free_placement(struct placement *p)
{
    for (int i = 0; i < MAX_DEVS; i++)
        free(p->opts[i]);
    mmrt_conf_destroy(p->conf);
}

/* Bytes of the tensors a stage loads, as stored (no rounding). */
static uint64_t stage_weight_bytes(const struct bench_tensor *ts, int n_ts, int w_bytes,
                                   bool vision, bool language)
{
    uint64_t b = 0;
    for (int i = 0; i < n_ts; i++)
        if (ts[i].vision ? vision : language)
            b += (uint64_t)bench_tensor_numel(&ts[i]) * (uint64_t)w_bytes;
    return b;
}

/* MemAvailable from /proc/meminfo in bytes, 0 when unknown. */
static uint64_t mem_available(void)
{
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f)
        return 0;
    char line[256];
    unsigned long long kb = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1)
            break;
    fclose(f);
    return (uint64_t)kb * 1024;
}

/* What the vision stage of s is, for the report. */
static void vision_desc(const struct bench_shape *s, int64_t v_layers, char *out, size_t size)
{
    if (s->family == BENCH_FUYU)
        snprintf(out, size, "vision: the patch projection (no encoder)");
    else
        snprintf(out, size, "vision %lld/%lld layers", (long long)v_layers,
                 (long long)s->v_layers);
}

/* ---- JSON helpers -------------------------------------------------------------------------- */

static json_t *num_or_null(double v)
{
    return isfinite(v) ? json_real(v) : json_null();
}

/* {value, limit, ratio, ...}: ratio = limit / value for times, value / limit for rates. */
static json_t *figure(double value, double limit, bool is_rate, const char *basis)
{
    double ratio = NAN;
    if (isfinite(limit) && limit > 0 && isfinite(value) && value > 0)
        ratio = is_rate ? value / limit : limit / value;
    return json_pack("{s:o,s:o,s:o,s:s}", "value", num_or_null(value), "limit",
                     num_or_null(limit), "ratio", num_or_null(ratio), "basis", basis);
}

/* ---- main ---------------------------------------------------------------------------------- */

int main(int argc, char **argv)
{
    struct options o = {
        .shape = "llava-1.5-7b", .dtype = BENCH_F16, .prompt_tokens = 32, .gen_tokens = 32,
        .batch = 1, .repeat = 3, .warmup = 1, .probe_mb = 1024, .probe_passes = 6,
        .top_p = 1.0f,
    };
    int layers = 0;
    static const struct option longopts[] = {
        { "shape", required_argument, NULL, 'S' },     { "layers", required_argument, NULL, 'L' },
        { "dtype", required_argument, NULL, 'd' },     { "conf", required_argument, NULL, 'c' },
        { "image-size", required_argument, NULL, 'i' },
        { "prompt-tokens", required_argument, NULL, 'p' },
        { "gen-tokens", required_argument, NULL, 'g' }, { "batch", required_argument, NULL, 'b' },
        { "repeat", required_argument, NULL, 'r' },    { "warmup", required_argument, NULL, 'w' },
        { "cache", required_argument, NULL, 'C' },     { "probe-mb", required_argument, NULL, 'm' },
        { "json", no_argument, NULL, 'j' },            { "quiet", no_argument, NULL, 'q' },
        { "limits-only", no_argument, NULL, 'O' },     { "threads", required_argument, NULL, 'T' },
        { "dry-run", no_argument, NULL, 'D' },
        { "requests", required_argument, NULL, 'b' },
        { "concurrency", required_argument, NULL, 'N' },
        { "mix", no_argument, NULL, 'X' },            { "kv-dtype", required_argument, NULL, 'K' },
        { "vision-cache", no_argument, NULL, 'V' },
        { "vision-batch", required_argument, NULL, 'B' },
        { "weights", required_argument, NULL, 'W' },
        { "image-kv-keep", required_argument, NULL, 'R' },
        { "image-kv-policy", required_argument, NULL, 'P' },
        { "temperature", required_argument, NULL, 't' },
        { "top-p", required_argument, NULL, 'u' },
        { "top-k", required_argument, NULL, 'k' },
        { "response-format", required_argument, NULL, 'F' },
        { "draft-tokens", required_argument, NULL, 'x' },
        { "draft-rows", required_argument, NULL, 'y' },
        { "prediction", no_argument, NULL, 'Z' },
        { "solo", no_argument, NULL, 'A' },
        { "help", no_argument, NULL, 'h' },            { NULL, 0, NULL, 0 },
    };
    int opt;
    while ((opt = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
        int bad = 0;
        switch (opt) {
        case 'S': o.shape = optarg; break;
        case 'L': bad = parse_int("--layers", optarg, 1, 1024, &layers); break;
        case 'd':
            if (strcmp(optarg, "f32") == 0)
                o.dtype = BENCH_F32;
            else if (strcmp(optarg, "f16") == 0)
                o.dtype = BENCH_F16;
            else if (strcmp(optarg, "bf16") == 0)
                o.dtype = BENCH_BF16;
            else {
                fprintf(stderr, "mmrt-bench: --dtype \"%s\": expected f32, f16 or bf16\n", optarg);
                bad = 1;
            }
            break;
        case 'c': o.conf = optarg; break;
        case 'i': bad = parse_int("--image-size", optarg, 1, 8192, &o.image_size); break;
        case 'p': bad = parse_int("--prompt-tokens", optarg, 0, 100000, &o.prompt_tokens); break;
        case 'g': bad = parse_int("--gen-tokens", optarg, 1, 100000, &o.gen_tokens); break;
        case 'b': bad = parse_int("--batch", optarg, 1, 1024, &o.batch); break;
        case 'r': bad = parse_int("--repeat", optarg, 1, 1000, &o.repeat); break;
        case 'w': bad = parse_int("--warmup", optarg, 0, 100, &o.warmup); break;
        case 'C': o.cache = optarg; break;
        case 'm': bad = parse_int("--probe-mb", optarg, 1, 1 << 20, &o.probe_mb); break;
        case 'j': o.json = true; break;
        case 'q': o.quiet = true; break;
        case 'O': o.limits_only = true; break;
        case 'D': o.dry_run = true; break;
        case 'N': bad = parse_int("--concurrency", optarg, 1, 32, &o.concurrency); break;
        case 'X': o.mix = true; break;
        case 'V': o.vision_cache = true; break;
        case 'B': bad = parse_int("--vision-batch", optarg, 1, 32, &o.vision_batch); break;
        case 'K':
            if (strcmp(optarg, "f32") == 0) {
                o.kv_dtype = MMRT_KV_F32;
            } else if (strcmp(optarg, "f16") == 0) {
                o.kv_dtype = MMRT_KV_F16;
            } else if (strcmp(optarg, "fp8") == 0) {
                o.kv_dtype = MMRT_KV_FP8;
            } else if (strcmp(optarg, "int8") == 0) {
                o.kv_dtype = MMRT_KV_INT8;
            } else {
                fprintf(stderr, "mmrt-bench: --kv-dtype \"%s\": expected f32, f16, fp8 or "
                        "int8\n", optarg);
                bad = 1;
            }
            break;
        case 'W': {
            /* The [model] weights spellings, from the runtime's own names. */
            static const enum mmrt_weight_format formats[] = {
                MMRT_WEIGHTS_CHECKPOINT, MMRT_WEIGHTS_INT8, MMRT_WEIGHTS_INT4,
                MMRT_WEIGHTS_INT4_G64, MMRT_WEIGHTS_INT4_G32,
            };
            size_t f = 0;
            while (f < sizeof formats / sizeof formats[0] &&
                   strcmp(optarg, mmrt_weight_format_name(formats[f])) != 0)
                f++;
            if (f == sizeof formats / sizeof formats[0]) {
                fprintf(stderr, "mmrt-bench: --weights \"%s\": expected checkpoint, int8, int4, "
                        "int4-g64 or int4-g32\n", optarg);
                bad = 1;
            } else {
                o.weights = formats[f];
            }
            break;
        }
        case 'T': bad = parse_int("--threads", optarg, 1, 1024, &o.threads); break;
        case 'x': bad = parse_int("--draft-tokens", optarg, 0, 31, &o.draft_tokens); break;
        case 'y': bad = parse_int("--draft-rows", optarg, 2, 32, &o.draft_rows); break;
        case 'Z': o.prediction = true; break;
        case 'A': o.solo = true; break;
        case 'R': {
            char *end;
            o.image_kv_keep = strtod(optarg, &end);
            if (end == optarg || *end || !(o.image_kv_keep > 0 && o.image_kv_keep <= 1)) {
                fprintf(stderr, "mmrt-bench: --image-kv-keep \"%s\": expected a number in "
                        "(0, 1]\n", optarg);
                bad = 1;
            }
            break;
        }
        case 't':
        case 'u': {
            /* The request checks the ranges (temperature 0 … 100, top_p in (0, 1]); this
             * only has to read a number. */
            char *end;
            const double v = strtod(optarg, &end);
            if (end == optarg || *end || !isfinite(v)) {
                fprintf(stderr, "mmrt-bench: --%s \"%s\": expected a number\n",
                        opt == 't' ? "temperature" : "top-p", optarg);
                bad = 1;
            } else if (opt == 't') {
                o.temperature = (float)v;
            } else {
                o.top_p = (float)v;
            }
            break;
        }
        case 'k': bad = parse_int("--top-k", optarg, 0, 1 << 30, &o.top_k); break;
        case 'F':
            if (strcmp(optarg, "text") == 0 || strcmp(optarg, "json_object") == 0) {
                o.response_format = optarg[0] == 'j' ? MMRT_RESPONSE_JSON_OBJECT
                                                     : MMRT_RESPONSE_TEXT;
            } else {
                fprintf(stderr, "mmrt-bench: --response-format \"%s\": expected text or "
                        "json_object\n", optarg);
                bad = 1;
            }
            break;
        case 'P': {
            static const enum mmrt_image_kv_policy policies[] = {
                MMRT_IMAGE_KV_KEY_NORM_HIGH, MMRT_IMAGE_KV_KEY_NORM_LOW, MMRT_IMAGE_KV_RANDOM,
                MMRT_IMAGE_KV_POOL2X2,
            };
            size_t f = 0;
            while (f < sizeof policies / sizeof policies[0] &&
                   strcmp(optarg, mmrt_image_kv_policy_name(policies[f])) != 0)
                f++;
            if (f == sizeof policies / sizeof policies[0]) {
                fprintf(stderr, "mmrt-bench: --image-kv-policy \"%s\": expected key_norm_high, "
                        "key_norm_low, random or pool2x2\n", optarg);
                bad = 1;
            } else {
                o.image_kv_policy = policies[f];
            }
            break;
        }
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return EXIT_USAGE;
        }
        if (bad)
            return EXIT_USAGE;
    }
    if (optind < argc) {
        fprintf(stderr, "mmrt-bench: unexpected argument \"%s\"\n", argv[optind]);
        usage(stderr);
        return EXIT_USAGE;
    }
    g_quiet = o.quiet;
    o.layers = layers;
    mmrt_set_log_sink(log_sink, NULL, MMRT_LOG_WARN);
    if (o.limits_only) {
        struct bench_limits l = { 0 };
        char e[256];
        int nt = o.threads ? o.threads : (int)sysconf(_SC_NPROCESSORS_ONLN);
        if (bench_probe(nt, (size_t)o.probe_mb, o.probe_passes, &l, e, sizeof e) != 0) {
            fprintf(stderr, "mmrt-bench: %s\n", e);
            return EXIT_RUN_FAILED;
        }
        if (o.json)
            printf("{\"threads\": %d, \"read_gbs\": %.2f, \"f32_gflops\": %.1f, "
                   "\"bf16_gflops\": %.1f, \"amx_gflops\": %.1f, \"probe_isa\": \"%s\"}\n",
                   nt, l.read_gbs, l.f32_gflops, l.bf16_gflops, l.amx_gflops, l.isa);
        else
            printf("%d threads (%s loops): read %.1f GB/s, f32 FMA %.1f GFLOP/s, bf16 dot %.1f "
                   "GFLOP/s, AMX bf16 %s\n", nt, l.isa, l.read_gbs, l.f32_gflops, l.bf16_gflops,
                   amx_text(&l, false));
        return 0;
    }

    const struct bench_shape *s = bench_shape_find(o.shape);
    if (!s) {
        fprintf(stderr, "mmrt-bench: --shape \"%s\": expected one of %s\n", o.shape,
                bench_shape_names());
        return EXIT_USAGE;
    }
    /* The runtime's own registry says whether this build can run the shape, so a model type
     * that lands later needs no change here. */
    const bool supported = mmrt_model_type_find(s->model_type) != NULL;
    if (!supported && !o.dry_run) {
        fprintf(stderr,
                "mmrt-bench: shape %s (%s): model type %s is not supported by this build "
                "(it runs: %s); nothing was written\n",
                s->name, s->hf_id, s->model_type, mmrt_model_types_supported());
        return EXIT_USAGE;
    }
    if (o.image_size == 0)
        o.image_size = (int)s->v_image;

    int rc = EXIT_RUN_FAILED;
    struct placement pl;
    struct mmrt_runtime *rt = NULL;
    char *prompt = NULL, **images = NULL, *mix_prompts[4] = { NULL };
    struct latency lat = { 0 };
    struct mmrt_result *res = NULL;
    double *solo_tps = NULL; /* [repeat] --solo: each round's first request alone */
    struct mmrt_request *reqs = NULL;
    struct mmrt_image_input *inputs = NULL;
    struct text_buf *predicted = NULL;
    struct bench_tensor *tensors = NULL;
    int n_tensors = 0;
    json_t *runs = json_array();
    char err[2048] = "", ckpt[4096], cache[3800];
    int n_req = o.warmup + o.repeat * o.batch;
    const int concurrency = o.concurrency ? o.concurrency : o.batch < 32 ? o.batch : 32;

    if (load_placement(o.conf, &pl) != 0) {
        free_placement(&pl);
        json_decref(runs);
        return EXIT_USAGE;
    }

    /* The synthetic checkpoint's place and contents. */
    if (o.cache) {
        snprintf(cache, sizeof cache, "%s", o.cache);
    } else {
        const char *home = getenv("HOME");
        snprintf(cache, sizeof cache, "%s/.cache/mmrt-bench", home && *home ? home : ".");
    }
    static const char *const dt_names[] = { "f32", "f16", "bf16" };
    int64_t v_layers, t_layers;
    bench_shape_depth(s, o.layers, &v_layers, &t_layers);
    snprintf(ckpt, sizeof ckpt, "%s/%s-L%lld-%s", cache, s->name,
             (long long)(o.layers ? o.layers : 0), dt_names[o.dtype]);
    if (o.layers == 0)
        snprintf(ckpt, sizeof ckpt, "%s/%s-Lall-%s", cache, s->name, dt_names[o.dtype]);
    if (bench_synth_tensors(s, o.layers, &tensors, &n_tensors) != 0) {
        fprintf(stderr, "mmrt-bench: out of memory\n");
        goto out;
    }
    const int w_bytes = o.dtype == BENCH_F32 ? 4 : 2;
    /* Per KV element; an INT8 row's f32 scale is spread over its head_dim codes. */
    const double kv_bytes = (double)mmrt_dtype_size(mmrt_kv_store_dtype(o.kv_dtype)) +
                            (o.kv_dtype == MMRT_KV_INT8 ? 4.0 / (double)s->t_head_dim : 0.0);
    /* INT4: half a byte of packed code per weight plus an F32 scale and zero point per group. */
    const int64_t q4_group = mmrt_weight_format_group(o.weights);
    const double mm_bytes = o.weights == MMRT_WEIGHTS_INT8 ? 1.0
                            : q4_group > 0 ? 0.5 + 8.0 / (double)q4_group
                                           : (double)w_bytes;
    const uint64_t ckpt_bytes = stage_weight_bytes(tensors, n_tensors, w_bytes, true, true);
    uint64_t dev_weights[MAX_DEVS] = { 0 };
    for (int i = 0; i < pl.n_dev; i++)
        dev_weights[i] = stage_weight_bytes(tensors, n_tensors, w_bytes, pl.vision == i,
                                            pl.language == i);

    /* Pools: pool_mb = auto unless the INI set pool_mb; the runtime sizes each from the
     * configuration (models/pool_budget.h) with the same estimate printed here. */
    struct bench_work est;
    /* The largest image and prompt a round holds size the KV store and the pools. */
    const int max_image = mix_image(&o, 3), max_prompt = mix_prompt(&o, 12);
    bench_work_compute(s, o.layers, max_image, max_prompt + TEMPLATE_TOKENS, o.gen_tokens,
                       w_bytes, mm_bytes, kv_bytes, &est);
    int64_t ctx = est.n_image_tokens + max_prompt + TEMPLATE_TOKENS + o.gen_tokens;
    bench_work_compute(s, o.layers, o.image_size, o.prompt_tokens + TEMPLATE_TOKENS,
                       o.gen_tokens, w_bytes, mm_bytes, kv_bytes, &est);
    const int64_t n_prompt_est = est.n_image_tokens + o.prompt_tokens + TEMPLATE_TOKENS;
    bench_work_compute(s, o.layers, o.image_size, n_prompt_est, o.gen_tokens, w_bytes, mm_bytes,
                       kv_bytes, &est);
    /* A round's requests decode together: KV for each running one's context, not the
     * model's whole context (the KV store and the longest prefill auto sizes for). */
    const int64_t kv_tokens = ctx * (o.batch < concurrency ? o.batch : concurrency);
    const struct mmrt_model_options mopts = {
        .max_kv_tokens = kv_tokens, .kv_dtype = o.kv_dtype, .weights = o.weights,
        .vision_batch = o.vision_batch ? o.vision_batch : MMRT_DEFAULT_VISION_BATCH,
    };
    struct mmrt_pool_budget budget = { 0 };
    uint64_t pool_mb[MAX_DEVS] = { 0 };
    if (supported) {
        json_t *cj = bench_synth_config(s, o.layers, o.dtype);
        struct mmrt_error be = { 0 };
        if (!cj || mmrt_pool_budget_estimate(s->model_type,
                                             bench_synth_exists(ckpt, s) ? ckpt : NULL, cj,
                                             &mopts, &budget, &be) != MMRT_OK) {
            fprintf(stderr, "mmrt-bench: %s\n", cj ? be.msg : "out of memory");
            json_decref(cj);
            goto out;
        }
        json_decref(cj);
    }
    for (int i = 0; i < pl.n_dev; i++) {
        if (pl.pool_given[i])
            pool_mb[i] = pl.dev[i].pool_mb;
        else if (supported)
            pool_mb[i] = mmrt_pool_budget_mb(&budget, pl.vision == i, pl.language == i);
        if (!pl.pool_given[i])
            pl.dev[i].pool_mb = 0; /* auto */
    }

    if (o.dry_run) {
        struct bench_image_plan ip;
        bench_image_plan(s, o.image_size, &ip);
        json_t *tl = json_object(), *pools = json_array();
        for (int i = 0; tl && i < n_tensors; i++) {
            json_t *shape = json_array();
            for (int d = 0; d < tensors[i].n_dims; d++)
                json_array_append_new(shape, json_integer(tensors[i].shape[d]));
            json_object_set_new(tl, tensors[i].name, shape);
        }
        for (int i = 0; pools && i < pl.n_dev; i++)
            json_array_append_new(
                pools, json_pack("{s:s,s:s,s:I,s:b,s:I}", "name", pl.dev[i].name, "plugin",
                                 pl.dev[i].plugin, "pool_mb", (json_int_t)pool_mb[i],
                                 "pool_auto", !pl.pool_given[i],
                                 "weights_bytes", (json_int_t)dev_weights[i]));
        json_t *plan = json_pack(
            "{s:s,s:s,s:s,s:b,s:I,s:I,s:s,s:s,s:b,s:o,s:i,s:I,s:I,s:I,"
            "s:{s:I,s:I,s:I,s:I,s:I,s:I},"
            "s:{s:I,s:I,s:I,s:f,s:f,s:f,s:f,s:I,s:I},s:o,s:o}",
            "shape", s->name, "hf_id", s->hf_id, "model_type", s->model_type,
            "supported", supported, "vision_layers", (json_int_t)v_layers,
            "text_layers", (json_int_t)t_layers, "dtype", dt_names[o.dtype],
            "checkpoint", ckpt, "cached", bench_synth_exists(ckpt, s),
            "config", (json_t *)bench_synth_config(s, o.layers, o.dtype),
            "n_tensors", n_tensors, "checkpoint_bytes", (json_int_t)ckpt_bytes,
            "vision_weight_bytes",
            (json_int_t)stage_weight_bytes(tensors, n_tensors, w_bytes, true, false),
            "language_weight_bytes",
            (json_int_t)stage_weight_bytes(tensors, n_tensors, w_bytes, false, true),
            "image", "size", (json_int_t)o.image_size, "height", (json_int_t)ip.height,
            "width", (json_int_t)ip.width, "rows", (json_int_t)ip.rows, "cols",
            (json_int_t)ip.cols, "image_tokens", (json_int_t)ip.n_image_tokens,
            "work", "n_patches", (json_int_t)est.n_patches, "n_image_tokens",
            (json_int_t)est.n_image_tokens, "n_prompt_tokens_estimate",
            (json_int_t)n_prompt_est, "vision_gflop", est.vision_flop / 1e9,
            "prefill_gflop", est.prefill_flop / 1e9, "decode_bytes_per_token",
            est.decode_bytes, "decode_weight_bytes", est.decode_weight_bytes,
            "vision_weight_bytes", (json_int_t)est.vision_weight_bytes,
            "language_weight_bytes", (json_int_t)est.language_weight_bytes,
            "devices", pools, "tensors", tl);
        if (!plan) {
            fprintf(stderr, "mmrt-bench: cannot build the JSON record\n");
            goto out;
        }
        if (o.json) {
            char *text = json_dumps(plan, JSON_INDENT(1) | JSON_PRESERVE_ORDER);
            if (text)
                printf("%s\n", text);
            free(text);
        } else {
            char vd[96];
            vision_desc(s, v_layers, vd, sizeof vd);
            printf("shape %s (%s, model_type %s, %s by this build)\n", s->name, s->hf_id,
                   s->model_type, supported ? "supported" : "NOT supported");
            printf("checkpoint %s (%s): %d tensors, %.3f GB in %s; %s, text %lld/%lld layers\n",
                   ckpt, bench_synth_exists(ckpt, s) ? "cached" : "not written yet", n_tensors,
                   (double)ckpt_bytes / 1e9, dt_names[o.dtype], vd, (long long)t_layers,
                   (long long)s->t_layers);
            printf("image %d×%d → %lld×%lld → %lld×%lld patches → %lld image tokens\n",
                   o.image_size, o.image_size, (long long)ip.width, (long long)ip.height,
                   (long long)ip.cols, (long long)ip.rows, (long long)ip.n_image_tokens);
            printf("work: vision %.4g GFLOP; prefill %.4g GFLOP for about %lld prompt tokens "
                   "(%d user + image + at most %d of template); decode %.4g GB per token\n",
                   est.vision_flop / 1e9, est.prefill_flop / 1e9, (long long)n_prompt_est,
                   o.prompt_tokens, TEMPLATE_TOKENS, est.decode_bytes / 1e9);
            for (int i = 0; i < pl.n_dev; i++) {
                const bool v = pl.vision == i, l = pl.language == i;
                if (pl.pool_given[i])
                    printf("pool %s (%s): %llu MiB (pool_mb), weights %.1f MiB outside it\n",
                           pl.dev[i].name, pl.dev[i].plugin, (unsigned long long)pool_mb[i],
                           (double)dev_weights[i] / 1048576);
                else
                    printf("pool %s (%s): %llu MiB (auto: KV %.1f MiB for %lld tokens, language "
                           "%.1f MiB for %lld rows, vision %.1f MiB for %lld rows), weights "
                           "%.1f MiB outside it\n", pl.dev[i].name, pl.dev[i].plugin,
                           (unsigned long long)pool_mb[i],
                           l ? (double)budget.kv_bytes / 1048576 : 0.0,
                           l ? (long long)budget.kv_tokens : 0LL,
                           l ? (double)budget.language_bytes / 1048576 : 0.0,
                           l ? (long long)budget.language_rows : 0LL,
                           v ? (double)budget.vision_bytes / 1048576 : 0.0,
                           v ? (long long)budget.vision_rows : 0LL,
                           (double)dev_weights[i] / 1048576);
            }
        }
        json_decref(plan);
        rc = 0;
        goto out;
    }

    /* Refusals before any work: the cache must take the checkpoint, the machine and the
     * pools its weights. */
    const bool cached = bench_synth_exists(ckpt, s);
    if (!cached) {
        struct statvfs fs;
        if (bench_mkdirs(cache) != 0 || access(cache, W_OK | X_OK) != 0) {
            fprintf(stderr, "mmrt-bench: cache folder %s cannot be written (%s); choose another "
                    "with --cache\n", cache, strerror(errno));
            rc = EXIT_USAGE;
            goto out;
        }
        if (statvfs(cache, &fs) == 0 &&
            (uint64_t)fs.f_bavail * fs.f_frsize < ckpt_bytes + (64ull << 20)) {
            fprintf(stderr, "mmrt-bench: the %s checkpoint of shape %s (%.2f GB) does not fit "
                    "the %.2f GB free in %s; cut it with --layers or choose another --cache\n",
                    dt_names[o.dtype], s->name, (double)ckpt_bytes / 1e9,
                    (double)fs.f_bavail * (double)fs.f_frsize / 1e9, cache);
            rc = EXIT_USAGE;
            goto out;
        }
    } else if (access(ckpt, W_OK | X_OK) != 0) {
        fprintf(stderr, "mmrt-bench: cache folder %s cannot be written (%s); choose another "
                "with --cache\n", ckpt, strerror(errno));
        rc = EXIT_USAGE;
        goto out;
    }
    uint64_t host_weights = 0;
    for (int i = 0; i < pl.n_dev; i++) {
        if (strcmp(pl.dev[i].plugin, "cpu") == 0)
            host_weights += dev_weights[i];
    }
    uint64_t avail = mem_available();
    if (avail && host_weights + host_weights / 16 + (256ull << 20) > avail) {
        fprintf(stderr, "mmrt-bench: shape %s in %s has %.2f GB of weights on cpu devices, "
                "which does not fit the %.2f GB of memory available; cut it with --layers\n",
                s->name, dt_names[o.dtype], (double)host_weights / 1e9, (double)avail / 1e9);
        rc = EXIT_USAGE;
        goto out;
    }

    if (bench_synth_checkpoint(ckpt, s, o.layers, o.dtype, progress, err, sizeof err) != 0) {
        fprintf(stderr, "mmrt-bench: %s\n", err);
        goto out;
    }
    images = calloc((size_t)n_req, sizeof *images);
    reqs = calloc((size_t)n_req, sizeof *reqs);
    inputs = calloc((size_t)n_req, sizeof *inputs);
    res = calloc((size_t)n_req, sizeof *res);
    predicted = calloc((size_t)n_req, sizeof *predicted);
    solo_tps = calloc((size_t)o.repeat, sizeof *solo_tps);
    prompt = bench_synth_prompt(o.prompt_tokens);
    for (int k = 0; k < 4; k++)
        mix_prompts[k] = bench_synth_prompt(mix_prompt(&o, 4 * k));
    lat.first = calloc((size_t)n_req, sizeof *lat.first);
    lat.last = calloc((size_t)n_req, sizeof *lat.last);
    lat.cap_gaps = (size_t)n_req * (size_t)o.gen_tokens;
    lat.gaps = calloc(lat.cap_gaps, sizeof *lat.gaps);
    lat.per_req = o.gen_tokens;
    lat.times = calloc((size_t)n_req * (size_t)o.gen_tokens, sizeof *lat.times);
    lat.n_times = calloc((size_t)n_req, sizeof *lat.n_times);
    if (!images || !reqs || !inputs || !res || !prompt || !runs || !mix_prompts[0] ||
        !mix_prompts[1] || !mix_prompts[2] || !mix_prompts[3] || !lat.first || !lat.last ||
        !lat.gaps || !lat.times || !lat.n_times || !predicted || !solo_tps) {
        fprintf(stderr, "mmrt-bench: out of memory\n");
        goto out;
    }
    for (int i = 0; i < n_req; i++) {
        images[i] = malloc(4200);
        if (!images[i]) {
            fprintf(stderr, "mmrt-bench: out of memory\n");
            goto out;
        }
        /* Position in its round (warm-up requests count as a round of their own). */
        const int k = i < o.warmup ? i : (i - o.warmup) % o.batch;
        const int size = mix_image(&o, k);
        snprintf(images[i], 4200, "%s/image-%d-%d.png", ckpt, size, i);
        if (bench_synth_image(images[i], size, (uint32_t)i, err, sizeof err) != 0) {
            fprintf(stderr, "mmrt-bench: %s\n", err);
            goto out;
        }
        inputs[i] = (struct mmrt_image_input){ .path = images[i] };
        res[i].struct_size = sizeof res[i];
        reqs[i] = (struct mmrt_request){ .struct_size = sizeof reqs[i],
                                         .images = &inputs[i], .n_images = 1,
                                         .prompt = o.mix ? mix_prompts[(k / 4) % 4] : prompt,
                                         .max_tokens = o.gen_tokens, .seed = (uint64_t)i,
                                         .temperature = o.temperature, .top_k = o.top_k,
                                         .top_p = o.top_p,
                                         .response_format = o.response_format };
    }

    /* Which limits apply: the probes measure this host's CPU, so they hold a stage placed on
     * a cpu-plugin device, with the loops of the kernel table its `isa` option names (avx2 on
     * an AVX-512 CPU is measured as an AVX2 machine would be); bf16_dot there with BF16 weights
     * means the peak of the bf16 unit it ran (peak_unit). */
    int n_threads = (int)sysconf(_SC_NPROCESSORS_ONLN);
    const char *t = dev_option(&pl, pl.language, "threads");
    if (strcmp(pl.dev[pl.language].plugin, "cpu") == 0 && t)
        n_threads = atoi(t);
    if (n_threads < 1)
        n_threads = 1;
    struct bench_limits lim = { 0 };
    if (strcmp(pl.dev[pl.language].plugin, "cpu") == 0)
        lim.max_isa = dev_option(&pl, pl.language, "isa");
    progress("measuring limits (read bandwidth, f32 FMA, bf16 dot and AMX peaks)");
    if (bench_probe(n_threads, (size_t)o.probe_mb, o.probe_passes, &lim, err, sizeof err) != 0) {
        fprintf(stderr, "mmrt-bench: %s\n", err);
        goto out;
    }

    progress("loading the model");
    struct mmrt_config cfg = {
        .struct_size = sizeof cfg, /* the vision cache: its default (on) */
        .model_path = ckpt, .devices = pl.dev, .n_devices = pl.n_dev,
        .vision_device = pl.dev[pl.vision].name, .language_device = pl.dev[pl.language].name,
        /* A round's requests decode together: KV for each one's context, not the model's
         * whole context (the pool estimate counts the same). */
        .max_kv_tokens = kv_tokens,
        .max_batch = concurrency,
        .kv_dtype = o.kv_dtype,
        .weights = o.weights,
        .vision_batch = o.vision_batch,
        .image_kv_keep = o.image_kv_keep,
        .image_kv_policy = o.image_kv_policy,
        .draft_tokens = o.draft_tokens,
        .draft_rows = o.draft_rows,
    };
    double t_load = now_ms();
    mmrt_status st = mmrt_create(&cfg, &rt, err, sizeof err);
    if (st != MMRT_OK) {
        fprintf(stderr, "mmrt-bench: %s\n", err);
        /* The statuses mmrt.h names as configuration errors (a placement's missing op or
         * dtype among them). */
        rc = st == MMRT_ERR_CONFIG || st == MMRT_ERR_PLUGIN || st == MMRT_ERR_NO_DEVICE ||
                     st == MMRT_ERR_NOT_FOUND || st == MMRT_ERR_UNSUPPORTED ||
                     st == MMRT_ERR_DEVICE
                 ? EXIT_USAGE
                 : EXIT_RUN_FAILED;
        goto out;
    }
    t_load = now_ms() - t_load;

    /* Warm-up, then the measured rounds. */
    for (int i = 0; i < o.warmup; i++) {
        progress("warm-up request");
        if (mmrt_run(rt, &reqs[i], NULL, NULL, &res[i]) != MMRT_OK) {
            fprintf(stderr, "mmrt-bench: warm-up request: %s\n", mmrt_last_error(rt));
            goto out;
        }
    }
    /* --prediction: each measured request's own answer, from a run of it before. */
    for (int i = o.warmup; o.prediction && i < n_req; i++) {
        progress("prediction: the answer to predict");
        struct text_buf *tb = &predicted[i];
        struct mmrt_result pr = { .struct_size = sizeof pr };
        if (mmrt_run(rt, &reqs[i], on_text, tb, &pr) != MMRT_OK || tb->failed) {
            fprintf(stderr, "mmrt-bench: prediction run: %s\n",
                    tb->failed ? "out of memory" : mmrt_last_error(rt));
            goto out;
        }
        reqs[i].prediction = tb->s ? tb->s : "";
    }
    /* How much of its threads' time the process got during the rounds (probes included):
     * on a shared machine this shows when neighbours, not the kernels, set a figure. The
     * CPU plugin's workers spin briefly between loops, so this counts that too. */
    double cpu0 = cpu_seconds(), wall0 = now_ms(), round_ms = 0, win_tokens = 0, win_ms = 0;
    for (int r = 0; r < o.repeat; r++) {
        char line[64];
        /* The limits are probed again before every round (and after the last), so they are
         * sampled as often as the figures; the best sample is the limit. */
        if (r > 0 && bench_probe(n_threads, (size_t)o.probe_mb, o.probe_passes, &lim, err,
                                 sizeof err) != 0) {
            fprintf(stderr, "mmrt-bench: %s\n", err);
            goto out;
        }
        snprintf(line, sizeof line, "round %d of %d", r + 1, o.repeat);
        progress(line);
        int base = o.warmup + r * o.batch;
        const double tr = now_ms();
        lat.t0 = tr;
        lat.base = base;
        st = mmrt_run_batch(rt, &reqs[base], o.batch, on_bench_token, &lat, &res[base]);
        round_ms += now_ms() - tr;
        if (st == MMRT_OK) {
            double wt, wm;
            decode_window(&lat, base, o.batch, &wt, &wm);
            win_tokens += wt;
            win_ms += wm;
        }
        if (st != MMRT_OK) {
            fprintf(stderr, "mmrt-bench: request failed: %s\n", mmrt_last_error(rt));
            goto out;
        }
        if (o.solo) {
            /* Batched decode is bound by arithmetic and one sequence by memory, so a
             * neighbour's load moves the two apart: a ratio of runs minutes apart measures
             * the host as much as the engine. */
            progress("the round's first request alone");
            struct mmrt_result sr = { .struct_size = sizeof sr };
            if (mmrt_run(rt, &reqs[base], NULL, NULL, &sr) != MMRT_OK) {
                fprintf(stderr, "mmrt-bench: request alone: %s\n", mmrt_last_error(rt));
                goto out;
            }
            solo_tps[r] = sr.decode_tokens_per_s;
        }
    }
    double cpu_share = (cpu_seconds() - cpu0) / ((now_ms() - wall0) / 1e3 * n_threads);
    progress("measuring limits again");
    if (bench_probe(n_threads, (size_t)o.probe_mb, o.probe_passes, &lim, err, sizeof err) != 0) {
        fprintf(stderr, "mmrt-bench: %s\n", err);
        goto out;
    }
    struct cache_phase cph = { 0 };
    if (o.vision_cache) {
        progress("vision cache: each image a miss, then a hit");
        if (run_cache_phase(rt, &o, ckpt, prompt, &cph, err, sizeof err) != 0) {
            fprintf(stderr, "mmrt-bench: %s\n", err);
            goto out;
        }
    }

    /* Medians over every measured request. */
    int n = o.repeat * o.batch;
    double *v = calloc((size_t)n * 7, sizeof *v);
    if (!v) {
        fprintf(stderr, "mmrt-bench: out of memory\n");
        goto out;
    }
    double *pre = v, *vis = v + n, *pf = v + 2 * n, *dec = v + 3 * n, *tps = v + 4 * n;
    double *ttft = v + 5 * n, *npt = v + 6 * n;
    for (int i = 0; i < n; i++) {
        const struct mmrt_result *q = &res[o.warmup + i];
        pre[i] = q->preprocess_ms;
        vis[i] = q->vision_ms;
        pf[i] = q->prefill_ms;
        dec[i] = q->n_tokens > 1 ? q->decode_ms / (q->n_tokens - 1) : NAN;
        tps[i] = q->decode_tokens_per_s;
        ttft[i] = q->preprocess_ms + q->vision_ms + q->prefill_ms;
        npt[i] = q->n_prompt_tokens;
        json_array_append_new(
            runs, json_pack("{s:i,s:i,s:f,s:f,s:f,s:f,s:f}", "n_prompt_tokens",
                            q->n_prompt_tokens, "n_tokens", q->n_tokens, "preprocess_ms",
                            q->preprocess_ms, "vision_ms", q->vision_ms, "prefill_ms",
                            q->prefill_ms, "decode_ms", q->decode_ms, "decode_tokens_per_s",
                            q->decode_tokens_per_s));
    }
    int n_prompt = (int)median(npt, n), n_gen = res[o.warmup].n_tokens;
    double m_pre = median(pre, n), m_vis = median(vis, n), m_pf = median(pf, n);
    double m_dec = median(dec, n), m_tps = median(tps, n), m_ttft = median(ttft, n);
    free(v);

    struct bench_work wk;
    bench_work_compute(s, o.layers, o.image_size, n_prompt, n_gen, w_bytes, mm_bytes, kv_bytes,
                       &wk);
    bool vis_cpu = strcmp(pl.dev[pl.vision].plugin, "cpu") == 0;
    bool lang_cpu = strcmp(pl.dev[pl.language].plugin, "cpu") == 0;
    struct mmrt_device_desc vdesc = { 0 }, ldesc = { 0 };
    (void)mmrt_device_describe(rt, pl.vision, &vdesc); /* "" on failure: the FMA peak */
    (void)mmrt_device_describe(rt, pl.language, &ldesc);
    double vis_peak, lang_peak;
    const char *vis_unit = peak_unit(vdesc.device_name, o.dtype, &lim, &vis_peak);
    const char *lang_unit = peak_unit(ldesc.device_name, o.dtype, &lim, &lang_peak);
    double l_vis = vis_cpu ? wk.vision_flop / (vis_peak * 1e9) * 1e3 : NAN;
    double l_pf = lang_cpu ? wk.prefill_flop / (lang_peak * 1e9) * 1e3 : NAN;
    double l_dec = lang_cpu ? wk.decode_bytes / (lim.read_gbs * 1e9) * 1e3 : NAN;
    double l_ttft = l_vis + l_pf; /* preprocessing has no limit of its own: counted as 0 */
    double l_tps = isfinite(l_dec) ? 1e3 / l_dec : NAN;

    char cpu[128], date[64], basis_vis[160], basis_pf[160], basis_dec[160], basis_ttft[96];
    cpu_model(cpu, sizeof cpu);
    time_t now = time(NULL);
    struct tm tmv;
    gmtime_r(&now, &tmv);
    strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", &tmv);
    snprintf(basis_vis, sizeof basis_vis, "%.3g GFLOP at the %s peak %.0f GFLOP/s",
             wk.vision_flop / 1e9, vis_unit, vis_peak);
    snprintf(basis_pf, sizeof basis_pf, "%.4g GFLOP at the %s peak %.0f GFLOP/s",
             wk.prefill_flop / 1e9, lang_unit, lang_peak);
    snprintf(basis_dec, sizeof basis_dec, "%.3g GB read per token at %.1f GB/s",
             wk.decode_bytes / 1e9, lim.read_gbs);
    snprintf(basis_ttft, sizeof basis_ttft, "vision + prefill limits (preprocess: none)");
    char cmd[2048] = "mmrt-bench";
    for (int i = 1; i < argc; i++) {
        size_t len = strlen(cmd);
        snprintf(cmd + len, sizeof cmd - len, " %s", argv[i]);
    }

    json_t *devs = json_array();
    for (int i = 0; i < mmrt_device_count(rt) && i < MAX_DEVS; i++) {
        struct mmrt_device_desc d;
        struct mmrt_memory_report mr = { .struct_size = sizeof mr };
        if (mmrt_device_describe(rt, i, &d) != MMRT_OK ||
            mmrt_device_memory(rt, i, &mr) != MMRT_OK)
            continue;
        const char *pver = mmrt_device_plugin_version(rt, i); /* a plugin may give none */
        char stages[32] = "";
        snprintf(stages, sizeof stages, "%s%s%s", pl.vision == i ? "vision" : "",
                 pl.vision == i && pl.language == i ? "," : "",
                 pl.language == i ? "language" : "");
        json_array_append_new(
            devs, json_pack("{s:s,s:s,s:s,s:s,s:s,s:I,s:I,s:I,s:I,s:I,s:I,s:f,s:I,s:I,s:I}",
                            "name", d.name, "plugin", d.plugin,
                            "plugin_version", pver ? pver : "(none given)",
                            "device_name", d.device_name, "stages", stages,
                            "weight_bytes", (json_int_t)mr.weight_bytes,
                            "weight_mapped_bytes", (json_int_t)mr.weight_mapped_bytes,
                            "weight_copied_bytes", (json_int_t)mr.weight_copied_bytes,
                            "weight_reserved_bytes", (json_int_t)mr.weight_reserved_bytes,
                            "pool_capacity_bytes", (json_int_t)mr.pool_capacity_bytes,
                            "pool_peak_bytes", (json_int_t)mr.pool_peak_bytes,
                            "pool_fragmentation", mr.pool_fragmentation,
                            "kv_page_tokens", (json_int_t)mr.kv_page_tokens,
                            "kv_pages_total", (json_int_t)mr.kv_pages_total,
                            "kv_bytes", (json_int_t)mr.kv_bytes));
    }

    json_t *rec = json_pack(
        "{s:s,s:s,s:s,s:{s:s,s:i,s:i},s:s,s:s,s:s,s:s,s:I,s:I,s:s,s:s,s:i,s:i,s:i,s:i,s:i,s:i,"
        "s:s,s:s,s:s,s:i,s:i,s:f,s:f,"
        "s:{s:f,s:f,s:f,s:f,s:s,s:s,s:i,s:f,s:f,s:f,s:f,s:s,s:s},"
        "s:{s:f,s:f,s:f,s:f,s:I,s:I},"
        "s:{s:o,s:o,s:o,s:o,s:o,s:o},"
        "s:o,s:o}",
        "tool", "mmrt-bench", "version", mmrt_version(), "date", date,
        "machine", "cpu", cpu, "cores", (int)sysconf(_SC_NPROCESSORS_ONLN), "threads", n_threads,
        "command", cmd, "shape", s->name, "hf_id", s->hf_id, "model_type", s->model_type,
        "vision_layers", (json_int_t)v_layers, "text_layers", (json_int_t)t_layers,
        "dtype", dt_names[o.dtype], "weights", mmrt_weight_format_name(o.weights),
        "image_size", o.image_size,
        "prompt_tokens", o.prompt_tokens, "gen_tokens", o.gen_tokens, "batch", o.batch,
        "repeat", o.repeat, "warmup", o.warmup,
        "checkpoint", ckpt, "image", images[0], "prompt", prompt,
        "n_prompt_tokens", n_prompt, "n_tokens", n_gen, "load_ms", t_load,
        "cpu_share", cpu_share,
        "limits", "read_gbs", lim.read_gbs, "f32_gflops", lim.f32_gflops, "bf16_gflops",
        lim.bf16_gflops, "amx_gflops", lim.amx_gflops, "amx", lim.amx_gflops > 0 ? "used" :
        lim.amx_why, "probe_isa", lim.isa, "probe_samples", lim.n_calls, "read_gbs_low",
        lim.read_gbs_low, "f32_gflops_low", lim.f32_gflops_low, "bf16_gflops_low",
        lim.bf16_gflops_low, "amx_gflops_low", lim.amx_gflops_low, "vision_unit", vis_unit,
        "language_unit", lang_unit,
        "work", "vision_gflop", wk.vision_flop / 1e9, "prefill_gflop", wk.prefill_flop / 1e9,
        "decode_bytes_per_token", wk.decode_bytes, "decode_weight_bytes",
        wk.decode_weight_bytes, "n_image_tokens", (json_int_t)wk.n_image_tokens,
        "n_patches", (json_int_t)wk.n_patches,
        "stages", "preprocess_ms", figure(m_pre, NAN, false, "no limit"),
        "vision_ms", figure(m_vis, l_vis, false, basis_vis),
        "prefill_ms", figure(m_pf, l_pf, false, basis_pf),
        "ttft_ms", figure(m_ttft, l_ttft, false, basis_ttft),
        "decode_ms_per_token", figure(m_dec, l_dec, false, basis_dec),
        "decode_tokens_per_s", figure(m_tps, l_tps, true, basis_dec),
        "devices", devs, "runs", runs);
    runs = NULL;
    if (!rec) {
        fprintf(stderr, "mmrt-bench: cannot build the JSON record\n");
        goto out;
    }
    /* Every round's requests ran together in the engine: the throughput of a round is all
     * its generated tokens over its wall time (vision and prefill included). */
    double all_tokens = 0;
    for (int i = 0; i < n; i++)
        all_tokens += res[o.warmup + i].n_tokens;
    const double thr = round_ms > 0 ? all_tokens / (round_ms / 1e3) : NAN;
    const double rps = round_ms > 0 ? n / (round_ms / 1e3) : NAN;
    /* While all of a round's requests decode together: the batched decode rate. */
    const double dwin = win_ms > 0 ? win_tokens / (win_ms / 1e3) : NAN;
    /* Time to first token counts from the round's start (every request of a round arrives
     * then, so it includes waiting for a running slot); inter-token latency is every gap
     * between two tokens of one request. */
    double *ttfts = calloc((size_t)n, sizeof *ttfts);
    if (!ttfts) {
        fprintf(stderr, "mmrt-bench: out of memory\n");
        json_decref(rec);
        goto out;
    }
    for (int i = 0; i < n; i++)
        ttfts[i] = lat.first[o.warmup + i];
    const double tq[3] = { quantile(ttfts, (size_t)n, 0.5), quantile(ttfts, (size_t)n, 0.9),
                           quantile(ttfts, (size_t)n, 0.99) };
    free(ttfts);
    const double iq[3] = { quantile(lat.gaps, lat.n_gaps, 0.5),
                           quantile(lat.gaps, lat.n_gaps, 0.9),
                           quantile(lat.gaps, lat.n_gaps, 0.99) };
    /* null where a figure does not exist (no decode window or no gaps with one token each):
     * json_pack refuses NaN, and the whole block would silently go missing */
    json_object_set_new(rec, "throughput",
                        json_pack("{s:o,s:o,s:o,s:o,s:i,s:i,s:b,s:{s:o,s:o,s:o},"
                                  "s:{s:o,s:o,s:o}}",
                                  "tokens_per_s", num_or_null(thr),
                                  "decode_window_tokens_per_s", num_or_null(dwin),
                                  "requests_per_s", num_or_null(rps), "round_ms",
                                  num_or_null(round_ms / o.repeat), "requests", o.batch,
                                  "concurrency", concurrency, "mix", o.mix, "ttft_ms", "p50",
                                  num_or_null(tq[0]), "p90", num_or_null(tq[1]), "p99",
                                  num_or_null(tq[2]), "inter_token_ms", "p50",
                                  num_or_null(iq[0]), "p90", num_or_null(iq[1]), "p99",
                                  num_or_null(iq[2])));
    /* The vision stages of the whole run (warm-up and the vision-cache phase included). */
    struct mmrt_runtime_stats rs = { .struct_size = sizeof rs };
    if (mmrt_stats(rt, &rs) != MMRT_OK)
        memset(&rs, 0, sizeof rs);
    json_object_set_new(json_object_get(rec, "throughput"), "vision_batches",
                        json_pack("{s:i,s:I,s:I}", "vision_batch",
                                  o.vision_batch ? o.vision_batch : MMRT_DEFAULT_VISION_BATCH,
                                  "stages", (json_int_t)rs.vision_batches, "requests",
                                  (json_int_t)rs.vision_batch_requests));
    json_object_set_new(json_object_get(rec, "throughput"), "image_kv",
                        json_pack("{s:f,s:s,s:I,s:I}", "keep",
                                  o.image_kv_keep > 0 ? o.image_kv_keep : 1.0, "policy",
                                  mmrt_image_kv_policy_name(o.image_kv_policy), "compressions",
                                  (json_int_t)rs.image_kv_compressions, "dropped_tokens",
                                  (json_int_t)rs.image_kv_dropped_tokens));
    json_t *solo_rounds = json_array(); /* in round order: median() below sorts */
    for (int r = 0; o.solo && r < o.repeat; r++)
        json_array_append_new(solo_rounds, num_or_null(solo_tps[r]));
    const double solo = o.solo ? median(solo_tps, o.repeat) : NAN;
    if (o.solo)
        json_object_set_new(json_object_get(rec, "throughput"), "solo",
                            json_pack("{s:o,s:o,s:O}", "decode_tokens_per_s",
                                      num_or_null(solo), "decode_window_x",
                                      num_or_null(dwin / solo), "rounds", solo_rounds));
    json_decref(solo_rounds);
    /* --prediction: what the measured requests took from their predictions. */
    long long pred_taken = 0, pred_refused = 0, pred_tokens = 0;
    for (int i = o.warmup; o.prediction && i < n_req; i++) {
        pred_taken += res[i].prediction_accepted;
        pred_refused += res[i].prediction_rejected;
        pred_tokens += res[i].n_tokens;
    }
    if (o.prediction)
        json_object_set_new(json_object_get(rec, "throughput"), "prediction",
                            json_pack("{s:I,s:I,s:I}", "taken", (json_int_t)pred_taken,
                                      "refused", (json_int_t)pred_refused, "tokens",
                                      (json_int_t)pred_tokens));
    json_object_set_new(json_object_get(rec, "throughput"), "drafts",
                        json_pack("{s:i,s:I,s:I}", "draft_tokens", o.draft_tokens, "checked",
                                  (json_int_t)rs.draft_tokens, "taken",
                                  (json_int_t)rs.draft_accepted));
    if (o.vision_cache) {
        const double ratio = cph.hit_ttft_ms / cph.miss_ttft_ms;
        json_object_set_new(rec, "vision_cache",
                            json_pack("{s:i,s:f,s:f,s:o,s:f,s:b,s:f,s:f,s:I,s:I}", "pairs",
                                      cph.pairs, "miss_ttft_ms", cph.miss_ttft_ms,
                                      "hit_ttft_ms", cph.hit_ttft_ms, "ratio",
                                      num_or_null(ratio), "ratio_limit", 0.5, "within_limit",
                                      ratio <= 0.5, "miss_preprocess_ms",
                                      cph.miss_preprocess_ms, "miss_vision_ms",
                                      cph.miss_vision_ms, "queries", (json_int_t)cph.queries,
                                      "hits", (json_int_t)cph.hits));
        json_object_set_new(json_object_get(rec, "vision_cache"), "prefix_hits",
                            json_integer((json_int_t)cph.prefix_hits));
        json_object_set_new(json_object_get(rec, "vision_cache"), "prefix_reused_tokens",
                            json_integer((json_int_t)cph.prefix_reused_tokens));
    }
    if (o.json) {
        char *text = json_dumps(rec, JSON_INDENT(1) | JSON_PRESERVE_ORDER);
        if (text)
            printf("%s\n", text);
        free(text);
    } else {
        printf("mmrt-bench %s — %s — %s, %ld cores, %d threads\n", mmrt_version(), date, cpu,
               sysconf(_SC_NPROCESSORS_ONLN), n_threads);
        printf("%s\n", cmd);
        char vd[96];
        struct bench_image_plan ip;
        vision_desc(s, v_layers, vd, sizeof vd);
        bench_image_plan(s, o.image_size, &ip);
        char quant_note[48] = "";
        if (o.weights != MMRT_WEIGHTS_CHECKPOINT)
            snprintf(quant_note, sizeof quant_note, " quantized to %s at load",
                     mmrt_weight_format_name(o.weights));
        printf("shape %s (%s): %s, text %lld/%lld layers, %s weights%s; image %d×%d → "
               "%lld×%lld patches, %lld image tokens; prompt %d tokens (%d user + image + "
               "template); %d generated\n",
               s->name, s->hf_id, vd, (long long)t_layers, (long long)s->t_layers,
               dt_names[o.dtype], quant_note, o.image_size, o.image_size,
               (long long)ip.cols,               (long long)ip.rows, (long long)ip.n_image_tokens, n_prompt, o.prompt_tokens,
               n_gen);
        printf("limits (best of %d probes around the rounds, %s loops, %d threads): read "
               "%.1f GB/s, f32 FMA %.0f GFLOP/s, bf16 dot %.0f GFLOP/s, AMX bf16 %s\n",
               lim.n_calls, lim.isa, n_threads, lim.read_gbs, lim.f32_gflops, lim.bf16_gflops,
               amx_text(&lim, false));
        printf("  (lowest probe: read %.1f GB/s, f32 FMA %.0f GFLOP/s, bf16 dot %.0f GFLOP/s, "
               "AMX bf16 %s — the spread is what neighbours took; during the rounds this "
               "process got %.0f%% of its %d threads' time)\n\n",
               lim.read_gbs_low, lim.f32_gflops_low, lim.bf16_gflops_low, amx_text(&lim, true),
               100 * cpu_share, n_threads);
        printf("%-20s %12s %12s %7s  %s\n", "stage (median)", "figure", "limit", "ratio",
               "limit basis");
        const char *names[6] = { "preprocess",
                                 s->family == BENCH_FUYU ? "patch projection" : "vision encoder",
                                 "prefill", "time to 1st token", "decode per token",
                                 "decode tokens/s" };
        const char *keys[6] = { "preprocess_ms", "vision_ms", "prefill_ms", "ttft_ms",
                                "decode_ms_per_token", "decode_tokens_per_s" };
        for (int i = 0; i < 6; i++) {
            json_t *f = json_object_get(json_object_get(rec, "stages"), keys[i]);
            double val = json_number_value(json_object_get(f, "value"));
            json_t *l = json_object_get(f, "limit"), *ra = json_object_get(f, "ratio");
            const char *unit = i == 5 ? "/s" : " ms";
            char a[32], b[32] = "—", c[16] = "—";
            /* Three significant digits at least, so the tiny shape's figures are readable. */
            snprintf(a, sizeof a, val < 100 ? "%.3g%s" : "%.1f%s", val, unit);
            if (json_is_number(l)) {
                double lv = json_number_value(l);
                snprintf(b, sizeof b, lv < 100 ? "%.3g%s" : "%.1f%s", lv, unit);
            }
            if (json_is_number(ra))
                snprintf(c, sizeof c, "%.0f%%", 100 * json_number_value(ra));
            printf("%-20s %12s %12s %7s  %s\n", names[i], a, b, c,
                   json_string_value(json_object_get(f, "basis")));
        }
        printf("\nthroughput: %d requests%s per round, %d at once: %.2f generated tokens/s, "
               "%.3f requests/s (all stages, mean round %.0f ms)\n", o.batch,
               o.mix ? " (mixed image sizes and prompts)" : "", concurrency, thr, rps,
               round_ms / o.repeat);
        printf("decode while all %d decode together: %.2f tokens/s (%.0f tokens in %.0f ms)\n",
               o.batch < concurrency ? o.batch : concurrency, dwin, win_tokens, win_ms);
        if (o.solo)
            printf("one of them alone (each round's first request again): %.2f tokens/s, so "
                   "together %.2f × one sequence\n", solo, dwin / solo);
        printf("time to first token from the round's start: p50 %.0f ms, p90 %.0f ms, p99 "
               "%.0f ms; between tokens: p50 %.1f ms, p90 %.1f ms, p99 %.1f ms\n", tq[0], tq[1],
               tq[2], iq[0], iq[1], iq[2]);
        printf("vision stages: %llu for %llu requests (vision_batch %d)\n",
               (unsigned long long)rs.vision_batches,
               (unsigned long long)rs.vision_batch_requests,
               o.vision_batch ? o.vision_batch : MMRT_DEFAULT_VISION_BATCH);
        if (o.image_kv_keep > 0 && o.image_kv_keep < 1)
            printf("image-token KV compression: keep %g (%s), %llu sequences compressed, "
                   "%llu image positions dropped\n", o.image_kv_keep,
                   mmrt_image_kv_policy_name(o.image_kv_policy),
                   (unsigned long long)rs.image_kv_compressions,
                   (unsigned long long)rs.image_kv_dropped_tokens);
        if (o.prediction)
            printf("prediction (each request's own answer): %lld of its %lld tokens taken, "
                   "%lld refused, over the measured requests\n", pred_taken, pred_tokens,
                   pred_refused);
        if (o.draft_tokens > 0)
            printf("drafts (draft_tokens %d): %llu checked, %llu taken (%.0f %%), over every "
                   "request of the run\n", o.draft_tokens, (unsigned long long)rs.draft_tokens,
                   (unsigned long long)rs.draft_accepted,
                   rs.draft_tokens ? 100.0 * (double)rs.draft_accepted / (double)rs.draft_tokens
                                   : 0.0);
        if (o.vision_cache)
            printf("vision cache: time to first token (median of %d images, each a miss then a "
                   "hit, 1 token): miss %.1f ms, hit %.1f ms, hit/miss %.2f (limit 0.50: %s); "
                   "the hit skipped preprocess %.1f ms + vision %.1f ms and the prefill of "
                   "%llu prompt tokens (%llu prefix hits)\n", cph.pairs,
                   cph.miss_ttft_ms, cph.hit_ttft_ms, cph.hit_ttft_ms / cph.miss_ttft_ms,
                   cph.hit_ttft_ms <= 0.5 * cph.miss_ttft_ms ? "within" : "NOT within",
                   cph.miss_preprocess_ms, cph.miss_vision_ms,
                   (unsigned long long)cph.prefix_reused_tokens,
                   (unsigned long long)cph.prefix_hits);
        if (isfinite(m_vis) && m_vis > 0)
            printf("\nachieved: vision %.0f GFLOP/s, prefill %.0f GFLOP/s, decode %.1f GB/s\n",
                   wk.vision_flop / m_vis / 1e6, wk.prefill_flop / m_pf / 1e6,
                   wk.decode_bytes / m_dec / 1e6);
        size_t nd = json_array_size(devs);
        for (size_t i = 0; i < nd; i++) {
            json_t *d = json_array_get(devs, i);
#define MIB_OF(key) ((double)json_integer_value(json_object_get(d, key)) / 1048576)
            printf("device %s (%s; %s): weights %.1f MiB (%.1f mapped, %.1f copied into %.1f "
                   "reserved); pool %.0f MiB, peak %.1f MiB, KV %.1f MiB\n  plugin %s %s\n",
                   json_string_value(json_object_get(d, "name")),
                   json_string_value(json_object_get(d, "device_name")),
                   json_string_value(json_object_get(d, "stages")), MIB_OF("weight_bytes"),
                   MIB_OF("weight_mapped_bytes"), MIB_OF("weight_copied_bytes"),
                   MIB_OF("weight_reserved_bytes"), MIB_OF("pool_capacity_bytes"),
                   MIB_OF("pool_peak_bytes"), MIB_OF("kv_bytes"),
                   json_string_value(json_object_get(d, "plugin")),
                   json_string_value(json_object_get(d, "plugin_version")));
#undef MIB_OF
        }
    }
    json_decref(rec);
    rc = 0;

out:
    json_decref(runs);
    mmrt_destroy(rt);
    for (int i = 0; images && i < n_req; i++)
        free(images[i]);
    for (int i = 0; predicted && i < n_req; i++)
        free(predicted[i].s);
    free(predicted);
    free(images);
    free(reqs);
    free(inputs);
    free(res);
    free(solo_tps);
    free(prompt);
    for (int k = 0; k < 4; k++)
        free(mix_prompts[k]);
    free(lat.first);
    free(lat.last);
    free(lat.gaps);
    free(lat.times);
    free(lat.n_times);
    free(tensors);
    free_placement(&pl);
    return rc;
}
