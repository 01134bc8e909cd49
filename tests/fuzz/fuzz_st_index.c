/*
 * tests/fuzz/fuzz_st_index.c — libFuzzer target for the sharded checkpoint index
 * (model.safetensors.index.json) as core/formats/safetensors.c opens it.
 *
 * Once per process the target builds a checkpoint directory in a fresh temporary folder:
 *
 *     ROOT/outside.safetensors               tensor "x"  (bait: outside the checkpoint)
 *     ROOT/ckpt/model-00001-of-00002.safetensors   tensors "a" = 1, "b" = 2 (F32 [1])
 *     ROOT/ckpt/model-00002-of-00002.safetensors   tensor  "c" = 3
 *     ROOT/ckpt/sub/inner.safetensors        tensor "d"  (bait: below the checkpoint)
 *
 * Each input is written as ROOT/ckpt/model.safetensors.index.json and the directory is opened
 * with mmrt_safetensors_open() and the default limits, as models/weights.c does. The shards
 * are real, so a well-formed index goes all the way through the shard parsing and the
 * index/shard agreement walk. Asserted (S9 of docs' untrusted-input rules):
 *   - accepted: every tensor's file is ROOT/ckpt/ followed by one of the two shard names —
 *     a plain name, never the bait reached through "..", "/" or "\"; the tensors are
 *     exactly those of the shards opened ({a, b}, {c}, {a, b, c}, or none for an empty
 *     weight_map), found by name, with
 *     the values written, inside their shard's mapping;
 *   - refused: *out untouched, a status of the documented list, one line of printable text
 *     naming the index.
 * Invariants are checked with __builtin_trap(), which libFuzzer reports as a crash. The
 * temporary folder is removed at exit.
 *
 * The same entry point is linked into the normal build with replay_main.c, so the committed
 * corpus (tests/fuzz/corpus/st_index) runs as a ctest everywhere.
 */
#include <fcntl.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "formats/safetensors.h"
#include "fuzz_check.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);


#define SHARD1 "model-00001-of-00002.safetensors"
#define SHARD2 "model-00002-of-00002.safetensors"
#define INDEX "model.safetensors.index.json"

static char g_root[64];      /* ROOT */
static char g_dir[128];      /* ROOT/ckpt */
static char g_index[192];    /* ROOT/ckpt/model.safetensors.index.json */
static bool g_ready;

static void join(char *dst, size_t size, const char *a, const char *b)
{
    if ((size_t)snprintf(dst, size, "%s/%s", a, b) >= size)
        abort();
}

static void write_file(const char *path, const void *bytes, size_t n)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0 || write(fd, bytes, n) != (ssize_t)n || close(fd) != 0) {
        perror(path);
        abort();
    }
}

/* A safetensors file of F32 [1] tensors names[i] = values[i], header padded to 8 bytes. */
static void write_shard(const char *path, const char *const *names, const float *values,
                        int n)
{
    char header[512];
    size_t len = 0;
    len += (size_t)snprintf(header + len, sizeof header - len, "{");
    for (int i = 0; i < n; i++)
        len += (size_t)snprintf(header + len, sizeof header - len,
                                "%s\"%s\":{\"dtype\":\"F32\",\"shape\":[1],"
                                "\"data_offsets\":[%d,%d]}", i ? "," : "", names[i], 4 * i,
                                4 * i + 4);
    len += (size_t)snprintf(header + len, sizeof header - len, "}");
    while (len % 8)
        header[len++] = ' ';
    uint8_t file[600];
    for (int i = 0; i < 8; i++)
        file[i] = (uint8_t)((uint64_t)len >> (8 * i));
    memcpy(file + 8, header, len);
    memcpy(file + 8 + len, values, 4 * (size_t)n); /* little-endian hosts only, like mmrt */
    write_file(path, file, 8 + len + 4 * (size_t)n);
}

static void cleanup(void)
{
    static const char *const files[] = { "ckpt/" SHARD1, "ckpt/" SHARD2, "ckpt/" INDEX,
                                         "ckpt/sub/inner.safetensors", "outside.safetensors" };
    char path[256];
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        join(path, sizeof path, g_root, files[i]);
        unlink(path);
    }
    join(path, sizeof path, g_dir, "sub");
    rmdir(path);
    rmdir(g_dir);
    rmdir(g_root);
}

static void setup(void)
{
    const char *tmp = getenv("TMPDIR");
    if (!tmp || !tmp[0] || strlen(tmp) > 32)
        tmp = "/tmp";
    snprintf(g_root, sizeof g_root, "%s/mmrt-fuzz-st-XXXXXX", tmp);
    if (!mkdtemp(g_root)) {
        perror(g_root);
        abort();
    }
    join(g_dir, sizeof g_dir, g_root, "ckpt");
    join(g_index, sizeof g_index, g_dir, INDEX);
    char path[256];
    join(path, sizeof path, g_dir, "sub");
    if (mkdir(g_dir, 0700) != 0 || mkdir(path, 0700) != 0) {
        perror(path);
        abort();
    }
    atexit(cleanup);
    join(path, sizeof path, g_dir, SHARD1);
    write_shard(path, (const char *const[]){ "a", "b" }, (const float[]){ 1, 2 }, 2);
    join(path, sizeof path, g_dir, SHARD2);
    write_shard(path, (const char *const[]){ "c" }, (const float[]){ 3 }, 1);
    join(path, sizeof path, g_dir, "sub/inner.safetensors");
    write_shard(path, (const char *const[]){ "d" }, (const float[]){ 4 }, 1);
    join(path, sizeof path, g_root, "outside.safetensors");
    write_shard(path, (const char *const[]){ "x" }, (const float[]){ 5 }, 1);
    g_ready = true;
}


static void check_accepted(const struct mmrt_safetensors *st)
{
    const size_t dir_len = strlen(g_dir);
    const size_t n = mmrt_safetensors_count(st);
    bool seen[3] = { false, false, false };
    for (size_t i = 0; i < n; i++) {
        const struct mmrt_st_tensor *t = mmrt_safetensors_at(st, i);
        CHECK(t && t->file && mmrt_safetensors_find(st, t->name) == t);
        /* The property that matters: the file is a plain name inside the checkpoint. */
        CHECK(strncmp(t->file, g_dir, dir_len) == 0 && t->file[dir_len] == '/');
        const char *base = t->file + dir_len + 1;
        CHECK(strchr(base, '/') == NULL && strchr(base, '\\') == NULL);
        const bool s1 = strcmp(base, SHARD1) == 0, s2 = strcmp(base, SHARD2) == 0;
        CHECK(s1 || s2);
        const int k = t->name[0] - 'a';
        CHECK(t->name[1] == '\0' && k >= 0 && k < 3 && !seen[k]);
        CHECK(s1 ? k < 2 : k == 2);
        seen[k] = true;
        float v = 0;
        struct mmrt_error err = { 0 };
        CHECK(t->dtype == MMRT_DTYPE_F32 && t->n_elements == 1 && t->nbytes == 4);
        CHECK(mmrt_safetensors_read_f32(t, &v, 1, &err) == MMRT_OK && v == (float)(k + 1));
        const void *map = NULL;
        uint64_t map_size = 0;
        CHECK(mmrt_safetensors_mapping(st, t, &map, &map_size) == 1);
        CHECK((const uint8_t *)map + t->file_offset == (const uint8_t *)t->data &&
              t->file_offset + t->nbytes <= map_size);
    }
    /* An empty weight_map opens an empty set (the model loader then names what is missing). */
    CHECK(seen[0] == seen[1]);
    CHECK(n == (seen[0] ? 2u : 0u) + (seen[2] ? 1u : 0u));
    CHECK(mmrt_safetensors_at(st, n) == NULL && mmrt_safetensors_find(st, "x") == NULL &&
          mmrt_safetensors_find(st, "d") == NULL);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!g_ready)
        setup();
    write_file(g_index, data, size);
    struct mmrt_safetensors *sentinel = (struct mmrt_safetensors *)&g_ready;
    struct mmrt_safetensors *st = sentinel;
    struct mmrt_error err = { 0 };
    const mmrt_status s = mmrt_safetensors_open(g_dir, NULL, &st, &err);
    if (s != MMRT_OK) {
        CHECK(st == sentinel && err.status == s);
        CHECK(s == MMRT_ERR_FORMAT || s == MMRT_ERR_LIMIT || s == MMRT_ERR_UNSUPPORTED ||
              s == MMRT_ERR_IO || s == MMRT_ERR_NOT_FOUND || s == MMRT_ERR_NO_MEMORY);
        fuzz_check_message(&err);
        CHECK(strncmp(err.msg, g_index, strlen(g_index)) == 0);
        return 0;
    }
    CHECK(st != NULL && st != sentinel);
    check_accepted(st);
    mmrt_safetensors_close(st);
    return 0;
}
