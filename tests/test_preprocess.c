/*
 * tests/test_preprocess.c — core/preprocess.c against Pillow and transformers: PIL resizes
 * with every filter byte for byte, CLIPImageProcessorPil pixel_values within 1e-5 (from the
 * PIL-decoded pixels and, for lossless files, from our own decoder), windows of resizes equal
 * to crops of full resizes, transformers' size and crop arithmetic, degenerate sizes (1×1,
 * 1×5000), preprocessor_config.json parsing and refusals, and an allocation-failure sweep;
 * Qwen2-VL's smart_resize (every branch, banker's rounding, refusals), its patch order and
 * temporal repeat, its processor config, and its allocation-failure sweep.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "alloc_fail.h"
#include "image_fixtures.h"
#include "preprocess.h"

#define CLIP_TOLERANCE 1e-5

static struct mmrt_image *load(const char *name)
{
    struct mmrt_image *img = NULL;
    struct mmrt_error err = {0};
    struct mmrt_image_limits lim;
    mmrt_image_limits_default(&lim);
    lim.apply_exif_orientation = false; /* as transformers */
    if (mmrt_image_load_file(fx_path(name), &lim, &img, &err) != MMRT_OK)
        fail_msg("%s", err.msg);
    return img;
}

/* The PIL-decoded pixels of a fixture (its .rgb), as an image. */
static struct mmrt_image *load_pil(const json_t *manifest, const char *file)
{
    const json_t *list = json_object_get(manifest, "decode");
    for (size_t i = 0; i < json_array_size(list); i++) {
        const json_t *e = json_array_get(list, i);
        if (strcmp(fx_str(e, "file"), file))
            continue;
        struct mmrt_image *img = NULL;
        assert_int_equal(mmrt_image_create((uint32_t)fx_int(e, "width"),
                                           (uint32_t)fx_int(e, "height"), &img, NULL),
                         MMRT_OK);
        size_t n;
        uint8_t *b = fx_read(fx_str(e, "rgb"), &n);
        assert_int_equal(n, (size_t)img->width * img->height * 3);
        memcpy(img->pixels, b, n);
        free(b);
        return img;
    }
    fail_msg("%s not in the manifest", file);
    return NULL;
}

static bool exact_in_manifest(const json_t *manifest, const char *file)
{
    const json_t *list = json_object_get(manifest, "decode");
    for (size_t i = 0; i < json_array_size(list); i++) {
        const json_t *e = json_array_get(list, i);
        if (!strcmp(fx_str(e, "file"), file))
            return json_is_true(json_object_get(e, "exact"));
    }
    return false;
}

static struct mmrt_image *resize_ok(const struct mmrt_image *in, uint32_t w, uint32_t h,
                                    enum mmrt_resample f)
{
    struct mmrt_image *out = NULL;
    struct mmrt_error err = {0};
    if (mmrt_preprocess_resize(in, w, h, f, &out, &err) != MMRT_OK)
        fail_msg("%s", err.msg);
    return out;
}

/* ---------------------------------------------------------------------------------------- */

static void test_resize_matches_pil(void **state)
{
    (void)state;
    json_t *m = fx_manifest();
    const json_t *list = json_object_get(m, "resize");
    assert_true(json_array_size(list) >= 10);
    for (size_t i = 0; i < json_array_size(list); i++) {
        const json_t *e = json_array_get(list, i);
        struct mmrt_image *src = load(fx_str(e, "src"));
        uint32_t w = (uint32_t)fx_int(e, "width"), h = (uint32_t)fx_int(e, "height");
        struct mmrt_image *got = resize_ok(src, w, h, (enum mmrt_resample)fx_int(e, "resample"));
        size_t n;
        uint8_t *want = fx_read(fx_str(e, "rgb"), &n);
        assert_int_equal(n, (size_t)w * h * 3);
        size_t bad = 0;
        for (size_t k = 0; k < n; k++)
            bad += got->pixels[k] != want[k];
        if (bad)
            fail_msg("%s: %zu of %zu bytes differ from PIL", fx_str(e, "rgb"), bad, n);
        free(want);
        mmrt_image_destroy(got);
        mmrt_image_destroy(src);
    }
    json_decref(m);
}

/* A window of a resize is byte-identical to the same crop of the full resize. */
static void test_resize_window(void **state)
{
    (void)state;
    struct mmrt_image *src = load("rgb_7x200.png");
    static const struct {
        uint32_t w, h;
        enum mmrt_resample f;
    } cases[] = {{336, 9600, MMRT_RESAMPLE_BICUBIC}, {3, 50, MMRT_RESAMPLE_BICUBIC},
                 {20, 333, MMRT_RESAMPLE_BILINEAR}, {7, 31, MMRT_RESAMPLE_LANCZOS},
                 {11, 200, MMRT_RESAMPLE_HAMMING},  {7, 500, MMRT_RESAMPLE_BOX},
                 /* vertical pass first (Pillow 13) */
                 {5, 20, MMRT_RESAMPLE_BICUBIC},    {12, 3, MMRT_RESAMPLE_LANCZOS}};
    uint64_t seed = 12345;
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        struct mmrt_image *full = resize_ok(src, cases[c].w, cases[c].h, cases[c].f);
        for (int t = 0; t < 20; t++) {
            seed = seed * 6364136223846793005ull + 1442695040888963407ull;
            uint32_t ww = 1 + (uint32_t)(seed >> 33) % cases[c].w;
            uint32_t wh = 1 + (uint32_t)(seed >> 45) % (cases[c].h < 64 ? cases[c].h : 64);
            uint32_t x = (uint32_t)(seed >> 20) % (cases[c].w - ww + 1);
            uint32_t y = (uint32_t)(seed >> 8) % (cases[c].h - wh + 1);
            struct mmrt_image *win = NULL;
            struct mmrt_error err = {0};
            assert_int_equal(mmrt_preprocess_resize_window(src, cases[c].w, cases[c].h,
                                                           cases[c].f, x, y, ww, wh, &win,
                                                           &err),
                             MMRT_OK);
            for (uint32_t j = 0; j < wh; j++)
                assert_memory_equal(win->pixels + (size_t)j * ww * 3,
                                    full->pixels + ((size_t)(y + j) * cases[c].w + x) * 3,
                                    (size_t)ww * 3);
            mmrt_image_destroy(win);
        }
        mmrt_image_destroy(full);
    }
    /* same size on both axes: an exact copy */
    struct mmrt_image *same = resize_ok(src, 7, 200, MMRT_RESAMPLE_LANCZOS);
    assert_memory_equal(same->pixels, src->pixels, 7 * 200 * 3);
    mmrt_image_destroy(same);
    mmrt_image_destroy(src);
}

static void test_shortest_edge_size(void **state)
{
    (void)state;
    /* from transformers' get_resize_output_image_size(default_to_square=False) */
    static const uint32_t cases[][5] = {
        {80, 60, 56, 74, 56},         {60, 80, 56, 56, 74},       {50, 90, 45, 45, 81},
        {1, 1, 336, 336, 336},        {1, 5000, 336, 336, 1680000}, {5000, 1, 336, 1680000, 336},
        {7, 200, 336, 336, 9600},     {3, 7, 5, 5, 11},           {33, 33, 56, 56, 56},
        {641, 427, 336, 504, 336},    {427, 641, 336, 336, 504},  {1000, 999, 224, 224, 224},
        {999, 1000, 224, 224, 224},   {2, 3, 1, 1, 1},
        {32768, 1, 16384, 536870912, 16384},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        uint32_t w = 0, h = 0;
        struct mmrt_error err = {0};
        assert_int_equal(mmrt_preprocess_shortest_edge_size(cases[i][0], cases[i][1],
                                                            cases[i][2], &w, &h, &err),
                         MMRT_OK);
        assert_int_equal(w, cases[i][3]);
        assert_int_equal(h, cases[i][4]);
    }
    uint32_t w = 7, h = 7;
    struct mmrt_error err = {0};
    assert_int_equal(mmrt_preprocess_shortest_edge_size(0, 5, 3, &w, &h, &err),
                     MMRT_ERR_INVALID_ARG);
    assert_int_equal(mmrt_preprocess_shortest_edge_size(1, 1u << 24, 1024, &w, &h, &err),
                     MMRT_ERR_INVALID_ARG);
    assert_int_equal(w, 7); /* outputs untouched on failure */
}

/* ---------------------------------------------------------------------------------------- */
/* CLIP                                                                                     */

static void compare(const char *what, const float *got, const float *want, size_t n,
                    double *worst)
{
    double m = 0;
    size_t bitwise = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - (double)want[i]);
        if (!(d <= m))
            m = d; /* NaN sticks */
        bitwise += !memcmp(&got[i], &want[i], sizeof(float));
    }
    if (!(m <= CLIP_TOLERANCE))
        fail_msg("%s: max |ours - HF| = %g > %g", what, m, CLIP_TOLERANCE);
    if (m > *worst)
        *worst = m;
    print_message("  %-44s max diff %.3g, %zu/%zu bitwise equal\n", what, m, bitwise, n);
}

static void test_clip_matches_transformers(void **state)
{
    (void)state;
    json_t *m = fx_manifest();
    const json_t *list = json_object_get(m, "clip");
    assert_true(json_array_size(list) >= 15);
    double worst = 0;
    for (size_t i = 0; i < json_array_size(list); i++) {
        const json_t *e = json_array_get(list, i);
        const char *src = fx_str(e, "src"), *f32 = fx_str(e, "f32");
        struct mmrt_clip_preprocess_config cfg;
        struct mmrt_error err = {0};
        if (mmrt_clip_preprocess_config_from_json(json_object_get(e, "config"), f32, &cfg,
                                                  &err) != MMRT_OK)
            fail_msg("%s", err.msg);
        const json_t *shape = json_object_get(e, "shape");
        uint32_t c = (uint32_t)json_integer_value(json_array_get(shape, 0));
        uint32_t h = (uint32_t)json_integer_value(json_array_get(shape, 1));
        uint32_t w = (uint32_t)json_integer_value(json_array_get(shape, 2));
        assert_int_equal(c, 3);
        size_t n = (size_t)3 * h * w;
        float *want = fx_read_f32(f32, n);
        float *got = malloc(n * sizeof *got);
        assert_non_null(got);
        /* from PIL's decoded pixels: the preprocessing alone */
        struct mmrt_image *pil = load_pil(m, src);
        uint32_t ow, oh;
        assert_int_equal(mmrt_preprocess_clip_output_size(pil->width, pil->height, &cfg, &ow,
                                                          &oh, &err),
                         MMRT_OK);
        assert_int_equal(ow, w);
        assert_int_equal(oh, h);
        if (mmrt_preprocess_clip(pil, &cfg, got, n, &err) != MMRT_OK)
            fail_msg("%s: %s", f32, err.msg);
        compare(f32, got, want, n, &worst);
        /* from our decoder: the whole path, file bytes to pixel_values */
        if (exact_in_manifest(m, src)) {
            struct mmrt_image *ours = load(src);
            assert_int_equal(mmrt_preprocess_clip(ours, &cfg, got, n, &err), MMRT_OK);
            compare("  (decoded by mmrt)", got, want, n, &worst);
            mmrt_image_destroy(ours);
        }
        mmrt_image_destroy(pil);
        free(got);
        free(want);
    }
    print_message("CLIP pixel_values: worst per-element difference from transformers %.3g\n",
                  worst);
    json_decref(m);
}

/* I6: 1×1 and extreme aspect ratios through the real llava-1.5 setting. */
static void test_degenerate_sizes(void **state)
{
    (void)state;
    struct mmrt_clip_preprocess_config cfg;
    mmrt_clip_preprocess_config_default(&cfg);
    cfg.shortest_edge = 336;
    cfg.crop_width = cfg.crop_height = 336;
    static const uint32_t sizes[][2] = {{1, 1}, {1, 5000}, {5000, 1}, {32768, 1}, {1, 2}, {2, 1}};
    const size_t n = (size_t)3 * 336 * 336;
    float *out = malloc(n * sizeof *out);
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        struct mmrt_image *img = NULL;
        assert_int_equal(mmrt_image_create(sizes[s][0], sizes[s][1], &img, NULL), MMRT_OK);
        for (size_t k = 0; k < (size_t)sizes[s][0] * sizes[s][1] * 3; k++)
            img->pixels[k] = (uint8_t)(k * 7);
        for (int f = 1; f <= 5; f++) {
            cfg.resample = (enum mmrt_resample)f;
            struct mmrt_error err = {0};
            if (mmrt_preprocess_clip(img, &cfg, out, n, &err) != MMRT_OK)
                fail_msg("%ux%u: %s", sizes[s][0], sizes[s][1], err.msg);
            for (size_t k = 0; k < n; k++)
                assert_true(isfinite(out[k]));
        }
        /* a 1×1 image has one colour: so must every output pixel of every channel */
        if (sizes[s][0] * sizes[s][1] == 1)
            for (size_t k = 1; k < 336 * 336; k++)
                assert_true(out[k] == out[0]);
        mmrt_image_destroy(img);
    }
    free(out);
}

/* transformers' center_crop: floor offsets when cropping, ceil-centred zero padding. */
static void test_center_crop_and_pad(void **state)
{
    (void)state;
    struct mmrt_image *img = NULL, *out = NULL;
    struct mmrt_error err = {0};
    assert_int_equal(mmrt_image_create(5, 4, &img, NULL), MMRT_OK);
    for (uint32_t y = 0; y < 4; y++)
        for (uint32_t x = 0; x < 5; x++) {
            uint8_t *p = img->pixels + (y * 5 + x) * 3;
            p[0] = (uint8_t)(10 + x);
            p[1] = (uint8_t)(20 + y);
            p[2] = 1;
        }
    /* 5x4 → 2x2: left = (5 − 2) // 2 = 1, top = (4 − 2) // 2 = 1 */
    assert_int_equal(mmrt_preprocess_center_crop(img, 2, 2, &out, &err), MMRT_OK);
    assert_int_equal(out->pixels[0], 11);
    assert_int_equal(out->pixels[1], 21);
    mmrt_image_destroy(out);
    /* 5x4 → 8x7: zero padding, image at (ceil(3/2), ceil(3/2)) = (2, 2) */
    assert_int_equal(mmrt_preprocess_center_crop(img, 8, 7, &out, &err), MMRT_OK);
    for (uint32_t y = 0; y < 7; y++)
        for (uint32_t x = 0; x < 8; x++) {
            const uint8_t *p = out->pixels + (y * 8 + x) * 3;
            bool inside = x >= 2 && x < 7 && y >= 2 && y < 6;
            assert_int_equal(p[0], inside ? 10 + x - 2 : 0);
            assert_int_equal(p[1], inside ? 20 + y - 2 : 0);
            assert_int_equal(p[2], inside ? 1 : 0);
        }
    mmrt_image_destroy(out);
    /* mixed: wider crop, shorter height (6x2): left pad ceil(1/2) = 1, top = (4 − 2) // 2 */
    assert_int_equal(mmrt_preprocess_center_crop(img, 6, 2, &out, &err), MMRT_OK);
    assert_int_equal(out->pixels[0], 0);
    assert_int_equal(out->pixels[3], 10);
    assert_int_equal(out->pixels[4], 21);
    mmrt_image_destroy(out);
    /* pad: 1 left, 2 top, 3 right, 0 bottom in a colour */
    static const uint8_t fill[3] = {122, 116, 104};
    assert_int_equal(mmrt_preprocess_pad(img, 1, 2, 3, 0, fill, &out, &err), MMRT_OK);
    assert_int_equal(out->width, 9);
    assert_int_equal(out->height, 6);
    for (uint32_t y = 0; y < 6; y++)
        for (uint32_t x = 0; x < 9; x++) {
            const uint8_t *p = out->pixels + (y * 9 + x) * 3;
            bool inside = x >= 1 && x < 6 && y >= 2;
            assert_int_equal(p[0], inside ? 10 + x - 1 : 122);
            assert_int_equal(p[2], inside ? 1 : 104);
        }
    mmrt_image_destroy(out);
    /* a window entirely outside is all fill */
    assert_int_equal(mmrt_preprocess_crop(img, -100, 50, 3, 3, fill, &out, &err), MMRT_OK);
    for (int k = 0; k < 27; k += 3)
        assert_memory_equal(out->pixels + k, fill, 3);
    mmrt_image_destroy(out);
    mmrt_image_destroy(img);
}

static void test_to_chw_and_patchify(void **state)
{
    (void)state;
    struct mmrt_image *img = NULL;
    assert_int_equal(mmrt_image_create(2, 1, &img, NULL), MMRT_OK);
    const uint8_t px[6] = {0, 128, 255, 10, 20, 30};
    memcpy(img->pixels, px, 6);
    struct mmrt_preprocess_normalize norm = {.do_rescale = true,
                                             .rescale_factor = 1.0 / 255,
                                             .do_normalize = true,
                                             .mean = MMRT_CLIP_MEAN,
                                             .std = MMRT_CLIP_STD};
    float out[6];
    struct mmrt_error err = {0};
    assert_int_equal(mmrt_preprocess_to_chw(img, &norm, out, 6, &err), MMRT_OK);
    /* [c][y][x]: channel 0 holds pixel 0's R then pixel 1's R */
    const double mean[3] = MMRT_CLIP_MEAN, std[3] = MMRT_CLIP_STD;
    for (int c = 0; c < 3; c++)
        for (int x = 0; x < 2; x++) {
            double want = (px[x * 3 + c] / 255.0 - mean[c]) / std[c];
            assert_true(fabs(out[c * 2 + x] - want) < 1e-6);
        }
    assert_int_equal(mmrt_preprocess_to_chw(img, &norm, out, 5, &err), MMRT_ERR_INVALID_ARG);
    norm.std[1] = 0;
    assert_int_equal(mmrt_preprocess_to_chw(img, &norm, out, 6, &err), MMRT_ERR_INVALID_ARG);
    norm.do_normalize = norm.do_rescale = false;
    assert_int_equal(mmrt_preprocess_to_chw(img, &norm, out, 6, &err), MMRT_OK);
    assert_true(out[2] == 128.0f && out[5] == 30.0f);
    mmrt_image_destroy(img);

    /* patchify a [2][4][6] tensor whose value encodes (c, y, x) into 2×3 patches */
    float chw[2 * 4 * 6], p[2 * 4 * 6];
    for (int c = 0; c < 2; c++)
        for (int y = 0; y < 4; y++)
            for (int x = 0; x < 6; x++)
                chw[(c * 4 + y) * 6 + x] = (float)(c * 100 + y * 10 + x);
    assert_int_equal(mmrt_preprocess_patchify(chw, 2, 4, 6, 2, 3, MMRT_PATCH_CHW, p, 48, &err),
                     MMRT_OK);
    /* patch 3 = grid row 1, column 1: origin (y 2, x 3); inner [c][py][px] */
    assert_true(p[3 * 12 + 0] == 23.0f);                 /* c0 py0 px0 */
    assert_true(p[3 * 12 + (1 * 2 + 1) * 3 + 2] == 135); /* c1 py1 px2 → (1, 3, 5) */
    assert_int_equal(mmrt_preprocess_patchify(chw, 2, 4, 6, 2, 3, MMRT_PATCH_HWC, p, 48, &err),
                     MMRT_OK);
    assert_true(p[3 * 12 + (1 * 3 + 2) * 2 + 1] == 135); /* [py][px][c] */
    assert_true(p[1 * 12 + 1] == 103);                   /* patch 1, c1 at (0, 3) */
    assert_int_equal(mmrt_preprocess_patchify(chw, 2, 4, 6, 3, 3, MMRT_PATCH_CHW, p, 48, &err),
                     MMRT_ERR_INVALID_ARG);
    assert_int_equal(mmrt_preprocess_patchify(chw, 2, 4, 6, 2, 3, MMRT_PATCH_CHW, p, 47, &err),
                     MMRT_ERR_INVALID_ARG);
}

static void test_invalid_arguments(void **state)
{
    (void)state;
    struct mmrt_image *img = NULL, *out = NULL;
    struct mmrt_error err = {0};
    assert_int_equal(mmrt_image_create(4, 4, &img, NULL), MMRT_OK);
    assert_int_equal(mmrt_preprocess_resize(img, 0, 4, MMRT_RESAMPLE_BICUBIC, &out, &err),
                     MMRT_ERR_INVALID_ARG);
    assert_int_equal(mmrt_preprocess_resize(img, 4, 4, MMRT_RESAMPLE_NEAREST, &out, &err),
                     MMRT_ERR_UNSUPPORTED);
    assert_int_equal(mmrt_preprocess_resize(img, 4, 4, (enum mmrt_resample)9, &out, &err),
                     MMRT_ERR_UNSUPPORTED);
    assert_int_equal(mmrt_preprocess_resize_window(img, 8, 8, MMRT_RESAMPLE_BICUBIC, 5, 0, 4,
                                                   1, &out, &err),
                     MMRT_ERR_INVALID_ARG);
    assert_int_equal(mmrt_preprocess_resize(NULL, 4, 4, MMRT_RESAMPLE_BICUBIC, &out, &err),
                     MMRT_ERR_INVALID_ARG);
    assert_null(out);
    struct mmrt_clip_preprocess_config cfg;
    mmrt_clip_preprocess_config_default(&cfg);
    float f[10];
    assert_int_equal(mmrt_preprocess_clip(img, &cfg, f, 10, &err), MMRT_ERR_INVALID_ARG);
    cfg.shortest_edge = 0;
    assert_int_equal(mmrt_preprocess_clip(img, &cfg, f, 10, &err), MMRT_ERR_INVALID_ARG);
    mmrt_image_destroy(img);
    /* no crop: a 1×5000 image at shortest edge 336 would be 336×1 680 000 floats ×3 */
    mmrt_clip_preprocess_config_default(&cfg);
    cfg.shortest_edge = 336;
    cfg.do_center_crop = false;
    uint32_t w = 0, h = 0;
    assert_int_equal(mmrt_preprocess_clip_output_size(1, 5000, &cfg, &w, &h, &err),
                     MMRT_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "uncropped"));
    assert_int_equal(mmrt_preprocess_clip_output_size(1, 50, &cfg, &w, &h, &err), MMRT_OK);
    assert_int_equal(w, 336);
    assert_int_equal(h, 16800);
}

/* ---------------------------------------------------------------------------------------- */
/* preprocessor_config.json                                                                 */

static json_t *parse(const char *text)
{
    json_t *j = NULL;
    struct mmrt_error err = {0};
    if (mmrt_json_parse(text, strlen(text), "test", 0, &j, &err) != MMRT_OK)
        fail_msg("%s", err.msg);
    return j;
}

static void test_config_json(void **state)
{
    (void)state;
    struct mmrt_clip_preprocess_config cfg, def;
    mmrt_clip_preprocess_config_default(&def);
    struct mmrt_error err = {0};
    json_t *j = parse("{}");
    assert_int_equal(mmrt_clip_preprocess_config_from_json(j, "p.json", &cfg, &err), MMRT_OK);
    assert_memory_equal(&cfg, &def, sizeof cfg);
    json_decref(j);

    j = parse("{\"size\": 300, \"crop_size\": 280, \"resample\": 2, \"image_mean\": 0.5,"
              " \"image_std\": [0.1, 0.2, 0.3], \"do_rescale\": false, \"foo\": [1]}");
    assert_int_equal(mmrt_clip_preprocess_config_from_json(j, "p.json", &cfg, &err), MMRT_OK);
    assert_int_equal(cfg.resize_mode, MMRT_RESIZE_SHORTEST_EDGE);
    assert_int_equal(cfg.shortest_edge, 300);
    assert_int_equal(cfg.crop_width, 280);
    assert_int_equal(cfg.crop_height, 280);
    assert_int_equal(cfg.resample, MMRT_RESAMPLE_BILINEAR);
    assert_true(cfg.norm.mean[2] == 0.5 && cfg.norm.std[2] == 0.3 && !cfg.norm.do_rescale);
    json_decref(j);

    j = parse("{\"size\": {\"height\": 30, \"width\": 60}, \"do_center_crop\": false}");
    assert_int_equal(mmrt_clip_preprocess_config_from_json(j, NULL, &cfg, &err), MMRT_OK);
    assert_int_equal(cfg.resize_mode, MMRT_RESIZE_EXACT);
    assert_int_equal(cfg.resize_width, 60);
    assert_int_equal(cfg.resize_height, 30);
    json_decref(j);

    static const struct {
        const char *json, *needle;
        mmrt_status st;
    } bad[] = {
        {"{\"size\": 0}", "\"size\"", MMRT_ERR_FORMAT},
        {"{\"size\": 20000}", "\"size\"", MMRT_ERR_FORMAT},
        {"{\"size\": 2.5}", "\"size\"", MMRT_ERR_FORMAT},
        {"{\"size\": {\"shortest_edge\": -1}}", "shortest_edge", MMRT_ERR_FORMAT},
        {"{\"size\": {\"height\": 10}}", "\"size\"", MMRT_ERR_FORMAT},
        {"{\"size\": {\"shortest_edge\": 10, \"longest_edge\": 20}}", "longest_edge",
         MMRT_ERR_UNSUPPORTED},
        {"{\"crop_size\": {\"height\": 10}}", "width", MMRT_ERR_FORMAT},
        {"{\"crop_size\": \"big\"}", "crop_size", MMRT_ERR_FORMAT},
        {"{\"resample\": 0}", "nearest", MMRT_ERR_UNSUPPORTED},
        {"{\"resample\": 6}", "resample", MMRT_ERR_FORMAT},
        {"{\"rescale_factor\": 0}", "rescale_factor", MMRT_ERR_FORMAT},
        {"{\"rescale_factor\": 2}", "rescale_factor", MMRT_ERR_FORMAT},
        {"{\"image_std\": [0.1, 0, 0.3]}", "image_std", MMRT_ERR_FORMAT},
        {"{\"image_mean\": [0.1, 0.2]}", "image_mean", MMRT_ERR_FORMAT},
        {"{\"image_mean\": [0.1, \"x\", 0.3]}", "image_mean", MMRT_ERR_FORMAT},
        {"{\"image_mean\": 1e9}", "image_mean", MMRT_ERR_FORMAT},
        {"{\"do_resize\": \"yes\"}", "do_resize", MMRT_ERR_FORMAT},
        {"[]", "object", MMRT_ERR_FORMAT},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        j = parse(bad[i].json);
        memset(&cfg, 0xAB, sizeof cfg);
        struct mmrt_clip_preprocess_config before = cfg;
        mmrt_status st = mmrt_clip_preprocess_config_from_json(j, "p.json", &cfg, &err);
        if (st != bad[i].st || !strstr(err.msg, bad[i].needle) || !strstr(err.msg, "p.json"))
            fail_msg("%s: %s \"%s\"", bad[i].json, mmrt_status_name(st), err.msg);
        assert_memory_equal(&cfg, &before, sizeof cfg); /* untouched */
        json_decref(j);
    }
}

/* ---------------------------------------------------------------------------------------- */
/* Qwen2-VL                                                                                 */

/* transformers' smart_resize (computed with Python for each row): models.md §4.4's examples,
 * the fixtures' cases (qwen2vl-tiny: factor 28, 3920…9408 px; -alt: factor 14, 784…3136 px,
 * 64×64 hitting floor(4.0) exactly), banker's rounding (70/28 = 2.5 → 2, 98/28 = 3.5 → 4),
 * the ≥ factor clamp of the max branch and tiny inputs scaled up. */
static void test_smart_resize(void **state)
{
    (void)state;
    static const struct {
        uint32_t h, w, factor;
        uint64_t min, max;
        uint32_t oh, ow;
        enum mmrt_smart_resize_branch branch;
    } cases[] = {
        {300, 500, 28, 3136, 1003520, 308, 504, MMRT_SMART_RESIZE_ROUND},
        {70, 98, 28, 3136, 1003520, 56, 112, MMRT_SMART_RESIZE_ROUND},
        {1080, 1920, 28, 3136, 1003520, 728, 1316, MMRT_SMART_RESIZE_MAX_PIXELS},
        {4000, 3000, 28, 3136, 12845056, 4004, 2996, MMRT_SMART_RESIZE_ROUND},
        {60, 80, 28, 3920, 9408, 56, 84, MMRT_SMART_RESIZE_ROUND},
        {90, 45, 28, 3920, 9408, 84, 56, MMRT_SMART_RESIZE_ROUND},
        {64, 64, 28, 3920, 9408, 84, 84, MMRT_SMART_RESIZE_MIN_PIXELS},
        {100, 36, 28, 3920, 9408, 112, 56, MMRT_SMART_RESIZE_MIN_PIXELS},
        {70, 98, 28, 3920, 9408, 56, 112, MMRT_SMART_RESIZE_ROUND},
        {60, 80, 14, 784, 3136, 42, 56, MMRT_SMART_RESIZE_MAX_PIXELS},
        {90, 45, 14, 784, 3136, 70, 28, MMRT_SMART_RESIZE_MAX_PIXELS},
        {64, 64, 14, 784, 3136, 56, 56, MMRT_SMART_RESIZE_MAX_PIXELS},
        {100, 36, 14, 784, 3136, 84, 28, MMRT_SMART_RESIZE_MAX_PIXELS},
        {70, 98, 14, 784, 3136, 42, 56, MMRT_SMART_RESIZE_MAX_PIXELS},
        {1, 199, 28, 3136, 1003520, 28, 812, MMRT_SMART_RESIZE_MIN_PIXELS},
        {1, 200, 28, 3136, 1003520, 28, 812, MMRT_SMART_RESIZE_MIN_PIXELS},
        {30, 5000, 28, 3136, 3136, 28, 700, MMRT_SMART_RESIZE_MAX_PIXELS},
        {14, 14, 28, 3136, 1003520, 56, 56, MMRT_SMART_RESIZE_MIN_PIXELS},
        {1, 1, 28, 3136, 1003520, 56, 56, MMRT_SMART_RESIZE_MIN_PIXELS},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        uint32_t oh = 0, ow = 0;
        enum mmrt_smart_resize_branch b = MMRT_SMART_RESIZE_ROUND;
        struct mmrt_error err = {0};
        if (mmrt_preprocess_smart_resize(cases[i].h, cases[i].w, cases[i].factor, cases[i].min,
                                         cases[i].max, &oh, &ow, &b, &err) != MMRT_OK)
            fail_msg("case %zu: %s", i, err.msg);
        if (oh != cases[i].oh || ow != cases[i].ow || b != cases[i].branch)
            fail_msg("case %zu: %ux%u → %ux%u (branch %d), transformers %ux%u (branch %d)", i,
                     cases[i].h, cases[i].w, oh, ow, (int)b, cases[i].oh, cases[i].ow,
                     (int)cases[i].branch);
    }
    /* refusals: aspect ratio over 200 either way, zero sizes and parameters */
    uint32_t oh = 7, ow = 7;
    struct mmrt_error err = {0};
    assert_int_equal(mmrt_preprocess_smart_resize(1, 201, 28, 3136, 1003520, &oh, &ow, NULL,
                                                  &err), MMRT_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "absolute aspect ratio must be smaller than 200, got 201"));
    assert_int_equal(mmrt_preprocess_smart_resize(5000, 20, 28, 3136, 1003520, &oh, &ow, NULL,
                                                  &err), MMRT_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "got 250"));
    assert_int_equal(mmrt_preprocess_smart_resize(0, 20, 28, 3136, 1003520, &oh, &ow, NULL,
                                                  &err), MMRT_ERR_INVALID_ARG);
    assert_int_equal(mmrt_preprocess_smart_resize(20, 20, 0, 3136, 1003520, &oh, &ow, NULL,
                                                  &err), MMRT_ERR_INVALID_ARG);
    assert_int_equal(mmrt_preprocess_smart_resize(20, 20, 28, 0, 1003520, &oh, &ow, NULL,
                                                  &err), MMRT_ERR_INVALID_ARG);
    assert_int_equal(oh, 7); /* outputs untouched on failure */
    assert_int_equal(ow, 7);
}

/* Patch order of models.md §4.4 on an image whose pixels name their own coordinates: no
 * resize, no rescale or normalize, so each value is the source pixel's R (= x) or G (= y). */
static void test_qwen2vl_patches(void **state)
{
    (void)state;
    struct mmrt_qwen2vl_preprocess_config cfg;
    mmrt_qwen2vl_preprocess_config_default(&cfg);
    cfg.do_resize = false;
    cfg.norm.do_rescale = false;
    cfg.norm.do_normalize = false;
    const uint32_t W = 112, H = 56, P = 14, T = 2, M = 2;
    struct mmrt_image *img = NULL;
    assert_int_equal(mmrt_image_create(W, H, &img, NULL), MMRT_OK);
    for (uint32_t y = 0; y < H; y++)
        for (uint32_t x = 0; x < W; x++) {
            img->pixels[(y * W + x) * 3] = (uint8_t)x;
            img->pixels[(y * W + x) * 3 + 1] = (uint8_t)y;
            img->pixels[(y * W + x) * 3 + 2] = 7;
        }
    const uint32_t gh = H / P, gw = W / P, K = 3 * T * P * P;
    float *out = malloc((size_t)gh * gw * K * sizeof *out);
    assert_non_null(out);
    int32_t grid[3] = {0, 0, 0};
    struct mmrt_error err = {0};
    assert_int_equal(mmrt_preprocess_qwen2vl(img, &cfg, out, (size_t)gh * gw * K, grid, &err),
                     MMRT_OK);
    assert_int_equal(grid[0], 1);
    assert_int_equal(grid[1], 4);
    assert_int_equal(grid[2], 8);
    uint32_t k = 0;
    for (uint32_t br = 0; br < gh / M; br++)
        for (uint32_t bc = 0; bc < gw / M; bc++)
            for (uint32_t mh = 0; mh < M; mh++)
                for (uint32_t mw = 0; mw < M; mw++, k++) {
                    const float *p = out + (size_t)k * K;
                    const uint32_t x0 = (bc * M + mw) * P, y0 = (br * M + mh) * P;
                    for (uint32_t t = 0; t < T; t++)
                        for (uint32_t py = 0; py < P; py++)
                            for (uint32_t px = 0; px < P; px++) {
                                const size_t o = ((size_t)t * P + py) * P + px;
                                assert_true(p[o] == (float)(x0 + px));                /* R */
                                assert_true(p[T * P * P + o] == (float)(y0 + py));     /* G */
                                assert_true(p[2 * T * P * P + o] == 7.0f);             /* B */
                            }
                }
    /* Without a resize the sides must be multiples of patch × merge. */
    struct mmrt_image *odd = NULL;
    assert_int_equal(mmrt_image_create(42, 28, &odd, NULL), MMRT_OK);
    assert_int_equal(mmrt_preprocess_qwen2vl(odd, &cfg, out, (size_t)gh * gw * K, grid, &err),
                     MMRT_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "multiples of 28"));
    /* An output too small is refused before anything is written. */
    cfg.do_resize = true;
    assert_int_equal(mmrt_preprocess_qwen2vl(img, &cfg, out, 10, grid, &err),
                     MMRT_ERR_INVALID_ARG);
    mmrt_image_destroy(odd);
    mmrt_image_destroy(img);
    free(out);
}

static void test_qwen2vl_config_json(void **state)
{
    (void)state;
    struct mmrt_qwen2vl_preprocess_config cfg, def;
    mmrt_qwen2vl_preprocess_config_default(&def);
    assert_int_equal(def.min_pixels, 3136);
    assert_int_equal(def.max_pixels, 1003520);
    struct mmrt_error err = {0};
    json_t *j = parse("{}");
    assert_int_equal(mmrt_qwen2vl_preprocess_config_from_json(j, "p.json", &cfg, &err), MMRT_OK);
    assert_memory_equal(&cfg, &def, sizeof cfg);
    json_decref(j);
    /* transformers 5's processor_config.json image_processor */
    j = parse("{\"size\": {\"longest_edge\": 9408, \"shortest_edge\": 3920}, \"resample\": 3,"
              " \"patch_size\": 7, \"merge_size\": 2, \"temporal_patch_size\": 2,"
              " \"image_processor_type\": \"Qwen2VLImageProcessor\"}");
    assert_int_equal(mmrt_qwen2vl_preprocess_config_from_json(j, "p.json", &cfg, &err), MMRT_OK);
    assert_int_equal(cfg.min_pixels, 3920);
    assert_int_equal(cfg.max_pixels, 9408);
    assert_int_equal(cfg.patch_size, 7);
    json_decref(j);
    /* hub preprocessor_config.json: top-level min/max_pixels override size */
    j = parse("{\"min_pixels\": 784, \"max_pixels\": 12845056, \"size\": {\"shortest_edge\": 1,"
              " \"longest_edge\": 2}, \"do_normalize\": false}");
    assert_int_equal(mmrt_qwen2vl_preprocess_config_from_json(j, "p.json", &cfg, &err), MMRT_OK);
    assert_int_equal(cfg.min_pixels, 784);
    assert_int_equal(cfg.max_pixels, 12845056);
    assert_false(cfg.norm.do_normalize);
    json_decref(j);

    static const struct {
        const char *json, *needle;
        mmrt_status st;
    } bad[] = {
        {"{\"size\": {\"shortest_edge\": 10}}", "longest_edge", MMRT_ERR_FORMAT},
        {"{\"size\": 300}", "\"size\"", MMRT_ERR_FORMAT},
        {"{\"size\": {\"shortest_edge\": 0, \"longest_edge\": 9}}", "shortest_edge",
         MMRT_ERR_FORMAT},
        {"{\"max_pixels\": 1e9}", "max_pixels", MMRT_ERR_FORMAT},
        {"{\"max_pixels\": 100000000}", "max_pixels", MMRT_ERR_FORMAT},
        {"{\"min_pixels\": -5}", "min_pixels", MMRT_ERR_FORMAT},
        {"{\"patch_size\": 0}", "patch_size", MMRT_ERR_FORMAT},
        {"{\"merge_size\": 17}", "merge_size", MMRT_ERR_FORMAT},
        {"{\"temporal_patch_size\": \"2\"}", "temporal_patch_size", MMRT_ERR_FORMAT},
        {"{\"resample\": 0}", "nearest", MMRT_ERR_UNSUPPORTED},
        {"{\"rescale_factor\": 0}", "rescale_factor", MMRT_ERR_FORMAT},
        {"{\"image_std\": [0.1, 0, 0.3]}", "image_std", MMRT_ERR_FORMAT},
        {"{\"do_resize\": 1}", "do_resize", MMRT_ERR_FORMAT},
        {"[]", "object", MMRT_ERR_FORMAT},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        j = parse(bad[i].json);
        memset(&cfg, 0xAB, sizeof cfg);
        struct mmrt_qwen2vl_preprocess_config before = cfg;
        mmrt_status st = mmrt_qwen2vl_preprocess_config_from_json(j, "p.json", &cfg, &err);
        if (st != bad[i].st || !strstr(err.msg, bad[i].needle) || !strstr(err.msg, "p.json"))
            fail_msg("%s: %s \"%s\"", bad[i].json, mmrt_status_name(st), err.msg);
        assert_memory_equal(&cfg, &before, sizeof cfg); /* untouched */
        json_decref(j);
    }
}

/* FuyuImageProcessor's settings: class defaults, the hub keys, and each refusal by name with
 * the output untouched. */
static void test_fuyu_config_json(void **state)
{
    (void)state;
    struct mmrt_fuyu_preprocess_config cfg;
    struct mmrt_error err = {0};
    json_t *j = parse("{}");
    assert_int_equal(mmrt_fuyu_preprocess_config_from_json(j, "p.json", 30, &cfg, &err),
                     MMRT_OK);
    assert_true(cfg.do_resize);
    assert_int_equal(cfg.target_h, 1080);
    assert_int_equal(cfg.target_w, 1920);
    assert_int_equal(cfg.patch, 30);
    assert_int_equal(cfg.filter, MMRT_RESAMPLE_BILINEAR);
    assert_int_equal(cfg.pad_value, 1);
    assert_true(cfg.norm.mean[2] == 0.5 && cfg.norm.std[0] == 0.5);
    json_decref(j);
    j = parse("{\"size\": {\"height\": 60, \"width\": 90}, \"patch_size\": {\"height\": 30,"
              " \"width\": 30}, \"resample\": 3, \"padding_value\": 0, \"image_mean\": [0.1,"
              " 0.2, 0.3], \"image_std\": 2}");
    assert_int_equal(mmrt_fuyu_preprocess_config_from_json(j, "p.json", 30, &cfg, &err),
                     MMRT_OK);
    assert_int_equal(cfg.target_h, 60);
    assert_int_equal(cfg.target_w, 90);
    assert_int_equal(cfg.filter, MMRT_RESAMPLE_BICUBIC);
    assert_int_equal(cfg.pad_value, 0);
    assert_true(cfg.norm.mean[1] == 0.2 && cfg.norm.std[2] == 2.0);
    json_decref(j);

    static const struct {
        const char *json, *needle;
        mmrt_status st;
    } bad[] = {
        {"{\"resample\": 0}", "nearest", MMRT_ERR_UNSUPPORTED},
        {"{\"resample\": 6}", "resample", MMRT_ERR_FORMAT},
        {"{\"size\": {\"height\": 50, \"width\": 90}}", "multiple", MMRT_ERR_FORMAT},
        {"{\"patch_size\": {\"height\": 15, \"width\": 15}}", "patch_size", MMRT_ERR_FORMAT},
        {"{\"size\": 1080}", "size", MMRT_ERR_FORMAT},
        {"{\"do_pad\": false}", "do_pad", MMRT_ERR_UNSUPPORTED},
        {"{\"padding_value\": 0.5}", "padding_value", MMRT_ERR_UNSUPPORTED},
        {"{\"image_std\": [0.5, 0, 0.5]}", "image_std", MMRT_ERR_FORMAT},
        {"{\"image_mean\": [0.5, 0.5]}", "image_mean", MMRT_ERR_FORMAT},
        {"[]", "object", MMRT_ERR_FORMAT},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        j = parse(bad[i].json);
        memset(&cfg, 0xAB, sizeof cfg);
        struct mmrt_fuyu_preprocess_config before = cfg;
        mmrt_status st = mmrt_fuyu_preprocess_config_from_json(j, "p.json", 30, &cfg, &err);
        if (st != bad[i].st || !strstr(err.msg, bad[i].needle) || !strstr(err.msg, "p.json"))
            fail_msg("%s: %s \"%s\"", bad[i].json, mmrt_status_name(st), err.msg);
        assert_memory_equal(&cfg, &before, sizeof cfg); /* untouched */
        json_decref(j);
    }
}

/* Every allocation of a Qwen2-VL preprocess may fail: clean error, output untouched. */
static void test_qwen2vl_allocation_failure_sweep(void **state)
{
    (void)state;
    struct mmrt_image *img = load("rgb_80x60.png");
    struct mmrt_qwen2vl_preprocess_config cfg;
    mmrt_qwen2vl_preprocess_config_default(&cfg);
    cfg.min_pixels = 3920;
    cfg.max_pixels = 9408; /* 80×60 → 84×56 */
    const size_t n = (size_t)24 * 3 * 2 * 14 * 14;
    float *ref = malloc(n * sizeof *ref), *out = malloc(n * sizeof *out);
    int32_t grid[3];
    struct mmrt_error err = {0};
    assert_int_equal(mmrt_preprocess_qwen2vl(img, &cfg, ref, n, grid, &err), MMRT_OK);
    assert_int_equal(grid[1] * grid[2], 24);
    long live0 = alloc_live(), k;
    for (k = 1; k < 200; k++) {
        memset(out, 0x7f, n * sizeof *out);
        alloc_fail_at(k);
        mmrt_status st = mmrt_preprocess_qwen2vl(img, &cfg, out, n, grid, &err);
        int fired = alloc_fail_fired();
        alloc_fail_at(0);
        if (!fired) {
            assert_int_equal(st, MMRT_OK);
            assert_memory_equal(out, ref, n * sizeof *out);
            break;
        }
        assert_int_equal(st, MMRT_ERR_NO_MEMORY);
        assert_int_equal(alloc_live(), live0);
        for (size_t i = 0; i < n; i++) /* written only on success */
            assert_true(((const uint32_t *)(const void *)out)[i] == 0x7f7f7f7fu);
    }
    assert_true(k > 2 && k < 200);
    free(ref);
    free(out);
    mmrt_image_destroy(img);
}

/* Every allocation of a CLIP preprocess may fail: clean error, output untouched, no leak. */
static void test_allocation_failure_sweep(void **state)
{
    (void)state;
    struct mmrt_image *img = load("rgb_80x60.png");
    struct mmrt_clip_preprocess_config cfg;
    mmrt_clip_preprocess_config_default(&cfg);
    cfg.shortest_edge = 56;
    cfg.crop_width = cfg.crop_height = 56;
    const size_t n = 3 * 56 * 56;
    float *ref = malloc(n * sizeof *ref), *out = malloc(n * sizeof *out);
    struct mmrt_error err = {0};
    assert_int_equal(mmrt_preprocess_clip(img, &cfg, ref, n, &err), MMRT_OK);
    long live0 = alloc_live(), k;
    for (k = 1; k < 200; k++) {
        memset(out, 0x7f, n * sizeof *out);
        alloc_fail_at(k);
        mmrt_status st = mmrt_preprocess_clip(img, &cfg, out, n, &err);
        int fired = alloc_fail_fired();
        alloc_fail_at(0);
        if (!fired) {
            assert_int_equal(st, MMRT_OK);
            assert_memory_equal(out, ref, n * sizeof *out);
            break;
        }
        assert_int_equal(st, MMRT_ERR_NO_MEMORY);
        assert_int_equal(alloc_live(), live0);
        for (size_t i = 0; i < n; i++) /* written only on success */
            assert_true(((const uint32_t *)(const void *)out)[i] == 0x7f7f7f7fu);
    }
    assert_true(k > 3 && k < 200);
    free(ref);
    free(out);
    mmrt_image_destroy(img);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_resize_matches_pil),
        cmocka_unit_test(test_resize_window),
        cmocka_unit_test(test_shortest_edge_size),
        cmocka_unit_test(test_clip_matches_transformers),
        cmocka_unit_test(test_degenerate_sizes),
        cmocka_unit_test(test_center_crop_and_pad),
        cmocka_unit_test(test_to_chw_and_patchify),
        cmocka_unit_test(test_invalid_arguments),
        cmocka_unit_test(test_config_json),
        cmocka_unit_test(test_allocation_failure_sweep),
        cmocka_unit_test(test_smart_resize),
        cmocka_unit_test(test_qwen2vl_patches),
        cmocka_unit_test(test_qwen2vl_config_json),
        cmocka_unit_test(test_fuyu_config_json),
        cmocka_unit_test(test_qwen2vl_allocation_failure_sweep),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
