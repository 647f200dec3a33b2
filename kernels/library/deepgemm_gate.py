"""DeepGEMM's variants (the indexer's `deepgemm_torch_topk`, MoE's `deepgemm_contiguous`) register only
when KDISPATCH_DEEPGEMM=1. Built from source on the GPU machine (benchmarks/stage_deepgemm.sh), its
first kernel call segfaulted there on 2026-11-25: the MoE path every time, the indexer path in one
of two sessions (it passed the gate on all 158 tuned workloads in the other), and the setup's own
check in both. On 2026-11-27 every call reaching its JIT crashed, inside std::regex's compiler
(DeepGEMM's include parser, for its cache key), before any compile or CUDA call; the sources are
staged since with string scans in its place (benchmarks/deepgemm_without_regex.py), not yet run
there, and benchmarks/deepgemm_diag.sh separates DeepGEMM from the toolchain. A segfault ends the serving process
before any fallback can act, so no router may send a call there until DeepGEMM runs reliably; set the
switch to measure or debug them."""
from __future__ import annotations

import os

SWITCH = "KDISPATCH_DEEPGEMM"


def opted_in() -> bool:
    return os.environ.get(SWITCH, "").strip() == "1"
