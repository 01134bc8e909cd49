/*
 * tests/fuzz/fuzz_ini.c — libFuzzer target for the deploy.ini reader (core/formats/conf.c).
 *
 * The input is a whole INI file, parsed by mmrt_conf_parse() under the name "fuzz/deploy.ini"
 * (so relative paths are joined to "fuzz/"). A refusal must carry a content, limit or memory
 * status and one "fuzz/deploy.ini:…" line, and leave *out untouched. An accepted file must be
 * what conf.h promises: 1 … MMRT_CONF_MAX_DEVICES devices with well-formed names and
 * plugins, each found again by mmrt_conf_find_device(), their options found again by
 * mmrt_conf_find_option(); every key that is set carrying a line inside the file, values
 * inside their documented ranges, stage devices naming a device of the file. Then the conf
 * is destroyed. Invariants are checked with __builtin_trap(), which libFuzzer reports as a
 * crash.
 *
 * The same entry point is linked into the normal build with replay_main.c, so the committed
 * corpus (tests/fuzz/corpus/ini) runs as a ctest everywhere.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "formats/conf.h"
#include "fuzz_check.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);


#define NAME "fuzz/deploy.ini"

static bool name_ok(const char *s, size_t max, bool dots)
{
    const size_t n = s ? strlen(s) : 0;
    if (n < 1 || n > max)
        return false;
    for (size_t i = 0; i < n; i++) {
        const char c = s[i];
        if (!((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
              c == '_' || c == '-' || (dots && c == '.')))
            return false;
    }
    return true;
}

/* A set key's line lies in the file (1 … lines + 1: the last line may lack its '\n'). */
static void check_line(int line, bool set, int n_lines)
{
    CHECK(line >= 0 && line <= n_lines);
    CHECK(!set || line > 0);
}

static void check_accepted(const struct mmrt_conf *c, int n_lines)
{
    CHECK(c->path && strcmp(c->path, NAME) == 0);
    CHECK(c->n_devices >= 1 && c->n_devices <= MMRT_CONF_MAX_DEVICES && c->devices);
    for (int i = 0; i < c->n_devices; i++) {
        const struct mmrt_conf_device *d = &c->devices[i];
        CHECK(name_ok(d->name, MMRT_CONF_MAX_NAME, false));
        CHECK(name_ok(d->plugin, MMRT_CONF_MAX_NAME, false));
        check_line(d->line, true, n_lines);
        check_line(d->plugin_line, true, n_lines);
        CHECK(d->plugin_line > d->line);
        CHECK(mmrt_conf_find_device(c, d->name) == d);
        CHECK(d->index >= 0 && d->index <= 1023);
        check_line(d->index_line, d->index != MMRT_CONF_DEFAULT_INDEX, n_lines);
        CHECK(d->pool_mb <= 16777216);
        check_line(d->pool_mb_line, d->pool_mb != 0, n_lines);
        check_line(d->level1_line, d->level1 != MMRT_LEVEL1_DEFAULT, n_lines);
        CHECK(d->n_options >= 0 && d->n_options <= MMRT_CONF_MAX_OPTIONS);
        CHECK(d->n_options == 0 || d->options);
        for (int k = 0; k < d->n_options; k++) {
            const struct mmrt_conf_option *o = &d->options[k];
            CHECK(name_ok(o->key, MMRT_CONF_MAX_OPTION_KEY, true) && o->value);
            check_line(o->line, true, n_lines);
            CHECK(o->line > d->line);
            CHECK(mmrt_conf_find_option(d, o->key) == o);
        }
        CHECK(mmrt_conf_find_option(d, "") == NULL);
    }
    CHECK(mmrt_conf_find_device(c, "") == NULL);
    CHECK(mmrt_conf_find_device(c, "not a device name") == NULL);

    const struct mmrt_conf_stage *stages[2] = { &c->vision, &c->language };
    for (int i = 0; i < 2; i++) {
        const struct mmrt_conf_stage *s = stages[i];
        check_line(s->section_line, s->present, n_lines);
        CHECK(s->present || (s->section_line == 0 && s->device == NULL));
        check_line(s->line, s->device != NULL, n_lines);
        CHECK(!s->device || mmrt_conf_find_device(c, s->device) != NULL);
    }

    check_line(c->model_line, c->model_path != NULL, n_lines);
    CHECK((c->model_line > 0) == (c->model_path != NULL));
    CHECK(!c->model_path || c->model_path[0] != '\0');
    check_line(c->model_path_line, c->model_path != NULL, n_lines);
    CHECK(c->max_image_tokens >= 0 && c->max_image_tokens <= MMRT_CONF_MAX_IMAGE_TOKENS);
    check_line(c->max_image_tokens_line, c->max_image_tokens != 0, n_lines);
    CHECK(c->max_kv_tokens >= 0 && c->max_kv_tokens <= MMRT_CONF_MAX_KV_TOKENS);
    check_line(c->max_kv_tokens_line, c->max_kv_tokens != 0, n_lines);
    const int64_t pt = c->kv_page_tokens;
    CHECK(pt >= 0 && pt <= MMRT_CONF_MAX_KV_PAGE_TOKENS && (pt & (pt - 1)) == 0);
    check_line(c->kv_page_tokens_line, pt != 0, n_lines);
    CHECK(c->image_kv_keep == 0 || (c->image_kv_keep > 0 && c->image_kv_keep <= 1));
    check_line(c->image_kv_keep_line, c->image_kv_keep != 0, n_lines);
    check_line(c->oversize_images_line, false, n_lines);
    check_line(c->kv_dtype_line, false, n_lines);
    check_line(c->weights_line, false, n_lines);
    check_line(c->exif_orientation_line, false, n_lines);
    check_line(c->image_kv_policy_line, false, n_lines);

    const struct mmrt_conf_run *r = &c->run;
    check_line(r->line, r->image || r->prompt, n_lines);
    check_line(r->image_line, r->image != NULL, n_lines);
    check_line(r->prompt_line, r->prompt != NULL, n_lines);
    CHECK(r->max_tokens >= 1 && r->max_tokens <= 1000000);
    check_line(r->max_tokens_line, r->max_tokens != MMRT_CONF_DEFAULT_MAX_TOKENS, n_lines);
    CHECK(r->seed <= (uint64_t)INT64_MAX);
    check_line(r->seed_line, r->seed != 0, n_lines);
    CHECK(isfinite(r->temperature) && r->temperature >= 0 && r->temperature <= 100);
    check_line(r->temperature_line, r->temperature != 0, n_lines);
    CHECK(r->top_k >= 0 && r->top_k <= 1000000);
    check_line(r->top_k_line, r->top_k != 0, n_lines);
    CHECK(r->top_p > 0 && r->top_p <= 1);
    check_line(r->top_p_line, r->top_p != MMRT_CONF_DEFAULT_TOP_P, n_lines);

    const struct mmrt_conf_scheduler *s = &c->scheduler;
    check_line(s->line, false, n_lines);
    CHECK(s->max_batch >= 0 && s->max_batch <= MMRT_CONF_MAX_BATCH);
    check_line(s->max_batch_line, s->max_batch != 0, n_lines);
    CHECK(s->prefill_chunk >= 0 && s->prefill_chunk <= MMRT_CONF_MAX_PREFILL_CHUNK);
    check_line(s->prefill_chunk_line, s->prefill_chunk != 0, n_lines);
    CHECK(s->step_tokens >= 0 && s->step_tokens <= MMRT_CONF_MAX_STEP_TOKENS);
    check_line(s->step_tokens_line, s->step_tokens != 0, n_lines);
    CHECK(s->vision_batch >= 0 && s->vision_batch <= MMRT_CONF_MAX_VISION_BATCH);
    check_line(s->vision_batch_line, s->vision_batch != 0, n_lines);

    const struct mmrt_conf_cache *k = &c->cache;
    check_line(k->line, false, n_lines);
    CHECK(k->vision_entries >= -1 && k->vision_entries <= MMRT_CONF_MAX_VISION_ENTRIES);
    check_line(k->vision_entries_line, k->vision_entries != 0, n_lines);
    CHECK(k->vision_mb >= 0 && k->vision_mb <= MMRT_CONF_MAX_VISION_MB);
    check_line(k->vision_mb_line, k->vision_mb != 0, n_lines);
    CHECK(k->prefix >= -1 && k->prefix <= 1);
    check_line(k->prefix_line, k->prefix != 0, n_lines);

    check_line(c->server_line, c->n_app > 0, n_lines);
    CHECK(c->n_app >= 0 && c->n_app <= MMRT_CONF_MAX_APP_KEYS && c->n_app <= c->cap_app);
    for (int i = 0; i < c->n_app; i++) {
        const struct mmrt_conf_entry *e = &c->app[i];
        CHECK(e->section && e->key && e->value);
        CHECK(name_ok(e->key, MMRT_CONF_MAX_OPTION_KEY, true));
        check_line(e->line, true, n_lines);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    int n_lines = 1;
    for (size_t i = 0; i < size; i++)
        n_lines += data[i] == '\n';
    struct mmrt_conf sentinel;
    struct mmrt_conf *conf = &sentinel;
    struct mmrt_error err = { 0 };
    const mmrt_status st = mmrt_conf_parse((const char *)data, size, NAME, &conf, &err);
    if (st != MMRT_OK) {
        CHECK(conf == &sentinel);
        CHECK(st == MMRT_ERR_CONFIG || st == MMRT_ERR_LIMIT || st == MMRT_ERR_NO_MEMORY);
        CHECK(err.status == st);
        fuzz_check_message(&err);
        CHECK(strncmp(err.msg, NAME ":", sizeof NAME) == 0);
        return 0;
    }
    CHECK(conf != NULL && conf != &sentinel);
    check_accepted(conf, n_lines);
    mmrt_conf_destroy(conf);
    return 0;
}
