/*
 * core/plugin_loader.c — dlopen, version checks and the process-wide plugin registry.
 *
 * Registry: a singly linked list of loaded plugins keyed by the real path of their file,
 * guarded by one mutex. Entries hold a reference count; the entry point and probe run once
 * per file, under the lock, so two runtimes starting together cannot initialise a plugin
 * twice. Refused plugins are dlclose()d without calling anything else in them: a struct of
 * another ABI major cannot be trusted to have shutdown where we expect it.
 */
#include "plugin_loader.h"

#include <assert.h>
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "log.h"

#ifndef MMRT_PLUGIN_INSTALL_DIR
#define MMRT_PLUGIN_INSTALL_DIR "/usr/local/lib/mmrt"
#endif
/* The plugin folder relative to the installed executables' folder ("../lib/mmrt"), so an
 * installed tree moved to another prefix (or installed with cmake --install --prefix) still
 * finds its plugins. */
#ifndef MMRT_PLUGIN_REL_DIR
#define MMRT_PLUGIN_REL_DIR "../lib/mmrt"
#endif

const char *mmrt_op_name(enum mmrt_op op)
{
    return mmrt_op_name_of((int)op);
}

static void host_log(void *user, enum mmrt_log_level level, const char *plugin,
                     const char *message)
{
    (void)user;
    mmrt_log_line(level, plugin ? plugin : "plugin", message ? message : "");
}

static const struct mmrt_host host_table = {
    .hdr = MMRT_ABI_HEADER_INIT(struct mmrt_host),
    .user = NULL,
    .log = host_log,
};

struct registry_entry {
    struct mmrt_loaded_plugin plugin;
    struct registry_entry *next;
};

static pthread_mutex_t registry_lock = PTHREAD_MUTEX_INITIALIZER;
static struct registry_entry *registry;

/* Validates the plugin struct and fills the zero-extended copies in lp. */
static mmrt_status adopt_plugin(const char *path, const struct mmrt_plugin *p,
                                struct mmrt_loaded_plugin *lp, struct mmrt_error *err)
{
    if (p->hdr.abi_major != MMRT_ABI_MAJOR)
        return mmrt_error_set(err, MMRT_ERR_PLUGIN,
                              "%s: plugin ABI %u.%u, this mmrt speaks ABI %d.%d "
                              "(the major versions must match)",
                              path, p->hdr.abi_major, p->hdr.abi_minor, MMRT_ABI_MAJOR,
                              MMRT_ABI_MINOR);
    if (p->hdr.struct_size < MMRT_PLUGIN_MIN_SIZE)
        return mmrt_error_set(err, MMRT_ERR_PLUGIN,
                              "%s: struct mmrt_plugin is %u bytes, shorter than the oldest "
                              "supported layout (%zu bytes)",
                              path, p->hdr.struct_size, (size_t)MMRT_PLUGIN_MIN_SIZE);
    size_t n = p->hdr.struct_size < sizeof lp->api ? p->hdr.struct_size : sizeof lp->api;
    memset(&lp->api, 0, sizeof lp->api);
    memcpy(&lp->api, p, n);

    const struct mmrt_plugin *a = &lp->api;
    const char *missing = !a->name               ? "name"
                          : !a->probe            ? "probe"
                          : !a->device_open      ? "device_open"
                          : !a->device_close     ? "device_close"
                          : !a->device_info      ? "device_info"
                          : !a->arena_alloc      ? "arena_alloc"
                          : !a->arena_free       ? "arena_free"
                          : !a->upload           ? "upload"
                          : !a->download         ? "download"
                          : !a->copy             ? "copy"
                          : !a->synchronize      ? "synchronize"
                          : !a->last_error       ? "last_error"
                          : (a->n_ops && !a->ops) ? "ops"
                                                 : NULL;
    if (missing)
        return mmrt_error_set(err, MMRT_ERR_PLUGIN, "%s: required member '%s' is NULL", path,
                              missing);
    int n_graph = !!a->capture_begin + !!a->capture_end + !!a->graph_launch + !!a->graph_destroy;
    if (n_graph != 0 && n_graph != 4)
        return mmrt_error_set(err, MMRT_ERR_PLUGIN,
                              "%s: graph capture members must be all set or all NULL", path);
    if (a->name[0] == '\0' || strlen(a->name) > MMRT_PLUGIN_NAME_MAX)
        return mmrt_error_set(err, MMRT_ERR_PLUGIN, "%s: plugin name is empty or too long",
                              path);
    memset(lp->ops, 0, sizeof lp->ops);
    uint32_t n_ops = a->n_ops < MMRT_OP_COUNT ? a->n_ops : MMRT_OP_COUNT;
    for (uint32_t i = 0; i < n_ops; i++)
        lp->ops[i] = a->ops[i];
    /* Everything after this reads the host's copy, so point ops at it. */
    lp->api.ops = lp->ops;
    lp->api.n_ops = MMRT_OP_COUNT;
    return MMRT_OK;
}

static void probe_plugin(struct mmrt_loaded_plugin *lp)
{
    int n = 0;
    char why[sizeof lp->skip_reason] = "";
    mmrt_status st = lp->api.probe(&n, why, sizeof why);
    why[sizeof why - 1] = '\0';
    if (st != MMRT_OK || n <= 0) {
        lp->n_devices = 0;
        snprintf(lp->skip_reason, sizeof lp->skip_reason, "%s",
                 why[0] ? why : st != MMRT_OK ? mmrt_status_message(st) : "no device");
        mmrt_log(MMRT_LOG_INFO, "loader", "%s: skipped: %s", lp->path, lp->skip_reason);
        return;
    }
    lp->n_devices = n;
}

mmrt_status mmrt_plugin_load_file(const char *path, struct mmrt_loaded_plugin **out,
                                  struct mmrt_error *err)
{
    mmrt_status st = MMRT_OK;
    struct registry_entry *e = NULL;
    void *dl = NULL;
    char *real = NULL;

    pthread_mutex_lock(&registry_lock);
    real = realpath(path, NULL);
    if (!real) {
        st = mmrt_error_set(err, errno == ENOMEM ? MMRT_ERR_NO_MEMORY : MMRT_ERR_NOT_FOUND,
                            "%s: %s", path, strerror(errno));
        goto fail;
    }
    for (e = registry; e; e = e->next) {
        if (strcmp(e->plugin.path, real) == 0) {
            e->plugin.refcount++;
            free(real);
            *out = &e->plugin;
            pthread_mutex_unlock(&registry_lock);
            return MMRT_OK;
        }
    }
    e = calloc(1, sizeof *e);
    if (!e) {
        st = mmrt_error_set(err, MMRT_ERR_NO_MEMORY, "%s: out of memory", path);
        goto fail;
    }
    dl = dlopen(real, RTLD_NOW | RTLD_LOCAL);
    if (!dl) {
        const char *why = dlerror();
        st = mmrt_error_set(err, MMRT_ERR_PLUGIN, "%s: cannot load: %s", path,
                            why ? why : "unknown dlopen error");
        goto fail;
    }
    mmrt_plugin_entry_fn entry;
    void *sym = dlsym(dl, MMRT_PLUGIN_ENTRY_NAME);
    if (!sym) {
        st = mmrt_error_set(err, MMRT_ERR_PLUGIN,
                            "%s: missing entry symbol %s (not an mmrt plugin?)", path,
                            MMRT_PLUGIN_ENTRY_NAME);
        goto fail;
    }
    memcpy(&entry, &sym, sizeof entry);
    const struct mmrt_plugin *p = entry(&host_table);
    if (!p) {
        st = mmrt_error_set(err, MMRT_ERR_PLUGIN,
                            "%s: %s returned NULL (the plugin logged why)", path,
                            MMRT_PLUGIN_ENTRY_NAME);
        goto fail;
    }
    st = adopt_plugin(path, p, &e->plugin, err);
    if (st != MMRT_OK)
        goto fail;
    e->plugin.path = real;
    e->plugin.dl = dl;
    e->plugin.refcount = 1;
    probe_plugin(&e->plugin);
    e->next = registry;
    registry = e;
    *out = &e->plugin;
    pthread_mutex_unlock(&registry_lock);
    return MMRT_OK;

fail:
    if (dl)
        dlclose(dl);
    free(e);
    free(real);
    pthread_mutex_unlock(&registry_lock);
    return st;
}

void mmrt_plugin_retain(struct mmrt_loaded_plugin *plugin)
{
    pthread_mutex_lock(&registry_lock);
    plugin->refcount++;
    pthread_mutex_unlock(&registry_lock);
}

void mmrt_plugin_release(struct mmrt_loaded_plugin *plugin)
{
    if (!plugin)
        return;
    pthread_mutex_lock(&registry_lock);
    struct registry_entry **link = &registry;
    while (*link && &(*link)->plugin != plugin)
        link = &(*link)->next;
    assert(*link && "releasing a plugin the registry does not hold");
    struct registry_entry *e = *link;
    if (e && --e->plugin.refcount == 0) {
        *link = e->next;
        if (e->plugin.api.shutdown)
            e->plugin.api.shutdown();
        dlclose(e->plugin.dl);
        free(e->plugin.path);
        free(e);
    }
    pthread_mutex_unlock(&registry_lock);
}

struct dir_list {
    char **dirs; /* NULL-terminated */
    size_t n, cap;
};

static int dir_list_add(struct dir_list *l, const char *start, size_t len)
{
    if (len == 0)
        return 1;
    if (l->n + 2 > l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 8;
        char **grown = realloc(l->dirs, cap * sizeof *grown);
        if (!grown)
            return 0;
        l->dirs = grown;
        l->cap = cap;
    }
    if (!(l->dirs[l->n] = strndup(start, len)))
        return 0;
    l->dirs[++l->n] = NULL;
    return 1;
}

static void free_dirs(char **dirs);

/* The search directories, in order, as one NULL-terminated array of malloc'ed strings. */
static mmrt_status search_dirs(char ***out, struct mmrt_error *err)
{
    struct dir_list l = { 0 };
    int ok = 1;
    const char *env = getenv("MMRT_PLUGIN_PATH");
    for (const char *p = env ? env : ""; ok && *p;) {
        const char *end = strchr(p, ':');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        ok = dir_list_add(&l, p, len);
        p += len + (end ? 1 : 0);
    }
    char exe[PATH_MAX];
    ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (ok && len > 0) {
        exe[len] = '\0';
        char *slash = strrchr(exe, '/');
        if (slash) {
            ok = dir_list_add(&l, exe, (size_t)(slash - exe));
            char rel[PATH_MAX + sizeof MMRT_PLUGIN_REL_DIR + 1];
            int n = snprintf(rel, sizeof rel, "%.*s/%s", (int)(slash - exe), exe,
                             MMRT_PLUGIN_REL_DIR);
            if (ok && n > 0 && (size_t)n < sizeof rel)
                ok = dir_list_add(&l, rel, (size_t)n);
        }
    }
    /* <the folder of libmmrt.so>/mmrt, for a program that embeds an installed libmmrt from
     * any prefix; only when this code runs from a shared library (a program linked with the
     * static core has its own folder above). */
    static const char anchor = 0; /* any object of this library, for dladdr */
    Dl_info info;
    const char *slash;
    if (ok && dladdr(&anchor, &info) && info.dli_fname &&
        (slash = strrchr(info.dli_fname, '/')) && strstr(slash, ".so")) {
        char lib[PATH_MAX + 8];
        int n = snprintf(lib, sizeof lib, "%.*s/mmrt", (int)(slash - info.dli_fname),
                         info.dli_fname);
        if (n > 0 && (size_t)n < sizeof lib)
            ok = dir_list_add(&l, lib, (size_t)n);
    }
    /* Always added, so the array exists whatever the environment says. */
    if (ok)
        ok = dir_list_add(&l, MMRT_PLUGIN_INSTALL_DIR, strlen(MMRT_PLUGIN_INSTALL_DIR));
    if (!ok) {
        free_dirs(l.dirs);
        return mmrt_error_set(err, MMRT_ERR_NO_MEMORY, "plugin search path: out of memory");
    }
    *out = l.dirs;
    return MMRT_OK;
}

static void free_dirs(char **dirs)
{
    if (!dirs)
        return;
    for (char **d = dirs; *d; d++)
        free(*d);
    free(dirs);
}

static int valid_name(const char *name)
{
    size_t n = strlen(name);
    if (n == 0 || n > MMRT_PLUGIN_NAME_MAX)
        return 0;
    for (size_t i = 0; i < n; i++)
        if (!((name[i] >= 'a' && name[i] <= 'z') || (name[i] >= '0' && name[i] <= '9') ||
              name[i] == '_'))
            return 0;
    return 1;
}

mmrt_status mmrt_plugin_load(const char *name, struct mmrt_loaded_plugin **out,
                             struct mmrt_error *err)
{
    if (!name || !valid_name(name))
        return mmrt_error_set(err, MMRT_ERR_INVALID_ARG,
                              "plugin name '%s' is invalid (use a-z, 0-9 and _, at most %d "
                              "characters)", name ? name : "(null)", MMRT_PLUGIN_NAME_MAX);
    char **dirs = NULL;
    mmrt_status st = search_dirs(&dirs, err);
    if (st != MMRT_OK)
        return st;
    char searched[768] = "";
    size_t used = 0;
    st = MMRT_ERR_NOT_FOUND;
    for (char **d = dirs; *d; d++) {
        char path[PATH_MAX];
        int len = snprintf(path, sizeof path, "%s/libmmrt_%s.so", *d, name);
        if (len < 0 || (size_t)len >= sizeof path)
            continue;
        if (access(path, F_OK) == 0) {
            st = mmrt_plugin_load_file(path, out, err);
            break;
        }
        int w = snprintf(searched + used, sizeof searched - used, "%s%s", used ? ", " : "", *d);
        if (w > 0 && used + (size_t)w < sizeof searched)
            used += (size_t)w;
    }
    if (st == MMRT_ERR_NOT_FOUND)
        mmrt_error_set(err, st, "plugin '%s': libmmrt_%s.so not found (searched %s)", name,
                       name, searched[0] ? searched : "nothing");
    free_dirs(dirs);
    return st;
}

static int name_cmp(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

mmrt_status mmrt_plugin_foreach_file(int (*fn)(void *user, const char *name, const char *path),
                                     void *user, struct mmrt_error *err)
{
    char **dirs = NULL;
    mmrt_status st = search_dirs(&dirs, err);
    if (st != MMRT_OK)
        return st;
    /* Names already reported: a plugin earlier in the search order hides later copies. */
    char *seen[64];
    size_t n_seen = 0;
    int stop = 0;
    for (char **d = dirs; *d && !stop; d++) {
        DIR *dir = opendir(*d);
        if (!dir)
            continue;
        char *names[64];
        size_t n_names = 0;
        struct dirent *de;
        while ((de = readdir(dir)) && n_names < 64) {
            const char *f = de->d_name;
            size_t len = strlen(f);
            if (len <= 10 || strncmp(f, "libmmrt_", 8) != 0 || strcmp(f + len - 3, ".so") != 0)
                continue;
            char name[MMRT_PLUGIN_NAME_MAX + 1];
            size_t nlen = len - 8 - 3;
            if (nlen > MMRT_PLUGIN_NAME_MAX)
                continue;
            memcpy(name, f + 8, nlen);
            name[nlen] = '\0';
            if (!valid_name(name))
                continue;
            names[n_names] = strdup(name);
            if (!names[n_names]) {
                st = mmrt_error_set(err, MMRT_ERR_NO_MEMORY, "listing plugins: out of memory");
                break;
            }
            n_names++;
        }
        closedir(dir);
        qsort(names, n_names, sizeof names[0], name_cmp);
        for (size_t i = 0; i < n_names; i++) {
            int dup = 0;
            for (size_t j = 0; j < n_seen; j++)
                dup |= strcmp(seen[j], names[i]) == 0;
            if (!dup && !stop && st == MMRT_OK) {
                char path[PATH_MAX];
                snprintf(path, sizeof path, "%s/libmmrt_%s.so", *d, names[i]);
                stop = fn(user, names[i], path);
            }
            if (!dup && n_seen < 64)
                seen[n_seen++] = names[i];
            else
                free(names[i]);
        }
        if (st != MMRT_OK)
            break;
    }
    for (size_t j = 0; j < n_seen; j++)
        free(seen[j]);
    free_dirs(dirs);
    return st;
}
