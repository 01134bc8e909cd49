/* core/kv_compress.c — image-token KV compression (kv_compress.h). */
#include "kv_compress.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ops.h"

static enum mmrt_image_kv_policy resolved(enum mmrt_image_kv_policy p)
{
    return p == MMRT_IMAGE_KV_DEFAULT ? MMRT_IMAGE_KV_DEFAULT_POLICY : p;
}

bool mmrt_kv_compress_on(const struct mmrt_kv_compress_opts *o)
{
    return o && o->keep > 0 && o->keep < 1;
}

const char *mmrt_image_kv_policy_name(enum mmrt_image_kv_policy policy)
{
    switch (resolved(policy)) {
    case MMRT_IMAGE_KV_KEY_NORM_HIGH: return "key_norm_high";
    case MMRT_IMAGE_KV_KEY_NORM_LOW: return "key_norm_low";
    case MMRT_IMAGE_KV_RANDOM: return "random";
    case MMRT_IMAGE_KV_POOL2X2: return "pool2x2";
    default: return "unknown";
    }
}

static int64_t clamp_round(double x, int64_t hi)
{
    int64_t v = (int64_t)llround(x);
    return v < 1 ? 1 : v > hi ? hi : v;
}

void mmrt_kv_compress_pool_dims(int64_t h, int64_t w, double keep, int64_t *oh, int64_t *ow)
{
    const double f = sqrt(keep);
    *oh = clamp_round((double)h * f, h);
    *ow = clamp_round((double)w * f, w);
}

int64_t mmrt_kv_compress_grid_kept(const struct mmrt_kv_compress_opts *o, int64_t h, int64_t w)
{
    if (!mmrt_kv_compress_on(o))
        return h * w;
    if (resolved(o->policy) == MMRT_IMAGE_KV_POOL2X2) {
        int64_t oh, ow;
        mmrt_kv_compress_pool_dims(h, w, o->keep, &oh, &ow);
        return oh * ow;
    }
    return clamp_round(o->keep * (double)(h * w), h * w);
}

void mmrt_kv_plan_free(struct mmrt_kv_plan *plan)
{
    free(plan->src);
    memset(plan, 0, sizeof *plan);
}

/* Bin i of n over an extent of `in` (adaptive pooling): [lo, hi). */
static void bin(int64_t i, int64_t n, int64_t in, int64_t *lo, int64_t *hi)
{
    *lo = i * in / n;
    *hi = ((i + 1) * in + n - 1) / n;
}

static int64_t widest_bin(int64_t n, int64_t in)
{
    int64_t most = 0;
    for (int64_t i = 0; i < n; i++) {
        int64_t lo, hi;
        bin(i, n, in, &lo, &hi);
        most = hi - lo > most ? hi - lo : most;
    }
    return most;
}

/* splitmix64: a small generator whose stream is fixed by its seed on every platform. */
static uint64_t next_random(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

struct scored {
    float score;
    int32_t cell;
};

/* Orders by score, ascending (dir 1) or descending (dir −1); NaN last; ties by cell. */
static int by_score(const struct scored *x, const struct scored *y, int dir)
{
    const bool nx = isnan(x->score), ny = isnan(y->score);
    if (nx != ny)
        return nx ? 1 : -1;
    if (!nx && x->score != y->score)
        return x->score < y->score ? -dir : dir;
    return (x->cell > y->cell) - (x->cell < y->cell);
}

static int by_score_desc(const void *a, const void *b)
{
    return by_score(a, b, -1);
}

static int by_score_asc(const void *a, const void *b)
{
    return by_score(a, b, 1);
}

/* Marks the k cells of grid g (n cells from global cell `off`) that head h keeps. */
static void choose(enum mmrt_image_kv_policy policy, int64_t n, int64_t k, int64_t off,
                   int64_t H, int64_t h, int64_t layer, int g, const float *scores,
                   struct scored *tmp, uint8_t *keep)
{
    if (policy == MMRT_IMAGE_KV_RANDOM) {
        uint64_t s = 0x6d6d72742d6b7600ull ^ ((uint64_t)layer << 40) ^ ((uint64_t)h << 20) ^
                     (uint64_t)g;
        for (int64_t i = 0; i < n; i++)
            tmp[i].cell = (int32_t)i;
        for (int64_t i = 0; i < k; i++) { /* partial Fisher–Yates */
            const int64_t j = i + (int64_t)(next_random(&s) % (uint64_t)(n - i));
            const struct scored t = tmp[i];
            tmp[i] = tmp[j];
            tmp[j] = t;
        }
    } else {
        for (int64_t i = 0; i < n; i++)
            tmp[i] = (struct scored){ scores[(off + i) * H + h], (int32_t)i };
        qsort(tmp, (size_t)n, sizeof *tmp,
              policy == MMRT_IMAGE_KV_KEY_NORM_HIGH ? by_score_desc : by_score_asc);
    }
    for (int64_t i = 0; i < k; i++)
        keep[(off + tmp[i].cell) * H + h] = 1;
}

/* What a plan of o over the grids looks like whatever the scores (the same in every layer):
 * the first row rewritten (the page boundary at or below the first patch), the patch cells,
 * the rows kept and the sources per kept row. */
static void layout(const struct mmrt_kv_compress_opts *o, const struct mmrt_prompt_grid *grids,
                   int n_grids, int64_t n_rows, int64_t page_tokens, int64_t *first,
                   int64_t *n_cells, int64_t *n_out, int64_t *G)
{
    const bool pool = resolved(o->policy) == MMRT_IMAGE_KV_POOL2X2;
    *first = grids[0].row / page_tokens * page_tokens;
    *n_cells = 0, *n_out = n_rows, *G = 1;
    for (int g = 0; g < n_grids; g++) {
        const struct mmrt_prompt_grid *q = &grids[g];
        *n_cells += q->h * q->w;
        *n_out -= q->h * q->w - mmrt_kv_compress_grid_kept(o, q->h, q->w);
        if (pool) {
            int64_t oh, ow;
            mmrt_kv_compress_pool_dims(q->h, q->w, o->keep, &oh, &ow);
            const int64_t area = widest_bin(oh, q->h) * widest_bin(ow, q->w);
            *G = area > *G ? area : *G;
        }
    }
}

mmrt_status mmrt_kv_plan_layer(const struct mmrt_kv_compress_opts *o,
                               const struct mmrt_prompt_grid *grids, int n_grids,
                               int64_t n_rows, int64_t page_tokens, int64_t H, int64_t layer,
                               const float *scores, struct mmrt_kv_plan *plan,
                               struct mmrt_error *err)
{
    *plan = (struct mmrt_kv_plan){ .first = n_rows, .n_rows = n_rows, .n_out = n_rows,
                                   .H = H, .G = 1 };
    if (!mmrt_kv_compress_on(o) || n_grids < 1)
        return MMRT_OK;
    const enum mmrt_image_kv_policy policy = resolved(o->policy);
    const bool pool = policy == MMRT_IMAGE_KV_POOL2X2;
    const bool by_norm = policy == MMRT_IMAGE_KV_KEY_NORM_HIGH ||
                         policy == MMRT_IMAGE_KV_KEY_NORM_LOW;
    if (by_norm && !scores)
        return mmrt_error_set(err, MMRT_ERR_INTERNAL, "KV compression: %s needs key norms",
                              mmrt_image_kv_policy_name(policy));
    int64_t first, n_cells, n_out, G;
    layout(o, grids, n_grids, n_rows, page_tokens, &first, &n_cells, &n_out, &G);
    if (n_out == n_rows)
        return MMRT_OK;
    const int64_t span = n_rows - first, n_dst = n_out - first;
    /* at[r − first]: −1 a row that is kept as it is, else its cell (global, in grid and
     * raster order). */
    int64_t *at = malloc((size_t)span * sizeof *at);
    int32_t *src = malloc((size_t)(n_dst * H * G) * sizeof *src);
    uint8_t *keep = pool ? NULL : calloc((size_t)(n_cells * H), 1);
    struct scored *tmp = pool ? NULL : malloc((size_t)n_cells * sizeof *tmp);
    if (!at || !src || (!pool && (!keep || !tmp))) {
        free(at);
        free(src);
        free(keep);
        free(tmp);
        return mmrt_error_set(err, MMRT_ERR_NO_MEMORY, "KV compression: out of memory");
    }
    for (int64_t i = 0; i < span; i++)
        at[i] = -1;
    int64_t off = 0;
    for (int g = 0; g < n_grids; off += grids[g].h * grids[g].w, g++) {
        const struct mmrt_prompt_grid *q = &grids[g];
        for (int64_t y = 0; y < q->h; y++)
            for (int64_t x = 0; x < q->w; x++)
                at[q->row + y * q->stride + x - first] = off + y * q->w + x;
        if (!pool)
            for (int64_t h = 0; h < H; h++)
                choose(policy, q->h * q->w, mmrt_kv_compress_grid_kept(o, q->h, q->w), off, H,
                       h, layer, g, scores, tmp, keep);
    }
    for (int64_t i = 0; i < n_dst * H * G; i++)
        src[i] = -1;
    if (pool) {
        /* A bin's rows go where its first (top-left) cell was: every later cell of the bin,
         * and every cell of a later bin, sits at a higher row. */
        int64_t d = 0;
        for (int64_t r = first; r < n_rows; r++) {
            const int64_t cell = at[r - first];
            if (cell < 0) {
                for (int64_t h = 0; h < H; h++)
                    src[(d * H + h) * G] = (int32_t)r;
                d++;
                continue;
            }
            int g = 0;
            int64_t at0 = 0; /* the grid's first cell */
            while (cell >= at0 + grids[g].h * grids[g].w)
                at0 += grids[g].h * grids[g].w, g++;
            const struct mmrt_prompt_grid *q = &grids[g];
            const int64_t y = (cell - at0) / q->w, x = (cell - at0) % q->w;
            int64_t oh, ow;
            mmrt_kv_compress_pool_dims(q->h, q->w, o->keep, &oh, &ow);
            /* The bin whose first row and column are (y, x), if any. */
            const int64_t by = (y * oh + q->h - 1) / q->h, bx = (x * ow + q->w - 1) / q->w;
            int64_t y0, y1, x0, x1;
            bin(by, oh, q->h, &y0, &y1);
            bin(bx, ow, q->w, &x0, &x1);
            if (by >= oh || bx >= ow || y0 != y || x0 != x)
                continue;
            for (int64_t h = 0; h < H; h++) {
                int64_t k = 0;
                for (int64_t yy = y0; yy < y1; yy++)
                    for (int64_t xx = x0; xx < x1; xx++)
                        src[(d * H + h) * G + k++] = (int32_t)(q->row + yy * q->stride + xx);
            }
            d++;
        }
    } else {
        for (int64_t h = 0; h < H; h++) {
            int64_t d = 0;
            for (int64_t r = first; r < n_rows; r++) {
                const int64_t cell = at[r - first];
                if (cell < 0 || keep[cell * H + h])
                    src[(d++ * H + h) * G] = (int32_t)r;
            }
        }
    }
    free(at);
    free(keep);
    free(tmp);
    *plan = (struct mmrt_kv_plan){ .first = first, .n_rows = n_rows, .n_out = n_out, .H = H,
                                   .G = G, .src = src };
    return MMRT_OK;
}

/* ---- on the device ------------------------------------------------------------------- */

/* Where cache row r is read from: through `old` for pages [from, to) (their contents before
 * they were unshared), the sequence's table elsewhere. */
static int32_t read_row(const struct mmrt_kv_cache *c, const int32_t *old, int64_t from,
                        int64_t to, int64_t r)
{
    const int64_t P = c->pages->page_tokens, j = r / P;
    const int32_t id = j >= from && j < to ? old[j - from] : c->page_ids[j];
    return (int32_t)(id * P + r % P);
}

static struct mmrt_tensor view(const struct mmrt_tensor *t, enum mmrt_dtype dt, int n_dims,
                               const int64_t *ne)
{
    struct mmrt_tensor v;
    mmrt_tensor_init(&v, t->buffer, t->offset, dt, n_dims, ne);
    return v;
}

struct work {
    struct mmrt_scratch s;
    struct mmrt_tensor idx, rows, bk, bv, norms; /* device: flat, viewed per use */
    int32_t *hidx, *hrows;
    float *scores;
    int64_t *cells;                               /* row of every patch cell */
};

mmrt_status mmrt_kv_compress(struct mmrt_kv_pages *p, struct mmrt_kv_cache *c,
                             const struct mmrt_prompt *prompt,
                             const struct mmrt_kv_compress_opts *o, int64_t chunk_rows,
                             int64_t *dropped, bool *ruined, struct mmrt_error *err)
{
    *dropped = 0;
    *ruined = false;
    if (!mmrt_kv_compress_on(o) || prompt->n_grids < 1)
        return MMRT_OK;
    const enum mmrt_image_kv_policy policy = resolved(o->policy);
    const bool by_norm = policy == MMRT_IMAGE_KV_KEY_NORM_HIGH ||
                         policy == MMRT_IMAGE_KV_KEY_NORM_LOW;
    const int64_t H = p->n_kv_heads, D = p->head_dim, P = p->page_tokens, n_rows = c->n_past;
    const struct mmrt_prompt_grid *grids = prompt->grids;
    const int n_grids = prompt->n_grids;
    if (n_rows != prompt->n_ids)
        return mmrt_error_set(err, MMRT_ERR_INTERNAL, "KV compression: the cache holds %lld "
                              "rows, the prompt %lld", (long long)n_rows,
                              (long long)prompt->n_ids);
    int64_t first, n_cells, n_out, G;
    layout(o, grids, n_grids, n_rows, P, &first, &n_cells, &n_out, &G);
    if (n_out == n_rows)
        return MMRT_OK;
    mmrt_status st = MMRT_OK;
    struct mmrt_kv_plan plan = { 0 };
    const int64_t from = first / P, to = (n_out + P - 1) / P, n_dst = n_out - first;
    int64_t C = chunk_rows > 0 ? chunk_rows : 1;
    const int64_t most = n_dst > n_cells ? n_dst : n_cells;
    C = C < most ? C : most;

    /* Everything that can fail without touching the cache comes first. */
    struct work w = { 0 };
    mmrt_scratch_init(&w.s, p->dev);
    int32_t *old = malloc((size_t)(to > from ? to - from : 1) * sizeof *old);
    w.hidx = malloc((size_t)(C * H * G) * sizeof *w.hidx);
    w.hrows = malloc((size_t)C * sizeof *w.hrows);
    w.scores = by_norm ? malloc((size_t)(n_cells * H) * sizeof *w.scores) : NULL;
    w.cells = by_norm ? malloc((size_t)n_cells * sizeof *w.cells) : NULL;
    if (!old || !w.hidx || !w.hrows || (by_norm && (!w.scores || !w.cells)))
        st = mmrt_error_set(err, MMRT_ERR_NO_MEMORY, "KV compression: out of memory");
    if (st == MMRT_OK)
        st = mmrt_scratch_tensor(&w.s, MMRT_DTYPE_I32, 1, (const int64_t[]){ C * H * G },
                                 &w.idx, err);
    if (st == MMRT_OK)
        st = mmrt_scratch_tensor(&w.s, MMRT_DTYPE_I32, 1, (const int64_t[]){ C }, &w.rows,
                                 err);
    if (st == MMRT_OK)
        st = mmrt_scratch_tensor(&w.s, MMRT_DTYPE_F32, 3, (const int64_t[]){ C, H, D }, &w.bk,
                                 err);
    if (st == MMRT_OK)
        st = mmrt_scratch_tensor(&w.s, MMRT_DTYPE_F32, 3, (const int64_t[]){ C, H, D }, &w.bv,
                                 err);
    if (st == MMRT_OK && by_norm)
        st = mmrt_scratch_tensor(&w.s, MMRT_DTYPE_F32, 1, (const int64_t[]){ C * H },
                                 &w.norms, err);
    if (st == MMRT_OK)
        st = mmrt_kv_cache_unshare(c, from, to, old, err);
    const bool unshared = st == MMRT_OK;
    if (st == MMRT_OK && by_norm)
        for (int g = 0, k = 0; g < n_grids; g++)
            for (int64_t y = 0; y < grids[g].h; y++)
                for (int64_t x = 0; x < grids[g].w; x++)
                    w.cells[k++] = grids[g].row + y * grids[g].stride + x;
    struct mmrt_dev *dev = p->dev;
    for (int64_t l = 0; st == MMRT_OK && l < p->n_layers; l++) {
        *ruined = true; /* from the first write on */
        const struct mmrt_tensor ks = mmrt_kv_pages_rows_view(p, l, false);
        const struct mmrt_tensor vs = mmrt_kv_pages_rows_view(p, l, true);
        const struct mmrt_tensor *kss = mmrt_kv_pages_scales(p, l, false);
        const struct mmrt_tensor *vss = mmrt_kv_pages_scales(p, l, true);
        /* Key norms of the patch rows, head by head. */
        for (int64_t a = 0; by_norm && st == MMRT_OK && a < n_cells; a += C) {
            const int64_t n = n_cells - a < C ? n_cells - a : C;
            for (int64_t i = 0; i < n; i++)
                for (int64_t h = 0; h < H; h++)
                    w.hidx[i * H + h] = read_row(c, old, from, to, w.cells[a + i]);
            const struct mmrt_tensor idx = view(&w.idx, MMRT_DTYPE_I32, 3,
                                                (const int64_t[]){ n, H, 1 });
            const struct mmrt_tensor bk = view(&w.bk, MMRT_DTYPE_F32, 3,
                                               (const int64_t[]){ n, H, D });
            const struct mmrt_tensor rows = view(&w.bk, MMRT_DTYPE_F32, 2,
                                                 (const int64_t[]){ n * H, D });
            const struct mmrt_tensor nrm = view(&w.norms, MMRT_DTYPE_F32, 1,
                                                (const int64_t[]){ n * H });
            st = mmrt_dev_upload(dev, &idx, w.hidx, (uint64_t)(n * H) * sizeof *w.hidx, err);
            if (st == MMRT_OK)
                st = mmrt_op_gather_heads(dev, &ks, &idx, kss, &bk, err);
            if (st == MMRT_OK)
                st = mmrt_op_l2_norm(dev, &rows, &nrm, err);
            if (st == MMRT_OK)
                st = mmrt_dev_download(dev, &nrm, w.scores + a * H,
                                       (uint64_t)(n * H) * sizeof *w.scores, err);
        }
        if (st == MMRT_OK)
            st = mmrt_kv_plan_layer(o, grids, n_grids, n_rows, P, H, l, w.scores, &plan, err);
        if (st == MMRT_OK && plan.n_out != n_out)
            st = mmrt_error_set(err, MMRT_ERR_INTERNAL, "KV compression: layer %lld keeps "
                                "%lld rows, layer 0 %lld", (long long)l, (long long)plan.n_out,
                                (long long)n_out);
        /* Front to back: every source row of a chunk lies at or after the chunk's first
         * destination, so rows already moved are never read again. */
        for (int64_t d0 = 0; st == MMRT_OK && d0 < n_dst; d0 += C) {
            const int64_t n = n_dst - d0 < C ? n_dst - d0 : C;
            for (int64_t i = 0; i < n * H * G; i++) {
                const int32_t r = plan.src[d0 * H * G + i];
                w.hidx[i] = r < 0 ? -1 : read_row(c, old, from, to, r);
            }
            mmrt_kv_cache_rows(c, first + d0, n, w.hrows);
            const struct mmrt_tensor idx = view(&w.idx, MMRT_DTYPE_I32, 3,
                                                (const int64_t[]){ n, H, G });
            const struct mmrt_tensor rows = view(&w.rows, MMRT_DTYPE_I32, 1,
                                                 (const int64_t[]){ n });
            const struct mmrt_tensor bk = view(&w.bk, MMRT_DTYPE_F32, 3,
                                               (const int64_t[]){ n, H, D });
            const struct mmrt_tensor bv = view(&w.bv, MMRT_DTYPE_F32, 3,
                                               (const int64_t[]){ n, H, D });
            st = mmrt_dev_upload(dev, &idx, w.hidx, (uint64_t)(n * H * G) * sizeof *w.hidx,
                                 err);
            if (st == MMRT_OK)
                st = mmrt_dev_upload(dev, &rows, w.hrows, (uint64_t)n * sizeof *w.hrows, err);
            if (st == MMRT_OK)
                st = mmrt_op_gather_heads(dev, &ks, &idx, kss, &bk, err);
            if (st == MMRT_OK)
                st = mmrt_op_gather_heads(dev, &vs, &idx, vss, &bv, err);
            if (st == MMRT_OK)
                st = mmrt_op_set_rows(dev, &bk, &rows, &ks, kss, err);
            if (st == MMRT_OK)
                st = mmrt_op_set_rows(dev, &bv, &rows, &vs, vss, err);
        }
        mmrt_kv_plan_free(&plan);
    }
    mmrt_scratch_release(&w.s);
    free(w.hidx);
    free(w.hrows);
    free(w.scores);
    free(w.cells);
    if (unshared)
        mmrt_kv_cache_unshare_done(c, from, to, old);
    free(old);
    if (st != MMRT_OK)
        return mmrt_error_prefix(err, st, "KV compression");
    *ruined = false;
    mmrt_kv_cache_truncate(c, n_out);
    *dropped = n_rows - n_out;
    return MMRT_OK;
}
