/*
 * plugins/cpu/cpu_graph.c — graph capture and replay on the CPU device (option `graph = 1`).
 *
 * A CPU gains no speed from graphs; the point is that the reference plugin can run the same
 * captured decode step as the CUDA plugin, so CI proves on any machine that a model's graph
 * stays valid across replays: every value a step changes must reach the kernels through
 * device memory written before the launch, never through arguments baked in at capture.
 * A model that broke that rule would replay stale positions here and fail the golden tests.
 *
 * Semantics follow the CUDA plugin (plugins/cuda/cuda_plugin.c) so both behave alike:
 *   kernels    recorded with copies of their descriptors and params, run at each launch
 *   upload     recorded with a copy of the bytes as they are now; a replay rewrites them
 *   copy       recorded
 *   download, synchronize, graph_launch   refused while capturing (they need results)
 * The first failure while capturing is kept; capture_end then discards the recording and
 * returns that status with its reason, and the core runs the step eagerly.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_internal.h"

enum node_kind { NODE_KERNEL, NODE_UPLOAD, NODE_COPY };

struct cpu_graph_node {
    enum node_kind kind;
    /* NODE_KERNEL: a self-contained copy of the launch */
    struct mmrt_op_args args;
    struct mmrt_tensor src[MMRT_MAX_SRC_ALL], dst;
    void *params;
    /* NODE_UPLOAD / NODE_COPY */
    void *arena, *src_arena;
    uint64_t offset, src_offset, nbytes;
    void *bytes; /* NODE_UPLOAD: owned copy of the host data */
};

struct cpu_graph {
    struct cpu_graph_node *nodes;
    size_t n, cap;
};

static void graph_free(struct cpu_graph *g)
{
    if (!g)
        return;
    for (size_t i = 0; i < g->n; i++) {
        free(g->nodes[i].params);
        free(g->nodes[i].bytes);
    }
    free(g->nodes);
    free(g);
}

/* Keeps the first failure of a capture; later calls report it again. */
static mmrt_status capture_fail(struct mmrt_device *dev, mmrt_status st)
{
    if (!dev->capture_failed) {
        dev->capture_failed = true;
        dev->capture_status = st;
        snprintf(dev->capture_why, sizeof dev->capture_why, "%s", dev->err);
    }
    return st;
}

static struct cpu_graph_node *new_node(struct mmrt_device *dev)
{
    struct cpu_graph *g = dev->recording;
    if (g->n == g->cap) {
        size_t cap = g->cap ? 2 * g->cap : 64;
        struct cpu_graph_node *p = realloc(g->nodes, cap * sizeof *p);
        if (!p) {
            capture_fail(dev, cpu_fail(dev, MMRT_ERR_NO_MEMORY,
                                       "graph capture: out of host memory at node %zu", g->n));
            return NULL;
        }
        g->nodes = p;
        g->cap = cap;
    }
    struct cpu_graph_node *n = &g->nodes[g->n];
    memset(n, 0, sizeof *n);
    return n;
}

mmrt_status cpu_capture_begin(struct mmrt_device *dev)
{
    if (!dev)
        return MMRT_ERR_INVALID_ARG;
    if (!dev->graph_enabled)
        return cpu_fail(dev, MMRT_ERR_UNSUPPORTED,
                        "graph capture is off on this device (device option graph = 1 turns "
                        "it on)");
    if (dev->recording)
        return cpu_fail(dev, MMRT_ERR_INVALID_ARG, "capture_begin: a capture is already open");
    dev->recording = calloc(1, sizeof *dev->recording);
    if (!dev->recording)
        return cpu_fail(dev, MMRT_ERR_NO_MEMORY, "capture_begin: out of host memory");
    dev->capture_failed = false;
    dev->capture_status = MMRT_OK;
    dev->capture_why[0] = '\0';
    return MMRT_OK;
}

mmrt_status cpu_capture_end(struct mmrt_device *dev, void **graph)
{
    if (!dev || !graph)
        return MMRT_ERR_INVALID_ARG;
    *graph = NULL;
    struct cpu_graph *g = dev->recording;
    if (!g)
        return cpu_fail(dev, MMRT_ERR_INVALID_ARG, "capture_end: no capture is open");
    dev->recording = NULL;
    if (dev->capture_failed) {
        graph_free(g);
        dev->capture_failed = false;
        return cpu_fail(dev, dev->capture_status, "graph capture failed: %s", dev->capture_why);
    }
    *graph = g;
    return MMRT_OK;
}

bool cpu_capturing(const struct mmrt_device *dev)
{
    return dev->recording != NULL;
}

mmrt_status cpu_capture_refuse(struct mmrt_device *dev, const char *what)
{
    return capture_fail(dev, cpu_fail(dev, MMRT_ERR_INVALID_ARG,
                                      "%s during graph capture: the device records instead of "
                                      "running, so there is no result to wait for", what));
}

static mmrt_status capture_kernel(struct mmrt_device *dev, const struct mmrt_op_args *args)
{
    if (dev->capture_failed)
        return dev->capture_status;
    struct cpu_graph_node *n = new_node(dev);
    if (!n)
        return dev->capture_status;
    n->kind = NODE_KERNEL;
    /* cpu_op_begin checked the header: at least ABI 1.0's members, n_src within them. */
    memset(&n->args, 0, sizeof n->args);
    memcpy(&n->args, args, args->hdr.struct_size < sizeof n->args ? args->hdr.struct_size
                                                                    : sizeof n->args);
    n->args.hdr.struct_size = (uint32_t)sizeof n->args;
    for (int i = 0; i < args->n_src && i < MMRT_MAX_SRC_ALL; i++) {
        const struct mmrt_tensor *t = mmrt_op_args_src(args, i);
        if (!t)
            continue;
        n->src[i] = *t;
        if (i < MMRT_MAX_SRC)
            n->args.src[i] = &n->src[i];
        else
            n->args.src_ext[i - MMRT_MAX_SRC] = &n->src[i];
    }
    n->dst = *args->dst;
    n->args.dst = &n->dst;
    if (args->params && args->params_size) {
        n->params = malloc(args->params_size);
        if (!n->params)
            return capture_fail(dev, cpu_fail(dev, MMRT_ERR_NO_MEMORY,
                                              "graph capture: out of host memory"));
        memcpy(n->params, args->params, args->params_size);
        n->args.params = n->params;
    } else {
        n->args.params = NULL;
        n->args.params_size = 0;
    }
    dev->recording->n++;
    return MMRT_OK;
}

mmrt_status cpu_capture_upload(struct mmrt_device *dev, void *arena, uint64_t offset,
                               const void *src, uint64_t nbytes)
{
    if (dev->capture_failed)
        return dev->capture_status;
    struct cpu_graph_node *n = new_node(dev);
    if (!n)
        return dev->capture_status;
    n->kind = NODE_UPLOAD;
    n->arena = arena;
    n->offset = offset;
    n->nbytes = nbytes;
    if (nbytes) {
        n->bytes = malloc(nbytes);
        if (!n->bytes)
            return capture_fail(dev, cpu_fail(dev, MMRT_ERR_NO_MEMORY,
                                              "upload during capture: out of host memory for "
                                              "%" PRIu64 " bytes", nbytes));
        memcpy(n->bytes, src, nbytes);
    }
    dev->recording->n++;
    return MMRT_OK;
}

mmrt_status cpu_capture_copy(struct mmrt_device *dev, void *dst_arena, uint64_t dst_offset,
                             void *src_arena, uint64_t src_offset, uint64_t nbytes)
{
    if (dev->capture_failed)
        return dev->capture_status;
    struct cpu_graph_node *n = new_node(dev);
    if (!n)
        return dev->capture_status;
    n->kind = NODE_COPY;
    n->arena = dst_arena;
    n->offset = dst_offset;
    n->src_arena = src_arena;
    n->src_offset = src_offset;
    n->nbytes = nbytes;
    dev->recording->n++;
    return MMRT_OK;
}

/* Host address of [offset, offset + nbytes) in an arena that must still exist: a graph
 * outliving one of its arenas is an error at launch, never a read of freed memory. */
static mmrt_status replay_range(struct mmrt_device *dev, size_t node, void *arena,
                                uint64_t offset, uint64_t nbytes, char **out)
{
    struct cpu_arena *a = arena ? cpu_arena_find(dev, arena) : NULL;
    if (!a || offset > a->nbytes || nbytes > a->nbytes - offset)
        return cpu_fail(dev, MMRT_ERR_INVALID_ARG,
                        "graph node %zu: bytes [%" PRIu64 ", +%" PRIu64 ") are not inside a "
                        "live arena (was an arena freed after the capture?)", node, offset,
                        nbytes);
    *out = cpu_arena_data(a) + offset;
    return MMRT_OK;
}

mmrt_status cpu_graph_launch(struct mmrt_device *dev, void *graph)
{
    if (!dev || !graph)
        return MMRT_ERR_INVALID_ARG;
    if (dev->recording)
        return cpu_capture_refuse(dev, "graph_launch");
    const struct cpu_graph *g = graph;
    for (size_t i = 0; i < g->n; i++) {
        const struct cpu_graph_node *n = &g->nodes[i];
        mmrt_status st = MMRT_OK;
        char *d = NULL, *s = NULL;
        switch (n->kind) {
        case NODE_KERNEL: {
            /* the kernels check every descriptor again, arenas included */
            st = cpu_kernel_table[n->args.op](dev, &n->args);
            if (st != MMRT_OK) {
                char why[CPU_ERR_MAX];
                snprintf(why, sizeof why, "%s", dev->err);
                return cpu_fail(dev, st, "graph node %zu (operator %d): %.900s", i,
                                (int)n->args.op, why);
            }
            break;
        }
        case NODE_UPLOAD:
            st = replay_range(dev, i, n->arena, n->offset, n->nbytes, &d);
            if (st == MMRT_OK && n->nbytes)
                memcpy(d, n->bytes, n->nbytes);
            break;
        case NODE_COPY:
            st = replay_range(dev, i, n->arena, n->offset, n->nbytes, &d);
            if (st == MMRT_OK)
                st = replay_range(dev, i, n->src_arena, n->src_offset, n->nbytes, &s);
            if (st == MMRT_OK && n->nbytes)
                memmove(d, s, n->nbytes);
            break;
        }
        if (st != MMRT_OK)
            return st;
    }
    return MMRT_OK;
}

void cpu_graph_destroy(struct mmrt_device *dev, void *graph)
{
    (void)dev;
    graph_free(graph);
}

void cpu_capture_abandon(struct mmrt_device *dev)
{
    graph_free(dev->recording);
    dev->recording = NULL;
}

mmrt_status cpu_dispatch(struct mmrt_device *dev, const struct mmrt_op_args *args, int slot)
{
    if (!dev)
        return MMRT_ERR_INVALID_ARG;
    if (!dev->recording)
        return cpu_kernel_table[slot](dev, args); /* the kernel checks args->op == slot */
    if (dev->capture_failed)
        return dev->capture_status;
    /* Check now what can be checked without running: the header, the op, every descriptor
     * against its arena; the kernel checks the rest again at each launch. */
    struct cpu_op o;
    mmrt_status st = cpu_op_begin(dev, args, slot, 0, MMRT_MAX_SRC_ALL, &o);
    if (st != MMRT_OK)
        return capture_fail(dev, st);
    return capture_kernel(dev, args);
}
