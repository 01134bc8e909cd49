/*
 * tests/test_schema_cache.c — compiled JSON schemas kept by their text (core/schema_cache.h):
 * a text is compiled once while it is kept, holders outlive the cache's entry, texts that
 * do not compile are never kept, both bounds evict the least recently used, threads share
 * entries safely, and a runtime compiles a request's schema once for its checks and its
 * sequences.
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "golden.h"
#include "json_grammar.h"
#include "schema_cache.h"

static const char *const TEXTS[] = {
    "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}},\"required\":[\"a\"]}",
    "{\"type\":\"array\",\"items\":{\"enum\":[\"x\",\"y\"]},\"maxItems\":3}",
    "{\"type\":\"string\",\"pattern\":\"^[a-c]+$\",\"minLength\":1,\"maxLength\":4}",
    "{\"type\":\"number\",\"minimum\":0,\"maximum\":1}",
    "{\"enum\":[1,2,3]}",
};
#define N_TEXTS (int)(sizeof TEXTS / sizeof TEXTS[0])

static struct mmrt_schema_cache_stats stats(struct mmrt_schema_cache *c)
{
    struct mmrt_schema_cache_stats s;
    mmrt_schema_cache_get_stats(c, &s);
    return s;
}

static struct mmrt_json_schema *get(struct mmrt_schema_cache *c, const char *text)
{
    struct mmrt_json_schema *s = NULL;
    struct mmrt_error e = { 0 };
    if (mmrt_schema_cache_get(c, text, text ? strlen(text) : 0, &s, &e) != MMRT_OK)
        fail_msg("%s: %s", text ? text : "(json_object)", e.msg);
    assert_non_null(s);
    return s;
}

/* Whether doc is a whole document of s (the grammar walks it byte by byte). */
static bool admits(const struct mmrt_json_schema *s, const char *doc)
{
    struct mmrt_json_grammar g;
    mmrt_json_grammar_init(&g, s);
    return mmrt_json_grammar_feed(&g, doc, strlen(doc)) && mmrt_json_grammar_done(&g);
}

static void test_compiled_once(void **state)
{
    (void)state;
    struct mmrt_schema_cache *c = NULL;
    struct mmrt_error e = { 0 };
    assert_int_equal(mmrt_schema_cache_create(0, 0, &c, &e), MMRT_OK);
    struct mmrt_json_schema *a = get(c, TEXTS[0]), *b = get(c, TEXTS[0]);
    assert_ptr_equal(a, b);
    assert_int_equal(stats(c).compiles, 1);
    assert_int_equal(stats(c).lookups, 2);
    assert_true(admits(a, "{\"a\":12}"));
    assert_false(admits(a, "{\"a\":1.5}"));
    /* json_object is a key of its own, not the text "{\"type\":\"object\"}" */
    struct mmrt_json_schema *o1 = get(c, NULL), *o2 = get(c, NULL);
    assert_ptr_equal(o1, o2);
    assert_ptr_not_equal(o1, a);
    assert_true(admits(o1, "{\"k\":[1,true]}"));
    assert_false(admits(o1, "[1]"));
    /* another text of the same schema is another entry */
    struct mmrt_json_schema *spaced = get(c, "{ \"enum\": [1, 2, 3] }"), *tight = get(c, TEXTS[4]);
    assert_ptr_not_equal(spaced, tight);
    assert_int_equal(stats(c).compiles, 4);
    assert_int_equal(stats(c).entries, 4);
    /* the holds outlive the cache */
    mmrt_schema_cache_destroy(c);
    assert_true(admits(b, "{\"a\":-3}"));
    assert_true(admits(spaced, "2") && admits(tight, "3"));
    for (struct mmrt_json_schema **p = (struct mmrt_json_schema *[]){ a, b, o1, o2, spaced,
                                                                        tight, NULL };
         *p; p++)
        mmrt_json_schema_free(*p);
}

static void test_failures_not_kept(void **state)
{
    (void)state;
    struct mmrt_schema_cache *c = NULL;
    struct mmrt_error e = { 0 };
    assert_int_equal(mmrt_schema_cache_create(0, 0, &c, &e), MMRT_OK);
    static const char *const bad[] = { "{\"type\":\"number\",\"multipleOf\":0.1}", "{\"type\":",
                                       "false" };
    for (int round = 0; round < 2; round++)
        for (int i = 0; i < 3; i++) {
            struct mmrt_json_schema *s = (struct mmrt_json_schema *)&e; /* overwritten */
            e = (struct mmrt_error){ 0 };
            assert_int_equal(mmrt_schema_cache_get(c, bad[i], strlen(bad[i]), &s, &e),
                             MMRT_ERR_INVALID_ARG);
            assert_null(s);
            assert_true(e.msg[0] != '\0');
        }
    assert_int_equal(stats(c).compiles, 6);
    assert_int_equal(stats(c).entries, 0);
    assert_int_equal(stats(c).bytes, 0);
    mmrt_schema_cache_destroy(c);
}

/* At most 3 entries: the least recently used goes; a held schema stays usable. */
static void test_entry_bound(void **state)
{
    (void)state;
    struct mmrt_schema_cache *c = NULL;
    struct mmrt_error e = { 0 };
    assert_int_equal(mmrt_schema_cache_create(3, 0, &c, &e), MMRT_OK);
    struct mmrt_json_schema *held = get(c, TEXTS[0]);
    for (int i = 1; i < 3; i++)
        mmrt_json_schema_free(get(c, TEXTS[i]));
    mmrt_json_schema_free(get(c, TEXTS[0])); /* 0 is now the most recent: 1 goes next */
    mmrt_json_schema_free(get(c, TEXTS[3]));
    assert_int_equal(stats(c).entries, 3);
    assert_int_equal(stats(c).compiles, 4);
    mmrt_json_schema_free(get(c, TEXTS[0]));
    mmrt_json_schema_free(get(c, TEXTS[2]));
    assert_int_equal(stats(c).compiles, 4);
    mmrt_json_schema_free(get(c, TEXTS[1])); /* evicted: compiled again */
    assert_int_equal(stats(c).compiles, 5);
    /* 1 came back in place of 3, the least recently used; 0 was used since */
    mmrt_json_schema_free(get(c, TEXTS[3]));
    assert_int_equal(stats(c).compiles, 6);
    assert_true(admits(held, "{\"a\":0}"));
    mmrt_schema_cache_destroy(c);
    assert_true(admits(held, "{\"a\":7}"));
    mmrt_json_schema_free(held);
}

/* A byte bound below one schema keeps nothing: each lookup compiles. */
static void test_byte_bound(void **state)
{
    (void)state;
    struct mmrt_schema_cache *c = NULL;
    struct mmrt_error e = { 0 };
    assert_int_equal(mmrt_schema_cache_create(0, 64, &c, &e), MMRT_OK);
    struct mmrt_json_schema *a = get(c, TEXTS[2]), *b = get(c, TEXTS[2]);
    assert_ptr_not_equal(a, b);
    assert_int_equal(stats(c).compiles, 2);
    assert_int_equal(stats(c).entries, 0);
    assert_true(admits(a, "\"abc\"") && !admits(b, "\"abcab\""));
    mmrt_json_schema_free(a);
    mmrt_json_schema_free(b);
    mmrt_schema_cache_destroy(c);
    /* A bound of two small schemas' bytes holds two of them. */
    assert_int_equal(mmrt_schema_cache_create(0, 0, &c, &e), MMRT_OK);
    struct mmrt_json_schema *s3 = get(c, TEXTS[3]), *s4 = get(c, TEXTS[4]);
    const size_t two = stats(c).bytes;
    mmrt_json_schema_free(s3);
    mmrt_json_schema_free(s4);
    mmrt_schema_cache_destroy(c);
    assert_int_equal(mmrt_schema_cache_create(0, two, &c, &e), MMRT_OK);
    mmrt_json_schema_free(get(c, TEXTS[3]));
    mmrt_json_schema_free(get(c, TEXTS[4]));
    assert_int_equal(stats(c).entries, 2);
    mmrt_json_schema_free(get(c, TEXTS[0])); /* past the bound: the oldest goes */
    assert_true(stats(c).bytes <= two);
    assert_true(stats(c).entries < 3);
    mmrt_schema_cache_destroy(c);
}

struct worker {
    struct mmrt_schema_cache *c;
    int seed, failures;
};

static void *hammer(void *arg)
{
    struct worker *w = arg;
    for (int i = 0; i < 400; i++) {
        const int k = (w->seed * 7 + i * 3) % (N_TEXTS + 1);
        const char *text = k < N_TEXTS ? TEXTS[k] : NULL;
        struct mmrt_json_schema *s = NULL;
        struct mmrt_error e = { 0 };
        if (mmrt_schema_cache_get(w->c, text, text ? strlen(text) : 0, &s, &e) != MMRT_OK) {
            w->failures++;
            continue;
        }
        w->failures += k == 0 && !admits(s, "{\"a\":5}");
        mmrt_json_schema_free(s);
    }
    return NULL;
}

/* Four threads over six keys and a bound of four entries: every lookup answers, and the
 * holds all come back (ASan's leak check sees the rest). */
static void test_threads(void **state)
{
    (void)state;
    struct mmrt_schema_cache *c = NULL;
    struct mmrt_error e = { 0 };
    assert_int_equal(mmrt_schema_cache_create(4, 0, &c, &e), MMRT_OK);
    pthread_t t[4];
    struct worker w[4];
    for (int i = 0; i < 4; i++) {
        w[i] = (struct worker){ c, i, 0 };
        assert_int_equal(pthread_create(&t[i], NULL, hammer, &w[i]), 0);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(t[i], NULL);
        assert_int_equal(w[i].failures, 0);
    }
    assert_int_equal(stats(c).lookups, 1600);
    assert_true(stats(c).entries <= 4);
    mmrt_schema_cache_destroy(c);
}

/* Through a runtime: a json_schema request compiles its schema once for the check at
 * submission and its sequence, and not again when it comes back; a json_object answer
 * compiles the any-object schema once. */
static void test_runtime_compiles_once(void **state)
{
    (void)state;
    char dir[4096];
    golden_fixture_path(dir, sizeof dir, "llava-tiny");
    struct mmrt_device_config dev = { .name = "c", .plugin = "cpu", .pool_mb = 64 };
    struct mmrt_config cfg = { .struct_size = sizeof cfg, .model_path = dir, .devices = &dev,
                               .n_devices = 1 };
    struct mmrt_runtime *rt = NULL;
    char err[1024];
    if (mmrt_create(&cfg, &rt, err, sizeof err) != MMRT_OK)
        fail_msg("%s", err);
    struct mmrt_runtime_stats s0 = { .struct_size = sizeof s0 }, s1 = s0, s2 = s0;
    assert_int_equal(mmrt_stats(rt, &s0), MMRT_OK);
    struct mmrt_request r = { .struct_size = sizeof r, .prompt = "Answer.", .max_tokens = 6,
                              .top_p = 1.0f, .response_format = MMRT_RESPONSE_JSON_SCHEMA,
                              .json_schema = TEXTS[1] };
    for (int i = 0; i < 3; i++) {
        struct mmrt_result res = { .struct_size = sizeof res };
        if (mmrt_run(rt, &r, NULL, NULL, &res) != MMRT_OK)
            fail_msg("%s", mmrt_last_error(rt));
    }
    assert_int_equal(mmrt_stats(rt, &s1), MMRT_OK);
    assert_int_equal(s1.json_schema_compiles - s0.json_schema_compiles, 1);
    assert_int_equal(s1.json_schema_lookups - s0.json_schema_lookups, 6);
    r.response_format = MMRT_RESPONSE_JSON_OBJECT;
    r.json_schema = NULL;
    for (int i = 0; i < 2; i++) {
        struct mmrt_result res = { .struct_size = sizeof res };
        if (mmrt_run(rt, &r, NULL, NULL, &res) != MMRT_OK)
            fail_msg("%s", mmrt_last_error(rt));
    }
    assert_int_equal(mmrt_stats(rt, &s2), MMRT_OK);
    assert_int_equal(s2.json_schema_compiles - s1.json_schema_compiles, 1);
    /* A schema mmrt cannot hold an answer to is refused at submission, by its place. */
    r.response_format = MMRT_RESPONSE_JSON_SCHEMA;
    r.json_schema = "{\"type\":\"object\",\"properties\":{\"n\":{\"not\":{}}}}";
    struct mmrt_result res = { .struct_size = sizeof res };
    assert_int_equal(mmrt_run(rt, &r, NULL, NULL, &res), MMRT_ERR_INVALID_ARG);
    assert_non_null(strstr(mmrt_last_error(rt), "/properties/n/not"));
    mmrt_destroy(rt);
}

int main(void)
{
    mmrt_set_log_sink(golden_quiet, NULL, MMRT_LOG_WARN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_compiled_once),
        cmocka_unit_test(test_failures_not_kept),
        cmocka_unit_test(test_entry_bound),
        cmocka_unit_test(test_byte_bound),
        cmocka_unit_test(test_threads),
        cmocka_unit_test(test_runtime_compiles_once),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
