"""GDN prefill, staged, with the walk on mma.sync (`cuda_prefill_staged`): a first launch computing every
16-token block's T diag(beta), P and per-token factors at once, then prefill_walk.cu's walk, each
sequence's blocks in order with the state in registers; the .cu has the transposed algebra that keeps the
state and every intermediate in mma accumulator fragments. The first launch is the .cu's too (`algebra`:
one warp a block and q/k head, its products on mma.sync, the inverse by substitution, a pair of value
heads at once; the engines' activated gates and the contest's raw ones). Against the Triton first launch
of kernels/triton/gdn/prefill_staged.py it replaced: benchmarks/results/algebra-cuda-ab-H200.txt.

Definitions as the Triton staged kernel: gdn_prefill (the contest's), gdn_prefill_pool_* and
gdn_prefill_gathered_*. Configurations `r<rows>s<stages>`: V rows a block (16 a warp; fewer rows a
block put more blocks on the SMs for few (sequence, head) pairs) and blocks of input in flight. Two
launches, no host sync (CUDA-graph safe); device-side checks as the .cu says.

Context parallel (`cuda_prefill_cp`), the same walk over segments of each sequence at once: prefill_cp.py,
prefill_cp.cu (a continuation of this .cu, so nothing there changes this walk's kernels or provenance).

Both launch plainly: the walk as a programmatic dependent of the first launch was slower in graphs at
every shape measured (benchmarks/results/walk-pdl-ab-H200.txt).

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
from kdispatch.kernels.triton.gdn.prefill_staged import DIM
from kdispatch.registry import variant

CU = Path(__file__).with_name("prefill_walk.cu")
# pointers, T N num_slots HV HQK has_state, strides, then CP's plan aux bs as (null here; see the .cu)
SIGNATURE = "p" * 10 + "liiiii" + "l" * 9 + "pppp"
# (warps a block, pipeline stages) compiled in the .cu: 16 V rows a warp, blocks in flight. On the H200
# grid (benchmarks/results/gdn-fused-grid-H200.txt) 32 rows won up to ~32 (sequence, head) pairs, 64
# above; 16 and 128 rows never, 64 rows at 2 stages within 1% of 4 stages everywhere (all measured there)
KERNELS = ((2, 4), (4, 4))
LAUNCH_CONFIGS = {f"r{16 * w}s{n}": dict(cfg=(w, n)) for w, n in KERNELS}

_kernels: dict[tuple, nvrtc.Kernel] = {}
# the first launch's: q k g beta A_log dt_bias cu_seqlens mats fac, scale, T, N HV HQK, the q / k token and head
# strides, the gates' token strides; value heads a q/k head it takes at most (the .cu's ALG_HEADS)
ALGEBRA_SIGNATURE = "p" * 9 + "f" + "l" + "iii" + "l" * 6
ALGEBRA_HEADS = 4


def stage_bytes(warps: int) -> int:
    """Shared memory of one pipeline stage (the .cu's Stage): K and Q rows at 136, V at 16 W + 8,
    two 16 x 24 matrices (bf16), 64 fp32 factors."""
    return 2 * 16 * 136 * 2 + 16 * (16 * warps + 8) * 2 + 2 * 16 * 24 * 2 + 64 * 4


def kernel(warps: int, stages: int, pooled: bool) -> nvrtc.Kernel:
    kern = _kernels.get((warps, stages, pooled))
    if kern is None:
        if (warps, stages) not in KERNELS:
            raise ValueError(f"cuda_prefill_staged: no walk kernel of {warps} warps and {stages} stages ({KERNELS})")
        kern = _load(CU, f"gdn_prefill_walk_w{warps}_s{stages}_{'pool' if pooled else 'contest'}",
                     stages * stage_bytes(warps))
        _kernels[(warps, stages, pooled)] = kern
    return kern


def algebra(q, k, gates, cu_seqlens, HV: int, scale: float, *, contest: bool, kern=None, extra=()):
    """The first launch in CUDA, the .cu's gdn_prefill_algebra_<pool|contest>: (matrices, factors) of every
    16-token block and value head. `gates`: (g, beta, None, None) activated, fp32, q/k normalised in the
    launch (the engines'); or the contest's (a, b, A_log, dt_bias), bf16 a and b, fp32 A_log and dt_bias [HV]
    (the dispatcher checks dtypes against the definition). `kern`, `extra`: a build of it taking these
    arguments more and one more column of the grid (prefill_cp.py's, which makes CP's plan there)."""
    T, HQK = q.shape[0], q.shape[1]
    N = cu_seqlens.shape[0] - 1
    if HV % HQK or HV // HQK > ALGEBRA_HEADS:
        raise ValueError(f"cuda_prefill_staged: {HV} value heads over {HQK} q/k heads "
                         f"(at most {ALGEBRA_HEADS} a q/k head)")
    g, beta, A_log, dt_bias = gates
    g = g if g.stride(-1) == 1 else g.contiguous()
    beta = beta if beta.stride(-1) == 1 else beta.contiguous()
    blocks = -(-T // 16)
    mats = torch.empty(max(blocks, 1) * HV * 512, device=q.device, dtype=torch.bfloat16)
    factors = torch.empty(max(blocks, 1) * HV * 64, dtype=torch.float32, device=q.device)
    if blocks or kern is not None:
        if kern is None:
            kind = "contest" if contest else "pool"
            kern = _kernels.get(("algebra", kind))
            if kern is None:
                kern = _kernels[("algebra", kind)] = nvrtc.load_kernel(CU, f"gdn_prefill_algebra_{kind}",
                                                                       signature=ALGEBRA_SIGNATURE)
        kern.launch((blocks + bool(extra), HQK), 32, q, k, g, beta, A_log, dt_bias, cu_seqlens, mats, factors,
                    float(scale), T, N, HV, HQK, q.stride(0), q.stride(1), k.stride(0), k.stride(1), g.stride(0),
                    beta.stride(0), *extra, stream=nvrtc.current_stream(q.get_device()))
    return mats, factors


def _load(source, name: str, shmem: int) -> nvrtc.Kernel:
    """A walk-signature kernel of `source` (a .cu, or prefill_cp.py's text) with `shmem` of dynamic shared memory."""
    kern = nvrtc.load_kernel(source, name, signature=SIGNATURE)
    kern.set_attribute("MAX_DYNAMIC_SHARED_SIZE_BYTES", shmem)
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


def inputs(q, k, v, state, out):
    """The walk's checks and q, k, v as it reads them (`_aligned`); None for an empty batch of sequences."""
    q, k, v = _aligned(q), _aligned(k), _aligned(v)
    ss = state.stride()
    if ss[-1] != 1 or (ss[0] | ss[1] | ss[2]) & 1 or state.data_ptr() % 8:
        raise ValueError("cuda_prefill_staged: the state needs 8-byte aligned slots, heads and rows")
    if out.stride() != (out.shape[1] * DIM, DIM, 1) or out.data_ptr() % 16:
        raise ValueError("cuda_prefill_staged: out must be contiguous and 16-byte aligned")
    return q, k, v


def walk_args(q, k, v, mats, factors, state, slots, init, cu_seqlens, out, *, has_state) -> tuple:
    """Every walk kernel's arguments up to CP's four (plan aux bs as)."""
    ss = state.stride()
    return (q, k, v, mats, factors, state, slots, init, cu_seqlens, out, q.shape[0], cu_seqlens.shape[0] - 1,
            state.shape[0], v.shape[1], q.shape[1], int(has_state), q.stride(0), q.stride(1), k.stride(0),
            k.stride(1), v.stride(0), v.stride(1), ss[0], ss[1], ss[2])


def _walk(q, k, v, gates, state, slots, init, cu_seqlens, out, scale, *, contest, has_state, cfg=None):
    HV, N = v.shape[1], cu_seqlens.shape[0] - 1
    if N <= 0:
        return
    q, k, v = inputs(q, k, v, state, out)
    mats, factors = algebra(q, k, gates, cu_seqlens, HV, scale, contest=contest)
    warps, stages = cfg or config(N, HV)
    kernel(warps, stages, slots is not None).launch(
        N * HV * (DIM // (16 * warps)), 32 * warps,
        *walk_args(q, k, v, mats, factors, state, slots, init, cu_seqlens, out, has_state=has_state),
        None, None, None, None, shmem=stages * stage_bytes(warps), stream=nvrtc.current_stream(q.get_device()))


def gdn_prefill_pool_walk(q, k, v, g, beta, state_pool, state_indices, has_initial_state, cu_seqlens, out,
                          scale, cfg: tuple[int, int] | None = None, run=_walk):
    """The engines' prefill (gdn_prefill_pool_*). Returns (out, state_pool). `run`: the walk (prefill_cp.py's
    CP walk takes the same call)."""
    if has_initial_state.dtype != torch.bool or state_indices.dtype != torch.int32 or cu_seqlens.dtype != torch.int32:
        raise ValueError("cuda_prefill_staged: int32 state_indices and cu_seqlens, bool has_initial_state")
    run(q, k, v, (g, beta, None, None), state_pool, state_indices, has_initial_state, cu_seqlens, out,
        _resolve_scale(scale, DIM), contest=False, has_state=True, cfg=cfg)
    return out, state_pool


def gdn_prefill_walk(q, k, v, state, A_log, a, dt_bias, b, cu_seqlens, scale, cfg: tuple[int, int] | None = None,
                     run=_walk):
    """The contest's prefill (gdn_prefill_qk4_v8_d128_k_last): the final states written into `state` in
    place (a new zero state when None). Returns (out, state)."""
    T, HV, N = q.shape[0], v.shape[1], cu_seqlens.shape[0] - 1
    given = state is not None
    if not given:
        state = torch.zeros(N, HV, DIM, DIM, dtype=torch.float32, device=q.device)
    out = torch.empty(T, HV, DIM, dtype=torch.bfloat16, device=q.device)
    if cu_seqlens.dtype != torch.int64:
        cu_seqlens = cu_seqlens.to(torch.int64)
    run(q, k, v, (a, b, A_log.contiguous(), dt_bias.contiguous()), state, None, None, cu_seqlens, out,
        _resolve_scale(scale, DIM), contest=True, has_state=given, cfg=cfg)
    return out, state


def gdn_prefill_gathered_walk(q, k, v, g, beta, initial_state, cu_seqlens, out, scale, cfg=None, run=_walk):
    """vLLM's gathered states as a pool of one slot per sequence (prefill_gathered.py)."""
    n = initial_state.shape[0]
    return gdn_prefill_pool_walk(q, k, v, g, beta, initial_state, identity_slots(n, q.device),
                                 all_true(n, q.device), cu_seqlens, out, scale, cfg=cfg, run=run)


REQUIRES = ("triton", "cuda.core")
variant("gdn_prefill", "cuda_prefill_staged", backend="cuda", archs=("sm90",), requires=REQUIRES,
        configs=LAUNCH_CONFIGS)(gdn_prefill_walk)
for _definition in ([pool_prefill_name(hq, hv) for hq, hv in PACKED_HEADS.values()]
                    + [gathered_prefill_name(hq, hv) for hq, hv in GATHERED_HEADS.values()]):
    variant(_definition, "cuda_prefill_staged", backend="cuda", archs=("sm90",), requires=REQUIRES,
            configs=LAUNCH_CONFIGS, strided=True)(
        gdn_prefill_pool_walk if _definition.startswith("gdn_prefill_pool") else gdn_prefill_gathered_walk)
