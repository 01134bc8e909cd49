/*
 * tools/common/fidelity.h — how far a model's next-token predictions move when something is
 * changed (quantized weights, a compressed KV cache), measured the same way by every tool
 * that reports it (mmrt-quantize --report, mmrt-image-kv-eval).
 *
 * Both runs answer the same requests greedily; a step is compared while the two answers so
 * far are the same tokens (the step where they part counts, the ones after it do not: their
 * contexts differ). Per compared step: KL(reference ‖ candidate) of the next-token
 * distributions, and whether the chosen tokens agree.
 */
#ifndef MMRT_TOOLS_FIDELITY_H
#define MMRT_TOOLS_FIDELITY_H

#include <stdint.h>

/* p = softmax(logits) over vocab entries, in double, stored as float. */
void fidelity_softmax(const float *logits, int64_t vocab, float *p);

struct fidelity_sum {
    double kl;     /* summed over the compared steps */
    int same;      /* steps whose tokens agree */
    int positions; /* steps compared */
};

/* Adds one request's pair of answers: probabilities [steps][vocab] and token ids [steps]
 * (−1 past an answer's end) of the reference and of the candidate. */
void fidelity_add(struct fidelity_sum *f, const float *ref_p, const int32_t *ref_ids,
                  const float *p, const int32_t *ids, int steps, int64_t vocab);

#endif
