/*
 * tools/plugin_check/kase.c — see kase.h.
 *
 * Layout bookkeeping: a view is (base allocation, byte offset inside it, extents, byte
 * strides); the same relative layout is built on both devices, so one walk over the view's
 * elements (struct walk) gives the byte offsets into both downloads and into the host
 * staging buffer.
 */
#include "kase.h"

#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ops.h"
#include "quant.h"
#include "tensor.h"

/* ---- the watchdog ------------------------------------------------------------------------ */

/* What the SIGALRM handler writes: prepared by kase_begin, because a handler may only call
 * async-signal-safe functions (write, _exit). */
static char watchdog_msg[512];
static size_t watchdog_len;

static void watchdog_fire(int sig)
{
    (void)sig;
    ssize_t rc = write(STDERR_FILENO, watchdog_msg, watchdog_len);
    (void)rc;
    _exit(CHK_EXIT_FAIL);
}

void chk_watchdog_arm(const struct chk *c, const char *what)
{
    if (c->case_timeout_s == 0)
        return;
    int n = snprintf(watchdog_msg, sizeof watchdog_msg, "mmrt-plugin-check: FAIL: %s: did not "
                     "finish within %u s (the plugin hangs, or --case-timeout is too short "
                     "for this device)\n", what, c->case_timeout_s);
    watchdog_len = n < 0 ? 0 : (size_t)n < sizeof watchdog_msg ? (size_t)n
                                                             : sizeof watchdog_msg - 1;
    signal(SIGALRM, watchdog_fire);
    alarm(c->case_timeout_s);
}

void chk_watchdog_disarm(const struct chk *c)
{
    if (c->case_timeout_s)
        alarm(0);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Element access in host bytes. put_elem rounds to the dtype and returns the stored value. */
static double get_elem(const unsigned char *p, enum mmrt_dtype dt)
{
    uint16_t h;
    float f;
    int32_t i;
    switch (dt) {
    case MMRT_DTYPE_F32: memcpy(&f, p, 4); return f;
    case MMRT_DTYPE_F16: memcpy(&h, p, 2); return mmrt_f16_to_f32(h);
    case MMRT_DTYPE_BF16: memcpy(&h, p, 2); return mmrt_bf16_to_f32(h);
    case MMRT_DTYPE_I32: memcpy(&i, p, 4); return i;
    case MMRT_DTYPE_I8: return *(const int8_t *)p;
    case MMRT_DTYPE_F8E4M3: return mmrt_f8e4m3_to_f32(*p);
    default: return NAN;
    }
}

static float put_elem(unsigned char *p, enum mmrt_dtype dt, float v)
{
    uint16_t h;
    int32_t i;
    switch (dt) {
    case MMRT_DTYPE_F32: memcpy(p, &v, 4); return v;
    case MMRT_DTYPE_F16: h = mmrt_f32_to_f16(v); memcpy(p, &h, 2); return mmrt_f16_to_f32(h);
    case MMRT_DTYPE_BF16: h = mmrt_f32_to_bf16(v); memcpy(p, &h, 2); return mmrt_bf16_to_f32(h);
    case MMRT_DTYPE_I32: i = (int32_t)v; memcpy(p, &i, 4); return (float)i;
    case MMRT_DTYPE_I8:
        *(int8_t *)p = (int8_t)(v > 127.0f ? 127 : v < -127.0f ? -127 : lrintf(v));
        return *(const int8_t *)p;
    case MMRT_DTYPE_F8E4M3: *p = mmrt_f32_to_f8e4m3(v); return mmrt_f8e4m3_to_f32(*p);
    default: return v;
    }
}

static void poison(unsigned char *p, uint64_t nbytes, enum mmrt_dtype dt)
{
    size_t es = mmrt_dtype_size(dt);
    uint32_t nan32 = 0x7fc00000u, i32 = 0x7fffffffu;
    uint16_t nan16 = dt == MMRT_DTYPE_F16 ? 0x7e00u : 0x7fc0u;
    for (uint64_t i = 0; i + es <= nbytes; i += es) {
        if (dt == MMRT_DTYPE_F32)
            memcpy(p + i, &nan32, 4);
        else if (dt == MMRT_DTYPE_I32)
            memcpy(p + i, &i32, 4);
        else if (dt == MMRT_DTYPE_I8)
            p[i] = 0x80u;
        else if (dt == MMRT_DTYPE_U4)
            p[i] = 0xffu; /* every byte is a valid code pair: the codes are always written whole */
        else if (dt == MMRT_DTYPE_F8E4M3)
            p[i] = 0x7fu; /* its NaN */
        else
            memcpy(p + i, &nan16, 2);
    }
}

/* ---- walking a view ------------------------------------------------------------------------- */

struct walk {
    int n;
    int64_t ne[MMRT_MAX_DIMS], nb[MMRT_MAX_DIMS], idx[MMRT_MAX_DIMS];
    uint64_t base_off;
    int64_t left;
};

int64_t kt_numel(const struct kt *t)
{
    int64_t n = 1;
    for (int i = 0; i < t->v[0].n_dims; i++)
        n *= t->v[0].ne[i];
    return n;
}

static void walk_init(struct walk *w, const struct kt *t)
{
    memset(w, 0, sizeof *w);
    w->n = t->v[0].n_dims;
    for (int i = 0; i < w->n; i++) {
        w->ne[i] = t->v[0].ne[i];
        w->nb[i] = t->v[0].nb[i];
    }
    w->base_off = t->rel_offset;
    w->left = kt_numel(t);
}

/* The byte offset (inside the base) of the next element in row-major order; false at the end. */
static bool walk_next(struct walk *w, uint64_t *off)
{
    if (w->left <= 0)
        return false;
    int64_t o = 0;
    for (int i = 0; i < w->n; i++)
        o += w->idx[i] * w->nb[i];
    *off = w->base_off + (uint64_t)o;
    w->left--;
    for (int i = w->n - 1; i >= 0; i--) {
        if (++w->idx[i] < w->ne[i])
            break;
        w->idx[i] = 0;
    }
    return true;
}

/* ---- the sticky state ------------------------------------------------------------------------ */

static void kase_fail(struct kase *k, mmrt_status st, enum chk_verdict v, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static void kase_fail(struct kase *k, mmrt_status st, enum chk_verdict v, const char *fmt, ...)
{
    if (k->st != MMRT_OK)
        return;
    k->st = st;
    k->verdict_on_error = v;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(k->res.detail, sizeof k->res.detail, fmt, ap);
    va_end(ap);
}

static uint64_t splitmix(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

float kase_float(struct kase *k, float lo, float hi)
{
    return lo + (hi - lo) * (float)((double)(splitmix(&k->rng) >> 11) / 9007199254740992.0);
}

int kase_int(struct kase *k, int lo, int hi)
{
    return lo + (int)(splitmix(&k->rng) % ((uint64_t)((int64_t)hi - lo) + 1));
}

uint64_t kase_bits(struct kase *k)
{
    return splitmix(&k->rng);
}

void kase_begin(struct kase *k, struct chk *c, enum mmrt_op op, const char *dtype,
                uint64_t serial, const char *fmt, ...)
{
    memset(k, 0, sizeof *k);
    k->c = c;
    k->op = op;
    k->t0 = now_s();
    k->res.rel_err = -1;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(k->res.desc, sizeof k->res.desc, fmt, ap);
    va_end(ap);
    /* Seed from (run seed, op, serial) only, so selections do not shift inputs. */
    k->rng = c->seed * 0x9E3779B97F4A7C15ull ^ ((uint64_t)op << 40) ^ (serial * 0x2545F4914F6CDD1Dull);
    splitmix(&k->rng);
    struct mmrt_error err;
    k->row = chk_row_get(c, op, dtype, &err);
    if (k->row < 0)
        kase_fail(k, MMRT_ERR_NO_MEMORY, CHK_ERROR, "%s", err.msg);
    k->res.row = k->row;
    char what[sizeof k->res.desc + 64];
    snprintf(what, sizeof what, "%s %s: %s", mmrt_op_name(op), dtype, k->res.desc);
    chk_watchdog_arm(c, what);
}

static void *temp_alloc(struct kase *k, size_t nbytes)
{
    if (k->st != MMRT_OK)
        return NULL;
    void *p = k->n_temps < KASE_MAX_TEMPS ? calloc(1, nbytes ? nbytes : 1) : NULL;
    if (!p) {
        kase_fail(k, MMRT_ERR_NO_MEMORY, CHK_ERROR, "out of host memory (%zu bytes)", nbytes);
        return NULL;
    }
    k->temps[k->n_temps++] = p;
    return p;
}

float *kase_floats(struct kase *k, int64_t n)
{
    return temp_alloc(k, (size_t)n * sizeof(float));
}

int32_t *kase_ints(struct kase *k, int64_t n)
{
    return temp_alloc(k, (size_t)n * sizeof(int32_t));
}

/* ---- tensors ---------------------------------------------------------------------------------- */

struct kt *kt_new(struct kase *k, enum mmrt_dtype dtype, int n_dims, const int64_t *ne)
{
    if (k->st != MMRT_OK)
        return NULL;
    if (k->n_bases == KASE_MAX_BASES || k->n_tensors == KASE_MAX_TENSORS) {
        kase_fail(k, MMRT_ERR_INTERNAL, CHK_ERROR, "checker: too many tensors in one case");
        return NULL;
    }
    struct mmrt_error err;
    uint64_t nbytes;
    if (mmrt_tensor_nbytes(dtype, n_dims, ne, &nbytes, &err) != MMRT_OK) {
        kase_fail(k, MMRT_ERR_INTERNAL, CHK_ERROR, "checker: %s", err.msg);
        return NULL;
    }
    struct kase_base *b = &k->bases[k->n_bases];
    memset(b, 0, sizeof *b);
    b->host = malloc(nbytes ? (size_t)nbytes : 1);
    if (!b->host) {
        kase_fail(k, MMRT_ERR_NO_MEMORY, CHK_ERROR, "out of host memory (%llu bytes)",
                  (unsigned long long)nbytes);
        return NULL;
    }
    b->nbytes = nbytes;
    b->dtype = dtype;
    b->dirty = true;
    poison(b->host, nbytes, dtype);
    k->n_bases++; /* from here on kase_end frees it */
    for (int d = 0; d < 2; d++) {
        mmrt_status st = mmrt_dev_tensor_alloc(k->c->dev[d], dtype, n_dims, ne, &b->dt[d], &err);
        if (st == MMRT_ERR_OUT_OF_POOL) {
            kase_fail(k, st, CHK_SKIPPED, "does not fit the %s pool (%s)",
                      d ? "plugin's" : "reference's", err.msg);
            return NULL;
        }
        if (st != MMRT_OK) {
            kase_fail(k, st, d ? CHK_FAIL : CHK_ERROR, "%s", err.msg);
            return NULL;
        }
    }
    struct kt *t = &k->tensors[k->n_tensors++];
    memset(t, 0, sizeof *t);
    t->base = k->n_bases - 1;
    t->v[0] = b->dt[0].t;
    t->v[1] = b->dt[1].t;
    return t;
}

struct kt *kt_view(struct kase *k, const struct kt *parent, int n_dims, const int64_t *ne,
                   const int64_t *nb_elems, int64_t offset_elems)
{
    if (k->st != MMRT_OK)
        return NULL;
    if (k->n_tensors == KASE_MAX_TENSORS) {
        kase_fail(k, MMRT_ERR_INTERNAL, CHK_ERROR, "checker: too many tensors in one case");
        return NULL;
    }
    const struct kase_base *b = &k->bases[parent->base];
    int64_t es = (int64_t)mmrt_dtype_size(b->dtype);
    struct kt *t = &k->tensors[k->n_tensors];
    memset(t, 0, sizeof *t);
    t->base = parent->base;
    t->rel_offset = parent->rel_offset + (uint64_t)(offset_elems * es);
    int64_t last = 0; /* byte offset of the view's last element, relative to its first */
    bool empty = false;
    for (int d = 0; d < 2; d++) {
        struct mmrt_tensor *v = &t->v[d];
        *v = b->dt[d].t;
        v->offset = b->dt[d].t.offset + t->rel_offset;
        v->n_dims = n_dims;
        for (int i = 0; i < MMRT_MAX_DIMS; i++) {
            v->ne[i] = i < n_dims ? ne[i] : 1;
            v->nb[i] = i < n_dims ? nb_elems[i] * es : es;
        }
    }
    for (int i = 0; i < n_dims; i++) {
        last += (ne[i] - 1) * nb_elems[i] * es;
        empty |= ne[i] == 0;
    }
    if (!empty && t->rel_offset + (uint64_t)last + (uint64_t)es > b->nbytes) {
        kase_fail(k, MMRT_ERR_INTERNAL, CHK_ERROR, "checker: view outside its allocation");
        return NULL;
    }
    k->n_tensors++;
    return t;
}

void kt_rand(struct kase *k, struct kt *t, float lo, float hi)
{
    if (k->st != MMRT_OK)
        return;
    struct kase_base *b = &k->bases[t->base];
    struct walk w;
    uint64_t off = 0;
    walk_init(&w, t);
    while (walk_next(&w, &off))
        put_elem(b->host + off, b->dtype, kase_float(k, lo, hi));
    b->dirty = true;
}

void kt_set(struct kase *k, struct kt *t, float *v)
{
    if (k->st != MMRT_OK)
        return;
    struct kase_base *b = &k->bases[t->base];
    struct walk w;
    uint64_t off = 0;
    int64_t i = 0;
    walk_init(&w, t);
    while (walk_next(&w, &off)) {
        v[i] = put_elem(b->host + off, b->dtype, v[i]);
        i++;
    }
    b->dirty = true;
}

void kt_set_raw(struct kase *k, struct kt *t, const void *elems)
{
    if (k->st != MMRT_OK)
        return;
    struct kase_base *b = &k->bases[t->base];
    struct walk w;
    uint64_t off = 0;
    int64_t i = 0;
    size_t es = mmrt_dtype_size(b->dtype);
    walk_init(&w, t);
    while (walk_next(&w, &off))
        memcpy(b->host + off, (const unsigned char *)elems + es * (size_t)i++, es);
    b->dirty = true;
}

void kt_quantize(struct kase *k, struct kt *w, struct kt *scales, float hi)
{
    if (k->st != MMRT_OK)
        return;
    const int64_t N = w->v[0].ne[0], K = w->v[0].ne[1];
    float *v = kase_floats(k, N * K), *s = kase_floats(k, N);
    int8_t *q = (int8_t *)kase_floats(k, (N * K + 3) / 4); /* bytes in float-sized storage */
    if (!v || !s || !q)
        return;
    for (int64_t r = 0; r < N; r++)
        for (int64_t i = 0; i < K; i++) {
            float x = kase_float(k, -hi, hi);
            v[r * K + i] = r % 7 == 6 ? 0.0f : ldexpf(x, -(int)(r % 5));
        }
    int64_t bad = 0;
    if (!mmrt_quant_i8_rows(v, N, K, q, s, &bad)) {
        kase_fail(k, MMRT_ERR_INTERNAL, CHK_ERROR, "checker: weight %lld is not finite",
                  (long long)bad);
        return;
    }
    kt_set_raw(k, w, q);
    kt_set_raw(k, scales, s);
}

void kt_quantize_u4(struct kase *k, struct kt *w, struct kt *scales, struct kt *zeros,
                    int64_t group, float hi)
{
    if (k->st != MMRT_OK)
        return;
    const int64_t N = w->v[0].ne[0], K = w->v[0].ne[1] * 2, G = K / group;
    float *v = kase_floats(k, N * K), *s = kase_floats(k, N * G), *z = kase_floats(k, N * G);
    uint8_t *q = (uint8_t *)kase_floats(k, (N * K / 2 + 3) / 4); /* bytes in float storage */
    if (!v || !s || !z || !q)
        return;
    for (int64_t r = 0; r < N; r++)
        for (int64_t i = 0; i < K; i++) {
            float x = kase_float(k, -hi, hi);
            v[r * K + i] = r % 7 == 6 ? 0.0f : ldexpf(x, -(int)(r % 5));
        }
    int64_t bad = 0;
    if (!mmrt_quant_q4_rows(v, N, K, group, q, s, z, &bad)) {
        kase_fail(k, MMRT_ERR_INTERNAL, CHK_ERROR, "checker: weight %lld is not finite",
                  (long long)bad);
        return;
    }
    kt_set_raw(k, w, q);
    kt_set_raw(k, scales, s);
    kt_set_raw(k, zeros, z);
}

/* ---- running and comparing ------------------------------------------------------------------ */

void kase_run(struct kase *k, const struct kt *const *src, int n_src, const struct kt *dst,
              const void *params, uint32_t params_size)
{
    if (k->st != MMRT_OK)
        return;
    struct mmrt_error err;
    for (int i = 0; i < k->n_bases; i++) {
        struct kase_base *b = &k->bases[i];
        if (!b->dirty)
            continue;
        for (int d = 0; d < 2; d++) {
            mmrt_status st = mmrt_dev_upload(k->c->dev[d], &b->dt[d].t, b->host, b->nbytes, &err);
            if (st != MMRT_OK) {
                kase_fail(k, st, d ? CHK_FAIL : CHK_ERROR, "%s", err.msg);
                return;
            }
        }
        b->dirty = false;
    }
    for (int d = 0; d < 2; d++) {
        /* The core puts sources past the sixth into op_args.src_ext (ABI 1.7): a launch
         * with an I8 store's scales as src6 / src7 reads all of this array. */
        const struct mmrt_tensor *s[MMRT_MAX_SRC_ALL] = {0};
        for (int i = 0; i < n_src && i < MMRT_MAX_SRC_ALL; i++)
            s[i] = src[i] ? &src[i]->v[d] : NULL;
        mmrt_status st = mmrt_op_launch(k->c->dev[d], k->op, s, n_src, &dst->v[d], params,
                                        params_size, &err);
        if (st == MMRT_OK)
            continue;
        if (d == 0)
            kase_fail(k, st, CHK_ERROR, "reference failed: %s", err.msg);
        else if (st == MMRT_ERR_UNSUPPORTED)
            kase_fail(k, st, CHK_REFUSED, "%s", err.msg);
        else
            kase_fail(k, st, CHK_FAIL, "%s: %s", mmrt_status_name(st), err.msg);
        return;
    }
}

static void describe_index(const struct kt *t, int64_t flat, char *buf, size_t size)
{
    int64_t idx[MMRT_MAX_DIMS] = {0};
    int n = t->v[0].n_dims;
    for (int i = n - 1; i >= 0; i--) {
        int64_t e = t->v[0].ne[i] ? t->v[0].ne[i] : 1;
        idx[i] = flat % e;
        flat /= e;
    }
    size_t used = (size_t)snprintf(buf, size, "[");
    for (int i = 0; i < n && used < size; i++)
        used += (size_t)snprintf(buf + used, size - used, "%s%lld", i ? ", " : "",
                                 (long long)idx[i]);
    if (used < size)
        snprintf(buf + used, size - used, "]");
}

void kase_expect(struct kase *k, const struct kt *t, const void *want)
{
    if (k->st != MMRT_OK)
        return;
    const struct kase_base *b = &k->bases[t->base];
    unsigned char *ref = malloc(b->nbytes ? (size_t)b->nbytes : 1);
    struct mmrt_error err;
    if (!ref) {
        kase_fail(k, MMRT_ERR_NO_MEMORY, CHK_ERROR, "out of host memory (%llu bytes)",
                  (unsigned long long)b->nbytes);
        return;
    }
    mmrt_status st = mmrt_dev_download(k->c->dev[0], &b->dt[0].t, ref, b->nbytes, &err);
    if (st != MMRT_OK) {
        kase_fail(k, st, CHK_ERROR, "%s", err.msg);
        free(ref);
        return;
    }
    const size_t es = mmrt_dtype_size(b->dtype);
    struct walk w;
    uint64_t off = 0;
    walk_init(&w, t);
    for (int64_t i = 0; walk_next(&w, &off); i++) {
        const unsigned char *e = (const unsigned char *)want + (size_t)i * es;
        double r = get_elem(ref + off, b->dtype), x = get_elem(e, b->dtype);
        if (memcmp(ref + off, e, es) == 0 || (isnan(r) && isnan(x)))
            continue;
        char where[64];
        describe_index(t, i, where, sizeof where);
        kase_fail(k, MMRT_ERR_INTERNAL, CHK_ERROR, "the reference plugin gives %.9g at %s "
                  "where plugin.h gives %.9g (the reference or the checker is wrong)", r, where,
                  x);
        break;
    }
    free(ref);
}

void kase_check(struct kase *k, const struct kt *dst)
{
    if (k->st != MMRT_OK)
        return;
    const struct kase_base *b = &k->bases[dst->base];
    double tol = k->c->rows[k->row].tol->tol;
    size_t n = b->nbytes ? (size_t)b->nbytes : 1;
    unsigned char *ref = malloc(n), *got = malloc(n), *mask = calloc(1, n);
    struct mmrt_error err;
    if (!ref || !got || !mask) {
        kase_fail(k, MMRT_ERR_NO_MEMORY, CHK_ERROR, "out of host memory (%zu bytes)", n);
        goto out;
    }
    for (int d = 0; d < 2; d++) {
        mmrt_status st = mmrt_dev_download(k->c->dev[d], &b->dt[d].t, d ? got : ref, b->nbytes,
                                           &err);
        if (st != MMRT_OK) {
            kase_fail(k, st, d ? CHK_FAIL : CHK_ERROR, "%s", err.msg);
            goto out;
        }
    }

    enum mmrt_dtype dt = b->dtype;
    size_t es = mmrt_dtype_size(dt);
    double max_ref = 0, max_err = 0;
    int64_t worst = -1, i = 0, n_mismatch = 0, first_mismatch = -1;
    char bad[256] = "";
    struct walk w;
    uint64_t off = 0;
    walk_init(&w, dst);
    for (; walk_next(&w, &off); i++) {
        memset(mask + off, 1, es);
        double r = get_elem(ref + off, dt), g = get_elem(got + off, dt);
        /* Bit-exact, except that NaN payloads are not specified anywhere. */
        bool same = memcmp(ref + off, got + off, es) == 0 || (isnan(r) && isnan(g));
        if (!same && ++n_mismatch == 1)
            first_mismatch = i;
        if (bad[0])
            continue;
        char where[64];
        if (isnan(r) || isnan(g) || isinf(r) || isinf(g)) {
            if (!(isnan(r) && isnan(g)) && r != g) {
                describe_index(dst, i, where, sizeof where);
                snprintf(bad, sizeof bad, "element %s is %.9g, reference %.9g", where, g, r);
            }
            continue;
        }
        if (k->zeros_exact && r == 0 && g != 0) {
            describe_index(dst, i, where, sizeof where);
            snprintf(bad, sizeof bad, "element %s is %.9g, must be exactly 0 as the reference",
                     where, g);
            continue;
        }
        if (fabs(r) > max_ref)
            max_ref = fabs(r);
        double e = fabs(g - r);
        if (e > max_err) {
            max_err = e;
            worst = i;
        }
    }
    k->res.n_mismatch = n_mismatch;
    double rel = max_err / (max_ref > 0 ? max_ref : 1.0);
    if (rel > k->res.rel_err)
        k->res.rel_err = rel;

    /* Bytes outside the view must be untouched: both devices started from the same bytes. */
    for (size_t j = 0; j < (size_t)b->nbytes; j++) {
        if (!mask[j] && ref[j] != got[j]) {
            kase_fail(k, MMRT_ERR_PLUGIN, CHK_FAIL, "wrote outside the dst view: byte %zu of "
                      "its %llu-byte allocation changed", j, (unsigned long long)b->nbytes);
            goto out;
        }
    }
    char where[64];
    if (bad[0]) {
        kase_fail(k, MMRT_ERR_PLUGIN, CHK_FAIL, "%s", bad);
    } else if (tol == 0 && n_mismatch > 0) {
        describe_index(dst, first_mismatch, where, sizeof where);
        walk_init(&w, dst);
        for (int64_t j = 0; j <= first_mismatch; j++)
            walk_next(&w, &off);
        kase_fail(k, MMRT_ERR_PLUGIN, CHK_FAIL, "%lld of %lld elements differ, first %s: got "
                  "%.9g, want %.9g (must be bit-exact)", (long long)n_mismatch,
                  (long long)kt_numel(dst), where, get_elem(got + off, dt),
                  get_elem(ref + off, dt));
    } else if (rel > tol) {
        describe_index(dst, worst, where, sizeof where);
        walk_init(&w, dst);
        for (int64_t j = 0; j <= worst; j++)
            walk_next(&w, &off);
        kase_fail(k, MMRT_ERR_PLUGIN, CHK_FAIL, "rel err %.3g > %.3g: worst element %s got "
                  "%.9g, want %.9g (max |ref| %.4g)", rel, tol, where, get_elem(got + off, dt),
                  get_elem(ref + off, dt), max_ref);
    }
out:
    free(ref);
    free(got);
    free(mask);
}

mmrt_status kase_end(struct kase *k, struct mmrt_error *err)
{
    chk_watchdog_disarm(k->c);
    if (k->st == MMRT_OK) {
        k->res.verdict = CHK_PASS;
    } else {
        k->res.verdict = k->verdict_on_error;
        if (k->verdict_on_error != CHK_FAIL)
            k->res.rel_err = -1; /* nothing compared, or nothing trustworthy */
    }
    for (int i = k->n_bases - 1; i >= 0; i--) {
        for (int d = 1; d >= 0; d--)
            mmrt_dev_tensor_free(k->c->dev[d], &k->bases[i].dt[d]);
        free(k->bases[i].host);
    }
    for (int i = 0; i < k->n_temps; i++)
        free(k->temps[i]);
    k->n_bases = k->n_temps = k->n_tensors = 0;
    k->res.seconds = now_s() - k->t0;
    if (k->row < 0)
        return mmrt_error_set(err, MMRT_ERR_NO_MEMORY, "%s", k->res.detail);
    return chk_add_case(k->c, &k->res, err);
}
