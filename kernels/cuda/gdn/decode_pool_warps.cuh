// GDN pool decode (gdn_decode_packed_*) in one- and two-warp blocks. Not a source of its own:
// compiled appended to decode_warp_rows.cu with -DPOOL_HV=<HV> (decode_pool_warps.py joins them), the rows a
// warp loads, steps and stores are that file's (load_rows, finish_rows), only the block size differs.
// SGLang's Triton packed decode runs one warp over 32 rows a program and streams the largest pools
// (>= 128 MB of state) 2-3% faster than the 4-warp blocks (H100, 2026-11-25): more, smaller blocks
// resident per SM is the difference these configurations measure.
//
// Warp gw = blockIdx.x * W + warp owns the rows that warp gw % 4 of 4-warp block gw / 4 owns, so
// load_rows' mapping is reused as it is: grid = B * HV * 128 / (W R) blocks of 32 W threads, W = 1, 2.

template <int R, int W, bool CS>
__device__ __forceinline__ void gdn_decode_pool_warps(
    const bf16_t* __restrict__ q, const bf16_t* __restrict__ k, const bf16_t* __restrict__ v,
    float* __restrict__ state, const float* __restrict__ A_log, const bf16_t* __restrict__ a,
    const float* __restrict__ dt_bias, const bf16_t* __restrict__ b, bf16_t* __restrict__ out,
    float scale, const Strides& st) {
    const int lane = threadIdx.x & 31;
    const int gw = blockIdx.x * W + (threadIdx.x >> 5);
    Rows<R> x;
    load_rows<R, CS, POOL_HV, 2, true>(x, gw >> 2, gw & 3, lane, q, k, v, state, A_log, a, dt_bias, b, st);
    finish_rows<R, CS, true>(x, lane, out, scale);
}

// The pool kernels' parameters (decode_warp_rows.cu's GDN_DECODE_KERNEL).
#define GDN_POOL_WARPS_KERNEL(NAME, R, W, CS)                                                       \
    extern "C" __global__ void __launch_bounds__(32 * W) NAME(                                      \
        const bf16_t* __restrict__ q, const bf16_t* __restrict__ k, const bf16_t* __restrict__ v,   \
        float* __restrict__ state, const float* __restrict__ A_log, const bf16_t* __restrict__ a,   \
        const float* __restrict__ dt_bias, const bf16_t* __restrict__ b, bf16_t* __restrict__ out, \
        float scale, int q_b, int q_h, int k_b, int k_h, int v_b, int v_h, int a_b, int b_b,       \
        long long state_b, int state_h, int state_r, const int* __restrict__ slots, int num_slots) {  \
        gdn_decode_pool_warps<R, W, CS>(q, k, v, state, A_log, a, dt_bias, b, out, scale,           \
            Strides{q_b, q_h, k_b, k_h, v_b, v_h, a_b, b_b, state_b, state_h, state_r, slots,         \
                    num_slots});                                                                    \
    }

// gdn_decode_pool_warps[_cs]_r<R>_w<W>
GDN_POOL_WARPS_KERNEL(gdn_decode_pool_warps_r8_w1, 8, 1, false)
GDN_POOL_WARPS_KERNEL(gdn_decode_pool_warps_cs_r8_w1, 8, 1, true)
GDN_POOL_WARPS_KERNEL(gdn_decode_pool_warps_r16_w1, 16, 1, false)
GDN_POOL_WARPS_KERNEL(gdn_decode_pool_warps_cs_r16_w1, 16, 1, true)
GDN_POOL_WARPS_KERNEL(gdn_decode_pool_warps_cs_r32_w1, 32, 1, true)
GDN_POOL_WARPS_KERNEL(gdn_decode_pool_warps_r8_w2, 8, 2, false)
GDN_POOL_WARPS_KERNEL(gdn_decode_pool_warps_cs_r8_w2, 8, 2, true)
GDN_POOL_WARPS_KERNEL(gdn_decode_pool_warps_cs_r16_w2, 16, 2, true)
