/*
 * core/json_answer.h — holds one sequence's answer to a JSON schema while its tokens are
 * chosen (mmrt_request.response_format = MMRT_RESPONSE_JSON_OBJECT or _JSON_SCHEMA;
 * docs/ENGINE.md "JSON answers"): which tokens may come next, given the text each adds
 * (mmrt_token_texts) and where the answer is in the document (core/json_grammar.h) and in a
 * run of ByteFallback byte tokens, whose text depends on their run.
 */
#ifndef MMRT_CORE_JSON_ANSWER_H
#define MMRT_CORE_JSON_ANSWER_H

#include <stdbool.h>
#include <stdint.h>

#include "formats/tokenizer.h"
#include "json_grammar.h"

struct mmrt_json_answer {
    struct mmrt_json_grammar grammar;
    /* The answer's current run of byte tokens: its pending character (mmrt_utf8_feed), and
     * whether the run has stopped being valid UTF-8. A token that is not a byte ends the
     * run. */
    struct mmrt_utf8_acc run;
    bool run_bad;
};

/* At the start of an answer held to schema (borrowed: it outlives the answer). */
void mmrt_json_answer_init(struct mmrt_json_answer *a, const struct mmrt_json_schema *schema);

/* *dst = *src (the grammar's open frames only). */
static inline void mmrt_json_answer_copy(struct mmrt_json_answer *dst,
                                         const struct mmrt_json_answer *src)
{
    dst->run = src->run;
    dst->run_bad = src->run_bad;
    mmrt_json_grammar_copy(&dst->grammar, &src->grammar);
}

/* plain[id] = 1 for the tokens a string holds as they are: text with no '"', '\' or byte
 * below 0x20, not empty, not special, not a byte token. Inside a string such a token always
 * fits and leaves the answer there, so the checks below take it without feeding its text
 * (most of a vocabulary: a mask pass inside a string is then a scan of these flags). */
void mmrt_json_answer_plain(const struct mmrt_token_texts *t, uint8_t *plain);

/* Whether token id may come next; *next receives the state after it. plain is
 * mmrt_json_answer_plain's flags, or NULL (every text is fed). Special tokens (an end
 * token included) and tokens with no text never fit: the answer ends when the document
 * closes.
 * The text checked is what the answer's stream will show: a byte token reads as its byte only
 * while its run is valid UTF-8 with no character pending, as U+FFFD (text only a string can
 * hold) otherwise. */
bool mmrt_json_answer_fits(const struct mmrt_json_answer *a, const struct mmrt_token_texts *t,
                           const uint8_t *plain, int32_t id, struct mmrt_json_answer *next);

/* masked[i] = logits[i] where token i fits, −INFINITY elsewhere, for i < vocab (ids past the
 * tokenizer's never fit). Returns whether any token with a finite logit fits. */
bool mmrt_json_answer_mask(const struct mmrt_json_answer *a, const struct mmrt_token_texts *t,
                           const uint8_t *plain, const float *logits, int64_t vocab,
                           float *masked);

/* Whether the document has closed. */
bool mmrt_json_answer_done(const struct mmrt_json_answer *a);

#endif
