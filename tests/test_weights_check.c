/*
 * tests/test_weights_check.c — what loading says about the checkpoint's weights themselves:
 *
 *   - a config.json that uses fewer decoder layers than the checkpoint has is a warning
 *     naming both counts and the layers left out;
 *   - checkpoint tensors nothing reads are one warning naming them (transformers warns
 *     "Some weights of the model checkpoint were not used" too);
 *   - a weight holding NaN, +Inf or -Inf (F32, F16 or BF16) is refused at load, naming the
 *     tensor, the element and its byte offset, instead of surfacing later as a sampler
 *     without a finite logit.
 *
 * Each case works on a fresh copy of a tiny fixture (golden_scratch_make); the checkpoints
 * are rewritten here, byte by byte. Warnings are caught with a log sink.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "formats/safetensors.h"
#include "golden.h"

static char g_warnings[16384];

static void sink(void *user, enum mmrt_log_level level, const char *who, const char *msg)
{
    (void)user;
    if (level < MMRT_LOG_WARN || strcmp(who, "weights") != 0)
        return;
    size_t n = strlen(g_warnings);
    snprintf(g_warnings + n, sizeof g_warnings - n, "%s\n", msg);
}

static void loads_with_warnings(void)
{
    g_warnings[0] = '\0';
    mmrt_set_log_sink(sink, NULL, MMRT_LOG_WARN);
    golden_expect_loads();
    mmrt_set_log_sink(NULL, NULL, MMRT_LOG_WARN);
}

static void expect_warning(const char *part)
{
    if (!strstr(g_warnings, part))
        fail_msg("no warning with '%s'; warnings:\n%s", part, g_warnings);
}

static uint8_t *read_all(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *b = malloc((size_t)len);
    assert_non_null(b);
    assert_int_equal(fread(b, 1, (size_t)len, f), (size_t)len);
    fclose(f);
    *n = (size_t)len;
    return b;
}

/* Rewrites golden_scratch/model.safetensors with one more F32 tensor `name` of 4 elements
 * at the end of the data (the header padded with spaces to keep the data 8-byte aligned). */
static void add_tensor(const char *name)
{
    char path[512];
    snprintf(path, sizeof path, "%s/model.safetensors", golden_scratch);
    size_t n;
    uint8_t *b = read_all(path, &n);
    uint64_t hn = 0;
    for (int i = 7; i >= 0; i--)
        hn = hn << 8 | b[i];
    json_error_t je;
    json_t *h = json_loadb((const char *)b + 8, (size_t)hn, 0, &je);
    assert_non_null(h);
    const size_t data_n = n - 8 - (size_t)hn;
    json_t *t = json_pack("{s:s, s:[i], s:[I, I]}", "dtype", "F32", "shape", 4, "data_offsets",
                          (json_int_t)data_n, (json_int_t)(data_n + 16));
    assert_non_null(t);
    assert_int_equal(json_object_set_new(h, name, t), 0);
    char *text = json_dumps(h, JSON_COMPACT);
    assert_non_null(text);
    size_t tn = strlen(text), padded = (tn + 7) / 8 * 8;
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    uint8_t len8[8];
    for (int i = 0; i < 8; i++)
        len8[i] = (uint8_t)((uint64_t)padded >> (8 * i));
    const float extra[4] = { 1, 2, 3, 4 };
    assert_int_equal(fwrite(len8, 1, 8, f), 8);
    assert_int_equal(fwrite(text, 1, tn, f), tn);
    for (size_t i = tn; i < padded; i++)
        fputc(' ', f);
    assert_int_equal(fwrite(b + 8 + hn, 1, data_n, f), data_n);
    assert_int_equal(fwrite(extra, 1, sizeof extra, f), sizeof extra);
    assert_int_equal(fclose(f), 0);
    free(text);
    json_decref(h);
    free(b);
}

/* Overwrites element `index` of tensor `name` (its stored name) in the scratch checkpoint
 * with the bytes bits[size]; returns the byte offset written. */
static uint64_t poke(const char *name, uint64_t index, const void *bits, size_t size)
{
    char path[512];
    snprintf(path, sizeof path, "%s/model.safetensors", golden_scratch);
    struct mmrt_safetensors *st = NULL;
    struct mmrt_error err = { 0 };
    if (mmrt_safetensors_open(path, NULL, &st, &err) != MMRT_OK)
        fail_msg("%s", err.msg);
    const struct mmrt_st_tensor *t = mmrt_safetensors_find(st, name);
    assert_non_null(t);
    assert_true(index < t->n_elements);
    assert_int_equal(size, t->nbytes / t->n_elements);
    const uint64_t off = t->file_offset + index * size;
    mmrt_safetensors_close(st);
    FILE *f = fopen(path, "r+b");
    assert_non_null(f);
    assert_int_equal(fseek(f, (long)off, SEEK_SET), 0);
    assert_int_equal(fwrite(bits, 1, size, f), size);
    assert_int_equal(fclose(f), 0);
    return off;
}

static void test_fewer_layers_warned(void **state)
{
    (void)state;
    golden_scratch_make("llava-tiny");
    golden_set_config("text_config/num_hidden_layers", json_integer(1));
    loads_with_warnings();
    expect_warning("config.json num_hidden_layers = 1 uses 1 of the checkpoint's 2 layers "
                   "(language_model.layers.1 are not read)");
    expect_warning("9 checkpoint tensors that nothing reads: language_model.layers.1.* "
                   "(9 tensors)");
}

static void test_fewer_layers_persimmon(void **state)
{
    (void)state;
    golden_scratch_make("fuyu-tiny");
    golden_set_config("text_config/num_hidden_layers", json_integer(1));
    loads_with_warnings();
    expect_warning("uses 1 of the checkpoint's 2 layers (language_model.layers.1 are not read)");
}

static void test_unread_tensors_warned(void **state)
{
    (void)state;
    golden_scratch_make("qwen2vl-tiny");
    add_tensor("model.extra_head.weight");
    add_tensor("lm_head.bias");
    loads_with_warnings();
    expect_warning("2 checkpoint tensors that nothing reads: ");
    expect_warning("extra_head.weight");
    expect_warning("lm_head.bias");
}

static void test_clean_checkpoint_quiet(void **state)
{
    (void)state;
    static const char *const fixtures[] = { "llava-tiny", "llava-next-tiny", "fuyu-tiny",
                                            "qwen2vl-tiny" };
    for (size_t i = 0; i < sizeof fixtures / sizeof fixtures[0]; i++) {
        golden_scratch_make(fixtures[i]);
        loads_with_warnings();
        if (g_warnings[0])
            fail_msg("%s: unexpected warnings:\n%s", fixtures[i], g_warnings);
        golden_scratch_drop(NULL);
    }
}

static void test_non_finite_weights_refused(void **state)
{
    (void)state;
    const char *name = "language_model.model.layers.1.mlp.down_proj.weight";
    const struct {
        uint32_t bits;
        const char *what;
    } cases[] = {
        { 0x7fc00000u, "NaN" }, { 0x7f800000u, "+Inf" }, { 0xff800000u, "-Inf" },
        { 0x7f800001u, "NaN" },
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        golden_scratch_make("llava-tiny");
        const uint64_t off = poke(name, 5 + c, &cases[c].bits, 4);
        char want[512];
        snprintf(want, sizeof want, "tensor '%s' holds %s at element %zu of ", name,
                 cases[c].what, 5 + c);
        golden_expect_load_error(MMRT_ERR_FORMAT, want);
        snprintf(want, sizeof want, "(byte offset %llu in the file)", (unsigned long long)off);
        golden_expect_load_error(MMRT_ERR_FORMAT, want);
        golden_scratch_drop(NULL);
    }
    /* Far into a large tensor (the vectorised blocks) and its last element (the tail). */
    const char *embed = "language_model.model.embed_tokens.weight";
    const uint64_t at[] = { 1023, 1024, 5000, 12543 };
    for (size_t c = 0; c < sizeof at / sizeof at[0]; c++) {
        golden_scratch_make("llava-tiny");
        poke(embed, at[c], &cases[c % 2].bits, 4);
        char want[512];
        snprintf(want, sizeof want, "tensor '%s' holds %s at element %llu of 12544", embed,
                 cases[c % 2].what, (unsigned long long)at[c]);
        golden_expect_load_error(MMRT_ERR_FORMAT, want);
        golden_scratch_drop(NULL);
    }
    /* The largest finite value and a subnormal load. */
    golden_scratch_make("llava-tiny");
    const uint32_t max = 0x7f7fffffu, sub = 0x00000001u;
    poke(name, 0, &max, 4);
    poke(name, 1, &sub, 4);
    golden_expect_loads();
}

/* F16 and BF16 weights: their own exponent fields. */
static void test_non_finite_half_weights(void **state)
{
    (void)state;
    golden_scratch_make("llava-tiny-bf16");
    char path[512];
    snprintf(path, sizeof path, "%s/model.safetensors", golden_scratch);
    struct mmrt_safetensors *st = NULL;
    struct mmrt_error err = { 0 };
    if (mmrt_safetensors_open(path, NULL, &st, &err) != MMRT_OK)
        fail_msg("%s", err.msg);
    const struct mmrt_st_tensor *t =
        mmrt_safetensors_find(st, "language_model.model.layers.0.self_attn.q_proj.weight");
    assert_non_null(t);
    assert_int_equal(t->dtype, MMRT_DTYPE_BF16);
    mmrt_safetensors_close(st);
    const uint16_t ninf = 0xff80u, big = 0x7f7fu;
    poke("language_model.model.layers.0.self_attn.q_proj.weight", 3, &big, 2);
    golden_expect_loads();
    poke("language_model.model.layers.0.self_attn.q_proj.weight", 7, &ninf, 2);
    golden_expect_load_error(MMRT_ERR_FORMAT, "self_attn.q_proj.weight' holds -Inf at "
                                              "element 7 of ");
    golden_scratch_drop(NULL);
    golden_scratch_make("llava-tiny-bf16");
    const uint16_t nan = 0x7fc1u;
    poke("language_model.model.embed_tokens.weight", 4097, &nan, 2);
    golden_expect_load_error(MMRT_ERR_FORMAT, "embed_tokens.weight' holds NaN at element 4097 "
                                              "of 12544");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_fewer_layers_warned, golden_scratch_drop),
        cmocka_unit_test_teardown(test_fewer_layers_persimmon, golden_scratch_drop),
        cmocka_unit_test_teardown(test_unread_tensors_warned, golden_scratch_drop),
        cmocka_unit_test(test_clean_checkpoint_quiet),
        cmocka_unit_test_teardown(test_non_finite_weights_refused, golden_scratch_drop),
        cmocka_unit_test_teardown(test_non_finite_half_weights, golden_scratch_drop),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
