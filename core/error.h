/*
 * core/error.h — the error detail every fallible core function fills.
 *
 * Functions return an mmrt_status and take a `struct mmrt_error *err` as their last
 * parameter; on failure they write one line naming what was wrong (file, line, key, tensor,
 * byte offset) and return the status. `err` may be NULL when the caller does not want the
 * detail. The runtime copies the detail into its last-error string (mmrt_last_error()).
 */
#ifndef MMRT_CORE_ERROR_H
#define MMRT_CORE_ERROR_H

#include "mmrt/common.h"

#define MMRT_ERROR_MAX MMRT_MESSAGE_MAX /* what the caller can be handed whole */

struct mmrt_error {
    mmrt_status status;
    char msg[MMRT_ERROR_MAX];
};

/* Sets err (if not NULL) to status and the printf-formatted message; returns status, so
 * callers can write `return mmrt_error_set(err, MMRT_ERR_FORMAT, "%s: …", path);`.
 * Control bytes (below 0x20, and 0x7f) in the result become '?', so a name or value echoed
 * from a hostile file cannot break the message's one line; the same holds for
 * mmrt_error_prefix. */
mmrt_status mmrt_error_set(struct mmrt_error *err, mmrt_status status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Prepends "prefix: " to an existing message (adds context on the way up). Returns the
 * status already stored in err (or `status` when err is NULL). */
mmrt_status mmrt_error_prefix(struct mmrt_error *err, mmrt_status status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* The clang static analyzer reads one file at a time and does not step into variadic
 * calls, so it takes a refusal from mmrt_error_set (or a plugin's or parser's own variadic
 * refusal) for a possible success and reports the paths after it: most of what scan-build
 * found here was that. Under the analyzer only, such a call reads as returning the status it
 * is given; the real function still runs. Definitions name the function in parentheses so
 * the macro does not touch them. */
#ifdef __clang_analyzer__
#define MMRT_RETURNS_STATUS(call, st) ((void)(call), (st))
#define mmrt_error_set(err, st, ...)                                                           \
    MMRT_RETURNS_STATUS((mmrt_error_set)(err, st, __VA_ARGS__), (st))
#define mmrt_error_prefix(err, st, ...)                                                        \
    MMRT_RETURNS_STATUS((mmrt_error_prefix)(err, st, __VA_ARGS__), (st))
#endif

/* Copies message src into dst[size], cut at size − 1 bytes (size ≥ 1). */
void mmrt_error_copy(char *dst, size_t size, const char *src);

/* Clears err (status OK, empty message). */
void mmrt_error_clear(struct mmrt_error *err);

/* Name ("MMRT_ERR_FORMAT") and default message ("malformed input") of a status; never NULL. */
const char *mmrt_status_name(mmrt_status status);
const char *mmrt_status_message(mmrt_status status);

#endif /* MMRT_CORE_ERROR_H */
