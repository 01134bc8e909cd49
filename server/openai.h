/*
 * server/openai.h — the OpenAI chat-completions API without HTTP: a request body in, a
 * ready struct mmrt_request out; and the JSON mmrt serve answers with (completions, stream
 * chunks, errors, the model list). The HTTP layer (serve.c, chat.c) moves bytes; everything
 * that decides what a body means, or what a response says, is here, so it can be tested and
 * fuzzed on its own (tests/test_openai.c, tests/fuzz/fuzz_chat_request.c).
 *
 * The body is hostile (/work/shared/specs/untrusted-input.md, "Requests"). Everything wrong
 * with it is answered the way OpenAI answers: an HTTP status (400 mostly; 404 for a model
 * this server does not serve; 413 for an image over the byte cap), an error type, the
 * JSON path of the offending field as `param` ("messages[1].content[0].image_url.url") and
 * a message that names the field and what was wrong. Nothing in a body can crash the parser,
 * make it read or open a file outside the image directory, or allocate more than a small
 * multiple of the body's size.
 *
 * ## What a request may say (POST /v1/chat/completions)
 *
 *   model                  string, required, must equal the served id (else 404,
 *                          code "model_not_found")
 *   messages               non-empty array (at most MMRT_CHAT_MAX_MESSAGES) of
 *                          {role, content, name?}:
 *       role               "system", "developer" (= system), "user", "assistant".
 *                          "tool" and "function" are 400 "mmrt does not support …".
 *       content            a string, or a non-empty array of parts
 *                            {"type": "text", "text": STRING}
 *                            {"type": "image_url", "image_url": {"url": URL, "detail"?}}
 *                          Images only in user turns. The text parts of one message are
 *                          joined with "\n"; its images go before its text (mmrt_message
 *                          places a turn's images first; the model's chat template decides
 *                          where they land). An assistant turn's content is required (null
 *                          content is what tool calls use: unsupported).
 *                          detail ("auto", "low", "high") is accepted and ignored: mmrt
 *                          sizes images by the model's own preprocessing.
 *       name               string, ignored. tool_calls, tool_call_id, function_call and
 *                          audio (non-null) are 400 "mmrt does not support …"; refusal
 *                          (string or null) is ignored. Other keys are 400.
 *                          The chat must not end with an assistant turn (mmrt answers as
 *                          the next assistant turn; the runtime refuses it too).
 *   max_completion_tokens  integer ≥ 1 …
 *   max_tokens             … (its older name). Given both, they must be equal (400 otherwise:
 *                          a client that sends two different caps has a bug we should not
 *                          guess about). Over mmrt_chat_limits.max_tokens is 400; absent is
 *                          that cap (or 0: until an end token or the context is full).
 *   temperature            number in [0, 2]; default 1 (OpenAI's default; 0 = greedy)
 *   top_p                  number in (0, 1]; default 1. A positive value below the smallest
 *                          float is sampled as that float (it still keeps only the top token).
 *   top_k                  integer ≥ 0, 0 = off (an extension, as vLLM has it)
 *   seed                   integer in [−2^63, 2^63); a negative seed is used as its 64-bit
 *                          two's complement (so every int64 a client may send is a distinct
 *                          seed). Absent: seed 0 and seed_given false (the caller may pick a
 *                          random one; sampling with seed 0 is reproducible).
 *   stop                   a string, or an array of at most MMRT_MAX_STOP strings, each
 *                          1 … MMRT_MAX_STOP_BYTES bytes; [] and null = none
 *   stream                 boolean
 *   stream_options         {"include_usage": boolean}, only with stream: true (400 otherwise,
 *                          like OpenAI)
 *   n                      only 1
 *   presence_penalty, frequency_penalty   numbers in [−2, 2]; 0 = off
 *   repetition_penalty     number in (0, 100]; an extension, as vLLM has it
 *   logprobs               boolean: each answer token's log-probability in the response
 *   top_logprobs           integer 0 … MMRT_MAX_TOP_LOGPROBS, needs logprobs: true
 *   logit_bias             {"TOKEN_ID": number in [−100, 100], …}: at most
 *                          MMRT_MAX_LOGIT_BIAS entries, keys decimal token ids (an id
 *                          outside the model's vocabulary is refused by the runtime, 400)
 *   response_format        {"type": "text"}, {"type": "json_object"} (the answer is one
 *                          JSON object: mmrt_request.response_format) or {"type":
 *                          "json_schema", "json_schema": {"name", "schema", "strict",
 *                          "description"}} (a document held to the schema; one mmrt cannot
 *                          hold an answer to is 400 naming the place in it, json_schema.h)
 *   user, metadata, store, service_tier, parallel_tool_calls   type-checked, ignored
 *   tools, functions       only [] ; tool_choice, function_call only "none";
 *   modalities only ["text"]; audio, prediction, web_search_options only null.
 *                          Anything else in these is 400 "mmrt does not support X".
 *   Any other key, whatever its value (null too), is 400 "Unrecognized request argument
 *   supplied: X" (OpenAI's wording).
 *   null is the same as absent for every optional key (OpenAI accepts it).
 *
 * Numbers: integers must be JSON integers (1.0 is refused where an integer is meant); jansson
 * refuses integers beyond int64 and reals beyond double (400, as invalid JSON); NaN and
 * infinities cannot be written in JSON. The JSON itself is parsed by core/formats/json.h:
 * depth at most MMRT_CHAT_MAX_DEPTH, duplicate keys, invalid UTF-8, "\u0000" and trailing
 * bytes are 400.
 *
 * ## Image URLs
 *
 *   data:image/png;base64,…  data:image/jpeg;base64,…  (server/data_uri.h: strict base64,
 *                          no whitespace; decoded to bytes in memory; over max_image_bytes
 *                          is 413, checked from the length before decoding)
 *   http://…, https://…    400: the server never fetches URLs.
 *   file:///ABS/PATH, file://localhost/ABS/PATH (percent-escapes decoded), /ABS/PATH, or a
 *   relative path (taken under image_dir)   only when image_dir is set, and only for a
 *                          regular file whose real path (realpath(3): symlinks and "." gone)
 *                          is inside realpath(image_dir). A ".." component is refused
 *                          outright, a symlink that leads outside is refused, and a path is
 *                          only ever resolved after it was seen to lie under image_dir, so a
 *                          request cannot probe which files exist elsewhere: every refusal
 *                          of a local path reads the same. The file is opened (O_NOFOLLOW)
 *                          and fstat'ed once to check it is a readable regular file within
 *                          max_image_bytes (413 over it); the runtime reads it later by its
 *                          resolved path. image_dir belongs to the operator: whoever may
 *                          write in it can already choose what the server shows the model.
 *   any other scheme       400.
 *
 * Thread-safety: all functions are reentrant (no globals).
 */
#ifndef MMRT_SERVER_OPENAI_H
#define MMRT_SERVER_OPENAI_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "mmrt/mmrt.h"

/* JSON nesting a request may have: a message part's image_url object sits at depth 6. */
#define MMRT_CHAT_MAX_DEPTH 16
/* Messages one request may have (the body cap bounds the bytes; this bounds the arrays). */
#define MMRT_CHAT_MAX_MESSAGES 4096

/* What the server allows; borrowed for the call. Not extensible (internal to mmrt serve). */
struct mmrt_chat_limits {
    const char *model;       /* the served model id; a request's "model" must equal it */
    int max_images;          /* images per request, all messages together (the model's
                                mmrt_model_max_images); 0 = images refused */
    const char *image_dir;   /* local image paths only under it; NULL = refused */
    int max_tokens;          /* cap on max_tokens; 0 = none */
    size_t max_image_bytes;  /* encoded bytes of one image (decoded data: URI, or file);
                                0 = mmrt_image_limits_default()'s max_input_bytes */
    /* Sampling for what a request leaves out (the checkpoint's generation_config.json);
     * NULL or has_X 0: OpenAI's (temperature 1, top_p 1, no top_k, no penalty). */
    const struct mmrt_generation_defaults *defaults;
    /* The runtime whose cache compiles a json_schema response_format (core/schema_cache.h),
     * so that it and the engine find the schema compiled; NULL: compiled alone. */
    struct mmrt_runtime *schemas;
};

/* A parsed request. Everything req points to is owned by this struct. */
/* The most choices (OpenAI's "n") one request may ask for. */
#define MMRT_CHAT_MAX_CHOICES 16

struct mmrt_chat_request {
    /* Ready for mmrt_submit: struct_size, messages (roles "system", "user", "assistant"),
     * images (data + size for data: URIs, a resolved path for local files, in the order of
     * the messages), stop strings, max_tokens, temperature, top_p, top_k, seed. */
    struct mmrt_request req;
    char *model;             /* as the request named it (= the served id) */
    bool stream;
    bool include_usage;      /* stream_options.include_usage */
    bool seed_given;         /* false: req.seed is 0 because the request had no seed */
    int n;                   /* choices, 1 … MMRT_CHAT_MAX_CHOICES: choice i is req with
                              * seed req.seed + i */
    /* private: owned storage behind req */
    struct mmrt_message *messages_;
    struct mmrt_image_input *images_;
    char **stop_;
    struct mmrt_logit_bias *bias_;
    char *schema_;           /* req.json_schema */
    char *prediction_;       /* req.prediction: prediction.content, its parts joined */
};

/* An error as OpenAI reports it. Written by mmrt_chat_request_parse and
 * mmrt_api_error_from_status; turned into JSON by mmrt_api_error_json. */
struct mmrt_api_error {
    int http_status;         /* 400, 404, 413, 499, 500, 503 */
    const char *type;        /* static: "invalid_request_error", "server_error", … */
    const char *code;        /* static, or NULL (JSON null): "model_not_found", … */
    char param[160];         /* JSON path of the field, "" = null */
    char message[1024];      /* one line; client text in it is cut short and quoted */
};

/*
 * Parses `len` bytes of body (need not be NUL-terminated) into *out.
 * Returns MMRT_OK, or a status with *err filled (out is then empty: freeing it is allowed
 * and does nothing):
 *   MMRT_ERR_FORMAT        400: not JSON, or malformed base64 / data: URI
 *   MMRT_ERR_INVALID_ARG   400: a field missing, of the wrong type or out of range, an
 *                          unknown key, a refused local path, too many images or messages;
 *                          500 (type "server_error") when lim itself is unusable (no model
 *                          id, an image_dir that does not resolve)
 *   MMRT_ERR_UNSUPPORTED   400: a feature mmrt does not have ("mmrt does not support …")
 *   MMRT_ERR_NOT_FOUND     404 "model_not_found": "model" is not the served id
 *   MMRT_ERR_LIMIT         413: an image over max_image_bytes
 *   MMRT_ERR_NO_MEMORY     503
 * err may not be NULL.
 */
mmrt_status mmrt_chat_request_parse(const char *body, size_t len,
                                    const struct mmrt_chat_limits *lim,
                                    struct mmrt_chat_request *out, struct mmrt_api_error *err);

/* Frees what a parse left in r and zeroes it. NULL and an empty (zeroed, or failed-parse)
 * request are no-ops. */
void mmrt_chat_request_free(struct mmrt_chat_request *r);

/* ----------------------------------------------------------------------------------------
 * Responses. Every builder returns a malloc'ed NUL-terminated compact JSON text (free()
 * it), or NULL when out of memory. Strings are escaped by jansson; text that is not valid
 * UTF-8 (a model's last, incomplete character; a strange model name) has each bad byte
 * replaced by U+FFFD, so a response is always valid JSON. `created` is Unix seconds.
 */
struct mmrt_chat_usage {
    int prompt_tokens;
    int completion_tokens;   /* total_tokens is their sum */
    /* With a prediction: "completion_tokens_details": {"accepted_prediction_tokens",
     * "rejected_prediction_tokens"} (mmrt_result's counts, all choices together). */
    bool prediction;
    int accepted_prediction_tokens, rejected_prediction_tokens;
};

/* "stop" or "length": MMRT_FINISH_LENGTH is "length", everything else "stop" (EOS,
 * STOP_STRING and CALLER are stops; NONE, which an MMRT_OK result never has, reads as
 * "stop" so a response always carries a reason). */
const char *mmrt_finish_reason_name(enum mmrt_finish_reason reason);

/* One token's entry of "logprobs.content", as OpenAI writes it: {"token", "logprob",
 * "bytes", "top_logprobs": [{"token", "logprob", "bytes"}, …]}. "token" is the runtime's
 * text of the token (decoded alone) made valid UTF-8, "bytes" its UTF-8 bytes, a logprob of
 * −inf is −9999.0. A new reference, or NULL when out of memory. */
json_t *mmrt_chat_logprobs_entry(const struct mmrt_token_logprobs *lp);

/* One choice of a chat.completion: its text, finish reason (NULL is JSON null) and
 * logprobs (an array of mmrt_chat_logprobs_entry, borrowed; NULL is null). */
struct mmrt_chat_choice {
    const char *content;
    const char *finish_reason;
    const json_t *logprobs;
};

/* {"id", "object": "chat.completion", "created", "model", "choices": [{"index": i,
 * "message": {"role": "assistant", "content", "refusal": null}, "logprobs",
 * "finish_reason"} for each of the n choices], "usage": {"prompt_tokens",
 * "completion_tokens", "total_tokens"}}. usage NULL leaves "usage" out; a choice's logprobs
 * become {"content": logprobs, "refusal": null}. */
char *mmrt_chat_completion_json(const char *id, long created, const char *model,
                                const struct mmrt_chat_choice *choices, int n,
                                const struct mmrt_chat_usage *usage);

/* One "chat.completion.chunk" of a stream, as OpenAI sends them, for choice `index`:
 *   first    role "assistant", content ""   → delta {"role": "assistant", "content": ""}
 *   text     content "…"                    → delta {"content": "…"}
 *   last     finish_reason "stop"|"length"  → delta {}, "finish_reason": "stop"
 *   usage    usage non-NULL                 → "choices": [], "usage": {…} (after the last,
 *                                              when stream_options.include_usage)
 * The choice has "index", "logprobs" (as for a completion: null when logprobs is NULL) and
 * "finish_reason" (null but on the last). include_usage adds "usage": null to the chunks
 * before the usage chunk, as OpenAI does. */
char *mmrt_chat_chunk_json(const char *id, long created, const char *model, int index,
                           const char *role, const char *content, const char *finish_reason,
                           const struct mmrt_chat_usage *usage, bool include_usage,
                           const json_t *logprobs);

/* GET /v1/models: {"object": "list", "data": [{"id": model, "object": "model", "created",
 * "owned_by": "mmrt"}]}. */
char *mmrt_models_json(const char *model, long created);

/* GET /v1/models/{model}: the one model object of that list. */
char *mmrt_model_json(const char *model, long created);

/* {"error": {"message", "type", "param", "code"}}: param "" and code NULL are null. */
char *mmrt_api_error_json(const struct mmrt_api_error *e);

/* The same from parts. type NULL = "invalid_request_error" below 500, "server_error" from
 * 500 on; param, code NULL = null; message NULL = "". */
char *mmrt_api_error_json_make(int http_status, const char *type, const char *code,
                               const char *param, const char *message);

/* HTTP status for a job's or mmrt_submit's status:
 *   MMRT_OK 200; MMRT_ERR_INVALID_ARG, _LIMIT, _FORMAT, _UNSUPPORTED (an image that does not
 *   decode, a prompt over the context, images over the token budget) 400;
 *   MMRT_ERR_NO_MEMORY, _OUT_OF_POOL 503 (busy: retry); MMRT_ERR_CANCELLED 499 (nginx's
 *   "client closed request": for logs and metrics, nobody is left to read it); every other
 *   status (device, plugin, I/O, internal) 500. */
int mmrt_api_status_http(mmrt_status st);

/* Fills *e for a failed job or submit: the status's HTTP code, type "invalid_request_error"
 * (4xx), "server_error" (5xx) or "cancelled" (499), code NULL, no param, and the runtime's
 * detail as the message (the status's default message when detail is NULL or ""). */
void mmrt_api_error_from_status(mmrt_status st, const char *detail, struct mmrt_api_error *e);

#endif /* MMRT_SERVER_OPENAI_H */
