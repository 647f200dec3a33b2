// DSA sparse MLA attention (dsa_sparse_attention_h16_ckv512_kpe64_topk2048_ps64), split-K partials:
// NS CTAs per query token each attend over 2048 / NS of its selected keys and write a normalized
// partial output and its base-2 lse; the Triton split-K merge kernel
// (kernels/triton/dsa/sparse_attention_splitk.py) combines them. With NS = 1 (many query tokens)
// one CTA per token writes the output and lse itself: no workspace, no merge.
//
// Shapes (contiguous, bf16 as raw 16-bit words; H = 16 heads, DC = 512, DP = 64, DK = DC + DP):
//   qn   [T, H, DC]    qp  [T, H, DP]    ckv [P * 64, DC]    kpe [P * 64, DP]
//   idx  [T, 2048] int32 cache rows (page * 64 + slot); -1 or out of [0, n_cache_tokens) = unused
//   dst_o [T, NS, H, DC] fp32 partial output (normalized; zeros without a valid key), or with
//         NS = 1 the output [T, H, DC] bf16
//   dst_lse [T, NS, H] fp32 partial base-2 lse (-inf without a valid key), or the lse [T, H]
//
// Grid (NS, T), G groups of 4 warps. CTA s of token t owns the index slots [s * KPC, (s + 1) * KPC),
// KPC = 2048 / NS, cut in blocks of BN = 32 keys; group k takes blocks k, k + G, ... with its own
// online-softmax state, so G blocks are in compute at once (one group, i.e. one warp per scheduler,
// was latency-bound: 4.5 cycles per instruction). Per block:
//   * gather: warp 0 of the group reads the block's 32 indices itself (one lane per key) and issues
//     two TMA bulk copies per key (cp.async.bulk, 1024 B of ckv then 128 B of kpe) from the paged
//     cache into the group's ring of ST stages, completing on the stage's mbarrier; an unused
//     key's row is zero-filled instead (its weight is 0, and 0 * garbage could be NaN). All of a
//     CTA's blocks are in flight from the start when KPC <= G * ST * BN;
//   * logits S[16, 32] on the tensor cores (mma.sync m16n8k16 bf16, fp32 accumulate), the 576 key
//     dims split over the group's 4 warps (warp w: dims [144 w, 144 w + 144), its 9 q fragments in
//     registers for the whole kernel, K fragments by ldmatrix); the partial S tiles are summed
//     through shared memory;
//   * every warp of the group then has the whole S: base-2 online softmax, and
//     O[16, 128 w .. 128 w + 128] += P V, V = the gathered ckv rows (ldmatrix.trans fragments).
// Groups 1 .. G-1 then hand their O, max and sum to group 0, which combines and writes the split's
// result.
//
// Measured on an H100 (globaltimer stamps, 2026-11-23): a scattered gather of 1152-byte rows runs
// at about 34 GB/s per SM whether the rows sit in L2 or in HBM (contiguous rows: about 105 GB/s), so
// the time of a call follows the keys per CTA; more CTAs per token is what makes it faster. A first
// version merged the splits of a token inside a 16-CTA thread-block cluster through distributed
// shared memory (one launch): the merge cost ~3 us and a token could use only 16 SMs, and 8 such
// clusters do not fit on the GPU at once. cp.async gathers (LSU) instead of TMA: the same speed from
// 6 query tokens on, 1-2 us faster at 16 splits for 1-2 tokens, no faster at 32 splits. Four groups
// of warps instead of two: no faster (the gather, not the compute, is the critical path).
//
// Header-free (NVRTC needs no CUDA include directory).

#define H 16
#define DC 512
#define DP 64
#define DK (DC + DP)                     // 576 key dims: ckv then kpe
#define TOPK 2048
#define BN 32                            // keys per pipeline block
#define GROUP_THREADS 128                // a group: 4 warps
#define ROW_BYTES (DK * 2)               // 1152 bytes of one gathered key
#define CKV_BYTES (DC * 2)
#define ROW_STRIDE (ROW_BYTES + 16)      // rows 4 banks apart: ldmatrix conflict-free
#define STAGE_BYTES (BN * ROW_STRIDE)
#define DIMS_PER_WARP (DK / 4)           // 144 = 9 k-steps of 16
#define SRED_STRIDE (BN + 8)             // partial-logit rows: float2 stores conflict-free per half warp
#define SRED_FLOATS (4 * H * SRED_STRIDE)
#define OSTRIDE (DC + 8)                 // fp32 O rows of the groups' hand-over, same reason
#define XBUF_BYTES (H * OSTRIDE * 4 + 2 * H * 4)  // O, then max and sum per head
#define EARLY_MERGE_SPLITS 64            // as in sparse_attention_splitk.py

typedef unsigned int u32;

#define NEG_INF (-__int_as_float(0x7f800000))

__device__ __forceinline__ u32 smem_addr(const void* p) {
    u32 r;
    asm volatile("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(r) : "l"(p));
    return r;
}

__device__ __forceinline__ void mbar_init(u32 bar, u32 count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}

__device__ __forceinline__ void mbar_arrive_expect_tx(u32 bar, u32 bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}

__device__ __forceinline__ void mbar_wait(u32 bar, u32 parity) {
    u32 done = 0;
    while (!done) {
        asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
                     : "=r"(done) : "r"(bar), "r"(parity) : "memory");
    }
}

__device__ __forceinline__ void bulk_copy(u32 dst, const void* src, u32 bytes, u32 bar) {  // global -> shared, TMA
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                 ::"r"(dst), "l"(src), "r"(bytes), "r"(bar) : "memory");
}

__device__ __forceinline__ void group_barrier(int group) {  // named barrier 1 + group, its 128 threads
    asm volatile("bar.sync %0, %1;" ::"r"(1 + group), "n"(GROUP_THREADS) : "memory");
}

__device__ __forceinline__ void mma_bf16(float* c, const u32* a, u32 b0, u32 b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void ldmatrix_x4(u32* r, u32 addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}

__device__ __forceinline__ void ldmatrix_x4_trans(u32* r, u32 addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}

__device__ __forceinline__ u32 pack_bf16(float lo, float hi) {  // lo -> low half (lower address)
    u32 r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

__device__ __forceinline__ float fast_exp2(float x) {  // 2^-inf = +0
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

template <int NS, int ST, int G>
__device__ __forceinline__ void sparse_attn_cta(
        const unsigned short* __restrict__ qn, const unsigned short* __restrict__ qp,
        const unsigned char* __restrict__ ckv, const unsigned char* __restrict__ kpe,
        const int* __restrict__ idx, void* __restrict__ dst_o, float* __restrict__ dst_lse,
        float scale_log2, int n_cache_tokens) {
    constexpr int KPC = TOPK / NS;  // keys per CTA
    constexpr int NB = KPC / BN;    // blocks per CTA
    constexpr int NBG = NB / G;     // blocks per group
    static_assert(NB % G == 0 && ST >= 1 && G >= 1, "unsupported split count");
    // A stage refilled inside the loop is read ST iterations later, after the group barriers of the
    // iterations between (see `issue`): with ST = 1 nothing would separate them.
    static_assert(ST >= 2 || NBG <= ST, "one stage per group needs every block issued up front");
    static_assert((G - 1) * XBUF_BYTES <= G * ST * STAGE_BYTES, "the hand-over reuses the rings");

    // The merge is launched as a programmatic dependent of this kernel and waits (griddepcontrol)
    // for its partials. The 64-split kernel (1-4 tokens, small CTAs) releases it at once, so the
    // merge's launch overlaps this grid: 0.25-0.33 us a call at 1-2 tokens (H100, 2026-11-23). The
    // larger configs release it at exit: released early, its CTAs took SM slots beside theirs
    // (2.1-3.6 us slower at 6-8 tokens).
    if (NS == EARLY_MERGE_SPLITS) asm volatile("griddepcontrol.launch_dependents;");

    extern __shared__ __align__(128) unsigned char smem[];
    unsigned char* rings = smem;                                         // [G groups][ST][BN][ROW_STRIDE]
    float* sred_all = (float*)(smem + G * ST * STAGE_BYTES);             // [G groups][4 warps][H][SRED_STRIDE]
    u32* smask = (u32*)(sred_all + G * SRED_FLOATS);                     // [NB] valid-key bits per block
    unsigned long long* bars = (unsigned long long*)(smask + NB + (NB & 1));  // [G][ST] stage mbarriers

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, tq = lane & 3;
    const int group = warp >> 2, gw = warp & 3;  // group, warp within the group
    const int split = blockIdx.x;
    const long long t = blockIdx.y;

    const u32 bar0 = smem_addr(bars);
    if (tid == 0) {
        for (int i = 0; i < G * ST; ++i) mbar_init(bar0 + 8 * i, 1);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();  // barriers initialized

    unsigned char* ring = rings + group * (ST * STAGE_BYTES);
    const u32 ring_addr = smem_addr(ring);
    const u32 gbar = bar0 + 8 * (group * ST);
    const int* irow = idx + t * TOPK + split * KPC;  // this CTA's index slots
    // Block i of this group (CTA block G i + group) into stage i % ST; issued by the group's warp 0,
    // one lane per key, from that key's index `r`. The producer reads the indices itself (no staging
    // through shared memory and a CTA barrier: the gathers start one dependent load after launch).
    // Zero-fills and the valid-key mask come before the arrive (release), which orders them before
    // the consumers' wait. compute-sanitizer's racecheck does not model mbarrier waits, so a group
    // barrier also lies between every such write and its first read: after the first ST issues,
    // and for a refill, the barriers of the iterations before its stage comes round again.
    auto issue = [&](int i, int r) {
        const int blk = G * i + group, stage = i % ST;
        const bool ok = r >= 0 && r < n_cache_tokens;
        const u32 bits = __ballot_sync(0xffffffffu, ok);
        const u32 dst = ring_addr + stage * STAGE_BYTES + lane * ROW_STRIDE;
        if (!ok) {
            uint4* z = (uint4*)(ring + stage * STAGE_BYTES + lane * ROW_STRIDE);
            for (int c = 0; c < ROW_BYTES / 16; ++c) z[c] = make_uint4(0u, 0u, 0u, 0u);
        }
        if (lane == 0) smask[blk] = bits;
        __syncwarp();
        if (lane == 0) mbar_arrive_expect_tx(gbar + 8 * stage, __popc(bits) * ROW_BYTES);
        __syncwarp();
        if (ok) {
            bulk_copy(dst, ckv + (long long)r * CKV_BYTES, CKV_BYTES, gbar + 8 * stage);
            bulk_copy(dst + CKV_BYTES, kpe + (long long)r * (DP * 2), DP * 2, gbar + 8 * stage);
        }
    };
    if (gw == 0) {
        int r[ST];
#pragma unroll
        for (int i = 0; i < ST; ++i) r[i] = i < NBG ? irow[(G * i + group) * BN + lane] : -1;  // loads in flight together
#pragma unroll
        for (int i = 0; i < ST; ++i)
            if (i < NBG) issue(i, r[i]);
    }

    // q fragments of this warp's 144 key dims (A operand of m16n8k16: rows = heads), kept in registers.
    u32 qa[9][4];
    {
        const unsigned short* qnr = qn + t * (H * DC);
        const unsigned short* qpr = qp + t * (H * DP);
#pragma unroll
        for (int j = 0; j < 9; ++j) {
            const int d0 = gw * DIMS_PER_WARP + j * 16;  // a k-step lies wholly in ckv or in kpe dims
            const unsigned short* base = d0 < DC ? qnr + d0 : qpr + (d0 - DC);
            const int stride = d0 < DC ? DC : DP;
            qa[j][0] = *(const u32*)(base + g * stride + 2 * tq);
            qa[j][1] = *(const u32*)(base + (g + 8) * stride + 2 * tq);
            qa[j][2] = *(const u32*)(base + g * stride + 8 + 2 * tq);
            qa[j][3] = *(const u32*)(base + (g + 8) * stride + 8 + 2 * tq);
        }
    }
    group_barrier(group);  // the first stages' zero-fills (see `issue`)

    float m_run[2] = {NEG_INF, NEG_INF};  // rows g and g + 8
    float l_run[2] = {0.f, 0.f};          // this thread's share of the row sums (quad-reduced at the end)
    float acc[16][4];
#pragma unroll
    for (int n = 0; n < 16; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.f;
    float* sred = sred_all + group * SRED_FLOATS;

    // ldmatrix lane addresses. QK (non-transposed K): matrix l >> 3 = (n-tile pair half, dim half).
    const u32 qk_lane = ((((lane >> 4) * 8) + (lane & 7)) * ROW_STRIDE) + (gw * DIMS_PER_WARP + ((lane >> 3) & 1) * 8) * 2;
    // PV (transposed V): matrix l >> 3 = (key half, column half).
    const u32 pv_lane = ((lane & 7) + ((lane >> 3) & 1) * 8) * ROW_STRIDE + (gw * 128 + (lane >> 4) * 8) * 2;

    for (int i = 0; i < NBG; ++i) {
        const int blk = G * i + group, stage = i % ST;
        const u32 stage_addr = ring_addr + stage * STAGE_BYTES;
        mbar_wait(gbar + 8 * stage, (i / ST) & 1);

        float s[4][4];
#pragma unroll
        for (int n = 0; n < 4; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
#pragma unroll
        for (int j = 0; j < 9; ++j) {
#pragma unroll
            for (int np = 0; np < 2; ++np) {  // n-tiles 2 np and 2 np + 1
                u32 kb[4];
                ldmatrix_x4(kb, stage_addr + qk_lane + np * 16 * ROW_STRIDE + j * 32);
                mma_bf16(s[2 * np], qa[j], kb[0], kb[1]);
                mma_bf16(s[2 * np + 1], qa[j], kb[2], kb[3]);
            }
        }
        float* mine = sred + gw * (H * SRED_STRIDE);
#pragma unroll
        for (int n = 0; n < 4; ++n) {
            *(float2*)(mine + g * SRED_STRIDE + n * 8 + 2 * tq) = make_float2(s[n][0], s[n][1]);
            *(float2*)(mine + (g + 8) * SRED_STRIDE + n * 8 + 2 * tq) = make_float2(s[n][2], s[n][3]);
        }
        group_barrier(group);

        // Whole logits (sum of the four dim slices), scaled to base 2, unused keys at -inf.
        const u32 valid = smask[blk];
        float mx[2] = {NEG_INF, NEG_INF};
#pragma unroll
        for (int n = 0; n < 4; ++n) {
#pragma unroll
            for (int half = 0; half < 2; ++half) {
                float2 v = make_float2(0.f, 0.f);
#pragma unroll
                for (int w = 0; w < 4; ++w) {
                    const float2 x = *(const float2*)(sred + w * (H * SRED_STRIDE) + (g + 8 * half) * SRED_STRIDE + n * 8 + 2 * tq);
                    v.x += x.x;
                    v.y += x.y;
                }
                const int key = n * 8 + 2 * tq;
                s[n][2 * half] = (valid >> key) & 1u ? v.x * scale_log2 : NEG_INF;
                s[n][2 * half + 1] = (valid >> (key + 1)) & 1u ? v.y * scale_log2 : NEG_INF;
                mx[half] = fmaxf(mx[half], fmaxf(s[n][2 * half], s[n][2 * half + 1]));
            }
        }
        float m_use[2];
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            mx[half] = fmaxf(mx[half], __shfl_xor_sync(0xffffffffu, mx[half], 1));
            mx[half] = fmaxf(mx[half], __shfl_xor_sync(0xffffffffu, mx[half], 2));
            const float m_new = fmaxf(m_run[half], mx[half]);
            m_use[half] = m_new == NEG_INF ? 0.f : m_new;  // nothing valid yet: avoid -inf - -inf
            const float alpha = fast_exp2(m_run[half] - m_use[half]);
            m_run[half] = m_new;
            l_run[half] *= alpha;
#pragma unroll
            for (int n = 0; n < 16; ++n) {
                acc[n][2 * half] *= alpha;
                acc[n][2 * half + 1] *= alpha;
            }
        }
        u32 pa[2][4];  // P as the A operand of two k-steps of 16 keys (C layout of S == A layout of P)
#pragma unroll
        for (int n = 0; n < 4; ++n) {
            const float p0 = fast_exp2(s[n][0] - m_use[0]), p1 = fast_exp2(s[n][1] - m_use[0]);
            const float p2 = fast_exp2(s[n][2] - m_use[1]), p3 = fast_exp2(s[n][3] - m_use[1]);
            l_run[0] += p0 + p1;
            l_run[1] += p2 + p3;
            pa[n >> 1][(n & 1) * 2] = pack_bf16(p0, p1);
            pa[n >> 1][(n & 1) * 2 + 1] = pack_bf16(p2, p3);
        }

        // O[:, 128 gw .. +128] += P V: V fragments by ldmatrix.trans from the gathered ckv rows.
#pragma unroll
        for (int kk = 0; kk < 2; ++kk) {
#pragma unroll
            for (int np = 0; np < 8; ++np) {
                u32 v[4];
                ldmatrix_x4_trans(v, stage_addr + pv_lane + kk * 16 * ROW_STRIDE + np * 32);
                mma_bf16(acc[2 * np], pa[kk], v[0], v[1]);
                mma_bf16(acc[2 * np + 1], pa[kk], v[2], v[3]);
            }
        }
        group_barrier(group);  // the group is done with this stage and with sred
        if (gw == 0 && i + ST < NBG) issue(i + ST, irow[(G * (i + ST) + group) * BN + lane]);
    }
    __syncthreads();  // the rings are free: reuse them for the hand-over

#pragma unroll
    for (int half = 0; half < 2; ++half) {
        l_run[half] += __shfl_xor_sync(0xffffffffu, l_run[half], 1);
        l_run[half] += __shfl_xor_sync(0xffffffffu, l_run[half], 2);
    }
    // Groups 1 .. G-1 hand their partials to group 0: [H][OSTRIDE] O, then max and sum, each.
    if (group > 0) {
        float* xbuf = (float*)(smem + (group - 1) * XBUF_BYTES);
        float* xstat = xbuf + H * OSTRIDE;
#pragma unroll
        for (int n = 0; n < 16; ++n) {
            const int col = gw * 128 + n * 8 + 2 * tq;
            *(float2*)(xbuf + g * OSTRIDE + col) = make_float2(acc[n][0], acc[n][1]);
            *(float2*)(xbuf + (g + 8) * OSTRIDE + col) = make_float2(acc[n][2], acc[n][3]);
        }
        if (gw == 0 && tq == 0) {  // every warp of a group holds the same statistics
            xstat[g] = m_run[0];
            xstat[g + 8] = m_run[1];
            xstat[H + g] = l_run[0];
            xstat[H + g + 8] = l_run[1];
        }
    }
    __syncthreads();
    // Group 0 combines all groups and writes the split's normalized output and base-2 lse
    // (zeros and -inf without a valid key: the merge weighs them by 0, so they must be finite);
    // with one split (NS = 1) they are the token's output (bf16) and lse, and no merge runs.
    if (group == 0) {
        float a_x[G][2], inv[2];  // a_x[0]: weight of group 0's own partial, a_x[k]: of group k's
        const long long row0 = (t * NS + split) * H;  // [T, NS, H, DC] and [T, NS, H]
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const int h = g + 8 * half;
            float mk[G];
            mk[0] = m_run[half];
            float m = mk[0];
#pragma unroll
            for (int k = 1; k < G; ++k) {
                mk[k] = ((const float*)(smem + (k - 1) * XBUF_BYTES))[H * OSTRIDE + h];
                m = fmaxf(m, mk[k]);
            }
            const float mu = m == NEG_INF ? 0.f : m;
            float l = 0.f;
#pragma unroll
            for (int k = 0; k < G; ++k) {
                a_x[k][half] = fast_exp2(mk[k] - mu);
                const float lk = k == 0 ? l_run[half] : ((const float*)(smem + (k - 1) * XBUF_BYTES))[H * OSTRIDE + H + h];
                l += lk * a_x[k][half];
            }
            inv[half] = l > 0.f ? 1.f / l : 0.f;
            if (gw == 0 && tq == 0) dst_lse[row0 + h] = l > 0.f ? mu + log2f(l) : NEG_INF;
        }
        const long long o0 = (row0 + g) * DC, o1 = (row0 + g + 8) * DC;
#pragma unroll
        for (int n = 0; n < 16; ++n) {
            const int col = gw * 128 + n * 8 + 2 * tq;
            float2 y0 = make_float2(acc[n][0] * a_x[0][0], acc[n][1] * a_x[0][0]);
            float2 y1 = make_float2(acc[n][2] * a_x[0][1], acc[n][3] * a_x[0][1]);
#pragma unroll
            for (int k = 1; k < G; ++k) {
                const float* xbuf = (const float*)(smem + (k - 1) * XBUF_BYTES);
                const float2 x0 = *(const float2*)(xbuf + g * OSTRIDE + col);
                const float2 x1 = *(const float2*)(xbuf + (g + 8) * OSTRIDE + col);
                y0.x += x0.x * a_x[k][0];
                y0.y += x0.y * a_x[k][0];
                y1.x += x1.x * a_x[k][1];
                y1.y += x1.y * a_x[k][1];
            }
            if (NS == 1) {  // the token's whole output: bf16, no merge
                ((u32*)dst_o)[(o0 + col) / 2] = pack_bf16(y0.x * inv[0], y0.y * inv[0]);
                ((u32*)dst_o)[(o1 + col) / 2] = pack_bf16(y1.x * inv[1], y1.y * inv[1]);
            } else {
                *(float2*)((float*)dst_o + o0 + col) = make_float2(y0.x * inv[0], y0.y * inv[0]);
                *(float2*)((float*)dst_o + o1 + col) = make_float2(y1.x * inv[1], y1.y * inv[1]);
            }
        }
    }
}

// One kernel per (splits per token NS, ring stages per group ST, groups G); config() picks one.
#define DSA_SPARSE_ATTN_PARTIAL(NS, ST, G)                                                             \
    extern "C" __global__ void __launch_bounds__(G * GROUP_THREADS, 1)                                \
    dsa_sparse_attn_partial_ns##NS##_s##ST##_g##G(const unsigned short* __restrict__ qn,              \
                                                  const unsigned short* __restrict__ qp,              \
                                                  const unsigned char* __restrict__ ckv,              \
                                                  const unsigned char* __restrict__ kpe,              \
                                                  const int* __restrict__ idx,                        \
                                                  void* __restrict__ dst_o, float* __restrict__ dst_lse, \
                                                  float scale_log2, int n_cache_tokens) {             \
        sparse_attn_cta<NS, ST, G>(qn, qp, ckv, kpe, idx, dst_o, dst_lse, scale_log2, n_cache_tokens); \
    }

DSA_SPARSE_ATTN_PARTIAL(64, 1, 1)
DSA_SPARSE_ATTN_PARTIAL(16, 2, 2)
DSA_SPARSE_ATTN_PARTIAL(8, 2, 2)
DSA_SPARSE_ATTN_PARTIAL(4, 2, 2)
DSA_SPARSE_ATTN_PARTIAL(2, 2, 2)
DSA_SPARSE_ATTN_PARTIAL(1, 2, 2)
