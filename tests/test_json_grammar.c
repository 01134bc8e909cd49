/*
 * tests/test_json_grammar.c — core/json_grammar.h against a JSON parser, and
 * core/json_answer.h: which tokens fit, byte tokens by their run.
 *
 * Every text below is fed whole and cut at every byte into two feeds: a text jansson parses
 * must be accepted whole and end done; one it refuses must be refused at some byte, or end
 * not done (a valid prefix of something longer). Every prefix of a valid text is accepted.
 * Then the two bounds (depth, whitespace runs) and object-only mode.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>

#include "json_answer.h"
#include "json_grammar.h"

/* The schemas of OpenAI's two JSON modes without a schema: any value (true), any object. */
static struct mmrt_json_schema *any_schema, *object_schema;

static int make_schemas(void **state)
{
    (void)state;
    struct mmrt_error err = { 0 };
    json_t *t = json_true();
    const bool ok = mmrt_json_schema_compile(t, &any_schema, &err) == MMRT_OK &&
                    mmrt_json_schema_any_object(&object_schema, &err) == MMRT_OK;
    json_decref(t);
    return ok ? 0 : -1;
}

static int free_schemas(void **state)
{
    (void)state;
    mmrt_json_schema_free(any_schema);
    mmrt_json_schema_free(object_schema);
    return 0;
}

static const char *const valid[] = {
    "{}", "[]", "{\"a\":1}", " { \"a\" : [ 1 , 2.5 , -3e+4 , 0 , -0.0E-1 ] } ",
    "{\"k\":\"v\\\"\\\\\\/\\b\\f\\n\\r\\t\\u00e9\\uD83D\\uDE00\"}", "[true,false,null]",
    "{\"a\":{\"b\":{\"c\":[[],[{}]]}}}", "\"text\"", "true", "null", "[\"\xc3\xa9\xe2\x82\xac\"]",
    "[0.5e10,1E2,1234567890123456]", "{\"\":\"\"}", "[{\"a\":null},[],\"x\"]\n",
    "[-1,-0.25,3E-2]", "{\"a\":\"\xf0\x9f\x98\x80\"}", "[\"\\u0000\"]",
};

static const char *const invalid[] = {
    "{,}", "[1,]", "{\"a\"}", "{\"a\":}", "{a:1}", "[01]", "[1.]", "[.5]", "[1e]", "[+1]",
    "[-]", "[tru]x", "[nul]", "{\"a\":1,}", "[1 2]", "{\"a\":1 \"b\":2}", "[\"\\x\"]",
    "[\"\\u12G4\"]", "[\"a\nb\"]", "[\"tab\there\"]", "{}}", "[]]", "{} {}", "[1]x",
    "{\"a\":1]", "[1}", "[True]", "[\"unterminated", "{\"a\":[1,2}", "[--1]", "[1e+-2]",
    "[0x10]", "[Infinity]", "[NaN]", "'a'",
};

/* Feeds text cut at `cut` into two feeds; returns whether both succeeded. */
static bool feed_cut(const char *text, size_t cut, bool object_only, bool *done)
{
    struct mmrt_json_grammar g;
    mmrt_json_grammar_init(&g, object_only ? object_schema : any_schema);
    const size_t n = strlen(text);
    bool ok = mmrt_json_grammar_feed(&g, text, cut) &&
              mmrt_json_grammar_feed(&g, text + cut, n - cut);
    *done = ok && mmrt_json_grammar_done(&g);
    return ok;
}

static bool jansson_accepts(const char *text)
{
    json_error_t e;
    json_t *v = json_loads(text, JSON_DECODE_ANY | JSON_ALLOW_NUL, &e);
    json_decref(v);
    return v != NULL;
}

static void test_against_a_parser(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof valid / sizeof *valid; i++) {
        const char *t = valid[i];
        if (!jansson_accepts(t))
            fail_msg("the corpus's valid text %zu is not JSON to jansson: %s", i, t);
        for (size_t cut = 0; cut <= strlen(t); cut++) {
            bool done;
            if (!feed_cut(t, cut, false, &done) || !done)
                fail_msg("valid text %zu cut at %zu: %s", i, cut, t);
            /* every prefix is accepted */
            struct mmrt_json_grammar g;
            mmrt_json_grammar_init(&g, any_schema);
            if (!mmrt_json_grammar_feed(&g, t, cut))
                fail_msg("prefix %zu of valid text %zu refused: %s", cut, i, t);
        }
    }
    for (size_t i = 0; i < sizeof invalid / sizeof *invalid; i++) {
        const char *t = invalid[i];
        if (jansson_accepts(t))
            fail_msg("the corpus's invalid text %zu is JSON to jansson: %s", i, t);
        bool done;
        if (feed_cut(t, strlen(t) / 2, false, &done) && done)
            fail_msg("invalid text %zu accepted as whole JSON: %s", i, t);
    }
}

/* A top-level number is whole only once something ends it; a literal when spelled out. */
static void test_done(void **state)
{
    (void)state;
    struct mmrt_json_grammar g;
    mmrt_json_grammar_init(&g, any_schema);
    assert_true(mmrt_json_grammar_feed(&g, "12", 2));
    assert_false(mmrt_json_grammar_done(&g));
    assert_true(mmrt_json_grammar_feed(&g, " ", 1));
    assert_true(mmrt_json_grammar_done(&g));
    assert_false(mmrt_json_grammar_feed(&g, "3", 1));
    mmrt_json_grammar_init(&g, any_schema);
    assert_true(mmrt_json_grammar_feed(&g, "fals", 4));
    assert_false(mmrt_json_grammar_done(&g));
    assert_true(mmrt_json_grammar_feed(&g, "e", 1));
    assert_true(mmrt_json_grammar_done(&g));
    mmrt_json_grammar_init(&g, any_schema);
    assert_true(mmrt_json_grammar_feed(&g, "{\"a\":[1]", 8));
    assert_false(mmrt_json_grammar_done(&g));
    assert_true(mmrt_json_grammar_feed(&g, "}", 1));
    assert_true(mmrt_json_grammar_done(&g));
}

/* object_only: an object and nothing else at the top. */
static void test_object_only(void **state)
{
    (void)state;
    static const char *const not_objects[] = { "[]", "\"s\"", "1", "true", "null" };
    for (size_t i = 0; i < sizeof not_objects / sizeof *not_objects; i++) {
        bool done;
        assert_false(feed_cut(not_objects[i], 0, true, &done));
    }
    bool done;
    assert_true(feed_cut(" {\"a\":[1,{\"b\":null}]} \n", 3, true, &done));
    assert_true(done);
    /* one whitespace byte before the top-level value, no more */
    assert_false(feed_cut("  {}", 1, true, &done));
    assert_false(feed_cut("\n\t[]", 0, false, &done));
}

/* Nesting to MMRT_JSON_MAX_DEPTH and no further; whitespace runs to MMRT_JSON_MAX_SPACE. */
static void test_bounds(void **state)
{
    (void)state;
    char deep[2 * MMRT_JSON_MAX_DEPTH + 3];
    for (int i = 0; i < MMRT_JSON_MAX_DEPTH; i++)
        deep[i] = '[', deep[2 * MMRT_JSON_MAX_DEPTH - 1 - i] = ']';
    deep[2 * MMRT_JSON_MAX_DEPTH] = '\0';
    bool done;
    assert_true(feed_cut(deep, MMRT_JSON_MAX_DEPTH, false, &done) && done);
    struct mmrt_json_grammar g;
    mmrt_json_grammar_init(&g, any_schema);
    assert_true(mmrt_json_grammar_feed(&g, deep, MMRT_JSON_MAX_DEPTH));
    assert_false(mmrt_json_grammar_feed(&g, "[", 1));
    mmrt_json_grammar_init(&g, any_schema);
    assert_true(mmrt_json_grammar_feed(&g, deep, MMRT_JSON_MAX_DEPTH));
    assert_false(mmrt_json_grammar_feed(&g, "{", 1));

    char spaces[MMRT_JSON_MAX_SPACE + 2];
    memset(spaces, ' ', sizeof spaces);
    mmrt_json_grammar_init(&g, object_schema);
    assert_true(mmrt_json_grammar_feed(&g, "{", 1));
    assert_true(mmrt_json_grammar_feed(&g, spaces, MMRT_JSON_MAX_SPACE));
    struct mmrt_json_grammar h = g;
    assert_false(mmrt_json_grammar_feed(&h, " ", 1));
    assert_true(mmrt_json_grammar_feed(&g, "\"a\":", 4)); /* a new run after a token */
    assert_true(mmrt_json_grammar_feed(&g, spaces, MMRT_JSON_MAX_SPACE));
    /* inside a string, spaces are text */
    assert_true(mmrt_json_grammar_feed(&g, "\"", 1));
    assert_true(mmrt_json_grammar_feed(&g, spaces, sizeof spaces));
    assert_true(mmrt_json_grammar_feed(&g, "\"}", 2));
    assert_true(mmrt_json_grammar_done(&g));
}

/* A hand-made vocabulary: token i's text and byte (−1: not a byte token), special flag. */
static const struct {
    const char *text;
    int byte;
    bool special;
} vocab[] = {
    { "{", -1, false }, { "\"", -1, false }, { "}", -1, false }, { "\"", 0x22, false },
    { "\xef\xbf\xbd", 0xe4, false }, { "\xef\xbf\xbd", 0xb8, false },
    { "\xef\xbf\xbd", 0xad, false }, { "</s>", -1, true }, { "a", -1, false }, { "", -1, false },
    { "\xef\xbf\xbd", 0xe0, false }, { "\xef\xbf\xbd", 0x80, false }, { " :", -1, false },
};
enum { T_OPEN, T_QUOTE, T_CLOSE, T_BYTE_QUOTE, T_E4, T_B8, T_AD, T_EOS, T_A, T_EMPTY, T_E0,
       T_80, T_COLON, N_VOCAB };

/* The table of `vocab`, in storage of its own. */
struct fake_texts {
    struct mmrt_token_texts t;
    char blob[64];
    uint32_t off[N_VOCAB + 1];
    int16_t byte[N_VOCAB];
    uint8_t special[N_VOCAB];
};

static void make_texts(struct fake_texts *f)
{
    uint32_t o = 0;
    for (int i = 0; i < N_VOCAB; i++) {
        f->off[i] = o;
        memcpy(f->blob + o, vocab[i].text, strlen(vocab[i].text));
        o += (uint32_t)strlen(vocab[i].text);
        f->byte[i] = (int16_t)vocab[i].byte;
        f->special[i] = vocab[i].special;
    }
    f->off[N_VOCAB] = o;
    f->t = (struct mmrt_token_texts){ .blob = f->blob, .off = f->off, .byte = f->byte,
                                      .special = f->special, .n = N_VOCAB };
}

/* Feeds ids one by one; false at the first that does not fit. */
static bool take(struct mmrt_json_answer *a, const struct mmrt_token_texts *t, const int *ids,
                 int n)
{
    for (int i = 0; i < n; i++) {
        struct mmrt_json_answer next;
        if (!mmrt_json_answer_fits(a, t, NULL, ids[i], &next))
            return false;
        mmrt_json_answer_copy(a, &next);
    }
    return true;
}

/* A byte token's quote closes a string only when its run is clean: alone, after a whole
 * character, or after a token that is not a byte; not after a pending lead byte, a stray
 * continuation byte or an overlong start. */
static void test_answer_byte_runs(void **state)
{
    (void)state;
    struct fake_texts f;
    make_texts(&f);
    const struct mmrt_token_texts t = f.t;
    static const struct {
        int ids[6], n;
        bool closes;
    } cases[] = {
        { { T_BYTE_QUOTE }, 1, true },
        { { T_E4, T_BYTE_QUOTE }, 2, false },
        { { T_E4, T_B8, T_AD, T_BYTE_QUOTE }, 4, true },
        { { T_E4, T_A, T_BYTE_QUOTE }, 3, true },
        { { T_B8, T_BYTE_QUOTE }, 2, false },
        { { T_B8, T_A, T_BYTE_QUOTE }, 3, true },
        { { T_E0, T_80, T_80, T_BYTE_QUOTE }, 4, false },
        { { T_E4, T_QUOTE }, 2, true }, /* a plain quote ends the run, and the string */
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        struct mmrt_json_answer a;
        mmrt_json_answer_init(&a, object_schema);
        assert_true(take(&a, &t, (const int[]){ T_OPEN, T_QUOTE }, 2));
        assert_true(take(&a, &t, cases[i].ids, cases[i].n));
        /* closed: the key is followed by ':'; still open: ':' is text and fits too, so
         * tell them apart by what a closing brace does (text in a string, wrong after a
         * key) */
        struct mmrt_json_answer next;
        if (mmrt_json_answer_fits(&a, &t, NULL, T_CLOSE, &next) == cases[i].closes)
            fail_msg("case %zu: the string is %s", i, cases[i].closes ? "open" : "closed");
        if (cases[i].closes)
            assert_true(take(&a, &t, (const int[]){ T_COLON, T_QUOTE, T_A, T_QUOTE, T_CLOSE },
                             5));
        assert_int_equal(mmrt_json_answer_done(&a), cases[i].closes);
    }
}

/* Special and empty tokens never fit, nor ids past the table; the mask keeps the logits of
 * the tokens that fit. */
static void test_answer_mask(void **state)
{
    (void)state;
    struct fake_texts f;
    make_texts(&f);
    const struct mmrt_token_texts t = f.t;
    struct mmrt_json_answer a, next;
    mmrt_json_answer_init(&a, object_schema);
    float logits[N_VOCAB + 2], masked[N_VOCAB + 2];
    for (int i = 0; i < N_VOCAB + 2; i++)
        logits[i] = (float)i;
    assert_true(mmrt_json_answer_mask(&a, &t, NULL, logits, N_VOCAB + 2, masked));
    for (int i = 0; i < N_VOCAB + 2; i++) {
        const bool fits = i == T_OPEN;
        assert_true(fits ? masked[i] == logits[i] : isinf(masked[i]) && masked[i] < 0);
    }
    assert_true(take(&a, &t, (const int[]){ T_OPEN, T_QUOTE }, 2));
    assert_false(mmrt_json_answer_fits(&a, &t, NULL, T_EOS, &next));
    assert_false(mmrt_json_answer_fits(&a, &t, NULL, T_EMPTY, &next));
    assert_false(mmrt_json_answer_fits(&a, &t, NULL, N_VOCAB, &next));
    assert_true(mmrt_json_answer_fits(&a, &t, NULL, T_A, &next));
    /* Only −inf logits among the tokens that fit: nothing to choose. */
    for (int i = 0; i < N_VOCAB; i++)
        logits[i] = i == T_EOS ? 0.0f : -INFINITY;
    mmrt_json_answer_init(&a, object_schema);
    assert_false(mmrt_json_answer_mask(&a, &t, NULL, logits, N_VOCAB, masked));
}

/* Whether two states are the same: the fixed part and the open frames (the frames past
 * them are never copied). */
static bool same_grammar(const struct mmrt_json_grammar *a, const struct mmrt_json_grammar *b)
{
    return a->depth == b->depth &&
           memcmp(a, b, offsetof(struct mmrt_json_grammar, frame) +
                            a->depth * sizeof a->frame[0]) == 0;
}

/* The plain flags change nothing but the work: for every token of a real vocabulary (the
 * Llama 3 and LLaMA fixtures' tokenizers) at states inside and outside strings, in a clean
 * run and after a pending byte, fits with the flags equals fits without them, state and
 * all. */
static void test_answer_plain_flags(void **state)
{
    (void)state;
    static const char *const files[] = { "tokenizer_llama3.json", "tokenizer_llama.json" };
    static const char *const prefixes[] = { "", "{", "{\"k", "{\"k\":", "{\"k\":\"v a",
                                            "{\"k\":[1,\"x\\", "{\"k\":\"\\u00" };
    for (size_t f = 0; f < sizeof files / sizeof *files; f++) {
        char path[4096];
        const char *root = getenv("MMRT_SOURCE_DIR"); /* ctest runs in the source tree */
        snprintf(path, sizeof path, "%s%stests/fixtures/tokenizer/%s", root ? root : "",
                 root ? "/" : "", files[f]);
        struct mmrt_tokenizer *tok = NULL;
        struct mmrt_error err = { 0 };
        assert_int_equal(mmrt_tokenizer_load(path, NULL, &tok, &err), MMRT_OK);
        struct mmrt_token_texts t;
        assert_int_equal(mmrt_tokenizer_token_texts(tok, &t, &err), MMRT_OK);
        uint8_t *plain = malloc(t.n);
        assert_non_null(plain);
        mmrt_json_answer_plain(&t, plain);
        int n_plain = 0;
        for (uint32_t id = 0; id < t.n; id++)
            n_plain += plain[id];
        assert_true(n_plain > (int)t.n / 4); /* most pieces are plain text */
        const int32_t lead = mmrt_tokenizer_token_to_id(tok, "<0xE4>", 6);
        for (size_t k = 0; k < sizeof prefixes / sizeof *prefixes; k++) {
            for (int pending = 0; pending < 1 + (lead >= 0); pending++) {
                struct mmrt_json_answer a, n1, n2;
                mmrt_json_answer_init(&a, object_schema);
                assert_true(mmrt_json_grammar_feed(&a.grammar, prefixes[k],
                                                   strlen(prefixes[k])));
                if (pending && !mmrt_json_answer_fits(&a, &t, NULL, lead, &n1))
                    continue; /* a lead byte only fits in a string */
                if (pending)
                    mmrt_json_answer_copy(&a, &n1);
                for (uint32_t id = 0; id < t.n; id++) {
                    const bool f1 = mmrt_json_answer_fits(&a, &t, plain, (int32_t)id, &n1);
                    const bool f2 = mmrt_json_answer_fits(&a, &t, NULL, (int32_t)id, &n2);
                    if (f1 != f2 || (f1 && (!same_grammar(&n1.grammar, &n2.grammar) ||
                                            memcmp(&n1.run, &n2.run, sizeof n1.run) != 0 ||
                                            n1.run_bad != n2.run_bad)))
                        fail_msg("%s, prefix '%s', pending %d, token %u: %d with the flags, "
                                 "%d without", files[f], prefixes[k], pending, id, f1, f2);
                }
            }
        }
        free(plain);
        mmrt_token_texts_free(&t);
        mmrt_tokenizer_destroy(tok);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_against_a_parser),
        cmocka_unit_test(test_done),
        cmocka_unit_test(test_object_only),
        cmocka_unit_test(test_bounds),
        cmocka_unit_test(test_answer_byte_runs),
        cmocka_unit_test(test_answer_mask),
        cmocka_unit_test(test_answer_plain_flags),
    };
    return cmocka_run_group_tests(tests, make_schemas, free_schemas);
}
