"""FP8 block-scale MoE (DeepSeek-V3 routing) as two grouped GEMMs over expert-sorted tokens: Triton.

Definition: moe_fp8_block_scale_ds_routing_topk8_ng8_kg4_e32_h7168_i2048 (see the reference,
kdispatch/references/moe_fp8.py, for the math). Three steps, none of which syncs with the host, so a
call is safe under CUDA-graph capture (the reference is not: it reads the expert counts back):

1. Routing and layout (`_route_layout`: three Triton kernels): the per-expert counters zeroed
   (`_zero_counters_kernel`), the 8 experts and weights of every token, counted per local expert
   (`_route_kernel`, one program per token), then the (token, choice) pairs that hit one of this
   rank's 32 experts placed by expert (`_layout_kernel`, through atomic per-expert cursors), each
   expert's run padded to a multiple of BLOCK_M rows. `row_pair[r]` is the pair in row r (-1 =
   padding) and `block_expert[m]` the expert of row block m (32 = past the last expert: the program
   exits). The row count is bounded by the shapes (T * 8 + 32 * (BLOCK_M - 1)), so the grid is static.
2. `_gemm1_swiglu_kernel`, grid (row blocks, 2048 / BLOCK_N): gathers the block's token rows of the
   FP8 activations and multiplies them with the up and gate rows [n, n + BLOCK_N) and
   [2048 + n, ...) of W13[e] on the FP8 tensor cores, 128 columns (one scale block) at a time:
   acc += dot(x, w^T) * x_scale[row] * w_scale[block] (fp32 accumulate, scales applied per block as
   DeepGEMM does). Writes y = silu(gate) * up as bf16 into a [rows, 2048] region. The weights'
   scales (and x's) are loaded a step ahead of their use: Triton's pipeliner stages only the dot
   operands' loads (results/moe-scales-ahead-ab-H200.txt: m64q 8-12% faster at 16-2,048 tokens,
   m16 and m32q within their spread).
3. `_gemm2_scatter_kernel`, grid (row blocks, 7168 / BLOCK_N): y [rows, 2048] bf16 times W2[e]^T
   (FP8 weights widened to bf16 in registers, per-block scales), times the pair's routing weight,
   atomically added into an fp32 [T, 7168] accumulator (zeroed by the routing programs), which
   `_cast_kernel` rounds to the bf16 output. The summation order of a token's (at most 8) experts is
   therefore not fixed: results may differ in the last bits from call to call.

Two allocations a call, the output and one workspace holding every intermediate (`_layout_regions`,
`_y_regions`: offsets computed in the kernels, so no views are made on the host), and six launches
keyed once per call (kernels/triton/launches.py). Eager calls at up to a few hundred tokens are bound
by host time; until 2026-11-28 a call made eight allocations, a memset, a torch cast and four
launches keyed one by one: 147-258 us of host time a call on the GPU machine, 76-134 since (H200,
one run: benchmarks/results/moe-host-ab-H200.txt; graph times within 1% up to 512 tokens except
m16 / m64q at 1-8 tokens, 2-3% slower: the zeroing launch; the down GEMM 1-2% slower at 8-16k). A
layout without the zeroing launch (each of 32 programs histogramming all pairs) took 100 us at 16k
tokens where the atomics take 14; rounding each token's row in the down GEMM when its last pair adds
in, instead of the cast launch, cut 5-13 us of host time but made graphs 1-4% slower from 128 tokens
(results/moe-grouped-fused-round-ab-H200.txt). On CUDA the launches after the first are programmatic
dependent launches (`pdl_on`): each kernel may start while the one before it ends, and waits for it
before anything else.

Rounding differs from the reference (which dequantises to fp32): y is rounded to bf16 between the
GEMMs, and the FP8 products are exact in fp32 accumulation. The contest tolerance for this
definition (matched ratio 0.95 at atol 1, rtol 0.3) is far looser than that difference.

With `fp8_y` (128-wide gate/up tiles) y is stored as FP8 with one scale per row and 128 columns,
as SGLang feeds its down projection, and the down GEMM runs FP8 x FP8 on the tensor cores (twice
the bf16 rate; the prefill sizes are bound by it).

BLOCK_M is the variant's choice: 16-row blocks waste little padding when each expert sees a few
tokens (decode-like batches); 32- and 64-row blocks reuse each weight tile over more tokens (prefill).

The routing and layout were first ~20 small torch kernels (109 of 198 us at one token, H100, graph);
fused, they measured faster on every tuned workload (2026-11-25) and replaced them. The layout kernel
then still took 34-37 us at 1-64 tokens (benchmarks/results/moe-profile-H100.txt), in one program
of 256 pairs: ~1,900 PTX instructions per thread (its [pairs x experts] selections, reductions and
shuffles), straight-line and latency-bound. 32 pairs a program compile to ~400 and take 2.3 us
(H100, 2026-11-25): 83 us a call at 1 token, SGLang's fused MoE 76.

DOT_FP32: the Triton interpreter (CPU tests) has no FP8 or bf16 tensor-core dot; the operands are
cast to fp32 before tl.dot when the flag is set (set only off CUDA).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kdispatch.kernels.triton.launches import Launches, call_key
from kdispatch.references import moe_fp8 as ref
from kdispatch.registry import variant

QBLOCK = 128  # the quantisation block of the weights and activations


def cdiv(a: int, b: int) -> int:
    """triton.cdiv for the host code: Triton's is a constexpr function costing a few us a call
    (benchmarks/results/moe-profile-H200.txt: `__call__ (jit.py)`), and a MoE call made several."""
    return -(-a // b)


def next_pow2(n: int) -> int:
    """triton.next_power_of_2 for the host code (as cdiv): the least power of two >= n, for n >= 1."""
    return 1 << (n - 1).bit_length()


FP8_MAX = tl.constexpr(448.0)  # the largest finite float8_e4m3fn


@triton.jit
def _e4m3_grid(v):
    """v rounded to the nearest float8_e4m3fn value (ties away from zero), in fp32. The Triton
    interpreter's own cast mis-rounds where rounding carries into the exponent (31.3 -> 16.0,
    2026-11-25), so off CUDA values are put on the grid first and the cast is exact."""
    binade = tl.maximum(tl.floor(tl.log2(tl.maximum(tl.abs(v), 1e-30))), -6.0)  # below 2^-6: subnormal steps
    step = tl.exp2(binade - 3.0)  # 3 mantissa bits
    q = tl.floor(tl.abs(v) / step + 0.5) * step
    return tl.where(v < 0, -1.0, 1.0) * tl.minimum(q, FP8_MAX)


@triton.jit
def _round16(n):
    """n rounded up to a multiple of 16 (the compiler then knows a region starting there is 64-byte
    aligned: its loads vectorise)."""
    return (n + 15) // 16 * 16


@triton.jit
def _rows(num_tokens, TOP_K: tl.constexpr, NUM_LOCAL: tl.constexpr, BLOCK_M: tl.constexpr):
    """Rows of the expert-sorted layout: every pair, each expert's run padded to BLOCK_M (`rows_of`)."""
    return (num_tokens * TOP_K + NUM_LOCAL * (BLOCK_M - 1) + BLOCK_M - 1) // BLOCK_M * BLOCK_M


@triton.jit
def _layout_regions(ws_ptr, num_tokens, HIDDEN: tl.constexpr, TOP_K: tl.constexpr, NUM_LOCAL: tl.constexpr,
                    BLOCK_M: tl.constexpr, ACC: tl.constexpr):
    """The regions of a call's one workspace (its size: `workspace_words`) up to the layout, each at a
    multiple of 16 words: pair weights [pairs] fp32; local expert ids [pairs] int32; with ACC the
    fp32 output accumulator [T, HIDDEN]; row_pair [rows] int32; block_expert [rows / BLOCK_M] int32;
    per-expert counters int32, the pairs routed to each then the layout's cursors (`COUNTERS` words
    each). Also the word where y's regions (`_y_regions`) start."""
    COUNTERS: tl.constexpr = (NUM_LOCAL + 16) // 16 * 16
    pairs16 = _round16(num_tokens * TOP_K)
    rows = _rows(num_tokens, TOP_K, NUM_LOCAL, BLOCK_M)
    local = (ws_ptr + pairs16).to(tl.pointer_type(tl.int32), bitcast=True)
    acc = ws_ptr + 2 * pairs16
    if ACC:
        acc_words = num_tokens * HIDDEN
    else:
        acc_words = num_tokens * 0
    row_pair = (acc + acc_words).to(tl.pointer_type(tl.int32), bitcast=True)
    block_expert = row_pair + _round16(rows)
    counters = block_expert + _round16(rows // BLOCK_M)
    end = 2 * pairs16 + acc_words + _round16(rows) + _round16(rows // BLOCK_M) + 2 * COUNTERS
    return ws_ptr, local, acc, row_pair, block_expert, counters, end


@triton.jit
def _y_regions(ws_ptr, end, num_tokens, INTER: tl.constexpr, TOP_K: tl.constexpr, NUM_LOCAL: tl.constexpr,
               BLOCK_M: tl.constexpr, QB: tl.constexpr, FP8_Y: tl.constexpr):
    """y's regions after the layout's (from word `end`): with FP8_Y its scales [rows, INTER / QB] fp32
    and y [rows, INTER] FP8, else y [rows, INTER] bf16."""
    rows = _rows(num_tokens, TOP_K, NUM_LOCAL, BLOCK_M)
    y_scale = ws_ptr + end
    if FP8_Y:
        y = (y_scale + _round16(rows * (INTER // QB))).to(tl.pointer_type(tl.float8e4nv), bitcast=True)
    else:
        y = y_scale.to(tl.pointer_type(tl.bfloat16), bitcast=True)
    return y_scale, y


@triton.jit
def _pdl_enter(PDL: tl.constexpr):
    """A programmatic dependent launch's first step (`pdl_on`): wait until the kernel before it has
    ended and its writes are visible, then let the kernel after it start launching."""
    if PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()


@triton.jit
def _gemm1_swiglu_kernel(
    x_ptr, x_scale_ptr, w13_ptr, w13_scale_ptr, ws_ptr, num_tokens,
    HIDDEN: tl.constexpr, INTER: tl.constexpr, TOP_K: tl.constexpr, NUM_LOCAL: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, QB: tl.constexpr, FP8_Y: tl.constexpr,
    DOT_FP32: tl.constexpr, PDL: tl.constexpr,
):
    _pdl_enter(PDL)
    _, _, _, row_pair_ptr, block_expert_ptr, _, end = _layout_regions(
        ws_ptr, num_tokens, HIDDEN, TOP_K, NUM_LOCAL, BLOCK_M, True)
    y_scale_ptr, y_ptr = _y_regions(ws_ptr, end, num_tokens, INTER, TOP_K, NUM_LOCAL, BLOCK_M, QB, FP8_Y)
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    expert = tl.load(block_expert_ptr + pid_m)
    if expert >= NUM_LOCAL:
        return
    e = expert.to(tl.int64)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    pair = tl.load(row_pair_ptr + offs_m)
    valid = pair >= 0
    token = tl.where(valid, pair // TOP_K, 0).to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, QB)

    KB: tl.constexpr = HIDDEN // QB
    a_ptrs = x_ptr + token[:, None] * HIDDEN + offs_k[None, :]
    up_ptrs = w13_ptr + e * (2 * INTER * HIDDEN) + offs_n[:, None] * HIDDEN + offs_k[None, :]
    gate_ptrs = up_ptrs + INTER * HIDDEN
    up_scale_ptr = w13_scale_ptr + e * (2 * INTER // QB) * KB + (pid_n * BLOCK_N // QB) * KB
    gate_scale_ptr = up_scale_ptr + (INTER // QB) * KB

    acc_up = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    acc_gate = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    # the scales are loaded a step ahead: the pipeliner stages the dot operands' loads, not these
    a_scale = tl.load(x_scale_ptr + token, mask=valid, other=0.0)
    s_up = tl.load(up_scale_ptr)
    s_gate = tl.load(gate_scale_ptr)
    for kb in range(KB):
        a = tl.load(a_ptrs + kb * QB, mask=valid[:, None], other=0.0)
        w_up = tl.load(up_ptrs + kb * QB)
        w_gate = tl.load(gate_ptrs + kb * QB)
        next_kb = tl.minimum(kb + 1, KB - 1)
        next_a_scale = tl.load(x_scale_ptr + next_kb * num_tokens + token, mask=valid, other=0.0)
        next_s_up = tl.load(up_scale_ptr + next_kb)
        next_s_gate = tl.load(gate_scale_ptr + next_kb)
        if DOT_FP32:
            a, w_up, w_gate = a.to(tl.float32), w_up.to(tl.float32), w_gate.to(tl.float32)
        acc_up += tl.dot(a, tl.trans(w_up)) * (a_scale[:, None] * s_up)
        acc_gate += tl.dot(a, tl.trans(w_gate)) * (a_scale[:, None] * s_gate)
        a_scale, s_up, s_gate = next_a_scale, next_s_up, next_s_gate

    y = acc_up * acc_gate * tl.sigmoid(acc_gate)  # silu(gate) * up
    y_ptrs = y_ptr + offs_m[:, None].to(tl.int64) * INTER + offs_n[None, :]
    if FP8_Y:  # BLOCK_N == QB: one scale per row and 128 columns, as SGLang quantises the down input
        scale = tl.maximum(tl.max(tl.abs(y), axis=1), 1e-12) / FP8_MAX
        q = y / scale[:, None]
        if DOT_FP32:  # the interpreter (see _e4m3_grid)
            q = _e4m3_grid(q)
        tl.store(y_ptrs, q.to(tl.float8e4nv))
        tl.store(y_scale_ptr + offs_m.to(tl.int64) * (INTER // QB) + pid_n, scale)
    else:
        tl.store(y_ptrs, y.to(tl.bfloat16))


@triton.jit
def _gemm2_scatter_kernel(
    w2_ptr, w2_scale_ptr, ws_ptr, num_tokens,
    HIDDEN: tl.constexpr, INTER: tl.constexpr, TOP_K: tl.constexpr, NUM_LOCAL: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, QB: tl.constexpr, FP8_Y: tl.constexpr,
    DOT_FP32: tl.constexpr, PDL: tl.constexpr,
):
    _pdl_enter(PDL)
    pair_weight_ptr, _, out_ptr, row_pair_ptr, block_expert_ptr, _, end = _layout_regions(
        ws_ptr, num_tokens, HIDDEN, TOP_K, NUM_LOCAL, BLOCK_M, True)
    y_scale_ptr, y_ptr = _y_regions(ws_ptr, end, num_tokens, INTER, TOP_K, NUM_LOCAL, BLOCK_M, QB, FP8_Y)
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    expert = tl.load(block_expert_ptr + pid_m)
    if expert >= NUM_LOCAL:
        return
    e = expert.to(tl.int64)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    pair = tl.load(row_pair_ptr + offs_m)
    valid = pair >= 0
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, QB)

    KB: tl.constexpr = INTER // QB
    a_ptrs = y_ptr + offs_m[:, None].to(tl.int64) * INTER + offs_k[None, :]
    w_ptrs = w2_ptr + e * (HIDDEN * INTER) + offs_n[:, None] * INTER + offs_k[None, :]
    scale_ptr = w2_scale_ptr + e * (HIDDEN // QB) * KB + (pid_n * BLOCK_N // QB) * KB

    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    w_scale = tl.load(scale_ptr)  # a step ahead, as in the up/gate GEMM
    for kb in range(KB):
        a = tl.load(a_ptrs + kb * QB)
        w = tl.load(w_ptrs + kb * QB)
        next_w_scale = tl.load(scale_ptr + tl.minimum(kb + 1, KB - 1))
        if DOT_FP32:
            a, w = a.to(tl.float32), w.to(tl.float32)
        elif not FP8_Y:
            w = w.to(tl.bfloat16)
        if FP8_Y:  # FP8 x FP8 on the tensor cores, both scales applied per block
            a_scale = tl.load(y_scale_ptr + offs_m.to(tl.int64) * KB + kb)
            acc += tl.dot(a, tl.trans(w)) * (a_scale[:, None] * w_scale)
        else:
            acc += tl.dot(a, tl.trans(w)) * w_scale
        w_scale = next_w_scale

    weight = tl.load(pair_weight_ptr + tl.where(valid, pair, 0), mask=valid, other=0.0)
    token = tl.where(valid, pair // TOP_K, 0).to(tl.int64)
    tl.atomic_add(out_ptr + token[:, None] * HIDDEN + offs_n[None, :], acc * weight[:, None],
                  mask=valid[:, None], sem="relaxed")


@triton.jit
def _route_token(logits_ptr, bias_ptr, t, local_offset, scaling,
                 NUM_EXPERTS: tl.constexpr, NUM_GROUPS: tl.constexpr, TOP_GROUPS: tl.constexpr,
                 TOP_K: tl.constexpr, NUM_LOCAL: tl.constexpr):
    """Token t's DeepSeek-V3 routing as ref._route (sigmoid scores, bias for selection only, the
    TOP_GROUPS groups of the best two-expert sums, the TOP_K best experts among them, weights
    renormalised times `scaling`): ([TOP_K] local expert ids, NUM_LOCAL for another rank's; weights;
    whether each is local)."""
    GS: tl.constexpr = NUM_EXPERTS // NUM_GROUPS
    offs = tl.arange(0, NUM_EXPERTS)
    score = tl.sigmoid(tl.load(logits_ptr + t.to(tl.int64) * NUM_EXPERTS + offs).to(tl.float32))
    sel = tl.reshape(score + tl.load(bias_ptr + offs).to(tl.float32), (NUM_GROUPS, GS))
    col = tl.arange(0, GS)
    best = tl.argmax(sel, axis=1)
    group_score = tl.max(sel, axis=1) + tl.max(tl.where(col[None, :] == best[:, None], float("-inf"), sel), axis=1)
    groups = tl.arange(0, NUM_GROUPS)
    keep = groups < 0
    for _ in tl.static_range(TOP_GROUPS):
        g = tl.argmax(group_score, axis=0)
        keep = keep | (groups == g)
        group_score = tl.where(groups == g, float("-inf"), group_score)
    cand = tl.reshape(tl.where(keep[:, None], sel, float("-inf")), (NUM_EXPERTS,))
    ks = tl.arange(0, TOP_K)
    ids = tl.zeros([TOP_K], dtype=tl.int32)
    for j in tl.static_range(TOP_K):
        e = tl.argmax(cand, axis=0)
        ids = tl.where(ks == j, e, ids)
        cand = tl.where(offs == e, float("-inf"), cand)
    # the chosen experts' scores gathered afterwards (the logits row is in L1): one reduction a choice
    # fewer than picking each out of `score` as it is chosen
    w = tl.sigmoid(tl.load(logits_ptr + t.to(tl.int64) * NUM_EXPERTS + ids).to(tl.float32))
    w = w / (tl.sum(w, axis=0) + 1e-20) * scaling
    local = ids - local_offset
    is_local = (local >= 0) & (local < NUM_LOCAL)
    return tl.where(is_local, local, NUM_LOCAL), w, is_local


@triton.jit
def _zero_counters_kernel(ws_ptr, num_tokens, HIDDEN: tl.constexpr, TOP_K: tl.constexpr, NUM_LOCAL: tl.constexpr,
                          BLOCK_M: tl.constexpr, ACC: tl.constexpr, PDL: tl.constexpr):
    """The per-expert counters zeroed: the routing kernel counts into them."""
    if PDL:  # the routing kernel may start now (it waits for this one)
        tl.extra.cuda.gdc_launch_dependents()
    _, _, _, _, _, counters, _ = _layout_regions(ws_ptr, num_tokens, HIDDEN, TOP_K, NUM_LOCAL, BLOCK_M, ACC)
    COUNTERS: tl.constexpr = (NUM_LOCAL + 16) // 16 * 16
    for start in tl.static_range(0, 2 * COUNTERS, 16):
        tl.store(counters + start + tl.arange(0, 16), 0)


@triton.jit
def _route_kernel(
    logits_ptr, bias_ptr, ws_ptr, num_tokens, local_offset, scaling,
    NUM_EXPERTS: tl.constexpr, NUM_GROUPS: tl.constexpr, TOP_GROUPS: tl.constexpr, TOP_K: tl.constexpr,
    NUM_LOCAL: tl.constexpr, HIDDEN: tl.constexpr, BLOCK_M: tl.constexpr, ACC: tl.constexpr, FILL: tl.constexpr,
    PDL: tl.constexpr,
):
    """One token: its routing (`_route_token`) stored per pair and counted per local expert, its share
    of row_pair set to -1 (the padding the layout leaves), and with ACC its row of the fp32 output
    accumulator zeroed."""
    _pdl_enter(PDL)
    t = tl.program_id(0)
    weight_ptr, local_ptr, acc, row_pair, _, counts, _ = _layout_regions(
        ws_ptr, num_tokens, HIDDEN, TOP_K, NUM_LOCAL, BLOCK_M, ACC)
    local, w, is_local = _route_token(logits_ptr, bias_ptr, t, local_offset, scaling,
                                      NUM_EXPERTS, NUM_GROUPS, TOP_GROUPS, TOP_K, NUM_LOCAL)
    ks = tl.arange(0, TOP_K)
    tl.store(weight_ptr + t * TOP_K + ks, w)
    tl.store(local_ptr + t * TOP_K + ks, local)
    tl.atomic_add(counts + local, 1, mask=is_local, sem="relaxed")  # a token's experts are distinct
    rows = _rows(num_tokens, TOP_K, NUM_LOCAL, BLOCK_M)
    chunk = (rows + num_tokens - 1) // num_tokens
    stop = tl.minimum((t + 1) * chunk, rows)
    for r in range(t * chunk, stop, FILL):
        offs = r + tl.arange(0, FILL)
        tl.store(row_pair + offs, -1, mask=offs < stop)
    if ACC:
        for c in range(0, HIDDEN, FILL * 8):
            cols = c + tl.arange(0, FILL * 8)
            tl.store(acc + t.to(tl.int64) * HIDDEN + cols, 0.0, mask=cols < HIDDEN)


@triton.jit
def _layout_kernel(
    ws_ptr, num_tokens,
    HIDDEN: tl.constexpr, TOP_K: tl.constexpr, NUM_LOCAL: tl.constexpr, LOCAL_POW2: tl.constexpr,
    BLOCK_M: tl.constexpr, ACC: tl.constexpr, BLOCK_P: tl.constexpr, PDL: tl.constexpr,
):
    """Places BLOCK_P pairs in their expert's rows (each expert's run starts a BLOCK_M block, after the
    padded runs of the experts before it; the order inside a run is the atomics' order) and writes
    BLOCK_P entries of block_expert (NUM_LOCAL past the last run: those programs exit)."""
    _pdl_enter(PDL)
    pid = tl.program_id(0)
    _, local_ptr, _, row_pair, block_expert, counts, _ = _layout_regions(
        ws_ptr, num_tokens, HIDDEN, TOP_K, NUM_LOCAL, BLOCK_M, ACC)
    COUNTERS: tl.constexpr = (NUM_LOCAL + 16) // 16 * 16
    num_pairs = num_tokens * TOP_K
    num_blocks = _rows(num_tokens, TOP_K, NUM_LOCAL, BLOCK_M) // BLOCK_M
    es = tl.arange(0, LOCAL_POW2)
    padded = (tl.load(counts + es, mask=es < NUM_LOCAL, other=0) + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    pad_end = tl.cumsum(padded, axis=0)
    offs = pid * BLOCK_P + tl.arange(0, BLOCK_P)
    local = tl.load(local_ptr + offs, mask=offs < num_pairs, other=NUM_LOCAL)
    is_local = local < NUM_LOCAL
    rank = tl.atomic_add(counts + COUNTERS + local, 1, mask=is_local, sem="relaxed")
    start = tl.sum(tl.where(es[None, :] == local[:, None], pad_end - padded, 0), axis=1)
    tl.store(row_pair + start + rank, offs, mask=is_local)
    first_row = offs * BLOCK_M
    ended = (pad_end[None, :] <= first_row[:, None]) & (es[None, :] < NUM_LOCAL)
    tl.store(block_expert + offs, tl.sum(ended.to(tl.int32), axis=1), mask=offs < num_blocks)


@triton.jit
def _cast_kernel(ws_ptr, acc_word, out_ptr, n, BLOCK: tl.constexpr, PDL: tl.constexpr):
    """The fp32 accumulator at word `acc_word` of the workspace rounded to the bf16 output, BLOCK of
    its n elements a program (the grouped kernels', and the decode kernels' without FUSED_CAST)."""
    if PDL:
        tl.extra.cuda.gdc_wait()
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    live = offs < n
    tl.store(out_ptr + offs, tl.load(ws_ptr + acc_word + offs, mask=live).to(tl.bfloat16), mask=live)


LAYOUT_BLOCK = 32  # pairs (and block_expert entries) per layout program: short programs (see the top)
FILL_BLOCK = 128  # row_pair entries a routing program sets per store
CAST_BLOCK = 1024  # output elements per cast program


def rows_of(num_tokens: int, num_local: int, block_m: int) -> int:
    """`_rows` on the host."""
    return cdiv(num_tokens * ref.TOP_K + num_local * (block_m - 1), block_m) * block_m


def round16(n: int) -> int:
    """`_round16` on the host."""
    return (n + 15) // 16 * 16


def workspace_words(num_tokens: int, hidden: int, inter: int, num_local: int, block_m: int, *, acc: bool,
                    fp8_y: bool | None) -> int:
    """fp32 words of the workspace `_layout_regions` and `_y_regions` lay out (fp8_y None: no y)."""
    rows = rows_of(num_tokens, num_local, block_m)
    words = 2 * round16(num_tokens * ref.TOP_K) + (num_tokens * hidden if acc else 0) + round16(rows) \
        + round16(rows // block_m) + 2 * round16(num_local + 1)
    if fp8_y is None:
        return words
    if fp8_y:
        return words + round16(rows * (inter // QBLOCK)) + rows * inter // 4
    return words + rows * inter // 2


def _route_layout(run: Launches, ws, routing_logits, routing_bias, local_expert_offset, routed_scaling_factor,
                  hidden: int, num_local: int, block_m: int, acc: bool) -> None:
    """The routing and the expert-sorted layout into `ws` (three launches through `run`; with `acc`
    the output accumulator zeroed on the way). On CUDA the second and third are programmatic dependent
    launches (`pdl_on`); a kernel launched after them waits for the layout, by PDL or stream order."""
    num_tokens, num_experts = routing_logits.shape
    pdl = pdl_on(ws)
    regions = (ws, num_tokens, hidden, ref.TOP_K, num_local, block_m, acc)
    run(_zero_counters_kernel, (1,), *regions, pdl)
    run(_route_kernel, (num_tokens,), routing_logits, routing_bias, ws, num_tokens, int(local_expert_offset),
        float(routed_scaling_factor), num_experts, ref.NUM_GROUPS, ref.TOP_GROUPS, ref.TOP_K, num_local, hidden,
        block_m, acc, FILL_BLOCK, pdl, num_warps=1, launch_pdl=pdl)
    blocks = rows_of(num_tokens, num_local, block_m) // block_m
    run(_layout_kernel, (cdiv(max(num_tokens * ref.TOP_K, blocks), LAYOUT_BLOCK),), ws, num_tokens, hidden,
        ref.TOP_K, num_local, next_pow2(num_local + 1), block_m, acc, LAYOUT_BLOCK, pdl, launch_pdl=pdl)


def pdl_on(t: torch.Tensor) -> bool:
    """Whether an op's launches after its first are programmatic dependent launches: each may start
    while the kernel before it ends and waits for it (`gdc_wait`) before reading; on CUDA (the
    interpreter has no gdc_* ops). Every such kernel waits before anything else, so the chain keeps
    stream order: a kernel ends only after the one before it has."""
    return t.is_cuda


def _fused_route_layout(routing_logits, routing_bias, local_expert_offset, routed_scaling_factor, num_local: int,
                        block_m: int):
    """Routing and the expert-sorted layout on their own (the DeepGEMM variants'), no host sync: (pair
    weights [T * TOP_K] fp32, row_pair [rows] int32, block_expert [rows / block_m] int32), views of
    one workspace."""
    num_tokens = routing_logits.shape[0]
    logits, bias = routing_logits.contiguous(), routing_bias.contiguous()
    ws = torch.empty(workspace_words(num_tokens, 0, 0, num_local, block_m, acc=False, fp8_y=None),
                     dtype=torch.float32, device=logits.device)
    run = Launches((*call_key("moe_fp8 route_layout", logits, bias), num_tokens, num_local, block_m,
                    int(local_expert_offset)))
    _route_layout(run, ws, logits, bias, local_expert_offset, routed_scaling_factor, 0, num_local, block_m, False)
    pairs16, rows = round16(num_tokens * ref.TOP_K), rows_of(num_tokens, num_local, block_m)
    return (ws[:num_tokens * ref.TOP_K], ws[2 * pairs16:2 * pairs16 + rows].view(torch.int32),
            ws[2 * pairs16 + round16(rows):2 * pairs16 + round16(rows) + rows // block_m].view(torch.int32))


def moe_fp8_grouped(routing_logits, routing_bias, hidden_states, hidden_states_scale, gemm1_weights,
                    gemm1_weights_scale, gemm2_weights, gemm2_weights_scale, local_expert_offset,
                    routed_scaling_factor, *, block_m: int, block_n1: int, block_n2: int,
                    num_warps: int, num_stages: int, fp8_y: bool = False, dot_fp32: bool | None = None):
    """Routed FFN of this rank's experts; returns [T, HIDDEN] bf16. Works for any HIDDEN and
    intermediate size that are multiples of 128 (the tests use small ones)."""
    num_tokens, hidden = hidden_states.shape
    num_local, two_inter, _ = gemm1_weights.shape
    inter = two_inter // 2
    device = hidden_states.device
    if hidden % QBLOCK or inter % QBLOCK or QBLOCK % block_n1 or QBLOCK % block_n2:
        raise ValueError("hidden and intermediate sizes must be multiples of 128, BLOCK_N divide 128")
    if fp8_y and block_n1 != QBLOCK:
        raise ValueError("an FP8 intermediate needs 128-wide gate/up tiles (one scale block per tile)")
    if dot_fp32 is None:
        dot_fp32 = device.type != "cuda"
    fp8_y, dot_fp32 = bool(fp8_y), bool(dot_fp32)
    out = torch.empty(num_tokens, hidden, dtype=torch.bfloat16, device=device)
    if num_tokens == 0:
        return out
    inputs = (routing_logits.contiguous(), routing_bias.contiguous(), hidden_states.contiguous(),
              hidden_states_scale.contiguous(), gemm1_weights.contiguous(), gemm1_weights_scale.contiguous(),
              gemm2_weights.contiguous(), gemm2_weights_scale.contiguous())
    logits, bias, x, x_scale, w13, w13_scale, w2, w2_scale = inputs
    ws = torch.empty(workspace_words(num_tokens, hidden, inter, num_local, block_m, acc=True, fp8_y=fp8_y),
                     dtype=torch.float32, device=device)
    run = Launches((*call_key("moe_fp8 grouped", *inputs), num_tokens, hidden, inter, num_local, logits.shape[1],
                    int(local_expert_offset), block_m, block_n1, block_n2, num_warps, num_stages, fp8_y, dot_fp32))
    _route_layout(run, ws, logits, bias, local_expert_offset, routed_scaling_factor, hidden, num_local, block_m, True)
    blocks = rows_of(num_tokens, num_local, block_m) // block_m
    # the constexprs both GEMMs take after their runtime arguments
    shape = (hidden, inter, ref.TOP_K, num_local, block_m)
    pdl = pdl_on(ws)
    run(_gemm1_swiglu_kernel, (blocks, inter // block_n1), x, x_scale, w13, w13_scale, ws, num_tokens, *shape,
        block_n1, QBLOCK, fp8_y, dot_fp32, pdl, num_warps=num_warps, num_stages=num_stages, launch_pdl=pdl)
    run(_gemm2_scatter_kernel, (blocks, hidden // block_n2), w2, w2_scale, ws, num_tokens, *shape, block_n2,
        QBLOCK, fp8_y, dot_fp32, pdl, num_warps=num_warps, num_stages=num_stages, launch_pdl=pdl)
    run(_cast_kernel, (cdiv(num_tokens * hidden, CAST_BLOCK),), ws, 2 * round16(num_tokens * ref.TOP_K), out,
        num_tokens * hidden, CAST_BLOCK, pdl, launch_pdl=pdl)
    return out


# Tile configurations, from `python benchmarks/moe.py --sweep` (H100, 2026-11-22): 16-row blocks with
# 32-wide N tiles were fastest up to 80 tokens, 32 x 128 at 901 tokens, 64 x 128 with 8 warps at 14107
# tokens; the tuner measures all three on every workload and routes by seq_len. The names keep the
# ".fr" (fused routing) under which they were measured and routed; 16-wide gate/up tiles with a
# deeper pipeline (a decode try) were never faster than triton_grouped_m16.fr and went.
CONFIGS = {
    "triton_grouped_m16.fr": dict(block_m=16, block_n1=32, block_n2=32, num_warps=4, num_stages=4),
    "triton_grouped_m32.fr": dict(block_m=32, block_n1=128, block_n2=128, num_warps=4, num_stages=3),
    "triton_grouped_m64.fr": dict(block_m=64, block_n1=128, block_n2=128, num_warps=8, num_stages=3),
    # the down GEMM on FP8 activations (fp8_y), twice the bf16 tensor rate: routed above 52 tokens (H100, 2026-11-26)
    "triton_grouped_m32q.fr": dict(block_m=32, block_n1=128, block_n2=128, num_warps=4, num_stages=3, fp8_y=True),
    "triton_grouped_m64q.fr": dict(block_m=64, block_n1=128, block_n2=128, num_warps=8, num_stages=3, fp8_y=True),
}


def _register(name: str, config: dict):
    @variant("moe_fp8", name, backend="triton", archs=("sm90",), requires=("triton",))
    def moe_variant(routing_logits, routing_bias, hidden_states, hidden_states_scale, gemm1_weights,
                    gemm1_weights_scale, gemm2_weights, gemm2_weights_scale, local_expert_offset,
                    routed_scaling_factor):
        return moe_fp8_grouped(routing_logits, routing_bias, hidden_states, hidden_states_scale,
                               gemm1_weights, gemm1_weights_scale, gemm2_weights, gemm2_weights_scale,
                               local_expert_offset, routed_scaling_factor, **config)
    return moe_variant


for _name, _config in CONFIGS.items():
    _register(_name, _config)
