/*
 * core/runtime.c — the runtime behind mmrt.h: turns a configuration (INI file or struct)
 * into opened devices with pools and stage placements, and answers requests.
 *
 * Creation validates everything it can before touching a device: device names unique,
 * stages naming defined devices, plugin-specific keys known to their plugin (so a typo in
 * deploy.ini is a FILE:LINE error, not a silently ignored key). Errors from an INI file carry
 * FILE:LINE; the same checks on a config struct name the field instead.
 */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>

#include "device.h"
#include "engine.h"
#include "error.h"
#include "formats/conf.h"
#include "formats/file.h"
#include "formats/image.h"
#include "formats/json.h"
#include "formats/tokenizer.h"
#include "generation_config.h"
#include "json_schema.h"
#include "log.h"
#include "mmrt/mmrt.h"
#include "model.h"
#include "plugin_loader.h"
#include "pool_budget.h"
#include "quant.h"
#include "schema_cache.h"
#include "vision_cache.h"

#define MAX_DEVICES 64

_Static_assert((int)MMRT_LEVEL1_DEFAULT == (int)MMRT_POOL_LEVEL1_DEFAULT &&
                   (int)MMRT_LEVEL1_ON == (int)MMRT_POOL_LEVEL1_ON &&
                   (int)MMRT_LEVEL1_OFF == (int)MMRT_POOL_LEVEL1_OFF,
               "the public level1 values are the pool's");

struct mmrt_runtime {
    struct mmrt_dev *devices[MAX_DEVICES];
    int n_devices;
    struct mmrt_dev *vision;   /* stage placements, never NULL once created */
    struct mmrt_dev *language;
    char *model_path;          /* NULL when the config has no model */
    const struct mmrt_model_type *model_type;
    struct mmrt_model *model;  /* loaded when model_path is set */
    struct mmrt_model_options model_opts; /* [model] settings, handed to the model */
    struct mmrt_engine_options engine_opts; /* [scheduler] settings */
    int vision_batch;          /* [scheduler] vision_batch: jobs whose vision runs together */
    uint64_t vision_batches, vision_batch_jobs; /* the worker's vision stages (under drive) */
    struct mmrt_language lang; /* the model's language stage, borrowed by the engine */
    struct mmrt_engine *engine; /* every request's language stage; NULL without a model */
    struct mmrt_vision_cache *vcache; /* the vision-feature cache; NULL when off */
    struct mmrt_schema_cache *schemas; /* compiled JSON schemas, shared by their requests */
    struct mmrt_vision_front vfront;  /* every request's vision stage goes through it */
    /* Whoever steps the engine or runs a vision stage holds `drive`: the worker thread of
     * submitted jobs, or an mmrt_run / mmrt_run_batch call for its duration. */
    pthread_mutex_t drive;
    pthread_mutex_t jobs_lock;   /* pending, stop, and every job's seq / cancel / done */
    pthread_cond_t work, done;
    struct mmrt_job *pending;    /* submitted, not yet taken by the worker (newest first) */
    /* With the stages on two devices, the worker's vision thread encodes the pending jobs
     * (taken oldest first) and hands them over in `ready` (oldest first) while the worker
     * steps the engine; vision_taken counts the jobs it holds in between. All under
     * jobs_lock. */
    struct mmrt_job *ready;
    int vision_taken;
    /* Every vision stage (model encode on the vision device) runs under vision_lock: the
     * worker's vision thread, mmrt_run_batch's and the callers of mmrt_run may each run one. */
    pthread_mutex_t vision_lock;
    /* The vision device's pool figures as last read (under stats_lock): what a reader gets
     * while a vision stage holds vision_lock, so that /metrics and the health probes never
     * wait for a tower pass. */
    struct mmrt_pool_stats vision_pool_seen;
    bool locks_ready, worker_started, stop;
    pthread_t worker;
    uint64_t n_outstanding;      /* submitted jobs not finished (under jobs_lock) */
    struct mmrt_job *finished;   /* done, not yet waited for (under jobs_lock) */
    /* What mmrt_stats and mmrt_device_memory report while the worker holds `drive`: the
     * worker publishes them after every step (under stats_lock). */
    pthread_mutex_t stats_lock;
    struct mmrt_runtime_stats snap;
    struct mmrt_memory_report snap_mem[MAX_DEVICES];
    double progress_ms;          /* when the worker last finished a step */
    bool worker_busy;            /* it has jobs (else progress is not expected) */
    bool worker_driving;         /* the worker holds drive: readers take the snapshot */
    char *source;              /* INI path or "config" for messages */
    struct mmrt_request run;   /* [run] defaults; strings owned below */
    struct mmrt_generation_defaults gen; /* the checkpoint's generation_config.json */
    char *run_image, *run_prompt, *run_schema;
    struct mmrt_image_input run_input; /* [run] image, what run.images points at */
    struct mmrt_error last;
};

/* One quantization_config key that must hold `want` (a string, compared without case, or an
 * integer when want is NULL and number ≥ 0); MMRT_ERR_UNSUPPORTED naming key and value. */
static mmrt_status qc_expect(const json_t *qc, const char *path, const char *scope,
                             const char *key, const char *want, long long number,
                             struct mmrt_error *err)
{
    const json_t *v = json_object_get(qc, key);
    char got[96];
    if (json_is_string(v))
        snprintf(got, sizeof got, "\"%.80s\"", json_string_value(v));
    else if (json_is_integer(v))
        snprintf(got, sizeof got, "%lld", (long long)json_integer_value(v));
    else if (json_is_boolean(v))
        snprintf(got, sizeof got, "%s", json_is_true(v) ? "true" : "false");
    else
        snprintf(got, sizeof got, "%s", v ? "(another type)" : "(missing)");
    const bool ok = want ? json_is_string(v) && strcasecmp(json_string_value(v), want) == 0
                         : json_is_integer(v) && json_integer_value(v) == number;
    if (ok)
        return MMRT_OK;
    char expected[96];
    if (want)
        snprintf(expected, sizeof expected, "\"%s\"", want);
    else
        snprintf(expected, sizeof expected, "%lld", number);
    return mmrt_error_set(err, MMRT_ERR_UNSUPPORTED, "%s: %s.%s %s is not one mmrt runs "
                          "(expected %s)", path, scope, key, got, expected);
}

/* A group_size key: a multiple of 32 up to 4096 (mmrt's U4 groups), or -1 where allow_row
 * (GPTQ: one group per row); *group gets it, 0 for -1. */
static mmrt_status qc_group(const json_t *qc, const char *path, const char *scope,
                            bool allow_row, int64_t *group, struct mmrt_error *err)
{
    const json_t *g = json_object_get(qc, "group_size");
    const long long gs = json_is_integer(g) ? (long long)json_integer_value(g) : -2;
    *group = gs > 0 ? gs : 0;
    if ((gs >= 32 && gs % 32 == 0 && gs <= 4096) || (allow_row && gs == -1))
        return MMRT_OK;
    return mmrt_error_set(err, MMRT_ERR_UNSUPPORTED, "%s: %s.group_size %lld is not one mmrt "
                          "runs (a multiple of 32, up to 4096%s)", path, scope, gs,
                          allow_row ? ", or -1" : "");
}

/* AWQ as published (quant_method "awq"): 4-bit GEMM packing with zero points, groups that
 * are a multiple of 32 (mmrt's U4 layout) — anything else is refused by key and value. */
static mmrt_status check_awq(const json_t *qc, const char *path, struct mmrt_packed_format *out,
                             struct mmrt_error *err)
{
    out->kind = MMRT_PACKED_AWQ;
    mmrt_status st = qc_expect(qc, path, "quantization_config", "bits", NULL, 4, err);
    if (st == MMRT_OK && json_object_get(qc, "version"))
        st = qc_expect(qc, path, "quantization_config", "version", "gemm", 0, err);
    const json_t *zp = json_object_get(qc, "zero_point");
    if (st == MMRT_OK && zp && !json_is_true(zp))
        st = mmrt_error_set(err, MMRT_ERR_UNSUPPORTED, "%s: quantization_config.zero_point "
                            "%s is not one mmrt runs (expected true)", path,
                            json_is_false(zp) ? "false" : "(not a boolean)");
    return st == MMRT_OK ? qc_group(qc, path, "quantization_config", false, &out->group, err)
                         : st;
}

/* GPTQ as published (quant_method "gptq"): 4 bits, groups a multiple of 32 or one per row,
 * checkpoint_format "gptq" (zero points stored minus one, the default) or "gptq_v2". Whether
 * act-order reorders the inputs is read from each matrix's g_idx at load. */
static mmrt_status check_gptq(const json_t *qc, const char *path,
                              struct mmrt_packed_format *out, struct mmrt_error *err)
{
    out->kind = MMRT_PACKED_GPTQ;
    out->zero_minus_one = true;
    mmrt_status st = qc_expect(qc, path, "quantization_config", "bits", NULL, 4, err);
    const json_t *f = json_object_get(qc, "checkpoint_format");
    if (st == MMRT_OK && f && !(json_is_string(f) && !strcmp(json_string_value(f), "gptq")))
        st = qc_expect(qc, path, "quantization_config", "checkpoint_format", "gptq_v2", 0, err);
    if (st == MMRT_OK && f)
        out->zero_minus_one = strcmp(json_string_value(f), "gptq") == 0;
    return st == MMRT_OK ? qc_group(qc, path, "quantization_config", true, &out->group, err)
                         : st;
}

/* compressed-tensors' pack-quantized INT4 (what llm-compressor writes for W4A16): every
 * config group's weights 4-bit ints, per group of a multiple of 32 or per channel, the same
 * in every group, and no activation quantization. */
static mmrt_status check_ct(const json_t *qc, const char *path, struct mmrt_packed_format *out,
                            struct mmrt_error *err)
{
    out->kind = MMRT_PACKED_CT;
    mmrt_status st =
        qc_expect(qc, path, "quantization_config", "format", "pack-quantized", 0, err);
    const json_t *groups = json_object_get(qc, "config_groups");
    if (st == MMRT_OK && (!json_is_object(groups) || json_object_size(groups) == 0))
        st = mmrt_error_set(err, MMRT_ERR_UNSUPPORTED, "%s: quantization_config.config_groups "
                            "is missing or empty", path);
    const char *name;
    const json_t *g;
    bool first = true;
    json_object_foreach((json_t *)groups, name, g) {
        if (st != MMRT_OK)
            break;
        char key[160];
        const json_t *wts = json_object_get(g, "weights");
        const json_t *act = json_object_get(g, "input_activations");
        if (act && !json_is_null(act)) {
            st = mmrt_error_set(err, MMRT_ERR_UNSUPPORTED, "%s: quantization_config."
                                "config_groups.%.60s.input_activations: activations quantized "
                                "too are not one mmrt runs (weights only, W4A16)", path, name);
            break;
        }
        if (!json_is_object(wts)) {
            st = mmrt_error_set(err, MMRT_ERR_UNSUPPORTED, "%s: quantization_config."
                                "config_groups.%.60s.weights is missing", path, name);
            break;
        }
        snprintf(key, sizeof key, "quantization_config.config_groups.%.60s.weights", name);
        st = qc_expect(wts, path, key, "num_bits", NULL, 4, err);
        if (st == MMRT_OK)
            st = qc_expect(wts, path, key, "type", "int", 0, err);
        const json_t *strat = json_object_get(wts, "strategy");
        const bool channel = json_is_string(strat) && !strcmp(json_string_value(strat), "channel");
        if (st == MMRT_OK && !channel)
            st = qc_expect(wts, path, key, "strategy", "group", 0, err);
        int64_t gs = 0;
        if (st == MMRT_OK && !channel)
            st = qc_group(wts, path, key, false, &gs, err);
        const bool sym = json_is_true(json_object_get(wts, "symmetric"));
        if (st == MMRT_OK && !first && (gs != out->group || sym != out->symmetric))
            st = mmrt_error_set(err, MMRT_ERR_UNSUPPORTED, "%s: quantization_config."
                                "config_groups.%.60s quantizes its weights otherwise than the "
                                "first group: mmrt reads one scheme per checkpoint", path, name);
        if (st != MMRT_OK)
            break;
        out->group = gs;
        out->symmetric = sym;
        first = false;
    }
    return st;
}

/* config.json's quantization_config: absent (float weights, maybe quantized at load), mmrt's
 * own layout (docs/QUANTIZATION.md "Checkpoint layout": quant_method "mmrt", weights one of
 * the [model] weights formats), or AWQ or GPTQ as published (*packed set). Any other method
 * or width is refused by key and value before anything is loaded (declared in model.h). */
mmrt_status mmrt_quantization_config_check(const json_t *root, const char *path,
                                           struct mmrt_packed_format *packed,
                                           struct mmrt_error *err)
{
    *packed = (struct mmrt_packed_format){ .kind = MMRT_PACKED_NONE };
    const json_t *qc = json_object_get(root, "quantization_config");
    if (!qc || json_is_null(qc))
        return MMRT_OK;
    if (!json_is_object(qc))
        return mmrt_error_set(err, MMRT_ERR_FORMAT, "%s: quantization_config is %s, not an "
                              "object", path, mmrt_json_type_name(qc));
    const json_t *m = json_object_get(qc, "quant_method");
    if (json_is_string(m) && strcasecmp(json_string_value(m), "awq") == 0)
        return check_awq(qc, path, packed, err);
    if (json_is_string(m) && strcasecmp(json_string_value(m), "gptq") == 0)
        return check_gptq(qc, path, packed, err);
    if (json_is_string(m) && strcmp(json_string_value(m), "compressed-tensors") == 0)
        return check_ct(qc, path, packed, err);
    if (!json_is_string(m) || strcmp(json_string_value(m), "mmrt") != 0)
        return mmrt_error_set(err, MMRT_ERR_UNSUPPORTED,
                              "%s: quantization_config.quant_method %s%s%s is not supported "
                              "(mmrt loads \"awq\", \"gptq\", \"compressed-tensors\" and its own "
                              "layout, \"mmrt\", written by mmrt-quantize; docs/QUANTIZATION.md)",
                              path,
                              json_is_string(m) ? "\"" : "",
                              json_is_string(m) ? json_string_value(m)
                                                : m ? "(not a string)" : "(missing)",
                              json_is_string(m) ? "\"" : "");
    const json_t *f = json_object_get(qc, "weights");
    const char *name = json_string_value(f);
    bool known = false;
    for (int i = MMRT_WEIGHTS_INT8; name && i <= MMRT_WEIGHTS_INT4_G32; i++)
        known |= strcmp(name, mmrt_weight_format_name((enum mmrt_weight_format)i)) == 0;
    if (!known)
        return mmrt_error_set(err, MMRT_ERR_UNSUPPORTED,
                              "%s: quantization_config.weights %s%s%s is not one mmrt runs "
                              "(int8, int4, int4-g64, int4-g32)", path, name ? "\"" : "",
                              name ? name : f ? "(not a string)" : "(missing)",
                              name ? "\"" : "");
    return MMRT_OK;
}

/* Where each piece of the configuration came from, for FILE:LINE messages. */
struct config_lines {
    const char *file;              /* NULL for a config struct */
    const struct mmrt_conf *conf;  /* NULL for a config struct */
};

static mmrt_status at(const struct config_lines *src, int line, struct mmrt_error *err,
                      mmrt_status st, const char *what)
{
    if (src->file)
        return mmrt_error_set(err, st, "%s:%d: %s", src->file, line, what);
    return mmrt_error_set(err, st, "config: %s", what);
}

const char *mmrt_version(void)
{
    return MMRT_VERSION;
}

const char *mmrt_status_string(mmrt_status status)
{
    return mmrt_status_message(status);
}

static void copy_error(char *buf, size_t size, const struct mmrt_error *err)
{
    if (buf && size)
        snprintf(buf, size, "%s", err->msg);
}

static void stop_worker(struct mmrt_runtime *rt);

void mmrt_destroy(struct mmrt_runtime *rt)
{
    if (!rt)
        return;
    stop_worker(rt);
    mmrt_vision_cache_destroy(rt->vcache);
    mmrt_engine_destroy(rt->engine);
    mmrt_schema_cache_destroy(rt->schemas);
    if (rt->model)
        rt->model_type->destroy(rt->model);
    for (int i = rt->n_devices - 1; i >= 0; i--)
        mmrt_dev_close(rt->devices[i]);
    free(rt->run_image);
    free(rt->run_prompt);
    free(rt->run_schema);
    free(rt->model_path);
    free(rt->source);
    if (rt->locks_ready) {
        pthread_cond_destroy(&rt->done);
        pthread_cond_destroy(&rt->work);
        pthread_mutex_destroy(&rt->jobs_lock);
        pthread_mutex_destroy(&rt->drive);
        pthread_mutex_destroy(&rt->stats_lock);
        pthread_mutex_destroy(&rt->vision_lock);
    }
    free(rt);
}

const char *mmrt_last_error(const struct mmrt_runtime *rt)
{
    return rt ? rt->last.msg : "";
}

/* Checks the plugin-specific keys of device i against the plugin's declared list. */
static mmrt_status check_options(const struct config_lines *src, int dev_i,
                                 const struct mmrt_device_config *dc,
                                 const struct mmrt_loaded_plugin *plugin,
                                 struct mmrt_error *err)
{
    for (int k = 0; k < dc->n_options; k++) {
        const char *key = dc->options[k].key;
        int known = 0;
        for (const char *const *p = plugin->api.option_keys; p && *p && !known; p++)
            known = strcmp(*p, key) == 0;
        if (known)
            continue;
        char what[512], keys[256] = "";
        size_t used = 0;
        for (const char *const *p = plugin->api.option_keys; p && *p; p++) {
            int w = snprintf(keys + used, sizeof keys - used, "%s%s", used ? ", " : "", *p);
            if (w > 0 && used + (size_t)w < sizeof keys)
                used += (size_t)w;
        }
        snprintf(what, sizeof what,
                 "[device.%s]: unknown key '%s' (plugin %s knows: plugin, index, pool_mb, "
                 "level1%s%s)",
                 dc->name, key, plugin->api.name, used ? ", " : "", keys);
        int line = src->conf ? src->conf->devices[dev_i].options[k].line : 0;
        return at(src, line, err, MMRT_ERR_CONFIG, what);
    }
    return MMRT_OK;
}

/* The front every request's vision stage goes through, and the vision-feature cache behind
 * it unless the configuration turns it off (vision_cache.h). */
static mmrt_status vision_cache_setup(struct mmrt_runtime *rt, const struct mmrt_config *cfg,
                                      const struct mmrt_device_config *vision,
                                      struct mmrt_error *err)
{
    struct mmrt_image_limits lim;
    mmrt_image_limits_default(&lim);
    rt->vfront = (struct mmrt_vision_front){
        .type = rt->model_type, .model = rt->model, .max_image_tokens = cfg->max_image_tokens,
        .oversize_images = cfg->oversize_images,
        .max_positions = rt->lang.decoder ? rt->lang.decoder->max_positions : 0,
        .max_image_bytes = lim.max_input_bytes,
    };
    if (cfg->vision_cache_entries < 0)
        return MMRT_OK;
    const struct mmrt_vision_settings s = {
        .model_dir = rt->model_path, .model_type = rt->model_type->model_type,
        .max_image_tokens = cfg->max_image_tokens, .oversize_images = (int)cfg->oversize_images,
        .exif_orientation = (int)cfg->exif_orientation,
        .plugin = rt->vision->api->name, .plugin_version = rt->vision->api->version,
        .device_index = rt->vision->index, .options = vision->options,
        .n_options = vision->n_options,
    };
    mmrt_status st = mmrt_vision_settings_digest(&s, rt->vfront.settings, err);
    if (st != MMRT_OK)
        return st;
    const uint64_t entries = cfg->vision_cache_entries ? (uint64_t)cfg->vision_cache_entries
                                                       : MMRT_VISION_CACHE_DEFAULT_ENTRIES;
    const uint64_t mb = cfg->vision_cache_mb ? (uint64_t)cfg->vision_cache_mb
                                             : MMRT_VISION_CACHE_DEFAULT_MB;
    st = mmrt_vision_cache_create(entries, mb << 20, &rt->vcache, err);
    rt->vfront.cache = rt->vcache;
    return st;
}

/* hooks (may be NULL): the loader's callbacks for the model (on_quantized, format_of), for
 * tools that build on the runtime (mmrt-quantize); the rest of it is ignored. */
static mmrt_status create(const struct mmrt_config *cfg, const struct config_lines *src,
                          const struct mmrt_model_options *hooks, struct mmrt_runtime **out,
                          struct mmrt_error *err)
{
    mmrt_status st = MMRT_OK;
    json_t *root = NULL; /* config.json, from the model's type to its load */
    char what[MMRT_ERROR_MAX + 128];
    if (cfg->n_devices < 1 || cfg->n_devices > MAX_DEVICES || !cfg->devices) {
        snprintf(what, sizeof what, "between 1 and %d devices are needed, got %d", MAX_DEVICES,
                 cfg->n_devices);
        return at(src, 0, err, MMRT_ERR_CONFIG, what);
    }
    if (cfg->max_image_tokens < 0) {
        snprintf(what, sizeof what, "[model] max_image_tokens %lld must be at least 0 "
                 "(0 = no limit beyond the model's context)", (long long)cfg->max_image_tokens);
        return at(src, src->conf ? src->conf->max_image_tokens_line : 0, err, MMRT_ERR_CONFIG,
                  what);
    }
    if (cfg->oversize_images != MMRT_OVERSIZE_REFUSE &&
        cfg->oversize_images != MMRT_OVERSIZE_DOWNSCALE) {
        snprintf(what, sizeof what, "[model] oversize_images %d is neither "
                 "MMRT_OVERSIZE_REFUSE nor MMRT_OVERSIZE_DOWNSCALE", (int)cfg->oversize_images);
        return at(src, src->conf ? src->conf->oversize_images_line : 0, err, MMRT_ERR_CONFIG,
                  what);
    }
    if (cfg->max_kv_tokens < 0) {
        snprintf(what, sizeof what, "[model] max_kv_tokens %lld must be at least 0 (0 = the "
                 "default)", (long long)cfg->max_kv_tokens);
        return at(src, src->conf ? src->conf->max_kv_tokens_line : 0, err, MMRT_ERR_CONFIG,
                  what);
    }
    if (cfg->kv_page_tokens < 0 || cfg->kv_page_tokens > MMRT_CONF_MAX_KV_PAGE_TOKENS ||
        (cfg->kv_page_tokens & (cfg->kv_page_tokens - 1)) != 0) {
        snprintf(what, sizeof what, "[model] kv_page_tokens %lld must be a power of two from 1 "
                 "to %d (0 = 16)", (long long)cfg->kv_page_tokens, MMRT_CONF_MAX_KV_PAGE_TOKENS);
        return at(src, src->conf ? src->conf->kv_page_tokens_line : 0, err, MMRT_ERR_CONFIG,
                  what);
    }
    if (cfg->kv_dtype != MMRT_KV_F32 && cfg->kv_dtype != MMRT_KV_F16 &&
        cfg->kv_dtype != MMRT_KV_FP8 && cfg->kv_dtype != MMRT_KV_INT8) {
        snprintf(what, sizeof what, "[model] kv_dtype %d is none of MMRT_KV_F32, MMRT_KV_F16, "
                 "MMRT_KV_FP8, MMRT_KV_INT8", (int)cfg->kv_dtype);
        return at(src, src->conf ? src->conf->kv_dtype_line : 0, err, MMRT_ERR_CONFIG, what);
    }
    if (cfg->weights < MMRT_WEIGHTS_CHECKPOINT || cfg->weights > MMRT_WEIGHTS_INT4_G32) {
        snprintf(what, sizeof what, "[model] weights %d is not an enum mmrt_weight_format",
                 (int)cfg->weights);
        return at(src, src->conf ? src->conf->weights_line : 0, err, MMRT_ERR_CONFIG, what);
    }
    if (cfg->exif_orientation != MMRT_EXIF_IGNORE && cfg->exif_orientation != MMRT_EXIF_APPLY) {
        snprintf(what, sizeof what, "[model] exif_orientation %d is neither MMRT_EXIF_IGNORE "
                 "nor MMRT_EXIF_APPLY", (int)cfg->exif_orientation);
        return at(src, src->conf ? src->conf->exif_orientation_line : 0, err, MMRT_ERR_CONFIG,
                  what);
    }
    if (cfg->chat_template < MMRT_CHAT_TEMPLATE_AUTO ||
        cfg->chat_template > MMRT_CHAT_TEMPLATE_LLAMA3) {
        snprintf(what, sizeof what, "[model] chat_template %d is not an enum "
                 "mmrt_chat_template", (int)cfg->chat_template);
        return at(src, src->conf ? src->conf->chat_template_line : 0, err, MMRT_ERR_CONFIG,
                  what);
    }
    if (!(cfg->image_kv_keep >= 0 && cfg->image_kv_keep <= 1)) {
        snprintf(what, sizeof what, "[model] image_kv_keep %g must be in (0, 1] (1 = off; 0 = "
                 "the default, off)", cfg->image_kv_keep);
        return at(src, src->conf ? src->conf->image_kv_keep_line : 0, err, MMRT_ERR_CONFIG,
                  what);
    }
    if (cfg->image_kv_policy < MMRT_IMAGE_KV_DEFAULT ||
        cfg->image_kv_policy > MMRT_IMAGE_KV_POOL2X2) {
        snprintf(what, sizeof what, "[model] image_kv_policy %d is not an enum "
                 "mmrt_image_kv_policy", (int)cfg->image_kv_policy);
        return at(src, src->conf ? src->conf->image_kv_policy_line : 0, err, MMRT_ERR_CONFIG,
                  what);
    }
    const struct mmrt_conf_scheduler *cs = src->conf ? &src->conf->scheduler : NULL;
    if (cfg->max_batch < 0 || cfg->max_batch > MMRT_SMALL_M) {
        snprintf(what, sizeof what, "[scheduler] max_batch %d must be 1 … %d (0 = %d)",
                 cfg->max_batch, MMRT_SMALL_M, MMRT_ENGINE_DEFAULT_BATCH);
        return at(src, cs ? cs->max_batch_line : 0, err, MMRT_ERR_CONFIG, what);
    }
    if (cfg->prefill_chunk < 0 || cfg->prefill_chunk > MMRT_CONF_MAX_PREFILL_CHUNK) {
        snprintf(what, sizeof what, "[scheduler] prefill_chunk %lld must be 1 … %d (0 = %d)",
                 (long long)cfg->prefill_chunk, MMRT_CONF_MAX_PREFILL_CHUNK,
                 MMRT_ENGINE_DEFAULT_CHUNK);
        return at(src, cs ? cs->prefill_chunk_line : 0, err, MMRT_ERR_CONFIG, what);
    }
    if (cfg->step_tokens < 0 || cfg->step_tokens > MMRT_CONF_MAX_STEP_TOKENS) {
        snprintf(what, sizeof what, "[scheduler] step_tokens %lld must be 1 … %d (0 = the "
                 "default)", (long long)cfg->step_tokens, MMRT_CONF_MAX_STEP_TOKENS);
        return at(src, cs ? cs->step_tokens_line : 0, err, MMRT_ERR_CONFIG, what);
    }
    if (cfg->vision_batch < 0 || cfg->vision_batch > MMRT_CONF_MAX_VISION_BATCH) {
        snprintf(what, sizeof what, "[scheduler] vision_batch %d must be 1 … %d (0 = %d)",
                 cfg->vision_batch, MMRT_CONF_MAX_VISION_BATCH, MMRT_DEFAULT_VISION_BATCH);
        return at(src, cs ? cs->vision_batch_line : 0, err, MMRT_ERR_CONFIG, what);
    }
    if (cfg->draft_tokens < 0 || cfg->draft_tokens > MMRT_CONF_MAX_DRAFT_TOKENS) {
        snprintf(what, sizeof what, "[scheduler] draft_tokens %d must be 0 … %d (0 = off)",
                 cfg->draft_tokens, MMRT_CONF_MAX_DRAFT_TOKENS);
        return at(src, cs ? cs->draft_tokens_line : 0, err, MMRT_ERR_CONFIG, what);
    }
    if (cfg->draft_rows != 0 && (cfg->draft_rows < 2 || cfg->draft_rows > MMRT_SMALL_M)) {
        snprintf(what, sizeof what, "[scheduler] draft_rows %d must be 2 … %d (0 = the "
                 "tokens drafted a step + 1)", cfg->draft_rows, MMRT_SMALL_M);
        return at(src, cs ? cs->draft_rows_line : 0, err, MMRT_ERR_CONFIG, what);
    }
    const struct mmrt_conf_cache *cc = src->conf ? &src->conf->cache : NULL;
    if (cfg->vision_cache_entries > MMRT_CONF_MAX_VISION_ENTRIES) {
        snprintf(what, sizeof what, "[cache] vision_entries %lld must be at most %d (0 = %d, "
                 "negative = off)", (long long)cfg->vision_cache_entries,
                 MMRT_CONF_MAX_VISION_ENTRIES, MMRT_VISION_CACHE_DEFAULT_ENTRIES);
        return at(src, cc ? cc->vision_entries_line : 0, err, MMRT_ERR_CONFIG, what);
    }
    if (cfg->vision_cache_mb < 0 || cfg->vision_cache_mb > MMRT_CONF_MAX_VISION_MB) {
        snprintf(what, sizeof what, "[cache] vision_mb %lld must be 1 … %d MiB (0 = %d)",
                 (long long)cfg->vision_cache_mb, MMRT_CONF_MAX_VISION_MB,
                 MMRT_VISION_CACHE_DEFAULT_MB);
        return at(src, cc ? cc->vision_mb_line : 0, err, MMRT_ERR_CONFIG, what);
    }
    struct mmrt_runtime *rt = calloc(1, sizeof *rt);
    if (!rt)
        return mmrt_error_set(err, MMRT_ERR_NO_MEMORY, "runtime: out of memory");
    pthread_mutex_init(&rt->drive, NULL);
    pthread_mutex_init(&rt->vision_lock, NULL);
    pthread_mutex_init(&rt->jobs_lock, NULL);
    pthread_cond_init(&rt->work, NULL);
    pthread_cond_init(&rt->done, NULL);
    pthread_mutex_init(&rt->stats_lock, NULL);
    rt->locks_ready = true;
    rt->vision_batch = cfg->vision_batch ? cfg->vision_batch : MMRT_DEFAULT_VISION_BATCH;
    rt->engine_opts = (struct mmrt_engine_options){ .max_batch = cfg->max_batch,
                                                    .prefill_chunk = cfg->prefill_chunk,
                                                    .step_tokens = cfg->step_tokens,
                                                    .draft_tokens = cfg->draft_tokens,
                                                    .draft_rows = cfg->draft_rows,
                                                    .use_graph = true,
                                                    .prefix_entries =
                                                        cfg->prefix_cache < 0 ? -1 : 0,
                                                    .image_kv = {
                                                        .keep = cfg->image_kv_keep,
                                                        .policy = cfg->image_kv_policy } };
    rt->model_opts = (struct mmrt_model_options){ .max_image_tokens = cfg->max_image_tokens,
                                                  .oversize_images = cfg->oversize_images,
                                                  .max_kv_tokens = cfg->max_kv_tokens,
                                                  .kv_page_tokens = cfg->kv_page_tokens,
                                                  .kv_dtype = cfg->kv_dtype,
                                                  .weights = cfg->weights,
                                                  .exif_orientation = cfg->exif_orientation,
                                                  .chat_template = cfg->chat_template,
                                                  .vision_batch = rt->vision_batch };
    if (hooks) {
        rt->model_opts.on_quantized = hooks->on_quantized;
        rt->model_opts.on_quantized_user = hooks->on_quantized_user;
        rt->model_opts.format_of = hooks->format_of;
        rt->model_opts.format_of_user = hooks->format_of_user;
    }
    {
        /* The engine's defaults, resolved here so pool_mb = auto sizes for what it runs. */
        const int64_t batch = cfg->max_batch ? cfg->max_batch : MMRT_ENGINE_DEFAULT_BATCH;
        const int64_t chunk = cfg->prefill_chunk ? cfg->prefill_chunk : MMRT_ENGINE_DEFAULT_CHUNK;
        const int64_t step = cfg->step_tokens ? cfg->step_tokens : chunk + batch;
        rt->model_opts.max_prefill_rows = step > chunk ? step : chunk;
        /* Drafts, and a request's prediction, add rows to a decode step (engine.h
         * draft_rows). */
        const int64_t drafts = mmrt_engine_draft_rows(cfg->draft_tokens, cfg->draft_rows);
        rt->model_opts.max_decode_rows = drafts > batch ? drafts : batch;
    }
    rt->run = (struct mmrt_request){ .struct_size = sizeof rt->run, .max_tokens = 64,
                                     .top_p = 1.0f };
    rt->source = strdup(src->file ? src->file : "config");
    if (!rt->source || (cfg->model_path && !(rt->model_path = strdup(cfg->model_path)))) {
        st = mmrt_error_set(err, MMRT_ERR_NO_MEMORY, "runtime: out of memory");
        goto fail;
    }
    if ((st = mmrt_schema_cache_create(0, 0, &rt->schemas, err)) != MMRT_OK)
        goto fail;

    for (int i = 0; i < cfg->n_devices; i++) {
        const struct mmrt_device_config *dc = &cfg->devices[i];
        int line = src->conf ? src->conf->devices[i].line : 0;
        if (!dc->name || !dc->name[0] || strlen(dc->name) >= sizeof rt->devices[0]->name ||
            !dc->plugin) {
            snprintf(what, sizeof what, "device %d: name and plugin are required", i);
            st = at(src, line, err, MMRT_ERR_CONFIG, what);
            goto fail;
        }
        for (int j = 0; j < i; j++) {
            if (strcmp(cfg->devices[j].name, dc->name) == 0) {
                snprintf(what, sizeof what, "device '%s' is defined twice", dc->name);
                st = at(src, line, err, MMRT_ERR_CONFIG, what);
                goto fail;
            }
        }
        if (dc->pool_mb > (UINT64_MAX >> 20)) {
            snprintf(what, sizeof what, "[device.%s]: pool_mb %llu is too large", dc->name,
                     (unsigned long long)dc->pool_mb);
            st = at(src, line, err, MMRT_ERR_CONFIG, what);
            goto fail;
        }
        if (dc->level1 != MMRT_LEVEL1_DEFAULT && dc->level1 != MMRT_LEVEL1_ON &&
            dc->level1 != MMRT_LEVEL1_OFF) {
            snprintf(what, sizeof what, "[device.%s]: level1 %d is not an enum mmrt_level1 "
                     "value", dc->name, (int)dc->level1);
            st = at(src, src->conf && src->conf->devices[i].level1_line
                             ? src->conf->devices[i].level1_line : line,
                    err, MMRT_ERR_CONFIG, what);
            goto fail;
        }
    }

    /* Where the stages go, by device index, before anything is opened: pool_mb = auto
     * sizes each pool for the stages placed on its device. */
    const char *stage_dev[2] = { cfg->vision_device, cfg->language_device };
    const char *stage_name[2] = { "vision", "language" };
    int stage_ix[2] = { 0, 0 };
    for (int s = 0; s < 2; s++) {
        if (!stage_dev[s])
            continue;
        stage_ix[s] = -1;
        for (int i = 0; i < cfg->n_devices; i++)
            if (strcmp(cfg->devices[i].name, stage_dev[s]) == 0)
                stage_ix[s] = i;
        if (stage_ix[s] < 0) {
            const struct mmrt_conf_stage *cs =
                src->conf ? (s == 0 ? &src->conf->vision : &src->conf->language) : NULL;
            snprintf(what, sizeof what, "[stage.%s]: device '%s' is not defined", stage_name[s],
                     stage_dev[s]);
            st = at(src, cs ? cs->line : 0, err, MMRT_ERR_CONFIG, what);
            goto fail;
        }
    }

    /* The model's type and, for pool_mb = auto, what its largest request needs. */
    char cfg_path[4096];
    struct mmrt_pool_budget budget = { 0 };
    bool have_budget = false;
    if (rt->model_path) {
        snprintf(cfg_path, sizeof cfg_path, "%s/config.json", rt->model_path);
        /* Where [model] path leads nowhere useful, that is the configuration's line (exit 2),
         * not a failed load. What is wrong inside the checkpoint is the checkpoint's. */
        const int path_line = src->conf ? src->conf->model_path_line : 0;
        struct stat sb;
        if (stat(rt->model_path, &sb) != 0) {
            snprintf(what, sizeof what, "[model] path '%s': %s", rt->model_path,
                     strerror(errno));
            st = at(src, path_line, err, MMRT_ERR_CONFIG, what);
            goto fail;
        }
        if (!S_ISDIR(sb.st_mode)) {
            snprintf(what, sizeof what, "[model] path '%s' is %s, not a checkpoint directory",
                     rt->model_path, mmrt_file_kind(sb.st_mode));
            st = at(src, path_line, err, MMRT_ERR_CONFIG, what);
            goto fail;
        }
        if (!mmrt_file_exists(cfg_path)) {
            snprintf(what, sizeof what, "[model] path '%s' is not a checkpoint directory: it "
                     "has no config.json", rt->model_path);
            st = at(src, path_line, err, MMRT_ERR_CONFIG, what);
            goto fail;
        }
        st = mmrt_json_load_object(cfg_path, 16u << 20, 0, &root, err);
        if (st != MMRT_OK)
            goto fail;
        const char *type = NULL;
        st = mmrt_json_opt_string(root, "model_type", cfg_path, NULL, &type, err);
        if (st == MMRT_OK && !(rt->model_type = type ? mmrt_model_type_find(type) : NULL))
            st = mmrt_error_set(err, MMRT_ERR_UNSUPPORTED,
                                "%s: model_type '%s' is not supported by this build (%s)",
                                cfg_path, type ? type : "(missing)", mmrt_model_types_supported());
        if (st == MMRT_OK && cfg->image_kv_keep > 0 && cfg->image_kv_keep < 1 &&
            !rt->model_type->image_grids) {
            snprintf(what, sizeof what, "[model] image_kv_keep %g: model_type '%s' does not say "
                     "which prompt rows are image tokens, so they cannot be compressed",
                     cfg->image_kv_keep, type);
            st = at(src, src->conf ? src->conf->image_kv_keep_line : 0, err, MMRT_ERR_CONFIG,
                    what);
        }
        if (st == MMRT_OK && cfg->chat_template != MMRT_CHAT_TEMPLATE_AUTO &&
            !rt->model_type->chat_templates) {
            snprintf(what, sizeof what, "[model] chat_template: model_type '%s' renders its "
                     "prompts one way only (models.md §7.5), so only 'auto' applies", type);
            st = at(src, src->conf ? src->conf->chat_template_line : 0, err, MMRT_ERR_CONFIG,
                    what);
        }
        if (st == MMRT_OK)
            st = mmrt_quantization_config_check(root, cfg_path, &rt->model_opts.packed, err);
        if (st == MMRT_OK)
            st = mmrt_generation_config_read(rt->model_path, &rt->gen, err);
        bool any_auto = false;
        for (int i = 0; i < cfg->n_devices; i++)
            any_auto |= cfg->devices[i].pool_mb == 0;
        if (st == MMRT_OK && any_auto) {
            st = mmrt_pool_budget_estimate(type, rt->model_path, root, &rt->model_opts, &budget,
                                           err);
            have_budget = st == MMRT_OK;
        }
        if (st != MMRT_OK)
            goto fail;
    }

    for (int i = 0; i < cfg->n_devices; i++) {
        const struct mmrt_device_config *dc = &cfg->devices[i];
        int line = src->conf ? src->conf->devices[i].line : 0;
        const bool is_vision = i == stage_ix[0], is_language = i == stage_ix[1];
        const bool automatic = dc->pool_mb == 0;
        uint64_t pool_mb = dc->pool_mb;
        if (automatic)
            pool_mb = have_budget ? mmrt_pool_budget_mb(&budget, is_vision, is_language)
                                  : MMRT_POOL_BUDGET_IDLE_MB;
        struct mmrt_loaded_plugin *plugin = NULL;
        struct mmrt_error perr = { 0 };
        st = mmrt_plugin_load(dc->plugin, &plugin, &perr);
        if (st != MMRT_OK) {
            snprintf(what, sizeof what, "[device.%s]: %s", dc->name, perr.msg);
            st = at(src, src->conf ? src->conf->devices[i].plugin_line : 0, err, st, what);
            goto fail;
        }
        st = check_options(src, i, dc, plugin, err);
        if (st == MMRT_OK)
            st = mmrt_dev_open_plugin(dc->name, plugin, dc->index, pool_mb << 20,
                                      (enum mmrt_pool_level1)dc->level1, dc->options,
                                      dc->n_options, &rt->devices[i], &perr);
        mmrt_plugin_release(plugin);
        /* A pool that cannot be had at start is the configuration's pool_mb, not a failed
         * request: exit 2 with the line. */
        if (st == MMRT_ERR_OUT_OF_POOL)
            st = MMRT_ERR_CONFIG;
        if (st != MMRT_OK && perr.msg[0] && automatic && have_budget &&
            (is_vision || is_language))
            mmrt_error_prefix(&perr, st, "pool_mb = auto is %llu MiB for the largest request "
                              "(KV %.0f MiB for %lld tokens, language %.0f MiB for %lld rows, "
                              "vision %.0f MiB for %lld rows; lower [model] max_kv_tokens or "
                              "max_image_tokens, or set pool_mb)",
                              (unsigned long long)pool_mb,
                              is_language ? (double)budget.kv_bytes / 1048576.0 : 0.0,
                              is_language ? (long long)budget.kv_tokens : 0LL,
                              is_language ? (double)budget.language_bytes / 1048576.0 : 0.0,
                              is_language ? (long long)budget.language_rows : 0LL,
                              is_vision ? (double)budget.vision_bytes / 1048576.0 : 0.0,
                              is_vision ? (long long)budget.vision_rows : 0LL);
        if (st != MMRT_OK) {
            if (perr.msg[0])
                at(src, src->conf && src->conf->devices[i].pool_mb_line
                            ? src->conf->devices[i].pool_mb_line
                            : line,
                   err, st, perr.msg);
            goto fail;
        }
        rt->n_devices++;
        if (automatic && have_budget) {
            struct mmrt_dev *dev = rt->devices[i];
            /* The KV store's default is what this pool was sized for, not half of it. */
            if (is_language)
                dev->auto_kv_tokens = budget.kv_tokens;
            mmrt_log(MMRT_LOG_INFO, "core", "device %s: pool_mb = auto: %llu MiB (KV %.1f MiB "
                     "for %lld tokens, language %.1f MiB for %lld rows, vision %.1f MiB for %lld "
                     "rows, + 1/8 + %d MiB)", dev->name, (unsigned long long)pool_mb,
                     is_language ? (double)budget.kv_bytes / 1048576.0 : 0.0,
                     is_language ? (long long)budget.kv_tokens : 0LL,
                     is_language ? (double)budget.language_bytes / 1048576.0 : 0.0,
                     is_language ? (long long)budget.language_rows : 0LL,
                     is_vision ? (double)budget.vision_bytes / 1048576.0 : 0.0,
                     is_vision ? (long long)budget.vision_rows : 0LL, MMRT_POOL_BUDGET_SMALL_MB);
        }
    }
    rt->vision = rt->devices[stage_ix[0]];
    rt->language = rt->devices[stage_ix[1]];

    if (rt->model_path) {
        st = rt->model_type->load(rt->model_path, root, &rt->model_opts, rt->vision,
                                  rt->language, &rt->model, err);
        json_decref(root);
        root = NULL;
        /* Compression runs its own operators on the language device (a plugin older than
         * ABI 1.4 has none): refused here, not in the middle of a request. */
        static const enum mmrt_op compress_ops[] = { MMRT_OP_GATHER_HEADS, MMRT_OP_L2_NORM,
                                                     MMRT_OP_SET_ROWS };
        if (st == MMRT_OK && mmrt_kv_compress_on(&rt->engine_opts.image_kv))
            st = mmrt_dev_require_ops(rt->language, "image-token KV compression ([model] "
                                      "image_kv_keep)", compress_ops, 3, err);
        if (st == MMRT_OK)
            rt->model_type->language(rt->model, &rt->lang);
        /* A sliding window counts positions, and compression moves the kept rows of a
         * sequence down over the dropped ones, so cache row and position part: the window
         * would then cover other tokens than transformers' does. Known only once config.json
         * was read, so refused here, with the setting's line. */
        if (st == MMRT_OK && mmrt_kv_compress_on(&rt->engine_opts.image_kv) &&
            rt->lang.decoder->window > 0) {
            snprintf(what, sizeof what, "[model] image_kv_keep %g: the language model attends "
                     "through a sliding window of %d positions (config.json sliding_window), "
                     "which image-token KV compression would shift onto other tokens; set "
                     "image_kv_keep = 1 (off) for this model", rt->engine_opts.image_kv.keep,
                     (int)rt->lang.decoder->window);
            st = at(src, src->conf ? src->conf->image_kv_keep_line : 0, err, MMRT_ERR_CONFIG,
                    what);
        }
        if (st == MMRT_OK)
            st = mmrt_engine_create(&rt->lang, &rt->engine_opts, &rt->engine, err);
        if (st == MMRT_OK)
            st = vision_cache_setup(rt, cfg, &cfg->devices[stage_ix[0]], err);
        if (st != MMRT_OK)
            goto fail;
    }

    *out = rt;
    return MMRT_OK;

fail:
    json_decref(root);
    mmrt_destroy(rt);
    return st;
}

static mmrt_status create_checked(const struct mmrt_config *config,
                                  const struct mmrt_model_options *hooks,
                                  struct mmrt_runtime **out, char *err, size_t err_size)
{
    struct mmrt_error e = { 0 };
    struct config_lines src = { 0 };
    if (!config || !out) {
        mmrt_error_set(&e, MMRT_ERR_INVALID_ARG, "mmrt_create: config and out are required");
        copy_error(err, err_size, &e);
        return MMRT_ERR_INVALID_ARG;
    }
    /* The caller's layout (mmrt.h): members it does not have read as 0. */
    const size_t v1 = offsetof(struct mmrt_config, kv_dtype) + sizeof(enum mmrt_kv_dtype);
    const size_t size = config->struct_size ? config->struct_size : v1;
    if (size < v1) {
        mmrt_error_set(&e, MMRT_ERR_INVALID_ARG, "mmrt_create: struct_size %u is smaller "
                       "than the first layout of struct mmrt_config (%zu)",
                       config->struct_size, v1);
        copy_error(err, err_size, &e);
        return MMRT_ERR_INVALID_ARG;
    }
    struct mmrt_config c = { 0 };
    memcpy(&c, config, size < sizeof c ? size : sizeof c);
    mmrt_status st = create(&c, &src, hooks, out, &e);
    if (st != MMRT_OK)
        copy_error(err, err_size, &e);
    return st;
}

mmrt_status mmrt_create(const struct mmrt_config *config, struct mmrt_runtime **out, char *err,
                        size_t err_size)
{
    return create_checked(config, NULL, out, err, err_size);
}

mmrt_status mmrt_create_hooked(const struct mmrt_config *config,
                               const struct mmrt_model_options *hooks,
                               struct mmrt_runtime **out, char *err, size_t err_size)
{
    return create_checked(config, hooks, out, err, err_size);
}

mmrt_status mmrt_conf_read_section(const char *ini_path, const char *section,
                                   mmrt_conf_key_fn fn, void *user, char *err, size_t err_size)
{
    struct mmrt_error e = { 0 };
    struct mmrt_conf *conf = NULL;
    if (!ini_path || !section || !fn) {
        mmrt_error_set(&e, MMRT_ERR_INVALID_ARG,
                       "mmrt_conf_read_section: path, section and fn are required");
        copy_error(err, err_size, &e);
        return MMRT_ERR_INVALID_ARG;
    }
    mmrt_status st = mmrt_conf_load(ini_path, &conf, &e);
    for (int i = 0; st == MMRT_OK && i < conf->n_app; i++) {
        const struct mmrt_conf_entry *c = &conf->app[i];
        if (strcmp(c->section, section) == 0 && !fn(user, c->key, c->value, c->line))
            st = MMRT_ERR_CONFIG; /* fn wrote its own message */
    }
    if (st != MMRT_OK && st != MMRT_ERR_CONFIG)
        copy_error(err, err_size, &e);
    else if (st == MMRT_ERR_CONFIG && e.msg[0])
        copy_error(err, err_size, &e);
    mmrt_conf_destroy(conf);
    return st;
}

#define MAX_RUN_SCHEMA_BYTES (1u << 20)

/* [run] json_schema: the schema file read, and checked now so that one mmrt cannot hold an
 * answer to is a configuration error at its line, not a failure of the first request (and
 * compiled into the cache, where the request finds it). */
static mmrt_status run_schema(struct mmrt_runtime *rt, const char *ini_path,
                              const struct mmrt_conf_run *r, struct mmrt_error *e)
{
    if (r->response_format_line)
        return mmrt_error_set(e, MMRT_ERR_CONFIG, "%s:%d: [run] json_schema beside "
                              "response_format (line %d): give one", ini_path,
                              r->json_schema_line, r->response_format_line);
    size_t len = 0;
    struct mmrt_json_schema *compiled = NULL;
    mmrt_status st = mmrt_file_read(r->json_schema, MAX_RUN_SCHEMA_BYTES, 0,
                                    " for a JSON schema", &rt->run_schema, &len, e);
    if (st == MMRT_OK)
        st = mmrt_schema_cache_get(rt->schemas, rt->run_schema, len, &compiled, e);
    mmrt_json_schema_free(compiled);
    if (st != MMRT_OK) {
        mmrt_error_prefix(e, st, "%s:%d: [run] json_schema %s", ini_path, r->json_schema_line,
                          r->json_schema);
        /* A file the configuration names that cannot be used is the configuration's error. */
        if (st != MMRT_ERR_NO_MEMORY)
            e->status = MMRT_ERR_CONFIG;
        return e->status;
    }
    rt->run.response_format = MMRT_RESPONSE_JSON_SCHEMA;
    rt->run.json_schema = rt->run_schema;
    return MMRT_OK;
}

mmrt_status mmrt_create_from_file(const char *ini_path, struct mmrt_runtime **out, char *err,
                                  size_t err_size)
{
    struct mmrt_error e = { 0 };
    struct mmrt_conf *conf = NULL;
    struct mmrt_device_config *devs = NULL;
    struct mmrt_option **opts = NULL;
    mmrt_status st = mmrt_conf_load(ini_path, &conf, &e);
    /* Whatever stops the INI file from being read or parsed (a line or a section count over
     * its limit, a directory or device named as the file) is a configuration error: the
     * caller's exit 2, with the FILE:LINE the message already carries where there is one. */
    if (st == MMRT_ERR_LIMIT || st == MMRT_ERR_IO || st == MMRT_ERR_FORMAT)
        st = MMRT_ERR_CONFIG;
    if (st != MMRT_OK)
        goto out;
    devs = calloc((size_t)conf->n_devices + 1, sizeof *devs);
    opts = calloc((size_t)conf->n_devices + 1, sizeof *opts);
    if (!devs || !opts) {
        st = mmrt_error_set(&e, MMRT_ERR_NO_MEMORY, "%s: out of memory", ini_path);
        goto out;
    }
    for (int i = 0; i < conf->n_devices; i++) {
        const struct mmrt_conf_device *cd = &conf->devices[i];
        opts[i] = calloc((size_t)cd->n_options + 1, sizeof *opts[i]);
        if (!opts[i]) {
            st = mmrt_error_set(&e, MMRT_ERR_NO_MEMORY, "%s: out of memory", ini_path);
            goto out;
        }
        for (int k = 0; k < cd->n_options; k++)
            opts[i][k] = (struct mmrt_option){ cd->options[k].key, cd->options[k].value };
        devs[i] = (struct mmrt_device_config){
            .name = cd->name, .plugin = cd->plugin, .index = cd->index,
            .pool_mb = cd->pool_mb, .options = opts[i], .n_options = cd->n_options,
            .level1 = cd->level1,
        };
    }
    struct mmrt_config cfg = {
        .model_path = conf->model_path,
        .devices = devs,
        .n_devices = conf->n_devices,
        .vision_device = conf->vision.present ? conf->vision.device : NULL,
        .language_device = conf->language.present ? conf->language.device : NULL,
        .max_image_tokens = conf->max_image_tokens,
        .oversize_images = conf->oversize_images,
        .max_kv_tokens = conf->max_kv_tokens,
        .kv_page_tokens = conf->kv_page_tokens,
        .kv_dtype = conf->kv_dtype,
        .max_batch = conf->scheduler.max_batch,
        .prefill_chunk = conf->scheduler.prefill_chunk,
        .step_tokens = conf->scheduler.step_tokens,
        .vision_cache_entries = conf->cache.vision_entries,
        .vision_cache_mb = conf->cache.vision_mb,
        .prefix_cache = conf->cache.prefix,
        .weights = conf->weights,
        .exif_orientation = conf->exif_orientation,
        .vision_batch = conf->scheduler.vision_batch,
        .draft_tokens = conf->scheduler.draft_tokens,
        .draft_rows = conf->scheduler.draft_rows,
        .image_kv_keep = conf->image_kv_keep,
        .image_kv_policy = conf->image_kv_policy,
        .chat_template = conf->chat_template,
    };
    struct config_lines src = { .file = ini_path, .conf = conf };
    st = create(&cfg, &src, NULL, out, &e);
    if (st == MMRT_OK) {
        struct mmrt_runtime *rt = *out;
        const struct mmrt_conf_run *r = &conf->run;
        if ((r->image && !(rt->run_image = strdup(r->image))) ||
            (r->prompt && !(rt->run_prompt = strdup(r->prompt)))) {
            mmrt_destroy(rt);
            *out = NULL;
            st = mmrt_error_set(&e, MMRT_ERR_NO_MEMORY, "%s: out of memory", ini_path);
            goto out;
        }
        if (rt->run_image) {
            rt->run_input = (struct mmrt_image_input){ .path = rt->run_image };
            rt->run.images = &rt->run_input;
            rt->run.n_images = 1;
        }
        rt->run.prompt = rt->run_prompt;
        rt->run.max_tokens = (int)r->max_tokens;
        rt->run.seed = r->seed;
        rt->run.temperature = (float)r->temperature;
        rt->run.top_k = (int)r->top_k;
        rt->run.top_p = (float)r->top_p;
        rt->run.repetition_penalty = (float)r->repetition_penalty;
        rt->run.presence_penalty = (float)r->presence_penalty;
        rt->run.frequency_penalty = (float)r->frequency_penalty;
        rt->run.response_format = r->response_format;
        if (r->json_schema) {
            st = run_schema(rt, ini_path, r, &e);
            if (st != MMRT_OK) {
                mmrt_destroy(rt);
                *out = NULL;
                goto out;
            }
        }
    }
out:
    if (st != MMRT_OK)
        copy_error(err, err_size, &e);
    for (int i = 0; conf && opts && i < conf->n_devices; i++)
        free(opts[i]);
    free(opts);
    free(devs);
    mmrt_conf_destroy(conf);
    return st;
}

int mmrt_device_count(const struct mmrt_runtime *rt)
{
    return rt ? rt->n_devices : 0;
}

static void describe(const struct mmrt_dev *dev, struct mmrt_device_desc *out)
{
    memset(out, 0, sizeof *out);
    snprintf(out->name, sizeof out->name, "%s", dev->name);
    snprintf(out->plugin, sizeof out->plugin, "%s", dev->api->name);
    out->index = dev->index;
    snprintf(out->device_name, sizeof out->device_name, "%s", dev->info.name);
    snprintf(out->kind, sizeof out->kind, "%s", dev->info.kind);
    out->total_bytes = dev->info.total_bytes;
    out->free_bytes = dev->info.free_bytes;
}

mmrt_status mmrt_device_describe(struct mmrt_runtime *rt, int i, struct mmrt_device_desc *out)
{
    if (!rt || !out || i < 0 || i >= rt->n_devices)
        return mmrt_error_set(rt ? &rt->last : NULL, MMRT_ERR_INVALID_ARG,
                              "device index %d out of range", i);
    describe(rt->devices[i], out);
    struct mmrt_pool_stats ps;
    mmrt_pool_stats(rt->devices[i]->pool, &ps);
    out->pool_bytes = ps.capacity_bytes;
    return MMRT_OK;
}

const char *mmrt_device_plugin_version(const struct mmrt_runtime *rt, int i)
{
    if (!rt || i < 0 || i >= rt->n_devices)
        return NULL;
    return rt->devices[i]->api->version;
}

mmrt_status mmrt_device_pool_stats(struct mmrt_runtime *rt, int i, struct mmrt_pool_report *out)
{
    if (!rt || !out || i < 0 || i >= rt->n_devices)
        return mmrt_error_set(rt ? &rt->last : NULL, MMRT_ERR_INVALID_ARG,
                              "device index %d out of range", i);
    struct mmrt_pool_stats ps;
    mmrt_pool_stats(rt->devices[i]->pool, &ps);
    memset(out, 0, sizeof *out);
    out->capacity_bytes = ps.capacity_bytes;
    out->bytes_in_use = ps.bytes_in_use;
    out->peak_bytes_in_use = ps.peak_bytes_in_use;
    out->total_free_bytes = ps.total_free_bytes;
    out->largest_free_block = ps.largest_free_block;
    out->fragmentation = ps.fragmentation;
    out->min_block_bytes = ps.min_block_bytes;
    out->n_orders = ps.n_orders < MMRT_POOL_REPORT_ORDERS ? ps.n_orders : MMRT_POOL_REPORT_ORDERS;
    for (uint32_t k = 0; k < out->n_orders; k++)
        out->free_blocks_per_order[k] = ps.free_blocks_per_order[k];
    return MMRT_OK;
}

static void memory_report(struct mmrt_runtime *rt, const struct mmrt_dev *dev,
                          struct mmrt_memory_report *out);

mmrt_status mmrt_device_memory(struct mmrt_runtime *rt, int i, struct mmrt_memory_report *out)
{
    if (!rt || !out || i < 0 || i >= rt->n_devices)
        return mmrt_error_set(rt ? &rt->last : NULL, MMRT_ERR_INVALID_ARG,
                              "device index %d out of range", i);
    if (out->struct_size < offsetof(struct mmrt_memory_report, weight_bytes))
        return mmrt_error_set(&rt->last, MMRT_ERR_INVALID_ARG,
                              "mmrt_memory_report.struct_size %u is too small (set it to "
                              "sizeof(struct mmrt_memory_report))", (unsigned)out->struct_size);
    struct mmrt_memory_report full;
    /* While the worker runs submitted jobs it may be changing the pools: then the figures it
     * published after its last step are read. Otherwise the caller is the one driving (an
     * mmrt_run callback, or nobody), and the live figures are read; the worker cannot start
     * meanwhile, since it raises worker_driving under stats_lock first. */
    pthread_mutex_lock(&rt->stats_lock);
    if (rt->worker_driving)
        full = rt->snap_mem[i];
    else
        memory_report(rt, rt->devices[i], &full);
    pthread_mutex_unlock(&rt->stats_lock);
    full.struct_size = out->struct_size;
    memcpy(out, &full, out->struct_size < sizeof full ? out->struct_size : sizeof full);
    return MMRT_OK;
}

/* Everything mmrt_device_memory reports of dev (the caller holds drive, or stats_lock). The
 * vision device's pool is also used by vision stages that run without drive (the worker's
 * vision thread, a batch's): it is read only when vision_lock is free, and otherwise the
 * figures of its last read stand in (a reader must not wait for a tower pass). */
static void memory_report(struct mmrt_runtime *rt, const struct mmrt_dev *dev,
                          struct mmrt_memory_report *out)
{
    struct mmrt_pool_stats ps;
    if (dev != rt->vision) {
        mmrt_pool_stats(dev->pool, &ps);
    } else if (pthread_mutex_trylock(&rt->vision_lock) == 0) {
        mmrt_pool_stats(dev->pool, &ps);
        pthread_mutex_unlock(&rt->vision_lock);
        rt->vision_pool_seen = ps;
    } else {
        ps = rt->vision_pool_seen;
    }
    *out = (struct mmrt_memory_report){
        .struct_size = sizeof *out,
        .weight_bytes = dev->weights.tensor_bytes,
        .weight_mapped_bytes = dev->weights.mapped_bytes,
        .weight_copied_bytes = dev->weights.copied_bytes,
        .weight_reserved_bytes = dev->weights.reserved_bytes,
        .weight_tensors = dev->weights.n_tensors,
        .pool_capacity_bytes = ps.capacity_bytes,
        .pool_bytes_in_use = ps.bytes_in_use,
        .pool_peak_bytes = ps.peak_bytes_in_use,
        .pool_fragmentation = ps.fragmentation,
        .kv_page_tokens = dev->kv.page_tokens,
        .kv_pages_total = dev->kv.pages_total,
        .kv_pages_used = dev->kv.pages_used,
        .kv_bytes = dev->kv.bytes,
        .pool_bytes_held = ps.bytes_held,
        .pool_peak_bytes_held = ps.peak_bytes_held,
        .level1_hits = ps.level1_hits,
        .level1_misses = ps.level1_misses,
        .level1_bytes = ps.level1_bytes,
        .level1_free_bytes = ps.level1_free_bytes,
        .kv_dtype = dev->kv.page_tokens ? mmrt_dtype_name_of(dev->kv.dtype) : NULL,
    };
}

struct list_ctx {
    mmrt_device_list_fn fn;
    void *user;
};

static int list_one(void *user, const char *name, const char *path)
{
    struct list_ctx *ctx = user;
    struct mmrt_plugin_report rep = { .name = name, .path = path };
    struct mmrt_loaded_plugin *plugin = NULL;
    struct mmrt_error e = { 0 };
    if (mmrt_plugin_load_file(path, &plugin, &e) != MMRT_OK) {
        rep.error = e.msg;
        ctx->fn(ctx->user, &rep, NULL);
        return 0;
    }
    rep.version = plugin->api.version ? plugin->api.version : "";
    rep.n_devices = plugin->n_devices;
    rep.skip_reason = plugin->n_devices == 0 ? plugin->skip_reason : NULL;
    ctx->fn(ctx->user, &rep, NULL);
    for (int i = 0; i < plugin->n_devices; i++) {
        struct mmrt_device *h = NULL;
        char msg[256] = "";
        struct mmrt_device_desc d = { 0 };
        snprintf(d.plugin, sizeof d.plugin, "%s", plugin->api.name);
        d.index = i;
        if (plugin->api.device_open(i, NULL, 0, &h, msg, sizeof msg) == MMRT_OK) {
            struct mmrt_device_info info = { .hdr = MMRT_ABI_HEADER_INIT(struct mmrt_device_info) };
            if (plugin->api.device_info(h, &info) == MMRT_OK) {
                info.name[sizeof info.name - 1] = '\0';
                info.kind[sizeof info.kind - 1] = '\0';
                snprintf(d.device_name, sizeof d.device_name, "%s", info.name);
                snprintf(d.kind, sizeof d.kind, "%s", info.kind);
                d.total_bytes = info.total_bytes;
                d.free_bytes = info.free_bytes;
            }
            plugin->api.device_close(h);
        } else {
            /* The driver's reason, cut to what the name field holds. */
            static const char prefix[] = "(cannot open) ";
            size_t n = strnlen(msg, sizeof d.device_name - sizeof prefix);
            memcpy(d.device_name, prefix, sizeof prefix - 1);
            memcpy(d.device_name + sizeof prefix - 1, msg, n);
            d.device_name[sizeof prefix - 1 + n] = '\0';
        }
        ctx->fn(ctx->user, &rep, &d);
    }
    mmrt_plugin_release(plugin);
    return 0;
}

mmrt_status mmrt_list_devices(mmrt_device_list_fn fn, void *user, char *err, size_t err_size)
{
    struct mmrt_error e = { 0 };
    struct list_ctx ctx = { fn, user };
    mmrt_status st = mmrt_plugin_foreach_file(list_one, &ctx, &e);
    if (st != MMRT_OK)
        copy_error(err, err_size, &e);
    return st;
}

void mmrt_generation_defaults(const struct mmrt_runtime *rt,
                              struct mmrt_generation_defaults *out)
{
    size_t size = out->struct_size ? out->struct_size : sizeof *out;
    if (size > sizeof *out)
        size = sizeof *out;
    struct mmrt_generation_defaults d = rt ? rt->gen : (struct mmrt_generation_defaults){ 0 };
    d.struct_size = out->struct_size;
    memcpy(out, &d, size);
}

/* End of the first published mmrt_request (struct_size 0 means this many bytes). */
#define REQUEST_V1_END (offsetof(struct mmrt_request, top_p) + sizeof(float))

void mmrt_run_defaults(const struct mmrt_runtime *rt, struct mmrt_request *out)
{
    /* Never past the caller's struct: an embedder built against an older mmrt.h has a
     * shorter one (mmrt.h, struct mmrt_request). */
    size_t size = out->struct_size ? out->struct_size : REQUEST_V1_END;
    if (size > sizeof *out)
        size = sizeof *out;
    struct mmrt_request r = rt->run;
    r.struct_size = out->struct_size;
    memcpy(out, &r, size);
}

const char *mmrt_model_path(const struct mmrt_runtime *rt)
{
    return rt && rt->model ? rt->model_path : NULL;
}

const char *mmrt_model_type(const struct mmrt_runtime *rt)
{
    return rt && rt->model_type ? rt->model_type->model_type : NULL;
}

int mmrt_model_max_images(const struct mmrt_runtime *rt)
{
    if (!rt || !rt->model_type)
        return 0;
    return rt->model_type->max_images > 1 ? rt->model_type->max_images : 1;
}

/* The request as the models see it (model.h): this version's layout, and a prompt turned into
 * one user turn. `one` is that turn's storage, so a req_view is not copied once made. */
struct req_view {
    struct mmrt_request r;
    struct mmrt_message one;
};

/* End of the first published mmrt_result: what struct_size 0 means. */
#define RESULT_V1_END (offsetof(struct mmrt_result, decode_graph) + sizeof(int))

/* Bytes of *r the caller's struct holds (mmrt.h: never write past it). */
static size_t result_size(const struct mmrt_result *r)
{
    size_t n = r->struct_size ? r->struct_size : RESULT_V1_END;
    return n < sizeof *r ? n : sizeof *r;
}

/* Copies a full result into the caller's, as far as the caller's layout goes. */
static void result_out(struct mmrt_result *dst, const struct mmrt_result *full)
{
    const uint32_t size = dst->struct_size;
    memcpy(dst, full, result_size(dst));
    dst->struct_size = size;
}

static mmrt_status check_result_size(struct mmrt_runtime *rt, const struct mmrt_result *r)
{
    if (r->struct_size && r->struct_size < RESULT_V1_END)
        return mmrt_error_set(&rt->last, MMRT_ERR_INVALID_ARG,
                              "result: struct_size %u is smaller than the first layout (%zu)",
                              r->struct_size, (size_t)RESULT_V1_END);
    return MMRT_OK;
}

static bool known_role(const char *role)
{
    return role && (strcmp(role, "system") == 0 || strcmp(role, "user") == 0 ||
                    strcmp(role, "assistant") == 0);
}

/* Checks what the request says against the model and mmrt.h, naming the field or the message
 * index, and writes the view the models get. */
static mmrt_status normalize_request(const struct mmrt_runtime *rt, const struct mmrt_request *req,
                                     struct req_view *out, struct mmrt_error *err)
{
    memset(out, 0, sizeof *out);
    size_t size = req->struct_size ? req->struct_size : REQUEST_V1_END;
    if (size < REQUEST_V1_END)
        return mmrt_error_set(err, MMRT_ERR_INVALID_ARG,
                              "request: struct_size %u is smaller than the first layout (%zu)",
                              req->struct_size, (size_t)REQUEST_V1_END);
    memcpy(&out->r, req, size < sizeof out->r ? size : sizeof out->r);
    struct mmrt_request *r = &out->r;
    r->struct_size = sizeof *r;
    if (r->n_images < 0 || (r->n_images > 0 && !r->images))
        return mmrt_error_set(err, MMRT_ERR_INVALID_ARG,
                              "request: n_images %d needs as many images", r->n_images);
    const int max = mmrt_model_max_images(rt);
    if (r->n_images > max)
        return mmrt_error_set(err, MMRT_ERR_INVALID_ARG,
                              "request: %d images given; model type %s takes at most %d per "
                              "request", r->n_images, rt->model_type->model_type, max);
    for (int i = 0; i < r->n_images; i++) {
        const struct mmrt_image_input *im = &r->images[i];
        if (!im->path == !im->data)
            return mmrt_error_set(err, MMRT_ERR_INVALID_ARG,
                                  "request: images[%d] needs a path or data (exactly one)", i);
        if (im->data && im->size == 0)
            return mmrt_error_set(err, MMRT_ERR_INVALID_ARG,
                                  "request: images[%d] has data of 0 bytes", i);
        /* The decoder refuses more anyway; refusing here keeps mmrt_submit from copying
         * (or reading past) a size no image may have. */
        struct mmrt_image_limits lim;
        mmrt_image_limits_default(&lim);
        if (im->data && im->size > lim.max_input_bytes)
            return mmrt_error_set(err, MMRT_ERR_LIMIT,
                                  "request: images[%d] has %zu bytes, more than the %zu an "
                                  "encoded image may have", i, im->size, lim.max_input_bytes);
    }
    if (r->n_stop < 0 || r->n_stop > MMRT_MAX_STOP || (r->n_stop > 0 && !r->stop))
        return mmrt_error_set(err, MMRT_ERR_INVALID_ARG,
                              "request: n_stop %d must be 0 … %d, with as many stop strings",
                              r->n_stop, MMRT_MAX_STOP);
    for (int i = 0; i < r->n_stop; i++) {
        const char *t = r->stop[i];
        const size_t len = t ? strnlen(t, MMRT_MAX_STOP_BYTES + 1) : 0;
        size_t bad = 0;
        if (len == 0 || len > MMRT_MAX_STOP_BYTES)
            return mmrt_error_set(err, MMRT_ERR_INVALID_ARG,
                                  "request: stop[%d] must have 1 … %d bytes", i,
                                  MMRT_MAX_STOP_BYTES);
        if (!mmrt_utf8_valid(t, len, &bad))
            return mmrt_error_set(err, MMRT_ERR_INVALID_ARG,
                                  "request: stop[%d] is not valid UTF-8 (byte %zu)", i, bad);
    }
    if (r->max_tokens < 0)
        return mmrt_error_set(err, MMRT_ERR_INVALID_ARG,
                              "request: max_tokens %d must be at least 1 (or 0: up to the "
                              "context)", r->max_tokens);
    if (r->logprobs != 0 && r->logprobs != 1)
        return mmrt_error_set(err, MMRT_ERR_INVALID_ARG,
                              "request: logprobs %d must be 0 (off) or 1", r->logprobs);
    if (r->top_logprobs < 0 || r->top_logprobs > MMRT_MAX_TOP_LOGPROBS ||
        (r->top_logprobs > 0 && !r->logprobs))
        return mmrt_error_set(err, MMRT_ERR_INVALID_ARG,
                              "request: top_logprobs %d must be 0 … %d, and needs logprobs = 1",
                              r->top_logprobs, MMRT_MAX_TOP_LOGPROBS);
    if (r->n_logit_bias < 0 || r->n_logit_bias > MMRT_MAX_LOGIT_BIAS ||
        (r->n_logit_bias > 0 && !r->logit_bias))
        return mmrt_error_set(err, MMRT_ERR_INVALID_ARG,
                              "request: n_logit_bias %d must be 0 … %d, with as many entries",
                              r->n_logit_bias, MMRT_MAX_LOGIT_BIAS);
    /* The entries themselves (ids in the vocabulary, biases in range) are the sampler's to
     * check, with the other sampling settings. */
    if (r->response_format != MMRT_RESPONSE_TEXT &&
        r->response_format != MMRT_RESPONSE_JSON_OBJECT &&
        r->response_format != MMRT_RESPONSE_JSON_SCHEMA)
        return mmrt_error_set(err, MMRT_ERR_INVALID_ARG,
                              "request: response_format %d is not an enum "
                              "mmrt_response_format", r->response_format);
    if (r->response_format == MMRT_RESPONSE_JSON_SCHEMA) {
        /* Compiled here to refuse a bad schema at submission, by its place in the schema;
         * the cache keeps it for the sequences that answer it (submit()). */
        if (!r->json_schema)
            return mmrt_error_set(err, MMRT_ERR_INVALID_ARG, "request: response_format "
                                  "json_schema needs json_schema");
        struct mmrt_json_schema *schema = NULL;
        mmrt_status st = mmrt_schema_cache_get(rt->schemas, r->json_schema,
                                               strlen(r->json_schema), &schema, err);
        mmrt_json_schema_free(schema);
        if (st != MMRT_OK)
            return mmrt_error_prefix(err, st, "request");
    } else {
        r->json_schema = NULL;
    }
    if (r->n_messages < 0 || (r->n_messages > 0 && !r->messages))
        return mmrt_error_set(err, MMRT_ERR_INVALID_ARG,
                              "request: n_messages %d needs as many messages", r->n_messages);
    if (r->n_messages == 0) {
        out->one = (struct mmrt_message){ .role = "user", .text = r->prompt ? r->prompt : "",
                                          .n_images = r->n_images };
        r->messages = &out->one;
        r->n_messages = 1;
        return MMRT_OK;
    }
    if (r->prompt)
        return mmrt_error_set(err, MMRT_ERR_INVALID_ARG,
                              "request: give prompt or messages, not both");
    int images = 0;
    for (int i = 0; i < r->n_messages; i++) {
        const struct mmrt_message *m = &r->messages[i];
        if (!known_role(m->role))
            return mmrt_error_set(err, MMRT_ERR_INVALID_ARG,
                                  "request: message %d has role '%s'; the chat template knows "
                                  "system, user and assistant", i, m->role ? m->role : "(null)");
        if (m->n_images < 0 || (m->n_images > 0 && strcmp(m->role, "user") != 0))
            return mmrt_error_set(err, MMRT_ERR_INVALID_ARG,
                                  "request: message %d (%s) carries %d images; images go in "
                                  "user turns", i, m->role, m->n_images);
        images += m->n_images;
    }
    if (images != r->n_images)
        return mmrt_error_set(err, MMRT_ERR_INVALID_ARG,
                              "request: the messages carry %d images, the request has %d",
                              images, r->n_images);
    if (strcmp(r->messages[r->n_messages - 1].role, "assistant") == 0)
        return mmrt_error_set(err, MMRT_ERR_INVALID_ARG,
                              "request: message %d is an assistant turn; the answer is the "
                              "next one, so the chat must end with a user or system turn",
                              r->n_messages - 1);
    return MMRT_OK;
}


/* A request's vision stage, through the vision-feature cache (vision_cache.h) unless a trace
 * watches it: the golden tests and mmrt_check must see the real work. keys as
 * mmrt_vision_front_encode (may be NULL). */
static mmrt_status encode_cached(struct mmrt_runtime *rt, const struct mmrt_request *req,
                                 const struct mmrt_model_trace *trace,
                                 struct mmrt_vision_key *keys, struct mmrt_vision_output *out,
                                 struct mmrt_error *err)
{
    pthread_mutex_lock(&rt->vision_lock);
    const mmrt_status st = trace ? rt->model_type->encode(rt->model, req, trace, out, err)
                                 : mmrt_vision_front_encode(&rt->vfront, req, keys, out, err);
    pthread_mutex_unlock(&rt->vision_lock);
    return st;
}

/* The vision stages of n requests together, through the cache (vision_cache.h). */
static void encode_batch_cached(struct mmrt_runtime *rt, const struct mmrt_request *const *reqs,
                                int n, struct mmrt_vision_key *const *keys,
                                struct mmrt_vision_output *outs, mmrt_status *sts,
                                struct mmrt_error *errs)
{
    pthread_mutex_lock(&rt->vision_lock);
    mmrt_vision_front_encode_batch(&rt->vfront, reqs, n, keys, outs, sts, errs);
    pthread_mutex_unlock(&rt->vision_lock);
    pthread_mutex_lock(&rt->stats_lock);
    rt->vision_batches++;
    rt->vision_batch_jobs += (uint64_t)n;
    pthread_mutex_unlock(&rt->stats_lock);
}

mmrt_status mmrt_runtime_vision(struct mmrt_runtime *rt, const struct mmrt_request *req,
                                struct mmrt_vision_output *out, struct mmrt_error *err)
{
    memset(out, 0, sizeof *out);
    if (!rt->model)
        return mmrt_error_set(err, MMRT_ERR_CONFIG, "%s: no [model] configured", rt->source);
    struct req_view rv;
    mmrt_status st = normalize_request(rt, req, &rv, err);
    if (st != MMRT_OK)
        return st;
    pthread_mutex_lock(&rt->drive);
    st = encode_cached(rt, &rv.r, NULL, NULL, out, err);
    pthread_mutex_unlock(&rt->drive);
    return st;
}

void mmrt_runtime_vision_batch(struct mmrt_runtime *rt, const struct mmrt_request *reqs, int n,
                               struct mmrt_vision_output *outs, mmrt_status *sts,
                               struct mmrt_error *errs)
{
    struct req_view rv[MMRT_CONF_MAX_VISION_BATCH];
    const struct mmrt_request *run[MMRT_CONF_MAX_VISION_BATCH];
    struct mmrt_vision_output got[MMRT_CONF_MAX_VISION_BATCH];
    mmrt_status got_st[MMRT_CONF_MAX_VISION_BATCH];
    int idx[MMRT_CONF_MAX_VISION_BATCH], k = 0;
    for (int i = 0; i < n; i++) {
        memset(&outs[i], 0, sizeof outs[i]);
        sts[i] = i >= MMRT_CONF_MAX_VISION_BATCH
                     ? mmrt_error_set(&errs[i], MMRT_ERR_INVALID_ARG, "more than %d requests",
                                      MMRT_CONF_MAX_VISION_BATCH)
                 : !rt->model ? mmrt_error_set(&errs[i], MMRT_ERR_CONFIG, "%s: no [model] "
                                               "configured", rt->source)
                              : normalize_request(rt, &reqs[i], &rv[i], &errs[i]);
        if (sts[i] == MMRT_OK) {
            idx[k] = i;
            run[k++] = &rv[i].r;
        }
    }
    if (k == 0)
        return;
    struct mmrt_error *got_err = calloc((size_t)k, sizeof *got_err);
    if (!got_err) {
        for (int j = 0; j < k; j++)
            sts[idx[j]] = mmrt_error_set(&errs[idx[j]], MMRT_ERR_NO_MEMORY, "out of memory");
        return;
    }
    encode_batch_cached(rt, run, k, NULL, got, got_st, got_err);
    for (int j = 0; j < k; j++) {
        outs[idx[j]] = got[j];
        sts[idx[j]] = got_st[j];
        errs[idx[j]] = got_err[j];
    }
    free(got_err);
}

/* Hands one encoded request to the engine: the model's prompt, then submission. vis moves
 * into the engine either way. */
static mmrt_status submit(struct mmrt_runtime *rt, const struct mmrt_request *req,
                          struct mmrt_vision_output *vis, const struct mmrt_model_trace *trace,
                          mmrt_token_fn on_token, mmrt_logprobs_fn on_logprobs, void *user,
                          struct mmrt_result *result, struct mmrt_seq **seq,
                          struct mmrt_error *err)
{
    struct mmrt_prompt prompt = { 0 };
    mmrt_status st = rt->model_type->prepare(rt->model, req, vis, &prompt, err);
    if (st != MMRT_OK) {
        mmrt_vision_output_free(vis);
        return st;
    }
    /* A JSON answer's schema, from the cache (normalize_request compiled it). */
    struct mmrt_json_schema *schema = NULL;
    const char *text = req->response_format == MMRT_RESPONSE_JSON_SCHEMA ? req->json_schema
                                                                          : NULL;
    if (text || req->response_format == MMRT_RESPONSE_JSON_OBJECT) /* NULL: any object */
        st = mmrt_schema_cache_get(rt->schemas, text, text ? strlen(text) : 0, &schema, err);
    if (st != MMRT_OK) {
        mmrt_prompt_free(&prompt);
        mmrt_vision_output_free(vis);
        return mmrt_error_prefix(err, st, "request");
    }
    struct mmrt_engine_request er = { .req = req, .prompt = &prompt, .vision = vis,
                                      .schema = schema, .trace = trace, .on_token = on_token,
                                      .on_logprobs = on_logprobs, .user = user,
                                      .result = result };
    st = mmrt_engine_submit(rt->engine, &er, seq, err);
    mmrt_json_schema_free(schema);
    return st;
}

mmrt_status mmrt_runtime_json_schema(struct mmrt_runtime *rt, const char *text, size_t len,
                                     struct mmrt_json_schema **out, struct mmrt_error *err)
{
    return mmrt_schema_cache_get(rt->schemas, text, len, out, err);
}

/* One request, stages one after the other (the caller has cleared rt->last). */
static mmrt_status run_one(struct mmrt_runtime *rt, const struct mmrt_request *req,
                           const struct mmrt_model_trace *trace, mmrt_token_fn on_token,
                           void *user, struct mmrt_result *result)
{
    if (!req || !result)
        return mmrt_error_set(&rt->last, MMRT_ERR_INVALID_ARG,
                              "mmrt_run: request and result are required");
    if (!rt->model)
        return mmrt_error_set(&rt->last, MMRT_ERR_CONFIG,
                              "%s: no [model] configured; nothing to run", rt->source);
    memset(result, 0, sizeof *result);
    double t0 = mmrt_now_ms();
    struct mmrt_vision_output vis = { 0 };
    struct req_view rv;
    const struct mmrt_request *r = &rv.r;
    struct mmrt_seq *seq = NULL;
    mmrt_status st = normalize_request(rt, req, &rv, &rt->last);
    if (st == MMRT_OK)
        st = encode_cached(rt, r, trace, NULL, &vis, &rt->last);
    double t1 = mmrt_now_ms();
    if (st == MMRT_OK)
        st = submit(rt, r, &vis, trace, on_token, NULL, user, result, &seq, &rt->last);
    mmrt_vision_output_free(&vis);
    while (st == MMRT_OK && !mmrt_engine_done(seq))
        st = mmrt_engine_step(rt->engine, &rt->last);
    if (st == MMRT_OK && result->status != MMRT_OK) {
        st = result->status;
        mmrt_error_set(&rt->last, st, "%s", result->message);
    }
    mmrt_engine_release(seq);
    if (st == MMRT_OK) {
        result->vision_start_ms = 0;
        result->vision_end_ms = t1 - t0;
        result->language_start_ms = t1 - t0;
        result->language_end_ms = mmrt_now_ms() - t0;
    }
    mmrt_result_set_status(result, st, rt->last.msg);
    return st;
}

mmrt_status mmrt_run(struct mmrt_runtime *rt, const struct mmrt_request *req,
                     mmrt_token_fn on_token, void *user, struct mmrt_result *result)
{
    return mmrt_run_traced(rt, req, NULL, on_token, user, result);
}

mmrt_status mmrt_run_traced(struct mmrt_runtime *rt, const struct mmrt_request *req,
                            const struct mmrt_model_trace *trace, mmrt_token_fn on_token,
                            void *user, struct mmrt_result *result)
{
    if (!rt)
        return MMRT_ERR_INVALID_ARG;
    mmrt_error_clear(&rt->last);
    if (!result)
        return mmrt_error_set(&rt->last, MMRT_ERR_INVALID_ARG,
                              "mmrt_run: request and result are required");
    mmrt_status st = check_result_size(rt, result);
    if (st != MMRT_OK)
        return st;
    struct mmrt_result full;
    pthread_mutex_lock(&rt->drive);
    st = run_one(rt, req, trace, on_token, user, &full);
    pthread_mutex_unlock(&rt->drive);
    result_out(result, &full);
    return st;
}

/* ---- batches: every request in the engine at once; the vision stage runs ahead ---- */

struct batch {
    struct mmrt_runtime *rt;
    const struct req_view *reqs; /* as the model sees them (normalize_request) */
    int n;
    struct mmrt_vision_output *vis;
    struct mmrt_result *results;
    const struct mmrt_model_trace *traces; /* [n] or NULL */
    double t0;
    pthread_mutex_t lock;
    pthread_cond_t ready;
    int n_encoded; /* requests whose vision stage is finished (successfully or not) */
    mmrt_batch_token_fn on_token;
    void *user;
};

/* What a request's token callback needs to name its request. */
struct batch_slot {
    struct batch *b;
    int index;
};

/* The vision stages of requests [first, first + count): together, as the worker's
 * (jobs_encode), unless traced (a trace watches one request's own encode()). Returns the
 * first request not encoded. */
static int encode_some(struct batch *b, int first, int count)
{
    const int end = first + count < b->n ? first + count : b->n;
    const struct mmrt_request *reqs[MMRT_CONF_MAX_VISION_BATCH];
    int idx[MMRT_CONF_MAX_VISION_BATCH], k = 0;
    for (int i = first; i < end; i++) {
        struct mmrt_result *r = &b->results[i];
        if (r->status != MMRT_OK) /* refused before its vision stage */
            continue;
        r->vision_start_ms = mmrt_now_ms() - b->t0;
        if (b->traces) {
            struct mmrt_error err = { 0 };
            mmrt_status st = encode_cached(b->rt, &b->reqs[i].r, &b->traces[i], NULL,
                                           &b->vis[i], &err);
            r->vision_end_ms = mmrt_now_ms() - b->t0;
            if (st != MMRT_OK)
                mmrt_result_set_status(r, st, err.msg);
            continue;
        }
        idx[k] = i;
        reqs[k++] = &b->reqs[i].r;
    }
    if (k > 0) {
        mmrt_status sts[MMRT_CONF_MAX_VISION_BATCH];
        struct mmrt_vision_output vis[MMRT_CONF_MAX_VISION_BATCH];
        struct mmrt_error *errs = calloc((size_t)k, sizeof *errs);
        if (!errs) {
            for (int j = 0; j < k; j++)
                mmrt_result_set_status(&b->results[idx[j]], MMRT_ERR_NO_MEMORY, "out of memory");
            return end;
        }
        encode_batch_cached(b->rt, reqs, k, NULL, vis, sts, errs);
        for (int j = 0; j < k; j++) {
            struct mmrt_result *r = &b->results[idx[j]];
            r->vision_end_ms = mmrt_now_ms() - b->t0;
            b->vis[idx[j]] = vis[j];
            if (sts[j] != MMRT_OK)
                mmrt_result_set_status(r, sts[j], errs[j].msg);
        }
        free(errs);
    }
    return end;
}

static void *vision_worker(void *arg)
{
    struct batch *b = arg;
    for (int i = 0; i < b->n;) {
        i = encode_some(b, i, b->rt->vision_batch);
        pthread_mutex_lock(&b->lock);
        b->n_encoded = i;
        pthread_cond_signal(&b->ready);
        pthread_mutex_unlock(&b->lock);
    }
    return NULL;
}

static bool batch_token(void *user, int32_t id, const char *text)
{
    struct batch_slot *s = user;
    return s->b->on_token ? s->b->on_token(s->b->user, s->index, id, text) : true;
}

static mmrt_status run_batch(struct mmrt_runtime *rt, const struct mmrt_request *reqs, int n,
                             const struct mmrt_model_trace *traces,
                             mmrt_batch_token_fn on_token, void *user,
                             struct mmrt_result *results)
{
    /* The arguments are checked by mmrt_run_batch_traced. */
    if (!rt->model)
        return mmrt_error_set(&rt->last, MMRT_ERR_CONFIG,
                              "%s: no [model] configured; nothing to run", rt->source);
    struct req_view *norm = calloc((size_t)n, sizeof *norm);
    struct mmrt_seq **seqs = calloc((size_t)n, sizeof *seqs);
    struct batch_slot *slots = calloc((size_t)n, sizeof *slots);
    struct batch b = { .rt = rt, .reqs = norm, .n = n, .results = results, .traces = traces,
                       .t0 = mmrt_now_ms(), .on_token = on_token, .user = user };
    b.vis = calloc((size_t)n, sizeof *b.vis);
    if (!b.vis || !norm || !seqs || !slots) {
        free(b.vis);
        free(norm);
        free(seqs);
        free(slots);
        return mmrt_error_set(&rt->last, MMRT_ERR_NO_MEMORY, "batch: out of memory");
    }
    memset(results, 0, (size_t)n * sizeof *results);
    for (int i = 0; i < n; i++) {
        struct mmrt_error err = { 0 };
        slots[i] = (struct batch_slot){ &b, i };
        mmrt_status st = normalize_request(rt, &reqs[i], &norm[i], &err);
        if (st != MMRT_OK)
            mmrt_result_set_status(&results[i], st, err.msg);
    }
    pthread_mutex_init(&b.lock, NULL);
    pthread_cond_init(&b.ready, NULL);
    /* Two stages on one device would have two threads driving it: there the vision stage of
     * one request runs between two engine steps instead. */
    pthread_t worker;
    const bool overlap = rt->vision != rt->language &&
                         pthread_create(&worker, NULL, vision_worker, &b) == 0;
    int submitted = 0, finished = 0;
    mmrt_status st = MMRT_OK;
    while (st == MMRT_OK && finished < n) {
        int encoded;
        if (overlap) {
            pthread_mutex_lock(&b.lock);
            while (b.n_encoded == submitted && submitted < n && mmrt_engine_idle(rt->engine))
                pthread_cond_wait(&b.ready, &b.lock);
            encoded = b.n_encoded;
            pthread_mutex_unlock(&b.lock);
        } else {
            encoded = submitted < n ? encode_some(&b, submitted, rt->vision_batch) : submitted;
        }
        for (; submitted < encoded; submitted++) {
            struct mmrt_result *r = &results[submitted];
            if (r->status == MMRT_OK) {
                struct mmrt_error err = { 0 };
                const double vs = r->vision_start_ms, ve = r->vision_end_ms;
                mmrt_status sst = submit(rt, &norm[submitted].r, &b.vis[submitted],
                                         traces ? &traces[submitted] : NULL, batch_token,
                                         NULL, &slots[submitted], r, &seqs[submitted], &err);
                r->vision_start_ms = vs;
                r->vision_end_ms = ve;
                r->language_start_ms = mmrt_now_ms() - b.t0;
                if (sst != MMRT_OK)
                    mmrt_result_set_status(r, sst, err.msg);
            }
            mmrt_vision_output_free(&b.vis[submitted]);
            if (!seqs[submitted])
                finished++;
        }
        if (!mmrt_engine_idle(rt->engine))
            st = mmrt_engine_step(rt->engine, &rt->last);
        for (int i = 0; i < submitted; i++)
            if (seqs[i] && mmrt_engine_done(seqs[i])) {
                results[i].language_end_ms = mmrt_now_ms() - b.t0;
                mmrt_engine_release(seqs[i]);
                seqs[i] = NULL;
                finished++;
            }
    }
    for (int i = 0; i < n; i++)
        mmrt_engine_release(seqs[i]); /* only after an engine failure */
    if (overlap)
        pthread_join(worker, NULL);
    for (int i = submitted; i < n; i++)
        mmrt_vision_output_free(&b.vis[i]);
    pthread_cond_destroy(&b.ready);
    pthread_mutex_destroy(&b.lock);
    mmrt_status first = st;
    for (int i = 0; i < n && first == MMRT_OK; i++)
        if (results[i].status != MMRT_OK) {
            first = results[i].status;
            mmrt_error_set(&rt->last, first, "request %d: %s", i, results[i].message);
        }
    free(b.vis);
    free(norm);
    free(seqs);
    free(slots);
    return first;
}

mmrt_status mmrt_run_batch(struct mmrt_runtime *rt, const struct mmrt_request *reqs, int n,
                           mmrt_batch_token_fn on_token, void *user,
                           struct mmrt_result *results)
{
    return mmrt_run_batch_traced(rt, reqs, n, NULL, on_token, user, results);
}

mmrt_status mmrt_run_batch_traced(struct mmrt_runtime *rt, const struct mmrt_request *reqs,
                                  int n, const struct mmrt_model_trace *traces,
                                  mmrt_batch_token_fn on_token, void *user,
                                  struct mmrt_result *results)
{
    if (!rt)
        return MMRT_ERR_INVALID_ARG;
    mmrt_error_clear(&rt->last);
    if (!reqs || !results || n < 1)
        return mmrt_error_set(&rt->last, MMRT_ERR_INVALID_ARG,
                              "mmrt_run_batch: requests, results and n ≥ 1 are required");
    mmrt_status st = check_result_size(rt, &results[0]);
    if (st != MMRT_OK)
        return st;
    /* The caller's results are strided by its struct_size (mmrt.h). */
    const size_t stride = results[0].struct_size ? results[0].struct_size : sizeof *results;
    const uint32_t size = results[0].struct_size;
    struct mmrt_result *full = calloc((size_t)n, sizeof *full);
    if (!full)
        return mmrt_error_set(&rt->last, MMRT_ERR_NO_MEMORY, "batch: out of memory");
    pthread_mutex_lock(&rt->drive);
    st = run_batch(rt, reqs, n, traces, on_token, user, full);
    pthread_mutex_unlock(&rt->drive);
    for (int i = 0; i < n; i++) {
        struct mmrt_result *dst = (struct mmrt_result *)((char *)results + (size_t)i * stride);
        dst->struct_size = size;
        result_out(dst, &full[i]);
    }
    free(full);
    return st;
}

/* ---- asynchronous jobs: one worker thread drives the engine for them ---- */

struct mmrt_job {
    struct mmrt_runtime *rt;
    struct mmrt_request req;    /* normalized; everything it points at is owned below */
    struct mmrt_message *msgs;  /* [req.n_messages], role and text copied */
    struct mmrt_image_input *imgs; /* [req.n_images], path or data copied */
    char **stops;               /* [req.n_stop] copied */
    struct mmrt_logit_bias *bias; /* [req.n_logit_bias] copied */
    char *schema;               /* req.json_schema copied */
    char *prediction;           /* req.prediction copied */
    /* [req.n_images] vision-cache keys: an in-memory image's from mmrt_submit, a path
     * image's from its vision stage (written under jobs_lock after submission) */
    struct mmrt_vision_key *keys;
    struct mmrt_job_callbacks cb;
    struct mmrt_result result;
    /* Its vision stage's outcome, from the stage to the job's submission to the engine
     * (owned by whichever thread holds the job). */
    struct mmrt_vision_output vis;
    mmrt_status vis_st;
    struct mmrt_error vis_err;
    struct mmrt_seq *seq;       /* while the engine runs it (under jobs_lock) */
    bool cancel, done;          /* under jobs_lock */
    /* Once done and until waited for, in rt->finished (under jobs_lock), so that
     * mmrt_destroy frees the jobs nobody waits for. */
    struct mmrt_job *fin_prev, *fin_next;
    double t0;
    struct mmrt_job *next;
};

static void job_free(struct mmrt_job *j)
{
    for (int i = 0; j->msgs && i < j->req.n_messages; i++) {
        free((char *)j->msgs[i].role);
        free((char *)j->msgs[i].text);
    }
    for (int i = 0; j->imgs && i < j->req.n_images; i++) {
        free((char *)j->imgs[i].path);
        free((void *)j->imgs[i].data);
    }
    for (int i = 0; j->stops && i < j->req.n_stop; i++)
        free(j->stops[i]);
    free(j->stops);
    free(j->bias);
    free(j->schema);
    free(j->prediction);
    free(j->msgs);
    free(j->imgs);
    free(j->keys);
    mmrt_vision_output_free(&j->vis);
    free(j);
}

/* Marks j finished (its result is complete) and wakes the waiters. on_done runs before
 * `done` is set, so a waiter it wakes cannot free the job (or the callback's user) while the
 * callback still runs. */
static void job_finish(struct mmrt_job *j, mmrt_status st, const char *msg)
{
    struct mmrt_runtime *rt = j->rt;
    if (st != MMRT_OK && msg != j->result.message)
        mmrt_result_set_status(&j->result, st, msg);
    if (st != MMRT_OK)
        j->result.finish_reason = MMRT_FINISH_NONE;
    j->result.language_end_ms = mmrt_now_ms() - j->t0;
    if (j->cb.on_done)
        j->cb.on_done(j->cb.user);
    pthread_mutex_lock(&rt->jobs_lock);
    rt->n_outstanding--;
    j->done = true;
    j->fin_prev = NULL;
    j->fin_next = rt->finished;
    if (rt->finished)
        rt->finished->fin_prev = j;
    rt->finished = j;
    pthread_cond_broadcast(&rt->done);
    pthread_mutex_unlock(&rt->jobs_lock);
}

/* The vision stages of the taken jobs `batch` (a list, at most MMRT_CONF_MAX_VISION_BATCH),
 * run together: one call of the vision front, so a model with encode_batch runs their images
 * through shared passes of its tower. Each job keeps its outcome (vis, vis_st, vis_err) for
 * job_submit; a job cancelled before its stage skips it (vis_st MMRT_ERR_CANCELLED). Runs on
 * the worker (holding drive) or on its vision thread. */
static void jobs_encode(struct mmrt_runtime *rt, struct mmrt_job *batch)
{
    struct mmrt_job *jobs[MMRT_CONF_MAX_VISION_BATCH];
    const struct mmrt_request *reqs[MMRT_CONF_MAX_VISION_BATCH];
    /* The keys go back to each job under jobs_lock: mmrt_job_image_key reads them from other
     * threads. These copies are this thread's own while the stage runs. */
    struct mmrt_vision_key *keys[MMRT_CONF_MAX_VISION_BATCH];
    struct mmrt_vision_output vis[MMRT_CONF_MAX_VISION_BATCH];
    mmrt_status sts[MMRT_CONF_MAX_VISION_BATCH];
    struct mmrt_error errs[MMRT_CONF_MAX_VISION_BATCH];
    int n = 0;
    for (struct mmrt_job *j = batch; j && n < MMRT_CONF_MAX_VISION_BATCH; j = j->next) {
        pthread_mutex_lock(&rt->jobs_lock);
        const bool cancelled = j->cancel;
        pthread_mutex_unlock(&rt->jobs_lock);
        memset(&j->vis, 0, sizeof j->vis);
        j->vis_st = MMRT_OK;
        if (cancelled) {
            j->vis_st = mmrt_error_set(&j->vis_err, MMRT_ERR_CANCELLED, "cancelled");
            continue;
        }
        const struct mmrt_request *r = &j->req;
        j->result.vision_start_ms = mmrt_now_ms() - j->t0;
        j->result.queue_ms = j->result.vision_start_ms;
        keys[n] = NULL;
        if (mmrt_vision_front_applies(&rt->vfront, r) &&
            (keys[n] = malloc((size_t)r->n_images * sizeof *keys[n])))
            memcpy(keys[n], j->keys, (size_t)r->n_images * sizeof *keys[n]);
        memset(&errs[n], 0, sizeof errs[n]);
        jobs[n] = j;
        reqs[n++] = r;
    }
    if (n == 0)
        return;
    encode_batch_cached(rt, reqs, n, keys, vis, sts, errs);
    for (int i = 0; i < n; i++) {
        struct mmrt_job *j = jobs[i];
        if (keys[i]) {
            pthread_mutex_lock(&rt->jobs_lock);
            memcpy(j->keys, keys[i], (size_t)j->req.n_images * sizeof *keys[i]);
            pthread_mutex_unlock(&rt->jobs_lock);
            free(keys[i]);
        }
        j->result.vision_end_ms = mmrt_now_ms() - j->t0;
        j->vis = vis[i];
        j->vis_st = sts[i];
        j->vis_err = errs[i];
    }
}

/* An encoded job to the engine (the worker holds drive): it joins `*active`, or ends here
 * with its vision stage's or its submission's error. */
static void job_submit(struct mmrt_runtime *rt, struct mmrt_job *j, struct mmrt_job **active)
{
    j->result.language_start_ms = mmrt_now_ms() - j->t0;
    struct mmrt_seq *seq = NULL;
    mmrt_status st = j->vis_st;
    if (st == MMRT_OK)
        st = submit(rt, &j->req, &j->vis, NULL, j->cb.on_token, j->cb.on_logprobs, j->cb.user,
                    &j->result, &seq, &j->vis_err);
    mmrt_vision_output_free(&j->vis);
    if (st != MMRT_OK) {
        job_finish(j, st, j->vis_err.msg);
        return;
    }
    if (j->cb.on_accepted)
        j->cb.on_accepted(j->cb.user, j->result.n_prompt_tokens);
    pthread_mutex_lock(&rt->jobs_lock);
    j->seq = seq;
    if (j->cancel)
        mmrt_engine_cancel(seq);
    pthread_mutex_unlock(&rt->jobs_lock);
    j->next = *active;
    *active = j;
}

/* Moves rt->pending (newest first) to the end of *queue (oldest first). Under jobs_lock. */
static void take_pending(struct mmrt_runtime *rt, struct mmrt_job **queue)
{
    struct mmrt_job *taken = NULL;
    while (rt->pending) {
        struct mmrt_job *j = rt->pending;
        rt->pending = j->next;
        j->next = taken;
        taken = j;
    }
    while (*queue)
        queue = &(*queue)->next;
    *queue = taken;
}

/* Cuts the first `most` jobs off *queue and returns them as a list. */
static struct mmrt_job *cut_front(struct mmrt_job **queue, int most)
{
    struct mmrt_job *front = *queue, **cut = queue;
    for (int k = 0; k < most && *cut; k++)
        cut = &(*cut)->next;
    *queue = *cut;
    *cut = NULL;
    return front;
}

/* The worker's vision thread (stages on two devices): encodes the submitted jobs, oldest
 * first, up to vision_batch at once, while the worker steps the engine on the language
 * device, and hands them over in rt->ready. On stop it returns what it holds to pending. */
static void *vision_main(void *arg)
{
    struct mmrt_runtime *rt = arg;
    struct mmrt_job *queue = NULL; /* taken from pending, oldest first */
    pthread_mutex_lock(&rt->jobs_lock);
    for (;;) {
        while (!rt->stop && !rt->pending && !queue)
            pthread_cond_wait(&rt->work, &rt->jobs_lock);
        if (rt->stop)
            break;
        take_pending(rt, &queue);
        struct mmrt_job *batch = cut_front(&queue, rt->vision_batch);
        int n = 0;
        for (struct mmrt_job *j = batch; j; j = j->next)
            n++;
        rt->vision_taken += n;
        pthread_mutex_unlock(&rt->jobs_lock);
        jobs_encode(rt, batch);
        pthread_mutex_lock(&rt->jobs_lock);
        struct mmrt_job **tail = &rt->ready;
        while (*tail)
            tail = &(*tail)->next;
        *tail = batch;
        rt->vision_taken -= n;
        pthread_cond_broadcast(&rt->work);
    }
    while (queue) { /* back to pending, where the worker's exit finds them */
        struct mmrt_job *j = queue;
        queue = j->next;
        j->next = rt->pending;
        rt->pending = j;
    }
    pthread_mutex_unlock(&rt->jobs_lock);
    return NULL;
}

/* The vision cache's figures (its own lock: live from any thread); 0 when it is off. */
static void vision_cache_figures(struct mmrt_runtime *rt, struct mmrt_runtime_stats *n)
{
    struct mmrt_vision_cache_stats vc;
    mmrt_vision_cache_stats(rt->vcache, &vc);
    n->vision_cache_entries = vc.entries;
    n->vision_cache_bytes = vc.bytes;
    n->vision_cache_capacity_entries = vc.max_entries;
    n->vision_cache_capacity_bytes = vc.max_bytes;
    n->vision_cache_queries = vc.queries;
    n->vision_cache_hits = vc.hits;
    n->vision_cache_evictions = vc.evictions;
}

/* The figures mmrt_stats and mmrt_device_memory give while the worker holds drive. The
 * caller holds stats_lock, and drive or the guarantee that the worker does not drive. */
static void publish_locked(struct mmrt_runtime *rt)
{
    struct mmrt_engine_stats es = { 0 };
    mmrt_runtime_engine_stats(rt, &es);
    for (int i = 0; i < rt->n_devices; i++)
        memory_report(rt, rt->devices[i], &rt->snap_mem[i]);
    struct mmrt_runtime_stats *n = &rt->snap;
    n->requests_running = (uint64_t)es.running;
    n->engine_steps = es.steps;
    n->preemptions = es.preemptions;
    n->prefix_cache_hits = es.prefix_hits;
    n->prefix_cache_reused_tokens = es.prefix_reused_tokens;
    n->prefix_cache_prompt_hits = es.prompt_hits;
    n->vision_batches = rt->vision_batches;
    n->vision_batch_requests = rt->vision_batch_jobs;
    n->image_kv_compressions = es.image_kv_compressions;
    n->image_kv_dropped_tokens = es.image_kv_dropped_tokens;
    n->draft_tokens = es.draft_rows;
    n->draft_accepted = es.draft_accepted;
    struct mmrt_schema_cache_stats sc;
    mmrt_schema_cache_get_stats(rt->schemas, &sc);
    n->json_schema_lookups = sc.lookups;
    n->json_schema_compiles = sc.compiles;
    const struct mmrt_dev *lang = rt->language;
    n->kv_pages_used = lang->kv.pages_used;
    n->kv_pages_total = lang->kv.pages_total;
    n->kv_page_tokens = lang->kv.page_tokens;
    vision_cache_figures(rt, n);
}

/* The worker takes and gives back drive through these, so readers know whose figures are
 * live (see mmrt_device_memory). */
static void worker_drive(struct mmrt_runtime *rt)
{
    pthread_mutex_lock(&rt->drive);
    pthread_mutex_lock(&rt->stats_lock);
    rt->worker_driving = true;
    pthread_mutex_unlock(&rt->stats_lock);
}

static void worker_release(struct mmrt_runtime *rt)
{
    pthread_mutex_lock(&rt->stats_lock);
    publish_locked(rt);
    rt->progress_ms = mmrt_now_ms();
    rt->worker_driving = false;
    pthread_mutex_unlock(&rt->stats_lock);
    pthread_mutex_unlock(&rt->drive);
}

/* Frees a list of jobs that never reached the engine, cancelled by the runtime's end. */
static void jobs_drop(struct mmrt_job *list)
{
    while (list) {
        struct mmrt_job *j = list;
        list = j->next;
        if (j->cb.on_done) {
            mmrt_result_set_status(&j->result, MMRT_ERR_CANCELLED, "cancelled: the runtime was destroyed");
            j->cb.on_done(j->cb.user);
        }
        job_free(j);
    }
}

static void *worker_main(void *arg)
{
    struct mmrt_runtime *rt = arg;
    struct mmrt_job *active = NULL; /* in the engine; only this thread touches the list */
    /* Stages on one device: the worker runs the vision stages itself, between two engine
     * steps. `fresh` holds the jobs taken from pending, oldest first; up to vision_batch of
     * them start per step, their vision stages together: a burst of new requests then costs
     * the running streams one (batched) vision stage between two tokens, not one per
     * request, and the burst reaches its prefill together. Stages on two devices: the vision
     * thread encodes while this one steps the engine, and its jobs arrive in rt->ready. */
    struct mmrt_job *fresh = NULL;
    pthread_t vision;
    const bool own_vision = rt->vision != rt->language &&
                            pthread_create(&vision, NULL, vision_main, rt) == 0;
    pthread_mutex_lock(&rt->jobs_lock);
    for (;;) {
        while (!rt->stop && !active && !fresh && !rt->ready && (own_vision || !rt->pending))
            pthread_cond_wait(&rt->work, &rt->jobs_lock);
        if (rt->stop)
            break;
        struct mmrt_job *encoded = rt->ready;
        rt->ready = NULL;
        if (!own_vision)
            take_pending(rt, &fresh);
        pthread_mutex_unlock(&rt->jobs_lock);
        worker_drive(rt);
        if (fresh) {
            encoded = cut_front(&fresh, rt->vision_batch);
            jobs_encode(rt, encoded);
        }
        while (encoded) {
            struct mmrt_job *j = encoded;
            encoded = j->next;
            job_submit(rt, j, &active);
        }
        struct mmrt_error err = { 0 };
        struct mmrt_job *finished = NULL;
        if (!mmrt_engine_idle(rt->engine))
            mmrt_engine_step(rt->engine, &err);
        for (struct mmrt_job **p = &active; *p;) {
            struct mmrt_job *j = *p;
            if (!mmrt_engine_done(j->seq)) {
                p = &j->next;
                continue;
            }
            *p = j->next;
            pthread_mutex_lock(&rt->jobs_lock);
            mmrt_engine_release(j->seq);
            j->seq = NULL;
            pthread_mutex_unlock(&rt->jobs_lock);
            j->next = finished;
            finished = j;
        }
        /* The figures are published before the jobs are marked done, so whoever a job's end
         * wakes reads its pages as returned. */
        worker_release(rt);
        while (finished) {
            struct mmrt_job *j = finished;
            finished = j->next;
            job_finish(j, j->result.status, j->result.message);
        }
        pthread_mutex_lock(&rt->jobs_lock);
        if (!rt->pending && !active && !fresh && !rt->ready && !rt->vision_taken) {
            pthread_mutex_lock(&rt->stats_lock);
            rt->worker_busy = false;
            pthread_mutex_unlock(&rt->stats_lock);
        }
    }
    /* Stopping (mmrt_destroy): the vision thread gives back what it holds; then what is still
     * queued, encoded or running is cancelled and freed. */
    pthread_mutex_unlock(&rt->jobs_lock);
    if (own_vision)
        pthread_join(vision, NULL);
    pthread_mutex_lock(&rt->jobs_lock);
    struct mmrt_job *left = rt->pending, *encoded = rt->ready;
    rt->pending = rt->ready = NULL;
    pthread_mutex_unlock(&rt->jobs_lock);
    pthread_mutex_lock(&rt->drive);
    while (active) {
        struct mmrt_job *j = active;
        active = j->next;
        mmrt_engine_release(j->seq);
        if (j->cb.on_done) {
            mmrt_result_set_status(&j->result, MMRT_ERR_CANCELLED, "cancelled: the runtime was destroyed");
            j->cb.on_done(j->cb.user);
        }
        job_free(j);
    }
    pthread_mutex_unlock(&rt->drive);
    jobs_drop(fresh);
    jobs_drop(encoded);
    jobs_drop(left);
    return NULL;
}

static void stop_worker(struct mmrt_runtime *rt)
{
    if (!rt->worker_started)
        return;
    pthread_mutex_lock(&rt->jobs_lock);
    rt->stop = true;
    pthread_cond_broadcast(&rt->work);
    pthread_mutex_unlock(&rt->jobs_lock);
    pthread_join(rt->worker, NULL);
    rt->worker_started = false;
    while (rt->finished) { /* done, never waited for: mmrt_destroy frees them */
        struct mmrt_job *j = rt->finished;
        rt->finished = j->fin_next;
        job_free(j);
    }
}

static char *dup_or_null(const char *s, bool *failed)
{
    if (!s)
        return NULL;
    char *d = strdup(s);
    *failed |= d == NULL;
    return d;
}

/* mmrt_submit with its message in *e: submitters on many threads never share rt->last. */
static mmrt_status submit_job(struct mmrt_runtime *rt, const struct mmrt_request *req,
                              const struct mmrt_job_callbacks *cb, struct mmrt_job **out,
                              struct mmrt_error *e)
{
    if (!rt->model)
        return mmrt_error_set(e, MMRT_ERR_CONFIG,
                              "%s: no [model] configured; nothing to run", rt->source);
    struct req_view rv;
    mmrt_status st = normalize_request(rt, req, &rv, e);
    if (st != MMRT_OK)
        return st;
    /* The job owns a copy of everything the request points at. */
    const struct mmrt_request *v = &rv.r;
    struct mmrt_job *j = calloc(1, sizeof *j);
    bool failed = j == NULL;
    if (j) {
        j->rt = rt;
        j->req = *v;
        j->req.prompt = NULL; /* carried by the messages */
        j->cb = *cb;
        j->t0 = mmrt_now_ms();
        j->stops = calloc((size_t)(v->n_stop ? v->n_stop : 1), sizeof *j->stops);
        failed |= !j->stops;
        for (int i = 0; !failed && i < v->n_stop; i++)
            j->stops[i] = dup_or_null(v->stop[i], &failed);
        j->req.stop = (const char *const *)j->stops;
        if (v->n_logit_bias > 0) {
            j->bias = malloc((size_t)v->n_logit_bias * sizeof *j->bias);
            failed |= !j->bias;
            if (j->bias)
                memcpy(j->bias, v->logit_bias, (size_t)v->n_logit_bias * sizeof *j->bias);
        }
        j->req.logit_bias = j->bias;
        j->schema = dup_or_null(v->json_schema, &failed);
        j->req.json_schema = j->schema;
        j->prediction = dup_or_null(v->prediction, &failed);
        j->req.prediction = j->prediction;
        j->msgs = calloc((size_t)v->n_messages, sizeof *j->msgs);
        j->imgs = calloc((size_t)(v->n_images ? v->n_images : 1), sizeof *j->imgs);
        failed |= !j->msgs || !j->imgs;
        for (int i = 0; !failed && i < v->n_messages; i++) {
            j->msgs[i].n_images = v->messages[i].n_images;
            j->msgs[i].role = dup_or_null(v->messages[i].role, &failed);
            j->msgs[i].text = dup_or_null(v->messages[i].text, &failed);
        }
        for (int i = 0; !failed && i < v->n_images; i++) {
            const struct mmrt_image_input *in = &v->images[i];
            j->imgs[i].path = dup_or_null(in->path, &failed);
            if (in->data) {
                void *d = malloc(in->size);
                failed |= !d;
                if (d)
                    memcpy(d, in->data, in->size);
                j->imgs[i].data = d;
                j->imgs[i].size = in->size;
            }
        }
        j->req.messages = j->msgs;
        j->req.images = j->imgs;
        /* In-memory images are hashed here, on the submitting thread, so the worker (which
         * every running request waits for) does not; path images on the worker. */
        j->keys = calloc((size_t)(v->n_images ? v->n_images : 1), sizeof *j->keys);
        failed |= !j->keys;
        for (int i = 0; !failed && i < v->n_images &&
                        mmrt_vision_front_applies(&rt->vfront, &j->req); i++)
            if (j->imgs[i].data)
                mmrt_vision_key_of(rt->vfront.settings, j->imgs[i].data, j->imgs[i].size,
                                   &j->keys[i]);
    }
    if (failed) {
        if (j)
            job_free(j);
        return mmrt_error_set(e, MMRT_ERR_NO_MEMORY, "mmrt_submit: out of memory");
    }
    pthread_mutex_lock(&rt->jobs_lock);
    if (!rt->worker_started) {
        if (pthread_create(&rt->worker, NULL, worker_main, rt) != 0) {
            pthread_mutex_unlock(&rt->jobs_lock);
            job_free(j);
            return mmrt_error_set(e, MMRT_ERR_NO_MEMORY,
                                  "mmrt_submit: cannot start the worker thread");
        }
        rt->worker_started = true;
    }
    j->next = rt->pending;
    rt->pending = j;
    rt->n_outstanding++;
    pthread_mutex_lock(&rt->stats_lock);
    if (!rt->worker_busy) {
        rt->worker_busy = true;
        rt->progress_ms = mmrt_now_ms();
    }
    pthread_mutex_unlock(&rt->stats_lock);
    pthread_cond_broadcast(&rt->work); /* the worker, or its vision thread */
    pthread_mutex_unlock(&rt->jobs_lock);
    *out = j;
    return MMRT_OK;
}

mmrt_status mmrt_submit_with(struct mmrt_runtime *rt, const struct mmrt_request *req,
                             const struct mmrt_job_callbacks *cb, struct mmrt_job **out,
                             char *err, size_t err_size)
{
    struct mmrt_error e = { 0 };
    mmrt_status st = MMRT_OK;
    if (out)
        *out = NULL;
    struct mmrt_job_callbacks c = { 0 };
    /* The caller's layout: callbacks it does not have read as NULL. */
    const size_t v1 = offsetof(struct mmrt_job_callbacks, on_logprobs);
    if (cb) {
        const size_t size = cb->struct_size ? cb->struct_size : v1;
        memcpy(&c, cb, size < sizeof c ? size : sizeof c);
    }
    if (!rt || !req || !out)
        st = mmrt_error_set(&e, MMRT_ERR_INVALID_ARG,
                            "mmrt_submit: runtime, request and out are required");
    else if (cb && cb->struct_size && cb->struct_size < offsetof(struct mmrt_job_callbacks,
                                                                  on_token))
        st = mmrt_error_set(&e, MMRT_ERR_INVALID_ARG,
                            "mmrt_submit: mmrt_job_callbacks.struct_size %u is too small",
                            (unsigned)cb->struct_size);
    else
        st = submit_job(rt, req, &c, out, &e);
    if (err && err_size)
        mmrt_error_copy(err, err_size, st == MMRT_OK ? "" : e.msg);
    return st;
}

mmrt_status mmrt_submit(struct mmrt_runtime *rt, const struct mmrt_request *req,
                        mmrt_token_fn on_token, void *user, struct mmrt_job **out, char *err,
                        size_t err_size)
{
    const struct mmrt_job_callbacks cb = { .struct_size = sizeof cb, .on_token = on_token,
                                           .user = user };
    return mmrt_submit_with(rt, req, &cb, out, err, err_size);
}

mmrt_status mmrt_stats(struct mmrt_runtime *rt, struct mmrt_runtime_stats *out)
{
    if (!rt || !out)
        return MMRT_ERR_INVALID_ARG;
    if (out->struct_size < offsetof(struct mmrt_runtime_stats, requests_waiting))
        return mmrt_error_set(&rt->last, MMRT_ERR_INVALID_ARG,
                              "mmrt_runtime_stats.struct_size %u is too small (set it to "
                              "sizeof(struct mmrt_runtime_stats))", (unsigned)out->struct_size);
    struct mmrt_runtime_stats full;
    pthread_mutex_lock(&rt->jobs_lock);
    const uint64_t outstanding = rt->n_outstanding;
    pthread_mutex_unlock(&rt->jobs_lock);
    pthread_mutex_lock(&rt->stats_lock);
    if (!rt->worker_driving)
        publish_locked(rt); /* the caller drives, or nobody: the live figures (see above) */
    full = rt->snap;
    full.ms_since_progress = rt->worker_busy ? mmrt_now_ms() - rt->progress_ms : 0;
    pthread_mutex_unlock(&rt->stats_lock);
    vision_cache_figures(rt, &full); /* live, not as of the last step */
    full.requests_waiting = outstanding > full.requests_running
                                ? outstanding - full.requests_running : 0;
    full.struct_size = out->struct_size;
    memcpy(out, &full, out->struct_size < sizeof full ? out->struct_size : sizeof full);
    return MMRT_OK;
}

mmrt_status mmrt_job_image_key(const struct mmrt_job *job, int i, char *out, size_t size)
{
    if (out && size)
        out[0] = '\0';
    if (!job || !out || size < MMRT_IMAGE_KEY_SIZE || i < 0 || i >= job->req.n_images)
        return MMRT_ERR_INVALID_ARG;
    char hex[MMRT_VISION_KEY_HEX];
    pthread_mutex_lock(&job->rt->jobs_lock);
    mmrt_vision_key_hex(&job->keys[i], hex);
    pthread_mutex_unlock(&job->rt->jobs_lock);
    memcpy(out, hex, strlen(hex) + 1);
    return MMRT_OK;
}

void mmrt_cancel(struct mmrt_job *job)
{
    if (!job)
        return;
    struct mmrt_runtime *rt = job->rt;
    pthread_mutex_lock(&rt->jobs_lock);
    job->cancel = true;
    if (job->seq)
        mmrt_engine_cancel(job->seq);
    pthread_mutex_unlock(&rt->jobs_lock);
}

mmrt_status mmrt_wait(struct mmrt_job *job, struct mmrt_result *result)
{
    if (!job)
        return MMRT_ERR_INVALID_ARG;
    struct mmrt_runtime *rt = job->rt;
    pthread_mutex_lock(&rt->jobs_lock);
    while (!job->done)
        pthread_cond_wait(&rt->done, &rt->jobs_lock);
    if (job->fin_prev)
        job->fin_prev->fin_next = job->fin_next;
    else
        rt->finished = job->fin_next;
    if (job->fin_next)
        job->fin_next->fin_prev = job->fin_prev;
    pthread_mutex_unlock(&rt->jobs_lock);
    const mmrt_status st = job->result.status;
    if (result && (!result->struct_size || result->struct_size >= RESULT_V1_END))
        result_out(result, &job->result);
    job_free(job);
    return st;
}

void mmrt_runtime_engine_stats(const struct mmrt_runtime *rt, struct mmrt_engine_stats *out)
{
    if (rt->engine)
        mmrt_engine_get_stats(rt->engine, out);
    else
        memset(out, 0, sizeof *out);
}

/* ---- --check: the configured placement against the CPU reference ---- */

struct check_capture {
    float *features;
    int64_t n_features;
    float **logits; /* [max_steps] */
    int max_steps, n_steps;
    int64_t vocab;
    int32_t *tokens;
    int n_tokens;
    bool failed;
};

/* Called once per image, in order; the images' rows are appended (they may differ in
 * count from image to image). */
static void cc_features(void *user, int image, const float *data, int64_t n_tokens, int64_t dim)
{
    struct check_capture *c = user;
    (void)image;
    if (c->failed)
        return;
    const int64_t n = n_tokens * dim;
    float *grown = realloc(c->features, (size_t)(c->n_features + n + 1) * sizeof *grown);
    if (!grown) {
        c->failed = true;
        return;
    }
    c->features = grown;
    memcpy(c->features + c->n_features, data, (size_t)n * sizeof *c->features);
    c->n_features += n;
}

static void cc_logits(void *user, int step, const float *logits, int64_t vocab)
{
    struct check_capture *c = user;
    if (step >= c->max_steps || c->failed)
        return;
    c->logits[step] = malloc((size_t)vocab * sizeof(float));
    if (!c->logits[step]) {
        c->failed = true;
        return;
    }
    memcpy(c->logits[step], logits, (size_t)vocab * sizeof(float));
    c->n_steps = step + 1;
    c->vocab = vocab;
}

static bool cc_token(void *user, int32_t id, const char *text)
{
    struct check_capture *c = user;
    (void)text;
    if (id >= 0 && c->n_tokens < c->max_steps)
        c->tokens[c->n_tokens++] = id;
    return true;
}

static void cc_free(struct check_capture *c)
{
    free(c->features);
    for (int i = 0; c->logits && i < c->max_steps; i++)
        free(c->logits[i]);
    free(c->logits);
    free(c->tokens);
}

static void compare(const float *x, const float *ref, int64_t n, double *max_abs,
                    double *max_rel)
{
    double diff = 0, scale = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)x[i] - (double)ref[i]);
        diff = d > diff || d != d ? d : diff;
        scale = fabs((double)ref[i]) > scale ? fabs((double)ref[i]) : scale;
    }
    double rel = scale > 0 ? diff / scale : diff;
    if (diff > *max_abs || diff != diff)
        *max_abs = diff;
    if (rel > *max_rel || rel != rel)
        *max_rel = rel;
}

mmrt_status mmrt_check(struct mmrt_runtime *rt, const struct mmrt_request *req,
                       struct mmrt_check_report *out)
{
    if (!rt)
        return MMRT_ERR_INVALID_ARG;
    mmrt_error_clear(&rt->last);
    if (!req || !out)
        return mmrt_error_set(&rt->last, MMRT_ERR_INVALID_ARG,
                              "mmrt_check: request and report are required");
    if (!rt->model)
        return mmrt_error_set(&rt->last, MMRT_ERR_CONFIG,
                              "%s: no [model] configured; nothing to check", rt->source);
    int steps = req->max_tokens > 0 ? req->max_tokens : 1;
    struct check_capture cap[2] = { { 0 } };
    struct mmrt_runtime *ref = NULL;
    mmrt_status st = MMRT_OK;
    for (int k = 0; k < 2; k++) {
        cap[k].max_steps = steps;
        cap[k].logits = calloc((size_t)steps, sizeof *cap[k].logits);
        cap[k].tokens = calloc((size_t)steps, sizeof *cap[k].tokens);
        if (!cap[k].logits || !cap[k].tokens) {
            st = mmrt_error_set(&rt->last, MMRT_ERR_NO_MEMORY, "check: out of memory");
            goto out;
        }
    }
    /* The reference: both stages on one CPU device with room for everything the
     * configured devices hold. */
    uint64_t pool_mb = 0;
    for (int i = 0; i < rt->n_devices; i++) {
        struct mmrt_pool_stats ps;
        mmrt_pool_stats(rt->devices[i]->pool, &ps);
        pool_mb += (ps.capacity_bytes >> 20) + 1;
    }
    struct mmrt_device_config dc = { .name = "reference", .plugin = "cpu", .pool_mb = pool_mb };
    struct mmrt_config cfg = { .struct_size = sizeof cfg,
                               .model_path = rt->model_path, .devices = &dc, .n_devices = 1,
                               .max_image_tokens = rt->model_opts.max_image_tokens,
                               .oversize_images = rt->model_opts.oversize_images,
                               .max_kv_tokens = rt->model_opts.max_kv_tokens,
                               .kv_page_tokens = rt->model_opts.kv_page_tokens,
                               .kv_dtype = rt->model_opts.kv_dtype,
                               .max_batch = rt->engine_opts.max_batch,
                               .prefill_chunk = rt->engine_opts.prefill_chunk,
                               .step_tokens = rt->engine_opts.step_tokens,
                               .vision_cache_entries = -1, /* traced: no use */
                               /* the same model: quantized the same way, the same images */
                               .weights = rt->model_opts.weights,
                               .exif_orientation = rt->model_opts.exif_orientation,
                               /* compressed as configured: the same rows kept */
                               .image_kv_keep = rt->engine_opts.image_kv.keep,
                               .image_kv_policy = rt->engine_opts.image_kv.policy };
    char msg[MMRT_ERROR_MAX];
    st = mmrt_create(&cfg, &ref, msg, sizeof msg);
    if (st != MMRT_OK) {
        mmrt_error_set(&rt->last, st, "check: the CPU reference: %s", msg);
        goto out;
    }
    struct mmrt_runtime *run[2] = { rt, ref };
    for (int k = 0; k < 2; k++) {
        struct mmrt_model_trace trace = { .user = &cap[k], .image_features = cc_features,
                                          .logits = cc_logits };
        struct mmrt_result res;
        mmrt_error_clear(&run[k]->last);
        st = run_one(run[k], req, &trace, cc_token, &cap[k], &res);
        if (st == MMRT_OK && cap[k].failed)
            st = mmrt_error_set(&run[k]->last, MMRT_ERR_NO_MEMORY, "check: out of memory");
        if (st != MMRT_OK) {
            if (k == 1)
                mmrt_error_set(&rt->last, st, "check: the CPU reference: %s", ref->last.msg);
            goto out;
        }
    }
    memset(out, 0, sizeof *out);
    out->tolerance = 1e-4;
    out->first_divergence = -1;
    out->n_tokens = cap[0].n_tokens;
    out->n_tokens_reference = cap[1].n_tokens;
    if (cap[0].n_features != cap[1].n_features) {
        st = mmrt_error_set(&rt->last, MMRT_ERR_INTERNAL, "check: feature counts differ");
        goto out;
    }
    if (cap[0].n_features)
        compare(cap[0].features, cap[1].features, cap[0].n_features, &out->features_max_abs,
                &out->features_max_rel);
    int n = cap[0].n_steps < cap[1].n_steps ? cap[0].n_steps : cap[1].n_steps;
    for (int i = 0; i < n; i++) {
        compare(cap[0].logits[i], cap[1].logits[i], cap[0].vocab, &out->logits_max_abs,
                &out->logits_max_rel);
        out->n_steps = i + 1;
        if (i < cap[0].n_tokens && i < cap[1].n_tokens && cap[0].tokens[i] != cap[1].tokens[i]) {
            out->first_divergence = i;
            break;
        }
    }
    if (out->first_divergence < 0 && cap[0].n_tokens != cap[1].n_tokens)
        out->first_divergence = n;
    out->pass = out->first_divergence < 0 && out->features_max_rel <= out->tolerance &&
                out->logits_max_rel <= out->tolerance;
out:
    mmrt_destroy(ref);
    cc_free(&cap[0]);
    cc_free(&cap[1]);
    return st;
}
