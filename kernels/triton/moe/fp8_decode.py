"""FP8 block-scale MoE for decode-size batches (up to 32 tokens): a program per hit expert and N tile. Triton.

Definition: moe_fp8_block_scale_ds_routing_topk8_ng8_kg4_e32_h7168_i2048 (the math: the reference,
kdispatch/references/moe_fp8.py). At a few tokens the routing reaches a few of the rank's 32 experts
and the work is streaming those experts' weights (44 MB each) once. The grouped kernels
(fp8_grouped.py) first build an expert-sorted layout and launch a program per (row block, N tile),
nearly all of which find no rows and exit. Here a program is one (N tile, K split, slot), slot j
standing for the j-th of the experts some pair reached (worked out by every program from the 8T
local ids; programs of slots past the last hit expert exit): every program streams. Its M rows are
the batch's tokens, masked to those that chose the slot's expert (a token chooses an expert at most
once): masked rows fetch nothing, and no layout is needed. Three launches and two allocations (the
bf16 output and one workspace, `_workspace`), no host sync (capturable):

1. `_route_zero_kernel`, grid (T, Z): local expert id and weight per pair (`_route_token`,
   fp8_grouped.py), and the workspace's fp32 accumulators and arrival counters zeroed.
2. `_gemm1_splitk_kernel`, grid (2048 / BLOCK_N1, SPLIT_K, slots): the slot's expert's up and gate
   rows [n, n + BLOCK_N1) over 1/SPLIT_K of the hidden dimension, FP8 tensor-core dots with the
   per-block scales, atomically added into an fp32 [pairs, 4096] buffer. The split multiplies the
   programs streaming at once: 64 N tiles of one expert leave most of an H100's 132 SMs idle. The
   last program to add into a 128-column block (an arrival counter) writes that block of
   y = silu(gate) * up for the slot's pairs: bf16 (as the grouped kernels round it), or FP8 with a
   scale per 128 columns (`fp8_down`, as SGLang feeds its down projection).
3. `_gemm2_kernel`, grid (7168 / BLOCK_N2, SPLIT_K2, slots): y times the expert's W2 rows (FP8
   widened to bf16, or FP8 x FP8 with `fp8_down`), times the pair's routing weight, atomically added
   into the fp32 output; the last program of an N tile rounds its columns to the bf16 result (or,
   with `fused_cast` off, a fourth launch rounds the whole output).

The scales are loaded a step ahead of their use (`scales_ahead`; the "l" configurations load them in
the step, as before): n128s4q 5-9% faster at 4-16 tokens, 2% slower at one
(results/moe-scales-ahead-ab-H200.txt), so the tuner weighs both.

On CUDA the launches after the first are programmatic dependent launches (fp8_grouped.py `pdl_on`):
each may start while the kernel before it ends (that kernel signals `gdc_launch_dependents` early) and
waits (`gdc_wait`) before anything else, which hides a launch's ramp behind the previous kernel's tail (an
experiment on 2026-11-28, H200: 1-2.6 us less at 1-32 tokens in graphs for the n64s8q and n128s8q
configurations; loading the down GEMM's weights into the L2 before waiting made it 10-25% slower).

With `fused_gemms` (the "f" configurations) steps 2 and 3 are one launch, `_gemms_kernel`: a
program takes an up/gate tile or, after all of those, a down tile by ticket, and a down tile waits
(polling) until the blocks of y it reads are written. One launch fewer cuts host time (5-20 us a call
eagerly), but one run on an H200 (benchmarks/results/moe-fused-gemms-ab-H200.txt) found its graph time
mixed: up to 15% faster at some batch sizes and routings, up to 18% slower at others, 9-27% slower
at 32 tokens (the compiled kernel's 200 registers a thread against gemm1's 168: two programs an SM instead of
three); so the tuner weighs both per call mode.

Eager calls are bound by host time at these sizes (the GPU finishes each kernel before the next is
launched): until 2026-11-28 the memset, the activation kernel and the cast were launches of their
own and the buffers four allocations (benchmarks/results/moe-profile-*.txt: 140-170 us of host time
per call on the GPU machine); then the launches were keyed one by one (`launch`, ~14 us each beyond
Triton's launcher), and since keyed once per call (kernels/triton/launches.py): n128s4q 56-109 ->
44-62 us (H200, one run: benchmarks/results/moe-host-ab-H200.txt). A launch through libcuda's
cuLaunchKernel by ctypes, its parameters packed ahead, took 8.2 us against Triton's launcher's 8.0 on
that host (2026-11-28): the launcher is not what to cut; launches are.

Measured on an H100 (2026-11-26, benchmarks/results/moe-profile-H100.txt, one run, CUDA-graph time
per call): 1 token 53 us (n128s8) against 75 for SGLang's fused MoE and 79 for the grouped kernels
(floor 26); 8 tokens 141 against 151 and 151 (floor 92); 32 tokens 405 against 442 and 350 (floor
263). The tuner's re-tune of that day routes up to 24 tokens here (`n128s8q`: 1.37x, 1.08-1.82x,
over SGLang's kernel on the contest workloads). Earlier versions, measured
on an H100 (benchmarks/results/moe-profile-H100.txt, git history) and replaced: programs that walked
the hit experts one after another (down GEMM 60-73 us at 1 token, 3.1 ms at 32: latency-bound small
K steps of 1.5-2 us, in sequence); the expert in the grid with most programs exiting (105-140 us at 1
token); the down GEMM reading the fp32 gate/up rows and applying silu per tile (its kernel 47 us at
1 token with n64s8); the next K step's weights loaded ahead in registers (slower everywhere).

The rows are the batch's tokens padded to a power of two (>= 16, tl.dot's minimum), which bounds the
batch: 32 tokens (MAX_TOKENS). The order of the atomic sums is not fixed, so results may differ in
the last bits from call to call.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kdispatch.kernels.triton.launches import Launches, call_key
from kdispatch.kernels.triton.moe.fp8_grouped import (CAST_BLOCK, FP8_MAX, QBLOCK, _cast_kernel, _e4m3_grid,
                                                      _pdl_enter, _route_token, cdiv, next_pow2, pdl_on)
from kdispatch.references import moe_fp8 as ref
from kdispatch.registry import variant

MAX_TOKENS = 32  # the widest M tile (one row per token) the programs hold


@triton.jit
def _slot_expert(local_ptr, num_pairs, slot, PAIRS: tl.constexpr, NUM_LOCAL: tl.constexpr,
                 LOCAL_POW2: tl.constexpr):
    """(The local expert of a slot: the slot-th (from 0) of the experts some pair reached, in expert
    order, -1 past the last one; how many experts some pair reached)."""
    offs_p = tl.arange(0, PAIRS)
    local = tl.load(local_ptr + offs_p, mask=offs_p < num_pairs, other=-1)
    es = tl.arange(0, LOCAL_POW2)
    hit = tl.max((local[:, None] == es[None, :]).to(tl.int32), axis=0)  # [LOCAL_POW2]: no pair is NUM_LOCAL+
    chosen = (hit > 0) & (tl.cumsum(hit, axis=0) == slot + 1)
    expert = tl.sum(tl.where(chosen, es, 0), axis=0) - (tl.sum(chosen.to(tl.int32), axis=0) == 0).to(tl.int32)
    return expert, tl.sum(hit, axis=0)


@triton.jit
def _expert_rows(local_ptr, e, num_tokens, TOKENS: tl.constexpr, TOP_K: tl.constexpr):
    """Row t = token t: whether it chose expert e, and the pair (t * TOP_K + choice) if so."""
    t = tl.arange(0, TOKENS)
    ks = tl.arange(0, TOP_K)
    local = tl.load(local_ptr + t[:, None] * TOP_K + ks[None, :], mask=t[:, None] < num_tokens, other=-1)
    match = local == e
    has = tl.max(match.to(tl.int32), axis=1) > 0  # a token's experts are distinct: at most one match
    pair = t * TOP_K + tl.sum(tl.where(match, ks[None, :], 0), axis=1)
    return t, has, pair


@triton.jit
def _workspace(ws_ptr, num_tokens, HIDDEN: tl.constexpr, INTER: tl.constexpr, TOP_K: tl.constexpr,
               QB: tl.constexpr, FP8_DOWN: tl.constexpr):
    """The typed regions of a call's one fp32 workspace (its size: `_workspace_words`), in order: pair
    weights [pairs]; local expert ids [pairs] int32; the fp32 accumulators, output [T, HIDDEN] then
    gate/up [pairs, 2 * INTER]; y's scales [pairs, INTER / QB]; y [pairs, INTER] (FP8 with FP8_DOWN,
    else bf16); arrival counters int32, gemm1's one per (slot, 128-column block) then gemm2's one
    per N tile. The routing kernel zeroes the accumulators and the counters."""
    pairs = num_tokens * TOP_K
    local = (ws_ptr + pairs).to(tl.pointer_type(tl.int32), bitcast=True)
    acc = ws_ptr + 2 * pairs
    h = acc + num_tokens * HIDDEN
    y_scale = h + pairs * 2 * INTER
    y_words = y_scale + pairs * (INTER // QB)
    if FP8_DOWN:
        y = y_words.to(tl.pointer_type(tl.float8e4nv), bitcast=True)
        counts = (y_words + pairs * INTER // 4).to(tl.pointer_type(tl.int32), bitcast=True)
    else:
        y = y_words.to(tl.pointer_type(tl.bfloat16), bitcast=True)
        counts = (y_words + pairs * INTER // 2).to(tl.pointer_type(tl.int32), bitcast=True)
    return ws_ptr, local, acc, h, y_scale, y, counts


@triton.jit
def _route_zero_kernel(
    logits_ptr, bias_ptr, ws_ptr, num_tokens, local_offset, scaling, zero_chunk, num_counts,
    NUM_EXPERTS: tl.constexpr, NUM_GROUPS: tl.constexpr, TOP_GROUPS: tl.constexpr, TOP_K: tl.constexpr,
    NUM_LOCAL: tl.constexpr, HIDDEN: tl.constexpr, INTER: tl.constexpr, QB: tl.constexpr,
    FP8_DOWN: tl.constexpr, ZB: tl.constexpr, PDL: tl.constexpr,
):
    """Program (t, z): with z = 0 token t's routing (local expert id and weight per pair); every program
    zeroes its `zero_chunk` of the accumulators (program (0, 0) the counters too), in place of a
    memset launch."""
    if PDL:  # the GEMM launched next may start now: it waits for this kernel before reading anything
        tl.extra.cuda.gdc_launch_dependents()
    t = tl.program_id(0)
    z = tl.program_id(1)
    weight, local, acc, _, _, _, counts = _workspace(ws_ptr, num_tokens, HIDDEN, INTER, TOP_K, QB, FP8_DOWN)
    if z == 0:
        ids, w, _is_local = _route_token(logits_ptr, bias_ptr, t, local_offset, scaling,
                                        NUM_EXPERTS, NUM_GROUPS, TOP_GROUPS, TOP_K, NUM_LOCAL)
        ks = tl.arange(0, TOP_K)
        tl.store(weight + t * TOP_K + ks, w)
        tl.store(local + t * TOP_K + ks, ids)
    q = t * tl.num_programs(1) + z
    end = tl.minimum((q + 1) * zero_chunk, num_tokens * (HIDDEN + TOP_K * 2 * INTER))  # output, then gate/up
    for start in range(q * zero_chunk, end, ZB):
        offs = start + tl.arange(0, ZB)
        tl.store(acc + offs, 0.0, mask=offs < end)
    if q == 0:
        for start in range(0, num_counts, ZB):
            offs = start + tl.arange(0, ZB)
            tl.store(counts + offs, 0, mask=offs < num_counts)


@triton.jit
def _silu_mul_block(h_ptr, y_ptr, y_scale_ptr, pair, has, blk, INTER: tl.constexpr, QB: tl.constexpr,
                    FP8_DOWN: tl.constexpr, ON_GRID: tl.constexpr):
    """y = silu(gate) * up of the `has` pairs' 128-column block blk: bf16 (the grouped kernels'
    rounding), or with FP8_DOWN FP8 with one scale per row and block (amax / 448), as SGLang quantises
    the down projection's input. h is read from L2 (.cg): other programs' adds landed there."""
    offs = blk * QB + tl.arange(0, QB)
    rows = h_ptr + pair[:, None].to(tl.int64) * (2 * INTER) + offs[None, :]
    up = tl.load(rows, mask=has[:, None], other=0.0, cache_modifier=".cg")
    gate = tl.load(rows + INTER, mask=has[:, None], other=0.0, cache_modifier=".cg")
    y = up * gate * tl.sigmoid(gate)
    y_rows = y_ptr + pair[:, None].to(tl.int64) * INTER + offs[None, :]
    if FP8_DOWN:
        scale = tl.maximum(tl.max(tl.abs(y), axis=1), 1e-12) / FP8_MAX
        q = y / scale[:, None]
        if ON_GRID:
            q = _e4m3_grid(q)
        tl.store(y_rows, q.to(tl.float8e4nv), mask=has[:, None])
        tl.store(y_scale_ptr + pair * (INTER // QB) + blk, scale, mask=has)
    else:
        tl.store(y_rows, y.to(tl.bfloat16), mask=has[:, None])


@triton.jit
def _gemm1_tile(
    x_ptr, x_scale_ptr, w13_ptr, w13_scale_ptr, ws_ptr, num_tokens, pid_n, split, slot,
    HIDDEN: tl.constexpr, INTER: tl.constexpr, TOP_K: tl.constexpr, NUM_LOCAL: tl.constexpr,
    LOCAL_POW2: tl.constexpr, PAIRS: tl.constexpr, TOKENS: tl.constexpr, BLOCK_N: tl.constexpr,
    SPLIT_K: tl.constexpr, QB: tl.constexpr, FP8_DOWN: tl.constexpr, DOT_FP32: tl.constexpr,
    SIGNAL_Y: tl.constexpr, AHEAD: tl.constexpr,
):
    """Up/gate tile (pid_n, split) of the slot's expert; the last of a 128-column block's programs
    writes that block of y and, with SIGNAL_Y, counts once more when y is written (what the fused
    kernel's down-GEMM tiles wait for). AHEAD (0 or 1): the per-block scales a step ahead of their
    use or in it (`scales_ahead`)."""
    _, local_ptr, _, h_ptr, y_scale_ptr, y_ptr, counts = _workspace(
        ws_ptr, num_tokens, HIDDEN, INTER, TOP_K, QB, FP8_DOWN)
    e, _hits = _slot_expert(local_ptr, num_tokens * TOP_K, slot, PAIRS, NUM_LOCAL, LOCAL_POW2)
    if e < 0:
        return
    t, has, pair = _expert_rows(local_ptr, e, num_tokens, TOKENS, TOP_K)
    e64 = e.to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, QB)
    KB: tl.constexpr = HIDDEN // QB
    STEPS: tl.constexpr = (KB + SPLIT_K - 1) // SPLIT_K
    kb0 = split * STEPS
    a_ptrs = x_ptr + t[:, None].to(tl.int64) * HIDDEN + offs_k[None, :]
    up_ptrs = w13_ptr + e64 * (2 * INTER * HIDDEN) + offs_n[:, None] * HIDDEN + offs_k[None, :]
    gate_ptrs = up_ptrs + INTER * HIDDEN
    up_scale_ptr = w13_scale_ptr + e64 * (2 * INTER // QB) * KB + (pid_n * BLOCK_N // QB) * KB
    gate_scale_ptr = up_scale_ptr + (INTER // QB) * KB

    acc_up = tl.zeros([TOKENS, BLOCK_N], dtype=tl.float32)
    acc_gate = tl.zeros([TOKENS, BLOCK_N], dtype=tl.float32)
    # with AHEAD the scales are loaded a step before their use (the pipeliner stages the dot operands'
    # loads, not these); without it these first loads are dead
    kbc = tl.minimum(kb0, KB - 1)
    a_scale = tl.load(x_scale_ptr + kbc * num_tokens + t, mask=has & (t * 0 + kb0 < KB), other=0.0)
    s_up = tl.load(up_scale_ptr + kbc)
    s_gate = tl.load(gate_scale_ptr + kbc)
    for i in range(STEPS):
        # a step past the last hidden block (a ragged split) reads a clamped, in-bounds block and adds
        # nothing: its activations are masked to zero
        kb = kb0 + i
        kbc = tl.minimum(kb, KB - 1)
        live = has & (t * 0 + kb < KB)
        a = tl.load(a_ptrs + kbc * QB, mask=live[:, None], other=0.0)
        w_up = tl.load(up_ptrs + kbc * QB)
        w_gate = tl.load(gate_ptrs + kbc * QB)
        next_kbc = tl.minimum(kb + AHEAD, KB - 1)
        next_a_scale = tl.load(x_scale_ptr + next_kbc * num_tokens + t, mask=has & (t * 0 + kb + AHEAD < KB),
                               other=0.0)
        next_s_up = tl.load(up_scale_ptr + next_kbc)
        next_s_gate = tl.load(gate_scale_ptr + next_kbc)
        if not AHEAD:
            a_scale, s_up, s_gate = next_a_scale, next_s_up, next_s_gate
        if DOT_FP32:
            a, w_up, w_gate = a.to(tl.float32), w_up.to(tl.float32), w_gate.to(tl.float32)
        acc_up += tl.dot(a, tl.trans(w_up)) * (a_scale[:, None] * s_up)
        acc_gate += tl.dot(a, tl.trans(w_gate)) * (a_scale[:, None] * s_gate)
        a_scale, s_up, s_gate = next_a_scale, next_s_up, next_s_gate

    h_rows = h_ptr + pair[:, None].to(tl.int64) * (2 * INTER) + offs_n[None, :]
    tl.atomic_add(h_rows, acc_up, mask=has[:, None], sem="relaxed")
    tl.atomic_add(h_rows + INTER, acc_gate, mask=has[:, None], sem="relaxed")

    # The last of the SPLIT_K * (QB / BLOCK_N) programs adding into this 128-column block of the slot's
    # gate/up rows writes the block of y (the barrier and the acquire-release count order every
    # thread's adds before it, as Triton's stream-K kernels hand over partial tiles).
    tl.debug_barrier()
    blk = pid_n * BLOCK_N // QB
    arrived = tl.atomic_add(counts + slot * (INTER // QB) + blk, 1, sem="acq_rel")
    if arrived == SPLIT_K * (QB // BLOCK_N) - 1:
        _silu_mul_block(h_ptr, y_ptr, y_scale_ptr, pair, has, blk, INTER, QB, FP8_DOWN, DOT_FP32)
        if SIGNAL_Y:
            tl.debug_barrier()
            tl.atomic_add(counts + slot * (INTER // QB) + blk, 1, sem="release")


@triton.jit
def _gemm1_splitk_kernel(
    x_ptr, x_scale_ptr, w13_ptr, w13_scale_ptr, ws_ptr, num_tokens,
    HIDDEN: tl.constexpr, INTER: tl.constexpr, TOP_K: tl.constexpr, NUM_LOCAL: tl.constexpr,
    LOCAL_POW2: tl.constexpr, PAIRS: tl.constexpr, TOKENS: tl.constexpr, BLOCK_N: tl.constexpr,
    SPLIT_K: tl.constexpr, QB: tl.constexpr, FP8_DOWN: tl.constexpr, DOT_FP32: tl.constexpr, AHEAD: tl.constexpr,
    PDL: tl.constexpr,
):
    _pdl_enter(PDL)  # launched early: waits for the routing, lets the next start
    _gemm1_tile(x_ptr, x_scale_ptr, w13_ptr, w13_scale_ptr, ws_ptr, num_tokens, tl.program_id(0),
                tl.program_id(1), tl.program_id(2), HIDDEN, INTER, TOP_K, NUM_LOCAL, LOCAL_POW2, PAIRS, TOKENS,
                BLOCK_N, SPLIT_K, QB, FP8_DOWN, DOT_FP32, False, AHEAD)


@triton.jit
def _gemm2_tile(
    w2_ptr, w2_scale_ptr, ws_ptr, out_ptr, num_tokens, pid_n, split, slot, slots,
    HIDDEN: tl.constexpr, INTER: tl.constexpr, TOP_K: tl.constexpr, NUM_LOCAL: tl.constexpr,
    LOCAL_POW2: tl.constexpr, PAIRS: tl.constexpr, TOKENS: tl.constexpr, BLOCK_N: tl.constexpr,
    SPLIT_K: tl.constexpr, QB: tl.constexpr, FP8_DOWN: tl.constexpr, DOT_FP32: tl.constexpr,
    FUSED_CAST: tl.constexpr, Y_READY: tl.constexpr, AHEAD: tl.constexpr,
):
    """Down tile (pid_n, split) of the slot's expert, added into the fp32 output; with Y_READY > 0 it
    first waits until each 128-column block of y it reads has that count (the fused kernel: y is
    written by up/gate tiles of the same launch)."""
    pair_weight_ptr, local_ptr, acc_ptr, _, y_scale_ptr, y_ptr, counts = _workspace(
        ws_ptr, num_tokens, HIDDEN, INTER, TOP_K, QB, FP8_DOWN)
    e, hits = _slot_expert(local_ptr, num_tokens * TOP_K, slot, PAIRS, NUM_LOCAL, LOCAL_POW2)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    if e >= 0:
        t, has, pair = _expert_rows(local_ptr, e, num_tokens, TOKENS, TOP_K)
        e64 = e.to(tl.int64)
        offs_k = tl.arange(0, QB)
        KB: tl.constexpr = INTER // QB
        STEPS: tl.constexpr = (KB + SPLIT_K - 1) // SPLIT_K
        kb0 = split * STEPS
        if Y_READY > 0:
            # volatile loads poll the L2 copy; one acquire then orders the reads of y after them
            y_counts = counts + slot * KB
            for i in range(STEPS):
                kbc = tl.minimum(kb0 + i, KB - 1)
                seen = tl.load(y_counts + kbc, volatile=True)
                while seen < Y_READY:
                    seen = tl.load(y_counts + kbc, volatile=True)
            tl.atomic_add(y_counts + tl.minimum(kb0, KB - 1), 0, sem="acquire")
        y_ptrs = y_ptr + pair[:, None].to(tl.int64) * INTER + offs_k[None, :]
        w_ptrs = w2_ptr + e64 * (HIDDEN * INTER) + offs_n[:, None] * INTER + offs_k[None, :]
        scale_ptr = w2_scale_ptr + e64 * (HIDDEN // QB) * KB + (pid_n * BLOCK_N // QB) * KB

        acc = tl.zeros([TOKENS, BLOCK_N], dtype=tl.float32)
        w_scale = tl.load(scale_ptr + tl.minimum(kb0, KB - 1))  # AHEAD as in `_gemm1_tile`
        for i in range(STEPS):
            # steps past the end (a ragged split) read a clamped, in-bounds block and add nothing
            kb = kb0 + i
            kbc = tl.minimum(kb, KB - 1)
            live = has & (t * 0 + kb < KB)
            if Y_READY > 0:  # written in this launch by another SM: read from the L2
                y = tl.load(y_ptrs + kbc * QB, mask=live[:, None], other=0.0, cache_modifier=".cg")
            else:
                y = tl.load(y_ptrs + kbc * QB, mask=live[:, None], other=0.0)
            w = tl.load(w_ptrs + kbc * QB)
            next_w_scale = tl.load(scale_ptr + tl.minimum(kb + AHEAD, KB - 1))
            if not AHEAD:
                w_scale = next_w_scale
            if DOT_FP32:
                y, w = y.to(tl.float32), w.to(tl.float32)
            elif not FP8_DOWN:
                w = w.to(tl.bfloat16)
            if FP8_DOWN:  # FP8 x FP8 on the tensor cores, both scales applied per block
                y_scale = tl.load(y_scale_ptr + pair * KB + kbc, mask=live, other=0.0, cache_modifier=".cg")
                acc += tl.dot(y, tl.trans(w)) * (y_scale[:, None] * w_scale)
            else:
                acc += tl.dot(y, tl.trans(w)) * w_scale
            w_scale = next_w_scale

        weight = tl.load(pair_weight_ptr + pair, mask=has, other=0.0)
        tl.atomic_add(acc_ptr + t[:, None].to(tl.int64) * HIDDEN + offs_n[None, :], acc * weight[:, None],
                      mask=has[:, None], sem="relaxed")

    if FUSED_CAST:
        # The programs of hit slots count in: the last of this N tile's rounds its columns of the fp32
        # output to the bf16 result, in place of a cast launch (with no expert hit, slot 0's first
        # split rounds the zeroed output). Programs of unhit slots exit without counting.
        last = (hits == 0) & (split == 0) & (slot == 0)
        if e >= 0:
            tl.debug_barrier()
            arrived = tl.atomic_add(counts + slots * (INTER // QB) + pid_n, 1, sem="acq_rel")
            last = arrived == SPLIT_K * hits - 1
        if last:
            rows = tl.arange(0, TOKENS)
            offs = rows[:, None].to(tl.int64) * HIDDEN + offs_n[None, :]
            live = rows[:, None] < num_tokens
            total = tl.load(acc_ptr + offs, mask=live, other=0.0, cache_modifier=".cg")
            tl.store(out_ptr + offs, total.to(tl.bfloat16), mask=live)


@triton.jit
def _gemm2_kernel(
    w2_ptr, w2_scale_ptr, ws_ptr, out_ptr, num_tokens,
    HIDDEN: tl.constexpr, INTER: tl.constexpr, TOP_K: tl.constexpr, NUM_LOCAL: tl.constexpr,
    LOCAL_POW2: tl.constexpr, PAIRS: tl.constexpr, TOKENS: tl.constexpr, BLOCK_N: tl.constexpr,
    SPLIT_K: tl.constexpr, QB: tl.constexpr, FP8_DOWN: tl.constexpr, DOT_FP32: tl.constexpr,
    FUSED_CAST: tl.constexpr, AHEAD: tl.constexpr, PDL: tl.constexpr,
):
    _pdl_enter(PDL)
    _gemm2_tile(w2_ptr, w2_scale_ptr, ws_ptr, out_ptr, num_tokens, tl.program_id(0), tl.program_id(1),
                tl.program_id(2), tl.num_programs(2), HIDDEN, INTER, TOP_K, NUM_LOCAL, LOCAL_POW2, PAIRS, TOKENS,
                BLOCK_N, SPLIT_K, QB, FP8_DOWN, DOT_FP32, FUSED_CAST, 0, AHEAD)


@triton.jit
def _gemms_kernel(
    x_ptr, x_scale_ptr, w13_ptr, w13_scale_ptr, w2_ptr, w2_scale_ptr, ws_ptr, out_ptr, num_tokens, slots,
    HIDDEN: tl.constexpr, INTER: tl.constexpr, TOP_K: tl.constexpr, NUM_LOCAL: tl.constexpr,
    LOCAL_POW2: tl.constexpr, PAIRS: tl.constexpr, TOKENS: tl.constexpr, BLOCK_N1: tl.constexpr,
    SPLIT_K1: tl.constexpr, BLOCK_N2: tl.constexpr, SPLIT_K2: tl.constexpr, QB: tl.constexpr,
    FP8_DOWN: tl.constexpr, DOT_FP32: tl.constexpr, FUSED_CAST: tl.constexpr, AHEAD: tl.constexpr,
    PDL: tl.constexpr,
):
    """Both GEMMs in one launch, a program per up/gate tile then per down tile. A program takes its
    tile by ticket (an atomic count the routing kernel zeroes), slot by slot: a down tile waits only
    on up/gate tiles with smaller tickets, which programs already running hold, so the waits end
    whatever order the hardware starts programs in (and under the interpreter, which runs them one by
    one)."""
    _pdl_enter(PDL)
    _, _, _, _, _, _, counts = _workspace(ws_ptr, num_tokens, HIDDEN, INTER, TOP_K, QB, FP8_DOWN)
    ticket = tl.atomic_add(counts + slots * (INTER // QB) + HIDDEN // BLOCK_N2, 1, sem="relaxed")
    N1: tl.constexpr = INTER // BLOCK_N1
    N2: tl.constexpr = HIDDEN // BLOCK_N2
    up_tiles = N1 * SPLIT_K1 * slots
    if ticket < up_tiles:
        _gemm1_tile(x_ptr, x_scale_ptr, w13_ptr, w13_scale_ptr, ws_ptr, num_tokens, ticket % N1,
                    ticket // N1 % SPLIT_K1, ticket // (N1 * SPLIT_K1), HIDDEN, INTER, TOP_K, NUM_LOCAL,
                    LOCAL_POW2, PAIRS, TOKENS, BLOCK_N1, SPLIT_K1, QB, FP8_DOWN, DOT_FP32, True, AHEAD)
    else:
        r = ticket - up_tiles
        _gemm2_tile(w2_ptr, w2_scale_ptr, ws_ptr, out_ptr, num_tokens, r % N2, r // N2 % SPLIT_K2,
                    r // (N2 * SPLIT_K2), slots, HIDDEN, INTER, TOP_K, NUM_LOCAL, LOCAL_POW2, PAIRS, TOKENS,
                    BLOCK_N2, SPLIT_K2, QB, FP8_DOWN, DOT_FP32, FUSED_CAST, SPLIT_K1 * (QB // BLOCK_N1) + 1,
                    AHEAD)


ZERO_CHUNK = 4096  # accumulator words a routing program zeroes (a token's are 7168 + 8 * 4096 at full size)
ZERO_BLOCK = 1024  # words per store


def _workspace_words(num_tokens: int, hidden: int, inter: int, fp8_down: bool, num_counts: int) -> int:
    """fp32 words of the workspace `_workspace` lays out."""
    pairs = num_tokens * ref.TOP_K
    return (2 * pairs + num_tokens * hidden + pairs * 2 * inter + pairs * (inter // QBLOCK)
            + pairs * inter // (4 if fp8_down else 2) + num_counts)


def moe_fp8_decode(routing_logits, routing_bias, hidden_states, hidden_states_scale, gemm1_weights,
                   gemm1_weights_scale, gemm2_weights, gemm2_weights_scale, local_expert_offset,
                   routed_scaling_factor, *, block_n1: int, block_n2: int, split_k: int, split_k2: int,
                   num_warps: int, num_stages: int, fp8_down: bool = False, fused_cast: bool = True,
                   fused_gemms: bool = False, scales_ahead: bool = True, dot_fp32: bool | None = None):
    """Routed FFN of this rank's experts for up to MAX_TOKENS tokens; returns [T, HIDDEN] bf16. Any
    HIDDEN and intermediate size that are multiples of 128 (the tests use small ones)."""
    num_tokens, hidden = hidden_states.shape
    num_local, two_inter, _ = gemm1_weights.shape
    inter = two_inter // 2
    device = hidden_states.device
    if num_tokens > MAX_TOKENS:
        raise ValueError(f"moe_fp8 decode kernels: at most {MAX_TOKENS} tokens, got {num_tokens}")
    if hidden % QBLOCK or inter % QBLOCK or QBLOCK % block_n1 or QBLOCK % block_n2:
        raise ValueError("hidden and intermediate sizes must be multiples of 128, BLOCK_N divide 128")
    if dot_fp32 is None:
        dot_fp32 = device.type != "cuda"
    pdl = pdl_on(hidden_states)
    out = torch.empty(num_tokens, hidden, dtype=torch.bfloat16, device=device)
    if num_tokens == 0:
        return out
    num_pairs = num_tokens * ref.TOP_K
    slots = min(num_local, num_pairs)  # at most this many experts are hit: the grid is static
    fp8_down, dot_fp32, fused_cast, fused_gemms = bool(fp8_down), bool(dot_fp32), bool(fused_cast), bool(fused_gemms)
    ahead = int(bool(scales_ahead))
    num_counts = slots * (inter // QBLOCK) + hidden // block_n2 + fused_gemms  # + the fused kernel's ticket
    inputs = (routing_logits.contiguous(), routing_bias.contiguous(), hidden_states.contiguous(),
              hidden_states_scale.contiguous(), gemm1_weights.contiguous(), gemm1_weights_scale.contiguous(),
              gemm2_weights.contiguous(), gemm2_weights_scale.contiguous())
    logits, bias, x, x_scale, w13, w13_scale, w2, w2_scale = inputs
    ws = torch.empty(_workspace_words(num_tokens, hidden, inter, fp8_down, num_counts), dtype=torch.float32,
                     device=device)
    run = Launches((*call_key("moe_fp8 decode", *inputs), num_tokens, hidden, inter, num_local, logits.shape[1],
                    int(local_expert_offset), block_n1, block_n2, split_k, split_k2, num_warps, num_stages, fp8_down,
                    fused_cast, fused_gemms, ahead, dot_fp32))
    zero_split = cdiv(hidden + ref.TOP_K * 2 * inter, ZERO_CHUNK)
    run(_route_zero_kernel, (num_tokens, zero_split), logits, bias, ws, num_tokens, int(local_expert_offset),
        float(routed_scaling_factor), cdiv(hidden + ref.TOP_K * 2 * inter, zero_split), num_counts,
        logits.shape[1], ref.NUM_GROUPS, ref.TOP_GROUPS, ref.TOP_K, num_local, hidden, inter, QBLOCK, fp8_down,
        ZERO_BLOCK, pdl)
    # the constexprs both GEMMs take after their runtime arguments: HIDDEN .. TOKENS
    shape = (hidden, inter, ref.TOP_K, num_local, next_pow2(num_local),
             next_pow2(num_pairs), max(16, next_pow2(num_tokens)))
    if fused_gemms:
        tiles = (inter // block_n1 * split_k + hidden // block_n2 * split_k2) * slots
        run(_gemms_kernel, (tiles,), x, x_scale, w13, w13_scale, w2, w2_scale, ws, out, num_tokens, slots, *shape,
            block_n1, split_k, block_n2, split_k2, QBLOCK, fp8_down, dot_fp32, fused_cast, ahead, pdl,
            num_warps=num_warps, num_stages=num_stages, launch_pdl=pdl)
    else:
        run(_gemm1_splitk_kernel, (inter // block_n1, split_k, slots), x, x_scale, w13, w13_scale, ws,
            num_tokens, *shape, block_n1, split_k, QBLOCK, fp8_down, dot_fp32, ahead, pdl, num_warps=num_warps,
            num_stages=num_stages, launch_pdl=pdl)
        run(_gemm2_kernel, (hidden // block_n2, split_k2, slots), w2, w2_scale, ws, out, num_tokens, *shape,
            block_n2, split_k2, QBLOCK, fp8_down, dot_fp32, fused_cast, ahead, pdl, num_warps=num_warps,
            num_stages=num_stages, launch_pdl=pdl)
    if not fused_cast:  # the accumulator follows the pair weights and local ids (`_workspace`)
        run(_cast_kernel, (cdiv(num_tokens * hidden, CAST_BLOCK),), ws, 2 * num_pairs, out, num_tokens * hidden,
            CAST_BLOCK, pdl, launch_pdl=pdl)
    return out


def _decode_sized(features: dict, _config: dict) -> str | None:
    if features["seq_len"] > MAX_TOKENS:
        return f"more than {MAX_TOKENS} tokens (the decode kernels hold every token in one tile)"
    return None


# Candidates the tuner measures: N tile widths and K splits (more programs streaming at once against
# more atomics into the fp32 buffers). "q": the down projection on FP8 activations (fp8_down), which
# led at every size the tuner measured (H100, 2026-11-26: n128s8q, then n64s4q). "c": the output
# rounded by a launch of its own instead of by each N tile's last down-GEMM program: the fused
# rounding saved a launch's host time eagerly but made the down GEMM 3-12 us slower at 1-32 tokens in
# graphs (benchmarks/results/moe-profile-H200.txt, when every program, of unhit slots too, counted in
# behind a barrier and an acquire-release atomic; now only hit slots' programs do), so the tuner
# weighs both per call mode; "f": both GEMMs in one launch (`fused_gemms`), likewise. "n128s4q": half
# the K splits of n128s8q, the best of 159 tile / split / warp / stage combinations at 32 tokens and
# within 5% of the best at 8 (benchmarks/moe_decode_sweep.py, results/moe-decode-sweep-H200.json); the
# sweep found nothing better than the registered ones at 1. "l": the scales loaded late, in the step
# that uses them, as before `scales_ahead` (benchmarks/results/moe-scales-ahead-ab-H200.txt: loading
# them a step ahead cut n128s4q 5-9% at 4-16 tokens and cost 2% at one token).
CONFIGS = {
    "n32s8": dict(block_n1=32, block_n2=32, split_k=8, split_k2=4, num_warps=4, num_stages=3),
    "n64s8": dict(block_n1=64, block_n2=64, split_k=8, split_k2=4, num_warps=4, num_stages=3),
    "n64s4": dict(block_n1=64, block_n2=64, split_k=4, split_k2=2, num_warps=4, num_stages=3),
    "n128s8": dict(block_n1=64, block_n2=128, split_k=8, split_k2=4, num_warps=4, num_stages=3),
    "n64s8q": dict(block_n1=64, block_n2=64, split_k=8, split_k2=4, num_warps=4, num_stages=3, fp8_down=True),
    "n64s4q": dict(block_n1=64, block_n2=64, split_k=4, split_k2=2, num_warps=4, num_stages=3, fp8_down=True),
    "n128s8q": dict(block_n1=64, block_n2=128, split_k=8, split_k2=4, num_warps=4, num_stages=3, fp8_down=True),
    "n128s4q": dict(block_n1=64, block_n2=128, split_k=4, split_k2=2, num_warps=4, num_stages=3, fp8_down=True),
    "n64s4qc": dict(block_n1=64, block_n2=64, split_k=4, split_k2=2, num_warps=4, num_stages=3, fp8_down=True,
                    fused_cast=False),
    "n128s8qc": dict(block_n1=64, block_n2=128, split_k=8, split_k2=4, num_warps=4, num_stages=3, fp8_down=True,
                     fused_cast=False),
    "n128s4qf": dict(block_n1=64, block_n2=128, split_k=4, split_k2=2, num_warps=4, num_stages=3, fp8_down=True,
                     fused_gemms=True),
    "n128s8qf": dict(block_n1=64, block_n2=128, split_k=8, split_k2=4, num_warps=4, num_stages=3, fp8_down=True,
                     fused_gemms=True),
    "n64s4qf": dict(block_n1=64, block_n2=64, split_k=4, split_k2=2, num_warps=4, num_stages=3, fp8_down=True,
                    fused_gemms=True),
    "n128s8ql": dict(block_n1=64, block_n2=128, split_k=8, split_k2=4, num_warps=4, num_stages=3, fp8_down=True,
                     scales_ahead=False),
    "n64s8ql": dict(block_n1=64, block_n2=64, split_k=8, split_k2=4, num_warps=4, num_stages=3, fp8_down=True,
                    scales_ahead=False),
}


@variant("moe_fp8", "triton_decode", backend="triton", archs=("sm90",), requires=("triton",), configs=CONFIGS,
         supports=_decode_sized)
def moe_fp8_triton_decode(routing_logits, routing_bias, hidden_states, hidden_states_scale, gemm1_weights,
                          gemm1_weights_scale, gemm2_weights, gemm2_weights_scale, local_expert_offset,
                          routed_scaling_factor, **config):
    return moe_fp8_decode(routing_logits, routing_bias, hidden_states, hidden_states_scale, gemm1_weights,
                          gemm1_weights_scale, gemm2_weights, gemm2_weights_scale, local_expert_offset,
                          routed_scaling_factor, **config)
