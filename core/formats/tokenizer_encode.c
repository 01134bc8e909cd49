/*
 * core/formats/tokenizer_encode.c — text to ids (see tokenizer.h for the pipeline).
 *
 * Per call: the raw text is cut into spans by the raw added-token trie (HF's find_matches:
 * leftmost-longest, then single_word / lstrip / rstrip); each text span is normalized and cut
 * again by the normalized-token trie; each remaining text span becomes a list of pieces
 * (pre-tokenizer steps map piece lists to piece lists, in two arenas used alternately);
 * each piece goes through the model. All scratch lives in one `struct enc` and is freed
 * at the end, so the tokenizer itself is never written.
 *
 * Sources (read, not copied): huggingface/tokenizers — tokenizer/added_vocabulary.rs
 * (find_matches), tokenizer/normalizer.rs (split behaviours), tokenizer/pattern.rs and
 * utils/onig.rs (match iteration), pre_tokenizers/{split,byte_level,metaspace}.rs.
 */
#include "tokenizer_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static mmrt_status no_mem(struct mmrt_error *err)
{
    return mmrt_error_set(err, MMRT_ERR_NO_MEMORY, "tokenizer: out of memory");
}

/* A piece of pre-tokenized text: bytes [off, off + len) of an arena; `first` = it starts at
 * offset 0 of the original input (Metaspace's prepend_scheme "first"). */
struct piece {
    size_t off, len;
    bool first;
};

struct pieces {
    struct piece *p;
    size_t n, cap;
    struct tk_buf text;
};

/* A span of the input (or of a normalized segment): text, or an added token. */
struct span {
    size_t a, b;
    int32_t id; /* -1 = text */
};

struct spans {
    struct span *p;
    size_t n, cap;
};

/* A stretch of a piece, inside a match of the split pattern or not. */
struct rng {
    size_t a, b;
    bool m;
};

struct enc {
    const struct mmrt_tokenizer *t;
    unsigned flags;
    struct tk_ids ids;
    struct tk_work w;
    struct tk_buf nb[2];
    struct spans raw, sub;
    struct pieces pc[2];
    struct rng *rng; /* match ranges of the current piece */
    size_t n_rng, cap_rng;
    pcre2_match_data *md;
};

static mmrt_status span_push(struct spans *s, size_t a, size_t b, int32_t id,
                             struct mmrt_error *err)
{
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 16;
        struct span *p = realloc(s->p, cap * sizeof *p);
        if (!p)
            return no_mem(err);
        s->p = p;
        s->cap = cap;
    }
    s->p[s->n++] = (struct span){a, b, id};
    return MMRT_OK;
}

static mmrt_status piece_push(struct pieces *ps, const char *s, size_t n, bool first,
                              struct mmrt_error *err)
{
    if (n == 0)
        return MMRT_OK; /* HF drops empty splits */
    if (ps->n == ps->cap) {
        size_t cap = ps->cap ? ps->cap * 2 : 16;
        struct piece *p = realloc(ps->p, cap * sizeof *p);
        if (!p)
            return no_mem(err);
        ps->p = p;
        ps->cap = cap;
    }
    size_t off = ps->text.n;
    mmrt_status st = tk_buf_put(&ps->text, s, n, err);
    if (st != MMRT_OK)
        return st;
    ps->p[ps->n++] = (struct piece){off, n, first};
    return MMRT_OK;
}

/* Start of the run of White_Space characters that ends at `end`, not before `floor`. */
static size_t ws_before(const char *s, size_t floor, size_t end)
{
    size_t i = end;
    while (i > floor) {
        size_t k = i - 1;
        while (k > 0 && ((unsigned char)s[k] & 0xC0) == 0x80)
            k--;
        uint32_t cp;
        tk_utf8_decode(s + k, &cp);
        if (!tk_is_white_space(cp))
            break;
        i = k;
    }
    return i;
}

static size_t ws_after(const char *s, size_t n, size_t from)
{
    size_t i = from;
    while (i < n) {
        uint32_t cp;
        size_t l = tk_utf8_decode(s + i, &cp);
        if (!tk_is_white_space(cp))
            break;
        i += l;
    }
    return i;
}

static bool word_before(const char *s, size_t at)
{
    if (at == 0)
        return false;
    size_t k = at - 1;
    while (k > 0 && ((unsigned char)s[k] & 0xC0) == 0x80)
        k--;
    uint32_t cp;
    tk_utf8_decode(s + k, &cp);
    return tk_is_word_char(cp);
}

static bool word_after(const char *s, size_t n, size_t at)
{
    if (at >= n)
        return false;
    uint32_t cp;
    tk_utf8_decode(s + at, &cp);
    return tk_is_word_char(cp);
}

/* HF's AddedVocabulary::find_matches over s[0, n) with one trie: leftmost-longest matches,
 * then single_word / lstrip / rstrip. Spans are relative to s. */
static mmrt_status split_added(struct enc *e, const struct tk_trie *trie, const char *s,
                               size_t n, struct spans *out, struct mmrt_error *err)
{
    const struct mmrt_tokenizer *t = e->t;
    out->n = 0;
    mmrt_status st;
    size_t start_offset = 0, pos = 0;
    while (trie->n_nodes > 1 && pos < n) {
        /* Leftmost position with a match, longest match there. */
        size_t ms = 0, me = 0;
        int32_t mi = -1;
        for (size_t p = pos; p < n && mi < 0; p++) {
            uint32_t node = 0;
            for (size_t k = p; k < n; k++) {
                node = tk_trie_child(trie, node, (unsigned char)s[k]);
                if (!node)
                    break;
                if (trie->value[node] >= 0) {
                    mi = trie->value[node];
                    ms = p;
                    me = k + 1;
                }
            }
        }
        if (mi < 0)
            break;
        pos = me;
        const struct tk_added *a = &t->added[mi];
        if ((e->flags & MMRT_TOKENIZE_SPLIT_SPECIAL) && a->special)
            continue;
        if (a->single_word && (word_before(s, ms) || word_after(s, n, me)))
            continue;
        size_t start = ms, stop = me;
        if (a->lstrip) {
            /* HF: max(start of the trailing spaces, end of the previous match). */
            start = ws_before(s, start_offset, ms);
        }
        if (a->rstrip)
            stop = ws_after(s, n, me);
        if (start_offset < start && (st = span_push(out, start_offset, start, -1, err)) != MMRT_OK)
            return st;
        if ((st = span_push(out, start, stop, a->id, err)) != MMRT_OK)
            return st;
        start_offset = stop;
    }
    if (start_offset < n)
        return span_push(out, start_offset, n, -1, err);
    return MMRT_OK;
}

/* All matches of `re` in s[0, n) as HF's find_iter yields them (an empty match right after
 * the previous match is skipped), as ranges covering s with a match flag. */
static mmrt_status regex_ranges(struct enc *e, const pcre2_code *re, const char *s, size_t n,
                                struct mmrt_error *err)
{
    const struct mmrt_tokenizer *t = e->t;
    e->n_rng = 0;
    if (!e->md && !(e->md = pcre2_match_data_create(1, t->gctx)))
        return no_mem(err);
    size_t prev = 0, last_end = 0;
    bool have_last = false;
    size_t last_match_end = 0;
    while (last_end <= n) {
        uint32_t opts = PCRE2_NO_UTF_CHECK;
        int rc = pcre2_match(re, (PCRE2_SPTR)s, n, last_end, opts, e->md, t->mctx);
        if (rc == PCRE2_ERROR_JIT_STACKLIMIT)
            rc = pcre2_match(re, (PCRE2_SPTR)s, n, last_end, opts | PCRE2_NO_JIT, e->md, t->mctx);
        if (rc == PCRE2_ERROR_NOMATCH)
            break;
        if (rc < 0) {
            PCRE2_UCHAR msg[160];
            if (pcre2_get_error_message(rc, msg, sizeof msg) < 0)
                snprintf((char *)msg, sizeof msg, "error %d", rc);
            return mmrt_error_set(err, rc == PCRE2_ERROR_NOMEMORY ? MMRT_ERR_NO_MEMORY :
                                  MMRT_ERR_LIMIT, "%s: pre_tokenizer regex failed at byte %zu of "
                                  "a %zu-byte piece: %s", t->what, last_end, n,
                                  (const char *)msg);
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(e->md);
        size_t ms = ov[0], me = ov[1];
        if (me < ms)
            me = ms; /* \K tricks; not in real patterns */
        if (ms == me && have_last && last_match_end == me) {
            size_t l = last_end < n ? tk_utf8_seq((const unsigned char *)s + last_end,
                                                  n - last_end) : 1;
            last_end += l ? l : 1;
            continue;
        }
        last_end = me;
        have_last = true;
        last_match_end = me;
        if (e->n_rng + 2 > e->cap_rng) {
            size_t cap = e->cap_rng ? e->cap_rng * 2 : 64;
            void *p = realloc(e->rng, cap * sizeof *e->rng);
            if (!p)
                return no_mem(err);
            e->rng = p;
            e->cap_rng = cap;
        }
        if (prev != ms)
            e->rng[e->n_rng++] = (struct rng){prev, ms, false};
        e->rng[e->n_rng++] = (struct rng){ms, me, true};
        prev = me;
        if (ms == me && me == n)
            break;
    }
    if (prev != n) {
        if (e->n_rng + 1 > e->cap_rng) {
            size_t cap = e->cap_rng ? e->cap_rng * 2 : 64;
            void *p = realloc(e->rng, cap * sizeof *e->rng);
            if (!p)
                return no_mem(err);
            e->rng = p;
            e->cap_rng = cap;
        }
        e->rng[e->n_rng++] = (struct rng){prev, n, false};
    }
    return MMRT_OK;
}

/* Literal pattern occurrences as ranges (regex-escaped string in HF: same result). */
static mmrt_status string_ranges(struct enc *e, const char *pat, size_t pl, const char *s,
                                 size_t n, struct mmrt_error *err)
{
    e->n_rng = 0;
    size_t i = 0;
    for (;;) {
        const char *hit = pl <= n - i ? memmem(s + i, n - i, pat, pl) : NULL;
        size_t at = hit ? (size_t)(hit - s) : n;
        if (e->n_rng + 2 > e->cap_rng) {
            size_t cap = e->cap_rng ? e->cap_rng * 2 : 64;
            void *p = realloc(e->rng, cap * sizeof *e->rng);
            if (!p)
                return no_mem(err);
            e->rng = p;
            e->cap_rng = cap;
        }
        if (at > i)
            e->rng[e->n_rng++] = (struct rng){i, at, false};
        if (!hit)
            break;
        e->rng[e->n_rng++] = (struct rng){at, at + pl, true};
        i = at + pl;
    }
    return MMRT_OK;
}

/* Cuts piece `src` (text s) along e->rng by `behavior`, appending to dst. */
static mmrt_status split_by(struct enc *e, const char *s, bool first,
                            enum tk_split_behavior behavior, bool invert, struct pieces *dst,
                            struct mmrt_error *err)
{
    mmrt_status st;
    size_t n = e->n_rng;
    for (size_t i = 0; i < n; i++)
        e->rng[i].m ^= invert;
    /* Merge in place per HF's folds; out ranges are written back into rng[0..k). */
    size_t k = 0;
    bool prev_m = false;
    switch (behavior) {
    case TK_SPLIT_ISOLATED:
        k = n;
        break;
    case TK_SPLIT_REMOVED:
        for (size_t i = 0; i < n; i++)
            if (!e->rng[i].m)
                e->rng[k++] = e->rng[i];
        break;
    case TK_SPLIT_CONTIGUOUS:
        for (size_t i = 0; i < n; i++) {
            bool m = e->rng[i].m;
            if (k > 0 && m == prev_m)
                e->rng[k - 1].b = e->rng[i].b;
            else
                e->rng[k++] = e->rng[i];
            prev_m = m;
        }
        break;
    case TK_SPLIT_MERGED_PREV:
        for (size_t i = 0; i < n; i++) {
            bool m = e->rng[i].m;
            if (m && !prev_m && k > 0)
                e->rng[k - 1].b = e->rng[i].b;
            else
                e->rng[k++] = e->rng[i];
            prev_m = m;
        }
        break;
    case TK_SPLIT_MERGED_NEXT:
        /* Fold from the right: a match joins the range after it. */
        {
            size_t w = n;
            for (size_t i = n; i-- > 0;) {
                bool m = e->rng[i].m;
                if (m && !prev_m && w < n)
                    e->rng[w].a = e->rng[i].a;
                else
                    e->rng[--w] = e->rng[i];
                prev_m = m;
            }
            memmove(e->rng, e->rng + w, (n - w) * sizeof *e->rng);
            k = n - w;
        }
        break;
    }
    for (size_t i = 0; i < k; i++) {
        st = piece_push(dst, s + e->rng[i].a, e->rng[i].b - e->rng[i].a,
                        first && e->rng[i].a == 0, err);
        if (st != MMRT_OK)
            return st;
    }
    return MMRT_OK;
}

static mmrt_status pre_step(struct enc *e, const struct tk_pre *p, struct pieces *src,
                            struct pieces *dst, struct mmrt_error *err)
{
    const struct mmrt_tokenizer *t = e->t;
    mmrt_status st = MMRT_OK;
    dst->n = 0;
    dst->text.n = 0;
    for (size_t i = 0; i < src->n && st == MMRT_OK; i++) {
        const char *s = src->text.p + src->p[i].off;
        size_t n = src->p[i].len;
        bool first = src->p[i].first;
        switch (p->kind) {
        case TK_PRE_SPLIT:
            st = p->re ? regex_ranges(e, p->re, s, n, err)
                       : string_ranges(e, p->str, p->slen, s, n, err);
            if (st == MMRT_OK)
                st = split_by(e, s, first, p->behavior, p->invert, dst, err);
            break;
        case TK_PRE_BYTELEVEL: {
            /* Prefix space and regex split here; the byte mapping runs after the loop, on
             * every piece, as HF's normalize() pass does. */
            struct tk_buf *tmp = &e->nb[0];
            tmp->n = 0;
            if (p->add_prefix_space && s[0] != ' ' &&
                (st = tk_buf_put(tmp, " ", 1, err)) != MMRT_OK)
                break;
            if ((st = tk_buf_put(tmp, s, n, err)) != MMRT_OK)
                break;
            if (p->use_regex) {
                st = regex_ranges(e, t->gpt2_re, tmp->p, tmp->n, err);
                if (st == MMRT_OK)
                    st = split_by(e, tmp->p, first, TK_SPLIT_ISOLATED, false, dst, err);
            } else {
                st = piece_push(dst, tmp->p, tmp->n, first, err);
            }
            break;
        }
        case TK_PRE_METASPACE: {
            struct tk_buf *tmp = &e->nb[1];
            tmp->n = 0;
            bool starts = n >= p->rlen && memcmp(s, p->repl, p->rlen) == 0;
            /* After the space replacement, the piece starts with the replacement iff it
             * started with it or with a space. */
            bool has = starts || s[0] == ' ';
            if (!has && (p->scheme == TK_PREPEND_ALWAYS ||
                         (p->scheme == TK_PREPEND_FIRST && first)))
                st = tk_buf_put(tmp, p->repl, p->rlen, err);
            for (size_t k = 0; k < n && st == MMRT_OK; k++)
                st = s[k] == ' ' ? tk_buf_put(tmp, p->repl, p->rlen, err)
                                 : tk_buf_put(tmp, s + k, 1, err);
            if (st != MMRT_OK)
                break;
            if (p->split) {
                st = string_ranges(e, p->repl, p->rlen, tmp->p, tmp->n, err);
                if (st == MMRT_OK)
                    st = split_by(e, tmp->p, first, TK_SPLIT_MERGED_NEXT, false, dst, err);
            } else {
                st = piece_push(dst, tmp->p, tmp->n, first, err);
            }
            break;
        }
        }
    }
    if (st == MMRT_OK && p->kind == TK_PRE_BYTELEVEL) {
        /* Map every byte to its GPT-2 character (in src, then swap back into dst). */
        src->n = 0;
        src->text.n = 0;
        for (size_t i = 0; i < dst->n && st == MMRT_OK; i++) {
            const unsigned char *s = (const unsigned char *)dst->text.p + dst->p[i].off;
            struct tk_buf *tmp = &e->nb[0];
            tmp->n = 0;
            if ((st = tk_buf_reserve(tmp, 2 * dst->p[i].len, err)) != MMRT_OK)
                break;
            for (size_t k = 0; k < dst->p[i].len; k++) {
                memcpy(tmp->p + tmp->n, t->bl_enc[s[k]], t->bl_enc_len[s[k]]);
                tmp->n += t->bl_enc_len[s[k]];
            }
            st = piece_push(src, tmp->p, tmp->n, dst->p[i].first, err);
        }
        if (st == MMRT_OK) {
            struct pieces x = *src;
            *src = *dst;
            *dst = x;
        }
    }
    return st;
}

/* Pre-tokenizes and models one normalized segment. */
static mmrt_status encode_segment(struct enc *e, const char *s, size_t n, bool first,
                                  struct mmrt_error *err)
{
    const struct mmrt_tokenizer *t = e->t;
    mmrt_status st;
    struct pieces *cur = &e->pc[0], *nxt = &e->pc[1];
    cur->n = 0;
    cur->text.n = 0;
    if ((st = piece_push(cur, s, n, first, err)) != MMRT_OK)
        return st;
    for (int i = 0; i < t->n_pre; i++) {
        if ((st = pre_step(e, &t->pre[i], cur, nxt, err)) != MMRT_OK)
            return st;
        struct pieces *x = cur;
        cur = nxt;
        nxt = x;
    }
    for (size_t i = 0; i < cur->n; i++) {
        const char *p = cur->text.p + cur->p[i].off;
        st = t->model == TK_MODEL_BPE ? tk_bpe_encode(t, p, cur->p[i].len, &e->w, &e->ids, err)
                                      : tk_unigram_encode(t, p, cur->p[i].len, &e->w, &e->ids,
                                                          err);
        if (st != MMRT_OK)
            return st;
    }
    return MMRT_OK;
}

static void enc_free(struct enc *e)
{
    free(e->ids.p);
    tk_work_free(&e->w);
    tk_buf_free(&e->nb[0]);
    tk_buf_free(&e->nb[1]);
    free(e->raw.p);
    free(e->sub.p);
    for (int i = 0; i < 2; i++) {
        free(e->pc[i].p);
        tk_buf_free(&e->pc[i].text);
    }
    free(e->rng);
    pcre2_match_data_free(e->md);
}

mmrt_status mmrt_tokenizer_encode(const struct mmrt_tokenizer *t, const char *text,
                                  size_t len, unsigned flags, int32_t **ids, size_t *n_ids,
                                  struct mmrt_error *err)
{
    if (!t || (!text && len) || !ids || !n_ids)
        return mmrt_error_set(err, MMRT_ERR_INVALID_ARG, "tokenizer encode: NULL argument");
    if (len > t->max_input_bytes)
        return mmrt_error_set(err, MMRT_ERR_LIMIT, "%s: input of %zu bytes is longer than the "
                              "%zu allowed", t->what, len, t->max_input_bytes);
    size_t bad;
    if (len && !tk_utf8_valid(text, len, &bad))
        return mmrt_error_set(err, MMRT_ERR_INVALID_ARG, "%s: input is not valid UTF-8 at byte "
                              "%zu", t->what, bad);
    struct enc e = {.t = t, .flags = flags};
    struct tk_buf seg = {0};
    mmrt_status st = MMRT_OK;
    if (flags & MMRT_TOKENIZE_ADD_SPECIAL)
        for (size_t i = 0; i < t->n_tmpl_prefix && st == MMRT_OK; i++)
            st = tk_ids_push(&e.ids, t->tmpl_prefix[i], err);
    if (st != MMRT_OK)
        goto out;
    if ((st = split_added(&e, &t->trie_raw, text, len, &e.raw, err)) != MMRT_OK)
        goto out;
    for (size_t i = 0; i < e.raw.n; i++) {
        const struct span *r = &e.raw.p[i];
        if (r->id >= 0) {
            if ((st = tk_ids_push(&e.ids, r->id, err)) != MMRT_OK)
                goto out;
            continue;
        }
        const char *ns;
        size_t nn;
        if ((st = tk_normalize(t, text + r->a, r->b - r->a, e.nb, &ns, &nn, err)) != MMRT_OK)
            goto out;
        /* Keep the normalized segment apart: nb[] is scratch for the steps below. */
        seg.n = 0;
        if ((st = tk_buf_put(&seg, ns, nn, err)) != MMRT_OK)
            goto out;
        if ((st = split_added(&e, &t->trie_norm, seg.p, seg.n, &e.sub, err)) != MMRT_OK)
            goto out;
        for (size_t k = 0; k < e.sub.n; k++) {
            const struct span *q = &e.sub.p[k];
            if (q->id >= 0)
                st = tk_ids_push(&e.ids, q->id, err);
            else
                st = encode_segment(&e, seg.p + q->a, q->b - q->a, r->a == 0 && q->a == 0, err);
            if (st != MMRT_OK)
                goto out;
        }
    }
    if (flags & MMRT_TOKENIZE_ADD_SPECIAL)
        for (size_t i = 0; i < t->n_tmpl_suffix && st == MMRT_OK; i++)
            st = tk_ids_push(&e.ids, t->tmpl_suffix[i], err);
    if (st != MMRT_OK)
        goto out;
    *n_ids = e.ids.n;
    *ids = e.ids.n ? e.ids.p : NULL;
    if (e.ids.n)
        e.ids.p = NULL; /* handed over */
out:
    tk_buf_free(&seg);
    enc_free(&e);
    return st;
}

