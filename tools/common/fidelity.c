/* tools/common/fidelity.c — next-token fidelity between two runs (fidelity.h). */
#include "fidelity.h"

#include <math.h>

void fidelity_softmax(const float *logits, int64_t vocab, float *p)
{
    double mx = -INFINITY, sum = 0;
    for (int64_t v = 0; v < vocab; v++)
        mx = logits[v] > mx ? logits[v] : mx;
    for (int64_t v = 0; v < vocab; v++)
        sum += exp((double)logits[v] - mx);
    for (int64_t v = 0; v < vocab; v++)
        p[v] = (float)(exp((double)logits[v] - mx) / sum);
}

void fidelity_add(struct fidelity_sum *f, const float *ref_p, const int32_t *ref_ids,
                  const float *p, const int32_t *ids, int steps, int64_t vocab)
{
    for (int s = 0; s < steps && ref_ids[s] >= 0 && ids[s] >= 0; s++) {
        const float *r = ref_p + (int64_t)s * vocab, *q = p + (int64_t)s * vocab;
        for (int64_t v = 0; v < vocab; v++)
            if (r[v] > 0)
                f->kl += r[v] * (log((double)r[v]) - log(q[v] > 1e-30f ? (double)q[v] : 1e-30));
        f->same += ids[s] == ref_ids[s];
        f->positions++;
        if (ids[s] != ref_ids[s])
            break;
    }
}
