/*
 * server/server_conf.h — the [server] section of a deploy.ini (docs/SERVING.md "Keys").
 *
 * The runtime keeps the section as text (mmrt_conf_read_section, with the same INI rules and
 * every other section checked); this reader gives each key its type and range and names
 * FILE:LINE for anything wrong, before a socket is opened or a weight is read.
 */
#ifndef MMRT_SERVER_CONF_H
#define MMRT_SERVER_CONF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define MMRT_SERVER_MAX_KEYS 64

struct mmrt_server_conf {
    char host[64];          /* listen address, numeric IPv4 or IPv6 (default 127.0.0.1) */
    int port;               /* 0 = any free port (printed at start); default 8080 */
    int threads;            /* HTTP threads (libmicrohttpd's pool); default 4 */
    uint64_t max_body_bytes;/* request body cap, 413 over it; max_body_mb, default 32 */
    int max_queued;         /* requests waiting (not running) before 429; default 64 */
    int max_connections;    /* open connections at once; default 512 */
    int connection_timeout_s; /* idle or slow clients are closed after it; default 60 */
    int keepalive_s;        /* ": keep-alive" to a stream that has nothing to send; 5 */
    int drain_s;            /* SIGTERM: running streams get this long to finish; 30 */
    int live_timeout_s;     /* /health/live fails when no step finished for this long; 120 */
    int retry_after_s;      /* Retry-After of a 429; 1 */
    char *model_name;       /* the id clients send as "model"; NULL: the model folder's name
                               (set once the runtime is made) */
    char *image_dir;        /* local image paths are read only under it; NULL = off */
    char **api_keys;        /* accepted bearer tokens; none = no authentication */
    int n_api_keys;
    bool openai_defaults;   /* sampling_defaults = openai: a request without temperature,
                               top_p, top_k or repetition_penalty gets OpenAI's (1, 1, off,
                               off) rather than the checkpoint's generation_config.json */
};

/* Reads [server] of ini_path (defaults for missing keys); relative paths are joined to the
 * INI file's folder. On failure err holds "FILE:LINE: message" or the runtime's reading
 * error, and *out is zeroed. */
int mmrt_server_conf_load(const char *ini_path, struct mmrt_server_conf *out, char *err,
                          size_t err_size);
void mmrt_server_conf_free(struct mmrt_server_conf *c);

#endif
