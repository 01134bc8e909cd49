/*
 * core/formats/tokenizer_decode.c — the decoder chain, as a stream.
 *
 * HF's decoders map a list of token strings to a list of strings (Replace, Strip and
 * Metaspace per token, ByteFallback merging runs of <0xNN> tokens, Fuse joining all, ByteLevel
 * turning everything into bytes and decoding them lossily), then join the result. Here every
 * step is a small transducer fed events — BEGIN a token, DATA (part of its text), END it,
 * FINISH the stream — and passing events on to the next step; the last step appends DATA to
 * the output. A whole decode is the same chain fed all ids and FINISH, so streamed and full
 * output cannot drift apart. What each step holds back, and why it is bounded:
 *   Replace      the tail that could still be the start of the pattern (< pattern length);
 *   ByteFallback up to 6 bytes while a token could still be "<0xNN>"; the incomplete UTF-8
 *                of a byte run (< 4 bytes) — or, for a whole decode (exact mode), the run,
 *                because HF turns every byte of an invalid run into U+FFFD;
 *   Strip        a count of trailing `content` characters (<= stop);
 *   ByteLevel    one token (it decides per token whether all its characters map to bytes)
 *                plus the incomplete UTF-8 of the byte stream (< 4 bytes);
 *   Fuse, Metaspace  nothing.
 * After Fuse (or ByteLevel) the whole rest of the stream is one token, so a later ByteLevel
 * would hold everything back: that order is refused at load (no real file uses it).
 *
 * Sources: huggingface/tokenizers decoders/{byte_fallback,fuse,strip,sequence}.rs,
 * normalizers/replace.rs (Decoder impl), pre_tokenizers/{byte_level,metaspace}.rs.
 */
#include "tokenizer_impl.h"

#include <stdlib.h>
#include <string.h>

static const char FFFD[3] = {(char)0xEF, (char)0xBF, (char)0xBD};

enum ev { EV_BEGIN, EV_DATA, EV_END, EV_FINISH };

struct step_state {
    struct tk_buf buf;       /* Replace tail, ByteFallback candidate, ByteLevel token, Strip out */
    struct tk_buf run;       /* ByteFallback exact mode: the current run */
    struct mmrt_utf8_acc acc;  /* incomplete character (ByteFallback run, ByteLevel) */
    bool open;               /* Fuse / ByteLevel: output token begun; ByteFallback: run token */
    bool pass;               /* ByteFallback: current token is not a byte token */
    bool run_bad;            /* ByteFallback streaming: run already invalid */
    bool lead;               /* Strip: still inside the first `start` characters */
    size_t idx, held;        /* Strip: characters seen / held; Metaspace: token index */
};

struct mmrt_tokenizer_stream {
    const struct mmrt_tokenizer *t;
    unsigned flags;
    bool exact;      /* whole decode: ByteFallback holds entire runs (HF's U+FFFD rule) */
    bool any_token;  /* no decoder: tokens are joined with spaces */
    struct step_state st[TK_MAX_STEPS];
    struct tk_buf out;
};

static mmrt_status emit(struct mmrt_tokenizer_stream *s, int k, enum ev ev, const char *p,
                        size_t n, struct mmrt_error *err);

static mmrt_status data(struct mmrt_tokenizer_stream *s, int k, const char *p, size_t n,
                        struct mmrt_error *err)
{
    return n ? emit(s, k, EV_DATA, p, n, err) : MMRT_OK;
}

/* A whole token: BEGIN, DATA, END. */
static mmrt_status token(struct mmrt_tokenizer_stream *s, int k, const char *p, size_t n,
                         struct mmrt_error *err)
{
    mmrt_status st = emit(s, k, EV_BEGIN, NULL, 0, err);
    if (st == MMRT_OK)
        st = data(s, k, p, n, err);
    if (st == MMRT_OK)
        st = emit(s, k, EV_END, NULL, 0, err);
    return st;
}

/* ---- Replace --------------------------------------------------------------------------- */

/* Emits buf's text with the pattern replaced, keeping back a tail that could begin a match
 * (all of it when `final`). */
static mmrt_status replace_flush(struct mmrt_tokenizer_stream *s, int k, bool final,
                                 struct mmrt_error *err)
{
    const struct tk_dec *d = &s->t->dec[k];
    struct tk_buf *b = &s->st[k].buf;
    size_t i = 0;
    mmrt_status st;
    for (;;) {
        const char *hit = d->alen <= b->n - i ? memmem(b->p + i, b->n - i, d->a, d->alen) : NULL;
        if (!hit)
            break;
        size_t at = (size_t)(hit - b->p);
        if ((st = data(s, k + 1, b->p + i, at - i, err)) != MMRT_OK ||
            (st = data(s, k + 1, d->b, d->blen, err)) != MMRT_OK)
            return st;
        i = at + d->alen;
    }
    size_t keep = b->n;
    if (!final) {
        size_t from = b->n - i >= d->alen ? b->n - d->alen + 1 : i;
        for (size_t j = from; j < b->n; j++) {
            if (memcmp(b->p + j, d->a, b->n - j) == 0) {
                keep = j;
                break;
            }
        }
    }
    if ((st = data(s, k + 1, b->p + i, keep - i, err)) != MMRT_OK)
        return st;
    memmove(b->p, b->p + keep, b->n - keep);
    b->n -= keep;
    return MMRT_OK;
}

static mmrt_status step_replace(struct mmrt_tokenizer_stream *s, int k, enum ev ev,
                                const char *p, size_t n, struct mmrt_error *err)
{
    struct step_state *ss = &s->st[k];
    mmrt_status st;
    switch (ev) {
    case EV_BEGIN:
        ss->buf.n = 0;
        return emit(s, k + 1, EV_BEGIN, NULL, 0, err);
    case EV_DATA:
        if ((st = tk_buf_put(&ss->buf, p, n, err)) != MMRT_OK)
            return st;
        return replace_flush(s, k, false, err);
    case EV_END:
        if ((st = replace_flush(s, k, true, err)) != MMRT_OK)
            return st;
        return emit(s, k + 1, EV_END, NULL, 0, err);
    default:
        return emit(s, k + 1, ev, NULL, 0, err);
    }
}

/* ---- ByteFallback ---------------------------------------------------------------------- */

/* HF's test: 6 bytes, "<0x", '>', and Rust's u8::from_str_radix on the middle two (which
 * also takes a leading '+'). Load refused malformed vocab tokens, but the decoder's rule is
 * the one HF applies to whatever string it sees. */
static int byte_token(const char *p, size_t n)
{
    if (n != 6 || memcmp(p, "<0x", 3) != 0 || p[5] != '>')
        return -1;
    int v = 0;
    for (int i = 3; i < 5; i++) {
        char c = p[i];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 :
                c >= 'A' && c <= 'F' ? c - 'A' + 10 : (i == 3 && c == '+') ? 0 : -1;
        if (d < 0)
            return -1;
        v = v * 16 + d;
    }
    return v;
}

static mmrt_status fffd_tokens(struct mmrt_tokenizer_stream *s, int k, size_t count,
                               struct mmrt_error *err)
{
    for (size_t i = 0; i < count; i++) {
        mmrt_status st = token(s, k + 1, FFFD, sizeof FFFD, err);
        if (st != MMRT_OK)
            return st;
    }
    return MMRT_OK;
}

/* Ends the current run of byte tokens (a non-byte token follows, or the stream ends). */
static mmrt_status run_flush(struct mmrt_tokenizer_stream *s, int k, struct mmrt_error *err)
{
    struct step_state *ss = &s->st[k];
    mmrt_status st = MMRT_OK;
    if (s->exact) {
        if (ss->run.n) {
            if (tk_utf8_valid(ss->run.p, ss->run.n, NULL))
                st = token(s, k + 1, ss->run.p, ss->run.n, err);
            else
                st = fffd_tokens(s, k, ss->run.n, err);
        }
        ss->run.n = 0;
        return st;
    }
    size_t pending = ss->acc.n;
    ss->acc.n = 0;
    if (ss->open)
        st = emit(s, k + 1, EV_END, NULL, 0, err);
    ss->open = false;
    ss->run_bad = false;
    if (st == MMRT_OK && pending) /* the run ended inside a character: invalid */
        st = fffd_tokens(s, k, pending, err);
    return st;
}

static mmrt_status run_byte(struct mmrt_tokenizer_stream *s, int k, unsigned char b,
                            struct mmrt_error *err)
{
    struct step_state *ss = &s->st[k];
    if (s->exact)
        return tk_buf_put(&ss->run, &b, 1, err);
    if (ss->run_bad)
        return fffd_tokens(s, k, 1, err);
    unsigned held = ss->acc.n, bad;
    mmrt_status st = MMRT_OK;
    switch (mmrt_utf8_feed(&ss->acc, b, &bad)) {
    case MMRT_UTF8_MORE:
        return MMRT_OK;
    case MMRT_UTF8_CHAR:
        if (!ss->open && (st = emit(s, k + 1, EV_BEGIN, NULL, 0, err)) != MMRT_OK)
            return st;
        ss->open = true;
        st = data(s, k + 1, (const char *)ss->acc.b, ss->acc.n, err);
        ss->acc.n = 0;
        return st;
    case MMRT_UTF8_BAD:
    default:
        /* HF: the whole run becomes one U+FFFD per byte. What was emitted stays; the held
         * bytes, this one and every later byte of the run become U+FFFD. */
        ss->acc.n = 0;
        ss->run_bad = true;
        if (ss->open && (st = emit(s, k + 1, EV_END, NULL, 0, err)) != MMRT_OK)
            return st;
        ss->open = false;
        return fffd_tokens(s, k, held + 1, err);
    }
}

static mmrt_status step_bytefallback(struct mmrt_tokenizer_stream *s, int k, enum ev ev,
                                     const char *p, size_t n, struct mmrt_error *err)
{
    struct step_state *ss = &s->st[k];
    mmrt_status st;
    switch (ev) {
    case EV_BEGIN:
        ss->buf.n = 0;
        ss->pass = false;
        return MMRT_OK;
    case EV_DATA:
        if (ss->pass)
            return data(s, k + 1, p, n, err);
        if ((st = tk_buf_put(&ss->buf, p, n, err)) != MMRT_OK)
            return st;
        if (ss->buf.n <= 6 &&
            memcmp(ss->buf.p, "<0x", ss->buf.n < 3 ? ss->buf.n : 3) == 0)
            return MMRT_OK; /* could still be a byte token */
        ss->pass = true;
        if ((st = run_flush(s, k, err)) != MMRT_OK ||
            (st = emit(s, k + 1, EV_BEGIN, NULL, 0, err)) != MMRT_OK)
            return st;
        return data(s, k + 1, ss->buf.p, ss->buf.n, err);
    case EV_END: {
        if (ss->pass)
            return emit(s, k + 1, EV_END, NULL, 0, err);
        int v = byte_token(ss->buf.p, ss->buf.n);
        if (v >= 0)
            return run_byte(s, k, (unsigned char)v, err);
        if ((st = run_flush(s, k, err)) != MMRT_OK)
            return st;
        return token(s, k + 1, ss->buf.p, ss->buf.n, err);
    }
    default:
        if ((st = run_flush(s, k, err)) != MMRT_OK)
            return st;
        return emit(s, k + 1, ev, NULL, 0, err);
    }
}

/* ---- Fuse ------------------------------------------------------------------------------ */

static mmrt_status step_fuse(struct mmrt_tokenizer_stream *s, int k, enum ev ev, const char *p,
                             size_t n, struct mmrt_error *err)
{
    struct step_state *ss = &s->st[k];
    mmrt_status st;
    switch (ev) {
    case EV_BEGIN:
        if (ss->open)
            return MMRT_OK;
        ss->open = true;
        return emit(s, k + 1, EV_BEGIN, NULL, 0, err);
    case EV_DATA:
        return data(s, k + 1, p, n, err);
    case EV_END:
        return MMRT_OK;
    default:
        if (ss->open && (st = emit(s, k + 1, EV_END, NULL, 0, err)) != MMRT_OK)
            return st;
        ss->open = false;
        return emit(s, k + 1, ev, NULL, 0, err);
    }
}

/* ---- Strip ----------------------------------------------------------------------------- */

static mmrt_status step_strip(struct mmrt_tokenizer_stream *s, int k, enum ev ev, const char *p,
                              size_t n, struct mmrt_error *err)
{
    const struct tk_dec *d = &s->t->dec[k];
    struct step_state *ss = &s->st[k];
    mmrt_status st;
    char c8[4];
    size_t cl = tk_utf8_encode(d->cp, c8);
    switch (ev) {
    case EV_BEGIN:
        ss->idx = 0;
        ss->held = 0;
        ss->lead = true;
        return emit(s, k + 1, EV_BEGIN, NULL, 0, err);
    case EV_DATA:
        ss->buf.n = 0;
        for (size_t i = 0; i < n;) {
            uint32_t cp;
            size_t l = tk_utf8_decode(p + i, &cp);
            if (ss->lead && ss->idx < d->start && cp == d->cp) {
                ss->idx++;
                i += l;
                continue;
            }
            ss->lead = false;
            if (d->stop > 0 && cp == d->cp) {
                /* Could be part of the trailing run HF strips; hold up to `stop`. */
                if (++ss->held > d->stop) {
                    ss->held--;
                    if ((st = tk_buf_put(&ss->buf, c8, cl, err)) != MMRT_OK)
                        return st;
                }
            } else {
                for (; ss->held; ss->held--)
                    if ((st = tk_buf_put(&ss->buf, c8, cl, err)) != MMRT_OK)
                        return st;
                if ((st = tk_buf_put(&ss->buf, p + i, l, err)) != MMRT_OK)
                    return st;
            }
            i += l;
        }
        return data(s, k + 1, ss->buf.p, ss->buf.n, err);
    case EV_END:
        ss->held = 0; /* the trailing run (<= stop) is what HF strips */
        return emit(s, k + 1, EV_END, NULL, 0, err);
    default:
        return emit(s, k + 1, ev, NULL, 0, err);
    }
}

/* ---- ByteLevel ------------------------------------------------------------------------- */

/* Feeds bytes to the lossy UTF-8 decoder (Rust's from_utf8_lossy, incrementally). */
static mmrt_status lossy_bytes(struct mmrt_tokenizer_stream *s, int k, const unsigned char *b,
                               size_t n, struct mmrt_error *err)
{
    struct step_state *ss = &s->st[k];
    mmrt_status st;
    struct tk_buf *o = &ss->run; /* output scratch */
    o->n = 0;
    for (size_t i = 0; i < n;) {
        bool fresh = ss->acc.n == 0;
        unsigned bad;
        switch (mmrt_utf8_feed(&ss->acc, b[i], &bad)) {
        case MMRT_UTF8_MORE:
            i++;
            break;
        case MMRT_UTF8_CHAR:
            if ((st = tk_buf_put(o, ss->acc.b, ss->acc.n, err)) != MMRT_OK)
                return st;
            ss->acc.n = 0;
            i++;
            break;
        case MMRT_UTF8_BAD:
        default:
            /* One U+FFFD per maximal invalid subpart; a byte that broke a held prefix
             * starts over. */
            if ((st = tk_buf_put(o, FFFD, sizeof FFFD, err)) != MMRT_OK)
                return st;
            if (fresh)
                i++;
            break;
        }
    }
    return data(s, k + 1, o->p, o->n, err);
}

static mmrt_status step_bytelevel(struct mmrt_tokenizer_stream *s, int k, enum ev ev,
                                  const char *p, size_t n, struct mmrt_error *err)
{
    const struct mmrt_tokenizer *t = s->t;
    struct step_state *ss = &s->st[k];
    mmrt_status st;
    switch (ev) {
    case EV_BEGIN:
        ss->buf.n = 0;
        if (ss->open)
            return MMRT_OK;
        ss->open = true; /* HF returns a single string for all tokens */
        return emit(s, k + 1, EV_BEGIN, NULL, 0, err);
    case EV_DATA:
        return tk_buf_put(&ss->buf, p, n, err);
    case EV_END: {
        /* All characters in the byte alphabet: their bytes; otherwise the raw UTF-8. */
        size_t w = 0;
        bool mapped = true;
        for (size_t i = 0; i < ss->buf.n && mapped;) {
            uint32_t cp;
            size_t l = tk_utf8_decode(ss->buf.p + i, &cp);
            mapped = cp < 0x144 && t->bl_dec[cp] >= 0;
            i += l;
        }
        if (mapped) {
            for (size_t i = 0; i < ss->buf.n;) {
                uint32_t cp;
                i += tk_utf8_decode(ss->buf.p + i, &cp);
                ss->buf.p[w++] = (char)t->bl_dec[cp];
            }
        } else {
            w = ss->buf.n;
        }
        return lossy_bytes(s, k, (const unsigned char *)ss->buf.p, w, err);
    }
    default:
        if (ss->acc.n) {
            ss->acc.n = 0;
            if ((st = data(s, k + 1, FFFD, sizeof FFFD, err)) != MMRT_OK)
                return st;
        }
        if (ss->open && (st = emit(s, k + 1, EV_END, NULL, 0, err)) != MMRT_OK)
            return st;
        ss->open = false;
        return emit(s, k + 1, ev, NULL, 0, err);
    }
}

/* ---- Metaspace ------------------------------------------------------------------------- */

static mmrt_status step_metaspace(struct mmrt_tokenizer_stream *s, int k, enum ev ev,
                                  const char *p, size_t n, struct mmrt_error *err)
{
    const struct tk_dec *d = &s->t->dec[k];
    struct step_state *ss = &s->st[k];
    mmrt_status st;
    switch (ev) {
    case EV_BEGIN:
        ss->held = ss->idx++; /* this token's index */
        return emit(s, k + 1, EV_BEGIN, NULL, 0, err);
    case EV_DATA: {
        /* HF: in token 0 the replacement disappears (unless prepend_scheme is never),
         * elsewhere it becomes a space. */
        bool drop = ss->held == 0 && d->scheme != TK_PREPEND_NEVER;
        ss->buf.n = 0;
        for (size_t i = 0; i < n;) {
            uint32_t cp;
            size_t l = tk_utf8_decode(p + i, &cp);
            if (cp == d->cp)
                st = drop ? MMRT_OK : tk_buf_put(&ss->buf, " ", 1, err);
            else
                st = tk_buf_put(&ss->buf, p + i, l, err);
            if (st != MMRT_OK)
                return st;
            i += l;
        }
        return data(s, k + 1, ss->buf.p, ss->buf.n, err);
    }
    default:
        return emit(s, k + 1, ev, NULL, 0, err);
    }
}

/* ---- chain ----------------------------------------------------------------------------- */

static mmrt_status emit(struct mmrt_tokenizer_stream *s, int k, enum ev ev, const char *p,
                        size_t n, struct mmrt_error *err)
{
    const struct mmrt_tokenizer *t = s->t;
    if (k == t->n_dec) {
        if (ev == EV_BEGIN && !t->has_decoder) {
            /* No decoder: HF joins the tokens with spaces. */
            if (s->any_token && tk_buf_put(&s->out, " ", 1, err) != MMRT_OK)
                return MMRT_ERR_NO_MEMORY;
            s->any_token = true;
        }
        return ev == EV_DATA ? tk_buf_put(&s->out, p, n, err) : MMRT_OK;
    }
    switch (t->dec[k].kind) {
    case TK_DEC_REPLACE: return step_replace(s, k, ev, p, n, err);
    case TK_DEC_BYTEFALLBACK: return step_bytefallback(s, k, ev, p, n, err);
    case TK_DEC_FUSE: return step_fuse(s, k, ev, p, n, err);
    case TK_DEC_STRIP: return step_strip(s, k, ev, p, n, err);
    case TK_DEC_BYTELEVEL: return step_bytelevel(s, k, ev, p, n, err);
    case TK_DEC_METASPACE: return step_metaspace(s, k, ev, p, n, err);
    }
    return mmrt_error_set(err, MMRT_ERR_INTERNAL, "tokenizer: bad decoder step");
}

mmrt_status tk_decoder_check(const struct mmrt_tokenizer *t, struct mmrt_error *err)
{
    bool whole = false; /* the rest of the stream is one token */
    for (int i = 0; i < t->n_dec; i++) {
        if (t->dec[i].kind == TK_DEC_BYTELEVEL && whole)
            return mmrt_error_set(err, MMRT_ERR_UNSUPPORTED, "%s: decoder: ByteLevel after Fuse "
                                  "or ByteLevel would hold all text back until the end; not "
                                  "supported", t->what);
        whole |= t->dec[i].kind == TK_DEC_FUSE || t->dec[i].kind == TK_DEC_BYTELEVEL;
    }
    return MMRT_OK;
}

static void stream_reset(struct mmrt_tokenizer_stream *s)
{
    for (int i = 0; i < TK_MAX_STEPS; i++) {
        struct step_state *ss = &s->st[i];
        ss->buf.n = ss->run.n = 0;
        ss->acc.n = 0;
        ss->open = ss->pass = ss->run_bad = ss->lead = false;
        ss->idx = ss->held = 0;
    }
    s->any_token = false;
}

mmrt_status mmrt_tokenizer_stream_create(const struct mmrt_tokenizer *tok, unsigned flags,
                                         struct mmrt_tokenizer_stream **out,
                                         struct mmrt_error *err)
{
    if (!tok || !out)
        return mmrt_error_set(err, MMRT_ERR_INVALID_ARG, "tokenizer stream: NULL argument");
    struct mmrt_tokenizer_stream *s = calloc(1, sizeof *s);
    if (!s)
        return mmrt_error_set(err, MMRT_ERR_NO_MEMORY, "tokenizer stream: out of memory");
    s->t = tok;
    s->flags = flags;
    *out = s;
    return MMRT_OK;
}

void mmrt_tokenizer_stream_destroy(struct mmrt_tokenizer_stream *s)
{
    if (!s)
        return;
    for (int i = 0; i < TK_MAX_STEPS; i++) {
        tk_buf_free(&s->st[i].buf);
        tk_buf_free(&s->st[i].run);
    }
    tk_buf_free(&s->out);
    free(s);
}

static mmrt_status push_id(struct mmrt_tokenizer_stream *s, int32_t id, struct mmrt_error *err)
{
    const struct mmrt_tokenizer *t = s->t;
    if (id < 0 || (uint32_t)id >= t->n_ids)
        return MMRT_OK; /* HF skips ids it has no token for */
    if ((s->flags & MMRT_DECODE_SKIP_SPECIAL) && (t->id_flags[id] & TK_ID_SPECIAL))
        return MMRT_OK;
    return token(s, 0, t->arena + t->dec_off[id], t->dec_len[id], err);
}

mmrt_status mmrt_tokenizer_decode_stream(struct mmrt_tokenizer_stream *s, int32_t id,
                                         const char **text, size_t *len,
                                         struct mmrt_error *err)
{
    if (!s || !text || !len)
        return mmrt_error_set(err, MMRT_ERR_INVALID_ARG, "tokenizer stream: NULL argument");
    s->out.n = 0;
    mmrt_status st = push_id(s, id, err);
    if (st != MMRT_OK) {
        /* A half-run step would leave the chain inconsistent: start over. */
        stream_reset(s);
        return st;
    }
    *text = s->out.n ? s->out.p : "";
    *len = s->out.n;
    return MMRT_OK;
}

mmrt_status mmrt_tokenizer_stream_finish(struct mmrt_tokenizer_stream *s, const char **text,
                                         size_t *len, struct mmrt_error *err)
{
    if (!s || !text || !len)
        return mmrt_error_set(err, MMRT_ERR_INVALID_ARG, "tokenizer stream: NULL argument");
    s->out.n = 0;
    mmrt_status st = emit(s, 0, EV_FINISH, NULL, 0, err);
    stream_reset(s);
    if (st != MMRT_OK)
        return st;
    *text = s->out.n ? s->out.p : "";
    *len = s->out.n;
    return MMRT_OK;
}

mmrt_status mmrt_tokenizer_decode(const struct mmrt_tokenizer *tok, const int32_t *ids,
                                  size_t n_ids, unsigned flags, char **text, size_t *len,
                                  struct mmrt_error *err)
{
    if (!tok || (!ids && n_ids) || !text || !len)
        return mmrt_error_set(err, MMRT_ERR_INVALID_ARG, "tokenizer decode: NULL argument");
    struct mmrt_tokenizer_stream s = {.t = tok, .flags = flags, .exact = true};
    mmrt_status st = MMRT_OK;
    for (size_t i = 0; i < n_ids && st == MMRT_OK; i++)
        st = push_id(&s, ids[i], err);
    if (st == MMRT_OK)
        st = emit(&s, 0, EV_FINISH, NULL, 0, err);
    if (st == MMRT_OK)
        st = tk_buf_put(&s.out, "", 1, err); /* NUL */
    if (st == MMRT_OK) {
        *len = s.out.n - 1;
        *text = s.out.p;
        s.out.p = NULL;
    }
    for (int i = 0; i < TK_MAX_STEPS; i++) {
        tk_buf_free(&s.st[i].buf);
        tk_buf_free(&s.st[i].run);
    }
    tk_buf_free(&s.out);
    return st;
}

mmrt_status mmrt_tokenizer_token_texts(const struct mmrt_tokenizer *tok,
                                       struct mmrt_token_texts *out, struct mmrt_error *err)
{
    memset(out, 0, sizeof *out);
    const uint32_t n = mmrt_tokenizer_vocab_size(tok);
    /* The token before each: what "a" encodes to last (a plain letter in every vocabulary
     * mmrt reads), whose own text is then cut off the front. */
    int32_t *a = NULL;
    size_t n_a = 0;
    mmrt_status st = mmrt_tokenizer_encode(tok, "a", 1, 0, &a, &n_a, err);
    if (st != MMRT_OK)
        return st;
    int32_t pair[2] = { n_a ? a[n_a - 1] : 0, 0 };
    free(a);
    char *before = NULL, *text = NULL;
    size_t n_before = 0, len = 0, cap = 0, used = 0;
    st = mmrt_tokenizer_decode(tok, pair, 1, 0, &before, &n_before, err);
    if (st == MMRT_OK && (!(out->off = malloc(((size_t)n + 1) * sizeof *out->off)) ||
                          !(out->byte = malloc(((size_t)n ? n : 1) * sizeof *out->byte)) ||
                          !(out->special = malloc((size_t)n ? n : 1))))
        st = mmrt_error_set(err, MMRT_ERR_NO_MEMORY, "token texts: out of memory");
    bool fallback = false;
    for (int i = 0; i < tok->n_dec; i++)
        fallback |= tok->dec[i].kind == TK_DEC_BYTEFALLBACK;
    for (uint32_t id = 0; st == MMRT_OK && id < n; id++) {
        size_t tl = 0;
        const char *t = mmrt_tokenizer_id_to_token(tok, (int32_t)id, &tl);
        out->byte[id] = (int16_t)(fallback && t ? byte_token(t, tl) : -1);
        out->special[id] = mmrt_tokenizer_is_special(tok, (int32_t)id);
    }
    for (uint32_t id = 0; st == MMRT_OK && id < n; id++) {
        pair[1] = (int32_t)id;
        st = mmrt_tokenizer_decode(tok, pair, 2, 0, &text, &len, err);
        const char *piece = text;
        size_t n_piece = len;
        if (st == MMRT_OK && len >= n_before && memcmp(text, before, n_before) == 0) {
            piece += n_before;
            n_piece -= n_before;
        } else if (st == MMRT_OK) { /* a decoder that rewrites across tokens: the id alone */
            free(text);
            text = NULL;
            st = mmrt_tokenizer_decode(tok, &pair[1], 1, 0, &text, &len, err);
            piece = text;
            n_piece = len;
        }
        if (st == MMRT_OK && used + n_piece > UINT32_MAX)
            st = mmrt_error_set(err, MMRT_ERR_LIMIT, "token texts: more than 4 GiB");
        if (st == MMRT_OK && used + n_piece > cap) {
            size_t grow = cap ? 2 * cap : 4096;
            while (grow < used + n_piece)
                grow *= 2;
            char *b = realloc(out->blob, grow);
            if (!b)
                st = mmrt_error_set(err, MMRT_ERR_NO_MEMORY, "token texts: out of memory");
            else
                out->blob = b, cap = grow;
        }
        if (st == MMRT_OK) {
            out->off[id] = (uint32_t)used;
            if (n_piece) /* the blob may still be NULL while every text so far is empty */
                memcpy(out->blob + used, piece, n_piece);
            used += n_piece;
        }
        free(text);
        text = NULL;
    }
    free(before);
    if (st != MMRT_OK) {
        mmrt_token_texts_free(out);
        return st;
    }
    out->off[n] = (uint32_t)used;
    out->n = n;
    return MMRT_OK;
}

void mmrt_token_texts_free(struct mmrt_token_texts *t)
{
    free(t->blob);
    free(t->off);
    free(t->byte);
    free(t->special);
    memset(t, 0, sizeof *t);
}
