/*
 * core/formats/image.c — PNG (libspng) and JPEG (libjpeg-turbo) to RGB8 (see image.h).
 *
 * Output layout: struct mmrt_image, pixels [height][width][3] uint8.
 *
 * PNG: libspng decodes progressively in its raw format (SPNG_FMT_RAW: samples as stored,
 * big-endian 16-bit, sub-byte samples packed MSB first); each row is converted here to RGB
 * with PIL's rules (image.h), so peak memory is the RGB image plus one row. For Adam7 images
 * spng places each pass's pixels at their final x in the row buffer; we convert only those.
 *
 * JPEG: libjpeg-turbo behind an error manager whose error_exit and (warning) emit_message
 * longjmp back to jpeg_run(). Every resource lives in struct jpeg_job, reached through a
 * pointer, so nothing the longjmp skips over is an indeterminate local. CMYK follows Pillow's
 * "CMYK;I" unpack and cmyk2rgb (Pillow src/libImaging/Convert.c).
 *
 * Alpha compositing is Pillow's ImagingAlphaComposite (src/libImaging/AlphaComposite.c,
 * PRECISION_BITS 7) specialised to an opaque white destination; tests/test_image.c checks all
 * 65536 (colour, alpha) pairs against PIL.
 */
#include "image.h"

#include <limits.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jerror.h>
#include <jpeglib.h>
#include <spng.h>

#include "file.h"

/* Ancillary PNG chunks spng may keep (iCCP, text, …): one chunk / all of them. */
#define PNG_CHUNK_LIMIT ((size_t)8 << 20)
#define PNG_CACHE_LIMIT ((size_t)32 << 20)
/* spng's own state besides the rows (zlib window and tables, chunk bookkeeping), charged to
 * the budget as a flat estimate. */
#define PNG_STATE_BYTES ((size_t)64 << 10)
#define JPEG_STATE_BYTES ((size_t)1 << 20)

static const uint8_t png_magic[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};

/* ---------------------------------------------------------------------------------------- */
/* budgets                                                                                  */

void mmrt_image_budget_init(struct mmrt_image_budget *b, size_t max_bytes,
                            struct mmrt_image_budget *parent)
{
    atomic_init(&b->in_use_, 0);
    b->max_bytes_ = max_bytes;
    b->parent_ = parent;
}

size_t mmrt_image_budget_in_use(const struct mmrt_image_budget *b)
{
    return atomic_load(&((struct mmrt_image_budget *)b)->in_use_);
}

static void budget_release(struct mmrt_image_budget *b, size_t n)
{
    for (; b && n; b = b->parent_)
        atomic_fetch_sub(&b->in_use_, n);
}

/* Charges n bytes to b and all its parents, or to none of them. Returns the budget that
 * refused (NULL on success). */
static struct mmrt_image_budget *budget_charge(struct mmrt_image_budget *b, size_t n)
{
    for (struct mmrt_image_budget *p = b; p; p = p->parent_) {
        size_t cur = atomic_load(&p->in_use_);
        for (;;) {
            if (n > SIZE_MAX - cur || (p->max_bytes_ && cur + n > p->max_bytes_)) {
                for (struct mmrt_image_budget *q = b; q != p; q = q->parent_)
                    atomic_fetch_sub(&q->in_use_, n);
                return p;
            }
            if (atomic_compare_exchange_weak(&p->in_use_, &cur, cur + n))
                break;
        }
    }
    return NULL;
}

/* ---------------------------------------------------------------------------------------- */
/* images                                                                                   */

void mmrt_image_limits_default(struct mmrt_image_limits *limits)
{
    limits->max_pixels = MMRT_IMAGE_DEFAULT_MAX_PIXELS;
    limits->max_side = MMRT_IMAGE_DEFAULT_MAX_SIDE;
    limits->max_aspect = MMRT_IMAGE_DEFAULT_MAX_ASPECT;
    limits->max_jpeg_scans = MMRT_IMAGE_DEFAULT_MAX_JPEG_SCANS;
    limits->max_input_bytes = MMRT_IMAGE_DEFAULT_MAX_INPUT_BYTES;
    limits->apply_exif_orientation = false; /* transformers does not rotate */
    limits->alpha = MMRT_IMAGE_ALPHA_WHITE;
    limits->budget = NULL;
}

/* Allocates the struct and an uninitialised pixel buffer. */
static mmrt_status image_alloc(uint32_t width, uint32_t height, struct mmrt_image **out,
                               struct mmrt_error *err)
{
    if (width == 0 || height == 0 || width > MMRT_IMAGE_MAX_CREATE_SIDE ||
        height > MMRT_IMAGE_MAX_CREATE_SIDE)
        return mmrt_error_set(err, MMRT_ERR_INVALID_ARG,
                              "image: size %ux%u outside 1..%u per side", width, height,
                              MMRT_IMAGE_MAX_CREATE_SIDE);
    uint64_t nbytes = (uint64_t)width * height * 3;
    if (nbytes > SIZE_MAX)
        return mmrt_error_set(err, MMRT_ERR_INVALID_ARG, "image: %ux%u is too large", width,
                              height);
    struct mmrt_image *img = malloc(sizeof *img);
    uint8_t *px = img ? malloc((size_t)nbytes) : NULL;
    if (!px) {
        free(img);
        return mmrt_error_set(err, MMRT_ERR_NO_MEMORY,
                              "image: cannot allocate %ux%u RGB (%llu bytes)", width, height,
                              (unsigned long long)nbytes);
    }
    *img = (struct mmrt_image){.width = width, .height = height, .pixels = px};
    *out = img;
    return MMRT_OK;
}

mmrt_status mmrt_image_create(uint32_t width, uint32_t height, struct mmrt_image **out,
                              struct mmrt_error *err)
{
    if (!out)
        return mmrt_error_set(err, MMRT_ERR_INVALID_ARG, "image: out is NULL");
    struct mmrt_image *img = NULL;
    mmrt_status st = image_alloc(width, height, &img, err);
    if (st != MMRT_OK)
        return st;
    memset(img->pixels, 0, (size_t)width * height * 3);
    *out = img;
    return MMRT_OK;
}

void mmrt_image_destroy(struct mmrt_image *img)
{
    if (!img)
        return;
    budget_release(img->budget_, img->charged_);
    free(img->pixels);
    free(img);
}

/* ---------------------------------------------------------------------------------------- */
/* one decode: limits, budget charges                                                       */

struct job {
    const char *what;
    const char *fmt; /* "PNG" / "JPEG" */
    const struct mmrt_image_limits *lim;
    size_t charged; /* bytes charged to lim->budget so far by this decode */
};

static mmrt_status job_charge(struct job *job, uint64_t n, const char *purpose,
                              struct mmrt_error *err)
{
    struct mmrt_image_budget *b = job->lim->budget;
    if (!b)
        return MMRT_OK;
    struct mmrt_image_budget *refused = n > SIZE_MAX ? b : budget_charge(b, (size_t)n);
    if (refused)
        return mmrt_error_set(err, MMRT_ERR_LIMIT,
                              "%s: %s: decode budget exhausted: %s needs %llu bytes, %zu of "
                              "%zu already in use", job->what, job->fmt, purpose,
                              (unsigned long long)n, mmrt_image_budget_in_use(refused),
                              refused->max_bytes_);
    job->charged += (size_t)n;
    return MMRT_OK;
}

/* Called when a decode ends: the finished image keeps `keep` bytes charged, the rest (working
 * buffers, or everything after a failure) is released. */
static void job_settle(struct job *job, struct mmrt_image *img)
{
    size_t keep = 0;
    if (img && job->lim->budget) {
        keep = (size_t)img->width * img->height * 3;
        if (keep > job->charged)
            keep = job->charged;
        img->budget_ = job->lim->budget;
        img->charged_ = keep;
    }
    budget_release(job->lim->budget, job->charged - keep);
    job->charged = 0;
}

/* I2: the header's size against the limits, before anything is allocated. */
static mmrt_status check_size(const struct job *job, uint64_t w, uint64_t h,
                              struct mmrt_error *err)
{
    const struct mmrt_image_limits *lim = job->lim;
    if (w == 0 || h == 0)
        return mmrt_error_set(err, MMRT_ERR_FORMAT, "%s: %s header: size %llux%llu is empty",
                              job->what, job->fmt, (unsigned long long)w,
                              (unsigned long long)h);
    if (w > lim->max_side || h > lim->max_side)
        return mmrt_error_set(err, MMRT_ERR_LIMIT,
                              "%s: %s header: size %llux%llu has a side over max_side %u",
                              job->what, job->fmt, (unsigned long long)w,
                              (unsigned long long)h, lim->max_side);
    if (w * h > lim->max_pixels)
        return mmrt_error_set(err, MMRT_ERR_LIMIT,
                              "%s: %s header: size %llux%llu = %llu pixels, over max_pixels "
                              "%llu", job->what, job->fmt, (unsigned long long)w,
                              (unsigned long long)h, (unsigned long long)(w * h),
                              (unsigned long long)lim->max_pixels);
    uint64_t lo = w < h ? w : h, hi = w < h ? h : w;
    if (lim->max_aspect && hi > lo * lim->max_aspect)
        return mmrt_error_set(err, MMRT_ERR_LIMIT,
                              "%s: %s header: size %llux%llu has an aspect ratio over "
                              "max_aspect %u:1", job->what, job->fmt, (unsigned long long)w,
                              (unsigned long long)h, lim->max_aspect);
    return MMRT_OK;
}

/* ---------------------------------------------------------------------------------------- */
/* EXIF orientation                                                                         */

/* Orientation (1..8) from a TIFF structure (the payload of a JPEG "Exif\0\0" APP1 segment
 * or a PNG eXIf chunk). Reads only IFD0; every offset is checked against n. Anything
 * malformed, absent or out of range yields 1 (no transform), as PIL's exif_transpose does. */
static int exif_orientation(const uint8_t *t, size_t n)
{
    if (n < 8)
        return 1;
    bool le;
    if (t[0] == 'I' && t[1] == 'I')
        le = true;
    else if (t[0] == 'M' && t[1] == 'M')
        le = false;
    else
        return 1;
#define RD16(p) (le ? (uint32_t)(p)[0] | (uint32_t)(p)[1] << 8 \
                    : (uint32_t)(p)[1] | (uint32_t)(p)[0] << 8)
#define RD32(p) (le ? RD16(p) | RD16((p) + 2) << 16 : RD16((p) + 2) | RD16(p) << 16)
    if (RD16(t + 2) != 42)
        return 1;
    uint64_t ifd = RD32(t + 4);
    if (ifd + 2 > n)
        return 1;
    uint32_t count = RD16(t + ifd);
    for (uint32_t i = 0; i < count; i++) {
        uint64_t e = ifd + 2 + 12ull * i;
        if (e + 12 > n)
            break;
        if (RD16(t + e) != 0x0112)
            continue;
        /* the value sits in the entry when it fits in 4 bytes; PIL takes the first one */
        uint32_t type = RD16(t + e + 2), cnt = RD32(t + e + 4), v;
        if (type == 3 && (cnt == 1 || cnt == 2)) /* SHORT */
            v = RD16(t + e + 8);
        else if (type == 4 && cnt == 1) /* LONG */
            v = RD32(t + e + 8);
        else
            return 1;
        return v >= 1 && v <= 8 ? (int)v : 1;
    }
    return 1;
#undef RD16
#undef RD32
}

/* Replaces img's pixels by the orientation transform (PIL ImageOps.exif_transpose):
 *   2 mirror left-right   3 rotate 180   4 mirror top-bottom   5 transpose
 *   6 rotate 90° clockwise   7 transverse   8 rotate 90° counter-clockwise.
 * out(x, y) = in(sx, sy) with the mapping below; 5..8 swap width and height. */
static mmrt_status apply_orientation(struct job *job, struct mmrt_image *img, int orient,
                                     struct mmrt_error *err)
{
    if (orient <= 1 || orient > 8)
        return MMRT_OK;
    const uint32_t W = img->width, H = img->height;
    const bool swap = orient >= 5;
    const uint32_t ow = swap ? H : W, oh = swap ? W : H;
    size_t nbytes = (size_t)W * H * 3;
    mmrt_status st = job_charge(job, nbytes, "the EXIF rotation", err);
    if (st != MMRT_OK)
        return st;
    uint8_t *dst = malloc(nbytes);
    if (!dst)
        return mmrt_error_set(err, MMRT_ERR_NO_MEMORY,
                              "%s: cannot allocate %zu bytes for the EXIF rotation",
                              job->what, nbytes);
    for (uint32_t y = 0; y < oh; y++) {
        for (uint32_t x = 0; x < ow; x++) {
            uint32_t sx, sy;
            switch (orient) {
            case 2: sx = W - 1 - x; sy = y; break;
            case 3: sx = W - 1 - x; sy = H - 1 - y; break;
            case 4: sx = x; sy = H - 1 - y; break;
            case 5: sx = y; sy = x; break;
            case 6: sx = y; sy = H - 1 - x; break;
            case 7: sx = W - 1 - y; sy = H - 1 - x; break;
            default: sx = W - 1 - y; sy = x; break; /* 8 */
            }
            memcpy(dst + ((size_t)y * ow + x) * 3, img->pixels + ((size_t)sy * W + sx) * 3, 3);
        }
    }
    free(img->pixels);
    img->pixels = dst;
    img->width = ow;
    img->height = oh;
    return MMRT_OK;
}

/* PIL's alpha_composite of (c, a) over opaque white, per channel. With an opaque white
 * destination Pillow's outa255 is 255², so coef1 = 128·a and coef2 = 128·(255 − a); the
 * rounding (+0x80 << 7) and SHIFTFORDIV255 are kept exactly. a = 255 is the identity. */
static inline uint8_t over_white(uint32_t c, uint32_t a)
{
    if (a == 0)
        return 255;
    uint32_t t = c * 128 * a + 255 * 128 * (255 - a) + (0x80 << 7);
    return (uint8_t)((((t >> 8) + t) >> 8) >> 7);
}

/* ---------------------------------------------------------------------------------------- */
/* PNG                                                                                      */

struct png_conv {
    uint8_t color_type, bit_depth;
    bool composite; /* false: MMRT_IMAGE_ALPHA_DROP */
    bool has_key;   /* gray / truecolour tRNS key, as PIL compares it */
    uint8_t key[3];
    uint32_t n_plte;
    uint8_t plte[256][4]; /* RGBA; alpha 255 past the tRNS entries */
};

/* spng's allocator. A failed allocation deep inside zlib (the inflate window is allocated
 * lazily) reaches us only as a generic "IDAT stream error", so failures are also noted here,
 * per thread, and the error is then reported as the memory error it is. */
static _Thread_local bool png_oom;

static void *png_malloc(size_t n)
{
    void *p = malloc(n);
    if (!p)
        png_oom = true;
    return p;
}

/* calloc through malloc, so allocation-failure tests reach spng's calloc too. */
static void *png_calloc(size_t count, size_t size)
{
    if (size && count > SIZE_MAX / size)
        return NULL;
    void *p = png_malloc(count * size);
    if (p)
        memset(p, 0, count * size);
    return p;
}

static void *png_realloc(void *p, size_t n)
{
    void *q = realloc(p, n);
    if (!q && n)
        png_oom = true;
    return q;
}

static void png_free(void *p)
{
    free(p);
}

static mmrt_status png_error(const struct job *job, int code, const char *during,
                             struct mmrt_error *err)
{
    const bool mem = code == SPNG_EMEM || png_oom;
    return mmrt_error_set(err, mem ? MMRT_ERR_NO_MEMORY : MMRT_ERR_FORMAT,
                          "%s: PNG: %s (%s)", job->what, spng_strerror(code), during);
}

/* Sample x of a packed row of `bd`-bit samples (bd = 1, 2, 4), MSB first. */
static inline uint32_t packed_sample(const uint8_t *row, uint32_t x, unsigned bd)
{
    size_t bit = (size_t)x * bd;
    return (uint32_t)(row[bit >> 3] >> (8 - bd - (bit & 7))) & ((1u << bd) - 1);
}

/* Converts the pixels x = x0, x0 + dx, … of one raw row into out_row (RGB). */
static mmrt_status png_convert_row(const struct job *job, const struct png_conv *c,
                                   const uint8_t *row, uint32_t width, uint32_t x0,
                                   uint32_t dx, uint32_t y, uint8_t *out_row,
                                   struct mmrt_error *err)
{
    const unsigned bd = c->bit_depth;
    /* PIL unpacks L;1 / L;2 / L;4 by scaling to 0..255 */
    const uint32_t gray_scale = bd == 1 ? 255 : bd == 2 ? 85 : bd == 4 ? 17 : 1;
    for (uint32_t x = x0; x < width; x += dx) {
        uint32_t r, g, b, a = 255;
        switch (c->color_type) {
        case SPNG_COLOR_TYPE_GRAYSCALE:
            if (bd == 16) {
                uint32_t v = (uint32_t)row[2 * (size_t)x] << 8 | row[2 * (size_t)x + 1];
                r = v > 255 ? 255 : v; /* PIL: I;16 → RGB clips */
            } else {
                r = (bd == 8 ? row[x] : packed_sample(row, x, bd)) * gray_scale;
            }
            g = b = r;
            if (c->has_key && r == c->key[0])
                a = 0;
            break;
        case SPNG_COLOR_TYPE_TRUECOLOR: {
            const uint8_t *p = row + (size_t)x * (bd == 16 ? 6 : 3);
            const size_t s = bd == 16 ? 2 : 1; /* high byte of each 16-bit sample */
            r = p[0];
            g = p[s];
            b = p[2 * s];
            if (c->has_key && r == c->key[0] && g == c->key[1] && b == c->key[2])
                a = 0;
            break;
        }
        case SPNG_COLOR_TYPE_INDEXED: {
            uint32_t i = bd == 8 ? row[x] : packed_sample(row, x, bd);
            if (i >= c->n_plte)
                return mmrt_error_set(err, MMRT_ERR_FORMAT,
                                      "%s: PNG: palette index %u at pixel (%u, %u) is past the "
                                      "%u PLTE entries", job->what, i, x, y, c->n_plte);
            r = c->plte[i][0];
            g = c->plte[i][1];
            b = c->plte[i][2];
            a = c->plte[i][3];
            break;
        }
        case SPNG_COLOR_TYPE_GRAYSCALE_ALPHA: {
            const uint8_t *p = row + (size_t)x * (bd == 16 ? 4 : 2);
            r = g = b = p[0];
            a = p[bd == 16 ? 2 : 1];
            break;
        }
        default: { /* SPNG_COLOR_TYPE_TRUECOLOR_ALPHA */
            const uint8_t *p = row + (size_t)x * (bd == 16 ? 8 : 4);
            const size_t s = bd == 16 ? 2 : 1;
            r = p[0];
            g = p[s];
            b = p[2 * s];
            a = p[3 * s];
            break;
        }
        }
        uint8_t *o = out_row + (size_t)x * 3;
        if (c->composite && a != 255) {
            o[0] = over_white(r, a);
            o[1] = over_white(g, a);
            o[2] = over_white(b, a);
        } else {
            o[0] = (uint8_t)r;
            o[1] = (uint8_t)g;
            o[2] = (uint8_t)b;
        }
    }
    return MMRT_OK;
}

/* Width/height straight from the IHDR bytes, for the message when spng's own side limit
 * refuses the header before it tells us the size. */
static void png_raw_size(const uint8_t *bytes, size_t len, uint32_t *w, uint32_t *h)
{
    *w = *h = 0;
    if (len >= 24 && !memcmp(bytes + 12, "IHDR", 4)) {
        *w = (uint32_t)bytes[16] << 24 | (uint32_t)bytes[17] << 16 |
             (uint32_t)bytes[18] << 8 | bytes[19];
        *h = (uint32_t)bytes[20] << 24 | (uint32_t)bytes[21] << 16 |
             (uint32_t)bytes[22] << 8 | bytes[23];
    }
}

static mmrt_status decode_png(const uint8_t *bytes, size_t len, struct job *job,
                              struct mmrt_image **out, struct mmrt_error *err)
{
    static const uint8_t adam7_x0[7] = {0, 4, 0, 2, 0, 1, 0};
    static const uint8_t adam7_dx[7] = {8, 8, 4, 4, 2, 2, 1};
    const struct mmrt_image_limits *lim = job->lim;
    mmrt_status st = MMRT_OK;
    struct mmrt_image *img = NULL;
    uint8_t *row = NULL;
    struct png_conv *conv = NULL;
    struct spng_alloc alloc = {png_malloc, png_realloc, png_calloc, png_free};
    png_oom = false;
    spng_ctx *ctx = spng_ctx_new2(&alloc, 0);
    int r;
    if (!ctx) {
        st = mmrt_error_set(err, MMRT_ERR_NO_MEMORY, "%s: PNG: cannot allocate the decoder",
                            job->what);
        goto out;
    }
    /* spng refuses a side over its limit while reading IHDR (2^31 − 1 at most) */
    uint32_t side = lim->max_side < 0x7fffffffu ? lim->max_side : 0x7fffffffu;
    if (spng_set_image_limits(ctx, side, side) ||
        spng_set_chunk_limits(ctx, PNG_CHUNK_LIMIT, PNG_CACHE_LIMIT) ||
        spng_set_png_buffer(ctx, bytes, len)) {
        st = mmrt_error_set(err, MMRT_ERR_INTERNAL, "%s: PNG: cannot configure libspng",
                            job->what);
        goto out;
    }
    struct spng_ihdr ihdr;
    r = spng_get_ihdr(ctx, &ihdr);
    if (r == SPNG_EUSER_WIDTH || r == SPNG_EUSER_HEIGHT) {
        uint32_t w, h;
        png_raw_size(bytes, len, &w, &h);
        st = mmrt_error_set(err, MMRT_ERR_LIMIT,
                            "%s: PNG header: size %ux%u has a side over max_side %u",
                            job->what, w, h, lim->max_side);
        goto out;
    }
    if (r) {
        st = png_error(job, r, "reading the header", err);
        goto out;
    }
    st = check_size(job, ihdr.width, ihdr.height, err);
    if (st != MMRT_OK)
        goto out;

    conv = malloc(sizeof *conv);
    if (!conv) {
        st = mmrt_error_set(err, MMRT_ERR_NO_MEMORY, "%s: PNG: out of memory", job->what);
        goto out;
    }
    memset(conv, 0, sizeof *conv);
    conv->color_type = ihdr.color_type;
    conv->bit_depth = ihdr.bit_depth;
    conv->composite = lim->alpha == MMRT_IMAGE_ALPHA_WHITE;
    struct spng_trns trns;
    r = spng_get_trns(ctx, &trns);
    if (r && r != SPNG_ECHUNKAVAIL) {
        st = png_error(job, r, "reading the chunks before the image data", err);
        goto out;
    }
    const bool has_trns = r == 0;
    if (ihdr.color_type == SPNG_COLOR_TYPE_INDEXED) {
        struct spng_plte plte;
        r = spng_get_plte(ctx, &plte);
        if (r) {
            st = r == SPNG_ECHUNKAVAIL
                     ? mmrt_error_set(err, MMRT_ERR_FORMAT,
                                      "%s: PNG: palette image without a PLTE chunk", job->what)
                     : png_error(job, r, "reading PLTE", err);
            goto out;
        }
        conv->n_plte = plte.n_entries > 256 ? 256 : plte.n_entries;
        for (uint32_t i = 0; i < conv->n_plte; i++) {
            conv->plte[i][0] = plte.entries[i].red;
            conv->plte[i][1] = plte.entries[i].green;
            conv->plte[i][2] = plte.entries[i].blue;
            conv->plte[i][3] = has_trns && i < trns.n_type3_entries ? trns.type3_alpha[i] : 255;
        }
    } else if (has_trns && ihdr.color_type == SPNG_COLOR_TYPE_GRAYSCALE) {
        /* PIL: mode "1" keys are 0/255, the others compare the key's low byte */
        conv->has_key = true;
        conv->key[0] = ihdr.bit_depth == 1 ? (trns.gray ? 255 : 0) : (uint8_t)trns.gray;
    } else if (has_trns && ihdr.color_type == SPNG_COLOR_TYPE_TRUECOLOR) {
        conv->has_key = true;
        conv->key[0] = (uint8_t)trns.red;
        conv->key[1] = (uint8_t)trns.green;
        conv->key[2] = (uint8_t)trns.blue;
    }

    const unsigned channels = ihdr.color_type == SPNG_COLOR_TYPE_TRUECOLOR         ? 3
                              : ihdr.color_type == SPNG_COLOR_TYPE_GRAYSCALE_ALPHA ? 2
                              : ihdr.color_type == SPNG_COLOR_TYPE_TRUECOLOR_ALPHA ? 4
                                                                                   : 1;
    const size_t row_bytes = ((size_t)ihdr.width * channels * ihdr.bit_depth + 7) / 8;
    st = job_charge(job, (uint64_t)ihdr.width * ihdr.height * 3 + 3 * (uint64_t)row_bytes +
                             PNG_STATE_BYTES, "the image", err);
    if (st != MMRT_OK)
        goto out;

    r = spng_decode_image(ctx, NULL, 0, SPNG_FMT_RAW, SPNG_DECODE_PROGRESSIVE);
    if (r) {
        st = png_error(job, r, "starting the image data", err);
        goto out;
    }
    int orient = 1;
    struct spng_exif exif;
    bool have_exif = spng_get_exif(ctx, &exif) == 0;
    if (have_exif)
        orient = exif_orientation((const uint8_t *)exif.data, exif.length);

    st = image_alloc(ihdr.width, ihdr.height, &img, err);
    if (st != MMRT_OK)
        goto out;
    row = malloc(row_bytes);
    if (!row) {
        st = mmrt_error_set(err, MMRT_ERR_NO_MEMORY, "%s: PNG: cannot allocate a %zu-byte row",
                            job->what, row_bytes);
        goto out;
    }
    for (;;) {
        struct spng_row_info ri;
        r = spng_get_row_info(ctx, &ri);
        if (r) {
            st = png_error(job, r, "before a row", err);
            goto out;
        }
        const bool partial = ihdr.interlace_method && ri.pass < 6;
        if (partial) /* spng ORs sub-byte samples of a pass into the buffer */
            memset(row, 0, row_bytes);
        r = spng_decode_row(ctx, row, row_bytes);
        if (r && r != SPNG_EOI) {
            char where[64];
            snprintf(where, sizeof where, "row %u, pass %d", ri.row_num, ri.pass);
            st = png_error(job, r, where, err);
            goto out;
        }
        if (ri.row_num >= ihdr.height) { /* spng's invariant; never trust it blindly */
            st = mmrt_error_set(err, MMRT_ERR_INTERNAL, "%s: PNG: row %u out of range",
                                job->what, ri.row_num);
            goto out;
        }
        st = png_convert_row(job, conv, row, ihdr.width, partial ? adam7_x0[ri.pass] : 0,
                             partial ? adam7_dx[ri.pass] : 1, ri.row_num,
                             img->pixels + (size_t)ri.row_num * ihdr.width * 3, err);
        if (st != MMRT_OK)
            goto out;
        if (r == SPNG_EOI)
            break;
    }
    if (!have_exif && lim->apply_exif_orientation) {
        /* eXIf may follow the image data. Damage in trailing chunks is ignored (as PIL),
         * running out of memory while reading them is not (the result would differ). */
        r = spng_decode_chunks(ctx);
        if (r && png_oom) {
            st = png_error(job, r, "reading the chunks after the image data", err);
            goto out;
        }
        if (r == 0 && spng_get_exif(ctx, &exif) == 0)
            orient = exif_orientation((const uint8_t *)exif.data, exif.length);
    }
    if (lim->apply_exif_orientation)
        st = apply_orientation(job, img, orient, err);
out:
    if (st != MMRT_OK) {
        mmrt_image_destroy(img);
        img = NULL;
    }
    free(row);
    free(conv);
    spng_ctx_free(ctx);
    job_settle(job, img);
    if (st == MMRT_OK)
        *out = img;
    return st;
}

/* ---------------------------------------------------------------------------------------- */
/* JPEG                                                                                     */

struct jpeg_job {
    struct jpeg_decompress_struct cinfo;
    struct jpeg_error_mgr jerr;
    struct jpeg_progress_mgr progress;
    jmp_buf jmp;
    struct job *job;
    struct mmrt_error *err;
    mmrt_status status; /* set before every longjmp */
    const uint8_t *bytes;
    size_t len;
    bool created;
    uint8_t *cmyk_row;
    struct mmrt_image *img;
};

static void jpeg_fail(struct jpeg_job *jj, j_common_ptr cinfo, const char *kind)
{
    char msg[JMSG_LENGTH_MAX];
    cinfo->err->format_message(cinfo, msg);
    int code = cinfo->err->msg_code;
    mmrt_status st = code == JERR_OUT_OF_MEMORY ? MMRT_ERR_NO_MEMORY
                     : code == JERR_BAD_PRECISION || code == JERR_CONVERSION_NOTIMPL ||
                               code == JERR_NOT_COMPILED
                         ? MMRT_ERR_UNSUPPORTED
                         : MMRT_ERR_FORMAT;
    /* the mem source has consumed everything handed to it minus what is still buffered */
    size_t offset = jj->len - (jj->cinfo.src ? jj->cinfo.src->bytes_in_buffer : 0);
    jj->status = mmrt_error_set(jj->err, st, "%s: JPEG: %s%s (near byte %zu)", jj->job->what,
                                kind, msg, offset);
}

static void jpeg_on_error(j_common_ptr cinfo)
{
    struct jpeg_job *jj = (struct jpeg_job *)cinfo->client_data;
    jpeg_fail(jj, cinfo, "");
    longjmp(jj->jmp, 1);
}

/* Warnings are corrupt data that libjpeg would paper over with grey blocks: fail instead.
 * Trace messages (level > 0) are ignored; nothing is ever printed. */
static void jpeg_on_message(j_common_ptr cinfo, int level)
{
    if (level >= 0)
        return;
    int code = cinfo->err->msg_code;
    if (code == JWRN_JFIF_MAJOR || code == JWRN_ADOBE_XFORM)
        return; /* metadata oddities, the pixels are fine */
    struct jpeg_job *jj = (struct jpeg_job *)cinfo->client_data;
    jpeg_fail(jj, cinfo, "corrupt data: ");
    longjmp(jj->jmp, 1);
}

static void jpeg_on_output(j_common_ptr cinfo)
{
    (void)cinfo;
}

/* I4: the monitor runs between input passes; input_scan_number counts scans read. */
static void jpeg_on_progress(j_common_ptr cinfo)
{
    struct jpeg_job *jj = (struct jpeg_job *)cinfo->client_data;
    j_decompress_ptr d = (j_decompress_ptr)cinfo;
    uint32_t cap = jj->job->lim->max_jpeg_scans;
    if (cap && d->input_scan_number > 0 && (uint32_t)d->input_scan_number > cap) {
        jj->status = mmrt_error_set(jj->err, MMRT_ERR_LIMIT,
                                    "%s: JPEG: more than max_jpeg_scans %u progressive scans",
                                    jj->job->what, cap);
        longjmp(jj->jmp, 1);
    }
}

/* First "Exif\0\0" APP1 segment before SOS (what PIL's JpegImagePlugin keeps). A plain walk
 * over the marker segments; anything inconsistent ends the walk (libjpeg reports real
 * errors). */
static int jpeg_exif_orientation(const uint8_t *b, size_t n)
{
    size_t pos = 2;
    while (pos + 4 <= n) {
        if (b[pos] != 0xFF)
            return 1;
        uint8_t m = b[pos + 1];
        if (m == 0xFF) { /* fill byte */
            pos++;
            continue;
        }
        if (m == 0xDA || m == 0xD9)
            return 1;
        if (m == 0x01 || (m >= 0xD0 && m <= 0xD7)) { /* TEM, RSTn: no length */
            pos += 2;
            continue;
        }
        size_t seg = (size_t)b[pos + 2] << 8 | b[pos + 3];
        if (seg < 2 || seg > n - pos - 2)
            return 1;
        const uint8_t *d = b + pos + 4;
        size_t dn = seg - 2;
        if (m == 0xE1 && dn >= 6 && !memcmp(d, "Exif\0\0", 6))
            return exif_orientation(d + 6, dn - 6);
        pos += 2 + seg;
    }
    return 1;
}

/* PIL's "CMYK;I" unpack followed by cmyk2rgb: libjpeg's CMYK samples are Adobe-inverted, so
 * PIL's k = 255 − k', nk = 255 − k = k', and each channel is nk − MULDIV255(255 − c', nk). */
static void cmyk_row_to_rgb(const uint8_t *in, uint32_t width, uint8_t *out)
{
    for (uint32_t x = 0; x < width; x++, in += 4, out += 3) {
        int nk = in[3];
        for (int ch = 0; ch < 3; ch++) {
            int t = (255 - in[ch]) * nk + 128;
            int v = nk - (((t >> 8) + t) >> 8);
            out[ch] = (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
        }
    }
}

/* Everything that can longjmp happens in here; state lives in *jj only. */
static mmrt_status jpeg_run(struct jpeg_job *jj)
{
    struct job *job = jj->job;
    struct mmrt_error *err = jj->err;
    j_decompress_ptr ci = &jj->cinfo;
    if (setjmp(jj->jmp))
        return jj->status;

    ci->err = jpeg_std_error(&jj->jerr);
    jj->jerr.error_exit = jpeg_on_error;
    jj->jerr.emit_message = jpeg_on_message;
    jj->jerr.output_message = jpeg_on_output;
    ci->client_data = jj; /* jpeg_create_decompress keeps err and client_data */
    jj->created = true;
    jpeg_create_decompress(ci);
    jj->progress.progress_monitor = jpeg_on_progress;
    ci->progress = &jj->progress;
    jpeg_mem_src(ci, jj->bytes, (unsigned long)jj->len);
    if (jpeg_read_header(ci, TRUE) != JPEG_HEADER_OK)
        return mmrt_error_set(err, MMRT_ERR_FORMAT, "%s: JPEG: tables only, no image",
                              job->what);
    mmrt_status st = check_size(job, ci->image_width, ci->image_height, err);
    if (st != MMRT_OK)
        return st;
    bool cmyk;
    switch (ci->jpeg_color_space) {
    case JCS_GRAYSCALE:
    case JCS_YCbCr:
    case JCS_RGB:
        cmyk = false;
        ci->out_color_space = JCS_RGB; /* grey is replicated, as PIL's L → RGB */
        break;
    case JCS_CMYK:
    case JCS_YCCK:
        cmyk = true;
        ci->out_color_space = JCS_CMYK;
        break;
    default:
        return mmrt_error_set(err, MMRT_ERR_UNSUPPORTED,
                              "%s: JPEG with %d components of unknown colour space is not "
                              "supported (expected gray, YCbCr, RGB, CMYK or YCCK)",
                              job->what, ci->num_components);
    }
    /* Pillow's settings, i.e. the library defaults: accurate integer IDCT, fancy upsampling */
    ci->dct_method = JDCT_ISLOW;
    ci->do_fancy_upsampling = TRUE;
    /* Progressive and multi-scan files keep whole-image coefficient buffers (≤ 2 bytes per
     * sample); charge them, and cap libjpeg's big buffers at what was charged. */
    const uint64_t W = ci->image_width, H = ci->image_height;
    uint64_t coef = jpeg_has_multiple_scans(ci)
                        ? 2 * (W + 64) * (H + 64) * (uint64_t)ci->num_components
                        : 0;
    ci->mem->max_memory_to_use = (long)(coef + JPEG_STATE_BYTES + 64 * (W + 64) * 4);
    st = job_charge(job, W * H * 3 + coef + JPEG_STATE_BYTES + (cmyk ? W * 4 : 0), "the image",
                    err);
    if (st != MMRT_OK)
        return st;

    jpeg_start_decompress(ci);
    if (ci->output_width != W || ci->output_height != H ||
        ci->output_components != (cmyk ? 4 : 3))
        return mmrt_error_set(err, MMRT_ERR_INTERNAL,
                              "%s: JPEG: unexpected output geometry %ux%u×%d", job->what,
                              ci->output_width, ci->output_height, ci->output_components);
    st = image_alloc(ci->output_width, ci->output_height, &jj->img, err);
    if (st != MMRT_OK)
        return st;
    if (cmyk) {
        jj->cmyk_row = malloc((size_t)W * 4);
        if (!jj->cmyk_row)
            return mmrt_error_set(err, MMRT_ERR_NO_MEMORY, "%s: JPEG: out of memory",
                                  job->what);
    }
    while (ci->output_scanline < ci->output_height) {
        JDIMENSION y = ci->output_scanline;
        uint8_t *dst = jj->img->pixels + (size_t)y * W * 3;
        JSAMPROW rowp = cmyk ? jj->cmyk_row : dst;
        if (jpeg_read_scanlines(ci, &rowp, 1) != 1)
            return mmrt_error_set(err, MMRT_ERR_FORMAT, "%s: JPEG: no data for row %u",
                                  job->what, y);
        if (cmyk)
            cmyk_row_to_rgb(jj->cmyk_row, (uint32_t)W, dst);
    }
    jpeg_finish_decompress(ci); /* reads to EOI; a missing EOI is a warning, hence an error */
    return MMRT_OK;
}

static mmrt_status decode_jpeg(const uint8_t *bytes, size_t len, struct job *job,
                               struct mmrt_image **out, struct mmrt_error *err)
{
    struct jpeg_job *jj = malloc(sizeof *jj);
    if (!jj)
        return mmrt_error_set(err, MMRT_ERR_NO_MEMORY, "%s: JPEG: cannot allocate the decoder",
                              job->what);
    memset(jj, 0, sizeof *jj);
    jj->job = job;
    jj->err = err;
    jj->bytes = bytes;
    jj->len = len;
    mmrt_status st = jpeg_run(jj);
    if (jj->created)
        jpeg_destroy_decompress(&jj->cinfo);
    struct mmrt_image *img = jj->img;
    if (st == MMRT_OK && job->lim->apply_exif_orientation)
        st = apply_orientation(job, img, jpeg_exif_orientation(bytes, len), err);
    if (st != MMRT_OK) {
        mmrt_image_destroy(img);
        img = NULL;
    }
    free(jj->cmyk_row);
    free(jj);
    job_settle(job, img);
    if (st == MMRT_OK)
        *out = img;
    return st;
}

/* ---------------------------------------------------------------------------------------- */
/* entry points                                                                             */

mmrt_status mmrt_image_decode(const uint8_t *bytes, size_t len, const char *what,
                              const struct mmrt_image_limits *limits, struct mmrt_image **out,
                              struct mmrt_error *err)
{
    struct mmrt_image_limits defaults;
    if (!limits) {
        mmrt_image_limits_default(&defaults);
        limits = &defaults;
    }
    if (!what)
        what = "image";
    if (!out || (!bytes && len))
        return mmrt_error_set(err, MMRT_ERR_INVALID_ARG, "%s: %s is NULL", what,
                              out ? "bytes" : "out");
    if (len == 0)
        return mmrt_error_set(err, MMRT_ERR_FORMAT, "%s: empty input (0 bytes)", what);
    if (len > limits->max_input_bytes)
        return mmrt_error_set(err, MMRT_ERR_LIMIT,
                              "%s: %zu bytes, over max_input_bytes %zu", what, len,
                              limits->max_input_bytes);
    struct job job = {.what = what, .lim = limits};
    if (len >= sizeof png_magic && !memcmp(bytes, png_magic, sizeof png_magic)) {
        job.fmt = "PNG";
        return decode_png(bytes, len, &job, out, err);
    }
    if (len >= 3 && bytes[0] == 0xFF && bytes[1] == 0xD8 && bytes[2] == 0xFF) {
        job.fmt = "JPEG";
        return decode_jpeg(bytes, len, &job, out, err);
    }
    /* a prefix of a signature is a truncated file, not a foreign format */
    if (len < sizeof png_magic && !memcmp(bytes, png_magic, len))
        return mmrt_error_set(err, MMRT_ERR_FORMAT, "%s: PNG: truncated in the signature "
                              "(%zu bytes)", what, len);
    if (len < 3 && bytes[0] == 0xFF && (len == 1 || bytes[1] == 0xD8))
        return mmrt_error_set(err, MMRT_ERR_FORMAT, "%s: JPEG: truncated in the SOI marker "
                              "(%zu bytes)", what, len);
    return mmrt_error_set(err, MMRT_ERR_UNSUPPORTED,
                          "%s: unsupported image format (expected PNG or JPEG)", what);
}

mmrt_status mmrt_image_load_file(const char *path, const struct mmrt_image_limits *limits,
                                 struct mmrt_image **out, struct mmrt_error *err)
{
    struct mmrt_image_limits defaults;
    if (!limits) {
        mmrt_image_limits_default(&defaults);
        limits = &defaults;
    }
    if (!path || !out)
        return mmrt_error_set(err, MMRT_ERR_INVALID_ARG, "image: %s is NULL",
                              path ? "out" : "path");
    char *buf = NULL;
    size_t n = 0;
    mmrt_status st = mmrt_file_read(path, limits->max_input_bytes, 0, " (max_input_bytes)",
                                    &buf, &n, err);
    if (st != MMRT_OK)
        return st;
    st = mmrt_image_decode((const uint8_t *)buf, n, path, limits, out, err);
    free(buf);
    return st;
}
