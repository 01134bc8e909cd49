/* tests/alloc_fail.c — see alloc_fail.h. Live pointers sit in an open-addressing set. */
#include "alloc_fail.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

void *__real_malloc(size_t n);
void *__real_calloc(size_t n, size_t size);
void *__real_realloc(void *p, size_t n);
void __real_free(void *p);
char *__real_strdup(const char *s);
char *__real_strndup(const char *s, size_t n);

#define SET_SIZE (1u << 18)
static void *live[SET_SIZE];
static long n_live;
static long countdown;
static int fired;

static size_t slot_of(void *p)
{
    uintptr_t h = (uintptr_t)p;
    h ^= h >> 17;
    h *= 0x9e3779b97f4a7c15ull;
    return (size_t)(h >> 20) & (SET_SIZE - 1);
}

static void track(void *p)
{
    if (!p)
        return;
    size_t i = slot_of(p);
    while (live[i] && live[i] != (void *)1)
        i = (i + 1) & (SET_SIZE - 1);
    live[i] = p;
    n_live++;
}

/* Returns 1 if p was tracked (and forgets it). Deleted slots become tombstones (1). */
static int untrack(void *p)
{
    if (!p)
        return 0;
    size_t i = slot_of(p);
    while (live[i]) {
        if (live[i] == p) {
            live[i] = (void *)1;
            n_live--;
            return 1;
        }
        i = (i + 1) & (SET_SIZE - 1);
    }
    return 0;
}

static int should_fail(void)
{
    if (countdown <= 0)
        return 0;
    if (--countdown == 0) {
        fired = 1;
        return 1;
    }
    return 0;
}

void alloc_fail_at(long n)
{
    countdown = n;
    fired = 0;
}

int alloc_fail_fired(void)
{
    return fired;
}

long alloc_live(void)
{
    return n_live;
}

void *__wrap_malloc(size_t n)
{
    if (should_fail())
        return NULL;
    void *p = __real_malloc(n);
    track(p);
    return p;
}

void *__wrap_calloc(size_t n, size_t size)
{
    if (should_fail())
        return NULL;
    void *p = __real_calloc(n, size);
    track(p);
    return p;
}

void *__wrap_realloc(void *p, size_t n)
{
    if (should_fail())
        return NULL;
    int was = untrack(p);
    void *q = __real_realloc(p, n);
    if (q)
        track(q);
    else if (was)
        track(p);
    return q;
}

void __wrap_free(void *p)
{
    untrack(p);
    __real_free(p);
}

char *__wrap_strdup(const char *s)
{
    if (should_fail())
        return NULL;
    char *p = __real_strdup(s);
    track(p);
    return p;
}

char *__wrap_strndup(const char *s, size_t n)
{
    if (should_fail())
        return NULL;
    char *p = __real_strndup(s, n);
    track(p);
    return p;
}
