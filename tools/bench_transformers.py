#!/usr/bin/env python3
"""mmrt next to Hugging Face transformers on the CPU, on the same synthetic checkpoint.

Runs `mmrt-bench --json` (which writes the synthetic checkpoint into its cache folder the
first time), loads that same folder with LlavaForConditionalGeneration.from_pretrained and
AutoProcessor.from_pretrained, and times the same requests on both: the same image files,
the same prompt text, the same chat template, greedy decoding of the same number of tokens.
The two alternate round by round (one mmrt-bench request after its own warm-up, then one
transformers request per thread count), so a busy neighbour slows both alike. Prints both
and the ratios as a table (or one JSON record with --json).

    python3 tools/bench_transformers.py --shape llava-1.5-7b --layers 4 --dtype f16

What is timed on the transformers side (the leanest loop transformers offers, so the
comparison does not charge it for generate()'s bookkeeping):
    time to first token = processor(images, text) + model(**inputs) → argmax of the last
                          logits (vision tower, projector and prefill in one forward)
    decode              = gen_tokens − 1 further forward calls of one token each with the
                          KV cache (past_key_values), greedy; tokens/s over those calls
Both sides: medians over --repeat rounds after --warmup unmeasured requests, on the same
image files. torch runs in the checkpoint's dtype unless --hf-dtype says otherwise, with
attention "sdpa" unless --attn says otherwise, once per thread count of --hf-threads
(default 1 and the CPU count); each transformers figure is the best over those thread
counts. mmrt-bench uses its default placement (every CPU) unless --conf says otherwise.
Not part of CI: it needs torch, transformers and pillow.
"""

from __future__ import annotations

import argparse
import inspect
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


def run_mmrt(args, repeat: int, warmup: int) -> dict:
    cmd = [find_bench(args.mmrt_bench), "--shape", args.shape, "--dtype", args.dtype,
           "--prompt-tokens", str(args.prompt_tokens), "--gen-tokens", str(args.gen_tokens),
           "--repeat", str(repeat), "--warmup", str(warmup), "--json", "--quiet"]
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


class Transformers:
    """The same checkpoint in transformers; request() times one request like mmrt-bench."""

    def __init__(self, rec: dict, args):
        import torch
        import transformers
        from transformers import AutoProcessor, LlavaForConditionalGeneration

        self.torch = torch
        # The synthetic config's eos_token_id is −1 on purpose (generation never stops
        # early); transformers warns about it at load time, which is expected here.
        transformers.logging.set_verbosity_error()
        dtypes = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}
        self.dtype = args.hf_dtype or rec["dtype"]
        ckpt = rec["checkpoint"]
        t = time.perf_counter()
        try:
            model = LlavaForConditionalGeneration.from_pretrained(
                ckpt, dtype=dtypes[self.dtype], attn_implementation=args.attn)
        except TypeError:  # transformers 4.x spells it torch_dtype
            model = LlavaForConditionalGeneration.from_pretrained(
                ckpt, torch_dtype=dtypes[self.dtype], attn_implementation=args.attn)
        self.model = model.eval()
        self.processor = AutoProcessor.from_pretrained(ckpt)
        self.load_s = time.perf_counter() - t
        self.versions = {"transformers_version": transformers.__version__,
                         "torch_version": torch.__version__}
        # transformers ≥ 5.x names the KV cache argument and output `cache` (past_key_values
        # is deprecated); 4.x only knows past_key_values.
        self.cache_kw = ("cache" if "cache" in inspect.signature(model.forward).parameters
                         else "past_key_values")
        self.text = f"USER: <image>\n{rec['prompt']} ASSISTANT:"
        self.ckpt, self.size, self.gen = ckpt, rec["image_size"], args.gen_tokens

    def _kv(self, out):
        return getattr(out, "cache", None) or out.past_key_values

    def request(self, image_index: int, threads: int) -> dict:
        from PIL import Image

        torch = self.torch
        torch.set_num_threads(threads)
        path = Path(self.ckpt) / f"image-{self.size}-{image_index}.png"
        image = Image.open(path).convert("RGB")
        with torch.inference_mode():
            t0 = time.perf_counter()
            inputs = self.processor(images=image, text=self.text, return_tensors="pt")
            t1 = time.perf_counter()
            out = self.model(**inputs, use_cache=True)
            tok = out.logits[0, -1].argmax()
            t2 = time.perf_counter()
            past = self._kv(out)
            for _ in range(self.gen - 1):
                out = self.model(input_ids=tok.view(1, 1), use_cache=True,
                                 **{self.cache_kw: past})
                past = self._kv(out)
                tok = out.logits[0, -1].argmax()
            t3 = time.perf_counter()
        return {"n_prompt_tokens": int(inputs["input_ids"].shape[1]),
                "preprocess_ms": (t1 - t0) * 1e3, "ttft_ms": (t2 - t0) * 1e3,
                "decode_tokens_per_s": (self.gen - 1) / (t3 - t2) if self.gen > 1 else None}


def med(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


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
    ap.add_argument("--repeat", type=int, default=3, help="interleaved rounds")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--hf-threads", default="",
                    help="comma-separated torch thread counts to try; each figure is the best "
                         "(default: 1 and the CPU count)")
    ap.add_argument("--cache", help="mmrt-bench --cache folder")
    ap.add_argument("--conf", help="mmrt-bench --conf placement")
    ap.add_argument("--mmrt-bench", help="path of the mmrt-bench binary")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    n_cpu = os.cpu_count() or 1
    threads = ([int(t) for t in args.hf_threads.split(",") if t] if args.hf_threads
               else sorted({1, n_cpu}))

    # Rounds alternate between the two (one mmrt-bench request — after its own warm-up —
    # then one transformers request per thread count), so a neighbour that takes the machine
    # for a while slows both sides alike instead of deciding the comparison.
    mm_rounds, hf_rounds = [], {t: [] for t in threads}
    hf = None
    for r in range(args.repeat):
        mm_rounds.append(run_mmrt(args, repeat=1, warmup=args.warmup))
        if hf is None:
            hf = Transformers(mm_rounds[0], args)
            for _ in range(args.warmup):
                for t in threads:
                    hf.request(0, t)
        # The image each mmrt-bench round measured (its warm-ups used the ones before it).
        for t in threads:
            hf_rounds[t].append(hf.request(args.warmup, t))
            print(f"bench_transformers: round {r + 1}, transformers {t} thread(s): "
                  f"{hf_rounds[t][-1]}", file=sys.stderr)
    mm = mm_rounds[0]
    m_stage = {k: med([x["stages"][k]["value"] for x in mm_rounds])
               for k in ("preprocess_ms", "vision_ms", "prefill_ms", "ttft_ms",
                         "decode_tokens_per_s")}
    by_threads = {t: {k: med([x[k] for x in rs]) for k in rs[0]} for t, rs in hf_rounds.items()}
    # Each transformers figure is the best over the thread counts tried: on a small machine
    # with busy neighbours torch's OpenMP barriers can make more threads much slower, and
    # mmrt should be held against transformers at its best.
    t_ttft = min(by_threads, key=lambda t: by_threads[t]["ttft_ms"])
    t_dec = max(by_threads, key=lambda t: by_threads[t]["decode_tokens_per_s"] or 0)
    h_ttft, h_tps = by_threads[t_ttft]["ttft_ms"], by_threads[t_dec]["decode_tokens_per_s"]
    m_ttft, m_tps = m_stage["ttft_ms"], m_stage["decode_tokens_per_s"]
    ratio_ttft = h_ttft / m_ttft if m_ttft else None
    ratio_tps = m_tps / h_tps if h_tps else None
    result = {
        "date": mm["date"], "machine": mm["machine"], "mmrt_command": mm["_command"],
        "shape": mm["shape"], "vision_layers": mm["vision_layers"],
        "text_layers": mm["text_layers"], "dtype": mm["dtype"],
        "n_prompt_tokens": mm["n_prompt_tokens"], "gen_tokens": mm["n_tokens"],
        "rounds": args.repeat,
        "mmrt": {**m_stage, "limits": [x["limits"] for x in mm_rounds],
                 "cpu_share": [x.get("cpu_share") for x in mm_rounds]},
        "transformers": {**hf.versions, "dtype": hf.dtype, "attn_implementation": args.attn,
                         "load_s": hf.load_s, "ttft_ms": h_ttft, "ttft_threads": t_ttft,
                         "decode_tokens_per_s": h_tps, "decode_threads": t_dec,
                         "n_prompt_tokens": by_threads[t_ttft]["n_prompt_tokens"],
                         "preprocess_ms": by_threads[t_ttft]["preprocess_ms"],
                         "by_threads": by_threads},
        "speedup_ttft": ratio_ttft, "speedup_decode": ratio_tps,
    }
    if args.json:
        print(json.dumps(result, indent=1))
        return 0
    print(f"{mm['date']} — {mm['machine']['cpu']}, {mm['machine']['cores']} cores")
    print(f"shape {mm['shape']}: vision {mm['vision_layers']} / text {mm['text_layers']} layers, "
          f"{mm['dtype']} checkpoint; prompt {mm['n_prompt_tokens']} tokens (transformers: "
          f"{result['transformers']['n_prompt_tokens']}), {mm['n_tokens']} generated; medians "
          f"of {args.repeat} interleaved rounds")
    print(f"mmrt:         {mm['_command']}")
    print(f"transformers: {hf.versions['transformers_version']} (torch "
          f"{hf.versions['torch_version']}, {hf.dtype}, attn {args.attn}; best of threads "
          f"{','.join(str(t) for t in threads)}: TTFT with {t_ttft}, decode with {t_dec})\n")
    print(f"{'':24}{'mmrt':>12}{'transformers':>14}{'mmrt faster':>13}")
    print(f"{'time to first token':24}{m_ttft:>10.1f}ms{h_ttft:>12.1f}ms{ratio_ttft:>12.2f}×")
    print(f"{'  of which preprocess':24}{m_stage['preprocess_ms']:>10.1f}ms"
          f"{by_threads[t_ttft]['preprocess_ms']:>12.1f}ms")
    if h_tps:
        print(f"{'decode tokens/s':24}{m_tps:>12.2f}{h_tps:>14.2f}{ratio_tps:>12.2f}×")
    return 0


if __name__ == "__main__":
    sys.exit(main())
