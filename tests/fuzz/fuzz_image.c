/*
 * tests/fuzz/fuzz_image.c — libFuzzer target for core/formats/image.c and core/preprocess.c.
 *
 * The input is a whole PNG or JPEG file. It is decoded under a small pixel limit (so a header
 * cannot make the fuzzer allocate gigabytes) with EXIF orientation on; a refused input must
 * leave the output NULL and give a one-line message. An accepted image has every pixel read
 * and goes through the CLIP preprocessing at a tiny size (shortest edge 7, crop 5), which
 * exercises resize, crop and normalisation on whatever dimensions the decoder produced.
 * Invariants are checked with __builtin_trap(), which libFuzzer reports as a crash.
 *
 * The same entry point is linked into the normal build with replay_main.c, so the committed
 * corpus (tests/fuzz/corpus/image) runs as a ctest everywhere.
 */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "formats/image.h"
#include "preprocess.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static volatile uint8_t g_sink;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct mmrt_image_limits lim;
    mmrt_image_limits_default(&lim);
    lim.max_pixels = 1u << 20;
    lim.max_jpeg_scans = 32;
    struct mmrt_image *img = NULL;
    struct mmrt_error err = {0};
    if (mmrt_image_decode(data, size, "fuzz", &lim, &img, &err) != MMRT_OK) {
        size_t len = strnlen(err.msg, sizeof err.msg);
        if (img != NULL || len == 0 || len == sizeof err.msg || memchr(err.msg, '\n', len))
            __builtin_trap();
        return 0;
    }
    if (!img || !img->width || !img->height ||
        (uint64_t)img->width * img->height > lim.max_pixels)
        __builtin_trap();
    uint8_t acc = 0;
    for (size_t i = 0; i < (size_t)img->width * img->height * 3; i++)
        acc ^= img->pixels[i];
    g_sink = acc;
    struct mmrt_clip_preprocess_config cfg;
    mmrt_clip_preprocess_config_default(&cfg);
    cfg.shortest_edge = 7;
    cfg.crop_width = cfg.crop_height = 5;
    float out[3 * 5 * 5];
    if (mmrt_preprocess_clip(img, &cfg, out, sizeof out / sizeof out[0], &err) != MMRT_OK)
        __builtin_trap(); /* any decoded image must preprocess */
    for (size_t i = 0; i < sizeof out / sizeof out[0]; i++)
        if (!isfinite(out[i]))
            __builtin_trap();
    mmrt_image_destroy(img);
    return 0;
}
