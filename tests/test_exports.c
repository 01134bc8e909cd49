/*
 * tests/test_exports.c — what each built library shows the dynamic linker. A plugin must
 * export exactly its entry symbol (everything else hidden, so two plugins can never clash
 * and nothing else becomes ABI by accident); libmmrt.so must export only the mmrt_ API of
 * mmrt.h. Reads the ELF .dynsym table of the files in the build's bin/.
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
#include <elf.h>

/* Calls fn(name) for every defined, globally visible symbol in the file's .dynsym. */
static int each_export(const char *path, void (*fn)(const char *name, void *user), void *user)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return -1;
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *buf = malloc((size_t)size);
    assert_non_null(buf);
    assert_int_equal(fread(buf, 1, (size_t)size, f), (size_t)size);
    fclose(f);
    const Elf64_Ehdr *eh = (const Elf64_Ehdr *)buf;
    assert_int_equal(memcmp(eh->e_ident, ELFMAG, SELFMAG), 0);
    assert_int_equal(eh->e_ident[EI_CLASS], ELFCLASS64);
    const Elf64_Shdr *sh = (const Elf64_Shdr *)(buf + eh->e_shoff);
    int n = 0;
    for (int i = 0; i < eh->e_shnum; i++) {
        if (sh[i].sh_type != SHT_DYNSYM)
            continue;
        const Elf64_Sym *syms = (const Elf64_Sym *)(buf + sh[i].sh_offset);
        const char *strs = (const char *)(buf + sh[sh[i].sh_link].sh_offset);
        size_t count = sh[i].sh_size / sizeof(Elf64_Sym);
        for (size_t k = 0; k < count; k++) {
            int bind = ELF64_ST_BIND(syms[k].st_info);
            if (syms[k].st_shndx == SHN_UNDEF || (bind != STB_GLOBAL && bind != STB_WEAK) ||
                ELF64_ST_VISIBILITY(syms[k].st_other) != STV_DEFAULT)
                continue;
            const char *name = strs + syms[k].st_name;
            if (strcmp(name, "_init") == 0 || strcmp(name, "_fini") == 0 || !name[0])
                continue;
            fn(name, user);
            n++;
        }
    }
    free(buf);
    return n;
}

struct tally {
    int ok, bad;
    char first_bad[128];
    const char *prefix; /* every export must start with it (NULL: must be the entry) */
};

static void judge(const char *name, void *user)
{
    struct tally *t = user;
    int good = t->prefix ? strncmp(name, t->prefix, strlen(t->prefix)) == 0
                         : strcmp(name, "mmrt_plugin_init") == 0;
    if (good) {
        t->ok++;
    } else if (t->bad++ == 0) {
        snprintf(t->first_bad, sizeof t->first_bad, "%s", name);
    }
}

static void check_file(const char *file, const char *prefix, int required)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/bin/%s", getenv("MMRT_BUILD_DIR"), file);
    if (access(path, F_OK) != 0) {
        if (required)
            fail_msg("%s was not built", path);
        print_message("%s not built here; not checked\n", file);
        return;
    }
    struct tally t = { .prefix = prefix };
    assert_true(each_export(path, judge, &t) >= 0);
    if (t.bad)
        fail_msg("%s exports %d unexpected symbol(s), e.g. %s", file, t.bad, t.first_bad);
    if (prefix)
        assert_true(t.ok > 5);
    else
        assert_int_equal(t.ok, 1);
}

static void test_plugins_export_only_the_entry(void **state)
{
    (void)state;
    check_file("libmmrt_cpu.so", NULL, 1);
    check_file("libmmrt_opencl.so", NULL, 0);
    check_file("libmmrt_cuda.so", NULL, 0);
}

static void test_library_exports_only_the_api(void **state)
{
    (void)state;
    check_file("libmmrt.so", "mmrt_", 1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_plugins_export_only_the_entry),
        cmocka_unit_test(test_library_exports_only_the_api),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
