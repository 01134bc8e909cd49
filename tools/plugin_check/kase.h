/*
 * tools/plugin_check/kase.h — one operator case run on both devices ("case" is a C keyword).
 *
 * A case allocates its tensors twice (reference device, device under test) from the device
 * pools, fills one host staging buffer per allocation and uploads the same bytes to both,
 * launches the operator through core/ops.h on each (exactly as models launch it, so the
 * operator front validates every launch), downloads the output from both and compares.
 *
 *     struct kase k;
 *     kase_begin(&k, c, MMRT_OP_ADD, "F16", serial, "[%d, %d] + row", R, N);
 *     struct kt *a = kt_new(&k, MMRT_DTYPE_F32, SHAPE(R, N));
 *     kt_rand(&k, a, -4, 4);
 *     …
 *     kase_run(&k, (const struct kt *[]){ a, b }, 2, y, NULL, 0);
 *     kase_check(&k, y);
 *     return kase_end(&k, err);
 *
 * Errors are sticky: after the first failure (pool too small, a kernel error, host memory)
 * every later call is a no-op and may be handed the NULL that a failed kt_new returned, so
 * case code stays a straight line; kase_end turns the state into the case's verdict.
 *
 * Watchdog: with chk.case_timeout_s set, a case that does not finish in time (a kernel that
 * never returns cannot be cancelled) prints which case hung and exits with CHK_EXIT_FAIL.
 *
 * Poison: every allocation starts as NaN (F32/F16/BF16), 0x7fffffff (I32), -128 (I8, the
 * code core/quant.h never writes) or 0xff (U4, whose bytes are all valid) on both devices.
 * A kernel that reads a cell outside its view gets NaN into its result; one that writes
 * outside its dst view changes bytes that must stay equal between the devices.
 */
#ifndef MMRT_PLUGIN_CHECK_KASE_H
#define MMRT_PLUGIN_CHECK_KASE_H

#include "check.h"

/* SHAPE(2, 3, 4) expands to "n_dims, ne" for kt_new / kt_view. */
#define SHAPE(...)                                                                             \
    (int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)), (const int64_t[]){__VA_ARGS__}

#define KASE_MAX_BASES 16
#define KASE_MAX_TENSORS 24
#define KASE_MAX_TEMPS 32

/* One allocation, on both devices, and the bytes both get. */
struct kase_base {
    struct mmrt_dev_tensor dt[2];
    unsigned char *host;
    uint64_t nbytes;
    enum mmrt_dtype dtype;
    bool dirty; /* host bytes not uploaded yet */
};

/* A tensor as the op sees it: a view (possibly the whole) of one base, on each device. */
struct kt {
    struct mmrt_tensor v[2];
    int base;
    uint64_t rel_offset; /* byte offset of the view inside its base */
};

struct kase {
    struct chk *c;
    enum mmrt_op op;
    int row;
    struct chk_case res;
    mmrt_status st;      /* sticky state; MMRT_OK while the case is healthy */
    enum chk_verdict verdict_on_error;
    uint64_t rng;
    double t0;
    bool zeros_exact;    /* where the reference is exactly ±0, the plugin must be too */
    struct kase_base bases[KASE_MAX_BASES];
    int n_bases;
    struct kt tensors[KASE_MAX_TENSORS];
    int n_tensors;
    void *temps[KASE_MAX_TEMPS];
    int n_temps;
};

/* Starts a case of `op` in the row (op, dtype). `serial` numbers the case within its op and
 * seeds its random inputs together with the run's --seed, so a case has the same inputs
 * whatever --ops or --quick select. The description is printf-formatted. */
void kase_begin(struct kase *k, struct chk *c, enum mmrt_op op, const char *dtype,
                uint64_t serial, const char *fmt, ...) __attribute__((format(printf, 6, 7)));

/* A contiguous tensor of dtype and shape on both devices, poisoned. NULL after an error. */
struct kt *kt_new(struct kase *k, enum mmrt_dtype dtype, int n_dims, const int64_t *ne);

/* A strided view of parent's allocation: extents ne, strides and offset in elements of
 * parent's dtype, relative to parent's first element. The caller keeps it inside the
 * allocation. NULL after an error. */
struct kt *kt_view(struct kase *k, const struct kt *parent, int n_dims, const int64_t *ne,
                   const int64_t *nb_elems, int64_t offset_elems);

/* Writes values into the elements the view covers (row-major over its extents), rounded to
 * its dtype with round-to-nearest-even: random in [lo, hi), or from v (numel(t) floats,
 * rounded in place so the caller sees the device's values), or raw elements of the view's
 * dtype (numel(t) of them: I32 ids, F16 bit patterns). */
void kt_rand(struct kase *k, struct kt *t, float lo, float hi);
void kt_set(struct kase *k, struct kt *t, float *v);
void kt_set_raw(struct kase *k, struct kt *t, const void *elems);

/* A quantized MATMUL weight (plugin.h, ABI 1.3): random values in ±hi whose rows differ in
 * magnitude (row r scaled by 2^-(r mod 5)) with every seventh row zero, quantized by the
 * runtime's own quantizer (core/quant.h); the codes go into w (I8 [N, K], contiguous) and the
 * per-row scales into scales (F32 [N]). */
void kt_quantize(struct kase *k, struct kt *w, struct kt *scales, float hi);

/* The same rows quantized to U4 in groups of `group` (core/quant.h): the packed codes into w
 * (U4 [N, K/2], contiguous), scales and zero points into scales and zeros (F32 [N, K/group]). */
void kt_quantize_u4(struct kase *k, struct kt *w, struct kt *scales, struct kt *zeros,
                    int64_t group, float hi);

/* Random numbers from the case's stream: uniform float in [lo, hi), int in [lo, hi]
 * (hi − lo < 2³¹). */
float kase_float(struct kase *k, float lo, float hi);
int kase_int(struct kase *k, int lo, int hi);
uint64_t kase_bits(struct kase *k); /* 64 random bits */

/* n zeroed host floats / int32s that live until kase_end; NULL after an error. */
float *kase_floats(struct kase *k, int64_t n);
int32_t *kase_ints(struct kase *k, int64_t n);

/* Uploads what changed, then launches op on the reference and on the plugin. src entries may
 * be NULL (absent optional inputs); n_src ≤ MMRT_MAX_SRC_ALL (sources 6 and 7, an I8 store's
 * scales, reach the kernel in op_args.src_ext). */
void kase_run(struct kase *k, const struct kt *const *src, int n_src, const struct kt *dst,
              const void *params, uint32_t params_size);

/* Downloads dst's allocation from both devices and compares (see check.h). */
void kase_check(struct kase *k, const struct kt *dst);

/* Where plugin.h fixes an output bit for bit (an I8 store's codes and scales, GATHER_HEADS
 * from one), the reference is held to the checker's own model of the header too: downloads
 * t's allocation from the reference device and compares the elements t covers with want
 * (numel(t) raw elements of t's dtype, row-major over the view; NaN meets any NaN). A
 * difference is CHK_ERROR — the reference plugin and plugin.h disagree, which is no fault of
 * the plugin under test. Call it before kase_check, which holds the plugin to the reference. */
void kase_expect(struct kase *k, const struct kt *t, const void *want);

/* Records the case, frees everything it allocated. MMRT_OK unless the result could not be
 * recorded (host memory). */
mmrt_status kase_end(struct kase *k, struct mmrt_error *err);

/* Number of elements of a view. */
int64_t kt_numel(const struct kt *t);

/* F16 / BF16 elements are built and read with plugin.h's reference conversions
 * (mmrt_f32_to_f16 and the rest). */

#endif
