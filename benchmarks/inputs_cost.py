"""What building one workload's inputs costs a tune (tuner/job.py: each trial's inputs are built on the
CPU, moved to the GPU, then the reference runs), on the largest shapes of each family, with the normal
draws of kdispatch.workloads.randn serial (one generator, as before 2026-11-28) and in parallel chunks.
The first materialisation of each case builds the shared pools and is not timed.

    python benchmarks/inputs_cost.py          # on the GPU machine, after benchmarks/gpu_env.sh
"""
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from kdispatch import definitions as defs  # noqa: E402
from kdispatch import workloads as W  # noqa: E402
from kdispatch.tuner import gate  # noqa: E402

CASES = [("gdn_decode", {"batch_size": 1024}), ("gdn_decode", {"batch_size": 256}),
         ("gdn_decode_packed_qk4_v8", {"batch_size": 512, "num_slots": 513}),
         ("gdn_verify_steps_qk4_v8", {"num_seqs": 256, "num_slots": 2049, "num_steps": 8, "total_seq_len": 2048}),
         ("gdn_prefill_pool_qk4_v8", {"num_seqs": 256, "num_slots": 257, "total_seq_len": 1024}),
         ("gdn_prefill", {"total_seq_len": 32768, "num_seqs": 1, "len_cu_seqlens": 2}),
         ("dsa_sparse_attention", {"num_tokens": 8192, "num_pages": 16384}), ("moe_fp8", {"seq_len": 4096})]

print("threads", torch.get_num_threads(), torch.cuda.get_device_name())
chunk = W.RANDN_CHUNK
for name, axes in CASES:
    d = defs.get(name).name
    row = []
    for mode, c in (("serial", 1 << 62), ("parallel", chunk)):
        W.RANDN_CHUNK = c
        W.clear_cache()
        W.materialize(d, {"uuid": "warm", "axes": axes, "inputs": {}}, device="cuda")  # pools
        torch.cuda.synchronize()
        t = time.perf_counter()
        args = list(W.materialize(d, {"uuid": f"t-{mode}", "axes": axes, "inputs": {}}, device="cuda"))
        torch.cuda.synchronize()
        t1 = time.perf_counter() - t
        t = time.perf_counter()
        gate.reference(d, args)
        torch.cuda.synchronize()
        row.append(f"{mode} inputs {t1:.3f} s ref {time.perf_counter() - t:.3f} s")
    print(f"{name} {axes}: " + " | ".join(row), flush=True)
