/*
 * models/llava_common.h — the parts LLaVA-1.5 (llava.c) and LLaVA-NeXT (llava_next.c) share:
 * config readers and the whole language stage (chat template, <image> expansion, feature
 * splice, prefill, decode loop). models.md §2.3, §2.6, §3.4, §7.5.
 */
#ifndef MMRT_MODELS_LLAVA_COMMON_H
#define MMRT_MODELS_LLAVA_COMMON_H

#include <jansson.h>

#include "clip.h"
#include "formats/tokenizer.h"
#include "llama.h"
#include "model.h"
#include "preprocess.h"

#define MMRT_LLAVA_MAX_FEATURE_LAYERS 8
#define MMRT_LLAVA_MAX_EOS MMRT_MAX_EOS

/* projector_hidden_act → operator (gelu, quick_gelu, gelu_pytorch_tanh/gelu_new, silu);
 * MMRT_ERR_UNSUPPORTED naming `what` otherwise. */
mmrt_status mmrt_llava_act_from_name(const char *name, const char *what, enum mmrt_op *out,
                                     struct mmrt_error *err);

/* What a LLaVA-family config.json says (models.md §1.6): both towers' configs (vision_config
 * and text_config, class defaults for missing keys), the image token, the projector's
 * activation and bias, the feature layers and the feature selection strategy. */
struct mmrt_llava_config {
    struct mmrt_clip_config clip;
    struct mmrt_llama_config text;
    int32_t image_token_id;     /* image_token_index (or image_token_id), below vocab */
    enum mmrt_op proj_act;      /* projector_hidden_act */
    bool proj_bias;             /* multimodal_projector_bias */
    bool keep_cls;              /* vision_feature_select_strategy "full" (else "default") */
    bool text_mistral;          /* text_config.model_type "mistral" (llava-1.6-mistral) */
    int64_t feature_layers[MMRT_LLAVA_MAX_FEATURE_LAYERS];
    int n_feature_layers;
};

/* Reads *out from config.json (`what` names it in messages); refuses malformed sections,
 * an image token outside the vocabulary and strategies other than default / full. *out is
 * written only on success. */
mmrt_status mmrt_llava_config_parse(const json_t *config, const char *what,
                                    struct mmrt_llava_config *out, struct mmrt_error *err);

/* vision_feature_layer of `cfg` (an int or a list of 1…MMRT_LLAVA_MAX_FEATURE_LAYERS ints;
 * default −2), Python-indexed into the n_layers + 1 hidden states of the tower, into
 * layers[*n] as indices 0 … n_layers. MMRT_ERR_FORMAT naming `what` otherwise. */
mmrt_status mmrt_llava_parse_feature_layers(const json_t *cfg, const char *what,
                                            int64_t n_layers, int64_t *layers, int *n,
                                            struct mmrt_error *err);

/* The ids that end an answer: generation_config.json's eos_token_id in `dir` when present
 * (int or list of at most MMRT_LLAVA_MAX_EOS), else `fallback` (none when < 0); then the
 * turn-end token of chat's template (ChatML's <|im_end|>, Llama 3's <|eot_id|>) when tok has
 * it as a special token, so an answer ends where the template ends an assistant turn. Each
 * id read must be below vocab; a value beyond that, negative, or not an integer is refused
 * naming the file and key. Qwen2-VL and Fuyu read their end ids through it too (chat AUTO:
 * the file's ids alone). */
mmrt_status mmrt_llava_read_eos(const char *dir, int64_t fallback, int64_t vocab,
                                const struct mmrt_tokenizer *tok, enum mmrt_chat_template chat,
                                int32_t *eos, int *n_eos, struct mmrt_error *err);

/* Image settings: preprocessor_config.json (hub layout), else the "image_processor" object
 * of processor_config.json (what transformers 5 writes). `path` receives the file used,
 * *root the parsed file (the caller json_decref()s it, also on failure), *obj (may be NULL)
 * the object the settings came from. */
mmrt_status mmrt_llava_load_preprocessor_config(const char *dir, char *path, size_t size,
                                                json_t **root, const json_t **obj,
                                                struct mmrt_clip_preprocess_config *pp,
                                                struct mmrt_error *err);

/* The template the model renders chats with: `requested` when it names one ([model]
 * chat_template); for AUTO the checkpoint's own, from the first of chat_template.jinja,
 * chat_template.json, processor_config.json and tokenizer_config.json ("default" of a list)
 * that has one, recognised by the literal text it writes (LLaVA's "ASSISTANT:", Mistral's
 * "[INST]" … "[/INST]", ChatML's "<|im_start|>" … "<|im_end|>", Llama 3's
 * "<|start_header_id|>" … "<|end_header_id|>"); with none anywhere, Mistral's for a
 * mistral text model, else LLaVA's. A template of none of these families (or with the
 * marks of several) is MMRT_ERR_UNSUPPORTED naming the file and the key that chooses one; a
 * malformed file is refused by name. */
mmrt_status mmrt_llava_choose_template(const char *dir, enum mmrt_chat_template requested,
                                       bool text_mistral, enum mmrt_chat_template *out,
                                       struct mmrt_error *err);

/* Where mmrt_llava_load_towers() puts what it loads (the model's own fields). */
struct mmrt_llava_towers {
    struct mmrt_tokenizer **tok;
    struct mmrt_weights **w;
    struct mmrt_clip *clip;
    struct mmrt_weight *proj1_w, *proj2_w;
    struct mmrt_tensor *proj1_b, *proj2_b; /* untouched if none */
    const struct mmrt_model_options *opts; /* [model] weights and the quantization observer */
};

/* What LLaVA-1.5 and NeXT load the same way, in this order so that nothing reaches a
 * device before the cheap checks pass: tokenizer.json (no more ids than the model's vocab),
 * the operators each stage's device must have, then the checkpoint, the CLIP tower up to
 * the deepest feature layer on `vision` and the projector (linear_1 [Dt, Dv·n_layers],
 * linear_2 [Dt, Dt], biases when proj_bias) on `vision`. On failure the caller's destroy
 * releases whatever was filled in. */
mmrt_status mmrt_llava_load_towers(const char *dir, const struct mmrt_clip_config *ccfg,
                                   const struct mmrt_llama_config *lcfg, enum mmrt_op proj_act,
                                   bool proj_bias, const int64_t *feature_layers,
                                   int n_feature_layers, struct mmrt_dev *vision,
                                   struct mmrt_dev *language, const struct mmrt_llava_towers *out,
                                   struct mmrt_error *err);

/* What the language stage needs; all borrowed from the model. */
struct mmrt_llava_lm {
    struct mmrt_llama *lm;
    struct mmrt_tokenizer *tok;
    int32_t image_token_id;
    const int32_t *eos;
    int n_eos;
    /* The patch grid (model.h mmrt_prompt_grid): grid × grid patches after grid_offset
     * rows (a kept CLS row) of an image's features; with packed_map (LLaVA-NeXT) they are
     * the base tile, followed by the unpadded map whose rows and columns are the vision
     * output's grid_thw[1], [2], each row followed by an image_newline row. */
    int64_t grid, grid_offset;
    bool packed_map;
    enum mmrt_chat_template chat; /* mmrt_llava_choose_template */
};

/* The language stage of one request (model.h prepare()): renders the chat with l->chat
 * (e.g. LLaVA's "USER: <image>\n{prompt} ASSISTANT:" or Mistral's "[INST] <image>\n{prompt}
 * [/INST]"), tokenizes and expands the <image> id into vis->n_tokens ids (the prompt must
 * hold exactly vis->n_images placeholders: MMRT_ERR_INVALID_ARG otherwise), whose rows the
 * features replace. */
mmrt_status mmrt_llava_prepare(const struct mmrt_llava_lm *l, const struct mmrt_request *req,
                               const struct mmrt_vision_output *vis, struct mmrt_prompt *out,
                               struct mmrt_error *err);

/* The decoder, tokenizer and eos ids of l, for the engine. */
void mmrt_llava_language(const struct mmrt_llava_lm *l, struct mmrt_language *out);

#endif
