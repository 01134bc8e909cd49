/* core/text.c — see text.h. */
#include "text.h"

#include <stdlib.h>
#include <string.h>

void mmrt_text_addn(struct mmrt_text *t, const char *s, size_t n)
{
    if (t->failed)
        return;
    if (t->len + n + 1 > t->cap) {
        size_t cap = (t->len + n + 1) * 2;
        char *g = realloc(t->s, cap);
        if (!g) {
            t->failed = true;
            return;
        }
        t->s = g;
        t->cap = cap;
    }
    memcpy(t->s + t->len, s, n);
    t->len += n;
    t->s[t->len] = '\0';
}

void mmrt_text_add(struct mmrt_text *t, const char *s)
{
    mmrt_text_addn(t, s, strlen(s));
}
