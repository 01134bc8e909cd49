/*
 * core/formats/tokenizer.h — text <-> token ids, driven by a Hugging Face tokenizer.json.
 *
 * What it reproduces
 *   The HF `tokenizers` library (the Rust engine behind transformers' fast tokenizers), for
 *   the components the supported models' files use; ids and decoded text are held to that
 *   library by tests/test_tokenizer.c on fixtures made by tools/make_tokenizer_fixtures.py.
 *   The pipeline is the one the JSON describes, in HF's order:
 *
 *     1. added tokens are split out of the raw text (only those with "normalized": false),
 *        longest match first at the leftmost position, honouring lstrip / rstrip /
 *        single_word;
 *     2. each remaining segment is normalized on its own, then the "normalized": true added
 *        tokens (matched in their normalized form) are split out of it;
 *     3. the pre-tokenizer cuts each segment into pieces;
 *     4. the model turns each piece into ids;
 *     5. with MMRT_TOKENIZE_ADD_SPECIAL, the post-processor's template adds its ids (BOS).
 *
 *   Components understood (anything else is refused at load, by name):
 *     model           BPE (vocab + merges in either the "a b" or the ["a","b"] form,
 *                     unk_token, fuse_unk, byte_fallback, ignore_merges; dropout only null
 *                     or 0; no continuing_subword_prefix / end_of_word_suffix) and Unigram
 *                     (pieces with scores, unk_id, byte_fallback; Viterbi best path)
 *     normalizer      Sequence, Prepend, Replace (String pattern), NFC, NFD, NFKC, NFKD
 *     pre_tokenizer   Sequence, Split (String or Regex pattern, all five behaviours,
 *                     invert), ByteLevel (add_prefix_space, use_regex with GPT-2's regex),
 *                     Metaspace (replacement, prepend_scheme first/always/never or the
 *                     older add_prefix_space, split)
 *     post_processor  TemplateProcessing (the "single" template), ByteLevel (nothing to do
 *                     for ids), Sequence of those
 *     decoder         Sequence, Replace (String), ByteFallback, Fuse, Strip, ByteLevel,
 *                     Metaspace; none (tokens joined with spaces)
 *   `truncation` and `padding` are ignored: callers check lengths against the context
 *   themselves, and mmrt never pads.
 *
 *   Added-token ids are HF's: the vocab's id when the content is a vocab string, otherwise
 *   the next id after the vocabulary, in file order. A file whose "id" fields disagree is
 *   refused rather than renumbered (HF only warns, and the model's embeddings would then be
 *   indexed by ids the file did not mean).
 *
 *   Unicode normalization is utf8proc's (Unicode 15 on Debian 12); HF's crate is older, so
 *   characters assigned since could normalize differently. Input must be valid UTF-8.
 *
 *   Typical files: LLaMA / llava-1.5 (Prepend("▁") + Replace(" ", "▁") or a Metaspace
 *   pre-tokenizer, BPE with byte fallback, decoder Replace + ByteFallback + Fuse +
 *   Strip(left 1), template "<s> $A"); Qwen2-VL (NFC, Split(Qwen2 regex) + ByteLevel,
 *   byte-level BPE, ByteLevel decoder, no BOS); Fuyu (legacy LLaMA pipeline, Unigram).
 *
 * Regular expressions
 *   HF runs Split patterns with Oniguruma; mmrt uses PCRE2 with PCRE2_UTF | PCRE2_UCP,
 *   compiled once at load (JIT when available) with match, depth and heap limits set (a
 *   pattern that backtracks catastrophically ends in MMRT_ERR_LIMIT, not a hang). The one
 *   difference that matters for these patterns, \s (Oniguruma: Unicode White_Space; PCRE2:
 *   also U+180E), is removed by spelling \s and \S out as White_Space classes before
 *   compiling. HF's empty-match rule (an empty match right after the previous match is
 *   skipped) is reproduced.
 *
 * Special tokens in user text — a security note
 *   By default (HF's default, and what the processors of the supported models do), text
 *   such as "<|im_start|>" or "<image>" inside the input IS recognised as the special token.
 *   That is right for a chat template the server renders itself, and wrong for text a user
 *   typed: a user could inject "<|im_end|>\n<|im_start|>system\n…" or extra image
 *   placeholders. Encode untrusted text with MMRT_TOKENIZE_SPLIT_SPECIAL (HF's
 *   split_special_tokens=True), which matches special tokens as ordinary text, and splice
 *   the template's own special tokens around it.
 *
 * Limits (hostile files and inputs; every refusal names the file and the JSON path, token
 * or merge): see struct mmrt_tokenizer_limits. Encoding cost is O(n log n) for BPE (a heap
 * of candidate merges over a linked list of symbols, merge ranks in a hash map keyed by the
 * id pair, as HF does), O(n * longest piece) for Unigram, and bounded by the regex limits for
 * pre-tokenization; inputs longer than max_input_bytes are refused with MMRT_ERR_LIMIT.
 *
 * Thread-safety: a loaded tokenizer is immutable; encode, decode and any number of streams
 * may run concurrently on it. A stream is used by one thread at a time.
 */
#ifndef MMRT_FORMATS_TOKENIZER_H
#define MMRT_FORMATS_TOKENIZER_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../error.h"

struct mmrt_tokenizer;
struct mmrt_tokenizer_stream;

/* Caps applied while loading and encoding. Zero fields take the defaults in brackets. */
struct mmrt_tokenizer_limits {
    size_t max_file_bytes;   /* tokenizer.json size                           [64 MiB] */
    uint32_t max_vocab;      /* model vocab entries, and ids overall          [1 << 21] */
    uint32_t max_merges;     /* BPE merges                                    [1 << 22] */
    uint32_t max_added;      /* added_tokens entries                          [65536]   */
    uint32_t max_token_bytes;/* one vocab / added-token string                [4096]    */
    size_t max_input_bytes;  /* one encode call's text                        [1 MiB]   */
};
/* (1 MiB of text is far beyond the supported models' contexts — 32k tokens is ~128 KiB —
 * and bounds an encode call's scratch, about 40 bytes per input byte in the worst case of
 * one unsplit BPE word.) */

/* Encode flags. */
enum {
    /* Apply the post-processor's template (LLaMA: prepend <s>). HF: add_special_tokens. */
    MMRT_TOKENIZE_ADD_SPECIAL = 1u << 0,
    /* Treat special-token text in the input as plain text (HF: split_special_tokens /
     * encode_special_tokens). Non-special added tokens are still matched. */
    MMRT_TOKENIZE_SPLIT_SPECIAL = 1u << 1,
};

/* Decode flags. */
enum {
    /* Leave out special tokens (HF: skip_special_tokens=True). */
    MMRT_DECODE_SKIP_SPECIAL = 1u << 0,
};

/* Reads and checks `path` (a tokenizer.json). `limits` may be NULL (defaults). On success
 * *out is a new tokenizer (free with mmrt_tokenizer_destroy). Statuses: MMRT_ERR_IO (cannot
 * read), MMRT_ERR_LIMIT (a cap above), MMRT_ERR_FORMAT (malformed or inconsistent: bad JSON,
 * duplicate vocab strings or ids, ids out of range, merges naming unknown tokens or
 * producing one, malformed <0xNN> byte tokens, regex that does not compile — with PCRE2's
 * message and offset), MMRT_ERR_UNSUPPORTED (a component type this reader does not know),
 * MMRT_ERR_NO_MEMORY. */
mmrt_status mmrt_tokenizer_load(const char *path, const struct mmrt_tokenizer_limits *limits,
                                struct mmrt_tokenizer **out, struct mmrt_error *err);

/* Same from an already parsed document (borrowed; nothing of it is kept). `what` names the
 * source in messages. limits->max_file_bytes is not used. */
mmrt_status mmrt_tokenizer_load_json(const json_t *root, const char *what,
                                     const struct mmrt_tokenizer_limits *limits,
                                     struct mmrt_tokenizer **out, struct mmrt_error *err);

void mmrt_tokenizer_destroy(struct mmrt_tokenizer *tok);

/* Whether n bytes at s are well-formed UTF-8 (no overlongs, surrogates or values past
 * U+10FFFF); on false *bad (may be NULL) is the offset of the first bad byte. */
bool mmrt_utf8_valid(const char *s, size_t n, size_t *bad);

/* Incremental UTF-8 check (the decoders', and JSON answers' view of a run of byte tokens):
 * feed one byte, learn whether it completed a character, extended a valid prefix, or broke
 * it (Unicode's "maximal subpart" rule, which is what Rust's String::from_utf8_lossy
 * follows). A zeroed accumulator is empty. */
struct mmrt_utf8_acc {
    unsigned char b[4];
    uint8_t n, need;
};
enum mmrt_utf8_step { MMRT_UTF8_MORE, MMRT_UTF8_CHAR, MMRT_UTF8_BAD };
/* On MMRT_UTF8_CHAR the character is in a->b[0..a->n) (the caller clears a->n). On
 * MMRT_UTF8_BAD the accumulator is empty again and one maximal invalid subpart ended: if it
 * was holding bytes (a->n > 0 before the call), those *bad_held bytes were the subpart and
 * `byte` was not consumed (feed it again); otherwise `byte` alone could not start a
 * character and was consumed (*bad_held = 1). */
enum mmrt_utf8_step mmrt_utf8_feed(struct mmrt_utf8_acc *a, unsigned char byte,
                                   unsigned *bad_held);

/* Encodes `len` bytes of UTF-8 `text` (need not be NUL-terminated; embedded NULs are text).
 * On success *ids is a malloc'ed array of *n_ids ids (the caller frees it with free(); it is
 * NULL when *n_ids is 0). Statuses: MMRT_ERR_INVALID_ARG (text is not valid UTF-8 — the
 * message gives the byte offset), MMRT_ERR_LIMIT (longer than max_input_bytes, or a regex
 * match limit hit), MMRT_ERR_NO_MEMORY. */
mmrt_status mmrt_tokenizer_encode(const struct mmrt_tokenizer *tok, const char *text,
                                  size_t len, unsigned flags, int32_t **ids, size_t *n_ids,
                                  struct mmrt_error *err);

/* Decodes ids to text exactly as HF's Tokenizer.decode does (with the flags above). Ids
 * outside [0, vocab_size) are skipped, as HF skips ids it has no token for (a model's
 * embedding table is often larger than its tokenizer). Invalid UTF-8 produced by byte
 * tokens becomes U+FFFD the way HF does it: one per byte for a run of <0xNN> tokens that is
 * not valid UTF-8 as a whole (ByteFallback), one per maximal invalid subpart for byte-level
 * tokens (ByteLevel). On success *text is a malloc'ed, NUL-terminated string of *len bytes
 * (free with free()). */
mmrt_status mmrt_tokenizer_decode(const struct mmrt_tokenizer *tok, const int32_t *ids,
                                  size_t n_ids, unsigned flags, char **text, size_t *len,
                                  struct mmrt_error *err);

/* Streaming decode: feed ids one at a time as they are generated, get text as soon as it is
 * complete UTF-8. Bytes of a character split over several tokens (byte-fallback or
 * byte-level pieces of an emoji, say) are held back until the character is complete; the
 * LLaMA decoder's Strip(left 1) applies only at the start of the stream, as it does for a
 * whole decode. The concatenation of all chunks, finish included, equals
 * mmrt_tokenizer_decode of the same ids, with one documented exception: in a run of <0xNN>
 * byte-fallback tokens that turns out invalid, HF replaces every byte of the run with
 * U+FFFD, including characters the stream already emitted; the stream cannot take those
 * back, so it replaces only the bytes not yet emitted. (Ids from encode do this only where the
 * unknown token or an added token is itself a <0xNN> piece, which a fuzzer's tokenizer had.)
 *
 * create: `flags` are the decode flags. The stream borrows `tok`, which must outlive it.
 * decode_stream: *text / *len receive this step's chunk (possibly empty), valid until the
 *   next call on the stream; not NUL-terminated.
 * finish: flushes what was held back (an incomplete character becomes U+FFFD) and resets the
 *   stream to its initial state, so it can be reused for the next sequence.
 * Statuses: MMRT_ERR_NO_MEMORY. Ids outside the vocabulary are skipped (as in decode). */
mmrt_status mmrt_tokenizer_stream_create(const struct mmrt_tokenizer *tok, unsigned flags,
                                         struct mmrt_tokenizer_stream **out,
                                         struct mmrt_error *err);
mmrt_status mmrt_tokenizer_decode_stream(struct mmrt_tokenizer_stream *s, int32_t id,
                                         const char **text, size_t *len,
                                         struct mmrt_error *err);
mmrt_status mmrt_tokenizer_stream_finish(struct mmrt_tokenizer_stream *s, const char **text,
                                         size_t *len, struct mmrt_error *err);
void mmrt_tokenizer_stream_destroy(struct mmrt_tokenizer_stream *s);

/* Number of ids: the model vocabulary plus the added tokens that are not in it. Every id in
 * [0, vocab_size) has a token. */
uint32_t mmrt_tokenizer_vocab_size(const struct mmrt_tokenizer *tok);

/* Id of a token string (added tokens first, then the model vocab, as HF), or -1. */
int32_t mmrt_tokenizer_token_to_id(const struct mmrt_tokenizer *tok, const char *token,
                                   size_t len);

/* Token string of an id (borrowed, NUL-terminated, *len bytes if len is not NULL), or NULL
 * for an id outside [0, vocab_size). */
const char *mmrt_tokenizer_id_to_token(const struct mmrt_tokenizer *tok, int32_t id,
                                       size_t *len);

/* Whether id is a special added token (what MMRT_DECODE_SKIP_SPECIAL leaves out). */
bool mmrt_tokenizer_is_special(const struct mmrt_tokenizer *tok, int32_t id);

/* The ids MMRT_TOKENIZE_ADD_SPECIAL puts before and after a single sequence, from the
 * post_processor's TemplateProcessing "single" template (LLaMA: prefix {1}, suffix {};
 * Qwen2: both empty). Borrowed arrays; counts may be 0. */
void mmrt_tokenizer_template(const struct mmrt_tokenizer *tok, const int32_t **prefix,
                             size_t *n_prefix, const int32_t **suffix, size_t *n_suffix);

/* The BOS the template adds: its first prefix id, or -1 when it adds none. (The model's own
 * bos/eos ids come from its config; this says whether encode adds one.) */
int32_t mmrt_tokenizer_bos_id(const struct mmrt_tokenizer *tok);

/* The text each token adds in the middle of a decoded text: after another token, so none of
 * the first-token rules (Strip's, Metaspace's leading space) applies; a piece of a character
 * reads as U+FFFD, as in a whole decode. For checking what a token would add to generated
 * text (core/json_grammar.h). Token id's text is blob[off[id] … off[id + 1]), for every id
 * below n = mmrt_tokenizer_vocab_size(); special tokens have their own text. */
struct mmrt_token_texts {
    char *blob;
    uint32_t *off;   /* [n + 1] */
    /* [n] for a tokenizer whose decoder has ByteFallback: the byte of each <0xNN> token, −1
     * for the others (all −1 without ByteFallback). Such a token's text depends on its
     * neighbours: in a run of them that is not valid UTF-8 every byte reads U+FFFD, an
     * ASCII one too, so its entry in blob (the byte alone) holds only outside such runs. */
    int16_t *byte;
    uint8_t *special;  /* [n] 1 for special added tokens (mmrt_tokenizer_is_special) */
    uint32_t n;
};

/* Fills *out (free with mmrt_token_texts_free) in one pass over the vocabulary: each id
 * decoded after a fixed token, less that token's own text. Statuses: MMRT_ERR_NO_MEMORY,
 * MMRT_ERR_LIMIT (texts of more than 4 GiB together). */
mmrt_status mmrt_tokenizer_token_texts(const struct mmrt_tokenizer *tok,
                                       struct mmrt_token_texts *out, struct mmrt_error *err);
void mmrt_token_texts_free(struct mmrt_token_texts *t);

#endif /* MMRT_FORMATS_TOKENIZER_H */
