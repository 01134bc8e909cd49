/*
 * tests/test_server_conf.c — the [server] section: defaults, every key's range, FILE:LINE
 * in each refusal, API keys inline and from a file, and the runtime's own checks of the rest
 * of the file still applying (mmrt_conf_read_section).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "mmrt/mmrt.h"
#include "server_conf.h"

static char dir[256];

static const char *write_file(const char *name, const char *text)
{
    static char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
    return path;
}

#define DEVICES "[device.cpu0]\nplugin = cpu\n"

static int load(const char *text, struct mmrt_server_conf *c, char *err, size_t n)
{
    return mmrt_server_conf_load(write_file("s.ini", text), c, err, n);
}

static void test_defaults(void **state)
{
    (void)state;
    struct mmrt_server_conf c;
    char err[1024];
    assert_int_equal(load(DEVICES, &c, err, sizeof err), MMRT_OK);
    assert_string_equal(c.host, "127.0.0.1");
    assert_int_equal(c.port, 8080);
    assert_int_equal(c.threads, 4);
    assert_int_equal(c.max_body_bytes, 32u << 20);
    assert_int_equal(c.max_queued, 64);
    assert_int_equal(c.n_api_keys, 0);
    assert_null(c.image_dir);
    assert_null(c.model_name);
    mmrt_server_conf_free(&c);
}

static void test_keys(void **state)
{
    (void)state;
    struct mmrt_server_conf c;
    char err[1024];
    write_file("keys.txt", "# team keys\nkA\n\nkB\r\n");
    assert_int_equal(load(DEVICES "[server]\nhost = ::1\nport = 0\nthreads = 8\n"
                          "max_body_mb = 2\nmax_queued = 3\nkeepalive_s = 1\n"
                          "model_name = my-model\nimage_dir = imgs\n"
                          "api_keys = k1 , k2\napi_keys_file = keys.txt\n"
                          "sampling_defaults = openai\n",
                          &c, err, sizeof err),
                     MMRT_OK);
    assert_string_equal(c.host, "::1");
    assert_int_equal(c.port, 0);
    assert_int_equal(c.threads, 8);
    assert_int_equal(c.max_body_bytes, 2u << 20);
    assert_int_equal(c.max_queued, 3);
    assert_int_equal(c.keepalive_s, 1);
    assert_string_equal(c.model_name, "my-model");
    char want[600];
    snprintf(want, sizeof want, "%s/imgs", dir);
    assert_string_equal(c.image_dir, want);
    assert_int_equal(c.n_api_keys, 4);
    assert_string_equal(c.api_keys[0], "k1");
    assert_string_equal(c.api_keys[1], "k2");
    assert_string_equal(c.api_keys[2], "kA");
    assert_string_equal(c.api_keys[3], "kB");
    assert_true(c.openai_defaults);
    mmrt_server_conf_free(&c);
    /* The default: the checkpoint's sampling settings. */
    assert_int_equal(load(DEVICES "[server]\nsampling_defaults = checkpoint\n", &c, err,
                          sizeof err), MMRT_OK);
    assert_false(c.openai_defaults);
    mmrt_server_conf_free(&c);
}

/* Each bad file is refused naming the file, the line and the key. */
static void test_refusals(void **state)
{
    (void)state;
    static const struct {
        const char *text, *want;
    } cases[] = {
        { DEVICES "[server]\nport = 65536\n", "s.ini:4: [server] port = '65536'" },
        { DEVICES "[server]\nport = 80x\n", "s.ini:4: [server] port = '80x'" },
        { DEVICES "[server]\nhost = localhost\n", "s.ini:4: [server] host = 'localhost'" },
        { DEVICES "[server]\nthreads = 0\n", "threads = '0'" },
        { DEVICES "[server]\nmax_queued = 0\n", "max_queued = '0'" },
        { DEVICES "[server]\nfrobnicate = 1\n", "s.ini:4: [server] unknown key 'frobnicate'" },
        { DEVICES "[server]\nsampling_defaults = vllm\n",
          "s.ini:4: [server] sampling_defaults = 'vllm': expected 'checkpoint' or 'openai'" },
        { DEVICES "[server]\napi_keys = a b\n", "API key" },
        { DEVICES "[server]\napi_keys = ,\n", "API key" },
        { DEVICES "[server]\napi_keys_file = missing.txt\n", "missing.txt" },
        { DEVICES "[server]\nport = 1\nport = 2\n", "s.ini:5: [server] duplicate key 'port'" },
        /* The runtime's own sections are checked as mmrt_create_from_file checks them. */
        { DEVICES "[model]\nmax_kv_tokens = x\n[server]\nport = 1\n", "s.ini:4:" },
        { DEVICES "[server]\nport = 1\n[server]\n", "duplicate section [server]" },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct mmrt_server_conf c;
        char err[1024] = "";
        if (load(cases[i].text, &c, err, sizeof err) == MMRT_OK)
            fail_msg("case %zu accepted", i);
        if (!strstr(err, cases[i].want))
            fail_msg("case %zu: '%s' lacks '%s'", i, err, cases[i].want);
        assert_null(c.api_keys);
    }
}

int main(void)
{
    snprintf(dir, sizeof dir, "/tmp/mmrt-server-conf-XXXXXX");
    if (!mkdtemp(dir))
        return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_keys),
        cmocka_unit_test(test_refusals),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        rc = rc ? rc : 1;
    return rc;
}
