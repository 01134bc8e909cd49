/*
 * tests/test_bench.c — mmrt-bench as CI runs it: the tiny LLaVA shape end to end with --json
 * into a fresh cache folder, checking that the record has every field (and that a second run
 * reuses the cached checkpoint); the tiny Fuyu and Qwen2-VL shapes end to end (Qwen2-VL only
 * when this build's registry has the model type, else its clean refusal); the published
 * Qwen2-VL-7B and Fuyu-8B shapes through --dry-run (config.json values, tensor shapes, image
 * plan and work accounting, without writing gigabytes); --vision-cache's miss/hit record;
 * and the refusals before any work.
 * Timings are never asserted: they depend on the machine and its neighbours.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>

#include "tool_run.h"

static char out[1 << 20], err_text[1 << 16];
static char cache_dir[256];

/* Runs bin/mmrt-bench with args (NULL-terminated); stdout into out, stderr into err_text.
 * Returns the exit status. */
static int run_bench(const char *const *args)
{
    return tool_run("mmrt-bench", args, cache_dir, out, sizeof out, err_text, sizeof err_text);
}

static const char *const tiny_args[] = {
    "--shape", "tiny", "--repeat", "1", "--gen-tokens", "4", "--prompt-tokens", "5",
    "--probe-mb", "16", "--json", "--quiet", "--cache", cache_dir, NULL,
};

static void need(const json_t *obj, const char *key, const char *where)
{
    if (!json_object_get(obj, key))
        fail_msg("JSON %s has no \"%s\"", where, key);
}

static void test_tiny_json_has_every_field(void **state)
{
    (void)state;
    int rc = run_bench(tiny_args);
    if (rc != 0)
        fail_msg("mmrt-bench exited %d: %s", rc, err_text);
    json_error_t je;
    json_t *rec = json_loads(out, 0, &je);
    if (!rec)
        fail_msg("not JSON (%s): %.200s", je.text, out);
    static const char *const top[] = {
        "tool", "version", "date", "machine", "command", "shape", "hf_id", "model_type",
        "vision_layers", "text_layers", "dtype", "image_size", "prompt_tokens", "gen_tokens",
        "batch", "repeat", "warmup", "checkpoint", "image", "prompt", "n_prompt_tokens",
        "n_tokens", "load_ms", "cpu_share", "limits", "work", "stages", "devices", "runs",
    };
    for (size_t i = 0; i < sizeof top / sizeof top[0]; i++)
        need(rec, top[i], "record");
    json_t *m = json_object_get(rec, "machine");
    need(m, "cpu", "machine");
    need(m, "cores", "machine");
    need(m, "threads", "machine");
    static const char *const lim[] = { "read_gbs", "f32_gflops", "bf16_gflops", "amx_gflops",
                                       "amx", "probe_isa", "probe_samples", "read_gbs_low",
                                       "f32_gflops_low", "bf16_gflops_low", "amx_gflops_low",
                                       "vision_unit", "language_unit" };
    json_t *lj = json_object_get(rec, "limits");
    for (size_t i = 0; i < sizeof lim / sizeof lim[0]; i++)
        need(lj, lim[i], "limits");
    /* F16 weights: both stages are held to the f32 FMA peak, whatever units the CPU has. */
    assert_string_equal(json_string_value(json_object_get(lj, "language_unit")), "f32 FMA");
    static const char *const work[] = { "vision_gflop", "prefill_gflop",
                                        "decode_bytes_per_token", "decode_weight_bytes",
                                        "n_image_tokens", "n_patches" };
    for (size_t i = 0; i < sizeof work / sizeof work[0]; i++)
        need(json_object_get(rec, "work"), work[i], "work");
    static const char *const stages[] = { "preprocess_ms", "vision_ms", "prefill_ms", "ttft_ms",
                                          "decode_ms_per_token", "decode_tokens_per_s" };
    json_t *st = json_object_get(rec, "stages");
    for (size_t i = 0; i < sizeof stages / sizeof stages[0]; i++) {
        need(st, stages[i], "stages");
        json_t *f = json_object_get(st, stages[i]);
        static const char *const fig[] = { "value", "limit", "ratio", "basis" };
        for (size_t k = 0; k < sizeof fig / sizeof fig[0]; k++)
            need(f, fig[k], stages[i]);
        assert_true(json_is_number(json_object_get(f, "value")));
    }
    /* On the default placement (cpu) every stage but preprocessing has a limit. */
    assert_true(json_is_number(json_object_get(json_object_get(st, "vision_ms"), "limit")));
    assert_true(json_is_number(json_object_get(json_object_get(st, "decode_ms_per_token"),
                                               "ratio")));
    json_t *devs = json_object_get(rec, "devices");
    assert_true(json_array_size(devs) >= 1);
    static const char *const dev[] = { "name", "plugin", "plugin_version", "device_name", "stages",
                                       "weight_bytes", "weight_mapped_bytes",
                                       "weight_copied_bytes", "weight_reserved_bytes",
                                       "pool_capacity_bytes", "pool_peak_bytes",
                                       "pool_fragmentation" };
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++)
        need(json_array_get(devs, 0), dev[i], "devices[0]");
    /* The CPU plugin's version names how it was built (issue 18: figures by build type). */
    const char *pv = json_string_value(json_object_get(json_array_get(devs, 0), "plugin_version"));
    assert_non_null(pv);
    if (!strstr(pv, "plugin -O"))
        fail_msg("plugin_version \"%s\" does not name the plugin's build flags", pv);
    json_t *runs = json_object_get(rec, "runs");
    assert_int_equal(json_array_size(runs), 1);
    assert_int_equal(json_integer_value(json_object_get(json_array_get(runs, 0), "n_tokens")), 4);
    assert_int_equal(json_integer_value(json_object_get(rec, "n_tokens")), 4);
    assert_string_equal(json_string_value(json_object_get(rec, "shape")), "tiny");
    json_decref(rec);

    /* A second run finds the cached checkpoint (the first one's files are left untouched). */
    char cfg[400];
    struct stat before, after;
    snprintf(cfg, sizeof cfg, "%s/tiny-Lall-f16/model.safetensors", cache_dir);
    assert_int_equal(stat(cfg, &before), 0);
    rc = run_bench(tiny_args);
    assert_int_equal(rc, 0);
    assert_int_equal(stat(cfg, &after), 0);
    assert_true(before.st_mtim.tv_sec == after.st_mtim.tv_sec &&
                before.st_mtim.tv_nsec == after.st_mtim.tv_nsec);
}

/* Runs the given args; requires exit 0 and JSON on stdout; returns the record. */
static json_t *run_json(const char *const *args)
{
    int rc = run_bench(args);
    if (rc != 0)
        fail_msg("mmrt-bench exited %d: %s", rc, err_text);
    json_error_t je;
    json_t *rec = json_loads(out, 0, &je);
    if (!rec)
        fail_msg("not JSON (%s): %.200s", je.text, out);
    return rec;
}

/* path: both stages on one cpu device with the one option line given ("isa = avx2"). */
static void write_cpu_conf(const char *path, const char *option)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fprintf(f, "[device.cpu0]\nplugin = cpu\n%s\n\n[stage.vision]\ndevice = cpu0\n\n"
            "[stage.language]\ndevice = cpu0\n", option);
    fclose(f);
}

/* A stage is held to the peak of the unit it ran on. `[device.cpu0] isa = avx2` measures the
 * AVX2 kernels as an AVX2 machine would run them: the probes use the AVX2 loops (no bf16 or
 * AMX unit, which need AVX-512). With BF16 weights and bf16_dot = 1 the limit is the peak of
 * the bf16 unit the device names (AMX tiles or vdpbf16ps). Each part is skipped where the
 * plugin refuses the option on this CPU. */
static void test_limits_follow_isa(void **state)
{
    (void)state;
    char conf[400];
    snprintf(conf, sizeof conf, "%s/unit.ini", cache_dir);
    write_cpu_conf(conf, "isa = avx2");
    const char *args[] = { "--shape", "tiny", "--repeat", "1", "--warmup", "0", "--gen-tokens",
                           "2", "--prompt-tokens", "5", "--probe-mb", "16", "--json", "--quiet",
                           "--cache", cache_dir, "--conf", conf, NULL };
    int rc = run_bench(args);
    if (rc != 0 && strstr(err_text, "lacks AVX2")) {
        print_message("isa = avx2: this CPU lacks AVX2; skipped\n");
        return;
    }
    json_t *rec = run_json(args);
    json_t *lim = json_object_get(rec, "limits");
    assert_string_equal(json_string_value(json_object_get(lim, "probe_isa")), "avx2");
    assert_true(json_real_value(json_object_get(lim, "bf16_gflops")) == 0.0);
    assert_true(json_real_value(json_object_get(lim, "amx_gflops")) == 0.0);
    assert_string_equal(json_string_value(json_object_get(lim, "amx")), "isa = avx2");
    const char *dn = json_string_value(
        json_object_get(json_array_get(json_object_get(rec, "devices"), 0), "device_name"));
    /* the table opens the bracket; the INT4 GEMV's unit may follow it (+int8_dot=3:avx2) */
    assert_non_null(strstr(dn, "[avx2]") ? strstr(dn, "[avx2]") : strstr(dn, "[avx2+"));
    json_decref(rec);

    /* BF16 weights with bf16_dot = 1: the stages are held to the unit the device names. */
    write_cpu_conf(conf, "bf16_dot = 1");
    const char *bargs[] = { "--shape", "tiny", "--dtype", "bf16", "--repeat", "1", "--warmup",
                            "0", "--gen-tokens", "2", "--prompt-tokens", "5", "--probe-mb", "16",
                            "--json", "--quiet", "--cache", cache_dir, "--conf", conf, NULL };
    if (run_bench(bargs) != 0 && strstr(err_text, "bf16_dot=1 needs")) {
        print_message("bf16_dot = 1: no bf16 unit on this CPU; skipped\n");
        return;
    }
    rec = run_json(bargs);
    lim = json_object_get(rec, "limits");
    dn = json_string_value(
        json_object_get(json_array_get(json_object_get(rec, "devices"), 0), "device_name"));
    const char *unit = json_string_value(json_object_get(lim, "language_unit"));
    const char *want = strstr(dn, "+bf16_dot:amx") ? "AMX bf16" : "bf16 dot";
    if (strcmp(unit, want) != 0)
        fail_msg("device \"%s\": language_unit \"%s\", expected \"%s\"", dn, unit, want);
    assert_string_equal(json_string_value(json_object_get(lim, "vision_unit")), want);
    json_decref(rec);
}

static int64_t int_at(const json_t *obj, const char *key)
{
    const json_t *v = json_object_get(obj, key);
    if (!json_is_integer(v))
        fail_msg("\"%s\" is not an integer", key);
    return (int64_t)json_integer_value(v);
}

static double num_at(const json_t *obj, const char *key)
{
    const json_t *v = json_object_get(obj, key);
    if (!json_is_number(v))
        fail_msg("\"%s\" is not a number", key);
    return json_number_value(v);
}

/* tensors[name] == shape (n dims). */
static void check_tensor(const json_t *plan, const char *name, int n, const int64_t *shape)
{
    const json_t *t = json_object_get(json_object_get(plan, "tensors"), name);
    if (!json_is_array(t))
        fail_msg("no tensor %s", name);
    if ((int)json_array_size(t) != n)
        fail_msg("tensor %s has %zu dims, expected %d", name, json_array_size(t), n);
    for (int i = 0; i < n; i++)
        if (json_integer_value(json_array_get(t, (size_t)i)) != shape[i])
            fail_msg("tensor %s dim %d is %lld, expected %lld", name, i,
                     (long long)json_integer_value(json_array_get(t, (size_t)i)),
                     (long long)shape[i]);
}
#define TENSOR(plan, name, ...)                                                                \
    check_tensor(plan, name, (int)(sizeof((int64_t[]){ __VA_ARGS__ }) / sizeof(int64_t)),    \
                 (const int64_t[]){ __VA_ARGS__ })

static void near(double got, double want, const char *what)
{
    if (fabs(got - want) > 1e-9 * fabs(want) + 1e-9)
        fail_msg("%s: %.17g, expected %.17g", what, got, want);
}

/* The work accounting agrees with the tensor list: each stage's weight bytes, and decode
 * reading every language weight but the embedding table, of which one row. */
static void check_bytes(const json_t *plan, double V, double D, double w_bytes)
{
    const json_t *w = json_object_get(plan, "work");
    near(num_at(w, "vision_weight_bytes"), num_at(plan, "vision_weight_bytes"), "vision bytes");
    near(num_at(w, "language_weight_bytes"), num_at(plan, "language_weight_bytes"),
         "language bytes");
    near(num_at(w, "decode_weight_bytes"),
         num_at(plan, "language_weight_bytes") - (V * D - D) * w_bytes, "decode weight bytes");
    near(num_at(plan, "checkpoint_bytes"),
         num_at(plan, "vision_weight_bytes") + num_at(plan, "language_weight_bytes"),
         "checkpoint bytes");
}

static void test_qwen2vl_7b_plan(void **state)
{
    (void)state;
    json_t *p = run_json((const char *[]){ "--shape", "qwen2-vl-7b", "--layers", "1",
                                           "--image-size", "336", "--prompt-tokens", "8",
                                           "--gen-tokens", "4", "--dry-run", "--json",
                                           "--cache", cache_dir, NULL });
    assert_string_equal(json_string_value(json_object_get(p, "model_type")), "qwen2_vl");
    assert_false(json_is_true(json_object_get(p, "cached")));
    /* config.json: the published Qwen2-VL-7B-Instruct values (models.md §4.1, §7.3). */
    const json_t *c = json_object_get(p, "config");
    assert_string_equal(json_string_value(json_object_get(c, "model_type")), "qwen2_vl");
    assert_int_equal(int_at(c, "image_token_id"), 151655);
    assert_int_equal(int_at(c, "video_token_id"), 151656);
    assert_int_equal(int_at(c, "vision_start_token_id"), 151652);
    assert_int_equal(int_at(c, "vision_end_token_id"), 151653);
    assert_true(json_is_false(json_object_get(c, "tie_word_embeddings")));
    const json_t *t = json_object_get(c, "text_config");
    assert_int_equal(int_at(t, "hidden_size"), 3584);
    assert_int_equal(int_at(t, "intermediate_size"), 18944);
    assert_int_equal(int_at(t, "num_attention_heads"), 28);
    assert_int_equal(int_at(t, "num_key_value_heads"), 4);
    assert_int_equal(int_at(t, "num_hidden_layers"), 1);
    assert_int_equal(int_at(t, "vocab_size"), 152064);
    assert_int_equal(int_at(t, "max_position_embeddings"), 32768);
    near(num_at(t, "rms_norm_eps"), 1e-6, "rms_norm_eps");
    const json_t *rope = json_object_get(t, "rope_parameters");
    near(num_at(rope, "rope_theta"), 1e6, "rope_theta");
    const json_t *ms = json_object_get(rope, "mrope_section");
    assert_int_equal(json_array_size(ms), 3);
    assert_int_equal(json_integer_value(json_array_get(ms, 0)), 16);
    assert_int_equal(json_integer_value(json_array_get(ms, 1)), 24);
    assert_int_equal(json_integer_value(json_array_get(ms, 2)), 24);
    const json_t *v = json_object_get(c, "vision_config");
    assert_int_equal(int_at(v, "depth"), 1);
    assert_int_equal(int_at(v, "embed_dim"), 1280);
    assert_int_equal(int_at(v, "num_heads"), 16);
    assert_int_equal(int_at(v, "mlp_ratio"), 4);
    assert_int_equal(int_at(v, "hidden_size"), 3584);
    assert_int_equal(int_at(v, "patch_size"), 14);
    assert_int_equal(int_at(v, "spatial_merge_size"), 2);
    assert_int_equal(int_at(v, "temporal_patch_size"), 2);
    assert_string_equal(json_string_value(json_object_get(v, "hidden_act")), "quick_gelu");
    /* Tensors in the hub's names (models.md §4.6). */
    assert_int_equal(int_at(p, "n_tensors"), 2 + 12 + 1 + 12 + 6 + 1);
    TENSOR(p, "visual.patch_embed.proj.weight", 1280, 3, 2, 14, 14);
    TENSOR(p, "visual.blocks.0.attn.qkv.weight", 3840, 1280);
    TENSOR(p, "visual.blocks.0.attn.qkv.bias", 3840);
    TENSOR(p, "visual.blocks.0.attn.proj.weight", 1280, 1280);
    TENSOR(p, "visual.blocks.0.mlp.fc1.weight", 5120, 1280);
    TENSOR(p, "visual.blocks.0.mlp.fc2.weight", 1280, 5120);
    TENSOR(p, "visual.blocks.0.norm2.bias", 1280);
    TENSOR(p, "visual.merger.ln_q.weight", 1280);
    TENSOR(p, "visual.merger.mlp.0.weight", 5120, 5120);
    TENSOR(p, "visual.merger.mlp.2.weight", 3584, 5120);
    TENSOR(p, "visual.merger.mlp.2.bias", 3584);
    TENSOR(p, "model.embed_tokens.weight", 152064, 3584);
    TENSOR(p, "model.layers.0.self_attn.q_proj.weight", 3584, 3584);
    TENSOR(p, "model.layers.0.self_attn.q_proj.bias", 3584);
    TENSOR(p, "model.layers.0.self_attn.k_proj.weight", 512, 3584);
    TENSOR(p, "model.layers.0.self_attn.v_proj.bias", 512);
    TENSOR(p, "model.layers.0.self_attn.o_proj.weight", 3584, 3584);
    TENSOR(p, "model.layers.0.mlp.gate_proj.weight", 18944, 3584);
    TENSOR(p, "model.layers.0.mlp.down_proj.weight", 3584, 18944);
    TENSOR(p, "model.norm.weight", 3584);
    TENSOR(p, "lm_head.weight", 152064, 3584);
    assert_null(json_object_get(json_object_get(p, "tensors"),
                                "model.layers.1.mlp.up_proj.weight"));
    /* 336² stays 336² (a multiple of 28 within the pixel bounds): 24×24 patches, 144 tokens. */
    const json_t *img = json_object_get(p, "image");
    assert_int_equal(int_at(img, "height"), 336);
    assert_int_equal(int_at(img, "rows"), 24);
    assert_int_equal(int_at(img, "cols"), 24);
    assert_int_equal(int_at(img, "image_tokens"), 144);
    const json_t *w = json_object_get(p, "work");
    assert_int_equal(int_at(w, "n_patches"), 576);
    assert_int_equal(int_at(w, "n_image_tokens"), 144);
    /* Vision: Conv3d patch embed, one block (biased projections, bidirectional attention over
     * the 576 patches), the merger over 144 rows of 4·1280. */
    const double N = 576, E = 1280, Iv = 5120, D = 3584, E4 = 5120, Nm = 144;
    near(num_at(w, "vision_gflop") * 1e9,
         2 * N * 1176 * E + N * (2 * (4 * E * E + 2 * E * Iv) + 5 * E + Iv) + 4 * N * N * E +
             Nm * (2 * E4 * E4 + E4 + 2 * E4 * D + D),
         "vision flop");
    /* Prefill: q/k/v with bias, GQA 28/4 (K, V 512 wide), causal attention, LM head. */
    const double S = (double)int_at(w, "n_prompt_tokens_estimate"), I = 18944, V = 152064;
    near(num_at(w, "prefill_gflop") * 1e9,
         S * (2 * (D * D + 2 * D * 512 + D * D + 3 * D * I) + D + 2 * 512) +
             2 * D * S * (S + 1) + 2 * D * V,
         "prefill flop");
    check_bytes(p, V, D, 2);
    json_decref(p);

    /* A larger image is smart-resized: 1000² → round(1000/28)·28 = 1008² → 72×72 patches,
     * 1296 tokens; 10² → up to the 3136-pixel minimum, 56² → 16 patches, 4 tokens. */
    p = run_json((const char *[]){ "--shape", "qwen2-vl-7b", "--image-size", "1000",
                                   "--dry-run", "--json", "--cache", cache_dir, NULL });
    assert_int_equal(int_at(json_object_get(p, "image"), "height"), 1008);
    assert_int_equal(int_at(json_object_get(p, "image"), "image_tokens"), 1296);
    assert_int_equal(int_at(json_object_get(json_object_get(p, "config"), "text_config"),
                            "num_hidden_layers"), 28);
    assert_int_equal(int_at(json_object_get(json_object_get(p, "config"), "vision_config"),
                            "depth"), 32);
    json_decref(p);
    p = run_json((const char *[]){ "--shape", "qwen2-vl-7b", "--image-size", "10",
                                   "--dry-run", "--json", "--cache", cache_dir, NULL });
    assert_int_equal(int_at(json_object_get(p, "image"), "height"), 56);
    assert_int_equal(int_at(json_object_get(p, "image"), "image_tokens"), 4);
    json_decref(p);
}

static void test_fuyu_8b_plan(void **state)
{
    (void)state;
    json_t *p = run_json((const char *[]){ "--shape", "fuyu-8b", "--layers", "1",
                                           "--prompt-tokens", "8", "--gen-tokens", "4",
                                           "--dry-run", "--json", "--cache", cache_dir, NULL });
    assert_string_equal(json_string_value(json_object_get(p, "model_type")), "fuyu");
    assert_true(json_is_true(json_object_get(p, "supported")));
    /* config.json: adept/fuyu-8b (models.md §5.1). */
    const json_t *c = json_object_get(p, "config");
    assert_int_equal(int_at(c, "patch_size"), 30);
    assert_int_equal(int_at(c, "image_size"), 300);
    assert_int_equal(int_at(c, "image_token_id"), 71011);
    assert_int_equal(int_at(c, "num_channels"), 3);
    const json_t *t = json_object_get(c, "text_config");
    assert_string_equal(json_string_value(json_object_get(t, "model_type")), "persimmon");
    assert_int_equal(int_at(t, "hidden_size"), 4096);
    assert_int_equal(int_at(t, "intermediate_size"), 16384);
    assert_int_equal(int_at(t, "num_attention_heads"), 64);
    assert_int_equal(int_at(t, "num_hidden_layers"), 1);
    assert_int_equal(int_at(t, "vocab_size"), 262144);
    assert_int_equal(int_at(t, "max_position_embeddings"), 16384);
    assert_string_equal(json_string_value(json_object_get(t, "hidden_act")), "relu2");
    assert_true(json_is_true(json_object_get(t, "qk_layernorm")));
    near(num_at(t, "layer_norm_eps"), 1e-5, "layer_norm_eps");
    const json_t *rope = json_object_get(t, "rope_parameters");
    near(num_at(rope, "rope_theta"), 25000, "rope_theta");
    near(num_at(rope, "partial_rotary_factor"), 0.5, "partial_rotary_factor");
    /* Tensors (models.md §5.6). */
    assert_int_equal(int_at(p, "n_tensors"), 4 + 16 + 2);
    TENSOR(p, "vision_embed_tokens.weight", 4096, 2700);
    TENSOR(p, "vision_embed_tokens.bias", 4096);
    TENSOR(p, "language_model.model.embed_tokens.weight", 262144, 4096);
    TENSOR(p, "language_model.model.layers.0.self_attn.query_key_value.weight", 12288, 4096);
    TENSOR(p, "language_model.model.layers.0.self_attn.query_key_value.bias", 12288);
    TENSOR(p, "language_model.model.layers.0.self_attn.q_layernorm.weight", 64);
    TENSOR(p, "language_model.model.layers.0.self_attn.k_layernorm.bias", 64);
    TENSOR(p, "language_model.model.layers.0.self_attn.dense.weight", 4096, 4096);
    TENSOR(p, "language_model.model.layers.0.mlp.dense_h_to_4h.weight", 16384, 4096);
    TENSOR(p, "language_model.model.layers.0.mlp.dense_h_to_4h.bias", 16384);
    TENSOR(p, "language_model.model.layers.0.mlp.dense_4h_to_h.weight", 4096, 16384);
    TENSOR(p, "language_model.model.layers.0.input_layernorm.bias", 4096);
    TENSOR(p, "language_model.model.final_layernorm.weight", 4096);
    TENSOR(p, "language_model.lm_head.weight", 262144, 4096);
    /* 1080² fits the 1080×1920 target: 36×36 patches, a |NEWLINE| after each row. */
    const json_t *w = json_object_get(p, "work");
    assert_int_equal(int_at(w, "n_patches"), 1296);
    assert_int_equal(int_at(w, "n_image_tokens"), 36 * 37);
    const double N = 1296, D = 4096, I = 16384, V = 262144;
    near(num_at(w, "vision_gflop") * 1e9, N * (2 * 2700 * D + D), "vision flop");
    /* Prefill: fused qkv, dense, relu² MLP, all biased; no GQA. */
    const double S = (double)int_at(w, "n_prompt_tokens_estimate");
    near(num_at(w, "prefill_gflop") * 1e9,
         S * (2 * (3 * D * D + D * D + 2 * D * I) + 5 * D + I) + 2 * D * S * (S + 1) +
             2 * D * V,
         "prefill flop");
    check_bytes(p, V, D, 2);
    json_decref(p);

    /* Larger than the target: resized to fit (2000² → 1080²), padded to whole patches. */
    p = run_json((const char *[]){ "--shape", "fuyu-8b", "--image-size", "2000", "--dry-run",
                                   "--json", "--cache", cache_dir, NULL });
    assert_int_equal(int_at(json_object_get(p, "image"), "height"), 1080);
    assert_int_equal(int_at(json_object_get(p, "image"), "rows"), 36);
    json_decref(p);
    p = run_json((const char *[]){ "--shape", "fuyu-8b", "--image-size", "301", "--dry-run",
                                   "--json", "--cache", cache_dir, NULL });
    assert_int_equal(int_at(json_object_get(p, "image"), "rows"), 11);
    assert_int_equal(int_at(json_object_get(p, "image"), "image_tokens"), 11 * 12);
    json_decref(p);

    /* The LLaVA shapes keep their accounting consistent too. */
    p = run_json((const char *[]){ "--shape", "llava-1.5-7b", "--layers", "2", "--dry-run",
                                   "--json", "--cache", cache_dir, NULL });
    assert_int_equal(int_at(json_object_get(p, "work"), "n_image_tokens"), 576);
    check_bytes(p, 32064, 4096, 2);
    json_decref(p);
}

static const char *const fuyu_args[] = {
    "--shape", "tiny-fuyu", "--repeat", "1", "--gen-tokens", "4", "--prompt-tokens", "5",
    "--probe-mb", "16", "--json", "--quiet", "--cache", cache_dir, NULL,
};

static void test_tiny_fuyu_runs(void **state)
{
    (void)state;
    json_t *rec = run_json(fuyu_args);
    assert_string_equal(json_string_value(json_object_get(rec, "model_type")), "fuyu");
    assert_int_equal(int_at(rec, "n_tokens"), 4);
    /* 60² → 2×2 patches: 2 rows of 2 |SPEAKER| + |NEWLINE|, <s>, 5 prompt tokens, <0x04>:
     * the synthetic Unigram tokenizer gives exactly one token per word. */
    const json_t *w = json_object_get(rec, "work");
    assert_int_equal(int_at(w, "n_patches"), 4);
    assert_int_equal(int_at(w, "n_image_tokens"), 6);
    assert_int_equal(int_at(rec, "n_prompt_tokens"), 6 + 1 + 5 + 1);
    const json_t *st = json_object_get(rec, "stages");
    static const char *const limited[] = { "vision_ms", "prefill_ms", "decode_ms_per_token" };
    for (size_t i = 0; i < 3; i++) {
        const json_t *f = json_object_get(st, limited[i]);
        assert_true(json_is_number(json_object_get(f, "limit")));
        assert_true(json_is_number(json_object_get(f, "ratio")));
    }
    json_decref(rec);
    char path[400];
    struct stat sb;
    snprintf(path, sizeof path, "%s/tiny-fuyu-Lall-f16/preprocessor_config.json", cache_dir);
    assert_int_equal(stat(path, &sb), 0);
}

static void test_tiny_qwen2vl_runs_or_is_refused(void **state)
{
    (void)state;
    json_t *p = run_json((const char *[]){ "--shape", "tiny-qwen2vl", "--dry-run", "--json",
                                           "--cache", cache_dir, NULL });
    bool supported = json_is_true(json_object_get(p, "supported"));
    assert_int_equal(int_at(json_object_get(p, "work"), "n_image_tokens"), 4);
    json_decref(p);
    static const char *const args[] = {
        "--shape", "tiny-qwen2vl", "--repeat", "1", "--gen-tokens", "4", "--prompt-tokens",
        "5", "--probe-mb", "16", "--json", "--quiet", "--cache", cache_dir, NULL,
    };
    if (!supported) {
        /* The model type is not in this build: a clear refusal before anything is written. */
        int rc = run_bench(args);
        assert_int_equal(rc, 2);
        assert_non_null(strstr(err_text, "qwen2_vl"));
        assert_non_null(strstr(err_text, "not supported by this build"));
        char path[400];
        struct stat sb;
        snprintf(path, sizeof path, "%s/tiny-qwen2vl-Lall-f16", cache_dir);
        assert_int_not_equal(stat(path, &sb), 0);
        return;
    }
    json_t *rec = run_json(args);
    assert_string_equal(json_string_value(json_object_get(rec, "model_type")), "qwen2_vl");
    assert_int_equal(int_at(rec, "n_tokens"), 4);
    /* At least the 4 image tokens, the 5 prompt tokens and the template around them. */
    assert_true(int_at(rec, "n_prompt_tokens") > 4 + 5);
    const json_t *st = json_object_get(rec, "stages");
    assert_true(json_is_number(json_object_get(json_object_get(st, "vision_ms"), "ratio")));
    assert_true(json_is_number(json_object_get(json_object_get(st, "prefill_ms"), "ratio")));
    json_decref(rec);
}

/* MemAvailable in bytes (0 when unknown). */
static double mem_available(void)
{
    FILE *f = fopen("/proc/meminfo", "r");
    char line[256];
    unsigned long long kb = 0;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1)
            break;
    if (f)
        fclose(f);
    return (double)kb * 1024;
}

static void test_refusals(void **state)
{
    (void)state;
    int rc = run_bench((const char *[]){ "--shape", "gpt-9", NULL });
    assert_int_equal(rc, 2);
    assert_non_null(strstr(err_text, "llava-1.5-7b"));
    assert_non_null(strstr(err_text, "qwen2-vl-7b"));
    assert_non_null(strstr(err_text, "fuyu-8b"));
    rc = run_bench((const char *[]){ "--dtype", "f8", NULL });
    assert_int_equal(rc, 2);
    rc = run_bench((const char *[]){ "--gen-tokens", "0", NULL });
    assert_int_equal(rc, 2);
    assert_non_null(strstr(err_text, "--gen-tokens"));
    rc = run_bench((const char *[]){ "--temperature", "warm", NULL });
    assert_int_equal(rc, 2);
    assert_non_null(strstr(err_text, "--temperature \"warm\": expected a number"));
    rc = run_bench((const char *[]){ "--top-p", "0.9x", NULL });
    assert_int_equal(rc, 2);
    assert_non_null(strstr(err_text, "--top-p"));
    rc = run_bench((const char *[]){ "--top-k", "-1", NULL });
    assert_int_equal(rc, 2);
    assert_non_null(strstr(err_text, "--top-k"));
    rc = run_bench((const char *[]){ "--response-format", "yaml", NULL });
    assert_int_equal(rc, 2);
    assert_non_null(strstr(err_text, "--response-format \"yaml\": expected text or "
                                     "json_object"));

    /* A cache folder that cannot be made (its parent is a file), for each family. */
    char bad[400];
    snprintf(bad, sizeof bad, "%s/mmrt-bench.stdout/cache", cache_dir); /* tool_run.c's file */
    static const char *const shapes[] = { "tiny", "tiny-fuyu", "fuyu-8b" };
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        rc = run_bench((const char *[]){ "--shape", shapes[i], "--layers", "1", "--cache", bad,
                                         "--quiet", NULL });
        assert_int_equal(rc, 2);
        assert_non_null(strstr(err_text, "cannot be written"));
    }

    /* Weights that cannot fit this machine: the full Fuyu-8B in f32 (about 37.6 GB), checked
     * only where that is well over the memory available (by a quarter), so the run is refused
     * before anything is written. */
    json_t *p = run_json((const char *[]){ "--shape", "fuyu-8b", "--dtype", "f32", "--dry-run",
                                           "--json", "--cache", cache_dir, NULL });
    double need = num_at(p, "checkpoint_bytes"), avail = mem_available();
    json_decref(p);
    if (avail > 0 && need > 1.25 * avail) {
        rc = run_bench((const char *[]){ "--shape", "fuyu-8b", "--dtype", "f32", "--cache",
                                         cache_dir, "--quiet", NULL });
        assert_int_equal(rc, 2);
        assert_non_null(strstr(err_text, "does not fit"));
        char path[400];
        struct stat sb;
        snprintf(path, sizeof path, "%s/fuyu-8b-Lall-f32", cache_dir);
        assert_int_not_equal(stat(path, &sb), 0);
    }
}

/* Sampled decoding: the synthetic model has no end token, so every request still gives
 * --gen-tokens tokens; a temperature the request refuses fails the run, naming it. JSON
 * answers run. */
static void test_tiny_sampled(void **state)
{
    (void)state;
    json_t *rec = run_json((const char *[]){ "--shape", "tiny", "--repeat", "1", "--gen-tokens",
                                             "4", "--prompt-tokens", "5", "--probe-mb", "16",
                                             "--batch", "2", "--temperature", "1",
                                             "--top-k", "50", "--top-p", "0.9", "--json",
                                             "--quiet", "--cache", cache_dir, NULL });
    assert_int_equal(int_at(rec, "n_tokens"), 4);
    json_decref(rec);
    /* JSON answers run too: at most --gen-tokens each (an object may close sooner). */
    rec = run_json((const char *[]){ "--shape", "tiny", "--repeat", "1", "--gen-tokens", "6",
                                     "--prompt-tokens", "5", "--probe-mb", "16", "--batch", "2",
                                     "--response-format", "json_object", "--json", "--quiet",
                                     "--cache", cache_dir, NULL });
    assert_true(int_at(rec, "n_tokens") >= 1 && int_at(rec, "n_tokens") <= 6);
    json_decref(rec);
    int rc = run_bench((const char *[]){ "--shape", "tiny", "--repeat", "1", "--gen-tokens",
                                         "2", "--prompt-tokens", "5", "--probe-mb", "16",
                                         "--temperature", "200", "--quiet", "--cache",
                                         cache_dir, NULL });
    assert_int_not_equal(rc, 0);
    assert_non_null(strstr(err_text, "temperature 200"));
}

/* --vision-cache: each of --repeat fresh images runs as a miss, then as a hit; the record
 * says so in "vision_cache" (the timings themselves are not asserted). */
static void test_tiny_vision_cache(void **state)
{
    (void)state;
    json_t *rec = run_json((const char *[]){ "--shape", "tiny", "--repeat", "2", "--gen-tokens",
                                             "2", "--prompt-tokens", "5", "--probe-mb", "16",
                                             "--json", "--quiet", "--cache", cache_dir,
                                             "--vision-cache", NULL });
    const json_t *vc = json_object_get(rec, "vision_cache");
    if (!json_is_object(vc))
        fail_msg("no \"vision_cache\" in the record");
    assert_int_equal(int_at(vc, "pairs"), 2);
    assert_int_equal(int_at(vc, "hits"), 2);
    assert_int_equal(int_at(vc, "queries"), 4);
    assert_true(num_at(vc, "miss_ttft_ms") > 0 && num_at(vc, "hit_ttft_ms") > 0);
    near(num_at(vc, "ratio_limit"), 0.5, "ratio_limit");
    assert_true(json_is_boolean(json_object_get(vc, "within_limit")));
    json_decref(rec);
    /* Without the option the record has no such member. */
    rec = run_json(tiny_args);
    assert_null(json_object_get(rec, "vision_cache"));
    json_decref(rec);
}

/* --solo: after each round its first request runs again alone; the record gives that
 * sequence's decode rate and the batched rate over it, and the measured requests (their
 * "runs") are the rounds' alone. */
static void test_tiny_solo(void **state)
{
    (void)state;
    json_t *rec = run_json((const char *[]){ "--shape", "tiny", "--repeat", "2", "--gen-tokens",
                                             "8", "--prompt-tokens", "5", "--probe-mb", "16",
                                             "--batch", "3", "--warmup", "0", "--solo",
                                             "--json", "--quiet", "--cache", cache_dir, NULL });
    const json_t *thr = json_object_get(rec, "throughput");
    const json_t *solo = json_object_get(thr, "solo");
    if (!json_is_object(solo))
        fail_msg("no \"throughput\".\"solo\" in the record");
    const double one = num_at(solo, "decode_tokens_per_s");
    const double together = num_at(thr, "decode_window_tokens_per_s");
    assert_true(one > 0 && together > 0);
    near(num_at(solo, "decode_window_x"), together / one, "decode_window_x");
    /* each round's rate, in order; two of them: their median is their mean */
    const json_t *rounds = json_object_get(solo, "rounds");
    assert_int_equal(json_array_size(rounds), 2);
    const double r0 = json_number_value(json_array_get(rounds, 0)),
                 r1 = json_number_value(json_array_get(rounds, 1));
    assert_true(r0 > 0 && r1 > 0);
    near(one, 0.5 * (r0 + r1), "decode_tokens_per_s, the rounds' median");
    assert_int_equal(json_array_size(json_object_get(rec, "runs")), 6);
    json_decref(rec);
    rec = run_json(tiny_args);
    assert_null(json_object_get(json_object_get(rec, "throughput"), "solo"));
    json_decref(rec);
}

static int setup(void **state)
{
    (void)state;
    snprintf(cache_dir, sizeof cache_dir, "/tmp/mmrt-test-bench-XXXXXX");
    return mkdtemp(cache_dir) ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", cache_dir);
    return system(cmd) == 0 ? 0 : -1;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tiny_json_has_every_field),
        cmocka_unit_test(test_tiny_vision_cache),
        cmocka_unit_test(test_limits_follow_isa),
        cmocka_unit_test(test_qwen2vl_7b_plan),
        cmocka_unit_test(test_fuyu_8b_plan),
        cmocka_unit_test(test_tiny_fuyu_runs),
        cmocka_unit_test(test_tiny_qwen2vl_runs_or_is_refused),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_tiny_sampled),
        cmocka_unit_test(test_tiny_solo),
    };
    return cmocka_run_group_tests_name("bench", tests, setup, teardown);
}
