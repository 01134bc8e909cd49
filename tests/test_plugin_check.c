/*
 * tests/test_plugin_check.c — mmrt-plugin-check as a vendor runs it, on the stub plugins in
 * build/test-plugins: the correct stub passes (SCALE and ADD on F32, other dtypes refused as
 * plugin.h allows, every other op "not supported"), the stub whose ADD is slightly wrong
 * (variant badadd) FAILs with exit status 1 — proof that the checker can fail — and the
 * broken or deviceless variants give the documented exit statuses 2 and 77; the ABI 1.3 stub
 * is refused the KV-store dtypes of later minors, which reads as refused.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>

static char out[1 << 20];

/* Runs bin/mmrt-plugin-check with args (NULL-terminated), stdout and stderr merged into
 * `out`. Returns the exit status. */
static int run_check(const char *const *args)
{
    char exe[4096];
    snprintf(exe, sizeof exe, "%s/bin/mmrt-plugin-check", getenv("MMRT_BUILD_DIR"));
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        dup2(fds[1], 1);
        dup2(fds[1], 2);
        close(fds[0]);
        const char *argv[16] = {exe};
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
    if (!WIFEXITED(status))
        fail_msg("mmrt-plugin-check did not exit normally (status %d):\n%s", status, out);
    return WEXITSTATUS(status);
}

/* Path of a test plugin variant (static buffer per call site is enough here). */
static const char *stub(const char *variant, char *buf, size_t size)
{
    snprintf(buf, size, "%s/test-plugins/libmmrt_%s.so", getenv("MMRT_BUILD_DIR"), variant);
    return buf;
}

/* The table line of (op, dtype), e.g. "  ADD          F32 …", or fail. */
static const char *row(const char *op, const char *dtype)
{
    static char line[512];
    const char *p = out;
    while ((p = strstr(p, op))) {
        const char *bol = p;
        while (bol > out && bol[-1] != '\n')
            bol--;
        const char *eol = strchr(p, '\n');
        size_t len = eol ? (size_t)(eol - bol) : strlen(bol);
        snprintf(line, sizeof line, "%.*s", (int)len, bol);
        char want[64];
        snprintf(want, sizeof want, "  %-12s %-10s ", op, dtype);
        if (strncmp(line, want, strlen(want)) == 0)
            return line;
        p += strlen(op);
    }
    fail_msg("no table row for %s %s in:\n%s", op, dtype, out);
    return NULL;
}

static void expect_in(const char *needle)
{
    if (!strstr(out, needle))
        fail_msg("\"%s\" not in the output:\n%s", needle, out);
}

static void test_correct_stub_passes(void **state)
{
    (void)state;
    char path[4096];
    int rc = run_check((const char *[]){stub("stub", path, sizeof path), NULL});
    if (rc != 0)
        fail_msg("exit %d, want 0:\n%s", rc, out);
    assert_non_null(strstr(row("ADD", "F32"), " pass "));
    assert_non_null(strstr(row("SCALE", "F32"), " pass "));
    /* F16/BF16 second operands are refused with MMRT_ERR_UNSUPPORTED: allowed, not a FAIL. */
    assert_non_null(strstr(row("ADD", "F16"), " refused "));
    expect_in("only F32 is implemented");
    expect_in("not supported: MATMUL, MUL, LAYERNORM");
    expect_in("  ops_in_order      pass");
    expect_in("  null_handles      pass");
    expect_in("result: pass");
    assert_null(strstr(out, "FAIL"));
}

static void test_wrong_add_fails(void **state)
{
    (void)state;
    char path[4096];
    int rc = run_check((const char *[]){stub("badadd", path, sizeof path), NULL});
    if (rc != 1)
        fail_msg("exit %d, want 1:\n%s", rc, out);
    assert_non_null(strstr(row("ADD", "F32"), " FAIL "));
    assert_non_null(strstr(row("SCALE", "F32"), " pass "));
    expect_in("\nfailures\n  ADD F32: ");
    expect_in("rel err ");
    expect_in("result: FAIL");
}

static json_t *run_json(const char *variant, int want_rc)
{
    char path[4096];
    int rc = run_check((const char *[]){"--json", stub(variant, path, sizeof path), NULL});
    if (rc != want_rc)
        fail_msg("exit %d, want %d:\n%s", rc, want_rc, out);
    json_error_t jerr;
    json_t *root = json_loads(out, 0, &jerr);
    if (!root)
        fail_msg("not JSON (%s at line %d):\n%s", jerr.text, jerr.line, out);
    return root;
}

/* The "ops" entry of (op, dtype). */
static json_t *json_row(json_t *root, const char *op, const char *dtype)
{
    size_t i;
    json_t *r;
    json_array_foreach(json_object_get(root, "ops"), i, r) {
        if (strcmp(json_string_value(json_object_get(r, "op")), op) == 0 &&
            strcmp(json_string_value(json_object_get(r, "dtype")), dtype) == 0)
            return r;
    }
    fail_msg("no JSON row %s %s", op, dtype);
    return NULL;
}

static void test_json(void **state)
{
    (void)state;
    json_t *root = run_json("stub", 0);
    assert_string_equal(json_string_value(json_object_get(root, "result")), "pass");
    json_t *add = json_row(root, "ADD", "F32");
    assert_string_equal(json_string_value(json_object_get(add, "result")), "pass");
    assert_true(json_integer_value(json_object_get(add, "shapes")) > 10);
    assert_true(json_real_value(json_object_get(add, "worst_rel_err")) == 0.0);
    assert_true(json_real_value(json_object_get(add, "tolerance")) > 0.0);
    assert_string_equal(json_string_value(json_array_get(json_object_get(root, "not_supported"),
                                                         0)), "MATMUL");
    assert_true(json_array_size(json_object_get(root, "contract")) == 12);
    assert_true(json_array_size(json_object_get(root, "cases")) > 40);
    json_decref(root);

    root = run_json("badadd", 1);
    assert_string_equal(json_string_value(json_object_get(root, "result")), "FAIL");
    add = json_row(root, "ADD", "F32");
    assert_string_equal(json_string_value(json_object_get(add, "result")), "FAIL");
    /* 2⁻¹² of src1 is well over ADD's tolerance (1e-6) and well under 1. */
    double worst = json_real_value(json_object_get(add, "worst_rel_err"));
    assert_true(worst > 1e-5 && worst < 0.1);
    json_decref(root);

    root = run_json("nodevice", 77);
    assert_string_equal(json_string_value(json_object_get(root, "result")), "skipped");
    json_decref(root);
}

static void test_no_device_is_skipped(void **state)
{
    (void)state;
    char path[4096];
    assert_int_equal(run_check((const char *[]){stub("nodevice", path, sizeof path), NULL}), 77);
    expect_in("SKIPPED: plugin stub has no device: no stub device (test variant)");
}

static void test_usage_and_load_errors(void **state)
{
    (void)state;
    char path[4096];
    assert_int_equal(run_check((const char *[]){stub("badmajor", path, sizeof path), NULL}), 2);
    expect_in("ABI");
    assert_int_equal(run_check((const char *[]){stub("noentry", path, sizeof path), NULL}), 2);
    assert_int_equal(run_check((const char *[]){"/nonexistent/libmmrt_x.so", NULL}), 2);
    assert_int_equal(run_check((const char *[]){"no_such_plugin", NULL}), 2);
    expect_in("no plugin named 'no_such_plugin'");
    assert_int_equal(run_check((const char *[]){NULL}), 2);
    assert_int_equal(run_check((const char *[]){"--frobnicate", "cpu", NULL}), 2);
    assert_int_equal(run_check((const char *[]){"--ops", "MATMUL,BOGUS", "cpu", NULL}), 2);
    expect_in("unknown operator 'BOGUS'");
    assert_int_equal(
        run_check((const char *[]){"--device", "5", stub("stub", path, sizeof path), NULL}), 2);
    expect_in("has 2 devices");
    assert_int_equal(run_check((const char *[]){"--help", NULL}), 0);
    expect_in("Exit status");
}

static void test_ops_filter_and_quick(void **state)
{
    (void)state;
    char path[4096];
    int rc = run_check((const char *[]){"--quick", "--ops", "scale,MATMUL",
                                        stub("stub", path, sizeof path), NULL});
    if (rc != 0)
        fail_msg("exit %d, want 0:\n%s", rc, out);
    row("SCALE", "F32");
    assert_null(strstr(out, "  ADD "));
    expect_in("not supported: MATMUL\n");
}

/* The CPU plugin against itself: everything passes, worst error exactly 0. */
static void test_cpu_against_itself(void **state)
{
    (void)state;
    int rc = run_check((const char *[]){"--quick", "--strict", "cpu", NULL});
    if (rc != 0)
        fail_msg("exit %d, want 0:\n%s", rc, out);
    assert_non_null(strstr(row("ATTENTION", "F16"), " pass "));
    /* The ABI 1.1 operators have cases too (their rows exist and pass). */
    assert_non_null(strstr(row("ROPE_MULTI", "F32"), " pass "));
    for (int d = 0; d < 3; d++)
        assert_non_null(strstr(row("SET_ROWS", (const char *[]){ "F32", "F16", "BF16" }[d]),
                               " pass "));
    /* The I8 KV store (ABI 1.7): the reference also meets the checker's own quantizer and
     * GATHER_HEADS model, or these rows would read ERROR. */
    assert_non_null(strstr(row("SET_ROWS", "I8"), " pass "));
    assert_non_null(strstr(row("GATHER_HEADS", "I8"), " pass "));
    assert_non_null(strstr(row("ATTENTION_PAGED", "I8"), " pass "));
    assert_null(strstr(out, "not supported"));
}

/* A plugin older than a KV-store dtype is refused it by the core, and the checker reads that
 * as refused, not FAIL: the abi13 stub (ABI 1.3) claims ATTENTION_PAGED, so its F8E4M3 (1.6)
 * and I8 (1.7) rows are refused. Its kernel only logs the call, so the F32 rows FAIL (exit 1):
 * the refusals are not mistaken for passes either. */
static void test_old_abi_refuses_kv_stores(void **state)
{
    (void)state;
    char path[4096];
    int rc = run_check((const char *[]){"--quick", "--ops", "ATTENTION_PAGED",
                                        stub("abi13", path, sizeof path), NULL});
    if (rc != 1)
        fail_msg("exit %d, want 1:\n%s", rc, out);
    assert_non_null(strstr(row("ATTENTION_PAGED", "F32"), " FAIL "));
    assert_non_null(strstr(row("ATTENTION_PAGED", "F8E4M3"), " refused "));
    assert_non_null(strstr(row("ATTENTION_PAGED", "I8"), " refused "));
    expect_in("ATTENTION_PAGED with an F8E4M3 operand needs 1.6");
    expect_in("ATTENTION_PAGED on an I8 KV store needs 1.7");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_correct_stub_passes),
        cmocka_unit_test(test_wrong_add_fails),
        cmocka_unit_test(test_json),
        cmocka_unit_test(test_no_device_is_skipped),
        cmocka_unit_test(test_usage_and_load_errors),
        cmocka_unit_test(test_ops_filter_and_quick),
        cmocka_unit_test(test_cpu_against_itself),
        cmocka_unit_test(test_old_abi_refuses_kv_stores),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
