/* core/engine.c — sequences, iteration-level scheduling and batched forwards (engine.h). */
#include "engine.h"

#include <nettle/sha2.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "formats/tokenizer.h"
#include "json_answer.h"
#include "log.h"
#include "ops.h"
#include "sampler.h"

enum seq_state { SEQ_WAITING, SEQ_PREFILL, SEQ_DECODE, SEQ_DONE };

#define PREFIX_KEY SHA256_DIGEST_SIZE
#define MAX_PREFIXES (1 << 16) /* most [engine] prefix_entries */
#define MAX_WHOLE 16           /* most cached whole prompts (each keeps a row of logits) */
/* Drafts (draft()): the longest and shortest run of a sequence's last tokens looked up in
 * it. One token says too little about what follows to be worth a row. */
#define DRAFT_NGRAM_MAX 3
#define DRAFT_NGRAM_MIN 2
/* predict(): how far past the last match one token is looked for (an edit of a word or two),
 * and how far a longer run is: an edit that drops more of the prediction is not followed,
 * and a step never scans a long prediction whole while the answer is away from it. */
#define PREDICT_SINGLE_REACH 8
#define PREDICT_REACH 4096

struct mmrt_seq {
    struct mmrt_engine *e;
    enum seq_state state;
    uint64_t arrival;            /* submission order: the waiting line */
    uint64_t admitted;           /* admission order (0 while waiting): youngest is preempted */
    struct mmrt_prompt prompt;
    struct mmrt_vision_output vision;
    int32_t *tokens;             /* [n_ids + max_tokens]: the prompt, then what was generated */
    int64_t n_known;             /* valid entries of tokens */
    int max_tokens, n_gen;
    struct mmrt_sampler sampler;
    struct mmrt_tokenizer_stream *stream;
    struct mmrt_kv_cache kv;     /* kv.n_past: cache rows filled (slots − dropped) */
    int64_t dropped;             /* image rows compression removed (slot − row) */
    const struct mmrt_model_trace *trace;
    mmrt_token_fn on_token;
    mmrt_logprobs_fn on_logprobs; /* NULL unless the request asked for logprobs */
    int top_logprobs;
    /* A JSON answer (response_format json_object or json_schema): the compiled schema it is
     * held to (a hold of its own), and where the answer is in it. */
    bool json;
    struct mmrt_json_schema *schema;
    struct mmrt_json_answer answer;
    void *user;
    struct mmrt_result *res;
    double t_submit, t_first_chunk, t_first_token;
    /* Stop strings (copies) and the text held back because it may begin one. */
    char **stop;
    int n_stop;
    size_t stop_max;             /* longest stop string */
    char *held;                  /* [stop_max] bytes of room */
    size_t n_held;
    bool stopped;                /* a stop string was reached */
    bool graph;                  /* a decode step of this sequence ran as a graph */
    atomic_bool cancel;
    /* Prefix keys (prefix_keys()): pkeys[k] names prompt positions [0, (k + 1) · chunk),
     * whole_key the whole prompt. */
    uint8_t (*pkeys)[PREFIX_KEY];
    int64_t n_pkeys;
    uint8_t whole_key[PREFIX_KEY];
    bool has_whole_key;
    /* The last prompt position's logits of a cached whole prompt this sequence took
     * (whole_attach()): its first token comes from them, and nothing is prefilled. */
    float *whole;
    /* The request's prediction (mmrt_request.prediction) as tokens, the place in it after
     * the last run of the answer found there (predict()), and whether this step's drafts
     * came from it. */
    int32_t *pred;
    int64_t n_pred, pred_at;
    bool drafts_predicted;
    int pred_drafted, pred_accepted; /* prediction tokens checked, taken (mmrt_result) */
};

/* A cached prompt prefix: the pages holding the K/V of its positions [0, n_tokens), pinned
 * in the store (kv_cache.h) so they outlive the sequence that wrote them. A chunk prefix
 * ends on a page boundary; a whole prompt (logits set) may end inside its last page, whose
 * later rows its sequence goes on writing, so a taker copies that page. */
struct prefix {
    uint8_t key[PREFIX_KEY];
    int64_t n_pages, n_tokens;
    int32_t *pages;
    float *logits;               /* a whole prompt: its last position's logits [vocab] */
    uint64_t used;               /* LRU tick of the last insertion or hit */
};

/* The buffers of one forward: the I32 control block (host and device), the embedded rows,
 * the logits and the decoder's activations, for up to Mc rows, Bc sequences, Oc logits rows. */
struct fwd {
    int64_t Mc, Bc, Oc, W, A;
    int64_t off_rows, off_pos, off_cu, off_len, off_table, off_out, n_ctrl;
    int32_t *host;
    struct mmrt_dev_tensor ctrl, h, logits;
    struct mmrt_decoder_ws *ws;
};

/* One sequence's part of a forward: rows [first, first + n) of its tokens. */
struct part {
    struct mmrt_seq *s;
    int64_t first, n;
    bool logits;
};

struct mmrt_engine {
    struct mmrt_language lang;
    const struct mmrt_decoder *dec;
    struct mmrt_engine_options o;
    struct mmrt_seq **live;      /* submitted, not finished */
    int n_live, cap_live;
    uint64_t next_arrival, next_admitted;
    int64_t decode_cap;          /* rows of a decode forward: max_batch, or draft_rows */
    struct fwd decode;           /* the decode forward's buffers, for decode_cap rows */
    void *graphs[MMRT_SMALL_M + 1]; /* captured decode step per batch size */
    bool try_graph;
    float *logits;               /* [decode_cap][vocab] host copy */
    struct part *parts;          /* [decode_cap] */
    int32_t *drafts;             /* [decode_cap]: the token each decode row checks */
    struct mmrt_engine_stats stats;
    struct prefix *prefixes;     /* [max_prefixes], the first n_prefixes in use */
    int n_prefixes, max_prefixes; /* max_prefixes 0: no reuse */
    uint64_t prefix_tick;
    /* JSON answers: every token's text (made at the first such request) and a row of logits
     * with the tokens that do not fit masked. */
    struct mmrt_token_texts texts;
    uint8_t *plain;              /* [texts.n] mmrt_json_answer_plain */
    float *masked;               /* [vocab] */
};

/* ---- decoder workspaces (decoder.h) -------------------------------------------------- */

void mmrt_decoder_ws_free(void *self, struct mmrt_decoder_ws *ws)
{
    (void)self;
    if (!ws)
        return;
    mmrt_scratch_release(&ws->s);
    free(ws);
}

mmrt_status mmrt_decoder_ws_alloc(struct mmrt_dev *dev, int64_t rows,
                                  const struct mmrt_ws_shape *shapes, int n,
                                  struct mmrt_decoder_ws **out, struct mmrt_error *err)
{
    *out = NULL;
    if (n < 0 || n > MMRT_WS_MAX)
        return mmrt_error_set(err, MMRT_ERR_INTERNAL, "decoder: %d workspace tensors", n);
    struct mmrt_decoder_ws *ws = calloc(1, sizeof *ws);
    if (!ws)
        return mmrt_error_set(err, MMRT_ERR_NO_MEMORY, "decoder: out of memory");
    mmrt_scratch_init(&ws->s, dev);
    ws->n = n;
    mmrt_status st = MMRT_OK;
    for (int i = 0; st == MMRT_OK && i < n; i++) {
        int64_t ne[4] = { rows };
        for (int d = 0; d < shapes[i].n_inner; d++)
            ne[1 + d] = shapes[i].inner[d];
        st = mmrt_scratch_tensor(&ws->s, MMRT_DTYPE_F32, 1 + shapes[i].n_inner, ne, &ws->t[i],
                                 err);
    }
    if (st != MMRT_OK) {
        mmrt_decoder_ws_free(NULL, ws);
        return st;
    }
    *out = ws;
    return MMRT_OK;
}

struct mmrt_tensor mmrt_decoder_ws_rows(const struct mmrt_decoder_ws *ws, int i, int64_t M)
{
    return mmrt_tensor_rows(&ws->t[i], 0, M);
}

mmrt_status mmrt_decoder_kv_create(struct mmrt_dev *dev, int64_t n_layers, int64_t n_kv_heads,
                                   int64_t head_dim, int64_t max_positions,
                                   const struct mmrt_model_options *opts,
                                   struct mmrt_kv_pages *out, struct mmrt_error *err)
{
    const struct mmrt_model_options none = { 0 };
    const struct mmrt_model_options *o = opts ? opts : &none;
    return mmrt_kv_pages_create(dev, n_layers, n_kv_heads, head_dim, max_positions,
                                o->max_kv_tokens, o->kv_page_tokens,
                                mmrt_kv_store_dtype(o->kv_dtype), out, err);
}

/* ---- forward buffers ---------------------------------------------------------------- */

static void fwd_destroy(const struct mmrt_engine *e, struct fwd *f)
{
    struct mmrt_dev *dev = e->dec->dev;
    if (f->ws)
        e->dec->ws_destroy(e->dec->self, f->ws);
    mmrt_dev_tensor_free(dev, &f->logits);
    mmrt_dev_tensor_free(dev, &f->h);
    mmrt_dev_tensor_free(dev, &f->ctrl);
    free(f->host);
    memset(f, 0, sizeof *f);
}

static mmrt_status fwd_create(const struct mmrt_engine *e, int64_t Mc, int64_t Bc, int64_t Oc,
                              struct fwd *f, struct mmrt_error *err)
{
    const struct mmrt_decoder *d = e->dec;
    memset(f, 0, sizeof *f);
    f->Mc = Mc, f->Bc = Bc, f->Oc = Oc;
    f->W = d->kv->seq_pages;
    f->A = d->n_axes > 0 ? d->n_axes : 1;
    f->off_rows = Mc;
    f->off_pos = 2 * Mc;
    f->off_cu = f->off_pos + Mc * f->A;
    f->off_len = f->off_cu + Bc + 1;
    f->off_table = f->off_len + Bc;
    f->off_out = f->off_table + Bc * f->W;
    f->n_ctrl = f->off_out + (Oc > 0 ? Oc : 1);
    f->host = calloc((size_t)f->n_ctrl, sizeof *f->host);
    mmrt_status st = f->host ? MMRT_OK
                             : mmrt_error_set(err, MMRT_ERR_NO_MEMORY, "engine: out of memory");
    if (st == MMRT_OK)
        st = mmrt_dev_tensor_alloc(d->dev, MMRT_DTYPE_I32, 1, (const int64_t[]){ f->n_ctrl },
                                   &f->ctrl, err);
    if (st == MMRT_OK)
        st = mmrt_dev_tensor_alloc(d->dev, MMRT_DTYPE_F32, 2,
                                   (const int64_t[]){ Mc, d->hidden }, &f->h, err);
    if (st == MMRT_OK && Oc > 0)
        st = mmrt_dev_tensor_alloc(d->dev, MMRT_DTYPE_F32, 2,
                                   (const int64_t[]){ Oc, d->vocab }, &f->logits, err);
    if (st == MMRT_OK)
        st = d->ws_create(d->self, Mc, Oc, &f->ws, err);
    if (st != MMRT_OK) {
        fwd_destroy(e, f);
        return mmrt_error_prefix(err, st, "engine: buffers of a %lld-row step", (long long)Mc);
    }
    return MMRT_OK;
}

static struct mmrt_tensor ctrl_view(const struct fwd *f, int64_t off, int n_dims,
                                    const int64_t *ne)
{
    struct mmrt_tensor v;
    mmrt_tensor_init(&v, f->ctrl.t.buffer, f->ctrl.t.offset + (uint64_t)off * sizeof(int32_t),
                     MMRT_DTYPE_I32, n_dims, ne);
    return v;
}

/* The device views of a step of M rows, B sequences and O logits rows (fixed offsets, so a
 * graph captured for B replays every step of B sequences). */
static struct mmrt_step_io fwd_io(const struct mmrt_engine *e, const struct fwd *f, int64_t M,
                                  int64_t B, int64_t O, struct mmrt_tensor *ids)
{
    struct mmrt_step_io io = { .M = M, .B = B, .n_out = O };
    *ids = ctrl_view(f, 0, 1, (const int64_t[]){ M });
    io.h = mmrt_tensor_rows(&f->h.t, 0, M);
    io.pos = e->dec->n_axes > 0 ? ctrl_view(f, f->off_pos, 2, (const int64_t[]){ M, f->A })
                                : ctrl_view(f, f->off_pos, 1, (const int64_t[]){ M });
    io.kv.rows = ctrl_view(f, f->off_rows, 1, (const int64_t[]){ M });
    io.kv.cu_q = ctrl_view(f, f->off_cu, 1, (const int64_t[]){ B + 1 });
    io.kv.kv_len = ctrl_view(f, f->off_len, 1, (const int64_t[]){ B });
    io.kv.table = ctrl_view(f, f->off_table, 2, (const int64_t[]){ B, f->W });
    io.out = ctrl_view(f, f->off_out, 1, (const int64_t[]){ O > 0 ? O : 1 });
    if (O > 0)
        io.logits = mmrt_tensor_rows(&f->logits.t, 0, O);
    return io;
}

/* Rotary position of slot `slot` of s on axis a. */
static int32_t position(const struct mmrt_seq *s, int64_t slot, int a, int A)
{
    const struct mmrt_prompt *p = &s->prompt;
    if (slot < p->n_ids)
        return p->pos ? p->pos[slot * A + a] : (int32_t)slot;
    return (int32_t)(slot + p->rope_delta);
}

/* Writes the control block of the parts on the host. */
static void fwd_fill(struct fwd *f, const struct part *parts, int n_parts)
{
    int32_t *h = f->host;
    int64_t m = 0, o = 0;
    const int A = (int)f->A;
    for (int b = 0; b < n_parts; b++) {
        const struct part *p = &parts[b];
        const struct mmrt_seq *s = p->s;
        h[f->off_cu + b] = (int32_t)m;
        h[f->off_len + b] = (int32_t)(p->first + p->n - s->dropped);
        int32_t *table = h + f->off_table + (int64_t)b * f->W;
        for (int64_t i = 0; i < f->W; i++)
            table[i] = i < s->kv.n_held ? s->kv.page_ids[i] : 0;
        mmrt_kv_cache_rows(&s->kv, p->first - s->dropped, p->n, h + f->off_rows + m);
        for (int64_t i = 0; i < p->n; i++) {
            const int64_t slot = p->first + i;
            h[m + i] = s->tokens[slot];
            for (int a = 0; a < A; a++)
                h[f->off_pos + (m + i) * A + a] = position(s, slot, a, A);
        }
        m += p->n;
        if (p->logits)
            h[f->off_out + o++] = (int32_t)(m - 1);
    }
    h[f->off_cu + n_parts] = (int32_t)m;
}

/* The image features that replace token embeddings in rows [first, first + n) of s, written
 * into rows [m0, m0 + n) of h. */
static mmrt_status splice(const struct mmrt_engine *e, const struct part *p, int64_t m0,
                          const struct mmrt_tensor *h, struct mmrt_error *err)
{
    const struct mmrt_seq *s = p->s;
    const int64_t D = e->dec->hidden;
    for (int i = 0; i < s->prompt.n_splices; i++) {
        const struct mmrt_prompt_splice *sp = &s->prompt.splices[i];
        int64_t lo = sp->row > p->first ? sp->row : p->first;
        int64_t hi = sp->row + sp->n_rows < p->first + p->n ? sp->row + sp->n_rows
                                                           : p->first + p->n;
        if (lo >= hi)
            continue;
        struct mmrt_tensor dst = mmrt_tensor_rows(h, m0 + lo - p->first, hi - lo);
        const float *src = s->vision.features + (sp->src_row + lo - sp->row) * D;
        mmrt_status st = mmrt_dev_upload(e->dec->dev, &dst, src,
                                         (uint64_t)((hi - lo) * D) * sizeof(float), err);
        if (st != MMRT_OK)
            return st;
    }
    return MMRT_OK;
}

static mmrt_status issue(const struct mmrt_engine *e, const struct fwd *f,
                         const struct mmrt_step_io *io, const struct mmrt_tensor *ids,
                         struct mmrt_error *err)
{
    mmrt_status st = mmrt_op_get_rows(e->dec->dev, e->dec->embed, ids, &io->h, err);
    return st == MMRT_OK ? e->dec->issue(e->dec->self, f->ws, io, err) : st;
}

/* Records the decode step of B sequences once. A failure is not an error of the requests:
 * decode runs eagerly from then on, and the reason is logged once. */
static void capture(struct mmrt_engine *e, const struct mmrt_step_io *io,
                    const struct mmrt_tensor *ids, int64_t B)
{
    struct mmrt_dev *dev = e->dec->dev;
    struct mmrt_error cerr = { 0 };
    mmrt_status st = mmrt_dev_capture_begin(dev, &cerr);
    if (st == MMRT_ERR_UNSUPPORTED) {
        e->try_graph = false;
        mmrt_log(MMRT_LOG_DEBUG, "engine", "decode steps run eagerly: %s", cerr.msg);
        return;
    }
    void *g = NULL;
    if (st == MMRT_OK) {
        struct mmrt_error ierr = { 0 };
        mmrt_status ist = issue(e, &e->decode, io, ids, &ierr);
        st = mmrt_dev_capture_end(dev, &g, &cerr);
        if (ist != MMRT_OK) {
            mmrt_dev_graph_destroy(dev, g);
            g = NULL;
            st = ist;
            cerr = ierr;
        }
    }
    if (st != MMRT_OK) {
        /* UNSUPPORTED: the step holds an op that cannot be replayed (an act-order matrix's
         * input gather), which is how the model is, not something that went wrong */
        e->try_graph = false;
        mmrt_log(st == MMRT_ERR_UNSUPPORTED ? MMRT_LOG_INFO : MMRT_LOG_WARN, "engine",
                 "device %s: decode-step graph capture failed, running eagerly: %s", dev->name,
                 cerr.msg);
        return;
    }
    e->graphs[B] = g;
    mmrt_log(MMRT_LOG_DEBUG, "engine", "device %s: decode step of %lld sequences captured",
             dev->name, (long long)B);
}

/* Runs the parts as one forward on f and leaves the logits of the parts that want them in
 * e->logits, in part order. decode: the parts are decode rows (one each) on e->decode, which
 * may replay a captured graph. */
static mmrt_status forward(struct mmrt_engine *e, struct fwd *f, const struct part *parts,
                           int n_parts, bool decode, bool *graph, struct mmrt_error *err)
{
    int64_t M = 0, O = 0;
    for (int i = 0; i < n_parts; i++) {
        M += parts[i].n;
        O += parts[i].logits;
    }
    const int64_t B = n_parts;
    fwd_fill(f, parts, n_parts);
    struct mmrt_dev *dev = e->dec->dev;
    mmrt_status st = mmrt_dev_upload(dev, &f->ctrl.t, f->host,
                                     (uint64_t)f->n_ctrl * sizeof(int32_t), err);
    if (st != MMRT_OK)
        return st;
    struct mmrt_tensor ids;
    const struct mmrt_step_io io = fwd_io(e, f, M, B, O, &ids);
    *graph = false;
    if (decode && e->try_graph && !e->graphs[B])
        capture(e, &io, &ids, B);
    if (decode && e->graphs[B]) {
        st = mmrt_dev_graph_launch(dev, e->graphs[B], err);
        *graph = true;
    } else if (decode) {
        st = issue(e, f, &io, &ids, err);
    } else {
        st = mmrt_op_get_rows(dev, e->dec->embed, &ids, &io.h, err);
        for (int64_t i = 0, m = 0; st == MMRT_OK && i < n_parts; m += parts[i].n, i++)
            st = splice(e, &parts[i], m, &io.h, err);
        if (st == MMRT_OK)
            st = e->dec->issue(e->dec->self, f->ws, &io, err);
    }
    if (st == MMRT_OK && O > 0)
        st = mmrt_dev_download(dev, &io.logits, e->logits,
                               (uint64_t)(O * e->dec->vocab) * sizeof(float), err);
    return st;
}

/* ---- sequences ------------------------------------------------------------------------ */

static void seq_free_parts(struct mmrt_seq *s)
{
    free(s->pkeys);
    s->pkeys = NULL;
    free(s->whole);
    s->whole = NULL;
    mmrt_kv_cache_free(&s->kv);
    mmrt_tokenizer_stream_destroy(s->stream);
    s->stream = NULL;
    mmrt_sampler_deinit(&s->sampler);
    mmrt_prompt_free(&s->prompt);
    mmrt_vision_output_free(&s->vision);
    free(s->tokens);
    s->tokens = NULL;
    for (int i = 0; s->stop && i < s->n_stop; i++)
        free(s->stop[i]);
    free(s->stop);
    s->stop = NULL;
    free(s->held);
    s->held = NULL;
    mmrt_json_schema_free(s->schema);
    s->schema = NULL;
    free(s->pred);
    s->pred = NULL;
}

void mmrt_result_set_status(struct mmrt_result *r, mmrt_status st, const char *msg)
{
    r->status = st;
    mmrt_error_copy(r->error, sizeof r->error, st == MMRT_OK ? "" : msg);
    mmrt_error_copy(r->message, sizeof r->message, st == MMRT_OK ? "" : msg);
}

/* The callback receives NUL-terminated text; a piece longer than the buffer (a pathological
 * tokenizer entry) is cut rather than allocated per token. */
static bool deliver(const struct mmrt_seq *s, int32_t id, const char *text, size_t len)
{
    if (!s->on_token)
        return true;
    char buf[1024];
    size_t n = len < sizeof buf - 1 ? len : sizeof buf - 1;
    memcpy(buf, text, n);
    buf[n] = '\0';
    return s->on_token(s->user, id, buf);
}

/* Whether text[0, n) is a proper prefix of one of s's stop strings. */
static bool begins_stop(const struct mmrt_seq *s, const char *text, size_t n)
{
    for (int i = 0; i < s->n_stop; i++) {
        const size_t len = strlen(s->stop[i]);
        if (n < len && memcmp(s->stop[i], text, n) == 0)
            return true;
    }
    return false;
}

/* Streams a token's text through the stop strings: a reached stop string ends the text
 * before it (s->stopped); a tail that may begin one is held back for the next piece. Every
 * byte position is a character boundary where it matters: a stop string is valid UTF-8, so
 * it starts at a lead byte, and the pieces are whole characters. */
static bool emit(struct mmrt_seq *s, int32_t id, const char *text, size_t len)
{
    if (s->n_stop == 0)
        return deliver(s, id, text, len);
    bool go_on = true;
    /* The held tail is shorter than the longest stop string; a piece is bounded by the
     * tokenizer (cut at the delivery buffer anyway), so the work is small per token. */
    char buf[2048];
    size_t n = s->n_held;
    memcpy(buf, s->held, n);
    size_t add = len < sizeof buf - n ? len : sizeof buf - n;
    memcpy(buf + n, text, add);
    n += add;
    /* The earliest position where a stop string occurs, or where the rest may begin one. */
    size_t cut = n;
    for (size_t p = 0; p < n && cut == n; p++) {
        for (int i = 0; i < s->n_stop; i++) {
            const size_t sl = strlen(s->stop[i]);
            if (sl <= n - p && memcmp(buf + p, s->stop[i], sl) == 0) {
                s->stopped = true;
                cut = p;
                break;
            }
        }
        if (!s->stopped && begins_stop(s, buf + p, n - p))
            cut = p;
    }
    go_on = deliver(s, id, buf, cut);
    s->n_held = s->stopped ? 0 : n - cut;
    memcpy(s->held, buf + cut, s->n_held);
    return go_on;
}

static void unlink_live(struct mmrt_engine *e, struct mmrt_seq *s)
{
    for (int i = 0; i < e->n_live; i++)
        if (e->live[i] == s) {
            memmove(&e->live[i], &e->live[i + 1], (size_t)(e->n_live - i - 1) * sizeof *e->live);
            e->n_live--;
            return;
        }
}

/* Ends s: flushes its text, fills its result and returns its pages to the store at once. */
static void finish(struct mmrt_engine *e, struct mmrt_seq *s, mmrt_status st, const char *msg)
{
    struct mmrt_result *r = s->res;
    if (st == MMRT_OK && s->stream) {
        const char *tail = "";
        size_t tlen = 0;
        struct mmrt_error ferr = { 0 };
        st = mmrt_tokenizer_stream_finish(s->stream, &tail, &tlen, &ferr);
        if (st == MMRT_OK && tlen && !s->stopped)
            emit(s, -1, tail, tlen);
        /* What was held back for a stop string that never came is answer text. */
        if (st == MMRT_OK && s->n_held)
            deliver(s, -1, s->held, s->n_held);
        s->n_held = 0;
        msg = ferr.msg;
    }
    if (st != MMRT_OK)
        s->res->finish_reason = MMRT_FINISH_NONE;
    const double now = mmrt_now_ms();
    mmrt_result_set_status(r, st, msg);
    r->n_tokens = s->n_gen;
    if (s->t_first_token > 0) {
        r->prefill_ms = s->t_first_token - s->t_first_chunk;
        r->decode_ms = now - s->t_first_token;
        if (s->n_gen > 1 && r->decode_ms > 0)
            r->decode_tokens_per_s = (s->n_gen - 1) / (r->decode_ms / 1e3);
    }
    r->decode_graph = s->graph;
    r->prediction_accepted = s->pred_accepted;
    r->prediction_rejected = s->pred_drafted - s->pred_accepted;
    if (s->t_first_chunk > 0)
        r->queue_ms += s->t_first_chunk - s->t_submit;
    mmrt_kv_cache_free(&s->kv);
    s->state = SEQ_DONE;
    unlink_live(e, s);
}

static bool is_eos(const struct mmrt_engine *e, int32_t id)
{
    for (int i = 0; i < e->lang.n_eos; i++)
        if (e->lang.eos[i] == id)
            return true;
    return false;
}

/* What JSON answers need once: every token's text (one pass over the vocabulary, made at
 * the first such request so that others never pay it) and the masked row. */
static mmrt_status json_ready(struct mmrt_engine *e, struct mmrt_error *err)
{
    if (e->masked)
        return MMRT_OK;
    mmrt_status st = mmrt_tokenizer_token_texts(e->lang.tok, &e->texts, err);
    if (st != MMRT_OK)
        return mmrt_error_prefix(err, st, "JSON answer");
    e->plain = malloc(e->texts.n ? e->texts.n : 1);
    e->masked = e->plain ? malloc((size_t)e->dec->vocab * sizeof *e->masked) : NULL;
    if (!e->masked) {
        mmrt_token_texts_free(&e->texts);
        free(e->plain);
        e->plain = NULL;
        return mmrt_error_set(err, MMRT_ERR_NO_MEMORY, "JSON answer: out of memory");
    }
    mmrt_json_answer_plain(&e->texts, e->plain);
    return MMRT_OK;
}

/* The sampler's choice for a JSON answer: its pick when that fits, else its pick from the
 * row with every token that does not fit masked (the draw is the same seeded stream, so the
 * answer is still reproducible). */
static mmrt_status json_choose(struct mmrt_engine *e, struct mmrt_seq *s, const float *logits,
                               int32_t *tok, struct mmrt_error *err)
{
    struct mmrt_json_answer next;
    mmrt_status st = mmrt_sampler_next(&s->sampler, logits, s->tokens, s->prompt.n_ids,
                                       s->n_known, tok, err);
    if (st != MMRT_OK)
        return st;
    if (mmrt_json_answer_fits(&s->answer, &e->texts, e->plain, *tok, &next)) {
        mmrt_json_answer_copy(&s->answer, &next);
        return MMRT_OK;
    }
    if (!mmrt_json_answer_mask(&s->answer, &e->texts, e->plain, logits, e->dec->vocab,
                               e->masked))
        return mmrt_error_set(err, MMRT_ERR_INTERNAL, "JSON answer: no token of the "
                              "vocabulary continues the answer as the schema asks");
    st = mmrt_sampler_next(&s->sampler, e->masked, s->tokens, s->prompt.n_ids, s->n_known, tok,
                           err);
    if (st == MMRT_OK && !mmrt_json_answer_fits(&s->answer, &e->texts, e->plain, *tok, &next))
        return mmrt_error_set(err, MMRT_ERR_INTERNAL, "JSON answer: the "
                              "sampler chose masked token %d", (int)*tok);
    if (st == MMRT_OK)
        mmrt_json_answer_copy(&s->answer, &next);
    return st;
}

/* The token decoded alone into *text (malloc'ed, "" when it cannot be had). */
static char *token_text(const struct mmrt_tokenizer *tok, int32_t id)
{
    char *text = NULL;
    size_t len = 0;
    struct mmrt_error err = { 0 };
    if (mmrt_tokenizer_decode(tok, &id, 1, 0, &text, &len, &err) != MMRT_OK)
        text = NULL;
    return text ? text : strdup("");
}

/* Hands s's on_logprobs the raw distribution's view of the token just sampled. */
static mmrt_status report_logprobs(const struct mmrt_engine *e, const struct mmrt_seq *s,
                                   const float *logits, int32_t tok, struct mmrt_error *err)
{
    struct mmrt_logprob top[MMRT_MAX_TOP_LOGPROBS];
    struct mmrt_token_logprobs lp = { .struct_size = sizeof lp, .top = top };
    lp.token.token_id = tok;
    mmrt_status st = mmrt_sampler_logprobs(logits, e->dec->vocab, tok, s->top_logprobs,
                                           &lp.token.logprob, top, &lp.n_top, err);
    if (st != MMRT_OK)
        return st;
    char *texts[MMRT_MAX_TOP_LOGPROBS + 1];
    int n_text = 0;
    bool failed = !(texts[n_text++] = token_text(e->lang.tok, tok));
    for (int i = 0; !failed && i < lp.n_top; i++)
        failed = !(texts[n_text++] = token_text(e->lang.tok, top[i].token_id));
    if (!failed) {
        lp.token.text = texts[0];
        for (int i = 0; i < lp.n_top; i++)
            top[i].text = texts[i + 1];
        s->on_logprobs(s->user, &lp);
    }
    for (int i = 0; i < n_text; i++)
        free(texts[i]);
    return failed ? mmrt_error_set(err, MMRT_ERR_NO_MEMORY, "logprobs: out of memory")
                  : MMRT_OK;
}

/* Samples s's next token from `logits`, streams it and decides whether s goes on. */
static void take_token(struct mmrt_engine *e, struct mmrt_seq *s, const float *logits)
{
    struct mmrt_error err = { 0 };
    if (s->trace && s->trace->logits)
        s->trace->logits(s->trace->user, s->n_gen, logits, e->dec->vocab);
    int32_t tok;
    mmrt_status st = s->json ? json_choose(e, s, logits, &tok, &err)
                             : mmrt_sampler_next(&s->sampler, logits, s->tokens,
                                                 s->prompt.n_ids, s->n_known, &tok, &err);
    if (st == MMRT_OK && s->on_logprobs)
        st = report_logprobs(e, s, logits, tok, &err);
    const char *piece = "";
    size_t plen = 0;
    if (st == MMRT_OK)
        st = mmrt_tokenizer_decode_stream(s->stream, tok, &piece, &plen, &err);
    if (st != MMRT_OK) {
        finish(e, s, st, err.msg);
        return;
    }
    if (s->n_gen == 0)
        s->t_first_token = mmrt_now_ms();
    s->tokens[s->n_known++] = tok;
    s->n_gen++;
    /* An end token's own text (skipped as special) is nothing to stream. */
    const bool eos = is_eos(e, tok);
    const bool go_on = emit(s, tok, piece, plen);
    enum mmrt_finish_reason why = MMRT_FINISH_NONE;
    if (s->stopped)
        why = MMRT_FINISH_STOP_STRING;
    else if (eos || (s->json && mmrt_json_answer_done(&s->answer)))
        why = MMRT_FINISH_EOS;
    else if (!go_on)
        why = MMRT_FINISH_CALLER;
    else if (s->n_gen == s->max_tokens)
        why = MMRT_FINISH_LENGTH;
    if (why != MMRT_FINISH_NONE) {
        s->res->finish_reason = why;
        finish(e, s, MMRT_OK, "");
    }
}

/* max_tokens 0 (mmrt.h): as many as the context and the KV store leave after the prompt. */
static int resolve_max_tokens(const struct mmrt_engine *e, const struct mmrt_prompt *p,
                              int max_tokens)
{
    if (max_tokens != 0)
        return max_tokens;
    int64_t room = e->dec->max_positions;
    if (e->dec->kv->max_tokens < room)
        room = e->dec->kv->max_tokens;
    room -= p->n_ids;
    if (room > INT32_MAX)
        room = INT32_MAX;
    return room < 1 ? 1 : (int)room; /* 1 so the checks below name the limit */
}

static mmrt_status check_prompt(const struct mmrt_engine *e, const struct mmrt_prompt *p,
                                const struct mmrt_vision_output *v, int max_tokens,
                                struct mmrt_error *err)
{
    const struct mmrt_decoder *d = e->dec;
    if (max_tokens < 1)
        return mmrt_error_set(err, MMRT_ERR_INVALID_ARG, "max_tokens %d must be at least 1",
                              max_tokens);
    if (p->n_ids < 1)
        return mmrt_error_set(err, MMRT_ERR_INVALID_ARG, "empty prompt and no image");
    if (p->n_ids + max_tokens > d->max_positions)
        return mmrt_error_set(err, MMRT_ERR_LIMIT,
                              "prompt of %lld tokens plus %d new tokens exceeds the model's "
                              "context of %lld positions",
                              (long long)p->n_ids, max_tokens, (long long)d->max_positions);
    for (int64_t i = 0; i < p->n_ids; i++)
        if (p->ids[i] < 0 || p->ids[i] >= d->vocab)
            return mmrt_error_set(err, MMRT_ERR_INVALID_ARG,
                                  "token id %d at position %lld is outside the vocabulary "
                                  "(%lld)", p->ids[i], (long long)i, (long long)d->vocab);
    const int A = d->n_axes > 0 ? d->n_axes : 1;
    for (int64_t i = 0; p->pos && i < p->n_ids * A; i++)
        if (p->pos[i] < 0 || p->pos[i] > (1 << 24))
            return mmrt_error_set(err, MMRT_ERR_INVALID_ARG,
                                  "rotary position %d of token %lld is outside 0…2^24",
                                  p->pos[i], (long long)(i / A));
    const int64_t last = p->n_ids + max_tokens - 1 + p->rope_delta;
    if (last < 0 || last > (1 << 24))
        return mmrt_error_set(err, MMRT_ERR_INVALID_ARG,
                              "rotary position %lld of the last token is outside 0…2^24",
                              (long long)last);
    const int64_t rows = mmrt_vision_output_rows(v);
    for (int i = 0; i < p->n_splices; i++) {
        const struct mmrt_prompt_splice *sp = &p->splices[i];
        if (!v->features || v->dim != d->hidden)
            return mmrt_error_set(err, MMRT_ERR_INVALID_ARG,
                                  "image features of width %lld, the decoder needs %lld",
                                  (long long)v->dim, (long long)d->hidden);
        if (sp->n_rows < 0 || sp->row < 0 || sp->row + sp->n_rows > p->n_ids ||
            sp->src_row < 0 || sp->src_row + sp->n_rows > rows)
            return mmrt_error_set(err, MMRT_ERR_INVALID_ARG,
                                  "image splice %d (prompt rows %lld + %lld from feature row "
                                  "%lld) lies outside the prompt of %lld or the %lld features",
                                  i, (long long)sp->row, (long long)sp->n_rows,
                                  (long long)sp->src_row, (long long)p->n_ids,
                                  (long long)rows);
    }
    /* The patch grids: inside the prompt, in row order, disjoint (kv_compress.h relies on
     * it). Every extent is bounded by the prompt first, so the products cannot overflow. */
    int64_t end = 0;
    for (int i = 0; i < p->n_grids; i++) {
        const struct mmrt_prompt_grid *g = &p->grids[i];
        const bool fits = g->h >= 1 && g->w >= 1 && g->stride >= g->w && g->row >= end &&
                          g->row < p->n_ids && g->h <= p->n_ids && g->stride <= p->n_ids &&
                          g->row + (g->h - 1) * g->stride + g->w <= p->n_ids;
        if (!fits)
            return mmrt_error_set(err, MMRT_ERR_INVALID_ARG,
                                  "image grid %d (%lld × %lld patches from row %lld, stride "
                                  "%lld) lies outside the prompt of %lld or overlaps the one "
                                  "before", i, (long long)g->h, (long long)g->w,
                                  (long long)g->row, (long long)g->stride, (long long)p->n_ids);
        end = g->row + (g->h - 1) * g->stride + g->w;
    }
    return MMRT_OK;
}

/* ---- prefix reuse (docs/ENGINE.md "Prefix reuse") -------------------------------------- */

/* out = H(prev (NULL: the first chunk, which starts from the settings instead), prompt
 * positions [a, a + len): their ids, positions and spliced rows; a whole prompt's key also
 * hashes its length, so it never names a chunk prefix). */
static void chunk_key(const struct mmrt_engine *e, const struct mmrt_seq *s, const uint8_t *prev,
                      int64_t a, int64_t len, bool whole, uint8_t *out)
{
    const struct mmrt_prompt *p = &s->prompt;
    const int64_t A = e->dec->n_axes > 0 ? e->dec->n_axes : 1, D = e->dec->hidden;
    struct sha256_ctx h;
    sha256_init(&h);
    if (!prev) {
        static const char tag[] = "mmrt prefix v1";
        const int64_t head[3] = { e->o.prefill_chunk, e->dec->kv->page_tokens, A };
        sha256_update(&h, sizeof tag, (const uint8_t *)tag);
        sha256_update(&h, sizeof head, (const uint8_t *)head);
    } else {
        sha256_update(&h, PREFIX_KEY, prev);
    }
    const int64_t has_pos = p->pos != NULL;
    sha256_update(&h, sizeof has_pos, (const uint8_t *)&has_pos);
    sha256_update(&h, (size_t)len * sizeof *p->ids, (const uint8_t *)(p->ids + a));
    if (p->pos)
        sha256_update(&h, (size_t)(len * A) * sizeof *p->pos, (const uint8_t *)(p->pos + a * A));
    for (int i = 0; i < p->n_splices; i++) {
        const struct mmrt_prompt_splice *sp = &p->splices[i];
        const int64_t lo = sp->row > a ? sp->row : a;
        const int64_t hi = sp->row + sp->n_rows < a + len ? sp->row + sp->n_rows : a + len;
        if (lo >= hi)
            continue;
        const int64_t where[2] = { lo, hi };
        sha256_update(&h, sizeof where, (const uint8_t *)where);
        sha256_update(&h, (size_t)((hi - lo) * D) * sizeof(float),
                      (const uint8_t *)(s->vision.features + (sp->src_row + lo - sp->row) * D));
    }
    const int64_t end = -1; /* no splice record has a negative row */
    sha256_update(&h, sizeof end, (const uint8_t *)&end);
    if (whole) {
        const int64_t n[2] = { -2, a + len };
        sha256_update(&h, sizeof n, (const uint8_t *)n);
    }
    sha256_digest(&h, PREFIX_KEY, out);
}

/* The K/V of a prompt position depend on the embedded rows at and before it (a token's
 * embedding, or the image feature row spliced in its place), the rotary positions of those
 * rows, and how the prompt was cut into chunks, which is fixed: multiples of prefill_chunk
 * from 0. So the key of positions [0, b) (b a chunk boundary) chains SHA-256 over the
 * chunks: key_k = H(key_{k-1}, chunk k's ids, its positions (M-RoPE) and every spliced row
 * with its place). The feature bits themselves are hashed, not the image's name: what is
 * compared is exactly what the prefill would read, whichever path (vision cache or not,
 * traced or not) produced it. Hashing a LLaVA-1.5 image's 576 rows (9 MiB) costs a few
 * milliseconds; prefilling them costs seconds. The whole prompt's key chains on over its
 * last, partial chunk. */
static mmrt_status prefix_keys(const struct mmrt_engine *e, struct mmrt_seq *s,
                               struct mmrt_error *err)
{
    const struct mmrt_prompt *p = &s->prompt;
    const int64_t c = e->o.prefill_chunk;
    if (e->max_prefixes == 0 || p->n_ids < 1)
        return MMRT_OK;
    const int64_t n = p->n_ids / c;
    if (n > 0 && !(s->pkeys = malloc((size_t)n * sizeof *s->pkeys)))
        return mmrt_error_set(err, MMRT_ERR_NO_MEMORY, "engine: out of memory");
    for (int64_t k = 0; k < n; k++)
        chunk_key(e, s, k ? s->pkeys[k - 1] : NULL, k * c, c, false, s->pkeys[k]);
    s->n_pkeys = n;
    chunk_key(e, s, n ? s->pkeys[n - 1] : NULL, n * c, p->n_ids - n * c, true, s->whole_key);
    s->has_whole_key = true;
    return MMRT_OK;
}

static struct prefix *prefix_find(struct mmrt_engine *e, const uint8_t *key)
{
    for (int i = 0; i < e->n_prefixes; i++)
        if (memcmp(e->prefixes[i].key, key, PREFIX_KEY) == 0)
            return &e->prefixes[i];
    return NULL;
}

/* Drops cached prefix i: its pages return to the store unless a sequence still uses them. */
static void prefix_drop(struct mmrt_engine *e, int i)
{
    struct prefix *x = &e->prefixes[i];
    for (int64_t j = x->n_pages; j-- > 0;)
        mmrt_kv_page_unpin(e->dec->kv, x->pages[j]);
    free(x->pages);
    free(x->logits);
    e->prefixes[i] = e->prefixes[--e->n_prefixes];
}

/* Drops the least recently used cached prefix; false when there is none. */
static bool prefix_evict(struct mmrt_engine *e)
{
    if (e->n_prefixes == 0)
        return false;
    int lru = 0;
    for (int i = 1; i < e->n_prefixes; i++)
        if (e->prefixes[i].used < e->prefixes[lru].used)
            lru = i;
    prefix_drop(e, lru);
    e->stats.prefix_evictions++;
    return true;
}

/* Before s's prefill: shares the longest cached prefix of its prompt that ends on a chunk
 * and a page boundary and leaves at least the prompt's last position to compute (its row
 * gives the first logits). s holds no page yet. */
static void prefix_attach(struct mmrt_engine *e, struct mmrt_seq *s)
{
    const int64_t c = e->o.prefill_chunk, P = e->dec->kv->page_tokens;
    int64_t k = (s->prompt.n_ids - 1) / c;
    if (k > s->n_pkeys)
        k = s->n_pkeys;
    for (; k >= 1; k--) {
        const int64_t b = k * c;
        if (b % P != 0)
            continue;
        struct prefix *x = prefix_find(e, s->pkeys[k - 1]);
        if (!x || x->logits || x->n_pages != b / P)
            continue;
        mmrt_kv_cache_share(&s->kv, x->pages, x->n_pages);
        x->used = ++e->prefix_tick;
        return;
    }
}

/* After a prefill chunk of s: when it ended on a boundary a later prompt may share from,
 * the pages before it are cached under its key (the least recently used prefix goes when
 * the store is full). Only prompt positions are cached: they are computed by prefill rows,
 * as any prompt computes them; generated tokens' K/V come from decode rows. */
static void prefix_insert(struct mmrt_engine *e, struct mmrt_seq *s)
{
    const int64_t c = e->o.prefill_chunk, P = e->dec->kv->page_tokens, b = s->kv.n_past;
    if (e->max_prefixes == 0 || b == 0 || b % c != 0 || b % P != 0 || b / c > s->n_pkeys ||
        b > s->prompt.n_ids)
        return;
    const uint8_t *key = s->pkeys[b / c - 1];
    struct prefix *x = prefix_find(e, key);
    if (x) {
        x->used = ++e->prefix_tick;
        return;
    }
    int32_t *pages = malloc((size_t)(b / P) * sizeof *pages);
    if (!pages)
        return; /* not cached: only a later prompt's speed depends on it */
    if (e->n_prefixes == e->max_prefixes)
        prefix_evict(e);
    x = &e->prefixes[e->n_prefixes++];
    memcpy(x->key, key, PREFIX_KEY);
    x->n_pages = b / P;
    x->n_tokens = b;
    x->pages = pages;
    x->logits = NULL;
    for (int64_t j = 0; j < x->n_pages; j++) {
        pages[j] = s->kv.page_ids[j];
        mmrt_kv_page_pin(e->dec->kv, pages[j]);
    }
    x->used = ++e->prefix_tick;
}

/* When s's prompt is whole in its cache and row holds its last position's logits: the
 * prompt is cached whole (the least recently used whole prompt goes past MAX_WHOLE), so
 * the same prompt again (another of n choices, a regenerated answer) prefills nothing and
 * gets these very logits and K/V, the bits its own prefill would give. */
static void whole_insert(struct mmrt_engine *e, struct mmrt_seq *s, const float *row)
{
    struct mmrt_kv_pages *kv = e->dec->kv;
    const int64_t n = s->prompt.n_ids, P = kv->page_tokens;
    if (!s->has_whole_key || s->kv.n_past != n || !mmrt_kv_page_copyable(kv))
        return;
    struct prefix *x = prefix_find(e, s->whole_key);
    if (x) {
        x->used = ++e->prefix_tick;
        return;
    }
    const int64_t n_pages = (n + P - 1) / P;
    int32_t *pages = malloc((size_t)n_pages * sizeof *pages);
    float *logits = malloc((size_t)e->dec->vocab * sizeof *logits);
    if (!pages || !logits) {
        free(pages);
        free(logits);
        return; /* not cached: only a later request's speed depends on it */
    }
    int whole = 0, lru = -1;
    for (int i = 0; i < e->n_prefixes; i++)
        if (e->prefixes[i].logits) {
            whole++;
            if (lru < 0 || e->prefixes[i].used < e->prefixes[lru].used)
                lru = i;
        }
    if (whole >= MAX_WHOLE) {
        prefix_drop(e, lru);
        e->stats.prefix_evictions++;
    }
    if (e->n_prefixes == e->max_prefixes)
        prefix_evict(e);
    x = &e->prefixes[e->n_prefixes++];
    memcpy(x->key, s->whole_key, PREFIX_KEY);
    x->n_pages = n_pages;
    x->n_tokens = n;
    x->pages = pages;
    for (int64_t j = 0; j < n_pages; j++) {
        pages[j] = s->kv.page_ids[j];
        mmrt_kv_page_pin(kv, pages[j]);
    }
    memcpy(logits, row, (size_t)e->dec->vocab * sizeof *logits);
    x->logits = logits;
    x->used = ++e->prefix_tick;
}

/* Before s's prefill: when its whole prompt is cached, s shares every full page, copies the
 * last, partly filled one (its writer goes on writing that page past the prompt, and so will
 * s), and keeps the logits for its first token. s holds no page yet. False, holding none,
 * when the prompt is not cached or the copy cannot be made. */
static bool whole_attach(struct mmrt_engine *e, struct mmrt_seq *s)
{
    struct mmrt_kv_pages *kv = e->dec->kv;
    const int64_t n = s->prompt.n_ids, P = kv->page_tokens, full = n / P;
    if (!s->has_whole_key || s->n_known != n)
        return false;
    struct prefix *x = prefix_find(e, s->whole_key);
    if (!x || !x->logits || x->n_tokens != n || (n % P != 0 && kv->n_free < 1))
        return false;
    float *logits = malloc((size_t)e->dec->vocab * sizeof *logits);
    if (!logits)
        return false;
    mmrt_kv_cache_share(&s->kv, x->pages, full);
    struct mmrt_error err = { 0 };
    if (n % P != 0 && (mmrt_kv_cache_reserve(&s->kv, n, &err) != MMRT_OK ||
                       mmrt_kv_page_copy(kv, x->pages[full], s->kv.page_ids[full], &err) !=
                           MMRT_OK)) {
        mmrt_log(MMRT_LOG_DEBUG, "engine", "a cached prompt was not taken: %s", err.msg);
        mmrt_kv_cache_drop(&s->kv);
        free(logits);
        return false;
    }
    s->kv.n_past = n;
    memcpy(logits, x->logits, (size_t)e->dec->vocab * sizeof *logits);
    s->whole = logits;
    x->used = ++e->prefix_tick;
    e->stats.prompt_hits++;
    return true;
}

/* The request's stop strings (runtime.c checked count, lengths and UTF-8). */
static mmrt_status copy_stops(struct mmrt_seq *s, const struct mmrt_request *q,
                              struct mmrt_error *err)
{
    if (q->n_stop <= 0)
        return MMRT_OK;
    s->stop = calloc((size_t)q->n_stop, sizeof *s->stop);
    if (!s->stop)
        return mmrt_error_set(err, MMRT_ERR_NO_MEMORY, "engine: out of memory");
    for (int i = 0; i < q->n_stop; i++) {
        s->stop[i] = strdup(q->stop[i]);
        if (!s->stop[i])
            return mmrt_error_set(err, MMRT_ERR_NO_MEMORY, "engine: out of memory");
        s->n_stop = i + 1;
        const size_t len = strlen(q->stop[i]);
        if (len > s->stop_max)
            s->stop_max = len;
    }
    s->held = malloc(s->stop_max);
    if (!s->held)
        return mmrt_error_set(err, MMRT_ERR_NO_MEMORY, "engine: out of memory");
    return MMRT_OK;
}

mmrt_status mmrt_engine_submit(struct mmrt_engine *e, struct mmrt_engine_request *r,
                               struct mmrt_seq **out, struct mmrt_error *err)
{
    *out = NULL;
    struct mmrt_seq *s = calloc(1, sizeof *s);
    if (!s) {
        mmrt_prompt_free(r->prompt);
        mmrt_vision_output_free(r->vision);
        return mmrt_error_set(err, MMRT_ERR_NO_MEMORY, "engine: out of memory");
    }
    s->e = e;
    s->prompt = *r->prompt;
    s->vision = *r->vision;
    memset(r->prompt, 0, sizeof *r->prompt);
    memset(r->vision, 0, sizeof *r->vision);
    s->max_tokens = resolve_max_tokens(e, &s->prompt, r->req->max_tokens);
    s->t_submit = mmrt_now_ms();
    s->trace = r->trace;
    s->on_token = r->on_token;
    s->on_logprobs = r->req->logprobs ? r->on_logprobs : NULL;
    s->top_logprobs = r->req->top_logprobs;
    s->json = r->req->response_format == MMRT_RESPONSE_JSON_OBJECT ||
              r->req->response_format == MMRT_RESPONSE_JSON_SCHEMA;
    s->user = r->user;
    s->res = r->result;
    atomic_init(&s->cancel, false);
    const struct mmrt_request *q = r->req;
    mmrt_status st = check_prompt(e, &s->prompt, &s->vision, s->max_tokens, err);
    if (st == MMRT_OK)
        st = mmrt_sampler_init(&s->sampler, e->dec->vocab,
                               &(struct mmrt_sampling){
                                   .temperature = q->temperature, .top_k = q->top_k,
                                   .top_p = q->top_p, .seed = q->seed,
                                   .repetition_penalty = q->repetition_penalty,
                                   .presence_penalty = q->presence_penalty,
                                   .frequency_penalty = q->frequency_penalty,
                                   .logit_bias = q->logit_bias,
                                   .n_logit_bias = q->n_logit_bias },
                               err);
    if (st == MMRT_OK && s->json)
        st = json_ready(e, err);
    if (st == MMRT_OK && s->json) {
        st = r->schema ? MMRT_OK
                       : mmrt_error_set(err, MMRT_ERR_INVALID_ARG, "a JSON answer needs its "
                                        "compiled schema");
        if (st == MMRT_OK) {
            s->schema = mmrt_json_schema_hold(r->schema);
            mmrt_json_answer_init(&s->answer, s->schema);
        }
    }
    if (st == MMRT_OK)
        st = mmrt_kv_cache_alloc(e->dec->kv, s->prompt.n_ids + s->max_tokens, &s->kv, err);
    if (st == MMRT_OK)
        st = mmrt_tokenizer_stream_create(e->lang.tok, MMRT_DECODE_SKIP_SPECIAL, &s->stream,
                                          err);
    if (st == MMRT_OK)
        st = copy_stops(s, q, err);
    if (st == MMRT_OK && q->prediction && q->prediction[0]) {
        /* As text of the answer: no special tokens added (the answer's own begin after the
         * template's). */
        size_t n = 0;
        st = mmrt_tokenizer_encode(e->lang.tok, q->prediction, strlen(q->prediction), 0,
                                   &s->pred, &n, err);
        s->n_pred = (int64_t)n;
        if (st != MMRT_OK)
            mmrt_error_prefix(err, st, "request: prediction");
    }
    if (st == MMRT_OK)
        st = prefix_keys(e, s, err);
    if (st == MMRT_OK) {
        s->tokens = malloc((size_t)(s->prompt.n_ids + s->max_tokens) * sizeof *s->tokens);
        if (!s->tokens)
            st = mmrt_error_set(err, MMRT_ERR_NO_MEMORY, "engine: out of memory");
    }
    if (st == MMRT_OK && e->n_live == e->cap_live) {
        int cap = e->cap_live ? 2 * e->cap_live : 16;
        struct mmrt_seq **g = realloc(e->live, (size_t)cap * sizeof *g);
        if (!g)
            st = mmrt_error_set(err, MMRT_ERR_NO_MEMORY, "engine: out of memory");
        else
            e->live = g, e->cap_live = cap;
    }
    if (st != MMRT_OK) {
        seq_free_parts(s);
        free(s);
        return st;
    }
    memcpy(s->tokens, s->prompt.ids, (size_t)s->prompt.n_ids * sizeof *s->tokens);
    s->n_known = s->prompt.n_ids;
    s->res->n_prompt_tokens = (int)s->prompt.n_ids;
    s->res->preprocess_ms = s->vision.preprocess_ms;
    s->res->vision_ms = s->vision.vision_ms;
    if (s->trace && s->trace->prompt_ids)
        s->trace->prompt_ids(s->trace->user, s->prompt.ids, (int)s->prompt.n_ids);
    s->state = SEQ_WAITING;
    s->arrival = ++e->next_arrival;
    e->live[e->n_live++] = s;
    *out = s;
    return MMRT_OK;
}

bool mmrt_engine_done(const struct mmrt_seq *s)
{
    return s->state == SEQ_DONE;
}

void mmrt_engine_cancel(struct mmrt_seq *s)
{
    atomic_store(&s->cancel, true);
}

void mmrt_engine_release(struct mmrt_seq *s)
{
    if (!s)
        return;
    if (s->state != SEQ_DONE)
        finish(s->e, s, MMRT_ERR_CANCELLED, "cancelled");
    seq_free_parts(s);
    free(s);
}

bool mmrt_engine_idle(const struct mmrt_engine *e)
{
    return e->n_live == 0;
}

void mmrt_engine_get_stats(const struct mmrt_engine *e, struct mmrt_engine_stats *out)
{
    *out = e->stats;
    out->waiting = out->running = 0;
    out->prefix_entries = e->n_prefixes;
    out->prefix_pages = e->dec->kv->n_pinned;
    for (int i = 0; i < e->n_live; i++) {
        out->waiting += e->live[i]->state == SEQ_WAITING;
        out->running += e->live[i]->state == SEQ_PREFILL || e->live[i]->state == SEQ_DECODE;
    }
}

/* ---- scheduling ----------------------------------------------------------------------- */

static bool running(const struct mmrt_seq *s)
{
    return s->state == SEQ_PREFILL || s->state == SEQ_DECODE;
}

static void preempt(struct mmrt_engine *e, struct mmrt_seq *s)
{
    mmrt_kv_cache_drop(&s->kv);
    free(s->whole);
    s->whole = NULL;
    s->dropped = 0;
    s->state = SEQ_WAITING;
    s->admitted = 0;
    e->stats.preemptions++;
    mmrt_log(MMRT_LOG_DEBUG, "engine", "preempted a sequence of %lld tokens (KV pages ran out)",
             (long long)s->n_known);
}

static struct mmrt_seq *youngest_running(const struct mmrt_engine *e)
{
    struct mmrt_seq *y = NULL;
    for (int i = 0; i < e->n_live; i++)
        if (running(e->live[i]) && (!y || e->live[i]->admitted > y->admitted))
            y = e->live[i];
    return y;
}

static int n_running(const struct mmrt_engine *e)
{
    int n = 0;
    for (int i = 0; i < e->n_live; i++)
        n += running(e->live[i]);
    return n;
}

/* The waiting sequence that arrived first, or NULL. */
static struct mmrt_seq *first_waiting(const struct mmrt_engine *e)
{
    struct mmrt_seq *f = NULL;
    for (int i = 0; i < e->n_live; i++)
        if (e->live[i]->state == SEQ_WAITING && (!f || e->live[i]->arrival < f->arrival))
            f = e->live[i];
    return f;
}

/* Admission: in arrival order, while a running slot is free and the store has pages for
 * everything the sequence already knows (a resumed one recomputes that much). The prompt's
 * pages are taken now, so no prefill ever waits for pages. */
static void admit(struct mmrt_engine *e)
{
    int n = n_running(e);
    struct mmrt_seq *s;
    while (n < e->o.max_batch && (s = first_waiting(e)) != NULL) {
        const struct mmrt_kv_pages *p = e->dec->kv;
        if (!whole_attach(e, s))
            prefix_attach(e, s);
        /* Cached prefixes give their pages back before a request waits for them. */
        const int64_t need = mmrt_kv_cache_pages_needed(&s->kv, s->n_known);
        while (need > p->n_free && prefix_evict(e)) {
        }
        if (need > p->n_free) {
            mmrt_kv_cache_drop(&s->kv);
            break;
        }
        struct mmrt_error err = { 0 };
        if (mmrt_kv_cache_reserve(&s->kv, s->prompt.n_ids, &err) != MMRT_OK) {
            finish(e, s, MMRT_ERR_LIMIT, err.msg);
            continue;
        }
        if (s->kv.n_past > 0) {
            e->stats.prefix_hits++;
            e->stats.prefix_reused_tokens += (uint64_t)s->kv.n_past;
        }
        s->state = SEQ_PREFILL;
        s->admitted = ++e->next_admitted;
        if (s->t_first_chunk == 0)
            s->t_first_chunk = mmrt_now_ms();
        n++;
    }
    if (n > e->stats.max_running)
        e->stats.max_running = n;
}

/* Sorts sequences by admission (oldest first). */
static int by_admission(const void *a, const void *b)
{
    const struct mmrt_seq *x = *(struct mmrt_seq *const *)a, *y = *(struct mmrt_seq *const *)b;
    return x->admitted < y->admitted ? -1 : x->admitted > y->admitted;
}

/* The running sequences in state `st`, oldest first, into out (at most max_batch). */
static int collect(const struct mmrt_engine *e, enum seq_state st, struct mmrt_seq **out)
{
    int n = 0;
    for (int i = 0; i < e->n_live && n < e->o.max_batch; i++)
        if (e->live[i]->state == st)
            out[n++] = e->live[i];
    qsort(out, (size_t)n, sizeof *out, by_admission);
    return n;
}

static void fail_parts(struct mmrt_engine *e, const struct part *parts, int n, mmrt_status st,
                       const char *msg)
{
    for (int i = 0; i < n; i++)
        if (parts[i].s->state != SEQ_DONE)
            finish(e, parts[i].s, st, msg);
}

/* Up to k tokens that followed the latest earlier place where s's last n tokens came too
 * (n from DRAFT_NGRAM_MAX down to DRAFT_NGRAM_MIN: the longest match says the most), into
 * out; returns how many. Answers often repeat what their prompt or they themselves said: a
 * quoted text, a list's pattern, a JSON answer's keys. */
static int draft(const struct mmrt_seq *s, int k, int32_t *out)
{
    const int32_t *t = s->tokens;
    const int64_t end = s->n_known;
    for (int n = DRAFT_NGRAM_MAX; n >= DRAFT_NGRAM_MIN; n--) {
        if (end <= n)
            continue;
        const int32_t *tail = t + end - n;
        /* A match at i has a follower t[i + n] before the end: i ≤ end − n − 1. */
        for (int64_t i = end - n - 1; i >= 0; i--) {
            int j = 0;
            while (j < n && t[i + j] == tail[j])
                j++;
            if (j < n)
                continue;
            const int64_t m = end - (i + n) < k ? end - (i + n) : k;
            memcpy(out, t + i + n, (size_t)m * sizeof *out);
            return (int)m;
        }
    }
    return 0;
}

/* Up to k tokens of s's prediction that should follow its answer so far, into out; returns
 * how many. An answer is expected to follow its prediction with edits. Before its first
 * token it is at the prediction's start. After, its last tokens (a run of 3, else 2, else 1,
 * all its own) are looked up in the prediction from where the last run was found on (a
 * single token only a few places on, a longer run up to PREDICT_REACH), and the tokens after
 * the first match are drafted.
 * Where the answer leaves the prediction (an edit), nothing matches until it comes back. */
static int predict(struct mmrt_seq *s, int k, int32_t *out)
{
    int64_t from = s->n_gen > 0 ? -1 : 0;
    for (int n = s->n_gen < DRAFT_NGRAM_MAX ? s->n_gen : DRAFT_NGRAM_MAX; n >= 1 && from < 0;
         n--) {
        const int32_t *tail = s->tokens + s->n_known - n;
        const int64_t lo = s->pred_at > n ? s->pred_at - n : 0;
        const int64_t hi = lo + (n > 1 ? PREDICT_REACH : PREDICT_SINGLE_REACH);
        for (int64_t i = lo; i <= hi && i + n <= s->n_pred && from < 0; i++)
            if (memcmp(s->pred + i, tail, (size_t)n * sizeof *tail) == 0)
                from = i + n;
    }
    if (from < 0)
        return 0;
    s->pred_at = from;
    const int64_t m = s->n_pred - from < k ? s->n_pred - from : k;
    memcpy(out, s->pred + from, (size_t)m * sizeof *out);
    return (int)m;
}

/* How many of drafts[0, k) s could take in a row: none past an end token (the answer ends
 * there), none a JSON answer's schema refuses (its sampler never picks one). */
static int drafts_that_can_be_taken(const struct mmrt_engine *e, const struct mmrt_seq *s,
                                    const int32_t *drafts, int k)
{
    struct mmrt_json_answer a[2];
    if (s->json)
        mmrt_json_answer_copy(&a[0], &s->answer);
    for (int j = 0; j < k; j++) {
        if (s->json && !mmrt_json_answer_fits(&a[j & 1], &e->texts, e->plain, drafts[j],
                                              &a[(j + 1) & 1]))
            return j;
        if (is_eos(e, drafts[j]) || (s->json && mmrt_json_answer_done(&a[(j + 1) & 1])))
            return j + 1;
    }
    return k;
}

/* More rows for s's decode step, at most `room`, as decode rows parts[0, k) of the tokens
 * drafts[0, k) at the positions after its decode row's; returns k. Each is one more query
 * of s, in a sequence of its own in the step's plan (its page table, its key count): the
 * arithmetic of a decode row, so its K/V and logits are the bits a later step would compute
 * with the same token there. A resumed sequence gets rows for the tokens it had generated
 * (replayed several a step, every one right); one that samples gets drafted tokens, from its
 * request's prediction (predict()) or else from itself (draft()), right when its sampler
 * picks them. The rows take only pages that are free: they never evict a cached prefix or
 * preempt a sequence. */
static int add_rows(const struct mmrt_engine *e, struct mmrt_seq *s, int room,
                    struct part *parts, int32_t *drafts)
{
    const int64_t at = s->kv.n_past + s->dropped + 1; /* the slot after the decode row's */
    int k;
    if (at < s->n_known) {
        k = s->n_known - at < room ? (int)(s->n_known - at) : room;
        memcpy(drafts, s->tokens + at, (size_t)k * sizeof *drafts);
    } else {
        k = e->o.draft_tokens > 0 ? e->o.draft_tokens : MMRT_ENGINE_PREDICTION_DRAFTS;
        k = k < room ? k : room;
        /* Tokens s may take after the decode row's: a draft past them is never used. */
        const int left = s->max_tokens - s->n_gen - 1;
        k = k > left ? left : k;
        /* The request's prediction first; where it has nothing, the sequence itself. */
        const int predicted = k > 0 && s->pred ? predict(s, k, drafts) : 0;
        s->drafts_predicted = predicted > 0;
        k = predicted > 0 ? predicted : k > 0 && e->o.draft_tokens > 0 ? draft(s, k, drafts) : 0;
        k = drafts_that_can_be_taken(e, s, drafts, k);
    }
    const int64_t first = s->kv.n_past + 1; /* the rows' KV positions */
    const int64_t need = k > 0 ? mmrt_kv_cache_pages_needed(&s->kv, first + k) : 0;
    struct mmrt_error err = { 0 };
    if (need > 0 && (need > s->kv.pages->n_free ||
                     mmrt_kv_cache_reserve(&s->kv, first + k, &err) != MMRT_OK)) {
        const int64_t held = s->kv.n_held * s->kv.pages->page_tokens - first;
        k = held < k ? (int)held : k;
    }
    for (int j = 0; j < k; j++) {
        s->tokens[at + j] = drafts[j];
        parts[j] = (struct part){ s, at + j, 1, true };
    }
    if (at >= s->n_known && s->drafts_predicted && k > 0)
        s->pred_drafted += k;
    return k > 0 ? k : 0;
}

/* One decode row per decoding sequence, each with a page for its new position. When the
 * store has none, the youngest running sequence gives its pages back. Rows the step has
 * room for replay a resumed sequence's tokens, and with drafts on check drafted tokens: the
 * sequence takes each draft its own sampler picks (the same draw it makes without drafts)
 * and stops at the first it does not. */
static void decode_step(struct mmrt_engine *e)
{
    struct mmrt_seq *seqs[MMRT_SMALL_M];
    int n = collect(e, SEQ_DECODE, seqs);
    int B = 0;
    for (int i = 0; i < n; i++) {
        struct mmrt_seq *s = seqs[i];
        if (s->state != SEQ_DECODE) /* preempted for an older one */
            continue;
        struct mmrt_error err = { 0 };
        while (mmrt_kv_cache_reserve(&s->kv, s->kv.n_past + 1, &err) != MMRT_OK) {
            if (prefix_evict(e)) /* cached prefixes go before a running sequence */
                continue;
            struct mmrt_seq *y = youngest_running(e);
            preempt(e, y);
            if (y == s)
                break;
        }
        if (s->state == SEQ_DECODE)
            e->parts[B++] = (struct part){ s, s->kv.n_past + s->dropped, 1, true };
    }
    /* A sequence preempted after its page check may sit in parts: drop it. */
    int k = 0;
    for (int i = 0; i < B; i++)
        if (e->parts[i].s->state == SEQ_DECODE)
            e->parts[k++] = e->parts[i];
    B = k;
    if (B == 0)
        return;
    /* Sequence i's further rows are [d0[i], d0[i] + nd[i]), after every sequence's own:
     * replays up to the forward's rows, drafts up to draft_rows. */
    int d0[MMRT_SMALL_M], nd[MMRT_SMALL_M];
    int R = B;
    for (int i = 0; i < B; i++) {
        const struct mmrt_seq *s = e->parts[i].s;
        const int cap = s->kv.n_past + s->dropped + 1 < s->n_known ? (int)e->decode_cap
                        : e->o.draft_tokens > 0 || s->pred         ? e->o.draft_rows
                                                                   : 0;
        d0[i] = R;
        nd[i] = R < cap ? add_rows(e, e->parts[i].s, cap - R, e->parts + R, e->drafts + R) : 0;
        R += nd[i];
    }
    struct mmrt_error err = { 0 };
    bool graph = false;
    mmrt_status st = forward(e, &e->decode, e->parts, R, true, &graph, &err);
    e->stats.decode_forwards++;
    e->stats.decode_rows += (uint64_t)R;
    if (st != MMRT_OK) {
        fail_parts(e, e->parts, R, st, err.msg);
        return;
    }
    const int64_t V = e->dec->vocab;
    for (int i = 0; i < B; i++) {
        struct mmrt_seq *s = e->parts[i].s;
        s->kv.n_past++;
        s->graph |= graph;
        if (atomic_load(&s->cancel))
            continue; /* finished at the next step */
        const float *row = e->logits + (int64_t)i * V;
        if (s->kv.n_past + s->dropped < s->n_known) {
            /* Recomputing a preempted sequence: its further rows are its own tokens. The
             * row of its last known token gives the next one. */
            s->kv.n_past += nd[i];
            const bool caught_up = s->kv.n_past + s->dropped == s->n_known;
            e->stats.replay_rows += (uint64_t)nd[i] + !caught_up;
            if (caught_up)
                take_token(e, s, e->logits + (int64_t)(d0[i] + nd[i] - 1) * V);
            continue;
        }
        e->stats.draft_rows += (uint64_t)nd[i];
        take_token(e, s, row);
        /* A draft equal to the token just taken was the right input at its position: its
         * K/V stand, and its row's logits give the next token. */
        for (int j = 0; j < nd[i] && s->state == SEQ_DECODE &&
                        s->tokens[s->n_known - 1] == e->drafts[d0[i] + j];
             j++) {
            s->kv.n_past++;
            e->stats.draft_accepted++;
            s->pred_accepted += s->drafts_predicted;
            take_token(e, s, e->logits + (int64_t)(d0[i] + j) * V);
        }
    }
}

/* The next chunk of s's prompt: up to the next multiple of prefill_chunk. */
static int64_t chunk_len(const struct mmrt_engine *e, const struct mmrt_seq *s)
{
    const int64_t c = e->o.prefill_chunk, at = s->kv.n_past;
    const int64_t end = (at / c + 1) * c;
    return (end < s->prompt.n_ids ? end : s->prompt.n_ids) - at;
}

/* Image-token KV compression of s, whose prompt is now in its cache. Copying the pages s
 * shares needs free pages; lacking them is met as a decode step meets it (cached prefixes go
 * first, then the youngest running sequence, s itself if it is the youngest), never by
 * skipping: a request compresses the same way whatever runs beside it. */
static void compress(struct mmrt_engine *e, struct mmrt_seq *s)
{
    if (!mmrt_kv_compress_on(&e->o.image_kv) || s->prompt.n_grids == 0)
        return;
    for (;;) {
        struct mmrt_error err = { 0 };
        int64_t dropped = 0;
        bool ruined = false;
        mmrt_status st = mmrt_kv_compress(e->dec->kv, &s->kv, &s->prompt, &e->o.image_kv,
                                          e->o.prefill_chunk, &dropped, &ruined, &err);
        if (st == MMRT_OK) {
            s->dropped = dropped;
            e->stats.image_kv_compressions += dropped > 0;
            e->stats.image_kv_dropped_tokens += (uint64_t)dropped;
            return;
        }
        if (st != MMRT_ERR_LIMIT || ruined) {
            finish(e, s, st, err.msg);
            return;
        }
        if (prefix_evict(e))
            continue;
        struct mmrt_seq *y = youngest_running(e);
        preempt(e, y);
        if (y == s)
            return;
    }
}

/* s's prompt is in its cache and row holds its last position's logits. */
static void prompt_done(struct mmrt_engine *e, struct mmrt_seq *s, const float *row)
{
    s->state = SEQ_DECODE;
    if (s->n_known == s->prompt.n_ids && !atomic_load(&s->cancel))
        take_token(e, s, row); /* a fresh prompt's first token */
    /* else: resumed after preemption; its generated tokens replay as decode rows */
}

static void prefill_run(struct mmrt_engine *e, const struct part *parts, int n)
{
    int64_t M = 0, O = 0;
    for (int i = 0; i < n; i++) {
        M += parts[i].n;
        O += parts[i].logits;
    }
    struct mmrt_error err = { 0 };
    struct fwd f;
    bool graph;
    mmrt_status st = fwd_create(e, M, n, O, &f, &err);
    if (st == MMRT_OK)
        st = forward(e, &f, parts, n, false, &graph, &err);
    fwd_destroy(e, &f);
    e->stats.prefill_forwards++;
    e->stats.prefill_rows += (uint64_t)M;
    if (st != MMRT_OK) {
        fail_parts(e, parts, n, st, err.msg);
        return;
    }
    for (int i = 0, o = 0; i < n; i++) {
        struct mmrt_seq *s = parts[i].s;
        s->kv.n_past += parts[i].n;
        prefix_insert(e, s);
        if (!parts[i].logits)
            continue;
        const float *row = e->logits + (int64_t)o++ * e->dec->vocab;
        if (s->n_known == s->prompt.n_ids)
            whole_insert(e, s, row);
        prompt_done(e, s, row);
    }
    /* Compression last: finding pages for it may preempt any running sequence, one of these
     * parts too, whose bookkeeping above must be complete by then. */
    for (int i = 0; i < n; i++)
        if (parts[i].logits && parts[i].s->state == SEQ_DECODE && parts[i].s->dropped == 0)
            compress(e, parts[i].s);
}

/* Prefill chunks of the oldest prefilling sequences within the step's token budget. Chunks
 * of more than MMRT_SMALL_M rows share one forward; shorter ones run alone, so each gets the
 * kernel path it would get alone. */
static void prefill_step(struct mmrt_engine *e, int64_t budget)
{
    struct mmrt_seq *seqs[MMRT_SMALL_M];
    int n = collect(e, SEQ_PREFILL, seqs);
    /* Cached whole prompts first: their first token needs no forward. Compressing one may
     * preempt others, so the rest are gathered again after. */
    bool took = false;
    for (int i = 0; i < n; i++) {
        struct mmrt_seq *s = seqs[i];
        if (!s->whole || s->state != SEQ_PREFILL)
            continue;
        float *row = s->whole;
        s->whole = NULL;
        prompt_done(e, s, row);
        free(row);
        if (s->state == SEQ_DECODE)
            compress(e, s);
        took = true;
    }
    if (took)
        n = collect(e, SEQ_PREFILL, seqs);
    int n_big = 0;
    int64_t used = 0;
    struct part small[MMRT_SMALL_M];
    int n_small = 0;
    for (int i = 0; i < n; i++) {
        struct mmrt_seq *s = seqs[i];
        const int64_t len = chunk_len(e, s);
        if (used > 0 && used + len > budget)
            break;
        used += len;
        const struct part p = { s, s->kv.n_past, len, s->kv.n_past + len == s->prompt.n_ids };
        if (len > MMRT_SMALL_M)
            e->parts[n_big++] = p;
        else
            small[n_small++] = p;
    }
    if (n_big)
        prefill_run(e, e->parts, n_big);
    for (int i = 0; i < n_small; i++)
        prefill_run(e, &small[i], 1);
}

mmrt_status mmrt_engine_step(struct mmrt_engine *e, struct mmrt_error *err)
{
    (void)err;
    for (int i = e->n_live; i-- > 0;) {
        struct mmrt_seq *s = e->live[i];
        if (atomic_load(&s->cancel))
            finish(e, s, MMRT_ERR_CANCELLED, "cancelled");
    }
    if (e->n_live == 0)
        return MMRT_OK;
    e->stats.steps++;
    admit(e);
    const uint64_t rows_before = e->stats.decode_rows;
    decode_step(e);
    const int64_t B = (int64_t)(e->stats.decode_rows - rows_before);
    prefill_step(e, e->o.step_tokens - B);
    return MMRT_OK;
}

/* ---- lifetime ------------------------------------------------------------------------- */

void mmrt_engine_destroy(struct mmrt_engine *e)
{
    if (!e)
        return;
    for (int b = 0; b <= MMRT_SMALL_M; b++)
        mmrt_dev_graph_destroy(e->dec->dev, e->graphs[b]);
    while (e->n_prefixes > 0)
        prefix_drop(e, e->n_prefixes - 1);
    free(e->prefixes);
    fwd_destroy(e, &e->decode);
    free(e->live);
    free(e->logits);
    free(e->parts);
    free(e->drafts);
    mmrt_token_texts_free(&e->texts);
    free(e->plain);
    free(e->masked);
    free(e);
}

mmrt_status mmrt_engine_create(const struct mmrt_language *lang,
                               const struct mmrt_engine_options *opts, struct mmrt_engine **out,
                               struct mmrt_error *err)
{
    *out = NULL;
    struct mmrt_engine_options o = opts ? *opts : (struct mmrt_engine_options){ 0 };
    if (o.max_batch == 0)
        o.max_batch = MMRT_ENGINE_DEFAULT_BATCH;
    if (o.prefill_chunk == 0)
        o.prefill_chunk = MMRT_ENGINE_DEFAULT_CHUNK;
    if (o.max_batch < 1 || o.max_batch > MMRT_SMALL_M)
        return mmrt_error_set(err, MMRT_ERR_CONFIG, "[scheduler] max_batch %d must be 1 … %d",
                              o.max_batch, MMRT_SMALL_M);
    if (o.prefill_chunk < 1 || o.prefill_chunk > (1 << 20))
        return mmrt_error_set(err, MMRT_ERR_CONFIG,
                              "[scheduler] prefill_chunk %lld must be 1 … %d",
                              (long long)o.prefill_chunk, 1 << 20);
    if (o.step_tokens == 0)
        o.step_tokens = o.prefill_chunk + o.max_batch;
    if (o.step_tokens < 1)
        return mmrt_error_set(err, MMRT_ERR_CONFIG, "[scheduler] step_tokens %lld must be at "
                              "least 1", (long long)o.step_tokens);
    if (!(o.image_kv.keep >= 0 && o.image_kv.keep <= 1) ||
        o.image_kv.policy < MMRT_IMAGE_KV_DEFAULT || o.image_kv.policy > MMRT_IMAGE_KV_POOL2X2)
        return mmrt_error_set(err, MMRT_ERR_CONFIG, "engine: image_kv_keep %g must be in [0, 1] "
                              "and image_kv_policy %d a policy", o.image_kv.keep,
                              (int)o.image_kv.policy);
    o.draft_rows = mmrt_engine_draft_rows(o.draft_tokens, o.draft_rows);
    if (o.draft_tokens < 0 || o.draft_tokens >= MMRT_SMALL_M || o.draft_rows < 2 ||
        o.draft_rows > MMRT_SMALL_M)
        return mmrt_error_set(err, MMRT_ERR_CONFIG, "[scheduler] draft_tokens %d must be 0 … %d "
                              "and draft_rows %d 2 … %d", o.draft_tokens, MMRT_SMALL_M - 1,
                              o.draft_rows, MMRT_SMALL_M);
    if (o.prefix_entries > MAX_PREFIXES)
        return mmrt_error_set(err, MMRT_ERR_CONFIG, "engine: prefix_entries %d must be at most "
                              "%d", o.prefix_entries, MAX_PREFIXES);
    struct mmrt_engine *e = calloc(1, sizeof *e);
    if (!e)
        return mmrt_error_set(err, MMRT_ERR_NO_MEMORY, "engine: out of memory");
    e->lang = *lang;
    e->dec = lang->decoder;
    e->o = o;
    e->try_graph = o.use_graph && mmrt_dev_can_capture(e->dec->dev);
    /* Logits rows: a decode step has max_batch, or draft_rows with drafts or a prediction;
     * a prefill forward at most max_batch. */
    e->decode_cap = o.draft_rows > o.max_batch ? o.draft_rows : o.max_batch;
    e->logits = malloc((size_t)e->decode_cap * (size_t)e->dec->vocab * sizeof *e->logits);
    e->parts = calloc((size_t)e->decode_cap, sizeof *e->parts);
    e->drafts = calloc((size_t)e->decode_cap, sizeof *e->drafts);
    e->max_prefixes = o.prefix_entries < 0 ? 0
                      : o.prefix_entries ? o.prefix_entries : MMRT_ENGINE_DEFAULT_PREFIXES;
    e->prefixes = e->max_prefixes ? calloc((size_t)e->max_prefixes, sizeof *e->prefixes) : NULL;
    mmrt_status st = e->logits && e->parts && e->drafts && (e->prefixes || !e->max_prefixes)
                         ? fwd_create(e, e->decode_cap, e->decode_cap, e->decode_cap, &e->decode,
                                      err)
                         : mmrt_error_set(err, MMRT_ERR_NO_MEMORY, "engine: out of memory");
    if (st != MMRT_OK) {
        mmrt_engine_destroy(e);
        return st;
    }
    *out = e;
    return MMRT_OK;
}
