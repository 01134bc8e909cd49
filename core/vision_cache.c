/*
 * core/vision_cache.c — the vision-feature cache (vision_cache.h): image keys (SHA-256 via
 * GNU nettle), an LRU store of per-image vision outputs bounded by entries and bytes, and the
 * front that runs a request's vision stage through it.
 *
 * The store is a chained hash table plus a recency list, both under one mutex; entries are
 * immutable and reference-counted so that copying features out happens without the mutex
 * (vision_cache.h says why). The front's rule is that the cache never changes what a request
 * gets: a hit hands out the bits a miss computed, pieces are put together in the request's
 * order in the model's own layout, and whatever leaves the plain path (an unreadable file, a
 * failed encode, images over a budget together) runs the model on the whole request instead.
 */
#include "vision_cache.h"

#include <errno.h>
#include <limits.h>
#include <nettle/sha2.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "formats/file.h"
#include "log.h"

_Static_assert(SHA256_DIGEST_SIZE == MMRT_VISION_KEY_BYTES, "a key is one SHA-256 digest");

/* ---- hashing ---- */

void mmrt_sha256(const void *data, size_t size, uint8_t out[MMRT_VISION_KEY_BYTES])
{
    struct sha256_ctx h;
    sha256_init(&h);
    sha256_update(&h, size, data);
    sha256_digest(&h, SHA256_DIGEST_SIZE, out);
}

/* One field of the settings: its tag (with its NUL), its length (8 bytes, little endian),
 * its bytes. */
static void put(struct sha256_ctx *h, const char *tag, const void *v, size_t n)
{
    uint8_t le[8];
    for (int k = 0; k < 8; k++)
        le[k] = (uint8_t)((uint64_t)n >> (8 * k));
    sha256_update(h, strlen(tag) + 1, (const uint8_t *)tag);
    sha256_update(h, sizeof le, le);
    if (n)
        sha256_update(h, n, v);
}

static void put_str(struct sha256_ctx *h, const char *tag, const char *s)
{
    put(h, tag, s ? s : "", s ? strlen(s) : 0);
}

static void put_int(struct sha256_ctx *h, const char *tag, int64_t x)
{
    char buf[32];
    snprintf(buf, sizeof buf, "%lld", (long long)x);
    put_str(h, tag, buf);
}

/* dir/name's SHA-256 under "file:name", or "nofile:name" when there is nothing there. */
static mmrt_status put_file(struct sha256_ctx *h, const char *dir, const char *name,
                            bool required, struct mmrt_error *err)
{
    char path[4096], tag[64];
    if (snprintf(path, sizeof path, "%s/%s", dir, name) >= (int)sizeof path)
        return mmrt_error_set(err, MMRT_ERR_INVALID_ARG, "vision cache: %s/%s: path too long",
                              dir, name);
    if (!required && !mmrt_file_exists(path)) {
        snprintf(tag, sizeof tag, "nofile:%s", name);
        put(h, tag, NULL, 0);
        return MMRT_OK;
    }
    char *data = NULL;
    size_t len = 0;
    mmrt_status st = mmrt_file_read(path, 16u << 20, 0, " for a model configuration file",
                                    &data, &len, err);
    if (st != MMRT_OK)
        return mmrt_error_prefix(err, st, "vision cache settings");
    uint8_t d[MMRT_VISION_KEY_BYTES];
    mmrt_sha256(data, len, d);
    free(data);
    snprintf(tag, sizeof tag, "file:%s", name);
    put(h, tag, d, sizeof d);
    return MMRT_OK;
}

static int option_cmp(const void *a, const void *b)
{
    const struct mmrt_option *x = *(const struct mmrt_option *const *)a;
    const struct mmrt_option *y = *(const struct mmrt_option *const *)b;
    int c = strcmp(x->key ? x->key : "", y->key ? y->key : "");
    return c ? c : strcmp(x->value ? x->value : "", y->value ? y->value : "");
}

mmrt_status mmrt_vision_settings_digest(const struct mmrt_vision_settings *s,
                                        uint8_t out[MMRT_VISION_KEY_BYTES],
                                        struct mmrt_error *err)
{
    if (!s || !s->model_dir || !s->model_type || s->n_options < 0 ||
        (s->n_options > 0 && !s->options))
        return mmrt_error_set(err, MMRT_ERR_INVALID_ARG,
                              "vision cache settings: model directory and type are required");
    char *dir = realpath(s->model_dir, NULL);
    if (!dir)
        return mmrt_error_set(err, MMRT_ERR_IO, "vision cache settings: realpath(%s): %s",
                              s->model_dir, strerror(errno));
    const struct mmrt_option **opts = calloc((size_t)s->n_options + 1, sizeof *opts);
    if (!opts) {
        free(dir);
        return mmrt_error_set(err, MMRT_ERR_NO_MEMORY, "vision cache settings: out of memory");
    }
    struct sha256_ctx h;
    sha256_init(&h);
    put_str(&h, "mmrt vision cache", "1");
    put_str(&h, "mmrt version", mmrt_version());
    put_str(&h, "model dir", dir);
    put_str(&h, "model type", s->model_type);
    mmrt_status st = put_file(&h, dir, "config.json", true, err);
    if (st == MMRT_OK)
        st = put_file(&h, dir, "preprocessor_config.json", false, err);
    if (st == MMRT_OK)
        st = put_file(&h, dir, "processor_config.json", false, err);
    put_int(&h, "max_image_tokens", s->max_image_tokens);
    put_int(&h, "oversize_images", s->oversize_images);
    put_int(&h, "exif_orientation", s->exif_orientation);
    put_str(&h, "plugin", s->plugin);
    put_str(&h, "plugin version", s->plugin_version);
    put_int(&h, "device index", s->device_index);
    /* Sorted, so the same options in another order are the same settings. */
    for (int i = 0; i < s->n_options; i++)
        opts[i] = &s->options[i];
    qsort(opts, (size_t)s->n_options, sizeof *opts, option_cmp);
    put_int(&h, "options", s->n_options);
    for (int i = 0; i < s->n_options; i++) {
        put_str(&h, "option key", opts[i]->key);
        put_str(&h, "option value", opts[i]->value);
    }
    free(opts);
    free(dir);
    if (st != MMRT_OK)
        return st;
    sha256_digest(&h, SHA256_DIGEST_SIZE, out);
    return MMRT_OK;
}

void mmrt_vision_key_of(const uint8_t settings[MMRT_VISION_KEY_BYTES], const void *data,
                        size_t size, struct mmrt_vision_key *out)
{
    struct sha256_ctx h;
    sha256_init(&h);
    sha256_update(&h, MMRT_VISION_KEY_BYTES, settings);
    if (size)
        sha256_update(&h, size, data);
    sha256_digest(&h, SHA256_DIGEST_SIZE, out->bytes);
    out->set = true;
}

void mmrt_vision_key_hex(const struct mmrt_vision_key *key, char out[MMRT_VISION_KEY_HEX])
{
    static const char hex[] = "0123456789abcdef";
    if (!key || !key->set) {
        out[0] = '\0';
        return;
    }
    for (int i = 0; i < MMRT_VISION_KEY_BYTES; i++) {
        out[2 * i] = hex[key->bytes[i] >> 4];
        out[2 * i + 1] = hex[key->bytes[i] & 15];
    }
    out[2 * MMRT_VISION_KEY_BYTES] = '\0';
}

/* ---- the store ---- */

int64_t mmrt_vision_piece_rows(const struct mmrt_vision_piece *p)
{
    return p->per_image ? p->n_tokens : (int64_t)p->n_parts * p->n_tokens;
}

struct entry {
    struct mmrt_vision_piece piece; /* first: get() hands out &e->piece */
    uint8_t key[MMRT_VISION_KEY_BYTES];
    uint64_t nbytes;                /* of the features */
    int refs;                       /* references from get() not yet released */
    bool linked;                    /* in the table and the list */
    struct entry *chain;            /* next in the bucket */
    struct entry *prev, *next;      /* recency list: prev is more recent */
    float features[];               /* [n_tokens][dim] */
};

struct mmrt_vision_cache {
    pthread_mutex_t lock;
    struct entry **buckets;         /* [n_buckets], a power of two */
    size_t n_buckets;
    struct entry *head, *tail;      /* most and least recently used */
    uint64_t max_entries, max_bytes;
    uint64_t entries, bytes, queries, hits, evictions;
};

static size_t bucket_of(const uint8_t *key, size_t n_buckets)
{
    uint64_t x;
    memcpy(&x, key, sizeof x);
    return (size_t)(x & (n_buckets - 1));
}

static struct entry *find(const struct mmrt_vision_cache *c, const uint8_t *key)
{
    struct entry *e = c->buckets[bucket_of(key, c->n_buckets)];
    while (e && memcmp(e->key, key, MMRT_VISION_KEY_BYTES) != 0)
        e = e->chain;
    return e;
}

static void list_remove(struct mmrt_vision_cache *c, struct entry *e)
{
    if (e->prev)
        e->prev->next = e->next;
    else
        c->head = e->next;
    if (e->next)
        e->next->prev = e->prev;
    else
        c->tail = e->prev;
    e->prev = e->next = NULL;
}

static void list_push_front(struct mmrt_vision_cache *c, struct entry *e)
{
    e->prev = NULL;
    e->next = c->head;
    if (c->head)
        c->head->prev = e;
    c->head = e;
    if (!c->tail)
        c->tail = e;
}

/* Takes e out of the table and the list; freed now, or by its last release. */
static void unlink_entry(struct mmrt_vision_cache *c, struct entry *e)
{
    struct entry **p = &c->buckets[bucket_of(e->key, c->n_buckets)];
    while (*p != e)
        p = &(*p)->chain;
    *p = e->chain;
    list_remove(c, e);
    e->linked = false;
    c->entries--;
    c->bytes -= e->nbytes;
    if (e->refs == 0)
        free(e);
}

/* Doubles the table when it holds more entries than buckets; on no memory the chains just
 * grow longer. */
static void maybe_grow(struct mmrt_vision_cache *c)
{
    if (c->entries <= c->n_buckets || c->n_buckets > SIZE_MAX / 2 / sizeof *c->buckets)
        return;
    const size_t n = c->n_buckets * 2;
    struct entry **b = calloc(n, sizeof *b);
    if (!b)
        return;
    for (size_t i = 0; i < c->n_buckets; i++)
        for (struct entry *e = c->buckets[i], *next; e; e = next) {
            next = e->chain;
            const size_t k = bucket_of(e->key, n);
            e->chain = b[k];
            b[k] = e;
        }
    free(c->buckets);
    c->buckets = b;
    c->n_buckets = n;
}

mmrt_status mmrt_vision_cache_create(uint64_t max_entries, uint64_t max_bytes,
                                     struct mmrt_vision_cache **out, struct mmrt_error *err)
{
    if (!out || max_entries < 1 || max_bytes < 1)
        return mmrt_error_set(err, MMRT_ERR_INVALID_ARG, "vision cache: bounds of %llu "
                              "entries and %llu bytes (each must be at least 1)",
                              (unsigned long long)max_entries, (unsigned long long)max_bytes);
    struct mmrt_vision_cache *c = calloc(1, sizeof *c);
    if (c)
        c->buckets = calloc(16, sizeof *c->buckets);
    if (!c || !c->buckets) {
        free(c);
        return mmrt_error_set(err, MMRT_ERR_NO_MEMORY, "vision cache: out of memory");
    }
    pthread_mutex_init(&c->lock, NULL);
    c->n_buckets = 16;
    c->max_entries = max_entries;
    c->max_bytes = max_bytes;
    *out = c;
    return MMRT_OK;
}

void mmrt_vision_cache_destroy(struct mmrt_vision_cache *c)
{
    if (!c)
        return;
    for (struct entry *e = c->head, *next; e; e = next) {
        next = e->next;
        free(e);
    }
    free(c->buckets);
    pthread_mutex_destroy(&c->lock);
    free(c);
}

const struct mmrt_vision_piece *mmrt_vision_cache_get(struct mmrt_vision_cache *c,
                                                      const uint8_t key[MMRT_VISION_KEY_BYTES])
{
    pthread_mutex_lock(&c->lock);
    c->queries++;
    struct entry *e = find(c, key);
    if (e) {
        c->hits++;
        list_remove(c, e);
        list_push_front(c, e);
        e->refs++;
    }
    pthread_mutex_unlock(&c->lock);
    return e ? &e->piece : NULL;
}

void mmrt_vision_cache_release(struct mmrt_vision_cache *c, const struct mmrt_vision_piece *p)
{
    if (!p)
        return;
    struct entry *e = (struct entry *)p; /* piece is the first member */
    pthread_mutex_lock(&c->lock);
    const bool last = --e->refs == 0 && !e->linked;
    pthread_mutex_unlock(&c->lock);
    if (last)
        free(e);
}

mmrt_status mmrt_vision_cache_insert(struct mmrt_vision_cache *c,
                                     const uint8_t key[MMRT_VISION_KEY_BYTES],
                                     const struct mmrt_vision_piece *p, struct mmrt_error *err)
{
    if (!p || p->n_tokens < 0 || p->dim < 0 || p->n_parts < 1 ||
        (p->n_parts > 1 && (p->per_image || p->has_grid)) ||
        (p->n_tokens * p->dim > 0 && !p->features))
        return mmrt_error_set(err, MMRT_ERR_INVALID_ARG, "vision cache: a piece of %d × %lld × "
                              "%lld features", p ? p->n_parts : 0, p ? (long long)p->n_tokens : 0LL,
                              p ? (long long)p->dim : 0LL);
    uint64_t rows, n_floats, nbytes;
    if (__builtin_mul_overflow((uint64_t)p->n_parts, (uint64_t)p->n_tokens, &rows) ||
        __builtin_mul_overflow(p->per_image ? (uint64_t)p->n_tokens : rows, (uint64_t)p->dim,
                               &n_floats) ||
        __builtin_mul_overflow(n_floats, (uint64_t)sizeof(float), &nbytes) ||
        nbytes > SIZE_MAX - sizeof(struct entry))
        return mmrt_error_set(err, MMRT_ERR_INVALID_ARG, "vision cache: a piece of %lld × %lld "
                              "features is too large", (long long)p->n_tokens, (long long)p->dim);
    if (nbytes > c->max_bytes) /* fixed at creation: read without the lock */
        return MMRT_OK;
    /* The copy is made before taking the lock: megabytes need no mutex. */
    struct entry *e = malloc(sizeof *e + (size_t)nbytes);
    if (!e)
        return mmrt_error_set(err, MMRT_ERR_NO_MEMORY, "vision cache: out of memory for %llu "
                              "bytes of features", (unsigned long long)nbytes);
    memset(e, 0, sizeof *e);
    if (nbytes)
        memcpy(e->features, p->features, (size_t)nbytes);
    e->piece = *p;
    e->piece.features = e->features;
    memcpy(e->key, key, MMRT_VISION_KEY_BYTES);
    e->nbytes = nbytes;
    pthread_mutex_lock(&c->lock);
    struct entry *held = find(c, key);
    if (held) {
        list_remove(c, held);
        list_push_front(c, held);
        pthread_mutex_unlock(&c->lock);
        free(e);
        return MMRT_OK;
    }
    const size_t k = bucket_of(key, c->n_buckets);
    e->chain = c->buckets[k];
    c->buckets[k] = e;
    e->linked = true;
    list_push_front(c, e);
    c->entries++;
    c->bytes += nbytes;
    /* e is the head and fits alone, so the tail is never e while a bound is exceeded. */
    while (c->entries > c->max_entries || c->bytes > c->max_bytes) {
        unlink_entry(c, c->tail);
        c->evictions++;
    }
    maybe_grow(c);
    pthread_mutex_unlock(&c->lock);
    return MMRT_OK;
}

bool mmrt_vision_cache_contains(struct mmrt_vision_cache *c,
                                const uint8_t key[MMRT_VISION_KEY_BYTES])
{
    pthread_mutex_lock(&c->lock);
    const bool found = find(c, key) != NULL;
    pthread_mutex_unlock(&c->lock);
    return found;
}

void mmrt_vision_cache_stats(struct mmrt_vision_cache *c, struct mmrt_vision_cache_stats *out)
{
    memset(out, 0, sizeof *out);
    if (!c)
        return;
    pthread_mutex_lock(&c->lock);
    *out = (struct mmrt_vision_cache_stats){
        .queries = c->queries, .hits = c->hits, .evictions = c->evictions,
        .entries = c->entries, .bytes = c->bytes, .max_entries = c->max_entries,
        .max_bytes = c->max_bytes,
    };
    pthread_mutex_unlock(&c->lock);
}

/* ---- the front ---- */

bool mmrt_vision_front_applies(const struct mmrt_vision_front *f,
                               const struct mmrt_request *req)
{
    return f && f->cache && req->n_images > 0 &&
           !(f->oversize_images == MMRT_OVERSIZE_DOWNSCALE && req->n_images > 1);
}

/* What one request's pass through the front holds, released by work_free. */
struct work {
    int n;
    struct mmrt_vision_key *keys;          /* the caller's, or own_keys */
    struct mmrt_vision_key *own_keys;
    const struct mmrt_vision_piece **hits; /* [n], NULL where the cache missed */
    struct mmrt_vision_piece *all;         /* [n] every image's piece, hit or fresh */
    char **bytes;                          /* [n] a path image's file, read for its key */
    size_t *sizes;
    struct mmrt_image_input *sub_images;   /* the missing images */
    struct mmrt_message *sub_messages;
    struct mmrt_request sub;               /* the request of the missing images alone */
    struct mmrt_vision_output fresh;       /* encode() of the missing images */
    enum {
        W_MODEL,   /* the model encodes the request as given: no cache, or off the path */
        W_MISSING, /* the model encodes sub, the images the cache lacks */
        W_HITS,    /* every image hit */
    } mode;
};

static void work_free(const struct mmrt_vision_front *f, struct work *w)
{
    for (int i = 0; i < w->n; i++) {
        if (w->hits)
            mmrt_vision_cache_release(f->cache, w->hits[i]);
        if (w->bytes)
            free(w->bytes[i]);
    }
    free(w->own_keys);
    free(w->hits);
    free(w->all);
    free(w->bytes);
    free(w->sizes);
    free(w->sub_images);
    free(w->sub_messages);
    mmrt_vision_output_free(&w->fresh);
}

/* Keys, then lookups. False when the request must take the whole-request path. */
static bool look_up(const struct mmrt_vision_front *f, const struct mmrt_request *req,
                    struct work *w)
{
    for (int i = 0; i < w->n; i++) {
        const struct mmrt_image_input *im = &req->images[i];
        if (im->data) {
            if (!w->keys[i].set)
                mmrt_vision_key_of(f->settings, im->data, im->size, &w->keys[i]);
            continue;
        }
        /* A path image is read here, as the decoder would read it, and handed to encode()
         * as these bytes: the features stored under the key are those of the bytes hashed. */
        struct mmrt_error e = { 0 };
        if (mmrt_file_read(im->path, f->max_image_bytes, 0, " (max_input_bytes)", &w->bytes[i],
                           &w->sizes[i], &e) != MMRT_OK)
            return false;
        mmrt_vision_key_of(f->settings, w->bytes[i], w->sizes[i], &w->keys[i]);
    }
    for (int i = 0; i < w->n; i++)
        w->hits[i] = mmrt_vision_cache_get(f->cache, w->keys[i].bytes);
    return true;
}

/* w->sub: a copy of req holding only the images that missed. False: take the whole path. */
static bool missing_request(const struct mmrt_request *req, struct work *w, int n_miss)
{
    w->sub_images = calloc((size_t)n_miss, sizeof *w->sub_images);
    w->sub_messages = calloc((size_t)req->n_messages + 1, sizeof *w->sub_messages);
    if (!w->sub_images || !w->sub_messages)
        return false;
    struct mmrt_request sub = *req;
    int j = 0, base = 0;
    for (int m = 0; m < req->n_messages; m++) {
        w->sub_messages[m] = req->messages[m];
        int kept = 0;
        for (int i = base; i < base + req->messages[m].n_images && i < w->n; i++) {
            if (w->hits[i])
                continue;
            w->sub_images[j] = req->images[i];
            if (w->bytes[i]) { /* path kept: messages name the file */
                w->sub_images[j].data = w->bytes[i];
                w->sub_images[j].size = w->sizes[i];
            }
            j++;
            kept++;
        }
        base += req->messages[m].n_images;
        w->sub_messages[m].n_images = kept;
    }
    if (j != n_miss)
        return false; /* the messages do not carry every image: not a normalized request */
    sub.images = w->sub_images;
    sub.n_images = n_miss;
    sub.messages = w->sub_messages;
    w->sub = sub;
    return true;
}

/* The pieces of the missing images, from w->fresh (the model's output for w->sub), stored.
 * False: take the whole path. */
static bool store_fresh(const struct mmrt_vision_front *f, struct work *w, int n_miss)
{
    const struct mmrt_vision_output *v = &w->fresh;
    if (v->dim < 1 || !v->features || v->n_images < 1)
        return false;
    /* One output entry per image; or one image whose output has several uniform entries
     * (Fuyu's patch rows), kept whole. */
    const bool whole = v->n_images != n_miss;
    if (whole && (n_miss != 1 || v->tokens_per_image || v->grid_thw))
        return false;
    int64_t row = 0;
    int j = 0;
    for (int i = 0; i < w->n; i++) {
        if (w->hits[i])
            continue;
        struct mmrt_vision_piece *p = &w->all[i];
        *p = (struct mmrt_vision_piece){
            .n_parts = whole ? v->n_images : 1,
            .n_tokens = whole ? v->n_tokens : mmrt_vision_output_tokens(v, j), .dim = v->dim,
            .features = v->features + row * v->dim, .per_image = v->tokens_per_image != NULL,
            .has_grid = v->grid_thw != NULL,
        };
        if (p->has_grid)
            memcpy(p->grid_thw, v->grid_thw + 3 * j, sizeof p->grid_thw);
        row += mmrt_vision_piece_rows(p);
        j++;
    }
    if (row != mmrt_vision_output_rows(v))
        return false;
    for (int i = 0; i < w->n; i++) {
        struct mmrt_error e2 = { 0 };
        if (!w->hits[i] && mmrt_vision_cache_insert(f->cache, w->keys[i].bytes, &w->all[i],
                                                    &e2) != MMRT_OK)
            mmrt_log(MMRT_LOG_WARN, "core", "vision cache: image %d not stored: %s", i + 1,
                     e2.msg);
    }
    return true;
}

/* The request's output from every image's piece. False: take the whole path. */
static bool assemble(const struct mmrt_vision_front *f, struct work *w,
                     struct mmrt_vision_output *out)
{
    const struct mmrt_vision_piece *p0 = &w->all[0];
    int64_t rows = 0;
    for (int i = 0; i < w->n; i++) {
        const struct mmrt_vision_piece *p = &w->all[i];
        /* One runtime's outputs share a layout; uniform needs one token count, and an image
         * of several parts stands alone. */
        if (p->dim != p0->dim || p->per_image != p0->per_image || p->has_grid != p0->has_grid ||
            (!p->per_image && p->n_tokens != p0->n_tokens) || (w->n > 1 && p->n_parts != 1))
            return false;
        rows += mmrt_vision_piece_rows(p);
    }
    /* Each image fitted the budget and the context alone when it was stored; several
     * together are checked here, and the model refuses them in its own words. */
    if (w->n > 1 && ((f->max_image_tokens > 0 && rows > f->max_image_tokens) ||
                     (f->max_positions > 0 && rows > f->max_positions - 1)))
        return false;
    float *features = malloc((size_t)(rows * p0->dim) * sizeof *features + 1);
    int64_t *tokens = p0->per_image ? malloc((size_t)w->n * sizeof *tokens) : NULL;
    int32_t *grid = p0->has_grid ? malloc((size_t)w->n * 3 * sizeof *grid) : NULL;
    if (!features || (p0->per_image && !tokens) || (p0->has_grid && !grid)) {
        free(features);
        free(tokens);
        free(grid);
        return false;
    }
    int64_t at = 0;
    for (int i = 0; i < w->n; i++) {
        const struct mmrt_vision_piece *p = &w->all[i];
        const int64_t n_rows = mmrt_vision_piece_rows(p);
        memcpy(features + at * p0->dim, p->features, (size_t)(n_rows * p0->dim) * sizeof *features);
        at += n_rows;
        if (tokens)
            tokens[i] = p->n_tokens;
        if (grid)
            memcpy(grid + 3 * i, p->grid_thw, sizeof p->grid_thw);
    }
    *out = (struct mmrt_vision_output){
        .n_images = w->n == 1 ? p0->n_parts : w->n,
        .n_tokens = p0->per_image ? rows : p0->n_tokens, .dim = p0->dim,
        .features = features, .tokens_per_image = tokens, .grid_thw = grid,
        .preprocess_ms = w->fresh.preprocess_ms, .vision_ms = w->fresh.vision_ms,
    };
    return true;
}

/* Keys, lookups and what the model must encode for req: w->mode. */
static void plan(const struct mmrt_vision_front *f, const struct mmrt_request *req,
                 struct mmrt_vision_key *keys, struct work *w)
{
    w->mode = W_MODEL;
    if (!mmrt_vision_front_applies(f, req))
        return;
    const int n = req->n_images;
    w->n = n;
    w->own_keys = keys ? NULL : calloc((size_t)n, sizeof *w->own_keys);
    w->keys = keys ? keys : w->own_keys;
    w->hits = calloc((size_t)n, sizeof *w->hits);
    w->all = calloc((size_t)n, sizeof *w->all);
    w->bytes = calloc((size_t)n, sizeof *w->bytes);
    w->sizes = calloc((size_t)n, sizeof *w->sizes);
    if (!w->keys || !w->hits || !w->all || !w->bytes || !w->sizes || !look_up(f, req, w))
        return;
    int n_miss = 0;
    int64_t hit_rows = 0;
    for (int i = 0; i < n; i++) {
        if (w->hits[i]) {
            w->all[i] = *w->hits[i];
            hit_rows += mmrt_vision_piece_rows(w->hits[i]);
        } else {
            n_miss++;
        }
    }
    /* The hits alone over the budget: no use encoding the others first. */
    if (n > 1 && f->max_image_tokens > 0 && hit_rows > f->max_image_tokens)
        return;
    if (n_miss == 0)
        w->mode = W_HITS;
    else if (missing_request(req, w, n_miss))
        w->mode = W_MISSING;
}

static int count_missing(const struct work *w)
{
    int n_miss = 0;
    for (int i = 0; i < w->n; i++)
        n_miss += !w->hits[i];
    return n_miss;
}

/* The model's vision stage of reqs[0 … n), together where it has encode_batch. */
static void model_encode(const struct mmrt_vision_front *f,
                         const struct mmrt_request *const *reqs, int n,
                         struct mmrt_vision_output *outs, mmrt_status *sts,
                         struct mmrt_error *errs)
{
    if (n > 1 && f->type->encode_batch) {
        f->type->encode_batch(f->model, reqs, n, outs, sts, errs);
        return;
    }
    for (int i = 0; i < n; i++)
        sts[i] = f->type->encode(f->model, reqs[i], NULL, &outs[i], &errs[i]);
}

void mmrt_vision_front_encode_batch(const struct mmrt_vision_front *f,
                                    const struct mmrt_request *const *reqs, int n,
                                    struct mmrt_vision_key *const *keys,
                                    struct mmrt_vision_output *outs, mmrt_status *sts,
                                    struct mmrt_error *errs)
{
    struct work *ws = calloc((size_t)n, sizeof *ws);
    const struct mmrt_request **run = calloc((size_t)n, sizeof *run);
    int *run_of = calloc((size_t)n, sizeof *run_of);
    struct mmrt_vision_output *fresh = calloc((size_t)n, sizeof *fresh);
    mmrt_status *fresh_st = calloc((size_t)n, sizeof *fresh_st);
    struct mmrt_error *fresh_err = calloc((size_t)n, sizeof *fresh_err);
    if (!ws || !run || !run_of || !fresh || !fresh_st || !fresh_err) {
        /* No room to plan: the model alone, each request as given (nothing cached). */
        for (int i = 0; i < n; i++)
            sts[i] = f->type->encode(f->model, reqs[i], NULL, &outs[i], &errs[i]);
        goto out;
    }
    /* What the model must run for each request: the request, its missing images, or
     * nothing; then all of that in one call, so that a model that can batches the images of
     * different requests through one pass. */
    int k = 0;
    for (int i = 0; i < n; i++) {
        plan(f, reqs[i], keys ? keys[i] : NULL, &ws[i]);
        if (ws[i].mode == W_HITS)
            continue;
        run_of[i] = k;
        run[k++] = ws[i].mode == W_MISSING ? &ws[i].sub : reqs[i];
    }
    model_encode(f, run, k, fresh, fresh_st, fresh_err);
    for (int i = 0; i < n; i++) {
        struct work *w = &ws[i];
        memset(&outs[i], 0, sizeof outs[i]);
        if (w->mode == W_MODEL) {
            outs[i] = fresh[run_of[i]];
            sts[i] = fresh_st[run_of[i]];
            errs[i] = fresh_err[run_of[i]];
            continue;
        }
        bool ok = true;
        if (w->mode == W_MISSING) {
            w->fresh = fresh[run_of[i]]; /* work_free releases it */
            ok = fresh_st[run_of[i]] == MMRT_OK && store_fresh(f, w, count_missing(w));
        }
        struct mmrt_vision_output v = { 0 };
        if (ok)
            ok = assemble(f, w, &v);
        /* Off the plain path: the model on the whole request, in its own words. */
        sts[i] = ok ? MMRT_OK : f->type->encode(f->model, reqs[i], NULL, &v, &errs[i]);
        outs[i] = v;
    }
out:
    for (int i = 0; ws && i < n; i++)
        work_free(f, &ws[i]);
    free(ws);
    free(run);
    free(run_of);
    free(fresh);
    free(fresh_st);
    free(fresh_err);
}

mmrt_status mmrt_vision_front_encode(const struct mmrt_vision_front *f,
                                     const struct mmrt_request *req,
                                     struct mmrt_vision_key *keys,
                                     struct mmrt_vision_output *out, struct mmrt_error *err)
{
    mmrt_status st;
    mmrt_vision_front_encode_batch(f, &req, 1, &keys, out, &st, err);
    return st;
}
