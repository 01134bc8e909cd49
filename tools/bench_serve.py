#!/usr/bin/env python3
"""tools/bench_serve.py — throughput and latency of `mmrt serve` at several concurrencies.

Drives a running server with C concurrent streaming clients (Python stdlib only: raw HTTP
and SSE), each sending R requests with its own synthetic PNG (so no vision-cache hit unless
--same-image), and reports per concurrency: requests/s, generated tokens/s, time to first
token p50/p90/p99 and inter-token latency p50/p90/p99. Figures go to docs/BENCHMARKS.md next
to `mmrt-bench --batch C --concurrency C` on the same checkpoint, which is the same workload
through the embedding API, so the difference is the server's overhead.

    build/bin/mmrt serve --conf bench.ini --port 8090 &
    python3 tools/bench_serve.py --url http://127.0.0.1:8090 --model NAME \
        --concurrency 1,4,8,16 --requests 2 --image-size 336 --max-tokens 64

--n N asks for N choices per request (each client's requests then report the time until
every choice has its first token too); --temperature samples (each request seeded);
--json-schema FILE holds every answer to that JSON Schema (response_format json_schema).
"""
import argparse
import base64
import http.client
import json
import random
import statistics
import struct
import threading
import time
import urllib.parse
import zlib


def png(width, height, seed):
    """A noise PNG of the given size (RGB, 8 bits), so every request's image differs."""
    rng = random.Random(seed)
    rows = b"".join(b"\x00" + bytes(rng.getrandbits(8) for _ in range(width * 3))
                    for _ in range(height))

    def chunk(tag, data):
        c = struct.pack(">I", len(data)) + tag + data
        return c + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2,
                                                              0, 0, 0)) +
            chunk(b"IDAT", zlib.compress(rows, 1)) + chunk(b"IEND", b""))


def pct(xs, p):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def one_request(url, body):
    """Returns (ttft_s, [inter-token gaps], tokens, total_s, last_ttft_s) of one streamed
    completion: the first token of any choice, the gaps between a choice's tokens, and the
    time until every choice had its first token."""
    u = urllib.parse.urlparse(url)
    c = http.client.HTTPConnection(u.hostname, u.port, timeout=600)
    t0 = time.perf_counter()
    c.request("POST", "/v1/chat/completions", body=body,
              headers={"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        raise RuntimeError(f"HTTP {r.status}: {r.read()[:300]!r}")
    ttft, last, gaps, tokens = None, {}, [], 0
    first = {}  # choice index -> time of its first token
    while True:
        line = r.readline()
        if not line:
            break
        line = line.strip()
        if not line.startswith(b"data: "):
            continue
        data = line[6:]
        if data == b"[DONE]":
            break
        ev = json.loads(data)
        for ch in ev.get("choices", []):
            if ch.get("delta", {}).get("content"):
                now, i = time.perf_counter(), ch.get("index", 0)
                if ttft is None:
                    ttft = now - t0
                if i in last:
                    gaps.append(now - last[i])
                else:
                    first[i] = now - t0
                last[i] = now
        if ev.get("usage"):
            tokens = ev["usage"]["completion_tokens"]
    c.close()
    return ttft, gaps, tokens, time.perf_counter() - t0, max(first.values(), default=None)


def run(args, conc):
    schema = None
    if args.json_schema:
        with open(args.json_schema, encoding="utf-8") as f:
            schema = json.load(f)
    ttfts, last_ttfts, walls, gaps, tokens, errors = [], [], [], [], [0], []
    lock = threading.Lock()

    def client(k):
        for j in range(args.requests):
            seed = 0 if args.same_image else 1000 * conc + args.requests * k + j
            img = base64.b64encode(png(args.image_size, args.image_size, seed)).decode()
            prompt = " ".join(["describe"] * args.prompt_words)
            req = {
                "model": args.model, "max_tokens": args.max_tokens,
                "temperature": args.temperature, "seed": seed, "n": args.n,
                "stream": True, "stream_options": {"include_usage": True},
                "messages": [{"role": "user", "content": [
                    {"type": "image_url", "image_url": {"url": "data:image/png;base64," + img}},
                    {"type": "text", "text": prompt}]}]}
            if schema is not None:
                req["response_format"] = {"type": "json_schema", "json_schema": {
                    "name": "bench", "strict": True, "schema": schema}}
            body = json.dumps(req).encode()
            try:
                t, g, n, w, tl = one_request(args.url, body)
                with lock:
                    if t is not None:
                        ttfts.append(t)
                    if tl is not None:
                        last_ttfts.append(tl)
                    walls.append(w)
                    gaps.extend(g)
                    tokens[0] += n
            except Exception as e:  # noqa: BLE001 (counted and printed)
                with lock:
                    errors.append(repr(e))
    t0 = time.perf_counter()
    ts = [threading.Thread(target=client, args=(k,)) for k in range(conc)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    wall = time.perf_counter() - t0
    n_req = conc * args.requests
    return {
        "concurrency": conc, "requests": n_req, "errors": len(errors), "wall_s": wall,
        "requests_per_s": n_req / wall, "tokens_per_s": tokens[0] / wall,
        "ttft_p50_s": pct(ttfts, 50), "ttft_p90_s": pct(ttfts, 90), "ttft_p99_s": pct(ttfts, 99),
        "n": args.n, "last_choice_ttft_p50_s": pct(last_ttfts, 50),
        "request_s_p50": pct(walls, 50),
        "itl_p50_ms": pct(gaps, 50) * 1e3, "itl_p90_ms": pct(gaps, 90) * 1e3,
        "itl_p99_ms": pct(gaps, 99) * 1e3, "first_error": errors[0] if errors else None,
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--concurrency", default="1,4,8,16")
    ap.add_argument("--requests", type=int, default=2, help="per client")
    ap.add_argument("--image-size", type=int, default=336)
    ap.add_argument("--prompt-words", type=int, default=24)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--same-image", action="store_true")
    ap.add_argument("--n", type=int, default=1, help="choices per request (OpenAI's n)")
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--json-schema", default=None, help="a JSON Schema file every answer is "
                    "held to")
    args = ap.parse_args()
    rows = [run(args, int(c)) for c in args.concurrency.split(",")]
    if args.json:
        print(json.dumps(rows, indent=1))
        return
    print("conc  req  err   req/s   tok/s   TTFT p50/p90/p99 s      ITL p50/p90/p99 ms"
          "   last choice TTFT p50 s   request p50 s")
    for r in rows:
        print(f"{r['concurrency']:4d} {r['requests']:4d} {r['errors']:4d} "
              f"{r['requests_per_s']:7.3f} {r['tokens_per_s']:7.2f}   "
              f"{r['ttft_p50_s']:6.2f} {r['ttft_p90_s']:6.2f} {r['ttft_p99_s']:6.2f}   "
              f"{r['itl_p50_ms']:7.1f} {r['itl_p90_ms']:7.1f} {r['itl_p99_ms']:7.1f}   "
              f"{r['last_choice_ttft_p50_s']:22.2f}   {r['request_s_p50']:13.2f}")


if __name__ == "__main__":
    main()
