/*
 * tests/test_chat_template.c — which chat template a LLaVA-family checkpoint renders with
 * ([model] chat_template, models.md §7.5) and what each renders.
 *
 * The expected texts are what jinja2 renders from the published templates (the
 * chat_template.json of llava-1.5, llava-1.6-mistral, llava-1.6-34b (ChatML) and
 * llama3-llava-next-8b, with transformers' trim_blocks / lstrip_blocks) for the same
 * messages; the checks compare the prompt ids a request runs with against the
 * tokenizer's ids of that text, each run of <image> ids collapsed to one.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "formats/tokenizer.h"
#include "golden.h"
#include "mmrt/mmrt.h"

/* Templates with the families' markers, as the checkpoints' files spell them (not rendered:
 * mmrt only recognises them). */
static const char mistral_jinja[] =
    "{% for message in messages %}{% if message['role'] == 'system' %}{{ '<<SYS>>\\n' + "
    "message['content'][0]['text'] + '\\n<</SYS>>\\n\\n' }}{% elif message['role'] == 'user' "
    "%}{{ '[INST] ' }}{% for content in message['content'] | selectattr('type', 'equalto', "
    "'image') %}{{ '<image>\\n' }}{% endfor %}{% for content in message['content'] | "
    "selectattr('type', 'equalto', 'text') %}{{ content['text'] }}{% endfor %}{{' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ ' ' + message['content'][0]['text'] + "
    "'<\\\\s> '}}{% endif %}{% endfor %}";

/* Shorter templates with the ChatML and Llama 3 marks: what mmrt recognises them by. */
static const char chatml_jinja[] =
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' }}{% for c in "
    "message['content'] %}{{ c['text'] }}{% endfor %}{{ '<|im_end|>\\n' }}{% endfor %}";
static const char llama3_jinja[] =
    "{% for message in messages %}{{ '<|start_header_id|>' + message['role'] + "
    "'<|end_header_id|>\\n\\n' }}{% for c in message['content'] %}{{ '\\n' + c['text'] + "
    "'<|eot_id|>' }}{% endfor %}{% endfor %}";

static void write_file(const char *name, const char *text)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", golden_scratch, name);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(text, 1, strlen(text), f), strlen(text));
    assert_int_equal(fclose(f), 0);
}

static void remove_file(const char *name)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", golden_scratch, name);
    remove(path);
}

static mmrt_status open_scratch(enum mmrt_chat_template tpl, struct mmrt_runtime **rt,
                                char *err, size_t err_size)
{
    const struct mmrt_device_config dev = { .name = "c", .plugin = "cpu", .pool_mb = 64 };
    const struct mmrt_config cfg = { .struct_size = sizeof cfg, .model_path = golden_scratch,
                                     .devices = &dev, .n_devices = 1, .chat_template = tpl };
    *rt = NULL;
    return mmrt_create(&cfg, rt, err, err_size);
}

static struct mmrt_runtime *open_ok(enum mmrt_chat_template tpl)
{
    char err[2048] = "";
    struct mmrt_runtime *rt = NULL;
    if (open_scratch(tpl, &rt, err, sizeof err) != MMRT_OK)
        fail_msg("%s: %s", golden_scratch, err);
    return rt;
}

static void expect_open_error(enum mmrt_chat_template tpl, mmrt_status want, const char *part)
{
    char err[2048] = "";
    struct mmrt_runtime *rt = NULL;
    mmrt_status st = open_scratch(tpl, &rt, err, sizeof err);
    mmrt_destroy(rt);
    if (st != want || !strstr(err, part))
        fail_msg("expected status %d with '%s', got %d: %s", want, part, st, err);
}

/* The prompt ids req runs with: its first token is enough to see them. */
static void prompt_ids(struct mmrt_runtime *rt, const struct mmrt_request *req,
                       struct golden_capture *cap)
{
    struct mmrt_request r = *req;
    r.max_tokens = 1;
    struct mmrt_model_trace trace;
    golden_trace(cap, &trace);
    struct mmrt_result res = { 0 };
    if (mmrt_run_traced(rt, &r, &trace, golden_on_token, cap, &res) != MMRT_OK)
        fail_msg("%s", mmrt_last_error(rt));
    assert_true(cap->n_prompt > 0);
}

/* The ids rt ran req with equal the tokenizer's (BOS added) of `want`, once each run of image
 * ids is one id; n_images runs of at least one image id each. */
static void expect_rendered(struct mmrt_runtime *rt, const struct mmrt_request *req,
                            const char *want, int n_images)
{
    char path[600];
    snprintf(path, sizeof path, "%s/config.json", golden_scratch);
    json_t *config = json_load_file(path, 0, NULL);
    assert_non_null(config);
    const json_t *image = json_object_get(config, "image_token_index");
    const int32_t image_id = image ? (int32_t)json_integer_value(image) : 32000;
    json_decref(config);

    struct golden_capture cap = { 0 };
    prompt_ids(rt, req, &cap);
    int32_t *got = malloc((size_t)cap.n_prompt * sizeof *got);
    assert_non_null(got);
    size_t n_got = 0;
    int runs = 0;
    for (int i = 0; i < cap.n_prompt; i++) {
        if (cap.prompt[i] == image_id && i > 0 && cap.prompt[i - 1] == image_id)
            continue;
        runs += cap.prompt[i] == image_id;
        got[n_got++] = cap.prompt[i];
    }
    assert_int_equal(runs, n_images);

    snprintf(path, sizeof path, "%s/tokenizer.json", golden_scratch);
    struct mmrt_tokenizer *tok = NULL;
    struct mmrt_error e = { 0 };
    assert_int_equal(mmrt_tokenizer_load(path, NULL, &tok, &e), MMRT_OK);
    int32_t *ids = NULL;
    size_t n = 0;
    assert_int_equal(mmrt_tokenizer_encode(tok, want, strlen(want), MMRT_TOKENIZE_ADD_SPECIAL,
                                           &ids, &n, &e), MMRT_OK);
    if (n != n_got || memcmp(ids, got, n * sizeof *ids) != 0) {
        for (size_t i = 0; i < n || i < n_got; i++)
            print_message("%3zu: want %6d got %6d\n", i, i < n ? ids[i] : -1,
                          i < n_got ? got[i] : -1);
        fail_msg("the prompt is not the tokens of \"%s\"", want);
    }
    free(ids);
    mmrt_tokenizer_destroy(tok);
    free(got);
    golden_capture_free(&cap);
}

/* One request in three forms: the prompt with one image, a chat of four turns, and a user
 * turn of one image and no text. */
struct forms {
    struct golden_cases c;
    struct mmrt_request one, chat, image_only;
    struct mmrt_message turns[4], image_turn;
};

static void forms_load(struct forms *f)
{
    golden_cases_load("llava-tiny", &f->c);
    f->one = f->c.req[0];
    f->one.prompt = "What is shown in this image?";
    f->turns[0] = (struct mmrt_message){ .role = "system", .text = "Be brief." };
    f->turns[1] = (struct mmrt_message){ .role = "user", .text = "What is this?",
                                         .n_images = 1 };
    f->turns[2] = (struct mmrt_message){ .role = "assistant", .text = "A cat." };
    f->turns[3] = (struct mmrt_message){ .role = "user", .text = "Which colour?" };
    f->chat = f->c.req[0];
    f->chat.prompt = NULL;
    f->chat.messages = f->turns;
    f->chat.n_messages = 4;
    f->image_turn = (struct mmrt_message){ .role = "user", .n_images = 1 };
    f->image_only = f->chat;
    f->image_only.messages = &f->image_turn;
    f->image_only.n_messages = 1;
}

/* jinja2's output of llava-1.6-mistral's template for the two forms; "<\s>" is what the
 * published template writes after an answer. */
static const char mistral_one[] = "[INST] <image>\nWhat is shown in this image? [/INST]";
static const char mistral_chat[] = "<<SYS>>\nBe brief.\n<</SYS>>\n\n[INST] <image>\nWhat is "
                                   "this? [/INST] A cat.<\\s> [INST] Which colour? [/INST]";
/* And of llava-1.5's. */
static const char llava_one[] = "USER: <image>\nWhat is shown in this image? ASSISTANT:";
static const char llava_chat[] = "Be brief. USER: <image>\nWhat is this? ASSISTANT: A cat. "
                                 "USER: Which colour? ASSISTANT:";

/* ChatML's (llava-1.6-34b): no system turn added, the generation prompt opens the answer. */
static const char chatml_one[] = "<|im_start|>user\n<image>\nWhat is shown in this image?"
                                 "<|im_end|>\n<|im_start|>assistant\n";
static const char chatml_chat[] =
    "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n<image>\nWhat is this?"
    "<|im_end|>\n<|im_start|>assistant\nA cat.<|im_end|>\n<|im_start|>user\nWhich colour?"
    "<|im_end|>\n<|im_start|>assistant\n";
/* Llama 3's (llama3-llava-next-8b): "<image>" without a newline, "\n" before each text, so
 * a turn of text alone opens with three newlines. */
static const char llama3_one[] = "<|start_header_id|>user<|end_header_id|>\n\n<image>\nWhat is "
                                 "shown in this image?<|eot_id|><|start_header_id|>assistant"
                                 "<|end_header_id|>\n\n";
static const char llama3_chat[] =
    "<|start_header_id|>system<|end_header_id|>\n\n\nBe brief.<|eot_id|><|start_header_id|>"
    "user<|end_header_id|>\n\n<image>\nWhat is this?<|eot_id|><|start_header_id|>assistant"
    "<|end_header_id|>\n\n\nA cat.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\n\n"
    "Which colour?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n";
/* A user turn of one image and no text, in each. */
static const char chatml_image_only[] = "<|im_start|>user\n<image>\n<|im_end|>\n"
                                        "<|im_start|>assistant\n";
static const char llama3_image_only[] = "<|start_header_id|>user<|end_header_id|>\n\n<image>"
                                        "<|start_header_id|>assistant<|end_header_id|>\n\n";

static int make_tiny(void **state)
{
    (void)state;
    golden_scratch_make("llava-tiny");
    return 0;
}

static int make_swa(void **state)
{
    (void)state;
    golden_scratch_make("llava-tiny-swa");
    return 0;
}

/* The fixture's own template is LLaVA's; a Mistral one in its place is rendered as Mistral's,
 * and so is LLaVA's file when [model] chat_template says mistral. */
static void test_template_from_file_and_override(void **state)
{
    (void)state;
    struct forms f;
    forms_load(&f);
    struct mmrt_runtime *rt = open_ok(MMRT_CHAT_TEMPLATE_AUTO);
    expect_rendered(rt, &f.one, llava_one, 1);
    expect_rendered(rt, &f.chat, llava_chat, 1);
    mmrt_destroy(rt);

    rt = open_ok(MMRT_CHAT_TEMPLATE_MISTRAL);
    expect_rendered(rt, &f.one, mistral_one, 1);
    expect_rendered(rt, &f.chat, mistral_chat, 1);
    mmrt_destroy(rt);

    write_file("chat_template.jinja", mistral_jinja);
    rt = open_ok(MMRT_CHAT_TEMPLATE_AUTO);
    expect_rendered(rt, &f.one, mistral_one, 1);
    expect_rendered(rt, &f.chat, mistral_chat, 1);
    mmrt_destroy(rt);

    rt = open_ok(MMRT_CHAT_TEMPLATE_LLAVA);
    expect_rendered(rt, &f.one, llava_one, 1);
    mmrt_destroy(rt);
    json_decref(f.c.json);
}

/* ChatML and Llama 3, chosen by their files' marks and by name. */
static void test_template_chatml_and_llama3(void **state)
{
    (void)state;
    struct forms f;
    forms_load(&f);
    const struct mmrt_request *img = &f.image_only;

    write_file("chat_template.jinja", chatml_jinja);
    struct mmrt_runtime *rt = open_ok(MMRT_CHAT_TEMPLATE_AUTO);
    expect_rendered(rt, &f.one, chatml_one, 1);
    expect_rendered(rt, &f.chat, chatml_chat, 1);
    expect_rendered(rt, img, chatml_image_only, 1);
    mmrt_destroy(rt);

    write_file("chat_template.jinja", llama3_jinja);
    rt = open_ok(MMRT_CHAT_TEMPLATE_AUTO);
    expect_rendered(rt, &f.one, llama3_one, 1);
    expect_rendered(rt, &f.chat, llama3_chat, 1);
    expect_rendered(rt, img, llama3_image_only, 1);
    mmrt_destroy(rt);

    /* Named in the config, whatever the file says. */
    rt = open_ok(MMRT_CHAT_TEMPLATE_CHATML);
    expect_rendered(rt, &f.chat, chatml_chat, 1);
    mmrt_destroy(rt);
    write_file("chat_template.jinja", mistral_jinja);
    rt = open_ok(MMRT_CHAT_TEMPLATE_LLAMA3);
    expect_rendered(rt, &f.chat, llama3_chat, 1);
    mmrt_destroy(rt);
    json_decref(f.c.json);
}

/* Runs req greedily for up to 6 tokens into *res and tokens[]. */
static void run_greedy(struct mmrt_runtime *rt, const struct mmrt_request *req,
                       struct golden_capture *cap, struct mmrt_result *res)
{
    struct mmrt_request r = *req;
    r.max_tokens = 6;
    r.temperature = 0;
    memset(cap, 0, sizeof *cap);
    memset(res, 0, sizeof *res);
    res->struct_size = sizeof *res;
    struct mmrt_model_trace trace;
    golden_trace(cap, &trace);
    if (mmrt_run_traced(rt, &r, &trace, golden_on_token, cap, res) != MMRT_OK)
        fail_msg("%s", mmrt_last_error(rt));
}

/* Writes the fixture's tokenizer with vocabulary entry `id` renamed to `mark` and added as
 * a token of its own (special or not), as a tokenizer whose vocabulary holds its chat marks
 * has them; merges that build or use the old entry go with it. */
static void rename_token(const char *fixture_tok, const char *mark, int32_t id, bool special)
{
    json_t *t = json_load_file(fixture_tok, 0, NULL);
    assert_non_null(t);
    json_t *model = json_object_get(t, "model"), *vocab = json_object_get(model, "vocab");
    const char *key, *old = NULL;
    json_t *v;
    json_object_foreach(vocab, key, v)
        if (json_integer_value(v) == id)
            old = key;
    assert_non_null(old);
    char *gone = strdup(old);
    assert_non_null(gone);
    assert_int_equal(json_object_del(vocab, gone), 0);
    assert_int_equal(json_object_set_new(vocab, mark, json_integer(id)), 0);
    json_t *merges = json_object_get(model, "merges");
    for (size_t i = json_array_size(merges); i-- > 0;) {
        const json_t *m = json_array_get(merges, i);
        const char *a = json_string_value(json_array_get(m, 0));
        const char *b = json_string_value(json_array_get(m, 1));
        assert_true(a && b);
        char ab[256];
        snprintf(ab, sizeof ab, "%s%s", a, b);
        if (!strcmp(a, gone) || !strcmp(b, gone) || !strcmp(ab, gone))
            assert_int_equal(json_array_remove(merges, i), 0);
    }
    free(gone);
    json_t *e = json_pack("{s:i,s:s,s:b,s:b,s:b,s:b,s:b}", "id", (json_int_t)id, "content", mark,
                          "single_word", 0, "lstrip", 0, "rstrip", 0, "normalized", 0,
                          "special", special);
    assert_non_null(e);
    assert_int_equal(json_array_append_new(json_object_get(t, "added_tokens"), e), 0);
    char path[600];
    snprintf(path, sizeof path, "%s/tokenizer.json", golden_scratch);
    assert_int_equal(json_dump_file(t, path, JSON_COMPACT), 0);
    json_decref(t);
}

/* An answer ends at Llama 3's <|eot_id|> when the tokenizer has it as a special token,
 * though generation_config.json names only </s>. The prompt is a turn of one image, which
 * Llama 3's template renders without an <|eot_id|>: giving that mark the id of a token the
 * model emits (one the prompt does not use) leaves the prompt's ids as they were, which the
 * test checks, so the answer is the same up to that token. */
static void test_turn_end_stops(void **state)
{
    (void)state;
    struct forms f;
    forms_load(&f);
    const struct mmrt_request *img = &f.image_only;
    char tok_path[600];
    golden_fixture_path(tok_path, sizeof tok_path, "llava-tiny");
    strncat(tok_path, "/tokenizer.json", sizeof tok_path - strlen(tok_path) - 1);

    struct golden_capture cap;
    struct mmrt_result res;
    struct mmrt_runtime *rt = open_ok(MMRT_CHAT_TEMPLATE_LLAMA3);
    run_greedy(rt, img, &cap, &res);
    mmrt_destroy(rt);
    /* The first token that differs from the ones before it. */
    int j = 1;
    while (j < cap.n_tokens && (cap.tokens[j] == cap.tokens[0] || cap.tokens[j] == 2))
        j++;
    if (j >= cap.n_tokens || res.n_tokens != 6)
        fail_msg("the fixture's answer does not have the tokens this test needs");
    const int32_t mark = cap.tokens[j];
    for (int i = 0; i < j; i++)
        assert_int_not_equal(cap.tokens[i], mark);
    int32_t want[6];
    memcpy(want, cap.tokens, sizeof want);
    const int n_prompt = cap.n_prompt;
    int32_t *prompt = malloc((size_t)n_prompt * sizeof *prompt);
    assert_non_null(prompt);
    memcpy(prompt, cap.prompt, (size_t)n_prompt * sizeof *prompt);
    golden_capture_free(&cap);

    rename_token(tok_path, "<|eot_id|>", mark, true);
    rt = open_ok(MMRT_CHAT_TEMPLATE_LLAMA3);
    run_greedy(rt, img, &cap, &res);
    assert_int_equal(cap.n_prompt, n_prompt);
    assert_memory_equal(cap.prompt, prompt, (size_t)n_prompt * sizeof *prompt);
    free(prompt);
    assert_int_equal(res.finish_reason, MMRT_FINISH_EOS);
    assert_int_equal(res.n_tokens, j + 1);
    assert_memory_equal(cap.tokens, want, (size_t)(j + 1) * sizeof *want);
    golden_capture_free(&cap);
    mmrt_destroy(rt);

    /* Not a special token: text like any other, so the answer runs on. */
    rename_token(tok_path, "<|eot_id|>", mark, false);
    rt = open_ok(MMRT_CHAT_TEMPLATE_LLAMA3);
    run_greedy(rt, img, &cap, &res);
    assert_int_equal(res.finish_reason, MMRT_FINISH_LENGTH);
    assert_memory_equal(cap.tokens, want, sizeof want);
    golden_capture_free(&cap);
    mmrt_destroy(rt);
    json_decref(f.c.json);
}

/* Where the template is found: chat_template.jinja first, then chat_template.json, then
 * processor_config.json and tokenizer_config.json (whose list form renders "default"). */
static void test_template_file_order(void **state)
{
    (void)state;
    struct forms f;
    forms_load(&f);
    remove_file("chat_template.jinja");

    /* As transformers writes it: model_max_length 10^30 as an integer. */
    json_t *tc = json_pack("{s:[{s:s,s:s},{s:s,s:s}]}", "chat_template", "name", "tool_use",
                           "template", "USER: ASSISTANT:", "name", "default", "template",
                           mistral_jinja);
    assert_non_null(tc);
    char *text = json_dumps(tc, JSON_COMPACT);
    json_decref(tc);
    assert_non_null(text);
    char *big = malloc(strlen(text) + 64);
    assert_non_null(big);
    sprintf(big, "{\"model_max_length\": 1000000000000000019884624838656, %s", text + 1);
    free(text);
    write_file("tokenizer_config.json", big);
    free(big);
    struct mmrt_runtime *rt = open_ok(MMRT_CHAT_TEMPLATE_AUTO);
    expect_rendered(rt, &f.one, mistral_one, 1);
    mmrt_destroy(rt);

    write_file("chat_template.json", "{\"chat_template\": \"{{ 'ASSISTANT:' }}\"}");
    rt = open_ok(MMRT_CHAT_TEMPLATE_AUTO);
    expect_rendered(rt, &f.one, llava_one, 1);
    mmrt_destroy(rt);

    write_file("chat_template.jinja", mistral_jinja);
    rt = open_ok(MMRT_CHAT_TEMPLATE_AUTO);
    expect_rendered(rt, &f.one, mistral_one, 1);
    mmrt_destroy(rt);
    json_decref(f.c.json);
}

/* Without any template file the text model decides: llava-tiny-swa's is mistral. */
static void test_template_from_text_model(void **state)
{
    (void)state;
    struct forms f;
    forms_load(&f);
    remove_file("chat_template.jinja");
    struct mmrt_runtime *rt = open_ok(MMRT_CHAT_TEMPLATE_AUTO);
    expect_rendered(rt, &f.one, mistral_one, 1);
    mmrt_destroy(rt);
    golden_set_config("text_config/model_type", json_string("llama"));
    rt = open_ok(MMRT_CHAT_TEMPLATE_AUTO);
    expect_rendered(rt, &f.one, llava_one, 1);
    mmrt_destroy(rt);
    json_decref(f.c.json);
}

/* A template of another family, malformed template files, and a choice for a model type with
 * one template of its own are refused by name. */
static void test_template_refusals(void **state)
{
    (void)state;
    /* Gemma's turns; and ChatML's opening mark without its closing one. */
    write_file("chat_template.jinja", "{% for m in messages %}<start_of_turn>{{ m['role'] }}\n"
                                      "{% endfor %}");
    expect_open_error(MMRT_CHAT_TEMPLATE_AUTO, MMRT_ERR_UNSUPPORTED,
                      "chat_template.jinja: the chat template is none of the four mmrt renders");
    expect_open_error(MMRT_CHAT_TEMPLATE_AUTO, MMRT_ERR_UNSUPPORTED,
                      "set [model] chat_template = llava, mistral, chatml or llama3");
    write_file("chat_template.jinja", "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
                                      "{% endfor %}");
    expect_open_error(MMRT_CHAT_TEMPLATE_AUTO, MMRT_ERR_UNSUPPORTED, "none of the four");
    /* Naming the family skips the file. */
    mmrt_destroy(open_ok(MMRT_CHAT_TEMPLATE_LLAVA));
    /* Two families' marks: not one mmrt can tell. */
    write_file("chat_template.jinja", "[INST] [/INST] ASSISTANT:");
    expect_open_error(MMRT_CHAT_TEMPLATE_AUTO, MMRT_ERR_UNSUPPORTED, "or has the marks of");
    write_file("chat_template.jinja", "<|im_start|><|im_end|><|start_header_id|>"
                                      "<|end_header_id|>");
    expect_open_error(MMRT_CHAT_TEMPLATE_AUTO, MMRT_ERR_UNSUPPORTED, "or has the marks of");
    remove_file("chat_template.jinja");

    write_file("chat_template.json", "{\"chat_template\": 5}");
    expect_open_error(MMRT_CHAT_TEMPLATE_AUTO, MMRT_ERR_FORMAT,
                      "chat_template.json: \"chat_template\" is a number");
    write_file("chat_template.json", "[\"ASSISTANT:\"]");
    expect_open_error(MMRT_CHAT_TEMPLATE_AUTO, MMRT_ERR_FORMAT, "chat_template.json");
    write_file("chat_template.json", "{\"chat_template\": \"ASSISTANT:\"");
    expect_open_error(MMRT_CHAT_TEMPLATE_AUTO, MMRT_ERR_FORMAT, "chat_template.json");
    remove_file("chat_template.json");
    write_file("tokenizer_config.json",
               "{\"chat_template\": [{\"name\": \"default\", \"template\": 3}]}");
    expect_open_error(MMRT_CHAT_TEMPLATE_AUTO, MMRT_ERR_FORMAT,
                      "tokenizer_config.json: chat_template[0] is not a");
    /* A list without "default": no template there, so the text model decides (llama). */
    write_file("tokenizer_config.json",
               "{\"chat_template\": [{\"name\": \"tool_use\", \"template\": \"x\"}]}");
    mmrt_destroy(open_ok(MMRT_CHAT_TEMPLATE_AUTO));

    expect_open_error((enum mmrt_chat_template)5, MMRT_ERR_CONFIG,
                      "[model] chat_template 5 is not an enum mmrt_chat_template");

    char dir[4096], err[2048] = "";
    golden_fixture_path(dir, sizeof dir, "qwen2vl-tiny");
    const struct mmrt_device_config dev = { .name = "c", .plugin = "cpu", .pool_mb = 64 };
    struct mmrt_config cfg = { .struct_size = sizeof cfg, .model_path = dir, .devices = &dev,
                               .n_devices = 1, .chat_template = MMRT_CHAT_TEMPLATE_MISTRAL };
    struct mmrt_runtime *rt = NULL;
    assert_int_equal(mmrt_create(&cfg, &rt, err, sizeof err), MMRT_ERR_CONFIG);
    assert_non_null(strstr(err, "[model] chat_template: model_type 'qwen2_vl'"));
    assert_null(rt);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_template_from_file_and_override, make_tiny,
                                        golden_scratch_drop),
        cmocka_unit_test_setup_teardown(test_template_chatml_and_llama3, make_tiny,
                                        golden_scratch_drop),
        cmocka_unit_test_setup_teardown(test_turn_end_stops, make_tiny, golden_scratch_drop),
        cmocka_unit_test_setup_teardown(test_template_file_order, make_tiny,
                                        golden_scratch_drop),
        cmocka_unit_test_setup_teardown(test_template_from_text_model, make_swa,
                                        golden_scratch_drop),
        cmocka_unit_test_setup_teardown(test_template_refusals, make_tiny, golden_scratch_drop),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
