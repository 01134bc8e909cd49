/*
 * core/schema_cache.h — compiled JSON schemas kept by their text, so that a schema is
 * compiled once however often it comes (docs/ENGINE.md "JSON answers"): the server's check
 * of a request, the runtime's check at submission and every sequence answering it (OpenAI's
 * n choices) find it compiled, and so does the next request that sends the same schema (a
 * client sends its schema with every call). A compiled schema is read-only while answers are
 * held to it (json_grammar.h), so its holders share one (mmrt_json_schema_hold).
 *
 * The key is the schema's exact text: two texts of one schema (other spacing, other key
 * order) are two entries, which costs a compile and never a wrong answer. Least recently
 * used entries go first past MMRT_SCHEMA_CACHE_ENTRIES or MMRT_SCHEMA_CACHE_BYTES (their
 * text and compiled tables); an entry's holders keep it alive after it goes. A text that
 * does not compile is not kept: its error is made again each time.
 */
#ifndef MMRT_CORE_SCHEMA_CACHE_H
#define MMRT_CORE_SCHEMA_CACHE_H

#include <stddef.h>
#include <stdint.h>

#include "error.h"
#include "json_schema.h"

#define MMRT_SCHEMA_CACHE_ENTRIES 64
#define MMRT_SCHEMA_CACHE_BYTES (64u << 20)

struct mmrt_schema_cache;

/* Counters since creation, and what is held now. */
struct mmrt_schema_cache_stats {
    uint64_t lookups;  /* mmrt_schema_cache_get calls */
    uint64_t compiles; /* of those, texts compiled (misses, failures included) */
    uint64_t entries, bytes;
};

/* max_entries 0 = MMRT_SCHEMA_CACHE_ENTRIES, max_bytes 0 = MMRT_SCHEMA_CACHE_BYTES. */
mmrt_status mmrt_schema_cache_create(int max_entries, size_t max_bytes,
                                     struct mmrt_schema_cache **out, struct mmrt_error *err);
/* Gives up the cache's holds; NULL is a no-op. */
void mmrt_schema_cache_destroy(struct mmrt_schema_cache *c);

/* *out: the compiled schema of text[0, len) (mmrt_json_schema_parse), or with text NULL the
 * schema of any JSON object (mmrt_json_schema_any_object, OpenAI's json_object): a hold the
 * caller gives back with mmrt_json_schema_free. Compiled now unless the cache holds it. Safe
 * from any thread; a compile runs outside the cache's lock. */
mmrt_status mmrt_schema_cache_get(struct mmrt_schema_cache *c, const char *text, size_t len,
                                  struct mmrt_json_schema **out, struct mmrt_error *err);

void mmrt_schema_cache_get_stats(struct mmrt_schema_cache *c,
                                 struct mmrt_schema_cache_stats *out);

/* The runtime's cache (core/runtime.c owns one; rt is a struct mmrt_runtime *): the server
 * compiles a request's schema there, so the runtime and the engine find it compiled. */
struct mmrt_runtime;
mmrt_status mmrt_runtime_json_schema(struct mmrt_runtime *rt, const char *text, size_t len,
                                     struct mmrt_json_schema **out, struct mmrt_error *err);

#endif
