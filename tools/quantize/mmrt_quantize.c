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
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "device.h"
#include "formats/file.h"
#include "formats/json.h"
#include "formats/safetensors.h"
#include "model.h"
#include "pool_budget.h"
#include "quant.h"

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

/* Loads the model in `dir` on a CPU device with opts (on_quantized may record). */
static mmrt_status load_model(const char *dir, const json_t *config,
                              const struct mmrt_model_type *type,
                              const struct mmrt_model_options *opts, struct mmrt_error *err)
{
    struct mmrt_pool_budget b;
    mmrt_status st = mmrt_pool_budget_estimate(type->model_type, dir, config, opts, &b, err);
    if (st != MMRT_OK)
        return st;
    struct mmrt_dev *dev = NULL;
    st = mmrt_dev_open("cpu0", "cpu", 0, mmrt_pool_budget_mb(&b, true, true) << 20, NULL, 0,
                       &dev, err);
    if (st != MMRT_OK)
        return st;
    struct mmrt_model *model = NULL;
    st = type->load(dir, config, opts, dev, dev, &model, err);
    if (st == MMRT_OK)
        type->destroy(model);
    mmrt_dev_close(dev);
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
    default: return "U8";
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
    fprintf(f, "usage: mmrt-quantize --model DIR --out NEW_DIR [--weights FORMAT]\n"
               "Writes a copy of the checkpoint in DIR with its matmul weights stored\n"
               "quantized in mmrt's layout (docs/QUANTIZATION.md), which mmrt maps in place.\n"
               "  --weights int8 | int4 (groups of 128, the default) | int4-g64 | int4-g32\n"
               "NEW_DIR must not exist.\n");
}

int main(int argc, char **argv)
{
    const char *dir = NULL, *out = NULL, *fmt_name = "int4";
    static const struct option longopts[] = {
        { "model", required_argument, NULL, 'm' }, { "out", required_argument, NULL, 'o' },
        { "weights", required_argument, NULL, 'w' }, { "help", no_argument, NULL, 'h' },
        { NULL, 0, NULL, 0 },
    };
    for (int opt; (opt = getopt_long(argc, argv, "h", longopts, NULL)) != -1;) {
        switch (opt) {
        case 'm': dir = optarg; break;
        case 'o': out = optarg; break;
        case 'w': fmt_name = optarg; break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (!dir || !out || optind != argc) {
        usage(stderr);
        return 2;
    }
    enum mmrt_weight_format fmt = MMRT_WEIGHTS_CHECKPOINT;
    for (int i = MMRT_WEIGHTS_INT8; i <= MMRT_WEIGHTS_INT4_G32; i++)
        if (strcmp(fmt_name, mmrt_weight_format_name((enum mmrt_weight_format)i)) == 0)
            fmt = (enum mmrt_weight_format)i;
    if (fmt == MMRT_WEIGHTS_CHECKPOINT) {
        fprintf(stderr, "mmrt-quantize: --weights '%s': expected int8, int4, int4-g64 or "
                        "int4-g32\n", fmt_name);
        return 2;
    }
    if (mmrt_file_exists(out)) {
        fprintf(stderr, "mmrt-quantize: %s exists; give a new directory\n", out);
        return 2;
    }
    if (strlen(dir) > 4000 || strlen(out) > 4000) {
        fprintf(stderr, "mmrt-quantize: paths of more than 4000 bytes are not supported\n");
        return 2;
    }
    struct mmrt_error err = { 0 };
    char path[8192], tmp[4200];
    join(path, sizeof path, dir, "config.json");
    json_t *config = NULL;
    struct recs recs = { 0 };
    struct mmrt_safetensors *src = NULL;
    struct out_tensor *tensors = NULL;
    size_t n_tensors = 0;
    bool made_tmp = false;
    snprintf(tmp, sizeof tmp, "%s.partial-%ld", out, (long)getpid());
    mmrt_status st = mmrt_json_load_file(path, 1 << 24, 0, &config, &err);
    const char *type_name = NULL;
    const struct mmrt_model_type *type = NULL;
    if (st == MMRT_OK && !json_is_object(config))
        st = mmrt_error_set(&err, MMRT_ERR_FORMAT, "%s: the top level is not an object", path);
    if (st == MMRT_OK)
        st = mmrt_json_opt_string(config, "model_type", path, NULL, &type_name, &err);
    if (st == MMRT_OK && !(type = type_name ? mmrt_model_type_find(type_name) : NULL))
        st = mmrt_error_set(&err, MMRT_ERR_UNSUPPORTED, "%s: model_type '%s' is not one mmrt "
                            "runs (%s)", path, type_name ? type_name : "(missing)",
                            mmrt_model_types_supported());
    if (st == MMRT_OK && json_object_get(config, "quantization_config"))
        st = mmrt_error_set(&err, MMRT_ERR_UNSUPPORTED, "%s: the checkpoint is quantized "
                            "already (quantization_config)", path);
    /* The model as mmrt loads it with [model] weights set, the loader's matrices recorded.
     * A small KV store: the tool runs nothing. */
    struct mmrt_model_options opts = { .weights = fmt, .on_quantized = on_quantized,
                                       .on_quantized_user = &recs, .max_kv_tokens = 16 };
    if (st == MMRT_OK) {
        fprintf(stderr, "mmrt-quantize: quantizing %s (%s) to %s\n", dir, type_name, fmt_name);
        st = load_model(dir, config, type, &opts, &err);
    }
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
        json_t *qc = json_pack("{s:s,s:s,s:I}", "quant_method", "mmrt", "weights", fmt_name,
                               "group_size", (json_int_t)mmrt_weight_format_group(fmt));
        join(path, sizeof path, tmp, "config.json");
        if (!qc || json_object_set_new(config, "quantization_config", qc) ||
            json_dump_file(config, path, JSON_INDENT(2) | JSON_PRESERVE_ORDER) != 0)
            st = mmrt_error_set(&err, MMRT_ERR_IO, "%s: cannot write", path);
    }
    /* The check: the written checkpoint loads as mmrt will load it. */
    if (st == MMRT_OK) {
        const struct mmrt_model_options plain = { .max_kv_tokens = 16 };
        st = load_model(tmp, config, type, &plain, &err);
        if (st != MMRT_OK)
            mmrt_error_prefix(&err, st, "the written checkpoint does not load");
    }
    if (st == MMRT_OK && rename(tmp, out) != 0)
        st = mmrt_error_set(&err, MMRT_ERR_IO, "%s: %s", out, strerror(errno));
    if (st != MMRT_OK && made_tmp)
        remove_flat_dir(tmp);
    if (st == MMRT_OK) {
        uint64_t before = 0, after = 0;
        for (size_t i = 0; i < mmrt_safetensors_count(src); i++)
            before += mmrt_safetensors_at(src, i)->nbytes;
        for (size_t i = 0; i < n_tensors; i++)
            after += tensors[i].nbytes;
        fprintf(stderr, "mmrt-quantize: wrote %s: %zu matrices as %s, %.1f MB of tensors "
                        "(%.1f MB before, %.2f×)\n", out, recs.n, fmt_name, (double)after / 1e6,
                (double)before / 1e6, (double)after / (double)before);
    } else {
        fprintf(stderr, "mmrt-quantize: %s\n", err.msg);
    }
    out_free(tensors, n_tensors);
    mmrt_safetensors_close(src);
    recs_free(&recs);
    json_decref(config);
    return st == MMRT_OK ? 0 : 1;
}
