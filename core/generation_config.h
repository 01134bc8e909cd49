/*
 * core/generation_config.h — the sampling defaults in a checkpoint's generation_config.json
 * (mmrt.h struct mmrt_generation_defaults says what they mean).
 */
#ifndef MMRT_CORE_GENERATION_CONFIG_H
#define MMRT_CORE_GENERATION_CONFIG_H

#include "error.h"
#include "mmrt/mmrt.h"

/* Reads dir/generation_config.json into *out (all has_X 0 when the file is absent). A value
 * of the wrong type or out of range is MMRT_ERR_FORMAT naming the file and the key; *out is
 * written only on success. */
mmrt_status mmrt_generation_config_read(const char *dir, struct mmrt_generation_defaults *out,
                                        struct mmrt_error *err);

#endif
