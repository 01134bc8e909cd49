/*
 * tests/test_loader.c — the plugin loader, devices, pools and op dispatch, driven through
 * the recording stub plugin and its deliberately broken variants (tests/plugins/).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "alloc_fail.h"
#include "device.h"
#include "mmrt/mmrt.h"
#include "ops.h"
#include "plugin_loader.h"
#include "quant.h"

/* ---- a log sink that keeps every line, so tests can read the stub's call record ---- */
static char logbuf[1 << 16];
static size_t loglen;

static void capture(void *user, enum mmrt_log_level level, const char *who, const char *msg)
{
    (void)user;
    (void)level;
    int n = snprintf(logbuf + loglen, sizeof logbuf - loglen, "%s: %s\n", who, msg);
    if (n > 0 && loglen + (size_t)n < sizeof logbuf)
        loglen += (size_t)n;
}

static void log_reset(void)
{
    loglen = 0;
    logbuf[0] = '\0';
}

static int log_has(const char *s)
{
    return strstr(logbuf, s) != NULL;
}

static const char *plugin_file(const char *variant)
{
    static char path[4096];
    const char *dir = getenv("MMRT_BUILD_DIR");
    snprintf(path, sizeof path, "%s/test-plugins/libmmrt_%s.so", dir ? dir : "build", variant);
    return path;
}

static int setup(void **state)
{
    (void)state;
    mmrt_set_log_sink(capture, NULL, MMRT_LOG_DEBUG);
    log_reset();
    return 0;
}

static void expect_refused(const char *variant, const char *tail)
{
    struct mmrt_loaded_plugin *p = NULL;
    struct mmrt_error err = { 0 };
    const char *path = plugin_file(variant);
    assert_int_equal(mmrt_plugin_load_file(path, &p, &err), MMRT_ERR_PLUGIN);
    assert_null(p);
    char want[4608];
    snprintf(want, sizeof want, "%s: %s", path, tail);
    assert_string_equal(err.msg, want);
}

static void test_wrong_major(void **state)
{
    (void)state;
    char tail[128];
    snprintf(tail, sizeof tail,
             "plugin ABI %d.0, this mmrt speaks ABI %d.%d (the major versions must match)",
             MMRT_ABI_MAJOR + 1, MMRT_ABI_MAJOR, MMRT_ABI_MINOR);
    expect_refused("badmajor", tail);
}

static void test_short_struct(void **state)
{
    (void)state;
    char tail[160];
    snprintf(tail, sizeof tail,
             "struct mmrt_plugin is 16 bytes, shorter than the oldest supported layout "
             "(%zu bytes)", (size_t)MMRT_PLUGIN_MIN_SIZE);
    expect_refused("short", tail);
}

static void test_missing_entry(void **state)
{
    (void)state;
    expect_refused("noentry", "missing entry symbol mmrt_plugin_init (not an mmrt plugin?)");
}

static void test_null_member(void **state)
{
    (void)state;
    expect_refused("nullmember", "required member 'download' is NULL");
}

static void test_entry_returns_null(void **state)
{
    (void)state;
    expect_refused("nullentry", "mmrt_plugin_init returned NULL (the plugin logged why)");
}

static void test_not_a_shared_object(void **state)
{
    (void)state;
    char path[] = "/tmp/mmrt_notelf_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, "hello", 5), 5);
    close(fd);
    struct mmrt_loaded_plugin *p = NULL;
    struct mmrt_error err = { 0 };
    assert_int_equal(mmrt_plugin_load_file(path, &p, &err), MMRT_ERR_PLUGIN);
    assert_non_null(strstr(err.msg, "cannot load"));
    assert_non_null(strstr(err.msg, path));
    unlink(path);
    assert_int_equal(mmrt_plugin_load_file("/nonexistent/libmmrt_x.so", &p, &err),
                     MMRT_ERR_NOT_FOUND);
    assert_non_null(strstr(err.msg, "/nonexistent/libmmrt_x.so"));
}

static void test_no_device_is_a_skip(void **state)
{
    (void)state;
    struct mmrt_loaded_plugin *p = NULL;
    struct mmrt_error err = { 0 };
    assert_int_equal(mmrt_plugin_load_file(plugin_file("nodevice"), &p, &err), MMRT_OK);
    assert_int_equal(p->n_devices, 0);
    assert_string_equal(p->skip_reason, "no stub device (test variant)");
    assert_true(log_has("skipped: no stub device (test variant)"));
    struct mmrt_dev *dev = NULL;
    assert_int_equal(mmrt_dev_open_plugin("s0", p, 0, 1 << 20, MMRT_POOL_LEVEL1_DEFAULT, NULL, 0,
                                          &dev, &err),
                     MMRT_ERR_NO_DEVICE);
    assert_string_equal(err.msg, "device s0: plugin stub has no device: no stub device "
                                 "(test variant)");
    mmrt_plugin_release(p);
}

static void test_oldest_layout_reads_as_current(void **state)
{
    (void)state;
    struct mmrt_loaded_plugin *p = NULL;
    struct mmrt_error err = { 0 };
    assert_int_equal(mmrt_plugin_load_file(plugin_file("oldlayout"), &p, &err), MMRT_OK);
    /* The members past struct_size exist in the file but must read as absent. */
    for (int op = 0; op < MMRT_OP_COUNT; op++)
        assert_null(p->api.ops[op]);
    assert_null(p->api.option_keys);
    assert_null(p->api.shutdown);
    log_reset();
    mmrt_plugin_release(p);
    assert_false(log_has("call shutdown"));
}

static void test_load_by_name_and_share(void **state)
{
    (void)state;
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/test-plugins", getenv("MMRT_BUILD_DIR"));
    setenv("MMRT_PLUGIN_PATH", dir, 1);
    struct mmrt_loaded_plugin *a = NULL, *b = NULL;
    struct mmrt_error err = { 0 };
    log_reset();
    assert_int_equal(mmrt_plugin_load("stub", &a, &err), MMRT_OK);
    assert_int_equal(mmrt_plugin_load("stub", &b, &err), MMRT_OK);
    assert_ptr_equal(a, b);
    assert_int_equal(a->n_devices, 2);
    /* The entry point and probe run once per file, however often it is loaded. */
    const char *first = strstr(logbuf, "stub: call init");
    assert_non_null(first);
    assert_null(strstr(first + 1, "stub: call init"));
    mmrt_plugin_release(a);
    assert_false(log_has("call shutdown"));
    mmrt_plugin_release(b);
    assert_true(log_has("call shutdown"));

    assert_int_equal(mmrt_plugin_load("doesnotexist", &a, &err), MMRT_ERR_NOT_FOUND);
    assert_non_null(strstr(err.msg, "libmmrt_doesnotexist.so not found (searched "));
    assert_non_null(strstr(err.msg, dir));
    assert_int_equal(mmrt_plugin_load("../evil", &a, &err), MMRT_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "'../evil'"));
}

/* Opens stub device 1 with a small pool; the caller closes it. */
/* A tensor a test allocates on a device: where its descriptor goes, its dtype and shape. */
struct tspec {
    struct mmrt_dev_tensor *t;
    enum mmrt_dtype dt;
    int n_dims;
    int64_t ne[4];
};

static void alloc_all(struct mmrt_dev *dev, const struct tspec *all, size_t n)
{
    struct mmrt_error err = { 0 };
    for (size_t i = 0; i < n; i++)
        if (mmrt_dev_tensor_alloc(dev, all[i].dt, all[i].n_dims, all[i].ne, all[i].t, &err) !=
            MMRT_OK)
            fail_msg("tensor %zu: %s", i, err.msg);
}

static void free_all(struct mmrt_dev *dev, const struct tspec *all, size_t n)
{
    for (size_t i = 0; i < n; i++)
        mmrt_dev_tensor_free(dev, all[i].t);
}

static struct mmrt_dev *open_stub(uint64_t pool_bytes)
{
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/test-plugins", getenv("MMRT_BUILD_DIR"));
    setenv("MMRT_PLUGIN_PATH", dir, 1);
    struct mmrt_dev *dev = NULL;
    struct mmrt_error err = { 0 };
    struct mmrt_option opt = { "mode", "fast" };
    mmrt_status st = mmrt_dev_open("s1", "stub", 1, pool_bytes, &opt, 1, &dev, &err);
    if (st != MMRT_OK)
        fail_msg("open_stub: %s", err.msg);
    return dev;
}

static void test_device_and_dispatch(void **state)
{
    (void)state;
    log_reset();
    struct mmrt_dev *dev = open_stub(4 << 20);
    assert_true(log_has("call device_open 1 n_options=1"));
    assert_true(log_has("option mode=fast"));
    assert_string_equal(dev->info.name, "Stub device 1");

    struct mmrt_error err = { 0 };
    struct mmrt_dev_tensor x, y, bias;
    int64_t ne[2] = { 3, 5 }, nb[1] = { 5 };
    assert_int_equal(mmrt_dev_tensor_alloc(dev, MMRT_DTYPE_F32, 2, ne, &x, &err), MMRT_OK);
    assert_int_equal(mmrt_dev_tensor_alloc(dev, MMRT_DTYPE_F32, 2, ne, &y, &err), MMRT_OK);
    assert_int_equal(mmrt_dev_tensor_alloc(dev, MMRT_DTYPE_F32, 1, nb, &bias, &err), MMRT_OK);
    float in[15], b5[5], out[15];
    for (int i = 0; i < 15; i++)
        in[i] = (float)i - 7.0f;
    for (int i = 0; i < 5; i++)
        b5[i] = 100.0f * (float)i;
    assert_int_equal(mmrt_dev_upload(dev, &x.t, in, sizeof in, &err), MMRT_OK);
    assert_int_equal(mmrt_dev_upload(dev, &bias.t, b5, sizeof b5, &err), MMRT_OK);

    log_reset();
    assert_int_equal(mmrt_op_scale(dev, &x.t, 0.5f, &y.t, &err), MMRT_OK);
    assert_true(log_has("call op SCALE n=15"));
    assert_int_equal(mmrt_dev_download(dev, &y.t, out, sizeof out, &err), MMRT_OK);
    for (int i = 0; i < 15; i++)
        assert_true(out[i] == in[i] * 0.5f);
    /* one-row broadcast add, in place */
    assert_int_equal(mmrt_op_add(dev, &y.t, &bias.t, &y.t, &err), MMRT_OK);
    assert_int_equal(mmrt_dev_download(dev, &y.t, out, sizeof out, &err), MMRT_OK);
    for (int i = 0; i < 15; i++)
        assert_true(out[i] == in[i] * 0.5f + b5[i % 5]);

    /* A launch that breaks the contract never reaches the plugin. */
    log_reset();
    assert_int_equal(mmrt_op_scale(dev, &x.t, 1.0f, &bias.t, &err), MMRT_ERR_INVALID_ARG);
    assert_false(log_has("call op"));
    assert_non_null(strstr(err.msg, "device s1: SCALE: dst [5] and src0 [3, 5] must have the "
                                    "same shape"));
    /* Refusals name every dtype, the quantized ones too. */
    struct mmrt_dev_tensor q8, q4;
    assert_int_equal(mmrt_dev_tensor_alloc(dev, MMRT_DTYPE_I8, 2, ne, &q8, &err), MMRT_OK);
    assert_int_equal(mmrt_dev_tensor_alloc(dev, MMRT_DTYPE_U4, 2, ne, &q4, &err), MMRT_OK);
    assert_int_equal(mmrt_op_scale(dev, &q8.t, 1.0f, &x.t, &err), MMRT_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "SCALE: src0 has dtype I8, expected F32"));
    assert_int_equal(mmrt_op_scale(dev, &q4.t, 1.0f, &x.t, &err), MMRT_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "SCALE: src0 has dtype U4, expected F32"));
    mmrt_dev_tensor_free(dev, &q8);
    mmrt_dev_tensor_free(dev, &q4);
    /* An op the plugin lacks is refused by name. */
    int64_t wne[2] = { 4, 5 };
    struct mmrt_dev_tensor w, y4;
    int64_t yne[2] = { 3, 4 };
    assert_int_equal(mmrt_dev_tensor_alloc(dev, MMRT_DTYPE_F32, 2, wne, &w, &err), MMRT_OK);
    assert_int_equal(mmrt_dev_tensor_alloc(dev, MMRT_DTYPE_F32, 2, yne, &y4, &err), MMRT_OK);
    const struct mmrt_weight wm = { .t = w.t };
    assert_int_equal(mmrt_op_matmul(dev, &x.t, &wm, NULL, &y4.t, &err), MMRT_ERR_UNSUPPORTED);
    assert_string_equal(err.msg, "device s1 (plugin stub) has no operator MATMUL");
    enum mmrt_op need[] = { MMRT_OP_MATMUL, MMRT_OP_ADD, MMRT_OP_ROPE, MMRT_OP_MATMUL };
    assert_int_equal(mmrt_dev_require_ops(dev, "stage language", need, 4, &err),
                     MMRT_ERR_UNSUPPORTED);
    assert_string_equal(err.msg, "device s1 (plugin stub) lacks operators needed by stage "
                                 "language: MATMUL, ROPE");
    enum mmrt_op have[] = { MMRT_OP_ADD, MMRT_OP_SCALE };
    assert_int_equal(mmrt_dev_require_ops(dev, "stage vision", have, 2, &err), MMRT_OK);

    struct mmrt_dev_tensor *all[] = { &x, &y, &bias, &w, &y4 };
    for (int i = 0; i < 5; i++)
        mmrt_dev_tensor_free(dev, all[i]);
    struct mmrt_pool_stats ps;
    mmrt_pool_stats(dev->pool, &ps);
    assert_int_equal(ps.bytes_in_use, 0);
    assert_int_equal(mmrt_pool_check(dev->pool, &err), MMRT_OK);
    log_reset();
    mmrt_dev_close(dev);
    assert_true(log_has("call device_close 1 live_arenas=0"));
}

/* The operator front's checks of ROPE_MULTI and SET_ROWS (ABI 1.1): every broken launch is
 * refused with its reason before the plugin sees it; a well-formed one passes validation and
 * is then refused only because the stub has no such kernel. */
static void test_validate_rope_multi_set_rows(void **state)
{
    (void)state;
    struct mmrt_dev *dev = open_stub(4 << 20);
    struct mmrt_error err = { 0 };
    struct mmrt_dev_tensor x, y, yh, pos, pos1, posf, v, vh, idx, idx3, idxf, cache, ci, c9, c2;
    struct tspec all[] = {
        { &x, MMRT_DTYPE_F32, 3, { 3, 4, 8 } },     { &y, MMRT_DTYPE_F32, 3, { 3, 4, 8 } },
        { &yh, MMRT_DTYPE_F16, 3, { 3, 4, 8 } },    { &pos, MMRT_DTYPE_I32, 2, { 3, 3 } },
        { &pos1, MMRT_DTYPE_I32, 1, { 3 } },        { &posf, MMRT_DTYPE_F32, 2, { 3, 3 } },
        { &v, MMRT_DTYPE_F32, 3, { 2, 4, 8 } },     { &vh, MMRT_DTYPE_F16, 3, { 2, 4, 8 } },
        { &idx, MMRT_DTYPE_I32, 1, { 2 } },         { &idx3, MMRT_DTYPE_I32, 1, { 3 } },
        { &idxf, MMRT_DTYPE_F32, 1, { 2 } },        { &cache, MMRT_DTYPE_BF16, 3, { 5, 4, 8 } },
        { &ci, MMRT_DTYPE_I32, 3, { 5, 4, 8 } },    { &c9, MMRT_DTYPE_F32, 3, { 5, 4, 9 } },
        { &c2, MMRT_DTYPE_F16, 2, { 5, 32 } },
    };
    alloc_all(dev, all, sizeof all / sizeof all[0]);
    log_reset();

    const struct mmrt_rope_multi_params good = { 1e4f, 8, 8, 0, 3, { 2, 1, 1, -5 } };
    assert_int_equal(mmrt_op_rope_multi(dev, &x.t, &pos.t, &good, &y.t, &err),
                     MMRT_ERR_UNSUPPORTED);
    assert_string_equal(err.msg, "device s1 (plugin stub) has no operator ROPE_MULTI");
    assert_int_equal(mmrt_op_rope_multi(dev, &x.t, &pos.t, &good, &x.t, &err),
                     MMRT_ERR_UNSUPPORTED); /* in place */
    static const struct {
        struct mmrt_rope_multi_params p;
        const char *why;
    } bad[] = {
        { { 1e4f, 8, 8, 0, 0, { 4 } }, "ROPE_MULTI: n_axes 0 is outside 1…4" },
        { { 1e4f, 8, 8, 0, 5, { 1, 1, 1, 1 } }, "n_axes 5 is outside 1…4" },
        { { 1e4f, 8, 8, 0, 3, { 2, 1, 0 } }, "ROPE_MULTI: sections sum to 3 pairs, n_rot/2 is 4" },
        { { 1e4f, 8, 8, 0, 3, { 2, 1, 2 } }, "sections sum to 5 pairs" },
        { { 1e4f, 8, 8, 0, 3, { 4, -1, 1 } }, "ROPE_MULTI: section 1 has -1 pairs (must be ≥ 0)" },
        { { 1e4f, 9, 8, 0, 3, { 2, 1, 1 } }, "ROPE_MULTI: n_rot 9 must be even and within 2…D (D = 8)" },
        { { 1e4f, 10, 8, 0, 3, { 2, 2, 1 } }, "n_rot 10 must be even and within 2…D" },
        { { 1e4f, 0, 8, 0, 3, { 0, 0, 0 } }, "n_rot 0 must be even and within 2…D" },
        { { 1e4f, 8, 0, 0, 3, { 2, 1, 1 } }, "ROPE_MULTI: freq_dim 0 must be ≥ 1" },
        { { 1e4f, 8, 8, 2, 3, { 2, 1, 1 } }, "ROPE_MULTI: restart 2 must be 0 or 1" },
        { { 0.0f, 8, 8, 0, 3, { 2, 1, 1 } }, "ROPE_MULTI: theta 0 must be finite and > 0" },
        { { INFINITY, 8, 8, 0, 3, { 2, 1, 1 } }, "theta inf must be finite and > 0" },
        { { 1e4f, 8, 8, 0, 2, { 2, 2 } }, "ROPE_MULTI: src1 (positions) must be [T, "
                                          "n_axes] = [3, 2]" },
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_int_equal(mmrt_op_rope_multi(dev, &x.t, &pos.t, &bad[i].p, &y.t, &err),
                         MMRT_ERR_INVALID_ARG);
        if (!strstr(err.msg, bad[i].why))
            fail_msg("case %zu: \"%s\" lacks \"%s\"", i, err.msg, bad[i].why);
    }
    assert_int_equal(mmrt_op_rope_multi(dev, &x.t, &pos1.t, &good, &y.t, &err),
                     MMRT_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "src1 (positions) must be [T, n_axes] = [3, 3]"));
    assert_int_equal(mmrt_op_rope_multi(dev, &x.t, &posf.t, &good, &y.t, &err),
                     MMRT_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "src1 (positions) has dtype F32, expected I32"));
    assert_int_equal(mmrt_op_rope_multi(dev, &x.t, &pos.t, &good, &yh.t, &err),
                     MMRT_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "ROPE_MULTI: dst has dtype F16, expected F32"));
    assert_int_equal(mmrt_op_launch(dev, MMRT_OP_ROPE_MULTI,
                                    (const struct mmrt_tensor *[]){ &x.t, &pos.t }, 2, &y.t,
                                    &good, (uint32_t)sizeof(struct mmrt_rope_params), &err),
                     MMRT_ERR_INVALID_ARG);
    char want[96];
    snprintf(want, sizeof want, "ROPE_MULTI: params too short (%zu bytes, need %zu)",
             sizeof(struct mmrt_rope_params), sizeof(struct mmrt_rope_multi_params));
    assert_non_null(strstr(err.msg, want));

    assert_int_equal(mmrt_op_set_rows(dev, &v.t, &idx.t, &cache.t, NULL, &err), MMRT_ERR_UNSUPPORTED);
    assert_string_equal(err.msg, "device s1 (plugin stub) has no operator SET_ROWS");
    assert_int_equal(mmrt_op_set_rows(dev, &v.t, &idx.t, &ci.t, NULL, &err), MMRT_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "SET_ROWS: dst has dtype I32, expected "
                                    "F32/F16/BF16/I8/F8E4M3"));
    assert_int_equal(mmrt_op_set_rows(dev, &v.t, &idx.t, &c9.t, NULL, &err), MMRT_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "SET_ROWS: dim 2: dst has 9, src0 (values) 8"));
    assert_int_equal(mmrt_op_set_rows(dev, &v.t, &idx.t, &c2.t, NULL, &err), MMRT_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "SET_ROWS: dst must have 3 dims, got [5, 32]"));
    assert_int_equal(mmrt_op_set_rows(dev, &vh.t, &idx.t, &cache.t, NULL, &err), MMRT_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "SET_ROWS: src0 (values) has dtype F16, expected F32"));
    assert_int_equal(mmrt_op_set_rows(dev, &v.t, &idx3.t, &cache.t, NULL, &err), MMRT_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "SET_ROWS: src1 (idx) has 3 entries, expected 2"));
    assert_int_equal(mmrt_op_set_rows(dev, &v.t, &idxf.t, &cache.t, NULL, &err), MMRT_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "SET_ROWS: src1 (idx) has dtype F32, expected I32"));
    assert_false(log_has("call op")); /* nothing reached the plugin */

    free_all(dev, all, sizeof all / sizeof all[0]);
    mmrt_dev_close(dev);
}

/* The operator front's checks of GATHER_HEADS and L2_NORM (ABI 1.4): each broken launch is
 * refused naming the op, what was wrong and the operand's dtype and extents, before the
 * plugin sees it; a well-formed one passes validation and is then refused only because the
 * stub has no such kernel. */
static void test_validate_gather_heads_l2_norm(void **state)
{
    (void)state;
    struct mmrt_dev *dev = open_stub(4 << 20);
    struct mmrt_error err = { 0 };
    struct mmrt_dev_tensor tab, tab16, tab2, tabi8, idx, idx3, idx0, idxf, idx2d, y, y5, yh, y2d,
        x, x1, n4, n5, n41, nh;
    struct tspec all[] = {
        { &tab, MMRT_DTYPE_F32, 3, { 6, 2, 8 } },   { &tab16, MMRT_DTYPE_BF16, 3, { 6, 2, 8 } },
        { &tab2, MMRT_DTYPE_F16, 2, { 12, 8 } },    { &tabi8, MMRT_DTYPE_I8, 3, { 6, 2, 8 } },
        { &idx, MMRT_DTYPE_I32, 3, { 4, 2, 3 } },   { &idx3, MMRT_DTYPE_I32, 3, { 4, 3, 3 } },
        { &idx0, MMRT_DTYPE_I32, 3, { 4, 2, 0 } },  { &idxf, MMRT_DTYPE_F32, 3, { 4, 2, 3 } },
        { &idx2d, MMRT_DTYPE_I32, 2, { 8, 3 } },    { &y, MMRT_DTYPE_F32, 3, { 4, 2, 8 } },
        { &y5, MMRT_DTYPE_F32, 3, { 5, 2, 8 } },    { &yh, MMRT_DTYPE_F16, 3, { 4, 2, 8 } },
        { &y2d, MMRT_DTYPE_F32, 2, { 8, 8 } },      { &x, MMRT_DTYPE_F32, 3, { 2, 2, 8 } },
        { &x1, MMRT_DTYPE_F32, 1, { 8 } },          { &n4, MMRT_DTYPE_F32, 1, { 4 } },
        { &n5, MMRT_DTYPE_F32, 1, { 5 } },          { &n41, MMRT_DTYPE_F32, 2, { 2, 2 } },
        { &nh, MMRT_DTYPE_F16, 3, { 2, 2, 8 } },
    };
    alloc_all(dev, all, sizeof all / sizeof all[0]);
    log_reset();

    assert_int_equal(mmrt_op_gather_heads(dev, &tab.t, &idx.t, NULL, &y.t, &err), MMRT_ERR_UNSUPPORTED);
    assert_string_equal(err.msg, "device s1 (plugin stub) has no operator GATHER_HEADS");
    assert_int_equal(mmrt_op_gather_heads(dev, &tab16.t, &idx.t, NULL, &y.t, &err),
                     MMRT_ERR_UNSUPPORTED);
    static const struct {
        int tab, idx, y; /* indices into all[] */
        const char *why;
    } bad[] = {
        { 2, 4, 9, "device s1: GATHER_HEADS: src0 (table) must have 3 dims, got [12, 8]" },
        { 3, 4, 9, "GATHER_HEADS: src0 (table) is I8 and needs its row scales as src2 (scales)" },
        { 0, 5, 9, "GATHER_HEADS: src1 (idx) has 3 heads, src0 (table) 2" },
        { 0, 6, 9, "GATHER_HEADS: src1 (idx) has no entries per group (G = 0" },
        { 0, 7, 9, "GATHER_HEADS: src1 (idx) has dtype F32, expected I32" },
        { 0, 8, 9, "GATHER_HEADS: src1 (idx) must have 3 dims, got [8, 3]" },
        { 0, 4, 10, "GATHER_HEADS: dst must be [N 4, H 2, D 8], got [5, 2, 8]" },
        { 0, 4, 11, "GATHER_HEADS: dst has dtype F16, expected F32" },
        { 0, 4, 12, "GATHER_HEADS: dst must have 3 dims, got [8, 8]" },
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_int_equal(mmrt_op_gather_heads(dev, &all[bad[i].tab].t->t, &all[bad[i].idx].t->t,
                                              NULL, &all[bad[i].y].t->t, &err),
                         MMRT_ERR_INVALID_ARG);
        if (!strstr(err.msg, bad[i].why))
            fail_msg("case %zu: \"%s\" lacks \"%s\"", i, err.msg, bad[i].why);
    }
    /* A strided table (every other head of a [6, 4, 8] buffer) is not contiguous. */
    struct mmrt_tensor strided = tab.t;
    strided.nb[0] *= 2;
    assert_int_equal(mmrt_op_gather_heads(dev, &strided, &idx.t, NULL, &y.t, &err),
                     MMRT_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "GATHER_HEADS: src0 (table) must be contiguous"));

    /* L2_NORM: dst is 1-D [rows] whatever src's rank. */
    assert_int_equal(mmrt_op_l2_norm(dev, &x.t, &n4.t, &err), MMRT_ERR_UNSUPPORTED);
    assert_string_equal(err.msg, "device s1 (plugin stub) has no operator L2_NORM");
    struct mmrt_tensor one = n4.t;
    one.ne[0] = 1;
    assert_int_equal(mmrt_op_l2_norm(dev, &x1.t, &one, &err), MMRT_ERR_UNSUPPORTED);
    assert_int_equal(mmrt_op_l2_norm(dev, &x.t, &n41.t, &err), MMRT_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "device s1: L2_NORM: dst must have 1 dims, got [2, 2]"));
    assert_int_equal(mmrt_op_l2_norm(dev, &x.t, &n5.t, &err), MMRT_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "L2_NORM: dst has 5 elements, src0 has 4 rows"));
    assert_int_equal(mmrt_op_l2_norm(dev, &nh.t, &n4.t, &err), MMRT_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "L2_NORM: src0 has dtype F16, expected F32"));
    assert_false(log_has("call op")); /* nothing reached the plugin */

    free_all(dev, all, sizeof all / sizeof all[0]);
    mmrt_dev_close(dev);
}

/* A plugin built against ABI 1.3 declares 23 ops; whatever its table holds past them (here a
 * SCALE kernel in the GATHER_HEADS and L2_NORM slots) is never read: the loader gives NULL for
 * the ops of later minors, and the front refuses them by name. */
static void test_older_minor_lacks_newer_ops(void **state)
{
    (void)state;
    struct mmrt_loaded_plugin *p = NULL;
    struct mmrt_error err = { 0 };
    assert_int_equal(mmrt_plugin_load_file(plugin_file("abi13"), &p, &err), MMRT_OK);
    assert_int_equal(p->api.hdr.abi_minor, 3);
    assert_non_null(p->api.ops[MMRT_OP_SCALE]);
    assert_non_null(p->api.ops[MMRT_OP_ADD]);
    for (int op = MMRT_OP_GATHER_HEADS; op < MMRT_OP_COUNT; op++)
        assert_null(p->api.ops[op]);
    struct mmrt_dev *dev = NULL;
    assert_int_equal(mmrt_dev_open_plugin("old", p, 1, 1 << 20, MMRT_POOL_LEVEL1_DEFAULT, NULL, 0,
                                          &dev, &err),
                     MMRT_OK);
    struct mmrt_dev_tensor x, y;
    int64_t ne[2] = { 2, 4 }, nr[1] = { 2 };
    assert_int_equal(mmrt_dev_tensor_alloc(dev, MMRT_DTYPE_F32, 2, ne, &x, &err), MMRT_OK);
    assert_int_equal(mmrt_dev_tensor_alloc(dev, MMRT_DTYPE_F32, 1, nr, &y, &err), MMRT_OK);
    log_reset();
    assert_int_equal(mmrt_op_l2_norm(dev, &x.t, &y.t, &err), MMRT_ERR_UNSUPPORTED);
    assert_string_equal(err.msg, "device old (plugin stub) has no operator L2_NORM");
    assert_false(log_has("call op"));
    enum mmrt_op need[] = { MMRT_OP_SCALE, MMRT_OP_GATHER_HEADS, MMRT_OP_L2_NORM };
    assert_int_equal(mmrt_dev_require_ops(dev, "image-KV compression", need, 3, &err),
                     MMRT_ERR_UNSUPPORTED);
    assert_string_equal(err.msg, "device old (plugin stub) lacks operators needed by "
                                 "image-KV compression: GATHER_HEADS, L2_NORM");
    mmrt_dev_tensor_free(dev, &x);
    mmrt_dev_tensor_free(dev, &y);
    mmrt_dev_close(dev);
    mmrt_plugin_release(p);
}

/* The front's checks of the sliding window (ABI 1.5) on both attention operators: a negative
 * window and a bidirectional one are refused by name; an ABI 1.4 caller's 12-byte params pass
 * (window 0); and a plugin built before 1.5, whose kernel would ignore the window, is never
 * launched with one (the abi13 stub has an ATTENTION_PAGED that only logs its call). */
static void test_validate_attention_window(void **state)
{
    (void)state;
    struct mmrt_error err = { 0 };
    struct mmrt_loaded_plugin *old = NULL;
    assert_int_equal(mmrt_plugin_load_file(plugin_file("abi13"), &old, &err), MMRT_OK);
    struct mmrt_dev *devs[2] = { open_stub(4 << 20), NULL };
    assert_int_equal(mmrt_dev_open_plugin("old", old, 1, 4 << 20, MMRT_POOL_LEVEL1_DEFAULT, NULL,
                                          0, &devs[1], &err),
                     MMRT_OK);
    for (int d = 0; d < 2; d++) {
        struct mmrt_dev *dev = devs[d];
        struct mmrt_dev_tensor q, kp, cq, lens, table, y;
        struct tspec all[] = {
            { &q, MMRT_DTYPE_F32, 3, { 3, 4, 8 } },  { &kp, MMRT_DTYPE_F32, 4, { 2, 4, 2, 8 } },
            { &cq, MMRT_DTYPE_I32, 1, { 2 } },       { &lens, MMRT_DTYPE_I32, 1, { 1 } },
            { &table, MMRT_DTYPE_I32, 2, { 1, 2 } }, { &y, MMRT_DTYPE_F32, 3, { 3, 4, 8 } },
        };
        alloc_all(dev, all, sizeof all / sizeof all[0]);
        const struct mmrt_tensor *src[6] = { &q.t, &kp.t, &kp.t, &cq.t, &lens.t, &table.t };
        log_reset();
        static const struct {
            struct mmrt_attention_params p;
            const char *why;
        } bad[] = {
            { { 0.35f, 1, 1, -1 }, "ATTENTION_PAGED: window -1 must be ≥ 0 (0 = none)" },
            { { 0.35f, 0, 1, 4 }, "ATTENTION_PAGED: window 4 needs causal = 1" },
        };
        for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
            assert_int_equal(mmrt_op_attention_paged(dev, &q.t, &kp.t, &kp.t, &cq.t, &lens.t,
                                                     &table.t, NULL, NULL, &bad[i].p, &y.t, &err),
                             MMRT_ERR_INVALID_ARG);
            if (!strstr(err.msg, bad[i].why))
                fail_msg("case %zu: \"%s\" lacks \"%s\"", i, err.msg, bad[i].why);
        }
        /* ATTENTION shares the checks. */
        const struct mmrt_attention_params bidir = { 0.35f, 0, 1, 2 };
        struct mmrt_tensor k3 = kp.t;
        k3.n_dims = 3;
        k3.ne[0] = 8;
        k3.ne[1] = 2;
        k3.ne[2] = 8;
        k3.nb[0] = 64;
        k3.nb[1] = 32;
        k3.nb[2] = 4;
        assert_int_equal(mmrt_op_attention(dev, &q.t, &k3, &k3, NULL, NULL, &bidir, &y.t, &err),
                         MMRT_ERR_INVALID_ARG);
        assert_non_null(strstr(err.msg, "ATTENTION: window 2 needs causal = 1"));
        /* 11 bytes are too few; an ABI 1.4 caller's 12 pass as window 0. */
        const struct mmrt_attention_params w4 = { 0.35f, 1, 1, 4 };
        assert_int_equal(mmrt_op_launch(dev, MMRT_OP_ATTENTION_PAGED, src, 6, &y.t, &w4, 11,
                                        &err),
                         MMRT_ERR_INVALID_ARG);
        assert_non_null(strstr(err.msg, "ATTENTION_PAGED: params too short (11 bytes, need "
                                        "12)"));
        assert_false(log_has("call op"));
        mmrt_status st = mmrt_op_launch(dev, MMRT_OP_ATTENTION_PAGED, src, 6, &y.t, &w4,
                                        MMRT_ATTENTION_PARAMS_V14_SIZE, &err);
        if (d == 0) { /* the current stub has no ATTENTION_PAGED: validation passed */
            assert_int_equal(st, MMRT_ERR_UNSUPPORTED);
            assert_string_equal(err.msg, "device s1 (plugin stub) has no operator "
                                         "ATTENTION_PAGED");
            free_all(dev, all, sizeof all / sizeof all[0]);
            continue;
        }
        assert_int_equal(st, MMRT_OK);
        assert_true(log_has("call op ATTENTION_PAGED params_size=12"));
        log_reset();
        const struct mmrt_attention_params w0 = { 0.35f, 1, 1, 0 };
        assert_int_equal(mmrt_op_attention_paged(dev, &q.t, &kp.t, &kp.t, &cq.t, &lens.t,
                                                 &table.t, NULL, NULL, &w0, &y.t, &err),
                         MMRT_OK);
        assert_true(log_has("call op ATTENTION_PAGED params_size=16"));
        log_reset();
        assert_int_equal(mmrt_op_attention_paged(dev, &q.t, &kp.t, &kp.t, &cq.t, &lens.t,
                                                 &table.t, NULL, NULL, &w4, &y.t, &err),
                         MMRT_ERR_UNSUPPORTED);
        assert_string_equal(err.msg, "device old: plugin stub has ABI 1.3; ATTENTION_PAGED with "
                                     "a sliding window needs 1.5");
        assert_false(log_has("call op"));
        free_all(dev, all, sizeof all / sizeof all[0]);
    }
    mmrt_dev_close(devs[0]);
    mmrt_dev_close(devs[1]);
    mmrt_plugin_release(old);
}

/* Device "old" of the ABI 1.3 stub (a plugin that predates F8E4M3 and I8 stores); *old gets
 * the plugin to release after closing the device. */
static struct mmrt_dev *open_abi13(struct mmrt_loaded_plugin **old)
{
    struct mmrt_error err = { 0 };
    assert_int_equal(mmrt_plugin_load_file(plugin_file("abi13"), old, &err), MMRT_OK);
    struct mmrt_dev *dev = NULL;
    assert_int_equal(mmrt_dev_open_plugin("old", *old, 1, 4 << 20, MMRT_POOL_LEVEL1_DEFAULT,
                                          NULL, 0, &dev, &err),
                     MMRT_OK);
    return dev;
}

/* F8E4M3 (ABI 1.6): the front takes it where plugin.h says (paged K/V here) and refuses it
 * to COPY; a plugin built before 1.6 is never handed it, with a message naming the device
 * (the abi13 stub's ATTENTION_PAGED would only log its call). */
static void test_validate_f8e4m3(void **state)
{
    (void)state;
    struct mmrt_error err = { 0 };
    struct mmrt_loaded_plugin *old = NULL;
    struct mmrt_dev *dev = open_abi13(&old);
    struct mmrt_dev_tensor q, kp, cq, lens, table, y, f32;
    struct tspec all[] = {
        { &q, MMRT_DTYPE_F32, 3, { 3, 4, 8 } },  { &kp, MMRT_DTYPE_F8E4M3, 4, { 2, 4, 2, 8 } },
        { &cq, MMRT_DTYPE_I32, 1, { 2 } },       { &lens, MMRT_DTYPE_I32, 1, { 1 } },
        { &table, MMRT_DTYPE_I32, 2, { 1, 2 } }, { &y, MMRT_DTYPE_F32, 3, { 3, 4, 8 } },
        { &f32, MMRT_DTYPE_F32, 4, { 2, 4, 2, 8 } },
    };
    alloc_all(dev, all, sizeof all / sizeof all[0]);
    assert_int_equal(kp.t.nb[3], 1); /* one byte an element */
    log_reset();
    const struct mmrt_attention_params p = { 0.35f, 1, 1, 0 };
    assert_int_equal(mmrt_op_attention_paged(dev, &q.t, &kp.t, &kp.t, &cq.t, &lens.t, &table.t, NULL, NULL,
                                             &p, &y.t, &err),
                     MMRT_ERR_UNSUPPORTED);
    assert_string_equal(err.msg, "device old: plugin stub has ABI 1.3; ATTENTION_PAGED with an "
                                 "F8E4M3 operand needs 1.6");
    assert_false(log_has("call op"));
    const struct mmrt_tensor *src[1] = { &f32.t };
    assert_int_equal(mmrt_op_launch(dev, MMRT_OP_COPY, src, 1, &kp.t, NULL, 0, &err),
                     MMRT_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "COPY: cannot convert F32 to F8E4M3"));
    free_all(dev, all, sizeof all / sizeof all[0]);
    mmrt_dev_close(dev);
    mmrt_plugin_release(old);
}

/* I8 with row scales (ABI 1.7): the front holds SET_ROWS, ATTENTION_PAGED and GATHER_HEADS
 * to their scale sources (present exactly with an I8 store, one per row) and never hands an
 * I8 store to a plugin built before 1.7. */
static void test_validate_i8_kv(void **state)
{
    (void)state;
    struct mmrt_error err = { 0 };
    struct mmrt_loaded_plugin *old = NULL;
    struct mmrt_dev *dev = open_abi13(&old);
    struct mmrt_dev_tensor q, kp, ks, ks15, cq, lens, table, y, f32p, vals, idx, rows, v1, r1, r1s;
    struct tspec all[] = {
        { &q, MMRT_DTYPE_F32, 3, { 3, 4, 8 } },   { &kp, MMRT_DTYPE_I8, 4, { 2, 4, 2, 8 } },
        { &ks, MMRT_DTYPE_F32, 1, { 16 } },       { &ks15, MMRT_DTYPE_F32, 1, { 15 } },
        { &cq, MMRT_DTYPE_I32, 1, { 2 } },        { &lens, MMRT_DTYPE_I32, 1, { 1 } },
        { &table, MMRT_DTYPE_I32, 2, { 1, 2 } },  { &y, MMRT_DTYPE_F32, 3, { 3, 4, 8 } },
        { &f32p, MMRT_DTYPE_F32, 4, { 2, 4, 2, 8 } }, { &vals, MMRT_DTYPE_F32, 3, { 3, 2, 8 } },
        { &idx, MMRT_DTYPE_I32, 1, { 3 } },       { &rows, MMRT_DTYPE_I8, 3, { 8, 2, 8 } },
        { &v1, MMRT_DTYPE_F32, 1, { 3 } },        { &r1, MMRT_DTYPE_I8, 1, { 8 } },
        { &r1s, MMRT_DTYPE_F32, 1, { 8 } },
    };
    alloc_all(dev, all, sizeof all / sizeof all[0]);
    log_reset();
    const struct mmrt_attention_params p = { 0.35f, 1, 1, 0 };
    static const struct {
        int k, ks, vs; /* indices into all[]; -1: NULL */
        const char *why;
    } bad[] = {
        { 1, -1, 2, "ATTENTION_PAGED: src1 (k_pages) is I8 and needs its row scales as src6 "
                    "(k_scales)" },
        { 1, 2, -1, "src2 (v_pages) is I8 and needs its row scales as src7 (v_scales)" },
        { 1, 3, 2, "src6 (k_scales) has 15 scales, src1 (k_pages) has 16 rows" },
        { 8, 2, -1, "src6 (k_scales) is given but src1 (k_pages) is F32 (scales go with an I8 "
                    "store only)" },
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        const struct mmrt_tensor *k = &all[bad[i].k].t->t;
        assert_int_equal(mmrt_op_attention_paged(dev, &q.t, k, k, &cq.t, &lens.t, &table.t,
                                                 bad[i].ks < 0 ? NULL : &all[bad[i].ks].t->t,
                                                 bad[i].vs < 0 ? NULL : &all[bad[i].vs].t->t, &p,
                                                 &y.t, &err),
                         MMRT_ERR_INVALID_ARG);
        if (!strstr(err.msg, bad[i].why))
            fail_msg("case %zu: \"%s\" lacks \"%s\"", i, err.msg, bad[i].why);
    }
    assert_int_equal(mmrt_op_set_rows(dev, &vals.t, &idx.t, &rows.t, NULL, &err),
                     MMRT_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "SET_ROWS: dst is I8 and needs its row scales as src2"));
    assert_int_equal(mmrt_op_set_rows(dev, &vals.t, &idx.t, &rows.t, &ks15.t, &err),
                     MMRT_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "src2 (scales) has 15 scales, dst has 16 rows"));
    assert_int_equal(mmrt_op_set_rows(dev, &v1.t, &idx.t, &r1.t, &r1s.t, &err),
                     MMRT_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "SET_ROWS: an I8 dst needs rank ≥ 2"));
    assert_false(log_has("call op"));
    /* Well formed, but the plugin predates I8 stores and their sources 6 and 7. */
    assert_int_equal(mmrt_op_attention_paged(dev, &q.t, &kp.t, &kp.t, &cq.t, &lens.t, &table.t,
                                             &ks.t, &ks.t, &p, &y.t, &err),
                     MMRT_ERR_UNSUPPORTED);
    assert_string_equal(err.msg, "device old: plugin stub has ABI 1.3; ATTENTION_PAGED on an I8 "
                                 "KV store needs 1.7");
    assert_false(log_has("call op"));
    /* Trailing absent sources are dropped, so an F32 launch reaches it as before. */
    assert_int_equal(mmrt_op_attention_paged(dev, &q.t, &f32p.t, &f32p.t, &cq.t, &lens.t,
                                             &table.t, NULL, NULL, &p, &y.t, &err),
                     MMRT_OK);
    assert_true(log_has("call op ATTENTION_PAGED"));
    free_all(dev, all, sizeof all / sizeof all[0]);
    mmrt_dev_close(dev);
    mmrt_plugin_release(old);
}

static void test_device_errors(void **state)
{
    (void)state;
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/test-plugins", getenv("MMRT_BUILD_DIR"));
    setenv("MMRT_PLUGIN_PATH", dir, 1);
    struct mmrt_dev *dev = NULL;
    struct mmrt_error err = { 0 };
    assert_int_equal(mmrt_dev_open("s9", "stub", 2, 1 << 20, NULL, 0, &dev, &err),
                     MMRT_ERR_NO_DEVICE);
    assert_string_equal(err.msg, "device s9: index 2 out of range, plugin stub has 2 devices");
    struct mmrt_option bad = { "fail", "yes" };
    assert_int_equal(mmrt_dev_open("s0", "stub", 0, 1 << 20, &bad, 1, &dev, &err),
                     MMRT_ERR_CONFIG);
    assert_string_equal(err.msg, "device s0 (plugin stub, index 0): option fail = yes: refused "
                                 "as asked");
    /* The stub "device" has 64 MiB: a 1 GiB pool is refused with both figures. */
    assert_int_equal(mmrt_dev_open("s0", "stub", 0, 1ull << 30, NULL, 0, &dev, &err),
                     MMRT_ERR_OUT_OF_POOL);
    assert_non_null(strstr(err.msg, "pool_mb 1024 is more than the 64 MiB of memory"));
    /* Running out of pool memory is an ordinary error. */
    dev = open_stub(1 << 20);
    struct mmrt_dev_tensor t;
    int64_t ne[1] = { 1 << 20 };
    assert_int_equal(mmrt_dev_tensor_alloc(dev, MMRT_DTYPE_F32, 1, ne, &t, &err),
                     MMRT_ERR_OUT_OF_POOL);
    assert_non_null(strstr(err.msg, "device s1"));
    assert_non_null(strstr(err.msg, "4194304"));
    int64_t neg[1] = { -1 };
    assert_int_equal(mmrt_dev_tensor_alloc(dev, MMRT_DTYPE_F32, 1, neg, &t, &err),
                     MMRT_ERR_INVALID_ARG);
    mmrt_dev_close(dev);
}

/* One run of everything the loader and pool do, for the allocation-failure sweep. */
static mmrt_status scenario(void)
{
    struct mmrt_dev *dev = NULL;
    struct mmrt_error err = { 0 };
    struct mmrt_option opt = { "mode", "x" };
    mmrt_status st = mmrt_dev_open("s0", "stub", 0, 2 << 20, &opt, 1, &dev, &err);
    if (st != MMRT_OK)
        return st;
    struct mmrt_dev_tensor a = { 0 }, b = { 0 };
    int64_t ne[1] = { 1000 };
    st = mmrt_dev_tensor_alloc(dev, MMRT_DTYPE_F32, 1, ne, &a, &err);
    if (st == MMRT_OK)
        st = mmrt_dev_tensor_alloc(dev, MMRT_DTYPE_F32, 1, ne, &b, &err);
    if (st == MMRT_OK)
        st = mmrt_op_scale(dev, &a.t, 2.0f, &b.t, &err);
    mmrt_dev_tensor_free(dev, &a);
    mmrt_dev_tensor_free(dev, &b);
    mmrt_dev_close(dev);
    return st;
}

static void test_allocation_failure_sweep(void **state)
{
    (void)state;
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/test-plugins", getenv("MMRT_BUILD_DIR"));
    setenv("MMRT_PLUGIN_PATH", dir, 1);
    long base = alloc_live();
    long n;
    for (n = 1; n < 10000; n++) {
        alloc_fail_at(n);
        mmrt_status st = scenario();
        int fired = alloc_fail_fired();
        alloc_fail_at(0);
        assert_int_equal(alloc_live(), base);
        if (!fired) {
            assert_int_equal(st, MMRT_OK);
            break;
        }
        assert_true(st == MMRT_ERR_NO_MEMORY || st == MMRT_ERR_OUT_OF_POOL);
    }
    assert_true(n > 3); /* the scenario allocates; a sweep of one step proves nothing */
    print_message("allocation-failure sweep: %ld failure points, no leak\n", n - 1);
}

/* Quantizing a matrix read a slice at a time (as the loader quantizes a checkpoint's
 * tensor): a slice buffer that cannot be had is a clear out-of-memory error, not a bad
 * value, and leaks nothing. One thread, so the injection counts one caller's allocations. */
static mmrt_status read_ramp(void *user, int64_t r0, int64_t n, float *dst,
                             struct mmrt_error *err)
{
    (void)user;
    (void)err;
    for (int64_t i = 0; i < n * 64; i++)
        dst[i] = (float)((r0 * 64 + i) % 97) * 0.01f - 0.4f;
    return MMRT_OK;
}

static void test_quant_read_allocation_failure(void **state)
{
    (void)state;
    enum { R = 8, K = 64 };
    uint8_t codes[R * K / 2];
    float scale[R * K / 32], zero[R * K / 32];
    const long base = alloc_live();
    long n;
    for (n = 1; n < 100; n++) {
        int64_t bad = 0;
        struct mmrt_error err = { 0 };
        alloc_fail_at(n);
        const bool ok = mmrt_quant_rows_read(read_ramp, NULL, R, K, 32, codes, scale, zero, 1,
                                             &bad, NULL, &err);
        const int fired = alloc_fail_fired();
        alloc_fail_at(0);
        assert_int_equal(alloc_live(), base);
        if (!fired) {
            assert_true(ok);
            break;
        }
        assert_false(ok);
        assert_int_equal(bad, -1);
        assert_int_equal(err.status, MMRT_ERR_NO_MEMORY);
        assert_non_null(strstr(err.msg, "out of memory"));
    }
    assert_true(n > 1); /* the slice buffer was refused at least once */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_wrong_major, setup),
        cmocka_unit_test_setup(test_short_struct, setup),
        cmocka_unit_test_setup(test_missing_entry, setup),
        cmocka_unit_test_setup(test_null_member, setup),
        cmocka_unit_test_setup(test_entry_returns_null, setup),
        cmocka_unit_test_setup(test_not_a_shared_object, setup),
        cmocka_unit_test_setup(test_no_device_is_a_skip, setup),
        cmocka_unit_test_setup(test_oldest_layout_reads_as_current, setup),
        cmocka_unit_test_setup(test_load_by_name_and_share, setup),
        cmocka_unit_test_setup(test_device_and_dispatch, setup),
        cmocka_unit_test_setup(test_validate_rope_multi_set_rows, setup),
        cmocka_unit_test_setup(test_validate_gather_heads_l2_norm, setup),
        cmocka_unit_test_setup(test_older_minor_lacks_newer_ops, setup),
        cmocka_unit_test_setup(test_validate_attention_window, setup),
        cmocka_unit_test_setup(test_validate_f8e4m3, setup),
        cmocka_unit_test_setup(test_validate_i8_kv, setup),
        cmocka_unit_test_setup(test_device_errors, setup),
        cmocka_unit_test_setup(test_allocation_failure_sweep, setup),
        cmocka_unit_test(test_quant_read_allocation_failure),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
