/*
 * core/preprocess.c — resize / crop / pad / normalize / patchify (see preprocess.h).
 *
 * Resize is a port of the arithmetic of Pillow's src/libImaging/Resample.c (precompute_coeffs,
 * normalize_coeffs_8bpc, ImagingResampleHorizontal_8bpc / Vertical_8bpc, the filter kernels),
 * written here from its description, for RGB only and over an output window:
 *
 *   for each output index xx of an axis (in → out, scale = in/out, fs = max(scale, 1)):
 *     support = filter.support · fs, center = (xx + 0.5) · scale,
 *     xmin = max((int)(center − support + 0.5), 0), xmax = min((int)(center + support + 0.5), in)
 *     w[i] = K((i + xmin − center + 0.5) / fs) for i < xmax − xmin, divided by their sum,
 *     then (int)(w · 2^22 ± 0.5) — all in double, in exactly this order.
 *   pixel = clip8((1 << 21) + Σ src · w >> 22), int32, RGB channels independently.
 *
 * struct axis holds one axis's coefficients for the window only: lo[i] = xmin, n[i] = count,
 * k[i · ksize …] the fixed-point weights. The first pass writes an 8-bit intermediate covering
 * only the source rows (or columns) the second pass's window reads, as Pillow does for the
 * rows it needs; a pass whose axis keeps its size is skipped, as in Pillow. Pass order follows
 * Pillow 13 (see preprocess.h).
 *
 * Float conversion uses a 256-entry table per channel, filled with numpy's exact sequence of
 * roundings (float64 multiply, cast, float32 subtract, float32 divide).
 */
#include "preprocess.h"

#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define PRECISION_BITS 22

struct filter {
    double (*fn)(double x);
    double support;
};

static double box_fn(double x)
{
    return x > -0.5 && x <= 0.5 ? 1.0 : 0.0;
}

static double bilinear_fn(double x)
{
    if (x < 0.0)
        x = -x;
    return x < 1.0 ? 1.0 - x : 0.0;
}

static double hamming_fn(double x)
{
    if (x < 0.0)
        x = -x;
    if (x == 0.0)
        return 1.0;
    if (x >= 1.0)
        return 0.0;
    x = x * M_PI;
    return sin(x) / x * (0.54f + 0.46f * cos(x)); /* float constants, as in Pillow */
}

static double bicubic_fn(double x)
{
    const double a = -0.5;
    if (x < 0.0)
        x = -x;
    if (x < 1.0)
        return ((a + 2.0) * x - (a + 3.0)) * x * x + 1;
    if (x < 2.0)
        return (((x - 5) * x + 8) * x - 4) * a;
    return 0.0;
}

static double sinc_fn(double x)
{
    if (x == 0.0)
        return 1.0;
    x = x * M_PI;
    return sin(x) / x;
}

static double lanczos_fn(double x)
{
    return -3.0 <= x && x < 3.0 ? sinc_fn(x) * sinc_fn(x / 3) : 0.0;
}

static const struct filter *filter_of(enum mmrt_resample f)
{
    static const struct filter box = {box_fn, 0.5}, bilinear = {bilinear_fn, 1.0},
                               hamming = {hamming_fn, 1.0}, bicubic = {bicubic_fn, 2.0},
                               lanczos = {lanczos_fn, 3.0};
    switch (f) {
    case MMRT_RESAMPLE_BOX: return &box;
    case MMRT_RESAMPLE_BILINEAR: return &bilinear;
    case MMRT_RESAMPLE_HAMMING: return &hamming;
    case MMRT_RESAMPLE_BICUBIC: return &bicubic;
    case MMRT_RESAMPLE_LANCZOS: return &lanczos;
    default: return NULL;
    }
}

static mmrt_status check_image(const struct mmrt_image *in, const char *fn,
                               struct mmrt_error *err)
{
    if (!in || !in->pixels || in->width == 0 || in->height == 0 ||
        in->width > MMRT_IMAGE_MAX_CREATE_SIDE || in->height > MMRT_IMAGE_MAX_CREATE_SIDE)
        return mmrt_error_set(err, MMRT_ERR_INVALID_ARG, "%s: no image or an empty one", fn);
    return MMRT_OK;
}

/* Python's a // 2 for any sign. */
static int64_t floor_half(int64_t a)
{
    return a >= 0 ? a / 2 : -((-a + 1) / 2);
}

/* ---------------------------------------------------------------------------------------- */
/* resampling                                                                               */

struct axis {
    uint32_t ksize;
    uint32_t *lo; /* [n] first source index */
    uint32_t *n;  /* [n] number of taps */
    int32_t *k;   /* [n][ksize] weights in 2^-22 */
};

static void axis_free(struct axis *ax)
{
    free(ax->lo);
    free(ax->n);
    free(ax->k);
    memset(ax, 0, sizeof *ax); /* freeing twice (init failure, then the caller) is safe */
}

/* Coefficients for outputs [w0, w0 + wn) of an in_size → out_size axis. */
static mmrt_status axis_init(struct axis *ax, uint32_t in_size, uint32_t out_size, uint32_t w0,
                             uint32_t wn, const struct filter *f, struct mmrt_error *err)
{
    mmrt_status st = MMRT_OK;
    double *tmp = NULL;
    /* Pillow: (double)(in1 − in0) / outSize with float box edges; exact for in < 2^24 */
    const double scale = (double)in_size / out_size;
    const double filterscale = scale < 1.0 ? 1.0 : scale;
    const double support = f->support * filterscale;
    const double ss = 1.0 / filterscale;
    const uint64_t ksize = (uint64_t)ceil(support) * 2 + 1;
    memset(ax, 0, sizeof *ax);
    if (ksize > (uint64_t)SIZE_MAX / sizeof(int32_t) / wn || ksize > UINT32_MAX) {
        st = mmrt_error_set(err, MMRT_ERR_INVALID_ARG,
                            "resize: %u → %u needs too many filter taps", in_size, out_size);
        goto out;
    }
    ax->ksize = (uint32_t)ksize;
    ax->lo = malloc(sizeof *ax->lo * wn);
    ax->n = malloc(sizeof *ax->n * wn);
    ax->k = malloc(sizeof *ax->k * wn * (size_t)ksize);
    tmp = malloc(sizeof *tmp * (size_t)ksize);
    if (!ax->lo || !ax->n || !ax->k || !tmp) {
        st = mmrt_error_set(err, MMRT_ERR_NO_MEMORY,
                            "resize: cannot allocate %llu filter coefficients",
                            (unsigned long long)ksize * wn);
        goto out;
    }
    for (uint32_t i = 0; i < wn; i++) {
        const uint32_t xx = w0 + i;
        const double center = (xx + 0.5) * scale;
        double ww = 0.0;
        int xmin = (int)(center - support + 0.5);
        if (xmin < 0)
            xmin = 0;
        int xmax = (int)(center + support + 0.5);
        if (xmax > (int)in_size)
            xmax = (int)in_size;
        xmax -= xmin;
        for (int x = 0; x < xmax; x++) {
            double w = f->fn((x + xmin - center + 0.5) * ss);
            tmp[x] = w;
            ww += w;
        }
        int32_t *k = ax->k + (size_t)i * ax->ksize;
        for (int x = 0; x < xmax; x++) {
            double w = ww != 0.0 ? tmp[x] / ww : tmp[x];
            k[x] = w < 0 ? (int32_t)(-0.5 + w * (1 << PRECISION_BITS))
                         : (int32_t)(0.5 + w * (1 << PRECISION_BITS));
        }
        ax->lo[i] = (uint32_t)xmin;
        ax->n[i] = xmax > 0 ? (uint32_t)xmax : 0;
    }
out:
    free(tmp);
    if (st != MMRT_OK)
        axis_free(ax);
    return st;
}

static inline uint8_t clip8(int32_t v)
{
    if (v < 0)
        return 0;
    v >>= PRECISION_BITS;
    return v > 255 ? 255 : (uint8_t)v;
}

/* dst[j][i] = clip8(Σ_t src[j][lo[i] − col0 + t] · k[i][t]) for j < rows, i < ax outputs n:
 * a horizontal pass. src points at column col0 of its first row. */
static void h_pass(const uint8_t *src, size_t src_stride, uint32_t col0, uint32_t rows,
                   const struct axis *ax, uint32_t n, uint8_t *dst, size_t dst_stride)
{
    for (uint32_t j = 0; j < rows; j++) {
        const uint8_t *row = src + (size_t)j * src_stride;
        uint8_t *out = dst + (size_t)j * dst_stride;
        for (uint32_t i = 0; i < n; i++) {
            const int32_t *k = ax->k + (size_t)i * ax->ksize;
            const uint8_t *p = row + (size_t)(ax->lo[i] - col0) * 3;
            int32_t s0 = 1 << (PRECISION_BITS - 1), s1 = s0, s2 = s0;
            for (uint32_t t = 0; t < ax->n[i]; t++, p += 3) {
                s0 += p[0] * k[t];
                s1 += p[1] * k[t];
                s2 += p[2] * k[t];
            }
            out[3 * i + 0] = clip8(s0);
            out[3 * i + 1] = clip8(s1);
            out[3 * i + 2] = clip8(s2);
        }
    }
}

/* dst[j][i] = clip8(Σ_t src[lo[j] − row0 + t][i] · k[j][t]) for j < n, i < cols: a vertical
 * pass. src points at row row0 of the first column used. */
static void v_pass(const uint8_t *src, size_t src_stride, uint32_t row0, uint32_t cols,
                   const struct axis *ax, uint32_t n, uint8_t *dst, size_t dst_stride)
{
    for (uint32_t j = 0; j < n; j++) {
        const int32_t *k = ax->k + (size_t)j * ax->ksize;
        const uint8_t *col = src + (size_t)(ax->lo[j] - row0) * src_stride;
        uint8_t *out = dst + (size_t)j * dst_stride;
        for (uint32_t i = 0; i < cols; i++) {
            int32_t s0 = 1 << (PRECISION_BITS - 1), s1 = s0, s2 = s0;
            const uint8_t *p = col + (size_t)i * 3;
            for (uint32_t t = 0; t < ax->n[j]; t++, p += src_stride) {
                s0 += p[0] * k[t];
                s1 += p[1] * k[t];
                s2 += p[2] * k[t];
            }
            out[3 * i + 0] = clip8(s0);
            out[3 * i + 1] = clip8(s1);
            out[3 * i + 2] = clip8(s2);
        }
    }
}

/* The source range [lo, hi) an axis's window reads. */
static void axis_span(const struct axis *ax, uint32_t n, uint32_t *lo, uint32_t *hi)
{
    *lo = UINT32_MAX;
    *hi = 0;
    for (uint32_t i = 0; i < n; i++) {
        if (ax->lo[i] < *lo)
            *lo = ax->lo[i];
        if (ax->lo[i] + ax->n[i] > *hi)
            *hi = ax->lo[i] + ax->n[i];
    }
    if (*hi <= *lo) /* cannot happen: every output has at least one tap */
        *hi = *lo + 1;
}

mmrt_status mmrt_preprocess_resize_window(const struct mmrt_image *in, uint32_t full_width,
                                          uint32_t full_height, enum mmrt_resample filter,
                                          uint32_t x, uint32_t y, uint32_t width,
                                          uint32_t height, struct mmrt_image **out,
                                          struct mmrt_error *err)
{
    mmrt_status st = check_image(in, "resize", err);
    if (st != MMRT_OK)
        return st;
    const struct filter *f = filter_of(filter);
    if (!f)
        return mmrt_error_set(err, MMRT_ERR_UNSUPPORTED,
                              "resize: resample %d is not supported (PIL filters 1..5: "
                              "lanczos, bilinear, bicubic, box, hamming)", (int)filter);
    if (!out || full_width == 0 || full_height == 0 || full_width > MMRT_PREPROCESS_MAX_SIDE ||
        full_height > MMRT_PREPROCESS_MAX_SIDE || width == 0 || height == 0 ||
        (uint64_t)x + width > full_width || (uint64_t)y + height > full_height)
        return mmrt_error_set(err, MMRT_ERR_INVALID_ARG,
                              "resize: window %ux%u at (%u, %u) of a %ux%u result is invalid",
                              width, height, x, y, full_width, full_height);

    struct axis hx = {0}, vy = {0};
    uint8_t *tmp = NULL;
    struct mmrt_image *img = NULL;
    const uint32_t iw = in->width, ih = in->height;
    const size_t in_stride = (size_t)iw * 3, out_stride = (size_t)width * 3;
    const bool need_h = full_width != iw, need_v = full_height != ih;
    /* Pillow ≥ 13 (python-pillow PR #9549) runs the vertical pass first when the height
     * shrinks by more than twice as many pixels as the width; the 8-bit intermediate makes
     * the order visible in the result. Pillow ≤ 12 always went horizontal first. */
    const bool v_first = need_h && need_v && full_height < ih &&
                         (uint64_t)(ih - full_height) + 2ull * full_width > 2ull * iw;
    if (need_h && (st = axis_init(&hx, iw, full_width, x, width, f, err)) != MMRT_OK)
        goto out;
    if (need_v && (st = axis_init(&vy, ih, full_height, y, height, f, err)) != MMRT_OK)
        goto out;
    st = mmrt_image_create(width, height, &img, err);
    if (st != MMRT_OK)
        goto out;

    if (v_first) {
        uint32_t c0, c1; /* input columns the horizontal window reads */
        axis_span(&hx, width, &c0, &c1);
        const size_t tmp_stride = (size_t)(c1 - c0) * 3;
        tmp = malloc(tmp_stride * height);
        if (!tmp) {
            st = mmrt_error_set(err, MMRT_ERR_NO_MEMORY,
                                "resize: cannot allocate the %ux%u intermediate", c1 - c0,
                                height);
            goto out;
        }
        v_pass(in->pixels + (size_t)c0 * 3, in_stride, 0, c1 - c0, &vy, height, tmp,
               tmp_stride);
        h_pass(tmp, tmp_stride, c0, height, &hx, width, img->pixels, out_stride);
        goto out;
    }
    /* horizontal first (or a single pass) */
    uint32_t r0 = y, r1 = y + height; /* input rows the vertical window reads */
    if (need_v)
        axis_span(&vy, height, &r0, &r1);
    const uint8_t *view = in->pixels + (size_t)x * 3; /* rows of the horizontal result */
    size_t view_stride = in_stride;
    uint32_t view_row0 = 0;
    if (need_h) {
        tmp = malloc(out_stride * (r1 - r0));
        if (!tmp) {
            st = mmrt_error_set(err, MMRT_ERR_NO_MEMORY,
                                "resize: cannot allocate the %ux%u intermediate", width,
                                r1 - r0);
            goto out;
        }
        h_pass(in->pixels + (size_t)r0 * in_stride, in_stride, 0, r1 - r0, &hx, width, tmp,
               out_stride);
        view = tmp;
        view_stride = out_stride;
        view_row0 = r0;
    }
    if (need_v) {
        v_pass(view, view_stride, view_row0, width, &vy, height, img->pixels, out_stride);
    } else {
        for (uint32_t j = 0; j < height; j++)
            memcpy(img->pixels + (size_t)j * out_stride,
                   view + (size_t)(y + j - view_row0) * view_stride, out_stride);
    }
out:
    axis_free(&hx);
    axis_free(&vy);
    free(tmp);
    if (st == MMRT_OK)
        *out = img;
    else
        mmrt_image_destroy(img);
    return st;
}

mmrt_status mmrt_preprocess_resize(const struct mmrt_image *in, uint32_t out_width,
                                   uint32_t out_height, enum mmrt_resample filter,
                                   struct mmrt_image **out, struct mmrt_error *err)
{
    return mmrt_preprocess_resize_window(in, out_width, out_height, filter, 0, 0, out_width,
                                         out_height, out, err);
}

mmrt_status mmrt_preprocess_shortest_edge_size(uint32_t width, uint32_t height,
                                               uint32_t shortest_edge, uint32_t *out_width,
                                               uint32_t *out_height, struct mmrt_error *err)
{
    if (width == 0 || height == 0 || shortest_edge == 0 || !out_width || !out_height)
        return mmrt_error_set(err, MMRT_ERR_INVALID_ARG,
                              "shortest-edge resize of %ux%u to %u: zero size", width, height,
                              shortest_edge);
    const bool portrait = width <= height; /* transformers: short, long = (w, h) if w <= h */
    const uint32_t shrt = portrait ? width : height, lng = portrait ? height : width;
    /* int(s * long / short): exact integer product, float64 true division, truncation */
    const double q = (double)((uint64_t)shortest_edge * lng) / (double)shrt;
    if (q >= (double)MMRT_PREPROCESS_MAX_SIDE + 1.0)
        return mmrt_error_set(err, MMRT_ERR_INVALID_ARG,
                              "shortest-edge resize of %ux%u to %u gives a side of %.0f, over "
                              "%u", width, height, shortest_edge, q, MMRT_PREPROCESS_MAX_SIDE);
    const uint32_t new_long = (uint32_t)q;
    *out_width = portrait ? shortest_edge : new_long;
    *out_height = portrait ? new_long : shortest_edge;
    return MMRT_OK;
}

/* ---------------------------------------------------------------------------------------- */
/* crop / pad                                                                               */

mmrt_status mmrt_preprocess_crop(const struct mmrt_image *in, int64_t left, int64_t top,
                                 uint32_t width, uint32_t height, const uint8_t fill[3],
                                 struct mmrt_image **out, struct mmrt_error *err)
{
    mmrt_status st = check_image(in, "crop", err);
    if (st != MMRT_OK)
        return st;
    /* offsets beyond ±2^40 cannot overlap any image; refusing them keeps the sums exact */
    const int64_t far = (int64_t)1 << 40;
    if (!out || !fill || left < -far || left > far || top < -far || top > far)
        return mmrt_error_set(err, MMRT_ERR_INVALID_ARG, "crop: invalid arguments");
    struct mmrt_image *img = NULL;
    st = mmrt_image_create(width, height, &img, err);
    if (st != MMRT_OK)
        return st;
    const int64_t x0 = left < 0 ? 0 : left;
    const int64_t x1 = left + width < (int64_t)in->width ? left + width : (int64_t)in->width;
    const bool all_inside = left >= 0 && top >= 0 && x1 == left + width &&
                            top + height <= (int64_t)in->height;
    if (!all_inside && (fill[0] || fill[1] || fill[2])) {
        for (size_t i = 0; i < (size_t)width * height; i++)
            memcpy(img->pixels + 3 * i, fill, 3);
    }
    if (x0 < x1) {
        for (uint32_t j = 0; j < height; j++) {
            int64_t sy = top + j;
            if (sy < 0 || sy >= (int64_t)in->height)
                continue;
            memcpy(img->pixels + ((size_t)j * width + (size_t)(x0 - left)) * 3,
                   in->pixels + ((size_t)sy * in->width + (size_t)x0) * 3,
                   (size_t)(x1 - x0) * 3);
        }
    }
    *out = img;
    return MMRT_OK;
}

mmrt_status mmrt_preprocess_center_crop(const struct mmrt_image *in, uint32_t width,
                                        uint32_t height, struct mmrt_image **out,
                                        struct mmrt_error *err)
{
    mmrt_status st = check_image(in, "center crop", err);
    if (st != MMRT_OK)
        return st;
    static const uint8_t zero[3] = {0, 0, 0};
    return mmrt_preprocess_crop(in, floor_half((int64_t)in->width - width),
                                floor_half((int64_t)in->height - height), width, height, zero,
                                out, err);
}

mmrt_status mmrt_preprocess_pad(const struct mmrt_image *in, uint32_t left, uint32_t top,
                                uint32_t right, uint32_t bottom, const uint8_t fill[3],
                                struct mmrt_image **out, struct mmrt_error *err)
{
    mmrt_status st = check_image(in, "pad", err);
    if (st != MMRT_OK)
        return st;
    const uint64_t w = (uint64_t)in->width + left + right, h = (uint64_t)in->height + top + bottom;
    if (w > MMRT_IMAGE_MAX_CREATE_SIDE || h > MMRT_IMAGE_MAX_CREATE_SIDE)
        return mmrt_error_set(err, MMRT_ERR_INVALID_ARG, "pad: result %llux%llu is too large",
                              (unsigned long long)w, (unsigned long long)h);
    return mmrt_preprocess_crop(in, -(int64_t)left, -(int64_t)top, (uint32_t)w, (uint32_t)h,
                                fill, out, err);
}

/* ---------------------------------------------------------------------------------------- */
/* float conversion, patches                                                                */

static mmrt_status check_norm(const struct mmrt_preprocess_normalize *n, const char *fn,
                              struct mmrt_error *err)
{
    if (!n)
        return mmrt_error_set(err, MMRT_ERR_INVALID_ARG, "%s: no normalization parameters",
                              fn);
    if (n->do_rescale && !(isfinite(n->rescale_factor) && n->rescale_factor > 0))
        return mmrt_error_set(err, MMRT_ERR_INVALID_ARG, "%s: rescale_factor %g is not > 0",
                              fn, n->rescale_factor);
    for (int c = 0; n->do_normalize && c < 3; c++) {
        /* the float32 casts must stay finite and std nonzero, or the output is inf/NaN */
        if (!isfinite(n->mean[c]) || fabs(n->mean[c]) > FLT_MAX || !isfinite(n->std[c]) ||
            !((float)n->std[c] > 0) || n->std[c] > FLT_MAX)
            return mmrt_error_set(err, MMRT_ERR_INVALID_ARG,
                                  "%s: mean[%d] = %g / std[%d] = %g out of range", fn, c,
                                  n->mean[c], c, n->std[c]);
    }
    return MMRT_OK;
}

mmrt_status mmrt_preprocess_to_chw(const struct mmrt_image *in,
                                   const struct mmrt_preprocess_normalize *norm, float *out,
                                   size_t n_out, struct mmrt_error *err)
{
    mmrt_status st = check_image(in, "to_chw", err);
    if (st == MMRT_OK)
        st = check_norm(norm, "to_chw", err);
    if (st != MMRT_OK)
        return st;
    const size_t plane = (size_t)in->width * in->height;
    if (!out || n_out / 3 < plane)
        return mmrt_error_set(err, MMRT_ERR_INVALID_ARG,
                              "to_chw: output holds %zu floats, [3][%u][%u] needs %zu", n_out,
                              in->height, in->width, 3 * plane);
    float lut[3][256];
    for (int c = 0; c < 3; c++) {
        const float mean = (float)norm->mean[c], std = (float)norm->std[c];
        for (int v = 0; v < 256; v++) {
            float x = norm->do_rescale ? (float)((double)v * norm->rescale_factor) : (float)v;
            if (norm->do_normalize)
                x = (x - mean) / std;
            lut[c][v] = x;
        }
    }
    for (size_t i = 0; i < plane; i++) {
        const uint8_t *p = in->pixels + 3 * i;
        out[i] = lut[0][p[0]];
        out[plane + i] = lut[1][p[1]];
        out[2 * plane + i] = lut[2][p[2]];
    }
    return MMRT_OK;
}

mmrt_status mmrt_preprocess_patchify(const float *chw, uint32_t channels, uint32_t height,
                                     uint32_t width, uint32_t patch_h, uint32_t patch_w,
                                     enum mmrt_patch_order order, float *out, size_t n_out,
                                     struct mmrt_error *err)
{
    if (!chw || !out || channels == 0 || height == 0 || width == 0 || patch_h == 0 ||
        patch_w == 0 || (order != MMRT_PATCH_CHW && order != MMRT_PATCH_HWC))
        return mmrt_error_set(err, MMRT_ERR_INVALID_ARG, "patchify: invalid arguments");
    if (height % patch_h || width % patch_w)
        return mmrt_error_set(err, MMRT_ERR_INVALID_ARG,
                              "patchify: %ux%u is not a multiple of the %ux%u patch", width,
                              height, patch_w, patch_h);
    const uint64_t total = (uint64_t)channels * height * width;
    if (total > n_out)
        return mmrt_error_set(err, MMRT_ERR_INVALID_ARG,
                              "patchify: output holds %zu floats, needs %llu", n_out,
                              (unsigned long long)total);
    const uint32_t gw = width / patch_w, gh = height / patch_h;
    const size_t psize = (size_t)channels * patch_h * patch_w;
    for (uint32_t gy = 0; gy < gh; gy++)
        for (uint32_t gx = 0; gx < gw; gx++) {
            float *dst = out + ((size_t)gy * gw + gx) * psize;
            for (uint32_t c = 0; c < channels; c++)
                for (uint32_t py = 0; py < patch_h; py++)
                    for (uint32_t px = 0; px < patch_w; px++) {
                        float v = chw[((size_t)c * height + (size_t)gy * patch_h + py) * width +
                                      (size_t)gx * patch_w + px];
                        size_t o = order == MMRT_PATCH_CHW
                                       ? ((size_t)c * patch_h + py) * patch_w + px
                                       : ((size_t)py * patch_w + px) * channels + c;
                        dst[o] = v;
                    }
        }
    return MMRT_OK;
}

/* ---------------------------------------------------------------------------------------- */
/* CLIP                                                                                     */

void mmrt_clip_preprocess_config_default(struct mmrt_clip_preprocess_config *cfg)
{
    static const double mean[3] = MMRT_CLIP_MEAN, std[3] = MMRT_CLIP_STD;
    *cfg = (struct mmrt_clip_preprocess_config){
        .do_convert_rgb = true,
        .do_resize = true,
        .resize_mode = MMRT_RESIZE_SHORTEST_EDGE,
        .shortest_edge = 224,
        .resample = MMRT_RESAMPLE_BICUBIC,
        .do_center_crop = true,
        .crop_width = 224,
        .crop_height = 224,
        .norm = {.do_rescale = true, .rescale_factor = 1.0 / 255, .do_normalize = true},
    };
    memcpy(cfg->norm.mean, mean, sizeof mean);
    memcpy(cfg->norm.std, std, sizeof std);
}

static mmrt_status check_clip(const struct mmrt_clip_preprocess_config *c,
                              struct mmrt_error *err)
{
    if (!c)
        return mmrt_error_set(err, MMRT_ERR_INVALID_ARG, "clip preprocess: no config");
    bool bad = false;
    if (c->do_resize) {
        bad |= c->resize_mode == MMRT_RESIZE_SHORTEST_EDGE
                   ? c->shortest_edge == 0 || c->shortest_edge > MMRT_CLIP_MAX_SIZE
                   : c->resize_mode != MMRT_RESIZE_EXACT || c->resize_width == 0 ||
                         c->resize_height == 0 || c->resize_width > MMRT_CLIP_MAX_SIZE ||
                         c->resize_height > MMRT_CLIP_MAX_SIZE;
        if (!filter_of(c->resample))
            return mmrt_error_set(err, MMRT_ERR_UNSUPPORTED,
                                  "clip preprocess: resample %d is not supported",
                                  (int)c->resample);
    }
    if (c->do_center_crop)
        bad |= c->crop_width == 0 || c->crop_height == 0 ||
               c->crop_width > MMRT_CLIP_MAX_SIZE || c->crop_height > MMRT_CLIP_MAX_SIZE;
    if (bad)
        return mmrt_error_set(err, MMRT_ERR_INVALID_ARG,
                              "clip preprocess: a resize or crop size is outside 1..%u",
                              MMRT_CLIP_MAX_SIZE);
    return check_norm(&c->norm, "clip preprocess", err);
}

/* The resize target (the input size when there is no resize). */
static mmrt_status clip_resize_size(uint32_t w, uint32_t h,
                                    const struct mmrt_clip_preprocess_config *c, uint32_t *rw,
                                    uint32_t *rh, struct mmrt_error *err)
{
    if (!c->do_resize) {
        *rw = w;
        *rh = h;
        return MMRT_OK;
    }
    if (c->resize_mode == MMRT_RESIZE_EXACT) {
        *rw = c->resize_width;
        *rh = c->resize_height;
        return MMRT_OK;
    }
    return mmrt_preprocess_shortest_edge_size(w, h, c->shortest_edge, rw, rh, err);
}

mmrt_status mmrt_preprocess_clip_output_size(uint32_t width, uint32_t height,
                                             const struct mmrt_clip_preprocess_config *cfg,
                                             uint32_t *out_width, uint32_t *out_height,
                                             struct mmrt_error *err)
{
    mmrt_status st = check_clip(cfg, err);
    if (st != MMRT_OK)
        return st;
    if (!out_width || !out_height || width == 0 || height == 0)
        return mmrt_error_set(err, MMRT_ERR_INVALID_ARG, "clip preprocess: invalid arguments");
    uint32_t rw, rh;
    st = clip_resize_size(width, height, cfg, &rw, &rh, err);
    if (st != MMRT_OK)
        return st;
    /* without a crop the whole resize is the output: keep it within the decoder's default
     * pixel limit (a shortest-edge resize of 1×5000 would be 336×1 680 000) */
    if (!cfg->do_center_crop && (uint64_t)rw * rh > MMRT_IMAGE_DEFAULT_MAX_PIXELS)
        return mmrt_error_set(err, MMRT_ERR_INVALID_ARG,
                              "clip preprocess: uncropped output %ux%u has more than %llu "
                              "pixels", rw, rh,
                              (unsigned long long)MMRT_IMAGE_DEFAULT_MAX_PIXELS);
    *out_width = cfg->do_center_crop ? cfg->crop_width : rw;
    *out_height = cfg->do_center_crop ? cfg->crop_height : rh;
    return MMRT_OK;
}

mmrt_status mmrt_preprocess_clip(const struct mmrt_image *img,
                                 const struct mmrt_clip_preprocess_config *cfg, float *out,
                                 size_t n_out, struct mmrt_error *err)
{
    mmrt_status st = check_image(img, "clip preprocess", err);
    uint32_t ow, oh, rw, rh;
    if (st == MMRT_OK)
        st = mmrt_preprocess_clip_output_size(img->width, img->height, cfg, &ow, &oh, err);
    if (st == MMRT_OK)
        st = clip_resize_size(img->width, img->height, cfg, &rw, &rh, err);
    if (st != MMRT_OK)
        return st;
    if (!out || n_out / 3 / ow < oh)
        return mmrt_error_set(err, MMRT_ERR_INVALID_ARG,
                              "clip preprocess: output holds %zu floats, [3][%u][%u] needed",
                              n_out, oh, ow);
    /* the crop in resized coordinates (transformers' floor division), and the part of it
     * that overlaps the resized image: only that part is resampled */
    const int64_t left = cfg->do_center_crop ? floor_half((int64_t)rw - ow) : 0;
    const int64_t top = cfg->do_center_crop ? floor_half((int64_t)rh - oh) : 0;
    const int64_t x0 = left > 0 ? left : 0, y0 = top > 0 ? top : 0;
    const int64_t x1 = left + ow < (int64_t)rw ? left + ow : (int64_t)rw;
    const int64_t y1 = top + oh < (int64_t)rh ? top + oh : (int64_t)rh;
    static const uint8_t zero[3] = {0, 0, 0};
    struct mmrt_image *win = NULL, *crop = NULL;
    if (cfg->do_resize)
        st = mmrt_preprocess_resize_window(img, rw, rh, cfg->resample, (uint32_t)x0,
                                           (uint32_t)y0, (uint32_t)(x1 - x0),
                                           (uint32_t)(y1 - y0), &win, err);
    if (st == MMRT_OK) {
        const struct mmrt_image *src = win ? win : img;
        const int64_t ox = win ? x0 : 0, oy = win ? y0 : 0; /* src's origin in resized coords */
        st = mmrt_preprocess_crop(src, left - ox, top - oy, ow, oh, zero, &crop, err);
    }
    if (st == MMRT_OK)
        st = mmrt_preprocess_to_chw(crop, &cfg->norm, out, n_out, err);
    mmrt_image_destroy(win);
    mmrt_image_destroy(crop);
    return st;
}

/* ---------------------------------------------------------------------------------------- */
/* preprocessor_config.json                                                                 */

/* An integer member in [1, MMRT_CLIP_MAX_SIZE]. */
static mmrt_status size_member(const json_t *obj, const char *key, const char *what,
                               uint32_t *out, struct mmrt_error *err)
{
    long long v;
    mmrt_status st = mmrt_json_get_int(obj, key, what, 1, MMRT_CLIP_MAX_SIZE, &v, err);
    if (st == MMRT_OK)
        *out = (uint32_t)v;
    return st;
}

static bool present(const json_t *obj, const char *key)
{
    const json_t *v = json_object_get(obj, key);
    return v && !json_is_null(v);
}

/* "size": n | {"shortest_edge": n} | {"height": h, "width": w} */
static mmrt_status parse_size(const json_t *obj, const char *what,
                              struct mmrt_clip_preprocess_config *c, struct mmrt_error *err)
{
    const json_t *v = json_object_get(obj, "size");
    if (!v || json_is_null(v))
        return MMRT_OK;
    if (json_is_integer(v)) {
        c->resize_mode = MMRT_RESIZE_SHORTEST_EDGE;
        return size_member(obj, "size", what, &c->shortest_edge, err);
    }
    char sub[256];
    snprintf(sub, sizeof sub, "%s: size", what);
    if (!json_is_object(v))
        return mmrt_error_set(err, MMRT_ERR_FORMAT,
                              "%s: \"size\" must be an integer or an object", what);
    if (present(v, "shortest_edge") && present(v, "longest_edge"))
        return mmrt_error_set(err, MMRT_ERR_UNSUPPORTED,
                              "%s: \"size\" with both shortest_edge and longest_edge is not "
                              "supported for CLIP preprocessing", what);
    if (present(v, "shortest_edge")) {
        c->resize_mode = MMRT_RESIZE_SHORTEST_EDGE;
        return size_member(v, "shortest_edge", sub, &c->shortest_edge, err);
    }
    if (present(v, "height") && present(v, "width")) {
        c->resize_mode = MMRT_RESIZE_EXACT;
        mmrt_status st = size_member(v, "height", sub, &c->resize_height, err);
        return st != MMRT_OK ? st : size_member(v, "width", sub, &c->resize_width, err);
    }
    return mmrt_error_set(err, MMRT_ERR_FORMAT,
                          "%s: \"size\" needs shortest_edge, or height and width", what);
}

/* "crop_size": n | {"height": h, "width": w} */
static mmrt_status parse_crop(const json_t *obj, const char *what,
                              struct mmrt_clip_preprocess_config *c, struct mmrt_error *err)
{
    const json_t *v = json_object_get(obj, "crop_size");
    if (!v || json_is_null(v))
        return MMRT_OK;
    if (json_is_integer(v)) {
        mmrt_status st = size_member(obj, "crop_size", what, &c->crop_height, err);
        c->crop_width = c->crop_height;
        return st;
    }
    if (!json_is_object(v))
        return mmrt_error_set(err, MMRT_ERR_FORMAT,
                              "%s: \"crop_size\" must be an integer or an object", what);
    char sub[256];
    snprintf(sub, sizeof sub, "%s: crop_size", what);
    mmrt_status st = size_member(v, "height", sub, &c->crop_height, err);
    return st != MMRT_OK ? st : size_member(v, "width", sub, &c->crop_width, err);
}

/* "image_mean" / "image_std": a number (all channels) or a list of 3 numbers. */
static mmrt_status parse_triple(const json_t *obj, const char *key, const char *what,
                                double lo, double hi, double out[3], struct mmrt_error *err)
{
    const json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v))
        return MMRT_OK;
    double tmp[3];
    if (json_is_number(v)) {
        tmp[0] = tmp[1] = tmp[2] = json_number_value(v);
    } else if (json_is_array(v) && json_array_size(v) == 3) {
        for (size_t i = 0; i < 3; i++) {
            const json_t *e = json_array_get(v, i);
            if (!json_is_number(e))
                return mmrt_error_set(err, MMRT_ERR_FORMAT,
                                      "%s: \"%s\"[%zu] must be a number", what, key, i);
            tmp[i] = json_number_value(e);
        }
    } else {
        return mmrt_error_set(err, MMRT_ERR_FORMAT,
                              "%s: \"%s\" must be a number or a list of 3 numbers", what, key);
    }
    for (int i = 0; i < 3; i++)
        if (!isfinite(tmp[i]) || tmp[i] < lo || tmp[i] > hi)
            return mmrt_error_set(err, MMRT_ERR_FORMAT,
                                  "%s: \"%s\"[%d] = %g is outside [%g, %g]", what, key, i,
                                  tmp[i], lo, hi);
    memcpy(out, tmp, sizeof tmp);
    return MMRT_OK;
}

mmrt_status mmrt_clip_preprocess_config_from_json(const json_t *obj, const char *what,
                                                  struct mmrt_clip_preprocess_config *cfg,
                                                  struct mmrt_error *err)
{
    if (!what)
        what = "preprocessor_config.json";
    if (!obj || !json_is_object(obj) || !cfg)
        return mmrt_error_set(err, MMRT_ERR_FORMAT, "%s: expected a JSON object", what);
    struct mmrt_clip_preprocess_config c;
    mmrt_clip_preprocess_config_default(&c);
    long long resample;
    mmrt_status st = MMRT_OK;
#define TRY(call)               \
    do {                        \
        st = (call);            \
        if (st != MMRT_OK)      \
            return st;          \
    } while (0)
    TRY(mmrt_json_opt_bool(obj, "do_convert_rgb", what, c.do_convert_rgb, &c.do_convert_rgb,
                           err));
    TRY(mmrt_json_opt_bool(obj, "do_resize", what, c.do_resize, &c.do_resize, err));
    TRY(parse_size(obj, what, &c, err));
    TRY(mmrt_json_opt_int(obj, "resample", what, 0, 5, c.resample, &resample, err));
    if (resample == MMRT_RESAMPLE_NEAREST)
        return mmrt_error_set(err, MMRT_ERR_UNSUPPORTED,
                              "%s: \"resample\" 0 (nearest) is not supported", what);
    c.resample = (enum mmrt_resample)resample;
    TRY(mmrt_json_opt_bool(obj, "do_center_crop", what, c.do_center_crop, &c.do_center_crop,
                           err));
    TRY(parse_crop(obj, what, &c, err));
    TRY(mmrt_json_opt_bool(obj, "do_rescale", what, c.norm.do_rescale, &c.norm.do_rescale,
                           err));
    TRY(mmrt_json_opt_number(obj, "rescale_factor", what, 0.0, 1.0, c.norm.rescale_factor,
                             &c.norm.rescale_factor, err));
    if (!(c.norm.rescale_factor > 0.0))
        return mmrt_error_set(err, MMRT_ERR_FORMAT, "%s: \"rescale_factor\" must be > 0", what);
    TRY(mmrt_json_opt_bool(obj, "do_normalize", what, c.norm.do_normalize,
                           &c.norm.do_normalize, err));
    TRY(parse_triple(obj, "image_mean", what, -1000.0, 1000.0, c.norm.mean, err));
    TRY(parse_triple(obj, "image_std", what, 1e-6, 1000.0, c.norm.std, err));
#undef TRY
    *cfg = c;
    return MMRT_OK;
}

/* ---------------------------------------------------------------------------------------- */
/* Qwen2-VL                                                                                 */

mmrt_status mmrt_preprocess_smart_resize(uint32_t height, uint32_t width, uint32_t factor,
                                         uint64_t min_pixels, uint64_t max_pixels,
                                         uint32_t *out_height, uint32_t *out_width,
                                         enum mmrt_smart_resize_branch *branch,
                                         struct mmrt_error *err)
{
    if (!out_height || !out_width || height == 0 || width == 0 || factor == 0 ||
        min_pixels == 0 || max_pixels == 0)
        return mmrt_error_set(err, MMRT_ERR_INVALID_ARG,
                              "smart_resize: invalid arguments (%ux%u, factor %u, pixels %llu…"
                              "%llu)", width, height, factor, (unsigned long long)min_pixels,
                              (unsigned long long)max_pixels);
    const double h = height, w = width, f = factor;
    const double ratio = (h > w ? h : w) / (h < w ? h : w);
    if (ratio > 200)
        return mmrt_error_set(err, MMRT_ERR_INVALID_ARG,
                              "image %ux%u: absolute aspect ratio must be smaller than 200, got "
                              "%.17g", width, height, ratio);
    /* Python: round(h / factor) * factor, banker's rounding of the float64 quotient */
    int64_t hb = (int64_t)nearbyint(h / f) * factor, wb = (int64_t)nearbyint(w / f) * factor;
    enum mmrt_smart_resize_branch b = MMRT_SMART_RESIZE_ROUND;
    if ((uint64_t)hb * (uint64_t)wb > max_pixels) {
        const double beta = sqrt((double)((uint64_t)height * width) / (double)max_pixels);
        hb = (int64_t)floor(h / beta / f) * factor;
        wb = (int64_t)floor(w / beta / f) * factor;
        hb = hb > factor ? hb : factor;
        wb = wb > factor ? wb : factor;
        b = MMRT_SMART_RESIZE_MAX_PIXELS;
    } else if ((uint64_t)hb * (uint64_t)wb < min_pixels) {
        const double beta = sqrt((double)min_pixels / (double)((uint64_t)height * width));
        hb = (int64_t)ceil(h * beta / f) * factor;
        wb = (int64_t)ceil(w * beta / f) * factor;
        b = MMRT_SMART_RESIZE_MIN_PIXELS;
    }
    if (hb < 1 || wb < 1 || hb > (int64_t)MMRT_PREPROCESS_MAX_SIDE ||
        wb > (int64_t)MMRT_PREPROCESS_MAX_SIDE)
        return mmrt_error_set(err, MMRT_ERR_INVALID_ARG,
                              "smart_resize: image %ux%u would become %lldx%lld", width, height,
                              (long long)wb, (long long)hb);
    *out_height = (uint32_t)hb;
    *out_width = (uint32_t)wb;
    if (branch)
        *branch = b;
    return MMRT_OK;
}

void mmrt_qwen2vl_preprocess_config_default(struct mmrt_qwen2vl_preprocess_config *cfg)
{
    static const double mean[3] = MMRT_CLIP_MEAN, std[3] = MMRT_CLIP_STD;
    *cfg = (struct mmrt_qwen2vl_preprocess_config){
        .do_resize = true,
        .min_pixels = 56 * 56,
        .max_pixels = 28 * 28 * 1280,
        .resample = MMRT_RESAMPLE_BICUBIC,
        .patch_size = 14,
        .temporal_patch_size = 2,
        .merge_size = 2,
        .norm = {.do_rescale = true, .rescale_factor = 1.0 / 255, .do_normalize = true},
    };
    memcpy(cfg->norm.mean, mean, sizeof mean);
    memcpy(cfg->norm.std, std, sizeof std);
}

static mmrt_status check_qwen2vl(const struct mmrt_qwen2vl_preprocess_config *c,
                                 struct mmrt_error *err)
{
    if (!c)
        return mmrt_error_set(err, MMRT_ERR_INVALID_ARG, "qwen2vl preprocess: no config");
    if (c->patch_size < 1 || c->patch_size > 1024 || c->merge_size < 1 || c->merge_size > 16 ||
        c->temporal_patch_size < 1 || c->temporal_patch_size > 16 || c->min_pixels < 1 ||
        c->min_pixels > MMRT_QWEN2VL_MAX_PIXELS || c->max_pixels < 1 ||
        c->max_pixels > MMRT_QWEN2VL_MAX_PIXELS)
        return mmrt_error_set(err, MMRT_ERR_INVALID_ARG,
                              "qwen2vl preprocess: patch %u, temporal %u, merge %u or pixels "
                              "%llu…%llu out of range", c->patch_size, c->temporal_patch_size,
                              c->merge_size, (unsigned long long)c->min_pixels,
                              (unsigned long long)c->max_pixels);
    if (c->do_resize && !filter_of(c->resample))
        return mmrt_error_set(err, MMRT_ERR_UNSUPPORTED,
                              "qwen2vl preprocess: resample %d is not supported",
                              (int)c->resample);
    return check_norm(&c->norm, "qwen2vl preprocess", err);
}

mmrt_status mmrt_preprocess_qwen2vl_plan(uint32_t width, uint32_t height,
                                         const struct mmrt_qwen2vl_preprocess_config *cfg,
                                         uint32_t *out_width, uint32_t *out_height,
                                         int32_t grid_thw[3], struct mmrt_error *err)
{
    mmrt_status st = check_qwen2vl(cfg, err);
    if (st != MMRT_OK)
        return st;
    if (!out_width || !out_height || !grid_thw || width == 0 || height == 0)
        return mmrt_error_set(err, MMRT_ERR_INVALID_ARG, "qwen2vl preprocess: invalid arguments");
    const uint32_t factor = cfg->patch_size * cfg->merge_size;
    uint32_t rw = width, rh = height;
    if (cfg->do_resize) {
        st = mmrt_preprocess_smart_resize(height, width, factor, cfg->min_pixels,
                                          cfg->max_pixels, &rh, &rw, NULL, err);
        if (st != MMRT_OK)
            return st;
    } else if (width % factor || height % factor) {
        /* transformers' reshape into merge windows fails on such an image */
        return mmrt_error_set(err, MMRT_ERR_INVALID_ARG,
                              "image %ux%u: without do_resize both sides must be multiples of "
                              "%u (patch_size × merge_size)", width, height, factor);
    }
    if (rh / cfg->patch_size > INT32_MAX || rw / cfg->patch_size > INT32_MAX)
        return mmrt_error_set(err, MMRT_ERR_INVALID_ARG, "qwen2vl preprocess: grid too large");
    *out_width = rw;
    *out_height = rh;
    grid_thw[0] = 1; /* one frame, repeated to temporal_patch_size frames */
    grid_thw[1] = (int32_t)(rh / cfg->patch_size);
    grid_thw[2] = (int32_t)(rw / cfg->patch_size);
    return MMRT_OK;
}

mmrt_status mmrt_preprocess_qwen2vl(const struct mmrt_image *img,
                                    const struct mmrt_qwen2vl_preprocess_config *cfg, float *out,
                                    size_t n_out, int32_t grid_thw[3], struct mmrt_error *err)
{
    uint32_t rw, rh;
    int32_t grid[3];
    mmrt_status st = check_image(img, "qwen2vl preprocess", err);
    if (st == MMRT_OK)
        st = mmrt_preprocess_qwen2vl_plan(img->width, img->height, cfg, &rw, &rh, grid, err);
    if (st != MMRT_OK)
        return st;
    const uint32_t P = cfg->patch_size, T = cfg->temporal_patch_size, M = cfg->merge_size;
    const size_t per = (size_t)3 * T * P * P, n_patches = (size_t)grid[1] * (size_t)grid[2];
    if (!out || n_out / per < n_patches)
        return mmrt_error_set(err, MMRT_ERR_INVALID_ARG,
                              "qwen2vl preprocess: output holds %zu floats, [%zu][%zu] needed",
                              n_out, n_patches, per);
    struct mmrt_image *resized = NULL;
    const struct mmrt_image *src = img;
    if (rw != img->width || rh != img->height) {
        st = mmrt_preprocess_resize(img, rw, rh, cfg->resample, &resized, err);
        if (st != MMRT_OK)
            return st;
        src = resized;
    }
    const size_t plane = (size_t)rw * rh;
    float *chw = malloc(3 * plane * sizeof *chw);
    if (!chw) {
        mmrt_image_destroy(resized);
        return mmrt_error_set(err, MMRT_ERR_NO_MEMORY, "qwen2vl preprocess: out of memory");
    }
    st = mmrt_preprocess_to_chw(src, &cfg->norm, chw, 3 * plane, err);
    mmrt_image_destroy(resized);
    if (st != MMRT_OK) {
        free(chw);
        return st;
    }
    /* transformers views the frames as (t, C, gh/M, M, P, gw/M, M, P) and permutes to
     * (gh/M, gw/M, M, M, C, t, P, P): merge blocks in raster order, then their patches. */
    const uint32_t gh = (uint32_t)grid[1], gw = (uint32_t)grid[2];
    float *dst = out;
    for (uint32_t br = 0; br < gh / M; br++)
        for (uint32_t bc = 0; bc < gw / M; bc++)
            for (uint32_t mh = 0; mh < M; mh++)
                for (uint32_t mw = 0; mw < M; mw++) {
                    const size_t y0 = (size_t)(br * M + mh) * P, x0 = (size_t)(bc * M + mw) * P;
                    for (uint32_t c = 0; c < 3; c++)
                        for (uint32_t t = 0; t < T; t++) /* the same frame T times */
                            for (uint32_t py = 0; py < P; py++) {
                                memcpy(dst, chw + c * plane + (y0 + py) * rw + x0,
                                       P * sizeof *dst);
                                dst += P;
                            }
                }
    free(chw);
    memcpy(grid_thw, grid, sizeof grid);
    return MMRT_OK;
}

/* "size": {"shortest_edge": min_pixels, "longest_edge": max_pixels} */
static mmrt_status pixels_member(const json_t *obj, const char *key, const char *what,
                                 uint64_t *out, struct mmrt_error *err)
{
    long long v;
    mmrt_status st = mmrt_json_opt_int(obj, key, what, 1, (long long)MMRT_QWEN2VL_MAX_PIXELS,
                                       (long long)*out, &v, err);
    if (st == MMRT_OK)
        *out = (uint64_t)v;
    return st;
}

static mmrt_status small_member(const json_t *obj, const char *key, const char *what,
                                long long max, uint32_t *out, struct mmrt_error *err)
{
    long long v;
    mmrt_status st = mmrt_json_opt_int(obj, key, what, 1, max, *out, &v, err);
    if (st == MMRT_OK)
        *out = (uint32_t)v;
    return st;
}

mmrt_status mmrt_qwen2vl_preprocess_config_from_json(const json_t *obj, const char *what,
                                                     struct mmrt_qwen2vl_preprocess_config *cfg,
                                                     struct mmrt_error *err)
{
    if (!what)
        what = "preprocessor_config.json";
    if (!obj || !json_is_object(obj) || !cfg)
        return mmrt_error_set(err, MMRT_ERR_FORMAT, "%s: expected a JSON object", what);
    struct mmrt_qwen2vl_preprocess_config c;
    mmrt_qwen2vl_preprocess_config_default(&c);
    long long resample;
    bool rgb;
    mmrt_status st = MMRT_OK;
#define TRY(call)               \
    do {                        \
        st = (call);            \
        if (st != MMRT_OK)      \
            return st;          \
    } while (0)
    TRY(mmrt_json_opt_bool(obj, "do_convert_rgb", what, true, &rgb, err));
    TRY(mmrt_json_opt_bool(obj, "do_resize", what, c.do_resize, &c.do_resize, err));
    const json_t *size = json_object_get(obj, "size");
    if (size && !json_is_null(size)) {
        char sub[256];
        snprintf(sub, sizeof sub, "%s: size", what);
        if (!json_is_object(size) || !present(size, "shortest_edge") ||
            !present(size, "longest_edge"))
            return mmrt_error_set(err, MMRT_ERR_FORMAT,
                                  "%s: \"size\" must be an object with shortest_edge and "
                                  "longest_edge", what);
        TRY(pixels_member(size, "shortest_edge", sub, &c.min_pixels, err));
        TRY(pixels_member(size, "longest_edge", sub, &c.max_pixels, err));
    }
    TRY(pixels_member(obj, "min_pixels", what, &c.min_pixels, err));
    TRY(pixels_member(obj, "max_pixels", what, &c.max_pixels, err));
    TRY(mmrt_json_opt_int(obj, "resample", what, 0, 5, c.resample, &resample, err));
    if (resample == MMRT_RESAMPLE_NEAREST)
        return mmrt_error_set(err, MMRT_ERR_UNSUPPORTED,
                              "%s: \"resample\" 0 (nearest) is not supported", what);
    c.resample = (enum mmrt_resample)resample;
    TRY(mmrt_json_opt_bool(obj, "do_rescale", what, c.norm.do_rescale, &c.norm.do_rescale,
                           err));
    TRY(mmrt_json_opt_number(obj, "rescale_factor", what, 0.0, 1.0, c.norm.rescale_factor,
                             &c.norm.rescale_factor, err));
    if (!(c.norm.rescale_factor > 0.0))
        return mmrt_error_set(err, MMRT_ERR_FORMAT, "%s: \"rescale_factor\" must be > 0", what);
    TRY(mmrt_json_opt_bool(obj, "do_normalize", what, c.norm.do_normalize,
                           &c.norm.do_normalize, err));
    TRY(parse_triple(obj, "image_mean", what, -1000.0, 1000.0, c.norm.mean, err));
    TRY(parse_triple(obj, "image_std", what, 1e-6, 1000.0, c.norm.std, err));
    TRY(small_member(obj, "patch_size", what, 1024, &c.patch_size, err));
    TRY(small_member(obj, "temporal_patch_size", what, 16, &c.temporal_patch_size, err));
    TRY(small_member(obj, "merge_size", what, 16, &c.merge_size, err));
#undef TRY
    *cfg = c;
    return MMRT_OK;
}

/* ---------------------------------------------------------------------------------------- */
/* FuyuImageProcessor                                                                       */

/* {"height": h, "width": w} with both in [1, max]; *h, *w keep their defaults when absent. */
static mmrt_status fuyu_hw(const json_t *obj, const char *key, const char *what, long long max,
                           uint32_t *h, uint32_t *w, struct mmrt_error *err)
{
    const json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v))
        return MMRT_OK;
    if (!json_is_object(v))
        return mmrt_error_set(err, MMRT_ERR_FORMAT, "%s: \"%s\" must be an object with height "
                              "and width", what, key);
    long long hh, ww;
    mmrt_status st = mmrt_json_opt_int(v, "height", what, 1, max, *h, &hh, err);
    if (st == MMRT_OK)
        st = mmrt_json_opt_int(v, "width", what, 1, max, *w, &ww, err);
    if (st != MMRT_OK)
        return st;
    *h = (uint32_t)hh;
    *w = (uint32_t)ww;
    return MMRT_OK;
}

/* image_mean / image_std: one number for every channel, or a list of 3 (§5.4). */
static mmrt_status fuyu_per_channel(const json_t *obj, const char *key, const char *what,
                                    double def, double out[3], struct mmrt_error *err)
{
    const json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) {
        out[0] = out[1] = out[2] = def;
        return MMRT_OK;
    }
    if (json_is_number(v)) {
        out[0] = out[1] = out[2] = json_number_value(v);
        return MMRT_OK;
    }
    if (json_is_array(v) && json_array_size(v) == 3) {
        for (size_t i = 0; i < 3; i++) {
            if (!json_is_number(json_array_get(v, i)))
                return mmrt_error_set(err, MMRT_ERR_FORMAT, "%s: %s[%zu] is not a number", what,
                                      key, i);
            out[i] = json_number_value(json_array_get(v, i));
        }
        return MMRT_OK;
    }
    return mmrt_error_set(err, MMRT_ERR_FORMAT, "%s: %s must be a number or a list of 3", what,
                          key);
}

mmrt_status mmrt_fuyu_preprocess_config_from_json(const json_t *obj, const char *what,
                                                  int64_t patch,
                                                  struct mmrt_fuyu_preprocess_config *pp,
                                                  struct mmrt_error *err)
{
    if (!what)
        what = "preprocessor_config.json";
    if (!obj || !json_is_object(obj) || !pp)
        return mmrt_error_set(err, MMRT_ERR_FORMAT, "%s: expected a JSON object", what);
    if (patch < 1 || patch > 1024)
        return mmrt_error_set(err, MMRT_ERR_INVALID_ARG, "%s: the model's patch size %lld is "
                              "outside 1..1024", what, (long long)patch);
    struct mmrt_fuyu_preprocess_config p = { .do_resize = true, .target_h = 1080,
                                             .target_w = 1920 };
    uint32_t ph = (uint32_t)patch, pw = (uint32_t)patch;
    long long resample;
    double pad, rescale;
    bool do_pad, do_rescale, do_normalize;
    mmrt_status st = fuyu_hw(obj, "size", what, 1 << 15, &p.target_h, &p.target_w, err);
    if (st == MMRT_OK)
        st = fuyu_hw(obj, "patch_size", what, 1 << 10, &ph, &pw, err);
    if (st == MMRT_OK)
        st = mmrt_json_opt_bool(obj, "do_resize", what, true, &p.do_resize, err);
    if (st == MMRT_OK)
        st = mmrt_json_opt_int(obj, "resample", what, 0, 5, MMRT_RESAMPLE_BILINEAR, &resample,
                               err);
    if (st == MMRT_OK)
        st = mmrt_json_opt_bool(obj, "do_pad", what, true, &do_pad, err);
    if (st == MMRT_OK)
        st = mmrt_json_opt_number(obj, "padding_value", what, 0, 255, 1.0, &pad, err);
    if (st == MMRT_OK)
        st = mmrt_json_opt_bool(obj, "do_rescale", what, true, &do_rescale, err);
    if (st == MMRT_OK)
        st = mmrt_json_opt_number(obj, "rescale_factor", what, 1e-12, 1e6, 1.0 / 255.0, &rescale,
                                  err);
    if (st == MMRT_OK)
        st = mmrt_json_opt_bool(obj, "do_normalize", what, true, &do_normalize, err);
    if (st == MMRT_OK)
        st = fuyu_per_channel(obj, "image_mean", what, 0.5, p.norm.mean, err);
    if (st == MMRT_OK)
        st = fuyu_per_channel(obj, "image_std", what, 0.5, p.norm.std, err);
    if (st != MMRT_OK)
        return st;
    if (ph != patch || pw != patch)
        return mmrt_error_set(err, MMRT_ERR_FORMAT,
                              "%s: patch_size %u×%u differs from the model's patch_size %lld",
                              what, ph, pw, (long long)patch);
    if (p.target_h % patch != 0 || p.target_w % patch != 0)
        return mmrt_error_set(err, MMRT_ERR_FORMAT,
                              "%s: size %u×%u is not a multiple of the patch size %lld", what,
                              p.target_h, p.target_w, (long long)patch);
    /* Without padding the processor cannot cut partial edge patches; the model never runs
     * that way, so it is refused rather than guessed. */
    if (!do_pad)
        return mmrt_error_set(err, MMRT_ERR_UNSUPPORTED, "%s: do_pad false is not supported",
                              what);
    if (pad != floor(pad))
        return mmrt_error_set(err, MMRT_ERR_UNSUPPORTED,
                              "%s: padding_value %g is not a whole uint8 value", what, pad);
    /* As for CLIP and Qwen2-VL: refused here, not at the first image that needs a resize. */
    if (resample == MMRT_RESAMPLE_NEAREST)
        return mmrt_error_set(err, MMRT_ERR_UNSUPPORTED,
                              "%s: \"resample\" 0 (nearest) is not supported", what);
    for (int c = 0; c < 3; c++)
        if (!(p.norm.std[c] > 0) || !isfinite(p.norm.mean[c]))
            return mmrt_error_set(err, MMRT_ERR_FORMAT,
                                  "%s: image_std must be positive and image_mean finite", what);
    p.filter = (enum mmrt_resample)resample;
    p.pad_value = (uint8_t)pad;
    p.patch = (uint32_t)patch;
    p.norm.do_rescale = do_rescale;
    p.norm.rescale_factor = rescale;
    p.norm.do_normalize = do_normalize;
    *pp = p;
    return MMRT_OK;
}
