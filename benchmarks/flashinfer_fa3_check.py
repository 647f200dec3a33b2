"""On the GPU machine, after benchmarks/stage_flashinfer_jit.sh's setup: the sparse-attention peer on
FlashInfer's FA3 MLA wrapper (kernels/library/dsa/flashinfer_fa3.py) through the correctness gate on
two shapes, one with tokens that have no valid id. The first call builds FlashInfer's FA3 MLA
module when no prebuilt one is installed; the time printed includes that build."""
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from kdispatch import workloads  # noqa: E402
from kdispatch.kernels.library.dsa.flashinfer_fa3 import dsa_sparse_attention_flashinfer_fa3 as fa3  # noqa: E402
from kdispatch.tuner import gate  # noqa: E402

DEF = "dsa_sparse_attention"
t0 = time.time()
ok, took = True, None
for tokens, pages, empty in ((4, 300, False), (9, 40, True)):
    args = list(workloads.materialize(DEF, {"axes": {"num_tokens": tokens, "num_pages": pages}, "inputs": {},
                                            "uuid": f"fa3-check-{tokens}"}, device="cuda", seed=tokens))
    if empty:  # a token without any valid id, and one with ids outside the cache among valid ones
        args[4][0] = -1
        args[4][1, ::5] = pages * 64 + 3
    outputs = fa3(*args)
    torch.cuda.synchronize()
    took = took or time.time() - t0  # the first call's, with any build
    v = gate.check_outputs(DEF, args, outputs, gate.reference(DEF, args))
    print(f"{tokens} tokens x {pages} pages: {v.status} {v.reason or ''}".rstrip())
    ok &= v.passed
print(f"flashinfer fa3 mla: first call in {took:.0f} s; passes the gate: {ok}")
if not ok:
    raise SystemExit(1)
