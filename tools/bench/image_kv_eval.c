/*
 * tools/bench/image_kv_eval.c — mmrt-image-kv-eval: what image-token KV compression costs in
 * answers (docs/BENCHMARKS.md "Image-token KV compression"), every policy at every keep ratio
 * against the uncompressed cache of the same model on the same plugin.
 *
 *   mmrt-image-kv-eval [--plugin NAME] [--keeps R,R,…] [--policies P,P,…] [--limit N]
 *                      [--kv-dtypes T,T,…] [--weights F,F,…] [--option KEY=VALUE]
 *                      [--base-weights F] [--base-option KEY=VALUE] MODEL_DIR ITEMS_JSON
 *
 * ITEMS_JSON is either the demo model's held-out set ({"items": [{"image", "question",
 * "answer"}, …]}, images relative to the file) or a fixture's expected.json ({"cases":
 * [{"image" or "images": [one], "prompt"}, …]}, images relative to the working directory;
 * cases with other shapes are skipped). Every item is answered greedily (at most MAX_STEPS tokens) with the
 * cache uncompressed, then once per policy and keep ratio. Per setting it prints:
 *   - accuracy: exact answers (after trimming blanks), where the items carry answers;
 *   - top-1 and mean KL(uncompressed ‖ compressed) of the next-token distribution over the
 *     answer positions reached along the uncompressed answer's tokens (the position where the
 *     answers part is counted, the ones after it are not: the contexts differ from there), as
 *     mmrt-quantize --report measures weights;
 *   - the image positions dropped per request.
 * Defaults: keeps 0.75,0.5,0.25,0.1; all four policies; the CPU plugin.
 * --kv-dtypes f16,fp8 measures the KV cache's storage format instead ([model] kv_dtype): one
 * row per format, the whole cache kept, against the F32 cache, the same measures (the
 * figures of docs/QUANTIZATION.md "KV cache formats"); no policy rows then.
 * --weights int8,int4,… likewise measures weights quantized at load ([model] weights) against
 * the checkpoint's own. --option KEY=VALUE (up to 4) gives every row but the base that
 * device option: `--weights int4 --option int8_dot=1` measures the CPU plugin's int8 dot
 * products on INT4 weights against the checkpoint (docs/QUANTIZATION.md "int8_dot"), and
 * --base-weights F makes the base run F instead of the checkpoint, and --base-option KEY=VALUE
 * (up to 4) gives the base its own device options: `--base-weights int4 --base-option
 * int8_dot=0 --weights int4 --option int8_dot=3` is int8_dot's own effect, against INT4 on
 * the f32 GEMV.
 */
#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "fidelity.h"
#include "model.h"
#include "quant.h"
#include "mmrt/mmrt.h"

#define MAX_STEPS 24
#define MAX_SETTINGS 32

struct item {
    char *image, *prompt, *answer; /* answer NULL: none given */
};

struct run {
    float *p;      /* [n_items][MAX_STEPS][vocab] probabilities */
    int32_t *ids;  /* [n_items][MAX_STEPS], −1 past the end */
    char **text;   /* [n_items] */
    int64_t vocab;
    uint64_t dropped;
};

struct capture {
    float *p;
    int32_t *ids;
    int64_t vocab;
    int n_ids;
    char text[512];
    size_t len;
};

static void on_logits(void *user, int step, const float *logits, int64_t vocab)
{
    struct capture *c = user;
    if (step >= 0 && step < MAX_STEPS && vocab == c->vocab)
        fidelity_softmax(logits, vocab, c->p + (size_t)step * (size_t)vocab);
}

static bool on_token(void *user, int32_t id, const char *text)
{
    struct capture *c = user;
    if (id >= 0 && c->n_ids < MAX_STEPS)
        c->ids[c->n_ids++] = id;
    const size_t n = strlen(text);
    if (c->len + n < sizeof c->text) {
        memcpy(c->text + c->len, text, n + 1);
        c->len += n;
    }
    return true;
}

static char *trim(const char *s)
{
    while (*s == ' ' || *s == '\n')
        s++;
    size_t n = strlen(s);
    while (n > 0 && (s[n - 1] == ' ' || s[n - 1] == '\n'))
        n--;
    char *t = malloc(n + 1);
    if (t) {
        memcpy(t, s, n);
        t[n] = '\0';
    }
    return t;
}

static void items_free(struct item *items, int n)
{
    for (int i = 0; items && i < n; i++) {
        free(items[i].image);
        free(items[i].prompt);
        free(items[i].answer);
    }
    free(items);
}

static int load_items(const char *path, struct item **out, int limit)
{
    json_error_t jerr;
    json_t *root = json_load_file(path, 0, &jerr);
    if (!root) {
        fprintf(stderr, "mmrt-image-kv-eval: %s:%d: %s\n", path, jerr.line, jerr.text);
        return -1;
    }
    const json_t *list = json_object_get(root, "items");
    const bool demo = list != NULL;
    if (!demo)
        list = json_object_get(root, "cases");
    if (!json_is_array(list)) {
        fprintf(stderr, "mmrt-image-kv-eval: %s: neither \"items\" nor \"cases\" is an array\n",
                path);
        json_decref(root);
        return -1;
    }
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash)
        slash[1] = '\0';
    else
        dir[0] = '\0';
    struct item *items = calloc(json_array_size(list) + 1, sizeof *items);
    int n = 0;
    size_t i;
    const json_t *it;
    json_array_foreach(list, i, it) {
        if (!items || (limit > 0 && n == limit))
            break;
        const char *img = json_string_value(json_object_get(it, "image"));
        const json_t *imgs = json_object_get(it, "images"); /* Qwen2-VL's cases */
        if (!img && json_is_array(imgs) && json_array_size(imgs) == 1)
            img = json_string_value(json_array_get(imgs, 0));
        const char *q = json_string_value(json_object_get(it, demo ? "question" : "prompt"));
        if (!img || !q)
            continue;
        char full[8192];
        snprintf(full, sizeof full, "%s%s", demo ? dir : "", img);
        const char *ans = json_string_value(json_object_get(it, "answer"));
        items[n].image = strdup(full);
        items[n].prompt = strdup(q);
        items[n].answer = ans ? strdup(ans) : NULL;
        n++;
        if (!items[n - 1].image || !items[n - 1].prompt || (ans && !items[n - 1].answer)) {
            items_free(items, n);
            items = NULL;
        }
    }
    json_decref(root);
    if (!items)
        fprintf(stderr, "mmrt-image-kv-eval: %s: out of memory\n", path);
    *out = items;
    return items ? n : -1;
}

static void run_free(struct run *r, int n)
{
    for (int i = 0; r->text && i < n; i++)
        free(r->text[i]);
    free(r->text);
    free(r->p);
    free(r->ids);
    memset(r, 0, sizeof *r);
}

/* What a run varies beside the image KV policy: the weights' format and the device options
 * (the base run has neither). */
struct variant {
    enum mmrt_weight_format weights;
    const struct mmrt_option *options;
    int n_options;
};

static int answer_all(const char *dir, const char *plugin, double keep,
                      enum mmrt_image_kv_policy policy, enum mmrt_kv_dtype kv,
                      const struct variant *v, const struct item *items, int n, int64_t vocab,
                      struct run *r)
{
    struct mmrt_device_config dev = { .name = "d", .plugin = plugin, .options = v->options,
                                      .n_options = v->n_options };
    struct mmrt_config cfg = { .struct_size = sizeof cfg, .model_path = dir, .devices = &dev,
                               .n_devices = 1, .image_kv_keep = keep,
                               .image_kv_policy = policy, .kv_dtype = kv,
                               .vision_cache_entries = 0, .weights = v->weights };
    struct mmrt_runtime *rt = NULL;
    char err[2048];
    if (mmrt_create(&cfg, &rt, err, sizeof err) != MMRT_OK) {
        fprintf(stderr, "mmrt-image-kv-eval: %s\n", err);
        return -1;
    }
    r->vocab = vocab;
    const size_t per = (size_t)MAX_STEPS * (size_t)vocab;
    r->p = calloc((size_t)n * per, sizeof *r->p);
    r->ids = malloc((size_t)n * MAX_STEPS * sizeof *r->ids);
    r->text = calloc((size_t)n, sizeof *r->text);
    if (!r->p || !r->ids || !r->text) {
        fprintf(stderr, "mmrt-image-kv-eval: out of memory\n");
        run_free(r, n);
        mmrt_destroy(rt);
        return -1;
    }
    for (int i = 0; i < n; i++) {
        struct capture c = { .p = r->p + (size_t)i * per, .ids = r->ids + i * MAX_STEPS,
                             .vocab = vocab };
        for (int s = 0; s < MAX_STEPS; s++)
            c.ids[s] = -1;
        struct mmrt_image_input img = { .path = items[i].image };
        struct mmrt_request req = { .struct_size = sizeof req, .prompt = items[i].prompt,
                                    .images = &img, .n_images = 1, .max_tokens = MAX_STEPS,
                                    .top_p = 1.0f };
        const struct mmrt_model_trace trace = { .user = &c, .logits = on_logits };
        struct mmrt_result res = { .struct_size = sizeof res };
        if (mmrt_run_traced(rt, &req, &trace, on_token, &c, &res) != MMRT_OK) {
            fprintf(stderr, "mmrt-image-kv-eval: %s: %s\n", items[i].image, res.message);
            run_free(r, n);
            mmrt_destroy(rt);
            return -1;
        }
        r->text[i] = trim(c.text);
        if (!r->text[i]) {
            fprintf(stderr, "mmrt-image-kv-eval: out of memory\n");
            run_free(r, n);
            mmrt_destroy(rt);
            return -1;
        }
    }
    struct mmrt_engine_stats es;
    mmrt_runtime_engine_stats(rt, &es);
    r->dropped = es.image_kv_dropped_tokens;
    mmrt_destroy(rt);
    return 0;
}

/* One row of the table: the items answered with `keep` of the image tokens kept by `policy`
 * and the KV cache in `kv`, against the uncompressed F32 base: exact answers (items that
 * give one), next-token top-1 agreement (with top1_decimals decimals) and mean KL over every
 * generated position, image tokens dropped per request. Non-zero when a run fails. */
static int table_row(const char *dir, const char *plugin, double keep,
                     enum mmrt_image_kv_policy policy, enum mmrt_kv_dtype kv,
                     const struct variant *v, const char *label, int top1_decimals,
                     const struct run *base, const struct item *items, int n, int64_t vocab,
                     int with_answers)
{
    struct run r = { 0 };
    if (answer_all(dir, plugin, keep, policy, kv, v, items, n, vocab, &r) != 0)
        return 1;
    const size_t per = (size_t)MAX_STEPS * (size_t)vocab;
    struct fidelity_sum f = { 0 };
    int correct = 0;
    for (int i = 0; i < n; i++) {
        fidelity_add(&f, base->p + (size_t)i * per, base->ids + i * MAX_STEPS,
                     r.p + (size_t)i * per, r.ids + i * MAX_STEPS, MAX_STEPS, vocab);
        correct += items[i].answer && strcmp(r.text[i], items[i].answer) == 0;
    }
    char acc[64] = "–";
    if (with_answers)
        snprintf(acc, sizeof acc, "%.1f%% (%d/%d)", 100.0 * correct / with_answers, correct,
                 with_answers);
    printf("| %s | %g | %s | %.*f%% | %.3g | %.1f |\n", label, keep, acc, top1_decimals,
           f.positions ? 100.0 * f.same / f.positions : 100.0,
           f.positions ? f.kl / f.positions : 0, (double)r.dropped / n);
    fflush(stdout);
    run_free(&r, n);
    return 0;
}

/* The vocabulary of the model: the first logits row of one short run tells it. */
static void on_vocab(void *user, int step, const float *logits, int64_t vocab)
{
    (void)step;
    (void)logits;
    *(int64_t *)user = vocab;
}

static int64_t vocab_of(const char *dir, const char *plugin, const struct item *it)
{
    struct mmrt_device_config dev = { .name = "d", .plugin = plugin };
    struct mmrt_config cfg = { .struct_size = sizeof cfg, .model_path = dir, .devices = &dev,
                               .n_devices = 1 };
    struct mmrt_runtime *rt = NULL;
    char err[2048];
    if (mmrt_create(&cfg, &rt, err, sizeof err) != MMRT_OK) {
        fprintf(stderr, "mmrt-image-kv-eval: %s\n", err);
        return -1;
    }
    int64_t v = -1;
    struct mmrt_image_input img = { .path = it->image };
    struct mmrt_request req = { .struct_size = sizeof req, .prompt = it->prompt,
                                .images = &img, .n_images = 1, .max_tokens = 1,
                                .top_p = 1.0f };
    const struct mmrt_model_trace trace = { .user = &v, .logits = on_vocab };
    struct mmrt_result res = { .struct_size = sizeof res };
    if (mmrt_run_traced(rt, &req, &trace, NULL, NULL, &res) != MMRT_OK)
        fprintf(stderr, "mmrt-image-kv-eval: %s: %s\n", it->image, res.message);
    mmrt_destroy(rt);
    return v;
}

static bool parse_list(const char *s, double *out, int *n, int max)
{
    *n = 0;
    while (*s && *n < max) {
        char *end;
        out[(*n)++] = strtod(s, &end);
        if (end == s || (*end && *end != ','))
            return false;
        s = *end ? end + 1 : end;
    }
    return *n > 0;
}

static bool policy_of(const char *s, size_t n, enum mmrt_image_kv_policy *out)
{
    static const enum mmrt_image_kv_policy all[] = {
        MMRT_IMAGE_KV_KEY_NORM_HIGH, MMRT_IMAGE_KV_KEY_NORM_LOW, MMRT_IMAGE_KV_RANDOM,
        MMRT_IMAGE_KV_POOL2X2,
    };
    for (size_t i = 0; i < 4; i++) {
        const char *name = mmrt_image_kv_policy_name(all[i]);
        if (strlen(name) == n && memcmp(name, s, n) == 0) {
            *out = all[i];
            return true;
        }
    }
    return false;
}

/* ", key=value" for each of a variant's device options: what a row's label adds. */
static void options_label(const struct variant *v, char *out, size_t size)
{
    out[0] = '\0';
    for (int o = 0; o < v->n_options; o++)
        snprintf(out + strlen(out), size - strlen(out), ", %s=%s", v->options[o].key,
                 v->options[o].value);
}

int main(int argc, char **argv)
{
    const char *plugin = "cpu";
    double keeps[8] = { 0.75, 0.5, 0.25, 0.1 };
    int n_keeps = 4, limit = 0;
    enum mmrt_image_kv_policy policies[4] = {
        MMRT_IMAGE_KV_KEY_NORM_HIGH, MMRT_IMAGE_KV_KEY_NORM_LOW, MMRT_IMAGE_KV_RANDOM,
        MMRT_IMAGE_KV_POOL2X2,
    };
    int n_policies = 4;
    enum mmrt_kv_dtype kv_dtypes[4];
    enum mmrt_weight_format weights[8];
    int n_weights = 0, base_weights = MMRT_WEIGHTS_CHECKPOINT;
    struct mmrt_option options[4], base_options[4];
    char option_text[4][128], base_option_text[4][128];
    struct variant cand = { .options = options };
    struct variant plain = { .options = base_options };
    const char *kv_names[4];
    int n_kv = 0;
    int a = 1;
    for (; a + 1 < argc && strncmp(argv[a], "--", 2) == 0; a += 2) {
        if (strcmp(argv[a], "--plugin") == 0) {
            plugin = argv[a + 1];
        } else if (strcmp(argv[a], "--keeps") == 0) {
            if (!parse_list(argv[a + 1], keeps, &n_keeps, 8)) {
                fprintf(stderr, "mmrt-image-kv-eval: --keeps '%s': expected numbers like "
                                "0.5,0.25\n", argv[a + 1]);
                return 2;
            }
        } else if (strcmp(argv[a], "--policies") == 0) {
            n_policies = 0;
            for (const char *s = argv[a + 1]; *s && n_policies < 4;) {
                const char *comma = strchr(s, ',');
                const size_t len = comma ? (size_t)(comma - s) : strlen(s);
                if (!policy_of(s, len, &policies[n_policies++])) {
                    fprintf(stderr, "mmrt-image-kv-eval: --policies: unknown policy '%.*s' "
                                    "(key_norm_high, key_norm_low, random, pool2x2)\n",
                            (int)len, s);
                    return 2;
                }
                s += len + (comma != NULL);
            }
        } else if (strcmp(argv[a], "--kv-dtypes") == 0) {
            static const struct { const char *name; enum mmrt_kv_dtype kv; } known[] = {
                { "f32", MMRT_KV_F32 }, { "f16", MMRT_KV_F16 }, { "fp8", MMRT_KV_FP8 },
                { "int8", MMRT_KV_INT8 },
            };
            n_kv = 0;
            for (const char *s = argv[a + 1]; *s;) {
                const char *comma = strchr(s, ',');
                const size_t len = comma ? (size_t)(comma - s) : strlen(s);
                int found = -1;
                for (int k = 0; k < 4; k++)
                    if (strlen(known[k].name) == len && memcmp(known[k].name, s, len) == 0)
                        found = k;
                if (found < 0 || n_kv == 4) {
                    fprintf(stderr, "mmrt-image-kv-eval: --kv-dtypes: '%.*s' is not one of "
                                    "f32, f16, fp8, int8 (at most four)\n", (int)len, s);
                    return 2;
                }
                kv_dtypes[n_kv] = known[found].kv;
                kv_names[n_kv++] = known[found].name;
                s += len + (comma != NULL);
            }
        } else if (strcmp(argv[a], "--weights") == 0) {
            for (const char *w = argv[a + 1]; *w;) {
                size_t len = strcspn(w, ",");
                int found = -1;
                for (int f = MMRT_WEIGHTS_INT8; f <= MMRT_WEIGHTS_INT4_G32; f++) {
                    const char *name = mmrt_weight_format_name((enum mmrt_weight_format)f);
                    if (strlen(name) == len && strncmp(name, w, len) == 0)
                        found = f;
                }
                const bool trailing = w[len] == ',' && w[len + 1] == '\0';
                if (found < 0 || n_weights == 8 || trailing) {
                    fprintf(stderr, "mmrt-image-kv-eval: --weights \"%s\": %s'%.*s' (formats: "
                                    "int8, int4, int4-g64, int4-g32, at most 8, no empty "
                                    "element)\n", argv[a + 1],
                            trailing ? "an empty element after " : "not a format: ", (int)len, w);
                    return 2;
                }
                weights[n_weights++] = (enum mmrt_weight_format)found;
                w += len + (w[len] == ',');
            }
        } else if (strcmp(argv[a], "--base-weights") == 0) {
            base_weights = -1;
            for (int f = MMRT_WEIGHTS_CHECKPOINT; f <= MMRT_WEIGHTS_INT4_G32; f++)
                if (strcmp(argv[a + 1], mmrt_weight_format_name((enum mmrt_weight_format)f)) == 0)
                    base_weights = f;
            if (base_weights < 0) {
                fprintf(stderr, "mmrt-image-kv-eval: --base-weights: '%s' is not one of "
                                "checkpoint, int8, int4, int4-g64, int4-g32\n", argv[a + 1]);
                return 2;
            }
        } else if (strcmp(argv[a], "--option") == 0 || strcmp(argv[a], "--base-option") == 0) {
            const bool for_base = strcmp(argv[a], "--base-option") == 0;
            struct variant *v = for_base ? &plain : &cand;
            struct mmrt_option *slots = for_base ? base_options : options;
            char(*texts)[128] = for_base ? base_option_text : option_text;
            const char *eq = strchr(argv[a + 1], '=');
            if (!eq || eq == argv[a + 1] || v->n_options == 4 ||
                strlen(argv[a + 1]) >= sizeof texts[0]) {
                fprintf(stderr, "mmrt-image-kv-eval: %s '%s': expected KEY=VALUE (at "
                                "most 4)\n", argv[a], argv[a + 1]);
                return 2;
            }
            char *t = texts[v->n_options];
            snprintf(t, sizeof texts[0], "%s", argv[a + 1]);
            t[eq - argv[a + 1]] = '\0';
            slots[v->n_options++] = (struct mmrt_option){ t, t + (eq - argv[a + 1]) + 1 };
        } else if (strcmp(argv[a], "--limit") == 0) {
            char *end;
            const long v = strtol(argv[a + 1], &end, 10);
            if (end == argv[a + 1] || *end || v < 1 || v > 1000000) {
                fprintf(stderr, "mmrt-image-kv-eval: --limit '%s': expected 1 … 1000000 "
                                "items\n", argv[a + 1]);
                return 2;
            }
            limit = (int)v;
        } else {
            fprintf(stderr, "mmrt-image-kv-eval: unknown option %s\n", argv[a]);
            return 2;
        }
    }
    if (argc - a != 2) {
        fprintf(stderr, "usage: mmrt-image-kv-eval [--plugin NAME] [--keeps R,…] "
                        "[--policies P,…] [--limit N] [--kv-dtypes T,…] [--weights F,…] "
                        "[--option KEY=VALUE] [--base-weights F] [--base-option KEY=VALUE] "
                        "MODEL_DIR ITEMS_JSON\n");
        return 2;
    }
    const char *dir = argv[a], *path = argv[a + 1];
    struct item *items = NULL;
    const int n = load_items(path, &items, limit);
    if (n <= 0) {
        if (n == 0)
            fprintf(stderr, "mmrt-image-kv-eval: %s: no item with one image and a prompt\n",
                    path);
        items_free(items, 0);
        return 1;
    }
    const int64_t vocab = vocab_of(dir, plugin, &items[0]);
    struct run base = { 0 };
    plain.weights = (enum mmrt_weight_format)base_weights;
    if (vocab < 1 || answer_all(dir, plugin, 1, MMRT_IMAGE_KV_DEFAULT, MMRT_KV_F32, &plain,
                                items, n, vocab, &base) != 0) {
        items_free(items, n);
        return 1;
    }
    int correct0 = 0, with_answers = 0;
    for (int i = 0; i < n; i++)
        if (items[i].answer) {
            with_answers++;
            correct0 += strcmp(base.text[i], items[i].answer) == 0;
        }
    printf("%s on %s, %d items, greedy answers of at most %d tokens\n", dir, plugin, n,
           MAX_STEPS);
    printf("| policy | keep | accuracy | top-1 | mean KL | image positions dropped per request |\n");
    printf("|---|---|---|---|---|---|\n");
    char base_opts[160];
    options_label(&plain, base_opts, sizeof base_opts);
    if (with_answers)
        printf("| (%s%s) | 1 | %.1f%% (%d/%d) | 100%% | 0 | 0 |\n",
               base_weights == MMRT_WEIGHTS_CHECKPOINT
                   ? "uncompressed"
                   : mmrt_weight_format_name((enum mmrt_weight_format)base_weights),
               base_opts, 100.0 * correct0 / with_answers, correct0, with_answers);
    int rc = 0;
    if (n_kv > 0 || n_weights > 0)
        n_policies = 0; /* the storage formats only */
    char opts[160];
    options_label(&cand, opts, sizeof opts);
    for (int k = 0; k < n_kv && rc == 0; k++) {
        char label[224];
        snprintf(label, sizeof label, "kv_dtype %s%s", kv_names[k], opts);
        rc = table_row(dir, plugin, 1, MMRT_IMAGE_KV_DEFAULT, kv_dtypes[k], &cand, label, 2,
                       &base, items, n, vocab, with_answers);
    }
    for (int w = 0; w < n_weights && rc == 0; w++) {
        char label[224];
        struct variant v = cand;
        v.weights = weights[w];
        snprintf(label, sizeof label, "weights %s%s", mmrt_weight_format_name(weights[w]), opts);
        rc = table_row(dir, plugin, 1, MMRT_IMAGE_KV_DEFAULT, MMRT_KV_F32, &v, label, 2, &base,
                       items, n, vocab, with_answers);
    }
    for (int p = 0; p < n_policies && rc == 0; p++)
        for (int k = 0; k < n_keeps && rc == 0; k++)
            rc = table_row(dir, plugin, keeps[k], policies[p], MMRT_KV_F32, &cand,
                           mmrt_image_kv_policy_name(policies[p]), 1, &base, items, n, vocab,
                           with_answers);
    run_free(&base, n);
    items_free(items, n);
    return rc;
}
