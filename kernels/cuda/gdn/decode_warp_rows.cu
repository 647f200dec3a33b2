// Gated DeltaNet decode, memory-bound: warps over V rows. Two conventions, one kernel template:
//   gdn_decode_qk4_v8_d128_k_last (the contest's): q, k already L2-normalised, state [B, 8, V, K];
//   gdn_decode_packed_* (the engines'): q, k raw and L2-normalised here (eps 1e-6), state rows of a
//   pool [slots, HV, V, K] through int32 slot indices, for HV = 4, 8, 16, 32 value heads.
//
// Shapes (B = batch, HV v-heads, HV / G q/k heads, D = 128):
//   q, k   [B, 1, HV/G, 128] bf16    v     [B, 1, HV, 128] bf16
//   state  [B or slots, HV, 128(V), 128(K)] fp32, k-last, each slot contiguous (slot pitch
//          `state_b` elements), read and written IN PLACE
//   A_log  [HV] fp32   a, b [B, 1, HV] bf16   dt_bias [HV] fp32   out [B, 1, HV, 128] bf16, contiguous
//   slots  [B] int32 (POOL only): a slot outside [0, num_slots) is a padding row: its state is
//          neither read nor written and its output is zero
// q, k, v, a and b may be strided views (engines split them out of one packed projection row):
// their last dimension is contiguous and `Strides` gives the batch and head strides in elements (q
// and k strides multiples of 4: each lane loads 8 aligned bytes).
// v-head h reads q/k head h / G.  Per (b, h):  g = exp(-exp(A_log) * softplus(a + dt_bias)),
// beta = sigmoid(b); every V row r is independent:
//   S = g * state[r, :];  old = S . k;  delta = beta * (v[r] - old)   (= new_v - old)
//   state[r, :] = S + delta * k;  out[r] = scale * (S + delta * k) . q
//                                        = scale * (g * (state[r] . q) + delta * (k . q))
//
// Layout: one warp owns R consecutive V rows of one (b, h); lane l owns K columns 4l..4l+3 (one
// float4), so each row is one fully coalesced 512-byte access of 16-byte loads.  All R rows' loads
// are issued before any use; the 2R+1 dot products (S.k and S.q per row, k.q once; with the L2
// norm also q.q and k.k, which scale them afterwards) are reduced together by one 5-stage xor
// butterfly, so the shuffles of all rows overlap.  A block is 4 warps (4R rows of one head);
// grid = B * HV * 128 / (4R) blocks (B = 1, HV = 8, R = 1: 256 blocks).
// Optionally (CS) the state is loaded and stored evict-first (it is touched once per step): 1-3%
// faster on an H100 from B = 2 on, slower at B = 1.  Tried and dropped: each block looping over 2-4
// row groups with the next group's loads issued before the current one's stores (up to 1 us slower).
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

__device__ __forceinline__ float softplus(float x) {  // torch.nn.functional.softplus (beta 1, threshold 20)
    return x > 20.f ? x : log1pf(expf(x));
}

// State traffic is touched exactly once: optionally mark it evict-first (.cs) in the caches.
template <bool CS>
__device__ __forceinline__ float4 ld_state(const float4* p) {
    if (!CS) return *p;
    float4 r;
    asm("ld.global.cs.v4.f32 {%0, %1, %2, %3}, [%4];"
                 : "=f"(r.x), "=f"(r.y), "=f"(r.z), "=f"(r.w) : "l"(p));
    return r;
}
template <bool CS>
__device__ __forceinline__ void st_state(float4* p, float4 v) {
    if (!CS) {
        *p = v;
        return;
    }
    asm volatile("st.global.cs.v4.f32 [%0], {%1, %2, %3, %4};" :: "l"(p), "f"(v.x), "f"(v.y), "f"(v.z), "f"(v.w)
                 : "memory");
}

// Element strides of the strided inputs: batch (dim 0) and head (dim 2) of q, k, v; batch of a, b;
// the state's slot, head and V-row strides (multiples of 4: float4 accesses); the pool's slot
// indices and size (POOL only).
struct Strides {
    int q_b, q_h, k_b, k_h, v_b, v_h, a_b, b_b;
    long long state_b;
    int state_h, state_r;
    const int* slots;
    int num_slots;
};

// The loaded inputs of one warp's R rows.
template <int R>
struct Rows {
    float4 s[R];
    float vv[R];
    uint2 kr, qr;
    float a_h, b_h, alog, dtb;
    float4* srow;
    int row4;  // float4s between V rows
    int bh, row0;
    bool live;  // false: a padding row of the pool (nothing read or written, output zero)
};

// 1. Issue every load of row group `grp` (4R consecutive rows of one (b, h); this warp's R of them):
// R state rows (16 B per lane each), then q, k, v and the gate inputs.  No use yet.
template <int R, bool CS, int HV, int G, bool POOL>
__device__ __forceinline__ void load_rows(Rows<R>& x, int grp, int warp, int lane,
    const bf16_t* __restrict__ q, const bf16_t* __restrict__ k, const bf16_t* __restrict__ v,
    float* __restrict__ state, const float* __restrict__ A_log, const bf16_t* __restrict__ a,
    const float* __restrict__ dt_bias, const bf16_t* __restrict__ b, const Strides& st) {
    constexpr int GROUPS_PER_HEAD = 128 / (4 * R);
    x.bh = grp / GROUPS_PER_HEAD;  // b * HV + h
    x.row0 = (grp - x.bh * GROUPS_PER_HEAD) * (4 * R) + warp * R;
    const int h = x.bh % HV;
    const size_t bb = x.bh / HV, hq = h / G;  // batch, q/k head
    long long slot = bb;
    x.live = true;
    if (POOL) {  // one index per block (all its warps share b): a uniform branch
        slot = st.slots[bb];
        x.live = slot >= 0 && slot < st.num_slots;
        if (!x.live) slot = 0;
    }
    // the contest's state is contiguous: its strides are constants there
    const size_t s_b = POOL ? st.state_b : (size_t)HV * 128 * 128, s_h = POOL ? st.state_h : 128 * 128;
    const size_t s_r = POOL ? st.state_r : 128;
    x.srow = reinterpret_cast<float4*>(state + slot * s_b + h * s_h + x.row0 * s_r) + lane;
    x.row4 = (int)(s_r >> 2);
#pragma unroll
    for (int i = 0; i < R; ++i) x.s[i] = x.live ? ld_state<CS>(x.srow + i * x.row4) : make_float4(0.f, 0.f, 0.f, 0.f);
    x.kr = reinterpret_cast<const uint2*>(k + bb * st.k_b + hq * st.k_h)[lane];
    x.qr = reinterpret_cast<const uint2*>(q + bb * st.q_b + hq * st.q_h)[lane];
    const bf16_t* vrow = v + bb * st.v_b + h * st.v_h + x.row0;
#pragma unroll
    for (int i = 0; i < R; ++i) x.vv[i] = bf16_to_f(vrow[i]);
    x.a_h = bf16_to_f(a[bb * st.a_b + h]);
    x.b_h = bf16_to_f(b[bb * st.b_b + h]);
    x.alog = A_log[h];
    x.dtb = dt_bias[h];
}

// 2. One delta-rule step of R state rows (lane: 4 columns of each): the new rows and each row's
// output (before the scale).  POOL: q and k L2-normalised here.
template <int R, bool POOL>
__device__ __forceinline__ void delta_step(const float4 (&s)[R], const float (&vv)[R], uint2 kr, uint2 qr, float g,
                                           float beta, float4 (&ns)[R], float (&o)[R]) {
    float k0 = bf16_lo(kr.x), k1 = bf16_hi(kr.x), k2 = bf16_lo(kr.y), k3 = bf16_hi(kr.y);
    const float q0 = bf16_lo(qr.x), q1 = bf16_hi(qr.x), q2 = bf16_lo(qr.y), q3 = bf16_hi(qr.y);

    // Partial dots of this lane's 4 columns, all reduced together across the warp.
    float sk[R], sq[R];
    float kq = k0 * q0 + k1 * q1 + k2 * q2 + k3 * q3;
    float qq = POOL ? q0 * q0 + q1 * q1 + q2 * q2 + q3 * q3 : 0.f;
    float kk = POOL ? k0 * k0 + k1 * k1 + k2 * k2 + k3 * k3 : 0.f;
#pragma unroll
    for (int i = 0; i < R; ++i) {
        sk[i] = s[i].x * k0 + s[i].y * k1 + s[i].z * k2 + s[i].w * k3;
        sq[i] = s[i].x * q0 + s[i].y * q1 + s[i].z * q2 + s[i].w * q3;
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
#pragma unroll
        for (int i = 0; i < R; ++i) {
            sk[i] += __shfl_xor_sync(0xffffffffu, sk[i], off);
            sq[i] += __shfl_xor_sync(0xffffffffu, sq[i], off);
        }
        kq += __shfl_xor_sync(0xffffffffu, kq, off);
        if (POOL) {
            qq += __shfl_xor_sync(0xffffffffu, qq, off);
            kk += __shfl_xor_sync(0xffffffffu, kk, off);
        }
    }
    if (POOL) {  // q / sqrt(q.q + 1e-6), k likewise: scale the reduced dots and the k columns
        const float rq = rsqrtf(qq + 1e-6f), rk = rsqrtf(kk + 1e-6f);
#pragma unroll
        for (int i = 0; i < R; ++i) {
            sk[i] *= rk;
            sq[i] *= rq;
        }
        kq *= rq * rk;
        k0 *= rk, k1 *= rk, k2 *= rk, k3 *= rk;
    }
#pragma unroll
    for (int i = 0; i < R; ++i) {
        const float old = g * sk[i];
        const float delta = beta * (vv[i] - old);
        ns[i].x = fmaf(g, s[i].x, delta * k0);
        ns[i].y = fmaf(g, s[i].y, delta * k1);
        ns[i].z = fmaf(g, s[i].z, delta * k2);
        ns[i].w = fmaf(g, s[i].w, delta * k3);
        o[i] = fmaf(g, sq[i], delta * kq);
    }
}

__device__ __forceinline__ float gate(float a, float A_log, float dt_bias) {
    return expf(-expf(A_log) * softplus(a + dt_bias));
}

// 3. Update the state in place, write the outputs (lane i writes row i's output).
template <int R, bool CS, bool POOL>
__device__ __forceinline__ void finish_rows(const Rows<R>& x, int lane, bf16_t* __restrict__ out, float scale) {
    float4 ns[R];
    float o[R];
    delta_step<R, POOL>(x.s, x.vv, x.kr, x.qr, gate(x.a_h, x.alog, x.dtb), 1.f / (1.f + expf(-x.b_h)), ns, o);
#pragma unroll
    for (int i = 0; i < R; ++i) {
        if (x.live) st_state<CS>(x.srow + i * x.row4, ns[i]);
        if (lane == i) out[(size_t)x.bh * 128 + x.row0 + i] = x.live ? f_to_bf16(scale * o[i]) : 0;
    }
}

// One block = 4 warps = 4R consecutive rows of one (b, h): load everything, then reduce and store.
template <int R, bool CS, int HV, int G, bool POOL>
__device__ __forceinline__ void gdn_decode_rows(
    const bf16_t* __restrict__ q, const bf16_t* __restrict__ k, const bf16_t* __restrict__ v,
    float* __restrict__ state, const float* __restrict__ A_log, const bf16_t* __restrict__ a,
    const float* __restrict__ dt_bias, const bf16_t* __restrict__ b, bf16_t* __restrict__ out,
    float scale, const Strides& st) {
    const int lane = threadIdx.x & 31;
    Rows<R> x;
    load_rows<R, CS, HV, G, POOL>(x, blockIdx.x, threadIdx.x >> 5, lane, q, k, v, state, A_log, a, dt_bias, b, st);
    finish_rows<R, CS, POOL>(x, lane, out, scale);
}

// Speculative verification, built with the pool kernels: a block is 4 warps = 4R rows of one
// (request, head), grid = N * HV * 128 / (4R).  The rows are read once, stay in registers over the
// request's tokens, and after each step j are stored (evict-first) where the contract says:
//   SGLang's (gdn_verify_*, STEP_SLOTS false): read from the request's slot (zeros where it is outside
//     the pool), never written back; stored at [row, j] of the intermediate-states buffer
//     [num_rows, steps, HV, 128, 128] (contiguous), unless the row is outside the buffer or the
//     request has more than `steps` tokens.
//   vLLM's (gdn_verify_steps_*, STEP_SLOTS true): `rows` is step_slots [N, steps] (row pitch
//     `num_rows`: a slice of vLLM's block table) and `accepted` the accepted step counts; read from
//     slot step_slots[n, accepted[n] - 1] and stored into the pool
//     slot step_slots[n, j] (j < steps), slots outside [1, num_slots) (0: the null block) skipped; a
//     request whose starting slot is missing is padding: zero output, nothing read or written.
// Every block checks cu_seqlens [N + 1] (int32) itself; malformed boundaries are read as the even
// partition n * T / N.  q, k, v, a, b are read through their token (`*_b`) and head strides; out
// [T, HV, 128] is contiguous.
template <int R, int HV, int G, bool STEP_SLOTS>
__device__ __forceinline__ void gdn_verify_rows(
    const bf16_t* __restrict__ q, const bf16_t* __restrict__ k, const bf16_t* __restrict__ v,
    float* __restrict__ pool, const float* __restrict__ A_log, const bf16_t* __restrict__ a,
    const float* __restrict__ dt_bias, const bf16_t* __restrict__ b, bf16_t* __restrict__ out, float scale,
    const Strides& st, const int* __restrict__ cu, float* __restrict__ inter, const int* __restrict__ rows,
    int num_rows, int steps, long long T, const int* __restrict__ accepted) {
    constexpr int GROUPS_PER_HEAD = 128 / (4 * R);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int bh = blockIdx.x / GROUPS_PER_HEAD;  // n * HV + h
    const int row0 = (blockIdx.x - bh * GROUPS_PER_HEAD) * (4 * R) + warp * R;
    const int n = bh / HV, h = bh - n * HV, hq = h / G;
    const int N = gridDim.x / (HV * GROUPS_PER_HEAD);
    int bad = 0;
    for (int i = threadIdx.x; i <= N; i += blockDim.x) {
        const int c = cu[i];
        bad |= i == 0 ? c != 0 : c < cu[i - 1];
        bad |= i == N && c != T;
    }
    bad = __syncthreads_or(bad);
    const long long t0 = bad ? (long long)n * T / N : cu[n], t1 = bad ? (long long)(n + 1) * T / N : cu[n + 1];
    const size_t row_at = (size_t)h * st.state_h + (size_t)row0 * st.state_r;  // this warp's rows in a slot
    const int row4 = st.state_r >> 2;
    int slot;
    bool live, cached = false;
    if (STEP_SLOTS) {
        const int acc = accepted[n];
        slot = acc >= 1 && acc <= steps ? rows[(size_t)n * num_rows + acc - 1] : 0;
        live = slot >= 1 && slot < st.num_slots;
        if (!live) {  // padding: zero output
            for (long long t = t0; t < t1; ++t)
                if (lane < R) out[((size_t)t * HV + h) * 128 + row0 + lane] = 0;
            return;
        }
    } else {
        slot = st.slots[n];
        live = slot >= 0 && slot < st.num_slots;
        const int crow = rows[n];
        cached = crow >= 0 && crow < num_rows && t1 - t0 <= steps;
        inter += (((size_t)(cached ? crow : 0) * steps * HV + h) * 128 + row0) * 128;
    }

    float4 s[R];
    const float4* src = reinterpret_cast<const float4*>(pool + (live ? slot : 0) * st.state_b + row_at) + lane;
#pragma unroll
    for (int i = 0; i < R; ++i) s[i] = live ? ld_state<true>(src + i * row4) : make_float4(0.f, 0.f, 0.f, 0.f);
    const float alog = A_log[h], dtb = dt_bias[h];

#pragma unroll 1
    for (long long t = t0; t < t1; ++t) {
        const uint2 kr = reinterpret_cast<const uint2*>(k + t * st.k_b + hq * st.k_h)[lane];
        const uint2 qr = reinterpret_cast<const uint2*>(q + t * st.q_b + hq * st.q_h)[lane];
        float vv[R];
        const bf16_t* vrow = v + t * st.v_b + h * st.v_h + row0;
#pragma unroll
        for (int i = 0; i < R; ++i) vv[i] = bf16_to_f(vrow[i]);
        const float g = gate(bf16_to_f(a[t * st.a_b + h]), alog, dtb);
        const float beta = 1.f / (1.f + expf(-bf16_to_f(b[t * st.b_b + h])));
        float4 ns[R];
        float o[R];
        delta_step<R, true>(s, vv, kr, qr, g, beta, ns, o);
        const long long j = t - t0;
        float4* dst = nullptr;  // where this step's rows go (this lane's float4 of row 0)
        if (STEP_SLOTS) {
            const int d = j < steps ? rows[(size_t)n * num_rows + j] : 0;
            if (d >= 1 && d < st.num_slots) dst = reinterpret_cast<float4*>(pool + d * st.state_b + row_at) + lane;
        } else if (cached) {
            dst = reinterpret_cast<float4*>(inter + j * (HV * 16384)) + lane;
        }
#pragma unroll
        for (int i = 0; i < R; ++i) {
            s[i] = ns[i];
            if (dst != nullptr) st_state<true>(dst + i * (STEP_SLOTS ? row4 : 32), ns[i]);
            if (lane == i) out[((size_t)t * HV + h) * 128 + row0 + i] = f_to_bf16(scale * o[i]);
        }
    }
}

// Launch parameters of every kernel: q k v state A_log a dt_bias b out, scale, 8 input strides,
// the state's 3 strides, slots (nullptr unless POOL), num_slots.
#define GDN_DECODE_KERNEL(NAME, R, CS, HV, G, POOL)                                                 \
    extern "C" __global__ void __launch_bounds__(128) NAME(                                         \
        const bf16_t* __restrict__ q, const bf16_t* __restrict__ k, const bf16_t* __restrict__ v,   \
        float* __restrict__ state, const float* __restrict__ A_log, const bf16_t* __restrict__ a,   \
        const float* __restrict__ dt_bias, const bf16_t* __restrict__ b, bf16_t* __restrict__ out, \
        float scale, int q_b, int q_h, int k_b, int k_h, int v_b, int v_h, int a_b, int b_b,       \
        long long state_b, int state_h, int state_r, const int* __restrict__ slots, int num_slots) {  \
        gdn_decode_rows<R, CS, HV, G, POOL>(q, k, v, state, A_log, a, dt_bias, b, out, scale,       \
            Strides{q_b, q_h, k_b, k_h, v_b, v_h, a_b, b_b, state_b, state_h, state_r, slots,         \
                    num_slots});                                                                    \
    }

#ifndef POOL_HV
// The contest definition (HV = 8, G = 2), gdn_decode_warp_rows[_cs]_r<R>:
// grid = B * 8 * 128 / (4 R) blocks of 128 threads.
GDN_DECODE_KERNEL(gdn_decode_warp_rows_r1, 1, false, 8, 2, false)
GDN_DECODE_KERNEL(gdn_decode_warp_rows_r2, 2, false, 8, 2, false)
GDN_DECODE_KERNEL(gdn_decode_warp_rows_r4, 4, false, 8, 2, false)
GDN_DECODE_KERNEL(gdn_decode_warp_rows_r8, 8, false, 8, 2, false)
GDN_DECODE_KERNEL(gdn_decode_warp_rows_cs_r1, 1, true, 8, 2, false)
GDN_DECODE_KERNEL(gdn_decode_warp_rows_cs_r2, 2, true, 8, 2, false)
GDN_DECODE_KERNEL(gdn_decode_warp_rows_cs_r4, 4, true, 8, 2, false)
GDN_DECODE_KERNEL(gdn_decode_warp_rows_cs_r8, 8, true, 8, 2, false)
#else
// The engines' packed pool decode, compiled once per value-head count (-DPOOL_HV=<HV>, G = 2 as in
// every Qwen3-Next TP split): gdn_decode_pool_rows[_cs]_r<R>, grid = B * HV * 128 / (4 R).
GDN_DECODE_KERNEL(gdn_decode_pool_rows_r1, 1, false, POOL_HV, 2, true)
GDN_DECODE_KERNEL(gdn_decode_pool_rows_r2, 2, false, POOL_HV, 2, true)
GDN_DECODE_KERNEL(gdn_decode_pool_rows_r4, 4, false, POOL_HV, 2, true)
GDN_DECODE_KERNEL(gdn_decode_pool_rows_r8, 8, false, POOL_HV, 2, true)
GDN_DECODE_KERNEL(gdn_decode_pool_rows_cs_r1, 1, true, POOL_HV, 2, true)
GDN_DECODE_KERNEL(gdn_decode_pool_rows_cs_r2, 2, true, POOL_HV, 2, true)
GDN_DECODE_KERNEL(gdn_decode_pool_rows_cs_r4, 4, true, POOL_HV, 2, true)
GDN_DECODE_KERNEL(gdn_decode_pool_rows_cs_r8, 8, true, POOL_HV, 2, true)
// 16 and 32 rows a warp (155-255 registers): more state bytes in flight per warp, which large
// batches want (32 without evict-first spills: not compiled)
GDN_DECODE_KERNEL(gdn_decode_pool_rows_r16, 16, false, POOL_HV, 2, true)
GDN_DECODE_KERNEL(gdn_decode_pool_rows_cs_r16, 16, true, POOL_HV, 2, true)
GDN_DECODE_KERNEL(gdn_decode_pool_rows_cs_r32, 32, true, POOL_HV, 2, true)

// Speculative verification, gdn_verify[_steps]_rows_r<R>: the decode parameters (the state is the
// pool; q/k/v/a/b strides are per token), then cu_seqlens, the intermediate-states buffer (SGLang's;
// nullptr for vLLM's), the cache rows or step slots, the buffer's rows (SGLang's) or the step slots'
// row pitch (vLLM's), the steps, T, and the accepted step counts (vLLM's; nullptr for SGLang's).
#define GDN_VERIFY_KERNEL(NAME, R, STEP_SLOTS)                                                        \
    extern "C" __global__ void __launch_bounds__(128) NAME(                                           \
        const bf16_t* __restrict__ q, const bf16_t* __restrict__ k, const bf16_t* __restrict__ v,     \
        float* __restrict__ pool, const float* __restrict__ A_log, const bf16_t* __restrict__ a,      \
        const float* __restrict__ dt_bias, const bf16_t* __restrict__ b, bf16_t* __restrict__ out,    \
        float scale, int q_t, int q_h, int k_t, int k_h, int v_t, int v_h, int a_t, int b_t,         \
        long long state_b, int state_h, int state_r, const int* __restrict__ slots, int num_slots,    \
        const int* __restrict__ cu, float* __restrict__ inter, const int* __restrict__ rows,          \
        int num_rows, int steps, long long T, const int* __restrict__ accepted) {                     \
        gdn_verify_rows<R, POOL_HV, 2, STEP_SLOTS>(q, k, v, pool, A_log, a, dt_bias, b, out, scale,   \
            Strides{q_t, q_h, k_t, k_h, v_t, v_h, a_t, b_t, state_b, state_h, state_r, slots, num_slots}, \
            cu, inter, rows, num_rows, steps, T, accepted);                                           \
    }
GDN_VERIFY_KERNEL(gdn_verify_rows_r1, 1, false)
GDN_VERIFY_KERNEL(gdn_verify_rows_r2, 2, false)
GDN_VERIFY_KERNEL(gdn_verify_rows_r4, 4, false)
GDN_VERIFY_KERNEL(gdn_verify_rows_r8, 8, false)
GDN_VERIFY_KERNEL(gdn_verify_steps_rows_r1, 1, true)
GDN_VERIFY_KERNEL(gdn_verify_steps_rows_r2, 2, true)
GDN_VERIFY_KERNEL(gdn_verify_steps_rows_r4, 4, true)
GDN_VERIFY_KERNEL(gdn_verify_steps_rows_r8, 8, true)
#endif
