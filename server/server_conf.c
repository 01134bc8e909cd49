/* server/server_conf.c — [server] keys (server_conf.h). */
#include "server_conf.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <arpa/inet.h>

#include "mmrt/mmrt.h"

#define MAX_API_KEYS 64
#define MAX_KEY_FILE_BYTES (64 * 1024)

struct reader {
    const char *ini;
    struct mmrt_server_conf *c;
    char *err;
    size_t err_size;
    int seen_api_keys_line;
};

static bool fail(struct reader *r, int line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static bool(fail)(struct reader *r, int line, const char *fmt, ...)
{
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    snprintf(r->err, r->err_size, "%s:%d: [server] %s", r->ini, line, msg);
    /* Values are echoed from the file, and the INI reader lets a tab through: keep the
     * message one printable line, as error.h's messages are (found by fuzz_server_conf). */
    for (char *c = r->err; r->err_size && *c; c++)
        if ((unsigned char)*c < 0x20 || *c == 0x7f)
            *c = '?';
    return false;
}
#ifdef __clang_analyzer__ /* returns false: see MMRT_RETURNS_STATUS in core/error.h */
#define fail(r, line, ...) ((void)(fail)(r, line, __VA_ARGS__), false)
#endif

/* Plain decimal in [min, max], the rule the runtime's own keys follow (conf.h). */
static bool int_value(struct reader *r, const char *key, const char *v, int line, long min,
                      long max, long *out)
{
    const char *p = v;
    if (*p == '-')
        p++;
    bool digits = *p != '\0';
    for (; *p; p++)
        digits &= *p >= '0' && *p <= '9';
    errno = 0;
    long x = digits ? strtol(v, NULL, 10) : 0;
    if (!digits || errno == ERANGE || x < min || x > max)
        return fail(r, line, "%s = '%s': expected an integer %ld … %ld", key, v, min, max);
    *out = x;
    return true;
}

/* A relative path is joined to the INI file's folder, as [model] path is. */
static char *resolve(const char *ini, const char *v)
{
    const char *slash = strrchr(ini, '/');
    if (v[0] == '/' || !slash)
        return strdup(v);
    const size_t dn = (size_t)(slash - ini) + 1;
    char *s = malloc(dn + strlen(v) + 1);
    if (s) {
        memcpy(s, ini, dn);
        strcpy(s + dn, v);
    }
    return s;
}

/* A bearer token: printable ASCII without spaces or commas, 1 … 256 bytes. */
static bool token_ok(const char *s, size_t n)
{
    if (n == 0 || n > 256)
        return false;
    for (size_t i = 0; i < n; i++)
        if (s[i] <= ' ' || s[i] > '~' || s[i] == ',')
            return false;
    return true;
}

static bool add_key(struct reader *r, int line, const char *s, size_t n, const char *where)
{
    struct mmrt_server_conf *c = r->c;
    if (!token_ok(s, n))
        return fail(r, line, "%s: an API key must be 1 … 256 printable characters without "
                    "spaces or commas", where);
    if (c->n_api_keys == MAX_API_KEYS)
        return fail(r, line, "%s: more than %d API keys", where, MAX_API_KEYS);
    if (!c->api_keys && !(c->api_keys = calloc(MAX_API_KEYS, sizeof *c->api_keys)))
        return fail(r, line, "out of memory");
    char *k = malloc(n + 1);
    if (!k)
        return fail(r, line, "out of memory");
    memcpy(k, s, n);
    k[n] = '\0';
    c->api_keys[c->n_api_keys++] = k;
    return true;
}

/* api_keys_file: one key per line; blank lines and lines starting with '#' are skipped. */
static bool read_key_file(struct reader *r, int line, const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return fail(r, line, "api_keys_file = '%s': %s", path, strerror(errno));
    char *buf = malloc(MAX_KEY_FILE_BYTES + 1);
    size_t n = buf ? fread(buf, 1, MAX_KEY_FILE_BYTES + 1, f) : 0;
    fclose(f);
    if (!buf)
        return fail(r, line, "out of memory");
    bool ok = true;
    if (n > MAX_KEY_FILE_BYTES)
        ok = fail(r, line, "api_keys_file = '%s': larger than %d bytes", path,
                  MAX_KEY_FILE_BYTES);
    for (size_t i = 0, ln = 1; ok && i < n; ln++) {
        size_t e = i;
        while (e < n && buf[e] != '\n')
            e++;
        size_t len = e - i;
        if (len && buf[i + len - 1] == '\r')
            len--;
        if (len && buf[i] != '#') {
            char where[600];
            snprintf(where, sizeof where, "api_keys_file '%s' line %zu", path, ln);
            ok = add_key(r, line, buf + i, len, where);
        }
        i = e + 1;
    }
    free(buf);
    if (ok && r->c->n_api_keys == 0)
        ok = fail(r, line, "api_keys_file = '%s' holds no key", path);
    return ok;
}

static bool on_key(void *user, const char *key, const char *v, int line)
{
    struct reader *r = user;
    struct mmrt_server_conf *c = r->c;
    long x = 0;
    if (!v[0])
        return fail(r, line, "%s: empty value", key);
    if (strcmp(key, "host") == 0) {
        unsigned char a[16];
        if (strlen(v) >= sizeof c->host ||
            (inet_pton(AF_INET, v, a) != 1 && inet_pton(AF_INET6, v, a) != 1))
            return fail(r, line, "host = '%s': expected a numeric IPv4 or IPv6 address (such "
                        "as 127.0.0.1 or 0.0.0.0)", v);
        snprintf(c->host, sizeof c->host, "%s", v);
    } else if (strcmp(key, "port") == 0) {
        if (!int_value(r, key, v, line, 0, 65535, &x))
            return false;
        c->port = (int)x;
    } else if (strcmp(key, "threads") == 0) {
        if (!int_value(r, key, v, line, 1, 256, &x))
            return false;
        c->threads = (int)x;
    } else if (strcmp(key, "max_body_mb") == 0) {
        if (!int_value(r, key, v, line, 1, 1024, &x))
            return false;
        c->max_body_bytes = (uint64_t)x << 20;
    } else if (strcmp(key, "max_queued") == 0) {
        if (!int_value(r, key, v, line, 1, 1000000, &x))
            return false;
        c->max_queued = (int)x;
    } else if (strcmp(key, "max_connections") == 0) {
        if (!int_value(r, key, v, line, 1, 100000, &x))
            return false;
        c->max_connections = (int)x;
    } else if (strcmp(key, "connection_timeout_s") == 0) {
        if (!int_value(r, key, v, line, 1, 3600, &x))
            return false;
        c->connection_timeout_s = (int)x;
    } else if (strcmp(key, "keepalive_s") == 0) {
        if (!int_value(r, key, v, line, 1, 3600, &x))
            return false;
        c->keepalive_s = (int)x;
    } else if (strcmp(key, "drain_s") == 0) {
        if (!int_value(r, key, v, line, 0, 86400, &x))
            return false;
        c->drain_s = (int)x;
    } else if (strcmp(key, "live_timeout_s") == 0) {
        if (!int_value(r, key, v, line, 1, 86400, &x))
            return false;
        c->live_timeout_s = (int)x;
    } else if (strcmp(key, "retry_after_s") == 0) {
        if (!int_value(r, key, v, line, 1, 3600, &x))
            return false;
        c->retry_after_s = (int)x;
    } else if (strcmp(key, "model_name") == 0) {
        if (strlen(v) > 256)
            return fail(r, line, "model_name: at most 256 bytes");
        free(c->model_name);
        if (!(c->model_name = strdup(v)))
            return fail(r, line, "out of memory");
    } else if (strcmp(key, "image_dir") == 0) {
        free(c->image_dir);
        if (!(c->image_dir = resolve(r->ini, v)))
            return fail(r, line, "out of memory");
    } else if (strcmp(key, "api_keys") == 0) {
        for (const char *s = v; *s;) {
            const char *e = strchr(s, ',');
            size_t n = e ? (size_t)(e - s) : strlen(s);
            while (n && *s == ' ')
                s++, n--;
            while (n && s[n - 1] == ' ')
                n--;
            if (!add_key(r, line, s, n, "api_keys"))
                return false;
            s += n;
            while (*s == ' ')
                s++;
            if (*s == ',')
                s++;
        }
    } else if (strcmp(key, "sampling_defaults") == 0) {
        if (strcmp(v, "checkpoint") != 0 && strcmp(v, "openai") != 0)
            return fail(r, line, "sampling_defaults = '%s': expected 'checkpoint' or 'openai'",
                        v);
        c->openai_defaults = strcmp(v, "openai") == 0;
    } else if (strcmp(key, "api_keys_file") == 0) {
        char *path = resolve(r->ini, v);
        bool ok = path ? read_key_file(r, line, path) : fail(r, line, "out of memory");
        free(path);
        return ok;
    } else {
        return fail(r, line, "unknown key '%s' (value '%s'); see docs/SERVING.md", key, v);
    }
    return true;
}

int mmrt_server_conf_load(const char *ini_path, struct mmrt_server_conf *out, char *err,
                          size_t err_size)
{
    memset(out, 0, sizeof *out);
    snprintf(out->host, sizeof out->host, "127.0.0.1");
    out->port = 8080;
    out->threads = 4;
    out->max_body_bytes = (uint64_t)32 << 20;
    out->max_queued = 64;
    out->max_connections = 512;
    out->connection_timeout_s = 60;
    out->keepalive_s = 5;
    out->drain_s = 30;
    out->live_timeout_s = 120;
    out->retry_after_s = 1;
    struct reader r = { .ini = ini_path, .c = out, .err = err, .err_size = err_size };
    if (err && err_size)
        err[0] = '\0';
    mmrt_status st = mmrt_conf_read_section(ini_path, "server", on_key, &r, err, err_size);
    if (st != MMRT_OK) {
        mmrt_server_conf_free(out);
        return st;
    }
    return MMRT_OK;
}

void mmrt_server_conf_free(struct mmrt_server_conf *c)
{
    for (int i = 0; i < c->n_api_keys; i++)
        free(c->api_keys[i]);
    free(c->api_keys);
    free(c->model_name);
    free(c->image_dir);
    memset(c, 0, sizeof *c);
}
