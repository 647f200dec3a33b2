"""How fast can scattered cache rows be gathered at all? The bound under DSA sparse attention.

    python benchmarks/dsa_gather_rate.py

Every SM (one CTA each) copies `rows` rows of 1152 bytes (a ckv + kpe row of the sparse-attention
cache) from a 600 MiB buffer into shared memory with one TMA bulk copy a row, as
kernels/cuda/dsa/sparse_attention_splitk.cu does, and nothing else. Rows are random, random but
sorted within a CTA, or contiguous; the L2 is cold (a 256 MiB read between calls: clean lines, none
left to write back) or hot (the same gather just before). Event time of one launch, median of 15,
and the same for a one-row gather (launch plus one memory round trip), which the GB/s line subtracts.
"""
from __future__ import annotations

import statistics

import torch

from kdispatch import nvrtc

SOURCE = r"""
typedef unsigned int u32;
__device__ __forceinline__ u32 smem_addr(const void* p) {
    u32 r;
    asm volatile("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(r) : "l"(p));
    return r;
}
// CTA c copies rows idx[c * n .. c * n + n) of row_bytes each into shared memory (warp 0, a lane a
// row, all on one mbarrier), waits for all of them, and writes one word so nothing is dead code.
extern "C" __global__ void __launch_bounds__(128, 1)
gather_rows(const unsigned char* __restrict__ src, const int* __restrict__ idx, int n, int row_bytes,
            float* __restrict__ sink) {
    extern __shared__ __align__(128) unsigned char rows[];
    __shared__ unsigned long long bar;
    const int t = threadIdx.x;
    const int* mine = idx + blockIdx.x * n;
    const u32 b = smem_addr(&bar), s0 = smem_addr(rows);
    if (t == 0) {
        asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(b));
        asm volatile("fence.mbarrier_init.release.cluster;");
    }
    __syncthreads();
    if (t < 32) {
        if (t == 0) asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(b), "r"(n * row_bytes) : "memory");
        __syncwarp();
        for (int r = t; r < n; r += 32)
            asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                         ::"r"(s0 + r * row_bytes), "l"(src + (long long)mine[r] * row_bytes), "r"(row_bytes), "r"(b)
                         : "memory");
    }
    u32 done = 0;
    while (!done)
        asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], 0; selp.u32 %0, 1, 0, p; }"
                     : "=r"(done) : "r"(b) : "memory");
    if (t == 0) sink[blockIdx.x] = *(const float*)(rows + (n - 1) * row_bytes);
}
"""
ROW_BYTES = 1152  # bf16 ckv (512) + kpe (64)


def main() -> None:
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    kernel = nvrtc.load_kernel(SOURCE, "gather_rows", signature="ppiip")
    kernel.set_attribute("MAX_DYNAMIC_SHARED_SIZE_BYTES", 200 * 1024)
    src = torch.zeros(600 << 20, dtype=torch.uint8, device="cuda")
    flush = torch.ones(64 << 20, dtype=torch.float32, device="cuda")
    sink = torch.empty(sms, device="cuda")
    stream = torch.cuda.current_stream().cuda_stream
    n_rows = src.numel() // ROW_BYTES

    def launch(idx, n):
        kernel.launch(sms, 128, src, idx, n, ROW_BYTES, sink, shmem=n * ROW_BYTES, stream=stream)

    def time_us(idx, n, hot):
        times = []
        for _ in range(15):
            flush.sum()
            if hot:
                launch(idx, n)
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            launch(idx, n)
            e1.record()
            e1.synchronize()
            times.append(e0.elapsed_time(e1) * 1e3)
        return statistics.median(times)

    one = torch.arange(sms, device="cuda", dtype=torch.int32)
    base = {hot: time_us(one, 1, hot) for hot in (False, True)}
    print(f"{torch.cuda.get_device_name()}: one row a CTA (launch + a round trip) cold {base[False]:.2f} us, "
          f"hot {base[True]:.2f} us")
    for n in (32, 128):
        total = sms * n * ROW_BYTES
        rand = torch.randint(0, n_rows, (sms * n,), device="cuda", dtype=torch.int32)
        patterns = {"random": rand, "sorted": rand.view(sms, n).sort(dim=1).values.reshape(-1).contiguous(),
                    "contiguous": torch.arange(sms * n, device="cuda", dtype=torch.int32) + 12345}
        for name, idx in patterns.items():
            cells = []
            for hot in (False, True):
                us = time_us(idx, n, hot)
                cells.append(f"{'hot' if hot else 'cold'} {us:.2f} us ({total / (us - base[hot]) / 1e6:.2f} TB/s)")
            print(f"{n:4d} rows a CTA ({total / 2**20:.1f} MiB), {name:10s}: " + ", ".join(cells), flush=True)


if __name__ == "__main__":
    main()
