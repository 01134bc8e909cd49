/* core/model_registry.c — the model types this build knows, by config.json model_type. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "formats/image.h"
#include "model.h"

extern const struct mmrt_model_type mmrt_fuyu_model_type;
extern const struct mmrt_model_type mmrt_llava_model_type;
extern const struct mmrt_model_type mmrt_llava_next_model_type;
extern const struct mmrt_model_type mmrt_qwen2vl_model_type;

static const struct mmrt_model_type *const model_types[] = {
    &mmrt_fuyu_model_type,
    &mmrt_llava_model_type,
    &mmrt_llava_next_model_type,
    &mmrt_qwen2vl_model_type,
};

#define N_TYPES (sizeof model_types / sizeof model_types[0])

const struct mmrt_model_type *mmrt_model_type_find(const char *model_type)
{
    for (size_t i = 0; i < N_TYPES; i++)
        if (strcmp(model_types[i]->model_type, model_type) == 0)
            return model_types[i];
    return NULL;
}

const char *mmrt_model_types_supported(void)
{
    return "fuyu, llava, llava_next, qwen2_vl";
}

void mmrt_vision_output_free(struct mmrt_vision_output *v)
{
    if (!v)
        return;
    free(v->features);
    free(v->tokens_per_image);
    free(v->grid_thw);
    v->features = NULL;
    v->tokens_per_image = NULL;
    v->grid_thw = NULL;
}

int64_t mmrt_vision_output_rows(const struct mmrt_vision_output *v)
{
    return v->tokens_per_image ? v->n_tokens : (int64_t)v->n_images * v->n_tokens;
}

int64_t mmrt_vision_output_tokens(const struct mmrt_vision_output *v, int i)
{
    return v->tokens_per_image ? v->tokens_per_image[i] : v->n_tokens;
}

void mmrt_prompt_free(struct mmrt_prompt *p)
{
    free(p->ids);
    free(p->pos);
    free(p->splices);
    free(p->grids);
    memset(p, 0, sizeof *p);
}

mmrt_status mmrt_prompt_add_splice(struct mmrt_prompt *p, int64_t row, int64_t n_rows,
                                   int64_t src_row, struct mmrt_error *err)
{
    struct mmrt_prompt_splice *g = realloc(p->splices,
                                           (size_t)(p->n_splices + 1) * sizeof *g);
    if (!g)
        return mmrt_error_set(err, MMRT_ERR_NO_MEMORY, "prompt: out of memory");
    g[p->n_splices++] = (struct mmrt_prompt_splice){ row, n_rows, src_row };
    p->splices = g;
    return MMRT_OK;
}

mmrt_status mmrt_prompt_add_grid(struct mmrt_prompt *p, int64_t row, int64_t h, int64_t w,
                                 int64_t stride, struct mmrt_error *err)
{
    /* Image-token KV compression divides by a grid's sides and walks its rows by stride: a
     * grid that breaks model.h's rule is a model's bug, refused before it is kept. */
    if (h < 1 || w < 1 || stride < w)
        return mmrt_error_set(err, MMRT_ERR_INVALID_ARG,
                              "prompt: image grid at row %" PRId64 " is %" PRId64 " x %" PRId64
                              " with stride %" PRId64 " (sides at least 1, width at most the "
                              "stride)",
                              row, h, w, stride);
    struct mmrt_prompt_grid *g = realloc(p->grids, (size_t)(p->n_grids + 1) * sizeof *g);
    if (!g)
        return mmrt_error_set(err, MMRT_ERR_NO_MEMORY, "prompt: out of memory");
    g[p->n_grids++] = (struct mmrt_prompt_grid){ row, h, w, stride };
    p->grids = g;
    return MMRT_OK;
}

const char *mmrt_request_image_name(const struct mmrt_request *req, int i, char *buf,
                                    size_t size)
{
    const struct mmrt_image_input *im = &req->images[i];
    if (im->path)
        return im->path;
    snprintf(buf, size, "image %d (%zu bytes in memory)", i, im->size);
    return buf;
}

void mmrt_model_image_limits(const struct mmrt_model_options *opts,
                             struct mmrt_image_limits *out)
{
    mmrt_image_limits_default(out);
    out->apply_exif_orientation = opts && opts->exif_orientation == MMRT_EXIF_APPLY;
}

mmrt_status mmrt_request_image_load(const struct mmrt_request *req, int i,
                                    const struct mmrt_image_limits *limits,
                                    struct mmrt_image **out, struct mmrt_error *err)
{
    const struct mmrt_image_input *im = &req->images[i];
    if (!im->data)
        return mmrt_image_load_file(im->path, limits, out, err);
    /* Bytes, and for the vision cache's requests also a path: the file's bytes as read when
     * its key was computed, named by the path (as mmrt_image_load_file names them). */
    char buf[64];
    const char *what = mmrt_request_image_name(req, i, buf, sizeof buf);
    return mmrt_image_decode(im->data, im->size, what, limits, out, err);
}
