/*
 * core/formats/json.h — the one way mmrt parses JSON from outside (config.json,
 * tokenizer.json, safetensors headers, shard indexes, API request bodies).
 *
 * Library: jansson (Debian libjansson-dev). Chosen because it is small, long maintained,
 * validates UTF-8, rejects NUL in strings by default, refuses duplicate object keys itself
 * (JSON_REJECT_DUPLICATES) and reports line/column/byte of every error. Its built-in nesting
 * limit is 2048; this wrapper bounds depth much lower with a pre-scan, so a hostile document
 * cannot drive deep recursion in jansson or in our own walkers.
 *
 * Values are jansson's json_t; callers walk them with the jansson API and release the root
 * with json_decref(). The typed getters below turn a missing or ill-typed member into an
 * error that names the source and the key.
 */
#ifndef MMRT_FORMATS_JSON_H
#define MMRT_FORMATS_JSON_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../error.h"
#include "file.h"

#define MMRT_JSON_DEFAULT_MAX_DEPTH 64

/* Parses `len` bytes of `text` (need not be NUL-terminated). `what` names the source in
 * messages (a file path, "request body"). Refuses nesting deeper than max_depth, duplicate
 * keys, invalid UTF-8 and trailing non-space bytes. On success *out is a new reference. */
/* One linear pass over a JSON text without parsing it or allocating (strings and escapes
 * respected): the byte where nesting first passes max_depth (SIZE_MAX if never) and the
 * members of the top-level object (one ':' at depth 1 each). Lets a reader refuse a hostile
 * document by depth or size before jansson builds a value for every entry. */
struct mmrt_json_prescan_result {
    size_t too_deep_at;
    uint64_t top_members;
};
void mmrt_json_prescan(const char *text, size_t len, int max_depth,
                       struct mmrt_json_prescan_result *out);

mmrt_status mmrt_json_parse(const char *text, size_t len, const char *what, int max_depth,
                            json_t **out, struct mmrt_error *err);

/* Reads and parses a whole file, refusing files larger than max_bytes. The file is opened
 * through mmrt_file_read (file.h): a FIFO, a device or a directory is refused by name and
 * never blocks. MMRT_ERR_IO when it cannot be opened (missing included). */
mmrt_status mmrt_json_load_file(const char *path, size_t max_bytes, int max_depth,
                                json_t **out, struct mmrt_error *err);

/* Same, for files whose top level must be an object (config.json, tokenizer.json,
 * processor and generation configs): anything else is MMRT_ERR_FORMAT, "PATH: the top level
 * is an array, not an object". */
mmrt_status mmrt_json_load_object(const char *path, size_t max_bytes, int max_depth,
                                  json_t **out, struct mmrt_error *err);

/* Same, every number decoded as a real: for files of which only strings and structure are
 * read (a chat template in tokenizer_config.json, whose "model_max_length" transformers
 * writes as the integer 10^30, beyond what an integer here holds). */
mmrt_status mmrt_json_load_object_reals(const char *path, size_t max_bytes, int max_depth,
                                        json_t **out, struct mmrt_error *err);

/* "an object", "an array", "a string", "an integer", "a real number", "a boolean", "null"
 * (NULL counts as null); for messages. */
const char *mmrt_json_type_name(const json_t *v);

/* Typed members of an object. `what` names the object in messages ("config.json",
 * "config.json: text_config"). A missing key is an error for the get_ functions and leaves
 * *out at `def` for the opt_ functions; a present key of the wrong type or out of
 * [min, max] is always an error. Integers must be JSON integers (no 1.0, no 1e3). */
mmrt_status mmrt_json_get_int(const json_t *obj, const char *key, const char *what,
                              long long min, long long max, long long *out,
                              struct mmrt_error *err);
mmrt_status mmrt_json_opt_int(const json_t *obj, const char *key, const char *what,
                              long long min, long long max, long long def, long long *out,
                              struct mmrt_error *err);
/* Finite numbers only (integers accepted); NaN/Inf cannot appear in JSON text anyway, but
 * values outside [min, max] are refused. */
mmrt_status mmrt_json_opt_number(const json_t *obj, const char *key, const char *what,
                                 double min, double max, double def, double *out,
                                 struct mmrt_error *err);
mmrt_status mmrt_json_opt_bool(const json_t *obj, const char *key, const char *what, bool def,
                               bool *out, struct mmrt_error *err);
/* Token ids (eos_token_id and the like): an integer or a list of integers, each in
 * [0, max] (max is capped at INT32_MAX) as written in the JSON, so 4294967298 or -1 is
 * refused instead of being narrowed to 32 bits. At most `cap` ids (more is MMRT_ERR_LIMIT,
 * never a silent cut). A missing or null key gives *n = 0; ids[] is written only on success. */
mmrt_status mmrt_json_opt_id_list(const json_t *obj, const char *key, const char *what,
                                  long long max, int32_t *ids, int cap, int *n,
                                  struct mmrt_error *err);
/* Borrowed string owned by obj; *out = def (may be NULL) when missing. */
mmrt_status mmrt_json_opt_string(const json_t *obj, const char *key, const char *what,
                                 const char *def, const char **out, struct mmrt_error *err);

#endif /* MMRT_FORMATS_JSON_H */
