#!/usr/bin/env python3
"""Build the golden fixtures that mmrt's C tests are held against.

The C runtime is judged against Hugging Face transformers in float32 (docs: shared/DESIGN.md,
"Numbers: what correct means"; spec: shared/specs/models.md §6). CI has no torch, so this
script is run once on a developer machine and its outputs are committed under tests/fixtures/.

    pip install torch transformers safetensors tokenizers pillow numpy
    python3 tools/make_fixtures.py llava --out tests/fixtures

Each model family gets one `make_<family>(out_dir, variant)` function; the CLI sub-command of
the same name builds all of that family's variants. LLaVA-1.5 is the first; Qwen2-VL, Fuyu and
LLaVA-NeXT are meant to be added the same way (their tiny configs are in models.md §6.2).

Everything is deterministic: fixed seeds, torch.use_deterministic_algorithms, float32,
attn_implementation="eager", one CPU thread. Re-running with the same package versions
reproduces the committed files byte for byte (checked before committing).
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import math
import os
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[1]

# The C tests compare with |c - ref| <= TOL_REL * max|ref| per tensor (features, logits), and
# require identical greedy token ids. Tiny fp32 models agree with HF eager to ~1e-6 in practice.
TOL_REL = 1e-4
N_GREEDY = 16


# --------------------------------------------------------------------------------------------
# shared helpers (meant to be reused by the other model families)
# --------------------------------------------------------------------------------------------

def _import_stack():
    """Import the reference stack lazily so `--help` works without torch."""
    global torch, T, save_file, safe_open, Image
    import torch  # noqa: F401
    import transformers as T  # noqa: F401
    from safetensors.torch import save_file  # noqa: F401
    from safetensors import safe_open  # noqa: F401
    from PIL import Image  # noqa: F401


def set_determinism(seed: int) -> None:
    torch.manual_seed(seed)
    np.random.seed(seed)
    # One thread: the reduction order of CPU matmuls can depend on the thread count, and the
    # committed files should not depend on the machine that made them.
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)


def versions() -> dict:
    import PIL
    import safetensors
    import tokenizers
    return {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "transformers": T.__version__,
        "tokenizers": tokenizers.__version__,
        "safetensors": safetensors.__version__,
        "pillow": PIL.__version__,
        "numpy": np.__version__,
    }


def perturb(model, scale: float, seed: int) -> None:
    """Add seeded noise to every parameter.

    HF initialises norm weights to 1 and biases to 0; a C port that swapped weight and bias,
    or forgot a bias, would still pass against such a model. After this no tensor is at its
    init value. The scale is large compared with HF's init (std 0.02) on purpose: with small
    weights the logits are nearly flat, greedy decoding repeats one token, and the image
    barely moves the logits, so vision-path bugs would hide.
    """
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            noise = torch.randn(p.shape, generator=g, dtype=torch.float32)
            p.add_((noise * scale).to(p.dtype))


def rel_err(a, b) -> float:
    a = a.detach().double()
    b = b.detach().double()
    den = b.abs().max().item()
    return (a - b).abs().max().item() / (den if den > 0 else 1.0)


def file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def dir_size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def write_json(path: Path, obj) -> None:
    path.write_text(json.dumps(obj, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")


def safetensors_keys(ckpt_dir: Path) -> list[str]:
    keys = []
    for f in sorted(ckpt_dir.glob("*.safetensors")):
        if f.name.startswith("expected"):
            continue
        with safe_open(str(f), "pt") as sf:
            keys.extend(sf.keys())
    return sorted(keys)


# --------------------------------------------------------------------------------------------
# LLaMA-style tokenizer (models.md §6.4, §7.2)
# --------------------------------------------------------------------------------------------

# ASCII only on purpose: a non-ASCII character in a prompt (é) then has no vocab piece and must
# go through byte fallback (<0xC3><0xA9>), which the C tokenizer has to get right.
LLAMA_TOKENIZER_CORPUS = [
    "USER: What is shown in this image? ASSISTANT: The image shows a small picture.",
    "USER: Describe the colors in two words. ASSISTANT: Red and green, blue and gray.",
    "USER: Is there a cat? Answer yes or no. ASSISTANT: No, there is no cat in the image.",
    "The picture has a gradient from dark to light with some noise on top of it.",
    "What colors are there? There are red, green, blue, white and black colors here.",
    "one two three four five six seven eight nine ten, a an the of in on at to is are",
]
LLAMA_TRAINED_VOCAB = 384          # <unk> <s> </s> + 256 bytes + 125 learned pieces
IMAGE_TOKEN = "<image>"            # added special token, id LLAMA_TRAINED_VOCAB     (= 384)
PAD_TOKEN = "<pad>"                # added special token, id LLAMA_TRAINED_VOCAB + 1 (= 385)


def build_llama_tokenizer():
    """SentencePiece-BPE-with-byte-fallback tokenizer laid out like llava-1.5's.

    Vocab: <unk>=0, <s>=1, </s>=2, <0x00>..<0xFF> = 3..258 as ordinary vocab pieces (not added
    tokens, as in the real file), then ▁ and learned pieces. Legacy normalizer (Prepend ▁ +
    Replace " "→▁), no pre-tokenizer, BOS added by TemplateProcessing. Then <image> and <pad>
    are added special tokens right after the trained vocab, mirroring llava-1.5's 32000/32001.
    """
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

    # 1) learn merges. Metaspace(split=True) during training only, so that no merge spans a
    #    word boundary, like SentencePiece's split_by_whitespace; the final tokenizer has no
    #    pre-tokenizer and BPE then runs over whole segments (merges never cross ▁ anyway).
    specials = ["<unk>", "<s>", "</s>"]
    n_learn = LLAMA_TRAINED_VOCAB - 256          # trainer vocab = 3 specials + alphabet + merges
    trainer_tok = Tokenizer(models.BPE(unk_token="<unk>"))
    trainer_tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always", split=True)
    trainer = trainers.BpeTrainer(vocab_size=n_learn, special_tokens=specials, show_progress=False,
                                  initial_alphabet=["▁"], min_frequency=1)
    trainer_tok.train_from_iterator(LLAMA_TOKENIZER_CORPUS, trainer)
    learned = json.loads(trainer_tok.to_str())["model"]
    learned_vocab = sorted(learned["vocab"].items(), key=lambda kv: kv[1])
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in learned["merges"]]

    # 2) final vocab in the llama order
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = len(vocab)
    for piece, _ in learned_vocab:
        if piece not in vocab:
            vocab[piece] = len(vocab)
    if len(vocab) != LLAMA_TRAINED_VOCAB:
        raise RuntimeError(f"tokenizer vocab is {len(vocab)}, expected {LLAMA_TRAINED_VOCAB}")

    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", fuse_unk=True, byte_fallback=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.pre_tokenizer = None
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    tok.post_processor = processors.TemplateProcessing(
        single="<s>:0 $A:0", pair="<s>:0 $A:0 <s>:1 $B:1", special_tokens=[("<s>", 1)])
    from tokenizers import AddedToken
    tok.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in specials])
    tok.add_special_tokens([AddedToken(IMAGE_TOKEN, normalized=False, special=True),
                            AddedToken(PAD_TOKEN, normalized=False, special=True)])
    assert tok.token_to_id(IMAGE_TOKEN) == LLAMA_TRAINED_VOCAB
    assert tok.token_to_id(PAD_TOKEN) == LLAMA_TRAINED_VOCAB + 1
    return tok


def wrap_hf_tokenizer(tok):
    # TokenizersBackend (= v4's PreTrainedTokenizerFast) uses tokenizer.json as it is;
    # LlamaTokenizer in v5 would rebuild the pipeline (Metaspace pre-tokenizer) from its own
    # defaults, and then HF's ids would no longer follow the JSON the C tokenizer reads.
    return T.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                     unk_token="<unk>", pad_token=PAD_TOKEN,
                                     extra_special_tokens={"image_token": IMAGE_TOKEN})


# --------------------------------------------------------------------------------------------
# test images
# --------------------------------------------------------------------------------------------

# (file name, width, height): landscape, portrait, square, and a slim portrait. With the
# 28-px processor, 45x90 -> 28x56 sits exactly on Pillow's pass-order tie (horizontal first) and
# 36x100 -> 28x77 takes the vertical-first path (see _pil_vertical_first).
LLAVA_IMAGES = [("grad_80x60.png", 80, 60), ("grad_45x90.png", 45, 90), ("grad_64x64.png", 64, 64),
                ("grad_36x100.png", 36, 100)]
LLAVA_IMAGE_DIR = "tests/fixtures/llava-images"


def make_gradient_image(path: Path, w: int, h: int, seed: int) -> None:
    """RGB gradient plus seeded noise, saved as PNG (lossless, so any decoder gets the same
    pixels — JPEG decoders differ in IDCT/upsampling and would blur the comparison)."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w].astype(np.float64)
    r = 255.0 * x / max(w - 1, 1)
    g = 255.0 * y / max(h - 1, 1)
    b = 127.5 + 127.5 * np.sin(2 * math.pi * (x + 2 * y) / (w + h) * 3)
    img = np.stack([r, g, b], axis=-1) + rng.normal(0.0, 24.0, size=(h, w, 3))
    img = np.clip(np.rint(img), 0, 255).astype(np.uint8)
    Image.fromarray(img, mode="RGB").save(path, format="PNG", optimize=False, compress_level=9)


def ensure_llava_images() -> list[Path]:
    d = REPO_ROOT / LLAVA_IMAGE_DIR
    d.mkdir(parents=True, exist_ok=True)
    paths = []
    for i, (name, w, h) in enumerate(LLAVA_IMAGES):
        p = d / name
        make_gradient_image(p, w, h, seed=1000 + i)
        paths.append(p)
    return paths


# --------------------------------------------------------------------------------------------
# LLaVA-1.5
# --------------------------------------------------------------------------------------------

# The llava-1.5 hub template, reduced to what matters here: "ROLE: " (no prefix for system),
# "<image>\n" per image item, "text " per text item, then "ASSISTANT:" (models.md §7.5).
LLAVA_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] != 'system' %}{{ message['role'].upper() + ': ' }}{% endif %}"
    "{% if message['content'] is string %}{{ message['content'] + ' ' }}{% else %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'image') %}"
    "{{ '<image>\n' }}{% endfor %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}"
    "{{ content['text'] + ' ' }}{% endfor %}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ 'ASSISTANT:' }}{% endif %}"
)

LLAVA_PROMPTS = [
    "What is shown in this image?",
    "Describe the colors in two words.",
    "Is there a café? Answer: yes or no!",   # é -> byte fallback; ':' '!' punctuation
]

# Variant table. "tiny", "sharded" and "bf16" are the same model (same config and seed) saved
# three ways; "alt" is a second configuration that changes every size the C code must read
# from config.json rather than assume.
#   layout: tensor names, see llava_rename(). files: "v5" = the processor/tokenizer files exactly
#   as this transformers version's save_pretrained writes them (nested processor_config.json,
#   chat_template.jinja, no preprocessor_config.json); "hub" = the file set of the llava-hf repos
#   (v4 save_pretrained): flat preprocessor_config.json + processor_config.json,
#   special_tokens_map.json, chat_template.json. The C loader has to read both.
LLAVA_VARIANTS = {
    "tiny": dict(dir="llava-tiny", base="tiny", layout="saved", files="v5", dtype="float32", shard=None),
    "sharded": dict(dir="llava-tiny-sharded", base="tiny", layout="saved", files="v5", dtype="float32",
                    shard="100KB"),
    "bf16": dict(dir="llava-tiny-bf16", base="tiny", layout="legacy", files="hub", dtype="bfloat16", shard=None),
    "alt": dict(dir="llava-tiny-alt", base="alt", layout="new", files="hub", dtype="float32", shard=None),
    "swa": dict(dir="llava-tiny-swa", base="swa", layout="saved", files="v5", dtype="float32", shard=None),
}

LLAVA_BASES = {
    # models.md §6.2, with a non-default rope_theta so a C port that hard-codes 10000 fails.
    "tiny": dict(
        seed=31,   # seeds picked so every greedy step has a top-1 margin > 2e-3 relative
        vision=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
                    image_size=28, patch_size=7, projection_dim=32, hidden_act="quick_gelu",
                    layer_norm_eps=1e-5),
        # vocab 392 > tokenizer size 386: padded like llava-1.5 (32064 vs 32002)
        text=dict(vocab_size=392, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                  rms_norm_eps=1e-5, rope_theta=5000.0),
        vision_feature_layer=-2, strategy="default",
        crop=28,
    ),
    # Different everything: MHA (kv heads = heads), head_dim 12 / 16, 3 LM layers, 70 px images
    # with patch 14 (so 45x90 and 64x64 are *up*-scaled), last vision layer with CLS kept
    # ("full"), vocab exactly the tokenizer size, other theta and eps.
    "alt": dict(
        seed=5,
        vision=dict(hidden_size=48, intermediate_size=96, num_hidden_layers=3, num_attention_heads=3,
                    image_size=70, patch_size=14, projection_dim=48, hidden_act="quick_gelu",
                    layer_norm_eps=1e-6),
        text=dict(vocab_size=LLAMA_TRAINED_VOCAB + 2, hidden_size=48, intermediate_size=128,
                  num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4,
                  max_position_embeddings=256, rms_norm_eps=1e-6, rope_theta=50000.0),
        vision_feature_layer=-1, strategy="full",
        crop=70,
    ),
    # A Mistral text model (model_type "mistral") with a sliding window of 12 positions: the
    # prompts are 31-35 positions long and 16 tokens are generated, so from the prefill's
    # last rows on every query sees less than the whole sequence. Three layers, so the last
    # prompt row still hears the image through the windows of earlier rows (36 positions of
    # reach). make_llava checks that the same weights with full attention choose other
    # tokens and logits, i.e. that the fixture really holds the window.
    "swa": dict(
        seed=83,   # every greedy step's top-1 margin > 2e-3 relative, with the window and without
        text_class="mistral",
        vision=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
                    image_size=28, patch_size=7, projection_dim=32, hidden_act="quick_gelu",
                    layer_norm_eps=1e-5),
        text=dict(vocab_size=392, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                  rms_norm_eps=1e-5, rope_theta=20000.0, sliding_window=12),
        vision_feature_layer=-2, strategy="default",
        crop=28,
    ),
}

PERTURB_SCALE = 0.2


def llava_config(base: dict):
    vc = T.CLIPVisionConfig(**base["vision"])
    text_class = T.MistralConfig if base.get("text_class") == "mistral" else T.LlamaConfig
    tc = text_class(**base["text"], bos_token_id=1, eos_token_id=2, pad_token_id=LLAMA_TRAINED_VOCAB + 1,
                    tie_word_embeddings=False)
    n_patches = (base["vision"]["image_size"] // base["vision"]["patch_size"]) ** 2
    n_img = n_patches if base["strategy"] == "default" else n_patches + 1
    cfg = T.LlavaConfig(vision_config=vc, text_config=tc, image_token_index=LLAMA_TRAINED_VOCAB,
                        projector_hidden_act="gelu", vision_feature_layer=base["vision_feature_layer"],
                        vision_feature_select_strategy=base["strategy"], image_seq_length=n_img,
                        pad_token_id=LLAMA_TRAINED_VOCAB + 1)
    return cfg, n_img


def llava_processor(base: dict, hf_tok):
    ip = T.CLIPImageProcessorPil(size={"shortest_edge": base["crop"]},
                                 crop_size={"height": base["crop"], "width": base["crop"]},
                                 resample=3)  # PIL bicubic, as llava-hf
    # num_additional_image_tokens=1 is the CLS token; "default" then subtracts it again.
    return T.LlavaProcessor(image_processor=ip, tokenizer=hf_tok, patch_size=base["vision"]["patch_size"],
                            vision_feature_select_strategy=base["strategy"], num_additional_image_tokens=1,
                            image_token=IMAGE_TOKEN, chat_template=LLAVA_CHAT_TEMPLATE)


def build_llava_model(base: dict):
    set_determinism(base["seed"])
    cfg, n_img = llava_config(base)
    model = T.LlavaForConditionalGeneration._from_config(cfg, attn_implementation="eager", dtype=torch.float32)
    perturb(model, PERTURB_SCALE, seed=base["seed"] + 1)
    return model.eval(), n_img


# Three spellings of the same tensors (models.md §1.7). "saved" is what this transformers
# version writes with save_pretrained; the other two are produced by renaming its keys.
def llava_rename(key: str, layout: str) -> str:
    if layout == "saved":
        return key
    # canonical: language_model.X (body), lm_head.weight, vision_tower.X, multi_modal_projector.X
    if key.startswith("language_model.lm_head."):
        canon = "lm_head." + key[len("language_model.lm_head."):]
    elif key.startswith("language_model.model."):
        canon = "language_model." + key[len("language_model.model."):]
    elif key.startswith("vision_tower.vision_model."):
        canon = "vision_tower." + key[len("vision_tower.vision_model."):]
    else:
        canon = key
    if layout == "legacy":   # original llava-hf hub repos
        if canon.startswith("lm_head."):
            return "language_model." + canon
        if canon.startswith("language_model."):
            return "language_model.model." + canon[len("language_model."):]
        if canon.startswith("vision_tower."):
            return "vision_tower.vision_model." + canon[len("vision_tower."):]
        return canon
    if layout == "new":      # transformers' in-memory names (v5): model.<sub>..., lm_head at top
        if canon.startswith("lm_head."):
            return canon
        return "model." + canon
    raise ValueError(layout)


def save_llava_checkpoint(model, out: Path, variant: dict) -> None:
    """save_pretrained, then (for the legacy/new layouts) rewrite the tensor names in place."""
    m = model
    if variant["dtype"] == "bfloat16":
        m = copy.deepcopy(model).to(torch.bfloat16)
    kwargs = {"safe_serialization": True}
    if variant["shard"]:
        kwargs["max_shard_size"] = variant["shard"]
    m.save_pretrained(str(out), **kwargs)
    if variant["layout"] != "saved":
        if variant["shard"]:
            raise NotImplementedError("renaming a sharded checkpoint")
        st = out / "model.safetensors"
        with safe_open(str(st), "pt") as sf:
            meta = sf.metadata()
            tensors = {llava_rename(k, variant["layout"]): sf.get_tensor(k) for k in sf.keys()}
        save_file(tensors, str(st), metadata=meta)


def save_llava_processor(processor, out: Path, files: str) -> None:
    if files == "v5":
        processor.save_pretrained(str(out))
        return
    with tempfile.TemporaryDirectory() as tmp:
        processor.tokenizer.save_pretrained(tmp)
        for f in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(Path(tmp) / f, out / f)
    processor.image_processor.save_pretrained(str(out))          # preprocessor_config.json
    write_json(out / "processor_config.json", {
        "image_token": IMAGE_TOKEN,
        "num_additional_image_tokens": processor.num_additional_image_tokens,
        "patch_size": processor.patch_size,
        "processor_class": "LlavaProcessor",
        "vision_feature_select_strategy": processor.vision_feature_select_strategy,
    })
    tok = {"lstrip": False, "normalized": False, "rstrip": False, "single_word": False}
    write_json(out / "special_tokens_map.json", {
        "bos_token": {"content": "<s>", **tok}, "eos_token": {"content": "</s>", **tok},
        "image_token": {"content": IMAGE_TOKEN, **tok}, "pad_token": {"content": PAD_TOKEN, **tok},
        "unk_token": {"content": "<unk>", **tok}})
    write_json(out / "chat_template.json", {"chat_template": LLAVA_CHAT_TEMPLATE})


def llava_inputs(processor, image_path: Path, prompt: str):
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": prompt}]}]
    rendered = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    expect = f"USER: {IMAGE_TOKEN}\n{prompt} ASSISTANT:"
    if rendered != expect:
        raise RuntimeError(f"chat template renders {rendered!r}, expected {expect!r}")
    with Image.open(image_path) as im:
        im.load()
        inputs = processor(images=im, text=rendered, return_tensors="pt")
    return rendered, inputs


def llava_greedy(model, inputs, eos_id: int):
    """16 greedy tokens with EOS stopping switched off, plus the raw logits of every step.

    logits_steps[k] are the logits that produced token k: row 0 is the prefill's last position,
    row k>0 comes after feeding tokens 0..k-1. Checked against a cache-free recomputation.
    """
    gc = T.GenerationConfig(do_sample=False, max_new_tokens=N_GREEDY, min_new_tokens=0,
                            eos_token_id=None, pad_token_id=model.config.text_config.pad_token_id,
                            bos_token_id=1, output_logits=True, return_dict_in_generate=True,
                            use_cache=True)
    # generate() fills every None field of `gc` from model.generation_config (eos 2 there), so
    # EOS stopping is switched off on the in-memory model for the call; the saved
    # generation_config.json keeps eos_token_id 2.
    saved_eos = model.generation_config.eos_token_id
    model.generation_config.eos_token_id = None
    try:
        with torch.no_grad():
            out = model.generate(**inputs, generation_config=gc)
    finally:
        model.generation_config.eos_token_id = saved_eos
    prompt_len = inputs["input_ids"].shape[1]
    tokens = out.sequences[0, prompt_len:].tolist()
    logits = torch.stack([l[0].float() for l in out.logits], dim=0)
    if len(tokens) != N_GREEDY:
        raise RuntimeError(f"generate stopped after {len(tokens)} tokens")

    # independent check: full forward over the growing sequence, no KV cache
    ids = inputs["input_ids"]
    for k in range(N_GREEDY):
        with torch.no_grad():
            o = model(input_ids=ids, pixel_values=inputs["pixel_values"], attention_mask=torch.ones_like(ids),
                      use_cache=False)
        row = o.logits[0, -1].float()
        if rel_err(row, logits[k]) > 1e-5:
            raise RuntimeError(f"step {k}: generate logits differ from cache-free forward")
        if int(row.argmax()) != tokens[k]:
            raise RuntimeError(f"step {k}: argmax differs between generate and cache-free forward")
        ids = torch.cat([ids, torch.tensor([[tokens[k]]])], dim=1)

    # margin between best and second-best logit, relative to the row's largest magnitude: a
    # port within TOL_REL must pick the same token when this is comfortably above 2*TOL_REL
    top2 = logits.topk(2, dim=-1).values
    margins = ((top2[:, 0] - top2[:, 1]) / logits.abs().amax(dim=-1)).tolist()
    stop = next((i for i, t in enumerate(tokens) if t == eos_id), None)
    return tokens, logits, margins, stop


# ---- independent re-implementations of the spec, used only as checks ------------------------

def _pil_bicubic(t: float) -> float:
    # Pillow's bicubic_filter (a = -0.5), in its evaluation order: the last bits of the
    # coefficients, and therefore the rounded pixels, depend on it.
    a = -0.5
    t = abs(t)
    if t < 1.0:
        return ((a + 2.0) * t - (a + 3.0)) * t * t + 1
    if t < 2.0:
        return (((t - 5) * t + 8) * t - 4) * a
    return 0.0


def _pil_resample_axis(img: np.ndarray, out_size: int, axis: int) -> np.ndarray:
    """One pass of Pillow's 8-bit separable resampler (libImaging/Resample.c), bicubic."""
    in_size = img.shape[axis]
    scale = in_size / out_size
    filterscale = max(scale, 1.0)
    support = 2.0 * filterscale
    ss = 1.0 / filterscale                       # Pillow multiplies by 1/fs, it does not divide
    out_shape = list(img.shape)
    out_shape[axis] = out_size
    out = np.empty(out_shape, dtype=np.uint8)
    src = np.moveaxis(img, axis, 0).astype(np.int64)
    dst = np.moveaxis(out, axis, 0)
    for xx in range(out_size):
        center = (xx + 0.5) * scale
        xmin = max(int(center - support + 0.5), 0)
        xmax = min(int(center + support + 0.5), in_size)
        w = [_pil_bicubic((x + xmin - center + 0.5) * ss) for x in range(xmax - xmin)]
        ww = sum(w)
        w = [wi / ww if ww != 0.0 else wi for wi in w]
        k = np.array([int(-0.5 + wi * (1 << 22)) if wi < 0 else int(0.5 + wi * (1 << 22)) for wi in w],
                     dtype=np.int64)
        acc = (1 << 21) + np.tensordot(k, src[xmin:xmax], axes=(0, 0))
        dst[xx] = np.clip(acc >> 22, 0, 255)      # clip8: >=255<<22 -> 255, <=0 -> 0
    return out


def _pil_vertical_first(w: int, h: int, ow: int, oh: int) -> bool:
    # Pillow 13.0.0 runs the vertical pass first when the height shrinks and
    # 2*ow + h > 2*w + oh (strict); otherwise horizontal first (what models.md §1.9 and older
    # Pillow, e.g. the 13.0.0.dev0 source, do). Found empirically and checked on thousands of
    # random sizes for BICUBIC and BILINEAR by check_pil_resize_port(). The intermediate image is
    # 8-bit and clipped, so the order changes pixels by up to ~20 levels on noisy images.
    return oh < h and 2 * ow + h > 2 * w + oh


def _pil_resize(rgb: np.ndarray, ow: int, oh: int) -> np.ndarray:
    h, w = rgb.shape[:2]
    x = rgb
    if _pil_vertical_first(w, h, ow, oh):
        x = _pil_resample_axis(x, oh, axis=0)
        return _pil_resample_axis(x, ow, axis=1) if ow != w else x
    if ow != w:
        x = _pil_resample_axis(x, ow, axis=1)
    if oh != h:
        x = _pil_resample_axis(x, oh, axis=0)
    return x


def check_pil_resize_port(n: int = 150, seed: int = 7) -> None:
    """The pixel fixtures are only portable if the C port of the resampler can be bit-exact;
    hold this Python port (which the C code follows) against the installed Pillow."""
    rng = np.random.default_rng(seed)
    for _ in range(n):
        w, h = (int(v) for v in rng.integers(2, 90, 2))
        ow, oh = (int(v) for v in rng.integers(1, 130, 2))
        img = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
        want = np.asarray(Image.fromarray(img).resize((ow, oh), Image.BICUBIC, reducing_gap=None))
        if not np.array_equal(_pil_resize(img, ow, oh), want):
            raise RuntimeError(f"PIL bicubic port differs from Pillow {Image.__version__} for "
                               f"{w}x{h} -> {ow}x{oh}")


def clip_resize_plan(w: int, h: int, edge: int) -> dict:
    """Sizes the CLIP processor uses for a w x h image (models.md §1.9): shortest side -> edge,
    other side int(edge * long / short) (truncation), then a centre crop edge x edge."""
    short, long = (h, w) if h <= w else (w, h)
    new_long = int(edge * long / short)
    nh, nw = (edge, new_long) if h <= w else (new_long, edge)
    order = "none" if (nw, nh) == (w, h) else \
        ("vertical_first" if _pil_vertical_first(w, h, nw, nh) and nw != w else
         "vertical_only" if nw == w else "horizontal_only" if nh == h else "horizontal_first")
    return {"resized_wh": [nw, nh], "crop_top_left": [(nh - edge) // 2, (nw - edge) // 2],
            "crop_hw": [edge, edge], "pil_pass_order": order}


def spec_clip_pixel_values(image_path: Path, edge: int) -> np.ndarray:
    """CLIPImageProcessor (PIL path) from models.md §1.9 / §2.5: shortest-edge bicubic resize
    on uint8, centre crop, x*(1/255) in float64 -> f32, (x - mean)/std in f32. -> [3, edge, edge]"""
    with Image.open(image_path) as im:
        rgb = np.asarray(im.convert("RGB"))      # [H, W, 3] uint8
    h, w = rgb.shape[:2]
    plan = clip_resize_plan(w, h, edge)
    nw, nh = plan["resized_wh"]
    x = _pil_resize(rgb, nw, nh)
    top, left = plan["crop_top_left"]
    x = x[top:top + edge, left:left + edge].transpose(2, 0, 1)
    x = (x.astype(np.float64) * (1 / 255)).astype(np.float32)
    mean = np.array(T.image_utils.OPENAI_CLIP_MEAN, dtype=np.float32)[:, None, None]
    std = np.array(T.image_utils.OPENAI_CLIP_STD, dtype=np.float32)[:, None, None]
    return (x - mean) / std


def _canon_llava_weights(ckpt: Path) -> dict:
    """Load every tensor of a checkpoint, as f32, under the canonical names of models.md §1.7."""
    files = [ckpt / "model.safetensors"]
    idx = ckpt / "model.safetensors.index.json"
    if idx.exists():
        files = sorted({ckpt / f for f in json.loads(idx.read_text())["weight_map"].values()})
    w = {}
    for f in files:
        with safe_open(str(f), "pt") as sf:
            for k in sf.keys():
                c = k
                if c.startswith("model.") and c.split(".")[1] in ("language_model", "vision_tower",
                                                                   "multi_modal_projector"):
                    c = c[len("model."):]
                if c.startswith("language_model.lm_head."):
                    c = c[len("language_model."):]
                if c.startswith("language_model.model."):
                    c = "language_model." + c[len("language_model.model."):]
                if c.startswith("vision_tower.vision_model."):
                    c = "vision_tower." + c[len("vision_tower.vision_model."):]
                w[c] = sf.get_tensor(k).float()
    return w


def spec_llava_forward(ckpt: Path, input_ids, pixel_values):
    """LLaVA-1.5 prefill written from models.md §1–§2 and config.json only (no transformers
    modules). Agreement with HF confirms the spec text the C port follows, including the
    §8 items about hidden_states indexing and RoPE layout."""
    F = torch.nn.functional
    cfg = json.loads((ckpt / "config.json").read_text())
    vc, tc = cfg["vision_config"], cfg["text_config"]
    w = _canon_llava_weights(ckpt)

    def ln(x, p, eps):
        return F.layer_norm(x, (x.shape[-1],), w[p + ".weight"], w[p + ".bias"], eps)

    def lin(x, p, bias=True):
        return F.linear(x, w[p + ".weight"], w.get(p + ".bias") if bias else None)

    # vision tower (§2.2)
    D, H, P = vc["hidden_size"], vc["num_attention_heads"], vc["patch_size"]
    eps_v = vc.get("layer_norm_eps", 1e-5)
    x = F.conv2d(pixel_values.float(), w["vision_tower.embeddings.patch_embedding.weight"], stride=P)
    x = x.flatten(2).transpose(1, 2)[0]                                   # [N, D] row-major
    x = torch.cat([w["vision_tower.embeddings.class_embedding"][None], x], 0)
    x = x + w["vision_tower.embeddings.position_embedding.weight"]
    x = ln(x, "vision_tower.pre_layrnorm", eps_v)
    hs = [x]
    hd = D // H
    for i in range(vc["num_hidden_layers"]):
        p = f"vision_tower.encoder.layers.{i}"
        h = ln(x, p + ".layer_norm1", eps_v)
        q = lin(h, p + ".self_attn.q_proj").view(-1, H, hd).transpose(0, 1)
        k = lin(h, p + ".self_attn.k_proj").view(-1, H, hd).transpose(0, 1)
        v = lin(h, p + ".self_attn.v_proj").view(-1, H, hd).transpose(0, 1)
        a = torch.softmax(q @ k.transpose(1, 2) * hd ** -0.5, dim=-1) @ v
        x = x + lin(a.transpose(0, 1).reshape(-1, D), p + ".self_attn.out_proj")
        h = ln(x, p + ".layer_norm2", eps_v)
        h = lin(h, p + ".mlp.fc1")
        h = h * torch.sigmoid(1.702 * h)                                  # quick_gelu
        x = x + lin(h, p + ".mlp.fc2")
        hs.append(x)
    sel = hs[cfg.get("vision_feature_layer", -2)]                          # python indexing (§1.5)
    if cfg.get("vision_feature_select_strategy", "default") == "default":
        sel = sel[1:]
    f = lin(sel, "multi_modal_projector.linear_1")
    f = F.gelu(f)                                                          # exact erf gelu
    feats = lin(f, "multi_modal_projector.linear_2")

    # merge (§2.3)
    ids = input_ids[0]
    e = w["language_model.embed_tokens.weight"][ids].clone()
    img_id = cfg.get("image_token_index", cfg.get("image_token_id"))
    e[ids == img_id] = feats

    # LLaMA decoder (§2.4)
    Dt, Hq = tc["hidden_size"], tc["num_attention_heads"]
    Hkv = tc.get("num_key_value_heads") or Hq
    hdt = tc.get("head_dim") or Dt // Hq
    theta = (tc.get("rope_parameters") or {}).get("rope_theta", tc.get("rope_theta", 10000.0))
    eps_t = tc.get("rms_norm_eps", 1e-6)
    S = e.shape[0]
    inv = 1.0 / (theta ** (torch.arange(0, hdt, 2, dtype=torch.int64).float() / hdt))
    ang = torch.arange(S).float()[:, None] * inv[None]
    emb = torch.cat([ang, ang], -1)
    cos, sin = emb.cos(), emb.sin()

    def rope(t):                                                           # t [heads, S, hd]
        t1, t2 = t[..., : hdt // 2], t[..., hdt // 2:]
        return t * cos + torch.cat([-t2, t1], -1) * sin

    def rms(x, p):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps_t) * w[p + ".weight"]

    mask = torch.full((S, S), float("-inf")).triu(1)
    # Mistral's sliding window (MistralConfig's default 4096 when the key is absent, none when
    # null): position i sees keys j with i - window < j <= i.
    window = tc.get("sliding_window", 4096) if tc.get("model_type") == "mistral" else None
    if window is not None:
        mask = mask + torch.full((S, S), float("-inf")).tril(-window)
    x = e
    for i in range(tc["num_hidden_layers"]):
        p = f"language_model.layers.{i}"
        h = rms(x, p + ".input_layernorm")
        q = rope(lin(h, p + ".self_attn.q_proj", False).view(S, Hq, hdt).transpose(0, 1))
        k = rope(lin(h, p + ".self_attn.k_proj", False).view(S, Hkv, hdt).transpose(0, 1))
        v = lin(h, p + ".self_attn.v_proj", False).view(S, Hkv, hdt).transpose(0, 1)
        k = k.repeat_interleave(Hq // Hkv, dim=0)                          # kv head g -> q heads g*n..
        v = v.repeat_interleave(Hq // Hkv, dim=0)
        a = torch.softmax(q @ k.transpose(1, 2) * hdt ** -0.5 + mask, dim=-1) @ v
        x = x + lin(a.transpose(0, 1).reshape(S, Hq * hdt), p + ".self_attn.o_proj", False)
        h = rms(x, p + ".post_attention_layernorm")
        g = lin(h, p + ".mlp.gate_proj", False)
        x = x + lin(F.silu(g) * lin(h, p + ".mlp.up_proj", False), p + ".mlp.down_proj", False)
    x = rms(x, "language_model.norm")
    head = w.get("lm_head.weight", w["language_model.embed_tokens.weight"])
    return sel, feats, x[-1] @ head.T


def make_llava(out_dir: Path, variant: str) -> dict:
    """Build one LLaVA-1.5 fixture directory; returns a summary for the README/report."""
    spec = LLAVA_VARIANTS[variant]
    base = LLAVA_BASES[spec["base"]]
    out = Path(out_dir) / spec["dir"]
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)

    tok = build_llama_tokenizer()
    hf_tok = wrap_hf_tokenizer(tok)
    processor = llava_processor(base, hf_tok)
    model, n_img = build_llava_model(base)

    save_llava_checkpoint(model, out, spec)
    save_llava_processor(processor, out, spec["files"])
    keys = safetensors_keys(out)
    write_json(out / "keys.json", keys)

    # The reference is what transformers computes from the files on disk (so a bf16 fixture is
    # f32 math on bf16-rounded weights, and a renamed layout is proven loadable by HF itself).
    ref = T.LlavaForConditionalGeneration.from_pretrained(str(out), attn_implementation="eager",
                                                          dtype=torch.float32).eval()
    sd_mem, sd_ref = model.state_dict(), ref.state_dict()
    assert sd_mem.keys() == sd_ref.keys()
    for k in sd_mem:
        want = sd_mem[k].to(torch.bfloat16).float() if spec["dtype"] == "bfloat16" else sd_mem[k]
        if not torch.equal(want, sd_ref[k]):
            raise RuntimeError(f"{k} did not round-trip through {out}")

    # The processor must load back from the directory and tokenize like the raw tokenizer.json
    # (the C tokenizer reads only tokenizer.json).
    from tokenizers import Tokenizer
    raw = Tokenizer.from_file(str(out / "tokenizer.json"))
    # v5 image processors choose a backend at load time (the saved config drops the "Pil"
    # suffix); ask for PIL explicitly, the torchvision path is not bit-exact (models.md §1.9).
    reloaded = T.AutoProcessor.from_pretrained(str(out), backend="pil")
    if not type(reloaded.image_processor).__name__.endswith("Pil"):
        raise RuntimeError(f"reloaded image processor is {type(reloaded.image_processor).__name__}")

    # A sliding-window text model is also run with full attention (the same files, the window
    # switched off in the config): the fixture must only be accepted if that changes what
    # transformers computes, or it would not hold a port to the window at all.
    window = getattr(ref.config.text_config, "sliding_window", None)
    ref_full = None
    if window is not None:
        cfg_full = T.AutoConfig.from_pretrained(str(out))
        cfg_full.text_config.sliding_window = None
        ref_full = T.LlavaForConditionalGeneration.from_pretrained(
            str(out), config=cfg_full, attn_implementation="eager", dtype=torch.float32).eval()
        # transformers' own mask for the windowed model: position i sees p - window < j <= i
        from transformers.masking_utils import sliding_window_causal_mask_function
        f = sliding_window_causal_mask_function(window)
        for i in range(3 * window):
            seen = [j for j in range(3 * window) if bool(f(*(torch.tensor(x) for x in (0, 0, i, j))))]
            if seen != list(range(max(0, i - window + 1), i + 1)):
                raise RuntimeError(f"sliding window mask of query {i}: {seen}")

    images = ensure_llava_images()
    cases, tensors = [], {}
    spec_err = {"vision_hidden": 0.0, "image_features": 0.0, "logits_last": 0.0}
    eos = 2
    for img in images:
        with Image.open(img) as im:
            img_w, img_h = im.size
        for prompt in LLAVA_PROMPTS:
            i = len(cases)
            rendered, inputs = llava_inputs(processor, img, prompt)
            ids = inputs["input_ids"][0].tolist()
            if raw.encode(rendered.replace(IMAGE_TOKEN, IMAGE_TOKEN * n_img)).ids != ids:
                raise RuntimeError("tokenizer.json and the HF processor disagree")
            _, inputs2 = llava_inputs(reloaded, img, prompt)
            if inputs2["input_ids"].tolist() != inputs["input_ids"].tolist() or \
                    not torch.equal(inputs2["pixel_values"], inputs["pixel_values"]):
                raise RuntimeError("processor saved in the fixture does not reproduce the inputs")
            if ids.count(LLAMA_TRAINED_VOCAB) != n_img:
                raise RuntimeError("image token count")

            pv = inputs["pixel_values"]
            if not np.array_equal(spec_clip_pixel_values(img, base["crop"]), pv[0].numpy()):
                raise RuntimeError(f"{img.name}: spec port of the PIL preprocessing is not bit-exact")
            with torch.no_grad():
                vt = ref.model.vision_tower(pv, output_hidden_states=True)
                vhid = vt.hidden_states[base["vision_feature_layer"]][0]
                feats = ref.model.get_image_features(
                    pixel_values=pv, vision_feature_layer=base["vision_feature_layer"],
                    vision_feature_select_strategy=base["strategy"]).pooler_output
                feats = torch.cat(list(feats), 0).reshape(-1, feats[0].shape[-1])
                # §8.3: hidden_states[layer] (minus CLS for "default") -> projector == features
                sel = vhid[1:] if base["strategy"] == "default" else vhid
                if rel_err(ref.model.multi_modal_projector(sel[None])[0], feats) > 1e-6:
                    raise RuntimeError("hidden_states[vision_feature_layer] is not what the projector saw")
                fw = ref(**inputs, use_cache=False)
            logits_last = fw.logits[0, -1].float()
            tokens, steps, margins, stop = llava_greedy(ref, inputs, eos)
            if rel_err(steps[0], logits_last) > 1e-5:
                raise RuntimeError("logits_steps[0] != prefill logits")
            full = None
            if ref_full is not None:
                if len(ids) + N_GREEDY <= 2 * window:
                    raise RuntimeError(f"case {i}: {len(ids)} + {N_GREEDY} positions do not pass "
                                       f"the window of {window} well")
                f_tokens, f_steps, f_margins, _ = llava_greedy(ref_full, inputs, eos)
                full = {"greedy_tokens": f_tokens, "min_top1_margin_rel": min(f_margins),
                        "logits_max_rel_diff": max(rel_err(steps[k], f_steps[k])
                                                   for k in range(N_GREEDY)),
                        "logits_last_rel_diff": rel_err(steps[0], f_steps[0])}
                # the prefill's last row already sees less than the prompt
                if full["logits_last_rel_diff"] < 100 * TOL_REL:
                    raise RuntimeError(f"case {i}: full attention changes the prefill logits by "
                                       f"only {full['logits_last_rel_diff']:.3g}")

            s_sel, s_feats, s_logits = spec_llava_forward(out, inputs["input_ids"], pv)
            spec_err["vision_hidden"] = max(spec_err["vision_hidden"], rel_err(s_sel, sel))
            spec_err["image_features"] = max(spec_err["image_features"], rel_err(s_feats, feats))
            spec_err["logits_last"] = max(spec_err["logits_last"], rel_err(s_logits, logits_last))

            tensors[f"case{i}.pixel_values"] = pv.float().contiguous()
            tensors[f"case{i}.vision_hidden"] = vhid.float().contiguous()
            tensors[f"case{i}.image_features"] = feats.float().contiguous()
            tensors[f"case{i}.logits_last"] = logits_last.contiguous()
            tensors[f"case{i}.logits_steps"] = steps.contiguous()
            cases.append({
                "name": f"case{i}",
                "image": str(img.relative_to(REPO_ROOT)),
                "image_size_wh": [img_w, img_h],
                "image_sha256": file_sha256(img),
                "preprocess": clip_resize_plan(img_w, img_h, base["crop"]),
                "prompt": prompt,
                "rendered_prompt": rendered,
                "input_ids": ids,
                "num_image_tokens": n_img,
                "image_token_span": [ids.index(LLAMA_TRAINED_VOCAB), ids.index(LLAMA_TRAINED_VOCAB) + n_img],
                "greedy_tokens": tokens,
                "greedy_text": hf_tok.decode(tokens, skip_special_tokens=False),
                "greedy_text_skip_special": hf_tok.decode(tokens, skip_special_tokens=True),
                "greedy_pieces": [raw.id_to_token(t) for t in tokens],
                "natural_eos_index": stop,
                "min_top1_margin_rel": min(margins),
            })
            if full is not None:
                cases[-1]["full_attention"] = full
    if max(spec_err.values()) > 1e-5:
        raise RuntimeError(f"spec re-implementation disagrees with transformers: {spec_err}")
    n_other = sum(c["full_attention"]["greedy_tokens"] != c["greedy_tokens"]
                  for c in cases if "full_attention" in c)
    if ref_full is not None and n_other < len(cases) // 2:
        raise RuntimeError(f"full attention changes the greedy tokens of only {n_other} of "
                           f"{len(cases)} cases")
    save_file(tensors, str(out / "expected.safetensors"), metadata={"format": "pt"})

    vis = base["vision"]
    summary = {
        "fixture": spec["dir"],
        "variant": variant,
        "made_by": f"python3 tools/make_fixtures.py llava --out {os.path.relpath(out_dir, REPO_ROOT)}",
        "versions": versions(),
        "checkpoint_dtype": spec["dtype"],
        "reference_math": ("float32 on the bf16-rounded weights (bf16 tensors upcast exactly to f32)"
                           if spec["dtype"] == "bfloat16" else "float32"),
        "attn_implementation": "eager",
        "weight_layout": {"saved": "as written by save_pretrained of this transformers version: "
                                   "language_model.model.*, language_model.lm_head.weight, "
                                   "multi_modal_projector.*, vision_tower.* (no vision_model.)",
                          "legacy": "llava-hf hub layout: language_model.model.*, language_model.lm_head.weight, "
                                    "multi_modal_projector.*, vision_tower.vision_model.*",
                          "new": "transformers v5 in-memory names: model.language_model.*, lm_head.weight, "
                                 "model.multi_modal_projector.*, model.vision_tower.* (no vision_model.)"}[spec["layout"]],
        "sharded": bool(spec["shard"]),
        "tolerance": {"rule": "max|c - ref| <= rel * max|ref|, per tensor", "rel": TOL_REL,
                      "applies_to": ["image_features", "vision_hidden", "logits_last", "logits_steps"],
                      "pixel_values": "bit-exact: a faithful port of Pillow's 8-bit resampler, incl. the "
                                      "pass order of _pil_vertical_first, reproduces them exactly",
                      "greedy_tokens": "identical"},
        "greedy": {"do_sample": False, "max_new_tokens": N_GREEDY, "eos_stopping": "disabled; "
                   "natural_eos_index gives the first index where the token is eos (2), null if none",
                   "logits_steps": "row k = logits that chose greedy_tokens[k]; row 0 == logits_last"},
        "special_tokens": {"<unk>": 0, "<s>": 1, "</s>": 2, IMAGE_TOKEN: LLAMA_TRAINED_VOCAB,
                           PAD_TOKEN: LLAMA_TRAINED_VOCAB + 1, "bos_id": 1, "eos_id": eos,
                           "tokenizer_size": LLAMA_TRAINED_VOCAB + 2,
                           "model_vocab_size": base["text"]["vocab_size"]},
        "image_preprocessing": {"class": "CLIPImageProcessorPil", "resize_shortest_edge": base["crop"],
                                "resample": "PIL BICUBIC (3)", "center_crop": [base["crop"], base["crop"]],
                                "rescale_factor": 1 / 255, "mean": list(T.image_utils.OPENAI_CLIP_MEAN),
                                "std": list(T.image_utils.OPENAI_CLIP_STD), "do_convert_rgb": True},
        "vision_feature_layer": base["vision_feature_layer"],
        "vision_feature_select_strategy": base["strategy"],
        "num_image_tokens": n_img,
        "num_vision_positions": (vis["image_size"] // vis["patch_size"]) ** 2 + 1,
        "tensors": {
            "caseN.pixel_values": "[1,3,H,W] f32, processor output (PIL path)",
            "caseN.vision_hidden": "[n_patches+1, vision_hidden] hidden_states[vision_feature_layer], CLS at row 0",
            "caseN.image_features": "[num_image_tokens, text_hidden] projector output",
            "caseN.logits_last": "[vocab] prefill logits at the last position",
            "caseN.logits_steps": f"[{N_GREEDY}, vocab] logits of each greedy step",
        },
        "checks_passed": {
            "spec_reimplementation_max_rel_err": spec_err,
            **({"sliding_window_exercised": {
                "sliding_window": window,
                "rule": "transformers' sliding-window causal mask: position i sees keys j with "
                        "i - sliding_window < j <= i (checked against masking_utils); the same "
                        "files with sliding_window null (full attention) choose other greedy "
                        "tokens in the cases counted here, and every case's prefill logits "
                        "differ by more than 100x the tolerance (cases[].full_attention)",
                "cases_with_other_greedy_tokens": n_other,
                "min_prefill_logits_rel_diff": min(c["full_attention"]["logits_last_rel_diff"]
                                                   for c in cases)}} if ref_full is not None else {}),
            "pixel_values_bit_exact_vs_spec_port_of_pil_bicubic": True,
            "tokenizer_json_equals_hf_ids": True,
            "processor_reload_equal": True,
            "weights_roundtrip_exact": True,
        },
        "cases": cases,
    }
    write_json(out / "expected.json", summary)
    write_json(out / "versions.json", summary["versions"])     # models.md §0 asks for it by this name
    for f in out.iterdir():
        f.chmod(0o644)                       # safetensors writes 0600; keep the tree uniform
    return summary


# --------------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------------

def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("family", choices=["llava", "llava_next", "fuyu", "qwen2_vl"], help="model family to build")
    ap.add_argument("--out", default="tests/fixtures", help="fixtures root (default tests/fixtures)")
    ap.add_argument("--variant", action="append", help="only these variants (default: all)")
    args = ap.parse_args(argv)
    _import_stack()
    out = Path(args.out)
    if not out.is_absolute():
        out = (Path.cwd() / out).resolve()
    if args.family == "llava":
        check_pil_resize_port()
        for v in args.variant or list(LLAVA_VARIANTS):
            s = make_llava(out, v)
            print(f"{s['fixture']}: {dir_size(out / s['fixture'])} bytes")
            for c in s["cases"]:
                print(f"  {c['name']} {Path(c['image']).name} {c['prompt']!r}: {c['greedy_tokens']} "
                      f"margin {c['min_top1_margin_rel']:.3g} eos@{c['natural_eos_index']}")
    if args.family == "llava_next":
        from fixtures_llava_next import NEXT_VARIANTS, make_llava_next
        for v in args.variant or list(NEXT_VARIANTS):
            s = make_llava_next(out, v)
            print(f"{s['fixture']}: {dir_size(out / s['fixture'])} bytes")
            for c in s["cases"]:
                print(f"  {c['name']} {Path(c['image']).name} {c['num_image_tokens']} img tokens: "
                      f"{c['greedy_tokens']} margin {c['min_top1_margin_rel']:.3g}")
    if args.family == "fuyu":
        from fixtures_fuyu import FUYU_VARIANTS, make_fuyu
        for v in args.variant or list(FUYU_VARIANTS):
            s = make_fuyu(out, v)
            print(f"{s['fixture']}: {dir_size(out / s['fixture'])} bytes")
            for c in s["cases"]:
                print(f"  {c['name']} {c['num_image_tokens']} img tokens: {c['greedy_tokens']} "
                      f"margin {c['min_top1_margin_rel']:.3g} eos@{c['natural_eos_index']}")
    if args.family == "qwen2_vl":
        from fixtures_qwen2vl import QWEN_VARIANTS, make_qwen2vl
        for v in args.variant or list(QWEN_VARIANTS):
            s = make_qwen2vl(out, v)
            print(f"{s['fixture']}: {dir_size(out / s['fixture'])} bytes")
            for c in s["cases"]:
                print(f"  {c['name']} {c['image_grid_thw']} {c['num_image_tokens']} img tokens: "
                      f"{c['greedy_tokens']} margin {c['min_top1_margin_rel']:.3g} eos@{c['natural_eos_index']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
