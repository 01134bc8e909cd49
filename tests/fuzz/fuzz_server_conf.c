/*
 * tests/fuzz/fuzz_server_conf.c — libFuzzer target for the [server] section of a deploy.ini
 * as mmrt serve reads it (server/server_conf.c over the runtime's INI reader).
 *
 * The input is the INI file, optionally followed by "\n#KEYS#\n" and the text of an API key
 * file. Once per process the target makes a temporary folder; each input is written there as
 * deploy.ini (and keys.txt, which a relative `api_keys_file = keys.txt` names), then read
 * with mmrt_server_conf_load(). Asserted:
 *   - refused: *out all zero, as the header promises, and the message one line of printable
 *     text (no control byte: values echoed from the file must not drive a terminal);
 *   - accepted: every value in its documented range (docs/SERVING.md "Keys"), the host a
 *     numeric IPv4 or IPv6 address, at most 64 API keys of 1–256 printable characters
 *     without spaces or commas, a model name of at most 256 bytes; then freed (LeakSanitizer
 *     checks it).
 * Invariants are checked with __builtin_trap(), which libFuzzer reports as a crash. The
 * folder is removed at exit.
 *
 * The same entry point is linked into the normal build with replay_main.c, so the committed
 * corpus (tests/fuzz/corpus/server_conf) runs as a ctest everywhere.
 */
#include <arpa/inet.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fuzz_check.h"
#include "server_conf.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char SEP[] = "\n#KEYS#\n";
static char g_dir[64], g_ini[128], g_keys[128];
static bool g_ready;

static void cleanup(void)
{
    unlink(g_ini);
    unlink(g_keys);
    rmdir(g_dir);
}

static void write_file(const char *path, const void *bytes, size_t n)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0 || write(fd, bytes, n) != (ssize_t)n || close(fd) != 0) {
        perror(path);
        abort();
    }
}

static bool token_ok(const char *s)
{
    const size_t n = strlen(s);
    if (n == 0 || n > 256)
        return false;
    for (size_t i = 0; i < n; i++)
        if (s[i] <= ' ' || s[i] > '~' || s[i] == ',')
            return false;
    return true;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > (1u << 20))
        return 0;
    if (!g_ready) {
        snprintf(g_dir, sizeof g_dir, "/tmp/mmrt-fuzz-server-XXXXXX");
        if (!mkdtemp(g_dir)) {
            perror("mkdtemp");
            abort();
        }
        snprintf(g_ini, sizeof g_ini, "%s/deploy.ini", g_dir);
        snprintf(g_keys, sizeof g_keys, "%s/keys.txt", g_dir);
        atexit(cleanup);
        g_ready = true;
    }
    const char *in = (const char *)data;
    const char *sep = size ? memmem(in, size, SEP, sizeof SEP - 1) : NULL;
    const size_t ini_n = sep ? (size_t)(sep - in) : size;
    write_file(g_ini, in, ini_n);
    if (sep)
        write_file(g_keys, sep + sizeof SEP - 1, size - ini_n - (sizeof SEP - 1));
    else
        unlink(g_keys);

    struct mmrt_server_conf c;
    memset(&c, 0xA5, sizeof c);
    char err[1024];
    memset(err, 0xA5, sizeof err);
    const int st = mmrt_server_conf_load(g_ini, &c, err, sizeof err);
    if (st != 0) {
        static const struct mmrt_server_conf zero;
        CHECK(memcmp(&c, &zero, sizeof c) == 0);
        const size_t len = strnlen(err, sizeof err);
        CHECK(len > 0 && len < sizeof err);
        for (size_t i = 0; i < len; i++)
            CHECK((unsigned char)err[i] >= 0x20 && err[i] != 0x7f);
        return 0;
    }
    unsigned char addr[16];
    CHECK(strnlen(c.host, sizeof c.host) < sizeof c.host);
    CHECK(inet_pton(AF_INET, c.host, addr) == 1 || inet_pton(AF_INET6, c.host, addr) == 1);
    CHECK(c.port >= 0 && c.port <= 65535);
    CHECK(c.threads >= 1 && c.threads <= 256);
    CHECK(c.max_body_bytes >= (1u << 20) && c.max_body_bytes <= (1024ull << 20) &&
          c.max_body_bytes % (1u << 20) == 0);
    CHECK(c.max_queued >= 1 && c.max_queued <= 1000000);
    CHECK(c.max_connections >= 1 && c.max_connections <= 100000);
    CHECK(c.connection_timeout_s >= 1 && c.connection_timeout_s <= 3600);
    CHECK(c.keepalive_s >= 1 && c.keepalive_s <= 3600);
    CHECK(c.drain_s >= 0 && c.drain_s <= 86400);
    CHECK(c.live_timeout_s >= 1 && c.live_timeout_s <= 86400);
    CHECK(c.retry_after_s >= 1 && c.retry_after_s <= 3600);
    CHECK(!c.model_name || (c.model_name[0] && strlen(c.model_name) <= 256));
    CHECK(!c.image_dir || c.image_dir[0]);
    CHECK(c.n_api_keys >= 0 && c.n_api_keys <= 64);
    CHECK(c.n_api_keys == 0 || c.api_keys);
    for (int i = 0; i < c.n_api_keys; i++)
        CHECK(c.api_keys[i] && token_ok(c.api_keys[i]));
    mmrt_server_conf_free(&c);
    return 0;
}
