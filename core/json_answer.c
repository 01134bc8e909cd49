/*
 * core/json_answer.c — see json_answer.h.
 */
#include "json_answer.h"

#include <math.h>
#include <string.h>

static const char FFFD[3] = { (char)0xef, (char)0xbf, (char)0xbd };

void mmrt_json_answer_init(struct mmrt_json_answer *a, const struct mmrt_json_schema *schema)
{
    mmrt_json_grammar_init(&a->grammar, schema);
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

/* mmrt_json_answer_fits, with free_text = mmrt_json_grammar_in_string(&a->grammar): in free
 * text (a string with nothing left to count) any character fits, U+FFFD too. */
static bool fits(const struct mmrt_json_answer *a, const struct mmrt_token_texts *t,
                 const uint8_t *plain, int32_t id, bool free_text, struct mmrt_json_answer *next)
{
    if (id < 0 || (uint32_t)id >= t->n || t->special[id])
        return false;
    mmrt_json_answer_copy(next, a);
    if (plain && plain[id] && free_text) {
        end_run(next); /* not a byte token */
        return true;
    }
    const int b = t->byte[id];
    if (b >= 0 && free_text) {
        if (byte_is_itself(next, (unsigned char)b)) {
            const char c = (char)b;
            return mmrt_json_grammar_feed(&next->grammar, &c, 1);
        }
        return mmrt_json_grammar_feed(&next->grammar, FFFD, sizeof FFFD);
    }
    if (b >= 0) {
        /* Anywhere the bytes count (a string's length, a literal's spelling, the
         * structure), a run of byte tokens must stay valid UTF-8, and its bytes are fed as
         * they are: the reader sees the characters they make. */
        unsigned held;
        if (next->run_bad)
            return false;
        switch (mmrt_utf8_feed(&next->run, (unsigned char)b, &held)) {
        case MMRT_UTF8_BAD: return false;
        case MMRT_UTF8_CHAR: next->run.n = 0; break;
        default: break;
        }
        const char c = (char)b;
        return mmrt_json_grammar_feed(&next->grammar, &c, 1);
    }
    /* A character of byte tokens left unfinished would read as U+FFFD, counted or spelled
     * as nothing the grammar was fed. */
    if (!free_text && next->run.n != 0)
        return false;
    end_run(next);
    const uint32_t at = t->off[id], len = t->off[id + 1] - at;
    return len > 0 && mmrt_json_grammar_feed(&next->grammar, t->blob + at, len);
}

bool mmrt_json_answer_fits(const struct mmrt_json_answer *a, const struct mmrt_token_texts *t,
                           const uint8_t *plain, int32_t id, struct mmrt_json_answer *next)
{
    return fits(a, t, plain, id, mmrt_json_grammar_in_string(&a->grammar), next);
}

bool mmrt_json_answer_mask(const struct mmrt_json_answer *a, const struct mmrt_token_texts *t,
                           const uint8_t *plain, const float *logits, int64_t vocab,
                           float *masked)
{
    bool any = false;
    struct mmrt_json_answer next;
    /* Inside a string the plain tokens fit whatever they are: a flag each, no call. */
    const bool free_text = mmrt_json_grammar_in_string(&a->grammar);
    const uint8_t *quick = plain && free_text ? plain : NULL;
    for (int64_t i = 0; i < vocab; i++) {
        if (quick && i < (int64_t)t->n && quick[i]) {
            masked[i] = logits[i];
            any |= isfinite(logits[i]);
            continue;
        }
        const bool ok = fits(a, t, plain, (int32_t)i, free_text, &next);
        masked[i] = ok ? logits[i] : -INFINITY;
        any |= ok && isfinite(logits[i]);
    }
    return any;
}

bool mmrt_json_answer_done(const struct mmrt_json_answer *a)
{
    return mmrt_json_grammar_done(&a->grammar);
}
