/*
 * tests/test_vision_cache.c — the vision-feature cache (core/vision_cache.h): SHA-256 and the
 * keys, the LRU store's bounds, order and counters, and the cache behind the embedding API on
 * the tiny fixtures: a second identical request hits and gives the same tokens, a hit's
 * features are the bits the model computes without the cache (compared with memcmp through
 * mmrt_runtime_vision, which a trace cannot do: traces bypass the cache), Qwen2-VL's partial
 * hits, budgets over several cached images, failures in the model's own words, bypasses,
 * mmrt_job_image_key and eviction under a small vision_mb.
 */
#include <pthread.h>
#include <semaphore.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "golden.h"
#include "mmrt/mmrt.h"
#include "request_util.h"
#include "vision_cache.h"

/* ---- hashing and keys ---- */

static void hex_of(const uint8_t *d, char *out)
{
    for (int i = 0; i < 32; i++)
        snprintf(out + 2 * i, 3, "%02x", d[i]);
}

/* FIPS 180-2's examples. */
static void test_sha256_vectors(void **state)
{
    (void)state;
    static const struct {
        const char *msg, *digest;
    } v[] = {
        { "", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855" },
        { "abc", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad" },
        { "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq",
          "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1" },
    };
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
        uint8_t d[32];
        char hex[65];
        mmrt_sha256(v[i].msg, strlen(v[i].msg), d);
        hex_of(d, hex);
        assert_string_equal(hex, v[i].digest);
    }
    /* The key of bytes is SHA-256 of the settings digest followed by the bytes. */
    uint8_t settings[32], buf[32 + 3];
    for (int i = 0; i < 32; i++)
        settings[i] = (uint8_t)(i * 7);
    memcpy(buf, settings, 32);
    memcpy(buf + 32, "abc", 3);
    uint8_t want[32];
    mmrt_sha256(buf, sizeof buf, want);
    struct mmrt_vision_key k = { 0 };
    mmrt_vision_key_of(settings, "abc", 3, &k);
    assert_true(k.set);
    assert_memory_equal(k.bytes, want, 32);
    char hex[MMRT_VISION_KEY_HEX], want_hex[65];
    mmrt_vision_key_hex(&k, hex);
    hex_of(want, want_hex);
    assert_string_equal(hex, want_hex); /* 64 lowercase hex digits */
    assert_int_equal(strlen(hex), 64);
    const struct mmrt_vision_key unset = { 0 };
    mmrt_vision_key_hex(&unset, hex);
    assert_string_equal(hex, "");
}

static void fixture_dir(char *buf, size_t size, const char *fixture)
{
    golden_fixture_path(buf, size, fixture);
}

static void digest_or_fail(const struct mmrt_vision_settings *s, uint8_t out[32])
{
    struct mmrt_error err = { 0 };
    if (mmrt_vision_settings_digest(s, out, &err) != MMRT_OK)
        fail_msg("settings digest: %s", err.msg);
}

static void test_key_properties(void **state)
{
    (void)state;
    char dir[4096], dir2[4200], qdir[4096];
    fixture_dir(dir, sizeof dir, "llava-tiny");
    fixture_dir(qdir, sizeof qdir, "qwen2vl-tiny");
    snprintf(dir2, sizeof dir2, "%s/../llava-tiny/.", dir); /* the same directory, spelled so */
    const struct mmrt_option opts[2] = { { "threads", "2" }, { "isa", "portable" } };
    const struct mmrt_option swapped[2] = { { "isa", "portable" }, { "threads", "2" } };
    const struct mmrt_option other[2] = { { "threads", "2" }, { "isa", "avx2" } };
    struct mmrt_vision_settings s = { .model_dir = dir, .model_type = "llava",
                                      .plugin = "cpu", .plugin_version = "1",
                                      .options = opts, .n_options = 2 };
    uint8_t base[32], d[32];
    digest_or_fail(&s, base);
    digest_or_fail(&s, d);
    assert_memory_equal(base, d, 32); /* deterministic */
    struct mmrt_vision_settings t = s;
    t.model_dir = dir2;
    digest_or_fail(&t, d);
    assert_memory_equal(base, d, 32); /* realpath */
    t = s;
    t.options = swapped;
    digest_or_fail(&t, d);
    assert_memory_equal(base, d, 32); /* options in any order */
    /* Each setting that changes features changes the digest. */
    struct mmrt_vision_settings changed[8];
    for (int i = 0; i < 8; i++)
        changed[i] = s;
    changed[0].options = other;
    changed[1].max_image_tokens = 100;
    changed[2].oversize_images = MMRT_OVERSIZE_DOWNSCALE;
    changed[3].plugin = "opencl";
    changed[4].device_index = 1;
    changed[5].model_dir = qdir;
    changed[6].plugin_version = "2";
    changed[7].exif_orientation = MMRT_EXIF_APPLY;
    for (int i = 0; i < 8; i++) {
        digest_or_fail(&changed[i], d);
        if (memcmp(base, d, 32) == 0)
            fail_msg("setting %d does not change the digest", i);
    }
    t = s;
    t.n_options = 1;
    digest_or_fail(&t, d);
    assert_memory_not_equal(base, d, 32);

    /* Keys: same bytes and settings, same key; any byte changed or other settings, another. */
    uint8_t img[256];
    for (int i = 0; i < 256; i++)
        img[i] = (uint8_t)(i * 31 + 5);
    struct mmrt_vision_key k0, k1, k2;
    mmrt_vision_key_of(base, img, sizeof img, &k0);
    mmrt_vision_key_of(base, img, sizeof img, &k1);
    assert_memory_equal(k0.bytes, k1.bytes, 32);
    for (size_t pos = 0; pos < sizeof img; pos += 17) {
        img[pos] ^= 1;
        mmrt_vision_key_of(base, img, sizeof img, &k2);
        assert_memory_not_equal(k0.bytes, k2.bytes, 32);
        img[pos] ^= 1;
    }
    mmrt_vision_key_of(base, img, sizeof img - 1, &k2); /* a byte less */
    assert_memory_not_equal(k0.bytes, k2.bytes, 32);
    uint8_t other_settings[32];
    digest_or_fail(&changed[1], other_settings);
    mmrt_vision_key_of(other_settings, img, sizeof img, &k2);
    assert_memory_not_equal(k0.bytes, k2.bytes, 32);

    struct mmrt_error err = { 0 };
    t = s;
    t.model_dir = "/nonexistent/model";
    assert_int_equal(mmrt_vision_settings_digest(&t, d, &err), MMRT_ERR_IO);
    assert_non_null(strstr(err.msg, "/nonexistent/model"));
}

/* ---- the store ---- */

static void key_n(int n, uint8_t key[32])
{
    mmrt_sha256(&n, sizeof n, key);
}

/* A piece of n_tokens × dim features whose values derive from seed. */
struct piece_buf {
    struct mmrt_vision_piece p;
    float f[256];
};

static void piece_make(struct piece_buf *b, int seed, int64_t n_tokens, int64_t dim)
{
    assert_true(n_tokens * dim <= 256);
    for (int i = 0; i < n_tokens * dim; i++)
        b->f[i] = (float)seed + (float)i / 1024.0f;
    b->p = (struct mmrt_vision_piece){ .n_parts = 1, .n_tokens = n_tokens, .dim = dim,
                                       .features = b->f,
                                       .per_image = true, .has_grid = true,
                                       .grid_thw = { 1, 2 * seed, 4 } };
}

static struct mmrt_vision_cache *cache_make(uint64_t entries, uint64_t bytes)
{
    struct mmrt_vision_cache *c = NULL;
    struct mmrt_error err = { 0 };
    if (mmrt_vision_cache_create(entries, bytes, &c, &err) != MMRT_OK)
        fail_msg("%s", err.msg);
    return c;
}

static void insert(struct mmrt_vision_cache *c, int n, int64_t tokens, int64_t dim)
{
    struct piece_buf b;
    uint8_t key[32];
    struct mmrt_error err = { 0 };
    piece_make(&b, n, tokens, dim);
    key_n(n, key);
    if (mmrt_vision_cache_insert(c, key, &b.p, &err) != MMRT_OK)
        fail_msg("%s", err.msg);
}

static bool holds(struct mmrt_vision_cache *c, int n)
{
    uint8_t key[32];
    key_n(n, key);
    return mmrt_vision_cache_contains(c, key);
}

static const struct mmrt_vision_piece *get(struct mmrt_vision_cache *c, int n)
{
    uint8_t key[32];
    key_n(n, key);
    return mmrt_vision_cache_get(c, key);
}

static void test_create_refuses(void **state)
{
    (void)state;
    struct mmrt_vision_cache *c = NULL;
    struct mmrt_error err = { 0 };
    assert_int_equal(mmrt_vision_cache_create(0, 100, &c, &err), MMRT_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "0 entries"));
    assert_int_equal(mmrt_vision_cache_create(4, 0, &c, &err), MMRT_ERR_INVALID_ARG);
    assert_null(c);
    mmrt_vision_cache_destroy(NULL);
}

/* A hit is the inserted piece, bit for bit, in its own copy. */
static void test_hit_is_a_copy(void **state)
{
    (void)state;
    struct mmrt_vision_cache *c = cache_make(8, 1 << 20);
    struct piece_buf b;
    uint8_t key[32];
    piece_make(&b, 3, 5, 7);
    key_n(3, key);
    assert_int_equal(mmrt_vision_cache_insert(c, key, &b.p, NULL), MMRT_OK);
    const struct mmrt_vision_piece *p = mmrt_vision_cache_get(c, key);
    assert_non_null(p);
    assert_ptr_not_equal(p->features, b.f);
    assert_int_equal(p->n_tokens, 5);
    assert_int_equal(p->dim, 7);
    assert_memory_equal(p->features, b.f, 35 * sizeof(float));
    assert_true(p->per_image && p->has_grid);
    assert_memory_equal(p->grid_thw, b.p.grid_thw, sizeof b.p.grid_thw);
    mmrt_vision_cache_release(c, p);
    /* The same key again keeps the entry it has. */
    struct piece_buf other;
    piece_make(&other, 9, 5, 7);
    assert_int_equal(mmrt_vision_cache_insert(c, key, &other.p, NULL), MMRT_OK);
    p = mmrt_vision_cache_get(c, key);
    assert_memory_equal(p->features, b.f, 35 * sizeof(float));
    mmrt_vision_cache_release(c, p);
    /* Several parts (Fuyu's patch rows) in the uniform layout: rows = parts × tokens. */
    struct piece_buf rowsb;
    uint8_t key2[32];
    piece_make(&rowsb, 4, 5, 7);
    rowsb.p.n_parts = 3;
    rowsb.p.n_tokens = 2; /* 3 × 2 rows of 7 */
    rowsb.p.per_image = rowsb.p.has_grid = false;
    key_n(4, key2);
    assert_int_equal(mmrt_vision_cache_insert(c, key2, &rowsb.p, NULL), MMRT_OK);
    p = mmrt_vision_cache_get(c, key2);
    assert_int_equal(mmrt_vision_piece_rows(p), 6);
    assert_memory_equal(p->features, rowsb.f, 42 * sizeof(float));
    mmrt_vision_cache_release(c, p);
    struct mmrt_error err = { 0 };
    rowsb.p.per_image = true; /* several parts are only uniform */
    assert_int_equal(mmrt_vision_cache_insert(c, key2, &rowsb.p, &err), MMRT_ERR_INVALID_ARG);
    rowsb.p.per_image = false;
    rowsb.p.n_parts = 0;
    assert_int_equal(mmrt_vision_cache_insert(c, key2, &rowsb.p, &err), MMRT_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "a piece of 0 × 2 × 7"));
    struct mmrt_vision_cache_stats s;
    mmrt_vision_cache_stats(c, &s);
    assert_int_equal(s.entries, 2);
    assert_int_equal(s.bytes, (35 + 42) * sizeof(float));
    assert_int_equal(s.queries, 3);
    assert_int_equal(s.hits, 3);
    mmrt_vision_cache_destroy(c);
}

static void test_entry_bound(void **state)
{
    (void)state;
    struct mmrt_vision_cache *c = cache_make(3, 1 << 20);
    for (int n = 1; n <= 3; n++)
        insert(c, n, 2, 4);
    struct mmrt_vision_cache_stats s;
    mmrt_vision_cache_stats(c, &s);
    assert_int_equal(s.entries, 3);
    assert_int_equal(s.evictions, 0);
    insert(c, 4, 2, 4);
    assert_false(holds(c, 1)); /* the oldest goes */
    assert_true(holds(c, 2) && holds(c, 3) && holds(c, 4));
    insert(c, 5, 2, 4);
    assert_false(holds(c, 2));
    mmrt_vision_cache_stats(c, &s);
    assert_int_equal(s.entries, 3);
    assert_int_equal(s.evictions, 2);
    assert_int_equal(s.bytes, 3 * 8 * sizeof(float));
    assert_int_equal(s.max_entries, 3);
    assert_int_equal(s.max_bytes, 1 << 20);
    mmrt_vision_cache_destroy(c);
}

/* Least recently used first: a lookup makes an entry the most recent, contains() does not. */
static void test_eviction_order(void **state)
{
    (void)state;
    struct mmrt_vision_cache *c = cache_make(3, 1 << 20);
    for (int n = 1; n <= 3; n++)
        insert(c, n, 1, 1);
    mmrt_vision_cache_release(c, get(c, 1)); /* 1 is now the most recent: 2, 3, 1 */
    assert_true(holds(c, 2));                /* no effect on the order */
    insert(c, 4, 1, 1);                      /* evicts 2 */
    assert_false(holds(c, 2));
    assert_true(holds(c, 1) && holds(c, 3) && holds(c, 4));
    insert(c, 3, 1, 1); /* re-inserting refreshes: 1, 4, 3 */
    insert(c, 5, 1, 1); /* evicts 1 */
    assert_false(holds(c, 1));
    assert_true(holds(c, 3) && holds(c, 4) && holds(c, 5));
    mmrt_vision_cache_destroy(c);
}

static void test_byte_bound(void **state)
{
    (void)state;
    const uint64_t piece = 40 * sizeof(float); /* 160 bytes */
    struct mmrt_vision_cache *c = cache_make(100, 3 * piece + 10);
    for (int n = 1; n <= 3; n++)
        insert(c, n, 10, 4);
    struct mmrt_vision_cache_stats s;
    mmrt_vision_cache_stats(c, &s);
    assert_int_equal(s.entries, 3);
    assert_int_equal(s.bytes, 3 * piece);
    insert(c, 4, 20, 4); /* 320 bytes: 1 and 2 must go */
    assert_false(holds(c, 1) || holds(c, 2));
    assert_true(holds(c, 3) && holds(c, 4));
    mmrt_vision_cache_stats(c, &s);
    assert_int_equal(s.entries, 2);
    assert_int_equal(s.bytes, 3 * piece);
    assert_int_equal(s.evictions, 2);
    assert_true(s.bytes <= s.max_bytes);
    mmrt_vision_cache_destroy(c);
}

/* A piece larger than the whole byte bound is not stored and evicts nothing. */
static void test_too_big_not_stored(void **state)
{
    (void)state;
    struct mmrt_vision_cache *c = cache_make(10, 64 * sizeof(float));
    insert(c, 1, 8, 8); /* exactly the bound: stored */
    assert_true(holds(c, 1));
    insert(c, 2, 9, 8);
    assert_false(holds(c, 2));
    assert_true(holds(c, 1));
    struct mmrt_vision_cache_stats s;
    mmrt_vision_cache_stats(c, &s);
    assert_int_equal(s.entries, 1);
    assert_int_equal(s.evictions, 0);
    mmrt_vision_cache_destroy(c);
}

static void test_counters(void **state)
{
    (void)state;
    struct mmrt_vision_cache *c = cache_make(2, 1 << 20);
    struct mmrt_vision_cache_stats s;
    mmrt_vision_cache_stats(c, &s);
    assert_int_equal(s.queries + s.hits + s.evictions + s.entries + s.bytes, 0);
    assert_null(get(c, 1));
    insert(c, 1, 1, 2);
    mmrt_vision_cache_release(c, get(c, 1));
    mmrt_vision_cache_release(c, get(c, 1));
    assert_null(get(c, 2));
    insert(c, 2, 1, 2);
    insert(c, 3, 1, 2);
    mmrt_vision_cache_stats(c, &s);
    assert_int_equal(s.queries, 4);
    assert_int_equal(s.hits, 2);
    assert_int_equal(s.evictions, 1);
    assert_int_equal(s.entries, 2);
    assert_int_equal(s.bytes, 2 * 2 * sizeof(float));
    mmrt_vision_cache_stats(NULL, &s); /* off: all zero */
    assert_int_equal(s.queries + s.max_entries + s.max_bytes, 0);
    mmrt_vision_cache_destroy(c);
}

/* An entry evicted while referenced stays readable until its release (ASan watches). */
static void test_reference_outlives_eviction(void **state)
{
    (void)state;
    struct mmrt_vision_cache *c = cache_make(1, 1 << 20);
    insert(c, 1, 4, 4);
    const struct mmrt_vision_piece *p = get(c, 1);
    assert_non_null(p);
    insert(c, 2, 4, 4);
    assert_false(holds(c, 1));
    struct piece_buf want;
    piece_make(&want, 1, 4, 4);
    assert_memory_equal(p->features, want.f, 16 * sizeof(float));
    struct mmrt_vision_cache_stats s;
    mmrt_vision_cache_stats(c, &s);
    assert_int_equal(s.entries, 1);
    assert_int_equal(s.bytes, 16 * sizeof(float));
    mmrt_vision_cache_release(c, p);
    mmrt_vision_cache_destroy(c);
}

/* Many entries (the table grows) and threads looking up and inserting at once. */
struct hammer {
    struct mmrt_vision_cache *c;
    int seed;
};

static void *hammer_main(void *arg)
{
    struct hammer *h = arg;
    unsigned x = (unsigned)h->seed * 2654435761u + 1;
    for (int i = 0; i < 4000; i++) {
        x = x * 1103515245u + 12345u;
        const int n = (int)((x >> 8) % 300);
        const struct mmrt_vision_piece *p = get(h->c, n);
        if (p) {
            struct piece_buf want;
            piece_make(&want, n, 2, 3);
            if (memcmp(p->features, want.f, 6 * sizeof(float)) != 0)
                h->seed = -1;
            mmrt_vision_cache_release(h->c, p);
        } else {
            insert(h->c, n, 2, 3);
        }
    }
    return NULL;
}

static void test_threads(void **state)
{
    (void)state;
    struct mmrt_vision_cache *c = cache_make(200, 1 << 20);
    struct hammer h[4];
    pthread_t th[4];
    for (int t = 0; t < 4; t++) {
        h[t] = (struct hammer){ c, t + 1 };
        assert_int_equal(pthread_create(&th[t], NULL, hammer_main, &h[t]), 0);
    }
    for (int t = 0; t < 4; t++) {
        pthread_join(th[t], NULL);
        assert_int_not_equal(h[t].seed, -1);
    }
    struct mmrt_vision_cache_stats s;
    mmrt_vision_cache_stats(c, &s);
    assert_int_equal(s.queries, 16000);
    assert_true(s.entries <= 200 && s.entries > 100);
    assert_int_equal(s.bytes, s.entries * 6 * sizeof(float));
    mmrt_vision_cache_destroy(c);
}

/* ---- behind the embedding API ---- */

struct rt_opts {
    int64_t entries, mb, max_image_tokens;
    enum mmrt_oversize_images oversize;
};

static struct mmrt_runtime *open_rt(const char *fixture, struct rt_opts o)
{
    char dir[4096], err[2048] = "";
    fixture_dir(dir, sizeof dir, fixture);
    struct mmrt_device_config dev = { .name = "cpu0", .plugin = "cpu", .pool_mb = 64 };
    struct mmrt_config cfg = { .struct_size = sizeof cfg, .model_path = dir, .devices = &dev,
                               .n_devices = 1, .vision_cache_entries = o.entries,
                               .vision_cache_mb = o.mb,
                               .max_image_tokens = o.max_image_tokens,
                               .oversize_images = o.oversize };
    struct mmrt_runtime *rt = NULL;
    if (mmrt_create(&cfg, &rt, err, sizeof err) != MMRT_OK)
        fail_msg("%s: %s", fixture, err);
    return rt;
}

static struct mmrt_runtime_stats stats_of(struct mmrt_runtime *rt)
{
    struct mmrt_runtime_stats s = { .struct_size = sizeof s };
    assert_int_equal(mmrt_stats(rt, &s), MMRT_OK);
    return s;
}

static void run_ok(struct mmrt_runtime *rt, const struct mmrt_request *req, struct tokens *t,
                   struct mmrt_result *res)
{
    memset(t, 0, sizeof *t);
    *res = (struct mmrt_result){ .struct_size = sizeof *res };
    if (mmrt_run(rt, req, test_collect, t, res) != MMRT_OK)
        fail_msg("run: %s", mmrt_last_error(rt));
}

static void same_tokens(const struct tokens *a, const struct tokens *b)
{
    assert_int_equal(a->n, b->n);
    assert_memory_equal(a->ids, b->ids, (size_t)a->n * sizeof a->ids[0]);
}

static void vision_ok(struct mmrt_runtime *rt, const struct mmrt_request *req,
                      struct mmrt_vision_output *v)
{
    struct mmrt_error err = { 0 };
    if (mmrt_runtime_vision(rt, req, v, &err) != MMRT_OK)
        fail_msg("vision: %s", err.msg);
}

/* Bit for bit the same vision output, layout included. */
static void same_vision(const struct mmrt_vision_output *a, const struct mmrt_vision_output *b)
{
    assert_int_equal(a->n_images, b->n_images);
    assert_int_equal(a->n_tokens, b->n_tokens);
    assert_int_equal(a->dim, b->dim);
    const int64_t rows = mmrt_vision_output_rows(a);
    assert_int_equal(rows, mmrt_vision_output_rows(b));
    assert_true(rows > 0);
    if (memcmp(a->features, b->features, (size_t)(rows * a->dim) * sizeof(float)) != 0)
        fail_msg("features differ (rel %.3g)", golden_rel_err(a->features, b->features,
                                                                rows * a->dim));
    assert_true(!a->tokens_per_image == !b->tokens_per_image);
    if (a->tokens_per_image)
        assert_memory_equal(a->tokens_per_image, b->tokens_per_image,
                            (size_t)a->n_images * sizeof(int64_t));
    assert_true(!a->grid_thw == !b->grid_thw);
    if (a->grid_thw)
        assert_memory_equal(a->grid_thw, b->grid_thw, (size_t)a->n_images * 3 * sizeof(int32_t));
}

static uint8_t *read_all(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *buf = malloc((size_t)n);
    assert_non_null(buf);
    assert_int_equal(fread(buf, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    *len = (size_t)n;
    return buf;
}

/* LLaVA: the second identical request is a hit, skips the vision work, gives the same
 * tokens, and its features are the bits of the uncached model. */
static void test_llava_hit(void **state)
{
    (void)state;
    char img[4200];
    golden_fixture_path(img, sizeof img, "llava-images/grad_80x60.png");
    struct mmrt_runtime *rt = open_rt("llava-tiny", (struct rt_opts){ 0 });
    struct mmrt_runtime *off = open_rt("llava-tiny", (struct rt_opts){ .entries = -1 });
    struct mmrt_request req = { .images = TEST_FILE(img), .n_images = 1,
                                .prompt = "What is this?", .max_tokens = 8, .top_p = 1.0f };
    struct mmrt_runtime_stats s = stats_of(rt);
    assert_int_equal(s.vision_cache_capacity_entries, 2048);
    assert_int_equal(s.vision_cache_capacity_bytes, 1024ull << 20);
    assert_int_equal(s.vision_cache_queries, 0);
    struct tokens t0, t1, t2;
    struct mmrt_result r0, r1, r2;
    run_ok(off, &req, &t0, &r0);
    run_ok(rt, &req, &t1, &r1);
    s = stats_of(rt);
    assert_int_equal(s.vision_cache_queries, 1);
    assert_int_equal(s.vision_cache_hits, 0);
    assert_int_equal(s.vision_cache_entries, 1);
    assert_int_equal(s.vision_cache_bytes, 16 * 32 * sizeof(float)); /* 16 tokens × 32 */
    assert_true(r1.vision_ms > 0);
    run_ok(rt, &req, &t2, &r2);
    s = stats_of(rt);
    assert_int_equal(s.vision_cache_queries, 2);
    assert_int_equal(s.vision_cache_hits, 1);
    assert_int_equal(s.vision_cache_entries, 1);
    assert_true(r2.preprocess_ms == 0 && r2.vision_ms == 0);
    same_tokens(&t0, &t1);
    same_tokens(&t0, &t2);
    assert_int_equal(r2.n_prompt_tokens, r0.n_prompt_tokens);
    /* The features: uncached, a miss of another image's bytes, and a hit. */
    struct mmrt_vision_output v_off = { 0 }, v_hit = { 0 };
    vision_ok(off, &req, &v_off);
    vision_ok(rt, &req, &v_hit);
    same_vision(&v_off, &v_hit);
    assert_int_equal(stats_of(rt).vision_cache_hits, 2);
    mmrt_vision_output_free(&v_off);
    mmrt_vision_output_free(&v_hit);
    /* The same file's bytes in memory are the same image: a hit. */
    size_t len;
    uint8_t *bytes = read_all(img, &len);
    req.images = &(struct mmrt_image_input){ .data = bytes, .size = len };
    run_ok(rt, &req, &t2, &r2);
    same_tokens(&t0, &t2);
    assert_int_equal(stats_of(rt).vision_cache_hits, 3);
    free(bytes);
    /* Off: nothing is looked up. */
    s = stats_of(off);
    assert_int_equal(s.vision_cache_queries, 0);
    assert_int_equal(s.vision_cache_entries, 0);
    assert_int_equal(s.vision_cache_capacity_entries, 0);
    assert_int_equal(s.vision_cache_capacity_bytes, 0);
    mmrt_destroy(off);
    mmrt_destroy(rt);
}

/* LLaVA-NeXT and Fuyu (their own layouts and image-size dependent token counts): a hit is
 * the uncached output, bit for bit, and gives the same tokens. */
static void test_other_models_hit(void **state)
{
    (void)state;
    static const char *const fixtures[] = { "llava-next-tiny", "fuyu-tiny" };
    char img[4200];
    golden_fixture_path(img, sizeof img, "llava-images/grad_80x60.png");
    for (size_t f = 0; f < sizeof fixtures / sizeof fixtures[0]; f++) {
        struct mmrt_runtime *rt = open_rt(fixtures[f], (struct rt_opts){ 0 });
        struct mmrt_runtime *off = open_rt(fixtures[f], (struct rt_opts){ .entries = -1 });
        struct mmrt_request req = { .images = TEST_FILE(img), .n_images = 1,
                                    .prompt = "What is this?", .max_tokens = 6,
                                    .top_p = 1.0f };
        struct tokens t_off, t_miss, t_hit;
        struct mmrt_result r_off, r_miss, r_hit;
        run_ok(off, &req, &t_off, &r_off);
        run_ok(rt, &req, &t_miss, &r_miss);
        run_ok(rt, &req, &t_hit, &r_hit);
        same_tokens(&t_off, &t_miss);
        same_tokens(&t_off, &t_hit);
        assert_true(r_hit.preprocess_ms == 0 && r_hit.vision_ms == 0);
        struct mmrt_vision_output v_off = { 0 }, v_hit = { 0 };
        vision_ok(off, &req, &v_off);
        vision_ok(rt, &req, &v_hit);
        same_vision(&v_off, &v_hit);
        struct mmrt_runtime_stats s = stats_of(rt);
        assert_int_equal(s.vision_cache_queries, 3);
        assert_int_equal(s.vision_cache_hits, 2);
        mmrt_vision_output_free(&v_off);
        mmrt_vision_output_free(&v_hit);
        mmrt_destroy(off);
        mmrt_destroy(rt);
    }
}

/* A traced request (the golden tests, mmrt_check) runs the real vision stage. */
static void test_trace_bypasses(void **state)
{
    (void)state;
    char img[4200];
    golden_fixture_path(img, sizeof img, "llava-images/grad_80x60.png");
    struct mmrt_runtime *rt = open_rt("llava-tiny", (struct rt_opts){ 0 });
    struct mmrt_request req = { .images = TEST_FILE(img), .n_images = 1, .prompt = "Hi",
                                .max_tokens = 2, .top_p = 1.0f };
    struct golden_capture cap = { 0 };
    struct mmrt_result res = { .struct_size = sizeof res };
    golden_run(rt, &req, &cap, &res);
    golden_capture_free(&cap);
    golden_run(rt, &req, &cap, &res);
    assert_int_equal(cap.n_feature_calls, 1); /* the model ran */
    golden_capture_free(&cap);
    struct mmrt_check_report rep;
    assert_int_equal(mmrt_check(rt, &req, &rep), MMRT_OK);
    assert_true(rep.pass);
    assert_int_equal(stats_of(rt).vision_cache_queries, 0);
    mmrt_destroy(rt);
}

/* Qwen2-VL, several images: per-image lookups, partial hits, any order — always the bits of
 * the uncached model on the whole request, and its tokens. */
static void test_qwen2vl_partial_hits(void **state)
{
    (void)state;
    char a[4200], b[4200], c[4200];
    golden_fixture_path(a, sizeof a, "llava-images/grad_80x60.png");
    golden_fixture_path(b, sizeof b, "qwen2vl-images/grad_98x70.png");
    golden_fixture_path(c, sizeof c, "llava-images/grad_45x90.png");
    struct mmrt_runtime *rt = open_rt("qwen2vl-tiny", (struct rt_opts){ 0 });
    struct mmrt_runtime *off = open_rt("qwen2vl-tiny", (struct rt_opts){ .entries = -1 });
    const struct mmrt_image_input A = { .path = a }, B = { .path = b }, C = { .path = c };
    /* Each step: the images, then the queries and hits it adds. */
    const struct {
        struct mmrt_image_input im[3];
        int n, hits;
    } steps[] = {
        { { A }, 1, 0 },       /* A stored */
        { { A, B }, 2, 1 },    /* partial: A hits, B is encoded alone */
        { { A, B }, 2, 2 },    /* all hit */
        { { B, A }, 2, 2 },    /* another order */
        { { C, A, B }, 3, 2 }, /* a miss in front */
        { { B, B }, 2, 2 },    /* one image twice */
    };
    uint64_t queries = 0, hits = 0;
    for (size_t k = 0; k < sizeof steps / sizeof steps[0]; k++) {
        struct mmrt_request req = { .images = steps[k].im, .n_images = steps[k].n,
                                    .prompt = "Compare.", .max_tokens = 6, .top_p = 1.0f };
        struct tokens t_off, t_on;
        struct mmrt_result r_off, r_on;
        run_ok(off, &req, &t_off, &r_off);
        run_ok(rt, &req, &t_on, &r_on);
        same_tokens(&t_off, &t_on);
        assert_int_equal(r_on.n_prompt_tokens, r_off.n_prompt_tokens);
        queries += (uint64_t)steps[k].n;
        hits += (uint64_t)steps[k].hits;
        struct mmrt_runtime_stats s = stats_of(rt);
        if (s.vision_cache_queries != queries || s.vision_cache_hits != hits)
            fail_msg("step %zu: %llu queries, %llu hits; expected %llu, %llu", k,
                     (unsigned long long)s.vision_cache_queries,
                     (unsigned long long)s.vision_cache_hits, (unsigned long long)queries,
                     (unsigned long long)hits);
        if (steps[k].hits == steps[k].n)
            assert_true(r_on.preprocess_ms == 0 && r_on.vision_ms == 0);
        /* The features, now all hits. */
        struct mmrt_vision_output v_off = { 0 }, v_on = { 0 };
        vision_ok(off, &req, &v_off);
        vision_ok(rt, &req, &v_on);
        same_vision(&v_off, &v_on);
        queries += (uint64_t)steps[k].n;
        hits += (uint64_t)steps[k].n;
        mmrt_vision_output_free(&v_off);
        mmrt_vision_output_free(&v_on);
    }
    assert_int_equal(stats_of(rt).vision_cache_entries, 3);
    /* A chat whose turns carry the images: the sub-request's turns are recounted. */
    const struct mmrt_image_input D[3] = { A, C, B };
    const struct mmrt_message chat[4] = {
        { .role = "user", .text = "Look.", .n_images = 1 },
        { .role = "assistant", .text = "Yes." },
        { .role = "user", .text = "And these?", .n_images = 2 },
        { .role = "system", .text = "Be brief." },
    };
    mmrt_destroy(rt);
    rt = open_rt("qwen2vl-tiny", (struct rt_opts){ 0 });
    struct mmrt_request one = { .images = &C, .n_images = 1, .prompt = "x", .max_tokens = 1,
                                .top_p = 1.0f };
    struct tokens t_off, t_on;
    struct mmrt_result r_off, r_on;
    run_ok(rt, &one, &t_on, &r_on); /* C cached: the chat misses A and B, in two turns */
    struct mmrt_request req = { .messages = chat, .n_messages = 4, .images = D, .n_images = 3,
                                .max_tokens = 6, .top_p = 1.0f };
    run_ok(off, &req, &t_off, &r_off);
    run_ok(rt, &req, &t_on, &r_on);
    same_tokens(&t_off, &t_on);
    assert_int_equal(stats_of(rt).vision_cache_hits, 1);
    struct mmrt_vision_output v_off = { 0 }, v_on = { 0 };
    vision_ok(off, &req, &v_off);
    vision_ok(rt, &req, &v_on);
    same_vision(&v_off, &v_on);
    mmrt_vision_output_free(&v_off);
    mmrt_vision_output_free(&v_on);
    mmrt_destroy(off);
    mmrt_destroy(rt);
}

/* Expects req to fail on both runtimes with the same status and message. */
static void same_failure(struct mmrt_runtime *on, struct mmrt_runtime *off,
                         const struct mmrt_request *req, mmrt_status want)
{
    struct tokens t;
    struct mmrt_result r_on = { .struct_size = sizeof r_on };
    struct mmrt_result r_off = { .struct_size = sizeof r_off };
    assert_int_equal(mmrt_run(off, req, test_collect, &t, &r_off), want);
    assert_int_equal(mmrt_run(on, req, test_collect, &t, &r_on), want);
    assert_string_equal(r_on.error, r_off.error);
}

/* Images that fit the budget alone but not together are refused as the model refuses them,
 * also when every one of them is cached; a broken image among cached ones fails as without
 * the cache. */
static void test_failures_in_the_models_words(void **state)
{
    (void)state;
    char a[4200], b[4200];
    golden_fixture_path(a, sizeof a, "llava-images/grad_80x60.png"); /* 6 tokens */
    golden_fixture_path(b, sizeof b, "qwen2vl-images/grad_98x70.png"); /* 8 tokens */
    const struct rt_opts o = { .max_image_tokens = 10 };
    struct mmrt_runtime *rt = open_rt("qwen2vl-tiny", o);
    struct mmrt_runtime *off = open_rt("qwen2vl-tiny", (struct rt_opts){ .entries = -1,
                                                                          .max_image_tokens = 10 });
    struct mmrt_image_input im[2] = { { .path = a }, { .path = b } };
    struct mmrt_request req = { .images = im, .n_images = 1, .prompt = "x", .max_tokens = 1,
                                .top_p = 1.0f };
    struct tokens t;
    struct mmrt_result r;
    run_ok(rt, &req, &t, &r);
    req.images = &im[1];
    run_ok(rt, &req, &t, &r);
    assert_int_equal(stats_of(rt).vision_cache_entries, 2);
    req.images = im;
    req.n_images = 2;
    same_failure(rt, off, &req, MMRT_ERR_LIMIT); /* both hit: 14 > 10 */
    assert_non_null(strstr(mmrt_last_error(rt), "max_image_tokens = 10"));
    /* One cached, one missing: the same. */
    mmrt_destroy(rt);
    rt = open_rt("qwen2vl-tiny", o);
    req.n_images = 1;
    run_ok(rt, &req, &t, &r);
    req.n_images = 2;
    same_failure(rt, off, &req, MMRT_ERR_LIMIT);
    /* Bytes that are no image next to a cached one. */
    static const char junk[] = "this is not a PNG";
    im[1] = (struct mmrt_image_input){ .data = junk, .size = sizeof junk };
    same_failure(rt, off, &req, MMRT_ERR_UNSUPPORTED); /* no PNG or JPEG magic */
    assert_non_null(strstr(mmrt_last_error(rt), "image 2 of 2"));
    /* A file that is not there. */
    im[1] = (struct mmrt_image_input){ .path = "/nonexistent/x.png" };
    same_failure(rt, off, &req, MMRT_ERR_IO);
    mmrt_destroy(off);
    mmrt_destroy(rt);
}

/* oversize_images = downscale with several images: the shared budget makes each image's
 * size depend on the others, so the cache stays out; one image still goes through it. */
static void test_downscale_bypasses(void **state)
{
    (void)state;
    char a[4200], b[4200];
    golden_fixture_path(a, sizeof a, "llava-images/grad_80x60.png");
    golden_fixture_path(b, sizeof b, "qwen2vl-images/grad_98x70.png");
    const struct rt_opts o = { .max_image_tokens = 10, .oversize = MMRT_OVERSIZE_DOWNSCALE };
    struct mmrt_runtime *rt = open_rt("qwen2vl-tiny", o);
    struct rt_opts o_off = o;
    o_off.entries = -1;
    struct mmrt_runtime *off = open_rt("qwen2vl-tiny", o_off);
    const struct mmrt_image_input im[2] = { { .path = a }, { .path = b } };
    struct mmrt_request req = { .images = im, .n_images = 2, .prompt = "x", .max_tokens = 3,
                                .top_p = 1.0f };
    struct tokens t_on, t_off;
    struct mmrt_result r_on, r_off;
    run_ok(rt, &req, &t_on, &r_on);
    run_ok(off, &req, &t_off, &r_off);
    same_tokens(&t_on, &t_off);
    assert_int_equal(stats_of(rt).vision_cache_queries, 0);
    req.images = &im[1]; /* 8 tokens fit 10 alone */
    req.n_images = 1;
    run_ok(rt, &req, &t_on, &r_on);
    run_ok(rt, &req, &t_on, &r_on);
    run_ok(off, &req, &t_off, &r_off);
    same_tokens(&t_on, &t_off);
    struct mmrt_runtime_stats s = stats_of(rt);
    assert_int_equal(s.vision_cache_queries, 2);
    assert_int_equal(s.vision_cache_hits, 1);
    mmrt_destroy(off);
    mmrt_destroy(rt);
}

/* mmrt_job_image_key: an in-memory image's key right after mmrt_submit; a path image's once
 * its vision stage ran (in on_accepted), equal to the key of the same file's bytes. */
struct key_probe {
    struct mmrt_job *job;
    sem_t submitted;
    char key[MMRT_IMAGE_KEY_SIZE];
    mmrt_status st;
};

static void probe_accepted(void *user, int n_prompt_tokens)
{
    struct key_probe *p = user;
    (void)n_prompt_tokens;
    sem_wait(&p->submitted); /* p->job is set */
    p->st = mmrt_job_image_key(p->job, 0, p->key, sizeof p->key);
}

static void submit_probe(struct mmrt_runtime *rt, const struct mmrt_request *req,
                         struct key_probe *p, char *key_after_submit)
{
    memset(p, 0, sizeof *p);
    sem_init(&p->submitted, 0, 0);
    const struct mmrt_job_callbacks cb = { .struct_size = sizeof cb,
                                           .on_accepted = probe_accepted, .user = p };
    char err[512];
    if (mmrt_submit_with(rt, req, &cb, &p->job, err, sizeof err) != MMRT_OK)
        fail_msg("submit: %s", err);
    assert_int_equal(mmrt_job_image_key(p->job, 0, key_after_submit, MMRT_IMAGE_KEY_SIZE),
                     MMRT_OK);
    /* Refusals. */
    char small[8] = "x";
    assert_int_equal(mmrt_job_image_key(p->job, 1, key_after_submit + 0, 0), MMRT_ERR_INVALID_ARG);
    assert_int_equal(mmrt_job_image_key(p->job, 1, small, sizeof small), MMRT_ERR_INVALID_ARG);
    assert_string_equal(small, "");
    strcpy(small, "x");
    assert_int_equal(mmrt_job_image_key(p->job, 0, small, sizeof small), MMRT_ERR_INVALID_ARG);
    assert_string_equal(small, "");
    assert_int_equal(mmrt_job_image_key(p->job, -1, small, sizeof small), MMRT_ERR_INVALID_ARG);
    assert_int_equal(mmrt_job_image_key(NULL, 0, small, sizeof small), MMRT_ERR_INVALID_ARG);
    assert_int_equal(mmrt_job_image_key(p->job, 0, NULL, 65), MMRT_ERR_INVALID_ARG);
    sem_post(&p->submitted);
    struct mmrt_result res = { .struct_size = sizeof res };
    assert_int_equal(mmrt_wait(p->job, &res), MMRT_OK);
    assert_int_equal(p->st, MMRT_OK);
    sem_destroy(&p->submitted);
}

static bool is_key(const char *k)
{
    if (strlen(k) != 64)
        return false;
    for (const char *c = k; *c; c++)
        if (!((*c >= '0' && *c <= '9') || (*c >= 'a' && *c <= 'f')))
            return false;
    return true;
}

static void test_job_image_key(void **state)
{
    (void)state;
    char a[4200], b[4200];
    golden_fixture_path(a, sizeof a, "llava-images/grad_80x60.png");
    golden_fixture_path(b, sizeof b, "llava-images/grad_45x90.png");
    struct mmrt_runtime *rt = open_rt("llava-tiny", (struct rt_opts){ 0 });
    size_t len;
    uint8_t *bytes = read_all(a, &len);
    struct mmrt_request req = { .images = &(struct mmrt_image_input){ .data = bytes, .size = len },
                                .n_images = 1, .prompt = "x", .max_tokens = 2, .top_p = 1.0f };
    struct key_probe p;
    char at_submit[MMRT_IMAGE_KEY_SIZE];
    submit_probe(rt, &req, &p, at_submit);
    assert_true(is_key(at_submit)); /* computed by mmrt_submit */
    assert_string_equal(p.key, at_submit);
    char bytes_key[MMRT_IMAGE_KEY_SIZE];
    strcpy(bytes_key, at_submit);
    /* The same file as a path: its key comes with its vision stage, and it is a hit. */
    req.images = TEST_FILE(a);
    submit_probe(rt, &req, &p, at_submit);
    assert_string_equal(p.key, bytes_key);
    struct mmrt_runtime_stats s = stats_of(rt);
    assert_int_equal(s.vision_cache_queries, 2);
    assert_int_equal(s.vision_cache_hits, 1);
    /* Another image, another key. */
    req.images = TEST_FILE(b);
    submit_probe(rt, &req, &p, at_submit);
    assert_true(is_key(p.key));
    assert_string_not_equal(p.key, bytes_key);
    mmrt_destroy(rt);
    /* Another runtime with the same settings gives the same key; with the cache off, none. */
    rt = open_rt("llava-tiny", (struct rt_opts){ .entries = 5 });
    req.images = &(struct mmrt_image_input){ .data = bytes, .size = len };
    submit_probe(rt, &req, &p, at_submit);
    assert_string_equal(at_submit, bytes_key);
    mmrt_destroy(rt);
    rt = open_rt("llava-tiny", (struct rt_opts){ .max_image_tokens = 100 });
    submit_probe(rt, &req, &p, at_submit);
    assert_true(is_key(at_submit));
    assert_string_not_equal(at_submit, bytes_key); /* other settings */
    mmrt_destroy(rt);
    rt = open_rt("llava-tiny", (struct rt_opts){ .entries = -1 });
    submit_probe(rt, &req, &p, at_submit);
    assert_string_equal(at_submit, "");
    assert_string_equal(p.key, "");
    mmrt_destroy(rt);
    free(bytes);
}

/* A JPEG with a comment segment (FF FE) after SOI: other bytes, the same pixels. */
static uint8_t *jpeg_variant(const uint8_t *jpg, size_t len, int n, size_t *out_len)
{
    char text[16];
    const int tn = snprintf(text, sizeof text, "v%d", n);
    const size_t seg = 4 + (size_t)tn;
    uint8_t *o = malloc(len + seg);
    assert_non_null(o);
    memcpy(o, jpg, 2);
    o[2] = 0xff;
    o[3] = 0xfe;
    o[4] = (uint8_t)((seg - 2) >> 8);
    o[5] = (uint8_t)(seg - 2);
    memcpy(o + 6, text, (size_t)tn);
    memcpy(o + 2 + seg, jpg + 2, len - 2);
    *out_len = len + seg;
    return o;
}

/* vision_mb = 1 holds 512 of llava-tiny's 2 KiB images: 600 distinct ones evict 88, the
 * oldest first; a small vision_entries bounds by count. */
static void test_eviction_through_the_api(void **state)
{
    (void)state;
    enum { N = 600 };
    const uint64_t per_image = 16 * 32 * sizeof(float);
    size_t len;
    char src[4200];
    golden_fixture_path(src, sizeof src, "images/rgb_50x90.jpg");
    uint8_t *jpg = read_all(src, &len);
    struct mmrt_runtime *rt = open_rt("llava-tiny", (struct rt_opts){ .mb = 1 });
    uint8_t **imgs = calloc(N, sizeof *imgs);
    struct mmrt_image_input *in = calloc(N, sizeof *in);
    struct mmrt_request *reqs = calloc(N, sizeof *reqs);
    struct mmrt_result *res = calloc(N, sizeof *res);
    assert_true(imgs && in && reqs && res);
    for (int i = 0; i < N; i++) {
        size_t n;
        imgs[i] = jpeg_variant(jpg, len, i, &n);
        in[i] = (struct mmrt_image_input){ .data = imgs[i], .size = n };
        reqs[i] = (struct mmrt_request){ .images = &in[i], .n_images = 1, .prompt = "x",
                                         .max_tokens = 1, .top_p = 1.0f };
        res[i].struct_size = sizeof res[i];
    }
    if (mmrt_run_batch(rt, reqs, N, NULL, NULL, res) != MMRT_OK)
        fail_msg("batch: %s", mmrt_last_error(rt));
    struct mmrt_runtime_stats s = stats_of(rt);
    const uint64_t fit = (1u << 20) / per_image;
    assert_int_equal(fit, 512);
    assert_int_equal(s.vision_cache_queries, N);
    assert_int_equal(s.vision_cache_hits, 0);
    assert_int_equal(s.vision_cache_entries, fit);
    assert_int_equal(s.vision_cache_bytes, fit * per_image);
    assert_int_equal(s.vision_cache_evictions, N - fit);
    assert_int_equal(s.vision_cache_capacity_bytes, 1u << 20);
    /* The oldest went, the newest stayed. */
    struct tokens t;
    struct mmrt_result r;
    run_ok(rt, &reqs[0], &t, &r);
    assert_int_equal(stats_of(rt).vision_cache_hits, 0);
    run_ok(rt, &reqs[N - 1], &t, &r);
    assert_int_equal(stats_of(rt).vision_cache_hits, 1);
    mmrt_destroy(rt);

    rt = open_rt("llava-tiny", (struct rt_opts){ .entries = 2 });
    for (int i = 0; i < 3; i++)
        run_ok(rt, &reqs[i], &t, &r);
    run_ok(rt, &reqs[0], &t, &r); /* evicted by the third */
    s = stats_of(rt);
    assert_int_equal(s.vision_cache_hits, 0);
    assert_int_equal(s.vision_cache_entries, 2);
    assert_int_equal(s.vision_cache_evictions, 2);
    assert_int_equal(s.vision_cache_capacity_entries, 2);
    mmrt_destroy(rt);
    for (int i = 0; i < N; i++)
        free(imgs[i]);
    free(imgs);
    free(in);
    free(reqs);
    free(res);
    free(jpg);
}

/* The two config fields are checked like the others. */
static void test_config_refused(void **state)
{
    (void)state;
    char dir[4096], err[1024];
    fixture_dir(dir, sizeof dir, "llava-tiny");
    struct mmrt_device_config dev = { .name = "cpu0", .plugin = "cpu", .pool_mb = 64 };
    struct mmrt_config cfg = { .struct_size = sizeof cfg, .model_path = dir, .devices = &dev,
                               .n_devices = 1, .vision_cache_mb = -1 };
    struct mmrt_runtime *rt = NULL;
    assert_int_equal(mmrt_create(&cfg, &rt, err, sizeof err), MMRT_ERR_CONFIG);
    assert_string_equal(err, "config: [cache] vision_mb -1 must be 1 … 16777216 MiB (0 = 1024)");
    cfg.vision_cache_mb = 0;
    cfg.vision_cache_entries = 16777217;
    assert_int_equal(mmrt_create(&cfg, &rt, err, sizeof err), MMRT_ERR_CONFIG);
    assert_string_equal(err, "config: [cache] vision_entries 16777217 must be at most 16777216 "
                             "(0 = 2048, negative = off)");
    assert_null(rt);
}

int main(void)
{
    mmrt_set_log_sink(golden_quiet, NULL, MMRT_LOG_WARN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sha256_vectors),
        cmocka_unit_test(test_key_properties),
        cmocka_unit_test(test_create_refuses),
        cmocka_unit_test(test_hit_is_a_copy),
        cmocka_unit_test(test_entry_bound),
        cmocka_unit_test(test_eviction_order),
        cmocka_unit_test(test_byte_bound),
        cmocka_unit_test(test_too_big_not_stored),
        cmocka_unit_test(test_counters),
        cmocka_unit_test(test_reference_outlives_eviction),
        cmocka_unit_test(test_threads),
        cmocka_unit_test(test_llava_hit),
        cmocka_unit_test(test_other_models_hit),
        cmocka_unit_test(test_trace_bypasses),
        cmocka_unit_test(test_qwen2vl_partial_hits),
        cmocka_unit_test(test_failures_in_the_models_words),
        cmocka_unit_test(test_downscale_bypasses),
        cmocka_unit_test(test_job_image_key),
        cmocka_unit_test(test_eviction_through_the_api),
        cmocka_unit_test(test_config_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
