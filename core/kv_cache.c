/* core/kv_cache.c — the paged K/V store and the page lists of its sequences (kv_cache.h). */
#include "kv_cache.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "ops.h"

void mmrt_kv_pages_destroy(struct mmrt_kv_pages *p)
{
    if (p->dev && p->free_pages)
        memset(&p->dev->kv, 0, sizeof p->dev->kv);
    for (int b = p->n_blocks; b-- > 0;)
        mmrt_dev_tensor_free(p->dev, &p->blocks[b]);
    free(p->k);
    free(p->v);
    free(p->k_scales);
    free(p->v_scales);
    free(p->free_pages);
    free(p->refs);
    free(p->pins);
    memset(p, 0, sizeof *p);
}

uint64_t mmrt_kv_tensor_bytes(enum mmrt_dtype dtype, int64_t rows, int64_t n_kv_heads,
                              int64_t head_dim, uint64_t *scales_at)
{
    const uint64_t n = (uint64_t)rows * (uint64_t)n_kv_heads;
    uint64_t bytes = n * (uint64_t)head_dim * mmrt_dtype_size(dtype), at = 0;
    if (dtype == MMRT_DTYPE_I8) {
        at = (bytes + MMRT_KV_SCALES_ALIGN - 1) / MMRT_KV_SCALES_ALIGN * MMRT_KV_SCALES_ALIGN;
        bytes = at + n * sizeof(float);
    }
    if (scales_at)
        *scales_at = at;
    return bytes;
}

int mmrt_kv_store_plan(uint64_t tensor_bytes, int64_t n_tensors, uint64_t min_block,
                       uint64_t max_block, int64_t *counts, uint64_t *pool_bytes)
{
    const uint64_t tb = (tensor_bytes + min_block - 1) / min_block * min_block;
    int n = 0;
    uint64_t total = 0;
    for (int64_t left = n_tensors; left > 0 && tb > 0;) {
        uint64_t want = (uint64_t)left * tb, chunk = min_block;
        while (chunk <= want / 2 && (!max_block || chunk * 2 <= max_block))
            chunk *= 2;
        int64_t c = (int64_t)(chunk / tb);
        if (c == 0) { /* one tensor, in the power of two above it */
            c = 1;
            while (chunk < tb)
                chunk *= 2;
        }
        if (n == MMRT_KV_MAX_BLOCKS - 1 && c < left) { /* the last block takes the rest */
            c = left;
            chunk = min_block;
            while (chunk < (uint64_t)c * tb)
                chunk *= 2;
        }
        counts[n++] = c;
        total += chunk;
        left -= c;
    }
    *pool_bytes = total;
    return n;
}

mmrt_status mmrt_kv_pages_create(struct mmrt_dev *dev, int64_t n_layers, int64_t n_kv_heads,
                                 int64_t head_dim, int64_t max_positions, int64_t max_tokens,
                                 int64_t page_tokens, enum mmrt_dtype dtype,
                                 struct mmrt_kv_pages *out, struct mmrt_error *err)
{
    if (page_tokens == 0)
        page_tokens = MMRT_KV_DEFAULT_PAGE_TOKENS;
    if (page_tokens < 1 || page_tokens > MMRT_KV_MAX_PAGE_TOKENS ||
        (page_tokens & (page_tokens - 1)) != 0)
        return mmrt_error_set(err, MMRT_ERR_CONFIG, "[model] kv_page_tokens %lld must be a "
                              "power of two from 1 to %d", (long long)page_tokens,
                              MMRT_KV_MAX_PAGE_TOKENS);
    if (max_tokens < 0)
        return mmrt_error_set(err, MMRT_ERR_CONFIG, "[model] max_kv_tokens %lld must be at "
                              "least 0 (0 = the default)", (long long)max_tokens);
    if (dtype != MMRT_DTYPE_F32 && dtype != MMRT_DTYPE_F16 && dtype != MMRT_DTYPE_F8E4M3 &&
        dtype != MMRT_DTYPE_I8)
        return mmrt_error_set(err, MMRT_ERR_CONFIG, "[model] kv_dtype: the KV cache is f32, "
                              "f16, fp8 (F8E4M3) or int8, not %s", mmrt_dtype_name_of(dtype));
    const uint64_t es = mmrt_dtype_size(dtype);
    /* One position of every layer's K and V (an I8 row's scale included). */
    const uint64_t per_token = (uint64_t)n_layers * 2 * (uint64_t)n_kv_heads *
                               ((uint64_t)head_dim * es +
                                (dtype == MMRT_DTYPE_I8 ? sizeof(float) : 0));
    struct mmrt_pool_stats ps;
    mmrt_pool_stats(dev->pool, &ps);
    const bool configured = max_tokens > 0;
    if (!configured && dev->auto_kv_tokens > 0) {
        max_tokens = dev->auto_kv_tokens; /* what pool_mb = auto reserved room for */
    } else if (!configured) {
        max_tokens = max_positions > 0 ? max_positions : 4096;
        const int64_t fit = per_token ? (int64_t)(ps.capacity_bytes / 2 / per_token) : max_tokens;
        if (fit < max_tokens)
            max_tokens = fit > page_tokens ? fit : page_tokens;
    }
    struct mmrt_kv_pages p = {
        .dev = dev, .n_layers = n_layers, .n_kv_heads = n_kv_heads, .head_dim = head_dim,
        .page_tokens = page_tokens, .n_pages = (max_tokens + page_tokens - 1) / page_tokens,
        .max_tokens_configured = configured,
    };
    p.max_tokens = p.n_pages * page_tokens;
    {
        const int64_t longest = max_positions > 0 && max_positions < p.max_tokens
                                    ? max_positions : p.max_tokens;
        p.seq_pages = (longest + page_tokens - 1) / page_tokens;
    }
    p.k = calloc((size_t)n_layers, sizeof *p.k);
    p.v = calloc((size_t)n_layers, sizeof *p.v);
    p.free_pages = calloc((size_t)p.n_pages, sizeof *p.free_pages);
    p.refs = calloc((size_t)p.n_pages, sizeof *p.refs);
    p.pins = calloc((size_t)p.n_pages, sizeof *p.pins);
    if (dtype == MMRT_DTYPE_I8) {
        p.k_scales = calloc((size_t)n_layers, sizeof *p.k_scales);
        p.v_scales = calloc((size_t)n_layers, sizeof *p.v_scales);
    }
    if (!p.k || !p.v || !p.free_pages || !p.refs || !p.pins ||
        (dtype == MMRT_DTYPE_I8 && (!p.k_scales || !p.v_scales))) {
        mmrt_kv_pages_destroy(&p);
        return mmrt_error_set(err, MMRT_ERR_NO_MEMORY, "KV cache: out of memory");
    }
    const int64_t ne[4] = { p.n_pages, page_tokens, n_kv_heads, head_dim };
    uint64_t scales_at;
    const uint64_t tensor_bytes = mmrt_kv_tensor_bytes(dtype, p.n_pages * page_tokens,
                                                       n_kv_heads, head_dim, &scales_at);
    int64_t counts[MMRT_KV_MAX_BLOCKS];
    uint64_t planned; /* what the blocks take from the pool (pool_budget.c counts the same) */
    /* no block is larger than the pool's largest arena */
    const uint64_t largest = ps.n_orders ? ps.min_block_bytes << (ps.n_orders - 1) : 0;
    p.n_blocks = mmrt_kv_store_plan(tensor_bytes, 2 * n_layers, ps.min_block_bytes, largest,
                                    counts, &planned);
    /* tensors are placed at min_block steps (the pool's alignment) */
    const uint64_t step = (tensor_bytes + ps.min_block_bytes - 1) / ps.min_block_bytes *
                          ps.min_block_bytes;
    int64_t placed = 0;
    for (int b = 0; b < p.n_blocks; b++) {
        const int64_t ne1[1] = { counts[b] * (int64_t)(step / es) };
        mmrt_status st = mmrt_dev_tensor_alloc(dev, dtype, 1, ne1, &p.blocks[b], err);
        for (int64_t j = 0; st == MMRT_OK && j < counts[b]; j++, placed++) {
            const int64_t l = placed / 2;
            struct mmrt_dev_tensor *t = placed % 2 ? &p.v[l] : &p.k[l];
            const uint64_t at = p.blocks[b].t.offset + (uint64_t)j * step;
            mmrt_tensor_init(&t->t, p.blocks[b].t.buffer, at, dtype, 4, ne);
            if (dtype == MMRT_DTYPE_I8) {
                struct mmrt_dev_tensor *s = placed % 2 ? &p.v_scales[l] : &p.k_scales[l];
                const int64_t ns[1] = { p.n_pages * page_tokens * n_kv_heads };
                mmrt_tensor_init(&s->t, p.blocks[b].t.buffer, at + scales_at, MMRT_DTYPE_F32,
                                 1, ns);
            }
        }
        if (st != MMRT_OK) {
            p.n_blocks = b;
            const int64_t tokens = p.max_tokens;
            mmrt_kv_pages_destroy(&p);
            return mmrt_error_prefix(err, st, "KV cache of %s%lld tokens (%.1f MiB in pages of "
                                     "%lld) in the pool of %.0f MiB; lower [model] "
                                     "max_kv_tokens or raise pool_mb",
                                     configured ? "max_kv_tokens " : "", (long long)tokens,
                                     (double)per_token * (double)tokens / 1048576.0,
                                     (long long)page_tokens,
                                     (double)ps.capacity_bytes / 1048576.0);
        }
    }
    /* Lowest ids on top, so a lone sequence's pages come in order (deterministic layout). */
    for (int64_t i = 0; i < p.n_pages; i++)
        p.free_pages[i] = (int32_t)(p.n_pages - 1 - i);
    p.n_free = p.n_pages;
    dev->kv = (struct mmrt_dev_kv_stats){
        .page_tokens = (uint64_t)page_tokens, .pages_total = (uint64_t)p.n_pages,
        .bytes = per_token * (uint64_t)p.max_tokens, .dtype = dtype,
    };
    mmrt_log(MMRT_LOG_INFO, "kv", "device %s: KV cache of %lld tokens in %lld pages of %lld "
             "(%.1f MiB in %d pool blocks of %.1f MiB)%s", dev->name, (long long)p.max_tokens,
             (long long)p.n_pages, (long long)page_tokens,
             (double)per_token * (double)p.max_tokens / 1048576.0, p.n_blocks,
             (double)planned / 1048576.0,
             configured ? "" : " (default: set [model] max_kv_tokens)");
    *out = p;
    return MMRT_OK;
}

static const char *key_hint(const struct mmrt_kv_pages *p)
{
    return p->max_tokens_configured ? "[model] max_kv_tokens"
                                    : "the default KV budget (set [model] max_kv_tokens)";
}

/* A sequence lets go of page id: back on the free stack when nothing else holds it. */
static void page_release(struct mmrt_kv_pages *p, int32_t id)
{
    if (--p->refs[id] > 0)
        return;
    p->dev->kv.pages_used--;
    if (p->pins[id] == 0)
        p->free_pages[p->n_free++] = id;
}

static void page_hold(struct mmrt_kv_pages *p, int32_t id)
{
    if (p->refs[id]++ == 0)
        p->dev->kv.pages_used++;
}

void mmrt_kv_page_pin(struct mmrt_kv_pages *p, int32_t id)
{
    if (p->pins[id]++ == 0)
        p->n_pinned++;
}

void mmrt_kv_page_unpin(struct mmrt_kv_pages *p, int32_t id)
{
    if (--p->pins[id] > 0)
        return;
    p->n_pinned--;
    if (p->refs[id] == 0)
        p->free_pages[p->n_free++] = id;
}

/* Last page first, so a lone sequence's first page ends on top of the stack (the order its
 * pages came in: deterministic layout). */
static void release_all(struct mmrt_kv_cache *c)
{
    for (int64_t i = c->n_held; i-- > 0;)
        page_release(c->pages, c->page_ids[i]);
    c->n_held = 0;
    c->n_past = 0;
}

void mmrt_kv_cache_free(struct mmrt_kv_cache *c)
{
    if (c->pages)
        release_all(c);
    free(c->page_ids);
    memset(c, 0, sizeof *c);
}

void mmrt_kv_cache_drop(struct mmrt_kv_cache *c)
{
    if (c->pages)
        release_all(c);
}

void mmrt_kv_cache_share(struct mmrt_kv_cache *c, const int32_t *ids, int64_t n)
{
    for (int64_t i = 0; i < n && c->n_held < c->max_pages; i++) {
        page_hold(c->pages, ids[i]);
        c->page_ids[c->n_held++] = ids[i];
    }
    c->n_past = c->n_held * c->pages->page_tokens;
}

mmrt_status mmrt_kv_cache_unshare(struct mmrt_kv_cache *c, int64_t from, int64_t to,
                                  int32_t *old, struct mmrt_error *err)
{
    struct mmrt_kv_pages *p = c->pages;
    int64_t shared = 0;
    for (int64_t j = from; j < to; j++)
        shared += p->refs[c->page_ids[j]] > 1 || p->pins[c->page_ids[j]] > 0;
    if (shared > p->n_free)
        return mmrt_error_set(err, MMRT_ERR_LIMIT, "KV cache full: %lld pages to copy, %lld "
                              "free", (long long)shared, (long long)p->n_free);
    for (int64_t j = from; j < to; j++) {
        const int32_t id = c->page_ids[j];
        old[j - from] = id;
        if (p->refs[id] > 1 || p->pins[id] > 0) {
            const int32_t fresh = p->free_pages[--p->n_free];
            page_hold(p, fresh);
            c->page_ids[j] = fresh;
        }
    }
    return MMRT_OK;
}

void mmrt_kv_cache_unshare_done(struct mmrt_kv_cache *c, int64_t from, int64_t to,
                                const int32_t *old)
{
    for (int64_t j = from; j < to; j++)
        if (old[j - from] != c->page_ids[j])
            page_release(c->pages, old[j - from]);
}

void mmrt_kv_cache_truncate(struct mmrt_kv_cache *c, int64_t n_tokens)
{
    const int64_t P = c->pages->page_tokens, keep = (n_tokens + P - 1) / P;
    while (c->n_held > keep)
        page_release(c->pages, c->page_ids[--c->n_held]);
    if (c->n_past > n_tokens)
        c->n_past = n_tokens;
}

int64_t mmrt_kv_cache_pages_needed(const struct mmrt_kv_cache *c, int64_t n_tokens)
{
    const int64_t need = (n_tokens + c->pages->page_tokens - 1) / c->pages->page_tokens;
    return need > c->n_held ? need - c->n_held : 0;
}

mmrt_status mmrt_kv_cache_alloc(struct mmrt_kv_pages *pages, int64_t n_ctx,
                                struct mmrt_kv_cache *out, struct mmrt_error *err)
{
    if (n_ctx < 1)
        return mmrt_error_set(err, MMRT_ERR_INVALID_ARG, "KV cache: %lld positions",
                              (long long)n_ctx);
    if (n_ctx > pages->max_tokens)
        return mmrt_error_set(err, MMRT_ERR_LIMIT, "the request needs %lld KV positions (prompt "
                              "and max_tokens), more than the %lld of %s", (long long)n_ctx,
                              (long long)pages->max_tokens, key_hint(pages));
    struct mmrt_kv_cache c = { .pages = pages, .n_ctx = n_ctx };
    c.max_pages = (n_ctx + pages->page_tokens - 1) / pages->page_tokens;
    c.page_ids = calloc((size_t)c.max_pages, sizeof *c.page_ids);
    if (!c.page_ids)
        return mmrt_error_set(err, MMRT_ERR_NO_MEMORY, "KV cache: out of memory");
    *out = c;
    return MMRT_OK;
}

mmrt_status mmrt_kv_cache_reserve(struct mmrt_kv_cache *c, int64_t n_tokens,
                                  struct mmrt_error *err)
{
    struct mmrt_kv_pages *p = c->pages;
    if (n_tokens > c->n_ctx)
        return mmrt_error_set(err, MMRT_ERR_LIMIT, "decoder: %lld positions do not fit the "
                              "sequence's %lld", (long long)n_tokens, (long long)c->n_ctx);
    const int64_t need = (n_tokens + p->page_tokens - 1) / p->page_tokens;
    if (need <= c->n_held)
        return MMRT_OK;
    if (need - c->n_held > p->n_free)
        return mmrt_error_set(err, MMRT_ERR_LIMIT, "KV cache full: %lld more pages of %lld "
                              "tokens needed, %lld free of the %lld of %s",
                              (long long)(need - c->n_held), (long long)p->page_tokens,
                              (long long)p->n_free, (long long)p->n_pages, key_hint(p));
    while (c->n_held < need) {
        const int32_t id = p->free_pages[--p->n_free];
        page_hold(p, id);
        c->page_ids[c->n_held++] = id;
    }
    return MMRT_OK;
}

void mmrt_kv_cache_rows(const struct mmrt_kv_cache *c, int64_t first, int64_t n, int32_t *rows)
{
    const int64_t P = c->pages->page_tokens;
    for (int64_t i = 0; i < n; i++) {
        const int64_t pos = first + i;
        rows[i] = (int32_t)(c->page_ids[pos / P] * P + pos % P);
    }
}

/* Bytes of one page of one layer's K (or V) store. */
static uint64_t page_bytes(const struct mmrt_kv_pages *p)
{
    return (uint64_t)(p->page_tokens * p->n_kv_heads * p->head_dim) *
           mmrt_dtype_size(p->k[0].t.dtype);
}

bool mmrt_kv_page_copyable(const struct mmrt_kv_pages *p)
{
    return p->n_layers > 0 && page_bytes(p) % 4 == 0;
}

/* Words [id · n, (id + 1) · n) of t's storage as an I32 view. */
static struct mmrt_tensor page_words(const struct mmrt_tensor *t, int32_t id, uint64_t n)
{
    struct mmrt_tensor w;
    mmrt_tensor_init(&w, t->buffer, t->offset + (uint64_t)id * n * 4, MMRT_DTYPE_I32, 1,
                     (const int64_t[]){ (int64_t)n });
    return w;
}

mmrt_status mmrt_kv_page_copy(struct mmrt_kv_pages *p, int32_t src, int32_t dst,
                              struct mmrt_error *err)
{
    if (!mmrt_kv_page_copyable(p))
        return mmrt_error_set(err, MMRT_ERR_UNSUPPORTED, "KV page copy: a page's %llu bytes "
                              "are not whole words", (unsigned long long)page_bytes(p));
    const uint64_t words = page_bytes(p) / 4;
    const uint64_t scales = (uint64_t)(p->page_tokens * p->n_kv_heads); /* F32 each */
    mmrt_status st = MMRT_OK;
    for (int64_t l = 0; st == MMRT_OK && l < p->n_layers; l++)
        for (int values = 0; st == MMRT_OK && values < 2; values++) {
            const struct mmrt_tensor *t = values ? &p->v[l].t : &p->k[l].t;
            struct mmrt_tensor a = page_words(t, src, words), b = page_words(t, dst, words);
            st = mmrt_op_copy(p->dev, &a, &b, err);
            const struct mmrt_tensor *sc = mmrt_kv_pages_scales(p, l, values);
            if (st == MMRT_OK && sc) {
                a = page_words(sc, src, scales);
                b = page_words(sc, dst, scales);
                st = mmrt_op_copy(p->dev, &a, &b, err);
            }
        }
    return st;
}

struct mmrt_tensor mmrt_kv_pages_rows_view(const struct mmrt_kv_pages *p, int64_t layer,
                                           bool values)
{
    const struct mmrt_tensor *t = values ? &p->v[layer].t : &p->k[layer].t;
    return mmrt_tensor_reshape(t, 3, (const int64_t[]){ p->n_pages * p->page_tokens,
                                                        p->n_kv_heads, p->head_dim });
}

const struct mmrt_tensor *mmrt_kv_pages_scales(const struct mmrt_kv_pages *p, int64_t layer,
                                               bool values)
{
    if (!p->k_scales)
        return NULL;
    return values ? &p->v_scales[layer].t : &p->k_scales[layer].t;
}

mmrt_status mmrt_kv_attend(struct mmrt_kv_pages *p, int64_t layer, const struct mmrt_tensor *q,
                           const struct mmrt_tensor *k, const struct mmrt_tensor *v,
                           const struct mmrt_kv_step *s, float scale, int32_t window,
                           const struct mmrt_tensor *out, struct mmrt_error *err)
{
    struct mmrt_dev *dev = p->dev;
    struct mmrt_tensor kd = mmrt_kv_pages_rows_view(p, layer, false);
    struct mmrt_tensor vd = mmrt_kv_pages_rows_view(p, layer, true);
    const struct mmrt_tensor *ks = mmrt_kv_pages_scales(p, layer, false);
    const struct mmrt_tensor *vs = mmrt_kv_pages_scales(p, layer, true);
    mmrt_status st = mmrt_op_set_rows(dev, k, &s->rows, &kd, ks, err);
    if (st == MMRT_OK)
        st = mmrt_op_set_rows(dev, v, &s->rows, &vd, vs, err);
    if (st != MMRT_OK)
        return st;
    const struct mmrt_attention_params ap = {
        scale > 0 ? scale : 1.0f / sqrtf((float)p->head_dim), 1, (int32_t)s->kv_len.ne[0],
        window
    };
    return mmrt_op_attention_paged(dev, q, &p->k[layer].t, &p->v[layer].t, &s->cu_q,
                                   &s->kv_len, &s->table, ks, vs, &ap, out, err);
}
