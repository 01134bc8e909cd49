/*
 * tools/plugin_check/check.h — the pieces of mmrt-plugin-check and how they fit.
 *
 *   main.c        command line, loading the two plugins, opening the devices, exit status
 *   contract.c    the device contract (contract.h; shared with the device tests)
 *   kase.c        one operator case on both devices: tensors and views allocated twice,
 *                 identical inputs uploaded to both, the op launched through core/ops.h on
 *                 each, outputs downloaded and compared
 *   grid.c        the shapes, dtypes and layouts tried for every operator
 *   tolerance.c   the per-operator-and-dtype tolerance table, with the reason for each value
 *   report.c      rows of results, the text table and the JSON object
 *
 * Device 0 is always the CPU reference plugin ("cpu", loaded by name through the loader like
 * every plugin), device 1 the plugin under test. Both run every case from the same host bytes;
 * the reference's output is the expected value. Where plugin.h fixes the bits outright (an I8
 * store's codes and scales, GATHER_HEADS from one), the reference is held to the checker's own
 * model of the header too (kase_expect), so a reference that drifts reads as ERROR.
 *
 * Error metric (the project's): per case, max |got − ref| / max |ref| over the output
 * elements (NaN must meet NaN; when max |ref| is 0 the absolute error is used). Operators
 * that only move data (COPY, CONCAT, GET_ROWS, SET_ROWS) and ARGMAX must match bit for bit.
 * Output bytes a strided dst view does not cover must be left exactly as they were.
 */
#ifndef MMRT_PLUGIN_CHECK_CHECK_H
#define MMRT_PLUGIN_CHECK_CHECK_H

#include <stdbool.h>
#include <stdint.h>

#include "device.h"
#include "error.h"
#include "mmrt/plugin.h"

/* Exit statuses (documented in docs/PLUGINS.md and --help). */
enum {
    CHK_EXIT_PASS = 0,
    CHK_EXIT_FAIL = 1,    /* some operator or contract check failed */
    CHK_EXIT_USAGE = 2,   /* bad arguments, plugin refused or not found, reference broken */
    CHK_EXIT_NO_DEVICE = 77, /* the plugin loaded but has no device: skipped (ctest's
                                SKIP_RETURN_CODE) */
};

/* ---- tolerances (tolerance.c) ------------------------------------------------------------ */

struct chk_tolerance {
    enum mmrt_op op;
    const char *dtype;  /* row label it applies to, or NULL for every dtype of the op */
    double tol;         /* max |got − ref| / max |ref|; 0 = bit-exact */
    const char *reason; /* why this value, one sentence */
};

/* The entry for (op, dtype label): an exact match first, then the op's NULL entry. Never
 * NULL for an op below MMRT_OP_COUNT (every op has an entry; main.c checks at start-up). */
const struct chk_tolerance *chk_tolerance_for(enum mmrt_op op, const char *dtype);

/* The whole table, for the report (--tolerances prints it). */
const struct chk_tolerance *chk_tolerance_table(int *n);

/* ---- results (report.c) -------------------------------------------------------------------- */

enum chk_verdict {
    CHK_PASS = 0,
    CHK_SKIPPED, /* the case did not fit the device pool; not a failure */
    CHK_REFUSED, /* the kernel returned MMRT_ERR_UNSUPPORTED (allowed by plugin.h) */
    CHK_FAIL,    /* wrong values, a write outside dst, or any other kernel error */
    CHK_ERROR,   /* the checker or the reference failed: not the plugin's fault */
};

const char *chk_verdict_name(enum chk_verdict v);

/* One operator case as run. */
struct chk_case {
    int row;                /* index into chk.rows */
    char desc[192];         /* shapes and layout, e.g. "M=7 K=257 N=33 bias=F16" */
    enum chk_verdict verdict;
    double rel_err;         /* the metric; -1 when nothing was compared */
    int64_t n_mismatch;     /* exact rows: elements that differ */
    char detail[384];       /* why it failed / was refused / skipped; "" on a pass */
    double seconds;         /* wall time on both devices, transfers included */
};

/* One line of the table: an operator with one dtype label. */
struct chk_row {
    enum mmrt_op op;
    char dtype[24];         /* "F32", "F16", "F32→BF16", … (what the tolerance is keyed by) */
    const struct chk_tolerance *tol;
    int n_cases;            /* cases compared (pass or fail) */
    int n_failed, n_refused, n_skipped, n_errors;
    double worst;           /* worst rel_err over the compared cases; -1 when none */
    int worst_case;         /* index into chk.cases, -1 when none */
    double seconds;         /* wall time of its cases on both devices */
};

struct chk_contract_result {
    const char *name, *summary;
    enum chk_verdict verdict; /* PASS, FAIL, or SKIPPED for "does not apply" */
    char detail[MMRT_ERROR_MAX];
};

/* Everything one run knows. */
struct chk {
    /* set up by main.c */
    struct mmrt_dev *dev[2];      /* [0] reference (cpu), [1] under test */
    const char *plugin_path;
    uint64_t seed;
    bool quick, verbose, strict;
    unsigned case_timeout_s;      /* per case, 0 = none (see kase.h, "Watchdog") */
    bool op_selected[MMRT_OP_COUNT];
    /* results */
    struct chk_row *rows;
    int n_rows, cap_rows;
    struct chk_case *cases;
    int n_cases, cap_cases;
    struct chk_contract_result contract[16];
    int n_contract;
    bool entry_checked;
    struct chk_contract_result entry; /* entry-point versioning */
    double contract_seconds, ops_seconds;
};

/* The row for (op, dtype), created on first use. Returns its index, or -1 (out of memory,
 * message in err). */
int chk_row_get(struct chk *c, enum mmrt_op op, const char *dtype, struct mmrt_error *err);

/* Appends a case to row `row` and folds it into the row. MMRT_ERR_NO_MEMORY on failure. */
mmrt_status chk_add_case(struct chk *c, const struct chk_case *kc, struct mmrt_error *err);

/* Overall verdict: CHK_FAIL when any row, contract check or the entry check failed,
 * CHK_ERROR when the checker itself failed somewhere, else CHK_PASS. */
enum chk_verdict chk_overall(const struct chk *c);

/* Prints the human table to stdout. */
void chk_print_text(const struct chk *c);

/* Prints the same as one JSON object (jansson) to stdout. MMRT_ERR_NO_MEMORY on failure. */
mmrt_status chk_print_json(const struct chk *c, struct mmrt_error *err);

void chk_free(struct chk *c);

/* ---- the watchdog (kase.c) ------------------------------------------------------------------ */

/* With c->case_timeout_s set: if chk_watchdog_disarm does not follow within that many
 * seconds, prints "FAIL: <what>: did not finish …" to stderr and exits with CHK_EXIT_FAIL
 * (a kernel or transfer that never returns cannot be cancelled). One at a time. */
void chk_watchdog_arm(const struct chk *c, const char *what);
void chk_watchdog_disarm(const struct chk *c);

/* ---- the grid (grid.c) --------------------------------------------------------------------- */

/* Runs every case of `op` (the plugin under test claims it). A case's failure is a result,
 * not an error: the return is MMRT_OK unless the checker itself cannot go on (host memory). */
mmrt_status chk_run_op(struct chk *c, enum mmrt_op op, struct mmrt_error *err);

#endif
