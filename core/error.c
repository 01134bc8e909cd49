/* core/error.c — status names and the error-detail helpers of error.h. */
#include "error.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

/* Messages echo names and values read from hostile files (a model_type, a device name, a
 * JSON key); a control byte among them would break the one-line promise of error.h or drive
 * a terminal. They become '?' (as json.c and safetensors.c already did for their own text). */
static void flatten(char *s)
{
    for (; *s; s++)
        if ((unsigned char)*s < 0x20 || *s == 0x7f)
            *s = '?';
}

mmrt_status(mmrt_error_set)(struct mmrt_error *err, mmrt_status status, const char *fmt, ...)
{
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
        flatten(err->msg);
        err->status = status;
    }
    return status;
}

mmrt_status(mmrt_error_prefix)(struct mmrt_error *err, mmrt_status status, const char *fmt, ...)
{
    if (!err)
        return status;
    char prefix[MMRT_ERROR_MAX];
    va_list ap;
    va_start(ap, fmt);
    /* On an encoding error the buffer's bytes are unspecified: start from nothing. */
    if (vsnprintf(prefix, sizeof prefix - 2, fmt, ap) < 0)
        prefix[0] = '\0';
    va_end(ap);
    size_t plen = strnlen(prefix, sizeof prefix - 3);
    memcpy(prefix + plen, ": ", 3);
    plen += 2;
    /* Shift the old message right to make room; the tail is cut if the line gets too long. */
    size_t old_len = strnlen(err->msg, sizeof err->msg - 1);
    size_t keep = old_len;
    if (plen + keep > sizeof err->msg - 1)
        keep = plen < sizeof err->msg - 1 ? sizeof err->msg - 1 - plen : 0;
    memmove(err->msg + plen, err->msg, keep);
    memcpy(err->msg, prefix, plen < sizeof err->msg - 1 ? plen : sizeof err->msg - 1);
    err->msg[plen + keep < sizeof err->msg ? plen + keep : sizeof err->msg - 1] = '\0';
    flatten(err->msg);
    if (err->status == MMRT_OK)
        err->status = status;
    return err->status;
}

void mmrt_error_copy(char *dst, size_t size, const char *src)
{
    size_t n = strnlen(src, size - 1);
    memcpy(dst, src, n);
    dst[n] = '\0';
}

void mmrt_error_clear(struct mmrt_error *err)
{
    if (err) {
        err->status = MMRT_OK;
        err->msg[0] = '\0';
    }
}

const char *mmrt_status_name(mmrt_status status)
{
    switch (status) {
#define MMRT_STATUS_NAME_(name, value, msg) case MMRT_##name: return "MMRT_" #name;
        MMRT_STATUS_LIST(MMRT_STATUS_NAME_)
#undef MMRT_STATUS_NAME_
    }
    return "MMRT_UNKNOWN_STATUS";
}

const char *mmrt_status_message(mmrt_status status)
{
    switch (status) {
#define MMRT_STATUS_MSG_(name, value, msg) case MMRT_##name: return msg;
        MMRT_STATUS_LIST(MMRT_STATUS_MSG_)
#undef MMRT_STATUS_MSG_
    }
    return "unknown status";
}
