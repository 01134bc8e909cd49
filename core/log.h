/*
 * core/log.h — the library's only way to say something. Lines go to a replaceable sink
 * (mmrt_set_log_sink() in mmrt.h); the default sink writes WARN and above to stderr. The
 * library never prints otherwise. Plugins reach the same sink through struct mmrt_host.
 */
#ifndef MMRT_CORE_LOG_H
#define MMRT_CORE_LOG_H

#include "mmrt/common.h"

/* Sends one formatted line (no trailing newline) from `who` ("core", a plugin name) to the
 * sink. Thread-safe. */
void mmrt_log(enum mmrt_log_level level, const char *who, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Raw form used by the plugin host table. */
void mmrt_log_line(enum mmrt_log_level level, const char *who, const char *message);

/* Monotonic milliseconds, for the per-stage timings of mmrt_result. */
double mmrt_now_ms(void);

#endif
