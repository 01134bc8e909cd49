/*
 * core/preprocess.h — model image preprocessing: the transformers "PIL backend" pipeline,
 * reproduced bit for bit where transformers is bit-deterministic.
 *
 * The reference is transformers' PIL path (v4 slow processors, v5 `*ImageProcessorPil`;
 * models.md §1.8, §1.9): images stay uint8 through resize / crop / pad (Pillow does the
 * resizing), and only then become float32 by rescale (×1/255 in float64, cast to float32) and
 * normalize ((x − mean) / std in float32). The primitives below are separate so each model
 * composes its own pipeline:
 *
 *   LLaVA-1.5 (CLIP):  shortest-edge resize → center crop → rescale+normalize   (§2.5)
 *   LLaVA-NeXT:        exact-size resize, pad, crop into tiles, then the CLIP steps (§3.2)
 *   Qwen2-VL:          smart_resize → rescale+normalize → temporal repeat, merge-window
 *                      patches (§4.4): mmrt_preprocess_qwen2vl()
 *   Fuyu:              bilinear exact-size resize → pad bottom/right → … → HWC patches (§5.4)
 *
 * mmrt_preprocess_clip() and mmrt_preprocess_qwen2vl() are composed here; the others belong
 * to their models.
 *
 * Layouts. uint8 images are struct mmrt_image (pixels [height][width][3], RGB). Float outputs
 * are channel-first: [3][height][width] float32, channel order R, G, B — what pixel_values
 * holds for one image.
 *
 * Numerics. Resizing is Pillow's libImaging/Resample.c for 8-bit images: a separable two-pass
 * convolution (a pass is skipped when its axis keeps its size), kernel support scaled by the
 * downscale factor, coefficients normalised in double and rounded to 22-bit fixed point,
 * accumulation in int32 from 1<<21, the result clipped to 0..255 — and an 8-bit intermediate
 * image between the passes, which makes the pass order visible in the result. The order is
 * Pillow 13's (PR #9549): vertical first when the height shrinks by more than twice as many
 * pixels as the width (out_h < in_h and in_h − out_h > 2·(in_w − out_w)), else horizontal
 * first. Pillow ≤ 12 always went horizontal first, so references made with it differ by a
 * level or two on those shapes (tall images shrunk, e.g. 400×1000 → 336×840). Results equal
 * Pillow 13's `Image.resize(size, resample)` exactly (the tests compare byte for byte; the
 * fixtures record the Pillow version).
 * Float steps are computed in the same precision and order as numpy, so pixel_values equal
 * transformers' bitwise on x86-64 (SSE arithmetic, no FMA contraction; the tests accept 1e-5).
 *
 * Degenerate sizes (I6): every function accepts 1×1 and extreme aspect ratios. A shortest-edge
 * resize of a 1×5000 image asks for a 336×1 680 000 image that is then cropped to 336×336;
 * mmrt_preprocess_resize_window() computes just the needed window (each output pixel of
 * Pillow's filter depends only on its own coefficients, so a window of the full result is
 * exactly a window of it), so memory follows the crop, not the virtual size.
 *
 * All functions are reentrant. Fallible ones write their outputs only on success.
 */
#ifndef MMRT_PREPROCESS_H
#define MMRT_PREPROCESS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "error.h"
#include "formats/image.h"
#include "formats/json.h"

/* Resampling filters, numbered as PIL.Image.Resampling and the "resample" key of
 * preprocessor_config.json. NEAREST takes a different path in Pillow and is not implemented
 * (MMRT_ERR_UNSUPPORTED); no model here uses it. */
enum mmrt_resample {
    MMRT_RESAMPLE_NEAREST = 0,
    MMRT_RESAMPLE_LANCZOS = 1,  /* support 3 */
    MMRT_RESAMPLE_BILINEAR = 2, /* support 1 (Fuyu) */
    MMRT_RESAMPLE_BICUBIC = 3,  /* support 2, Keys a = −0.5 (CLIP, NeXT, Qwen2-VL) */
    MMRT_RESAMPLE_BOX = 4,      /* support 0.5 */
    MMRT_RESAMPLE_HAMMING = 5,  /* support 1 */
};

/* Largest side of a (virtual) resize target: Pillow's int range. Images that are actually
 * allocated are bounded by MMRT_IMAGE_MAX_CREATE_SIDE. */
#define MMRT_PREPROCESS_MAX_SIDE 0x7fffffffu

/*
 * Size of a shortest-edge resize, exactly transformers' get_resize_output_image_size(
 * default_to_square=False): the shorter side becomes `shortest_edge`, the longer becomes
 * int(shortest_edge · long / short) — a float64 division truncated toward zero, not rounded
 * (models.md §1.8). A square stays square. The result can be far larger than the input
 * (1×5000 → 336×1 680 000); see mmrt_preprocess_resize_window().
 * MMRT_ERR_INVALID_ARG on a zero size, or a result side over MMRT_PREPROCESS_MAX_SIDE.
 */
mmrt_status mmrt_preprocess_shortest_edge_size(uint32_t width, uint32_t height,
                                               uint32_t shortest_edge, uint32_t *out_width,
                                               uint32_t *out_height, struct mmrt_error *err);

/*
 * PIL's img.resize((out_width, out_height), filter) for an RGB image: a new uint8 image.
 * A no-op size returns an exact copy. MMRT_ERR_INVALID_ARG (zero size), MMRT_ERR_UNSUPPORTED
 * (NEAREST or an unknown filter), MMRT_ERR_NO_MEMORY.
 */
mmrt_status mmrt_preprocess_resize(const struct mmrt_image *in, uint32_t out_width,
                                   uint32_t out_height, enum mmrt_resample filter,
                                   struct mmrt_image **out, struct mmrt_error *err);

/*
 * The window [x, x + width) × [y, y + height) of the image mmrt_preprocess_resize(in,
 * full_width, full_height, filter) would produce, computed without producing the rest:
 * byte-identical to cropping the full result. The window must lie inside the full size.
 */
mmrt_status mmrt_preprocess_resize_window(const struct mmrt_image *in, uint32_t full_width,
                                          uint32_t full_height, enum mmrt_resample filter,
                                          uint32_t x, uint32_t y, uint32_t width,
                                          uint32_t height, struct mmrt_image **out,
                                          struct mmrt_error *err);

/*
 * A width × height image whose pixel (i, j) is in(left + i, top + j), or `fill` (RGB) where
 * that lies outside `in`. left/top may be negative and the window may extend past any edge,
 * so this is crop and pad in one.
 */
mmrt_status mmrt_preprocess_crop(const struct mmrt_image *in, int64_t left, int64_t top,
                                 uint32_t width, uint32_t height, const uint8_t fill[3],
                                 struct mmrt_image **out, struct mmrt_error *err);

/*
 * transformers' center_crop to width × height: left = ⌊(W − width)/2⌋,
 * top = ⌊(H − height)/2⌋ with Python's floor division, so an odd excess puts the extra pixel
 * right/bottom. When the crop is larger than the image, transformers zero-pads (uint8 0,
 * before rescale) and centres the image at ⌈excess/2⌉ — the same formula with negative
 * offsets, which is what this does.
 */
mmrt_status mmrt_preprocess_center_crop(const struct mmrt_image *in, uint32_t width,
                                        uint32_t height, struct mmrt_image **out,
                                        struct mmrt_error *err);

/* Constant-colour padding: left/top/right/bottom pixels of `fill` around `in`
 * (numpy.pad mode "constant" on the uint8 image: LLaVA pad-to-square, NeXT, Fuyu). */
mmrt_status mmrt_preprocess_pad(const struct mmrt_image *in, uint32_t left, uint32_t top,
                                uint32_t right, uint32_t bottom, const uint8_t fill[3],
                                struct mmrt_image **out, struct mmrt_error *err);

/*
 * uint8 → float32 with transformers' rescale and normalize, per channel c:
 *   x = do_rescale ? (float)((double)v · rescale_factor) : (float)v
 *   x = do_normalize ? (x − (float)mean[c]) / (float)std[c] : x
 * rescale_factor > 0 and finite; std[c] > 0. Values are the JSON doubles; the casts to
 * float32 are where numpy makes them.
 */
struct mmrt_preprocess_normalize {
    bool do_rescale;
    double rescale_factor; /* 1/255 = 0.00392156862745098 */
    bool do_normalize;
    double mean[3];
    double std[3];
};

/* OPENAI_CLIP_MEAN / OPENAI_CLIP_STD (transformers image_utils), used by LLaVA and Qwen2-VL. */
#define MMRT_CLIP_MEAN {0.48145466, 0.4578275, 0.40821073}
#define MMRT_CLIP_STD {0.26862954, 0.26130258, 0.27577711}

/* Writes [3][in->height][in->width] float32 to out, which holds n_out floats.
 * MMRT_ERR_INVALID_ARG when n_out is too small or the parameters are out of range. */
mmrt_status mmrt_preprocess_to_chw(const struct mmrt_image *in,
                                   const struct mmrt_preprocess_normalize *norm, float *out,
                                   size_t n_out, struct mmrt_error *err);

/* Inner order of one flattened patch. */
enum mmrt_patch_order {
    MMRT_PATCH_CHW = 0, /* [c][py][px]: Conv2d weight order (CLIP, Qwen2-VL's inner c,ph,pw) */
    MMRT_PATCH_HWC = 1, /* [py][px][c]: Fuyu's image_patches */
};

/*
 * Cuts a channel-first image chw [channels][height][width] into patch_h × patch_w patches, in
 * row-major grid order (all patches of grid row 0, then row 1, …), each flattened in `order`:
 *   out [(height/patch_h)·(width/patch_w)][channels·patch_h·patch_w], n_out floats available.
 * height and width must be multiples of the patch size (pad first: Fuyu pads, Qwen2-VL's
 * smart_resize makes multiples of 28). Qwen2-VL's temporal duplication and 2×2 merge order
 * are model-specific and built on top of this by the model.
 */
mmrt_status mmrt_preprocess_patchify(const float *chw, uint32_t channels, uint32_t height,
                                     uint32_t width, uint32_t patch_h, uint32_t patch_w,
                                     enum mmrt_patch_order order, float *out, size_t n_out,
                                     struct mmrt_error *err);

/* ---------------------------------------------------------------------------------------- */
/* CLIPImageProcessor (LLaVA-1.5)                                                            */

enum mmrt_resize_mode {
    MMRT_RESIZE_SHORTEST_EDGE = 0, /* size: {"shortest_edge": n} or a bare integer */
    MMRT_RESIZE_EXACT = 1,         /* size: {"height": h, "width": w} */
};

/*
 * The keys of a CLIP preprocessor_config.json that change pixels. Defaults (from
 * mmrt_clip_preprocess_config_default) are CLIPImageProcessor's: shortest_edge 224, bicubic,
 * center crop 224×224, rescale 1/255, normalize with the OpenAI CLIP mean/std, convert RGB.
 * llava-1.5 uses 336 / 336.
 */
struct mmrt_clip_preprocess_config {
    bool do_convert_rgb; /* informational: mmrt images are always RGB (formats/image.h) */
    bool do_resize;
    enum mmrt_resize_mode resize_mode;
    uint32_t shortest_edge;              /* MMRT_RESIZE_SHORTEST_EDGE */
    uint32_t resize_width, resize_height; /* MMRT_RESIZE_EXACT */
    enum mmrt_resample resample;
    bool do_center_crop;
    uint32_t crop_width, crop_height;
    struct mmrt_preprocess_normalize norm;
};

/* Largest shortest_edge / crop / exact size a config may ask for. */
#define MMRT_CLIP_MAX_SIZE 16384u

void mmrt_clip_preprocess_config_default(struct mmrt_clip_preprocess_config *cfg);

/*
 * Reads the object of a preprocessor_config.json (keys: do_resize, size, resample,
 * do_center_crop, crop_size, do_rescale, rescale_factor, do_normalize, image_mean, image_std,
 * do_convert_rgb; missing keys keep the defaults; other keys are ignored). `size` and
 * `crop_size` may be integers (older configs) or objects. Refused with MMRT_ERR_FORMAT naming
 * `what` and the key: wrong types, sizes outside 1..MMRT_CLIP_MAX_SIZE, resample outside
 * 0..5, rescale_factor outside (0, 1], mean outside [−1000, 1000], std outside
 * [1e-6, 1000], mean/std lists not of length 3. MMRT_ERR_UNSUPPORTED: resample 0 (nearest),
 * size {shortest_edge, longest_edge}. *cfg is written only on success.
 */
mmrt_status mmrt_clip_preprocess_config_from_json(const json_t *obj, const char *what,
                                                  struct mmrt_clip_preprocess_config *cfg,
                                                  struct mmrt_error *err);

/* Width and height of what mmrt_preprocess_clip() produces for a width × height image: the
 * crop size with do_center_crop, else the resize size (or the input size), which must then
 * stay within MMRT_IMAGE_DEFAULT_MAX_PIXELS (MMRT_ERR_INVALID_ARG otherwise). */
mmrt_status mmrt_preprocess_clip_output_size(uint32_t width, uint32_t height,
                                             const struct mmrt_clip_preprocess_config *cfg,
                                             uint32_t *out_width, uint32_t *out_height,
                                             struct mmrt_error *err);

/*
 * CLIPImageProcessor._preprocess for one image (models.md §2.5): resize (shortest edge or
 * exact, PIL filter `resample`) → center crop (zero padding if needed) → rescale → normalize.
 *   out: [3][out_height][out_width] float32 (mmrt_preprocess_clip_output_size), n_out floats
 *        available; for llava-1.5 [3][336][336].
 * Only the crop window of the resized image is computed (see the top of this file).
 */
mmrt_status mmrt_preprocess_clip(const struct mmrt_image *img,
                                 const struct mmrt_clip_preprocess_config *cfg, float *out,
                                 size_t n_out, struct mmrt_error *err);

/* ---------------------------------------------------------------------------------------- */
/* Qwen2VLImageProcessor (Qwen2-VL, models.md §4.4)                                          */

/*
 * smart_resize(height, width, factor, min_pixels, max_pixels) of transformers 5 (models.md
 * §4.4 step 1, §1.8), in double precision with Python's operation order:
 *   refuse when max(h, w) / min(h, w) > 200 (as a float64 division);
 *   hb = round(h / factor) · factor, wb likewise — round half to even (70/28 = 2.5 → 2);
 *   if hb · wb > max_pixels: β = sqrt(h · w / max_pixels),
 *       hb = max(factor, floor(h / β / factor) · factor), wb likewise;
 *   else if hb · wb < min_pixels: β = sqrt(min_pixels / (h · w)),
 *       hb = ceil(h · β / factor) · factor, wb likewise (not re-checked against max_pixels,
 *       as transformers does not).
 * Examples with factor 28, min 3136, max 1003520: 300×500 → 308×504, 70×98 → 56×112,
 * 1080×1920 → 728×1316. Every result side is a positive multiple of factor.
 * *branch (may be NULL) tells which rule gave the size. Statuses: MMRT_ERR_INVALID_ARG for a
 * zero side, factor or min_pixels, or the aspect ratio (the message says "absolute aspect
 * ratio must be smaller than 200"), or a result side over MMRT_PREPROCESS_MAX_SIDE.
 */
enum mmrt_smart_resize_branch {
    MMRT_SMART_RESIZE_ROUND = 0,      /* within [min_pixels, max_pixels] after rounding */
    MMRT_SMART_RESIZE_MAX_PIXELS = 1, /* scaled down (floor) */
    MMRT_SMART_RESIZE_MIN_PIXELS = 2, /* scaled up (ceil) */
};
mmrt_status mmrt_preprocess_smart_resize(uint32_t height, uint32_t width, uint32_t factor,
                                         uint64_t min_pixels, uint64_t max_pixels,
                                         uint32_t *out_height, uint32_t *out_width,
                                         enum mmrt_smart_resize_branch *branch,
                                         struct mmrt_error *err);

/* Largest min_pixels / max_pixels a configuration may ask for: 64 Mpx, five times the hub's
 * 12 845 056, and what the image decoder accepts by default. */
#define MMRT_QWEN2VL_MAX_PIXELS MMRT_IMAGE_DEFAULT_MAX_PIXELS

/*
 * The keys of a Qwen2-VL image processor config that change pixels, with the defaults of
 * transformers 5's Qwen2VLImageProcessorPil: resize on, min_pixels (size.shortest_edge)
 * 3136 = 56², max_pixels (size.longest_edge) 1003520 = 28²·1280, bicubic, rescale 1/255,
 * normalize with the OpenAI CLIP mean/std, patch_size 14, temporal_patch_size 2,
 * merge_size 2. factor = patch_size · merge_size.
 */
struct mmrt_qwen2vl_preprocess_config {
    bool do_resize;
    uint64_t min_pixels, max_pixels;
    enum mmrt_resample resample;
    uint32_t patch_size, temporal_patch_size, merge_size;
    struct mmrt_preprocess_normalize norm;
};

void mmrt_qwen2vl_preprocess_config_default(struct mmrt_qwen2vl_preprocess_config *cfg);

/*
 * Reads the image processor object: the hub preprocessor_config.json itself, or the
 * "image_processor" object of a transformers-5 processor_config.json. Keys: do_resize,
 * size {shortest_edge, longest_edge} (both required when size is given, as transformers
 * requires), min_pixels / max_pixels (override size, as transformers' constructor does),
 * resample, do_rescale, rescale_factor, do_normalize, image_mean, image_std, patch_size,
 * temporal_patch_size, merge_size, do_convert_rgb; others are ignored. Refused with
 * MMRT_ERR_FORMAT naming `what` and the key: wrong types; pixel counts outside
 * 1..MMRT_QWEN2VL_MAX_PIXELS; patch_size outside 1..1024, temporal_patch_size outside 1..16,
 * merge_size outside 1..16; resample outside 0..5; mean/std as for CLIP.
 * MMRT_ERR_UNSUPPORTED: resample 0 (nearest). *cfg is written only on success.
 */
mmrt_status mmrt_qwen2vl_preprocess_config_from_json(const json_t *obj, const char *what,
                                                     struct mmrt_qwen2vl_preprocess_config *cfg,
                                                     struct mmrt_error *err);

/*
 * The size a width × height image is resized to (smart_resize with the config's factor and
 * pixel bounds; the image's own size without do_resize, which must then be a multiple of
 * the factor) and its patch grid grid_thw = [temporal frames / temporal_patch_size (1 for
 * an image), height / patch_size, width / patch_size]. Nothing is allocated, so a model can
 * refuse an image over its token budget (grid product / merge_size²) before any work.
 */
mmrt_status mmrt_preprocess_qwen2vl_plan(uint32_t width, uint32_t height,
                                         const struct mmrt_qwen2vl_preprocess_config *cfg,
                                         uint32_t *out_width, uint32_t *out_height,
                                         int32_t grid_thw[3], struct mmrt_error *err);

/*
 * Qwen2VLImageProcessor._preprocess for one image (models.md §4.4): PIL resize to the
 * planned size → rescale → normalize → the frame repeated to temporal_patch_size frames →
 * patches in merge-window order: for each merge_size × merge_size block of the patch grid
 * in raster order, its patches in raster order; each patch flattened as (channel, frame,
 * row, column). out: [gh·gw][3·temporal_patch_size·patch_size²] float32 (n_out floats
 * available), grid_thw as mmrt_preprocess_qwen2vl_plan gives it.
 */
mmrt_status mmrt_preprocess_qwen2vl(const struct mmrt_image *img,
                                    const struct mmrt_qwen2vl_preprocess_config *cfg, float *out,
                                    size_t n_out, int32_t grid_thw[3], struct mmrt_error *err);

/* ---------------------------------------------------------------------------------------- */
/* FuyuImageProcessor (models.md §5.4)                                                       */

struct mmrt_fuyu_preprocess_config {
    bool do_resize;
    uint32_t target_h, target_w; /* size {height, width} */
    uint32_t patch;              /* patch_size {height, width}; both equal the model's */
    enum mmrt_resample filter;
    uint8_t pad_value;           /* applied to the uint8 image, before rescaling */
    struct mmrt_preprocess_normalize norm;
};

/*
 * Reads the image processor object (preprocessor_config.json itself, or processor_config.json's
 * "image_processor") with FuyuImageProcessor's class defaults: size 1080×1920, bilinear,
 * padding value 1, rescale 1/255, mean and std 0.5. Keys: size and patch_size ({height,
 * width}, each in 1..32768 and 1..1024), do_resize, resample (0..5), do_pad, padding_value
 * (0..255), do_rescale, rescale_factor, do_normalize, image_mean and image_std (a number or a
 * list of 3). Refused with MMRT_ERR_FORMAT naming `what` and the key: wrong types or ranges,
 * a patch_size other than the model's `patch`, a size that is not a multiple of it, a
 * non-positive std or non-finite mean; MMRT_ERR_UNSUPPORTED: do_pad false, a padding value
 * that is not a whole number, resample 0 (nearest). *cfg is written only on success.
 */
mmrt_status mmrt_fuyu_preprocess_config_from_json(const json_t *obj, const char *what,
                                                  int64_t patch,
                                                  struct mmrt_fuyu_preprocess_config *cfg,
                                                  struct mmrt_error *err);

#endif /* MMRT_PREPROCESS_H */
