/*
 * core/text.h — a growing NUL-terminated string, for the chat templates that models render.
 *
 * Appending never fails loudly: an allocation failure sets `failed` and later appends do
 * nothing, so a template is written straight through and checked once at the end.
 */
#ifndef MMRT_CORE_TEXT_H
#define MMRT_CORE_TEXT_H

#include <stdbool.h>
#include <stddef.h>

struct mmrt_text {
    char *s;        /* NUL-terminated once anything was added; free() it */
    size_t len, cap;
    bool failed;
};

void mmrt_text_add(struct mmrt_text *t, const char *s);
void mmrt_text_addn(struct mmrt_text *t, const char *s, size_t n);

#endif
