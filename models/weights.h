/*
 * models/weights.h — moves a checkpoint's tensors onto devices, by canonical name.
 *
 * Published checkpoints spell the same weight several ways (legacy hub names such as
 * `language_model.model.layers.0…`, newer `model.language_model.layers.0…`; models.md §1.7).
 * The set maps every tensor name to one canonical spelling when it opens the checkpoint, so
 * model code asks for exactly one name:
 *     language_model.X       (the LM body: embed_tokens, layers.N…, norm)
 *     lm_head.weight
 *     vision_tower.X         (CLIP without its `vision_model.` level)
 *     multi_modal_projector.X, image_newline, visual.X, vision_embed_tokens.X
 * Two source names that canonicalise to the same name are refused (a checkpoint holding both
 * layouts is ambiguous).
 *
 * Each load checks the tensor's shape against what config.json implies before any device
 * memory is used, and keeps the checkpoint dtype (F32, F16, BF16) on the device. Loading is
 * two steps: the mmrt_weights_load* calls check a tensor and fill the caller's descriptor's
 * shape, and mmrt_weights_commit places every tensor loaded so far — in place in the
 * checkpoint's read-only mapping where the device adopts host memory (zero copy), otherwise
 * in exact-size weight arenas outside the pool — and fills in their storage (buffer and
 * offset; a reshape of the descriptor made after load is kept). A descriptor
 * is therefore usable only after commit, and must stay where it is until then (commit writes
 * through the pointer given to load): copy it (a tied LM head) only after commit. The set owns
 * every weight arena, so a model frees all its weights with one call.
 */
#ifndef MMRT_MODELS_WEIGHTS_H
#define MMRT_MODELS_WEIGHTS_H

#include <stdbool.h>

#include "device.h"
#include "error.h"
#include "formats/safetensors.h"
#include "ops.h"
#include "model.h"
#include "quant.h"

struct mmrt_weights;

/* Opens the checkpoint directory `dir` (model.safetensors or a sharded index).
 * `bare_model_is_lm`: map a bare `model.X` to `language_model.X` (Qwen2-VL). */
mmrt_status mmrt_weights_open(const char *dir, bool bare_model_is_lm,
                              struct mmrt_weights **out, struct mmrt_error *err);
/* Frees every weight arena of w (and takes its tensors off the devices' counts), then
 * closes the checkpoint. NULL ok. */
void mmrt_weights_close(struct mmrt_weights *w);

/* The checkpoint tensor with this canonical name, or NULL. */
const struct mmrt_st_tensor *mmrt_weights_find(const struct mmrt_weights *w, const char *name);

/* Loads tensor `name` onto dev in its checkpoint dtype after checking that its shape is
 * exactly shape[n_dims] (a checkpoint with a missing tensor or another shape is refused with
 * the file, the tensor name and both shapes), and that it holds no NaN or ±Inf (refused
 * naming the tensor, the element and its byte offset). `name` is printf-formatted. */
mmrt_status mmrt_weights_load(struct mmrt_weights *w, struct mmrt_dev *dev, int n_dims,
                              const int64_t *shape, struct mmrt_tensor *out,
                              struct mmrt_error *err, const char *name, ...)
    __attribute__((format(printf, 7, 8)));

/* Places and uploads every tensor loaded since the last commit, then fills their
 * descriptors (see the top of this file). Device memory that cannot be had is
 * MMRT_ERR_OUT_OF_POOL naming the device and the bytes. */
mmrt_status mmrt_weights_commit(struct mmrt_weights *w, struct mmrt_error *err);

/* Same, converting to F32 on the way (for small vectors some ops need in F32). */
mmrt_status mmrt_weights_load_f32(struct mmrt_weights *w, struct mmrt_dev *dev, int n_dims,
                                  const int64_t *shape, struct mmrt_tensor *out,
                                  struct mmrt_error *err, const char *name, ...)
    __attribute__((format(printf, 7, 8)));

/* Same, for a checkpoint tensor whose stored shape is not the one the model computes with:
 * the checkpoint must hold exactly ckpt_shape[ckpt_dims] (any rank the safetensors reader
 * accepts, also above MMRT_MAX_DIMS), and the device tensor is shape[n_dims], the same
 * elements in the same (row-major) order. The two element counts must be equal
 * (MMRT_ERR_INTERNAL otherwise: a model bug, not a bad file). Qwen2-VL's Conv3d patch
 * embedding [E, 3, 2, P, P] is used as the matmul weight [E, 3·2·P·P] this way. */
mmrt_status mmrt_weights_load_as(struct mmrt_weights *w, struct mmrt_dev *dev, int ckpt_dims,
                                 const int64_t *ckpt_shape, int n_dims, const int64_t *shape,
                                 struct mmrt_tensor *out, struct mmrt_error *err,
                                 const char *name, ...) __attribute__((format(printf, 9, 10)));

/* The model's settings the set follows from now on (NULL = the defaults): opts->weights,
 * how mmrt_weights_load_matrix holds float matrices (core/quant.h; MMRT_WEIGHTS_CHECKPOINT
 * until set), and opts->on_quantized, told about each matrix it quantizes. */
void mmrt_weights_set_options(struct mmrt_weights *w, const struct mmrt_model_options *opts);

/* Loads the 2-D matmul weight `name` [N, K] (checked as mmrt_weights_load does) into *out.
 * A matrix the checkpoint stores quantized (I8 or U8 codes with their `name`_scale and, for
 * 4-bit, `name`_zero tensors: docs/QUANTIZATION.md "Checkpoint layout", what mmrt-quantize
 * writes) is taken as stored, mapped in place where the device adopts host memory; its
 * shapes, group size and zero points are checked by name first. A float matrix follows the
 * set's format: as stored, or quantized on the way to the device (INT8: out->t I8 and
 * out->scale F32 [N], neither mappable, so a quantized weight costs its own bytes and not
 * the checkpoint's). A value that is not finite is refused naming the tensor and its index.
 * Usable after commit, as above. */
mmrt_status mmrt_weights_load_matrix(struct mmrt_weights *w, struct mmrt_dev *dev, int64_t N,
                                     int64_t K, struct mmrt_weight *out, struct mmrt_error *err,
                                     const char *name, ...)
    __attribute__((format(printf, 7, 8)));
/* Marks every checkpoint tensor whose canonical name starts with the printf-formatted prefix
 * as known to the model though not loaded (e.g. the CLIP layers after LLaVA's feature
 * layer: transformers holds them, mmrt skips the work), so mmrt_weights_report_unused does
 * not name them. */
void mmrt_weights_skip(struct mmrt_weights *w, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Logs one warning naming the checkpoint tensors nothing loaded or skipped (as transformers
 * warns "Some weights of the model checkpoint were not used"): layer runs collapse to
 * "language_model.layers.2-3.* (18 tensors)". Call it once every weight is loaded: the
 * decoders (llama.c, persimmon.c) do, since every model loads its decoder last. */
void mmrt_weights_report_unused(const struct mmrt_weights *w);

/* Logs a warning when the checkpoint has layers PREFIX.N.PROBE beyond the n_layers
 * config.json's `key` asks for, naming both counts (the extra layers are then also in
 * mmrt_weights_report_unused's line). */
void mmrt_weights_check_layers(const struct mmrt_weights *w, const char *prefix,
                               int64_t n_layers, const char *probe, const char *key);

/* A decoder's token embedding, language_model.embed_tokens.weight [vocab, hidden], and its
 * head: lm_head.weight [vocab, hidden], or where the checkpoint has none and config.json ties
 * them (tie), the embedding itself (*tied; mmrt_weights_decoder_done points the head at it). */
mmrt_status mmrt_weights_load_embed_head(struct mmrt_weights *w, struct mmrt_dev *dev,
                                         int64_t vocab, int64_t hidden, bool tie,
                                         struct mmrt_tensor *embed, struct mmrt_weight *head,
                                         bool *tied, struct mmrt_error *err);

/* Ends a decoder's load, which every model does last: commits, warns of layers
 * language_model.layers.N beyond num_hidden_layers and of tensors nothing reads, and points
 * a tied head at the committed embedding. */
mmrt_status mmrt_weights_decoder_done(struct mmrt_weights *w, int64_t n_layers, bool tied,
                                      const struct mmrt_tensor *embed,
                                      struct mmrt_weight *head, struct mmrt_error *err);

/* Canonical spelling of a checkpoint key (models.md §1.7), written into buf. */
void mmrt_weights_canonical_name(const char *name, bool bare_model_is_lm, char *buf,
                                 size_t size);

#endif
