#!/usr/bin/env python3
"""Holds mmrt's FP8 E4M3 conversions (mmrt_f8e4m3_to_f32 / mmrt_f32_to_f8e4m3 in
core/include/mmrt/plugin.h) to torch.float8_e4m3fn: all 256 codes decoded, and every one of
the 2^32 f32 bit patterns encoded, against torch's `x.clamp(-448, 448).to(float8_e4m3fn)`
(torch rounds to nearest even but turns values beyond 464 into NaN; plugin.h asks for
saturation, hence the clamp, which also takes ±inf to ±448 and keeps NaN).

Usage: tools/check_fp8_e4m3.py [--stride N]   (needs a C compiler, numpy and torch;
--stride N checks every N-th pattern only). Exits 1 on any mismatch."""
import argparse, ctypes, os, subprocess, sys, tempfile

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
SHIM = r'''
#include <stdint.h>
#include "mmrt/plugin.h"
void enc(const float *x, uint8_t *y, long n) { for (long i = 0; i < n; i++) y[i] = mmrt_f32_to_f8e4m3(x[i]); }
void dec(const uint8_t *x, float *y, long n) { for (long i = 0; i < n; i++) y[i] = mmrt_f8e4m3_to_f32(x[i]); }
'''


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--stride", type=int, default=1)
    a = ap.parse_args()
    tmp = tempfile.mkdtemp()
    src, so = os.path.join(tmp, "shim.c"), os.path.join(tmp, "shim.so")
    open(src, "w").write(SHIM)
    subprocess.check_call(["cc", "-O2", "-std=c11", "-shared", "-fPIC",
                           "-I" + os.path.join(HERE, "..", "core", "include"), src, "-o", so])
    lib = ctypes.CDLL(so)
    vp = lambda arr: arr.ctypes.data_as(ctypes.c_void_p)

    codes = np.arange(256, dtype=np.uint8)
    out = np.empty(256, np.float32)
    lib.dec(vp(codes), vp(out), ctypes.c_long(256))
    ref = torch.from_numpy(codes.copy()).view(torch.float8_e4m3fn).to(torch.float32).numpy()
    same = (out.view(np.uint32) == ref.view(np.uint32)) | (np.isnan(out) & np.isnan(ref))
    bad = int((~same).sum())
    print(f"decode: 256 codes, {bad} mismatches; NaN codes "
          f"{[hex(c) for c in codes[np.isnan(out)]]}; largest {out[np.isfinite(out)].max()}; "
          f"smallest subnormal {out[1]}")

    step, n = 1 << 26, 0
    for start in range(0, 1 << 32, step):
        u = np.arange(start, start + step, a.stride, dtype=np.uint64).astype(np.uint32)
        x = u.view(np.float32)
        y = np.empty(x.size, np.uint8)
        lib.enc(vp(x), vp(y), ctypes.c_long(x.size))
        t = torch.from_numpy(x).clamp(-448.0, 448.0).to(torch.float8_e4m3fn).view(torch.uint8)
        diff = np.nonzero(y != t.numpy())[0]
        if diff.size:
            print("mismatch at f32 bits", [hex(int(v)) for v in u[diff[:5]]])
            bad += int(diff.size)
        n += x.size
    print(f"encode: {n} f32 bit patterns, {bad} mismatches in all")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
