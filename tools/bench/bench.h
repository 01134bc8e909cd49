/*
 * tools/bench/bench.h — what the files of mmrt-bench share.
 *
 * mmrt-bench runs a vision-language model of a real published shape on synthetic weights and
 * prints each stage's time next to the limit this machine sets for it, measured in the same
 * run (DESIGN.md, "Performance"):
 *
 *   decode (per token)   bytes of weights + KV cache read per token / streaming read bandwidth
 *   vision encoder       its FLOPs / vector-unit peak for the compute dtype
 *   prefill              its FLOPs / the same peak
 *
 * Files:
 *   main.c    options, the run (mmrt.h embedding API), medians, the report (text or JSON)
 *   shapes.c  the shape table (exact published dimensions) and the work each stage does
 *   synth.c   the synthetic checkpoint: model.safetensors with random weights of realistic
 *             scale, config.json, tokenizer.json (+ tokenizer_config.json), the processor's
 *             config (and Qwen2-VL's chat template) and synthetic PNG images, cached per
 *             shape/layers/dtype; one writer per family (LLaVA, Qwen2-VL, Fuyu)
 *   probe.c   the limit probes (read bandwidth, f32 FMA peak, bf16 dot peak) and their
 *             run-time ISA dispatch; probe_avx2.c / probe_avx512.c hold the ISA loops
 */
#ifndef MMRT_TOOLS_BENCH_H
#define MMRT_TOOLS_BENCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ---- shapes (shapes.c) ------------------------------------------------------------------ */

enum bench_family { BENCH_LLAVA, BENCH_QWEN2VL, BENCH_FUYU };

/* One published model shape. Fields a family does not use are 0. Whether this build can run
 * it is the runtime's registry's answer for model_type (main.c asks it), not a field here. */
struct bench_shape {
    const char *name;        /* --shape value */
    const char *hf_id;       /* where the dimensions come from */
    enum bench_family family;
    const char *model_type;  /* config.json model_type */
    /* vision tower (Fuyu: v_hidden is the patch projection's output, the LM width) */
    int64_t v_hidden, v_inter, v_layers, v_heads, v_patch, v_channels;
    int64_t v_image;         /* default --image-size: LLaVA's config image_size; Qwen2-VL and
                              * Fuyu (no fixed size) a square the processor takes unresized */
    int64_t v_temporal_patch, v_merge;   /* Qwen2-VL */
    int64_t v_min_pixels, v_max_pixels;  /* Qwen2-VL smart resize bounds */
    int64_t v_target_h, v_target_w;      /* Fuyu processor target size (resize to fit) */
    int64_t v_image_cfg;                 /* Fuyu config.json image_size (unused by the model) */
    const char *v_act;
    double v_ln_eps;
    /* projector (LLaVA: v_hidden → t_hidden → t_hidden) */
    const char *proj_act;
    /* language model */
    int64_t t_hidden, t_inter, t_layers, t_heads, t_kv_heads, t_head_dim, t_vocab, t_max_pos;
    double t_rope_theta;
    double t_rms_eps;        /* RMSNorm eps (LLaMA, Qwen2); LayerNorm eps for Persimmon */
    double t_partial_rotary; /* Persimmon: rotary share of each head */
    int64_t t_mrope[3];      /* Qwen2-VL M-RoPE section (temporal, height, width) */
    int64_t tok_vocab;       /* entries of the synthetic tokenizer's model vocabulary */
    /* LLaVA: <image> (pad = +1). Qwen2-VL: <|image_pad|>, the specials around it at their
     * published offsets from tok_vocab (<|endoftext|> = tok_vocab … <|video_pad|> = +13).
     * Fuyu: |SPEAKER| (|ENDOFTEXT| = +2, |NEWLINE| = +8, as in adept/fuyu-8b). */
    int64_t image_token_id;
};

/* The shape called `name`, or NULL. */
const struct bench_shape *bench_shape_find(const char *name);
/* "llava-1.5-7b|llava-1.5-13b|…" for usage lines. */
const char *bench_shape_names(void);
/* Vision and text depth of s cut to `layers` (0 = all). */
void bench_shape_depth(const struct bench_shape *s, int64_t layers, int64_t *v_layers,
                       int64_t *t_layers);

/* Where the model's processor puts a size × size image: the patch grid the vision stage
 * sees (rows × cols patches) and the image's tokens in the prompt.
 *   LLaVA     resized and cropped to v_image: (v_image/patch)², one token per patch
 *   Qwen2-VL  smart resize to multiples of patch·merge within [min, max] pixels (Python's
 *             round-half-even), one frame repeated over the temporal patch: rows·cols
 *             patches, rows·cols/merge² tokens
 *   Fuyu      resized to fit the target only when larger (int(H·s), int(W·s)), padded to
 *             whole patches: rows·cols patches, rows·(cols + 1) tokens (|NEWLINE| per row) */
struct bench_image_plan {
    int64_t height, width;    /* after the processor's resize (before padding) */
    int64_t rows, cols;       /* patch grid */
    int64_t n_patches;        /* rows·cols */
    int64_t n_image_tokens;   /* tokens of the image span in the prompt */
};
void bench_image_plan(const struct bench_shape *s, int64_t image_size,
                      struct bench_image_plan *out);

/* The work one request does on a shape cut to `layers` (0 = all), for limits. */
struct bench_work {
    int64_t v_layers_run;      /* vision blocks run (LLaVA: up to the feature layer) */
    int64_t n_patches;         /* patches the vision stage embeds */
    int64_t n_image_tokens;    /* prompt tokens of one image */
    double vision_flop;        /* patch embed + tower + projector / merger */
    double prefill_flop;       /* prompt of n_prompt tokens, incl. causal attention */
    double decode_bytes;       /* mean bytes read per decode step (weights + KV) */
    double decode_weight_bytes;/* of which weights */
    uint64_t vision_weight_bytes, language_weight_bytes;
};

/* image_size: the square input's side; n_prompt: prompt length in tokens (image tokens
 * included); n_gen: tokens generated; w_bytes: bytes per checkpoint weight element (the
 * embedding); mm_bytes: bytes per matmul weight element as the device holds it (w_bytes, or
 * 1 for INT8 codes: their row scales add 4/K, under 0.1 %; for INT4 in groups of g, 0.5 for
 * the packed codes + 8/g for the group's F32 scale and zero point, e.g. 0.5625 for g = 128);
 * kv_bytes: bytes per KV element (F32 cache: 4; INT8: 1 + 4 / head_dim for its row scales). */
void bench_work_compute(const struct bench_shape *s, int64_t layers, int64_t image_size,
                        int64_t n_prompt, int64_t n_gen, int w_bytes, double mm_bytes,
                        double kv_bytes, struct bench_work *out);

/* ---- synthetic checkpoint (synth.c) ------------------------------------------------------ */

enum bench_dtype { BENCH_F32, BENCH_F16, BENCH_BF16 };

/* How a synthetic tensor is filled: uniform with std 0.02, 1 ± 0.02 (norm weights), ± 0.02
 * (biases). */
enum bench_init { BENCH_INIT_LINEAR, BENCH_INIT_ONES, BENCH_INIT_BIAS };

#define BENCH_MAX_DIMS 5

/* One tensor of the synthetic checkpoint, in the hub's key spelling. */
struct bench_tensor {
    char name[128];
    int n_dims;
    int64_t shape[BENCH_MAX_DIMS];
    enum bench_init init;
    bool vision;             /* loaded by the vision stage (tower, projector, patch proj) */
};

/* Every tensor of shape s cut to `layers` (0 = all), in the order written: *out malloc'ed
 * (free it), *n its length. Returns 0 or −1 (out of memory). */
int bench_synth_tensors(const struct bench_shape *s, int64_t layers, struct bench_tensor **out,
                        int *n);
int64_t bench_tensor_numel(const struct bench_tensor *t);

/* config.json of shape s cut to `layers` (0 = all) in dtype dt, as a new JSON object
 * (json_t *, returned as void * so this header needs no jansson); NULL when out of memory. */
void *bench_synth_config(const struct bench_shape *s, int64_t layers, enum bench_dtype dt);

/* Makes sure `dir` (created if needed, with parents) holds the synthetic checkpoint of shape
 * s cut to `layers` (0 = all) in dtype dt; writes it once (into a temporary folder renamed
 * into place, so an interrupted run never leaves a half checkpoint) and reuses it after.
 * `progress` (may be NULL) receives one line per step. Returns 0, or −1 with a message in
 * err. */
int bench_synth_checkpoint(const char *dir, const struct bench_shape *s, int64_t layers,
                           enum bench_dtype dt, void (*progress)(const char *line),
                           char *err, size_t err_size);

/* True when `dir` already holds a complete checkpoint of shape s (the files the writer
 * leaves; the folder only appears once it is complete). */
bool bench_synth_exists(const char *dir, const struct bench_shape *s);

/* Writes a size × size synthetic RGB PNG (a smooth gradient plus seeded noise; `seed` makes
 * each image different, so no cache keyed on image bytes can serve a later request) at path,
 * unless it exists. Returns 0 or −1 with a message. */
int bench_synth_image(const char *path, int size, uint32_t seed, char *err, size_t err_size);

/* A prompt that the synthetic tokenizers turn into exactly n tokens ("a a a …": one "▁a"
 * (SentencePiece) or "a"/"Ġa" (byte-level BPE) per word). malloc'ed; NULL when out of
 * memory. */
char *bench_synth_prompt(int n);

/* mkdir -p. Returns 0 or −1 (errno set). */
int bench_mkdirs(const char *path);

/* ---- limit probes (probe.c) -------------------------------------------------------------- */

struct bench_limits {
    double read_gbs;       /* best streaming read over all threads, GB/s (1e9 bytes) */
    double f32_gflops;     /* best f32 FMA rate over all threads, GFLOP/s (FMA = 2 flop) */
    double bf16_gflops;    /* best bf16 dot-product rate (vdpbf16ps), 0 when unsupported */
    double amx_gflops;     /* best AMX-BF16 tile rate (TDPBF16PS), 0 when not usable */
    const char *isa;       /* "avx512", "avx2" or "scalar": the loops the probes used */
    char amx_why[128];     /* why amx_gflops is 0 (x86_amx.h's reason) */
    /* Set by the caller: the CPU plugin's `isa` option of the measured device (NULL or
     * "auto": what the CPU has). "avx2" holds the stages to the AVX2 loops' limits, as on a
     * CPU without AVX-512 (and without its bf16 and AMX units, which need it); "portable" to
     * plain C's. */
    const char *max_isa;
    /* The lowest of the per-call results (each call's own best), to show how much the
     * machine's capacity moved during a run; 0 until the first call. */
    double read_gbs_low, f32_gflops_low, bf16_gflops_low, amx_gflops_low;
    int n_calls;
};

/* Runs the probes on n_threads threads: the read probe over a buffer of buffer_mb MiB
 * (passes times, best pass), the FMA, bf16 and AMX loops for a few short rounds each (best
 * round). Folds the results into *lim: the maxima into read_gbs and the *_gflops (so calling
 * it several times in a run keeps the best seen), the minima into the *_low fields. Returns 0,
 * or −1 with a message when the buffer or threads cannot be had. */
int bench_probe(int n_threads, size_t buffer_mb, int passes, struct bench_limits *lim,
                char *err, size_t err_size);

/* ISA loops, called by probe.c only when the CPU has the instructions. Each returns its
 * count of work done: bytes read, or flops. */
uint64_t bench_read_avx512(const void *p, size_t nbytes, int streams, uint64_t *sink);
uint64_t bench_read_avx2(const void *p, size_t nbytes, int streams, uint64_t *sink);
uint64_t bench_fma_avx512(uint64_t iters, float *sink);
uint64_t bench_fma_avx2(uint64_t iters, float *sink);
uint64_t bench_bf16_avx512(uint64_t iters, float *sink);
uint64_t bench_amx_bf16(uint64_t iters, float *sink);

#endif
