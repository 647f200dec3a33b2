// Gated DeltaNet prefill for short sequences: the recurrence run token by token with the state in
// registers.  Two conventions, one kernel template:
//   gdn_prefill_qk4_v8_d128_k_last (the contest's): q, k already L2-normalised, raw gates a/b, one
//   contiguous state per sequence, int64 cu_seqlens;
//   gdn_prefill_pool_* (the engines'): q, k raw and L2-normalised here (eps 1e-6), gates activated by
//   the engine (g = log decay, beta; fp32), the states in a pool [slots, HV, V, K] through int32 slot
//   indices and a has_initial_state mask, int32 cu_seqlens, q/k/v strided views; HV = 4, 8, 16, 32.
//
// Contest shapes (contiguous; T = total tokens, N = sequences, D = 128):
//   q, k  [T, 4, 128] bf16     v [T, 8, 128] bf16      a, b [T, 8] bf16
//   state [N, 8, 128(V), 128(K)] fp32 k-last, read and written IN PLACE
//   A_log, dt_bias [8] fp32    cu_seqlens [N + 1] int64 (read on the device)   out [T, 8, 128] bf16
// Pool shapes: q, k [T, HV/2, 128] and v [T, HV, 128] bf16 (token and head strides `Layout`, last
// dimension contiguous), g, beta [T, HV] fp32 (token stride), pool [slots, HV, 128, 128] fp32 (slot,
// head and row strides), slots [N] int32 (outside [0, num_slots): a padding sequence, zero output,
// nothing read or written), has_init [N] bool (false: start from zeros), cu_seqlens [N + 1] int32,
// out [T, HV, 128] bf16 contiguous.  A live sequence with no tokens still writes its state back (zeros
// without has_init), as the reference does.
// For each sequence n, v-head h (q/k head h / 2), token t in order:
//   g = exp(-exp(A_log[h]) * softplus(a[t,h] + dt_bias[h])),  beta = sigmoid(b[t,h])   (pool: given)
//   for each V row r:  old = g * (S[r] . k_t);  delta = beta * (v[t,h,r] - old)
//                      S[r] = g * S[r] + delta * k_t;  out[t,h,r] = scale * (S[r] . q_t)
// computed as  out = scale * (g * (S_old[r] . q_t) + delta * (k_t . q_t)),  so that S.k and S.q come
// from ONE pass over the old state and one (interleaved) reduction, and k_t . q_t once per token.
// Contest: a sequence with no tokens keeps its state, as kdispatch's reference does (the official
// FIB reference returns zeros there). cu_seqlens is checked by every block before any other read: a
// batch whose boundaries are not 0 = cu[0] <= ... <= cu[N] = T zeroes the output and leaves every
// state untouched (the reference's rule), so no value of cu_seqlens reads or writes out of bounds.
//
// Layout: KSPLIT adjacent threads own one V row; thread `sub` of a row holds the float4 chunks
// j * KSPLIT + sub (j < 32 / KSPLIT) of its 128 fp32 state values in registers (fully unrolled,
// compile-time indices only).  KSPLIT = 1 is one THREAD per row: S.k and S.q are thread-local, no
// shuffles.  KSPLIT > 1 spreads a row over adjacent lanes (coalesced state loads, fewer registers,
// log2(KSPLIT) xor shuffles per dot product) for small batches where parallelism is short.
// A block holds ROWS rows of one (sequence, v-head): ROWS * KSPLIT = 128 threads; grid = N * HV *
// (128 / ROWS) blocks.  The inputs of CHUNK tokens at a time (k, q converted to fp32 once, v, and
// the gates and k.q computed once per token) are staged in shared memory by the whole block, double
// buffered: the next chunk's global loads are issued before the current chunk's tokens and stored
// after them, so their latency hides behind CHUNK tokens of math and one __syncthreads per chunk
// suffices (a per-token prefetch left every token waiting on a global load: 3x slower).  CHUNK = 16
// halves the per-chunk staging and barrier cost (10-15% on H100 from 16 tokens per sequence on);
// CHUNK = 8 has the shorter prologue that very short sequences want.
//
// Header-free (NVRTC needs no CUDA include directory): bf16 is handled as raw 16-bit patterns.

typedef unsigned short bf16_t;

__device__ __forceinline__ float bf16_lo(unsigned int x) { return __uint_as_float(x << 16); }
__device__ __forceinline__ float bf16_hi(unsigned int x) { return __uint_as_float(x & 0xffff0000u); }
__device__ __forceinline__ float bf16_to_f(bf16_t x) { return __uint_as_float(((unsigned int)x) << 16); }
__device__ __forceinline__ bf16_t f_to_bf16(float f) {  // round to nearest even, NaN kept
    bf16_t r;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r) : "f"(f));
    return r;
}
__device__ __forceinline__ float4 bf16x4(uint2 x) {
    return make_float4(bf16_lo(x.x), bf16_hi(x.x), bf16_lo(x.y), bf16_hi(x.y));
}
__device__ __forceinline__ float softplus(float x) {  // torch.nn.functional.softplus (beta 1, threshold 20)
    return x > 20.f ? x : log1pf(expf(x));
}
__device__ __forceinline__ float dot4(float4 s, float4 k) {
    return s.x * k.x + s.y * k.y + s.z * k.z + s.w * k.w;
}

// A shared-memory load that the compilers may neither merge with an earlier load of the same address
// nor hoist freely: the update pass re-reads k instead of keeping all of it live from the S.k pass,
// and the loads of one pass are not all issued at once.  With KSPLIT = 1 plain loads needed more
// than 255 registers and spilled.
__device__ __forceinline__ float4 lds_reload(const float4* p) {
    float4 r;
    const unsigned addr = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ld.volatile.shared.v4.f32 {%0, %1, %2, %3}, [%4];"
                 : "=f"(r.x), "=f"(r.y), "=f"(r.z), "=f"(r.w) : "r"(addr));
    return r;
}

template <int KSPLIT>
__device__ __forceinline__ void row_sum2(float& x, float& y) {  // both sums over a row's KSPLIT lanes
#pragma unroll
    for (int off = KSPLIT / 2; off > 0; off >>= 1) {
        x += __shfl_xor_sync(0xffffffffu, x, off);
        y += __shfl_xor_sync(0xffffffffu, y, off);
    }
}

// Where a convention's tensors are.  Contest: compile-time contiguous layout (the members are not
// read); pool: strides in elements from the launch, the slot indices and has_initial_state.
struct Layout {
    long long q_t, q_h, k_t, k_h, v_t, v_h, g_t, beta_t;  // token / head strides
    long long s_slot, s_head, s_row;                     // pool strides
    const int* slots;
    const unsigned char* has_init;
    int num_slots;
};

template <bool POOL> struct GateT { typedef bf16_t type; };  // a, b raw (contest)
template <> struct GateT<true> { typedef float type; };      // g, beta activated (pool)

// The malformed-batch path, kept out of line: inlined, its registers pushed a layout into a stack frame.
template <typename CuT>
__device__ __noinline__ int cu_seqlens_bad(const CuT* __restrict__ cu, int N, long long T, int tid, int nt) {
    int bad = 0;
    for (int i = tid; i <= N; i += nt) {
        const long long c = cu[i];
        bad |= i == 0 ? c != 0 : c < (long long)cu[i - 1];
        bad |= i == N && c != T;
    }
    return bad;
}

// Zeroes rows [r0, r1) of out [T, OUT_ROW] at columns col .. col + rows - 1.
__device__ __noinline__ void zero_rows(bf16_t* __restrict__ out, long long r0, long long r1, int col, int rows,
                                       int tid, int nt, int out_row) {
    for (long long i = tid; i < (r1 - r0) * rows; i += nt) out[(r0 + i / rows) * out_row + col + i % rows] = (bf16_t)0;
}

// HV v-heads (q/k heads HV / 2); POOL: the engines' convention (see the top); CuT: cu_seqlens' type.
template <int KSPLIT, int ROWS, int CHUNK, int HV, bool POOL, typename CuT>
__device__ __forceinline__ void gdn_prefill_rows(
    const bf16_t* __restrict__ q, const bf16_t* __restrict__ k, const bf16_t* __restrict__ v,
    float* __restrict__ state, const float* __restrict__ A_log, const typename GateT<POOL>::type* __restrict__ a,
    const float* __restrict__ dt_bias, const typename GateT<POOL>::type* __restrict__ b,
    const CuT* __restrict__ cu_seqlens, bf16_t* __restrict__ out, float scale, long long T, const Layout& L) {
    typedef typename GateT<POOL>::type gate_t;
    constexpr int NT = ROWS * KSPLIT;   // threads
    constexpr int NC = 32 / KSPLIT;     // float4 chunks of the row per thread
    constexpr int VSPLIT = 128 / ROWS;  // blocks per (sequence, head)
    constexpr int NACC = NC < 4 ? NC : 4;
    constexpr bool SHORT_SLICE = NC <= 8;  // KSPLIT >= 4: see token() below
    constexpr int QK_ITEMS = CHUNK * 32, QK_PER = (QK_ITEMS + NT - 1) / NT;  // (token, lane): k and q uint2
    constexpr int V_ITEMS = CHUNK * ROWS, V_PER = (V_ITEMS + NT - 1) / NT;   // bf16 loads of v
    constexpr int OUT_ROW = HV * 128;   // out is [T, HV, 128]
    static_assert(NT % 32 == 0 && 32 % KSPLIT == 0 && 128 % ROWS == 0 && NT >= CHUNK, "bad shape");

    __shared__ float4 kq_s[2][CHUNK][2][32];  // [buffer][token][k, q][16-byte chunk], fp32
    __shared__ float v_s[2][CHUNK][ROWS];
    __shared__ float g_s[2][CHUNK][4];        // gate g, beta, k.q

    const int tid = threadIdx.x;
    const int sub = tid % KSPLIT, rloc = tid / KSPLIT;
    const int nh = blockIdx.x / VSPLIT;  // n * HV + h
    const int row0 = (blockIdx.x - nh * VSPLIT) * ROWS;
    const int n = nh / HV, h = nh - n * HV, hk = h >> 1;
    const int N = gridDim.x / (HV * VSPLIT);
    if (__syncthreads_or(cu_seqlens_bad(cu_seqlens, N, T, tid, NT))) {  // malformed batch
        zero_rows(out, n * T / N, (n + 1) * T / N, h * 128 + row0, ROWS, tid, NT, OUT_ROW);
        return;
    }
    const long long t0 = cu_seqlens[n], t1 = cu_seqlens[n + 1];
    int slot = n;
    if (POOL) {  // one slot per block: a uniform branch
        slot = L.slots[n];
        if (slot < 0 || slot >= L.num_slots) {  // padding: zero output, no state touched
            zero_rows(out, t0, t1, h * 128 + row0, ROWS, tid, NT, OUT_ROW);
            return;
        }
    } else if (t1 <= t0) {
        return;  // an empty sequence keeps its state (kdispatch's reference)
    }

    float4* srow = reinterpret_cast<float4*>(
        POOL ? state + slot * L.s_slot + h * L.s_head + (row0 + rloc) * L.s_row
             : state + ((size_t)nh * 128 + row0 + rloc) * 128);
    float4 S[NC];
    const bool from_state = !POOL || L.has_init[n];
#pragma unroll
    for (int j = 0; j < NC; ++j) S[j] = from_state ? srow[j * KSPLIT + sub] : make_float4(0.f, 0.f, 0.f, 0.f);

    const float ea = POOL ? 0.f : expf(A_log[h]), dtb = POOL ? 0.f : dt_bias[h];
    // q/k: uint2 = 4 bf16; token stride in uint2
    const long long qk_t = POOL ? L.q_t >> 2 : 128, kk_t = POOL ? L.k_t >> 2 : 128;
    const long long vv_t = POOL ? L.v_t : 1024, a_t = POOL ? L.g_t : 8, b_t = POOL ? L.beta_t : 8;
    const uint2* k2 = reinterpret_cast<const uint2*>(k + hk * (POOL ? L.k_h : 128));  // token t: + t * kk_t
    const uint2* q2 = reinterpret_cast<const uint2*>(q + hk * (POOL ? L.q_h : 128));
    const bf16_t* vh = v + h * (POOL ? L.v_h : 128) + row0;                           // token t: + t * vv_t

    // The inputs of tokens tc .. tc + CHUNK - 1 (zeros past the sequence end), spread over the block:
    // warp w loads k and q of whole tokens (lane l: columns 4l..4l+3), so k.q is one warp reduction.
    uint2 k_r[QK_PER], q_r[QK_PER];
    bf16_t v_r[V_PER];
    gate_t a_r = 0, b_r = 0;
    auto load_chunk = [&](long long tc) {
#pragma unroll
        for (int m = 0; m < QK_PER; ++m) {
            const int item = tid + m * NT;
            const long long t = tc + (item >> 5);
            k_r[m] = q_r[m] = make_uint2(0u, 0u);
            if ((QK_ITEMS % NT == 0 || item < QK_ITEMS) && t < t1) {
                k_r[m] = k2[t * kk_t + (item & 31)];
                q_r[m] = q2[t * qk_t + (item & 31)];
            }
        }
#pragma unroll
        for (int m = 0; m < V_PER; ++m) {
            const int item = tid + m * NT, tok = item / ROWS, row = item % ROWS;
            const long long t = tc + tok;
            v_r[m] = 0;
            if ((V_ITEMS % NT == 0 || item < V_ITEMS) && t < t1) v_r[m] = vh[t * vv_t + row];
        }
        if (tid < CHUNK && tc + tid < t1) {
            a_r = a[(tc + tid) * a_t + h];
            b_r = b[(tc + tid) * b_t + h];
        }
    };
    auto store_chunk = [&](int buf) {
#pragma unroll
        for (int m = 0; m < QK_PER; ++m) {
            const int item = tid + m * NT;  // warp-uniform token: the shuffles below are safe
            if (QK_ITEMS % NT == 0 || item < QK_ITEMS) {
                float4 kk = bf16x4(k_r[m]), qq = bf16x4(q_r[m]);
                float kq = dot4(kk, qq);
                if (POOL) {  // L2 norms: x / sqrt(x.x + 1e-6), reduced with k.q
                    float ssk = dot4(kk, kk), ssq = dot4(qq, qq);
#pragma unroll
                    for (int off = 16; off > 0; off >>= 1) {
                        kq += __shfl_xor_sync(0xffffffffu, kq, off);
                        ssk += __shfl_xor_sync(0xffffffffu, ssk, off);
                        ssq += __shfl_xor_sync(0xffffffffu, ssq, off);
                    }
                    const float rk = 1.f / sqrtf(ssk + 1e-6f), rq = 1.f / sqrtf(ssq + 1e-6f);
                    kk = make_float4(kk.x * rk, kk.y * rk, kk.z * rk, kk.w * rk);
                    qq = make_float4(qq.x * rq, qq.y * rq, qq.z * rq, qq.w * rq);
                    kq *= rk * rq;
                } else {
#pragma unroll
                    for (int off = 16; off > 0; off >>= 1) kq += __shfl_xor_sync(0xffffffffu, kq, off);
                }
                kq_s[buf][item >> 5][0][item & 31] = kk;
                kq_s[buf][item >> 5][1][item & 31] = qq;
                if ((item & 31) == 0) g_s[buf][item >> 5][2] = kq;
            }
        }
#pragma unroll
        for (int m = 0; m < V_PER; ++m) {
            const int item = tid + m * NT;
            if (V_ITEMS % NT == 0 || item < V_ITEMS) v_s[buf][item / ROWS][item % ROWS] = bf16_to_f(v_r[m]);
        }
        if (tid < CHUNK) {
            if constexpr (POOL) {
                g_s[buf][tid][0] = expf(a_r);
                g_s[buf][tid][1] = b_r;
            } else {
                g_s[buf][tid][0] = expf(-ea * softplus(bf16_to_f(a_r) + dtb));
                g_s[buf][tid][1] = 1.f / (1.f + expf(-bf16_to_f(b_r)));
            }
        }
    };

    load_chunk(t0);
    store_chunk(0);
    __syncthreads();

    int buf = 0;
#pragma unroll 1
    for (long long tc = t0; tc < t1; tc += CHUNK, buf ^= 1) {
        const bool more = tc + CHUNK < t1;
        if (more) load_chunk(tc + CHUNK);  // in flight during this chunk's tokens
        const int ntok = (int)(t1 - tc < CHUNK ? t1 - tc : CHUNK);

        // One token for this thread's slice of its row.  Slices of up to 8 float4 (KSPLIT >= 4) keep
        // the token's k in registers from the dot products to the update and use plain shared loads,
        // so the fully unrolled chunk below lets the compiler issue token i + 1's loads during token
        // i's cross-lane reduction; longer slices re-read k with ordered loads (255-register limit).
        auto token = [&](int i) {
            const float g = g_s[buf][i][0], beta = g_s[buf][i][1], kq = g_s[buf][i][2];
            const float4* ks = kq_s[buf][i][0];
            const float4* qs = kq_s[buf][i][1];
            float4 kreg[SHORT_SLICE ? NC : 1];

            float ak[NACC], aq[NACC];
#pragma unroll
            for (int u = 0; u < NACC; ++u) ak[u] = aq[u] = 0.f;
#pragma unroll
            for (int j = 0; j < NC; ++j) {
                float4 kk, qq;
                if constexpr (SHORT_SLICE) {
                    kk = kreg[j] = ks[j * KSPLIT + sub];
                    qq = qs[j * KSPLIT + sub];
                } else {
                    kk = lds_reload(ks + j * KSPLIT + sub);
                    qq = lds_reload(qs + j * KSPLIT + sub);
                }
                ak[j % NACC] += dot4(S[j], kk);
                aq[j % NACC] += dot4(S[j], qq);
            }
            float sk = ak[0], sq = aq[0];
#pragma unroll
            for (int u = 1; u < NACC; ++u) {
                sk += ak[u];
                sq += aq[u];
            }
            row_sum2<KSPLIT>(sk, sq);
            const float delta = beta * (v_s[buf][i][rloc] - g * sk);
            if (sub == 0)
                out[(size_t)(tc + i) * OUT_ROW + h * 128 + row0 + rloc] = f_to_bf16(scale * fmaf(g, sq, delta * kq));

#pragma unroll
            for (int j = 0; j < NC; ++j) {
                float4 kk;
                if constexpr (SHORT_SLICE) kk = kreg[j];
                else kk = lds_reload(ks + j * KSPLIT + sub);
                S[j].x = fmaf(g, S[j].x, delta * kk.x);
                S[j].y = fmaf(g, S[j].y, delta * kk.y);
                S[j].z = fmaf(g, S[j].z, delta * kk.z);
                S[j].w = fmaf(g, S[j].w, delta * kk.w);
            }
        };
        if (SHORT_SLICE && ntok == CHUNK) {
#pragma unroll
            for (int i = 0; i < CHUNK; ++i) token(i);
        } else {
#pragma unroll 1
            for (int i = 0; i < ntok; ++i) token(i);
        }

        if (more) store_chunk(buf ^ 1);
        __syncthreads();
    }
#pragma unroll
    for (int j = 0; j < NC; ++j) srow[j * KSPLIT + sub] = S[j];
}

#ifndef POOL_HV
// The contest definition, gdn_prefill_thread_rows_k<KSPLIT>_r<ROWS>_c<CHUNK>: block = ROWS * KSPLIT
// threads, grid = N * 8 * (128 / ROWS).
#define GDN_PREFILL_KERNEL(KSPLIT, ROWS, CHUNK)                                                     \
    extern "C" __global__ void __launch_bounds__(ROWS * KSPLIT)                                     \
        gdn_prefill_thread_rows_k##KSPLIT##_r##ROWS##_c##CHUNK(                                     \
            const bf16_t* __restrict__ q, const bf16_t* __restrict__ k,                             \
            const bf16_t* __restrict__ v, float* __restrict__ state,                                \
            const float* __restrict__ A_log, const bf16_t* __restrict__ a,                          \
            const float* __restrict__ dt_bias, const bf16_t* __restrict__ b,                        \
            const long long* __restrict__ cu_seqlens, bf16_t* __restrict__ out, float scale,        \
            long long T) {                                                                          \
        gdn_prefill_rows<KSPLIT, ROWS, CHUNK, 8, false>(q, k, v, state, A_log, a, dt_bias, b,       \
                                                        cu_seqlens, out, scale, T, Layout{});       \
    }
#else
// The engines' pool prefill, compiled once per value-head count (-DPOOL_HV=<HV>, q/k heads HV / 2 as
// in every Qwen3-Next TP split): gdn_prefill_pool_rows_k<KSPLIT>_r<ROWS>_c<CHUNK>, grid as above with
// HV heads.  Parameters: q k v pool g beta cu_seqlens out, scale, T, the 8 token/head strides, the
// pool's 3 strides, slots, has_init, num_slots.
#define GDN_PREFILL_KERNEL(KSPLIT, ROWS, CHUNK)                                                     \
    extern "C" __global__ void __launch_bounds__(ROWS * KSPLIT)                                     \
        gdn_prefill_pool_rows_k##KSPLIT##_r##ROWS##_c##CHUNK(                                       \
            const bf16_t* __restrict__ q, const bf16_t* __restrict__ k,                             \
            const bf16_t* __restrict__ v, float* __restrict__ pool, const float* __restrict__ g,   \
            const float* __restrict__ beta, const int* __restrict__ cu_seqlens,                     \
            bf16_t* __restrict__ out, float scale, long long T, long long q_t, long long q_h,        \
            long long k_t, long long k_h, long long v_t, long long v_h, long long g_t,              \
            long long beta_t, long long s_slot, long long s_head, long long s_row,                  \
            const int* __restrict__ slots, const unsigned char* __restrict__ has_init,              \
            int num_slots) {                                                                        \
        gdn_prefill_rows<KSPLIT, ROWS, CHUNK, POOL_HV, true>(                                       \
            q, k, v, pool, nullptr, g, nullptr, beta, cu_seqlens, out, scale, T,                    \
            Layout{q_t, q_h, k_t, k_h, v_t, v_h, g_t, beta_t, s_slot, s_head, s_row, slots,         \
                   has_init, num_slots});                                                           \
    }
#endif

GDN_PREFILL_KERNEL(1, 128, 8)  // one thread per row, one block per (sequence, head)
GDN_PREFILL_KERNEL(2, 64, 8)
GDN_PREFILL_KERNEL(4, 32, 8)
GDN_PREFILL_KERNEL(8, 16, 8)
GDN_PREFILL_KERNEL(16, 8, 8)
GDN_PREFILL_KERNEL(2, 64, 16)
GDN_PREFILL_KERNEL(4, 32, 16)
GDN_PREFILL_KERNEL(8, 16, 16)
GDN_PREFILL_KERNEL(16, 8, 16)
