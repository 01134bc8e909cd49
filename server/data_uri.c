/*
 * server/data_uri.c — data: URIs and strict base64 (see data_uri.h for the rules).
 *
 * The decoder is a 256-entry table (−1 = not in the alphabet) applied four characters at a
 * time; '=' is only legal in the last group, which is decoded apart so that the loop over
 * the full groups has no padding branch. The size is computed from the length first, so an
 * oversized payload is refused without allocating, and the output is exactly that size.
 */
#include "data_uri.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static const char b64_alphabet[] =
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/* −1 for every byte outside the standard alphabet ('=' included: it is handled apart). */
static int8_t b64_value(unsigned char c)
{
    if (c >= 'A' && c <= 'Z')
        return (int8_t)(c - 'A');
    if (c >= 'a' && c <= 'z')
        return (int8_t)(c - 'a' + 26);
    if (c >= '0' && c <= '9')
        return (int8_t)(c - '0' + 52);
    if (c == '+')
        return 62;
    if (c == '/')
        return 63;
    return -1;
}

size_t mmrt_base64_decoded_size(const char *s, size_t len)
{
    if (len % 4 != 0)
        return SIZE_MAX;
    if (len == 0)
        return 0;
    size_t pad = (s[len - 1] == '=') + (s[len - 1] == '=' && s[len - 2] == '=');
    return len / 4 * 3 - pad;
}

bool mmrt_base64_decode(const char *s, size_t len, uint8_t *out, size_t *n_out,
                        size_t *bad_at)
{
    if (len % 4 != 0) {
        *bad_at = len;
        return false;
    }
    size_t o = 0;
    for (size_t i = 0; i < len; i += 4) {
        const bool last = i + 4 == len;
        int8_t v[4];
        int n = 4; /* characters that carry bits in this group */
        for (int k = 0; k < 4; k++) {
            const unsigned char c = (unsigned char)s[i + (size_t)k];
            v[k] = b64_value(c);
            if (v[k] >= 0)
                continue;
            /* '=' may fill the last one or two places of the last group only, and once a
             * place is padding every later one must be too. */
            if (c == '=' && last && k >= 2 && (k == 3 || s[i + 3] == '=')) {
                n = k;
                break;
            }
            *bad_at = i + (size_t)k;
            return false;
        }
        const uint32_t w = ((uint32_t)v[0] << 18) | ((uint32_t)v[1] << 12) |
                           (n > 2 ? (uint32_t)v[2] << 6 : 0) | (n > 3 ? (uint32_t)v[3] : 0);
        /* Canonical encoding: the bits below the last whole byte must be zero, so every byte
         * string has exactly one accepted encoding. */
        if ((n == 2 && (v[1] & 0x0f)) || (n == 3 && (v[2] & 0x03))) {
            *bad_at = i + (size_t)n - 1;
            return false;
        }
        out[o++] = (uint8_t)(w >> 16);
        if (n > 2)
            out[o++] = (uint8_t)(w >> 8);
        if (n > 3)
            out[o++] = (uint8_t)w;
    }
    *n_out = o;
    return true;
}

char *mmrt_base64_encode(const void *data, size_t n)
{
    const uint8_t *p = data;
    if (n > (SIZE_MAX - 1) / 4 * 3 - 3)
        return NULL;
    const size_t len = (n + 2) / 3 * 4;
    char *s = malloc(len + 1);
    if (!s)
        return NULL;
    size_t o = 0;
    for (size_t i = 0; i < n; i += 3) {
        const size_t k = n - i < 3 ? n - i : 3;
        uint32_t w = (uint32_t)p[i] << 16;
        if (k > 1)
            w |= (uint32_t)p[i + 1] << 8;
        if (k > 2)
            w |= p[i + 2];
        s[o++] = b64_alphabet[(w >> 18) & 63];
        s[o++] = b64_alphabet[(w >> 12) & 63];
        s[o++] = k > 1 ? b64_alphabet[(w >> 6) & 63] : '=';
        s[o++] = k > 2 ? b64_alphabet[w & 63] : '=';
    }
    s[o] = '\0';
    return s;
}

/* Copies up to 40 bytes of a client's text into a message, '?' for anything that is not
 * printable ASCII (a media type is ASCII; anything else is shown, not trusted). */
static void snippet(char *dst, size_t size, const char *s, size_t len)
{
    size_t n = len < 40 ? len : 40;
    if (n > size - 4)
        n = size - 4;
    size_t o = 0;
    for (size_t i = 0; i < n; i++)
        dst[o++] = (s[i] >= 0x20 && s[i] < 0x7f) ? s[i] : '?';
    if (n < len)
        dst[o++] = '.', dst[o++] = '.', dst[o++] = '.';
    dst[o] = '\0';
}

static bool has_prefix_ci(const char *s, size_t len, const char *prefix)
{
    const size_t n = strlen(prefix);
    return len >= n && strncasecmp(s, prefix, n) == 0;
}

static bool equals_ci(const char *s, size_t len, const char *word)
{
    return strlen(word) == len && strncasecmp(s, word, len) == 0;
}

mmrt_status mmrt_data_uri_decode(const char *uri, size_t len, size_t max_bytes,
                                 struct mmrt_data_uri *out, struct mmrt_error *err)
{
    if (!uri || !has_prefix_ci(uri, len, "data:"))
        return mmrt_error_set(err, MMRT_ERR_FORMAT, "not a data: URI");
    const char *h = uri + 5, *end = uri + len;
    const char *comma = memchr(h, ',', (size_t)(end - h));
    if (!comma)
        return mmrt_error_set(err, MMRT_ERR_FORMAT,
                              "the data: URI has no ',' between its header and its data");
    const char *semi = memchr(h, ';', (size_t)(comma - h));
    const char *type_end = semi ? semi : comma;
    char shown[48];
    enum mmrt_data_uri_type type;
    if (equals_ci(h, (size_t)(type_end - h), "image/png")) {
        type = MMRT_DATA_URI_PNG;
    } else if (equals_ci(h, (size_t)(type_end - h), "image/jpeg") ||
               equals_ci(h, (size_t)(type_end - h), "image/jpg")) {
        type = MMRT_DATA_URI_JPEG;
    } else {
        snippet(shown, sizeof shown, h, (size_t)(type_end - h));
        return mmrt_error_set(err, MMRT_ERR_UNSUPPORTED,
                              "the data: URI has media type '%s'; mmrt takes image/png and "
                              "image/jpeg", shown);
    }
    if (!semi)
        return mmrt_error_set(err, MMRT_ERR_FORMAT,
                              "the data: URI is not base64 (expected ';base64,' after the "
                              "media type)");
    if (!equals_ci(semi, (size_t)(comma - semi), ";base64")) {
        snippet(shown, sizeof shown, semi + 1, (size_t)(comma - semi - 1));
        return mmrt_error_set(err, MMRT_ERR_UNSUPPORTED,
                              "the data: URI has the parameter '%s'; only ';base64' is "
                              "supported, right after the media type", shown);
    }
    const char *b64 = comma + 1;
    const size_t n = (size_t)(end - b64);
    if (n == 0)
        return mmrt_error_set(err, MMRT_ERR_FORMAT, "the data: URI has no data after ','");
    const size_t size = mmrt_base64_decoded_size(b64, n);
    if (size == SIZE_MAX)
        return mmrt_error_set(err, MMRT_ERR_FORMAT,
                              "the base64 data has %zu characters, not a multiple of 4 "
                              "(missing '=' padding, or cut short?)", n);
    if (max_bytes && size > max_bytes)
        return mmrt_error_set(err, MMRT_ERR_LIMIT,
                              "the image has %zu bytes, more than the %zu this server takes",
                              size, max_bytes);
    uint8_t *data = malloc(size ? size : 1);
    if (!data)
        return mmrt_error_set(err, MMRT_ERR_NO_MEMORY,
                              "out of memory for an image of %zu bytes", size);
    size_t got = 0, bad = 0;
    if (!mmrt_base64_decode(b64, n, data, &got, &bad)) {
        free(data);
        const unsigned char c = (unsigned char)b64[bad];
        if (c == '=' || b64_value(c) >= 0) /* a legal character in the wrong place */
            return mmrt_error_set(err, MMRT_ERR_FORMAT,
                                  "invalid base64 at character %zu of the data: %s", bad,
                                  c == '=' ? "'=' is padding, only at the end"
                                           : "the unused bits of the last character are not "
                                             "zero (not the canonical encoding)");
        char what[16];
        if (c >= 0x20 && c < 0x7f)
            snprintf(what, sizeof what, "'%c'", c);
        else
            snprintf(what, sizeof what, "byte 0x%02x", c);
        return mmrt_error_set(err, MMRT_ERR_FORMAT,
                              "invalid base64 at character %zu of the data: %s is not in the "
                              "standard alphabet (A-Z a-z 0-9 + / and '=' padding; no "
                              "whitespace or line breaks)", bad, what);
    }
    static const uint8_t png_magic[8] = { 0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n' };
    static const uint8_t jpeg_magic[3] = { 0xff, 0xd8, 0xff };
    if (!(got >= sizeof png_magic && memcmp(data, png_magic, sizeof png_magic) == 0) &&
        !(got >= sizeof jpeg_magic && memcmp(data, jpeg_magic, sizeof jpeg_magic) == 0)) {
        free(data);
        return mmrt_error_set(err, MMRT_ERR_FORMAT,
                              "the decoded data (%zu bytes) is not a PNG or JPEG image", got);
    }
    out->type = type;
    out->data = data;
    out->size = got;
    return MMRT_OK;
}
