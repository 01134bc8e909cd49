/*
 * tools/bench/vision_batch.c — mmrt-vision-batch: the vision stages of N requests run one
 * tower pass per image against shared passes ([scheduler] vision_batch; docs/ENGINE.md "The
 * vision stage"), alternating within each round so both meet the same machine.
 *
 *   mmrt-vision-batch [--plugin NAME] MODEL_DIR ROUNDS IMAGE...   (2 … 32 images)
 *
 * Each round times mmrt_runtime_vision_batch (what the worker and mmrt_run_batch call) on a
 * runtime with vision_batch 1 and on one with vision_batch N, both on one device of the
 * plugin (default cpu; tools/gpu-check.sh runs it on cuda) with the
 * vision cache off, and prints the milliseconds per image. The first round also pays the
 * first touch of each pool's pages: read the later ones.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "mmrt/mmrt.h"
#include "vision_cache.h"

#define MAX_IMAGES 32

static double now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

int main(int argc, char **argv)
{
    const char *plugin = "cpu";
    if (argc > 2 && strcmp(argv[1], "--plugin") == 0) {
        plugin = argv[2];
        argv += 2;
        argc -= 2;
    }
    if (argc < 5 || argc - 3 > MAX_IMAGES) {
        fprintf(stderr, "usage: mmrt-vision-batch [--plugin NAME] MODEL_DIR ROUNDS IMAGE... "
                        "(2 … %d images)\n", MAX_IMAGES);
        return 2;
    }
    const char *dir = argv[1];
    const int rounds = atoi(argv[2]), n = argc - 3;
    if (rounds < 1) {
        fprintf(stderr, "mmrt-vision-batch: ROUNDS '%s': expected a positive integer\n",
                argv[2]);
        return 2;
    }
    struct mmrt_image_input in[MAX_IMAGES];
    struct mmrt_request req[MAX_IMAGES];
    for (int i = 0; i < n; i++) {
        in[i] = (struct mmrt_image_input){ .path = argv[3 + i] };
        req[i] = (struct mmrt_request){ .struct_size = sizeof req[i], .prompt = "Describe.",
                                        .images = &in[i], .n_images = 1, .max_tokens = 1,
                                        .top_p = 1.0f };
    }
    struct mmrt_runtime *rt[2] = { NULL, NULL };
    int rc = 0;
    for (int k = 0; k < 2 && rc == 0; k++) {
        struct mmrt_device_config dev = { .name = "dev0", .plugin = plugin };
        const struct mmrt_config cfg = { .struct_size = sizeof cfg, .model_path = dir,
                                         .devices = &dev, .n_devices = 1,
                                         .vision_cache_entries = -1, .max_kv_tokens = 2048,
                                         .vision_batch = k ? n : 1 };
        char err[1024];
        if (mmrt_create(&cfg, &rt[k], err, sizeof err) != MMRT_OK) {
            fprintf(stderr, "mmrt-vision-batch: %s\n", err);
            rc = 1;
        }
    }
    struct mmrt_vision_output out[MAX_IMAGES];
    mmrt_status sts[MAX_IMAGES];
    static struct mmrt_error errs[MAX_IMAGES];
    for (int r = 0; r < rounds && rc == 0; r++) {
        for (int k = 0; k < 2 && rc == 0; k++) {
            const double t = now_ms();
            mmrt_runtime_vision_batch(rt[k], req, n, out, sts, errs);
            const double ms = now_ms() - t;
            for (int i = 0; i < n; i++) {
                if (sts[i] != MMRT_OK) {
                    fprintf(stderr, "mmrt-vision-batch: %s: %s\n", argv[3 + i], errs[i].msg);
                    rc = 1;
                }
                mmrt_vision_output_free(&out[i]);
            }
            printf("round %d, vision_batch %2d: %d images in %.0f ms, %.1f ms per image\n",
                   r + 1, k ? n : 1, n, ms, ms / n);
        }
    }
    mmrt_destroy(rt[0]);
    mmrt_destroy(rt[1]);
    return rc;
}
