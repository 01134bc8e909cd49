/*
 * core/model.h — what a model implementation provides to the runtime, and the registry of
 * model types. A model is built from core ops only (ops.h); it never sees a plugin.
 *
 * A model is loaded once per runtime with its two stage devices (vision, language; they may
 * be the same device) and answers one request at a time.
 */
#ifndef MMRT_CORE_MODEL_H
#define MMRT_CORE_MODEL_H

#include <jansson.h>

#include "device.h"
#include "error.h"
#include "mmrt/mmrt.h"

struct mmrt_model; /* owned by the implementation */

/* Optional observer of a request's intermediate values, for the golden tests and the
 * --check mode. Every member may be NULL. Arrays are borrowed for the call only. */
struct mmrt_model_trace {
    void *user;
    /* The model's preprocessed pixels of image `image`, shape [n_dims] outermost first. */
    void (*pixel_values)(void *user, int image, const float *data, int n_dims,
                         const int64_t *shape);
    /* The image embeddings handed to the language stage: [n_tokens, dim]. */
    void (*image_features)(void *user, int image, const float *data, int64_t n_tokens,
                           int64_t dim);
    /* The prompt after template and placeholder expansion. */
    void (*prompt_ids)(void *user, const int32_t *ids, int n_ids);
    /* Logits that choose generated token `step` (0 = from the prefill's last position). */
    void (*logits)(void *user, int step, const float *logits, int64_t vocab);
};

/* What the vision stage hands to the language stage. Owned by the caller of encode();
 * release with mmrt_vision_output_free(). */
struct mmrt_vision_output {
    int n_images;
    int64_t n_tokens;   /* embeddings per image */
    int64_t dim;        /* language hidden size */
    float *features;    /* [n_images][n_tokens][dim], malloc'ed; NULL when no image */
    double preprocess_ms, vision_ms;
};

void mmrt_vision_output_free(struct mmrt_vision_output *v);

struct mmrt_model_type {
    const char *model_type; /* config.json "model_type", e.g. "llava" */
    /* Loads the checkpoint in `dir` (config.json already parsed into `config`) with the
     * vision stage on `vision` and the language stage on `language`. Checks every shape
     * against the config before allocating device memory. */
    mmrt_status (*load)(const char *dir, const json_t *config, struct mmrt_dev *vision,
                        struct mmrt_dev *language, struct mmrt_model **out,
                        struct mmrt_error *err);
    void (*destroy)(struct mmrt_model *model);
    /* Vision stage of one request: every image → its embeddings, on the host (the hand-off
     * between stage devices goes through host memory). A request without images gives an
     * empty output. Runs only on the vision device, so it may overlap generate() of another
     * request when the stages are on different devices. */
    mmrt_status (*encode)(struct mmrt_model *model, const struct mmrt_request *req,
                          const struct mmrt_model_trace *trace, struct mmrt_vision_output *out,
                          struct mmrt_error *err);
    /* Language stage: template, splice the image embeddings, prefill and decode, streaming
     * tokens through on_token. Runs only on the language device. */
    mmrt_status (*generate)(struct mmrt_model *model, const struct mmrt_request *req,
                            const struct mmrt_vision_output *vision,
                            const struct mmrt_model_trace *trace, mmrt_token_fn on_token,
                            void *user, struct mmrt_result *result, struct mmrt_error *err);
};

struct mmrt_runtime;

/* mmrt_run with an observer of intermediate values (golden tests, --check). Internal: the
 * trace struct is not part of the embedding API. */
mmrt_status mmrt_run_traced(struct mmrt_runtime *rt, const struct mmrt_request *req,
                            const struct mmrt_model_trace *trace, mmrt_token_fn on_token,
                            void *user, struct mmrt_result *result);

/* The implementation of model_type, or NULL. */
const struct mmrt_model_type *mmrt_model_type_find(const char *model_type);

/* Comma-separated list of supported model types, for messages. */
const char *mmrt_model_types_supported(void);

#endif
