/*
 * server/data_uri.h — images sent inline in chat requests as `data:` URIs (RFC 2397), and
 * the strict base64 (RFC 4648 §4) they carry.
 *
 * What is accepted, and why it is this narrow (every byte here comes from a client):
 *
 *   data:image/png;base64,<payload>      data:image/jpeg;base64,<payload>
 *   data:image/jpg;base64,<payload>      (a common misspelling; treated as image/jpeg)
 *
 *   - "data:", the media type and ";base64" are compared case-insensitively (RFC 2397 and
 *     RFC 2045 make them so). No other parameters (";charset=…", ";name=…"): nothing an
 *     image needs is said there, and refusing them keeps the grammar trivial.
 *   - Any other media type is MMRT_ERR_UNSUPPORTED naming it; a URI without ";base64"
 *     (percent-encoded data) is MMRT_ERR_FORMAT.
 *   - The payload is the standard alphabet (A–Z a–z 0–9 + /) with '=' padding to a multiple
 *     of 4 characters, and nothing else: no whitespace or line breaks (`base64 -w0`, not the
 *     76-column MIME form), no URL-safe '-' '_', no missing padding, and the unused low bits
 *     of the last character must be zero (the canonical encoding). One encoding per byte
 *     string means the decoded size is known exactly from the length, before decoding.
 *   - The media type is a label; the image decoder recognises PNG and JPEG by their magic
 *     bytes (core/formats/image.h, I1). The decoded bytes must start with one of those
 *     magics, else MMRT_ERR_FORMAT: a text file or an empty payload is refused here, before
 *     it is queued. A PNG labelled image/jpeg is accepted (the decoder reads it as PNG).
 *
 * Thread-safety: all functions are reentrant. Nothing here allocates except
 * mmrt_data_uri_decode's output and mmrt_base64_encode's result.
 */
#ifndef MMRT_SERVER_DATA_URI_H
#define MMRT_SERVER_DATA_URI_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "error.h"

/* Bytes that `len` characters of strict base64 at s decode to: len / 4 * 3 minus the '='
 * padding (read from the last two characters only). SIZE_MAX when len is not a multiple of 4
 * (cannot be strict base64). Reads at most s[len - 2] and s[len - 1]. */
size_t mmrt_base64_decoded_size(const char *s, size_t len);

/* Decodes `len` characters of strict base64 (rules above) into out, which has room for
 * mmrt_base64_decoded_size(s, len) bytes. On success returns true and sets *n_out. On
 * failure returns false and sets *bad_at to the offset of the first character that is wrong
 * (len itself when the length is not a multiple of 4); out may have been partly written. */
bool mmrt_base64_decode(const char *s, size_t len, uint8_t *out, size_t *n_out,
                        size_t *bad_at);

/* The strict base64 of n bytes, malloc'ed and NUL-terminated (free() it); NULL when out of
 * memory or n is too large to encode. Tests and fuzz targets use it for round trips. */
char *mmrt_base64_encode(const void *data, size_t n);

enum mmrt_data_uri_type {
    MMRT_DATA_URI_PNG = 1,
    MMRT_DATA_URI_JPEG = 2,
};

/* A decoded data: URI. data is malloc'ed (free() it); size ≥ 1. */
struct mmrt_data_uri {
    enum mmrt_data_uri_type type; /* from the media type (the label, not the magic) */
    uint8_t *data;
    size_t size;
};

/*
 * Parses `len` bytes of uri (need not be NUL-terminated) and decodes its payload.
 * max_bytes caps the decoded size; it is checked from the length before anything is
 * allocated or decoded (0 = no cap beyond memory).
 * Statuses (err->msg is one line, without the URI itself, suitable for a client):
 *   MMRT_ERR_FORMAT       not a data: URI, no ',' after the header, not ";base64", an empty
 *                         payload, invalid base64 (the message gives the offset within the
 *                         payload and why), or bytes that are not PNG or JPEG
 *   MMRT_ERR_UNSUPPORTED  a media type other than image/png, image/jpeg, image/jpg, or a
 *                         parameter other than ;base64 (named in the message)
 *   MMRT_ERR_LIMIT        the decoded size is over max_bytes (both figures in the message)
 *   MMRT_ERR_NO_MEMORY    the output could not be allocated
 * *out is written only on success.
 */
mmrt_status mmrt_data_uri_decode(const char *uri, size_t len, size_t max_bytes,
                                 struct mmrt_data_uri *out, struct mmrt_error *err);

#endif /* MMRT_SERVER_DATA_URI_H */
