/*
 * tools/plugin_check/tolerance.c — how far a plugin may be from the CPU reference, per
 * operator and dtype row, in the project's metric max |got − ref| / max |ref| (check.h).
 *
 * The values follow from the operator contract in plugin.h: inputs are converted to f32
 * exactly (F16/BF16 → F32 is exact), arithmetic is f32 or better, so the only freedom a
 * plugin has is the order of its f32 reductions and the accuracy of its transcendental
 * functions. The CPU plugin itself is within 1e-5 (reductions) / 1e-6 (elementwise) of a
 * double-precision reference (tests/test_cpu_ops.c), so two conforming f32 implementations
 * are within about twice that of each other; each value below adds headroom for a different
 * blocking or a device libm, and stays an order of magnitude below what a real bug costs
 * (rounding an activation to F16 or TF32 is ~1e-3, a wrong mask or head mapping ~1).
 * The dtype of a row changes the inputs, not the arithmetic, so one value covers all dtypes
 * of an op unless a row says otherwise.
 */
#include "check.h"

#include <string.h>

static const struct chk_tolerance table[] = {
    {MMRT_OP_MATMUL, NULL, 5e-5,
     "f32 dot products of up to 4099 terms summed in any order (tiles, split-K): each order "
     "is within ~1e-5 of exact"},
    {MMRT_OP_MATMUL, "I8", 5e-5,
     "the codes convert to f32 exactly, so the same dot products as a float W plus one "
     "rounding where a row's sum is scaled (or the codes carried in F16 through tensor "
     "cores, as for F16 weights); a lost or misplaced scale costs ~1"},
    {MMRT_OP_MATMUL, "U4", 3e-4,
     "f32 dot products of the dequantized weights (code − zero) · scale; a GPU may carry the "
     "dequantized weights in F16 through tensor cores (2^-12 relative per weight, ~1e-4 of "
     "the largest output over K); a swapped nibble, group or zero point costs ~1"},
    {MMRT_OP_ADD, NULL, 1e-6,
     "one correctly rounded f32 add per element: should match bit for bit; 1e-6 allows only "
     "a few ulp"},
    {MMRT_OP_MUL, NULL, 1e-6, "one correctly rounded f32 multiply per element"},
    {MMRT_OP_SCALE, NULL, 1e-6, "one correctly rounded f32 multiply per element"},
    {MMRT_OP_LAYERNORM, NULL, 5e-5,
     "mean and variance are reductions over up to 4096 elements in any order, one or two "
     "passes, then rsqrt (a few ulp on devices)"},
    {MMRT_OP_RMSNORM, NULL, 5e-5,
     "mean of squares is a reduction over up to 4096 elements in any order, then rsqrt"},
    {MMRT_OP_GELU, NULL, 1e-5,
     "device erf may be 16 ulp off (OpenCL 1.2); 1e-5 of max |y| is ~80 ulp of the largest "
     "output"},
    {MMRT_OP_GELU_TANH, NULL, 1e-5, "device tanh may be 5 ulp off, plus x³ rounding"},
    {MMRT_OP_QUICK_GELU, NULL, 1e-5, "device exp may be 3 ulp off, then a division"},
    {MMRT_OP_SILU, NULL, 1e-5, "device exp may be 3 ulp off, then a division"},
    {MMRT_OP_SWIGLU, NULL, 1e-5, "silu (device exp) times a second input"},
    {MMRT_OP_RELU2, NULL, 1e-6, "one multiply: should match bit for bit"},
    {MMRT_OP_SOFTMAX, NULL, 1e-5,
     "device exp (3 ulp) and a sum over up to 4099 terms in any order; x·scale is rounded "
     "to f32 alike on both sides"},
    {MMRT_OP_ROPE, NULL, 1e-5,
     "device cos/sin (4 ulp) of the same f32 angle; inv_freq must be the correctly rounded "
     "f32 value as Hugging Face computes it — a 1-ulp error moves the angle at position "
     "40000 by ~3e-3"},
    {MMRT_OP_ROPE_MULTI, NULL, 1e-5,
     "as ROPE: device cos/sin (4 ulp) of the same f32 angle from the same correctly rounded "
     "inv_freq; a pair in the wrong section, a wrong restart or freq_dim moves angles by "
     "radians"},
    {MMRT_OP_ATTENTION, NULL, 5e-5,
     "q·k over D ≤ 256 and p·v over up to 1000 keys, summed in any order, online or two-pass "
     "softmax with device exp"},
    {MMRT_OP_ATTENTION_PAGED, NULL, 5e-5,
     "ATTENTION's arithmetic over keys gathered through the page table: q·k over D ≤ 256 and "
     "p·v over up to 1000 keys in any order; a sequence's rows must also be the same bits "
     "alone as in a batch, whatever the page size and order"},
    {MMRT_OP_GET_ROWS, NULL, 0, "a copy with exact F16/BF16 → F32 widening: bit-exact"},
    {MMRT_OP_SET_ROWS, NULL, 0,
     "moves rows, converting F32 to F16/BF16 with round-to-nearest-even as plugin.h "
     "specifies, or to I8 codes and a row scale by its quantizer; rows with an out-of-range "
     "index (and their scales) stay as they were: bit-exact"},
    {MMRT_OP_PATCH_EMBED, NULL, 5e-5,
     "a convolution is a dot product of C·P·P terms (up to 3·30·30) summed in any order"},
    {MMRT_OP_CONCAT, NULL, 0, "moves bytes: bit-exact"},
    {MMRT_OP_COPY, NULL, 0,
     "moves bytes, or converts with round-to-nearest-even as plugin.h specifies: bit-exact"},
    {MMRT_OP_GATHER_HEADS, NULL, 0,
     "plugin.h fixes the arithmetic: rows widened exactly (an I8 code to code · scale, one "
     "rounded product), f32 additions in g order, one correctly rounded division: bit-exact"},
    {MMRT_OP_L2_NORM, NULL, 1e-5,
     "a sum of up to 4099 squares in any f32 (or double) order, then a square root: a few "
     "ulp of the norm; a wrong row or a missed element costs ~1e-3 or more"},
    {MMRT_OP_ARGMAX, NULL, 0,
     "an index: exact (inputs are uploaded, not computed, so there are no near-ties to "
     "excuse; exact ties must pick the first)"},
};

const struct chk_tolerance *chk_tolerance_for(enum mmrt_op op, const char *dtype)
{
    const struct chk_tolerance *any = NULL;
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++) {
        if (table[i].op != op)
            continue;
        if (table[i].dtype && dtype && strcmp(table[i].dtype, dtype) == 0)
            return &table[i];
        if (!table[i].dtype && !any)
            any = &table[i];
    }
    return any;
}

const struct chk_tolerance *chk_tolerance_table(int *n)
{
    *n = (int)(sizeof table / sizeof table[0]);
    return table;
}
