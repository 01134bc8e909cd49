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
 *             scale, config.json, tokenizer.json (+ tokenizer_config.json),
 *             processor_config.json and synthetic PNG images, cached per shape/layers/dtype
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

/* One published model shape. Fields a family does not use are 0. */
struct bench_shape {
    const char *name;        /* --shape value */
    const char *hf_id;       /* where the dimensions come from */
    enum bench_family family;
    const char *model_type;  /* config.json model_type */
    bool runnable;           /* this build implements the model type */
    /* vision tower */
    int64_t v_hidden, v_inter, v_layers, v_heads, v_patch, v_image, v_channels;
    int64_t v_temporal_patch, v_merge;   /* Qwen2-VL */
    const char *v_act;
    double v_ln_eps;
    /* projector (LLaVA: v_hidden → t_hidden → t_hidden) */
    const char *proj_act;
    /* language model */
    int64_t t_hidden, t_inter, t_layers, t_heads, t_kv_heads, t_head_dim, t_vocab, t_max_pos;
    double t_rope_theta, t_rms_eps;
    int64_t tok_vocab;       /* entries of the synthetic tokenizer's BPE vocabulary */
    int64_t image_token_id;  /* also pad = image_token_id + 1 */
};

/* The shape called `name`, or NULL. */
const struct bench_shape *bench_shape_find(const char *name);
/* "llava-1.5-7b|llava-1.5-13b|…" for usage lines. */
const char *bench_shape_names(void);

/* The work one request does on a shape cut to `layers` (0 = all), for limits. */
struct bench_work {
    int64_t v_layers_run;      /* CLIP layers run up to the feature layer */
    int64_t n_image_tokens;    /* embeddings per image */
    double vision_flop;        /* patch embed + tower + projector */
    double prefill_flop;       /* prompt of n_prompt tokens, incl. causal attention */
    double decode_bytes;       /* mean bytes read per decode step (weights + KV) */
    double decode_weight_bytes;/* of which weights */
    uint64_t vision_weight_bytes, language_weight_bytes;
};

/* n_prompt: prompt length in tokens (image tokens included); n_gen: tokens generated;
 * w_bytes: bytes per weight element; kv_bytes: bytes per KV element (F32 cache: 4). */
void bench_work_compute(const struct bench_shape *s, int64_t layers, int64_t n_prompt,
                        int64_t n_gen, int w_bytes, int kv_bytes, struct bench_work *out);

/* ---- synthetic checkpoint (synth.c) ------------------------------------------------------ */

enum bench_dtype { BENCH_F32, BENCH_F16, BENCH_BF16 };

/* Makes sure `dir` (created if needed, with parents) holds the synthetic checkpoint of shape
 * s cut to `layers` (0 = all) in dtype dt; writes it once (into a temporary folder renamed
 * into place, so an interrupted run never leaves a half checkpoint) and reuses it after.
 * `progress` (may be NULL) receives one line per step. Returns 0, or −1 with a message in
 * err. */
int bench_synth_checkpoint(const char *dir, const struct bench_shape *s, int64_t layers,
                           enum bench_dtype dt, void (*progress)(const char *line),
                           char *err, size_t err_size);

/* Writes a size × size synthetic RGB PNG (a smooth gradient plus seeded noise; `seed` makes
 * each image different, so no cache keyed on image bytes can serve a later request) at path,
 * unless it exists. Returns 0 or −1 with a message. */
int bench_synth_image(const char *path, int size, uint32_t seed, char *err, size_t err_size);

/* A prompt that the synthetic tokenizer turns into exactly n tokens ("a a a …": one "▁a" per
 * word). malloc'ed; NULL when out of memory. */
char *bench_synth_prompt(int n);

/* mkdir -p. Returns 0 or −1 (errno set). */
int bench_mkdirs(const char *path);

/* ---- limit probes (probe.c) -------------------------------------------------------------- */

struct bench_limits {
    double read_gbs;       /* best streaming read over all threads, GB/s (1e9 bytes) */
    double f32_gflops;     /* best f32 FMA rate over all threads, GFLOP/s (FMA = 2 flop) */
    double bf16_gflops;    /* best bf16 dot-product rate (vdpbf16ps), 0 when unsupported */
    const char *isa;       /* "avx512", "avx2" or "scalar": the loops the probes used */
    /* The lowest of the per-call results (each call's own best), to show how much the
     * machine's capacity moved during a run; 0 until the first call. */
    double read_gbs_low, f32_gflops_low, bf16_gflops_low;
    int n_calls;
};

/* Runs the probes on n_threads threads: the read probe over a buffer of buffer_mb MiB
 * (passes times, best pass), the FMA and bf16 loops for a few short rounds each (best round).
 * Folds the results into *lim: the maxima into read_gbs, f32_gflops, bf16_gflops (so calling
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

#endif
