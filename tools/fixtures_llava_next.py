"""LLaVA-NeXT (1.6) golden fixtures: tiny LlavaNextForConditionalGeneration references.

Called from tools/make_fixtures.py (`python3 tools/make_fixtures.py llava_next --out
tests/fixtures`); reuses its tokenizer recipe, test images and greedy helper so the fixtures
have the same format as llava-tiny (expected.json + expected.safetensors). models.md §3, §6.2.

caseN.pixel_values is the processor's [n_patches, 3, S, S] (base image first, then the tiles in
row-major order); caseN.image_features is what pack_image_features returns for the image (base
features, then the unpadded grid with an image_newline column), i.e. the rows that replace the
<image> tokens.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import make_fixtures as mf

# The test images (tests/fixtures/llava-images) are 80x60, 45x90, 64x64 and 36x100; with these
# pinpoints they select different grids (landscape 1x2, portrait 2x1, square 2x2), and the
# unpad step trims rows for one and columns for another.
NEXT_VARIANTS = {
    "tiny": dict(dir="llava-next-tiny", seed=41,
                 vision=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
                             image_size=28, patch_size=7, projection_dim=32, hidden_act="quick_gelu",
                             layer_norm_eps=1e-5),
                 text=dict(vocab_size=392, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                           rms_norm_eps=1e-5, rope_theta=5000.0),
                 pinpoints=[[28, 56], [56, 28], [56, 56]], vision_feature_layer=-2, strategy="default"),
    # Other tile size (30, patch 10), 1x3 / 3x1 grid options, the last layer, MHA and other
    # widths. ("full" cannot be used: pack_image_features views each tile as (h, w) patches
    # without the CLS row and fails.)

    "alt": dict(dir="llava-next-tiny-alt", seed=7,
                vision=dict(hidden_size=48, intermediate_size=96, num_hidden_layers=2, num_attention_heads=3,
                            image_size=30, patch_size=10, projection_dim=48, hidden_act="quick_gelu",
                            layer_norm_eps=1e-6),
                text=dict(vocab_size=mf.LLAMA_TRAINED_VOCAB + 2, hidden_size=48, intermediate_size=96,
                          num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
                          max_position_embeddings=512, rms_norm_eps=1e-6, rope_theta=20000.0),
                pinpoints=[[30, 60], [60, 30], [30, 90], [90, 30], [60, 60]], vision_feature_layer=-1,
                strategy="default"),
}

# One more, wide, image so that the 1x2 grid (and a 1x3 one in "alt") is chosen too; kept in
# its own directory so the LLaVA-1.5 image set stays as it is.
NEXT_IMAGES = [("grad_100x40.png", 100, 40)]
NEXT_IMAGE_DIR = "tests/fixtures/llava-next-images"

PROMPTS = ["What is shown in this image?", "Is there a café? Answer: yes or no!"]


def _build(v: dict):
    T, torch = mf.T, mf.torch
    mf.set_determinism(v["seed"])
    vc = T.CLIPVisionConfig(**v["vision"])
    tc = T.LlamaConfig(**v["text"], bos_token_id=1, eos_token_id=2, pad_token_id=mf.LLAMA_TRAINED_VOCAB + 1,
                       tie_word_embeddings=False)
    cfg = T.LlavaNextConfig(vision_config=vc, text_config=tc, image_token_index=mf.LLAMA_TRAINED_VOCAB,
                            projector_hidden_act="gelu", vision_feature_layer=v["vision_feature_layer"],
                            vision_feature_select_strategy=v["strategy"], image_grid_pinpoints=v["pinpoints"],
                            pad_token_id=mf.LLAMA_TRAINED_VOCAB + 1)
    model = T.LlavaNextForConditionalGeneration._from_config(cfg, attn_implementation="eager",
                                                             dtype=torch.float32)
    mf.perturb(model, mf.PERTURB_SCALE, seed=v["seed"] + 1)
    return model.eval()


def _processor(v: dict, hf_tok):
    T = mf.T
    s = v["vision"]["image_size"]
    ip = T.LlavaNextImageProcessorPil(size={"shortest_edge": s}, crop_size={"height": s, "width": s},
                                      resample=3, image_grid_pinpoints=v["pinpoints"], do_pad=True)
    return T.LlavaNextProcessor(image_processor=ip, tokenizer=hf_tok, patch_size=v["vision"]["patch_size"],
                                vision_feature_select_strategy=v["strategy"], num_additional_image_tokens=1,
                                image_token=mf.IMAGE_TOKEN, chat_template=mf.LLAVA_CHAT_TEMPLATE)


def _greedy(model, inputs):
    """16 greedy tokens (EOS stopping off) and the logits of every step, by full cache-free
    forwards over the growing sequence (llava_greedy's check path, with image_sizes)."""
    torch = mf.torch
    ids = inputs["input_ids"]
    tokens, rows = [], []
    for _ in range(mf.N_GREEDY):
        with torch.no_grad():
            o = model(input_ids=ids, pixel_values=inputs["pixel_values"], image_sizes=inputs["image_sizes"],
                      attention_mask=torch.ones_like(ids), use_cache=False)
        row = o.logits[0, -1].float()
        rows.append(row)
        tokens.append(int(row.argmax()))
        ids = torch.cat([ids, torch.tensor([[tokens[-1]]])], dim=1)
    logits = torch.stack(rows, 0)
    top2 = logits.topk(2, dim=-1).values
    margins = ((top2[:, 0] - top2[:, 1]) / logits.abs().amax(dim=-1)).tolist()
    stop = next((i for i, t in enumerate(tokens) if t == 2), None)
    return tokens, logits, margins, stop


def make_llava_next(out_dir: Path, variant: str) -> dict:
    mf._import_stack()   # this module sees make_fixtures as an import, not as __main__
    T, torch = mf.T, mf.torch
    v = NEXT_VARIANTS[variant]
    out = Path(out_dir) / v["dir"]
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    tok = mf.build_llama_tokenizer()
    hf_tok = mf.wrap_hf_tokenizer(tok)
    processor = _processor(v, hf_tok)
    model = _build(v)
    model.save_pretrained(str(out), safe_serialization=True)
    processor.save_pretrained(str(out))
    mf.write_json(out / "keys.json", mf.safetensors_keys(out))
    ref = T.LlavaNextForConditionalGeneration.from_pretrained(str(out), attn_implementation="eager",
                                                              dtype=torch.float32).eval()
    from tokenizers import Tokenizer
    raw = Tokenizer.from_file(str(out / "tokenizer.json"))
    reloaded = T.AutoProcessor.from_pretrained(str(out), backend="pil")
    if not type(reloaded.image_processor).__name__.endswith("Pil"):
        raise RuntimeError(f"reloaded image processor is {type(reloaded.image_processor).__name__}")

    images = list(mf.ensure_llava_images())
    d = mf.REPO_ROOT / NEXT_IMAGE_DIR
    d.mkdir(parents=True, exist_ok=True)
    for i, (name, w, h) in enumerate(NEXT_IMAGES):
        mf.make_gradient_image(d / name, w, h, seed=2000 + i)
        images.append(d / name)
    cases, tensors = [], {}
    img_id = mf.LLAMA_TRAINED_VOCAB
    for img in images:
        with mf.Image.open(img) as im:
            img_w, img_h = im.size
        for prompt in PROMPTS:
            i = len(cases)
            rendered, inputs = mf.llava_inputs(processor, img, prompt)
            _, inputs2 = mf.llava_inputs(reloaded, img, prompt)
            if inputs2["input_ids"].tolist() != inputs["input_ids"].tolist() or \
                    not torch.equal(inputs2["pixel_values"], inputs["pixel_values"]):
                raise RuntimeError("processor saved in the fixture does not reproduce the inputs")
            ids = inputs["input_ids"][0].tolist()
            n_img = ids.count(img_id)
            if raw.encode(rendered.replace(mf.IMAGE_TOKEN, mf.IMAGE_TOKEN * n_img)).ids != ids:
                raise RuntimeError("tokenizer.json and the HF processor disagree")
            pv = inputs["pixel_values"]
            sizes = inputs["image_sizes"]
            with torch.no_grad():
                feats = ref.model.get_image_features(pixel_values=pv, image_sizes=sizes,
                                                     vision_feature_layer=v["vision_feature_layer"],
                                                     vision_feature_select_strategy=v["strategy"])
                feats = getattr(feats, "pooler_output", feats)
                feats = torch.cat(list(feats), 0)
            if feats.shape[0] != n_img:
                raise RuntimeError(f"{n_img} image tokens but {feats.shape[0]} features")
            tokens, steps, margins, stop = _greedy(ref, inputs)
            tensors[f"case{i}.pixel_values"] = pv[0].float().contiguous()
            tensors[f"case{i}.image_features"] = feats.float().contiguous()
            tensors[f"case{i}.logits_steps"] = steps.contiguous()
            cases.append({
                "name": f"case{i}",
                "image": str(img.relative_to(mf.REPO_ROOT)),
                "image_size_wh": [img_w, img_h],
                "prompt": prompt,
                "rendered_prompt": rendered,
                "n_patches": int(pv.shape[1]),
                "input_ids": ids,
                "num_image_tokens": n_img,
                "greedy_tokens": tokens,
                "greedy_text": hf_tok.decode(tokens, skip_special_tokens=True),
                "natural_eos_index": stop,
                "min_top1_margin_rel": min(margins),
            })
    mf.save_file(tensors, str(out / "expected.safetensors"), metadata={"format": "pt"})
    summary = {
        "fixture": v["dir"], "variant": variant,
        "made_by": f"python3 tools/make_fixtures.py llava_next --out {os.path.relpath(out_dir, mf.REPO_ROOT)}",
        "versions": mf.versions(),
        "attn_implementation": "eager",
        "image_grid_pinpoints": v["pinpoints"],
        "vision_feature_layer": v["vision_feature_layer"],
        "vision_feature_select_strategy": v["strategy"],
        "tolerance": {"rule": "max|c - ref| <= rel * max|ref|, per tensor", "rel": mf.TOL_REL,
                      "greedy_tokens": "identical"},
        "tensors": {
            "caseN.pixel_values": "[n_patches,3,S,S] f32: base image, then tiles row-major (PIL path)",
            "caseN.image_features": "[num_image_tokens, text_hidden] packed: base, unpadded grid + newline column",
            "caseN.logits_steps": f"[{mf.N_GREEDY}, vocab] logits of each greedy step",
        },
        "cases": cases,
    }
    mf.write_json(out / "expected.json", summary)
    mf.write_json(out / "versions.json", summary["versions"])
    for f in out.iterdir():
        f.chmod(0o644)
    return summary
