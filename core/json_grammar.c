/*
 * core/json_grammar.c — the prefix recogniser of json_grammar.h: a lexical state per byte,
 * containers as frames, values checked against their schema node as they start and end.
 */
#include "json_grammar.h"

#include <string.h>

enum {
    S_TOP,        /* before the top-level value */
    S_VALUE,      /* a value of node `value` must come (after ':' or an array's ',') */
    S_ARR_FIRST,  /* after '[': an item or ']' */
    S_OBJ_FIRST,  /* after '{': a key or '}' */
    S_KEY,        /* after an object's ',': a key */
    S_COLON,      /* after a key; `value` is its value's node */
    S_AFTER,      /* after a value: ',' or the container's end; at depth 0 the text is whole */
    S_STRING,
    S_ESCAPE,     /* after '\' in a string */
    S_HEX,        /* in \uXXXX: aux digits to come */
    S_LITERAL,    /* in an enum value or a listed key: candidates [lo, hi), pos bytes read */
    S_MINUS,      /* number: after '-' */
    S_ZERO,       /* number: a leading 0 */
    S_INT,        /* number: digits of the integer part */
    S_DOT,        /* number: after '.' */
    S_FRAC,       /* number: fraction digits */
    S_EXP,        /* number: after 'e' / 'E' */
    S_EXP_SIGN,   /* number: after the exponent's sign */
    S_EXP_DIGITS, /* number: exponent digits */
};

enum {
    F_KEY = 1,  /* the string or literal being read is an object's key */
    F_HIGH = 2, /* the string's last character was a \u high surrogate: a low one pairs it */
    /* The string is free text: a key, or a value with no maxLength whose minLength is met.
     * Its characters are no longer counted, so a character leaves the state as it is (what
     * mmrt_json_grammar_in_string promises). */
    F_FREE = 4,
    F_NEG = 8, /* a number held to bounds: it began with '-' */
    /* The string is held to a pattern: lo is the pattern's state, hi a UTF-8 character
     * being read (its length << 28 | bytes still to come << 24 | its bits so far) or,
     * after a \u high surrogate, that surrogate. */
    F_PATTERN = 16,
    /* The literal is a key's value in object alternatives, its candidates tagged with the
     * alternatives they belong to: only those of live ones are candidates. */
    F_TAGGED = 32,
    /* The literal is an item of an array with uniqueItems: its frame's live marks the
     * literals (by index in their node) that came, and only the others are candidates. */
    F_UNIQUE = 64,
};

void mmrt_json_grammar_init(struct mmrt_json_grammar *g, const struct mmrt_json_schema *schema)
{
    memset(g, 0, offsetof(struct mmrt_json_grammar, frame));
    g->schema = schema;
    g->state = S_TOP;
    g->value = schema->root;
}

static bool is_space(unsigned char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

static bool is_digit(unsigned char c)
{
    return c >= '0' && c <= '9';
}

static int hex_value(unsigned char c)
{
    return is_digit(c) ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10
         : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

static const struct mmrt_json_node *node(const struct mmrt_json_grammar *g, uint16_t id)
{
    return &g->schema->node[id];
}

static struct mmrt_json_frame *top(struct mmrt_json_grammar *g)
{
    return &g->frame[g->depth - 1];
}

static bool free_text(const struct mmrt_json_grammar *g)
{
    return g->flags & F_FREE;
}

/* Whether a string value of node n with pos characters so far is free text. */
static uint8_t free_flag(const struct mmrt_json_node *n, uint32_t pos)
{
    return n->max == MMRT_JSON_UNBOUNDED && pos >= n->min && !n->n ? F_FREE : 0;
}

/* ---- integers held to bounds and multiples ---- */

static bool bounded(const struct mmrt_json_node *n)
{
    return (n->kind == MMRT_JSON_INTEGER || n->kind == MMRT_JSON_NUMBER) && n->n;
}

/* The magnitudes [*a, *b] node n's bounds allow an integer of the sign neg (b ≤ 2^63);
 * false when they allow none past zero. */
static bool magnitudes(const struct mmrt_json_node *n, bool neg, uint64_t *a, uint64_t *b)
{
    if (!neg) {
        if (n->imax < 1)
            return false;
        *a = n->imin < 1 ? 1 : (uint64_t)n->imin;
        *b = (uint64_t)n->imax;
    } else {
        if (n->imin > -1)
            return false;
        *a = n->imax > -1 ? 1 : (uint64_t)(-(n->imax + 1)) + 1;
        *b = (uint64_t)(-(n->imin + 1)) + 1;
    }
    return true;
}

/* Whether some integer that begins as read so far is within node n's bounds and a multiple
 * of n->mul: a sign alone (-0, or a negative one), a whole 0, or digits mag, which j more
 * digits make one of [mag·10^j, mag·10^j + 10^j − 1]. */
static bool reachable(const struct mmrt_json_grammar *g, const struct mmrt_json_node *n)
{
    const bool neg = g->flags & F_NEG;
    const bool zero = n->imin <= 0 && n->imax >= 0;
    uint64_t a, b;
    if (g->state == S_ZERO)
        return zero;
    if (g->state == S_MINUS)
        return zero || (magnitudes(n, true, &a, &b) && mmrt_json_has_multiple(a, b, n->mul));
    if (!magnitudes(n, neg, &a, &b))
        return false;
    for (uint64_t lo = g->mag, span = 1;; lo *= 10, span *= 10) {
        if (lo > b)
            return false;
        const uint64_t x = lo > a ? lo : a;
        const uint64_t y = span - 1 > b - lo ? b : lo + (span - 1);
        if (x <= y && mmrt_json_has_multiple(x, y, n->mul))
            return true;
        if (lo > UINT64_MAX / 10 || span > UINT64_MAX / 10)
            return false;
    }
}

/* Whether the integer read whole is within node n's bounds and a multiple. */
static bool within(const struct mmrt_json_grammar *g, const struct mmrt_json_node *n)
{
    if (g->state == S_ZERO)
        return n->imin <= 0 && n->imax >= 0;
    uint64_t a, b;
    return magnitudes(n, g->flags & F_NEG, &a, &b) && g->mag >= a && g->mag <= b &&
           g->mag % n->mul == 0;
}

/* A digit of a bounded integer (S_INT): taken while some integer it begins is in bounds. */
static bool bounded_digit(struct mmrt_json_grammar *g, const struct mmrt_json_node *n,
                          unsigned char c)
{
    const unsigned d = (unsigned)(c - '0');
    if (g->mag > (UINT64_MAX - d) / 10)
        return false;
    g->mag = g->mag * 10 + d;
    return reachable(g, n);
}

/* ---- numbers held to bounds ----
 *
 * A number held to bounds is written without exponent, and its magnitude must lie in the
 * range (json_schema.h) of its sign, [A, B] with exact decimal bounds. The digits read are
 * never kept: only how many there are, and how they compare, digit by digit from the first,
 * with each bound's digits at the same places (cmp_a, cmp_b: less, equal so far, greater).
 * In the integer part the places are counted from the left, before its length is known;
 * at the point, or at the end, a part shorter or longer than the bound's decides instead.
 * That is enough to tell whether a prefix can still reach [A, B]:
 *   - integer digits D (n of them) go on to D·10^j + [0, 10^j) for any j: take the fewest
 *     integer digits m ≥ n that A allows (past A's count, or at it when D is not below A's
 *     first n digits), then B must allow m (below its count, or at it when D is not above);
 *   - after the point, the digits read so far, v with k fraction digits, go on to [v, v +
 *     10^−k): A < v + 10^−k unless v is below A's first digits, and v ≤ B unless above. */

enum { CMP_LT, CMP_EQ, CMP_GT };

static const struct mmrt_json_range *range_of(const struct mmrt_json_grammar *g,
                                              const struct mmrt_json_node *n)
{
    return &g->schema->ranges[n->lit + ((g->flags & F_NEG) ? 1 : 0)];
}

/* c, the digit at place i of the number, against bound d's there, if equal so far. */
static uint8_t cmp_digit(const struct mmrt_json_grammar *g, uint8_t cmp,
                         const struct mmrt_json_decimal *d, uint32_t i, unsigned char c)
{
    if (cmp != CMP_EQ)
        return cmp;
    const unsigned char b = i < d->len ? (unsigned char)g->schema->text[d->off + i] : '0';
    return c < b ? CMP_LT : c > b ? CMP_GT : CMP_EQ;
}

/* The comparison once the integer part is whole: its length against the bound's, then its
 * digits. */
static uint8_t cmp_whole(uint8_t cmp, uint32_t n, const struct mmrt_json_decimal *d)
{
    return n < d->n_int ? CMP_LT : n > d->n_int ? CMP_GT : cmp;
}

static bool dec_reachable(const struct mmrt_json_grammar *g, const struct mmrt_json_range *r)
{
    if (g->state != S_INT)
        return g->dec.cmp_a != CMP_LT && (!r->b_finite || g->dec.cmp_b != CMP_GT);
    const uint32_t n = g->dec.n_int, la = r->a.n_int;
    uint32_t m = n > la ? n : la;
    if (m == la && g->dec.cmp_a == CMP_LT)
        m++;
    return !r->b_finite || m < r->b.n_int || (m == r->b.n_int && g->dec.cmp_b != CMP_GT);
}

/* A digit of a bounded number's integer part: a leading 0 (S_ZERO) or digit c of S_INT. */
static bool dec_int_digit(struct mmrt_json_grammar *g, const struct mmrt_json_range *r,
                          unsigned char c)
{
    if (r->empty)
        return false;
    if (g->state == S_ZERO) { /* the whole integer part: 0 */
        g->dec.cmp_a = cmp_whole(CMP_EQ, 0, &r->a);
        g->dec.cmp_b = cmp_whole(CMP_EQ, 0, &r->b);
        return dec_reachable(g, r);
    }
    if (g->dec.n_int == UINT16_MAX)
        return false;
    const uint32_t i = g->dec.n_int++;
    g->dec.cmp_a = cmp_digit(g, g->dec.cmp_a, &r->a, i, c);
    if (r->b_finite)
        g->dec.cmp_b = cmp_digit(g, g->dec.cmp_b, &r->b, i, c);
    return dec_reachable(g, r);
}

/* The integer part ends (at the point or the number's end). */
static void dec_whole(struct mmrt_json_grammar *g, const struct mmrt_json_range *r)
{
    if (g->state != S_INT)
        return;
    g->dec.cmp_a = cmp_whole(g->dec.cmp_a, g->dec.n_int, &r->a);
    g->dec.cmp_b = cmp_whole(g->dec.cmp_b, g->dec.n_int, &r->b);
}

/* Fraction digit c: it is at place n_int + k of the number and of a bound whose integer part
 * it has matched. */
static bool dec_frac_digit(struct mmrt_json_grammar *g, const struct mmrt_json_range *r,
                           unsigned char c)
{
    if (g->dec.n_frac == UINT16_MAX)
        return false;
    const uint32_t k = g->dec.n_frac++;
    g->dec.cmp_a = cmp_digit(g, g->dec.cmp_a, &r->a, r->a.n_int + k, c);
    if (r->b_finite)
        g->dec.cmp_b = cmp_digit(g, g->dec.cmp_b, &r->b, r->b.n_int + k, c);
    return dec_reachable(g, r);
}

/* Whether the number read whole lies in [A, B]: above A's digits, or equal to them with A
 * having none further; not above B's (equal is B cut short, at most B). */
static bool dec_within(struct mmrt_json_grammar *g, const struct mmrt_json_range *r)
{
    dec_whole(g, r);
    const bool a = g->dec.cmp_a == CMP_GT ||
                   (g->dec.cmp_a == CMP_EQ && r->a.len <= r->a.n_int + g->dec.n_frac);
    return a && (!r->b_finite || g->dec.cmp_b != CMP_GT);
}

/* The first digit c of a bounded number, the state (S_ZERO or S_INT) set. */
static bool bounded_lead(struct mmrt_json_grammar *g, const struct mmrt_json_node *n,
                         unsigned char c)
{
    if (n->kind == MMRT_JSON_INTEGER)
        return g->state == S_INT ? bounded_digit(g, n, c) : reachable(g, n);
    return dec_int_digit(g, range_of(g, n), c);
}

/* A bounded number's first byte c: its sign or its first digit. */
static bool bounded_start(struct mmrt_json_grammar *g, const struct mmrt_json_node *n,
                          unsigned char c)
{
    g->flags = c == '-' ? F_NEG : 0;
    if (n->kind == MMRT_JSON_INTEGER) {
        g->mag = 0;
    } else {
        g->dec.n_int = g->dec.n_frac = 0;
        g->dec.cmp_a = g->dec.cmp_b = CMP_EQ;
    }
    if (g->state != S_MINUS)
        return bounded_lead(g, n, c);
    return n->kind == MMRT_JSON_INTEGER ? reachable(g, n) : !range_of(g, n)->empty;
}

/* ---- objects with listed keys: which may come next ---- */

/* The first required property at or after index next (o->n if none): no key past it may
 * come before it. */
static uint32_t required_from(const struct mmrt_json_grammar *g, const struct mmrt_json_node *o,
                              uint32_t next)
{
    const struct mmrt_json_prop *p = g->schema->prop + o->first;
    while (next < o->n && !p[next].required)
        next++;
    return next;
}

/* Whether some key of [lo, hi) of the literals may come next in the open object. */
/* Object alternatives: alternative a's entry for key j. */
static const struct mmrt_json_prop *alt_prop(const struct mmrt_json_grammar *g,
                                             const struct mmrt_json_node *o, uint32_t a,
                                             uint32_t j)
{
    return &g->schema->prop[o->first + o->n * (1 + a) + j];
}

/* Whether alternative a may write key j when keys from next on may come: it has j, skips
 * none of its required keys, and j's value has a finite document. */
static bool alt_may(const struct mmrt_json_grammar *g, const struct mmrt_json_node *o,
                    uint32_t a, uint32_t next, uint32_t j)
{
    if (j < next || alt_prop(g, o, a, j)->node == MMRT_JSON_NONE ||
        g->schema->prop[o->first + j].node == MMRT_JSON_NONE)
        return false;
    for (uint32_t k = next; k < j; k++)
        if (alt_prop(g, o, a, k)->required)
            return false;
    return true;
}

/* The alternatives of live that may write key j next. */
static uint16_t alts_may(const struct mmrt_json_grammar *g, const struct mmrt_json_node *o,
                         uint16_t live, uint32_t next, uint32_t j)
{
    uint16_t m = 0;
    for (uint32_t a = 0; a < o->extra; a++)
        if ((live >> a & 1) && alt_may(g, o, a, next, j))
            m |= (uint16_t)(1u << a);
    return m;
}

/* The value node of key j of object o, live its alternatives once j is read: the key's own,
 * or, where object alternatives give it different schemas, the live ones' (which agree). */
static uint16_t key_value(const struct mmrt_json_grammar *g, const struct mmrt_json_node *o,
                          uint16_t live, uint32_t j)
{
    const struct mmrt_json_prop *p = &g->schema->prop[o->first + j];
    if (o->kind != MMRT_JSON_OBJECTS || !p->per_alternative)
        return p->node;
    for (uint32_t a = 0; a < o->extra; a++)
        if ((live >> a & 1) && alt_prop(g, o, a, j)->node != MMRT_JSON_NONE)
            return alt_prop(g, o, a, j)->node;
    return p->node; /* not reached: j is read only when some live alternative has it */
}

static bool some_key_allowed(const struct mmrt_json_grammar *g, uint32_t lo, uint32_t hi)
{
    const struct mmrt_json_frame *f = &g->frame[g->depth - 1];
    const struct mmrt_json_node *o = node(g, f->node);
    if (o->kind == MMRT_JSON_OBJECTS) {
        for (uint32_t i = lo; i < hi; i++)
            if (alts_may(g, o, f->live, f->count, g->schema->lit[i].prop))
                return true;
        return false;
    }
    const uint32_t last = required_from(g, o, f->count);
    const struct mmrt_json_prop *p = g->schema->prop + o->first;
    for (uint32_t i = lo; i < hi; i++) {
        const uint32_t k = g->schema->lit[i].prop;
        if (k >= f->count && k <= last && p[k].node != MMRT_JSON_NONE)
            return true;
    }
    return false;
}

/* Whether some literal of [lo, hi) belongs to a live alternative of the open object. */
static bool some_tag_live(const struct mmrt_json_grammar *g, uint32_t lo, uint32_t hi)
{
    const uint16_t live = g->frame[g->depth - 1].live;
    for (uint32_t i = lo; i < hi; i++)
        if (g->schema->lit[i].prop & live)
            return true;
    return false;
}

/* ---- values ---- */

static bool push(struct mmrt_json_grammar *g, uint16_t id, uint8_t state)
{
    if (g->depth >= MMRT_JSON_MAX_DEPTH)
        return false;
    const struct mmrt_json_node *n = node(g, id);
    g->frame[g->depth++] = (struct mmrt_json_frame){
        .node = id, .live = n->kind == MMRT_JSON_OBJECTS ? (uint16_t)((1u << n->extra) - 1) : 0
    };
    g->state = state;
    g->space = 0;
    return true;
}

static bool pop(struct mmrt_json_grammar *g)
{
    g->depth--;
    g->state = S_AFTER;
    g->space = 0;
    return true;
}

static bool literal_step(struct mmrt_json_grammar *g, unsigned char c);

/* The first byte of a value of node id. */
static bool start_value(struct mmrt_json_grammar *g, uint16_t id, unsigned char c)
{
    const struct mmrt_json_node *n = node(g, id);
    if (n->kind == MMRT_JSON_UNION) {
        int k;
        switch (c) {
        case '{': k = MMRT_JSON_CLASS_OBJECT; break;
        case '[': k = MMRT_JSON_CLASS_ARRAY; break;
        case '"': k = MMRT_JSON_CLASS_STRING; break;
        case 't': k = MMRT_JSON_CLASS_TRUE; break;
        case 'f': k = MMRT_JSON_CLASS_FALSE; break;
        case 'n': k = MMRT_JSON_CLASS_NULL; break;
        default:
            if (c != '-' && !is_digit(c))
                return false;
            k = MMRT_JSON_CLASS_NUMBER;
        }
        id = n->alt[k];
        if (id == MMRT_JSON_NONE)
            return false;
        n = node(g, id); /* never a union: json_schema.c links them flat */
    }
    g->value = id;
    g->flags = 0;
    g->pos = 0;
    switch (n->kind) {
    case MMRT_JSON_OBJECT: case MMRT_JSON_OBJECTS: return c == '{' && push(g, id, S_OBJ_FIRST);
    case MMRT_JSON_ARRAY: return c == '[' && push(g, id, S_ARR_FIRST);
    case MMRT_JSON_STRING:
        g->state = S_STRING;
        g->flags = free_flag(n, 0);
        if (n->n) {
            g->flags |= F_PATTERN;
            g->lo = g->hi = 0;
        }
        return c == '"';
    case MMRT_JSON_NUMBER: case MMRT_JSON_INTEGER:
        if (c != '-' && !is_digit(c))
            return false;
        g->state = c == '-' ? S_MINUS : c == '0' ? S_ZERO : S_INT;
        return !bounded(n) || bounded_start(g, n, c);
    case MMRT_JSON_LITERALS:
        g->state = S_LITERAL;
        if (n->extra == 1)
            g->flags = F_TAGGED;
        else if (g->depth && node(g, top(g)->node)->kind == MMRT_JSON_ARRAY &&
                 node(g, top(g)->node)->lit)
            g->flags = F_UNIQUE; /* an item: values start as items of the array on top */
        g->lo = n->lit;
        g->hi = n->lit + n->n;
        return literal_step(g, c);
    default:
        return false;
    }
}

/* The node of item i of array a: a tuple's own, then items'. */
static uint16_t item_node(const struct mmrt_json_grammar *g, const struct mmrt_json_node *a,
                          uint32_t i)
{
    return i < a->n ? g->schema->prop[a->first + i].node : a->extra;
}

/* A value of the open array starts (an item counts as it starts). */
static bool start_item(struct mmrt_json_grammar *g, unsigned char c)
{
    struct mmrt_json_frame *f = top(g);
    const struct mmrt_json_node *a = node(g, f->node);
    if (f->count >= a->max)
        return false;
    const uint16_t item = item_node(g, a, f->count);
    if (f->count < UINT16_MAX)
        f->count++;
    return start_value(g, item, c);
}

/* '"' where a key of the open object may start. */
static bool start_key(struct mmrt_json_grammar *g)
{
    const struct mmrt_json_node *o = node(g, top(g)->node);
    g->pos = 0;
    g->flags = F_KEY;
    if (o->n == 0) { /* a free key: the frame counts them (minProperties, maxProperties) */
        struct mmrt_json_frame *f = top(g);
        if (o->extra == MMRT_JSON_NONE || f->count >= o->max)
            return false;
        if (f->count < UINT16_MAX)
            f->count++;
        g->state = S_STRING;
        g->flags = F_KEY | F_FREE;
        return true;
    }
    g->state = S_LITERAL;
    g->lo = o->lit;
    g->hi = o->lit + o->n;
    return literal_step(g, '"');
}

/* Whether the open object may close: no required key is still to come. */
static bool object_may_close(const struct mmrt_json_grammar *g)
{
    const struct mmrt_json_frame *f = &g->frame[g->depth - 1];
    const struct mmrt_json_node *o = node(g, f->node);
    if (o->kind == MMRT_JSON_OBJECTS) { /* some alternative lacks no required key */
        for (uint32_t a = 0; a < o->extra; a++) {
            bool ok = f->live >> a & 1;
            for (uint32_t j = f->count; ok && j < o->n; j++)
                ok = !alt_prop(g, o, a, j)->required;
            if (ok)
                return true;
        }
        return false;
    }
    return o->n == 0 ? f->count >= o->min : required_from(g, o, f->count) == o->n;
}

/* A byte after a complete value: ',' or the end of the open container. */
static bool after_value(struct mmrt_json_grammar *g, unsigned char c)
{
    if (g->depth == 0)
        return false; /* the text is whole: only whitespace may follow */
    const struct mmrt_json_frame *f = top(g);
    const struct mmrt_json_node *n = node(g, f->node);
    if (n->kind == MMRT_JSON_ARRAY) {
        if (c == ',' && f->count < n->max) {
            g->state = S_VALUE;
            g->value = item_node(g, n, f->count);
            return true;
        }
        return c == ']' && f->count >= n->min && pop(g);
    }
    if (c == ',') {
        g->state = S_KEY;
        return n->n == 0 ? n->extra != MMRT_JSON_NONE && f->count < n->max
                         : some_key_allowed(g, n->lit, n->lit + n->n);
    }
    return c == '}' && object_may_close(g) && pop(g);
}

static bool step(struct mmrt_json_grammar *g, unsigned char c);

/* A byte that ends a value read up to here (a number, an enum value another extends). */
static bool end_value_then(struct mmrt_json_grammar *g, unsigned char c)
{
    g->state = S_AFTER;
    g->space = 0;
    return step(g, c);
}

/* Whether some literal of [a, b) has not come yet in the open array (F_UNIQUE). */
static bool some_unused(const struct mmrt_json_grammar *g, uint32_t a, uint32_t b)
{
    const uint32_t base = node(g, g->value)->lit;
    const uint16_t used = g->depth ? g->frame[g->depth - 1].live : 0;
    for (uint32_t i = a; i < b; i++)
        if (!(used >> (i - base) & 1))
            return true;
    return false;
}

/* Literal i is read whole, a value: what it says to its container. */
static void literal_came(struct mmrt_json_grammar *g, uint32_t i)
{
    if (g->flags & F_TAGGED)
        top(g)->live &= (uint16_t)g->schema->lit[i].prop;
    if (g->flags & F_UNIQUE)
        top(g)->live |= (uint16_t)(1u << (i - node(g, g->value)->lit));
}

/* Byte c of a literal: keeps the candidates whose byte at pos is c. When one is left and
 * read whole, the literal ends (a key then wants its ':'); when none is, a value read whole
 * ends and c is read after it. */
static bool literal_step(struct mmrt_json_grammar *g, unsigned char c)
{
    const struct mmrt_json_schema *s = g->schema;
    const struct mmrt_json_literal *l = s->lit;
    const uint32_t pos = g->pos;
    /* The candidates share their first pos bytes and are sorted, so their bytes at pos (−1
     * for one that ends there) rise through [lo, hi): two binary searches. */
#define AT(i) (l[i].len > pos ? (int)(unsigned char)s->text[l[i].off + pos] : -1)
    uint32_t a = g->lo, b = g->hi;
    while (a < b) {
        const uint32_t m = a + (b - a) / 2;
        if (AT(m) < (int)c)
            a = m + 1;
        else
            b = m;
    }
    uint32_t e = a, z = g->hi;
    while (e < z) {
        const uint32_t m = e + (z - e) / 2;
        if (AT(m) <= (int)c)
            e = m + 1;
        else
            z = m;
    }
#undef AT
    if (a == e || ((g->flags & F_KEY) && !some_key_allowed(g, a, e)) ||
        ((g->flags & F_TAGGED) && !some_tag_live(g, a, e)) ||
        ((g->flags & F_UNIQUE) && !some_unused(g, a, e))) {
        /* No candidate goes on with c: a value that one candidate is whole at ends here. */
        if (!(g->flags & F_KEY) && l[g->lo].len == pos &&
            (!(g->flags & F_TAGGED) || (l[g->lo].prop & top(g)->live)) &&
            (!(g->flags & F_UNIQUE) || some_unused(g, g->lo, g->lo + 1))) {
            literal_came(g, g->lo);
            return end_value_then(g, c);
        }
        return false;
    }
    g->lo = a;
    g->hi = e;
    g->pos = pos + 1;
    if (e - a == 1 && l[a].len == pos + 1) {
        g->space = 0;
        if (g->flags & F_KEY) {
            struct mmrt_json_frame *f = top(g);
            const struct mmrt_json_node *o = node(g, f->node);
            if (o->kind == MMRT_JSON_OBJECTS)
                f->live = alts_may(g, o, f->live, f->count, l[a].prop);
            f->count = (uint16_t)(l[a].prop + 1);
            g->value = key_value(g, o, f->live, l[a].prop);
            g->state = S_COLON;
        } else {
            literal_came(g, a);
            g->state = S_AFTER;
        }
    }
    return true;
}


/* A character of a counted string comes: within maxLength? */
static bool count_char(struct mmrt_json_grammar *g)
{
    const struct mmrt_json_node *n = node(g, g->value);
    if (g->pos >= n->max)
        return false;
    g->pos++;
    g->flags |= free_flag(n, g->pos);
    return true;
}

/* "\u" read: its four hex digits come. */
static bool start_hex(struct mmrt_json_grammar *g)
{
    g->state = S_HEX;
    g->aux = 4;
    g->hex = 0;
    return true;
}

/* ---- strings held to a pattern ---- */

static const struct mmrt_json_pattern *pattern_of(const struct mmrt_json_grammar *g)
{
    return &g->schema->patterns[node(g, g->value)->lit];
}

/* Whether some code point of [lo, hi] may come next: the pattern goes on with it to a state
 * from which a match is reached within maxLength and not short of minLength. */
static bool pattern_may(const struct mmrt_json_grammar *g, uint32_t lo, uint32_t hi)
{
    return mmrt_json_pattern_any(pattern_of(g), (uint16_t)g->lo, lo, hi, g->pos + 1);
}

/* A whole character: pattern_may for one code point, in one look-up. */
static bool pattern_char(struct mmrt_json_grammar *g, uint32_t cp)
{
    const struct mmrt_json_pattern *p = pattern_of(g);
    const uint16_t t = mmrt_json_pattern_step(p, (uint16_t)g->lo, cp);
    const uint32_t after = g->pos + 1;
    if (t == MMRT_JSON_PATTERN_DEAD || !mmrt_json_pattern_fits(p, t, after))
        return false;
    g->lo = t;
    g->pos = after;
    return true;
}

/* The code points a \u escape's digits so far (units [a, b]) may still stand for. */
static bool pattern_units(const struct mmrt_json_grammar *g, uint32_t a, uint32_t b)
{
    bool ok = false;
    if (a < 0xd800)
        ok = pattern_may(g, a, b < 0xd7ff ? b : 0xd7ff);
    if (!ok && b >= 0xd800 && a <= 0xdbff) { /* a high surrogate: the planes above */
        const uint32_t ha = a > 0xd800 ? a : 0xd800, hb = b < 0xdbff ? b : 0xdbff;
        ok = pattern_may(g, 0x10000 + ((ha - 0xd800) << 10),
                         0x10000 + ((hb - 0xd800) << 10) + 0x3ff);
    }
    if (!ok && b >= 0xe000)
        ok = pattern_may(g, a > 0xe000 ? a : 0xe000, b);
    return ok;
}

/* A byte of a string held to a pattern (S_STRING, S_ESCAPE, S_HEX): each character is
 * taken whole by the pattern's automaton, and each part of one only while some character it
 * begins may come. */
static bool pattern_step(struct mmrt_json_grammar *g, unsigned char c)
{
    const uint32_t more = g->hi >> 24 & 3, total = g->hi >> 28;
    if (g->state == S_STRING) {
        if (more) { /* a continuation byte */
            const uint32_t bits = g->hi & 0x1fffff;
            /* The second byte of E0, ED, F0 and F4 is narrower: no overlong form, no
             * surrogate, nothing past U+10FFFF. */
            unsigned char lo = 0x80, hi = 0xbf;
            if (more == total - 1 && total == 3 && bits == 0)
                lo = 0xa0;
            else if (more == total - 1 && total == 3 && bits == 0xd)
                hi = 0x9f;
            else if (more == total - 1 && total == 4 && bits == 0)
                lo = 0x90;
            else if (more == total - 1 && total == 4 && bits == 4)
                hi = 0x8f;
            if (c < lo || c > hi)
                return false;
            const uint32_t cp = bits << 6 | (c & 0x3fu);
            if (more == 1) {
                g->hi = 0;
                return pattern_char(g, cp);
            }
            g->hi = total << 28 | (more - 1) << 24 | cp;
            const unsigned sh = 6 * (more - 1);
            return pattern_may(g, cp << sh, ((cp + 1) << sh) - 1);
        }
        if (g->flags & F_HIGH) {
            g->state = S_ESCAPE;
            return c == '\\';
        }
        if (c == '"') {
            g->space = 0;
            g->state = S_AFTER;
            return g->pos >= node(g, g->value)->min && pattern_of(g)->accept[g->lo];
        }
        if (c < 0x20)
            return false;
        if (c == '\\') {
            g->state = S_ESCAPE; /* any character can be escaped: one must be able to come */
            return pattern_may(g, 0, 0x10ffff);
        }
        if (c < 0x80)
            return pattern_char(g, c);
        uint32_t cp, n;
        if (c >= 0xc2 && c <= 0xdf)
            cp = c & 0x1fu, n = 1;
        else if (c >= 0xe0 && c <= 0xef)
            cp = c & 0x0fu, n = 2;
        else if (c >= 0xf0 && c <= 0xf4)
            cp = c & 0x07u, n = 3;
        else
            return false;
        g->hi = (n + 1) << 28 | n << 24 | cp;
        /* The code points a lead byte begins: those its length encodes (E0 A0 80 is U+0800,
         * not an overlong U+0000), no surrogates, none past U+10FFFF. */
        uint32_t a = cp << 6 * n, b = ((cp + 1) << 6 * n) - 1;
        const uint32_t least = n == 1 ? 0x80 : n == 2 ? 0x800 : 0x10000;
        a = a < least ? least : a;
        b = b > 0x10ffff ? 0x10ffff : b;
        if (n == 2 && cp == 0xd)
            b = 0xd7ff;
        return pattern_may(g, a, b);
    }
    if (g->state == S_ESCAPE) {
        if (c == 'u')
            return start_hex(g);
        g->state = S_STRING;
        static const char esc[] = "\"\"\\\\//b\bf\fn\nr\rt\t";
        for (const char *e = esc; *e && !(g->flags & F_HIGH); e += 2)
            if (c == (unsigned char)e[0])
                return pattern_char(g, (unsigned char)e[1]);
        return false;
    }
    const int h = hex_value(c); /* S_HEX */
    if (h < 0)
        return false;
    g->hex = (uint16_t)(g->hex << 4 | h);
    --g->aux;
    const unsigned sh = 4u * g->aux;
    const uint32_t a = (uint32_t)g->hex << sh, b = a + (1u << sh) - 1;
    if (g->flags & F_HIGH) { /* the low half of a pair */
        const uint32_t la = a < 0xdc00 ? 0xdc00 : a, lb = b > 0xdfff ? 0xdfff : b;
        if (la > lb)
            return false;
        const uint32_t base = 0x10000 + ((g->hi - 0xd800) << 10) - 0xdc00;
        if (g->aux > 0)
            return pattern_may(g, base + la, base + lb);
        g->state = S_STRING;
        g->flags &= (uint8_t)~F_HIGH;
        g->hi = 0;
        return pattern_char(g, base + g->hex);
    }
    if (g->aux > 0)
        return pattern_units(g, a, b);
    g->state = S_STRING;
    if (g->hex >= 0xdc00 && g->hex <= 0xdfff)
        return false;
    if (g->hex >= 0xd800 && g->hex <= 0xdbff) {
        g->flags |= F_HIGH;
        g->hi = g->hex;
        return pattern_units(g, g->hex, g->hex);
    }
    return pattern_char(g, g->hex);
}

static bool step(struct mmrt_json_grammar *g, unsigned char c)
{
    if (g->flags & F_PATTERN &&
        (g->state == S_STRING || g->state == S_ESCAPE || g->state == S_HEX))
        return pattern_step(g, c);
    switch (g->state) {
    case S_TOP: case S_VALUE: case S_ARR_FIRST: case S_OBJ_FIRST: case S_KEY: case S_COLON:
    case S_AFTER:
        if (is_space(c))
            return ++g->space <= (g->state == S_TOP ? 1 : MMRT_JSON_MAX_SPACE);
        g->space = 0;
        switch (g->state) {
        case S_TOP: return start_value(g, g->value, c);
        case S_VALUE:
            return g->depth && node(g, top(g)->node)->kind == MMRT_JSON_ARRAY
                       ? start_item(g, c)
                       : start_value(g, g->value, c);
        case S_ARR_FIRST:
            if (c == ']')
                return node(g, top(g)->node)->min == 0 && pop(g);
            return start_item(g, c);
        case S_OBJ_FIRST: case S_KEY:
            if (c == '}' && g->state == S_OBJ_FIRST)
                return object_may_close(g) && pop(g);
            return c == '"' && start_key(g);
        case S_COLON:
            if (c != ':')
                return false;
            g->state = S_VALUE;
            return true;
        default: return after_value(g, c);
        }
    case S_STRING:
        /* After a \u high surrogate only its low one may come: a lone surrogate is no
         * character, and strict parsers (jansson among them) refuse the text. */
        if (g->flags & F_HIGH) {
            g->state = S_ESCAPE;
            return c == '\\';
        }
        if (c == '"') {
            g->space = 0;
            if (g->flags & F_KEY) {
                g->state = S_COLON;
                g->value = node(g, top(g)->node)->extra;
                return true;
            }
            g->state = S_AFTER;
            return g->pos >= node(g, g->value)->min;
        }
        if (c < 0x20)
            return false;
        if (c == '\\') {
            g->state = S_ESCAPE;
            return free_text(g) || g->pos < node(g, g->value)->max;
        }
        if (free_text(g))
            return true;
        return (c & 0xc0) == 0x80 || count_char(g); /* a continuation byte adds nothing */
    case S_ESCAPE:
        if (c == 'u')
            return start_hex(g);
        g->state = S_STRING;
        if (c == '\0' || (g->flags & F_HIGH) || !strchr("\"\\/bfnrt", c))
            return false;
        return free_text(g) || count_char(g);
    case S_HEX: {
        const int h = hex_value(c);
        if (h < 0)
            return false;
        g->hex = (uint16_t)(g->hex << 4 | h);
        --g->aux;
        /* Refused at the digit that decides: a low surrogate is the second of a pair. */
        if (g->aux == 2 && (((g->hex & 0xfc) == 0xdc) != ((g->flags & F_HIGH) != 0)))
            return false;
        if (g->aux == 3 && (g->flags & F_HIGH) && g->hex != 0xd)
            return false;
        if (g->aux > 0)
            return true;
        g->state = S_STRING;
        if (g->flags & F_HIGH) {
            g->flags &= (uint8_t)~F_HIGH; /* the pair is one character, counted already */
            return true;
        }
        if (g->hex >= 0xd800 && g->hex <= 0xdbff)
            g->flags |= F_HIGH;
        return free_text(g) || count_char(g);
    }
    case S_LITERAL: return literal_step(g, c);
    case S_MINUS:
        if (c == '0')
            g->state = S_ZERO;
        else if (c >= '1' && c <= '9')
            g->state = S_INT;
        else
            return false;
        return !bounded(node(g, g->value)) || bounded_lead(g, node(g, g->value), c);
    case S_ZERO: case S_INT: case S_FRAC: case S_EXP_DIGITS: {
        const struct mmrt_json_node *n = node(g, g->value);
        const bool held = bounded(n), integer = n->kind == MMRT_JSON_INTEGER;
        const bool decimal = held && !integer; /* no exponent */
        if (is_digit(c) && g->state != S_ZERO) {
            if (!held)
                return true;
            if (integer)
                return bounded_digit(g, n, c);
            return g->state == S_INT ? dec_int_digit(g, range_of(g, n), c)
                                     : dec_frac_digit(g, range_of(g, n), c);
        }
        if (c == '.' && (g->state == S_ZERO || g->state == S_INT) && !integer) {
            if (decimal)
                dec_whole(g, range_of(g, n));
            g->state = S_DOT;
            return !decimal || dec_reachable(g, range_of(g, n));
        }
        if ((c == 'e' || c == 'E') && g->state != S_EXP_DIGITS && !integer && !decimal) {
            g->state = S_EXP;
            return true;
        }
        if (is_digit(c)) /* a digit after a leading 0 */
            return false;
        if (held && !(integer ? within(g, n) : dec_within(g, range_of(g, n))))
            return false;
        return end_value_then(g, c);
    }
    case S_DOT: {
        if (!is_digit(c))
            return false;
        g->state = S_FRAC;
        const struct mmrt_json_node *n = node(g, g->value);
        return !bounded(n) || dec_frac_digit(g, range_of(g, n), c);
    }
    case S_EXP: case S_EXP_SIGN:
        if ((c == '+' || c == '-') && g->state == S_EXP) {
            g->state = S_EXP_SIGN;
            return true;
        }
        if (!is_digit(c))
            return false;
        g->state = S_EXP_DIGITS;
        return true;
    default:
        return false;
    }
}

bool mmrt_json_grammar_feed(struct mmrt_json_grammar *g, const char *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!step(g, (unsigned char)p[i]))
            return false;
    return true;
}

bool mmrt_json_grammar_done(const struct mmrt_json_grammar *g)
{
    return g->depth == 0 && g->state == S_AFTER;
}

bool mmrt_json_grammar_in_string(const struct mmrt_json_grammar *g)
{
    return g->state == S_STRING && (g->flags & (F_FREE | F_HIGH)) == F_FREE;
}
