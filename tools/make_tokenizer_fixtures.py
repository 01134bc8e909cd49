#!/usr/bin/env python3
"""Builds the tiny tokenizer.json fixtures and their expected encodings (models.md §6.4).

Everything is trained offline and deterministically with the Hugging Face `tokenizers`
package on the small corpus below, so the files can be rebuilt anywhere:

    pip install tokenizers transformers     # transformers is optional (cross-check only)
    python3 tools/make_tokenizer_fixtures.py [--out tests/fixtures/tokenizer]

Importable: the model-fixture builders use the same recipes, e.g.

    from make_tokenizer_fixtures import build_llama_tokenizer, wrap_fast
    tok = build_llama_tokenizer(out_dir)      # also writes out_dir/tokenizer.json
    ids = tok.token_to_id("<image>")
    wrap_fast(tok, "llama").save_pretrained(out_dir)   # + tokenizer_config.json (transformers)

build_llama_tokenizer, build_qwen2_tokenizer and build_fuyu_tokenizer follow §6.4. The other
NAMEs are variants for the tests: llama_metaspace (non-legacy Metaspace "first"),
llama_metaspace_always (Metaspace "always", split, Metaspace decoder), llama_flags and
qwen2_flags (added tokens with lstrip / rstrip / single_word / normalized), gpt2 (ByteLevel
with add_prefix_space and GPT-2's regex), splits_a / splits_b (every Split behaviour, invert),
bare (model and added tokens only), llama_missing_bytes (byte fallback with holes),
unigram_ties (Viterbi ties, missing byte pieces), llama3 (Llama 3's regex and chat marks, BPE
with ignore_merges, BOS from a TemplateProcessing after ByteLevel).

Writes, for each tokenizer NAME:
    tokenizer_NAME.json   the tokenizer itself (< 200 KB)
    expected_NAME.json    {"tokenizer", "versions", "cases": [...], "decode_cases": [...]}
where each case holds the input text and what `tokenizers` returns for it:
    ids                 encode(text, add_special_tokens=True)
    ids_plain           encode(text, add_special_tokens=False)
    ids_split_special   the same with encode_special_tokens=True (special-token text is
                        treated as plain text, HF's `split_special_tokens`)
    decoded             decode(ids, skip_special_tokens=False)
    decoded_skip        decode(ids, skip_special_tokens=True)
and each decode case a seeded random id sequence with its two decodings, plus
`byte_runs_valid` (whether every run of <0xNN> tokens in it is valid UTF-8; only then
does a streamed decode equal the full one, see tokenizer.h).
"""
import argparse
import json
import os
import random
import sys
import unicodedata

# Single-threaded training: the Unigram trainer's parallel sums differ in the last bit
# from run to run otherwise.
os.environ["TOKENIZERS_PARALLELISM"] = "false"
os.environ.setdefault("RAYON_NUM_THREADS", "1")

from tokenizers import (AddedToken, Regex, Tokenizer, decoders, models, normalizers,
                        pre_tokenizers, processors, trainers)
import tokenizers

SPIECE = "\u2581"  # ▁, SentencePiece's space marker

# Qwen2's pre-tokenizer regex (models.md §7.3); \p{N} is a single digit.
QWEN2_PAT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
             r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

# Llama 3's pre-tokenizer regex: Qwen2's, but digits go in runs of up to three.
LLAMA3_PAT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
              r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# Llama 3's chat marks (and the <image> llama3-llava-next adds), special added tokens.
LLAMA3_SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
                   "<|end_header_id|>", "<|eot_id|>", "<image>"]
# Whole pre-tokens put into the vocabulary with no merge that builds them: only
# ignore_merges (Llama 3's BPE) finds them, as one id.
LLAMA3_WHOLE = ["\u0120hotdog", "\u0120concatenate", "202", "123"]

QWEN2_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>",
                  "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>"]

# Small English corpus: enough for merges of common words, nothing outside ASCII except a
# few Latin-1 letters, so CJK, emoji and most accents go through byte fallback.
CORPUS = """\
The quick brown fox jumps over the lazy dog. The dog sleeps in the sun.
What is shown in this image? The image shows a cat sitting on a table.
USER: Describe the picture. ASSISTANT: There is a small house near the river.
A man is riding a bicycle down the street, and a woman is walking her dog.
Hello world! This is a test of the tokenizer. It should handle many words.
The weather today is sunny with a few clouds in the sky and a light wind.
Machine learning models read tokens, not characters; the tokenizer splits text.
There are two birds on the tree and three children playing in the garden.
Please answer the question: what color is the car in front of the building?
It was the best of times, it was the worst of times, it was the age of wisdom.
In the beginning the universe was created. This has made a lot of people angry.
Numbers like 1, 2, 3, 10, 42, 100 and 2024 appear in text about time and money.
She said: "I don't know where they've gone, but we'll find them." He's sure.
The café serves crème brûlée and a naïve résumé is on the table.
Mongolian vowel separators: \u180e\u180e\u180e\u180e and \u180e\u180e\u180e\u180e again.
def square(x):
    return x * x  # the square of x
for i in range(10):
    print(i)
"""


def _corpus_lines(repeat=4):
    lines = [l for l in CORPUS.splitlines() if l.strip()]
    return lines * repeat


def _bpe_parts(tok):
    """(vocab dict, merges list of pairs) of a trained BPE tokenizer."""
    model = json.loads(tok.to_str())["model"]
    merges = [tuple(m.split(" ", 1)) if isinstance(m, str) else tuple(m)
              for m in model["merges"]]
    return model["vocab"], merges


def _legacy_llama_pipeline(tok):
    tok.normalizer = normalizers.Sequence([normalizers.Prepend(SPIECE),
                                           normalizers.Replace(" ", SPIECE)])
    tok.pre_tokenizer = None
    tok.decoder = decoders.Sequence([decoders.Replace(SPIECE, " "), decoders.ByteFallback(),
                                     decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                       special_tokens=[("<s>", 1)])


def _train_llama_bpe():
    """The SentencePiece-style BPE: <unk> <s> </s>, the 256 byte tokens, then ▁ and merges."""
    byte_tokens = ["<0x%02X>" % b for b in range(256)]
    specials = ["<unk>", "<s>", "</s>"]
    tok = Tokenizer(models.BPE(unk_token="<unk>", fuse_unk=True, byte_fallback=True))
    # Trained word by word (pieces start with ▁ and never span words, as SentencePiece's
    # do); the saved tokenizer uses the legacy pipeline without a pre-tokenizer.
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement=SPIECE, prepend_scheme="always",
                                                 split=True)
    trainer = trainers.BpeTrainer(vocab_size=700, min_frequency=2, show_progress=False,
                                  special_tokens=specials + byte_tokens, limit_alphabet=80)
    tok.train_from_iterator(_corpus_lines(), trainer=trainer)
    vocab, merges = _bpe_parts(tok)
    # The trainer registered <0xNN> as added tokens; a real LLaMA file has them only in the
    # model vocab, so rebuild the tokenizer from the trained vocab and merges.
    for i, t in enumerate(specials + byte_tokens):
        assert vocab[t] == i, (t, vocab[t])
    return vocab, merges


def build_llama_tokenizer(out_dir=None):
    """LLaMA / llava-1.5 style tokenizer (legacy normalizer, byte fallback, <image>)."""
    vocab, merges = _train_llama_bpe()
    tok = Tokenizer(models.BPE(vocab, merges, unk_token="<unk>", fuse_unk=True,
                               byte_fallback=True))
    _legacy_llama_pipeline(tok)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t in ("<unk>", "<s>", "</s>")])
    tok.add_special_tokens([AddedToken("<image>", special=True, normalized=False),
                            AddedToken("<pad>", special=True, normalized=False)])
    if out_dir:
        _save(tok, out_dir, "tokenizer.json")
    return tok


def build_qwen2_tokenizer(out_dir=None):
    """Qwen2 / Qwen2-VL style byte-level BPE with the chat and vision special tokens."""
    def pipeline(t):
        t.normalizer = normalizers.NFC()
        t.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(QWEN2_PAT), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
        t.decoder = decoders.ByteLevel()
        t.post_processor = processors.ByteLevel(trim_offsets=False)

    trained = Tokenizer(models.BPE())
    pipeline(trained)
    trainer = trainers.BpeTrainer(vocab_size=700, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    trained.train_from_iterator(_corpus_lines(), trainer=trainer)
    vocab, merges = _bpe_parts(trained)
    tok = Tokenizer(models.BPE(vocab, merges, unk_token=None, fuse_unk=False,
                               byte_fallback=False))
    pipeline(tok)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t in QWEN2_SPECIALS])
    if out_dir:
        _save(tok, out_dir, "tokenizer.json")
    return tok


def build_fuyu_tokenizer(out_dir=None):
    """Fuyu / Persimmon style SentencePiece Unigram with byte fallback (models.md §7.4):
    |ENDOFTEXT|, |SPEAKER| and |NEWLINE| are ordinary pieces, not added tokens.

    The pieces are the LLaMA fixture's learnt BPE pieces, scored by their log frequency in
    the corpus (HF's UnigramTrainer orders tied pieces differently from run to run, so it
    is not used: the fixture must be reproducible)."""
    import math
    bpe_vocab, _ = _train_llama_bpe()
    lines = [SPIECE + l.replace(" ", SPIECE) for l in _corpus_lines(1)]
    learnt = sorted(p for p, i in bpe_vocab.items() if i >= 259)
    counts = {p: sum(l.count(p) for l in lines) + 1 for p in learnt}
    total = sum(counts.values())
    scored = sorted(((p, round(math.log(c / total), 6)) for p, c in counts.items()),
                    key=lambda x: (-x[1], x[0]))
    lowest = scored[-1][1]
    vocab = [("<unk>", 0.0), ("<s>", 0.0)]
    vocab += [("<0x%02X>" % b, 0.0) for b in range(256)]
    vocab += [("|ENDOFTEXT|", 0.0), ("|SPEAKER|", lowest), ("|NEWLINE|", lowest)]
    vocab += scored
    tok = Tokenizer(models.Unigram(vocab, unk_id=0, byte_fallback=True))
    _legacy_llama_pipeline(tok)
    tok.post_processor = processors.TemplateProcessing(
        single="|ENDOFTEXT| $A", special_tokens=[("|ENDOFTEXT|", 258)])
    tok.add_special_tokens([AddedToken("<unk>", special=True, normalized=False)])
    if out_dir:
        _save(tok, out_dir, "tokenizer.json")
    return tok


def build_unigram_ties():
    """A hand-made Unigram whose scores tie (the Viterbi keeps the first candidate, i.e. the
    shorter piece at the earlier position), with some byte pieces missing (a character whose
    bytes are not all there becomes <unk>, fused with its neighbours)."""
    vocab = [("<unk>", 0.0), ("\u2581", -1.0), ("a", -1.0), ("b", -1.0), ("ab", -2.0),
             ("c", -1.5), ("bc", -2.5), ("abc", -4.0), ("\u2581a", -2.0), ("aa", -2.0),
             ("aaa", -3.0), ("|X|", -1.0), ("<0x3F>", -3.0)]
    vocab += [("<0x%02X>" % b, -3.0) for b in range(0xC3, 0xC4)]
    vocab += [("<0x%02X>" % b, -3.0) for b in range(0x80, 0xC0)]
    tok = Tokenizer(models.Unigram(vocab, unk_id=0, byte_fallback=True))
    _legacy_llama_pipeline(tok)
    tok.post_processor = None
    return tok


def build_llama_missing_bytes(llama):
    """LLaMA with byte fallback but some <0xNN> tokens renamed away: characters needing them
    become <unk> (fused), and HF's order quirk (bytes before a pending <unk>) shows."""
    d = json.loads(llama.to_str())
    for b in (0xE4, 0xE6, 0x9F, 0xF0):
        name = "<0x%02X>" % b
        d["model"]["vocab"]["BYTE_%02X" % b] = d["model"]["vocab"].pop(name)
    return Tokenizer.from_str(json.dumps(d))


def _variant(base, **parts):
    tok = Tokenizer.from_str(base.to_str())
    for k, v in parts.items():
        setattr(tok, k, v)
    return tok


def build_llama3_tokenizer(qwen2):
    """Llama 3 (llama3-llava-next-8b) style: byte-level BPE with ignore_merges, the Llama 3
    regex, <|begin_of_text|> added by a TemplateProcessing after ByteLevel, its chat marks;
    Qwen2's trained vocabulary and merges plus LLAMA3_WHOLE."""
    vocab, merges = _bpe_parts(qwen2)
    vocab = {k: v for k, v in vocab.items()}
    for w in LLAMA3_WHOLE:
        if w not in vocab:
            vocab[w] = len(vocab)
    tok = Tokenizer(models.BPE(vocab, merges, unk_token=None, fuse_unk=False,
                               byte_fallback=False, ignore_merges=True))
    tok.normalizer = None
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_PAT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t in LLAMA3_SPECIALS])
    bot = tok.token_to_id("<|begin_of_text|>")
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single="<|begin_of_text|> $A",
                                      pair="<|begin_of_text|> $A <|begin_of_text|> $B",
                                      special_tokens=[("<|begin_of_text|>", bot)])])
    return tok


def build_variants(llama, qwen2):
    """Same vocabularies, other pipelines that real files use, plus added-token flags."""
    out = {}
    out["llama3"] = build_llama3_tokenizer(qwen2)
    # Non-legacy LLaMA: no normalizer, Metaspace(prepend_scheme="first", split=False).
    out["llama_metaspace"] = _variant(
        llama, normalizer=None,
        pre_tokenizer=pre_tokenizers.Metaspace(replacement=SPIECE, prepend_scheme="first",
                                               split=False))
    # Metaspace "always" with split=True and the Metaspace decoder (Mistral-era files).
    out["llama_metaspace_always"] = _variant(
        llama, normalizer=None,
        pre_tokenizer=pre_tokenizers.Metaspace(replacement=SPIECE, prepend_scheme="always",
                                               split=True),
        decoder=decoders.Metaspace(replacement=SPIECE, prepend_scheme="always", split=True))
    # Added-token flags: lstrip / rstrip / single_word / normalized, special and not.
    flags = Tokenizer.from_str(llama.to_str())
    flags.add_special_tokens([AddedToken("<mask>", special=True, lstrip=True, normalized=False)])
    flags.add_tokens([AddedToken("<sep>", special=False, rstrip=True, normalized=False),
                      AddedToken("dog", special=False, single_word=True, normalized=False),
                      AddedToken("cat", special=False, single_word=True, normalized=True),
                      AddedToken("<tool>", special=False, normalized=True),
                      AddedToken("<mask>x", special=False, normalized=False)])
    out["llama_flags"] = flags
    qflags = Tokenizer.from_str(qwen2.to_str())
    qflags.add_tokens([AddedToken("<tool_call>", special=False, normalized=False),
                       AddedToken("</tool_call>", special=False, normalized=False),
                       AddedToken("e\u0301t\u00e9", special=False, normalized=True)])
    out["qwen2_flags"] = qflags
    # GPT-2 style byte level: ByteLevel(add_prefix_space=True, use_regex=True), no Split.
    out["gpt2"] = _variant(
        qwen2, normalizer=None,
        pre_tokenizer=pre_tokenizers.ByteLevel(add_prefix_space=True, use_regex=True))
    # Split behaviours and invert (real files use Isolated; the others are cheap to hold).
    bl = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    out["splits_a"] = _variant(qwen2, pre_tokenizer=pre_tokenizers.Sequence([
        pre_tokenizers.Split(" ", behavior="merged_with_previous"),
        pre_tokenizers.Split(Regex(r"\d"), behavior="contiguous"),
        pre_tokenizers.Split(",", behavior="removed"), bl]))
    out["splits_b"] = _variant(qwen2, pre_tokenizer=pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(r"[aeiou]"), behavior="merged_with_next", invert=True),
        pre_tokenizers.Split(Regex(r"\s"), behavior="contiguous", invert=True),
        pre_tokenizers.Split(Regex(r"[.!?]+"), behavior="merged_with_previous"),
        pre_tokenizers.Split(Regex(r"[A-Z]"), behavior="removed"), bl]))
    # Nothing but the model and added tokens: no normalizer, pre-tokenizer, post-processor
    # or decoder (HF then joins decoded tokens with spaces).
    out["bare"] = _variant(llama, normalizer=None, pre_tokenizer=None, post_processor=None,
                           decoder=None)
    out["llama_missing_bytes"] = build_llama_missing_bytes(llama)
    out["unigram_ties"] = build_unigram_ties()
    return out


def _save(tok, out_dir, name):
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, name)
    tok.save(path, pretty=True)
    size = os.path.getsize(path)
    assert size < 200 * 1024, f"{path}: {size} bytes, fixtures must stay under 200 KB"
    return path


def test_strings(specials):
    """~70 inputs; `specials` adds the tokenizer's own special tokens in context."""
    nfc = "caf\u00e9 na\u00efve r\u00e9sum\u00e9 \u00c5ngstr\u00f6m"
    s = [
        "", "Hello world", "hello", " leading space", "trailing space ", "  two leading",
        "multiple   spaces   between   words", "   ", " ", "tab\tseparated\tvalues\t",
        "line one\nline two\n", "windows\r\nline\r\nendings\r\n\r\n", "\n\n\nnewlines first",
        "mixed \t \n whitespace \r\n  end", "  \n  \n", "a\n\n b \n\tc",
        nfc, unicodedata.normalize("NFD", nfc), "A\u030a vs \u00c5 vs \u212b",
        "\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8", "\u4e2d\u6587\u5b57\u7b26\u6d4b\u8bd5",
        "\ud55c\uad6d\uc5b4 " + unicodedata.normalize("NFD", "\ud55c\uad6d\uc5b4"),
        "\u0645\u0631\u062d\u0628\u0627 \u0628\u0627\u0644\u0639\u0627\u0644\u0645",
        "\u05e9\u05dc\u05d5\u05dd \u05e2\u05d5\u05dc\u05dd",
        "a\u0300\u0301\u0302 e\u0323\u0302 q\u0307\u0323",
        "I \u2764\ufe0f \U0001F355 and \U0001F389!",
        "\U0001F468\u200d\U0001F469\u200d\U0001F467\u200d\U0001F466 family",
        "\U0001F1EB\U0001F1F7\U0001F1EF\U0001F1F5 flags", "\U0001F44D\U0001F3FD ok",
        "\U0001D518\U0001D52B\U0001D526\U0001D520\U0001D52C\U0001D521\U0001D522",
        "\u0394\u03b9\u03ac \u1e9e \u20ac \u2713 \u03a9", "\ue000\U0010fffd",
        "1234567890", "3.14159 and 2,718 and -42 and 1e10",
        "\u0663\u0664\u0665 \u00bd \u00b2 \u216b \uff11\uff12",
        "Hello, world! How's it going? (fine) [ok] {yes} <no> @#$%^&*",
        "I'm, you're, we'll, they've, she'd, it's, DON'T, He'S",
        "!!!???...---___", "supercalifragilisticexpialidocious",
        "antidisestablishmentarianism" * 10, "x" * 600, "the " * 120,
        "a\u00a0b\u2003c\u3000d\u2028e\u0085f\u000bg\u000ch", "a\u180eb \u180e c",
        "\u180e\u180ex \u180e\u180e \u180e5",
        "x \u00a0\u00a0y\u3000 \n\u2029z", "tab\t\t \t", " \u00a0 ",
        "zero\u200bwidth\u200cjoin\u200dx\ufeff", "\u2581 literal spiece \u2581\u2581",
        "\u0120 literal G-dot \u010a", "<0x41> is not a byte",
        "def square(x):\n    return x * x  # the square\n",
        "https://example.com/path?q=1&r=2#frag", "Price: \u20ac100 (\u2248 $110)",
        "hello\u4e16\u754c123abc", "The quick brown fox jumps over the lazy dog.",
        "<image>", "<image>\n", "USER: <image>\nWhat is this? ASSISTANT:",
        "USER: <image>\nthe \u00e9 ASSISTANT:", "<image><image> two images",
        "a<image>b", "<<image>>", "<ima ge> <image", " <image> ",
        "USER: <image>\nWhat's shown? ASSISTANT:",
        "[INST] <image>\nWhat is shown in this image? [/INST]",
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n"
        "<|vision_start|><|image_pad|><|vision_end|>What's shown?<|im_end|>\n"
        "<|im_start|>assistant\n",
        "<|im_start", "<|endoftext|>", "text<|endoftext|>more",
    ]
    for t in specials:
        s += [t, f"before {t} after", f"x{t}y", f"{t}{t}", f"  {t}  "]
    seen, out = set(), []
    for x in s:
        if x not in seen:
            seen.add(x)
            out.append(x)
    return out


FLAG_STRINGS = [
    "a <mask> b", "a  <mask>b", "<mask>", "   <mask>", "x<mask>y", "a <sep>   b", "<sep>\n\nz",
    "hot dog", "hotdog", "dog food", "dog", "a_dog", "dog_a", "dogs and cats", "the cat sat",
    "cat", "concatenate", "a <tool> b", "<tool>", "x<tool>", "<mask>x marks", "<mask>xy",
    "<tool_call>{}</tool_call>", "e\u0301t\u00e9 \u00e9t\u00e9", "<mask> <sep> dog cat",
]


# What llama3-llava-next-8b's template renders (docs/CONFIG.md "Chat template"), numbers in
# runs, and the words only ignore_merges finds whole.
LLAMA3_STRINGS = [
    "<|start_header_id|>user<|end_header_id|>\n\n<image>\nWhat is shown in this image?"
    "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n",
    "<|start_header_id|>system<|end_header_id|>\n\n\nBe brief.<|eot_id|>",
    "1234567 and 12 345 6789, 2024-12-06 12345", "a hotdog, hotdogs; concatenate "
    "concatenated, a concatenate",
]

TIE_STRINGS = ["ab", "abc", "aab", "aaab", "aaaa", "bcab", "a b c", "abcabc", "aa bb cc",
               "\u00e9a", "a\u00e9\u00e9b", "?\u00e9?", "\u00e8\u00e9x", "xyz", "a|X|b",
               "\u4e2d\u00e9", "zz\u00e9zz", "b" * 50, "ab" * 40]


def _byte_runs_valid(tok, ids):
    run = bytearray()
    for i in ids + [None]:
        t = tok.id_to_token(i) if i is not None else None
        if t is not None and len(t) == 6 and t.startswith("<0x") and t.endswith(">"):
            run.append(int(t[3:5], 16))
            continue
        if run:
            try:
                run.decode("utf-8")
            except UnicodeDecodeError:
                return False
            run = bytearray()
    return True


# Byte strings whose decoding exercises the U+FFFD rules: overlong, surrogate, above
# U+10FFFF, truncated, stray continuation, invalid lead, valid 2/3/4-byte characters.
CRAFTED_BYTES = [b"\xe0\x80\x80", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\xc0\xaf",
                 b"\xf0\x9f\x8d", b"\xf0\x9f\xf0\x9f\x8d\x95", b"\x80", b"\xff",
                 b"\xc3\xa9", b"\xe4\xb8\xad", b"\xf0\x9f\x8d\x95", b"\xe2\x82",
                 b"\xc3", b"\xf5\x80", b"\xef\xbf\xbd", b"\xed\x9f\xbf", b"\xf4\x8f\xbf\xbf"]


def _byte_ids(tok, data):
    """Ids spelling `data` byte by byte: <0xNN> tokens, or GPT-2 byte-level characters."""
    ids = []
    alphabet = None
    for b in data:
        i = tok.token_to_id("<0x%02X>" % b)
        if i is None:
            if alphabet is None:
                alphabet = _bytes_to_unicode()
            i = tok.token_to_id(alphabet[b])
        if i is None:
            return None
        ids.append(i)
    return ids


def _bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def expected(tok, name, strings, fast=None):
    cases = []
    split = Tokenizer.from_str(tok.to_str())
    split.encode_special_tokens = True
    for text in strings:
        ids = tok.encode(text, add_special_tokens=True).ids
        plain = tok.encode(text, add_special_tokens=False).ids
        case = {
            "text": text,
            "ids": ids,
            "ids_plain": plain,
            "ids_split_special": split.encode(text, add_special_tokens=False).ids,
            "decoded": tok.decode(ids, skip_special_tokens=False),
            "decoded_skip": tok.decode(ids, skip_special_tokens=True),
        }
        if fast is not None:
            # transformers wraps the same file; it must agree with tokenizers.
            assert fast(text)["input_ids"] == ids, (name, text)
            assert fast.decode(ids, skip_special_tokens=False,
                               clean_up_tokenization_spaces=False) == case["decoded"], (name, text)
        cases.append(case)
    rng = random.Random(1234)
    n = tok.get_vocab_size(with_added_tokens=True)
    dcases = []
    while len(dcases) < 40:
        ids = [rng.randrange(n) for _ in range(rng.randint(1, 24))]
        if "\0" in tok.decode(ids, skip_special_tokens=False):
            continue  # the C side reads these files with NUL refused in JSON strings
        dcases.append({"ids": ids,
                       "decoded": tok.decode(ids, skip_special_tokens=False),
                       "decoded_skip": tok.decode(ids, skip_special_tokens=True),
                       "byte_runs_valid": _byte_runs_valid(tok, ids)})
    word = tok.encode("ab", add_special_tokens=False).ids
    for k, data in enumerate(CRAFTED_BYTES):
        ids = _byte_ids(tok, data)
        if ids is None:
            continue
        # alone, between ordinary tokens, and two runs back to back
        for seq in (ids, word + ids + word, ids + ids):
            dcases.append({"ids": seq,
                           "decoded": tok.decode(seq, skip_special_tokens=False),
                           "decoded_skip": tok.decode(seq, skip_special_tokens=True),
                           "byte_runs_valid": _byte_runs_valid(tok, seq)})
    return {"tokenizer": f"tokenizer_{name}.json",
            "versions": _versions(),
            "cases": cases, "decode_cases": dcases}


def _dump_compact(exp):
    """One case per line: small files with readable diffs."""
    lines = ["{", f' "tokenizer": {json.dumps(exp["tokenizer"])},',
             f' "versions": {json.dumps(exp["versions"], sort_keys=True)},']
    for key in ("cases", "decode_cases"):
        items = [json.dumps(c, ensure_ascii=True) for c in exp[key]]
        lines.append(f' "{key}": [')
        lines += ["  " + c + ("," if i + 1 < len(items) else "") for i, c in enumerate(items)]
        lines.append(" ]" + ("," if key == "cases" else ""))
    lines.append("}")
    return "\n".join(lines) + "\n"


def _versions():
    v = {"tokenizers": tokenizers.__version__, "python": sys.version.split()[0],
         "unicodedata": unicodedata.unidata_version}
    try:
        import transformers
        v["transformers"] = transformers.__version__
    except ImportError:
        pass
    return v


# bos, eos, unk, pad as the real processors name them (§7.2-7.4).
FAST_TOKENS = {"llama": ("<s>", "</s>", "<unk>", "<pad>"),
               "qwen2": (None, "<|im_end|>", None, "<|endoftext|>"),
               # |ENDOFTEXT| is an ordinary piece in Fuyu: naming it bos/eos here would make
               # transformers register it as an added token, changing the encoding.
               "fuyu": (None, None, "<unk>", None)}


def wrap_fast(tok, kind):
    """transformers' PreTrainedTokenizerFast around `tok` (kind: llama, qwen2 or fuyu), for
    save_pretrained(); None when transformers is not installed."""
    try:
        from transformers import PreTrainedTokenizerFast
    except ImportError:
        return None
    bos, eos, unk, pad = FAST_TOKENS[kind]
    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(tok.to_str()),
                                   bos_token=bos, eos_token=eos, unk_token=unk, pad_token=pad)


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(here, "..", "tests", "fixtures", "tokenizer"))
    ap.add_argument("--only", default="",
                    help="comma-separated NAMEs to write (default: all)")
    args = ap.parse_args()
    out = os.path.normpath(args.out)

    llama = build_llama_tokenizer()
    qwen2 = build_qwen2_tokenizer()
    fuyu = build_fuyu_tokenizer()
    toks = {"llama": llama, "qwen2": qwen2, "fuyu": fuyu}
    toks.update(build_variants(llama, qwen2))
    llama_sp = ["<s>", "</s>", "<unk>", "<image>", "<pad>"]
    specials = {"llama": llama_sp, "llama_metaspace": llama_sp,
                "llama_metaspace_always": llama_sp, "llama_flags": llama_sp,
                "qwen2": QWEN2_SPECIALS, "qwen2_flags": QWEN2_SPECIALS, "gpt2": QWEN2_SPECIALS,
                "fuyu": ["|ENDOFTEXT|", "|SPEAKER|", "|NEWLINE|", "<s>", "<unk>"],
                "llama_missing_bytes": llama_sp, "unigram_ties": ["|X|", "<unk>"],
                "splits_a": QWEN2_SPECIALS, "splits_b": QWEN2_SPECIALS, "bare": llama_sp,
                "llama3": LLAMA3_SPECIALS}
    for name, tok in toks.items():
        if args.only and name not in args.only.split(","):
            continue
        _save(tok, out, f"tokenizer_{name}.json")
        strings = test_strings(specials[name])
        if name.endswith("_flags"):
            strings += FLAG_STRINGS
        if name == "unigram_ties":
            strings += TIE_STRINGS
        if name == "llama3":
            strings += LLAMA3_STRINGS
        fast = wrap_fast(tok, name) if name in FAST_TOKENS else None
        exp = expected(tok, name, strings, fast)
        with open(os.path.join(out, f"expected_{name}.json"), "w", encoding="utf-8") as f:
            f.write(_dump_compact(exp))
        print(f"{name}: vocab {tok.get_vocab_size(with_added_tokens=True)}, "
              f"{len(exp['cases'])} strings, {len(exp['decode_cases'])} decode cases"
              f"{', checked with transformers' if fast else ''}")


if __name__ == "__main__":
    main()
