/*
 * core/formats/conf.h — the deploy.ini reader behind `mmrt --conf deploy.ini`.
 *
 * A deployment file says which model to load, which devices exist (each one a plugin plus
 * its settings), which device runs each stage, and optionally one request to run:
 *
 *     [model]
 *     path = ../tests/fixtures/llava-tiny   ; relative to the INI file's folder
 *     max_image_tokens = 2048  ; optional, 0..2147483647, default 0 (= no limit beyond the
 *                              ; model's context): image tokens per request, all images
 *     oversize_images = refuse ; optional, refuse | downscale, default refuse: what happens
 *                              ; to images over that budget (docs/CONFIG.md)
 *     max_kv_tokens = 8192     ; optional, 0..2147483647, default 0 (= the model's context;
 *                              ; with a pool_mb given, at most half the pool): positions of
 *                              ; the paged KV cache
 *     kv_page_tokens = 16      ; optional, a power of two 1..4096, default 16
 *     kv_dtype = f32           ; optional, f32 | f16 | fp8 (E4M3) | int8 (row-scaled),
 *                              ; default f32: what the KV cache stores
 *     weights = checkpoint     ; optional, checkpoint | int8 | int4 (= int4-g128) |
 *                              ; int4-g64 | int4-g32: matmul weights as stored or quantized
 *                              ; at load
 *     exif_orientation = ignore ; optional, ignore | apply, default ignore (as transformers):
 *                              ; whether images are turned upright by their EXIF tag
 *     image_kv_keep = 0.5      ; optional, (0, 1], default 1 (= off): fraction of the image
 *                              ; tokens' K/V each layer and head keeps after prefill
 *     image_kv_policy = random ; optional, key_norm_high | key_norm_low | random | pool2x2,
 *                              ; default: the one docs/BENCHMARKS.md measured best
 *     chat_template = auto     ; optional, auto | llava | mistral | chatml | llama3,
 *                              ; default auto: the checkpoint's own (LLaVA-family models
 *                              ; only)
 *
 *     [device.cpu0]
 *     plugin = cpu          ; required; the loader maps it to libmmrt_cpu.so
 *     index = 0             ; optional, 0..1023, default 0: device index within the plugin
 *     pool_mb = auto        ; optional, auto or 1..16777216 MiB, default auto (kept as 0):
 *                           ; the device's working pool, auto = sized for the stages placed
 *                           ; on it (mmrt.h struct mmrt_device_config)
 *     level1 = on           ; optional, on | off, default on: the pool's exact-size level
 *     threads = 2           ; any other key is a plugin-specific option, kept with its line
 *
 *     [stage.vision]
 *     device = cpu0         ; required in the section; must name a [device.NAME]
 *     [stage.language]
 *     device = cpu0
 *
 *     [scheduler]           ; optional: the generation engine (docs/ENGINE.md)
 *     max_batch = 16        ; optional, 1..32, default 16: sequences running at once
 *     prefill_chunk = 512   ; optional, 1..1048576, default 512: prompt tokens per chunk
 *     step_tokens = 528     ; optional, 1..1048576, default prefill_chunk + max_batch:
 *                           ; token rows one engine step runs
 *     vision_batch = 8      ; optional, 1..32, default 1: waiting requests whose vision
 *                           ; stages run together (one pass of the tower where they can)
 *     draft_tokens = 3      ; optional, 0..31, default 0 (off): tokens per sequence and
 *                           ; decode step guessed from the sequence itself and checked
 *     draft_rows = 4        ; optional, 2..32, default the tokens drafted a step + 1
 *                           ; (draft_tokens, or 3 for a request's prediction): rows a
 *                           ; decode step may reach with drafts
 *
 *     [server]              ; optional: read by `mmrt serve` (docs/SERVING.md), not by the
 *     port = 8080           ; runtime; keys are 1..63 of [A-Za-z0-9_.-], kept as text with
 *                           ; their lines (mmrt.h mmrt_conf_read_section)
 *     [cache]               ; optional: the vision-feature cache (docs/CONFIG.md "Cache")
 *     vision_entries = 2048 ; optional, 0..16777216, default 2048: images it holds; 0 = off
 *     vision_mb = 1024      ; optional, 1..16777216, default 1024: MiB of features it holds
 *     prefix = on           ; optional, on | off, default on: reuse the KV of prompt prefixes
 *
 *     [run]
 *     image = cat.png       ; relative to the INI file's folder
 *     prompt = What is in the picture?
 *     max_tokens = 32       ; 1..1000000, default 64
 *     seed = 0              ; 0..2^63-1, default 0
 *     temperature = 0       ; finite, 0..100, default 0 (= greedy)
 *     top_k = 0             ; 0..1000000, default 0 (= off)
 *     top_p = 1.0           ; (0, 1], default 1
 *     repetition_penalty = 1 ; (0, 100], default 1 (= off)
 *     presence_penalty = 0  ; [-2, 2], default 0 (= off)
 *     frequency_penalty = 0 ; [-2, 2], default 0 (= off)
 *     response_format = text ; text | json_object, default text
 *     json_schema = item.json ; relative to the INI file's folder: the answer is a JSON
 *                           ; document held to this JSON Schema (not beside response_format)
 *
 * Rules (each violation is an error, never a warning or a silent default):
 *   - At least one [device.NAME] section. NAME is 1..31 of [A-Za-z0-9_-], and so is the
 *     `plugin` value (the loader turns it into a file name, so no '/' or ".." can get in).
 *     [model] is optional (a file may only list devices), but when present it needs `path`.
 *   - Sections, keys and device names are case-sensitive. Unknown sections, unknown keys in
 *     [model]/[stage.*]/[run], a section or key given twice, keys before the first section
 *     and an empty value for any key this reader knows are refused.
 *   - Plugin-specific option keys are 1..63 of [A-Za-z0-9_.-]; their values are kept as
 *     text, may be empty, and are validated later by the runtime against the plugin's own
 *     option list (which reports FILE:LINE from mmrt_conf_option.line).
 *   - Integers are plain decimal (optional '-', digits, nothing else: no '+', no hex, no
 *     spaces inside). Reals are decimal with an optional fraction and exponent; "nan",
 *     "inf" and hex floats are refused. Parsing ignores the process locale.
 *   - Stage policy stays out of this reader: a missing [stage.*] section is only recorded
 *     (present = false); the runtime decides the default (the first device).
 *
 * Syntax, as inih (Debian libinih 55) parses it plus what this reader adds:
 *   - `key = value` or `key: value`; whitespace around keys and values is dropped.
 *   - Comments: a line whose first non-blank character is ';' or '#'. Inline, ';' starts a
 *     comment only when preceded by whitespace (Debian builds inih with inline comments on):
 *     `a = x ; note` gives "x", `a = x;y` gives "x;y", and `#` is never an inline comment.
 *   - Double quotes: a value that starts with '"' must end with '"'; the pair is removed,
 *     which keeps leading/trailing blanks (`prompt = "  hi "`). There are no escapes.
 *     Quotes do NOT protect " ;" — inih cuts the comment before this reader sees the value,
 *     so `a = "x ; y"` is an unterminated quote and is refused.
 *   - Indentation is ignored and there are no multi-line (continuation) values: this reader
 *     strips leading blanks before inih sees a line, so an indented line is just a line.
 *   - A section header is exactly `[name]`, optionally followed by blanks or a ';' comment.
 *   - A UTF-8 byte-order mark at the very start is skipped; LF and CRLF line ends are both
 *     accepted. The text must be valid UTF-8 without NUL or control characters (tab is fine).
 *
 * Limits for hostile files: MMRT_CONF_MAX_BYTES per file; a line may hold at most what
 * inih's line buffer takes, INI_MAX_LINE - 2 = 198 bytes on Debian (indentation counts, the
 * line end does not) — a longer line is an error naming its number, where inih alone would
 * silently split it into two lines; at most MMRT_CONF_MAX_DEVICES devices and
 * MMRT_CONF_MAX_OPTIONS options per device, which also bounds the number of keys. Long
 * prompts therefore belong on the command line, not in [run].
 *
 * Every error message has the form "FILE:LINE: message", with the line of the offending key
 * or header, or of the section header when a required key is missing; the one message not
 * tied to a line inside the file, "no [device.NAME] section", names the last line (end of
 * file). Failures to read the file itself (open, read, size) read "FILE: message".
 * Statuses: MMRT_ERR_CONFIG for content errors, MMRT_ERR_LIMIT for size limits,
 * MMRT_ERR_NO_MEMORY, MMRT_ERR_NOT_FOUND / MMRT_ERR_IO from mmrt_conf_load, and
 * MMRT_ERR_INVALID_ARG for NULL arguments.
 *
 * Thread-safety: parsing touches no global state (inih is used with its stack buffer and
 * its settings are only read), so separate calls may run concurrently. A loaded
 * struct mmrt_conf is immutable data; read it from any thread.
 */
#ifndef MMRT_FORMATS_CONF_H
#define MMRT_FORMATS_CONF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../error.h"
#include "mmrt/mmrt.h"

#define MMRT_CONF_MAX_BYTES (1024 * 1024) /* largest accepted file */
#define MMRT_CONF_MAX_DEVICES 64          /* [device.NAME] sections per file */
#define MMRT_CONF_MAX_OPTIONS 64          /* plugin-specific keys per device */
#define MMRT_CONF_MAX_NAME 31             /* device name length */
#define MMRT_CONF_MAX_OPTION_KEY 63       /* plugin-specific key length */

/* Defaults of the keys that have one. */
#define MMRT_CONF_DEFAULT_INDEX 0
#define MMRT_CONF_DEFAULT_POOL_MB 0 /* auto */
#define MMRT_CONF_DEFAULT_MAX_TOKENS 64
#define MMRT_CONF_DEFAULT_TOP_P 1.0
#define MMRT_CONF_MAX_IMAGE_TOKENS 2147483647 /* largest max_image_tokens */
#define MMRT_CONF_MAX_KV_TOKENS 2147483647    /* largest max_kv_tokens */
#define MMRT_CONF_MAX_KV_PAGE_TOKENS 4096     /* largest kv_page_tokens (core/kv_cache.h) */
#define MMRT_CONF_MAX_BATCH 32                /* largest max_batch (core/engine.h) */
#define MMRT_CONF_MAX_PREFILL_CHUNK (1 << 20)
#define MMRT_CONF_MAX_STEP_TOKENS (1 << 20)
#define MMRT_CONF_MAX_VISION_BATCH 32
#define MMRT_CONF_MAX_DRAFT_TOKENS 31         /* largest draft_tokens (MMRT_SMALL_M − 1) */
#define MMRT_CONF_MAX_VISION_ENTRIES (1 << 24) /* largest [cache] vision_entries */
#define MMRT_CONF_MAX_VISION_MB (1 << 24)      /* largest [cache] vision_mb */

/* In every struct below a `*_line` member is the 1-based line of that key or header in the
 * file, and 0 when the key or section was absent (the value is then its default). */

/* A plugin-specific key of a [device.NAME] section, kept verbatim (quotes removed). */
struct mmrt_conf_option {
    char *key;
    char *value; /* may be "" */
    int line;
};

struct mmrt_conf_device {
    char *name;   /* NAME of [device.NAME] */
    int line;     /* the section header */
    char *plugin; /* never NULL or empty */
    int plugin_line;
    int index; /* 0..1023 */
    int index_line;
    uint64_t pool_mb; /* 1..16777216 MiB, or 0 for auto */
    int pool_mb_line;
    enum mmrt_level1 level1; /* MMRT_LEVEL1_DEFAULT when absent */
    int level1_line;
    struct mmrt_conf_option *options; /* [n_options], in file order */
    int n_options;
};

struct mmrt_conf_stage {
    bool present;     /* the [stage.X] section exists */
    int section_line; /* its header, 0 when absent */
    char *device;     /* names a device of the same file; NULL when absent */
    int line;         /* the `device =` key */
};

/* [run]: one request for the CLI. Absent keys hold their defaults. */
struct mmrt_conf_run {
    int line;    /* the [run] header, 0 when absent */
    char *image; /* resolved path (see mmrt_conf.model_path), NULL when absent */
    int image_line;
    char *prompt; /* NULL when absent */
    int prompt_line;
    long max_tokens; /* 1..1000000 */
    int max_tokens_line;
    uint64_t seed; /* 0..2^63-1 */
    int seed_line;
    double temperature; /* finite, 0..100; 0 = greedy */
    int temperature_line;
    long top_k; /* 0..1000000; 0 = off */
    int top_k_line;
    double top_p; /* (0, 1] */
    int top_p_line;
    double repetition_penalty; /* (0, 100]; 0 = absent (off) */
    int repetition_penalty_line;
    double presence_penalty, frequency_penalty; /* [-2, 2]; 0 = off */
    int presence_penalty_line, frequency_penalty_line;
    int response_format; /* enum mmrt_response_format */
    int response_format_line;
    char *json_schema;   /* resolved path of the schema file, NULL when absent */
    int json_schema_line;
};

/* [scheduler]: 0 = the engine's default for each. */
struct mmrt_conf_scheduler {
    int line;
    int max_batch;
    int max_batch_line;
    int64_t prefill_chunk;
    int prefill_chunk_line;
    int64_t step_tokens;
    int step_tokens_line;
    int vision_batch;
    int vision_batch_line;
    int draft_tokens;
    int draft_tokens_line;
    int draft_rows;
    int draft_rows_line;
};

/* A key of an application section ([server]), as text. */
struct mmrt_conf_entry {
    char *section, *key, *value;
    int line;
};

#define MMRT_CONF_MAX_APP_KEYS 256

/* [cache], in struct mmrt_config's terms: vision_entries 0 = the default (the key absent),
 * negative = off (the key's 0), else the count; vision_mb 0 = the default. */
struct mmrt_conf_cache {
    int line;
    int64_t vision_entries;
    int vision_entries_line;
    int64_t vision_mb;
    int vision_mb_line;
    int prefix;                 /* 0 = the default (on), 1 = on, -1 = off */
    int prefix_line;
};

struct mmrt_conf {
    char *path; /* the name given to load/parse; prefix of the runtime's own messages */
    int model_line;  /* the [model] header, 0 when there is no [model] */
    /* [model] path, resolved: a relative value is joined to the folder of `path` (the text
     * before its last '/'; unchanged when `path` has no '/'), an absolute one is kept.
     * Nothing is canonicalised and the file system is not consulted. NULL without [model]. */
    char *model_path;
    int model_path_line;
    int64_t max_image_tokens; /* [model] max_image_tokens, 0..MMRT_CONF_MAX_IMAGE_TOKENS */
    int max_image_tokens_line;
    enum mmrt_oversize_images oversize_images; /* [model] oversize_images */
    int oversize_images_line;
    int64_t max_kv_tokens;    /* [model] max_kv_tokens, 0 = default */
    int max_kv_tokens_line;
    int64_t kv_page_tokens;   /* [model] kv_page_tokens, 0 = default; a power of two */
    int kv_page_tokens_line;
    enum mmrt_kv_dtype kv_dtype; /* [model] kv_dtype */
    int kv_dtype_line;
    enum mmrt_weight_format weights; /* [model] weights */
    int weights_line;
    enum mmrt_exif_orientation exif_orientation; /* [model] exif_orientation */
    int exif_orientation_line;
    double image_kv_keep;     /* [model] image_kv_keep, (0, 1]; 0 = absent */
    int image_kv_keep_line;
    enum mmrt_image_kv_policy image_kv_policy; /* [model] image_kv_policy */
    int image_kv_policy_line;
    enum mmrt_chat_template chat_template; /* [model] chat_template */
    int chat_template_line;
    struct mmrt_conf_device *devices; /* [n_devices] in file order, n_devices >= 1 */
    int n_devices;
    struct mmrt_conf_stage vision, language;
    struct mmrt_conf_run run;
    struct mmrt_conf_scheduler scheduler;
    /* Application sections (mmrt.h mmrt_conf_read_section): [server]. */
    int server_line;
    struct mmrt_conf_entry *app;
    int n_app, cap_app;
    struct mmrt_conf_cache cache;
};

/* Reads the file at `path` (at most MMRT_CONF_MAX_BYTES) and parses it as
 * mmrt_conf_parse(text, len, path, …) does. Open and read failures name the path and the
 * system's reason: MMRT_ERR_NOT_FOUND for a missing file, MMRT_ERR_IO otherwise — also for
 * a directory or a device, named as such (core/formats/file.h). A FIFO or pipe is read to
 * its end, without ever blocking on open. */
mmrt_status mmrt_conf_load(const char *path, struct mmrt_conf **out, struct mmrt_error *err);

/* Parses `len` bytes of `text` (need not be NUL-terminated). `name` is the file name used in
 * messages and for resolving relative paths. On success *out is a new conf that the caller
 * releases with mmrt_conf_destroy(); on failure *out is left untouched. */
mmrt_status mmrt_conf_parse(const char *text, size_t len, const char *name,
                            struct mmrt_conf **out, struct mmrt_error *err);

/* Frees conf and everything it owns; NULL is a no-op. */
void mmrt_conf_destroy(struct mmrt_conf *conf);

/* The device called `name` (exact, case-sensitive match), or NULL. Borrowed from conf. */
const struct mmrt_conf_device *mmrt_conf_find_device(const struct mmrt_conf *conf,
                                                     const char *name);

/* The plugin-specific option `key` of dev, or NULL. Borrowed from dev. */
const struct mmrt_conf_option *mmrt_conf_find_option(const struct mmrt_conf_device *dev,
                                                     const char *key);

#endif /* MMRT_FORMATS_CONF_H */
