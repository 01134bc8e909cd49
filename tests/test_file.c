/*
 * tests/test_file.c — core/formats/file.c, and every reader that opens files through it:
 * the JSON loader (config.json, tokenizer.json, processor and generation configs), images,
 * tokenizers, safetensors checkpoints and shards, deploy.ini.
 *
 * Each hostile kind of file is made here at run time in a scratch directory: a FIFO with no
 * writer (the case that used to hang fopen forever), a directory, a character device
 * (/dev/null, /dev/zero through a symbolic link), a symbolic link loop and a dangling link.
 * Every reader must refuse each of them at once with the same words. An alarm turns a
 * reader that blocks into a failed test instead of a hung one; nothing here measures time.
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

#include "formats/conf.h"
#include "formats/file.h"
#include "formats/image.h"
#include "formats/json.h"
#include "formats/safetensors.h"
#include "formats/tokenizer.h"

static char g_dir[64];

static const char *tmp(const char *name)
{
    static char bufs[4][512];
    static int k;
    char *b = bufs[k++ % 4];
    snprintf(b, sizeof bufs[0], "%s/%s", g_dir, name);
    return b;
}

static void write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(text, 1, strlen(text), f), strlen(text));
    assert_int_equal(fclose(f), 0);
}

static int setup(void **state)
{
    (void)state;
    snprintf(g_dir, sizeof g_dir, "/tmp/mmrt-file-XXXXXX");
    if (!mkdtemp(g_dir))
        return -1;
    if (mkfifo(tmp("fifo"), 0600) != 0 || mkdir(tmp("dir"), 0700) != 0 ||
        symlink("loop_b", tmp("loop_a")) != 0 || symlink("loop_a", tmp("loop_b")) != 0 ||
        symlink("nowhere", tmp("dangling")) != 0 || symlink("/dev/zero", tmp("zero")) != 0)
        return -1;
    write_text(tmp("ok.json"), "{\"a\": 1}");
    write_text(tmp("array.json"), "[1, 2]");
    /* Each test below is over in well under a second; a reader that blocks is stopped. */
    alarm(120);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    const char *names[] = { "fifo", "dir", "loop_a", "loop_b", "dangling", "zero", "ok.json",
                            "array.json", "ckpt/model.safetensors/x", "ckpt/model.safetensors",
                            "ckpt" };
    for (size_t i = 0; i < sizeof names / sizeof *names; i++)
        remove(tmp(names[i]));
    rmdir(g_dir);
    alarm(0);
    return 0;
}

/* The message every reader gives for path, as file.c words it. */
struct kind_case {
    const char *name; /* under g_dir, or absolute */
    const char *says; /* after "PATH: " */
};

static const struct kind_case kinds[] = {
    { "fifo", "not a regular file (it is a FIFO)" },
    { "dir", "not a regular file (it is a directory)" },
    { "/dev/null", "not a regular file (it is a character device)" },
    { "zero", "not a regular file (it is a character device)" },
    { "loop_a", "cannot open: a symbolic link loop" },
    { "dangling", "cannot open: a dangling symbolic link" },
};

static const char *kind_path(const struct kind_case *k)
{
    return k->name[0] == '/' ? k->name : tmp(k->name);
}

static void expect_msg(const struct mmrt_error *err, const char *path, const char *says)
{
    char want[1024];
    snprintf(want, sizeof want, "%s: %s", path, says);
    if (strncmp(err->msg, want, strlen(want)) != 0)
        fail_msg("expected '%s…', got '%s'", want, err->msg);
}

static void test_open_and_read(void **state)
{
    (void)state;
    struct mmrt_error err = { 0 };
    char *data = NULL;
    size_t len = 0;
    assert_int_equal(mmrt_file_read(tmp("ok.json"), 100, 0, NULL, &data, &len, &err), MMRT_OK);
    assert_int_equal(len, 8);
    assert_string_equal(data, "{\"a\": 1}");
    free(data);
    data = NULL;
    assert_int_equal(mmrt_file_read(tmp("ok.json"), 7, 0, " (the cap)", &data, &len, &err),
                     MMRT_ERR_LIMIT);
    expect_msg(&err, tmp("ok.json"), "8 bytes, more than the 7 allowed (the cap)");
    assert_null(data);
    for (size_t i = 0; i < sizeof kinds / sizeof *kinds; i++) {
        int fd = -1;
        assert_int_equal(mmrt_file_open(kind_path(&kinds[i]), 0, &fd, NULL, &err),
                         MMRT_ERR_IO);
        assert_int_equal(fd, -1);
        expect_msg(&err, kind_path(&kinds[i]), kinds[i].says);
        assert_int_equal(mmrt_file_read(kind_path(&kinds[i]), 100, 0, NULL, &data, &len, &err),
                         MMRT_ERR_IO);
        expect_msg(&err, kind_path(&kinds[i]), kinds[i].says);
        assert_null(data);
    }
    /* Missing: MMRT_ERR_IO, or MMRT_ERR_NOT_FOUND where the caller asks. */
    assert_int_equal(mmrt_file_read(tmp("none"), 100, 0, NULL, &data, &len, &err), MMRT_ERR_IO);
    expect_msg(&err, tmp("none"), "cannot open: No such file or directory");
    assert_int_equal(mmrt_file_read(tmp("none"), 100, MMRT_FILE_MISSING_NOT_FOUND, NULL, &data,
                                    &len, &err), MMRT_ERR_NOT_FOUND);
    assert_true(mmrt_file_exists(tmp("fifo")));
    assert_true(mmrt_file_exists(tmp("loop_a")));
    assert_true(mmrt_file_exists(tmp("dangling")));
    assert_false(mmrt_file_exists(tmp("none")));
    assert_string_equal(mmrt_file_kind(S_IFSOCK), "a socket");
    assert_string_equal(mmrt_file_kind(S_IFBLK), "a block device");
}

/* MMRT_FILE_PIPE_OK: a FIFO without a writer reads as empty at once; with one, to its end. */
static void test_pipe_ok(void **state)
{
    (void)state;
    struct mmrt_error err = { 0 };
    char *data = NULL;
    size_t len = 1;
    assert_int_equal(mmrt_file_read(tmp("fifo"), 100, MMRT_FILE_PIPE_OK, NULL, &data, &len,
                                    &err), MMRT_OK);
    assert_int_equal(len, 0);
    free(data);
    data = NULL;

    int fds[2];
    assert_int_equal(pipe(fds), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        close(fds[0]);
        for (int i = 0; i < 1000; i++)
            if (write(fds[1], "0123456789", 10) != 10)
                _exit(1);
        _exit(0);
    }
    close(fds[1]);
    char path[64];
    snprintf(path, sizeof path, "/dev/fd/%d", fds[0]);
    assert_int_equal(mmrt_file_read(path, 20000, MMRT_FILE_PIPE_OK, NULL, &data, &len, &err),
                     MMRT_OK);
    assert_int_equal(len, 10000);
    assert_memory_equal(data + 9990, "0123456789", 10);
    free(data);
    close(fds[0]);
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    /* /dev/zero is still a device, pipes or not. */
    assert_int_equal(mmrt_file_read(tmp("zero"), 100, MMRT_FILE_PIPE_OK, NULL, &data, &len,
                                    &err), MMRT_ERR_IO);
}

/* Every reader, every kind: the same refusal, at once. */
static void test_every_reader(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof kinds / sizeof *kinds; i++) {
        const char *p = kind_path(&kinds[i]);
        struct mmrt_error err = { 0 };
        json_t *root = NULL;
        assert_int_equal(mmrt_json_load_file(p, 1 << 20, 0, &root, &err), MMRT_ERR_IO);
        expect_msg(&err, p, kinds[i].says);
        assert_int_equal(mmrt_json_load_object(p, 1 << 20, 0, &root, &err), MMRT_ERR_IO);
        expect_msg(&err, p, kinds[i].says);
        assert_null(root);

        struct mmrt_image *img = NULL;
        assert_int_equal(mmrt_image_load_file(p, NULL, &img, &err), MMRT_ERR_IO);
        expect_msg(&err, p, kinds[i].says);
        assert_null(img);

        struct mmrt_tokenizer *tok = NULL;
        assert_int_equal(mmrt_tokenizer_load(p, NULL, &tok, &err), MMRT_ERR_IO);
        expect_msg(&err, p, kinds[i].says);
        assert_null(tok);

        /* A directory given as the checkpoint is a checkpoint directory, not a file. */
        if (strcmp(kinds[i].name, "dir") != 0) {
            struct mmrt_safetensors *st = NULL;
            assert_int_equal(mmrt_safetensors_open(p, NULL, &st, &err), MMRT_ERR_IO);
            expect_msg(&err, p, kinds[i].says);
            assert_null(st);
        }

        /* deploy.ini takes pipes (mmrt --conf <(…)); a FIFO with no writer is an empty file. */
        struct mmrt_conf *conf = NULL;
        mmrt_status want = strcmp(kinds[i].name, "fifo") == 0 ? MMRT_ERR_CONFIG : MMRT_ERR_IO;
        assert_int_equal(mmrt_conf_load(p, &conf, &err), want);
        if (want == MMRT_ERR_IO)
            expect_msg(&err, p, kinds[i].says);
        assert_null(conf);
    }
}

/* A checkpoint directory whose model.safetensors is not a regular file says what it is,
 * instead of "has neither model.safetensors nor model.safetensors.index.json". */
static void test_checkpoint_names_the_file(void **state)
{
    (void)state;
    const char *ckpt = tmp("ckpt"), *model = tmp("ckpt/model.safetensors");
    assert_int_equal(mkdir(ckpt, 0700), 0);
    struct {
        const char *make; /* "fifo", "dir", "loop", "dev" */
        const char *says;
    } cases[] = {
        { "fifo", "not a regular file (it is a FIFO)" },
        { "dir", "not a regular file (it is a directory)" },
        { "loop", "cannot open: a symbolic link loop" },
        { "dev", "not a regular file (it is a character device)" },
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        if (!strcmp(cases[i].make, "fifo"))
            assert_int_equal(mkfifo(model, 0600), 0);
        else if (!strcmp(cases[i].make, "dir"))
            assert_int_equal(mkdir(model, 0700), 0);
        else if (!strcmp(cases[i].make, "loop"))
            assert_int_equal(symlink("model.safetensors", model), 0);
        else
            assert_int_equal(symlink("/dev/null", model), 0);
        struct mmrt_safetensors *st = NULL;
        struct mmrt_error err = { 0 };
        assert_int_equal(mmrt_safetensors_open(ckpt, NULL, &st, &err), MMRT_ERR_IO);
        expect_msg(&err, model, cases[i].says);
        assert_null(st);
        assert_int_equal(remove(model), 0);
    }
    struct mmrt_safetensors *st = NULL;
    struct mmrt_error err = { 0 };
    assert_int_equal(mmrt_safetensors_open(ckpt, NULL, &st, &err), MMRT_ERR_NOT_FOUND);
    assert_non_null(strstr(err.msg, "has neither model.safetensors"));
    rmdir(ckpt);
}

static void test_json_object(void **state)
{
    (void)state;
    struct mmrt_error err = { 0 };
    json_t *root = NULL;
    assert_int_equal(mmrt_json_load_object(tmp("array.json"), 100, 0, &root, &err),
                     MMRT_ERR_FORMAT);
    expect_msg(&err, tmp("array.json"), "the top level is an array, not an object");
    assert_null(root);
    assert_int_equal(mmrt_json_load_object(tmp("ok.json"), 100, 0, &root, &err), MMRT_OK);
    json_decref(root);
}

/* eos_token_id and friends: range-checked as written, never narrowed. */
static void test_id_list(void **state)
{
    (void)state;
    static const struct {
        const char *doc;
        mmrt_status st;
        const char *says; /* after "g.json: " */
        int n;
    } cases[] = {
        { "{\"e\": 2}", MMRT_OK, NULL, 1 },
        { "{\"e\": [2, 3]}", MMRT_OK, NULL, 2 },
        { "{\"e\": null}", MMRT_OK, NULL, 0 },
        { "{}", MMRT_OK, NULL, 0 },
        { "{\"e\": 4294967298}", MMRT_ERR_FORMAT, "\"e\" = 4294967298 is outside [0, 99]", 0 },
        { "{\"e\": -1}", MMRT_ERR_FORMAT, "\"e\" = -1 is outside [0, 99]", 0 },
        { "{\"e\": [1, 4294967296]}", MMRT_ERR_FORMAT,
          "\"e\"[1] = 4294967296 is outside [0, 99]", 0 },
        { "{\"e\": [1, \"2\"]}", MMRT_ERR_FORMAT, "\"e\"[1] is a string, not an integer", 0 },
        { "{\"e\": 2.0}", MMRT_ERR_FORMAT, "\"e\" is a real number, not an integer or a list",
          0 },
        { "{\"e\": [1, 2, 3, 4, 5]}", MMRT_ERR_LIMIT, "\"e\" lists 5 ids, more than the 4", 0 },
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        struct mmrt_error err = { 0 };
        json_t *root = NULL;
        assert_int_equal(mmrt_json_parse(cases[i].doc, strlen(cases[i].doc), "g.json", 0, &root,
                                         &err), MMRT_OK);
        int32_t ids[4] = { -7, -7, -7, -7 };
        int n = -1;
        mmrt_status st = mmrt_json_opt_id_list(root, "e", "g.json", 99, ids, 4, &n, &err);
        json_decref(root);
        if (st != cases[i].st)
            fail_msg("%s: status %d, want %d (%s)", cases[i].doc, st, cases[i].st, err.msg);
        if (st == MMRT_OK) {
            assert_int_equal(n, cases[i].n);
            for (int k = 0; k < n; k++)
                assert_true(ids[k] >= 0 && ids[k] < 99);
        } else {
            expect_msg(&err, "g.json", cases[i].says);
            assert_int_equal(ids[0], -7);
        }
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_open_and_read),
        cmocka_unit_test(test_pipe_ok),
        cmocka_unit_test(test_every_reader),
        cmocka_unit_test(test_checkpoint_names_the_file),
        cmocka_unit_test(test_json_object),
        cmocka_unit_test(test_id_list),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
