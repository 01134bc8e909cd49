/* tests/image_fixtures.c — see image_fixtures.h. */
#include "image_fixtures.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <zlib.h>

const char *fx_path(const char *name)
{
    static char buf[4096];
    const char *root = getenv("MMRT_SOURCE_DIR");
    snprintf(buf, sizeof buf, "%s%stests/fixtures/images/%s", root ? root : "",
             root ? "/" : "", name);
    return buf;
}

uint8_t *fx_read(const char *name, size_t *len)
{
    const char *path = fx_path(name);
    FILE *f = fopen(path, "rb");
    if (!f)
        fail_msg("cannot open fixture %s", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *buf = malloc(n > 0 ? (size_t)n : 1);
    assert_non_null(buf);
    assert_int_equal(fread(buf, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    *len = (size_t)n;
    return buf;
}

float *fx_read_f32(const char *name, size_t n)
{
    /* gzread passes non-gzip files through unchanged */
    gzFile g = gzopen(fx_path(name), "rb");
    if (!g)
        fail_msg("cannot open fixture %s", fx_path(name));
    float *buf = malloc(n * sizeof *buf + 1);
    assert_non_null(buf);
    uint8_t *raw = (uint8_t *)buf;
    size_t got = 0;
    for (;;) {
        int r = gzread(g, raw + got, (unsigned)(n * sizeof *buf + 1 - got));
        if (r <= 0)
            break;
        got += (size_t)r;
        if (got > n * sizeof *buf)
            break;
    }
    gzclose(g);
    if (got != n * sizeof *buf)
        fail_msg("%s: %zu bytes, expected %zu", name, got, n * sizeof *buf);
    for (size_t i = 0; i < n; i++) { /* little-endian on disk */
        uint32_t u = (uint32_t)raw[4 * i] | (uint32_t)raw[4 * i + 1] << 8 |
                     (uint32_t)raw[4 * i + 2] << 16 | (uint32_t)raw[4 * i + 3] << 24;
        memcpy(&buf[i], &u, 4);
    }
    return buf;
}

json_t *fx_manifest(void)
{
    json_t *root = NULL;
    struct mmrt_error err = {0};
    if (mmrt_json_load_file(fx_path("manifest.json"), 1 << 20, 16, &root, &err) != MMRT_OK)
        fail_msg("%s", err.msg);
    return root;
}

const char *fx_str(const json_t *obj, const char *key)
{
    const json_t *v = json_object_get(obj, key);
    if (!json_is_string(v))
        fail_msg("manifest: missing string \"%s\"", key);
    return json_string_value(v);
}

long long fx_int(const json_t *obj, const char *key)
{
    const json_t *v = json_object_get(obj, key);
    if (!json_is_integer(v))
        fail_msg("manifest: missing integer \"%s\"", key);
    return json_integer_value(v);
}
