/*
 * tests/tool_run.c — tool_run (tool_run.h).
 */
#include "tool_run.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

static void slurp(const char *path, char *buf, size_t size)
{
    if (!buf || size == 0)
        return;
    FILE *f = fopen(path, "r");
    const size_t n = f ? fread(buf, 1, size - 1, f) : 0;
    buf[n] = '\0';
    if (f)
        fclose(f);
}

int tool_run(const char *tool, const char *const *args, const char *scratch_dir, char *out,
             size_t out_size, char *err, size_t err_size)
{
    char exe[4096], out_path[4200], err_path[4200];
    snprintf(exe, sizeof exe, "%s/bin/%s", getenv("MMRT_BUILD_DIR"), tool);
    snprintf(out_path, sizeof out_path, "%s/%s.stdout", scratch_dir, tool);
    snprintf(err_path, sizeof err_path, "%s/%s.stderr", scratch_dir, tool);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        if (!freopen(out_path, "w", stdout) || !freopen(err_path, "w", stderr))
            _exit(126);
        const char *argv[32] = { exe };
        for (int i = 0; args[i] && i < 30; i++)
            argv[i + 1] = args[i];
        execv(exe, (char *const *)argv);
        _exit(127);
    }
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    slurp(out_path, out, out_size);
    slurp(err_path, err, err_size);
    return WEXITSTATUS(status);
}
