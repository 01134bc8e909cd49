/*
 * tests/image_fixtures.h — access to tests/fixtures/images (written by
 * tools/make_image_fixtures.py) for test_image.c and test_preprocess.c.
 *
 * Files are found under $MMRT_SOURCE_DIR/tests/fixtures/images (set by ctest), or relative
 * to the working directory when the variable is unset. Every helper fails the current cmocka
 * test on error, so callers never see a NULL.
 */
#ifndef MMRT_TEST_IMAGE_FIXTURES_H
#define MMRT_TEST_IMAGE_FIXTURES_H

#include <stddef.h>
#include <stdint.h>

#include "formats/json.h"

/* Full path of a fixture file, in a static buffer (valid until the next call). */
const char *fx_path(const char *name);

/* Whole file; *len receives its size. Free with free(). */
uint8_t *fx_read(const char *name, size_t *len);

/* A float32 fixture (.f32 raw or .f32.gz, little-endian) of exactly n floats. */
float *fx_read_f32(const char *name, size_t n);

/* manifest.json, parsed. json_decref() it. */
json_t *fx_manifest(void);

/* String / integer member of a manifest object (fails the test if missing). */
const char *fx_str(const json_t *obj, const char *key);
long long fx_int(const json_t *obj, const char *key);

#endif
