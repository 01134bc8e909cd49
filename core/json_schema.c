/*
 * core/json_schema.c — compiles a JSON Schema into json_schema.h's table in two passes: the
 * first walks the schema and makes a node per subschema (a union keeps its alternatives as
 * a list, for a $ref may point at a node still being made); the second gives each union its
 * table by first byte, merging literals, and then keeps the generator out of subschemas with
 * no finite document.
 */
#include "json_schema.h"

#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "formats/json.h"

/* The nodes every compiled schema starts with: any value, and its parts. */
enum { N_ANY, N_ANY_OBJECT, N_ANY_ARRAY, N_ANY_STRING, N_ANY_NUMBER, N_ANY_LITERAL, N_BUILTIN };

/* A $ref target being made or made: its node, and the containers around it when its making
 * began (a reference back to it with no container between is a cycle without progress). */
struct ref_memo {
    const json_t *target;
    uint16_t node;
    bool done;
    uint32_t containers;
};

/* A union's alternatives and, for messages, where it is in the schema. */
struct union_info {
    uint16_t node;
    bool one_of;
    char *path;
};

struct compiler {
    struct mmrt_json_schema *s;
    uint32_t cap_nodes, cap_props, cap_lits, cap_patterns, cap_ranges;
    size_t cap_text;
    uint16_t *alts;
    uint32_t n_alts, cap_alts;
    struct union_info *unions;
    uint32_t n_unions, cap_unions;
    struct ref_memo *memo;
    uint32_t n_memo, cap_memo;
    const json_t *root;
    uint32_t containers;
    uint32_t refs;        /* $ref targets being made, one inside another */
    struct mmrt_json_pattern_budget windows; /* what patterns' length windows may still take */
    char **uniques;       /* the place of each array with uniqueItems (its node's lit − 1) */
    uint32_t n_uniques, cap_uniques;
    char path[256];
    size_t path_len;
    struct mmrt_error *err;
};

/* ---- errors and the JSON pointer of where we are ---- */

static mmrt_status failv(struct compiler *c, mmrt_status st, const char *path, const char *fmt,
                         va_list ap)
{
    char what[MMRT_ERROR_MAX];
    vsnprintf(what, sizeof what, fmt, ap);
    return mmrt_error_set(c->err, st, "json_schema %s: %s", path[0] ? path : "(the root)",
                          what);
}

static mmrt_status(fail)(struct compiler *c, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    mmrt_status st = failv(c, MMRT_ERR_INVALID_ARG, c->path, fmt, ap);
    va_end(ap);
    return st;
}

static mmrt_status(fail_limit)(struct compiler *c, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    mmrt_status st = failv(c, MMRT_ERR_LIMIT, c->path, fmt, ap);
    va_end(ap);
    return st;
}

static mmrt_status(failv_path)(struct compiler *c, const char *path, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    mmrt_status st = failv(c, MMRT_ERR_INVALID_ARG, path, fmt, ap);
    va_end(ap);
    return st;
}

#ifdef __clang_analyzer__ /* see MMRT_RETURNS_STATUS in core/error.h */
#define fail(c, ...) MMRT_RETURNS_STATUS((fail)(c, __VA_ARGS__), MMRT_ERR_INVALID_ARG)
#define fail_limit(c, ...) MMRT_RETURNS_STATUS((fail_limit)(c, __VA_ARGS__), MMRT_ERR_LIMIT)
#define failv_path(c, path, ...)                                                               \
    MMRT_RETURNS_STATUS((failv_path)(c, path, __VA_ARGS__), MMRT_ERR_INVALID_ARG)
#endif

static mmrt_status no_memory(struct compiler *c)
{
    return mmrt_error_set(c->err, MMRT_ERR_NO_MEMORY, "json_schema: out of memory");
}

/* A schema's string for a message: cut to size bytes, control bytes as '?'. */
static const char *quote(char *buf, size_t size, const char *s)
{
    snprintf(buf, size, "%s", s);
    for (char *p = buf; *p; p++)
        if ((unsigned char)*p < 0x20 || *p == 0x7f)
            *p = '?';
    return buf;
}

/* Appends "/seg" (RFC 6901: '~' as ~0, '/' as ~1) to the path; returns the old length for
 * pop_path. A path too long for the buffer ends in "..." and stays that way. */
static size_t push_path(struct compiler *c, const char *seg)
{
    const size_t old = c->path_len, cap = sizeof c->path;
    size_t n = old;
    char buf[sizeof c->path];
    size_t k = 0;
    buf[k++] = '/';
    for (const char *p = seg; *p && k + 2 < sizeof buf; p++) {
        if (*p == '~' || *p == '/') {
            buf[k++] = '~';
            buf[k++] = *p == '~' ? '0' : '1';
        } else {
            /* Control bytes from a hostile schema stay out of one-line messages. */
            buf[k++] = (unsigned char)*p < 0x20 || *p == 0x7f ? '?' : *p;
        }
    }
    if (n + k + 4 >= cap) {
        if (n + 4 < cap)
            memcpy(c->path + n, "...", 4), n += 3;
    } else {
        memcpy(c->path + n, buf, k);
        n += k;
        c->path[n] = '\0';
    }
    c->path_len = n;
    return old;
}

static size_t push_index(struct compiler *c, size_t i)
{
    char seg[24];
    snprintf(seg, sizeof seg, "%zu", i);
    return push_path(c, seg);
}

static void pop_path(struct compiler *c, size_t old)
{
    c->path_len = old;
    c->path[old] = '\0';
}

/* ---- growing the tables ---- */

static bool grow(void **p, uint32_t *cap, uint32_t need, size_t elem)
{
    if (need <= *cap)
        return true;
    uint32_t n = *cap ? *cap : 16;
    while (n < need)
        n *= 2;
    void *q = realloc(*p, (size_t)n * elem);
    if (!q)
        return false;
    *p = q;
    *cap = n;
    return true;
}

static mmrt_status new_node(struct compiler *c, uint8_t kind, uint16_t *out)
{
    struct mmrt_json_schema *s = c->s;
    if (s->n_nodes >= MMRT_JSON_SCHEMA_MAX_NODES)
        return fail_limit(c, "more than %u subschemas", MMRT_JSON_SCHEMA_MAX_NODES);
    if (!grow((void **)&s->node, &c->cap_nodes, s->n_nodes + 1, sizeof *s->node))
        return no_memory(c);
    struct mmrt_json_node *n = &s->node[s->n_nodes];
    memset(n, 0, sizeof *n);
    n->kind = kind;
    n->extra = MMRT_JSON_NONE;
    n->max = MMRT_JSON_UNBOUNDED;
    for (int k = 0; k < MMRT_JSON_CLASSES; k++)
        n->alt[k] = MMRT_JSON_NONE;
    *out = (uint16_t)s->n_nodes++;
    return MMRT_OK;
}

/* ---- literals: the compact text of a JSON value ---- */

struct text {
    char *p;
    size_t n, cap;
    bool over; /* past MMRT_JSON_SCHEMA_MAX_TEXT, or out of memory (then oom too) */
    bool oom;
};

static void put(struct text *t, const char *p, size_t n)
{
    if (t->over || t->n + n > MMRT_JSON_SCHEMA_MAX_TEXT) {
        t->over = true;
        return;
    }
    if (t->n + n > t->cap) {
        size_t cap = t->cap ? t->cap : 256;
        while (cap < t->n + n)
            cap *= 2;
        char *q = realloc(t->p, cap);
        if (!q) {
            t->over = t->oom = true;
            free(t->p);
            t->p = NULL;
            t->n = t->cap = 0;
            return;
        }
        t->p = q;
        t->cap = cap;
    }
    memcpy(t->p + t->n, p, n);
    t->n += n;
}

/* A string as JSON writes it with the fewest escapes. */
static void put_string(struct text *t, const char *s, size_t len)
{
    put(t, "\"", 1);
    for (size_t i = 0; i < len; i++) {
        const unsigned char b = (unsigned char)s[i];
        const char *esc = b == '"' ? "\\\"" : b == '\\' ? "\\\\" : b == '\b' ? "\\b"
                        : b == '\f' ? "\\f" : b == '\n' ? "\\n" : b == '\r' ? "\\r"
                        : b == '\t' ? "\\t" : NULL;
        char u[8];
        if (!esc && b < 0x20) {
            snprintf(u, sizeof u, "\\u%04x", b);
            esc = u;
        }
        if (esc)
            put(t, esc, strlen(esc));
        else
            put(t, (const char *)&b, 1);
    }
    put(t, "\"", 1);
}

/* jansson's compact form of a real with the fewest digits that read back as the same
 * double (0.1, not 0.10000000000000001), or NULL out of memory. jansson writes and reads
 * reals whatever the C locale's decimal point (snprintf and strtod would follow it: "1,5"
 * under a comma locale). */
static char *shortest_real(const json_t *v)
{
    for (int prec = 15; prec <= 17; prec++) {
        char *s = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT | JSON_REAL_PRECISION(prec));
        json_t *back = s ? json_loads(s, JSON_DECODE_ANY, NULL) : NULL;
        const bool same = back && json_is_real(back) &&
                          json_real_value(back) == json_real_value(v);
        json_decref(back);
        if (same)
            return s;
        free(s);
    }
    return NULL;
}

static void put_real(struct text *t, const json_t *v)
{
    char *best = shortest_real(v);
    if (!best) {
        t->over = t->oom = true;
        return;
    }
    put(t, best, strlen(best));
    free(best);
}

static void put_value(struct text *t, const json_t *v)
{
    char buf[32];
    switch (json_typeof(v)) {
    case JSON_OBJECT: {
        const char *k;
        const json_t *x;
        bool first = true;
        put(t, "{", 1);
        json_object_foreach((json_t *)v, k, x) {
            if (!first)
                put(t, ",", 1);
            first = false;
            put_string(t, k, strlen(k));
            put(t, ":", 1);
            put_value(t, x);
        }
        put(t, "}", 1);
        return;
    }
    case JSON_ARRAY:
        put(t, "[", 1);
        for (size_t i = 0; i < json_array_size(v); i++) {
            if (i)
                put(t, ",", 1);
            put_value(t, json_array_get(v, i));
        }
        put(t, "]", 1);
        return;
    case JSON_STRING: put_string(t, json_string_value(v), json_string_length(v)); return;
    case JSON_INTEGER:
        snprintf(buf, sizeof buf, "%lld", (long long)json_integer_value(v));
        put(t, buf, strlen(buf));
        return;
    case JSON_REAL: put_real(t, v); return;
    case JSON_TRUE: put(t, "true", 4); return;
    case JSON_FALSE: put(t, "false", 5); return;
    case JSON_NULL: put(t, "null", 4); return;
    }
}

/* Appends n bytes to the schema's text (literals, and the digits of numbers' bounds); *off
 * is where they start. */
static mmrt_status add_text(struct compiler *c, const char *p, size_t n, uint32_t *off)
{
    struct mmrt_json_schema *s = c->s;
    if (s->n_text + n > MMRT_JSON_SCHEMA_MAX_TEXT)
        return fail_limit(c, "enum values, keys and the digits of bounds longer than %u bytes "
                          "in all", MMRT_JSON_SCHEMA_MAX_TEXT);
    if (s->n_text + n > c->cap_text) {
        size_t cap = c->cap_text ? c->cap_text : 1024;
        while (cap < s->n_text + n)
            cap *= 2;
        char *q = realloc(s->text, cap);
        if (!q)
            return no_memory(c);
        s->text = q;
        c->cap_text = cap;
    }
    if (n)
        memcpy(s->text + s->n_text, p, n);
    *off = (uint32_t)s->n_text;
    s->n_text += n;
    return MMRT_OK;
}

/* Adds literals (the value's text and, for a key, its prop index) to the schema's text and
 * literal tables. */
static mmrt_status add_literal(struct compiler *c, const char *p, size_t n, uint32_t prop)
{
    struct mmrt_json_schema *s = c->s;
    if (s->n_lits >= MMRT_JSON_SCHEMA_MAX_LITERALS)
        return fail_limit(c, "more than %u enum values and keys", MMRT_JSON_SCHEMA_MAX_LITERALS);
    if (!grow((void **)&s->lit, &c->cap_lits, s->n_lits + 1, sizeof *s->lit))
        return no_memory(c);
    uint32_t off = 0;
    mmrt_status st = add_text(c, p, n, &off);
    if (st == MMRT_OK)
        s->lit[s->n_lits++] = (struct mmrt_json_literal){ .off = off, .len = (uint32_t)n,
                                                          .prop = prop };
    return st;
}

static int cmp_literal(const struct mmrt_json_schema *s, const struct mmrt_json_literal *x,
                       const struct mmrt_json_literal *y)
{
    const uint32_t n = x->len < y->len ? x->len : y->len;
    const int d = memcmp(s->text + x->off, s->text + y->off, n);
    if (d)
        return d;
    return (x->len > y->len) - (x->len < y->len);
}

/* Sorts literals [first, s->n_lits) by their bytes (a merge sort: qsort has no context for
 * the text, and an enum may be long) and drops repeats; returns how many remain. */
static mmrt_status sort_literals(struct compiler *c, uint32_t first, uint32_t *kept)
{
    struct mmrt_json_schema *s = c->s;
    const uint32_t n = s->n_lits - first;
    struct mmrt_json_literal *l = s->lit + first;
    if (n > 1) {
        struct mmrt_json_literal *tmp = malloc((size_t)n * sizeof *tmp);
        if (!tmp)
            return no_memory(c);
        for (uint32_t w = 1; w < n; w *= 2) {
            for (uint32_t lo = 0; lo < n; lo += 2 * w) {
                const uint32_t mid = lo + w < n ? lo + w : n, hi = lo + 2 * w < n ? lo + 2 * w : n;
                uint32_t i = lo, j = mid, k = lo;
                while (i < mid && j < hi)
                    tmp[k++] = cmp_literal(s, &l[j], &l[i]) < 0 ? l[j++] : l[i++];
                while (i < mid)
                    tmp[k++] = l[i++];
                while (j < hi)
                    tmp[k++] = l[j++];
            }
            memcpy(l, tmp, (size_t)n * sizeof *l);
        }
        free(tmp);
    }
    /* A repeat is dropped, its prop merged (the masks of object alternatives' literals). */
    uint32_t k = 0;
    for (uint32_t i = 0; i < n; i++) {
        if (k == 0 || cmp_literal(s, &l[i], &l[k - 1]) != 0)
            l[k++] = l[i];
        else
            l[k - 1].prop |= l[i].prop;
    }
    s->n_lits = first + k;
    *kept = k;
    return MMRT_OK;
}

/* Adds the bytes of literal `from` (of this schema) again: its text may move as it grows. */
static mmrt_status dup_literal(struct compiler *c, uint32_t from, uint32_t prop)
{
    const struct mmrt_json_literal l = c->s->lit[from];
    char buf[256];
    char *tmp = l.len <= sizeof buf ? buf : malloc(l.len);
    if (!tmp)
        return no_memory(c);
    memcpy(tmp, c->s->text + l.off, l.len);
    mmrt_status st = add_literal(c, tmp, l.len, prop);
    if (tmp != buf)
        free(tmp);
    return st;
}

/* ---- pass one: a node per subschema ---- */

enum {
    T_OBJECT = 1, T_ARRAY = 2, T_STRING = 4, T_INTEGER = 8, T_NUMBER = 16, T_BOOLEAN = 32,
    T_NULL = 64, T_ALL = 127
};

static const struct { const char *name; unsigned bit; } type_names[] = {
    { "object", T_OBJECT }, { "array", T_ARRAY }, { "string", T_STRING },
    { "integer", T_INTEGER }, { "number", T_NUMBER }, { "boolean", T_BOOLEAN },
    { "null", T_NULL },
};

/* Keywords that constrain a value and that the compiled recogniser holds an answer to. */
static const char *const handled[] = {
    "type", "properties", "required", "additionalProperties", "items", "minItems", "maxItems",
    "minLength", "maxLength", "pattern", "minimum", "maximum", "exclusiveMinimum",
    "exclusiveMaximum", "multipleOf", "prefixItems", "additionalItems", "uniqueItems",
    "minProperties", "maxProperties",
    "enum", "const", "anyOf", "oneOf", "allOf", "$ref", NULL,
};

/* The bounds of a number. */
static const char *const bounds[] = {
    "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", NULL,
};

/* Assertions JSON Schema has that mmrt cannot hold an answer to: refused, never ignored
 * (a generated answer would break them). Anything else unknown is an annotation. */
static const char *const refused[] = {
    "patternProperties",
    "contains", "minContains", "maxContains", "not", "if",
    "then", "else", "dependentRequired", "dependentSchemas", "dependencies", "propertyNames",
    "unevaluatedProperties", "unevaluatedItems", "$dynamicRef", "$recursiveRef", NULL,
};

static bool listed(const char *const *list, const char *k)
{
    for (; *list; list++)
        if (strcmp(*list, k) == 0)
            return true;
    return false;
}

/* The JSON types a value is of (an integral real is an integer too, as JSON Schema has it). */
static unsigned value_types(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT: return T_OBJECT;
    case JSON_ARRAY: return T_ARRAY;
    case JSON_STRING: return T_STRING;
    case JSON_INTEGER: return T_INTEGER | T_NUMBER;
    case JSON_REAL: {
        const double x = json_real_value(v);
        return x == floor(x) ? T_INTEGER | T_NUMBER : T_NUMBER;
    }
    case JSON_TRUE: case JSON_FALSE: return T_BOOLEAN;
    default: return T_NULL;
    }
}

static mmrt_status compile(struct compiler *c, const json_t *v, uint16_t *out);

/* A count keyword (minItems, maxLength, ...): a non-negative integer. A minimum past
 * MMRT_JSON_SCHEMA_MAX_COUNT is refused; a maximum past it is held to it. */
static mmrt_status get_count(struct compiler *c, const json_t *v, const char *key, bool is_max,
                             uint32_t *out)
{
    const json_t *x = json_object_get(v, key);
    if (!x)
        return MMRT_OK;
    const size_t old = push_path(c, key);
    mmrt_status st = MMRT_OK;
    if (!json_is_integer(x) || json_integer_value(x) < 0) {
        st = fail(c, "'%s' must be a non-negative integer, not %s", key, mmrt_json_type_name(x));
    } else if ((unsigned long long)json_integer_value(x) > MMRT_JSON_SCHEMA_MAX_COUNT) {
        /* A maximum past the bound is written as the bound: fewer items or characters
         * than the schema allows still satisfy it. */
        if (is_max)
            *out = MMRT_JSON_SCHEMA_MAX_COUNT;
        else
            st = fail_limit(c, "'%s' %lld is above mmrt's %u", key,
                            (long long)json_integer_value(x), MMRT_JSON_SCHEMA_MAX_COUNT);
    } else {
        *out = (uint32_t)json_integer_value(x);
    }
    pop_path(c, old);
    return st;
}

static mmrt_status min_max(struct compiler *c, const json_t *v, const char *kmin,
                           const char *kmax, uint32_t *min, uint32_t *max)
{
    *min = 0;
    *max = MMRT_JSON_UNBOUNDED;
    mmrt_status st = get_count(c, v, kmin, false, min);
    if (st == MMRT_OK)
        st = get_count(c, v, kmax, true, max);
    if (st == MMRT_OK && *min > *max)
        st = fail(c, "'%s' %u is above '%s' %u: no value has both", kmin, *min, kmax, *max);
    return st;
}

/* A union over alts[0, n): resolved in pass two. */
static mmrt_status new_union(struct compiler *c, const uint16_t *alts, uint32_t n, bool one_of,
                             uint16_t *out)
{
    mmrt_status st = new_node(c, MMRT_JSON_UNION, out);
    if (st != MMRT_OK)
        return st;
    if (!grow((void **)&c->alts, &c->cap_alts, c->n_alts + n, sizeof *c->alts) ||
        !grow((void **)&c->unions, &c->cap_unions, c->n_unions + 1, sizeof *c->unions))
        return no_memory(c);
    char *path = strdup(c->path);
    if (!path)
        return no_memory(c);
    c->unions[c->n_unions] = (struct union_info){ .node = *out, .one_of = one_of, .path = path };
    struct mmrt_json_node *u = &c->s->node[*out];
    u->first = c->n_alts;
    u->n = n;
    u->lit = c->n_unions++;
    memcpy(c->alts + c->n_alts, alts, n * sizeof *alts);
    c->n_alts += n;
    return MMRT_OK;
}

/* The literals added since `first`, sorted and without repeats, as one node (*kept of
 * them; a node of none is the caller's to refuse before it is made). */
static mmrt_status literals_node(struct compiler *c, uint32_t first, uint16_t *out,
                                 uint32_t *kept)
{
    mmrt_status st = sort_literals(c, first, kept);
    if (st == MMRT_OK && *kept == 0)
        return MMRT_OK;
    if (st == MMRT_OK)
        st = new_node(c, MMRT_JSON_LITERALS, out);
    if (st == MMRT_OK) {
        c->s->node[*out].lit = first;
        c->s->node[*out].n = *kept;
    }
    return st;
}

/* The enum values of `values` (a list) that are of the types in mask, as one literal node. */
static mmrt_status compile_literals(struct compiler *c, const json_t *values, const char *key,
                                    unsigned mask, uint16_t *out)
{
    const uint32_t first = c->s->n_lits;
    struct text t = { 0 };
    mmrt_status st = MMRT_OK;
    for (size_t i = 0; i < json_array_size(values) && st == MMRT_OK; i++) {
        const json_t *x = json_array_get(values, i);
        if (!(value_types(x) & mask))
            continue;
        t.n = 0;
        put_value(&t, x);
        if (t.over)
            st = t.oom ? no_memory(c)
                       : fail_limit(c, "'%s' value %zu is longer than %u bytes", key, i,
                                    MMRT_JSON_SCHEMA_MAX_TEXT);
        else
            st = add_literal(c, t.p, t.n, 0);
    }
    free(t.p);
    uint32_t kept = 0;
    if (st == MMRT_OK)
        st = literals_node(c, first, out, &kept);
    if (st == MMRT_OK && kept == 0)
        st = json_array_size(values) == 0
                 ? fail(c, "'%s' lists no value: no document satisfies it", key)
                 : fail(c, "no value of '%s' is of the type the schema names", key);
    return st;
}

/* A node for one literal text, such as "null". */
static mmrt_status literal_node(struct compiler *c, const char *const *texts, uint32_t n,
                                uint16_t *out)
{
    const uint32_t first = c->s->n_lits;
    mmrt_status st = MMRT_OK;
    for (uint32_t i = 0; i < n && st == MMRT_OK; i++)
        st = add_literal(c, texts[i], strlen(texts[i]), 0);
    uint32_t kept = 0;
    return st == MMRT_OK ? literals_node(c, first, out, &kept) : st;
}

/* A subschema of v under key (additionalProperties, items): absent or true is any value,
 * false is MMRT_JSON_NONE. */
static mmrt_status compile_member(struct compiler *c, const json_t *v, const char *key,
                                  uint16_t *out)
{
    const json_t *x = json_object_get(v, key);
    if (!x || json_is_true(x)) {
        *out = N_ANY;
        return MMRT_OK;
    }
    if (json_is_false(x)) {
        *out = MMRT_JSON_NONE;
        return MMRT_OK;
    }
    const size_t old = push_path(c, key);
    mmrt_status st = compile(c, x, out);
    pop_path(c, old);
    return st;
}

/* minProperties and maxProperties of an object (props [first, first + n) listed; extra the
 * value of other keys): held by counting free keys (*min, *max on the node); with listed keys,
 * where a document has from its required keys to all of them, only when every such count
 * satisfies them (then they bound nothing). Free keys are not remembered, so a key written
 * twice would count twice where a parser keeps one: a minimum above 1 is refused (a maximum
 * only errs low). */
static mmrt_status property_counts(struct compiler *c, const json_t *v, uint32_t first,
                                   uint32_t n, uint16_t extra, uint32_t *min, uint32_t *max)
{
    mmrt_status st = min_max(c, v, "minProperties", "maxProperties", min, max);
    if (st != MMRT_OK || (*min == 0 && *max == MMRT_JSON_UNBOUNDED))
        return st;
    const char *key = json_object_get(v, "minProperties") ? "minProperties" : "maxProperties";
    if (n > 0) {
        uint32_t required = 0;
        for (uint32_t i = 0; i < n; i++)
            required += c->s->prop[first + i].required != 0;
        if (*min <= required && *max >= n) {
            *min = 0;
            *max = MMRT_JSON_UNBOUNDED;
            return MMRT_OK;
        }
        const size_t old = push_path(c, key);
        st = fail(c, "'%s' beside listed properties is supported only where every document "
                  "of them satisfies it (%u to %u keys here)", key, required, n);
        pop_path(c, old);
        return st;
    }
    if (*min > 1) {
        const size_t old = push_path(c, "minProperties");
        st = fail(c, "'minProperties' %u is not supported: free keys are not remembered, so "
                  "two would count a repeated key twice (0 and 1 are)", *min);
        pop_path(c, old);
        return st;
    }
    if (extra == MMRT_JSON_NONE && *min > 0) {
        const size_t old = push_path(c, "minProperties");
        st = fail(c, "'minProperties' %u but no key is allowed: no document satisfies it",
                  *min);
        pop_path(c, old);
    }
    return st;
}

static mmrt_status compile_object(struct compiler *c, const json_t *v, uint16_t *out)
{
    const json_t *props = json_object_get(v, "properties");
    const json_t *req = json_object_get(v, "required");
    if (props && !json_is_object(props)) {
        const size_t old = push_path(c, "properties");
        mmrt_status st = fail(c, "'properties' must be an object, not %s",
                              mmrt_json_type_name(props));
        pop_path(c, old);
        return st;
    }
    if (req && !json_is_array(req)) {
        const size_t old = push_path(c, "required");
        mmrt_status st = fail(c, "'required' must be a list of strings, not %s",
                              mmrt_json_type_name(req));
        pop_path(c, old);
        return st;
    }
    const size_t n_listed = props ? json_object_size(props) : 0;
    const size_t n_req = req ? json_array_size(req) : 0;
    if (n_listed + n_req >= UINT16_MAX)
        return fail_limit(c, "more than %u properties", UINT16_MAX - 1);
    /* The keys (listed, then required ones not listed) and their nodes, gathered here: the
     * subschemas add props of their own while they compile. */
    const char **keys = calloc(n_listed + n_req + 1, sizeof *keys);
    struct mmrt_json_prop *mine = calloc(n_listed + n_req + 1, sizeof *mine);
    if (!keys || !mine) {
        free(keys);
        free(mine);
        return no_memory(c);
    }
    uint32_t n = 0;
    mmrt_status st = MMRT_OK;
    uint16_t extra = N_ANY;
    c->containers++;
    st = compile_member(c, v, "additionalProperties", &extra);
    const char *k;
    const json_t *x;
    if (props && st == MMRT_OK)
        json_object_foreach((json_t *)props, k, x) {
            const size_t o1 = push_path(c, "properties"), o2 = push_path(c, k);
            st = compile(c, x, &mine[n].node);
            pop_path(c, o2);
            pop_path(c, o1);
            if (st != MMRT_OK)
                break;
            keys[n++] = k;
        }
    for (size_t i = 0; i < n_req && st == MMRT_OK; i++) {
        const json_t *r = json_array_get(req, i);
        const size_t old = push_path(c, "required");
        push_index(c, i);
        if (!json_is_string(r)) {
            st = fail(c, "'required' lists %s, not a key", mmrt_json_type_name(r));
        } else {
            uint32_t j = 0;
            while (j < n && strcmp(keys[j], json_string_value(r)) != 0)
                j++;
            if (j == n) {
                /* Required but not listed: its value is additionalProperties'. */
                if (extra == MMRT_JSON_NONE)
                    st = fail(c, "required key '%s' is not in 'properties' and "
                              "additionalProperties is false: no document satisfies it",
                              json_string_value(r));
                keys[n] = json_string_value(r);
                mine[n++].node = extra;
            }
            mine[j].required = 1;
        }
        pop_path(c, old);
    }
    c->containers--;
    const uint32_t first_prop = c->s->n_props, first_lit = c->s->n_lits;
    if (st == MMRT_OK && !grow((void **)&c->s->prop, &c->cap_props, first_prop + n,
                               sizeof *c->s->prop))
        st = no_memory(c);
    struct text t = { 0 };
    for (uint32_t i = 0; i < n && st == MMRT_OK; i++) {
        c->s->prop[c->s->n_props++] = mine[i];
        t.n = 0;
        put_string(&t, keys[i], strlen(keys[i]));
        st = t.over ? (t.oom ? no_memory(c)
                             : fail_limit(c, "a key is longer than %u bytes",
                                          MMRT_JSON_SCHEMA_MAX_TEXT))
                    : add_literal(c, t.p, t.n, i);
    }
    free(t.p);
    free(keys);
    free(mine);
    uint32_t kept = 0;
    if (st == MMRT_OK)
        st = sort_literals(c, first_lit, &kept);
    uint32_t min = 0, max = MMRT_JSON_UNBOUNDED;
    if (st == MMRT_OK)
        st = property_counts(c, v, first_prop, n, extra, &min, &max);
    if (st == MMRT_OK)
        st = new_node(c, MMRT_JSON_OBJECT, out);
    if (st == MMRT_OK) {
        struct mmrt_json_node *o = &c->s->node[*out];
        o->first = first_prop;
        o->n = n;
        o->lit = first_lit;
        o->extra = n ? MMRT_JSON_NONE : extra; /* listed keys only, when there are any */
        o->min = min;
        o->max = max;
    }
    return st;
}

static mmrt_status compile_array(struct compiler *c, const json_t *v, uint16_t *out)
{
    /* A tuple: prefixItems (JSON Schema 2020-12; Pydantic's tuple[...]) with items for the
     * rest, or the older items as a list with additionalItems for the rest. */
    const json_t *items = json_object_get(v, "items"), *prefix = json_object_get(v, "prefixItems");
    const char *tuple_key = "prefixItems", *rest_key = "items";
    if (items && json_is_array(items)) {
        if (prefix) {
            const size_t old = push_path(c, "items");
            mmrt_status st = fail(c, "'items' as a list beside 'prefixItems': give the tuple "
                                  "once");
            pop_path(c, old);
            return st;
        }
        prefix = items;
        tuple_key = "items";
        rest_key = "additionalItems";
    }
    if (prefix && !json_is_array(prefix)) {
        const size_t old = push_path(c, tuple_key);
        mmrt_status st = fail(c, "'%s' must be a list of schemas, not %s", tuple_key,
                              mmrt_json_type_name(prefix));
        pop_path(c, old);
        return st;
    }
    const size_t n_prefix = prefix ? json_array_size(prefix) : 0;
    if (n_prefix > MMRT_JSON_SCHEMA_MAX_COUNT) {
        const size_t old = push_path(c, tuple_key);
        mmrt_status st = fail_limit(c, "'%s' lists more than %u schemas", tuple_key,
                                    MMRT_JSON_SCHEMA_MAX_COUNT);
        pop_path(c, old);
        return st;
    }
    uint32_t min, max;
    mmrt_status st = min_max(c, v, "minItems", "maxItems", &min, &max);
    /* The tuple's nodes, gathered here: the subschemas add props of their own. */
    struct mmrt_json_prop *mine = calloc(n_prefix + 1, sizeof *mine);
    if (!mine)
        return no_memory(c);
    uint16_t item = N_ANY;
    c->containers++;
    for (size_t i = 0; i < n_prefix && st == MMRT_OK; i++) {
        const json_t *x = json_array_get(prefix, i);
        const size_t old = push_path(c, tuple_key);
        push_index(c, i);
        if (json_is_true(x))
            mine[i].node = N_ANY;
        else if (json_is_false(x))
            mine[i].node = MMRT_JSON_NONE;
        else
            st = compile(c, x, &mine[i].node);
        pop_path(c, old);
        /* An item that may not be there at all ends the array before it. */
        if (st == MMRT_OK && mine[i].node == MMRT_JSON_NONE && max > i)
            max = (uint32_t)i;
    }
    if (st == MMRT_OK)
        st = compile_member(c, v, rest_key, &item);
    c->containers--;
    if (st == MMRT_OK && item == MMRT_JSON_NONE && max > n_prefix)
        max = (uint32_t)n_prefix; /* no items past the tuple */
    if (st == MMRT_OK && min > max)
        st = fail(c, "'minItems' %u but no more than %u items are allowed: no document "
                  "satisfies it", min, max);
    /* uniqueItems: checked once unions are linked (check_unique), where the items' node is
     * known for what it is; its place is kept for the message. */
    const json_t *unique = json_object_get(v, "uniqueItems");
    uint32_t unique_id = 0;
    if (st == MMRT_OK && unique) {
        const size_t old = push_path(c, "uniqueItems");
        if (!json_is_boolean(unique))
            st = fail(c, "'uniqueItems' must be true or false, not %s",
                      mmrt_json_type_name(unique));
        else if (json_is_true(unique) && n_prefix)
            st = fail(c, "'uniqueItems' beside a tuple is not supported");
        else if (json_is_true(unique) &&
                 !grow((void **)&c->uniques, &c->cap_uniques, c->n_uniques + 1,
                       sizeof *c->uniques))
            st = no_memory(c);
        else if (json_is_true(unique) && !(c->uniques[c->n_uniques] = strdup(c->path)))
            st = no_memory(c);
        else if (json_is_true(unique))
            unique_id = ++c->n_uniques;
        pop_path(c, old);
    }
    const uint32_t first = c->s->n_props;
    if (st == MMRT_OK && n_prefix &&
        !grow((void **)&c->s->prop, &c->cap_props, first + (uint32_t)n_prefix,
              sizeof *c->s->prop))
        st = no_memory(c);
    if (st == MMRT_OK) {
        if (n_prefix)
            memcpy(c->s->prop + first, mine, n_prefix * sizeof *mine);
        c->s->n_props += (uint32_t)n_prefix;
        st = new_node(c, MMRT_JSON_ARRAY, out);
    }
    if (st == MMRT_OK) {
        struct mmrt_json_node *a = &c->s->node[*out];
        a->extra = item == MMRT_JSON_NONE ? N_ANY : item;
        a->first = first;
        a->n = (uint32_t)n_prefix;
        a->lit = unique_id;
        a->min = min;
        a->max = max;
    }
    free(mine);
    return st;
}

/* ---- a number's bounds as decimals ---- */

/* The most digits a bound has: 2^1023's 308, or 5e-324's 324. */
#define DECIMAL_MAX 400u

/* The digits of an integral x ≥ 2^53 (it is m·2^k), exactly: a big integer in base 10^9. */
static uint32_t integral_digits(double x, char d[DECIMAL_MAX])
{
    int e;
    uint64_t m = (uint64_t)ldexp(frexp(x, &e), 53); /* x = m·2^(e − 53), e − 53 ≥ 0 */
    uint32_t limb[40], n = 0;
    for (; m; m /= 1000000000u)
        limb[n++] = (uint32_t)(m % 1000000000u);
    for (int k = e - 53; k > 0; k -= 29) {
        const uint64_t f = 1ull << (k < 29 ? k : 29);
        uint64_t carry = 0;
        for (uint32_t i = 0; i < n; i++) {
            const uint64_t y = limb[i] * f + carry;
            limb[i] = (uint32_t)(y % 1000000000u);
            carry = y / 1000000000u;
        }
        for (; carry; carry /= 1000000000u)
            limb[n++] = (uint32_t)(carry % 1000000000u);
    }
    char all[DECIMAL_MAX + 16];
    int len = snprintf(all, sizeof all, "%u", limb[n - 1]);
    for (uint32_t i = n - 1; i-- > 0;)
        len += snprintf(all + len, sizeof all - (size_t)len, "%09u", limb[i]);
    memcpy(d, all, (size_t)len);
    return (uint32_t)len;
}

/* A bound x ≥ 0 (finite) as a decimal in mmrt_json_decimal's form; false out of memory.
 *
 * Below 2^53 it is the shortest decimal that reads back as x (0.1, not x's exact value
 * 0.1000000000000000055…): a validator reads a document's number with a fraction as the
 * nearest double, and rounding keeps order, so a decimal at least (at most) one that rounds
 * to x rounds to at least (at most) x; one without a fraction it may compare exactly, but
 * no integer lies between x and a decimal that rounds to it, where doubles have every
 * integer. From 2^53 on that last is not so, and the bound is x's own digits. */
static bool bound_decimal(double x, char d[DECIMAL_MAX], uint32_t *len, uint32_t *n_int)
{
    *len = *n_int = 0;
    if (!(x > 0))
        return true;
    if (x >= 9007199254740992.0) {
        *len = *n_int = integral_digits(x, d);
    } else {
        json_t *v = json_real(x);
        char *s = v ? shortest_real(v) : NULL;
        json_decref(v);
        if (!s)
            return false;
        /* jansson writes digits, an optional point and an optional exponent: "1e-05",
         * "250.5", "1.0", "5e-324". */
        const char *p = s;
        uint32_t n = 0;
        int point = -1;
        for (; (*p >= '0' && *p <= '9') || *p == '.'; p++) {
            if (*p == '.')
                point = (int)n;
            else if (n < DECIMAL_MAX / 2)
                d[n++] = *p;
        }
        const int exp = *p == 'e' || *p == 'E' ? atoi(p + 1) : 0;
        free(s);
        int whole = (point < 0 ? (int)n : point) + exp; /* digits before the point */
        if (whole < 0) { /* the fraction's leading zeros */
            memmove(d - whole, d, n);
            memset(d, '0', (size_t)-whole);
            n += (uint32_t)-whole;
            whole = 0;
        }
        uint32_t lead = 0; /* leading zeros of the integer part ("0.1") */
        while (lead < n && (int)lead < whole && d[lead] == '0')
            lead++;
        memmove(d, d + lead, n - lead);
        *len = n - lead;
        *n_int = (uint32_t)whole - lead;
    }
    while (*len > 0 && d[*len - 1] == '0') /* every digit past len is 0 */
        (*len)--;
    return true;
}

static mmrt_status put_decimal(struct compiler *c, double x, struct mmrt_json_decimal *d)
{
    char digits[DECIMAL_MAX];
    uint32_t len = 0, n_int = 0, off = 0;
    if (!bound_decimal(x, digits, &len, &n_int))
        return no_memory(c);
    mmrt_status st = add_text(c, digits, len, &off);
    if (st == MMRT_OK)
        *d = (struct mmrt_json_decimal){ .off = off, .len = len, .n_int = n_int };
    return st;
}

/* The two ranges of magnitudes (json_schema.h) of the numbers in [lo, hi] (infinite: no
 * bound): *first for those written without '-', *first + 1 for those with. */
static mmrt_status number_ranges(struct compiler *c, double lo, double hi, uint32_t *first)
{
    struct mmrt_json_schema *s = c->s;
    if (!grow((void **)&s->ranges, &c->cap_ranges, s->n_ranges + 2, sizeof *s->ranges))
        return no_memory(c);
    struct mmrt_json_range r[2] = { { .empty = hi < 0 }, { .empty = lo > 0 } };
    const double a[2] = { lo > 0 ? lo : 0, hi < 0 ? -hi : 0 }, b[2] = { hi, -lo };
    mmrt_status st = MMRT_OK;
    for (int i = 0; i < 2 && st == MMRT_OK; i++) {
        if (r[i].empty)
            continue;
        st = put_decimal(c, a[i], &r[i].a);
        r[i].b_finite = isfinite(b[i]);
        if (st == MMRT_OK && r[i].b_finite)
            st = put_decimal(c, b[i], &r[i].b);
    }
    if (st != MMRT_OK)
        return st;
    *first = s->n_ranges;
    s->ranges[s->n_ranges++] = r[0];
    s->ranges[s->n_ranges++] = r[1];
    return MMRT_OK;
}

static bool same_decimal(const struct mmrt_json_schema *s, const struct mmrt_json_decimal *x,
                         const struct mmrt_json_decimal *y)
{
    return x->len == y->len && x->n_int == y->n_int &&
           memcmp(s->text + x->off, s->text + y->off, x->len) == 0;
}

/* Whether two bounded number nodes' ranges are the same. */
static bool same_ranges(const struct mmrt_json_schema *s, uint32_t i, uint32_t j)
{
    for (int k = 0; k < 2; k++) {
        const struct mmrt_json_range *x = &s->ranges[i + k], *y = &s->ranges[j + k];
        if (x->empty != y->empty || x->b_finite != y->b_finite)
            return false;
        if (!x->empty && (!same_decimal(s, &x->a, &y->a) ||
                          (x->b_finite && !same_decimal(s, &x->b, &y->b))))
            return false;
    }
    return true;
}

/* ---- integer and number nodes ---- */

static bool is_lower(const char *key)
{
    return strcmp(key, "minimum") == 0 || strcmp(key, "exclusiveMinimum") == 0;
}

/* A bound of a number (minimum, ...) as a double held inclusively: *lo or *hi moved in, an
 * exclusive one to the next double inward (json_schema.h, struct mmrt_json_range). An integer
 * past 2^53 is refused: its double may lie beyond it. */
static mmrt_status real_bound(struct compiler *c, const json_t *v, const char *key, double *lo,
                              double *hi)
{
    const json_t *x = json_object_get(v, key);
    if (!x)
        return MMRT_OK;
    const size_t old = push_path(c, key);
    const bool lower = is_lower(key), exclusive = key[0] == 'e';
    mmrt_status st = MMRT_OK;
    double b = 0;
    if (!json_is_number(x)) {
        st = fail(c, "'%s' must be a number, not %s", key, mmrt_json_type_name(x));
    } else if (json_is_integer(x)) {
        const json_int_t i = json_integer_value(x);
        if (i > (1ll << 53) || i < -(1ll << 53))
            st = fail(c, "'%s' %lld is past 2^53, where a number's bound may not be a double: "
                      "bound an integer (\"type\": \"integer\") or give it in range", key,
                      (long long)i);
        b = (double)i;
    } else {
        b = json_real_value(x) + 0.0; /* -0 is 0 */
    }
    if (st == MMRT_OK && exclusive)
        b = nextafter(b, lower ? INFINITY : -INFINITY);
    if (st == MMRT_OK && isinf(b))
        st = fail(c, "'%s' leaves no finite number", key);
    if (st == MMRT_OK && lower && b > *lo)
        *lo = b;
    if (st == MMRT_OK && !lower && b < *hi)
        *hi = b;
    pop_path(c, old);
    return st;
}

/* A bound of v (minimum, ...) as the integers it allows: *lo or *hi moved in. Exclusive
 * ones are numbers (JSON Schema 6 on; the boolean form of draft 4 is refused by name). */
static mmrt_status integer_bound(struct compiler *c, const json_t *v, const char *key,
                                 int64_t *lo, int64_t *hi)
{
    const json_t *x = json_object_get(v, key);
    if (!x)
        return MMRT_OK;
    const size_t old = push_path(c, key);
    mmrt_status st = MMRT_OK;
    if (!json_is_number(x)) {
        st = fail(c, "'%s' must be a number, not %s", key, mmrt_json_type_name(x));
        pop_path(c, old);
        return st;
    }
    const bool lower = is_lower(key);
    const bool exclusive = key[0] == 'e';
    int64_t bound = 0;
    if (json_is_integer(x)) {
        const json_int_t i = json_integer_value(x);
        if (exclusive && i == (lower ? INT64_MAX : INT64_MIN))
            st = fail(c, "'%s' leaves no integer within int64", key);
        else
            bound = !exclusive ? i : lower ? i + 1 : i - 1;
    } else {
        /* The integers a real bound lets through: past its ceiling or floor. */
        const double r = json_real_value(x);
        const double f = lower ? (exclusive ? floor(r) + 1 : ceil(r))
                               : (exclusive ? ceil(r) - 1 : floor(r));
        if (f < -9.2e18 || f > 9.2e18) {
            if (lower != (f < 0))
                st = fail(c, "'%s' leaves no integer within int64", key);
            pop_path(c, old);
            return st; /* else it bounds nothing within int64 */
        }
        bound = (int64_t)f;
    }
    if (st == MMRT_OK && lower && bound > *lo)
        *lo = bound;
    if (st == MMRT_OK && !lower && bound < *hi)
        *hi = bound;
    pop_path(c, old);
    return st;
}

/* An integer's multipleOf: a positive integer (a real one the same, 3.0 as 3). Python's
 * jsonschema divides by a fractional one in floating point (3 / 0.1 is not 30), so those
 * are refused rather than guessed at. */
static mmrt_status multiple_of(struct compiler *c, const json_t *v, uint64_t *mul)
{
    const json_t *x = json_object_get(v, "multipleOf");
    *mul = 1;
    if (!x)
        return MMRT_OK;
    const size_t old = push_path(c, "multipleOf");
    mmrt_status st = MMRT_OK;
    if (json_is_integer(x) && json_integer_value(x) > 0) {
        *mul = (uint64_t)json_integer_value(x);
    } else if (json_is_real(x) && json_real_value(x) >= 1 && json_real_value(x) < 9.2e18 &&
               json_real_value(x) == floor(json_real_value(x))) {
        *mul = (uint64_t)json_real_value(x);
    } else if (json_is_number(x)) {
        st = fail(c, "'multipleOf' %g is not supported: mmrt holds integers to a positive "
                  "integer's multiples", json_number_value(x));
    } else {
        st = fail(c, "'multipleOf' must be a number, not %s", mmrt_json_type_name(x));
    }
    pop_path(c, old);
    return st;
}

/* The magnitude of a negative int64. */
static uint64_t magnitude(int64_t x)
{
    return (uint64_t)(-(x + 1)) + 1;
}

/* A number node: bounds make its magnitudes exact decimal ranges. */
static mmrt_status compile_real(struct compiler *c, const json_t *v, bool bounded,
                                uint16_t *out)
{
    if (json_object_get(v, "multipleOf")) {
        const size_t old = push_path(c, "multipleOf");
        mmrt_status st = fail(c, "'multipleOf' of a number is not supported: mmrt holds only "
                              "integers to it (\"type\": \"integer\")");
        pop_path(c, old);
        return st;
    }
    double lo = -INFINITY, hi = INFINITY;
    mmrt_status st = MMRT_OK;
    for (const char *const *b = bounds; *b && st == MMRT_OK; b++)
        st = real_bound(c, v, *b, &lo, &hi);
    if (st == MMRT_OK && lo > hi)
        st = fail(c, "no number lies between the bounds: no document satisfies them");
    uint32_t first = 0;
    if (st == MMRT_OK && bounded)
        st = number_ranges(c, lo, hi, &first);
    if (st == MMRT_OK)
        st = new_node(c, MMRT_JSON_NUMBER, out);
    if (st == MMRT_OK && bounded) {
        c->s->node[*out].n = 1;
        c->s->node[*out].lit = first;
    }
    return st;
}

/* An integer node: bounds and multipleOf hold it within int64. */
static mmrt_status compile_integer(struct compiler *c, const json_t *v, bool bounded,
                                   uint16_t *out)
{
    int64_t lo = INT64_MIN, hi = INT64_MAX;
    uint64_t mul = 1;
    mmrt_status st = MMRT_OK;
    for (const char *const *b = bounds; *b && st == MMRT_OK; b++)
        st = integer_bound(c, v, *b, &lo, &hi);
    if (st == MMRT_OK && lo > hi)
        st = fail(c, "no integer lies between the bounds: no document satisfies them");
    if (st == MMRT_OK)
        st = multiple_of(c, v, &mul);
    if (st == MMRT_OK && !(lo <= 0 && hi >= 0) &&
        !(lo > 0 ? mmrt_json_has_multiple((uint64_t)lo, (uint64_t)hi, mul)
                 : mmrt_json_has_multiple(magnitude(hi), magnitude(lo), mul)))
        st = fail(c, "no multiple of %llu lies between the bounds: no document satisfies "
                  "them", (unsigned long long)mul);
    if (st == MMRT_OK)
        st = new_node(c, MMRT_JSON_INTEGER, out);
    if (st == MMRT_OK) {
        struct mmrt_json_node *x = &c->s->node[*out];
        x->imin = lo;
        x->imax = hi;
        x->mul = mul;
        x->n = bounded || mul > 1;
    }
    return st;
}

/* An integer or number node. */
static mmrt_status compile_number(struct compiler *c, const json_t *v, unsigned mask,
                                  uint16_t *out)
{
    bool bounded = false;
    for (const char *const *b = bounds; *b && !bounded; b++)
        bounded = json_object_get(v, *b) != NULL;
    return mask & T_NUMBER ? compile_real(c, v, bounded, out)
                           : compile_integer(c, v, bounded, out);
}

/* A string node: its length bounds and its pattern. */
static mmrt_status compile_string(struct compiler *c, const json_t *v, uint16_t *out)
{
    uint32_t min, max;
    mmrt_status st = min_max(c, v, "minLength", "maxLength", &min, &max);
    const json_t *pat = json_object_get(v, "pattern");
    uint32_t id = 0;
    if (st == MMRT_OK && pat) {
        const size_t old = push_path(c, "pattern");
        struct mmrt_json_pattern compiled;
        struct mmrt_error e = { 0 };
        if (!json_is_string(pat)) {
            st = fail(c, "'pattern' must be a string, not %s", mmrt_json_type_name(pat));
        } else if ((st = mmrt_json_pattern_compile(json_string_value(pat),
                                                   json_string_length(pat), &compiled, &e)) !=
                       MMRT_OK ||
                   (st = mmrt_json_pattern_lengths(
                        &compiled, min,
                        max == MMRT_JSON_UNBOUNDED ? MMRT_JSON_PATTERN_UNBOUNDED : max,
                        &c->windows, &e)) != MMRT_OK) {
            mmrt_json_pattern_free(&compiled);
            st = st == MMRT_ERR_NO_MEMORY ? no_memory(c)
                                          : (st == MMRT_ERR_LIMIT ? fail_limit : fail)(
                                                c, "%s", e.msg);
        } else if (!grow((void **)&c->s->patterns, &c->cap_patterns, c->s->n_patterns + 1,
                         sizeof *c->s->patterns)) {
            mmrt_json_pattern_free(&compiled);
            st = no_memory(c);
        } else {
            id = c->s->n_patterns;
            c->s->patterns[c->s->n_patterns++] = compiled;
        }
        pop_path(c, old);
    }
    if (st == MMRT_OK)
        st = new_node(c, MMRT_JSON_STRING, out);
    if (st == MMRT_OK) {
        struct mmrt_json_node *x = &c->s->node[*out];
        x->min = min;
        x->max = max;
        x->n = pat != NULL;
        x->lit = id;
    }
    return st;
}

/* The types named by v's "type", or inferred from the keywords present when it has none
 * (JSON Schema would allow any type there; mmrt writes the one the keywords are about). */
static mmrt_status types_of(struct compiler *c, const json_t *v, unsigned *mask)
{
    const json_t *t = json_object_get(v, "type");
    *mask = 0;
    if (!t) {
        if (json_object_get(v, "properties") || json_object_get(v, "required") ||
            json_object_get(v, "additionalProperties") || json_object_get(v, "minProperties") ||
            json_object_get(v, "maxProperties"))
            *mask |= T_OBJECT;
        if (json_object_get(v, "items") || json_object_get(v, "minItems") ||
            json_object_get(v, "maxItems") || json_object_get(v, "prefixItems") ||
            json_object_get(v, "uniqueItems"))
            *mask |= T_ARRAY;
        if (json_object_get(v, "minLength") || json_object_get(v, "maxLength") ||
            json_object_get(v, "pattern"))
            *mask |= T_STRING;
        /* Bounds make a number; multipleOf, which mmrt holds integers only to, an integer. */
        const bool multiple = json_object_get(v, "multipleOf") != NULL;
        if (multiple)
            *mask |= T_INTEGER;
        for (const char *const *b = bounds; *b; b++)
            if (json_object_get(v, *b))
                *mask |= multiple ? T_INTEGER : T_NUMBER;
        if (!*mask)
            *mask = T_ALL;
        return MMRT_OK;
    }
    const size_t old = push_path(c, "type");
    const size_t n = json_is_array(t) ? json_array_size(t) : 1;
    mmrt_status st = MMRT_OK;
    if (json_is_array(t) && n == 0)
        st = fail(c, "'type' lists no type: no document satisfies it");
    for (size_t i = 0; i < n && st == MMRT_OK; i++) {
        const json_t *x = json_is_array(t) ? json_array_get(t, i) : t;
        if (!json_is_string(x)) {
            st = fail(c, "'type' must be a type name or a list of them, not %s",
                      mmrt_json_type_name(x));
            break;
        }
        size_t j = 0;
        while (j < sizeof type_names / sizeof *type_names &&
               strcmp(type_names[j].name, json_string_value(x)) != 0)
            j++;
        if (j == sizeof type_names / sizeof *type_names) {
            char q[48];
            st = fail(c, "'%s' is not a JSON Schema type (object, array, string, integer, "
                      "number, boolean, null)", quote(q, sizeof q, json_string_value(x)));
        } else {
            *mask |= type_names[j].bit;
        }
    }
    pop_path(c, old);
    return st;
}

/* v's value by its types (and enum or const, when it has one). */
static mmrt_status compile_typed(struct compiler *c, const json_t *v, uint16_t *out)
{
    unsigned mask;
    mmrt_status st = types_of(c, v, &mask);
    if (st != MMRT_OK)
        return st;
    const json_t *en = json_object_get(v, "enum"), *cn = json_object_get(v, "const");
    if (en && cn)
        return fail(c, "'enum' beside 'const' is not supported: give one");
    if (en || cn) {
        const char *key = en ? "enum" : "const";
        /* Only the type filters the values here; another assertion beside them would need
         * each value checked against it. */
        for (const char *const *h = handled; *h; h++)
            if (strcmp(*h, "type") != 0 && strcmp(*h, key) != 0 && json_object_get(v, *h))
                return fail(c, "'%s' beside '%s' is not supported: list only the values that "
                            "satisfy it", key, *h);
        const size_t old = push_path(c, key);
        json_t *one = NULL;
        if (en && !json_is_array(en)) {
            st = fail(c, "'enum' must be a list, not %s", mmrt_json_type_name(en));
        } else if (cn) {
            one = json_array();
            if (!one || json_array_append(one, (json_t *)cn) != 0)
                st = no_memory(c);
        }
        if (st == MMRT_OK)
            st = compile_literals(c, en ? en : one, key, mask, out);
        json_decref(one);
        pop_path(c, old);
        return st;
    }
    if (mask == T_ALL) {
        *out = N_ANY;
        return MMRT_OK;
    }
    if (mask & T_NUMBER)
        mask &= ~(unsigned)T_INTEGER; /* a number may be an integer */
    uint16_t alts[7];
    uint32_t n = 0;
    static const char *const booleans[] = { "false", "true" }, *const null[] = { "null" };
    if ((mask & T_OBJECT) && st == MMRT_OK)
        st = compile_object(c, v, &alts[n++]);
    if ((mask & T_ARRAY) && st == MMRT_OK)
        st = compile_array(c, v, &alts[n++]);
    if ((mask & T_STRING) && st == MMRT_OK)
        st = compile_string(c, v, &alts[n++]);
    if ((mask & (T_INTEGER | T_NUMBER)) && st == MMRT_OK)
        st = compile_number(c, v, mask, &alts[n++]);
    if ((mask & T_BOOLEAN) && st == MMRT_OK)
        st = literal_node(c, booleans, 2, &alts[n++]);
    if ((mask & T_NULL) && st == MMRT_OK)
        st = literal_node(c, null, 1, &alts[n++]);
    if (st != MMRT_OK)
        return st;
    if (n == 1) {
        *out = alts[0];
        return MMRT_OK;
    }
    const size_t old = push_path(c, "type");
    st = new_union(c, alts, n, false, out);
    pop_path(c, old);
    return st;
}

/* Resolves a JSON pointer fragment ("#", "#/$defs/Name", any path into the schema). */
static const json_t *resolve(const json_t *root, const char *ref)
{
    if (ref[0] != '#')
        return NULL;
    const json_t *v = root;
    const char *p = ref + 1;
    while (*p) {
        if (*p != '/')
            return NULL;
        p++;
        char seg[256];
        size_t n = 0;
        while (*p && *p != '/') {
            char ch = *p++;
            if (ch == '~') {
                if (*p != '0' && *p != '1')
                    return NULL;
                ch = *p++ == '0' ? '~' : '/';
            }
            if (n + 1 >= sizeof seg)
                return NULL;
            seg[n++] = ch;
        }
        seg[n] = '\0';
        if (json_is_object(v)) {
            v = json_object_get(v, seg);
        } else if (json_is_array(v)) {
            char *end;
            const unsigned long i = strtoul(seg, &end, 10);
            if (!n || *end || (n > 1 && seg[0] == '0'))
                return NULL;
            v = json_array_get(v, i);
        } else {
            return NULL;
        }
        if (!v)
            return NULL;
    }
    return v;
}

/* A subschema reached by $ref (or the root): made once, its node reserved before its parts
 * so that a reference back to it inside a container points at it. */
static mmrt_status compile_target(struct compiler *c, const json_t *target, uint16_t *out)
{
    for (uint32_t i = 0; i < c->n_memo; i++) {
        if (c->memo[i].target != target)
            continue;
        if (!c->memo[i].done && c->memo[i].containers == c->containers)
            return fail(c, "'$ref' leads back to itself with no object or array between: no "
                        "document is finite");
        *out = c->memo[i].node;
        return MMRT_OK;
    }
    if (json_is_true(target) || (json_is_object(target) && json_object_size(target) == 0)) {
        *out = N_ANY;
        return MMRT_OK;
    }
    /* Each target made inside another deepens the C stack: a hostile chain of references
     * is refused before it runs out. */
    if (c->refs > MMRT_JSON_SCHEMA_MAX_REFS) /* the root is one of them */
        return fail_limit(c, "'$ref' targets nest more than %u deep", MMRT_JSON_SCHEMA_MAX_REFS);
    if (!grow((void **)&c->memo, &c->cap_memo, c->n_memo + 1, sizeof *c->memo))
        return no_memory(c);
    uint16_t slot;
    mmrt_status st = new_node(c, MMRT_JSON_UNION, &slot);
    if (st != MMRT_OK)
        return st;
    const uint32_t m = c->n_memo++;
    c->memo[m] = (struct ref_memo){ .target = target, .node = slot, .containers = c->containers };
    uint16_t made;
    c->refs++;
    st = compile(c, target, &made);
    c->refs--;
    if (st != MMRT_OK)
        return st;
    /* Nodes are values: the slot becomes a copy of what was made (a union's copy is
     * resolved in pass two like the union itself). */
    c->s->node[slot] = c->s->node[made];
    c->memo[m].done = true;
    *out = slot;
    return MMRT_OK;
}

static mmrt_status compile(struct compiler *c, const json_t *v, uint16_t *out)
{
    if (json_is_true(v)) {
        *out = N_ANY;
        return MMRT_OK;
    }
    if (json_is_false(v))
        return fail(c, "the schema false admits no value");
    if (!json_is_object(v))
        return fail(c, "a schema is an object or a boolean, not %s", mmrt_json_type_name(v));
    const char *k;
    const json_t *x;
    const char *assertion = NULL; /* one handled keyword present, for "beside" messages */
    unsigned n_handled = 0;
    json_object_foreach((json_t *)v, k, x) {
        if (listed(refused, k)) {
            const size_t old = push_path(c, k);
            mmrt_status st = fail(c, "keyword '%s' is not supported: mmrt cannot hold an "
                                  "answer to it", k);
            pop_path(c, old);
            return st;
        }
        if (listed(handled, k)) {
            n_handled++;
            if (strcmp(k, "$ref") != 0 && strcmp(k, "anyOf") != 0 &&
                strcmp(k, "oneOf") != 0 && strcmp(k, "allOf") != 0)
                assertion = k;
        }
    }
    static const char *const combinators[] = { "$ref", "allOf", "anyOf", "oneOf" };
    for (size_t i = 0; i < sizeof combinators / sizeof *combinators; i++) {
        const char *kw = combinators[i];
        const json_t *y = json_object_get(v, kw);
        if (!y)
            continue;
        if (n_handled > 1) {
            const char *other = assertion;
            for (size_t j = 0; !other && j < sizeof combinators / sizeof *combinators; j++)
                if (j != i && json_object_get(v, combinators[j]))
                    other = combinators[j];
            return fail(c, "'%s' beside '%s' is not supported: put the keywords in one "
                        "subschema", kw, other ? other : "?");
        }
        const size_t old = push_path(c, kw);
        mmrt_status st = MMRT_OK;
        if (i == 0) {
            if (!json_is_string(y)) {
                st = fail(c, "'$ref' must be a string, not %s", mmrt_json_type_name(y));
            } else {
                const json_t *target = resolve(c->root, json_string_value(y));
                if (!target) {
                    char q[96];
                    st = fail(c, "'$ref' '%s' does not point into this schema (mmrt follows "
                              "'#' and '#/...' pointers only)",
                              quote(q, sizeof q, json_string_value(y)));
                } else {
                    /* Messages inside the target name its own place. */
                    char saved[sizeof c->path];
                    const size_t saved_len = c->path_len;
                    memcpy(saved, c->path, sizeof saved);
                    c->path_len = 0;
                    c->path[0] = '\0';
                    const char *ptr = json_string_value(y) + 1;
                    if (strlen(ptr) < sizeof c->path) {
                        memcpy(c->path, ptr, strlen(ptr) + 1);
                        c->path_len = strlen(ptr);
                    }
                    st = compile_target(c, target, out);
                    memcpy(c->path, saved, sizeof saved);
                    c->path_len = saved_len;
                }
            }
        } else if (!json_is_array(y) || json_array_size(y) == 0) {
            st = fail(c, "'%s' must be a non-empty list of schemas", kw);
        } else if (i == 1) {
            if (json_array_size(y) != 1) {
                st = fail(c, "'allOf' of %zu schemas is not supported: give one",
                          json_array_size(y));
            } else {
                push_index(c, 0);
                st = compile(c, json_array_get(y, 0), out);
            }
        } else {
            const size_t n = json_array_size(y);
            uint16_t *alts = malloc(n * sizeof *alts);
            if (!alts)
                st = no_memory(c);
            for (size_t j = 0; j < n && st == MMRT_OK; j++) {
                const size_t o = push_index(c, j);
                st = compile(c, json_array_get(y, j), &alts[j]);
                pop_path(c, o);
            }
            if (st == MMRT_OK)
                st = n == 1 ? (*out = alts[0], MMRT_OK)
                            : new_union(c, alts, (uint32_t)n, i == 3, out);
            free(alts);
        }
        pop_path(c, old);
        return st;
    }
    return compile_typed(c, v, out);
}

/* ---- pass two: unions by first byte, and only finite documents ---- */

static const char *const class_names[MMRT_JSON_CLASSES] = {
    "an object", "an array", "a string", "a number", "true", "false", "null",
};

static int class_of_byte(char b)
{
    switch (b) {
    case '{': return MMRT_JSON_CLASS_OBJECT;
    case '[': return MMRT_JSON_CLASS_ARRAY;
    case '"': return MMRT_JSON_CLASS_STRING;
    case 't': return MMRT_JSON_CLASS_TRUE;
    case 'f': return MMRT_JSON_CLASS_FALSE;
    case 'n': return MMRT_JSON_CLASS_NULL;
    default: return MMRT_JSON_CLASS_NUMBER; /* '-' or a digit: literals are valid JSON */
    }
}

/* Claims class k of table for node x; a second claimant is refused, but for a number over an
 * integer under anyOf (any document of the integer is one of the number). */
static mmrt_status claim(struct compiler *c, const struct union_info *u, uint16_t *table,
                         int k, uint16_t x)
{
    const struct mmrt_json_node *node = c->s->node;
    if (table[k] == MMRT_JSON_NONE || table[k] == x) {
        table[k] = x;
        return MMRT_OK;
    }
    const uint8_t a = node[table[k]].kind, b = node[x].kind;
    if (!u->one_of && a == MMRT_JSON_INTEGER && b == MMRT_JSON_NUMBER) {
        table[k] = x;
        return MMRT_OK;
    }
    if (!u->one_of && a == MMRT_JSON_NUMBER && b == MMRT_JSON_INTEGER)
        return MMRT_OK;
    return failv_path(c, u->path, "two alternatives both begin %s: mmrt tells alternatives "
                      "apart by a value's first byte", class_names[k]);
}

/* Whether a node is any value: N_ANY or a copy of it (a union whose table is made, with no
 * alternatives to link). */
static bool is_any(const struct mmrt_json_node *x)
{
    return x->kind == MMRT_JSON_UNION && x->n == 0;
}

/* Whether two value nodes admit the same values for certain: the same node, or two scalar
 * nodes with the same bounds. */
static bool same_value(const struct mmrt_json_schema *s, uint16_t a, uint16_t b)
{
    if (a == b)
        return true;
    const struct mmrt_json_node *x = &s->node[a], *y = &s->node[b];
    const bool scalar = x->kind == MMRT_JSON_STRING || x->kind == MMRT_JSON_NUMBER ||
                        x->kind == MMRT_JSON_INTEGER;
    if (!scalar || x->kind != y->kind || x->min != y->min || x->max != y->max ||
        x->n != y->n || x->imin != y->imin || x->imax != y->imax || x->mul != y->mul)
        return false;
    if (x->n == 0)
        return true;
    return x->kind == MMRT_JSON_NUMBER ? same_ranges(s, x->lit, y->lit) : x->lit == y->lit;
}

/* Whether a literal's text is the only text of its value: a string (written with the
 * fewest escapes), true, false, null or an integer; not a real (1.0 is 1) nor a container
 * (whose keys may come in another order). */
static bool canonical_literal(const struct mmrt_json_schema *s, const struct mmrt_json_literal *l)
{
    const char *t = s->text + l->off;
    if (l->len == 0 || t[0] == '{' || t[0] == '[')
        return false;
    if (t[0] != '-' && (t[0] < '0' || t[0] > '9'))
        return true;
    for (uint32_t i = 0; i < l->len; i++)
        if (t[i] == '.' || t[i] == 'e' || t[i] == 'E')
            return false;
    return true;
}

/* Whether object alternatives (k of them, their props laid out as build_objects lays them
 * from first, g keys) have a discriminator: a key each requires whose values are literals
 * of single texts, no text in two alternatives. A document then satisfies at most one
 * alternative, as oneOf asks. */
static bool discriminated(const struct mmrt_json_schema *s, uint32_t first, uint32_t g,
                          uint32_t k)
{
    for (uint32_t r = 0; r < g; r++) {
        bool ok = true;
        for (uint32_t a = 0; a < k && ok; a++) {
            const struct mmrt_json_prop *p = &s->prop[first + g + a * g + r];
            ok = p->node != MMRT_JSON_NONE && p->required &&
                 s->node[p->node].kind == MMRT_JSON_LITERALS;
            for (uint32_t i = 0; ok && i < s->node[p->node].n; i++)
                ok = canonical_literal(s, &s->lit[s->node[p->node].lit + i]);
        }
        for (uint32_t a = 0; a < k && ok; a++)
            for (uint32_t b = a + 1; b < k && ok; b++) {
                const struct mmrt_json_node *x = &s->node[s->prop[first + g + a * g + r].node];
                const struct mmrt_json_node *y = &s->node[s->prop[first + g + b * g + r].node];
                for (uint32_t i = 0; ok && i < x->n; i++)
                    for (uint32_t j = 0; ok && j < y->n; j++)
                        ok = cmp_literal(s, &s->lit[x->lit + i], &s->lit[y->lit + j]) != 0;
            }
        if (ok)
            return true;
    }
    return false;
}

/* Whether two literal nodes share no literal text. */
static bool disjoint_literals(const struct mmrt_json_schema *s, const struct mmrt_json_node *x,
                              const struct mmrt_json_node *y)
{
    for (uint32_t i = 0; i < x->n; i++)
        for (uint32_t j = 0; j < y->n; j++)
            if (cmp_literal(s, &s->lit[x->lit + i], &s->lit[y->lit + j]) == 0)
                return false;
    return true;
}

/* Whether the object alternatives (k of them, laid out from first with g keys) that give key
 * r value schemas that differ are told apart before it: by a key d earlier in the order that
 * each of them requires, whose literal values no two of them that differ at r share. Once
 * d's value is read, the live alternatives then agree on r's schema. */
static bool told_apart_before(const struct mmrt_json_schema *s, uint32_t first, uint32_t g,
                              uint32_t k, uint32_t r)
{
#define ROW(a, j) (&s->prop[first + g + (a) * g + (j)])
    for (uint32_t d = 0; d < r; d++) {
        bool ok = true;
        for (uint32_t a = 0; a < k && ok; a++)
            for (uint32_t b = a + 1; b < k && ok; b++) {
                const uint16_t xa = ROW(a, r)->node, xb = ROW(b, r)->node;
                if (xa == MMRT_JSON_NONE || xb == MMRT_JSON_NONE || same_value(s, xa, xb))
                    continue;
                const struct mmrt_json_prop *da = ROW(a, d), *db = ROW(b, d);
                ok = da->required && db->required && da->node != MMRT_JSON_NONE &&
                     db->node != MMRT_JSON_NONE &&
                     s->node[da->node].kind == MMRT_JSON_LITERALS &&
                     s->node[db->node].kind == MMRT_JSON_LITERALS &&
                     disjoint_literals(s, &s->node[da->node], &s->node[db->node]);
            }
        if (ok)
            return true;
    }
#undef ROW
    return false;
}

/* Object alternatives objs[0, k) of a union as one MMRT_JSON_OBJECTS node (json_schema.h):
 * their keys put in one order that keeps each alternative's (Kahn's algorithm over "comes
 * before" in some alternative, ties by first appearance), each key's value node shared or
 * its literals tagged with the alternatives they belong to. */
static mmrt_status build_objects(struct compiler *c, const struct union_info *u,
                                 const uint16_t *objs, uint32_t k, uint16_t *out)
{
    struct mmrt_json_schema *s = c->s;
    if (k > 16)
        return failv_path(c, u->path, "%u object alternatives: mmrt tells at most 16 apart",
                          k);
    uint32_t total = 0;
    for (uint32_t a = 0; a < k; a++) {
        if (s->node[objs[a]].n == 0)
            return failv_path(c, u->path, "two alternatives both begin an object and one "
                              "lists no keys: mmrt tells objects apart by their keys");
        total += s->node[objs[a]].n;
    }
    /* key[a][p]: the literal of alternative a's property p; keys the distinct ones. */
    uint32_t *of = malloc(total * sizeof *of);      /* per (a, p): its index among keys */
    uint32_t *keys = malloc(total * sizeof *keys);  /* a literal index each */
    uint32_t *indeg = calloc(total, sizeof *indeg), *order = malloc(total * sizeof *order);
    uint8_t *edge = calloc((size_t)total * total, 1);
    uint32_t *base = malloc(k * sizeof *base);
    mmrt_status st = of && keys && indeg && order && edge && base ? MMRT_OK : no_memory(c);
    uint32_t g = 0;
    for (uint32_t a = 0, at = 0; a < k && st == MMRT_OK; a++) {
        const struct mmrt_json_node *o = &s->node[objs[a]];
        base[a] = at;
        for (uint32_t i = 0; i < o->n; i++) {
            const uint32_t li = o->lit + i, p = s->lit[li].prop;
            uint32_t j = 0;
            while (j < g && cmp_literal(s, &s->lit[keys[j]], &s->lit[li]) != 0)
                j++;
            if (j == g)
                keys[g++] = li;
            of[at + p] = j;
        }
        for (uint32_t p = 1; p < o->n; p++) {
            const uint32_t x = of[at + p - 1], y = of[at + p];
            if (!edge[(size_t)x * total + y]) {
                edge[(size_t)x * total + y] = 1;
                indeg[y]++;
            }
        }
        at += o->n;
    }
    uint32_t placed = 0;
    while (st == MMRT_OK && placed < g) {
        uint32_t j = 0;
        while (j < g && indeg[j] != 0)
            j++;
        /* Alternatives that order shared keys differently leave no order keeping them all:
         * the first key not yet placed goes next (a document's key order is no part of its
         * validity; the schema's is only what answers look like where it can be kept). */
        for (j = j < g ? j : 0; indeg[j] == UINT32_MAX; j++) {
        }
        indeg[j] = UINT32_MAX; /* placed */
        order[placed++] = j;
        for (uint32_t y = 0; y < g; y++)
            if (edge[(size_t)j * total + y] && indeg[y] != UINT32_MAX)
                indeg[y]--;
    }
    /* rank[key]: its place in the order. */
    uint32_t *rank = indeg;
    for (uint32_t r = 0; st == MMRT_OK && r < g; r++)
        rank[order[r]] = r;
    const uint32_t first = s->n_props, n_props = g + k * g;
    if (st == MMRT_OK && n_props >= UINT16_MAX)
        st = failv_path(c, u->path, "object alternatives with too many keys");
    if (st == MMRT_OK && !grow((void **)&s->prop, &c->cap_props, first + n_props, sizeof *s->prop))
        st = no_memory(c);
    if (st == MMRT_OK) {
        for (uint32_t i = 0; i < n_props; i++)
            s->prop[first + i] = (struct mmrt_json_prop){ .node = MMRT_JSON_NONE };
        s->n_props += n_props;
        for (uint32_t a = 0; a < k; a++) {
            const struct mmrt_json_node *o = &s->node[objs[a]];
            for (uint32_t p = 0; p < o->n; p++)
                s->prop[first + g + a * g + rank[of[base[a] + p]]] = s->prop[o->first + p];
        }
    }
    if (st == MMRT_OK && u->one_of && !discriminated(s, first, g, k))
        st = failv_path(c, u->path, "two alternatives both begin an object: under oneOf mmrt "
                        "needs a key every one of them requires, with literal values no two "
                        "share (a discriminator), so that only one matches (anyOf needs none)");
    /* Each key's value: one node the alternatives share, or their literals tagged. */
    for (uint32_t r = 0; st == MMRT_OK && r < g; r++) {
        uint16_t one = MMRT_JSON_NONE;
        bool same = true, literals = true;
        for (uint32_t a = 0; a < k; a++) {
            const uint16_t v = s->prop[first + g + a * g + r].node;
            if (v == MMRT_JSON_NONE)
                continue;
            literals = literals && s->node[v].kind == MMRT_JSON_LITERALS;
            same = same && (one == MMRT_JSON_NONE || same_value(s, one, v));
            if (one == MMRT_JSON_NONE)
                one = v;
        }
        if (same) {
            s->prop[first + r].node = one;
            continue;
        }
        if (!literals && told_apart_before(s, first, g, k, r)) {
            s->prop[first + r].node = one;
            s->prop[first + r].per_alternative = 1;
            continue;
        }
        if (!literals) {
            char key[64], q[64];
            const struct mmrt_json_literal *kl = &s->lit[keys[order[r]]];
            snprintf(key, sizeof key, "%.*s", (int)(kl->len < 60 ? kl->len : 60),
                     s->text + kl->off);
            st = failv_path(c, u->path, "object alternatives give key %s different values "
                            "that are not literals, and no key before it tells those "
                            "alternatives apart: mmrt tells them apart by literal values",
                            quote(q, sizeof q, key));
            break;
        }
        const uint32_t at = s->n_lits;
        for (uint32_t a = 0; a < k && st == MMRT_OK; a++) {
            const uint16_t v = s->prop[first + g + a * g + r].node;
            for (uint32_t i = 0; v != MMRT_JSON_NONE && i < s->node[v].n && st == MMRT_OK; i++)
                st = dup_literal(c, s->node[v].lit + i, 1u << a);
        }
        uint16_t tagged = MMRT_JSON_NONE;
        uint32_t kept = 0;
        if (st == MMRT_OK)
            st = literals_node(c, at, &tagged, &kept);
        if (st == MMRT_OK) {
            s->node[tagged].extra = 1;
            s->prop[first + r].node = tagged;
        }
    }
    const uint32_t lit = s->n_lits;
    for (uint32_t r = 0; st == MMRT_OK && r < g; r++)
        st = dup_literal(c, keys[order[r]], r);
    uint32_t kept = 0;
    if (st == MMRT_OK)
        st = sort_literals(c, lit, &kept);
    if (st == MMRT_OK)
        st = new_node(c, MMRT_JSON_OBJECTS, out);
    if (st == MMRT_OK) {
        struct mmrt_json_node *x = &s->node[*out];
        x->first = first;
        x->n = g;
        x->lit = lit;
        x->extra = (uint16_t)k;
    }
    free(of);
    free(keys);
    free(indeg);
    free(order);
    free(edge);
    free(base);
    return st;
}

/* Arrays with uniqueItems (every node, $ref slots' copies included): their items must be the
 * values of an enum, up to 16 with one text each, so that the open array's frame can mark
 * which came; at most that many items. */
static mmrt_status check_unique(struct compiler *c)
{
    struct mmrt_json_schema *s = c->s;
    for (uint32_t i = 0; i < s->n_nodes; i++) {
        struct mmrt_json_node *x = &s->node[i];
        if (x->kind != MMRT_JSON_ARRAY || x->lit == 0)
            continue;
        const char *path = c->uniques[x->lit - 1];
        const struct mmrt_json_node *it = &s->node[x->extra];
        bool ok = it->kind == MMRT_JSON_LITERALS && it->extra != 1 && it->n <= 16;
        for (uint32_t j = 0; ok && j < it->n; j++)
            ok = canonical_literal(s, &s->lit[it->lit + j]);
        if (!ok)
            return failv_path(c, path, "'uniqueItems' is supported over the values of an enum "
                              "only (up to 16 strings, integers, true, false or null): mmrt "
                              "marks which came");
        if (x->min > it->n)
            return failv_path(c, path, "'minItems' %u but the items have %u distinct values: "
                              "no document satisfies it", x->min, it->n);
        if (x->max > it->n)
            x->max = it->n;
    }
    return MMRT_OK;
}

/* Gives union u its table by first byte: alternatives that are unions give their tables,
 * literal alternatives merge into one node. A union left with one node becomes a copy of it;
 * one with the any-value node among its alternatives becomes any value. state: 0 not yet,
 * 1 being linked, 2 done. */
static mmrt_status link_union(struct compiler *c, uint16_t u, uint8_t *state)
{
    struct mmrt_json_schema *s = c->s;
    const struct union_info *info = &c->unions[s->node[u].lit];
    const uint32_t first = s->node[u].first, n = s->node[u].n;
    uint16_t table[MMRT_JSON_CLASSES];
    for (int k = 0; k < MMRT_JSON_CLASSES; k++)
        table[k] = MMRT_JSON_NONE;
    state[u] = 1;
    mmrt_status st = MMRT_OK;
    /* Literal nodes met, merged below (at most one per alternative); object nodes too. */
    uint16_t *lits = malloc((n + 1) * MMRT_JSON_CLASSES * sizeof *lits);
    uint16_t *objs = malloc((n + 1) * sizeof *objs);
    uint32_t n_lits = 0, n_objs = 0;
    if (!lits || !objs) {
        free(lits);
        free(objs);
        return no_memory(c);
    }
    bool any = false;
    for (uint32_t i = 0; i < n && st == MMRT_OK && !any; i++) {
        const uint16_t a = c->alts[first + i];
        if (is_any(&s->node[a])) {
            any = true;
            break;
        }
        if (s->node[a].kind == MMRT_JSON_UNION) {
            if (state[a] == 1) {
                st = failv_path(c, info->path, "an alternative leads back to this one with no "
                                "object or array between: no document is finite");
                break;
            }
            if (state[a] == 0 && (st = link_union(c, a, state)) != MMRT_OK)
                break;
        }
        const struct mmrt_json_node *x = &s->node[a];
        if (x->kind == MMRT_JSON_UNION) {
            for (int k = 0; k < MMRT_JSON_CLASSES && st == MMRT_OK; k++) {
                const uint16_t y = x->alt[k];
                if (y == MMRT_JSON_NONE)
                    continue;
                if (s->node[y].kind == MMRT_JSON_LITERALS)
                    lits[n_lits++] = y;
                else if (s->node[y].kind == MMRT_JSON_OBJECT && s->node[y].n > 0)
                    objs[n_objs++] = y;
                else
                    st = claim(c, info, table, k, y);
            }
        } else if (x->kind == MMRT_JSON_LITERALS) {
            lits[n_lits++] = a;
        } else if (x->kind == MMRT_JSON_OBJECT && x->n > 0) {
            objs[n_objs++] = a;
        } else {
            const int k = x->kind == MMRT_JSON_OBJECT || x->kind == MMRT_JSON_OBJECTS
                              ? MMRT_JSON_CLASS_OBJECT
                        : x->kind == MMRT_JSON_ARRAY   ? MMRT_JSON_CLASS_ARRAY
                        : x->kind == MMRT_JSON_STRING  ? MMRT_JSON_CLASS_STRING
                                                       : MMRT_JSON_CLASS_NUMBER;
            st = claim(c, info, table, k, a);
        }
    }
    /* Repeats (a node met twice through nested unions) merge as one. */
    uint32_t distinct = 0;
    for (uint32_t i = 0; i < n_lits; i++) {
        uint32_t j = 0;
        while (j < distinct && lits[j] != lits[i])
            j++;
        if (j == distinct)
            lits[distinct++] = lits[i];
    }
    uint16_t merged = distinct == 1 ? lits[0] : MMRT_JSON_NONE;
    if (st == MMRT_OK && !any && distinct > 1) {
        const uint32_t at = s->n_lits;
        for (uint32_t i = 0; i < distinct && st == MMRT_OK; i++)
            for (uint32_t j = 0; j < s->node[lits[i]].n && st == MMRT_OK; j++)
                st = dup_literal(c, s->node[lits[i]].lit + j, 0);
        uint32_t kept = 0;
        if (st == MMRT_OK)
            st = literals_node(c, at, &merged, &kept);
    }
    if (st == MMRT_OK && !any && merged != MMRT_JSON_NONE) {
        const struct mmrt_json_node *m = &s->node[merged];
        for (uint32_t j = 0; j < m->n && st == MMRT_OK; j++)
            st = claim(c, info, table, class_of_byte(s->text[s->lit[m->lit + j].off]), merged);
    }
    /* Objects with listed keys, one of them as it is, several as one node that follows
     * them all (repeats, met through nested unions, once). */
    uint32_t distinct_objs = 0;
    for (uint32_t i = 0; i < n_objs; i++) {
        uint32_t j = 0;
        while (j < distinct_objs && objs[j] != objs[i])
            j++;
        if (j == distinct_objs)
            objs[distinct_objs++] = objs[i];
    }
    if (st == MMRT_OK && !any && distinct_objs > 0) {
        uint16_t o = objs[0];
        if (distinct_objs > 1)
            st = build_objects(c, info, objs, distinct_objs, &o);
        if (st == MMRT_OK)
            st = claim(c, info, table, MMRT_JSON_CLASS_OBJECT, o);
    }
    free(lits);
    free(objs);
    if (st != MMRT_OK)
        return st;
    state[u] = 2;
    if (any) {
        s->node[u] = s->node[N_ANY];
        return MMRT_OK;
    }
    uint16_t only = MMRT_JSON_NONE;
    bool one = true;
    for (int k = 0; k < MMRT_JSON_CLASSES; k++) {
        if (table[k] == MMRT_JSON_NONE)
            continue;
        if (only != MMRT_JSON_NONE && table[k] != only)
            one = false;
        only = table[k];
    }
    if (one && only != MMRT_JSON_NONE) {
        s->node[u] = s->node[only];
        return MMRT_OK;
    }
    memcpy(s->node[u].alt, table, sizeof table);
    return MMRT_OK;
}

/* Which nodes have a finite document (a fixed point: a node is finite when its required
 * parts are), then keeps the generator out of the others: a union loses such alternatives,
 * an object such optional keys (their node becomes MMRT_JSON_NONE), an array such items
 * (max 0). Every node the root reaches is then finite, so an answer cannot be walked into a
 * value it can never close. */
static mmrt_status keep_finite(struct compiler *c)
{
    struct mmrt_json_schema *s = c->s;
    uint8_t *fin = calloc(s->n_nodes, 1);
    if (!fin)
        return no_memory(c);
    for (bool changed = true; changed;) {
        changed = false;
        for (uint32_t i = 0; i < s->n_nodes; i++) {
            if (fin[i])
                continue;
            const struct mmrt_json_node *x = &s->node[i];
            bool f = false;
            switch (x->kind) {
            case MMRT_JSON_STRING: case MMRT_JSON_NUMBER: case MMRT_JSON_INTEGER: f = true; break;
            case MMRT_JSON_LITERALS: f = x->n > 0; break;
            case MMRT_JSON_ARRAY: /* its first minItems items are */
                f = x->min <= x->n || fin[x->extra];
                for (uint32_t j = 0; j < x->n && j < x->min && f; j++)
                    f = fin[s->prop[x->first + j].node];
                break;
            case MMRT_JSON_OBJECT: /* its required keys' values are, or min free keys' */
                f = x->min == 0 || (x->extra != MMRT_JSON_NONE && fin[x->extra]);
                for (uint32_t j = 0; j < x->n && f; j++)
                    f = !s->prop[x->first + j].required || fin[s->prop[x->first + j].node];
                break;
            case MMRT_JSON_UNION:
                for (int k = 0; k < MMRT_JSON_CLASSES && !f; k++)
                    f = x->alt[k] != MMRT_JSON_NONE && fin[x->alt[k]];
                break;
            case MMRT_JSON_OBJECTS: /* some alternative's required keys are all finite */
                for (uint32_t a = 0; a < x->extra && !f; a++) {
                    f = true;
                    for (uint32_t j = 0; j < x->n && f; j++) {
                        const struct mmrt_json_prop *q = &s->prop[x->first + x->n * (1 + a) + j];
                        f = !q->required || (q->node != MMRT_JSON_NONE && fin[q->node]);
                    }
                }
                break;
            }
            if (f)
                fin[i] = 1, changed = true;
        }
    }
    mmrt_status st = MMRT_OK;
    if (!fin[s->root])
        st = mmrt_error_set(c->err, MMRT_ERR_INVALID_ARG, "json_schema: no finite document "
                            "satisfies it (a required property or minItems recurses without "
                            "end)");
    for (uint32_t i = 0; i < s->n_nodes && st == MMRT_OK; i++) {
        struct mmrt_json_node *x = &s->node[i];
        if (x->kind == MMRT_JSON_UNION)
            for (int k = 0; k < MMRT_JSON_CLASSES; k++)
                if (x->alt[k] != MMRT_JSON_NONE && !fin[x->alt[k]])
                    x->alt[k] = MMRT_JSON_NONE;
        if (x->kind == MMRT_JSON_ARRAY) {
            /* The array ends before an item with no finite document (an optional one, if
             * the array is finite at all). */
            for (uint32_t j = 0; j < x->n && j < x->max; j++)
                if (s->prop[x->first + j].node == MMRT_JSON_NONE ||
                    !fin[s->prop[x->first + j].node])
                    x->max = j;
            if (x->max > x->n && !fin[x->extra])
                x->max = x->n;
        }
        if (x->kind == MMRT_JSON_OBJECTS) {
            /* A key whose value has no finite document is never written; an alternative
             * that requires one can then never close, and no key leads into it. */
            for (uint32_t j = 0; j < x->n * (1u + x->extra); j++) {
                struct mmrt_json_prop *q = &s->prop[x->first + j];
                if (q->node != MMRT_JSON_NONE && !fin[q->node] &&
                    !(j < x->n && q->per_alternative))
                    q->node = MMRT_JSON_NONE;
            }
            for (uint32_t a = 0; a < x->extra; a++) {
                bool dead = false;
                for (uint32_t j = 0; j < x->n; j++) {
                    const struct mmrt_json_prop *q = &s->prop[x->first + x->n * (1 + a) + j];
                    dead = dead || (q->required && q->node == MMRT_JSON_NONE);
                }
                for (uint32_t j = 0; dead && j < x->n; j++)
                    s->prop[x->first + x->n * (1 + a) + j].node = MMRT_JSON_NONE;
            }
            /* A key read under the live alternative's schema stays while one of theirs is
             * finite (its shared entry only says whether the key may come at all). */
            for (uint32_t j = 0; j < x->n; j++) {
                struct mmrt_json_prop *q = &s->prop[x->first + j];
                if (!q->per_alternative)
                    continue;
                q->node = MMRT_JSON_NONE;
                for (uint32_t a = 0; a < x->extra && q->node == MMRT_JSON_NONE; a++)
                    q->node = s->prop[x->first + x->n * (1 + a) + j].node;
            }
        }
        if (x->kind == MMRT_JSON_OBJECT) {
            /* Objects copied into $ref slots share their props: pruned once is enough. */
            for (uint32_t j = 0; j < x->n; j++)
                if (s->prop[x->first + j].node != MMRT_JSON_NONE &&
                    !fin[s->prop[x->first + j].node])
                    s->prop[x->first + j].node = MMRT_JSON_NONE;
            if (x->extra != MMRT_JSON_NONE && !fin[x->extra])
                x->extra = MMRT_JSON_NONE;
        }
    }
    free(fin);
    return st;
}

/* The nodes every schema starts with. */
static mmrt_status begin(struct compiler *c)
{
    static const char *const tfn[] = { "false", "null", "true" };
    uint16_t id;
    mmrt_status st = new_node(c, MMRT_JSON_UNION, &id);
    if (st == MMRT_OK)
        st = new_node(c, MMRT_JSON_OBJECT, &id);
    if (st == MMRT_OK)
        st = new_node(c, MMRT_JSON_ARRAY, &id);
    if (st == MMRT_OK)
        st = new_node(c, MMRT_JSON_STRING, &id);
    if (st == MMRT_OK)
        st = new_node(c, MMRT_JSON_NUMBER, &id);
    if (st == MMRT_OK)
        st = literal_node(c, tfn, 3, &id);
    if (st != MMRT_OK)
        return st;
    struct mmrt_json_node *node = c->s->node;
    node[N_ANY_OBJECT].extra = N_ANY;
    node[N_ANY_ARRAY].extra = N_ANY;
    uint16_t *alt = node[N_ANY].alt;
    alt[MMRT_JSON_CLASS_OBJECT] = N_ANY_OBJECT;
    alt[MMRT_JSON_CLASS_ARRAY] = N_ANY_ARRAY;
    alt[MMRT_JSON_CLASS_STRING] = N_ANY_STRING;
    alt[MMRT_JSON_CLASS_NUMBER] = N_ANY_NUMBER;
    alt[MMRT_JSON_CLASS_TRUE] = alt[MMRT_JSON_CLASS_FALSE] = alt[MMRT_JSON_CLASS_NULL] =
        N_ANY_LITERAL;
    return MMRT_OK;
}

void mmrt_json_schema_free(struct mmrt_json_schema *s)
{
    if (!s || atomic_fetch_sub_explicit(&s->holds, 1, memory_order_acq_rel) > 0)
        return;
    free(s->node);
    free(s->prop);
    free(s->lit);
    free(s->text);
    for (uint32_t i = 0; i < s->n_patterns; i++)
        mmrt_json_pattern_free(&s->patterns[i]);
    free(s->patterns);
    free(s->ranges);
    free(s);
}

struct mmrt_json_schema *mmrt_json_schema_hold(struct mmrt_json_schema *s)
{
    atomic_fetch_add_explicit(&s->holds, 1, memory_order_relaxed);
    return s;
}

size_t mmrt_json_schema_bytes(const struct mmrt_json_schema *s)
{
    size_t n = sizeof *s + s->n_nodes * sizeof *s->node + s->n_props * sizeof *s->prop +
               s->n_lits * sizeof *s->lit + s->n_text + s->n_ranges * sizeof *s->ranges +
               s->n_patterns * sizeof *s->patterns;
    for (uint32_t i = 0; i < s->n_patterns; i++) {
        const struct mmrt_json_pattern *p = &s->patterns[i];
        n += (p->n_classes + 1) * sizeof *p->start +
             (size_t)p->n_states * p->n_classes * sizeof *p->next +
             (size_t)p->n_states * (sizeof *p->accept + sizeof *p->shortest +
                                    sizeof *p->longest);
        if (p->window)
            n += ((size_t)p->n_states * ((size_t)p->max_len + 1) + 7) / 8;
    }
    return n;
}

static void end(struct compiler *c)
{
    for (uint32_t i = 0; i < c->n_unions; i++)
        free(c->unions[i].path);
    for (uint32_t i = 0; i < c->n_uniques; i++)
        free(c->uniques[i]);
    free(c->uniques);
    free(c->unions);
    free(c->alts);
    free(c->memo);
}

/* Compiles schema (NULL: any object) into *out. */
static mmrt_status build(const json_t *schema, struct mmrt_json_schema **out,
                         struct mmrt_error *err)
{
    struct compiler c = { .err = err, .root = schema,
                          .windows = { MMRT_JSON_PATTERN_MAX_WINDOW,
                                       MMRT_JSON_PATTERN_MAX_WINDOW_WORK } };
    c.s = calloc(1, sizeof *c.s);
    if (!c.s)
        return no_memory(&c);
    mmrt_status st = begin(&c);
    if (st == MMRT_OK && !schema)
        c.s->root = N_ANY_OBJECT;
    else if (st == MMRT_OK)
        st = compile_target(&c, schema, &c.s->root);
    uint8_t *state = NULL;
    if (st == MMRT_OK && !(state = calloc(c.s->n_nodes, 1)))
        st = no_memory(&c);
    /* Every union made in pass one (slot copies of unions included), by node: the nodes
     * pass two adds are never unions. */
    const uint32_t made = c.s->n_nodes;
    for (uint32_t i = N_BUILTIN; i < made && st == MMRT_OK; i++)
        if (c.s->node[i].kind == MMRT_JSON_UNION && !is_any(&c.s->node[i]) && state[i] == 0)
            st = link_union(&c, (uint16_t)i, state);
    free(state);
    if (st == MMRT_OK)
        st = check_unique(&c);
    if (st == MMRT_OK)
        st = keep_finite(&c);
    end(&c);
    if (st != MMRT_OK) {
        mmrt_json_schema_free(c.s);
        return st;
    }
    *out = c.s;
    return MMRT_OK;
}

mmrt_status mmrt_json_schema_compile(const json_t *schema, struct mmrt_json_schema **out,
                                     struct mmrt_error *err)
{
    if (!schema)
        return mmrt_error_set(err, MMRT_ERR_INVALID_ARG, "json_schema: no schema");
    return build(schema, out, err);
}

mmrt_status mmrt_json_schema_parse(const char *text, size_t len, struct mmrt_json_schema **out,
                                   struct mmrt_error *err)
{
    /* The boolean schemas are JSON texts too, which the parser (for files, objects or
     * arrays) would refuse. */
    size_t a = 0, b = len;
    while (a < b && strchr(" \t\r\n", text[a]) && text[a])
        a++;
    while (b > a && strchr(" \t\r\n", text[b - 1]) && text[b - 1])
        b--;
    if (b - a == 4 && memcmp(text + a, "true", 4) == 0)
        return build(json_true(), out, err);
    if (b - a == 5 && memcmp(text + a, "false", 5) == 0)
        return mmrt_error_set(err, MMRT_ERR_INVALID_ARG, "json_schema: the schema false admits "
                              "no value");
    json_t *v = NULL;
    mmrt_status st = mmrt_json_parse(text, len, "json_schema", MMRT_JSON_DEFAULT_MAX_DEPTH, &v,
                                     err);
    if (st != MMRT_OK) {
        /* Bad text from the caller is a bad argument, as a bad schema is. */
        if (st != MMRT_ERR_NO_MEMORY && err)
            err->status = MMRT_ERR_INVALID_ARG;
        return st == MMRT_ERR_NO_MEMORY ? st : MMRT_ERR_INVALID_ARG;
    }
    st = build(v, out, err);
    json_decref(v);
    return st;
}

mmrt_status mmrt_json_schema_any_object(struct mmrt_json_schema **out, struct mmrt_error *err)
{
    return build(NULL, out, err);
}
