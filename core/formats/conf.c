/*
 * core/formats/conf.c — deploy.ini through inih, with the checks inih leaves out (see conf.h).
 *
 * inih is driven by ini_parse_stream() with our own line reader, because Debian's build
 * passes no line numbers to the handler and silently splits lines longer than its buffer.
 * The reader therefore owns everything that is about lines: it counts them (inih calls the
 * handler for line N before it asks for line N+1, so the count is the handler's line), drops
 * the BOM, CR and indentation (indentation would otherwise turn a line into a continuation
 * value), refuses NUL, control characters, invalid UTF-8 and over-long lines, and parses
 * section headers itself — the handler never hears of a section without keys, so missing
 * required keys, duplicate sections and header lines can only be seen here. inih keeps the
 * key = value split and comment stripping; its own syntax errors come back as its return
 * value. The first error stops everything: the reader returns NULL once `failed` is set.
 */
#include "conf.h"

#include <errno.h>
#include <limits.h>
#include <ini.h>
#include <locale.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "file.h"

enum section_kind {
    SEC_NONE, SEC_MODEL, SEC_DEVICE, SEC_VISION, SEC_LANGUAGE, SEC_RUN, SEC_SCHEDULER,
    SEC_APP, /* a section the runtime keeps for the program that uses it ([server]) */
    SEC_CACHE
};

struct parser {
    const char *name; /* file name for messages */
    size_t dir_len;   /* bytes of name up to and including its last '/' */
    const char *text;
    size_t len, pos;
    int line; /* lines handed to inih so far = line of the current one */
    struct mmrt_conf *conf;
    enum section_kind kind;
    char section[64];  /* current section name, as inih reports it */
    int device;        /* index into conf->devices while kind == SEC_DEVICE */
    locale_t c_locale; /* for strtod_l, created on first use */
    bool failed;
    int err_line;
    struct mmrt_error err;
};

static void fail(struct parser *p, int line, mmrt_status st, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static void fail(struct parser *p, int line, mmrt_status st, const char *fmt, ...)
{
    if (p->failed)
        return;
    char msg[MMRT_ERROR_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    mmrt_error_set(&p->err, st, "%s:%d: %s", p->name, line, msg);
    p->failed = true;
    p->err_line = line;
}

static char *dup_n(const char *s, size_t n)
{
    char *d = malloc(n + 1);
    if (d) {
        memcpy(d, s, n);
        d[n] = '\0';
    }
    return d;
}

/* Joins a relative value to the INI file's folder; see mmrt_conf.model_path. */
static char *resolve_path(const struct parser *p, const char *v, size_t n)
{
    size_t dl = v[0] == '/' ? 0 : p->dir_len;
    char *d = malloc(dl + n + 1);
    if (d) {
        memcpy(d, p->name, dl);
        memcpy(d + dl, v, n);
        d[dl + n] = '\0';
    }
    return d;
}

static bool is_name_char(char c, const char *extra)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           strchr(extra, c) != NULL;
}

static bool is_name(const char *s, size_t n, size_t max, const char *extra)
{
    if (n == 0 || n > max)
        return false;
    for (size_t i = 0; i < n; i++)
        if (s[i] == '\0' || !is_name_char(s[i], extra))
            return false;
    return true;
}

/* Refuses NUL, control characters other than tab, and anything that is not UTF-8
 * (overlong forms, surrogates and code points above U+10FFFF included). */
static bool check_text(struct parser *p, const unsigned char *s, size_t n)
{
    for (size_t i = 0; i < n;) {
        unsigned c = s[i];
        if (c == 0) {
            fail(p, p->line, MMRT_ERR_CONFIG, "NUL byte at column %zu", i + 1);
            return false;
        }
        if ((c < 0x20 && c != '\t') || c == 0x7f) {
            fail(p, p->line, MMRT_ERR_CONFIG, "control character 0x%02x at column %zu", c,
                 i + 1);
            return false;
        }
        if (c < 0x80) {
            i++;
            continue;
        }
        size_t k = c >= 0xc2 && c <= 0xdf   ? 2
                   : (c & 0xf0) == 0xe0     ? 3
                   : c >= 0xf0 && c <= 0xf4 ? 4
                                            : 0;
        unsigned cp = k == 2 ? c & 0x1f : k == 3 ? c & 0x0f : c & 0x07;
        bool ok = k != 0 && i + k <= n;
        for (size_t j = 1; ok && j < k; j++) {
            ok = (s[i + j] & 0xc0) == 0x80;
            cp = cp << 6 | (s[i + j] & 0x3f);
        }
        if (ok && k == 3)
            ok = cp >= 0x800 && (cp < 0xd800 || cp > 0xdfff);
        if (ok && k == 4)
            ok = cp >= 0x10000 && cp <= 0x10ffff;
        if (!ok) {
            fail(p, p->line, MMRT_ERR_CONFIG, "invalid UTF-8 at column %zu", i + 1);
            return false;
        }
        i += k;
    }
    return true;
}

/* Called when a section ends (next header or end of file): required keys. */
static void finish_section(struct parser *p)
{
    struct mmrt_conf *c = p->conf;
    if (p->kind == SEC_MODEL && !c->model_path)
        fail(p, c->model_line, MMRT_ERR_CONFIG, "[model] missing required key 'path'");
    if (p->kind == SEC_DEVICE && !c->devices[p->device].plugin)
        fail(p, c->devices[p->device].line, MMRT_ERR_CONFIG,
             "[%s] missing required key 'plugin'", p->section);
    struct mmrt_conf_stage *stage = p->kind == SEC_VISION ? &c->vision
                                    : p->kind == SEC_LANGUAGE ? &c->language : NULL;
    if (stage && !stage->device)
        fail(p, stage->section_line, MMRT_ERR_CONFIG, "[%s] missing required key 'device'",
             p->section);
    p->kind = SEC_NONE;
}

static void add_device(struct parser *p, const char *name, size_t n)
{
    struct mmrt_conf *c = p->conf;
    if (!is_name(name, n, MMRT_CONF_MAX_NAME, "_-")) {
        fail(p, p->line, MMRT_ERR_CONFIG,
             "invalid device name '%.*s' in [device.NAME]: use 1..%d letters, digits, '_' "
             "or '-'", (int)n, name, MMRT_CONF_MAX_NAME);
        return;
    }
    for (int i = 0; i < c->n_devices; i++)
        if (strlen(c->devices[i].name) == n && memcmp(c->devices[i].name, name, n) == 0) {
            fail(p, p->line, MMRT_ERR_CONFIG, "duplicate section [device.%.*s] (first on line "
                 "%d)", (int)n, name, c->devices[i].line);
            return;
        }
    if (c->n_devices >= MMRT_CONF_MAX_DEVICES) {
        fail(p, p->line, MMRT_ERR_LIMIT, "more than %d [device.NAME] sections",
             MMRT_CONF_MAX_DEVICES);
        return;
    }
    struct mmrt_conf_device *devs = realloc(c->devices, (size_t)(c->n_devices + 1) * sizeof *devs);
    if (!devs) {
        fail(p, p->line, MMRT_ERR_NO_MEMORY, "out of memory");
        return;
    }
    c->devices = devs;
    struct mmrt_conf_device *d = &devs[c->n_devices];
    memset(d, 0, sizeof *d);
    d->name = dup_n(name, n);
    if (!d->name) {
        fail(p, p->line, MMRT_ERR_NO_MEMORY, "out of memory");
        return;
    }
    d->line = p->line;
    d->index = MMRT_CONF_DEFAULT_INDEX;
    d->pool_mb = MMRT_CONF_DEFAULT_POOL_MB;
    p->device = c->n_devices++;
    p->kind = SEC_DEVICE;
}

/* s[0] == '['. Mirrors inih's header rule, but refuses what inih would let through (text
 * after ']') and records the section, its line and duplicates. */
static void begin_section(struct parser *p, const char *s, size_t n)
{
    finish_section(p);
    if (p->failed)
        return;
    const char *close = memchr(s, ']', n);
    if (!close) {
        fail(p, p->line, MMRT_ERR_CONFIG, "section header without closing ']'");
        return;
    }
    const char *name = s + 1, *rest = close + 1, *end = s + n;
    size_t nn = (size_t)(close - name);
    while (rest < end && (*rest == ' ' || *rest == '\t'))
        rest++;
    if (rest < end && *rest != ';') {
        fail(p, p->line, MMRT_ERR_CONFIG, "unexpected text after section header [%.*s]",
             (int)nn, name);
        return;
    }
    struct mmrt_conf *c = p->conf;
    int *line = NULL;
    enum section_kind kind = SEC_NONE;
#define IS(lit) (nn == sizeof(lit) - 1 && memcmp(name, lit, nn) == 0)
    if (IS("model")) {
        kind = SEC_MODEL;
        line = &c->model_line;
    } else if (IS("run")) {
        kind = SEC_RUN;
        line = &c->run.line;
    } else if (IS("scheduler")) {
        kind = SEC_SCHEDULER;
        line = &c->scheduler.line;
    } else if (IS("server")) {
        kind = SEC_APP;
        line = &c->server_line;
    } else if (IS("cache")) {
        kind = SEC_CACHE;
        line = &c->cache.line;
    } else if (IS("stage.vision")) {
        kind = SEC_VISION;
        line = &c->vision.section_line;
    } else if (IS("stage.language")) {
        kind = SEC_LANGUAGE;
        line = &c->language.section_line;
    } else if (nn >= 7 && memcmp(name, "device.", 7) == 0) {
        kind = SEC_DEVICE;
    }
#undef IS
    if (kind == SEC_NONE) {
        fail(p, p->line, MMRT_ERR_CONFIG, "unknown section [%.*s]; expected [model], "
             "[device.NAME], [stage.vision], [stage.language], [scheduler], [cache], "
             "[server] or [run]", (int)nn, name);
        return;
    }
    if (kind == SEC_DEVICE) {
        add_device(p, name + 7, nn - 7);
    } else if (*line) {
        fail(p, p->line, MMRT_ERR_CONFIG, "duplicate section [%.*s] (first on line %d)",
             (int)nn, name, *line);
    } else {
        *line = p->line;
        p->kind = kind;
        if (kind == SEC_VISION)
            c->vision.present = true;
        if (kind == SEC_LANGUAGE)
            c->language.present = true;
    }
    if (!p->failed)
        snprintf(p->section, sizeof p->section, "%.*s", (int)nn, name);
}

/* inih's fgets-style reader: one line per call, LF or CRLF, ending in '\n' as inih expects. */
static char *read_line(char *buf, int num, void *stream)
{
    struct parser *p = stream;
    if (p->failed || p->pos >= p->len)
        return NULL;
    const char *s = p->text + p->pos;
    size_t n = p->len - p->pos;
    const char *nl = memchr(s, '\n', n);
    if (nl)
        n = (size_t)(nl - s);
    p->pos += nl ? n + 1 : n;
    p->line++;
    if (n > 0 && s[n - 1] == '\r')
        n--;
    if (p->line == 1 && n >= 3 && memcmp(s, "\xef\xbb\xbf", 3) == 0) {
        s += 3;
        n -= 3;
    }
    /* The line plus '\n' and NUL must fit the buffer inih hands us. */
    if (num < 3 || n > (size_t)num - 2) {
        fail(p, p->line, MMRT_ERR_LIMIT, "line too long: %zu bytes, at most %d", n,
             num < 3 ? 0 : num - 2);
        return NULL;
    }
    if (!check_text(p, (const unsigned char *)s, n))
        return NULL;
    while (n > 0 && (*s == ' ' || *s == '\t')) {
        s++;
        n--;
    }
    if (n > 0 && s[0] == '[') {
        begin_section(p, s, n);
        if (p->failed)
            return NULL;
    }
    memcpy(buf, s, n);
    buf[n] = '\n';
    buf[n + 1] = '\0';
    return buf;
}

/* Decimal integer in [min, max]: optional '-', then digits only. */
static bool parse_int(struct parser *p, const char *key, const char *v, size_t n, long long min,
                      long long max, long long *out)
{
    size_t i = v[0] == '-' ? 1 : 0;
    bool neg = i == 1, overflow = false;
    uint64_t mag = 0;
    if (i == n)
        goto malformed;
    for (; i < n; i++) {
        if (v[i] < '0' || v[i] > '9')
            goto malformed;
        unsigned d = (unsigned)(v[i] - '0');
        if (mag > (UINT64_MAX - d) / 10)
            overflow = true;
        else
            mag = mag * 10 + d;
    }
    /* Magnitudes beyond the long long range are simply out of range. */
    long long x = 0;
    if (!overflow && !neg && mag <= (uint64_t)LLONG_MAX)
        x = (long long)mag;
    else if (!overflow && neg && mag <= (uint64_t)LLONG_MAX + 1)
        x = mag == (uint64_t)LLONG_MAX + 1 ? LLONG_MIN : -(long long)mag;
    else
        overflow = true;
    if (overflow || x < min || x > max) {
        fail(p, p->line, MMRT_ERR_CONFIG, "[%s] %s = '%.*s': outside [%lld, %lld]",
             p->section, key, (int)n, v, min, max);
        return false;
    }
    *out = x;
    return true;
malformed:
    fail(p, p->line, MMRT_ERR_CONFIG, "[%s] %s = '%.*s': not a decimal integer", p->section,
         key, (int)n, v);
    return false;
}

static bool is_digit(char c)
{
    return c >= '0' && c <= '9';
}

/* Finite decimal real: [-]digits[.digits][e[+-]digits], at least one mantissa digit. The
 * grammar check keeps strtod's extras (nan, inf, hex, leading blanks) out. */
static bool parse_real(struct parser *p, const char *key, const char *v, size_t n, double min,
                       bool min_open, double max, double *out)
{
    size_t i = 0, digits = 0;
    if (i < n && v[i] == '-')
        i++;
    for (; i < n && is_digit(v[i]); i++)
        digits++;
    if (i < n && v[i] == '.')
        for (i++; i < n && is_digit(v[i]); i++)
            digits++;
    if (digits && i < n && (v[i] == 'e' || v[i] == 'E')) {
        size_t exp = 0;
        i++;
        if (i < n && (v[i] == '+' || v[i] == '-'))
            i++;
        for (; i < n && is_digit(v[i]); i++)
            exp++;
        if (!exp)
            digits = 0;
    }
    char tmp[256]; /* more than any value that fits a line */
    if (!digits || i != n || n >= sizeof tmp) {
        fail(p, p->line, MMRT_ERR_CONFIG, "[%s] %s = '%.*s': not a decimal number",
             p->section, key, (int)n, v);
        return false;
    }
    if (!p->c_locale) {
        /* strtod follows LC_NUMERIC, which an embedding program may have changed. */
        p->c_locale = newlocale(LC_NUMERIC_MASK, "C", (locale_t)0);
        if (!p->c_locale) {
            fail(p, p->line, MMRT_ERR_NO_MEMORY, "out of memory");
            return false;
        }
    }
    memcpy(tmp, v, n);
    tmp[n] = '\0';
    double x = strtod_l(tmp, NULL, p->c_locale);
    if (x == 0)
        x = 0; /* -0 -> 0 */
    if (!isfinite(x) || (min_open ? x <= min : x < min) || x > max) {
        fail(p, p->line, MMRT_ERR_CONFIG, "[%s] %s = '%.*s': outside %c%g, %g]", p->section,
             key, (int)n, v, min_open ? '(' : '[', min, max);
        return false;
    }
    *out = x;
    return true;
}

/* Every key this reader knows is set at most once and never to "". */
static bool once(struct parser *p, const char *key, size_t n, int *line)
{
    if (*line) {
        fail(p, p->line, MMRT_ERR_CONFIG, "[%s] duplicate key '%s' (first on line %d)",
             p->section, key, *line);
        return false;
    }
    if (n == 0) {
        fail(p, p->line, MMRT_ERR_CONFIG, "[%s] %s: empty value", p->section, key);
        return false;
    }
    *line = p->line;
    return true;
}

/* One of a key's named values (exact, lower case as documented). */
struct choice {
    const char *name;
    int value;
};

/* Sets *out to the value of the name v spells among names[count]; anything else is
 * "[section] key = 'v': expected <expected>". False when the key is refused (then *out is
 * untouched). */
static bool set_choice(struct parser *p, const char *key, const char *v, size_t n,
                       const struct choice *names, size_t count, const char *expected,
                       int *line, int *out)
{
    if (!once(p, key, n, line))
        return false;
    for (size_t i = 0; i < count; i++)
        if (strlen(names[i].name) == n && memcmp(names[i].name, v, n) == 0) {
            *out = names[i].value;
            return true;
        }
    fail(p, p->line, MMRT_ERR_CONFIG, "[%s] %s = '%.*s': expected %s", p->section, key, (int)n,
         v, expected);
    return false;
}

static const struct choice on_off[] = { { "on", 1 }, { "off", 0 } };

/* resolve joins the value to the INI file's folder. */
static void set_string(struct parser *p, const char *key, const char *v, size_t n, bool resolve,
                       char **field, int *line)
{
    if (!once(p, key, n, line))
        return;
    *field = resolve ? resolve_path(p, v, n) : dup_n(v, n);
    if (!*field)
        fail(p, p->line, MMRT_ERR_NO_MEMORY, "out of memory");
}

static bool set_int(struct parser *p, const char *key, const char *v, size_t n, long long min,
                    long long max, long long *out, int *line)
{
    return once(p, key, n, line) && parse_int(p, key, v, n, min, max, out);
}

static void unknown_key(struct parser *p, const char *key, const char *v, size_t n)
{
    fail(p, p->line, MMRT_ERR_CONFIG, "[%s] unknown key '%s' (value '%.*s')", p->section, key,
         (int)n, v);
}

static void device_key(struct parser *p, const char *key, const char *v, size_t n)
{
    struct mmrt_conf_device *d = &p->conf->devices[p->device];
    long long x;
    if (strcmp(key, "plugin") == 0) {
        set_string(p, key, v, n, false, &d->plugin, &d->plugin_line);
        /* The loader builds a file name from it: no '/', no "..". */
        if (!p->failed && !is_name(v, n, MMRT_CONF_MAX_NAME, "_-"))
            fail(p, p->line, MMRT_ERR_CONFIG, "[%s] plugin = '%.*s': not a plugin name "
                 "(1..%d letters, digits, '_' or '-')", p->section, (int)n, v,
                 MMRT_CONF_MAX_NAME);
    } else if (strcmp(key, "index") == 0) {
        if (set_int(p, key, v, n, 0, 1023, &x, &d->index_line))
            d->index = (int)x;
    } else if (strcmp(key, "pool_mb") == 0) {
        if (n == 4 && memcmp(v, "auto", 4) == 0) {
            if (once(p, key, n, &d->pool_mb_line))
                d->pool_mb = 0;
        } else if (n > 0 && (v[0] < '0' || v[0] > '9') && v[0] != '-') {
            if (once(p, key, n, &d->pool_mb_line))
                fail(p, p->line, MMRT_ERR_CONFIG, "[%s] pool_mb = '%.*s': expected auto or "
                     "MiB from 1 to 16777216", p->section, (int)n, v);
        } else if (set_int(p, key, v, n, 1, 16777216, &x, &d->pool_mb_line)) {
            d->pool_mb = (uint64_t)x;
        }
    } else if (strcmp(key, "level1") == 0) {
        int on;
        if (set_choice(p, key, v, n, on_off, sizeof on_off / sizeof on_off[0], "on or off",
                       &d->level1_line, &on))
            d->level1 = on ? MMRT_LEVEL1_ON : MMRT_LEVEL1_OFF;
    } else {
        size_t kn = strlen(key);
        if (!is_name(key, kn, MMRT_CONF_MAX_OPTION_KEY, "_.-")) {
            fail(p, p->line, MMRT_ERR_CONFIG, "[%s] invalid option key '%s' (1..%d letters, "
                 "digits, '_', '.' or '-')", p->section, key, MMRT_CONF_MAX_OPTION_KEY);
            return;
        }
        for (int i = 0; i < d->n_options; i++)
            if (strcmp(d->options[i].key, key) == 0) {
                fail(p, p->line, MMRT_ERR_CONFIG, "[%s] duplicate key '%s' (first on line %d)",
                     p->section, key, d->options[i].line);
                return;
            }
        if (d->n_options >= MMRT_CONF_MAX_OPTIONS) {
            fail(p, p->line, MMRT_ERR_LIMIT, "[%s] more than %d plugin-specific options",
                 p->section, MMRT_CONF_MAX_OPTIONS);
            return;
        }
        struct mmrt_conf_option *o =
            realloc(d->options, (size_t)(d->n_options + 1) * sizeof *o);
        if (!o) {
            fail(p, p->line, MMRT_ERR_NO_MEMORY, "out of memory");
            return;
        }
        d->options = o;
        o = &o[d->n_options];
        o->key = dup_n(key, kn);
        o->value = dup_n(v, n);
        o->line = p->line;
        if (!o->key || !o->value) {
            free(o->key);
            free(o->value);
            fail(p, p->line, MMRT_ERR_NO_MEMORY, "out of memory");
            return;
        }
        d->n_options++;
    }
}

static void run_key(struct parser *p, const char *key, const char *v, size_t n)
{
    struct mmrt_conf_run *r = &p->conf->run;
    long long x;
    if (strcmp(key, "image") == 0) {
        set_string(p, key, v, n, true, &r->image, &r->image_line);
    } else if (strcmp(key, "json_schema") == 0) {
        set_string(p, key, v, n, true, &r->json_schema, &r->json_schema_line);
    } else if (strcmp(key, "prompt") == 0) {
        set_string(p, key, v, n, false, &r->prompt, &r->prompt_line);
    } else if (strcmp(key, "max_tokens") == 0) {
        if (set_int(p, key, v, n, 1, 1000000, &x, &r->max_tokens_line))
            r->max_tokens = (long)x;
    } else if (strcmp(key, "seed") == 0) {
        if (set_int(p, key, v, n, 0, INT64_MAX, &x, &r->seed_line))
            r->seed = (uint64_t)x;
    } else if (strcmp(key, "top_k") == 0) {
        if (set_int(p, key, v, n, 0, 1000000, &x, &r->top_k_line))
            r->top_k = (long)x;
    } else if (strcmp(key, "temperature") == 0) {
        if (once(p, key, n, &r->temperature_line))
            parse_real(p, key, v, n, 0, false, 100, &r->temperature);
    } else if (strcmp(key, "top_p") == 0) {
        if (once(p, key, n, &r->top_p_line))
            parse_real(p, key, v, n, 0, true, 1, &r->top_p);
    } else if (strcmp(key, "repetition_penalty") == 0) {
        if (once(p, key, n, &r->repetition_penalty_line))
            parse_real(p, key, v, n, 0, true, 100, &r->repetition_penalty);
    } else if (strcmp(key, "presence_penalty") == 0) {
        if (once(p, key, n, &r->presence_penalty_line))
            parse_real(p, key, v, n, -2, false, 2, &r->presence_penalty);
    } else if (strcmp(key, "frequency_penalty") == 0) {
        if (once(p, key, n, &r->frequency_penalty_line))
            parse_real(p, key, v, n, -2, false, 2, &r->frequency_penalty);
    } else if (strcmp(key, "response_format") == 0) {
        static const struct choice names[] = { { "text", MMRT_RESPONSE_TEXT },
                                               { "json_object", MMRT_RESPONSE_JSON_OBJECT } };
        int value;
        if (set_choice(p, key, v, n, names, sizeof names / sizeof names[0],
                       "'text' or 'json_object'", &r->response_format_line, &value))
            r->response_format = value;
    } else {
        unknown_key(p, key, v, n);
    }
}

static void scheduler_key(struct parser *p, const char *key, const char *v, size_t n)
{
    struct mmrt_conf_scheduler *s = &p->conf->scheduler;
    long long x;
    if (strcmp(key, "max_batch") == 0) {
        if (set_int(p, key, v, n, 1, MMRT_CONF_MAX_BATCH, &x, &s->max_batch_line))
            s->max_batch = (int)x;
    } else if (strcmp(key, "prefill_chunk") == 0) {
        if (set_int(p, key, v, n, 1, MMRT_CONF_MAX_PREFILL_CHUNK, &x, &s->prefill_chunk_line))
            s->prefill_chunk = (int64_t)x;
    } else if (strcmp(key, "step_tokens") == 0) {
        if (set_int(p, key, v, n, 1, MMRT_CONF_MAX_STEP_TOKENS, &x, &s->step_tokens_line))
            s->step_tokens = (int64_t)x;
    } else if (strcmp(key, "vision_batch") == 0) {
        if (set_int(p, key, v, n, 1, MMRT_CONF_MAX_VISION_BATCH, &x, &s->vision_batch_line))
            s->vision_batch = (int)x;
    } else if (strcmp(key, "draft_tokens") == 0) {
        if (set_int(p, key, v, n, 0, MMRT_CONF_MAX_DRAFT_TOKENS, &x, &s->draft_tokens_line))
            s->draft_tokens = (int)x;
    } else if (strcmp(key, "draft_rows") == 0) {
        if (set_int(p, key, v, n, 2, MMRT_CONF_MAX_BATCH, &x, &s->draft_rows_line))
            s->draft_rows = (int)x;
    } else {
        unknown_key(p, key, v, n);
    }
}

/* [cache]: vision_entries = 0 turns the vision-feature cache off, which the runtime's
 * struct spells as a negative count (its 0 is the default). */
static void cache_key(struct parser *p, const char *key, const char *v, size_t n)
{
    struct mmrt_conf_cache *s = &p->conf->cache;
    long long x;
    if (strcmp(key, "vision_entries") == 0) {
        if (set_int(p, key, v, n, 0, MMRT_CONF_MAX_VISION_ENTRIES, &x, &s->vision_entries_line))
            s->vision_entries = x == 0 ? -1 : (int64_t)x;
    } else if (strcmp(key, "vision_mb") == 0) {
        if (set_int(p, key, v, n, 1, MMRT_CONF_MAX_VISION_MB, &x, &s->vision_mb_line))
            s->vision_mb = (int64_t)x;
    } else if (strcmp(key, "prefix") == 0) {
        int on;
        if (set_choice(p, key, v, n, on_off, sizeof on_off / sizeof on_off[0], "on or off",
                       &s->prefix_line, &on))
            s->prefix = on ? 1 : -1;
    } else {
        unknown_key(p, key, v, n);
    }
}

static void model_key(struct parser *p, const char *key, const char *v, size_t n)
{
    struct mmrt_conf *c = p->conf;
    long long x;
    if (strcmp(key, "path") == 0) {
        set_string(p, key, v, n, true, &c->model_path, &c->model_path_line);
    } else if (strcmp(key, "max_image_tokens") == 0) {
        if (set_int(p, key, v, n, 0, MMRT_CONF_MAX_IMAGE_TOKENS, &x, &c->max_image_tokens_line))
            c->max_image_tokens = (int64_t)x;
    } else if (strcmp(key, "max_kv_tokens") == 0) {
        if (set_int(p, key, v, n, 0, MMRT_CONF_MAX_KV_TOKENS, &x, &c->max_kv_tokens_line))
            c->max_kv_tokens = (int64_t)x;
    } else if (strcmp(key, "kv_page_tokens") == 0) {
        if (!set_int(p, key, v, n, 1, MMRT_CONF_MAX_KV_PAGE_TOKENS, &x, &c->kv_page_tokens_line))
            return;
        /* Pages are addressed by shifts in the kernels' index arithmetic on some devices and
         * a power of two keeps every page a whole number of cache lines. */
        if ((x & (x - 1)) != 0)
            fail(p, p->line, MMRT_ERR_CONFIG, "[%s] %s = %lld: must be a power of two",
                 p->section, key, x);
        else
            c->kv_page_tokens = (int64_t)x;
    } else if (strcmp(key, "kv_dtype") == 0) {
        static const struct choice names[] = {
            { "f32", MMRT_KV_F32 }, { "f16", MMRT_KV_F16 }, { "fp8", MMRT_KV_FP8 },
            { "int8", MMRT_KV_INT8 },
        };
        int value;
        if (set_choice(p, key, v, n, names, sizeof names / sizeof names[0],
                       "'f32', 'f16', 'fp8' or 'int8'", &c->kv_dtype_line, &value))
            c->kv_dtype = value;
    } else if (strcmp(key, "weights") == 0) {
        static const struct choice names[] = {
            { "checkpoint", MMRT_WEIGHTS_CHECKPOINT }, { "int8", MMRT_WEIGHTS_INT8 },
            { "int4", MMRT_WEIGHTS_INT4 }, { "int4-g128", MMRT_WEIGHTS_INT4 },
            { "int4-g64", MMRT_WEIGHTS_INT4_G64 }, { "int4-g32", MMRT_WEIGHTS_INT4_G32 },
        };
        int value;
        if (set_choice(p, key, v, n, names, sizeof names / sizeof names[0],
                       "'checkpoint', 'int8', 'int4' (groups of 128), 'int4-g64' or "
                       "'int4-g32'", &c->weights_line, &value))
            c->weights = value;
    } else if (strcmp(key, "oversize_images") == 0) {
        static const struct choice names[] = { { "refuse", MMRT_OVERSIZE_REFUSE },
                                               { "downscale", MMRT_OVERSIZE_DOWNSCALE } };
        int value;
        if (set_choice(p, key, v, n, names, sizeof names / sizeof names[0],
                       "'refuse' or 'downscale'", &c->oversize_images_line, &value))
            c->oversize_images = value;
    } else if (strcmp(key, "exif_orientation") == 0) {
        static const struct choice names[] = { { "ignore", MMRT_EXIF_IGNORE },
                                               { "apply", MMRT_EXIF_APPLY } };
        int value;
        if (set_choice(p, key, v, n, names, sizeof names / sizeof names[0], "'ignore' or 'apply'",
                       &c->exif_orientation_line, &value))
            c->exif_orientation = value;
    } else if (strcmp(key, "chat_template") == 0) {
        static const struct choice names[] = { { "auto", MMRT_CHAT_TEMPLATE_AUTO },
                                               { "llava", MMRT_CHAT_TEMPLATE_LLAVA },
                                               { "mistral", MMRT_CHAT_TEMPLATE_MISTRAL },
                                               { "chatml", MMRT_CHAT_TEMPLATE_CHATML },
                                               { "llama3", MMRT_CHAT_TEMPLATE_LLAMA3 } };
        int value;
        if (set_choice(p, key, v, n, names, sizeof names / sizeof names[0],
                       "'auto', 'llava', 'mistral', 'chatml' or 'llama3'",
                       &c->chat_template_line, &value))
            c->chat_template = value;
    } else if (strcmp(key, "image_kv_keep") == 0) {
        if (once(p, key, n, &c->image_kv_keep_line))
            parse_real(p, key, v, n, 0, true, 1, &c->image_kv_keep);
    } else if (strcmp(key, "image_kv_policy") == 0) {
        static const struct choice names[] = {
            { "key_norm_high", MMRT_IMAGE_KV_KEY_NORM_HIGH },
            { "key_norm_low", MMRT_IMAGE_KV_KEY_NORM_LOW },
            { "random", MMRT_IMAGE_KV_RANDOM },
            { "pool2x2", MMRT_IMAGE_KV_POOL2X2 },
        };
        int value;
        if (set_choice(p, key, v, n, names, sizeof names / sizeof names[0],
                       "'key_norm_high', 'key_norm_low', 'random' or 'pool2x2'",
                       &c->image_kv_policy_line, &value))
            c->image_kv_policy = value;
    } else {
        unknown_key(p, key, v, n);
    }
}

/* An application section's key, kept as text with its line: the program that reads the
 * section (mmrt serve) checks it and names FILE:LINE itself. Only names, duplicates and the
 * count are checked here. */
static void app_key(struct parser *p, const char *key, const char *v, size_t n)
{
    struct mmrt_conf *c = p->conf;
    const size_t kn = strlen(key);
    if (!is_name(key, kn, 63, "_.-")) {
        fail(p, p->line, MMRT_ERR_CONFIG, "[%s] key '%s': expected 1..63 of [A-Za-z0-9_.-]",
             p->section, key);
        return;
    }
    for (int i = 0; i < c->n_app; i++)
        if (strcmp(c->app[i].section, p->section) == 0 && strcmp(c->app[i].key, key) == 0) {
            fail(p, p->line, MMRT_ERR_CONFIG, "[%s] duplicate key '%s' (first on line %d)",
                 p->section, key, c->app[i].line);
            return;
        }
    if (c->n_app == MMRT_CONF_MAX_APP_KEYS) {
        fail(p, p->line, MMRT_ERR_LIMIT, "more than %d keys in application sections",
             MMRT_CONF_MAX_APP_KEYS);
        return;
    }
    if (c->n_app == c->cap_app) {
        int cap = c->cap_app ? 2 * c->cap_app : 8;
        struct mmrt_conf_entry *g = realloc(c->app, (size_t)cap * sizeof *g);
        if (!g) {
            fail(p, p->line, MMRT_ERR_NO_MEMORY, "out of memory");
            return;
        }
        c->app = g;
        c->cap_app = cap;
    }
    struct mmrt_conf_entry *e = &c->app[c->n_app];
    e->section = dup_n(p->section, strlen(p->section));
    e->key = dup_n(key, kn);
    e->value = dup_n(v, n);
    e->line = p->line;
    c->n_app++;
    if (!e->section || !e->key || !e->value)
        fail(p, p->line, MMRT_ERR_NO_MEMORY, "out of memory");
}

static int on_key(void *user, const char *section, const char *key, const char *value)
{
    struct parser *p = user;
    struct mmrt_conf *c = p->conf;
    if (p->failed)
        return 0;
    if (p->kind == SEC_NONE) {
        fail(p, p->line, MMRT_ERR_CONFIG, "key '%s' outside any section", key);
        return 0;
    }
    if (strcmp(section, p->section) != 0) {
        fail(p, p->line, MMRT_ERR_INTERNAL, "inih reports section [%s], expected [%s]",
             section, p->section);
        return 0;
    }
    if (!key[0]) {
        fail(p, p->line, MMRT_ERR_CONFIG, "[%s] missing key name before '='", p->section);
        return 0;
    }
    const char *v = value;
    size_t n = strlen(value);
    if (n > 0 && v[0] == '"') {
        if (n < 2 || v[n - 1] != '"') {
            fail(p, p->line, MMRT_ERR_CONFIG, "[%s] %s = '%s': unterminated double quote "
                 "(note: ' ;' starts a comment even inside quotes)", p->section, key, value);
            return 0;
        }
        v++;
        n -= 2;
    }
    switch (p->kind) {
    case SEC_MODEL:
        model_key(p, key, v, n);
        break;
    case SEC_VISION:
    case SEC_LANGUAGE: {
        struct mmrt_conf_stage *s = p->kind == SEC_VISION ? &c->vision : &c->language;
        if (strcmp(key, "device") == 0)
            set_string(p, key, v, n, false, &s->device, &s->line);
        else
            unknown_key(p, key, v, n);
        break;
    }
    case SEC_DEVICE:
        device_key(p, key, v, n);
        break;
    case SEC_RUN:
        run_key(p, key, v, n);
        break;
    case SEC_SCHEDULER:
        scheduler_key(p, key, v, n);
        break;
    case SEC_APP:
        app_key(p, key, v, n);
        break;
    case SEC_CACHE:
        cache_key(p, key, v, n);
        break;
    case SEC_NONE:
        break;
    }
    return p->failed ? 0 : 1;
}

static void check_stage(struct parser *p, const struct mmrt_conf_stage *s, const char *what)
{
    if (s->present && !mmrt_conf_find_device(p->conf, s->device))
        fail(p, s->line, MMRT_ERR_CONFIG, "[stage.%s] device = '%s': no [device.%s] section",
             what, s->device, s->device);
}

/* After the last line: the checks that need the whole file. */
static void finish_file(struct parser *p)
{
    struct mmrt_conf *c = p->conf;
    finish_section(p);
    if (!p->failed && c->n_devices == 0)
        fail(p, p->line > 0 ? p->line : 1, MMRT_ERR_CONFIG,
             "end of file: no [device.NAME] section; at least one device is required");
    /* Earliest line first, so fixing errors top-down never jumps back. */
    bool vision_first = !c->language.present ||
                        (c->vision.present && c->vision.line < c->language.line);
    check_stage(p, vision_first ? &c->vision : &c->language,
                vision_first ? "vision" : "language");
    check_stage(p, vision_first ? &c->language : &c->vision,
                vision_first ? "language" : "vision");
}

mmrt_status mmrt_conf_parse(const char *text, size_t len, const char *name,
                            struct mmrt_conf **out, struct mmrt_error *err)
{
    if ((!text && len) || !name || !out)
        return mmrt_error_set(err, MMRT_ERR_INVALID_ARG, "mmrt_conf_parse: NULL argument");
    if (len > MMRT_CONF_MAX_BYTES)
        return mmrt_error_set(err, MMRT_ERR_LIMIT, "%s: %zu bytes, more than the %d allowed "
                              "for a configuration file", name, len, MMRT_CONF_MAX_BYTES);
    mmrt_status st = MMRT_OK;
    const char *slash = strrchr(name, '/');
    struct parser p = {
        .name = name, .dir_len = slash ? (size_t)(slash - name) + 1 : 0, .text = text,
        .len = len,
    };
    p.conf = calloc(1, sizeof *p.conf);
    if (!p.conf || !(p.conf->path = dup_n(name, strlen(name)))) {
        st = mmrt_error_set(err, MMRT_ERR_NO_MEMORY, "%s: out of memory", name);
        goto cleanup;
    }
    p.conf->run.max_tokens = MMRT_CONF_DEFAULT_MAX_TOKENS;
    p.conf->run.top_p = MMRT_CONF_DEFAULT_TOP_P;

    int rc = ini_parse_stream(read_line, &p, on_key, &p);
    if (rc == -2) {
        p.failed = false;
        fail(&p, p.line, MMRT_ERR_NO_MEMORY, "out of memory in inih");
    } else if (rc > 0 && (!p.failed || rc < p.err_line)) {
        /* inih's own error (a line that is neither a header nor key = value) came first. */
        p.failed = false;
        fail(&p, rc, MMRT_ERR_CONFIG,
             "syntax error: expected '[section]', 'key = value' or a comment");
    }
    if (!p.failed)
        finish_file(&p);
    if (p.failed) {
        st = p.err.status;
        if (err)
            *err = p.err;
        goto cleanup;
    }
    *out = p.conf;
    p.conf = NULL;
cleanup:
    if (p.c_locale)
        freelocale(p.c_locale);
    mmrt_conf_destroy(p.conf);
    return st;
}

mmrt_status mmrt_conf_load(const char *path, struct mmrt_conf **out, struct mmrt_error *err)
{
    if (!path || !out)
        return mmrt_error_set(err, MMRT_ERR_INVALID_ARG, "mmrt_conf_load: NULL argument");
    char *buf = NULL;
    size_t n = 0;
    /* A pipe is fine (mmrt --conf <(…)); a directory or a device is refused by name, and
     * nothing here can block on a FIFO without a writer. */
    mmrt_status st = mmrt_file_read(path, MMRT_CONF_MAX_BYTES,
                                    MMRT_FILE_PIPE_OK | MMRT_FILE_MISSING_NOT_FOUND,
                                    " for a configuration file", &buf, &n, err);
    if (st == MMRT_OK)
        st = mmrt_conf_parse(buf, n, path, out, err);
    free(buf);
    return st;
}

void mmrt_conf_destroy(struct mmrt_conf *conf)
{
    if (!conf)
        return;
    for (int i = 0; i < conf->n_devices; i++) {
        struct mmrt_conf_device *d = &conf->devices[i];
        for (int j = 0; j < d->n_options; j++) {
            free(d->options[j].key);
            free(d->options[j].value);
        }
        free(d->options);
        free(d->name);
        free(d->plugin);
    }
    for (int i = 0; i < conf->n_app; i++) {
        free(conf->app[i].section);
        free(conf->app[i].key);
        free(conf->app[i].value);
    }
    free(conf->app);
    free(conf->devices);
    free(conf->path);
    free(conf->model_path);
    free(conf->vision.device);
    free(conf->language.device);
    free(conf->run.image);
    free(conf->run.prompt);
    free(conf->run.json_schema);
    free(conf);
}

const struct mmrt_conf_device *mmrt_conf_find_device(const struct mmrt_conf *conf,
                                                     const char *name)
{
    if (!conf || !name)
        return NULL;
    for (int i = 0; i < conf->n_devices; i++)
        if (strcmp(conf->devices[i].name, name) == 0)
            return &conf->devices[i];
    return NULL;
}

const struct mmrt_conf_option *mmrt_conf_find_option(const struct mmrt_conf_device *dev,
                                                     const char *key)
{
    if (!dev || !key)
        return NULL;
    for (int i = 0; i < dev->n_options; i++)
        if (strcmp(dev->options[i].key, key) == 0)
            return &dev->options[i];
    return NULL;
}
