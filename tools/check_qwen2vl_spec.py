"""Independent numpy port of models.md §4 (Qwen2-VL), checked against a committed fixture.

    python3 tools/check_qwen2vl_spec.py tests/fixtures/qwen2vl-tiny

Needs numpy, safetensors and Pillow (no torch). Recomputes pixel_values (PIL bicubic resize to
the recorded smart_resize size, rescale/normalize, temporal repeat, patchify), the vision tower
(2-D rotary, per-image block attention, quick_gelu MLP), the patch merger, get_rope_index and
the M-RoPE text model (prefill + 16 greedy steps by full forwards), and reports the relative
errors against expected.safetensors. Not a test gate: a record that the spec and HF agree.
"""
import json, sys, math
import numpy as np
from safetensors.numpy import load_file
d = sys.argv[1]
cfg = json.load(open(f"{d}/config.json")); W = load_file(f"{d}/model.safetensors"); E = load_file(f"{d}/expected.safetensors")
ex = json.load(open(f"{d}/expected.json"))
import os
root = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
vc, tc = cfg["vision_config"], cfg["text_config"]
Ed, nh = vc["embed_dim"], vc["num_heads"]; hd = Ed // nh
def ln(x, w, b, eps=1e-6):
    m = x.mean(-1, keepdims=True); v = ((x - m) ** 2).mean(-1, keepdims=True); return (x - m) / np.sqrt(v + eps) * w + b
def lin(x, p, bias=True):
    y = x @ W[p + ".weight"].T
    return y + W[p + ".bias"] if bias else y
def rot_half(x):
    h = x.shape[-1] // 2; return np.concatenate([-x[..., h:], x[..., :h]], -1)
def gelu(x):
    from math import erf
    return 0.5 * x * (1 + np.vectorize(erf)(x / math.sqrt(2)))
def vision(pv, grids):
    x = pv.astype(np.float64) @ W["visual.patch_embed.proj.weight"].reshape(Ed, -1).T.astype(np.float64)
    inv = 1.0 / (10000 ** (np.arange(0, hd // 2, 2) / (hd // 2)))
    hp, wp, seg = [], [], []
    for k, (t, h, w) in enumerate(grids):
        for _ in range(t):
            for br in range(h // 2):
                for bc in range(w // 2):
                    for r in range(2):
                        for c in range(2):
                            hp.append(2 * br + r); wp.append(2 * bc + c); seg.append(k)
    th = np.concatenate([np.outer(hp, inv), np.outer(wp, inv)], 1); emb = np.concatenate([th, th], 1)
    cos, sin = np.cos(emb)[:, None, :], np.sin(emb)[:, None, :]
    seg = np.array(seg); mask = np.where(seg[:, None] == seg[None, :], 0.0, -np.inf)
    for i in range(vc["depth"]):
        p = f"visual.blocks.{i}."
        h = ln(x, W[p + "norm1.weight"], W[p + "norm1.bias"])
        qkv = lin(h, p + "attn.qkv").reshape(-1, 3, nh, hd)
        q, k, v = qkv[:, 0], qkv[:, 1], qkv[:, 2]
        q = q * cos + rot_half(q) * sin; k = k * cos + rot_half(k) * sin
        s = np.einsum("qhd,khd->hqk", q, k) / math.sqrt(hd) + mask
        s = np.exp(s - s.max(-1, keepdims=True)); s /= s.sum(-1, keepdims=True)
        o = np.einsum("hqk,khd->qhd", s, v).reshape(-1, Ed)
        x = x + lin(o, p + "attn.proj")
        h = ln(x, W[p + "norm2.weight"], W[p + "norm2.bias"])
        h = lin(h, p + "mlp.fc1"); h = h / (1 + np.exp(-1.702 * h))
        x = x + lin(h, p + "mlp.fc2")
    hid = x
    m = ln(x, W["visual.merger.ln_q.weight"], W["visual.merger.ln_q.bias"]).reshape(-1, 4 * Ed)
    m = lin(gelu(lin(m, "visual.merger.mlp.0")), "visual.merger.mlp.2")
    return hid, m
def rope_index(ids, grids, img_id, vs_id):
    pos = []; cur = 0; i = 0; g = iter(grids); n = len(ids)
    while i < n:
        if ids[i] == img_id:
            t, h, w = next(g); H, Wd = h // 2, w // 2
            for a in range(t):
                for b in range(H):
                    for c in range(Wd):
                        pos.append((cur + a, cur + b, cur + c))
            i += t * H * Wd; cur += max(t, H, Wd)
        else:
            pos.append((cur, cur, cur)); cur += 1; i += 1
    return np.array(pos).T
def lm(ids, feats, pos):
    H = tc["hidden_size"]; nq = tc["num_attention_heads"]; nkv = tc["num_key_value_heads"]; d = H // nq
    x = W["model.embed_tokens.weight"][ids].astype(np.float64)
    x[np.array(ids) == cfg["image_token_id"]] = feats
    rp = tc["rope_parameters"]; inv = 1.0 / (rp["rope_theta"] ** (np.arange(0, d, 2) / d))
    sec = rp["mrope_section"]; axis = np.concatenate([np.full(s, a) for a, s in enumerate(sec)])
    ang = np.stack([pos[axis[j]] * inv[j] for j in range(d // 2)], 1); emb = np.concatenate([ang, ang], 1)
    cos, sin = np.cos(emb)[None], np.sin(emb)[None]
    S = len(ids); causal = np.triu(np.full((S, S), -np.inf), 1)
    def rms(x, w): return x / np.sqrt((x * x).mean(-1, keepdims=True) + tc["rms_norm_eps"]) * w
    for i in range(tc["num_hidden_layers"]):
        p = f"model.layers.{i}."
        h = rms(x, W[p + "input_layernorm.weight"])
        q = lin(h, p + "self_attn.q_proj").reshape(S, nq, d).transpose(1, 0, 2)
        k = lin(h, p + "self_attn.k_proj").reshape(S, nkv, d).transpose(1, 0, 2)
        v = lin(h, p + "self_attn.v_proj").reshape(S, nkv, d).transpose(1, 0, 2)
        q = q * cos + rot_half(q) * sin; k = k * cos + rot_half(k) * sin
        k = np.repeat(k, nq // nkv, 0); v = np.repeat(v, nq // nkv, 0)
        s = q @ k.transpose(0, 2, 1) / math.sqrt(d) + causal
        s = np.exp(s - s.max(-1, keepdims=True)); s /= s.sum(-1, keepdims=True)
        o = (s @ v).transpose(1, 0, 2).reshape(S, H)
        x = x + lin(o, p + "self_attn.o_proj", False)
        h = rms(x, W[p + "post_attention_layernorm.weight"])
        g = lin(h, p + "mlp.gate_proj", False); g = g / (1 + np.exp(-g))
        x = x + lin(g * lin(h, p + "mlp.up_proj", False), p + "mlp.down_proj", False)
    x = rms(x, W["model.norm.weight"])
    head = W.get("lm_head.weight", W["model.embed_tokens.weight"])
    return x[-1] @ head.T
def pixels(paths, resize, P):
    from PIL import Image
    mean = np.array([0.48145466, 0.4578275, 0.40821073]); std = np.array([0.26862954, 0.26130258, 0.27577711])
    out = []
    for path, r in zip(paths, resize):
        hb, wb = r["resized_hw"]
        with Image.open(path) as im:
            a = np.asarray(im.convert("RGB").resize((wb, hb), Image.BICUBIC), dtype=np.float64)
        a = ((a / 255.0 - mean) / std).transpose(2, 0, 1)                    # C,H,W
        fr = np.stack([a, a], 0)                                              # t=2 identical frames
        gh, gw = hb // P, wb // P
        x = fr.reshape(1, 2, 3, gh // 2, 2, P, gw // 2, 2, P).transpose(0, 3, 6, 4, 7, 2, 1, 5, 8)
        out.append(x.reshape(gh * gw, 3 * 2 * P * P))
    return np.concatenate(out, 0)
def rel(a, b): return float(np.abs(a - b).max() / np.abs(b).max())
worst = 0
for c in ex["cases"]:
    n = c["name"]; grids = c["image_grid_thw"]
    pv = pixels([f"{root}/{p}" for p in c["images"]], c["resize"], vc["patch_size"])
    e0 = float(np.abs(pv - E[n + ".pixel_values"]).max())
    hid, feats = vision(E[n + ".pixel_values"], grids)
    e1, e2 = rel(hid, E[n + ".vision_hidden"]), rel(feats, E[n + ".image_features"])
    pos = rope_index(c["input_ids"], grids, cfg["image_token_id"], cfg["vision_start_token_id"])
    assert pos.tolist() == c["position_ids"], n
    ids = list(c["input_ids"]); e3 = 0
    for s in range(16):
        P = np.concatenate([pos, np.repeat(np.arange(pos.max() + 1, pos.max() + 1 + s)[None], 3, 0)], 1) if s else pos
        lg = lm(ids, feats, P); e3 = max(e3, rel(lg, E[n + ".logits_steps"][s]))
        assert int(lg.argmax()) == c["greedy_tokens"][s], (n, s)
        ids.append(c["greedy_tokens"][s])
    print(n, "pixel_values max abs %.2e" % e0, "vision_hidden %.2e features %.2e logits %.2e" % (e1, e2, e3)); worst = max(worst, e1, e2, e3)
print("worst", worst)
