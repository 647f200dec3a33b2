"""GDN prefill, context parallel (`cuda_prefill_cp.p<P>`): prefill_walk.py's staged walk over segments of each
sequence at once. The walk runs a (sequence, head) pair's blocks in order, so a few long sequences leave
most SMs idle (~0.8 us a block at 1 x 2,048 tokens, any head count). CP cuts a sequence into up to P
segments on block edges, walks them all at once (each segment's value rows from zero, plus 128 key rows
from the identity with no values, which give the segment's transition A and the output correction o~),
then chains S_{p+1} = S_p A_p + B_p per sequence and adds S_p o~ to each later segment's outputs: four
launches, scratch of 96 KiB a (value head, segment past the first), twice the walk's work on the segments
past the first. How many segments each sequence gets the first launch decides on the device from the
batch's lengths (prefill_cp.cu's cp_plan): none past the first where the batch's unsplit walk already
keeps the SMs busy as long as the sequence takes (equal sequences filling the GPU), so one long sequence
among short ones is cut and the short ones not, and the later launches' grids hold only what the plan can
give a batch of their shape (`cp_bounds`): against the version before, the best configuration's time -4
to -52% on equal sequences (most -40 to -52%), -4 to -9% on skewed batches, -8 to -14% on random cuts, -1
to -4% on one long sequence and +0 to +3% on one of 1,024 tokens; still 1.2-1.5x the staged walk on equal
sequences (benchmarks/results/cp-plan-ab-H200.txt, 4, 8 and 16 value heads). On the H200
(benchmarks/results/prefill-cp-H200.json, before the segments were fitted to the batch) the walk's time
over CP's best on one sequence of 2k-32k tokens: 2.0-4.7x at 4 value heads, 1.7-2.8x at 8, 1.2-1.5x at
16; slower at 32 (the doubled work fills the GPU already) and on short sequences. Against FlashInfer's
chunked prefill with its own context parallelism (prefill-cp-baselines-H200.json): ahead at 2k tokens,
behind in graphs from 8k tokens (but at 4 heads x 8k), ahead eagerly up to 8k.
`supports` offers it to the tuner from CP_MIN_TOKENS tokens.

prefill_cp.cu is compiled as prefill_walk.cu's text followed by its own: the walk is prefill_walk.cu's
(its Plan here PlannedSegments), and what only CP runs lives here and there, so a change to CP leaves the
staged walk's kernels and provenance as they were (its rows in the tuning stores stay current).
"""
from __future__ import annotations

import functools
import re
from pathlib import Path

import torch

from kdispatch import definitions, nvrtc
from kdispatch.definitions.gdn.gathered import GATHERED_HEADS, gathered_prefill_name
from kdispatch.definitions.gdn.names import PACKED_HEADS, pool_prefill_name
from kdispatch.kernels.cuda.gdn import prefill_walk as walk
from kdispatch.kernels.triton.gdn.prefill_staged import DIM
from kdispatch.registry import variant

CP_CU = Path(__file__).with_name("prefill_cp.cu")


def _cu_define(name: str, number: str = r"\d+") -> str:
    return re.search(rf"^#define {name} ({number})", CP_CU.read_text(), re.M).group(1)


# prefill_cp.cu's plan constants (it says why): the fewest 16-token blocks a segment takes, the blocks of a
# correction chunk, the CP walk's warps (4 stages), the plan's header, the SMs' walk rate
CP_SEG_BLOCKS, CORRECT_BLOCKS = int(_cu_define("CP_SEG_BLOCKS")), int(_cu_define("FIX_BLOCKS"))
CP_WALK = (int(_cu_define("CP_W")), 4)
PLAN_HEAD = int(_cu_define("PLAN_HEAD"))
CP_RATE = float(_cu_define("CP_RATE", r"[\d.]+"))
CHAIN_WARPS, CORRECT_WARPS = 4, 4
CHAIN_BYTES = 2 * (128 * 136 * 2 + 16 * 136 * 4) + 16 * 136 * 2  # the .cu's chain: two stages, S rows
CORRECT_BYTES = CORRECT_BLOCKS * (16 * 136 * 2 + 16 * (16 * CORRECT_WARPS + 8) * 2)  # correct: a stage a block
# the first launch with the plan's five arguments (plan P sms e_max c_max) after prefill_walk.py's
ALGEBRA_SIGNATURE = walk.ALGEBRA_SIGNATURE + "p" + "iiii"

# Configurations: at most P segments a sequence. 32 never won on the H200 up to 32k tokens. The plan gives no
# sequence more than CP_RATE SMS / (HV CP_NVB) segments (cp_bounds), so where that is at most P the larger
# configurations walk alike: each definition registers CP_SEGMENTS up to the first that reaches it, on the
# most SMs an sm90 part has (H100 and H200 SXM; fewer SMs make more of them alike).
CP_SEGMENTS = (4, 8, 16)
SM90_SMS = 132
# Where CP is offered to the tuner (`supports`): batches of CP_MIN_TOKENS tokens or more, any number of sequences.
# Where the plan splits nothing (equal lengths filling the GPU) it is the walk with the idle CP launches, 1.09-1.51x
# the staged walk's best; on one long sequence among short ones 0.34-0.60x at 4-8 value heads and 0.66-1.02x at 16,
# up to 128 sequences (benchmarks/results/cp-wide-H200.txt); the length mix, which shapes do not show, decides
# between them, so the tuner measures every length mix and the router keeps CP where it wins on all of them.
# Registered where one sequence is at most CP_MAX_HEADS pairs. Scratch: 96 KiB a pair and segment past the first.
CP_MAX_HEADS, CP_MIN_TOKENS = 16, 1024

_kernels: dict[tuple, nvrtc.Kernel] = {}


def configs(value_heads: int) -> dict[str, dict]:
    """The CP configurations registered at this head count: those the plan can tell apart (CP_SEGMENTS)."""
    most = int(CP_RATE * SM90_SMS / (value_heads * (DIM // (16 * CP_WALK[0]))))
    out = {}
    for n in CP_SEGMENTS:
        out[f"p{n}"] = dict(segments=n)
        if n >= most:
            break
    return out


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


def source() -> str:
    """The CP program: prefill_walk.cu's text, then prefill_cp.cu's (read at each first load, as a path is)."""
    return walk.CU.read_text() + "\n" + CP_CU.read_text()


def _kernel(part: str, pooled: bool) -> nvrtc.Kernel:
    """The CP walk ("walk"), chain, correction or first launch ("algebra") of a convention."""
    kind = "pool" if pooled else "contest"
    kern = _kernels.get((part, pooled))
    if kern is None:
        if part == "algebra":
            kern = nvrtc.load_kernel(source(), f"gdn_prefill_algebra_cp_{kind}", signature=ALGEBRA_SIGNATURE)
        elif part == "walk":
            warps, stages = CP_WALK
            kern = walk._load(source(), f"gdn_prefill_walk_w{warps}_s{stages}_{kind}_cp",
                              stages * walk.stage_bytes(warps))
        else:
            kern = walk._load(source(), f"gdn_prefill_cp_{part}_{kind}", CHAIN_BYTES if part == "chain" else CORRECT_BYTES)
        _kernels[(part, pooled)] = kern
    return kern


def _cp_walk(q, k, v, gates, state, slots, init, cu_seqlens, out, scale, *, contest, has_state, cfg=None,
             segments):
    """prefill_walk.py's `_walk` call, walked in segments (at most `segments` a sequence)."""
    if segments < 2:
        raise ValueError(f"cuda_prefill_cp: at least 2 segments a sequence, got {segments}")
    T, HV, N = q.shape[0], v.shape[1], cu_seqlens.shape[0] - 1
    if N <= 0:
        return
    q, k, v = walk.inputs(q, k, v, state, out)
    pooled, sms = slots is not None, _sms(q.device)
    e_max, c_max = cp_bounds(T, N, segments, HV, sms)
    plan = torch.empty(PLAN_HEAD + 2 * N + 3 * e_max + 2 * c_max, dtype=torch.int32, device=q.device)
    mats, factors = walk.algebra(q, k, gates, cu_seqlens, HV, scale, contest=contest,
                                 kern=_kernel("algebra", pooled),
                                 extra=(plan, segments, sms, e_max, c_max))
    stream = nvrtc.current_stream(q.get_device())
    cp = (*walk.walk_args(q, k, v, mats, factors, state, slots, init, cu_seqlens, out, has_state=has_state), plan,
          torch.empty_like(out),  # o~: the key rows' outputs
          torch.empty(e_max, HV, DIM, DIM, dtype=torch.float32, device=q.device),  # B, then S_p
          torch.empty(e_max, HV, DIM, DIM, dtype=torch.bfloat16, device=q.device))  # A
    warps, stages = CP_WALK
    _kernel("walk", pooled).launch((N + 2 * e_max) * HV * (DIM // (16 * warps)), 32 * warps, *cp,
                                   shmem=stages * walk.stage_bytes(warps), stream=stream)
    if e_max:  # else no sequence is split: nothing to chain or correct
        _kernel("chain", pooled).launch(e_max * HV * (DIM // 16), 32 * CHAIN_WARPS, *cp, shmem=CHAIN_BYTES,
                                        stream=stream)
        _kernel("correct", pooled).launch(c_max * HV * (DIM // (16 * CORRECT_WARPS)), 32 * CORRECT_WARPS, *cp,
                                          shmem=CORRECT_BYTES, stream=stream)


def gdn_prefill_cp(q, k, v, state, A_log, a, dt_bias, b, cu_seqlens, scale, segments: int):
    """The contest's prefill in segments (prefill_walk.py's gdn_prefill_walk)."""
    return walk.gdn_prefill_walk(q, k, v, state, A_log, a, dt_bias, b, cu_seqlens, scale,
                                 run=functools.partial(_cp_walk, segments=segments))


def gdn_prefill_pool_cp(q, k, v, g, beta, state_pool, state_indices, has_initial_state, cu_seqlens, out, scale,
                        segments: int):
    """The engines' prefill in segments (prefill_walk.py's gdn_prefill_pool_walk)."""
    return walk.gdn_prefill_pool_walk(q, k, v, g, beta, state_pool, state_indices, has_initial_state, cu_seqlens,
                                      out, scale, run=functools.partial(_cp_walk, segments=segments))


def gdn_prefill_gathered_cp(q, k, v, g, beta, initial_state, cu_seqlens, out, scale, segments: int):
    """vLLM's gathered prefill in segments (prefill_walk.py's gdn_prefill_gathered_walk)."""
    return walk.gdn_prefill_gathered_walk(q, k, v, g, beta, initial_state, cu_seqlens, out, scale,
                                          run=functools.partial(_cp_walk, segments=segments))


def _cp_offered(features: dict, kwargs: dict) -> str | None:
    """CP for batches long enough to split (CP_MIN_TOKENS)."""
    if features["total_seq_len"] < CP_MIN_TOKENS:
        return f"fewer than {CP_MIN_TOKENS} tokens"
    return None


_CONTEST_V_HEADS = definitions.get("gdn_prefill").const_axes["num_v_heads"]
variant("gdn_prefill", "cuda_prefill_cp", backend="cuda", archs=("sm90",), requires=walk.REQUIRES,
        configs=configs(_CONTEST_V_HEADS), supports=_cp_offered)(gdn_prefill_cp)
for _definition, _hv, _fn in ([(pool_prefill_name(hq, hv), hv, gdn_prefill_pool_cp) for hq, hv in PACKED_HEADS.values()]
                              + [(gathered_prefill_name(hq, hv), hv, gdn_prefill_gathered_cp)
                                 for hq, hv in GATHERED_HEADS.values()]):
    if _hv <= CP_MAX_HEADS:  # where one sequence is few enough pairs (not at 32 value heads)
        variant(_definition, "cuda_prefill_cp", backend="cuda", archs=("sm90",), requires=walk.REQUIRES,
                configs=configs(_hv), supports=_cp_offered, strided=True)(_fn)
