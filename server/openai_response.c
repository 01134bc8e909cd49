/*
 * server/openai_response.c — the JSON mmrt serve sends (see openai.h): completions, stream
 * chunks, the model list, error objects, and the mapping of runtime statuses to HTTP.
 *
 * Every object is built as a jansson value and dumped compact, so escaping is jansson's.
 * jansson refuses strings that are not UTF-8; text from a model (or a configured name) is
 * first made valid by replacing each byte that does not start or continue a well-formed
 * character (RFC 3629: no overlongs, no surrogates, nothing past U+10FFFF) with U+FFFD.
 * Any allocation failure on the way makes the builder return NULL and free what it made
 * (jansson's json_object_set_new steals the reference even when it fails).
 */
#include "openai.h"

#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "error.h"

/* Length of the well-formed UTF-8 character at s[0 .. n), or 0 if there is none. */
static size_t utf8_char(const unsigned char *s, size_t n)
{
    const unsigned char c = s[0];
    if (c < 0x80)
        return 1;
    size_t len;
    unsigned char lo = 0x80, hi = 0xbf; /* allowed range of the second byte */
    if (c >= 0xc2 && c <= 0xdf)
        len = 2;
    else if (c >= 0xe0 && c <= 0xef) {
        len = 3;
        if (c == 0xe0)
            lo = 0xa0; /* no overlong */
        if (c == 0xed)
            hi = 0x9f; /* no surrogates */
    } else if (c >= 0xf0 && c <= 0xf4) {
        len = 4;
        if (c == 0xf0)
            lo = 0x90;
        if (c == 0xf4)
            hi = 0x8f; /* ≤ U+10FFFF */
    } else
        return 0;
    if (n < len || s[1] < lo || s[1] > hi)
        return 0;
    for (size_t i = 2; i < len; i++)
        if ((s[i] & 0xc0) != 0x80)
            return 0;
    return len;
}

/* A jansson string of s with every invalid byte as U+FFFD; NULL when out of memory. */
static json_t *jstr(const char *s)
{
    if (!s)
        return json_null();
    const unsigned char *u = (const unsigned char *)s;
    const size_t n = strlen(s);
    size_t bad = 0;
    for (size_t i = 0; i < n;) {
        const size_t k = utf8_char(u + i, n - i);
        bad += k == 0;
        i += k ? k : 1;
    }
    if (bad == 0)
        return json_stringn_nocheck(s, n);
    char *fixed = malloc(n + 2 * bad + 1); /* each bad byte (1) becomes 3 bytes */
    if (!fixed)
        return NULL;
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        const size_t k = utf8_char(u + i, n - i);
        if (k) {
            memcpy(fixed + o, s + i, k);
            o += k;
            i += k;
        } else {
            memcpy(fixed + o, "\xef\xbf\xbd", 3);
            o += 3;
            i++;
        }
    }
    json_t *v = json_stringn_nocheck(fixed, o);
    free(fixed);
    return v;
}

/* Dumps and releases v; NULL when v is NULL or out of memory. */
static char *dump(json_t *v)
{
    if (!v)
        return NULL;
    char *s = json_dumps(v, JSON_COMPACT);
    json_decref(v);
    return s;
}

/* obj[key] = v, stealing v; false (obj still whole) when v is NULL or out of memory. */
static bool put(json_t *obj, const char *key, json_t *v)
{
    return v && json_object_set_new(obj, key, v) == 0;
}

static json_t *usage_json(const struct mmrt_chat_usage *u)
{
    json_t *o = json_object();
    if (!o)
        return NULL;
    const long long total = (long long)u->prompt_tokens + u->completion_tokens;
    if (!put(o, "prompt_tokens", json_integer(u->prompt_tokens)) ||
        !put(o, "completion_tokens", json_integer(u->completion_tokens)) ||
        !put(o, "total_tokens", json_integer(total))) {
        json_decref(o);
        return NULL;
    }
    if (u->prediction) {
        json_t *d = json_object();
        if (!put(o, "completion_tokens_details", d) ||
            !put(d, "accepted_prediction_tokens", json_integer(u->accepted_prediction_tokens)) ||
            !put(d, "rejected_prediction_tokens", json_integer(u->rejected_prediction_tokens))) {
            json_decref(o);
            return NULL;
        }
    }
    return o;
}

/* The members every completion and chunk starts with. */
static json_t *head(const char *id, long created, const char *model, const char *object)
{
    json_t *o = json_object();
    if (!o)
        return NULL;
    if (!put(o, "id", jstr(id ? id : "")) || !put(o, "object", json_string(object)) ||
        !put(o, "created", json_integer(created)) || !put(o, "model", jstr(model ? model : ""))) {
        json_decref(o);
        return NULL;
    }
    return o;
}

const char *mmrt_finish_reason_name(enum mmrt_finish_reason reason)
{
    return reason == MMRT_FINISH_LENGTH ? "length" : "stop";
}

/* {"token", "logprob", "bytes"} of one token; logprob −inf (a token the model rules out) is
 * −9999.0, as vLLM writes it, since JSON has no infinity. */
static json_t *logprob_json(const struct mmrt_logprob *t)
{
    json_t *o = json_object(), *tok = jstr(t->text ? t->text : ""), *bytes = json_array();
    bool ok = o && tok && bytes;
    for (size_t i = 0; ok && i < json_string_length(tok); i++)
        ok = json_array_append_new(bytes,
                                   json_integer((unsigned char)json_string_value(tok)[i])) == 0;
    const double lp = t->logprob >= -9999.0f ? (double)t->logprob : -9999.0;
    ok = ok && put(o, "token", json_incref(tok)) && put(o, "logprob", json_real(lp)) &&
         put(o, "bytes", json_incref(bytes));
    json_decref(tok);
    json_decref(bytes);
    if (!ok) {
        json_decref(o);
        return NULL;
    }
    return o;
}

json_t *mmrt_chat_logprobs_entry(const struct mmrt_token_logprobs *lp)
{
    json_t *o = logprob_json(&lp->token), *top = json_array();
    bool ok = o && top;
    for (int i = 0; ok && i < lp->n_top; i++)
        ok = json_array_append_new(top, logprob_json(&lp->top[i])) == 0;
    ok = ok && put(o, "top_logprobs", json_incref(top));
    json_decref(top);
    if (!ok) {
        json_decref(o);
        return NULL;
    }
    return o;
}

/* "logprobs": null, or {"content": entries, "refusal": null}. */
static bool put_logprobs(json_t *choice, const json_t *entries)
{
    if (!entries)
        return put(choice, "logprobs", json_null());
    json_t *o = json_object();
    /* Shared, not copied: jansson counts the references (entries is not changed here). */
    bool ok = o && put(o, "content", json_incref((json_t *)entries)) &&
              put(o, "refusal", json_null());
    if (!ok) {
        json_decref(o);
        return false;
    }
    return put(choice, "logprobs", o);
}

char *mmrt_chat_completion_json(const char *id, long created, const char *model,
                                const struct mmrt_chat_choice *choices, int n,
                                const struct mmrt_chat_usage *usage)
{
    json_t *o = head(id, created, model, "chat.completion");
    json_t *arr = json_array();
    bool ok = o && arr;
    for (int i = 0; ok && i < n; i++) {
        json_t *msg = json_object(), *choice = json_object();
        ok = msg && choice;
        ok = ok && put(msg, "role", json_string("assistant")) &&
             put(msg, "content", jstr(choices[i].content ? choices[i].content : "")) &&
             put(msg, "refusal", json_null());
        ok = ok && put(choice, "index", json_integer(i)) &&
             put(choice, "message", json_incref(msg)) &&
             put_logprobs(choice, choices[i].logprobs) &&
             put(choice, "finish_reason", jstr(choices[i].finish_reason));
        ok = ok && json_array_append(arr, choice) == 0;
        json_decref(msg);
        json_decref(choice);
    }
    ok = ok && put(o, "choices", json_incref(arr));
    ok = ok && (!usage || put(o, "usage", usage_json(usage)));
    json_decref(arr);
    if (!ok) {
        json_decref(o);
        return NULL;
    }
    return dump(o);
}

char *mmrt_chat_chunk_json(const char *id, long created, const char *model, int index,
                           const char *role, const char *content, const char *finish_reason,
                           const struct mmrt_chat_usage *usage, bool include_usage,
                           const json_t *logprobs)
{
    json_t *o = head(id, created, model, "chat.completion.chunk");
    json_t *choices = json_array();
    bool ok = o && choices;
    if (ok && !usage) {
        json_t *choice = json_object(), *delta = json_object();
        ok = choice && delta;
        ok = ok && (!role || put(delta, "role", jstr(role))) &&
             (!content || put(delta, "content", jstr(content)));
        ok = ok && put(choice, "index", json_integer(index)) &&
             put(choice, "delta", json_incref(delta)) && put_logprobs(choice, logprobs) &&
             put(choice, "finish_reason", jstr(finish_reason)) &&
             json_array_append(choices, choice) == 0;
        json_decref(choice);
        json_decref(delta);
    }
    ok = ok && put(o, "choices", json_incref(choices));
    /* include_usage: "usage": null on every chunk, the totals on the last (choices []). */
    if (ok && usage)
        ok = put(o, "usage", usage_json(usage));
    else if (ok && include_usage)
        ok = put(o, "usage", json_null());
    json_decref(choices);
    if (!ok) {
        json_decref(o);
        return NULL;
    }
    return dump(o);
}

/* {"id", "object": "model", "created", "owned_by": "mmrt"}; NULL when out of memory. */
static json_t *model_object(const char *model, long created)
{
    json_t *m = json_object();
    if (m && put(m, "id", jstr(model ? model : "")) && put(m, "object", json_string("model")) &&
        put(m, "created", json_integer(created)) && put(m, "owned_by", json_string("mmrt")))
        return m;
    json_decref(m);
    return NULL;
}

char *mmrt_model_json(const char *model, long created)
{
    return dump(model_object(model, created));
}

char *mmrt_models_json(const char *model, long created)
{
    json_t *o = json_object(), *data = json_array(), *m = model_object(model, created);
    bool ok = o && data && m;
    ok = ok && json_array_append(data, m) == 0 && put(o, "object", json_string("list")) &&
         put(o, "data", json_incref(data));
    json_decref(m);
    json_decref(data);
    if (!ok) {
        json_decref(o);
        return NULL;
    }
    return dump(o);
}

char *mmrt_api_error_json_make(int http_status, const char *type, const char *code,
                               const char *param, const char *message)
{
    if (!type)
        type = http_status >= 500 ? "server_error" : "invalid_request_error";
    json_t *o = json_object(), *e = json_object();
    bool ok = o && e;
    ok = ok && put(e, "message", jstr(message ? message : "")) && put(e, "type", jstr(type)) &&
         put(e, "param", param && param[0] ? jstr(param) : json_null()) &&
         put(e, "code", jstr(code)) && put(o, "error", json_incref(e));
    json_decref(e);
    if (!ok) {
        json_decref(o);
        return NULL;
    }
    return dump(o);
}

char *mmrt_api_error_json(const struct mmrt_api_error *e)
{
    return mmrt_api_error_json_make(e->http_status, e->type, e->code, e->param, e->message);
}

int mmrt_api_status_http(mmrt_status st)
{
    switch (st) {
    case MMRT_OK:
        return 200;
    case MMRT_ERR_INVALID_ARG:
    case MMRT_ERR_LIMIT:
    case MMRT_ERR_FORMAT:
    case MMRT_ERR_UNSUPPORTED:
        return 400;
    case MMRT_ERR_NO_MEMORY:
    case MMRT_ERR_OUT_OF_POOL:
        return 503;
    case MMRT_ERR_CANCELLED:
        return 499;
    default:
        return 500;
    }
}

void mmrt_api_error_from_status(mmrt_status st, const char *detail, struct mmrt_api_error *e)
{
    memset(e, 0, sizeof *e);
    e->http_status = mmrt_api_status_http(st);
    e->type = e->http_status == 499   ? "cancelled"
              : e->http_status >= 500 ? "server_error"
                                      : "invalid_request_error";
    const char *m = detail && detail[0] ? detail : mmrt_status_message(st);
    size_t n = strnlen(m, sizeof e->message - 1);
    memcpy(e->message, m, n);
    e->message[n] = '\0';
}
