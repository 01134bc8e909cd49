/*
 * plugins/cuda/cuda_attention.cu — ATTENTION and ATTENTION_PAGED as one fused kernel in the
 * FlashAttention style
 * (Dao et al., "FlashAttention", 2022; "FlashAttention-2", 2023): each block owns a tile of
 * query rows, streams the keys in tiles through shared memory, keeps a running row maximum m,
 * row sum l and unnormalised output O in registers (online softmax), and never materialises
 * the score matrix. Everything is f32 on the CUDA cores: q is F32 by contract and the op is
 * held to the CPU reference at 2e-5, which f16/tf32 tensor-core products (~1e-3) would miss.
 *
 * Rows. A block serves one kv head g and BM "rows", a row being (query token i, head r of
 * g's group): row ρ = i · n_rep + r. Grouped-query heads of one token share every key, so
 * one K/V tile feeds all of them — this is what makes decode (one token, n_rep heads)
 * efficient, and plain multi-head attention is the n_rep = 1 case.
 *
 * Sequences. cu_seqlens live in device memory (a captured graph replays with new lengths), so
 * the host only knows upper bounds: grid.x = ceil(T·n_rep / BM) + n_seq covers every (sequence,
 * row tile) pair, and each block finds its own by scanning cu_seqlens_q (thread 0; blocks past
 * the last tile exit). Block (0, 0, 0) also validates both cu_seqlens (start 0, never
 * decreasing, ending at T / S) and reports the first violation through the error word; every
 * block clamps the values it uses into [0, T] / [0, S], so bad lengths give a wrong answer
 * and an error, never a stray memory access.
 *
 * Causal rule (plugin.h): query i of a sequence with Lq queries and Lk keys sees keys
 * j < i + (Lk − Lq) + 1, and with a sliding window (ABI 1.5) only the last `window` of those,
 * j ≥ i + (Lk − Lq) + 1 − window. A block stops at the last key its last row can see and
 * starts at the tile (a multiple of BN) holding the first key its first row sees; keys before
 * that first key are not loaded (zeros in shared memory), so pages wholly before a window are
 * never touched and a long context with a window costs the window. A row that sees no key
 * keeps l = 0 and writes zeros.
 *
 * Thread layout (128 threads = 16 × 8): thread (ty, tx) owns rows ty + 16a (a < BM/16) and,
 * for the scores, key columns tx + 8b (b < BN/8); for the output, dims 32c + 4tx … + 3
 * (c < DM/32). Scores are a register tile (float4 reads of q and k rows from shared memory,
 * row stride DM + 4 so the eight tx lanes hit distinct banks); the eight lanes of a row
 * reduce max and sum with xor shuffles; probabilities go through shared memory (stride
 * BN + 8) to the P·V product, which reads float4s of V rows.
 *
 * Tiles. DM is the head dim rounded up to 64, 96 (head dim 80), 128 or 256 (the generic path:
 * any D ≤ 256); dims past D are zero. Prefill tiles are BM × BN = 64 × 64 (DM 64), 64 × 32
 * (DM 96, 128) and 32 × 32 (DM 256), 58–102 KiB of shared memory; when the average sequence
 * has ≤ 16 rows (decode) a 16-row variant wastes less work.
 *
 * Split-KV (flash-decoding). When rows are too few to fill the GPU — decode — the key range
 * of every block is cut into n_split chunks (grid.z); each writes its unnormalised O, m and l
 * to a workspace and attn_combine merges them: O = Σ O_z e^{m_z − M} / Σ l_z e^{m_z − M}.
 * n_split is chosen on the host from upper bounds; each block sizes its chunk from the true
 * key count, so the same launch (and graph) adapts as lengths change.
 *
 * Paged (ATTENTION_PAGED): key j of sequence s is row j % page_tokens of page
 * page_table[s][j / page_tokens]; only the tile loads look the page up (key_rows).
 * attn_check_paged runs first and validates cu_seqlens_q, kv_lens and every page id a
 * sequence will read, raising CU_ERRC_PAGED; the attention blocks then see the error word set
 * and exit, so nothing is read outside the pool. The paged launch is batch-invariant
 * (specs/engine.md): a row's arithmetic depends on the key tile width BN and on nothing else
 * of the launch — the q·k order, the per-tile max and sum and the P·V chain are the same for
 * every row slot of every BM — so BN is fixed per head dim (paged_tiles), the tiles lie at
 * multiples of BN of the sequence's keys whatever the page size or the block's first row, a
 * tile a row sees no key of leaves its state as it was, and there is no split-KV (its chunks
 * and merge would depend on the batch).
 */
#include "cuda_common.cuh"
#include "cuda_kernels.h"

using namespace cu;

namespace {

constexpr int kThreads = 128;
constexpr int kMaxSplit = 32;

template <int DM, int BM, int BN> struct Cfg {
    static constexpr int RM = BM / 16; /* rows per thread */
    static constexpr int CN = BN / 8;  /* score columns per thread */
    static constexpr int DV = DM / 32; /* float4 output chunks per row and thread */
    static constexpr int QS = DM + 4;  /* q / k row stride in floats */
    static constexpr int PS = BN + 8;  /* probability row stride */
    static constexpr int OFF_K = BM * QS;
    static constexpr int OFF_V = OFF_K + BN * QS;
    static constexpr int OFF_P = OFF_V + BN * DM;
    static constexpr int FLOATS = OFF_P + BM * PS;
    static constexpr size_t BYTES = (size_t)FLOATS * sizeof(float);
    static_assert(BM % 16 == 0 && BN % 8 == 0 && BN % 4 == 0 && DM % 32 == 0, "tile shape");
};

/* Element i of a K or V array of dtype dt (F32, F16, F8E4M3 or, paged only, I8), widened:
 * exactly, or an I8 code times its row's scale rounded once, which the caller reads once
 * per row (row_scale) and passes for each of the row's elements. Only the paged instances
 * (I8) carry the I8 branch: ATTENTION never gets I8, and its registers stay as they were. */
template <bool I8>
__device__ __forceinline__ float load_kv(const void *p, int dt, int64_t i, float scale)
{
    return dt == MMRT_DTYPE_F16         ? f16_to_f32(static_cast<const uint16_t *>(p)[i])
           : dt == MMRT_DTYPE_F8E4M3    ? f8e4m3_to_f32(static_cast<const uint8_t *>(p)[i])
           : I8 && dt == MMRT_DTYPE_I8 ? i8_to_f32(static_cast<const int8_t *>(p)[i], scale)
                                        : static_cast<const float *>(p)[i];
}

/* The scale of a K or V row (I8 pages: scales[row]); 1, unread, for every other dtype. */
__device__ __forceinline__ float row_scale(const float *scales, int dt, int64_t row)
{
    return dt == MMRT_DTYPE_I8 ? scales[row] : 1.0f;
}

__device__ __forceinline__ void report(cu_err_word *e, int64_t which, int64_t entry,
                                       int64_t value)
{
    if (atomicCAS(&e->code, 0u, (unsigned)CU_ERRC_SEQLENS) == 0u) {
        e->op = MMRT_OP_ATTENTION;
        e->v[0] = which;
        e->v[1] = entry;
        e->v[2] = value;
    }
}

/* CU_ERRC_PAGED, fields as cuda_kernels.h describes them. */
__device__ __forceinline__ void report_paged(cu_err_word *e, int64_t which, int64_t entry,
                                             int64_t value, int64_t a, int64_t b)
{
    if (atomicCAS(&e->code, 0u, (unsigned)CU_ERRC_PAGED) == 0u) {
        e->op = MMRT_OP_ATTENTION_PAGED;
        e->v[0] = which;
        e->v[1] = entry;
        e->v[2] = value;
        e->v[3] = a;
        e->v[4] = b;
    }
}

/* One block of 128 threads: thread 0 walks cu_seqlens_q, all threads share the sequences'
 * kv_lens and table rows. */
__global__ void __launch_bounds__(kThreads) attn_check_paged(cu_attn_desc d)
{
    const int32_t *cq = d.cu_q;
    if (threadIdx.x == 0) {
        int64_t bad = cq[0] != 0 ? 0 : -1;
        for (int s = 0; s < d.n_seq && bad < 0; s++)
            if (cq[s + 1] < cq[s])
                bad = s + 1;
        if (bad < 0 && cq[d.n_seq] != d.T)
            bad = d.n_seq;
        if (bad >= 0)
            report_paged(d.err, 0, bad, cq[bad], 0, 0);
    }
    for (int64_t s = threadIdx.x; s < d.n_seq; s += blockDim.x) {
        int64_t lk = d.kv_lens[s], used = (lk + d.page_tokens - 1) / d.page_tokens;
        if (lk < 0 || used > d.max_pages) {
            report_paged(d.err, 1, s, lk, d.max_pages, d.page_tokens);
            continue;
        }
        for (int64_t c = 0; c < used; c++) {
            int64_t page = d.page_table[s * d.max_pages + c];
            if (page < 0 || page >= d.n_pages) {
                report_paged(d.err, 2, s, page, c, d.n_pages);
                break;
            }
        }
    }
}

/* Thread 0 of a paged block: as locate, from cu_seqlens_q and kv_lens (info[6] = sequence).
 * A set error word (attn_check_paged found a bad index) stops every block. */
__device__ void locate_paged(const cu_attn_desc &d, int BM, int64_t n_rep, long long *info)
{
    info[5] = 0;
    if (*static_cast<volatile const uint32_t *>(&d.err->code) != 0u)
        return;
    const int32_t *cq = d.cu_q;
    int64_t tile = blockIdx.x, pq = min_<int64_t>(max_<int64_t>(cq[0], 0), d.T);
    for (int s = 0; s < d.n_seq; s++) {
        int64_t eq = min_<int64_t>(max_<int64_t>(cq[s + 1], pq), d.T);
        int64_t nt = ((eq - pq) * n_rep + BM - 1) / BM;
        if (tile < nt) {
            info[0] = pq;
            info[1] = eq - pq;
            info[2] = 0;
            info[3] = min_<int64_t>(max_<int64_t>(d.kv_lens[s], 0), d.max_pages * d.page_tokens);
            info[4] = tile;
            info[5] = 1;
            info[6] = s;
            return;
        }
        tile -= nt;
        pq = eq;
    }
}

/* Element offsets of key j's K and V rows for kv head g: rows k0 + j of strided tensors, or
 * row j % page_tokens of the page sequence seq's table row names; *sr is that row's index
 * among the pool's rows of D, (page · page_tokens + row) · Hkv + g, where I8 pages keep
 * its scale (0 unpaged). */
template <bool Paged>
__device__ __forceinline__ void key_rows(const cu_attn_desc &d, int64_t seq, int64_t k0,
                                         int64_t j, int g, int64_t *kb, int64_t *vb,
                                         int64_t *sr)
{
    int64_t row = k0 + j, kp = 0, vp = 0;
    *sr = 0;
    if constexpr (Paged) {
        int64_t page = d.page_table[seq * d.max_pages + j / d.page_tokens];
        row = j % d.page_tokens;
        kp = page * d.k_sp;
        vp = page * d.v_sp;
        *sr = (page * d.page_tokens + row) * d.Hkv + g;
    }
    *kb = kp + row * d.k_s0 + g * d.k_s1;
    *vb = vp + row * d.v_s0 + g * d.v_s1;
}

/* Thread 0 of a block: which sequence and row tile this block serves.
 * info = {q0, Lq, k0, Lk, tile within the sequence, found}. */
__device__ void locate(const cu_attn_desc &d, int BM, int64_t n_rep, long long *info)
{
    info[5] = 0;
    if (!d.cu_q) {
        int64_t tiles = (d.T * n_rep + BM - 1) / BM;
        if ((int64_t)blockIdx.x < tiles) {
            info[0] = 0;
            info[1] = d.T;
            info[2] = 0;
            info[3] = d.S;
            info[4] = blockIdx.x;
            info[5] = 1;
            info[6] = 0;
        }
        return;
    }
    const bool check = blockIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0;
    const int32_t *cq = d.cu_q, *ck = d.cu_k;
    if (check) {
        if (cq[0] != 0)
            report(d.err, 0, 0, cq[0]);
        if (ck[0] != 0)
            report(d.err, 1, 0, ck[0]);
    }
    int64_t tile = blockIdx.x;
    int64_t pq = min_<int64_t>(max_<int64_t>(cq[0], 0), d.T);
    int64_t pk = min_<int64_t>(max_<int64_t>(ck[0], 0), d.S);
    for (int s = 0; s < d.n_seq; s++) {
        int64_t rq = cq[s + 1], rk = ck[s + 1];
        if (check) {
            if (rq < cq[s])
                report(d.err, 0, s + 1, rq);
            if (rk < ck[s])
                report(d.err, 1, s + 1, rk);
        }
        int64_t eq = min_<int64_t>(max_<int64_t>(rq, pq), d.T);
        int64_t ek = min_<int64_t>(max_<int64_t>(rk, pk), d.S);
        int64_t nt = ((eq - pq) * n_rep + BM - 1) / BM;
        if (!info[5] && tile < nt) {
            info[0] = pq;
            info[1] = eq - pq;
            info[2] = pk;
            info[3] = ek - pk;
            info[4] = tile;
            info[5] = 1;
            info[6] = s;
            if (!check)
                return;
        }
        tile -= nt;
        pq = eq;
        pk = ek;
    }
    if (check) {
        if (cq[d.n_seq] != d.T)
            report(d.err, 0, d.n_seq, cq[d.n_seq]);
        if (ck[d.n_seq] != d.S)
            report(d.err, 1, d.n_seq, ck[d.n_seq]);
    }
}

/* Paged selects ATTENTION_PAGED's sequence lookup and key addressing at compile time, so the
 * ATTENTION instances carry none of it (registers and spills as before). */
template <int DM, int BM, int BN, bool Paged>
__global__ void __launch_bounds__(kThreads) attn_kernel(cu_attn_desc d, int n_split)
{
    using C = Cfg<DM, BM, BN>;
    float *sQ = CU_DYN_SMEM(float);
    float *sK = sQ + C::OFF_K, *sV = sQ + C::OFF_V, *sP = sQ + C::OFF_P;
    __shared__ long long info[7];

    const int tid = threadIdx.x, tx = tid & 7, ty = tid >> 3, lane = tid & 31, warp = tid >> 5;
    const int g = blockIdx.y, z = blockIdx.z;
    const int64_t n_rep = d.Hq / d.Hkv;
    const int D = d.D;
    const int kdt = d.k_dtype, vdt = d.v_dtype;

    if (tid == 0) {
        if constexpr (Paged)
            locate_paged(d, BM, n_rep, info);
        else
            locate(d, BM, n_rep, info);
    }
    __syncthreads();
    if (!info[5])
        return; /* the whole block: past the last tile */
    const int64_t q0 = info[0], Lq = info[1], k0 = info[2], Lk = info[3], seq = info[6];
    const int64_t rows = Lq * n_rep, rho0 = info[4] * BM;

    /* Q tile, zero-padded past D and past the sequence's rows. */
    for (int rr = warp; rr < BM; rr += kThreads / 32) {
        int64_t rho = rho0 + rr;
        const float *qrow = nullptr;
        if (rho < rows)
            qrow = d.q + ((q0 + rho / n_rep) * d.Hq + g * n_rep + rho % n_rep) * D;
        for (int dd = lane; dd < DM; dd += 32)
            sQ[rr * C::QS + dd] = qrow && dd < D ? qrow[dd] : 0.0f;
    }

    /* Per-row state and visibility limits (local key indices j < lim are visible). */
    float m[C::RM], l[C::RM];
    float4 o[C::RM][C::DV];
    int64_t lim[C::RM];
#pragma unroll
    for (int a = 0; a < C::RM; a++) {
        m[a] = -CU_INF;
        l[a] = 0.0f;
#pragma unroll
        for (int c = 0; c < C::DV; c++)
            o[a][c] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        int64_t rho = rho0 + ty + 16 * a;
        lim[a] = rho >= rows ? 0 : d.causal ? rho / n_rep + (Lk - Lq) + 1 : Lk;
    }

    /* This block's key range: from the first key its first row sees (kmin; its tile, kfirst,
     * at a multiple of BN) up to what its last row sees, then this split's chunk. */
    int64_t kmax = Lk, kmin = 0;
    if (d.causal) {
        int64_t last = min_<int64_t>(rho0 + BM, rows) - 1;
        kmax = min_<int64_t>(max_<int64_t>(last / n_rep + (Lk - Lq) + 1, 0), Lk);
        int64_t first = rho0 / n_rep + (Lk - Lq) + 1;
        if (d.window > 0 && first > d.window)
            kmin = first - d.window;
    }
    const int64_t kfirst = kmin / BN * BN;
    int64_t chunk = (max_<int64_t>(kmax - kfirst, 0) + n_split - 1) / n_split;
    chunk = (chunk + BN - 1) / BN * BN;
    const int64_t kbeg = kfirst + (int64_t)z * chunk, kend = min_<int64_t>(kbeg + chunk, kmax);

    for (int64_t j0 = kbeg; j0 < kend; j0 += BN) {
        __syncthreads(); /* the last tile's P·V is done with sV / sP (and sQ is written) */
        for (int jj = warp; jj < BN; jj += kThreads / 32) {
            int64_t j = j0 + jj, kb = 0, vb = 0, sr = 0;
            bool ok = j >= kmin && j < kend;
            float ks = 1.0f, vs = 1.0f;
            if (!Paged || ok) /* a page lookup past the last key could leave the table */
                key_rows<Paged>(d, seq, k0, j, g, &kb, &vb, &sr);
            if (Paged && ok) {
                ks = row_scale(d.k_scales, kdt, sr);
                vs = row_scale(d.v_scales, vdt, sr);
            }
            for (int dd = lane; dd < DM; dd += 32) {
                bool in = ok && dd < D;
                sK[jj * C::QS + dd] = in ? load_kv<Paged>(d.k, kdt, kb + dd, ks) : 0.0f;
                sV[jj * DM + dd] = in ? load_kv<Paged>(d.v, vdt, vb + dd, vs) : 0.0f;
            }
        }
        __syncthreads();

        float s[C::RM][C::CN];
#pragma unroll
        for (int a = 0; a < C::RM; a++)
#pragma unroll
            for (int b = 0; b < C::CN; b++)
                s[a][b] = 0.0f;
#pragma unroll 2
        for (int dd = 0; dd < DM; dd += 4) {
            float4 qv[C::RM], kv[C::CN];
#pragma unroll
            for (int a = 0; a < C::RM; a++)
                qv[a] = *reinterpret_cast<const float4 *>(&sQ[(ty + 16 * a) * C::QS + dd]);
#pragma unroll
            for (int b = 0; b < C::CN; b++)
                kv[b] = *reinterpret_cast<const float4 *>(&sK[(tx + 8 * b) * C::QS + dd]);
#pragma unroll
            for (int a = 0; a < C::RM; a++)
#pragma unroll
                for (int b = 0; b < C::CN; b++) {
                    float t = s[a][b];
                    t = fmaf(qv[a].x, kv[b].x, t);
                    t = fmaf(qv[a].y, kv[b].y, t);
                    t = fmaf(qv[a].z, kv[b].z, t);
                    t = fmaf(qv[a].w, kv[b].w, t);
                    s[a][b] = t;
                }
        }

        /* Online softmax for each of this thread's rows (shared by its 8 tx lanes). */
#pragma unroll
        for (int a = 0; a < C::RM; a++) {
            float mt = -CU_INF;
#pragma unroll
            for (int b = 0; b < C::CN; b++) {
                int64_t j = j0 + tx + 8 * b;
                /* j ≥ lim − window, written so that no per-row lower bound is kept */
                bool vis = j < kend && j < lim[a] && (d.window == 0 || j + d.window >= lim[a]);
                s[a][b] = vis ? __fmul_rn(s[a][b], d.scale) : -CU_INF;
                mt = s[a][b] > mt ? s[a][b] : mt;
            }
#pragma unroll
            for (int x = 4; x >= 1; x >>= 1) {
                float other = __shfl_xor_sync(0xffffffffu, mt, x);
                mt = other > mt ? other : mt;
            }
            float mn = m[a] > mt ? m[a] : mt;
            float mu = mn == -CU_INF ? 0.0f : mn; /* nothing visible yet: keep p = 0 */
            float alpha = expf(m[a] - mu);        /* m = −inf gives 0: O and l are 0 anyway */
            float ps = 0.0f;
#pragma unroll
            for (int b = 0; b < C::CN; b++) {
                float p = expf(s[a][b] - mu);
                sP[(ty + 16 * a) * C::PS + tx + 8 * b] = p;
                ps += p;
            }
#pragma unroll
            for (int x = 4; x >= 1; x >>= 1)
                ps += __shfl_xor_sync(0xffffffffu, ps, x);
            l[a] = fmaf(l[a], alpha, ps);
#pragma unroll
            for (int c = 0; c < C::DV; c++) {
                o[a][c].x *= alpha;
                o[a][c].y *= alpha;
                o[a][c].z *= alpha;
                o[a][c].w *= alpha;
            }
            m[a] = mn;
        }
        __syncthreads();

        /* O += P · V over this tile's keys. */
#pragma unroll 2
        for (int jj = 0; jj < BN; jj += 4) {
            float4 p4[C::RM];
#pragma unroll
            for (int a = 0; a < C::RM; a++)
                p4[a] = *reinterpret_cast<const float4 *>(&sP[(ty + 16 * a) * C::PS + jj]);
#pragma unroll
            for (int e = 0; e < 4; e++) {
#pragma unroll
                for (int c = 0; c < C::DV; c++) {
                    float4 v = *reinterpret_cast<const float4 *>(&sV[(jj + e) * DM + 32 * c +
                                                                     4 * tx]);
#pragma unroll
                    for (int a = 0; a < C::RM; a++) {
                        float p = e == 0 ? p4[a].x : e == 1 ? p4[a].y : e == 2 ? p4[a].z : p4[a].w;
                        o[a][c].x = fmaf(p, v.x, o[a][c].x);
                        o[a][c].y = fmaf(p, v.y, o[a][c].y);
                        o[a][c].z = fmaf(p, v.z, o[a][c].z);
                        o[a][c].w = fmaf(p, v.w, o[a][c].w);
                    }
                }
            }
        }
    }

    /* Results: normalised output, or this split's partial (O, m, l). */
#pragma unroll
    for (int a = 0; a < C::RM; a++) {
        int64_t rho = rho0 + ty + 16 * a;
        if (rho >= rows)
            continue;
        int64_t t = q0 + rho / n_rep, h = g * n_rep + rho % n_rep;
        int64_t row = t * d.Hq + h;
        float *out;
        if (n_split == 1) {
            out = d.y + row * D;
        } else {
            int64_t slot = (int64_t)z * d.T * d.Hq + row;
            out = d.ws + slot * D;
            if (tx == 0) {
                float *ml = d.ws + (int64_t)n_split * d.T * d.Hq * D + slot * 2;
                ml[0] = m[a];
                ml[1] = l[a];
            }
        }
        bool norm = n_split == 1;
        float la = l[a];
#pragma unroll
        for (int c = 0; c < C::DV; c++) {
            const float vals[4] = {o[a][c].x, o[a][c].y, o[a][c].z, o[a][c].w};
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int dd = 32 * c + 4 * tx + e;
                if (dd < D)
                    out[dd] = !norm ? vals[e] : la > 0.0f ? vals[e] / la : 0.0f;
            }
        }
    }
}

/* Merges the n_split partial results of each (token, head) row. */
__global__ void __launch_bounds__(kThreads)
attn_combine(const float *ws, float *y, int64_t T, int Hq, int D, int n_split)
{
    const int64_t rows = T * Hq;
    const float *ml = ws + (int64_t)n_split * rows * D;
    for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
        float M = -CU_INF;
        for (int zz = 0; zz < n_split; zz++) {
            float mz = ml[((int64_t)zz * rows + row) * 2];
            M = mz > M ? mz : M;
        }
        float *out = y + row * D;
        if (M == -CU_INF) { /* no split saw a key */
            for (int dd = threadIdx.x; dd < D; dd += blockDim.x)
                out[dd] = 0.0f;
            continue;
        }
        float L = 0.0f;
        for (int zz = 0; zz < n_split; zz++) {
            const float *p = ml + ((int64_t)zz * rows + row) * 2;
            L += p[1] * expf(p[0] - M); /* a split without keys: l = 0, e^{−inf} = 0 */
        }
        for (int dd = threadIdx.x; dd < D; dd += blockDim.x) {
            float acc = 0.0f;
            for (int zz = 0; zz < n_split; zz++) {
                float w = expf(ml[((int64_t)zz * rows + row) * 2] - M);
                acc = fmaf(ws[((int64_t)zz * rows + row) * D + dd], w, acc);
            }
            out[dd] = acc / L;
        }
    }
}

template <int DM, int BM, int BN, bool Paged = false>
cudaError_t launch_attn(const cu_attn_desc *d, cudaStream_t stream)
{
    using C = Cfg<DM, BM, BN>;
    const int64_t n_rep = d->Hq / d->Hkv, n_seq = d->cu_q ? d->n_seq : 1;
    const int64_t base_tiles = (d->T * n_rep + BM - 1) / BM;
    const int64_t grid_x = base_tiles + (d->cu_q ? n_seq : 0);

    /* Split the keys when the row tiles alone leave most multiprocessors idle and there are
     * enough keys per sequence to be worth a second pass. */
    int n_split = 1;
    const int64_t blocks = base_tiles * d->Hkv;
    /* A block with a window reads at most window + BM keys, whatever the sequence's length. */
    const int64_t avg_keys = d->window > 0 && d->causal
                                 ? min_<int64_t>(d->S / n_seq, (int64_t)d->window + BM)
                                 : d->S / n_seq;
    const int64_t n_sm = d->n_sm > 0 ? d->n_sm : 1;
    if (!Paged && d->ws && blocks < 2 * n_sm && avg_keys >= 4 * BN) {
        int64_t want = (2 * n_sm + blocks - 1) / blocks;
        want = min_<int64_t>(want, avg_keys / (2 * BN));
        want = min_<int64_t>(want, kMaxSplit);
        int64_t per_split = d->T * d->Hq * (d->D + 2);
        if (per_split > 0)
            want = min_<int64_t>(want, d->ws_floats / per_split);
        n_split = want >= 2 ? (int)want : 1;
    }
    dim3 grid((unsigned)grid_x, (unsigned)d->Hkv, (unsigned)n_split);
    cu_attn_desc v = *d;
    auto k = attn_kernel<DM, BM, BN, Paged>;
    CU_LAUNCH(k, grid, kThreads, C::BYTES, stream, v, n_split);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess || n_split == 1)
        return e;
    auto kc = attn_combine;
    const float *ws = d->ws;
    float *y = d->y;
    int64_t T = d->T;
    int Hq = d->Hq, D = d->D;
    CU_LAUNCH(kc, grid_for(T * Hq, 1, 65536), kThreads, 0, stream, ws, y, T, Hq, D, n_split);
    return cudaGetLastError();
}

/* The largest dynamic shared memory a block may opt into, over every device opened so far
 * (227 KiB on H100/H200, 163 KiB on A100, 99 KiB on sm_86/sm_89, which run the sm_80 code).
 * A tile that does not fit falls back to a smaller one. Devices may be opened from several
 * threads, hence the atomic accesses. */
int g_max_smem = 227 * 1024;

int max_smem(void)
{
    return __atomic_load_n(&g_max_smem, __ATOMIC_RELAXED);
}

template <int DM, int BM, int BN, bool Paged = false> cudaError_t raise_smem(void)
{
#ifdef MMRT_CU_EMU
    return cudaSuccess;
#else
    if (Cfg<DM, BM, BN>::BYTES > (size_t)max_smem())
        return cudaSuccess; /* never launched here: see cu_launch_attention */
    return cudaFuncSetAttribute(attn_kernel<DM, BM, BN, Paged>,
                                cudaFuncAttributeMaxDynamicSharedMemorySize,
                                (int)Cfg<DM, BM, BN>::BYTES);
#endif
}

template <int DM, int BM, int BN> bool fits(void)
{
    return Cfg<DM, BM, BN>::BYTES <= (size_t)max_smem();
}

} // namespace

/* The eight ATTENTION instances: (DM, prefill tile, decode tile), and the eight paged ones.
 * Keep in step with cu_launch_attention and paged_tiles. */
extern "C" cudaError_t cu_attention_init(void)
{
#ifndef MMRT_CU_EMU
    int dev = 0, optin = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e == cudaSuccess)
        e = cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
    if (e != cudaSuccess)
        return e;
    for (int cur = max_smem(); optin < cur;)
        if (__atomic_compare_exchange_n(&g_max_smem, &cur, optin, false, __ATOMIC_RELAXED,
                                        __ATOMIC_RELAXED))
            break;
    if ((e = raise_smem<64, 64, 64>()) != cudaSuccess || (e = raise_smem<64, 16, 64>()) ||
        (e = raise_smem<96, 64, 32>()) || (e = raise_smem<96, 16, 64>()) ||
        (e = raise_smem<128, 64, 32>()) || (e = raise_smem<128, 16, 64>()) ||
        (e = raise_smem<256, 32, 32>()) || (e = raise_smem<256, 16, 32>()) ||
        (e = raise_smem<64, 64, 64, true>()) || (e = raise_smem<64, 16, 64, true>()) ||
        (e = raise_smem<96, 64, 32, true>()) || (e = raise_smem<96, 16, 32, true>()) ||
        (e = raise_smem<128, 64, 32, true>()) || (e = raise_smem<128, 16, 32, true>()) ||
        (e = raise_smem<256, 32, 32, true>()) || (e = raise_smem<256, 16, 32, true>()))
        return e;
#endif
    return cudaSuccess;
}

namespace {

/* The paged launch's tiles: the 16-row decode tile or the prefill tile as for ATTENTION, but
 * one key width BN per head dim for both, so that the choice (which depends on the launch)
 * changes only how rows are grouped into blocks, never a row's arithmetic. */
cudaError_t paged_tiles(const cu_attn_desc *d, bool small, cudaStream_t stream)
{
    if (d->D <= 64)
        return small ? launch_attn<64, 16, 64, true>(d, stream)
                     : launch_attn<64, 64, 64, true>(d, stream);
    if (d->D <= 96)
        return small ? launch_attn<96, 16, 32, true>(d, stream)
                     : launch_attn<96, 64, 32, true>(d, stream);
    if (d->D <= 128)
        return small ? launch_attn<128, 16, 32, true>(d, stream)
                     : launch_attn<128, 64, 32, true>(d, stream);
    return small || !fits<256, 32, 32>() ? launch_attn<256, 16, 32, true>(d, stream)
                                         : launch_attn<256, 32, 32, true>(d, stream);
}

} // namespace

extern "C" cudaError_t cu_launch_attention(const struct cu_attn_desc *d, cudaStream_t stream)
{
    if (d->page_table) {
        cu_attn_desc v = *d;
        CU_LAUNCH(attn_check_paged, 1, kThreads, 0, stream, v);
        cudaError_t e = cudaGetLastError();
        if (e != cudaSuccess || d->T <= 0 || d->Hq <= 0)
            return e;
        return paged_tiles(d, d->T * (int64_t)(d->Hq / d->Hkv) <= 16 * d->n_seq, stream);
    }
    if (d->T <= 0 || d->Hq <= 0)
        return cudaSuccess;
    const int64_t n_seq = d->cu_q ? d->n_seq : 1;
    /* Decode-like launches (≤ 16 rows per sequence on average) take the 16-row tiles. */
    const bool small = d->T * (int64_t)(d->Hq / d->Hkv) <= 16 * n_seq;
    if (d->D <= 64)
        return small ? launch_attn<64, 16, 64>(d, stream) : launch_attn<64, 64, 64>(d, stream);
    if (d->D <= 96)
        return small ? launch_attn<96, 16, 64>(d, stream) : launch_attn<96, 64, 32>(d, stream);
    if (d->D <= 128)
        return small ? launch_attn<128, 16, 64>(d, stream) : launch_attn<128, 64, 32>(d, stream);
    /* 104 KiB: on GPUs with less shared memory per block, the 16-row tile (85 KiB). */
    return small || !fits<256, 32, 32>() ? launch_attn<256, 16, 32>(d, stream)
                                         : launch_attn<256, 32, 32>(d, stream);
}
