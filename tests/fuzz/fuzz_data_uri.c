/*
 * tests/fuzz/fuzz_data_uri.c — libFuzzer target for server/data_uri.c.
 *
 * The input is used twice. As a data: URI (capped at 1 MiB decoded): an accepted one must
 * give bytes that start with a PNG or JPEG magic, and re-encoding them must give back the
 * payload exactly (strict base64 has one encoding per byte string); a refused one must give
 * a one-line message. As bare base64: whenever mmrt_base64_decode accepts it, the size
 * predicted from the length must be what it wrote and the re-encoding must equal the input;
 * when it refuses, the offset must lie within the input (or be its length).
 *
 * The same entry point is linked into the normal build with replay_main.c, so the committed
 * corpus (tests/fuzz/corpus/data_uri) runs as a ctest everywhere.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "data_uri.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define CHECK(c)                  \
    do {                          \
        if (!(c))                 \
            __builtin_trap();     \
    } while (0)

static void check_base64(const char *s, size_t len)
{
    const size_t want = mmrt_base64_decoded_size(s, len);
    uint8_t *out = malloc(want == SIZE_MAX || want == 0 ? 1 : want);
    CHECK(out != NULL);
    size_t got = 0, bad = SIZE_MAX;
    if (want != SIZE_MAX && mmrt_base64_decode(s, len, out, &got, &bad)) {
        CHECK(got == want);
        char *again = mmrt_base64_encode(out, got);
        CHECK(again && strlen(again) == len && memcmp(again, s, len) == 0);
        free(again);
    } else if (want != SIZE_MAX) {
        CHECK(bad < len);
    } else {
        CHECK(!mmrt_base64_decode(s, len, out, &got, &bad) && bad == len);
    }
    free(out);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *s = (const char *)data;
    struct mmrt_data_uri d;
    struct mmrt_error err = { 0 };
    const mmrt_status st = mmrt_data_uri_decode(s, size, 1u << 20, &d, &err);
    if (st == MMRT_OK) {
        CHECK(d.size >= 3 && d.size <= (1u << 20));
        CHECK((d.data[0] == 0x89 && d.data[1] == 'P') || (d.data[0] == 0xff && d.data[1] == 0xd8));
        CHECK(d.type == MMRT_DATA_URI_PNG || d.type == MMRT_DATA_URI_JPEG);
        const char *comma = memchr(s, ',', size);
        CHECK(comma != NULL);
        const size_t n = size - (size_t)(comma + 1 - s);
        char *again = mmrt_base64_encode(d.data, d.size);
        CHECK(again && strlen(again) == n && memcmp(again, comma + 1, n) == 0);
        free(again);
        free(d.data);
    } else {
        const size_t len = strnlen(err.msg, sizeof err.msg);
        CHECK(len > 0 && len < sizeof err.msg && !memchr(err.msg, '\n', len));
        CHECK(st == MMRT_ERR_FORMAT || st == MMRT_ERR_UNSUPPORTED || st == MMRT_ERR_LIMIT);
    }
    check_base64(s, size);
    return 0;
}
