/*
 * core/log.c — the log sink. The sink pointer is process-wide state owned by the plugin
 * registry's lock domain: plugins are shared by every runtime in the process, so their log
 * lines cannot be routed per runtime.
 */
#include "log.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <time.h>

#include "mmrt/mmrt.h"

static pthread_mutex_t sink_lock = PTHREAD_MUTEX_INITIALIZER;
static mmrt_log_fn sink_fn;
static void *sink_user;
static enum mmrt_log_level sink_min = MMRT_LOG_WARN;

static const char *level_name(enum mmrt_log_level level)
{
    switch (level) {
    case MMRT_LOG_DEBUG: return "debug";
    case MMRT_LOG_INFO: return "info";
    case MMRT_LOG_WARN: return "warning";
    case MMRT_LOG_ERROR: return "error";
    }
    return "?";
}

void mmrt_set_log_sink(mmrt_log_fn fn, void *user, enum mmrt_log_level min_level)
{
    pthread_mutex_lock(&sink_lock);
    sink_fn = fn;
    sink_user = user;
    sink_min = min_level;
    pthread_mutex_unlock(&sink_lock);
}

void mmrt_log_line(enum mmrt_log_level level, const char *who, const char *message)
{
    pthread_mutex_lock(&sink_lock);
    if (level >= sink_min) {
        if (sink_fn)
            sink_fn(sink_user, level, who, message);
        else
            fprintf(stderr, "mmrt: %s: %s: %s\n", level_name(level), who, message);
    }
    pthread_mutex_unlock(&sink_lock);
}

void mmrt_log(enum mmrt_log_level level, const char *who, const char *fmt, ...)
{
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    mmrt_log_line(level, who, line);
}

double mmrt_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}
