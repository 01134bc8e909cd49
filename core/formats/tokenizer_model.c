/*
 * core/formats/tokenizer_model.c — the models: one pre-tokenized piece in, ids out.
 *
 * BPE (HF tokenizers, models/bpe/model.rs + word.rs): the piece becomes a doubly linked list
 * of symbols, one per character (or one per byte with byte_fallback, or a fused <unk>); a
 * min-heap holds candidate merges ordered by (rank, position). Popping the best one, it is
 * skipped when stale (its left symbol was merged away, or the pair now there does not merge
 * to the same id), otherwise applied, and the new pairs with the neighbours are pushed.
 * O(n log n) for a piece of n characters. Quirk kept for parity: with byte_fallback, a
 * pending <unk> is only flushed by the next known character, so byte tokens can precede it.
 *
 * Unigram (models/unigram/model.rs `encode_optimized`, after SentencePiece): a Viterbi pass
 * over character positions; at each position every vocab piece that is a prefix of the rest
 * (found by walking the piece trie) relaxes the best path ending where it ends; with no
 * single-character piece there, <unk> scored (min score - 10) is used. Ties keep the first
 * candidate (shorter piece). Backtracking fuses adjacent <unk>s; a piece not in the vocab
 * (a fused unknown) becomes its <0xNN> bytes when all exist, else <unk>.
 */
#include "tokenizer_impl.h"

#include <stdlib.h>
#include <string.h>

void tk_work_free(struct tk_work *w)
{
    free(w->sym);
    free(w->heap);
    free(w->node);
    free(w->ends);
    memset(w, 0, sizeof *w);
}

static mmrt_status grow(void **p, size_t *cap, size_t need, size_t elem, struct mmrt_error *err)
{
    if (need <= *cap)
        return MMRT_OK;
    size_t n = *cap ? *cap : 64;
    while (n < need)
        n *= 2;
    if (n > SIZE_MAX / elem)
        return mmrt_error_set(err, MMRT_ERR_NO_MEMORY, "tokenizer: scratch size overflow");
    void *q = realloc(*p, n * elem);
    if (!q)
        return mmrt_error_set(err, MMRT_ERR_NO_MEMORY, "tokenizer: out of memory (%zu bytes)",
                              n * elem);
    *p = q;
    *cap = n;
    return MMRT_OK;
}

/* ---- BPE ------------------------------------------------------------------------------- */

struct symbol {
    int32_t c, prev, next; /* id; neighbours' indices or -1 */
    uint32_t len;          /* bytes covered; 0 = merged away */
};

struct merge {
    uint32_t rank, pos;
    int32_t merged;
};

static bool merge_less(const struct merge *a, const struct merge *b)
{
    return a->rank != b->rank ? a->rank < b->rank : a->pos < b->pos;
}

static void heap_push(struct merge *h, size_t *n, struct merge m)
{
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!merge_less(&m, &h[p]))
            break;
        h[i] = h[p];
        i = p;
    }
    h[i] = m;
}

static struct merge heap_pop(struct merge *h, size_t *n)
{
    struct merge top = h[0], last = h[--*n];
    size_t i = 0;
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        const struct merge *best = &last;
        if (l < *n && merge_less(&h[l], best)) {
            m = l;
            best = &h[l];
        }
        if (r < *n && merge_less(&h[r], best))
            m = r;
        if (m == i)
            break;
        h[i] = h[m];
        i = m;
    }
    if (*n > 0)
        h[i] = last;
    return top;
}

static void sym_add(struct symbol *sym, size_t *n, int32_t c, uint32_t len)
{
    size_t i = (*n)++;
    sym[i].c = c;
    sym[i].len = len;
    sym[i].prev = i > 0 ? (int32_t)(i - 1) : -1;
    sym[i].next = -1;
    if (i > 0)
        sym[i - 1].next = (int32_t)i;
}

/* Pushes the candidate merge of the pair starting at symbol `pos`, if the pair merges. */
static mmrt_status push_pair(const struct mmrt_tokenizer *t, struct tk_work *w, size_t *nh,
                             const struct symbol *sym, int32_t pos, struct mmrt_error *err)
{
    int32_t next = sym[pos].next;
    if (next < 0)
        return MMRT_OK;
    uint32_t rank;
    int32_t merged;
    if (!tk_pairmap_get(&t->merges, sym[pos].c, sym[next].c, &rank, &merged))
        return MMRT_OK;
    mmrt_status st = grow(&w->heap, &w->heap_cap, *nh + 1, sizeof(struct merge), err);
    if (st != MMRT_OK)
        return st;
    heap_push(w->heap, nh, (struct merge){rank, (uint32_t)pos, merged});
    return MMRT_OK;
}

mmrt_status tk_bpe_encode(const struct mmrt_tokenizer *t, const char *s, size_t n,
                          struct tk_work *w, struct tk_ids *out, struct mmrt_error *err)
{
    if (n == 0)
        return MMRT_OK;
    if (t->ignore_merges) {
        int32_t id = tk_model_lookup(t, s, n);
        if (id >= 0)
            return tk_ids_push(out, id, err);
    }
    /* At most one symbol per byte. */
    mmrt_status st = grow(&w->sym, &w->sym_cap, n, sizeof(struct symbol), err);
    if (st != MMRT_OK)
        return st;
    struct symbol *sym = w->sym;
    size_t ns = 0;
    uint32_t unk_len = 0; /* pending <unk> bytes, 0 = none */
    for (size_t i = 0; i < n;) {
        size_t cl = tk_utf8_seq((const unsigned char *)s + i, n - i);
        if (cl == 0)
            cl = 1; /* not reached: input was validated */
        int32_t id = tk_model_lookup(t, s + i, cl);
        if (id >= 0) {
            if (unk_len) {
                sym_add(sym, &ns, t->unk_id, unk_len);
                unk_len = 0;
            }
            sym_add(sym, &ns, id, (uint32_t)cl);
        } else {
            bool bytes_ok = t->byte_fallback;
            for (size_t k = 0; bytes_ok && k < cl; k++)
                bytes_ok = t->byte_id[(unsigned char)s[i + k]] >= 0;
            if (bytes_ok) {
                for (size_t k = 0; k < cl; k++)
                    sym_add(sym, &ns, t->byte_id[(unsigned char)s[i + k]], 1);
            } else if (t->unk_id >= 0) {
                if (unk_len && t->fuse_unk) {
                    unk_len += (uint32_t)cl;
                } else {
                    if (unk_len)
                        sym_add(sym, &ns, t->unk_id, unk_len);
                    unk_len = (uint32_t)cl;
                }
            }
            /* No unk token: the character is dropped, as HF does. */
        }
        i += cl;
    }
    if (unk_len)
        sym_add(sym, &ns, t->unk_id, unk_len);

    size_t nh = 0;
    for (size_t i = 0; i + 1 < ns; i++) {
        st = push_pair(t, w, &nh, sym, (int32_t)i, err);
        if (st != MMRT_OK)
            return st;
    }
    while (nh > 0) {
        struct merge top = heap_pop(w->heap, &nh);
        struct symbol *cur = &sym[top.pos];
        if (cur->len == 0 || cur->next < 0)
            continue;
        struct symbol right = sym[cur->next];
        uint32_t rank;
        int32_t merged;
        if (!tk_pairmap_get(&t->merges, cur->c, right.c, &rank, &merged) ||
            merged != top.merged)
            continue; /* stale entry */
        sym[cur->next].len = 0;
        cur->c = top.merged;
        cur->len += right.len;
        cur->next = right.next;
        if (right.next >= 0)
            sym[right.next].prev = (int32_t)top.pos;
        if (cur->prev >= 0) {
            st = push_pair(t, w, &nh, sym, cur->prev, err);
            if (st != MMRT_OK)
                return st;
        }
        st = push_pair(t, w, &nh, sym, (int32_t)top.pos, err);
        if (st != MMRT_OK)
            return st;
    }
    for (size_t i = 0; i < ns; i++) {
        if (sym[i].len == 0)
            continue;
        st = tk_ids_push(out, sym[i].c, err);
        if (st != MMRT_OK)
            return st;
    }
    return MMRT_OK;
}

/* ---- Unigram --------------------------------------------------------------------------- */

struct node {
    double score;
    int32_t id;
    int64_t from; /* start of the best piece ending here; -1 = not reached */
};

/* Appends the ids of the piece s[a, b): its vocab id, else its bytes, else <unk>. */
static mmrt_status unigram_piece(const struct mmrt_tokenizer *t, const char *s, size_t a,
                                 size_t b, struct tk_ids *out, struct mmrt_error *err)
{
    int32_t id = tk_model_lookup(t, s + a, b - a);
    if (id >= 0)
        return tk_ids_push(out, id, err);
    bool bytes_ok = t->byte_fallback;
    for (size_t k = a; bytes_ok && k < b; k++)
        bytes_ok = t->byte_id[(unsigned char)s[k]] >= 0;
    if (bytes_ok) {
        for (size_t k = a; k < b; k++) {
            mmrt_status st = tk_ids_push(out, t->byte_id[(unsigned char)s[k]], err);
            if (st != MMRT_OK)
                return st;
        }
        return MMRT_OK;
    }
    /* unk_id exists: a fused unknown only arises from <unk> nodes. */
    return tk_ids_push(out, t->unk_id, err);
}

mmrt_status tk_unigram_encode(const struct mmrt_tokenizer *t, const char *s, size_t n,
                              struct tk_work *w, struct tk_ids *out, struct mmrt_error *err)
{
    if (n == 0)
        return MMRT_OK;
    mmrt_status st = grow(&w->node, &w->node_cap, n + 1, sizeof(struct node), err);
    if (st != MMRT_OK)
        return st;
    struct node *best = w->node;
    for (size_t i = 0; i <= n; i++)
        best[i] = (struct node){0.0, 0, -1};
    const double unk_score = t->min_score - 10.0;
    for (size_t at = 0; at < n;) {
        double base = best[at].score;
        size_t cl = tk_utf8_seq((const unsigned char *)s + at, n - at);
        if (cl == 0)
            cl = 1; /* not reached: input was validated */
        bool single = false;
        uint32_t nd = 0;
        for (size_t k = at; k < n; k++) {
            nd = tk_trie_child(&t->pieces, nd, (unsigned char)s[k]);
            if (!nd)
                break;
            int32_t id = t->pieces.value[nd];
            if (id < 0)
                continue;
            struct node *tg = &best[k + 1];
            double cand = t->score[id] + base;
            if (tg->from < 0 || cand > tg->score) {
                tg->score = cand;
                tg->from = (int64_t)at;
                tg->id = id;
            }
            if (k + 1 - at == cl)
                single = true;
        }
        if (!single) {
            if (t->unk_id < 0)
                return mmrt_error_set(err, MMRT_ERR_INVALID_ARG,
                                      "%s: no Unigram piece for the character at byte %zu and "
                                      "no unk_id", t->what, at);
            struct node *tg = &best[at + cl];
            double cand = unk_score + base;
            if (tg->from < 0 || cand > tg->score) {
                tg->score = cand;
                tg->from = (int64_t)at;
                tg->id = t->unk_id;
            }
        }
        at += cl;
    }
    /* Backtrack from the end, then emit front to back. */
    st = grow(&w->ends, &w->ends_cap, n + 1, sizeof(size_t), err);
    if (st != MMRT_OK)
        return st;
    size_t *ends = w->ends, ne = 0;
    for (size_t e = n; e > 0; e = (size_t)best[e].from)
        ends[ne++] = e;
    size_t start = 0, unk_start = 0;
    bool in_unk = false;
    for (size_t k = ne; k-- > 0;) {
        size_t e = ends[k];
        bool is_unk = best[e].id == t->unk_id;
        if (is_unk) {
            if (!in_unk)
                unk_start = start;
            in_unk = true;
        } else {
            if (in_unk) {
                st = unigram_piece(t, s, unk_start, start, out, err);
                if (st != MMRT_OK)
                    return st;
                in_unk = false;
            }
            st = unigram_piece(t, s, start, e, out, err);
            if (st != MMRT_OK)
                return st;
        }
        start = e;
    }
    if (in_unk)
        return unigram_piece(t, s, unk_start, n, out, err);
    return MMRT_OK;
}
