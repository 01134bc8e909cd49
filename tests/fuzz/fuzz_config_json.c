/*
 * tests/fuzz/fuzz_config_json.c — libFuzzer target for a checkpoint's config.json as the
 * runtime reads it (core/runtime.c, then the models' config readers).
 *
 * The input is the whole file. It is written to a memfd and loaded through its
 * /proc/self/fd path with mmrt_json_load_object() and the runtime's limits (16 MiB, the
 * default depth), so the file reader, the depth pre-scan and jansson run exactly as for a
 * real checkpoint. An accepted object then goes through every reader that takes a parsed
 * config without touching weights, whatever its model_type says (each must cope with any
 * object):
 *   mmrt_quantization_config_check (quantization_config), mmrt_llava_config_parse (which
 *   runs the CLIP and LLaMA readers and the feature layers), mmrt_clip_config_parse and
 *   mmrt_qwen2vl_vision_config_parse on vision_config, mmrt_llama_config_parse on the top
 *   level and on text_config, mmrt_persimmon_config_parse on text_config or the top level,
 *   and, for the four supported model types, mmrt_pool_budget_estimate (the arithmetic on
 *   those sizes that `pool_mb = auto` does before any device opens) with default options.
 * Asserted: a refusal leaves the output untouched and writes one printable line; an
 * accepted config holds what the readers' headers promise (sizes in range, heads dividing
 * the width, head sizes even / multiples of 4 / at most 256, positive finite eps and theta,
 * special ids below the vocabulary, M-RoPE sections summing to head_dim / 2, feature layers
 * inside the tower, a 4-bit group size mmrt runs), and the pool estimate is positive and
 * does not wrap. Invariants are checked with __builtin_trap(), which libFuzzer reports as a
 * crash.
 *
 * The same entry point is linked into the normal build with replay_main.c, so the committed
 * corpus (tests/fuzz/corpus/config_json) runs as a ctest everywhere.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "clip.h"
#include "formats/json.h"
#include "llama.h"
#include "llava_common.h"
#include "model.h"
#include "persimmon.h"
#include "pool_budget.h"
#include "qwen2vl_vision.h"
#include "fuzz_check.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);


#define CONFIG_MAX_BYTES (16u << 20) /* core/runtime.c */

static int g_fd = -1;
static char g_path[64];

static void check_message(const struct mmrt_error *err, mmrt_status st)
{
    CHECK(st < 0 && err->status == st);
    fuzz_check_message(err);
}

/* Runs a reader into *out, filled with a pattern first; on failure *out must still hold it. */
#define READ(call, out)                                                                        \
    ({                                                                                         \
        struct mmrt_error err_ = { 0 };                                                        \
        memset(&(out), 0xa5, sizeof(out));                                                     \
        __typeof__(out) before_ = (out);                                                       \
        const mmrt_status st_ = (call);                                                        \
        if (st_ != MMRT_OK) {                                                                  \
            check_message(&err_, st_);                                                         \
            CHECK(memcmp(&before_, &(out), sizeof(out)) == 0);                                 \
        }                                                                                      \
        st_;                                                                                   \
    })
#define ERR (&err_)

static bool act_ok(enum mmrt_op a)
{
    return a == MMRT_OP_QUICK_GELU || a == MMRT_OP_GELU || a == MMRT_OP_GELU_TANH ||
           a == MMRT_OP_SILU;
}

static void check_llama(const struct mmrt_llama_config *c)
{
    CHECK(c->vocab >= 1 && c->vocab <= 1 << 24);
    CHECK(c->hidden >= 1 && c->hidden <= 1 << 17);
    CHECK(c->intermediate >= 1 && c->intermediate <= 1 << 20);
    CHECK(c->n_layers >= 1 && c->n_layers <= 1024);
    CHECK(c->n_heads >= 1 && c->n_heads <= 1024 && c->hidden % c->n_heads == 0);
    CHECK(c->n_kv_heads >= 1 && c->n_heads % c->n_kv_heads == 0);
    CHECK(c->head_dim >= 2 && c->head_dim <= 256 && c->head_dim % 2 == 0);
    CHECK(c->max_positions >= 1 && c->max_positions <= 1 << 24);
    CHECK(isfinite(c->rms_eps) && c->rms_eps > 0 && c->rms_eps <= 1);
    CHECK(isfinite(c->rope_theta) && c->rope_theta > 0);
    CHECK(c->bos_id >= -1 && c->bos_id < c->vocab);
    CHECK(c->eos_id >= -1 && c->eos_id < c->vocab);
    CHECK(c->pad_id >= -1 && c->pad_id < c->vocab);
    CHECK(!(c->attention_bias && c->qkv_bias));
    CHECK(c->n_mrope_axes == 0 || c->n_mrope_axes == 3);
    if (c->n_mrope_axes == 3) {
        CHECK(c->mrope_section[0] >= 0 && c->mrope_section[1] >= 0 && c->mrope_section[2] >= 0);
        CHECK((int64_t)c->mrope_section[0] + c->mrope_section[1] + c->mrope_section[2] ==
              c->head_dim / 2);
    }
}

static void check_clip(const struct mmrt_clip_config *c)
{
    CHECK(c->hidden >= 1 && c->hidden <= 1 << 16);
    CHECK(c->intermediate >= 1 && c->intermediate <= 1 << 18);
    CHECK(c->n_layers >= 1 && c->n_layers <= 1024);
    CHECK(c->n_heads >= 1 && c->hidden % c->n_heads == 0 && c->hidden / c->n_heads <= 256);
    CHECK(c->channels >= 1 && c->channels <= 16);
    CHECK(c->patch >= 1 && c->image_size >= c->patch && c->image_size % c->patch == 0);
    CHECK(isfinite(c->ln_eps) && c->ln_eps >= 0 && c->ln_eps <= 1);
    CHECK(c->act == MMRT_OP_QUICK_GELU || c->act == MMRT_OP_GELU || c->act == MMRT_OP_GELU_TANH);
}

static void check_persimmon(const struct mmrt_persimmon_config *c)
{
    CHECK(c->vocab >= 1 && c->vocab <= 1 << 24);
    CHECK(c->hidden >= 1 && c->hidden <= 1 << 17);
    CHECK(c->intermediate >= 1 && c->intermediate <= 1 << 20);
    CHECK(c->n_layers >= 1 && c->n_layers <= 1024);
    CHECK(c->n_heads >= 1 && c->hidden % c->n_heads == 0);
    CHECK(c->head_dim == c->hidden / c->n_heads && c->head_dim <= 256);
    CHECK(c->n_rot >= 2 && c->n_rot % 2 == 0 && c->n_rot <= c->head_dim);
    CHECK(c->max_positions >= 1);
    CHECK(isfinite(c->ln_eps) && c->ln_eps > 0 && c->ln_eps <= 1);
    CHECK(isfinite(c->rope_theta) && c->rope_theta > 0);
    CHECK(c->bos_id >= -1 && c->eos_id >= -1);
}

static void check_qwen2vl_vision(const struct mmrt_qwen2vl_vision_config *c)
{
    CHECK(c->depth >= 1 && c->depth <= 1024);
    CHECK(c->embed_dim >= 1 && c->hidden >= 1 && c->n_heads >= 1);
    const int64_t hd = c->embed_dim / c->n_heads;
    CHECK(c->embed_dim % c->n_heads == 0 && hd % 4 == 0 && hd >= 4 && hd <= 256);
    CHECK(c->mlp_hidden >= 1 && c->mlp_hidden <= 1 << 20);
    CHECK(c->channels == 3);
    CHECK(c->patch >= 1 && c->merge >= 1 && c->temporal >= 1);
    CHECK(c->patch * c->patch * c->channels * c->temporal <= 1 << 24);
    CHECK(isfinite(c->rope_theta) && c->rope_theta > 0);
    CHECK(act_ok(c->act));
}

static void check_llava(const struct mmrt_llava_config *c)
{
    check_clip(&c->clip);
    check_llama(&c->text);
    CHECK(c->image_token_id >= 0 && c->image_token_id < c->text.vocab);
    CHECK(act_ok(c->proj_act));
    CHECK(c->n_feature_layers >= 1 && c->n_feature_layers <= MMRT_LLAVA_MAX_FEATURE_LAYERS);
    for (int i = 0; i < c->n_feature_layers; i++)
        CHECK(c->feature_layers[i] >= 0 && c->feature_layers[i] <= c->clip.n_layers);
}

static void check_budget(const struct mmrt_pool_budget *b)
{
    CHECK(b->vision_rows >= 0 && b->language_rows >= 1 && b->kv_tokens >= 1);
    CHECK(b->kv_bytes > 0 && b->language_bytes > 0);
    /* The sums mmrt_pool_budget_mb makes must not wrap. */
    CHECK(b->vision_bytes <= UINT64_MAX / 4 && b->kv_bytes <= UINT64_MAX / 4 &&
          b->language_bytes <= UINT64_MAX / 4);
    for (int v = 0; v < 2; v++)
        for (int l = 0; l < 2; l++)
            CHECK(mmrt_pool_budget_mb(b, v, l) >= MMRT_POOL_BUDGET_SMALL_MB);
}

static void check_packed(const struct mmrt_packed_format *p)
{
    CHECK(p->kind == MMRT_PACKED_NONE || p->kind == MMRT_PACKED_AWQ ||
          p->kind == MMRT_PACKED_GPTQ || p->kind == MMRT_PACKED_CT);
    CHECK(p->group == 0 || (p->group >= 32 && p->group <= 4096 && p->group % 32 == 0));
    CHECK(p->kind == MMRT_PACKED_GPTQ || !p->zero_minus_one);
}

static void setup(void)
{
    g_fd = memfd_create("config.json", MFD_CLOEXEC);
    if (g_fd < 0) {
        perror("memfd_create");
        abort();
    }
    snprintf(g_path, sizeof g_path, "/proc/self/fd/%d", g_fd);
}

static void run_readers(const json_t *root, const char *what)
{
    const char *type = NULL;
    struct mmrt_error e0 = { 0 };
    if (mmrt_json_opt_string(root, "model_type", what, NULL, &type, &e0) != MMRT_OK) {
        check_message(&e0, e0.status);
        type = NULL;
    }

    struct mmrt_packed_format packed;
    struct mmrt_error eq = { 0 };
    if (mmrt_quantization_config_check(root, what, &packed, &eq) == MMRT_OK)
        check_packed(&packed);
    else
        check_message(&eq, eq.status);

    struct mmrt_llava_config lc;
    if (READ(mmrt_llava_config_parse(root, what, &lc, ERR), lc) == MMRT_OK)
        check_llava(&lc);

    json_t *empty = json_object();
    CHECK(empty != NULL);
    const json_t *vcfg = json_object_get(root, "vision_config");
    const json_t *tcfg = json_object_get(root, "text_config");
    if (!json_is_object(vcfg))
        vcfg = empty;
    struct mmrt_clip_config cc;
    if (READ(mmrt_clip_config_parse(vcfg, what, &cc, ERR), cc) == MMRT_OK)
        check_clip(&cc);
    struct mmrt_qwen2vl_vision_config qc;
    if (READ(mmrt_qwen2vl_vision_config_parse(vcfg, what, &qc, ERR), qc) == MMRT_OK)
        check_qwen2vl_vision(&qc);

    struct mmrt_llama_config tc;
    if (READ(mmrt_llama_config_parse(root, root, what, &tc, ERR), tc) == MMRT_OK)
        check_llama(&tc);
    if (json_is_object(tcfg) &&
        READ(mmrt_llama_config_parse(tcfg, root, what, &tc, ERR), tc) == MMRT_OK)
        check_llama(&tc);

    struct mmrt_persimmon_config pc;
    if (READ(mmrt_persimmon_config_parse(json_is_object(tcfg) ? tcfg : root, root, what, &pc,
                                         ERR), pc) == MMRT_OK)
        check_persimmon(&pc);
    json_decref(empty);

    /* What `pool_mb = auto` computes once model_type names a supported model. */
    static const char *const types[] = { "llava", "llava_next", "qwen2_vl", "fuyu" };
    for (size_t i = 0; type && i < sizeof types / sizeof types[0]; i++) {
        if (strcmp(type, types[i]) != 0)
            continue;
        const struct mmrt_model_options opts = { 0 };
        struct mmrt_pool_budget b;
        if (READ(mmrt_pool_budget_estimate(type, NULL, root, &opts, &b, ERR), b) == MMRT_OK)
            check_budget(&b);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (g_fd < 0)
        setup();
    if (ftruncate(g_fd, 0) != 0 || pwrite(g_fd, data, size, 0) != (ssize_t)size)
        abort();
    json_t *sentinel = (json_t *)&g_fd;
    json_t *root = sentinel;
    struct mmrt_error err = { 0 };
    const mmrt_status st = mmrt_json_load_object(g_path, CONFIG_MAX_BYTES, 0, &root, &err);
    if (st != MMRT_OK) {
        check_message(&err, st);
        CHECK(root == sentinel && (st == MMRT_ERR_FORMAT || st == MMRT_ERR_LIMIT));
        CHECK(strncmp(err.msg, g_path, strlen(g_path)) == 0);
        return 0;
    }
    CHECK(root != sentinel && json_is_object(root));
    run_readers(root, "fuzz/config.json");
    json_decref(root);
    return 0;
}
