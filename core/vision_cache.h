/*
 * core/vision_cache.h — the vision-feature cache: what a request's images gave in the vision
 * stage (decode, preprocessing, tower, projector), kept per image so that the same image sent
 * again — the next turn of a chat, the same picture from many clients — skips all of it.
 *
 * Three parts, each usable alone:
 *
 *   Keys. An image's key is SHA-256 (GNU nettle) over the runtime's settings digest (32
 *   bytes) followed by the image's encoded bytes, as received: a path image's file bytes, an
 *   in-memory image's buffer. The settings digest covers everything that changes an image's
 *   features besides its bytes: the canonical model directory (realpath), its model_type,
 *   SHA-256 of its config.json, preprocessor_config.json and processor_config.json (the
 *   preprocessing sizes and pixel limits live there), [model] max_image_tokens and
 *   oversize_images, the vision device's plugin name and version, its device index and every
 *   plugin option it was opened with (precision keys such as gemm_precision, isa, bf16_dot),
 *   and the mmrt version (the decoder, the resize filters and the kernels are mmrt's code).
 *   Each field goes in tagged and length-prefixed, so no two settings serialize alike. The
 *   weights themselves are not hashed: a runtime's weights never change while it runs, and
 *   the cache lives in the runtime's memory. Hex form: 64 lowercase hex digits.
 *
 *   The store (mmrt_vision_cache_*). An LRU map from key to one image's output, bounded by
 *   entries and by bytes of features; both bounds hold after every insertion (least recently
 *   used entries are evicted first). An entry holds its own copy of the f32 features, so a
 *   hit hands out exactly the bits the miss computed. Thread-safe: one mutex guards the map,
 *   the LRU list and the counters.
 *
 *   Lookups return a reference to the entry, not a copy: entries are immutable once inserted
 *   and reference-counted, so the caller copies the features (megabytes for a 7B model) after
 *   the mutex is released and other threads never wait behind a memcpy; an entry evicted
 *   while referenced leaves the map and the byte count at once and is freed by its last
 *   release (so for that moment the memory held exceeds the bound by what readers hold).
 *
 *   The front (mmrt_vision_front_encode). The model's encode() behind the cache, for one
 *   request, per image: see that function.
 *
 * Data structure: a chained hash table on the key's first 8 bytes (a SHA-256 digest is
 * uniform, so no further hashing) that doubles when it holds more entries than buckets, and
 * a doubly-linked list in recency order (head = most recent). Invariants (under the mutex):
 * every entry in the table is on the list and the other way round; `entries` and `bytes` are
 * the count and the feature bytes of those entries; entries ≤ max_entries and bytes ≤
 * max_bytes once an insertion returns.
 */
#ifndef MMRT_CORE_VISION_CACHE_H
#define MMRT_CORE_VISION_CACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "error.h"
#include "model.h"
#include "mmrt/common.h"

#define MMRT_VISION_KEY_BYTES 32 /* SHA-256 */
#define MMRT_VISION_KEY_HEX 65   /* 64 lowercase hex digits + NUL */

/* The defaults of struct mmrt_config.vision_cache_entries and .vision_cache_mb (0). */
#define MMRT_VISION_CACHE_DEFAULT_ENTRIES 2048
#define MMRT_VISION_CACHE_DEFAULT_MB 1024

/* One image's key; `set` is false until it is computed. */
struct mmrt_vision_key {
    uint8_t bytes[MMRT_VISION_KEY_BYTES];
    bool set;
};

/* ---- hashing ---- */

/* SHA-256 of size bytes at data (nettle), for the tests' known vectors and the keys. */
void mmrt_sha256(const void *data, size_t size, uint8_t out[MMRT_VISION_KEY_BYTES]);

/* What the settings digest covers (see above). Strings are read during the call only. */
struct mmrt_vision_settings {
    const char *model_dir;      /* canonicalised with realpath(3) */
    const char *model_type;     /* config.json "model_type" */
    int64_t max_image_tokens;
    int oversize_images;        /* enum mmrt_oversize_images */
    const char *plugin;         /* the vision device's plugin name ("cpu") */
    const char *plugin_version; /* its version string; NULL reads as "" */
    int device_index;
    const struct mmrt_option *options; /* the vision device's plugin options, any order */
    int n_options;
    int exif_orientation;       /* enum mmrt_exif_orientation: an applied tag turns the pixels */
};

/* The settings digest. Reads model_dir's config.json and, where present, its
 * preprocessor_config.json and processor_config.json (each at most 16 MiB). Statuses:
 * MMRT_ERR_IO / MMRT_ERR_LIMIT / MMRT_ERR_NO_MEMORY naming the file or the directory
 * (realpath failing), MMRT_ERR_INVALID_ARG for a NULL model_dir or model_type. */
mmrt_status mmrt_vision_settings_digest(const struct mmrt_vision_settings *s,
                                        uint8_t out[MMRT_VISION_KEY_BYTES],
                                        struct mmrt_error *err);

/* The key of an image's encoded bytes under a settings digest. */
void mmrt_vision_key_of(const uint8_t settings[MMRT_VISION_KEY_BYTES], const void *data,
                        size_t size, struct mmrt_vision_key *out);

/* out = the key as 64 lowercase hex digits and a NUL; "" when the key is not set. */
void mmrt_vision_key_hex(const struct mmrt_vision_key *key, char out[MMRT_VISION_KEY_HEX]);

/* ---- the store ---- */

/* One image's part of a vision-stage output (model.h struct mmrt_vision_output), in that
 * output's terms: n_parts entries of the output's `n_images` (1, except for Fuyu, whose
 * output has one uniform "image" per patch row), n_tokens as the output's. */
struct mmrt_vision_piece {
    int n_parts;            /* ≥ 1; above 1 only in the uniform layout */
    int64_t n_tokens;       /* embeddings per part (uniform) or of the image (per image) */
    int64_t dim;            /* language hidden size */
    const float *features;  /* [mmrt_vision_piece_rows][dim] */
    bool per_image;         /* it came from the per-image layout (tokens_per_image set) */
    bool has_grid;          /* the output carried grid_thw (then n_parts is 1) ... */
    int32_t grid_thw[3];    /* ... and this was the image's (t, h, w) */
};

/* Feature rows of p: n_parts · n_tokens (uniform) or n_tokens (per image). */
int64_t mmrt_vision_piece_rows(const struct mmrt_vision_piece *p);

struct mmrt_vision_cache;

/* Counters since creation, and what is held now. */
struct mmrt_vision_cache_stats {
    uint64_t queries;      /* lookups (one per image looked up) */
    uint64_t hits;         /* lookups that found their key */
    uint64_t evictions;    /* entries pushed out by an insertion to keep the bounds */
    uint64_t entries;      /* held now */
    uint64_t bytes;        /* feature bytes held now */
    uint64_t max_entries;  /* the bounds */
    uint64_t max_bytes;
};

/* A cache of at most max_entries entries (≥ 1) and max_bytes bytes of features (≥ 1).
 * Statuses: MMRT_ERR_INVALID_ARG for a bound below 1 or a NULL out, MMRT_ERR_NO_MEMORY. */
mmrt_status mmrt_vision_cache_create(uint64_t max_entries, uint64_t max_bytes,
                                     struct mmrt_vision_cache **out, struct mmrt_error *err);

/* Frees every entry. Every reference from mmrt_vision_cache_get must have been released.
 * NULL is a no-op. */
void mmrt_vision_cache_destroy(struct mmrt_vision_cache *c);

/* Looks key up: one query, and a hit when found, which becomes the most recently used entry.
 * Returns the entry's piece (borrowed until mmrt_vision_cache_release; never changes), or
 * NULL on a miss. */
const struct mmrt_vision_piece *mmrt_vision_cache_get(struct mmrt_vision_cache *c,
                                                      const uint8_t key[MMRT_VISION_KEY_BYTES]);

/* Gives back a piece from mmrt_vision_cache_get. NULL is a no-op. */
void mmrt_vision_cache_release(struct mmrt_vision_cache *c, const struct mmrt_vision_piece *p);

/* Stores a copy of p (its features copied) as the most recently used entry under key, then
 * evicts least recently used entries until both bounds hold. A piece whose features alone
 * are more than max_bytes is not stored (and evicts nothing). A key already held keeps its
 * entry (it only becomes the most recent): the same key gives the same features. Statuses:
 * MMRT_ERR_NO_MEMORY (nothing stored, nothing evicted), MMRT_ERR_INVALID_ARG for a piece
 * with negative sizes, no parts, several parts outside the uniform layout, or no features. */
mmrt_status mmrt_vision_cache_insert(struct mmrt_vision_cache *c,
                                     const uint8_t key[MMRT_VISION_KEY_BYTES],
                                     const struct mmrt_vision_piece *p, struct mmrt_error *err);

/* Whether key is held, without counting a query or touching the recency order (tests). */
bool mmrt_vision_cache_contains(struct mmrt_vision_cache *c,
                                const uint8_t key[MMRT_VISION_KEY_BYTES]);

/* The counters; zeros for a NULL cache. Any thread. */
void mmrt_vision_cache_stats(struct mmrt_vision_cache *c, struct mmrt_vision_cache_stats *out);

/* ---- the front: a request's vision stage through the cache ---- */

/* What the front needs to run a model's vision stage; fixed for the runtime's life. */
struct mmrt_vision_front {
    struct mmrt_vision_cache *cache;    /* NULL: the cache is off */
    uint8_t settings[MMRT_VISION_KEY_BYTES]; /* the settings digest */
    const struct mmrt_model_type *type;
    struct mmrt_model *model;
    int64_t max_image_tokens;           /* [model] max_image_tokens, 0 = none */
    enum mmrt_oversize_images oversize_images;
    int64_t max_positions;              /* the language model's context, 0 = unknown */
    size_t max_image_bytes;             /* the image decoder's cap on a file's size */
};

/* Whether requests like req go through the cache: it is on, the request has images, and not
 * oversize_images = downscale with more than one image (the shared budget then makes each
 * image's size, so its features, depend on the others). */
bool mmrt_vision_front_applies(const struct mmrt_vision_front *f,
                               const struct mmrt_request *req);

/* The vision stage of req (normalized, model.h) through the cache, or f->type->encode when
 * the cache does not apply. keys ([req->n_images], may be NULL) carries the keys computed
 * before (an in-memory image's, in mmrt_submit): a set key is used as given, and every other
 * image's key is computed here and written back. Per image: the keys are looked up one by
 * one; when all hit the output is built from the cached pieces (preprocess_ms = vision_ms =
 * 0); otherwise encode() runs on a copy of the request that holds only the missing images
 * (each user turn's n_images recounted; a path image handed over as the bytes its key was
 * computed from, with its path kept for messages, so the file is read once), the missing
 * pieces are inserted, and the output is the pieces in the request's order. A model's
 * vision stage gives each image features that depend on that image alone (images share a
 * pass of a tower only where each keeps its alone bits, model.h encode_batch; held by
 * tests/test_vision_cache.c and tests/test_vision_batch.c), so the result is bit-identical
 * to encode() on the whole request.
 *
 * Anything off the plain path runs encode() on the whole request as given, so the request
 * fails (or succeeds) in the model's own words, with its image numbers: a path whose file
 * cannot be read, a failed encode of the missing images, and a request whose images
 * together exceed max_image_tokens or the context (each image fitted alone when it was
 * stored; together they are checked here). The same output layouts as encode()'s. */
mmrt_status mmrt_vision_front_encode(const struct mmrt_vision_front *f,
                                     const struct mmrt_request *req,
                                     struct mmrt_vision_key *keys,
                                     struct mmrt_vision_output *out, struct mmrt_error *err);

/* mmrt_vision_front_encode for n requests at once: request i's output, status and message
 * in outs[i], sts[i] and errs[i], each exactly what mmrt_vision_front_encode gives it alone
 * (keys NULL, or keys[i] as its keys, each may be NULL). The images every request lacks in
 * the cache (or the whole request, off the cache's path) go to the model in one call, so a
 * model with encode_batch (model.h) runs them through its tower together. */
void mmrt_vision_front_encode_batch(const struct mmrt_vision_front *f,
                                    const struct mmrt_request *const *reqs, int n,
                                    struct mmrt_vision_key *const *keys,
                                    struct mmrt_vision_output *outs, mmrt_status *sts,
                                    struct mmrt_error *errs);

/* ---- for tests (implemented in runtime.c) ---- */

/* The vision stage mmrt_run gives req (through the cache when it applies), into *out (the
 * caller frees it with mmrt_vision_output_free). Takes the runtime's drive lock. */
mmrt_status mmrt_runtime_vision(struct mmrt_runtime *rt, const struct mmrt_request *req,
                                struct mmrt_vision_output *out, struct mmrt_error *err);

/* The vision stages of reqs[0 … n) run together, as the worker runs a vision batch
 * (mmrt_vision_front_encode_batch): outs[i], sts[i] and errs[i] are request i's (the caller
 * frees every outs[i]). n ≤ 32. Takes the runtime's drive lock. */
void mmrt_runtime_vision_batch(struct mmrt_runtime *rt, const struct mmrt_request *reqs, int n,
                               struct mmrt_vision_output *outs, mmrt_status *sts,
                               struct mmrt_error *errs);

#endif /* MMRT_CORE_VISION_CACHE_H */
