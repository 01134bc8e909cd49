/*
 * core/generation_config.c — sampling defaults from generation_config.json (see the header).
 */
#include "generation_config.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "formats/file.h"
#include "formats/json.h"

/* A number key: absent or null leaves *has 0; otherwise it must lie in [lo, hi]. */
static mmrt_status number(const json_t *root, const char *key, const char *path, double lo,
                          double hi, int *has, double *out, struct mmrt_error *err)
{
    const json_t *v = json_object_get(root, key);
    if (!v || json_is_null(v))
        return MMRT_OK;
    const double x = json_is_number(v) ? json_number_value(v) : NAN;
    if (!(x >= lo && x <= hi))
        return mmrt_error_set(err, MMRT_ERR_FORMAT, "%s: \"%s\" must be a number in [%g, %g]",
                              path, key, lo, hi);
    *has = 1;
    *out = x;
    return MMRT_OK;
}

mmrt_status mmrt_generation_config_read(const char *dir, struct mmrt_generation_defaults *out,
                                        struct mmrt_error *err)
{
    struct mmrt_generation_defaults d = { .struct_size = sizeof d };
    char path[4200];
    snprintf(path, sizeof path, "%s/generation_config.json", dir);
    if (!mmrt_file_exists(path)) {
        *out = d;
        return MMRT_OK;
    }
    json_t *root = NULL;
    /* Every number as a real: only values are read here, and the file may carry integers
     * beyond 64 bits (json.h). */
    mmrt_status st = mmrt_json_load_object_reals(path, 1u << 20, 0, &root, err);
    if (st != MMRT_OK)
        return st;
    double t = 0, k = 0, p = 0, r = 0;
    st = number(root, "temperature", path, 0, 100, &d.has_temperature, &t, err);
    if (st == MMRT_OK)
        st = number(root, "top_k", path, 0, 1e9, &d.has_top_k, &k, err);
    if (st == MMRT_OK)
        st = number(root, "top_p", path, 0, 1, &d.has_top_p, &p, err);
    /* transformers requires a strictly positive penalty; 1 is off. */
    if (st == MMRT_OK)
        st = number(root, "repetition_penalty", path, 0, 100, &d.has_repetition_penalty, &r,
                    err);
    if (st == MMRT_OK && d.has_top_k && k != floor(k))
        st = mmrt_error_set(err, MMRT_ERR_FORMAT, "%s: \"top_k\" must be a whole number", path);
    if (st == MMRT_OK && d.has_repetition_penalty && r == 0)
        st = mmrt_error_set(err, MMRT_ERR_FORMAT, "%s: \"repetition_penalty\" must be greater "
                            "than 0", path);
    const json_t *ds = json_object_get(root, "do_sample");
    if (st == MMRT_OK && ds && !json_is_null(ds) && !json_is_boolean(ds))
        st = mmrt_error_set(err, MMRT_ERR_FORMAT, "%s: \"do_sample\" must be true or false",
                            path);
    if (st == MMRT_OK && json_is_false(ds)) {
        d.has_temperature = 1; /* generate() decodes greedily whatever the file says */
        t = 0;
    } else if (st == MMRT_OK && json_is_true(ds)) {
        /* GenerationConfig's own defaults for the sampling it turns on. */
        if (!d.has_temperature)
            d.has_temperature = 1, t = 1;
        if (!d.has_top_k)
            d.has_top_k = 1, k = 50;
        if (!d.has_top_p)
            d.has_top_p = 1, p = 1;
    }
    json_decref(root);
    if (st != MMRT_OK)
        return st;
    d.temperature = (float)t;
    d.top_k = (int)k;
    /* top_p 0 keeps only the most likely token, as the smallest positive top_p does. */
    d.top_p = (float)p > 0 ? (float)p : FLT_MIN;
    d.repetition_penalty = (float)r > 0 ? (float)r : FLT_MIN;
    *out = d;
    return MMRT_OK;
}
