// Pool slot indices made safe for a kernel that treats only negative slots as padding (SGLang's
// packed decode): every slot outside [0, num_slots) becomes -1. One launch, no host sync.
extern "C" __global__ void gdn_slot_guard(const int* __restrict__ slots, int* __restrict__ safe, int n,
                                          int num_slots) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        const int s = slots[i];
        safe[i] = (s >= 0 && s < num_slots) ? s : -1;
    }
}

// The indices of a speculative-verify call made safe for SGLang's verify kernel (which treats only
// negative slots and cache rows as absent, trusts cu_seqlens, and stores every step of a request
// into consecutive rows of the intermediate-states buffer), in one launch of one block:
//   safe_cu [N + 1]: cu (int32) where 0 = cu[0] <= ... <= cu[N] = T, else the even partition n * T / N;
//   safe_slots [N]: slot, -1 where outside [0, num_slots);
//   safe_rows [N]: cache row, -1 where outside [0, num_rows) or the request has more than `steps` tokens.
extern "C" __global__ void __launch_bounds__(1024) gdn_verify_guard(
    const int* __restrict__ slots, const int* __restrict__ rows, const int* __restrict__ cu,
    int* __restrict__ safe_slots, int* __restrict__ safe_rows, int* __restrict__ safe_cu, int N, long long T,
    int num_slots, int num_rows, int steps) {
    int bad = 0;
    for (int i = threadIdx.x; i <= N; i += blockDim.x) {
        const int c = cu[i];
        bad |= i == 0 ? c != 0 : c < cu[i - 1];
        bad |= i == N && c != T;
    }
    bad = __syncthreads_or(bad);
    for (int i = threadIdx.x; i <= N; i += blockDim.x)
        safe_cu[i] = bad ? (int)((long long)i * T / (N > 0 ? N : 1)) : cu[i];
    __syncthreads();
    for (int n = threadIdx.x; n < N; n += blockDim.x) {
        const int s = slots[n], r = rows[n];
        safe_slots[n] = (s >= 0 && s < num_slots) ? s : -1;
        safe_rows[n] = (r >= 0 && r < num_rows && safe_cu[n + 1] - safe_cu[n] <= steps) ? r : -1;
    }
}
