/*
 * core/json_grammar.h — recognises prefixes of a JSON text (RFC 8259) held to a compiled
 * schema (core/json_schema.h), byte by byte, so that the engine can keep an answer a valid
 * document while it is generated (mmrt_request response_format, docs/ENGINE.md "JSON
 * answers").
 *
 * The state is a small value: a lexical state, the node of the value being read, and one
 * frame (node, count) per open container. Trying a token is a copy (mmrt_json_grammar_copy
 * copies the open frames only) and a feed of its bytes; the copy is dropped when the token
 * does not fit. Strings hold any byte from 0x20 up but '"' and '\' unescaped (the engine's
 * token texts are valid UTF-8 already), escapes are \" \\ \/ \b \f \n \r \t and \u with four
 * hex digits; a \u surrogate must be half of a pair (a lone one is no character, and strict
 * parsers refuse it). A prefix is taken only when some document continues it (within the
 * depth bound).
 *
 * Bounds keep an answer moving: nesting deeper than MMRT_JSON_MAX_DEPTH is refused, and so
 * is whitespace beyond one byte before the top-level value or beyond MMRT_JSON_MAX_SPACE
 * bytes in a run elsewhere (a line break and indentation; models constrained to JSON are
 * known to emit whitespace until max_tokens otherwise, as llama.cpp's JSON grammar also
 * bounds it). The one byte at the start lets a first token like LLaMA's "▁{" in. Literals
 * (enum values, listed keys) take no whitespace inside.
 */
#ifndef MMRT_CORE_JSON_GRAMMAR_H
#define MMRT_CORE_JSON_GRAMMAR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "json_schema.h"

#define MMRT_JSON_MAX_DEPTH 64
#define MMRT_JSON_MAX_SPACE 24

/* An open container: its node, and the items so far (an array; saturating), the index of
 * the first listed property that may still come (an object with listed keys) or the keys so
 * far (one with free keys; saturating); for object alternatives (MMRT_JSON_OBJECTS) the mask
 * of those the keys and values so far still allow, for an array with uniqueItems that of the
 * literals that came. */
struct mmrt_json_frame {
    uint16_t node;
    uint16_t count;
    uint16_t live;
};

struct mmrt_json_grammar {
    const struct mmrt_json_schema *schema; /* borrowed; outlives the grammar */
    uint16_t value;  /* the node of the value to come or being read */
    uint16_t hex;    /* a \u escape: its code unit so far */
    uint8_t state;   /* enum in json_grammar.c */
    uint8_t depth;   /* open containers */
    uint8_t space;   /* whitespace bytes in the current run */
    uint8_t flags;   /* json_grammar.c: a key is read, a high surrogate came last, ... */
    uint8_t aux;     /* a \u escape: hex digits still to come */
    union {
        struct {
            uint32_t lo, hi; /* a literal: the candidates [lo, hi) of schema->lit */
        };
        uint64_t mag;        /* an integer held to bounds: its digits so far */
        struct {             /* a number held to bounds (json_grammar.c) */
            uint16_t n_int, n_frac; /* digits of its integer part (a leading 0: none), of
                                     * its fraction */
            uint8_t cmp_a, cmp_b;   /* its digits against its range's bounds' */
        } dec;
    };
    uint32_t pos;    /* a literal: bytes of it read; a string: its characters */
    struct mmrt_json_frame frame[MMRT_JSON_MAX_DEPTH];
};

/* A recogniser at the start of a document held to schema. */
void mmrt_json_grammar_init(struct mmrt_json_grammar *g, const struct mmrt_json_schema *schema);

/* *dst = *src, the open frames only. Inline: a mask pass copies a state per token. */
static inline void mmrt_json_grammar_copy(struct mmrt_json_grammar *dst,
                                          const struct mmrt_json_grammar *src)
{
    /* The header and the first four frames in fixed-size moves (most documents nest no
     * deeper), then the rest. */
    memcpy(dst, src, offsetof(struct mmrt_json_grammar, frame) + 4 * sizeof src->frame[0]);
    for (unsigned i = 4; i < src->depth; i++)
        dst->frame[i] = src->frame[i];
}

/* Feeds n bytes. Returns false, leaving *g in an unspecified state, when the bytes cannot
 * continue a document from where g is (feed a copy to try). */
bool mmrt_json_grammar_feed(struct mmrt_json_grammar *g, const char *p, size_t n);

/* Whether g is inside a string, past any escape, where every byte from 0x20 up but '"' and
 * '\' is text and leaves g as it is: a string with no maxLength whose minLength is met, or a
 * free key. */
bool mmrt_json_grammar_in_string(const struct mmrt_json_grammar *g);

/* Whether the text so far is a whole document: the top-level container, string or literal
 * has closed (a top-level number, or an enum value some other value extends, only once a
 * whitespace byte followed it). Only whitespace may follow. */
bool mmrt_json_grammar_done(const struct mmrt_json_grammar *g);

#endif
