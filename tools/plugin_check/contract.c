/*
 * tools/plugin_check/contract.c — see contract.h.
 *
 * Every memory check mirrors each arena on the host and compares whole arenas after each
 * step, so a transfer that strays outside its range is caught as surely as one that writes
 * the wrong bytes. Each check keeps its arenas and buffers in one struct scope and releases
 * them at one cleanup label, whatever failed.
 */
#include "contract.h"

#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops.h"

/* ---- scope: what one check allocated ----------------------------------------------------- */

#define SCOPE_MAX 8

struct scope {
    const struct mmrt_contract_target *t;
    struct mmrt_error *err;
    void *arenas[SCOPE_MAX];
    int n_arenas;
    void *bufs[SCOPE_MAX];
    int n_bufs;
};

static void scope_init(struct scope *s, const struct mmrt_contract_target *t,
                       struct mmrt_error *err)
{
    memset(s, 0, sizeof *s);
    s->t = t;
    s->err = err;
}

static void scope_release(struct scope *s)
{
    for (int i = s->n_arenas - 1; i >= 0; i--)
        s->t->plugin->arena_free(s->t->dev, s->arenas[i]);
    for (int i = 0; i < s->n_bufs; i++)
        free(s->bufs[i]);
    s->n_arenas = s->n_bufs = 0;
}

static bool strict(const struct scope *s)
{
    return (s->t->flags & MMRT_CONTRACT_STRICT) != 0;
}

static const char *last_error(const struct scope *s)
{
    const char *e = s->t->plugin->last_error(s->t->dev);
    return e ? e : "(last_error returned NULL)";
}

static mmrt_status violated(struct scope *s, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static mmrt_status(violated)(struct scope *s, const char *fmt, ...)
{
    char msg[MMRT_ERROR_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return mmrt_error_set(s->err, MMRT_ERR_PLUGIN, "%s", msg);
}
#ifdef __clang_analyzer__ /* see MMRT_RETURNS_STATUS in core/error.h */
#define violated(s, ...) MMRT_RETURNS_STATUS((violated)(s, __VA_ARGS__), MMRT_ERR_PLUGIN)
#endif

static unsigned char *buf_new(struct scope *s, size_t n)
{
    if (s->n_bufs == SCOPE_MAX)
        return NULL;
    unsigned char *p = malloc(n ? n : 1);
    if (p)
        s->bufs[s->n_bufs++] = p;
    return p;
}

/* Allocates host buffers of n bytes each into the NULL-terminated list of out-pointers. */
static mmrt_status bufs_new(struct scope *s, size_t n, unsigned char **first, ...)
{
    va_list ap;
    va_start(ap, first);
    for (unsigned char **p = first; p; p = va_arg(ap, unsigned char **)) {
        if (!(*p = buf_new(s, n))) {
            va_end(ap);
            return mmrt_error_set(s->err, MMRT_ERR_NO_MEMORY, "out of host memory (%zu bytes)",
                                  n);
        }
    }
    va_end(ap);
    return MMRT_OK;
}

static mmrt_status arena_new(struct scope *s, uint64_t nbytes, void **out)
{
    void *arena = NULL;
    if (s->n_arenas == SCOPE_MAX)
        return mmrt_error_set(s->err, MMRT_ERR_INTERNAL, "contract: too many arenas");
    mmrt_status st = s->t->plugin->arena_alloc(s->t->dev, nbytes, &arena);
    if (st != MMRT_OK)
        return violated(s, "arena_alloc(%" PRIu64 ") failed with %s: %s", nbytes,
                        mmrt_status_name(st), last_error(s));
    if (!arena)
        return violated(s, "arena_alloc(%" PRIu64 ") returned MMRT_OK and a NULL arena", nbytes);
    s->arenas[s->n_arenas++] = arena;
    *out = arena;
    return MMRT_OK;
}

static void fill_random(unsigned char *p, size_t n, uint32_t seed)
{
    uint32_t x = seed * 2654435761u + 1;
    for (size_t i = 0; i < n; i++) {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        p[i] = (unsigned char)(x >> 7);
    }
}

/* A call that must succeed. `what` describes it for the message. */
static mmrt_status expect_ok(struct scope *s, mmrt_status got, const char *what)
{
    if (got != MMRT_OK)
        return violated(s, "%s failed with %s: %s", what, mmrt_status_name(got), last_error(s));
    return MMRT_OK;
}

/* A call that must fail with `want`; with MMRT_CONTRACT_WORDING last_error must mention
 * `needle`. */
static mmrt_status expect_error(struct scope *s, mmrt_status got, mmrt_status want,
                                const char *needle, const char *what)
{
    if (got != want)
        return violated(s, "%s returned %s, want %s (last error: %s)", what,
                        mmrt_status_name(got), mmrt_status_name(want), last_error(s));
    const char *e = s->t->plugin->last_error(s->t->dev);
    if (!e)
        return violated(s, "%s: last_error returned NULL after a failure", what);
    if ((s->t->flags & MMRT_CONTRACT_WORDING) && needle && !strstr(e, needle))
        return violated(s, "%s: last error \"%s\" does not mention \"%s\"", what, e, needle);
    return MMRT_OK;
}

/* Downloads the whole arena and compares it with its host mirror. */
static mmrt_status expect_arena(struct scope *s, void *arena, const char *arena_name,
                                const unsigned char *mirror, size_t nbytes, const char *after)
{
    unsigned char *got = malloc(nbytes ? nbytes : 1);
    if (!got)
        return mmrt_error_set(s->err, MMRT_ERR_NO_MEMORY, "out of host memory (%zu bytes)",
                              nbytes);
    memset(got, 0xEE, nbytes);
    mmrt_status st = s->t->plugin->download(s->t->dev, got, arena, 0, nbytes);
    if (st != MMRT_OK) {
        st = violated(s, "after %s: download of arena %s (%zu bytes) failed with %s: %s", after,
                      arena_name, nbytes, mmrt_status_name(st), last_error(s));
    } else {
        for (size_t i = 0; i < nbytes; i++) {
            if (got[i] != mirror[i]) {
                st = violated(s, "after %s: byte %zu of arena %s (%zu bytes) is 0x%02x, want "
                              "0x%02x", after, i, arena_name, nbytes, got[i], mirror[i]);
                break;
            }
        }
    }
    free(got);
    return st;
}

#define TRY(expr)                                                                              \
    do {                                                                                       \
        st = (expr);                                                                           \
        if (st != MMRT_OK)                                                                     \
            goto out;                                                                          \
    } while (0)

static struct mmrt_device_info info_header(void)
{
    struct mmrt_device_info info;
    memset(&info, 0, sizeof info);
    info.hdr = (struct mmrt_abi_header)MMRT_ABI_HEADER_INIT(struct mmrt_device_info);
    return info;
}

/* ---- the checks ---------------------------------------------------------------------------- */

mmrt_status mmrt_contract_device_info(const struct mmrt_contract_target *t,
                                      struct mmrt_error *err)
{
    struct scope s;
    scope_init(&s, t, err);
    mmrt_status st;
    struct mmrt_device_info info = info_header();
    TRY(expect_ok(&s, t->plugin->device_info(t->dev, &info), "device_info"));
    if (!memchr(info.name, '\0', sizeof info.name) || info.name[0] == '\0')
        TRY(violated(&s, "device_info: name is empty or not NUL-terminated"));
    if (!memchr(info.kind, '\0', sizeof info.kind) ||
        (strcmp(info.kind, "cpu") != 0 && strcmp(info.kind, "gpu") != 0 &&
         strcmp(info.kind, "accelerator") != 0))
        TRY(violated(&s, "device_info: kind is not \"cpu\", \"gpu\" or \"accelerator\""));
    if (info.total_bytes == 0 || info.free_bytes > info.total_bytes)
        TRY(violated(&s, "device_info: total_bytes %" PRIu64 ", free_bytes %" PRIu64
                     ": want total > 0 and free <= total", info.total_bytes, info.free_bytes));
    if (info.max_arena_bytes == 0 || info.max_arena_bytes > info.total_bytes)
        TRY(violated(&s, "device_info: max_arena_bytes %" PRIu64 " is not within 1…total_bytes "
                     "(%" PRIu64 ")", info.max_arena_bytes, info.total_bytes));
    if (info.alignment == 0 || (info.alignment & (info.alignment - 1)) != 0)
        TRY(violated(&s, "device_info: alignment %u is not a power of two", info.alignment));

    /* An older host knows a shorter struct: nothing past its struct_size may be written. */
    const size_t cut = offsetof(struct mmrt_device_info, kind);
    struct mmrt_device_info small;
    memset(&small, 0xAB, sizeof small);
    small.hdr = info.hdr;
    small.hdr.struct_size = (uint32_t)cut;
    TRY(expect_ok(&s, t->plugin->device_info(t->dev, &small),
                  "device_info with struct_size = offsetof(kind)"));
    if (small.hdr.struct_size != cut || small.hdr.abi_major != info.hdr.abi_major)
        TRY(violated(&s, "device_info rewrote the caller's header (struct_size %u, want %zu)",
                     small.hdr.struct_size, cut));
    if (strncmp(small.name, info.name, sizeof info.name) != 0)
        TRY(violated(&s, "device_info with a shorter struct_size gave name \"%.*s\", want "
                     "\"%s\"", (int)sizeof small.name, small.name, info.name));
    for (size_t i = cut; i < sizeof small; i++)
        if (((unsigned char *)&small)[i] != 0xAB)
            TRY(violated(&s, "device_info with struct_size %zu wrote byte %zu, past the end of "
                         "the caller's struct", cut, i));

    if (strict(&s)) {
        struct mmrt_device_info broken = info;
        broken.hdr.struct_size = 2;
        TRY(expect_error(&s, t->plugin->device_info(t->dev, &broken), MMRT_ERR_INVALID_ARG,
                         "struct_size", "device_info with struct_size 2"));
    }
out:
    scope_release(&s);
    return st;
}

mmrt_status mmrt_contract_round_trip(const struct mmrt_contract_target *t,
                                     struct mmrt_error *err)
{
    enum { N = 16384 };
    static const struct {
        uint64_t offset, nbytes;
    } cases[] = {
        {0, 1}, {1, 1}, {3, 3}, {7, 4}, {1, 4097}, {4095, 4097}, {8191, 5}, {N - 1, 1},
        {0, N}, {N, 0}, {13, 0},
    };
    struct scope s;
    scope_init(&s, t, err);
    mmrt_status st;
    unsigned char *mirror, *data, *back;
    void *arena;
    TRY(bufs_new(&s, N, &mirror, &data, &back, NULL));
    TRY(arena_new(&s, N, &arena));
    fill_random(mirror, N, 1);
    TRY(expect_ok(&s, t->plugin->upload(t->dev, arena, 0, mirror, N), "upload of the arena"));
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        uint64_t off = cases[k].offset, n = cases[k].nbytes;
        char what[96];
        snprintf(what, sizeof what, "upload(+%" PRIu64 ", %" PRIu64 " bytes)", off, n);
        fill_random(data, (size_t)n, (uint32_t)k + 100);
        TRY(expect_ok(&s, t->plugin->upload(t->dev, arena, off, data, n), what));
        memcpy(mirror + off, data, (size_t)n);
        TRY(expect_arena(&s, arena, "a", mirror, N, what));
        /* And back out through the same odd window, writing nothing past it. */
        snprintf(what, sizeof what, "download(+%" PRIu64 ", %" PRIu64 " bytes)", off, n);
        memset(back, 0xEE, N);
        TRY(expect_ok(&s, t->plugin->download(t->dev, back, arena, off, n), what));
        if (memcmp(back, data, (size_t)n) != 0)
            TRY(violated(&s, "%s returned other bytes than were uploaded there", what));
        if (n < N && back[n] != 0xEE)
            TRY(violated(&s, "%s wrote past the end of the host buffer", what));
    }
out:
    scope_release(&s);
    return st;
}

mmrt_status mmrt_contract_copy(const struct mmrt_contract_target *t, struct mmrt_error *err)
{
    enum { N = 10000 };
    static const struct {
        int dst_b, src_b; /* 1 = arena b */
        uint64_t dst, src, n;
    } cases[] = {
        {1, 0, 1001, 3, 4097}, /* a → b, odd offsets and size */
        {0, 1, N - 1, 0, 1},   /* single byte at the very end */
        {0, 0, 5000, 0, 100},  /* inside one arena, disjoint */
        {0, 0, 200, 100, 100}, /* adjacent ranges touch but do not overlap */
        {1, 0, 0, 0, N},       /* whole arena */
        {1, 1, 17, 17, 64},    /* onto itself: a no-op */
        {1, 0, 3, 3, 0},       /* zero bytes */
    };
    struct scope s;
    scope_init(&s, t, err);
    mmrt_status st;
    unsigned char *ma, *mb;
    void *a, *b;
    TRY(bufs_new(&s, N, &ma, &mb, NULL));
    TRY(arena_new(&s, N, &a));
    TRY(arena_new(&s, N, &b));
    fill_random(ma, N, 2);
    fill_random(mb, N, 3);
    TRY(expect_ok(&s, t->plugin->upload(t->dev, a, 0, ma, N), "upload of arena a"));
    TRY(expect_ok(&s, t->plugin->upload(t->dev, b, 0, mb, N), "upload of arena b"));
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        unsigned char *md = cases[k].dst_b ? mb : ma, *ms = cases[k].src_b ? mb : ma;
        void *d = cases[k].dst_b ? b : a, *src = cases[k].src_b ? b : a;
        char what[96];
        snprintf(what, sizeof what, "copy(%c+%" PRIu64 " <- %c+%" PRIu64 ", %" PRIu64 ")",
                 cases[k].dst_b ? 'b' : 'a', cases[k].dst, cases[k].src_b ? 'b' : 'a',
                 cases[k].src, cases[k].n);
        TRY(expect_ok(&s, t->plugin->copy(t->dev, d, cases[k].dst, src, cases[k].src, cases[k].n),
                      what));
        memmove(md + cases[k].dst, ms + cases[k].src, (size_t)cases[k].n);
        TRY(expect_arena(&s, a, "a", ma, N, what));
        TRY(expect_arena(&s, b, "b", mb, N, what));
    }
out:
    scope_release(&s);
    return st;
}

mmrt_status mmrt_contract_overlapping_copy(const struct mmrt_contract_target *t,
                                           struct mmrt_error *err)
{
    enum { N = 65536 };
    /* Short and long move distances, both directions: plugins may take different paths
     * (scratch buffer, pieces, a kernel) depending on the distance. */
    static const struct {
        uint64_t dst, src, n;
    } cases[] = {
        {1, 0, 60000},     {0, 1, 60000},     {100, 0, 40000}, {0, 100, 40000},
        {20000, 0, 40000}, {0, 20000, 40000}, {5, 3, 7},       {3, 5, 7},
        {4097, 1, 50001},  {1, 4097, 50001},  {0, 9, 10},
    };
    struct scope s;
    scope_init(&s, t, err);
    mmrt_status st;
    unsigned char *mirror;
    void *arena;
    TRY(bufs_new(&s, N, &mirror, NULL));
    TRY(arena_new(&s, N, &arena));
    fill_random(mirror, N, 4);
    TRY(expect_ok(&s, t->plugin->upload(t->dev, arena, 0, mirror, N), "upload of the arena"));
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        char what[128];
        snprintf(what, sizeof what, "overlapping copy(+%" PRIu64 " <- +%" PRIu64 ", %" PRIu64
                 ") (move %zu of a sequence)", cases[k].dst, cases[k].src, cases[k].n, k);
        TRY(expect_ok(&s, t->plugin->copy(t->dev, arena, cases[k].dst, arena, cases[k].src,
                                          cases[k].n), what));
        memmove(mirror + cases[k].dst, mirror + cases[k].src, (size_t)cases[k].n);
        /* Check every other step only, so moves also queue up behind each other. */
        if (k % 2)
            TRY(expect_arena(&s, arena, "a", mirror, N, what));
    }
    TRY(expect_arena(&s, arena, "a", mirror, N, "the last overlapping copy"));
out:
    scope_release(&s);
    return st;
}

mmrt_status mmrt_contract_in_order(const struct mmrt_contract_target *t, struct mmrt_error *err)
{
    /* Larger than any sane staging buffer, and not a multiple of one. */
    const size_t n = ((size_t)9 << 20) + 3;
    const struct mmrt_plugin *p = t->plugin;
    struct scope s;
    scope_init(&s, t, err);
    mmrt_status st;
    unsigned char *x1, *x2, *src, *got;
    void *a, *b, *c;
    TRY(bufs_new(&s, n, &x1, &x2, &src, &got, NULL));
    fill_random(x1, n, 5);
    fill_random(x2, n, 6);
    TRY(arena_new(&s, n, &a));
    TRY(arena_new(&s, n, &b));
    TRY(arena_new(&s, n, &c));

    /* upload, copy, upload over the copy's source, copy, download — no synchronize: each
     * step must see exactly the steps issued before it. The source buffer is overwritten
     * as soon as each upload returns, which upload() must allow. */
    memcpy(src, x1, n);
    TRY(expect_ok(&s, p->upload(t->dev, a, 0, src, n), "upload a"));
    memset(src, 0x11, n);
    TRY(expect_ok(&s, p->copy(t->dev, b, 0, a, 0, n), "copy b <- a"));
    memcpy(src, x2, n);
    TRY(expect_ok(&s, p->upload(t->dev, a, 0, src, n), "second upload a"));
    memset(src, 0x22, n);
    TRY(expect_ok(&s, p->copy(t->dev, c, 0, b, 0, n), "copy c <- b"));
    TRY(expect_ok(&s, p->copy(t->dev, b, 1, a, 0, n - 1), "copy b+1 <- a"));
    TRY(expect_ok(&s, p->download(t->dev, got, c, 0, n), "download c"));
    if (memcmp(got, x1, n) != 0)
        TRY(violated(&s, "upload a, copy b <- a, upload a again, copy c <- b: c does not hold "
                     "the first upload (a copy did not wait for the work before it, or upload "
                     "read its source after returning)"));
    TRY(expect_ok(&s, p->download(t->dev, got, a, 0, n), "download a"));
    if (memcmp(got, x2, n) != 0)
        TRY(violated(&s, "a does not hold its second upload"));
    TRY(expect_ok(&s, p->download(t->dev, got, b, 0, n), "download b"));
    if (got[0] != x1[0] || memcmp(got + 1, x2, n - 1) != 0)
        TRY(violated(&s, "copy b+1 <- a issued after the second upload of a did not see it"));
    TRY(expect_ok(&s, p->synchronize(t->dev), "synchronize"));
out:
    scope_release(&s);
    return st;
}

/* ---- ops_in_order -------------------------------------------------------------------------- */

/* One launch of `op` as f(x): COPY x, SCALE 2x, ADD x + x, MUL x · x. */
static mmrt_status launch_f(struct scope *s, enum mmrt_op op, const struct mmrt_tensor *x,
                            const struct mmrt_tensor *y, const char *what)
{
    static const struct mmrt_scale_params two = {2.0f};
    struct mmrt_op_args args = {
        .hdr = MMRT_ABI_HEADER_INIT(struct mmrt_op_args),
        .op = op,
        .n_src = op == MMRT_OP_ADD || op == MMRT_OP_MUL ? 2 : 1,
        .src = {x, x},
        .dst = y,
        .params = op == MMRT_OP_SCALE ? &two : NULL,
        .params_size = op == MMRT_OP_SCALE ? (uint32_t)sizeof two : 0,
    };
    struct mmrt_error verr;
    if (mmrt_op_validate(op, args.src, args.n_src, y, args.params, args.params_size, &verr) !=
        MMRT_OK)
        return mmrt_error_set(s->err, MMRT_ERR_INTERNAL, "contract: %s", verr.msg);
    mmrt_status st = s->t->plugin->ops[op](s->t->dev, &args);
    if (st != MMRT_OK)
        return violated(s, "%s: %s failed with %s: %s", what, mmrt_op_name(op),
                        mmrt_status_name(st), last_error(s));
    return MMRT_OK;
}

static float apply_f(enum mmrt_op op, float x)
{
    switch (op) {
    case MMRT_OP_SCALE: return 2.0f * x;
    case MMRT_OP_ADD: return x + x;
    case MMRT_OP_MUL: return x * x;
    default: return x;
    }
}

static struct mmrt_tensor f32_tensor(void *arena, int64_t n)
{
    struct mmrt_tensor t;
    memset(&t, 0, sizeof t);
    t.hdr = (struct mmrt_abi_header)MMRT_ABI_HEADER_INIT(struct mmrt_tensor);
    t.buffer = arena;
    t.dtype = MMRT_DTYPE_F32;
    t.n_dims = 1;
    for (int i = 0; i < MMRT_MAX_DIMS; i++) {
        t.ne[i] = i == 0 ? n : 1;
        t.nb[i] = 4;
    }
    return t;
}

mmrt_status mmrt_contract_ops_in_order(const struct mmrt_contract_target *t,
                                       struct mmrt_error *err)
{
    static const enum mmrt_op candidates[] = {MMRT_OP_COPY, MMRT_OP_SCALE, MMRT_OP_ADD,
                                              MMRT_OP_MUL};
    enum mmrt_op op = MMRT_OP_COUNT;
    for (size_t i = 0; i < sizeof candidates / sizeof candidates[0] && op == MMRT_OP_COUNT; i++)
        if (t->plugin->ops && (uint32_t)candidates[i] < t->plugin->n_ops &&
            t->plugin->ops[candidates[i]])
            op = candidates[i];
    if (op == MMRT_OP_COUNT)
        return mmrt_error_set(err, MMRT_ERR_UNSUPPORTED,
                              "needs one of COPY, SCALE, ADD, MUL; the plugin claims none");

    /* 9 MiB + 3 floats of small integers: every f above is exact on them, so the results
     * compare bit for bit, and the size is past any staging buffer. */
    const int64_t n = ((int64_t)9 << 18) + 3;
    const size_t nbytes = (size_t)n * 4;
    struct scope s;
    scope_init(&s, t, err);
    mmrt_status st;
    unsigned char *hx1, *hx2, *src, *got;
    void *ax, *ay, *aw, *az;
    TRY(bufs_new(&s, nbytes, &hx1, &hx2, &src, &got, NULL));
    float *x1 = (float *)(void *)hx1, *x2 = (float *)(void *)hx2;
    for (int64_t i = 0; i < n; i++) {
        x1[i] = (float)((i * 7 + 3) % 61) - 30.0f;
        x2[i] = (float)((i * 13 + 5) % 53) - 26.0f;
    }
    TRY(arena_new(&s, nbytes, &ax));
    TRY(arena_new(&s, nbytes, &ay));
    TRY(arena_new(&s, nbytes, &aw));
    TRY(arena_new(&s, nbytes, &az));
    struct mmrt_tensor x = f32_tensor(ax, n), y = f32_tensor(ay, n), w = f32_tensor(aw, n),
                       z = f32_tensor(az, n);

    /* upload x; y = f(x); upload x again (the launch before must still see the first x);
     * w = f(y) (sees y); z = f(x) (sees the second x); download w and z — no synchronize. */
    memcpy(src, x1, nbytes);
    TRY(expect_ok(&s, t->plugin->upload(t->dev, ax, 0, src, nbytes), "upload x"));
    memset(src, 0x7f, nbytes);
    TRY(launch_f(&s, op, &x, &y, "y = f(x)"));
    memcpy(src, x2, nbytes);
    TRY(expect_ok(&s, t->plugin->upload(t->dev, ax, 0, src, nbytes), "second upload x"));
    memset(src, 0x7f, nbytes);
    TRY(launch_f(&s, op, &y, &w, "w = f(y)"));
    TRY(launch_f(&s, op, &x, &z, "z = f(x)"));
    TRY(expect_ok(&s, t->plugin->download(t->dev, got, aw, 0, nbytes), "download w"));
    const float *g = (const float *)(const void *)got;
    for (int64_t i = 0; i < n; i++) {
        float want = apply_f(op, apply_f(op, x1[i]));
        if (g[i] != want)
            TRY(violated(&s, "%s: upload x; y = f(x); upload x; w = f(y): w[%" PRId64 "] is %g, "
                         "want f(f(first x)) = %g", mmrt_op_name(op), i, (double)g[i],
                         (double)want));
    }
    TRY(expect_ok(&s, t->plugin->download(t->dev, got, az, 0, nbytes), "download z"));
    for (int64_t i = 0; i < n; i++) {
        float want = apply_f(op, x2[i]);
        if (g[i] != want)
            TRY(violated(&s, "%s: z = f(x) after the second upload of x: z[%" PRId64 "] is %g, "
                         "want %g", mmrt_op_name(op), i, (double)g[i], (double)want));
    }
    TRY(expect_ok(&s, t->plugin->synchronize(t->dev), "synchronize"));
out:
    scope_release(&s);
    return st;
}

mmrt_status mmrt_contract_bounds(const struct mmrt_contract_target *t, struct mmrt_error *err)
{
    const struct mmrt_plugin *p = t->plugin;
    struct mmrt_device *d = t->dev;
    struct scope s;
    scope_init(&s, t, err);
    mmrt_status st;
    unsigned char buf[256] = {0};
    void *a, *b;
    TRY(arena_new(&s, 100, &a));
    TRY(arena_new(&s, 100, &b));

    /* plugin.h: ranges are bounds-checked against the arena, MMRT_ERR_INVALID_ARG otherwise
     * (including ranges whose end overflows 64 bits). */
    const mmrt_status E = MMRT_ERR_INVALID_ARG;
    TRY(expect_error(&s, p->upload(d, a, 100, buf, 1), E, "100 bytes", "upload(+100, 1) of 100"));
    TRY(expect_error(&s, p->upload(d, a, 99, buf, 2), E, "offset 99", "upload(+99, 2) of 100"));
    TRY(expect_error(&s, p->upload(d, a, UINT64_MAX, buf, 2), E, NULL, "upload(+2^64-1, 2)"));
    TRY(expect_error(&s, p->upload(d, a, 1, buf, UINT64_MAX), E, NULL, "upload(+1, 2^64-1)"));
    TRY(expect_error(&s, p->download(d, buf, a, 0, 101), E, "101 bytes",
                     "download(+0, 101) of 100"));
    TRY(expect_error(&s, p->download(d, buf, b, 101, 0), E, NULL, "download(+101, 0) of 100"));
    TRY(expect_error(&s, p->copy(d, b, 50, a, 0, 51), E, "destination",
                     "copy(b+50 <- a+0, 51) of 100"));
    TRY(expect_error(&s, p->copy(d, b, 0, a, 50, 51), E, "source", "copy(b+0 <- a+50, 51)"));
    TRY(expect_error(&s, p->copy(d, b, 0, a, UINT64_MAX - 1, 4), E, NULL,
                     "copy(b+0 <- a+2^64-2, 4)"));
    if (strict(&s)) {
        int not_an_arena;
        TRY(expect_error(&s, p->upload(d, a, 0, NULL, 4), E, "NULL", "upload from NULL"));
        TRY(expect_error(&s, p->download(d, NULL, a, 0, 4), E, "NULL", "download to NULL"));
        TRY(expect_error(&s, p->upload(d, &not_an_arena, 0, buf, 1), E, "not an arena",
                         "upload to a handle that is not an arena"));
        TRY(expect_error(&s, p->upload(d, NULL, 0, buf, 1), E, "not an arena",
                         "upload to a NULL arena"));
        TRY(expect_error(&s, p->copy(d, a, 0, &not_an_arena, 0, 1), E, "not an arena",
                         "copy from a handle that is not an arena"));
    }
    if (t->flags & MMRT_CONTRACT_WORDING) {
        void *none = NULL;
        st = p->arena_alloc(d, 0, &none);
        if (st == MMRT_OK)
            p->arena_free(d, none);
        TRY(expect_error(&s, st, E, "zero", "arena_alloc(0)"));
        if (none)
            TRY(violated(&s, "arena_alloc(0) failed but wrote an arena handle"));
    }

    /* Empty ranges at the very end are in bounds. */
    TRY(expect_ok(&s, p->upload(d, a, 100, buf, 0), "upload(+100, 0) of 100"));
    TRY(expect_ok(&s, p->download(d, buf, a, 100, 0), "download(+100, 0) of 100"));

    /* The device is unharmed by all of that. */
    unsigned char mirror[100];
    fill_random(mirror, sizeof mirror, 7);
    TRY(expect_ok(&s, p->upload(d, a, 0, mirror, sizeof mirror), "upload after refusals"));
    TRY(expect_ok(&s, p->copy(d, b, 0, a, 0, sizeof mirror), "copy after refusals"));
    TRY(expect_arena(&s, b, "b", mirror, sizeof mirror, "the refused transfers"));
out:
    scope_release(&s);
    return st;
}

/* ---- refusals ----------------------------------------------------------------------------- */

/* One launch that breaks plugin.h's operator contract. */
struct bad_launch {
    const char *what;
    enum mmrt_op op;
    int n_src;
    const struct mmrt_tensor *src[3];
    const struct mmrt_tensor *dst;
    const void *params;
    uint32_t params_size;
};

mmrt_status mmrt_contract_refusals(const struct mmrt_contract_target *t, struct mmrt_error *err)
{
    if (!(t->flags & MMRT_CONTRACT_STRICT))
        return mmrt_error_set(err, MMRT_ERR_UNSUPPORTED,
                              "plugin.h leaves checking a launch to the core; only the in-tree "
                              "convention (--strict) refuses one in the plugin too");
    const struct mmrt_plugin *p = t->plugin;
    struct scope s;
    scope_init(&s, t, err);
    mmrt_status st;
    void *a, *b;
    TRY(arena_new(&s, 256, &a));
    TRY(arena_new(&s, 256, &b));
    static const float ones[8] = {1, 1, 1, 1, 1, 1, 1, 1};
    TRY(expect_ok(&s, p->upload(t->dev, a, 0, ones, sizeof ones), "upload"));
    static const struct mmrt_scale_params half = {0.5f}, inf = {INFINITY};
    struct mmrt_tensor x8 = f32_tensor(a, 8), y8 = f32_tensor(b, 8), y4 = f32_tensor(b, 4),
                       x3 = f32_tensor(a, 3), shifted = f32_tensor(a, 8), i8 = f32_tensor(b, 8);
    shifted.offset = 4; /* one float past x8 in the same arena: overlaps it partially */
    i8.dtype = MMRT_DTYPE_I32;
    const struct bad_launch bad[] = {
        {"SCALE into a dst of another shape", MMRT_OP_SCALE, 1, {&x8}, &y4, &half, sizeof half},
        {"SCALE by a non-finite factor", MMRT_OP_SCALE, 1, {&x8}, &y8, &inf, sizeof inf},
        {"SCALE without params", MMRT_OP_SCALE, 1, {&x8}, &y8, NULL, 0},
        {"SCALE of an I32 source", MMRT_OP_SCALE, 1, {&i8}, &x8, &half, sizeof half},
        {"SCALE into a dst that partly overlaps its source", MMRT_OP_SCALE, 1, {&x8}, &shifted,
         &half, sizeof half},
        {"ADD of a 3-element src1 to 8", MMRT_OP_ADD, 2, {&x8, &x3}, &y8, NULL, 0},
        {"COPY from F32 to I32", MMRT_OP_COPY, 1, {&x8}, &i8, NULL, 0},
        {"ARGMAX into an F32 dst", MMRT_OP_ARGMAX, 1, {&x8}, &y8, NULL, 0},
    };
    int tried = 0;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        const struct bad_launch *l = &bad[i];
        if (!p->ops || (uint32_t)l->op >= p->n_ops || !p->ops[l->op])
            continue;
        struct mmrt_error verr;
        if (mmrt_op_validate(l->op, l->src, l->n_src, l->dst, l->params, l->params_size,
                             &verr) == MMRT_OK)
            TRY(mmrt_error_set(err, MMRT_ERR_INTERNAL, "refusals: %s passes the core's check",
                               l->what));
        struct mmrt_op_args args = {
            .hdr = MMRT_ABI_HEADER_INIT(struct mmrt_op_args),
            .op = l->op,
            .n_src = l->n_src,
            .src = {l->src[0], l->src[1], l->src[2]},
            .dst = l->dst,
            .params = l->params,
            .params_size = l->params_size,
        };
        tried++;
        mmrt_status got = p->ops[l->op](t->dev, &args);
        if (got != MMRT_ERR_INVALID_ARG)
            TRY(violated(&s, "%s returned %s, want MMRT_ERR_INVALID_ARG (last error: %s)",
                         l->what, mmrt_status_name(got), got == MMRT_OK ? "-" : last_error(&s)));
        /* one contract, one wording: the plugin says what the core would have said */
        if (strcmp(last_error(&s), verr.msg) != 0)
            TRY(violated(&s, "%s: the plugin says \"%s\", the core \"%s\"", l->what,
                         last_error(&s), verr.msg));
    }
    if (!tried)
        TRY(mmrt_error_set(err, MMRT_ERR_UNSUPPORTED,
                           "needs one of SCALE, ADD, COPY, ARGMAX; the plugin claims none"));
    /* the device is unharmed: x was never written */
    TRY(expect_arena(&s, a, "x", (const unsigned char *)ones, sizeof ones, "the refusals"));
out:
    scope_release(&s);
    return st;
}

mmrt_status mmrt_contract_alloc_too_large(const struct mmrt_contract_target *t,
                                          struct mmrt_error *err)
{
    const struct mmrt_plugin *p = t->plugin;
    struct scope s;
    scope_init(&s, t, err);
    mmrt_status st;
    /* Fresh: on a GPU the limit is the memory free right now. */
    struct mmrt_device_info info = info_header();
    TRY(expect_ok(&s, p->device_info(t->dev, &info), "device_info"));
    const uint64_t sizes[] = {info.max_arena_bytes + 1, UINT64_MAX / 2};
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        void *arena = NULL;
        char want[32], what[64];
        snprintf(want, sizeof want, "%" PRIu64, sizes[k]);
        snprintf(what, sizeof what, "arena_alloc(%" PRIu64 ")", sizes[k]);
        st = p->arena_alloc(t->dev, sizes[k], &arena);
        if (st == MMRT_OK) {
            p->arena_free(t->dev, arena);
            TRY(violated(&s, "%s succeeded, past max_arena_bytes %" PRIu64, what,
                         info.max_arena_bytes));
        }
        TRY(expect_error(&s, st, MMRT_ERR_OUT_OF_POOL, want, what));
        if (arena && strict(&s))
            TRY(violated(&s, "%s failed but wrote an arena handle", what));
    }
    /* Running out is ordinary: the device keeps working. */
    unsigned char mirror[4096];
    void *arena;
    fill_random(mirror, sizeof mirror, 8);
    TRY(arena_new(&s, sizeof mirror, &arena));
    TRY(expect_ok(&s, p->upload(t->dev, arena, 0, mirror, sizeof mirror),
                  "upload after a refused arena"));
    TRY(expect_arena(&s, arena, "a", mirror, sizeof mirror, "a refused arena_alloc"));
    TRY(expect_ok(&s, p->synchronize(t->dev), "synchronize after a refused arena"));
out:
    scope_release(&s);
    return st;
}

mmrt_status mmrt_contract_null_handles(const struct mmrt_contract_target *t,
                                       struct mmrt_error *err)
{
    struct scope s;
    scope_init(&s, t, err);
    mmrt_status st = MMRT_OK;
    t->plugin->arena_free(t->dev, NULL);
    t->plugin->device_close(NULL);
    if (!t->plugin->last_error(t->dev))
        TRY(violated(&s, "last_error(dev) returned NULL"));
    if (strict(&s) && !t->plugin->last_error(NULL))
        TRY(violated(&s, "last_error(NULL) returned NULL"));
    /* Arenas still allocated at device_close are the plugin's to release: this one is left
     * for it (not put in the scope). */
    void *leftover = NULL;
    st = t->plugin->arena_alloc(t->dev, 1000, &leftover);
    TRY(expect_ok(&s, st, "arena_alloc(1000)"));
    TRY(expect_ok(&s, t->plugin->synchronize(t->dev), "synchronize"));
out:
    scope_release(&s);
    return st;
}

/* ---- graph_replay -------------------------------------------------------------------------- */

/* A launch with explicit operands, validated like the operator front would. */
static mmrt_status launch(struct scope *s, enum mmrt_op op, const struct mmrt_tensor *a,
                          const struct mmrt_tensor *b, const struct mmrt_tensor *y,
                          const void *params, uint32_t params_size, const char *what)
{
    struct mmrt_op_args args = {
        .hdr = MMRT_ABI_HEADER_INIT(struct mmrt_op_args),
        .op = op, .n_src = b ? 2 : 1, .src = {a, b}, .dst = y,
        .params = params, .params_size = params_size,
    };
    struct mmrt_error verr;
    if (mmrt_op_validate(op, args.src, args.n_src, y, params, params_size, &verr) != MMRT_OK)
        return mmrt_error_set(s->err, MMRT_ERR_INTERNAL, "contract: %s", verr.msg);
    mmrt_status st = s->t->plugin->ops[op](s->t->dev, &args);
    if (st != MMRT_OK)
        return violated(s, "%s: %s failed with %s: %s", what, mmrt_op_name(op),
                        mmrt_status_name(st), last_error(s));
    return MMRT_OK;
}

mmrt_status mmrt_contract_graph_replay(const struct mmrt_contract_target *t,
                                       struct mmrt_error *err)
{
    const struct mmrt_plugin *P = t->plugin;
    if (!P->capture_begin)
        return mmrt_error_set(err, MMRT_ERR_UNSUPPORTED, "the plugin does not capture graphs");
    if (!P->ops || P->n_ops <= MMRT_OP_SET_ROWS || !P->ops[MMRT_OP_SCALE] ||
        !P->ops[MMRT_OP_SET_ROWS])
        return mmrt_error_set(err, MMRT_ERR_UNSUPPORTED, "needs SCALE and SET_ROWS");
    enum { N = 4100, ROWS = 3 }; /* a row wider than any work-group */
    struct scope s;
    scope_init(&s, t, err);
    mmrt_status st;
    void *graph = NULL, *ax, *ay, *ac, *ai;
    unsigned char *hb;
    float a[N], b[N];
    for (int i = 0; i < N; i++) {
        a[i] = (float)(i % 97) - 48.0f;
        b[i] = 1000.0f + (float)i;
    }
    TRY(bufs_new(&s, (size_t)ROWS * N * 4, &hb, NULL));
    TRY(arena_new(&s, N * 4, &ax));
    TRY(arena_new(&s, N * 4, &ay));
    TRY(arena_new(&s, (uint64_t)ROWS * N * 4, &ac));
    TRY(arena_new(&s, 4, &ai));
    struct mmrt_tensor x = f32_tensor(ax, N), y = f32_tensor(ay, N), idx = f32_tensor(ai, 1);
    x.n_dims = y.n_dims = 2; /* [1, N] */
    x.ne[0] = y.ne[0] = 1;
    x.ne[1] = y.ne[1] = N;
    x.nb[0] = y.nb[0] = N * 4;
    idx.dtype = MMRT_DTYPE_I32;
    struct mmrt_tensor cache = x;
    cache.buffer = ac;
    cache.ne[0] = ROWS;
    float *host = (float *)(void *)hb;
    memset(host, 0, (size_t)ROWS * N * 4);
    TRY(expect_ok(&s, P->upload(t->dev, ac, 0, host, (uint64_t)ROWS * N * 4), "upload cache"));
    TRY(expect_ok(&s, P->upload(t->dev, ax, 0, b, N * 4), "upload x = b"));

    /* record: upload x = a; y = 2x; cache[idx] = y */
    static const struct mmrt_scale_params two = {2.0f};
    st = P->capture_begin(t->dev);
    if (st == MMRT_ERR_UNSUPPORTED) {
        st = mmrt_error_set(err, MMRT_ERR_UNSUPPORTED, "capture_begin: %s", last_error(&s));
        goto out;
    }
    TRY(expect_ok(&s, st, "capture_begin"));
    TRY(expect_ok(&s, P->upload(t->dev, ax, 0, a, N * 4), "upload x = a while capturing"));
    TRY(launch(&s, MMRT_OP_SCALE, &x, NULL, &y, &two, sizeof two, "y = 2x while capturing"));
    TRY(launch(&s, MMRT_OP_SET_ROWS, &y, &idx, &cache, NULL, 0,
               "cache[idx] = y while capturing"));
    TRY(expect_ok(&s, P->capture_end(t->dev, &graph), "capture_end"));
    if (!graph)
        TRY(violated(&s, "capture_end returned MMRT_OK and a NULL graph"));

    /* replay twice with the index uploaded before each launch; x was put back to b, and the
     * replay's recorded upload must rewrite a */
    TRY(expect_ok(&s, P->upload(t->dev, ax, 0, b, N * 4), "upload x = b after capture"));
    const int32_t slots[2] = {2, 0};
    for (int k = 0; k < 2; k++) {
        TRY(expect_ok(&s, P->upload(t->dev, ai, 0, &slots[k], 4), "upload idx"));
        TRY(expect_ok(&s, P->graph_launch(t->dev, graph), "graph_launch"));
    }
    TRY(expect_ok(&s, P->download(t->dev, host, ac, 0, (uint64_t)ROWS * N * 4),
                  "download cache"));
    for (int r = 0; r < ROWS; r++)
        for (int i = 0; i < N; i++) {
            float want = r == 1 ? 0.0f : 2.0f * a[i];
            if (host[r * N + i] != want)
                TRY(violated(&s, "capture {upload x = a; y = 2x; cache[idx] = y}, replayed with "
                             "idx = 2 then 0: cache[%d][%d] is %g, want %g (a replay must "
                             "read idx as uploaded before it, and rewrite the recorded upload)",
                             r, i, (double)host[r * N + i], (double)want));
        }

    /* a download while capturing has no result to give: the capture fails, nothing kept */
    void *none = NULL;
    TRY(expect_ok(&s, P->capture_begin(t->dev), "second capture_begin"));
    mmrt_status dl = P->download(t->dev, host, ay, 0, N * 4);
    mmrt_status end = P->capture_end(t->dev, &none);
    if (dl == MMRT_OK && end == MMRT_OK)
        TRY(violated(&s, "a download inside capture_begin … capture_end succeeded, and so did "
                     "capture_end: a captured download cannot return data"));
    if (end != MMRT_OK && none)
        TRY(violated(&s, "capture_end failed with %s but handed out a graph",
                     mmrt_status_name(end)));
    if (none)
        P->graph_destroy(t->dev, none);
out:
    if (graph)
        P->graph_destroy(t->dev, graph);
    scope_release(&s);
    return st;
}

const struct mmrt_contract_check mmrt_contract_checks[] = {
    {"device_info", "device_info is sane and honours a shorter struct_size",
     mmrt_contract_device_info},
    {"round_trip", "upload/download at odd offsets and sizes", mmrt_contract_round_trip},
    {"copy", "device-to-device copies between and inside arenas", mmrt_contract_copy},
    {"overlapping_copy", "overlapping copies have memmove semantics",
     mmrt_contract_overlapping_copy},
    {"in_order", "upload/copy/download in issue order without synchronize",
     mmrt_contract_in_order},
    {"ops_in_order", "upload/op/op/download in issue order without synchronize",
     mmrt_contract_ops_in_order},
    {"bounds", "out-of-range transfers refused, device unharmed", mmrt_contract_bounds},
    {"refusals", "(--strict) launches breaking the op contract refused in the core's words",
     mmrt_contract_refusals},
    {"alloc_too_large", "absurd arena is MMRT_ERR_OUT_OF_POOL, device usable after",
     mmrt_contract_alloc_too_large},
    {"null_handles", "NULL no-ops; arenas left at device_close are freed",
     mmrt_contract_null_handles},
    {"graph_replay", "a captured graph replays uploads and reads device values fresh",
     mmrt_contract_graph_replay},
};
const int mmrt_contract_n_checks =
    (int)(sizeof mmrt_contract_checks / sizeof mmrt_contract_checks[0]);

/* ---- entry_versions ------------------------------------------------------------------------ */

static char entry_log[512];
static int entry_log_lines;

static void entry_log_sink(void *user, enum mmrt_log_level level, const char *plugin,
                           const char *message)
{
    (void)user;
    (void)level;
    snprintf(entry_log, sizeof entry_log, "[%s] %s", plugin ? plugin : "?",
             message ? message : "");
    entry_log_lines++;
}

/* The members plugin.h marks required, up to last_error. */
static const char *missing_required(const struct mmrt_plugin *p)
{
    if (!p->name) return "name";
    if (!p->probe) return "probe";
    if (!p->device_open) return "device_open";
    if (!p->device_close) return "device_close";
    if (!p->device_info) return "device_info";
    if (!p->arena_alloc) return "arena_alloc";
    if (!p->arena_free) return "arena_free";
    if (!p->upload) return "upload";
    if (!p->download) return "download";
    if (!p->copy) return "copy";
    if (!p->synchronize) return "synchronize";
    if (!p->last_error) return "last_error";
    return NULL;
}

mmrt_status mmrt_contract_entry_versions(mmrt_plugin_entry_fn entry, const char *name,
                                         const struct mmrt_host *restore, unsigned flags,
                                         struct mmrt_error *err)
{
    mmrt_status st = MMRT_OK;
    struct mmrt_host host = {
        .hdr = MMRT_ABI_HEADER_INIT(struct mmrt_host),
        .user = NULL,
        .log = entry_log_sink,
    };
    entry_log_lines = 0;
    entry_log[0] = '\0';
    if (flags & MMRT_CONTRACT_STRICT) {
        host.hdr.abi_major = MMRT_ABI_MAJOR + 1;
        const struct mmrt_plugin *p = entry(&host);
        if (p) {
            st = mmrt_error_set(err, MMRT_ERR_PLUGIN, "entry point accepted a host table of "
                                "ABI major %d (this is %d)", MMRT_ABI_MAJOR + 1, MMRT_ABI_MAJOR);
            goto out;
        }
        if (entry_log_lines != 1 || !strstr(entry_log, "ABI")) {
            st = mmrt_error_set(err, MMRT_ERR_PLUGIN, "entry point refused a host of another "
                                "ABI major with %d log lines (want one mentioning \"ABI\"; last: "
                                "%s)", entry_log_lines, entry_log);
            goto out;
        }
    }

    /* A newer minor host appends members the plugin does not know: it reads only its part. */
    struct {
        struct mmrt_host host;
        void *future_member;
    } newer = {.host = host, .future_member = NULL};
    newer.host.hdr.abi_major = MMRT_ABI_MAJOR;
    newer.host.hdr.abi_minor = MMRT_ABI_MINOR + 1;
    newer.host.hdr.struct_size = (uint32_t)sizeof newer;
    const struct mmrt_plugin *p = entry(&newer.host);
    const char *missing;
    if (!p) {
        st = mmrt_error_set(err, MMRT_ERR_PLUGIN, "entry point refused a host table of a newer "
                            "minor (ABI %d.%d, %u bytes): %s", MMRT_ABI_MAJOR, MMRT_ABI_MINOR + 1,
                            newer.host.hdr.struct_size, entry_log);
    } else if (p->hdr.abi_major != MMRT_ABI_MAJOR) {
        st = mmrt_error_set(err, MMRT_ERR_PLUGIN, "plugin speaks ABI major %u, this is %d",
                            p->hdr.abi_major, MMRT_ABI_MAJOR);
    } else if (p->hdr.struct_size < MMRT_PLUGIN_MIN_SIZE) {
        st = mmrt_error_set(err, MMRT_ERR_PLUGIN, "plugin struct_size %u is shorter than the "
                            "oldest layout (%zu bytes)", p->hdr.struct_size,
                            (size_t)MMRT_PLUGIN_MIN_SIZE);
    } else if ((missing = missing_required(p))) {
        st = mmrt_error_set(err, MMRT_ERR_PLUGIN, "required member %s is NULL", missing);
    } else if (name && strcmp(p->name, name) != 0) {
        st = mmrt_error_set(err, MMRT_ERR_PLUGIN, "plugin is named \"%s\", want \"%s\"",
                            p->name, name);
    }
out:
    entry(restore);
    return st;
}
