/*
 * mmrt/mmrt.h — the embedding API: what a program links against to run vision-language
 * models with mmrt. The `mmrt` command-line tool is a thin layer over exactly this.
 *
 * Lifecycle
 *   mmrt_create_from_file() (or mmrt_create() with a config struct) loads the plugins the
 *   configuration names, opens their devices, reserves each device's memory pool and, when a
 *   model is configured, loads its weights onto the devices of its stages. mmrt_run() answers
 *   one request, streaming tokens through a callback. mmrt_destroy() releases everything.
 *
 * Errors
 *   Every fallible function returns an mmrt_status (0 = MMRT_OK, negative = failure class).
 *   The human detail (file:line, key, tensor, plugin path) is in the runtime's last-error
 *   string (mmrt_last_error), or, for functions that have no runtime yet, in the caller's
 *   buffer. The library never prints and never exits; it logs through mmrt_set_log_sink().
 *
 * Threads
 *   mmrt_submit(), mmrt_cancel() and mmrt_wait() may be called from any number of threads at
 *   once: their requests run together on the runtime's worker thread. Every other call on a
 *   runtime is made by one thread at a time (mmrt_run and mmrt_run_batch may overlap with
 *   submitted requests: they run in the same engine). Different runtimes are independent,
 *   except that they share loaded plugins (the process-wide plugin registry) and the log
 *   sink.
 */
#ifndef MMRT_MMRT_H
#define MMRT_MMRT_H

#include <stdbool.h>

#include "mmrt/common.h"

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define MMRT_API __attribute__((visibility("default")))
#else
#define MMRT_API
#endif

/* "0.1.0" */
MMRT_API const char *mmrt_version(void);

/* Short default message of a status ("malformed input"); never NULL. */
MMRT_API const char *mmrt_status_string(mmrt_status status);

/* Log sink: receives every line at min_level or above from the core and the plugins.
 * fn == NULL restores the default sink (stderr, WARN and above). Process-wide. */
typedef void (*mmrt_log_fn)(void *user, enum mmrt_log_level level, const char *who,
                            const char *message);
MMRT_API void mmrt_set_log_sink(mmrt_log_fn fn, void *user, enum mmrt_log_level min_level);

/* ----------------------------------------------------------------------------------------
 * Configuration as a struct, for programs that do not use an INI file. All strings are
 * borrowed for the duration of mmrt_create() only.
 */
/* Whether a device's pool keeps level 1 (exact-size slots for the sizes each step asks for
 * again) in front of its buddy allocator (docs/CONFIG.md "Memory"). The zero value is the
 * default, on. */
enum mmrt_level1 {
    MMRT_LEVEL1_DEFAULT = 0, /* on */
    MMRT_LEVEL1_ON = 1,
    MMRT_LEVEL1_OFF = 2,     /* the buddy allocator alone: every block a power of two */
};

struct mmrt_device_config {
    const char *name;                  /* e.g. "cpu0"; referenced by the stages */
    const char *plugin;                /* e.g. "cpu" → libmmrt_cpu.so */
    int index;                         /* device index within the plugin */
    /* Working memory reserved on the device, MiB. 0 (the default, INI `pool_mb = auto`) =
     * sized when the runtime starts from what the stages placed on the device need: the KV
     * store (max_kv_tokens, or the model's context) plus the activations of the largest
     * request the configuration allows (the largest image the model's preprocessing and
     * max_image_tokens admit, the longest prompt the context or max_kv_tokens admits), plus
     * a margin; a device without a stage gets a small pool (docs/CONFIG.md "Memory").
     * Weights are never in the pool. An explicit value larger than the device's memory is
     * refused, as is an automatic one (the message gives both figures). */
    uint64_t pool_mb;
    const struct mmrt_option *options; /* plugin-specific keys, may be NULL */
    int n_options;
    enum mmrt_level1 level1;           /* INI: [device.NAME] level1 = on | off */
};

/* What the vision stage does with images over the image-token budget (max_image_tokens). */
enum mmrt_oversize_images {
    MMRT_OVERSIZE_REFUSE = 0,    /* the request fails with MMRT_ERR_LIMIT (default) */
    MMRT_OVERSIZE_DOWNSCALE = 1, /* images are shrunk until they fit, where the model allows
                                    it (docs/CONFIG.md); otherwise refused */
};

/* What the vision stage does with an image's EXIF Orientation tag (JPEG APP1, PNG eXIf). */
enum mmrt_exif_orientation {
    MMRT_EXIF_IGNORE = 0, /* pixels as stored, as the transformers processors see them
                             (PIL's Image.open does not rotate; the default) */
    MMRT_EXIF_APPLY = 1,  /* turned upright first, like PIL's ImageOps.exif_transpose */
};

enum mmrt_kv_dtype {
    MMRT_KV_F32 = 0,
    MMRT_KV_F16 = 1,
    MMRT_KV_FP8 = 2, /* FP8 E4M3, saturating at ±448 (plugin.h MMRT_DTYPE_F8E4M3) */
    MMRT_KV_INT8 = 3, /* INT8 codes with an f32 scale per token and KV head (plugin.h "I8
                         with row scales") */
};

/* Which image tokens' K/V survive image-token KV compression (docs/ENGINE.md "Image-token
 * KV compression"), per layer and KV head. */
enum mmrt_image_kv_policy {
    MMRT_IMAGE_KV_DEFAULT = 0,       /* the policy docs/BENCHMARKS.md measured best */
    MMRT_IMAGE_KV_KEY_NORM_HIGH = 1, /* the keys with the largest L2 norms */
    MMRT_IMAGE_KV_KEY_NORM_LOW = 2,  /* the keys with the smallest L2 norms (Devoto et al.) */
    MMRT_IMAGE_KV_RANDOM = 3,        /* a seeded uniform choice: the baseline */
    MMRT_IMAGE_KV_POOL2X2 = 4,       /* averages of patch-grid neighbourhoods (2×2 at 0.25) */
};

/* The chat template LLaVA-1.5 and LLaVA-NeXT checkpoints render their turns with (models.md
 * §7.5). mmrt has no Jinja engine: it recognises the checkpoint's own template and renders
 * that family itself. */
enum mmrt_chat_template {
    MMRT_CHAT_TEMPLATE_AUTO = 0,    /* the checkpoint's template (chat_template.jinja,
                                       chat_template.json, processor_config.json or
                                       tokenizer_config.json, the first that has one); with
                                       none, Mistral's for a mistral text model, else
                                       LLaVA's; one mmrt does not recognise is refused */
    MMRT_CHAT_TEMPLATE_LLAVA = 1,   /* "USER: <image>\n… ASSISTANT:" (llava-1.5, -1.6-vicuna) */
    MMRT_CHAT_TEMPLATE_MISTRAL = 2, /* "[INST] <image>\n… [/INST]" (llava-1.6-mistral) */
    MMRT_CHAT_TEMPLATE_CHATML = 3,  /* "<|im_start|>user\n<image>\n…<|im_end|>\n"
                                       (llava-1.6-34b, on Nous-Hermes-2-Yi) */
    MMRT_CHAT_TEMPLATE_LLAMA3 = 4,  /* "<|start_header_id|>user<|end_header_id|>\n\n<image>
                                       \n…<|eot_id|>" (llama3-llava-next-8b) */
};

/* How the checkpoint's matrices (every matmul weight of the towers, the projector and the
 * decoder, the LM head too unless it is the tied embedding) are held on their devices. */
enum mmrt_weight_format {
    MMRT_WEIGHTS_CHECKPOINT = 0, /* as stored: F32, F16 or BF16 (mapped in place where the
                                    device can) */
    MMRT_WEIGHTS_INT8 = 1,       /* INT8, one scale per output channel, quantized at load
                                    (docs/QUANTIZATION.md): about half the bytes of F16 */
    MMRT_WEIGHTS_INT4 = 2,       /* INT4 in groups of 128 with a scale and a zero point each,
                                    quantized at load: about 0.28 × the bytes of F16 */
    MMRT_WEIGHTS_INT4_G64 = 3,   /* the same in groups of 64 */
    MMRT_WEIGHTS_INT4_G32 = 4,   /* the same in groups of 32 */
};

struct mmrt_config {
    uint32_t struct_size;              /* sizeof(struct mmrt_config), or 0 (see mmrt_request) */
    const char *model_path;            /* checkpoint directory; NULL = devices only */
    const struct mmrt_device_config *devices;
    int n_devices;                     /* at least 1 */
    const char *vision_device;         /* device name; NULL = the first device */
    const char *language_device;       /* device name; NULL = the first device */
    /* Image tokens one request may carry, all its images together, checked in the vision
     * stage before any resampling or tower work; 0 (the default) = no limit beyond what the
     * model's context holds. Negative is MMRT_ERR_CONFIG. INI: [model] max_image_tokens. */
    int64_t max_image_tokens;
    /* Images over the budget: refused (the default) or downscaled. INI: [model]
     * oversize_images = refuse | downscale. */
    enum mmrt_oversize_images oversize_images;
    /* Positions the paged KV cache of the language device holds, all sequences together,
     * reserved from its pool at load; 0 (the default) = the model's context (with an explicit
     * pool_mb, at most half the pool; pool_mb = auto makes room for it). A request whose prompt and max_tokens need more fails with MMRT_ERR_LIMIT.
     * INI: [model] max_kv_tokens. */
    int64_t max_kv_tokens;
    /* Positions per KV page, a power of two up to 4096; 0 = 16. INI: [model] kv_page_tokens. */
    int64_t kv_page_tokens;
    /* The generation engine (docs/ENGINE.md); 0 = the default for each. INI: [scheduler].
     * max_batch: sequences running at once, 1 … 32 (default 16). prefill_chunk: prompt
     * tokens per prefill chunk (default 512). step_tokens: token rows one engine step runs
     * (default prefill_chunk + max_batch). */
    int max_batch;
    int64_t prefill_chunk;
    int64_t step_tokens;
    /* What the KV cache stores: F32 (the default, exact), F16 (half the store's memory and
     * of the bytes a decode step reads; keys and values rounded to nearest even) or FP8 E4M3
     * (a quarter; rounded to nearest even with 3 mantissa bits, magnitudes beyond 448
     * clipped to ±448 — its accuracy is measured in docs/QUANTIZATION.md) or INT8 (a
     * quarter plus one f32 scale per token and KV head: symmetric codes, scaled to each
     * head's largest magnitude, so nothing is clipped). INI: [model] kv_dtype = f32 | f16 |
     * fp8 | int8. */
    enum mmrt_kv_dtype kv_dtype;
    /* ---- appended after the first layout ---- */
    /* The vision-feature cache (docs/CONFIG.md "Cache"): an image whose bytes were encoded
     * before by this runtime skips decoding, preprocessing and the tower; its features are
     * the bits the first encode gave (per image, so a request may hit on some images and
     * miss on others). Least recently used images go first when either bound is reached.
     * vision_cache_entries: images held, 1 … 16777216; 0 = the default (2048); negative =
     * off (INI: [cache] vision_entries = N, 0 = off). vision_cache_mb: MiB of f32 features
     * held, 1 … 16777216; 0 = the default (1024); negative is MMRT_ERR_CONFIG (INI: [cache]
     * vision_mb). Not used by requests with oversize_images = downscale and more than one
     * image (each image's size then depends on the others). Figures: mmrt_stats. */
    int64_t vision_cache_entries;
    int64_t vision_cache_mb;
    /* Prefix reuse (docs/ENGINE.md "Prefix reuse"): the K/V of a prompt's leading chunks
     * (token ids, image features and positions alike) stay in the KV store after their
     * request, so a request that starts the same way — the same prompt again, the next turn
     * of a chat with the same image — shares them instead of prefilling them; the logits are
     * bit-identical either way. Cached prefixes give their pages back whenever a request
     * needs them. 0 (the default) or positive = on, negative = off. INI: [cache] prefix =
     * on | off. Figures: mmrt_stats prefix_cache_hits, prefix_cache_reused_tokens. */
    int prefix_cache;
    /* Matmul weights as stored or quantized at load. INI: [model] weights = checkpoint |
     * int8 | int4 | int4-g64 | int4-g32. */
    enum mmrt_weight_format weights;
    /* EXIF orientation of input images (docs/CONFIG.md "Images"): MMRT_EXIF_IGNORE (0, the
     * default: what transformers' processors see, so its outputs are reproduced) or
     * MMRT_EXIF_APPLY (a photo stored sideways is turned upright before preprocessing). A
     * malformed EXIF block never fails a request: it reads as "no orientation". Any other
     * value is MMRT_ERR_CONFIG. INI: [model] exif_orientation = ignore | apply. */
    enum mmrt_exif_orientation exif_orientation;
    /* Requests whose vision stages run together (docs/ENGINE.md "The vision stage"): the
     * runtime's worker takes up to this many submitted requests waiting for their vision
     * stage at once, and a model that can (LLaVA-1.5) runs their images through one pass of
     * the tower; each request still gets the features it would get alone. 1 … 32; 0 = the
     * default (1: docs/ENGINE.md says why). INI: [scheduler] vision_batch. Figures:
     * mmrt_stats vision_batches. */
    int vision_batch;
    /* Image-token KV compression (docs/ENGINE.md "Image-token KV compression"): after a
     * request's prefill, every layer and KV head keeps this fraction of its image tokens'
     * keys and values (text tokens are always kept), chosen by image_kv_policy; the pages
     * freed return to the store. 0 < keep ≤ 1; 0 = the default, 1 = off. Anything else, or
     * a model whose image tokens cannot be identified, is MMRT_ERR_CONFIG.
     * INI: [model] image_kv_keep = R, image_kv_policy = key_norm_high | key_norm_low |
     * random | pool2x2. Figures: mmrt_stats image_kv_dropped_tokens. */
    double image_kv_keep;
    enum mmrt_image_kv_policy image_kv_policy;
    /* The chat template (enum mmrt_chat_template; docs/CONFIG.md "Chat template"): AUTO
     * (0, the default) or one named, for a checkpoint whose template file is missing or not
     * one mmrt recognises. Model types with one template of their own (Qwen2-VL) or none
     * (Fuyu) take only AUTO; anything else is MMRT_ERR_CONFIG. INI: [model] chat_template =
     * auto | llava | mistral | chatml | llama3. */
    enum mmrt_chat_template chat_template;
    /* Speculative decoding with drafts from the sequence itself (docs/ENGINE.md "Drafts"):
     * each decode step guesses up to draft_tokens next tokens of a sequence from the place
     * its last tokens came before (in its prompt or its answer) and checks them in the same
     * forward, one decode row each; the sequence takes every guess its sampler would have
     * picked anyway, so its tokens and logits are the bits it gives without drafts. It pays
     * where a row more costs little (a decode step bound by reading the weights: one
     * sequence, F16 weights on a CPU; docs/BENCHMARKS.md) and the answer repeats its input.
     * draft_tokens: 0 … 31, 0 (the default) = off. draft_rows: the rows a decode step may
     * reach with drafts, 2 … 32; 0 = the tokens drafted a step + 1. A request's prediction
     * (mmrt_request.prediction) drafts draft_tokens tokens a step, 3 when it is 0. INI:
     * [scheduler] draft_tokens, draft_rows. Figures: mmrt_stats draft_tokens,
     * draft_accepted. */
    int draft_tokens;
    int draft_rows;
};

struct mmrt_runtime;

/* Creates a runtime. On failure returns the status, writes the detail into err (which may
 * be NULL) and leaves *out untouched. Statuses the CLI treats as configuration errors
 * (exit status 2): MMRT_ERR_CONFIG, MMRT_ERR_PLUGIN, MMRT_ERR_NO_DEVICE, MMRT_ERR_NOT_FOUND,
 * MMRT_ERR_UNSUPPORTED (a model type, or an operator a stage needs, that is not available),
 * MMRT_ERR_DEVICE (a device that cannot be brought up, e.g. kernels that do not build). */
MMRT_API mmrt_status mmrt_create(const struct mmrt_config *config, struct mmrt_runtime **out,
                                 char *err, size_t err_size);

/* Same from a deploy.ini file (format: docs/CONFIG.md). Errors in the file are reported as
 * "FILE:LINE: message". A file that cannot be read as a configuration (missing:
 * MMRT_ERR_NOT_FOUND; a directory or device, a line or section count over its limit:
 * MMRT_ERR_CONFIG) and a [model] path that does not exist or is not a directory with a
 * config.json (MMRT_ERR_CONFIG, at the path's line) are configuration errors. */
MMRT_API mmrt_status mmrt_create_from_file(const char *ini_path, struct mmrt_runtime **out,
                                           char *err, size_t err_size);

/* Reads ini_path as mmrt_create_from_file does (the same syntax and every check of the
 * sections the runtime uses, errors as "FILE:LINE: message") and calls fn once per key of
 * the application section [section] (today: "server"), in file order. The runtime does not
 * interpret those keys: fn checks them and returns false to stop, keeping its own message;
 * MMRT_ERR_CONFIG is then returned and err is left as it was. A missing section calls fn
 * never and is MMRT_OK. Relative paths in values are the caller's to resolve (against the
 * folder of ini_path, as [model] path is). */
typedef bool (*mmrt_conf_key_fn)(void *user, const char *key, const char *value, int line);
MMRT_API mmrt_status mmrt_conf_read_section(const char *ini_path, const char *section,
                                            mmrt_conf_key_fn fn, void *user, char *err,
                                            size_t err_size);

/* Releases devices, pools, weights and plugin references; stops the worker thread. Jobs not
 * yet waited for are cancelled and freed (their handles become invalid). NULL is a no-op. */
MMRT_API void mmrt_destroy(struct mmrt_runtime *rt);

/* Detail of the last failure on rt ("" when none). Valid until the next call on rt. */
MMRT_API const char *mmrt_last_error(const struct mmrt_runtime *rt);

/* ----------------------------------------------------------------------------------------
 * Devices and their memory.
 */
struct mmrt_device_desc {
    char name[32];         /* configured name ("cpu0"); "" when listing without a config */
    char plugin[33];       /* plugin name */
    int index;             /* index within the plugin */
    char device_name[128]; /* what the driver calls it */
    char kind[16];         /* "cpu", "gpu", "accelerator" */
    uint64_t total_bytes;  /* device memory */
    uint64_t free_bytes;   /* as the driver reports it now */
    uint64_t pool_bytes;   /* pool reserved by this runtime (0 when listing) */
};

MMRT_API int mmrt_device_count(const struct mmrt_runtime *rt);
MMRT_API mmrt_status mmrt_device_describe(struct mmrt_runtime *rt, int i,
                                          struct mmrt_device_desc *out);
/* The version string of device i's plugin (the CPU plugin's names its build type, compiler
 * and flags), owned by the plugin and valid until mmrt_destroy; NULL when i is out of range
 * or the plugin gives none. */
MMRT_API const char *mmrt_device_plugin_version(const struct mmrt_runtime *rt, int i);

#define MMRT_POOL_REPORT_ORDERS 48

/* Pool statistics of one device (DESIGN.md "Memory"). */
struct mmrt_pool_report {
    uint64_t capacity_bytes;     /* reserved on the device */
    uint64_t bytes_in_use;       /* sum of allocated block sizes */
    uint64_t peak_bytes_in_use;  /* high-water mark since creation */
    uint64_t total_free_bytes;
    uint64_t largest_free_block;
    double fragmentation;        /* 1 − largest_free_block / total_free_bytes (0 if none free) */
    uint64_t min_block_bytes;    /* block size of order 0 */
    uint32_t n_orders;           /* entries used in free_blocks_per_order */
    uint64_t free_blocks_per_order[MMRT_POOL_REPORT_ORDERS]; /* order k: min_block << k */
};

MMRT_API mmrt_status mmrt_device_pool_stats(struct mmrt_runtime *rt, int i,
                                            struct mmrt_pool_report *out);

/* Everything one device holds for this runtime (DESIGN.md "Memory"): the weights, outside
 * the pool, and the working pool. Extensible the way plugin.h's structs are: the caller sets
 * struct_size = sizeof(struct mmrt_memory_report) and the runtime fills only that many bytes,
 * so members appended later read as 0 for an older caller and are never written past its
 * struct. */
struct mmrt_memory_report {
    uint32_t struct_size;          /* set by the caller */
    uint32_t reserved0;
    uint64_t weight_bytes;         /* bytes of the weight tensors placed on the device */
    uint64_t weight_mapped_bytes;  /* of those, used in place from the checkpoint's read-only
                                      mapping (zero copy; the page cache holds them once) */
    uint64_t weight_copied_bytes;  /* of those, copied into device weight arenas */
    uint64_t weight_reserved_bytes;/* device memory the weight arenas hold (copies + padding) */
    uint64_t weight_tensors;       /* tensors placed */
    uint64_t pool_capacity_bytes;  /* the working pool reserved on the device */
    uint64_t pool_bytes_in_use;
    uint64_t pool_peak_bytes;      /* high-water mark since creation */
    double pool_fragmentation;     /* 1 − largest free block / free bytes */
    uint64_t kv_page_tokens;       /* positions per KV page; 0 when no decoder runs here */
    uint64_t kv_pages_total;       /* pages of the paged KV cache (reserved in the pool) */
    uint64_t kv_pages_used;        /* held by running requests */
    uint64_t kv_bytes;             /* the KV store's bytes, all layers, keys and values */
    /* The pool's two levels (core/pool.h): level 1 keeps slabs of exact-size slots for the
     * sizes each step asks for again, level 2 is the buddy allocator. */
    uint64_t pool_bytes_held;      /* what the workload holds: in use + level 1's free slots */
    uint64_t pool_peak_bytes_held;
    uint64_t level1_hits;          /* allocations served by level 1 without level 2 */
    uint64_t level1_misses;
    uint64_t level1_bytes;         /* held by level 1 as slabs */
    uint64_t level1_free_bytes;    /* of those, not in a live slot */
    /* ---- appended after the layout above ---- */
    /* What the KV cache stores K and V in ([model] kv_dtype: "F32", "F16", "F8E4M3", "I8");
     * NULL when no decoder runs on this device. A static string. */
    const char *kv_dtype;
};

MMRT_API mmrt_status mmrt_device_memory(struct mmrt_runtime *rt, int i,
                                        struct mmrt_memory_report *out);

/* What mmrt_list_devices() reports for each plugin file found in the search path. */
struct mmrt_plugin_report {
    const char *name;        /* "cuda" */
    const char *path;        /* file it was loaded from */
    const char *version;     /* plugin's version string; NULL if it was refused */
    int n_devices;           /* 0 when skipped or refused */
    const char *skip_reason; /* why it has no device ("no CUDA device"); NULL otherwise */
    const char *error;       /* why it was refused (ABI, symbol, member); NULL otherwise */
};

/* Called once per plugin with device == NULL, then once per device of that plugin. */
typedef void (*mmrt_device_list_fn)(void *user, const struct mmrt_plugin_report *plugin,
                                    const struct mmrt_device_desc *device);

/* Loads every plugin in the search path (MMRT_PLUGIN_PATH, the executable's directory, the
 * install directory) and reports it and its devices. Refused or device-less plugins are
 * reported, not errors. */
MMRT_API mmrt_status mmrt_list_devices(mmrt_device_list_fn fn, void *user, char *err,
                                       size_t err_size);

/* ----------------------------------------------------------------------------------------
 * Requests.
 */
/* One image of a request: a PNG or JPEG file, or its encoded bytes in memory (what a server
 * received, without a temporary file). Exactly one of path and data is set; data is
 * borrowed for the call (mmrt_submit copies it). */
struct mmrt_image_input {
    const char *path;
    const void *data;
    size_t size;              /* bytes at data */
};

/* One turn of a chat, rendered through the model's own chat template (docs/ENGINE.md). */
struct mmrt_message {
    const char *role;         /* "system", "user" or "assistant" */
    const char *text;         /* UTF-8; may be NULL for an image-only user turn */
    int n_images;             /* the next n_images of mmrt_request.images belong to this turn
                                 (user turns only), placed before its text */
};

/* Structs the caller fills and the runtime reads (mmrt_config, mmrt_request) are extensible
 * the way plugin.h's are: the first member is the struct's size as the caller compiled it, so
 * members appended in later versions read as 0 for an older caller. 0 means the first
 * published layout (this one), so a zero-initialised struct of this version is valid. */
struct mmrt_request {
    uint32_t struct_size;     /* sizeof(struct mmrt_request), or 0 */
    /* A single user turn (the model's template around it), used when n_messages is 0; its
     * images are all of `images`. */
    const char *prompt;
    /* Or a chat: system, user and assistant turns, answered as the next assistant turn. */
    const struct mmrt_message *messages;
    int n_messages;
    /* The request's images, in order (mmrt_model_max_images() at most). */
    const struct mmrt_image_input *images;
    int n_images;
    int max_tokens;           /* ≥ 1, or 0: until an end token or the context (or the KV
                                 store's positions) is full */
    uint64_t seed;            /* sampling seed */
    float temperature;        /* 0 = greedy */
    int top_k;                /* 0 = off */
    float top_p;              /* 1 = off */
    /* ---- appended after the first layout ---- */
    /* Stop strings: generation ends as soon as the answer's text contains one of them; the
     * string and anything after it are not delivered (text that could begin one is held
     * back until it is known not to). Up to MMRT_MAX_STOP strings of 1 … MMRT_MAX_STOP_BYTES
     * bytes of UTF-8 each. */
    const char *const *stop;
    int n_stop;
    /* Penalties on tokens already seen, applied to the logits before temperature, top_k,
     * top_p and greedy choice alike (docs/ENGINE.md "Sampling"). repetition_penalty: every
     * token id of the prompt or the answer so far has a positive logit divided by it and a
     * negative one multiplied (Hugging Face's definition); 0 (the default) or 1 = off, else
     * (0, 100]. presence_penalty and frequency_penalty: subtracted from the logit of every
     * token id the answer holds, once and once per occurrence (OpenAI's definitions);
     * 0 = off, else [−2, 2]. Out of range is MMRT_ERR_INVALID_ARG naming the field. */
    float repetition_penalty;
    float presence_penalty;
    float frequency_penalty;
    /* Log-probabilities of the answer's tokens, delivered to mmrt_job_callbacks.on_logprobs
     * (docs/ENGINE.md "Log-probabilities"): logprobs 0 = off, 1 = each generated token's;
     * top_logprobs 0 … MMRT_MAX_TOP_LOGPROBS: also that many of the most likely tokens at
     * each position (needs logprobs = 1). They are the log-softmax of the logits as the
     * model gave them, before penalties, logit_bias, temperature, top_k and top_p (what vLLM
     * reports by default). */
    int logprobs;
    int top_logprobs;
    /* Added to the logits of the given token ids after the penalties and before the
     * temperature, top_k, top_p and greedy choice (OpenAI's logit_bias): up to
     * MMRT_MAX_LOGIT_BIAS entries, each bias finite in [−100, 100] (−100 all but bans a
     * token, 100 all but forces it), each id in the model's vocabulary; an id listed twice
     * gets both. */
    const struct mmrt_logit_bias *logit_bias;
    int n_logit_bias;
    /* The answer's form (enum mmrt_response_format); out of range is MMRT_ERR_INVALID_ARG. */
    int response_format;
    /* With response_format MMRT_RESPONSE_JSON_SCHEMA: the schema, as JSON text (NUL-ended;
     * copied at submission). A schema mmrt cannot hold an answer to is MMRT_ERR_INVALID_ARG
     * naming the place in it (docs/ENGINE.md "JSON answers"). Ignored otherwise. */
    const char *json_schema;
    /* The answer the caller expects, mostly (OpenAI's predicted outputs): a text the answer
     * is likely to repeat with edits, such as a document being revised. NULL or "" = none.
     * Its tokens are drafted and checked as the answer goes (docs/ENGINE.md "Drafts"): the
     * answer is exactly the one without it, only sooner where it matches. Copied at
     * submission; at most the tokenizer's max_input_bytes (1 MiB by default). */
    const char *prediction;
};

/* What an answer must be. */
enum mmrt_response_format {
    MMRT_RESPONSE_TEXT = 0,        /* any text */
    /* One JSON object (OpenAI's json_object mode; docs/ENGINE.md "JSON answers"): each token
     * is chosen among those that keep the answer a prefix of a JSON object (the others are
     * out of the draw or the greedy choice), and the answer ends, MMRT_FINISH_EOS, when the
     * object closes. max_tokens can still cut it short (MMRT_FINISH_LENGTH). */
    MMRT_RESPONSE_JSON_OBJECT = 1,
    /* A JSON document held to mmrt_request.json_schema, the same way (OpenAI's json_schema
     * mode with strict: true). */
    MMRT_RESPONSE_JSON_SCHEMA = 2,
};

#define MMRT_MAX_STOP 16
#define MMRT_MAX_STOP_BYTES 256
#define MMRT_MAX_TOP_LOGPROBS 20
#define MMRT_MAX_LOGIT_BIAS 1024

/* One entry of mmrt_request.logit_bias. */
struct mmrt_logit_bias {
    int32_t token_id;
    float bias;
};

/* A token and its log-probability (natural logarithm; −INFINITY for a token the model rules
 * out). */
struct mmrt_logprob {
    int32_t token_id;
    float logprob;
    const char *text;         /* the token decoded alone, special tokens included, as vLLM
                                 reports it (UTF-8; U+FFFD for a piece of a character; a
                                 NUL byte, <0x00>'s text, ends it as on_token's) */
};

/* What on_logprobs receives for each generated token; valid only during the call. Written
 * by the runtime: struct_size is the size it was built with, so a caller built against a
 * later mmrt.h reads members past it as absent. */
struct mmrt_token_logprobs {
    uint32_t struct_size;
    struct mmrt_logprob token;        /* the token generated */
    int n_top;                        /* the request's top_logprobs */
    const struct mmrt_logprob *top;   /* the n_top most likely tokens, most likely first
                                         (ties: smaller id first) */
};

typedef void (*mmrt_logprobs_fn)(void *user, const struct mmrt_token_logprobs *lp);

/* Receives each generated token as soon as it is produced: its id and the text it completes
 * (only whole UTF-8 characters; may be ""). At the end, text held back for an incomplete
 * character is flushed with token_id −1. Return false to stop generation early. */
typedef bool (*mmrt_token_fn)(void *user, int32_t token_id, const char *text);

/* Why a request's generation ended. */
enum mmrt_finish_reason {
    MMRT_FINISH_NONE = 0,        /* it did not finish (failed or cancelled) */
    MMRT_FINISH_EOS = 1,         /* the model produced an end-of-answer token */
    MMRT_FINISH_STOP_STRING = 2, /* the text reached one of the request's stop strings */
    MMRT_FINISH_LENGTH = 3,      /* max_tokens, or the end of the context */
    MMRT_FINISH_CALLER = 4,      /* the token callback returned false */
};

/* Written by the runtime: the caller sets struct_size (or zeroes the struct: 0 = this first
 * layout) and the runtime writes that many bytes, never past the caller's struct. Arrays of
 * results (mmrt_run_batch) are strided by struct_size of their first element. */
struct mmrt_result {
    uint32_t struct_size;     /* sizeof(struct mmrt_result), or 0 */
    mmrt_status status;       /* of this request (mmrt_run_batch reports each one here) */
    char error[512];          /* detail when status != MMRT_OK, cut at 511 bytes (the whole
                                 of it is `message`, in the later layout) */
    int n_prompt_tokens;
    int n_tokens;             /* generated */
    double preprocess_ms, vision_ms, prefill_ms, decode_ms;
    double decode_tokens_per_s;
    /* When each stage ran, in ms since the start of the mmrt_run / mmrt_run_batch call. */
    double vision_start_ms, vision_end_ms, language_start_ms, language_end_ms;
    /* 1 when the decode steps ran as one captured device graph (CUDA; the CPU plugin with
     * graph = 1), 0 when they ran op by op. */
    int decode_graph;
    /* ---- appended after the first layout ---- */
    enum mmrt_finish_reason finish_reason; /* why generation ended (MMRT_OK results) */
    /* Time the request waited rather than worked: before its vision stage began, and between
     * the vision stage and its first prefill chunk (waiting for a batch slot or KV pages). */
    double queue_ms;
    /* The whole detail when status != MMRT_OK ("" otherwise), as mmrt_last_error() would
     * give it; `error` above holds its first 511 bytes for callers of the first layout. */
    char message[MMRT_MESSAGE_MAX];
    /* Tokens of the request's prediction checked against the answer: taken (each a decode
     * step saved), and checked but not taken. */
    int prediction_accepted;
    int prediction_rejected;
};

/* The sampling settings the checkpoint's generation_config.json sets, for a server to use
 * when a request does not say (docs/ENGINE.md "Sampling"): has_X is 1 when the file sets X.
 * do_sample false gives temperature 0 (greedy, as transformers' generate()); do_sample true
 * gives transformers' defaults for what it leaves out (temperature 1, top_k 50, top_p 1);
 * without do_sample only the keys present count (as vLLM reads the file). A file whose
 * values are out of range or of the wrong type fails the load, naming the file and key. */
struct mmrt_generation_defaults {
    uint32_t struct_size;  /* sizeof(struct mmrt_generation_defaults), or 0 (this layout) */
    int has_temperature;
    float temperature;
    int has_top_k;
    int top_k;
    int has_top_p;
    float top_p;
    int has_repetition_penalty;
    float repetition_penalty;
};

/* Fills *out (never past out->struct_size bytes) for rt's checkpoint; all has_X 0 without a
 * checkpoint or its generation_config.json. */
MMRT_API void mmrt_generation_defaults(const struct mmrt_runtime *rt,
                                       struct mmrt_generation_defaults *out);

/* The request the configuration's [run] section describes (defaults for missing keys:
 * no image, empty prompt, max_tokens 64, seed 0, greedy, no penalties). Strings and the
 * image are borrowed from rt. As with a result, the caller sets out->struct_size (0 = the
 * first layout) and that many bytes are written, never more; out->struct_size stays. */
MMRT_API void mmrt_run_defaults(const struct mmrt_runtime *rt, struct mmrt_request *out);

/* The configured checkpoint folder as the configuration gave it (an INI's relative path
 * joined to the INI's folder), or NULL when the runtime has no model. */
MMRT_API const char *mmrt_model_path(const struct mmrt_runtime *rt);

/* Name of the configured model type ("llava"), or NULL when the runtime has no model. */
MMRT_API const char *mmrt_model_type(const struct mmrt_runtime *rt);

/* How many images one request may carry for the configured model (1 for LLaVA, NeXT and
 * Fuyu; more for Qwen2-VL); 0 when the runtime has no model. */
MMRT_API int mmrt_model_max_images(const struct mmrt_runtime *rt);

/* Runs one request on the configured model. Statuses: MMRT_ERR_CONFIG when no model is
 * configured, MMRT_ERR_INVALID_ARG for a bad request (the message names the field or the
 * message index: more images than the model takes, an image that is neither a path nor
 * bytes, a role the template does not know, an image in a non-user turn, a chat that ends
 * with an assistant turn, prompt and messages both given), MMRT_ERR_LIMIT for
 * images over max_image_tokens (unless downscaled) or the model's context, others from
 * loading the image or running the model. */
MMRT_API mmrt_status mmrt_run(struct mmrt_runtime *rt, const struct mmrt_request *req,
                              mmrt_token_fn on_token, void *user, struct mmrt_result *result);

/* Like mmrt_token_fn, for mmrt_run_batch: `request` is the index of the request. */
typedef bool (*mmrt_batch_token_fn)(void *user, int request, int32_t token_id, const char *text);

/* Runs n requests in order. When the vision and language stages are on different devices
 * the two stages overlap: the vision stage of request i+1 runs on its device while request
 * i decodes on the other (results[i] records when each stage ran). A request that fails is
 * reported in results[i].status / .error and does not stop the others. Returns MMRT_OK when
 * every request succeeded, else the first failure's status. */
MMRT_API mmrt_status mmrt_run_batch(struct mmrt_runtime *rt, const struct mmrt_request *reqs,
                                    int n, mmrt_batch_token_fn on_token, void *user,
                                    struct mmrt_result *results);

/* ----------------------------------------------------------------------------------------
 * Asynchronous requests: queued with mmrt_submit(), they join the running batch between two
 * decode steps (docs/ENGINE.md). The runtime starts one worker thread on the first
 * submission; it runs every submitted request's stages and calls their token callbacks (so a
 * callback must not block for long: it holds up every request of the step). The request and
 * its strings are copied: they need not outlive the call.
 */
struct mmrt_job;

/* Queues req; *out is the handle to wait for (every job must be waited for, exactly once).
 * A refusal's detail goes into err (may be NULL), not into mmrt_last_error, so threads that
 * submit at once do not share it.
 * A request the runtime refuses outright (no model, a malformed request as mmrt_run
 * describes, no memory for the copy) is an error here; everything else — an image that does
 * not decode, a prompt over the context — is the job's result. */
MMRT_API mmrt_status mmrt_submit(struct mmrt_runtime *rt, const struct mmrt_request *req,
                                 mmrt_token_fn on_token, void *user, struct mmrt_job **out,
                                 char *err, size_t err_size);

/* mmrt_submit with more callbacks. Extensible like mmrt_request (struct_size first; 0 =
 * the first layout, up to user). Every callback runs on the worker thread and may be
 * NULL. */
struct mmrt_job_callbacks {
    uint32_t struct_size;
    mmrt_token_fn on_token;
    /* Once, when the request has passed its vision stage and every check the engine makes
     * (its prompt and max_tokens fit the context and the KV store): from here on it waits
     * only for a batch slot and pages, and fails only for a device error or a cancel. Not
     * called for a job that ends before that. */
    void (*on_accepted)(void *user, int n_prompt_tokens);
    /* Once, last, for every job however it ends (mmrt_destroy's cancellations included):
     * the result is complete and mmrt_wait returns without waiting for the engine. The job
     * must not be freed from inside the callback (call mmrt_wait on another thread). */
    void (*on_done)(void *user);
    void *user;
    /* ---- appended after the first layout ---- */
    /* For each generated token of a request with logprobs = 1, just before on_token gets
     * the same token (an end token included). */
    mmrt_logprobs_fn on_logprobs;
};

MMRT_API mmrt_status mmrt_submit_with(struct mmrt_runtime *rt, const struct mmrt_request *req,
                                      const struct mmrt_job_callbacks *cb,
                                      struct mmrt_job **out, char *err, size_t err_size);

/* Bytes mmrt_job_image_key writes: 64 hex digits and a NUL. */
#define MMRT_IMAGE_KEY_SIZE 65

/* The vision-cache key of image i of a submitted job, as 64 lowercase hex digits: SHA-256 of
 * the runtime's vision settings (model, its preprocessing configuration, max_image_tokens,
 * oversize_images, the vision device's plugin, index and options, the mmrt version) and the
 * image's encoded bytes. Runtimes with the same settings give the same image the same key, so
 * a router can send the next turn of a conversation to the replica that holds its images.
 * An in-memory image's key is computed by mmrt_submit (on the submitting thread); a path
 * image's when the job's vision stage reads the file, so it is "" until then (it is set when
 * on_accepted runs). "" also when the cache is off or does not serve the request
 * (oversize_images = downscale with several images), or when the file could not be read.
 * Safe from any thread, the job's callbacks included, until the job is waited for.
 * Statuses: MMRT_ERR_INVALID_ARG for a NULL job or out, i outside 0 … n_images − 1, or a
 * size below MMRT_IMAGE_KEY_SIZE (out is then "" when size ≥ 1). */
MMRT_API mmrt_status mmrt_job_image_key(const struct mmrt_job *job, int i, char *out,
                                        size_t size);

/* Asks the job to stop: it ends with MMRT_ERR_CANCELLED before its next token (tokens already
 * delivered stay delivered) and its KV pages return at once. Safe from any thread, the job's
 * own callback included, until the job has been waited for. */
MMRT_API void mmrt_cancel(struct mmrt_job *job);

/* Blocks until the job has finished, copies its result into *result (may be NULL), frees the
 * job and returns result->status. */
MMRT_API mmrt_status mmrt_wait(struct mmrt_job *job, struct mmrt_result *result);

/* ----------------------------------------------------------------------------------------
 * Serving statistics, for metrics and health probes. Safe from any thread at any time: while
 * the worker runs, the figures are those it published after its last step. Extensible like
 * mmrt_memory_report: the caller sets struct_size and only that many bytes are written.
 */
struct mmrt_runtime_stats {
    uint32_t struct_size;
    uint32_t reserved0;
    uint64_t requests_waiting;   /* submitted, not yet running: before or in their vision
                                    stage, or waiting for a batch slot or pages */
    uint64_t requests_running;   /* in the engine, prefilling or decoding */
    uint64_t engine_steps;
    uint64_t preemptions;
    /* Milliseconds since the worker last completed a step or found nothing to do: what a
     * liveness probe reads (a stuck device shows as a growing figure). */
    double ms_since_progress;
    uint64_t kv_pages_used, kv_pages_total; /* the language device's paged KV store */
    uint64_t kv_page_tokens;
    uint64_t vision_cache_entries, vision_cache_bytes; /* held now */
    uint64_t vision_cache_capacity_entries, vision_cache_capacity_bytes; /* 0 when off */
    uint64_t vision_cache_queries, vision_cache_hits, vision_cache_evictions;
    /* Prefix reuse (mmrt_config.prefix_cache): requests that shared a cached prompt
     * prefix, and the prompt positions they did not prefill because of it. */
    uint64_t prefix_cache_hits, prefix_cache_reused_tokens;
    /* The worker's vision stages ([scheduler] vision_batch): how many ran, and the submitted
     * requests they encoded; their ratio is the mean vision batch. */
    uint64_t vision_batches, vision_batch_requests;
    /* Image-token KV compression (mmrt_config.image_kv_keep): sequences compressed, and
     * the image positions whose K/V they gave up (per sequence, the same in every layer). */
    uint64_t image_kv_compressions, image_kv_dropped_tokens;
    /* Of prefix_cache_hits, the requests whose whole prompt was cached (the same prompt
     * again: another of n choices, a regenerated answer): nothing prefilled, the first token
     * from the kept logits. */
    uint64_t prefix_cache_prompt_hits;
    /* Speculative decoding (mmrt_config.draft_tokens): tokens drafted and checked, and those
     * the sequences took (each a decode step saved). */
    uint64_t draft_tokens, draft_accepted;
    /* JSON answers' schemas (docs/ENGINE.md "JSON answers"): lookups in the runtime's cache
     * of compiled schemas (the server's check, the runtime's, one per answering sequence),
     * and the texts compiled because the cache did not hold them. */
    uint64_t json_schema_lookups, json_schema_compiles;
};

MMRT_API mmrt_status mmrt_stats(struct mmrt_runtime *rt, struct mmrt_runtime_stats *out);

/* How the configured placement compares with the CPU reference (mmrt_check). */
struct mmrt_check_report {
    double features_max_abs, features_max_rel; /* vision stage: image embeddings */
    double logits_max_abs, logits_max_rel;     /* language stage: every compared step */
    int n_steps;                               /* steps compared */
    int first_divergence;                      /* first step whose token differs; −1: none */
    int n_tokens, n_tokens_reference;
    double tolerance;                          /* relative, applied to both stages */
    bool pass;                                 /* within tolerance and no divergence */
};

/* Runs `req` on the configured placement and again with both stages on a fresh CPU
 * reference device, and compares the image embeddings and the logits of every step (up to
 * and including the first step whose chosen token differs). Relative error is
 * max|x − ref| / max|ref|. */
MMRT_API mmrt_status mmrt_check(struct mmrt_runtime *rt, const struct mmrt_request *req,
                                struct mmrt_check_report *out);

#ifdef __cplusplus
}
#endif

#endif /* MMRT_MMRT_H */
