/*
 * server/serve.c — `mmrt serve`: the HTTP daemon, the small endpoints (models, health,
 * metrics) and the server's lifecycle: listen first, load the model (ready = 503 meanwhile),
 * serve, and on SIGTERM or SIGINT drain (ready = 503, running streams finish) and exit 0.
 */
#include "serve.h"

#include <errno.h>
#include <stdarg.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include "openai.h"
#include "server.h"

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

enum MHD_Result mmrt_http_json(struct server *s, struct MHD_Connection *mc, unsigned status,
                               char *body)
{
    return mmrt_http_json_header(s, mc, status, body, NULL, NULL);
}

enum MHD_Result mmrt_http_json_header(struct server *s, struct MHD_Connection *mc,
                                      unsigned status, char *body, const char *name,
                                      const char *value)
{
    static const char oom[] = "{\"error\":{\"message\":\"out of memory\",\"type\":"
                              "\"server_error\",\"param\":null,\"code\":null}}";
    struct MHD_Response *r;
    if (body)
        r = MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE);
    else {
        status = MHD_HTTP_SERVICE_UNAVAILABLE;
        r = MHD_create_response_from_buffer(sizeof oom - 1, (void *)oom, MHD_RESPMEM_PERSISTENT);
    }
    if (!r) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "application/json");
    if (name && value && value[0])
        MHD_add_response_header(r, name, value);
    if (status == MHD_HTTP_TOO_MANY_REQUESTS || status == MHD_HTTP_SERVICE_UNAVAILABLE) {
        char ra[16];
        snprintf(ra, sizeof ra, "%d", s->conf.retry_after_s);
        MHD_add_response_header(r, MHD_HTTP_HEADER_RETRY_AFTER, ra);
    }
    /* A server-side failure is the operator's to see, not only the client's. */
    if (status >= 500)
        fprintf(stderr, "mmrt serve: %u: %s\n", status, body ? body : oom);
    enum MHD_Result ret = MHD_queue_response(mc, status, r);
    MHD_destroy_response(r);
    mmrt_metrics_http(&s->metrics, status);
    return ret;
}

enum MHD_Result mmrt_http_error(struct server *s, struct MHD_Connection *mc, unsigned status,
                                const char *type, const char *code, const char *param,
                                const char *message)
{
    return mmrt_http_json(s, mc, status, mmrt_api_error_json_make(status, type, code, param,
                                                                  message));
}

static enum MHD_Result text_response(struct server *s, struct MHD_Connection *mc,
                                     unsigned status, const char *type, char *body)
{
    if (!body)
        return mmrt_http_error(s, mc, MHD_HTTP_SERVICE_UNAVAILABLE, "server_error", NULL, NULL,
                               "out of memory");
    struct MHD_Response *r = MHD_create_response_from_buffer(strlen(body), body,
                                                             MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, type);
    enum MHD_Result ret = MHD_queue_response(mc, status, r);
    MHD_destroy_response(r);
    mmrt_metrics_http(&s->metrics, status);
    return ret;
}

/* Constant-time comparison, so a key cannot be guessed byte by byte from response times. */
static bool same_secret(const char *a, size_t an, const char *b)
{
    const size_t bn = strlen(b);
    unsigned char d = an != bn;
    for (size_t i = 0; i < an && i < bn; i++)
        d |= (unsigned char)(a[i] ^ b[i]);
    return d == 0;
}

/* With API keys configured, /v1/ needs "Authorization: Bearer KEY" (probes and metrics do
 * not: Kubernetes and Prometheus reach them without secrets). */
static bool authorized(const struct server *s, struct MHD_Connection *mc)
{
    if (s->conf.n_api_keys == 0)
        return true;
    const char *h = MHD_lookup_connection_value(mc, MHD_HEADER_KIND,
                                                MHD_HTTP_HEADER_AUTHORIZATION);
    if (!h || strncmp(h, "Bearer ", 7) != 0)
        return false;
    const char *k = h + 7;
    const size_t n = strlen(k);
    bool ok = false;
    for (int i = 0; i < s->conf.n_api_keys; i++)
        ok |= same_secret(k, n, s->conf.api_keys[i]);
    return ok;
}

bool mmrt_server_over_capacity(struct server *s, struct mmrt_runtime *rt)
{
    struct mmrt_runtime_stats st = { .struct_size = sizeof st };
    return mmrt_stats(rt, &st) == MMRT_OK &&
           st.requests_waiting >= (uint64_t)s->conf.max_queued;
}

static enum MHD_Result health(struct server *s, struct MHD_Connection *mc, bool ready_probe)
{
    struct mmrt_runtime *rt = atomic_load(&s->rt);
    const int state = atomic_load(&s->state);
    const char *why = NULL;
    if (ready_probe) {
        if (state == STATE_LOADING)
            why = "loading";
        else if (state == STATE_DRAINING)
            why = "draining";
        else if (mmrt_server_over_capacity(s, rt))
            why = "over capacity";
    } else if (rt) {
        /* Alive while the scheduler makes progress (a stuck device shows here). */
        struct mmrt_runtime_stats st = { .struct_size = sizeof st };
        if (mmrt_stats(rt, &st) == MMRT_OK &&
            st.ms_since_progress > s->conf.live_timeout_s * 1e3)
            why = "the scheduler made no progress";
    }
    char *body = NULL;
    if (why) {
        if (asprintf(&body, "{\"status\":\"unavailable\",\"reason\":\"%s\"}\n", why) < 0)
            body = NULL;
    } else {
        body = strdup("{\"status\":\"ok\"}\n");
    }
    return text_response(s, mc, why ? MHD_HTTP_SERVICE_UNAVAILABLE : MHD_HTTP_OK,
                         "application/json", body);
}

static enum MHD_Result handler(void *cls, struct MHD_Connection *mc, const char *url,
                               const char *method, const char *version, const char *upload,
                               size_t *upload_size, void **con_cls)
{
    (void)version;
    struct server *s = cls;
    if (*con_cls) /* a chat completion's later calls */
        return mmrt_chat_handle(s, mc, con_cls, upload, upload_size);
    const bool get = strcmp(method, MHD_HTTP_METHOD_GET) == 0;
    const bool post = strcmp(method, MHD_HTTP_METHOD_POST) == 0;
    if (strcmp(url, "/health/live") == 0 && get)
        return health(s, mc, false);
    if (strcmp(url, "/health/ready") == 0 && get)
        return health(s, mc, true);
    if (strcmp(url, "/metrics") == 0 && get)
        return text_response(s, mc, MHD_HTTP_OK, "text/plain; version=0.0.4; charset=utf-8",
                             mmrt_metrics_render(&s->metrics, atomic_load(&s->rt),
                                                 atomic_load(&s->state) == STATE_READY));
    /* GET /v1/models/{id}: what the openai client's models.retrieve(id) asks. */
    const char *one = strncmp(url, "/v1/models/", 11) == 0 ? url + 11 : NULL;
    const bool models = strcmp(url, "/v1/models") == 0 || one;
    const bool chat = strcmp(url, "/v1/chat/completions") == 0;
    if (!models && !chat)
        return mmrt_http_error(s, mc, MHD_HTTP_NOT_FOUND, "invalid_request_error",
                               "not_found", NULL, "no such endpoint");
    if ((models && !get) || (chat && !post))
        return mmrt_http_error(s, mc, MHD_HTTP_METHOD_NOT_ALLOWED, "invalid_request_error",
                               NULL, NULL, models ? "use GET" : "use POST");
    if (!authorized(s, mc))
        return mmrt_http_error(s, mc, MHD_HTTP_UNAUTHORIZED, "invalid_request_error",
                               "invalid_api_key",
                               NULL, "missing or incorrect API key (Authorization: Bearer)");
    const int state = atomic_load(&s->state);
    if (state != STATE_READY)
        return mmrt_http_error(s, mc, MHD_HTTP_SERVICE_UNAVAILABLE, "server_error", NULL, NULL,
                               state == STATE_LOADING ? "the model is loading"
                                                      : "the server is shutting down");
    if (one && strcmp(one, s->conf.model_name) != 0) {
        char msg[256];
        snprintf(msg, sizeof msg, "The model '%.64s%s' does not exist; this server serves "
                 "'%.64s'.", one, strlen(one) > 64 ? "..." : "", s->conf.model_name);
        return mmrt_http_error(s, mc, MHD_HTTP_NOT_FOUND, "invalid_request_error",
                               "model_not_found", "model", msg);
    }
    if (models)
        return mmrt_http_json(s, mc, MHD_HTTP_OK,
                              one ? mmrt_model_json(s->conf.model_name, s->created)
                                  : mmrt_models_json(s->conf.model_name, s->created));
    return mmrt_chat_handle(s, mc, con_cls, upload, upload_size);
}

static void completed(void *cls, struct MHD_Connection *mc, void **con_cls,
                      enum MHD_RequestTerminationCode why)
{
    (void)mc;
    if (*con_cls)
        mmrt_chat_completed(cls, *con_cls, why);
    *con_cls = NULL;
}

static void *housekeeping(void *arg)
{
    struct server *s = arg;
    pthread_mutex_lock(&s->lock);
    while (!s->stopping || s->orphans) {
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_sec += 1;
        if (!s->orphans)
            pthread_cond_timedwait(&s->wake, &s->lock, &until);
        pthread_mutex_unlock(&s->lock);
        mmrt_chat_reap(s);
        mmrt_chat_tick(s);
        pthread_mutex_lock(&s->lock);
    }
    pthread_mutex_unlock(&s->lock);
    return NULL;
}

static void log_line(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static void log_line(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("mmrt serve: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    fflush(stderr);
}

static enum mmrt_log_level server_log_level(void)
{
    const char *v = getenv("MMRT_LOG");
    if (v && strcmp(v, "debug") == 0)
        return MMRT_LOG_DEBUG;
    if (v && strcmp(v, "info") == 0)
        return MMRT_LOG_INFO;
    return MMRT_LOG_WARN;
}

static void mhd_log(void *cls, const char *fmt, va_list ap)
{
    (void)cls;
    if (server_log_level() > MMRT_LOG_INFO)
        return;
    fputs("mmrt serve: http: ", stderr);
    vfprintf(stderr, fmt, ap);
}

/* The last path component of the model folder: the default model id. */
static char *folder_name(const char *path)
{
    size_t n = strlen(path);
    while (n > 1 && path[n - 1] == '/')
        n--;
    size_t b = n;
    while (b > 0 && path[b - 1] != '/')
        b--;
    char *s = malloc(n - b + 1);
    if (s) {
        memcpy(s, path + b, n - b);
        s[n - b] = '\0';
    }
    return s;
}

static struct MHD_Daemon *start_daemon(struct server *s, char *err, size_t err_size)
{
    struct sockaddr_storage ss;
    memset(&ss, 0, sizeof ss);
    unsigned flags = MHD_USE_EPOLL_INTERNAL_THREAD | MHD_ALLOW_SUSPEND_RESUME |
                     MHD_USE_ERROR_LOG;
    struct sockaddr_in *v4 = (struct sockaddr_in *)&ss;
    struct sockaddr_in6 *v6 = (struct sockaddr_in6 *)&ss;
    if (inet_pton(AF_INET, s->conf.host, &v4->sin_addr) == 1) {
        v4->sin_family = AF_INET;
        v4->sin_port = htons((uint16_t)s->conf.port);
    } else {
        inet_pton(AF_INET6, s->conf.host, &v6->sin6_addr);
        v6->sin6_family = AF_INET6;
        v6->sin6_port = htons((uint16_t)s->conf.port);
        flags |= MHD_USE_IPv6;
    }
    struct MHD_Daemon *d = MHD_start_daemon(
        flags, (uint16_t)s->conf.port, NULL, NULL, handler, s,
        MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&ss,
        MHD_OPTION_THREAD_POOL_SIZE, (unsigned)s->conf.threads,
        MHD_OPTION_CONNECTION_LIMIT, (unsigned)s->conf.max_connections,
        MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)s->conf.connection_timeout_s,
        MHD_OPTION_NOTIFY_COMPLETED, completed, s,
        MHD_OPTION_EXTERNAL_LOGGER, mhd_log, NULL,
        MHD_OPTION_END);
    if (!d)
        snprintf(err, err_size, "%s: cannot listen on %s port %d: %s", s->ini, s->conf.host,
                 s->conf.port, strerror(errno));
    return d;
}

int mmrt_serve(const char *ini_path, const struct mmrt_serve_options *opts)
{
    static struct server srv; /* one server per process: signals are process-wide */
    struct server *s = &srv;
    memset(s, 0, sizeof *s);
    char err[2048] = "";
    s->ini = ini_path;
    if (mmrt_server_conf_load(ini_path, &s->conf, err, sizeof err) != MMRT_OK) {
        fprintf(stderr, "mmrt serve: %s\n", err);
        return 2;
    }
    if (opts && opts->port >= 0)
        s->conf.port = opts->port;
    /* Signals are taken by sigwait in this thread only: every thread started below inherits
     * the mask, so SIGTERM never interrupts a handler or the worker. */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGTERM);
    sigaddset(&sigs, SIGINT);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);
    mmrt_metrics_init(&s->metrics);
    pthread_mutex_init(&s->lock, NULL);
    pthread_cond_init(&s->wake, NULL);
    atomic_init(&s->state, STATE_LOADING);
    atomic_init(&s->rt, NULL);
    int code = 0;
    s->daemon = start_daemon(s, err, sizeof err);
    if (!s->daemon) {
        fprintf(stderr, "mmrt serve: %s\n", err);
        code = 2;
        goto out;
    }
    pthread_create(&s->housekeeper, NULL, housekeeping, s);
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(s->daemon, MHD_DAEMON_INFO_BIND_PORT);
    const long port = info ? (long)info->port : s->conf.port;
    /* One line on stdout that scripts and tests read for the port (port = 0). */
    printf("mmrt serve: listening on http://%s:%ld\n", s->conf.host, port);
    fflush(stdout);

    struct mmrt_runtime *rt = NULL;
    const double t0 = now_ms();
    mmrt_status st = mmrt_create_from_file(ini_path, &rt, err, sizeof err);
    if (st == MMRT_OK && !mmrt_model_type(rt)) {
        snprintf(err, sizeof err, "%s: no [model] configured; nothing to serve", ini_path);
        st = MMRT_ERR_CONFIG;
    }
    if (st != MMRT_OK) {
        fprintf(stderr, "mmrt serve: %s\n", err);
        code = 2;
        goto stop;
    }
    if (!s->conf.model_name && !(s->conf.model_name = folder_name(mmrt_model_path(rt)))) {
        code = 1;
        goto stop;
    }
    s->max_images = mmrt_model_max_images(rt);
    s->sampling = (struct mmrt_generation_defaults){ .struct_size = sizeof s->sampling };
    if (!s->conf.openai_defaults)
        mmrt_generation_defaults(rt, &s->sampling);
    s->created = (long)time(NULL);
    atomic_store(&s->rt, rt);
    atomic_store(&s->state, STATE_READY);
    log_line("model '%s' ready after %ld ms", s->conf.model_name, (long)(now_ms() - t0));

    int sig = 0;
    sigwait(&sigs, &sig);
    atomic_store(&s->state, STATE_DRAINING);
    log_line("%s received; draining (up to %d s)", sig == SIGTERM ? "SIGTERM" : "SIGINT",
             s->conf.drain_s);
    /* Running streams finish; after drain_s they are cancelled (their clients get what was
     * generated so far and a closed stream). */
    const double deadline = now_ms() + s->conf.drain_s * 1e3;
    bool cancelled = false;
    for (;;) {
        pthread_mutex_lock(&s->lock);
        const int live = s->n_live;
        pthread_mutex_unlock(&s->lock);
        if (live == 0)
            break;
        if (!cancelled && now_ms() > deadline) {
            mmrt_chat_cancel_all(s);
            cancelled = true;
        }
        struct timespec ts = { 0, 20 * 1000 * 1000 };
        nanosleep(&ts, NULL);
    }
stop:
    /* Every chat has ended, so no connection is suspended: the daemon may stop. */
    pthread_mutex_lock(&s->lock);
    s->stopping = true;
    pthread_cond_broadcast(&s->wake);
    pthread_mutex_unlock(&s->lock);
    pthread_join(s->housekeeper, NULL);
    MHD_stop_daemon(s->daemon);
    atomic_store(&s->rt, NULL);
    mmrt_destroy(rt);
out:
    mmrt_metrics_destroy(&s->metrics);
    pthread_cond_destroy(&s->wake);
    pthread_mutex_destroy(&s->lock);
    mmrt_server_conf_free(&s->conf);
    if (code == 0)
        log_line("stopped");
    return code;
}
