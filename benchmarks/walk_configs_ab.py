"""`cuda_prefill_staged`'s registered configurations (kernels/cuda/gdn/prefill_walk.py) side by side, in
one process: per shape, each configuration through the tuner's correctness gate (the definition's
reference, two fresh input sets), then CUDA-graph time (input sets rotated past the L2, as the tuner
times) in rounds with the order rotated each round (medians over rounds), each one's time over the first
configuration's; first each walk build's registers and resident blocks an SM. For a configuration
measured beside the ones it may join, before a re-tune.

    python benchmarks/walk_configs_ab.py --configs r64s4 r32s4k2 \
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


def parse_shape(text: str) -> tuple[str, dict[str, int]]:
    name, _, axes = text.partition(":")
    return definitions.resolve_name(name), {k: int(v) for k, v in (kv.split("=") for kv in axes.split(","))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--configs", nargs="+", required=True, help=f"of {sorted(prefill_walk.LAUNCH_CONFIGS)}")
    ap.add_argument("--shape", type=parse_shape, action="append", required=True, help="definition:axis=v,axis=v")
    ap.add_argument("--rounds", type=int, default=3)
    opts = ap.parse_args()
    registry.discover()
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    print(f"# benchmarks/walk_configs_ab.py on {torch.cuda.get_device_name()}, "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, torch {torch.__version__}: graph us per call, "
          f"medians of {opts.rounds} rounds; x = time over {opts.configs[0]}")
    for config in opts.configs:
        w, n = prefill_walk.LAUNCH_CONFIGS[config]["cfg"]
        kern = prefill_walk.kernel(w, n, True)
        blocks = kern.core.occupancy.max_active_blocks_per_multiprocessor(32 * w, n * prefill_walk.stage_bytes(w))
        print(f"# {config}: {kern.resources()}, {blocks} blocks an SM")
    table = []
    for definition, axes in opts.shape:
        short = definitions.get(definition).short
        fns = {label: registry.get(definition, f"cuda_prefill_staged.{label}").fn for label in opts.configs}
        trials = []
        for seed in (1, 2):
            args = list(materialize(definition, SimpleWorkload(axes, uuid=f"walk-ab#{seed}"), device="cuda", seed=seed))
            trials.append((args, gate.reference(definition, args)))
        verdicts = {}
        for label, fn in fns.items():
            v = gate.run_gate(definition, fn, trials)
            verdicts[label] = f"{v.status} abs {v.max_abs_err or 0:.2g}" + ("" if v.passed else f" {v.reason}")
        args = list(materialize(definition, SimpleWorkload(axes, uuid="walk-ab"), device="cuda", seed=0))
        sets = timing.input_sets(definition, args, l2, max_sets=16)
        times = {label: [] for label in fns}
        labels = list(fns)
        for r in range(opts.rounds):
            for label in labels[r % len(labels):] + labels[:r % len(labels)]:
                times[label].append(statistics.median(timing.graph_times_us(fns[label], sets, 5)[0]))
        med = {label: statistics.median(ts) for label, ts in times.items()}
        base = med[labels[0]]
        row = f"{short} {axes}: " + "  ".join(
            f"{label} {med[label]:.1f} ({med[label] / base:.2f}x, {verdicts[label]})" for label in labels)
        print(row, flush=True)
        table.append(row)
    print("\n".join(["", "# summary"] + table))


if __name__ == "__main__":
    main()
