#!/usr/bin/env python3
"""Writes tests/fixtures/images/: small PNG/JPEG test images and what PIL and transformers
make of them, for tests/test_image.c and tests/test_preprocess.c.

    pip install pillow numpy transformers      # no torch needed: the PIL backend is numpy
    python3 tools/make_image_fixtures.py [outdir]

Outputs (all deterministic; the manifest records the library versions):
  *.png / *.jpg      inputs: gradients + noise so resampling errors show; every PNG colour
                     type and bit depth, tRNS keys and tables, Adam7, CMYK / gray /
                     progressive / 4:4:4 / 4:2:2 JPEG, EXIF orientations 1-8, 1x1 and
                     extreme aspect ratios
  <file>.rgb        uint8 [H][W][3]: transformers' convert_to_rgb(PIL.Image.open(file))
                     (after ImageOps.exif_transpose for the oriented fixtures)
  resize_*.rgb       PIL Image.resize with each filter
  clip_*.f32[.gz]    little-endian float32 [3][H][W]: CLIPImageProcessorPil pixel_values
  alpha_table*.png   every (colour, alpha) pair, and PIL's composite of it onto white
  manifest.json      what each file is, shapes, configs, versions
"""
import gzip
import io
import json
import os
import struct
import sys
import zlib

import numpy as np
import PIL
import transformers
from PIL import Image, ImageOps, features
from transformers.image_transforms import convert_to_rgb

try:
    from transformers import CLIPImageProcessorPil as ClipPil  # transformers 5.x
except ImportError:  # 4.x: the slow processor is the PIL path
    from transformers import CLIPImageProcessor as ClipPil

OUT = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "images")
os.makedirs(OUT, exist_ok=True)
manifest = {"decode": [], "resize": [], "clip": []}


def content(w, h, seed, noise=12.0):
    """Smooth colour gradients plus Gaussian noise, uint8 [h][w][3]."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w].astype(np.float64)
    base = np.stack([255 * x / max(w - 1, 1),
                     255 * y / max(h - 1, 1),
                     127 + 100 * np.sin((x + 2 * y) / 4.0)], -1)
    return np.clip(base + rng.normal(0, noise, (h, w, 3)), 0, 255).round().astype(np.uint8)


# ---------------------------------------------------------------------------------------------
# a PNG writer for what PIL cannot write (16-bit RGB, tRNS keys, Adam7, late eXIf)

def _chunk(t, d):
    return struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d) & 0xffffffff)


def _pack_row(samples, bd):
    if bd == 16:
        return samples.astype(">u2").tobytes()
    if bd == 8:
        return samples.astype(np.uint8).tobytes()
    out, acc, nbits = bytearray(), 0, 0
    for s in samples:
        acc = (acc << bd) | int(s)
        nbits += bd
        if nbits == 8:
            out.append(acc)
            acc, nbits = 0, 0
    if nbits:
        out.append(acc << (8 - nbits))
    return bytes(out)


ADAM7 = [(0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2),
         (0, 1, 1, 2)]


def png_bytes(samples, bd, ct, plte=None, trns=None, interlace=0, exif=None, exif_late=False):
    """samples: int array [h][w][channels] of raw sample values."""
    h, w = samples.shape[:2]
    flat = samples.reshape(h, w, -1)
    raw = b""
    passes = ADAM7 if interlace else [(0, 0, 1, 1)]
    for x0, y0, dx, dy in passes:
        sub = flat[y0::dy, x0::dx]
        if sub.shape[0] == 0 or sub.shape[1] == 0:
            continue
        for row in sub:
            raw += b"\x00" + _pack_row(row.reshape(-1), bd)
    out = b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, bd, ct, 0, 0,
                                                                interlace))
    if plte is not None:
        out += _chunk(b"PLTE", bytes(plte))
    if trns is not None:
        out += _chunk(b"tRNS", trns)
    if exif is not None and not exif_late:
        out += _chunk(b"eXIf", exif)
    out += _chunk(b"IDAT", zlib.compress(raw, 9))
    if exif is not None and exif_late:
        out += _chunk(b"eXIf", exif)
    return out + _chunk(b"IEND", b"")


def tiff_orientation(n, big_endian=False):
    """A minimal TIFF header + IFD0 holding only Orientation (0x0112, SHORT, 1) = n."""
    if big_endian:
        return b"MM\x00\x2a" + struct.pack(">IHHHIHHI", 8, 1, 0x0112, 3, 1, n, 0, 0)
    return b"II\x2a\x00" + struct.pack("<IHHHIHHI", 8, 1, 0x0112, 3, 1, n, 0, 0)


# ---------------------------------------------------------------------------------------------
# decode fixtures

def save(name, data):
    with open(os.path.join(OUT, name), "wb") as f:
        f.write(data)
    return data


def pil_rgb(data, transpose=False):
    im = Image.open(io.BytesIO(data))
    if transpose:
        im = ImageOps.exif_transpose(im)
    return convert_to_rgb(im, return_numpy=True)


def add_decode(name, data, note, exact=True, orientation=1):
    save(name, data)
    rgb = pil_rgb(data, transpose=orientation != 1)
    save(name + ".rgb", np.ascontiguousarray(rgb, dtype=np.uint8).tobytes())
    manifest["decode"].append({"file": name, "rgb": name + ".rgb", "width": rgb.shape[1],
                               "height": rgb.shape[0], "exact": exact,
                               "orientation": orientation, "note": note})


def pil_png(arr, mode=None, **kw):
    b = io.BytesIO()
    (Image.fromarray(arr, mode) if mode else Image.fromarray(arr)).save(b, "PNG", **kw)
    return b.getvalue()


def pil_jpeg(im, **kw):
    b = io.BytesIO()
    im.save(b, "JPEG", **kw)
    return b.getvalue()


rng = np.random.default_rng(1234)

# the ones the CLIP tests use
add_decode("rgb_80x60.png", pil_png(content(80, 60, 1)), "RGB 8-bit")
add_decode("rgb_50x90.jpg", pil_jpeg(Image.fromarray(content(50, 90, 2)), quality=90),
           "baseline JPEG 4:2:0, quality 90", exact=False)
rgba = np.concatenate([content(33, 33, 3), np.zeros((33, 33, 1), np.uint8)], -1)
yy, xx = np.mgrid[0:33, 0:33]
rgba[..., 3] = np.clip((xx * 8 + yy * 3) % 300, 0, 255)  # includes 0, 255 and partial values
add_decode("rgba_33x33.png", pil_png(rgba, "RGBA"), "RGBA 8-bit, alpha 0..255")
add_decode("gray_40x30.png", pil_png(content(40, 30, 4)[..., 1].copy(), "L"), "gray 8-bit")
pal = rng.integers(0, 256, (64, 3), dtype=np.uint8)
idx = (content(24, 20, 5)[..., 0] // 4).astype(np.uint8)  # 0..63
alphas = bytes(rng.integers(0, 256, 40, dtype=np.uint8).tolist()[:38] + [0, 255])
add_decode("pal_trns_24x20.png",
           png_bytes(idx[..., None], 8, 3, plte=pal.tobytes(), trns=alphas),
           "palette 8-bit, tRNS table shorter than PLTE")
rgb16 = (content(20, 12, 6).astype(np.uint32) * 257 + rng.integers(0, 257, (12, 20, 3)))
add_decode("rgb16_20x12.png", png_bytes(rgb16, 16, 2), "RGB 16-bit: PIL keeps the high byte")
add_decode("rgb_1x1.png", pil_png(np.array([[[200, 30, 90]]], np.uint8)), "1x1")
add_decode("rgb_7x200.png", pil_png(content(7, 200, 7)), "7x200")
long_w = np.stack([np.linspace(0, 255, 5000), np.linspace(255, 0, 5000),
                   128 + 60 * np.sin(np.arange(5000) / 37.0)], -1).round().astype(np.uint8)
add_decode("rgb_5000x1.png", pil_png(long_w[None]), "5000x1")
add_decode("rgb_1x5000.png", pil_png(np.ascontiguousarray(long_w[:, None])), "1x5000")

# PIL's conversion rules, one per file
g16 = rng.integers(0, 600, (7, 9), dtype=np.uint32)
g16[0, :3] = [0, 255, 65535]
add_decode("gray16_9x7.png", png_bytes(g16[..., None], 16, 0), "gray 16-bit: PIL clips")
add_decode("gray16_trns_9x7.png",
           png_bytes(g16[..., None], 16, 0, trns=struct.pack(">H", int(g16[1, 1]))),
           "gray 16-bit + key: compared after the clip")
g2 = rng.integers(0, 4, (5, 13), dtype=np.uint8)
add_decode("gray2_13x5.png", png_bytes(g2[..., None], 2, 0), "gray 2-bit")
add_decode("gray2_trns_13x5.png", png_bytes(g2[..., None], 2, 0, trns=struct.pack(">H", 0)),
           "gray 2-bit + key 0")
g1 = rng.integers(0, 2, (6, 11), dtype=np.uint8)
add_decode("gray1_trns_11x6.png", png_bytes(g1[..., None], 1, 0, trns=struct.pack(">H", 1)),
           "gray 1-bit + key 1")
g4 = rng.integers(0, 16, (6, 11), dtype=np.uint8)
add_decode("gray4_11x6.png", png_bytes(g4[..., None], 4, 0), "gray 4-bit")
g8 = content(12, 10, 8)[..., 2].copy()
add_decode("gray8_trns_12x10.png",
           png_bytes(g8[..., None], 8, 0, trns=struct.pack(">H", int(g8[3, 3]))),
           "gray 8-bit + key")
c8 = content(12, 10, 9)
c8[2:4, 2:5] = [10, 20, 30]
add_decode("rgb8_trns_12x10.png", png_bytes(c8, 8, 2, trns=struct.pack(">HHH", 10, 20, 30)),
           "RGB 8-bit + key")
c16 = c8.astype(np.uint32) * 256 + 7
add_decode("rgb16_trns_12x10.png",
           png_bytes(c16, 16, 2, trns=struct.pack(">HHH", 0x0a0a, 0x0a14, 0x0a1e)),
           "RGB 16-bit + key: PIL compares the key's LOW byte with the pixel's HIGH byte")
la = np.stack([content(17, 9, 10)[..., 0], rgba[:9, :17, 3]], -1)
add_decode("la8_17x9.png", png_bytes(la, 8, 4), "gray+alpha 8-bit")
add_decode("la16_17x9.png", png_bytes(la.astype(np.uint32) * 257 + 100, 16, 4),
           "gray+alpha 16-bit")
rgba16 = rgba[:8, :11].astype(np.uint32) * 257 + rng.integers(0, 200, (8, 11, 4))
add_decode("rgba16_11x8.png", png_bytes(rgba16, 16, 6), "RGBA 16-bit")
pal16 = rng.integers(0, 256, (16, 3), dtype=np.uint8)
p4 = rng.integers(0, 16, (7, 19), dtype=np.uint8)
add_decode("pal4_19x7.png", png_bytes(p4[..., None], 4, 3, plte=pal16.tobytes()),
           "palette 4-bit")
add_decode("adam7_rgb_23x17.png", png_bytes(content(23, 17, 11), 8, 2, interlace=1),
           "Adam7 RGB 8-bit")
g2i = rng.integers(0, 4, (11, 13), dtype=np.uint8)
add_decode("adam7_gray2_13x11.png", png_bytes(g2i[..., None], 2, 0, interlace=1),
           "Adam7 gray 2-bit (sub-byte passes)")
p1 = rng.integers(0, 2, (9, 10), dtype=np.uint8)
add_decode("adam7_pal1_trns_10x9.png",
           png_bytes(p1[..., None], 1, 3, plte=bytes([250, 10, 10, 10, 10, 250]),
                     trns=bytes([90]), interlace=1), "Adam7 palette 1-bit + tRNS")
add_decode("adam7_rgba16_5x3.png", png_bytes(rgba16[:3, :5], 16, 6, interlace=1),
           "Adam7 RGBA 16-bit, passes with no pixels")

# JPEG variants (the decoder of Pillow's wheel may differ from the system libjpeg-turbo)
jimg = Image.fromarray(content(45, 35, 12))
add_decode("gray_31x23.jpg", pil_jpeg(Image.fromarray(content(31, 23, 13)[..., 0].copy(), "L"),
                                      quality=92), "grayscale JPEG", exact=False)
add_decode("prog_45x35.jpg", pil_jpeg(jimg, quality=85, progressive=True),
           "progressive JPEG", exact=False)
add_decode("rgb444_30x20.jpg",
           pil_jpeg(Image.fromarray(content(30, 20, 14)), quality=95, subsampling=0),
           "JPEG 4:4:4", exact=False)
add_decode("rgb422_30x20.jpg",
           pil_jpeg(Image.fromarray(content(30, 20, 15)), quality=95, subsampling=1),
           "JPEG 4:2:2", exact=False)
add_decode("cmyk_20x16.jpg", pil_jpeg(Image.fromarray(content(20, 16, 16)).convert("CMYK"),
                                      quality=95), "CMYK JPEG (Adobe)", exact=False)

# EXIF orientation: same pixels, tag 1..8; expected = ImageOps.exif_transpose
oimg = content(24, 16, 17)
oimg[:4, :4] = [255, 0, 0]      # red marker at the top-left corner
oimg[:4, -4:] = [0, 255, 0]     # green at the top-right
oimg[-4:, :4] = [0, 0, 255]     # blue at the bottom-left
for n in range(1, 9):
    ex = Image.Exif()
    ex[0x0112] = n
    add_decode(f"orient{n}_24x16.jpg",
               pil_jpeg(Image.fromarray(oimg), quality=95, subsampling=0, exif=ex.tobytes()),
               f"EXIF orientation {n}", exact=False, orientation=n)
j = pil_jpeg(Image.fromarray(oimg), quality=95, subsampling=0)
app1 = b"Exif\x00\x00" + tiff_orientation(6, big_endian=True)
add_decode("orient6mm_24x16.jpg", j[:2] + b"\xff\xe1" + struct.pack(">H", len(app1) + 2) + app1
           + j[2:], "EXIF orientation 6, big-endian TIFF", exact=False, orientation=6)
add_decode("orient8_24x16.png", png_bytes(oimg, 8, 2, exif=tiff_orientation(8)),
           "PNG eXIf orientation 8", orientation=8)
add_decode("orient5late_24x16.png",
           png_bytes(oimg, 8, 2, exif=tiff_orientation(5, True), exif_late=True),
           "PNG eXIf (big-endian) after IDAT, orientation 5", orientation=5)

# every (colour, alpha) pair, and PIL's composite onto white (stored as an RGB PNG)
cc, aa = np.meshgrid(np.arange(256), np.arange(256))
table = np.stack([cc, 255 - cc, (cc * 7) % 256, aa], -1).astype(np.uint8)
tdata = save("alpha_table.png", pil_png(table, "RGBA"))
save("alpha_table_expected.png", pil_png(pil_rgb(tdata)))
manifest["alpha_table"] = {"file": "alpha_table.png", "expected": "alpha_table_expected.png",
                           "note": "rows: alpha 0..255; columns: R = c, G = 255 - c, "
                                   "B = 7c mod 256"}

# ---------------------------------------------------------------------------------------------
# PIL resizes of rgb_80x60

FILTERS = {"lanczos": 1, "bilinear": 2, "bicubic": 3, "box": 4, "hamming": 5}
src80 = Image.open(os.path.join(OUT, "rgb_80x60.png")).convert("RGB")
resizes = [("bicubic", 37, 23), ("bicubic", 97, 71), ("bicubic", 80, 23), ("bicubic", 37, 60),
           ("bilinear", 37, 23), ("bilinear", 97, 71), ("lanczos", 37, 23), ("lanczos", 97, 71),
           ("box", 37, 23), ("hamming", 37, 23), ("hamming", 97, 71), ("bicubic", 1, 1),
           ("bilinear", 200, 3),
           # Pillow >= 13 runs these vertical pass first (height shrinks > 2x more pixels)
           ("bicubic", 70, 20), ("lanczos", 60, 10), ("bilinear", 75, 1), ("box", 79, 30)]
for fname, w, h in resizes:
    out = np.array(src80.resize((w, h), FILTERS[fname]))
    name = f"resize_{fname}_{w}x{h}.rgb"
    save(name, out.tobytes())
    manifest["resize"].append({"src": "rgb_80x60.png", "filter": fname,
                               "resample": FILTERS[fname], "width": w, "height": h,
                               "rgb": name})
src1 = Image.open(os.path.join(OUT, "rgb_1x1.png")).convert("RGB")
save("resize_bicubic_1x1_to_5x3.rgb", np.array(src1.resize((5, 3), 3)).tobytes())
manifest["resize"].append({"src": "rgb_1x1.png", "filter": "bicubic", "resample": 3,
                           "width": 5, "height": 3, "rgb": "resize_bicubic_1x1_to_5x3.rgb"})

# ---------------------------------------------------------------------------------------------
# CLIPImageProcessor (PIL backend) outputs

CLIP_MEAN = [0.48145466, 0.4578275, 0.40821073]
CLIP_STD = [0.26862954, 0.26130258, 0.27577711]
TINY = {"size": {"shortest_edge": 56}, "crop_size": {"height": 56, "width": 56}}
LLAVA15 = {  # llava-hf/llava-1.5-7b-hf preprocessor_config.json
    "crop_size": {"height": 336, "width": 336}, "do_center_crop": True,
    "do_convert_rgb": True, "do_normalize": True, "do_rescale": True, "do_resize": True,
    "image_mean": CLIP_MEAN, "image_processor_type": "CLIPImageProcessor",
    "image_std": CLIP_STD, "processor_class": "LlavaProcessor", "resample": 3,
    "rescale_factor": 0.00392156862745098, "size": {"shortest_edge": 336}}


def add_clip(src, cfg, tag, compress=False):
    """compress: write .f32.gz (gzip, mtime 0) — tests read both through zlib's gzread."""
    im = Image.open(os.path.join(OUT, src))
    kwargs = {k: v for k, v in cfg.items() if k not in ("image_processor_type",
                                                          "processor_class")}
    proc = ClipPil(**kwargs)
    pv = np.asarray(proc(images=[im], return_tensors="np")["pixel_values"][0], np.float32)
    name = f"clip_{os.path.splitext(src)[0]}_{tag}.f32" + (".gz" if compress else "")
    data = pv.astype("<f4").tobytes()
    save(name, gzip.compress(data, 9, mtime=0) if compress else data)
    manifest["clip"].append({"src": src, "config": cfg, "shape": list(pv.shape), "f32": name})


for src in ["rgb_80x60.png", "rgb_50x90.jpg", "rgba_33x33.png", "gray_40x30.png",
            "pal_trns_24x20.png", "rgb16_20x12.png", "rgb_1x1.png", "rgb_7x200.png",
            "rgb_5000x1.png", "rgb_1x5000.png", "gray16_9x7.png"]:
    add_clip(src, TINY, "56")
add_clip("rgb_7x200.png", LLAVA15, "llava15_336", compress=True)  # 1.3 MB raw, 80 KB gzipped
add_clip("rgb_80x60.png", {"size": {"shortest_edge": 40}, "crop_size": {"height": 56, "width": 56},
                           "resample": 2}, "bilinear_pad")
add_clip("rgb_50x90.jpg", {"size": {"shortest_edge": 45}, "crop_size": {"height": 31, "width": 44}},
         "oddcrop")
add_clip("rgb_80x60.png", {"size": {"height": 50, "width": 70}, "crop_size": {"height": 48,
                                                                              "width": 48}},
         "exact")
add_clip("rgb_50x90.jpg", {"size": {"shortest_edge": 30}, "do_center_crop": False}, "nocrop")
add_clip("rgb_80x60.png", {"size": {"shortest_edge": 32}, "crop_size": {"height": 32, "width": 32},
                           "do_normalize": False}, "nonorm")
add_clip("rgb_80x60.png", {"size": {"shortest_edge": 32}, "crop_size": {"height": 32, "width": 32},
                           "do_rescale": False, "image_mean": 127.5, "image_std": 64.0}, "norescale")
add_clip("rgb_7x200.png", {"size": {"shortest_edge": 6}, "crop_size": {"height": 6, "width": 6}},
         "vfirst")  # 7x200 -> 6x171: Pillow >= 13 resizes vertically first
add_clip("rgb_80x60.png", {"size": {"shortest_edge": 33}, "crop_size": {"height": 30, "width": 30},
                           "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
                           "resample": 1}, "lanczos_half")

manifest["versions"] = {
    "transformers": transformers.__version__, "pillow": PIL.__version__,
    "numpy": np.__version__, "python": sys.version.split()[0],
    "pillow_libjpeg_turbo": features.version("libjpeg_turbo"),
    "pillow_zlib": features.version("zlib"), "clip_processor_class": ClipPil.__name__}
with open(os.path.join(OUT, "manifest.json"), "w") as f:
    json.dump(manifest, f, indent=1)
    f.write("\n")
total = sum(os.path.getsize(os.path.join(OUT, n)) for n in os.listdir(OUT))
print(f"wrote {len(os.listdir(OUT))} files, {total} bytes, to {OUT}")
