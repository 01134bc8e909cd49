/*
 * tests/server/malformed_check.c — proves the labels of tests/server/malformed.py.
 *
 *     malformed_check PYTHON MALFORMED_PY
 *
 * Runs the generator (--dump -) with a real 1×1 PNG as the valid image and "test-model" as
 * the served id, then parses every body with mmrt_chat_request_parse under four server
 * configurations — 1 or 32 images per request (the fewest and the most any mmrt model
 * takes), image_dir off or on (an empty temporary directory) — and checks that each answer's
 * HTTP status is the label. A body the parser accepts, or answers differently in any
 * configuration, fails the test with its name and the parser's message. Fewer than 2,000
 * cases fails it too. Under the sanitizer build this is also 2,000 hostile bodies through the
 * parser with leak checking.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "data_uri.h"
#include "openai.h"

static const unsigned char png_1x1[] = {
    0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a, 0x00, 0x00, 0x00, 0x0d, 0x49, 0x48, 0x44,
    0x52, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x01, 0x08, 0x02, 0x00, 0x00, 0x00, 0x90,
    0x77, 0x53, 0xde, 0x00, 0x00, 0x00, 0x0c, 0x49, 0x44, 0x41, 0x54, 0x78, 0x9c, 0x63, 0xf8,
    0xcf, 0xc0, 0x00, 0x00, 0x03, 0x01, 0x01, 0x00, 0xc9, 0xfe, 0x92, 0xef, 0x00, 0x00, 0x00,
    0x00, 0x49, 0x45, 0x4e, 0x44, 0xae, 0x42, 0x60, 0x82,
};

/* Reads all of f into a malloc'ed buffer. */
static char *slurp(FILE *f, size_t *len)
{
    size_t cap = 1 << 20, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        n += fread(buf + n, 1, cap - n, f);
        if (n < cap)
            break;
        char *g = realloc(buf, cap *= 2);
        if (!g)
            free(buf);
        buf = g;
    }
    *len = n;
    return buf;
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: malformed_check PYTHON MALFORMED_PY\n");
        return 2;
    }
    char *b64 = mmrt_base64_encode(png_1x1, sizeof png_1x1);
    char dir[] = "/tmp/mmrt-malformed-XXXXXX";
    if (!b64 || !mkdtemp(dir)) {
        fprintf(stderr, "malformed_check: setup failed\n");
        return 1;
    }
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "'%s' '%s' --model test-model --image-uri "
             "'data:image/png;base64,%s' --dump -", argv[1], argv[2], b64);
    free(b64);
    FILE *p = popen(cmd, "r");
    size_t len = 0;
    char *all = p ? slurp(p, &len) : NULL;
    if (!p || !all || pclose(p) != 0) {
        fprintf(stderr, "malformed_check: running the generator failed: %s\n", cmd);
        rmdir(dir);
        return 1;
    }
    struct mmrt_chat_limits lims[4] = {
        { .model = "test-model", .max_images = 1 },
        { .model = "test-model", .max_images = 32 },
        { .model = "test-model", .max_images = 1, .image_dir = dir },
        { .model = "test-model", .max_images = 32, .image_dir = dir },
    };
    long n_cases = 0, n_bad = 0, n_404 = 0;
    size_t o = 0;
    while (o < len) {
        const char *nl = memchr(all + o, '\n', len - o);
        int status = 0;
        size_t blen = 0;
        int name_at = 0;
        if (!nl || sscanf(all + o, "%d %zu %n", &status, &blen, &name_at) != 2 ||
            name_at <= 0 || (size_t)(nl - all) + 1 + blen + 1 > len) {
            fprintf(stderr, "malformed_check: bad dump at byte %zu\n", o);
            n_bad++;
            break;
        }
        char name[512];
        snprintf(name, sizeof name, "%.*s", (int)(nl - (all + o) - name_at), all + o + name_at);
        const char *b = nl + 1;
        /* An exact-size copy, so ASan sees a read past the body. */
        char *body = malloc(blen ? blen : 1);
        if (!body)
            return 1;
        memcpy(body, b, blen);
        for (int k = 0; k < 4; k++) {
            struct mmrt_chat_request r;
            struct mmrt_api_error e;
            mmrt_status st = mmrt_chat_request_parse(body, blen, &lims[k], &r, &e);
            if (st == MMRT_OK) {
                fprintf(stderr, "%s: accepted (config %d), labelled %d\n", name, k, status);
                mmrt_chat_request_free(&r);
                n_bad++;
            } else if (e.http_status != status) {
                fprintf(stderr, "%s: %d (config %d), labelled %d: %s\n", name, e.http_status, k,
                        status, e.message);
                n_bad++;
            }
        }
        free(body);
        n_404 += status == 404;
        n_cases++;
        o = (size_t)(b - all) + blen + 1;
    }
    free(all);
    rmdir(dir);
    printf("malformed_check: %ld cases (%ld labelled 404), %ld mismatches\n", n_cases, n_404,
           n_bad);
    if (n_cases < 2000) {
        fprintf(stderr, "malformed_check: only %ld cases (at least 2000 expected)\n", n_cases);
        return 1;
    }
    return n_bad ? 1 : 0;
}
