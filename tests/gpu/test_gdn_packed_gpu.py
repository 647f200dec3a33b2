"""The engines' packed pool decode on the GPU (gdn_decode_packed_*): the CUDA kernel and SGLang's own
kernel (where staged: benchmarks/stage_engines.sh) against the reference on engine layouts (a pool
whose slot pitch exceeds a slot, packed rows with a wider stride), on hostile slot indices (nothing
outside the pool read or written), and the CUDA kernel inside a CUDA graph. Skipped without CUDA."""
import pytest
import torch

from engine_pool import paged, untouched_margins
from engine_pool import runnable as _runnable
from kdispatch import registry
from kdispatch.definitions.gdn.names import PACKED_HEADS
from kdispatch.workloads import materialize

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

HEADS = [(hq, hv) for hq, hv in PACKED_HEADS.values()]
VARIANTS = ["cuda_decode_pool_rows.r1cs", "cuda_decode_pool_rows.r4cs", "cuda_decode_pool_rows.r8", "cuda_decode_pool_rows.r32cs",
            "sglang_packed_decode"]
INT32_MIN, INT32_MAX = -2**31, 2**31 - 1


def args_for(hq, hv, batch, slots, seed=0):
    w = {"axes": {"batch_size": batch, "num_slots": slots}, "inputs": {}, "uuid": f"packed-gpu-{hv}-{batch}"}
    return list(materialize(f"gdn_decode_packed_qk{hq}_v{hv}", w, device="cuda", seed=seed))


def runnable(hq, hv, name):
    return _runnable(f"gdn_decode_packed_qk{hq}_v{hv}", name)


def clone(args):
    return [x.clone() if torch.is_tensor(x) else x for x in args]


def check(got, want):
    (out, pool), (want_out, want_pool) = got, want
    assert not torch.isnan(out).any()
    torch.testing.assert_close(out.float(), want_out.float(), rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(pool, want_pool, rtol=1e-2, atol=1e-2)  # the spec's tolerance


@pytest.mark.parametrize("name", VARIANTS)
@pytest.mark.parametrize("hq,hv", HEADS)
def test_engine_layouts(hq, hv, name):
    v = runnable(hq, hv, name)
    args = args_for(hq, hv, 24, 30)
    want = registry.get(f"gdn_decode_packed_qk{hq}_v{hv}", "reference").fn(*clone(args))
    mixed, pool = args[0], args[5]
    wide = torch.zeros(24, mixed.shape[1] + 128, dtype=mixed.dtype, device="cuda")
    wide[:, 64:64 + mixed.shape[1]] = mixed
    pages, view = paged(pool)
    args[0], args[5] = wide[:, 64:64 + mixed.shape[1]], view
    got = v.fn(*args)
    assert got[1] is view and got[0] is args[7]
    check(got, want)
    assert untouched_margins(pages, pool[0].numel()), "written between slots"


@pytest.mark.parametrize("name", VARIANTS)
def test_hostile_slots_touch_nothing_outside_the_pool(name):
    hq, hv = 4, 8
    v = runnable(hq, hv, name)
    args = args_for(hq, hv, 16, 20, seed=3)
    args[6][:8] = torch.tensor([INT32_MIN, -65, -1, 20, 21, 1 << 20, INT32_MAX, -2], dtype=torch.int32)
    # the pool sits inside a larger buffer whose margins must stay untouched
    slot = args[5][0].numel()
    buf = torch.full((22 * slot,), 7.0, device="cuda")
    pool = buf[slot:21 * slot].view(args[5].shape)
    pool.copy_(args[5])
    args[5] = pool
    want = registry.get(f"gdn_decode_packed_qk{hq}_v{hv}", "reference").fn(*clone(args))
    got = v.fn(*args)
    check(got, want)
    assert bool((buf[:slot] == 7).all()) and bool((buf[21 * slot:] == 7).all())


@pytest.mark.parametrize("hq,hv", HEADS)
def test_cuda_kernel_in_a_graph(hq, hv):
    v = runnable(hq, hv, "cuda_decode_pool_rows.r4cs")
    args = args_for(hq, hv, 64, 80)
    want = registry.get(f"gdn_decode_packed_qk{hq}_v{hv}", "reference").fn(*clone(args))
    v.fn(*clone(args))  # compile outside the capture
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        got = v.fn(*args)
    g.replay()
    check(got, want)
