/*
 * core/formats/tokenizer_impl.h — private to the tokenizer's .c files (tokenizer.c: loading,
 * checks, normalizers, lookups; tokenizer_encode.c: the encode pipeline; tokenizer_model.c:
 * BPE and Unigram; tokenizer_decode.c: the decoder chain and streaming; tokenizer_util.c:
 * buffers, hash maps, trie, UTF-8).
 * Nothing here is API; see tokenizer.h for the behaviour.
 */
#ifndef MMRT_FORMATS_TOKENIZER_IMPL_H
#define MMRT_FORMATS_TOKENIZER_IMPL_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stdbool.h>
#include <stdint.h>

#include "tokenizer.h"

/* ---- growable buffers ------------------------------------------------------------------ */

struct tk_buf {
    char *p;
    size_t n, cap;
};

struct tk_ids {
    int32_t *p;
    size_t n, cap;
};

mmrt_status tk_buf_reserve(struct tk_buf *b, size_t extra, struct mmrt_error *err);
mmrt_status tk_buf_put(struct tk_buf *b, const void *s, size_t n, struct mmrt_error *err);
void tk_buf_free(struct tk_buf *b);
mmrt_status tk_ids_push(struct tk_ids *v, int32_t id, struct mmrt_error *err);

/* ---- UTF-8 ----------------------------------------------------------------------------- */

/* Length of the valid UTF-8 sequence at s[0..n) (1..4), or 0 when it is not one. */
size_t tk_utf8_seq(const unsigned char *s, size_t n);
/* Whether s is entirely valid UTF-8; *bad gets the offset of the first bad byte. */
bool tk_utf8_valid(const char *s, size_t n, size_t *bad);
/* Decodes the (valid) sequence at s, returns its length. */
size_t tk_utf8_decode(const char *s, uint32_t *cp);
/* Encodes cp (<= 0x10FFFF) into out[4], returns the length. */
size_t tk_utf8_encode(uint32_t cp, char *out);
/* Unicode White_Space (Rust's char::is_whitespace and the regex crate's \s). */
bool tk_is_white_space(uint32_t cp);
/* The regex crate's Unicode \w (alphabetic, marks, decimal digits, connector punctuation,
 * join controls), approximated from the general category. */
bool tk_is_word_char(uint32_t cp);

/* ---- hash maps and trie ---------------------------------------------------------------- */

/* String -> id. Keys are not stored: the map holds ids and compares through the token
 * table (tok_str), so each string lives once in the tokenizer's arena. */
struct tk_strmap {
    uint32_t *slot; /* id + 1, 0 = empty */
    uint32_t mask;
};

/* (left id, right id) -> (rank, merged id), the BPE merge table. */
struct tk_pairmap {
    uint64_t *key; /* (left << 32) | right; UINT64_MAX = empty */
    uint32_t *rank;
    int32_t *merged;
    uint32_t mask, n;
};

/* Byte trie with hashed edges: (node << 8 | byte) -> child. Used for the added-token split
 * (leftmost-longest) and for the Unigram prefix search. */
struct tk_trie {
    uint64_t *ekey; /* edge key + 1, 0 = empty */
    uint32_t *echild;
    uint32_t emask, n_edges;
    int32_t *value; /* per node: payload or -1 */
    uint32_t n_nodes, cap_nodes;
};

uint64_t tk_hash_bytes(const void *s, size_t n);
mmrt_status tk_trie_init(struct tk_trie *t, struct mmrt_error *err);
void tk_trie_free(struct tk_trie *t);
/* Inserts s with payload v; returns the payload already there (or -1) in *old. */
mmrt_status tk_trie_insert(struct tk_trie *t, const char *s, size_t n, int32_t v, int32_t *old,
                           struct mmrt_error *err);
/* Child of node for byte c, or 0 (the root is node 0 and is never a child). */
uint32_t tk_trie_child(const struct tk_trie *t, uint32_t node, unsigned char c);

mmrt_status tk_pairmap_init(struct tk_pairmap *m, size_t n, struct mmrt_error *err);
void tk_pairmap_free(struct tk_pairmap *m);
/* Inserts or overwrites (HF's merge table is a hash map: a repeated pair keeps the last). */
void tk_pairmap_put(struct tk_pairmap *m, int32_t a, int32_t b, uint32_t rank, int32_t merged);
bool tk_pairmap_get(const struct tk_pairmap *m, int32_t a, int32_t b, uint32_t *rank,
                    int32_t *merged);

/* ---- the tokenizer --------------------------------------------------------------------- */

enum tk_model_kind { TK_MODEL_BPE, TK_MODEL_UNIGRAM };

enum tk_norm_kind { TK_NORM_PREPEND, TK_NORM_REPLACE, TK_NORM_NFC, TK_NORM_NFD, TK_NORM_NFKC,
                    TK_NORM_NFKD };

struct tk_norm {
    enum tk_norm_kind kind;
    char *a, *b; /* Prepend: a = prefix; Replace: a = pattern, b = content */
    size_t alen, blen;
};

enum tk_pre_kind { TK_PRE_SPLIT, TK_PRE_BYTELEVEL, TK_PRE_METASPACE };
enum tk_split_behavior { TK_SPLIT_REMOVED, TK_SPLIT_ISOLATED, TK_SPLIT_MERGED_PREV,
                         TK_SPLIT_MERGED_NEXT, TK_SPLIT_CONTIGUOUS };
enum tk_prepend { TK_PREPEND_ALWAYS, TK_PREPEND_FIRST, TK_PREPEND_NEVER };

struct tk_pre {
    enum tk_pre_kind kind;
    /* Split */
    pcre2_code *re;       /* Regex pattern (compiled once), or NULL for a String pattern */
    char *str;            /* String pattern */
    size_t slen;
    enum tk_split_behavior behavior;
    bool invert;
    /* ByteLevel */
    bool add_prefix_space, use_regex;
    /* Metaspace */
    char repl[4];
    size_t rlen;
    enum tk_prepend scheme;
    bool split;
};

enum tk_dec_kind { TK_DEC_REPLACE, TK_DEC_BYTEFALLBACK, TK_DEC_FUSE, TK_DEC_STRIP,
                   TK_DEC_BYTELEVEL, TK_DEC_METASPACE };

struct tk_dec {
    enum tk_dec_kind kind;
    char *a, *b; /* Replace: pattern, content */
    size_t alen, blen;
    uint32_t cp;          /* Strip content, Metaspace replacement */
    size_t start, stop;   /* Strip */
    enum tk_prepend scheme;
};

#define TK_MAX_STEPS 16

/* Per-id flags. */
enum {
    TK_ID_SPECIAL = 1, /* skipped by MMRT_DECODE_SKIP_SPECIAL (HF: its decode string is the
                          content of a special added token) */
};

struct tk_added {
    int32_t id;
    const char *pat; /* what is matched: the content, or its normalized form */
    size_t plen;
    bool lstrip, rstrip, single_word, normalized, special;
};

struct mmrt_tokenizer {
    /* Token table over ids [0, n_ids): the model vocab is [0, n_model), added tokens that are
     * not in it follow. Strings live in `arena` (offsets, so the arena may grow while
     * loading); `dec_*` is what the decoder sees (the normalized form for normalized added
     * tokens, as HF's decode uses). */
    char *arena;
    size_t arena_n, arena_cap;
    uint32_t n_ids, n_model;
    uint32_t *tok_off, *tok_len, *dec_off, *dec_len;
    uint8_t *id_flags;
    struct tk_strmap model_map, added_map;

    enum tk_model_kind model;
    int32_t unk_id;            /* -1 when none */
    bool fuse_unk, byte_fallback, ignore_merges;
    int32_t byte_id[256];      /* id of "<0xNN>" in the model vocab, -1 when absent */
    struct tk_pairmap merges;  /* BPE */
    double *score;             /* Unigram: per model id */
    double min_score;
    struct tk_trie pieces;     /* Unigram: payload = model id */

    struct tk_added *added;
    uint32_t n_added;
    struct tk_trie trie_raw, trie_norm; /* payload = index into added */

    struct tk_norm norm[TK_MAX_STEPS];
    int n_norm;
    struct tk_pre pre[TK_MAX_STEPS];
    int n_pre;
    struct tk_dec dec[TK_MAX_STEPS];
    int n_dec;
    bool has_decoder;

    int32_t *tmpl_prefix, *tmpl_suffix;
    size_t n_tmpl_prefix, n_tmpl_suffix;

    /* GPT-2 byte <-> unicode: byte -> UTF-8 of its code point; code point -> byte or -1. */
    char bl_enc[256][2];
    uint8_t bl_enc_len[256];
    int16_t bl_dec[0x144];

    pcre2_general_context *gctx;     /* PCRE2 allocates through our malloc/free */
    pcre2_code *gpt2_re;             /* ByteLevel use_regex, compiled when needed */
    pcre2_match_context *mctx;       /* match/heap limits, shared read-only */

    size_t max_input_bytes;
    char *what;                      /* the source's name, for messages */
};

static inline const char *tk_tok(const struct mmrt_tokenizer *t, uint32_t id, size_t *len)
{
    *len = t->tok_len[id];
    return t->arena + t->tok_off[id];
}

/* Model-vocab lookup (not added tokens); -1 when absent. */
int32_t tk_model_lookup(const struct mmrt_tokenizer *t, const char *s, size_t n);
/* Builds a string map over ids [first, first + count) whose strings are at (off, len). */
mmrt_status tk_strmap_build(struct tk_strmap *m, const struct mmrt_tokenizer *t,
                            const uint32_t *off, const uint32_t *len, uint32_t first,
                            uint32_t count, int32_t *dup_a, int32_t *dup_b,
                            struct mmrt_error *err);
int32_t tk_strmap_get(const struct tk_strmap *m, const struct mmrt_tokenizer *t,
                      const uint32_t *off, const uint32_t *len, const char *s, size_t n);
void tk_strmap_free(struct tk_strmap *m);

/* Scratch of one encode call, reused across its pieces (freed by tk_work_free). */
struct tk_work {
    void *sym, *heap, *node, *ends;
    size_t sym_cap, heap_cap, node_cap, ends_cap;
};
void tk_work_free(struct tk_work *w);

/* tokenizer_model.c: appends the ids of one pre-tokenized piece. */
mmrt_status tk_bpe_encode(const struct mmrt_tokenizer *t, const char *s, size_t n,
                          struct tk_work *w, struct tk_ids *out, struct mmrt_error *err);
mmrt_status tk_unigram_encode(const struct mmrt_tokenizer *t, const char *s, size_t n,
                              struct tk_work *w, struct tk_ids *out, struct mmrt_error *err);

/* tokenizer.c: applies the normalizers to s; the result (*res, *rn) is s itself or in one
 * of the two scratch buffers. */
mmrt_status tk_normalize(const struct mmrt_tokenizer *t, const char *s, size_t n,
                         struct tk_buf bufs[2], const char **res, size_t *rn,
                         struct mmrt_error *err);

/* tokenizer_decode.c: checks at load that the decoder chain can stream (see tokenizer.h). */
mmrt_status tk_decoder_check(const struct mmrt_tokenizer *t, struct mmrt_error *err);

/* Fills the bl_* tables (GPT-2's bytes_to_unicode). */
void tk_bytelevel_tables(struct mmrt_tokenizer *t);

#endif /* MMRT_FORMATS_TOKENIZER_IMPL_H */
