/*
 * core/json_answer.c — see json_answer.h.
 */
#include "json_answer.h"

#include <math.h>

static const char FFFD[3] = { (char)0xef, (char)0xbf, (char)0xbd };

void mmrt_json_answer_init(struct mmrt_json_answer *a)
{
    mmrt_json_grammar_init(&a->grammar, true);
    a->need = 0;
    a->lo = 0x80;
    a->hi = 0xbf;
}

/* The run after byte b (a->need, lo, hi updated). */
static void run_after(struct mmrt_json_answer *a, int b)
{
    if (a->need < 0)
        return;
    if (a->need > 0) {
        a->need = b < a->lo || b > a->hi ? -1 : (int8_t)(a->need - 1);
        a->lo = 0x80;
        a->hi = 0xbf;
        return;
    }
    if (b < 0x80)
        return;
    a->need = b >= 0xc2 && b <= 0xdf ? 1 : b >= 0xe0 && b <= 0xef ? 2
              : b >= 0xf0 && b <= 0xf4 ? 3 : -1;
    a->lo = b == 0xe0 ? 0xa0 : b == 0xf0 ? 0x90 : 0x80;
    a->hi = b == 0xed ? 0x9f : b == 0xf4 ? 0x8f : 0xbf;
}

void mmrt_json_answer_plain(const struct mmrt_token_texts *t, uint8_t *plain)
{
    for (uint32_t id = 0; id < t->n; id++) {
        const char *p = t->blob + t->off[id];
        const uint32_t len = t->off[id + 1] - t->off[id];
        bool ok = len > 0 && !t->special[id] && t->byte[id] < 0;
        for (uint32_t i = 0; ok && i < len; i++)
            ok = (unsigned char)p[i] >= 0x20 && p[i] != '"' && p[i] != '\\';
        plain[id] = ok;
    }
}

bool mmrt_json_answer_fits(const struct mmrt_json_answer *a, const struct mmrt_token_texts *t,
                           const uint8_t *plain, int32_t id, struct mmrt_json_answer *next)
{
    if (id < 0 || (uint32_t)id >= t->n || t->special[id])
        return false;
    *next = *a;
    if (plain && plain[id] && mmrt_json_grammar_in_string(&a->grammar)) {
        next->need = 0; /* not a byte token: the run, if any, ends */
        next->lo = 0x80;
        next->hi = 0xbf;
        return true;
    }
    const int b = t->byte[id];
    if (b >= 0) {
        const bool clean = a->need == 0;
        run_after(next, b);
        if (b < 0x80 && clean && next->need == 0) {
            const char c = (char)b;
            return mmrt_json_grammar_feed(&next->grammar, &c, 1);
        }
        return mmrt_json_grammar_feed(&next->grammar, FFFD, sizeof FFFD);
    }
    next->need = 0;
    next->lo = 0x80;
    next->hi = 0xbf;
    const uint32_t at = t->off[id], len = t->off[id + 1] - at;
    return len > 0 && mmrt_json_grammar_feed(&next->grammar, t->blob + at, len);
}

bool mmrt_json_answer_mask(const struct mmrt_json_answer *a, const struct mmrt_token_texts *t,
                           const uint8_t *plain, const float *logits, int64_t vocab,
                           float *masked)
{
    bool any = false;
    struct mmrt_json_answer next;
    /* Inside a string the plain tokens fit whatever they are: a flag each, no call. */
    const uint8_t *quick = plain && mmrt_json_grammar_in_string(&a->grammar) ? plain : NULL;
    for (int64_t i = 0; i < vocab; i++) {
        if (quick && i < (int64_t)t->n && quick[i]) {
            masked[i] = logits[i];
            any |= isfinite(logits[i]);
            continue;
        }
        const bool fits = mmrt_json_answer_fits(a, t, plain, (int32_t)i, &next);
        masked[i] = fits ? logits[i] : -INFINITY;
        any |= fits && isfinite(logits[i]);
    }
    return any;
}

bool mmrt_json_answer_done(const struct mmrt_json_answer *a)
{
    return mmrt_json_grammar_done(&a->grammar);
}
