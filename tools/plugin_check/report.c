/*
 * tools/plugin_check/report.c — result rows, the text table and the JSON object.
 *
 * Rows are kept in the order they were first used (the grid runs op by op, dtypes F32, F16,
 * BF16, …), cases in the order they ran. A row's verdict: FAIL when any case failed, ERROR when
 * the checker or reference failed on one, otherwise PASS when at least one case compared,
 * else REFUSED (the kernel refused every case) or SKIPPED (none fitted the pool).
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"

const char *chk_verdict_name(enum chk_verdict v)
{
    switch (v) {
    case CHK_PASS: return "pass";
    case CHK_SKIPPED: return "skipped";
    case CHK_REFUSED: return "refused";
    case CHK_FAIL: return "FAIL";
    case CHK_ERROR: return "ERROR";
    }
    return "?";
}

int chk_row_get(struct chk *c, enum mmrt_op op, const char *dtype, struct mmrt_error *err)
{
    for (int i = 0; i < c->n_rows; i++)
        if (c->rows[i].op == op && strcmp(c->rows[i].dtype, dtype) == 0)
            return i;
    if (c->n_rows == c->cap_rows) {
        int cap = c->cap_rows ? 2 * c->cap_rows : 32;
        struct chk_row *r = realloc(c->rows, (size_t)cap * sizeof *r);
        if (!r) {
            mmrt_error_set(err, MMRT_ERR_NO_MEMORY, "out of host memory (report rows)");
            return -1;
        }
        c->rows = r;
        c->cap_rows = cap;
    }
    struct chk_row *r = &c->rows[c->n_rows];
    memset(r, 0, sizeof *r);
    r->op = op;
    snprintf(r->dtype, sizeof r->dtype, "%s", dtype);
    r->tol = chk_tolerance_for(op, dtype);
    r->worst = -1;
    r->worst_case = -1;
    return c->n_rows++;
}

mmrt_status chk_add_case(struct chk *c, const struct chk_case *kc, struct mmrt_error *err)
{
    if (c->n_cases == c->cap_cases) {
        int cap = c->cap_cases ? 2 * c->cap_cases : 256;
        struct chk_case *p = realloc(c->cases, (size_t)cap * sizeof *p);
        if (!p)
            return mmrt_error_set(err, MMRT_ERR_NO_MEMORY, "out of host memory (report cases)");
        c->cases = p;
        c->cap_cases = cap;
    }
    c->cases[c->n_cases] = *kc;
    struct chk_row *r = &c->rows[kc->row];
    r->seconds += kc->seconds;
    switch (kc->verdict) {
    case CHK_PASS:
    case CHK_FAIL:
        r->n_cases++;
        r->n_failed += kc->verdict == CHK_FAIL;
        if (kc->rel_err > r->worst) {
            r->worst = kc->rel_err;
            r->worst_case = c->n_cases;
        }
        break;
    case CHK_REFUSED: r->n_refused++; break;
    case CHK_SKIPPED: r->n_skipped++; break;
    case CHK_ERROR: r->n_errors++; break;
    }
    c->n_cases++;
    return MMRT_OK;
}

static enum chk_verdict row_verdict(const struct chk_row *r)
{
    if (r->n_failed)
        return CHK_FAIL;
    if (r->n_errors)
        return CHK_ERROR;
    if (r->n_cases)
        return CHK_PASS;
    return r->n_refused ? CHK_REFUSED : CHK_SKIPPED;
}

enum chk_verdict chk_overall(const struct chk *c)
{
    bool error = false;
    for (int i = 0; i < c->n_rows; i++) {
        enum chk_verdict v = row_verdict(&c->rows[i]);
        if (v == CHK_FAIL)
            return CHK_FAIL;
        error |= v == CHK_ERROR;
    }
    for (int i = 0; i < c->n_contract; i++) {
        if (c->contract[i].verdict == CHK_FAIL)
            return CHK_FAIL;
        error |= c->contract[i].verdict == CHK_ERROR;
    }
    if (c->entry_checked && c->entry.verdict == CHK_FAIL)
        return CHK_FAIL;
    error |= c->entry_checked && c->entry.verdict == CHK_ERROR;
    return error ? CHK_ERROR : CHK_PASS;
}

void chk_free(struct chk *c)
{
    free(c->rows);
    free(c->cases);
    c->rows = NULL;
    c->cases = NULL;
    c->n_rows = c->n_cases = c->cap_rows = c->cap_cases = 0;
}

/* ---- text ------------------------------------------------------------------------------------ */

static void print_device(const char *role, const struct mmrt_dev *d, const char *path)
{
    printf("%-18s %s %s%s%s%s\n", role, d->api->name, d->api->version ? d->api->version : "?",
           path ? " (" : "", path ? path : "", path ? ")" : "");
    printf("%-18s device %d: %s (%s), %.1f GiB\n", "", d->index, d->info.name, d->info.kind,
           (double)d->info.total_bytes / (1024.0 * 1024.0 * 1024.0));
}

static void print_contract_line(const struct chk_contract_result *r)
{
    const char *v = r->verdict == CHK_SKIPPED ? "n/a" : chk_verdict_name(r->verdict);
    printf("  %-17s %-5s %s\n", r->name, v, r->detail[0] ? r->detail : r->summary);
}

/* Lists the cases of one verdict, at most `cap` per row unless verbose. */
static void print_cases_with(const struct chk *c, enum chk_verdict v, const char *title,
                             int cap)
{
    bool any = false;
    for (int ri = 0; ri < c->n_rows; ri++) {
        int shown = 0, more = 0;
        for (int i = 0; i < c->n_cases; i++) {
            const struct chk_case *kc = &c->cases[i];
            if (kc->row != ri || kc->verdict != v)
                continue;
            if (!c->verbose && shown == cap) {
                more++;
                continue;
            }
            if (!any)
                printf("\n%s\n", title);
            any = true;
            shown++;
            printf("  %s %s: %s: %s\n", mmrt_op_name(c->rows[ri].op), c->rows[ri].dtype,
                   kc->desc, kc->detail);
        }
        if (more)
            printf("  %s %s: … and %d more (--verbose lists them)\n",
                   mmrt_op_name(c->rows[ri].op), c->rows[ri].dtype, more);
    }
}

void chk_print_text(const struct chk *c)
{
    print_device("plugin under test", c->dev[1], c->plugin_path);
    print_device("reference", c->dev[0], NULL);
    printf("seed %llu, %s grid%s\n", (unsigned long long)c->seed, c->quick ? "quick" : "full",
           c->strict ? ", strict contract" : "");

    printf("\ndevice contract (%.1f s)\n", c->contract_seconds);
    if (c->entry_checked)
        print_contract_line(&c->entry);
    for (int i = 0; i < c->n_contract; i++)
        print_contract_line(&c->contract[i]);

    printf("\noperators (%.1f s)\n", c->ops_seconds);
    if (c->n_rows)
        printf("  %-12s %-10s %6s  %13s  %9s  %-7s %s\n", "operator", "dtype", "shapes",
               "worst rel err", "tolerance", "result", "time");
    for (int i = 0; i < c->n_rows; i++) {
        const struct chk_row *r = &c->rows[i];
        char worst[32], tol[16], extra[64] = "";
        if (r->worst < 0)
            snprintf(worst, sizeof worst, "-");
        else if (r->tol->tol == 0)
            snprintf(worst, sizeof worst, "%s", r->n_failed ? "differs" : "exact");
        else
            snprintf(worst, sizeof worst, "%.2e", r->worst);
        if (r->tol->tol == 0)
            snprintf(tol, sizeof tol, "exact");
        else
            snprintf(tol, sizeof tol, "%.0e", r->tol->tol);
        int n = 0;
        if (r->n_failed)
            n += snprintf(extra + n, sizeof extra - (size_t)n, " %d failed", r->n_failed);
        if (r->n_refused)
            n += snprintf(extra + n, sizeof extra - (size_t)n, " %d refused", r->n_refused);
        if (r->n_skipped)
            n += snprintf(extra + n, sizeof extra - (size_t)n, " %d skipped", r->n_skipped);
        if (r->n_errors)
            snprintf(extra + n, sizeof extra - (size_t)n, " %d checker errors", r->n_errors);
        printf("  %-12s %-10s %6d  %13s  %9s  %-7s %5.1fs%s%s%s\n", mmrt_op_name(r->op),
               r->dtype, r->n_cases, worst, tol, chk_verdict_name(row_verdict(r)), r->seconds,
               extra[0] ? " (" : "", extra[0] ? extra + 1 : "", extra[0] ? ")" : "");
    }

    int n_unsup = 0;
    for (int op = 0; op < MMRT_OP_COUNT; op++) {
        const struct mmrt_plugin *p = c->dev[1]->api;
        if (p->ops[op] || !c->op_selected[op])
            continue;
        printf("%s%s", n_unsup++ ? ", " : "\nnot supported: ", mmrt_op_name((enum mmrt_op)op));
    }
    if (n_unsup)
        printf("\n");

    if (c->verbose) {
        printf("\ncases\n");
        for (int i = 0; i < c->n_cases; i++) {
            const struct chk_case *kc = &c->cases[i];
            const struct chk_row *r = &c->rows[kc->row];
            printf("  %-12s %-10s %-7s %9.2e %6.2fs  %s\n", mmrt_op_name(r->op), r->dtype,
                   chk_verdict_name(kc->verdict), kc->rel_err < 0 ? 0.0 : kc->rel_err,
                   kc->seconds, kc->desc);
        }
    }
    print_cases_with(c, CHK_FAIL, "failures", 3);
    print_cases_with(c, CHK_ERROR, "checker errors (not the plugin's fault)", 3);
    print_cases_with(c, CHK_REFUSED, "refused by the kernel (MMRT_ERR_UNSUPPORTED)", 3);
    print_cases_with(c, CHK_SKIPPED, "skipped (too large for the device pool)", 3);

    int rows_failed = 0, contract_failed = 0;
    for (int i = 0; i < c->n_rows; i++)
        rows_failed += row_verdict(&c->rows[i]) == CHK_FAIL;
    for (int i = 0; i < c->n_contract; i++)
        contract_failed += c->contract[i].verdict == CHK_FAIL;
    contract_failed += c->entry_checked && c->entry.verdict == CHK_FAIL;
    enum chk_verdict all = chk_overall(c);
    printf("\nresult: %s — %d of %d operator rows and %d of %d contract checks failed "
           "(%.1f s)\n", all == CHK_PASS ? "pass" : chk_verdict_name(all), rows_failed,
           c->n_rows, contract_failed, c->n_contract + (c->entry_checked ? 1 : 0),
           c->contract_seconds + c->ops_seconds);
}

/* ---- JSON ------------------------------------------------------------------------------------ */

static json_t *num_or_null(double v)
{
    return v < 0 ? json_null() : json_real(v);
}

static json_t *device_json(const struct mmrt_dev *d, const char *path)
{
    json_t *o = json_object();
    json_object_set_new(o, "plugin", json_string(d->api->name));
    json_object_set_new(o, "version", json_string(d->api->version ? d->api->version : ""));
    if (path)
        json_object_set_new(o, "path", json_string(path));
    json_object_set_new(o, "index", json_integer(d->index));
    json_object_set_new(o, "device", json_string(d->info.name));
    json_object_set_new(o, "kind", json_string(d->info.kind));
    json_object_set_new(o, "total_bytes", json_integer((json_int_t)d->info.total_bytes));
    return o;
}

static json_t *contract_json(const struct chk_contract_result *r)
{
    json_t *o = json_object();
    json_object_set_new(o, "check", json_string(r->name));
    json_object_set_new(o, "summary", json_string(r->summary));
    json_object_set_new(o, "result", json_string(r->verdict == CHK_SKIPPED
                                                     ? "n/a" : chk_verdict_name(r->verdict)));
    json_object_set_new(o, "detail", json_string(r->detail));
    return o;
}

mmrt_status chk_print_json(const struct chk *c, struct mmrt_error *err)
{
    json_t *root = json_object(), *contract = json_array(), *ops = json_array(),
           *unsup = json_array(), *cases = json_array();
    if (!root || !contract || !ops || !unsup || !cases) {
        json_decref(root);
        json_decref(contract);
        json_decref(ops);
        json_decref(unsup);
        json_decref(cases);
        return mmrt_error_set(err, MMRT_ERR_NO_MEMORY, "out of host memory (JSON report)");
    }
    enum chk_verdict all = chk_overall(c);
    json_object_set_new(root, "result", json_string(all == CHK_PASS ? "pass"
                                                    : chk_verdict_name(all)));
    json_object_set_new(root, "plugin", device_json(c->dev[1], c->plugin_path));
    json_object_set_new(root, "reference", device_json(c->dev[0], NULL));
    json_object_set_new(root, "seed", json_integer((json_int_t)c->seed));
    json_object_set_new(root, "grid", json_string(c->quick ? "quick" : "full"));
    json_object_set_new(root, "strict", json_boolean(c->strict));
    json_object_set_new(root, "contract_seconds", json_real(c->contract_seconds));
    json_object_set_new(root, "ops_seconds", json_real(c->ops_seconds));

    if (c->entry_checked)
        json_array_append_new(contract, contract_json(&c->entry));
    for (int i = 0; i < c->n_contract; i++)
        json_array_append_new(contract, contract_json(&c->contract[i]));
    json_object_set_new(root, "contract", contract);

    for (int i = 0; i < c->n_rows; i++) {
        const struct chk_row *r = &c->rows[i];
        json_t *o = json_object();
        json_object_set_new(o, "op", json_string(mmrt_op_name(r->op)));
        json_object_set_new(o, "dtype", json_string(r->dtype));
        json_object_set_new(o, "shapes", json_integer(r->n_cases));
        json_object_set_new(o, "failed", json_integer(r->n_failed));
        json_object_set_new(o, "refused", json_integer(r->n_refused));
        json_object_set_new(o, "skipped", json_integer(r->n_skipped));
        json_object_set_new(o, "checker_errors", json_integer(r->n_errors));
        json_object_set_new(o, "worst_rel_err", num_or_null(r->worst));
        json_object_set_new(o, "worst_case", json_string(r->worst_case >= 0
                                                         ? c->cases[r->worst_case].desc : ""));
        json_object_set_new(o, "tolerance", json_real(r->tol->tol));
        json_object_set_new(o, "tolerance_reason", json_string(r->tol->reason));
        json_object_set_new(o, "result", json_string(chk_verdict_name(row_verdict(r))));
        json_object_set_new(o, "seconds", json_real(r->seconds));
        json_array_append_new(ops, o);
    }
    json_object_set_new(root, "ops", ops);

    for (int op = 0; op < MMRT_OP_COUNT; op++)
        if (!c->dev[1]->api->ops[op] && c->op_selected[op])
            json_array_append_new(unsup, json_string(mmrt_op_name((enum mmrt_op)op)));
    json_object_set_new(root, "not_supported", unsup);

    for (int i = 0; i < c->n_cases; i++) {
        const struct chk_case *kc = &c->cases[i];
        json_t *o = json_object();
        json_object_set_new(o, "op", json_string(mmrt_op_name(c->rows[kc->row].op)));
        json_object_set_new(o, "dtype", json_string(c->rows[kc->row].dtype));
        json_object_set_new(o, "case", json_string(kc->desc));
        json_object_set_new(o, "result", json_string(chk_verdict_name(kc->verdict)));
        json_object_set_new(o, "rel_err", num_or_null(kc->rel_err));
        json_object_set_new(o, "mismatches", json_integer(kc->n_mismatch));
        json_object_set_new(o, "detail", json_string(kc->detail));
        json_object_set_new(o, "seconds", json_real(kc->seconds));
        json_array_append_new(cases, o);
    }
    json_object_set_new(root, "cases", cases);

    int rc = json_dumpf(root, stdout, JSON_INDENT(2));
    printf("\n");
    json_decref(root);
    if (rc != 0)
        return mmrt_error_set(err, MMRT_ERR_IO, "cannot write the JSON report");
    return MMRT_OK;
}
