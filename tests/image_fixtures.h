/*
 * tests/image_fixtures.h — access to tests/fixtures/images (written by
 * tools/make_image_fixtures.py) for test_image.c and test_preprocess.c, and small PNG and
 * JPEG files made at run time (for EXIF cases and models' tests).
 *
 * Files are found under $MMRT_SOURCE_DIR/tests/fixtures/images (set by ctest), or relative
 * to the working directory when the variable is unset. Every helper fails the current cmocka
 * test on error, so callers never see a NULL.
 */
#ifndef MMRT_TEST_IMAGE_FIXTURES_H
#define MMRT_TEST_IMAGE_FIXTURES_H

#include <stdbool.h>
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

/* An 8-bit RGB PNG of w × h whose IDAT holds `rows` rows of rgb[rows][w][3] (fewer than h
 * makes a header-only bomb; rgb NULL = zeros), with an optional eXIf chunk exif[exif_n]
 * (a bare TIFF structure). malloc'd; *len its size. */
uint8_t *fx_make_png(uint32_t w, uint32_t h, uint32_t rows, const uint8_t *rgb,
                     const uint8_t *exif, size_t exif_n, size_t *len);

/* A baseline 4:4:4 JPEG (quality 95) of rgb[h][w][3], written with libjpeg, with one APP1
 * segment holding app1[app1_n] (the whole payload, "Exif\0\0" included, so a test can
 * damage any byte of it) right after the JFIF header when app1 is not NULL. For small images
 * (it fails the test above 1 MiB). malloc'd; *len its size. */
uint8_t *fx_make_jpeg(uint32_t w, uint32_t h, const uint8_t *rgb, const uint8_t *app1,
                      size_t app1_n, size_t *len);

/* Writes the APP1 payload of an EXIF block whose IFD0 holds only Orientation = orientation
 * (a SHORT, any value 0..255 for hostile cases), little- or big-endian, into out (at least
 * 32 bytes); returns its length (32). The TIFF part starts at out + 6. */
size_t fx_exif_orientation(int orientation, bool big_endian, uint8_t *out);

#endif
