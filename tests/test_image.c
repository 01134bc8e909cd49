/*
 * tests/test_image.c — core/formats/image.c against PIL + transformers, and against hostile
 * input: every fixture decoded and compared with PIL's pixels; EXIF orientations (against
 * PIL's exif_transpose and against an independent layout check); PIL's alpha compositing for
 * all 65536 (colour, alpha) pairs; limits refused at the header before any allocation
 * (measured through the malloc wrapper below); truncation at every length and seeded byte
 * flips; the progressive-scan cap; budgets; an allocation-failure sweep.
 *
 * Linked with -Wl,--wrap=malloc,calloc,realloc,free: the wrappers see the core's allocations,
 * including libspng's (routed through image.c), but not libjpeg's (inside its own .so).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>
#include <jpeglib.h>
#include <zlib.h>

#include "formats/image.h"
#include "image_fixtures.h"

/* Largest per-channel |ours − PIL| accepted for JPEG fixtures. Pillow 13's wheel bundles
 * libjpeg-turbo 3.2.0, the system has 2.1.5; with the same (default) settings they measured
 * identical on every fixture here, so the bound is 0 — raise it, with the measurement, if a
 * libjpeg-turbo upgrade changes the IDCT or upsampling. */
#define JPEG_TOLERANCE 0

/* ---------------------------------------------------------------------------------------- */
/* allocation wrappers: fail the n-th allocation, record the largest request, count live     */

void *__real_malloc(size_t n);
void *__real_calloc(size_t n, size_t size);
void *__real_realloc(void *p, size_t n);
void __real_free(void *p);

#define SET_SIZE (1u << 16)
static void *g_set[SET_SIZE];
static long g_live, g_countdown, g_allocs;
static int g_fired;
static size_t g_largest;

static size_t slot_of(void *p)
{
    uintptr_t h = (uintptr_t)p * 0x9e3779b97f4a7c15ull;
    return (size_t)(h >> 40) & (SET_SIZE - 1);
}

static void track(void *p)
{
    size_t i = slot_of(p);
    while (g_set[i] && g_set[i] != (void *)1)
        i = (i + 1) & (SET_SIZE - 1);
    g_set[i] = p;
    g_live++;
}

static void untrack(void *p)
{
    size_t i = slot_of(p);
    for (size_t probes = 0; g_set[i] && probes < SET_SIZE; probes++) {
        if (g_set[i] == p) {
            g_set[i] = (void *)1;
            g_live--;
            return;
        }
        i = (i + 1) & (SET_SIZE - 1);
    }
}

static int inject(size_t n)
{
    g_allocs++;
    if (n > g_largest)
        g_largest = n;
    if (g_countdown > 0 && --g_countdown == 0) {
        g_fired = 1;
        return 1;
    }
    return 0;
}

void *__wrap_malloc(size_t n)
{
    if (inject(n))
        return NULL;
    void *p = __real_malloc(n);
    if (p)
        track(p);
    return p;
}

void *__wrap_calloc(size_t n, size_t size)
{
    if (inject(n * size))
        return NULL;
    void *p = __real_calloc(n, size);
    if (p)
        track(p);
    return p;
}

void *__wrap_realloc(void *p, size_t n)
{
    if (inject(n))
        return NULL;
    if (p)
        untrack(p);
    void *q = __real_realloc(p, n);
    if (q)
        track(q);
    else if (p)
        track(p);
    return q;
}

void __wrap_free(void *p)
{
    if (p)
        untrack(p);
    __real_free(p);
}

static void arm(long n)
{
    g_countdown = n;
    g_fired = 0;
    g_largest = 0;
    g_allocs = 0;
}

/* ---------------------------------------------------------------------------------------- */
/* helpers                                                                                  */

static struct mmrt_image *decode_ok(const uint8_t *b, size_t n, const char *what,
                                    const struct mmrt_image_limits *lim)
{
    struct mmrt_image *img = NULL;
    struct mmrt_error err = {0};
    mmrt_status st = mmrt_image_decode(b, n, what, lim, &img, &err);
    if (st != MMRT_OK)
        fail_msg("%s: %s", mmrt_status_name(st), err.msg);
    assert_non_null(img);
    return img;
}

static struct mmrt_image *decode_fixture(const char *name, const struct mmrt_image_limits *lim)
{
    size_t n;
    uint8_t *b = fx_read(name, &n);
    struct mmrt_image *img = decode_ok(b, n, name, lim);
    free(b);
    return img;
}

/* The default limits with EXIF orientation applied (the default ignores it, as
 * transformers does). */
static const struct mmrt_image_limits *exif_on(void)
{
    static struct mmrt_image_limits lim;
    mmrt_image_limits_default(&lim);
    lim.apply_exif_orientation = true;
    return &lim;
}

/* Decodes expecting `want`; checks the message is one non-empty line and *out untouched. */
static void decode_fails(const uint8_t *b, size_t n, const struct mmrt_image_limits *lim,
                         mmrt_status want, const char *needle)
{
    struct mmrt_image *sentinel = (struct mmrt_image *)&g_live, *img = sentinel;
    struct mmrt_error err = {0};
    mmrt_status st = mmrt_image_decode(b, n, "test", lim, &img, &err);
    if (st != want)
        fail_msg("got %s (%s), want %s", mmrt_status_name(st), err.msg, mmrt_status_name(want));
    assert_ptr_equal(img, sentinel);
    assert_true(err.msg[0] != '\0');
    assert_null(strchr(err.msg, '\n'));
    if (needle && !strstr(err.msg, needle))
        fail_msg("message \"%s\" lacks \"%s\"", err.msg, needle);
}

static int max_diff(const uint8_t *a, const uint8_t *b, size_t n)
{
    int m = 0;
    for (size_t i = 0; i < n; i++) {
        int d = abs((int)a[i] - (int)b[i]);
        if (d > m)
            m = d;
    }
    return m;
}

/* ---------------------------------------------------------------------------------------- */
/* decoding every fixture                                                                   */

static void test_fixtures_match_pil(void **state)
{
    (void)state;
    json_t *m = fx_manifest();
    const json_t *list = json_object_get(m, "decode");
    assert_true(json_array_size(list) > 30);
    int worst_jpeg = 0;
    for (size_t i = 0; i < json_array_size(list); i++) {
        const json_t *e = json_array_get(list, i);
        const char *file = fx_str(e, "file");
        struct mmrt_image *img = decode_fixture(file, exif_on());
        size_t n;
        uint8_t *want = fx_read(fx_str(e, "rgb"), &n);
        assert_int_equal(img->width, fx_int(e, "width"));
        assert_int_equal(img->height, fx_int(e, "height"));
        assert_int_equal(n, (size_t)img->width * img->height * 3);
        int d = max_diff(img->pixels, want, n);
        if (json_is_true(json_object_get(e, "exact"))) {
            if (d != 0)
                fail_msg("%s differs from PIL by up to %d", file, d);
        } else {
            if (d > worst_jpeg)
                worst_jpeg = d;
            if (d > JPEG_TOLERANCE)
                fail_msg("%s differs from PIL by %d (> %d)", file, d, JPEG_TOLERANCE);
        }
        free(want);
        mmrt_image_destroy(img);
    }
    print_message("JPEG fixtures: largest difference from PIL %d (system libjpeg-turbo vs "
                  "Pillow %s)\n", worst_jpeg,
                  json_string_value(json_object_get(json_object_get(m, "versions"),
                                                    "pillow_libjpeg_turbo")));
    json_decref(m);
}

/* every (colour, alpha) pair composited onto white exactly as PIL.Image.alpha_composite */
static void test_alpha_composite_table(void **state)
{
    (void)state;
    struct mmrt_image *got = decode_fixture("alpha_table.png", NULL);
    struct mmrt_image *want = decode_fixture("alpha_table_expected.png", NULL);
    assert_int_equal(got->width, 256);
    assert_int_equal(got->height, 256);
    assert_memory_equal(got->pixels, want->pixels, 256 * 256 * 3);
    /* fully transparent is white, opaque is the colour itself */
    assert_int_equal(got->pixels[0], 255);
    assert_int_equal(got->pixels[(255 * 256 + 10) * 3], 10);
    mmrt_image_destroy(got);

    struct mmrt_image_limits lim;
    mmrt_image_limits_default(&lim);
    lim.alpha = MMRT_IMAGE_ALPHA_DROP; /* transformers 4.x: convert("RGB") ignores alpha */
    got = decode_fixture("alpha_table.png", &lim);
    for (uint32_t a = 0; a < 256; a++)
        for (uint32_t c = 0; c < 256; c++) {
            const uint8_t *p = got->pixels + (a * 256 + c) * 3;
            assert_int_equal(p[0], c);
            assert_int_equal(p[1], 255 - c);
            assert_int_equal(p[2], (c * 7) % 256);
        }
    mmrt_image_destroy(got);
    mmrt_image_destroy(want);
}

/* ---------------------------------------------------------------------------------------- */
/* EXIF orientation                                                                         */

/* Independent statement of the 8 orientations: where raw pixel (x, y) of a W × H image
 * lands in the displayed image (EXIF 2.3, Orientation tag). */
static void landing(int o, uint32_t W, uint32_t H, uint32_t x, uint32_t y, uint32_t *dx,
                    uint32_t *dy)
{
    switch (o) {
    case 1: *dx = x; *dy = y; break;                  /* as stored */
    case 2: *dx = W - 1 - x; *dy = y; break;          /* mirrored */
    case 3: *dx = W - 1 - x; *dy = H - 1 - y; break;  /* upside down */
    case 4: *dx = x; *dy = H - 1 - y; break;          /* mirrored upside down */
    case 5: *dx = y; *dy = x; break;                  /* transposed */
    case 6: *dx = H - 1 - y; *dy = x; break;          /* stored turned left: turn right */
    case 7: *dx = H - 1 - y; *dy = W - 1 - x; break;  /* transverse */
    default: *dx = y; *dy = W - 1 - x; break;         /* 8: stored turned right: turn left */
    }
}

static void check_layout(const struct mmrt_image *raw, const struct mmrt_image *shown, int o)
{
    const bool swap = o >= 5;
    assert_int_equal(shown->width, swap ? raw->height : raw->width);
    assert_int_equal(shown->height, swap ? raw->width : raw->height);
    for (uint32_t y = 0; y < raw->height; y++)
        for (uint32_t x = 0; x < raw->width; x++) {
            uint32_t dx, dy;
            landing(o, raw->width, raw->height, x, y, &dx, &dy);
            assert_memory_equal(shown->pixels + ((size_t)dy * shown->width + dx) * 3,
                                raw->pixels + ((size_t)y * raw->width + x) * 3, 3);
        }
}

/* The fixture has a red block in the stored top-left corner: where must it appear? */
static void check_red_corner(const struct mmrt_image *img, int o)
{
    static const char corner[9][3] = {"", "TL", "TR", "BR", "BL", "TL", "TR", "BR", "BL"};
    uint32_t x = corner[o][1] == 'L' ? 1 : img->width - 2;
    uint32_t y = corner[o][0] == 'T' ? 1 : img->height - 2;
    const uint8_t *p = img->pixels + ((size_t)y * img->width + x) * 3;
    if (!(p[0] > 200 && p[1] < 60 && p[2] < 60))
        fail_msg("orientation %d: red corner not at %s (%d,%d,%d)", o, corner[o], p[0], p[1],
                 p[2]);
}

static void test_exif_orientation(void **state)
{
    (void)state;
    struct mmrt_image_limits off;
    mmrt_image_limits_default(&off);
    off.apply_exif_orientation = false;
    struct mmrt_image *raw = decode_fixture("orient1_24x16.jpg", &off);
    char name[64];
    for (int o = 1; o <= 8; o++) {
        snprintf(name, sizeof name, "orient%d_24x16.jpg", o);
        struct mmrt_image *stored = decode_fixture(name, &off);
        /* the tag does not change the stored pixels */
        assert_memory_equal(stored->pixels, raw->pixels, (size_t)raw->width * raw->height * 3);
        struct mmrt_image *shown = decode_fixture(name, exif_on());
        check_layout(raw, shown, o);
        check_red_corner(shown, o);
        mmrt_image_destroy(stored);
        mmrt_image_destroy(shown);
    }
    /* big-endian TIFF in the APP1 segment, and PNG eXIf before and after IDAT */
    struct mmrt_image *shown = decode_fixture("orient6mm_24x16.jpg", exif_on());
    check_layout(raw, shown, 6);
    mmrt_image_destroy(shown);
    mmrt_image_destroy(raw);
    raw = decode_fixture("orient8_24x16.png", &off);
    shown = decode_fixture("orient8_24x16.png", exif_on());
    check_layout(raw, shown, 8);
    check_red_corner(shown, 8);
    mmrt_image_destroy(shown);
    shown = decode_fixture("orient5late_24x16.png", exif_on());
    check_layout(raw, shown, 5);
    mmrt_image_destroy(shown);
    mmrt_image_destroy(raw);
}

/* The default is what transformers sees: the tag is ignored, the stored pixels come back. */
static void test_exif_ignored_by_default(void **state)
{
    (void)state;
    struct mmrt_image_limits def;
    mmrt_image_limits_default(&def);
    assert_false(def.apply_exif_orientation);
    struct mmrt_image *raw = decode_fixture("orient1_24x16.jpg", NULL);
    for (int o = 2; o <= 8; o++) {
        char name[64];
        snprintf(name, sizeof name, "orient%d_24x16.jpg", o);
        struct mmrt_image *img = decode_fixture(name, NULL);
        assert_int_equal(img->width, raw->width);
        assert_memory_equal(img->pixels, raw->pixels, (size_t)raw->width * raw->height * 3);
        mmrt_image_destroy(img);
    }
    mmrt_image_destroy(raw);
}

/* JPEGs written here with one APP1 segment: every orientation in both byte orders is applied
 * (and ignored by default); a damaged EXIF block or APP1 segment never fails the decode and
 * never rotates, wherever the damage is. */
static void test_exif_jpeg_made_here(void **state)
{
    (void)state;
    enum { W = 24, H = 16 };
    uint8_t rgb[W * H * 3];
    for (int y = 0; y < H; y++)
        for (int x = 0; x < W; x++) {
            uint8_t *p = rgb + (y * W + x) * 3;
            p[0] = (uint8_t)(x * 10);
            p[1] = (uint8_t)(y * 15);
            p[2] = (uint8_t)(x < 4 && y < 4 ? 255 : 0);
        }
    size_t n;
    uint8_t *plain = fx_make_jpeg(W, H, rgb, NULL, 0, &n);
    struct mmrt_image *raw = decode_ok(plain, n, "plain", NULL);
    free(plain);
    uint8_t app1[40];
    for (int be = 0; be < 2; be++)
        for (int o = 1; o <= 8; o++) {
            size_t an = fx_exif_orientation(o, be, app1);
            uint8_t *j = fx_make_jpeg(W, H, rgb, app1, an, &n);
            struct mmrt_image *stored = decode_ok(j, n, "tagged", NULL);
            assert_memory_equal(stored->pixels, raw->pixels, sizeof rgb);
            struct mmrt_image *shown = decode_ok(j, n, "tagged", exif_on());
            check_layout(raw, shown, o);
            mmrt_image_destroy(stored);
            mmrt_image_destroy(shown);
            free(j);
        }
    /* Damage: (offset in the APP1 payload, value); the payload is "Exif\0\0" + TIFF. */
    static const struct {
        size_t at;
        uint8_t v;
    } bad[] = {
        {0, 'e'},   /* not "Exif" */
        {5, 1},     /* "Exif\0\1" */
        {7, 'M'},   /* "IM": no byte order */
        {8, 43},    /* not 42 */
        {10, 0xf0}, /* IFD0 offset past the block */
        {10, 0xff}, /* … far past it (0xffff0008 in 32 bits) */
        {13, 0xff},
        {14, 0},    /* no entries */
        {18, 7},    /* type UNDEFINED */
        {20, 3},    /* three SHORTs: not inline */
        {24, 9},    /* orientation 9 */
        {24, 0},    /* orientation 0 */
        {25, 1},    /* orientation 0x0106 */
    };
    for (size_t c = 0; c < sizeof bad / sizeof bad[0]; c++) {
        size_t an = fx_exif_orientation(6, false, app1);
        app1[bad[c].at] = bad[c].v;
        uint8_t *j = fx_make_jpeg(W, H, rgb, app1, an, &n);
        struct mmrt_image *img = decode_ok(j, n, "damaged", exif_on());
        if (img->width != W || memcmp(img->pixels, raw->pixels, sizeof rgb) != 0)
            fail_msg("EXIF damage %zu (byte %zu = %u) rotated the image", c, bad[c].at,
                     bad[c].v);
        mmrt_image_destroy(img);
        free(j);
    }
    /* Cut short: every length of the payload, down to an empty APP1. */
    for (size_t cut = 0; cut < 26; cut++) {
        fx_exif_orientation(6, cut % 2, app1);
        uint8_t *j = fx_make_jpeg(W, H, rgb, app1, cut, &n);
        struct mmrt_image *img = decode_ok(j, n, "cut", exif_on());
        assert_int_equal(img->width, W);
        mmrt_image_destroy(img);
        free(j);
    }
    /* The APP1 segment's own length claims more than the file has (the walk stops; libjpeg
     * then refuses the file, by name, without a crash), or less than its header. */
    size_t an = fx_exif_orientation(6, false, app1);
    uint8_t *j = fx_make_jpeg(W, H, rgb, app1, an, &n);
    size_t seg = 0;
    for (size_t i = 2; i + 3 < n; i++)
        if (j[i] == 0xFF && j[i + 1] == 0xE1) {
            seg = i;
            break;
        }
    assert_true(seg > 0);
    const uint8_t lens[][2] = {{0xff, 0xff}, {0, 0}, {0, 1}, {0, 7}};
    for (size_t k = 0; k < sizeof lens / sizeof lens[0]; k++) {
        uint8_t *d = malloc(n);
        assert_non_null(d);
        memcpy(d, j, n);
        d[seg + 2] = lens[k][0];
        d[seg + 3] = lens[k][1];
        struct mmrt_image *img = NULL;
        struct mmrt_error err = {0};
        mmrt_status st = mmrt_image_decode(d, n, "seglen", exif_on(), &img, &err);
        if (st == MMRT_OK) {
            assert_int_equal(img->width, W); /* never rotated by a broken segment */
            mmrt_image_destroy(img);
        } else {
            assert_int_equal(st, MMRT_ERR_FORMAT);
            assert_null(img);
        }
        free(d);
    }
    /* Two APP1 Exif segments: the first one counts (as PIL). */
    uint8_t two[64];
    size_t a1 = fx_exif_orientation(1, false, two);
    uint8_t *j2 = NULL;
    {
        /* a file whose first APP1 says 1 and a second one (spliced in after it) says 6 */
        uint8_t *f1 = fx_make_jpeg(W, H, rgb, two, a1, &n);
        size_t s1 = 0;
        for (size_t i = 2; i + 3 < n; i++)
            if (f1[i] == 0xFF && f1[i + 1] == 0xE1) {
                s1 = i;
                break;
            }
        const size_t seg_n = 2 + ((size_t)f1[s1 + 2] << 8 | f1[s1 + 3]);
        j2 = malloc(n + seg_n);
        assert_non_null(j2);
        memcpy(j2, f1, s1 + seg_n);
        memcpy(j2 + s1 + seg_n, j + seg, seg_n); /* the orientation-6 segment */
        memcpy(j2 + s1 + 2 * seg_n, f1 + s1 + seg_n, n - s1 - seg_n);
        struct mmrt_image *img = decode_ok(j2, n + seg_n, "two", exif_on());
        assert_int_equal(img->width, W);
        mmrt_image_destroy(img);
        free(f1);
    }
    free(j2);
    free(j);
    mmrt_image_destroy(raw);
}

/* Malformed EXIF never fails a decode and never rotates. */
static void test_exif_malformed(void **state)
{
    (void)state;
    uint8_t rgb[4 * 3 * 3];
    for (size_t i = 0; i < sizeof rgb; i++)
        rgb[i] = (uint8_t)(i * 17);
    /* a valid little-endian IFD0 with Orientation = 6 … */
    static const uint8_t good[] = {'I', 'I', 42, 0, 8, 0, 0, 0, 1, 0, 0x12, 0x01, 3, 0, 1, 0,
                                   0, 0, 6, 0, 0, 0, 0, 0, 0, 0};
    uint8_t bad[sizeof good];
    /* … damaged one byte (or cut) at a time; `rotated` is what PIL's exif_transpose does */
    struct {
        size_t at;
        uint8_t v;
        size_t n; /* truncate to this length (0 = keep) */
        bool rotated;
    } cases[] = {
        {18, 9, 0, false},   /* value 9 */
        {18, 0, 0, false},   /* value 0 */
        {12, 7, 0, false},   /* type UNDEFINED */
        {14, 3, 0, false},   /* 3 SHORTs: no longer inline */
        {4, 200, 0, false},  /* IFD offset past the end */
        {2, 43, 0, false},   /* not 42 */
        {0, 'X', 0, false},  /* no byte order */
        {0, 'I', 20, false}, /* entry cut short */
        {0, 'I', 9, false},  /* count cut short */
        {0, 'I', 4, false},  /* header cut short */
        {14, 2, 0, true},    /* 2 SHORTs inline: PIL takes the first */
        {8, 0xff, 0, true},  /* 255 entries declared, the one present is complete */
        {0, 'I', 22, true},  /* next-IFD pointer missing */
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        memcpy(bad, good, sizeof good);
        bad[cases[c].at] = cases[c].v;
        size_t n = cases[c].n ? cases[c].n : sizeof good;
        size_t len;
        uint8_t *png = fx_make_png(4, 3, 3, rgb, bad, n, &len);
        struct mmrt_image *img = decode_ok(png, len, "exif", exif_on());
        if (img->width != (cases[c].rotated ? 3u : 4u))
            fail_msg("EXIF case %zu: width %u", c, img->width);
        if (!cases[c].rotated)
            assert_memory_equal(img->pixels, rgb, sizeof rgb);
        mmrt_image_destroy(img);
        free(png);
    }
    size_t len;
    uint8_t *png = fx_make_png(4, 3, 3, rgb, good, sizeof good, &len);
    struct mmrt_image *img = decode_ok(png, len, "exif", exif_on());
    assert_int_equal(img->width, 3); /* the control: rotated */
    mmrt_image_destroy(img);
    free(png);
}

/* ---------------------------------------------------------------------------------------- */
/* refusals                                                                                 */

static void test_unsupported_and_empty(void **state)
{
    (void)state;
#define S(lit) {lit, sizeof lit - 1}
    static const struct {
        const char *s;
        size_t n;
    } others[] = {S("GIF89a\x01\x00\x01\x00"), S("BM\x3a\0\0\0\0\0"),
                  S("RIFF\x10\0\0\0WEBPVP8 "), S("hello world"), S("\x89PNX\r\n\x1a\n"),
                  S("\xff\xd8\x00\x00"), S("\0")};
#undef S
    for (size_t i = 0; i < sizeof others / sizeof others[0]; i++)
        decode_fails((const uint8_t *)others[i].s, others[i].n, NULL, MMRT_ERR_UNSUPPORTED,
                     "unsupported image format (expected PNG or JPEG)");
    decode_fails((const uint8_t *)"", 0, NULL, MMRT_ERR_FORMAT, "empty");
    decode_fails(NULL, 0, NULL, MMRT_ERR_FORMAT, "empty");
    decode_fails((const uint8_t *)"\x89PN", 3, NULL, MMRT_ERR_FORMAT, "truncated");
    decode_fails((const uint8_t *)"\xff\xd8", 2, NULL, MMRT_ERR_FORMAT, "truncated");
    struct mmrt_error err = {0};
    assert_int_equal(mmrt_image_decode((const uint8_t *)"x", 1, NULL, NULL, NULL, &err),
                     MMRT_ERR_INVALID_ARG);
    mmrt_image_destroy(NULL);
}

/* I2: a 16000×16000 PNG header with a tiny IDAT is refused at the header: no allocation
 * anywhere near the 768 MB it would need (spng's allocations included), in well under a
 * second. */
static void test_pixel_limit_before_allocation(void **state)
{
    (void)state;
    size_t len;
    uint8_t *png = fx_make_png(16000, 16000, 1, NULL, NULL, 0, &len);
    assert_true(len < 200);
    clock_t t0 = clock();
    arm(0);
    decode_fails(png, len, NULL, MMRT_ERR_LIMIT, "max_pixels");
    size_t largest = g_largest;
    double secs = (double)(clock() - t0) / CLOCKS_PER_SEC;
    print_message("16000x16000 PNG refused in %.3f ms; largest allocation %zu bytes in %ld "
                  "calls\n", secs * 1e3, largest, g_allocs);
    assert_true(largest < (1u << 20));
    assert_true(secs < 1.0);
    decode_fails(png, len, NULL, MMRT_ERR_LIMIT, "16000x16000");
    free(png);

    /* max_side (refused inside spng's IHDR check), aspect ratio, zero size */
    png = fx_make_png(40000, 2, 1, NULL, NULL, 0, &len);
    decode_fails(png, len, NULL, MMRT_ERR_LIMIT, "max_side");
    free(png);
    png = fx_make_png(20000, 1, 1, NULL, NULL, 0, &len);
    decode_fails(png, len, NULL, MMRT_ERR_LIMIT, "max_aspect");
    free(png);
    png = fx_make_png(0, 5, 1, NULL, NULL, 0, &len);
    decode_fails(png, len, NULL, MMRT_ERR_FORMAT, NULL);
    free(png);

    /* the same for JPEG: patch the SOF of a fixture to 16000×16000 */
    uint8_t *jpg = fx_read("rgb_50x90.jpg", &len);
    size_t sof = 0;
    for (size_t i = 2; i + 9 < len; i++)
        if (jpg[i] == 0xFF && jpg[i + 1] == 0xC0) {
            sof = i;
            break;
        }
    assert_true(sof > 0);
    jpg[sof + 5] = jpg[sof + 7] = 0x3E; /* height, width = 0x3E80 = 16000 */
    jpg[sof + 6] = jpg[sof + 8] = 0x80;
    arm(0);
    decode_fails(jpg, len, NULL, MMRT_ERR_LIMIT, "16000x16000");
    assert_true(g_largest < (1u << 20));
    jpg[sof + 5] = jpg[sof + 6] = 0; /* height 0 */
    decode_fails(jpg, len, NULL, MMRT_ERR_FORMAT, NULL);
    free(jpg);

    /* lowered limits on ordinary files */
    struct mmrt_image_limits lim;
    mmrt_image_limits_default(&lim);
    lim.max_pixels = 80 * 60 - 1;
    uint8_t *b = fx_read("rgb_80x60.png", &len);
    decode_fails(b, len, &lim, MMRT_ERR_LIMIT, "max_pixels");
    lim.max_pixels = 80 * 60;
    mmrt_image_destroy(decode_ok(b, len, "x", &lim));
    lim.max_side = 79;
    decode_fails(b, len, &lim, MMRT_ERR_LIMIT, "max_side");
    mmrt_image_limits_default(&lim);
    lim.max_input_bytes = len - 1;
    decode_fails(b, len, &lim, MMRT_ERR_LIMIT, "max_input_bytes");
    free(b);
    b = fx_read("rgb_50x90.jpg", &len);
    mmrt_image_limits_default(&lim);
    lim.max_aspect = 1;
    decode_fails(b, len, &lim, MMRT_ERR_LIMIT, "max_aspect");
    free(b);
}

/* I4: progressive scans are counted and capped. */
static void test_jpeg_scan_cap(void **state)
{
    (void)state;
    size_t len;
    uint8_t *b = fx_read("prog_45x35.jpg", &len);
    struct mmrt_image_limits lim;
    mmrt_image_limits_default(&lim);
    lim.max_jpeg_scans = 3;
    decode_fails(b, len, &lim, MMRT_ERR_LIMIT, "max_jpeg_scans");
    lim.max_jpeg_scans = 100;
    mmrt_image_destroy(decode_ok(b, len, "prog", &lim));
    free(b);
}

/* A JPEG written here with libjpeg, `ncomp` components in `cs`. */
static uint8_t *make_jpeg(int ncomp, J_COLOR_SPACE in_cs, J_COLOR_SPACE cs, unsigned long *len)
{
    struct jpeg_compress_struct c;
    struct jpeg_error_mgr e;
    c.err = jpeg_std_error(&e);
    jpeg_create_compress(&c);
    unsigned char *out = NULL;
    jpeg_mem_dest(&c, &out, len);
    c.image_width = 16;
    c.image_height = 8;
    c.input_components = ncomp;
    c.in_color_space = in_cs;
    jpeg_set_defaults(&c);
    jpeg_set_colorspace(&c, cs);
    for (int i = 0; i < c.num_components; i++) /* no subsampling: compare colour paths only */
        c.comp_info[i].h_samp_factor = c.comp_info[i].v_samp_factor = 1;
    jpeg_set_quality(&c, 98, TRUE);
    jpeg_start_compress(&c, TRUE);
    uint8_t row[16 * 4];
    while (c.next_scanline < c.image_height) {
        for (int i = 0; i < 16 * ncomp; i++)
            row[i] = (uint8_t)(i * 13 + c.next_scanline * 29);
        JSAMPROW r = row;
        jpeg_write_scanlines(&c, &r, 1);
    }
    jpeg_finish_compress(&c);
    jpeg_destroy_compress(&c);
    return out; /* allocated by libjpeg with its own malloc: release with __real_free */
}

static void test_jpeg_color_spaces(void **state)
{
    (void)state;
    unsigned long n1, n2, n3;
    uint8_t *cmyk = make_jpeg(4, JCS_CMYK, JCS_CMYK, &n1);
    uint8_t *ycck = make_jpeg(4, JCS_CMYK, JCS_YCCK, &n2);
    struct mmrt_image *a = decode_ok(cmyk, n1, "cmyk", NULL);
    struct mmrt_image *b = decode_ok(ycck, n2, "ycck", NULL);
    int d = max_diff(a->pixels, b->pixels, 16 * 8 * 3);
    print_message("YCCK vs CMYK encoding of the same data: max difference %d\n", d);
    assert_true(d <= 8); /* the YCC transform is lossy, the conversion path is shared */
    mmrt_image_destroy(a);
    mmrt_image_destroy(b);
    uint8_t *two = make_jpeg(2, JCS_UNKNOWN, JCS_UNKNOWN, &n3);
    decode_fails(two, n3, NULL, MMRT_ERR_UNSUPPORTED, "2 components");
    __real_free(cmyk);
    __real_free(ycck);
    __real_free(two);
}

/* ---------------------------------------------------------------------------------------- */
/* hostile input: truncation and byte flips                                                 */

static const char *const k_hostile[] = {
    "rgb_80x60.png", "rgba_33x33.png", "pal_trns_24x20.png", "rgb16_20x12.png",
    "gray16_trns_9x7.png", "adam7_gray2_13x11.png", "adam7_pal1_trns_10x9.png",
    "adam7_rgba16_5x3.png", "orient8_24x16.png", "orient5late_24x16.png", "rgb_50x90.jpg",
    "prog_45x35.jpg", "cmyk_20x16.jpg", "gray_31x23.jpg", "orient6_24x16.jpg",
    "orient6mm_24x16.jpg",
};

/* End of the last IDAT chunk's data: a PNG cut before it cannot have all its rows (the
 * chunk's CRC and what follows are not needed for the pixels; zlib's Adler-32 is). */
static size_t png_idat_end(const uint8_t *b, size_t n)
{
    size_t pos = 8, end = 0;
    while (pos + 12 <= n) {
        size_t len = (size_t)b[pos] << 24 | (size_t)b[pos + 1] << 16 | (size_t)b[pos + 2] << 8 |
                     b[pos + 3];
        if (!memcmp(b + pos + 4, "IDAT", 4))
            end = pos + 8 + len;
        pos += 12 + len;
    }
    return end;
}

static void test_truncation(void **state)
{
    (void)state;
    struct mmrt_image_limits lim = *exif_on();
    for (size_t f = 0; f < sizeof k_hostile / sizeof k_hostile[0]; f++) {
        size_t n;
        uint8_t *b = fx_read(k_hostile[f], &n);
        const bool png = b[0] == 0x89;
        const size_t must_fail_below = png ? png_idat_end(b, n) : n;
        struct mmrt_image *full = decode_ok(b, n, k_hostile[f], &lim);
        struct mmrt_image_limits raw_lim = lim;
        raw_lim.apply_exif_orientation = false;
        struct mmrt_image *raw = decode_ok(b, n, k_hostile[f], &raw_lim);
        size_t step = n > 3000 ? n / 1500 : 1, n_ok = 0;
        for (size_t cut = 0; cut < n; cut += (cut + 64 >= n ? 1 : step)) {
            uint8_t *c = malloc(cut ? cut : 1); /* exact size: ASan sees any over-read */
            memcpy(c, b, cut);
            struct mmrt_image *img = NULL;
            struct mmrt_error err = {0};
            mmrt_status st = mmrt_image_decode(c, cut, "cut", &lim, &img, &err);
            if (st == MMRT_OK) {
                if (cut < must_fail_below)
                    fail_msg("%s cut at %zu/%zu decoded", k_hostile[f], cut, n);
                /* only trailing chunks were lost: the pixels are complete (not rotated
                 * when the lost part held a late eXIf) */
                const struct mmrt_image *want = img->width == full->width ? full : raw;
                assert_int_equal(img->width, want->width);
                assert_memory_equal(img->pixels, want->pixels,
                                    (size_t)img->width * img->height * 3);
                n_ok++;
                mmrt_image_destroy(img);
            } else {
                if (st != MMRT_ERR_FORMAT)
                    fail_msg("%s cut at %zu: %s %s", k_hostile[f], cut, mmrt_status_name(st),
                             err.msg);
                assert_null(img);
                assert_true(err.msg[0] && !strchr(err.msg, '\n'));
            }
            free(c);
        }
        /* JPEG must reach EOI; a PNG missing only trailing chunks (IEND) still decodes */
        if (png ? n_ok == 0 : n_ok != 0)
            fail_msg("%s: %zu truncated copies decoded", k_hostile[f], n_ok);
        mmrt_image_destroy(full);
        mmrt_image_destroy(raw);
        free(b);
    }
}

static uint64_t g_rng = 0x9e3779b97f4a7c15ull;

static uint32_t rnd(void)
{
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (uint32_t)(g_rng >> 16);
}

static void test_byte_flips(void **state)
{
    (void)state;
    struct mmrt_image_limits lim;
    mmrt_image_limits_default(&lim);
    lim.max_pixels = 1u << 22; /* flipped headers must not make the test slow */
    long counts[4] = {0};
    for (size_t f = 0; f < sizeof k_hostile / sizeof k_hostile[0]; f++) {
        size_t n;
        uint8_t *b = fx_read(k_hostile[f], &n);
        for (int trial = 0; trial < 400; trial++) {
            uint8_t *c = malloc(n);
            memcpy(c, b, n);
            int flips = 1 + (int)(rnd() % 4);
            for (int k = 0; k < flips; k++) {
                /* half of the flips land in the first 64 bytes: headers and markers */
                size_t at = (trial & 1) ? rnd() % (n < 64 ? n : 64) : rnd() % n;
                c[at] ^= (uint8_t)(1u << (rnd() % 8));
            }
            struct mmrt_image *img = NULL;
            struct mmrt_error err = {0};
            mmrt_status st = mmrt_image_decode(c, n, "flip", &lim, &img, &err);
            if (st == MMRT_OK) {
                assert_non_null(img);
                assert_true((uint64_t)img->width * img->height <= lim.max_pixels);
                counts[0]++;
                mmrt_image_destroy(img);
            } else {
                assert_null(img);
                assert_true(err.msg[0] && !strchr(err.msg, '\n'));
                if (st == MMRT_ERR_FORMAT)
                    counts[1]++;
                else if (st == MMRT_ERR_UNSUPPORTED)
                    counts[2]++;
                else if (st == MMRT_ERR_LIMIT)
                    counts[3]++;
                else
                    fail_msg("%s: unexpected %s: %s", k_hostile[f], mmrt_status_name(st),
                             err.msg);
            }
            free(c);
        }
        free(b);
    }
    print_message("byte flips: %ld decoded, %ld format errors, %ld unsupported, %ld limits\n",
                  counts[0], counts[1], counts[2], counts[3]);
    assert_true(counts[1] > 0);
}

/* ---------------------------------------------------------------------------------------- */
/* memory: allocation failures, budgets                                                     */

static void test_allocation_failure_sweep(void **state)
{
    (void)state;
    static const char *const files[] = {"rgb_80x60.png", "pal_trns_24x20.png",
                                        "adam7_gray2_13x11.png", "orient8_24x16.png",
                                        "orient5late_24x16.png", "rgb_50x90.jpg",
                                        "cmyk_20x16.jpg", "prog_45x35.jpg",
                                        "orient6_24x16.jpg"};
    for (size_t f = 0; f < sizeof files / sizeof files[0]; f++) {
        size_t n;
        uint8_t *b = fx_read(files[f], &n);
        struct mmrt_image *ref = decode_ok(b, n, files[f], exif_on());
        long live0 = g_live, k;
        for (k = 1; k < 1000; k++) {
            struct mmrt_image *img = NULL;
            struct mmrt_error err = {0};
            arm(k);
            mmrt_status st = mmrt_image_decode(b, n, files[f], exif_on(), &img, &err);
            int fired = g_fired;
            arm(0);
            if (!fired) {
                assert_int_equal(st, MMRT_OK);
                assert_memory_equal(img->pixels, ref->pixels,
                                    (size_t)ref->width * ref->height * 3);
                mmrt_image_destroy(img);
                break;
            }
            if (st != MMRT_ERR_NO_MEMORY)
                fail_msg("%s, allocation %ld failed: %s %s", files[f], k,
                         mmrt_status_name(st), err.msg);
            assert_null(img);
            assert_int_equal(g_live, live0); /* nothing leaked */
        }
        assert_true(k > 1 && k < 1000);
        print_message("%s: %ld allocations, each failure handled\n", files[f], k - 1);
        mmrt_image_destroy(ref);
        free(b);
    }
}

static void test_budget(void **state)
{
    (void)state;
    size_t n;
    uint8_t *b = fx_read("alpha_table.png", &n);
    const size_t px = 256 * 256 * 3; /* what a decoded image keeps charged */
    struct mmrt_image_budget global, request;
    mmrt_image_budget_init(&global, 0, NULL);
    mmrt_image_budget_init(&request, 0, &global);
    struct mmrt_image_limits lim;
    mmrt_image_limits_default(&lim);
    lim.budget = &request;
    struct mmrt_image *a = decode_ok(b, n, "a", &lim);
    /* the decoded image stays charged, to the request and to its parent */
    assert_int_equal(mmrt_image_budget_in_use(&request), px);
    assert_int_equal(mmrt_image_budget_in_use(&global), px);
    mmrt_image_destroy(a);
    assert_int_equal(mmrt_image_budget_in_use(&global), 0);
    assert_int_equal(mmrt_image_budget_in_use(&request), 0);
    /* room for one image and its decode working memory, not for a second decode */
    mmrt_image_budget_init(&global, 2 * px, NULL);
    mmrt_image_budget_init(&request, 0, &global);
    a = decode_ok(b, n, "a", &lim);
    decode_fails(b, n, &lim, MMRT_ERR_LIMIT, "budget");
    assert_int_equal(mmrt_image_budget_in_use(&global), px);
    mmrt_image_destroy(a);
    a = decode_ok(b, n, "a", &lim); /* released: fits again */
    mmrt_image_destroy(a);
    /* a request cap below the image refuses it before decoding; the parent is untouched */
    mmrt_image_budget_init(&request, 1000, &global);
    decode_fails(b, n, &lim, MMRT_ERR_LIMIT, "budget");
    assert_int_equal(mmrt_image_budget_in_use(&global), 0);
    assert_int_equal(mmrt_image_budget_in_use(&request), 0);
    free(b);
    /* progressive JPEG coefficient buffers and EXIF copies are charged, then released */
    static const char *const files[] = {"prog_45x35.jpg", "orient6_24x16.jpg"};
    for (int i = 0; i < 2; i++) {
        b = fx_read(files[i], &n);
        mmrt_image_budget_init(&global, 0, NULL);
        lim.budget = &global;
        a = decode_ok(b, n, files[i], &lim);
        assert_int_equal(mmrt_image_budget_in_use(&global), (size_t)a->width * a->height * 3);
        mmrt_image_destroy(a);
        assert_int_equal(mmrt_image_budget_in_use(&global), 0);
        free(b);
    }
}

static void test_load_file_and_create(void **state)
{
    (void)state;
    struct mmrt_image *img = NULL;
    struct mmrt_error err = {0};
    assert_int_equal(mmrt_image_load_file(fx_path("no_such.png"), NULL, &img, &err),
                     MMRT_ERR_IO);
    assert_non_null(strstr(err.msg, "no_such.png"));
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", fx_path(""));
    assert_int_equal(mmrt_image_load_file(dir, NULL, &img, &err), MMRT_ERR_IO);
    assert_null(img);
    assert_int_equal(mmrt_image_load_file(fx_path("gray_40x30.png"), NULL, &img, &err),
                     MMRT_OK);
    assert_int_equal(img->width, 40);
    mmrt_image_destroy(img);
    struct mmrt_image_limits lim;
    mmrt_image_limits_default(&lim);
    lim.max_input_bytes = 10;
    img = NULL;
    assert_int_equal(mmrt_image_load_file(fx_path("gray_40x30.png"), &lim, &img, &err),
                     MMRT_ERR_LIMIT);
    assert_null(img);
    assert_int_equal(mmrt_image_create(0, 5, &img, &err), MMRT_ERR_INVALID_ARG);
    assert_int_equal(mmrt_image_create(MMRT_IMAGE_MAX_CREATE_SIDE + 1, 1, &img, &err),
                     MMRT_ERR_INVALID_ARG);
    assert_int_equal(mmrt_image_create(3, 2, &img, &err), MMRT_OK);
    for (int i = 0; i < 18; i++)
        assert_int_equal(img->pixels[i], 0);
    mmrt_image_destroy(img);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fixtures_match_pil),
        cmocka_unit_test(test_alpha_composite_table),
        cmocka_unit_test(test_exif_orientation),
        cmocka_unit_test(test_exif_ignored_by_default),
        cmocka_unit_test(test_exif_jpeg_made_here),
        cmocka_unit_test(test_exif_malformed),
        cmocka_unit_test(test_unsupported_and_empty),
        cmocka_unit_test(test_pixel_limit_before_allocation),
        cmocka_unit_test(test_jpeg_scan_cap),
        cmocka_unit_test(test_jpeg_color_spaces),
        cmocka_unit_test(test_truncation),
        cmocka_unit_test(test_byte_flips),
        cmocka_unit_test(test_allocation_failure_sweep),
        cmocka_unit_test(test_budget),
        cmocka_unit_test(test_load_file_and_create),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
