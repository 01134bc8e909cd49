/*
 * tests/fuzz/fuzz_safetensors.c — libFuzzer target for core/formats/safetensors.c.
 *
 * The input is a whole safetensors file. It goes through mmrt_safetensors_parse_header();
 * when accepted, every tensor view is touched (all its bytes read, converted to f32 when
 * small and of a float dtype — other dtypes must be refused by read_f32 — looked up by
 * name), so ASan sees any pointer the validator let escape the buffer.
 * The invariants the header promises are checked with __builtin_trap(), which libFuzzer
 * reports as a crash: every view inside the input, names strictly ascending, the ranges
 * adding up to exactly the data buffer, messages of refused inputs on one line.
 *
 * The same entry point is linked into the normal build with replay_main.c, so the
 * committed corpus (tests/fuzz/corpus/safetensors) runs as a ctest everywhere.
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "formats/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static volatile uint8_t g_sink;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct mmrt_safetensors *st = NULL;
    struct mmrt_error err = {0};
    if (mmrt_safetensors_parse_header(data, size, "fuzz", NULL, &st, &err) != MMRT_OK) {
        size_t len = strnlen(err.msg, sizeof err.msg);
        if (st != NULL || len == 0 || len == sizeof err.msg || memchr(err.msg, '\n', len))
            __builtin_trap();
        return 0;
    }
    uint64_t n_header = 0;
    for (int i = 7; i >= 0; i--)
        n_header = n_header << 8 | data[i];
    uint64_t covered = 0;
    size_t n = mmrt_safetensors_count(st);
    for (size_t i = 0; i < n; i++) {
        const struct mmrt_st_tensor *t = mmrt_safetensors_at(st, i);
        if (!t)
            __builtin_trap();
        const uint8_t *p = t->data;
        if (!t->name[0] || mmrt_safetensors_find(st, t->name) != t)
            __builtin_trap();
        if (i > 0 && strcmp(mmrt_safetensors_at(st, i - 1)->name, t->name) >= 0)
            __builtin_trap();
        if (p < data + 8 + n_header || t->nbytes > size ||
            (size_t)(p - data) > size - t->nbytes || t->file_offset != (uint64_t)(p - data))
            __builtin_trap();
        if (t->n_dims < 0 || t->n_dims > MMRT_ST_MAX_RANK)
            __builtin_trap();
        uint8_t acc = 0;
        for (uint64_t k = 0; k < t->nbytes; k++)
            acc ^= p[k];
        g_sink = acc;
        /* read_f32 converts the float dtypes; integer tensors (I8, I32, U8, I64: quantized
         * checkpoints' codes and bookkeeping) are refused with INVALID_ARG. */
        float buf[256];
        const bool is_float = t->dtype == MMRT_DTYPE_F32 || t->dtype == MMRT_DTYPE_F16 ||
                              t->dtype == MMRT_DTYPE_BF16;
        if (t->n_elements <= 256 &&
            mmrt_safetensors_read_f32(t, buf, (size_t)t->n_elements, &err) !=
                (is_float ? MMRT_OK : MMRT_ERR_INVALID_ARG))
            __builtin_trap();
        covered += t->nbytes;
    }
    if (covered != size - 8 - n_header)
        __builtin_trap();
    mmrt_safetensors_close(st);
    return 0;
}
