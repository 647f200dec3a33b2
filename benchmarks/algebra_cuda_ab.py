"""`cuda_prefill_staged`'s first launch of the engines' conventions in CUDA (kernels/cuda/gdn/prefill_walk.py
`algebra`) against the Triton one it replaced (kernels/triton/gdn/prefill_staged.py `chunk_algebra`, which
the contest's raw gates still take), side by side in one process: per shape the two launches' outputs
compared (matrices max |diff|, factors' largest relative difference on the batch's rows), the variant
through the tuner's gate with each (two fresh input sets), and CUDA-graph time (input sets rotated past
the L2; medians of 4 alternating rounds) of the variant with each and of each launch alone.

    python benchmarks/algebra_cuda_ab.py gdn_prefill_pool_qk16_v32:total_seq_len=512,num_seqs=4,num_slots=5 [...]
"""
from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from kdispatch import definitions, registry  # noqa: E402
from kdispatch.kernels.cuda.gdn import prefill_walk as W  # noqa: E402
from kdispatch.tuner import gate, timing  # noqa: E402
from kdispatch.workloads import SimpleWorkload, materialize  # noqa: E402

KINDS = ("triton", "cuda")


CUDA_ALGEBRA = W.algebra


def triton_algebra(q, k, g, beta, cu_seqlens, HV, scale):
    return W.chunk_algebra(q, k, (g, beta, None, None), cu_seqlens, HV, scale, raw_gates=False, norm=True)


FIRST = {"triton": triton_algebra, "cuda": CUDA_ALGEBRA}


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

    def call(*args):
        a = dict(zip(names, args))
        return FIRST[kind](a["q"], a["k"], a["g"], a["beta"], a["cu_seqlens"], a["v"].shape[1], 0.088)
    return call


registry.discover()
l2 = torch.cuda.get_device_properties(0).L2_cache_size
print(f"# algebra_cuda_ab on {torch.cuda.get_device_name()}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: "
      f"cuda_prefill_staged.r64s4 graph us, first launch Triton -> CUDA (the launch alone)")
rows = []
for text in sys.argv[1:]:
    name, _, ax = text.partition(":")
    definition = definitions.resolve_name(name)
    axes = {k: int(v) for k, v in (kv.split("=") for kv in ax.split(","))}
    fn = registry.get(definition, "cuda_prefill_staged.r64s4").fn
    args = list(materialize(definition, SimpleWorkload(axes, uuid="ac-ab"), device="cuda", seed=0))
    m_t, f_t = first(definition, "triton")(*args)
    m_c, f_c = first(definition, "cuda")(*args)
    mdiff = (m_t.float() - m_c.float()).abs().max().item()
    T = args[0].shape[0]
    hv = args[2].shape[1]
    valid = (torch.arange(f_t.numel() // (hv * 64) * 16, device="cuda") < T).view(-1, 1, 1, 16)
    ft, fc = f_t.view(-1, hv, 4, 16), f_c.view(-1, hv, 4, 16)
    fdiff = ((ft - fc).abs() / (ft.abs() + 1e-3) * valid).max().item()
    trials = []
    for seed in (1, 2):
        a = list(materialize(definition, SimpleWorkload(axes, uuid=f"ac-ab#{seed}"), device="cuda", seed=seed))
        trials.append((a, gate.reference(definition, a)))
    verdicts = {}
    for kind in KINDS:
        v = gate.run_gate(definition, with_kind(fn, kind), trials)
        verdicts[kind] = f"{v.status} abs {v.max_abs_err or 0:.2g}" + ("" if v.passed else f" {v.reason}")
    sets = timing.input_sets(definition, args, l2, max_sets=16)
    fns = {("total", k): with_kind(fn, k) for k in KINDS} | {("first", k): first(definition, k) for k in KINDS}
    times = {k: [] for k in fns}
    keys = list(fns)
    for r in range(4):
        for key in (keys if r % 2 == 0 else keys[::-1]):
            times[key].append(statistics.median(timing.graph_times_us(fns[key], sets, 5)[0]))
    m = {k: statistics.median(v) for k, v in times.items()}
    row = (f"{definitions.get(definition).short} {axes}: total {m[('total', 'triton')]:.1f} -> {m[('total', 'cuda')]:.1f} "
           f"({m[('total', 'cuda')] / m[('total', 'triton')]:.3f}x), first {m[('first', 'triton')]:.1f} -> "
           f"{m[('first', 'cuda')]:.1f}; mats max|diff| {mdiff:.3g}, factors max rel {fdiff:.3g}; gate {verdicts}")
    print(row, flush=True)
    rows.append(row)
print("\n# summary\n" + "\n".join(rows))
