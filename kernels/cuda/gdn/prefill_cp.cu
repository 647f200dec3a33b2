// kdispatch: continues prefill_walk.cu
// Gated DeltaNet prefill, context parallel (`cuda_prefill_cp`, prefill_cp.py): not a program of its own but
// prefill_walk.cu's continuation, compiled as that file's text followed by this one's (prefill_cp.py), so the
// staged walk's kernels, and its variants' provenance, do not change with what is here: the batch's plan (how
// many segments each sequence is walked in, and the CP launches' work lists), the CP walk's Plan for
// prefill_walk.cu's walk, the chain over the segments and the correction of their outputs, and the kernels.

// ---- CP: the batch's plan, made by the CP first launch's extra grid column (cp_plan) ----
// How many segments each sequence is walked in, and the lists the CP launches' blocks take their work from:
// their grids are sized for the most work the plan can give a batch of their shape (IDLE below), not for every
// (sequence, segment, chunk) a batch of T tokens could hold (on batches of short sequences, those idle blocks
// were half the CP launches' time: benchmarks/results/cp-parts-H200.txt). A sequence of nb 16-token
// blocks is walked in nb / seg segments (at least one, at most P), seg the larger of CP_SEG_BLOCKS and the
// steps the GPU needs for the whole batch's walk unsplit (its blocks' steps over CP_RATE steps an SM): a
// segment shorter than that shortens nothing and adds its key rows, a chain step and its correction (equal
// sequences that fill the GPU ran 2-3x slower split, cp-parts-H200.txt), while one long sequence among
// short ones is still cut. The length mix decides, which shapes do not show the tuner.
// plan, int32: E, C, K (extra segments, correction chunks, sequences split), where ext, chunks and splits start,
// s[N], k0[N] (sequence n's segment p >= 1 is extra segment k0[n] + p - 1: its rows of B and A there), ext[2 e_max]
// (extra segment k: its sequence, p), chunks[2 c_max] (correction chunk j: its extra segment, its index in it),
// splits[e_max] (the sequences split). Segment p of s: blocks [p nb / s, (p + 1) nb / s) of the sequence's, the
// first starting at bos, the last ending at eos. The bounds on E and C: prefill_cp.py's cp_bounds.
#define PLAN_HEAD 6
#define CP_SEG_BLOCKS 16  // the fewest blocks a segment takes (8: 4 x 256 tokens in 2 segments each, 43% slower; cp-plan-ab-H200.txt)
#define CP_W 2           // warps a CP walk block (prefill_cp.py's CP_WALK reads it)
#define CP_NVB (128 / (16 * CP_W))
#define CP_RATE 2.0f     // walk block steps a busy SM completes in one lone block's step (1.3 under-split one long
                         // sequence: 16 value heads x 16,384 tokens 39% slower; cp-plan-ab-H200.txt)
#define FIX_BLOCKS 8     // 16-token blocks a correction block takes, all in flight at once
// IDLE: the CP launches' grids are sized for the most work a batch of their shape can hold, so blocks past the
// plan's work return at once; they still cost the blocks that work (the CP walk of 16 x 512 equal tokens at 4
// value heads, no sequence split: 27.7 us without idle blocks, 37.9 us with 544 behind the working ones, 47.6
// with them ahead; cp-plan-ab-H200.txt), hence bounds as tight as the plan's rule allows (cp_bounds).

__device__ __forceinline__ long long blocks_of(long long bos, long long eos) {
    return eos > bos ? (eos + 15) / 16 - bos / 16 : 0;
}

__device__ __forceinline__ void segment_of(long long bos, long long eos, int p, int s, long long& sbos,
                                           long long& seos) {
    const long long fb = bos / 16, nbk = blocks_of(bos, eos);
    const long long lo = 16 * (fb + p * nbk / s), hi = 16 * (fb + (p + 1) * nbk / s);
    sbos = lo > bos ? lo : bos;
    seos = hi < eos ? hi : eos;
    if (seos < sbos) seos = sbos;
}

__device__ __forceinline__ int segment_chunks(long long nbk, int p, int s) {
    return (int)(((p + 1) * nbk / s - p * nbk / s + FIX_BLOCKS - 1) / FIX_BLOCKS);
}

__device__ __forceinline__ long long warp_sum(long long x) {
#pragma unroll
    for (int d = 16; d; d >>= 1) x += __shfl_xor_sync(0xffffffffu, x, d);
    return x;
}

__device__ __forceinline__ int warp_scan(int x, int lane) {  // inclusive
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {
        const int y = __shfl_up_sync(0xffffffffu, x, d);
        if (lane >= d) x += y;
    }
    return x;
}

// One warp (a block of 32 threads: cu_valid's block-wide check). A malformed batch, or one past the bounds the
// host sized the grids for (no valid one is: prefill_cp.py's cp_bounds), is walked unsplit, its checks in
// segment 0 as ever.
template <typename CU>
__device__ void cp_plan(const CU* cu, int N, long long T, int hv, int P, int sms, int e_max, int c_max, int* plan) {
    const int lane = threadIdx.x;
    int *segs = plan + PLAN_HEAD, *k0 = segs + N, *ext = k0 + N, *chunk = ext + 2 * e_max, *splits = chunk + 2 * c_max;
    const bool ok = cu_valid(cu, N, T, lane, 32);
    long long work = 0;
    for (int i = lane; i < N; i += 32) work += ok ? blocks_of(cu[i], cu[i + 1]) : 0;
    const float busy = (float)warp_sum(work) * hv * CP_NVB / (CP_RATE * sms);
    const long long seg = busy > CP_SEG_BLOCKS ? (long long)ceilf(busy) : CP_SEG_BLOCKS;
    auto split = [&](int i, long long& nbk) {  // sequence i's segments
        nbk = ok ? blocks_of(cu[i], cu[i + 1]) : 0;
        const long long s = nbk / seg;
        return s < 1 ? 1 : s < P ? (int)s : P;
    };
    long long e = 0, c = 0;
    for (int i = lane; i < N; i += 32) {
        long long nbk;
        const int s = split(i, nbk);
        e += s - 1;
        for (int p = 1; p < s; ++p) c += segment_chunks(nbk, p, s);
    }
    const bool fits = warp_sum(e) <= e_max && warp_sum(c) <= c_max;
    int e0 = 0, c0 = 0, n0 = 0;  // extra segments, chunks and split sequences before this round's
    for (int base = 0; base < N; base += 32) {
        const int i = base + lane;
        long long nbk = 0;
        const int s = i < N && fits ? split(i, nbk) : 1;
        int cs = 0;
        for (int p = 1; p < s; ++p) cs += segment_chunks(nbk, p, s);
        const int ie = warp_scan(s - 1, lane), ic = warp_scan(cs, lane), in = warp_scan(s > 1, lane);
        if (i < N) {
            const int k = e0 + ie - (s - 1);
            int j = c0 + ic - cs;
            segs[i] = s;
            k0[i] = k;
            if (s > 1) splits[n0 + in - 1] = i;
            for (int p = 1; p < s; ++p) {
                ext[2 * (k + p - 1)] = i;
                ext[2 * (k + p - 1) + 1] = p;
                const int n = segment_chunks(nbk, p, s);
                for (int x = 0; x < n; ++x, ++j) {
                    chunk[2 * j] = k + p - 1;
                    chunk[2 * j + 1] = x;
                }
            }
        }
        e0 += __shfl_sync(0xffffffffu, ie, 31);
        c0 += __shfl_sync(0xffffffffu, ic, 31);
        n0 += __shfl_sync(0xffffffffu, in, 31);
    }
    if (lane == 0) {
        plan[0] = e0;
        plan[1] = c0;
        plan[2] = n0;
        plan[3] = (int)(ext - plan);
        plan[4] = (int)(chunk - plan);
        plan[5] = (int)(splits - plan);
    }
}

// The CP walk's blocks: every sequence's value rows of its segment 0 (grid N * HV * NVB), then the plan's extra
// segments' value rows and key rows (the rows of A, walked from the identity with no values), as many as the
// host's bound allows (e_max * HV * 2 NVB: IDLE).
struct PlannedSegments {
    static constexpr bool CP = true;
    template <int NVB>
    __device__ static __forceinline__ bool locate(const Args& A, Piece& w) {
        const unsigned first = (unsigned)A.N * A.hv * NVB;  // grids stay below 2^31 blocks
        const bool extra = blockIdx.x >= first;
        const unsigned i_b = extra ? blockIdx.x - first : blockIdx.x;
        const unsigned groups = extra ? 2 * NVB : NVB;
        w.i_g = i_b % groups;
        w.i_h = (i_b / groups) % A.hv;
        w.i_x = i_b / groups / A.hv;  // the sequence, or the extra segment
        // an extra block past the plan's segments has nothing to walk (a bad batch's plan has none; it
        // zeroes its outputs in segment 0, which every sequence has)
        if (extra && w.i_x >= A.plan[0]) return false;
        const int* ext = A.plan + A.plan[3];
        w.i_n = extra ? ext[2 * w.i_x] : w.i_x;
        w.p = extra ? ext[2 * w.i_x + 1] : 0;
        return true;
    }
    template <int NVB>
    __device__ static __forceinline__ bool key_block(const Args& A) {  // an extra segment's groups NVB .. 2 NVB - 1
        const unsigned first = (unsigned)A.N * A.hv * NVB;
        return blockIdx.x >= first && (blockIdx.x - first) % (2 * NVB) >= NVB;
    }
    template <typename CU>
    __device__ static __forceinline__ void cut(const Args& A, const CU* cu, long long i_n, int p, long long& bos,
                                               long long& eos) {
        segment_of(cu[i_n], cu[i_n + 1], p, A.plan[PLAN_HEAD + i_n], bos, eos);
    }
};

// ---- context parallel (CP): a sequence's segments walked at once, then put together ----
// The walk is linear in the state it starts from and in the values: a segment's value rows walked from
// zero give its outputs and final rows for a zero start (B), its key rows walked from the identity with
// no values give, as outputs, o~ with out += S o~ for a start S, and as final rows A with the segment's
// final state S A + B. So, with every segment walked at once (the walk with CP: segment 0 from the true
// state, its final state to the pool), the chain S_{p+1} = S_p A_p + B_p and the correction out += S_p o~
// over segment p's tokens give the sequential walk's outputs and final state, in bf16 products as the
// walk's own.

#define AROW 136  // bf16 an A row in shared memory (128 + 8, ldmatrix conflict-free)
#define BROW 136  // fp32 a B row (128 + 8: float2 reads conflict-free a half-warp)

// Block: the 16 rows v0 .. v0 + 15 of one (sequence, value head), 4 warps each computing 32 of the 128
// output columns (a warp's share of a step's products: 32 mma, not 128); A_p (bf16, AROW apart) and the
// block's 16 rows of B_p (fp32, BROW apart) staged a segment ahead in two buffers; the warps exchange S_p
// as bf16 rows in shared memory (SROW apart) every step, each keeping its own columns in fp32.
#define SROW 136
#define CHAIN_THREADS 128

template <typename CU, bool SLOTS>
__device__ __forceinline__ void chain(const Args& A) {
    constexpr u32 OFF_B = 128 * AROW * 2, STAGE = OFF_B + 16 * BROW * 4, OFF_S = 2 * STAGE;
    extern __shared__ __align__(128) unsigned char smem[];
    const u32 st0 = smem_addr(smem);
    const CU* cu = static_cast<const CU*>(A.cu);
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int i_vb = blockIdx.x % 8, i_h = (blockIdx.x / 8) % A.hv;
    const long long i_s = blockIdx.x / 8 / A.hv;  // the plan's split sequences; the others' walk left their state
    if (i_s >= A.plan[2]) return;  // before the check, as the walk's
    const long long i_n = A.plan[A.plan[5] + i_s];
    const int Pn = A.plan[PLAN_HEAD + i_n];
    const long long k0 = A.plan[PLAN_HEAD + A.N + i_n];  // its segment 1's place among the extra segments
    const Checked seq = check_sequence<CU, SLOTS>(A, cu, i_n, tid, CHAIN_THREADS);
    if (!(seq.ok && seq.live)) return;  // the walk zeroed the outputs and left the state
    const int v0 = i_vb * 16, vr = lane >> 2, t0 = (lane & 3) * 2, c0 = warp * 32;
    // this lane's fragments of the warp's columns: S[j], columns c0 + 8 j + t0 + {0, 1}, rows vr and vr + 8
    float* srow = A.state + seq.slot * A.s_slot + (long long)i_h * A.s_head + (long long)(v0 + vr) * A.s_row + c0;
    float S[4][4];  // S_1 = B_0: where segment 0's walk left it
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        const float2 lo = *reinterpret_cast<const float2*>(srow + 8 * j + t0);
        const float2 hi = *reinterpret_cast<const float2*>(srow + 8 * A.s_row + 8 * j + t0);
        S[j][0] = lo.x; S[j][1] = lo.y; S[j][2] = hi.x; S[j][3] = hi.y;
    }
    auto base = [&](int p) { return (((k0 + p - 1) * A.hv + i_h) * 128) * 128; };
    // this thread's 16-byte chunks: A rows ar + 8 i at column ac; B row br at columns bc + 16 i ... (4 each)
    const int ar = tid >> 4, ac = (tid & 15) * 8, br = tid >> 3, bc = (tid & 7) * 4;
    auto load = [&](u32 s, int p) {
        const bf16_t* ga = A.as + base(p) + ar * 128 + ac;
#pragma unroll
        for (int i = 0; i < 16; ++i) cp_async16(s + ((ar + 8 * i) * AROW + ac) * 2, ga + 8 * i * 128, true);
        const float* gb = A.bs + base(p) + (long long)(v0 + br) * 128 + bc;
#pragma unroll
        for (int i = 0; i < 4; ++i) cp_async16(s + OFF_B + (br * BROW + bc + 32 * i) * 4, gb + 32 * i, true);
    };
    auto share = [&]() {  // this warp's columns of S as bf16 rows, for every warp's A operand
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const u32 at = st0 + OFF_S + (vr * SROW + c0 + 8 * j + t0) * 2;
            asm volatile("st.shared.u32 [%0], %1;" ::"r"(at), "r"(pack_bf16(S[j][0], S[j][1])) : "memory");
            asm volatile("st.shared.u32 [%0], %1;" ::"r"(at + 8 * SROW * 2), "r"(pack_bf16(S[j][2], S[j][3]))
                         : "memory");
        }
    };
    load(st0, 1);
    cp_async_commit();
    share();
    const int krow = (((lane >> 3) & 1) << 3) + (lane & 7), kcol = (lane >> 4) << 3;  // ldmatrix .trans rows
    const u32 lm_a = (krow * AROW + kcol + c0) * 2, lm_b = OFF_B + (vr * BROW + c0 + t0) * 4;
    const u32 lm_s = OFF_S + ((lane & 15) * SROW + (lane >> 4) * 8) * 2;  // A-operand rows of S
    for (int p = 1; p < Pn; ++p) {
        const u32 s = st0 + ((p - 1) & 1) * STAGE;
        if (p + 1 < Pn) load(st0 + (p & 1) * STAGE, p + 1);
        cp_async_commit();
        cp_async_wait<1>();
        __syncthreads();  // A_p and B_p landed; every warp's columns of S_p shared
        u32 a[8][4];
#pragma unroll
        for (int kk = 0; kk < 8; ++kk) ldmatrix_x4(a[kk], st0 + lm_s + kk * 32);
        float acc[4][4];
        float* prow = A.bs + base(p) + (long long)(v0 + vr) * 128 + c0;  // S_p over B_p (now in shared memory)
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const float2 lo = lds_f2(s + lm_b + 8 * j * 4), hi = lds_f2(s + lm_b + (8 * BROW + 8 * j) * 4);
            acc[j][0] = lo.x; acc[j][1] = lo.y; acc[j][2] = hi.x; acc[j][3] = hi.y;
            *reinterpret_cast<float2*>(prow + 8 * j + t0) = make_float2(S[j][0], S[j][1]);
            *reinterpret_cast<float2*>(prow + 8 * 128 + 8 * j + t0) = make_float2(S[j][2], S[j][3]);
        }
#pragma unroll
        for (int kk = 0; kk < 8; ++kk)
#pragma unroll
            for (int np = 0; np < 2; ++np) {
                u32 b[4];
                ldmatrix_x4_trans(b, s + lm_a + (kk * 16 * AROW + np * 16) * 2);
                mma_bf16(acc[2 * np], a[kk], b[0], b[1]);
                mma_bf16(acc[2 * np + 1], a[kk], b[2], b[3]);
            }
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int c = 0; c < 4; ++c) S[j][c] = acc[j][c];
        __syncthreads();  // every warp done with this buffer and with the shared rows of S_p
        share();
    }
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        *reinterpret_cast<float2*>(srow + 8 * j + t0) = make_float2(S[j][0], S[j][1]);
        *reinterpret_cast<float2*>(srow + 8 * A.s_row + 8 * j + t0) = make_float2(S[j][2], S[j][3]);
    }
}

// Block: 16 W value rows of one (sequence, segment past the first, value head) and up to FIX_BLOCKS of the
// segment's 16-token blocks; S_p packed once as the A operand, o~ as the B operand (as the walk's K rows),
// out read through shared memory with o~, corrected, rewritten. A block's stage: o~ (16 rows of all 128
// keys, KROW apart), then its rows of out (16 rows, OROW apart).
template <int W, typename CU, bool SLOTS>
__device__ __forceinline__ void correct(const Args& A) {
    constexpr int ROWS = 16 * W, NVB = 128 / ROWS, THREADS = 32 * W, OROW = ROWS + 8;
    constexpr u32 OFF_OUT = 16 * KROW * 2, STAGE = OFF_OUT + 16 * OROW * 2;
    static_assert(THREADS == 16 * (ROWS / 8), "a thread an out chunk a block");
    extern __shared__ __align__(128) unsigned char smem[];
    const u32 st0 = smem_addr(smem);
    const CU* cu = static_cast<const CU*>(A.cu);
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    // the plan's chunks (FIX_BLOCKS blocks of one extra segment each), bounded by the host: a block past them
    // returns before the batch's check, as the walk's
    const int i_vb = blockIdx.x % NVB, i_h = (blockIdx.x / NVB) % A.hv;
    const long long i_c = blockIdx.x / NVB / A.hv;
    if (i_c >= A.plan[1]) return;
    const int* chunk = A.plan + A.plan[4] + 2 * i_c;
    const int* ext = A.plan + A.plan[3] + 2 * chunk[0];
    const long long i_n = ext[0], k = chunk[0];
    const int p = ext[1];
    long long bos, eos;
    segment_of(cu[i_n], cu[i_n + 1], p, A.plan[PLAN_HEAD + i_n], bos, eos);
    const long long b0 = bos / 16 + (long long)chunk[1] * FIX_BLOCKS, end = eos > bos ? (eos + 15) / 16 : 0;
    const long long b1 = b0 + FIX_BLOCKS < end ? b0 + FIX_BLOCKS : end;
    if (b0 >= b1) return;  // (a plan's chunks all hold blocks)
    const Checked seq = check_sequence<CU, SLOTS>(A, cu, i_n, tid, THREADS);
    if (!(seq.ok && seq.live)) return;
    const int v0 = i_vb * ROWS, vr = lane >> 2, t0 = (lane & 3) * 2, row = v0 + warp * 16 + vr;
    const long long out_t = (long long)A.hv * 128;
    const int len = (int)(eos - bos);
    {  // every block's o~ and out rows in flight, zero outside the segment
        const int orow = tid >> 4, oc = (tid & 15) * 8;                  // o~: rows orow + i THREADS / 16
        const int rrow = tid / (ROWS / 8), rc = (tid % (ROWS / 8)) * 8;  // out: one chunk a thread
        const bf16_t* obase = A.aux + bos * out_t + i_h * 128 + oc;
        const bf16_t* rbase = A.out + bos * out_t + i_h * 128 + v0 + rc;
        for (long long b = b0; b < b1; ++b) {
            const u32 s = st0 + (u32)(b - b0) * STAGE;
            const int rel = (int)(b * 16 - bos);
#pragma unroll
            for (int i = 0; i < 256 / THREADS; ++i) {
                const int r = orow + i * (THREADS / 16);
                const bool in = (unsigned)(rel + r) < (unsigned)len;
                cp_async16(s + (r * KROW + oc) * 2, in ? obase + (long long)(rel + r) * out_t : obase, in);
            }
            const bool in = (unsigned)(rel + rrow) < (unsigned)len;
            cp_async16(s + OFF_OUT + (rrow * OROW + rc) * 2, in ? rbase + (long long)(rel + rrow) * out_t : rbase, in);
        }
        cp_async_commit();
    }
    u32 a[8][4];  // S_p, this lane's rows, as the A operand (loaded while the copies fly)
    {
        const float* prow = A.bs + ((k * A.hv + i_h) * 128 + row) * 128;
#pragma unroll
        for (int kk = 0; kk < 8; ++kk)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const float2 lo = *reinterpret_cast<const float2*>(prow + 16 * kk + 8 * h + t0);
                const float2 hi = *reinterpret_cast<const float2*>(prow + 8 * 128 + 16 * kk + 8 * h + t0);
                a[kk][2 * h] = pack_bf16(lo.x, lo.y);
                a[kk][2 * h + 1] = pack_bf16(hi.x, hi.y);
            }
    }
    cp_async_wait<0>();
    __syncthreads();
    const int mrow = ((lane >> 4) << 3) + (lane & 7), mcol = ((lane >> 3) & 1) << 3;
    const int vw = warp * 16 + vr;
    const u32 lm = (mrow * KROW + mcol) * 2, lr = OFF_OUT + (t0 * OROW + vw) * 2;
    bf16_t* out = A.out + i_h * 128 + v0;
    for (long long b = b0; b < b1; ++b) {
        const u32 s = st0 + (u32)(b - b0) * STAGE;
        float acc[2][2][4] = {};
#pragma unroll
        for (int kk = 0; kk < 8; ++kk) {
            u32 ob[4];
            ldmatrix_x4(ob, s + lm + kk * 32);
            mma_bf16(acc[kk & 1][0], a[kk], ob[0], ob[1]);
            mma_bf16(acc[kk & 1][1], a[kk], ob[2], ob[3]);
        }
        const int rel = (int)(b * 16 - bos);
        bf16_t* ob = out + (b * 16 + t0) * out_t + vw;
#pragma unroll
        for (int n = 0; n < 2; ++n)
#pragma unroll
            for (int c = 0; c < 4; ++c) {
                const int dt = n * 8 + (c & 1), dv = (c >> 1) * 8;  // token and row offsets from (t0, vw)
                if ((unsigned)(rel + t0 + dt) < (unsigned)len)
                    ob[dt * out_t + dv] = f_to_bf16(bf16_to_f(lds_bf16(s + lr + (dt * OROW + dv) * 2))
                                                    + acc[0][n][c] + acc[1][n][c]);
            }
    }
}

// gdn_prefill_algebra_cp_<pool|contest>: prefill_walk.cu's first launch, then plan P sms e_max c_max; grid
// (blocks + 1, HQK), the last column making the plan.
#define GDN_ALGEBRA_CP_KERNEL(KIND, CONTEST, CU)                                                                 \
    extern "C" __global__ void __launch_bounds__(32) gdn_prefill_algebra_cp_##KIND(                               \
        GDN_ALGEBRA_PARAMS(CU), int* plan, int P, int sms, int e_max, int c_max) {                                \
        if (blockIdx.x == gridDim.x - 1) {                                                                        \
            if (blockIdx.y == 0) cp_plan<CU>(cu, N, T, hv, P, sms, e_max, c_max, plan);                           \
            return;                                                                                               \
        }                                                                                                         \
        algebra<CONTEST, CU>(GDN_ALGEBRA_ARGS);                                                                   \
    }
GDN_ALGEBRA_CP_KERNEL(pool, false, int)
GDN_ALGEBRA_CP_KERNEL(contest, true, long long)

// Parameters as prefill_walk.cu's kernels, plan aux bs as: the plan, o~ [T, HV, 128] bf16, B and S_p
// [e_max, HV, 128, 128] fp32, A the same in bf16 (prefill_cp.py's cp_bounds).
// gdn_prefill_walk_w<CP_W>_s4_<pool|contest>_cp: grid (N + 2 e_max) * HV * CP_NVB (PlannedSegments).
// gdn_prefill_cp_chain_<kind>: block CHAIN_THREADS threads, two stages of dynamic shared memory (chain's
// STAGE) and the rows of S, grid e_max * HV * 8.
// gdn_prefill_cp_correct_<kind>: block 128 threads, FIX_BLOCKS stages of dynamic shared memory (correct's STAGE),
// grid c_max * HV * 2.
GDN_WALK_KERNEL(2, 4, pool, int, true, PlannedSegments, _cp)
GDN_WALK_KERNEL(2, 4, contest, long long, false, PlannedSegments, _cp)
#define GDN_CP_KERNELS(KIND, CU, SLOTS)                                                                   \
    extern "C" __global__ void __launch_bounds__(CHAIN_THREADS) gdn_prefill_cp_chain_##KIND(GDN_KERNEL_PARAMS(CU)) { \
        chain<CU, SLOTS>(GDN_KERNEL_ARGS);                                                                 \
    }                                                                                                     \
    extern "C" __global__ void __launch_bounds__(128) gdn_prefill_cp_correct_##KIND(GDN_KERNEL_PARAMS(CU)) { \
        correct<4, CU, SLOTS>(GDN_KERNEL_ARGS);                                                           \
    }
GDN_CP_KERNELS(pool, int, true)
GDN_CP_KERNELS(contest, long long, false)
