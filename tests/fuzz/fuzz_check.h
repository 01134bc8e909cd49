/*
 * tests/fuzz/fuzz_check.h — the checks the contract-checking fuzz targets share: a failed
 * check names itself on stderr (kept in libFuzzer's log) and traps, which libFuzzer reports
 * as a crash; a refusal's message must be one line of printable text (error.h).
 */
#ifndef MMRT_FUZZ_CHECK_H
#define MMRT_FUZZ_CHECK_H

#include <stdio.h>
#include <string.h>

#include "error.h"

#define CHECK(c)                                                                   \
    do {                                                                           \
        if (!(c)) {                                                                \
            fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #c); \
            __builtin_trap();                                                      \
        }                                                                          \
    } while (0)

/* One line of printable text (UTF-8 allowed, no control bytes), not empty, terminated. */
static inline void fuzz_check_message(const struct mmrt_error *err)
{
    const size_t len = strnlen(err->msg, sizeof err->msg);
    CHECK(len > 0 && len < sizeof err->msg);
    for (size_t i = 0; i < len; i++)
        if ((unsigned char)err->msg[i] < 0x20 || err->msg[i] == 0x7f) {
            fprintf(stderr, "message with a control byte at %zu: %s\n", i, err->msg);
            CHECK(!"a one-line message of printable text");
        }
}

#endif
