/*
 * tests/test_kv_compress.c — image-token KV compression (core/kv_compress.h): the plans every
 * policy makes, and the compaction of a real page store on the CPU and OpenCL plugins, row
 * for row against the plan applied on the host (shared and pinned pages copied, never
 * written; freed pages back in the store); on CUDA too where a GPU is found.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kv_compress.h"
#include "ops.h"
#include "plugin_harness.h"

#define NH 3

static const struct mmrt_prompt_grid k_grids[] = {
    { .row = 5, .h = 4, .w = 4, .stride = 5 },  /* a newline column after each row */
    { .row = 27, .h = 2, .w = 3, .stride = 3 },
};
#define N_GRIDS 2
#define N_ROWS 37
#define N_CELLS 22

static int64_t cell_of(int64_t r)
{
    int64_t off = 0;
    for (int g = 0; g < N_GRIDS; g++) {
        const struct mmrt_prompt_grid *q = &k_grids[g];
        const int64_t y = (r - q->row) / q->stride, x = (r - q->row) % q->stride;
        if (r >= q->row && y < q->h && x < q->w)
            return off + y * q->w + x;
        off += q->h * q->w;
    }
    return -1;
}

static int grid_of_cell(int64_t cell)
{
    return cell < 16 ? 0 : 1;
}

/* What every plan keeps to, whatever the policy. */
static void check_invariants(const struct mmrt_kv_plan *p, int64_t P)
{
    assert_int_equal(p->first, k_grids[0].row / P * P);
    const int64_t n_dst = p->n_out - p->first;
    for (int64_t h = 0; h < p->H; h++) {
        int64_t prev = -1, per_grid[N_GRIDS] = { 0 }, text = 0;
        for (int64_t d = 0; d < n_dst; d++) {
            const int32_t *s = p->src + (d * p->H + h) * p->G;
            assert_true(s[0] >= p->first + d); /* movable front to back */
            assert_true(s[0] > prev);          /* prompt order */
            prev = s[0];
            for (int64_t g = 0; g < p->G; g++) {
                if (s[g] < 0)
                    continue;
                assert_true(s[g] >= p->first + d && s[g] < p->n_rows);
                if (g > 0)
                    assert_true(cell_of(s[g]) >= 0); /* only patches are averaged */
            }
            if (cell_of(s[0]) < 0) {
                text++;
                if (p->G > 1)
                    assert_int_equal(s[1], -1);
            } else {
                per_grid[grid_of_cell(cell_of(s[0]))]++;
            }
        }
        /* Every non-patch row from `first` on is kept, in place order. */
        int64_t want_text = 0;
        for (int64_t r = p->first; r < p->n_rows; r++)
            want_text += cell_of(r) < 0;
        assert_int_equal(text, want_text);
        for (int g = 0; g < N_GRIDS; g++) /* never a whole image gone */
            assert_true(per_grid[g] >= 1);
    }
}

static void test_off(void **state)
{
    (void)state;
    struct mmrt_error err = { 0 };
    struct mmrt_kv_plan p;
    const double keeps[] = { 0, 1 };
    for (int i = 0; i < 2; i++) {
        const struct mmrt_kv_compress_opts o = { keeps[i], MMRT_IMAGE_KV_RANDOM };
        assert_false(mmrt_kv_compress_on(&o));
        assert_int_equal(mmrt_kv_plan_layer(&o, k_grids, N_GRIDS, N_ROWS, 4, NH, 0, NULL, &p,
                                            &err), MMRT_OK);
        assert_int_equal(p.n_out, N_ROWS);
        assert_null(p.src);
    }
}

static void test_kept_counts(void **state)
{
    (void)state;
    const struct mmrt_kv_compress_opts r10 = { 0.1, MMRT_IMAGE_KV_RANDOM };
    assert_int_equal(mmrt_kv_compress_grid_kept(&r10, 24, 24), 58); /* 57.6 */
    assert_int_equal(mmrt_kv_compress_grid_kept(&r10, 2, 2), 1);    /* never none */
    const struct mmrt_kv_compress_opts p25 = { 0.25, MMRT_IMAGE_KV_POOL2X2 };
    assert_int_equal(mmrt_kv_compress_grid_kept(&p25, 24, 24), 144);
    int64_t oh, ow;
    mmrt_kv_compress_pool_dims(7, 5, 0.5, &oh, &ow);
    assert_int_equal(oh, 5); /* 4.95 */
    assert_int_equal(ow, 4); /* 3.54 */
    mmrt_kv_compress_pool_dims(1, 9, 0.1, &oh, &ow);
    assert_int_equal(oh, 1);
    assert_int_equal(ow, 3);
    assert_string_equal(mmrt_image_kv_policy_name(MMRT_IMAGE_KV_DEFAULT),
                        mmrt_image_kv_policy_name(MMRT_IMAGE_KV_DEFAULT_POLICY));
}

/* Scores: head 0 ranks cells by index, head 1 the other way, head 2 all equal (ties go to
 * the earlier cell). */
static void make_scores(float *s)
{
    for (int64_t c = 0; c < N_CELLS; c++) {
        s[c * NH + 0] = (float)c + 1;
        s[c * NH + 1] = (float)(N_CELLS - c);
        s[c * NH + 2] = 1;
    }
}

static void kept_cells(const struct mmrt_kv_plan *p, int64_t h, uint8_t *kept)
{
    memset(kept, 0, N_CELLS);
    for (int64_t d = 0; d < p->n_out - p->first; d++) {
        const int64_t c = cell_of(p->src[(d * p->H + h) * p->G]);
        if (c >= 0)
            kept[c] = 1;
    }
}

static void test_key_norms(void **state)
{
    (void)state;
    float scores[N_CELLS * NH];
    make_scores(scores);
    struct mmrt_error err = { 0 };
    for (int high = 0; high < 2; high++) {
        const struct mmrt_kv_compress_opts o = {
            0.5, high ? MMRT_IMAGE_KV_KEY_NORM_HIGH : MMRT_IMAGE_KV_KEY_NORM_LOW
        };
        struct mmrt_kv_plan p;
        assert_int_equal(mmrt_kv_plan_layer(&o, k_grids, N_GRIDS, N_ROWS, 4, NH, 3, scores, &p,
                                            &err), MMRT_OK);
        assert_int_equal(p.G, 1);
        assert_int_equal(p.n_out, N_ROWS - 8 - 3); /* grids keep 8 of 16 and 3 of 6 */
        check_invariants(&p, 4);
        uint8_t kept[N_CELLS];
        for (int64_t h = 0; h < NH; h++) {
            kept_cells(&p, h, kept);
            for (int64_t c = 0; c < N_CELLS; c++) {
                const int64_t i = c < 16 ? c : c - 16, n = c < 16 ? 16 : 6;
                const bool upper = i >= n / 2; /* larger scores for head 0 */
                bool want = h == 0 ? upper == (bool)high : h == 1 ? upper != (bool)high
                                                                  : i < n / 2;
                if (kept[c] != want)
                    fail_msg("%s head %lld cell %lld: kept %d", high ? "high" : "low",
                             (long long)h, (long long)c, kept[c]);
            }
        }
        mmrt_kv_plan_free(&p);
    }
    /* The key-norm policies need scores. */
    const struct mmrt_kv_compress_opts o = { 0.5, MMRT_IMAGE_KV_KEY_NORM_LOW };
    struct mmrt_kv_plan p;
    assert_int_equal(mmrt_kv_plan_layer(&o, k_grids, N_GRIDS, N_ROWS, 4, NH, 0, NULL, &p, &err),
                     MMRT_ERR_INTERNAL);
}

static void test_random(void **state)
{
    (void)state;
    struct mmrt_error err = { 0 };
    const struct mmrt_kv_compress_opts o = { 0.25, MMRT_IMAGE_KV_RANDOM };
    struct mmrt_kv_plan a, b, c;
    assert_int_equal(mmrt_kv_plan_layer(&o, k_grids, N_GRIDS, N_ROWS, 8, NH, 1, NULL, &a, &err),
                     MMRT_OK);
    assert_int_equal(mmrt_kv_plan_layer(&o, k_grids, N_GRIDS, N_ROWS, 8, NH, 1, NULL, &b, &err),
                     MMRT_OK);
    assert_int_equal(mmrt_kv_plan_layer(&o, k_grids, N_GRIDS, N_ROWS, 8, NH, 2, NULL, &c, &err),
                     MMRT_OK);
    check_invariants(&a, 8);
    assert_int_equal(a.n_out, N_ROWS - 12 - 4); /* 4 of 16, 2 of 6 (1.5 rounds to 2) */
    const size_t bytes = (size_t)((a.n_out - a.first) * NH) * sizeof(int32_t);
    assert_memory_equal(a.src, b.src, bytes);    /* reproducible */
    assert_memory_not_equal(a.src, c.src, bytes); /* another layer, another draw */
    /* The heads draw apart too. */
    uint8_t k0[N_CELLS], k1[N_CELLS];
    kept_cells(&a, 0, k0);
    kept_cells(&a, 1, k1);
    assert_memory_not_equal(k0, k1, sizeof k0);
    mmrt_kv_plan_free(&a);
    mmrt_kv_plan_free(&b);
    mmrt_kv_plan_free(&c);
}

static void test_pool(void **state)
{
    (void)state;
    struct mmrt_error err = { 0 };
    /* 24 × 24 at a quarter: every 2 × 2 neighbourhood, in its top-left cell's place. */
    const struct mmrt_prompt_grid g24 = { .row = 3, .h = 24, .w = 24, .stride = 24 };
    const struct mmrt_kv_compress_opts o = { 0.25, MMRT_IMAGE_KV_POOL2X2 };
    struct mmrt_kv_plan p;
    assert_int_equal(mmrt_kv_plan_layer(&o, &g24, 1, 600, 16, 2, 0, NULL, &p, &err), MMRT_OK);
    assert_int_equal(p.first, 0);
    assert_int_equal(p.G, 4);
    assert_int_equal(p.n_out, 600 - 576 + 144);
    for (int64_t h = 0; h < 2; h++) {
        for (int64_t d = 0; d < 3; d++)
            assert_int_equal(p.src[(d * 2 + h) * 4], d);
        for (int64_t i = 0; i < 144; i++) {
            const int32_t *s = p.src + ((3 + i) * 2 + h) * 4;
            const int64_t y = 2 * (i / 12), x = 2 * (i % 12);
            const int32_t want[4] = { (int32_t)(3 + y * 24 + x), (int32_t)(3 + y * 24 + x + 1),
                                      (int32_t)(3 + (y + 1) * 24 + x),
                                      (int32_t)(3 + (y + 1) * 24 + x + 1) };
            assert_memory_equal(s, want, sizeof want);
        }
        for (int64_t d = 147; d < p.n_out; d++) /* the text after the image */
            assert_int_equal(p.src[(d * 2 + h) * 4], 576 + d - 144);
    }
    mmrt_kv_plan_free(&p);
    /* Uneven bins (7 × 5 → 5 × 4, with a newline column): every patch is read, bins
     * overlap as adaptive pooling's do, padding fills the smaller bins. */
    const struct mmrt_prompt_grid g75 = { .row = 9, .h = 7, .w = 5, .stride = 6 };
    const struct mmrt_kv_compress_opts half = { 0.5, MMRT_IMAGE_KV_POOL2X2 };
    assert_int_equal(mmrt_kv_plan_layer(&half, &g75, 1, 60, 4, 1, 0, NULL, &p, &err), MMRT_OK);
    assert_int_equal(p.n_out, 60 - 35 + 20);
    assert_int_equal(p.G, 2 * 3);
    int seen[60] = { 0 };
    int64_t cells = 0;
    for (int64_t d = 0; d < p.n_out - p.first; d++) {
        const int32_t *s = p.src + d * p.G;
        assert_true(s[0] >= p.first + d);
        const int64_t r = s[0] - 9;
        const bool patch = r >= 0 && r < 7 * 6 && r % 6 < 5;
        cells += patch;
        for (int64_t g = 0; g < p.G && s[g] >= 0; g++)
            seen[s[g]]++;
    }
    assert_int_equal(cells, 20);
    for (int64_t r = p.first; r < 60; r++)
        assert_true(seen[r] >= 1);
    mmrt_kv_plan_free(&p);
}

/* ---- a page store on a device --------------------------------------------------------- */

#define NL 2
#define HD 16
#define PT 4

/* The value of element i of head h of row r in layer l's K (v = 0) or V (v = 1): rows differ
 * in norm by head so the norm policies have a clear order. */
static float val(int64_t l, int v, int64_t r, int64_t h, int64_t i)
{
    const float scale = 0.5f + (float)((r * 7 + h * 3 + l) % 11);
    return scale * sinf((float)(r * 131 + h * 17 + i * 5 + l * 3 + v * 101) * 0.37f);
}

static mmrt_status fill(struct mmrt_kv_pages *p, const struct mmrt_kv_cache *c, int64_t n,
                        struct mmrt_error *err)
{
    struct mmrt_scratch s;
    mmrt_scratch_init(&s, p->dev);
    struct mmrt_tensor t, rows;
    mmrt_status st = mmrt_scratch_tensor(&s, MMRT_DTYPE_F32, 3, (const int64_t[]){ n, NH, HD },
                                         &t, err);
    if (st == MMRT_OK)
        st = mmrt_scratch_tensor(&s, MMRT_DTYPE_I32, 1, (const int64_t[]){ n }, &rows, err);
    float *host = malloc((size_t)(n * NH * HD) * sizeof *host);
    int32_t *hr = malloc((size_t)n * sizeof *hr);
    mmrt_kv_cache_rows(c, 0, n, hr);
    if (st == MMRT_OK)
        st = mmrt_dev_upload(p->dev, &rows, hr, (uint64_t)n * sizeof *hr, err);
    for (int64_t l = 0; st == MMRT_OK && l < NL; l++)
        for (int v = 0; st == MMRT_OK && v < 2; v++) {
            for (int64_t r = 0; r < n; r++)
                for (int64_t h = 0; h < NH; h++)
                    for (int64_t i = 0; i < HD; i++)
                        host[(r * NH + h) * HD + i] = val(l, v, r, h, i);
            struct mmrt_tensor dst = mmrt_kv_pages_rows_view(p, l, v);
            st = mmrt_dev_upload(p->dev, &t, host, (uint64_t)(n * NH * HD) * sizeof *host, err);
            if (st == MMRT_OK)
                st = mmrt_op_set_rows(p->dev, &t, &rows, &dst, mmrt_kv_pages_scales(p, l, v),
                                      err);
        }
    free(host);
    free(hr);
    mmrt_scratch_release(&s);
    return st;
}

/* Store row `row` of layer l's K (v = 0) or V, as f32 [NH][HD] (the store may be F16). */
static void read_store_row(struct mmrt_kv_pages *p, int64_t l, int v, int64_t row, float *out)
{
    struct mmrt_error err = { 0 };
    const struct mmrt_tensor all = mmrt_kv_pages_rows_view(p, l, v);
    const struct mmrt_tensor one = mmrt_tensor_rows(&all, row, 1);
    const size_t es = mmrt_dtype_size(all.dtype);
    uint8_t raw[NH * HD * 4];
    assert_int_equal(mmrt_dev_download(p->dev, &one, raw, (uint64_t)(NH * HD) * es, &err),
                     MMRT_OK);
    for (int64_t i = 0; i < NH * HD; i++) {
        if (all.dtype == MMRT_DTYPE_F32) {
            memcpy(&out[i], raw + 4 * i, 4);
        } else {
            uint16_t b;
            memcpy(&b, raw + 2 * i, 2);
            out[i] = mmrt_f16_to_f32(b);
        }
    }
}

/* Row r of sequence c. */
static void read_row(struct mmrt_kv_pages *p, const struct mmrt_kv_cache *c, int64_t l, int v,
                     int64_t r, float *out)
{
    int32_t sr;
    mmrt_kv_cache_rows(c, r, 1, &sr);
    read_store_row(p, l, v, sr, out);
}

/* What the store holds for (l, v, r, h, i) before compression: val rounded to the store. */
static float stored(bool f16, int64_t l, int v, int64_t r, int64_t h, int64_t i)
{
    const float x = val(l, v, r, h, i);
    return f16 ? mmrt_f16_to_f32(mmrt_f32_to_f16(x)) : x;
}

static void check_store(const char *plugin, bool f16, enum mmrt_image_kv_policy policy,
                        double keep)
{
    struct mmrt_error err = { 0 };
    struct mmrt_dev *dev = NULL;
    if (mmrt_dev_open("d", plugin, 0, 64ull << 20, NULL, 0, &dev, &err) != MMRT_OK) {
        if (strcmp(plugin, "cpu") != 0 && (err.status == MMRT_ERR_NO_DEVICE ||
                                           err.status == MMRT_ERR_PLUGIN)) {
            fprintf(stderr, "skipping %s: %s\n", plugin, err.msg);
            return;
        }
        fail_msg("%s: %s", plugin, err.msg);
    }
    struct mmrt_kv_pages p;
    assert_int_equal(mmrt_kv_pages_create(dev, NL, NH, HD, 256, 128, PT,
                                          f16 ? MMRT_DTYPE_F16 : MMRT_DTYPE_F32, &p, &err),
                     MMRT_OK);
    struct mmrt_kv_cache c, other;
    assert_int_equal(mmrt_kv_cache_alloc(&p, 64, &c, &err), MMRT_OK);
    assert_int_equal(mmrt_kv_cache_reserve(&c, N_ROWS, &err), MMRT_OK);
    c.n_past = N_ROWS;
    if (fill(&p, &c, N_ROWS, &err) != MMRT_OK)
        fail_msg("%s: %s", plugin, err.msg);
    /* Another sequence shares pages 0 … 2 (a cached prefix would too), and page 4 is pinned:
     * compression must copy them, not write them. */
    assert_int_equal(mmrt_kv_cache_alloc(&p, 64, &other, &err), MMRT_OK);
    mmrt_kv_cache_share(&other, c.page_ids, 3);
    const int32_t pinned = c.page_ids[4];
    mmrt_kv_page_pin(&p, pinned);
    const int64_t used = dev->kv.pages_used;

    /* The plan on the host, with the norms of the stored keys. */
    const struct mmrt_kv_compress_opts o = { keep, policy };
    float scores[N_CELLS * NH];
    for (int64_t r = 0; r < N_ROWS; r++) {
        const int64_t cell = cell_of(r);
        for (int64_t h = 0; cell >= 0 && h < NH; h++) {
            double s = 0;
            for (int64_t i = 0; i < HD; i++)
                s += (double)stored(f16, 0, 0, r, h, i) * stored(f16, 0, 0, r, h, i);
            scores[cell * NH + h] = (float)sqrt(s);
        }
    }
    struct mmrt_prompt prompt = { .n_ids = N_ROWS, .grids = (struct mmrt_prompt_grid *)k_grids,
                                  .n_grids = N_GRIDS };
    int64_t dropped = 0;
    bool ruined = false;
    if (mmrt_kv_compress(&p, &c, &prompt, &o, 5, &dropped, &ruined, &err) != MMRT_OK)
        fail_msg("%s: %s", plugin, err.msg);
    assert_false(ruined);
    for (int64_t l = 0; l < NL; l++) {
        /* Layer 0's scores are the ones above; later layers' plans use their own keys. */
        float ls[N_CELLS * NH];
        for (int64_t r = 0; r < N_ROWS; r++) {
            const int64_t cell = cell_of(r);
            for (int64_t h = 0; cell >= 0 && h < NH; h++) {
                double s = 0;
                for (int64_t i = 0; i < HD; i++)
                    s += (double)stored(f16, l, 0, r, h, i) * stored(f16, l, 0, r, h, i);
                ls[cell * NH + h] = (float)sqrt(s);
            }
        }
        struct mmrt_kv_plan plan;
        assert_int_equal(mmrt_kv_plan_layer(&o, k_grids, N_GRIDS, N_ROWS, PT, NH, l, ls, &plan,
                                            &err), MMRT_OK);
        assert_int_equal(dropped, N_ROWS - plan.n_out);
        assert_int_equal(c.n_past, plan.n_out);
        for (int v = 0; v < 2; v++)
            for (int64_t r = 0; r < plan.n_out; r++) {
                float got[NH * HD];
                read_row(&p, &c, l, v, r, got);
                for (int64_t h = 0; h < NH; h++)
                    for (int64_t i = 0; i < HD; i++) {
                        float want;
                        if (r < plan.first) {
                            want = stored(f16, l, v, r, h, i);
                        } else {
                            const int32_t *s = plan.src + ((r - plan.first) * NH + h) * plan.G;
                            float sum = 0;
                            int n = 0;
                            for (int64_t g = 0; g < plan.G; g++)
                                if (s[g] >= 0)
                                    sum += stored(f16, l, v, s[g], h, i), n++;
                            want = sum / (float)n;
                            if (f16)
                                want = mmrt_f16_to_f32(mmrt_f32_to_f16(want));
                        }
                        if (memcmp(&got[h * HD + i], &want, sizeof want) != 0)
                            fail_msg("%s %s %s keep %.2f: layer %lld %c row %lld head %lld "
                                     "[%lld]: %.9g, want %.9g", plugin, f16 ? "f16" : "f32",
                                     mmrt_image_kv_policy_name(policy), keep, (long long)l,
                                     v ? 'V' : 'K', (long long)r, (long long)h, (long long)i,
                                     got[h * HD + i], want);
                    }
            }
        mmrt_kv_plan_free(&plan);
    }
    (void)scores;
    /* The shared and pinned pages still hold what they held. */
    for (int64_t r = 0; r < 3 * PT; r++) {
        float got[NH * HD];
        read_row(&p, &other, 1, 1, r, got);
        for (int64_t h = 0; h < NH; h++)
            for (int64_t i = 0; i < HD; i++)
                assert_true(got[h * HD + i] == stored(f16, 1, 1, r, h, i));
    }
    for (int64_t k = 0; k < PT; k++) {
        float got[NH * HD];
        read_store_row(&p, 0, 0, pinned * PT + k, got);
        for (int64_t i = 0; i < NH * HD; i++)
            assert_true(got[i] == stored(f16, 0, 0, 4 * PT + k, i / HD, i % HD));
    }
    /* Pages: what the sequence holds now, plus the copies' originals still held by the
     * others, minus what compression gave back. */
    assert_int_equal(c.n_held, (c.n_past + PT - 1) / PT);
    (void)used;
    mmrt_kv_cache_free(&c);
    mmrt_kv_cache_free(&other);
    mmrt_kv_page_unpin(&p, pinned);
    assert_int_equal(dev->kv.pages_used, 0);
    assert_int_equal(p.n_free, p.n_pages);
    mmrt_kv_pages_destroy(&p);
    mmrt_dev_close(dev);
}

static void store_on(const char *plugin)
{
    static const enum mmrt_image_kv_policy policies[] = {
        MMRT_IMAGE_KV_KEY_NORM_HIGH, MMRT_IMAGE_KV_KEY_NORM_LOW, MMRT_IMAGE_KV_RANDOM,
        MMRT_IMAGE_KV_POOL2X2,
    };
    static const double keeps[] = { 0.75, 0.5, 0.25, 0.1 };
    for (size_t i = 0; i < sizeof policies / sizeof policies[0]; i++)
        for (size_t k = 0; k < sizeof keeps / sizeof keeps[0]; k++)
            for (int f16 = 0; f16 < 2; f16++)
                check_store(plugin, f16, policies[i], keeps[k]);
}

static void test_store_cpu(void **state)
{
    (void)state;
    store_on("cpu");
}

static void test_store_opencl(void **state)
{
    (void)state;
    store_on("opencl");
}

/* Skips without a GPU; tools/gpu-check.sh runs it where there is one. */
static void test_store_cuda(void **state)
{
    (void)state;
    store_on("cuda");
}

/* No free page to copy a shared page into: nothing happens, the cache stays valid. */
static void test_no_page_for_a_copy(void **state)
{
    (void)state;
    struct mmrt_error err = { 0 };
    struct mmrt_dev *dev = NULL;
    assert_int_equal(mmrt_dev_open("d", "cpu", 0, 64ull << 20, NULL, 0, &dev, &err), MMRT_OK);
    struct mmrt_kv_pages p;
    /* 40 positions: 10 pages, all taken by the sequence. */
    assert_int_equal(mmrt_kv_pages_create(dev, NL, NH, HD, 256, 40, PT, MMRT_DTYPE_F32, &p, &err),
                     MMRT_OK);
    struct mmrt_kv_cache c;
    assert_int_equal(mmrt_kv_cache_alloc(&p, 40, &c, &err), MMRT_OK);
    assert_int_equal(mmrt_kv_cache_reserve(&c, 40, &err), MMRT_OK);
    c.n_past = N_ROWS;
    mmrt_kv_cache_truncate(&c, N_ROWS);
    assert_int_equal(fill(&p, &c, N_ROWS, &err), MMRT_OK);
    mmrt_kv_page_pin(&p, c.page_ids[2]);
    const int64_t held = c.n_held, free_before = p.n_free;
    assert_int_equal(free_before, 0);
    struct mmrt_prompt prompt = { .n_ids = N_ROWS, .grids = (struct mmrt_prompt_grid *)k_grids,
                                  .n_grids = N_GRIDS };
    const struct mmrt_kv_compress_opts o = { 0.5, MMRT_IMAGE_KV_RANDOM };
    int64_t dropped = -1;
    bool ruined = true;
    assert_int_equal(mmrt_kv_compress(&p, &c, &prompt, &o, 8, &dropped, &ruined, &err),
                     MMRT_ERR_LIMIT);
    assert_false(ruined);
    assert_int_equal(dropped, 0);
    assert_int_equal(c.n_past, N_ROWS);
    assert_int_equal(c.n_held, held);
    float got[NH * HD];
    read_row(&p, &c, 1, 0, 20, got);
    assert_true(got[5] == val(1, 0, 20, 0, 5));
    mmrt_kv_page_unpin(&p, c.page_ids[2]);
    mmrt_kv_cache_free(&c);
    mmrt_kv_pages_destroy(&p);
    mmrt_dev_close(dev);
}

/* A grid compression could not walk (an empty side, rows wider than the stride) is refused
 * when a model adds it, naming the grid; the good ones before it stay. */
static void test_bad_grid(void **state)
{
    (void)state;
    struct mmrt_prompt p = { 0 };
    struct mmrt_error err = { 0 };
    assert_int_equal(mmrt_prompt_add_grid(&p, 3, 2, 4, 5, &err), MMRT_OK);
    static const int64_t bad[][3] = { { 0, 4, 4 }, { 2, 0, 4 }, { 2, 5, 4 }, { -1, 4, 4 } };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        mmrt_error_clear(&err);
        assert_int_equal(mmrt_prompt_add_grid(&p, 7, bad[i][0], bad[i][1], bad[i][2], &err),
                         MMRT_ERR_INVALID_ARG);
        assert_non_null(strstr(err.msg, "image grid at row 7"));
    }
    assert_int_equal(p.n_grids, 1);
    assert_int_equal(p.grids[0].stride, 5);
    mmrt_prompt_free(&p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_off),
        cmocka_unit_test(test_kept_counts),
        cmocka_unit_test(test_key_norms),
        cmocka_unit_test(test_random),
        cmocka_unit_test(test_pool),
        cmocka_unit_test(test_store_cpu),
        cmocka_unit_test(test_store_opencl),
        cmocka_unit_test(test_store_cuda),
        cmocka_unit_test(test_no_page_for_a_copy),
        cmocka_unit_test(test_bad_grid),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
