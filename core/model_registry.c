/* core/model_registry.c — the model types this build knows, by config.json model_type. */
#include <stdlib.h>
#include <string.h>

#include "model.h"

extern const struct mmrt_model_type mmrt_fuyu_model_type;
extern const struct mmrt_model_type mmrt_llava_model_type;
extern const struct mmrt_model_type mmrt_llava_next_model_type;

static const struct mmrt_model_type *const model_types[] = {
    &mmrt_fuyu_model_type,
    &mmrt_llava_model_type,
    &mmrt_llava_next_model_type,
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
    return "fuyu, llava, llava_next";
}

void mmrt_vision_output_free(struct mmrt_vision_output *v)
{
    if (!v)
        return;
    free(v->features);
    v->features = NULL;
}
