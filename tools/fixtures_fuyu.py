"""Fuyu-8B golden fixtures (models.md §5, §6.2, §7.4), driven by tools/make_fixtures.py:

    python3 tools/make_fixtures.py fuyu --out tests/fixtures

make_fuyu(out_dir, variant) builds a tiny FuyuForCausalLM (Persimmon decoder) with perturbed
weights, a SentencePiece-Unigram tokenizer.json with byte fallback and Fuyu's special pieces,
and references from transformers (eager attention, float32, CPU):

* pixels: FuyuImageProcessorPil (resize-to-fit with PIL bilinear, pad with 1 on the uint8
  image, rescale, normalize) at a small target size so the test images are actually resized;
* patches: crop to whole patches, patchify (ph, pw, c) in row order — checked against the
  processor's own preprocess_with_tokenizer_info;
* input ids: [image rows of |SPEAKER|… |NEWLINE|] <s> prompt <0x04>, built by hand as §6.2
  advises (the processor's input_ids[1] quirk needs a tokenizer laid out like the real one);
* the projected patch embeddings, the prefill logits and 16 greedy steps (EOS stopping off).
"""

from __future__ import annotations

import math
import shutil
from pathlib import Path


import make_fixtures as MF

FUYU_CORPUS = [
    "Generate a coco-style caption.",
    "What is shown in this image? The image shows a small picture.",
    "Describe the colors in two words. Red and green, blue and gray.",
    "Is there a cat? Answer yes or no. No, there is no cat in the image.",
    "The picture has a gradient from dark to light with some noise on top of it.",
    "one two three four five six seven eight nine ten, a an the of in on at to is are",
]
FUYU_SPECIAL_PIECES = ["|ENDOFTEXT|", "|SPEAKER|", "|NEWLINE|"]

FUYU_VARIANTS = {
    # §6.2 sizes; patch 10 instead of 30 keeps vision_embed_tokens small; the processor's
    # target (height 60, width 90) is small enough that some test images are downscaled.
    "tiny": dict(dir="fuyu-tiny", hidden=32, intermediate=64, layers=2, heads=4, prf=0.5,
                 theta=25000.0, patch=10, target=(60, 90), seed=1234),
    # other head size, a 3/4 rotary fraction, three layers, 15-px patches, a target that crops
    # partial edge patches (pad pixels inside patches).
    "alt": dict(dir="fuyu-tiny-alt", hidden=48, intermediate=80, layers=3, heads=3, prf=0.75,
                theta=10000.0, patch=15, target=(45, 90), seed=4321),
}

FUYU_CASES = [
    ("grad_80x60.png", "Generate a coco-style caption.\n"),
    ("grad_45x90.png", "What is shown in this image?\n"),
    ("grad_64x64.png", "Describe the colors \u00e9 in two words.\n"),
    ("grad_36x100.png", "Is there a cat?\n"),
]


def _learned_pieces(n_pieces: int = 110) -> list[tuple[str, float]]:
    """Deterministic stand-in for SentencePiece training (tokenizers' UnigramTrainer is not
    reproducible run to run): every character of the normalized corpus, then the substrings of
    2..8 characters that do not span a word start in their middle, ranked by count·length with
    ties broken by the string; score = log(count / total), rounded so the JSON is stable."""
    from collections import Counter
    words = []
    for line in FUYU_CORPUS:
        norm = "\u2581" + line.replace(" ", "\u2581")
        # split before each ▁ so pieces look like SentencePiece's (▁ only at the start)
        cur = ""
        for ch in norm:
            if ch == "\u2581" and cur:
                words.append(cur)
                cur = ""
            cur += ch
        if cur:
            words.append(cur)
    counts = Counter()
    for w in words:
        for i in range(len(w)):
            for j in range(i + 1, min(len(w), i + 8) + 1):
                counts[w[i:j]] += 1
    total = sum(counts.values())
    chars = sorted({p for p in counts if len(p) == 1})
    multi = sorted((p for p in counts if len(p) > 1 and counts[p] > 1),
                   key=lambda p: (-counts[p] * len(p), p))[: n_pieces - len(chars)]
    return [(p, round(math.log(counts[p] / total), 6)) for p in chars + multi]


def build_fuyu_tokenizer():
    """Unigram + byte fallback, pieces: <unk>=0, <s>=1, <0x00>..<0xFF>, |ENDOFTEXT|, |SPEAKER|,
    |NEWLINE| (ordinary pieces, as in the real file), then ▁ and learned pieces."""
    from tokenizers import Tokenizer, decoders, models, normalizers, processors
    vocab = [("<unk>", 0.0), ("<s>", 0.0)]
    vocab += [(f"<0x{b:02X}>", 0.0) for b in range(256)]
    vocab += [(p, -2.0) for p in FUYU_SPECIAL_PIECES]
    seen = {p for p, _ in vocab}
    for piece, score in _learned_pieces():
        if piece not in seen:
            vocab.append((piece, float(score)))
            seen.add(piece)
    assert "\u2581" in seen
    tok = Tokenizer(models.Unigram(vocab, unk_id=0, byte_fallback=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
    tok.pre_tokenizer = None
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    eot = vocab.index(("|ENDOFTEXT|", -2.0))
    tok.post_processor = processors.TemplateProcessing(single="|ENDOFTEXT|:0 $A:0",
                                                       special_tokens=[("|ENDOFTEXT|", eot)])
    return tok


def _image_processor(spec):
    th, tw = spec["target"]
    p = spec["patch"]
    return MF.T.FuyuImageProcessorPil(size={"height": th, "width": tw},
                                      patch_size={"height": p, "width": p})


def make_fuyu(out_dir: Path, variant: str) -> dict:
    MF._import_stack()   # this module sees make_fixtures as an import, not as __main__
    torch, T = MF.torch, MF.T
    spec = FUYU_VARIANTS[variant]
    MF.set_determinism(spec["seed"])
    out = out_dir / spec["dir"]
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)

    tok = build_fuyu_tokenizer()
    hf_tok = T.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="|ENDOFTEXT|", eos_token="|ENDOFTEXT|",
                                       unk_token="<unk>", pad_token="|ENDOFTEXT|")
    hf_tok.save_pretrained(out)
    ids = {k: tok.token_to_id(k) for k in ["<unk>", "<s>", "<0x04>"] + FUYU_SPECIAL_PIECES}
    n_tok = tok.get_vocab_size()
    V = n_tok + 5                       # model vocab larger than the tokenizer's, as on the hub
    eos = ids["|ENDOFTEXT|"]
    text = dict(model_type="persimmon", vocab_size=V, hidden_size=spec["hidden"],
                intermediate_size=spec["intermediate"], num_hidden_layers=spec["layers"],
                num_attention_heads=spec["heads"], hidden_act="relu2", layer_norm_eps=1e-5,
                max_position_embeddings=512, qk_layernorm=True,
                rope_parameters={"rope_type": "default", "rope_theta": spec["theta"],
                                 "partial_rotary_factor": spec["prf"]},
                bos_token_id=ids["<s>"], eos_token_id=eos, pad_token_id=eos, tie_word_embeddings=False)
    cfg = T.FuyuConfig(text_config=text, patch_size=spec["patch"], num_channels=3,
                       image_size=spec["target"][0], image_token_id=ids["|SPEAKER|"],
                       bos_token_id=ids["<s>"], eos_token_id=eos, pad_token_id=eos,
                       tie_word_embeddings=False)
    cfg._attn_implementation = "eager"
    model = T.FuyuForCausalLM(cfg)
    MF.perturb(model, 0.5, spec["seed"] + 1)
    model.eval()
    model.save_pretrained(out)
    ip = _image_processor(spec)
    ip.save_pretrained(out)
    keys = MF.safetensors_keys(out)
    MF.write_json(out / "keys.json", keys)

    P = spec["patch"]
    tensors, cases = {}, []
    for ci, (img_name, prompt) in enumerate(FUYU_CASES):
        img_path = MF.REPO_ROOT / MF.LLAVA_IMAGE_DIR / img_name
        pil = MF.Image.open(img_path).convert("RGB")
        W, H = pil.size
        r = ip(images=[pil], return_tensors="pt")
        img = r["images"][0][0].float()                      # [3, th, tw] padded, normalized
        uh = int(r["image_unpadded_heights"][0][0])
        uw = int(r["image_unpadded_widths"][0][0])
        th, tw = spec["target"]
        ch = min(th, math.ceil(uh / P) * P)
        cw = min(tw, math.ceil(uw / P) * P)
        crop = img[:, :ch, :cw]
        nr, nc = ch // P, cw // P
        patches = crop.reshape(3, nr, P, nc, P).permute(1, 3, 2, 4, 0).reshape(nr * nc, P * P * 3).contiguous()
        # cross-check with the processor's own patch path
        chk = ip.preprocess_with_tokenizer_info(
            image_input=img[None, None], image_present=torch.ones(1, 1, 1),
            image_unpadded_h=torch.tensor([[uh]]), image_unpadded_w=torch.tensor([[uw]]),
            image_placeholder_id=ids["|SPEAKER|"], image_newline_id=ids["|NEWLINE|"], variable_sized=True)
        ref_patches = chk["image_patches"][0][0]
        assert torch.equal(torch.as_tensor(ref_patches).float(), patches), "patchify mismatch"
        image_ids = []
        for _ in range(nr):
            image_ids += [ids["|SPEAKER|"]] * nc + [ids["|NEWLINE|"]]
        assert image_ids == [int(x) for x in chk["image_input_ids"][0][0]], "image ids mismatch"
        prompt_ids = hf_tok(prompt, add_special_tokens=False).input_ids
        input_ids = image_ids + [ids["<s>"]] + prompt_ids + [ids["<0x04>"]]
        inp = torch.tensor([input_ids])
        with torch.no_grad():
            feats = model.model.vision_embed_tokens(patches[None])[0]
            steps, toks = [], []
            cur = inp
            for _ in range(MF.N_GREEDY):
                o = model(input_ids=cur, image_patches=patches[None])
                lg = o.logits[0, -1].float()
                steps.append(lg)
                t = int(lg.argmax())
                toks.append(t)
                cur = torch.cat([cur, torch.tensor([[t]])], dim=1)
        logits_steps = torch.stack(steps)
        srt = logits_steps.sort(dim=1, descending=True).values
        margin = float(((srt[:, 0] - srt[:, 1]) / srt[:, 0].abs().clamp(min=1e-9)).min())
        name = f"case{ci}"
        tensors[f"{name}.pixel_values"] = img.contiguous()
        tensors[f"{name}.patches"] = patches
        tensors[f"{name}.image_features"] = feats.contiguous()
        tensors[f"{name}.logits_steps"] = logits_steps.contiguous()
        eos_idx = next((i for i, t in enumerate(toks) if t == eos), None)
        cases.append({
            "name": name, "image": f"{MF.LLAVA_IMAGE_DIR}/{img_name}", "image_size_wh": [W, H],
            "resized_wh": [uw, uh], "patch_grid_rc": [nr, nc], "prompt": prompt,
            "input_ids": input_ids, "num_image_tokens": len(image_ids),
            "greedy_tokens": toks,
            "greedy_text_skip_special": hf_tok.decode(toks, skip_special_tokens=True),
            "natural_eos_index": eos_idx, "min_top1_margin_rel": margin,
        })
    MF.save_file(tensors, str(out / "expected.safetensors"))
    vers = MF.versions()
    MF.write_json(out / "versions.json", vers)
    summary = {
        "fixture": spec["dir"], "variant": variant,
        "made_by": "python3 tools/make_fixtures.py fuyu --out tests/fixtures",
        "versions": vers, "checkpoint_dtype": "float32", "reference_math": "float32",
        "attn_implementation": "eager", "weight_layout": keys[:3] + ["..."],
        "tolerance": {"rule": "max|c - ref| <= rel * max|ref|, per tensor", "rel": MF.TOL_REL,
                      "greedy_tokens": "identical"},
        "greedy": {"do_sample": False, "max_new_tokens": MF.N_GREEDY, "eos_stopping": "disabled",
                   "logits_steps": "row k = logits that chose greedy_tokens[k]"},
        "special_tokens": dict(ids, tokenizer_size=n_tok, model_vocab_size=V),
        "image_preprocessing": {"class": "FuyuImageProcessorPil", "target_hw": list(spec["target"]),
                                "patch": P, "resample": "PIL BILINEAR", "padding_value": 1.0,
                                "mean": 0.5, "std": 0.5},
        "tensors": {"caseN.pixel_values": "[3, target_h, target_w] padded + normalized image",
                    "caseN.patches": "[n_patches, P*P*3] (ph, pw, c) order, row-major grid",
                    "caseN.image_features": "[n_patches, hidden] vision_embed_tokens output",
                    "caseN.logits_steps": "[16, vocab] logits of each greedy step"},
        "cases": cases,
    }
    MF.write_json(out / "expected.json", summary)
    return summary
