/*
 * tests/test_memory.c — weights at their exact size, outside the pool, and the paged KV cache
 * (DESIGN.md "Memory").
 *
 *   - The CPU plugin's adopted arenas (plugin.h arena_adopt_host): readable by every op and
 *     by download, never written: upload, copy and a kernel dst inside one are refused, and
 *     freeing the arena leaves the memory to its owner.
 *   - On the CPU the tiny LLaVA runs on its weights in place (every byte mapped, nothing
 *     reserved, the pool empty after load); on OpenCL (PoCL) they are copied into weight
 *     arenas of exactly their size plus alignment padding; so they are on the CPU with its
 *     option weights = copy.
 *   - A checkpoint whose tensors are not aligned to their element size in the file (an odd
 *     header length; safetensors promises no alignment) is copied, and answers the same.
 *   - mmrt_memory_report honours struct_size both ways.
 *   - The paged KV cache: the same greedy tokens and bit-identical logits whatever the page
 *     size; a request whose prompt and max_tokens need more positions than max_kv_tokens is
 *     refused with the numbers, and one that fits exactly runs again and again (its pages come
 *     back); a budget the pool cannot hold is refused at load naming the key.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "mmrt/mmrt.h"
#include "request_util.h"
#include "plugin_harness.h"

#define N_TOKENS 8

static char fixture[4096], image[4096];
static const char *prompt = "What is shown in this image?";

static void quiet(void *user, enum mmrt_log_level level, const char *who, const char *msg)
{
    (void)user;
    (void)who;
    if (level >= MMRT_LOG_WARN)
        fprintf(stderr, "%s\n", msg);
}

/* ---- the plugin's adopted arenas ---------------------------------------------------------- */

static void test_cpu_adopted_arena_is_read_only(void **state)
{
    (void)state;
    struct harness h;
    assert_int_equal(harness_open(&h, harness_plugin_path("cpu"), NULL, 0), MMRT_OK);
    const struct mmrt_plugin *P = h.plugin;
    assert_true(P->hdr.struct_size >= offsetof(struct mmrt_plugin, arena_adopt_host) +
                                          sizeof P->arena_adopt_host);
    assert_non_null(P->arena_adopt_host);

    /* 2 bytes in, so the tensor is aligned to its element size only, as in a mapping. */
    float *host = malloc(64 * sizeof(float) + 8);
    assert_non_null(host);
    float *x = (float *)((char *)host + 4);
    for (int i = 0; i < 16; i++)
        x[i] = (float)i;
    void *arena = NULL;
    assert_int_equal(P->arena_adopt_host(h.dev, host, 64 * sizeof(float) + 8, &arena), MMRT_OK);
    assert_non_null(arena);

    struct mmrt_tensor a;
    memset(&a, 0, sizeof a);
    a.hdr = (struct mmrt_abi_header)MMRT_ABI_HEADER_INIT(struct mmrt_tensor);
    a.buffer = arena;
    a.offset = 4;
    a.dtype = MMRT_DTYPE_F32;
    a.n_dims = 1;
    a.ne[0] = 16;
    a.nb[0] = 4;
    for (int i = 1; i < MMRT_MAX_DIMS; i++)
        a.ne[i] = 1;

    struct harness_tensor y;
    assert_int_equal(harness_tensor_new(&h, MMRT_DTYPE_F32, 1, (const int64_t[]){ 16 }, &y),
                     MMRT_OK);
    /* Read by a kernel: y = a + a. */
    const struct mmrt_op_args args = {
        .hdr = MMRT_ABI_HEADER_INIT(struct mmrt_op_args), .op = MMRT_OP_ADD, .n_src = 2,
        .src = { &a, &a }, .dst = &y.t,
    };
    assert_int_equal(P->ops[MMRT_OP_ADD](h.dev, &args), MMRT_OK);
    float out[16];
    assert_int_equal(harness_download(&h, &y, out), MMRT_OK);
    for (int i = 0; i < 16; i++)
        assert_true(out[i] == 2.0f * (float)i);
    /* Read by download and as a copy source. */
    float back[16];
    assert_int_equal(P->download(h.dev, back, arena, 4, sizeof back), MMRT_OK);
    assert_memory_equal(back, x, sizeof back);
    assert_int_equal(P->copy(h.dev, y.t.buffer, 0, arena, 4, sizeof back), MMRT_OK);

    /* Never written. */
    assert_int_equal(P->upload(h.dev, arena, 4, out, sizeof out), MMRT_ERR_INVALID_ARG);
    assert_non_null(strstr(P->last_error(h.dev), "read-only"));
    assert_int_equal(P->copy(h.dev, arena, 4, y.t.buffer, 0, sizeof out), MMRT_ERR_INVALID_ARG);
    assert_non_null(strstr(P->last_error(h.dev), "read-only"));
    const struct mmrt_op_args into = {
        .hdr = MMRT_ABI_HEADER_INIT(struct mmrt_op_args), .op = MMRT_OP_ADD, .n_src = 2,
        .src = { &y.t, &y.t }, .dst = &a,
    };
    assert_int_equal(P->ops[MMRT_OP_ADD](h.dev, &into), MMRT_ERR_INVALID_ARG);
    assert_non_null(strstr(P->last_error(h.dev), "read-only"));
    /* Nor through a source a kernel writes: an I8 store's scales (SET_ROWS src2). */
    struct harness_tensor v1, i1, codes;
    const int32_t row = 3;
    assert_int_equal(harness_tensor_new(&h, MMRT_DTYPE_F32, 2, (const int64_t[]){ 1, 1 }, &v1),
                     MMRT_OK);
    assert_int_equal(harness_tensor_new(&h, MMRT_DTYPE_I32, 1, (const int64_t[]){ 1 }, &i1),
                     MMRT_OK);
    assert_int_equal(harness_tensor_new(&h, MMRT_DTYPE_I8, 2, (const int64_t[]){ 16, 1 }, &codes),
                     MMRT_OK);
    assert_int_equal(harness_upload(&h, &v1, out), MMRT_OK);
    assert_int_equal(harness_upload(&h, &i1, &row), MMRT_OK);
    const struct mmrt_op_args scales_into = {
        .hdr = MMRT_ABI_HEADER_INIT(struct mmrt_op_args), .op = MMRT_OP_SET_ROWS, .n_src = 3,
        .src = { &v1.t, &i1.t, &a }, .dst = &codes.t,
    };
    assert_int_equal(P->ops[MMRT_OP_SET_ROWS](h.dev, &scales_into), MMRT_ERR_INVALID_ARG);
    assert_non_null(strstr(P->last_error(h.dev), "src2 (scales) lies in adopted read-only"));
    harness_tensor_free(&h, &v1);
    harness_tensor_free(&h, &i1);
    harness_tensor_free(&h, &codes);
    for (int i = 0; i < 16; i++)
        assert_true(x[i] == (float)i);
    /* A range past the adopted bytes is refused like any other arena's. */
    assert_int_equal(P->download(h.dev, back, arena, 64 * sizeof(float), sizeof back),
                     MMRT_ERR_INVALID_ARG);
    assert_int_equal(P->arena_adopt_host(h.dev, NULL, 16, &arena), MMRT_ERR_INVALID_ARG);

    /* Freeing the arena leaves the memory to its owner (ASan sees a double free otherwise). */
    P->arena_free(h.dev, arena);
    x[0] = 42.0f;
    harness_tensor_free(&h, &y);
    harness_close(&h);
    free(host);
}

/* ---- weights of a whole model ------------------------------------------------------------- */

static struct mmrt_runtime *open_model(const char *path, const char *vision_plugin,
                                       const char *language_plugin)
{
    struct mmrt_device_config devs[2] = {
        { .name = "v", .plugin = vision_plugin, .pool_mb = 32 },
        { .name = "l", .plugin = language_plugin, .pool_mb = 32 },
    };
    const int two = strcmp(vision_plugin, language_plugin) != 0;
    struct mmrt_config cfg = { .model_path = path, .devices = devs, .n_devices = 1 + two,
                               .vision_device = "v", .language_device = two ? "l" : "v" };
    struct mmrt_runtime *rt = NULL;
    char err[2048];
    if (mmrt_create(&cfg, &rt, err, sizeof err) != MMRT_OK)
        fail_msg("%s on %s/%s: %s", path, vision_plugin, language_plugin, err);
    return rt;
}


static void run_tokens(struct mmrt_runtime *rt, struct tokens *t)
{
    struct mmrt_request req = { .images = TEST_FILE(image), .n_images = 1,
                                .prompt = prompt, .max_tokens = N_TOKENS,
                                .top_p = 1.0f };
    struct mmrt_result res = { 0 };
    t->n = 0;
    if (mmrt_run(rt, &req, test_collect, t, &res) != MMRT_OK)
        fail_msg("run: %s", res.error);
    assert_int_equal(t->n, N_TOKENS);
}

static struct mmrt_memory_report memory(struct mmrt_runtime *rt, int dev)
{
    struct mmrt_memory_report mr = { .struct_size = sizeof mr };
    assert_int_equal(mmrt_device_memory(rt, dev, &mr), MMRT_OK);
    assert_int_equal(mr.weight_bytes, mr.weight_mapped_bytes + mr.weight_copied_bytes);
    return mr;
}

static struct tokens cpu_tokens;

static void test_cpu_runs_in_place(void **state)
{
    (void)state;
    struct mmrt_runtime *rt = open_model(fixture, "cpu", "cpu");
    struct mmrt_memory_report mr = memory(rt, 0);
    print_message("cpu: %llu weight bytes in %llu tensors, %llu mapped, %llu reserved\n",
                  (unsigned long long)mr.weight_bytes, (unsigned long long)mr.weight_tensors,
                  (unsigned long long)mr.weight_mapped_bytes,
                  (unsigned long long)mr.weight_reserved_bytes);
    assert_true(mr.weight_bytes > 0 && mr.weight_tensors > 0);
    assert_int_equal(mr.weight_mapped_bytes, mr.weight_bytes);
    assert_int_equal(mr.weight_reserved_bytes, 0);
    /* Between requests the pool holds only the KV page store: it is working memory. */
    const uint64_t kv = mr.pool_bytes_in_use;
    assert_true(kv >= mr.kv_bytes && mr.kv_bytes > 0);
    assert_int_equal(mr.kv_page_tokens, 16);
    assert_true(mr.kv_pages_total > 0);
    assert_int_equal(mr.kv_pages_used, 0);
    assert_string_equal(mr.kv_dtype, "F32");
    {
        /* [model] kv_dtype is reported (mmrt --json shows it per device) */
        struct mmrt_device_config dev = { .name = "v", .plugin = "cpu", .pool_mb = 32 };
        struct mmrt_config cfg = { .model_path = fixture, .devices = &dev, .n_devices = 1,
                                   .vision_device = "v", .language_device = "v",
                                   .kv_dtype = MMRT_KV_FP8 };
        struct mmrt_runtime *rt8 = NULL;
        char err[2048];
        if (mmrt_create(&cfg, &rt8, err, sizeof err) != MMRT_OK)
            fail_msg("kv_dtype fp8: %s", err);
        struct mmrt_memory_report m8 = memory(rt8, 0);
        assert_string_equal(m8.kv_dtype, "F8E4M3");
        assert_int_equal(m8.kv_bytes * 4, mr.kv_bytes);
        mmrt_destroy(rt8);
    }
    run_tokens(rt, &cpu_tokens);
    mr = memory(rt, 0);
    assert_int_equal(mr.pool_bytes_in_use, kv);
    assert_int_equal(mr.kv_pages_used, 0); /* the request's pages came back */
    /* A decode step asks for the same shapes every token: level 1 serves them. */
    assert_true(mr.level1_hits > 0);
    assert_true(mr.pool_bytes_held >= mr.pool_bytes_in_use);
    mmrt_destroy(rt);
}

static void test_cpu_weights_copy_option(void **state)
{
    (void)state;
    const struct mmrt_option copy = { "weights", "copy" };
    struct mmrt_device_config dev = { .name = "c", .plugin = "cpu", .pool_mb = 32,
                                      .options = &copy, .n_options = 1 };
    struct mmrt_config cfg = { .model_path = fixture, .devices = &dev, .n_devices = 1 };
    struct mmrt_runtime *rt = NULL;
    char err[2048];
    if (mmrt_create(&cfg, &rt, err, sizeof err) != MMRT_OK)
        fail_msg("%s", err);
    struct mmrt_memory_report mr = memory(rt, 0);
    assert_int_equal(mr.weight_mapped_bytes, 0);
    assert_int_equal(mr.weight_copied_bytes, mr.weight_bytes);
    struct tokens t;
    run_tokens(rt, &t);
    assert_memory_equal(t.ids, cpu_tokens.ids, sizeof t.ids[0] * N_TOKENS);
    mmrt_destroy(rt);
    const struct mmrt_option bad = { "weights", "mmap" };
    dev.options = &bad;
    assert_int_equal(mmrt_create(&cfg, &rt, err, sizeof err), MMRT_ERR_CONFIG);
    assert_non_null(strstr(err, "weights=\"mmap\": expected map or copy"));
}

static int opencl_present(void)
{
    struct harness h;
    if (harness_open(&h, harness_plugin_path("opencl"), NULL, 0) != MMRT_OK)
        return 0;
    harness_close(&h);
    return 1;
}

static void test_opencl_copies_at_exact_size(void **state)
{
    (void)state;
    if (!opencl_present())
        skip();
    struct mmrt_runtime *rt = open_model(fixture, "opencl", "opencl");
    struct mmrt_device_desc d;
    assert_int_equal(mmrt_device_describe(rt, 0, &d), MMRT_OK);
    struct mmrt_memory_report mr = memory(rt, 0);
    print_message("opencl: %llu weight bytes in %llu tensors, %llu copied into %llu reserved\n",
                  (unsigned long long)mr.weight_bytes, (unsigned long long)mr.weight_tensors,
                  (unsigned long long)mr.weight_copied_bytes,
                  (unsigned long long)mr.weight_reserved_bytes);
    assert_int_equal(mr.weight_copied_bytes, mr.weight_bytes);
    assert_int_equal(mr.weight_mapped_bytes, 0);
    /* Exact size: at most one alignment's padding per tensor (PoCL aligns to 128 bytes or
     * so; 4096 bounds any device), never a power-of-two rounding. */
    assert_true(mr.weight_reserved_bytes >= mr.weight_copied_bytes);
    assert_true(mr.weight_reserved_bytes - mr.weight_copied_bytes <= mr.weight_tensors * 4096);
    struct tokens t;
    run_tokens(rt, &t);
    assert_memory_equal(t.ids, cpu_tokens.ids, sizeof t.ids[0] * N_TOKENS);
    mmrt_destroy(rt);
}

/* Copies the fixture into dir, rewriting model.safetensors with `pad` spaces appended to its
 * JSON header (a valid file: the header may be padded with whitespace), which moves every
 * tensor by pad bytes in the file. */
static void copy_fixture_padded(const char *dir, int pad)
{
    static const char *const files[] = { "config.json", "tokenizer.json", "tokenizer_config.json",
                                         "processor_config.json", "chat_template.jinja",
                                         "generation_config.json" };
    char src[8192], dst[8192];
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        snprintf(src, sizeof src, "%s/%s", fixture, files[i]);
        snprintf(dst, sizeof dst, "%s/%s", dir, files[i]);
        FILE *in = fopen(src, "rb");
        if (!in)
            continue;
        FILE *out = fopen(dst, "wb");
        assert_non_null(out);
        char buf[65536];
        size_t n;
        while ((n = fread(buf, 1, sizeof buf, in)) > 0)
            assert_int_equal(fwrite(buf, 1, n, out), n);
        fclose(in);
        assert_int_equal(fclose(out), 0);
    }
    snprintf(src, sizeof src, "%s/model.safetensors", fixture);
    snprintf(dst, sizeof dst, "%s/model.safetensors", dir);
    FILE *in = fopen(src, "rb");
    assert_non_null(in);
    assert_int_equal(fseek(in, 0, SEEK_END), 0);
    long size = ftell(in);
    assert_true(size > 8);
    rewind(in);
    unsigned char *b = malloc((size_t)size);
    assert_non_null(b);
    assert_int_equal(fread(b, 1, (size_t)size, in), (size_t)size);
    fclose(in);
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--)
        n = n << 8 | b[i];
    uint64_t n2 = n + (uint64_t)pad;
    unsigned char len[8];
    for (int i = 0; i < 8; i++)
        len[i] = (unsigned char)(n2 >> (8 * i));
    FILE *out = fopen(dst, "wb");
    assert_non_null(out);
    assert_int_equal(fwrite(len, 1, 8, out), 8);
    assert_int_equal(fwrite(b + 8, 1, (size_t)n, out), (size_t)n);
    for (int i = 0; i < pad; i++)
        assert_int_equal(fputc(' ', out), ' ');
    assert_int_equal(fwrite(b + 8 + n, 1, (size_t)size - 8 - n, out), (size_t)size - 8 - n);
    assert_int_equal(fclose(out), 0);
    free(b);
}

static void remove_fixture(const char *dir)
{
    char cmd[8300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
}

static void test_unaligned_tensors_are_copied(void **state)
{
    (void)state;
    char dir[] = "/tmp/mmrt_weights_XXXXXX";
    assert_non_null(mkdtemp(dir));
    /* The header is padded to a multiple of 8 by the writer; one more byte leaves every F32
     * tensor of the fixture one byte off its element alignment. */
    copy_fixture_padded(dir, 1);
    struct mmrt_runtime *rt = open_model(dir, "cpu", "cpu");
    struct mmrt_memory_report mr = memory(rt, 0);
    assert_int_equal(mr.weight_mapped_bytes, 0);
    assert_int_equal(mr.weight_copied_bytes, mr.weight_bytes);
    assert_true(mr.weight_reserved_bytes >= mr.weight_bytes);
    struct tokens t;
    run_tokens(rt, &t);
    assert_memory_equal(t.ids, cpu_tokens.ids, sizeof t.ids[0] * N_TOKENS);
    mmrt_destroy(rt);
    /* Four bytes keep F32 aligned: mapped again. */
    remove_fixture(dir);
    assert_non_null(mkdtemp(strcpy(dir, "/tmp/mmrt_weights_XXXXXX")));
    copy_fixture_padded(dir, 4);
    rt = open_model(dir, "cpu", "cpu");
    assert_int_equal(memory(rt, 0).weight_copied_bytes, 0);
    run_tokens(rt, &t);
    assert_memory_equal(t.ids, cpu_tokens.ids, sizeof t.ids[0] * N_TOKENS);
    mmrt_destroy(rt);
    remove_fixture(dir);
}

static void test_memory_report_struct_size(void **state)
{
    (void)state;
    struct mmrt_runtime *rt = open_model(fixture, "cpu", "cpu");
    /* An older caller's shorter struct: nothing past its struct_size is written. */
    struct mmrt_memory_report mr;
    memset(&mr, 0xAB, sizeof mr);
    mr.struct_size = (uint32_t)offsetof(struct mmrt_memory_report, pool_capacity_bytes);
    assert_int_equal(mmrt_device_memory(rt, 0, &mr), MMRT_OK);
    assert_true(mr.weight_bytes > 0);
    const unsigned char *tail = (const unsigned char *)&mr.pool_capacity_bytes;
    for (size_t i = 0; i < sizeof mr - offsetof(struct mmrt_memory_report, pool_capacity_bytes);
         i++)
        assert_int_equal(tail[i], 0xAB);
    mr.struct_size = 0;
    assert_int_equal(mmrt_device_memory(rt, 0, &mr), MMRT_ERR_INVALID_ARG);
    assert_non_null(strstr(mmrt_last_error(rt), "struct_size"));
    mr.struct_size = sizeof mr;
    assert_int_equal(mmrt_device_memory(rt, 7, &mr), MMRT_ERR_INVALID_ARG);
    mmrt_destroy(rt);
}

/* ---- the paged KV cache -------------------------------------------------------------------- */

static struct mmrt_runtime *open_kv(int64_t max_kv_tokens, int64_t page_tokens, uint64_t pool_mb,
                                    char *err, size_t err_size, mmrt_status *st)
{
    struct mmrt_device_config dev = { .name = "c", .plugin = "cpu", .pool_mb = pool_mb };
    struct mmrt_config cfg = { .model_path = fixture, .devices = &dev, .n_devices = 1,
                               .max_kv_tokens = max_kv_tokens, .kv_page_tokens = page_tokens };
    struct mmrt_runtime *rt = NULL;
    *st = mmrt_create(&cfg, &rt, err, err_size);
    return rt;
}

struct logits_trace {
    float *all; /* [N_TOKENS][vocab] */
    int64_t vocab;
};

static void record_logits(void *user, int step, const float *logits, int64_t vocab)
{
    struct logits_trace *t = user;
    if (!t->all) {
        t->vocab = vocab;
        t->all = calloc((size_t)(N_TOKENS * vocab), sizeof *t->all);
    }
    if (t->all && step >= 0 && step < N_TOKENS && vocab == t->vocab)
        memcpy(t->all + step * vocab, logits, (size_t)vocab * sizeof *logits);
}

/* Internal observer (core/model.h), declared here to keep the test on the public header. */
struct mmrt_model_trace {
    void *user;
    void (*pixel_values)(void *, int, const float *, int, const int64_t *);
    void (*image_features)(void *, int, const float *, int64_t, int64_t);
    void (*prompt_ids)(void *, const int32_t *, int);
    void (*logits)(void *, int, const float *, int64_t);
};
mmrt_status mmrt_run_traced(struct mmrt_runtime *rt, const struct mmrt_request *req,
                            const struct mmrt_model_trace *trace, mmrt_token_fn on_token,
                            void *user, struct mmrt_result *result);

static void test_kv_page_size_invariant(void **state)
{
    (void)state;
    static const int64_t sizes[] = { 1, 4, 16, 64 };
    struct logits_trace ref = { 0 };
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        char err[2048];
        mmrt_status st;
        struct mmrt_runtime *rt = open_kv(0, sizes[i], 32, err, sizeof err, &st);
        if (st != MMRT_OK)
            fail_msg("kv_page_tokens %lld: %s", (long long)sizes[i], err);
        struct logits_trace t = { 0 };
        const struct mmrt_model_trace trace = { .user = &t, .logits = record_logits };
        struct mmrt_request req = { .images = TEST_FILE(image), .n_images = 1, .prompt = prompt,
                                    .max_tokens = N_TOKENS, .top_p = 1.0f };
        struct tokens tok = { .n = 0 };
        struct mmrt_result res = { 0 };
        if (mmrt_run_traced(rt, &req, &trace, test_collect, &tok, &res) != MMRT_OK)
            fail_msg("kv_page_tokens %lld: %s", (long long)sizes[i], res.error);
        assert_int_equal(tok.n, N_TOKENS);
        assert_memory_equal(tok.ids, cpu_tokens.ids, sizeof tok.ids[0] * N_TOKENS);
        assert_non_null(t.all);
        if (!ref.all) {
            ref = t;
        } else {
            /* Batch invariance (specs/engine.md): the page layout never changes a bit. */
            assert_int_equal(t.vocab, ref.vocab);
            assert_memory_equal(t.all, ref.all, sizeof *t.all * (size_t)(N_TOKENS * t.vocab));
            free(t.all);
        }
        mmrt_destroy(rt);
    }
    free(ref.all);
}

struct pages_seen {
    struct mmrt_runtime *rt;
    uint64_t used[64];
    int n;
};

static bool watch_pages(void *user, int32_t id, const char *text)
{
    struct pages_seen *p = user;
    (void)id;
    (void)text;
    struct mmrt_memory_report mr = { .struct_size = sizeof mr };
    if (p->n < 64 && mmrt_device_memory(p->rt, 0, &mr) == MMRT_OK)
        p->used[p->n++] = mr.kv_pages_used;
    return true;
}

/* A sequence takes pages as it grows, one page per 4 positions here, and returns them all. */
static void test_kv_pages_grow(void **state)
{
    (void)state;
    char err[2048];
    mmrt_status st;
    struct mmrt_runtime *rt = open_kv(0, 4, 32, err, sizeof err, &st);
    assert_int_equal(st, MMRT_OK);
    struct pages_seen seen = { .rt = rt };
    struct mmrt_request req = { .images = TEST_FILE(image), .n_images = 1,
                                .prompt = prompt, .max_tokens = N_TOKENS,
                                .top_p = 1.0f };
    struct mmrt_result res = { 0 };
    assert_int_equal(mmrt_run(rt, &req, watch_pages, &seen, &res), MMRT_OK);
    assert_int_equal(seen.n, N_TOKENS);
    /* Token i is chosen from the step that filled positions [0, prompt + i): the prefill for
     * i = 0, then one decode step each. */
    for (int i = 0; i < seen.n; i++) {
        const uint64_t filled = (uint64_t)res.n_prompt_tokens + (uint64_t)i;
        assert_int_equal(seen.used[i], (filled + 3) / 4);
    }
    struct mmrt_memory_report mr = memory(rt, 0);
    assert_int_equal(mr.kv_pages_used, 0);
    mmrt_destroy(rt);
}

static void test_kv_budget(void **state)
{
    (void)state;
    char err[2048];
    mmrt_status st;
    /* Find the request's size: prompt + max_tokens positions. */
    struct mmrt_runtime *rt = open_kv(0, 16, 32, err, sizeof err, &st);
    assert_int_equal(st, MMRT_OK);
    struct mmrt_request req = { .images = TEST_FILE(image), .n_images = 1,
                                .prompt = prompt, .max_tokens = N_TOKENS,
                                .top_p = 1.0f };
    struct mmrt_result res = { 0 };
    assert_int_equal(mmrt_run(rt, &req, NULL, NULL, &res), MMRT_OK);
    const int64_t n_prompt = res.n_prompt_tokens, need = n_prompt + N_TOKENS;
    mmrt_destroy(rt);

    /* Exactly enough, in pages of 16 (rounded up to whole pages): it runs, and runs again,
     * because its pages come back when it ends. */
    rt = open_kv(need, 16, 32, err, sizeof err, &st);
    assert_int_equal(st, MMRT_OK);
    for (int i = 0; i < 3; i++) {
        struct tokens t = { .n = 0 };
        assert_int_equal(mmrt_run(rt, &req, test_collect, &t, &res), MMRT_OK);
        assert_memory_equal(t.ids, cpu_tokens.ids, sizeof t.ids[0] * N_TOKENS);
    }
    mmrt_destroy(rt);

    /* One page short: refused with the numbers and the key, and the runtime goes on. */
    const int64_t short_of = (need + 15) / 16 * 16 - 16;
    rt = open_kv(short_of, 16, 32, err, sizeof err, &st);
    assert_int_equal(st, MMRT_OK);
    assert_int_equal(mmrt_run(rt, &req, NULL, NULL, &res), MMRT_ERR_LIMIT);
    char want[256];
    snprintf(want, sizeof want, "the request needs %lld KV positions (prompt and max_tokens), "
             "more than the %lld of [model] max_kv_tokens", (long long)need,
             (long long)short_of);
    if (!strstr(res.error, want))
        fail_msg("expected '%s' in '%s'", want, res.error);
    /* A shorter generation that fits runs on the same runtime. */
    if (short_of > n_prompt) {
        req.max_tokens = (int)(short_of - n_prompt);
        assert_int_equal(mmrt_run(rt, &req, NULL, NULL, &res), MMRT_OK);
    }
    mmrt_destroy(rt);

    /* A budget the pool cannot hold is refused at load, naming the key and the pool. */
    rt = open_kv(1 << 24, 16, 32, err, sizeof err, &st);
    assert_null(rt);
    assert_int_equal(st, MMRT_ERR_OUT_OF_POOL);
    if (!strstr(err, "max_kv_tokens 16777216") || !strstr(err, "raise pool_mb"))
        fail_msg("unexpected: %s", err);
    /* And a page size that is not a power of two, through the struct API. */
    rt = open_kv(0, 12, 32, err, sizeof err, &st);
    assert_null(rt);
    assert_int_equal(st, MMRT_ERR_CONFIG);
    assert_non_null(strstr(err, "kv_page_tokens 12 must be a power of two"));
}

int main(void)
{
    const char *src = getenv("MMRT_SOURCE_DIR");
    snprintf(fixture, sizeof fixture, "%s/tests/fixtures/llava-tiny", src ? src : ".");
    snprintf(image, sizeof image, "%s/tests/fixtures/llava-images/grad_80x60.png",
             src ? src : ".");
    mmrt_set_log_sink(quiet, NULL, MMRT_LOG_WARN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cpu_adopted_arena_is_read_only),
        cmocka_unit_test(test_cpu_runs_in_place),
        cmocka_unit_test(test_cpu_weights_copy_option),
        cmocka_unit_test(test_opencl_copies_at_exact_size),
        cmocka_unit_test(test_unaligned_tensors_are_copied),
        cmocka_unit_test(test_memory_report_struct_size),
        cmocka_unit_test(test_kv_page_size_invariant),
        cmocka_unit_test(test_kv_pages_grow),
        cmocka_unit_test(test_kv_budget),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
