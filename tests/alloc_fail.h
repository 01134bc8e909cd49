/*
 * tests/alloc_fail.h — allocation-failure injection for tests linked with
 * -Wl,--wrap=malloc,--wrap=calloc,--wrap=realloc,--wrap=free,--wrap=strdup,--wrap=strndup
 * (mmrt_add_test(... WRAP malloc calloc realloc free strdup strndup)).
 *
 * Only allocations made by objects linked statically into the test (the core) are seen;
 * plugins and system libraries allocate through their own, unwrapped references. Every
 * pointer handed out is remembered, so a test can assert that a failed run leaked nothing.
 */
#ifndef MMRT_TEST_ALLOC_FAIL_H
#define MMRT_TEST_ALLOC_FAIL_H

#include <stddef.h>

/* Fail the n-th allocation from now on (1 = the next one); 0 disables injection. */
void alloc_fail_at(long n);
/* Whether the armed failure has been injected since alloc_fail_at(). */
int alloc_fail_fired(void);
/* Number of live (allocated, not freed) tracked blocks. */
long alloc_live(void);

#endif
