/*
 * core/formats/file.h — the one way mmrt opens a file it reads from outside.
 *
 * Every reader of core/formats (JSON: config.json, tokenizer.json, processor and generation
 * configs, shard indexes; images; safetensors checkpoints and shards; deploy.ini) opens its
 * file here, so all of them refuse the same things in the same words:
 *
 *   - anything that is not a regular file (a directory, a FIFO, a character or block device,
 *     a socket) is refused by name — "PATH: not a regular file (it is a FIFO)" — before it
 *     is opened where stat can tell, and again by fstat on the opened descriptor, so a FIFO
 *     swapped in between cannot make the reader wait;
 *   - the open itself never blocks: O_NONBLOCK (a FIFO with no writer would otherwise hang
 *     open(2) forever), O_NOCTTY (a terminal device never becomes our controlling tty),
 *     O_CLOEXEC. O_NONBLOCK is cleared again once the descriptor is known to be a regular
 *     file (it has no effect on regular files, but a caller may hand the fd on);
 *   - a symbolic link loop and a dangling symbolic link are named as such, not reported as
 *     a missing file.
 *
 * MMRT_FILE_PIPE_OK relaxes the rule for one caller only, the deploy.ini reader, so that
 * `mmrt --conf <(generate-ini)` keeps working: a FIFO or pipe is then read to its end. The
 * open still cannot block (O_NONBLOCK); with no writer attached the read sees end of file at
 * once, which the INI parser then reports as a file without devices.
 *
 * Statuses: MMRT_ERR_IO for every refusal and failed system call (MMRT_ERR_NOT_FOUND instead
 * for a path that does not exist when MMRT_FILE_MISSING_NOT_FOUND is given), MMRT_ERR_LIMIT
 * when the file is larger than the caller's cap, MMRT_ERR_NO_MEMORY. Messages start with
 * the path. Outputs are written only on success.
 */
#ifndef MMRT_FORMATS_FILE_H
#define MMRT_FORMATS_FILE_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/stat.h>

#include "../error.h"

/* Flags of mmrt_file_open / mmrt_file_read. */
#define MMRT_FILE_PIPE_OK 1u            /* accept a FIFO or pipe too, read until EOF */
#define MMRT_FILE_MISSING_NOT_FOUND 2u  /* a path that does not exist is MMRT_ERR_NOT_FOUND */

/* What a file mode is, for messages: "a directory", "a FIFO", "a character device",
 * "a block device", "a socket", "a symbolic link", "a regular file"; never NULL. */
const char *mmrt_file_kind(mode_t mode);

/* Whether anything at all is at path (lstat: a dangling or looping symbolic link counts, a
 * FIFO counts). Never opens, so never blocks. Use it to choose between alternative files,
 * then let mmrt_file_open / mmrt_file_read refuse what is wrong with the chosen one. */
bool mmrt_file_exists(const char *path);

/* Opens path read-only as described above. On success *fd is the caller's to close and *sb
 * (may be NULL) holds its fstat. */
mmrt_status mmrt_file_open(const char *path, unsigned flags, int *fd, struct stat *sb,
                           struct mmrt_error *err);

/* Reads the whole file into a new buffer (*data, NUL-terminated for convenience, *len bytes
 * without the NUL; free() it). A file larger than max_bytes is MMRT_ERR_LIMIT; limit_what
 * (may be NULL) is appended to that message, e.g. " for a configuration file". */
mmrt_status mmrt_file_read(const char *path, size_t max_bytes, unsigned flags,
                           const char *limit_what, char **data, size_t *len,
                           struct mmrt_error *err);

#endif /* MMRT_FORMATS_FILE_H */
