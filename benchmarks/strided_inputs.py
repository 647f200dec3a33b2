"""Routed ops on the strided views engines pass, next to the same values contiguous.

SGLang and vLLM split q, k, v out of one packed projection row (mixed_qkv), a and b out of another,
and DeepSeek's q_nope and q_pe out of one [T, 16, 576] query; the ops take those views as they are
(kdispatch/spec.py `strided`). Per op and shape, `kdispatch.ops.<op>` is timed on contiguous inputs
and on the same values as views into packed rows: CUDA-graph replay and synchronised eager calls
(tuner/timing.py), input sets rotated so the states are not L2-resident, one process. The routed
variant of each layout is printed: one that reads strides costs nothing more; one that does not is
served on contiguous copies (kdispatch/dispatch.py), which shows as the difference.

    python benchmarks/strided_inputs.py [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

import kdispatch  # noqa: E402
from kdispatch.workloads import materialize  # noqa: E402
from kdispatch.tuner.timing import eager_times_us, graph_times_us  # noqa: E402

SHAPES = {
    "gdn_decode": [{"batch_size": b} for b in (1, 16, 64, 256)],
    "gdn_prefill": [{"total_seq_len": 64, "num_seqs": 16}, {"total_seq_len": 1024, "num_seqs": 4},
                    {"total_seq_len": 8192, "num_seqs": 8}],
    "dsa_sparse_attention": [{"num_tokens": t, "num_pages": 2000} for t in (1, 8, 64)],
}
SET_BYTES = 120 << 20  # rotate through at least this much state/input per graph replay


def packed(op: str, args: list) -> list:
    """The same values, with the inputs engines split out of packed rows as views into such rows."""
    args = list(args)
    if op in ("gdn_decode", "gdn_prefill"):
        q, k, v, a, b = (args[i] for i in (0, 1, 2, 5, 7))
        rows = q.shape[0]
        mixed = torch.cat([q.reshape(rows, -1), k.reshape(rows, -1), v.reshape(rows, -1)], dim=1)
        ba = torch.cat([b.reshape(rows, -1), a.reshape(rows, -1)], dim=1)
        nq, nv = q[0].numel(), v[0].numel()
        args[0] = mixed[:, :nq].view(q.shape)
        args[1] = mixed[:, nq:2 * nq].view(k.shape)
        args[2] = mixed[:, 2 * nq:2 * nq + nv].view(v.shape)
        args[7] = ba[:, :b[0].numel()].view(b.shape)
        args[5] = ba[:, b[0].numel():].view(a.shape)
    elif op == "dsa_sparse_attention":
        q = torch.cat([args[0], args[1]], dim=-1)
        args[0], args[1] = q[..., :512], q[..., 512:]
    return args


def sets_for(op: str, axes: dict) -> list[list]:
    one = list(materialize(op, {"uuid": f"strided-{op}", "axes": axes, "inputs": {}}, device="cuda"))
    per_set = sum(x.numel() * x.element_size() for x in one if torch.is_tensor(x) and x.dim() >= 2)
    n = max(2, min(8, -(-SET_BYTES // per_set)))
    return [list(materialize(op, {"uuid": f"strided-{op}", "axes": axes, "inputs": {}}, device="cuda", seed=i))
            for i in range(n)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", type=Path)
    opts = ap.parse_args()
    rows = []
    for op, shapes in SHAPES.items():
        fn = getattr(kdispatch.ops, op)
        d = kdispatch.ops.DISPATCHERS[op]
        for axes in shapes:
            contiguous = sets_for(op, axes)
            views = [packed(op, s) for s in contiguous]
            row = {"op": op, "axes": axes}
            for layout, sets in (("contiguous", contiguous), ("views", views)):
                arch = kdispatch.arch.arch_of(sets[0][0].device)
                strided = d.checker.is_strided(sets[0])
                row[f"{layout}_variant"] = d.choose(arch, d.checker.check(sets[0]), strided=strided).name
                row[f"{layout}_graph_us"] = statistics.median(graph_times_us(fn, sets)[0])
                row[f"{layout}_eager_us"] = statistics.median(eager_times_us(fn, sets, 20))
            rows.append(row)
            print(f"{op:<22}{str(axes):<44} graph {row['contiguous_graph_us']:8.1f} -> {row['views_graph_us']:8.1f} us"
                  f"   eager {row['contiguous_eager_us']:8.1f} -> {row['views_eager_us']:8.1f} us"
                  f"   {row['contiguous_variant']} -> {row['views_variant']}", flush=True)
    if opts.json:
        opts.json.write_text(json.dumps({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                                         "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
