"""GDN prefill, CUDA: the recurrence token by token with the state in registers
(prefill_thread_rows.cu), compiled through NVRTC.  For short sequences, where chunked kernels
spend their time on launch latency and multi-kernel pipelines.  Two conventions share the kernel
template: the contest's (below) and the engines' pool prefill (`gdn_prefill_pool_rows`, one variant
per TP head count, see its docstring).

    q, k        [T, 4, 128] bf16        v [T, 8, 128] bf16        a, b [T, 8] bf16
    state       [N, 8, 128, 128] fp32 (k-last; updated in place and returned)
    A_log, dt_bias [8] fp32             cu_seqlens [N + 1] int64 (read on the device)
    scale       float (0 or None: 1/sqrt(128))
    returns     (out [T, 8, 128] bf16, state)

One kernel launch, no host-device sync (CUDA-graph safe); every block checks cu_seqlens on the device
first (a malformed batch: zero output, states untouched, as the reference).  A block owns ROWS V rows of one
(sequence, v-head); KSPLIT adjacent threads share a row (KSPLIT = 1: one thread per row with its
128 state values in registers); the inputs of CHUNK (8 or 16) tokens are staged per barrier.  Few sequences split each head's 128 rows over more blocks and
threads, so that the sequential token loop runs on more SMs with shorter per-thread work.
The cost grows linearly with the longest sequence: the router should pick this for short ones.
Every (KSPLIT, CHUNK) is a registered configuration (`cuda_prefill_thread_rows.k8c16`, ...) that the
tuner measures and routes by shape; `config()` is the default of a direct call.
"""
from __future__ import annotations

from pathlib import Path

import torch

from kdispatch import nvrtc
from kdispatch.definitions.gdn.names import PACKED_HEADS, pool_prefill_name
from kdispatch.registry import variant

CU = Path(__file__).with_name("prefill_thread_rows.cu")
SIGNATURE = "p" * 10 + "fl"  # q k v state A_log a dt_bias b cu_seqlens out, scale, T
HEADS, DIM = 8, 128
DEFAULT_SCALE = DIM ** -0.5
CONFIGS = ((1, 128), (2, 64), (4, 32), (8, 16), (16, 8))  # (KSPLIT, ROWS) layouts: 128 threads
CHUNKS = {8: CONFIGS, 16: CONFIGS[1:]}  # tokens staged per barrier -> layouts compiled with it in the .cu

_kernels: dict[tuple[int, int, int], nvrtc.Kernel] = {}


def config(num_seqs: int, total_tokens: int = 0) -> tuple[int, int, int]:
    """(KSPLIT, ROWS, CHUNK) for N sequences of T tokens in all: blocks = N * 8 * KSPLIT (ROWS =
    128 / KSPLIT, 128 threads).  From CUDA-graph timings on an H100 (benchmarks/gdn_prefill_sweep.py,
    2026-11-23): one sequence wants many small blocks (short per-token latency on many SMs), up to
    4 sequences 8 lanes per row, up to 15 four, then two; one thread per row (occupancy-limited by
    its 255 registers) only won for many long sequences (8192 tokens in 32).  16-token chunks from
    a mean of 16 tokens per sequence (10-15% faster there), 8 below (shorter prologue)."""
    if num_seqs <= 1:
        ksplit, rows = 16, 8
    elif num_seqs <= 4:
        ksplit, rows = 8, 16
    elif num_seqs < 16:
        ksplit, rows = 4, 32
    elif num_seqs >= 32 and total_tokens >= 128 * num_seqs:
        return 1, 128, 8
    else:
        ksplit, rows = 2, 64
    return ksplit, rows, 16 if total_tokens >= 16 * max(num_seqs, 1) else 8


def kernel(ksplit: int, rows: int, chunk: int = 8) -> nvrtc.Kernel:
    kern = _kernels.get((ksplit, rows, chunk))
    if kern is None:
        if (ksplit, rows) not in CHUNKS.get(chunk, ()):
            raise ValueError(f"gdn_prefill_thread_rows: no kernel for KSPLIT={ksplit}, ROWS={rows}, CHUNK={chunk}")
        kern = nvrtc.load_kernel(CU, f"gdn_prefill_thread_rows_k{ksplit}_r{rows}_c{chunk}", signature=SIGNATURE)
        _kernels[(ksplit, rows, chunk)] = kern
    return kern


LAUNCH_CONFIGS = {f"k{ks}c{chunk}": dict(cfg=(ks, rows, chunk)) for chunk, layouts in CHUNKS.items()
                  for ks, rows in layouts}
MAX_TOKENS = 8192  # the token loop is sequential: beyond this a chunked kernel is several times faster


def _short_enough(features: dict, kwargs: dict):
    """Offered up to MAX_TOKENS tokens in all: on the H100 the recurrence won only up to ~2700 tokens
    (eager) and ~800 (graphs), so longer batches are not worth measuring nine configurations on."""
    return None if features["total_seq_len"] <= MAX_TOKENS else f"more than {MAX_TOKENS} tokens"


@variant("gdn_prefill", "cuda_prefill_thread_rows", backend="cuda", archs=("sm90",), requires=("cuda.core",),
         configs=LAUNCH_CONFIGS, supports=_short_enough)
def gdn_prefill_thread_rows(q, k, v, state, A_log, a, dt_bias, b, cu_seqlens, scale,
                            cfg: tuple[int, int, int] | None = None):
    T, N = q.shape[0], cu_seqlens.shape[0] - 1
    if state is None:
        state = torch.zeros(N, HEADS, DIM, DIM, dtype=torch.float32, device=q.device)
    out = torch.empty(T, HEADS, DIM, dtype=torch.bfloat16, device=q.device)
    if N <= 0:
        return out, state
    st = state if state.is_contiguous() else state.contiguous()
    q, k, v, a, b = q.contiguous(), k.contiguous(), v.contiguous(), a.contiguous(), b.contiguous()
    if cu_seqlens.dtype != torch.int64:
        cu_seqlens = cu_seqlens.to(torch.int64)
    pq, pk, pst = q.data_ptr(), k.data_ptr(), st.data_ptr()
    if (pq | pk) & 7 or pst & 15:
        raise ValueError("gdn_prefill_thread_rows: q/k need 8-byte and state 16-byte aligned storage")
    ksplit, rows, chunk = cfg or config(N, T)
    kernel(ksplit, rows, chunk).launch(N * HEADS * (DIM // rows), rows * ksplit,
                                pq, pk, v, pst, A_log, a, dt_bias, b, cu_seqlens.contiguous(), out,
                                scale or DEFAULT_SCALE, T, stream=nvrtc.current_stream(q.get_device()))
    if st is not state:
        state.copy_(st)
    return out, state


POOL_SIGNATURE = "p" * 8 + "fl" + "l" * 11 + "ppi"  # q k v pool g beta cu_seqlens out, scale, T, strides,
# slots, has_init, num_slots (see the .cu)
_pool_kernels: dict[tuple[int, int, int, int], nvrtc.Kernel] = {}


def pool_kernel(heads: int, ksplit: int, rows: int, chunk: int) -> nvrtc.Kernel:
    """The pool prefill kernel for `heads` value heads (compiled once per head count)."""
    kern = _pool_kernels.get((heads, ksplit, rows, chunk))
    if kern is None:
        if (ksplit, rows) not in CHUNKS.get(chunk, ()):
            raise ValueError(f"gdn_prefill_pool_rows: no kernel for KSPLIT={ksplit}, ROWS={rows}, CHUNK={chunk}")
        kern = nvrtc.load_kernel(CU, f"gdn_prefill_pool_rows_k{ksplit}_r{rows}_c{chunk}", signature=POOL_SIGNATURE,
                                 options=(f"-DPOOL_HV={heads}",))
        _pool_kernels[(heads, ksplit, rows, chunk)] = kern
    return kern


def gdn_prefill_pool_rows(q, k, v, g, beta, state_pool, state_indices, has_initial_state, cu_seqlens, out,
                          scale, cfg: tuple[int, int, int] | None = None):
    """The engines' prefill (definitions gdn_prefill_pool_*): q/k/v read through their token and head
    strides, q and k L2-normalised in the kernel, the gates as the engine activated them, each
    sequence's state read from its slot (zeros without has_initial_state) and its final state written
    back in place (slot outside the pool: zero output, nothing touched), the output written into
    `out`. One launch, no host sync. Returns (out, state_pool)."""
    T, HV = g.shape
    N = cu_seqlens.shape[0] - 1
    if N <= 0:
        return out, state_pool
    if any(x.stride(0) & 3 or x.stride(1) & 3 or x.data_ptr() & 7 for x in (q, k)):
        q, k = q.contiguous(), k.contiguous()  # q/k rows are read 8 bytes a lane
    sp = state_pool.stride()
    if (sp[0] | sp[1] | sp[2]) & 3 or state_pool.data_ptr() & 15:
        raise ValueError("gdn_prefill_pool_rows: state_pool needs 16-byte aligned slots, heads and rows")
    if not out.is_contiguous():
        raise ValueError("gdn_prefill_pool_rows: out must be contiguous")
    ksplit, rows, chunk = cfg or config(max(N * HV // HEADS, 1), T * HV // HEADS)
    pool_kernel(HV, ksplit, rows, chunk).launch(
        N * HV * (DIM // rows), rows * ksplit,
        q, k, v, state_pool, g, beta, cu_seqlens, out, scale or DEFAULT_SCALE, T,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), g.stride(0), beta.stride(0),
        sp[0], sp[1], sp[2], state_indices, has_initial_state, state_pool.shape[0],
        stream=nvrtc.current_stream(q.get_device()))
    return out, state_pool


for _hq, _hv in PACKED_HEADS.values():
    variant(pool_prefill_name(_hq, _hv), "cuda_prefill_pool_rows", backend="cuda", archs=("sm90",),
            requires=("cuda.core",), configs=LAUNCH_CONFIGS, supports=_short_enough, strided=True)(gdn_prefill_pool_rows)
