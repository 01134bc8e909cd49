/*
 * core/formats/file.c — non-blocking, regular-file-only opening for every reader (file.h).
 *
 * stat before open names what is at the path without opening it (opening a device can have
 * effects of its own); fstat after open is the check that counts, since the path may have
 * changed in between. Reading goes until end of file even when fstat gave a size, because
 * some regular files (/proc) report 0 and a file may shrink while it is read.
 */
#include "file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

const char *mmrt_file_kind(mode_t mode)
{
    if (S_ISREG(mode))
        return "a regular file";
    if (S_ISDIR(mode))
        return "a directory";
    if (S_ISFIFO(mode))
        return "a FIFO";
    if (S_ISCHR(mode))
        return "a character device";
    if (S_ISBLK(mode))
        return "a block device";
    if (S_ISSOCK(mode))
        return "a socket";
    if (S_ISLNK(mode))
        return "a symbolic link";
    return "not a file of a known kind";
}

bool mmrt_file_exists(const char *path)
{
    struct stat sb;
    return path && lstat(path, &sb) == 0;
}

static bool acceptable(mode_t mode, unsigned flags)
{
    return S_ISREG(mode) || ((flags & MMRT_FILE_PIPE_OK) && S_ISFIFO(mode));
}

static mmrt_status refuse_kind(const char *path, mode_t mode, struct mmrt_error *err)
{
    return mmrt_error_set(err, MMRT_ERR_IO, "%s: not a regular file (it is %s)", path,
                          mmrt_file_kind(mode));
}

/* open(2) or stat(2) failed with e: say why in the user's terms. */
static mmrt_status open_failed(const char *path, int e, unsigned flags, struct mmrt_error *err)
{
    struct stat lsb;
    if (e == ELOOP)
        return mmrt_error_set(err, MMRT_ERR_IO, "%s: cannot open: a symbolic link loop (%s)",
                              path, strerror(e));
    if (e == ENOENT && lstat(path, &lsb) == 0 && S_ISLNK(lsb.st_mode))
        return mmrt_error_set(err, MMRT_ERR_IO, "%s: cannot open: a dangling symbolic link "
                              "(%s)", path, strerror(e));
    mmrt_status st = (e == ENOENT && (flags & MMRT_FILE_MISSING_NOT_FOUND)) ? MMRT_ERR_NOT_FOUND
                                                                           : MMRT_ERR_IO;
    return mmrt_error_set(err, st, "%s: cannot open: %s", path, strerror(e));
}

mmrt_status mmrt_file_open(const char *path, unsigned flags, int *fd, struct stat *sb,
                           struct mmrt_error *err)
{
    if (!path || !fd)
        return mmrt_error_set(err, MMRT_ERR_INVALID_ARG, "mmrt_file_open: NULL argument");
    struct stat pre, post;
    if (stat(path, &pre) != 0)
        return open_failed(path, errno, flags, err);
    if (!acceptable(pre.st_mode, flags))
        return refuse_kind(path, pre.st_mode, err);
    int f = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (f < 0)
        return open_failed(path, errno, flags, err);
    mmrt_status st = MMRT_OK;
    if (fstat(f, &post) != 0) {
        st = mmrt_error_set(err, MMRT_ERR_IO, "%s: cannot stat: %s", path, strerror(errno));
        goto fail;
    }
    if (!acceptable(post.st_mode, flags)) {
        st = refuse_kind(path, post.st_mode, err);
        goto fail;
    }
    /* Regular files ignore O_NONBLOCK; a pipe the caller accepted is read blocking, as cat
     * would (its writer is attached, or the read sees end of file at once). */
    int fl = fcntl(f, F_GETFL);
    if (fl < 0 || fcntl(f, F_SETFL, fl & ~O_NONBLOCK) != 0) {
        st = mmrt_error_set(err, MMRT_ERR_IO, "%s: cannot clear O_NONBLOCK: %s", path,
                            strerror(errno));
        goto fail;
    }
    *fd = f;
    if (sb)
        *sb = post;
    return MMRT_OK;
fail:
    close(f);
    return st;
}

mmrt_status mmrt_file_read(const char *path, size_t max_bytes, unsigned flags,
                           const char *limit_what, char **data, size_t *len,
                           struct mmrt_error *err)
{
    if (!data || !len)
        return mmrt_error_set(err, MMRT_ERR_INVALID_ARG, "mmrt_file_read: NULL argument");
    if (!limit_what)
        limit_what = "";
    int fd = -1;
    struct stat sb;
    mmrt_status st = mmrt_file_open(path, flags, &fd, &sb, err);
    if (st != MMRT_OK)
        return st;
    char *buf = NULL;
    size_t n = 0, cap;
    if (S_ISREG(sb.st_mode) && (uint64_t)sb.st_size > max_bytes) {
        st = mmrt_error_set(err, MMRT_ERR_LIMIT, "%s: %llu bytes, more than the %zu allowed%s",
                            path, (unsigned long long)sb.st_size, max_bytes, limit_what);
        goto out;
    }
    if (max_bytes > SIZE_MAX - 2)
        max_bytes = SIZE_MAX - 2;
    /* Room for the whole file when its size is known, one byte more to see end of file in
     * the same pass, and the NUL. Grown by doubling up to max_bytes + 2: holding more than
     * max_bytes is already the refusal. */
    cap = S_ISREG(sb.st_mode) && sb.st_size > 0 ? (size_t)sb.st_size + 2 : 4096;
    if (cap > max_bytes + 2)
        cap = max_bytes + 2;
    if (!(buf = malloc(cap))) {
        st = mmrt_error_set(err, MMRT_ERR_NO_MEMORY, "%s: out of memory (%zu bytes)", path, cap);
        goto out;
    }
    for (;;) {
        if (n == cap - 1) { /* full; n <= max_bytes here, so the new cap is larger */
            size_t ncap = cap > (max_bytes + 2) / 2 ? max_bytes + 2 : cap * 2;
            char *nb = realloc(buf, ncap);
            if (!nb) {
                st = mmrt_error_set(err, MMRT_ERR_NO_MEMORY, "%s: out of memory (%zu bytes)",
                                    path, ncap);
                goto out;
            }
            buf = nb;
            cap = ncap;
        }
        ssize_t got = read(fd, buf + n, cap - 1 - n);
        if (got < 0) {
            if (errno == EINTR)
                continue;
            st = mmrt_error_set(err, MMRT_ERR_IO, "%s: cannot read: %s", path, strerror(errno));
            goto out;
        }
        if (got == 0)
            break;
        n += (size_t)got;
        if (n > max_bytes) {
            st = mmrt_error_set(err, MMRT_ERR_LIMIT, "%s: more than the %zu bytes allowed%s",
                                path, max_bytes, limit_what);
            goto out;
        }
    }
    buf[n] = '\0';
    *data = buf;
    *len = n;
    buf = NULL;
out:
    free(buf);
    close(fd);
    return st;
}
