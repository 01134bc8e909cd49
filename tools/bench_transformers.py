#!/usr/bin/env python3
"""mmrt next to Hugging Face transformers on the CPU, on the same synthetic checkpoint.

Runs `mmrt-bench --json` (which writes the synthetic checkpoint into its cache folder the
first time), then loads that same folder with LlavaForConditionalGeneration.from_pretrained
and AutoProcessor.from_pretrained and times the same requests: the same image files, the
same prompt text, the same chat template, greedy decoding of the same number of tokens.
Prints both, and the ratios, as a table (or one JSON record with --json).

    python3 tools/bench_transformers.py --shape llava-1.5-7b --layers 4 --dtype f16

What is timed on the transformers side (the leanest loop transformers offers, so the
comparison does not charge it for generate()'s bookkeeping):
    time to first token = processor(images, text) + model(**inputs) → argmax of the last
                          logits (vision tower, projector and prefill in one forward)
    decode              = gen_tokens − 1 further forward calls of one token each with the
                          KV cache (past_key_values), greedy; tokens/s over those calls
Both sides: medians over --repeat requests after --warmup unmeasured ones, each request with
its own image file. torch runs with --threads threads (default: the CPU count), in the
checkpoint's dtype unless --hf-dtype says otherwise, attention "sdpa" unless --attn says
otherwise. Not part of CI: it needs torch, transformers and pillow.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]


def find_bench(explicit: str | None) -> str:
    if explicit:
        return explicit
    for build in ("build-bench", "build"):
        p = REPO_ROOT / build / "bin" / "mmrt-bench"
        if p.exists():
            return str(p)
    sys.exit("bench_transformers: no mmrt-bench found; build it or pass --mmrt-bench PATH")


def run_mmrt(args) -> dict:
    cmd = [find_bench(args.mmrt_bench), "--shape", args.shape, "--dtype", args.dtype,
           "--prompt-tokens", str(args.prompt_tokens), "--gen-tokens", str(args.gen_tokens),
           "--repeat", str(args.repeat), "--warmup", str(args.warmup), "--json", "--quiet"]
    if args.layers:
        cmd += ["--layers", str(args.layers)]
    if args.image_size:
        cmd += ["--image-size", str(args.image_size)]
    if args.cache:
        cmd += ["--cache", args.cache]
    if args.conf:
        cmd += ["--conf", args.conf]
    print("bench_transformers: " + " ".join(cmd), file=sys.stderr)
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        sys.exit(f"bench_transformers: mmrt-bench failed ({res.returncode}):\n{res.stderr}")
    rec = json.loads(res.stdout)
    rec["_command"] = " ".join(cmd)
    return rec


def run_hf(rec: dict, args) -> dict:
    import torch
    import transformers
    from PIL import Image
    from transformers import AutoProcessor, LlavaForConditionalGeneration

    threads = args.threads or os.cpu_count() or 1
    torch.set_num_threads(threads)
    dtypes = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}
    hf_dtype = args.hf_dtype or rec["dtype"]
    ckpt = rec["checkpoint"]
    t = time.perf_counter()
    try:
        model = LlavaForConditionalGeneration.from_pretrained(
            ckpt, dtype=dtypes[hf_dtype], attn_implementation=args.attn)
    except TypeError:  # transformers 4.x spells it torch_dtype
        model = LlavaForConditionalGeneration.from_pretrained(
            ckpt, torch_dtype=dtypes[hf_dtype], attn_implementation=args.attn)
    model.eval()
    processor = AutoProcessor.from_pretrained(ckpt)
    load_s = time.perf_counter() - t

    text = f"USER: <image>\n{rec['prompt']} ASSISTANT:"
    size = rec["image_size"]
    n_req = args.warmup + args.repeat
    images = [Path(ckpt) / f"image-{size}-{i}.png" for i in range(n_req)]
    ttft, pre, dec_tps, n_prompt = [], [], [], None
    for i in range(n_req):
        image = Image.open(images[i]).convert("RGB")
        with torch.inference_mode():
            t0 = time.perf_counter()
            inputs = processor(images=image, text=text, return_tensors="pt")
            t1 = time.perf_counter()
            out = model(**inputs, use_cache=True)
            tok = out.logits[0, -1].argmax()
            t2 = time.perf_counter()
            past = out.past_key_values
            for _ in range(args.gen_tokens - 1):
                out = model(input_ids=tok.view(1, 1), past_key_values=past, use_cache=True)
                past = out.past_key_values
                tok = out.logits[0, -1].argmax()
            t3 = time.perf_counter()
        n_prompt = int(inputs["input_ids"].shape[1])
        if i < args.warmup:
            continue
        pre.append((t1 - t0) * 1e3)
        ttft.append((t2 - t0) * 1e3)
        if args.gen_tokens > 1:
            dec_tps.append((args.gen_tokens - 1) / (t3 - t2))
    return {
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "threads": threads,
        "dtype": hf_dtype,
        "attn_implementation": args.attn,
        "load_s": load_s,
        "n_prompt_tokens": n_prompt,
        "preprocess_ms": statistics.median(pre),
        "ttft_ms": statistics.median(ttft),
        "decode_tokens_per_s": statistics.median(dec_tps) if dec_tps else None,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", default="llava-1.5-7b")
    ap.add_argument("--layers", type=int, default=0, help="cut both towers (0 = all)")
    ap.add_argument("--dtype", default="f16", choices=["f32", "f16", "bf16"],
                    help="checkpoint dtype")
    ap.add_argument("--hf-dtype", choices=["f32", "f16", "bf16"],
                    help="dtype transformers computes in (default: the checkpoint's)")
    ap.add_argument("--attn", default="sdpa", choices=["sdpa", "eager"])
    ap.add_argument("--prompt-tokens", type=int, default=32)
    ap.add_argument("--gen-tokens", type=int, default=32)
    ap.add_argument("--image-size", type=int, default=0)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (default: all CPUs)")
    ap.add_argument("--cache", help="mmrt-bench --cache folder")
    ap.add_argument("--conf", help="mmrt-bench --conf placement")
    ap.add_argument("--mmrt-bench", help="path of the mmrt-bench binary")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    mm = run_mmrt(args)
    hf = run_hf(mm, args)
    st = mm["stages"]
    m_ttft, m_tps = st["ttft_ms"]["value"], st["decode_tokens_per_s"]["value"]
    ratio_ttft = hf["ttft_ms"] / m_ttft if m_ttft else None
    ratio_tps = m_tps / hf["decode_tokens_per_s"] if hf["decode_tokens_per_s"] else None
    result = {
        "date": mm["date"], "machine": mm["machine"], "mmrt_command": mm["_command"],
        "shape": mm["shape"], "vision_layers": mm["vision_layers"],
        "text_layers": mm["text_layers"], "dtype": mm["dtype"],
        "n_prompt_tokens": mm["n_prompt_tokens"], "gen_tokens": mm["n_tokens"],
        "mmrt": {"ttft_ms": m_ttft, "decode_tokens_per_s": m_tps,
                 "preprocess_ms": st["preprocess_ms"]["value"],
                 "vision_ms": st["vision_ms"]["value"], "prefill_ms": st["prefill_ms"]["value"],
                 "limits": mm["limits"]},
        "transformers": hf,
        "speedup_ttft": ratio_ttft, "speedup_decode": ratio_tps,
    }
    if args.json:
        print(json.dumps(result, indent=1))
        return 0
    print(f"{mm['date']} — {mm['machine']['cpu']}, {mm['machine']['cores']} cores")
    print(f"shape {mm['shape']}: vision {mm['vision_layers']} / text {mm['text_layers']} layers, "
          f"{mm['dtype']} checkpoint; prompt {mm['n_prompt_tokens']} tokens (transformers: "
          f"{hf['n_prompt_tokens']}), {mm['n_tokens']} generated; medians of {args.repeat}")
    print(f"mmrt:         {mm['_command']}")
    print(f"transformers: {hf['transformers_version']} (torch {hf['torch_version']}, "
          f"{hf['threads']} threads, {hf['dtype']}, attn {hf['attn_implementation']})\n")
    print(f"{'':24}{'mmrt':>12}{'transformers':>14}{'mmrt faster':>13}")
    print(f"{'time to first token':24}{m_ttft:>10.1f}ms{hf['ttft_ms']:>12.1f}ms"
          f"{ratio_ttft:>12.2f}×")
    print(f"{'  of which preprocess':24}{st['preprocess_ms']['value']:>10.1f}ms"
          f"{hf['preprocess_ms']:>12.1f}ms")
    tps = hf["decode_tokens_per_s"]
    if tps:
        print(f"{'decode tokens/s':24}{m_tps:>12.2f}{tps:>14.2f}{ratio_tps:>12.2f}×")
    return 0


if __name__ == "__main__":
    sys.exit(main())
