/*
 * tests/test_sampler_bench.c — sampler-bench: what picking one token costs the engine thread
 * (core/sampler.c), per sequence and per step, at a vocabulary's size.
 *
 * The engine samples every sequence's next token on its own thread between two decode
 * steps, so at B sequences a step waits B samplings. A row here is a model's logits as they
 * look to the sampler: --vocab values drawn from a normal distribution of standard deviation
 * --spread (seeded), so a top_p set is a few hundred tokens, as with a real model's logits.
 * For each vocabulary size it prints the best of --repeat calls (each call --draws tokens
 * from --rows rows, cycling), in ms per token, and a digest of the tokens drawn.
 *
 * Two costs that only some requests pay are timed beside it, in ms per token:
 *   --logprobs K   the log-softmax and the K most likely tokens (mmrt_sampler_logprobs), which
 *                  a request with logprobs pays on every token;
 *   --json 1       one mask pass of a JSON answer (mmrt_json_answer_mask) over a vocabulary
 *                  of made-up texts (letters mostly, some spaces, digits, punctuation and
 *                  byte tokens), at two places: inside a string (nearly every token fits;
 *                  timed with the plain-token flags the engine uses, and with every text
 *                  fed), after an object key (only ':' may come), and at the start of
 *                  a key of a JSON schema's object with eight listed keys (json_schema
 *                  mode: each text tried against the keys' literals) and inside a string
 *                  held to a pattern (each text's characters through its automaton). A JSON answer
 *                  pays a pass only on a step whose first pick does not fit. With it, the
 *                  one-time table of every token's text (mmrt_tokenizer_token_texts, made at
 *                  an engine's first JSON request) is timed on a byte-level BPE tokenizer of
 *                  the vocabulary's size (256 byte tokens, then made-up 2-8 byte tokens).
 *
 * usage: sampler-bench [--temperature T] [--top-k K] [--top-p P] [--spread S] [--rows R]
 *                      [--draws N] [--repeat R] [--logprobs K] [--json 1] VOCAB…
 */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "bench_util.h"
#include "formats/tokenizer.h"
#include "json_answer.h"
#include "sampler.h"

static int usage(void)
{
    fprintf(stderr, "usage: sampler-bench [--temperature T] [--top-k K] [--top-p P] "
                    "[--spread S] [--rows R] [--draws N] [--repeat R] [--logprobs K] "
                    "[--json 1] VOCAB…\n");
    return 2;
}

/* A standard normal value (Box–Muller on the seeded stream). */
static double normal(uint64_t *state)
{
    const double u = ((double)(bench_rng_u64(state) >> 11) + 0.5) * 0x1.0p-53;
    const double v = (double)(bench_rng_u64(state) >> 11) * 0x1.0p-53;
    return sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v);
}

/* A made-up vocabulary of `n` texts for the JSON mask (see the top). */
static bool fake_texts(long n, struct mmrt_token_texts *t)
{
    static const char letters[] = "etaoinshrdlucmfwypvbgkqjxz";
    static const char other[] = " 0123456789{}[]\":,.-_!?";
    memset(t, 0, sizeof *t);
    t->n = (uint32_t)n;
    t->off = malloc(((size_t)n + 1) * sizeof *t->off);
    t->byte = malloc((size_t)n * sizeof *t->byte);
    t->special = calloc((size_t)n, 1);
    t->blob = malloc((size_t)n * 8);
    if (!t->off || !t->byte || !t->special || !t->blob)
        return false;
    uint64_t state = 0x15A7ull;
    uint32_t o = 0;
    for (long i = 0; i < n; i++) {
        t->off[i] = o;
        const uint64_t r = bench_rng_u64(&state);
        t->byte[i] = (int16_t)(i < 256 ? i : -1); /* 256 byte tokens, as LLaMA's */
        const int len = i < 256 ? 1 : 1 + (int)(r % 7);
        for (int k = 0; k < len; k++) {
            const uint64_t c = bench_rng_u64(&state);
            t->blob[o++] = c % 8 == 0 ? other[(c >> 8) % (sizeof other - 1)]
                           : k == 0 && c % 3 == 0 ? ' '
                                                  : letters[(c >> 8) % (sizeof letters - 1)];
        }
    }
    t->off[n] = o;
    return true;
}

/* A byte-level BPE tokenizer of n tokens (no merges: only decoding is timed). */
static struct mmrt_tokenizer *fake_tokenizer(long n)
{
    static const char letters[] = "etaoinshrdlucmfwypvbgkqjxz";
    json_t *vocab = json_object(), *root = NULL;
    uint64_t state = 0x70CEull;
    char piece[16];
    /* GPT-2's byte-to-character map for the 256 single bytes: printable Latin-1 as itself,
     * the rest from U+0100 on. */
    int extra = 0;
    for (int b = 0; vocab && b < 256; b++) {
        const bool keep = (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || b >= 0xae;
        const int cp = keep ? b : 0x100 + extra++;
        int k = 0;
        if (cp < 0x80) {
            piece[k++] = (char)cp;
        } else {
            piece[k++] = (char)(0xc0 | (cp >> 6));
            piece[k++] = (char)(0x80 | (cp & 0x3f));
        }
        piece[k] = '\0';
        json_object_set_new(vocab, piece, json_integer(b));
    }
    for (long i = 256; vocab && (long)json_object_size(vocab) < n; i++) {
        const int len = 2 + (int)(bench_rng_u64(&state) % 7);
        piece[0] = (char)(bench_rng_u64(&state) % 2 ? 0xc4 : letters[0]); /* "Ġ" or 'e' */
        int k = 1;
        if (piece[0] == (char)0xc4)
            piece[k++] = (char)0xa0;
        for (int j = 1; j < len; j++)
            piece[k++] = letters[bench_rng_u64(&state) % (sizeof letters - 1)];
        piece[k] = '\0';
        if (!json_object_get(vocab, piece))
            json_object_set_new(vocab, piece, json_integer((json_int_t)json_object_size(vocab)));
    }
    if (vocab)
        root = json_pack("{s:{s:s,s:o,s:[]},s:{s:s},s:{s:s,s:b,s:b}}", "model", "type", "BPE",
                         "vocab", vocab, "merges", "decoder", "type", "ByteLevel",
                         "pre_tokenizer", "type", "ByteLevel", "add_prefix_space", 0,
                         "use_regex", 1);
    struct mmrt_tokenizer *tok = NULL;
    struct mmrt_error err = { 0 };
    if (root && mmrt_tokenizer_load_json(root, "fake", NULL, &tok, &err) != MMRT_OK)
        fprintf(stderr, "sampler-bench: %s\n", err.msg);
    json_decref(root);
    return tok;
}

/* The best of `repeat` mask passes at the answer state `a`, ms (plain may be NULL). */
static double time_mask(const struct mmrt_json_answer *a, const struct mmrt_token_texts *t,
                        const uint8_t *plain, const float *logits, long vocab, float *masked,
                        long repeat)
{
    double best = INFINITY;
    for (long r = 0; r < repeat; r++) {
        const double t0 = bench_now_s();
        (void)mmrt_json_answer_mask(a, t, plain, logits, vocab, masked);
        const double ms = (bench_now_s() - t0) * 1e3;
        best = ms < best ? ms : best;
    }
    return best;
}

int main(int argc, char **argv)
{
    double temperature = 1.0, top_p = 1.0, spread = 3.0;
    long top_k = 0, rows = 8, draws = 64, repeat = 5, logprobs = -1, json = 0;
    int i = 1;
    for (; i < argc && strncmp(argv[i], "--", 2) == 0; i += 2) {
        if (i + 1 >= argc)
            return usage();
        char *end;
        const char *flag = argv[i], *arg = argv[i + 1];
        double v = strtod(arg, &end);
        if (end == arg || *end || !isfinite(v)) {
            fprintf(stderr, "sampler-bench: %s \"%s\": expected a number\n", flag, arg);
            return 2;
        }
        if (strcmp(flag, "--temperature") == 0)
            temperature = v;
        else if (strcmp(flag, "--top-p") == 0)
            top_p = v;
        else if (strcmp(flag, "--spread") == 0 && v > 0)
            spread = v;
        else if (strcmp(flag, "--top-k") == 0 && v >= 0 && v == (long)v)
            top_k = (long)v;
        else if (strcmp(flag, "--rows") == 0 && v >= 1 && v <= 1024 && v == (long)v)
            rows = (long)v;
        else if (strcmp(flag, "--draws") == 0 && v >= 1 && v == (long)v)
            draws = (long)v;
        else if (strcmp(flag, "--repeat") == 0 && v >= 1 && v == (long)v)
            repeat = (long)v;
        else if (strcmp(flag, "--logprobs") == 0 && v >= 0 && v <= MMRT_MAX_TOP_LOGPROBS &&
                 v == (long)v)
            logprobs = (long)v;
        else if (strcmp(flag, "--json") == 0 && (v == 0 || v == 1))
            json = (long)v;
        else
            return usage();
    }
    if (i == argc)
        return usage();
    printf("# sampler-bench: temperature %g, top_k %ld, top_p %g, logits N(0, %g²), %ld rows\n",
           temperature, top_k, top_p, spread, rows);
    printf("# %8s %12s %10s%s%s\n", "vocab", "ms/token", "digest",
           logprobs >= 0 ? "   logprobs ms" : "",
           json ? "   json mask ms: in a string (fed), after a key, in a schema key, in a pattern; "
                       "texts ms"
                : "");
    for (; i < argc; i++) {
        char *end;
        const long vocab = strtol(argv[i], &end, 10);
        if (end == argv[i] || *end || vocab < 1 || vocab > (1L << 26))
            return usage();
        float *logits = malloc((size_t)(rows * vocab) * sizeof *logits);
        if (!logits) {
            fprintf(stderr, "sampler-bench: out of memory\n");
            return 1;
        }
        uint64_t state = 0x5A3D1E5ull ^ (uint64_t)vocab;
        for (long k = 0; k < rows * vocab; k++)
            logits[k] = (float)(spread * normal(&state));
        struct mmrt_sampler s;
        struct mmrt_error err = { 0 };
        const struct mmrt_sampling cfg = { .temperature = (float)temperature,
                                           .top_k = (int)top_k, .top_p = (float)top_p,
                                           .seed = 7 };
        if (mmrt_sampler_init(&s, vocab, &cfg, &err) != MMRT_OK) {
            fprintf(stderr, "sampler-bench: %s\n", err.msg);
            free(logits);
            return 2;
        }
        double best = INFINITY;
        uint64_t digest = 0xcbf29ce484222325ull;
        for (long r = 0; r < repeat; r++) {
            const double t0 = bench_now_s();
            for (long d = 0; d < draws; d++) {
                int32_t tok;
                const float *row = logits + (d % rows) * vocab;
                if (mmrt_sampler_next(&s, row, NULL, 0, 0, &tok, &err) != MMRT_OK) {
                    fprintf(stderr, "sampler-bench: %s\n", err.msg);
                    mmrt_sampler_deinit(&s);
                    free(logits);
                    return 1;
                }
                digest = (digest ^ (uint64_t)(uint32_t)tok) * 0x100000001b3ull;
            }
            const double ms = (bench_now_s() - t0) * 1e3 / (double)draws;
            best = ms < best ? ms : best;
        }
        printf("%10ld %12.4f %016llx", vocab, best, (unsigned long long)digest);
        if (logprobs >= 0) {
            double lbest = INFINITY;
            struct mmrt_logprob top[MMRT_MAX_TOP_LOGPROBS];
            for (long r = 0; r < repeat; r++) {
                const double t0 = bench_now_s();
                for (long d = 0; d < draws; d++) {
                    float lp;
                    int n_top;
                    (void)mmrt_sampler_logprobs(logits + (d % rows) * vocab, vocab, 0,
                                                (int)logprobs, &lp, top, &n_top, &err);
                }
                const double ms = (bench_now_s() - t0) * 1e3 / (double)draws;
                lbest = ms < lbest ? ms : lbest;
            }
            printf(" %14.4f", lbest);
        }
        if (json) {
            struct mmrt_token_texts t;
            float *masked = malloc((size_t)vocab * sizeof *masked);
            struct mmrt_json_answer in_string, after_key, next;
            struct mmrt_json_schema *object = NULL;
            if (!masked || !fake_texts(vocab, &t) ||
                mmrt_json_schema_any_object(&object, &err) != MMRT_OK) {
                fprintf(stderr, "sampler-bench: out of memory\n");
                return 1;
            }
            mmrt_json_answer_init(&in_string, object);
            /* the byte tokens 0x7b '{' and 0x22 '"' (ASCII, clean run) open a string; a
             * vocabulary too small to have them times the state it reached */
            if (mmrt_json_answer_fits(&in_string, &t, NULL, 0x7b, &next))
                mmrt_json_answer_copy(&in_string, &next);
            if (mmrt_json_answer_fits(&in_string, &t, NULL, 0x22, &next))
                mmrt_json_answer_copy(&in_string, &next);
            mmrt_json_answer_copy(&after_key, &in_string);
            if (mmrt_json_answer_fits(&in_string, &t, NULL, 0x22, &next))
                mmrt_json_answer_copy(&after_key, &next);
            uint8_t *plain = malloc((size_t)vocab);
            if (!plain) {
                fprintf(stderr, "sampler-bench: out of memory\n");
                return 1;
            }
            mmrt_json_answer_plain(&t, plain);
            /* json_schema: '{' then '"' starts a key of eight listed ones. */
            static const char keyed[] =
                "{\"type\":\"object\",\"properties\":{\"name\":{},\"kind\":{},\"colour\":{},"
                "\"count\":{},\"size\":{},\"shape\":{},\"position\":{},\"notes\":{}}}";
            struct mmrt_json_schema *listed = NULL;
            struct mmrt_json_answer in_key;
            if (mmrt_json_schema_parse(keyed, sizeof keyed - 1, &listed, &err) != MMRT_OK) {
                fprintf(stderr, "sampler-bench: %s\n", err.msg);
                return 1;
            }
            mmrt_json_answer_init(&in_key, listed);
            /* A string held to a pattern, two characters in. */
            static const char patterned[] = "{\"type\":\"string\",\"pattern\":"
                                            "\"^[a-z]+-[0-9]{3}$\"}";
            struct mmrt_json_schema *pat = NULL;
            struct mmrt_json_answer in_pattern;
            if (mmrt_json_schema_parse(patterned, sizeof patterned - 1, &pat, &err) != MMRT_OK) {
                fprintf(stderr, "sampler-bench: %s\n", err.msg);
                return 1;
            }
            mmrt_json_answer_init(&in_pattern, pat);
            static const int32_t start[] = { 0x22, 0x61, 0x62 }; /* '"', 'a', 'b' */
            for (size_t k = 0; k < sizeof start / sizeof *start; k++)
                if (mmrt_json_answer_fits(&in_pattern, &t, NULL, start[k], &next))
                    mmrt_json_answer_copy(&in_pattern, &next);
            if (mmrt_json_answer_fits(&in_key, &t, NULL, 0x7b, &next))
                mmrt_json_answer_copy(&in_key, &next);
            if (mmrt_json_answer_fits(&in_key, &t, NULL, 0x22, &next))
                mmrt_json_answer_copy(&in_key, &next);
            printf("   %10.4f %10.4f %10.4f %10.4f %10.4f",
                   time_mask(&in_string, &t, plain, logits, vocab, masked, repeat),
                   time_mask(&in_string, &t, NULL, logits, vocab, masked, repeat),
                   time_mask(&after_key, &t, plain, logits, vocab, masked, repeat),
                   time_mask(&in_key, &t, plain, logits, vocab, masked, repeat),
                   time_mask(&in_pattern, &t, plain, logits, vocab, masked, repeat));
            mmrt_json_schema_free(listed);
            mmrt_json_schema_free(pat);
            free(plain);
            struct mmrt_tokenizer *tok = fake_tokenizer(vocab);
            double tbest = INFINITY;
            for (long r = 0; tok && r < repeat; r++) {
                struct mmrt_token_texts tt;
                const double t0 = bench_now_s();
                if (mmrt_tokenizer_token_texts(tok, &tt, &err) != MMRT_OK)
                    break;
                const double ms = (bench_now_s() - t0) * 1e3;
                tbest = ms < tbest ? ms : tbest;
                mmrt_token_texts_free(&tt);
            }
            printf(" %10.1f", tbest);
            mmrt_tokenizer_destroy(tok);
            free(t.blob);
            free(t.off);
            free(t.byte);
            free(t.special);
            free(masked);
            mmrt_json_schema_free(object);
        }
        printf("\n");
        mmrt_sampler_deinit(&s);
        free(logits);
    }
    return 0;
}
