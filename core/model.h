/*
 * core/model.h — what a model implementation provides to the runtime, and the registry of
 * model types. A model is built from core ops only (ops.h); it never sees a plugin.
 *
 * A model is loaded once per runtime with its two stage devices (vision, language; they may
 * be the same device). It encodes the images of a request and prepares its prompt; the
 * generation engine (engine.h) runs every request's language stage through the model's
 * decoder, many requests at once.
 */
#ifndef MMRT_CORE_MODEL_H
#define MMRT_CORE_MODEL_H

#include <jansson.h>

#include "device.h"
#include "error.h"
#include "mmrt/mmrt.h"
#include "quant.h"

struct mmrt_model; /* owned by the implementation */
struct mmrt_decoder;
struct mmrt_tokenizer;

/* Optional observer of a request's intermediate values, for the golden tests and the
 * --check mode. Every member may be NULL. Arrays are borrowed for the call only. */
struct mmrt_model_trace {
    void *user;
    /* The model's preprocessed pixels of image `image`, shape [n_dims] outermost first.
     * Models that take several images per request call it once per image, in order. */
    void (*pixel_values)(void *user, int image, const float *data, int n_dims,
                         const int64_t *shape);
    /* The image embeddings handed to the language stage: [n_tokens, dim], once per image
     * in order (n_tokens may differ between images). */
    void (*image_features)(void *user, int image, const float *data, int64_t n_tokens,
                           int64_t dim);
    /* The prompt after template and placeholder expansion. */
    void (*prompt_ids)(void *user, const int32_t *ids, int n_ids);
    /* Logits that choose generated token `step` (0 = from the prefill's last position). */
    void (*logits)(void *user, int step, const float *logits, int64_t vocab);
};

/* What the vision stage hands to the language stage. Owned by the caller of encode();
 * release with mmrt_vision_output_free().
 *
 * Two layouts. Uniform (LLaVA, NeXT, Fuyu): every image has n_tokens embeddings and
 * tokens_per_image is NULL. Per image (Qwen2-VL, whose dynamic resolution gives each image
 * its own token count): tokens_per_image[i] embeddings for image i, n_tokens is their sum,
 * and grid_thw carries each image's patch grid. features always holds the images' rows one
 * after the other; mmrt_vision_output_rows() and _tokens() read either layout. */
struct mmrt_vision_output {
    int n_images;
    int64_t n_tokens;   /* embeddings per image (uniform), or the sum over images */
    int64_t dim;        /* language hidden size */
    float *features;    /* [Σ tokens][dim], malloc'ed; NULL when no image */
    int64_t *tokens_per_image; /* [n_images], malloc'ed; NULL for the uniform layout */
    int32_t *grid_thw;  /* [n_images][3] patch grid (t, h, w) as the processor's
                           image_grid_thw, malloc'ed; NULL when the model has none */
    double preprocess_ms, vision_ms;
};

/* Frees features, tokens_per_image and grid_thw and clears them. NULL is a no-op. */
void mmrt_vision_output_free(struct mmrt_vision_output *v);

/* Rows of features: n_images · n_tokens (uniform) or n_tokens (per image). */
int64_t mmrt_vision_output_rows(const struct mmrt_vision_output *v);

/* Embeddings of image i (0 ≤ i < n_images). */
int64_t mmrt_vision_output_tokens(const struct mmrt_vision_output *v, int i);

/* Rows [row, row + n_rows) of a prompt's embeddings are rows [src_row, src_row + n_rows) of
 * the vision output's features instead of the token embeddings (the image splice). */
struct mmrt_prompt_splice {
    int64_t row, n_rows, src_row;
};

/* Where one image's patch tokens sit in a prompt: cell (y, x) of its h × w patch grid is
 * prompt row row + y · stride + x (w ≤ stride; the rows a stride skips, such as LLaVA-NeXT's
 * image_newline or Fuyu's |NEWLINE|, are not patches). Image-token KV compression
 * (core/kv_compress.h) chooses among these rows only and keeps every other row. */
struct mmrt_prompt_grid {
    int64_t row, h, w, stride;
};

/* What the language stage runs for one request: token ids after template and placeholder
 * expansion, the splices of image features into them, the rotary positions and the image
 * patch grids. Built by a model's prepare(); mmrt_prompt_free() releases it. */
struct mmrt_prompt {
    int32_t *ids;               /* [n_ids], malloc'ed */
    int64_t n_ids;
    int32_t *pos;               /* [n_ids][n_axes] (M-RoPE), malloc'ed; NULL: token i is at
                                   position i on every axis */
    int64_t rope_delta;         /* the token at slot n ≥ n_ids is at position n + rope_delta */
    struct mmrt_prompt_splice *splices; /* malloc'ed, in row order */
    int n_splices;
    struct mmrt_prompt_grid *grids; /* malloc'ed, in row order, disjoint */
    int n_grids;
};

void mmrt_prompt_free(struct mmrt_prompt *p);

/* Appends a splice (rows in increasing order); MMRT_ERR_NO_MEMORY on failure. */
mmrt_status mmrt_prompt_add_splice(struct mmrt_prompt *p, int64_t row, int64_t n_rows,
                                   int64_t src_row, struct mmrt_error *err);

/* Appends an image's patch grid (after the previous one). MMRT_ERR_INVALID_ARG for a side
 * below 1 or w above stride (nothing appended); MMRT_ERR_NO_MEMORY on failure. */
mmrt_status mmrt_prompt_add_grid(struct mmrt_prompt *p, int64_t row, int64_t h, int64_t w,
                                 int64_t stride, struct mmrt_error *err);

#define MMRT_MAX_EOS 8

struct mmrt_st_tensor;

/* How a published 4-bit checkpoint packs its matrices (docs/QUANTIZATION.md). */
struct mmrt_packed_format {
    enum { MMRT_PACKED_NONE, MMRT_PACKED_AWQ, MMRT_PACKED_GPTQ, MMRT_PACKED_CT } kind;
    int64_t group;       /* inputs per group; 0 = one group for a whole row */
    bool zero_minus_one; /* GPTQ's first checkpoint format stores each zero point minus one */
    bool symmetric;      /* compressed-tensors without zero points: every zero point is 8 */
};

/* config.json's quantization_config (root: the parsed config.json; path names it in
 * messages): absent or null gives kind NONE; quant_method "mmrt" with a known `weights`
 * gives NONE too (the float loader reads mmrt's own layout); "awq", "gptq" and
 * "compressed-tensors" fill *packed when their bits, group size and format are ones mmrt
 * runs. Anything else is MMRT_ERR_FORMAT / MMRT_ERR_UNSUPPORTED naming the key and value.
 * *packed is scratch on failure. Internal (core/runtime.c; the config.json fuzz target). */
mmrt_status mmrt_quantization_config_check(const json_t *root, const char *path,
                                           struct mmrt_packed_format *packed,
                                           struct mmrt_error *err);

/* A matrix the loader quantized ([model] weights), as mmrt_model_options.on_quantized sees
 * it: the checkpoint tensor it came from, rows × cols, and its codes (I8 [rows, cols], or the
 * U4 bytes [rows, cols / 2] of plugin.h), scales ([rows], or [rows, cols / group]) and, for
 * 4-bit, zero points. Borrowed for the call. */
struct mmrt_quantized_matrix {
    const struct mmrt_st_tensor *tensor;
    int64_t rows, cols;
    int64_t group; /* weights per group of 4-bit codes; 0 for INT8 */
    const void *codes;
    const float *scale, *zero;
};
typedef void (*mmrt_quantized_fn)(void *user, const struct mmrt_quantized_matrix *m);
/* The format of the float matrix `name` (canonical, models/weights.h), given the model's
 * [model] weights `def`: how mmrt-quantize mixes formats (an INT8 vision tower beside an INT4
 * language model, a few sensitive matrices kept as stored). */
typedef enum mmrt_weight_format (*mmrt_format_fn)(void *user, const char *name,
                                                  enum mmrt_weight_format def);

/* A model's language stage as the engine sees it. */
struct mmrt_language {
    const struct mmrt_decoder *decoder;
    const struct mmrt_tokenizer *tok;
    const int32_t *eos;         /* ids that end the answer */
    int n_eos;
};

/* The configuration's settings for a model ([model] keys other than path), fixed for the
 * model's lifetime. All-zero is the default.
 *
 * The image-token budget (docs/CONFIG.md): a request's images together may carry at most
 * max_image_tokens image tokens — the positions they occupy in the prompt (Qwen2-VL:
 * grid t·h·w / merge²; LLaVA-NeXT: the packed rows with their image_newline rows; Fuyu:
 * the patches plus one |NEWLINE| per patch row; LLaVA-1.5: its fixed count). Models that
 * already refuse images their context cannot hold (Qwen2-VL, Fuyu) take the smaller of the
 * two bounds. The check runs in encode(), after decoding and before any resampling or
 * tower work. Over the budget, oversize_images says whether the request is refused
 * (MMRT_ERR_LIMIT, the message names the image, its size, its tokens, the budget and the
 * INI key) or the images are downscaled to fit; a model whose token count does not depend
 * on the image size (LLaVA-1.5) refuses either way and says so. */
struct mmrt_model_options {
    int64_t max_image_tokens;                  /* 0 = no limit beyond the model's context */
    enum mmrt_oversize_images oversize_images; /* MMRT_OVERSIZE_REFUSE by default */
    int64_t max_kv_tokens;  /* KV positions of the decoder's page store; 0 = default
                               (core/kv_cache.h) */
    int64_t kv_page_tokens; /* positions per KV page, a power of two; 0 = 16 */
    enum mmrt_kv_dtype kv_dtype; /* what the KV cache stores ([model] kv_dtype; 0 = F32) */
    enum mmrt_weight_format weights; /* matmul weights as stored or quantized at load
                                        ([model] weights; core/quant.h) */
    /* What the engine runs at most in one forward, for pool_mb = auto (pool_budget.h):
     * prefill rows (the larger of step_tokens and prefill_chunk) and decode rows
     * (max_batch); 0 = a whole prompt in one forward, one decode row. */
    int64_t max_prefill_rows;
    int64_t max_decode_rows;
    /* Requests whose vision stages may share a pass of the tower ([scheduler]
     * vision_batch; 0 = 1): how many images (LLaVA-1.5) or tiles (LLaVA-NeXT) one pass takes
     * at most, and what pool_mb = auto sizes the vision stage for. */
    int vision_batch;
    /* [model] exif_orientation: MMRT_EXIF_IGNORE (the default, as transformers) or
     * MMRT_EXIF_APPLY; encode() passes it to the decoder through mmrt_model_image_limits. */
    enum mmrt_exif_orientation exif_orientation;
    /* [model] chat_template: AUTO (the checkpoint's) or the family named; the runtime has
     * refused anything but AUTO for a model type without chat_templates. */
    enum mmrt_chat_template chat_template;
    /* Told about every matrix quantized at load (NULL: nobody), on the loading thread: how
     * mmrt-quantize gets exactly the codes the runtime would use. */
    mmrt_quantized_fn on_quantized;
    void *on_quantized_user;
    /* A published 4-bit packing (config.json quantization_config: AWQ or GPTQ), whose
     * qweight / qzeros / scales (/ g_idx) are repacked into U4 at load; kind NONE otherwise. */
    struct mmrt_packed_format packed;
    /* Each float matrix's own format (NULL: `weights` for all), on the loading thread. */
    mmrt_format_fn format_of;
    void *format_of_user;
};

/* The tensor dtype of a KV store of kind k ([model] kv_dtype); F32 for an unknown value, which
 * the runtime refused before a model is built. */
static inline enum mmrt_dtype mmrt_kv_store_dtype(enum mmrt_kv_dtype k)
{
    return k == MMRT_KV_F16    ? MMRT_DTYPE_F16
           : k == MMRT_KV_FP8  ? MMRT_DTYPE_F8E4M3
           : k == MMRT_KV_INT8 ? MMRT_DTYPE_I8
                               : MMRT_DTYPE_F32;
}

struct mmrt_model_type {
    const char *model_type; /* config.json "model_type", e.g. "llava" */
    /* Loads the checkpoint in `dir` (config.json already parsed into `config`) with the
     * vision stage on `vision` and the language stage on `language`. Checks every shape
     * against the config before allocating device memory. `opts` (copied; NULL = defaults)
     * holds the configuration's settings for the model. */
    mmrt_status (*load)(const char *dir, const json_t *config,
                        const struct mmrt_model_options *opts, struct mmrt_dev *vision,
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
    /* Vision stage of n requests together (optional; NULL: the runtime calls encode() once
     * per request). outs[i], sts[i] and errs[i] are request i's, as encode() would give
     * them: a request that fails (a bad image, over the budget) fails alone, and every
     * output is bit-identical to encode()'s for the same request — a model runs images
     * through one pass only where each image's rows stay above MMRT_SMALL_M in every matrix
     * product (plugin.h, batch invariance). No trace: traced runs take encode(). */
    void (*encode_batch)(struct mmrt_model *model, const struct mmrt_request *const *reqs,
                         int n, struct mmrt_vision_output *outs, mmrt_status *sts,
                         struct mmrt_error *errs);
    /* Language stage, the part that differs between models: the chat template, where the
     * image embeddings go and the rotary positions, for one request (vision from encode()).
     * The engine (engine.h) does the rest: prefill, batched decode, sampling, stopping. */
    mmrt_status (*prepare)(struct mmrt_model *model, const struct mmrt_request *req,
                           const struct mmrt_vision_output *vision, struct mmrt_prompt *out,
                           struct mmrt_error *err);
    /* The language stage's decoder, tokenizer and end-of-answer ids (borrowed from the
     * model, valid until destroy). */
    void (*language)(struct mmrt_model *model, struct mmrt_language *out);
    /* Images one request may carry (mmrt_request.image_paths); 0 means 1. The runtime
     * refuses requests with more, and hands a one-image request to a model that takes one
     * through image_path only, so such models never read image_paths. */
    int max_images;
    /* prepare() describes every image's patch grid (mmrt_prompt.grids), so image-token KV
     * compression can tell image rows from text; without it [model] image_kv_keep < 1 is a
     * configuration error. */
    bool image_grids;
    /* load() renders the template [model] chat_template names (mmrt_model_options); without
     * it only AUTO is accepted. */
    bool chat_templates;
};

struct mmrt_runtime;

/* mmrt_run with an observer of intermediate values (golden tests, --check). Internal: the
 * trace struct is not part of the embedding API. */
mmrt_status mmrt_run_traced(struct mmrt_runtime *rt, const struct mmrt_request *req,
                            const struct mmrt_model_trace *trace, mmrt_token_fn on_token,
                            void *user, struct mmrt_result *result);

/* mmrt_run_batch with one observer per request (traces[n]). Internal, like the above. */
mmrt_status mmrt_run_batch_traced(struct mmrt_runtime *rt, const struct mmrt_request *reqs,
                                  int n, const struct mmrt_model_trace *traces,
                                  mmrt_batch_token_fn on_token, void *user,
                                  struct mmrt_result *results);

/* mmrt_create with the loader's callbacks of hooks (on_quantized, format_of; the other members
 * are ignored) handed to the model. Internal: for tools built on the runtime, mmrt-quantize. */
mmrt_status mmrt_create_hooked(const struct mmrt_config *config,
                               const struct mmrt_model_options *hooks,
                               struct mmrt_runtime **out, char *err, size_t err_size);

/* The engine's counters (engine.h) since the runtime was made; zeros without a model. */
struct mmrt_engine_stats;
void mmrt_runtime_engine_stats(const struct mmrt_runtime *rt, struct mmrt_engine_stats *out);

/* ---- the request as a model sees it ----
 * The runtime hands encode() and prepare() a request in this version's layout with
 * everything checked (runtime.c normalize_request): messages always set (a prompt becomes one
 * user turn carrying every image), roles one of system / user / assistant, images only in
 * user turns and their counts adding up to n_images, each image a path or bytes — or both,
 * in the requests the vision cache makes (core/vision_cache.h): then the bytes are the
 * file's, read once, and the path names them in messages. */
struct mmrt_image;
struct mmrt_image_limits;

/* The decode limits every model's encode() uses: mmrt_image_limits_default() with the
 * model's settings applied (opts NULL = the defaults: EXIF orientation ignored). */
void mmrt_model_image_limits(const struct mmrt_model_options *opts,
                             struct mmrt_image_limits *out);

/* Decodes image i of req (its bytes in memory when it has them, else its file). */
mmrt_status mmrt_request_image_load(const struct mmrt_request *req, int i,
                                    const struct mmrt_image_limits *limits,
                                    struct mmrt_image **out, struct mmrt_error *err);

/* How messages name image i: its path, or "image i (N bytes in memory)"; borrowed from buf
 * (or from req). */
const char *mmrt_request_image_name(const struct mmrt_request *req, int i, char *buf,
                                    size_t size);

/* The implementation of model_type, or NULL. */
const struct mmrt_model_type *mmrt_model_type_find(const char *model_type);

/* Comma-separated list of supported model types, for messages. */
const char *mmrt_model_types_supported(void);

#endif
