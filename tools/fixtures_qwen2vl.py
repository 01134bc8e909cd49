"""Qwen2-VL golden fixtures: tiny Qwen2VLForConditionalGeneration references (models.md §4, §6, §7.3, §7.5).

Called from tools/make_fixtures.py:

    python3 tools/make_fixtures.py qwen2_vl --out tests/fixtures

make_qwen2vl(out_dir, variant) builds a tiny Qwen2-VL (vision tower with 2-D rotary + patch
merger, Qwen2 text model with q/k/v biases, GQA and M-RoPE) with perturbed float32 weights, a
byte-level BPE tokenizer.json with the Qwen2 regex pre-tokenizer and the Qwen2-VL special tokens
laid out in the real order (<|endoftext|>, <|im_start|>, <|im_end|>, ... <|video_pad|>), the
Qwen2-VL-Instruct chat template, and references from transformers (eager attention, CPU):

* caseN.pixel_values: the flattened patches exactly as Qwen2VLImageProcessorPil returns them
  ([sum_i t*h*w, 3*2*P*P], inner order (c, t, ph, pw), merge-window order), all images of the
  case concatenated;
* caseN.image_features: the merger output for all images concatenated ([n_image_tokens, hidden]);
* caseN.vision_hidden: the vision tower's last block output before the merger ([n_patches, E]);
* caseN.logits_steps: [16, vocab], each greedy step by a full cache-free forward.
expected.json also records input_ids after placeholder expansion, image_grid_thw, the resize
each image got, and the M-RoPE position ids (get_rope_index, 3 x seq) of the prompt.
"""

from __future__ import annotations

import math
import os
import shutil
from pathlib import Path

import make_fixtures as mf

# Qwen2 pre-tokenizer regex (models.md §7.3).
QWEN2_PAT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
             r"|\s*[\r\n]+|\s+(?!\S)|\s+")

# In the real vocabulary order (151643.. in Qwen2-VL); here they follow the trained vocab.
QWEN_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
                 "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
                 "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>"]
QWEN_TRAINED_VOCAB = 320          # 256 byte-level characters + 64 merges
QWEN_MODEL_VOCAB = 336            # model rows > tokenizer size, as in the real 151936 > 151657


def qid(tok: str) -> int:
    return QWEN_TRAINED_VOCAB + QWEN_SPECIALS.index(tok)


QWEN_CORPUS = [
    "What is shown in this image? The image shows a small picture.",
    "Describe the colors in two words. Red and green, blue and gray.",
    "Compare the two pictures. The first one is wider than the second one.",
    "You are a helpful assistant.",
    "system\nuser\nassistant\n",
    "Is there a cat? Answer yes or no. No, there is no cat in the image.",
    "one two three four five six seven eight nine ten 0 1 2 3 4 5 6 7 8 9",
]

# The Qwen2-VL-Instruct template (add_vision_id support included), as on the hub.
QWEN2VL_CHAT_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}"
    "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "{% set image_count.value = image_count.value + 1 %}"
    "{% if add_vision_id %}Picture {{ image_count.value }}: {% endif %}"
    "<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'video' or 'video' in content %}"
    "{% set video_count.value = video_count.value + 1 %}"
    "{% if add_vision_id %}Video {{ video_count.value }}: {% endif %}"
    "<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

QWEN_VARIANTS = {
    # §6.2 sizes: patch 14 (factor 28); min/max pixels 5..12 merged tokens, so 64x64 and 36x100
    # take the min_pixels (ceil) branch and the others the rounding branch; 98x70 rounds both
    # sides from exactly .5 (banker's rounding: 70/28 = 2.5 -> 2, 98/28 = 3.5 -> 4).
    "tiny": dict(dir="qwen2vl-tiny", seed=88, files="v5",
                 vision=dict(depth=2, embed_dim=32, num_heads=2, mlp_ratio=2, hidden_size=32, patch_size=14,
                             temporal_patch_size=2, spatial_merge_size=2, in_channels=3),
                 text=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                           num_key_value_heads=2, rms_norm_eps=1e-6, max_position_embeddings=1024,
                           tie_word_embeddings=True),
                 rope_theta=1e6, mrope_section=[2, 1, 1],
                 min_pixels=28 * 28 * 5, max_pixels=28 * 28 * 12,
                 pairs=[("grad_80x60.png", "grad_36x100.png")]),
    # patch 7 (factor 14), hd 12 in both towers, 4q/1kv, untied lm_head, a max_pixels small
    # enough that most images take the downscale branch (and 64x64 lands on floor(4.0)).
    # Processor files written hub-style (preprocessor min/max_pixels, chat_template.json, ...).
    "alt": dict(dir="qwen2vl-tiny-alt", seed=97, files="hub",
                vision=dict(depth=3, embed_dim=48, num_heads=4, mlp_ratio=2, hidden_size=48, patch_size=7,
                            temporal_patch_size=2, spatial_merge_size=2, in_channels=3),
                text=dict(hidden_size=48, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                          num_key_value_heads=1, rms_norm_eps=1e-5, max_position_embeddings=1024,
                          tie_word_embeddings=False),
                rope_theta=1e4, mrope_section=[2, 2, 2],
                min_pixels=14 * 14 * 4, max_pixels=14 * 14 * 16,
                pairs=[("grad_80x60.png", "grad_36x100.png"), ("grad_45x90.png", "grad_64x64.png")]),
}

# One more image, for the .5 ties of smart_resize's round(); its own directory so the LLaVA
# image set stays as it is.
QWEN_IMAGES = [("grad_98x70.png", 98, 70)]
QWEN_IMAGE_DIR = "tests/fixtures/qwen2vl-images"

SINGLE_PROMPTS = ["What is shown in this image?", "Describe the colors in two words."]
TWO_IMAGE_PROMPT = "Compare the two pictures."


def build_qwen2_tokenizer():
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, \
        processors, trainers
    pre = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_PAT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    t0 = Tokenizer(models.BPE())
    t0.normalizer = normalizers.NFC()
    t0.pre_tokenizer = pre
    trainer = trainers.BpeTrainer(vocab_size=QWEN_TRAINED_VOCAB, initial_alphabet=alphabet, show_progress=False,
                                  min_frequency=1, special_tokens=[])
    t0.train_from_iterator(QWEN_CORPUS, trainer)
    import json
    learned = json.loads(t0.to_str())["model"]
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in learned["merges"]]
    # vocab: the 256 byte characters in byte order (like GPT-2/Qwen2: '!' = 0), then merges in rank order
    byte_chars = _bytes_to_unicode()
    vocab = {byte_chars[b]: i for i, b in enumerate(sorted(range(256), key=lambda b: _gpt2_byte_rank(b)))}
    for a, b in merges:
        if a + b not in vocab:
            vocab[a + b] = len(vocab)
    if len(vocab) != QWEN_TRAINED_VOCAB:
        raise RuntimeError(f"qwen tokenizer vocab {len(vocab)} != {QWEN_TRAINED_VOCAB}")
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token=None, fuse_unk=False, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in QWEN_SPECIALS])
    for t in QWEN_SPECIALS:
        assert tok.token_to_id(t) == qid(t), t
    return tok


def _bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def _gpt2_byte_rank(b: int) -> int:
    """Position of byte b in GPT-2's bytes_to_unicode order (printables first), which is the
    order of ids 0..255 in the Qwen2 vocab."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    if b in bs:
        return bs.index(b)
    return len(bs) + [x for x in range(256) if x not in bs].index(b)


def wrap_qwen_tokenizer(tok):
    T = mf.T
    return T.PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                     unk_token=None, bos_token=None,
                                     extra_special_tokens={"image_token": "<|image_pad|>",
                                                           "video_token": "<|video_pad|>",
                                                           "vision_bos_token": "<|vision_start|>",
                                                           "vision_eos_token": "<|vision_end|>"})


def _build(v: dict):
    T, torch = mf.T, mf.torch
    mf.set_determinism(v["seed"])
    vc = T.Qwen2VLVisionConfig(**v["vision"])
    rope = {"rope_type": "default", "rope_theta": v["rope_theta"], "mrope_section": v["mrope_section"]}
    tc = T.Qwen2VLTextConfig(vocab_size=QWEN_MODEL_VOCAB, **v["text"], rope_parameters=rope,
                             bos_token_id=None, eos_token_id=qid("<|im_end|>"), pad_token_id=qid("<|endoftext|>"))
    cfg = T.Qwen2VLConfig(vision_config=vc.to_dict(), text_config=tc.to_dict(),
                          image_token_id=qid("<|image_pad|>"), video_token_id=qid("<|video_pad|>"),
                          vision_start_token_id=qid("<|vision_start|>"), vision_end_token_id=qid("<|vision_end|>"),
                          tie_word_embeddings=v["text"]["tie_word_embeddings"])
    model = T.Qwen2VLForConditionalGeneration._from_config(cfg, attn_implementation="eager", dtype=torch.float32)
    mf.perturb(model, mf.PERTURB_SCALE, seed=v["seed"] + 1)
    if v["text"]["tie_word_embeddings"]:
        assert model.lm_head.weight.data_ptr() == model.model.language_model.embed_tokens.weight.data_ptr()
    return model.eval()


def _allow_no_video_processor():
    """Qwen2VLProcessor lists a video_processor, whose class needs torchvision (not installed
    here, and not needed for images). Let the processor accept None for it."""
    PM = mf.T.ProcessorMixin
    if getattr(PM, "_mmrt_patched", False):
        return
    orig = PM.check_argument_for_proper_class

    def check(self, attribute_name, arg):
        if attribute_name == "video_processor" and arg is None:
            return None
        return orig(self, attribute_name, arg)
    PM.check_argument_for_proper_class = check
    PM._mmrt_patched = True
    Q = mf.T.Qwen2VLProcessor
    orig_attrs = Q.get_attributes.__func__

    @classmethod
    def attrs(cls):
        return [a for a in orig_attrs(cls) if a != "video_processor"]
    Q.get_attributes = attrs


def _processor(v: dict, hf_tok):
    T = mf.T
    _allow_no_video_processor()
    p = v["vision"]["patch_size"]
    ip = T.Qwen2VLImageProcessorPil(min_pixels=v["min_pixels"], max_pixels=v["max_pixels"], patch_size=p,
                                    temporal_patch_size=2, merge_size=2, resample=3,
                                    size={"shortest_edge": v["min_pixels"], "longest_edge": v["max_pixels"]})
    proc = T.Qwen2VLProcessor(image_processor=ip, tokenizer=hf_tok, chat_template=QWEN2VL_CHAT_TEMPLATE)
    proc.video_processor = None
    return proc


def _save_processor(processor, out: Path, v: dict, files: str) -> None:
    if files == "v5":
        processor.save_pretrained(str(out))
        return
    # hub-style: tokenizer files + preprocessor_config.json with top-level min/max_pixels +
    # chat_template.json, as Qwen/Qwen2-VL-2B-Instruct ships them.
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        processor.tokenizer.save_pretrained(tmp)
        for f in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(Path(tmp) / f, out / f)
    p = v["vision"]["patch_size"]
    mf.write_json(out / "preprocessor_config.json", {
        "min_pixels": v["min_pixels"], "max_pixels": v["max_pixels"], "patch_size": p,
        "temporal_patch_size": 2, "merge_size": 2,
        "image_mean": [0.48145466, 0.4578275, 0.40821073], "image_std": [0.26862954, 0.26130258, 0.27577711],
        "image_processor_type": "Qwen2VLImageProcessor", "processor_class": "Qwen2VLProcessor"})
    mf.write_json(out / "chat_template.json", {"chat_template": QWEN2VL_CHAT_TEMPLATE})


def _smart_resize(h, w, factor, min_px, max_px):
    """models.md §4.4, for cross-checking the processor's numbers."""
    hb = round(h / factor) * factor
    wb = round(w / factor) * factor
    branch = "round"
    if hb * wb > max_px:
        beta = math.sqrt(h * w / max_px)
        hb = max(factor, math.floor(h / beta / factor) * factor)
        wb = max(factor, math.floor(w / beta / factor) * factor)
        branch = "max_pixels"
    elif hb * wb < min_px:
        beta = math.sqrt(min_px / (h * w))
        hb = math.ceil(h * beta / factor) * factor
        wb = math.ceil(w * beta / factor) * factor
        branch = "min_pixels"
    return hb, wb, branch


def _inputs(processor, image_paths, prompt):
    Image = mf.Image
    content = [{"type": "image"} for _ in image_paths] + [{"type": "text", "text": prompt}]
    messages = [{"role": "user", "content": content}]
    rendered = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    vis = "<|vision_start|><|image_pad|><|vision_end|>" * len(image_paths)
    expect = (f"<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n{vis}{prompt}"
              f"<|im_end|>\n<|im_start|>assistant\n")
    if rendered != expect:
        raise RuntimeError(f"chat template renders {rendered!r}, expected {expect!r}")
    ims = []
    for p in image_paths:
        with Image.open(p) as im:
            im.load()
            ims.append(im.convert("RGB"))
    inputs = processor(images=ims, text=rendered, return_tensors="pt")
    return rendered, inputs


def _greedy(model, inputs, eos_id):
    torch = mf.torch
    ids = inputs["input_ids"]
    mm = inputs["mm_token_type_ids"]
    tokens, rows = [], []
    for _ in range(mf.N_GREEDY):
        model.model.rope_deltas = None
        with torch.no_grad():
            o = model(input_ids=ids, pixel_values=inputs["pixel_values"], image_grid_thw=inputs["image_grid_thw"],
                      mm_token_type_ids=mm, attention_mask=torch.ones_like(ids), use_cache=False)
        row = o.logits[0, -1].float()
        rows.append(row)
        tokens.append(int(row.argmax()))
        if tokens[-1] in (qid("<|image_pad|>"), qid("<|video_pad|>")):
            raise RuntimeError(f"greedy step {len(tokens) - 1} picked a placeholder token: {tokens}; pick another seed")
        ids = torch.cat([ids, torch.tensor([[tokens[-1]]])], dim=1)
        mm = torch.cat([mm, torch.zeros((1, 1), dtype=mm.dtype)], dim=1)
    logits = torch.stack(rows, 0)
    top2 = logits.topk(2, dim=-1).values
    margins = ((top2[:, 0] - top2[:, 1]) / logits.abs().amax(dim=-1)).tolist()
    stop = next((i for i, t in enumerate(tokens) if t == eos_id), None)
    return tokens, logits, margins, stop


def _check_generate(model, inputs, tokens):
    """HF generate (KV cache, rope_deltas on decode) must give the same greedy tokens."""
    torch = mf.torch
    model.model.rope_deltas = None
    with torch.no_grad():
        g = model.generate(**inputs, max_new_tokens=mf.N_GREEDY, min_new_tokens=mf.N_GREEDY, do_sample=False,
                           eos_token_id=None, pad_token_id=qid("<|endoftext|>"))
    got = g[0, inputs["input_ids"].shape[1]:].tolist()
    if got != tokens:
        raise RuntimeError(f"generate() gives {got}, cache-free loop gives {tokens}")


def make_qwen2vl(out_dir: Path, variant: str) -> dict:
    mf._import_stack()
    T, torch = mf.T, mf.torch
    v = QWEN_VARIANTS[variant]
    out = Path(out_dir) / v["dir"]
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    tok = build_qwen2_tokenizer()
    hf_tok = wrap_qwen_tokenizer(tok)
    processor = _processor(v, hf_tok)
    model = _build(v)
    model.save_pretrained(str(out), safe_serialization=True)
    _save_processor(processor, out, v, v["files"])
    mf.write_json(out / "keys.json", mf.safetensors_keys(out))
    ref = T.Qwen2VLForConditionalGeneration.from_pretrained(str(out), attn_implementation="eager",
                                                            dtype=torch.float32).eval()
    from tokenizers import Tokenizer
    raw = Tokenizer.from_file(str(out / "tokenizer.json"))
    reloaded = T.AutoProcessor.from_pretrained(str(out), backend="pil")
    if not type(reloaded.image_processor).__name__.endswith("Pil"):
        raise RuntimeError(f"reloaded image processor is {type(reloaded.image_processor).__name__}")

    images = list(mf.ensure_llava_images())
    d = mf.REPO_ROOT / QWEN_IMAGE_DIR
    d.mkdir(parents=True, exist_ok=True)
    for j, (name, w, h) in enumerate(QWEN_IMAGES):
        mf.make_gradient_image(d / name, w, h, seed=3000 + j)
        images.append(d / name)
    by_name = {p.name: p for p in images}
    case_imgs = [[p] for p in images]
    for pair in v["pairs"]:
        case_imgs.append([by_name[n] for n in pair])
    p = v["vision"]["patch_size"]
    factor = p * 2
    img_id = qid("<|image_pad|>")
    eos_id = qid("<|im_end|>")
    cases, tensors = [], {}
    for k, imgs in enumerate(case_imgs):
        prompt = TWO_IMAGE_PROMPT if len(imgs) > 1 else SINGLE_PROMPTS[k % 2]
        i = len(cases)
        rendered, inputs = _inputs(processor, imgs, prompt)
        _, inputs2 = _inputs(reloaded, imgs, prompt)
        if inputs2["input_ids"].tolist() != inputs["input_ids"].tolist() or \
                not torch.equal(inputs2["pixel_values"], inputs["pixel_values"]) or \
                inputs2["image_grid_thw"].tolist() != inputs["image_grid_thw"].tolist():
            raise RuntimeError("processor saved in the fixture does not reproduce the inputs")
        ids = inputs["input_ids"][0].tolist()
        grid = inputs["image_grid_thw"].tolist()
        n_img = ids.count(img_id)
        per_img = [t * h * w // 4 for t, h, w in grid]
        if n_img != sum(per_img):
            raise RuntimeError(f"{n_img} image tokens, grid says {per_img}")
        exp_text = rendered
        for n in per_img:
            exp_text = exp_text.replace("<|vision_start|><|image_pad|><|vision_end|>",
                                        "<|vision_start|>" + "<|IMG|>" * n + "<|vision_end|>", 1)
        exp_text = exp_text.replace("<|IMG|>", "<|image_pad|>")
        if raw.encode(exp_text).ids != ids:
            raise RuntimeError("tokenizer.json and the HF processor disagree")
        resize = []
        for path, (t, gh, gw) in zip(imgs, grid):
            with mf.Image.open(path) as im:
                w0, h0 = im.size
            hb, wb, branch = _smart_resize(h0, w0, factor, v["min_pixels"], v["max_pixels"])
            if (hb, wb) != (gh * p, gw * p):
                raise RuntimeError(f"{path.name}: processor resized to {gh * p}x{gw * p}, spec says {hb}x{wb}")
            resize.append({"image": path.name, "size_hw": [h0, w0], "resized_hw": [hb, wb], "branch": branch,
                           "grid_thw": [t, gh, gw], "image_tokens": t * gh * gw // 4})
        pv = inputs["pixel_values"]
        gthw = inputs["image_grid_thw"]
        with torch.no_grad():
            vo = ref.model.visual(pv, grid_thw=gthw, return_dict=True)
            feats = vo.pooler_output
            vis_hidden = vo.last_hidden_state
            f2 = ref.model.get_image_features(pixel_values=pv, image_grid_thw=gthw)
            f2 = getattr(f2, "pooler_output", f2)
            f2 = torch.cat(list(f2), 0)
        if not torch.equal(f2, feats):
            raise RuntimeError("get_image_features != visual().pooler_output")
        if feats.shape[0] != n_img:
            raise RuntimeError(f"{n_img} image tokens but {feats.shape[0]} features")
        ref.model.rope_deltas = None
        pos, deltas = ref.model.get_rope_index(inputs["input_ids"], mm_token_type_ids=inputs["mm_token_type_ids"],
                                               image_grid_thw=gthw, attention_mask=inputs["attention_mask"])
        tokens, steps, margins, stop = _greedy(ref, inputs, eos_id)
        _check_generate(ref, inputs, tokens)
        tensors[f"case{i}.pixel_values"] = pv.float().contiguous()
        tensors[f"case{i}.image_features"] = feats.float().contiguous()
        tensors[f"case{i}.vision_hidden"] = vis_hidden.float().contiguous()
        tensors[f"case{i}.logits_steps"] = steps.contiguous()
        cases.append({
            "name": f"case{i}",
            "images": [str(x.relative_to(mf.REPO_ROOT)) for x in imgs],
            "prompt": prompt,
            "rendered_prompt": rendered,
            "resize": resize,
            "image_grid_thw": grid,
            "n_patches": int(pv.shape[0]),
            "input_ids": ids,
            "num_image_tokens": n_img,
            "mm_token_type_ids": inputs["mm_token_type_ids"][0].tolist(),
            "position_ids": pos[:, 0, :].tolist(),
            "rope_delta": int(deltas.reshape(-1)[0]),
            "greedy_tokens": tokens,
            "greedy_text": hf_tok.decode(tokens, skip_special_tokens=False),
            "natural_eos_index": stop,
            "min_top1_margin_rel": min(margins),
        })
    mf.save_file(tensors, str(out / "expected.safetensors"), metadata={"format": "pt"})
    summary = {
        "fixture": v["dir"], "variant": variant,
        "made_by": f"python3 tools/make_fixtures.py qwen2_vl --out {os.path.relpath(out_dir, mf.REPO_ROOT)}",
        "versions": mf.versions(),
        "attn_implementation": "eager",
        "processor": {"min_pixels": v["min_pixels"], "max_pixels": v["max_pixels"], "patch_size": p,
                      "factor": factor, "temporal_patch_size": 2, "merge_size": 2, "resample": "bicubic"},
        "token_ids": {t: qid(t) for t in QWEN_SPECIALS},
        "model_vocab_size": QWEN_MODEL_VOCAB,
        "tolerance": {"rule": "max|c - ref| <= rel * max|ref|, per tensor", "rel": mf.TOL_REL,
                      "greedy_tokens": "identical"},
        "tensors": {
            "caseN.pixel_values": "[n_patches, 3*2*P*P] f32, processor output (all images of the case)",
            "caseN.image_features": "[num_image_tokens, text_hidden] merger output, images concatenated",
            "caseN.vision_hidden": "[n_patches, embed_dim] output of the last vision block (before merger ln_q)",
            "caseN.logits_steps": f"[{mf.N_GREEDY}, vocab] logits of each greedy step (cache-free forwards)",
        },
        "cases": cases,
    }
    mf.write_json(out / "expected.json", summary)
    mf.write_json(out / "versions.json", summary["versions"])
    for f in out.iterdir():
        f.chmod(0o644)
    return summary
