"""A few calls of every DSA variant on contest shapes, for a kernel profiler:

    ncu --clock-control none --metrics gpu__time_duration.sum python benchmarks/profile_dsa.py

gives each kernel's device time apart from launch gaps (what the CUDA-graph timings of
benchmarks/dsa.py add up). Shapes: the indexer at B=4 x 34 pages and B=27 x 82 pages, sparse
attention at 1 and 8 query tokens. Each variant runs twice (the first call compiles)."""
from __future__ import annotations

from pathlib import Path

import torch

from kdispatch import registry
from kdispatch.workloads import load_workloads, materialize

ROOT = Path(__file__).resolve().parents[1]
INDEXER = "dsa_topk_indexer_fp8_h64_d128_topk2048_ps64"
SPARSE = "dsa_sparse_attention_h16_ckv512_kpe64_topk2048_ps64"
SHAPES = {INDEXER: [{"batch_size": 4, "max_num_pages": 34}, {"batch_size": 27, "max_num_pages": 82}],
          SPARSE: [{"num_tokens": 1}, {"num_tokens": 8}]}


def main() -> None:
    registry.discover()
    for definition, shapes in SHAPES.items():
        ws = load_workloads(ROOT / "traces", definition)
        for want in shapes:
            w = next(w for w in ws if all(w.axes[k] == v for k, v in want.items()))
            args = list(materialize(definition, w, device="cuda", seed=0))
            for v in registry.variants(definition):
                if v.name == "reference" or v.why_not("sm90") is not None or v.declines(dict(w.axes)) is not None:
                    continue
                for _ in range(2):
                    v.fn(*args)
                torch.cuda.synchronize()
                print(definition.split("_")[1], dict(w.axes), v.name, flush=True)


if __name__ == "__main__":
    main()
