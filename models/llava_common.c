/*
 * models/llava_common.c — helpers shared by llava.c and llava_next.c; see llava_common.h.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "formats/file.h"
#include "formats/json.h"
#include "llava_common.h"
#include "ops.h"
#include "sampler.h"
#include "text.h"

mmrt_status mmrt_llava_config_parse(const json_t *config, const char *what,
                                    struct mmrt_llava_config *out, struct mmrt_error *err)
{
    /* Read into a local copy: *out is written only on success (STYLE.md "Errors"). */
    struct mmrt_llava_config c;
    memset(&c, 0, sizeof c);
    const json_t *vcfg = json_object_get(config, "vision_config");
    const json_t *tcfg = json_object_get(config, "text_config");
    if ((vcfg && !json_is_object(vcfg)) || (tcfg && !json_is_object(tcfg)))
        return mmrt_error_set(err, MMRT_ERR_FORMAT,
                              "%s: vision_config and text_config must be objects", what);
    json_t *empty = json_object(); /* a missing section means every class default */
    if (!empty)
        return mmrt_error_set(err, MMRT_ERR_NO_MEMORY, "%s: out of memory", what);
    char vwhat[4300], twhat[4300];
    snprintf(vwhat, sizeof vwhat, "%s: vision_config", what);
    snprintf(twhat, sizeof twhat, "%s: text_config", what);
    mmrt_status st = mmrt_clip_config_parse(vcfg ? vcfg : empty, vwhat, &c.clip, err);
    if (st == MMRT_OK)
        st = mmrt_llama_config_parse(tcfg ? tcfg : empty, config, twhat, &c.text, err);
    json_decref(empty);
    if (st != MMRT_OK)
        return st;

    long long image_token;
    st = mmrt_json_opt_int(config, "image_token_index", what, 0, INT32_MAX, 32000, &image_token,
                           err);
    if (st == MMRT_OK && json_object_get(config, "image_token_id"))
        st = mmrt_json_opt_int(config, "image_token_id", what, 0, INT32_MAX, image_token,
                               &image_token, err);
    if (st != MMRT_OK)
        return st;
    if (image_token >= c.text.vocab)
        return mmrt_error_set(err, MMRT_ERR_FORMAT,
                              "%s: image_token_index %lld is not below the vocab_size %lld", what,
                              image_token, (long long)c.text.vocab);
    c.image_token_id = (int32_t)image_token;
    const char *act = NULL, *strategy = NULL;
    st = mmrt_json_opt_string(config, "projector_hidden_act", what, "gelu", &act, err);
    if (st == MMRT_OK)
        st = mmrt_llava_act_from_name(act, what, &c.proj_act, err);
    if (st == MMRT_OK)
        st = mmrt_json_opt_string(config, "vision_feature_select_strategy", what, "default",
                                  &strategy, err);
    if (st == MMRT_OK)
        st = mmrt_json_opt_bool(config, "multimodal_projector_bias", what, true,
                                &c.proj_bias, err);
    if (st == MMRT_OK)
        st = mmrt_llava_parse_feature_layers(config, what, c.clip.n_layers,
                                             c.feature_layers, &c.n_feature_layers, err);
    if (st != MMRT_OK)
        return st;
    if (strcmp(strategy, "default") != 0 && strcmp(strategy, "full") != 0)
        return mmrt_error_set(err, MMRT_ERR_FORMAT,
                              "%s: vision_feature_select_strategy '%s' (default or full)", what,
                              strategy);
    c.keep_cls = strcmp(strategy, "full") == 0;
    const json_t *text_type = tcfg ? json_object_get(tcfg, "model_type") : NULL;
    c.text_mistral = json_is_string(text_type) &&
                     strcmp(json_string_value(text_type), "mistral") == 0;
    *out = c;
    return MMRT_OK;
}

mmrt_status mmrt_llava_act_from_name(const char *name, const char *what, enum mmrt_op *out,
                                     struct mmrt_error *err)
{
    if (strcmp(name, "gelu") == 0)
        *out = MMRT_OP_GELU;
    else if (strcmp(name, "quick_gelu") == 0)
        *out = MMRT_OP_QUICK_GELU;
    else if (strcmp(name, "gelu_pytorch_tanh") == 0 || strcmp(name, "gelu_new") == 0)
        *out = MMRT_OP_GELU_TANH;
    else if (strcmp(name, "silu") == 0)
        *out = MMRT_OP_SILU;
    else
        return mmrt_error_set(err, MMRT_ERR_UNSUPPORTED,
                              "%s: projector_hidden_act '%s' is not supported", what, name);
    return MMRT_OK;
}

/* vision_feature_layer: an int or a list of ints, Python-indexed into L+1 hidden states. */
mmrt_status mmrt_llava_parse_feature_layers(const json_t *cfg, const char *what,
                                            int64_t n_layers, int64_t *layers, int *n_out,
                                            struct mmrt_error *err)
{
    const json_t *v = json_object_get(cfg, "vision_feature_layer");
    long long idx[MMRT_LLAVA_MAX_FEATURE_LAYERS];
    int n = 0;
    if (!v || json_is_null(v)) {
        idx[n++] = -2;
    } else if (json_is_integer(v)) {
        idx[n++] = json_integer_value(v);
    } else if (json_is_array(v) && json_array_size(v) >= 1 &&
               json_array_size(v) <= MMRT_LLAVA_MAX_FEATURE_LAYERS) {
        for (size_t i = 0; i < json_array_size(v); i++) {
            const json_t *e = json_array_get(v, i);
            if (!json_is_integer(e))
                return mmrt_error_set(err, MMRT_ERR_FORMAT,
                                      "%s: vision_feature_layer[%zu] is not an integer", what, i);
            idx[n++] = json_integer_value(e);
        }
    } else {
        return mmrt_error_set(err, MMRT_ERR_FORMAT,
                              "%s: vision_feature_layer must be an integer or a list of 1…%d "
                              "integers", what, MMRT_LLAVA_MAX_FEATURE_LAYERS);
    }
    for (int i = 0; i < n; i++) {
        long long k = idx[i] < 0 ? idx[i] + n_layers + 1 : idx[i];
        if (k < 0 || k > n_layers)
            return mmrt_error_set(err, MMRT_ERR_FORMAT,
                                  "%s: vision_feature_layer %lld is outside the %lld hidden "
                                  "states of a %lld-layer tower",
                                  what, idx[i], (long long)n_layers + 1, (long long)n_layers);
        layers[i] = k;
    }
    *n_out = n;
    return MMRT_OK;
}

/* The token that closes a turn in templates whose turns end with a special token of their
 * own. generation_config.json often names only the tokenizer's end of text (Yi's
 * <|endoftext|>, Llama 3's <|end_of_text|>), and a model trained on the template ends its
 * answer with the turn's mark instead. */
static const char *turn_end(enum mmrt_chat_template chat)
{
    switch (chat) {
    case MMRT_CHAT_TEMPLATE_CHATML: return "<|im_end|>";
    case MMRT_CHAT_TEMPLATE_LLAMA3: return "<|eot_id|>";
    default: return NULL;
    }
}

/* Adds chat's turn-end id to eos when the tokenizer has it as one special token the model
 * can emit (below vocab) and it is not there yet; a full list stays as it is. */
static void add_turn_end(const struct mmrt_tokenizer *tok, enum mmrt_chat_template chat,
                         int64_t vocab, int32_t *eos, int *n_eos)
{
    const char *mark = turn_end(chat);
    if (!mark)
        return;
    const int32_t id = mmrt_tokenizer_token_to_id(tok, mark, strlen(mark));
    if (id < 0 || id >= vocab || !mmrt_tokenizer_is_special(tok, id))
        return;
    for (int i = 0; i < *n_eos; i++)
        if (eos[i] == id)
            return;
    if (*n_eos < MMRT_LLAVA_MAX_EOS)
        eos[(*n_eos)++] = id;
}

/* A missing generation_config.json means the text config's eos (`fallback`). */
mmrt_status mmrt_llava_read_eos(const char *dir, int64_t fallback, int64_t vocab,
                                const struct mmrt_tokenizer *tok, enum mmrt_chat_template chat,
                                int32_t *eos, int *n_eos, struct mmrt_error *err)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/generation_config.json", dir);
    if (!mmrt_file_exists(path)) {
        eos[0] = (int32_t)fallback;
        *n_eos = fallback >= 0;
        add_turn_end(tok, chat, vocab, eos, n_eos);
        return MMRT_OK;
    }
    json_t *root = NULL;
    mmrt_status st = mmrt_json_load_object(path, 1 << 20, 0, &root, err);
    if (st != MMRT_OK)
        return st;
    const json_t *e = json_object_get(root, "eos_token_id");
    if (!e || json_is_null(e)) {
        eos[0] = (int32_t)fallback;
        *n_eos = fallback >= 0;
    } else {
        st = mmrt_json_opt_id_list(root, "eos_token_id", path, vocab - 1, eos,
                                   MMRT_LLAVA_MAX_EOS, n_eos, err);
    }
    json_decref(root);
    if (st == MMRT_OK)
        add_turn_end(tok, chat, vocab, eos, n_eos);
    return st;
}

mmrt_status mmrt_llava_load_preprocessor_config(const char *dir, char *path, size_t size,
                                                json_t **root, const json_t **obj,
                                                struct mmrt_clip_preprocess_config *pp,
                                                struct mmrt_error *err)
{
    snprintf(path, size, "%s/preprocessor_config.json", dir);
    if (mmrt_file_exists(path)) {
        mmrt_status st = mmrt_json_load_file(path, 1 << 20, 0, root, err);
        if (obj)
            *obj = *root;
        return st == MMRT_OK ? mmrt_clip_preprocess_config_from_json(*root, path, pp, err) : st;
    }
    snprintf(path, size, "%s/processor_config.json", dir);
    mmrt_status st = mmrt_json_load_file(path, 1 << 20, 0, root, err);
    if (st == MMRT_ERR_IO && !mmrt_file_exists(path))
        return mmrt_error_set(err, MMRT_ERR_FORMAT, "%s: neither preprocessor_config.json nor "
                              "processor_config.json is present", dir);
    if (st != MMRT_OK)
        return st;
    const json_t *ip = json_object_get(*root, "image_processor");
    if (obj)
        *obj = ip;
    if (!json_is_object(ip))
        return mmrt_error_set(err, MMRT_ERR_FORMAT, "%s: no \"image_processor\" object", path);
    return mmrt_clip_preprocess_config_from_json(ip, path, pp, err);
}

/* Template files are a few KiB; the bound only keeps a hostile one from costing memory. */
#define TEMPLATE_MAX_BYTES (16u << 20)

/* The chat template of tokenizer_config.json's or a processor file's "chat_template": a
 * string, or (tokenizer_config.json) a list of {"name", "template"} of which transformers
 * renders the one named "default". *text stays NULL when the key is absent or the list has
 * no default. */
static mmrt_status template_member(const json_t *root, const char *path, const char **text,
                                   struct mmrt_error *err)
{
    const json_t *v = json_object_get(root, "chat_template");
    if (!v || json_is_null(v))
        return MMRT_OK;
    if (json_is_string(v)) {
        *text = json_string_value(v);
        return MMRT_OK;
    }
    if (!json_is_array(v))
        return mmrt_error_set(err, MMRT_ERR_FORMAT, "%s: \"chat_template\" is %s; expected a "
                              "string or a list of {\"name\", \"template\"}", path,
                              /* read with every number a real (json.h) */
                              json_is_number(v) ? "a number" : mmrt_json_type_name(v));
    for (size_t i = 0; i < json_array_size(v); i++) {
        const json_t *e = json_array_get(v, i);
        const json_t *name = json_object_get(e, "name"), *tpl = json_object_get(e, "template");
        if (!json_is_object(e) || !json_is_string(name) || !json_is_string(tpl))
            return mmrt_error_set(err, MMRT_ERR_FORMAT, "%s: chat_template[%zu] is not a "
                                  "{\"name\": string, \"template\": string} object", path, i);
        if (strcmp(json_string_value(name), "default") == 0)
            *text = json_string_value(tpl);
    }
    return MMRT_OK;
}

/* Each family by the literal markers its output carries (all of them must be there). */
static const struct {
    enum mmrt_chat_template family;
    const char *marks[2];
} families[] = {
    { MMRT_CHAT_TEMPLATE_LLAVA, { "ASSISTANT:", NULL } },
    { MMRT_CHAT_TEMPLATE_MISTRAL, { "[INST]", "[/INST]" } },
    { MMRT_CHAT_TEMPLATE_CHATML, { "<|im_start|>", "<|im_end|>" } },
    { MMRT_CHAT_TEMPLATE_LLAMA3, { "<|start_header_id|>", "<|end_header_id|>" } },
};

/* Which family a template's text belongs to; AUTO when none or several match. */
static enum mmrt_chat_template template_family(const char *t, size_t n)
{
    enum mmrt_chat_template found = MMRT_CHAT_TEMPLATE_AUTO;
    int matches = 0;
    for (size_t f = 0; f < sizeof families / sizeof families[0]; f++) {
        bool all = true;
        for (int k = 0; k < 2 && families[f].marks[k]; k++)
            all &= memmem(t, n, families[f].marks[k], strlen(families[f].marks[k])) != NULL;
        if (all) {
            found = families[f].family;
            matches++;
        }
    }
    return matches == 1 ? found : MMRT_CHAT_TEMPLATE_AUTO;
}

mmrt_status mmrt_llava_choose_template(const char *dir, enum mmrt_chat_template requested,
                                       bool text_mistral, enum mmrt_chat_template *out,
                                       struct mmrt_error *err)
{
    if (requested != MMRT_CHAT_TEMPLATE_AUTO) {
        *out = requested;
        return MMRT_OK;
    }
    /* Where transformers' processor and tokenizer look, in the order the processor takes
     * them. */
    static const char *const files[] = { "chat_template.jinja", "chat_template.json",
                                         "processor_config.json", "tokenizer_config.json" };
    char path[4200];
    for (size_t f = 0; f < sizeof files / sizeof files[0]; f++) {
        snprintf(path, sizeof path, "%s/%s", dir, files[f]);
        if (!mmrt_file_exists(path))
            continue;
        char *raw = NULL;
        size_t len = 0;
        json_t *root = NULL;
        const char *text = NULL;
        mmrt_status st;
        if (f == 0) {
            st = mmrt_file_read(path, TEMPLATE_MAX_BYTES, 0, " for a chat template", &raw, &len,
                                err);
            text = raw;
        } else {
            st = mmrt_json_load_object_reals(path, TEMPLATE_MAX_BYTES, 0, &root, err);
            if (st == MMRT_OK)
                st = template_member(root, path, &text, err);
            len = text ? strlen(text) : 0;
        }
        enum mmrt_chat_template family = MMRT_CHAT_TEMPLATE_AUTO;
        if (st == MMRT_OK && text) {
            family = template_family(text, len);
            if (family == MMRT_CHAT_TEMPLATE_AUTO)
                st = mmrt_error_set(err, MMRT_ERR_UNSUPPORTED,
                                    "%s: the chat template is none of the four mmrt renders "
                                    "(LLaVA's \"USER: … ASSISTANT:\", Mistral's \"[INST] … "
                                    "[/INST]\", ChatML's \"<|im_start|> … <|im_end|>\", "
                                    "Llama 3's \"<|start_header_id|> … <|end_header_id|>\"), "
                                    "or has the marks of several; set [model] chat_template "
                                    "= llava, mistral, chatml or llama3 to use one of them",
                                    path);
        }
        free(raw);
        json_decref(root);
        if (st != MMRT_OK)
            return st;
        if (text) {
            *out = family;
            return MMRT_OK;
        }
    }
    *out = text_mistral ? MMRT_CHAT_TEMPLATE_MISTRAL : MMRT_CHAT_TEMPLATE_LLAVA;
    return MMRT_OK;
}

/* The llava-1.5 / llava-1.6-vicuna chat template (models.md §7.5): each turn is ROLE.upper()
 * + ": " (a system turn has no prefix), "<image>\n" per image, its text + " "; then the
 * generation prompt "ASSISTANT:". BOS comes from the tokenizer. */
static void render_llava(const struct mmrt_request *req, struct mmrt_text *t)
{
    for (int i = 0; i < req->n_messages; i++) {
        const struct mmrt_message *msg = &req->messages[i];
        if (strcmp(msg->role, "user") == 0)
            mmrt_text_add(t, "USER: ");
        else if (strcmp(msg->role, "assistant") == 0)
            mmrt_text_add(t, "ASSISTANT: ");
        for (int k = 0; k < msg->n_images; k++)
            mmrt_text_add(t, "<image>\n");
        if (msg->text) {
            mmrt_text_add(t, msg->text);
            mmrt_text_add(t, " ");
        }
    }
    mmrt_text_add(t, "ASSISTANT:");
}

/* llava-1.6-mistral's template (models.md §7.5), as its Jinja renders it: a system turn is
 * "<<SYS>>\n" + text + "\n<</SYS>>\n\n"; a user turn "[INST] ", "<image>\n" per image, its
 * text, " [/INST]"; an assistant turn " " + text + "<\\s> " — a backslash, not "</s>": the
 * published template escapes it that way, and transformers renders it so. There is no
 * generation prompt: the answer follows " [/INST]". BOS comes from the tokenizer. */
static void render_mistral(const struct mmrt_request *req, struct mmrt_text *t)
{
    for (int i = 0; i < req->n_messages; i++) {
        const struct mmrt_message *msg = &req->messages[i];
        const char *text = msg->text ? msg->text : "";
        if (strcmp(msg->role, "system") == 0) {
            mmrt_text_add(t, "<<SYS>>\n");
            mmrt_text_add(t, text);
            mmrt_text_add(t, "\n<</SYS>>\n\n");
        } else if (strcmp(msg->role, "user") == 0) {
            mmrt_text_add(t, "[INST] ");
            for (int k = 0; k < msg->n_images; k++)
                mmrt_text_add(t, "<image>\n");
            mmrt_text_add(t, text);
            mmrt_text_add(t, " [/INST]");
        } else {
            mmrt_text_add(t, " ");
            mmrt_text_add(t, text);
            mmrt_text_add(t, "<\\s> ");
        }
    }
}

/* The ChatML template of llava-1.6-34b (on Nous-Hermes-2-Yi-34B), as its Jinja renders it:
 * each turn "<|im_start|>" + role + "\n", "<image>\n" per image, its text, "<|im_end|>\n";
 * then the generation prompt "<|im_start|>assistant\n". No system turn is added. */
static void render_chatml(const struct mmrt_request *req, struct mmrt_text *t)
{
    for (int i = 0; i < req->n_messages; i++) {
        const struct mmrt_message *msg = &req->messages[i];
        mmrt_text_add(t, "<|im_start|>");
        mmrt_text_add(t, msg->role);
        mmrt_text_add(t, "\n");
        for (int k = 0; k < msg->n_images; k++)
            mmrt_text_add(t, "<image>\n");
        if (msg->text)
            mmrt_text_add(t, msg->text);
        mmrt_text_add(t, "<|im_end|>\n");
    }
    mmrt_text_add(t, "<|im_start|>assistant\n");
}

/* llama3-llava-next-8b's template, as its Jinja renders it: each turn
 * "<|start_header_id|>" + role + "<|end_header_id|>\n\n", "<image>" per image (no newline
 * after it), then "\n" + text + "<|eot_id|>" — only when the turn has text, so a turn of
 * images alone has no end mark; then the generation prompt for the assistant's header. BOS
 * (<|begin_of_text|>) comes from the tokenizer. */
static void render_llama3(const struct mmrt_request *req, struct mmrt_text *t)
{
    for (int i = 0; i < req->n_messages; i++) {
        const struct mmrt_message *msg = &req->messages[i];
        mmrt_text_add(t, "<|start_header_id|>");
        mmrt_text_add(t, msg->role);
        mmrt_text_add(t, "<|end_header_id|>\n\n");
        for (int k = 0; k < msg->n_images; k++)
            mmrt_text_add(t, "<image>");
        if (msg->text) {
            mmrt_text_add(t, "\n");
            mmrt_text_add(t, msg->text);
            mmrt_text_add(t, "<|eot_id|>");
        }
    }
    mmrt_text_add(t, "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

/* Renders the chat, tokenizes, and expands each <image> id into n_image ids. */
static mmrt_status build_prompt(const struct mmrt_llava_lm *m, const struct mmrt_request *req,
                                int n_images, int64_t n_image, int32_t **ids_out,
                                int64_t *n_out, int64_t *image_pos, struct mmrt_error *err)
{
    struct mmrt_text text = { 0 };
    switch (m->chat) {
    case MMRT_CHAT_TEMPLATE_MISTRAL: render_mistral(req, &text); break;
    case MMRT_CHAT_TEMPLATE_CHATML: render_chatml(req, &text); break;
    case MMRT_CHAT_TEMPLATE_LLAMA3: render_llama3(req, &text); break;
    default: render_llava(req, &text); break;
    }
    if (text.failed) {
        free(text.s);
        return mmrt_error_set(err, MMRT_ERR_NO_MEMORY, "prompt: out of memory");
    }
    int32_t *ids = NULL, *full = NULL;
    size_t n = 0;
    mmrt_status st = mmrt_tokenizer_encode(m->tok, text.s, text.len, MMRT_TOKENIZE_ADD_SPECIAL,
                                           &ids, &n, err);
    free(text.s);
    if (st != MMRT_OK)
        return mmrt_error_prefix(err, st, "prompt");
    int found = 0;
    for (size_t i = 0; i < n; i++)
        found += ids[i] == m->image_token_id;
    if (found != n_images) {
        free(ids);
        return mmrt_error_set(err, MMRT_ERR_INVALID_ARG,
                              "prompt has %d image placeholder%s but %d image%s given", found,
                              found == 1 ? "" : "s", n_images, n_images == 1 ? " was" : "s were");
    }
    int64_t total = (int64_t)n + (int64_t)found * (n_image - 1);
    full = malloc((size_t)(total ? total : 1) * sizeof *full);
    if (!full) {
        free(ids);
        return mmrt_error_set(err, MMRT_ERR_NO_MEMORY, "prompt: out of memory");
    }
    int64_t k = 0;
    *image_pos = -1;
    for (size_t i = 0; i < n; i++) {
        if (ids[i] == m->image_token_id) {
            *image_pos = k;
            for (int64_t j = 0; j < n_image; j++)
                full[k++] = m->image_token_id;
        } else {
            full[k++] = ids[i];
        }
    }
    free(ids);
    *ids_out = full;
    *n_out = total;
    return MMRT_OK;
}

/* The image's patch grids in the prompt (mmrt_llava_lm.grid). Features whose layout does not
 * match (a NeXT output without its map's grid) describe no grid: that prompt keeps every
 * image row's K/V. */
static mmrt_status add_grids(const struct mmrt_llava_lm *m, const struct mmrt_vision_output *vis,
                             int64_t image_pos, struct mmrt_prompt *out, struct mmrt_error *err)
{
    const int64_t g = m->grid, base = m->grid_offset + g * g;
    if (g < 1 || vis->n_tokens < base)
        return MMRT_OK;
    if (!m->packed_map)
        return vis->n_tokens == base
                   ? mmrt_prompt_add_grid(out, image_pos + m->grid_offset, g, g, g, err)
                   : MMRT_OK;
    if (!vis->grid_thw)
        return MMRT_OK;
    const int64_t rows = vis->grid_thw[1], cols = vis->grid_thw[2];
    if (rows < 1 || cols < 1 || base + rows * (cols + 1) != vis->n_tokens)
        return MMRT_OK;
    mmrt_status st = mmrt_prompt_add_grid(out, image_pos + m->grid_offset, g, g, g, err);
    return st == MMRT_OK ? mmrt_prompt_add_grid(out, image_pos + base, rows, cols, cols + 1, err)
                         : st;
}

mmrt_status mmrt_llava_prepare(const struct mmrt_llava_lm *m, const struct mmrt_request *req,
                               const struct mmrt_vision_output *vis, struct mmrt_prompt *out,
                               struct mmrt_error *err)
{
    memset(out, 0, sizeof *out);
    if (vis->n_images && vis->dim != m->lm->cfg.hidden)
        return mmrt_error_set(err, MMRT_ERR_INVALID_ARG,
                              "image features have width %lld, the decoder needs %lld",
                              (long long)vis->dim, (long long)m->lm->cfg.hidden);
    int64_t image_pos = -1;
    mmrt_status st = build_prompt(m, req, vis->n_images, vis->n_tokens, &out->ids,
                                  &out->n_ids, &image_pos, err);
    if (st == MMRT_OK && image_pos >= 0)
        st = mmrt_prompt_add_splice(out, image_pos, vis->n_tokens, 0, err);
    if (st == MMRT_OK && image_pos >= 0)
        st = add_grids(m, vis, image_pos, out, err);
    if (st != MMRT_OK)
        mmrt_prompt_free(out);
    return st;
}

void mmrt_llava_language(const struct mmrt_llava_lm *m, struct mmrt_language *out)
{
    *out = (struct mmrt_language){ .decoder = &m->lm->dec, .tok = m->tok, .eos = m->eos,
                                   .n_eos = m->n_eos };
}

mmrt_status mmrt_llava_load_towers(const char *dir, const struct mmrt_clip_config *ccfg,
                                   const struct mmrt_llama_config *lcfg, enum mmrt_op proj_act,
                                   bool proj_bias, const int64_t *feature_layers,
                                   int n_feature_layers, struct mmrt_dev *vision,
                                   struct mmrt_dev *language, const struct mmrt_llava_towers *out,
                                   struct mmrt_error *err)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    mmrt_status st = mmrt_tokenizer_load(path, NULL, out->tok, err);
    if (st != MMRT_OK)
        return st;
    if (mmrt_tokenizer_vocab_size(*out->tok) > (uint32_t)lcfg->vocab)
        return mmrt_error_set(err, MMRT_ERR_FORMAT,
                              "%s: the tokenizer has %u ids, more than the model's vocab_size "
                              "%lld", path, mmrt_tokenizer_vocab_size(*out->tok),
                              (long long)lcfg->vocab);
    enum mmrt_op vis_ops[32];
    int n_vis = 0;
    for (int i = 0; i < mmrt_clip_n_ops; i++)
        vis_ops[n_vis++] = mmrt_clip_ops[i];
    vis_ops[n_vis++] = proj_act;
    vis_ops[n_vis++] = ccfg->act;
    st = mmrt_dev_require_ops(vision, "the vision stage", vis_ops, n_vis, err);
    if (st == MMRT_OK)
        st = mmrt_dev_require_ops(language, "the language stage", mmrt_llama_ops,
                                  mmrt_llama_n_ops, err);
    if (st == MMRT_OK)
        st = mmrt_weights_open(dir, false, out->w, err);
    if (st != MMRT_OK)
        return st;
    mmrt_weights_set_options(*out->w, out->opts);
    int64_t max_layer = 0;
    for (int i = 0; i < n_feature_layers; i++)
        if (feature_layers[i] > max_layer)
            max_layer = feature_layers[i];
    st = mmrt_clip_load(out->clip, *out->w, vision, ccfg, max_layer, err);
    if (st != MMRT_OK)
        return st;
    const int64_t Dv = ccfg->hidden * n_feature_layers, Dt = lcfg->hidden;
    struct mmrt_weights *w = *out->w;
    st = mmrt_weights_load_matrix(w, vision, Dt, Dv, out->proj1_w, err,
                                  "multi_modal_projector.linear_1.weight");
    if (st == MMRT_OK)
        st = mmrt_weights_load_matrix(w, vision, Dt, Dt, out->proj2_w, err,
                                      "multi_modal_projector.linear_2.weight");
    if (st == MMRT_OK && proj_bias)
        st = mmrt_weights_load(w, vision, 1, (const int64_t[]){ Dt }, out->proj1_b, err,
                               "multi_modal_projector.linear_1.bias");
    if (st == MMRT_OK && proj_bias)
        st = mmrt_weights_load(w, vision, 1, (const int64_t[]){ Dt }, out->proj2_b, err,
                               "multi_modal_projector.linear_2.bias");
    return st;
}
