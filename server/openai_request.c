/*
 * server/openai_request.c — a chat-completions request body → struct mmrt_chat_request
 * (the rules are in openai.h).
 *
 * Order of the checks, so that a body with several faults is answered deterministically
 * and cheap faults are found before costly work: the JSON (json.h), then every top-level
 * key in document order (unknown and unsupported keys, and the type and range of every
 * scalar), then "model" (missing 400, not served 404), then the pairs of keys that must
 * agree, then the messages in order, decoding each image as it is reached. Nothing is
 * decoded before every cheaper check of the request has passed, except the images of
 * earlier parts of the same request.
 *
 * Ownership while building: the counts in r->req (n_messages, n_images, n_stop) are the
 * entries already filled and owned, so a failure at any point frees exactly what exists
 * (mmrt_chat_request_free).
 */
#include "openai.h"

#include <errno.h>
#include <fcntl.h>
#include <float.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "data_uri.h"
#include "formats/image.h"
#include "formats/json.h"
#include "json_schema.h"
#include "schema_cache.h"
#include "text.h"

struct parse {
    const struct mmrt_chat_limits *lim;
    struct mmrt_api_error *err;
    size_t max_image_bytes;
    int max_images;            /* the limit */
    int images_cap;            /* entries of r->images_: min(image parts, max_images) */
    char *root;                /* realpath(image_dir), resolved on first use */
};

/* ---- errors ---- */

static mmrt_status fail(struct parse *p, int http, mmrt_status st, const char *code,
                        const char *param, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));

static mmrt_status(fail)(struct parse *p, int http, mmrt_status st, const char *code,
                        const char *param, const char *fmt, ...)
{
    struct mmrt_api_error *e = p->err;
    e->http_status = http;
    e->type = http >= 500 ? "server_error" : "invalid_request_error";
    e->code = code;
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
    return st;
}
#ifdef __clang_analyzer__ /* see MMRT_RETURNS_STATUS in core/error.h */
#define fail(p, http, st, ...) MMRT_RETURNS_STATUS((fail)(p, http, st, __VA_ARGS__), (st))
#endif

/* A client's text for a message: at most 48 bytes, cut on a character boundary (the text is
 * valid UTF-8: jansson checked it), control characters as '?', "..." when cut. */
static const char *quote(char buf[64], const char *s, size_t len)
{
    size_t n = len;
    if (n > 48) {
        n = 48;
        while (n > 0 && ((unsigned char)s[n] & 0xc0) == 0x80)
            n--;
    }
    for (size_t i = 0; i < n; i++)
        buf[i] = (unsigned char)s[i] < 0x20 || s[i] == 0x7f ? '?' : s[i];
    if (n < len)
        memcpy(buf + n, "...", 3), n += 3;
    buf[n] = '\0';
    return buf;
}

static const char *quote_str(char buf[64], const json_t *v)
{
    return quote(buf, json_string_value(v), json_string_length(v));
}

/* "messages[2].content[0]" + ".image_url" into a fresh buffer. */
static void path_join(char *dst, size_t size, const char *base, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static void path_join(char *dst, size_t size, const char *base, const char *fmt, ...)
{
    int n = snprintf(dst, size, "%s", base);
    if (n < 0 || (size_t)n >= size)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(dst + n, size - (size_t)n, fmt, ap);
    va_end(ap);
}

static mmrt_status type_error(struct parse *p, const char *param, const char *expected,
                              const json_t *v)
{
    return fail(p, 400, MMRT_ERR_INVALID_ARG, NULL, param,
                "Invalid type for '%s': expected %s, but got %s instead.", param, expected,
                mmrt_json_type_name(v));
}

static mmrt_status missing(struct parse *p, const char *param)
{
    return fail(p, 400, MMRT_ERR_INVALID_ARG, NULL, param,
                "Missing required parameter: '%s'.", param);
}

static mmrt_status unsupported(struct parse *p, const char *param, const char *what)
{
    return fail(p, 400, MMRT_ERR_UNSUPPORTED, NULL, param, "mmrt does not support %s.", what);
}

static mmrt_status no_memory(struct parse *p)
{
    return fail(p, 503, MMRT_ERR_NO_MEMORY, NULL, NULL,
                "The server ran out of memory reading the request; retry later.");
}

/* ---- typed values (v is never NULL or null here) ---- */

static mmrt_status get_int(struct parse *p, const json_t *v, const char *param, long long min,
                           long long max, long long *out)
{
    if (!json_is_integer(v))
        return type_error(p, param, "an integer", v);
    const long long x = json_integer_value(v);
    if (x < min || x > max)
        return fail(p, 400, MMRT_ERR_INVALID_ARG, NULL, param,
                    "Invalid '%s': %lld is out of range; expected an integer from %lld to "
                    "%lld.", param, x, min, max);
    *out = x;
    return MMRT_OK;
}

/* A number in [lo, hi], or (lo, hi] when lo_open. */
static mmrt_status get_number(struct parse *p, const json_t *v, const char *param, double lo,
                              bool lo_open, double hi, double *out)
{
    if (!json_is_number(v))
        return type_error(p, param, "a number", v);
    const double x = json_number_value(v);
    if (!(lo_open ? x > lo : x >= lo) || !(x <= hi))
        return fail(p, 400, MMRT_ERR_INVALID_ARG, NULL, param,
                    "Invalid '%s': %g is out of range; expected a number %s %g and at most "
                    "%g.", param, x, lo_open ? "greater than" : "of at least", lo, hi);
    *out = x;
    return MMRT_OK;
}

static mmrt_status get_bool(struct parse *p, const json_t *v, const char *param, bool *out)
{
    if (!json_is_boolean(v))
        return type_error(p, param, "a boolean", v);
    *out = json_is_true(v);
    return MMRT_OK;
}

/* An object whose keys are all in `allowed` (NULL-terminated); the first other key is 400. */
static mmrt_status check_object_keys(struct parse *p, const json_t *obj, const char *param,
                                     const char *const *allowed)
{
    const char *key;
    const json_t *v;
    json_object_foreach((json_t *)obj, key, v) {
        bool ok = false;
        for (const char *const *a = allowed; *a && !ok; a++)
            ok = strcmp(key, *a) == 0;
        if (!ok) {
            char q[64], where[sizeof p->err->param];
            path_join(where, sizeof where, param, ".%s", quote(q, key, strlen(key)));
            return fail(p, 400, MMRT_ERR_INVALID_ARG, NULL, where,
                        "Unrecognized key in '%s': '%s'.", param, q);
        }
    }
    return MMRT_OK;
}

/* response_format {"type": "json_schema", "json_schema": {"name", "schema", "strict",
 * "description"}}: the schema is handed on as compact JSON text and compiled here (in the
 * runtime's cache, where the runtime and the engine find it), so that one mmrt cannot hold
 * an answer to is this request's 400 naming the place in it. */
static mmrt_status parse_json_schema(struct parse *p, struct mmrt_chat_request *r,
                                     const json_t *rf)
{
    static const char *const rf_keys[] = { "type", "json_schema", NULL };
    static const char *const js_keys[] = { "name", "description", "schema", "strict", NULL };
    mmrt_status st = check_object_keys(p, rf, "response_format", rf_keys);
    if (st != MMRT_OK)
        return st;
    const json_t *js = json_object_get(rf, "json_schema");
    if (!js || json_is_null(js))
        return missing(p, "response_format.json_schema");
    if (!json_is_object(js))
        return type_error(p, "response_format.json_schema", "an object", js);
    if ((st = check_object_keys(p, js, "response_format.json_schema", js_keys)) != MMRT_OK)
        return st;
    const json_t *name = json_object_get(js, "name");
    if (!name || json_is_null(name))
        return missing(p, "response_format.json_schema.name");
    if (!json_is_string(name))
        return type_error(p, "response_format.json_schema.name", "a string", name);
    /* OpenAI's rule for the name: 1 to 64 of a-z, A-Z, 0-9, '_' and '-'. */
    const char *ns = json_string_value(name);
    const size_t nlen = json_string_length(name);
    bool name_ok = nlen >= 1 && nlen <= 64;
    for (size_t i = 0; name_ok && i < nlen; i++)
        name_ok = (ns[i] >= 'a' && ns[i] <= 'z') || (ns[i] >= 'A' && ns[i] <= 'Z') ||
                  (ns[i] >= '0' && ns[i] <= '9') || ns[i] == '_' || ns[i] == '-';
    if (!name_ok) {
        char q[64];
        return fail(p, 400, MMRT_ERR_INVALID_ARG, NULL, "response_format.json_schema.name",
                    "Invalid 'response_format.json_schema.name': '%s'. It must be 1 to 64 "
                    "characters of a-z, A-Z, 0-9, '_' and '-'.", quote_str(q, name));
    }
    const json_t *desc = json_object_get(js, "description");
    if (desc && !json_is_null(desc) && !json_is_string(desc))
        return type_error(p, "response_format.json_schema.description", "a string", desc);
    const json_t *strict = json_object_get(js, "strict");
    if (strict && !json_is_null(strict) && !json_is_boolean(strict))
        return type_error(p, "response_format.json_schema.strict", "a boolean", strict);
    const json_t *schema = json_object_get(js, "schema");
    if (!schema || json_is_null(schema))
        return missing(p, "response_format.json_schema.schema");
    if (!json_is_object(schema) && !json_is_boolean(schema))
        return type_error(p, "response_format.json_schema.schema", "an object", schema);
    /* ENCODE_ANY: the boolean schemas true and false are texts the compiler reads too. */
    r->schema_ = json_dumps(schema, JSON_COMPACT | JSON_ENCODE_ANY);
    if (!r->schema_)
        return fail(p, 503, MMRT_ERR_NO_MEMORY, NULL, NULL, "Out of memory.");
    struct mmrt_json_schema *compiled = NULL;
    struct mmrt_error e = { 0 };
    const size_t len = strlen(r->schema_);
    st = p->lim->schemas ? mmrt_runtime_json_schema(p->lim->schemas, r->schema_, len, &compiled,
                                                    &e)
                         : mmrt_json_schema_parse(r->schema_, len, &compiled, &e);
    mmrt_json_schema_free(compiled);
    if (st == MMRT_ERR_NO_MEMORY)
        return fail(p, 503, st, NULL, NULL, "Out of memory.");
    if (st != MMRT_OK)
        return fail(p, 400, MMRT_ERR_INVALID_ARG, NULL, "response_format.json_schema.schema",
                    "Invalid schema for response_format '%s': %s", ns, e.msg);
    r->req.json_schema = r->schema_;
    r->req.response_format = MMRT_RESPONSE_JSON_SCHEMA;
    return MMRT_OK;
}

/* prediction {"type": "content", "content": TEXT or [{"type": "text", "text": TEXT}, ...]}
 * (OpenAI's predicted outputs): the parts joined, handed on as mmrt_request.prediction. */
static mmrt_status parse_prediction(struct parse *p, struct mmrt_chat_request *r,
                                    const json_t *v)
{
    static const char *const keys[] = { "type", "content", NULL };
    static const char *const part_keys[] = { "type", "text", NULL };
    if (!json_is_object(v))
        return type_error(p, "prediction", "an object", v);
    mmrt_status st = check_object_keys(p, v, "prediction", keys);
    if (st != MMRT_OK)
        return st;
    const json_t *t = json_object_get(v, "type"), *c = json_object_get(v, "content");
    if (!t || json_is_null(t))
        return missing(p, "prediction.type");
    if (!json_is_string(t) || strcmp(json_string_value(t), "content") != 0)
        return fail(p, 400, MMRT_ERR_INVALID_ARG, NULL, "prediction.type",
                    "Invalid 'prediction.type': expected 'content'.");
    if (!c || json_is_null(c))
        return missing(p, "prediction.content");
    if (json_is_string(c))
        return (r->prediction_ = strdup(json_string_value(c))) ? MMRT_OK : no_memory(p);
    if (!json_is_array(c))
        return type_error(p, "prediction.content", "a string or an array of text parts", c);
    size_t len = 0, i;
    const json_t *part;
    char where[sizeof p->err->param];
    json_array_foreach(c, i, part) {
        snprintf(where, sizeof where, "prediction.content[%zu]", i);
        if (!json_is_object(part))
            return type_error(p, where, "an object", part);
        if ((st = check_object_keys(p, part, where, part_keys)) != MMRT_OK)
            return st;
        const json_t *pt = json_object_get(part, "type"), *text = json_object_get(part, "text");
        if (!json_is_string(pt) || strcmp(json_string_value(pt), "text") != 0) {
            snprintf(where, sizeof where, "prediction.content[%zu].type", i);
            return fail(p, 400, MMRT_ERR_INVALID_ARG, NULL, where,
                        "Invalid '%s': expected 'text'.", where);
        }
        if (!json_is_string(text)) {
            snprintf(where, sizeof where, "prediction.content[%zu].text", i);
            return text ? type_error(p, where, "a string", text) : missing(p, where);
        }
        len += json_string_length(text); /* bounded by the body: no overflow */
    }
    if (!(r->prediction_ = malloc(len + 1)))
        return no_memory(p);
    len = 0;
    json_array_foreach(c, i, part) {
        const json_t *text = json_object_get(part, "text");
        memcpy(r->prediction_ + len, json_string_value(text), json_string_length(text));
        len += json_string_length(text);
    }
    r->prediction_[len] = '\0';
    return MMRT_OK;
}

/* ---- top-level keys ---- */

/* Keys that are recognised and either must hold their "off" value (null always does) or are
 * checked for type only. Returns MMRT_OK for a key that is fine, a failure otherwise; *known
 * is false for a key none of the checks know. */
static mmrt_status check_top_key(struct parse *p, struct mmrt_chat_request *r, const char *k,
                                 const json_t *v, bool *known, bool *have_stream_options,
                                 long long *max_tokens, long long *max_completion_tokens)
{
    /* Every key the API defines. Known-ness is decided first: an unknown key is refused
     * whatever its value, null included (OpenAI does the same). */
    static const char *const keys[] = {
        "model", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p",
        "top_k", "seed", "stop", "stream", "stream_options", "n", "presence_penalty",
        "frequency_penalty", "repetition_penalty", "logit_bias", "logprobs", "response_format",
        "user", "service_tier", "metadata", "store", "parallel_tool_calls", "tools", "functions",
        "tool_choice", "function_call", "modalities", "top_logprobs", "audio", "prediction",
        "web_search_options", NULL,
    };
    *known = false;
    for (const char *const *c = keys; *c && !*known; c++)
        *known = strcmp(k, *c) == 0;
    if (!*known)
        return MMRT_OK;
    if (strcmp(k, "model") == 0 || strcmp(k, "messages") == 0)
        return MMRT_OK; /* after this pass */
    if (json_is_null(v))
        return MMRT_OK; /* every optional key: null = absent */
    mmrt_status st;
    if (strcmp(k, "max_tokens") == 0 || strcmp(k, "max_completion_tokens") == 0) {
        long long x = 0;
        if ((st = get_int(p, v, k, 1, INT_MAX, &x)) != MMRT_OK)
            return st;
        *(strcmp(k, "max_tokens") == 0 ? max_tokens : max_completion_tokens) = x;
        return MMRT_OK;
    }
    if (strcmp(k, "temperature") == 0) {
        double x = 0;
        if ((st = get_number(p, v, k, 0, false, 2, &x)) != MMRT_OK)
            return st;
        r->req.temperature = (float)x;
        return MMRT_OK;
    }
    if (strcmp(k, "top_p") == 0) {
        double x = 0;
        if ((st = get_number(p, v, k, 0, true, 1, &x)) != MMRT_OK)
            return st;
        /* (float)1e-300 is 0, which the sampler refuses: keep it positive. */
        r->req.top_p = (float)x > 0 ? (float)x : FLT_MIN;
        return MMRT_OK;
    }
    if (strcmp(k, "top_k") == 0) {
        long long x = 0;
        if ((st = get_int(p, v, k, 0, INT_MAX, &x)) != MMRT_OK)
            return st;
        r->req.top_k = (int)x;
        return MMRT_OK;
    }
    if (strcmp(k, "seed") == 0) {
        long long x = 0;
        if ((st = get_int(p, v, k, LLONG_MIN, LLONG_MAX, &x)) != MMRT_OK)
            return st;
        r->req.seed = (uint64_t)x; /* two's complement for negative seeds (openai.h) */
        r->seed_given = true;
        return MMRT_OK;
    }
    if (strcmp(k, "stop") == 0)
        return MMRT_OK; /* after this pass: it allocates */
    if (strcmp(k, "stream") == 0)
        return get_bool(p, v, k, &r->stream);
    if (strcmp(k, "stream_options") == 0) {
        if (!json_is_object(v))
            return type_error(p, k, "an object", v);
        static const char *const so_keys[] = { "include_usage", NULL };
        if ((st = check_object_keys(p, v, k, so_keys)) != MMRT_OK)
            return st;
        const json_t *u = json_object_get(v, "include_usage");
        if (u && !json_is_null(u) &&
            (st = get_bool(p, u, "stream_options.include_usage", &r->include_usage)) != MMRT_OK)
            return st;
        *have_stream_options = true;
        return MMRT_OK;
    }
    if (strcmp(k, "n") == 0) {
        if (!json_is_integer(v))
            return type_error(p, k, "an integer", v);
        const json_int_t n = json_integer_value(v);
        if (n < 1 || n > MMRT_CHAT_MAX_CHOICES)
            return fail(p, 400, MMRT_ERR_INVALID_ARG, NULL, k,
                        "n must be 1 to %d (got %lld): each choice is a sequence of its own "
                        "in the engine.", MMRT_CHAT_MAX_CHOICES, (long long)n);
        r->n = (int)n;
        return MMRT_OK;
    }
    if (strcmp(k, "presence_penalty") == 0 || strcmp(k, "frequency_penalty") == 0) {
        double x = 0;
        if ((st = get_number(p, v, k, -2, false, 2, &x)) != MMRT_OK)
            return st;
        if (strcmp(k, "presence_penalty") == 0)
            r->req.presence_penalty = (float)x;
        else
            r->req.frequency_penalty = (float)x;
        return MMRT_OK;
    }
    if (strcmp(k, "repetition_penalty") == 0) { /* an extension, as vLLM's */
        double x = 0;
        if ((st = get_number(p, v, k, 0, true, 100, &x)) != MMRT_OK)
            return st;
        /* (float)1e-300 is 0, which means "off": keep it positive. */
        r->req.repetition_penalty = (float)x > 0 ? (float)x : FLT_MIN;
        return MMRT_OK;
    }
    if (strcmp(k, "logit_bias") == 0)
        return MMRT_OK; /* after this pass: it allocates */
    if (strcmp(k, "logprobs") == 0) {
        bool b = false;
        if ((st = get_bool(p, v, k, &b)) != MMRT_OK)
            return st;
        r->req.logprobs = b;
        return MMRT_OK;
    }
    if (strcmp(k, "top_logprobs") == 0) {
        long long x = 0;
        if ((st = get_int(p, v, k, 0, MMRT_MAX_TOP_LOGPROBS, &x)) != MMRT_OK)
            return st;
        r->req.top_logprobs = (int)x;
        return MMRT_OK;
    }
    if (strcmp(k, "response_format") == 0) {
        if (!json_is_object(v))
            return type_error(p, k, "an object", v);
        const json_t *t = json_object_get(v, "type");
        if (!t || json_is_null(t))
            return missing(p, "response_format.type");
        if (!json_is_string(t))
            return type_error(p, "response_format.type", "a string", t);
        const char *ts = json_string_value(t);
        if (strcmp(ts, "json_schema") == 0)
            return parse_json_schema(p, r, v);
        if (strcmp(ts, "text") != 0 && strcmp(ts, "json_object") != 0) {
            char q[64];
            return fail(p, 400, MMRT_ERR_INVALID_ARG, NULL, "response_format.type",
                        "Invalid value for 'response_format.type': '%s'. Supported values "
                        "are: 'text', 'json_object' and 'json_schema'.", quote_str(q, t));
        }
        r->req.response_format = strcmp(ts, "json_object") == 0 ? MMRT_RESPONSE_JSON_OBJECT
                                                                : MMRT_RESPONSE_TEXT;
        static const char *const rf_keys[] = { "type", NULL };
        return check_object_keys(p, v, k, rf_keys);
    }
    /* Accepted and ignored (they concern OpenAI's accounting, not the answer). */
    if (strcmp(k, "user") == 0 || strcmp(k, "service_tier") == 0)
        return json_is_string(v) ? MMRT_OK : type_error(p, k, "a string", v);
    if (strcmp(k, "metadata") == 0)
        return json_is_object(v) ? MMRT_OK : type_error(p, k, "an object", v);
    if (strcmp(k, "store") == 0 || strcmp(k, "parallel_tool_calls") == 0) {
        bool b = false;
        return get_bool(p, v, k, &b);
    }
    /* Features mmrt does not have: their "off" value passes, anything else says so. */
    if (strcmp(k, "tools") == 0 || strcmp(k, "functions") == 0) {
        if (json_is_array(v) && json_array_size(v) == 0)
            return MMRT_OK;
        return unsupported(p, k, k[0] == 't' ? "tools (function calling)"
                                              : "functions (function calling)");
    }
    if (strcmp(k, "tool_choice") == 0 || strcmp(k, "function_call") == 0) {
        if (json_is_string(v) && strcmp(json_string_value(v), "none") == 0)
            return MMRT_OK;
        return unsupported(p, k, k[0] == 't' ? "tool_choice (function calling)"
                                              : "function_call (function calling)");
    }
    if (strcmp(k, "modalities") == 0) {
        if (json_is_array(v) && json_array_size(v) == 1 &&
            json_is_string(json_array_get(v, 0)) &&
            strcmp(json_string_value(json_array_get(v, 0)), "text") == 0)
            return MMRT_OK;
        return unsupported(p, k, "modalities other than [\"text\"]");
    }
    if (strcmp(k, "prediction") == 0) {
        mmrt_status pst = parse_prediction(p, r, v);
        r->req.prediction = r->prediction_;
        return pst;
    }
    static const char *const null_only[] = { "audio", "web_search_options", NULL };
    for (const char *const *u = null_only; *u; u++)
        if (strcmp(k, *u) == 0)
            return unsupported(p, k, *u);
    return fail(p, 500, MMRT_ERR_INTERNAL, NULL, k, "Internal error: '%s' has no check.", k);
}

/* {"TOKEN_ID": bias, …}: keys are token ids written in decimal (OpenAI's form), biases
 * numbers in [−100, 100]. Whether an id is in the model's vocabulary is the runtime's to say
 * (a 400 naming the entry). */
static mmrt_status parse_logit_bias(struct parse *p, struct mmrt_chat_request *r,
                                    const json_t *v)
{
    if (!v || json_is_null(v))
        return MMRT_OK;
    if (!json_is_object(v))
        return type_error(p, "logit_bias", "an object", v);
    const size_t n = json_object_size(v);
    if (n > MMRT_MAX_LOGIT_BIAS)
        return fail(p, 400, MMRT_ERR_INVALID_ARG, NULL, "logit_bias",
                    "Invalid 'logit_bias': %zu entries; mmrt takes at most %d.", n,
                    MMRT_MAX_LOGIT_BIAS);
    if (n == 0)
        return MMRT_OK;
    if (!(r->bias_ = calloc(n, sizeof *r->bias_)))
        return no_memory(p);
    r->req.logit_bias = r->bias_;
    const char *key;
    const json_t *b;
    json_object_foreach((json_t *)v, key, b) {
        char q[64], param[sizeof p->err->param];
        path_join(param, sizeof param, "logit_bias", ".%s", quote(q, key, strlen(key)));
        /* Digits only: no sign, no space, no leading zero but "0" itself. */
        const size_t len = strlen(key);
        bool digits = len >= 1 && len <= 10 && (key[0] != '0' || len == 1);
        for (size_t i = 0; digits && i < len; i++)
            digits = key[i] >= '0' && key[i] <= '9';
        const long long id = digits ? strtoll(key, NULL, 10) : -1;
        if (!digits || id > INT32_MAX)
            return fail(p, 400, MMRT_ERR_INVALID_ARG, NULL, param,
                        "Invalid key in 'logit_bias': '%s' is not a token id (a decimal "
                        "integer from 0 to %d).", q, INT32_MAX);
        double x = 0;
        mmrt_status st = get_number(p, b, param, -100, false, 100, &x);
        if (st != MMRT_OK)
            return st;
        r->bias_[r->req.n_logit_bias++] = (struct mmrt_logit_bias){ .token_id = (int32_t)id,
                                                                     .bias = (float)x };
    }
    return MMRT_OK;
}

static mmrt_status parse_stop(struct parse *p, struct mmrt_chat_request *r, const json_t *v)
{
    if (!v || json_is_null(v))
        return MMRT_OK;
    const bool one = json_is_string(v);
    if (!one && !json_is_array(v))
        return type_error(p, "stop", "a string or an array of strings", v);
    const size_t n = one ? 1 : json_array_size(v);
    if (n > MMRT_MAX_STOP)
        return fail(p, 400, MMRT_ERR_INVALID_ARG, NULL, "stop",
                    "Invalid 'stop': %zu stop strings; mmrt takes at most %d.", n,
                    MMRT_MAX_STOP);
    if (n == 0)
        return MMRT_OK;
    if (!(r->stop_ = calloc(n, sizeof *r->stop_)))
        return no_memory(p);
    r->req.stop = (const char *const *)r->stop_;
    for (size_t i = 0; i < n; i++) {
        const json_t *s = one ? v : json_array_get(v, i);
        char param[32];
        snprintf(param, sizeof param, one ? "stop" : "stop[%zu]", i);
        if (!json_is_string(s))
            return type_error(p, param, "a string", s);
        const size_t len = json_string_length(s);
        if (len == 0 || len > MMRT_MAX_STOP_BYTES)
            return fail(p, 400, MMRT_ERR_INVALID_ARG, NULL, param,
                        "Invalid '%s': a stop string of %zu bytes; it must have 1 to %d.",
                        param, len, MMRT_MAX_STOP_BYTES);
        if (!(r->stop_[i] = strndup(json_string_value(s), len)))
            return no_memory(p);
        r->req.n_stop = (int)i + 1;
    }
    return MMRT_OK;
}

/* ---- images ---- */

/* The one answer for every local path that is not a usable file inside image_dir, so that
 * no request can tell a missing file from one outside the directory. */
static mmrt_status not_under_dir(struct parse *p, const char *param, const char *path)
{
    char q[64];
    return fail(p, 400, MMRT_ERR_INVALID_ARG, NULL, param,
                "Invalid '%s': '%s' is not a readable image file inside this server's image "
                "directory.", param, quote(q, path, strlen(path)));
}

/* path lies lexically under dir ("dir/…"); dir has no trailing '/' unless it is "/". */
static bool lexically_under(const char *path, const char *dir)
{
    const size_t n = strlen(dir);
    if (n == 1 && dir[0] == '/')
        return path[0] == '/';
    return strncmp(path, dir, n) == 0 && path[n] == '/';
}

static mmrt_status local_image(struct parse *p, const char *path, const char *param,
                               struct mmrt_image_input *out)
{
    const struct mmrt_chat_limits *lim = p->lim;
    char q[64];
    if (!lim->image_dir || !lim->image_dir[0])
        return fail(p, 400, MMRT_ERR_INVALID_ARG, NULL, param,
                    "Invalid '%s': this server does not read local image paths (its [server] "
                    "image_dir is not set); send the image inline as a data: URI "
                    "(data:image/png;base64,...).", param);
    const size_t len = strlen(path);
    if (len == 0)
        return fail(p, 400, MMRT_ERR_INVALID_ARG, NULL, param,
                    "Invalid '%s': an empty image path.", param);
    if (len >= PATH_MAX)
        return fail(p, 400, MMRT_ERR_INVALID_ARG, NULL, param,
                    "Invalid '%s': an image path of %zu bytes (at most %d).", param, len,
                    PATH_MAX - 1);
    for (const char *c = path; *c;) { /* no ".." component, wherever it would lead */
        const char *e = strchr(c, '/');
        const size_t n = e ? (size_t)(e - c) : strlen(c);
        if (n == 2 && c[0] == '.' && c[1] == '.')
            return fail(p, 400, MMRT_ERR_INVALID_ARG, NULL, param,
                        "Invalid '%s': '%s' has a '..' component; image paths may not "
                        "leave the image directory.", param, quote(q, path, len));
        c = e ? e + 1 : c + n;
    }
    if (!p->root) {
        p->root = realpath(lim->image_dir, NULL);
        if (!p->root)
            return fail(p, 500, MMRT_ERR_INVALID_ARG, NULL, NULL,
                        "The server's image directory cannot be resolved (%s).",
                        strerror(errno));
    }
    /* The directory as configured, without trailing slashes: a client may name files
     * through it or through its real path. */
    char given[PATH_MAX];
    snprintf(given, sizeof given, "%s", lim->image_dir);
    for (size_t n = strlen(given); n > 1 && given[n - 1] == '/'; n--)
        given[n - 1] = '\0';
    char cand[2 * PATH_MAX];
    if (path[0] == '/') {
        /* Resolve only what already names a place inside the directory, so realpath never
         * answers questions about the rest of the file system. */
        if (!lexically_under(path, p->root) && !lexically_under(path, given))
            return not_under_dir(p, param, path);
        snprintf(cand, sizeof cand, "%s", path);
    } else {
        snprintf(cand, sizeof cand, "%s/%s", p->root, path);
    }
    char *real = realpath(cand, NULL);
    if (!real)
        return errno == ENOMEM ? no_memory(p) : not_under_dir(p, param, path);
    if (!lexically_under(real, p->root)) { /* a symlink that leads out */
        free(real);
        return not_under_dir(p, param, path);
    }
    /* A FIFO must not block the open, a terminal must not become ours, and the resolved
     * path must still be the file (not a symlink swapped in since realpath). */
    int fd = open(real, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    struct stat sb;
    if (fd < 0 || fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        if (fd >= 0)
            close(fd);
        free(real);
        return not_under_dir(p, param, path);
    }
    close(fd);
    if (sb.st_size == 0) {
        free(real);
        return fail(p, 400, MMRT_ERR_INVALID_ARG, NULL, param,
                    "Invalid '%s': '%s' is an empty file.", param, quote(q, path, len));
    }
    if ((uint64_t)sb.st_size > p->max_image_bytes) {
        free(real);
        return fail(p, 413, MMRT_ERR_LIMIT, "image_too_large", param,
                    "Invalid '%s': the image file has %lld bytes, more than the %zu this "
                    "server takes.", param, (long long)sb.st_size, p->max_image_bytes);
    }
    out->path = real;
    return MMRT_OK;
}

static int hex_digit(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/* file:///ABS or file://localhost/ABS, percent-escapes decoded, into a local path. */
static mmrt_status file_url(struct parse *p, const char *url, size_t len, const char *param,
                            struct mmrt_image_input *out)
{
    const char *s = url + 5, *end = url + len; /* after "file:" */
    if (end - s < 3 || s[0] != '/' || s[1] != '/')
        goto bad;
    s += 2;
    if (end - s >= 9 && strncasecmp(s, "localhost", 9) == 0)
        s += 9;
    if (s == end || *s != '/')
        goto bad;
    char *path = malloc((size_t)(end - s) + 1);
    if (!path)
        return no_memory(p);
    size_t o = 0;
    for (; s < end; s++) {
        if (*s == '?' || *s == '#') {
            free(path);
            return fail(p, 400, MMRT_ERR_INVALID_ARG, NULL, param,
                        "Invalid '%s': a file: URL with a query or fragment; escape '?' and "
                        "'#' as %%3F and %%23.", param);
        }
        if (*s != '%') {
            path[o++] = *s;
            continue;
        }
        const int hi = end - s > 2 ? hex_digit(s[1]) : -1;
        const int lo = end - s > 2 ? hex_digit(s[2]) : -1;
        if (hi < 0 || lo < 0 || (hi == 0 && lo == 0)) {
            free(path);
            return fail(p, 400, MMRT_ERR_INVALID_ARG, NULL, param,
                        "Invalid '%s': a bad percent-escape in the file: URL (%%XX with two "
                        "hex digits, not %%00).", param);
        }
        path[o++] = (char)(hi * 16 + lo);
        s += 2;
    }
    path[o] = '\0';
    mmrt_status st = local_image(p, path, param, out);
    free(path);
    return st;
bad:
    return fail(p, 400, MMRT_ERR_INVALID_ARG, NULL, param,
                "Invalid '%s': a file: URL must be file:///ABSOLUTE/PATH (no host but "
                "localhost).", param);
}

static bool has_prefix_ci(const char *s, size_t len, const char *prefix)
{
    const size_t n = strlen(prefix);
    return len >= n && strncasecmp(s, prefix, n) == 0;
}

/* Length of an RFC 3986 scheme followed by ':' at the start of s, or 0. */
static size_t scheme_len(const char *s, size_t len)
{
    if (len == 0 || !((s[0] >= 'a' && s[0] <= 'z') || (s[0] >= 'A' && s[0] <= 'Z')))
        return 0;
    for (size_t i = 1; i < len; i++) {
        const char c = s[i];
        if (c == ':')
            return i;
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '+' || c == '-' || c == '.'))
            return 0;
    }
    return 0;
}

static mmrt_status image_from_url(struct parse *p, const json_t *url, const char *param,
                                  struct mmrt_image_input *out)
{
    const char *u = json_string_value(url);
    const size_t len = json_string_length(url);
    char q[64];
    if (has_prefix_ci(u, len, "data:")) {
        struct mmrt_data_uri d;
        struct mmrt_error e = { 0 };
        const mmrt_status st = mmrt_data_uri_decode(u, len, p->max_image_bytes, &d, &e);
        switch (st) {
        case MMRT_OK:
            out->data = d.data;
            out->size = d.size;
            return MMRT_OK;
        case MMRT_ERR_LIMIT:
            return fail(p, 413, st, "image_too_large", param, "Invalid '%s': %s.", param,
                        e.msg);
        case MMRT_ERR_NO_MEMORY:
            return no_memory(p);
        default:
            return fail(p, 400, st, "invalid_image_url", param, "Invalid '%s': %s.", param,
                        e.msg);
        }
    }
    const size_t sl = scheme_len(u, len);
    if (sl == 4 && strncasecmp(u, "file", 4) == 0)
        return file_url(p, u, len, param, out);
    if ((sl == 4 && strncasecmp(u, "http", 4) == 0) ||
        (sl == 5 && strncasecmp(u, "https", 5) == 0))
        return fail(p, 400, MMRT_ERR_INVALID_ARG, "invalid_image_url", param,
                    "Invalid '%s': this server never fetches URLs; send the image inline as a "
                    "data: URI (data:image/png;base64,... or data:image/jpeg;base64,...).",
                    param);
    if (sl > 0)
        return fail(p, 400, MMRT_ERR_INVALID_ARG, "invalid_image_url", param,
                    "Invalid '%s': unsupported URL scheme '%s'; send the image inline as a "
                    "data: URI.", param, quote(q, u, sl));
    return local_image(p, u, param, out);
}

/* ---- messages ---- */

static mmrt_status parse_image_part(struct parse *p, struct mmrt_chat_request *r,
                                    const json_t *part, const char *where, const char *role)
{
    static const char *const part_keys[] = { "type", "image_url", NULL };
    static const char *const url_keys[] = { "url", "detail", NULL };
    char param[sizeof p->err->param];
    mmrt_status st;
    if (strcmp(role, "user") != 0)
        return fail(p, 400, MMRT_ERR_INVALID_ARG, NULL, where,
                    "Invalid '%s': images are only allowed in user messages (this one is "
                    "'%s').", where, role);
    if ((st = check_object_keys(p, part, where, part_keys)) != MMRT_OK)
        return st;
    const json_t *iu = json_object_get(part, "image_url");
    path_join(param, sizeof param, where, ".image_url");
    if (!iu || json_is_null(iu))
        return missing(p, param);
    if (!json_is_object(iu))
        return type_error(p, param, "an object", iu);
    if ((st = check_object_keys(p, iu, param, url_keys)) != MMRT_OK)
        return st;
    const json_t *detail = json_object_get(iu, "detail");
    if (detail && !json_is_null(detail)) {
        char dp[sizeof param], q[64];
        path_join(dp, sizeof dp, param, ".detail");
        if (!json_is_string(detail))
            return type_error(p, dp, "a string", detail);
        const char *d = json_string_value(detail);
        if (strcmp(d, "auto") != 0 && strcmp(d, "low") != 0 && strcmp(d, "high") != 0)
            return fail(p, 400, MMRT_ERR_INVALID_ARG, NULL, dp,
                        "Invalid value for '%s': '%s'. Supported values are: 'auto', 'low' "
                        "and 'high'.", dp, quote_str(q, detail));
    }
    const json_t *url = json_object_get(iu, "url");
    path_join(param, sizeof param, where, ".image_url.url");
    if (!url || json_is_null(url))
        return missing(p, param);
    if (!json_is_string(url))
        return type_error(p, param, "a string", url);
    if (p->max_images == 0)
        return fail(p, 400, MMRT_ERR_INVALID_ARG, "too_many_images", where,
                    "Invalid '%s': the served model takes no images.", where);
    if (r->req.n_images >= p->max_images)
        return fail(p, 400, MMRT_ERR_INVALID_ARG, "too_many_images", where,
                    "Invalid '%s': too many images; the served model takes at most %d per "
                    "request.", where, p->max_images);
    if (r->req.n_images >= p->images_cap) /* cannot happen: the count saw every image part */
        return fail(p, 500, MMRT_ERR_INTERNAL, NULL, where, "Internal error counting images.");
    struct mmrt_image_input *im = &r->images_[r->req.n_images];
    *im = (struct mmrt_image_input){ 0 };
    if ((st = image_from_url(p, url, param, im)) != MMRT_OK)
        return st;
    r->req.n_images++;
    return MMRT_OK;
}

/* Content of message i: its text joined into *text, its images appended to r. */
static mmrt_status parse_content(struct parse *p, struct mmrt_chat_request *r,
                                 const json_t *content, const char *mpath, const char *role,
                                 struct mmrt_text *text, bool *has_text)
{
    char cpath[sizeof p->err->param];
    path_join(cpath, sizeof cpath, mpath, ".content");
    if (!content || json_is_null(content))
        return missing(p, cpath);
    if (json_is_string(content)) {
        /* addn allocates even for "", so an empty string stays a string */
        mmrt_text_addn(text, json_string_value(content), json_string_length(content));
        *has_text = true;
        return text->failed ? no_memory(p) : MMRT_OK;
    }
    if (!json_is_array(content))
        return type_error(p, cpath, "a string or an array of content parts", content);
    if (json_array_size(content) == 0)
        return fail(p, 400, MMRT_ERR_INVALID_ARG, NULL, cpath,
                    "Invalid '%s': empty array. Expected an array with minimum length 1, but "
                    "got an empty array instead.", cpath);
    static const char *const text_keys[] = { "type", "text", NULL };
    size_t j;
    const json_t *part;
    json_array_foreach(content, j, part) {
        char where[sizeof p->err->param], param[sizeof p->err->param], q[64];
        mmrt_status st;
        path_join(where, sizeof where, cpath, "[%zu]", j);
        if (!json_is_object(part))
            return type_error(p, where, "an object", part);
        const json_t *type = json_object_get(part, "type");
        path_join(param, sizeof param, where, ".type");
        if (!type || json_is_null(type))
            return missing(p, param);
        if (!json_is_string(type))
            return type_error(p, param, "a string", type);
        const char *t = json_string_value(type);
        if (strcmp(t, "text") == 0) {
            if ((st = check_object_keys(p, part, where, text_keys)) != MMRT_OK)
                return st;
            const json_t *s = json_object_get(part, "text");
            path_join(param, sizeof param, where, ".text");
            if (!s || json_is_null(s))
                return missing(p, param);
            if (!json_is_string(s))
                return type_error(p, param, "a string", s);
            if (*has_text) /* the parts of one message are joined by a line break */
                mmrt_text_add(text, "\n");
            mmrt_text_addn(text, json_string_value(s), json_string_length(s));
            *has_text = true;
            if (text->failed)
                return no_memory(p);
        } else if (strcmp(t, "image_url") == 0) {
            if ((st = parse_image_part(p, r, part, where, role)) != MMRT_OK)
                return st;
        } else if (strcmp(t, "input_audio") == 0 || strcmp(t, "file") == 0 ||
                   strcmp(t, "refusal") == 0) {
            return fail(p, 400, MMRT_ERR_UNSUPPORTED, NULL, param,
                        "mmrt does not support content parts of type '%s'.", t);
        } else {
            return fail(p, 400, MMRT_ERR_INVALID_ARG, NULL, param,
                        "Invalid value for '%s': '%s'. Supported values are: 'text' and "
                        "'image_url'.", param, quote_str(q, type));
        }
    }
    return MMRT_OK;
}

static mmrt_status parse_message(struct parse *p, struct mmrt_chat_request *r, size_t i,
                                 const json_t *m)
{
    static const char *const keys[] = { "role", "content", "name", "tool_calls",
                                        "tool_call_id", "function_call", "refusal", "audio",
                                        NULL };
    char mpath[32], param[sizeof p->err->param], q[64];
    mmrt_status st;
    snprintf(mpath, sizeof mpath, "messages[%zu]", i);
    if (!json_is_object(m))
        return type_error(p, mpath, "an object", m);
    if ((st = check_object_keys(p, m, mpath, keys)) != MMRT_OK)
        return st;
    const json_t *role = json_object_get(m, "role");
    path_join(param, sizeof param, mpath, ".role");
    if (!role || json_is_null(role))
        return missing(p, param);
    if (!json_is_string(role))
        return type_error(p, param, "a string", role);
    const char *rs = json_string_value(role), *r_role;
    if (strcmp(rs, "system") == 0 || strcmp(rs, "developer") == 0)
        r_role = "system"; /* developer is OpenAI's newer name for the system turn */
    else if (strcmp(rs, "user") == 0)
        r_role = "user";
    else if (strcmp(rs, "assistant") == 0)
        r_role = "assistant";
    else if (strcmp(rs, "tool") == 0 || strcmp(rs, "function") == 0)
        return fail(p, 400, MMRT_ERR_UNSUPPORTED, NULL, param,
                    "mmrt does not support messages with role '%s' (function calling).", rs);
    else
        return fail(p, 400, MMRT_ERR_INVALID_ARG, NULL, param,
                    "Invalid value for '%s': '%s'. Supported values are: 'system', "
                    "'developer', 'user' and 'assistant'.", param, quote_str(q, role));
    /* The rest of a message's keys: ignored, type-checked, or function calling. */
    static const char *const calls[] = { "tool_calls", "tool_call_id", "function_call",
                                         "audio", NULL };
    for (const char *const *c = calls; *c; c++) {
        const json_t *v = json_object_get(m, *c);
        if (!v || json_is_null(v) || (json_is_array(v) && json_array_size(v) == 0 &&
                                      strcmp(*c, "tool_calls") == 0))
            continue;
        path_join(param, sizeof param, mpath, ".%s", *c);
        return fail(p, 400, MMRT_ERR_UNSUPPORTED, NULL, param,
                    "mmrt does not support %s in messages%s.", *c,
                    strcmp(*c, "audio") ? " (function calling)" : "");
    }
    static const char *const strings[] = { "name", "refusal", NULL };
    for (const char *const *c = strings; *c; c++) {
        const json_t *v = json_object_get(m, *c);
        path_join(param, sizeof param, mpath, ".%s", *c);
        if (v && !json_is_null(v) && !json_is_string(v))
            return type_error(p, param, "a string", v);
    }
    struct mmrt_text text = { 0 };
    bool has_text = false;
    const int images_before = r->req.n_images;
    st = parse_content(p, r, json_object_get(m, "content"), mpath, r_role, &text, &has_text);
    if (st != MMRT_OK) {
        free(text.s);
        return st;
    }
    r->messages_[i] = (struct mmrt_message){ .role = r_role, .text = has_text ? text.s : NULL,
                                             .n_images = r->req.n_images - images_before };
    if (!has_text)
        free(text.s);
    r->req.n_messages = (int)i + 1;
    return MMRT_OK;
}

/* Image parts of the request, counted before any is decoded: sizes r->images_. */
static size_t count_image_parts(const json_t *messages)
{
    size_t n = 0, i, j;
    const json_t *m, *part;
    json_array_foreach(messages, i, m) {
        const json_t *c = json_object_get(m, "content");
        if (!json_is_array(c))
            continue;
        json_array_foreach(c, j, part) {
            const json_t *t = json_object_get(part, "type");
            n += json_is_string(t) && strcmp(json_string_value(t), "image_url") == 0;
        }
    }
    return n;
}

static mmrt_status parse_messages(struct parse *p, struct mmrt_chat_request *r,
                                  const json_t *msgs)
{
    if (!msgs || json_is_null(msgs))
        return missing(p, "messages");
    if (!json_is_array(msgs))
        return type_error(p, "messages", "an array", msgs);
    const size_t n = json_array_size(msgs);
    if (n == 0)
        return fail(p, 400, MMRT_ERR_INVALID_ARG, NULL, "messages",
                    "Invalid 'messages': empty array. Expected an array with minimum length "
                    "1, but got an empty array instead.");
    if (n > MMRT_CHAT_MAX_MESSAGES)
        return fail(p, 400, MMRT_ERR_INVALID_ARG, NULL, "messages",
                    "Invalid 'messages': %zu messages; mmrt takes at most %d per request.", n,
                    MMRT_CHAT_MAX_MESSAGES);
    if (!(r->messages_ = calloc(n, sizeof *r->messages_)))
        return no_memory(p);
    r->req.messages = r->messages_;
    /* Room for the images the request may carry: no more than it names, nor than allowed
     * (one past that is refused before it is decoded). */
    size_t cap = count_image_parts(msgs);
    if (cap > (size_t)p->max_images)
        cap = (size_t)p->max_images;
    p->images_cap = (int)cap;
    if (cap && !(r->images_ = calloc(cap, sizeof *r->images_)))
        return no_memory(p);
    r->req.images = r->images_;
    mmrt_status st;
    for (size_t i = 0; i < n; i++)
        if ((st = parse_message(p, r, i, json_array_get(msgs, i))) != MMRT_OK)
            return st;
    if (strcmp(r->messages_[n - 1].role, "assistant") == 0) {
        char param[32];
        snprintf(param, sizeof param, "messages[%zu].role", n - 1);
        return fail(p, 400, MMRT_ERR_INVALID_ARG, NULL, param,
                    "Invalid 'messages': the last message is an assistant turn; mmrt answers "
                    "with the next assistant turn, so the chat must end with a user or system "
                    "message.");
    }
    return MMRT_OK;
}

/* ---- the request ---- */

static mmrt_status parse_root(struct parse *p, struct mmrt_chat_request *r, const json_t *root)
{
    const struct mmrt_chat_limits *lim = p->lim;
    mmrt_status st;
    r->req.struct_size = sizeof r->req;
    r->req.temperature = 1.0f; /* OpenAI's defaults */
    r->req.top_p = 1.0f;
    const struct mmrt_generation_defaults *d = lim->defaults;
    if (d) { /* the checkpoint's, where it sets them (what the request says comes after) */
        if (d->has_temperature)
            r->req.temperature = d->temperature;
        if (d->has_top_p)
            r->req.top_p = d->top_p;
        if (d->has_top_k)
            r->req.top_k = d->top_k;
        if (d->has_repetition_penalty)
            r->req.repetition_penalty = d->repetition_penalty;
    }
    bool have_stream_options = false;
    long long max_tokens = 0, max_completion_tokens = 0;
    const char *key;
    const json_t *v;
    json_object_foreach((json_t *)root, key, v) {
        bool known;
        st = check_top_key(p, r, key, v, &known, &have_stream_options, &max_tokens,
                           &max_completion_tokens);
        if (st != MMRT_OK)
            return st;
        if (!known) {
            char q[64];
            return fail(p, 400, MMRT_ERR_INVALID_ARG, NULL, quote(q, key, strlen(key)),
                        "Unrecognized request argument supplied: %s", q);
        }
    }
    const json_t *model = json_object_get(root, "model");
    if (!model || json_is_null(model))
        return missing(p, "model");
    if (!json_is_string(model))
        return type_error(p, "model", "a string", model);
    if (strcmp(json_string_value(model), lim->model) != 0) {
        char q[64], served[64];
        return fail(p, 404, MMRT_ERR_NOT_FOUND, "model_not_found", "model",
                    "The model '%s' does not exist or you do not have access to it; this "
                    "server serves '%s'.", quote_str(q, model),
                    quote(served, lim->model, strlen(lim->model)));
    }
    if (!(r->model = strdup(json_string_value(model))))
        return no_memory(p);
    if (have_stream_options && !r->stream)
        return fail(p, 400, MMRT_ERR_INVALID_ARG, NULL, "stream_options",
                    "Invalid value for 'stream_options': stream_options is only allowed when "
                    "'stream' is true.");
    if (max_tokens && max_completion_tokens && max_tokens != max_completion_tokens)
        return fail(p, 400, MMRT_ERR_INVALID_ARG, NULL, "max_tokens",
                    "Invalid 'max_tokens': %lld differs from 'max_completion_tokens' %lld; "
                    "give one of them, or the same value in both.", max_tokens,
                    max_completion_tokens);
    const long long mt = max_completion_tokens ? max_completion_tokens : max_tokens;
    const char *mt_name = max_completion_tokens ? "max_completion_tokens" : "max_tokens";
    if (lim->max_tokens > 0 && mt > lim->max_tokens)
        return fail(p, 400, MMRT_ERR_INVALID_ARG, NULL, mt_name,
                    "Invalid '%s': %lld is too large; this server generates at most %d "
                    "completion tokens per request.", mt_name, mt, lim->max_tokens);
    r->req.max_tokens = mt ? (int)mt : (lim->max_tokens > 0 ? lim->max_tokens : 0);
    if (r->req.top_logprobs > 0 && !r->req.logprobs)
        return fail(p, 400, MMRT_ERR_INVALID_ARG, NULL, "top_logprobs",
                    "Invalid 'top_logprobs': it needs 'logprobs': true.");
    if ((st = parse_stop(p, r, json_object_get(root, "stop"))) != MMRT_OK)
        return st;
    if ((st = parse_logit_bias(p, r, json_object_get(root, "logit_bias"))) != MMRT_OK)
        return st;
    return parse_messages(p, r, json_object_get(root, "messages"));
}

mmrt_status mmrt_chat_request_parse(const char *body, size_t len,
                                    const struct mmrt_chat_limits *lim,
                                    struct mmrt_chat_request *out, struct mmrt_api_error *err)
{
    memset(err, 0, sizeof *err);
    memset(out, 0, sizeof *out);
    struct parse p = { .lim = lim, .err = err };
    if (!lim || !lim->model || lim->max_images < 0 || lim->max_tokens < 0 || (!body && len))
        return fail(&p, 500, MMRT_ERR_INVALID_ARG, NULL, NULL,
                    "The server's request limits are not usable (no model id, or a negative "
                    "limit).");
    struct mmrt_image_limits il;
    mmrt_image_limits_default(&il);
    p.max_image_bytes = lim->max_image_bytes ? lim->max_image_bytes : il.max_input_bytes;
    p.max_images = lim->max_images;
    json_t *root = NULL;
    struct mmrt_error jerr = { 0 };
    if (mmrt_json_parse(body ? body : "", len, "request body", MMRT_CHAT_MAX_DEPTH, &root,
                        &jerr) != MMRT_OK) {
        const char *detail = jerr.msg;
        if (strncmp(detail, "request body: ", 14) == 0)
            detail += 14;
        return fail(&p, 400, MMRT_ERR_FORMAT, NULL, NULL,
                    "We could not parse the JSON body of your request: %s. The OpenAI API "
                    "expects a JSON object.", detail);
    }
    mmrt_status st;
    struct mmrt_chat_request r = { .n = 1 };
    if (!json_is_object(root))
        st = fail(&p, 400, MMRT_ERR_INVALID_ARG, NULL, NULL,
                  "The request body is %s; the OpenAI API expects a JSON object.",
                  mmrt_json_type_name(root));
    else
        st = parse_root(&p, &r, root);
    json_decref(root);
    free(p.root);
    if (st != MMRT_OK) {
        mmrt_chat_request_free(&r);
        return st;
    }
    *out = r;
    memset(err, 0, sizeof *err);
    return MMRT_OK;
}

void mmrt_chat_request_free(struct mmrt_chat_request *r)
{
    if (!r)
        return;
    for (int i = 0; i < r->req.n_messages; i++)
        free((void *)r->messages_[i].text);
    for (int i = 0; i < r->req.n_images; i++) {
        free((void *)r->images_[i].data);
        free((void *)r->images_[i].path);
    }
    for (int i = 0; i < r->req.n_stop; i++)
        free(r->stop_[i]);
    free(r->messages_);
    free(r->images_);
    free(r->stop_);
    free(r->bias_);
    free(r->schema_);
    free(r->prediction_);
    free(r->model);
    memset(r, 0, sizeof *r);
}
