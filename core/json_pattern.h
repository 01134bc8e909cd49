/*
 * core/json_pattern.h — a JSON Schema "pattern" (an ECMA-262 regular expression) compiled
 * into a deterministic automaton over code points, so that core/json_grammar.c can hold a
 * string to it a character at a time with one state number (docs/ENGINE.md "JSON answers").
 *
 * The pattern comes from outside and is checked as such. What compiles: characters and
 * escapes (\t \n \r \v \f \0 \xHH \uHHHH, an escaped syntax character), '.', classes
 * ([a-z], [^...], \d \w \s \D \W \S inside and out), groups ( ), (?: ) and (?<name> ),
 * alternation, the quantifiers * + ? {n} {n,} {n,m} (lazy or not: the same strings), '^'
 * first and '$' last. Without '^' the pattern may match after any text, without '$' any
 * text may follow (JSON Schema's patterns search, they are not anchored). Refused by name:
 * back-references, look-arounds, \b and \B, \p{...}, anchors elsewhere.
 *
 * Characters are code points; the automaton's alphabet is the code points cut into the
 * classes its sets tell apart, so a step is a binary search and a table look-up.
 */
#ifndef MMRT_CORE_JSON_PATTERN_H
#define MMRT_CORE_JSON_PATTERN_H

#include <stddef.h>
#include <stdint.h>

#include "error.h"

#define MMRT_JSON_PATTERN_MAX_BYTES 1024u   /* of the pattern's text */
#define MMRT_JSON_PATTERN_MAX_NFA 4096u     /* states before determinising */
#define MMRT_JSON_PATTERN_MAX_STATES 1024u  /* of the automaton */
#define MMRT_JSON_PATTERN_MAX_REPEAT 256u   /* n and m of {n,m} */
#define MMRT_JSON_PATTERN_DEAD UINT16_MAX   /* no state: the character is refused */
#define MMRT_JSON_PATTERN_UNBOUNDED UINT32_MAX
#define MMRT_JSON_PATTERN_MAX_WINDOW (1u << 22)      /* bits of a schema's windows */
#define MMRT_JSON_PATTERN_MAX_WINDOW_WORK (1u << 26) /* steps to make them */

struct mmrt_json_pattern {
    uint32_t n_classes;  /* class k is code points [start[k], start[k + 1]) */
    uint32_t *start;     /* [n_classes + 1], start[0] = 0, start[n_classes] = 0x110000 */
    uint32_t n_states;   /* state 0 is the start */
    uint16_t *next;      /* [n_states * n_classes]: MMRT_JSON_PATTERN_DEAD where no string
                          * the pattern matches goes on so */
    uint8_t *accept;     /* [n_states]: the text so far matches */
    uint32_t *shortest;  /* [n_states]: fewest characters to a match from here */
    uint32_t *longest;   /* [n_states]: most (MMRT_JSON_PATTERN_UNBOUNDED: no limit) */
    /* The string's minLength and maxLength (0 and MMRT_JSON_PATTERN_UNBOUNDED: none); when
     * both bind, window holds a bit per (state, characters read up to max_len): whether a
     * match of an allowed length is still ahead. The lengths a pattern matches need not be
     * an interval ((ab)* has only even ones), so shortest and longest cannot tell. */
    uint32_t min_len, max_len;
    uint8_t *window;
};

/* Whether from state t, with done characters read, a match of a length in [min_len,
 * max_len] is still ahead. */
static inline int mmrt_json_pattern_fits(const struct mmrt_json_pattern *p, uint16_t t,
                                         uint32_t done)
{
    if (p->max_len != MMRT_JSON_PATTERN_UNBOUNDED &&
        (done > p->max_len || p->shortest[t] > p->max_len - done))
        return 0;
    if (p->window) {
        const size_t bit = (size_t)t * (p->max_len + 1) + done;
        return p->window[bit >> 3] >> (bit & 7) & 1;
    }
    return done >= p->min_len || p->longest[t] >= p->min_len - done;
}

/* Compiles len bytes of pattern (UTF-8). MMRT_ERR_INVALID_ARG names what is wrong and its
 * byte offset; MMRT_ERR_LIMIT past a bound above. A pattern no string matches is refused.
 * *out is filled on success and freed with mmrt_json_pattern_free. */
mmrt_status mmrt_json_pattern_compile(const char *pattern, size_t len,
                                      struct mmrt_json_pattern *out, struct mmrt_error *err);

/* What the windows of one schema's patterns may still take, all together: bits, and steps
 * to make them. Start it at MMRT_JSON_PATTERN_MAX_WINDOW and _WORK. */
struct mmrt_json_pattern_budget {
    uint64_t bits, work;
};

/* Holds strings of p to lengths [min, max] (code points; max MMRT_JSON_PATTERN_UNBOUNDED:
 * none), building the window when both bind and taking it out of *budget.
 * MMRT_ERR_INVALID_ARG when no string the pattern matches has such a length; MMRT_ERR_LIMIT
 * when the window would pass the budget. */
mmrt_status mmrt_json_pattern_lengths(struct mmrt_json_pattern *p, uint32_t min, uint32_t max,
                                      struct mmrt_json_pattern_budget *budget,
                                      struct mmrt_error *err);

void mmrt_json_pattern_free(struct mmrt_json_pattern *p);

/* The state after code point cp from state s, or MMRT_JSON_PATTERN_DEAD. */
uint16_t mmrt_json_pattern_step(const struct mmrt_json_pattern *p, uint16_t s, uint32_t cp);

/* Whether some code point of [lo, hi] leads from s to a state that fits with done
 * characters read (for a \u escape read in part: which code points its digits so far still
 * allow). */
int mmrt_json_pattern_any(const struct mmrt_json_pattern *p, uint16_t s, uint32_t lo,
                          uint32_t hi, uint32_t done);

#endif
