// DSA top-k indexer, scoring: score[t] = sum_h w[h] * relu((q[h] . k[t]) * scale[t]) for every cached
// token of every row with more than 2048 tokens, on the Hopper tensor cores (FP8 wgmma).
//
// Shapes (contiguous; B = batch, W = max_num_pages * 64):
//   q        [B, 64, 128] fp8 e4m3         cache [num_pages, 8448] bytes: per page 64 FP8 keys of 128
//   w        [B, 64] fp32                          bytes, then their 64 fp32 scales (deep_gemm layout)
//   seq_lens [B] int32                     block_table [B, max_num_pages] int32 (row stride s_bt)
//   scores   [B, W] fp32: written for the pages a row's seq_len reaches when seq_len > 2048 (shorter
//            rows are passed through by the select unscored); other slots are left unwritten.
//
// Grid (B, ceil(max_num_pages / pages_per_cta)), one warpgroup (128 threads). The CTA copies the row's
// queries once and its pages through a ring of STAGES buffers into shared memory with cp.async, 16
// bytes a thread, placing each 16-byte chunk c of row r at chunk c ^ (r % 8): the 128-byte swizzled
// K-major layout wgmma reads (a key row and a query row are both exactly 128 bytes). Per page, 4
// wgmma m64n64k32 (tokens x heads, 32 dims a step) give the [64 tokens, 64 heads] logits in
// registers; the head reduction runs on them: relu, weight, sum over a thread's 16 heads, then over
// the 4 threads of a quad (2 shuffles). A first version on FP8 mma.sync (m16n8k32, fragments loaded
// straight from global memory) ran about 1 us a page on an H100 even with the next page prefetched:
// on sm_90 the FP8 tensor-core path is wgmma.
//
// Header-free (NVRTC needs no CUDA include directory).

#define TOPK 2048
#define PAGE 64
#define HEADS 64
#define DIM 128
#define KEY_BYTES (PAGE * DIM)             // 8192
#define PAGE_BYTES (KEY_BYTES + PAGE * 4)  // keys, then fp32 scales: 8448
#define STAGE_BYTES 9216                   // a page, padded to a multiple of 1024 (the swizzle atom)
#define STAGES 4
#define THREADS 128

typedef unsigned int u32;
typedef unsigned long long u64;

__device__ __forceinline__ u32 smem_addr(const void* p) {
    u32 r;
    asm volatile("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(r) : "l"(p));
    return r;
}

__device__ __forceinline__ void cp_async16(u32 dst, const void* src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(src) : "memory");
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }

template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory"); }

// 64 rows of 128 bytes (global, row-major) into the swizzled layout at `dst` (1024-byte aligned).
__device__ __forceinline__ void copy_rows(u32 dst, const unsigned char* src, int tid) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {  // 512 chunks of 16 bytes
        const int id = i * THREADS + tid, r = id >> 3, c = id & 7;
        cp_async16(dst + r * 128 + ((c ^ (r & 7)) << 4), src + r * 128 + (c << 4));
    }
}

__device__ __forceinline__ void copy_page(u32 dst, const unsigned char* page, int tid) {
    copy_rows(dst, page, tid);
    if (tid < 16) cp_async16(dst + KEY_BYTES + (tid << 4), page + KEY_BYTES + (tid << 4));  // scales
}

// Shared-memory matrix descriptor: K-major, 128-byte swizzle, 8-row groups 1024 bytes apart.
__device__ __forceinline__ u64 desc(u32 addr) {
    return (u64)((addr >> 4) & 0x3FFF) | ((u64)1 << 16) | ((u64)(1024 >> 4) << 32) | ((u64)1 << 62);
}

__device__ __forceinline__ void wgmma_m64n64k32(float* d, u64 da, u64 db) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"  // scale-d = 1: accumulate into d
        "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 "
        "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
        "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, %32, %33, p, 1, 1;\n"
        "}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "l"(da), "l"(db), "r"(1));
}

extern "C" __global__ void __launch_bounds__(THREADS)
dsa_index_score(const unsigned char* __restrict__ q, const unsigned char* __restrict__ cache,
                const float* __restrict__ w, const int* __restrict__ seq_lens,
                const int* __restrict__ block_table, float* __restrict__ scores,
                int max_pages, int num_pages, int s_bt, int pages_per_cta) {
    __shared__ __align__(1024) unsigned char ring[STAGES][STAGE_BYTES];
    __shared__ __align__(1024) unsigned char qs[HEADS * DIM];

    // The select, launched as a programmatic dependent, may start once every CTA here has started:
    // its launch and prologue overlap this grid's tail (it waits before reading the scores).
    asm volatile("griddepcontrol.launch_dependents;");
    const int b = blockIdx.x, p0 = blockIdx.y * pages_per_cta;
    int seq_len = seq_lens[b];
    seq_len = seq_len < max_pages * PAGE ? seq_len : max_pages * PAGE;  // as the select clamps it (no overflow below)
    if (seq_len <= TOPK || p0 * PAGE >= seq_len) return;  // short rows are passed through unscored
    const int last = (seq_len + PAGE - 1) / PAGE;  // pages this row reaches
    int p1 = p0 + pages_per_cta;
    p1 = p1 < max_pages ? p1 : max_pages;
    p1 = p1 < last ? p1 : last;
    const int n = p1 - p0;  // >= 1

    const int tid = threadIdx.x, lane = tid & 31, quad = lane & 3;
    const int row = (tid >> 5) * 16 + (lane >> 2);  // this thread's tokens of a page: row and row + 8
    const int* bt = block_table + (long long)b * s_bt + p0;
    const u32 ring0 = smem_addr(ring), q0 = smem_addr(qs);

    // Out-of-range page ids read page 0 and score 0.
#define PAGE_PTR(id) (cache + (long long)((id) >= 0 && (id) < num_pages ? (id) : 0) * PAGE_BYTES)
    copy_rows(q0, q + (long long)b * HEADS * DIM, tid);
#pragma unroll
    for (int i = 0; i < STAGES - 1; ++i) {  // group i: page i (group 0 also holds the queries)
        if (i < n) copy_page(ring0 + i * STAGE_BYTES, PAGE_PTR(bt[i]), tid);
        cp_async_commit();
    }
    float2 wf[8];  // weights of heads 8j + 2 quad and + 1 (this thread's accumulator columns)
#pragma unroll
    for (int j = 0; j < 8; ++j) wf[j] = *reinterpret_cast<const float2*>(w + b * HEADS + 8 * j + 2 * quad);

    float* out = scores + (long long)b * max_pages * PAGE + (long long)p0 * PAGE;
    for (int i = 0; i < n; ++i) {
        cp_async_wait<STAGES - 2>();  // this thread's copies of page i have landed
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // visible to wgmma (async proxy)
        __syncthreads();  // everyone's copies of page i; everyone done with page i - 1's buffer
        if (i + STAGES - 1 < n) copy_page(ring0 + ((i + STAGES - 1) % STAGES) * STAGE_BYTES, PAGE_PTR(bt[i + STAGES - 1]), tid);
        cp_async_commit();  // (possibly empty: keeps the group count per iteration fixed)

        const u32 keys = ring0 + (i % STAGES) * STAGE_BYTES;
        float d[32];
#pragma unroll
        for (int k = 0; k < 32; ++k) d[k] = 0.f;
        asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
        for (int s = 0; s < 4; ++s) wgmma_m64n64k32(d, desc(keys + 32 * s), desc(q0 + 32 * s));
        asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
        asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");

        const float* sc = reinterpret_cast<const float*>(ring[i % STAGES] + KEY_BYTES);
        const float sc0 = sc[row], sc1 = sc[row + 8];
        float s0 = 0.f, s1 = 0.f;  // partial scores of tokens row and row + 8 over this thread's heads
#pragma unroll
        for (int j = 0; j < 8; ++j) {  // d[4j], d[4j+1]: token row, heads 8j + 2 quad, + 1; d[4j+2..3]: row + 8
            s0 += wf[j].x * fmaxf(d[4 * j] * sc0, 0.f) + wf[j].y * fmaxf(d[4 * j + 1] * sc0, 0.f);
            s1 += wf[j].x * fmaxf(d[4 * j + 2] * sc1, 0.f) + wf[j].y * fmaxf(d[4 * j + 3] * sc1, 0.f);
        }
        s0 += __shfl_xor_sync(0xffffffffu, s0, 1);
        s0 += __shfl_xor_sync(0xffffffffu, s0, 2);
        s1 += __shfl_xor_sync(0xffffffffu, s1, 1);
        s1 += __shfl_xor_sync(0xffffffffu, s1, 2);
        const int id = bt[i];
        const bool ok = id >= 0 && id < num_pages;
        if (quad == 0) out[i * PAGE + row] = ok ? s0 : 0.f;
        if (quad == 1) out[i * PAGE + row + 8] = ok ? s1 : 0.f;
    }
#undef PAGE_PTR
}
