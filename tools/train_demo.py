#!/usr/bin/env python3
"""Train mmrt's built-in demo model: a small LLaVA-1.5 that answers questions about pictures
of coloured shapes.

No model hub is reachable from the machines mmrt is built on, so the default deployment
(conf/demo.ini) needs a model made here that really sees. This script makes it from nothing,
on the CPU, in four runs of the script (docs/DEMO.md gives the command lines; the committed
model took 69 + 6 + 30 + 18 minutes on 2 cores shared with other work, about 0.4 s a step on
2 idle cores):

  1. synthetic scenes: one to four shapes (circle, square, triangle, star) in six colours and
     three sizes, at random positions, on plain or textured backgrounds, at varied image sizes
     and aspect ratios; each with questions and short answers (the colour of a shape, the shape
     of a colour, how many shapes, which of two shapes is further left/right or higher/lower,
     a sentence describing the picture);
  2. a byte-level BPE tokenizer trained on the questions and answers (`tokenizers`);
  3. a LlavaForConditionalGeneration (CLIP vision tower, projector, LLaMA decoder) trained
     from scratch, saved in the Hugging Face layout as float16 safetensors, so transformers
     runs it unchanged;
  4. a held-out set of generated scenes (PNG) with questions, answers and the greedy answers
     transformers gives with the saved checkpoint, which tests/test_demo_accuracy.c holds mmrt
     to.

Run on a developer machine, never in CI (docs/DEMO.md):

    python3 -m venv /tmp/venv && /tmp/venv/bin/pip install torch transformers tokenizers \
        safetensors pillow numpy
    /tmp/venv/bin/python tools/train_demo.py --out /tmp/stage1 --stop-at 3979
    /tmp/venv/bin/python tools/train_demo.py --out /tmp/stage2 --resume /tmp/stage1/llava-shapes \
        --steps 900 --lr 1e-3 --warmup 50 --kind-weights 1.5,0.7,0.3,3,3,1 --one-way-steps 400
    /tmp/venv/bin/python tools/train_demo.py --out /tmp/stage3 --resume /tmp/stage2/llava-shapes \
        --steps 1200 --lr 1e-3 --warmup 50 --kind-weights 1.5,0.7,0.3,3,3,1 \
        --attention-aux 1 --direction-aux 1
    /tmp/venv/bin/python tools/train_demo.py --out demo --resume /tmp/stage3/llava-shapes \
        --steps 500 --lr 3e-4 --warmup 50 --kind-weights 1.5,0.7,0.5,3,2,1.5 \
        --attention-aux 1 --direction-aux 1

Deterministic: fixed seeds, one scene stream per purpose, deterministic torch algorithms and a
fixed number of threads; demo/train_log.json records package versions, the configuration, the
loss curve, each kind of question's running training accuracy and the accuracy the script
measured on the held-out set.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import sys
import time
from pathlib import Path

import numpy as np

# ---------------------------------------------------------------------------------------------
# the world the model knows
# ---------------------------------------------------------------------------------------------

SHAPES = ["circle", "square", "triangle", "star"]
COLOURS = {
    "red": (220, 40, 40),
    "green": (40, 165, 60),
    "blue": (40, 80, 225),
    "yellow": (235, 205, 25),
    "purple": (150, 60, 195),
    "orange": (245, 140, 30),
}
COUNT_WORDS = ["one", "two", "three", "four"]
SIZES = [0.10, 0.13, 0.16]          # radius as a fraction of the image's shorter side
SIDES = [48, 56, 64, 72, 80, 96]    # image widths and heights before the processor's resize
BACKGROUNDS = [(245, 245, 245), (232, 228, 218), (222, 230, 238), (250, 244, 230), (215, 215, 215)]
KINDS = ["colour", "shape", "count", "leftright", "updown", "describe"]
# training draws the spatial questions and the colour of a shape more often: they are the hard ones
KIND_WEIGHTS = [2.0, 1.0, 0.4, 2.5, 2.5, 1.0]

IMAGE_SIZE = 64                     # the vision tower's input (exact resize, no crop)
PATCH = 8
N_IMAGE_TOKENS = (IMAGE_SIZE // PATCH) ** 2
CLIP_MEAN = [0.48145466, 0.4578275, 0.40821073]
CLIP_STD = [0.26862954, 0.26130258, 0.27577711]
IMAGE_TOKEN = "<image>"
PAD_TOKEN = "<pad>"
BOS, EOS = "<s>", "</s>"
CHAT_TEMPLATE = (
    "{% for message in messages %}{% if message['role'] != 'system' %}"
    "{{ message['role'].upper() + ': ' }}{% endif %}{% if message['content'] is string %}"
    "{{ message['content'] + ' ' }}{% else %}{% for content in message['content'] | "
    "selectattr('type', 'equalto', 'image') %}{{ '<image>\n' }}{% endfor %}{% for content in "
    "message['content'] | selectattr('type', 'equalto', 'text') %}{{ content['text'] + ' ' }}"
    "{% endfor %}{% endif %}{% endfor %}{% if add_generation_prompt %}{{ 'ASSISTANT:' }}{% endif %}"
)

MODEL = {
    "vision": dict(hidden_size=128, intermediate_size=256, num_hidden_layers=4, num_attention_heads=4,
                   image_size=IMAGE_SIZE, patch_size=PATCH, hidden_act="quick_gelu", projection_dim=128,
                   layer_norm_eps=1e-5),
    "text": dict(hidden_size=128, intermediate_size=384, num_hidden_layers=4, num_attention_heads=4,
                 num_key_value_heads=4, head_dim=32, max_position_embeddings=256, rms_norm_eps=1e-5,
                 rope_theta=10000.0, hidden_act="silu"),
    "vocab": 400,                   # trained byte-level BPE vocabulary (<image>, <pad> come after)
}


def prompt_text(question: str) -> str:
    return f"USER: {IMAGE_TOKEN}\n{question} ASSISTANT:"


# ---------------------------------------------------------------------------------------------
# scenes
# ---------------------------------------------------------------------------------------------

def sample_scene(rng: random.Random) -> dict:
    """Shapes of distinct kinds and distinct colours, so every question has one answer."""
    while True:
        w, h = rng.choice(SIDES), rng.choice(SIDES)
        if max(w, h) / min(w, h) <= 1.75:
            break
    n = rng.randint(1, 4)
    kinds = rng.sample(SHAPES, n)
    colours = rng.sample(sorted(COLOURS), n)
    for _ in range(1000):
        shapes = []
        ok = True
        for k, c in zip(kinds, colours):
            r = rng.choice(SIZES) * min(w, h)
            for _ in range(100):
                x = rng.uniform(r + 1, w - r - 1)
                y = rng.uniform(r + 1, h - r - 1)
                if all(math.hypot(x - s["x"], y - s["y"]) > r + s["r"] + 2 for s in shapes):
                    break
            else:
                ok = False
                break
            shapes.append({"kind": k, "colour": c, "x": x, "y": y, "r": r})
        if ok:
            break
    else:
        raise RuntimeError("could not place the shapes")
    bg = {"base": rng.choice(BACKGROUNDS), "texture": rng.choice(["plain", "plain", "stripes", "checker", "noise"]),
          "period": rng.choice([4, 6, 8]), "seed": rng.randrange(1 << 30)}
    return {"width": w, "height": h, "shapes": shapes, "background": bg}


def draw_shapes(d, scene: dict, fill) -> None:
    for i, s in enumerate(scene["shapes"]):
        x, y, r, col = s["x"], s["y"], s["r"], fill(i, s)
        if s["kind"] == "circle":
            d.ellipse([x - r, y - r, x + r, y + r], fill=col)
        elif s["kind"] == "square":
            a = r * 0.85
            d.rectangle([x - a, y - a, x + a, y + a], fill=col)
        elif s["kind"] == "triangle":
            d.polygon([(x, y - r), (x + r * 0.95, y + r * 0.75), (x - r * 0.95, y + r * 0.75)], fill=col)
        else:  # five-pointed star
            pts = []
            for k in range(10):
                rad = r if k % 2 == 0 else r * 0.45
                ang = -math.pi / 2 + k * math.pi / 5
                pts.append((x + rad * math.cos(ang), y + rad * math.sin(ang)))
            d.polygon(pts, fill=col)


def patch_labels(scene: dict):
    """What each patch of the tower's 64x64 input shows: (colour, kind) with 0 = background,
    and the centre of the shape it belongs to (x, y in [-1, 1]; NaN on background). These are
    the targets of the auxiliary heads that teach the tower to see before the decoder has
    learned to look (training only; the heads are not part of the saved model). The centre
    target makes every patch of a shape carry that shape's place, so that a spatial question
    only asks the decoder to compare two numbers (the tower learns it; the decoder had not
    yet learned the comparison in the committed run: docs/DEMO.md)."""
    from PIL import Image, ImageDraw
    m = Image.new("L", (scene["width"], scene["height"]), 0)
    draw_shapes(ImageDraw.Draw(m), scene, lambda i, s: i + 1)
    a = np.asarray(m.resize((IMAGE_SIZE, IMAGE_SIZE), Image.NEAREST))
    g = IMAGE_SIZE // PATCH
    a = a.reshape(g, PATCH, g, PATCH).transpose(0, 2, 1, 3).reshape(g * g, PATCH * PATCH)
    colours, kinds = np.zeros(g * g, np.int64), np.zeros(g * g, np.int64)
    centres = np.full((g * g, 2), np.nan, np.float32)
    names = sorted(COLOURS)
    for p in range(g * g):
        counts = np.bincount(a[p], minlength=len(scene["shapes"]) + 1)
        counts[0] = 0
        best = int(counts.argmax())
        if counts[best] >= PATCH * PATCH // 4:
            s = scene["shapes"][best - 1]
            colours[p] = 1 + names.index(s["colour"])
            kinds[p] = 1 + SHAPES.index(s["kind"])
            centres[p] = (2 * s["x"] / scene["width"] - 1, 2 * s["y"] / scene["height"] - 1)
    return colours, kinds, centres


def draw_scene(scene: dict):
    from PIL import Image, ImageDraw
    w, h = scene["width"], scene["height"]
    bg = scene["background"]
    base = np.array(bg["base"], dtype=np.int16)
    img = np.broadcast_to(base, (h, w, 3)).copy()
    yy, xx = np.mgrid[0:h, 0:w]
    p = bg["period"]
    if bg["texture"] == "stripes":
        img -= (((xx + yy) // p) % 2 == 0)[..., None].astype(np.int16) * 14
    elif bg["texture"] == "checker":
        img -= (((xx // p) + (yy // p)) % 2 == 0)[..., None].astype(np.int16) * 12
    elif bg["texture"] == "noise":
        g = np.random.default_rng(bg["seed"])
        img += (g.integers(-2, 3, size=(h, w, 1)) * 5).astype(np.int16)
    im = Image.fromarray(np.clip(img, 0, 255).astype(np.uint8), "RGB")
    draw_shapes(ImageDraw.Draw(im), scene, lambda i, s: COLOURS[s["colour"]])
    return im


def describe(scene: dict) -> str:
    """The shapes in a fixed order of kinds: 'a red circle, a blue square and a green star.'"""
    order = {k: i for i, k in enumerate(SHAPES)}
    parts = [f"{'an' if s['colour'][0] in 'aeiou' else 'a'} {s['colour']} {s['kind']}" for s in sorted(scene["shapes"], key=lambda s: order[s["kind"]])]
    if len(parts) == 1:
        return parts[0] + "."
    return ", ".join(parts[:-1]) + " and " + parts[-1] + "."


def questions(scene: dict, rng: random.Random, kind: str, one_way: bool = False):
    """A (question, answer) of the given kind, or None when the scene cannot ask it clearly;
    questions that name shapes add a third item, what the training-only decoder heads are told
    (the named shapes, whether the first is the answer, which way the question asks).
    one_way: only "further left" and "higher" (a training curriculum, see --one-way-steps)."""
    sh = scene["shapes"]
    w, h = scene["width"], scene["height"]
    if kind == "colour":
        s = rng.choice(sh)
        return f"What colour is the {s['kind']}?", s["colour"], {"named": [s]}
    if kind == "shape":
        s = rng.choice(sh)
        return f"Which shape is {s['colour']}?", s["kind"]
    if kind == "count":
        return "How many shapes are there?", COUNT_WORDS[len(sh) - 1]
    if kind in ("leftright", "updown"):
        axis, extent = ("x", w) if kind == "leftright" else ("y", h)
        pairs = [(a, b) for a in sh for b in sh if a is not b and abs(a[axis] - b[axis]) >= 0.12 * extent]
        if not pairs:
            return None
        a, b = rng.choice(pairs)
        if kind == "leftright":
            word, pick_min = ("further left", True) if one_way else rng.choice([("further left", True), ("further right", False)])
        else:
            word, pick_min = ("higher", True) if one_way else rng.choice([("higher", True), ("lower", False)])
        lo, hi = (a, b) if a[axis] < b[axis] else (b, a)
        ans = lo if pick_min else hi
        return f"Which is {word}, the {a['kind']} or the {b['kind']}?", ans["kind"], {"named": [a, b], "first": ans is a, "min": pick_min}
    if kind == "describe":
        return "Describe the picture.", describe(scene)
    raise ValueError(kind)


def pixel_values(im) -> np.ndarray:
    """CLIPImageProcessorPil with an exact 64x64 bicubic resize and no crop (checked against
    the processor on the held-out set)."""
    from PIL import Image
    r = im.resize((IMAGE_SIZE, IMAGE_SIZE), Image.BICUBIC)
    a = np.asarray(r, dtype=np.float32) * np.float32(1 / 255)
    a = (a - np.array(CLIP_MEAN, dtype=np.float32)) / np.array(CLIP_STD, dtype=np.float32)
    return a.transpose(2, 0, 1).copy()


# ---------------------------------------------------------------------------------------------
# tokenizer
# ---------------------------------------------------------------------------------------------

def build_tokenizer(seed: int):
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    rng = random.Random(seed)
    corpus = []
    for _ in range(4000):
        sc = sample_scene(rng)
        for k in KINDS:
            qa = questions(sc, rng, k)
            if qa:
                corpus.append(prompt_text(qa[0]).replace(IMAGE_TOKEN, "") + " " + qa[1])
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=MODEL["vocab"], special_tokens=[BOS, EOS], min_frequency=2,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(corpus, trainer)
    bos_id = tok.token_to_id(BOS)
    tok.post_processor = processors.TemplateProcessing(single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B",
                                                       special_tokens=[(BOS, bos_id)])
    tok.add_special_tokens([AddedToken(IMAGE_TOKEN, normalized=False, special=True),
                            AddedToken(PAD_TOKEN, normalized=False, special=True)])
    return tok


# ---------------------------------------------------------------------------------------------
# model
# ---------------------------------------------------------------------------------------------

def build_model(T, torch, tok):
    vocab = tok.get_vocab_size()
    ids = {t: tok.token_to_id(t) for t in (BOS, EOS, IMAGE_TOKEN, PAD_TOKEN)}
    vc = T.CLIPVisionConfig(**MODEL["vision"])
    tc = T.LlamaConfig(**MODEL["text"], vocab_size=vocab, bos_token_id=ids[BOS], eos_token_id=ids[EOS],
                       pad_token_id=ids[PAD_TOKEN], tie_word_embeddings=False)
    cfg = T.LlavaConfig(vision_config=vc, text_config=tc, image_token_index=ids[IMAGE_TOKEN],
                        projector_hidden_act="gelu", vision_feature_layer=-1,
                        vision_feature_select_strategy="default", image_seq_length=N_IMAGE_TOKENS,
                        pad_token_id=ids[PAD_TOKEN], tie_word_embeddings=False)
    model = T.LlavaForConditionalGeneration._from_config(cfg, attn_implementation="sdpa", dtype=torch.float32)
    return model, ids


def make_processor(T, tok):
    hf_tok = T.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=BOS, eos_token=EOS, pad_token=PAD_TOKEN,
                                       extra_special_tokens={"image_token": IMAGE_TOKEN})
    ip = T.CLIPImageProcessorPil(size={"height": IMAGE_SIZE, "width": IMAGE_SIZE}, do_center_crop=False,
                                 crop_size={"height": IMAGE_SIZE, "width": IMAGE_SIZE}, resample=3)
    return T.LlavaProcessor(image_processor=ip, tokenizer=hf_tok, patch_size=PATCH,
                            vision_feature_select_strategy="default", num_additional_image_tokens=1,
                            image_token=IMAGE_TOKEN, chat_template=CHAT_TEMPLATE)


class Batcher:
    """Scenes drawn on the fly; every image carries several questions so that one pass of the
    vision tower feeds several answers."""

    def __init__(self, tok, ids, seed: int, images: int, per_image: int):
        self.tok, self.ids, self.rng = tok, ids, random.Random(seed)
        self.images, self.per_image = images, per_image
        self.cache = {}
        self.one_way = False

    def encode(self, text: str, special: bool):
        key = (text, special)
        if key not in self.cache:
            self.cache[key] = self.tok.encode(text, add_special_tokens=special).ids
        return self.cache[key]

    def prompt_ids(self, question: str):
        ids = self.encode(prompt_text(question), True)
        i = ids.index(self.ids[IMAGE_TOKEN])
        return ids[:i] + [self.ids[IMAGE_TOKEN]] * N_IMAGE_TOKENS + ids[i + 1:]

    def decoder_targets(self, sc, p, qa):
        """Targets of the training-only heads on the decoder (see --decoder-aux): at the token of
        each shape the question names, that shape's centre; at the question's last token, for
        a spatial question, whether the answer is the first of the two named shapes."""
        if len(qa) < 3:
            return None
        info = qa[2]
        img_end = p.index(self.ids[IMAGE_TOKEN]) + N_IMAGE_TOKENS
        names, pos = [], img_end
        for s in info["named"]:
            tid = self.encode(" " + s["kind"], False)[0]
            pos = p.index(tid, pos)
            names.append((pos, 2 * s["x"] / sc["width"] - 1, 2 * s["y"] / sc["height"] - 1))
            pos += 1
        first = None
        if "first" in info:
            first = (p.index(self.encode("?", False)[0], pos), float(info["first"]))
        way = None
        if "min" in info:
            # the token after which the question's direction is known ("left", "right", "higher", "lower")
            words = [self.encode(" " + w, False)[0] for w in ("left", "right", "higher", "lower")]
            way = (min(i for i in range(img_end, len(p)) if p[i] in words), float(info["min"]))
        return names, first, way

    def next(self):
        px, seqs, lab_c, lab_k, lab_xy = [], [], [], [], []
        for img_i in range(self.images):
            sc = sample_scene(self.rng)
            px.append(pixel_values(draw_scene(sc)))
            c, k, xy = patch_labels(sc)
            lab_c.append(c)
            lab_k.append(k)
            lab_xy.append(xy)
            kinds = list(KINDS)
            chosen = []
            while len(chosen) < self.per_image and kinds:
                k = self.rng.choices(kinds, weights=[KIND_WEIGHTS[KINDS.index(x)] for x in kinds])[0]
                kinds.remove(k)
                qa = questions(sc, self.rng, k, self.one_way)
                if qa:
                    chosen.append((k, qa))
            for k, qa in chosen:
                q, a = qa[0], qa[1]
                p = self.prompt_ids(q)
                ans = self.encode(" " + a, False) + [self.ids[EOS]]
                seqs.append((img_i, p + ans, len(p), KINDS.index(k), self.decoder_targets(sc, p, qa), a))
        return np.stack(px), seqs, (np.stack(lab_c), np.stack(lab_k), np.stack(lab_xy))


def forward_logits(model, torch, px, ids, seq_img, image_id, attentions=False):
    """LLaVA's forward with the vision tower run once per image and its features shared by the
    sequences that ask about it (checked against model(...) before training)."""
    m = model.model
    vt = m.vision_tower(px, output_hidden_states=True)
    feats = m.multi_modal_projector(vt.hidden_states[-1][:, 1:])           # [I, 64, D]
    emb = m.language_model.embed_tokens(ids)
    mask = ids == image_id
    emb = emb.masked_scatter(mask[..., None], feats[seq_img].reshape(-1, feats.shape[-1]).to(emb.dtype))
    out = m.language_model(inputs_embeds=emb, output_hidden_states=True, output_attentions=attentions)
    return model.lm_head(out.last_hidden_state), vt.hidden_states[-1][:, 1:], out


def collate(torch, seqs, pad_id):
    n = max(len(s[1]) for s in seqs)
    ids = torch.full((len(seqs), n), pad_id, dtype=torch.long)
    labels = torch.full((len(seqs), n), -100, dtype=torch.long)
    for i, (_, toks, plen, *_) in enumerate(seqs):
        ids[i, :len(toks)] = torch.tensor(toks)
        labels[i, plen - 1:len(toks) - 1] = torch.tensor(toks[plen:])   # predict the answer + EOS
    img = torch.tensor([s[0] for s in seqs])
    return ids, labels, img


# ---------------------------------------------------------------------------------------------
# held-out set and evaluation
# ---------------------------------------------------------------------------------------------

def make_heldout(out: Path, n_per_kind: int, seed: int):
    rng = random.Random(seed)
    d = out / "heldout"
    if d.exists():
        shutil.rmtree(d)
    d.mkdir(parents=True)
    items = []
    for kind in KINDS:
        made = 0
        while made < n_per_kind:
            sc = sample_scene(rng)
            qa = questions(sc, rng, kind)
            if not qa:
                continue
            name = f"{len(items):03d}.png"
            draw_scene(sc).save(d / name, optimize=True)
            items.append({"image": name, "kind": kind, "question": qa[0], "answer": qa[1],
                          "width": sc["width"], "height": sc["height"]})
            made += 1
    return items


def make_examples(out: Path, seed: int):
    """A few pictures for conf/demo.ini and the README (two, three and four shapes), with the
    sentence that describes each."""
    rng = random.Random(seed)
    d = out / "examples"
    d.mkdir(parents=True, exist_ok=True)
    listed = []
    for n in (2, 3, 4):
        while True:
            sc = sample_scene(rng)
            if len(sc["shapes"]) == n and sc["background"]["texture"] != "noise":
                break
        name = f"shapes-{n}.png"
        draw_scene(sc).save(d / name, optimize=True)
        listed.append({"image": name, "question": "Describe the picture.", "answer": describe(sc)})
    (d / "examples.json").write_text(json.dumps(listed, indent=1) + "\n")


def greedy_answers(T, torch, ckpt: Path, items, image_dir: Path, max_new: int = 24):
    """transformers' greedy answers with the saved (float16) checkpoint run in float32, through
    the saved processor: exactly what mmrt is held to."""
    from PIL import Image
    proc = T.AutoProcessor.from_pretrained(str(ckpt), backend="pil")
    model = T.LlavaForConditionalGeneration.from_pretrained(str(ckpt), dtype=torch.float32,
                                                            attn_implementation="eager").eval()
    eos = model.config.text_config.eos_token_id
    answers = []
    for it in items:
        text = proc.apply_chat_template([{"role": "user", "content": [{"type": "image"},
                                          {"type": "text", "text": it["question"]}]}],
                                        add_generation_prompt=True, tokenize=False)
        if text != prompt_text(it["question"]):
            raise RuntimeError(f"chat template renders {text!r}")
        with Image.open(image_dir / it["image"]) as im:
            im.load()
            inputs = proc(images=im.convert("RGB"), text=text, return_tensors="pt")
            mine = pixel_values(im.convert("RGB"))
        diff = float(np.abs(inputs["pixel_values"][0].numpy() - mine).max())
        if diff > 1e-5:
            raise RuntimeError(f"{it['image']}: training pixels differ from the processor's by {diff}")
        with torch.no_grad():
            gen = model.generate(**inputs, do_sample=False, max_new_tokens=max_new, eos_token_id=eos,
                                 pad_token_id=model.config.text_config.pad_token_id)
        new = gen[0, inputs["input_ids"].shape[1]:].tolist()
        if eos in new:
            new = new[:new.index(eos)]
        answers.append((proc.tokenizer.decode(new, skip_special_tokens=True).strip(), new))
    return answers


def versions():
    import PIL
    import safetensors
    import tokenizers
    import torch
    import transformers
    return {"python": sys.version.split()[0], "torch": torch.__version__,
            "transformers": transformers.__version__, "tokenizers": tokenizers.__version__,
            "safetensors": safetensors.__version__, "pillow": PIL.__version__, "numpy": np.__version__}


# ---------------------------------------------------------------------------------------------

def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="demo", help="output directory (default demo/)")
    ap.add_argument("--steps", type=int, default=5000)
    ap.add_argument("--images", type=int, default=24, help="images per step")
    ap.add_argument("--per-image", type=int, default=3, help="questions per image")
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--aux-weight", type=float, default=0.5, help="weight of the per-patch loss")
    ap.add_argument("--centre-weight", type=float, default=4.0,
                    help="weight of the shape-centre regression within the per-patch loss")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--heldout-per-kind", type=int, default=40)
    ap.add_argument("--seed", type=int, default=20261202)
    ap.add_argument("--resume", help="continue training the checkpoint in this directory")
    ap.add_argument("--kind-weights", help="how often each kind of question is drawn: "
                    "colour,shape,count,leftright,updown,describe")
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--only-examples", action="store_true", help="write demo/examples and exit")
    ap.add_argument("--time-steps", type=int, default=0, help="only time this many steps and exit")
    ap.add_argument("--one-way-steps", type=int, default=0,
                    help="for this many first steps ask only 'further left' and 'higher' (see docs/DEMO.md)")
    ap.add_argument("--stop-at", type=int, default=0,
                    help="end training after this many steps of the --steps schedule, then save and evaluate")
    ap.add_argument("--decoder-aux", type=float, default=0.0,
                    help="weight of the training-only heads on the decoder's hidden states (docs/DEMO.md)")
    ap.add_argument("--name-layer", type=int, default=2,
                    help="decoder layer whose output at a named shape's token predicts its centre")
    ap.add_argument("--compare-layer", type=int, default=3,
                    help="decoder layer whose output at the '?' predicts whether the first named shape is the answer")
    ap.add_argument("--attention-aux", type=float, default=0.0,
                    help="weight of the loss that points one decoder head at a spatial question's answer (docs/DEMO.md)")
    ap.add_argument("--attention-layer", type=int, default=4, help="decoder layer (1-based) of that head")
    ap.add_argument("--attention-head", type=int, default=0, help="which head of that layer")
    ap.add_argument("--direction-aux", type=float, default=0.0,
                    help="weight of the loss that has the last prompt token tell which way a spatial question asks")
    ap.add_argument("--direction-layer", type=int, default=2, help="decoder layer whose output is read for it")
    ap.add_argument("--stop-file", help="end training at the next step boundary once this file exists "
                    "(the same checkpoint as --stop-at with that step)")
    args = ap.parse_args(argv)

    import torch
    import transformers as T
    torch.manual_seed(args.seed)
    random.seed(args.seed)
    np.random.seed(args.seed % (1 << 32))
    torch.set_num_threads(args.threads)
    torch.use_deterministic_algorithms(True)
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)

    if args.only_examples:
        make_examples(out, args.seed + 4)
        return 0
    if args.kind_weights:
        KIND_WEIGHTS[:] = [float(v) for v in args.kind_weights.split(",")]
        if len(KIND_WEIGHTS) != len(KINDS):
            raise SystemExit(f"--kind-weights: {len(KINDS)} values, one per {KINDS}")
    if args.resume:
        # a further stage of training from a checkpoint this script saved, with its tokenizer
        from tokenizers import Tokenizer
        tok = Tokenizer.from_file(str(Path(args.resume) / "tokenizer.json"))
        model = T.LlavaForConditionalGeneration.from_pretrained(args.resume, dtype=torch.float32,
                                                                attn_implementation="sdpa")
        ids = {t: tok.token_to_id(t) for t in (BOS, EOS, IMAGE_TOKEN, PAD_TOKEN)}
    else:
        tok = build_tokenizer(args.seed + 1)
        model, ids = build_model(T, torch, tok)
    if args.attention_aux:
        model.set_attn_implementation("eager")      # sdpa does not return the attention weights
    n_params = sum(p.numel() for p in model.parameters())
    print(f"train_demo: {n_params / 1e6:.2f}M parameters, vocab {tok.get_vocab_size()}", flush=True)

    batcher = Batcher(tok, ids, args.seed + (9 if args.resume else 2), args.images, args.per_image)
    # the shared-vision forward must be LLaVA's own forward
    px, seqs, _ = batcher.next()
    ids_t, labels, img = collate(torch, seqs[:4], ids[PAD_TOKEN])
    with torch.no_grad():
        mine, _, _ = forward_logits(model, torch, torch.from_numpy(px), ids_t, img, ids[IMAGE_TOKEN])
        ref = model(input_ids=ids_t, pixel_values=torch.from_numpy(px)[img]).logits
    gap = float((mine - ref).abs().max())
    if gap > 1e-4:
        raise RuntimeError(f"shared-vision forward differs from LlavaForConditionalGeneration by {gap}")

    # auxiliary per-patch heads (colour, kind, centre of the patch's shape): dense supervision
    # for the tower
    hid = MODEL["vision"]["hidden_size"]
    aux = torch.nn.ModuleList([torch.nn.Linear(hid, len(COLOURS) + 1), torch.nn.Linear(hid, len(SHAPES) + 1),
                               torch.nn.Linear(hid, 2)])
    params = list(model.parameters()) + list(aux.parameters())
    if args.decoder_aux:
        dec_aux = torch.nn.ModuleList([torch.nn.Linear(MODEL["text"]["hidden_size"], 2),
                                       torch.nn.Linear(MODEL["text"]["hidden_size"], 1)])
        params += list(dec_aux.parameters())
    if args.direction_aux:
        dir_head = torch.nn.Linear(MODEL["text"]["hidden_size"], 1)
        params += list(dir_head.parameters())
    opt = torch.optim.AdamW(params, lr=args.lr, betas=(0.9, 0.98), weight_decay=0.01)
    warm = args.warmup

    def lr_at(step):
        if step < warm:
            return args.lr * (step + 1) / warm
        t = (step - warm) / max(1, args.steps - warm)
        return args.lr * (0.02 + 0.98 * 0.5 * (1 + math.cos(math.pi * t)))

    log = []
    t0 = time.time()
    model.train()
    steps = args.time_steps or args.stop_at or args.steps
    ema = None
    window = [[0, 0] for _ in KINDS]
    for step in range(steps):
        if args.stop_file and os.path.exists(args.stop_file):
            print(f"train_demo: {args.stop_file} exists, ending at step {step} (rerun with --stop-at {step})", flush=True)
            break
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        batcher.one_way = step < args.one_way_steps
        px, seqs, (lab_c, lab_k, lab_xy) = batcher.next()
        ids_t, labels, img = collate(torch, seqs, ids[PAD_TOKEN])
        logits, vis, hs = forward_logits(model, torch, torch.from_numpy(px), ids_t, img, ids[IMAGE_TOKEN],
                                         attentions=args.attention_aux > 0)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1),
                                                 ignore_index=-100)
        v = vis.reshape(-1, vis.shape[-1])
        xy = torch.from_numpy(lab_xy).reshape(-1, 2)
        on = ~torch.isnan(xy[:, 0])
        aux_loss = (torch.nn.functional.cross_entropy(aux[0](v), torch.from_numpy(lab_c).reshape(-1))
                    + torch.nn.functional.cross_entropy(aux[1](v), torch.from_numpy(lab_k).reshape(-1))
                    + args.centre_weight * torch.nn.functional.mse_loss(aux[2](v[on]), xy[on]))
        total = loss + args.aux_weight * aux_loss
        dec_v = att_v = dir_v = 0.0
        if args.attention_aux:
            # one head of one decoder layer, at the last prompt token (whose output is the first
            # answer token), is told to look at the patches of the shape that answers a spatial
            # question (docs/DEMO.md: the comparison the decoder did not find by itself)
            terms = []
            att = hs.attentions[args.attention_layer - 1]
            for i, sq in enumerate(seqs):
                if sq[3] not in (KINDS.index("leftright"), KINDS.index("updown")):
                    continue
                first_img = sq[1].index(ids[IMAGE_TOKEN])
                want = torch.from_numpy(lab_k[sq[0]] == 1 + SHAPES.index(sq[5]))
                if not bool(want.any()):
                    continue                # a small star can cover no patch by a quarter
                a = att[i, args.attention_head, sq[2] - 1, first_img:first_img + N_IMAGE_TOKENS]
                terms.append(-torch.log(a[want].sum() + 1e-6))
            if terms:
                att_loss = torch.stack(terms).mean()
                total = total + args.attention_aux * att_loss
                att_v = att_loss.item()
        if args.direction_aux:
            # the last prompt token is told which way the question asks ("further left" and
            # "higher" against "further right" and "lower"), which it needs for the comparison
            # (every token from the direction word on is asked, the last prompt token among them:
            # more places to learn the route from)
            rows = [(i, pos, sq[4][2][1]) for i, sq in enumerate(seqs) if sq[4] is not None and sq[4][2] is not None
                    for pos in range(sq[4][2][0], sq[2])]
            if rows:
                h = hs.hidden_states[args.direction_layer][[r[0] for r in rows], [r[1] for r in rows]]
                h = torch.nn.functional.layer_norm(h, (h.shape[-1],))
                dir_loss = torch.nn.functional.binary_cross_entropy_with_logits(
                    dir_head(h)[:, 0], torch.tensor([r[2] for r in rows]))
                total = total + args.direction_aux * dir_loss
                dir_v = dir_loss.item()
        if args.decoder_aux:
            npos, nxy, cpos, cbit = [], [], [], []
            for i, sq in enumerate(seqs):
                if sq[4] is None:
                    continue
                for pos, cx, cy in sq[4][0]:
                    npos.append((i, pos))
                    nxy.append((cx, cy))
                if sq[4][1] is not None:
                    cpos.append((i, sq[4][1][0]))
                    cbit.append(sq[4][1][1])
            dec_loss = logits.new_zeros(())
            if npos:
                ii = torch.tensor(npos)
                h = torch.nn.functional.layer_norm(hs.hidden_states[args.name_layer][ii[:, 0], ii[:, 1]], (hs.hidden_states[0].shape[-1],))
                dec_loss = dec_loss + torch.nn.functional.mse_loss(dec_aux[0](h), torch.tensor(nxy))
            if cpos:
                ii = torch.tensor(cpos)
                h = torch.nn.functional.layer_norm(hs.hidden_states[args.compare_layer][ii[:, 0], ii[:, 1]], (hs.hidden_states[0].shape[-1],))
                dec_loss = dec_loss + torch.nn.functional.binary_cross_entropy_with_logits(
                    dec_aux[1](h)[:, 0], torch.tensor(cbit))
            total = total + args.decoder_aux * dec_loss
            dec_v = dec_loss.item()
        opt.zero_grad(set_to_none=True)
        total.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        with torch.no_grad():
            # exact answers under teacher forcing on this step's fresh scenes: the same as the
            # greedy answers, so a running measure of accuracy per kind of question
            right = ((logits.argmax(-1) == labels) | (labels == -100)).all(dim=1).tolist()
        for (_, _, _, k, *_), r in zip(seqs, right):
            window[k][0] += r
            window[k][1] += 1
        lv, av = loss.item(), aux_loss.item()
        ema = lv if ema is None else 0.98 * ema + 0.02 * lv
        aux_ema = av if step == 0 else 0.98 * aux_ema + 0.02 * av
        dec_ema = dec_v if step == 0 else 0.98 * dec_ema + 0.02 * dec_v
        att_ema = att_v if step == 0 else 0.98 * att_ema + 0.02 * att_v
        dir_ema = dir_v if step == 0 else 0.98 * dir_ema + 0.02 * dir_v
        if step % 50 == 0 or step == steps - 1:
            el = time.time() - t0
            accs = {k: round(w[0] / w[1], 3) if w[1] else None for k, w in zip(KINDS, window)}
            print(f"step {step:5d}  loss {ema:.4f}  aux {aux_ema:.4f}  dec {dec_ema:.4f}  att {att_ema:.4f}  dir {dir_ema:.4f}  lr {lr_at(step):.2e}  {el / (step + 1):.3f} s/step  "
                  f"{el / 60:.1f} min  acc " + " ".join(f"{k[:5]} {v}" for k, v in accs.items()), flush=True)
            log.append({"step": step, "loss_ema": round(ema, 5), "aux_ema": round(aux_ema, 5), "decoder_aux_ema": round(dec_ema, 5), "attention_aux_ema": round(att_ema, 5), "direction_aux_ema": round(dir_ema, 5), "elapsed_s": round(el, 1),
                        "batch_accuracy": accs})
            window = [[0, 0] for _ in KINDS]
    train_s = time.time() - t0
    if args.time_steps:
        print(f"train_demo: {train_s / steps:.3f} s/step")
        return 0

    # ---- save the checkpoint (float16) and the processor files ----
    ckpt = out / "llava-shapes"
    if ckpt.exists():
        shutil.rmtree(ckpt)
    model.eval()
    model.config.dtype = torch.float16
    half = model.to(torch.float16)
    half.save_pretrained(str(ckpt), safe_serialization=True)
    proc = make_processor(T, tok)
    proc.save_pretrained(str(ckpt))
    (ckpt / "chat_template.jinja").write_text(CHAT_TEMPLATE)

    # ---- held-out set, transformers' answers, accuracy ----
    make_examples(out, args.seed + 4)
    items = make_heldout(out, args.heldout_per_kind, args.seed + 3)
    answers = greedy_answers(T, torch, ckpt, items, out / "heldout")
    by_kind = {}
    for it, (ans, toks) in zip(items, answers):
        it["transformers_answer"] = ans
        it["transformers_tokens"] = toks
        ok = ans == it["answer"]
        k = by_kind.setdefault(it["kind"], [0, 0])
        k[0] += ok
        k[1] += 1
    correct = sum(v[0] for v in by_kind.values())
    acc = correct / len(items)
    (out / "heldout" / "heldout.json").write_text(json.dumps({"items": items}, indent=1) + "\n")
    report = {
        "versions": versions(), "args": vars(args), "model": MODEL, "parameters": n_params,
        "train_seconds": round(train_s, 1), "threads": args.threads,
        "heldout_accuracy": round(acc, 4),
        "heldout_by_kind": {k: {"correct": v[0], "items": v[1]} for k, v in by_kind.items()},
        "loss": log,
    }
    (out / "train_log.json").write_text(json.dumps(report, indent=1) + "\n")
    print(f"train_demo: held-out accuracy {acc:.3f} ({correct}/{len(items)}); "
          + ", ".join(f"{k} {v[0]}/{v[1]}" for k, v in by_kind.items()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
