/*
 * tests/test_quantize_tool.c — mmrt-quantize and checkpoints stored quantized
 * (docs/QUANTIZATION.md "Checkpoint layout").
 *
 *   - The demo model written as int8, int4 (g128) and int4-g32 by the tool gives, on every
 *     held-out item run, the tokens and the image features (bit for bit) of the same model
 *     quantized at load ([model] weights), and its codes are mapped in place on the CPU.
 *   - Hostile or broken files are refused by name before anything runs: a zero point that is
 *     not a whole number 0 … 15, a scale tensor of another shape, codes where a float weight
 *     belongs, a quantization_config of another method or width, a missing scale tensor.
 *   - Mixed formats (an INT8 vision side, an INT4 language model) and the report: every
 *     matrix ranked once, the top ones kept as stored, the rest in its side's codes.
 *   - The tool refuses an existing output directory and unknown formats, and leaves nothing
 *     behind when it fails.
 */
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
#include <jansson.h>

#include "golden.h"
#include "mmrt/mmrt.h"
#include "request_util.h"
#include "tool_run.h"
#include "vision_cache.h"
#include "weights.h"

static char g_tmp[256];
static char g_err[1 << 14];

static int setup(void **state)
{
    (void)state;
    snprintf(g_tmp, sizeof g_tmp, "/tmp/mmrt_quantize_XXXXXX");
    return mkdtemp(g_tmp) ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_tmp);
    return system(cmd) == 0 ? 0 : -1;
}

/* Runs bin/mmrt-quantize with args (NULL-terminated), stderr into g_err; its exit status. */
static int run_tool(const char *const *args)
{
    return tool_run("mmrt-quantize", args, g_tmp, NULL, 0, g_err, sizeof g_err);
}

static void demo_dir(char *buf, size_t size, const char *rel)
{
    snprintf(buf, size, "%s/demo/%s", golden_src_dir(), rel);
}

/* Writes the demo model quantized as `format` into g_tmp/<name>. */
static void quantize_demo(const char *format, const char *name, char *out, size_t size)
{
    char model[4096];
    demo_dir(model, sizeof model, "llava-shapes");
    snprintf(out, size, "%s/%s", g_tmp, name);
    const char *args[] = { "--model", model, "--out", out, "--weights", format, NULL };
    if (run_tool(args) != 0)
        fail_msg("mmrt-quantize --weights %s: %s", format, g_err);
    assert_non_null(strstr(g_err, "matrices quantized"));
}

static struct mmrt_runtime *open_rt(const char *dir, enum mmrt_weight_format weights,
                                    mmrt_status want, const char *part)
{
    char err[2048] = "";
    struct mmrt_device_config dev = { .name = "cpu0", .plugin = "cpu", .pool_mb = 64 };
    struct mmrt_config cfg = { .struct_size = sizeof cfg, .model_path = dir, .devices = &dev,
                               .n_devices = 1, .weights = weights,
                               .vision_cache_entries = -1 };
    struct mmrt_runtime *rt = NULL;
    const mmrt_status st = mmrt_create(&cfg, &rt, err, sizeof err);
    if (st != want)
        fail_msg("%s: status %d, expected %d: %s", dir, st, want, err);
    if (part && !strstr(err, part))
        fail_msg("%s: \"%s\" does not say \"%s\"", dir, err, part);
    return rt;
}

/* The tool's checkpoint against the same model quantized at load: features by memcmp and
 * tokens, on the first 24 held-out items; and the codes mapped in place. */
static void same_as_at_load(const char *format, enum mmrt_weight_format f)
{
    char out[512], model[4096], imgs[4096];
    quantize_demo(format, format, out, sizeof out);
    demo_dir(model, sizeof model, "llava-shapes");
    demo_dir(imgs, sizeof imgs, "heldout");
    struct mmrt_runtime *at_load = open_rt(model, f, MMRT_OK, NULL);
    struct mmrt_runtime *stored = open_rt(out, MMRT_WEIGHTS_CHECKPOINT, MMRT_OK, NULL);
    for (int i = 0; i < 24; i++) {
        char path[4200];
        snprintf(path, sizeof path, "%s/%03d.png", imgs, i);
        struct mmrt_request req = { .struct_size = sizeof req, .prompt = "Describe the picture.",
                                    .images = TEST_FILE(path), .n_images = 1, .max_tokens = 20,
                                    .top_p = 1.0f };
        struct mmrt_vision_output a, b;
        struct mmrt_error e = { 0 };
        assert_int_equal(mmrt_runtime_vision(at_load, &req, &a, &e), MMRT_OK);
        assert_int_equal(mmrt_runtime_vision(stored, &req, &b, &e), MMRT_OK);
        assert_int_equal(a.n_tokens, b.n_tokens);
        if (memcmp(a.features, b.features, (size_t)(a.n_tokens * a.dim) * sizeof(float)) != 0)
            fail_msg("%s, item %d: image features differ from the model quantized at load",
                     format, i);
        mmrt_vision_output_free(&a);
        mmrt_vision_output_free(&b);
        struct tokens ta = { 0 }, tb = { 0 };
        struct mmrt_result ra = { .struct_size = sizeof ra }, rb = { .struct_size = sizeof rb };
        assert_int_equal(mmrt_run(at_load, &req, test_collect, &ta, &ra), MMRT_OK);
        assert_int_equal(mmrt_run(stored, &req, test_collect, &tb, &rb), MMRT_OK);
        assert_int_equal(ta.n, tb.n);
        assert_memory_equal(ta.ids, tb.ids, (size_t)ta.n * sizeof ta.ids[0]);
    }
    struct mmrt_memory_report ma = { .struct_size = sizeof ma }, mb = { .struct_size = sizeof mb };
    assert_int_equal(mmrt_device_memory(at_load, 0, &ma), MMRT_OK);
    assert_int_equal(mmrt_device_memory(stored, 0, &mb), MMRT_OK);
    /* The same weight bytes; at load the codes are copies, stored they are the file's: what
     * the stored checkpoint maps more is exactly what it copies less (what stays copied in
     * both is the few tensors converted to F32 for the ops that want them). */
    assert_int_equal(ma.weight_bytes, mb.weight_bytes);
    assert_true(mb.weight_mapped_bytes > ma.weight_mapped_bytes);
    assert_int_equal(mb.weight_mapped_bytes - ma.weight_mapped_bytes,
                     ma.weight_copied_bytes - mb.weight_copied_bytes);
    mmrt_destroy(stored);
    mmrt_destroy(at_load);
}

static void test_int8_as_at_load(void **state)
{
    (void)state;
    same_as_at_load("int8", MMRT_WEIGHTS_INT8);
}

static void test_int4_as_at_load(void **state)
{
    (void)state;
    same_as_at_load("int4", MMRT_WEIGHTS_INT4);
    same_as_at_load("int4-g32", MMRT_WEIGHTS_INT4_G32);
}

/* ---- broken files ---- */

/* A fresh copy of the int4 checkpoint under name. */
static void copy_of(const char *src, const char *name, char *dst, size_t size)
{
    snprintf(dst, size, "%s/%s", g_tmp, name);
    char cmd[1400];
    snprintf(cmd, sizeof cmd, "cp -r '%s' '%s'", src, dst);
    assert_int_equal(system(cmd), 0);
}

static void set_config(const char *dir, const char *key, json_t *value)
{
    char path[1200];
    snprintf(path, sizeof path, "%s/config.json", dir);
    json_error_t je;
    json_t *c = json_load_file(path, 0, &je);
    assert_non_null(c);
    json_object_set_new(json_object_get(c, "quantization_config"), key, value);
    assert_int_equal(json_dump_file(c, path, JSON_INDENT(1)), 0);
    json_decref(c);
}

static void test_broken_files_refused_by_name(void **state)
{
    (void)state;
    char q4[512], bad[600];
    quantize_demo("int4", "base", q4, sizeof q4);
    const char *zname = "language_model.model.layers.1.mlp.up_proj.weight_zero";
    const long zoff = golden_st_offset(q4, zname);

    /* A zero point of 16, and one of 2.5. */
    static const float zs[] = { 16.0f, 2.5f };
    for (size_t i = 0; i < 2; i++) {
        char name[32];
        snprintf(name, sizeof name, "zero%zu", i);
        copy_of(q4, name, bad, sizeof bad);
        golden_st_write(bad, zoff + 4 * 7, &zs[i], sizeof zs[i]);
        open_rt(bad, MMRT_WEIGHTS_CHECKPOINT, MMRT_ERR_FORMAT,
                "'language_model.model.layers.1.mlp.up_proj.weight_zero' holds ");
    }
    /* Scales of another shape (the same element count, so the file itself is valid). */
    copy_of(q4, "shape", bad, sizeof bad);
    golden_st_replace(bad, "\"language_model.model.layers.1.mlp.up_proj.weight_scale\"",
                      "\"shape\":[384,1]", "\"shape\":[1,384]");
    open_rt(bad, MMRT_WEIGHTS_CHECKPOINT, MMRT_ERR_FORMAT, "up_proj.weight_scale");
    /* Codes where float values belong: a matrix's F32 scales [384, 1] relabelled I8
     * [384, 4] (the same 1536 bytes, so the file itself is valid). */
    copy_of(q4, "codes", bad, sizeof bad);
    golden_st_replace(bad, "\"language_model.model.layers.1.mlp.up_proj.weight_scale\"",
                      "\"dtype\":\"F32\",\"shape\":[384,1]", "\"dtype\":\"I8\", \"shape\":[384,4]");
    open_rt(bad, MMRT_WEIGHTS_CHECKPOINT, MMRT_ERR_FORMAT,
            "'language_model.model.layers.1.mlp.up_proj.weight_scale' holds I8 codes");
    /* A missing scale tensor: its name changed to one nothing reads. */
    copy_of(q4, "noscale", bad, sizeof bad);
    golden_st_replace(bad, "\"language_model.model.layers.1.mlp.up_proj.weight_scale\"",
                      "weight_scale", "weight_scalX");
    open_rt(bad, MMRT_WEIGHTS_CHECKPOINT, MMRT_ERR_FORMAT,
            "has no 'language_model.layers.1.mlp.up_proj.weight_scale'");
    /* Another method, another width, no method. */
    static const struct {
        const char *key, *value, *part;
    } cfgs[] = {
        { "quant_method", "exl2", "quantization_config.quant_method \"exl2\" is not supported" },
        { "weights", "int3", "quantization_config.weights \"int3\" is not one mmrt runs" },
        { "quant_method", NULL, "quantization_config.quant_method (missing)" },
    };
    for (size_t i = 0; i < sizeof cfgs / sizeof cfgs[0]; i++) {
        char name[32];
        snprintf(name, sizeof name, "cfg%zu", i);
        copy_of(q4, name, bad, sizeof bad);
        set_config(bad, cfgs[i].key, cfgs[i].value ? json_string(cfgs[i].value) : NULL);
        if (!cfgs[i].value) {
            char path[700];
            snprintf(path, sizeof path, "%s/config.json", bad);
            json_error_t je;
            json_t *c = json_load_file(path, 0, &je);
            json_object_del(json_object_get(c, "quantization_config"), "quant_method");
            assert_int_equal(json_dump_file(c, path, 0), 0);
            json_decref(c);
        }
        open_rt(bad, MMRT_WEIGHTS_CHECKPOINT, MMRT_ERR_UNSUPPORTED, cfgs[i].part);
    }
}

/* An INT8 vision side beside an INT4 language model, the two matrices the report ranks most
 * sensitive kept as stored: the report ranks every matrix once, the kept ones are the
 * report's first two and stay float in the file, every other matrix has its side's codes,
 * and the checkpoint runs. */
static void test_mixed_formats_and_report(void **state)
{
    (void)state;
    char model[4096], calib[600], out[600], cmd[14000];
    demo_dir(model, sizeof model, "llava-shapes");
    snprintf(calib, sizeof calib, "%s/calib", g_tmp);
    snprintf(out, sizeof out, "%s/mixed", g_tmp);
    snprintf(cmd, sizeof cmd, "mkdir '%s' && cp '%s/../heldout/000.png' '%s/../heldout/001.png' "
             "'%s/../heldout/002.png' '%s'", calib, model, model, model, calib);
    assert_int_equal(system(cmd), 0);
    static char report[1 << 16];
    const char *args[] = { "--model", model, "--out", out, "--weights", "int4",
                           "--vision-weights", "int8", "--keep-float-top", "2", "--report",
                           "--calib", calib, NULL };
    if (tool_run("mmrt-quantize", args, g_tmp, report, sizeof report, g_err, sizeof g_err))
        fail_msg("mmrt-quantize: %s", g_err);
    /* the ranking: one line per matrix, the first two kept */
    char kept[2][256] = { "", "" };
    int lines = 0, n_kept = 0;
    for (char *l = strtok(report, "\n"); l; l = strtok(NULL, "\n")) {
        if (strstr(l, ".weight ") && (strstr(l, "language_model.") || strstr(l, "vision_tower.") ||
                                      strstr(l, "multi_modal_projector.") || strstr(l, "lm_head")))
            lines++;
        if (strstr(l, "(kept as stored)") && n_kept < 2)
            sscanf(l, "%255s", kept[n_kept++]);
        if (strncmp(l, "all together", 12) == 0)
            assert_non_null(strstr(l, "2 kept as stored"));
    }
    assert_int_equal(n_kept, 2);
    /* every quantized matrix X (it has X_scale) holds its side's codes; the kept two are
     * float and have none */
    json_t *h = golden_st_header(out, NULL);
    int quantized = 0, floats = 0;
    const char *key;
    json_t *e;
    json_object_foreach(h, key, e) {
        const char *dt = json_string_value(json_object_get(e, "dtype"));
        char canon[1100], scale[1200];
        mmrt_weights_canonical_name(key, false, canon, sizeof canon);
        snprintf(scale, sizeof scale, "%s_scale", key);
        const bool has_scale = json_object_get(h, scale) != NULL;
        if (strcmp(canon, kept[0]) == 0 || strcmp(canon, kept[1]) == 0) {
            assert_string_equal(dt, "F16");
            assert_false(has_scale);
            floats++;
        } else if (has_scale) {
            const bool vision = strncmp(canon, "vision_tower.", 13) == 0 ||
                                strncmp(canon, "multi_modal_projector.", 22) == 0;
            if (strcmp(dt, vision ? "I8" : "U8") != 0)
                fail_msg("%s is %s, expected %s", key, dt, vision ? "I8" : "U8");
            quantized++;
        }
    }
    json_decref(h);
    assert_int_equal(floats, 2);
    assert_int_equal(quantized + floats, lines);
    struct mmrt_runtime *rt = open_rt(out, MMRT_WEIGHTS_CHECKPOINT, MMRT_OK, NULL);
    char img[700];
    snprintf(img, sizeof img, "%s/000.png", calib);
    struct mmrt_request req = { .struct_size = sizeof req, .prompt = "Describe the picture.",
                                .images = TEST_FILE(img), .n_images = 1, .max_tokens = 20,
                                .top_p = 1.0f };
    struct tokens t = { 0 };
    struct mmrt_result res = { .struct_size = sizeof res };
    assert_int_equal(mmrt_run(rt, &req, test_collect, &t, &res), MMRT_OK);
    assert_true(t.n > 2);
    mmrt_destroy(rt);
}

/* The tool's own refusals: an output that exists, an unknown format, a checkpoint that is
 * quantized already; none leaves a directory behind. */
static void test_tool_refusals(void **state)
{
    (void)state;
    char model[4096], out[512], again[600];
    demo_dir(model, sizeof model, "llava-shapes");
    quantize_demo("int8", "once", out, sizeof out);
    const char *exists[] = { "--model", model, "--out", out, NULL };
    assert_int_equal(run_tool(exists), 2);
    assert_non_null(strstr(g_err, "exists"));
    snprintf(again, sizeof again, "%s/new", g_tmp);
    const char *unknown[] = { "--model", model, "--out", again, "--weights", "int3", NULL };
    assert_int_equal(run_tool(unknown), 2);
    assert_non_null(strstr(g_err, "'int3'"));
    const char *twice[] = { "--model", out, "--out", again, NULL };
    assert_int_equal(run_tool(twice), 1);
    assert_non_null(strstr(g_err, "quantized already"));
    struct stat sb;
    assert_int_not_equal(stat(again, &sb), 0);
}

int main(void)
{
    mmrt_set_log_sink(golden_quiet, NULL, MMRT_LOG_WARN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_int8_as_at_load),
        cmocka_unit_test(test_int4_as_at_load),
        cmocka_unit_test(test_broken_files_refused_by_name),
        cmocka_unit_test(test_mixed_formats_and_report),
        cmocka_unit_test(test_tool_refusals),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
