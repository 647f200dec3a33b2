"""`cuda_prefill_staged`'s first launch in CUDA (kernels/cuda/gdn/prefill_walk.py `algebra`) against the Triton
one it replaced (kernels/triton/gdn/prefill_staged.py `chunk_algebra`), and optionally against an earlier CUDA
first launch of the engines' conventions (`--previous FILE`: a prefill_walk.cu of an earlier commit, its
`gdn_prefill_algebra_pool` of q k g beta cu_seqlens mats fac ...), side by side in one process: per shape
the launches' outputs compared with the CUDA one's (matrices max |diff|, factors' largest relative difference
on the batch's rows), the variant through the tuner's gate with each (two fresh input sets), and CUDA-graph
time (input sets rotated past the L2; medians of 4 alternating rounds) of the variant with each and of each
launch alone. Pool, gathered and the contest's prefill (raw gates) alike.

    python benchmarks/algebra_cuda_ab.py [--previous old.cu] gdn_prefill_pool_qk16_v32:total_seq_len=512,num_seqs=4,num_slots=5 [...]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from kdispatch import definitions, nvrtc, registry  # noqa: E402
from kdispatch.kernels.cuda.gdn import prefill_walk as W  # noqa: E402
from kdispatch.kernels.triton.gdn.prefill_staged import chunk_algebra  # noqa: E402
from kdispatch.tuner import gate, timing  # noqa: E402
from kdispatch.workloads import SimpleWorkload, materialize  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--previous", type=Path, help="an earlier prefill_walk.cu whose pool first launch joins the A/B")
parser.add_argument("shapes", nargs="+", help="definition:axis=value,... ")
opts = parser.parse_args()

CUDA_ALGEBRA = W.algebra


def triton_algebra(q, k, gates, cu_seqlens, HV, scale, *, contest):
    return chunk_algebra(q, k, gates, cu_seqlens, HV, scale, raw_gates=contest, norm=not contest)


def previous_algebra(q, k, gates, cu_seqlens, HV, scale, *, contest):
    """The earlier .cu's first launch (engines' conventions only), as that commit's prefill_walk.py called it."""
    if contest:
        raise ValueError("the previous first launch took the engines' conventions only")
    g, beta = gates[0].contiguous(), gates[1].contiguous()
    blocks = -(-q.shape[0] // 16)
    mats = torch.empty(max(blocks, 1) * HV * 512, device=q.device, dtype=torch.bfloat16)
    factors = torch.empty(max(blocks, 1) * HV * 64, dtype=torch.float32, device=q.device)
    PREVIOUS.launch((blocks, q.shape[1]), 32, q, k, g, beta, cu_seqlens, mats, factors, float(scale), q.shape[0],
                    cu_seqlens.shape[0] - 1, HV, q.shape[1], q.stride(0), q.stride(1), k.stride(0), k.stride(1),
                    g.stride(0), beta.stride(0), stream=nvrtc.current_stream(q.get_device()))
    return mats, factors


FIRST = {"triton": triton_algebra, "cuda": CUDA_ALGEBRA}
if opts.previous:
    PREVIOUS = nvrtc.load_kernel(opts.previous, "gdn_prefill_algebra_pool",
                                 signature="p" * 7 + "f" + "l" + "iii" + "l" * 6)
    FIRST["previous"] = previous_algebra


def with_kind(fn, kind):
    """The variant with its first launch of `kind`."""
    def call(*args):
        W.algebra = FIRST[kind]
        try:
            return fn(*args)
        finally:
            W.algebra = CUDA_ALGEBRA
    return call


def first(definition, kind):
    """The first launch of `kind` alone, on the variant's inputs."""
    names = definitions.get(definition).inputs
    contest = "A_log" in names

    def call(*args):
        a = dict(zip(names, args))
        gates = (a["a"], a["b"], a["A_log"], a["dt_bias"]) if contest else (a["g"], a["beta"], None, None)
        cu = a["cu_seqlens"]
        return FIRST[kind](a["q"], a["k"], gates, cu, a["v"].shape[1], 0.088, contest=contest)
    return call


registry.discover()
l2 = torch.cuda.get_device_properties(0).L2_cache_size
print(f"# algebra_cuda_ab on {torch.cuda.get_device_name()}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: "
      f"cuda_prefill_staged.r64s4 graph us with each first launch (the launch alone)")
rows = []
for text in opts.shapes:
    name, _, ax = text.partition(":")
    definition = definitions.resolve_name(name)
    axes = {k: int(v) for k, v in (kv.split("=") for kv in ax.split(","))}
    fn = registry.get(definition, "cuda_prefill_staged.r64s4").fn
    contest = "A_log" in definitions.get(definition).inputs
    kinds = [k for k in FIRST if not (contest and k == "previous")]
    args = list(materialize(definition, SimpleWorkload(axes, uuid="ac-ab"), device="cuda", seed=0))
    T, hv = args[0].shape[0], args[2].shape[1]
    valid = (torch.arange(-(-T // 16) * 16, device="cuda") < T).view(-1, 1, 1, 16)
    m_c, f_c = first(definition, "cuda")(*args)
    fc = f_c.view(-1, hv, 4, 16)
    diffs = []
    for kind in kinds:
        if kind == "cuda":
            continue
        m_o, f_o = first(definition, kind)(*args)
        fo = f_o.view(-1, hv, 4, 16)
        diffs.append(f"{kind}: mats max|diff| {(m_o.float() - m_c.float()).abs().max().item():.3g}, factors max rel "
                     f"{((fo - fc).abs() / (fo.abs() + 1e-3) * valid).max().item():.3g}")
    trials = []
    for seed in (1, 2):
        a = list(materialize(definition, SimpleWorkload(axes, uuid=f"ac-ab#{seed}"), device="cuda", seed=seed))
        trials.append((a, gate.reference(definition, a)))
    verdicts = {}
    for kind in kinds:
        v = gate.run_gate(definition, with_kind(fn, kind), trials)
        verdicts[kind] = f"{v.status} abs {v.max_abs_err or 0:.2g}" + ("" if v.passed else f" {v.reason}")
    sets = timing.input_sets(definition, args, l2, max_sets=16)
    fns = {("total", k): with_kind(fn, k) for k in kinds} | {("first", k): first(definition, k) for k in kinds}
    times = {k: [] for k in fns}
    keys = list(fns)
    for r in range(4):
        for key in (keys if r % 2 == 0 else keys[::-1]):
            times[key].append(statistics.median(timing.graph_times_us(fns[key], sets, 5)[0]))
    m = {k: statistics.median(v) for k, v in times.items()}
    cuda = m[("total", "cuda")]
    timed = ", ".join(f"{k} {m[('total', k)]:.1f} ({m[('first', k)]:.1f})" for k in kinds)
    ratios = ", ".join(f"cuda/{k} {cuda / m[('total', k)]:.3f}x" for k in kinds if k != "cuda")
    row = (f"{definitions.get(definition).short} {axes}: {timed}; {ratios}; against cuda's outputs: "
           f"{'; '.join(diffs)}; gate {verdicts}")
    print(row, flush=True)
    rows.append(row)
print("\n# summary\n" + "\n".join(rows))
