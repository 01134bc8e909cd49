/*
 * tests/request_util.h — requests the tests build by hand.
 */
#ifndef MMRT_TEST_REQUEST_UTIL_H
#define MMRT_TEST_REQUEST_UTIL_H

#include "mmrt/mmrt.h"

/* The file at path as a request's images (with .n_images = 1). A compound literal: it lives
 * until the end of the enclosing block, so assign it where the request is used. */
#define TEST_FILE(file) (&(struct mmrt_image_input){ .path = (file) })

#endif
