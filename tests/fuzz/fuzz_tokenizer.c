/*
 * tests/fuzz/fuzz_tokenizer.c — libFuzzer target for core/formats/tokenizer*.c.
 *
 * The input is a tokenizer.json, optionally followed by "\n#TEXT#\n" and a text to encode.
 * A refused file must come with a one-line message and no tokenizer. An accepted one is
 * exercised: the text (when it is UTF-8) is encoded with every flag combination, the ids are
 * decoded whole and streamed, and so are a few ids derived from the input bytes. Invariants
 * checked with __builtin_trap(): every id inside the vocabulary; decoded text is valid UTF-8
 * (byte tokens that do not form characters become U+FFFD); the stream equals the whole
 * decode for ids produced by encode, unless they hold a run of <0xNN> pieces that is not
 * UTF-8 as a whole (possible when the unknown token is itself such a piece: HF then turns
 * every byte of the run into U+FFFD, which a stream cannot do for bytes it already gave).
 *
 * The same entry point is linked into the normal build with replay_main.c, so the
 * committed corpus (tests/fuzz/corpus/tokenizer) runs as a ctest everywhere.
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "formats/json.h"
#include "formats/tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char SEP[] = "\n#TEXT#\n";

static bool utf8_ok(const char *s, size_t n)
{
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        unsigned c = u[i];
        size_t l = c < 0x80 ? 1 : c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3 :
                   c >= 0xF0 && c <= 0xF4 ? 4 : 0;
        if (l == 0 || i + l > n)
            return false;
        unsigned lo = 0x80, hi = 0xBF;
        if (c == 0xE0) lo = 0xA0;
        if (c == 0xED) hi = 0x9F;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F;
        if (l > 1 && (u[i + 1] < lo || u[i + 1] > hi))
            return false;
        for (size_t k = 2; k < l; k++)
            if (u[i + k] < 0x80 || u[i + k] > 0xBF)
                return false;
        i += l;
    }
    return true;
}

/* The byte of a "<0xNN>" piece, -1 for another piece, -2 for one that only looks like it
 * (the target then does not know what the decoder makes of it). */
static int byte_piece(const char *p, size_t n)
{
    if (n != 6 || memcmp(p, "<0x", 3) != 0 || p[5] != '>')
        return -1;
    int v = 0;
    for (int i = 3; i < 5; i++) {
        const char c = p[i];
        const int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 :
                      c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0)
            return -2;
        v = v * 16 + d;
    }
    return v;
}

/* Whether every run of byte pieces among the ids a decode keeps is UTF-8 as a whole. */
static bool byte_runs_valid(const struct mmrt_tokenizer *tok, const int32_t *ids, size_t n,
                            bool skip_special)
{
    char run[4096];
    size_t rn = 0;
    for (size_t i = 0; i <= n; i++) {
        int b = -1;
        if (i < n) {
            if (skip_special && mmrt_tokenizer_is_special(tok, ids[i]))
                continue;
            size_t len = 0;
            const char *p = mmrt_tokenizer_id_to_token(tok, ids[i], &len);
            b = p ? byte_piece(p, len) : -1;
            if (b == -2)
                return false;
        }
        if (b >= 0 && rn < sizeof run) {
            run[rn++] = (char)b;
            continue;
        }
        if (b >= 0 || (rn && !utf8_ok(run, rn)))
            return false; /* a run too long to check counts as unknown */
        rn = 0;
    }
    return true;
}

static void decode_both(const struct mmrt_tokenizer *tok, const int32_t *ids, size_t n,
                        unsigned flags, bool must_match)
{
    struct mmrt_error err = {0};
    char *whole = NULL;
    size_t wl = 0;
    if (mmrt_tokenizer_decode(tok, ids, n, flags, &whole, &wl, &err) != MMRT_OK)
        return; /* out of memory only */
    if (!utf8_ok(whole, wl) || whole[wl] != '\0')
        __builtin_trap();
    struct mmrt_tokenizer_stream *s = NULL;
    if (mmrt_tokenizer_stream_create(tok, flags, &s, &err) == MMRT_OK) {
        size_t at = 0;
        bool same = true;
        for (size_t i = 0; i <= n; i++) {
            const char *c;
            size_t cl;
            mmrt_status st = i < n ? mmrt_tokenizer_decode_stream(s, ids[i], &c, &cl, &err)
                                   : mmrt_tokenizer_stream_finish(s, &c, &cl, &err);
            if (st != MMRT_OK)
                break;
            if (!utf8_ok(c, cl))
                __builtin_trap();
            same = same && at + cl <= wl && memcmp(whole + at, c, cl) == 0;
            at += cl;
        }
        if (must_match && (!same || at != wl))
            __builtin_trap();
        mmrt_tokenizer_stream_destroy(s);
    }
    free(whole);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *in = (const char *)data;
    const char *sep = memmem(in, size, SEP, sizeof SEP - 1);
    size_t jn = sep ? (size_t)(sep - in) : size;
    const char *text = sep ? sep + sizeof SEP - 1 : "";
    size_t tn = sep ? size - jn - (sizeof SEP - 1) : 0;

    struct mmrt_error err = {0};
    json_t *root = NULL;
    if (mmrt_json_parse(in, jn, "fuzz", 0, &root, &err) != MMRT_OK)
        return 0;
    struct mmrt_tokenizer_limits lim = {.max_vocab = 1u << 16, .max_merges = 1u << 16,
                                        .max_input_bytes = 1u << 16};
    struct mmrt_tokenizer *tok = NULL;
    mmrt_status st = mmrt_tokenizer_load_json(root, "fuzz", &lim, &tok, &err);
    json_decref(root);
    if (st != MMRT_OK) {
        size_t len = strnlen(err.msg, sizeof err.msg);
        if (tok != NULL || len == 0 || len == sizeof err.msg || memchr(err.msg, '\n', len))
            __builtin_trap();
        return 0;
    }
    uint32_t nv = mmrt_tokenizer_vocab_size(tok);
    for (unsigned flags = 0; flags < 4; flags++) {
        int32_t *ids = NULL;
        size_t n = 0;
        st = mmrt_tokenizer_encode(tok, text, tn, flags, &ids, &n, &err);
        if (st != MMRT_OK) {
            if (ids != NULL || memchr(err.msg, '\n', strnlen(err.msg, sizeof err.msg)))
                __builtin_trap();
            continue;
        }
        for (size_t i = 0; i < n; i++)
            if (ids[i] < 0 || (uint32_t)ids[i] >= nv)
                __builtin_trap();
        /* With every byte run valid the stream must match the whole decode exactly. */
        decode_both(tok, ids, n, flags & 1 ? MMRT_DECODE_SKIP_SPECIAL : 0,
                    byte_runs_valid(tok, ids, n, flags & 1));
        free(ids);
    }
    /* Arbitrary ids (some out of range) from the input bytes. */
    int32_t raw[64];
    size_t nr = 0;
    for (size_t i = 0; i + 1 < jn && nr < 64; i += 2)
        raw[nr++] = (int32_t)(((uint8_t)in[i] << 8 | (uint8_t)in[i + 1]) % (nv + 2)) - 1;
    decode_both(tok, raw, nr, 0, false);
    size_t len;
    for (uint32_t id = 0; id < nv && id < 512; id++) {
        const char *s = mmrt_tokenizer_id_to_token(tok, (int32_t)id, &len);
        if (!s || mmrt_tokenizer_token_to_id(tok, s, len) != (int32_t)id)
            __builtin_trap();
    }
    mmrt_tokenizer_destroy(tok);
    return 0;
}
