/*
 * core/json_pattern.c — json_pattern.h: the pattern parsed into a tree, the tree into a
 * Thompson automaton with empty moves, that determinised over the classes of code points its
 * sets tell apart, and the states no match can be reached from cut away.
 */
#include "json_pattern.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#define CP_END 0x110000u /* one past the last code point */

/* ---- the tree ---- */

enum { T_SET, T_CAT, T_ALT, T_REP, T_EMPTY };

struct tree {
    uint8_t kind;
    int a, b;           /* T_CAT, T_ALT: both sides; T_REP: a */
    uint32_t min, max;  /* T_REP; max MMRT_JSON_PATTERN_UNBOUNDED: no limit */
    int set;            /* T_SET */
};

struct range {
    uint32_t lo, hi; /* inclusive */
};

struct set {
    uint32_t first, n; /* ranges, sorted and apart */
};

struct parser {
    const char *p;
    size_t len, i;
    struct tree *tree;
    int n_tree, cap_tree;
    struct set *sets;
    int n_sets, cap_sets;
    struct range *ranges;
    uint32_t n_ranges, cap_ranges;
    struct mmrt_error *err;
    mmrt_status st;
};

static bool bad(struct parser *ps, mmrt_status st, const char *what)
{
    if (ps->st == MMRT_OK)
        ps->st = mmrt_error_set(ps->err, st, "pattern byte %zu: %s", ps->i, what);
    return false;
}

static bool grow(void **p, int *cap, int need, size_t elem)
{
    if (need <= *cap)
        return true;
    int n = *cap ? *cap * 2 : 32;
    while (n < need)
        n *= 2;
    void *q = realloc(*p, (size_t)n * elem);
    if (!q)
        return false;
    *p = q;
    *cap = n;
    return true;
}

static int new_tree(struct parser *ps, uint8_t kind, int a, int b)
{
    if (ps->n_tree >= (int)MMRT_JSON_PATTERN_MAX_NFA) {
        bad(ps, MMRT_ERR_LIMIT, "too many parts");
        return -1;
    }
    if (!grow((void **)&ps->tree, &ps->cap_tree, ps->n_tree + 1, sizeof *ps->tree)) {
        bad(ps, MMRT_ERR_NO_MEMORY, "out of memory");
        return -1;
    }
    ps->tree[ps->n_tree] = (struct tree){ .kind = kind, .a = a, .b = b, .set = -1 };
    return ps->n_tree++;
}

/* ---- sets of code points ---- */

static int cmp_range(const void *x, const void *y)
{
    const struct range *a = x, *b = y;
    return (a->lo > b->lo) - (a->lo < b->lo);
}

/* A set from ranges r[0, n) (any order, overlapping), complemented when negate. */
static int new_set(struct parser *ps, struct range *r, uint32_t n, bool negate)
{
    if (n)
        qsort(r, n, sizeof *r, cmp_range);
    uint32_t k = 0;
    for (uint32_t i = 0; i < n; i++) {
        if (k && r[i].lo <= r[k - 1].hi + 1) {
            if (r[i].hi > r[k - 1].hi)
                r[k - 1].hi = r[i].hi;
        } else {
            r[k++] = r[i];
        }
    }
    n = k;
    if (negate) {
        /* At most n + 1 gaps: written into a copy, then back. */
        struct range *g = malloc(((size_t)n + 1) * sizeof *g);
        if (!g) {
            bad(ps, MMRT_ERR_NO_MEMORY, "out of memory");
            return -1;
        }
        uint32_t m = 0, at = 0;
        for (uint32_t i = 0; i < n; i++) {
            if (r[i].lo > at)
                g[m++] = (struct range){ at, r[i].lo - 1 };
            at = r[i].hi + 1;
        }
        if (at < CP_END)
            g[m++] = (struct range){ at, CP_END - 1 };
        if (m)
            memcpy(r, g, (size_t)m * sizeof *g); /* r has room: callers give n + 1 entries */
        free(g);
        n = m;
    }
    int cap = (int)ps->cap_ranges;
    if (!grow((void **)&ps->ranges, &cap, (int)(ps->n_ranges + n), sizeof *ps->ranges) ||
        !grow((void **)&ps->sets, &ps->cap_sets, ps->n_sets + 1, sizeof *ps->sets)) {
        bad(ps, MMRT_ERR_NO_MEMORY, "out of memory");
        return -1;
    }
    ps->cap_ranges = (uint32_t)cap;
    if (n)
        memcpy(ps->ranges + ps->n_ranges, r, (size_t)n * sizeof *r);
    ps->sets[ps->n_sets] = (struct set){ .first = ps->n_ranges, .n = n };
    ps->n_ranges += n;
    return ps->n_sets++;
}

/* A growing list of ranges for one class being read. */
struct ranges {
    struct range *r;
    uint32_t n, cap;
};

static bool add_range(struct parser *ps, struct ranges *l, uint32_t lo, uint32_t hi)
{
    if (l->n + 2 > l->cap) { /* one spare for new_set's complement */
        uint32_t cap = l->cap ? l->cap * 2 : 16;
        struct range *q = realloc(l->r, cap * sizeof *q);
        if (!q)
            return bad(ps, MMRT_ERR_NO_MEMORY, "out of memory");
        l->r = q;
        l->cap = cap;
    }
    l->r[l->n++] = (struct range){ lo, hi };
    return true;
}

/* \d \w \s and their complements, into l (a complement as its ranges). */
static bool add_named(struct parser *ps, struct ranges *l, char c)
{
    static const struct range digit[] = { { '0', '9' } };
    static const struct range word[] = { { '0', '9' }, { 'A', 'Z' }, { '_', '_' }, { 'a', 'z' } };
    static const struct range space[] = {
        { 0x09, 0x0d }, { 0x20, 0x20 }, { 0xa0, 0xa0 }, { 0x1680, 0x1680 }, { 0x2000, 0x200a },
        { 0x2028, 0x2029 }, { 0x202f, 0x202f }, { 0x205f, 0x205f }, { 0x3000, 0x3000 },
        { 0xfeff, 0xfeff },
    };
    const struct range *r;
    size_t n;
    switch (c | 0x20) {
    case 'd': r = digit, n = 1; break;
    case 'w': r = word, n = 4; break;
    default: r = space, n = sizeof space / sizeof *space; break;
    }
    if (c >= 'a') {
        for (size_t i = 0; i < n; i++)
            if (!add_range(ps, l, r[i].lo, r[i].hi))
                return false;
        return true;
    }
    uint32_t at = 0;
    for (size_t i = 0; i < n; i++) {
        if (r[i].lo > at && !add_range(ps, l, at, r[i].lo - 1))
            return false;
        at = r[i].hi + 1;
    }
    return add_range(ps, l, at, CP_END - 1);
}

/* ---- reading the pattern ---- */

static bool at_end(const struct parser *ps)
{
    return ps->i >= ps->len;
}

/* The code point at ps->i, or CP_END with the error set when the bytes there are not
 * UTF-8 (a pattern from a JSON string always is; the function takes any bytes). */
static uint32_t next_cp(struct parser *ps)
{
    const unsigned char *s = (const unsigned char *)ps->p + ps->i;
    const size_t left = ps->len - ps->i;
    const uint32_t b = s[0];
    size_t n = b < 0x80 ? 1 : b >= 0xc2 && b <= 0xdf ? 2 : b >= 0xe0 && b <= 0xef ? 3
             : b >= 0xf0 && b <= 0xf4 ? 4 : 0;
    uint32_t cp = n == 1 ? b : n == 2 ? b & 0x1f : n == 3 ? b & 0x0f : b & 0x07;
    for (size_t k = 1; n && k < n; k++) {
        if (k >= left || (s[k] & 0xc0) != 0x80)
            n = 0;
        else
            cp = cp << 6 | (s[k] & 0x3fu);
    }
    static const uint32_t least[5] = { 0, 0, 0x80, 0x800, 0x10000 };
    if (!n || cp < least[n] || cp >= CP_END || (cp >= 0xd800 && cp <= 0xdfff)) {
        bad(ps, MMRT_ERR_INVALID_ARG, "not UTF-8");
        return CP_END;
    }
    ps->i += n;
    return cp;
}

static int hex_digit(char c)
{
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10
         : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

/* An escape after '\' (ps->i at the letter): a code point into *cp, or a named class added
 * to l (*cp = CP_END then). in_class: \b is a backspace there, refused elsewhere. */
static bool escape(struct parser *ps, struct ranges *l, bool in_class, uint32_t *cp)
{
    if (at_end(ps))
        return bad(ps, MMRT_ERR_INVALID_ARG, "'\\' ends the pattern");
    const char c = ps->p[ps->i];
    *cp = CP_END;
    if (strchr("dDwWsS", c) && c) {
        ps->i++;
        return add_named(ps, l, c);
    }
    static const char simple[] = "t\tn\nr\rv\vf\f";
    for (const char *s = simple; *s; s += 2)
        if (c == s[0]) {
            ps->i++;
            *cp = (unsigned char)s[1];
            return true;
        }
    if (c == '0' && (ps->i + 1 >= ps->len || ps->p[ps->i + 1] < '0' || ps->p[ps->i + 1] > '9')) {
        ps->i++;
        *cp = 0;
        return true;
    }
    if (c == 'b' && in_class) {
        ps->i++;
        *cp = 8;
        return true;
    }
    if (c == 'x' || c == 'u') {
        const size_t digits = c == 'x' ? 2 : 4;
        uint32_t v = 0;
        for (size_t k = 1; k <= digits; k++) {
            const int h = ps->i + k < ps->len ? hex_digit(ps->p[ps->i + k]) : -1;
            if (h < 0)
                return bad(ps, MMRT_ERR_INVALID_ARG, c == 'x' ? "'\\x' needs two hex digits"
                                                              : "'\\u' needs four hex digits "
                                                                "('\\u{...}' is not supported)");
            v = v << 4 | (uint32_t)h;
        }
        ps->i += digits + 1;
        /* A pair of \u surrogates is one code point. */
        if (v >= 0xd800 && v <= 0xdbff && ps->i + 6 <= ps->len && ps->p[ps->i] == '\\' &&
            ps->p[ps->i + 1] == 'u') {
            uint32_t w = 0;
            bool ok = true;
            for (size_t k = 2; k < 6 && ok; k++) {
                const int h = hex_digit(ps->p[ps->i + k]);
                ok = h >= 0;
                w = w << 4 | (uint32_t)(h < 0 ? 0 : h);
            }
            if (ok && w >= 0xdc00 && w <= 0xdfff) {
                ps->i += 6;
                v = 0x10000 + ((v - 0xd800) << 10) + (w - 0xdc00);
            }
        }
        if (v >= 0xd800 && v <= 0xdfff)
            return bad(ps, MMRT_ERR_INVALID_ARG, "a lone surrogate matches no character");
        *cp = v;
        return true;
    }
    if (c >= '1' && c <= '9')
        return bad(ps, MMRT_ERR_INVALID_ARG, "back-references are not supported");
    if (c == 'b' || c == 'B')
        return bad(ps, MMRT_ERR_INVALID_ARG, "word boundaries (\\b, \\B) are not supported");
    if (c == 'p' || c == 'P' || c == 'k' || c == 'c')
        return bad(ps, MMRT_ERR_INVALID_ARG, c == 'k' ? "back-references are not supported"
                   : c == 'c' ? "'\\c' control escapes are not supported"
                              : "Unicode properties (\\p{...}) are not supported");
    if (strchr("^$\\.*+?()[]{}|/-", c) && c) {
        ps->i++;
        *cp = (unsigned char)c;
        return true;
    }
    return bad(ps, MMRT_ERR_INVALID_ARG, "an escape that is not ECMA-262's");
}

/* A class; ps->i just past '['. */
static int parse_class(struct parser *ps)
{
    struct ranges l = { 0 };
    bool negate = false;
    if (!at_end(ps) && ps->p[ps->i] == '^') {
        negate = true;
        ps->i++;
    }
    bool ok = true;
    for (;;) {
        if (at_end(ps)) {
            ok = bad(ps, MMRT_ERR_INVALID_ARG, "'[' without ']'");
            break;
        }
        if (ps->p[ps->i] == ']') {
            ps->i++;
            break;
        }
        uint32_t lo;
        if (ps->p[ps->i] == '\\') {
            ps->i++;
            if (!(ok = escape(ps, &l, true, &lo)))
                break;
            if (lo == CP_END)
                continue; /* a named class; a '-' after it is a '-' */
        } else if ((lo = next_cp(ps)) == CP_END) {
            ok = false;
            break;
        }
        uint32_t hi = lo;
        if (ps->i + 1 < ps->len && ps->p[ps->i] == '-' && ps->p[ps->i + 1] != ']') {
            ps->i++;
            if (ps->p[ps->i] == '\\') {
                ps->i++;
                if (!(ok = escape(ps, &l, true, &hi)))
                    break;
                if (hi == CP_END) {
                    ok = bad(ps, MMRT_ERR_INVALID_ARG, "a range cannot end in a class");
                    break;
                }
            } else if ((hi = next_cp(ps)) == CP_END) {
                ok = false;
                break;
            }
            if (hi < lo) {
                ok = bad(ps, MMRT_ERR_INVALID_ARG, "a range out of order");
                break;
            }
        }
        if (!(ok = add_range(ps, &l, lo, hi)))
            break;
    }
    int set = -1;
    if (ok) {
        if (!l.r) /* [] or [^] */
            ok = add_range(ps, &l, 1, 0), l.n = 0;
        if (ok)
            set = new_set(ps, l.r, l.n, negate);
    }
    free(l.r);
    return set;
}

static int parse_alt(struct parser *ps, int depth);

/* One code point or one named class as a set node. */
static int set_node(struct parser *ps, struct ranges *l, uint32_t cp)
{
    if (cp != CP_END && !add_range(ps, l, cp, cp))
        return -1;
    const int set = new_set(ps, l->r, l->n, false);
    const int t = set < 0 ? -1 : new_tree(ps, T_SET, -1, -1);
    if (t >= 0)
        ps->tree[t].set = set;
    return t;
}

static int parse_atom(struct parser *ps, int depth)
{
    const char c = ps->p[ps->i];
    struct ranges l = { 0 };
    int t = -1;
    switch (c) {
    case '(': {
        ps->i++;
        if (ps->i + 1 < ps->len && ps->p[ps->i] == '?') {
            if (ps->p[ps->i + 1] == ':') {
                ps->i += 2;
            } else if (ps->p[ps->i + 1] == '<' && ps->i + 2 < ps->len &&
                       ps->p[ps->i + 2] != '=' && ps->p[ps->i + 2] != '!') {
                const char *close = memchr(ps->p + ps->i, '>', ps->len - ps->i);
                if (!close) {
                    bad(ps, MMRT_ERR_INVALID_ARG, "a group name without '>'");
                    return -1;
                }
                ps->i = (size_t)(close - ps->p) + 1;
            } else {
                bad(ps, MMRT_ERR_INVALID_ARG, "look-arounds and '(?' groups other than '(?:' "
                    "and '(?<name>' are not supported");
                return -1;
            }
        }
        if (depth >= 32) {
            bad(ps, MMRT_ERR_LIMIT, "groups nested deeper than 32");
            return -1;
        }
        t = parse_alt(ps, depth + 1);
        if (t < 0)
            return -1;
        if (at_end(ps) || ps->p[ps->i] != ')') {
            bad(ps, MMRT_ERR_INVALID_ARG, "'(' without ')'");
            return -1;
        }
        ps->i++;
        return t;
    }
    case '[': {
        ps->i++;
        const int set = parse_class(ps);
        t = set < 0 ? -1 : new_tree(ps, T_SET, -1, -1);
        if (t >= 0)
            ps->tree[t].set = set;
        return t;
    }
    case '.':
        ps->i++;
        /* Any code point but the line terminators. */
        if (add_range(ps, &l, 0, 9) && add_range(ps, &l, 11, 12) &&
            add_range(ps, &l, 14, 0x2027) && add_range(ps, &l, 0x202a, CP_END - 1))
            t = set_node(ps, &l, CP_END);
        free(l.r);
        return t;
    case '\\': {
        ps->i++;
        uint32_t cp;
        if (escape(ps, &l, false, &cp))
            t = set_node(ps, &l, cp);
        free(l.r);
        return t;
    }
    case '^': case '$':
        bad(ps, MMRT_ERR_INVALID_ARG, "'^' and '$' are supported only at the pattern's start "
            "and end");
        return -1;
    case '*': case '+': case '?':
        bad(ps, MMRT_ERR_INVALID_ARG, "nothing to repeat");
        return -1;
    case ')':
        bad(ps, MMRT_ERR_INVALID_ARG, "')' without '('");
        return -1;
    default: {
        const uint32_t cp = next_cp(ps);
        t = cp == CP_END ? -1 : set_node(ps, &l, cp);
        free(l.r);
        return t;
    }
    }
}

/* {n}, {n,}, {n,m} at ps->i: whether one is there (else '{' is a character, as ECMA-262's
 * annex B has it), its bounds into *min, *max. */
static bool braces(struct parser *ps, uint32_t *min, uint32_t *max, bool *too_big)
{
    size_t i = ps->i + 1;
    uint64_t a = 0, b = 0;
    size_t da = 0, db = 0;
    while (i < ps->len && ps->p[i] >= '0' && ps->p[i] <= '9' && da < 12)
        a = a * 10 + (uint64_t)(ps->p[i++] - '0'), da++;
    if (!da)
        return false;
    bool comma = false;
    if (i < ps->len && ps->p[i] == ',') {
        comma = true;
        i++;
        while (i < ps->len && ps->p[i] >= '0' && ps->p[i] <= '9' && db < 12)
            b = b * 10 + (uint64_t)(ps->p[i++] - '0'), db++;
    }
    if (i >= ps->len || ps->p[i] != '}')
        return false;
    ps->i = i + 1;
    *too_big = a > MMRT_JSON_PATTERN_MAX_REPEAT || b > MMRT_JSON_PATTERN_MAX_REPEAT;
    *min = (uint32_t)a;
    *max = !comma ? (uint32_t)a : db ? (uint32_t)b : MMRT_JSON_PATTERN_UNBOUNDED;
    return true;
}

static int parse_cat(struct parser *ps, int depth)
{
    int t = -1;
    while (!at_end(ps) && ps->p[ps->i] != '|' && ps->p[ps->i] != ')') {
        uint32_t min = 1, max = 1;
        bool too_big = false;
        if (ps->p[ps->i] == '{' && braces(ps, &min, &max, &too_big)) {
            bad(ps, MMRT_ERR_INVALID_ARG, "nothing to repeat");
            return -1;
        }
        int a;
        if (ps->p[ps->i] == '{' || ps->p[ps->i] == '}' || ps->p[ps->i] == ']') {
            struct ranges l = { 0 };
            a = set_node(ps, &l, (unsigned char)ps->p[ps->i++]);
            free(l.r);
        } else {
            a = parse_atom(ps, depth);
        }
        if (a < 0)
            return -1;
        if (!at_end(ps)) {
            const char q = ps->p[ps->i];
            bool rep = true;
            if (q == '*')
                min = 0, max = MMRT_JSON_PATTERN_UNBOUNDED, ps->i++;
            else if (q == '+')
                min = 1, max = MMRT_JSON_PATTERN_UNBOUNDED, ps->i++;
            else if (q == '?')
                min = 0, max = 1, ps->i++;
            else if (!(q == '{' && braces(ps, &min, &max, &too_big)))
                rep = false;
            if (rep) {
                if (too_big) {
                    bad(ps, MMRT_ERR_LIMIT, "a repeat count above 256");
                    return -1;
                }
                if (max < min) {
                    bad(ps, MMRT_ERR_INVALID_ARG, "a repeat {n,m} with m below n");
                    return -1;
                }
                if (!at_end(ps) && ps->p[ps->i] == '?')
                    ps->i++; /* lazy: the same strings */
                if (!at_end(ps) && strchr("*+?", ps->p[ps->i]) && ps->p[ps->i]) {
                    bad(ps, MMRT_ERR_INVALID_ARG, "nothing to repeat");
                    return -1;
                }
                const int r = new_tree(ps, T_REP, a, -1);
                if (r < 0)
                    return -1;
                ps->tree[r].min = min;
                ps->tree[r].max = max;
                a = r;
            }
        }
        t = t < 0 ? a : new_tree(ps, T_CAT, t, a);
        if (t < 0)
            return -1;
    }
    return t < 0 ? new_tree(ps, T_EMPTY, -1, -1) : t;
}

static int parse_alt(struct parser *ps, int depth)
{
    int t = parse_cat(ps, depth);
    while (t >= 0 && !at_end(ps) && ps->p[ps->i] == '|') {
        ps->i++;
        const int b = parse_cat(ps, depth);
        t = b < 0 ? -1 : new_tree(ps, T_ALT, t, b);
    }
    return t;
}

/* ---- the automaton with empty moves ---- */

enum { N_EPS, N_SET, N_MATCH };

struct nstate {
    uint8_t kind;
    int out, out1; /* N_EPS: both (−1: none); N_SET: out */
    int set;
};

struct nfa {
    struct nstate *s;
    int n, cap;
};

static int nfa_add(struct parser *ps, struct nfa *a, uint8_t kind, int out, int out1, int set)
{
    if (a->n >= (int)MMRT_JSON_PATTERN_MAX_NFA) {
        bad(ps, MMRT_ERR_LIMIT, "the pattern is too large (repeats expand it)");
        return -1;
    }
    if (!grow((void **)&a->s, &a->cap, a->n + 1, sizeof *a->s)) {
        bad(ps, MMRT_ERR_NO_MEMORY, "out of memory");
        return -1;
    }
    a->s[a->n] = (struct nstate){ .kind = kind, .out = out, .out1 = out1, .set = set };
    return a->n++;
}

/* The states of tree t, going on to next; returns the first (−1 on failure). */
static int build(struct parser *ps, struct nfa *a, int t, int next)
{
    const struct tree x = ps->tree[t];
    switch (x.kind) {
    case T_EMPTY: return next;
    case T_SET: return nfa_add(ps, a, N_SET, next, -1, x.set);
    case T_CAT: {
        const int b = build(ps, a, x.b, next);
        return b < 0 ? -1 : build(ps, a, x.a, b);
    }
    case T_ALT: {
        const int l = build(ps, a, x.a, next);
        const int r = l < 0 ? -1 : build(ps, a, x.b, next);
        return r < 0 ? -1 : nfa_add(ps, a, N_EPS, l, r, -1);
    }
    default: { /* T_REP */
        int cur = next;
        if (x.max == MMRT_JSON_PATTERN_UNBOUNDED) {
            const int loop = nfa_add(ps, a, N_EPS, -1, next, -1);
            const int body = loop < 0 ? -1 : build(ps, a, x.a, loop);
            if (body < 0)
                return -1;
            a->s[loop].out = body;
            cur = loop;
        } else {
            for (uint32_t k = x.min; k < x.max && cur >= 0; k++) {
                const int body = build(ps, a, x.a, cur);
                cur = body < 0 ? -1 : nfa_add(ps, a, N_EPS, body, next, -1);
            }
        }
        for (uint32_t k = 0; k < x.min && cur >= 0; k++)
            cur = build(ps, a, x.a, cur);
        return cur;
    }
    }
}

/* ---- determinising ---- */

/* The empty-move closure of the states marked in `on` (a list in *list), in place. */
static void closure(const struct nfa *a, int *list, int *n, uint32_t *mark, uint32_t gen)
{
    for (int i = 0; i < *n; i++) {
        const struct nstate *s = &a->s[list[i]];
        if (s->kind != N_EPS)
            continue;
        const int outs[2] = { s->out, s->out1 };
        for (int k = 0; k < 2; k++)
            if (outs[k] >= 0 && mark[outs[k]] != gen) {
                mark[outs[k]] = gen;
                list[(*n)++] = outs[k];
            }
    }
}

static int cmp_int(const void *x, const void *y)
{
    const int a = *(const int *)x, b = *(const int *)y;
    return (a > b) - (a < b);
}

struct dstates {
    int *pool;          /* each state's sorted NFA states, one after another */
    size_t n_pool, cap_pool;
    size_t *off;        /* [n + 1] */
    int n, cap;
    int *table;         /* hash → state + 1, 0 empty */
    size_t table_size;
};

static uint64_t hash_ints(const int *v, int n)
{
    uint64_t h = 1469598103934665603u;
    for (int i = 0; i < n; i++)
        h = (h ^ (uint64_t)(unsigned)v[i]) * 1099511628211u;
    return h;
}

/* The state for NFA set v[0, n) (sorted), added when new; −1 when out of room. */
static int dstate(struct parser *ps, struct dstates *d, const int *v, int n, bool *added)
{
    const uint64_t h = hash_ints(v, n);
    size_t at = h & (d->table_size - 1);
    for (; d->table[at]; at = (at + 1) & (d->table_size - 1)) {
        const int k = d->table[at] - 1;
        if ((int)(d->off[k + 1] - d->off[k]) == n &&
            memcmp(d->pool + d->off[k], v, (size_t)n * sizeof *v) == 0) {
            *added = false;
            return k;
        }
    }
    if (d->n >= (int)MMRT_JSON_PATTERN_MAX_STATES) {
        bad(ps, MMRT_ERR_LIMIT, "the pattern needs more than 1024 states");
        return -1;
    }
    if (d->n_pool + (size_t)n > d->cap_pool) {
        size_t cap = d->cap_pool ? d->cap_pool * 2 : 1024;
        while (cap < d->n_pool + (size_t)n)
            cap *= 2;
        int *q = realloc(d->pool, cap * sizeof *q);
        if (!q) {
            bad(ps, MMRT_ERR_NO_MEMORY, "out of memory");
            return -1;
        }
        d->pool = q;
        d->cap_pool = cap;
    }
    memcpy(d->pool + d->n_pool, v, (size_t)n * sizeof *v);
    d->n_pool += (size_t)n;
    d->off[d->n + 1] = d->n_pool;
    d->table[at] = d->n + 1;
    *added = true;
    return d->n++;
}

/* Whether set s holds class k (which lies wholly in or out of each of its ranges). */
static bool set_has(const struct parser *ps, int s, uint32_t cp)
{
    const struct range *r = ps->ranges + ps->sets[s].first;
    uint32_t lo = 0, hi = ps->sets[s].n;
    while (lo < hi) {
        const uint32_t m = lo + (hi - lo) / 2;
        if (r[m].hi < cp)
            lo = m + 1;
        else
            hi = m;
    }
    return lo < ps->sets[s].n && r[lo].lo <= cp;
}

static int cmp_u32(const void *x, const void *y)
{
    const uint32_t a = *(const uint32_t *)x, b = *(const uint32_t *)y;
    return (a > b) - (a < b);
}

/* The classes: every point where some set starts or stops holding code points. */
static bool classes(struct parser *ps, struct mmrt_json_pattern *out)
{
    uint32_t *pts = malloc(((size_t)ps->n_ranges * 2 + 2) * sizeof *pts);
    if (!pts)
        return bad(ps, MMRT_ERR_NO_MEMORY, "out of memory");
    size_t n = 0;
    pts[n++] = 0;
    pts[n++] = CP_END;
    for (uint32_t i = 0; i < ps->n_ranges; i++) {
        pts[n++] = ps->ranges[i].lo;
        pts[n++] = ps->ranges[i].hi + 1;
    }
    qsort(pts, n, sizeof *pts, cmp_u32);
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (k == 0 || pts[i] != pts[k - 1])
            pts[k++] = pts[i];
    out->start = pts;
    out->n_classes = (uint32_t)(k - 1);
    return true;
}

static bool determinise(struct parser *ps, const struct nfa *a, int start,
                        struct mmrt_json_pattern *out)
{
    struct dstates d = { .table_size = 4096 };
    const uint32_t nc = out->n_classes;
    int *list = malloc((size_t)a->n * sizeof *list);
    uint32_t *mark = calloc((size_t)a->n, sizeof *mark);
    d.off = calloc(MMRT_JSON_PATTERN_MAX_STATES + 1, sizeof *d.off);
    d.table = calloc(d.table_size, sizeof *d.table);
    out->next = malloc((size_t)MMRT_JSON_PATTERN_MAX_STATES * nc * sizeof *out->next);
    out->accept = calloc(MMRT_JSON_PATTERN_MAX_STATES, 1);
    bool ok = list && mark && d.off && d.table && out->next && out->accept;
    if (!ok)
        bad(ps, MMRT_ERR_NO_MEMORY, "out of memory");
    uint32_t gen = 1;
    int n = 0;
    bool added;
    if (ok) {
        list[n++] = start;
        mark[start] = gen;
        closure(a, list, &n, mark, gen);
        qsort(list, (size_t)n, sizeof *list, cmp_int);
        ok = dstate(ps, &d, list, n, &added) == 0;
    }
    for (int k = 0; ok && k < d.n; k++) {
        for (uint32_t c = 0; ok && c < nc; c++) {
            const uint32_t cp = out->start[c];
            gen++;
            n = 0;
            for (size_t i = d.off[k]; i < d.off[k + 1]; i++) {
                const struct nstate *s = &a->s[d.pool[i]];
                if (s->kind == N_SET && set_has(ps, s->set, cp) && mark[s->out] != gen) {
                    mark[s->out] = gen;
                    list[n++] = s->out;
                }
            }
            if (n == 0) {
                out->next[(size_t)k * nc + c] = MMRT_JSON_PATTERN_DEAD;
                continue;
            }
            closure(a, list, &n, mark, gen);
            qsort(list, (size_t)n, sizeof *list, cmp_int);
            const int t = dstate(ps, &d, list, n, &added);
            ok = t >= 0;
            if (ok)
                out->next[(size_t)k * nc + c] = (uint16_t)t;
        }
        for (size_t i = d.off[k]; ok && i < d.off[k + 1]; i++)
            if (a->s[d.pool[i]].kind == N_MATCH)
                out->accept[k] = 1;
    }
    out->n_states = (uint32_t)d.n;
    if (ok && d.n < (int)MMRT_JSON_PATTERN_MAX_STATES) {
        /* Room was made for the most states; a schema keeps only what it uses. */
        uint16_t *fit = realloc(out->next, (size_t)d.n * nc * sizeof *fit);
        if (fit)
            out->next = fit;
    }
    free(list);
    free(mark);
    free(d.off);
    free(d.table);
    free(d.pool);
    return ok;
}

/* ---- what each state can still become ---- */

/* Cuts the states no match is reachable from, and fills shortest and longest. */
static bool analyse(struct parser *ps, struct mmrt_json_pattern *p)
{
    const uint32_t ns = p->n_states, nc = p->n_classes;
    p->shortest = malloc(ns * sizeof *p->shortest);
    p->longest = malloc(ns * sizeof *p->longest);
    uint32_t *queue = malloc(ns * sizeof *queue);
    uint8_t *state = calloc(ns, 1);
    if (!p->shortest || !p->longest || !queue || !state) {
        free(queue);
        free(state);
        return bad(ps, MMRT_ERR_NO_MEMORY, "out of memory");
    }
    /* Shortest by rounds of relaxation from the accepting states (backward edges are not
     * stored: a round scans every edge; at most a state a round settles). */
    for (uint32_t s = 0; s < ns; s++)
        p->shortest[s] = p->accept[s] ? 0 : MMRT_JSON_PATTERN_UNBOUNDED;
    for (bool changed = true; changed;) {
        changed = false;
        for (uint32_t s = 0; s < ns; s++)
            for (uint32_t c = 0; c < nc; c++) {
                const uint16_t t = p->next[(size_t)s * nc + c];
                if (t != MMRT_JSON_PATTERN_DEAD && p->shortest[t] != MMRT_JSON_PATTERN_UNBOUNDED &&
                    p->shortest[t] + 1 < p->shortest[s]) {
                    p->shortest[s] = p->shortest[t] + 1;
                    changed = true;
                }
            }
    }
    /* Dead: no match reachable. */
    for (uint32_t s = 0; s < ns; s++)
        for (uint32_t c = 0; c < nc; c++) {
            uint16_t *t = &p->next[(size_t)s * nc + c];
            if (*t != MMRT_JSON_PATTERN_DEAD && p->shortest[*t] == MMRT_JSON_PATTERN_UNBOUNDED)
                *t = MMRT_JSON_PATTERN_DEAD;
        }
    bool ok = true;
    if (p->shortest[0] == MMRT_JSON_PATTERN_UNBOUNDED) {
        ps->st = mmrt_error_set(ps->err, MMRT_ERR_INVALID_ARG, "the pattern matches no string");
        ok = false;
    }
    /* Longest: unbounded where a cycle is reachable (every live state reaches a match), else
     * the longest path, by depth-first search (state: 0 new, 1 on the path, 2 done). */
    for (uint32_t root = 0; ok && root < ns; root++) {
        if (state[root] || p->shortest[root] == MMRT_JSON_PATTERN_UNBOUNDED)
            continue;
        /* An explicit stack of (state, next class to look at) in queue and longest's
         * neighbour: the path is at most ns long. */
        uint32_t *cls = calloc(ns, sizeof *cls);
        if (!cls) {
            ok = bad(ps, MMRT_ERR_NO_MEMORY, "out of memory");
            break;
        }
        uint32_t top = 0;
        queue[top++] = root;
        state[root] = 1;
        p->longest[root] = 0;
        while (top) {
            const uint32_t s = queue[top - 1];
            if (cls[s] == nc) {
                state[s] = 2;
                top--;
                if (top) {
                    const uint32_t u = queue[top - 1];
                    const uint32_t via = p->longest[s] == MMRT_JSON_PATTERN_UNBOUNDED
                                             ? MMRT_JSON_PATTERN_UNBOUNDED
                                             : p->longest[s] + 1;
                    if (via > p->longest[u])
                        p->longest[u] = via;
                }
                continue;
            }
            const uint16_t t = p->next[(size_t)s * nc + cls[s]++];
            if (t == MMRT_JSON_PATTERN_DEAD)
                continue;
            if (state[t] == 1) {
                p->longest[s] = MMRT_JSON_PATTERN_UNBOUNDED; /* a cycle */
            } else if (state[t] == 2) {
                const uint32_t via = p->longest[t] == MMRT_JSON_PATTERN_UNBOUNDED
                                         ? MMRT_JSON_PATTERN_UNBOUNDED
                                         : p->longest[t] + 1;
                if (via > p->longest[s])
                    p->longest[s] = via;
            } else {
                state[t] = 1;
                p->longest[t] = 0;
                queue[top++] = t;
            }
        }
        free(cls);
    }
    free(queue);
    free(state);
    return ok;
}

/* ---- the interface ---- */

mmrt_status mmrt_json_pattern_lengths(struct mmrt_json_pattern *p, uint32_t min, uint32_t max,
                                      struct mmrt_json_pattern_budget *budget,
                                      struct mmrt_error *err)
{
    free(p->window);
    p->window = NULL;
    p->min_len = min;
    p->max_len = max;
    if (p->shortest[0] > max || (max == MMRT_JSON_PATTERN_UNBOUNDED && p->longest[0] < min))
        return mmrt_error_set(err, MMRT_ERR_INVALID_ARG, "no string the pattern matches has a "
                              "length that '%s' allows",
                              p->shortest[0] > max ? "maxLength" : "minLength");
    /* Either bound alone, or one the pattern never reaches (every match from a state reached
     * in k characters is at most longest[0] − k long, at least shortest[0] − k), is held
     * exactly by shortest and longest. */
    if (max == MMRT_JSON_PATTERN_UNBOUNDED || min <= p->shortest[0] ||
        (p->longest[0] != MMRT_JSON_PATTERN_UNBOUNDED && p->longest[0] <= max))
        return mmrt_json_pattern_fits(p, 0, 0)
                   ? MMRT_OK
                   : mmrt_error_set(err, MMRT_ERR_INVALID_ARG, "no string the pattern matches "
                                    "has a length that 'minLength' allows");
    /* Both bind: reach[r][t] says a match is exactly r characters from t (r ≤ max), over
     * each state's distinct successors. */
    const uint32_t ns = p->n_states, cols = max + 1;
    uint16_t *succ = malloc((size_t)ns * p->n_classes * sizeof *succ);
    uint32_t *n_succ = calloc(ns, sizeof *n_succ), *seen = calloc(ns, sizeof *seen);
    if (!succ || !n_succ || !seen) {
        free(succ);
        free(n_succ);
        free(seen);
        return mmrt_error_set(err, MMRT_ERR_NO_MEMORY, "out of memory");
    }
    uint64_t edges = 0;
    for (uint32_t t = 0; t < ns; t++) {
        uint16_t *mine = succ + (size_t)t * p->n_classes;
        for (uint32_t c = 0; c < p->n_classes; c++) {
            const uint16_t u = p->next[(size_t)t * p->n_classes + c];
            if (u != MMRT_JSON_PATTERN_DEAD && seen[u] != t + 1) {
                seen[u] = t + 1;
                mine[n_succ[t]++] = u;
            }
        }
        edges += n_succ[t];
    }
    free(seen);
    mmrt_status st = MMRT_OK;
    const uint64_t bits = (uint64_t)ns * cols, work = (edges + ns) * cols;
    if (bits > budget->bits || work > budget->work)
        st = mmrt_error_set(err, MMRT_ERR_LIMIT, "a pattern of %u states beside 'minLength' "
                            "%u and 'maxLength' %u is past what mmrt tabulates (states × "
                            "(maxLength + 1) up to %u in a schema): keep one bound, or put "
                            "the length in the pattern", ns, min, max,
                            MMRT_JSON_PATTERN_MAX_WINDOW);
    if (st == MMRT_OK) {
        budget->bits -= bits;
        budget->work -= work;
    }
    uint8_t *reach = st == MMRT_OK ? malloc((size_t)ns * cols) : NULL;
    uint32_t *ahead = st == MMRT_OK ? malloc((size_t)cols * sizeof *ahead) : NULL;
    p->window = st == MMRT_OK ? calloc(((size_t)ns * cols + 7) / 8, 1) : NULL;
    if (st == MMRT_OK && (!reach || !ahead || !p->window))
        st = mmrt_error_set(err, MMRT_ERR_NO_MEMORY, "out of memory");
    if (st == MMRT_OK) {
        for (uint32_t t = 0; t < ns; t++)
            reach[t] = p->accept[t]; /* row r = 0 */
        for (uint32_t r = 1; r < cols; r++)
            for (uint32_t t = 0; t < ns; t++) {
                uint8_t any = 0;
                for (uint32_t j = 0; j < n_succ[t] && !any; j++)
                    any = reach[(size_t)(r - 1) * ns + succ[(size_t)t * p->n_classes + j]];
                reach[(size_t)r * ns + t] = any;
            }
        /* window(t, done): some r in [min − done, max − done] reaches; ahead[r] is the
         * fewest r' ≥ r that does, for one state at a time. */
        for (uint32_t t = 0; t < ns; t++) {
            uint32_t nearest = UINT32_MAX;
            for (uint32_t r = cols; r-- > 0;) {
                if (reach[(size_t)r * ns + t])
                    nearest = r;
                ahead[r] = nearest;
            }
            for (uint32_t done = 0; done < cols; done++) {
                const uint32_t need = min > done ? min - done : 0;
                if (ahead[need] <= max - done) {
                    const size_t bit = (size_t)t * cols + done;
                    p->window[bit >> 3] |= (uint8_t)(1u << (bit & 7));
                }
            }
        }
        if (!mmrt_json_pattern_fits(p, 0, 0))
            st = mmrt_error_set(err, MMRT_ERR_INVALID_ARG, "no string the pattern matches has "
                                "a length between 'minLength' %u and 'maxLength' %u", min, max);
    }
    free(succ);
    free(n_succ);
    free(reach);
    free(ahead);
    if (st != MMRT_OK) {
        free(p->window);
        p->window = NULL;
    }
    return st;
}

void mmrt_json_pattern_free(struct mmrt_json_pattern *p)
{
    if (!p)
        return;
    free(p->window);
    free(p->start);
    free(p->next);
    free(p->accept);
    free(p->shortest);
    free(p->longest);
    memset(p, 0, sizeof *p);
}

/* Any code point, for the text an unanchored pattern lets before or after its match. */
static int any_text(struct parser *ps)
{
    struct ranges l = { 0 };
    int t = -1;
    if (add_range(ps, &l, 0, CP_END - 1)) {
        const int set = new_set(ps, l.r, l.n, false);
        const int one = set < 0 ? -1 : new_tree(ps, T_SET, -1, -1);
        if (one >= 0) {
            ps->tree[one].set = set;
            t = new_tree(ps, T_REP, one, -1);
        }
        if (t >= 0)
            ps->tree[t].min = 0, ps->tree[t].max = MMRT_JSON_PATTERN_UNBOUNDED;
    }
    free(l.r);
    return t;
}

mmrt_status mmrt_json_pattern_compile(const char *pattern, size_t len,
                                      struct mmrt_json_pattern *out, struct mmrt_error *err)
{
    memset(out, 0, sizeof *out);
    out->max_len = MMRT_JSON_PATTERN_UNBOUNDED;
    if (len > MMRT_JSON_PATTERN_MAX_BYTES)
        return mmrt_error_set(err, MMRT_ERR_LIMIT, "pattern: longer than %u bytes",
                              MMRT_JSON_PATTERN_MAX_BYTES);
    struct parser ps = { .p = pattern, .len = len, .err = err };
    /* '^' first and an unescaped '$' last anchor the match; else any text may come before
     * and after it. */
    bool head = len && pattern[0] == '^', tail = false;
    if (len > (size_t)head && pattern[len - 1] == '$') {
        size_t slashes = 0;
        while (slashes < len - 1 && pattern[len - 2 - slashes] == '\\')
            slashes++;
        tail = slashes % 2 == 0;
    }
    ps.i = head;
    ps.len = len - tail;
    int t = parse_alt(&ps, 0);
    if (t >= 0 && !at_end(&ps))
        bad(&ps, MMRT_ERR_INVALID_ARG, "')' without '('");
    ps.len = len;
    if (ps.st == MMRT_OK && !head) {
        const int pre = any_text(&ps);
        t = pre < 0 ? -1 : new_tree(&ps, T_CAT, pre, t);
    }
    if (ps.st == MMRT_OK && !tail) {
        const int post = any_text(&ps);
        t = post < 0 ? -1 : new_tree(&ps, T_CAT, t, post);
    }
    struct nfa a = { 0 };
    int start = -1;
    if (ps.st == MMRT_OK) {
        const int match = nfa_add(&ps, &a, N_MATCH, -1, -1, -1);
        start = match < 0 ? -1 : build(&ps, &a, t, match);
    }
    if (ps.st == MMRT_OK && start >= 0 && classes(&ps, out) && determinise(&ps, &a, start, out))
        analyse(&ps, out);
    free(a.s);
    free(ps.tree);
    free(ps.sets);
    free(ps.ranges);
    if (ps.st != MMRT_OK) {
        mmrt_json_pattern_free(out);
        return ps.st;
    }
    return MMRT_OK;
}

/* The class of code point cp. */
static uint32_t class_of(const struct mmrt_json_pattern *p, uint32_t cp)
{
    uint32_t lo = 0, hi = p->n_classes;
    while (hi - lo > 1) {
        const uint32_t m = lo + (hi - lo) / 2;
        if (p->start[m] <= cp)
            lo = m;
        else
            hi = m;
    }
    return lo;
}

uint16_t mmrt_json_pattern_step(const struct mmrt_json_pattern *p, uint16_t s, uint32_t cp)
{
    if (cp >= CP_END || s >= p->n_states)
        return MMRT_JSON_PATTERN_DEAD;
    return p->next[(size_t)s * p->n_classes + class_of(p, cp)];
}

int mmrt_json_pattern_any(const struct mmrt_json_pattern *p, uint16_t s, uint32_t lo,
                          uint32_t hi, uint32_t done)
{
    if (s >= p->n_states || lo > hi || lo >= CP_END)
        return 0;
    if (hi >= CP_END)
        hi = CP_END - 1;
    for (uint32_t c = class_of(p, lo); c < p->n_classes && p->start[c] <= hi; c++) {
        const uint16_t t = p->next[(size_t)s * p->n_classes + c];
        if (t != MMRT_JSON_PATTERN_DEAD && mmrt_json_pattern_fits(p, t, done))
            return 1;
    }
    return 0;
}
