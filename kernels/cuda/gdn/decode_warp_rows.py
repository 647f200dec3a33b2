"""GDN decode, CUDA: warps over V rows, lanes along K (decode_warp_rows.cu), compiled through NVRTC.
Two conventions share the kernel template: the contest's (below) and the engines' packed pool
decode (`gdn_decode_packed_rows`, one variant per TP head count, see its docstring); the engines'
speculative verification (`gdn_verify_rows`) runs the same step over each request's draft tokens.

    q, k     [B, 1, 4, 128] bf16          v        [B, 1, 8, 128] bf16
    state    [B, 8, 128, 128] fp32 (k-last; updated in place and returned)
    A_log    [8] fp32    a, b [B, 1, 8] bf16    dt_bias [8] fp32    scale: float (0 or None: 1/sqrt(128))
    returns  (out [B, 1, 8, 128] bf16, state)
q, k, v, a and b may be strided views with a contiguous last dimension (split out of one packed
projection): the kernel reads them through their batch and head strides, no copy.

One kernel launch, no host-device sync (CUDA-graph safe). A warp owns R consecutive V rows of
one (batch, head), lane l owns K columns 4l..4l+3. Every (R, evict-first state accesses) pair is a
registered configuration (`cuda_decode_warp_rows.r4cs`, ...) that the tuner measures and routes by
batch size; `config(B)` is the default of a direct call.
The kernel compiles on first call (cached on disk, see kdispatch.nvrtc); importing this module
touches no GPU.
"""
from __future__ import annotations

from pathlib import Path

import torch

from kdispatch import nvrtc
from kdispatch.definitions.gdn.names import PACKED_HEADS, packed_name, verify_name, verify_steps_name
from kdispatch.registry import variant

CU = Path(__file__).with_name("decode_warp_rows.cu")
SIGNATURE = "p" * 9 + "f" + "i" * 8 + "lii" + "pi"  # q k v state A_log a dt_bias b out, scale, strides,
# state strides, slots, num_slots (see the .cu)
HEADS, DIM = 8, 128
DEFAULT_SCALE = DIM ** -0.5
WARPS = 4  # per block, fixed in the .cu

_kernels: dict[tuple[int, bool], nvrtc.Kernel] = {}


def config(batch: int) -> tuple[int, bool]:
    """(R rows per warp, evict-first state accesses) for batch size B, from CUDA-graph timings on
    an H100 with rotated states (tests/gpu/test_gdn_cuda.py benchmark; R matters by 1-5%)."""
    if batch <= 1:
        return 4, False
    if batch <= 32:
        return 4, True
    return 1, True


def kernel(rows: int, cs: bool = False) -> nvrtc.Kernel:
    """The kernel with R = `rows` (1, 2, 4, 8) V rows per warp; `cs`: state accesses evict-first."""
    kern = _kernels.get((rows, cs))
    if kern is None:
        name = f"gdn_decode_warp_rows{'_cs' if cs else ''}_r{rows}"
        kern = _kernels[(rows, cs)] = nvrtc.load_kernel(CU, name, signature=SIGNATURE)
    return kern


CONFIGS = {f"r{rows}{'cs' if cs else ''}": dict(rows=rows, cs=cs) for rows in (1, 2, 4, 8) for cs in (False, True)}


@variant("gdn_decode", "cuda_decode_warp_rows", backend="cuda", archs=("sm90",), requires=("cuda.core",),
         configs=CONFIGS, strided=True)
def gdn_decode_warp_rows(q, k, v, state, A_log, a, dt_bias, b, scale, rows: int | None = None,
                         cs: bool | None = None):
    B = q.shape[0]
    if state is None:
        state = torch.zeros(B, HEADS, DIM, DIM, dtype=torch.float32, device=q.device)
    out = torch.empty(B, 1, HEADS, DIM, dtype=torch.bfloat16, device=q.device)
    if B == 0:
        return out, state
    st = state if state.is_contiguous() else state.contiguous()
    if (q.stride(0) | q.stride(2) | k.stride(0) | k.stride(2)) & 3:  # 8-byte loads need 4-element steps
        q, k = q.contiguous(), k.contiguous()
    pq, pk, pst = q.data_ptr(), k.data_ptr(), st.data_ptr()
    if (pq | pk) & 7 or pst & 15:
        raise ValueError("gdn_decode_warp_rows: q/k need 8-byte and state 16-byte aligned storage")
    R, CS = config(B)
    if rows is not None or cs is not None:  # explicit choice (benchmarks, tests)
        R, CS = rows or R, CS if cs is None else cs
    kernel(R, CS).launch(B * HEADS * DIM // (WARPS * R), 32 * WARPS,
                         pq, pk, v, pst, A_log, a, dt_bias, b, out, scale or DEFAULT_SCALE,
                         q.stride(0), q.stride(2), k.stride(0), k.stride(2), v.stride(0), v.stride(2),
                         a.stride(0), b.stride(0), HEADS * DIM * DIM, DIM * DIM, DIM, None, B,
                         stream=nvrtc.current_stream(q.get_device()))
    if st is not state:
        state.copy_(st)
    return out, state


_pool_kernels: dict[tuple[int, int, bool], nvrtc.Kernel] = {}


def pool_kernel(heads: int, rows: int, cs: bool = False) -> nvrtc.Kernel:
    """The packed pool kernel for `heads` value heads (compiled once per head count)."""
    kern = _pool_kernels.get((heads, rows, cs))
    if kern is None:
        name = f"gdn_decode_pool_rows{'_cs' if cs else ''}_r{rows}"
        kern = _pool_kernels[(heads, rows, cs)] = nvrtc.load_kernel(CU, name, signature=SIGNATURE,
                                                                    options=(f"-DPOOL_HV={heads}",))
    return kern


def gdn_decode_packed_rows(mixed_qkv, a, b, A_log, dt_bias, state_pool, state_indices, out, scale,
                           rows: int = 4, cs: bool = True):
    """The engines' decode (definitions gdn_decode_packed_*): q/k/v read from the packed rows through
    their stride, q and k L2-normalised in the kernel, each row's state read from and written to
    its slot of the pool in place (slot outside the pool: zero output, nothing touched), the output
    written into `out`. Returns (out, state_pool)."""
    B, HV = a.shape
    if B == 0:
        return out, state_pool
    HQ = (mixed_qkv.shape[1] - HV * DIM) // (2 * DIM)
    if mixed_qkv.stride(0) & 3 or mixed_qkv.data_ptr() & 7:  # q/k rows are read 8 bytes a lane
        mixed_qkv = mixed_qkv.contiguous()
    sp = state_pool.stride()
    if (sp[0] | sp[1] | sp[2]) & 3 or state_pool.data_ptr() & 15:
        raise ValueError("gdn_decode_packed_rows: state_pool needs 16-byte aligned slots, heads and rows")
    row, base = mixed_qkv.stride(0), mixed_qkv.data_ptr()
    qk_bytes = HQ * DIM * mixed_qkv.element_size()
    pool_kernel(HV, rows, cs).launch(
        B * HV * DIM // (WARPS * rows), 32 * WARPS,
        base, base + qk_bytes, base + 2 * qk_bytes, state_pool, A_log, a, dt_bias, b, out,
        scale or DEFAULT_SCALE, row, DIM, row, DIM, row, DIM, a.stride(0), b.stride(0), sp[0], sp[1], sp[2],
        state_indices, state_pool.shape[0], stream=nvrtc.current_stream(a.get_device()))
    return out, state_pool


POOL_CONFIGS = {f"r{rows}{'cs' if cs else ''}": dict(rows=rows, cs=cs) for rows in (1, 2, 4, 8, 16, 32)
                for cs in (False, True) if cs or rows < 32}  # r32 without evict-first spills
for _hq, _hv in PACKED_HEADS.values():
    variant(packed_name(_hq, _hv), "cuda_decode_pool_rows", backend="cuda", archs=("sm90",), requires=("cuda.core",),
            configs=POOL_CONFIGS, strided=True)(gdn_decode_packed_rows)


# + cu_seqlens, buffer, cache rows or step slots, their count, steps, T, accepted step counts
VERIFY_SIGNATURE = SIGNATURE + "ppp" + "ii" + "l" + "p"
_verify_kernels: dict[tuple[int, int, bool], nvrtc.Kernel] = {}


def verify_kernel(heads: int, rows: int, step_slots: bool = False) -> nvrtc.Kernel:
    """The verify kernel for `heads` value heads (compiled with the pool kernels of that head count):
    SGLang's contract, or vLLM's (`step_slots`)."""
    kern = _verify_kernels.get((heads, rows, step_slots))
    if kern is None:
        name = f"gdn_verify{'_steps' if step_slots else ''}_rows_r{rows}"
        kern = _verify_kernels[(heads, rows, step_slots)] = nvrtc.load_kernel(
            CU, name, signature=VERIFY_SIGNATURE, options=(f"-DPOOL_HV={heads}",))
    return kern


def _verify_inputs(q, k, state_pool, *buffers):
    """q, k with 8-byte lane loads (contiguous copies where their strides do not allow them), after
    checking that the pool and the buffers allow 16-byte state accesses."""
    sp = state_pool.stride()
    if (sp[0] | sp[1] | sp[2]) & 3 or any(x.data_ptr() & 15 for x in (state_pool, *buffers)):
        raise ValueError("verify: the pool and the buffer need 16-byte aligned slots, heads and rows")
    if any(x.stride(0) & 3 or x.stride(1) & 3 or x.data_ptr() & 7 for x in (q, k)):
        q, k = q.contiguous(), k.contiguous()
    return q, k, sp


def gdn_verify_rows(q, k, v, a, b, A_log, dt_bias, state_pool, state_indices, cu_seqlens, intermediate_states,
                    cache_indices, scale, rows: int = 4):
    """SGLang's speculative verification (definitions gdn_verify_*): per (request, head, 4R rows) one
    block runs the request's tokens with the state in registers, read once from its slot (never
    written), storing the state after every step into the request's row of the intermediate-states
    buffer; q and k L2-normalised, the gates activated in the kernel; every block checks cu_seqlens
    itself. One launch, no host sync. Returns (output [T, HV, 128] bf16, intermediate_states)."""
    T, HV = a.shape
    N = state_indices.shape[0]
    out = torch.empty(T, HV, DIM, dtype=torch.bfloat16, device=a.device)
    if N == 0 or T == 0:
        return out.zero_(), intermediate_states
    q, k, sp = _verify_inputs(q, k, state_pool, intermediate_states)
    verify_kernel(HV, rows).launch(
        N * HV * DIM // (WARPS * rows), 32 * WARPS,
        q, k, v, state_pool, A_log, a, dt_bias, b, out, scale or DEFAULT_SCALE,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), a.stride(0), b.stride(0),
        sp[0], sp[1], sp[2], state_indices, state_pool.shape[0], cu_seqlens, intermediate_states, cache_indices,
        intermediate_states.shape[0], intermediate_states.shape[1], T, None,
        stream=nvrtc.current_stream(a.get_device()))
    return out, intermediate_states


def gdn_verify_steps_rows(q, k, v, a, b, A_log, dt_bias, state_pool, step_slots, num_accepted, cu_seqlens, scale,
                          rows: int = 4):
    """vLLM's speculative verification (definitions gdn_verify_steps_*): the same kernel, reading each
    request's state from the slot of its accepted step and writing the state after each step into
    that step's slot of the pool (slot 0, vLLM's null block, skipped). One launch, no host sync.
    Returns (output [T, HV, 128] bf16, state_pool)."""
    T, HV = a.shape
    N, S = step_slots.shape
    out = torch.empty(T, HV, DIM, dtype=torch.bfloat16, device=a.device)
    if N == 0 or T == 0:
        return out.zero_(), state_pool
    q, k, sp = _verify_inputs(q, k, state_pool)
    verify_kernel(HV, rows, step_slots=True).launch(
        N * HV * DIM // (WARPS * rows), 32 * WARPS,
        q, k, v, state_pool, A_log, a, dt_bias, b, out, scale or DEFAULT_SCALE,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), a.stride(0), b.stride(0),
        sp[0], sp[1], sp[2], None, state_pool.shape[0], cu_seqlens, None, step_slots, step_slots.stride(0), S, T,
        num_accepted,
        stream=nvrtc.current_stream(a.get_device()))
    return out, state_pool


VERIFY_CONFIGS = {f"r{rows}": dict(rows=rows) for rows in (1, 2, 4, 8)}
for _hq, _hv in PACKED_HEADS.values():
    variant(verify_name(_hq, _hv), "cuda_verify_rows", backend="cuda", archs=("sm90",), requires=("cuda.core",),
            configs=VERIFY_CONFIGS, strided=True)(gdn_verify_rows)
    variant(verify_steps_name(_hq, _hv), "cuda_verify_steps_rows", backend="cuda", archs=("sm90",),
            requires=("cuda.core",), configs=VERIFY_CONFIGS, strided=True)(gdn_verify_steps_rows)
