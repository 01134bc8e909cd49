#!/usr/bin/env python3
"""Writes the safetensors fixtures that tests/test_safetensors.c checks, using the reference
writer (the Python `safetensors` package over numpy; no torch), plus the seed corpus of the
safetensors fuzz target.

    pip install safetensors numpy
    python3 tools/make_safetensors_fixtures.py        # from the repository root

The outputs are committed, so CI never needs Python. Every value is a closed formula that the
C test recomputes; change one side, change the other. Re-running the script reproduces the
files byte for byte (the writer orders tensors by dtype and name, not by dict order).
"""
import json
import os
import struct
import sys

import numpy as np
from safetensors import TensorSpec, serialize_file
from safetensors.numpy import save_file

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIX = os.path.join(ROOT, "tests", "fixtures", "safetensors")
CORPUS = os.path.join(ROOT, "tests", "fuzz", "corpus", "safetensors")

# F16 bit patterns the C test converts exactly: ±0, 1, -2, max, min normal, min and max
# subnormal, ±inf, a quiet NaN and a NaN with payload.
F16_BITS = [0x0000, 0x8000, 0x3C00, 0xC000, 0x7BFF, 0x0400, 0x0001, 0x03FF,
            0x7C00, 0xFC00, 0x7E00, 0x7D01]
# BF16 bit patterns: 1, -0, a subnormal, pi rounded, ±inf, a NaN with payload, the largest.
BF16_BITS = [0x3F80, 0x8000, 0x0001, 0x4049, 0x7F80, 0xFF80, 0xFFC1, 0x7F7F]


def write_numpy_file(path):
    """F32 of rank 0-3, F16 special values and a zero-size tensor, through save_file."""
    tensors = {
        "weight": (np.arange(24, dtype=np.float32).reshape(2, 3, 4) * 0.5 - 3.0),
        "bias": np.array([-1.25, 0.0, 7.0], dtype=np.float32),
        "scalar": np.array(2.5, dtype=np.float32),  # shape []
        "half": np.array(F16_BITS, dtype=np.uint16).view(np.float16),
        "empty": np.zeros((0, 5), dtype=np.float32),
    }
    save_file(tensors, path, metadata={"format": "np"})


def spec(arr, dtype):
    return TensorSpec(dtype=dtype, shape=list(arr.shape), data_ptr=arr.ctypes.data,
                      data_len=arr.nbytes)


def write_bf16_file(path):
    """numpy has no bfloat16: raw bit patterns through the low-level serializer."""
    bf = np.array(BF16_BITS, dtype="<u2").reshape(2, 4)
    f32 = np.array([1.0, -2.0, 0.375], dtype="<f4")
    keep = [bf, f32]  # the specs point into these arrays; keep them alive
    serialize_file({"bf": spec(bf, "bfloat16"), "f32": spec(f32, "float32")}, path,
                   metadata=None)
    del keep


def write_sharded(dirpath):
    """Two shards and a transformers-style index (json.dumps(indent=2, sort_keys=True))."""
    shards = {
        "model-00001-of-00002.safetensors": {
            "a.weight": np.arange(6, dtype=np.float32).reshape(2, 3) + 0.25,
            "a.bias": np.array([1.0, 2.0], dtype=np.float32),
        },
        "model-00002-of-00002.safetensors": {
            "b.weight": (np.arange(4, dtype=np.float32) * -1.5).astype(np.float16),
            "b.bias": np.array([0.5], dtype=np.float32),
            "c.scale": np.array(-4.0, dtype=np.float32),
        },
    }
    weight_map, total = {}, 0
    for fname, tensors in shards.items():
        save_file(tensors, os.path.join(dirpath, fname), metadata={"format": "pt"})
        for name, arr in tensors.items():
            weight_map[name] = fname
            total += arr.nbytes
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    with open(os.path.join(dirpath, "model.safetensors.index.json"), "w") as f:
        f.write(json.dumps(index, indent=2, sort_keys=True) + "\n")


def raw(header, data=b"", n=None):
    h = header.encode() if isinstance(header, str) else header
    return struct.pack("<Q", len(h) if n is None else n) + h + data


def write_corpus(dirpath):
    """Seeds: the valid fixtures plus one hostile file per rule family, so the fuzzer starts
    next to every branch of the validator."""
    seeds = {}
    for name in ("numpy.safetensors", "bf16.safetensors"):
        with open(os.path.join(FIX, name), "rb") as f:
            seeds["valid_" + name] = f.read()
    ok = '{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}'
    seeds.update({
        "s1_short": b"\x02\x00\x00",
        "s1_n_too_big": raw("{}", n=1 << 62),
        "s1_n_past_end": raw("{}", n=3),
        "s2_not_object": raw("[]"),
        "s2_dup_key": raw('{"a":{},"a":{}}'),
        "s2_padded": raw("  {}   "),
        "s3_f64": raw('{"a":{"dtype":"F64","shape":[1],"data_offsets":[0,8]}}', bytes(8)),
        "s3_wrap_to_4": raw('{"a":{"dtype":"F32","shape":[4611686018427387905,4],'
                            '"data_offsets":[0,16]}}', bytes(16)),
        "s3_float_dim": raw('{"a":{"dtype":"F16","shape":[2.0],"data_offsets":[0,4]}}', bytes(4)),
        "s4_neg": raw('{"a":{"dtype":"F32","shape":[2],"data_offsets":[-8,0]}}', bytes(8)),
        "s5_overlap": raw('{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},'
                          '"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}', bytes(8)),
        "s5_zero_size": raw('{"z":{"dtype":"BF16","shape":[0,3],"data_offsets":[8,8]},'
                            '"y":{"dtype":"F16","shape":[4],"data_offsets":[0,8]},'
                            '"x":{"dtype":"F16","shape":[],"data_offsets":[8,10]}}', bytes(10)),
        "s5_trailing": raw(ok, bytes(9)),
        "s6_meta": raw('{"__metadata__":{"format":"pt","k":"v"},' + ok[1:], bytes(8)),
        "s6_meta_bad": raw('{"__metadata__":{"format":1}}'),
    })
    for name, data in seeds.items():
        with open(os.path.join(dirpath, name), "wb") as f:
            f.write(data)


def main():
    os.makedirs(os.path.join(FIX, "sharded"), exist_ok=True)
    os.makedirs(CORPUS, exist_ok=True)
    write_numpy_file(os.path.join(FIX, "numpy.safetensors"))
    write_bf16_file(os.path.join(FIX, "bf16.safetensors"))
    write_sharded(os.path.join(FIX, "sharded"))
    write_corpus(CORPUS)
    for d in (FIX, os.path.join(FIX, "sharded"), CORPUS):
        for name in sorted(os.listdir(d)):
            p = os.path.join(d, name)
            if os.path.isfile(p):
                size = os.path.getsize(p)
                assert size < 10 * 1024, p
                print(f"{os.path.relpath(p, ROOT)}: {size} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
