/*
 * tools/plugin_check/main.c — mmrt-plugin-check: proves a device plugin against the CPU
 * reference plugin (see check.h for the parts, docs/PLUGINS.md for the vendor's view).
 *
 * Order of work: load the plugin under test through the loader (a refusal is a load error,
 * with the loader's message), check its entry point's versioning, load the reference "cpu"
 * plugin by name, run the device contract on a device handle of its own, then open both
 * devices with a pool each and run the operator grid for every op the plugin claims.
 *
 * Exit status: 0 every check passed, 1 something failed, 2 usage or load error (or the
 * checker or the reference failed: the result would mean nothing), 77 the plugin has no
 * device here (skipped; ctest's SKIP_RETURN_CODE).
 */
#include <dlfcn.h>
#include <getopt.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "check.h"
#include "contract.h"
#include "log.h"
#include "mmrt/mmrt.h"
#include "plugin_loader.h"

#define MAX_OPTIONS 16
#define DEFAULT_POOL_MB 256
#define MIN_POOL_MB 16
/* The slowest case takes a few seconds on PoCL under AddressSanitizer. */
#define DEFAULT_CASE_TIMEOUT 300

static void usage(FILE *f)
{
    fprintf(f,
            "usage: mmrt-plugin-check [options] PLUGIN\n"
            "  Runs every operator PLUGIN claims against the CPU reference plugin on a grid of\n"
            "  shapes, dtypes and layouts, checks the device contract of plugin.h, and prints a\n"
            "  pass/FAIL table. PLUGIN is a path to a .so, or a plugin name (libmmrt_NAME.so)\n"
            "  found on the plugin search path.\n"
            "\n"
            "  --json               print one JSON object instead of the table\n"
            "  --ops LIST           only these operators, comma-separated (e.g. MATMUL,ROPE);\n"
            "                       default: every operator\n"
            "  --seed N             seed of the random inputs (default 1)\n"
            "  --quick              a small part of the grid (seconds instead of tens)\n"
            "  --device N           device index of the plugin under test (default 0)\n"
            "  --option KEY=VALUE   device option for the plugin under test, as in a\n"
            "                       [device.NAME] section (repeatable)\n"
            "  --strict             also hold the device contract to the in-tree plugins'\n"
            "                       conventions (error messages, NULL and foreign handles)\n"
            "  --pool-mb N          device pool per device in MiB (default %d; halved until it\n"
            "                       fits a smaller device)\n"
            "  --verbose            list every case\n"
            "  --case-timeout S     give up (FAIL, naming the case) when one case takes longer\n"
            "                       than S seconds, e.g. a kernel that never returns (default\n"
            "                       %d; 0 = wait forever)\n"
            "  --tolerances         print the tolerance table with its reasons and exit\n"
            "  --help, --version\n"
            "\n"
            "Exit status: 0 all passed, 1 a check FAILed, 2 usage or load error, 77 the plugin\n"
            "has no device here (skipped). Plugins are searched in $MMRT_PLUGIN_PATH, next to\n"
            "this executable, then in the install directory. MMRT_LOG=debug|info shows more.\n",
            DEFAULT_POOL_MB, DEFAULT_CASE_TIMEOUT);
}

struct args {
    const char *plugin;
    bool json, quick, strict, verbose;
    uint64_t seed;
    int device;
    uint64_t pool_mb, case_timeout;
    const char *ops;
    struct mmrt_option options[MAX_OPTIONS];
    int n_options;
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static bool parse_u64(const char *s, uint64_t max, uint64_t *out)
{
    char *end;
    if (!s || !*s || *s == '-')
        return false;
    unsigned long long v = strtoull(s, &end, 10);
    if (*end || v > max)
        return false;
    *out = v;
    return true;
}

/* Marks the ops named in a comma-separated list (case-insensitive). */
static mmrt_status select_ops(const char *list, bool *sel, struct mmrt_error *err)
{
    if (!list) {
        for (int op = 0; op < MMRT_OP_COUNT; op++)
            sel[op] = true;
        return MMRT_OK;
    }
    const char *p = list;
    while (*p) {
        size_t n = strcspn(p, ",");
        int found = -1;
        for (int op = 0; op < MMRT_OP_COUNT && found < 0; op++) {
            const char *name = mmrt_op_name((enum mmrt_op)op);
            if (strlen(name) == n && strncasecmp(name, p, n) == 0)
                found = op;
        }
        if (found < 0)
            return mmrt_error_set(err, MMRT_ERR_INVALID_ARG, "--ops: unknown operator '%.*s'",
                                  (int)n, p);
        sel[found] = true;
        p += n;
        if (*p == ',')
            p++;
    }
    return MMRT_OK;
}

static int parse_args(int argc, char **argv, struct args *a)
{
    enum { O_JSON = 1, O_OPS, O_SEED, O_QUICK, O_DEVICE, O_OPTION, O_STRICT, O_POOL, O_VERBOSE,
           O_TOL, O_HELP, O_VERSION, O_TIMEOUT };
    static const struct option longopts[] = {
        {"json", no_argument, NULL, O_JSON},       {"ops", required_argument, NULL, O_OPS},
        {"seed", required_argument, NULL, O_SEED}, {"quick", no_argument, NULL, O_QUICK},
        {"device", required_argument, NULL, O_DEVICE},
        {"option", required_argument, NULL, O_OPTION},
        {"strict", no_argument, NULL, O_STRICT},   {"pool-mb", required_argument, NULL, O_POOL},
        {"verbose", no_argument, NULL, O_VERBOSE}, {"tolerances", no_argument, NULL, O_TOL},
        {"help", no_argument, NULL, O_HELP},       {"version", no_argument, NULL, O_VERSION},
        {"case-timeout", required_argument, NULL, O_TIMEOUT},
        {NULL, 0, NULL, 0},
    };
    memset(a, 0, sizeof *a);
    a->seed = 1;
    a->pool_mb = DEFAULT_POOL_MB;
    a->case_timeout = DEFAULT_CASE_TIMEOUT;
    int o;
    uint64_t v;
    opterr = 0;
    while ((o = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
        switch (o) {
        case O_JSON: a->json = true; break;
        case O_QUICK: a->quick = true; break;
        case O_STRICT: a->strict = true; break;
        case O_VERBOSE: a->verbose = true; break;
        case O_OPS: a->ops = optarg; break;
        case O_SEED:
            if (!parse_u64(optarg, UINT64_MAX, &a->seed)) {
                fprintf(stderr, "mmrt-plugin-check: --seed: '%s' is not a number\n", optarg);
                return CHK_EXIT_USAGE;
            }
            break;
        case O_DEVICE:
            if (!parse_u64(optarg, 1000, &v)) {
                fprintf(stderr, "mmrt-plugin-check: --device: '%s' is not an index\n", optarg);
                return CHK_EXIT_USAGE;
            }
            a->device = (int)v;
            break;
        case O_POOL:
            if (!parse_u64(optarg, 1u << 30, &a->pool_mb) || a->pool_mb < MIN_POOL_MB) {
                fprintf(stderr, "mmrt-plugin-check: --pool-mb: '%s' is not a size of at least "
                        "%d MiB\n", optarg, MIN_POOL_MB);
                return CHK_EXIT_USAGE;
            }
            break;
        case O_TIMEOUT:
            if (!parse_u64(optarg, 86400, &a->case_timeout)) {
                fprintf(stderr, "mmrt-plugin-check: --case-timeout: '%s' is not a number of "
                        "seconds\n", optarg);
                return CHK_EXIT_USAGE;
            }
            break;
        case O_OPTION: {
            char *eq = strchr(optarg, '=');
            if (!eq || eq == optarg || a->n_options == MAX_OPTIONS) {
                fprintf(stderr, "mmrt-plugin-check: --option: want KEY=VALUE (at most %d), got "
                        "'%s'\n", MAX_OPTIONS, optarg);
                return CHK_EXIT_USAGE;
            }
            *eq = '\0'; /* argv is ours to modify */
            a->options[a->n_options].key = optarg;
            a->options[a->n_options].value = eq + 1;
            a->n_options++;
            break;
        }
        case O_TOL: {
            int n;
            const struct chk_tolerance *t = chk_tolerance_table(&n);
            for (int i = 0; i < n; i++) {
                char tol[16] = "exact";
                if (t[i].tol != 0)
                    snprintf(tol, sizeof tol, "%.0e", t[i].tol);
                printf("%-12s %-6s %-6s %s\n", mmrt_op_name(t[i].op), t[i].dtype ? t[i].dtype : "*",
                       tol, t[i].reason);
            }
            return -1;
        }
        case O_HELP: usage(stdout); return -1;
        case O_VERSION: printf("mmrt-plugin-check %s\n", mmrt_version()); return -1;
        default:
            fprintf(stderr, "mmrt-plugin-check: unknown or incomplete option '%s'\n",
                    argv[optind - 1]);
            usage(stderr);
            return CHK_EXIT_USAGE;
        }
    }
    if (optind != argc - 1) {
        usage(stderr);
        return CHK_EXIT_USAGE;
    }
    a->plugin = argv[optind];
    return 0;
}

/* ---- finding and loading ------------------------------------------------------------------- */

struct find {
    const char *name;
    char *path;
};

static int find_cb(void *user, const char *name, const char *path)
{
    struct find *f = user;
    if (strcmp(name, f->name) != 0)
        return 0;
    f->path = strdup(path);
    return 1;
}

/* A path for PLUGIN: as given when it looks like a file, else the first libmmrt_NAME.so on
 * the search path. *out is malloc'ed. */
static mmrt_status resolve_plugin(const char *plugin, char **out, struct mmrt_error *err)
{
    size_t len = strlen(plugin);
    if (strchr(plugin, '/') || (len > 3 && strcmp(plugin + len - 3, ".so") == 0)) {
        *out = strdup(plugin);
        return *out ? MMRT_OK : mmrt_error_set(err, MMRT_ERR_NO_MEMORY, "out of host memory");
    }
    struct find f = {plugin, NULL};
    mmrt_status st = mmrt_plugin_foreach_file(find_cb, &f, err);
    if (st != MMRT_OK)
        return st;
    if (!f.path)
        return mmrt_error_set(err, MMRT_ERR_NOT_FOUND, "no plugin named '%s' (libmmrt_%s.so) "
                              "in $MMRT_PLUGIN_PATH, next to this program or in the install "
                              "directory", plugin, plugin);
    *out = f.path;
    return MMRT_OK;
}

static void restore_log(void *user, enum mmrt_log_level level, const char *plugin,
                        const char *message)
{
    (void)user;
    mmrt_log_line(level, plugin ? plugin : "plugin", message ? message : "");
}

/* Routes the plugin's log lines where the loader's host table does. Static: plugins may keep
 * the pointer. */
static const struct mmrt_host restore_host = {
    .hdr = MMRT_ABI_HEADER_INIT(struct mmrt_host),
    .user = NULL,
    .log = restore_log,
};

/* The entry point's versioning, through a second dlopen of the already loaded file. */
static void check_entry(struct chk *c, const struct mmrt_loaded_plugin *lp)
{
    struct chk_contract_result *r = &c->entry;
    r->name = "entry_versions";
    r->summary = "entry point accepts a newer host table (strict: refuses another major)";
    c->entry_checked = true;
    void *dl = dlopen(lp->path, RTLD_NOW | RTLD_LOCAL);
    mmrt_plugin_entry_fn entry = NULL;
    if (dl)
        *(void **)&entry = dlsym(dl, MMRT_PLUGIN_ENTRY_NAME);
    if (!entry) {
        r->verdict = CHK_ERROR;
        snprintf(r->detail, sizeof r->detail, "cannot reopen %s: %s", lp->path, dlerror());
    } else {
        struct mmrt_error err;
        mmrt_error_clear(&err);
        mmrt_status st = mmrt_contract_entry_versions(entry, lp->api.name, &restore_host,
                                                      c->strict ? MMRT_CONTRACT_STRICT : 0,
                                                      &err);
        r->verdict = st == MMRT_OK ? CHK_PASS : CHK_FAIL;
        snprintf(r->detail, sizeof r->detail, "%s", st == MMRT_OK ? "" : err.msg);
    }
    if (dl)
        dlclose(dl);
}

/* The device contract on a handle of its own, so the checks' arenas never meet the pool. */
static mmrt_status run_contract(struct chk *c, const struct mmrt_loaded_plugin *lp,
                                const struct args *a, struct mmrt_error *err)
{
    double t0 = now_s();
    char msg[512] = "";
    struct mmrt_device *dev = NULL;
    mmrt_status st = lp->api.device_open(a->device, a->options, a->n_options, &dev, msg,
                                         sizeof msg);
    if (st != MMRT_OK) {
        msg[sizeof msg - 1] = '\0';
        return mmrt_error_set(err, st, "%s: device_open(%d) failed: %s", lp->api.name, a->device,
                              msg[0] ? msg : mmrt_status_message(st));
    }
    struct mmrt_contract_target t = {&lp->api, dev, c->strict ? MMRT_CONTRACT_STRICT : 0};
    for (int i = 0; i < mmrt_contract_n_checks && c->n_contract < 16; i++) {
        struct chk_contract_result *r = &c->contract[c->n_contract++];
        struct mmrt_error cerr;
        mmrt_error_clear(&cerr);
        r->name = mmrt_contract_checks[i].name;
        r->summary = mmrt_contract_checks[i].summary;
        char what[96];
        snprintf(what, sizeof what, "device contract check %s", r->name);
        chk_watchdog_arm(c, what);
        st = mmrt_contract_checks[i].run(&t, &cerr);
        chk_watchdog_disarm(c);
        r->verdict = st == MMRT_OK                ? CHK_PASS
                     : st == MMRT_ERR_UNSUPPORTED ? CHK_SKIPPED
                     : st == MMRT_ERR_PLUGIN      ? CHK_FAIL
                                                  : CHK_ERROR;
        snprintf(r->detail, sizeof r->detail, "%s", st == MMRT_OK ? "" : cerr.msg);
    }
    lp->api.device_close(dev);
    c->contract_seconds = now_s() - t0;
    return MMRT_OK;
}

/* Opens a device with a pool of pool_mb, halving it while the device cannot hold it. */
static mmrt_status open_pooled(const char *name, struct mmrt_loaded_plugin *lp, int index,
                               uint64_t pool_mb, const struct args *a, struct mmrt_dev **out,
                               struct mmrt_error *err)
{
    const struct mmrt_option *opts = a ? a->options : NULL;
    int n_opts = a ? a->n_options : 0;
    for (;;) {
        mmrt_status st = mmrt_dev_open_plugin(name, lp, index, pool_mb << 20,
                                              MMRT_POOL_LEVEL1_DEFAULT, opts, n_opts, out, err);
        if (st != MMRT_ERR_OUT_OF_POOL || pool_mb / 2 < MIN_POOL_MB)
            return st;
        pool_mb /= 2;
    }
}

/* ---- main ---------------------------------------------------------------------------------- */

static int fail_exit(bool json, int code, const char *result, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static int fail_exit(bool json, int code, const char *result, const char *fmt, ...)
{
    char msg[MMRT_ERROR_MAX + 256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (json) {
        json_t *o = json_pack("{s:s, s:s}", "result", result,
                              code == CHK_EXIT_NO_DEVICE ? "reason" : "error", msg);
        if (o)
            json_dumpf(o, stdout, JSON_INDENT(2));
        printf("\n");
        json_decref(o);
    } else if (code == CHK_EXIT_NO_DEVICE) {
        printf("SKIPPED: %s\n", msg);
    } else {
        fprintf(stderr, "mmrt-plugin-check: %s\n", msg);
    }
    return code;
}

int main(int argc, char **argv)
{
    struct args a;
    int rc = parse_args(argc, argv, &a);
    if (rc)
        return rc < 0 ? CHK_EXIT_PASS : rc;
    const char *level = getenv("MMRT_LOG");
    if (level && *level)
        mmrt_set_log_sink(NULL, NULL, strcmp(level, "debug") == 0 ? MMRT_LOG_DEBUG
                                      : strcmp(level, "info") == 0 ? MMRT_LOG_INFO
                                      : strcmp(level, "error") == 0 ? MMRT_LOG_ERROR
                                                                    : MMRT_LOG_WARN);
    for (int op = 0; op < MMRT_OP_COUNT; op++)
        if (!chk_tolerance_for((enum mmrt_op)op, NULL))
            return fail_exit(a.json, CHK_EXIT_USAGE, "ERROR", "internal: no tolerance for %s",
                             mmrt_op_name((enum mmrt_op)op));

    struct chk c;
    memset(&c, 0, sizeof c);
    c.seed = a.seed;
    c.quick = a.quick;
    c.strict = a.strict;
    c.verbose = a.verbose;
    c.case_timeout_s = (unsigned)a.case_timeout;
    struct mmrt_error err;
    mmrt_error_clear(&err);
    if (select_ops(a.ops, c.op_selected, &err) != MMRT_OK)
        return fail_exit(a.json, CHK_EXIT_USAGE, "ERROR", "%s", err.msg);

    char *path = NULL;
    struct mmrt_loaded_plugin *put = NULL, *ref = NULL;
    int code = CHK_EXIT_USAGE;
    if (resolve_plugin(a.plugin, &path, &err) != MMRT_OK ||
        mmrt_plugin_load_file(path, &put, &err) != MMRT_OK) {
        code = fail_exit(a.json, CHK_EXIT_USAGE, "ERROR", "%s", err.msg);
        goto out;
    }
    c.plugin_path = put->path;
    if (put->n_devices == 0) {
        code = fail_exit(a.json, CHK_EXIT_NO_DEVICE, "skipped", "plugin %s has no device: %s",
                         put->api.name, put->skip_reason);
        goto out;
    }
    if (a.device >= put->n_devices) {
        code = fail_exit(a.json, CHK_EXIT_USAGE, "ERROR", "--device %d: plugin %s has %d "
                         "device%s", a.device, put->api.name, put->n_devices,
                         put->n_devices == 1 ? "" : "s");
        goto out;
    }
    if (mmrt_plugin_load("cpu", &ref, &err) != MMRT_OK) {
        code = fail_exit(a.json, CHK_EXIT_USAGE, "ERROR", "the reference plugin: %s", err.msg);
        goto out;
    }

    check_entry(&c, put);
    if (run_contract(&c, put, &a, &err) != MMRT_OK) {
        code = fail_exit(a.json, CHK_EXIT_USAGE, "ERROR", "%s", err.msg);
        goto out;
    }
    if (open_pooled("ref", ref, 0, a.pool_mb, NULL, &c.dev[0], &err) != MMRT_OK ||
        open_pooled("put", put, a.device, a.pool_mb, &a, &c.dev[1], &err) != MMRT_OK) {
        code = fail_exit(a.json, CHK_EXIT_USAGE, "ERROR", "%s", err.msg);
        goto out;
    }

    double t0 = now_s();
    for (int op = 0; op < MMRT_OP_COUNT; op++) {
        if (!c.op_selected[op] || !c.dev[1]->api->ops[op])
            continue;
        if (chk_run_op(&c, (enum mmrt_op)op, &err) != MMRT_OK) {
            code = fail_exit(a.json, CHK_EXIT_USAGE, "ERROR", "%s", err.msg);
            goto out;
        }
    }
    c.ops_seconds = now_s() - t0;

    if (a.json) {
        if (chk_print_json(&c, &err) != MMRT_OK) {
            code = fail_exit(false, CHK_EXIT_USAGE, "ERROR", "%s", err.msg);
            goto out;
        }
    } else {
        chk_print_text(&c);
    }
    enum chk_verdict v = chk_overall(&c);
    code = v == CHK_PASS ? CHK_EXIT_PASS : v == CHK_FAIL ? CHK_EXIT_FAIL : CHK_EXIT_USAGE;

out:
    mmrt_dev_close(c.dev[1]);
    mmrt_dev_close(c.dev[0]);
    mmrt_plugin_release(ref);
    mmrt_plugin_release(put);
    free(path);
    chk_free(&c);
    return code;
}
