"""The tuner gate's GDN prefill oracles (kdispatch/references/oracles.py) on the GPU, where the tune
uses them: they match the float32 token-by-token references on a long sequence among short ones,
and take a fraction of the reference's time there. Skipped without CUDA."""
import time

import pytest
import torch

from kdispatch import definitions, registry
from kdispatch.references.oracles import ORACLES
from kdispatch.workloads import SimpleWorkload, materialize

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

CASES = {"gdn_prefill_pool_qk16_v32": {"total_seq_len": 3000, "num_seqs": 9, "num_slots": 12},
         "gdn_prefill_pool_qk2_v4": {"total_seq_len": 2500, "num_seqs": 3, "num_slots": 5},
         "gdn_prefill": {"total_seq_len": 2000, "num_seqs": 4}}


def timed(fn, args):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    out = fn(*[x.clone() if isinstance(x, torch.Tensor) else x for x in args])
    torch.cuda.synchronize()
    return out, time.perf_counter() - t0


@pytest.mark.parametrize("short", sorted(CASES))
def test_oracle_matches_the_reference_on_the_gpu(short):
    registry.discover()
    name = definitions.get(short).name
    args = list(materialize(name, SimpleWorkload(CASES[short], uuid=f"oracle-gpu-{short}"), "cuda", 0))
    timed(ORACLES[name], args)  # first call: cuBLAS / cuSOLVER handles
    (o_ref, s_ref), t_ref = timed(registry.get(name, registry.REFERENCE).fn, args)
    (o, s), t = timed(ORACLES[name], args)
    assert torch.isfinite(o.float()).all() and torch.isfinite(s).all()
    torch.testing.assert_close(o.float(), o_ref.float(), rtol=1e-2, atol=2e-3)
    torch.testing.assert_close(s, s_ref, rtol=1e-4, atol=1e-5)
    assert t < t_ref, f"{short}: oracle {t:.3f} s, reference {t_ref:.3f} s"
