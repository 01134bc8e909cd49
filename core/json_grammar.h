/*
 * core/json_grammar.h — recognises prefixes of a JSON text (RFC 8259), byte by byte, so that
 * the engine can keep an answer valid JSON while it is generated (mmrt_request
 * response_format = MMRT_RESPONSE_JSON_OBJECT, docs/ENGINE.md "JSON answers").
 *
 * The state is a small value (a lexical state and a stack of up to MMRT_JSON_MAX_DEPTH
 * containers as bits): trying a token is a copy and a feed of its bytes, and the copy is
 * dropped when the token does not fit. What is checked is the syntax; strings hold any byte
 * from 0x20 up but '"' and '\' unescaped (the engine's token texts are valid UTF-8 already),
 * escapes are \" \\ \/ \b \f \n \r \t and \u with four hex digits.
 *
 * Bounds keep an answer moving: nesting deeper than MMRT_JSON_MAX_DEPTH is refused, and so
 * is whitespace beyond one byte before the top-level value or beyond MMRT_JSON_MAX_SPACE
 * bytes in a run elsewhere (a line break and indentation; models constrained to JSON are
 * known to emit whitespace until max_tokens otherwise, as llama.cpp's JSON grammar also
 * bounds it). The one byte at the start lets a first token like LLaMA's "▁{" in.
 */
#ifndef MMRT_CORE_JSON_GRAMMAR_H
#define MMRT_CORE_JSON_GRAMMAR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define MMRT_JSON_MAX_DEPTH 64
#define MMRT_JSON_MAX_SPACE 24

struct mmrt_json_grammar {
    uint64_t stack;    /* bit d: container at depth d is an array (1) or an object (0) */
    uint8_t depth;     /* open containers */
    uint8_t state;     /* enum in json_grammar.c */
    uint8_t aux;       /* literal: its index; \u escape: hex digits still to come */
    uint8_t pos;       /* literal: bytes of it read */
    uint8_t key;       /* the string being read is an object key */
    uint8_t space;     /* whitespace bytes in the current run */
    uint8_t object_only; /* the text must be an object */
};

/* A recogniser at the start of a text: any JSON value, or with object_only an object (what
 * OpenAI's json_object mode asks for). */
void mmrt_json_grammar_init(struct mmrt_json_grammar *g, bool object_only);

/* Feeds n bytes. Returns false, leaving *g in an unspecified state, when the bytes cannot
 * continue a JSON text from where g is (feed a copy to try). */
bool mmrt_json_grammar_feed(struct mmrt_json_grammar *g, const char *p, size_t n);

/* Whether g is inside a string, past any escape: where every byte from 0x20 up but '"' and
 * '\' is text and leaves g as it is. */
bool mmrt_json_grammar_in_string(const struct mmrt_json_grammar *g);

/* Whether the text so far is a whole JSON value: the top-level container, string or literal
 * has closed (a top-level number only once a whitespace byte followed it, since more digits
 * could). Only whitespace may follow. */
bool mmrt_json_grammar_done(const struct mmrt_json_grammar *g);

#endif
