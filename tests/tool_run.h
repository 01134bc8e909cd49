/*
 * tests/tool_run.h — runs one of mmrt's command-line tools from the build tree, for the tests
 * of those tools (test_bench.c, test_quantize_tool.c).
 *
 * Include <setjmp.h>, <stdarg.h>, <stddef.h> and <cmocka.h> first, as every cmocka test does.
 */
#ifndef MMRT_TEST_TOOL_RUN_H
#define MMRT_TEST_TOOL_RUN_H

#include <stddef.h>

/* Runs $MMRT_BUILD_DIR/bin/<tool> with args (NULL-terminated, at most 30) and waits for it;
 * its stdout goes to out[out_size] and its stderr to err[err_size] (each NUL-terminated,
 * cut at the size; out may be NULL to drop it), through files in scratch_dir. Returns the
 * exit status; fails the test when the tool cannot be started or does not exit. */
int tool_run(const char *tool, const char *const *args, const char *scratch_dir, char *out,
             size_t out_size, char *err, size_t err_size);

#endif
