// DSA top-k indexer, selection: the exact top-2048 tokens of each row of fp32 scores, one CTA a row.
//
// Shapes (contiguous last axes; B = batch, W = max_num_pages * 64 <= THREADS * ITEMS):
//   scores      [B, W] fp32   (slots at or past seq_len, and whole rows with seq_len <= 2048, are
//                              never read: the scoring kernel leaves them unwritten)
//   seq_lens    [B] int32     block_table [B, max_num_pages] int32 (row stride s_bt)
//   num_pages   pages in the key cache: a page id outside [0, num_pages) makes its 64 tokens padding
//               (never selected), and seq_len is clamped to [0, W] (the reference's padding rule)
//   out         [B, 2048] int32: global token ids page * 64 + slot, then -1 padding; the selected
//               set is exact (ties at the k-th score: any of the tied tokens), in no particular
//               order, which is what the definition's evaluator compares (reachable, distinct,
//               sorted scores equal).
//
// The row's page ids are staged in shared memory once (with a block-wide scan of each page's valid
// tokens only when some page id is out of range). A row of at most 2048 valid tokens takes every
// one of them, in token order (pass-through; its scores are not read). Otherwise the row's scores
// sit in registers (up to 8 per thread of 1024, strided so the loads coalesce) as order-preserving 32-bit
// keys, and up to three radix passes over 11, 11 and 10 bits find the k-th largest key: per pass a
// 2048-bin shared-memory histogram of the digit among keys matching the prefix found so far, then
// one block-wide scan over the bins in descending order finds the digit where the count of larger
// keys crosses the number still needed. When that digit's bin holds exactly the keys still needed
// (usual after the second pass, where a bin holds a key or two) the search stops: every key whose
// prefix is at least the one found is selected. Each warp then reserves its output slots with one
// shared atomic (no block-wide scan).
//
// The kernel is bound by instruction issue (32 warps on 4 schedulers; clock64 stamps: each phase
// ~1.9k cycles with all 8 keys a thread): every per-key loop stops at the row's last key, so a row
// of 2135 tokens runs 3 key slots a thread, not 8. Measured on an H100 (2026-11-23; this kernel alone
// on precomputed scores, CUDA graph, rotated inputs, side by side with the version before these two
// changes): 3.70 us at B=4 x 34 pages and 5.49 us at B=30 x 91, against 4.91 and 6.14. Tried and dropped: warp-aggregated histogram
// atomics (__match_any_sync; 1.7 us slower), 512 threads x 16 keys (0.5 us slower), block-table
// reads from global memory per selected token (2.3 us slower than staging the row's pages in
// shared memory once), one warp scanning the histogram in place of the block (4 us slower: the
// crossing lane walks 64 bins serially), every warp scanning the 32 warp totals itself to save a
// barrier a pass (under 0.1 us).
//
// Header-free (NVRTC needs no CUDA include directory).

#define TOPK 2048
#define PAGE 64
#define BINS 2048
#define MAX_PAGES 128  // 8192 tokens

__device__ __forceinline__ unsigned int order_key(float s) {  // unsigned order == float order
    unsigned int u = __float_as_uint(s);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

#define THREADS 1024
#define WARPS (THREADS / 32)
#define ITEMS 8  // keys per thread: rows of up to 8192 tokens
#define BPT (BINS / THREADS)  // histogram bins per thread in the scan

// Exclusive block-wide scan of one value per thread; `*total` gets the block's sum. The caller
// must pass a barrier before `sums` (WARPS + 1 words) is written again.
__device__ __forceinline__ unsigned int block_exclusive_scan(unsigned int x, unsigned int* sums, unsigned int* total) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    unsigned int inc = x;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        unsigned int y = __shfl_up_sync(0xffffffffu, inc, o);
        if (lane >= o) inc += y;
    }
    if (lane == 31) sums[warp] = inc;
    __syncthreads();
    if (warp == 0) {
        unsigned int w = sums[lane];
        unsigned int winc = w;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            unsigned int y = __shfl_up_sync(0xffffffffu, winc, o);
            if (lane >= o) winc += y;
        }
        sums[lane] = winc - w;
        if (lane == 31) sums[WARPS] = winc;
    }
    __syncthreads();
    *total = sums[WARPS];
    return sums[warp] + inc - x;
}

extern "C" __global__ void __launch_bounds__(THREADS, 1)
dsa_topk_select(const float* __restrict__ scores, const int* __restrict__ seq_lens,
                const int* __restrict__ block_table, int* __restrict__ out, int width, int s_bt, int num_pages) {
    __shared__ unsigned int hist[3][BINS];  // one per pass: all zeroed up front, behind one barrier
    __shared__ unsigned int sums[WARPS + 1];
    __shared__ unsigned int chosen[3];  // digit, keys still needed at it, 1 if its bin is all needed
    __shared__ int pages[MAX_PAGES];  // the row's block table, read once; -1 for an out-of-range id
    __shared__ unsigned int page_first[MAX_PAGES];  // valid tokens on the row's earlier pages
    __shared__ unsigned int taken;  // output slots reserved so far (packed as in the last phase)

    const int b = blockIdx.x, t = threadIdx.x;
    int seq_len = seq_lens[b];
    seq_len = seq_len < width ? seq_len : width;  // a seq_len past the table counts its pages only
    seq_len = seq_len > 0 ? seq_len : 0;
    const int* bt = block_table + (long long)b * s_bt;
    int* o = out + (long long)b * TOPK;
    const int row_pages = (seq_len + PAGE - 1) / PAGE;  // <= MAX_PAGES <= THREADS
    unsigned int page_valid = 0u;
    bool ok = true;
    if (t < row_pages) {
        const int id = bt[t];
        ok = id >= 0 && id < num_pages;
        pages[t] = ok ? id : -1;
        page_valid = ok ? min(PAGE, seq_len - t * PAGE) : 0;
    }
    // Every page id in range (any valid input): one barrier, and token i goes to slot i. Otherwise
    // a scan places each page's valid tokens after those of the valid pages before it.
    const bool all_valid = __syncthreads_and(ok);
    unsigned int n_valid = seq_len;
    if (!all_valid) {  // block-uniform
        const unsigned int first = block_exclusive_scan(page_valid, sums, &n_valid);
        if (t < row_pages) page_first[t] = first;
        __syncthreads();
    }
    if (n_valid <= TOPK) {  // every valid token is selected, in token order: no scores needed
        for (int i = t; i < seq_len; i += THREADS) {
            const int p = pages[i / PAGE];
            if (p >= 0) o[(all_valid ? i - i % PAGE : page_first[i / PAGE]) + i % PAGE] = p * PAGE + i % PAGE;
        }
        for (int i = n_valid + t; i < TOPK; i += THREADS) o[i] = -1;
        return;
    }

    // Launched as a programmatic dependent of the scoring kernel (cuda_wgmma_radix), the CTA gets
    // here while the scores are still being written: wait for that grid. A no-op in a normal launch.
    asm volatile("griddepcontrol.wait;" ::: "memory");
    const float* row = scores + (long long)b * width;
    unsigned int key[ITEMS], valid_bits = 0u;  // bit j: key[j] is a valid token's
#pragma unroll
    for (int j = 0; j < ITEMS; ++j) {
        if (j * THREADS >= seq_len) break;  // block-uniform: no thread has a key here
        const int i = j * THREADS + t;
        const bool valid = i < seq_len && pages[i / PAGE] >= 0;
        key[j] = valid ? order_key(row[i]) : 0u;
        valid_bits |= valid ? 1u << j : 0u;
    }
    if (t == 0) taken = 0u;
#pragma unroll
    for (int k = 0; k < 3 * BPT; ++k) (&hist[0][0])[k * THREADS + t] = 0u;
    __syncthreads();

    unsigned int prefix = 0u, mask = 0u, need = TOPK;
#pragma unroll
    for (int pass = 0; pass < 3; ++pass) {
        const int shift = pass == 0 ? 21 : (pass == 1 ? 10 : 0);
        const unsigned int digit_mask = pass == 2 ? 1023u : 2047u;
        unsigned int* h = hist[pass];
#pragma unroll
        for (int j = 0; j < ITEMS; ++j) {
        if (j * THREADS >= seq_len) break;  // block-uniform: no thread has a key here
            if (((valid_bits >> j) & 1u) && (key[j] & mask) == prefix) atomicAdd(&h[(key[j] >> shift) & digit_mask], 1u);
        }
        __syncthreads();
        // Thread t holds bins BINS-1-BPT*t-k (k = 0..BPT-1): descending digits along the block.
        unsigned int c[BPT], mine = 0u;
#pragma unroll
        for (int k = 0; k < BPT; ++k) {
            c[k] = h[BINS - 1 - BPT * t - k];
            mine += c[k];
        }
        unsigned int total;
        unsigned int larger = block_exclusive_scan(mine, sums, &total);  // keys with larger digits
#pragma unroll
        for (int k = 0; k < BPT; ++k) {
            if (larger < need && larger + c[k] >= need) {  // exactly one (thread, k) of the block
                chosen[0] = BINS - 1 - BPT * t - k;
                chosen[1] = need - larger;
                chosen[2] = larger + c[k] == need;
            }
            larger += c[k];
        }
        __syncthreads();
        prefix |= chosen[0] << shift;
        mask |= digit_mask << shift;
        need = chosen[1];
        if (chosen[2]) break;  // block-uniform: every matching key of the bin is taken
    }

    // Output slots: the TOPK - need keys above the found prefix fill slots [0, TOPK - need) and `need`
    // keys at it the rest (all of them when the search stopped early). The output is a set, so each
    // warp reserves its slots with one shared atomic on a packed count (keys above in the low 16 bits,
    // keys at the prefix in the high 16; rows hold < 2^16 keys) instead of a block-wide scan. Output
    // order, and which of several exactly tied keys at the k-th score fill the last slots, follow
    // the order in which warps get there.
    const int lane = t & 31;
    unsigned int packed = 0u;
#pragma unroll
    for (int j = 0; j < ITEMS; ++j) {
        if (j * THREADS >= seq_len) break;  // block-uniform: no thread has a key here
        const bool valid = (valid_bits >> j) & 1u;
        const unsigned int m = key[j] & mask;
        packed += (valid && m > prefix) ? 1u : 0u;
        packed += (valid && m == prefix) ? 65536u : 0u;
    }
    unsigned int inc = packed;
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {
        const unsigned int y = __shfl_up_sync(0xffffffffu, inc, d);
        if (lane >= d) inc += y;
    }
    unsigned int base = 0u;
    if (lane == 31) base = atomicAdd(&taken, inc);
    const unsigned int before = __shfl_sync(0xffffffffu, base, 31) + inc - packed;
    unsigned int above_before = before & 0xffffu, equal_before = before >> 16;
#pragma unroll
    for (int j = 0; j < ITEMS; ++j) {
        if (j * THREADS >= seq_len) break;  // block-uniform: no thread has a key here
        const int i = j * THREADS + t;
        const bool valid = (valid_bits >> j) & 1u;
        const unsigned int m = key[j] & mask;
        if (valid && m > prefix) o[above_before++] = pages[i / PAGE] * PAGE + i % PAGE;
        if (valid && m == prefix) {
            if (equal_before < need) o[TOPK - need + equal_before] = pages[i / PAGE] * PAGE + i % PAGE;
            ++equal_before;
        }
    }
}
