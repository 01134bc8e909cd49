/*
 * server/server.h — what the parts of `mmrt serve` share: the server's state, and the chat
 * completion handler's entry points (chat.c) for the HTTP layer (serve.c).
 *
 * Threads: libmicrohttpd's pool threads run the handlers; the runtime's worker thread runs
 * the job callbacks (tokens, accepted, done); one housekeeping thread sends keep-alive
 * comments to quiet streams and waits for the jobs of clients that went away; the main
 * thread loads the model and waits for SIGTERM.
 */
#ifndef MMRT_SERVER_SERVER_H
#define MMRT_SERVER_SERVER_H

#include <microhttpd.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

#include "metrics.h"
#include "mmrt/mmrt.h"
#include "server_conf.h"

enum server_state { STATE_LOADING, STATE_READY, STATE_DRAINING };

struct chat;

struct server {
    struct mmrt_server_conf conf;
    const char *ini;
    struct mmrt_runtime *_Atomic rt; /* NULL while loading */
    _Atomic int state;               /* enum server_state */
    struct MHD_Daemon *daemon;
    struct mmrt_metrics metrics;
    long created;                    /* when the model was loaded (GET /v1/models) */
    int max_images;
    struct mmrt_generation_defaults sampling; /* what a request that does not say gets */
    atomic_uint_fast64_t next_id;
    /* Every chat with a job (for keep-alives and the drain), and the jobs whose clients went
     * away, for the housekeeping thread to wait for. */
    pthread_mutex_t lock;
    pthread_cond_t wake;
    struct chat *live;
    struct chat *orphans;
    int n_live;
    bool stopping;
    pthread_t housekeeper;
};

/* POST /v1/chat/completions, called by serve.c's access handler with *con_cls as libmicrohttpd
 * keeps it. */
enum MHD_Result mmrt_chat_handle(struct server *s, struct MHD_Connection *mc, void **con_cls,
                                 const char *upload, size_t *upload_size);
/* libmicrohttpd's request-completed notification for a chat (*con_cls). */
void mmrt_chat_completed(struct server *s, void *con_cls, enum MHD_RequestTerminationCode why);
/* Housekeeping, about once a second: keep-alive comments for quiet streams. */
void mmrt_chat_tick(struct server *s);
/* Waits for the jobs of departed clients and frees them (housekeeping thread). */
void mmrt_chat_reap(struct server *s);
/* Cancels every running job (the drain ran out of time). */
void mmrt_chat_cancel_all(struct server *s);

/* max_queued requests are waiting: new ones get 429 and /health/ready says 503. */
bool mmrt_server_over_capacity(struct server *s, struct mmrt_runtime *rt);

/* Queues a JSON response (body is consumed) with the status, counting it in the metrics. */
enum MHD_Result mmrt_http_json(struct server *s, struct MHD_Connection *mc, unsigned status,
                               char *body);
/* The same with one more header (skipped when value is NULL or ""). */
enum MHD_Result mmrt_http_json_header(struct server *s, struct MHD_Connection *mc,
                                      unsigned status, char *body, const char *name,
                                      const char *value);
/* An OpenAI error object as the response. */
enum MHD_Result mmrt_http_error(struct server *s, struct MHD_Connection *mc, unsigned status,
                                const char *type, const char *code, const char *param,
                                const char *message);

#endif
