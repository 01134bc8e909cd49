/*
 * core/json_schema.h — a JSON Schema compiled into the table that core/json_grammar.h walks
 * while an answer is generated (mmrt_request.response_format = MMRT_RESPONSE_JSON_SCHEMA,
 * and MMRT_RESPONSE_JSON_OBJECT as the schema {"type": "object"}; docs/ENGINE.md "JSON
 * answers").
 *
 * The schema comes from outside (a request body) and is checked as such: every refusal is
 * MMRT_ERR_INVALID_ARG (MMRT_ERR_LIMIT past a bound) naming the place in the schema as a JSON
 * pointer ("json_schema /properties/age: ...").
 *
 * What is compiled is a recogniser for a subset of the documents the schema admits, chosen so
 * that a prefix can be checked byte by byte with a state of a few bytes per open container:
 *   - the keywords type (a name or a list), properties, required, additionalProperties,
 *     items, prefixItems (a tuple; or items as a list with additionalItems), minItems,
 *     maxItems, minLength, maxLength, pattern (an ECMA-262 regular expression of the subset
 *     json_pattern.h compiles), minimum, maximum, exclusiveMinimum and exclusiveMaximum (a
 *     number's within 2^53 when written as an integer), multipleOf of an integer (a
 *     positive integer), enum, const, anyOf, oneOf, allOf of one schema, and $ref to a JSON pointer into the schema ("#",
 *     "#/$defs/NAME", "#/definitions/NAME", any other "#/..."); a count past
 *     MMRT_JSON_SCHEMA_MAX_COUNT is refused as a minimum and held to it as a maximum;
 *     annotations (title, description, default, examples, format, $schema, $id, $comment,
 *     deprecated, readOnly, writeOnly, ...) are read past, as JSON Schema has them.
 *   - uniqueItems holds over the values of an enum (up to 16 with one text each: strings,
 *     integers, true, false, null); the open array's frame marks which came;
 *   - maxProperties, and minProperties 0 or 1, hold on an object with free keys (the frame
 *     counts them; a key is not remembered, so a larger minimum is refused); beside listed
 *     properties only where every document of them satisfies them;
 *   - assertions mmrt cannot hold an answer to (multipleOf of a number that may have a
 *     fraction, uniqueItems over other items, not, if, contains, ...) are refused by name,
 *     never ignored;
 *   - an object with listed properties is written with those keys only, in the schema's
 *     order, each once, every required one present: the keys JSON Schema allows beyond
 *     them are never generated. Without listed properties its keys are free, their values
 *     held to additionalProperties (any value when it is absent or true);
 *   - enum and const values are written compactly (keys in their order, no space; a real
 *     as jansson writes it with the fewest digits that read back the same, 2.0 as 2.0), and
 *     strings and listed keys JSON-escaped the minimal way;
 *   - "integer" is written without fraction or exponent, and within int64 when it has
 *     bounds or multipleOf (each digit is taken only when some integer it begins is within
 *     them and a multiple); a "number" with bounds is written without exponent, each digit
 *     taken only when some decimal it begins is within them;
 *   - the alternatives of anyOf, oneOf and a list of types must be told apart by their
 *     first byte (an object, an array, a string, a number, true, false, null): enums and
 *     literals merge into one alternative, "integer" beside "number" gives way to it under
 *     anyOf, and objects with listed keys (up to 16, Pydantic's Union of models) merge into
 *     one that follows them all, told apart by which keys come and the literal values of
 *     shared ones (a discriminator): their keys go in one order that keeps each one's
 *     where there is one (else in order of first appearance), and a shared key must have the same value schema in each, or literal values, or schemas
 *     told apart before it (a key earlier in the order that every alternative giving it a
 *     different schema requires, with literal values none of those share); under oneOf
 *     one key every alternative requires must take literal values no two share (strings,
 *     integers, true, false, null), so that only one can match. Two alternatives both
 *     starting, say, an array are refused.
 * A schema with no finite document (a required property that recurses into itself, minItems
 * above maxItems, an empty enum, false) is refused.
 */
#ifndef MMRT_CORE_JSON_SCHEMA_H
#define MMRT_CORE_JSON_SCHEMA_H

#include <jansson.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "error.h"
#include "json_pattern.h"

#define MMRT_JSON_SCHEMA_MAX_NODES 16384u
#define MMRT_JSON_SCHEMA_MAX_LITERALS 65536u /* enum values and listed keys, all together */
#define MMRT_JSON_SCHEMA_MAX_TEXT (1u << 20) /* bytes of those literals */
#define MMRT_JSON_SCHEMA_MAX_COUNT 65535u    /* minItems, maxItems, minLength, maxLength */
#define MMRT_JSON_SCHEMA_MAX_REFS 32u        /* $ref targets made one inside another */
#define MMRT_JSON_NONE UINT16_MAX            /* no node */
#define MMRT_JSON_UNBOUNDED UINT32_MAX       /* maxItems, maxLength when absent */

/* What the first byte of a value says it is; a union picks its alternative by it. */
enum mmrt_json_class {
    MMRT_JSON_CLASS_OBJECT, MMRT_JSON_CLASS_ARRAY, MMRT_JSON_CLASS_STRING,
    MMRT_JSON_CLASS_NUMBER, MMRT_JSON_CLASS_TRUE, MMRT_JSON_CLASS_FALSE, MMRT_JSON_CLASS_NULL,
    MMRT_JSON_CLASSES
};

enum mmrt_json_kind {
    MMRT_JSON_OBJECT,   /* props [first, first + n), key literals [lit, lit + n); extra; n = 0:
                         * min, max free keys */
    MMRT_JSON_ARRAY,    /* item i: props[first + i] for i < n (a tuple), then extra; min,
                         * max items; lit ≠ 0: uniqueItems (extra is then a LITERALS node
                         * of at most 16, max at most their count) */
    MMRT_JSON_STRING,   /* min, max characters (code points; a \u pair is one); n = 1: held
                         * to patterns[lit] */
    MMRT_JSON_NUMBER,   /* n = 1: written without exponent, its magnitude within ranges[lit]
                         * (no '-') or ranges[lit + 1] (after '-') */
    MMRT_JSON_INTEGER,  /* a number without fraction or exponent; n = 1: within [imin, imax]
                         * and a multiple of mul */
    MMRT_JSON_LITERALS, /* one of the literals [lit, lit + n) */
    MMRT_JSON_UNION,    /* alt[class]: the node for a value starting so, or MMRT_JSON_NONE */
    /* Object alternatives (anyOf of objects with listed keys), told apart by their keys and
     * the literal values of shared ones: n keys in one order (json_schema.c), their
     * literals [lit, lit + n) (prop: the key's index); extra alternatives (≤ 16). props
     * [first, first + n): each key's value node (a LITERALS node with extra = 1 when the
     * alternatives give it different literals: a literal's prop is then the mask of the
     * alternatives it belongs to); then per alternative a, props [first + n + a·n, + n):
     * its value node for key j (MMRT_JSON_NONE: it has no such key) and whether it is
     * required. */
    MMRT_JSON_OBJECTS,
};

struct mmrt_json_node {
    uint8_t kind;        /* enum mmrt_json_kind */
    /* OBJECT: the value node of keys not listed, allowed only when n is 0 (MMRT_JSON_NONE:
     * no other key); ARRAY: the items' node. */
    uint16_t extra;
    uint32_t first, n, lit;
    uint32_t min, max;
    int64_t imin, imax;
    uint64_t mul;
    uint16_t alt[MMRT_JSON_CLASSES];
};

/* A listed property of an object, in the schema's order. per_alternative: in object
 * alternatives (MMRT_JSON_OBJECTS), a key's shared entry whose alternatives give it different
 * value schemas; its value is read under the live alternatives' node (json_schema.c makes
 * sure they agree once the key can come), node only saying whether the key may come. */
struct mmrt_json_prop {
    uint16_t node;
    uint8_t required;
    uint8_t per_alternative;
};

/* Bytes text[off, off + len) of a literal: a value of an enum, or a listed key with its
 * quotes. A node's literals are sorted by their bytes (a literal before those it is a
 * prefix of), so the ones that begin with a given prefix are a run. prop: a key's index
 * among its object's props. */
struct mmrt_json_literal {
    uint32_t off, len;
    uint32_t prop;
};

/* A bound of a number's magnitude, a double, as a decimal a validator reads as that double
 * (json_schema.c, bound_decimal). Digits text[off, off + len) are its integer part (none
 * below 1) and then its fraction, trailing zeros dropped (every digit past len is 0); the
 * first n_int of them are the integer part. */
struct mmrt_json_decimal {
    uint32_t off, len, n_int;
};

/* The magnitudes a number of one sign may have, bounds included: [a, b], b unbounded when
 * !b_finite; none when empty. A validator reads a document's decimal as the nearest double,
 * which may be an exclusive bound itself: such a bound is compiled as the next double
 * inward, held inclusively. */
struct mmrt_json_range {
    struct mmrt_json_decimal a, b;
    uint8_t b_finite;
    uint8_t empty;
};

struct mmrt_json_schema {
    struct mmrt_json_node *node;
    uint32_t n_nodes;
    uint16_t root;
    struct mmrt_json_prop *prop;
    uint32_t n_props;
    struct mmrt_json_literal *lit;
    uint32_t n_lits;
    char *text;
    size_t n_text;
    struct mmrt_json_pattern *patterns;
    uint32_t n_patterns;
    struct mmrt_json_range *ranges;
    uint32_t n_ranges;
    /* Holders besides the first (mmrt_json_schema_hold): a compiled schema is read-only, so
     * every answer held to the same schema shares one (core/schema_cache.h). */
    atomic_int holds;
};

/* Whether some multiple of m ≥ 1 lies in [a, b] (a ≤ 2^63). */
static inline bool mmrt_json_has_multiple(uint64_t a, uint64_t b, uint64_t m)
{
    const uint64_t r = a % m;
    return a <= b && (r == 0 || m - r <= b - a);
}

/* Compiles a schema (a parsed JSON value: an object, or true for any value). *out is new,
 * freed with mmrt_json_schema_free. */
mmrt_status mmrt_json_schema_compile(const json_t *schema, struct mmrt_json_schema **out,
                                     struct mmrt_error *err);

/* Parses len bytes of JSON text (depth ≤ MMRT_JSON_DEFAULT_MAX_DEPTH) and compiles it. */
mmrt_status mmrt_json_schema_parse(const char *text, size_t len, struct mmrt_json_schema **out,
                                   struct mmrt_error *err);

/* Any JSON object: OpenAI's json_object mode. */
mmrt_status mmrt_json_schema_any_object(struct mmrt_json_schema **out, struct mmrt_error *err);

/* Gives up one hold; the last frees the schema. NULL is a no-op. */
void mmrt_json_schema_free(struct mmrt_json_schema *s);

/* Takes one more hold on s (given back with mmrt_json_schema_free) and returns s. Safe from
 * any thread, as is giving a hold back. */
struct mmrt_json_schema *mmrt_json_schema_hold(struct mmrt_json_schema *s);

/* The bytes s holds, tables and patterns included (the cache's bound). */
size_t mmrt_json_schema_bytes(const struct mmrt_json_schema *s);

#endif
