#!/usr/bin/env python3
"""Write the fixtures of published 4-bit checkpoints: the demo model (demo/llava-shapes) with
its language model's linear layers quantized once and packed two ways, AWQ's GEMM layout and
GPTQ's, and the same model with those weights dequantized, in float, for
tests/test_packed_checkpoints.c to compare mmrt's loading of both with.

    python3 tools/make_packed_fixtures.py                  # numpy only
    python3 tools/make_packed_fixtures.py --check-with awq --check-with ct
                           # also against AutoAWQ's dequantize_gemm and compressed-tensors'
                           # unpack_from_int32 (pip install --no-deps autoawq compressed-tensors)

For a linear layer of K inputs and N outputs and groups of g inputs, both store
W[n, k] = (q - z) * s with z, s of k's group, scales f16 [K/g, N], and:

  AWQ (AutoAWQ's WQLinear_GEMM, which transformers loads for quant_method "awq", version
  "gemm"):
    qweight  int32 [K, N/8]   output 8c + ORDER[i] of input k in bits 4i … 4i+3 of [k, c],
                              ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
    qzeros   int32 [K/g, N/8] the zero points, packed the same way
  GPTQ (AutoGPTQ / GPTQModel, quant_method "gptq", checkpoint_format "gptq"):
    qweight  int32 [K/8, N]   input 8r + i of output n in bits 4i … 4i+3 of [r, n]
    qzeros   int32 [K/g, N/8] output 8c + i's zero point MINUS ONE (mod 16) in bits 4i
    g_idx    int32 [K]        the group of each input, k // g (no act-order)
  compressed-tensors pack-quantized (llm-compressor's W4A16, asymmetric here):
    weight_packed      int32 [N, K/8]   input 8w + i of output n in bits 4i of [n, w]
                                        (the signed values + 8: the same codes)
    weight_zero_point  int32 [N/8, K/g] output 8w + i's zero point in bits 4i of [w, g]
    weight_scale       f16   [N, K/g]
    weight_shape       int64 [2]        N, K

The quantization here is plain round-to-nearest with each group's min/max range (what AWQ's
search adds, a per-channel scaling folded into the previous layer, changes the values, not
the layout). With --check-with awq the script loads AutoAWQ's awq/utils/packing_utils.py
(pip install autoawq --no-deps; it needs torch) and checks that its dequantize_gemm gives
the same weights from the packed tensors (to f16 rounding: it computes in f16).

Deterministic: no randomness is involved. Run from the repository root.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import struct
import sys

import numpy as np

ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
GROUP = 64
SRC = "demo/llava-shapes"
OUT_AWQ = "tests/fixtures/packed-awq"
OUT_GPTQ = "tests/fixtures/packed-gptq"
OUT_CT = "tests/fixtures/packed-ct"
OUT_DEQUANT = "tests/fixtures/packed-dequant"
DTYPES = {"F16": np.float16, "F32": np.float32, "BF16": None, "I32": np.int32, "I64": np.int64}


def read_safetensors(path: str) -> dict[str, np.ndarray]:
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        a, b = e["data_offsets"]
        out[name] = np.frombuffer(data[a:b], dtype=DTYPES[e["dtype"]]).reshape(e["shape"])
    return out


def write_safetensors(path: str, tensors: dict[str, np.ndarray]) -> None:
    names = {np.dtype(np.float16): "F16", np.dtype(np.float32): "F32", np.dtype(np.int32): "I32",
             np.dtype(np.int64): "I64"}
    header, blobs, at = {"__metadata__": {"format": "pt"}}, [], 0
    for name in sorted(tensors):
        t = np.ascontiguousarray(tensors[name])
        b = t.tobytes()
        header[name] = {"dtype": names[t.dtype], "shape": list(t.shape), "data_offsets": [at, at + len(b)]}
        blobs.append(b)
        at += len(b)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)


def quantize(w: np.ndarray, g: int):
    """w [N, K] float -> codes [N, K] 0..15, zeros [N, K/g] 0..15, scales [N, K/g] f16."""
    n, k = w.shape
    grp = w.astype(np.float32).reshape(n, k // g, g)
    lo = np.minimum(grp.min(axis=2), 0.0)
    hi = np.maximum(grp.max(axis=2), 0.0)
    scales = ((hi - lo) / 15.0).astype(np.float16)
    s32 = scales.astype(np.float32)
    s32[s32 == 0] = 1.0
    zeros = np.clip(np.round(-lo / s32), 0, 15).astype(np.int64)
    codes = np.clip(np.round(grp / s32[:, :, None]) + zeros[:, :, None], 0, 15).astype(np.int64)
    return codes.reshape(n, k), zeros, scales


def pack(cols: np.ndarray, order=ORDER) -> np.ndarray:
    """cols [R, N] values 0..15 -> int32 [R, N/8], column 8c + order[i] in bits 4i."""
    r, n = cols.shape
    out = np.zeros((r, n // 8), dtype=np.uint32)
    for i, o in enumerate(order):
        out |= (cols[:, o::8].astype(np.uint32) & 0xF) << np.uint32(4 * i)
    return out.view(np.int32)


def pack_rows(rows: np.ndarray) -> np.ndarray:
    """rows [K, N] values 0..15 -> int32 [K/8, N], row 8r + i in bits 4i (GPTQ's qweight)."""
    k, n = rows.shape
    out = np.zeros((k // 8, n), dtype=np.uint32)
    for i in range(8):
        out |= (rows[i::8, :].astype(np.uint32) & 0xF) << np.uint32(4 * i)
    return out.view(np.int32)


def is_lm_linear(name: str) -> bool:
    return name.startswith("language_model.model.layers.") and name.endswith("_proj.weight")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--check-with", choices=["awq", "ct"], action="append", default=[],
                    help="compare with AutoAWQ's dequantize_gemm / compressed-tensors' unpacking")
    args = ap.parse_args()
    src = read_safetensors(os.path.join(SRC, "model.safetensors"))
    awq, gptq, ct, dequant = {}, {}, {}, {}
    for name, t in src.items():
        if not is_lm_linear(name):
            awq[name] = gptq[name] = ct[name] = dequant[name] = t
            continue
        codes, zeros, scales = quantize(t, GROUP)
        base = name[: -len(".weight")]
        awq[base + ".qweight"] = pack(codes.T.copy())            # [K, N/8]
        awq[base + ".qzeros"] = pack(zeros.T.copy())             # [K/g, N/8]
        awq[base + ".scales"] = scales.T.copy()                  # [K/g, N] f16
        gptq[base + ".qweight"] = pack_rows(codes.T.copy())      # [K/8, N]
        gptq[base + ".qzeros"] = pack(((zeros - 1) & 0xF).T.copy(), order=range(8))
        gptq[base + ".scales"] = scales.T.copy()
        gptq[base + ".g_idx"] = (np.arange(codes.shape[1]) // GROUP).astype(np.int32)
        ct[base + ".weight_packed"] = pack(codes, order=range(8))          # [N, K/8]
        ct[base + ".weight_zero_point"] = pack(zeros.T.copy(), order=range(8)).T.copy()  # [N/8, G]
        ct[base + ".weight_scale"] = scales.copy()                         # [N, G] f16
        ct[base + ".weight_shape"] = np.array(codes.shape, dtype=np.int64)
        rep = np.repeat(np.arange(codes.shape[1] // GROUP), GROUP)
        dequant[name] = ((codes - zeros[:, rep]) * scales.astype(np.float32)[:, rep]).astype(np.float32)
        if "awq" in args.check_with:
            check_with_autoawq(awq, base, dequant[name])
        if "ct" in args.check_with:
            check_with_compressed_tensors(ct, base, codes, zeros)
    configs = {
        OUT_AWQ: {"quant_method": "awq", "bits": 4, "group_size": GROUP, "zero_point": True,
                  "version": "gemm",
                  "modules_to_not_convert": ["vision_tower", "multi_modal_projector", "lm_head"]},
        OUT_GPTQ: {"quant_method": "gptq", "bits": 4, "group_size": GROUP, "desc_act": False,
                   "sym": False, "checkpoint_format": "gptq", "true_sequential": True},
        OUT_CT: {"quant_method": "compressed-tensors", "format": "pack-quantized",
                 "config_groups": {"group_0": {
                     "targets": ["Linear"], "input_activations": None, "output_activations": None,
                     "weights": {"num_bits": 4, "type": "int", "symmetric": False,
                                 "strategy": "group", "group_size": GROUP}}},
                 "ignore": ["lm_head", "re:.*vision_tower.*", "re:.*multi_modal_projector.*"]},
        OUT_DEQUANT: None,
    }
    for out, tensors in ((OUT_AWQ, awq), (OUT_GPTQ, gptq), (OUT_CT, ct), (OUT_DEQUANT, dequant)):
        qc = configs[out]
        shutil.rmtree(out, ignore_errors=True)
        os.makedirs(out)
        for f in sorted(os.listdir(SRC)):
            if f.endswith(".safetensors") or f == "config.json":
                continue
            shutil.copy(os.path.join(SRC, f), os.path.join(out, f))
        with open(os.path.join(SRC, "config.json")) as f:
            config = json.load(f)
        if qc:
            config["quantization_config"] = qc
        with open(os.path.join(out, "config.json"), "w") as f:
            json.dump(config, f, indent=2)
            f.write("\n")
        write_safetensors(os.path.join(out, "model.safetensors"), tensors)
    print(f"wrote {OUT_AWQ}, {OUT_GPTQ}, {OUT_CT} and {OUT_DEQUANT}: "
          f"{sum(is_lm_linear(n) for n in src)} matrices, groups of {GROUP}")
    return 0


def check_with_autoawq(awq: dict, base: str, want: np.ndarray) -> None:
    import torch
    found = importlib.util.find_spec("awq")  # located, not imported: its __init__ wants a GPU stack
    if not found or not found.submodule_search_locations:
        sys.exit("--check-with awq: AutoAWQ is not installed (pip install autoawq --no-deps)")
    path = os.path.join(found.submodule_search_locations[0], "utils", "packing_utils.py")
    spec = importlib.util.spec_from_file_location("awq_packing_utils", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    w = mod.dequantize_gemm(torch.from_numpy(awq[base + ".qweight"].copy()),
                            torch.from_numpy(awq[base + ".qzeros"].copy()),
                            torch.from_numpy(awq[base + ".scales"].copy()), 4, GROUP)
    got = w.float().numpy().T  # [N, K]
    err = np.abs(got - want).max() / max(np.abs(want).max(), 1e-30)
    if err > 2e-3:
        sys.exit(f"{base}: AutoAWQ's dequantize_gemm differs from the layout written here (rel {err:.3g})")


def check_with_compressed_tensors(ct: dict, base: str, codes: np.ndarray, zeros: np.ndarray) -> None:
    import torch
    found = importlib.util.find_spec("compressed_tensors")
    if not found or not found.submodule_search_locations:
        sys.exit("--check-with ct: compressed-tensors is not installed (pip install --no-deps compressed-tensors)")
    path = os.path.join(found.submodule_search_locations[0], "compressors", "pack_quantized", "helpers.py")
    spec = importlib.util.spec_from_file_location("ct_pack_helpers", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    w = mod.unpack_from_int32(torch.from_numpy(ct[base + ".weight_packed"].copy()), 4,
                              torch.Size(codes.shape), packed_dim=1)
    z = mod.unpack_from_int32(torch.from_numpy(ct[base + ".weight_zero_point"].copy()), 4,
                              torch.Size(zeros.shape), packed_dim=0)
    # the library's values are signed: the codes minus 8
    if not np.array_equal(w.numpy().astype(np.int64), codes - 8) or \
            not np.array_equal(z.numpy().astype(np.int64), zeros - 8):
        sys.exit(f"{base}: compressed-tensors' unpack_from_int32 differs from the layout written here")


if __name__ == "__main__":
    sys.exit(main())
