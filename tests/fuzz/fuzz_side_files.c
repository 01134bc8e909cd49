/*
 * tests/fuzz/fuzz_side_files.c — libFuzzer target for the small files a checkpoint carries
 * beside config.json: the image processor's settings (preprocessor_config.json, or the
 * "image_processor" object of processor_config.json), the sampling defaults and end ids of
 * generation_config.json, and the chat template (chat_template.jinja, chat_template.json,
 * processor_config.json or tokenizer_config.json).
 *
 * The first byte of an input picks the file name (low three bits, modulo the six names
 * below) and whether the text model counts as Mistral (bit 7); the rest is the file. It is
 * written alone into a fresh checkpoint folder, then every reader that looks for any of
 * these files runs on that folder, as a model's load does:
 *   mmrt_generation_config_read, mmrt_llava_read_eos, mmrt_llava_load_preprocessor_config
 *   (CLIP / LLaVA), mmrt_llava_choose_template; and on the parsed file itself and on its
 *   "image_processor" object, mmrt_clip_preprocess_config_from_json,
 *   mmrt_qwen2vl_preprocess_config_from_json and mmrt_fuyu_preprocess_config_from_json.
 * Asserted: a refusal leaves the output as it was and writes one printable line; an accepted
 * file gives what the readers' headers promise (sampling values in their ranges, end ids
 * below the vocabulary and at most MMRT_LLAVA_MAX_EOS of them, sizes, resampling filters,
 * rescale factors and normalisation in their ranges, a template family mmrt renders), and a
 * reader whose file is absent gives its documented default. Invariants are checked with
 * __builtin_trap(), which libFuzzer reports as a crash. The folder is removed at exit.
 *
 * The same entry point is linked into the normal build with replay_main.c, so the committed
 * corpus (tests/fuzz/corpus/side_files) runs as a ctest everywhere.
 */
#include <fcntl.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "formats/json.h"
#include "generation_config.h"
#include "llava_common.h"
#include "preprocess.h"
#include "fuzz_check.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char *const k_names[] = {
    "preprocessor_config.json", "processor_config.json", "generation_config.json",
    "tokenizer_config.json",    "chat_template.json",    "chat_template.jinja",
};
#define N_NAMES (sizeof k_names / sizeof k_names[0])
#define VOCAB 1000
#define FALLBACK_EOS 7
#define FUYU_PATCH 30

static char g_dir[64];
static bool g_ready;

static void path_of(char *dst, size_t size, const char *name)
{
    if ((size_t)snprintf(dst, size, "%s/%s", g_dir, name) >= size)
        abort();
}

static void cleanup(void)
{
    char p[192];
    for (size_t i = 0; i < N_NAMES; i++) {
        path_of(p, sizeof p, k_names[i]);
        unlink(p);
    }
    rmdir(g_dir);
}

static void setup(void)
{
    snprintf(g_dir, sizeof g_dir, "/tmp/mmrt-fuzz-side-XXXXXX");
    if (!mkdtemp(g_dir)) {
        perror("mkdtemp");
        abort();
    }
    atexit(cleanup);
    g_ready = true;
}

static void check_refusal(const struct mmrt_error *err, mmrt_status st)
{
    CHECK(st < 0 && err->status == st);
    fuzz_check_message(err);
}

/* The pattern an output holds before a reader runs: a refusal must leave it. */
static void fill(void *p, size_t n)
{
    memset(p, 0xA5, n);
}

static bool untouched(const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++)
        if (b[i] != 0xA5)
            return false;
    return true;
}

static void check_normalize(const struct mmrt_preprocess_normalize *n)
{
    CHECK(n->rescale_factor > 0 && n->rescale_factor <= 1);
    for (int c = 0; c < 3; c++) {
        CHECK(n->mean[c] >= -1000 && n->mean[c] <= 1000);
        CHECK(n->std[c] >= 1e-6 && n->std[c] <= 1000);
    }
}

static void check_resample(enum mmrt_resample r)
{
    /* nearest (0) is refused as unsupported */
    CHECK(r >= MMRT_RESAMPLE_LANCZOS && r <= MMRT_RESAMPLE_HAMMING);
}

static void check_clip(const struct mmrt_clip_preprocess_config *c)
{
    CHECK(c->resize_mode == MMRT_RESIZE_SHORTEST_EDGE || c->resize_mode == MMRT_RESIZE_EXACT);
    if (c->resize_mode == MMRT_RESIZE_SHORTEST_EDGE)
        CHECK(c->shortest_edge >= 1 && c->shortest_edge <= MMRT_CLIP_MAX_SIZE);
    else
        CHECK(c->resize_width >= 1 && c->resize_width <= MMRT_CLIP_MAX_SIZE &&
              c->resize_height >= 1 && c->resize_height <= MMRT_CLIP_MAX_SIZE);
    check_resample(c->resample);
    if (c->do_center_crop)
        CHECK(c->crop_width >= 1 && c->crop_width <= MMRT_CLIP_MAX_SIZE && c->crop_height >= 1 &&
              c->crop_height <= MMRT_CLIP_MAX_SIZE);
    check_normalize(&c->norm);
}

static void check_qwen2vl(const struct mmrt_qwen2vl_preprocess_config *c)
{
    CHECK(c->min_pixels >= 1 && c->min_pixels <= MMRT_QWEN2VL_MAX_PIXELS);
    CHECK(c->max_pixels >= 1 && c->max_pixels <= MMRT_QWEN2VL_MAX_PIXELS);
    CHECK(c->patch_size >= 1 && c->patch_size <= 1024);
    CHECK(c->temporal_patch_size >= 1 && c->temporal_patch_size <= 16);
    CHECK(c->merge_size >= 1 && c->merge_size <= 16);
    check_resample(c->resample);
    check_normalize(&c->norm);
}

/* Both image processor readers on one object (the file itself or its "image_processor"). */
static void image_processor(const json_t *obj)
{
    struct mmrt_error err = { 0 };
    struct mmrt_clip_preprocess_config clip;
    fill(&clip, sizeof clip);
    mmrt_status st = mmrt_clip_preprocess_config_from_json(obj, "fuzz", &clip, &err);
    if (st == MMRT_OK) {
        check_clip(&clip);
    } else {
        check_refusal(&err, st);
        CHECK(untouched(&clip, sizeof clip));
    }
    mmrt_error_clear(&err);
    struct mmrt_qwen2vl_preprocess_config q;
    fill(&q, sizeof q);
    st = mmrt_qwen2vl_preprocess_config_from_json(obj, "fuzz", &q, &err);
    if (st == MMRT_OK) {
        check_qwen2vl(&q);
    } else {
        check_refusal(&err, st);
        CHECK(untouched(&q, sizeof q));
    }
    mmrt_error_clear(&err);
    struct mmrt_fuyu_preprocess_config f;
    fill(&f, sizeof f);
    st = mmrt_fuyu_preprocess_config_from_json(obj, "fuzz", FUYU_PATCH, &f, &err);
    if (st == MMRT_OK) {
        CHECK(f.patch == FUYU_PATCH);
        CHECK(f.target_h >= 1 && f.target_h <= 32768 && f.target_h % FUYU_PATCH == 0);
        CHECK(f.target_w >= 1 && f.target_w <= 32768 && f.target_w % FUYU_PATCH == 0);
        check_resample(f.filter);
        CHECK(f.norm.rescale_factor > 0 && isfinite(f.norm.rescale_factor));
        for (int c = 0; c < 3; c++)
            CHECK(f.norm.std[c] > 0 && isfinite(f.norm.std[c]) && isfinite(f.norm.mean[c]));
    } else {
        check_refusal(&err, st);
        CHECK(untouched(&f, sizeof f));
    }
}

static void generation(size_t which)
{
    struct mmrt_error err = { 0 };
    struct mmrt_generation_defaults g;
    fill(&g, sizeof g);
    mmrt_status st = mmrt_generation_config_read(g_dir, &g, &err);
    if (st != MMRT_OK) {
        CHECK(which == 2);
        check_refusal(&err, st);
        CHECK(untouched(&g, sizeof g));
        return;
    }
    CHECK(g.struct_size == sizeof g);
    CHECK(g.has_temperature == 0 || g.has_temperature == 1);
    CHECK(g.has_top_k == 0 || g.has_top_k == 1);
    CHECK(g.has_top_p == 0 || g.has_top_p == 1);
    CHECK(g.has_repetition_penalty == 0 || g.has_repetition_penalty == 1);
    if (which != 2)
        CHECK(!g.has_temperature && !g.has_top_k && !g.has_top_p && !g.has_repetition_penalty);
    if (g.has_temperature)
        CHECK(g.temperature >= 0 && g.temperature <= 100);
    if (g.has_top_k)
        CHECK(g.top_k >= 0 && g.top_k <= 1000000000);
    if (g.has_top_p)
        CHECK(g.top_p >= 0 && g.top_p <= 1);
    if (g.has_repetition_penalty)
        CHECK(g.repetition_penalty > 0 && g.repetition_penalty <= 100);
}

static void end_ids(size_t which)
{
    struct mmrt_error err = { 0 };
    int32_t eos[MMRT_LLAVA_MAX_EOS];
    int n = -1;
    mmrt_status st = mmrt_llava_read_eos(g_dir, FALLBACK_EOS, VOCAB, NULL,
                                         MMRT_CHAT_TEMPLATE_LLAVA, eos, &n, &err);
    if (st != MMRT_OK) {
        CHECK(which == 2);
        check_refusal(&err, st);
        return;
    }
    CHECK(n >= 0 && n <= MMRT_LLAVA_MAX_EOS);
    if (which != 2)
        CHECK(n == 1 && eos[0] == FALLBACK_EOS);
    for (int i = 0; i < n; i++)
        CHECK(eos[i] >= 0 && eos[i] < VOCAB);
}

static void clip_from_folder(size_t which)
{
    struct mmrt_error err = { 0 };
    char path[256];
    json_t *root = NULL;
    const json_t *obj = NULL;
    struct mmrt_clip_preprocess_config pp;
    fill(&pp, sizeof pp);
    mmrt_status st = mmrt_llava_load_preprocessor_config(g_dir, path, sizeof path, &root, &obj,
                                                         &pp, &err);
    json_decref(root);
    if (st == MMRT_OK) {
        CHECK(which <= 1);
        check_clip(&pp);
    } else {
        check_refusal(&err, st);
        CHECK(untouched(&pp, sizeof pp));
    }
}

static void template_choice(size_t which, bool mistral)
{
    struct mmrt_error err = { 0 };
    enum mmrt_chat_template t = (enum mmrt_chat_template)-1;
    mmrt_status st = mmrt_llava_choose_template(g_dir, MMRT_CHAT_TEMPLATE_AUTO, mistral, &t, &err);
    if (st != MMRT_OK) {
        /* only the files that can hold a template are read */
        CHECK(which == 1 || which >= 3);
        check_refusal(&err, st);
        CHECK(t == (enum mmrt_chat_template)-1);
        return;
    }
    CHECK(t == MMRT_CHAT_TEMPLATE_LLAVA || t == MMRT_CHAT_TEMPLATE_MISTRAL ||
          t == MMRT_CHAT_TEMPLATE_CHATML || t == MMRT_CHAT_TEMPLATE_LLAMA3);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1 || size > (1u << 20))
        return 0;
    if (!g_ready)
        setup();
    const size_t which = (data[0] & 7u) % N_NAMES;
    const bool mistral = data[0] & 0x80u;
    char p[192];
    for (size_t i = 0; i < N_NAMES; i++) {
        path_of(p, sizeof p, k_names[i]);
        unlink(p);
    }
    path_of(p, sizeof p, k_names[which]);
    int fd = open(p, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0 || write(fd, data + 1, size - 1) != (ssize_t)(size - 1) || close(fd) != 0) {
        perror(p);
        abort();
    }

    generation(which);
    end_ids(which);
    clip_from_folder(which);
    template_choice(which, mistral);

    /* The parsed file's own object and its "image_processor", whatever its name. */
    json_t *root = NULL;
    struct mmrt_error err = { 0 };
    if (which != 5 && mmrt_json_load_object(p, 1u << 20, 0, &root, &err) == MMRT_OK) {
        image_processor(root);
        const json_t *ip = json_object_get(root, "image_processor");
        if (ip)
            image_processor(ip);
    }
    json_decref(root);
    return 0;
}
