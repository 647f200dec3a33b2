"""GDN prefill, staged, with the walk on mma.sync (`cuda_prefill_staged`): the Triton first launch of
kernels/triton/gdn/prefill_staged.py (every 16-token block's T diag(beta), P and per-token factors at
once), then prefill_walk.cu, each sequence's blocks in order with the state in registers; the .cu has
the transposed algebra that keeps the state and every intermediate in mma accumulator fragments.

Definitions as the Triton staged kernel: gdn_prefill (the contest's), gdn_prefill_pool_* and
gdn_prefill_gathered_*. Configurations `r<rows>s<stages>`: V rows a block (16 a warp; fewer rows a
block put more blocks on the SMs for few (sequence, head) pairs) and blocks of input in flight. Two
launches, no host sync (CUDA-graph safe); device-side checks as the .cu says.

Why a CUDA walk: the Triton walk (255 registers, layout exchanges through shared memory between its
dependent products) and this one do the same arithmetic, but here a warp owns 16 state rows outright,
so its products chain register to register. On the H200 grid (benchmarks/results/gdn-fused-grid-H200.txt)
1.03-1.36x the Triton staged walk's best configuration at every shape, most at many sequences.
"""
from __future__ import annotations

from pathlib import Path

import torch

from kdispatch import nvrtc
from kdispatch.definitions.gdn.gathered import GATHERED_HEADS, all_true, gathered_prefill_name, identity_slots
from kdispatch.definitions.gdn.names import PACKED_HEADS, pool_prefill_name
from kdispatch.kernels.triton.gdn.decode_splitv import _resolve_scale
from kdispatch.kernels.triton.gdn.prefill_staged import DIM, chunk_algebra
from kdispatch.registry import variant

CU = Path(__file__).with_name("prefill_walk.cu")
SIGNATURE = "p" * 10 + "liiiii" + "l" * 9  # pointers, T N num_slots HV HQK has_state, strides (see the .cu)
# (warps a block, pipeline stages) compiled in the .cu: 16 V rows a warp, blocks in flight. On the H200
# grid (benchmarks/results/gdn-fused-grid-H200.txt) 32 rows won up to ~32 (sequence, head) pairs, 64
# above; 16 and 128 rows never, 64 rows at 2 stages within 1% of 4 stages everywhere (all measured there)
KERNELS = ((2, 4), (4, 4))
LAUNCH_CONFIGS = {f"r{16 * w}s{n}": dict(cfg=(w, n)) for w, n in KERNELS}

_kernels: dict[tuple[int, int, bool], nvrtc.Kernel] = {}


def stage_bytes(warps: int) -> int:
    """Shared memory of one pipeline stage (the .cu's Stage): K and Q rows at 136, V at 16 W + 8,
    two 16 x 24 matrices (bf16), 64 fp32 factors."""
    return 2 * 16 * 136 * 2 + 16 * (16 * warps + 8) * 2 + 2 * 16 * 24 * 2 + 64 * 4


def kernel(warps: int, stages: int, pooled: bool) -> nvrtc.Kernel:
    kern = _kernels.get((warps, stages, pooled))
    if kern is None:
        if (warps, stages) not in KERNELS:
            raise ValueError(f"cuda_prefill_staged: no walk kernel of {warps} warps and {stages} stages ({KERNELS})")
        kern = nvrtc.load_kernel(CU, f"gdn_prefill_walk_w{warps}_s{stages}_{'pool' if pooled else 'contest'}",
                                 signature=SIGNATURE)
        kern.set_attribute("MAX_DYNAMIC_SHARED_SIZE_BYTES", stages * stage_bytes(warps))
        _kernels[(warps, stages, pooled)] = kern
    return kern


def config(num_seqs: int, num_v_heads: int) -> tuple[int, int]:
    """Default (warps a block, stages) of a direct call."""
    return (2, 4) if num_seqs * num_v_heads <= 32 else (4, 4)


def _aligned(x: torch.Tensor) -> torch.Tensor:
    """x itself when its rows can be copied 16 bytes at a time (cp.async), else a contiguous copy."""
    s = x.stride()  # one call, not three: host time, three tensors a call
    if s[-1] != 1 or s[0] % 8 or s[1] % 8 or x.data_ptr() % 16:
        return x.contiguous()
    return x


def _walk(q, k, v, gates, state, slots, init, cu_seqlens, out, scale, *, raw_gates, norm, has_state, cfg):
    T, HQK, HV, N = q.shape[0], q.shape[1], v.shape[1], cu_seqlens.shape[0] - 1
    if N <= 0:
        return
    q, k, v = _aligned(q), _aligned(k), _aligned(v)
    ss = state.stride()
    if ss[-1] != 1 or (ss[0] | ss[1] | ss[2]) & 1 or state.data_ptr() % 8:
        raise ValueError("cuda_prefill_staged: the state needs 8-byte aligned slots, heads and rows")
    if out.stride() != (out.shape[1] * DIM, DIM, 1) or out.data_ptr() % 16:
        raise ValueError("cuda_prefill_staged: out must be contiguous and 16-byte aligned")
    mats, factors = chunk_algebra(q, k, gates, cu_seqlens, HV, scale, raw_gates=raw_gates, norm=norm)
    warps, stages = cfg or config(N, HV)
    pooled = slots is not None
    kernel(warps, stages, pooled).launch(
        N * HV * (DIM // (16 * warps)), 32 * warps,
        q, k, v, mats, factors, state, slots, init, cu_seqlens, out, T, N, state.shape[0], HV, HQK, int(has_state),
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), ss[0], ss[1], ss[2],
        shmem=stages * stage_bytes(warps), stream=nvrtc.current_stream(q.get_device()))


def gdn_prefill_pool_walk(q, k, v, g, beta, state_pool, state_indices, has_initial_state, cu_seqlens, out,
                          scale, cfg: tuple[int, int] | None = None):
    """The engines' prefill (gdn_prefill_pool_*). Returns (out, state_pool)."""
    if has_initial_state.dtype != torch.bool or state_indices.dtype != torch.int32 or cu_seqlens.dtype != torch.int32:
        raise ValueError("cuda_prefill_staged: int32 state_indices and cu_seqlens, bool has_initial_state")
    _walk(q, k, v, (g, beta, None, None), state_pool, state_indices, has_initial_state, cu_seqlens, out,
          _resolve_scale(scale, DIM), raw_gates=False, norm=True, has_state=True, cfg=cfg)
    return out, state_pool


def gdn_prefill_walk(q, k, v, state, A_log, a, dt_bias, b, cu_seqlens, scale, cfg: tuple[int, int] | None = None):
    """The contest's prefill (gdn_prefill_qk4_v8_d128_k_last): the final states written into `state` in
    place (a new zero state when None). Returns (out, state)."""
    T, HV, N = q.shape[0], v.shape[1], cu_seqlens.shape[0] - 1
    given = state is not None
    if not given:
        state = torch.zeros(N, HV, DIM, DIM, dtype=torch.float32, device=q.device)
    out = torch.empty(T, HV, DIM, dtype=torch.bfloat16, device=q.device)
    if cu_seqlens.dtype != torch.int64:
        cu_seqlens = cu_seqlens.to(torch.int64)
    _walk(q, k, v, (a, b, A_log.contiguous(), dt_bias.contiguous()), state, None, None, cu_seqlens, out,
          _resolve_scale(scale, DIM), raw_gates=True, norm=False, has_state=given, cfg=cfg)
    return out, state


def gdn_prefill_gathered_walk(q, k, v, g, beta, initial_state, cu_seqlens, out, scale, cfg=None):
    """vLLM's gathered states as a pool of one slot per sequence (prefill_gathered.py)."""
    n = initial_state.shape[0]
    return gdn_prefill_pool_walk(q, k, v, g, beta, initial_state, identity_slots(n, q.device),
                                 all_true(n, q.device), cu_seqlens, out, scale, cfg=cfg)


_REQUIRES = ("triton", "cuda.core")
variant("gdn_prefill", "cuda_prefill_staged", backend="cuda", archs=("sm90",), requires=_REQUIRES,
        configs=LAUNCH_CONFIGS)(gdn_prefill_walk)
for _hq, _hv in PACKED_HEADS.values():
    variant(pool_prefill_name(_hq, _hv), "cuda_prefill_staged", backend="cuda", archs=("sm90",), requires=_REQUIRES,
            configs=LAUNCH_CONFIGS, strided=True)(gdn_prefill_pool_walk)
for _hq, _hv in GATHERED_HEADS.values():
    variant(gathered_prefill_name(_hq, _hv), "cuda_prefill_staged", backend="cuda", archs=("sm90",),
            requires=_REQUIRES, configs=LAUNCH_CONFIGS, strided=True)(gdn_prefill_gathered_walk)
