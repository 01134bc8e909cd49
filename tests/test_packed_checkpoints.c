/*
 * tests/test_packed_checkpoints.c — AWQ, GPTQ and compressed-tensors checkpoints loaded as
 * published.
 *
 * tests/fixtures/packed-awq, packed-gptq and packed-ct are the demo model with its language
 * model's 28 linear layers quantized once (groups of 64) and packed in AWQ's GEMM layout, in
 * GPTQ's (zero points minus one, g_idx) and in compressed-tensors' pack-quantized, written by
 * tools/make_packed_fixtures.py, which checks the AWQ and compressed-tensors packings against
 * the libraries' own unpacking; packed-dequant is the same model with
 * those weights dequantized to f32 by the script. mmrt repacks both into its U4 layout at
 * load, so all three must give the same answers: every logit of every step within 1e-5
 * (relative to the step's largest) and the same tokens, on the CPU plugin and with the
 * language stage on OpenCL; so must packed-gptq rewritten as act-order (desc_act: every
 * input moved to another column, the weights unchanged), and a matrix whose groups are drawn
 * at random from its inputs must multiply exactly enough. Then the configurations and tensors
 * mmrt cannot run are refused by key and value or by tensor name.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>

#include "device.h"
#include "golden.h"
#include "model.h"
#include "ops.h"
#include "weights.h"
#include "mmrt/mmrt.h"
#include "request_util.h"

#define N_ITEMS 12
#define MAX_STEPS 24

/* Every step's logits and the tokens of one greedy answer. */
struct answer {
    float *logits; /* [MAX_STEPS][vocab] */
    int64_t vocab;
    int n_steps;
    struct tokens t;
};

static void on_logits(void *user, int step, const float *logits, int64_t vocab)
{
    struct answer *a = user;
    if (step >= MAX_STEPS)
        return;
    if (!a->logits) {
        a->vocab = vocab;
        a->logits = calloc((size_t)(MAX_STEPS * vocab), sizeof *a->logits);
        assert_non_null(a->logits);
    }
    assert_int_equal(vocab, a->vocab);
    memcpy(a->logits + step * vocab, logits, (size_t)vocab * sizeof *logits);
    a->n_steps = step + 1 > a->n_steps ? step + 1 : a->n_steps;
}

/* `fixture` names a folder of tests/fixtures, or is an absolute path (a scratch copy). */
static struct mmrt_runtime *open_fixture(const char *fixture, const char *language_plugin)
{
    char dir[4096], err[2048] = "";
    if (fixture[0] == '/')
        snprintf(dir, sizeof dir, "%s", fixture);
    else
        golden_fixture_path(dir, sizeof dir, fixture);
    struct mmrt_device_config devs[2] = {
        { .name = "cpu0", .plugin = "cpu", .pool_mb = 64 },
        { .name = "lang", .plugin = language_plugin, .pool_mb = 64 },
    };
    struct mmrt_config cfg = { .struct_size = sizeof cfg, .model_path = dir, .devices = devs,
                               .n_devices = language_plugin ? 2 : 1,
                               .language_device = language_plugin ? "lang" : NULL };
    struct mmrt_runtime *rt = NULL;
    if (mmrt_create(&cfg, &rt, err, sizeof err) != MMRT_OK)
        fail_msg("%s: %s", fixture, err);
    return rt;
}

static void answer(struct mmrt_runtime *rt, int item, struct answer *a)
{
    char img[4200];
    snprintf(img, sizeof img, "%s/demo/heldout/%03d.png", golden_src_dir(), item);
    static const char *const prompts[] = { "Describe the picture.", "How many shapes are there?",
                                           "Which shape is red?" };
    struct mmrt_request req = { .struct_size = sizeof req, .prompt = prompts[item % 3],
                                .images = TEST_FILE(img), .n_images = 1,
                                .max_tokens = MAX_STEPS, .top_p = 1.0f };
    memset(a, 0, sizeof *a);
    const struct mmrt_model_trace trace = { .user = a, .logits = on_logits };
    struct mmrt_result res = { .struct_size = sizeof res };
    if (mmrt_run_traced(rt, &req, &trace, test_collect, &a->t, &res) != MMRT_OK)
        fail_msg("item %d: %s", item, res.error);
}

/* A packed checkpoint on `language_plugin` against the dequantized one on the CPU plugin. */
static void packed_against_dequantized(const char *fixture, const char *language_plugin)
{
    struct mmrt_runtime *awq = open_fixture(fixture, language_plugin);
    struct mmrt_runtime *ref = open_fixture("packed-dequant", NULL);
    double worst = 0;
    for (int i = 0; i < N_ITEMS; i++) {
        struct answer a, b;
        answer(awq, i, &a);
        answer(ref, i, &b);
        assert_int_equal(a.t.n, b.t.n);
        assert_memory_equal(a.t.ids, b.t.ids, (size_t)a.t.n * sizeof a.t.ids[0]);
        assert_int_equal(a.n_steps, b.n_steps);
        for (int s = 0; s < a.n_steps; s++) {
            const double e = golden_rel_err(a.logits + s * a.vocab, b.logits + s * b.vocab,
                                            a.vocab);
            worst = e > worst ? e : worst;
        }
        free(a.logits);
        free(b.logits);
    }
    print_message("%s (language on %s) against the dequantized weights: worst logit rel %.2g "
                  "over %d items\n", fixture, language_plugin ? language_plugin : "cpu", worst,
                  N_ITEMS);
    assert_true(worst <= 1e-5);
    /* the codes are repacked copies, not the file's int32 words */
    struct mmrt_memory_report m = { .struct_size = sizeof m };
    assert_int_equal(mmrt_device_memory(awq, language_plugin ? 1 : 0, &m), MMRT_OK);
    assert_true(m.weight_copied_bytes > 0);
    mmrt_destroy(ref);
    mmrt_destroy(awq);
}

/* Reads `size` bytes of tensor `name` of the scratch checkpoint. */
static void scratch_read(const char *name, void *buf, size_t size)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/model.safetensors", golden_scratch);
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    assert_int_equal(fseek(f, golden_st_offset(golden_scratch, name), SEEK_SET), 0);
    assert_int_equal(fread(buf, 1, size, f), size);
    fclose(f);
}

/* Reverses the order of the G rows of `row_bytes` of tensor `name` (scales, qzeros). */
static void scratch_reverse_rows(const char *name, int64_t G, size_t row_bytes)
{
    uint8_t *a = malloc((size_t)G * row_bytes), *b = malloc((size_t)G * row_bytes);
    assert_true(a && b);
    scratch_read(name, a, (size_t)G * row_bytes);
    for (int64_t g = 0; g < G; g++)
        memcpy(b + (size_t)g * row_bytes, a + (size_t)(G - 1 - g) * row_bytes, row_bytes);
    golden_st_write(golden_scratch, golden_st_offset(golden_scratch, name), b,
                    (size_t)G * row_bytes);
    free(a);
    free(b);
}

/* packed-gptq as an act-order (desc_act) checkpoint of the same weights: in every matrix the
 * groups are numbered backwards — g_idx[k] = G − 1 − k / 64, with the scales' and zero
 * points' rows reversed to match — so each input's scale and zero point, hence every
 * weight, stay what they were, while mmrt must permute the inputs to bring each group
 * together. */
static void make_act_order_gptq(void)
{
    golden_scratch_make("packed-gptq");
    static const struct {
        const char *name;
        int64_t K, N; /* inputs, outputs (hidden 128, MLP 384) */
    } mats[] = {
        { "self_attn.q_proj", 128, 128 }, { "self_attn.k_proj", 128, 128 },
        { "self_attn.v_proj", 128, 128 }, { "self_attn.o_proj", 128, 128 },
        { "mlp.gate_proj", 128, 384 },    { "mlp.up_proj", 128, 384 },
        { "mlp.down_proj", 384, 128 },
    };
    for (int l = 0; l < 4; l++)
        for (size_t m = 0; m < sizeof mats / sizeof mats[0]; m++) {
            const int64_t K = mats[m].K, N = mats[m].N, G = K / 64;
            char base[160], name[200];
            snprintf(base, sizeof base, "language_model.model.layers.%d.%s", l, mats[m].name);
            snprintf(name, sizeof name, "%s.scales", base);
            scratch_reverse_rows(name, G, (size_t)N * 2); /* f16 [G, N] */
            snprintf(name, sizeof name, "%s.qzeros", base);
            scratch_reverse_rows(name, G, (size_t)N / 8 * 4); /* I32 [G, N/8] */
            int32_t gidx[384];
            for (int64_t k = 0; k < K; k++)
                gidx[k] = (int32_t)(G - 1 - k / 64);
            snprintf(name, sizeof name, "%s.g_idx", base);
            golden_st_write(golden_scratch, golden_st_offset(golden_scratch, name), gidx,
                            (size_t)K * sizeof gidx[0]);
        }
    golden_set_config("quantization_config/desc_act", json_true());
}

/* One safetensors tensor for write_st. */
struct st_tensor {
    const char *name, *dtype;
    int n_dims;
    int64_t shape[2];
    const void *data;
    size_t nbytes;
};

static void write_st(const char *dir, const struct st_tensor *t, int n)
{
    char header[2048], path[4200];
    size_t used = (size_t)snprintf(header, sizeof header, "{");
    uint64_t at = 0;
    for (int i = 0; i < n; i++) {
        used += (size_t)snprintf(header + used, sizeof header - used,
                                 "%s\"%s\":{\"dtype\":\"%s\",\"shape\":[%lld", i ? "," : "",
                                 t[i].name, t[i].dtype, (long long)t[i].shape[0]);
        if (t[i].n_dims == 2)
            used += (size_t)snprintf(header + used, sizeof header - used, ",%lld",
                                     (long long)t[i].shape[1]);
        used += (size_t)snprintf(header + used, sizeof header - used,
                                 "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)at,
                                 (unsigned long long)(at + t[i].nbytes));
        at += t[i].nbytes;
    }
    used += (size_t)snprintf(header + used, sizeof header - used, "}");
    while (used % 8)
        header[used++] = ' ';
    assert_true(used < sizeof header);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    const uint64_t hlen = used;
    uint8_t le[8];
    for (int i = 0; i < 8; i++)
        le[i] = (uint8_t)(hlen >> (8 * i));
    assert_int_equal(fwrite(le, 1, 8, f), 8);
    assert_int_equal(fwrite(header, 1, used, f), used);
    for (int i = 0; i < n; i++)
        assert_int_equal(fwrite(t[i].data, 1, t[i].nbytes, f), t[i].nbytes);
    fclose(f);
}

static uint32_t lcg(uint32_t *s)
{
    *s = *s * 1664525u + 1013904223u;
    return *s >> 8;
}

/* Act-order with its groups truly interleaved, on one matrix written by the test: 128
 * inputs in 4 groups of 32 drawn at random, random codes, zero points and scales, in GPTQ's
 * packing. mmrt's product for 1 and 3 rows against the sum over k of x · (q − z) · s with
 * each input's own group, in double. */
static void test_act_order_interleaved(void **state)
{
    (void)state;
    enum { K = 128, N = 16, GS = 32, G = K / GS };
    uint32_t seed = 12345;
    int32_t perm[K], gidx[K];
    for (int k = 0; k < K; k++)
        perm[k] = k;
    for (int k = K - 1; k > 0; k--) { /* Fisher–Yates */
        const int j = (int)(lcg(&seed) % (uint32_t)(k + 1));
        const int32_t t = perm[k];
        perm[k] = perm[j];
        perm[j] = t;
    }
    for (int j = 0; j < K; j++)
        gidx[perm[j]] = j / GS;
    static uint8_t q[N][K], z[G][N];
    static float sc[G][N];
    for (int n = 0; n < N; n++)
        for (int k = 0; k < K; k++)
            q[n][k] = (uint8_t)(lcg(&seed) & 15);
    for (int g = 0; g < G; g++)
        for (int n = 0; n < N; n++) {
            z[g][n] = (uint8_t)(lcg(&seed) & 15);
            sc[g][n] = 0.01f + (float)(lcg(&seed) % 1000) * 1e-4f;
        }
    /* GPTQ: qweight [K/8, N] (input 8r + i in bits 4i), qzeros [G, N/8] (zero − 1 mod 16) */
    static uint32_t qweight[K / 8][N], qzeros[G][N / 8];
    memset(qweight, 0, sizeof qweight);
    memset(qzeros, 0, sizeof qzeros);
    for (int k = 0; k < K; k++)
        for (int n = 0; n < N; n++)
            qweight[k / 8][n] |= (uint32_t)q[n][k] << (4 * (k % 8));
    for (int g = 0; g < G; g++)
        for (int n = 0; n < N; n++)
            qzeros[g][n / 8] |= (uint32_t)((z[g][n] - 1) & 15) << (4 * (n % 8));
    char dir[] = "/tmp/mmrt_actorder_XXXXXX";
    assert_non_null(mkdtemp(dir));
    const struct st_tensor t[] = {
        { "m.qweight", "I32", 2, { K / 8, N }, qweight, sizeof qweight },
        { "m.qzeros", "I32", 2, { G, N / 8 }, qzeros, sizeof qzeros },
        { "m.scales", "F32", 2, { G, N }, sc, sizeof sc },
        { "m.g_idx", "I32", 1, { K, 0 }, gidx, sizeof gidx },
    };
    write_st(dir, t, 4);

    struct mmrt_error err = { 0 };
    struct mmrt_dev *dev = NULL;
    struct mmrt_weights *w = NULL;
    if (mmrt_dev_open("d", "cpu", 0, 16ull << 20, NULL, 0, &dev, &err) != MMRT_OK ||
        mmrt_weights_open(dir, false, &w, &err) != MMRT_OK)
        fail_msg("%s", err.msg);
    struct mmrt_model_options opts = { 0 };
    opts.packed = (struct mmrt_packed_format){ .kind = MMRT_PACKED_GPTQ, .group = GS,
                                               .zero_minus_one = true };
    mmrt_weights_set_options(w, &opts);
    struct mmrt_weight m;
    if (mmrt_weights_load_matrix(w, dev, N, K, &m, &err, "m.weight") != MMRT_OK ||
        mmrt_weights_commit(w, &err) != MMRT_OK)
        fail_msg("%s", err.msg);
    assert_int_equal(m.perm.n_dims, 1); /* the act-order path, not k / g */
    for (int M = 1; M <= 3; M += 2) {
        float x[3][K], y[3][N];
        for (int r = 0; r < M; r++)
            for (int k = 0; k < K; k++)
                x[r][k] = (float)((int)(lcg(&seed) % 2001) - 1000) * 1e-3f;
        struct mmrt_dev_tensor xt, yt;
        assert_int_equal(mmrt_dev_tensor_alloc(dev, MMRT_DTYPE_F32, 2, (int64_t[]){ M, K }, &xt,
                                               &err), MMRT_OK);
        assert_int_equal(mmrt_dev_tensor_alloc(dev, MMRT_DTYPE_F32, 2, (int64_t[]){ M, N }, &yt,
                                               &err), MMRT_OK);
        assert_int_equal(mmrt_dev_upload(dev, &xt.t, x, (uint64_t)(M * K) * 4, &err), MMRT_OK);
        if (mmrt_op_matmul(dev, &xt.t, &m, NULL, &yt.t, &err) != MMRT_OK)
            fail_msg("%s", err.msg);
        assert_int_equal(mmrt_dev_download(dev, &yt.t, y, (uint64_t)(M * N) * 4, &err),
                         MMRT_OK);
        for (int r = 0; r < M; r++)
            for (int n = 0; n < N; n++) {
                double want = 0, mag = 0;
                for (int k = 0; k < K; k++) {
                    const int g = gidx[k];
                    const double wk = ((double)q[n][k] - z[g][n]) * (double)sc[g][n];
                    want += (double)x[r][k] * wk;
                    mag += fabs((double)x[r][k] * wk);
                }
                if (fabs(y[r][n] - want) > 1e-5 * mag)
                    fail_msg("M %d, y[%d, %d] = %.7g, want %.7g", M, r, n, (double)y[r][n],
                             want);
            }
        mmrt_dev_tensor_free(dev, &yt);
        mmrt_dev_tensor_free(dev, &xt);
    }
    mmrt_weights_close(w);
    mmrt_dev_close(dev);
    char path[4200];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    remove(path);
    rmdir(dir);
}

static void test_cpu(void **state)
{
    (void)state;
    packed_against_dequantized("packed-awq", NULL);
    packed_against_dequantized("packed-gptq", NULL);
    packed_against_dequantized("packed-ct", NULL);
    make_act_order_gptq();
    packed_against_dequantized(golden_scratch, NULL);
    golden_scratch_drop(NULL);
}

static void test_language_on_opencl(void **state)
{
    (void)state;
    golden_require_plugin("opencl");
    packed_against_dequantized("packed-awq", "opencl");
    packed_against_dequantized("packed-gptq", "opencl");
    packed_against_dequantized("packed-ct", "opencl");
    make_act_order_gptq();
    packed_against_dequantized(golden_scratch, "opencl");
    golden_scratch_drop(NULL);
}

/* What mmrt cannot run is refused before anything is loaded, by key and value. */
static void test_config_refused(void **state)
{
    (void)state;
    static const struct {
        const char *key;
        mmrt_status st;
        const char *part;
    } cases[] = {
        { "bits", MMRT_ERR_UNSUPPORTED, "quantization_config.bits 8 is not one mmrt runs" },
        { "version", MMRT_ERR_UNSUPPORTED,
          "quantization_config.version \"gemv\" is not one mmrt runs (expected \"gemm\")" },
        { "zero_point", MMRT_ERR_UNSUPPORTED,
          "quantization_config.zero_point false is not one mmrt runs" },
        { "group_size", MMRT_ERR_UNSUPPORTED,
          "quantization_config.group_size 48 is not one mmrt runs" },
    };
    golden_scratch_make("packed-awq");
    golden_set_config("quantization_config", json_string("awq"));
    golden_expect_load_error(MMRT_ERR_FORMAT, "quantization_config is a string, not an "
                                              "object");
    golden_scratch_drop(NULL);
    json_t *values[4] = { json_integer(8), json_string("gemv"), json_false(), json_integer(48) };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        golden_scratch_make("packed-awq");
        char key[64];
        snprintf(key, sizeof key, "quantization_config/%s", cases[i].key);
        golden_set_config(key, values[i]);
        golden_expect_load_error(cases[i].st, cases[i].part);
        golden_scratch_drop(NULL);
    }
}

/* Tensors that do not fit the configuration: a group size the scales do not have (named by
 * tensor), a missing zero-point tensor. */
static void test_tensors_refused_by_name(void **state)
{
    (void)state;
    golden_scratch_make("packed-awq");
    golden_set_config("quantization_config/group_size", json_integer(32));
    golden_expect_load_error(MMRT_ERR_FORMAT, ".qzeros' must be I32 [4, 16]");
    golden_scratch_drop(NULL);
    /* the fixture's first layer's gate projection without its qzeros: renamed in the header */
    golden_scratch_make("packed-awq");
    golden_st_replace(golden_scratch, "layers.0.mlp.gate_proj.qzeros", "qzeros", "qzeroX");
    golden_expect_load_error(MMRT_ERR_FORMAT, "has no 'language_model.layers.0.mlp.gate_proj."
                                              "qzeros' (an AWQ matrix is its .qweight, .qzeros "
                                              "and .scales)");
    golden_scratch_drop(NULL);
}

/* GPTQ: another width or checkpoint format refused by key and value; a g_idx that is no
 * partition of the inputs into whole groups refused by tensor name, input and group; one
 * group per row (-1) read as such (so the fixture's 64-input groups no longer fit its
 * scales, named). */
static void test_gptq_refused(void **state)
{
    (void)state;
    golden_scratch_make("packed-gptq");
    golden_set_config("quantization_config/bits", json_integer(3));
    golden_expect_load_error(MMRT_ERR_UNSUPPORTED, "quantization_config.bits 3 is not one mmrt "
                                                   "runs (expected 4)");
    golden_scratch_drop(NULL);
    golden_scratch_make("packed-gptq");
    golden_set_config("quantization_config/checkpoint_format", json_string("marlin"));
    golden_expect_load_error(MMRT_ERR_UNSUPPORTED, "quantization_config.checkpoint_format "
                                                   "\"marlin\" is not one mmrt runs");
    golden_scratch_drop(NULL);
    golden_scratch_make("packed-gptq");
    golden_set_config("quantization_config/group_size", json_integer(-1));
    golden_expect_load_error(MMRT_ERR_FORMAT, ".qzeros' must be I32 [1, 16]");
    golden_scratch_drop(NULL);
    /* a g_idx that is no partition into groups of 64: input 0 moved to group 1 (65 inputs
     * there), then to group 2 (of 2) */
    golden_scratch_make("packed-gptq");
    const int32_t one = 1, two = 2;
    const long gidx = golden_st_offset(golden_scratch,
                                       "language_model.model.layers.0.mlp.gate_proj.g_idx");
    golden_st_write(golden_scratch, gidx, &one, sizeof one);
    golden_expect_load_error(MMRT_ERR_FORMAT, "gate_proj.g_idx' puts more than 64 inputs in "
                                              "group 1 (input 127 is one too many)");
    golden_st_write(golden_scratch, gidx, &two, sizeof two);
    golden_expect_load_error(MMRT_ERR_FORMAT, "gate_proj.g_idx' puts input 0 in group 2, "
                                              "outside the 2 groups of 64 inputs");
    golden_scratch_drop(NULL);
}

/* compressed-tensors: another width, format or activation quantization refused by key and
 * value; a weight_shape that disagrees with config.json by tensor name. */
static void test_compressed_tensors_refused(void **state)
{
    (void)state;
    static const struct {
        const char *key;
        const char *text;
        long long number;
        const char *part;
    } cases[] = {
        { "config_groups/group_0/weights/num_bits", NULL, 8,
          "quantization_config.config_groups.group_0.weights.num_bits 8 is not one mmrt runs" },
        { "format", "float-quantized", 0,
          "quantization_config.format \"float-quantized\" is not one mmrt runs" },
        { "config_groups/group_0/input_activations", "x", 0,
          "input_activations: activations quantized too are not one mmrt runs" },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        golden_scratch_make("packed-ct");
        char key[160];
        snprintf(key, sizeof key, "quantization_config/%s", cases[i].key);
        golden_set_config(key, cases[i].text ? json_string(cases[i].text)
                                             : json_integer(cases[i].number));
        golden_expect_load_error(MMRT_ERR_UNSUPPORTED, cases[i].part);
        golden_scratch_drop(NULL);
    }
    golden_scratch_make("packed-ct");
    const int64_t wrong = 385;
    golden_st_write(golden_scratch,
                    golden_st_offset(golden_scratch,
                                     "language_model.model.layers.0.mlp.gate_proj.weight_shape"),
                    &wrong, sizeof wrong);
    golden_expect_load_error(MMRT_ERR_FORMAT, "gate_proj.weight_shape' must be the integers "
                                              "[384, 128]");
    golden_scratch_drop(NULL);
}

int main(void)
{
    mmrt_set_log_sink(golden_quiet, NULL, MMRT_LOG_WARN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_act_order_interleaved),
        cmocka_unit_test(test_cpu),
        cmocka_unit_test(test_language_on_opencl),
        cmocka_unit_test(test_config_refused),
        cmocka_unit_test(test_tensors_refused_by_name),
        cmocka_unit_test(test_gptq_refused),
        cmocka_unit_test(test_compressed_tensors_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
