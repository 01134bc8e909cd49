/* tests/ref_ops.c — see ref_ops.h. Written for clarity, not speed: straight loops in double. */
#include "ref_ops.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "mmrt/plugin.h"

void ref_matmul(const float *x, const float *w, const float *b, int64_t M, int64_t K, int64_t N,
                double *y)
{
    for (int64_t m = 0; m < M; m++)
        for (int64_t n = 0; n < N; n++) {
            double s = b ? b[n] : 0.0;
            for (int64_t k = 0; k < K; k++)
                s += (double)x[m * K + k] * w[n * K + k];
            y[m * N + n] = s;
        }
}

void ref_u4_dequant(const uint8_t *codes, const float *scale, const float *zero, int64_t N,
                    int64_t K, int64_t gs, float *w)
{
    const int64_t G = K / gs;
    for (int64_t n = 0; n < N; n++)
        for (int64_t blk = 0; blk < K / 32; blk++)
            for (int64_t j = 0; j < 16; j++) {
                const uint8_t b = codes[n * (K / 2) + blk * 16 + j];
                const int64_t k = blk * 32 + j, g = n * G + k / gs;
                w[n * K + k] = ((float)(b & 15) - zero[g]) * scale[g];
                w[n * K + k + 16] = ((float)(b >> 4) - zero[g]) * scale[g];
            }
}

void ref_binary(const float *a, const float *b, int64_t n, int64_t b_period, int mul, double *y)
{
    for (int64_t i = 0; i < n; i++) {
        double bv = b[i % b_period];
        y[i] = mul ? a[i] * bv : a[i] + bv;
    }
}

static double sigmoid(double x)
{
    return 1.0 / (1.0 + exp(-x));
}

void ref_unary(int op, const float *x, int64_t n, double *y)
{
    for (int64_t i = 0; i < n; i++) {
        double v = x[i];
        switch (op) {
        case MMRT_OP_GELU: y[i] = 0.5 * v * (1.0 + erf(v / sqrt(2.0))); break;
        case MMRT_OP_GELU_TANH:
            y[i] = 0.5 * v * (1.0 + tanh(sqrt(2.0 / M_PI) * (v + 0.044715 * v * v * v)));
            break;
        case MMRT_OP_QUICK_GELU: y[i] = v * sigmoid(1.702 * v); break;
        case MMRT_OP_SILU: y[i] = v * sigmoid(v); break;
        case MMRT_OP_RELU2: y[i] = v > 0 ? v * v : 0.0; break;
        default: y[i] = NAN; break;
        }
    }
}

void ref_swiglu(const float *g, const float *u, int64_t n, double *y)
{
    for (int64_t i = 0; i < n; i++)
        y[i] = g[i] * sigmoid(g[i]) * u[i];
}

void ref_layernorm(const float *x, const float *w, const float *b, int64_t rows, int64_t n,
                   double eps, double *y)
{
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * n;
        double mean = 0, var = 0;
        for (int64_t i = 0; i < n; i++)
            mean += xr[i];
        mean /= (double)n;
        for (int64_t i = 0; i < n; i++)
            var += (xr[i] - mean) * (xr[i] - mean);
        var /= (double)n;
        for (int64_t i = 0; i < n; i++) {
            double v = (xr[i] - mean) / sqrt(var + eps);
            y[r * n + i] = v * (w ? w[i] : 1.0) + (b ? b[i] : 0.0);
        }
    }
}

void ref_rmsnorm(const float *x, const float *w, int64_t rows, int64_t n, double eps, double *y)
{
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * n;
        double ms = 0;
        for (int64_t i = 0; i < n; i++)
            ms += (double)xr[i] * xr[i];
        ms /= (double)n;
        for (int64_t i = 0; i < n; i++)
            y[r * n + i] = xr[i] / sqrt(ms + eps) * (w ? w[i] : 1.0);
    }
}

void ref_softmax(const float *x, int64_t rows, int64_t n, double scale, double *y)
{
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * n;
        double m = -INFINITY, sum = 0;
        for (int64_t i = 0; i < n; i++)
            if (xr[i] * scale > m)
                m = xr[i] * scale;
        for (int64_t i = 0; i < n; i++) {
            y[r * n + i] = m == -INFINITY ? 0.0 : exp(xr[i] * scale - m);
            sum += y[r * n + i];
        }
        for (int64_t i = 0; i < n && sum > 0; i++)
            y[r * n + i] /= sum;
    }
}

void ref_rope(const float *x, const int32_t *pos, int64_t T, int64_t H, int64_t D, int n_rot,
              int mode, float theta, double *y)
{
    int half = n_rot / 2;
    for (int64_t t = 0; t < T; t++)
        for (int64_t h = 0; h < H; h++) {
            const float *xr = x + (t * H + h) * D;
            double *yr = y + (t * H + h) * D;
            for (int64_t i = n_rot; i < D; i++)
                yr[i] = xr[i];
            for (int i = 0; i < half; i++) {
                /* The op defines these two in f32, exactly as Hugging Face computes them. */
                float inv_freq = 1.0f / powf(theta, (float)(2 * i) / (float)n_rot);
                float angle = (float)pos[t] * inv_freq;
                double c = cos((double)angle), s = sin((double)angle);
                int i0 = mode == 0 ? i : 2 * i, i1 = mode == 0 ? i + half : 2 * i + 1;
                yr[i0] = xr[i0] * c - xr[i1] * s;
                yr[i1] = xr[i1] * c + xr[i0] * s;
            }
        }
}

void ref_rope_multi(const float *x, const int32_t *pos, int64_t T, int64_t H, int64_t D,
                    int n_rot, int freq_dim, int restart, int n_axes, const int *sections,
                    float theta, double *y)
{
    int half = n_rot / 2;
    for (int64_t t = 0; t < T; t++)
        for (int64_t h = 0; h < H; h++) {
            const float *xr = x + (t * H + h) * D;
            double *yr = y + (t * H + h) * D;
            for (int64_t i = n_rot; i < D; i++)
                yr[i] = xr[i];
            int a = 0, first = 0; /* the section of pair i and its first pair */
            for (int i = 0; i < half; i++) {
                while (a < n_axes && i >= first + sections[a])
                    first += sections[a++];
                int j = restart ? i - first : i;
                float inv_freq = 1.0f / powf(theta, (float)(2 * j) / (float)freq_dim);
                float angle = (float)pos[t * n_axes + a] * inv_freq;
                double c = cos((double)angle), s = sin((double)angle);
                yr[i] = xr[i] * c - xr[i + half] * s;
                yr[i + half] = xr[i + half] * c + xr[i] * s;
            }
        }
}

void ref_set_rows(const float *values, const int32_t *idx, int64_t T, int64_t n, int64_t R,
                  double *y)
{
    for (int64_t t = 0; t < T; t++)
        if (idx[t] >= 0 && idx[t] < R)
            for (int64_t k = 0; k < n; k++)
                y[idx[t] * n + k] = values[t * n + k];
}

void ref_gather_heads(const float *table, const int32_t *idx, int64_t R, int64_t H, int64_t D,
                      int64_t N, int64_t G, float *y)
{
    for (int64_t n = 0; n < N; n++)
        for (int64_t h = 0; h < H; h++) {
            const int32_t *ix = idx + (n * H + h) * G;
            float *yr = y + (n * H + h) * D;
            int64_t c = 0;
            for (int64_t g = 0; g < G; g++) {
                if (ix[g] < 0 || ix[g] >= R)
                    continue;
                const float *row = table + ((int64_t)ix[g] * H + h) * D;
                for (int64_t d = 0; d < D; d++)
                    yr[d] = c == 0 ? row[d] : yr[d] + row[d];
                c++;
            }
            for (int64_t d = 0; d < D; d++)
                yr[d] = c == 0 ? 0.0f : c == 1 ? yr[d] : yr[d] / (float)c;
        }
}

void ref_l2_norm(const float *x, int64_t rows, int64_t n, double *y)
{
    for (int64_t r = 0; r < rows; r++) {
        double s = 0;
        for (int64_t k = 0; k < n; k++)
            s += (double)x[r * n + k] * x[r * n + k];
        y[r] = sqrt(s);
    }
}

void ref_attention(const float *q, const float *k, const float *v, int64_t T, int64_t S,
                   int64_t Hq, int64_t Hkv, int64_t D, const int32_t *cu_q, const int32_t *cu_k,
                   int n_seq, double scale, int causal, int64_t window, double *y)
{
    int32_t whole_q[2] = { 0, (int32_t)T }, whole_k[2] = { 0, (int32_t)S };
    if (!cu_q) {
        cu_q = whole_q;
        cu_k = whole_k;
        n_seq = 1;
    }
    double *p = malloc(sizeof(double) * (size_t)(S + 1));
    for (int s = 0; s < n_seq; s++) {
        int64_t lq = cu_q[s + 1] - cu_q[s], lk = cu_k[s + 1] - cu_k[s];
        for (int64_t i = 0; i < lq; i++)
            for (int64_t h = 0; h < Hq; h++) {
                int64_t t = cu_q[s] + i, g = h / (Hq / Hkv);
                const float *qr = q + (t * Hq + h) * D;
                double *yr = y + (t * Hq + h) * D;
                double m = -INFINITY, sum = 0;
                /* Keys [j0, j0 + n): from the window's first key (0 without one) up to the
                 * query's own position (the last key without causality). */
                const int64_t pos = i + (lk - lq);
                const int64_t j0 = causal && window > 0 && pos - window + 1 > 0
                                       ? pos - window + 1 : 0;
                int64_t n = 0;
                for (int64_t j = j0; j < lk; j++) {
                    if (causal && j > pos)
                        break;
                    const float *kr = k + ((cu_k[s] + j) * Hkv + g) * D;
                    double d = 0;
                    for (int64_t c = 0; c < D; c++)
                        d += (double)qr[c] * kr[c];
                    p[n] = d * scale;
                    if (p[n] > m)
                        m = p[n];
                    n++;
                }
                for (int64_t c = 0; c < D; c++)
                    yr[c] = 0;
                for (int64_t j = 0; j < n; j++) {
                    p[j] = exp(p[j] - m);
                    sum += p[j];
                }
                for (int64_t j = 0; j < n; j++) {
                    const float *vr = v + ((cu_k[s] + j0 + j) * Hkv + g) * D;
                    for (int64_t c = 0; c < D; c++)
                        yr[c] += p[j] / sum * vr[c];
                }
            }
    }
    free(p);
}

/* The keys each sequence's table names, gathered in key order into contiguous k and v, then
 * ATTENTION: the paged op is defined as exactly that. */
void ref_attention_paged(const float *q, const float *k_pages, const float *v_pages,
                         int64_t T, int64_t Hq, int64_t Hkv, int64_t D, int64_t page_tokens,
                         const int32_t *cu_q, const int32_t *kv_lens, const int32_t *page_table,
                         int64_t max_pages, int n_seq, double scale, int causal,
                         int64_t window, double *y)
{
    int32_t *cu_k = malloc(sizeof(int32_t) * (size_t)(n_seq + 1));
    cu_k[0] = 0;
    for (int s = 0; s < n_seq; s++)
        cu_k[s + 1] = cu_k[s] + kv_lens[s];
    int64_t S = cu_k[n_seq], row = Hkv * D;
    float *k = malloc(sizeof(float) * (size_t)(S * row + 1));
    float *v = malloc(sizeof(float) * (size_t)(S * row + 1));
    for (int s = 0; s < n_seq; s++)
        for (int64_t j = 0; j < kv_lens[s]; j++) {
            int64_t page = page_table[s * max_pages + j / page_tokens];
            int64_t src = (page * page_tokens + j % page_tokens) * row;
            memcpy(k + (cu_k[s] + j) * row, k_pages + src, sizeof(float) * (size_t)row);
            memcpy(v + (cu_k[s] + j) * row, v_pages + src, sizeof(float) * (size_t)row);
        }
    ref_attention(q, k, v, T, S, Hq, Hkv, D, cu_q, cu_k, n_seq, scale, causal, window, y);
    free(k);
    free(v);
    free(cu_k);
}

void ref_patch_embed(const float *img, const float *w, const float *b, int64_t B, int64_t C,
                     int64_t H, int64_t W, int64_t P, int64_t O, double *y)
{
    int64_t nph = H / P, npw = W / P;
    for (int64_t bi = 0; bi < B; bi++)
        for (int64_t py = 0; py < nph; py++)
            for (int64_t px = 0; px < npw; px++)
                for (int64_t o = 0; o < O; o++) {
                    double s = b ? b[o] : 0.0;
                    for (int64_t c = 0; c < C; c++)
                        for (int64_t kh = 0; kh < P; kh++)
                            for (int64_t kw = 0; kw < P; kw++)
                                s += (double)img[((bi * C + c) * H + py * P + kh) * W + px * P + kw] *
                                     w[((o * C + c) * P + kh) * P + kw];
                    y[((bi * nph + py) * npw + px) * O + o] = s;
                }
}

int32_t ref_argmax(const float *row, int64_t n)
{
    int64_t best = -1;
    for (int64_t i = 0; i < n; i++)
        if (!isnan(row[i]) && (best < 0 || row[i] > row[best]))
            best = i;
    return best < 0 ? 0 : (int32_t)best;
}

float ref_f8e4m3_value(uint8_t code)
{
    const int e = (code >> 3) & 15, m = code & 7;
    const double sign = code & 0x80 ? -1.0 : 1.0;
    if (e == 15 && m == 7)
        return sign < 0 ? -NAN : NAN;
    return (float)(sign * (e == 0 ? ldexp(m / 8.0, -6) : ldexp(1.0 + m / 8.0, e - 7)));
}

uint8_t ref_f8e4m3_encode(float f)
{
    const uint8_t sign = signbit(f) ? 0x80 : 0;
    if (isnan(f))
        return (uint8_t)(sign | 0x7F);
    const double a = fabs((double)f);
    if (a >= 448.0)
        return (uint8_t)(sign | 0x7E);
    /* Codes 0 … 0x7E are ordered by value: lo is the largest not above a. The two distances
     * are exact in double (both ends are f32 values within a factor of two, or lo is 0). */
    int lo = 0;
    while (lo < 0x7E && ref_f8e4m3_value((uint8_t)(lo + 1)) <= a)
        lo++;
    if (ref_f8e4m3_value((uint8_t)lo) == a)
        return (uint8_t)(sign | lo);
    const double below = a - ref_f8e4m3_value((uint8_t)lo);
    const double above = ref_f8e4m3_value((uint8_t)(lo + 1)) - a;
    const int code = below < above ? lo : above < below ? lo + 1 : (lo % 2 == 0 ? lo : lo + 1);
    return (uint8_t)(sign | code);
}
