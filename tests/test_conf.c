/* tests/test_conf.c — deploy.ini reader (core/formats/conf.c): fields, every error with its
 * exact FILE:LINE message, syntax corners, limits, file loading and an allocation sweep. */
#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>
#include <ini.h>

#include "formats/conf.h"

/* --- allocation wrappers: count live blocks, fail the n-th call when asked --- */

void *__real_malloc(size_t n);
void *__real_calloc(size_t a, size_t b);
void *__real_realloc(void *p, size_t n);
char *__real_strdup(const char *s);
void __real_free(void *p);

static long g_calls, g_fail_at, g_live;

static int injected_failure(void)
{
    return g_fail_at > 0 && ++g_calls == g_fail_at;
}

void *__wrap_malloc(size_t n)
{
    if (injected_failure())
        return NULL;
    void *q = __real_malloc(n);
    g_live += q != NULL;
    return q;
}

void *__wrap_calloc(size_t a, size_t b)
{
    if (injected_failure())
        return NULL;
    void *q = __real_calloc(a, b);
    g_live += q != NULL;
    return q;
}

void *__wrap_realloc(void *p, size_t n)
{
    if (injected_failure())
        return NULL;
    void *q = __real_realloc(p, n);
    g_live += q != NULL && p == NULL;
    return q;
}

char *__wrap_strdup(const char *s)
{
    if (injected_failure())
        return NULL;
    char *q = __real_strdup(s);
    g_live += q != NULL;
    return q;
}

void __wrap_free(void *p)
{
    g_live -= p != NULL;
    __real_free(p);
}

/* --- helpers --- */

static const char GOOD[] =
    "; deployment used by the tests\n"                      /* 1 */
    "[model]\n"                                             /* 2 */
    "path = ../tests/fixtures/llava-tiny        ; rel\n"    /* 3 */
    "\n"                                                    /* 4 */
    "[device.cpu0]\n"                                       /* 5 */
    "plugin = cpu\n"                                        /* 6 */
    "index = 0\n"                                           /* 7 */
    "pool_mb = 1024\n"                                      /* 8 */
    "threads = 2\n"                                         /* 9 */
    "\n"                                                    /* 10 */
    "[device.ocl0]\n"                                       /* 11 */
    "plugin = opencl\n"                                     /* 12 */
    "index = 3\n"                                           /* 13 */
    "pool_mb = 16777216\n"                                  /* 14 */
    "platform = Portable   ; plugin-specific\n"             /* 15 */
    "\n"                                                    /* 16 */
    "[stage.vision]\n"                                      /* 17 */
    "device = ocl0\n"                                       /* 18 */
    "[stage.language]\n"                                    /* 19 */
    "device = cpu0\n"                                       /* 20 */
    "\n"                                                    /* 21 */
    "[run]\n"                                               /* 22 */
    "image = images/cat.png\n"                              /* 23 */
    "prompt = What is in the picture?\n"                    /* 24 */
    "max_tokens = 32\n"                                     /* 25 */
    "seed = 9223372036854775807\n"                          /* 26 */
    "temperature = 0.7\n"                                   /* 27 */
    "top_k = 40\n"                                          /* 28 */
    "top_p = 0.95\n";                                       /* 29 */

/* Every field of GOOD; dir is the folder part of the name it was parsed under. */
static void check_good(const struct mmrt_conf *c, const char *name, const char *dir)
{
    char want[4096];
    assert_string_equal(c->path, name);
    assert_int_equal(c->model_line, 2);
    snprintf(want, sizeof want, "%s../tests/fixtures/llava-tiny", dir);
    assert_string_equal(c->model_path, want);
    assert_int_equal(c->model_path_line, 3);

    assert_int_equal(c->n_devices, 2);
    const struct mmrt_conf_device *d = &c->devices[0];
    assert_string_equal(d->name, "cpu0");
    assert_int_equal(d->line, 5);
    assert_string_equal(d->plugin, "cpu");
    assert_int_equal(d->plugin_line, 6);
    assert_int_equal(d->index, 0);
    assert_int_equal(d->index_line, 7);
    assert_int_equal(d->pool_mb, 1024);
    assert_int_equal(d->pool_mb_line, 8);
    assert_int_equal(d->n_options, 1);
    assert_string_equal(d->options[0].key, "threads");
    assert_string_equal(d->options[0].value, "2");
    assert_int_equal(d->options[0].line, 9);

    d = &c->devices[1];
    assert_string_equal(d->name, "ocl0");
    assert_int_equal(d->line, 11);
    assert_string_equal(d->plugin, "opencl");
    assert_int_equal(d->plugin_line, 12);
    assert_int_equal(d->index, 3);
    assert_int_equal(d->index_line, 13);
    assert_int_equal(d->pool_mb, 16777216);
    assert_int_equal(d->pool_mb_line, 14);
    assert_int_equal(d->n_options, 1);
    assert_string_equal(d->options[0].key, "platform");
    assert_string_equal(d->options[0].value, "Portable");
    assert_int_equal(d->options[0].line, 15);

    assert_true(c->vision.present);
    assert_int_equal(c->vision.section_line, 17);
    assert_string_equal(c->vision.device, "ocl0");
    assert_int_equal(c->vision.line, 18);
    assert_true(c->language.present);
    assert_int_equal(c->language.section_line, 19);
    assert_string_equal(c->language.device, "cpu0");
    assert_int_equal(c->language.line, 20);

    const struct mmrt_conf_run *r = &c->run;
    assert_int_equal(r->line, 22);
    snprintf(want, sizeof want, "%simages/cat.png", dir);
    assert_string_equal(r->image, want);
    assert_int_equal(r->image_line, 23);
    assert_string_equal(r->prompt, "What is in the picture?");
    assert_int_equal(r->prompt_line, 24);
    assert_int_equal(r->max_tokens, 32);
    assert_int_equal(r->max_tokens_line, 25);
    assert_true(r->seed == UINT64_C(9223372036854775807));
    assert_int_equal(r->seed_line, 26);
    assert_true(r->temperature == 0.7);
    assert_int_equal(r->temperature_line, 27);
    assert_int_equal(r->top_k, 40);
    assert_int_equal(r->top_k_line, 28);
    assert_true(r->top_p == 0.95);
    assert_int_equal(r->top_p_line, 29);

    assert_ptr_equal(mmrt_conf_find_device(c, "ocl0"), &c->devices[1]);
    assert_ptr_equal(mmrt_conf_find_option(&c->devices[1], "platform"),
                     &c->devices[1].options[0]);
}

static struct mmrt_conf *parse_ok(const char *text, size_t len, const char *name)
{
    struct mmrt_conf *c = NULL;
    struct mmrt_error err = {0};
    mmrt_status st = mmrt_conf_parse(text, len, name, &c, &err);
    if (st != MMRT_OK)
        fail_msg("unexpected failure %s: %s", mmrt_status_name(st), err.msg);
    assert_non_null(c);
    return c;
}

/* Parses text, expects failure with exactly `msg`, and checks *out was left alone. */
static void expect_error(const char *text, size_t len, mmrt_status want, const char *msg)
{
    struct mmrt_conf sentinel;
    struct mmrt_conf *c = &sentinel;
    struct mmrt_error err = {0};
    mmrt_status st = mmrt_conf_parse(text, len, "t.ini", &c, &err);
    if (st != want || strcmp(err.msg, msg) != 0)
        fail_msg("input:\n%s\nwant %s \"%s\"\ngot  %s \"%s\"", text, mmrt_status_name(want), msg,
                 mmrt_status_name(st), err.msg);
    assert_int_equal(err.status, want);
    assert_ptr_equal(c, &sentinel);
}

/* printf into a fresh block; the tests' strings stay far below 16 KiB. */
static char *xasprintf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static char *xasprintf(const char *fmt, ...)
{
    enum { CAP = 16384 };
    char *s = malloc(CAP);
    assert_non_null(s);
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(s, CAP, fmt, ap);
    va_end(ap);
    assert_true(n >= 0 && n < CAP);
    return s;
}

/* Replaces every "\n" with "\r\n". */
static char *to_crlf(const char *s)
{
    size_t n = strlen(s), lf = 0;
    for (size_t i = 0; i < n; i++)
        lf += s[i] == '\n';
    char *d = malloc(n + lf + 1), *o = d;
    assert_non_null(d);
    for (size_t i = 0; i < n; i++) {
        if (s[i] == '\n')
            *o++ = '\r';
        *o++ = s[i];
    }
    *o = '\0';
    return d;
}

static void write_file(const char *path, const char *data, size_t n)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(data, 1, n, f), n);
    assert_int_equal(fclose(f), 0);
}

/* --- tests --- */

static void test_good_file(void **state)
{
    (void)state;
    struct mmrt_conf *c = parse_ok(GOOD, strlen(GOOD), "conf/sub/deploy.ini");
    check_good(c, "conf/sub/deploy.ini", "conf/sub/");
    mmrt_conf_destroy(c);
}

static void test_defaults_and_paths(void **state)
{
    (void)state;
    /* No folder in the name: relative paths stay as written; absolute ones always do. */
    const char *text = "[device.d]\nplugin = cpu\n[run]\nimage = /abs/cat.png\n"
                       "[model]\npath = models/tiny\n";
    struct mmrt_conf *c = parse_ok(text, strlen(text), "deploy.ini");
    assert_string_equal(c->model_path, "models/tiny");
    assert_string_equal(c->run.image, "/abs/cat.png");
    mmrt_conf_destroy(c);

    c = parse_ok(text, strlen(text), "/etc/mmrt/deploy.ini");
    assert_string_equal(c->model_path, "/etc/mmrt/models/tiny");
    assert_string_equal(c->run.image, "/abs/cat.png");
    assert_null(c->run.json_schema);
    mmrt_conf_destroy(c);

    /* [run] json_schema: a file, resolved as the image is. */
    text = "[device.d]\nplugin = cpu\n[run]\njson_schema = schemas/item.json\n";
    c = parse_ok(text, strlen(text), "/etc/mmrt/deploy.ini");
    assert_string_equal(c->run.json_schema, "/etc/mmrt/schemas/item.json");
    assert_int_equal(c->run.json_schema_line, 4);
    mmrt_conf_destroy(c);

    /* A file with only a device: every default, every line 0, no stages, no model. */
    text = "[device.d]\nplugin = cpu\n";
    c = parse_ok(text, strlen(text), "deploy.ini");
    assert_int_equal(c->n_devices, 1);
    assert_int_equal(c->devices[0].index, 0);
    assert_int_equal(c->devices[0].index_line, 0);
    assert_int_equal(c->devices[0].pool_mb, 0); /* auto */
    assert_int_equal(c->devices[0].pool_mb_line, 0);
    assert_int_equal(c->devices[0].level1, MMRT_LEVEL1_DEFAULT);
    assert_int_equal(c->devices[0].level1_line, 0);
    assert_int_equal(c->devices[0].n_options, 0);
    assert_null(c->devices[0].options);
    assert_int_equal(c->model_line, 0);
    assert_null(c->model_path);
    assert_int_equal(c->max_image_tokens, 0);
    assert_int_equal(c->max_image_tokens_line, 0);
    assert_int_equal(c->oversize_images, MMRT_OVERSIZE_REFUSE);
    assert_int_equal(c->oversize_images_line, 0);
    assert_false(c->vision.present);
    assert_null(c->vision.device);
    assert_false(c->language.present);
    assert_int_equal(c->run.line, 0);
    assert_null(c->run.image);
    assert_null(c->run.prompt);
    assert_int_equal(c->run.max_tokens, 64);
    assert_int_equal(c->run.max_tokens_line, 0);
    assert_true(c->run.seed == 0);
    assert_true(c->run.temperature == 0.0);
    assert_int_equal(c->run.top_k, 0);
    assert_true(c->run.top_p == 1.0);
    assert_null(mmrt_conf_find_device(c, "D"));
    assert_null(mmrt_conf_find_device(NULL, "d"));
    assert_null(mmrt_conf_find_option(&c->devices[0], "threads"));
    assert_null(mmrt_conf_find_option(NULL, "threads"));
    mmrt_conf_destroy(c);
    mmrt_conf_destroy(NULL);

    /* Stages may name a device defined further down; edge values of every number. */
    text = "[stage.language]\ndevice = late\n[run]\nmax_tokens = 1000000\nseed = 0\n"
           "temperature = 100\ntop_k = 1000000\ntop_p = 1\n[device.late]\nplugin = cpu\n"
           "index = 1023\npool_mb = 1\n";
    c = parse_ok(text, strlen(text), "t.ini");
    assert_false(c->vision.present);
    assert_true(c->language.present);
    assert_int_equal(c->run.max_tokens, 1000000);
    assert_true(c->run.temperature == 100.0);
    assert_int_equal(c->run.top_k, 1000000);
    assert_true(c->run.top_p == 1.0);
    assert_int_equal(c->devices[0].index, 1023);
    assert_int_equal(c->devices[0].pool_mb, 1);
    mmrt_conf_destroy(c);

    /* pool_mb = auto is the default spelled out; level1 on and off. */
    text = "[device.a]\nplugin = cpu\npool_mb = auto\nlevel1 = off\n"
           "[device.b]\nplugin = cpu\nlevel1 = on\n";
    c = parse_ok(text, strlen(text), "t.ini");
    assert_int_equal(c->devices[0].pool_mb, 0);
    assert_int_equal(c->devices[0].pool_mb_line, 3);
    assert_int_equal(c->devices[0].level1, MMRT_LEVEL1_OFF);
    assert_int_equal(c->devices[0].level1_line, 4);
    assert_int_equal(c->devices[1].level1, MMRT_LEVEL1_ON);
    assert_int_equal(c->devices[1].level1_line, 7);
    mmrt_conf_destroy(c);

    /* Other accepted number spellings. */
    text = "[device.d]\nplugin = cpu\nindex = 007\n[run]\ntemperature = 1.\ntop_p = .5\n"
           "max_tokens = 2\ntop_k = -0\n";
    c = parse_ok(text, strlen(text), "t.ini");
    assert_int_equal(c->devices[0].index, 7);
    assert_true(c->run.temperature == 1.0);
    assert_true(c->run.top_p == 0.5);
    mmrt_conf_destroy(c);
    text = "[device.d]\nplugin = cpu\n[run]\ntemperature = 2.5e-1\ntop_p = 5E-1\n";
    c = parse_ok(text, strlen(text), "t.ini");
    assert_true(c->run.temperature == 0.25);
    assert_true(c->run.top_p == 0.5);
    /* The penalties: absent is off (0), negative presence and frequency are allowed. */
    assert_true(c->run.repetition_penalty == 0 && c->run.presence_penalty == 0);
    mmrt_conf_destroy(c);
    text = "[device.d]\nplugin = cpu\n[run]\nrepetition_penalty = 1.05\n"
           "presence_penalty = -2\nfrequency_penalty = 0.5\n";
    c = parse_ok(text, strlen(text), "t.ini");
    assert_true(c->run.repetition_penalty == 1.05 && c->run.repetition_penalty_line == 4);
    assert_true(c->run.presence_penalty == -2 && c->run.presence_penalty_line == 5);
    assert_true(c->run.frequency_penalty == 0.5 && c->run.frequency_penalty_line == 6);
    assert_int_equal(c->run.response_format, MMRT_RESPONSE_TEXT);
    mmrt_conf_destroy(c);
    text = "[device.d]\nplugin = cpu\n[run]\nresponse_format = json_object\n";
    c = parse_ok(text, strlen(text), "t.ini");
    assert_int_equal(c->run.response_format, MMRT_RESPONSE_JSON_OBJECT);
    assert_int_equal(c->run.response_format_line, 4);
    mmrt_conf_destroy(c);
    /* -0 is zero, stored without its sign (a sampler may test signbit). */
    text = "[device.d]\nplugin = cpu\n[run]\ntemperature = -0.0\ntop_p = 5E-1\n";
    c = parse_ok(text, strlen(text), "t.ini");
    assert_true(c->run.temperature == 0.0 && !signbit(c->run.temperature));
    assert_true(c->run.top_p == 0.5);
    mmrt_conf_destroy(c);
}

/* [model] max_image_tokens, oversize_images, exif_orientation, image_kv_* and chat_template:
 * values, lines, and the defaults when only `path` is given. */
static void test_model_image_budget(void **state)
{
    (void)state;
    const char *text = "[model]\npath = m\nmax_image_tokens = 4096 ; all images\n"
                       "oversize_images = downscale\n[device.d]\nplugin = cpu\n";
    struct mmrt_conf *c = parse_ok(text, strlen(text), "t.ini");
    assert_int_equal(c->max_image_tokens, 4096);
    assert_int_equal(c->max_image_tokens_line, 3);
    assert_int_equal(c->oversize_images, MMRT_OVERSIZE_DOWNSCALE);
    assert_int_equal(c->oversize_images_line, 4);
    mmrt_conf_destroy(c);

    text = "[model]\noversize_images = \"refuse\"\nmax_image_tokens = 2147483647\npath = m\n"
           "[device.d]\nplugin = cpu\n";
    c = parse_ok(text, strlen(text), "t.ini");
    assert_int_equal(c->max_image_tokens, 2147483647);
    assert_int_equal(c->max_image_tokens_line, 3);
    assert_int_equal(c->oversize_images, MMRT_OVERSIZE_REFUSE);
    assert_int_equal(c->oversize_images_line, 2);
    mmrt_conf_destroy(c);

    /* 0 is the explicit "no limit beyond the context". */
    text = "[model]\npath = m\nmax_image_tokens = 0\n[device.d]\nplugin = cpu\n";
    c = parse_ok(text, strlen(text), "t.ini");
    assert_int_equal(c->max_image_tokens, 0);
    assert_int_equal(c->max_image_tokens_line, 3);
    assert_int_equal(c->oversize_images, MMRT_OVERSIZE_REFUSE);
    assert_int_equal(c->exif_orientation, MMRT_EXIF_IGNORE); /* the default: as transformers */
    assert_int_equal(c->exif_orientation_line, 0);
    mmrt_conf_destroy(c);

    text = "[model]\npath = m\nexif_orientation = apply\n[device.d]\nplugin = cpu\n";
    c = parse_ok(text, strlen(text), "t.ini");
    assert_int_equal(c->exif_orientation, MMRT_EXIF_APPLY);
    assert_int_equal(c->exif_orientation_line, 3);
    mmrt_conf_destroy(c);
    text = "[model]\npath = m\nexif_orientation = \"ignore\"\n[device.d]\nplugin = cpu\n";
    c = parse_ok(text, strlen(text), "t.ini");
    assert_int_equal(c->exif_orientation, MMRT_EXIF_IGNORE);
    assert_int_equal(c->exif_orientation_line, 3);
    assert_true(c->image_kv_keep == 0); /* absent: off */
    assert_int_equal(c->image_kv_policy, MMRT_IMAGE_KV_DEFAULT);
    mmrt_conf_destroy(c);
    text = "[model]\npath = m\nimage_kv_keep = 0.25\nimage_kv_policy = key_norm_low\n"
           "[device.d]\nplugin = cpu\n";
    c = parse_ok(text, strlen(text), "t.ini");
    assert_true(c->image_kv_keep == 0.25);
    assert_int_equal(c->image_kv_keep_line, 3);
    assert_int_equal(c->image_kv_policy, MMRT_IMAGE_KV_KEY_NORM_LOW);
    assert_int_equal(c->image_kv_policy_line, 4);
    assert_int_equal(c->chat_template, MMRT_CHAT_TEMPLATE_AUTO); /* absent: the checkpoint's */
    assert_int_equal(c->chat_template_line, 0);
    mmrt_conf_destroy(c);
    text = "[model]\npath = m\nchat_template = mistral\n[device.d]\nplugin = cpu\n";
    c = parse_ok(text, strlen(text), "t.ini");
    assert_int_equal(c->chat_template, MMRT_CHAT_TEMPLATE_MISTRAL);
    assert_int_equal(c->chat_template_line, 3);
    mmrt_conf_destroy(c);
    text = "[model]\npath = m\nchat_template = \"llava\"\n[device.d]\nplugin = cpu\n";
    c = parse_ok(text, strlen(text), "t.ini");
    assert_int_equal(c->chat_template, MMRT_CHAT_TEMPLATE_LLAVA);
    mmrt_conf_destroy(c);
    text = "[model]\npath = m\nchat_template = auto\n[device.d]\nplugin = cpu\n";
    c = parse_ok(text, strlen(text), "t.ini");
    assert_int_equal(c->chat_template, MMRT_CHAT_TEMPLATE_AUTO);
    assert_int_equal(c->chat_template_line, 3);
    mmrt_conf_destroy(c);
}

/* [model] max_kv_tokens and kv_page_tokens: values, lines, defaults. */
static void test_model_kv_keys(void **state)
{
    (void)state;
    const char *text = "[model]\npath = m\nmax_kv_tokens = 8192\nkv_page_tokens = 32\n"
                       "kv_dtype = f16\n[device.d]\nplugin = cpu\n";
    struct mmrt_conf *c = parse_ok(text, strlen(text), "t.ini");
    assert_int_equal(c->kv_dtype, MMRT_KV_F16);
    assert_int_equal(c->kv_dtype_line, 5);
    assert_int_equal(c->max_kv_tokens, 8192);
    assert_int_equal(c->max_kv_tokens_line, 3);
    assert_int_equal(c->kv_page_tokens, 32);
    assert_int_equal(c->kv_page_tokens_line, 4);
    assert_int_equal(c->weights, MMRT_WEIGHTS_CHECKPOINT); /* the default */
    mmrt_conf_destroy(c);
    const char *fp8 = "[model]\npath = m\nkv_dtype = fp8\n[device.d]\nplugin = cpu\n";
    c = parse_ok(fp8, strlen(fp8), "t.ini");
    assert_int_equal(c->kv_dtype, MMRT_KV_FP8);
    assert_int_equal(c->kv_dtype_line, 3);
    mmrt_conf_destroy(c);
    const char *i8 = "[model]\npath = m\nkv_dtype = int8\n[device.d]\nplugin = cpu\n";
    c = parse_ok(i8, strlen(i8), "t.ini");
    assert_int_equal(c->kv_dtype, MMRT_KV_INT8);
    mmrt_conf_destroy(c);
    static const struct { const char *v; enum mmrt_weight_format f; } formats[] = {
        { "checkpoint", MMRT_WEIGHTS_CHECKPOINT }, { "int8", MMRT_WEIGHTS_INT8 },
        { "int4", MMRT_WEIGHTS_INT4 },             { "int4-g128", MMRT_WEIGHTS_INT4 },
        { "int4-g64", MMRT_WEIGHTS_INT4_G64 },     { "int4-g32", MMRT_WEIGHTS_INT4_G32 },
    };
    for (size_t i = 0; i < sizeof formats / sizeof formats[0]; i++) {
        char t[160];
        snprintf(t, sizeof t, "[model]\npath = m\nweights = %s\n[device.d]\nplugin = cpu\n",
                 formats[i].v);
        c = parse_ok(t, strlen(t), "t.ini");
        assert_int_equal(c->weights, formats[i].f);
        assert_int_equal(c->weights_line, 3);
        mmrt_conf_destroy(c);
    }
    text = "[model]\npath = m\nkv_page_tokens = 1\n[device.d]\nplugin = cpu\n";
    c = parse_ok(text, strlen(text), "t.ini");
    assert_int_equal(c->kv_page_tokens, 1);
    assert_int_equal(c->max_kv_tokens, 0);
    assert_int_equal(c->max_kv_tokens_line, 0);
    mmrt_conf_destroy(c);
}

static void test_scheduler_keys(void **state)
{
    (void)state;
    const char *text = "[device.d]\nplugin = cpu\n[scheduler]\nmax_batch = 8\n"
                       "prefill_chunk = 256\nstep_tokens = 300\nvision_batch = 5\n"
                       "draft_tokens = 3\ndraft_rows = 6\n";
    struct mmrt_conf *c = parse_ok(text, strlen(text), "t.ini");
    assert_int_equal(c->scheduler.line, 3);
    assert_int_equal(c->scheduler.max_batch, 8);
    assert_int_equal(c->scheduler.max_batch_line, 4);
    assert_int_equal(c->scheduler.prefill_chunk, 256);
    assert_int_equal(c->scheduler.prefill_chunk_line, 5);
    assert_int_equal(c->scheduler.step_tokens, 300);
    assert_int_equal(c->scheduler.step_tokens_line, 6);
    assert_int_equal(c->scheduler.vision_batch, 5);
    assert_int_equal(c->scheduler.vision_batch_line, 7);
    assert_int_equal(c->scheduler.draft_tokens, 3);
    assert_int_equal(c->scheduler.draft_tokens_line, 8);
    assert_int_equal(c->scheduler.draft_rows, 6);
    assert_int_equal(c->scheduler.draft_rows_line, 9);
    mmrt_conf_destroy(c);
    text = "[device.d]\nplugin = cpu\n";
    c = parse_ok(text, strlen(text), "t.ini");
    assert_int_equal(c->scheduler.max_batch, 0); /* the engine's default */
    assert_int_equal(c->scheduler.line, 0);
    mmrt_conf_destroy(c);
}

/* [cache] in struct mmrt_config's terms: absent = 0 (the default), vision_entries = 0 (off)
 * = negative. */
static void test_cache_keys(void **state)
{
    (void)state;
    const char *text = "[device.d]\nplugin = cpu\n[cache]\nvision_entries = 16\n"
                       "vision_mb = 64\n";
    struct mmrt_conf *c = parse_ok(text, strlen(text), "t.ini");
    assert_int_equal(c->cache.line, 3);
    assert_int_equal(c->cache.vision_entries, 16);
    assert_int_equal(c->cache.vision_entries_line, 4);
    assert_int_equal(c->cache.vision_mb, 64);
    assert_int_equal(c->cache.vision_mb_line, 5);
    mmrt_conf_destroy(c);
    text = "[device.d]\nplugin = cpu\n[cache]\nvision_entries = 0\n";
    c = parse_ok(text, strlen(text), "t.ini");
    assert_true(c->cache.vision_entries < 0); /* off */
    assert_int_equal(c->cache.vision_mb, 0);
    assert_int_equal(c->cache.vision_mb_line, 0);
    mmrt_conf_destroy(c);
    text = "[device.d]\nplugin = cpu\n";
    c = parse_ok(text, strlen(text), "t.ini");
    assert_int_equal(c->cache.line, 0);
    assert_int_equal(c->cache.vision_entries, 0); /* the default */
    assert_int_equal(c->cache.vision_mb, 0);
    mmrt_conf_destroy(c);
    text = "[device.d]\nplugin = cpu\n[cache]\nvision_entries = 16777216\n"
           "vision_mb = 16777216\n";
    c = parse_ok(text, strlen(text), "t.ini");
    assert_int_equal(c->cache.vision_entries, 16777216);
    assert_int_equal(c->cache.vision_mb, 16777216);
    mmrt_conf_destroy(c);
}

struct error_case {
    const char *text;
    mmrt_status status;
    const char *msg;
};

#define D "[device.d]\nplugin = cpu\n" /* lines 1-2 */
#define RUN(kv) D "[run]\n" kv "\n"    /* kv on line 4 */

#define SCHED(kv) D "[scheduler]\n" kv "\n" /* kv on line 4 */
#define CACHE(kv) D "[cache]\n" kv "\n"     /* kv on line 4 */

static const struct error_case ERRORS[] = {
    {"[model]\npath = m\nkv_dtype = int4\n" D, MMRT_ERR_CONFIG,
     "t.ini:3: [model] kv_dtype = 'int4': expected 'f32', 'f16', 'fp8' or 'int8'"},
    {"[model]\npath = m\nweights = int3\n" D, MMRT_ERR_CONFIG,
     "t.ini:3: [model] weights = 'int3': expected 'checkpoint', 'int8', 'int4' (groups of 128), "
     "'int4-g64' or 'int4-g32'"},
    {"[model]\npath = m\nweights = int8\nweights = int4\n" D, MMRT_ERR_CONFIG,
     "t.ini:4: [model] duplicate key 'weights' (first on line 3)"},
    /* [scheduler] */
    {SCHED("max_batch = 0"), MMRT_ERR_CONFIG, "t.ini:4: [scheduler] max_batch = '0': outside [1, 32]"},
    {SCHED("max_batch = 33"), MMRT_ERR_CONFIG, "t.ini:4: [scheduler] max_batch = '33': outside [1, 32]"},
    {SCHED("prefill_chunk = -4"), MMRT_ERR_CONFIG, "t.ini:4: [scheduler] prefill_chunk = '-4': outside [1, 1048576]"},
    {SCHED("step_tokens = x"), MMRT_ERR_CONFIG, "t.ini:4: [scheduler] step_tokens = 'x': not a decimal integer"},
    {SCHED("vision_batch = 0"), MMRT_ERR_CONFIG, "t.ini:4: [scheduler] vision_batch = '0': outside [1, 32]"},
    {SCHED("vision_batch = 33"), MMRT_ERR_CONFIG, "t.ini:4: [scheduler] vision_batch = '33': outside [1, 32]"},
    {SCHED("draft_tokens = 32"), MMRT_ERR_CONFIG, "t.ini:4: [scheduler] draft_tokens = '32': outside [0, 31]"},
    {SCHED("draft_tokens = -1"), MMRT_ERR_CONFIG, "t.ini:4: [scheduler] draft_tokens = '-1': outside [0, 31]"},
    {SCHED("draft_rows = 1"), MMRT_ERR_CONFIG, "t.ini:4: [scheduler] draft_rows = '1': outside [2, 32]"},
    {SCHED("group = none"), MMRT_ERR_CONFIG, "t.ini:4: [scheduler] unknown key 'group' (value 'none')"},
    {D "[scheduler]\n[scheduler]\n", MMRT_ERR_CONFIG,
     "t.ini:4: duplicate section [scheduler] (first on line 3)"},
    /* [cache] */
    {CACHE("vision_entries = -1"), MMRT_ERR_CONFIG,
     "t.ini:4: [cache] vision_entries = '-1': outside [0, 16777216]"},
    {CACHE("vision_entries = 16777217"), MMRT_ERR_CONFIG,
     "t.ini:4: [cache] vision_entries = '16777217': outside [0, 16777216]"},
    {CACHE("vision_entries = off"), MMRT_ERR_CONFIG,
     "t.ini:4: [cache] vision_entries = 'off': not a decimal integer"},
    {CACHE("vision_mb = 0"), MMRT_ERR_CONFIG,
     "t.ini:4: [cache] vision_mb = '0': outside [1, 16777216]"},
    {CACHE("vision_mb = 1.5"), MMRT_ERR_CONFIG,
     "t.ini:4: [cache] vision_mb = '1.5': not a decimal integer"},
    {CACHE("vision_mb = 8\nvision_mb = 8"), MMRT_ERR_CONFIG,
     "t.ini:5: [cache] duplicate key 'vision_mb' (first on line 4)"},
    {CACHE("entries = 4"), MMRT_ERR_CONFIG, "t.ini:4: [cache] unknown key 'entries' (value '4')"},
    {D "[cache]\n[cache]\n", MMRT_ERR_CONFIG,
     "t.ini:4: duplicate section [cache] (first on line 3)"},
    /* sections */
    {D "[foo]\n", MMRT_ERR_CONFIG, "t.ini:3: unknown section [foo]; expected [model], "
     "[device.NAME], [stage.vision], [stage.language], [scheduler], [cache], [server] or [run]"},
    {D "[Model]\n", MMRT_ERR_CONFIG, "t.ini:3: unknown section [Model]; expected [model], "
     "[device.NAME], [stage.vision], [stage.language], [scheduler], [cache], [server] or [run]"},
    {D "[stage.audio]\n", MMRT_ERR_CONFIG, "t.ini:3: unknown section [stage.audio]; expected "
     "[model], [device.NAME], [stage.vision], [stage.language], [scheduler], [cache], "
     "[server] or [run]"},
    {D "[run]\n[run]\n", MMRT_ERR_CONFIG, "t.ini:4: duplicate section [run] (first on line 3)"},
    {"[model]\npath = m\n" D "[model]\n", MMRT_ERR_CONFIG,
     "t.ini:5: duplicate section [model] (first on line 1)"},
    {D "[device.d]\nplugin = cpu\n", MMRT_ERR_CONFIG,
     "t.ini:3: duplicate section [device.d] (first on line 1)"},
    {D "[stage.vision]\ndevice = d\n[stage.vision]\ndevice = d\n", MMRT_ERR_CONFIG,
     "t.ini:5: duplicate section [stage.vision] (first on line 3)"},
    {"[device.]\nplugin = cpu\n", MMRT_ERR_CONFIG, "t.ini:1: invalid device name '' in "
     "[device.NAME]: use 1..31 letters, digits, '_' or '-'"},
    {"[device.a/b]\nplugin = cpu\n", MMRT_ERR_CONFIG, "t.ini:1: invalid device name 'a/b' in "
     "[device.NAME]: use 1..31 letters, digits, '_' or '-'"},
    {"[device.abcdefghijklmnopqrstuvwxyz012345]\n", MMRT_ERR_CONFIG,
     "t.ini:1: invalid device name 'abcdefghijklmnopqrstuvwxyz012345' in [device.NAME]: use "
     "1..31 letters, digits, '_' or '-'"},
    {D "[run\nseed = 1\n", MMRT_ERR_CONFIG, "t.ini:3: section header without closing ']'"},
    {D "[run] seed = 1\n", MMRT_ERR_CONFIG, "t.ini:3: unexpected text after section header [run]"},
    {D "[run] # hash is no inline comment\n", MMRT_ERR_CONFIG,
     "t.ini:3: unexpected text after section header [run]"},
    /* keys */
    {"plugin = cpu\n" D, MMRT_ERR_CONFIG, "t.ini:1: key 'plugin' outside any section"},
    {"[model]\npath = m\ncolour = red\n" D, MMRT_ERR_CONFIG,
     "t.ini:3: [model] unknown key 'colour' (value 'red')"},
    {D "[stage.vision]\ndevice = d\nplugin = x\n", MMRT_ERR_CONFIG,
     "t.ini:5: [stage.vision] unknown key 'plugin' (value 'x')"},
    {RUN("foo = bar"), MMRT_ERR_CONFIG, "t.ini:4: [run] unknown key 'foo' (value 'bar')"},
    {RUN("Seed = 1"), MMRT_ERR_CONFIG, "t.ini:4: [run] unknown key 'Seed' (value '1')"},
    {RUN("= x"), MMRT_ERR_CONFIG, "t.ini:4: [run] missing key name before '='"},
    {D "[run]\nseed = 1\nseed = 2\n", MMRT_ERR_CONFIG,
     "t.ini:5: [run] duplicate key 'seed' (first on line 4)"},
    {D "[run]\nprompt = a\nprompt = b\n", MMRT_ERR_CONFIG,
     "t.ini:5: [run] duplicate key 'prompt' (first on line 4)"},
    {D "plugin = cuda\n", MMRT_ERR_CONFIG,
     "t.ini:3: [device.d] duplicate key 'plugin' (first on line 2)"},
    {D "threads = 2\nthreads = 3\n", MMRT_ERR_CONFIG,
     "t.ini:4: [device.d] duplicate key 'threads' (first on line 3)"},
    {"[model]\npath = a\npath = b\n" D, MMRT_ERR_CONFIG,
     "t.ini:3: [model] duplicate key 'path' (first on line 2)"},
    {D "[stage.language]\ndevice = d\ndevice = d\n", MMRT_ERR_CONFIG,
     "t.ini:5: [stage.language] duplicate key 'device' (first on line 4)"},
    {D "my key = x\n", MMRT_ERR_CONFIG, "t.ini:3: [device.d] invalid option key 'my key' "
     "(1..63 letters, digits, '_', '.' or '-')"},
    {D "plugin2/x = 1\n", MMRT_ERR_CONFIG, "t.ini:3: [device.d] invalid option key "
     "'plugin2/x' (1..63 letters, digits, '_', '.' or '-')"},
    /* empty and missing required values */
    {"[device.d]\nplugin =\n", MMRT_ERR_CONFIG, "t.ini:2: [device.d] plugin: empty value"},
    {"[model]\npath = \"\"\n" D, MMRT_ERR_CONFIG, "t.ini:2: [model] path: empty value"},
    {RUN("prompt =   ; only a comment"), MMRT_ERR_CONFIG, "t.ini:4: [run] prompt: empty value"},
    {RUN("image ="), MMRT_ERR_CONFIG, "t.ini:4: [run] image: empty value"},
    {RUN("seed ="), MMRT_ERR_CONFIG, "t.ini:4: [run] seed: empty value"},
    {RUN("top_p ="), MMRT_ERR_CONFIG, "t.ini:4: [run] top_p: empty value"},
    {D "[stage.vision]\ndevice =\n", MMRT_ERR_CONFIG,
     "t.ini:4: [stage.vision] device: empty value"},
    {"[model]\n\n" D, MMRT_ERR_CONFIG, "t.ini:1: [model] missing required key 'path'"},
    {"[device.d]\nindex = 1\n", MMRT_ERR_CONFIG,
     "t.ini:1: [device.d] missing required key 'plugin'"},
    {"[device.a]\nplugin = cpu\n[device.b]\n[run]\n", MMRT_ERR_CONFIG,
     "t.ini:3: [device.b] missing required key 'plugin'"},
    {D "[stage.language]\n", MMRT_ERR_CONFIG,
     "t.ini:3: [stage.language] missing required key 'device'"},
    {D "[stage.vision]\n; device = d\n[run]\n", MMRT_ERR_CONFIG,
     "t.ini:3: [stage.vision] missing required key 'device'"},
    {"[stage.vision]\ndevice = gpu9\n" D, MMRT_ERR_CONFIG,
     "t.ini:2: [stage.vision] device = 'gpu9': no [device.gpu9] section"},
    {D "[stage.language]\ndevice = x\n[stage.vision]\ndevice = y\n", MMRT_ERR_CONFIG,
     "t.ini:4: [stage.language] device = 'x': no [device.x] section"},
    {D "[stage.vision]\ndevice = D\n", MMRT_ERR_CONFIG,
     "t.ini:4: [stage.vision] device = 'D': no [device.D] section"},
    {"", MMRT_ERR_CONFIG,
     "t.ini:1: end of file: no [device.NAME] section; at least one device is required"},
    {"; comments only\n\n# more\n", MMRT_ERR_CONFIG,
     "t.ini:3: end of file: no [device.NAME] section; at least one device is required"},
    {"[model]\npath = m\n", MMRT_ERR_CONFIG,
     "t.ini:2: end of file: no [device.NAME] section; at least one device is required"},
    /* [model] image-token budget */
#define M(kv) "[model]\npath = m\n" kv "\n" D /* kv on line 3 */
    {M("max_image_tokens = -1"), MMRT_ERR_CONFIG,
     "t.ini:3: [model] max_image_tokens = '-1': outside [0, 2147483647]"},
    {M("max_image_tokens = 2147483648"), MMRT_ERR_CONFIG,
     "t.ini:3: [model] max_image_tokens = '2147483648': outside [0, 2147483647]"},
    {M("max_image_tokens = 1k"), MMRT_ERR_CONFIG,
     "t.ini:3: [model] max_image_tokens = '1k': not a decimal integer"},
    {M("max_image_tokens = 1e3"), MMRT_ERR_CONFIG,
     "t.ini:3: [model] max_image_tokens = '1e3': not a decimal integer"},
    {M("max_image_tokens ="), MMRT_ERR_CONFIG, "t.ini:3: [model] max_image_tokens: empty value"},
    {M("max_image_tokens = 1\nmax_image_tokens = 2"), MMRT_ERR_CONFIG,
     "t.ini:4: [model] duplicate key 'max_image_tokens' (first on line 3)"},
    {M("kv_page_tokens = 12"), MMRT_ERR_CONFIG,
     "t.ini:3: [model] kv_page_tokens = 12: must be a power of two"},
    {M("kv_page_tokens = 0"), MMRT_ERR_CONFIG,
     "t.ini:3: [model] kv_page_tokens = '0': outside [1, 4096]"},
    {M("kv_page_tokens = 8192"), MMRT_ERR_CONFIG,
     "t.ini:3: [model] kv_page_tokens = '8192': outside [1, 4096]"},
    {M("max_kv_tokens = -1"), MMRT_ERR_CONFIG,
     "t.ini:3: [model] max_kv_tokens = '-1': outside [0, 2147483647]"},
    {M("oversize_images = shrink"), MMRT_ERR_CONFIG,
     "t.ini:3: [model] oversize_images = 'shrink': expected 'refuse' or 'downscale'"},
    {M("oversize_images = Downscale"), MMRT_ERR_CONFIG,
     "t.ini:3: [model] oversize_images = 'Downscale': expected 'refuse' or 'downscale'"},
    {M("oversize_images = 1"), MMRT_ERR_CONFIG,
     "t.ini:3: [model] oversize_images = '1': expected 'refuse' or 'downscale'"},
    {M("oversize_images = \"\""), MMRT_ERR_CONFIG, "t.ini:3: [model] oversize_images: empty value"},
    {M("exif_orientation = rotate"), MMRT_ERR_CONFIG,
     "t.ini:3: [model] exif_orientation = 'rotate': expected 'ignore' or 'apply'"},
    {M("exif_orientation = Apply"), MMRT_ERR_CONFIG,
     "t.ini:3: [model] exif_orientation = 'Apply': expected 'ignore' or 'apply'"},
    {M("exif_orientation = 1"), MMRT_ERR_CONFIG,
     "t.ini:3: [model] exif_orientation = '1': expected 'ignore' or 'apply'"},
    {M("exif_orientation = apply\nexif_orientation = ignore"), MMRT_ERR_CONFIG,
     "t.ini:4: [model] duplicate key 'exif_orientation' (first on line 3)"},
    {M("chat_template = vicuna"), MMRT_ERR_CONFIG,
     "t.ini:3: [model] chat_template = 'vicuna': expected 'auto', 'llava', 'mistral', "
     "'chatml' or 'llama3'"},
    {M("chat_template = Mistral"), MMRT_ERR_CONFIG,
     "t.ini:3: [model] chat_template = 'Mistral': expected 'auto', 'llava', 'mistral', "
     "'chatml' or 'llama3'"},
    {M("chat_template = llava\nchat_template = mistral"), MMRT_ERR_CONFIG,
     "t.ini:4: [model] duplicate key 'chat_template' (first on line 3)"},
    {M("image_kv_keep = 0"), MMRT_ERR_CONFIG,
     "t.ini:3: [model] image_kv_keep = '0': outside (0, 1]"},
    {M("image_kv_keep = 1.5"), MMRT_ERR_CONFIG,
     "t.ini:3: [model] image_kv_keep = '1.5': outside (0, 1]"},
    {M("image_kv_keep = half"), MMRT_ERR_CONFIG,
     "t.ini:3: [model] image_kv_keep = 'half': not a decimal number"},
    {M("image_kv_policy = l2"), MMRT_ERR_CONFIG,
     "t.ini:3: [model] image_kv_policy = 'l2': expected 'key_norm_high', 'key_norm_low', "
     "'random' or 'pool2x2'"},
    {M("image_kv_policy = random\nimage_kv_policy = pool2x2"), MMRT_ERR_CONFIG,
     "t.ini:4: [model] duplicate key 'image_kv_policy' (first on line 3)"},
    {M("oversize_images = refuse\noversize_images = downscale"), MMRT_ERR_CONFIG,
     "t.ini:4: [model] duplicate key 'oversize_images' (first on line 3)"},
    {"[model]\nmax_image_tokens = 10\n" D, MMRT_ERR_CONFIG,
     "t.ini:1: [model] missing required key 'path'"},
#undef M
    /* plugin names reach the loader's file name */
    {"[device.d]\nplugin = ../evil\n", MMRT_ERR_CONFIG, "t.ini:2: [device.d] plugin = "
     "'../evil': not a plugin name (1..31 letters, digits, '_' or '-')"},
    /* integers */
    {RUN("max_tokens = 12x"), MMRT_ERR_CONFIG,
     "t.ini:4: [run] max_tokens = '12x': not a decimal integer"},
    {RUN("max_tokens = +5"), MMRT_ERR_CONFIG,
     "t.ini:4: [run] max_tokens = '+5': not a decimal integer"},
    {RUN("max_tokens = 0x10"), MMRT_ERR_CONFIG,
     "t.ini:4: [run] max_tokens = '0x10': not a decimal integer"},
    {RUN("max_tokens = 1 2"), MMRT_ERR_CONFIG,
     "t.ini:4: [run] max_tokens = '1 2': not a decimal integer"},
    {RUN("max_tokens = -"), MMRT_ERR_CONFIG,
     "t.ini:4: [run] max_tokens = '-': not a decimal integer"},
    {RUN("max_tokens = 1.0"), MMRT_ERR_CONFIG,
     "t.ini:4: [run] max_tokens = '1.0': not a decimal integer"},
    {RUN("max_tokens = 0"), MMRT_ERR_CONFIG,
     "t.ini:4: [run] max_tokens = '0': outside [1, 1000000]"},
    {RUN("max_tokens = 1000001"), MMRT_ERR_CONFIG,
     "t.ini:4: [run] max_tokens = '1000001': outside [1, 1000000]"},
    {RUN("max_tokens = 99999999999999999999999"), MMRT_ERR_CONFIG,
     "t.ini:4: [run] max_tokens = '99999999999999999999999': outside [1, 1000000]"},
    {RUN("top_k = -1"), MMRT_ERR_CONFIG, "t.ini:4: [run] top_k = '-1': outside [0, 1000000]"},
    {RUN("seed = 9223372036854775808"), MMRT_ERR_CONFIG,
     "t.ini:4: [run] seed = '9223372036854775808': outside [0, 9223372036854775807]"},
    {RUN("seed = 18446744073709551616"), MMRT_ERR_CONFIG,
     "t.ini:4: [run] seed = '18446744073709551616': outside [0, 9223372036854775807]"},
    {RUN("seed = -9223372036854775808"), MMRT_ERR_CONFIG,
     "t.ini:4: [run] seed = '-9223372036854775808': outside [0, 9223372036854775807]"},
    {D "index = 1024\n", MMRT_ERR_CONFIG, "t.ini:3: [device.d] index = '1024': outside [0, 1023]"},
    {D "index = -1\n", MMRT_ERR_CONFIG, "t.ini:3: [device.d] index = '-1': outside [0, 1023]"},
    {D "pool_mb = 0\n", MMRT_ERR_CONFIG,
     "t.ini:3: [device.d] pool_mb = '0': outside [1, 16777216]"},
    {D "pool_mb = 16777217\n", MMRT_ERR_CONFIG,
     "t.ini:3: [device.d] pool_mb = '16777217': outside [1, 16777216]"},
    {D "pool_mb = 1k\n", MMRT_ERR_CONFIG,
     "t.ini:3: [device.d] pool_mb = '1k': not a decimal integer"},
    {D "pool_mb = Auto\n", MMRT_ERR_CONFIG,
     "t.ini:3: [device.d] pool_mb = 'Auto': expected auto or MiB from 1 to 16777216"},
    {D "pool_mb = auto\npool_mb = 2\n", MMRT_ERR_CONFIG,
     "t.ini:4: [device.d] duplicate key 'pool_mb' (first on line 3)"},
    {D "level1 = yes\n", MMRT_ERR_CONFIG,
     "t.ini:3: [device.d] level1 = 'yes': expected on or off"},
    {D "level1 = ON\n", MMRT_ERR_CONFIG,
     "t.ini:3: [device.d] level1 = 'ON': expected on or off"},
    {D "level1 = off\nlevel1 = on\n", MMRT_ERR_CONFIG,
     "t.ini:4: [device.d] duplicate key 'level1' (first on line 3)"},
    /* reals */
    {RUN("temperature = nan"), MMRT_ERR_CONFIG,
     "t.ini:4: [run] temperature = 'nan': not a decimal number"},
    {RUN("temperature = inf"), MMRT_ERR_CONFIG,
     "t.ini:4: [run] temperature = 'inf': not a decimal number"},
    {RUN("temperature = 0x1p3"), MMRT_ERR_CONFIG,
     "t.ini:4: [run] temperature = '0x1p3': not a decimal number"},
    {RUN("temperature = 1e"), MMRT_ERR_CONFIG,
     "t.ini:4: [run] temperature = '1e': not a decimal number"},
    {RUN("temperature = ."), MMRT_ERR_CONFIG,
     "t.ini:4: [run] temperature = '.': not a decimal number"},
    {RUN("temperature = 0,7"), MMRT_ERR_CONFIG,
     "t.ini:4: [run] temperature = '0,7': not a decimal number"},
    {RUN("temperature = -0.5"), MMRT_ERR_CONFIG,
     "t.ini:4: [run] temperature = '-0.5': outside [0, 100]"},
    {RUN("repetition_penalty = 0"), MMRT_ERR_CONFIG,
     "t.ini:4: [run] repetition_penalty = '0': outside (0, 100]"},
    {RUN("presence_penalty = 2.5"), MMRT_ERR_CONFIG,
     "t.ini:4: [run] presence_penalty = '2.5': outside [-2, 2]"},
    {RUN("frequency_penalty = -3"), MMRT_ERR_CONFIG,
     "t.ini:4: [run] frequency_penalty = '-3': outside [-2, 2]"},
    {RUN("response_format = json"), MMRT_ERR_CONFIG,
     "t.ini:4: [run] response_format = 'json': expected 'text' or 'json_object'"},
    {RUN("temperature = 100.5"), MMRT_ERR_CONFIG,
     "t.ini:4: [run] temperature = '100.5': outside [0, 100]"},
    {RUN("temperature = 1e999"), MMRT_ERR_CONFIG,
     "t.ini:4: [run] temperature = '1e999': outside [0, 100]"},
    {RUN("top_p = 0"), MMRT_ERR_CONFIG, "t.ini:4: [run] top_p = '0': outside (0, 1]"},
    {RUN("top_p = 1.0000001"), MMRT_ERR_CONFIG,
     "t.ini:4: [run] top_p = '1.0000001': outside (0, 1]"},
    {RUN("top_p = 0.5x"), MMRT_ERR_CONFIG, "t.ini:4: [run] top_p = '0.5x': not a decimal number"},
    /* inih's own syntax errors, and which error wins */
    {D "this is not ini\n", MMRT_ERR_CONFIG,
     "t.ini:3: syntax error: expected '[section]', 'key = value' or a comment"},
    {"[device.d]\ngarbage\nplugin = cpu\n[bogus]\n", MMRT_ERR_CONFIG,
     "t.ini:2: syntax error: expected '[section]', 'key = value' or a comment"},
    {"[device.d]\nplugin = cpu\n\xef\xbb\xbf[run]\n", MMRT_ERR_CONFIG,
     "t.ini:3: syntax error: expected '[section]', 'key = value' or a comment"},
    /* quoting */
    {RUN("prompt = \"a ; b\""), MMRT_ERR_CONFIG, "t.ini:4: [run] prompt = '\"a': unterminated "
     "double quote (note: ' ;' starts a comment even inside quotes)"},
    {RUN("prompt = \""), MMRT_ERR_CONFIG, "t.ini:4: [run] prompt = '\"': unterminated "
     "double quote (note: ' ;' starts a comment even inside quotes)"},
    /* bytes that are not text */
    {RUN("prompt = a\x07" "b"), MMRT_ERR_CONFIG, "t.ini:4: control character 0x07 at column 11"},
    {RUN("prompt = a\rb"), MMRT_ERR_CONFIG, "t.ini:4: control character 0x0d at column 11"},
    {RUN("prompt = \x7f"), MMRT_ERR_CONFIG, "t.ini:4: control character 0x7f at column 10"},
    {RUN("prompt = \xff"), MMRT_ERR_CONFIG, "t.ini:4: invalid UTF-8 at column 10"},
    {RUN("prompt = \xc0\xaf"), MMRT_ERR_CONFIG, "t.ini:4: invalid UTF-8 at column 10"},
    {RUN("prompt = \xe0\x80\xaf"), MMRT_ERR_CONFIG, "t.ini:4: invalid UTF-8 at column 10"},
    {RUN("prompt = \xed\xa0\x80"), MMRT_ERR_CONFIG, "t.ini:4: invalid UTF-8 at column 10"},
    {RUN("prompt = \xf4\x90\x80\x80"), MMRT_ERR_CONFIG, "t.ini:4: invalid UTF-8 at column 10"},
    {RUN("prompt = caf\xc3"), MMRT_ERR_CONFIG, "t.ini:4: invalid UTF-8 at column 13"},
};

static void test_errors(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof ERRORS / sizeof ERRORS[0]; i++)
        expect_error(ERRORS[i].text, strlen(ERRORS[i].text), ERRORS[i].status, ERRORS[i].msg);
    /* A NUL inside the text ends nothing silently. */
    static const char nul[] = D "[run]\nprompt = a\0b\n";
    expect_error(nul, sizeof nul - 1, MMRT_ERR_CONFIG, "t.ini:4: NUL byte at column 11");
}

static void test_quotes_and_comments(void **state)
{
    (void)state;
    const char *text = "[device.d] ; comment after a header\n"  /* 1 */
                       "plugin = cpu ; comment\n"                /* 2 */
                       "a = x;y\n"                               /* 3 */
                       "b = \"quoted\"\n"                        /* 4 */
                       "c = x # not a comment\n"                 /* 5 */
                       "# hash comment\n"                        /* 6 */
                       "    ; indented comment\n"                /* 7 */
                       "    threads = 4\n"                       /* 8: a key, not a continuation */
                       "e =\n"                                   /* 9 */
                       "f: colon\n"                              /* 10 */
                       "g = say \"hi\"\n"                        /* 11 */
                       "h = \"x\"y\"\n"                          /* 12 */
                       "i = tab\t; comment\n"                    /* 13 */
                       "j = \"a;b\"\n"                           /* 14 */
                       "[run]\n"                                 /* 15 */
                       "\tprompt = \"  spaced out  \"\n";        /* 16 */
    struct mmrt_conf *c = parse_ok(text, strlen(text), "t.ini");
    const struct mmrt_conf_device *d = &c->devices[0];
    assert_string_equal(d->plugin, "cpu");
    static const struct {
        const char *key, *value;
        int line;
    } want[] = {{"a", "x;y", 3}, {"b", "quoted", 4},   {"c", "x # not a comment", 5},
                {"threads", "4", 8}, {"e", "", 9},      {"f", "colon", 10},
                {"g", "say \"hi\"", 11}, {"h", "x\"y", 12}, {"i", "tab", 13},
                {"j", "a;b", 14}};
    assert_int_equal(d->n_options, sizeof want / sizeof want[0]);
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        const struct mmrt_conf_option *o = mmrt_conf_find_option(d, want[i].key);
        assert_non_null(o);
        assert_string_equal(o->value, want[i].value);
        assert_int_equal(o->line, want[i].line);
        assert_ptr_equal(o, &d->options[i]); /* file order */
    }
    assert_string_equal(c->run.prompt, "  spaced out  ");
    assert_int_equal(c->run.prompt_line, 16);
    mmrt_conf_destroy(c);
}

static void test_long_lines(void **state)
{
    (void)state;
    /* The longest line inih's buffer holds (INI_MAX_LINE minus '\n' and NUL) is accepted
     * whole, with LF or CRLF; one byte more is refused, never split. */
    const int max = INI_MAX_LINE - 2;
    char value[4096];
    int pad = max - (int)strlen("prompt = ");
    memset(value, 'x', (size_t)pad);
    value[pad] = '\0';
    for (int crlf = 0; crlf < 2; crlf++) {
        char *text = xasprintf(D "[run]\nprompt = %s%s\nseed = 5\n", value, crlf ? "\r" : "");
        struct mmrt_conf *c = parse_ok(text, strlen(text), "t.ini");
        assert_int_equal(strlen(c->run.prompt), pad);
        assert_int_equal(c->run.seed_line, 5);
        mmrt_conf_destroy(c);
        free(text);
    }
    value[pad] = 'y';
    value[pad + 1] = '\0';
    char *text = xasprintf(D "[run]\nprompt = %s\nseed = 5\n", value);
    char *msg = xasprintf("t.ini:4: line too long: %d bytes, at most %d", max + 1, max);
    expect_error(text, strlen(text), MMRT_ERR_LIMIT, msg);
    free(text);
    free(msg);

    /* Far past the buffer, on a comment line, with more lines after it. */
    memset(value, ';', sizeof value - 1);
    value[sizeof value - 1] = '\0';
    text = xasprintf(D "%s\n[run]\nseed = 1\n", value);
    msg = xasprintf("t.ini:3: line too long: %zu bytes, at most %d", sizeof value - 1, max);
    expect_error(text, strlen(text), MMRT_ERR_LIMIT, msg);
    free(text);
    free(msg);
}

static void test_crlf_and_bom(void **state)
{
    (void)state;
    char *crlf = to_crlf(GOOD);
    struct mmrt_conf *c = parse_ok(crlf, strlen(crlf), "a/deploy.ini");
    check_good(c, "a/deploy.ini", "a/");
    mmrt_conf_destroy(c);

    char *bom = xasprintf("\xef\xbb\xbf%s", crlf);
    c = parse_ok(bom, strlen(bom), "a/deploy.ini");
    check_good(c, "a/deploy.ini", "a/");
    mmrt_conf_destroy(c);
    free(bom);
    free(crlf);

    /* The BOM directly before a header (inih alone would hide a missing skip before a
     * comment line). */
    const char *bom_header = "\xef\xbb\xbf[device.d]\nplugin = cpu\n";
    c = parse_ok(bom_header, strlen(bom_header), "t.ini");
    assert_int_equal(c->devices[0].line, 1);
    mmrt_conf_destroy(c);

    /* Last line without a line end, and with a lone trailing CR. */
    const char *text = "[device.d]\nplugin = cpu";
    c = parse_ok(text, strlen(text), "t.ini");
    assert_string_equal(c->devices[0].plugin, "cpu");
    mmrt_conf_destroy(c);
    text = "[device.d]\r\nplugin = cpu\r";
    c = parse_ok(text, strlen(text), "t.ini");
    assert_string_equal(c->devices[0].plugin, "cpu");
    mmrt_conf_destroy(c);

    /* UTF-8 is kept as is. */
    text = "[device.d]\nplugin = cpu\n[run]\n"
           "prompt = Qu'est-ce que c'est ? \xe7\x8c\xab \xf0\x9f\x90\x88\n";
    c = parse_ok(text, strlen(text), "t.ini");
    assert_string_equal(c->run.prompt, "Qu'est-ce que c'est ? \xe7\x8c\xab \xf0\x9f\x90\x88");
    mmrt_conf_destroy(c);
}

static void test_limits(void **state)
{
    (void)state;
    /* MMRT_CONF_MAX_DEVICES devices are fine, one more is not. */
    size_t cap = 64 * 1024, n = 0;
    char *text = malloc(cap);
    assert_non_null(text);
    for (int i = 0; i <= MMRT_CONF_MAX_DEVICES; i++)
        n += (size_t)snprintf(text + n, cap - n, "[device.d%d]\nplugin = cpu\n", i);
    size_t n64 = n - strlen("[device.d64]\nplugin = cpu\n");
    struct mmrt_conf *c = parse_ok(text, n64, "t.ini");
    assert_int_equal(c->n_devices, MMRT_CONF_MAX_DEVICES);
    mmrt_conf_destroy(c);
    char *msg = xasprintf("t.ini:%d: more than %d [device.NAME] sections",
                          2 * MMRT_CONF_MAX_DEVICES + 1, MMRT_CONF_MAX_DEVICES);
    expect_error(text, n, MMRT_ERR_LIMIT, msg);
    free(msg);

    /* Options per device likewise. */
    n = (size_t)snprintf(text, cap, "[device.d]\nplugin = cpu\n");
    for (int i = 0; i <= MMRT_CONF_MAX_OPTIONS; i++)
        n += (size_t)snprintf(text + n, cap - n, "opt%d = %d\n", i, i);
    size_t last = strlen("opt64 = 64\n");
    c = parse_ok(text, n - last, "t.ini");
    assert_int_equal(c->devices[0].n_options, MMRT_CONF_MAX_OPTIONS);
    assert_string_equal(c->devices[0].options[63].key, "opt63");
    mmrt_conf_destroy(c);
    msg = xasprintf("t.ini:%d: [device.d] more than %d plugin-specific options",
                    2 + MMRT_CONF_MAX_OPTIONS + 1, MMRT_CONF_MAX_OPTIONS);
    expect_error(text, n, MMRT_ERR_LIMIT, msg);
    free(msg);
    free(text);

    /* File size: exactly the cap parses, one byte more is refused before parsing. */
    text = malloc(MMRT_CONF_MAX_BYTES + 1);
    assert_non_null(text);
    memset(text, '\n', MMRT_CONF_MAX_BYTES + 1);
    memcpy(text, D, strlen(D));
    c = parse_ok(text, MMRT_CONF_MAX_BYTES, "t.ini");
    assert_int_equal(c->n_devices, 1);
    mmrt_conf_destroy(c);
    expect_error(text, MMRT_CONF_MAX_BYTES + 1, MMRT_ERR_LIMIT,
                 "t.ini: 1048577 bytes, more than the 1048576 allowed for a configuration file");
    free(text);
}

static void test_bad_arguments(void **state)
{
    (void)state;
    struct mmrt_conf *c = NULL;
    struct mmrt_error err = {0};
    assert_int_equal(mmrt_conf_parse(NULL, 3, "t.ini", &c, &err), MMRT_ERR_INVALID_ARG);
    assert_int_equal(mmrt_conf_parse(D, strlen(D), NULL, &c, &err), MMRT_ERR_INVALID_ARG);
    assert_int_equal(mmrt_conf_parse(D, strlen(D), "t.ini", NULL, &err), MMRT_ERR_INVALID_ARG);
    assert_int_equal(mmrt_conf_load(NULL, &c, &err), MMRT_ERR_INVALID_ARG);
    assert_int_equal(mmrt_conf_load("t.ini", NULL, NULL), MMRT_ERR_INVALID_ARG);
    assert_null(c);
    /* err may be NULL. */
    assert_int_equal(mmrt_conf_parse("[x]\n", 4, "t.ini", &c, NULL), MMRT_ERR_CONFIG);
    assert_null(c);
}

/* A scratch folder holding conf/deploy.ini (GOOD), a directory, and an oversized file. */
struct scratch {
    char dir[64];
    char conf_dir[128];
    char ini[160];
    char big[160];
};

static void scratch_make(struct scratch *s)
{
    snprintf(s->dir, sizeof s->dir, "/tmp/mmrt_test_conf_XXXXXX");
    assert_non_null(mkdtemp(s->dir));
    snprintf(s->conf_dir, sizeof s->conf_dir, "%s/conf", s->dir);
    assert_int_equal(mkdir(s->conf_dir, 0700), 0);
    snprintf(s->ini, sizeof s->ini, "%s/deploy.ini", s->conf_dir);
    write_file(s->ini, GOOD, strlen(GOOD));
    snprintf(s->big, sizeof s->big, "%s/big.ini", s->dir);
    char *big = malloc(MMRT_CONF_MAX_BYTES + 1);
    assert_non_null(big);
    memset(big, '\n', MMRT_CONF_MAX_BYTES + 1);
    write_file(s->big, big, MMRT_CONF_MAX_BYTES + 1);
    free(big);
}

static void scratch_remove(struct scratch *s)
{
    unlink(s->ini);
    unlink(s->big);
    rmdir(s->conf_dir);
    rmdir(s->dir);
}

static void test_load(void **state)
{
    (void)state;
    struct scratch s;
    scratch_make(&s);
    struct mmrt_conf *c = NULL;
    struct mmrt_error err = {0};
    mmrt_status st = mmrt_conf_load(s.ini, &c, &err);
    if (st != MMRT_OK)
        fail_msg("%s", err.msg);
    char dir[200];
    snprintf(dir, sizeof dir, "%s/", s.conf_dir);
    check_good(c, s.ini, dir);
    mmrt_conf_destroy(c);
    c = NULL;

    char want[512];
    snprintf(want, sizeof want, "%s: not a regular file (it is a directory)", s.conf_dir);
    assert_int_equal(mmrt_conf_load(s.conf_dir, &c, &err), MMRT_ERR_IO);
    assert_string_equal(err.msg, want);
    /* A device is named, and /dev/zero's endless bytes are never read. */
    assert_int_equal(mmrt_conf_load("/dev/zero", &c, &err), MMRT_ERR_IO);
    assert_string_equal(err.msg, "/dev/zero: not a regular file (it is a character device)");

    snprintf(want, sizeof want, "%s: 1048577 bytes, more than the 1048576 allowed for a "
             "configuration file", s.big);
    assert_int_equal(mmrt_conf_load(s.big, &c, &err), MMRT_ERR_LIMIT);
    assert_string_equal(err.msg, want);

    char missing[200];
    snprintf(missing, sizeof missing, "%s/missing.ini", s.dir);
    snprintf(want, sizeof want, "%s: cannot open: %s", missing, strerror(ENOENT));
    assert_int_equal(mmrt_conf_load(missing, &c, &err), MMRT_ERR_NOT_FOUND);
    assert_string_equal(err.msg, want);
    assert_null(c);
    scratch_remove(&s);
}

/* Fails the 1st, 2nd, … allocation until the call succeeds; every failure must be a clean
 * MMRT_ERR_NO_MEMORY that leaves *out alone and nothing allocated. */
static void sweep(const char *what, const char *ini)
{
    long n;
    for (n = 1;; n++) {
        long base = g_live;
        struct mmrt_conf *c = NULL;
        struct mmrt_error err = {0};
        g_calls = 0;
        g_fail_at = n;
        mmrt_status st = ini ? mmrt_conf_load(ini, &c, &err)
                             : mmrt_conf_parse(GOOD, strlen(GOOD), "conf/deploy.ini", &c, &err);
        g_fail_at = 0;
        if (st == MMRT_OK) {
            assert_true(g_calls < n); /* nothing was failed */
            check_good(c, ini ? ini : "conf/deploy.ini", ini ? "" : "conf/");
            mmrt_conf_destroy(c);
            assert_int_equal(g_live, base);
            break;
        }
        if (st != MMRT_ERR_NO_MEMORY || !strstr(err.msg, "out of memory"))
            fail_msg("%s: allocation %ld failed gave %s: %s", what, n, mmrt_status_name(st),
                     err.msg);
        assert_null(c);
        if (g_live != base)
            fail_msg("%s: allocation %ld failed: %ld blocks leaked", what, n, g_live - base);
    }
    /* GOOD makes well over a dozen allocations; a sweep that injected nothing proves nothing. */
    assert_true(n > 15);
}

static void test_allocation_failures(void **state)
{
    (void)state;
    sweep("parse", NULL);

    /* The same through mmrt_conf_load, from a folder-less name so check_good's paths hold. */
    struct scratch s;
    scratch_make(&s);
    char cwd[4096];
    assert_non_null(getcwd(cwd, sizeof cwd));
    assert_int_equal(chdir(s.conf_dir), 0);
    sweep("load", "deploy.ini");
    assert_int_equal(chdir(cwd), 0);
    scratch_remove(&s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_good_file),
        cmocka_unit_test(test_defaults_and_paths),
        cmocka_unit_test(test_model_image_budget),
        cmocka_unit_test(test_model_kv_keys),
        cmocka_unit_test(test_scheduler_keys),
        cmocka_unit_test(test_cache_keys),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_quotes_and_comments),
        cmocka_unit_test(test_long_lines),
        cmocka_unit_test(test_crlf_and_bom),
        cmocka_unit_test(test_limits),
        cmocka_unit_test(test_bad_arguments),
        cmocka_unit_test(test_load),
        cmocka_unit_test(test_allocation_failures),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
