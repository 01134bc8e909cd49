/*
 * mmrt/common.h — the few types shared by the embedding API (mmrt.h) and the plugin ABI
 * (plugin.h): status codes, element types, log levels.
 *
 * Everything here crosses the plugin boundary, so values are frozen: new statuses and dtypes
 * are appended, never renumbered.
 */
#ifndef MMRT_COMMON_H
#define MMRT_COMMON_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/*
 * Status codes. 0 is success, every failure is negative. The X-macro keeps the enum, the
 * names and the default messages in one list so they cannot drift (the libuv way).
 * The human detail of a failure (file, key, tensor, offset) lives in the owning context's
 * last-error string; the status only says which class of failure it was.
 */
#define MMRT_STATUS_LIST(X)                                                     \
    X(OK, 0, "success")                                                         \
    X(ERR_INVALID_ARG, -1, "invalid argument")                                  \
    X(ERR_NO_MEMORY, -2, "out of host memory")                                  \
    X(ERR_OUT_OF_POOL, -3, "out of device pool memory")                         \
    X(ERR_IO, -4, "input/output error")                                         \
    X(ERR_FORMAT, -5, "malformed input")                                        \
    X(ERR_UNSUPPORTED, -6, "unsupported")                                       \
    X(ERR_NOT_FOUND, -7, "not found")                                           \
    X(ERR_PLUGIN, -8, "plugin refused or failed to load")                       \
    X(ERR_NO_DEVICE, -9, "no device")                                           \
    X(ERR_DEVICE, -10, "device error")                                          \
    X(ERR_CONFIG, -11, "configuration error")                                   \
    X(ERR_LIMIT, -12, "limit exceeded")                                         \
    X(ERR_INTERNAL, -13, "internal error")                                      \
    X(ERR_CANCELLED, -14, "cancelled")

typedef enum mmrt_status {
#define MMRT_STATUS_ENUM_(name, value, msg) MMRT_##name = value,
    MMRT_STATUS_LIST(MMRT_STATUS_ENUM_)
#undef MMRT_STATUS_ENUM_
} mmrt_status;

/* The longest error detail the runtime writes, with its terminating NUL (mmrt_last_error,
 * mmrt_result.message): enough for a path, a key and a reason. */
#define MMRT_MESSAGE_MAX 1024

/*
 * Element types of tensors. The byte size of one element is mmrt_dtype_size(); all of them
 * are little-endian. Weights may be F32, F16 or BF16; activations are F32; ids and positions
 * are I32. I8 and U4 (ABI 1.3) hold quantized weights: codes that mean nothing without their
 * scales (MMRT_OP_MATMUL in plugin.h says where those are and how U4 packs two per byte).
 * F8E4M3 (ABI 1.6) holds a KV cache at one byte per element, without scales.
 */
enum mmrt_dtype {
    MMRT_DTYPE_F32 = 0,
    MMRT_DTYPE_F16 = 1,
    MMRT_DTYPE_BF16 = 2,
    MMRT_DTYPE_I32 = 3,
    MMRT_DTYPE_I8 = 4,
    MMRT_DTYPE_U4 = 5, /* one byte = two unsigned 4-bit codes (see plugin.h MATMUL) */
    /* ABI 1.6: OCP FP8 E4M3 ("e4m3fn": bias 7, no infinities, 0x7F/0xFF NaN, max ±448), a
     * KV-cache storage dtype only (plugin.h says which ops take it). */
    MMRT_DTYPE_F8E4M3 = 6,
    MMRT_DTYPE_COUNT
};

/* Severity of a log line sent through the host's log sink. */
enum mmrt_log_level {
    MMRT_LOG_DEBUG = 0,
    MMRT_LOG_INFO = 1,
    MMRT_LOG_WARN = 2,
    MMRT_LOG_ERROR = 3,
};

/* A plugin-specific key of a [device.NAME] section, passed through to the plugin unchanged. */
struct mmrt_option {
    const char *key;
    const char *value;
};

/* Size in bytes of one element of dtype, or 0 for an unknown dtype. */
static inline size_t mmrt_dtype_size(enum mmrt_dtype dtype)
{
    switch (dtype) {
    case MMRT_DTYPE_F32: return 4;
    case MMRT_DTYPE_F16: return 2;
    case MMRT_DTYPE_BF16: return 2;
    case MMRT_DTYPE_I32: return 4;
    case MMRT_DTYPE_I8: return 1;
    case MMRT_DTYPE_U4: return 1; /* an element is a byte holding two codes */
    case MMRT_DTYPE_F8E4M3: return 1;
    default: return 0;
    }
}

#ifdef __cplusplus
}
#endif

#endif /* MMRT_COMMON_H */
