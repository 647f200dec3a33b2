"""The staged prefill's walk (kernels/cuda/gdn/prefill_walk.cu) on 16- and 32-token blocks, side by side:
`cuda_prefill_staged`'s registered configurations (`r<rows>s<stages>` on 16-token blocks,
`r<rows>s<stages>t32` on 32), each with its first launch at the block size, optionally with that first
launch at another warp count (`CONFIG/a<warps>`). Per shape: each configuration through the tuner's
correctness gate (the definition's reference, fresh inputs), its registers and resident blocks an SM,
then CUDA-graph time (input sets rotated past the L2, as the tuner times) in alternating rounds (the
order rotated each round; medians over rounds) and each one's time over the first configuration's.

Why: the walk runs a (sequence, head)'s blocks in order, and its time a block is the dependent chain of
its products (benchmarks/results/walk-ab-H200.txt); a 32-token block halves the chains a sequence at
about the same depth each.

    python benchmarks/walk_tokens_ab.py --configs r64s4 r64s3t32 r64s3t32/a2 \\
        --shape gdn_prefill_pool_qk16_v32:total_seq_len=512,num_seqs=4,num_slots=5 [--rounds 3]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from kdispatch import definitions, registry  # noqa: E402
from kdispatch.kernels.cuda.gdn import prefill_walk  # noqa: E402
from kdispatch.tuner import gate, timing  # noqa: E402
from kdispatch.workloads import SimpleWorkload, materialize  # noqa: E402

CONTEST = "gdn_prefill_qk4_v8_d128_k_last"


def parse_shape(text: str) -> tuple[str, dict[str, int]]:
    name, _, axes = text.partition(":")
    return definitions.resolve_name(name), {k: int(v) for k, v in (kv.split("=") for kv in axes.split(","))}


def runner(definition: str, label: str):
    """The variant of `label` ("r64s3t32" or "r64s3t32/a2": its first launch at 2 warps)."""
    config, _, algebra = label.partition("/")
    fn = registry.get(definition, f"cuda_prefill_staged.{config}").fn
    if not algebra:
        return fn
    tokens, warps = prefill_walk.LAUNCH_CONFIGS[config]["cfg"][2], int(algebra.removeprefix("a"))

    def call(*args):
        saved = prefill_walk.ALGEBRA_WARPS[tokens]
        prefill_walk.ALGEBRA_WARPS[tokens] = warps
        try:
            return fn(*args)
        finally:
            prefill_walk.ALGEBRA_WARPS[tokens] = saved
    return call


def first_launch(definition: str, label: str):
    """`label`'s first launch alone (chunk_algebra at its block size and warps), on the variant's inputs."""
    config, _, algebra = label.partition("/")
    tokens = prefill_walk.LAUNCH_CONFIGS[config]["cfg"][2]
    warps = int(algebra.removeprefix("a")) if algebra else prefill_walk.ALGEBRA_WARPS[tokens]
    pooled = definition != CONTEST

    def call(q, k, v, *rest):
        gates = (rest[0], rest[1], None, None) if pooled else (rest[2], rest[4], rest[1], rest[3])
        return prefill_walk.chunk_algebra(q, k, gates, rest[5], v.shape[1], 0.088, raw_gates=not pooled, norm=pooled,
                                          chunk=tokens, warps=warps)
    return call


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--configs", nargs="+", required=True, help=f"of {sorted(prefill_walk.LAUNCH_CONFIGS)}")
    ap.add_argument("--shape", type=parse_shape, action="append", required=True, help="definition:axis=v,axis=v")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--parts", action="store_true", help="also each configuration's first launch alone")
    opts = ap.parse_args()
    registry.discover()
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    print(f"# benchmarks/walk_tokens_ab.py on {torch.cuda.get_device_name()}, "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, torch {torch.__version__}: graph us per call, "
          f"medians of {opts.rounds} rounds; x = time over {opts.configs[0]}")
    for config in dict.fromkeys(c.partition("/")[0] for c in opts.configs):
        w, n, t = prefill_walk.LAUNCH_CONFIGS[config]["cfg"]
        kern = prefill_walk.kernel(w, n, True, tokens=t)
        blocks = kern.core.occupancy.max_active_blocks_per_multiprocessor(32 * w, n * prefill_walk.stage_bytes(w, t))
        print(f"# {config}: {kern.resources()}, {blocks} blocks an SM")
    table = []
    for definition, axes in opts.shape:
        short = definitions.get(definition).short
        fns = {label: runner(definition, label) for label in opts.configs}
        verdicts = {}
        for label, fn in fns.items():
            trials = []
            for seed in (1, 2):
                args = list(materialize(definition, SimpleWorkload(axes, uuid=f"tokens-ab#{seed}"), device="cuda",
                                        seed=seed))
                trials.append((args, gate.reference(definition, args)))
            v = gate.run_gate(definition, fn, trials)
            verdicts[label] = f"{v.status} abs {v.max_abs_err or 0:.2g}" + ("" if v.passed else f" {v.reason}")
        args = list(materialize(definition, SimpleWorkload(axes, uuid="tokens-ab"), device="cuda", seed=0))
        sets = timing.input_sets(definition, args, l2, max_sets=16)
        times = {label: [] for label in fns}
        labels = list(fns)
        for r in range(opts.rounds):
            for label in labels[r % len(labels):] + labels[:r % len(labels)]:
                times[label].append(statistics.median(timing.graph_times_us(fns[label], sets, 5)[0]))
        med = {label: statistics.median(ts) for label, ts in times.items()}
        base = med[labels[0]]
        first = {label: statistics.median(timing.graph_times_us(first_launch(definition, label), sets, 5)[0])
                 for label in labels} if opts.parts else {}
        row = f"{short} {axes}: " + "  ".join(
            f"{label} {med[label]:.1f}" + (f" (first launch {first[label]:.1f})" if first else "")
            + f" ({med[label] / base:.2f}x, {verdicts[label]})" for label in labels)
        print(row, flush=True)
        table.append(row)
    print("\n".join(["", "# summary"] + table))


if __name__ == "__main__":
    main()
