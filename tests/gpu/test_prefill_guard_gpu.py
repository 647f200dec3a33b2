"""The prefill guard (kernels/cuda/gdn/prefill_guard.py) on the GPU: int32 and int64 cu_seqlens give
the same int64 offsets and verdict, well formed or not; `log_decay` gives exp(g) for strided g; a
malformed batch's output is zeroed. Skipped without CUDA."""
import pytest
import torch

from kdispatch.kernels.cuda.gdn import prefill_guard

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

T, HV = 70, 8
WELL_FORMED = [0, 3, 3, 40, T]
MALFORMED = {"decreasing": [0, 30, 20, T], "short": [0, 3, T - 1], "late start": [1, 3, T], "past T": [0, 3, T + 1]}


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("malformed", ["empty", "even"])
@pytest.mark.parametrize("case", ["well formed", *MALFORMED])
def test_offsets_and_verdict(dtype, malformed, case):
    cu_list = WELL_FORMED if case == "well formed" else MALFORMED[case]
    cu = torch.tensor(cu_list, dtype=dtype, device="cuda")
    out = torch.full((T, HV, 128), 1.0, dtype=torch.bfloat16, device="cuda")
    safe, verdict, alpha, beta = prefill_guard.guard(cu, T, out=out, malformed=malformed)
    torch.cuda.synchronize()
    N = len(cu_list) - 1
    ok = case == "well formed"
    if ok:
        expect = cu_list
    elif malformed == "empty":
        expect = [0] * (N + 1)
    else:
        expect = [i * T // N for i in range(N + 1)]
    assert safe.dtype == torch.int64 and safe.tolist() == expect
    assert int(verdict[N + 1]) == int(ok)
    assert alpha is None and beta is None
    assert bool((out == 0).all()) != ok  # zeroed exactly when malformed


def test_log_decay_is_exp_g_for_strided_g():
    cu = torch.tensor(WELL_FORMED, dtype=torch.int32, device="cuda")
    base = -torch.rand(T, 2 * HV, device="cuda") * 3  # g as a view: token stride 2 * HV
    g = base[:, :HV]
    alpha = torch.full((T, HV), float("nan"), device="cuda")  # poison a block the guard may reuse
    del alpha
    _, _, alpha, beta = prefill_guard.guard(cu, T, log_decay=g)
    torch.cuda.synchronize()
    assert beta is None and alpha.shape == (T, HV) and alpha.dtype == torch.float32
    torch.testing.assert_close(alpha, torch.exp(g.double()).float(), rtol=1e-6, atol=0)


def test_gates_and_log_decay_exclusive():
    cu = torch.tensor(WELL_FORMED, dtype=torch.int64, device="cuda")
    g = torch.zeros(T, HV, device="cuda")
    with pytest.raises(ValueError, match="not both"):
        prefill_guard.guard(cu, T, gates=(g, g, g, g), log_decay=g)
    with pytest.raises(ValueError, match="fp32"):
        prefill_guard.guard(cu, T, log_decay=g.to(torch.bfloat16))
