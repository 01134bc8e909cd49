/*
 * tests/test_json_schema.c — core/json_schema.h (a JSON Schema compiled into a node table)
 * and the recogniser of core/json_grammar.h held to such a table.
 *
 * The schema comes from a request body, so a refusal must say where and why: each bad
 * schema below must fail with MMRT_ERR_INVALID_ARG (MMRT_ERR_LIMIT past a bound) and a
 * message naming the place as a JSON pointer and the keyword at fault. Every table compiled
 * here is checked against the invariants json_schema.h states (indices in range, literals
 * sorted, a key run per object).
 *
 * The recogniser must never take the engine somewhere it cannot leave: a document the
 * schema admits (within the subset json_schema.h generates) is accepted fed whole, cut at
 * every byte into two feeds (the second fed to a copy too) and byte by byte, and ends done;
 * a document outside is refused at some byte or does not end done. Then the bounds
 * (whitespace runs, depth), mmrt_json_grammar_in_string (the engine skips the grammar for
 * text bytes where it says so, so it must leave the state as it is), and a property test:
 * random documents walked out of the recogniser must parse and conform to their schema, by
 * a validator written here for the supported subset.
 *
 * The tables go on past a misjudged case and fail at the end, so that one run lists them
 * all.
 *
 * Schemas and documents in the tables are written with ' standing for " (q() swaps them),
 * so that they read as the JSON they are.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>
#include <regex.h>

#include "json_grammar.h"
#include "json_schema.h"

/* ---------------------------------------------------------------------------------------- */
/* helpers */

/* A copy of s with every ' made "; freed by the caller. */
static char *q(const char *s)
{
    const size_t n = strlen(s);
    char *r = malloc(n + 1);
    assert_non_null(r);
    for (size_t i = 0; i <= n; i++)
        r[i] = s[i] == '\'' ? '"' : s[i];
    return r;
}

static int lit_cmp(const struct mmrt_json_schema *s, const struct mmrt_json_literal *a,
                   const struct mmrt_json_literal *b)
{
    const uint32_t n = a->len < b->len ? a->len : b->len;
    const int c = memcmp(s->text + a->off, s->text + b->off, n);
    if (c != 0)
        return c;
    return a->len < b->len ? -1 : a->len > b->len;
}

/* The table invariants json_schema.h promises; the recogniser indexes by them unchecked, so
 * a table that breaks one is a read out of bounds waiting for the right document. */
static void check_table(const struct mmrt_json_schema *s, const char *what)
{
    assert_non_null(s);
    if (s->n_nodes == 0 || s->n_nodes > MMRT_JSON_SCHEMA_MAX_NODES || s->root >= s->n_nodes)
        fail_msg("%s: %u nodes, root %u", what, s->n_nodes, s->root);
    for (uint32_t i = 0; i < s->n_lits; i++)
        if ((uint64_t)s->lit[i].off + s->lit[i].len > s->n_text)
            fail_msg("%s: literal %u outside the text", what, i);
    /* MMRT_JSON_NONE: an optional key whose value has no finite document, never written */
    for (uint32_t i = 0; i < s->n_props; i++)
        if (s->prop[i].node >= s->n_nodes &&
            (s->prop[i].node != MMRT_JSON_NONE || s->prop[i].required))
            fail_msg("%s: prop %u names node %u", what, i, s->prop[i].node);
    for (uint32_t i = 0; i < s->n_nodes; i++) {
        const struct mmrt_json_node *nd = &s->node[i];
        switch (nd->kind) {
        case MMRT_JSON_OBJECT:
            if ((uint64_t)nd->first + nd->n > s->n_props ||
                (uint64_t)nd->lit + nd->n > s->n_lits)
                fail_msg("%s: object node %u's props or keys out of range", what, i);
            if (nd->n > 0 && nd->extra != MMRT_JSON_NONE)
                fail_msg("%s: object node %u has listed keys and free ones", what, i);
            if (nd->extra != MMRT_JSON_NONE && nd->extra >= s->n_nodes)
                fail_msg("%s: object node %u's extra is %u", what, i, nd->extra);
            for (uint32_t k = 0; k < nd->n; k++) {
                const struct mmrt_json_literal *l = &s->lit[nd->lit + k];
                if (l->len < 2 || s->text[l->off] != '"' || s->text[l->off + l->len - 1] != '"')
                    fail_msg("%s: object node %u's key %u is not a quoted string", what, i, k);
                if (l->prop >= nd->n)
                    fail_msg("%s: object node %u's key %u names prop %u", what, i, k, l->prop);
                for (uint32_t j = 0; j < k; j++)
                    if (s->lit[nd->lit + j].prop == l->prop)
                        fail_msg("%s: object node %u: two keys of prop %u", what, i, l->prop);
                if (k > 0 && lit_cmp(s, &s->lit[nd->lit + k - 1], l) >= 0)
                    fail_msg("%s: object node %u's keys are not sorted", what, i);
            }
            break;
        case MMRT_JSON_OBJECTS:
            /* n keys in one order, a value node each, then a row per alternative */
            if (nd->extra < 2 || nd->extra > 16 || nd->n == 0 ||
                (uint64_t)nd->first + (uint64_t)nd->n * (1u + nd->extra) > s->n_props ||
                (uint64_t)nd->lit + nd->n > s->n_lits)
                fail_msg("%s: object alternatives node %u out of range", what, i);
            for (uint32_t k = 0; k < nd->n; k++) {
                const struct mmrt_json_literal *l = &s->lit[nd->lit + k];
                if (l->prop >= nd->n || (k > 0 && lit_cmp(s, &s->lit[nd->lit + k - 1], l) >= 0))
                    fail_msg("%s: object alternatives node %u's key %u", what, i, k);
            }
            break;
        case MMRT_JSON_ARRAY:
            if (nd->extra >= s->n_nodes || (uint64_t)nd->first + nd->n > s->n_props)
                fail_msg("%s: array node %u: items %u, tuple [%u, +%u)", what, i, nd->extra,
                         nd->first, nd->n);
            for (uint32_t k = 0; k < nd->n && k < nd->max; k++)
                if (s->prop[nd->first + k].node >= s->n_nodes)
                    fail_msg("%s: array node %u: tuple item %u may come but has no node", what,
                             i, k);
            break;
        case MMRT_JSON_STRING:
            break;
        case MMRT_JSON_NUMBER:
            /* bounded: two ranges, their digits in the text, no leading zero, none trailing */
            if (nd->n && (uint64_t)nd->lit + 2 > s->n_ranges)
                fail_msg("%s: number node %u: ranges [%u, +2) of %u", what, i, nd->lit,
                         s->n_ranges);
            for (uint32_t k = 0; nd->n && k < 2; k++) {
                const struct mmrt_json_range *r = &s->ranges[nd->lit + k];
                const struct mmrt_json_decimal *d[2] = { &r->a, &r->b };
                for (int j = 0; j < 2 && !r->empty; j++) {
                    if (j == 1 && !r->b_finite)
                        continue;
                    const char *t = s->text + d[j]->off;
                    if ((uint64_t)d[j]->off + d[j]->len > s->n_text ||
                        (d[j]->n_int > 0 && (d[j]->len == 0 || t[0] == '0')) ||
                        (d[j]->len > 0 && t[d[j]->len - 1] == '0'))
                        fail_msg("%s: number node %u: range %u's bound %d", what, i, k, j);
                    for (uint32_t b = 0; b < d[j]->len; b++)
                        if (t[b] < '0' || t[b] > '9')
                            fail_msg("%s: number node %u: a bound's digit is '%c'", what, i,
                                     t[b]);
                }
            }
            break;
        case MMRT_JSON_INTEGER:
            if (nd->mul == 0 || nd->imin > nd->imax)
                fail_msg("%s: integer node %u: multiple of %llu in [%lld, %lld]", what, i,
                         (unsigned long long)nd->mul, (long long)nd->imin, (long long)nd->imax);
            break;
        case MMRT_JSON_LITERALS:
            if (nd->n == 0 || (uint64_t)nd->lit + nd->n > s->n_lits)
                fail_msg("%s: literal node %u: [%u, +%u) of %u", what, i, nd->lit, nd->n,
                         s->n_lits);
            for (uint32_t k = 1; k < nd->n; k++)
                if (lit_cmp(s, &s->lit[nd->lit + k - 1], &s->lit[nd->lit + k]) > 0)
                    fail_msg("%s: literal node %u is not sorted at %u", what, i, k);
            break;
        case MMRT_JSON_UNION:
            for (int c = 0; c < MMRT_JSON_CLASSES; c++) {
                const uint16_t a = nd->alt[c];
                if (a != MMRT_JSON_NONE && (a >= s->n_nodes || s->node[a].kind == MMRT_JSON_UNION))
                    fail_msg("%s: union node %u's class %d goes to %u", what, i, c, a);
            }
            break;
        default:
            fail_msg("%s: node %u has kind %u", what, i, nd->kind);
        }
    }
    /* The nodes a document can reach must have one that ends: min ≤ max (a node left
     * unreachable by the finiteness pass may hold anything). */
    uint8_t *seen = calloc(s->n_nodes, 1);
    uint16_t *stack = malloc(s->n_nodes * sizeof *stack);
    assert_true(seen && stack);
    size_t top = 0;
    stack[top++] = s->root;
    seen[s->root] = 1;
    while (top > 0) {
        const uint32_t i = stack[--top];
        const struct mmrt_json_node *nd = &s->node[i];
        uint16_t next[MMRT_JSON_CLASSES + 1];
        size_t nn = 0;
        if ((nd->kind == MMRT_JSON_ARRAY || nd->kind == MMRT_JSON_STRING) && nd->min > nd->max)
            fail_msg("%s: node %u, reachable, has min %u > max %u", what, i, nd->min, nd->max);
        if (nd->kind == MMRT_JSON_ARRAY && nd->max > 0)
            next[nn++] = nd->extra;
        if (nd->kind == MMRT_JSON_OBJECT && nd->extra != MMRT_JSON_NONE)
            next[nn++] = nd->extra;
        if (nd->kind == MMRT_JSON_UNION)
            for (int c = 0; c < MMRT_JSON_CLASSES; c++)
                if (nd->alt[c] != MMRT_JSON_NONE)
                    next[nn++] = nd->alt[c];
        const bool objects = nd->kind == MMRT_JSON_OBJECTS;
        for (uint32_t k = 0; (nd->kind == MMRT_JSON_OBJECT || objects) && k < nd->n; k++) {
            const uint16_t p = s->prop[nd->first + k].node;
            if (p != MMRT_JSON_NONE && !seen[p])
                seen[p] = 1, stack[top++] = p;
        }
        for (size_t k = 0; k < nn; k++)
            if (!seen[next[k]])
                seen[next[k]] = 1, stack[top++] = next[k];
    }
    free(stack);
    free(seen);
}

/* Compiles schema text written with ' for " (see q), failing the test on a refusal. The
 * text goes through jansson and mmrt_json_schema_compile, so that "true" is a schema here
 * whatever mmrt_json_schema_parse makes of a text that is not a container. */
static struct mmrt_json_schema *compile_ok(const char *schema)
{
    char *text = q(schema);
    json_error_t je;
    json_t *v = json_loads(text, JSON_DECODE_ANY, &je);
    if (v == NULL)
        fail_msg("the test's schema is not JSON (%s): %s", je.text, text);
    struct mmrt_json_schema *s = NULL;
    struct mmrt_error err = { 0 };
    const mmrt_status st = mmrt_json_schema_compile(v, &s, &err);
    if (st != MMRT_OK || s == NULL)
        fail_msg("schema refused (%s): %s\n  schema: %s", mmrt_status_name(st), err.msg, text);
    check_table(s, text);
    json_decref(v);
    free(text);
    return s;
}

/* The same text through mmrt_json_schema_parse. */
static struct mmrt_json_schema *parse_ok(const char *schema)
{
    char *text = q(schema);
    struct mmrt_json_schema *s = NULL;
    struct mmrt_error err = { 0 };
    const mmrt_status st = mmrt_json_schema_parse(text, strlen(text), &s, &err);
    if (st != MMRT_OK || s == NULL)
        fail_msg("schema text refused (%s): %s\n  schema: %s", mmrt_status_name(st), err.msg,
                 text);
    check_table(s, text);
    free(text);
    return s;
}

/* Whether word occurs in msg not as part of a longer name (so "if" is not found in
 * "specified", nor "/properties/a" in "/properties/ab"). */
static bool has_word(const char *msg, const char *word)
{
    const size_t n = strlen(word);
    for (const char *p = strstr(msg, word); p != NULL; p = strstr(p + 1, word)) {
        const char before = p == msg ? ' ' : p[-1];
        const char after = p[n];
        const bool name_before = (before >= 'a' && before <= 'z') ||
                                 (before >= 'A' && before <= 'Z') || before == '_' ||
                                 (before >= '0' && before <= '9');
        const bool name_after = (after >= 'a' && after <= 'z') || (after >= 'A' && after <= 'Z') ||
                                after == '_' || (after >= '0' && after <= '9');
        if ((word[0] == '/' || !name_before) && !name_after)
            return true;
    }
    return false;
}

/* ---------------------------------------------------------------------------------------- */
/* compile refusals */

struct refusal {
    const char *schema; /* ' for " */
    mmrt_status status;
    const char *where;  /* JSON pointer the message names; "" the root (only "json_schema" is
                           looked for); NULL: nothing looked for but a message */
    const char *names;  /* '|'-separated: one of them must be in the message; NULL: none */
};

static const struct refusal refusals[] = {
    /* assertions mmrt cannot hold an answer to, refused by name where they stand */
    { "{'type':'object','properties':{'name':{'type':'string','not':{}}}}",
      MMRT_ERR_INVALID_ARG, "/properties/name", "not" },
    { "{'type':'object','properties':{'a':{'type':'array','items':{'type':'number',"
      "'multipleOf':2}}}}",
      MMRT_ERR_INVALID_ARG, "/properties/a/items/multipleOf", "multipleOf" },
    { "{'$defs':{'x':{'type':['integer','number'],'multipleOf':3}},'type':'array',"
      "'items':{'$ref':'#/$defs/x'}}",
      MMRT_ERR_INVALID_ARG, "/$defs/x/multipleOf", "number" },
    { "{'type':'object','properties':{'list':{'type':'array','uniqueItems':true}}}",
      MMRT_ERR_INVALID_ARG, "/properties/list/uniqueItems", "enum" },
    { "{'type':'array','items':{'type':'string'},'uniqueItems':true}", MMRT_ERR_INVALID_ARG,
      "/uniqueItems", "enum" },
    { "{'type':'array','items':{'enum':[1.5,2]},'uniqueItems':true}", MMRT_ERR_INVALID_ARG,
      "/uniqueItems", "enum" },
    { "{'type':'array','items':{'enum':[[1],[2]]},'uniqueItems':true}", MMRT_ERR_INVALID_ARG,
      "/uniqueItems", "enum" },
    { "{'type':'array','items':{'enum':['a','b']},'uniqueItems':true,'minItems':3}",
      MMRT_ERR_INVALID_ARG, "/uniqueItems", "minItems" },
    { "{'type':'array','items':{'enum':['a']},'uniqueItems':1}", MMRT_ERR_INVALID_ARG,
      "/uniqueItems", "true or false" },
    { "{'type':'array','prefixItems':[{'const':1}],'uniqueItems':true}", MMRT_ERR_INVALID_ARG,
      "/uniqueItems", "tuple" },
    { "{'type':'array','items':{'enum':[0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16]},"
      "'uniqueItems':true}", MMRT_ERR_INVALID_ARG, "/uniqueItems", "16" },
    { "{'anyOf':[{'type':'string'},{'type':'integer','not':{'const':0}}]}",
      MMRT_ERR_INVALID_ARG, "/anyOf/1", "not" },
    { "{'type':'object','properties':{'a':{'if':{'type':'string'},'then':{'minLength':1}}}}",
      MMRT_ERR_INVALID_ARG, "/properties/a", "if" },
    { "{'type':'object','properties':{'t':{'type':'array','contains':{'type':'string'}}}}",
      MMRT_ERR_INVALID_ARG, "/properties/t", "contains" },
    { "{'type':'object','properties':{'o':{'type':'object','properties':{'a':{}},"
      "'minProperties':1}}}", MMRT_ERR_INVALID_ARG, "/properties/o/minProperties",
      "listed properties" },
    { "{'type':'object','additionalProperties':{'type':'integer'},'minProperties':2}",
      MMRT_ERR_INVALID_ARG, "/minProperties", "remembered" },
    { "{'type':'object','additionalProperties':false,'minProperties':1}",
      MMRT_ERR_INVALID_ARG, "/minProperties", "no key" },
    { "{'type':'object','properties':{'a':{}},'maxProperties':0}", MMRT_ERR_INVALID_ARG,
      "/maxProperties", "listed properties" },
    { "{'type':'object','maxProperties':-1}", MMRT_ERR_INVALID_ARG, "/maxProperties", NULL },
    { "{'type':'object','additionalProperties':{'type':'object','patternProperties':{'^x':{}}}}",
      MMRT_ERR_INVALID_ARG, "/additionalProperties", "patternProperties" },
    /* a key with '/' or '~' is escaped in the pointer as RFC 6901 has it */
    { "{'type':'object','properties':{'a/b':{'type':'string','pattern':'(?<=x)'}}}",
      MMRT_ERR_INVALID_ARG, "/properties/a~1b/pattern", "look-arounds" },
    { "{'type':'object','properties':{'m~n':{'type':'number','multipleOf':1}}}",
      MMRT_ERR_INVALID_ARG, "/properties/m~0n/multipleOf", "multipleOf" },
    /* object alternatives json_schema.h cannot tell apart or order */
    { "{'anyOf':[{'properties':{'x':{'type':'string'}}},{'properties':{'x':{'type':'integer'}}}]}",
      MMRT_ERR_INVALID_ARG, "/anyOf", "literals" },
    { "{'oneOf':[{'properties':{'x':{'const':1}}},{'properties':{'x':{'const':2}}}]}",
      MMRT_ERR_INVALID_ARG, "/oneOf", "discriminator" },
    { "{'oneOf':[{'properties':{'x':{'enum':[1,2]}},'required':['x']},"
      "{'properties':{'x':{'const':2}},'required':['x']}]}",
      MMRT_ERR_INVALID_ARG, "/oneOf", "discriminator" },
    { "{'oneOf':[{'properties':{'x':{'const':1.5}},'required':['x']},"
      "{'properties':{'x':{'const':2}},'required':['x']}]}",
      MMRT_ERR_INVALID_ARG, "/oneOf", "discriminator" },
    { "{'oneOf':[{'properties':{'x':{'const':{'a':1,'b':2}}},'required':['x']},"
      "{'properties':{'x':{'const':{'b':2,'a':1}}},'required':['x']}]}",
      MMRT_ERR_INVALID_ARG, "/oneOf", "discriminator" },
    { "{'anyOf':[{'properties':{'y':{'type':'string'},'x':{'const':'a'}},'required':['x']},"
      "{'properties':{'y':{'type':'integer'},'x':{'const':'b'}},'required':['x']}]}",
      MMRT_ERR_INVALID_ARG, "/anyOf", "before it" },
    { "{'anyOf':[{'properties':{'x':{'const':'a'},'y':{'type':'string'}}},"
      "{'properties':{'x':{'const':'b'},'y':{'type':'integer'}},'required':['x']}]}",
      MMRT_ERR_INVALID_ARG, "/anyOf", "before it" },
    { "{'anyOf':[{'properties':{'x':{'enum':['a','b']},'y':{'type':'string'}},'required':['x']},"
      "{'properties':{'x':{'enum':['b','c']},'y':{'type':'integer'}},'required':['x']}]}",
      MMRT_ERR_INVALID_ARG, "/anyOf", "before it" },
    /* patterns: what json_pattern.h refuses, by the byte; lengths they cannot meet */
    { "{'type':'string','pattern':'(a'}", MMRT_ERR_INVALID_ARG, "/pattern", "without" },
    { "{'type':'string','pattern':'a\\\\1'}", MMRT_ERR_INVALID_ARG, "/pattern",
      "back-references" },
    { "{'type':'string','pattern':'a^b'}", MMRT_ERR_INVALID_ARG, "/pattern", "start" },
    { "{'type':'string','pattern':'\\\\bx'}", MMRT_ERR_INVALID_ARG, "/pattern", "boundaries" },
    { "{'type':'string','pattern':'\\\\p{L}'}", MMRT_ERR_INVALID_ARG, "/pattern",
      "properties" },
    { "{'type':'string','pattern':'^[]$'}", MMRT_ERR_INVALID_ARG, "/pattern", "no string" },
    { "{'type':'string','pattern':'a{3,1}'}", MMRT_ERR_INVALID_ARG, "/pattern", "below" },
    { "{'type':'string','pattern':'a{300}'}", MMRT_ERR_LIMIT, "/pattern", "256" },
    { "{'type':'string','pattern':'^(a{0,200}){0,200}$'}", MMRT_ERR_LIMIT, "/pattern", "large" },
    { "{'type':'string','pattern':3}", MMRT_ERR_INVALID_ARG, "/pattern", "string" },
    { "{'type':'string','pattern':'^(ab)*$','minLength':3,'maxLength':3}",
      MMRT_ERR_INVALID_ARG, "/pattern", "between" },
    { "{'type':'string','pattern':'^([a-z][0-9]){0,200}x*$','minLength':2,'maxLength':9000}",
      MMRT_ERR_LIMIT, "/pattern", "tabulates" },
    { "{'type':'string','pattern':'^a{2}$','maxLength':1}", MMRT_ERR_INVALID_ARG, "/pattern",
      "maxLength" },
    { "{'type':'string','pattern':'^a$','minLength':2}", MMRT_ERR_INVALID_ARG, "/pattern",
      "minLength" },
    { "{'type':'string','pattern':'a','enum':['a']}", MMRT_ERR_INVALID_ARG, "", "pattern" },
    /* integer bounds: numbers (draft 4's boolean exclusives are not), some integer between */
    { "{'type':'integer','exclusiveMinimum':true,'minimum':0}", MMRT_ERR_INVALID_ARG,
      "/exclusiveMinimum", "must be a number" },
    { "{'type':'integer','minimum':'1'}", MMRT_ERR_INVALID_ARG, "/minimum", "must be a number" },
    { "{'type':'integer','minimum':5,'maximum':3}", MMRT_ERR_INVALID_ARG, "", "no integer" },
    { "{'type':'integer','minimum':2.5,'maximum':2.9}", MMRT_ERR_INVALID_ARG, "", "no integer" },
    { "{'type':'integer','exclusiveMinimum':3,'exclusiveMaximum':4}", MMRT_ERR_INVALID_ARG, "",
      "no integer" },
    { "{'type':'integer','minimum':1e300}", MMRT_ERR_INVALID_ARG, "/minimum", "int64" },
    { "{'type':'integer','exclusiveMaximum':-9223372036854775808}", MMRT_ERR_INVALID_ARG,
      "/exclusiveMaximum", "int64" },
    /* an integer's multipleOf: a positive integer, some multiple between the bounds */
    { "{'type':'integer','multipleOf':0.5}", MMRT_ERR_INVALID_ARG, "/multipleOf", "0.5" },
    { "{'type':'integer','multipleOf':0}", MMRT_ERR_INVALID_ARG, "/multipleOf", "positive" },
    { "{'type':'integer','multipleOf':-3}", MMRT_ERR_INVALID_ARG, "/multipleOf", "positive" },
    { "{'type':'integer','multipleOf':'2'}", MMRT_ERR_INVALID_ARG, "/multipleOf",
      "must be a number" },
    { "{'type':'integer','multipleOf':10,'minimum':1,'maximum':9}", MMRT_ERR_INVALID_ARG, "",
      "multiple" },
    { "{'type':'integer','multipleOf':10,'minimum':-19,'maximum':-11}", MMRT_ERR_INVALID_ARG,
      "", "multiple" },
    /* a number's bounds: doubles, some number between */
    { "{'type':'number','minimum':2,'maximum':1.5}", MMRT_ERR_INVALID_ARG, "", "no number" },
    { "{'type':'number','exclusiveMinimum':1,'exclusiveMaximum':1}", MMRT_ERR_INVALID_ARG, "",
      "no number" },
    { "{'type':'number','maximum':9007199254740993}", MMRT_ERR_INVALID_ARG, "/maximum",
      "2^53" },
    { "{'type':'number','exclusiveMinimum':1.7976931348623157e308}", MMRT_ERR_INVALID_ARG,
      "/exclusiveMinimum", "finite" },
    { "{'type':'number','minimum':null}", MMRT_ERR_INVALID_ARG, "/minimum", "must be a number" },
    /* no finite document */
    { "false", MMRT_ERR_INVALID_ARG, "", NULL },
    { "{'type':'object','properties':{'e':{'enum':[]}}}", MMRT_ERR_INVALID_ARG, "/properties/e",
      "enum" },
    { "{'type':'object','properties':{'l':{'type':'array','minItems':3,'maxItems':2}}}",
      MMRT_ERR_INVALID_ARG, "/properties/l", "minItems|maxItems" },
    { "{'type':'array','items':{'type':'string','minLength':5,'maxLength':4}}",
      MMRT_ERR_INVALID_ARG, "/items", "minLength|maxLength" },
    { "{'$ref':'#'}", MMRT_ERR_INVALID_ARG, "", "$ref" },
    { "{'type':'object','properties':{'a':{'$ref':'#'}},'required':['a']}", MMRT_ERR_INVALID_ARG,
      "", NULL },
    { "{'type':'array','items':{'$ref':'#'},'minItems':1}", MMRT_ERR_INVALID_ARG, "", NULL },
    /* a requires b, b at least one a: a cycle through two definitions */
    { "{'$defs':{'a':{'type':'object','properties':{'b':{'$ref':'#/$defs/b'}},'required':['b']},"
      "'b':{'type':'array','items':{'$ref':'#/$defs/a'},'minItems':1}},'$ref':'#/$defs/a'}",
      MMRT_ERR_INVALID_ARG, "", NULL },
    /* references mmrt cannot follow */
    { "{'type':'object','properties':{'r':{'$ref':'https://example.com/s.json'}}}",
      MMRT_ERR_INVALID_ARG, "/properties/r", "$ref" },
    { "{'type':'object','properties':{'r':{'$ref':'#/$defs/X'}}}", MMRT_ERR_INVALID_ARG,
      "/properties/r", "$ref|#/$defs/X" },
    /* alternatives a first byte cannot tell apart */
    { "{'type':'object','properties':{'u':{'anyOf':[{'type':'object'},"
      "{'type':'object','properties':{'a':{}}}]}}}",
      MMRT_ERR_INVALID_ARG, "/properties/u", "anyOf" },
    { "{'type':'array','items':{'oneOf':[{'type':'integer'},{'type':'number'}]}}",
      MMRT_ERR_INVALID_ARG, "/items", "oneOf" },
    /* malformed keywords */
    { "{'type':'object','properties':{'f':{'type':'float'}}}", MMRT_ERR_INVALID_ARG,
      "/properties/f", "type|float" },
    { "{'type':'object','properties':{'t':{'type':3}}}", MMRT_ERR_INVALID_ARG, "/properties/t",
      "type" },
    { "{'type':'object','properties':{'o':{'type':'object','properties':{'a':{}},"
      "'required':[1]}}}",
      MMRT_ERR_INVALID_ARG, "/properties/o", "required" },
    { "{'type':'object','properties':{'a':{'allOf':[{'type':'string'},{'maxLength':3}]}}}",
      MMRT_ERR_INVALID_ARG, "/properties/a", "allOf" },
    { "{'type':'object','properties':{'o':{'type':'object','properties':{'a':{}},"
      "'required':'a'}}}",
      MMRT_ERR_INVALID_ARG, "/properties/o", "required" },
    /* tuples: one list, of schemas; minItems within what they allow */
    { "{'type':'object','properties':{'t':{'type':'array','items':[{'type':'string'}],"
      "'prefixItems':[]}}}", MMRT_ERR_INVALID_ARG, "/properties/t/items", "prefixItems" },
    { "{'type':'array','prefixItems':{'type':'string'}}", MMRT_ERR_INVALID_ARG, "/prefixItems",
      "list" },
    { "{'type':'array','prefixItems':[{'type':'string'},{'minimum':'x'}]}",
      MMRT_ERR_INVALID_ARG, "/prefixItems/1/minimum", "must be a number" },
    { "{'type':'array','prefixItems':[{'type':'string'}],'items':false,'minItems':2}",
      MMRT_ERR_INVALID_ARG, "", "minItems" },
    { "{'type':'array','items':[{'type':'string'},false],'minItems':2}",
      MMRT_ERR_INVALID_ARG, "", "minItems" },
    { "{'$defs':{'r':{'type':'array','prefixItems':[{'$ref':'#/$defs/r'}],'minItems':1}},"
      "'$ref':'#/$defs/r'}", MMRT_ERR_INVALID_ARG, "", "finite" },
    { "{'type':'object','properties':[]}", MMRT_ERR_INVALID_ARG, "", "properties" },
    { "{'type':'array','items':{'enum':'a'}}", MMRT_ERR_INVALID_ARG, "/items", "enum" },
    { "{'type':'array','items':{'anyOf':[]}}", MMRT_ERR_INVALID_ARG, "/items", "anyOf" },
    { "{'type':'object','additionalProperties':3}", MMRT_ERR_INVALID_ARG, "",
      "additionalProperties" },
    { "{'type':'object','properties':{'s':{'type':'string','minLength':1.5}}}",
      MMRT_ERR_INVALID_ARG, "/properties/s", "minLength" },
    { "{'type':'object','properties':{'s':{'type':[]}}}", MMRT_ERR_INVALID_ARG, "/properties/s",
      "type" },
    { "{'type':'object','properties':{'r':{'$ref':3}}}", MMRT_ERR_INVALID_ARG, "/properties/r",
      "$ref" },
    { "{'type':'object','properties':{'p':3}}", MMRT_ERR_INVALID_ARG, "/properties/p", NULL },
    { "{'type':'string','maxLength':-1}", MMRT_ERR_INVALID_ARG, "", "maxLength" },
    { "3", MMRT_ERR_INVALID_ARG, "", NULL },
    { "{'type':", MMRT_ERR_INVALID_ARG, NULL, NULL },
    { "{'type':'string'} x", MMRT_ERR_INVALID_ARG, NULL, NULL },
    /* bounds */
    { "{'type':'array','minItems':70000}", MMRT_ERR_LIMIT, "", "minItems" },
    { "{'type':'object','properties':{'s':{'type':'string','minLength':65536}}}", MMRT_ERR_LIMIT,
      "/properties/s", "minLength" },
};

/* Prints a misjudgement and returns false: the tables go on, so that one run lists every
 * case that fails rather than the first. */
static bool failed(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static bool failed(const char *fmt, ...)
{
    char buf[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    print_error("%s\n", buf);
    return false;
}

/* Whether text is refused as want, naming where and one of names; prints what is not. */
static bool check_refusal(const char *text, size_t len, mmrt_status want, const char *where,
                          const char *names)
{
    struct mmrt_json_schema *s = NULL;
    struct mmrt_error err = { 0 };
    const mmrt_status st = mmrt_json_schema_parse(text, len, &s, &err);
    if (st == MMRT_OK) {
        mmrt_json_schema_free(s);
        return failed("schema compiled, should be refused: %s", text);
    }
    if (st != want)
        return failed("%s instead of %s (%s) for: %s", mmrt_status_name(st),
                      mmrt_status_name(want), err.msg, text);
    if (err.status != st)
        return failed("err.status %d, returned %d, for: %s", err.status, st, text);
    if (err.msg[0] == '\0')
        return failed("no message for: %s", text);
    if (where != NULL && strstr(err.msg, "json_schema") == NULL)
        return failed("the message does not say json_schema: '%s' for: %s", err.msg, text);
    if (where != NULL && where[0] != '\0' && !has_word(err.msg, where))
        return failed("the message does not name %s: '%s' for: %s", where, err.msg, text);
    if (names != NULL) {
        char alts[128];
        snprintf(alts, sizeof alts, "%s", names);
        bool found = false;
        for (char *save = NULL, *w = strtok_r(alts, "|", &save); w && !found;
             w = strtok_r(NULL, "|", &save))
            found = has_word(err.msg, w);
        if (!found)
            return failed("the message does not name %s: '%s' for: %s", names, err.msg, text);
    }
    return true;
}

static void test_refusals(void **state)
{
    (void)state;
    int misjudged = 0;
    for (size_t i = 0; i < sizeof refusals / sizeof *refusals; i++) {
        char *text = q(refusals[i].schema);
        misjudged += !check_refusal(text, strlen(text), refusals[i].status, refusals[i].where,
                                    refusals[i].names);
        free(text);
    }
    if (misjudged)
        fail_msg("%d of the refusals misjudged", misjudged);
    /* Nesting past MMRT_JSON_DEFAULT_MAX_DEPTH: refused as text, before any compiling. */
    char deep[1024] = "";
    for (int i = 0; i < 70; i++)
        strcat(deep, "{\"items\":");
    strcat(deep, "{}");
    for (int i = 0; i < 70; i++)
        strcat(deep, "}");
    struct mmrt_json_schema *s = NULL;
    struct mmrt_error err = { 0 };
    assert_int_not_equal(mmrt_json_schema_parse(deep, strlen(deep), &s, &err), MMRT_OK);
    assert_true(err.msg[0] != '\0');
    /* len, not a NUL, ends the text: a valid schema cut short is not JSON */
    const char *whole = "{\"type\":\"string\"}";
    assert_true(check_refusal(whole, strlen(whole) - 1, MMRT_ERR_INVALID_ARG, NULL, NULL));
    /* err may be NULL */
    assert_int_equal(mmrt_json_schema_parse("false", 5, &s, NULL), MMRT_ERR_INVALID_ARG);
    assert_int_equal(mmrt_json_schema_parse("{\"pattern\":\"(\"}", 15, &s, NULL),
                     MMRT_ERR_INVALID_ARG);
}

/* compile on a json_t, and the table bounds, reached with schemas built in memory */
static void test_compile_values_and_bounds(void **state)
{
    (void)state;
    struct mmrt_json_schema *s = NULL;
    struct mmrt_error err = { 0 };
    json_t *v = json_true();
    assert_int_equal(mmrt_json_schema_compile(v, &s, &err), MMRT_OK);
    check_table(s, "true");
    mmrt_json_schema_free(s);
    s = NULL;
    v = json_false();
    assert_int_equal(mmrt_json_schema_compile(v, &s, &err), MMRT_ERR_INVALID_ARG);
    assert_true(err.msg[0] != '\0');
    v = json_integer(3);
    assert_int_equal(mmrt_json_schema_compile(v, &s, &err), MMRT_ERR_INVALID_ARG);
    json_decref(v);
    v = json_string("object");
    assert_int_equal(mmrt_json_schema_compile(v, &s, &err), MMRT_ERR_INVALID_ARG);
    json_decref(v);
    mmrt_json_schema_free(NULL);

    /* more nodes than MMRT_JSON_SCHEMA_MAX_NODES: one per listed property */
    json_t *props = json_object();
    for (unsigned i = 0; i < MMRT_JSON_SCHEMA_MAX_NODES + 16; i++) {
        char key[16];
        snprintf(key, sizeof key, "k%u", i);
        json_object_set_new(props, key, json_pack("{s:s}", "type", "integer"));
    }
    v = json_pack("{s:s, s:o}", "type", "object", "properties", props);
    assert_non_null(v);
    memset(&err, 0, sizeof err);
    assert_int_equal(mmrt_json_schema_compile(v, &s, &err), MMRT_ERR_LIMIT);
    assert_true(err.msg[0] != '\0');
    json_decref(v);

    /* more literals than MMRT_JSON_SCHEMA_MAX_LITERALS, in one enum */
    json_t *values = json_array();
    for (unsigned i = 0; i < MMRT_JSON_SCHEMA_MAX_LITERALS + 16; i++)
        json_array_append_new(values, json_integer(i));
    v = json_pack("{s:o}", "enum", values);
    memset(&err, 0, sizeof err);
    assert_int_equal(mmrt_json_schema_compile(v, &s, &err), MMRT_ERR_LIMIT);
    assert_true(has_word(err.msg, "enum"));
    json_decref(v);

    /* literal text past MMRT_JSON_SCHEMA_MAX_TEXT: three long strings */
    const size_t len = MMRT_JSON_SCHEMA_MAX_TEXT / 2;
    char *big = malloc(len + 1);
    assert_non_null(big);
    values = json_array();
    for (char c = 'a'; c < 'd'; c++) {
        memset(big, c, len);
        big[len] = '\0';
        json_array_append_new(values, json_string(big));
    }
    free(big);
    v = json_pack("{s:o}", "enum", values);
    memset(&err, 0, sizeof err);
    assert_int_equal(mmrt_json_schema_compile(v, &s, &err), MMRT_ERR_LIMIT);
    json_decref(v);

    /* just inside the count bound */
    s = compile_ok("{'type':'array','maxItems':65535}");
    mmrt_json_schema_free(s);
}

/* What must compile: annotations read past (their values never read as schemas), a type
 * list, integer giving way to number, a finite recursion, and the ready-made object mode. */
static void test_accepted_schemas(void **state)
{
    (void)state;
    static const char *const ok[] = {
        "{'$schema':'https://json-schema.org/draft/2020-12/schema','$id':'urn:x','$comment':'c',"
        "'title':'T','description':'minimum and pattern, in prose','type':'object',"
        "'properties':{'d':{'type':'string','format':'date','default':{'pattern':'x'},"
        "'examples':[{'minimum':1}],'deprecated':true,'readOnly':true,'writeOnly':false}}}",
        "{'type':['string','null']}",
        "{'anyOf':[{'type':'integer'},{'type':'number'}]}",
        "{'$defs':{'node':{'type':'object','properties':{'v':{'type':'integer'},"
        "'kids':{'type':'array','items':{'$ref':'#/$defs/node'}}},'required':['v']}},"
        "'$ref':'#/$defs/node'}",
        "{'definitions':{'s':{'type':'string'}},'type':'array','items':{'$ref':'#/definitions/s'}}",
        "{'type':'object','properties':{'a':{'$ref':'#'}}}",
        "{'type':'array','items':{'$ref':'#'}}",
        "{'allOf':[{'type':'integer'}]}",
        "{'oneOf':[{'type':'string'},{'type':'array'}]}",
        "{'type':'object','additionalProperties':false}",
        "{'enum':[1,'a',null,true,false,[1],{'k':2}]}",
        "{'const':{'a':[1,{'b':null}]}}",
        "{}",
        "true",
    };
    for (size_t i = 0; i < sizeof ok / sizeof *ok; i++) {
        mmrt_json_schema_free(compile_ok(ok[i]));
        if (strcmp(ok[i], "true") != 0) /* test_parse_true */
            mmrt_json_schema_free(parse_ok(ok[i]));
    }

    struct mmrt_json_schema *s = NULL;
    struct mmrt_error err = { 0 };
    assert_int_equal(mmrt_json_schema_any_object(&s, &err), MMRT_OK);
    check_table(s, "any_object");
    assert_int_equal(s->node[s->root].kind, MMRT_JSON_OBJECT);
    mmrt_json_schema_free(s);

    /* integer beside number: the number class goes to a NUMBER node, or 1.5 would be cut */
    s = compile_ok("{'anyOf':[{'type':'integer'},{'type':'number'}]}");
    uint16_t n = s->root;
    if (s->node[n].kind == MMRT_JSON_UNION)
        n = s->node[n].alt[MMRT_JSON_CLASS_NUMBER];
    assert_true(n < s->n_nodes);
    assert_int_equal(s->node[n].kind, MMRT_JSON_NUMBER);
    mmrt_json_schema_free(s);

    /* a type list is a union by first byte */
    s = compile_ok("{'type':['string','null']}");
    const struct mmrt_json_node *u = &s->node[s->root];
    assert_int_equal(u->kind, MMRT_JSON_UNION);
    for (int c = 0; c < MMRT_JSON_CLASSES; c++)
        assert_int_equal(u->alt[c] != MMRT_JSON_NONE,
                         c == MMRT_JSON_CLASS_STRING || c == MMRT_JSON_CLASS_NULL);
    assert_int_equal(s->node[u->alt[MMRT_JSON_CLASS_STRING]].kind, MMRT_JSON_STRING);
    mmrt_json_schema_free(s);

    /* an enum's literals are sorted, a literal before those it is a prefix of */
    s = compile_ok("{'enum':[10,'b',1,'a',100]}");
    const struct mmrt_json_node *e = &s->node[s->root];
    assert_int_equal(e->kind, MMRT_JSON_LITERALS);
    assert_int_equal(e->n, 5);
    static const char *const sorted[] = { "\"a\"", "\"b\"", "1", "10", "100" };
    for (uint32_t i = 0; i < 5; i++) {
        const struct mmrt_json_literal *l = &s->lit[e->lit + i];
        assert_int_equal(l->len, strlen(sorted[i]));
        assert_memory_equal(s->text + l->off, sorted[i], l->len);
    }
    mmrt_json_schema_free(s);

    /* listed keys keep the schema's order in props, their literals sorted by bytes */
    s = compile_ok("{'type':'object','properties':{'b':{'type':'integer'},'a':{'type':'string'}},"
                   "'required':['a']}");
    const struct mmrt_json_node *o = &s->node[s->root];
    assert_int_equal(o->kind, MMRT_JSON_OBJECT);
    assert_int_equal(o->n, 2);
    assert_int_equal(s->node[s->prop[o->first].node].kind, MMRT_JSON_INTEGER);
    assert_false(s->prop[o->first].required);
    assert_int_equal(s->node[s->prop[o->first + 1].node].kind, MMRT_JSON_STRING);
    assert_true(s->prop[o->first + 1].required);
    assert_memory_equal(s->text + s->lit[o->lit].off, "\"a\"", 3);
    assert_int_equal(s->lit[o->lit].prop, 1);
    mmrt_json_schema_free(s);
}

/* The text "true" is a schema as the value true is: parse promises to compile what it
 * parses, and a request may hand the schema over as text. */
static void test_parse_true(void **state)
{
    (void)state;
    struct mmrt_json_schema *s = parse_ok("true");
    struct mmrt_json_grammar g;
    mmrt_json_grammar_init(&g, s);
    assert_true(mmrt_json_grammar_feed(&g, "[1]", 3));
    assert_true(mmrt_json_grammar_done(&g));
    mmrt_json_schema_free(s);
}

/* ---------------------------------------------------------------------------------------- */
/* documents against schemas */

/* Whether feeding doc cut at `cut` into two feeds ends a whole document. */
static bool feed_cut(const struct mmrt_json_schema *s, const char *doc, size_t n, size_t cut)
{
    struct mmrt_json_grammar g;
    mmrt_json_grammar_init(&g, s);
    return mmrt_json_grammar_feed(&g, doc, cut) && mmrt_json_grammar_feed(&g, doc + cut, n - cut) &&
           mmrt_json_grammar_done(&g);
}

/* Whether doc (raw bytes) is admitted: at every cut, byte by byte, and through a copy. */
static bool check_good(const struct mmrt_json_schema *s, const char *schema, const char *doc)
{
    const size_t n = strlen(doc);
    for (size_t cut = 0; cut <= n; cut++) {
        struct mmrt_json_grammar g, c;
        mmrt_json_grammar_init(&g, s);
        if (!mmrt_json_grammar_feed(&g, doc, cut))
            return failed("prefix of %zu bytes refused\n  schema: %s\n  doc: %s", cut, schema,
                          doc);
        /* the copy's frames past the depth are garbage: copy promises the open ones only */
        memset(&c, 0xa5, sizeof c);
        mmrt_json_grammar_copy(&c, &g);
        if (!mmrt_json_grammar_feed(&g, doc + cut, n - cut) || !mmrt_json_grammar_done(&g))
            return failed("cut at %zu: not accepted whole\n  schema: %s\n  doc: %s", cut,
                          schema, doc);
        if (!mmrt_json_grammar_feed(&c, doc + cut, n - cut) || !mmrt_json_grammar_done(&c))
            return failed("a copy at %zu does not go on as the original\n  schema: %s\n"
                          "  doc: %s", cut, schema, doc);
    }
    struct mmrt_json_grammar g;
    mmrt_json_grammar_init(&g, s);
    for (size_t i = 0; i < n; i++)
        if (!mmrt_json_grammar_feed(&g, doc + i, 1))
            return failed("byte by byte: byte %zu refused\n  schema: %s\n  doc: %s", i,
                          schema, doc);
    if (!mmrt_json_grammar_done(&g))
        return failed("byte by byte: not done\n  schema: %s\n  doc: %s", schema, doc);
    return true;
}

/* Whether doc is outside: no cut makes it a whole document. */
static bool check_bad(const struct mmrt_json_schema *s, const char *schema, const char *doc)
{
    const size_t n = strlen(doc);
    for (size_t cut = 0; cut <= n; cut++)
        if (feed_cut(s, doc, n, cut))
            return failed("accepted as a whole document (cut at %zu)\n  schema: %s\n  doc: %s",
                          cut, schema, doc);
    return true;
}

#define DOCS(...) ((const char *const[]){ __VA_ARGS__, NULL })

struct doc_case {
    const char *schema;       /* ' for " */
    const char *const *good;  /* NULL-ended; ' for " */
    const char *const *bad;
};

/* A top-level number is done only once a whitespace byte follows it, so those documents end
 * in one. */
static const struct doc_case doc_cases[] = {
    /* required and optional properties, in the schema's order */
    { "{'type':'object','properties':{'name':{'type':'string'},'age':{'type':'integer'},"
      "'tags':{'type':'array','items':{'type':'string'}}},'required':['name']}",
      DOCS("{'name':'Ann'}", "{'name':'Ann','age':30}", "{'name':'Ann','tags':['a','b']}",
           "{'name':'Ann','age':-4,'tags':[]}", "{ 'name' : 'A\\u00e9' , 'age' : 0 }",
           " {'name':''}", "{'name':'x'}\n", "{\n  'name': 'x',\n  'age': 7\n}",
           "{'name':'\\'\\\\\\/\\b\\f\\n\\r\\t'}"),
      DOCS("{}", "{'age':30}", "{'age':30,'name':'x'}", "{'name':'x','name':'y'}",
           "{'name':'x','extra':1}", "{'name':'x','age':1.0}", "{'name':'x','age':1e2}",
           "{'name':'x','age':'1'}", "{'name':1}", "{'name':'x',}", "  {'name':'x'}",
           "{'name':'x','tags':[1]}", "{'name':'x'} x", "{'nam\\u0065':'x'}",
           "{'name':'x','age':01}", "{'name':'x','tags':['a'],'age':1}", "{'name'}",
           "{'Name':'x'}", "{'name':'x'}{}", "['name']") },
    /* closing early only once no required property remains */
    { "{'type':'object','properties':{'a':{'type':'integer'},'b':{'type':'integer'},"
      "'c':{'type':'integer'}},'required':['c']}",
      DOCS("{'c':1}", "{'a':1,'c':3}", "{'b':2,'c':3}", "{'a':1,'b':2,'c':3}"),
      DOCS("{'a':1}", "{'a':1,'b':2}", "{}", "{'c':3,'a':1}", "{'b':2,'a':1,'c':3}",
           "{'a':1,'c':3,'c':3}") },
    { "{'type':'object','properties':{'x':{'type':'boolean'},'y':{'type':'null'}}}",
      DOCS("{}", "{ }", "{'x':true}", "{'y':null}", "{'x':false,'y':null}"),
      DOCS("{'y':null,'x':true}", "{'x':null}", "{'z':1}", "{'x':tru}", "{'x':true,}") },
    { "{'type':'object','properties':{'a':{'type':'string'}},'additionalProperties':false}",
      DOCS("{}", "{'a':'s'}"), DOCS("{'b':1}", "{'a':'s','b':1}") },
    /* listed keys as the minimal JSON escape of them: raw UTF-8, \" for a quote */
    { "{'type':'object','properties':{'q\\'k':{'type':'integer'},'\xc3\xa9':{'type':'integer'}},"
      "'required':['\xc3\xa9']}",
      DOCS("{'q\\'k':1,'\xc3\xa9':2}", "{'\xc3\xa9':2}"),
      DOCS("{'q\\u0022k':1,'\xc3\xa9':2}", "{'\\u00e9':2}", "{'\\u00E9':2}") },
    /* listed properties whose schema is true or {}: any value */
    { "{'type':'object','properties':{'a':true,'b':{}},'required':['a','b']}",
      DOCS("{'a':[1,{'x':null}],'b':'s'}", "{'a':{},'b':-0.5e3}"),
      DOCS("{'a':1}", "{'b':1,'a':2}", "{'a':[1,],'b':1}") },
    /* free keys: additionalProperties absent, true, a schema, false */
    { "{'type':'object'}",
      DOCS("{}", "{'any':[1,{'b':null}],'k':'v'}", "{'':0}", "{'\\u00e9\\'':true}"),
      DOCS("[]", "'s'", "{'a'}", "{'a':1,}", "null") },
    { "{'type':'object','additionalProperties':true}",
      DOCS("{'x':{'y':[]}}"), DOCS("{x:1}") },
    { "{'type':'object','additionalProperties':{'type':'integer'}}",
      DOCS("{}", "{'a':1,'b':-2,'':3}", "{'\\u00e9\\'':5}"),
      DOCS("{'a':'x'}", "{'a':1.5}", "{'a':[1]}", "{'a':null}") },
    { "{'type':'object','additionalProperties':false}", DOCS("{}", "{ }"),
      DOCS("{'a':1}", "{''}") },
    /* arrays */
    { "{'type':'array','items':{'type':'integer'},'minItems':1,'maxItems':3}",
      DOCS("[1]", "[1,2,3]", "[ 1 , 2 ]", "[-0]"),
      DOCS("[]", "[1,2,3,4]", "[1.5]", "['1']", "[1,]", "[,1]", "[1 2]") },
    { "{'type':'array'}", DOCS("[]", "[1,'a',{'b':[null]}]", "[[[]]]"), DOCS("{}", "[1,]") },
    /* free keys counted (Pydantic's dict with min_length, max_length); listed keys only
     * where every document of them satisfies the counts */
    { "{'type':'object','additionalProperties':{'type':'number'},'minProperties':1,"
      "'maxProperties':2}", DOCS("{'a':1}", "{'a':1,'b':2.5}", "{ 'x' : 0 }"),
      DOCS("{}", "{'a':1,'b':2,'c':3}", "{'a':'x'}") },
    { "{'type':'object','maxProperties':0}", DOCS("{}", "{ }"), DOCS("{'a':1}") },
    { "{'type':'object','properties':{'a':{},'b':{}},'required':['a'],'minProperties':1,"
      "'maxProperties':2}", DOCS("{'a':1}", "{'a':1,'b':2}"), DOCS("{}", "{'b':1}") },
    /* uniqueItems over an enum's values (Pydantic's set[Enum]): each at most once */
    { "{'type':'array','items':{'enum':['red','green','blue',1,10,null]},'uniqueItems':true}",
      DOCS("['red','green']", "[1,10]", "[10,1]", "[]", "[null,'blue',1,10,'green','red']"),
      DOCS("['red','red']", "[1,1]", "[10,10]", "[null,null]",
           "['red','green','blue',1,10,null,'red']") },
    { "{'$defs':{'C':{'enum':['x','y'],'type':'string'}},'type':'object','properties':{'s':"
      "{'type':'array','items':{'$ref':'#/$defs/C'},'uniqueItems':true},"
      "'t':{'type':'array','items':{'$ref':'#/$defs/C'},'uniqueItems':false}}}",
      DOCS("{'s':['x','y']}", "{'s':['y'],'t':['x','x']}"), DOCS("{'s':['x','x']}") },
    { "{'type':'array','items':{'type':'boolean'},'uniqueItems':true,'maxItems':5}",
      DOCS("[true,false]", "[false]"), DOCS("[true,true]", "[false,true,false]") },
    /* tuples: prefixItems (Pydantic's tuple[...]) with items for the rest, or the older
     * items as a list with additionalItems */
    { "{'type':'array','prefixItems':[{'type':'number','minimum':0,'maximum':1},"
      "{'type':'number','minimum':0,'maximum':1},{'type':'number','minimum':0,'maximum':1},"
      "{'type':'number','minimum':0,'maximum':1}],'minItems':4,'maxItems':4}",
      DOCS("[0.1,0.2,0.9,1]", "[0, 0, 1.0, 0.5]"),
      DOCS("[0.1,0.2,0.9]", "[0.1,0.2,0.9,1,0]", "[0.1,0.2,1.5,1]", "[]") },
    { "{'type':'array','prefixItems':[{'type':'number'},{'type':'string'}],'minItems':2,"
      "'maxItems':2}", DOCS("[1,'a']", "[1.5, 'x']"), DOCS("[1]", "['a',1]", "[1,'a',2]") },
    { "{'prefixItems':[{'const':'x'}],'items':{'type':'integer'}}",
      DOCS("['x']", "['x',1,2]", "[]"), DOCS("[1]", "['x','y']", "['x',1,'z']") },
    { "{'type':'array','prefixItems':[{'type':'integer'},{'type':'integer'}],'items':false}",
      DOCS("[]", "[1]", "[1,2]"), DOCS("[1,2,3]", "['a']") },
    { "{'type':'array','items':[{'type':'string'},{'type':'boolean'}],'additionalItems':false,"
      "'minItems':2}", DOCS("['a',true]"), DOCS("['a']", "['a',true,1]", "[true,'a']") },
    { "{'type':'array','items':[{'type':'null'}],'additionalItems':{'type':'string'}}",
      DOCS("[null,'a','b']", "[null]", "[]"), DOCS("[null,null]", "['a']") },
    /* an optional tuple item with no finite document: the array ends before it */
    { "{'$defs':{'inf':{'type':'array','minItems':1,'items':{'$ref':'#/$defs/inf'}}},"
      "'type':'array','prefixItems':[{'type':'integer'},{'$ref':'#/$defs/inf'}]}",
      DOCS("[1]", "[]"), DOCS("[1,[]]", "[1,[[]]]", "[1,2]") },
    { "{'type':'array','maxItems':0}", DOCS("[]", "[ ]"), DOCS("[1]", "[[]]") },
    { "{'type':'array','items':{'type':'array','items':{'type':'object',"
      "'properties':{'id':{'type':'integer'}},'required':['id']}}}",
      DOCS("[]", "[[{'id':1},{'id':2}],[]]", "[[{'id':-9}]]"),
      DOCS("[[{}]]", "[{'id':1}]", "[[{'id':1,'id':2}]]", "[[{'id':'1'}]]") },
    /* string lengths count code points: a multibyte character, an escape, a \u pair each one */
    { "{'type':'string','minLength':2,'maxLength':3}",
      DOCS("'ab'", "'abc'", "'\xc3\xa9\xe2\x82\xac'", "'\\n\\t'", "'\\uD83D\\uDE00a'",
           "'\xf0\x9f\x98\x80\xf0\x9f\x98\x80\xf0\x9f\x98\x80'", "'a\\u00e9'", "'\\\\\\''"),
      DOCS("'a'", "''", "'abcd'", "'\xc3\xa9\xc3\xa9\xe2\x82\xac\xe2\x82\xac'", "'\\uD83D\\uDE00'",
           "'\\u0041\\u0042\\u0043\\u0044'", "'ab\\n\\t'", "ab") },
    { "{'type':'string','maxLength':1}",
      DOCS("''", "'\\uD83D\\uDE00'", "'\xf0\x9f\x98\x80'", "'\\u0000'"),
      DOCS("'ab'", "'\\uD83D\\uDE00\\uD83D\\uDE00'", "'\xf0\x9f\x98\x80 '") },
    { "{'type':'string'}", DOCS("''", "'a b  c'", "'\\uD83D\\uDE00'"),
      DOCS("1 ", "'a\nb'", "'\\x'", "'\\u12G4'") },
    /* integer against number */
    { "{'type':'integer'}", DOCS("12 ", "-3 ", "0 ", "12\n", "-0 "),
      DOCS("1.0 ", "1e2 ", "01 ", "- ", "'1'", "12", "+1 ", "1 2 ", "1E2 ") },
    /* integers held to bounds: every digit taken only when some integer it begins fits */
    { "{'type':'integer','minimum':-5,'maximum':120}",
      DOCS("0 ", "-0 ", "-5 ", "7 ", "99 ", "120 ", "100\n", "-1 "),
      DOCS("121 ", "-6 ", "130 ", "1000 ", "-10 ", "200 ", "-50 ") },
    { "{'type':'integer','exclusiveMinimum':10,'exclusiveMaximum':12}", DOCS("11 "),
      DOCS("10 ", "12 ", "1 ", "0 ", "-11 ", "111 ") },
    { "{'type':'integer','minimum':1000}", DOCS("1000 ", "99999999999 ", "1001 "),
      DOCS("999 ", "0 ", "-1000 ", "99999999999999999999 ") },
    { "{'type':'integer','maximum':-3}", DOCS("-3 ", "-40 ", "-9223372036854775808 "),
      DOCS("-2 ", "0 ", "-0 ", "5 ", "-9223372036854775809 ") },
    { "{'type':'integer','minimum':0.5,'maximum':2.5}", DOCS("1 ", "2 "), DOCS("0 ", "3 ") },
    { "{'type':'integer','minimum':-9223372036854775808,'maximum':9223372036854775807}",
      DOCS("9223372036854775807 ", "-9223372036854775808 ", "0 "),
      DOCS("9223372036854775808 ", "-9223372036854775809 ") },
    { "{'type':'object','properties':{'age':{'type':'integer','minimum':0,'maximum':150}},"
      "'required':['age']}", DOCS("{'age':42}", "{'age':150}", "{'age':0}"),
      DOCS("{'age':151}", "{'age':-1}", "{'age':1000}") },
    /* integers held to multiples, with bounds or without (then within int64) */
    { "{'type':'integer','multipleOf':5,'minimum':-12,'maximum':23}",
      DOCS("0 ", "5 ", "20 ", "-10 ", "15 ", "-0 "),
      DOCS("23 ", "25 ", "-15 ", "3 ", "12 ", "21 ", "-11 ") },
    { "{'type':'integer','multipleOf':7}", DOCS("7 ", "700 ", "-21 ", "0 ", "-7 "),
      DOCS("13 ", "22 ", "-1 ", "1.0 ") },
    { "{'multipleOf':3.0,'maximum':100}", DOCS("99 ", "-3 "), DOCS("100 ", "102 ", "4 ") },
    /* numbers held to bounds: decimals without exponent, each digit taken only when some
     * number it begins fits; a bound's shortest decimal counts as the bound (0.1 is the
     * double 0.1000000000000000055…) */
    { "{'type':'number','minimum':0,'maximum':1}",
      DOCS("0 ", "1 ", "0.5 ", "1.0 ", "1.000 ", "0.999 ", "-0 ", "-0.0 ", "0.0000001 "),
      DOCS("1.01 ", "-0.1 ", "2 ", "1e0 ", "10 ", "-1 ", "1.1 ", "-0.001 ", "01 ", "0.5e1 ") },
    { "{'type':'number','exclusiveMinimum':0,'maximum':1e-5}",
      DOCS("0.00001 ", "0.000010 ", "0.00000000000001 ", "0.000003 "),
      DOCS("0 ", "0.0 ", "-0 ", "1 ", "0.0000100001 ", "-0.000001 ", "0.00002 ") },
    { "{'type':'number','minimum':100,'maximum':250.5}",
      DOCS("100 ", "250.5 ", "199.99 ", "250 ", "100.000 ", "250.50 "),
      DOCS("99.9 ", "250.51 ", "251 ", "1000 ", "99 ", "50 ", "3 ", "0 ", "-100 ") },
    { "{'minimum':-2.5,'exclusiveMaximum':10}",
      DOCS("-2.5 ", "-2.49 ", "9.99 ", "0 ", "-0 ", "9.999999999999998 "),
      DOCS("10 ", "10.0 ", "-2.51 ", "-3 ", "11 ", "100 ", "9.9999999999999983 ") },
    { "{'type':'number','minimum':0.1,'maximum':0.3}", DOCS("0.1 ", "0.3 ", "0.2 ", "0.25 "),
      DOCS("0.09 ", "0.31 ", "0 ", "1 ", "0.30000000000000002 ") },
    { "{'type':'number','maximum':-1000.25}", DOCS("-1000.25 ", "-5000 ", "-1000.3 "),
      DOCS("-1000.2 ", "-999 ", "0 ", "-0 ", "1000.25 ", "-100 ") },
    { "{'type':'number','minimum':1e20}",
      DOCS("100000000000000000000 ", "100000000000000000000.5 ", "200000000000000000000 "),
      DOCS("99999999999999999999 ", "1 ", "-100000000000000000000 ") },
    { "{'type':'object','properties':{'p':{'type':'number','minimum':0,'maximum':1},"
      "'n':{'type':['number','null'],'exclusiveMaximum':0}},'required':['p']}",
      DOCS("{'p':0.75}", "{'p':1,'n':-2.5}", "{'p':0,'n':null}"),
      DOCS("{'p':1.5}", "{'p':0.5,'n':0}", "{'p':0.5,'n':1}", "{'p':-1}") },
    { "{'type':'number'}", DOCS("1.5 ", "-0.25e+3 ", "7 ", "1E2 ", "0.0 ", "-1e-9 "),
      DOCS("1. ", ".5 ", "+1 ", "1e ", "0x1 ", "1.5", "-01 ", "NaN ") },
    { "{'type':'array','items':{'type':'number'}}", DOCS("[1.5,2,-3e-2]", "[0,-0.0]"),
      DOCS("[1.]", "[.1]") },
    { "{'type':'boolean'}", DOCS("true", "false", " true"), DOCS("null", "tru", "True", "1 ") },
    { "{'type':'null'}", DOCS("null"), DOCS("nul", "false", "nulll") },
    /* enum: compact literals, byte for byte; 1 a prefix of 10 */
    { "{'enum':['red','green',1,10,null,true,{'k':[1,2]},[3],'\xc3\xa9','a\\'b']}",
      DOCS("'red'", "'green'", "1 ", "10 ", "null", "true", "{'k':[1,2]}", "[3]", " 'red'",
           "'\xc3\xa9'", "'a\\'b'"),
      DOCS("'blue'", "'re'", "false", "{'k': [1,2]}", "{'k':[1, 2]}", "{ 'k':[1,2]}", "[ 3]",
           "100 ", "2 ", "'Red'", "'r\\u0065d'", "1.0 ", "'red' x", "1", "'\\u00e9'",
           "'a\\u0022b'", "1e1 ", "'red ") },
    { "{'type':'array','items':{'enum':[1,10]}}", DOCS("[1,10,1]", "[10]", "[1 , 10 ]"),
      DOCS("[100]", "[2]", "[11]", "[1 0]", "[1.0]", "[-1]") },
    { "{'type':'object','properties':{'a':{'enum':[1,10]},'b':{'type':'null'}}}",
      DOCS("{'a':1}", "{'a':10}", "{'a':1,'b':null}", "{'a':1 }"), DOCS("{'a':1'b':null}") },
    { "{'type':'object','properties':{'v':{'const':'x'},'n':{'const':3}},'required':['v','n']}",
      DOCS("{'v':'x','n':3}", "{ 'v' : 'x' , 'n' : 3 }"),
      DOCS("{'v':'y','n':3}", "{'v':'x','n':30}", "{'v':'x','n':3.0}", "{'v':'x'}") },
    { "{'const':{'a':[1,{'b':null}]}}", DOCS("{'a':[1,{'b':null}]}"),
      DOCS("{'a':[1,{'b':null}] }x", "{'a':[1,{'b':null }]}", "{'a':[1]}") },
    /* unions: type lists, anyOf, oneOf, allOf of one */
    { "{'type':['string','null']}", DOCS("'a'", "null", "''"),
      DOCS("1 ", "nul", "[]", "true") },
    { "{'anyOf':[{'type':'string','maxLength':2},{'type':'null'}]}", DOCS("'ab'", "null"),
      DOCS("'abc'", "{}") },
    { "{'anyOf':[{'type':'integer'},{'type':'number'}]}", DOCS("1.5 ", "2 ", "-1e3 "),
      DOCS("'x'", "1.") },
    { "{'type':'object','properties':{'opt':{'anyOf':[{'type':'array','items':"
      "{'type':'integer'}},{'type':'null'}],'default':null,'title':'Opt'}}}",
      DOCS("{'opt':null}", "{'opt':[1,2]}", "{}"), DOCS("{'opt':[null]}", "{'opt':1}") },
    { "{'anyOf':[{'enum':['a','b']},{'const':'c'},{'type':'integer'},"
      "{'type':'object','properties':{'k':{'type':'boolean'}},'required':['k']}]}",
      DOCS("'a'", "'c'", "5 ", "{'k':true}"), DOCS("'d'", "{}", "true", "1.5 ") },
    { "{'oneOf':[{'type':'string'},{'type':'array','items':{'type':'boolean'}}]}",
      DOCS("'s'", "[true]", "[]"), DOCS("[1]", "1 ") },
    { "{'allOf':[{'type':'integer'}]}", DOCS("3 "), DOCS("'3'", "3.5 ") },
    /* recursion through $defs, definitions and # */
    { "{'$defs':{'node':{'type':'object','properties':{'v':{'type':'integer'},"
      "'kids':{'type':'array','items':{'$ref':'#/$defs/node'}}},'required':['v']}},"
      "'$ref':'#/$defs/node'}",
      DOCS("{'v':1}", "{'v':1,'kids':[]}", "{'v':1,'kids':[{'v':2},{'v':3,'kids':[{'v':4}]}]}"),
      DOCS("{'v':1,'kids':[{}]}", "{'kids':[]}", "{'v':1,'kids':[{'v':2,'x':1}]}",
           "{'v':1,'kids':{}}") },
    { "{'definitions':{'s':{'type':'string'}},'type':'array','items':{'$ref':'#/definitions/s'}}",
      DOCS("['a']", "[]"), DOCS("[1]") },
    { "{'type':'object','properties':{'a':{'$ref':'#'},'b':{'type':'integer'}}}",
      DOCS("{'a':{'a':{'b':1}},'b':2}", "{}", "{'a':{}}"), DOCS("{'a':1}", "{'b':2,'a':{}}") },
    /* r has no finite document: an optional key or an alternative of it is never written */
    { "{'$defs':{'r':{'type':'array','items':{'$ref':'#/$defs/r'},'minItems':1}},"
      "'type':'object','properties':{'a':{'$ref':'#/$defs/r'},'b':{'type':'integer'},"
      "'c':{'anyOf':[{'type':'null'},{'$ref':'#/$defs/r'}]}}}",
      DOCS("{}", "{'b':1}", "{'c':null}"), DOCS("{'a':[]}", "{'a':[[]]}", "{'c':[]}") },
};

static void test_documents(void **state)
{
    (void)state;
    int misjudged = 0;
    for (size_t i = 0; i < sizeof doc_cases / sizeof *doc_cases; i++) {
        const struct doc_case *c = &doc_cases[i];
        struct mmrt_json_schema *s = compile_ok(c->schema);
        char *schema = q(c->schema);
        for (const char *const *d = c->good; *d; d++) {
            char *doc = q(*d);
            misjudged += !check_good(s, schema, doc);
            free(doc);
        }
        for (const char *const *d = c->bad; *d; d++) {
            char *doc = q(*d);
            misjudged += !check_bad(s, schema, doc);
            free(doc);
        }
        free(schema);
        mmrt_json_schema_free(s);
    }
    if (misjudged)
        fail_msg("%d documents misjudged", misjudged);
}

/* An enum or const beside other assertions of the same schema: JSON Schema holds a value
 * to all of them, so a literal the others rule out must never be written (json_schema.h:
 * assertions are never ignored). Refusing the schema is the other honest answer. */
static void test_enum_beside_assertions(void **state)
{
    (void)state;
    static const struct {
        const char *schema, *outside;
    } cases[] = {
        { "{'type':'string','enum':['a','bb'],'maxLength':1}", "'bb'" },
        { "{'enum':['a','bbb'],'minLength':2}", "'a'" },
        { "{'const':'abc','maxLength':1}", "'abc'" },
        { "{'type':'integer','enum':[1,'a']}", "'a'" },
        { "{'type':'array','items':{'type':'integer'},'enum':[[1],['a']]}", "['a']" },
        { "{'type':'array','enum':[[1],[1,2,3]],'maxItems':2}", "[1,2,3]" },
        { "{'type':'object','properties':{'a':{'type':'integer'}},'required':['a'],"
          "'enum':[{'a':1},{'b':2}]}",
          "{'b':2}" },
    };
    int misjudged = 0;
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char *text = q(cases[i].schema), *doc = q(cases[i].outside);
        struct mmrt_json_schema *s = NULL;
        struct mmrt_error err = { 0 };
        const mmrt_status st = mmrt_json_schema_parse(text, strlen(text), &s, &err);
        if (st == MMRT_OK) {
            check_table(s, text);
            misjudged += !check_bad(s, text, doc);
            mmrt_json_schema_free(s);
        } else if (st != MMRT_ERR_INVALID_ARG || strstr(err.msg, "json_schema") == NULL) {
            misjudged += !failed("%s '%s' for: %s", mmrt_status_name(st), err.msg, text);
        }
        free(doc);
        free(text);
    }
    if (misjudged)
        fail_msg("%d of the schemas write a literal their other assertions rule out", misjudged);
}

/* Counts near MMRT_JSON_SCHEMA_MAX_COUNT: an array's count saturates in 16 bits, so the
 * largest maxItems must still stop the item after it, and no bound means any number. */
static void test_long_counts(void **state)
{
    (void)state;
    const size_t n = MMRT_JSON_SCHEMA_MAX_COUNT + 2;
    char *doc = malloc(2 * n + 2);
    assert_non_null(doc);
    doc[0] = '[';
    for (size_t i = 0; i < n; i++)
        doc[1 + 2 * i] = '1', doc[2 + 2 * i] = ',';
    struct mmrt_json_grammar g;

    struct mmrt_json_schema *s = compile_ok("{'type':'array','maxItems':65535}");
    mmrt_json_grammar_init(&g, s);
    /* 65535 items, then ']' closes and a 65536th is refused */
    assert_true(mmrt_json_grammar_feed(&g, doc, 2 * MMRT_JSON_SCHEMA_MAX_COUNT));
    struct mmrt_json_grammar h;
    mmrt_json_grammar_copy(&h, &g);
    assert_true(mmrt_json_grammar_feed(&h, "]", 1));
    assert_true(mmrt_json_grammar_done(&h));
    assert_false(mmrt_json_grammar_feed(&g, ",", 1) && mmrt_json_grammar_feed(&g, "1", 1));
    mmrt_json_schema_free(s);

    s = compile_ok("{'type':'array','minItems':65535}");
    mmrt_json_grammar_init(&g, s);
    assert_true(mmrt_json_grammar_feed(&g, doc, 2 * MMRT_JSON_SCHEMA_MAX_COUNT - 2));
    mmrt_json_grammar_copy(&h, &g);
    assert_false(mmrt_json_grammar_feed(&h, "]", 1)); /* 65534 items */
    assert_true(mmrt_json_grammar_feed(&g, ",1]", 3));
    assert_true(mmrt_json_grammar_done(&g));
    mmrt_json_schema_free(s);

    s = compile_ok("{'type':'array','items':{'type':'integer'}}");
    mmrt_json_grammar_init(&g, s);
    assert_true(mmrt_json_grammar_feed(&g, doc, 2 * n));
    assert_true(mmrt_json_grammar_feed(&g, "1]", 2));
    assert_true(mmrt_json_grammar_done(&g));
    mmrt_json_schema_free(s);

    /* strings: characters, not items; the count is wider, but the bounds are the same */
    memset(doc, 'a', 2 * n);
    doc[0] = '"';
    s = compile_ok("{'type':'string','maxLength':65535}");
    mmrt_json_grammar_init(&g, s);
    assert_true(mmrt_json_grammar_feed(&g, doc, 1 + MMRT_JSON_SCHEMA_MAX_COUNT));
    mmrt_json_grammar_copy(&h, &g);
    assert_true(mmrt_json_grammar_feed(&h, "\"", 1));
    assert_true(mmrt_json_grammar_done(&h));
    assert_false(mmrt_json_grammar_feed(&g, "a", 1));
    mmrt_json_schema_free(s);
    s = compile_ok("{'type':'string'}");
    mmrt_json_grammar_init(&g, s);
    assert_true(mmrt_json_grammar_feed(&g, doc, 2 * n));
    assert_true(mmrt_json_grammar_feed(&g, "\"", 1));
    assert_true(mmrt_json_grammar_done(&g));
    mmrt_json_schema_free(s);

    /* A maximum past the bound is held to the bound: fewer characters than the schema
     * allows still satisfy it, where no bound at all would let 70,001 through. */
    s = compile_ok("{'type':'string','maxLength':70000}");
    mmrt_json_grammar_init(&g, s);
    assert_true(mmrt_json_grammar_feed(&g, doc, 1 + MMRT_JSON_SCHEMA_MAX_COUNT));
    assert_false(mmrt_json_grammar_in_string(&g)); /* still counted */
    mmrt_json_grammar_copy(&h, &g);
    assert_false(mmrt_json_grammar_feed(&h, "a", 1));
    assert_true(mmrt_json_grammar_feed(&g, "\"", 1));
    assert_true(mmrt_json_grammar_done(&g));
    mmrt_json_schema_free(s);
    free(doc);
}

/* Strings held to a pattern (json_pattern.h): whole documents in and out, escapes and UTF-8
 * read as the characters they are, lengths beside it, and prefixes taken only while some
 * string the pattern matches begins so. */
struct pattern_case {
    const char *schema;
    const char *good[6], *bad[6];
};

static const struct pattern_case pattern_cases[] = {
    { "{'type':'string','pattern':'^\\\\d{4}-\\\\d{2}-\\\\d{2}$'}",
      { "'2024-01-05'", "'0000-00-00'" },
      { "'2024-1-05'", "'x2024-01-05'", "'2024-01-05x'", "''", "'2024-01-0a'" } },
    { "{'pattern':'ab'}", { "'ab'", "'xxaby'", "'\\u0061b'" }, { "'a'", "'ba'", "''" } },
    { "{'pattern':'^[a-c]+$'}", { "'\\u0061b\\u0063'", "'abc'", "'c'" },
      { "'\\u0064'", "'abd'", "''", "'A'" } },
    { "{'pattern':'^\xf0\x9f\x98\x80.$'}",
      { "'\xf0\x9f\x98\x80x'", "'\\uD83D\\uDE00\\t'", "'\xf0\x9f\x98\x80\xc3\xa9'" },
      { "'\\uD83D\\uDE01x'", "'\xf0\x9f\x98\x80'", "'\xf0\x9f\x98\x80\\n'" } },
    { "{'pattern':'^a+$','maxLength':3}", { "'a'", "'aaa'" }, { "'aaaa'", "''" } },
    { "{'pattern':'^a*$','minLength':2}", { "'aa'", "'aaaaa'" }, { "'a'", "''", "'ab'" } },
    { "{'pattern':'^(ab)*$','minLength':3}", { "'abab'", "'ababab'" },
      { "'ab'", "'aba'", "''" } },
    /* both lengths: the lengths a pattern matches need not be an interval */
    { "{'pattern':'^(ab)*$','minLength':3,'maxLength':5}", { "'abab'" },
      { "'ab'", "'ababab'", "'aba'", "''", "'ababa'" } },
    { "{'pattern':'^a*$','minLength':1,'maxLength':3}", { "'a'", "'aaa'" },
      { "''", "'aaaa'" } },
    { "{'pattern':'^[a-z]+-[0-9]+$','minLength':4,'maxLength':6}",
      { "'ab-12'", "'a-12'", "'abc-12'", "'a-1234'" },
      { "'a-1'", "'abcd-12'", "'abcde-1'", "'abcdef'" } },
    { "{'pattern':'x','minLength':3,'maxLength':4}", { "'axb'", "'xxx'", "'aaxa'", "'aaax'" },
      { "'ab'", "'abcde'", "'aaaa'", "'x'" } },
    { "{'pattern':'^(abc|de)+$','minLength':5,'maxLength':6}", { "'abcde'", "'dedede'",
      "'deabc'", "'abcabc'" }, { "'dede'", "'abcdeabc'", "'dededede'" } },
    { "{'pattern':'^(?:red|gr(?<x>ee)n|blue)$'}", { "'red'", "'green'", "'blue'" },
      { "'re'", "'greenblue'", "'Red'" } },
    { "{'pattern':'^[^\\\\s]{1,3}\\\\.[\\\\w]+$'}", { "'a.b'", "'abc.x_1'" },
      { "'a b.c'", "'.b'", "'abcd.e'", "'a.'" } },
    { "{'type':'object','properties':{'id':{'type':'string','pattern':'^[A-Z]{2}[0-9]{3}$'}},"
      "'required':['id']}", { "{'id':'AB123'}" }, { "{'id':'AB12'}", "{'id':'ab123'}" } },
};

/* Each case's good documents in whole and at every cut, its bad ones out; the misjudged. */
static int run_cases(const struct pattern_case *cases, size_t n)
{
    int misjudged = 0;
    for (size_t i = 0; i < n; i++) {
        const struct pattern_case *c = &cases[i];
        struct mmrt_json_schema *s = compile_ok(c->schema);
        char *schema = q(c->schema);
        for (size_t k = 0; k < 6 && c->good[k]; k++) {
            char *doc = q(c->good[k]);
            misjudged += !check_good(s, schema, doc);
            free(doc);
        }
        for (size_t k = 0; k < 6 && c->bad[k]; k++) {
            char *doc = q(c->bad[k]);
            misjudged += !check_bad(s, schema, doc);
            free(doc);
        }
        free(schema);
        mmrt_json_schema_free(s);
    }
    return misjudged;
}

/* Object alternatives (anyOf of objects with listed keys): one object that follows them
 * all, told apart by the keys that come and the literal values of shared ones. */
static const struct pattern_case object_union_cases[] = {
    { "{'anyOf':[{'type':'object','properties':{'pet':{'const':'cat'},'meows':{'type':'integer'}},"
      "'required':['pet','meows'],'additionalProperties':false},{'type':'object','properties':"
      "{'pet':{'const':'dog'},'barks':{'type':'boolean'}},'required':['pet','barks'],"
      "'additionalProperties':false}]}",
      { "{'pet':'cat','meows':3}", "{'pet':'dog','barks':true}" },
      { "{'pet':'cat','barks':true}", "{'pet':'dog','meows':1}", "{'pet':'cat'}", "{}",
        "{'meows':1}", "{'pet':'bird','meows':1}" } },
    { "{'anyOf':[{'properties':{'text':{'type':'string'}},'required':['text']},"
      "{'properties':{'url':{'type':'string'},'alt':{'type':'string'}},'required':['url']}]}",
      { "{'text':'hi'}", "{'url':'x'}", "{'url':'x','alt':'y'}" },
      { "{'text':'a','url':'b'}", "{'alt':'y'}", "{}", "{'url':'x','text':'y'}" } },
    { "{'anyOf':[{'properties':{'kind':{'enum':['a','b']},'x':{'type':'integer'}},"
      "'required':['kind','x']},{'properties':{'kind':{'enum':['b','c']},'y':{'type':'boolean'}},"
      "'required':['kind','y']},{'type':'null'}]}",
      { "{'kind':'b','x':1}", "{'kind':'b','y':true}", "{'kind':'a','x':2}", "null" },
      { "{'kind':'a','y':true}", "{'kind':'c','x':1}", "{'kind':'d','x':1}" } },
    { "{'$defs':{'A':{'properties':{'t':{'const':1},'v':{'$ref':'#'}},'required':['t']},"
      "'B':{'properties':{'t':{'const':10},'w':{'type':'string'}},'required':['t','w']}},"
      "'anyOf':[{'$ref':'#/$defs/A'},{'$ref':'#/$defs/B'}]}",
      { "{'t':1}", "{'t':1,'v':{'t':10,'w':''}}", "{'t':10,'w':'x'}" },
      { "{'t':10}", "{'t':1,'w':'x'}", "{'t':100,'w':'x'}" } },
    /* a shared key with a schema of its own in each alternative, read under the live one's
     * once an earlier required key's literals told them apart */
    { "{'anyOf':[{'properties':{'kind':{'const':'point'},'value':{'type':'array','items':"
      "{'type':'number'},'maxItems':2}},'required':['kind','value']},{'properties':{'kind':"
      "{'const':'label'},'value':{'type':'string','maxLength':3}},'required':['kind','value']},"
      "{'properties':{'kind':{'const':'box'},'value':{'type':'array','items':{'type':'number'},"
      "'maxItems':2}},'required':['kind']}]}",
      { "{'kind':'point','value':[1,2]}", "{'kind':'label','value':'abc'}",
        "{'kind':'box','value':[3]}", "{'kind':'box'}" },
      { "{'kind':'point','value':'x'}", "{'kind':'label','value':[1]}", "{'value':'x'}",
        "{'kind':'label','value':'abcd'}", "{'kind':'point'}" } },
    { "{'oneOf':[{'properties':{'t':{'enum':['a','b']},'v':{'type':'integer'}},'required':['t',"
      "'v']},{'properties':{'t':{'const':'c'},'v':{'type':'boolean'}},'required':['t','v']}]}",
      { "{'t':'a','v':3}", "{'t':'b','v':-1}", "{'t':'c','v':true}" },
      { "{'t':'a','v':true}", "{'t':'c','v':1}" } },
    /* shared keys in different orders: one order for all, first appearance where none
     * keeps every alternative's */
    { "{'anyOf':[{'properties':{'a':{},'b':{}}},{'properties':{'b':{},'a':{}}}]}",
      { "{'a':1,'b':2}", "{'b':[]}", "{}" }, { "{'b':2,'a':1}" } },
    { "{'anyOf':[{'properties':{'a':{'type':'integer'},'b':{'const':'x'}},'required':['a','b']},"
      "{'properties':{'b':{'const':'y'},'a':{'type':'integer'},'c':{'type':'null'}},"
      "'required':['b','a']}]}",
      { "{'a':1,'b':'x'}", "{'a':1,'b':'y'}", "{'a':1,'b':'y','c':null}" },
      { "{'b':'y','a':1}", "{'a':1,'b':'x','c':null}", "{'a':1}" } },
    /* under oneOf, with a discriminator (Pydantic's Field(discriminator=...)): a key every
     * alternative requires, literal values no two share */
    { "{'$defs':{'Cat':{'properties':{'pet':{'const':'cat','type':'string'},"
      "'meows':{'type':'integer'}},'required':['pet','meows'],'type':'object'},"
      "'Dog':{'properties':{'pet':{'const':'dog','type':'string'},'barks':{'type':'boolean'}},"
      "'required':['pet','barks'],'type':'object'}},'discriminator':{'propertyName':'pet',"
      "'mapping':{'cat':'#/$defs/Cat','dog':'#/$defs/Dog'}},"
      "'oneOf':[{'$ref':'#/$defs/Cat'},{'$ref':'#/$defs/Dog'}]}",
      { "{'pet':'cat','meows':3}", "{'pet':'dog','barks':false}" },
      { "{'pet':'cat','barks':true}", "{'pet':'dog'}", "{'meows':1}", "{'pet':'cow','meows':1}" } },
    { "{'oneOf':[{'properties':{'n':{'type':'string'},'k':{'enum':[1,2,null]}},"
      "'required':['k']},{'properties':{'k':{'enum':[3,'1',true]},'m':{'type':'integer'}},"
      "'required':['k','m']},{'type':'string'}]}",
      { "{'k':1}", "{'n':'x','k':null}", "{'k':'1','m':5}", "{'k':true,'m':0}", "'s'" },
      { "{'k':3}", "{'k':1,'m':5}", "{'n':'x'}", "{'k':'2','m':1}" } },
};

static void test_object_unions(void **state)
{
    (void)state;
    const int misjudged = run_cases(object_union_cases,
                                    sizeof object_union_cases / sizeof *object_union_cases);
    if (misjudged)
        fail_msg("%d object-union cases misjudged", misjudged);
}

static void test_patterns(void **state)
{
    (void)state;
    int misjudged = run_cases(pattern_cases, sizeof pattern_cases / sizeof *pattern_cases);
    /* Prefixes: a \u escape's digits and a UTF-8 character's lead byte are taken only while
     * some code point they begin may come. */
    static const struct { const char *schema, *prefix; bool taken; } prefixes[] = {
        { "{'pattern':'^[0-9]$'}", "\"\\u003", true },
        { "{'pattern':'^[0-9]$'}", "\"\\u1", false },
        { "{'pattern':'^[0-9]$'}", "\"\\u004", false },
        /* a \u escape above the surrogates is one character, not half of a pair */
        { "{'pattern':'^.b$'}", "\"\\uF1AEb", true },
        { "{'pattern':'^\xc3\xa9$'}", "\"\xc3", true },
        { "{'pattern':'^\xc3\xa9$'}", "\"\xc4", false },
        { "{'pattern':'^\xf0\x9f\x98\x80$'}", "\"\\uD8", true },
        { "{'pattern':'^\xf0\x9f\x98\x80$'}", "\"\\uD83D\\uDE", true },
        { "{'pattern':'^\xf0\x9f\x98\x80$'}", "\"\\uD83E", false },
        { "{'pattern':'^a+$','maxLength':2}", "\"aa", true },
        { "{'pattern':'^a+$','maxLength':2}", "\"aaa", false },
        { "{'pattern':'^ab$'}", "\"b", false },
        { "{'pattern':'^ab$'}", "\"ab\\", false }, /* nothing may follow: no escape either */
        /* a lead byte begins only the code points its length encodes: E0 is U+0800 on, so
         * no digit (an overlong form would be), and its second byte is A0 on */
        { "{'pattern':'^[0-9]+$'}", "\"1\xe0", false },
        { "{'pattern':'^[0-9]+$'}", "\"1\xc2", false },
        { "{'pattern':'^\xe0\xa0\x80$'}", "\"\xe0\x80", false },
        { "{'pattern':'^\xe0\xa0\x80$'}", "\"\xe0\xa0", true },
        { "{'pattern':'^.$'}", "\"\xed\xa0", false }, /* a surrogate */
        { "{'pattern':'^.$'}", "\"\xf4\x90", false }, /* past U+10FFFF */
    };
    for (size_t i = 0; i < sizeof prefixes / sizeof *prefixes; i++) {
        struct mmrt_json_schema *s = compile_ok(prefixes[i].schema);
        struct mmrt_json_grammar g;
        mmrt_json_grammar_init(&g, s);
        const bool taken = mmrt_json_grammar_feed(&g, prefixes[i].prefix,
                                                  strlen(prefixes[i].prefix));
        if (taken != prefixes[i].taken)
            misjudged += !failed("prefix %s under %s: taken %d", prefixes[i].prefix,
                                 prefixes[i].schema, taken);
        mmrt_json_schema_free(s);
    }
    if (misjudged)
        fail_msg("%d pattern cases misjudged", misjudged);
}

/* Whether text is a JSON number without exponent whose double lies within the bounds, as a
 * validator reads both: the meaning json_schema.h gives a number's bounds. */
static bool number_within(const char *text, double lo, bool lo_open, double hi, bool hi_open)
{
    const char *p = text + (*text == '-');
    if (*p == '0' && p[1] >= '0' && p[1] <= '9')
        return false;
    if (*p < '0' || *p > '9')
        return false;
    while (*p >= '0' && *p <= '9')
        p++;
    if (*p == '.') {
        if (p[1] < '0' || p[1] > '9')
            return false;
        for (p++; *p >= '0' && *p <= '9'; p++)
            ;
    }
    if (*p != '\0')
        return false;
    const double x = strtod(text, NULL);
    return (lo_open ? x > lo : x >= lo) && (hi_open ? x < hi : x <= hi);
}

/* A number's bounds, every text of up to five bytes of sign, digits and point: the
 * recogniser takes one whole (a space after it) exactly when a validator finds it a number
 * within them, and then every prefix of it too. */
static void test_number_bounds_exhaustive(void **state)
{
    (void)state;
    static const struct {
        const char *schema;
        double lo, hi;
        bool lo_open, hi_open;
    } cases[] = {
        { "{'type':'number','minimum':0,'maximum':1}", 0, 1, false, false },
        { "{'type':'number','minimum':-2.5,'exclusiveMaximum':10}", -2.5, 10, false, true },
        { "{'type':'number','minimum':0.1,'maximum':0.3}", 0.1, 0.3, false, false },
        { "{'type':'number','minimum':100,'maximum':250.5}", 100, 250.5, false, false },
        { "{'type':'number','maximum':-10.25}", -INFINITY, -10.25, false, false },
        { "{'type':'number','exclusiveMinimum':0}", 0, INFINITY, true, false },
        { "{'type':'number','exclusiveMinimum':-0.05,'exclusiveMaximum':0.05}", -0.05, 0.05,
          true, true },
        { "{'type':'number','minimum':7}", 7, INFINITY, false, false },
        { "{'type':'number','minimum':-30,'maximum':-2}", -30, -2, false, false },
        { "{'type':'number','minimum':0,'maximum':0}", 0, 0, false, false },
        { "{'type':'number','exclusiveMinimum':1,'exclusiveMaximum':9}", 1, 9, true, true },
    };
    static const char alphabet[] = "-.0123456789";
    enum { A = sizeof alphabet - 1, MAX_LEN = 5 };
    int misjudged = 0;
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        struct mmrt_json_schema *s = compile_ok(cases[k].schema);
        unsigned idx[MAX_LEN] = { 0 };
        for (int len = 1; len <= MAX_LEN; len++) {
            unsigned long total = 1;
            for (int i = 0; i < len; i++)
                total *= A;
            for (unsigned long code = 0; code < total; code++) {
                char text[MAX_LEN + 2];
                unsigned long c = code;
                for (int i = 0; i < len; i++, c /= A)
                    idx[i] = (unsigned)(c % A);
                for (int i = 0; i < len; i++)
                    text[i] = alphabet[idx[i]];
                text[len] = ' ';
                text[len + 1] = '\0';
                struct mmrt_json_grammar g;
                mmrt_json_grammar_init(&g, s);
                const bool taken = mmrt_json_grammar_feed(&g, text, (size_t)len + 1) &&
                                   mmrt_json_grammar_done(&g);
                text[len] = '\0';
                const bool valid = number_within(text, cases[k].lo, cases[k].lo_open,
                                                 cases[k].hi, cases[k].hi_open);
                if (taken != valid && misjudged++ < 20)
                    print_message("%s: '%s' %s\n", cases[k].schema, text,
                                  taken ? "taken, but outside" : "refused, but within");
            }
        }
        mmrt_json_schema_free(s);
    }
    if (misjudged)
        fail_msg("%d texts misjudged", misjudged);
}

/* Reals of enum and const are written as jansson writes them, with the fewest digits that
 * read back the same, and never after the C locale's decimal point. */
static void test_real_literals(void **state)
{
    (void)state;
    struct mmrt_json_schema *s = compile_ok("{'enum':[2.0,0.1,-1.5e300,3]}");
    static const char *const good[] = { "2.0", "0.1", "-1.5e300", "3" };
    static const char *const bad[] = { "2", "0.10000000000000001", "-1.5e+300", "3.0" };
    for (size_t i = 0; i < sizeof good / sizeof *good; i++) {
        char text[64];
        snprintf(text, sizeof text, "%s ", good[i]); /* a number ends at what follows it */
        assert_true(check_good(s, "reals", text));
        snprintf(text, sizeof text, "%s ", bad[i]);
        assert_true(check_bad(s, "reals", text));
    }
    mmrt_json_schema_free(s);
}

/* $ref targets made one inside another deepen the C stack: past MMRT_JSON_SCHEMA_MAX_REFS
 * the schema is refused, by the place where it stopped. */
static void test_ref_chain(void **state)
{
    (void)state;
    for (unsigned depth = MMRT_JSON_SCHEMA_MAX_REFS - 1; depth <= MMRT_JSON_SCHEMA_MAX_REFS + 1;
         depth++) {
        char *text = malloc(64 * (depth + 2));
        assert_non_null(text);
        size_t n = (size_t)sprintf(text, "{\"$ref\":\"#/$defs/d0\",\"$defs\":{");
        for (unsigned i = 0; i < depth; i++)
            n += (size_t)sprintf(text + n, "\"d%u\":{\"type\":\"array\",\"items\":"
                                 "{\"$ref\":\"#/$defs/d%u\"}},", i, i + 1);
        n += (size_t)sprintf(text + n, "\"d%u\":{\"type\":\"integer\"}}}", depth);
        struct mmrt_json_schema *s = NULL;
        struct mmrt_error err = { 0 };
        const mmrt_status st = mmrt_json_schema_parse(text, n, &s, &err);
        if (depth + 1 <= MMRT_JSON_SCHEMA_MAX_REFS) {
            if (st != MMRT_OK)
                fail_msg("%u nested targets refused: %s", depth + 1, err.msg);
        } else if (st != MMRT_ERR_LIMIT || !strstr(err.msg, "nest more than")) {
            fail_msg("%u nested targets: status %d, '%s'", depth + 1, (int)st, err.msg);
        }
        mmrt_json_schema_free(s);
        free(text);
    }
}

/* The schemas true and {} admit any JSON: the syntax corpus of test_json_grammar.c. */
static const char *const any_valid[] = {
    "{}", "[]", "{\"a\":1}", " { \"a\" : [ 1 , 2.5 , -3e+4 , 0 , -0.0E-1 ] } ",
    "{\"k\":\"v\\\"\\\\\\/\\b\\f\\n\\r\\t\\u00e9\\uD83D\\uDE00\"}", "[true,false,null]",
    "{\"a\":{\"b\":{\"c\":[[],[{}]]}}}", "\"text\"", "true", "null", "[\"\xc3\xa9\xe2\x82\xac\"]",
    "[0.5e10,1E2,1234567890123456]", "{\"\":\"\"}", "[{\"a\":null},[],\"x\"]\n",
    "[-1,-0.25,3E-2]", "{\"a\":\"\xf0\x9f\x98\x80\"}", "[\"\\u0000\"]", "12 ", "-0.5e-3\n",
};

static const char *const any_invalid[] = {
    "{,}", "[1,]", "{\"a\"}", "{\"a\":}", "{a:1}", "[01]", "[1.]", "[.5]", "[1e]", "[+1]",
    "[-]", "[tru]x", "[nul]", "{\"a\":1,}", "[1 2]", "{\"a\":1 \"b\":2}", "[\"\\x\"]",
    "[\"\\u12G4\"]", "[\"a\nb\"]", "[\"tab\there\"]", "{}}", "[]]", "{} {}", "[1]x",
    "{\"a\":1]", "[1}", "[True]", "[\"unterminated", "{\"a\":[1,2}", "[--1]", "[1e+-2]",
    "[0x10]", "[Infinity]", "[NaN]", "'a'", "12", "", " ",
};

static bool any_json(const char *schema)
{
    struct mmrt_json_schema *s = compile_ok(schema);
    int misjudged = 0;
    for (size_t i = 0; i < sizeof any_valid / sizeof *any_valid; i++)
        misjudged += !check_good(s, schema, any_valid[i]);
    for (size_t i = 0; i < sizeof any_invalid / sizeof *any_invalid; i++)
        misjudged += !check_bad(s, schema, any_invalid[i]);
    mmrt_json_schema_free(s);
    return misjudged == 0;
}

static void test_any_json(void **state)
{
    (void)state;
    assert_true(any_json("true"));
    assert_true(any_json("{}"));
    /* OpenAI's json_object mode: any object, and nothing else */
    struct mmrt_json_schema *s = NULL;
    struct mmrt_error err = { 0 };
    assert_int_equal(mmrt_json_schema_any_object(&s, &err), MMRT_OK);
    assert_true(check_good(s, "any_object", " {\"a\":[1,{\"b\":null}]} \n"));
    assert_true(check_good(s, "any_object", "{}"));
    static const char *const not_objects[] = { "[]", "\"s\"", "1 ", "true", "null" };
    for (size_t i = 0; i < sizeof not_objects / sizeof *not_objects; i++)
        assert_true(check_bad(s, "any_object", not_objects[i]));
    mmrt_json_schema_free(s);
}

/* A root schema of annotations only is {}: any JSON (JSON Schema reads them past, and so
 * must json_schema.h). */
static void test_annotations_only(void **state)
{
    (void)state;
    assert_true(any_json("{'title':'anything'}"));
    assert_true(any_json("{'$schema':'https://json-schema.org/draft/2020-12/schema',"
                         "'description':'d','default':1,'examples':[2]}"));
}

/* An enum value another extends is whole only once something ends it; so is a top-level
 * number; a literal or container when it closes. */
static void test_done(void **state)
{
    (void)state;
    struct mmrt_json_grammar g;
    struct mmrt_json_schema *s = compile_ok("{'enum':[1,10]}");
    mmrt_json_grammar_init(&g, s);
    assert_false(mmrt_json_grammar_done(&g));
    assert_true(mmrt_json_grammar_feed(&g, "1", 1));
    assert_false(mmrt_json_grammar_done(&g));
    struct mmrt_json_grammar h;
    mmrt_json_grammar_copy(&h, &g);
    assert_true(mmrt_json_grammar_feed(&g, " ", 1));
    assert_true(mmrt_json_grammar_done(&g));
    assert_false(mmrt_json_grammar_feed(&g, "0", 1));
    assert_true(mmrt_json_grammar_feed(&h, "0", 1));
    assert_false(mmrt_json_grammar_feed(&h, "0", 1));
    mmrt_json_schema_free(s);

    s = compile_ok("{'type':'integer'}");
    mmrt_json_grammar_init(&g, s);
    assert_true(mmrt_json_grammar_feed(&g, "12", 2));
    assert_false(mmrt_json_grammar_done(&g));
    assert_true(mmrt_json_grammar_feed(&g, " ", 1));
    assert_true(mmrt_json_grammar_done(&g));
    assert_false(mmrt_json_grammar_feed(&g, "3", 1));
    mmrt_json_schema_free(s);

    s = compile_ok("{'const':true}");
    mmrt_json_grammar_init(&g, s);
    assert_true(mmrt_json_grammar_feed(&g, "tru", 3));
    assert_false(mmrt_json_grammar_done(&g));
    assert_true(mmrt_json_grammar_feed(&g, "e", 1));
    assert_true(mmrt_json_grammar_done(&g));
    mmrt_json_schema_free(s);
}

/* pattern with each '_' made a whitespace run of MMRT_JSON_MAX_SPACE bytes (all four kinds),
 * but the which-th made `run` bytes, and ' made ". */
static char *spaced(const char *pattern, size_t which, size_t run)
{
    static const char ws[] = "\r\n\t ";
    char *out = malloc(strlen(pattern) * (MMRT_JSON_MAX_SPACE + 2) + 1);
    assert_non_null(out);
    size_t o = 0, k = 0;
    for (const char *p = pattern; *p; p++) {
        if (*p != '_') {
            out[o++] = *p == '\'' ? '"' : *p;
            continue;
        }
        const size_t n = k++ == which ? run : MMRT_JSON_MAX_SPACE;
        for (size_t i = 0; i < n; i++)
            out[o++] = ws[i % 4];
    }
    out[o] = '\0';
    return out;
}

/* One whitespace byte before the top-level value, runs of MMRT_JSON_MAX_SPACE between
 * tokens (and after the value), none inside a literal; inside a string spaces are text. */
static void test_whitespace(void **state)
{
    (void)state;
    const char *schema = "{'type':'object','properties':{'a':{'type':'array','items':"
                         "{'type':'integer'}},'e':{'enum':['x y',[1,2]]},'s':{'type':'string'}}}";
    struct mmrt_json_schema *s = compile_ok(schema);
    const char *pattern = "{_'a'_:_[_1_,_2_]_,_'e'_:_[1,2]_,_'s'_:_'   '_}_";
    size_t runs = 0;
    for (const char *p = pattern; *p; p++)
        runs += *p == '_';
    char *doc = spaced(pattern, SIZE_MAX, 0);
    assert_true(check_good(s, schema, doc));
    free(doc);
    for (size_t i = 0; i < runs; i++) {
        doc = spaced(pattern, i, MMRT_JSON_MAX_SPACE + 1);
        assert_true(check_bad(s, schema, doc));
        free(doc);
    }
    static const char *const good[] = { " {}", "\n{}", "\t{}", "\r{}", "{'e':'x y'}" };
    static const char *const bad[] = { "  {}", " \n{}", "{'e':[1, 2]}", "{'e':'x  y'}",
                                       "{'e':[ 1,2]}", "{'e':[1,2 ]}", "{' a':[]}",
                                       "{'a' :[1 ,2]}\x0b", "{'a':[1\x0c]}" };
    for (size_t i = 0; i < sizeof good / sizeof *good; i++) {
        char *d = q(good[i]);
        assert_true(check_good(s, schema, d));
        free(d);
    }
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char *d = q(bad[i]);
        assert_true(check_bad(s, schema, d));
        free(d);
    }
    /* a long run of spaces is text in a free string */
    char text[3 * MMRT_JSON_MAX_SPACE + 8];
    memset(text, ' ', sizeof text);
    text[0] = '"';
    text[sizeof text - 2] = '"';
    text[sizeof text - 1] = '\0';
    mmrt_json_schema_free(s);
    s = compile_ok("{'type':'string'}");
    assert_true(check_good(s, "{'type':'string'}", text));
    mmrt_json_schema_free(s);
}

/* Nesting to MMRT_JSON_MAX_DEPTH and no further: free values, and a recursive schema. */
static void test_depth(void **state)
{
    (void)state;
    static const char *const schemas[] = { "true", "{'type':'array','items':{'$ref':'#'}}" };
    char deep[2 * MMRT_JSON_MAX_DEPTH + 1];
    for (int i = 0; i < MMRT_JSON_MAX_DEPTH; i++)
        deep[i] = '[', deep[2 * MMRT_JSON_MAX_DEPTH - 1 - i] = ']';
    deep[2 * MMRT_JSON_MAX_DEPTH] = '\0';
    for (size_t k = 0; k < sizeof schemas / sizeof *schemas; k++) {
        struct mmrt_json_schema *s = compile_ok(schemas[k]);
        assert_true(check_good(s, schemas[k], deep));
        struct mmrt_json_grammar g;
        mmrt_json_grammar_init(&g, s);
        assert_true(mmrt_json_grammar_feed(&g, deep, MMRT_JSON_MAX_DEPTH));
        struct mmrt_json_grammar h;
        mmrt_json_grammar_copy(&h, &g);
        assert_false(mmrt_json_grammar_feed(&g, "[", 1));
        assert_false(mmrt_json_grammar_feed(&h, "{", 1));
        mmrt_json_schema_free(s);
    }
    /* objects: {"a": nested, the innermost {} at depth 64 */
    const char *schema = "{'type':'object','properties':{'a':{'$ref':'#'}}}";
    struct mmrt_json_schema *s = compile_ok(schema);
    char *doc = malloc(8 * MMRT_JSON_MAX_DEPTH);
    assert_non_null(doc);
    size_t o = 0;
    for (int i = 0; i < MMRT_JSON_MAX_DEPTH - 1; i++)
        memcpy(doc + o, "{\"a\":", 5), o += 5;
    memcpy(doc + o, "{}", 2), o += 2;
    memset(doc + o, '}', MMRT_JSON_MAX_DEPTH - 1), o += MMRT_JSON_MAX_DEPTH - 1;
    doc[o] = '\0';
    assert_true(check_good(s, schema, doc));
    struct mmrt_json_grammar g;
    mmrt_json_grammar_init(&g, s);
    assert_true(mmrt_json_grammar_feed(&g, doc, 5 * (MMRT_JSON_MAX_DEPTH - 1) + 1));
    assert_true(mmrt_json_grammar_feed(&g, "\"a\":", 4));
    assert_false(mmrt_json_grammar_feed(&g, "{", 1));
    free(doc);
    mmrt_json_schema_free(s);
}

/* The fields of two grammars that matter: everything but frames past the depth. */
static bool same_state(const struct mmrt_json_grammar *a, const struct mmrt_json_grammar *b)
{
    if (a->schema != b->schema || a->value != b->value || a->hex != b->hex ||
        a->state != b->state || a->depth != b->depth || a->space != b->space ||
        a->flags != b->flags || a->aux != b->aux || a->lo != b->lo || a->hi != b->hi ||
        a->pos != b->pos)
        return false;
    for (int i = 0; i < a->depth && i < MMRT_JSON_MAX_DEPTH; i++)
        if (a->frame[i].node != b->frame[i].node || a->frame[i].count != b->frame[i].count)
            return false;
    return true;
}

/* in_string says the engine may copy text bytes without feeding them: where it is true, a
 * text byte must leave the state exactly as it was. */
static void test_in_string(void **state)
{
    (void)state;
    static const struct {
        const char *schema, *prefix;
        int in; /* -1: either, as long as a text byte then leaves the state as it is */
    } cases[] = {
        { "S", "{'s':'ab", true },
        { "S", "{'s':'", true },
        { "S", "{'s':'ab\\", false },
        { "S", "{'s':'ab\\u00", false },
        { "S", "{'s':'ab\\n", true },
        { "S", "{'s':'ab\\u00e9", true },
        { "S", "{'s':'\\uD83D", -1 }, /* a lone high surrogate so far */
        { "S", "{'s':'\\uD83D\\uDE00", true },
        { "S", "{'s':'ab'", false },
        { "S", "{'s':", false },
        { "S", "{'", false },
        { "S", "{'s", false },
        { "S", "{'m':'ab", false },
        { "S", "{'m':'", false },
        { "S", "{'n':'a", false },
        { "S", "{'n':'ab", true },
        { "S", "{'n':'\\uD83D\\uDE00", false },
        { "S", "{'e':'ab", false },
        { "S", "{'e':'", false },
        { "S", "{'f':{'ke", true },
        { "S", "{'f':{'", true },
        { "S", "{'f':{'ke':'v", true },
        { "S", "{'f':{'ke':", false },
        { "S", "{'f':{'k':1,'a", true },
        { "true", "'abc", true },
        { "true", "['a", true },
        { "true", "{'k", true },
        { "true", "{'k':'", true },
        { "true", "{'k':1", false },
        { "true", "", false },
        { "{'type':'object','additionalProperties':{'type':'string','maxLength':2}}",
          "{'key", true },
        { "{'type':'object','additionalProperties':{'type':'string','maxLength':2}}",
          "{'key':'v", false },
    };
    const char *big = "{'type':'object','properties':{'s':{'type':'string'},"
                      "'m':{'type':'string','maxLength':5},'n':{'type':'string','minLength':2},"
                      "'e':{'enum':['abc','abd']},'f':{'type':'object'}}}";
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        const char *schema = strcmp(cases[i].schema, "S") == 0 ? big : cases[i].schema;
        struct mmrt_json_schema *s = compile_ok(schema);
        char *prefix = q(cases[i].prefix);
        struct mmrt_json_grammar g;
        mmrt_json_grammar_init(&g, s);
        if (!mmrt_json_grammar_feed(&g, prefix, strlen(prefix)))
            fail_msg("case %zu: prefix refused: %s", i, prefix);
        const bool in = mmrt_json_grammar_in_string(&g);
        if (cases[i].in >= 0 && in != (cases[i].in == 1))
            fail_msg("case %zu: in_string is %d after %s", i, in, prefix);
        if (in) {
            static const char *const text[] = { "x", " ", "\xc3\xa9", "\xf0\x9f\x98\x80", "~",
                                                "{", "}", ":", ",", "'", "/" };
            for (size_t t = 0; t < sizeof text / sizeof *text; t++) {
                struct mmrt_json_grammar h;
                mmrt_json_grammar_copy(&h, &g);
                if (!mmrt_json_grammar_feed(&h, text[t], strlen(text[t])))
                    fail_msg("case %zu: text byte(s) '%s' refused after %s", i, text[t], prefix);
                if (!same_state(&g, &h))
                    fail_msg("case %zu: text byte(s) '%s' changed the state after %s", i,
                             text[t], prefix);
            }
        }
        free(prefix);
        mmrt_json_schema_free(s);
    }
}

/* \u escapes of UTF-16 surrogates: a pair is one character; a lone one is no character at
 * all, and jansson, the parser mmrt reads JSON with, refuses the text ("invalid Unicode"),
 * so an answer must not hold one. And a prefix is taken only when some document continues
 * it: at maxLength, after a high surrogate, only a low one can follow. */
static void test_surrogates(void **state)
{
    (void)state;
    int misjudged = 0;
    struct mmrt_json_schema *s = compile_ok("{'type':'string'}");
    static const char *const lone[] = { "'\\uD83D'", "'\\uDE00'", "'\\uD83Dx'",
                                        "'\\uD83D\\u0041'", "'\\uDE00\\uD83D'",
                                        "'\\uD83D\\uD83D\\uDE00'" };
    for (size_t i = 0; i < sizeof lone / sizeof *lone; i++) {
        char *doc = q(lone[i]);
        misjudged += !check_bad(s, "{'type':'string'}", doc);
        free(doc);
    }
    assert_true(check_good(s, "{'type':'string'}", "\"\\uD83D\\uDE00\\udbff\\udfff\""));
    mmrt_json_schema_free(s);
    s = compile_ok("{'type':'object'}");
    misjudged += !check_bad(s, "{'type':'object'}", "{\"\\uDE00\":1}");
    mmrt_json_schema_free(s);

    s = compile_ok("{'type':'string','maxLength':1}");
    static const char *const stuck[] = { "\"\\uD83D\\uE", "\"\\uD83D\\uD8",
                                         "\"\\uD83D\\u0" };
    for (size_t i = 0; i < sizeof stuck / sizeof *stuck; i++) {
        struct mmrt_json_grammar g;
        mmrt_json_grammar_init(&g, s);
        if (mmrt_json_grammar_feed(&g, stuck[i], strlen(stuck[i])))
            misjudged += !failed("maxLength 1: %s taken, which no document continues", stuck[i]);
    }
    assert_true(check_good(s, "{'type':'string','maxLength':1}", "\"\\uD83D\\uDE00\""));
    mmrt_json_schema_free(s);
    if (misjudged)
        fail_msg("%d surrogate cases misjudged", misjudged);
}

/* A copy taken mid-document goes on byte for byte as the original, right or wrong. */
static void test_copy(void **state)
{
    (void)state;
    const char *schema = "{'type':'object','properties':{'name':{'type':'string','maxLength':4},"
                         "'tags':{'type':'array','items':{'enum':['a','ab',1,10]},'maxItems':3},"
                         "'k':{'type':'integer'}},'required':['name','k']}";
    static const char *const rests[] = { "'ab'],'k':1}", "10,1],'k':-2}", "'abc'],'k':1}",
                                         "1,1],'k':1}", "10],'k':1.5}", "'a'],'k':1", "]}" };
    struct mmrt_json_schema *s = compile_ok(schema);
    char *head = q("{'name':'Ann','tags':['a',");
    struct mmrt_json_grammar g;
    mmrt_json_grammar_init(&g, s);
    assert_true(mmrt_json_grammar_feed(&g, head, strlen(head)));
    for (size_t r = 0; r < sizeof rests / sizeof *rests; r++) {
        char *rest = q(rests[r]);
        struct mmrt_json_grammar a, b;
        mmrt_json_grammar_copy(&a, &g);
        memset(&b, 0x5a, sizeof b);
        mmrt_json_grammar_copy(&b, &g);
        bool alive = true;
        for (size_t i = 0; rest[i] && alive; i++) {
            const bool fa = mmrt_json_grammar_feed(&a, rest + i, 1);
            const bool fb = mmrt_json_grammar_feed(&b, rest + i, 1);
            if (fa != fb)
                fail_msg("rest %zu, byte %zu: the original says %d, the copy %d", r, i, fa, fb);
            alive = fa;
            if (alive && (mmrt_json_grammar_done(&a) != mmrt_json_grammar_done(&b) ||
                          mmrt_json_grammar_in_string(&a) != mmrt_json_grammar_in_string(&b)))
                fail_msg("rest %zu, byte %zu: the copy differs in done or in_string", r, i);
        }
        free(rest);
    }
    free(head);
    mmrt_json_schema_free(s);
}

/* ---------------------------------------------------------------------------------------- */
/* property: random documents walked out of the recogniser conform to their schema */

static uint64_t xorshift(uint64_t *x)
{
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    return *x;
}

static const json_t *resolve(const json_t *root, const char *ref)
{
    if (ref == NULL)
        return NULL;
    if (strcmp(ref, "#") == 0)
        return root;
    if (strncmp(ref, "#/$defs/", 8) == 0)
        return json_object_get(json_object_get(root, "$defs"), ref + 8);
    if (strncmp(ref, "#/definitions/", 14) == 0)
        return json_object_get(json_object_get(root, "definitions"), ref + 14);
    return NULL;
}

static bool type_is(const char *t, const json_t *v)
{
    if (strcmp(t, "object") == 0)
        return json_is_object(v);
    if (strcmp(t, "array") == 0)
        return json_is_array(v);
    if (strcmp(t, "string") == 0)
        return json_is_string(v);
    if (strcmp(t, "integer") == 0)
        return json_is_integer(v); /* the subset writes no fraction: jansson reads a real */
    if (strcmp(t, "number") == 0)
        return json_is_number(v);
    if (strcmp(t, "boolean") == 0)
        return json_is_boolean(v);
    if (strcmp(t, "null") == 0)
        return json_is_null(v);
    return false;
}

static size_t code_points(const char *p, size_t n)
{
    size_t c = 0;
    for (size_t i = 0; i < n; i++)
        c += ((unsigned char)p[i] & 0xc0) != 0x80;
    return c;
}

static bool conforms(json_t *s, json_t *root, json_t *v, bool ordered);

/* An alternative's keys may come in another order than its own: object alternatives write
 * theirs in one order for all (json_schema.h). */
static size_t count_conforming(json_t *list, json_t *root, json_t *v)
{
    size_t n = 0, i;
    json_t *alt;
    json_array_foreach(list, i, alt)
        n += conforms(alt, root, v, false);
    return n;
}

/* v within schema s as json_schema.h generates it: JSON Schema's meaning for the supported
 * keywords, and listed keys only, in the schema's order when ordered. */
static bool conforms(json_t *s, json_t *root, json_t *v, bool ordered)
{
    if (json_is_boolean(s))
        return json_is_true(s);
    json_t *k;
    if ((k = json_object_get(s, "$ref")) != NULL) {
        json_t *target = (json_t *)resolve(root, json_string_value(k));
        if (target == NULL || !conforms(target, root, v, ordered))
            return false;
    }
    if ((k = json_object_get(s, "type")) != NULL) {
        bool any = false;
        if (json_is_string(k)) {
            any = type_is(json_string_value(k), v);
        } else {
            size_t i;
            json_t *t;
            json_array_foreach(k, i, t)
                any = any || type_is(json_string_value(t), v);
        }
        if (!any)
            return false;
    }
    if ((k = json_object_get(s, "enum")) != NULL) {
        bool any = false;
        size_t i;
        json_t *e;
        json_array_foreach(k, i, e)
            any = any || json_equal(e, v);
        if (!any)
            return false;
    }
    if ((k = json_object_get(s, "const")) != NULL && !json_equal(k, v))
        return false;
    if ((k = json_object_get(s, "anyOf")) != NULL && count_conforming(k, root, v) == 0)
        return false;
    if ((k = json_object_get(s, "oneOf")) != NULL && count_conforming(k, root, v) != 1)
        return false;
    if ((k = json_object_get(s, "allOf")) != NULL && count_conforming(k, root, v) !=
                                                         json_array_size(k))
        return false;
    if (json_is_object(v)) {
        json_t *props = json_object_get(s, "properties");
        json_t *extra = json_object_get(s, "additionalProperties");
        const bool listed = props != NULL && json_object_size(props) > 0;
        size_t next = 0; /* listed keys come in the schema's order, each once */
        const char *key;
        json_t *val;
        json_object_foreach(v, key, val) {
            if (listed) {
                size_t idx = 0;
                const char *pk;
                json_t *ps, *found = NULL;
                json_object_foreach(props, pk, ps) {
                    if (strcmp(pk, key) == 0) {
                        found = ps;
                        break;
                    }
                    idx++;
                }
                if (found == NULL || (ordered && idx < next) ||
                    !conforms(found, root, val, true))
                    return false;
                next = idx + 1;
            } else if (extra != NULL && !conforms(extra, root, val, true)) {
                return false;
            }
        }
        size_t i;
        json_t *r;
        json_array_foreach(json_object_get(s, "required"), i, r)
            if (json_object_get(v, json_string_value(r)) == NULL)
                return false;
        if ((k = json_object_get(s, "minProperties")) &&
            json_object_size(v) < (size_t)json_integer_value(k))
            return false;
        if ((k = json_object_get(s, "maxProperties")) &&
            json_object_size(v) > (size_t)json_integer_value(k))
            return false;
    }
    if (json_is_array(v)) {
        /* a tuple (prefixItems, or items as a list), then items (or additionalItems) */
        json_t *items = json_object_get(s, "items");
        json_t *tuple = json_object_get(s, "prefixItems");
        if (json_is_array(items)) {
            tuple = items;
            items = json_object_get(s, "additionalItems");
        }
        size_t i;
        json_t *item;
        json_array_foreach(v, i, item) {
            json_t *its = i < json_array_size(tuple) ? json_array_get(tuple, i) : items;
            if (its != NULL && !conforms(its, root, item, true))
                return false;
        }
        if ((k = json_object_get(s, "minItems")) && json_array_size(v) <
                                                        (size_t)json_integer_value(k))
            return false;
        if ((k = json_object_get(s, "maxItems")) && json_array_size(v) >
                                                        (size_t)json_integer_value(k))
            return false;
        if (json_is_true(json_object_get(s, "uniqueItems")))
            for (size_t a = 0; a < json_array_size(v); a++)
                for (size_t b = a + 1; b < json_array_size(v); b++)
                    if (json_equal(json_array_get(v, a), json_array_get(v, b)))
                        return false;
    }
    if (json_is_string(v)) {
        const size_t n = code_points(json_string_value(v), json_string_length(v));
        if ((k = json_object_get(s, "minLength")) && n < (size_t)json_integer_value(k))
            return false;
        if ((k = json_object_get(s, "maxLength")) && n > (size_t)json_integer_value(k))
            return false;
        /* The walk's patterns are POSIX extended expressions too, which search as JSON
         * Schema's do: libc's matcher checks them, not mmrt's. */
        if ((k = json_object_get(s, "pattern")) != NULL) {
            regex_t re;
            if (regcomp(&re, json_string_value(k), REG_EXTENDED | REG_NOSUB) != 0)
                return false;
            const bool hit = regexec(&re, json_string_value(v), 0, NULL, 0) == 0;
            regfree(&re);
            if (!hit)
                return false;
        }
    }
    if (json_is_number(v)) {
        const double x = json_number_value(v);
        if ((k = json_object_get(s, "minimum")) && x < json_number_value(k))
            return false;
        if ((k = json_object_get(s, "maximum")) && x > json_number_value(k))
            return false;
        if ((k = json_object_get(s, "exclusiveMinimum")) && x <= json_number_value(k))
            return false;
        if ((k = json_object_get(s, "exclusiveMaximum")) && x >= json_number_value(k))
            return false;
        if ((k = json_object_get(s, "multipleOf")) &&
            (!json_is_integer(v) ||
             json_integer_value(v) % (json_int_t)json_number_value(k) != 0))
            return false;
    }
    return true;
}

/* What the walk may write: JSON's punctuation, digits, every lowercase letter (keys and
 * \u escapes need them), and one two-byte character. */
static const char *const units[] = {
    "{", "}", "[", "]", ",", ":", "\"", " ", "\n", "-", "+", ".", "\\", "/", "E", "\xc3\xa9",
    "0", "1", "2", "3", "4", "5", "6", "7", "8", "9", "a", "b", "c", "d", "e", "f", "g", "h",
    "i", "j", "k", "l", "m", "n", "o", "p", "q", "r", "s", "t", "u", "v", "w", "x", "y", "z",
};
enum { N_UNITS = sizeof units / sizeof *units, WALK_CAP = 400, WALK_SOFT = 24 };

/* Walks one document out of the recogniser into doc; false when it reached WALK_CAP. */
static bool walk(const struct mmrt_json_schema *s, uint64_t *rng, char *doc, size_t *len)
{
    struct mmrt_json_grammar g, t;
    mmrt_json_grammar_init(&g, s);
    size_t n = 0;
    while (!mmrt_json_grammar_done(&g)) {
        if (n >= WALK_CAP)
            return false;
        int fits[N_UNITS], nf = 0, solid[N_UNITS], ns = 0, closers[N_UNITS], nc = 0;
        int calm[N_UNITS], nq = 0;
        for (int u = 0; u < N_UNITS; u++) {
            mmrt_json_grammar_copy(&t, &g);
            if (!mmrt_json_grammar_feed(&t, units[u], strlen(units[u])))
                continue;
            fits[nf++] = u;
            if (units[u][0] != ' ' && units[u][0] != '\n')
                solid[ns++] = u;
            if (strchr("}]\"", units[u][0]))
                closers[nc++] = u;
            if (!strchr("{[", units[u][0]))
                calm[nq++] = u;
        }
        if (nf == 0) {
            doc[n] = '\0';
            fail_msg("a dead end: no byte continues the accepted prefix: %s", doc);
        }
        /* Whitespace fits between any two tokens, where little else does: drawn as often as
         * the rest, it would fill the documents. And a free string or array never ends by
         * chance: past a length, close more often. */
        const uint64_t r = xorshift(rng);
        int u = fits[r % (uint64_t)nf];
        if (ns > 0 && (r >> 24) % 8 != 0)
            u = solid[(r >> 8) % (uint64_t)ns];
        if (n > WALK_SOFT && (r >> 32) % 10 < 8) {
            if (nc > 0)
                u = closers[(r >> 40) % (uint64_t)nc];
            else if (nq > 0)
                u = calm[(r >> 40) % (uint64_t)nq];
        }
        if (mmrt_json_grammar_in_string(&g)) {
            /* the claim in_string makes, checked wherever the walk finds it true */
            mmrt_json_grammar_copy(&t, &g);
            if (!mmrt_json_grammar_feed(&t, "x", 1) || !mmrt_json_grammar_in_string(&t)) {
                doc[n] = '\0';
                fail_msg("in_string after %s, but 'x' does not stay in the string", doc);
            }
        }
        const size_t ul = strlen(units[u]);
        assert_true(mmrt_json_grammar_feed(&g, units[u], ul));
        memcpy(doc + n, units[u], ul);
        n += ul;
    }
    doc[n] = '\0';
    *len = n;
    return true;
}

static void test_random_documents(void **state)
{
    (void)state;
    static const struct {
        const char *schema;
        bool free_keys; /* keys not listed can repeat: jansson must not refuse duplicates */
    } schemas[] = {
        { "{'type':'object','properties':{'name':{'type':'string','maxLength':6},"
          "'age':{'type':'integer'},'tags':{'type':'array','items':{'type':'string',"
          "'minLength':1},'maxItems':3}},'required':['name','age']}", false },
        { "{'$defs':{'node':{'type':'object','properties':{'v':{'type':'integer'},"
          "'kids':{'type':'array','items':{'$ref':'#/$defs/node'},'maxItems':3}},"
          "'required':['v']}},'$ref':'#/$defs/node'}", false },
        { "{'type':'array','items':{'anyOf':[{'type':'number'},{'type':'null'},"
          "{'enum':['a','ab',true,[1],{'k':'v'}]}]},'minItems':1,'maxItems':4}", false },
        { "{'type':'object','additionalProperties':{'type':'string','minLength':1,"
          "'maxLength':3}}", true },
        { "{'type':'array','maxItems':3,'items':{'type':'object','additionalProperties':"
          "{'type':'integer'},'minProperties':1,'maxProperties':2}}", true },
        { "true", true },
        { "{'type':'string','minLength':2,'maxLength':4}", false },
        { "{'enum':[1,10,-2.5,'x',null,{'k':[1,2]}]}", false },
        { "{'type':'integer'}", false },
        { "{'type':'array','maxItems':3,'items':{'anyOf':[{'type':'object','properties':"
          "{'pet':{'const':'cat'},'meows':{'type':'integer','minimum':0,'maximum':9}},"
          "'required':['pet','meows'],'additionalProperties':false},{'type':'object',"
          "'properties':{'pet':{'enum':['dog','cat']},'barks':{'type':'boolean'},"
          "'name':{'type':'string','maxLength':3}},'required':['pet'],"
          "'additionalProperties':false}]}}", false },
        { "{'type':'array','items':{'type':'string','pattern':'^[a-c]{2,4}(-[0-9]+)?$'},"
          "'maxItems':3}", false },
        { "{'type':'array','items':{'type':'string','pattern':'b[0-9]','maxLength':5},"
          "'maxItems':3}", false },
        { "{'type':'array','items':{'type':'string','pattern':'^(ab|c)*d?$','minLength':3,"
          "'maxLength':6},'maxItems':3}", false },
        { "{'type':'array','items':{'type':'string','pattern':'[0-9]{2}','minLength':4,"
          "'maxLength':5},'maxItems':3}", false },
        { "{'type':'array','items':{'type':'integer','minimum':-12,'exclusiveMaximum':307},"
          "'maxItems':6}", false },
        { "{'type':'object','properties':{'opt':{'type':['string','null']},"
          "'n':{'anyOf':[{'type':'integer'},{'type':'number'}]},'b':{'type':'boolean'},"
          "'any':{}},'required':['b']}", true },
        { "{'type':'object','properties':{'list':{'type':'array','items':{'type':'array',"
          "'items':{'type':'integer'},'minItems':1,'maxItems':2}}},'required':['list']}",
          false },
        { "{'type':'object','properties':{'a':{'$ref':'#'},'z':{'const':'q'}},"
          "'required':['z']}", false },
        { "{'type':'array','items':{'type':'number','minimum':-2.5,'exclusiveMaximum':0.3},"
          "'maxItems':6}", false },
        { "{'type':'array','items':{'type':'number','exclusiveMinimum':0.001,'maximum':12.75},"
          "'maxItems':6}", false },
        { "{'type':'array','items':{'type':'number','minimum':-1e-3,'maximum':-1e-5},"
          "'maxItems':4}", false },
        { "{'type':'array','items':{'type':'integer','multipleOf':3,'minimum':-20,"
          "'maximum':50},'maxItems':6}", false },
        { "{'type':'array','items':{'type':'integer','multipleOf':7},'maxItems':6}", false },
        { "{'type':'array','prefixItems':[{'type':'number','exclusiveMinimum':0,"
          "'maximum':1},{'enum':['a','b']},{'type':'array','prefixItems':[{'type':'integer'}],"
          "'items':{'type':'boolean'},'maxItems':3}],'items':{'type':'null'},'maxItems':5}",
          false },
        { "{'type':'array','items':[{'type':'string','maxLength':2}],"
          "'additionalItems':{'type':'integer','multipleOf':4},'maxItems':4}", false },
        { "{'type':'object','properties':{'colors':{'type':'array','items':{'enum':['red',"
          "'re','green',1,10,100,true,null]},'uniqueItems':true},'flags':{'type':'array',"
          "'items':{'type':'boolean'},'uniqueItems':true}},'required':['colors']}", false },
        { "{'type':'array','maxItems':4,'items':{'anyOf':[{'properties':{'kind':{'const':"
          "'point'},'value':{'type':'array','items':{'type':'integer','minimum':0,'maximum':"
          "99},'maxItems':2}},'required':['kind','value']},{'properties':{'kind':{'enum':["
          "'label','tag']},'value':{'type':'string','maxLength':3}},'required':['kind']}]}}",
          false },
        { "{'type':'array','maxItems':3,'items':{'anyOf':[{'properties':{'x':{'type':"
          "'integer'},'y':{'type':'integer'},'t':{'const':'p'}},'required':['t','x']},"
          "{'properties':{'t':{'const':'q'},'y':{'type':'integer'},'x':{'type':'integer'}},"
          "'required':['y','t']}]}}", false },
        { "{'type':'array','maxItems':3,'items':{'oneOf':[{'type':'object','properties':"
          "{'pet':{'const':'cat'},'meows':{'type':'integer','minimum':0,'maximum':9}},"
          "'required':['pet','meows']},{'type':'object','properties':{'pet':{'enum':['dog',"
          "'wolf']},'name':{'type':'string','maxLength':3}},'required':['pet']},"
          "{'type':'null'}]}}", false },
    };
    enum { RUNS = 200 };
    uint64_t rng = 0x9e3779b97f4a7c15ull;
    char doc[WALK_CAP + 8];
    for (size_t k = 0; k < sizeof schemas / sizeof *schemas; k++) {
        char *text = q(schemas[k].schema);
        struct mmrt_json_schema *s = compile_ok(schemas[k].schema);
        json_error_t e;
        json_t *schema = json_loads(text, JSON_DECODE_ANY, &e);
        assert_non_null(schema);
        int finished = 0;
        for (int run = 0; run < RUNS; run++) {
            size_t len;
            if (!walk(s, &rng, doc, &len))
                continue;
            finished++;
            struct mmrt_json_grammar g;
            mmrt_json_grammar_init(&g, s);
            if (!mmrt_json_grammar_feed(&g, doc, len) || !mmrt_json_grammar_done(&g))
                fail_msg("walked, but not accepted fed whole\n  schema: %s\n  doc: %s", text,
                         doc);
            const size_t flags = JSON_DECODE_ANY | JSON_ALLOW_NUL |
                                 (schemas[k].free_keys ? 0 : JSON_REJECT_DUPLICATES);
            json_t *v = json_loadb(doc, len, flags, &e);
            if (v == NULL) {
                /* jansson holds integers in 64 bits and reals in doubles; JSON does not */
                if (strstr(e.text, "too big") != NULL || strstr(e.text, "overflow") != NULL)
                    continue;
                fail_msg("walked a document jansson refuses (%s)\n  schema: %s\n  doc: %s",
                         e.text, text, doc);
            }
            if (!conforms(schema, schema, v, true))
                fail_msg("walked a document outside the schema\n  schema: %s\n  doc: %s", text,
                         doc);
            json_decref(v);
        }
        /* most walks must end, or the test proves little */
        if (finished < RUNS / 2)
            fail_msg("only %d of %d walks ended under %d bytes: %s", finished, RUNS, WALK_CAP,
                     text);
        json_decref(schema);
        mmrt_json_schema_free(s);
        free(text);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_compile_values_and_bounds),
        cmocka_unit_test(test_accepted_schemas),
        cmocka_unit_test(test_parse_true),
        cmocka_unit_test(test_documents),
        cmocka_unit_test(test_enum_beside_assertions),
        cmocka_unit_test(test_long_counts),
        cmocka_unit_test(test_real_literals),
        cmocka_unit_test(test_number_bounds_exhaustive),
        cmocka_unit_test(test_patterns),
        cmocka_unit_test(test_object_unions),
        cmocka_unit_test(test_ref_chain),
        cmocka_unit_test(test_any_json),
        cmocka_unit_test(test_annotations_only),
        cmocka_unit_test(test_done),
        cmocka_unit_test(test_whitespace),
        cmocka_unit_test(test_depth),
        cmocka_unit_test(test_in_string),
        cmocka_unit_test(test_surrogates),
        cmocka_unit_test(test_copy),
        cmocka_unit_test(test_random_documents),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
