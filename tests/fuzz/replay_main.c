/*
 * tests/fuzz/replay_main.c — runs files through a fuzz target's LLVMFuzzerTestOneInput in
 * an ordinary build, so committed corpora (seeds and past crashers) are regression tests.
 *
 *     fuzz_<name>_replay FILE|DIR …
 *
 * Directories are read one level deep, dot files skipped. Exits 1 if an argument cannot be
 * read or no input was found (a missing corpus must fail the test, not pass it vacuously);
 * a crash in the target fails it the usual way, under the sanitizers when they are on.
 */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int run_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "replay: cannot open %s\n", path);
        return -1;
    }
    int rc = -1;
    uint8_t *buf = NULL;
    struct stat sb;
    if (fstat(fileno(f), &sb) != 0 || !S_ISREG(sb.st_mode))
        goto out;
    size_t n = (size_t)sb.st_size;
    buf = malloc(n ? n : 1); /* exactly n bytes: ASan catches a read past the input */
    if (!buf || fread(buf, 1, n, f) != n)
        goto out;
    LLVMFuzzerTestOneInput(buf, n);
    rc = 0;
out:
    if (rc)
        fprintf(stderr, "replay: cannot read %s\n", path);
    free(buf);
    fclose(f);
    return rc;
}

int main(int argc, char **argv)
{
    long n_inputs = 0;
    for (int i = 1; i < argc; i++) {
        struct stat sb;
        if (stat(argv[i], &sb) != 0) {
            fprintf(stderr, "replay: %s does not exist\n", argv[i]);
            return 1;
        }
        if (!S_ISDIR(sb.st_mode)) {
            if (run_file(argv[i]))
                return 1;
            n_inputs++;
            continue;
        }
        DIR *d = opendir(argv[i]);
        if (!d)
            return 1;
        struct dirent *e;
        while ((e = readdir(d))) {
            if (e->d_name[0] == '.')
                continue;
            char path[4096];
            snprintf(path, sizeof path, "%s/%s", argv[i], e->d_name);
            if (run_file(path)) {
                closedir(d);
                return 1;
            }
            n_inputs++;
        }
        closedir(d);
    }
    printf("replayed %ld inputs\n", n_inputs);
    return n_inputs > 0 ? 0 : 1;
}
