// Gated DeltaNet prefill (gdn_prefill_qk4_v8_d128_k_last) for short sequences: the recurrence run
// token by token with the state in registers.
//
// Shapes (contiguous; T = total tokens, N = sequences, D = 128):
//   q, k  [T, 4, 128] bf16     v [T, 8, 128] bf16      a, b [T, 8] bf16
//   state [N, 8, 128(V), 128(K)] fp32 k-last, read and written IN PLACE
//   A_log, dt_bias [8] fp32    cu_seqlens [N + 1] int64 (read on the device)   out [T, 8, 128] bf16
// For each sequence n, v-head h (q/k head h / 2), token t in order:
//   g = exp(-exp(A_log[h]) * softplus(a[t,h] + dt_bias[h])),  beta = sigmoid(b[t,h])
//   for each V row r:  old = g * (S[r] . k_t);  delta = beta * (v[t,h,r] - old)
//                      S[r] = g * S[r] + delta * k_t;  out[t,h,r] = scale * (S[r] . q_t)
// computed as  out = scale * (g * (S_old[r] . q_t) + delta * (k_t . q_t)),  so that S.k and S.q come
// from ONE pass over the old state and one (interleaved) reduction, and k_t . q_t once per token.
// A sequence with no tokens keeps its state, as kdispatch's reference does (the official FIB
// reference returns zeros there). cu_seqlens is checked by every block before any other read: a
// batch whose boundaries are not 0 = cu[0] <= ... <= cu[N] = T zeroes the output and leaves every
// state untouched (the reference's rule), so no value of cu_seqlens reads or writes out of bounds.
//
// Layout: KSPLIT adjacent threads own one V row; thread `sub` of a row holds the float4 chunks
// j * KSPLIT + sub (j < 32 / KSPLIT) of its 128 fp32 state values in registers (fully unrolled,
// compile-time indices only).  KSPLIT = 1 is one THREAD per row: S.k and S.q are thread-local, no
// shuffles.  KSPLIT > 1 spreads a row over adjacent lanes (coalesced state loads, fewer registers,
// log2(KSPLIT) xor shuffles per dot product) for small batches where parallelism is short.
// A block holds ROWS rows of one (sequence, v-head): ROWS * KSPLIT = 128 threads; grid = N * 8 *
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

// The malformed-batch path, kept out of line: inlined, its registers pushed a layout into a stack frame.
__device__ __noinline__ int cu_seqlens_bad(const long long* __restrict__ cu, int N, long long T, int tid, int nt) {
    int bad = 0;
    for (int i = tid; i <= N; i += nt) {
        const long long c = cu[i];
        bad |= i == 0 ? c != 0 : c < cu[i - 1];
        bad |= i == N && c != T;
    }
    return bad;
}

// Zeroes rows [r0, r1) of out [T, 8, 128] at columns col .. col + rows - 1.
__device__ __noinline__ void zero_rows(bf16_t* __restrict__ out, long long r0, long long r1, int col, int rows,
                                       int tid, int nt) {
    for (long long i = tid; i < (r1 - r0) * rows; i += nt) out[(r0 + i / rows) * 1024 + col + i % rows] = (bf16_t)0;
}

template <int KSPLIT, int ROWS, int CHUNK>  // CHUNK: tokens staged in shared memory at a time
__device__ __forceinline__ void gdn_prefill_rows(
    const bf16_t* __restrict__ q, const bf16_t* __restrict__ k, const bf16_t* __restrict__ v,
    float* __restrict__ state, const float* __restrict__ A_log, const bf16_t* __restrict__ a,
    const float* __restrict__ dt_bias, const bf16_t* __restrict__ b,
    const long long* __restrict__ cu_seqlens, bf16_t* __restrict__ out, float scale, long long T) {
    constexpr int NT = ROWS * KSPLIT;   // threads
    constexpr int NC = 32 / KSPLIT;     // float4 chunks of the row per thread
    constexpr int VSPLIT = 128 / ROWS;  // blocks per (sequence, head)
    constexpr int NACC = NC < 4 ? NC : 4;
    constexpr bool SHORT_SLICE = NC <= 8;  // KSPLIT >= 4: see token() below
    constexpr int QK_ITEMS = CHUNK * 32, QK_PER = (QK_ITEMS + NT - 1) / NT;  // (token, lane): k and q uint2
    constexpr int V_ITEMS = CHUNK * ROWS, V_PER = (V_ITEMS + NT - 1) / NT;   // bf16 loads of v
    static_assert(NT % 32 == 0 && 32 % KSPLIT == 0 && 128 % ROWS == 0 && NT >= CHUNK, "bad shape");

    __shared__ float4 kq_s[2][CHUNK][2][32];  // [buffer][token][k, q][16-byte chunk], fp32
    __shared__ float v_s[2][CHUNK][ROWS];
    __shared__ float g_s[2][CHUNK][4];        // gate g, beta, k.q

    const int tid = threadIdx.x;
    const int sub = tid % KSPLIT, rloc = tid / KSPLIT;
    const int nh = blockIdx.x / VSPLIT;  // n * 8 + h
    const int row0 = (blockIdx.x - nh * VSPLIT) * ROWS;
    const int h = nh & 7, hk = h >> 1;
    const int N = gridDim.x / (8 * VSPLIT);
    if (__syncthreads_or(cu_seqlens_bad(cu_seqlens, N, T, tid, NT))) {  // malformed batch
        zero_rows(out, (nh >> 3) * T / N, ((nh >> 3) + 1) * T / N, h * 128 + row0, ROWS, tid, NT);
        return;
    }
    const long long t0 = cu_seqlens[nh >> 3], t1 = cu_seqlens[(nh >> 3) + 1];
    if (t1 <= t0) return;  // an empty sequence keeps its state (kdispatch's reference)

    float4* srow = reinterpret_cast<float4*>(state + ((size_t)nh * 128 + row0 + rloc) * 128);
    float4 S[NC];
#pragma unroll
    for (int j = 0; j < NC; ++j) S[j] = srow[j * KSPLIT + sub];

    const float ea = expf(A_log[h]), dtb = dt_bias[h];
    const uint2* k2 = reinterpret_cast<const uint2*>(k) + hk * 32;  // token t: + t * 128
    const uint2* q2 = reinterpret_cast<const uint2*>(q) + hk * 32;
    const bf16_t* vh = v + h * 128 + row0;                           // token t: + t * 1024

    // The inputs of tokens tc .. tc + CHUNK - 1 (zeros past the sequence end), spread over the block:
    // warp w loads k and q of whole tokens (lane l: columns 4l..4l+3), so k.q is one warp reduction.
    uint2 k_r[QK_PER], q_r[QK_PER];
    bf16_t v_r[V_PER], a_r = 0, b_r = 0;
    auto load_chunk = [&](long long tc) {
#pragma unroll
        for (int m = 0; m < QK_PER; ++m) {
            const int item = tid + m * NT;
            const long long t = tc + (item >> 5);
            k_r[m] = q_r[m] = make_uint2(0u, 0u);
            if ((QK_ITEMS % NT == 0 || item < QK_ITEMS) && t < t1) {
                k_r[m] = k2[t * 128 + (item & 31)];
                q_r[m] = q2[t * 128 + (item & 31)];
            }
        }
#pragma unroll
        for (int m = 0; m < V_PER; ++m) {
            const int item = tid + m * NT, tok = item / ROWS, row = item % ROWS;
            const long long t = tc + tok;
            v_r[m] = 0;
            if ((V_ITEMS % NT == 0 || item < V_ITEMS) && t < t1) v_r[m] = vh[t * 1024 + row];
        }
        if (tid < CHUNK && tc + tid < t1) {
            a_r = a[(tc + tid) * 8 + h];
            b_r = b[(tc + tid) * 8 + h];
        }
    };
    auto store_chunk = [&](int buf) {
#pragma unroll
        for (int m = 0; m < QK_PER; ++m) {
            const int item = tid + m * NT;  // warp-uniform token: the shuffles below are safe
            if (QK_ITEMS % NT == 0 || item < QK_ITEMS) {
                const float4 kk = bf16x4(k_r[m]), qq = bf16x4(q_r[m]);
                kq_s[buf][item >> 5][0][item & 31] = kk;
                kq_s[buf][item >> 5][1][item & 31] = qq;
                float kq = dot4(kk, qq);
#pragma unroll
                for (int off = 16; off > 0; off >>= 1) kq += __shfl_xor_sync(0xffffffffu, kq, off);
                if ((item & 31) == 0) g_s[buf][item >> 5][2] = kq;
            }
        }
#pragma unroll
        for (int m = 0; m < V_PER; ++m) {
            const int item = tid + m * NT;
            if (V_ITEMS % NT == 0 || item < V_ITEMS) v_s[buf][item / ROWS][item % ROWS] = bf16_to_f(v_r[m]);
        }
        if (tid < CHUNK) {
            g_s[buf][tid][0] = expf(-ea * softplus(bf16_to_f(a_r) + dtb));
            g_s[buf][tid][1] = 1.f / (1.f + expf(-bf16_to_f(b_r)));
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
                out[(size_t)(tc + i) * 1024 + h * 128 + row0 + rloc] = f_to_bf16(scale * fmaf(g, sq, delta * kq));

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

// gdn_prefill_thread_rows_k<KSPLIT>_r<ROWS>_c<CHUNK>: block = ROWS * KSPLIT threads.
#define GDN_PREFILL_KERNEL(KSPLIT, ROWS, CHUNK)                                                     \
    extern "C" __global__ void __launch_bounds__(ROWS * KSPLIT)                                     \
        gdn_prefill_thread_rows_k##KSPLIT##_r##ROWS##_c##CHUNK(                                     \
            const bf16_t* __restrict__ q, const bf16_t* __restrict__ k,                             \
            const bf16_t* __restrict__ v, float* __restrict__ state,                                \
            const float* __restrict__ A_log, const bf16_t* __restrict__ a,                          \
            const float* __restrict__ dt_bias, const bf16_t* __restrict__ b,                        \
            const long long* __restrict__ cu_seqlens, bf16_t* __restrict__ out, float scale,        \
            long long T) {                                                                          \
        gdn_prefill_rows<KSPLIT, ROWS, CHUNK>(q, k, v, state, A_log, a, dt_bias, b, cu_seqlens,     \
                                              out, scale, T);                                       \
    }

GDN_PREFILL_KERNEL(1, 128, 8)  // one thread per row, one block per (sequence, head)
GDN_PREFILL_KERNEL(2, 64, 8)
GDN_PREFILL_KERNEL(4, 32, 8)
GDN_PREFILL_KERNEL(8, 16, 8)
GDN_PREFILL_KERNEL(16, 8, 8)
GDN_PREFILL_KERNEL(2, 64, 16)
GDN_PREFILL_KERNEL(4, 32, 16)
GDN_PREFILL_KERNEL(8, 16, 16)
GDN_PREFILL_KERNEL(16, 8, 16)
