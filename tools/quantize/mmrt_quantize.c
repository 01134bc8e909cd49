/*
 * tools/quantize/mmrt_quantize.c — mmrt-quantize: writes a copy of a checkpoint whose matmul
 * weights are stored quantized in mmrt's layout (docs/QUANTIZATION.md "Checkpoint layout"),
 * so that mmrt maps them in place at start instead of quantizing every matrix again.
 *
 *   mmrt-quantize --model DIR --out NEW_DIR [--weights int8|int4|int4-g64|int4-g32]
 *
 * The codes are the runtime's own: the tool loads the model on the CPU plugin with
 * [model] weights set, as mmrt would, and records every matrix the loader quantizes
 * (mmrt_model_options.on_quantized) — so the tool and the loader can never disagree on which
 * tensors are matrices, on the group size or on the clipping search, and a model run from
 * the output gives exactly the tokens of the same model quantized at load. Every other tensor
 * is copied as it is, as are the directory's other files (tokenizer, processor, chat
 * template); config.json gains quantization_config. Then the output is loaded once more as
 * a check, and the tool says what it wrote.
 *
 * The output directory must not exist: nothing is ever overwritten. It is written as a
 * temporary directory beside it and renamed when complete, so an interrupted run leaves no
 * half-written checkpoint under the name.
 */
#include <dirent.h>
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "device.h"
#include "fidelity.h"
#include "formats/file.h"
#include "formats/json.h"
#include "formats/safetensors.h"
#include "model.h"
#include "quant.h"

static bool ends_with(const char *s, const char *suffix);

/* buf = a "/" b; false when it does not fit (paths are checked against PATH_MAX first). */
static bool join(char *buf, size_t size, const char *a, const char *b)
{
    const int n = snprintf(buf, size, "%s/%s", a, b);
    return n >= 0 && (size_t)n < size;
}

/* One quantized matrix, copied out of the loader's callback. */
struct rec {
    char *name; /* the tensor's name in the source file */
    int64_t rows, cols, group;
    uint8_t *codes;
    float *scale, *zero;
};

struct recs {
    struct rec *v;
    size_t n, cap;
    bool failed; /* out of memory in the callback */
};

static void on_quantized(void *user, const struct mmrt_quantized_matrix *m)
{
    struct recs *r = user;
    if (r->failed)
        return;
    if (r->n == r->cap) {
        size_t cap = r->cap ? 2 * r->cap : 64;
        struct rec *v = realloc(r->v, cap * sizeof *v);
        if (!v) {
            r->failed = true;
            return;
        }
        r->v = v;
        r->cap = cap;
    }
    const int64_t G = m->group ? m->cols / m->group : 1;
    const size_t code_bytes = (size_t)(m->rows * (m->group ? m->cols / 2 : m->cols));
    const size_t group_bytes = (size_t)(m->rows * G) * sizeof(float);
    struct rec *e = &r->v[r->n];
    *e = (struct rec){ .name = strdup(m->tensor->name), .rows = m->rows, .cols = m->cols,
                       .group = m->group, .codes = malloc(code_bytes + 1),
                       .scale = malloc(group_bytes + 1),
                       .zero = m->group ? malloc(group_bytes + 1) : NULL };
    if (!e->name || !e->codes || !e->scale || (m->group && !e->zero)) {
        free(e->name);
        free(e->codes);
        free(e->scale);
        free(e->zero);
        r->failed = true;
        return;
    }
    memcpy(e->codes, m->codes, code_bytes);
    memcpy(e->scale, m->scale, group_bytes);
    if (m->group)
        memcpy(e->zero, m->zero, group_bytes);
    r->n++;
}

static void recs_free(struct recs *r)
{
    for (size_t i = 0; i < r->n; i++) {
        free(r->v[i].name);
        free(r->v[i].codes);
        free(r->v[i].scale);
        free(r->v[i].zero);
    }
    free(r->v);
}

static const struct rec *rec_find(const struct recs *r, const char *name)
{
    for (size_t i = 0; i < r->n; i++)
        if (strcmp(r->v[i].name, name) == 0)
            return &r->v[i];
    return NULL;
}

/* ---- which matrices get which format ---- */

#define MAX_KEEP 256

/* The formats a run of the loader gives each float matrix (mmrt_format_fn). */
struct choice {
    enum mmrt_weight_format lm, vision; /* the language side's, and the vision side's */
    const char *keep[MAX_KEEP];         /* canonical-name prefixes kept as stored */
    int n_keep;
    const char *only;                   /* set: this matrix alone is quantized (the report) */
    bool listing;                       /* a load that only lists the matrices: none quantized */
    /* every matrix the loader asked about, canonical names, in load order (owned) */
    char **seen;
    int n_seen, cap_seen;
    bool failed;
};

static bool starts_with(const char *s, const char *prefix)
{
    return strncmp(s, prefix, strlen(prefix)) == 0;
}

/* The vision stage's matrices (canonical names, models/weights.h): tower and projector. */
static bool is_vision(const char *name)
{
    return starts_with(name, "vision_tower.") || starts_with(name, "multi_modal_projector.") ||
           starts_with(name, "visual.") || starts_with(name, "vision_embed_tokens.");
}

static enum mmrt_weight_format format_of(void *user, const char *name,
                                         enum mmrt_weight_format def)
{
    (void)def;
    struct choice *c = user;
    bool known = false;
    for (int i = 0; i < c->n_seen && !known; i++)
        known = strcmp(c->seen[i], name) == 0;
    if (!known && !c->failed) {
        if (c->n_seen == c->cap_seen) {
            const int cap = c->cap_seen ? 2 * c->cap_seen : 64;
            char **v = realloc(c->seen, (size_t)cap * sizeof *v);
            c->failed = !v;
            if (v) {
                c->seen = v;
                c->cap_seen = cap;
            }
        }
        if (!c->failed && !(c->seen[c->n_seen] = strdup(name)))
            c->failed = true;
        if (!c->failed)
            c->n_seen++;
    }
    const enum mmrt_weight_format f = is_vision(name) ? c->vision : c->lm;
    if (c->listing)
        return MMRT_WEIGHTS_CHECKPOINT;
    if (c->only)
        return strcmp(name, c->only) == 0 ? f : MMRT_WEIGHTS_CHECKPOINT;
    for (int i = 0; i < c->n_keep; i++)
        if (starts_with(name, c->keep[i]))
            return MMRT_WEIGHTS_CHECKPOINT;
    return f;
}

static void choice_free(struct choice *c)
{
    for (int i = 0; i < c->n_seen; i++)
        free(c->seen[i]);
    free(c->seen);
    c->seen = NULL;
    c->n_seen = c->cap_seen = 0;
}

/* A runtime on the CPU plugin for the checkpoint in dir, its matrices as `c` says (c NULL:
 * as stored), each quantized one told to `recs` (may be NULL). */
static mmrt_status open_runtime(const char *dir, struct choice *c, struct recs *recs,
                                struct mmrt_runtime **rt, struct mmrt_error *err)
{
    struct mmrt_device_config dev = { .name = "cpu0", .plugin = "cpu" };
    const struct mmrt_config cfg = { .struct_size = sizeof cfg, .model_path = dir,
                                     .devices = &dev, .n_devices = 1, .max_kv_tokens = 4096,
                                     .vision_cache_entries = -1, .prefix_cache = -1 };
    const struct mmrt_model_options hooks = {
        .on_quantized = recs ? on_quantized : NULL, .on_quantized_user = recs,
        .format_of = c ? format_of : NULL, .format_of_user = c,
    };
    char msg[MMRT_ERROR_MAX];
    const mmrt_status st = mmrt_create_hooked(&cfg, &hooks, rt, msg, sizeof msg);
    if (st != MMRT_OK)
        return mmrt_error_set(err, st, "%s", msg);
    if (c && c->failed) {
        mmrt_destroy(*rt);
        return mmrt_error_set(err, MMRT_ERR_NO_MEMORY, "out of memory");
    }
    return MMRT_OK;
}

/* ---- the report: the model's output when a matrix alone is quantized ---- */

#define MAX_CALIB 64
#define MAX_STEPS 16 /* answer tokens compared per calibration image */

/* The greedy answer of the model as stored to each calibration image: every step's
 * next-token distribution and the token it chose. */
struct calib {
    const char *prompt;
    char *images[MAX_CALIB];
    int n;
    int64_t vocab;
    float *ref;   /* [n][MAX_STEPS][vocab] probabilities */
    int32_t *ref_ids; /* [n][MAX_STEPS], -1 past the answer's end */
};

struct capture {
    float *p; /* [MAX_STEPS][vocab] */
    int32_t *ids; /* [MAX_STEPS] */
    int64_t vocab;
    int n_ids;
    bool bad;
};

static void capture_logits(void *user, int step, const float *logits, int64_t vocab)
{
    struct capture *c = user;
    if (step < 0 || step >= MAX_STEPS)
        return;
    if (vocab != c->vocab) {
        c->bad = true;
        return;
    }
    fidelity_softmax(logits, vocab, c->p + (size_t)step * (size_t)vocab);
}

static bool capture_token(void *user, int32_t id, const char *text)
{
    (void)text;
    struct capture *c = user;
    if (id >= 0 && c->n_ids < MAX_STEPS)
        c->ids[c->n_ids++] = id;
    return true;
}

/* Each calibration image's greedy answer on rt (at most MAX_STEPS tokens): every step's
 * distribution into probs, the tokens into ids. */
static mmrt_status answers(struct mmrt_runtime *rt, const struct calib *k, float *probs,
                           int32_t *ids, struct mmrt_error *err)
{
    for (int i = 0; i < k->n; i++) {
        struct mmrt_image_input img = { .path = k->images[i] };
        struct mmrt_request req = { .struct_size = sizeof req, .prompt = k->prompt,
                                    .images = &img, .n_images = 1, .max_tokens = MAX_STEPS,
                                    .temperature = 0.0f, .top_p = 1.0f };
        struct capture cap = { .p = probs + (size_t)i * MAX_STEPS * (size_t)k->vocab,
                               .ids = ids + (size_t)i * MAX_STEPS, .vocab = k->vocab };
        for (int s = 0; s < MAX_STEPS; s++)
            cap.ids[s] = -1;
        const struct mmrt_model_trace trace = { .user = &cap, .logits = capture_logits };
        struct mmrt_result res = { .struct_size = sizeof res };
        const mmrt_status st = mmrt_run_traced(rt, &req, &trace, capture_token, &cap, &res);
        if (st != MMRT_OK)
            return mmrt_error_set(err, st, "%s: %s", k->images[i], res.message);
        if (cap.bad)
            return mmrt_error_set(err, MMRT_ERR_INTERNAL, "%s: logits of another vocabulary",
                                  k->images[i]);
    }
    return MMRT_OK;
}

/* Against the model as stored, over every answer position while the answer so far is the
 * stored model's: mean KL(stored ‖ quantized) and top-1 agreement of the next token. */
struct fidelity {
    double kl, top1;
    int positions;
};

static mmrt_status measure(const char *dir, struct choice *c, const struct calib *k,
                           struct fidelity *out, struct mmrt_error *err)
{
    struct mmrt_runtime *rt = NULL;
    mmrt_status st = open_runtime(dir, c, NULL, &rt, err);
    const size_t per = (size_t)MAX_STEPS * (size_t)k->vocab;
    float *p = st == MMRT_OK ? malloc((size_t)k->n * per * sizeof *p) : NULL;
    int32_t *ids = st == MMRT_OK ? malloc((size_t)k->n * MAX_STEPS * sizeof *ids) : NULL;
    if (st == MMRT_OK && (!p || !ids))
        st = mmrt_error_set(err, MMRT_ERR_NO_MEMORY, "out of memory");
    if (st == MMRT_OK)
        st = answers(rt, k, p, ids, err);
    if (st == MMRT_OK) {
        struct fidelity_sum f = { 0 };
        for (int i = 0; i < k->n; i++)
            fidelity_add(&f, k->ref + (size_t)i * per, k->ref_ids + (size_t)i * MAX_STEPS,
                         p + (size_t)i * per, ids + (size_t)i * MAX_STEPS, MAX_STEPS, k->vocab);
        const int n = f.positions;
        *out = (struct fidelity){ n ? f.kl / n : 0, n ? (double)f.same / n : 1, n };
    }
    free(p);
    free(ids);
    mmrt_destroy(rt);
    return st;
}

struct ranked {
    const char *name;
    struct fidelity f;
};

static int by_kl_desc(const void *a, const void *b)
{
    const double x = ((const struct ranked *)a)->f.kl, y = ((const struct ranked *)b)->f.kl;
    return x < y ? 1 : x > y ? -1 : 0;
}

/* The report: every matrix quantized alone, ranked by the KL it causes; the `keep_top` most
 * sensitive ones join c's kept list. The ranking is printed to stdout. */
static mmrt_status sensitivity(const char *dir, struct choice *c, const struct calib *k,
                               int keep_top, bool print, struct ranked **out_rank,
                               struct mmrt_error *err)
{
    const int n = c->n_seen;
    struct ranked *rank = calloc((size_t)n + 1, sizeof *rank);
    if (!rank)
        return mmrt_error_set(err, MMRT_ERR_NO_MEMORY, "out of memory");
    mmrt_status st = MMRT_OK;
    for (int i = 0; st == MMRT_OK && i < n; i++) {
        c->only = c->seen[i];
        rank[i].name = c->seen[i];
        st = measure(dir, c, k, &rank[i].f, err);
    }
    c->only = NULL;
    if (st != MMRT_OK) {
        free(rank);
        return st;
    }
    qsort(rank, (size_t)n, sizeof *rank, by_kl_desc);
    if (print) {
        printf("matrix (quantized alone)                               mean KL   top-1\n");
        for (int i = 0; i < n; i++)
            printf("%-52s %9.2e %6.1f%%%s\n", rank[i].name, rank[i].f.kl,
                   100 * rank[i].f.top1, i < keep_top ? "  (kept as stored)" : "");
    }
    for (int i = 0; i < keep_top && i < n && c->n_keep < MAX_KEEP; i++)
        c->keep[c->n_keep++] = rank[i].name;
    *out_rank = rank;
    return MMRT_OK;
}

/* The calibration set: up to MAX_CALIB PNG/JPEG files of dir, in name order. */
static mmrt_status calib_load(const char *dir, struct calib *k, struct mmrt_error *err)
{
    DIR *d = opendir(dir);
    if (!d)
        return mmrt_error_set(err, MMRT_ERR_IO, "--calib %s: %s", dir, strerror(errno));
    for (struct dirent *e; (e = readdir(d)) && k->n < MAX_CALIB;) {
        const char *n = e->d_name;
        if (!ends_with(n, ".png") && !ends_with(n, ".jpg") && !ends_with(n, ".jpeg"))
            continue;
        char p[8192];
        if (!join(p, sizeof p, dir, n) || !(k->images[k->n] = strdup(p)))
            break;
        k->n++;
    }
    closedir(d);
    if (k->n == 0)
        return mmrt_error_set(err, MMRT_ERR_NOT_FOUND, "--calib %s: no .png or .jpg file", dir);
    /* name order, so a report does not depend on the directory's order */
    for (int i = 1; i < k->n; i++)
        for (int j = i; j > 0 && strcmp(k->images[j - 1], k->images[j]) > 0; j--) {
            char *t = k->images[j];
            k->images[j] = k->images[j - 1];
            k->images[j - 1] = t;
        }
    return MMRT_OK;
}

static void calib_free(struct calib *k)
{
    for (int i = 0; i < k->n; i++)
        free(k->images[i]);
    free(k->ref);
    free(k->ref_ids);
}

/* The reference: the model as stored, its greedy answers and their distributions. */
static mmrt_status calib_reference(const char *dir, const json_t *config, struct calib *k,
                                   struct mmrt_error *err)
{
    struct mmrt_runtime *rt = NULL;
    mmrt_status st = open_runtime(dir, NULL, NULL, &rt, err);
    if (st != MMRT_OK)
        return st;
    /* vocabulary: the LM head's rows, as config.json gives them */
    const json_t *tc = json_object_get(config, "text_config");
    json_int_t vocab = json_integer_value(json_object_get(json_is_object(tc) ? tc : config,
                                                          "vocab_size"));
    if (vocab <= 0)
        vocab = json_integer_value(json_object_get(config, "vocab_size"));
    k->vocab = vocab;
    k->ref = vocab > 0 ? malloc((size_t)k->n * MAX_STEPS * (size_t)vocab * sizeof *k->ref)
                       : NULL;
    k->ref_ids = malloc((size_t)k->n * MAX_STEPS * sizeof *k->ref_ids);
    if (vocab <= 0)
        st = mmrt_error_set(err, MMRT_ERR_FORMAT, "config.json: no vocab_size");
    else if (!k->ref || !k->ref_ids)
        st = mmrt_error_set(err, MMRT_ERR_NO_MEMORY, "out of memory");
    else
        st = answers(rt, k, k->ref, k->ref_ids, err);
    mmrt_destroy(rt);
    return st;
}

/* ---- writing a safetensors file ---- */

/* One tensor of the output: where its bytes come from. */
struct out_tensor {
    char *name;
    const char *dtype; /* safetensors spelling */
    int n_dims;
    int64_t shape[MMRT_ST_MAX_RANK];
    const void *data;
    uint64_t nbytes;
};

static const char *st_dtype(int32_t dtype)
{
    switch (dtype) {
    case MMRT_DTYPE_F32: return "F32";
    case MMRT_DTYPE_F16: return "F16";
    case MMRT_DTYPE_BF16: return "BF16";
    case MMRT_DTYPE_I8: return "I8";
    case MMRT_DTYPE_I32: return "I32";
    case MMRT_ST_DTYPE_I64: return "I64";
    default: return "U8"; /* MMRT_DTYPE_U4: bytes of two codes */
    }
}

static int write_all(FILE *f, const void *p, uint64_t n)
{
    return n == 0 || fwrite(p, 1, (size_t)n, f) == (size_t)n ? 0 : -1;
}

/* Writes path: the 8-byte header length, the header (padded with spaces to a multiple of 8,
 * as writers do) and the tensors' bytes in order. */
static mmrt_status write_safetensors(const char *path, const struct out_tensor *t, size_t n,
                                     const char *format, struct mmrt_error *err)
{
    json_t *hdr = json_object();
    json_t *meta = json_pack("{s:s,s:s,s:s}", "format", "pt", "writer", "mmrt-quantize",
                             "weights", format);
    if (!hdr || !meta || json_object_set_new(hdr, "__metadata__", meta)) {
        json_decref(hdr);
        return mmrt_error_set(err, MMRT_ERR_NO_MEMORY, "%s: out of memory", path);
    }
    uint64_t at = 0;
    for (size_t i = 0; i < n; i++) {
        json_t *shape = json_array();
        for (int d = 0; shape && d < t[i].n_dims; d++)
            json_array_append_new(shape, json_integer(t[i].shape[d]));
        json_t *e = shape ? json_pack("{s:s,s:o,s:[I,I]}", "dtype", t[i].dtype, "shape", shape,
                                      "data_offsets", (json_int_t)at,
                                      (json_int_t)(at + t[i].nbytes))
                          : NULL;
        if (!e || json_object_set_new(hdr, t[i].name, e)) {
            json_decref(hdr);
            return mmrt_error_set(err, MMRT_ERR_NO_MEMORY, "%s: out of memory", path);
        }
        at += t[i].nbytes;
    }
    char *text = json_dumps(hdr, JSON_COMPACT | JSON_SORT_KEYS);
    json_decref(hdr);
    if (!text)
        return mmrt_error_set(err, MMRT_ERR_NO_MEMORY, "%s: out of memory", path);
    const size_t len = strlen(text), padded = (len + 7) / 8 * 8;
    uint8_t head[8];
    for (int i = 0; i < 8; i++)
        head[i] = (uint8_t)((uint64_t)padded >> (8 * i));
    FILE *f = fopen(path, "wbx");
    int bad = !f;
    if (f) {
        bad |= write_all(f, head, 8) || write_all(f, text, len);
        for (size_t i = len; !bad && i < padded; i++)
            bad |= fputc(' ', f) == EOF;
        for (size_t i = 0; !bad && i < n; i++)
            bad |= write_all(f, t[i].data, t[i].nbytes);
        bad |= fclose(f) != 0;
    }
    free(text);
    if (bad)
        return mmrt_error_set(err, MMRT_ERR_IO, "%s: cannot write: %s", path, strerror(errno));
    return MMRT_OK;
}

/* The output tensors: every source tensor, the recorded matrices as codes + scales (+ zero
 * points). names[] owns the names made here. */
static mmrt_status plan_tensors(const struct mmrt_safetensors *src, const struct recs *r,
                                struct out_tensor **out, size_t *n_out, struct mmrt_error *err)
{
    const size_t n = mmrt_safetensors_count(src);
    struct out_tensor *t = calloc(n + 2 * r->n + 1, sizeof *t);
    if (!t)
        return mmrt_error_set(err, MMRT_ERR_NO_MEMORY, "out of memory");
    size_t k = 0;
    mmrt_status st = MMRT_OK;
    for (size_t i = 0; st == MMRT_OK && i < n; i++) {
        const struct mmrt_st_tensor *s = mmrt_safetensors_at(src, i);
        const struct rec *q = rec_find(r, s->name);
        struct out_tensor *o = &t[k++];
        o->name = strdup(s->name);
        if (!o->name) {
            st = mmrt_error_set(err, MMRT_ERR_NO_MEMORY, "out of memory");
            break;
        }
        if (!q) {
            o->dtype = st_dtype(s->dtype);
            o->n_dims = s->n_dims;
            memcpy(o->shape, s->shape, sizeof o->shape);
            o->data = s->data;
            o->nbytes = s->nbytes;
            continue;
        }
        const int64_t G = q->group ? q->cols / q->group : 1;
        *o = (struct out_tensor){ .name = o->name, .dtype = q->group ? "U8" : "I8", .n_dims = 2,
                                  .shape = { q->rows, q->group ? q->cols / 2 : q->cols },
                                  .data = q->codes };
        o->nbytes = (uint64_t)(o->shape[0] * o->shape[1]);
        for (int part = 0; part < (q->group ? 2 : 1); part++) {
            char name[1200];
            snprintf(name, sizeof name, "%s%s", s->name, part ? "_zero" : "_scale");
            if (mmrt_safetensors_find(src, name)) {
                st = mmrt_error_set(err, MMRT_ERR_FORMAT, "%s: the checkpoint already has a "
                                    "tensor '%s', which mmrt's layout gives the %s of '%s'",
                                    s->file, name, part ? "zero points" : "scales", s->name);
                break;
            }
            struct out_tensor *c = &t[k++];
            *c = (struct out_tensor){ .name = strdup(name), .dtype = "F32",
                                      .n_dims = q->group ? 2 : 1, .shape = { q->rows, G },
                                      .data = part ? q->zero : q->scale,
                                      .nbytes = (uint64_t)(q->rows * G) * sizeof(float) };
            if (!c->name)
                st = mmrt_error_set(err, MMRT_ERR_NO_MEMORY, "out of memory");
        }
    }
    *out = t;
    *n_out = k;
    return st;
}

static void out_free(struct out_tensor *t, size_t n)
{
    for (size_t i = 0; t && i < n; i++)
        free(t[i].name);
    free(t);
}

/* ---- the directory's other files ---- */

static mmrt_status copy_file(const char *from, const char *to, struct mmrt_error *err)
{
    char *data = NULL;
    size_t len = 0;
    mmrt_status st = mmrt_file_read(from, (size_t)1 << 30, 0, NULL, &data, &len, err);
    if (st != MMRT_OK)
        return st;
    FILE *f = fopen(to, "wbx");
    int bad = !f || write_all(f, data, len);
    if (f)
        bad |= fclose(f) != 0;
    free(data);
    return bad ? mmrt_error_set(err, MMRT_ERR_IO, "%s: cannot write: %s", to, strerror(errno))
               : MMRT_OK;
}

static bool ends_with(const char *s, const char *suffix)
{
    const size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

/* Every regular file of `dir` but the weights and config.json, into `out`. */
static mmrt_status copy_others(const char *dir, const char *out, struct mmrt_error *err)
{
    DIR *d = opendir(dir);
    if (!d)
        return mmrt_error_set(err, MMRT_ERR_IO, "%s: %s", dir, strerror(errno));
    mmrt_status st = MMRT_OK;
    for (struct dirent *e; st == MMRT_OK && (e = readdir(d));) {
        const char *n = e->d_name;
        if (n[0] == '.' || ends_with(n, ".safetensors") ||
            strcmp(n, "model.safetensors.index.json") == 0 || strcmp(n, "config.json") == 0)
            continue;
        char from[8192], to[8192];
        struct stat sb;
        if (!join(from, sizeof from, dir, n) || !join(to, sizeof to, out, n) ||
            lstat(from, &sb) != 0 || !S_ISREG(sb.st_mode))
            continue; /* only files the checkpoint consists of; nothing to follow or block on */
        st = copy_file(from, to, err);
    }
    closedir(d);
    return st;
}

/* Removes the temporary directory of a failed run: only the files this tool wrote, no
 * subdirectories. */
static void remove_flat_dir(const char *dir)
{
    DIR *d = opendir(dir);
    for (struct dirent *e; d && (e = readdir(d));) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        char p[8192];
        if (join(p, sizeof p, dir, e->d_name))
            unlink(p);
    }
    if (d)
        closedir(d);
    if (rmdir(dir) != 0)
        fprintf(stderr, "mmrt-quantize: could not remove %s: %s\n", dir, strerror(errno));
}

/* ---- main ---- */

static void usage(FILE *f)
{
    fprintf(f, "usage: mmrt-quantize --model DIR --out NEW_DIR [options]\n"
               "       mmrt-quantize --model DIR --report --calib IMAGES_DIR [options]\n"
               "Writes a copy of the checkpoint in DIR with its matmul weights stored\n"
               "quantized in mmrt's layout (docs/QUANTIZATION.md), which mmrt maps in place.\n"
               "  --weights F          int8 | int4 (groups of 128, the default) | int4-g64 |\n"
               "                       int4-g32: the language model's matrices\n"
               "  --vision-weights F   the vision tower's and projector's (default: --weights;\n"
               "                       also checkpoint: kept as stored)\n"
               "  --keep-float PREFIX  matrices whose name starts so stay as stored (repeatable)\n"
               "  --report             each matrix quantized alone, ranked by the mean KL of the\n"
               "                       next-token distribution over the greedy answers to\n"
               "                       --calib's images (stdout), and the whole choice's figures\n"
               "  --keep-float-top N   the N matrices the report ranks highest stay as stored\n"
               "  --calib DIR          calibration pictures (.png, .jpg; up to %d)\n"
               "  --prompt TEXT        the calibration question (default \"Describe the "
               "picture.\")\n"
               "NEW_DIR must not exist.\n", MAX_CALIB);
}

/* A --weights / --vision-weights value; checkpoint only where allow_stored. */
static bool parse_format(const char *s, bool allow_stored, enum mmrt_weight_format *out)
{
    for (int i = allow_stored ? MMRT_WEIGHTS_CHECKPOINT : MMRT_WEIGHTS_INT8;
         i <= MMRT_WEIGHTS_INT4_G32; i++)
        if (strcmp(s, mmrt_weight_format_name((enum mmrt_weight_format)i)) == 0) {
            *out = (enum mmrt_weight_format)i;
            return true;
        }
    return false;
}

int main(int argc, char **argv)
{
    const char *dir = NULL, *out = NULL, *fmt_name = "int4", *vis_name = NULL, *calib_dir = NULL;
    const char *prompt = "Describe the picture.";
    bool report = false;
    int keep_top = 0;
    struct choice c = { 0 };
    static const struct option longopts[] = {
        { "model", required_argument, NULL, 'm' },
        { "out", required_argument, NULL, 'o' },
        { "weights", required_argument, NULL, 'w' },
        { "vision-weights", required_argument, NULL, 'v' },
        { "keep-float", required_argument, NULL, 'k' },
        { "keep-float-top", required_argument, NULL, 't' },
        { "report", no_argument, NULL, 'r' },
        { "calib", required_argument, NULL, 'c' },
        { "prompt", required_argument, NULL, 'p' },
        { "help", no_argument, NULL, 'h' },
        { NULL, 0, NULL, 0 },
    };
    for (int opt; (opt = getopt_long(argc, argv, "h", longopts, NULL)) != -1;) {
        char *end = NULL;
        switch (opt) {
        case 'm': dir = optarg; break;
        case 'o': out = optarg; break;
        case 'w': fmt_name = optarg; break;
        case 'v': vis_name = optarg; break;
        case 'k':
            if (c.n_keep == MAX_KEEP) {
                fprintf(stderr, "mmrt-quantize: more than %d --keep-float\n", MAX_KEEP);
                return 2;
            }
            c.keep[c.n_keep++] = optarg;
            break;
        case 't':
            keep_top = (int)strtol(optarg, &end, 10);
            if (!*optarg || *end || keep_top < 0 || keep_top > MAX_KEEP) {
                fprintf(stderr, "mmrt-quantize: --keep-float-top '%s': expected 0 … %d\n",
                        optarg, MAX_KEEP);
                return 2;
            }
            break;
        case 'r': report = true; break;
        case 'c': calib_dir = optarg; break;
        case 'p': prompt = optarg; break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (!dir || (!out && !report) || optind != argc) {
        usage(stderr);
        return 2;
    }
    if (!parse_format(fmt_name, false, &c.lm)) {
        fprintf(stderr, "mmrt-quantize: --weights '%s': expected int8, int4, int4-g64 or "
                        "int4-g32\n", fmt_name);
        return 2;
    }
    c.vision = c.lm;
    if (vis_name && !parse_format(vis_name, true, &c.vision)) {
        fprintf(stderr, "mmrt-quantize: --vision-weights '%s': expected checkpoint, int8, "
                        "int4, int4-g64 or int4-g32\n", vis_name);
        return 2;
    }
    if ((report || keep_top > 0) && !calib_dir) {
        fprintf(stderr, "mmrt-quantize: --report and --keep-float-top need --calib DIR\n");
        return 2;
    }
    if (strlen(dir) > 4000 || (out && strlen(out) > 4000)) {
        fprintf(stderr, "mmrt-quantize: paths of more than 4000 bytes are not supported\n");
        return 2;
    }
    if (out && mmrt_file_exists(out)) {
        fprintf(stderr, "mmrt-quantize: %s exists; give a new directory\n", out);
        return 2;
    }
    struct mmrt_error err = { 0 };
    char path[8192], tmp[4200];
    join(path, sizeof path, dir, "config.json");
    json_t *config = NULL;
    struct recs recs = { 0 };
    struct mmrt_safetensors *src = NULL;
    struct out_tensor *tensors = NULL;
    struct calib k = { .prompt = prompt };
    struct ranked *rank = NULL;
    struct mmrt_runtime *rt = NULL;
    size_t n_tensors = 0;
    bool made_tmp = false;
    snprintf(tmp, sizeof tmp, "%s.partial-%ld", out ? out : dir, (long)getpid());
    mmrt_status st = mmrt_json_load_file(path, 1 << 24, 0, &config, &err);
    const char *type_name = NULL;
    if (st == MMRT_OK && !json_is_object(config))
        st = mmrt_error_set(&err, MMRT_ERR_FORMAT, "%s: the top level is not an object", path);
    if (st == MMRT_OK)
        st = mmrt_json_opt_string(config, "model_type", path, NULL, &type_name, &err);
    if (st == MMRT_OK && !(type_name ? mmrt_model_type_find(type_name) : NULL))
        st = mmrt_error_set(&err, MMRT_ERR_UNSUPPORTED, "%s: model_type '%s' is not one mmrt "
                            "runs (%s)", path, type_name ? type_name : "(missing)",
                            mmrt_model_types_supported());
    if (st == MMRT_OK && json_object_get(config, "quantization_config"))
        st = mmrt_error_set(&err, MMRT_ERR_UNSUPPORTED, "%s: the checkpoint is quantized "
                            "already (quantization_config)", path);
    /* The report: the matrices the loader knows (one load lists them), each quantized alone
     * against the model as stored; the most sensitive may stay as stored. */
    if (st == MMRT_OK && (report || keep_top > 0)) {
        c.listing = true; /* the names only: quantizing every matrix here would be wasted */
        st = open_runtime(dir, &c, NULL, &rt, &err);
        c.listing = false;
        mmrt_destroy(rt);
        rt = NULL;
        if (st == MMRT_OK)
            st = calib_load(calib_dir, &k, &err);
        if (st == MMRT_OK)
            st = calib_reference(dir, config, &k, &err);
        if (st == MMRT_OK) {
            fprintf(stderr, "mmrt-quantize: %d matrices, each quantized alone, on the answers "
                            "to %d calibration images\n", c.n_seen, k.n);
            st = sensitivity(dir, &c, &k, keep_top, report, &rank, &err);
        }
        struct fidelity whole = { 0 };
        if (st == MMRT_OK)
            st = measure(dir, &c, &k, &whole, &err);
        if (st == MMRT_OK && report)
            printf("all together (%s, vision %s, %d kept as stored): mean KL %.2e, top-1 "
                   "%.1f%% over %d answer positions of %d images\n", fmt_name,
                   mmrt_weight_format_name(c.vision), c.n_keep, whole.kl, 100 * whole.top1,
                   whole.positions, k.n);
    }
    /* The model as mmrt loads it with these formats, the loader's matrices recorded. */
    if (st == MMRT_OK && out) {
        fprintf(stderr, "mmrt-quantize: quantizing %s (%s) to %s\n", dir, type_name, fmt_name);
        st = open_runtime(dir, &c, &recs, &rt, &err);
        mmrt_destroy(rt);
        rt = NULL;
        if (st == MMRT_OK && recs.failed)
            st = mmrt_error_set(&err, MMRT_ERR_NO_MEMORY, "out of memory holding the codes");
        if (st == MMRT_OK && recs.n == 0)
            st = mmrt_error_set(&err, MMRT_ERR_UNSUPPORTED, "%s: no matrix was quantized", dir);
        if (st == MMRT_OK)
            st = mmrt_safetensors_open(dir, NULL, &src, &err);
        if (st == MMRT_OK)
            st = plan_tensors(src, &recs, &tensors, &n_tensors, &err);
        if (st == MMRT_OK && mkdir(tmp, 0755) != 0)
            st = mmrt_error_set(&err, MMRT_ERR_IO, "%s: %s", tmp, strerror(errno));
        made_tmp = st == MMRT_OK;
        if (st == MMRT_OK) {
            join(path, sizeof path, tmp, "model.safetensors");
            st = write_safetensors(path, tensors, n_tensors, fmt_name, &err);
        }
        if (st == MMRT_OK)
            st = copy_others(dir, tmp, &err);
        if (st == MMRT_OK) {
            json_t *qc = json_pack("{s:s,s:s,s:s,s:I,s:i}", "quant_method", "mmrt", "weights",
                                   fmt_name, "vision_weights",
                                   mmrt_weight_format_name(c.vision), "group_size",
                                   (json_int_t)mmrt_weight_format_group(c.lm),
                                   "kept_as_stored", c.n_keep);
            join(path, sizeof path, tmp, "config.json");
            if (!qc || json_object_set_new(config, "quantization_config", qc) ||
                json_dump_file(config, path, JSON_INDENT(2) | JSON_PRESERVE_ORDER) != 0)
                st = mmrt_error_set(&err, MMRT_ERR_IO, "%s: cannot write", path);
        }
        /* The check: the written checkpoint loads as mmrt will load it. */
        if (st == MMRT_OK) {
            st = open_runtime(tmp, NULL, NULL, &rt, &err);
            mmrt_destroy(rt);
            rt = NULL;
            if (st != MMRT_OK)
                mmrt_error_prefix(&err, st, "the written checkpoint does not load");
        }
        if (st == MMRT_OK && rename(tmp, out) != 0)
            st = mmrt_error_set(&err, MMRT_ERR_IO, "%s: %s", out, strerror(errno));
        if (st != MMRT_OK && made_tmp)
            remove_flat_dir(tmp);
    }
    if (st == MMRT_OK && out) {
        uint64_t before = 0, after = 0;
        for (size_t i = 0; i < mmrt_safetensors_count(src); i++)
            before += mmrt_safetensors_at(src, i)->nbytes;
        for (size_t i = 0; i < n_tensors; i++)
            after += tensors[i].nbytes;
        fprintf(stderr, "mmrt-quantize: wrote %s: %zu matrices quantized (%s, vision %s), "
                        "%.1f MB of tensors (%.1f MB before, %.2f×)\n", out, recs.n, fmt_name,
                mmrt_weight_format_name(c.vision), (double)after / 1e6, (double)before / 1e6,
                (double)after / (double)before);
    } else if (st != MMRT_OK) {
        fprintf(stderr, "mmrt-quantize: %s\n", err.msg);
    }
    free(rank);
    calib_free(&k);
    choice_free(&c);
    out_free(tensors, n_tensors);
    mmrt_safetensors_close(src);
    recs_free(&recs);
    json_decref(config);
    return st == MMRT_OK ? 0 : 1;
}
