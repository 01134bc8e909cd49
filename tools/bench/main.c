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
 * the vision stage of a later one.
 *
 * Exit status: 0 success; 1 the run failed; 2 usage, configuration, or a shape this build
 * cannot run (its model type is not implemented yet).
 */
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "bench.h"
#include "formats/conf.h"
#include "mmrt/mmrt.h"

enum { EXIT_RUN_FAILED = 1, EXIT_USAGE = 2 };

#define MAX_DEVS 8

struct options {
    const char *shape, *conf, *cache;
    int64_t layers;
    enum bench_dtype dtype;
    int image_size, prompt_tokens, gen_tokens, batch, repeat, warmup, probe_mb, probe_passes;
    bool json, quiet, limits_only;
    int threads;
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
            "  --image-size N      synthetic input image N×N pixels (default: the model's size)\n"
            "  --prompt-tokens N   user prompt of exactly N tokens (default 32)\n"
            "  --gen-tokens N      tokens to generate (default 32; the synthetic model never\n"
            "                      stops early)\n"
            "  --batch N           requests per round, through mmrt_run_batch (default 1)\n"
            "  --repeat N          measured rounds; figures are medians (default 3)\n"
            "  --warmup N          unmeasured requests first (default 1)\n"
            "  --cache DIR         synthetic checkpoints (default ~/.cache/mmrt-bench)\n"
            "  --probe-mb N        read-bandwidth probe buffer (default 1024 MiB)\n"
            "  --limits-only       only measure and print the limits (--threads N, default:\n"
            "                      all CPUs), no model\n"
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

static uint64_t pow2_ceil(uint64_t x)
{
    uint64_t p = 1;
    while (p < x)
        p <<= 1;
    return p;
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
        p->pool_given[i] = cd->pool_mb_line != 0;
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

/* Pool a stage needs: its weights, each rounded up to the buddy pool's power-of-two blocks
 * (approximated by rounding the total per tensor class), plus activations and the KV cache
 * with the same rounding, plus headroom. Virtual memory only: the CPU plugin's arenas are
 * touched as they are used. */
static uint64_t stage_pool_mb(const struct bench_shape *s, int64_t layers, int w_bytes,
                              int64_t ctx, bool vision, bool language)
{
    int64_t vl = layers > 0 && layers < s->v_layers ? layers : s->v_layers;
    int64_t tl = layers > 0 && layers < s->t_layers ? layers : s->t_layers;
    uint64_t b = 64ull << 20;
    const uint64_t D = (uint64_t)s->t_hidden, I = (uint64_t)s->t_inter, V = (uint64_t)s->t_vocab;
    const uint64_t QD = (uint64_t)(s->t_heads * s->t_head_dim);
    const uint64_t KD = (uint64_t)(s->t_kv_heads * s->t_head_dim);
    if (vision) {
        const uint64_t Dv = (uint64_t)s->v_hidden, Iv = (uint64_t)s->v_inter;
        uint64_t T = (uint64_t)((s->v_image / s->v_patch) * (s->v_image / s->v_patch) + 1);
        b += (uint64_t)vl * (4 * pow2_ceil(Dv * Dv * w_bytes) + 2 * pow2_ceil(Dv * Iv * w_bytes) +
                             16 * pow2_ceil(Iv * w_bytes));
        b += pow2_ceil(Dv * D * w_bytes) + pow2_ceil(D * D * w_bytes) + 4 * pow2_ceil(T * Dv * 4);
        b += 8 * pow2_ceil(T * Dv * 4) + 2 * pow2_ceil(T * Iv * 4) + 4 * pow2_ceil(T * D * 4);
    }
    if (language) {
        uint64_t S = (uint64_t)ctx;
        b += (uint64_t)tl * (pow2_ceil(D * QD * w_bytes) * 2 + pow2_ceil(D * KD * w_bytes) * 2 +
                             pow2_ceil(D * I * w_bytes) * 3 + 4 * pow2_ceil(D * w_bytes));
        b += 2 * pow2_ceil(V * D * w_bytes);
        b += (uint64_t)tl * 2 * pow2_ceil(S * KD * 4);
        b += 8 * pow2_ceil(S * D * 4) + 2 * pow2_ceil(S * I * 4) + 2 * pow2_ceil(V * 4);
    }
    b += b / 8;
    return (b + (1u << 20) - 1) >> 20;
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
        case 'b': bad = parse_int("--batch", optarg, 1, 64, &o.batch); break;
        case 'r': bad = parse_int("--repeat", optarg, 1, 1000, &o.repeat); break;
        case 'w': bad = parse_int("--warmup", optarg, 0, 100, &o.warmup); break;
        case 'C': o.cache = optarg; break;
        case 'm': bad = parse_int("--probe-mb", optarg, 1, 1 << 20, &o.probe_mb); break;
        case 'j': o.json = true; break;
        case 'q': o.quiet = true; break;
        case 'O': o.limits_only = true; break;
        case 'T': bad = parse_int("--threads", optarg, 1, 1024, &o.threads); break;
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
                   "\"bf16_gflops\": %.1f, \"probe_isa\": \"%s\"}\n", nt, l.read_gbs,
                   l.f32_gflops, l.bf16_gflops, l.isa);
        else
            printf("%d threads (%s loops): read %.1f GB/s, f32 FMA %.1f GFLOP/s, bf16 dot %.1f "
                   "GFLOP/s\n", nt, l.isa, l.read_gbs, l.f32_gflops, l.bf16_gflops);
        return 0;
    }

    const struct bench_shape *s = bench_shape_find(o.shape);
    if (!s) {
        fprintf(stderr, "mmrt-bench: --shape \"%s\": expected one of %s\n", o.shape,
                bench_shape_names());
        return EXIT_USAGE;
    }
    if (!s->runnable) {
        fprintf(stderr,
                "mmrt-bench: shape %s (%s, model_type \"%s\": vision %lld layers × %lld, text "
                "%lld layers × %lld, vocab %lld) cannot run: this build does not implement "
                "model type \"%s\" yet (it runs: llava)\n",
                s->name, s->hf_id, s->model_type, (long long)s->v_layers,
                (long long)s->v_hidden, (long long)s->t_layers, (long long)s->t_hidden,
                (long long)s->t_vocab, s->model_type);
        return EXIT_USAGE;
    }
    if (o.image_size == 0)
        o.image_size = (int)s->v_image;

    int rc = EXIT_RUN_FAILED;
    struct placement pl;
    struct mmrt_runtime *rt = NULL;
    char *prompt = NULL, **images = NULL;
    struct mmrt_result *res = NULL;
    struct mmrt_request *reqs = NULL;
    json_t *runs = json_array();
    char err[2048] = "", ckpt[4096], cache[3800];
    int n_req = o.warmup + o.repeat * o.batch;

    if (load_placement(o.conf, &pl) != 0) {
        free_placement(&pl);
        return EXIT_USAGE;
    }

    /* The synthetic checkpoint and images. */
    if (o.cache) {
        snprintf(cache, sizeof cache, "%s", o.cache);
    } else {
        const char *home = getenv("HOME");
        snprintf(cache, sizeof cache, "%s/.cache/mmrt-bench", home && *home ? home : ".");
    }
    static const char *const dt_names[] = { "f32", "f16", "bf16" };
    int64_t v_layers = o.layers > 0 && o.layers < s->v_layers ? o.layers : s->v_layers;
    int64_t t_layers = o.layers > 0 && o.layers < s->t_layers ? o.layers : s->t_layers;
    snprintf(ckpt, sizeof ckpt, "%s/%s-L%lld-%s", cache, s->name,
             (long long)(o.layers ? o.layers : 0), dt_names[o.dtype]);
    if (o.layers == 0)
        snprintf(ckpt, sizeof ckpt, "%s/%s-Lall-%s", cache, s->name, dt_names[o.dtype]);
    if (bench_mkdirs(cache) != 0) {
        fprintf(stderr, "mmrt-bench: %s: cannot create (%s)\n", cache, strerror(errno));
        rc = EXIT_USAGE;
        goto out;
    }
    if (bench_synth_checkpoint(ckpt, s, o.layers, o.dtype, progress, err, sizeof err) != 0) {
        fprintf(stderr, "mmrt-bench: %s\n", err);
        goto out;
    }
    images = calloc((size_t)n_req, sizeof *images);
    reqs = calloc((size_t)n_req, sizeof *reqs);
    res = calloc((size_t)n_req, sizeof *res);
    prompt = bench_synth_prompt(o.prompt_tokens);
    if (!images || !reqs || !res || !prompt || !runs) {
        fprintf(stderr, "mmrt-bench: out of memory\n");
        goto out;
    }
    for (int i = 0; i < n_req; i++) {
        images[i] = malloc(4200);
        if (!images[i]) {
            fprintf(stderr, "mmrt-bench: out of memory\n");
            goto out;
        }
        snprintf(images[i], 4200, "%s/image-%d-%d.png", ckpt, o.image_size, i);
        if (bench_synth_image(images[i], o.image_size, (uint32_t)i, err, sizeof err) != 0) {
            fprintf(stderr, "mmrt-bench: %s\n", err);
            goto out;
        }
        reqs[i] = (struct mmrt_request){ .image_path = images[i], .prompt = prompt,
                                         .max_tokens = o.gen_tokens, .top_p = 1.0f };
    }

    /* Pools sized for this shape unless the INI set pool_mb. */
    const int w_bytes = o.dtype == BENCH_F32 ? 4 : 2;
    struct bench_work est;
    bench_work_compute(s, o.layers, o.prompt_tokens + 64, o.gen_tokens, w_bytes, 4, &est);
    int64_t ctx = est.n_image_tokens + o.prompt_tokens + 64 + o.gen_tokens;
    for (int i = 0; i < pl.n_dev; i++) {
        if (pl.pool_given[i])
            continue;
        pl.dev[i].pool_mb = stage_pool_mb(s, o.layers, w_bytes, ctx, pl.vision == i,
                                          pl.language == i);
    }

    /* Which limits apply: the probes measure this host's CPU, so they hold a stage placed on
     * a cpu-plugin device; bf16_dot = 1 there with BF16 weights means the bf16 peak. */
    int n_threads = (int)sysconf(_SC_NPROCESSORS_ONLN);
    const char *t = dev_option(&pl, pl.language, "threads");
    if (strcmp(pl.dev[pl.language].plugin, "cpu") == 0 && t)
        n_threads = atoi(t);
    if (n_threads < 1)
        n_threads = 1;
    struct bench_limits lim = { 0 };
    progress("measuring limits (read bandwidth, f32 FMA and bf16 dot peaks)");
    if (bench_probe(n_threads, (size_t)o.probe_mb, o.probe_passes, &lim, err, sizeof err) != 0) {
        fprintf(stderr, "mmrt-bench: %s\n", err);
        goto out;
    }

    progress("loading the model");
    struct mmrt_config cfg = {
        .model_path = ckpt, .devices = pl.dev, .n_devices = pl.n_dev,
        .vision_device = pl.dev[pl.vision].name, .language_device = pl.dev[pl.language].name,
    };
    double t_load = now_ms();
    mmrt_status st = mmrt_create(&cfg, &rt, err, sizeof err);
    if (st != MMRT_OK) {
        fprintf(stderr, "mmrt-bench: %s\n", err);
        rc = st == MMRT_ERR_CONFIG || st == MMRT_ERR_PLUGIN || st == MMRT_ERR_NO_DEVICE ||
                     st == MMRT_ERR_NOT_FOUND
                 ? EXIT_USAGE
                 : EXIT_RUN_FAILED;
        goto out;
    }
    t_load = now_ms() - t_load;
    uint64_t weights_bytes[MAX_DEVS] = { 0 };
    for (int i = 0; i < mmrt_device_count(rt) && i < MAX_DEVS; i++) {
        struct mmrt_pool_report pr;
        if (mmrt_device_pool_stats(rt, i, &pr) == MMRT_OK)
            weights_bytes[i] = pr.bytes_in_use;
    }

    /* Warm-up, then the measured rounds. */
    for (int i = 0; i < o.warmup; i++) {
        progress("warm-up request");
        if (mmrt_run(rt, &reqs[i], NULL, NULL, &res[i]) != MMRT_OK) {
            fprintf(stderr, "mmrt-bench: warm-up request: %s\n", mmrt_last_error(rt));
            goto out;
        }
    }
    /* How much of its threads' time the process got during the rounds (probes included):
     * on a shared machine this shows when neighbours, not the kernels, set a figure. The
     * CPU plugin's workers spin briefly between loops, so this counts that too. */
    double cpu0 = cpu_seconds(), wall0 = now_ms();
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
        if (o.batch == 1)
            st = mmrt_run(rt, &reqs[base], NULL, NULL, &res[base]);
        else
            st = mmrt_run_batch(rt, &reqs[base], o.batch, NULL, NULL, &res[base]);
        if (st != MMRT_OK) {
            fprintf(stderr, "mmrt-bench: request failed: %s\n", mmrt_last_error(rt));
            goto out;
        }
    }
    double cpu_share = (cpu_seconds() - cpu0) / ((now_ms() - wall0) / 1e3 * n_threads);
    progress("measuring limits again");
    if (bench_probe(n_threads, (size_t)o.probe_mb, o.probe_passes, &lim, err, sizeof err) != 0) {
        fprintf(stderr, "mmrt-bench: %s\n", err);
        goto out;
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
    bench_work_compute(s, o.layers, n_prompt, n_gen, w_bytes, 4, &wk);
    bool vis_cpu = strcmp(pl.dev[pl.vision].plugin, "cpu") == 0;
    bool lang_cpu = strcmp(pl.dev[pl.language].plugin, "cpu") == 0;
    const char *vb = dev_option(&pl, pl.vision, "bf16_dot");
    const char *lb = dev_option(&pl, pl.language, "bf16_dot");
    bool vis_bf16 = o.dtype == BENCH_BF16 && vb && strcmp(vb, "1") == 0 && lim.bf16_gflops > 0;
    bool lang_bf16 = o.dtype == BENCH_BF16 && lb && strcmp(lb, "1") == 0 && lim.bf16_gflops > 0;
    double vis_peak = vis_bf16 ? lim.bf16_gflops : lim.f32_gflops;
    double lang_peak = lang_bf16 ? lim.bf16_gflops : lim.f32_gflops;
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
             wk.vision_flop / 1e9, vis_bf16 ? "bf16 dot" : "f32 FMA", vis_peak);
    snprintf(basis_pf, sizeof basis_pf, "%.4g GFLOP at the %s peak %.0f GFLOP/s",
             wk.prefill_flop / 1e9, lang_bf16 ? "bf16 dot" : "f32 FMA", lang_peak);
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
        struct mmrt_pool_report pr;
        if (mmrt_device_describe(rt, i, &d) != MMRT_OK ||
            mmrt_device_pool_stats(rt, i, &pr) != MMRT_OK)
            continue;
        char stages[32] = "";
        snprintf(stages, sizeof stages, "%s%s%s", pl.vision == i ? "vision" : "",
                 pl.vision == i && pl.language == i ? "," : "",
                 pl.language == i ? "language" : "");
        json_array_append_new(
            devs, json_pack("{s:s,s:s,s:s,s:s,s:I,s:I,s:I,s:I}", "name", d.name, "plugin",
                            d.plugin, "device_name", d.device_name, "stages", stages,
                            "pool_capacity_bytes", (json_int_t)pr.capacity_bytes,
                            "pool_weights_bytes", (json_int_t)weights_bytes[i],
                            "pool_peak_bytes", (json_int_t)pr.peak_bytes_in_use,
                            "pool_peak_activation_bytes",
                            (json_int_t)(pr.peak_bytes_in_use - weights_bytes[i])));
    }

    json_t *rec = json_pack(
        "{s:s,s:s,s:s,s:{s:s,s:i,s:i},s:s,s:s,s:s,s:s,s:I,s:I,s:s,s:i,s:i,s:i,s:i,s:i,s:i,"
        "s:s,s:s,s:s,s:i,s:i,s:f,s:f,"
        "s:{s:f,s:f,s:f,s:s,s:i,s:f,s:f,s:f},"
        "s:{s:f,s:f,s:f,s:f,s:I},"
        "s:{s:o,s:o,s:o,s:o,s:o,s:o},"
        "s:o,s:o}",
        "tool", "mmrt-bench", "version", mmrt_version(), "date", date,
        "machine", "cpu", cpu, "cores", (int)sysconf(_SC_NPROCESSORS_ONLN), "threads", n_threads,
        "command", cmd, "shape", s->name, "hf_id", s->hf_id, "model_type", s->model_type,
        "vision_layers", (json_int_t)v_layers, "text_layers", (json_int_t)t_layers,
        "dtype", dt_names[o.dtype], "image_size", o.image_size,
        "prompt_tokens", o.prompt_tokens, "gen_tokens", o.gen_tokens, "batch", o.batch,
        "repeat", o.repeat, "warmup", o.warmup,
        "checkpoint", ckpt, "image", images[0], "prompt", prompt,
        "n_prompt_tokens", n_prompt, "n_tokens", n_gen, "load_ms", t_load,
        "cpu_share", cpu_share,
        "limits", "read_gbs", lim.read_gbs, "f32_gflops", lim.f32_gflops, "bf16_gflops",
        lim.bf16_gflops, "probe_isa", lim.isa, "probe_samples", lim.n_calls, "read_gbs_low",
        lim.read_gbs_low, "f32_gflops_low", lim.f32_gflops_low, "bf16_gflops_low",
        lim.bf16_gflops_low,
        "work", "vision_gflop", wk.vision_flop / 1e9, "prefill_gflop", wk.prefill_flop / 1e9,
        "decode_bytes_per_token", wk.decode_bytes, "decode_weight_bytes",
        wk.decode_weight_bytes, "n_image_tokens", (json_int_t)wk.n_image_tokens,
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
    if (o.json) {
        char *text = json_dumps(rec, JSON_INDENT(1) | JSON_PRESERVE_ORDER);
        if (text)
            printf("%s\n", text);
        free(text);
    } else {
        printf("mmrt-bench %s — %s — %s, %ld cores, %d threads\n", mmrt_version(), date, cpu,
               sysconf(_SC_NPROCESSORS_ONLN), n_threads);
        printf("%s\n", cmd);
        printf("shape %s (%s): vision %lld/%lld layers, text %lld/%lld layers, %s weights; "
               "image %d×%d; prompt %d tokens (%d user + image + template); %d generated\n",
               s->name, s->hf_id, (long long)v_layers, (long long)s->v_layers,
               (long long)t_layers, (long long)s->t_layers, dt_names[o.dtype], o.image_size,
               o.image_size, n_prompt, o.prompt_tokens, n_gen);
        printf("limits (best of %d probes around the rounds, %s loops, %d threads): read "
               "%.1f GB/s, f32 FMA %.0f GFLOP/s, bf16 dot %.0f GFLOP/s\n", lim.n_calls, lim.isa,
               n_threads, lim.read_gbs, lim.f32_gflops, lim.bf16_gflops);
        printf("  (lowest probe: read %.1f GB/s, f32 FMA %.0f GFLOP/s, bf16 dot %.0f GFLOP/s — "
               "the spread is what neighbours took; during the rounds this process got "
               "%.0f%% of its %d threads' time)\n\n",
               lim.read_gbs_low, lim.f32_gflops_low, lim.bf16_gflops_low, 100 * cpu_share,
               n_threads);
        printf("%-20s %12s %12s %7s  %s\n", "stage (median)", "figure", "limit", "ratio",
               "limit basis");
        const char *names[6] = { "preprocess", "vision encoder", "prefill", "time to 1st token",
                                 "decode per token", "decode tokens/s" };
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
        if (isfinite(m_vis) && m_vis > 0)
            printf("\nachieved: vision %.0f GFLOP/s, prefill %.0f GFLOP/s, decode %.1f GB/s\n",
                   wk.vision_flop / m_vis / 1e6, wk.prefill_flop / m_pf / 1e6,
                   wk.decode_bytes / m_dec / 1e6);
        size_t nd = json_array_size(devs);
        for (size_t i = 0; i < nd; i++) {
            json_t *d = json_array_get(devs, i);
            printf("pool %s (%s; %s): capacity %.0f MiB, weights %.1f MiB, peak %.1f MiB "
                   "(activations %.1f MiB)\n",
                   json_string_value(json_object_get(d, "name")),
                   json_string_value(json_object_get(d, "device_name")),
                   json_string_value(json_object_get(d, "stages")),
                   (double)json_integer_value(json_object_get(d, "pool_capacity_bytes")) / 1048576,
                   (double)json_integer_value(json_object_get(d, "pool_weights_bytes")) / 1048576,
                   (double)json_integer_value(json_object_get(d, "pool_peak_bytes")) / 1048576,
                   (double)json_integer_value(json_object_get(d, "pool_peak_activation_bytes")) /
                       1048576);
        }
    }
    json_decref(rec);
    rc = 0;

out:
    json_decref(runs);
    mmrt_destroy(rt);
    for (int i = 0; images && i < n_req; i++)
        free(images[i]);
    free(images);
    free(reqs);
    free(res);
    free(prompt);
    free_placement(&pl);
    return rc;
}
