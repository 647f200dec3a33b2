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

Context parallel (`cuda_prefill_cp.p<P>`, the .cu's CP section): the walk runs a (sequence, head) pair's
blocks in order, so a few long sequences leave most SMs idle (~0.8 us a block at 1 x 2,048 tokens, any
head count). CP cuts a sequence into up to P segments on block edges, walks them all at once (each
segment's value rows from zero, plus 128 key rows from the identity with no values, which give the
segment's transition A and the output correction o~), then chains S_{p+1} = S_p A_p + B_p per sequence
and adds S_p o~ to each later segment's outputs: four launches, scratch of 96 KiB a (value head, segment
past the first), twice the walk's work on the segments past the first. How many segments each sequence
gets the first launch decides on the device from the batch's lengths (the .cu's cp_plan): none past the
first where the batch's unsplit walk already keeps the SMs busy as long as the sequence takes (equal
sequences filling the GPU), so one long sequence among short ones is cut and the short ones not, and
the later launches' grids hold only what the plan can give a batch of their shape (cp_bounds): against
the tree before, the best configuration's time -4 to -52% on equal sequences (most -40 to -52%), -4 to
-9% on skewed batches, -8 to -14% on random cuts, -1 to -4% on one long sequence and +0 to +3% on one of
1,024 tokens; still 1.2-1.5x the staged walk on equal sequences (benchmarks/results/cp-plan-ab-H200.txt,
4, 8 and 16 value heads). On the H200
(benchmarks/results/prefill-cp-H200.json, before segments were fitted to each sequence) the walk's time
over CP's best on one sequence of 2k-32k tokens: 2.0-4.7x at 4 value heads, 1.7-2.8x at 8, 1.2-1.5x at
16; slower at 32 (the doubled work fills the GPU already) and on short sequences. Against FlashInfer's
chunked prefill with its own context parallelism (prefill-cp-baselines-H200.json): ahead at 2k tokens,
behind in graphs from 8k tokens (but at 4 heads x 8k), ahead eagerly up to 8k.
`supports` offers it to the tuner where it can pay (CP_MAX_PAIRS, CP_MIN_TOKENS).

Both launch plainly: the walk as a programmatic dependent of the first launch was slower in graphs at
every shape measured (benchmarks/results/walk-pdl-ab-H200.txt).

Why a CUDA walk: the Triton walk (255 registers, layout exchanges through shared memory between its
dependent products) and this one do the same arithmetic, but here a warp owns 16 state rows outright,
so its products chain register to register. On the H200 grid (benchmarks/results/gdn-fused-grid-H200.txt)
1.03-1.36x the Triton staged walk's best configuration at every shape, most at many sequences.
"""
from __future__ import annotations

import re
from pathlib import Path

import torch

from kdispatch import definitions, nvrtc
from kdispatch.definitions.gdn.gathered import GATHERED_HEADS, all_true, gathered_prefill_name, identity_slots
from kdispatch.definitions.gdn.names import PACKED_HEADS, pool_prefill_name
from kdispatch.kernels.triton.gdn.decode_splitv import _resolve_scale
from kdispatch.kernels.triton.gdn.prefill_staged import DIM
from kdispatch.registry import variant

CU = Path(__file__).with_name("prefill_walk.cu")
# pointers, T N num_slots HV HQK has_state, strides, then the CP parameters plan aux bs as (see the .cu)
SIGNATURE = "p" * 10 + "liiiii" + "l" * 9 + "pppp"
# (warps a block, pipeline stages) compiled in the .cu: 16 V rows a warp, blocks in flight. On the H200
# grid (benchmarks/results/gdn-fused-grid-H200.txt) 32 rows won up to ~32 (sequence, head) pairs, 64
# above; 16 and 128 rows never, 64 rows at 2 stages within 1% of 4 stages everywhere (all measured there)
KERNELS = ((2, 4), (4, 4))
LAUNCH_CONFIGS = {f"r{16 * w}s{n}": dict(cfg=(w, n)) for w, n in KERNELS}

# Context parallel (`cuda_prefill_cp.p<P>`): each sequence's blocks in up to P segments walked at once, then
# a chain over the segments and a correction of their outputs (the .cu's CP section); for few (sequence,
# head) pairs, where the walk leaves most of the GPU idle. The walk under CP at CP_W warps a block (the most
# blocks); the chain and the correction at the .cu's fixed shapes.
CP_SEGMENTS = (4, 8, 16)  # 32 never won on the H200 up to 32k tokens
CP_CONFIGS = {f"p{n}": dict(segments=n) for n in CP_SEGMENTS}


def _cu_define(name: str) -> int:
    return int(re.search(rf"^#define {name} (\d+)", CU.read_text(), re.M).group(1))


# the .cu's plan constants (it says why): the fewest 16-token blocks a segment takes, the blocks of a correction
# chunk, the CP walk's warps (4 stages), the plan's header, the SMs' walk rate
CP_SEG_BLOCKS, CORRECT_BLOCKS = _cu_define("CP_SEG_BLOCKS"), _cu_define("FIX_BLOCKS")
CP_WALK = (_cu_define("CP_W"), 4)
PLAN_HEAD = _cu_define("PLAN_HEAD")
CP_RATE = float(re.search(r"^#define CP_RATE ([\d.]+)f", CU.read_text(), re.M).group(1))
CHAIN_WARPS, CORRECT_WARPS = 4, 4
CHAIN_BYTES = 2 * (128 * 136 * 2 + 16 * 136 * 4) + 16 * 136 * 2  # the .cu's chain: two stages, S rows
CORRECT_BYTES = CORRECT_BLOCKS * (16 * 136 * 2 + 16 * (16 * CORRECT_WARPS + 8) * 2)  # correct: a stage a block
# Where CP is offered to the tuner (`supports`): few (sequence, value head) pairs, long batches. On the H200
# (benchmarks/results/prefill-cp-H200.json) it won at up to 16 pairs from 1,024-2,048 tokens of equal
# sequences and lost at 32 pairs and above (its doubled work fills the GPU there); with the segments fitted
# to each sequence it is offered to batches of up to 64 pairs, where one long sequence among short ones
# keeps the walk serial (cp-segments-ab-H200.txt: 8 x 4,096 tokens, one holding 7/8 of them, 1.47x the
# walk at 8 value heads; the length mix, which `supports` does not see, decides: the tuner measures).
# Registered where one sequence is at most CP_MAX_HEADS pairs. Scratch: 96 KiB a pair and segment past the first.
CP_MAX_PAIRS, CP_MAX_HEADS, CP_MIN_TOKENS = 64, 16, 1024

_kernels: dict[tuple, nvrtc.Kernel] = {}
# the first launch's: q k g beta A_log dt_bias cu_seqlens mats fac, scale, T, N HV HQK, the q / k token and head
# strides, the gates' token strides, CP's plan P sms e_max c_max; value heads a q/k head it takes at most (the
# .cu's ALG_HEADS)
ALGEBRA_SIGNATURE = "p" * 9 + "f" + "l" + "iii" + "l" * 6 + "p" + "iiii"
ALGEBRA_HEADS = 4


def stage_bytes(warps: int) -> int:
    """Shared memory of one pipeline stage (the .cu's Stage): K and Q rows at 136, V at 16 W + 8,
    two 16 x 24 matrices (bf16), 64 fp32 factors."""
    return 2 * 16 * 136 * 2 + 16 * (16 * warps + 8) * 2 + 2 * 16 * 24 * 2 + 64 * 4


def kernel(warps: int, stages: int, pooled: bool, cp: bool = False) -> nvrtc.Kernel:
    kern = _kernels.get((warps, stages, pooled, cp))
    if kern is None:
        if (warps, stages) not in KERNELS:
            raise ValueError(f"cuda_prefill_staged: no walk kernel of {warps} warps and {stages} stages ({KERNELS})")
        kind = ("pool" if pooled else "contest") + ("_cp" if cp else "")
        kern = _load(f"gdn_prefill_walk_w{warps}_s{stages}_{kind}", stages * stage_bytes(warps))
        _kernels[(warps, stages, pooled, cp)] = kern
    return kern


def cp_kernel(part: str, pooled: bool) -> nvrtc.Kernel:
    """The CP chain ("chain") or correction ("correct") kernel."""
    kern = _kernels.get((part, pooled))
    if kern is None:
        kern = _load(f"gdn_prefill_cp_{part}_{'pool' if pooled else 'contest'}",
                     CHAIN_BYTES if part == "chain" else CORRECT_BYTES)
        _kernels[(part, pooled)] = kern
    return kern


def algebra(q, k, gates, cu_seqlens, HV: int, scale: float, *, contest: bool, plan=None):
    """The first launch in CUDA, the .cu's gdn_prefill_algebra_<pool|contest>: (matrices, factors) of every
    16-token block and value head. `gates`: (g, beta, None, None) activated, fp32, q/k normalised in the
    launch (the engines'); or the contest's (a, b, A_log, dt_bias), bf16 a and b, fp32 A_log and dt_bias [HV]
    (the dispatcher checks dtypes against the definition). `plan`: CP's (plan tensor, P, e_max, c_max), made
    by one more column of the grid (the .cu's cp_plan)."""
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
    if blocks or plan is not None:
        kind = "contest" if contest else "pool"
        kern = _kernels.get(("algebra", kind))
        if kern is None:
            kern = _kernels[("algebra", kind)] = nvrtc.load_kernel(CU, f"gdn_prefill_algebra_{kind}",
                                                                   signature=ALGEBRA_SIGNATURE)
        cp = (None, 0, 0, 0, 0) if plan is None else (plan[0], plan[1], _sms(q.device), plan[2], plan[3])
        kern.launch((blocks + (plan is not None), HQK), 32, q, k, g, beta, A_log, dt_bias, cu_seqlens, mats, factors,
                    float(scale), T, N, HV, HQK, q.stride(0), q.stride(1), k.stride(0), k.stride(1), g.stride(0),
                    beta.stride(0), *cp, stream=nvrtc.current_stream(q.get_device()))
    return mats, factors


def cp_bounds(T: int, N: int, segments: int, HV: int, sms: int) -> tuple[int, int]:
    """(e_max, c_max): the most extra segments (past each sequence's first) and correction chunks the .cu's
    cp_plan can give a valid batch of T tokens in N sequences at `segments` a sequence at most, on `sms` SMs;
    the CP grids are sized for them. A sequence of L tokens spans at most (L + 30) // 16 blocks, cut into at
    most blocks // seg segments (s segments add s - 1 <= s (P - 1) / P), seg >= CP_SEG_BLOCKS and >= the
    batch's blocks' steps over the SMs' rate (CP_RATE), so all splits together add at most CP_RATE sms /
    (HV CP_NVB) (P - 1) / P segments (one more for float rounding); a segment's chunks are its blocks over
    CORRECT_BLOCKS, rounded up. Tight: the blocks past the plan's work slow the rest (the .cu's IDLE)."""
    blocks = (T + 30 * N) // 16
    by_rate = int(CP_RATE * sms / (HV * (DIM // (16 * CP_WALK[0]))) * (segments - 1) / segments) + 1
    e_max = min(N * (segments - 1), blocks // CP_SEG_BLOCKS * (segments - 1) // segments, by_rate)
    return e_max, blocks // CORRECT_BLOCKS + e_max


_SMS: dict[int, int] = {}


def _sms(device: torch.device) -> int:
    """The device's SM count (cp_plan's throughput), read once a device."""
    i = device.index if device.index is not None else torch.cuda.current_device()
    if i not in _SMS:
        _SMS[i] = torch.cuda.get_device_properties(i).multi_processor_count
    return _SMS[i]


def _load(name: str, shmem: int) -> nvrtc.Kernel:
    kern = nvrtc.load_kernel(CU, name, signature=SIGNATURE)
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


def _walk(q, k, v, gates, state, slots, init, cu_seqlens, out, scale, *, contest, has_state, cfg,
          segments=None):
    T, HQK, HV, N = q.shape[0], q.shape[1], v.shape[1], cu_seqlens.shape[0] - 1
    if N <= 0:
        return
    q, k, v = _aligned(q), _aligned(k), _aligned(v)
    ss = state.stride()
    if ss[-1] != 1 or (ss[0] | ss[1] | ss[2]) & 1 or state.data_ptr() % 8:
        raise ValueError("cuda_prefill_staged: the state needs 8-byte aligned slots, heads and rows")
    if out.stride() != (out.shape[1] * DIM, DIM, 1) or out.data_ptr() % 16:
        raise ValueError("cuda_prefill_staged: out must be contiguous and 16-byte aligned")
    if segments and segments < 2:
        raise ValueError(f"cuda_prefill_cp: at least 2 segments a sequence, got {segments}")
    plan = None
    if segments:
        e_max, c_max = cp_bounds(T, N, segments, HV, _sms(q.device))
        plan = (torch.empty(PLAN_HEAD + 2 * N + 3 * e_max + 2 * c_max, dtype=torch.int32, device=q.device),
                segments, e_max, c_max)
    mats, factors = algebra(q, k, gates, cu_seqlens, HV, scale, contest=contest, plan=plan)
    pooled = slots is not None
    stream = nvrtc.current_stream(q.get_device())
    common = (q, k, v, mats, factors, state, slots, init, cu_seqlens, out, T, N, state.shape[0], HV, HQK,
              int(has_state), q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
              ss[0], ss[1], ss[2])
    if not segments:
        warps, stages = cfg or config(N, HV)
        kernel(warps, stages, pooled).launch(N * HV * (DIM // (16 * warps)), 32 * warps, *common, None, None, None,
                                             None, shmem=stages * stage_bytes(warps), stream=stream)
        return
    warps, stages = CP_WALK
    nvb = DIM // (16 * warps)
    cp = (*common, plan[0], torch.empty_like(out),  # o~: the key rows' outputs
          torch.empty(e_max, HV, DIM, DIM, dtype=torch.float32, device=q.device),  # B, then S_p
          torch.empty(e_max, HV, DIM, DIM, dtype=torch.bfloat16, device=q.device))  # A
    kernel(warps, stages, pooled, cp=True).launch((N + 2 * e_max) * HV * nvb, 32 * warps, *cp,
                                                  shmem=stages * stage_bytes(warps), stream=stream)
    if e_max:  # else no sequence is split: nothing to chain or correct
        cp_kernel("chain", pooled).launch(e_max * HV * (DIM // 16), 32 * CHAIN_WARPS, *cp, shmem=CHAIN_BYTES,
                                          stream=stream)
        cp_kernel("correct", pooled).launch(c_max * HV * (DIM // (16 * CORRECT_WARPS)), 32 * CORRECT_WARPS, *cp,
                                            shmem=CORRECT_BYTES, stream=stream)


def gdn_prefill_pool_walk(q, k, v, g, beta, state_pool, state_indices, has_initial_state, cu_seqlens, out,
                          scale, cfg: tuple[int, int] | None = None, segments: int | None = None):
    """The engines' prefill (gdn_prefill_pool_*). Returns (out, state_pool)."""
    if has_initial_state.dtype != torch.bool or state_indices.dtype != torch.int32 or cu_seqlens.dtype != torch.int32:
        raise ValueError("cuda_prefill_staged: int32 state_indices and cu_seqlens, bool has_initial_state")
    _walk(q, k, v, (g, beta, None, None), state_pool, state_indices, has_initial_state, cu_seqlens, out,
          _resolve_scale(scale, DIM), contest=False, has_state=True, cfg=cfg, segments=segments)
    return out, state_pool


def gdn_prefill_walk(q, k, v, state, A_log, a, dt_bias, b, cu_seqlens, scale, cfg: tuple[int, int] | None = None,
                     segments: int | None = None):
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
          _resolve_scale(scale, DIM), contest=True, has_state=given, cfg=cfg, segments=segments)
    return out, state


def gdn_prefill_gathered_walk(q, k, v, g, beta, initial_state, cu_seqlens, out, scale, cfg=None, segments=None):
    """vLLM's gathered states as a pool of one slot per sequence (prefill_gathered.py)."""
    n = initial_state.shape[0]
    return gdn_prefill_pool_walk(q, k, v, g, beta, initial_state, identity_slots(n, q.device),
                                 all_true(n, q.device), cu_seqlens, out, scale, cfg=cfg, segments=segments)


def _cp_offered(value_heads: int):
    """CP for few (sequence, value head) pairs and long batches (CP_MAX_PAIRS, CP_MIN_TOKENS)."""
    def offered(features: dict, kwargs: dict) -> str | None:
        pairs = features["num_seqs"] * value_heads
        if pairs > CP_MAX_PAIRS:
            return f"{pairs} (sequence, value head) pairs: more than {CP_MAX_PAIRS} fill the GPU without CP"
        if features["total_seq_len"] < CP_MIN_TOKENS:
            return f"fewer than {CP_MIN_TOKENS} tokens"
        return None
    return offered


_REQUIRES = ("triton", "cuda.core")
variant("gdn_prefill", "cuda_prefill_staged", backend="cuda", archs=("sm90",), requires=_REQUIRES,
        configs=LAUNCH_CONFIGS)(gdn_prefill_walk)
_CONTEST_V_HEADS = definitions.get("gdn_prefill").const_axes["num_v_heads"]
variant("gdn_prefill", "cuda_prefill_cp", backend="cuda", archs=("sm90",), requires=_REQUIRES,
        configs=CP_CONFIGS, supports=_cp_offered(_CONTEST_V_HEADS))(gdn_prefill_walk)
_ENGINE_PREFILLS = ([(pool_prefill_name(hq, hv), hv, gdn_prefill_pool_walk) for hq, hv in PACKED_HEADS.values()]
                    + [(gathered_prefill_name(hq, hv), hv, gdn_prefill_gathered_walk)
                       for hq, hv in GATHERED_HEADS.values()])
for _definition, _hv, _fn in _ENGINE_PREFILLS:
    variant(_definition, "cuda_prefill_staged", backend="cuda", archs=("sm90",), requires=_REQUIRES,
            configs=LAUNCH_CONFIGS, strided=True)(_fn)
    if _hv <= CP_MAX_HEADS:  # CP where one sequence is few enough pairs (not at 32 value heads)
        variant(_definition, "cuda_prefill_cp", backend="cuda", archs=("sm90",), requires=_REQUIRES,
                configs=CP_CONFIGS, supports=_cp_offered(_hv), strided=True)(_fn)
