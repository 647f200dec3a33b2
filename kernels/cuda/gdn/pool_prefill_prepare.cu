// One launch before FlashInfer's chunked GDN prefill on a state pool in place
// (chunk_gated_delta_rule(..., initial_state=pool, output_state=pool, state_indices=slots)), which
// trusts every value it is given: it reads and writes pool[slots[n]] unchecked, takes cu_seqlens as
// they are, has no has_initial_state and no padding slot. Everything the definition promises is
// made here, so nothing runs after the library call:
//
//   token blocks (`tpb` tokens each, at most PREP_TOKENS; the host sizes them so that enough blocks
//     stream): q, k L2-normalised (x / sqrt(x.x + 1e-6), the
//     reference's) into contiguous bf16 copies, v copied when it is not contiguous, alpha = exp(g)
//     and beta in fp32; a padding token (its sequence's slot outside the pool) gets q = k = v = 0,
//     alpha = 1, beta = 0, which leaves any state it passes through exactly as it was and outputs
//     zeros, and its output rows are zeroed; a malformed batch's output is zeroed whole;
//   fresh-row blocks (one per sequence and head): the pool row of a live sequence without an
//     initial state zeroed, when the batch is well formed (the library then reads zeros);
//   the last block: the boundaries and slots the library gets. A padding sequence becomes empty (the
//     library neither reads nor writes the state of an empty sequence) and its tokens join the live
//     sequence before it (the first live one for leading padding), as neutral tokens; its slot
//     becomes 0, never touched. A malformed batch (not 0 = cu[0] <= ... <= cu[N] = T) becomes N
//     empty sequences: no output written, no state read or written.
//
// Every block checks cu_seqlens itself, so no block waits on another. Header-free for NVRTC: bf16
// as raw 16-bit patterns.

typedef unsigned short bf16_t;

#define PREP_TOKENS 32  // most tokens a block takes: pool_prefill_prepare.py's MAX_TOKENS
#define PREP_THREADS 256

__device__ __forceinline__ float bf16_to_f(bf16_t x) { return __uint_as_float(((unsigned int)x) << 16); }

__device__ __forceinline__ unsigned int f_to_bf16(float f) {  // round to nearest even
    const unsigned int u = __float_as_uint(f);
    return (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
}

__device__ __forceinline__ bool live(int s, int num_slots) { return s >= 0 && s < num_slots; }

// Not 0 = cu[0] <= ... <= cu[N] = T; block-uniform.
__device__ __forceinline__ int malformed(const int* __restrict__ cu, int N, long long T) {
    int bad = 0;
    for (int i = threadIdx.x; i <= N; i += blockDim.x) {
        const int c = cu[i];
        bad |= i == 0 ? c != 0 : c < cu[i - 1];
        bad |= i == N && (long long)c != T;
    }
    return __syncthreads_or(bad);
}

// One 128-wide row by 8 lanes (`sub`, 0-7 of the row's group), 16 values each in 4 independent 8-byte
// loads (row starts need only 8-byte alignment). Normalised (norm) or copied; zeros for a padding token.
__device__ __forceinline__ void row(const bf16_t* __restrict__ src, bf16_t* __restrict__ dst, bool pad, bool norm,
                                    int sub) {
    uint2 raw[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) raw[i] = reinterpret_cast<const uint2*>(src)[i * 8 + sub];
    float x[16];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        x[4 * i] = bf16_to_f(raw[i].x & 0xffffu);
        x[4 * i + 1] = bf16_to_f(raw[i].x >> 16);
        x[4 * i + 2] = bf16_to_f(raw[i].y & 0xffffu);
        x[4 * i + 3] = bf16_to_f(raw[i].y >> 16);
    }
    float r = pad ? 0.f : 1.f;
    if (norm) {  // the row's 8 lanes reduce among themselves (pad is uniform over them)
        const unsigned int group_mask = 0xffu << (threadIdx.x & 24);
        float ss = 0.f;
#pragma unroll
        for (int i = 0; i < 16; ++i) ss += x[i] * x[i];
        for (int o = 4; o > 0; o >>= 1) ss += __shfl_xor_sync(group_mask, ss, o);
        if (!pad) r = 1.f / sqrtf(ss + 1e-6f);
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        uint2 w;
        w.x = f_to_bf16(x[4 * i] * r) | (f_to_bf16(x[4 * i + 1] * r) << 16);
        w.y = f_to_bf16(x[4 * i + 2] * r) | (f_to_bf16(x[4 * i + 3] * r) << 16);
        reinterpret_cast<uint2*>(dst)[i * 8 + sub] = w;
    }
}

extern "C" __global__ void __launch_bounds__(PREP_THREADS) gdn_pool_prefill_prepare(
    const bf16_t* __restrict__ q, const bf16_t* __restrict__ k, const bf16_t* __restrict__ v,
    const float* __restrict__ g, const float* __restrict__ beta, float* __restrict__ pool,
    const int* __restrict__ slots, const unsigned char* __restrict__ has_init, const int* __restrict__ cu,
    bf16_t* __restrict__ out,
    bf16_t* __restrict__ q_out, bf16_t* __restrict__ k_out, bf16_t* __restrict__ v_out,  // v_out null: v as given
    float* __restrict__ gates_out,  // [2, T, HV]: alpha, beta
    int* __restrict__ meta_out,     // [N + 1] boundaries, then [N] slots
    long long T, int N, int HQ, int HV, int num_slots, int tpb,
    long long s_qt, long long s_qh, long long s_kt, long long s_kh, long long s_vt, long long s_vh,
    long long s_slot, long long s_head, long long s_row) {
    const int token_blocks = (int)((T + tpb - 1) / tpb);
    const int b = blockIdx.x;

    if (b < token_blocks) {
        __shared__ unsigned char pad[PREP_TOKENS];
        const int bad = malformed(cu, N, T);
        const long long t0 = (long long)b * tpb;
        const int tokens = (int)(T - t0 < tpb ? T - t0 : tpb);
        if (threadIdx.x < tokens) {
            bool p = true;
            if (!bad) {  // the sequence holding the token: the last n with cu[n] <= t
                const long long t = t0 + threadIdx.x;
                int lo = 0, hi = N;  // cu[lo] <= t < cu[hi]
                while (hi - lo > 1) {
                    const int mid = (lo + hi) >> 1;
                    if ((long long)cu[mid] <= t) lo = mid; else hi = mid;
                }
                p = !live(slots[lo], num_slots);
            }
            pad[threadIdx.x] = p;
        }
        __syncthreads();
        const int rows_qk = tokens * HQ, rows_v = v_out != nullptr ? tokens * HV : 0;
        const int group = threadIdx.x >> 3, sub = threadIdx.x & 7, groups = blockDim.x >> 3;
        for (int r = group; r < 2 * rows_qk + rows_v; r += groups) {
            if (r < 2 * rows_qk) {
                const bool is_k = r >= rows_qk;
                const int rr = is_k ? r - rows_qk : r, t = rr / HQ, h = rr % HQ;
                const long long tt = t0 + t;
                const bf16_t* src = is_k ? k + tt * s_kt + h * s_kh : q + tt * s_qt + h * s_qh;
                bf16_t* dst = (is_k ? k_out : q_out) + (tt * HQ + h) * 128;
                row(src, dst, pad[t], true, sub);
            } else {
                const int rr = r - 2 * rows_qk, t = rr / HV, h = rr % HV;
                const long long tt = t0 + t;
                row(v + tt * s_vt + h * s_vh, v_out + (tt * HV + h) * 128, pad[t], false, sub);
            }
        }
        for (int i = threadIdx.x; i < tokens * HV; i += blockDim.x) {
            const long long at = t0 * HV + i;
            const bool p = pad[i / HV];
            gates_out[at] = p ? 1.f : expf(g[at]);
            gates_out[T * HV + at] = p ? 0.f : beta[at];
        }
        // output rows of padding tokens (all of a malformed batch's), 16-byte stores: 16 a head row
        uint4* o = reinterpret_cast<uint4*>(out + t0 * HV * 128);
        for (int i = threadIdx.x; i < tokens * HV * 16; i += blockDim.x)
            if (pad[i / (HV * 16)]) o[i] = make_uint4(0, 0, 0, 0);
        return;
    }

    if (b < token_blocks + N * HV) {  // a fresh sequence's pool row, zeroed
        const int n = (b - token_blocks) / HV, h = (b - token_blocks) % HV;
        const int s = slots[n];
        if (!live(s, num_slots) || has_init[n]) return;  // block-uniform
        if (malformed(cu, N, T)) return;
        float* dst = pool + s * s_slot + h * s_head;
        for (int i = threadIdx.x; i < 128 * 32; i += blockDim.x)
            reinterpret_cast<float4*>(dst + (i >> 5) * s_row)[i & 31] = make_float4(0.f, 0.f, 0.f, 0.f);
        return;
    }

    // The last block: boundaries and slots for the library. next[i] = the first live sequence at or
    // after i (N past the last), found per thread over a segment, then across segments.
    __shared__ int seg_first[PREP_THREADS];
    const int bad = malformed(cu, N, T);
    const int per = (N + 1 + PREP_THREADS - 1) / PREP_THREADS;
    const int lo = threadIdx.x * per, hi = min(lo + per, N + 1);
    int first = N + 1;
    for (int i = lo; i < hi; ++i)
        if (i == N || live(slots[i], num_slots)) { first = i; break; }
    seg_first[threadIdx.x] = first;
    __syncthreads();
    int next = N;
    for (int j = threadIdx.x + 1; j < PREP_THREADS; ++j) next = min(next, seg_first[j]);
    __syncthreads();
    // first live sequence of the batch (N without): thread 0 scans segments in order
    __shared__ int first_live;
    if (threadIdx.x == 0) {
        int f = N;
        for (int j = 0; j < PREP_THREADS; ++j)
            if (seg_first[j] <= N) { f = seg_first[j]; break; }
        first_live = f;
    }
    __syncthreads();
    for (int i = hi - 1; i >= lo; --i) {
        if (i == N || live(slots[i], num_slots)) next = i;
        meta_out[i] = bad || i <= first_live ? 0 : cu[next];
        if (i < N) meta_out[N + 1 + i] = live(slots[i], num_slots) ? slots[i] : 0;
    }
}
