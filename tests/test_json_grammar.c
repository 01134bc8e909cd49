/*
 * tests/test_json_grammar.c — core/json_grammar.h against a JSON parser.
 *
 * Every text below is fed whole and cut at every byte into two feeds: a text jansson parses
 * must be accepted whole and end done; one it refuses must be refused at some byte, or end
 * not done (a valid prefix of something longer). Every prefix of a valid text is accepted.
 * Then the two bounds (depth, whitespace runs) and object-only mode.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>

#include "json_grammar.h"

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
    mmrt_json_grammar_init(&g, object_only);
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
            mmrt_json_grammar_init(&g, false);
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
    mmrt_json_grammar_init(&g, false);
    assert_true(mmrt_json_grammar_feed(&g, "12", 2));
    assert_false(mmrt_json_grammar_done(&g));
    assert_true(mmrt_json_grammar_feed(&g, " ", 1));
    assert_true(mmrt_json_grammar_done(&g));
    assert_false(mmrt_json_grammar_feed(&g, "3", 1));
    mmrt_json_grammar_init(&g, false);
    assert_true(mmrt_json_grammar_feed(&g, "fals", 4));
    assert_false(mmrt_json_grammar_done(&g));
    assert_true(mmrt_json_grammar_feed(&g, "e", 1));
    assert_true(mmrt_json_grammar_done(&g));
    mmrt_json_grammar_init(&g, false);
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
    mmrt_json_grammar_init(&g, false);
    assert_true(mmrt_json_grammar_feed(&g, deep, MMRT_JSON_MAX_DEPTH));
    assert_false(mmrt_json_grammar_feed(&g, "[", 1));
    mmrt_json_grammar_init(&g, false);
    assert_true(mmrt_json_grammar_feed(&g, deep, MMRT_JSON_MAX_DEPTH));
    assert_false(mmrt_json_grammar_feed(&g, "{", 1));

    char spaces[MMRT_JSON_MAX_SPACE + 2];
    memset(spaces, ' ', sizeof spaces);
    mmrt_json_grammar_init(&g, true);
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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_against_a_parser),
        cmocka_unit_test(test_done),
        cmocka_unit_test(test_object_only),
        cmocka_unit_test(test_bounds),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
