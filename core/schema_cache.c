/* core/schema_cache.c — compiled JSON schemas kept by their text (schema_cache.h). */
#include "schema_cache.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

struct entry {
    uint64_t hash;
    bool any_object;             /* text NULL: mmrt_json_schema_any_object */
    char *text;
    size_t len;
    size_t bytes;                /* text and compiled tables: what the byte bound counts */
    struct mmrt_json_schema *s;  /* the cache's hold */
    uint64_t used;               /* LRU tick */
};

struct mmrt_schema_cache {
    pthread_mutex_t lock;
    struct entry *e;             /* [max_entries], the first n in use */
    int n, max_entries;
    size_t bytes, max_bytes;
    uint64_t tick, lookups, compiles;
};

/* FNV-1a: a filter before the full compare, not a name. */
static uint64_t hash_text(const char *text, size_t len)
{
    uint64_t h = 0xcbf29ce484222325u;
    for (size_t i = 0; i < len; i++)
        h = (h ^ (uint8_t)text[i]) * 0x100000001b3u;
    return h;
}

mmrt_status mmrt_schema_cache_create(int max_entries, size_t max_bytes,
                                     struct mmrt_schema_cache **out, struct mmrt_error *err)
{
    *out = NULL;
    if (max_entries < 0)
        return mmrt_error_set(err, MMRT_ERR_INVALID_ARG, "schema cache: max_entries %d < 0",
                              max_entries);
    struct mmrt_schema_cache *c = calloc(1, sizeof *c);
    if (c) {
        c->max_entries = max_entries ? max_entries : MMRT_SCHEMA_CACHE_ENTRIES;
        c->max_bytes = max_bytes ? max_bytes : MMRT_SCHEMA_CACHE_BYTES;
        c->e = calloc((size_t)c->max_entries, sizeof *c->e);
    }
    if (!c || !c->e) {
        free(c);
        return mmrt_error_set(err, MMRT_ERR_NO_MEMORY, "schema cache: out of memory");
    }
    pthread_mutex_init(&c->lock, NULL);
    *out = c;
    return MMRT_OK;
}

static void drop(struct mmrt_schema_cache *c, int i)
{
    mmrt_json_schema_free(c->e[i].s);
    free(c->e[i].text);
    c->bytes -= c->e[i].bytes;
    c->e[i] = c->e[--c->n];
}

void mmrt_schema_cache_destroy(struct mmrt_schema_cache *c)
{
    if (!c)
        return;
    while (c->n > 0)
        drop(c, c->n - 1);
    free(c->e);
    pthread_mutex_destroy(&c->lock);
    free(c);
}

/* The entry of (text, len) or -1; the caller holds the lock. */
static int find(const struct mmrt_schema_cache *c, uint64_t h, const char *text, size_t len)
{
    for (int i = 0; i < c->n; i++) {
        const struct entry *x = &c->e[i];
        if (x->hash == h && x->any_object == !text && x->len == len &&
            (!text || memcmp(x->text, text, len) == 0))
            return i;
    }
    return -1;
}

/* Keeps s under (text, len) unless it alone is past the byte bound, making room by LRU; the
 * caller holds the lock. Out of memory for the copy of the text only means not kept. */
static void insert(struct mmrt_schema_cache *c, uint64_t h, const char *text, size_t len,
                   struct mmrt_json_schema *s)
{
    const size_t bytes = len + mmrt_json_schema_bytes(s);
    if (bytes > c->max_bytes)
        return;
    char *copy = NULL;
    if (text && !(copy = malloc(len ? len : 1)))
        return;
    if (text)
        memcpy(copy, text, len);
    while (c->n > 0 && (c->n == c->max_entries || c->bytes + bytes > c->max_bytes)) {
        int lru = 0;
        for (int i = 1; i < c->n; i++)
            if (c->e[i].used < c->e[lru].used)
                lru = i;
        drop(c, lru);
    }
    c->e[c->n++] = (struct entry){ .hash = h, .any_object = !text, .text = copy, .len = len,
                                   .bytes = bytes, .s = mmrt_json_schema_hold(s),
                                   .used = ++c->tick };
    c->bytes += bytes;
}

mmrt_status mmrt_schema_cache_get(struct mmrt_schema_cache *c, const char *text, size_t len,
                                  struct mmrt_json_schema **out, struct mmrt_error *err)
{
    *out = NULL;
    if (!text)
        len = 0;
    const uint64_t h = text ? hash_text(text, len) : 0;
    pthread_mutex_lock(&c->lock);
    c->lookups++;
    int i = find(c, h, text, len);
    if (i >= 0) {
        c->e[i].used = ++c->tick;
        *out = mmrt_json_schema_hold(c->e[i].s);
    } else {
        c->compiles++;
    }
    pthread_mutex_unlock(&c->lock);
    if (*out)
        return MMRT_OK;
    struct mmrt_json_schema *s = NULL;
    mmrt_status st = text ? mmrt_json_schema_parse(text, len, &s, err)
                          : mmrt_json_schema_any_object(&s, err);
    if (st != MMRT_OK)
        return st;
    pthread_mutex_lock(&c->lock);
    /* Another thread may have compiled the same text meanwhile: keep one. */
    i = find(c, h, text, len);
    if (i >= 0) {
        c->e[i].used = ++c->tick;
        struct mmrt_json_schema *kept = mmrt_json_schema_hold(c->e[i].s);
        pthread_mutex_unlock(&c->lock);
        mmrt_json_schema_free(s);
        *out = kept;
        return MMRT_OK;
    }
    insert(c, h, text, len, s);
    pthread_mutex_unlock(&c->lock);
    *out = s;
    return MMRT_OK;
}

void mmrt_schema_cache_get_stats(struct mmrt_schema_cache *c,
                                 struct mmrt_schema_cache_stats *out)
{
    pthread_mutex_lock(&c->lock);
    *out = (struct mmrt_schema_cache_stats){ .lookups = c->lookups, .compiles = c->compiles,
                                             .entries = (uint64_t)c->n, .bytes = c->bytes };
    pthread_mutex_unlock(&c->lock);
}
