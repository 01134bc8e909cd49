/*
 * tests/request_util.h — requests the tests build by hand.
 */
#ifndef MMRT_TEST_REQUEST_UTIL_H
#define MMRT_TEST_REQUEST_UTIL_H

#include <stdbool.h>
#include <stdint.h>

#include "mmrt/mmrt.h"

/* The file at path as a request's images (with .n_images = 1). A compound literal: it lives
 * until the end of the enclosing block, so assign it where the request is used. */
#define TEST_FILE(file) (&(struct mmrt_image_input){ .path = (file) })

/* The ids a request generated (the first 64), gathered by test_collect (an mmrt_token_fn with
 * user = the struct). */
struct tokens {
    int32_t ids[64];
    int n;
};

static inline bool test_collect(void *user, int32_t id, const char *text)
{
    struct tokens *t = user;
    (void)text;
    if (id >= 0 && t->n < 64)
        t->ids[t->n++] = id;
    return true;
}

#endif
