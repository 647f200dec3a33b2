// The launches around a library GDN prefill kernel (FlashInfer's, fla's), which trusts cu_seqlens.
//
// gdn_prefill_guard, before the library call, one launch:
//   - every block checks cu_seqlens [N + 1] (int32 as engines pass it, or int64; 0 = cu[0] <= ... <=
//     cu[N] = T), so no block waits on another for the verdict;
//   - block 0 writes the int64 cu_seqlens the library gets into safe[0 .. N] (the caller's when well formed;
//     else all zeros with `empty`: N empty sequences, whose final states are their initial ones, or
//     the even partition n * T / N, which any kernel takes safely) and the verdict into safe[N + 1];
//   - with `gates`: the activated gates FlashInfer wants for this block's tokens, fp32 [2, T, HV]:
//     alpha = exp(-exp(A_log) * softplus(a + dt_bias)) (softplus: beta 1, threshold 20), beta = sigmoid(b);
//     or, with `g` (engines' pre-activated log decay, fp32 [T, HV]), alpha = exp(g) only, fp32 [T, HV];
//   - with `out`: a malformed batch's output rows of this block's tokens zeroed (a library that is
//     given N empty sequences writes none of them), so no launch after the call is needed.
// gdn_prefill_commit, after the library call where one is needed (fla returns new final states):
//   well formed: state <- final; malformed: state kept, out zeroed.
//
// Header-free (NVRTC needs no CUDA include directory): bf16 is handled as raw 16-bit patterns.

typedef unsigned short bf16_t;

#define GUARD_TOKENS 32  // tokens a guard block activates (and zeroes); prefill_guard.py's TOKENS

__device__ __forceinline__ float bf16_to_f(bf16_t x) { return __uint_as_float(((unsigned int)x) << 16); }
__device__ __forceinline__ float softplus(float x) { return x > 20.f ? x : log1pf(expf(x)); }

// Read in place of a separate int32 -> int64 conversion launch (one graph node less a call).
__device__ __forceinline__ long long cu_at(const void* cu, int cu32, int i) {
    return cu32 ? (long long)static_cast<const int*>(cu)[i] : static_cast<const long long*>(cu)[i];
}

extern "C" __global__ void __launch_bounds__(256) gdn_prefill_guard(
    const void* __restrict__ cu, long long* __restrict__ safe, const float* __restrict__ A_log,
    const bf16_t* __restrict__ a, const float* __restrict__ dt_bias, const bf16_t* __restrict__ b,
    const float* __restrict__ g, float* __restrict__ gates, bf16_t* __restrict__ out, long long T, int N, int HV,
    long long s_at, long long s_bt, long long s_gt, int out_row, int empty, int cu32) {
    int bad = 0;
    for (int i = threadIdx.x; i <= N; i += blockDim.x) {
        const long long c = cu_at(cu, cu32, i);
        bad |= i == 0 ? c != 0 : c < cu_at(cu, cu32, i - 1);
        bad |= i == N && c != T;
    }
    bad = __syncthreads_or(bad);
    if (blockIdx.x == 0) {
        for (int i = threadIdx.x; i <= N; i += blockDim.x)
            safe[i] = !bad ? cu_at(cu, cu32, i) : empty ? 0 : (long long)i * T / (N > 0 ? N : 1);
        if (threadIdx.x == 0) safe[N + 1] = !bad;
    }
    const long long t0 = (long long)blockIdx.x * GUARD_TOKENS;
    const long long tokens = T - t0 < GUARD_TOKENS ? T - t0 : GUARD_TOKENS;
    if (tokens <= 0) return;
    if (g != nullptr) {
        for (int p = threadIdx.x; p < tokens * HV; p += blockDim.x) {
            const long long t = t0 + p / HV;
            const int h = p % HV;
            gates[t * HV + h] = expf(g[t * s_gt + h]);
        }
    } else if (gates != nullptr) {
        for (int p = threadIdx.x; p < tokens * HV; p += blockDim.x) {
            const long long t = t0 + p / HV;
            const int h = p % HV;
            const float x = bf16_to_f(a[t * s_at + h]) + dt_bias[h];
            gates[t * HV + h] = expf(-expf(A_log[h]) * softplus(x));
            gates[(T + t) * HV + h] = 1.f / (1.f + expf(-bf16_to_f(b[t * s_bt + h])));
        }
    }
    if (out != nullptr && bad) {  // out_row bf16 a token, a multiple of 8: 16-byte stores
        uint4* o = reinterpret_cast<uint4*>(out + t0 * out_row);
        for (long long i = threadIdx.x; i < tokens * out_row / 8; i += blockDim.x) o[i] = make_uint4(0, 0, 0, 0);
    }
}

extern "C" __global__ void __launch_bounds__(256) gdn_prefill_commit(
    float* __restrict__ state, const float* __restrict__ final_state, bf16_t* __restrict__ out,
    const long long* __restrict__ safe, int N, long long n_state, long long n_out) {
    const long long stride = (long long)gridDim.x * blockDim.x;
    const long long i0 = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (safe[N + 1]) {
        for (long long i = i0; i < n_state; i += stride) state[i] = final_state[i];
    } else {
        for (long long i = i0; i < n_out; i += stride) out[i] = (bf16_t)0;
    }
}
