/*
 * tests/test_cli.c — the mmrt command line as a user runs it: exit statuses (0 ok, 2 usage
 * or configuration error) and the FILE:LINE messages, from the real binary in the build.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "mmrt/plugin.h"

/* What the loader says it speaks, whatever this header's minor is. */
#define ABI_STR_(x) #x
#define ABI_STR(x) ABI_STR_(x)
#define HOST_ABI "ABI " ABI_STR(MMRT_ABI_MAJOR) "." ABI_STR(MMRT_ABI_MINOR)

static char out[1 << 16];

/* Runs bin/mmrt with args (NULL-terminated), stdout and stderr merged into `out`. Optional
 * plugin_path replaces MMRT_PLUGIN_PATH. Returns the exit status. */
static int run_mmrt(const char *plugin_path, const char *const *args)
{
    char exe[4096];
    snprintf(exe, sizeof exe, "%s/bin/mmrt", getenv("MMRT_BUILD_DIR"));
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        dup2(fds[1], 1);
        dup2(fds[1], 2);
        close(fds[0]);
        if (plugin_path)
            setenv("MMRT_PLUGIN_PATH", plugin_path, 1);
        const char *argv[16] = { exe };
        for (int i = 0; args[i] && i < 14; i++)
            argv[i + 1] = args[i];
        execv(exe, (char *const *)argv);
        _exit(127);
    }
    close(fds[1]);
    size_t len = 0;
    ssize_t n;
    while ((n = read(fds[0], out + len, sizeof out - 1 - len)) > 0)
        len += (size_t)n;
    out[len] = '\0';
    close(fds[0]);
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    return WEXITSTATUS(status);
}

static void test_version_help_usage(void **state)
{
    (void)state;
    assert_int_equal(run_mmrt(NULL, (const char *[]){ "--version", NULL }), 0);
    assert_non_null(strstr(out, "mmrt 0."));
    assert_int_equal(run_mmrt(NULL, (const char *[]){ "--help", NULL }), 0);
    assert_non_null(strstr(out, "--list-devices"));
    assert_int_equal(run_mmrt(NULL, (const char *[]){ "--frobnicate", NULL }), 2);
    assert_int_equal(run_mmrt(NULL, (const char *[]){ NULL }), 2);
    assert_int_equal(run_mmrt(NULL, (const char *[]){ "--conf", "a.ini", "extra", NULL }), 2);
    assert_non_null(strstr(out, "unexpected argument 'extra'"));
    assert_int_equal(run_mmrt(NULL, (const char *[]){ "--repetition-penalty", "0", NULL }), 2);
    assert_non_null(strstr(out, "--repetition-penalty '0' must be a number in"));
    assert_int_equal(run_mmrt(NULL, (const char *[]){ "--presence-penalty", "-2.5", NULL }), 2);
    assert_non_null(strstr(out, "--presence-penalty '-2.5' must be a number in [-2, 2]"));
    assert_int_equal(run_mmrt(NULL, (const char *[]){ "--frequency-penalty", "x", NULL }), 2);
    assert_non_null(strstr(out, "--frequency-penalty 'x'"));
    assert_int_equal(run_mmrt(NULL, (const char *[]){ "--response-format", "yaml", NULL }), 2);
    assert_non_null(strstr(out, "--response-format 'yaml': expected text or json_object"));
}

static void test_list_devices(void **state)
{
    (void)state;
    assert_int_equal(run_mmrt(NULL, (const char *[]){ "--list-devices", NULL }), 0);
    if (!strstr(out, "plugin cpu ") || !strstr(out, "cpu:0 "))
        fail_msg("no cpu device listed:\n%s", out);
    char cuda[4096];
    snprintf(cuda, sizeof cuda, "%s/bin/libmmrt_cuda.so", getenv("MMRT_BUILD_DIR"));
    if (access(cuda, F_OK) == 0 && !strstr(out, "plugin cuda "))
        fail_msg("the cuda plugin is built but not listed:\n%s", out);
    print_message("%s", out);
}

static void test_refused_plugin_is_listed_with_versions(void **state)
{
    (void)state;
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/test-plugins", getenv("MMRT_BUILD_DIR"));
    assert_int_equal(run_mmrt(dir, (const char *[]){ "--list-devices", NULL }), 0);
    if (!strstr(out, "plugin badmajor refused: ") ||
        !strstr(out, "plugin ABI 2.0, this mmrt speaks " HOST_ABI))
        fail_msg("badmajor not refused with both versions:\n%s", out);
    assert_non_null(strstr(out, "plugin nodevice skipped: no stub device (test variant)"));
}

static void test_config_errors_exit_2(void **state)
{
    (void)state;
    char path[] = "/tmp/mmrt_cli_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    const char *text = "[device.cpu0]\nplugin = cpu\nthreads = 1\n\n[stage.vision]\n"
                       "device = gpu7\n";
    assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
    assert_int_equal(run_mmrt(NULL, (const char *[]){ "--conf", path, NULL }), 2);
    char want[256];
    snprintf(want, sizeof want, "%s:6: ", path);
    if (strncmp(out, want, strlen(want)) != 0)
        fail_msg("expected '%s…', got:\n%s", want, out);

    FILE *f = fopen(path, "w");
    fputs("[device.cpu0]\nplugin = cpu\nthreads = 1\nwarp_speed = 9\n", f);
    fclose(f);
    assert_int_equal(run_mmrt(NULL, (const char *[]){ "--conf", path, NULL }), 2);
    snprintf(want, sizeof want, "%s:4: [device.cpu0]: unknown key 'warp_speed'", path);
    if (strncmp(out, want, strlen(want)) != 0)
        fail_msg("expected '%s…', got:\n%s", want, out);

    f = fopen(path, "w");
    fputs("[device.x]\nplugin = nosuch\n", f);
    fclose(f);
    assert_int_equal(run_mmrt(NULL, (const char *[]){ "--conf", path, NULL }), 2);
    snprintf(want, sizeof want, "%s:2: [device.x]: plugin 'nosuch'", path);
    if (strncmp(out, want, strlen(want)) != 0)
        fail_msg("expected '%s…', got:\n%s", want, out);
    unlink(path);

    assert_int_equal(run_mmrt(NULL, (const char *[]){ "--conf", "/nonexistent.ini", NULL }), 2);
    assert_non_null(strstr(out, "/nonexistent.ini"));
}

/* Writes text to dir/name; returns the path (static buffer, one at a time). */
static const char *write_conf(const char *dir, const char *name, const char *text)
{
    static char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    assert_int_equal(fwrite(text, 1, strlen(text), f), strlen(text));
    assert_int_equal(fclose(f), 0);
    return path;
}

static void expect_exit_2(const char *conf, const char *want_prefix)
{
    int rc = run_mmrt(NULL, (const char *[]){ "--conf", conf, NULL });
    if (rc != 2 || strncmp(out, want_prefix, strlen(want_prefix)) != 0)
        fail_msg("--conf %s: expected exit 2 with '%s…', got %d:\n%s", conf, want_prefix, rc,
                 out);
}

/* Issue 17: every configuration error exits 2, with FILE:LINE: where there is a line. */
static void test_config_file_errors_exit_2(void **state)
{
    (void)state;
    char dir[] = "/tmp/mmrt_cli_conf_XXXXXX";
    assert_non_null(mkdtemp(dir));
    char want[8192], path[4096];
    alarm(120); /* a --conf that blocks fails the test instead of hanging it */

    /* A 100k-character line. */
    size_t n = 100000;
    char *text = malloc(n + 64);
    assert_non_null(text);
    int o = snprintf(text, n + 64, "[device.cpu0]\nplugin = cpu\nk");
    memset(text + o, 'x', n);
    strcpy(text + o + n, " = 1\n");
    snprintf(path, sizeof path, "%s", write_conf(dir, "long.ini", text));
    free(text);
    snprintf(want, sizeof want, "%s:3: line too long", path);
    expect_exit_2(path, want);

    /* 10k device sections. */
    size_t cap = 10000 * 32;
    text = malloc(cap);
    assert_non_null(text);
    size_t used = 0;
    for (int i = 0; i < 10000; i++)
        used += (size_t)snprintf(text + used, cap - used, "[device.d%d]\nplugin = cpu\n", i);
    snprintf(path, sizeof path, "%s", write_conf(dir, "many.ini", text));
    free(text);
    snprintf(want, sizeof want, "%s:129: more than 64 [device.NAME] sections", path);
    expect_exit_2(path, want);

    /* --conf naming a directory, a device, a FIFO without a writer (read as empty). */
    snprintf(want, sizeof want, "%s: not a regular file (it is a directory)", dir);
    expect_exit_2(dir, want);
    expect_exit_2("/dev/null", "/dev/null: not a regular file (it is a character device)");
    expect_exit_2("/dev/zero", "/dev/zero: not a regular file (it is a character device)");
    snprintf(path, sizeof path, "%s/fifo.ini", dir);
    assert_int_equal(mkfifo(path, 0600), 0);
    snprintf(want, sizeof want, "%s:1: end of file: no [device.NAME] section", path);
    expect_exit_2(path, want);

    /* [model] path that does not exist, is a file, or is a folder without config.json. */
    snprintf(path, sizeof path, "%s",
             write_conf(dir, "nopath.ini", "[device.cpu0]\nplugin = cpu\n\n[model]\n"
                                           "path = no/such/checkpoint\n"));
    snprintf(want, sizeof want, "%s:5: [model] path '%s/no/such/checkpoint': No such file",
             path, dir);
    expect_exit_2(path, want);
    snprintf(path, sizeof path, "%s",
             write_conf(dir, "filepath.ini", "[device.cpu0]\nplugin = cpu\n[model]\n"
                                             "path = long.ini\n"));
    snprintf(want, sizeof want, "%s:4: [model] path '%s/long.ini' is a regular file, not a "
             "checkpoint directory", path, dir);
    expect_exit_2(path, want);
    snprintf(path, sizeof path, "%s/empty", dir);
    assert_int_equal(mkdir(path, 0700), 0);
    snprintf(path, sizeof path, "%s",
             write_conf(dir, "emptydir.ini", "[device.cpu0]\nplugin = cpu\n[model]\n"
                                             "path = empty\n"));
    snprintf(want, sizeof want, "%s:4: [model] path '%s/empty' is not a checkpoint "
             "directory: it has no config.json", path, dir);
    expect_exit_2(path, want);
    alarm(0);

    const char *names[] = { "long.ini", "many.ini", "fifo.ini", "nopath.ini", "filepath.ini",
                            "emptydir.ini", "empty" };
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        assert_int_equal(remove(path), 0);
    }
    assert_int_equal(rmdir(dir), 0);
}

static void test_demo_conf(void **state)
{
    (void)state;
    char conf[4096];
    snprintf(conf, sizeof conf, "%s/conf/demo.ini", getenv("MMRT_SOURCE_DIR"));
    int rc = run_mmrt(NULL, (const char *[]){ "--conf", conf, NULL });
    if (rc != 0)
        fail_msg("demo.ini exited %d:\n%s", rc, out);
    print_message("%s", out);
    /* The penalty flags are taken, and the demo answers with all three set. */
    rc = run_mmrt(NULL, (const char *[]){ "--conf", conf, "--repetition-penalty", "1.2",
                                          "--presence-penalty", "0.5", "--frequency-penalty",
                                          "-0.5", "--max-tokens", "8", NULL });
    if (rc != 0)
        fail_msg("demo.ini with penalties exited %d:\n%s", rc, out);
    /* A JSON answer from the demo: its text is a prefix of a JSON object. */
    rc = run_mmrt(NULL, (const char *[]){ "--conf", conf, "--response-format", "json_object",
                                          "--max-tokens", "24", NULL });
    if (rc != 0 || !strchr(out, '{'))
        fail_msg("demo.ini with --response-format json_object exited %d:\n%s", rc, out);
    /* --json-schema FILE: an answer held to it; a schema mmrt cannot hold an answer to, a
     * missing file, or a second response format is a usage error (exit 2) naming it. */
    char dir[] = "/tmp/mmrt_cli_schema_XXXXXX";
    assert_non_null(mkdtemp(dir));
    char good[4096], bad[4096];
    snprintf(good, sizeof good, "%s", write_conf(dir, "shape.json",
             "{\"type\": \"object\", \"properties\": {\"shape\": {\"enum\": "
             "[\"circle\", \"square\"]}}, \"required\": [\"shape\"]}"));
    snprintf(bad, sizeof bad, "%s", write_conf(dir, "bad.json",
             "{\"type\": \"object\", \"properties\": {\"n\": {\"type\": \"number\", "
             "\"multipleOf\": 2}}}"));
    rc = run_mmrt(NULL, (const char *[]){ "--conf", conf, "--json-schema", good,
                                          "--max-tokens", "24", NULL });
    if (rc != 0 || !strchr(out, '{'))
        fail_msg("demo.ini with --json-schema exited %d:\n%s", rc, out);
    rc = run_mmrt(NULL, (const char *[]){ "--conf", conf, "--json-schema", bad, NULL });
    if (rc != 2 || !strstr(out, "bad.json: json_schema /properties/n/multipleOf: "
                                "'multipleOf' of a number is not supported"))
        fail_msg("--json-schema with multipleOf: exit %d:\n%s", rc, out);
    rc = run_mmrt(NULL, (const char *[]){ "--conf", conf, "--json-schema", good,
                                          "--response-format", "text", NULL });
    if (rc != 2 || !strstr(out, "give one"))
        fail_msg("--json-schema with --response-format: exit %d:\n%s", rc, out);
    /* [run] json_schema = FILE in a deploy.ini: the same, and its error at its line. */
    char ini[4096], text[8192];
    snprintf(text, sizeof text,
             "[model]\npath = %s/tests/fixtures/llava-tiny\n[device.cpu0]\nplugin = cpu\n"
             "[run]\nimage = %s/tests/fixtures/llava-images/grad_80x60.png\nprompt = Which?\n"
             "max_tokens = 300\njson_schema = shape.json\n",
             getenv("MMRT_SOURCE_DIR"), getenv("MMRT_SOURCE_DIR"));
    snprintf(ini, sizeof ini, "%s", write_conf(dir, "deploy.ini", text));
    rc = run_mmrt(NULL, (const char *[]){ "--conf", ini, NULL });
    if (rc != 0 || !strstr(out, "\"shape\""))
        fail_msg("[run] json_schema exited %d:\n%s", rc, out);
    strcat(text, "response_format = text\n");
    write_conf(dir, "deploy.ini", text);
    rc = run_mmrt(NULL, (const char *[]){ "--conf", ini, NULL });
    if (rc != 2 || !strstr(out, "deploy.ini:9: [run] json_schema beside response_format"))
        fail_msg("[run] json_schema beside response_format: exit %d:\n%s", rc, out);
    *strstr(text, "response_format") = '\0';
    *strstr(text, "shape.json") = '\0';
    strcat(text, "bad.json\n");
    write_conf(dir, "deploy.ini", text);
    rc = run_mmrt(NULL, (const char *[]){ "--conf", ini, NULL });
    if (rc != 2 || !strstr(out, "deploy.ini:9: [run] json_schema") ||
        !strstr(out, "json_schema /properties/n/multipleOf"))
        fail_msg("[run] json_schema with multipleOf: exit %d:\n%s", rc, out);
    unlink(ini);
    unlink(bad);
    rc = run_mmrt(NULL, (const char *[]){ "--conf", conf, "--json-schema", bad, NULL });
    if (rc != 2 || !strstr(out, "bad.json"))
        fail_msg("--json-schema with a missing file: exit %d:\n%s", rc, out);
    unlink(good);
    rmdir(dir);
}

/* Issue 4's promise: the split deployment gives the fixture's greedy tokens, and --check
 * on it exits 0 with its per-stage table. Skipped without an OpenCL device. */
static void test_split_placement_check(void **state)
{
    (void)state;
    char ocl[4096], conf[4096];
    snprintf(ocl, sizeof ocl, "%s/bin/libmmrt_opencl.so", getenv("MMRT_BUILD_DIR"));
    if (access(ocl, F_OK) != 0 ||
        run_mmrt(NULL, (const char *[]){ "--list-devices", NULL }) != 0 ||
        !strstr(out, "opencl:0 ")) {
        print_message("no OpenCL device: split placement not checked\n");
        return;
    }
    snprintf(conf, sizeof conf, "%s/conf/llava-tiny-split.ini", getenv("MMRT_SOURCE_DIR"));
    int rc = run_mmrt(NULL, (const char *[]){ "--conf", conf, "--check", NULL });
    if (rc != 0 || !strstr(out, "vision    image features") || !strstr(out, "PASS"))
        fail_msg("--check exited %d:\n%s", rc, out);
    rc = run_mmrt(NULL, (const char *[]){ "--conf", conf, "--json", NULL });
    /* case 3 of tests/fixtures/llava-tiny/expected.json: grad_45x90.png, the same prompt */
    if (rc != 0 || !strstr(out, "\"token_ids\": [\n    75,\n    235,\n    297,"))
        fail_msg("--json exited %d:\n%s", rc, out);
    print_message("%s", out);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_version_help_usage),
        cmocka_unit_test(test_list_devices),
        cmocka_unit_test(test_refused_plugin_is_listed_with_versions),
        cmocka_unit_test(test_config_errors_exit_2),
        cmocka_unit_test(test_config_file_errors_exit_2),
        cmocka_unit_test(test_demo_conf),
        cmocka_unit_test(test_split_placement_check),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
