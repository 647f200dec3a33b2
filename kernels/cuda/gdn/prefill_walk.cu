// Gated DeltaNet prefill, the walk of the staged kernel (kernels/triton/gdn/prefill_staged.py) on
// mma.sync: each sequence's 16-token blocks in order, the state in registers, reading the first
// launch's per-block matrices (T diag(beta), P: bf16 [16, 16] each) and per-token factors (Gamma rk,
// scale Gamma rq, exp(G_end - G) rk, exp(G_end): fp32 [4, 16]) of every (block, value head).
//
// The state's V rows evolve independently, so a warp owns 16 of them, S [16 rows, 128 keys] fp32 in
// mma accumulator fragments, and everything is computed transposed, rows of V as M:
//   X^T = V^T - (S K^T) diag(ak)        M 16, N 16 tokens, K 128 keys  (S as the A operand)
//   R^T = X^T (T diag(beta))^T          M 16, N 16, K 16               (X^T as the A operand)
//   O^T = (S Q^T) diag(aq) + R^T P^T    M 16, N 16, K 128 and 16
//   S   = exp(G_end) S + (R^T diag(ek)) K                              (R^T as the A operand)
// An accumulator fragment of m16n8k16 is, packed to bf16 pairs, the A fragment of the next product
// (rows lane / 4 and + 8, columns 2 (lane % 4) and + 1): the state and every intermediate stay in
// registers with no layout exchange, and warps share only the block's inputs in shared memory
// (K, Q, V rows, the two matrices, the factors), loaded by cp.async NST - 1 blocks ahead.
//
// A block of ROWS = 16 W rows (W warps) of one (sequence, value head); grid = N * HV * (128 / ROWS).
// Rows of the packed batch outside the sequence's piece of a block are zero-filled (K, Q, V, the
// matrices' rows) and their factors zeroed, so other sequences' values never enter.
// Device-side checks as prefill_staged.py's walk: a malformed cu_seqlens (not 0 = cu[0] <= ... <=
// cu[N] = T) zeroes the rows [n T / N, (n + 1) T / N) of this program's head and rows and touches no
// state; a slot outside [0, num_slots) zeroes the sequence's rows and touches no state; a sequence
// with no tokens writes its state back unchanged (zeros when it starts fresh).
// Header-free (NVRTC): bf16 as raw 16-bit patterns.

typedef unsigned short bf16_t;
typedef unsigned int u32;

#define KROW 136  // bf16 a K / Q row in shared memory: 128 + 8, rows 4 banks apart (ldmatrix conflict-free)
#define MROW 24   // bf16 a matrix row: 16 + 8, rows 12 banks apart

__device__ __forceinline__ u32 smem_addr(const void* p) {
    u32 r;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(r) : "l"(p));
    return r;
}

// Shared memory is addressed by 32-bit offsets from one converted base (smem_addr once a thread): a
// generic pointer converted at every copy and ldmatrix took ~155 of the loop's ~826 instructions a block
// (52 of them mma; nvcc 13.0's SASS), 1-7% of the walk's time (benchmarks/results/walk-ab-H200.txt).
__device__ __forceinline__ void cp_async16(u32 dst, const void* src, bool keep) {  // zero-fill unless keep
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(keep ? 16 : 0)
                 : "memory");
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory"); }

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

__device__ __forceinline__ float2 lds_f2(u32 addr) {
    float2 r;
    asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];" : "=f"(r.x), "=f"(r.y) : "r"(addr));
    return r;
}

__device__ __forceinline__ bf16_t lds_bf16(u32 addr) {
    bf16_t r;
    asm volatile("ld.shared.u16 %0, [%1];" : "=h"(r) : "r"(addr));
    return r;
}

__device__ __forceinline__ u32 pack_bf16(float lo, float hi) {  // lo -> low half (lower address)
    u32 r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

__device__ __forceinline__ float bf16_to_f(bf16_t x) { return __uint_as_float(((u32)x) << 16); }

__device__ __forceinline__ bf16_t f_to_bf16(float f) {
    bf16_t r;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r) : "f"(f));
    return r;
}

// Two accumulator tiles (16 x 8 each, columns 0-7 and 8-15) as one m16n8k16 A fragment, column c
// scaled by s[c] for this lane's four columns (2 (lane % 4) + {0, 1, 8, 9}).
__device__ __forceinline__ void as_a(u32* a, const float (*x)[4], const float* s) {
    a[0] = pack_bf16(x[0][0] * s[0], x[0][1] * s[1]);
    a[1] = pack_bf16(x[0][2] * s[0], x[0][3] * s[1]);
    a[2] = pack_bf16(x[1][0] * s[2], x[1][1] * s[3]);
    a[3] = pack_bf16(x[1][2] * s[2], x[1][3] * s[3]);
}

template <int ROWS>
struct Stage {  // one block's inputs
    bf16_t k[16][KROW];
    bf16_t q[16][KROW];
    bf16_t v[16][ROWS + 8];
    bf16_t tb[16][MROW];
    bf16_t p[16][MROW];
    float fac[4][16];
};

struct Args {
    const bf16_t* q; const bf16_t* k; const bf16_t* v; const bf16_t* mats; const float* fac;
    float* state; const int* slots; const unsigned char* init; const void* cu; bf16_t* out;
    long long T; int N, num_slots, hv, hqk, has_state;
    long long q_t, q_h, k_t, k_h, v_t, v_h, s_slot, s_head, s_row;
    const int* plan; bf16_t* aux; float* bs; bf16_t* as;  // CP: the batch's plan (cp_plan), key rows' outputs, B, A
};

// The cu_seqlens check every kernel here makes (block-wide, one __syncthreads_or): 0 = cu[0] <= ... <= cu[N] = T.
template <typename CU>
__device__ __forceinline__ bool cu_valid(const CU* cu, int N, long long T, int tid, int threads) {
    int bad = 0;
    for (long long i = tid; i <= N; i += threads) {
        const long long c = cu[i];
        bad |= (i == 0 && c != 0) | (i >= 1 && c < (long long)cu[i - 1]) | (i == N && c != T);
    }
    return !__syncthreads_or(bad);
}

// What every kernel here checks of sequence n before touching its state: the batch well formed (ok) and,
// for a pool, its slot inside it (live); the contest's state n is sequence n's.
struct Checked {
    bool ok, live;
    long long slot;
};
template <typename CU, bool SLOTS>
__device__ __forceinline__ Checked check_sequence(const Args& A, const CU* cu, long long i_n, int tid, int threads) {
    Checked c{cu_valid(cu, A.N, A.T, tid, threads), true, i_n};
    if (SLOTS) {
        c.slot = A.slots[i_n];
        c.live = c.slot >= 0 && c.slot < A.num_slots;
    }
    return c;
}

// A lane's state fragments S[j] (rows r and r + 8, columns 8 j + t0 + {0, 1}) to fp32 rows `stride` apart.
__device__ __forceinline__ void store_rows(float* row, long long stride, int t0, const float (*S)[4]) {
#pragma unroll
    for (int j = 0; j < 16; ++j) {
        *reinterpret_cast<float2*>(row + 8 * j + t0) = make_float2(S[j][0], S[j][1]);
        *reinterpret_cast<float2*>(row + 8 * stride + 8 * j + t0) = make_float2(S[j][2], S[j][3]);
    }
}

// ---- CP: the batch's plan, made by the first launch's last block (cp_plan) ----
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
// first starting at bos, the last ending at eos. The bounds on E and C: prefill_walk.py's cp_bounds.
#define PLAN_HEAD 6
#define CP_SEG_BLOCKS 16  // the fewest blocks a segment takes (8: 4 x 256 tokens in 2 segments each, 43% slower; cp-plan-ab-H200.txt)
#define CP_W 2           // warps a CP walk block (prefill_walk.py's CP_WALK reads it)
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
// host sized the grids for (no valid one is: prefill_walk.py's cp_bounds), is walked unsplit, its checks in
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

template <int W, int NST, typename CU, bool SLOTS, bool CP, bool KEYS>
__device__ __forceinline__ void walk(const Args& A) {
    constexpr int ROWS = 16 * W;
    constexpr int NVB = 128 / ROWS;
    constexpr int GROUPS = CP ? 2 * NVB : NVB;  // CP: NVB groups of value rows, then NVB of key rows
    constexpr int THREADS = 32 * W;
    static_assert(THREADS >= 64, "the matrices' copy takes a thread a chunk");
    extern __shared__ __align__(128) unsigned char smem[];
    Stage<ROWS>* st = reinterpret_cast<Stage<ROWS>*>(smem);  // NST stages: blocks b .. b + NST - 1 in flight
    const u32 st0 = smem_addr(smem);  // stage i at st0 + i * sizeof(Stage), its fields at their offsets
    constexpr u32 OFF_K = 0, OFF_Q = OFF_K + 16 * KROW * 2, OFF_V = OFF_Q + 16 * KROW * 2;
    constexpr u32 OFF_TB = OFF_V + 16 * (ROWS + 8) * 2, OFF_P = OFF_TB + 16 * MROW * 2, OFF_FAC = OFF_P + 16 * MROW * 2;
    static_assert(sizeof(Stage<ROWS>) == OFF_FAC + 4 * 16 * 4, "Stage's fields are packed in this order");

    const CU* cu = static_cast<const CU*>(A.cu);
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    // blocks: every sequence's value rows (CP: of its segment 0), then (CP) the plan's extra segments' value
    // rows and key rows (the rows of A, walked from the identity with no values), bounded by the host (IDLE)
    const unsigned first = (unsigned)A.N * A.hv * NVB;  // grids stay below 2^31 blocks
    const bool extra = CP && blockIdx.x >= first;
    const unsigned i_b = extra ? blockIdx.x - first : blockIdx.x;
    const unsigned groups = extra ? GROUPS : NVB;
    const int i_g = i_b % groups;
    const int i_h = (i_b / groups) % A.hv;
    const long long i_x = i_b / groups / A.hv;  // the sequence, or the extra segment
    // an extra block past the plan's segments returns before the batch's check (a bad batch's plan has
    // none; it zeroes its outputs in segment 0, which every sequence has)
    if (extra && i_x >= A.plan[0]) return;
    const int* ext = CP ? A.plan + A.plan[3] : nullptr;
    const long long i_n = extra ? ext[2 * i_x] : i_x;
    const int p = extra ? ext[2 * i_x + 1] : 0;
    constexpr bool keys = KEYS;  // (walk_any: i_g >= NVB)
    const int i_hk = i_h / (A.hv / A.hqk);
    const int v0 = (keys ? i_g - NVB : i_g) * ROWS;
    const long long out_t = (long long)A.hv * 128;  // output token stride
    bf16_t* out = (keys ? A.aux : A.out) + i_h * 128 + v0;

    const Checked seq = check_sequence<CU, SLOTS>(A, cu, i_n, tid, THREADS);
    const bool ok = seq.ok;
    const long long slot = seq.slot;
    long long bos = cu[i_n], eos = cu[i_n + 1];
    if (!(ok && seq.live)) {  // zero output rows, no state (CP: segment 0's value rows, over the sequence)
        if (p != 0 || keys) return;
        const long long lo = ok ? bos : i_n * A.T / A.N, hi = ok ? eos : (i_n + 1) * A.T / A.N;
        for (long long e = lo * (ROWS / 8) + tid; e < hi * (ROWS / 8); e += THREADS) {  // 16 bytes at a time
            bf16_t* row = out + (e / (ROWS / 8)) * out_t;
            *reinterpret_cast<uint4*>(row + (e % (ROWS / 8)) * 8) = make_uint4(0, 0, 0, 0);
        }
        return;
    }

    if (CP) segment_of(cu[i_n], cu[i_n + 1], p, A.plan[PLAN_HEAD + i_n], bos, eos);

    const int vr = lane >> 2, t0 = (lane & 3) * 2;  // fragment row (V row) and first column (token / key)
    const int row = v0 + warp * 16 + vr;            // this lane's first state row (a key row for `keys`)
    float* srow = A.state + slot * A.s_slot + (long long)i_h * A.s_head + (long long)row * A.s_row;
    // CP segments past the first: their rows of B (values) or A (keys), [e_max, HV, 128, 128]
    const long long cp_row = ((i_x * A.hv + i_h) * 128 + row) * 128;
    float S[16][4];  // S[v, 8 j + t0 + {0, 1}] rows vr and vr + 8
    const bool read = p == 0 && (SLOTS ? A.init[i_n] != 0 : A.has_state != 0);
#pragma unroll
    for (int j = 0; j < 16; ++j) {
        float2 lo = make_float2(0.f, 0.f), hi = lo;
        if (read) {
            lo = *reinterpret_cast<const float2*>(srow + 8 * j + t0);
            hi = *reinterpret_cast<const float2*>(srow + 8 * A.s_row + 8 * j + t0);
        }
        if (keys) {  // identity rows
            const int c = 8 * j + t0;
            lo = make_float2(c == row, c + 1 == row);
            hi = make_float2(c == row + 8, c + 1 == row + 8);
        }
        S[j][0] = lo.x; S[j][1] = lo.y; S[j][2] = hi.x; S[j][3] = hi.y;
    }

    // Rows are addressed relative to bos in 32 bits: a block's row r is in the piece when
    // (unsigned)(rel + r) < len, rel = 16 b - bos. Each thread copies the same chunks of every block:
    // K / Q rows kr + i THREADS / 16 at column kc, V row vrow at column vc, matrix rows and factors.
    const long long b0 = bos / 16, b1 = eos > bos ? (eos + 15) / 16 : b0;
    const int len = (int)(eos - bos);
    constexpr int KQ = 256 / THREADS;  // K / Q chunks a thread
    const int kr = tid >> 4, kc = (tid & 15) * 8;
    const int vrow = tid / (2 * W), vc = (tid % (2 * W)) * 8;  // V: 16 rows x ROWS / 8 chunks = one a thread
    const bf16_t* kbase = A.k + bos * A.k_t + (long long)i_hk * A.k_h + kc;
    const bf16_t* qbase = A.q + bos * A.q_t + (long long)i_hk * A.q_h + kc;
    const bf16_t* vbase = A.v + bos * A.v_t + (long long)i_h * A.v_h + v0 + vc;
    const long long kstep = (THREADS / 16) * A.k_t, qstep = (THREADS / 16) * A.q_t;
    // this thread's destinations within a stage (bytes)
    const u32 dst_kq = (kr * KROW + kc) * 2, dst_v = OFF_V + (vrow * (ROWS + 8) + vc) * 2;
    auto load = [&](u32 s, long long b) {  // s: the stage's shared address
        const int rel = (int)(b * 16 - bos);
        const bf16_t* kp = kbase + (long long)(rel + kr) * A.k_t;
        const bf16_t* qp = qbase + (long long)(rel + kr) * A.q_t;
#pragma unroll
        for (int i = 0; i < KQ; ++i) {
            const int r = kr + i * (THREADS / 16);
            const bool in = (unsigned)(rel + r) < (unsigned)len;
            const u32 d = s + dst_kq + i * (THREADS / 16) * KROW * 2;
            cp_async16(d + OFF_K, in ? kp : kbase, in);  // a row outside: zero-filled from a valid address
            cp_async16(d + OFF_Q, in ? qp : qbase, in);
            kp += kstep;
            qp += qstep;
        }
        if (!keys) {
            const bool vin = (unsigned)(rel + vrow) < (unsigned)len;
            cp_async16(s + dst_v, vin ? vbase + (long long)(rel + vrow) * A.v_t : vbase, vin);
        }
        const bf16_t* m = A.mats + (b * A.hv + i_h) * 512;
        if (tid < 64) {  // TB and P rows: 2 chunks each, a chunk a thread (a loop from tid took ~100 instructions)
            const int which = tid >> 5, r = (tid >> 1) & 15, c = (tid & 1) * 8;
            const bool in = (unsigned)(rel + r) < (unsigned)len;
            cp_async16(s + (which ? OFF_P : OFF_TB) + (r * MROW + c) * 2, m + which * 256 + r * 16 + c, in);
        }
        if (tid < 16) cp_async16(s + OFF_FAC + tid * 16, A.fac + (b * A.hv + i_h) * 64 + tid * 4, true);
    };

#pragma unroll
    for (int i = 0; i < NST - 1; ++i) {  // one commit group a block, empty past the sequence's last
        if (b0 + i < b1) load(st0 + i * (u32)sizeof(Stage<ROWS>), b0 + i);
        cp_async_commit();
    }
    const int mrow = ((lane >> 4) << 3) + (lane & 7), mcol = ((lane >> 3) & 1) << 3;  // ldmatrix x4 lane rows
    const int krow = (((lane >> 3) & 1) << 3) + (lane & 7), kcol = (lane >> 4) << 3;   // and transposed
    const int vw = warp * 16 + vr;  // this lane's first V row within the block
    // this lane's ldmatrix rows within a stage: K / Q (B operands), transposed K, the two matrices
    const u32 lm_kq = (mrow * KROW + mcol) * 2, lm_kt = OFF_K + (krow * KROW + kcol) * 2;
    const u32 lm_tb = OFF_TB + (mrow * MROW + mcol) * 2, lm_p = OFF_P + (mrow * MROW + mcol) * 2;
    int si = 0;  // block b's stage, (b - b0) % NST
    for (long long b = b0; b < b1; ++b) {
        Stage<ROWS>& s = st[si];
        const u32 sa = st0 + si * (u32)sizeof(Stage<ROWS>);
        const int sl = si == 0 ? NST - 1 : si - 1;  // (b - b0 + NST - 1) % NST: where block b + NST - 1 goes
        if (b + NST - 1 < b1) load(st0 + sl * (u32)sizeof(Stage<ROWS>), b + NST - 1);
        si = si == NST - 1 ? 0 : si + 1;
        cp_async_commit();
        cp_async_wait<NST - 1>();  // block b's group complete
        __syncthreads();

        // this lane's four token columns (2 (lane % 4) + {0, 1, 8, 9}) and their factors, zero outside the piece
        const int rel = (int)(b * 16 - bos);
        bool in[4];
        float ak[4], aq[4], ek[4];
#pragma unroll
        for (int c = 0; c < 4; ++c) {
            const int t = t0 + (c & 1) + (c >> 1) * 8;
            in[c] = (unsigned)(rel + t) < (unsigned)len;
            ak[c] = in[c] ? s.fac[0][t] : 0.f;
            aq[c] = in[c] ? s.fac[1][t] : 0.f;
            ek[c] = in[c] ? s.fac[2][t] : 0.f;
        }
        const float eg = s.fac[3][rel < 0 ? -rel : 0];

        // S K^T and S Q^T: the k-steps of 16 keys, K / Q rows as the B operand (ldmatrix, non-transposed)
        float xk[2][2][4] = {}, xq[2][2][4] = {};  // even and odd k-steps: two dependency chains each
#pragma unroll
        for (int kk = 0; kk < 8; ++kk) {
            const u32 a[4] = {pack_bf16(S[2 * kk][0], S[2 * kk][1]), pack_bf16(S[2 * kk][2], S[2 * kk][3]),
                              pack_bf16(S[2 * kk + 1][0], S[2 * kk + 1][1]),
                              pack_bf16(S[2 * kk + 1][2], S[2 * kk + 1][3])};
            u32 kb[4], qb[4];
            ldmatrix_x4(kb, sa + OFF_K + lm_kq + kk * 32);
            ldmatrix_x4(qb, sa + OFF_Q + lm_kq + kk * 32);
            mma_bf16(xk[kk & 1][0], a, kb[0], kb[1]);
            mma_bf16(xk[kk & 1][1], a, kb[2], kb[3]);
            mma_bf16(xq[kk & 1][0], a, qb[0], qb[1]);
            mma_bf16(xq[kk & 1][1], a, qb[2], qb[3]);
        }
        // X^T = V^T - (S K^T) diag(ak)
        float x[2][4];
#pragma unroll
        for (int n = 0; n < 2; ++n)
#pragma unroll
            for (int c = 0; c < 4; ++c) {
                const int t = n * 8 + t0 + (c & 1);
                const float vt = keys ? 0.f : bf16_to_f(s.v[t][vw + (c >> 1) * 8]);
                x[n][c] = vt - ak[n * 2 + (c & 1)] * (xk[0][n][c] + xk[1][n][c]);
            }
        const float one[4] = {1.f, 1.f, 1.f, 1.f};
        u32 a[4], mb[4];
        as_a(a, x, one);
        float r[2][4] = {};
        ldmatrix_x4(mb, sa + lm_tb);
        mma_bf16(r[0], a, mb[0], mb[1]);
        mma_bf16(r[1], a, mb[2], mb[3]);
        // O^T = (S Q^T) diag(aq) + R^T P^T
        float o[2][4];
#pragma unroll
        for (int n = 0; n < 2; ++n)
#pragma unroll
            for (int c = 0; c < 4; ++c) o[n][c] = (xq[0][n][c] + xq[1][n][c]) * aq[n * 2 + (c & 1)];
        as_a(a, r, one);
        ldmatrix_x4(mb, sa + lm_p);
        mma_bf16(o[0], a, mb[0], mb[1]);
        mma_bf16(o[1], a, mb[2], mb[3]);
        bf16_t* ob = out + (b * 16 + t0) * out_t + vw;
#pragma unroll
        for (int n = 0; n < 2; ++n)
#pragma unroll
            for (int c = 0; c < 4; ++c)
                if (in[n * 2 + (c & 1)]) ob[(n * 8 + (c & 1)) * out_t + (c >> 1) * 8] = f_to_bf16(o[n][c]);
        // S = exp(G_end) S + (R^T diag(ek)) K: K rows as the B operand, transposed by ldmatrix. The decay per
        // element, off the chain to the next block's products: one scalar for it instead (S as sigma S^) put a
        // multiply, a reciprocal and a branch on that chain, 13-27% slower (walk-issue-cut-ab-H200.txt and
        // walk-lazy-decay-ab-H200.txt)
        as_a(a, r, ek);
#pragma unroll
        for (int np = 0; np < 8; ++np) {
#pragma unroll
            for (int c = 0; c < 4; ++c) {
                S[2 * np][c] *= eg;
                S[2 * np + 1][c] *= eg;
            }
            u32 kb[4];
            ldmatrix_x4_trans(kb, sa + lm_kt + np * 32);
            mma_bf16(S[2 * np], a, kb[0], kb[1]);
            mma_bf16(S[2 * np + 1], a, kb[2], kb[3]);
        }
        __syncthreads();  // every warp done with s before the next iteration loads into it
    }
    if (keys) {  // A, bf16: the operand it will be
        bf16_t* arow = A.as + cp_row;
#pragma unroll
        for (int j = 0; j < 16; ++j) {
            *reinterpret_cast<u32*>(arow + 8 * j + t0) = pack_bf16(S[j][0], S[j][1]);
            *reinterpret_cast<u32*>(arow + 8 * 128 + 8 * j + t0) = pack_bf16(S[j][2], S[j][3]);
        }
        return;
    }
    store_rows(p == 0 ? srow : A.bs + cp_row, p == 0 ? A.s_row : 128, t0, S);
}

// The CP walk's key-row blocks (an extra segment's groups NVB .. 2 NVB - 1) and its value-row blocks as two
// instantiations, `keys` out of the block-step loop (the V rows' copies, X's values): 5-16% faster where
// sequences are split (cp-plan-ab-H200.txt).
template <int W, int NST, typename CU, bool SLOTS, bool CP>
__device__ __forceinline__ void walk_any(const Args& A) {
    constexpr unsigned NVB = 128 / (16 * W);
    const unsigned first = (unsigned)A.N * A.hv * NVB;
    if (CP && blockIdx.x >= first && (blockIdx.x - first) % (2 * NVB) >= NVB)
        walk<W, NST, CU, SLOTS, CP, true>(A);
    else
        walk<W, NST, CU, SLOTS, CP, false>(A);
}

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

// ---- the first launch in CUDA ----
// What prefill_staged.py's Triton `_chunk_algebra_kernel` computes, for the walk above: one warp a (16-token
// block b of the packed batch, q/k head). Its K and Q rows (zeros past T) land in shared memory; K K^T and
// Q K^T on mma.sync (fp32 accumulators, a lane's rows lane / 4 and + 8, columns 8 n + 2 (lane % 4) + {0, 1});
// for the engines' conventions each row's inverse L2 norm from its squares (the contest's q/k come
// normalised). Then for the value heads of the q/k head, two at a time (lanes 0-15 the even one of a pair,
// 16-31 the odd one, lane % 16 = row t): the rows' gates (the engines' activated g and beta; the contest's
// raw a, b activated here: g = -exp(A_log) softplus(a + dt_bias), beta = sigmoid(b)), the cumulative log
// decay G within each sequence piece of the block (pieces start where cu_seqlens has a boundary inside the
// block), A = strictly lower (K K^T diag-scaled by the norms, beta_i, exp(G_i - G_j)) of pairs in one
// piece, T = (I + A)^-1 by forward substitution (a lane a column of its head), and the walk's inputs:
// TB = T diag(beta) and P (bf16 [16, 16] each at mats + (b HV + h) 512) and the factors (fp32 [4, 16] at
// fac + (b HV + h) 64): Gamma rk, scale Gamma rq, exp(G_end - G) rk, exp(G_end); zero past T.
// cu_seqlens is only scanned for boundaries: a malformed batch gives values the walk never reads (it
// checks cu_seqlens itself). Grid (blocks, HQK), 32 threads; HV / HQK <= ALG_HEADS.
#define ALG_ROW 136   // bf16 a K / Q row in shared memory, as KROW
#define ALG_HEADS 4   // value heads a q/k head at most (2 in every definition here)
#define ALG_PAIRS (ALG_HEADS / 2)

// Row t's log decay g and write strength beta of value head h (zeros past T).
template <bool CONTEST>
__device__ __forceinline__ void gate_values(const void* g, const void* beta, const float* A_log, const float* dt_bias,
                                            long long t, long long g_t, long long b_t, int h, bool in, float& gv,
                                            float& bv) {
    gv = bv = 0.f;
    if (!in) return;
    if (CONTEST) {
        const float x = bf16_to_f(static_cast<const bf16_t*>(g)[t * g_t + h]) + dt_bias[h];
        const float softplus = x > 20.f ? x : log1pf(expf(x));  // torch's softplus (threshold 20)
        gv = -expf(A_log[h]) * softplus;
        bv = 1.f / (1.f + expf(-bf16_to_f(static_cast<const bf16_t*>(beta)[t * b_t + h])));
    } else {
        gv = static_cast<const float*>(g)[t * g_t + h];
        bv = static_cast<const float*>(beta)[t * b_t + h];
    }
}

template <bool CONTEST, typename CU>
__device__ __forceinline__ void algebra(const bf16_t* q, const bf16_t* k, const void* g, const void* beta,
                                        const float* A_log, const float* dt_bias, const CU* cu, bf16_t* mats,
                                        float* fac, float scale, long long T, int N, int hv, int hqk, long long q_t,
                                        long long q_h, long long k_t, long long k_h, long long g_t, long long b_t,
                                        int* plan, int P, int sms, int e_max, int c_max) {
    if (plan != nullptr && blockIdx.x == gridDim.x - 1) {  // CP: the grid's last column makes the plan
        if (blockIdx.y == 0) cp_plan<CU>(cu, N, T, hv, P, sms, e_max, c_max, plan);
        return;
    }
    __shared__ __align__(128) bf16_t kq[2][16][ALG_ROW];  // K rows, Q rows
    __shared__ float am[2][16][17];                       // A (fp32) of a pair's two heads, read row by row
    const int lane = threadIdx.x;
    const long long r0 = (long long)blockIdx.x * 16;
    const int hk = blockIdx.y;
    const u32 s0 = smem_addr(kq);
#pragma unroll
    for (int i = 0; i < 8; ++i) {  // 16 rows x 16 chunks each of K and Q, 8 chunks a lane each
        const int e = lane + 32 * i, r = e >> 4, c = (e & 15) * 8;
        const bool in = r0 + r < T;
        const long long row = in ? r0 + r : 0;
        cp_async16(s0 + (r * ALG_ROW + c) * 2, k + row * k_t + hk * k_h + c, in);
        cp_async16(s0 + ((16 + r) * ALG_ROW + c) * 2, q + row * q_t + hk * q_h + c, in);
    }
    cp_async_commit();
    // row t's gates of this lane's heads (half hf: heads hf, hf + 2), in flight with the rows
    const int t = lane & 15, hf = lane >> 4, vph = hv / hqk;
    const bool vt = r0 + t < T;
    float gts[ALG_PAIRS], bts[ALG_PAIRS];
#pragma unroll
    for (int x = 0; x < ALG_PAIRS; ++x)
        gate_values<CONTEST>(g, beta, A_log, dt_bias, r0 + t, g_t, b_t, hk * vph + 2 * x + hf, vt && 2 * x + hf < vph,
                             gts[x], bts[x]);
    // sequence starts inside the block (bit t: a sequence starts at row t, 0 < t < 16)
    unsigned starts = 0;
    for (int j = lane; j <= N; j += 32) {
        const long long s = (long long)cu[j] - r0;
        if (s > 0 && s < 16) starts |= 1u << s;
    }
    starts = __reduce_or_sync(0xffffffffu, starts);
    cp_async_wait<0>();
    __syncwarp();

    // inverse norms: lanes 2 r and 2 r + 1 sum row r's squares, half a row each
    float rk_own = 1.f, rq_own = 1.f;  // of row lane / 2
    if (!CONTEST) {
        float sk = 0.f, sq = 0.f;
        const bf16_t* kr = &kq[0][lane >> 1][(lane & 1) * 64];
        const bf16_t* qr = &kq[1][lane >> 1][(lane & 1) * 64];
#pragma unroll
        for (int c = 0; c < 64; c += 8) {
            const uint4 kv = *reinterpret_cast<const uint4*>(kr + c), qv = *reinterpret_cast<const uint4*>(qr + c);
            const u32 kw[4] = {kv.x, kv.y, kv.z, kv.w}, qw[4] = {qv.x, qv.y, qv.z, qv.w};
#pragma unroll
            for (int w = 0; w < 4; ++w) {
                const float k0 = __uint_as_float(kw[w] << 16), k1 = __uint_as_float(kw[w] & 0xffff0000u);
                const float q0 = __uint_as_float(qw[w] << 16), q1 = __uint_as_float(qw[w] & 0xffff0000u);
                sk = fmaf(k0, k0, fmaf(k1, k1, sk));
                sq = fmaf(q0, q0, fmaf(q1, q1, sq));
            }
        }
        sk += __shfl_xor_sync(0xffffffffu, sk, 1);
        sq += __shfl_xor_sync(0xffffffffu, sq, 1);
        rk_own = rsqrtf(sk + 1e-6f);
        rq_own = rsqrtf(sq + 1e-6f);
    }

    // K K^T and Q K^T: K / Q rows as the A operand, K rows as the B operand (as the walk's S K^T)
    float kk[2][4] = {}, qk[2][4] = {};
    {
        const int mrow = ((lane >> 4) << 3) + (lane & 7), mcol = ((lane >> 3) & 1) << 3;
        const u32 la = ((lane & 15) * ALG_ROW + (lane >> 4) * 8) * 2, lb = (mrow * ALG_ROW + mcol) * 2;
#pragma unroll
        for (int s = 0; s < 8; ++s) {
            u32 ak[4], aq[4], kb[4];
            ldmatrix_x4(ak, s0 + la + s * 32);
            ldmatrix_x4(aq, s0 + 16 * ALG_ROW * 2 + la + s * 32);
            ldmatrix_x4(kb, s0 + lb + s * 32);
            mma_bf16(kk[0], ak, kb[0], kb[1]);
            mma_bf16(kk[1], ak, kb[2], kb[3]);
            mma_bf16(qk[0], aq, kb[0], kb[1]);
            mma_bf16(qk[1], aq, kb[2], kb[3]);
        }
    }

    // this lane's fragment rows (i0, i0 + 8) and columns (8 n + jc + e), with their norms and pieces
    const int i0 = lane >> 2, jc = (lane & 3) * 2;
    auto piece = [&](int r) { return __popc(starts & ((2u << r) - 1u)); };
    float rk_i[2], rq_i[2], rk_j[4];
    int pi[2], pj[4];
    bool vi[2], vj[4];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int r = i0 + 8 * h;
        rk_i[h] = __shfl_sync(0xffffffffu, rk_own, 2 * r);
        rq_i[h] = __shfl_sync(0xffffffffu, rq_own, 2 * r);
        pi[h] = piece(r);
        vi[h] = r0 + r < T;
    }
#pragma unroll
    for (int c = 0; c < 4; ++c) {
        const int j = 8 * (c >> 1) + jc + (c & 1);
        rk_j[c] = __shfl_sync(0xffffffffu, rk_own, 2 * j);
        pj[c] = piece(j);
        vj[c] = r0 + j < T;
    }
    // row t's piece, its last row in the block, and its norms
    const int pt = piece(t);
    const unsigned later = starts & ~((2u << t) - 1u);
    const int last = later ? __ffs(later) - 2 : 15;
    const float rk_t = __shfl_sync(0xffffffffu, rk_own, 2 * t), rq_t = __shfl_sync(0xffffffffu, rq_own, 2 * t);

#pragma unroll
    for (int x = 0; x < ALG_PAIRS; ++x) {
        if (2 * x >= vph) break;
        const bool mine = 2 * x + hf < vph;  // this half's head exists (an odd count leaves lanes 16-31 idle)
        const int h = hk * vph + 2 * x + hf;
        const float bt = bts[x];
        float G = gts[x];  // inclusive scan within the piece, each half its own head
#pragma unroll
        for (int d = 1; d < 16; d <<= 1) {
            const float o = __shfl_up_sync(0xffffffffu, G, d, 16);
            if (t >= d && piece(t - d) == pt) G += o;
        }
        const float G_end = __shfl_sync(0xffffffffu, G, last, 16);
        if (mine) {
            float* f = fac + ((long long)blockIdx.x * hv + h) * 64 + t;
            const float gam = expf(G);
            f[0] = vt ? gam * rk_t : 0.f;
            f[16] = vt ? scale * gam * rq_t : 0.f;
            f[32] = vt ? expf(G_end - G) * rk_t : 0.f;
            f[48] = vt ? expf(G_end) : 0.f;
        }
#pragma unroll
        for (int e = 0; e < 2; ++e) {  // the pair's heads' A and P, every lane its fragment
            if (2 * x + e >= vph) break;
            float Gi[2], bi[2], Gj[4];
#pragma unroll
            for (int y = 0; y < 2; ++y) {
                Gi[y] = __shfl_sync(0xffffffffu, G, 16 * e + i0 + 8 * y);
                bi[y] = __shfl_sync(0xffffffffu, bt, 16 * e + i0 + 8 * y);
            }
#pragma unroll
            for (int c = 0; c < 4; ++c) Gj[c] = __shfl_sync(0xffffffffu, G, 16 * e + 8 * (c >> 1) + jc + (c & 1));
            bf16_t* mat = mats + ((long long)blockIdx.x * hv + hk * vph + 2 * x + e) * 512;
#pragma unroll
            for (int n = 0; n < 2; ++n)
#pragma unroll
                for (int y = 0; y < 2; ++y) {  // rows i0 + 8 y, columns 8 n + jc + {0, 1}
                    const int i = i0 + 8 * y;
                    float a2[2], p2[2];
#pragma unroll
                    for (int s = 0; s < 2; ++s) {
                        const int c = 2 * n + s, j = 8 * n + jc + s;
                        const bool same = vi[y] && vj[c] && pi[y] == pj[c] && j <= i;
                        const float dec = same ? expf(Gi[y] - Gj[c]) : 0.f;
                        a2[s] = j < i ? kk[n][2 * y + s] * rk_i[y] * rk_j[c] * bi[y] * dec : 0.f;
                        p2[s] = qk[n][2 * y + s] * scale * rq_i[y] * rk_j[c] * dec;
                        am[e][i][j] = a2[s];
                    }
                    *reinterpret_cast<u32*>(mat + 256 + i * 16 + 8 * n + jc) = pack_bf16(p2[0], p2[1]);
                }
        }
        __syncwarp();
        // T = (I + A)^-1, unit lower: lane t of each half walks column t of its head down the rows
        float col[16];
#pragma unroll
        for (int i = 0; i < 16; ++i) {
            float s[2] = {0.f, 0.f};  // two dependency chains
#pragma unroll
            for (int kx = 0; kx < i; ++kx) s[kx & 1] = fmaf(am[hf][i][kx], col[kx], s[kx & 1]);
            col[i] = i == t ? 1.f : (i > t ? -(s[0] + s[1]) : 0.f);
        }
        if (mine) {
            bf16_t* mat = mats + ((long long)blockIdx.x * hv + h) * 512;
#pragma unroll
            for (int i = 0; i < 16; ++i) mat[i * 16 + t] = f_to_bf16(col[i] * bt);
        }
        __syncwarp();  // every lane done with A before the next pair writes it
    }
}

// gdn_prefill_algebra_<pool|contest>: q k g beta A_log dt_bias cu_seqlens mats fac, scale, T, N, HV, HQK, the
// q / k token and head strides, g's and beta's token strides, then CP's plan P sms e_max c_max (null and zeros
// otherwise; with a plan, the grid has one more column, which makes it: cp_plan). pool: g, beta fp32
// (activated), int32 cu_seqlens, A_log / dt_bias unused; contest: a, b bf16 as g, beta, A_log and dt_bias fp32
// [HV], int64.
#define GDN_ALGEBRA_KERNEL(KIND, CONTEST, CU)                                                                      \
    extern "C" __global__ void __launch_bounds__(32) gdn_prefill_algebra_##KIND(                                    \
        const bf16_t* q, const bf16_t* k, const void* g, const void* beta, const float* A_log, const float* dt_bias, \
        const CU* cu, bf16_t* mats, float* fac, float scale, long long T, int N, int hv, int hqk, long long q_t,    \
        long long q_h, long long k_t, long long k_h, long long g_t, long long b_t, int* plan, int P, int sms,      \
        int e_max, int c_max) {                                                                                     \
        algebra<CONTEST, CU>(q, k, g, beta, A_log, dt_bias, cu, mats, fac, scale, T, N, hv, hqk, q_t, q_h, k_t,      \
                             k_h, g_t, b_t, plan, P, sms, e_max, c_max);                                           \
    }
GDN_ALGEBRA_KERNEL(pool, false, int)
GDN_ALGEBRA_KERNEL(contest, true, long long)

// Kernels. Parameters, all of them: q k v mats fac state slots init cu_seqlens out, T, N, num_slots, HV,
// HQK, has_state, the six q/k/v token and head strides, the state's slot, head and row strides
// (elements), then plan aux bs as (CP: the first launch's plan, o~ [T, HV, 128] bf16, B and S_p
// [e_max, HV, 128, 128] fp32, A the same in bf16; null otherwise). pool: int32 cu_seqlens, slots and
// has_initial_state; contest: int64 cu_seqlens, state n is sequence n's (has_state: read it).
// gdn_prefill_walk_w<W>_s<NST>_<pool|contest>[_cp]: block 32 W threads, NST stages of dynamic shared
// memory (stage_bytes<W>() each), grid N * HV * (128 / (16 W)), with _cp (W = CP_W) e_max * HV * 2 (128 / (16 W))
// blocks more (prefill_walk.py's cp_bounds).
// gdn_prefill_cp_chain_<kind>: block CHAIN_THREADS threads, two stages of dynamic shared memory (chain's
// STAGE) and the rows of S, grid e_max * HV * 8.
// gdn_prefill_cp_correct_<kind>: block 128 threads, FIX_BLOCKS stages of dynamic shared memory (correct's STAGE),
// grid c_max * HV * 2.
#define GDN_KERNEL_PARAMS(CU)                                                                         \
    const bf16_t *q, const bf16_t *k, const bf16_t *v, const bf16_t *mats, const float *fac,         \
        float *state, const int *slots, const unsigned char *init, const CU *cu, bf16_t *out,        \
        long long T, int N, int num_slots, int hv, int hqk, int has_state, long long q_t,            \
        long long q_h, long long k_t, long long k_h, long long v_t, long long v_h, long long s_slot, \
        long long s_head, long long s_row, const int *plan, bf16_t *aux, float *bs, bf16_t *as
#define GDN_KERNEL_ARGS                                                                              \
    Args { q, k, v, mats, fac, state, slots, init, cu, out, T, N, num_slots, hv, hqk, has_state,     \
           q_t, q_h, k_t, k_h, v_t, v_h, s_slot, s_head, s_row, plan, aux, bs, as }
#define GDN_WALK_KERNEL(W, NST, KIND, CU, SLOTS, CP, SUFFIX)                                             \
    extern "C" __global__ void __launch_bounds__(32 * W)                                                 \
        gdn_prefill_walk_w##W##_s##NST##_##KIND##SUFFIX(GDN_KERNEL_PARAMS(CU)) {                         \
        walk_any<W, NST, CU, SLOTS, CP>(GDN_KERNEL_ARGS);                                                \
    }
#define GDN_WALK_KERNELS(W, NST)                                \
    GDN_WALK_KERNEL(W, NST, pool, int, true, false, )           \
    GDN_WALK_KERNEL(W, NST, contest, long long, false, false, ) \
    GDN_WALK_KERNEL(W, NST, pool, int, true, true, _cp)         \
    GDN_WALK_KERNEL(W, NST, contest, long long, false, true, _cp)
#define GDN_CP_KERNELS(KIND, CU, SLOTS)                                                                   \
    extern "C" __global__ void __launch_bounds__(CHAIN_THREADS) gdn_prefill_cp_chain_##KIND(GDN_KERNEL_PARAMS(CU)) { \
        chain<CU, SLOTS>(GDN_KERNEL_ARGS);                                                                 \
    }                                                                                                     \
    extern "C" __global__ void __launch_bounds__(128) gdn_prefill_cp_correct_##KIND(GDN_KERNEL_PARAMS(CU)) { \
        correct<4, CU, SLOTS>(GDN_KERNEL_ARGS);                                                           \
    }

// prefill_walk.py's KERNELS (the others measured on the H200 grid, gdn-fused-grid-H200.txt, never won
// by more than 1%)
GDN_WALK_KERNELS(2, 4)
GDN_WALK_KERNELS(4, 4)
GDN_CP_KERNELS(pool, int, true)
GDN_CP_KERNELS(contest, long long, false)
