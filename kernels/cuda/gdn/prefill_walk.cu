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
    const int* plan; bf16_t* aux; float* bs; bf16_t* as;  // CP (prefill_cp.cu): the batch's plan, key rows' outputs, B, A
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

// ---- what a walk block walks: its Plan ----
// A block's piece of the batch: the sequence, its segment p (0: the first, or the whole sequence) and, past
// the first, the segment's place among the scratch rows (i_x), the group of 16 W rows (NVB and above: key
// rows) and the value head. The staged walk's Plan is WholeSequences; prefill_cp.cu's PlannedSegments gives
// the CP walk's (Plan::CP: the segment semantics below, key rows and scratch, are the walk's own).
struct Piece {
    long long i_n, i_x;
    int p, i_g, i_h;
};

// Every block a group of value rows of one (sequence, value head), the whole sequence: grid N * HV * NVB.
struct WholeSequences {
    static constexpr bool CP = false;
    template <int NVB>
    __device__ static __forceinline__ bool locate(const Args& A, Piece& w) {
        const unsigned i_b = blockIdx.x;
        w.i_g = i_b % NVB;
        w.i_h = (i_b / NVB) % A.hv;
        w.i_n = w.i_x = i_b / NVB / A.hv;
        w.p = 0;
        return true;
    }
    template <int NVB>
    __device__ static __forceinline__ bool key_block(const Args&) { return false; }
    template <typename CU>
    __device__ static __forceinline__ void cut(const Args&, const CU*, long long, int, long long&, long long&) {}
};

template <int W, int NST, typename CU, bool SLOTS, typename Plan, bool KEYS>
__device__ __forceinline__ void walk(const Args& A) {
    constexpr int ROWS = 16 * W;
    constexpr int NVB = 128 / ROWS;
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
    Piece piece;  // a block with nothing to walk returns before the batch's check (Plan::locate)
    if (!Plan::template locate<NVB>(A, piece)) return;
    const long long i_n = piece.i_n, i_x = piece.i_x;
    const int p = piece.p, i_g = piece.i_g, i_h = piece.i_h;
    constexpr bool keys = KEYS;  // CP key rows (walk_any: Plan::key_block)
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

    Plan::cut(A, cu, i_n, p, bos, eos);  // CP: the segment's part of the sequence

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

// CP's key-row blocks and value-row blocks as two instantiations, `keys` out of the block-step loop (the V
// rows' copies, X's values): 5-16% faster where sequences are split (cp-plan-ab-H200.txt).
template <int W, int NST, typename CU, bool SLOTS, typename Plan>
__device__ __forceinline__ void walk_any(const Args& A) {
    if (Plan::template key_block<128 / (16 * W)>(A))
        walk<W, NST, CU, SLOTS, Plan, true>(A);
    else
        walk<W, NST, CU, SLOTS, Plan, false>(A);
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
                                        long long q_h, long long k_t, long long k_h, long long g_t, long long b_t) {
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
// q / k token and head strides, g's and beta's token strides. pool: g, beta fp32 (activated), int32
// cu_seqlens, A_log / dt_bias unused; contest: a, b bf16 as g, beta, A_log and dt_bias fp32 [HV], int64.
// (prefill_cp.cu's gdn_prefill_algebra_cp_<kind>: the same, its grid one column wider, which makes CP's plan.)
#define GDN_ALGEBRA_PARAMS(CU)                                                                                   \
    const bf16_t *q, const bf16_t *k, const void *g, const void *beta, const float *A_log, const float *dt_bias, \
        const CU *cu, bf16_t *mats, float *fac, float scale, long long T, int N, int hv, int hqk, long long q_t, \
        long long q_h, long long k_t, long long k_h, long long g_t, long long b_t
#define GDN_ALGEBRA_ARGS q, k, g, beta, A_log, dt_bias, cu, mats, fac, scale, T, N, hv, hqk, q_t, q_h, k_t, k_h, g_t, b_t
#define GDN_ALGEBRA_KERNEL(KIND, CONTEST, CU)                                                                   \
    extern "C" __global__ void __launch_bounds__(32) gdn_prefill_algebra_##KIND(GDN_ALGEBRA_PARAMS(CU)) {       \
        algebra<CONTEST, CU>(GDN_ALGEBRA_ARGS);                                                                  \
    }
GDN_ALGEBRA_KERNEL(pool, false, int)
GDN_ALGEBRA_KERNEL(contest, true, long long)

// Kernels. Parameters, all of them: q k v mats fac state slots init cu_seqlens out, T, N, num_slots, HV,
// HQK, has_state, the six q/k/v token and head strides, the state's slot, head and row strides
// (elements), then plan aux bs as (CP's: prefill_cp.cu; null here). pool: int32 cu_seqlens, slots and
// has_initial_state; contest: int64 cu_seqlens, state n is sequence n's (has_state: read it).
// gdn_prefill_walk_w<W>_s<NST>_<pool|contest>: block 32 W threads, NST stages of dynamic shared memory
// (stage_bytes<W>() each), grid N * HV * (128 / (16 W)).
#define GDN_KERNEL_PARAMS(CU)                                                                         \
    const bf16_t *q, const bf16_t *k, const bf16_t *v, const bf16_t *mats, const float *fac,         \
        float *state, const int *slots, const unsigned char *init, const CU *cu, bf16_t *out,        \
        long long T, int N, int num_slots, int hv, int hqk, int has_state, long long q_t,            \
        long long q_h, long long k_t, long long k_h, long long v_t, long long v_h, long long s_slot, \
        long long s_head, long long s_row, const int *plan, bf16_t *aux, float *bs, bf16_t *as
#define GDN_KERNEL_ARGS                                                                              \
    Args { q, k, v, mats, fac, state, slots, init, cu, out, T, N, num_slots, hv, hqk, has_state,     \
           q_t, q_h, k_t, k_h, v_t, v_h, s_slot, s_head, s_row, plan, aux, bs, as }
#define GDN_WALK_KERNEL(W, NST, KIND, CU, SLOTS, PLAN, SUFFIX)                                           \
    extern "C" __global__ void __launch_bounds__(32 * W)                                                 \
        gdn_prefill_walk_w##W##_s##NST##_##KIND##SUFFIX(GDN_KERNEL_PARAMS(CU)) {                         \
        walk_any<W, NST, CU, SLOTS, PLAN>(GDN_KERNEL_ARGS);                                              \
    }
#define GDN_WALK_KERNELS(W, NST)                                         \
    GDN_WALK_KERNEL(W, NST, pool, int, true, WholeSequences, )           \
    GDN_WALK_KERNEL(W, NST, contest, long long, false, WholeSequences, )

// prefill_walk.py's KERNELS (the others measured on the H200 grid, gdn-fused-grid-H200.txt, never won
// by more than 1%)
GDN_WALK_KERNELS(2, 4)
GDN_WALK_KERNELS(4, 4)
