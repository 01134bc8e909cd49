/*
 * core/formats/image.h — PNG and JPEG decoding of untrusted bytes into 8-bit RGB.
 *
 * Every image mmrt sees comes from outside (a file, a base64 `data:` URI in a request), so the
 * decoder is written for hostile input (docs: /work/shared/specs/untrusted-input.md, I1–I5):
 *
 *   I1  PNG and JPEG only, recognised by their magic bytes; anything else is
 *       MMRT_ERR_UNSUPPORTED "unsupported image format (expected PNG or JPEG)".
 *   I2  The header is read first. Width or height 0, a side over max_side, width × height over
 *       max_pixels, or an aspect ratio over max_aspect is refused *before any pixel buffer is
 *       allocated* (a valid 16000×16000 PNG is ~750 KB but decodes to 768 MB).
 *   I3  Optional decode budgets (struct mmrt_image_budget): the bytes a decode needs (and the
 *       decoded image, until it is destroyed) are charged to a per-request and/or global
 *       budget, so concurrent images cannot exhaust memory together.
 *   I4  Progressive JPEG scans are capped (max_jpeg_scans) by a libjpeg progress monitor.
 *   I5  EXIF orientation applied on request (default off, as transformers), alpha composited onto white, grayscale and palette
 *       converted to RGB.
 *
 * Libraries: libspng (PNG; image-size and chunk-cache limits set, its allocations routed
 * through this module's malloc) and libjpeg-turbo (JPEG; errors and *warnings* turned into
 * statuses through a setjmp/longjmp error manager).
 *
 * ## Which pixels: parity with Hugging Face transformers
 *
 * mmrt's reference is transformers (DESIGN.md), whose image processors open files with PIL and
 * call `convert_to_rgb` (image_transforms.py). The decoder reproduces what that produces, pixel
 * for pixel for PNG:
 *
 *   - Alpha (RGBA, gray+alpha, palette with tRNS, gray/RGB with a tRNS colour key): composited
 *     onto opaque white with PIL's `Image.alpha_composite` integer arithmetic. This is what
 *     transformers does today (checked in 5.24.0, the version the fixtures record:
 *     image_transforms.convert_to_rgb composites whenever the image has an "A" band or
 *     info["transparency"]). Older transformers, which models.md §1.9 describes, called
 *     `image.convert("RGB")`, which DROPS alpha; MMRT_IMAGE_ALPHA_DROP reproduces that for
 *     references made with such a version.
 *   - 16-bit channels keep the high byte (PIL's "RGB;16B"/"RGBA;16B"/"LA;16B" raw modes),
 *     EXCEPT 16-bit grayscale, which PIL opens as mode "I;16" and converts to RGB by CLIPPING
 *     (min(v, 255)), so almost every pixel of a 16-bit gray PNG becomes 255. That is what the
 *     reference feeds the model, so it is what mmrt does too (parity over prettiness).
 *   - 1/2/4-bit gray is scaled (×255, ×85, ×17); palettes are looked up; a palette index past
 *     the PLTE entries is refused (PIL would show an arbitrary colour).
 *   - tRNS colour keys are compared the way PIL does it: against the 8-bit converted value,
 *     with the key's low byte (PIL's rgbT2rgba masks with 0xff), and a 1-bit key as 0/255.
 *   - Gamma, ICC profiles and sBIT are ignored, as PIL ignores them.
 *   - JPEG: libjpeg-turbo with the settings Pillow uses (JDCT_ISLOW, fancy upsampling — the
 *     library defaults); grayscale is replicated to RGB; CMYK and YCCK are decoded to CMYK,
 *     read with Adobe (inverted) polarity like PIL's "CMYK;I" raw mode, and converted with
 *     PIL's cmyk2rgb integer formula. Other component counts are refused by name.
 *     Pillow wheels bundle their own libjpeg-turbo (3.2.0 in Pillow 13); with these settings
 *     it and Debian 12's 2.1.5 gave identical pixels on every fixture (baseline 4:2:0, 4:2:2,
 *     4:4:4, progressive, gray, CMYK) and on a 3001×1999 progressive photo-like test.
 *   - EXIF orientation: PIL's Image.open does NOT rotate, so transformers does not either.
 *     `apply_exif_orientation` is therefore off by default (bit-parity with the reference);
 *     on ([model] exif_orientation = apply) it applies the 8 standard transforms like PIL's
 *     ImageOps.exif_transpose, for photos whose camera stored them sideways. Orientation comes from the first APP1 "Exif" segment of a
 *     JPEG or the eXIf chunk of a PNG; malformed EXIF is ignored (orientation 1), never fatal.
 *
 * ## Strictness
 *
 * Truncated or corrupt data is an error, never silent garbage: libjpeg warnings (premature end
 * of file, corrupt entropy data, extraneous bytes, …) fail the decode, except two that concern
 * only metadata (unknown JFIF revision, unknown Adobe transform). A JPEG must reach its EOI
 * marker (Pillow is laxer there). A PNG must deliver every row, with valid chunk CRCs and zlib
 * Adler-32 up to the end of the image data; what follows (the last IDAT's CRC, trailing
 * chunks, IEND) is read only for a late eXIf chunk and its damage is ignored, as PIL ignores
 * it. Failures are statuses with a one-line reason, never a crash or a hang.
 *
 * Thread-safety: all functions are reentrant; a budget may be shared by many threads.
 */
#ifndef MMRT_FORMATS_IMAGE_H
#define MMRT_FORMATS_IMAGE_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../error.h"

/* Defaults of struct mmrt_image_limits (mmrt_image_limits_default). */
#define MMRT_IMAGE_DEFAULT_MAX_PIXELS (64ull * 1024 * 1024) /* 64 Mpx: 192 MiB of RGB */
#define MMRT_IMAGE_DEFAULT_MAX_SIDE 32768u
#define MMRT_IMAGE_DEFAULT_MAX_ASPECT 10000u
#define MMRT_IMAGE_DEFAULT_MAX_JPEG_SCANS 100u
#define MMRT_IMAGE_DEFAULT_MAX_INPUT_BYTES ((size_t)256 * 1024 * 1024)

/* What happens to transparency (see "Which pixels" above). */
enum mmrt_image_alpha {
    MMRT_IMAGE_ALPHA_WHITE = 0, /* composite onto opaque white (transformers 5.x) */
    MMRT_IMAGE_ALPHA_DROP = 1,  /* ignore alpha, keep the colour (transformers 4.x) */
};

/*
 * A byte budget shared by decodes (I3). Caller-provided storage (init, no destroy). A decode
 * charges the bytes it is about to allocate (pixel buffer, row buffers, libjpeg's coefficient
 * buffers for progressive files, the copy an EXIF rotation needs) before allocating them; if
 * that would exceed max_bytes — here or in any parent — it fails with MMRT_ERR_LIMIT and
 * allocates nothing. The decoded image keeps its pixel bytes charged until
 * mmrt_image_destroy(), so "in use" means "decoding or decoded and not yet released".
 * A request-level budget whose parent is the server's global budget gives both limits at once.
 * The budget must outlive every image charged to it. Fields are private.
 */
struct mmrt_image_budget {
    _Atomic size_t in_use_;
    size_t max_bytes_;
    struct mmrt_image_budget *parent_;
};

/* Initialises b with a cap of max_bytes (0 = unlimited, only counts) and an optional parent
 * (NULL for none) that every charge is also made against. */
void mmrt_image_budget_init(struct mmrt_image_budget *b, size_t max_bytes,
                            struct mmrt_image_budget *parent);
/* Bytes currently charged to b (including those of its children). */
size_t mmrt_image_budget_in_use(const struct mmrt_image_budget *b);

/*
 * Limits and options of one decode. Start from mmrt_image_limits_default() and change fields;
 * passing NULL to a decode function means the defaults.
 */
struct mmrt_image_limits {
    uint64_t max_pixels;          /* width × height; default 64 Mi */
    uint32_t max_side;            /* width and height each; default 32768 */
    uint32_t max_aspect;          /* longer side / shorter side; default 10000; 0 = no limit */
    uint32_t max_jpeg_scans;      /* progressive scans (I4); default 100 */
    size_t max_input_bytes;       /* encoded size; default 256 MiB */
    bool apply_exif_orientation;  /* default false, as transformers (see above) */
    enum mmrt_image_alpha alpha;  /* default MMRT_IMAGE_ALPHA_WHITE */
    struct mmrt_image_budget *budget; /* optional, default NULL */
};

void mmrt_image_limits_default(struct mmrt_image_limits *limits);

/*
 * A decoded (or created) image: 8-bit RGB, row-major, rows tightly packed.
 *   pixels: [height][width][3] uint8, R G B; pixel (x, y) at pixels[(y * width + x) * 3].
 * width and height are ≥ 1. Owned by the caller; release with mmrt_image_destroy().
 */
struct mmrt_image {
    uint32_t width;
    uint32_t height;
    uint8_t *pixels;
    /* private: the budget this image's bytes are charged to, and how many */
    struct mmrt_image_budget *budget_;
    size_t charged_;
};

/* Largest side mmrt_image_create() accepts (keeps every byte count far from overflow). */
#define MMRT_IMAGE_MAX_CREATE_SIDE (1u << 24)

/*
 * A new width × height image with every byte 0 (black). Used by the preprocessing primitives
 * and by tests. Statuses: MMRT_ERR_INVALID_ARG (a side 0 or over MMRT_IMAGE_MAX_CREATE_SIDE,
 * or more than SIZE_MAX bytes), MMRT_ERR_NO_MEMORY. *out is written only on success.
 */
mmrt_status mmrt_image_create(uint32_t width, uint32_t height, struct mmrt_image **out,
                              struct mmrt_error *err);

/*
 * Decodes `len` bytes of PNG or JPEG into a new RGB image.
 *   what:   names the source in error messages (a path, "request image 2"); NULL = "image".
 *   limits: NULL = mmrt_image_limits_default().
 * Statuses:
 *   MMRT_ERR_UNSUPPORTED  not PNG/JPEG; JPEG with 2 or 5+ components or 12-bit samples
 *   MMRT_ERR_FORMAT       empty, truncated or corrupt data (message has the decoder's reason
 *                         and, where known, the row or byte offset)
 *   MMRT_ERR_LIMIT        a limit of `limits` (named in the message) or the budget
 *   MMRT_ERR_NO_MEMORY    an allocation failed
 *   MMRT_ERR_INVALID_ARG  bytes NULL with len > 0, out NULL
 * *out is written only on success. The bytes are not retained.
 */
mmrt_status mmrt_image_decode(const uint8_t *bytes, size_t len, const char *what,
                              const struct mmrt_image_limits *limits, struct mmrt_image **out,
                              struct mmrt_error *err);

/* Reads a whole file (a regular file of at most limits->max_input_bytes) and decodes it;
 * messages name the path. MMRT_ERR_IO when it cannot be opened or read. */
mmrt_status mmrt_image_load_file(const char *path, const struct mmrt_image_limits *limits,
                                 struct mmrt_image **out, struct mmrt_error *err);

/* Frees the image and releases its budget charge. NULL is a no-op. */
void mmrt_image_destroy(struct mmrt_image *img);

#endif /* MMRT_FORMATS_IMAGE_H */
