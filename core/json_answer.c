/*
 * core/json_answer.c — see json_answer.h.
 */
#include "json_answer.h"

#include <math.h>
#include <string.h>

static const char FFFD[3] = { (char)0xef, (char)0xbf, (char)0xbd };

void mmrt_json_answer_init(struct mmrt_json_answer *a)
{
    mmrt_json_grammar_init(&a->grammar, true);
    memset(&a->run, 0, sizeof a->run);
    a->run_bad = false;
}

/* Ends the run of byte tokens (a token that is not a byte came). */
static void end_run(struct mmrt_json_answer *a)
{
    memset(&a->run, 0, sizeof a->run);
    a->run_bad = false;
}

/* Byte b joins the run; whether the stream shows it as itself: an ASCII byte in a run that
 * is valid with no character pending. Anything else reads as U+FFFD, or as part of a
 * character a string holds. */
static bool byte_is_itself(struct mmrt_json_answer *a, unsigned char b)
{
    if (a->run_bad)
        return false;
    unsigned held;
    const bool clean = a->run.n == 0;
    switch (mmrt_utf8_feed(&a->run, b, &held)) {
    case MMRT_UTF8_BAD:
        a->run_bad = true; /* ByteFallback: every byte of the run reads U+FFFD */
        return false;
    case MMRT_UTF8_CHAR:
        a->run.n = 0;
        return clean && b < 0x80;
    default:
        return false;
    }
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
        end_run(next); /* not a byte token */
        return true;
    }
    const int b = t->byte[id];
    if (b >= 0) {
        if (byte_is_itself(next, (unsigned char)b)) {
            const char c = (char)b;
            return mmrt_json_grammar_feed(&next->grammar, &c, 1);
        }
        return mmrt_json_grammar_feed(&next->grammar, FFFD, sizeof FFFD);
    }
    end_run(next);
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
