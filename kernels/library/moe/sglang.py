"""SGLang 0.5.23's Triton fused MoE (FP8 W8A8, 128 x 128 block scales) behind kdispatch's moe_fp8
definition (moe_fp8_block_scale_ds_routing_topk8_ng8_kg4_e32_h7168_i2048): the baseline on sm_90,
what SGLang runs for DeepSeek-V3's MoE on an H100 by default.

SGLang's path on an H100 for DeepSeek-V3 FP8 with the Triton MoE runner is
`Fp8MoEMethod.apply` -> `TritonRunnerCore` / `fused_experts_none_to_triton` -> `fused_experts` ->
`fused_experts_impl` -> `_prepare_fused_moe_run` (config lookup + `moe_align_block_size`) ->
`_fused_moe_kernel_sequence`: `invoke_fused_moe_kernel` (GEMM1, W13) -> `silu_and_mul` ->
`invoke_fused_moe_kernel` (GEMM2, W2; quantises its bf16 input per token and 128 columns first,
multiplies the routing weight) -> `moe_sum_reduce` (sum over the top-k slots, times
routed_scaling_factor). `fused_moe.py` itself imports sgl_kernel (moe_sum_reduce) and SGLang's
runtime context at import, so it cannot be loaded on a host without sgl_kernel; this module runs
the same sequence, step for step, from SGLang's own Triton kernels, loaded by
kernels/library/sglang_loader.py:

    step                       SGLang on H100 (E=32 local)            here
    routing                    flashinfer fused_topk_deepseek         the same where its JIT kernel
                               (Triton router if flashinfer absent)   builds (not on this project's
                                                                      GPU machine: its FlashInfer has
                                                                      no CUDA sources), else SGLang's
                                                                      Triton router moe_fused_gate
    global -> local ids        StandardDispatcher (torch.where)       the same, as torch ops
    config                     fused_moe_triton_config lookup         same lookup, SGLang's files
    moe_align_block_size       sgl_kernel CUDA op                     SGLang's Triton small-numel
                                                                      kernel (T*8 <= 64), else torch
    GEMM1 input quant          per-token-group quant of bf16 x        none: the FP8 input and its
                                                                      scales go in directly (SGLang's
                                                                      a1_q "quant once" path)
    GEMM1                      invoke_fused_moe_kernel (Triton)       the same
    SiLU-and-mul               JIT CUDA silu_and_mul (first half      Triton kernel here, SiLU on
                               gated)                                 the SECOND half (definition)
    GEMM2 input quant          JIT CUDA per_token_group_quant         SGLang's Triton
                                                                      _per_token_group_quant_8bit
    GEMM2                      invoke_fused_moe_kernel (Triton)       the same
    combine                    moe_sum_reduce_triton (T <= 32) or     moe_sum_reduce_triton always
                               sgl_kernel moe_sum_reduce (T > 32)

Nothing synchronises with the host (no .item(), .tolist(), nonzero, bincount): a call can be
captured in a CUDA graph, provided routed_scaling_factor and local_expert_offset are Python numbers
(a 0-dim tensor offset also works, on the device; routed_scaling_factor is a constexpr of SGLang's
moe_sum_reduce kernel and must be a Python float).

Layouts (definition vs SGLang's kernel), all passed as views, nothing copied:
- gemm1_weights [E, 2I, H], gemm2_weights [E, H, I]: SGLang's w13 [E, N, K] / w2 [E, K', N'].
- gemm1_weights_scale [E, 2I/128, H/128], gemm2_weights_scale [E, H/128, I/128]: SGLang's
  w13_weight_scale_inv / w2_weight_scale_inv layout [E, N/128, K/128] (the kernel reads strides).
- hidden_states_scale [H/128, T]: its transpose is a [T, H/128] column-major view, which the kernel
  takes as A_scale through its strides (stride_asm = 1, stride_ask = T).
- gate/up order: the definition gates the SECOND half of GEMM1's output (rows [I, 2I) of W13) with
  SiLU; SGLang's silu_and_mul gates the first. The activation kernel here reads the halves the
  definition's way, so neither the 940 MB of W13 nor GEMM1's output is reordered. (An engine that
  used SGLang's own silu_and_mul would swap the halves of W13 and its scales once at load time.)
"""
from __future__ import annotations

import functools
import json
import logging
import os
from pathlib import Path

import torch
import triton
import triton.language as tl

from kdispatch.kernels.library.sglang_loader import sglang_function
from kdispatch.registry import variant

logger = logging.getLogger(__name__)

KERNELS = "sglang.kernels.ops.moe.fused_moe_triton_kernels"
FP8_KERNEL = "sglang.kernels.ops.quantization.fp8_kernel"
ROUTER = "sglang.kernels.ops.moe.moe_fused_gate"
ALIGN_SMALL = "sglang.kernels.ops.moe.moe_align_small_numel"

BLOCK_SHAPE = [128, 128]
TOP_K = 8
NUM_GROUPS = 8
TOP_GROUPS = 4
SMALL_NUMEL_LIMIT = 64  # sglang.kernels.ops.moe.moe_align_small_numel.SMALL_NUMEL_LIMIT


# ----------------------------------------------------------------------------------------------
# Routing
# ----------------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def _flashinfer_router(device: torch.device, num_experts: int) -> bool:
    """Whether flashinfer's fused_topk_deepseek runs here: it imports and its JIT kernel builds (a
    one-token call, once per device and expert count; a FlashInfer without its CUDA sources, as on
    this project's GPU machine, cannot build it). Where it does not, SGLang's Triton router serves,
    said once."""
    try:
        from flashinfer.fused_moe import fused_topk_deepseek
    except Exception:  # not installed, or its import fails on this host
        return False
    try:
        weights = torch.empty(1, TOP_K, dtype=torch.float32, device=device)
        ids = torch.empty(1, TOP_K, dtype=torch.int32, device=device)
        fused_topk_deepseek(torch.zeros(1, num_experts, dtype=torch.float32, device=device),
                            torch.zeros(num_experts, dtype=torch.float32, device=device), NUM_GROUPS,
                            TOP_GROUPS, TOP_K, 1.0, weights, ids, launch_with_pdl=True)
    except Exception as exc:
        logger.warning("sglang_triton_moe: flashinfer's fused_topk_deepseek does not run on %s (%s: %s); "
                       "SGLang's Triton router moe_fused_gate routes instead", device, type(exc).__name__,
                       str(exc).splitlines()[0][:200] if str(exc) else "")
        return False
    return True


def route(routing_logits, routing_bias, routed_scaling_factor, router: str = "auto"):
    """DeepSeek-V3 noaux_tc routing as biased_grouped_topk_gpu does it for the Triton MoE runner:
    sigmoid scores, bias for selection only, 8 groups / 4 kept, top 8, renormalised; the routed
    scaling factor is NOT folded in (Fp8MoEMethod with the Triton runner leaves it to
    moe_sum_reduce). Returns (topk_weights [T, 8] fp32, topk_ids [T, 8] int32, global ids).
    router: "flashinfer" (SGLang's choice on CUDA), "triton" (its fallback), "auto" (the first
    for CUDA tensors where flashinfer's kernel runs)."""
    if router == "auto":
        router = ("flashinfer" if routing_logits.is_cuda
                  and _flashinfer_router(routing_logits.device, routing_logits.shape[1]) else "triton")
    if router == "flashinfer":
        # SGLang's first choice on CUDA (topk.py: fused_topk_deepseek, scaling_factor 1.0 because
        # apply_routed_scaling_factor_on_output is off). flashinfer wants the bias in the scores'
        # dtype: SGLang's correction bias is an fp32 parameter, the definition's is bf16, so one
        # 256-element cast per call.
        from flashinfer.fused_moe import fused_topk_deepseek

        num_tokens = routing_logits.shape[0]
        weights = torch.empty(num_tokens, TOP_K, dtype=torch.float32, device=routing_logits.device)
        ids = torch.empty(num_tokens, TOP_K, dtype=torch.int32, device=routing_logits.device)
        fused_topk_deepseek(routing_logits.to(torch.float32).contiguous(),
                            routing_bias.to(torch.float32).contiguous(), NUM_GROUPS, TOP_GROUPS,
                            TOP_K, 1.0, weights, ids, launch_with_pdl=True)
        return weights, ids
    if router != "triton":
        raise ValueError(f"router must be 'triton' or 'flashinfer', not {router!r}")
    # SGLang's unified Triton router, biased_grouped_topk_gpu's CUDA path when flashinfer's kernel
    # is unavailable, with the same arguments. SGLang casts the bias to fp32 first (a launch); the
    # kernel upcasts on load, so the bf16 bias goes in as it is.
    gate = sglang_function(ROUTER, "moe_fused_gate")
    return gate(routing_logits.to(torch.float32), routing_bias, TOP_K, scoring_func="sigmoid",
                num_fused_shared_experts=0, renormalize=True,
                routed_scaling_factor=float(routed_scaling_factor),
                apply_routed_scaling_factor_on_output=False, num_expert_group=NUM_GROUPS,
                topk_group=TOP_GROUPS)


def to_local_ids(topk_ids, local_expert_offset, num_local):
    """Global expert ids -> this rank's ids, -1 (SGLang's drop sentinel) for other ranks' experts;
    the arithmetic form of StandardDispatcher's local_expert_mapping gather."""
    local = topk_ids - local_expert_offset
    return torch.where((local >= 0) & (local < num_local), local, -1).to(torch.int32)


# ----------------------------------------------------------------------------------------------
# Kernel configuration: SGLang 0.5.23's fused_moe_triton_config lookup, restated (its module
# imports SGLang's runtime context), reading SGLang's own config files.
# ----------------------------------------------------------------------------------------------
def _configs_root() -> Path:
    base = os.environ.get("SGLANG_MOE_CONFIG_DIR")
    if base is None:
        import importlib.util

        root = Path(importlib.util.find_spec("sglang").submodule_search_locations[0])
        base = root / "srt" / "layers" / "moe" / "moe_runner" / "triton_utils"
    return Path(base) / "configs"


def _device_name() -> str:
    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"


def config_file_name(E: int, N: int, device_name: str, down: bool = False) -> str:
    """fused_moe_triton_config.get_config_file_name for dtype fp8_w8a8, block_shape [128, 128]."""
    return (f"E={E},N={N},device_name={device_name.replace(' ', '_')},dtype=fp8_w8a8,"
            f"block_shape={BLOCK_SHAPE}{'_down' if down else ''}.json")


@functools.lru_cache(maxsize=None)
def moe_config_table(E: int, N: int, device_name: str, down: bool = False):
    """get_moe_configs: the file for Triton's version first, then other versions newest first;
    a missing down file falls back to the up table. Returns (path, {M: config}) or (None, None)."""
    root = _configs_root()
    name = config_file_name(E, N, device_name, down)
    own = f"triton_{triton.__version__.replace('.', '_')}"
    versions = sorted((d.name.removeprefix("triton_").replace("_", ".") for d in root.iterdir()
                       if d.name.startswith("triton_")),
                      key=lambda v: tuple(int(x) for x in v.split(".")), reverse=True)
    candidates = [root / own / name] + [root / f"triton_{v.replace('.', '_')}" / name
                                        for v in versions if v != triton.__version__]
    for path in candidates:
        if path.exists():
            with open(path) as f:
                return str(path), {int(k): v for k, v in json.load(f).items()}
    if down:
        return moe_config_table(E, N, device_name, False)
    return None, None


def default_config():
    """get_default_config for fp8_w8a8 with block-wise quantisation (CUDA)."""
    return {"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": BLOCK_SHAPE[0], "BLOCK_SIZE_K": BLOCK_SHAPE[1],
            "GROUP_SIZE_M": 32, "num_warps": 4, "num_stages": 3}


def moe_configs(E: int, N: int, M: int, device_name: str | None = None):
    """(up config, down config) as try_get_optimal_moe_config(return_down_config=True) picks them
    for w2 [E, K, N] and M tokens: the table entry nearest M, else the default. TMA flags
    (USE_TMA) are dropped: the TMA / sorted-output variants are not reproduced here."""
    device_name = device_name or _device_name()
    _, table = moe_config_table(E, N, device_name)
    config = dict(table[min(table, key=lambda x: abs(x - M))]) if table else default_config()
    _, down_table = moe_config_table(E, N, device_name, True)
    down = dict(down_table[min(down_table, key=lambda x: abs(x - M))]) if down_table else None
    if down is not None:
        down["BLOCK_SIZE_M"] = config["BLOCK_SIZE_M"]  # both GEMMs share one alignment
    for c in (config, down):
        if c is not None and c.pop("USE_TMA", False):
            logger.warning("MoE config asks for TMA; this prototype runs the non-TMA kernel")
    return config, down


# ----------------------------------------------------------------------------------------------
# moe_align_block_size (SGLang's contract, "+1 offset" convention: id -1 -> bucket 0, whose blocks
# get expert id -1 and are skipped by the GEMMs, which write zeros for their rows)
# ----------------------------------------------------------------------------------------------
def _align_buffers(numel: int, block_size: int, num_experts: int, device):
    """Buffers sized as sglang.srt.layers.moe.moe_runner.triton_utils.moe_align_block_size does."""
    if numel < num_experts + 1:
        max_padded = numel * block_size
    else:
        max_padded = numel + (num_experts + 1) * (block_size - 1)
    max_padded = (max_padded + 3) // 4 * 4
    sorted_ids = torch.empty(max_padded, dtype=torch.int32, device=device)
    expert_ids = torch.empty(triton.cdiv(max_padded, block_size), dtype=torch.int32, device=device)
    num_post_pad = torch.empty(1, dtype=torch.int32, device=device)
    return sorted_ids, expert_ids, num_post_pad


def moe_align_block_size_torch(topk_ids, block_size: int, num_experts: int):
    """Replacement of sgl_kernel's moe_align_block_size (CUDA) in torch device ops, no host sync:
    pairs grouped by bucket (id + 1), each bucket padded to a multiple of block_size, buckets in
    order; pads hold numel; expert_ids[b] = bucket - 1. Within a bucket the order is stable (the
    CUDA kernel's is atomic order; the GEMMs do not depend on it)."""
    device = topk_ids.device
    sorted_ids, expert_ids, num_post_pad = _align_buffers(topk_ids.numel(), block_size,
                                                          num_experts, device)
    flat = topk_ids.reshape(-1).to(torch.int64)
    numel = flat.numel()
    bucket = flat + 1  # [0, num_experts]
    counts = torch.zeros(num_experts + 1, dtype=torch.int64, device=device)
    counts.scatter_add_(0, bucket, torch.ones_like(bucket))
    padded = (counts + block_size - 1) // block_size * block_size
    pad_end = padded.cumsum(0)
    pad_start = pad_end - padded
    start = counts.cumsum(0) - counts
    order = torch.argsort(bucket, stable=True)
    sorted_bucket = bucket[order]
    dest = pad_start[sorted_bucket] + torch.arange(numel, device=device) - start[sorted_bucket]
    sorted_ids.fill_(numel)
    sorted_ids.scatter_(0, dest, order.to(torch.int32))
    block_start = torch.arange(expert_ids.numel(), device=device, dtype=torch.int64) * block_size
    # bucket of each block, minus one; blocks past the total (never read) get num_experts
    expert_ids.copy_(torch.searchsorted(pad_end, block_start, right=True) - 1)
    num_post_pad.copy_(pad_end[-1:])
    return sorted_ids, expert_ids, num_post_pad


def moe_align_block_size(topk_ids, block_size: int, num_experts: int, align: str = "auto"):
    """align='auto': SGLang's single-launch Triton align (moe_align_small_numel, same contract)
    for T*8 <= 64 pairs, the torch replacement above otherwise; 'triton' / 'torch' force one."""
    numel = topk_ids.numel()
    if align == "auto":
        align = "triton" if numel <= SMALL_NUMEL_LIMIT else "torch"
    if align == "torch":
        return moe_align_block_size_torch(topk_ids, block_size, num_experts)
    if align != "triton":
        raise ValueError(f"align must be 'auto', 'triton' or 'torch', not {align!r}")
    sorted_ids, expert_ids, num_post_pad = _align_buffers(numel, block_size, num_experts,
                                                          topk_ids.device)
    sglang_function(ALIGN_SMALL, "moe_align_small_numel")(
        topk_ids, num_experts + 1, block_size, sorted_ids, expert_ids, num_post_pad)
    return sorted_ids, expert_ids, num_post_pad


# ----------------------------------------------------------------------------------------------
# SiLU-and-mul in the definition's gate/up order (replaces SGLang's CUDA silu_and_mul)
# ----------------------------------------------------------------------------------------------
@triton.jit
def _silu_second_half_and_mul_kernel(x_ptr, y_ptr, ids_ptr, INTER: tl.constexpr,
                                     BLOCK: tl.constexpr, FILTER: tl.constexpr):
    """y[r] = silu(x[r, INTER:]) * x[r, :INTER] for one row r (a (token, slot) pair); rows of
    dropped pairs (id -1) are skipped as SGLang's filtered silu_and_mul skips them: GEMM2 never
    reads them."""
    row = tl.program_id(0)
    if FILTER:
        if tl.load(ids_ptr + row) == -1:
            return
    x_row = x_ptr + row.to(tl.int64) * (2 * INTER)
    y_row = y_ptr + row.to(tl.int64) * INTER
    for start in tl.range(0, INTER, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        mask = offs < INTER
        up = tl.load(x_row + offs, mask=mask, other=0.0).to(tl.float32)
        gate = tl.load(x_row + INTER + offs, mask=mask, other=0.0).to(tl.float32)
        tl.store(y_row + offs, (gate * tl.sigmoid(gate) * up).to(y_ptr.dtype.element_ty), mask=mask)


def silu_second_half_and_mul(x, out, topk_ids=None):
    rows, two_inter = x.shape
    _silu_second_half_and_mul_kernel[(rows,)](
        x, out, topk_ids if topk_ids is not None else x, INTER=two_inter // 2, BLOCK=512,
        FILTER=topk_ids is not None, num_warps=4)
    return out


# ----------------------------------------------------------------------------------------------
# The definition's entry point
# ----------------------------------------------------------------------------------------------
@torch.no_grad()
def moe_fp8_sglang(routing_logits, routing_bias, hidden_states, hidden_states_scale, gemm1_weights,
                   gemm1_weights_scale, gemm2_weights, gemm2_weights_scale, local_expert_offset,
                   routed_scaling_factor, *, router: str = "auto", align: str = "auto",
                   config: dict | None = None, down_config: dict | None = None):
    """Routed FFN of this rank's experts through SGLang's Triton fused MoE; [T, H] bf16.

    Any hidden / intermediate size that is a multiple of 128 works (the tests shrink them).
    `config` / `down_config` override SGLang's config lookup (BLOCK_SIZE_M/N/K, GROUP_SIZE_M,
    num_warps, num_stages), as SGLang's override_config does."""
    num_tokens, hidden = hidden_states.shape
    num_local = gemm1_weights.shape[0]
    device = hidden_states.device
    out = torch.empty(num_tokens, hidden, dtype=torch.bfloat16, device=device)
    if num_tokens == 0:
        return out

    # 1. routing, then this rank's expert ids (-1 elsewhere)
    topk_weights, topk_ids = route(routing_logits, routing_bias, routed_scaling_factor, router)
    topk_ids = to_local_ids(topk_ids, local_expert_offset, num_local)
    # 2.-4. SGLang's fused-experts sequence; hidden_states_scale.t() is a [T, H/128] view
    return fused_experts_fp8(hidden_states, hidden_states_scale.t(), gemm1_weights,
                             gemm1_weights_scale, gemm2_weights, gemm2_weights_scale, topk_weights,
                             topk_ids, routed_scaling_factor, out=out, config=config,
                             down_config=down_config, align=align)


def fused_experts_fp8(a1, a1_scale, w1, w1_scale, w2, w2_scale, topk_weights, topk_ids,
                      routed_scaling_factor, *, out=None, config=None, down_config=None,
                      align="auto", intermediates=None):
    """fused_experts_impl's sequence for FP8 block-scaled weights and FP8 activations:
    a1 [T, H] fp8 with a1_scale [T, H/128] (any strides), w1 [E, 2I, H], w2 [E, H, I] with
    [E, ., .] block scales, topk ids local to this rank (-1 = dropped). `intermediates`, a dict,
    receives the intermediate tensors (tests only)."""
    num_tokens, hidden = a1.shape
    num_local, two_inter, _ = w1.shape
    inter = two_inter // 2
    device = a1.device
    if out is None:
        out = torch.empty(num_tokens, hidden, dtype=torch.bfloat16, device=device)
    invoke = sglang_function(KERNELS, "invoke_fused_moe_kernel")
    group_quant = sglang_function(FP8_KERNEL, "_per_token_group_quant_8bit_raw")
    sum_reduce = sglang_function(KERNELS, "moe_sum_reduce_triton")
    top_k = topk_ids.shape[1]

    # _prepare_fused_moe_run: config, then the expert-sorted, BLOCK_SIZE_M-padded layout
    if config is None:
        config, found_down = moe_configs(num_local, inter, num_tokens)
        down_config = down_config or found_down
    config = dict(config)
    config.pop("USE_TMA", None)  # the TMA variants are not reproduced (SGLang's default has none)
    if down_config is not None:
        down_config = dict(down_config)
        down_config.pop("USE_TMA", None)
    sorted_ids, expert_ids, num_post_pad = moe_align_block_size(
        topk_ids, config["BLOCK_SIZE_M"], num_local, align)

    # _fused_moe_kernel_sequence. GEMM1 reads the FP8 activations and their scales directly
    # (SGLang's pre-quantized a1_q path: no quantisation pass).
    common = dict(compute_type=tl.bfloat16, use_fp8_w8a8=True, use_int8_w8a8=False,
                  use_int8_w8a16=False, use_int4_w4a16=False, per_channel_quant=False,
                  block_shape=BLOCK_SHAPE, filter_expert=True)
    cache1 = torch.empty(num_tokens * top_k, two_inter, dtype=torch.bfloat16, device=device)
    invoke(a1, w1, None, cache1, a1_scale, w1_scale, None, topk_weights, topk_ids, sorted_ids,
           expert_ids, num_post_pad, False, top_k, config, **common)
    cache2 = torch.empty(num_tokens * top_k, inter, dtype=torch.bfloat16, device=device)
    silu_second_half_and_mul(cache1, cache2, topk_ids.view(-1))
    if intermediates is not None:
        intermediates["cache1"] = cache1
    del cache1
    # GEMM2's input quantisation (inside invoke_fused_moe_kernel on SGLang's side, JIT CUDA on
    # H100): SGLang's Triton per-token-group kernel, row-major [T*8, I/128] scales.
    a2, a2_scale = group_quant(cache2, BLOCK_SHAPE[1])
    if intermediates is not None:
        intermediates["cache2"] = cache2
    del cache2
    cache3 = torch.empty(num_tokens, top_k, hidden, dtype=torch.bfloat16, device=device)
    invoke(a2, w2, None, cache3, a2_scale, w2_scale, None, topk_weights, topk_ids, sorted_ids,
           expert_ids, num_post_pad, True, 1, down_config or config, router_topk=top_k, **common)

    # moe_combine_topk: sum over the top-k slots (zeros for dropped pairs), times the factor
    sum_reduce(cache3, out, float(routed_scaling_factor))
    if intermediates is not None:
        intermediates.update(config=config, sorted_ids=sorted_ids, expert_ids=expert_ids,
                             num_post_pad=num_post_pad, a2=a2, a2_scale=a2_scale, cache3=cache3)
    return out


variant("moe_fp8", "sglang_triton_moe", backend="library", archs=("sm90",), requires=("sglang", "triton"),
        baseline=True)(moe_fp8_sglang)
