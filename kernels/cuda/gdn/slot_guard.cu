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
