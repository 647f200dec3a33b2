"""CPU tests of the chunked GDN prefills under the Triton interpreter, against kdispatch's references,
in both conventions. The two-kernel one (kernels/triton/gdn/prefill_chunked.py): the packed batch's
64-token blocks hold pieces of several sequences (a sequence crossing two block boundaries, short
ones sharing a block, an empty one, a padding slot, fresh and continued states). The fused one
(kernels/triton/gdn/prefill_fused.py) and the staged one (prefill_staged.py): sequences of several
chunks with a partial last one, an empty one, a padding slot, fresh and continued states, a chunk
length whose inverse takes more than one doubling (fused), and a malformed batch. The conformance and
hostile input suites run every configuration on their own shapes; these check the chunk bookkeeping."""
import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton")

from conftest import DEVICE as DEV  # noqa: E402
from conftest import kernel_module  # noqa: E402
from kdispatch.references import gdn_prefill as ref_contest  # noqa: E402
from kdispatch.references import gdn_prefill_pool as ref_pool  # noqa: E402

C = kernel_module("kdispatch.kernels.triton.gdn.prefill_chunked")
F_ = kernel_module("kdispatch.kernels.triton.gdn.prefill_fused")
S_ = kernel_module("kdispatch.kernels.triton.gdn.prefill_staged")
# the fused kernel and the staged one (same algebra, same entry points but for their names)
WALKS = {"fused": (F_.gdn_prefill_pool_fused, F_.gdn_prefill_fused),
         "staged": (S_.gdn_prefill_pool_staged, S_.gdn_prefill_staged)}


def _close(out, new_state, want_out, want_state):
    assert torch.isfinite(out.float()).all()
    err = (out.float() - want_out.float()).norm() / want_out.float().norm()
    assert err < 2e-2, f"output relative error {err:.4f}"
    assert (new_state - want_state).abs().max() < 1e-2


def _check_pool(call, lens):
    """One pool-convention batch of these 6 sequence lengths (sequence 3 on a padding slot, fresh and
    continued states, sequence 2 continued whatever its length) through `call(q, k, v, g, beta, pool, slots, init, cu_seqlens, out)`, which
    returns the output, against the reference."""
    g = torch.Generator().manual_seed(7)
    hq, hv, n = 2, 4, len(lens)
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
    T = int(cu[-1])
    q, k = (torch.randn(T, hq, 128, generator=g).to(torch.bfloat16) for _ in range(2))  # normalised in the op
    v = torch.randn(T, hv, 128, generator=g).to(torch.bfloat16)
    gate = -torch.rand(T, hv, generator=g) * 0.3
    beta = torch.rand(T, hv, generator=g)
    pool = torch.randn(n + 2, hv, 128, 128, generator=g) * 0.1
    slots = torch.tensor([1, 2, 3, -1, 5, 6], dtype=torch.int32)  # sequence 3: padding
    init = torch.tensor([True, True, True, True, False, True])  # the empty sequence 2 keeps its state
    args = [t.to(DEV) for t in (q, k, v, gate, beta, pool, slots, init, cu)]
    out = torch.full((T, hv, 128), float("nan"), dtype=torch.bfloat16, device=DEV)
    want_out, want_pool = ref_pool.run(*args, out.clone(), None)
    mine = args[5].clone()
    got = call(*args[:5], mine, *args[6:], out)
    _close(got, mine, want_out, want_pool)
    assert (got[int(cu[3]):int(cu[4])] == 0).all()  # the padding sequence's rows
    assert torch.equal(mine[[0, 4, 7]], args[5][[0, 4, 7]])  # slots no sequence names


def test_pool_pieces_across_blocks():
    # 163 tokens: 3 blocks; sequence 1 spans all of them
    _check_pool(lambda *a: C.gdn_prefill_pool_chunked(*a, None, cfg=(64, 4))[0], [3, 130, 0, 9, 1, 20])


def _check_contest_without_state(call, lens):
    """A contest-convention batch of these sequence lengths (raw gates, no initial state) through
    `call(q, k, v, state, A_log, a, dt_bias, b, cu_seqlens, scale)`, which returns (output, state),
    against the reference."""
    g = torch.Generator().manual_seed(8)
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int64)
    T = int(cu[-1])
    q, k = (F.normalize(torch.randn(T, 4, 128, generator=g), dim=-1).to(torch.bfloat16) for _ in range(2))
    v = torch.randn(T, 8, 128, generator=g).to(torch.bfloat16)
    A_log, dt_bias = torch.randn(8, generator=g) * 0.5, torch.randn(8, generator=g) * 0.5
    a, b = ((torch.randn(T, 8, generator=g) * 2).to(torch.bfloat16) for _ in range(2))
    args = [t.to(DEV) for t in (q, k, v)] + [None] + [t.to(DEV) for t in (A_log, a, dt_bias, b, cu)] + [None]
    want_out, want_state = ref_contest.run(*args)
    got, state = call(*args)
    _close(got, state, want_out, want_state)


def test_contest_convention_without_state():
    _check_contest_without_state(lambda *a: C.gdn_prefill_chunked(*a, cfg=(16, 4)), [70, 5])


@pytest.mark.parametrize("walk,cfg", [("fused", (16, 64, 4)), ("fused", (32, 128, 4)), ("staged", (16, 32, 4))])
def test_fused_pool_chunks_and_padding(walk, cfg):
    # sequence 1: several chunks and a partial one; the staged kernel's 16-token blocks hold pieces of
    # several sequences (3 + 9 + 1 tokens around sequence 1's last piece)
    _check_pool(lambda *a: WALKS[walk][0](*a, None, cfg=cfg)[0], [3, 70, 0, 9, 1, 33])


@pytest.mark.parametrize("walk", WALKS)
def test_fused_contest_convention_without_state(walk):
    _check_contest_without_state(lambda *a: WALKS[walk][1](*a, cfg=(16, 128, 4)), [40, 5])


@pytest.mark.parametrize("walk", WALKS)
def test_fused_malformed_batch_writes_zeros_and_no_state(walk):
    g = torch.Generator().manual_seed(9)
    T, hv = 20, 4
    cu = torch.tensor([0, 12, 8, T], dtype=torch.int32)  # decreasing: malformed
    q, k = (torch.randn(T, 2, 128, generator=g).to(torch.bfloat16) for _ in range(2))
    v = torch.randn(T, hv, 128, generator=g).to(torch.bfloat16)
    pool = torch.randn(4, hv, 128, 128, generator=g)
    args = [t.to(DEV) for t in (q, k, v, -torch.rand(T, hv, generator=g), torch.rand(T, hv, generator=g), pool,
                                torch.tensor([0, 1, 2], dtype=torch.int32), torch.ones(3, dtype=torch.bool), cu)]
    out = torch.full((T, hv, 128), float("nan"), dtype=torch.bfloat16, device=DEV)
    mine = args[5].clone()
    got, _ = WALKS[walk][0](*args[:5], mine, *args[6:], out, None, cfg=(16, 128, 4))
    assert (got == 0).all()
    assert torch.equal(mine, args[5])
