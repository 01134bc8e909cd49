/*
 * tests/fuzz/fuzz_chat_request.c — libFuzzer target for server/openai_request.c (and the
 * response builders it feeds).
 *
 * The input is a whole request body, parsed under fixed limits (model "m", 4 images,
 * 64 KiB per image, no image_dir: the fuzzer never touches the file system). An accepted
 * request must be what openai.h promises — the roles the runtime knows, images only in user
 * turns and counted right, each with bytes that start with a PNG or JPEG magic, stop strings
 * in range, sampling values in range, not ending with an assistant turn — and its last text
 * must go through the completion and chunk builders into valid JSON. A refusal must carry a
 * 4xx status, a type and a one-line message, and must serialise as an error object.
 * Invariants are checked with __builtin_trap(), which libFuzzer reports as a crash.
 *
 * The same entry point is linked into the normal build with replay_main.c, so the committed
 * corpus (tests/fuzz/corpus/chat_request) runs as a ctest everywhere.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "openai.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define CHECK(c)                  \
    do {                          \
        if (!(c))                 \
            __builtin_trap();     \
    } while (0)

static void check_json(char *s)
{
    CHECK(s != NULL);
    json_t *v = json_loads(s, JSON_REJECT_DUPLICATES, NULL);
    CHECK(v != NULL);
    json_decref(v);
    free(s);
}

static void check_accepted(const struct mmrt_chat_request *r)
{
    const struct mmrt_request *q = &r->req;
    CHECK(q->struct_size == sizeof *q && r->model && strcmp(r->model, "m") == 0);
    CHECK(q->n_messages >= 1 && q->n_messages <= MMRT_CHAT_MAX_MESSAGES && q->messages);
    CHECK(q->n_images >= 0 && q->n_images <= 4 && q->prompt == NULL);
    int images = 0;
    for (int i = 0; i < q->n_messages; i++) {
        const struct mmrt_message *m = &q->messages[i];
        const bool user = strcmp(m->role, "user") == 0;
        CHECK(user || strcmp(m->role, "system") == 0 || strcmp(m->role, "assistant") == 0);
        CHECK(m->n_images >= 0 && (user || m->n_images == 0));
        CHECK(m->text || m->n_images > 0);
        images += m->n_images;
    }
    CHECK(images == q->n_images);
    CHECK(strcmp(q->messages[q->n_messages - 1].role, "assistant") != 0);
    for (int i = 0; i < q->n_images; i++) {
        const struct mmrt_image_input *im = &q->images[i];
        CHECK(im->path == NULL && im->data && im->size >= 3 && im->size <= 64 * 1024);
        const uint8_t *b = im->data;
        CHECK((b[0] == 0x89 && b[1] == 'P') || (b[0] == 0xff && b[1] == 0xd8));
    }
    CHECK(q->n_stop >= 0 && q->n_stop <= MMRT_MAX_STOP);
    for (int i = 0; i < q->n_stop; i++) {
        const size_t n = strlen(q->stop[i]);
        CHECK(n >= 1 && n <= MMRT_MAX_STOP_BYTES);
    }
    CHECK(q->temperature >= 0 && q->temperature <= 2);
    CHECK(q->top_p > 0 && q->top_p <= 1 && q->top_k >= 0 && q->max_tokens >= 0);
    CHECK(!r->include_usage || r->stream);
    CHECK((q->logprobs == 0 || q->logprobs == 1) && q->top_logprobs >= 0 &&
          q->top_logprobs <= MMRT_MAX_TOP_LOGPROBS && (q->top_logprobs == 0 || q->logprobs));
    CHECK(q->n_logit_bias >= 0 && q->n_logit_bias <= MMRT_MAX_LOGIT_BIAS &&
          (q->n_logit_bias == 0) == (q->logit_bias == NULL));
    for (int i = 0; i < q->n_logit_bias; i++)
        CHECK(q->logit_bias[i].token_id >= 0 && q->logit_bias[i].bias >= -100 &&
              q->logit_bias[i].bias <= 100);
    CHECK(q->response_format == MMRT_RESPONSE_TEXT ||
          q->response_format == MMRT_RESPONSE_JSON_OBJECT);
    const char *text = q->messages[q->n_messages - 1].text;
    CHECK(r->n >= 1 && r->n <= MMRT_CHAT_MAX_CHOICES);
    const struct mmrt_chat_usage u = { .prompt_tokens = q->n_messages,
                                       .completion_tokens = q->n_images,
                                       .prediction = q->prediction != NULL,
                                       .accepted_prediction_tokens = 1 };
    const struct mmrt_chat_choice choice = { text ? text : "", "stop", NULL };
    check_json(mmrt_chat_completion_json("chatcmpl-f", 1, r->model, &choice, 1, &u));
    check_json(mmrt_chat_chunk_json("chatcmpl-f", 1, r->model, r->n - 1, NULL,
                                    text ? text : "", NULL, NULL, r->include_usage, NULL));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const struct mmrt_chat_limits lim = { .model = "m", .max_images = 4,
                                          .max_image_bytes = 64 * 1024 };
    struct mmrt_chat_request r;
    struct mmrt_api_error e;
    const mmrt_status st = mmrt_chat_request_parse((const char *)data, size, &lim, &r, &e);
    if (st == MMRT_OK) {
        check_accepted(&r);
    } else {
        CHECK(e.http_status == 400 || e.http_status == 404 || e.http_status == 413 ||
              e.http_status == 503);
        CHECK(e.type != NULL && e.message[0] != '\0');
        CHECK(strchr(e.message, '\n') == NULL && strlen(e.param) < sizeof e.param);
        CHECK(r.req.n_messages == 0 && r.model == NULL);
        check_json(mmrt_api_error_json(&e));
    }
    mmrt_chat_request_free(&r);
    return 0;
}
