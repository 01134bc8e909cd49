/*
 * core/formats/tokenizer_util.c — the tokenizer's small containers and Unicode helpers:
 * growable buffers, open-addressing hash maps (string -> id over the token table, id pair ->
 * merge), a byte trie with hashed edges, UTF-8 checks, and GPT-2's byte <-> unicode table.
 *
 * Hash maps use linear probing at load factor <= 1/2 with FNV-1a / a 64-bit mix; they are
 * built once at load and read-only afterwards, so encode threads share them freely.
 */
#include "tokenizer_impl.h"

#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

/* ---- buffers --------------------------------------------------------------------------- */

mmrt_status tk_buf_reserve(struct tk_buf *b, size_t extra, struct mmrt_error *err)
{
    if (extra <= b->cap - b->n)
        return MMRT_OK;
    size_t need = b->n + extra;
    if (need < b->n)
        return mmrt_error_set(err, MMRT_ERR_NO_MEMORY, "tokenizer: buffer size overflow");
    size_t cap = b->cap ? b->cap : 64;
    while (cap < need)
        cap = cap > SIZE_MAX / 2 ? need : cap * 2;
    char *p = realloc(b->p, cap);
    if (!p)
        return mmrt_error_set(err, MMRT_ERR_NO_MEMORY, "tokenizer: out of memory (%zu bytes)",
                              cap);
    b->p = p;
    b->cap = cap;
    return MMRT_OK;
}

mmrt_status tk_buf_put(struct tk_buf *b, const void *s, size_t n, struct mmrt_error *err)
{
    if (n == 0)
        return MMRT_OK;
    mmrt_status st = tk_buf_reserve(b, n, err);
    if (st != MMRT_OK)
        return st;
    memcpy(b->p + b->n, s, n);
    b->n += n;
    return MMRT_OK;
}

void tk_buf_free(struct tk_buf *b)
{
    free(b->p);
    b->p = NULL;
    b->n = b->cap = 0;
}

mmrt_status tk_ids_push(struct tk_ids *v, int32_t id, struct mmrt_error *err)
{
    if (v->n == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 64;
        int32_t *p = realloc(v->p, cap * sizeof *p);
        if (!p)
            return mmrt_error_set(err, MMRT_ERR_NO_MEMORY, "tokenizer: out of memory (%zu ids)",
                                  cap);
        v->p = p;
        v->cap = cap;
    }
    v->p[v->n++] = id;
    return MMRT_OK;
}

/* ---- UTF-8 ----------------------------------------------------------------------------- */

/* Valid range of the second byte after each lead (Unicode Table 3-7); later bytes are 80..BF. */
static bool second_ok(unsigned char lead, unsigned char c)
{
    switch (lead) {
    case 0xE0: return c >= 0xA0 && c <= 0xBF;
    case 0xED: return c >= 0x80 && c <= 0x9F;
    case 0xF0: return c >= 0x90 && c <= 0xBF;
    case 0xF4: return c >= 0x80 && c <= 0x8F;
    default: return c >= 0x80 && c <= 0xBF;
    }
}

static unsigned lead_len(unsigned char c)
{
    if (c < 0x80)
        return 1;
    if (c >= 0xC2 && c <= 0xDF)
        return 2;
    if (c >= 0xE0 && c <= 0xEF)
        return 3;
    if (c >= 0xF0 && c <= 0xF4)
        return 4;
    return 0;
}

size_t tk_utf8_seq(const unsigned char *s, size_t n)
{
    if (n == 0)
        return 0;
    unsigned len = lead_len(s[0]);
    if (len == 0 || len > n)
        return 0;
    if (len >= 2 && !second_ok(s[0], s[1]))
        return 0;
    for (unsigned i = 2; i < len; i++)
        if (s[i] < 0x80 || s[i] > 0xBF)
            return 0;
    return len;
}

bool tk_utf8_valid(const char *s, size_t n, size_t *bad)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        if (u[i] < 0x80) {
            i++;
            continue;
        }
        size_t l = tk_utf8_seq(u + i, n - i);
        if (l == 0) {
            if (bad)
                *bad = i;
            return false;
        }
        i += l;
    }
    return true;
}

bool mmrt_utf8_valid(const char *s, size_t n, size_t *bad)
{
    return tk_utf8_valid(s, n, bad);
}

size_t tk_utf8_decode(const char *s, uint32_t *cp)
{
    const unsigned char *u = (const unsigned char *)s;
    if (u[0] < 0x80) {
        *cp = u[0];
        return 1;
    }
    if (u[0] < 0xE0) {
        *cp = ((uint32_t)(u[0] & 0x1F) << 6) | (u[1] & 0x3F);
        return 2;
    }
    if (u[0] < 0xF0) {
        *cp = ((uint32_t)(u[0] & 0x0F) << 12) | ((uint32_t)(u[1] & 0x3F) << 6) | (u[2] & 0x3F);
        return 3;
    }
    *cp = ((uint32_t)(u[0] & 0x07) << 18) | ((uint32_t)(u[1] & 0x3F) << 12) |
          ((uint32_t)(u[2] & 0x3F) << 6) | (u[3] & 0x3F);
    return 4;
}

size_t tk_utf8_encode(uint32_t cp, char *out)
{
    unsigned char *o = (unsigned char *)out;
    if (cp < 0x80) {
        o[0] = (unsigned char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (unsigned char)(0xC0 | (cp >> 6));
        o[1] = (unsigned char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (unsigned char)(0xE0 | (cp >> 12));
        o[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (unsigned char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (unsigned char)(0xF0 | (cp >> 18));
    o[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (unsigned char)(0x80 | (cp & 0x3F));
    return 4;
}

bool tk_is_white_space(uint32_t cp)
{
    /* PropList.txt White_Space: 25 code points. */
    return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 ||
           cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 ||
           cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

bool tk_is_word_char(uint32_t cp)
{
    if (cp < 0x80)
        return (cp >= '0' && cp <= '9') || (cp >= 'a' && cp <= 'z') ||
               (cp >= 'A' && cp <= 'Z') || cp == '_';
    if (cp == 0x200C || cp == 0x200D)
        return true; /* Join_Control */
    /* Other_Alphabetic symbols outside L/M (circled and squared Latin letters). */
    if ((cp >= 0x24B6 && cp <= 0x24E9) || (cp >= 0x1F130 && cp <= 0x1F149) ||
        (cp >= 0x1F150 && cp <= 0x1F169) || (cp >= 0x1F170 && cp <= 0x1F189))
        return true;
    switch (utf8proc_category((utf8proc_int32_t)cp)) {
    case UTF8PROC_CATEGORY_LU:
    case UTF8PROC_CATEGORY_LL:
    case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO:
    case UTF8PROC_CATEGORY_MN:
    case UTF8PROC_CATEGORY_MC:
    case UTF8PROC_CATEGORY_ME:
    case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_PC:
        return true;
    default:
        return false;
    }
}

enum mmrt_utf8_step mmrt_utf8_feed(struct mmrt_utf8_acc *a, unsigned char byte, unsigned *bad_held)
{
    *bad_held = 0;
    if (a->n == 0) {
        unsigned need = lead_len(byte);
        a->b[0] = byte;
        a->n = 1;
        if (need == 0) {
            /* A byte that cannot start a character is a subpart of its own. */
            a->n = 0;
            *bad_held = 1;
            return MMRT_UTF8_BAD;
        }
        a->need = (uint8_t)need;
        return need == 1 ? MMRT_UTF8_CHAR : MMRT_UTF8_MORE;
    }
    bool ok = a->n == 1 ? second_ok(a->b[0], byte) : (byte >= 0x80 && byte <= 0xBF);
    if (!ok) {
        /* The held bytes are a maximal subpart; `byte` starts afresh (caller refeeds). */
        *bad_held = a->n;
        a->n = 0;
        return MMRT_UTF8_BAD;
    }
    a->b[a->n++] = byte;
    return a->n == a->need ? MMRT_UTF8_CHAR : MMRT_UTF8_MORE;
}

/* ---- GPT-2 byte <-> unicode ------------------------------------------------------------ */

/* Printable bytes ('!'..'~', 0xA1..0xAC, 0xAE..0xFF) map to themselves; the other 68 map,
 * in byte order, to U+0100 onwards. */
static bool byte_is_printable(unsigned b)
{
    return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
}

void tk_bytelevel_tables(struct mmrt_tokenizer *t)
{
    unsigned n = 0;
    for (unsigned i = 0; i < 0x144; i++)
        t->bl_dec[i] = -1;
    for (unsigned b = 0; b < 256; b++) {
        uint32_t cp = byte_is_printable(b) ? b : 0x100 + n++;
        t->bl_enc_len[b] = (uint8_t)tk_utf8_encode(cp, t->bl_enc[b]);
        t->bl_dec[cp] = (int16_t)b;
    }
}

/* ---- hashing --------------------------------------------------------------------------- */

uint64_t tk_hash_bytes(const void *s, size_t n)
{
    const unsigned char *p = s;
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= 0x100000001b3ull;
    }
    return h ^ (h >> 29);
}

static uint64_t mix64(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    x ^= x >> 33;
    return x;
}

static uint32_t table_size(size_t n)
{
    uint32_t cap = 16;
    while (cap < 2 * n)
        cap *= 2;
    return cap;
}

mmrt_status tk_strmap_build(struct tk_strmap *m, const struct mmrt_tokenizer *t,
                            const uint32_t *off, const uint32_t *len, uint32_t first,
                            uint32_t count, int32_t *dup_a, int32_t *dup_b,
                            struct mmrt_error *err)
{
    uint32_t cap = table_size(count);
    m->slot = calloc(cap, sizeof *m->slot);
    if (!m->slot)
        return mmrt_error_set(err, MMRT_ERR_NO_MEMORY, "tokenizer: out of memory (string map)");
    m->mask = cap - 1;
    *dup_a = *dup_b = -1;
    for (uint32_t id = first; id < first + count; id++) {
        const char *s = t->arena + off[id];
        uint32_t i = (uint32_t)tk_hash_bytes(s, len[id]) & m->mask;
        for (; m->slot[i]; i = (i + 1) & m->mask) {
            uint32_t o = m->slot[i] - 1;
            if (len[o] == len[id] && memcmp(t->arena + off[o], s, len[id]) == 0) {
                *dup_a = (int32_t)o;
                *dup_b = (int32_t)id;
                return MMRT_OK; /* caller reports the duplicate */
            }
        }
        m->slot[i] = id + 1;
    }
    return MMRT_OK;
}

int32_t tk_strmap_get(const struct tk_strmap *m, const struct mmrt_tokenizer *t,
                      const uint32_t *off, const uint32_t *len, const char *s, size_t n)
{
    if (!m->slot)
        return -1;
    uint32_t i = (uint32_t)tk_hash_bytes(s, n) & m->mask;
    for (; m->slot[i]; i = (i + 1) & m->mask) {
        uint32_t o = m->slot[i] - 1;
        if (len[o] == n && memcmp(t->arena + off[o], s, n) == 0)
            return (int32_t)o;
    }
    return -1;
}

void tk_strmap_free(struct tk_strmap *m)
{
    free(m->slot);
    m->slot = NULL;
}

int32_t tk_model_lookup(const struct mmrt_tokenizer *t, const char *s, size_t n)
{
    return tk_strmap_get(&t->model_map, t, t->tok_off, t->tok_len, s, n);
}

mmrt_status tk_pairmap_init(struct tk_pairmap *m, size_t n, struct mmrt_error *err)
{
    uint32_t cap = table_size(n);
    m->key = malloc(cap * sizeof *m->key);
    m->rank = malloc(cap * sizeof *m->rank);
    m->merged = malloc(cap * sizeof *m->merged);
    if (!m->key || !m->rank || !m->merged) {
        tk_pairmap_free(m);
        return mmrt_error_set(err, MMRT_ERR_NO_MEMORY, "tokenizer: out of memory (merges)");
    }
    memset(m->key, 0xFF, cap * sizeof *m->key);
    m->mask = cap - 1;
    m->n = 0;
    return MMRT_OK;
}

void tk_pairmap_free(struct tk_pairmap *m)
{
    free(m->key);
    free(m->rank);
    free(m->merged);
    m->key = NULL;
    m->rank = NULL;
    m->merged = NULL;
}

static uint64_t pair_key(int32_t a, int32_t b)
{
    return ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
}

void tk_pairmap_put(struct tk_pairmap *m, int32_t a, int32_t b, uint32_t rank, int32_t merged)
{
    uint64_t k = pair_key(a, b);
    uint32_t i = (uint32_t)mix64(k) & m->mask;
    while (m->key[i] != UINT64_MAX && m->key[i] != k)
        i = (i + 1) & m->mask;
    if (m->key[i] == UINT64_MAX)
        m->n++;
    m->key[i] = k;
    m->rank[i] = rank;
    m->merged[i] = merged;
}

bool tk_pairmap_get(const struct tk_pairmap *m, int32_t a, int32_t b, uint32_t *rank,
                    int32_t *merged)
{
    if (!m->key)
        return false;
    uint64_t k = pair_key(a, b);
    uint32_t i = (uint32_t)mix64(k) & m->mask;
    for (; m->key[i] != UINT64_MAX; i = (i + 1) & m->mask) {
        if (m->key[i] == k) {
            *rank = m->rank[i];
            *merged = m->merged[i];
            return true;
        }
    }
    return false;
}

/* ---- trie ------------------------------------------------------------------------------ */

mmrt_status tk_trie_init(struct tk_trie *t, struct mmrt_error *err)
{
    memset(t, 0, sizeof *t);
    t->cap_nodes = 64;
    t->value = malloc(t->cap_nodes * sizeof *t->value);
    t->emask = 127;
    t->ekey = calloc(t->emask + 1, sizeof *t->ekey);
    t->echild = malloc((t->emask + 1) * sizeof *t->echild);
    if (!t->value || !t->ekey || !t->echild) {
        tk_trie_free(t);
        return mmrt_error_set(err, MMRT_ERR_NO_MEMORY, "tokenizer: out of memory (trie)");
    }
    t->value[0] = -1;
    t->n_nodes = 1;
    return MMRT_OK;
}

void tk_trie_free(struct tk_trie *t)
{
    free(t->ekey);
    free(t->echild);
    free(t->value);
    memset(t, 0, sizeof *t);
}

static uint64_t edge_key(uint32_t node, unsigned char c)
{
    return ((uint64_t)node << 8) | c;
}

uint32_t tk_trie_child(const struct tk_trie *t, uint32_t node, unsigned char c)
{
    if (!t->ekey)
        return 0;
    uint64_t k = edge_key(node, c) + 1;
    uint32_t i = (uint32_t)mix64(k) & t->emask;
    for (; t->ekey[i]; i = (i + 1) & t->emask)
        if (t->ekey[i] == k)
            return t->echild[i];
    return 0;
}

static mmrt_status trie_grow_edges(struct tk_trie *t, struct mmrt_error *err)
{
    uint32_t cap = (t->emask + 1) * 2;
    uint64_t *key = calloc(cap, sizeof *key);
    uint32_t *child = malloc(cap * sizeof *child);
    if (!key || !child) {
        free(key);
        free(child);
        return mmrt_error_set(err, MMRT_ERR_NO_MEMORY, "tokenizer: out of memory (trie)");
    }
    for (uint32_t i = 0; i <= t->emask; i++) {
        if (!t->ekey[i])
            continue;
        uint32_t j = (uint32_t)mix64(t->ekey[i]) & (cap - 1);
        while (key[j])
            j = (j + 1) & (cap - 1);
        key[j] = t->ekey[i];
        child[j] = t->echild[i];
    }
    free(t->ekey);
    free(t->echild);
    t->ekey = key;
    t->echild = child;
    t->emask = cap - 1;
    return MMRT_OK;
}

mmrt_status tk_trie_insert(struct tk_trie *t, const char *s, size_t n, int32_t v, int32_t *old,
                           struct mmrt_error *err)
{
    uint32_t node = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        uint32_t next = tk_trie_child(t, node, c);
        if (next) {
            node = next;
            continue;
        }
        if (t->n_nodes == t->cap_nodes) {
            if (t->cap_nodes > UINT32_MAX / 2)
                return mmrt_error_set(err, MMRT_ERR_LIMIT, "tokenizer: trie too large");
            int32_t *val = realloc(t->value, t->cap_nodes * 2 * sizeof *val);
            if (!val)
                return mmrt_error_set(err, MMRT_ERR_NO_MEMORY, "tokenizer: out of memory (trie)");
            t->value = val;
            t->cap_nodes *= 2;
        }
        if (2 * (t->n_edges + 1) > t->emask + 1) {
            mmrt_status st = trie_grow_edges(t, err);
            if (st != MMRT_OK)
                return st;
        }
        next = t->n_nodes++;
        t->value[next] = -1;
        uint64_t k = edge_key(node, c) + 1;
        uint32_t j = (uint32_t)mix64(k) & t->emask;
        while (t->ekey[j])
            j = (j + 1) & t->emask;
        t->ekey[j] = k;
        t->echild[j] = next;
        t->n_edges++;
        node = next;
    }
    *old = t->value[node];
    if (*old < 0)
        t->value[node] = v;
    return MMRT_OK;
}
