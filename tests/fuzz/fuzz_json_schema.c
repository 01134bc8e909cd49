/*
 * tests/fuzz/fuzz_json_schema.c — libFuzzer target for the JSON-schema answers: the schema
 * compiler (core/json_schema.c), the pattern compiler (core/json_pattern.c) and the
 * recogniser that holds an answer to them (core/json_grammar.c). A schema comes from a
 * request body, so each is a reader of outside data.
 *
 * The input is a schema, then optionally a NUL and a document. A refused schema must carry
 * an invalid-argument, limit or memory status and one line of text. An accepted one is
 * walked with the document byte by byte: every byte is fed to a copy first and then to the
 * state itself, and the two must agree; whenever the state says the document is whole, the
 * bytes so far must be JSON jansson reads, if they are UTF-8 (the recogniser is fed token
 * texts, which are; it does not check a string's bytes itself). The input is also tried as a bare pattern.
 *
 * The same entry point is linked into the normal build with replay_main.c, so the committed
 * corpus (tests/fuzz/corpus/json_schema) runs as a ctest everywhere.
 */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "formats/tokenizer.h"
#include "fuzz_check.h"
#include "json_grammar.h"
#include "json_pattern.h"
#include "json_schema.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void refused_well(mmrt_status st, const struct mmrt_error *err)
{
    CHECK(st == MMRT_ERR_INVALID_ARG || st == MMRT_ERR_LIMIT || st == MMRT_ERR_NO_MEMORY);
    fuzz_check_message(err);
}

static void walk(const struct mmrt_json_schema *s, const char *doc, size_t n)
{
    struct mmrt_json_grammar g, h;
    mmrt_json_grammar_init(&g, s);
    for (size_t i = 0; i < n; i++) {
        mmrt_json_grammar_copy(&h, &g);
        const bool a = mmrt_json_grammar_feed(&h, doc + i, 1);
        const bool b = mmrt_json_grammar_feed(&g, doc + i, 1);
        CHECK(a == b);
        if (!b)
            return;
        CHECK(g.depth <= MMRT_JSON_MAX_DEPTH);
        size_t bad;
        if (mmrt_json_grammar_done(&g) && mmrt_utf8_valid(doc, i + 1, &bad)) {
            json_error_t je;
            json_t *v = json_loadb(doc, i + 1, JSON_DECODE_ANY | JSON_ALLOW_NUL, &je);
            CHECK(v != NULL);
            json_decref(v);
        }
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *text = (const char *)data;
    const char *nul = memchr(text, '\0', size);
    const size_t schema_len = nul ? (size_t)(nul - text) : size;
    struct mmrt_json_schema *s = NULL;
    struct mmrt_error err = { 0 };
    const mmrt_status st = mmrt_json_schema_parse(text, schema_len, &s, &err);
    if (st != MMRT_OK) {
        refused_well(st, &err);
    } else {
        CHECK(s && s->root < s->n_nodes);
        if (nul)
            walk(s, nul + 1, size - schema_len - 1);
        mmrt_json_schema_free(s);
    }
    struct mmrt_json_pattern p;
    memset(&err, 0, sizeof err);
    const mmrt_status ps = mmrt_json_pattern_compile(text, schema_len, &p, &err);
    if (ps != MMRT_OK) {
        refused_well(ps, &err);
        return 0;
    }
    CHECK(p.n_states >= 1 && p.n_classes >= 1 && p.start[0] == 0 &&
          p.start[p.n_classes] == 0x110000);
    CHECK(p.shortest[0] != MMRT_JSON_PATTERN_UNBOUNDED);
    /* Every state a step reaches can still reach a match. */
    uint16_t state = 0;
    for (size_t i = 0; nul && i < size - schema_len - 1; i++) {
        const uint16_t t = mmrt_json_pattern_step(&p, state, (unsigned char)nul[1 + i]);
        if (t == MMRT_JSON_PATTERN_DEAD)
            break;
        CHECK(t < p.n_states && p.shortest[t] != MMRT_JSON_PATTERN_UNBOUNDED);
        CHECK(p.longest[t] >= p.shortest[t]);
        state = t;
    }
    mmrt_json_pattern_free(&p);
    return 0;
}
