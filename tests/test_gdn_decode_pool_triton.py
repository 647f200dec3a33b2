"""The Triton pool decode (kernels/triton/gdn/decode_pool.py, variant triton_decode_pool) against the
engines' packed decode reference, under the Triton interpreter on CPU (on CUDA where present): every
launch configuration, each TP head count, padding rows and slots outside the pool (nothing else read
or written), an engine layout (slot pitch past the slot, packed rows with a wider stride)."""
import pytest
import torch

pytest.importorskip("triton")

from conftest import DEVICE as DEV  # noqa: E402
from conftest import kernel_module  # noqa: E402
from kdispatch.definitions.gdn.names import PACKED_HEADS  # noqa: E402
from kdispatch.references import gdn_decode_packed as ref  # noqa: E402
from kdispatch.workloads import materialize  # noqa: E402

P = kernel_module("kdispatch.kernels.triton.gdn.decode_pool")
INT32_MIN, INT32_MAX = -2**31, 2**31 - 1


def packed_args(hq, hv, batch, slots, seed):
    w = {"axes": {"batch_size": batch, "num_slots": slots}, "inputs": {}, "uuid": f"pool-triton-{hv}-{batch}"}
    return list(materialize(f"gdn_decode_packed_qk{hq}_v{hv}", w, device=DEV, seed=seed))


def run_and_check(args, **config):
    want_out, want_pool = ref.run(*[x.clone() if torch.is_tensor(x) else x for x in args])
    args[7].fill_(float("nan"))  # poison the output: every row must be written
    out, pool = P.gdn_decode_pool(*args, **config)
    assert out is args[7] and pool is args[5]
    assert torch.isfinite(out.float()).all()
    torch.testing.assert_close(out.float(), want_out.float(), rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(pool, want_pool, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("label", sorted(P.CONFIGS))
def test_every_configuration_matches_the_reference(label):
    args = packed_args(2, 4, 3, 5, seed=1)
    args[6][1] = -1  # a padding row
    run_and_check(args, **P.CONFIGS[label])


@pytest.mark.parametrize("hq,hv", list(PACKED_HEADS.values()))
def test_each_tp_head_count(hq, hv):
    run_and_check(packed_args(hq, hv, 2, 3, seed=hv), rows=32, warps=1)


def test_slots_outside_the_pool_touch_nothing():
    args = packed_args(2, 4, 5, 6, seed=3)
    args[6][:] = torch.tensor([INT32_MIN, 6, INT32_MAX, 2, -7], dtype=torch.int32)
    guard = torch.full((2, *args[5].shape[1:]), 7.0, device=DEV)
    backing = torch.cat([guard[:1], args[5], guard[1:]])  # a slot of sevens on each side of the pool
    args[5] = backing[1:-1]
    before = args[5].clone()
    run_and_check(args, rows=16, warps=4)
    assert torch.equal(backing[0], guard[0]) and torch.equal(backing[-1], guard[1])
    for s in (0, 1, 3, 4, 5):  # slots no row names
        assert torch.equal(args[5][s], before[s]), s
    assert (args[7][[0, 1, 2, 4]] == 0).all()


def test_engine_layouts():
    """A pool whose slot pitch exceeds a slot (vLLM's cache pages) and packed rows with a wider stride."""
    args = packed_args(4, 8, 3, 4, seed=4)
    mixed, pool = args[0], args[5]
    wide = torch.zeros(3, mixed.shape[1] + 64, dtype=mixed.dtype, device=DEV)
    wide[:, :mixed.shape[1]] = mixed
    slot = pool[0].numel()
    pages = torch.zeros(4, slot + 4096, device=DEV)
    pages[:, :slot] = pool.reshape(4, -1)
    args[0] = wide[:, :mixed.shape[1]]
    args[5] = pages.as_strided(pool.shape, (slot + 4096, *pool.stride()[1:]))
    run_and_check(args, rows=8, warps=8)
    assert (pages[:, slot:] == 0).all()  # the gap between slots untouched
