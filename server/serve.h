/*
 * server/serve.h — `mmrt serve --conf deploy.ini`: an OpenAI-compatible HTTP server over the
 * embedding API (docs/SERVING.md).
 */
#ifndef MMRT_SERVER_SERVE_H
#define MMRT_SERVER_SERVE_H

struct mmrt_serve_options {
    int port; /* overrides [server] port when ≥ 0 (0 = any free port) */
};

/* Runs the server until SIGTERM or SIGINT, then drains and returns 0; 2 for a configuration
 * error (the message is on stderr, with FILE:LINE), 1 for a failure while serving. Call once
 * per process, from its main thread. */
int mmrt_serve(const char *ini_path, const struct mmrt_serve_options *opts);

#endif
