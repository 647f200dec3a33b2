// The state gather and scatter an engine puts around a library prefill kernel that takes one
// contiguous state per sequence (SGLang on Hopper: `ssm_states[idx]` before FlashInfer's chunked
// prefill, `index_copy_` after), made safe for any slot value.  One launch each, no host sync.
//
//   pool   [num_slots, HV, 128, 128] fp32 (slot, head and row strides in elements, multiples of 4;
//          the last dimension contiguous)
//   slots  [N] int32: outside [0, num_slots) a padding sequence      has_init [N] bool
//   states, initial [N, HV, 128, 128] fp32 contiguous (the library's final states; gather's output)
// A block moves one (sequence, head): 128 rows of 32 float4.
//
// gdn_pool_gather: states[n] = pool[slots[n]] where the slot is live and has_init[n], else zeros.
// gdn_pool_scatter: pool[slots[n]] = states[n] where the slot is live and the batch well formed
// (ok[0] != 0, the prefill guard's verdict); an empty sequence stores its initial state (gathered:
// zeros without has_init), since the library writes no final state for it; the output rows of a
// padding sequence's tokens (cu[n] .. cu[n+1], the guard's safe boundaries) are zeroed, since the
// library wrote them.

__device__ __forceinline__ bool live(const int* __restrict__ slots, int n, int num_slots, int& s) {
    s = slots[n];
    return s >= 0 && s < num_slots;
}

extern "C" __global__ void __launch_bounds__(256) gdn_pool_gather(
    const float* __restrict__ pool, const int* __restrict__ slots, const unsigned char* __restrict__ has_init,
    float* __restrict__ states, int HV, int num_slots, long long s_slot, long long s_head, long long s_row) {
    const int n = blockIdx.x / HV, h = blockIdx.x % HV;
    int s;
    const bool from_pool = live(slots, n, num_slots, s) && has_init[n];
    float4* dst = reinterpret_cast<float4*>(states + (size_t)blockIdx.x * 128 * 128);
    const float* src = pool + s * s_slot + h * s_head;
    for (int i = threadIdx.x; i < 128 * 32; i += blockDim.x)
        dst[i] = from_pool ? reinterpret_cast<const float4*>(src + (i >> 5) * s_row)[i & 31]
                           : make_float4(0.f, 0.f, 0.f, 0.f);
}

extern "C" __global__ void __launch_bounds__(256) gdn_pool_scatter(
    float* __restrict__ pool, const int* __restrict__ slots, const float* __restrict__ states,
    const float* __restrict__ initial, const long long* __restrict__ ok, const long long* __restrict__ cu,
    unsigned short* __restrict__ out,
    int HV, int num_slots, long long s_slot, long long s_head, long long s_row) {
    const int n = blockIdx.x / HV, h = blockIdx.x % HV;
    int s;
    const long long t0 = cu[n], t1 = cu[n + 1];
    if (!live(slots, n, num_slots, s)) {  // this head's 128 columns of the sequence's output rows
        uint4* o = reinterpret_cast<uint4*>(out);  // 8 bf16 a store, 16 a head row
        for (long long i = threadIdx.x; i < (t1 - t0) * 16; i += blockDim.x)
            o[((t0 + i / 16) * HV + h) * 16 + i % 16] = make_uint4(0, 0, 0, 0);
        return;
    }
    if (ok[0] == 0) return;  // malformed batch: the pool stays as it was
    const float* from = t1 > t0 ? states : initial;
    const float4* src = reinterpret_cast<const float4*>(from + (size_t)blockIdx.x * 128 * 128);
    float* dst = pool + s * s_slot + h * s_head;
    for (int i = threadIdx.x; i < 128 * 32; i += blockDim.x)
        reinterpret_cast<float4*>(dst + (i >> 5) * s_row)[i & 31] = src[i];
}
