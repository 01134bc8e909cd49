/*
 * tools/mmrt_cli.c — the mmrt command-line front end, a thin layer over mmrt.h (the
 * runtime itself is core/runtime.c behind libmmrt).
 *
 * Exit status: 0 success; 1 a request failed at run time; 2 usage or configuration error
 * (bad deploy.ini, unknown key, plugin that cannot load, device that cannot be opened) —
 * scripts can tell "fix your config" from "the run failed"; 3 --check found the placement
 * outside tolerance of the CPU reference.
 */
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mmrt/mmrt.h"
#include "formats/file.h"
#include "json_schema.h"
#include "serve.h"

enum { EXIT_RUN_FAILED = 1, EXIT_CONFIG = 2, EXIT_CHECK_FAILED = 3 };

static void usage(FILE *f)
{
    fprintf(f,
            "usage: mmrt --conf FILE [options]  run the model and request a deploy.ini describes\n"
            "         --image PATH        image to ask about (PNG or JPEG)\n"
            "         --prompt TEXT       question or instruction\n"
            "         --max-tokens N      tokens to generate at most\n"
            "         --seed S, --temperature T, --top-k K, --top-p P   sampling (T = 0: greedy)\n"
            "         --repetition-penalty R, --presence-penalty P, --frequency-penalty F\n"
            "                             penalties on tokens already seen (docs/ENGINE.md)\n"
            "         --response-format F text (default) or json_object: the answer is one\n"
            "                             JSON object (docs/ENGINE.md \"JSON answers\")\n"
            "         --json-schema FILE  the answer is a JSON document held to the JSON Schema\n"
            "                             in FILE (response format json_schema)\n"
            "         --json              print one JSON record (text, token ids, timings,\n"
            "                             pool peaks) instead of streaming the text\n"
            "         --check             also run entirely on the CPU reference and compare\n"
            "                             each stage (exit 3 when outside tolerance)\n"
            "         several --image/--prompt pairs run as one batch; with the stages on\n"
            "         different devices the vision stage of request n+1 overlaps request n;\n"
            "         for a model that takes several images per request (Qwen2-VL), several\n"
            "         --image with one --prompt are one request about all of them\n"
            "         command-line values override the [run] section of the file\n"
            "       mmrt serve --conf FILE [--port N]   an OpenAI-compatible HTTP server\n"
            "                               ([server] section, docs/SERVING.md); SIGTERM drains\n"
            "       mmrt --list-devices     list every plugin found, its devices, and why a\n"
            "                               plugin was skipped\n"
            "       mmrt --version | --help\n"
            "\n"
            "Plugins are searched in $MMRT_PLUGIN_PATH, next to this executable, then in the\n"
            "install directory. Set MMRT_LOG=debug|info|warning for more log lines.\n");
}

static double mib(uint64_t bytes)
{
    return (double)bytes / (1024.0 * 1024.0);
}

static void print_device_line(const struct mmrt_plugin_report *p, const struct mmrt_device_desc *d)
{
    (void)p;
    printf("  %s:%d  %-48s %-5s %10.0f MiB total %10.0f MiB free\n", d->plugin, d->index,
           d->device_name, d->kind[0] ? d->kind : "?", mib(d->total_bytes), mib(d->free_bytes));
}

static void list_cb(void *user, const struct mmrt_plugin_report *p,
                    const struct mmrt_device_desc *d)
{
    (void)user;
    if (d) {
        print_device_line(p, d);
        return;
    }
    if (p->error)
        printf("plugin %-8s refused: %s\n", p->name, p->error);
    else if (p->skip_reason)
        printf("plugin %-8s skipped: %s  (%s)\n", p->name, p->skip_reason, p->path);
    else
        printf("plugin %-8s %s, %d device%s  (%s)\n", p->name, p->version, p->n_devices,
               p->n_devices == 1 ? "" : "s", p->path);
}

static int list_devices(void)
{
    char err[1024] = "";
    if (mmrt_list_devices(list_cb, NULL, err, sizeof err) != MMRT_OK) {
        fprintf(stderr, "mmrt: %s\n", err);
        return EXIT_RUN_FAILED;
    }
    return 0;
}

static int is_config_error(mmrt_status st)
{
    return st == MMRT_ERR_CONFIG || st == MMRT_ERR_PLUGIN || st == MMRT_ERR_NO_DEVICE ||
           st == MMRT_ERR_NOT_FOUND || st == MMRT_ERR_UNSUPPORTED || st == MMRT_ERR_DEVICE;
}

#define MAX_REQUESTS 64
#define MAX_SCHEMA_BYTES (1u << 20)

/* Command-line values that override [run]; a NULL / negative field means "not given". */
struct overrides {
    const char *images[MAX_REQUESTS], *prompts[MAX_REQUESTS];
    int n_images, n_prompts, check;
    long max_tokens, top_k;
    long long seed;
    double temperature, top_p;
    double penalty[3]; /* repetition, presence, frequency; NAN = not given */
    int response_format; /* enum mmrt_response_format; −1 = not given */
    const char *json_schema; /* --json-schema FILE, or NULL */
    int json;
};

struct collected {
    int json;
    int32_t *ids;
    int n_ids, cap;
    char *text;
    size_t len, cap_text;
};

static bool on_token(void *user, int32_t id, const char *text)
{
    struct collected *c = user;
    size_t n = strlen(text);
    if (!c->json) {
        fputs(text, stdout);
        fflush(stdout);
    }
    if (c->len + n + 1 > c->cap_text) {
        size_t cap = (c->cap_text + n + 1) * 2;
        char *grown = realloc(c->text, cap);
        if (!grown)
            return false;
        c->text = grown;
        c->cap_text = cap;
    }
    memcpy(c->text + c->len, text, n + 1);
    c->len += n;
    if (id >= 0) {
        if (c->n_ids == c->cap) {
            int cap = c->cap ? 2 * c->cap : 64;
            int32_t *grown = realloc(c->ids, (size_t)cap * sizeof *grown);
            if (!grown)
                return false;
            c->ids = grown;
            c->cap = cap;
        }
        c->ids[c->n_ids++] = id;
    }
    return true;
}

/* The per-device memory figures: the weights of the stages placed there (mapped in place or
 * copied) and the working pool. */
static json_t *devices_json(struct mmrt_runtime *rt)
{
    json_t *devs = json_object();
    for (int i = 0; devs && i < mmrt_device_count(rt); i++) {
        struct mmrt_device_desc d;
        struct mmrt_memory_report mr = { .struct_size = sizeof mr };
        if (mmrt_device_describe(rt, i, &d) != MMRT_OK ||
            mmrt_device_memory(rt, i, &mr) != MMRT_OK)
            continue;
        json_object_set_new(
            devs, d.name,
            json_pack("{s:s, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:f, s:I, s:I, s:I, s:I}",
                      "plugin", d.plugin,
                      "weight_bytes", (json_int_t)mr.weight_bytes, "weight_mapped_bytes",
                      (json_int_t)mr.weight_mapped_bytes, "weight_copied_bytes",
                      (json_int_t)mr.weight_copied_bytes, "weight_reserved_bytes",
                      (json_int_t)mr.weight_reserved_bytes, "pool_bytes",
                      (json_int_t)mr.pool_capacity_bytes, "peak_bytes",
                      (json_int_t)mr.pool_peak_bytes, "in_use_bytes",
                      (json_int_t)mr.pool_bytes_in_use, "fragmentation",
                      mr.pool_fragmentation, "kv_page_tokens", (json_int_t)mr.kv_page_tokens,
                      "kv_pages_total", (json_int_t)mr.kv_pages_total, "kv_pages_used",
                      (json_int_t)mr.kv_pages_used, "kv_bytes", (json_int_t)mr.kv_bytes));
        json_t *dj = json_object_get(devs, d.name);
        if (dj && mr.kv_dtype)
            json_object_set_new(dj, "kv_dtype", json_string(mr.kv_dtype));
        if (dj)
            json_object_set_new(dj, "level1",
                                json_pack("{s:I, s:I, s:I, s:I}", "hits",
                                          (json_int_t)mr.level1_hits, "misses",
                                          (json_int_t)mr.level1_misses, "bytes",
                                          (json_int_t)mr.level1_bytes, "free_bytes",
                                          (json_int_t)mr.level1_free_bytes));
    }
    return devs;
}

static json_t *record_json(const struct collected *c, const struct mmrt_result *r)
{
    json_t *ids = json_array();
    for (int i = 0; ids && i < c->n_ids; i++)
        json_array_append_new(ids, json_integer(c->ids[i]));
    json_t *rec = json_pack(
        "{s:s, s:o, s:i, s:i, s:{s:f, s:f, s:f, s:f}, s:f, s:{s:f, s:f, s:f, s:f}}", "text",
        c->text ? c->text : "", "token_ids", ids ? ids : json_array(), "n_prompt_tokens",
        r->n_prompt_tokens, "n_tokens", r->n_tokens, "timing_ms", "preprocess", r->preprocess_ms,
        "vision", r->vision_ms, "prefill", r->prefill_ms, "decode", r->decode_ms,
        "decode_tokens_per_s", r->decode_tokens_per_s, "stages_ms", "vision_start",
        r->vision_start_ms, "vision_end", r->vision_end_ms, "language_start",
        r->language_start_ms, "language_end", r->language_end_ms);
    if (rec)
        json_object_set_new(rec, "decode_graph", json_boolean(r->decode_graph));
    if (rec && r->status != MMRT_OK)
        json_object_set_new(rec, "error", json_string(r->message));
    return rec;
}

static int print_and_free(json_t *root)
{
    char *out = root ? json_dumps(root, JSON_INDENT(2) | JSON_PRESERVE_ORDER |
                                            JSON_REAL_PRECISION(6))
                     : NULL;
    json_decref(root);
    if (!out) {
        fprintf(stderr, "mmrt: out of memory\n");
        return EXIT_RUN_FAILED;
    }
    puts(out);
    free(out);
    return 0;
}

static int print_json(struct mmrt_runtime *rt, const struct collected *c,
                      const struct mmrt_result *r)
{
    json_t *rec = record_json(c, r);
    if (rec) {
        json_object_set_new(rec, "model_type", json_string(mmrt_model_type(rt)));
        json_object_set_new(rec, "devices", devices_json(rt));
    }
    return print_and_free(rec);
}

static int show_devices(struct mmrt_runtime *rt, const char *path)
{
    printf("mmrt %s: %s (no [model]: devices only)\n", mmrt_version(), path);
    for (int i = 0; i < mmrt_device_count(rt); i++) {
        struct mmrt_device_desc d;
        struct mmrt_pool_report pr;
        if (mmrt_device_describe(rt, i, &d) != MMRT_OK ||
            mmrt_device_pool_stats(rt, i, &pr) != MMRT_OK) {
            fprintf(stderr, "mmrt: %s\n", mmrt_last_error(rt));
            return EXIT_RUN_FAILED;
        }
        printf("device %-8s %s:%d  %s (%s)  pool %.0f MiB, %.0f MiB in use, "
               "largest free block %.0f MiB, fragmentation %.3f\n",
               d.name, d.plugin, d.index, d.device_name, d.kind, mib(pr.capacity_bytes),
               mib(pr.bytes_in_use), mib(pr.largest_free_block), pr.fragmentation);
    }
    return 0;
}

/* The requests of the command line: [run] defaults, overridden by flags; several
 * --image / --prompt pairs make several requests (a single one of either is shared), except
 * that several --image with at most one --prompt make one request about all the images
 * when the model takes that many per request. */
static int build_requests(struct mmrt_runtime *rt, const struct overrides *o,
                          struct mmrt_request *reqs, struct mmrt_image_input *images,
                          int *n_reqs)
{
    for (int i = 0; i < o->n_images; i++)
        images[i] = (struct mmrt_image_input){ .path = o->images[i] };
    if (o->n_images > 1 && o->n_prompts <= 1 && o->n_images <= mmrt_model_max_images(rt)) {
        struct overrides one = *o;
        one.n_images = 0;
        if (build_requests(rt, &one, reqs, images, n_reqs) != 0)
            return -1;
        reqs[0].images = images;
        reqs[0].n_images = o->n_images;
        return 0;
    }
    int n = o->n_images > o->n_prompts ? o->n_images : o->n_prompts;
    if (o->n_images > 1 && o->n_prompts > 1 && o->n_images != o->n_prompts) {
        fprintf(stderr, "mmrt: %d --image and %d --prompt: give one of them once, or pair them\n",
                o->n_images, o->n_prompts);
        return -1;
    }
    if (n < 1)
        n = 1;
    for (int i = 0; i < n; i++) {
        struct mmrt_request *req = &reqs[i];
        req->struct_size = sizeof *req;
        mmrt_run_defaults(rt, req);
        if (o->n_images) {
            req->images = &images[o->n_images == 1 ? 0 : i];
            req->n_images = 1;
        }
        if (o->n_prompts)
            req->prompt = o->prompts[o->n_prompts == 1 ? 0 : i];
        if (o->max_tokens >= 0)
            req->max_tokens = (int)o->max_tokens;
        if (o->seed >= 0)
            req->seed = (uint64_t)o->seed;
        if (o->temperature >= 0)
            req->temperature = (float)o->temperature;
        if (o->top_k >= 0)
            req->top_k = (int)o->top_k;
        if (o->top_p >= 0)
            req->top_p = (float)o->top_p;
        if (!isnan(o->penalty[0]))
            req->repetition_penalty = (float)o->penalty[0];
        if (!isnan(o->penalty[1]))
            req->presence_penalty = (float)o->penalty[1];
        if (!isnan(o->penalty[2]))
            req->frequency_penalty = (float)o->penalty[2];
        if (o->response_format >= 0)
            req->response_format = o->response_format;
        if (!req->prompt)
            req->prompt = "";
    }
    *n_reqs = n;
    return 0;
}

static int run_check(struct mmrt_runtime *rt, const struct mmrt_request *req, int json)
{
    struct mmrt_check_report r;
    if (mmrt_check(rt, req, &r) != MMRT_OK) {
        fprintf(stderr, "mmrt: %s\n", mmrt_last_error(rt));
        return EXIT_RUN_FAILED;
    }
    if (json) {
        int rc = print_and_free(json_pack(
            "{s:b, s:f, s:{s:f, s:f}, s:{s:f, s:f, s:i}, s:i, s:i, s:i}", "pass", r.pass,
            "tolerance", r.tolerance, "vision", "max_abs", r.features_max_abs, "max_rel",
            r.features_max_rel, "language", "max_abs", r.logits_max_abs, "max_rel",
            r.logits_max_rel, "steps", r.n_steps, "first_divergence", r.first_divergence,
            "n_tokens", r.n_tokens, "n_tokens_reference", r.n_tokens_reference));
        if (rc)
            return rc;
    } else {
        printf("stage     what             max abs diff  max rel diff  tolerance\n");
        printf("vision    image features   %12.3g  %12.3g  %9.1g\n", r.features_max_abs,
               r.features_max_rel, r.tolerance);
        printf("language  logits (%3d st.) %12.3g  %12.3g  %9.1g\n", r.n_steps,
               r.logits_max_abs, r.logits_max_rel, r.tolerance);
        if (r.first_divergence >= 0)
            printf("greedy tokens diverge at step %d\n", r.first_divergence);
        else
            printf("greedy tokens identical (%d steps)\n", r.n_tokens);
        printf("%s\n", r.pass ? "PASS" : "FAIL");
    }
    return r.pass ? 0 : EXIT_CHECK_FAILED;
}

static bool batch_token(void *user, int request, int32_t id, const char *text)
{
    struct collected *all = user;
    return on_token(&all[request], id, text);
}

static int run_conf(const char *path, const struct overrides *o)
{
    struct mmrt_runtime *rt = NULL;
    char err[2048] = "";
    mmrt_status st = mmrt_create_from_file(path, &rt, err, sizeof err);
    if (st != MMRT_OK) {
        fprintf(stderr, "%s\n", err);
        return is_config_error(st) ? EXIT_CONFIG : EXIT_RUN_FAILED;
    }
    int rc = 0, n = 0;
    char *schema = NULL; /* --json-schema's text */
    struct mmrt_request reqs[MAX_REQUESTS];
    struct mmrt_image_input images[MAX_REQUESTS];
    struct mmrt_result res[MAX_REQUESTS] = { { 0 } };
    struct collected c[MAX_REQUESTS];
    memset(c, 0, sizeof c);
    if (!mmrt_model_type(rt)) {
        rc = show_devices(rt, path);
        goto out;
    }
    memset(res, 0, sizeof res);
    res[0].struct_size = sizeof res[0]; /* a batch's results are strided by the first's */
    if (build_requests(rt, o, reqs, images, &n) != 0) {
        rc = EXIT_CONFIG;
        goto out;
    }
    if (o->json_schema && o->response_format >= 0) {
        fprintf(stderr, "mmrt: --json-schema and --response-format: give one\n");
        rc = EXIT_CONFIG;
        goto out;
    }
    if (o->json_schema) {
        /* Checked here too (the runtime checks it at submission) so that a schema mmrt cannot
         * hold an answer to is a usage error naming the file and the place in it. */
        struct mmrt_error e = { 0 };
        struct mmrt_json_schema *compiled = NULL;
        size_t len = 0;
        if (mmrt_file_read(o->json_schema, MAX_SCHEMA_BYTES, 0, " for a JSON schema", &schema,
                           &len, &e) != MMRT_OK ||
            mmrt_json_schema_parse(schema, len, &compiled, &e) != MMRT_OK) {
            fprintf(stderr, "mmrt: --json-schema %s: %s\n", o->json_schema, e.msg);
            rc = EXIT_CONFIG;
            goto out;
        }
        mmrt_json_schema_free(compiled);
        for (int i = 0; i < n; i++) {
            reqs[i].response_format = MMRT_RESPONSE_JSON_SCHEMA;
            reqs[i].json_schema = schema;
        }
    }
    if (o->check) {
        rc = run_check(rt, &reqs[0], o->json);
        goto out;
    }
    for (int i = 0; i < n; i++)
        c[i].json = o->json || n > 1; /* several answers are printed whole, one per line */
    if (n == 1)
        st = mmrt_run(rt, &reqs[0], on_token, &c[0], &res[0]);
    else
        st = mmrt_run_batch(rt, reqs, n, batch_token, c, res);
    if (o->json) {
        if (n == 1) {
            rc = st == MMRT_OK ? print_json(rt, &c[0], &res[0]) : 0;
        } else {
            json_t *arr = json_array();
            for (int i = 0; arr && i < n; i++)
                json_array_append_new(arr, record_json(&c[i], &res[i]));
            rc = print_and_free(json_pack("{s:s, s:o, s:o}", "model_type", mmrt_model_type(rt),
                                          "requests", arr ? arr : json_array(), "devices",
                                          devices_json(rt)));
        }
    } else if (n == 1) {
        if (st == MMRT_OK || c[0].len)
            putchar('\n');
    } else {
        for (int i = 0; i < n; i++)
            if (res[i].status == MMRT_OK)
                printf("[%d] %s\n", i, c[i].text ? c[i].text : "");
    }
    if (st != MMRT_OK) {
        fprintf(stderr, "mmrt: %s\n", mmrt_last_error(rt));
        rc = st == MMRT_ERR_CONFIG ? EXIT_CONFIG : EXIT_RUN_FAILED;
    }
out:
    for (int i = 0; i < MAX_REQUESTS; i++) {
        free(c[i].ids);
        free(c[i].text);
    }
    free(schema);
    mmrt_destroy(rt);
    return rc;
}

/* Strict number parsing for flags: the whole argument, in range. */
static int parse_long(const char *flag, const char *arg, long lo, long hi, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(arg, &end, 10);
    if (errno || end == arg || *end || v < lo || v > hi) {
        fprintf(stderr, "mmrt: %s '%s' must be an integer in [%ld, %ld]\n", flag, arg, lo, hi);
        return -1;
    }
    *out = v;
    return 0;
}

static int parse_double(const char *flag, const char *arg, double lo, double hi, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(arg, &end);
    if (errno || end == arg || *end || !isfinite(v) || v < lo || v > hi) {
        fprintf(stderr, "mmrt: %s '%s' must be a number in [%g, %g]\n", flag, arg, lo, hi);
        return -1;
    }
    *out = v;
    return 0;
}

static void cli_log(void *user, enum mmrt_log_level level, const char *who, const char *msg)
{
    (void)user;
    static const char *names[] = { "debug", "info", "warning", "error" };
    fprintf(stderr, "mmrt: %s: %s: %s\n", names[level & 3], who, msg);
}

/* `mmrt serve --conf FILE [--port N]` */
static int serve_main(int argc, char **argv)
{
    static const struct option longopts[] = {
        { "conf", required_argument, NULL, 'c' },
        { "port", required_argument, NULL, 'p' },
        { "help", no_argument, NULL, 'h' },
        { NULL, 0, NULL, 0 },
    };
    const char *conf = NULL;
    struct mmrt_serve_options o = { .port = -1 };
    int opt;
    while ((opt = getopt_long(argc, argv, "c:p:h", longopts, NULL)) != -1) {
        switch (opt) {
        case 'c': conf = optarg; break;
        case 'p': {
            char *end = NULL;
            errno = 0;
            long v = strtol(optarg, &end, 10);
            if (errno || end == optarg || *end || v < 0 || v > 65535) {
                fprintf(stderr, "mmrt serve: --port '%s': expected 0 … 65535\n", optarg);
                return EXIT_CONFIG;
            }
            o.port = (int)v;
            break;
        }
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return EXIT_CONFIG;
        }
    }
    if (!conf || optind != argc) {
        fprintf(stderr, "mmrt serve: --conf FILE is required (and nothing else)\n");
        return EXIT_CONFIG;
    }
    return mmrt_serve(conf, &o);
}

int main(int argc, char **argv)
{
    static const struct option longopts[] = {
        { "conf", required_argument, NULL, 'c' },
        { "image", required_argument, NULL, 'i' },
        { "prompt", required_argument, NULL, 'p' },
        { "max-tokens", required_argument, NULL, 'n' },
        { "seed", required_argument, NULL, 's' },
        { "temperature", required_argument, NULL, 't' },
        { "top-k", required_argument, NULL, 'k' },
        { "top-p", required_argument, NULL, 'P' },
        { "repetition-penalty", required_argument, NULL, 'R' },
        { "presence-penalty", required_argument, NULL, 'Q' },
        { "frequency-penalty", required_argument, NULL, 'F' },
        { "response-format", required_argument, NULL, 'f' },
        { "json-schema", required_argument, NULL, 'J' },
        { "json", no_argument, NULL, 'j' },
        { "check", no_argument, NULL, 'C' },
        { "list-devices", no_argument, NULL, 'l' },
        { "version", no_argument, NULL, 'V' },
        { "help", no_argument, NULL, 'h' },
        { NULL, 0, NULL, 0 },
    };
    const char *conf = NULL;
    int list = 0, opt;
    struct overrides o = { .max_tokens = -1, .top_k = -1, .seed = -1, .temperature = -1,
                           .top_p = -1, .penalty = { NAN, NAN, NAN },
                           .response_format = -1 };
    long lv;
    const char *level = getenv("MMRT_LOG");
    enum mmrt_log_level min = MMRT_LOG_WARN;
    if (level && strcmp(level, "debug") == 0)
        min = MMRT_LOG_DEBUG;
    else if (level && strcmp(level, "info") == 0)
        min = MMRT_LOG_INFO;
    mmrt_set_log_sink(cli_log, NULL, min);
    if (argc > 1 && strcmp(argv[1], "serve") == 0)
        return serve_main(argc - 1, argv + 1);

    while ((opt = getopt_long(argc, argv, "c:lVhi:p:n:s:t:k:P:jC", longopts, NULL)) != -1) {
        switch (opt) {
        case 'c': conf = optarg; break;
        case 'i':
        case 'p':
            if ((opt == 'i' ? o.n_images : o.n_prompts) == MAX_REQUESTS) {
                fprintf(stderr, "mmrt: at most %d --image / --prompt\n", MAX_REQUESTS);
                return EXIT_CONFIG;
            }
            if (opt == 'i')
                o.images[o.n_images++] = optarg;
            else
                o.prompts[o.n_prompts++] = optarg;
            break;
        case 'C': o.check = 1; break;
        case 'j': o.json = 1; break;
        case 'n':
            if (parse_long("--max-tokens", optarg, 1, 1000000, &o.max_tokens))
                return EXIT_CONFIG;
            break;
        case 's':
            if (parse_long("--seed", optarg, 0, __LONG_MAX__, &lv))
                return EXIT_CONFIG;
            o.seed = lv;
            break;
        case 't':
            if (parse_double("--temperature", optarg, 0, 100, &o.temperature))
                return EXIT_CONFIG;
            break;
        case 'k':
            if (parse_long("--top-k", optarg, 0, 1000000, &o.top_k))
                return EXIT_CONFIG;
            break;
        case 'P':
            if (parse_double("--top-p", optarg, 1e-9, 1, &o.top_p))
                return EXIT_CONFIG;
            break;
        case 'R':
            if (parse_double("--repetition-penalty", optarg, 1e-9, 100, &o.penalty[0]))
                return EXIT_CONFIG;
            break;
        case 'Q':
        case 'F':
            if (parse_double(opt == 'Q' ? "--presence-penalty" : "--frequency-penalty", optarg,
                             -2, 2, &o.penalty[opt == 'Q' ? 1 : 2]))
                return EXIT_CONFIG;
            break;
        case 'f':
            if (strcmp(optarg, "text") == 0) {
                o.response_format = MMRT_RESPONSE_TEXT;
            } else if (strcmp(optarg, "json_object") == 0) {
                o.response_format = MMRT_RESPONSE_JSON_OBJECT;
            } else {
                fprintf(stderr, "mmrt: --response-format '%s': expected text or json_object "
                        "(or give --json-schema FILE)\n", optarg);
                return EXIT_CONFIG;
            }
            break;
        case 'J': o.json_schema = optarg; break;
        case 'l': list = 1; break;
        case 'V': printf("mmrt %s\n", mmrt_version()); return 0;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return EXIT_CONFIG;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "mmrt: unexpected argument '%s'\n", argv[optind]);
        usage(stderr);
        return EXIT_CONFIG;
    }
    if (list)
        return list_devices();
    if (!conf) {
        usage(stderr);
        return EXIT_CONFIG;
    }
    return run_conf(conf, &o);
}
