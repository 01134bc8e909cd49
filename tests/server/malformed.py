#!/usr/bin/env python3
"""Malformed chat-completion request bodies, each labelled with the status mmrt serve answers.

    cases(valid_image_data_uri, model) -> [(name, body_bytes, expected_status), ...]

Deterministic (a fixed seed, no clock, no environment), Python 3.11 standard library only. The
HTTP harness sends every body to POST /v1/chat/completions and expects exactly that status;
none of them may get a 5xx. Every label is what server/openai_request.c answers (404 for a
model that is not the served one, 400 for everything else here), proven by
tests/server/malformed_check.c, which runs every body through the parser under several
server configurations (1 or 32 images per request, image_dir off or on) in the test suite.

So that a label holds for any server and any model, no body here relies on a configuration:
too many images means more than 32 (the most any mmrt model takes); local paths name files
that cannot exist or lie outside any image directory; no body is over a plausible size cap
(the largest carries 40 copies of the caller's image, or about 300 KB besides).
Bodies that the parser would accept and only the runtime refuses (a truncated PNG, a prompt
over the context) are not here: their label would depend on the model.

Command line:
    malformed.py [--model M] [--image-uri URI] --dump FILE|-   cases for a C or shell harness:
        per case a line "STATUS LENGTH NAME\\n", the LENGTH body bytes, then "\\n"
    malformed.py [--model M] [--image-uri URI] --summary        counts per category
"""
from __future__ import annotations

import argparse
import base64
import json
import random
import sys

# A 1x1 RGB PNG, for the command line's default.
DEFAULT_IMAGE_URI = ("data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADE"
                     "lEQVR4nGP4z8AAAAMBAQDJ/pLvAAAAAElFTkSuQmCC")
SEED = 20240613
MAX_IMAGES_ANY_MODEL = 32
MAX_STOP = 16
MAX_STOP_BYTES = 256
MAX_DEPTH = 16
MAX_MESSAGES = 4096

BAD_REQUEST = 400
NOT_FOUND = 404

Case = tuple[str, bytes, int]


def enc(obj) -> bytes:
    """Compact JSON, UTF-8, as a client library sends it (no trailing whitespace)."""
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


class Gen:
    def __init__(self, image_uri: str, model: str):
        if "," not in image_uri or not image_uri.lower().startswith("data:"):
            raise ValueError("valid_image_data_uri must be a data: URI")
        self.uri = image_uri
        self.head, self.payload = image_uri.split(",", 1)
        self.model = model
        self.rng = random.Random(SEED)
        self.out: list[Case] = []
        self.names: set[str] = set()

    # ---- helpers ----

    def add(self, name: str, body: bytes | dict | list | str, status: int = BAD_REQUEST):
        if not isinstance(body, bytes):
            body = enc(body) if not isinstance(body, str) else body.encode("utf-8")
        # names are printable ASCII without spaces, so any harness can log them
        name = "".join(ch if "!" <= ch <= "~" else f"\\x{ord(ch):02x}" for ch in name)
        if name in self.names:
            raise AssertionError(f"duplicate case name {name}")
        self.names.add(name)
        self.out.append((name, body, status))

    def req(self, messages=None, **extra) -> dict:
        body = {"model": self.model,
                "messages": messages if messages is not None else [self.user("Describe it.")]}
        body.update(extra)
        return body

    @staticmethod
    def user(content) -> dict:
        return {"role": "user", "content": content}

    def image_part(self, url: str | None = None) -> dict:
        return {"type": "image_url", "image_url": {"url": self.uri if url is None else url}}

    def image_req(self, url: str) -> dict:
        return self.req([self.user([{"type": "text", "text": "What is this?"},
                                    self.image_part(url)])])

    def bases(self) -> dict[str, bytes]:
        """Valid requests, whose damaged copies are the cases."""
        return {
            "minimal": enc(self.req()),
            "image": enc(self.req([self.user([{"type": "text", "text": "What is in it?"},
                                              self.image_part()])])),
            "chat": enc(self.req([{"role": "system", "content": "Be brief."},
                                  self.user("Hello"),
                                  {"role": "assistant", "content": "Hi! \u00e9\u4e2d\U0001f600"},
                                  self.user("Again?")],
                                 temperature=0.2, max_tokens=8, stop=["\n"], seed=1)),
            "stream": enc(self.req(stream=True, stream_options={"include_usage": True},
                                   top_p=0.5, top_k=3)),
        }

    # ---- categories ----

    def broken_json(self):
        for bname, b in self.bases().items():
            # Every proper prefix of a compact JSON object is incomplete: truncated bodies
            # (a client or proxy that cut the upload). Up to ~120 cut points per base.
            cuts = sorted(set(range(0, len(b), max(1, len(b) // 120))) | {len(b) - 1, 1, 2})
            for n in cuts:
                self.add(f"truncated/{bname}/{n}", b[:n])
            # Structure damaged in ways that can never be valid.
            self.add(f"json/{bname}/trailing-garbage", b + b"x")
            self.add(f"json/{bname}/two-objects", b + b"{}")
            self.add(f"json/{bname}/trailing-comma-after", b + b",")
            self.add(f"json/{bname}/trailing-nul", b + b"\x00")
            self.add(f"json/{bname}/leading-garbage", b"x" + b)
            self.add(f"json/{bname}/bom", b"\xef\xbb\xbf" + b)
            self.add(f"json/{bname}/utf16", b.decode("utf-8").encode("utf-16"))
            self.add(f"json/{bname}/no-closing-brace", b[:-1] + b" ")
            self.add(f"json/{bname}/extra-closing", b + b"}")
            self.add(f"json/{bname}/single-quotes", b.replace(b'"', b"'"))
            self.add(f"json/{bname}/unquoted-keys", b.replace(b'"model"', b"model"))
            self.add(f"json/{bname}/missing-colon", b.replace(b'"model":', b'"model" ', 1))
            self.add(f"json/{bname}/missing-comma", b.replace(b',"messages"', b' "messages"', 1))
            self.add(f"json/{bname}/trailing-comma-object", b[:-1] + b",}")
            self.add(f"json/{bname}/comment", b[:-1] + b"/* c */}")
            self.add(f"json/{bname}/line-comment", b"// c\n" + b)
            self.add(f"json/{bname}/nul-inside", b[:5] + b"\x00" + b[5:])
            self.add(f"json/{bname}/wrapped-in-array", b"[" + b + b"]")
            self.add(f"json/{bname}/escaped-nul", b.replace(b'"messages"', b'"mes\\u0000sages"', 1))
        for i, raw in enumerate([b"", b" ", b"\n", b"{", b"}", b"[", b"]", b"null", b"true",
                                 b"false", b"0", b"-1", b"1e400", b'"text"', b"[]", b"[{}]",
                                 b"{}", b"{:}", b'{"a"}', b'{"a":}', b'{"a" 1}', b"{,}",
                                 b"\x00", b"\xff\xfe", b"NaN", b"undefined", b"{\"model\"\x00}",
                                 b"model=m&messages=hi", b"<xml/>", b"\x1f\x8b\x08\x00"]):
            self.add(f"json/raw/{i}", raw)
        # JSON that is invalid in value syntax
        for i, v in enumerate([b"01", b".5", b"+1", b"1.", b"1e", b"-", b"0x10", b"NaN",
                               b"Infinity", b"-Infinity", b"nan", b"1_000", b"TRUE", b"Null",
                               b"'x'", b'"\\x41"', b'"\\u12"', b'"\\uZZZZ"', b'"a\nb"',
                               b'"a\tb"', b'"\\ud800"', b'"\\udc00x"', b'"\\ud800\\u0041"']):
            self.add(f"json/value/{i}", b'{"model":' + json.dumps(self.model).encode() +
                     b',"messages":[{"role":"user","content":"hi"}],"temperature":' + v + b"}")

    def duplicate_keys(self):
        m = json.dumps(self.model)
        msg = '[{"role":"user","content":"hi"}]'
        for name, body in [
            ("model", f'{{"model":{m},"model":{m},"messages":{msg}}}'),
            ("messages", f'{{"model":{m},"messages":{msg},"messages":{msg}}}'),
            ("stream", f'{{"model":{m},"messages":{msg},"stream":true,"stream":false}}'),
            ("temperature", f'{{"model":{m},"messages":{msg},"temperature":1,"temperature":1}}'),
            ("role", f'{{"model":{m},"messages":[{{"role":"user","role":"user","content":"hi"}}]}}'),
            ("content", f'{{"model":{m},"messages":[{{"role":"user","content":"a","content":"b"}}]}}'),
            ("part-type", f'{{"model":{m},"messages":[{{"role":"user","content":[{{"type":"text",'
                          f'"type":"text","text":"a"}}]}}]}}'),
            ("part-text", f'{{"model":{m},"messages":[{{"role":"user","content":[{{"type":"text",'
                          f'"text":"a","text":"b"}}]}}]}}'),
            ("url", f'{{"model":{m},"messages":[{{"role":"user","content":[{{"type":"image_url",'
                    f'"image_url":{{"url":"{self.uri}","url":"{self.uri}"}}}}]}}]}}'),
            ("stream-options", f'{{"model":{m},"messages":{msg},"stream":true,"stream_options":'
                               f'{{"include_usage":true,"include_usage":true}}}}'),
            ("metadata", f'{{"model":{m},"messages":{msg},"metadata":{{"a":"1","a":"2"}}}}'),
            ("case-differs-is-unknown", f'{{"model":{m},"messages":{msg},"Model":{m}}}'),
        ]:
            self.add(f"duplicate/{name}", body)

    def invalid_utf8(self):
        seqs = {"ff": b"\xff", "fe": b"\xfe", "c3-28": b"\xc3\x28", "lone-cont": b"\x80",
                "overlong-slash": b"\xc0\xaf", "overlong-nul": b"\xc0\x80",
                "overlong-3": b"\xe0\x80\xaf", "surrogate": b"\xed\xa0\x80",
                "surrogate-low": b"\xed\xbf\xbf", "cut-3": b"\xe2\x82", "cut-4": b"\xf0\x9f\x98",
                "above-10ffff": b"\xf4\x90\x80\x80", "f5": b"\xf5\x80\x80\x80",
                "5-byte": b"\xf8\x88\x80\x80\x80", "latin1": "caf\u00e9".encode("latin-1")}
        places = {
            "content": self.req([self.user("@@X@@")]),
            "part-text": self.req([self.user([{"type": "text", "text": "a@@X@@b"}])]),
            "model": {"model": "@@X@@", "messages": [self.user("hi")]},
            "key": {"model": self.model, "messages": [self.user("hi")], "@@X@@": 1},
            "stop": self.req(stop=["@@X@@"]),
            "role": self.req([{"role": "us@@X@@er", "content": "hi"}]),
            "url": self.image_req("data:image/png;base64,@@X@@"),
            "system": self.req([{"role": "system", "content": "@@X@@"}, self.user("hi")]),
        }
        for pname, obj in places.items():
            b = enc(obj)
            for sname, seq in seqs.items():
                self.add(f"utf8/{pname}/{sname}", b.replace(b"@@X@@", seq))
            # escapes that name no character or a NUL
            for ename, esc in {"lone-high": b"\\ud83d", "lone-low": b"\\ude00",
                               "reversed": b"\\ude00\\ud83d", "nul": b"\\u0000"}.items():
                self.add(f"utf8/{pname}/escape-{ename}", b.replace(b"@@X@@", esc))

    def deep_nesting(self):
        prefix = b'{"model":' + json.dumps(self.model).encode() + \
            b',"messages":[{"role":"user","content":"hi"}],"metadata":'
        for depth in list(range(MAX_DEPTH, MAX_DEPTH + 8)) + [32, 64, 128, 1000, 5000]:
            # metadata at depth 1 of the body, so the body reaches depth + 1
            self.add(f"deep/metadata-arrays/{depth}", prefix + b"[" * depth + b"]" * depth + b"}")
            self.add(f"deep/metadata-objects/{depth}",
                     prefix + b'{"a":' * depth + b"1" + b"}" * depth + b"}")
            self.add(f"deep/unclosed/{depth}", prefix + b"[" * depth)
        for depth in [20, 100, 10000, 100000]:
            self.add(f"deep/bare/{depth}", b"[" * depth + b"]" * depth)
            self.add(f"deep/bare-objects/{depth}", b'{"a":' * depth + b"0" + b"}" * depth)
        # deep inside the content of a message
        inner = {"type": "text", "text": "x"}
        for depth in [MAX_DEPTH, 30]:
            v = inner
            for _ in range(depth):
                v = [v]
            self.add(f"deep/content/{depth}", self.req([self.user(v)]))

    # Values of every JSON type; each field refuses those not in its valid set.
    POOL = {"string": "x", "empty-string": "", "int": 1, "zero": 0, "negative": -1,
            "real": 1.5, "true": True, "false": False, "empty-array": [],
            "array": [1], "array-of-strings": ["a"], "empty-object": {}, "object": {"a": 1}}

    # field -> names of POOL values it accepts (null is accepted by every optional field)
    TOP_VALID = {
        "max_tokens": {"int"}, "max_completion_tokens": {"int"},
        "temperature": {"int", "zero", "real"}, "top_p": {"int"},
        "top_k": {"int", "zero"}, "seed": {"int", "zero", "negative"},
        "stop": {"string", "empty-array", "array-of-strings"}, "stream": {"true", "false"},
        "stream_options": set(), "n": {"int"}, "user": {"string", "empty-string"},
        "metadata": {"empty-object", "object"}, "store": {"true", "false"},
        "service_tier": {"string", "empty-string"},
        "presence_penalty": {"int", "zero", "negative", "real"},
        "frequency_penalty": {"int", "zero", "negative", "real"},
        "repetition_penalty": {"int", "real"},
        "logit_bias": {"empty-object"}, "logprobs": {"true", "false"}, "response_format": set(),
        "parallel_tool_calls": {"true", "false"}, "tools": {"empty-array"},
        "functions": {"empty-array"}, "tool_choice": set(), "function_call": set(),
        "modalities": set(), "top_logprobs": {"zero"}, "audio": set(), "prediction": set(),
        "web_search_options": set(),
    }

    def wrong_types(self):
        for field, valid in self.TOP_VALID.items():
            for vname, v in self.POOL.items():
                if vname not in valid:
                    self.add(f"type/{field}/{vname}", self.req(**{field: v}))
        for vname, v in self.POOL.items():
            if vname not in {"string", "empty-string"}:
                self.add(f"type/model/{vname}", {"model": v, "messages": [self.user("hi")]})
            if vname not in {"array", "array-of-strings"}:  # [1], ["a"]: bad messages anyway
                self.add(f"type/messages/{vname}", {"model": self.model, "messages": v})
            else:
                self.add(f"type/messages/{vname}", {"model": self.model, "messages": v})
        for vname, v in self.POOL.items():
            if vname not in {"string", "empty-string"}:
                self.add(f"type/message-role/{vname}", self.req([{"role": v, "content": "hi"}]))
                self.add(f"type/message-name/{vname}",
                         self.req([{"role": "user", "content": "hi", "name": v}]))
                self.add(f"type/part-type/{vname}", self.req([self.user([{"type": v,
                                                                          "text": "hi"}])]))
                self.add(f"type/part-text/{vname}", self.req([self.user([{"type": "text",
                                                                          "text": v}])]))
                self.add(f"type/image-url/{vname}", self.image_req_obj({"url": v}))
                self.add(f"type/image-detail/{vname}",
                         self.image_req_obj({"url": self.uri, "detail": v}))
                self.add(f"type/stop-item/{vname}", self.req(stop=["a", v]))
            if vname not in {"string", "empty-string", "array-of-strings", "empty-array"}:
                # content "", [] (empty, refused) and ["a"] (a part that is not an object)
                self.add(f"type/message-content/{vname}",
                         self.req([{"role": "user", "content": v}]))
            if vname not in {"empty-object", "object"}:
                self.add(f"type/message/{vname}", self.req([v]))
                self.add(f"type/part/{vname}", self.req([self.user([v])]))
                self.add(f"type/image_url-field/{vname}",
                         self.req([self.user([{"type": "image_url", "image_url": v}])]))
            if vname not in {"true", "false"}:
                self.add(f"type/include_usage/{vname}",
                         self.req(stream=True, stream_options={"include_usage": v}))
        self.add("type/message-content/array-of-strings",
                 self.req([{"role": "user", "content": ["a"]}]))
        self.add("type/message-content/empty-array", self.req([{"role": "user", "content": []}]))

    def image_req_obj(self, image_url: dict) -> dict:
        return self.req([self.user([{"type": "text", "text": "?"},
                                    {"type": "image_url", "image_url": image_url}])])

    def numbers(self):
        big = {
            "max_tokens": ["0", "-1", "2147483648", "4294967296", "9223372036854775807",
                           "9223372036854775808", "-9223372036854775809",
                           "100000000000000000000000000000", "1e3", "1.0", "1e400", "-0"],
            "max_completion_tokens": ["0", "-5", "2147483648", "99999999999999999999", "2.5"],
            "temperature": ["2.0000001", "-0.0001", "3", "-1", "1e308", "-1e308", "1e400",
                            "1e-400e", "100", "9223372036854775808"],
            "top_p": ["0", "-0.0", "1.0000001", "2", "-1", "1e400", "0e0"],
            "top_k": ["-1", "-2147483648", "2147483648", "1.5", "1e2", "9223372036854775808"],
            "seed": ["1.5", "1e3", "9223372036854775808", "-9223372036854775809",
                     "18446744073709551615", "1e400"],
            "n": ["0", "17", "-1", "128", "1.0", "9223372036854775808"],
            "presence_penalty": ["2.0000001", "-2.0000001", "3", "-1e308", "1e400"],
            "frequency_penalty": ["2.5", "-2.1", "1e308", "1e400"],
            "repetition_penalty": ["0", "-0.0", "-1", "100.0001", "1e308", "1e400"],
            # no "logprobs": true in these bodies, so 1 … 20 are refused as well
            "top_logprobs": ["-1", "21", "1", "20", "1.5", "1e400", "9223372036854775808"],
        }
        head = b'{"model":' + json.dumps(self.model).encode() + \
            b',"messages":[{"role":"user","content":"hi"}],'
        for field, values in big.items():
            for v in values:
                self.add(f"number/{field}/{v}", head + f'"{field}":{v}'.encode() + b"}")
        self.add("number/max-tokens-disagree", self.req(max_tokens=5, max_completion_tokens=6))
        self.add("number/max-tokens-disagree-big",
                 self.req(max_tokens=1, max_completion_tokens=2147483647))

    def base64_damage(self):
        p = self.payload
        alphabet = set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/")
        bad_chars = {"space": " ", "newline": "\n", "cr": "\r", "tab": "\t", "dash": "-",
                     "underscore": "_", "dot": ".", "star": "*", "at": "@", "percent": "%",
                     "bang": "!", "tilde": "~", "e-acute": "\u00e9", "nbsp": "\u00a0",
                     "backslash": "\\", "quote": '"', "colon": ":", "comma": ","}
        n = len(p)
        positions = sorted({0, 1, 2, 3, n // 4, n // 3, n // 2, n - 4, n - 3, n - 2, n - 1} |
                           {self.rng.randrange(n) for _ in range(6)})
        positions = [i for i in positions if 0 <= i < n]
        for cname, c in bad_chars.items():
            for i in positions:
                self.add(f"base64/insert-{cname}/{i}",
                         self.image_req(f"{self.head},{p[:i]}{c}{p[i:]}"))
            for i in positions[::3]:
                self.add(f"base64/replace-{cname}/{i}",
                         self.image_req(f"{self.head},{p[:i]}{c}{p[i + 1:]}"))
        for k in (1, 2, 3):
            self.add(f"base64/cut-end/{k}", self.image_req(f"{self.head},{p[:-k]}"))
            self.add(f"base64/cut-middle/{k}",
                     self.image_req(f"{self.head},{p[:n // 2]}{p[n // 2 + k:]}"))
            self.add(f"base64/append-eq/{k}", self.image_req(f"{self.head},{p}" + "=" * k))
            self.add(f"base64/append-A/{k}", self.image_req(f"{self.head},{p}" + "A" * k))
        for i in sorted({0, 1, n // 2, n - 5}):
            if 0 <= i < n - 2:
                self.add(f"base64/eq-in-middle/{i}", self.image_req(f"{self.head},{p[:i]}={p[i+1:]}"))
        stripped = p.rstrip("=")
        if stripped != p:
            self.add("base64/no-padding", self.image_req(f"{self.head},{stripped}"))
            # the unused low bits of the last character set: not the canonical encoding
            last = stripped[-1]
            vals = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
            v = vals.index(last) | 1
            self.add("base64/noncanonical",
                     self.image_req(f"{self.head},{stripped[:-1]}{vals[v]}{p[len(stripped):]}"))
        if "+" in p or "/" in p:
            self.add("base64/urlsafe",
                     self.image_req(f"{self.head},{p.replace('+', '-').replace('/', '_')}"))
        width = 76 if n > 76 else max(4, n // 3)
        self.add("base64/mime-wrapped",
                 self.image_req(f"{self.head}," + "\n".join(p[i:i + width] for i in range(0, n, width))))
        self.add("base64/crlf-wrapped",
                 self.image_req(f"{self.head}," + "\r\n".join(p[i:i + width] for i in range(0, n, width))))
        self.add("base64/leading-space", self.image_req(f"{self.head}, {p}"))
        self.add("base64/trailing-newline", self.image_req(f"{self.head},{p}\n"))
        self.add("base64/empty", self.image_req(f"{self.head},"))
        self.add("base64/only-padding", self.image_req(f"{self.head},===="))
        self.add("base64/percent-encoded", self.image_req(f"{self.head}," + "".join(
            f"%{ord(ch):02X}" if ch not in alphabet else ch for ch in p).replace("A", "%41")))
        # valid base64 of bytes that are no image
        for i, junk in enumerate([b"hello world", b"GIF89a\x01\x00\x01\x00", b"RIFF\x00\x00WEBP",
                                  b"BM" + b"\x00" * 10, b"<svg/>", b"\x00", b"\x89PN",
                                  b"\xff\xd8", bytes(range(256)), b"%PDF-1.4"]):
            self.add(f"base64/not-an-image/{i}",
                     self.image_req("data:image/png;base64," + base64.b64encode(junk).decode()))

    def media_types(self):
        p = self.payload
        for i, t in enumerate(["image/gif", "image/webp", "image/bmp", "image/tiff",
                               "image/svg+xml", "image/avif", "image/heic", "image/x-icon",
                               "image/", "image", "", "text/plain", "text/html",
                               "application/octet-stream", "application/json", "video/mp4",
                               "audio/wav", "image/png2", "image/pngx", "image/png ",
                               " image/png", "image/jpeg2", "IMAGE/GIF", "image/*", "*/*",
                               "image/png\u0000", "image/p\u00e9ng"]):
            self.add(f"media/{i}", self.image_req(f"data:{t};base64,{p}"))
        for i, h in enumerate(["data:image/png", "data:image/png;base32", "data:image/png;base64;",
                               "data:image/png;charset=utf-8;base64",
                               "data:image/png;name=x.png;base64", "data:image/png;;base64",
                               "data:image/png;base64;base64", "data:image/png;b64",
                               "data:image/png;base-64", "data:image/png;base64 ",
                               "data:image/jpeg;param", "data:image/jpeg;utf8"]):
            self.add(f"media/header/{i}", self.image_req(f"{h},{p}"))
        self.add("media/no-comma", self.image_req("data:image/png;base64" + p))
        self.add("media/no-colon", self.image_req("data image/png;base64," + p))

    def urls(self):
        for i, u in enumerate([
            "http://example.com/cat.png", "https://example.com/cat.png",
            "HTTP://EXAMPLE.COM/CAT.PNG", "https://localhost/a.png", "http://127.0.0.1:8080/a.png",
            "http://[::1]/a.png", "https://169.254.169.254/latest/meta-data/",
            "http://metadata.google.internal/", "https://user:pass@example.com/a.jpg",
            "https:", "http:", "https://", "http:///a.png", "ftp://example.com/a.png",
            "sftp://host/a.png", "gopher://host/", "javascript:alert(1)", "blob:https://x/1",
            "s3://bucket/key.png", "gs://bucket/key.png", "mailto:a@b", "ws://host/",
            "C:\\images\\a.png", "c:/images/a.png", "about:blank", "urn:isbn:1", "x:",
            "file://example.com/etc/passwd", "file:/etc/passwd", "file:", "file://",
            "file:etc/passwd", "file:///mmrt-malformed/a.png?x=1", "file:///mmrt-malformed/a.png#f",
            "file:///a%00.png", "file:///a%zz.png", "file:///a%2",
        ]):
            self.add(f"url/{i}", self.image_req(u))
        # local paths: outside any image directory, or names no directory holds, or "..";
        # refused whether the server has image_dir or not.
        for i, u in enumerate([
            "/etc/passwd", "/etc/shadow", "/proc/self/environ", "/dev/zero", "/dev/stdin", "/",
            "//etc/passwd", "/../../etc/passwd", "../../../../etc/passwd", "..", "../",
            "./../x.png", "a/../../b.png", "mmrt-malformed-does-not-exist.png",
            "mmrt-malformed/does/not/exist.png", "file:///etc/passwd", "file:///proc/self/maps",
            "file://localhost/etc/hosts", "file:///../etc/passwd", "file:///%2e%2e/etc/passwd",
            "mmrt-malformed-%2e%2e.png", "", "\u00e9\u00e9.png", "/tmp", "/tmp/",
            "mmrt-malformed-x" * 300,
        ]):
            self.add(f"path/{i}", self.image_req(u))

    def unsupported(self):
        for name, extra in [
            ("n-17", {"n": 17}), ("n-0", {"n": 0}),
            ("top_logprobs-21", {"logprobs": True, "top_logprobs": 21}),
            ("top_logprobs-false", {"logprobs": False, "top_logprobs": 3}),
            ("logit_bias-name", {"logit_bias": {"abc": 1}}),
            ("logit_bias-negative-id", {"logit_bias": {"-1": 1}}),
            ("logit_bias-leading-zero", {"logit_bias": {"07": 1}}),
            ("logit_bias-id-over-int32", {"logit_bias": {"2147483648": 1}}),
            ("logit_bias-101", {"logit_bias": {"5": 101}}),
            ("logit_bias-string", {"logit_bias": {"5": "1"}}),
            ("logit_bias-list", {"logit_bias": [[5, 1]]}),
            ("logit_bias-1025", {"logit_bias": {str(i): 1 for i in range(1025)}}),
            ("json_object-extra", {"response_format": {"type": "json_object",
                                                       "schema": {}}}),
            ("json_schema-no-schema", {"response_format": {"type": "json_schema",
                                              "json_schema": {"name": "x"}}}),
            ("json_schema-no-name", {"response_format": {"type": "json_schema",
                                              "json_schema": {"schema": {}}}}),
            ("json_schema-bad-name", {"response_format": {"type": "json_schema",
                                              "json_schema": {"name": "a b", "schema": {}}}}),
            ("json_schema-pattern", {"response_format": {"type": "json_schema",
                                              "json_schema": {"name": "x", "schema": {"type": "string", "pattern": "(?!a)"}}}}),
            ("json_schema-remote-ref", {"response_format": {"type": "json_schema",
                                              "json_schema": {"name": "x", "schema": {"$ref": "https://example.com/s.json"}}}}),
            ("json_schema-self-ref", {"response_format": {"type": "json_schema",
                                              "json_schema": {"name": "x", "schema": {"$ref": "#"}}}}),
            ("json_schema-endless", {"response_format": {"type": "json_schema",
                                              "json_schema": {"name": "x", "schema": {"type": "object", "properties": {"a": {"$ref": "#"}}, "required": ["a"]}}}}),
            ("json_schema-false", {"response_format": {"type": "json_schema",
                                              "json_schema": {"name": "x", "schema": False}}}),
            ("json_schema-empty-enum", {"response_format": {"type": "json_schema",
                                              "json_schema": {"name": "x", "schema": {"enum": []}}}}),
            ("json_schema-two-objects", {"response_format": {"type": "json_schema",
                                              "json_schema": {"name": "x", "schema": {"anyOf": [{"type": "object"}, {"type": "object", "properties": {"a": {}}}]}}}}),
            ("json_schema-min-over-max", {"response_format": {"type": "json_schema",
                                              "json_schema": {"name": "x", "schema": {"type": "array", "minItems": 3, "maxItems": 2}}}}),
            ("json_schema-strict-string", {"response_format": {"type": "json_schema",
                                              "json_schema": {"name": "x", "strict": "yes", "schema": {}}}}),
            ("json_schema-extra-key", {"response_format": {"type": "json_schema",
                                              "json_schema": {"name": "x", "schema": {}, "format": "json"}}}),
            ("json_schema-schema-number", {"response_format": {"type": "json_schema",
                                              "json_schema": {"name": "x", "schema": 3}}}),
            ("response_format-xml", {"response_format": {"type": "xml"}}),
            ("response_format-empty", {"response_format": {}}),
            ("response_format-extra", {"response_format": {"type": "text", "strict": True}}),
            ("tools", {"tools": [{"type": "function", "function": {"name": "get_weather",
                                                                   "parameters": {}}}]}),
            ("tool_choice-auto", {"tool_choice": "auto"}),
            ("tool_choice-required", {"tool_choice": "required"}),
            ("tool_choice-object", {"tool_choice": {"type": "function",
                                                    "function": {"name": "f"}}}),
            ("functions", {"functions": [{"name": "f", "parameters": {}}]}),
            ("function_call", {"function_call": "auto"}),
            ("function_call-object", {"function_call": {"name": "f"}}),
            ("audio", {"audio": {"voice": "alloy", "format": "wav"}}),
            ("modalities-audio", {"modalities": ["text", "audio"]}),
            ("modalities-empty", {"modalities": []}),
            ("prediction-type", {"prediction": {"type": "text", "content": "x"}}),
            ("prediction-part", {"prediction": {"type": "content", "content": [
                {"type": "image_url", "image_url": {"url": "data:,"}}]}}),
            ("prediction-extra", {"prediction": {"type": "content", "content": "x", "a": 1}}),
            ("web_search_options", {"web_search_options": {}}),
        ]:
            self.add(f"unsupported/{name}", self.req(**extra))
        call = [{"id": "call_1", "type": "function",
                 "function": {"name": "f", "arguments": "{}"}}]
        for name, msgs in [
            ("role-tool", [self.user("hi"), {"role": "tool", "content": "42",
                                             "tool_call_id": "call_1"}]),
            ("role-function", [self.user("hi"), {"role": "function", "name": "f",
                                                 "content": "42"}]),
            ("tool_calls", [self.user("hi"), {"role": "assistant", "content": None,
                                              "tool_calls": call}, self.user("and?")]),
            ("tool_calls-with-content", [self.user("hi"), {"role": "assistant", "content": "x",
                                                           "tool_calls": call}, self.user("?")]),
            ("function_call-message", [self.user("hi"), {"role": "assistant", "content": None,
                                                         "function_call": {"name": "f"}},
                                       self.user("?")]),
            ("tool_call_id", [{"role": "user", "content": "hi", "tool_call_id": "x"}]),
            ("message-audio", [self.user("hi"), {"role": "assistant", "content": "x",
                                                 "audio": {"id": "a"}}, self.user("?")]),
            ("input_audio", [self.user([{"type": "input_audio",
                                         "input_audio": {"data": "AAAA", "format": "wav"}}])]),
            ("file-part", [self.user([{"type": "file", "file": {"file_id": "f"}}])]),
            ("refusal-part", [self.user("hi"), {"role": "assistant", "content": [
                {"type": "refusal", "refusal": "no"}]}, self.user("?")]),
        ]:
            self.add(f"unsupported/{name}", self.req(msgs))

    UNKNOWN = ["prompt", "best_of", "echo", "suffix", "logit_bias_", "Model", "MODEL",
               "Messages", "max_token", "maxTokens", "temperatur", "topP", "top-p",
               "stream-options", "reasoning_effort", "verbosity", "thinking", "extra_body",
               "guided_json", "guided_regex", "min_p", "length_penalty",
               "use_beam_search", "ignore_eos", "stop_token_ids", "skip_special_tokens",
               "chat_template", "add_generation_prompt", "documents", "images", "image",
               "input", "instructions", "system", "context", "options", "keep_alive",
               "format", "raw", "template", "safety_identifier", "prompt_cache_key", "",
               " ", "model ", " messages", "\u00e9", "\U0001f600", "__proto__", "constructor",
               "toString", "$where", "null", "true", "0", "-1", "a" * 300, "k\u0007ey"]

    def unknown_keys(self):
        for i, k in enumerate(self.UNKNOWN):
            self.add(f"unknown/{i}", self.req(**{k: 1}))
            self.add(f"unknown-null/{i}", self.req(**{k: None}))
        letters = "abcdefghijklmnopqrstuvwxyz_"
        for i in range(120):
            k = "".join(self.rng.choice(letters) for _ in range(self.rng.randrange(1, 24)))
            if k in self.TOP_VALID or k in ("model", "messages"):
                continue
            self.add(f"unknown/random/{i}", self.req(**{k: self.rng.choice(
                list(self.POOL.values()))}))
        # unknown keys inside messages, parts and image_url objects
        for i, k in enumerate(["Role", "contents", "text", "image", "id", "metadata", "x"]):
            self.add(f"unknown-in/message/{i}", self.req([{"role": "user", "content": "hi", k: 1}]))
            self.add(f"unknown-in/text-part/{i}", self.req([self.user([{"type": "text",
                                                                        "text": "hi", k: 1}])]))
            self.add(f"unknown-in/image-part/{i}",
                     self.req([self.user([{"type": "image_url",
                                           "image_url": {"url": self.uri}, k: 1}])]))
            self.add(f"unknown-in/image_url/{i}", self.image_req_obj({"url": self.uri, k: 1}))
            self.add(f"unknown-in/stream_options/{i}",
                     self.req(stream=True, stream_options={"include_usage": True, k: 1}))

    def images(self):
        img = self.image_part()
        # At most 40 copies of the caller's image (a body of 40 images stays far below any
        # sensible body cap, which would answer 413); larger counts use the 69-byte PNG.
        tiny = self.image_part(DEFAULT_IMAGE_URI)
        for count, part in ((MAX_IMAGES_ANY_MODEL + 1, img), (40, img), (64, tiny),
                            (100, tiny), (1000, tiny)):
            self.add(f"images/one-message/{count}", self.req([self.user([part] * count)]))
            self.add(f"images/one-per-message/{count}",
                     self.req([self.user([part]) for _ in range(count)]))
        self.add("images/system", self.req([{"role": "system", "content": [img]},
                                            self.user("hi")]))
        self.add("images/developer", self.req([{"role": "developer", "content": [
            {"type": "text", "text": "x"}, img]}, self.user("hi")]))
        self.add("images/assistant", self.req([self.user("hi"), {"role": "assistant",
                                                                 "content": [img]},
                                               self.user("and?")]))
        for d in ["ultra", "", "AUTO", "Low", "medium", "original"]:
            self.add(f"images/detail/{d or 'empty'}", self.image_req_obj({"url": self.uri,
                                                                          "detail": d}))
        self.add("images/no-url", self.image_req_obj({}))
        self.add("images/url-null", self.image_req_obj({"url": None}))
        self.add("images/detail-only", self.image_req_obj({"detail": "low"}))
        self.add("images/image_url-string", self.req([self.user([{"type": "image_url",
                                                                  "image_url": self.uri}])]))
        self.add("images/image_url-missing", self.req([self.user([{"type": "image_url"}])]))
        self.add("images/url-instead", self.req([self.user([{"type": "image_url",
                                                             "url": self.uri}])]))
        self.add("images/type-image", self.req([self.user([{"type": "image",
                                                            "image_url": {"url": self.uri}}])]))
        self.add("images/type-input_image", self.req([self.user([{"type": "input_image",
                                                                  "image_url": self.uri}])]))

    def messages(self):
        for name, body in [
            ("missing", {"model": self.model}),
            ("null", {"model": self.model, "messages": None}),
            ("empty", {"model": self.model, "messages": []}),
            ("empty-object-in", {"model": self.model, "messages": [{}]}),
            ("role-missing", self.req([{"content": "hi"}])),
            ("role-null", self.req([{"role": None, "content": "hi"}])),
            ("content-missing", self.req([{"role": "user"}])),
            ("content-null", self.req([{"role": "user", "content": None}])),
            ("assistant-null-content", self.req([self.user("a"), {"role": "assistant",
                                                                  "content": None},
                                                 self.user("b")])),
            ("assistant-last", self.req([self.user("hi"), {"role": "assistant", "content": "x"}])),
            ("only-assistant", self.req([{"role": "assistant", "content": "x"}])),
            ("part-type-missing", self.req([self.user([{"text": "hi"}])])),
            ("part-text-missing", self.req([self.user([{"type": "text"}])])),
            ("part-text-null", self.req([self.user([{"type": "text", "text": None}])])),
            ("part-type-video", self.req([self.user([{"type": "video", "video": {}}])])),
            ("part-type-empty", self.req([self.user([{"type": "", "text": "x"}])])),
            ("part-type-Text", self.req([self.user([{"type": "Text", "text": "x"}])])),
            ("messages-object", {"model": self.model, "messages": {"role": "user",
                                                                   "content": "hi"}}),
            ("nested-list", {"model": self.model, "messages": [[self.user("hi")]]}),
            ("too-many", self.req([self.user("x")] * (MAX_MESSAGES + 1))),
        ]:
            self.add(f"messages/{name}", body)
        for role in ["User", "USER", "human", "ai", "bot", "model", "assistant ", " user",
                     "system\u0000", "", "tool_result", "critic", "ipython", "context"]:
            self.add(f"messages/role/{role.strip() or 'blank'}-{len(role)}",
                     self.req([{"role": role, "content": "hi"}]))

    def model_field(self):
        self.add("model/missing", {"messages": [self.user("hi")]})
        self.add("model/null", {"model": None, "messages": [self.user("hi")]})
        for i, m in enumerate(["", "gpt-4o", "gpt-4o-mini", self.model.upper(),
                               self.model + " ", " " + self.model, self.model + "\n",
                               self.model + "-v2", "x" * 1000, "\u00e9", "../" + self.model,
                               self.model[:-1] if len(self.model) > 1 else self.model + "y"]):
            if m == self.model:
                continue
            # A well-formed request for a model this server does not serve.
            self.add(f"model/other/{i}", {"model": m, "messages": [self.user("hi")]}, NOT_FOUND)
        # A bad model and a bad field: the field is reported first (400).
        self.add("model/other-and-unknown-key", {"model": "gpt-4o", "messages": [], "zzz": 1})

    def stream_and_stop(self):
        self.add("stream/options-without-stream", self.req(stream_options={"include_usage": True}))
        self.add("stream/options-stream-false", self.req(stream=False,
                                                         stream_options={"include_usage": True}))
        self.add("stream/options-empty-no-stream", self.req(stream_options={}))
        self.add("stream/string", self.req(stream="true"))
        self.add("stream/int", self.req(stream=1))
        self.add("stop/too-many", self.req(stop=[str(i) for i in range(MAX_STOP + 1)]))
        self.add("stop/far-too-many", self.req(stop=[str(i) for i in range(1000)]))
        self.add("stop/empty", self.req(stop=""))
        self.add("stop/empty-item", self.req(stop=["a", ""]))
        self.add("stop/too-long", self.req(stop="s" * (MAX_STOP_BYTES + 1)))
        self.add("stop/too-long-utf8", self.req(stop=["\u00e9" * (MAX_STOP_BYTES // 2 + 1)]))
        self.add("stop/nested", self.req(stop=[["a"]]))
        self.add("stop/null-item", self.req(stop=["a", None]))

    def top_level_not_object(self):
        for i, v in enumerate([[], [self.req()], "x", 1, None, True]):
            b = enc(v)
            self.add(f"top/{i}", b)

    def build(self) -> list[Case]:
        self.broken_json()
        self.duplicate_keys()
        self.invalid_utf8()
        self.deep_nesting()
        self.wrong_types()
        self.numbers()
        self.base64_damage()
        self.media_types()
        self.urls()
        self.unsupported()
        self.unknown_keys()
        self.images()
        self.messages()
        self.model_field()
        self.stream_and_stop()
        self.top_level_not_object()
        return self.out


def cases(valid_image_data_uri: str, model: str) -> list[Case]:
    """Every malformed body with its expected status (404 for another model, else 400).

    valid_image_data_uri: a data: URI the server accepts (its damaged copies are cases).
    model: the id the server serves (GET /v1/models).
    """
    return Gen(valid_image_data_uri, model).build()


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="mmrt-test")
    ap.add_argument("--image-uri", default=DEFAULT_IMAGE_URI)
    ap.add_argument("--dump", metavar="FILE", help="write the cases, '-' for stdout")
    ap.add_argument("--summary", action="store_true", help="print counts per category")
    a = ap.parse_args(argv)
    cs = cases(a.image_uri, a.model)
    if a.dump:
        out = sys.stdout.buffer if a.dump == "-" else open(a.dump, "wb")
        for name, body, status in cs:
            out.write(f"{status} {len(body)} {name.encode('ascii', 'backslashreplace').decode()}\n"
                      .encode("ascii"))
            out.write(body)
            out.write(b"\n")
        out.flush()
        if out is not sys.stdout.buffer:
            out.close()
    if a.summary or not a.dump:
        counts: dict[str, int] = {}
        for name, _, status in cs:
            k = name.split("/")[0]
            counts[k] = counts.get(k, 0) + 1
        for k, n in counts.items():
            print(f"{k:12} {n}")
        print(f"{'total':12} {len(cs)}  (404: {sum(1 for c in cs if c[2] == NOT_FOUND)})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
