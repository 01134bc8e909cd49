/*
 * core/formats/json.c — jansson behind a depth pre-scan and typed getters (see json.h).
 *
 * The pre-scan walks the bytes once, tracking only whether it is inside a string (and after
 * a backslash), and counts '[' / '{' nesting; it never allocates, so even a 100 MB hostile
 * header costs one linear pass before jansson sees it.
 */
#include "json.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "file.h"

void mmrt_json_prescan(const char *text, size_t len, int max_depth,
                       struct mmrt_json_prescan_result *out)
{
    struct mmrt_json_prescan_result r = { .too_deep_at = SIZE_MAX };
    int depth = 0;
    bool in_string = false, escaped = false;
    for (size_t i = 0; i < len; i++) {
        char c = text[i];
        if (in_string) {
            if (escaped)
                escaped = false;
            else if (c == '\\')
                escaped = true;
            else if (c == '"')
                in_string = false;
        } else if (c == '"') {
            in_string = true;
        } else if (c == '[' || c == '{') {
            if (++depth > max_depth && r.too_deep_at == SIZE_MAX)
                r.too_deep_at = i;
        } else if (c == ']' || c == '}') {
            depth--;
        } else if (c == ':' && depth == 1) {
            r.top_members++;
        }
    }
    *out = r;
}

static mmrt_status parse(const char *text, size_t len, const char *what, int max_depth,
                         size_t flags, json_t **out, struct mmrt_error *err)
{
    if (max_depth <= 0)
        max_depth = MMRT_JSON_DEFAULT_MAX_DEPTH;
    struct mmrt_json_prescan_result scan;
    mmrt_json_prescan(text, len, max_depth, &scan);
    if (scan.too_deep_at != SIZE_MAX)
        return mmrt_error_set(err, MMRT_ERR_FORMAT,
                              "%s: JSON nested deeper than %d levels at byte %zu", what,
                              max_depth, scan.too_deep_at);
    json_error_t jerr;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES | flags, &jerr);
    if (!root) {
        /* jansson quotes the offending input ("near '…'"): keep control bytes and invalid
         * UTF-8 from a hostile document out of our one-line messages and terminals. */
        for (char *c = jerr.text; *c; c++)
            if ((unsigned char)*c < 0x20 || (unsigned char)*c >= 0x7f)
                *c = '?';
        return mmrt_error_set(err, MMRT_ERR_FORMAT, "%s: invalid JSON at line %d column %d "
                              "(byte %d): %s", what, jerr.line, jerr.column, jerr.position,
                              jerr.text);
    }
    *out = root;
    return MMRT_OK;
}

mmrt_status mmrt_json_parse(const char *text, size_t len, const char *what, int max_depth,
                            json_t **out, struct mmrt_error *err)
{
    return parse(text, len, what, max_depth, 0, out, err);
}

static mmrt_status load_file(const char *path, size_t max_bytes, int max_depth, size_t flags,
                             json_t **out, struct mmrt_error *err)
{
    char *buf = NULL;
    size_t n = 0;
    mmrt_status st = mmrt_file_read(path, max_bytes, 0, NULL, &buf, &n, err);
    if (st == MMRT_OK)
        st = parse(buf, n, path, max_depth, flags, out, err);
    free(buf);
    return st;
}

mmrt_status mmrt_json_load_file(const char *path, size_t max_bytes, int max_depth,
                                json_t **out, struct mmrt_error *err)
{
    return load_file(path, max_bytes, max_depth, 0, out, err);
}

const char *mmrt_json_type_name(const json_t *v)
{
    switch (v ? json_typeof(v) : JSON_NULL) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a real number";
    case JSON_TRUE:
    case JSON_FALSE: return "a boolean";
    case JSON_NULL: return "null";
    }
    return "a value";
}

static mmrt_status load_object(const char *path, size_t max_bytes, int max_depth, size_t flags,
                               json_t **out, struct mmrt_error *err)
{
    json_t *root = NULL;
    mmrt_status st = load_file(path, max_bytes, max_depth, flags, &root, err);
    if (st != MMRT_OK)
        return st;
    if (!json_is_object(root)) {
        st = mmrt_error_set(err, MMRT_ERR_FORMAT, "%s: the top level is %s, not an object",
                            path, mmrt_json_type_name(root));
        json_decref(root);
        return st;
    }
    *out = root;
    return MMRT_OK;
}

mmrt_status mmrt_json_load_object(const char *path, size_t max_bytes, int max_depth,
                                  json_t **out, struct mmrt_error *err)
{
    return load_object(path, max_bytes, max_depth, 0, out, err);
}

mmrt_status mmrt_json_load_object_reals(const char *path, size_t max_bytes, int max_depth,
                                        json_t **out, struct mmrt_error *err)
{
    return load_object(path, max_bytes, max_depth, JSON_DECODE_INT_AS_REAL, out, err);
}

mmrt_status mmrt_json_opt_id_list(const json_t *obj, const char *key, const char *what,
                                  long long max, int32_t *ids, int cap, int *n,
                                  struct mmrt_error *err)
{
    const json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) {
        *n = 0;
        return MMRT_OK;
    }
    if (max > INT32_MAX)
        max = INT32_MAX;
    size_t count = json_is_array(v) ? json_array_size(v) : 1;
    if (!json_is_integer(v) && !json_is_array(v))
        return mmrt_error_set(err, MMRT_ERR_FORMAT, "%s: \"%s\" is %s, not an integer or a "
                              "list of integers", what, key, mmrt_json_type_name(v));
    if (count > (size_t)cap)
        return mmrt_error_set(err, MMRT_ERR_LIMIT, "%s: \"%s\" lists %zu ids, more than the "
                              "%d supported", what, key, count, cap);
    for (size_t i = 0; i < count; i++) {
        const json_t *e = json_is_array(v) ? json_array_get(v, i) : v;
        char where[32] = "";
        if (json_is_array(v))
            snprintf(where, sizeof where, "[%zu]", i);
        if (!json_is_integer(e))
            return mmrt_error_set(err, MMRT_ERR_FORMAT, "%s: \"%s\"%s is %s, not an integer",
                                  what, key, where, mmrt_json_type_name(e));
        /* Range-checked as JSON wrote it, before any narrowing: 4294967298 is not 2. */
        long long x = json_integer_value(e);
        if (x < 0 || x > max)
            return mmrt_error_set(err, MMRT_ERR_FORMAT, "%s: \"%s\"%s = %lld is outside "
                                  "[0, %lld]", what, key, where, x, max);
    }
    for (size_t i = 0; i < count; i++)
        ids[i] = (int32_t)json_integer_value(json_is_array(v) ? json_array_get(v, i) : v);
    *n = (int)count;
    return MMRT_OK;
}

mmrt_status mmrt_json_opt_int(const json_t *obj, const char *key, const char *what,
                              long long min, long long max, long long def, long long *out,
                              struct mmrt_error *err)
{
    const json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) {
        *out = def;
        return MMRT_OK;
    }
    if (!json_is_integer(v))
        return mmrt_error_set(err, MMRT_ERR_FORMAT, "%s: \"%s\" must be an integer", what, key);
    long long x = json_integer_value(v);
    if (x < min || x > max)
        return mmrt_error_set(err, MMRT_ERR_FORMAT, "%s: \"%s\" = %lld is outside [%lld, %lld]",
                              what, key, x, min, max);
    *out = x;
    return MMRT_OK;
}

mmrt_status mmrt_json_get_int(const json_t *obj, const char *key, const char *what,
                              long long min, long long max, long long *out,
                              struct mmrt_error *err)
{
    const json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v))
        return mmrt_error_set(err, MMRT_ERR_FORMAT, "%s: missing \"%s\"", what, key);
    return mmrt_json_opt_int(obj, key, what, min, max, 0, out, err);
}

mmrt_status mmrt_json_opt_number(const json_t *obj, const char *key, const char *what,
                                 double min, double max, double def, double *out,
                                 struct mmrt_error *err)
{
    const json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) {
        *out = def;
        return MMRT_OK;
    }
    if (!json_is_number(v))
        return mmrt_error_set(err, MMRT_ERR_FORMAT, "%s: \"%s\" must be a number", what, key);
    double x = json_number_value(v);
    if (!isfinite(x) || x < min || x > max)
        return mmrt_error_set(err, MMRT_ERR_FORMAT, "%s: \"%s\" = %g is outside [%g, %g]",
                              what, key, x, min, max);
    *out = x;
    return MMRT_OK;
}

mmrt_status mmrt_json_opt_bool(const json_t *obj, const char *key, const char *what, bool def,
                               bool *out, struct mmrt_error *err)
{
    const json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) {
        *out = def;
        return MMRT_OK;
    }
    if (!json_is_boolean(v))
        return mmrt_error_set(err, MMRT_ERR_FORMAT, "%s: \"%s\" must be true or false", what,
                              key);
    *out = json_is_true(v);
    return MMRT_OK;
}

mmrt_status mmrt_json_opt_string(const json_t *obj, const char *key, const char *what,
                                 const char *def, const char **out, struct mmrt_error *err)
{
    const json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) {
        *out = def;
        return MMRT_OK;
    }
    if (!json_is_string(v))
        return mmrt_error_set(err, MMRT_ERR_FORMAT, "%s: \"%s\" must be a string", what, key);
    *out = json_string_value(v);
    return MMRT_OK;
}
