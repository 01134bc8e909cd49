/*
 * core/json_grammar.c — the JSON prefix recogniser of json_grammar.h: a lexical state per
 * byte, containers on a bit stack.
 */
#include "json_grammar.h"

#include <string.h>

enum {
    S_TOP,        /* before the top-level value (object_only: before its '{') */
    S_VALUE,      /* a value must come (after ':' or an array's ',') */
    S_ARR_FIRST,  /* after '[': a value or ']' */
    S_OBJ_FIRST,  /* after '{': a key or '}' */
    S_KEY,        /* after an object's ',': a key */
    S_COLON,      /* after a key */
    S_AFTER,      /* after a value: ',' or the container's end; at depth 0 the text is whole */
    S_STRING,
    S_ESCAPE,     /* after '\' in a string */
    S_HEX,        /* in \uXXXX: aux digits to come */
    S_LITERAL,    /* in true / false / null: aux is the literal's index, pos the bytes read */
    S_MINUS,      /* number: after '-' */
    S_ZERO,       /* number: a leading 0 */
    S_INT,        /* number: digits of the integer part */
    S_DOT,        /* number: after '.' */
    S_FRAC,       /* number: fraction digits */
    S_EXP,        /* number: after 'e' / 'E' */
    S_EXP_SIGN,   /* number: after the exponent's sign */
    S_EXP_DIGITS, /* number: exponent digits */
};

static const char *const literals[3] = { "true", "false", "null" };

void mmrt_json_grammar_init(struct mmrt_json_grammar *g, bool object_only)
{
    memset(g, 0, sizeof *g);
    g->state = S_TOP;
    g->object_only = object_only;
}

static bool is_space(unsigned char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

static bool is_digit(unsigned char c)
{
    return c >= '0' && c <= '9';
}

static bool is_hex(unsigned char c)
{
    return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

static bool open_container(struct mmrt_json_grammar *g, bool array)
{
    if (g->depth >= MMRT_JSON_MAX_DEPTH)
        return false;
    if (array)
        g->stack |= (uint64_t)1 << g->depth;
    else
        g->stack &= ~((uint64_t)1 << g->depth);
    g->depth++;
    g->state = array ? S_ARR_FIRST : S_OBJ_FIRST;
    return true;
}

static bool top_is_array(const struct mmrt_json_grammar *g)
{
    return (g->stack >> (g->depth - 1)) & 1;
}

/* The first byte of a value. */
static bool start_value(struct mmrt_json_grammar *g, unsigned char c)
{
    switch (c) {
    case '{': return open_container(g, false);
    case '[': return open_container(g, true);
    case '"': g->state = S_STRING, g->key = 0; return true;
    case '-': g->state = S_MINUS; return true;
    case '0': g->state = S_ZERO; return true;
    case 't': case 'f': case 'n':
        g->state = S_LITERAL;
        g->aux = c == 't' ? 0 : c == 'f' ? 1 : 2;
        g->pos = 1;
        return true;
    default:
        if (c >= '1' && c <= '9') {
            g->state = S_INT;
            return true;
        }
        return false;
    }
}

/* A byte after a complete value: ',' or the end of the open container. */
static bool after_value(struct mmrt_json_grammar *g, unsigned char c)
{
    if (g->depth == 0)
        return false; /* the text is whole: only whitespace may follow */
    const bool array = top_is_array(g);
    if (c == ',') {
        g->state = array ? S_VALUE : S_KEY;
        return true;
    }
    if (c == (array ? ']' : '}')) {
        g->depth--;
        g->state = S_AFTER;
        return true;
    }
    return false;
}

/* A byte that ends a number (the number is whole): handled as after a value. */
static bool end_number(struct mmrt_json_grammar *g, unsigned char c)
{
    g->state = S_AFTER;
    g->space = 0;
    if (is_space(c)) {
        g->space = 1;
        return true;
    }
    return after_value(g, c);
}

static bool step(struct mmrt_json_grammar *g, unsigned char c)
{
    switch (g->state) {
    case S_TOP: case S_VALUE: case S_ARR_FIRST: case S_OBJ_FIRST: case S_KEY: case S_COLON:
    case S_AFTER:
        if (is_space(c))
            return ++g->space <= (g->state == S_TOP ? 1 : MMRT_JSON_MAX_SPACE);
        g->space = 0;
        switch (g->state) {
        case S_TOP: return g->object_only ? c == '{' && open_container(g, false)
                                          : start_value(g, c);
        case S_VALUE: return start_value(g, c);
        case S_ARR_FIRST:
            if (c == ']') {
                g->depth--;
                g->state = S_AFTER;
                return true;
            }
            return start_value(g, c);
        case S_OBJ_FIRST: case S_KEY:
            if (c == '}' && g->state == S_OBJ_FIRST) {
                g->depth--;
                g->state = S_AFTER;
                return true;
            }
            if (c != '"')
                return false;
            g->state = S_STRING;
            g->key = 1;
            return true;
        case S_COLON:
            if (c != ':')
                return false;
            g->state = S_VALUE;
            return true;
        default: return after_value(g, c);
        }
    case S_STRING:
        if (c == '"') {
            g->state = g->key ? S_COLON : S_AFTER;
            g->space = 0;
            return true;
        }
        if (c == '\\')
            g->state = S_ESCAPE;
        return c >= 0x20;
    case S_ESCAPE:
        if (c == 'u') {
            g->state = S_HEX;
            g->aux = 4;
            return true;
        }
        g->state = S_STRING;
        return strchr("\"\\/bfnrt", c) != NULL && c != '\0';
    case S_HEX:
        if (!is_hex(c))
            return false;
        if (--g->aux == 0)
            g->state = S_STRING;
        return true;
    case S_LITERAL: {
        const char *lit = literals[g->aux];
        if (c != (unsigned char)lit[g->pos])
            return false;
        if (lit[++g->pos] == '\0') {
            g->state = S_AFTER;
            g->space = 0;
        }
        return true;
    }
    case S_MINUS:
        if (c == '0')
            g->state = S_ZERO;
        else if (c >= '1' && c <= '9')
            g->state = S_INT;
        else
            return false;
        return true;
    case S_ZERO: case S_INT: case S_FRAC: case S_EXP_DIGITS:
        if (is_digit(c) && g->state != S_ZERO)
            return true;
        if (c == '.' && (g->state == S_ZERO || g->state == S_INT)) {
            g->state = S_DOT;
            return true;
        }
        if ((c == 'e' || c == 'E') && g->state != S_EXP_DIGITS) {
            g->state = S_EXP;
            return true;
        }
        if (is_digit(c)) /* a digit after a leading 0 */
            return false;
        return end_number(g, c);
    case S_DOT:
        if (!is_digit(c))
            return false;
        g->state = S_FRAC;
        return true;
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
    return g->state == S_STRING;
}
