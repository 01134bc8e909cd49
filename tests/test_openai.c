/* tests/test_openai.c — the OpenAI chat-completions module (server/openai.h, data_uri.h):
 * every accepted form of a request and every refusal (status, param and a word of the
 * message), strict base64 and data: URIs, local image paths under a temporary image_dir
 * (.., symlinks out, absolute paths outside, FIFOs), the response builders read back with
 * jansson, the status map, and an allocation-failure sweep over the parser (jansson's
 * allocations included) proving a clean error and no leak on every path. */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>

#include "alloc_fail.h"
#include "data_uri.h"
#include "openai.h"

#define MODEL "test-model"

/* A real 1×1 RGB PNG. */
static const uint8_t png_1x1[] = {
    0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a, 0x00, 0x00, 0x00, 0x0d, 0x49, 0x48, 0x44,
    0x52, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x01, 0x08, 0x02, 0x00, 0x00, 0x00, 0x90,
    0x77, 0x53, 0xde, 0x00, 0x00, 0x00, 0x0c, 0x49, 0x44, 0x41, 0x54, 0x78, 0x9c, 0x63, 0xf8,
    0xcf, 0xc0, 0x00, 0x00, 0x03, 0x01, 0x01, 0x00, 0xc9, 0xfe, 0x92, 0xef, 0x00, 0x00, 0x00,
    0x00, 0x49, 0x45, 0x4e, 0x44, 0xae, 0x42, 0x60, 0x82,
};
#define PNG_URI "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVR4nGP4z8AAAAMBAQDJ/pLvAAAAAElFTkSuQmCC"
/* JPEG magic and a few bytes: enough for the parser, which only checks the magic. */
#define JPEG_URI "data:image/jpeg;base64,/9j/4AAQSkZJRg=="

static const struct mmrt_chat_limits LIM = { .model = MODEL, .max_images = 2 };

/* A body from a template with ' for " (readable C), printf-formatted. Static buffer. */
static const char *body(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static const char *body(const char *fmt, ...)
{
    static char buf[1 << 16];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    for (char *c = buf; *c; c++)
        if (*c == '\'')
            *c = '"';
    return buf;
}

/* {"model": MODEL, "messages": [user "hi"], EXTRA}: EXTRA is more members (or ""). */
#define WITH(extra) body("{'model':'" MODEL "','messages':[{'role':'user','content':'hi'}]%s%s}", \
                         (extra)[0] ? "," : "", (extra))

static struct mmrt_chat_request parse_ok_lim(const char *b, const struct mmrt_chat_limits *lim)
{
    struct mmrt_chat_request r;
    struct mmrt_api_error e;
    mmrt_status st = mmrt_chat_request_parse(b, strlen(b), lim, &r, &e);
    if (st != MMRT_OK)
        fail_msg("refused (%d, %d %s): %s\nbody: %.300s", st, e.http_status, e.param,
                 e.message, b);
    return r;
}

static struct mmrt_chat_request parse_ok(const char *b)
{
    return parse_ok_lim(b, &LIM);
}

/* Refused with http status, param (NULL = ""), and `word` in the message; returns status. */
static mmrt_status refused_lim(const char *b, size_t len, const struct mmrt_chat_limits *lim,
                               int http, const char *param, const char *word)
{
    struct mmrt_chat_request r;
    struct mmrt_api_error e;
    mmrt_status st = mmrt_chat_request_parse(b, len, lim, &r, &e);
    if (st == MMRT_OK) {
        mmrt_chat_request_free(&r);
        fail_msg("accepted: %.300s", b);
    }
    if (e.http_status != http || strcmp(e.param, param ? param : "") != 0 ||
        !strstr(e.message, word))
        fail_msg("body %.200s\n got %d param '%s' message '%s'\nwant %d param '%s' word '%s'",
                 b, e.http_status, e.param, e.message, http, param ? param : "", word);
    assert_non_null(e.type);
    assert_string_equal(e.type, http >= 500 ? "server_error" : "invalid_request_error");
    /* a refused parse leaves the output empty, and freeing it is harmless */
    assert_int_equal(r.req.n_messages, 0);
    assert_null(r.model);
    mmrt_chat_request_free(&r);
    return st;
}

static mmrt_status refused(const char *b, int http, const char *param, const char *word)
{
    return refused_lim(b, strlen(b), &LIM, http, param, word);
}

/* ---- accepted forms ---- */

static void test_minimal(void **state)
{
    (void)state;
    struct mmrt_chat_request r = parse_ok(WITH(""));
    assert_int_equal(r.req.struct_size, sizeof(struct mmrt_request));
    assert_string_equal(r.model, MODEL);
    assert_int_equal(r.req.n_messages, 1);
    assert_string_equal(r.req.messages[0].role, "user");
    assert_string_equal(r.req.messages[0].text, "hi");
    assert_int_equal(r.req.messages[0].n_images, 0);
    assert_int_equal(r.req.n_images, 0);
    assert_null(r.req.prompt);
    assert_int_equal(r.req.max_tokens, 0);
    assert_true(r.req.temperature == 1.0f && r.req.top_p == 1.0f);
    assert_int_equal(r.req.top_k, 0);
    assert_true(r.req.repetition_penalty == 0 && r.req.presence_penalty == 0 &&
                r.req.frequency_penalty == 0); /* off */
    assert_int_equal(r.req.n_stop, 0);
    assert_false(r.stream || r.include_usage || r.seed_given);
    assert_true(r.req.seed == 0);
    assert_int_equal(r.n, 1);
    mmrt_chat_request_free(&r);
    mmrt_chat_request_free(&r); /* zeroed: a second free is a no-op */
    mmrt_chat_request_free(NULL);
}

static void test_every_field(void **state)
{
    (void)state;
    struct mmrt_chat_request r = parse_ok(WITH(
        "'max_tokens':5,'max_completion_tokens':5,'temperature':0.5,'top_p':0.25,'top_k':40,"
        "'seed':42,'stop':['a','bc'],'stream':true,'stream_options':{'include_usage':true},"
        "'n':1,'user':'u','metadata':{'k':'v'},'store':false,'service_tier':'auto',"
        "'presence_penalty':0.5,'frequency_penalty':-1.25,'repetition_penalty':1.05,"
        "'logit_bias':{},'logprobs':false,"
        "'response_format':{'type':'text'},'parallel_tool_calls':true,'tools':[],"
        "'tool_choice':'none','functions':[],'function_call':'none','modalities':['text'],"
        "'top_logprobs':0,'audio':null,'prediction':null,'web_search_options':null"));
    assert_int_equal(r.req.max_tokens, 5);
    assert_true(r.req.temperature == 0.5f && r.req.top_p == 0.25f);
    assert_int_equal(r.req.top_k, 40);
    assert_true(r.req.presence_penalty == 0.5f && r.req.frequency_penalty == -1.25f &&
                r.req.repetition_penalty == 1.05f);
    assert_true(r.req.seed == 42 && r.seed_given);
    assert_int_equal(r.req.n_stop, 2);
    assert_string_equal(r.req.stop[0], "a");
    assert_string_equal(r.req.stop[1], "bc");
    assert_true(r.stream && r.include_usage);
    assert_int_equal(r.req.logprobs, 0);
    assert_int_equal(r.req.n_logit_bias, 0);
    assert_int_equal(r.n, 1);
    mmrt_chat_request_free(&r);
    /* n: each choice a sequence of its own, up to MMRT_CHAT_MAX_CHOICES */
    r = parse_ok(WITH("'n':3"));
    assert_int_equal(r.n, 3);
    mmrt_chat_request_free(&r);
    r = parse_ok(WITH("'n':16"));
    assert_int_equal(r.n, MMRT_CHAT_MAX_CHOICES);
    mmrt_chat_request_free(&r);

    /* Log-probabilities and biases, as OpenAI's clients send them. */
    r = parse_ok(WITH("'logprobs':true,'top_logprobs':20,"
                      "'logit_bias':{'0':-100,'50256':100,'7':0.5,'2147483647':-1e-3}"));
    assert_int_equal(r.req.logprobs, 1);
    assert_int_equal(r.req.top_logprobs, 20);
    assert_int_equal(r.req.n_logit_bias, 4);
    const struct mmrt_logit_bias want[4] = { { 0, -100.0f }, { 50256, 100.0f }, { 7, 0.5f },
                                             { 2147483647, -1e-3f } };
    for (int i = 0; i < 4; i++) {
        assert_int_equal(r.req.logit_bias[i].token_id, want[i].token_id);
        assert_true(r.req.logit_bias[i].bias == want[i].bias);
    }
    mmrt_chat_request_free(&r);
    r = parse_ok(WITH("'response_format':{'type':'json_object'}"));
    assert_int_equal(r.req.response_format, MMRT_RESPONSE_JSON_OBJECT);
    mmrt_chat_request_free(&r);
    r = parse_ok(WITH("'response_format':{'type':'json_schema','json_schema':{'name':'a-1',"
                      "'strict':true,'description':'d','schema':{'type':'object',"
                      "'properties':{'x':{'type':'integer'}}}}}"));
    assert_int_equal(r.req.response_format, MMRT_RESPONSE_JSON_SCHEMA);
    assert_string_equal(r.req.json_schema,
                        "{\"type\":\"object\",\"properties\":{\"x\":{\"type\":\"integer\"}}}");
    mmrt_chat_request_free(&r);
    /* The boolean schema true (any value) is handed on as the text the compiler reads. */
    r = parse_ok(WITH("'response_format':{'type':'json_schema','json_schema':{'name':'b',"
                      "'schema':true}}"));
    assert_int_equal(r.req.response_format, MMRT_RESPONSE_JSON_SCHEMA);
    assert_string_equal(r.req.json_schema, "true");
    mmrt_chat_request_free(&r);
    r = parse_ok(WITH("'response_format':{'type':'text'}"));
    assert_int_equal(r.req.response_format, MMRT_RESPONSE_TEXT);
    mmrt_chat_request_free(&r);
    r = parse_ok(WITH("'logprobs':true,'logit_bias':{}"));
    assert_int_equal(r.req.logprobs, 1);
    assert_int_equal(r.req.top_logprobs, 0);
    assert_null(r.req.logit_bias);
    mmrt_chat_request_free(&r);
}

static void test_nulls_are_absent(void **state)
{
    (void)state;
    struct mmrt_chat_request r = parse_ok(WITH(
        "'max_tokens':null,'max_completion_tokens':null,'temperature':null,'top_p':null,"
        "'top_k':null,'seed':null,'stop':null,'stream':null,'stream_options':null,'n':null,"
        "'user':null,'metadata':null,'store':null,'service_tier':null,'presence_penalty':null,"
        "'frequency_penalty':null,'repetition_penalty':null,'logit_bias':null,'logprobs':null,"
        "'top_logprobs':null,'response_format':null,"
        "'parallel_tool_calls':null,'tools':null,'tool_choice':null,'functions':null,"
        "'function_call':null,'modalities':null"));
    assert_true(r.req.temperature == 1.0f && r.req.top_p == 1.0f && !r.seed_given);
    assert_int_equal(r.req.max_tokens, 0);
    assert_false(r.stream);
    mmrt_chat_request_free(&r);
    /* stream_options may be null without stream; include_usage false is fine */
    r = parse_ok(WITH("'stream':true,'stream_options':{}"));
    assert_true(r.stream && !r.include_usage);
    mmrt_chat_request_free(&r);
    r = parse_ok(WITH("'stream':false"));
    mmrt_chat_request_free(&r);
    r = parse_ok(WITH("'stop':[]"));
    assert_int_equal(r.req.n_stop, 0);
    mmrt_chat_request_free(&r);
    r = parse_ok(WITH("'stop':'END'"));
    assert_int_equal(r.req.n_stop, 1);
    assert_string_equal(r.req.stop[0], "END");
    mmrt_chat_request_free(&r);
}

static void test_roles_and_turns(void **state)
{
    (void)state;
    struct mmrt_chat_request r = parse_ok(body(
        "{'model':'" MODEL "','messages':[{'role':'system','content':'s'},"
        "{'role':'developer','content':[{'type':'text','text':'d'}]},"
        "{'role':'user','content':'u1','name':'bob'},"
        "{'role':'assistant','content':'a1','name':'x','refusal':null,'tool_calls':[]},"
        "{'role':'user','content':''}]}"));
    assert_int_equal(r.req.n_messages, 5);
    const char *roles[] = { "system", "system", "user", "assistant", "user" };
    const char *texts[] = { "s", "d", "u1", "a1", "" };
    for (int i = 0; i < 5; i++) {
        assert_string_equal(r.req.messages[i].role, roles[i]);
        assert_string_equal(r.req.messages[i].text, texts[i]);
    }
    mmrt_chat_request_free(&r);
    /* a system turn may end the chat (the runtime answers after it) */
    r = parse_ok(body("{'model':'" MODEL "','messages':[{'role':'system','content':'s'}]}"));
    mmrt_chat_request_free(&r);
}

static void test_parts_and_images(void **state)
{
    (void)state;
    struct mmrt_chat_request r = parse_ok(body(
        "{'model':'" MODEL "','messages':[{'role':'user','content':["
        "{'type':'text','text':'one'},{'type':'image_url','image_url':{'url':'%s'}},"
        "{'type':'text','text':'two'}]},{'role':'assistant','content':'ok'},"
        "{'role':'user','content':[{'type':'image_url','image_url':{'url':'%s','detail':'low'}}]}]}",
        PNG_URI, JPEG_URI));
    assert_int_equal(r.req.n_messages, 3);
    assert_string_equal(r.req.messages[0].text, "one\ntwo"); /* parts joined by "\n" */
    assert_int_equal(r.req.messages[0].n_images, 1);
    assert_int_equal(r.req.messages[1].n_images, 0);
    assert_null(r.req.messages[2].text);                     /* an image-only turn */
    assert_int_equal(r.req.messages[2].n_images, 1);
    assert_int_equal(r.req.n_images, 2);
    assert_null(r.req.images[0].path);
    assert_int_equal(r.req.images[0].size, sizeof png_1x1);
    assert_memory_equal(r.req.images[0].data, png_1x1, sizeof png_1x1);
    assert_int_equal(r.req.images[1].size, 10);
    assert_memory_equal(r.req.images[1].data, "\xff\xd8\xff\xe0\x00\x10JFIF", 10);
    mmrt_chat_request_free(&r);
    /* detail auto and high, upper-case scheme and type, image/jpg */
    r = parse_ok(body("{'model':'" MODEL "','messages':[{'role':'user','content':["
                      "{'type':'image_url','image_url':{'url':'DATA:IMAGE/JPG;BASE64,/9j/4A==',"
                      "'detail':'high'}},{'type':'image_url','image_url':{'url':'%s',"
                      "'detail':'auto'}}]}]}", PNG_URI));
    assert_int_equal(r.req.n_images, 2);
    assert_int_equal(r.req.images[0].size, 4);
    mmrt_chat_request_free(&r);
}

static void test_max_tokens_rules(void **state)
{
    (void)state;
    struct mmrt_chat_request r = parse_ok(WITH("'max_completion_tokens':7"));
    assert_int_equal(r.req.max_tokens, 7);
    mmrt_chat_request_free(&r);
    r = parse_ok(WITH("'max_tokens':2147483647"));
    assert_int_equal(r.req.max_tokens, INT_MAX);
    mmrt_chat_request_free(&r);
    refused(WITH("'max_tokens':3,'max_completion_tokens':4"), 400, "max_tokens", "differs");
    refused(WITH("'max_tokens':0"), 400, "max_tokens", "out of range");
    refused(WITH("'max_completion_tokens':-1"), 400, "max_completion_tokens", "out of range");
    refused(WITH("'max_tokens':2147483648"), 400, "max_tokens", "out of range");
    refused(WITH("'max_tokens':1.0"), 400, "max_tokens", "expected an integer");
    refused(WITH("'max_tokens':'5'"), 400, "max_tokens", "a string");
    /* the server's cap */
    struct mmrt_chat_limits lim = LIM;
    lim.max_tokens = 100;
    r = parse_ok_lim(WITH(""), &lim);
    assert_int_equal(r.req.max_tokens, 100);
    mmrt_chat_request_free(&r);
    r = parse_ok_lim(WITH("'max_tokens':100"), &lim);
    assert_int_equal(r.req.max_tokens, 100);
    mmrt_chat_request_free(&r);
    const char *b = WITH("'max_completion_tokens':101");
    refused_lim(b, strlen(b), &lim, 400, "max_completion_tokens", "too large");
}

/* With the checkpoint's defaults, what a request leaves out takes them; what it says wins. */
static void test_checkpoint_defaults(void **state)
{
    (void)state;
    const struct mmrt_generation_defaults qwen = {
        .has_temperature = 1, .temperature = 0.1f, .has_top_k = 1, .top_k = 1,
        .has_top_p = 1, .top_p = 0.001f, .has_repetition_penalty = 1,
        .repetition_penalty = 1.05f };
    struct mmrt_chat_limits lim = LIM;
    lim.defaults = &qwen;
    struct mmrt_chat_request r = parse_ok_lim(WITH(""), &lim);
    assert_true(r.req.temperature == 0.1f && r.req.top_k == 1 && r.req.top_p == 0.001f &&
                r.req.repetition_penalty == 1.05f);
    mmrt_chat_request_free(&r);
    r = parse_ok_lim(WITH("'temperature':0.8,'top_p':0.9,'top_k':0,'repetition_penalty':1,"
                          "'presence_penalty':0.5"), &lim);
    assert_true(r.req.temperature == 0.8f && r.req.top_k == 0 && r.req.top_p == 0.9f &&
                r.req.repetition_penalty == 1.0f && r.req.presence_penalty == 0.5f);
    mmrt_chat_request_free(&r);
    /* null is "not given": the default stays. */
    r = parse_ok_lim(WITH("'temperature':null"), &lim);
    assert_true(r.req.temperature == 0.1f);
    mmrt_chat_request_free(&r);
    /* A checkpoint that sets nothing leaves OpenAI's. */
    const struct mmrt_generation_defaults none = { 0 };
    lim.defaults = &none;
    r = parse_ok_lim(WITH(""), &lim);
    assert_true(r.req.temperature == 1.0f && r.req.top_p == 1.0f && r.req.top_k == 0 &&
                r.req.repetition_penalty == 0);
    mmrt_chat_request_free(&r);
}

static void test_sampling_values(void **state)
{
    (void)state;
    struct mmrt_chat_request r = parse_ok(WITH("'temperature':0,'top_p':1,'top_k':0"));
    assert_true(r.req.temperature == 0.0f && r.req.top_p == 1.0f);
    mmrt_chat_request_free(&r);
    r = parse_ok(WITH("'temperature':2,'top_p':1e-300"));
    assert_true(r.req.temperature == 2.0f && r.req.top_p > 0); /* kept positive as a float */
    mmrt_chat_request_free(&r);
    r = parse_ok(WITH("'seed':-1"));
    assert_true(r.req.seed == UINT64_MAX && r.seed_given); /* two's complement */
    mmrt_chat_request_free(&r);
    r = parse_ok(WITH("'seed':-9223372036854775808"));
    assert_true(r.req.seed == (uint64_t)1 << 63);
    mmrt_chat_request_free(&r);
    r = parse_ok(WITH("'seed':9223372036854775807"));
    assert_true(r.req.seed == INT64_MAX);
    mmrt_chat_request_free(&r);
    refused(WITH("'temperature':2.0001"), 400, "temperature", "out of range");
    refused(WITH("'temperature':-0.1"), 400, "temperature", "out of range");
    refused(WITH("'temperature':1e308"), 400, "temperature", "out of range");
    refused(WITH("'temperature':'hot'"), 400, "temperature", "expected a number");
    refused(WITH("'temperature':true"), 400, "temperature", "a boolean");
    refused(WITH("'top_p':0"), 400, "top_p", "greater than");
    refused(WITH("'top_p':1.5"), 400, "top_p", "out of range");
    refused(WITH("'top_p':[]"), 400, "top_p", "an array");
    refused(WITH("'top_k':-1"), 400, "top_k", "out of range");
    refused(WITH("'presence_penalty':2.01"), 400, "presence_penalty", "out of range");
    refused(WITH("'frequency_penalty':-2.5"), 400, "frequency_penalty", "out of range");
    refused(WITH("'frequency_penalty':true"), 400, "frequency_penalty", "a boolean");
    refused(WITH("'repetition_penalty':0"), 400, "repetition_penalty", "greater than");
    refused(WITH("'repetition_penalty':101"), 400, "repetition_penalty", "out of range");
    refused(WITH("'repetition_penalty':'1.1'"), 400, "repetition_penalty", "expected a number");
    r = parse_ok(WITH("'presence_penalty':-2,'frequency_penalty':2,'repetition_penalty':1e-300"));
    assert_true(r.req.presence_penalty == -2.0f && r.req.frequency_penalty == 2.0f &&
                r.req.repetition_penalty > 0); /* kept positive as a float, so not "off" */
    mmrt_chat_request_free(&r);
    refused(WITH("'top_k':4.5"), 400, "top_k", "integer");
    refused(WITH("'seed':1.5"), 400, "seed", "integer");
    refused(WITH("'seed':'1'"), 400, "seed", "integer");
    /* beyond int64 and double: jansson refuses them as JSON */
    refused(WITH("'seed':9223372036854775808"), 400, NULL, "parse the JSON");
    refused(WITH("'max_tokens':100000000000000000000000"), 400, NULL, "parse the JSON");
    refused(WITH("'temperature':1e400"), 400, NULL, "parse the JSON");
    refused(WITH("'temperature':NaN"), 400, NULL, "parse the JSON");
    refused(WITH("'temperature':Infinity"), 400, NULL, "parse the JSON");
    refused(WITH("'temperature':-"), 400, NULL, "parse the JSON");
}

static void test_stop_and_stream(void **state)
{
    (void)state;
    char big[MMRT_MAX_STOP_BYTES + 2];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    refused(WITH("'stop':''"), 400, "stop", "1 to 256");
    refused(body("{'model':'" MODEL "','messages':[{'role':'user','content':'hi'}],'stop':'%s'}",
                 big), 400, "stop", "257 bytes");
    big[MMRT_MAX_STOP_BYTES] = '\0';
    struct mmrt_chat_request r = parse_ok(body(
        "{'model':'" MODEL "','messages':[{'role':'user','content':'hi'}],'stop':['%s']}", big));
    assert_int_equal(strlen(r.req.stop[0]), MMRT_MAX_STOP_BYTES);
    mmrt_chat_request_free(&r);
    refused(WITH("'stop':['a','']"), 400, "stop[1]", "1 to 256");
    refused(WITH("'stop':['a',1]"), 400, "stop[1]", "expected a string");
    refused(WITH("'stop':5"), 400, "stop", "a string or an array");
    refused(WITH("'stop':['1','2','3','4','5','6','7','8','9','10','11','12','13','14','15',"
                 "'16','17']"), 400, "stop", "at most 16");
    r = parse_ok(WITH("'stop':['1','2','3','4','5','6','7','8','9','10','11','12','13','14',"
                      "'15','16']"));
    assert_int_equal(r.req.n_stop, MMRT_MAX_STOP);
    mmrt_chat_request_free(&r);
    refused(WITH("'stream':1"), 400, "stream", "a boolean");
    refused(WITH("'stream':'true'"), 400, "stream", "a boolean");
    refused(WITH("'stream_options':{'include_usage':true}"), 400, "stream_options",
            "only allowed when 'stream' is true");
    refused(WITH("'stream':false,'stream_options':{}"), 400, "stream_options", "only allowed");
    refused(WITH("'stream':true,'stream_options':{'include_usage':1}"), 400,
            "stream_options.include_usage", "a boolean");
    refused(WITH("'stream':true,'stream_options':{'x':1}"), 400, "stream_options.x",
            "Unrecognized key");
    refused(WITH("'stream':true,'stream_options':[]"), 400, "stream_options", "an object");
}

/* ---- refusals ---- */

static void test_model(void **state)
{
    (void)state;
    refused(body("{'messages':[{'role':'user','content':'hi'}]}"), 400, "model",
            "Missing required parameter");
    refused(body("{'model':null,'messages':[{'role':'user','content':'hi'}]}"), 400, "model",
            "Missing");
    refused(body("{'model':7,'messages':[{'role':'user','content':'hi'}]}"), 400, "model",
            "expected a string");
    struct mmrt_chat_request r;
    struct mmrt_api_error e;
    const char *b = body("{'model':'gpt-4o','messages':[{'role':'user','content':'hi'}]}");
    assert_int_equal(mmrt_chat_request_parse(b, strlen(b), &LIM, &r, &e), MMRT_ERR_NOT_FOUND);
    assert_int_equal(e.http_status, 404);
    assert_string_equal(e.code, "model_not_found");
    assert_string_equal(e.param, "model");
    assert_non_null(strstr(e.message, "gpt-4o"));
    assert_non_null(strstr(e.message, "does not exist"));
    refused(body("{'model':'test-model ','messages':[{'role':'user','content':'hi'}]}"), 404,
            "model", "does not exist");
    /* no messages with the right model: 400 on messages */
    refused(body("{'model':'" MODEL "'}"), 400, "messages", "Missing required parameter");
}

static void test_unsupported_and_unknown(void **state)
{
    (void)state;
    static const struct {
        const char *extra, *param, *word;
    } cases[] = {
        { "'n':17", "n", "n must be 1 to 16 (got 17)" },
        { "'n':0", "n", "n must be 1 to 16 (got 0)" },
        { "'n':-1", "n", "n must be 1 to 16" },
        { "'n':'1'", "n", "expected an integer" },
        { "'n':2.0", "n", "expected an integer" },
        { "'frequency_penalty':'0'", "frequency_penalty", "expected a number" },
        { "'logit_bias':[]", "logit_bias", "expected an object" },
        { "'logit_bias':{'abc':1}", "logit_bias.abc", "is not a token id" },
        { "'logit_bias':{'-1':1}", "logit_bias.-1", "is not a token id" },
        { "'logit_bias':{'05':1}", "logit_bias.05", "is not a token id" },
        { "'logit_bias':{' 5':1}", "logit_bias. 5", "is not a token id" },
        { "'logit_bias':{'2147483648':1}", "logit_bias.2147483648", "is not a token id" },
        { "'logit_bias':{'':1}", "logit_bias.", "is not a token id" },
        { "'logit_bias':{'5':100.5}", "logit_bias.5", "out of range" },
        { "'logit_bias':{'5':'1'}", "logit_bias.5", "expected a number" },
        { "'logit_bias':{'5':null}", "logit_bias.5", "expected a number" },
        { "'logprobs':0", "logprobs", "a boolean" },
        { "'top_logprobs':2", "top_logprobs", "needs 'logprobs': true" },
        { "'logprobs':false,'top_logprobs':2", "top_logprobs", "needs 'logprobs': true" },
        { "'logprobs':true,'top_logprobs':21", "top_logprobs", "out of range" },
        { "'logprobs':true,'top_logprobs':-1", "top_logprobs", "out of range" },
        { "'logprobs':true,'top_logprobs':1.0", "top_logprobs", "expected an integer" },
        { "'response_format':{'type':'json_schema','json_schema':{}}",
          "response_format.json_schema.name", "Missing" },
        { "'response_format':{'type':'json_schema'}", "response_format.json_schema", "Missing" },
        { "'response_format':{'type':'json_schema','json_schema':{'name':'x'}}",
          "response_format.json_schema.schema", "Missing" },
        { "'response_format':{'type':'json_schema','json_schema':{'name':'a b','schema':{}}}",
          "response_format.json_schema.name", "1 to 64 characters" },
        { "'response_format':{'type':'json_schema','json_schema':{'name':'x','schema':{},"
          "'strict':1}}", "response_format.json_schema.strict", "a boolean" },
        { "'response_format':{'type':'json_schema','json_schema':{'name':'x','schema':[]}}",
          "response_format.json_schema.schema", "expected an object" },
        { "'response_format':{'type':'json_schema','json_schema':{'name':'x','schema':{},"
          "'x':1}}", "response_format.json_schema.x", "Unrecognized key" },
        { "'response_format':{'type':'json_schema','json_schema':{'name':'x','schema':{"
          "'properties':{'a':{'type':'integer','multipleOf':0.5}}}}}",
          "response_format.json_schema.schema",
          "json_schema /properties/a/multipleOf: 'multipleOf' 0.5 is not supported" },
        { "'response_format':{'type':'json_schema','json_schema':{'name':'x','schema':false}}",
          "response_format.json_schema.schema", "the schema false admits no value" },
        { "'response_format':{'type':'json_object','json_schema':{}}",
          "response_format.json_schema", "Unrecognized key" },
        { "'response_format':{'type':'json_object','schema':{}}", "response_format.schema",
          "Unrecognized key" },
        { "'response_format':{'type':'xml'}", "response_format.type", "Supported values" },
        { "'response_format':{}", "response_format.type", "Missing" },
        { "'response_format':{'type':'text','x':1}", "response_format.x", "Unrecognized key" },
        { "'response_format':'text'", "response_format", "expected an object" },
        { "'tools':[{'type':'function','function':{'name':'f'}}]", "tools",
          "does not support tools" },
        { "'tools':{}", "tools", "does not support tools" },
        { "'tool_choice':'auto'", "tool_choice", "does not support tool_choice" },
        { "'functions':[{'name':'f'}]", "functions", "does not support functions" },
        { "'function_call':'auto'", "function_call", "does not support function_call" },
        { "'audio':{'voice':'alloy','format':'mp3'}", "audio", "does not support audio" },
        { "'modalities':['text','audio']", "modalities", "does not support modalities" },
        { "'modalities':[]", "modalities", "does not support modalities" },
        { "'prediction':'x'", "prediction", "expected an object" },
        { "'prediction':{'content':'x'}", "prediction.type", "Missing" },
        { "'prediction':{'type':'text','content':'x'}", "prediction.type", "expected 'content'" },
        { "'prediction':{'type':'content'}", "prediction.content", "Missing" },
        { "'prediction':{'type':'content','content':5}", "prediction.content",
          "a string or an array of text parts" },
        { "'prediction':{'type':'content','content':'x','x':1}", "prediction.x",
          "Unrecognized key" },
        { "'prediction':{'type':'content','content':[{'type':'text','text':'a'},5]}",
          "prediction.content[1]", "expected an object" },
        { "'prediction':{'type':'content','content':[{'type':'image_url','text':'a'}]}",
          "prediction.content[0].type", "expected 'text'" },
        { "'prediction':{'type':'content','content':[{'type':'text'}]}",
          "prediction.content[0].text", "Missing" },
        { "'prediction':{'type':'content','content':[{'type':'text','text':1}]}",
          "prediction.content[0].text", "expected a string" },
        { "'prediction':{'type':'content','content':[{'type':'text','text':'a','b':1}]}",
          "prediction.content[0].b", "Unrecognized key" },
        { "'web_search_options':{}", "web_search_options", "does not support" },
        { "'user':5", "user", "expected a string" },
        { "'metadata':'x'", "metadata", "expected an object" },
        { "'store':'yes'", "store", "a boolean" },
        { "'service_tier':1", "service_tier", "expected a string" },
        { "'parallel_tool_calls':1", "parallel_tool_calls", "a boolean" },
        { "'foo':1", "foo", "Unrecognized request argument supplied: foo" },
        { "'Model':'x'", "Model", "Unrecognized request argument supplied: Model" },
        { "'prompt':'hi'", "prompt", "Unrecognized request argument" },
        { "'':1", "", "Unrecognized request argument supplied: " },
        { "'foo':null", "foo", "Unrecognized request argument supplied: foo" },
        { "'best_of':null", "best_of", "Unrecognized request argument" },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        refused(WITH(cases[i].extra), 400, cases[i].param, cases[i].word);
    /* a long hostile key is cut in the message and the param */
    char key[300];
    memset(key, 'k', sizeof key - 1);
    key[sizeof key - 1] = '\0';
    struct mmrt_chat_request r;
    struct mmrt_api_error e;
    const char *b = body("{'model':'" MODEL "','messages':[],'%s':1}", key);
    assert_int_equal(mmrt_chat_request_parse(b, strlen(b), &LIM, &r, &e), MMRT_ERR_INVALID_ARG);
    assert_true(strlen(e.message) < 120 && strlen(e.param) < 60);
    assert_non_null(strstr(e.message, "..."));
}

static void test_messages(void **state)
{
    (void)state;
    static const struct {
        const char *messages, *param, *word;
    } cases[] = {
        { "[]", "messages", "empty array" },
        { "{}", "messages", "expected an array" },
        { "'hi'", "messages", "expected an array" },
        { "[1]", "messages[0]", "expected an object" },
        { "[{'content':'hi'}]", "messages[0].role", "Missing required parameter" },
        { "[{'role':null,'content':'hi'}]", "messages[0].role", "Missing" },
        { "[{'role':1,'content':'hi'}]", "messages[0].role", "expected a string" },
        { "[{'role':'User','content':'hi'}]", "messages[0].role", "Supported values" },
        { "[{'role':'tool','content':'hi','tool_call_id':'x'}]", "messages[0].role",
          "does not support messages with role 'tool'" },
        { "[{'role':'function','content':'hi','name':'f'}]", "messages[0].role",
          "does not support messages with role 'function'" },
        { "[{'role':'user'}]", "messages[0].content", "Missing required parameter" },
        { "[{'role':'user','content':null}]", "messages[0].content", "Missing" },
        { "[{'role':'user','content':5}]", "messages[0].content", "a string or an array" },
        { "[{'role':'user','content':{}}]", "messages[0].content", "a string or an array" },
        { "[{'role':'user','content':[]}]", "messages[0].content", "empty array" },
        { "[{'role':'user','content':'hi','foo':1}]", "messages[0].foo", "Unrecognized key" },
        { "[{'role':'user','content':'hi','name':5}]", "messages[0].name", "expected a string" },
        { "[{'role':'user','content':'a'},{'role':'assistant','content':null,'tool_calls':"
          "[{'id':'1','type':'function','function':{'name':'f','arguments':'{}'}}]},"
          "{'role':'user','content':'b'}]", "messages[1].tool_calls", "does not support tool_calls" },
        { "[{'role':'user','content':'a'},{'role':'assistant','content':null},"
          "{'role':'user','content':'b'}]", "messages[1].content", "Missing" },
        { "[{'role':'user','content':'a'},{'role':'assistant','function_call':{'name':'f'}},"
          "{'role':'user','content':'b'}]", "messages[1].function_call", "does not support" },
        { "[{'role':'user','content':'a','tool_call_id':'x'}]", "messages[0].tool_call_id",
          "does not support" },
        { "[{'role':'user','content':'a'},{'role':'assistant','content':'b'}]",
          "messages[1].role", "last message is an assistant turn" },
        { "[{'role':'user','content':[5]}]", "messages[0].content[0]", "expected an object" },
        { "[{'role':'user','content':[{'text':'a'}]}]", "messages[0].content[0].type",
          "Missing" },
        { "[{'role':'user','content':[{'type':1}]}]", "messages[0].content[0].type",
          "expected a string" },
        { "[{'role':'user','content':[{'type':'video'}]}]", "messages[0].content[0].type",
          "Supported values are: 'text' and 'image_url'" },
        { "[{'role':'user','content':[{'type':'input_audio','input_audio':{}}]}]",
          "messages[0].content[0].type", "does not support content parts of type 'input_audio'" },
        { "[{'role':'user','content':[{'type':'file','file':{}}]}]",
          "messages[0].content[0].type", "does not support" },
        { "[{'role':'user','content':[{'type':'text'}]}]", "messages[0].content[0].text",
          "Missing" },
        { "[{'role':'user','content':[{'type':'text','text':1}]}]",
          "messages[0].content[0].text", "expected a string" },
        { "[{'role':'user','content':[{'type':'text','text':'a','x':1}]}]",
          "messages[0].content[0].x", "Unrecognized key" },
        { "[{'role':'user','content':[{'type':'image_url'}]}]",
          "messages[0].content[0].image_url", "Missing" },
        { "[{'role':'user','content':[{'type':'image_url','image_url':'" PNG_URI "'}]}]",
          "messages[0].content[0].image_url", "expected an object" },
        { "[{'role':'user','content':[{'type':'image_url','image_url':{}}]}]",
          "messages[0].content[0].image_url.url", "Missing" },
        { "[{'role':'user','content':[{'type':'image_url','image_url':{'url':1}}]}]",
          "messages[0].content[0].image_url.url", "expected a string" },
        { "[{'role':'user','content':[{'type':'image_url','image_url':{'url':'" PNG_URI "',"
          "'detail':'ultra'}}]}]", "messages[0].content[0].image_url.detail", "'auto', 'low'" },
        { "[{'role':'user','content':[{'type':'image_url','image_url':{'url':'" PNG_URI "',"
          "'x':1}}]}]", "messages[0].content[0].image_url.x", "Unrecognized key" },
        { "[{'role':'system','content':[{'type':'image_url','image_url':{'url':'" PNG_URI "'}}]},"
          "{'role':'user','content':'hi'}]", "messages[0].content[0]",
          "only allowed in user messages" },
        { "[{'role':'user','content':'a'},{'role':'assistant','content':[{'type':'image_url',"
          "'image_url':{'url':'" PNG_URI "'}}]},{'role':'user','content':'b'}]",
          "messages[1].content[0]", "only allowed in user messages (this one is 'assistant')" },
        { "[{'role':'user','content':[{'type':'image_url','image_url':{'url':'" PNG_URI "'}},"
          "{'type':'image_url','image_url':{'url':'" PNG_URI "'}},{'type':'image_url',"
          "'image_url':{'url':'" PNG_URI "'}}]}]", "messages[0].content[2]", "too many images" },
        { "[{'role':'user','content':[{'type':'image_url','image_url':{'url':'" PNG_URI "'}}]},"
          "{'role':'user','content':[{'type':'image_url','image_url':{'url':'" PNG_URI "'}}]},"
          "{'role':'user','content':[{'type':'image_url','image_url':{'url':'" PNG_URI "'}}]}]",
          "messages[2].content[0]", "at most 2" },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        refused(body("{'model':'" MODEL "','messages':%s}", cases[i].messages), 400,
                cases[i].param, cases[i].word);
    /* a model that takes no images */
    struct mmrt_chat_limits lim = LIM;
    lim.max_images = 0;
    const char *b = body("{'model':'" MODEL "','messages':[{'role':'user','content':[{'type':"
                         "'image_url','image_url':{'url':'" PNG_URI "'}}]}]}");
    refused_lim(b, strlen(b), &lim, 400, "messages[0].content[0]", "takes no images");
    /* too many messages */
    static char many[(MMRT_CHAT_MAX_MESSAGES + 1) * 32 + 64];
    size_t o = (size_t)snprintf(many, sizeof many, "{\"model\":\"" MODEL "\",\"messages\":[");
    for (int i = 0; i <= MMRT_CHAT_MAX_MESSAGES; i++)
        o += (size_t)snprintf(many + o, sizeof many - o, "%s{\"role\":\"user\",\"content\":\"x\"}",
                              i ? "," : "");
    snprintf(many + o, sizeof many - o, "]}");
    refused(many, 400, "messages", "at most 4096");
}

static void test_image_urls(void **state)
{
    (void)state;
    static const struct {
        const char *url, *word;
    } cases[] = {
        { "http://example.com/cat.png", "never fetches" },
        { "https://example.com/cat.png", "never fetches" },
        { "HTTPS://example.com/cat.png", "never fetches" },
        { "ftp://example.com/cat.png", "unsupported URL scheme 'ftp'" },
        { "javascript:alert(1)", "unsupported URL scheme" },
        { "data:image/gif;base64,R0lGODlh", "media type 'image/gif'" },
        { "data:text/plain;base64,aGk=", "media type 'text/plain'" },
        { "data:;base64,aGk=", "media type ''" },
        { "data:image/png,abcd", "not base64" },
        { "data:image/png;charset=utf-8;base64,iVBORw0KGgo=", "parameter" },
        { "data:image/png;base64", "no ','" },
        { "data:image/png;base64,", "no data" },
        { "data:image/png;base64,iVBORw0KGgo", "not a multiple of 4" },
        { "data:image/png;base64,iVBORw0KGgo=\\n", "not a multiple of 4" },
        { "data:image/png;base64,iVBO Rw0KGgo", "' ' is not in the standard alphabet" },
        { "data:image/png;base64,iVBORw0K\\nGgo", "byte 0x0a" },
        { "data:image/png;base64,iVBORw0KGg-_", "'-' is not in the standard alphabet" },
        { "data:image/png;base64,iVBO=w0KGgo=", "padding, only at the end" },
        { "data:image/png;base64,aGk=", "not a PNG or JPEG" },
        { "data:image/jpeg;base64,iVBORw0KGgp=", "not the canonical" },
        { "data:image/png;base64,\\u00e9AA", "byte 0xc3" },
        { "file://example.com/etc/passwd", "file:///ABSOLUTE/PATH" },
        { "file:relative.png", "file:///ABSOLUTE/PATH" },
        { "/etc/passwd", "does not read local image paths" },
        { "cat.png", "does not read local image paths" },
        { "file:///etc/passwd", "does not read local image paths" },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        refused(body("{'model':'" MODEL "','messages':[{'role':'user','content':[{'type':"
                     "'image_url','image_url':{'url':'%s'}}]}]}", cases[i].url),
                400, "messages[0].content[0].image_url.url", cases[i].word);
    /* over the byte cap: 413, from the length, before decoding */
    struct mmrt_chat_limits lim = LIM;
    lim.max_image_bytes = sizeof png_1x1 - 1;
    const char *b = body("{'model':'" MODEL "','messages':[{'role':'user','content':[{'type':"
                         "'image_url','image_url':{'url':'" PNG_URI "'}}]}]}");
    struct mmrt_chat_request r;
    struct mmrt_api_error e;
    assert_int_equal(mmrt_chat_request_parse(b, strlen(b), &lim, &r, &e), MMRT_ERR_LIMIT);
    assert_int_equal(e.http_status, 413);
    assert_string_equal(e.code, "image_too_large");
    assert_string_equal(e.param, "messages[0].content[0].image_url.url");
    assert_non_null(strstr(e.message, "69 bytes, more than the 68"));
    lim.max_image_bytes = sizeof png_1x1;
    r = parse_ok_lim(b, &lim);
    mmrt_chat_request_free(&r);
}

static void test_json_level(void **state)
{
    (void)state;
    static const char *bad[] = {
        "",
        " ",
        "{",
        "{\"model\":",
        "{\"model\":\"" MODEL "\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]",
        "{\"model\":\"" MODEL "\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}x",
        "{\"model\":\"" MODEL "\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}{}",
        "{\"model\":\"" MODEL "\",\"model\":\"" MODEL "\",\"messages\":[{\"role\":\"user\","
        "\"content\":\"hi\"}]}",
        "{\"model\":\"" MODEL "\",\"messages\":[{\"role\":\"user\",\"role\":\"user\","
        "\"content\":\"hi\"}]}",
        "{'model':'x'}",
        "{\"model\":\"" MODEL "\",\"messages\":[{\"role\":\"user\",\"content\":\"h\xff\"}]}",
        "{\"model\":\"" MODEL "\",\"messages\":[{\"role\":\"user\",\"content\":\"\xc0\xaf\"}]}",
        "{\"model\":\"" MODEL "\",\"messages\":[{\"role\":\"user\",\"content\":\"\xed\xa0\x80\"}]}",
        "{\"model\":\"" MODEL "\",\"messages\":[{\"role\":\"user\",\"content\":\"a\\u0000b\"}]}",
        "{\"model\":\"" MODEL "\",\"messages\":[{\"role\":\"user\",\"content\":\"\\ud800\"}]}",
        "{\"model\":\"" MODEL "\",\"messages\":[{\"role\":\"user\",\"content\":\"a\nb\"}]}",
        "{\"model\":\"" MODEL "\",\"messages\":[{\"role\":\"user\",\"content\":\"\\x41\"}]}",
        "{\"model\":\"" MODEL "\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"},]}",
        "{\"model\":\"" MODEL "\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],}",
        "{\"model\":\"" MODEL "\" \"messages\":[]}",
        "{\"model\":\"" MODEL "\",\"messages\":[{\"role\":\"user\",\"content\":'hi'}]}",
        "{\"temperature\":01}",
        "{\"temperature\":.5}",
        "{\"temperature\":+1}",
        "\"just a string\"",
        "42",
        "null",
        "true",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        refused(bad[i], 400, NULL, "parse the JSON");
    refused("[]", 400, NULL, "an array; the OpenAI API expects a JSON object");
    refused("[{\"model\":\"" MODEL "\"}]", 400, NULL, "expects a JSON object");
    /* a NUL byte inside the body, and a NULL body */
    const char nul[] = "{\"model\":\"" MODEL "\"\0,\"messages\":[]}";
    refused_lim(nul, sizeof nul - 1, &LIM, 400, NULL, "parse the JSON");
    refused_lim(NULL, 0, &LIM, 400, NULL, "parse the JSON");
    /* depth: 16 levels pass the pre-scan (and then fail on meaning), 17 do not */
    char deep[128];
    int n = snprintf(deep, sizeof deep, "{\"model\":\"" MODEL "\",\"metadata\":");
    for (int i = 0; i < 15; i++)
        deep[n++] = '[';
    for (int i = 0; i < 15; i++)
        deep[n++] = ']';
    deep[n++] = '}';
    deep[n] = '\0';
    refused(deep, 400, "metadata", "expected an object");
    n = snprintf(deep, sizeof deep, "{\"model\":\"" MODEL "\",\"metadata\":");
    for (int i = 0; i < 16; i++)
        deep[n++] = '[';
    for (int i = 0; i < 16; i++)
        deep[n++] = ']';
    deep[n++] = '}';
    deep[n] = '\0';
    refused(deep, 400, NULL, "nested deeper than 16");
    /* a deep body a recursive parser would choke on */
    size_t big = 1 << 20;
    char *huge = malloc(big + 1);
    assert_non_null(huge);
    memset(huge, '[', big);
    huge[big] = '\0';
    refused(huge, 400, NULL, "nested deeper");
    free(huge);
    /* unusable limits are the server's fault */
    struct mmrt_chat_limits lim = LIM;
    lim.model = NULL;
    const char *b = WITH("");
    refused_lim(b, strlen(b), &lim, 500, NULL, "limits");
    lim = LIM;
    lim.max_images = -1;
    refused_lim(b, strlen(b), &lim, 500, NULL, "limits");
}

/* ---- base64 and data: URIs ---- */

static void test_base64(void **state)
{
    (void)state;
    /* decoded size from the length, 0–3 mod 4 */
    assert_int_equal(mmrt_base64_decoded_size("", 0), 0);
    assert_true(mmrt_base64_decoded_size("A", 1) == SIZE_MAX);
    assert_true(mmrt_base64_decoded_size("AA", 2) == SIZE_MAX);
    assert_true(mmrt_base64_decoded_size("AAA", 3) == SIZE_MAX);
    assert_int_equal(mmrt_base64_decoded_size("AAAA", 4), 3);
    assert_int_equal(mmrt_base64_decoded_size("AAA=", 4), 2);
    assert_int_equal(mmrt_base64_decoded_size("AA==", 4), 1);
    assert_int_equal(mmrt_base64_decoded_size("AAAAAA==", 8), 4);
    /* round trips of every length 0 … 64 */
    uint8_t data[64], out[64];
    for (size_t i = 0; i < sizeof data; i++)
        data[i] = (uint8_t)(i * 37 + 11);
    for (size_t n = 0; n <= sizeof data; n++) {
        char *s = mmrt_base64_encode(data, n);
        assert_non_null(s);
        const size_t len = strlen(s);
        assert_int_equal(len, (n + 2) / 3 * 4);
        assert_int_equal(mmrt_base64_decoded_size(s, len), n);
        size_t got = 99, bad = 0;
        assert_true(mmrt_base64_decode(s, len, out, &got, &bad));
        assert_int_equal(got, n);
        assert_memory_equal(out, data, n);
        /* cut short by 1–3 characters: refused at the length */
        for (size_t cut = 1; cut < 4 && cut <= len; cut++) {
            assert_false(mmrt_base64_decode(s, len - cut, out, &got, &bad));
            assert_int_equal(bad, len - cut);
        }
        free(s);
    }
    static const struct {
        const char *s;
        size_t bad;
    } bad_cases[] = {
        { "AA=A", 2 },      /* '=' then a character */
        { "A===", 1 },      /* three '=' */
        { "====", 0 },
        { "=AAA", 0 },
        { "AA==AAAA", 2 },  /* padding before the end */
        { "AAAA====", 4 },
        { "AB==", 1 },      /* non-canonical: B leaves bits set */
        { "AAB=", 2 },
        { "AA-A", 2 },      /* URL-safe alphabet */
        { "AA_A", 2 },
        { "AA A", 2 },      /* whitespace */
        { "AAA\n", 3 },
        { "AA\x80" "A", 2 },
        { "AAA.", 3 },
    };
    for (size_t i = 0; i < sizeof bad_cases / sizeof bad_cases[0]; i++) {
        size_t got = 0, bad = 99;
        assert_false(mmrt_base64_decode(bad_cases[i].s, strlen(bad_cases[i].s), out, &got,
                                        &bad));
        if (bad != bad_cases[i].bad)
            fail_msg("'%s': bad at %zu, want %zu", bad_cases[i].s, bad, bad_cases[i].bad);
    }
    size_t got = 0, bad = 0;
    assert_true(mmrt_base64_decode("AA==", 4, out, &got, &bad) && got == 1 && out[0] == 0);
    assert_true(mmrt_base64_decode("AAE=", 4, out, &got, &bad) && got == 2 && out[1] == 1);
    assert_true(mmrt_base64_decode("+/+/", 4, out, &got, &bad) && got == 3 && out[0] == 0xfb);
    assert_true(mmrt_base64_decode("", 0, out, &got, &bad) && got == 0);
}

static void test_data_uri(void **state)
{
    (void)state;
    struct mmrt_data_uri d;
    struct mmrt_error e;
    assert_int_equal(mmrt_data_uri_decode(PNG_URI, strlen(PNG_URI), 0, &d, &e), MMRT_OK);
    assert_int_equal(d.type, MMRT_DATA_URI_PNG);
    assert_int_equal(d.size, sizeof png_1x1);
    assert_memory_equal(d.data, png_1x1, sizeof png_1x1);
    free(d.data);
    assert_int_equal(mmrt_data_uri_decode(JPEG_URI, strlen(JPEG_URI), 10, &d, &e), MMRT_OK);
    assert_int_equal(d.type, MMRT_DATA_URI_JPEG);
    free(d.data);
    /* a PNG labelled JPEG: accepted, the decoder goes by the magic */
    const char *mis = "Data:Image/JPEG;Base64,iVBORw0KGgo=";
    assert_int_equal(mmrt_data_uri_decode(mis, strlen(mis), 0, &d, &e), MMRT_OK);
    assert_int_equal(d.type, MMRT_DATA_URI_JPEG);
    assert_int_equal(d.size, 8);
    free(d.data);
    /* the cap, exactly and one over; and a URI that is not NUL-terminated */
    assert_int_equal(mmrt_data_uri_decode(JPEG_URI, strlen(JPEG_URI), 9, &d, &e),
                     MMRT_ERR_LIMIT);
    assert_non_null(strstr(e.msg, "10 bytes, more than the 9"));
    char cut[64];
    memcpy(cut, JPEG_URI "AAAA", sizeof JPEG_URI + 3);
    assert_int_equal(mmrt_data_uri_decode(cut, strlen(JPEG_URI), 0, &d, &e), MMRT_OK);
    assert_int_equal(d.size, 10);
    free(d.data);
    static const struct {
        const char *uri;
        mmrt_status st;
    } cases[] = {
        { "", MMRT_ERR_FORMAT },
        { "data", MMRT_ERR_FORMAT },
        { "dat:image/png;base64,AAAA", MMRT_ERR_FORMAT },
        { "data:image/png;base64", MMRT_ERR_FORMAT },
        { "data:image/png", MMRT_ERR_FORMAT },
        { "data:image/png,iVBORw0KGgo=", MMRT_ERR_FORMAT },
        { "data:image/png;base64,", MMRT_ERR_FORMAT },
        { "data:image/png;base64,AAAA", MMRT_ERR_FORMAT }, /* not an image */
        { "data:image/webp;base64,UklGRg==", MMRT_ERR_UNSUPPORTED },
        { "data:image/pngx;base64,iVBORw0KGgo=", MMRT_ERR_UNSUPPORTED },
        { "data:image/png ;base64,iVBORw0KGgo=", MMRT_ERR_UNSUPPORTED },
        { "data:image/png;base64;x,iVBORw0KGgo=", MMRT_ERR_UNSUPPORTED },
        { "data:image/png;name=a.png;base64,iVBORw0KGgo=", MMRT_ERR_UNSUPPORTED },
        { "data:application/octet-stream;base64,iVBORw0KGgo=", MMRT_ERR_UNSUPPORTED },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        mmrt_status st = mmrt_data_uri_decode(cases[i].uri, strlen(cases[i].uri), 0, &d, &e);
        if (st != cases[i].st)
            fail_msg("'%s': %d (%s), want %d", cases[i].uri, st, e.msg, cases[i].st);
        assert_null(strchr(e.msg, '\n'));
    }
    /* "/9j/" is exactly the 3-byte JPEG magic: enough here, the decoder judges the rest */
    const char *magic3 = "data:image/jpeg;base64,/9j/";
    assert_int_equal(mmrt_data_uri_decode(magic3, strlen(magic3), 0, &d, &e), MMRT_OK);
    assert_int_equal(d.size, 3);
    free(d.data);
    /* a hostile media type is shown cut short and printable */
    const char *ctl = "data:\x01\x02zzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzz;base64,AAAA";
    assert_int_equal(mmrt_data_uri_decode(ctl, strlen(ctl), 0, &d, &e), MMRT_ERR_UNSUPPORTED);
    assert_non_null(strstr(e.msg, "'??zzz"));
    assert_non_null(strstr(e.msg, "...'"));
}

/* ---- local image paths ---- */

struct tmp {
    char dir[64], outside[64];
    char path[32][PATH_MAX];
    int n;
};
static struct tmp T;

static void tmp_add(const char *p)
{
    snprintf(T.path[T.n++], PATH_MAX, "%s", p);
}

static void write_file(const char *dir, const char *name, const void *data, size_t n)
{
    char p[PATH_MAX];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    FILE *f = fopen(p, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(data, 1, n, f), n);
    fclose(f);
    tmp_add(p);
}

static void make_link(const char *target, const char *name)
{
    char p[PATH_MAX];
    snprintf(p, sizeof p, "%s/%s", T.dir, name);
    assert_int_equal(symlink(target, p), 0);
    tmp_add(p);
}

static int tmp_setup(void **state)
{
    (void)state;
    memset(&T, 0, sizeof T);
    snprintf(T.dir, sizeof T.dir, "/tmp/mmrt-openai-XXXXXX");
    snprintf(T.outside, sizeof T.outside, "/tmp/mmrt-openai-out-XXXXXX");
    if (!mkdtemp(T.dir) || !mkdtemp(T.outside))
        return -1;
    write_file(T.dir, "a.png", png_1x1, sizeof png_1x1);
    write_file(T.dir, "empty.png", "", 0);
    write_file(T.dir, "a b%.png", png_1x1, sizeof png_1x1);
    write_file(T.outside, "secret.png", png_1x1, sizeof png_1x1);
    char p[PATH_MAX];
    snprintf(p, sizeof p, "%s/sub", T.dir);
    if (mkdir(p, 0700) != 0)
        return -1;
    write_file(p, "b.png", png_1x1, sizeof png_1x1);
    snprintf(p, sizeof p, "%s/secret.png", T.outside);
    make_link(p, "out.png");                  /* a symlink that leads out */
    make_link(T.outside, "outdir");           /* a directory symlink that leads out */
    make_link("a.png", "in.png");             /* one that stays inside */
    make_link("/etc/passwd", "passwd.png");
    snprintf(p, sizeof p, "%s/fifo.png", T.dir);
    if (mkfifo(p, 0600) != 0)
        return -1;
    tmp_add(p);
    return 0;
}

static int tmp_teardown(void **state)
{
    (void)state;
    for (int i = T.n - 1; i >= 0; i--)
        unlink(T.path[i]);
    char p[PATH_MAX];
    snprintf(p, sizeof p, "%s/sub", T.dir);
    rmdir(p);
    rmdir(T.dir);
    rmdir(T.outside);
    return 0;
}

static const char *image_body(const char *url)
{
    return body("{'model':'" MODEL "','messages':[{'role':'user','content':[{'type':'image_url',"
                "'image_url':{'url':'%s'}},{'type':'text','text':'what?'}]}]}", url);
}

static void local_ok(const struct mmrt_chat_limits *lim, const char *url, const char *want)
{
    struct mmrt_chat_request r = parse_ok_lim(image_body(url), lim);
    assert_int_equal(r.req.n_images, 1);
    assert_null(r.req.images[0].data);
    char *real_dir = realpath(T.dir, NULL);
    const char *got = r.req.images[0].path;
    const size_t n = strlen(real_dir);
    if (strncmp(got, real_dir, n) != 0 || got[n] != '/' || strcmp(got + n + 1, want) != 0)
        fail_msg("%s: path %s, want %s/%s", url, got, real_dir, want);
    free(real_dir);
    mmrt_chat_request_free(&r);
}

static void local_refused(const struct mmrt_chat_limits *lim, const char *url, int http,
                          const char *word)
{
    const char *b = image_body(url);
    refused_lim(b, strlen(b), lim, http, http >= 500 ? NULL
                                                     : "messages[0].content[0].image_url.url",
                word);
}

static void test_image_dir(void **state)
{
    (void)state;
    struct mmrt_chat_limits lim = LIM;
    lim.image_dir = T.dir;
    char url[PATH_MAX + 16];
    local_ok(&lim, "a.png", "a.png");
    local_ok(&lim, "./sub/b.png", "sub/b.png");
    local_ok(&lim, "sub//b.png", "sub/b.png");
    local_ok(&lim, "in.png", "a.png"); /* a symlink inside resolves to its target */
    snprintf(url, sizeof url, "%s/a.png", T.dir);
    local_ok(&lim, url, "a.png");
    snprintf(url, sizeof url, "file://%s/sub/b.png", T.dir);
    local_ok(&lim, url, "sub/b.png");
    snprintf(url, sizeof url, "file://localhost%s/a.png", T.dir);
    local_ok(&lim, url, "a.png");
    snprintf(url, sizeof url, "file://%s/%%61%%20b%%25.png", T.dir); /* "a b%.png" */
    local_ok(&lim, url, "a b%.png");
    /* the directory named with a trailing slash works the same */
    char slash[80];
    snprintf(slash, sizeof slash, "%s//", T.dir);
    lim.image_dir = slash;
    local_ok(&lim, "a.png", "a.png");
    snprintf(url, sizeof url, "%s/a.png", T.dir);
    local_ok(&lim, url, "a.png");
    lim.image_dir = T.dir;

    /* every way out, and every non-file, reads the same */
    const char *uniform = "is not a readable image file inside this server's image directory";
    local_refused(&lim, "out.png", 400, uniform);
    local_refused(&lim, "outdir/secret.png", 400, uniform);
    local_refused(&lim, "passwd.png", 400, uniform);
    local_refused(&lim, "missing.png", 400, uniform);
    local_refused(&lim, "sub", 400, uniform);
    local_refused(&lim, "fifo.png", 400, uniform); /* must not block */
    local_refused(&lim, "/etc/passwd", 400, uniform);
    local_refused(&lim, "/", 400, uniform);
    snprintf(url, sizeof url, "%s/secret.png", T.outside);
    local_refused(&lim, url, 400, uniform);
    snprintf(url, sizeof url, "file://%s/secret.png", T.outside);
    local_refused(&lim, url, 400, uniform);
    snprintf(url, sizeof url, "%s", T.dir); /* the directory itself */
    local_refused(&lim, url, 400, uniform);
    snprintf(url, sizeof url, "%sx/a.png", T.dir); /* a sibling sharing the prefix */
    local_refused(&lim, url, 400, uniform);
    /* ".." is refused by name, even when it would stay inside */
    local_refused(&lim, "../etc/passwd", 400, "'..' component");
    local_refused(&lim, "sub/../a.png", 400, "'..' component");
    local_refused(&lim, "..", 400, "'..' component");
    snprintf(url, sizeof url, "%s/../%.60s/secret.png", T.dir, T.outside + 5);
    local_refused(&lim, url, 400, "'..' component");
    snprintf(url, sizeof url, "file://%s/%%2e%%2e/x.png", T.dir); /* escaped ".." */
    local_refused(&lim, url, 400, "'..' component");
    local_refused(&lim, "..a.png", 400, uniform); /* a name, not a component: just missing */
    /* files that are there but unusable */
    local_refused(&lim, "empty.png", 400, "empty file");
    lim.max_image_bytes = sizeof png_1x1 - 1;
    local_refused(&lim, "a.png", 413, "more than the 68");
    lim.max_image_bytes = 0;
    /* file: URLs that are not file:///PATH */
    local_refused(&lim, "file://host/a.png", 400, "file:///ABSOLUTE/PATH");
    local_refused(&lim, "file:/a.png", 400, "file:///ABSOLUTE/PATH");
    local_refused(&lim, "file://", 400, "file:///ABSOLUTE/PATH");
    local_refused(&lim, "file:///a.png?x=1", 400, "query or fragment");
    local_refused(&lim, "file:///a%00.png", 400, "percent-escape");
    local_refused(&lim, "file:///a%zz.png", 400, "percent-escape");
    local_refused(&lim, "file:///a%2", 400, "percent-escape");
    local_refused(&lim, "", 400, "empty image path");
    memset(url, 'a', PATH_MAX);
    url[PATH_MAX] = '\0';
    local_refused(&lim, url, 400, "an image path of 4096 bytes");
    /* an image_dir that does not exist is the server's problem, not the client's */
    lim.image_dir = "/nonexistent/mmrt-openai";
    local_refused(&lim, "a.png", 500, "image directory cannot be resolved");
    /* and an image_dir of "/" would take any absolute path */
    lim.image_dir = "/";
    char *real = realpath(T.dir, NULL);
    snprintf(url, sizeof url, "%s/a.png", real);
    struct mmrt_chat_request r = parse_ok_lim(image_body(url), &lim);
    assert_string_equal(r.req.images[0].path, url);
    mmrt_chat_request_free(&r);
    free(real);
}

/* ---- responses ---- */

static json_t *load(char *s)
{
    assert_non_null(s);
    json_error_t je;
    json_t *v = json_loads(s, JSON_REJECT_DUPLICATES, &je);
    if (!v)
        fail_msg("not JSON (%s): %s", je.text, s);
    free(s);
    return v;
}

static const char *sget(const json_t *o, const char *path)
{
    const json_t *v = o;
    char key[64];
    for (const char *p = path; v && *p;) {
        const char *dot = strchr(p, '.');
        size_t n = dot ? (size_t)(dot - p) : strlen(p);
        snprintf(key, sizeof key, "%.*s", (int)n, p);
        v = key[0] >= '0' && key[0] <= '9' ? json_array_get(v, (size_t)atoi(key))
                                           : json_object_get(v, key);
        p += n + (dot != NULL);
    }
    if (!v)
        fail_msg("no %s", path);
    return json_is_string(v) ? json_string_value(v) : json_is_null(v) ? "(null)" : "(other)";
}

static long long iget(const json_t *o, const char *a, const char *b)
{
    const json_t *v = json_object_get(b ? json_object_get(o, a) : o, b ? b : a);
    assert_true(json_is_integer(v));
    return json_integer_value(v);
}

/* A chat.completion of one choice. */
static char *completion1(const char *id, long created, const char *model, const char *content,
                         const char *finish_reason, const struct mmrt_chat_usage *usage,
                         const json_t *logprobs)
{
    const struct mmrt_chat_choice c = { content, finish_reason, logprobs };
    return mmrt_chat_completion_json(id, created, model, &c, 1, usage);
}

static void test_completion_json(void **state)
{
    (void)state;
    const struct mmrt_chat_usage u = { .prompt_tokens = 12, .completion_tokens = 5 };
    json_t *o = load(completion1("chatcmpl-1", 1700000000, MODEL,
                                               "say \"hi\"\n\t\x01</script>",
                                               mmrt_finish_reason_name(MMRT_FINISH_EOS), &u,
                                               NULL));
    assert_int_equal(json_object_size(o), 6);
    assert_string_equal(sget(o, "id"), "chatcmpl-1");
    assert_string_equal(sget(o, "object"), "chat.completion");
    assert_int_equal(iget(o, "created", NULL), 1700000000);
    assert_string_equal(sget(o, "model"), MODEL);
    assert_int_equal(json_array_size(json_object_get(o, "choices")), 1);
    assert_int_equal(json_integer_value(json_object_get(json_array_get(json_object_get(o,
                         "choices"), 0), "index")), 0);
    assert_string_equal(sget(o, "choices.0.message.role"), "assistant");
    assert_string_equal(sget(o, "choices.0.message.content"), "say \"hi\"\n\t\x01</script>");
    assert_string_equal(sget(o, "choices.0.message.refusal"), "(null)");
    assert_string_equal(sget(o, "choices.0.logprobs"), "(null)");
    assert_string_equal(sget(o, "choices.0.finish_reason"), "stop");
    assert_int_equal(iget(o, "usage", "prompt_tokens"), 12);
    assert_int_equal(iget(o, "usage", "completion_tokens"), 5);
    assert_int_equal(iget(o, "usage", "total_tokens"), 17);
    json_decref(o);
    /* invalid UTF-8 from a model becomes U+FFFD, valid text is kept byte for byte */
    o = load(completion1("x", 0, MODEL, "ok \xe2\x82 \xc3\xa9 \xff\xfe \xed\xa0\x80 "
                                       "\xf0\x9f\x98\x80 \xf4\x90\x80\x80 \xc0\xaf",
                                       "length", NULL, NULL));
    assert_string_equal(sget(o, "choices.0.message.content"),
                        "ok \xef\xbf\xbd\xef\xbf\xbd \xc3\xa9 \xef\xbf\xbd\xef\xbf\xbd "
                        "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd \xf0\x9f\x98\x80 "
                        "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd \xef\xbf\xbd\xef\xbf\xbd");
    assert_string_equal(sget(o, "choices.0.finish_reason"), "length");
    assert_null(json_object_get(o, "usage"));
    json_decref(o);
    o = load(completion1("x", 0, "bad\xffname", "", NULL, NULL, NULL));
    assert_string_equal(sget(o, "model"), "bad\xef\xbf\xbdname");
    assert_string_equal(sget(o, "choices.0.finish_reason"), "(null)");
    json_decref(o);
    /* n choices: each its index, text, finish reason and logprobs, in order */
    json_t *lp = json_array();
    assert_non_null(lp);
    const struct mmrt_chat_choice three[3] = {
        { "a", "stop", NULL }, { NULL, "length", lp }, { "c\xff", NULL, NULL } };
    const struct mmrt_chat_usage u3 = { .prompt_tokens = 7, .completion_tokens = 9 };
    o = load(mmrt_chat_completion_json("x", 0, MODEL, three, 3, &u3));
    const json_t *ch = json_object_get(o, "choices");
    assert_int_equal(json_array_size(ch), 3);
    for (int i = 0; i < 3; i++)
        assert_int_equal(iget(json_array_get(ch, (size_t)i), "index", NULL), i);
    assert_string_equal(sget(o, "choices.0.message.content"), "a");
    assert_string_equal(sget(o, "choices.1.message.content"), "");
    assert_string_equal(sget(o, "choices.2.message.content"), "c\xef\xbf\xbd");
    assert_string_equal(sget(o, "choices.0.finish_reason"), "stop");
    assert_string_equal(sget(o, "choices.1.finish_reason"), "length");
    assert_string_equal(sget(o, "choices.2.finish_reason"), "(null)");
    assert_string_equal(sget(o, "choices.0.logprobs"), "(null)");
    assert_true(json_is_array(json_object_get(
        json_object_get(json_array_get(ch, 1), "logprobs"), "content")));
    assert_int_equal(iget(o, "usage", "total_tokens"), 16);
    json_decref(o);
    json_decref(lp);
}

/* "logprobs" of a completion and a chunk: OpenAI's shape, the token's text made valid
 * UTF-8 with its bytes, −inf as −9999.0, the top list in the runtime's order. */
static void test_logprobs_json(void **state)
{
    (void)state;
    const struct mmrt_logprob top[3] = { { 5, -0.25f, " the" }, { 9, -1.5f, "\xe2\x82" },
                                         { 2, -INFINITY, "</s>" } };
    const struct mmrt_token_logprobs lp = { sizeof lp, { 9, -1.5f, "\xe2\x82" }, 3, top };
    json_t *entries = json_array();
    assert_non_null(entries);
    assert_int_equal(json_array_append_new(entries, mmrt_chat_logprobs_entry(&lp)), 0);
    const struct mmrt_token_logprobs none = { sizeof none, { 5, -0.25f, " the" }, 0, NULL };
    assert_int_equal(json_array_append_new(entries, mmrt_chat_logprobs_entry(&none)), 0);
    const struct mmrt_chat_usage u = { .prompt_tokens = 3, .completion_tokens = 2 };
    json_t *o = load(completion1("x", 0, MODEL, "ab", "stop", &u, entries));
    const json_t *l = json_object_get(json_array_get(json_object_get(o, "choices"), 0),
                                      "logprobs");
    assert_int_equal(json_object_size(l), 2);
    assert_true(json_is_null(json_object_get(l, "refusal")));
    const json_t *c = json_object_get(l, "content");
    assert_int_equal(json_array_size(c), 2);
    const json_t *e0 = json_array_get(c, 0);
    assert_int_equal(json_object_size(e0), 4);
    /* each byte of the cut character is one U+FFFD, as in any text of a response */
    assert_string_equal(json_string_value(json_object_get(e0, "token")),
                        "\xef\xbf\xbd\xef\xbf\xbd");
    assert_true(json_real_value(json_object_get(e0, "logprob")) == -1.5);
    const json_t *bytes = json_object_get(e0, "bytes");
    assert_int_equal(json_array_size(bytes), 6);
    assert_int_equal(json_integer_value(json_array_get(bytes, 0)), 0xef);
    assert_int_equal(json_integer_value(json_array_get(bytes, 5)), 0xbd);
    const json_t *t = json_object_get(e0, "top_logprobs");
    assert_int_equal(json_array_size(t), 3);
    assert_string_equal(json_string_value(json_object_get(json_array_get(t, 0), "token")),
                        " the");
    assert_int_equal(json_array_size(json_object_get(json_array_get(t, 0), "bytes")), 4);
    assert_true(json_real_value(json_object_get(json_array_get(t, 2), "logprob")) == -9999.0);
    assert_null(json_object_get(json_array_get(t, 2), "top_logprobs"));
    const json_t *e1 = json_array_get(c, 1);
    assert_true(json_is_array(json_object_get(e1, "top_logprobs")));
    assert_int_equal(json_array_size(json_object_get(e1, "top_logprobs")), 0);
    json_decref(o);
    /* A chunk carries the same object; an empty list is an empty content. */
    o = load(mmrt_chat_chunk_json("c", 5, MODEL, 0, NULL, "ab", NULL, NULL, false, entries));
    assert_int_equal(json_array_size(json_object_get(json_object_get(
                         json_array_get(json_object_get(o, "choices"), 0), "logprobs"),
                         "content")), 2);
    json_decref(o);
    json_array_clear(entries);
    o = load(mmrt_chat_chunk_json("c", 5, MODEL, 0, NULL, NULL, "stop", NULL, false, entries));
    l = json_object_get(json_array_get(json_object_get(o, "choices"), 0), "logprobs");
    assert_true(json_is_array(json_object_get(l, "content")));
    assert_int_equal(json_array_size(json_object_get(l, "content")), 0);
    json_decref(o);
    json_decref(entries);
}

static void test_chunk_json(void **state)
{
    (void)state;
    for (int inc = 0; inc < 2; inc++) {
        json_t *o = load(mmrt_chat_chunk_json("c", 5, MODEL, 0, "assistant", "", NULL, NULL, inc,
                                              NULL));
        assert_string_equal(sget(o, "object"), "chat.completion.chunk");
        assert_string_equal(sget(o, "id"), "c");
        const json_t *delta = json_object_get(json_array_get(json_object_get(o, "choices"), 0),
                                              "delta");
        assert_int_equal(json_object_size(delta), 2);
        assert_string_equal(sget(o, "choices.0.delta.role"), "assistant");
        assert_string_equal(sget(o, "choices.0.delta.content"), "");
        assert_string_equal(sget(o, "choices.0.finish_reason"), "(null)");
        assert_string_equal(sget(o, "choices.0.logprobs"), "(null)");
        assert_int_equal(json_integer_value(json_object_get(
                             json_array_get(json_object_get(o, "choices"), 0), "index")), 0);
        /* include_usage: "usage": null on every chunk but the last */
        assert_int_equal(json_object_get(o, "usage") != NULL, inc);
        if (inc)
            assert_true(json_is_null(json_object_get(o, "usage")));
        json_decref(o);
        o = load(mmrt_chat_chunk_json("c", 5, MODEL, 0, NULL, "tok\u00e9n\"", NULL, NULL, inc,
                                      NULL));
        delta = json_object_get(json_array_get(json_object_get(o, "choices"), 0), "delta");
        assert_int_equal(json_object_size(delta), 1);
        assert_string_equal(sget(o, "choices.0.delta.content"), "tok\u00e9n\"");
        json_decref(o);
        o = load(mmrt_chat_chunk_json("c", 5, MODEL, 0, NULL, NULL, "length", NULL, inc, NULL));
        delta = json_object_get(json_array_get(json_object_get(o, "choices"), 0), "delta");
        assert_true(json_is_object(delta) && json_object_size(delta) == 0);
        assert_string_equal(sget(o, "choices.0.finish_reason"), "length");
        json_decref(o);
    }
    /* a later choice's chunk says which */
    json_t *o = load(mmrt_chat_chunk_json("c", 5, MODEL, 2, NULL, "x", NULL, NULL, false, NULL));
    assert_int_equal(json_array_size(json_object_get(o, "choices")), 1);
    assert_int_equal(iget(json_array_get(json_object_get(o, "choices"), 0), "index", NULL), 2);
    json_decref(o);
    const struct mmrt_chat_usage u = { .prompt_tokens = 3, .completion_tokens = 4 };
    o = load(mmrt_chat_chunk_json("c", 5, MODEL, 0, NULL, NULL, NULL, &u, true, NULL));
    assert_true(json_is_array(json_object_get(o, "choices")));
    assert_int_equal(json_array_size(json_object_get(o, "choices")), 0);
    assert_int_equal(iget(o, "usage", "total_tokens"), 7);
    assert_string_equal(sget(o, "object"), "chat.completion.chunk");
    json_decref(o);
}

/* prediction (OpenAI's predicted outputs): its text, or its text parts joined, handed on as
 * mmrt_request.prediction; null is none. Its refusals are in test_unsupported_and_unknown. */
static void test_prediction(void **state)
{
    (void)state;
    struct mmrt_chat_request r = parse_ok(WITH("'prediction':{'type':'content','content':"
                                               "'def f():\\n    return 1'}"));
    assert_string_equal(r.req.prediction, "def f():\n    return 1");
    mmrt_chat_request_free(&r);
    r = parse_ok(WITH("'prediction':{'type':'content','content':[{'type':'text','text':'a b'},"
                      "{'type':'text','text':''},{'type':'text','text':' \\u00e9'}]}"));
    assert_string_equal(r.req.prediction, "a b \xc3\xa9");
    mmrt_chat_request_free(&r);
    r = parse_ok(WITH("'prediction':{'type':'content','content':[]}"));
    assert_string_equal(r.req.prediction, "");
    mmrt_chat_request_free(&r);
    r = parse_ok(WITH("'prediction':null"));
    assert_null(r.req.prediction);
    mmrt_chat_request_free(&r);
    /* usage reports what was taken and refused, only for a request with a prediction */
    const struct mmrt_chat_usage u = { .prompt_tokens = 3, .completion_tokens = 9,
                                       .prediction = true, .accepted_prediction_tokens = 6,
                                       .rejected_prediction_tokens = 2 };
    const struct mmrt_chat_choice one = { "x", "stop", NULL };
    json_t *o = load(mmrt_chat_completion_json("x", 0, MODEL, &one, 1, &u));
    const json_t *d = json_object_get(json_object_get(o, "usage"),
                                      "completion_tokens_details");
    assert_int_equal(json_object_size(d), 2);
    assert_int_equal(json_integer_value(json_object_get(d, "accepted_prediction_tokens")), 6);
    assert_int_equal(json_integer_value(json_object_get(d, "rejected_prediction_tokens")), 2);
    json_decref(o);
    o = load(mmrt_chat_chunk_json("x", 0, MODEL, 0, NULL, NULL, NULL, &u, true, NULL));
    assert_int_equal(iget(json_object_get(o, "usage"), "completion_tokens_details",
                          "accepted_prediction_tokens"), 6);
    json_decref(o);
    const struct mmrt_chat_usage plain = { .prompt_tokens = 3, .completion_tokens = 9 };
    o = load(mmrt_chat_completion_json("x", 0, MODEL, &one, 1, &plain));
    assert_null(json_object_get(json_object_get(o, "usage"), "completion_tokens_details"));
    json_decref(o);
}

static void test_models_and_errors(void **state)
{
    (void)state;
    json_t *o = load(mmrt_models_json(MODEL, 42));
    assert_string_equal(sget(o, "object"), "list");
    assert_int_equal(json_array_size(json_object_get(o, "data")), 1);
    assert_string_equal(sget(o, "data.0.id"), MODEL);
    assert_string_equal(sget(o, "data.0.object"), "model");
    assert_string_equal(sget(o, "data.0.owned_by"), "mmrt");
    assert_int_equal(iget(json_array_get(json_object_get(o, "data"), 0), "created", NULL), 42);
    json_decref(o);
    /* GET /v1/models/{id}: the list's one entry, alone */
    o = load(mmrt_model_json(MODEL, 42));
    assert_int_equal(json_object_size(o), 4);
    assert_string_equal(sget(o, "id"), MODEL);
    assert_string_equal(sget(o, "object"), "model");
    assert_string_equal(sget(o, "owned_by"), "mmrt");
    assert_int_equal(iget(o, "created", NULL), 42);
    json_decref(o);
    /* a parse error, as JSON */
    struct mmrt_chat_request r;
    struct mmrt_api_error e;
    const char *b = WITH("'temperature':'x'");
    assert_int_not_equal(mmrt_chat_request_parse(b, strlen(b), &LIM, &r, &e), MMRT_OK);
    o = load(mmrt_api_error_json(&e));
    assert_int_equal(json_object_size(o), 1);
    const json_t *err = json_object_get(o, "error");
    assert_int_equal(json_object_size(err), 4);
    assert_string_equal(sget(o, "error.type"), "invalid_request_error");
    assert_string_equal(sget(o, "error.param"), "temperature");
    assert_string_equal(sget(o, "error.code"), "(null)");
    assert_non_null(strstr(sget(o, "error.message"), "temperature"));
    json_decref(o);
    b = body("{'model':'other','messages':[]}");
    assert_int_equal(mmrt_chat_request_parse(b, strlen(b), &LIM, &r, &e), MMRT_ERR_NOT_FOUND);
    o = load(mmrt_api_error_json(&e));
    assert_string_equal(sget(o, "error.code"), "model_not_found");
    json_decref(o);
    o = load(mmrt_api_error_json_make(413, NULL, "request_too_large", NULL, "too \"big\""));
    assert_string_equal(sget(o, "error.type"), "invalid_request_error");
    assert_string_equal(sget(o, "error.param"), "(null)");
    assert_string_equal(sget(o, "error.message"), "too \"big\"");
    json_decref(o);
    o = load(mmrt_api_error_json_make(503, NULL, NULL, "", NULL));
    assert_string_equal(sget(o, "error.type"), "server_error");
    assert_string_equal(sget(o, "error.message"), "");
    assert_string_equal(sget(o, "error.param"), "(null)");
    json_decref(o);
}

static void test_status_map(void **state)
{
    (void)state;
    static const struct {
        mmrt_status st;
        int http;
        const char *type;
    } map[] = {
        { MMRT_OK, 200, "invalid_request_error" },
        { MMRT_ERR_INVALID_ARG, 400, "invalid_request_error" },
        { MMRT_ERR_LIMIT, 400, "invalid_request_error" },
        { MMRT_ERR_FORMAT, 400, "invalid_request_error" },
        { MMRT_ERR_UNSUPPORTED, 400, "invalid_request_error" },
        { MMRT_ERR_NO_MEMORY, 503, "server_error" },
        { MMRT_ERR_OUT_OF_POOL, 503, "server_error" },
        { MMRT_ERR_CANCELLED, 499, "cancelled" },
        { MMRT_ERR_IO, 500, "server_error" },
        { MMRT_ERR_NOT_FOUND, 500, "server_error" },
        { MMRT_ERR_PLUGIN, 500, "server_error" },
        { MMRT_ERR_NO_DEVICE, 500, "server_error" },
        { MMRT_ERR_DEVICE, 500, "server_error" },
        { MMRT_ERR_CONFIG, 500, "server_error" },
        { MMRT_ERR_INTERNAL, 500, "server_error" },
        { (mmrt_status)-99, 500, "server_error" },
    };
    for (size_t i = 0; i < sizeof map / sizeof map[0]; i++) {
        assert_int_equal(mmrt_api_status_http(map[i].st), map[i].http);
        struct mmrt_api_error e;
        mmrt_api_error_from_status(map[i].st, "detail here", &e);
        assert_int_equal(e.http_status, map[i].http);
        assert_string_equal(e.type, map[i].type);
        assert_string_equal(e.message, "detail here");
        assert_null(e.code);
        assert_string_equal(e.param, "");
    }
    struct mmrt_api_error e;
    mmrt_api_error_from_status(MMRT_ERR_DEVICE, NULL, &e);
    assert_string_equal(e.message, mmrt_status_message(MMRT_ERR_DEVICE));
    mmrt_api_error_from_status(MMRT_ERR_LIMIT, "", &e);
    assert_string_equal(e.message, mmrt_status_message(MMRT_ERR_LIMIT));
    char longer[2000];
    memset(longer, 'x', sizeof longer - 1);
    longer[sizeof longer - 1] = '\0';
    mmrt_api_error_from_status(MMRT_ERR_INTERNAL, longer, &e);
    assert_int_equal(strlen(e.message), sizeof e.message - 1);
    assert_string_equal(mmrt_finish_reason_name(MMRT_FINISH_EOS), "stop");
    assert_string_equal(mmrt_finish_reason_name(MMRT_FINISH_STOP_STRING), "stop");
    assert_string_equal(mmrt_finish_reason_name(MMRT_FINISH_CALLER), "stop");
    assert_string_equal(mmrt_finish_reason_name(MMRT_FINISH_LENGTH), "length");
    assert_string_equal(mmrt_finish_reason_name(MMRT_FINISH_NONE), "stop");
}

/* ---- allocation failures ---- */

/* jansson allocates through these, so the sweep fails its allocations too. */
static void *json_malloc_hook(size_t n)
{
    return malloc(n);
}

static void json_free_hook(void *p)
{
    free(p);
}

static void test_alloc_failure_sweep(void **state)
{
    (void)state;
    struct mmrt_chat_limits lim = LIM;
    lim.image_dir = T.dir;
    const char *b = body(
        "{'model':'" MODEL "','messages':[{'role':'system','content':'be brief'},"
        "{'role':'user','content':[{'type':'text','text':'one'},{'type':'image_url','image_url':"
        "{'url':'%s'}},{'type':'text','text':'two'}]},{'role':'assistant','content':'ok'},"
        "{'role':'user','content':[{'type':'image_url','image_url':{'url':'a.png'}}]}],"
        "'stop':['x','yy'],'max_tokens':9,'stream':true,'stream_options':{'include_usage':true}}",
        PNG_URI);
    char copy[4096];
    snprintf(copy, sizeof copy, "%s", b);
    json_set_alloc_funcs(json_malloc_hook, json_free_hook);
    const long base = alloc_live();
    long n = 1;
    int ok_runs = 0;
    for (;; n++) {
        struct mmrt_chat_request r;
        struct mmrt_api_error e;
        alloc_fail_at(n);
        mmrt_status st = mmrt_chat_request_parse(copy, strlen(copy), &lim, &r, &e);
        const int fired = alloc_fail_fired();
        alloc_fail_at(0);
        if (st == MMRT_OK) { /* complete, whether or not a failure was absorbed */
            assert_int_equal(r.req.n_messages, 4);
            assert_int_equal(r.req.n_images, 2);
            assert_int_equal(r.req.n_stop, 2);
            assert_string_equal(r.req.messages[1].text, "one\ntwo");
            ok_runs++;
        } else {
            /* jansson reports its own out-of-memory as a parse failure (400) */
            if (e.http_status != 503 && e.http_status != 400)
                fail_msg("allocation %ld: %d %s", n, e.http_status, e.message);
            assert_true(fired);
        }
        mmrt_chat_request_free(&r);
        assert_int_equal(alloc_live(), base);
        if (!fired)
            break;
    }
    /* the builders, under the same sweep */
    for (long k = 1;; k++) {
        const struct mmrt_chat_usage u = { .prompt_tokens = 1, .completion_tokens = 2 };
        const struct mmrt_logprob top[2] = { { 5, -0.5f, "a\xff" }, { 6, -INFINITY, "" } };
        const struct mmrt_token_logprobs lp = { sizeof lp, { 5, -0.5f, "a\xff" }, 2, top };
        alloc_fail_at(k);
        json_t *entries = json_array();
        if (entries)
            json_array_append_new(entries, mmrt_chat_logprobs_entry(&lp));
        char *s[7] = {
            completion1("id", 1, MODEL, "text \xff", "stop", &u, NULL),
            mmrt_chat_chunk_json("id", 1, MODEL, 0, "assistant", "", NULL, NULL, true, NULL),
            mmrt_chat_chunk_json("id", 1, MODEL, 0, NULL, NULL, NULL, &u, true, NULL),
            mmrt_models_json(MODEL, 1),
            mmrt_api_error_json_make(400, NULL, "c", "p", "m"),
            entries ? completion1("id", 1, MODEL, "t", "stop", &u, entries) : NULL,
            entries ? mmrt_chat_chunk_json("id", 1, MODEL, 0, NULL, "t", NULL, NULL, false, entries)
                    : NULL,
        };
        json_decref(entries);
        const int fired = alloc_fail_fired();
        alloc_fail_at(0);
        for (int i = 0; i < 7; i++)
            free(s[i]);
        assert_int_equal(alloc_live(), base);
        if (!fired)
            break;
    }
    json_set_alloc_funcs(malloc, free);
    assert_true(n > 20);
    assert_true(ok_runs >= 1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_minimal),
        cmocka_unit_test(test_every_field),
        cmocka_unit_test(test_nulls_are_absent),
        cmocka_unit_test(test_roles_and_turns),
        cmocka_unit_test(test_parts_and_images),
        cmocka_unit_test(test_max_tokens_rules),
        cmocka_unit_test(test_checkpoint_defaults),
        cmocka_unit_test(test_sampling_values),
        cmocka_unit_test(test_stop_and_stream),
        cmocka_unit_test(test_model),
        cmocka_unit_test(test_unsupported_and_unknown),
        cmocka_unit_test(test_prediction),
        cmocka_unit_test(test_messages),
        cmocka_unit_test(test_image_urls),
        cmocka_unit_test(test_json_level),
        cmocka_unit_test(test_base64),
        cmocka_unit_test(test_data_uri),
        cmocka_unit_test(test_image_dir),
        cmocka_unit_test(test_completion_json),
        cmocka_unit_test(test_chunk_json),
        cmocka_unit_test(test_logprobs_json),
        cmocka_unit_test(test_models_and_errors),
        cmocka_unit_test(test_status_map),
        cmocka_unit_test(test_alloc_failure_sweep),
    };
    return cmocka_run_group_tests(tests, tmp_setup, tmp_teardown);
}
