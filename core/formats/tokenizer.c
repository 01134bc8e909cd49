/*
 * core/formats/tokenizer.c — loading a tokenizer.json (checked as hostile input) and the
 * encode pipeline (added-token split, normalizers, pre-tokenizers, model, template).
 *
 * Data: every token string lives once in t->arena, NUL-terminated, addressed by id through
 * tok_off/tok_len; ids [0, n_model) are the model vocab (contiguous, checked), added tokens
 * not in it follow in file order — which is how HF assigns them, and the file's ids must
 * agree. Hash maps index the strings (model vocab, added contents); two byte tries hold the
 * added-token patterns (raw and normalized). Components are small step arrays, Sequences
 * flattened. All of it is read-only after load.
 *
 * Sources (read, not copied): huggingface/tokenizers — tokenizer/added_vocabulary.rs
 * (id assignment, normalized patterns), tokenizer/serialization.rs, normalizers/,
 * pre_tokenizers/ and processors/template.rs (fields and defaults),
 * models/bpe/serialization.rs (both merge forms), models/unigram/serialization.rs.
 */
#include "tokenizer_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "json.h"

#define DEF_MAX_FILE (64u << 20)
#define DEF_MAX_VOCAB (1u << 21)
#define DEF_MAX_MERGES (1u << 22)
#define DEF_MAX_ADDED 65536u
#define DEF_MAX_TOKEN 4096u
#define DEF_MAX_INPUT (1u << 20)
#define MAX_SEQ_DEPTH 4

/* GPT-2's pre-tokenizer regex (ByteLevel with use_regex). */
static const char GPT2_PAT[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

struct limits {
    size_t max_file, max_input;
    uint32_t max_vocab, max_merges, max_added, max_token;
};

static struct limits get_limits(const struct mmrt_tokenizer_limits *l)
{
    struct limits r = {DEF_MAX_FILE, DEF_MAX_INPUT, DEF_MAX_VOCAB, DEF_MAX_MERGES,
                       DEF_MAX_ADDED, DEF_MAX_TOKEN};
    if (l) {
        if (l->max_file_bytes)
            r.max_file = l->max_file_bytes;
        if (l->max_input_bytes)
            r.max_input = l->max_input_bytes;
        if (l->max_vocab)
            r.max_vocab = l->max_vocab;
        if (l->max_merges)
            r.max_merges = l->max_merges;
        if (l->max_added)
            r.max_added = l->max_added;
        if (l->max_token_bytes)
            r.max_token = l->max_token_bytes;
    }
    return r;
}

/* Quotes a token for a one-line message: escapes quotes, backslashes and control bytes,
 * shortens long strings. */
static const char *quote(char *buf, size_t cap, const char *s, size_t n)
{
    size_t o = 0;
    buf[o++] = '"';
    for (size_t i = 0; i < n && o + 8 < cap; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') {
            buf[o++] = '\\';
            buf[o++] = (char)c;
        } else if (c < 0x20 || c == 0x7F) {
            o += (size_t)snprintf(buf + o, cap - o, "\\x%02X", c);
        } else {
            buf[o++] = (char)c;
        }
        if (i + 1 < n && o + 8 >= cap) {
            memcpy(buf + o, "...", 3);
            o += 3;
            break;
        }
    }
    buf[o++] = '"';
    buf[o] = '\0';
    return buf;
}

#define QCAP 96

/* ---- JSON helpers ---------------------------------------------------------------------- */

static mmrt_status fmt_err(const struct mmrt_tokenizer *t, mmrt_status st,
                           struct mmrt_error *err, const char *path, const char *msg)
{
    return mmrt_error_set(err, st, "%s: %s: %s", t->what, path, msg);
}

/* A string member; *s = NULL when absent or null and !required. */
static mmrt_status get_str(const struct mmrt_tokenizer *t, const json_t *obj, const char *key,
                           const char *path, bool required, const char **s, size_t *n,
                           struct mmrt_error *err)
{
    const json_t *v = json_object_get(obj, key);
    *s = NULL;
    *n = 0;
    if (!v || json_is_null(v)) {
        if (required)
            return mmrt_error_set(err, MMRT_ERR_FORMAT, "%s: %s: missing \"%s\"", t->what, path,
                                  key);
        return MMRT_OK;
    }
    if (!json_is_string(v))
        return mmrt_error_set(err, MMRT_ERR_FORMAT, "%s: %s: \"%s\" must be a string", t->what,
                              path, key);
    *s = json_string_value(v);
    *n = json_string_length(v);
    return MMRT_OK;
}

static mmrt_status get_bool(const struct mmrt_tokenizer *t, const json_t *obj, const char *key,
                            const char *path, bool def, bool *out, struct mmrt_error *err)
{
    char what[512];
    snprintf(what, sizeof what, "%s: %s", t->what, path);
    return mmrt_json_opt_bool(obj, key, what, def, out, err);
}

static char *dup_bytes(const char *s, size_t n)
{
    char *p = malloc(n + 1);
    if (p) {
        memcpy(p, s, n);
        p[n] = '\0';
    }
    return p;
}

static mmrt_status no_mem(struct mmrt_error *err)
{
    return mmrt_error_set(err, MMRT_ERR_NO_MEMORY, "tokenizer: out of memory");
}

/* The "type" of a component object. */
static mmrt_status get_type(const struct mmrt_tokenizer *t, const json_t *j, const char *path,
                            const char **type, struct mmrt_error *err)
{
    if (!json_is_object(j))
        return fmt_err(t, MMRT_ERR_FORMAT, err, path, "must be an object or null");
    size_t n;
    return get_str(t, j, "type", path, true, type, &n, err);
}

/* One character (serde's `char`): exactly one UTF-8 sequence. */
static mmrt_status get_char(const struct mmrt_tokenizer *t, const json_t *obj, const char *key,
                            const char *path, uint32_t *cp, struct mmrt_error *err)
{
    const char *s;
    size_t n;
    mmrt_status st = get_str(t, obj, key, path, true, &s, &n, err);
    if (st != MMRT_OK)
        return st;
    if (n == 0 || tk_utf8_seq((const unsigned char *)s, n) != n)
        return mmrt_error_set(err, MMRT_ERR_FORMAT, "%s: %s: \"%s\" must be one character",
                              t->what, path, key);
    tk_utf8_decode(s, cp);
    return MMRT_OK;
}

/* {"String": s} (or {"Regex": r} when allowed). */
static mmrt_status get_pattern(const struct mmrt_tokenizer *t, const json_t *obj,
                               const char *path, bool allow_regex, const char **s, size_t *n,
                               bool *is_regex, struct mmrt_error *err)
{
    const json_t *p = json_object_get(obj, "pattern");
    if (!json_is_object(p) || json_object_size(p) != 1)
        return fmt_err(t, MMRT_ERR_FORMAT, err, path,
                       "\"pattern\" must be {\"String\": …} or {\"Regex\": …}");
    const json_t *v;
    *is_regex = false;
    if ((v = json_object_get(p, "Regex"))) {
        if (!allow_regex)
            return fmt_err(t, MMRT_ERR_UNSUPPORTED, err, path,
                           "a Regex pattern is not supported here (String only)");
        *is_regex = true;
    } else if (!(v = json_object_get(p, "String"))) {
        return fmt_err(t, MMRT_ERR_FORMAT, err, path,
                       "\"pattern\" must be {\"String\": …} or {\"Regex\": …}");
    }
    if (!json_is_string(v))
        return fmt_err(t, MMRT_ERR_FORMAT, err, path, "the pattern must be a string");
    *s = json_string_value(v);
    *n = json_string_length(v);
    if (*n == 0)
        return fmt_err(t, MMRT_ERR_FORMAT, err, path, "empty pattern");
    return MMRT_OK;
}

/* Oniguruma's \s (what HF runs) is Unicode White_Space; PCRE2's also takes U+180E. Spell
 * \s and \S out as White_Space classes so both engines cut the same pieces. Inside a
 * class, \s becomes the list; \S there (no real pattern has it) is left to PCRE2. Quoted
 * \Q...\E text and other escapes are copied untouched. */
#define WS_LIST "\\t-\\r \\x{85}\\x{a0}\\x{1680}\\x{2000}-\\x{200a}\\x{2028}\\x{2029}\\x{202f}" \
                "\\x{205f}\\x{3000}"

static char *onig_spaces(const char *pat, size_t n, size_t *out_n)
{
    size_t cap = n * (sizeof WS_LIST + 3) + 1;
    char *o = malloc(cap);
    if (!o)
        return NULL;
    size_t k = 0;
    bool in_class = false, quoted = false;
    for (size_t i = 0; i < n; i++) {
        char c = pat[i];
        if (quoted) {
            if (c == '\\' && i + 1 < n && pat[i + 1] == 'E')
                quoted = false;
            o[k++] = c;
            continue;
        }
        if (c == '\\' && i + 1 < n) {
            char d = pat[++i];
            if (d == 's' && in_class) {
                memcpy(o + k, WS_LIST, sizeof WS_LIST - 1);
                k += sizeof WS_LIST - 1;
            } else if ((d == 's' || d == 'S') && !in_class) {
                k += (size_t)snprintf(o + k, cap - k, "[%s%s]", d == 'S' ? "^" : "", WS_LIST);
            } else {
                quoted = d == 'Q';
                o[k++] = c;
                o[k++] = d;
            }
            continue;
        }
        if (!in_class && c == '[') {
            in_class = true;
            o[k++] = c;
            /* A ']' right after '[' or '[^' is a literal member. */
            if (i + 1 < n && pat[i + 1] == '^')
                o[k++] = pat[++i];
            if (i + 1 < n && pat[i + 1] == ']')
                o[k++] = pat[++i];
            continue;
        }
        if (in_class && c == '[' && i + 1 < n && pat[i + 1] == ':') {
            /* POSIX [:name:] inside a class: copy through its closing ":]". */
            const char *end = memmem(pat + i + 2, n - i - 2, ":]", 2);
            size_t stop = end ? (size_t)(end - pat) + 2 : n;
            memcpy(o + k, pat + i, stop - i);
            k += stop - i;
            i = stop - 1;
            continue;
        }
        if (in_class && c == ']')
            in_class = false;
        o[k++] = c;
    }
    *out_n = k;
    return o;
}

/* PCRE2's memory goes through malloc/free called from here, so it is counted and failed by
 * the tests' allocation sweep like the rest of the tokenizer's. */
static void *pc_malloc(PCRE2_SIZE n, void *unused)
{
    (void)unused;
    return malloc(n);
}

static void pc_free(void *p, void *unused)
{
    (void)unused;
    free(p);
}

static mmrt_status compile_re(struct mmrt_tokenizer *t, const char *pat, size_t n,
                              const char *path, pcre2_code **out, struct mmrt_error *err)
{
    int code;
    PCRE2_SIZE off;
    if (!t->gctx && !(t->gctx = pcre2_general_context_create(pc_malloc, pc_free, NULL)))
        return no_mem(err);
    pcre2_compile_context *cc = pcre2_compile_context_create(t->gctx);
    if (!cc)
        return no_mem(err);
    mmrt_status st = MMRT_OK;
    pcre2_code *re = NULL;
    if (n > 65536) {
        st = mmrt_error_set(err, MMRT_ERR_LIMIT, "%s: %s: regex of %zu bytes, more than the "
                            "65536 allowed", t->what, path, n);
        goto out;
    }
    /* The pattern as written first, so errors and offsets refer to the file's text. */
    re = pcre2_compile((PCRE2_SPTR)pat, n, PCRE2_UTF | PCRE2_UCP, &code, &off, cc);
    if (re) {
        pcre2_code_free(re);
        size_t rn;
        char *rw = onig_spaces(pat, n, &rn);
        if (!rw) {
            st = no_mem(err);
            re = NULL;
            goto out;
        }
        re = pcre2_compile((PCRE2_SPTR)rw, rn, PCRE2_UTF | PCRE2_UCP, &code, &off, cc);
        free(rw);
        if (!re && code != PCRE2_ERROR_NOMEMORY && code != PCRE2_ERROR_HEAP_FAILED) {
            st = mmrt_error_set(err, MMRT_ERR_UNSUPPORTED, "%s: %s: regex cannot be adapted "
                                "to Oniguruma's \\s (PCRE2 error %d)", t->what, path, code);
            goto out;
        }
    }
    if (!re) {
        PCRE2_UCHAR msg[256];
        if (pcre2_get_error_message(code, msg, sizeof msg) < 0)
            snprintf((char *)msg, sizeof msg, "error %d", code);
        if (code == PCRE2_ERROR_NOMEMORY || code == PCRE2_ERROR_HEAP_FAILED)
            st = mmrt_error_set(err, MMRT_ERR_NO_MEMORY, "%s: %s: regex: %s", t->what, path,
                                (const char *)msg);
        else
            st = mmrt_error_set(err, MMRT_ERR_FORMAT, "%s: %s: regex does not compile at offset "
                                "%zu: %s", t->what, path, (size_t)off, (const char *)msg);
        goto out;
    }
    /* JIT is an optimisation: without it (no JIT support, or no memory) the interpreter
     * gives the same matches. */
    (void)pcre2_jit_compile(re, PCRE2_JIT_COMPLETE);
    *out = re;
out:
    pcre2_compile_context_free(cc);
    return st;
}

/* ---- arena and token table ------------------------------------------------------------- */

static mmrt_status arena_put(struct mmrt_tokenizer *t, const char *s, size_t n, uint32_t *off,
                             struct mmrt_error *err)
{
    if (t->arena_n + n + 1 > UINT32_MAX)
        return mmrt_error_set(err, MMRT_ERR_LIMIT, "%s: token strings exceed 4 GiB", t->what);
    if (t->arena_n + n + 1 > t->arena_cap) {
        size_t cap = t->arena_cap ? t->arena_cap : 4096;
        while (cap < t->arena_n + n + 1)
            cap *= 2;
        char *p = realloc(t->arena, cap);
        if (!p)
            return no_mem(err);
        t->arena = p;
        t->arena_cap = cap;
    }
    memcpy(t->arena + t->arena_n, s, n);
    t->arena[t->arena_n + n] = '\0';
    *off = (uint32_t)t->arena_n;
    t->arena_n += n + 1;
    return MMRT_OK;
}

static mmrt_status alloc_ids(struct mmrt_tokenizer *t, uint32_t n, struct mmrt_error *err)
{
    t->tok_off = calloc(n ? n : 1, sizeof *t->tok_off);
    t->tok_len = calloc(n ? n : 1, sizeof *t->tok_len);
    if (!t->tok_off || !t->tok_len)
        return no_mem(err);
    return MMRT_OK;
}

static mmrt_status check_token(const struct mmrt_tokenizer *t, const struct limits *lim,
                               const char *s, size_t n, const char *path,
                               struct mmrt_error *err)
{
    char q[QCAP];
    if (n == 0)
        return fmt_err(t, MMRT_ERR_FORMAT, err, path, "empty token string");
    if (n > lim->max_token)
        return mmrt_error_set(err, MMRT_ERR_LIMIT, "%s: %s: token %s is %zu bytes, more than "
                              "the %u allowed", t->what, path, quote(q, sizeof q, s, n), n,
                              lim->max_token);
    return MMRT_OK;
}

/* ---- model ----------------------------------------------------------------------------- */

static mmrt_status build_model_map(struct mmrt_tokenizer *t, struct mmrt_error *err)
{
    int32_t a, b;
    mmrt_status st = tk_strmap_build(&t->model_map, t, t->tok_off, t->tok_len, 0, t->n_model,
                                     &a, &b, err);
    if (st != MMRT_OK)
        return st;
    if (a >= 0) {
        char q[QCAP];
        size_t n;
        const char *s = tk_tok(t, (uint32_t)a, &n);
        return mmrt_error_set(err, MMRT_ERR_FORMAT, "%s: model.vocab: token %s appears twice "
                              "(ids %d and %d)", t->what, quote(q, sizeof q, s, n), a, b);
    }
    return MMRT_OK;
}

static mmrt_status parse_bpe_vocab(struct mmrt_tokenizer *t, const struct limits *lim,
                                   const json_t *vocab, struct mmrt_error *err)
{
    if (!json_is_object(vocab))
        return mmrt_error_set(err, MMRT_ERR_FORMAT, "%s: model.vocab must be an object "
                              "(token -> id)", t->what);
    size_t n = json_object_size(vocab);
    if (n > lim->max_vocab)
        return mmrt_error_set(err, MMRT_ERR_LIMIT, "%s: model.vocab has %zu entries, more than "
                              "the %u allowed", t->what, n, lim->max_vocab);
    if (n == 0)
        return mmrt_error_set(err, MMRT_ERR_FORMAT, "%s: model.vocab is empty", t->what);
    t->n_model = (uint32_t)n;
    mmrt_status st = alloc_ids(t, t->n_model, err);
    if (st != MMRT_OK)
        return st;
    uint8_t *seen = calloc(n, 1);
    if (!seen)
        return no_mem(err);
    const char *key;
    const json_t *v;
    json_object_foreach((json_t *)vocab, key, v) {
        char q[QCAP], path[64 + QCAP];
        size_t kl = strlen(key);
        snprintf(path, sizeof path, "model.vocab[%s]", quote(q, sizeof q, key, kl));
        if (!json_is_integer(v)) {
            st = fmt_err(t, MMRT_ERR_FORMAT, err, path, "id must be an integer");
            goto out;
        }
        json_int_t id = json_integer_value(v);
        if (id < 0 || (uint64_t)id >= n) {
            st = mmrt_error_set(err, MMRT_ERR_FORMAT, "%s: %s: id %lld outside [0, %zu) (ids "
                                "must be 0..n-1 for n entries)", t->what, path, (long long)id, n);
            goto out;
        }
        if (seen[id]) {
            char q2[QCAP];
            size_t ol;
            const char *os = tk_tok(t, (uint32_t)id, &ol);
            st = mmrt_error_set(err, MMRT_ERR_FORMAT, "%s: %s: id %lld is also used by %s",
                                t->what, path, (long long)id, quote(q2, sizeof q2, os, ol));
            goto out;
        }
        seen[id] = 1;
        if ((st = check_token(t, lim, key, kl, path, err)) != MMRT_OK)
            goto out;
        if ((st = arena_put(t, key, kl, &t->tok_off[id], err)) != MMRT_OK)
            goto out;
        t->tok_len[id] = (uint32_t)kl;
    }
    st = build_model_map(t, err);
out:
    free(seen);
    return st;
}

/* One merge: "a b" or ["a", "b"]. */
static mmrt_status merge_parts(const struct mmrt_tokenizer *t, const json_t *m, size_t i,
                               const char **a, size_t *al, const char **b, size_t *bl,
                               bool *skip, struct mmrt_error *err)
{
    *skip = false;
    if (json_is_string(m)) {
        const char *s = json_string_value(m);
        size_t n = json_string_length(m);
        if (n >= 8 && memcmp(s, "#version", 8) == 0) {
            *skip = true; /* merges.txt header kept by some converters; HF skips it */
            return MMRT_OK;
        }
        const char *sp = memchr(s, ' ', n);
        if (!sp || memchr(sp + 1, ' ', n - (size_t)(sp + 1 - s))) {
            char q[QCAP];
            return mmrt_error_set(err, MMRT_ERR_FORMAT, "%s: model.merges[%zu] %s: must be two "
                                  "tokens separated by one space", t->what, i,
                                  quote(q, sizeof q, s, n));
        }
        *a = s;
        *al = (size_t)(sp - s);
        *b = sp + 1;
        *bl = n - *al - 1;
        return MMRT_OK;
    }
    if (json_is_array(m) && json_array_size(m) == 2 && json_is_string(json_array_get(m, 0)) &&
        json_is_string(json_array_get(m, 1))) {
        *a = json_string_value(json_array_get(m, 0));
        *al = json_string_length(json_array_get(m, 0));
        *b = json_string_value(json_array_get(m, 1));
        *bl = json_string_length(json_array_get(m, 1));
        return MMRT_OK;
    }
    return mmrt_error_set(err, MMRT_ERR_FORMAT, "%s: model.merges[%zu]: must be \"a b\" or "
                          "[\"a\", \"b\"]", t->what, i);
}

static mmrt_status parse_bpe_merges(struct mmrt_tokenizer *t, const struct limits *lim,
                                    const json_t *merges, struct mmrt_error *err)
{
    if (!json_is_array(merges))
        return mmrt_error_set(err, MMRT_ERR_FORMAT, "%s: model.merges must be an array",
                              t->what);
    size_t n = json_array_size(merges);
    if (n > lim->max_merges)
        return mmrt_error_set(err, MMRT_ERR_LIMIT, "%s: model.merges has %zu entries, more "
                              "than the %u allowed", t->what, n, lim->max_merges);
    mmrt_status st = tk_pairmap_init(&t->merges, n, err);
    if (st != MMRT_OK)
        return st;
    char *cat = malloc(2 * (size_t)lim->max_token + 1);
    if (!cat)
        return no_mem(err);
    uint32_t rank = 0;
    for (size_t i = 0; i < n; i++) {
        const char *a = NULL, *b = NULL;
        size_t al = 0, bl = 0;
        bool skip;
        char qa[QCAP], qb[QCAP];
        st = merge_parts(t, json_array_get(merges, i), i, &a, &al, &b, &bl, &skip, err);
        if (st != MMRT_OK)
            goto out;
        if (skip)
            continue;
        int32_t ia = tk_model_lookup(t, a, al), ib = tk_model_lookup(t, b, bl);
        if (ia < 0 || ib < 0) {
            st = mmrt_error_set(err, MMRT_ERR_FORMAT, "%s: model.merges[%zu] (%s, %s): %s is not "
                                "in the vocabulary", t->what, i, quote(qa, sizeof qa, a, al),
                                quote(qb, sizeof qb, b, bl), ia < 0 ? "the left token" :
                                "the right token");
            goto out;
        }
        /* Both parts are vocab tokens, so each is at most max_token bytes. */
        memcpy(cat, a, al);
        memcpy(cat + al, b, bl);
        int32_t im = tk_model_lookup(t, cat, al + bl);
        if (im < 0) {
            char qm[QCAP];
            st = mmrt_error_set(err, MMRT_ERR_FORMAT, "%s: model.merges[%zu] (%s, %s): the merged "
                                "token %s is not in the vocabulary", t->what, i,
                                quote(qa, sizeof qa, a, al), quote(qb, sizeof qb, b, bl),
                                quote(qm, sizeof qm, cat, al + bl));
            goto out;
        }
        tk_pairmap_put(&t->merges, ia, ib, rank++, im);
    }
out:
    free(cat);
    return st;
}

static mmrt_status parse_bpe(struct mmrt_tokenizer *t, const struct limits *lim,
                             const json_t *m, struct mmrt_error *err)
{
    const json_t *v = json_object_get(m, "dropout");
    if (v && !json_is_null(v)) {
        if (!json_is_number(v) || json_number_value(v) < 0 || json_number_value(v) > 1)
            return mmrt_error_set(err, MMRT_ERR_FORMAT, "%s: model.dropout must be null or in "
                                  "[0, 1]", t->what);
        if (json_number_value(v) != 0)
            return mmrt_error_set(err, MMRT_ERR_UNSUPPORTED, "%s: model.dropout = %g: BPE "
                                  "dropout makes encoding random; not supported", t->what,
                                  json_number_value(v));
    }
    static const char *const unsupported[] = {"continuing_subword_prefix", "end_of_word_suffix"};
    for (size_t i = 0; i < 2; i++) {
        v = json_object_get(m, unsupported[i]);
        if (v && !json_is_null(v))
            return mmrt_error_set(err, MMRT_ERR_UNSUPPORTED, "%s: model.%s is not supported "
                                  "(only null)", t->what, unsupported[i]);
    }
    mmrt_status st;
    if ((st = get_bool(t, m, "fuse_unk", "model", false, &t->fuse_unk, err)) != MMRT_OK ||
        (st = get_bool(t, m, "byte_fallback", "model", false, &t->byte_fallback, err)) != MMRT_OK ||
        (st = get_bool(t, m, "ignore_merges", "model", false, &t->ignore_merges, err)) != MMRT_OK)
        return st;
    const json_t *vocab = json_object_get(m, "vocab"), *merges = json_object_get(m, "merges");
    if (!vocab || !merges)
        return mmrt_error_set(err, MMRT_ERR_FORMAT, "%s: model: missing \"%s\"", t->what,
                              vocab ? "merges" : "vocab");
    if ((st = parse_bpe_vocab(t, lim, vocab, err)) != MMRT_OK)
        return st;
    if ((st = parse_bpe_merges(t, lim, merges, err)) != MMRT_OK)
        return st;
    const char *unk;
    size_t ul;
    if ((st = get_str(t, m, "unk_token", "model", false, &unk, &ul, err)) != MMRT_OK)
        return st;
    t->unk_id = -1;
    if (unk) {
        t->unk_id = tk_model_lookup(t, unk, ul);
        if (t->unk_id < 0) {
            char q[QCAP];
            return mmrt_error_set(err, MMRT_ERR_FORMAT, "%s: model.unk_token %s is not in the "
                                  "vocabulary", t->what, quote(q, sizeof q, unk, ul));
        }
    }
    return MMRT_OK;
}

static mmrt_status parse_unigram(struct mmrt_tokenizer *t, const struct limits *lim,
                                 const json_t *m, struct mmrt_error *err)
{
    mmrt_status st;
    if ((st = get_bool(t, m, "byte_fallback", "model", false, &t->byte_fallback, err)) != MMRT_OK)
        return st;
    t->fuse_unk = true; /* HF's Unigram always fuses unknowns */
    const json_t *vocab = json_object_get(m, "vocab");
    if (!json_is_array(vocab))
        return mmrt_error_set(err, MMRT_ERR_FORMAT, "%s: model.vocab must be an array of "
                              "[piece, score]", t->what);
    size_t n = json_array_size(vocab);
    if (n > lim->max_vocab)
        return mmrt_error_set(err, MMRT_ERR_LIMIT, "%s: model.vocab has %zu entries, more than "
                              "the %u allowed", t->what, n, lim->max_vocab);
    if (n == 0)
        return mmrt_error_set(err, MMRT_ERR_FORMAT, "%s: model.vocab is empty", t->what);
    t->n_model = (uint32_t)n;
    if ((st = alloc_ids(t, t->n_model, err)) != MMRT_OK)
        return st;
    t->score = malloc(n * sizeof *t->score);
    if (!t->score)
        return no_mem(err);
    if ((st = tk_trie_init(&t->pieces, err)) != MMRT_OK)
        return st;
    t->min_score = 0;
    for (size_t i = 0; i < n; i++) {
        const json_t *e = json_array_get(vocab, i);
        char path[64];
        snprintf(path, sizeof path, "model.vocab[%zu]", i);
        if (!json_is_array(e) || json_array_size(e) != 2 ||
            !json_is_string(json_array_get(e, 0)) || !json_is_number(json_array_get(e, 1)))
            return fmt_err(t, MMRT_ERR_FORMAT, err, path, "must be [piece, score]");
        const char *s = json_string_value(json_array_get(e, 0));
        size_t sl = json_string_length(json_array_get(e, 0));
        if ((st = check_token(t, lim, s, sl, path, err)) != MMRT_OK)
            return st;
        if ((st = arena_put(t, s, sl, &t->tok_off[i], err)) != MMRT_OK)
            return st;
        t->tok_len[i] = (uint32_t)sl;
        t->score[i] = json_number_value(json_array_get(e, 1));
        if (i == 0 || t->score[i] < t->min_score)
            t->min_score = t->score[i];
        int32_t old;
        if ((st = tk_trie_insert(&t->pieces, s, sl, (int32_t)i, &old, err)) != MMRT_OK)
            return st;
    }
    if ((st = build_model_map(t, err)) != MMRT_OK)
        return st;
    long long unk;
    char what[300];
    snprintf(what, sizeof what, "%s: model", t->what);
    if ((st = mmrt_json_opt_int(m, "unk_id", what, 0, (long long)n - 1, -1, &unk, err)) !=
        MMRT_OK)
        return st;
    t->unk_id = (int32_t)unk;
    return MMRT_OK;
}

static mmrt_status parse_model(struct mmrt_tokenizer *t, const struct limits *lim,
                               const json_t *root, struct mmrt_error *err)
{
    const json_t *m = json_object_get(root, "model");
    if (!m)
        return mmrt_error_set(err, MMRT_ERR_FORMAT, "%s: missing \"model\"", t->what);
    const char *type;
    mmrt_status st = get_type(t, m, "model", &type, err);
    if (st != MMRT_OK)
        return st;
    if (strcmp(type, "BPE") == 0) {
        t->model = TK_MODEL_BPE;
        st = parse_bpe(t, lim, m, err);
    } else if (strcmp(type, "Unigram") == 0) {
        t->model = TK_MODEL_UNIGRAM;
        st = parse_unigram(t, lim, m, err);
    } else {
        return mmrt_error_set(err, MMRT_ERR_UNSUPPORTED, "%s: model: type \"%s\" is not "
                              "supported (BPE, Unigram)", t->what, type);
    }
    if (st != MMRT_OK)
        return st;
    for (unsigned b = 0; b < 256; b++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", b);
        t->byte_id[b] = tk_model_lookup(t, name, 6);
    }
    return MMRT_OK;
}

/* Every "<0x…>" token must be exactly "<0x" + two upper-case hex digits + ">" when byte
 * fallback is in play (a crafted "<0x-1>" broke a C port before). */
static mmrt_status check_byte_tokens(const struct mmrt_tokenizer *t, struct mmrt_error *err)
{
    bool used = t->byte_fallback;
    for (int i = 0; i < t->n_dec; i++)
        used |= t->dec[i].kind == TK_DEC_BYTEFALLBACK;
    if (!used)
        return MMRT_OK;
    for (uint32_t id = 0; id < t->n_ids; id++) {
        size_t n;
        const char *s = tk_tok(t, id, &n);
        if (n < 4 || memcmp(s, "<0x", 3) != 0 || s[n - 1] != '>')
            continue;
        bool ok = n == 6;
        for (size_t k = 3; ok && k < 5; k++)
            ok = (s[k] >= '0' && s[k] <= '9') || (s[k] >= 'A' && s[k] <= 'F');
        if (!ok) {
            char q[QCAP];
            return mmrt_error_set(err, MMRT_ERR_FORMAT, "%s: malformed byte token %s (id %u): "
                                  "must be <0xNN> with two upper-case hex digits", t->what,
                                  quote(q, sizeof q, s, n), id);
        }
    }
    return MMRT_OK;
}

/* ---- Sequence steps --------------------------------------------------------------------- */

/* One step of the normalizer, pre-tokenizer, decoder or post-processor pipeline. */
typedef mmrt_status (*tk_step_parser)(struct mmrt_tokenizer *t, const json_t *j,
                                      const char *path, int depth, struct mmrt_error *err);

/* A "Sequence" step: each member of j[key] through parse, one level deeper. A hostile file
 * may nest Sequences without end, so depth stops at MAX_SEQ_DEPTH. */
static mmrt_status parse_sequence(struct mmrt_tokenizer *t, const json_t *j, const char *path,
                                  int depth, const char *key, tk_step_parser parse,
                                  struct mmrt_error *err)
{
    const json_t *list = json_object_get(j, key);
    if (!json_is_array(list)) {
        char msg[64];
        snprintf(msg, sizeof msg, "\"%s\" must be an array", key);
        return fmt_err(t, MMRT_ERR_FORMAT, err, path, msg);
    }
    if (depth >= MAX_SEQ_DEPTH)
        return fmt_err(t, MMRT_ERR_LIMIT, err, path, "Sequences nested too deep");
    for (size_t i = 0; i < json_array_size(list); i++) {
        char sub[256];
        snprintf(sub, sizeof sub, "%s.%s[%zu]", path, key, i);
        mmrt_status st = parse(t, json_array_get(list, i), sub, depth + 1, err);
        if (st != MMRT_OK)
            return st;
    }
    return MMRT_OK;
}

/* ---- normalizers ----------------------------------------------------------------------- */

static mmrt_status parse_norm(struct mmrt_tokenizer *t, const json_t *j, const char *path,
                              int depth, struct mmrt_error *err)
{
    if (!j || json_is_null(j))
        return MMRT_OK;
    const char *type;
    mmrt_status st = get_type(t, j, path, &type, err);
    if (st != MMRT_OK)
        return st;
    if (strcmp(type, "Sequence") == 0)
        return parse_sequence(t, j, path, depth, "normalizers", parse_norm, err);
    if (t->n_norm == TK_MAX_STEPS)
        return fmt_err(t, MMRT_ERR_LIMIT, err, path, "too many normalizers");
    /* Counted at once, so destroy frees what a failure below leaves allocated. */
    struct tk_norm *n = &t->norm[t->n_norm++];
    memset(n, 0, sizeof *n);
    const char *s;
    size_t sl;
    if (strcmp(type, "Prepend") == 0) {
        n->kind = TK_NORM_PREPEND;
        if ((st = get_str(t, j, "prepend", path, true, &s, &sl, err)) != MMRT_OK)
            return st;
        if (!(n->a = dup_bytes(s, sl)))
            return no_mem(err);
        n->alen = sl;
    } else if (strcmp(type, "Replace") == 0) {
        bool re;
        n->kind = TK_NORM_REPLACE;
        if ((st = get_pattern(t, j, path, false, &s, &sl, &re, err)) != MMRT_OK)
            return st;
        if (!(n->a = dup_bytes(s, sl)))
            return no_mem(err);
        n->alen = sl;
        if ((st = get_str(t, j, "content", path, true, &s, &sl, err)) != MMRT_OK)
            return st;
        if (!(n->b = dup_bytes(s, sl)))
            return no_mem(err);
        n->blen = sl;
    } else if (strcmp(type, "NFC") == 0) {
        n->kind = TK_NORM_NFC;
    } else if (strcmp(type, "NFD") == 0) {
        n->kind = TK_NORM_NFD;
    } else if (strcmp(type, "NFKC") == 0) {
        n->kind = TK_NORM_NFKC;
    } else if (strcmp(type, "NFKD") == 0) {
        n->kind = TK_NORM_NFKD;
    } else {
        return mmrt_error_set(err, MMRT_ERR_UNSUPPORTED, "%s: %s: normalizer type \"%s\" is not "
                              "supported (Sequence, Prepend, Replace, NFC, NFD, NFKC, NFKD)",
                              t->what, path, type);
    }
    return MMRT_OK;
}

/* Unicode normalization of s into out (replacing its contents). */
static mmrt_status unorm(enum tk_norm_kind kind, const char *s, size_t n, struct tk_buf *out,
                         struct mmrt_error *err)
{
    out->n = 0;
    bool ascii = true;
    for (size_t i = 0; i < n && ascii; i++)
        ascii = (unsigned char)s[i] < 0x80;
    if (ascii) /* every normal form leaves ASCII alone */
        return tk_buf_put(out, s, n, err);
    utf8proc_option_t opt = UTF8PROC_STABLE;
    opt |= (kind == TK_NORM_NFC || kind == TK_NORM_NFKC) ? UTF8PROC_COMPOSE : UTF8PROC_DECOMPOSE;
    if (kind == TK_NORM_NFKC || kind == TK_NORM_NFKD)
        opt |= UTF8PROC_COMPAT;
    utf8proc_ssize_t m = utf8proc_decompose((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n,
                                            NULL, 0, opt);
    if (m < 0)
        return mmrt_error_set(err, MMRT_ERR_INVALID_ARG, "tokenizer: normalization failed: %s",
                              utf8proc_errmsg(m));
    /* Decompose into our buffer as UTF-32, then re-encode in place (<= 4 bytes each). */
    mmrt_status st = tk_buf_reserve(out, ((size_t)m + 1) * sizeof(utf8proc_int32_t), err);
    if (st != MMRT_OK)
        return st;
    utf8proc_int32_t *u = (utf8proc_int32_t *)(void *)out->p;
    m = utf8proc_decompose((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n, u, m, opt);
    if (m >= 0)
        m = utf8proc_reencode(u, m, opt);
    if (m < 0)
        return mmrt_error_set(err, MMRT_ERR_INVALID_ARG, "tokenizer: normalization failed: %s",
                              utf8proc_errmsg(m));
    out->n = (size_t)m;
    return MMRT_OK;
}

/* Non-overlapping left-to-right replacement of a literal pattern. */
static mmrt_status replace_all(const char *s, size_t n, const char *pat, size_t pl,
                               const char *rep, size_t rl, struct tk_buf *out,
                               struct mmrt_error *err)
{
    out->n = 0;
    size_t i = 0;
    while (i < n) {
        const char *hit = pl <= n - i ? memmem(s + i, n - i, pat, pl) : NULL;
        size_t upto = hit ? (size_t)(hit - s) : n;
        mmrt_status st = tk_buf_put(out, s + i, upto - i, err);
        if (st != MMRT_OK)
            return st;
        if (!hit)
            break;
        if ((st = tk_buf_put(out, rep, rl, err)) != MMRT_OK)
            return st;
        i = upto + pl;
    }
    return MMRT_OK;
}

mmrt_status tk_normalize(const struct mmrt_tokenizer *t, const char *s, size_t n,
                         struct tk_buf bufs[2], const char **res, size_t *rn,
                         struct mmrt_error *err)
{
    const char *cur = s;
    size_t cn = n;
    int which = 0;
    for (int i = 0; i < t->n_norm; i++) {
        const struct tk_norm *st_ = &t->norm[i];
        struct tk_buf *out = &bufs[which];
        mmrt_status st = MMRT_OK;
        switch (st_->kind) {
        case TK_NORM_PREPEND:
            if (cn == 0)
                continue; /* HF prepends to non-empty strings only */
            out->n = 0;
            if ((st = tk_buf_reserve(out, st_->alen + cn, err)) != MMRT_OK)
                return st;
            memcpy(out->p, st_->a, st_->alen);
            memcpy(out->p + st_->alen, cur, cn);
            out->n = st_->alen + cn;
            break;
        case TK_NORM_REPLACE:
            st = replace_all(cur, cn, st_->a, st_->alen, st_->b, st_->blen, out, err);
            break;
        default:
            st = unorm(st_->kind, cur, cn, out, err);
            break;
        }
        if (st != MMRT_OK)
            return st;
        cur = out->p;
        cn = out->n;
        which ^= 1;
    }
    *res = cur;
    *rn = cn;
    return MMRT_OK;
}

/* ---- added tokens ---------------------------------------------------------------------- */

/* Payload of exactly s in the trie, or -1. */
static int32_t trie_find(const struct tk_trie *tr, const char *s, size_t n)
{
    uint32_t node = 0;
    for (size_t k = 0; k < n; k++)
        if (!(node = tk_trie_child(tr, node, (unsigned char)s[k])))
            return -1;
    return n ? tr->value[node] : -1;
}

static mmrt_status parse_added(struct mmrt_tokenizer *t, const struct limits *lim,
                               const json_t *root, struct mmrt_error *err)
{
    const json_t *list = json_object_get(root, "added_tokens");
    mmrt_status st = MMRT_OK;
    size_t n = 0;
    if (list && !json_is_null(list)) {
        if (!json_is_array(list))
            return mmrt_error_set(err, MMRT_ERR_FORMAT, "%s: added_tokens must be an array",
                                  t->what);
        n = json_array_size(list);
    }
    if (n > lim->max_added)
        return mmrt_error_set(err, MMRT_ERR_LIMIT, "%s: added_tokens has %zu entries, more than "
                              "the %u allowed", t->what, n, lim->max_added);
    if ((uint64_t)t->n_model + n > lim->max_vocab)
        return mmrt_error_set(err, MMRT_ERR_LIMIT, "%s: %u vocab entries + %zu added tokens, "
                              "more than the %u ids allowed", t->what, t->n_model, n,
                              lim->max_vocab);
    uint32_t cap = t->n_model + (uint32_t)n;
    uint32_t *off = realloc(t->tok_off, (cap ? cap : 1) * sizeof *off);
    if (!off)
        return no_mem(err);
    t->tok_off = off;
    uint32_t *len = realloc(t->tok_len, (cap ? cap : 1) * sizeof *len);
    if (!len)
        return no_mem(err);
    t->tok_len = len;
    t->added = calloc(n ? n : 1, sizeof *t->added);
    uint32_t *pat_off = calloc(n ? n : 1, sizeof *pat_off);
    struct tk_buf nb[2] = {{0}, {0}};
    if (!t->added || !pat_off) {
        free(pat_off);
        return no_mem(err);
    }
    /* Content -> added index, to find repeats. */
    struct tk_trie seen;
    if ((st = tk_trie_init(&seen, err)) != MMRT_OK)
        goto out;
    t->n_ids = t->n_model;
    for (size_t i = 0; i < n; i++) {
        const json_t *e = json_array_get(list, i);
        struct tk_added *a = &t->added[i];
        char path[64], q[QCAP];
        snprintf(path, sizeof path, "added_tokens[%zu]", i);
        if (!json_is_object(e)) {
            st = fmt_err(t, MMRT_ERR_FORMAT, err, path, "must be an object");
            goto out;
        }
        const char *c;
        size_t cl;
        long long id;
        char what[512];
        snprintf(what, sizeof what, "%s: %s", t->what, path);
        if ((st = get_str(t, e, "content", path, true, &c, &cl, err)) != MMRT_OK ||
            (st = check_token(t, lim, c, cl, path, err)) != MMRT_OK ||
            (st = mmrt_json_get_int(e, "id", what, 0, INT32_MAX, &id, err)) != MMRT_OK ||
            (st = get_bool(t, e, "special", path, false, &a->special, err)) != MMRT_OK ||
            (st = get_bool(t, e, "normalized", path, !a->special, &a->normalized, err)) !=
                MMRT_OK ||
            (st = get_bool(t, e, "lstrip", path, false, &a->lstrip, err)) != MMRT_OK ||
            (st = get_bool(t, e, "rstrip", path, false, &a->rstrip, err)) != MMRT_OK ||
            (st = get_bool(t, e, "single_word", path, false, &a->single_word, err)) != MMRT_OK)
            goto out;
        int32_t old;
        if ((st = tk_trie_insert(&seen, c, cl, (int32_t)i, &old, err)) != MMRT_OK)
            goto out;
        if (old >= 0) {
            st = mmrt_error_set(err, MMRT_ERR_FORMAT, "%s: %s: %s repeats added_tokens[%d]",
                                t->what, path, quote(q, sizeof q, c, cl), old);
            goto out;
        }
        /* HF's id: the vocab's if the content is in it, else the next free one. */
        int32_t want = tk_model_lookup(t, c, cl);
        if (want < 0) {
            want = (int32_t)t->n_ids;
            if ((st = arena_put(t, c, cl, &t->tok_off[t->n_ids], err)) != MMRT_OK)
                goto out;
            t->tok_len[t->n_ids++] = (uint32_t)cl;
        }
        if (id != want) {
            st = mmrt_error_set(err, MMRT_ERR_FORMAT, "%s: %s: %s has id %lld, but the vocabulary "
                                "gives it id %d (%s)", t->what, path, quote(q, sizeof q, c, cl),
                                id, want, want < (int32_t)t->n_model ? "it is a vocab token" :
                                "the next id after the vocabulary and the added tokens before "
                                "it");
            goto out;
        }
        a->id = want;
        /* Normalized tokens are matched (and decoded) in their normalized form. */
        const char *p = c;
        size_t pl = cl;
        if (a->normalized && t->n_norm > 0 &&
            (st = tk_normalize(t, c, cl, nb, &p, &pl, err)) != MMRT_OK)
            goto out;
        if (pl == 0) {
            st = fmt_err(t, MMRT_ERR_FORMAT, err, path, "normalizes to an empty string");
            goto out;
        }
        if ((st = arena_put(t, p, pl, &pat_off[i], err)) != MMRT_OK)
            goto out;
        a->plen = pl;
        t->n_added++;
    }
    /* The arena no longer moves: resolve pattern pointers, build the tries and maps. */
    t->dec_off = malloc((t->n_ids ? t->n_ids : 1) * sizeof *t->dec_off);
    t->dec_len = malloc((t->n_ids ? t->n_ids : 1) * sizeof *t->dec_len);
    t->id_flags = calloc(t->n_ids ? t->n_ids : 1, 1);
    if (!t->dec_off || !t->dec_len || !t->id_flags) {
        st = no_mem(err);
        goto out;
    }
    memcpy(t->dec_off, t->tok_off, t->n_ids * sizeof *t->dec_off);
    memcpy(t->dec_len, t->tok_len, t->n_ids * sizeof *t->dec_len);
    if ((st = tk_trie_init(&t->trie_raw, err)) != MMRT_OK ||
        (st = tk_trie_init(&t->trie_norm, err)) != MMRT_OK)
        goto out;
    for (uint32_t i = 0; i < t->n_added; i++) {
        struct tk_added *a = &t->added[i];
        a->pat = t->arena + pat_off[i];
        bool as_norm = a->normalized;
        int32_t old;
        st = tk_trie_insert(as_norm ? &t->trie_norm : &t->trie_raw, a->pat, a->plen,
                            (int32_t)i, &old, err);
        if (st != MMRT_OK)
            goto out;
        if (old >= 0) {
            char q[QCAP];
            st = mmrt_error_set(err, MMRT_ERR_FORMAT, "%s: added_tokens[%u]: pattern %s is the "
                                "same as added_tokens[%d]'s", t->what, i,
                                quote(q, sizeof q, a->pat, a->plen), old);
            goto out;
        }
        if (a->normalized && t->n_norm > 0) {
            t->dec_off[a->id] = pat_off[i];
            t->dec_len[a->id] = (uint32_t)a->plen;
        }
    }
    /* HF skips a token in decode when its decode string is a special token's content. */
    for (uint32_t i = 0; i < t->n_added; i++) {
        const struct tk_added *a = &t->added[i];
        int32_t k = trie_find(&seen, t->arena + t->dec_off[a->id], t->dec_len[a->id]);
        if (k >= 0 && t->added[k].special)
            t->id_flags[a->id] |= TK_ID_SPECIAL;
    }
    /* Added tokens past the model vocab, by content (unique: checked above). */
    int32_t da, db;
    if ((st = tk_strmap_build(&t->added_map, t, t->tok_off, t->tok_len, t->n_model,
                              t->n_ids - t->n_model, &da, &db, err)) != MMRT_OK)
        goto out;
out:
    tk_trie_free(&seen);
    tk_buf_free(&nb[0]);
    tk_buf_free(&nb[1]);
    free(pat_off);
    return st;
}

/* ---- pre-tokenizers -------------------------------------------------------------------- */

static mmrt_status get_prepend_scheme(const struct mmrt_tokenizer *t, const json_t *j,
                                      const char *path, enum tk_prepend *out,
                                      struct mmrt_error *err)
{
    const char *s;
    size_t n;
    mmrt_status st = get_str(t, j, "prepend_scheme", path, false, &s, &n, err);
    if (st != MMRT_OK)
        return st;
    bool aps = true, have_aps = json_object_get(j, "add_prefix_space") &&
                               !json_is_null(json_object_get(j, "add_prefix_space"));
    if ((st = get_bool(t, j, "add_prefix_space", path, true, &aps, err)) != MMRT_OK)
        return st;
    *out = TK_PREPEND_ALWAYS; /* HF's default */
    if (s) {
        if (strcmp(s, "first") == 0)
            *out = TK_PREPEND_FIRST;
        else if (strcmp(s, "always") == 0)
            *out = TK_PREPEND_ALWAYS;
        else if (strcmp(s, "never") == 0)
            *out = TK_PREPEND_NEVER;
        else
            return mmrt_error_set(err, MMRT_ERR_FORMAT, "%s: %s: prepend_scheme \"%s\" is not "
                                  "first, always or never", t->what, path, s);
    }
    if (have_aps && !aps) {
        /* The older field; HF refuses a contradiction. */
        if (s && *out != TK_PREPEND_NEVER)
            return fmt_err(t, MMRT_ERR_FORMAT, err, path,
                           "add_prefix_space does not match prepend_scheme");
        *out = TK_PREPEND_NEVER;
    }
    return MMRT_OK;
}

static mmrt_status parse_pre(struct mmrt_tokenizer *t, const json_t *j, const char *path,
                             int depth, struct mmrt_error *err)
{
    if (!j || json_is_null(j))
        return MMRT_OK;
    const char *type;
    mmrt_status st = get_type(t, j, path, &type, err);
    if (st != MMRT_OK)
        return st;
    if (strcmp(type, "Sequence") == 0)
        return parse_sequence(t, j, path, depth, "pretokenizers", parse_pre, err);
    if (t->n_pre == TK_MAX_STEPS)
        return fmt_err(t, MMRT_ERR_LIMIT, err, path, "too many pre-tokenizers");
    struct tk_pre *p = &t->pre[t->n_pre++]; /* counted at once: destroy frees p->re/str */
    memset(p, 0, sizeof *p);
    if (strcmp(type, "Split") == 0) {
        p->kind = TK_PRE_SPLIT;
        const char *s;
        size_t sl;
        bool re;
        if ((st = get_pattern(t, j, path, true, &s, &sl, &re, err)) != MMRT_OK)
            return st;
        if (re) {
            if ((st = compile_re(t, s, sl, path, &p->re, err)) != MMRT_OK)
                return st;
        } else {
            if (!(p->str = dup_bytes(s, sl)))
                return no_mem(err);
            p->slen = sl;
        }
        const char *b;
        if ((st = get_str(t, j, "behavior", path, true, &b, &sl, err)) != MMRT_OK)
            return st;
        static const char *const names[] = {"Removed", "Isolated", "MergedWithPrevious",
                                            "MergedWithNext", "Contiguous"};
        size_t k = 0;
        while (k < 5 && strcmp(b, names[k]) != 0)
            k++;
        if (k == 5)
            return mmrt_error_set(err, MMRT_ERR_FORMAT, "%s: %s: behavior \"%s\" is not one of "
                                  "Removed, Isolated, MergedWithPrevious, MergedWithNext, "
                                  "Contiguous", t->what, path, b);
        p->behavior = (enum tk_split_behavior)k;
        return get_bool(t, j, "invert", path, false, &p->invert, err);
    }
    if (strcmp(type, "ByteLevel") == 0) {
        p->kind = TK_PRE_BYTELEVEL;
        if ((st = get_bool(t, j, "add_prefix_space", path, true, &p->add_prefix_space, err)) !=
                MMRT_OK ||
            (st = get_bool(t, j, "use_regex", path, true, &p->use_regex, err)) != MMRT_OK)
            return st;
        if (p->use_regex && !t->gpt2_re &&
            (st = compile_re(t, GPT2_PAT, sizeof GPT2_PAT - 1, path, &t->gpt2_re, err)) !=
                MMRT_OK)
            return st;
        return MMRT_OK;
    }
    if (strcmp(type, "Metaspace") == 0) {
        p->kind = TK_PRE_METASPACE;
        uint32_t cp;
        if ((st = get_char(t, j, "replacement", path, &cp, err)) != MMRT_OK ||
            (st = get_prepend_scheme(t, j, path, &p->scheme, err)) != MMRT_OK ||
            (st = get_bool(t, j, "split", path, true, &p->split, err)) != MMRT_OK)
            return st;
        p->rlen = tk_utf8_encode(cp, p->repl);
        return MMRT_OK;
    }
    t->n_pre--; /* nothing allocated for an unknown type */
    return mmrt_error_set(err, MMRT_ERR_UNSUPPORTED, "%s: %s: pre_tokenizer type \"%s\" is not "
                          "supported (Sequence, Split, ByteLevel, Metaspace)", t->what, path, type);
}

/* ---- decoders -------------------------------------------------------------------------- */

static mmrt_status parse_dec(struct mmrt_tokenizer *t, const json_t *j, const char *path,
                             int depth, struct mmrt_error *err)
{
    if (!j || json_is_null(j))
        return MMRT_OK;
    const char *type;
    mmrt_status st = get_type(t, j, path, &type, err);
    if (st != MMRT_OK)
        return st;
    t->has_decoder = true;
    if (strcmp(type, "Sequence") == 0)
        return parse_sequence(t, j, path, depth, "decoders", parse_dec, err);
    if (t->n_dec == TK_MAX_STEPS)
        return fmt_err(t, MMRT_ERR_LIMIT, err, path, "too many decoders");
    struct tk_dec *d = &t->dec[t->n_dec++]; /* counted at once: destroy frees d->a/b */
    memset(d, 0, sizeof *d);
    const char *s;
    size_t sl;
    if (strcmp(type, "Replace") == 0) {
        bool re;
        d->kind = TK_DEC_REPLACE;
        if ((st = get_pattern(t, j, path, false, &s, &sl, &re, err)) != MMRT_OK)
            return st;
        if (!(d->a = dup_bytes(s, sl)))
            return no_mem(err);
        d->alen = sl;
        if ((st = get_str(t, j, "content", path, true, &s, &sl, err)) != MMRT_OK)
            return st;
        if (!(d->b = dup_bytes(s, sl)))
            return no_mem(err);
        d->blen = sl;
        return MMRT_OK;
    }
    if (strcmp(type, "ByteFallback") == 0) {
        d->kind = TK_DEC_BYTEFALLBACK;
    } else if (strcmp(type, "Fuse") == 0) {
        d->kind = TK_DEC_FUSE;
    } else if (strcmp(type, "Strip") == 0) {
        d->kind = TK_DEC_STRIP;
        long long a, b;
        char what[300];
        snprintf(what, sizeof what, "%s: %s", t->what, path);
        if ((st = get_char(t, j, "content", path, &d->cp, err)) != MMRT_OK ||
            (st = mmrt_json_get_int(j, "start", what, 0, 1 << 20, &a, err)) != MMRT_OK ||
            (st = mmrt_json_get_int(j, "stop", what, 0, 1 << 20, &b, err)) != MMRT_OK)
            return st;
        d->start = (size_t)a;
        d->stop = (size_t)b;
    } else if (strcmp(type, "ByteLevel") == 0) {
        d->kind = TK_DEC_BYTELEVEL;
    } else if (strcmp(type, "Metaspace") == 0) {
        d->kind = TK_DEC_METASPACE;
        if ((st = get_char(t, j, "replacement", path, &d->cp, err)) != MMRT_OK ||
            (st = get_prepend_scheme(t, j, path, &d->scheme, err)) != MMRT_OK)
            return st;
    } else {
        t->n_dec--;
        return mmrt_error_set(err, MMRT_ERR_UNSUPPORTED, "%s: %s: decoder type \"%s\" is not "
                              "supported (Sequence, Replace, ByteFallback, Fuse, Strip, "
                              "ByteLevel, Metaspace)", t->what, path, type);
    }
    return MMRT_OK;
}

/* ---- post-processor -------------------------------------------------------------------- */

static mmrt_status push_tmpl(int32_t **arr, size_t *n, const json_t *ids, struct mmrt_error *err)
{
    size_t k = json_array_size(ids);
    int32_t *p = realloc(*arr, (*n + k + 1) * sizeof *p);
    if (!p)
        return no_mem(err);
    *arr = p;
    for (size_t i = 0; i < k; i++)
        p[(*n)++] = (int32_t)json_integer_value(json_array_get(ids, i));
    return MMRT_OK;
}

static mmrt_status parse_template(struct mmrt_tokenizer *t, const json_t *j, const char *path,
                                  struct mmrt_error *err)
{
    const json_t *single = json_object_get(j, "single");
    const json_t *specials = json_object_get(j, "special_tokens");
    if (!json_is_array(single))
        return fmt_err(t, MMRT_ERR_FORMAT, err, path, "\"single\" must be an array");
    if (specials && !json_is_null(specials) && !json_is_object(specials))
        return fmt_err(t, MMRT_ERR_FORMAT, err, path, "\"special_tokens\" must be an object");
    /* A Sequence-of-processors may hold several templates; like HF, each applies in turn,
     * so their ids accumulate around the sequence. */
    int32_t *pre = NULL, *suf = NULL;
    size_t npre = 0, nsuf = 0, nseq = 0;
    mmrt_status st = MMRT_OK;
    for (size_t i = 0; i < json_array_size(single); i++) {
        const json_t *piece = json_array_get(single, i);
        char sub[300];
        snprintf(sub, sizeof sub, "%s.single[%zu]", path, i);
        const json_t *seq = json_object_get(piece, "Sequence");
        const json_t *sp = json_object_get(piece, "SpecialToken");
        if (!json_is_object(piece) || json_object_size(piece) != 1 ||
            (!json_is_object(seq) && !json_is_object(sp))) {
            st = fmt_err(t, MMRT_ERR_FORMAT, err, sub,
                         "must be {\"Sequence\": …} or {\"SpecialToken\": …}");
            goto out;
        }
        if (seq) {
            const char *sid;
            size_t sl;
            if ((st = get_str(t, seq, "id", sub, true, &sid, &sl, err)) != MMRT_OK)
                goto out;
            if (strcmp(sid, "A") != 0) {
                st = fmt_err(t, MMRT_ERR_FORMAT, err, sub,
                             "a single-sequence template can only hold sequence \"A\"");
                goto out;
            }
            nseq++;
            continue;
        }
        const char *name;
        size_t nl;
        if ((st = get_str(t, sp, "id", sub, true, &name, &nl, err)) != MMRT_OK)
            goto out;
        const json_t *tok = specials ? json_object_get(specials, name) : NULL;
        const json_t *ids = tok ? json_object_get(tok, "ids") : NULL;
        if (!json_is_array(ids)) {
            st = mmrt_error_set(err, MMRT_ERR_FORMAT, "%s: %s: special token \"%s\" is not in "
                                "special_tokens (with an \"ids\" array)", t->what, sub, name);
            goto out;
        }
        for (size_t k = 0; k < json_array_size(ids); k++) {
            const json_t *v = json_array_get(ids, k);
            if (!json_is_integer(v) || json_integer_value(v) < 0 ||
                json_integer_value(v) >= (json_int_t)t->n_ids) {
                st = mmrt_error_set(err, MMRT_ERR_FORMAT, "%s: %s.special_tokens[\"%s\"].ids[%zu]"
                                    " is not a token id (vocabulary has %u)", t->what, path,
                                    name, k, t->n_ids);
                goto out;
            }
        }
        if ((st = push_tmpl(nseq ? &suf : &pre, nseq ? &nsuf : &npre, ids, err)) != MMRT_OK)
            goto out;
    }
    if (nseq != 1) {
        st = fmt_err(t, MMRT_ERR_FORMAT, err, path, "\"single\" must hold \"$A\" exactly once");
        goto out;
    }
    /* New prefix goes outside the existing one (later processors wrap earlier results). */
    int32_t *np = malloc((npre + t->n_tmpl_prefix + 1) * sizeof *np);
    int32_t *ns = malloc((nsuf + t->n_tmpl_suffix + 1) * sizeof *ns);
    if (!np || !ns) {
        free(np);
        free(ns);
        st = no_mem(err);
        goto out;
    }
    if (npre)
        memcpy(np, pre, npre * sizeof *np);
    if (t->n_tmpl_prefix)
        memcpy(np + npre, t->tmpl_prefix, t->n_tmpl_prefix * sizeof *np);
    if (t->n_tmpl_suffix)
        memcpy(ns, t->tmpl_suffix, t->n_tmpl_suffix * sizeof *ns);
    if (nsuf)
        memcpy(ns + t->n_tmpl_suffix, suf, nsuf * sizeof *ns);
    free(t->tmpl_prefix);
    free(t->tmpl_suffix);
    t->tmpl_prefix = np;
    t->tmpl_suffix = ns;
    t->n_tmpl_prefix += npre;
    t->n_tmpl_suffix += nsuf;
out:
    free(pre);
    free(suf);
    return st;
}

static mmrt_status parse_post(struct mmrt_tokenizer *t, const json_t *j, const char *path,
                              int depth, struct mmrt_error *err)
{
    if (!j || json_is_null(j))
        return MMRT_OK;
    const char *type;
    mmrt_status st = get_type(t, j, path, &type, err);
    if (st != MMRT_OK)
        return st;
    if (strcmp(type, "Sequence") == 0)
        return parse_sequence(t, j, path, depth, "processors", parse_post, err);
    if (strcmp(type, "TemplateProcessing") == 0)
        return parse_template(t, j, path, err);
    if (strcmp(type, "ByteLevel") == 0)
        return MMRT_OK; /* only trims offsets; ids are untouched */
    return mmrt_error_set(err, MMRT_ERR_UNSUPPORTED, "%s: %s: post_processor type \"%s\" is not "
                          "supported (Sequence, TemplateProcessing, ByteLevel)", t->what, path,
                          type);
}

/* ---- load ------------------------------------------------------------------------------ */

mmrt_status mmrt_tokenizer_load_json(const json_t *root, const char *what,
                                     const struct mmrt_tokenizer_limits *limits,
                                     struct mmrt_tokenizer **out, struct mmrt_error *err)
{
    struct limits lim = get_limits(limits);
    if (!what)
        what = "tokenizer.json";
    if (!root || !json_is_object(root))
        return mmrt_error_set(err, MMRT_ERR_FORMAT, "%s: the top level must be an object", what);
    mmrt_status st = MMRT_OK;
    struct mmrt_tokenizer *t = calloc(1, sizeof *t);
    if (!t)
        return no_mem(err);
    t->unk_id = -1;
    t->max_input_bytes = lim.max_input;
    if (!(t->what = dup_bytes(what, strlen(what)))) {
        st = no_mem(err);
        goto fail;
    }
    const char *version;
    size_t vl;
    if ((st = get_str(t, root, "version", "top level", false, &version, &vl, err)) != MMRT_OK)
        goto fail;
    if (version && strcmp(version, "1.0") != 0) {
        st = mmrt_error_set(err, MMRT_ERR_UNSUPPORTED, "%s: version \"%s\" is not supported "
                            "(1.0)", t->what, version);
        goto fail;
    }
    if ((st = parse_model(t, &lim, root, err)) != MMRT_OK ||
        (st = parse_norm(t, json_object_get(root, "normalizer"), "normalizer", 0, err)) !=
            MMRT_OK ||
        (st = parse_added(t, &lim, root, err)) != MMRT_OK ||
        (st = parse_pre(t, json_object_get(root, "pre_tokenizer"), "pre_tokenizer", 0, err)) !=
            MMRT_OK ||
        (st = parse_dec(t, json_object_get(root, "decoder"), "decoder", 0, err)) != MMRT_OK ||
        (st = tk_decoder_check(t, err)) != MMRT_OK ||
        (st = parse_post(t, json_object_get(root, "post_processor"), "post_processor", 0,
                         err)) != MMRT_OK ||
        (st = check_byte_tokens(t, err)) != MMRT_OK)
        goto fail;
    tk_bytelevel_tables(t);
    if (t->gctx) { /* some regex was compiled */
        t->mctx = pcre2_match_context_create(t->gctx);
        if (!t->mctx) {
            st = no_mem(err);
            goto fail;
        }
        /* Bounds for hostile patterns on long inputs; far above what real ones need. */
        pcre2_set_match_limit(t->mctx, 50000000);
        pcre2_set_depth_limit(t->mctx, 1000000);
        pcre2_set_heap_limit(t->mctx, 256 * 1024); /* KiB */
    }
    *out = t;
    return MMRT_OK;
fail:
    mmrt_tokenizer_destroy(t);
    return st;
}

mmrt_status mmrt_tokenizer_load(const char *path, const struct mmrt_tokenizer_limits *limits,
                                struct mmrt_tokenizer **out, struct mmrt_error *err)
{
    struct limits lim = get_limits(limits);
    json_t *root = NULL;
    mmrt_status st = mmrt_json_load_file(path, lim.max_file, MMRT_JSON_DEFAULT_MAX_DEPTH, &root,
                                         err);
    if (st != MMRT_OK)
        return st;
    st = mmrt_tokenizer_load_json(root, path, limits, out, err);
    json_decref(root);
    return st;
}

void mmrt_tokenizer_destroy(struct mmrt_tokenizer *t)
{
    if (!t)
        return;
    for (int i = 0; i < t->n_norm; i++) {
        free(t->norm[i].a);
        free(t->norm[i].b);
    }
    for (int i = 0; i < t->n_pre; i++) {
        pcre2_code_free(t->pre[i].re);
        free(t->pre[i].str);
    }
    for (int i = 0; i < t->n_dec; i++) {
        free(t->dec[i].a);
        free(t->dec[i].b);
    }
    pcre2_code_free(t->gpt2_re);
    pcre2_match_context_free(t->mctx);
    pcre2_general_context_free(t->gctx); /* after everything PCRE2 allocated with it */
    free(t->tmpl_prefix);
    free(t->tmpl_suffix);
    tk_trie_free(&t->trie_raw);
    tk_trie_free(&t->trie_norm);
    tk_trie_free(&t->pieces);
    free(t->added);
    free(t->score);
    tk_pairmap_free(&t->merges);
    tk_strmap_free(&t->model_map);
    tk_strmap_free(&t->added_map);
    free(t->id_flags);
    free(t->dec_off);
    free(t->dec_len);
    free(t->tok_off);
    free(t->tok_len);
    free(t->arena);
    free(t->what);
    free(t);
}

/* ---- lookups --------------------------------------------------------------------------- */

uint32_t mmrt_tokenizer_vocab_size(const struct mmrt_tokenizer *t)
{
    return t ? t->n_ids : 0;
}

int32_t mmrt_tokenizer_token_to_id(const struct mmrt_tokenizer *t, const char *token,
                                   size_t len)
{
    if (!t || !token)
        return -1;
    /* HF looks at added tokens first; an added token whose string is in the vocab has the
     * vocab's id, so the two maps never disagree and the order does not matter. */
    int32_t id = tk_model_lookup(t, token, len);
    if (id >= 0)
        return id;
    return tk_strmap_get(&t->added_map, t, t->tok_off, t->tok_len, token, len);
}

const char *mmrt_tokenizer_id_to_token(const struct mmrt_tokenizer *t, int32_t id, size_t *len)
{
    if (!t || id < 0 || (uint32_t)id >= t->n_ids)
        return NULL;
    size_t n;
    const char *s = tk_tok(t, (uint32_t)id, &n);
    if (len)
        *len = n;
    return s;
}

bool mmrt_tokenizer_is_special(const struct mmrt_tokenizer *t, int32_t id)
{
    return t && id >= 0 && (uint32_t)id < t->n_ids && (t->id_flags[id] & TK_ID_SPECIAL);
}

void mmrt_tokenizer_template(const struct mmrt_tokenizer *t, const int32_t **prefix,
                             size_t *n_prefix, const int32_t **suffix, size_t *n_suffix)
{
    if (prefix)
        *prefix = t->tmpl_prefix;
    if (n_prefix)
        *n_prefix = t->n_tmpl_prefix;
    if (suffix)
        *suffix = t->tmpl_suffix;
    if (n_suffix)
        *n_suffix = t->n_tmpl_suffix;
}

int32_t mmrt_tokenizer_bos_id(const struct mmrt_tokenizer *t)
{
    return t && t->n_tmpl_prefix ? t->tmpl_prefix[0] : -1;
}
