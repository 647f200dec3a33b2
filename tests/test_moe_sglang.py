"""SGLang's Triton fused MoE as the moe_fp8 baseline (kernels/library/moe/sglang.py), on the CPU under
the Triton interpreter (tests skip where SGLang is not installed; on a GPU they run there).

Sizes, inputs and the float64 expected value (the reference's formula, dense): tests/moe_small.py.

Tolerance. SGLang's FP8 W8A8 path re-quantises the SwiGLU output to FP8 (e4m3, one scale per 128
columns of each row) before GEMM2, where kdispatch's own kernel keeps it in bf16. That rounding (up
to 1/16 relative per element) is the baseline's own, so the end-to-end check against the float64
expected value is atol = rtol = 6e-2 plus 4% on the relative RMS error (measured 2.2-2.5%, as a
float64 model that adds only that re-quantisation). Each stage is also checked on its own exact
inputs, tightly: routing, alignment, GEMM1, SiLU-and-mul, quantisation, GEMM2, combine.

The interpreter's float -> fp8 conversion does not carry into the exponent when it rounds up
(124.6 becomes 64, not 128) and its fp32 -> bf16 conversion truncates: `fixed_interpreter` routes
both through torch's round-to-nearest-even casts while this module's tests run (the GPU rounds so).
"""
import importlib.util
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

pytestmark = [pytest.mark.skipif(importlib.util.find_spec("sglang") is None, reason="SGLang not installed"),
              # rows of dropped pairs (never read by GEMM2) go through the group quantisation too
              pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning"),
              pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")]

import moe_small  # noqa: E402
from conftest import INTERPRETED, kernel_module  # noqa: E402
from kdispatch.references import moe_fp8 as ref  # noqa: E402

MODULE = "kdispatch.kernels.library.moe.sglang"
DEVICE = "cpu" if INTERPRETED else "cuda"


@pytest.fixture(scope="module", autouse=True)
def fixed_interpreter():
    """Under the interpreter: float -> float8e4nv and fp32 -> bf16 through torch's casts."""
    if not INTERPRETED:
        yield
        return
    import triton.language as tl
    from triton.runtime import interpreter

    original = interpreter._convert_float
    torch_of = {tl.float32: torch.float32, tl.float16: torch.float16, tl.bfloat16: torch.bfloat16}

    def convert_float(input, input_dtype, output_dtype, rounding_mode):
        if (output_dtype == tl.float8e4nv and input_dtype in torch_of) or \
                (output_dtype == tl.bfloat16 and input_dtype == tl.float32):
            src = torch.from_numpy(np.ascontiguousarray(input)).view(torch_of[input_dtype])
            fp8 = output_dtype == tl.float8e4nv
            bits = src.to(torch.float8_e4m3fn if fp8 else torch.bfloat16).view(torch.uint8 if fp8 else torch.int16)
            return bits.numpy().view(np.uint8 if fp8 else np.uint16).reshape(input.shape)
        return original(input, input_dtype, output_dtype, rounding_mode)

    interpreter._convert_float = convert_float
    yield
    interpreter._convert_float = original


@pytest.fixture(scope="module")
def M(bare_sglang):
    return kernel_module(MODULE)


@pytest.fixture(scope="module")
def bare_sglang():
    """SGLang's modules loaded the way the GPU machine loads them (bare packages, stubs): an earlier
    test may have imported SGLang itself, whose MoE modules then pull its model configs
    (transformers, not installed here). Its modules are set aside while these tests run."""
    from kdispatch.kernels.library import sglang_loader

    def sglang_modules():
        return {k: m for k, m in sys.modules.items() if k == "sglang" or k.startswith("sglang.")}

    saved = sglang_modules()
    for name in saved:
        del sys.modules[name]
    sglang_loader.sglang_function.cache_clear()
    yield
    for name in sglang_modules():
        del sys.modules[name]
    sys.modules.update(saved)
    sglang_loader.sglang_function.cache_clear()


HIDDEN, INTER, LOCAL, FP8 = moe_small.HIDDEN, moe_small.INTER, moe_small.LOCAL, moe_small.FP8
_inputs, _expected = moe_small.inputs, moe_small.expected


def _dequant_w(w, s):
    rows, cols = w.shape
    return (w.double().view(rows // 128, 128, cols // 128, 128)
            * s.double()[:, None, :, None]).view(rows, cols)


def _on(device, args):
    return [a.to(device) if isinstance(a, torch.Tensor) else a for a in args]


def _check_end_to_end(out, want):
    assert out.dtype == torch.bfloat16 and out.shape == want.shape
    out = out.double().cpu()
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, want, atol=6e-2, rtol=6e-2)
    assert (out - want).norm() <= 0.04 * want.norm()


def _routed_inputs(T, offset, base_seed):
    """_inputs with the first seed from base_seed whose tokens pick one of this rank's experts
    (with one token, a rank often gets none)."""
    for seed in range(base_seed, base_seed + 100):
        args = _inputs(T, seed, offset)
        experts, _ = ref._route(args[0], args[1], args[9])
        if ((experts >= offset) & (experts < offset + LOCAL)).any():
            return args
    raise AssertionError("no seed routes to this rank")


CASES = [(1, 0), (5, 64), (17, 224)]  # an expert offset at each end of the range and between


@pytest.mark.parametrize("T,offset", CASES)
def test_matches_float64_formula(M, T, offset):
    args = _routed_inputs(T, offset, base_seed=100 + T + offset)
    want = _expected(*args)
    assert want.abs().max() > 0.1, "test inputs must route some tokens to this rank"
    out = M.moe_fp8_sglang(*_on(DEVICE, args))
    _check_end_to_end(out, want)


@pytest.mark.parametrize("T,align", [(5, "torch")])
def test_both_align_paths(M, T, align):
    """The path 'auto' does not pick for this size (5 -> Triton, 17 -> torch by default)."""
    args = _routed_inputs(T, 64, base_seed=7 + T)
    _check_end_to_end(M.moe_fp8_sglang(*_on(DEVICE, args), align=align), _expected(*args))


def test_stages_on_their_own_inputs(M):
    """Each SGLang kernel, with the argument conventions of the wrapper (transposed scale view,
    EP-filtered ids, FP8 activations), against float64 on exactly the tensors it was given."""
    T, offset, scaling = 6, 64, 2.5
    logits, bias, x, xs, w1, w1s, w2, w2s, _, _ = _inputs(T, seed=11, offset=offset)
    # routing: same experts as the reference, weights normalised without the factor
    experts, weights = ref._route(logits, bias, scaling)
    tw, ti = M.route(logits.to(DEVICE), bias.to(DEVICE), scaling)
    tw, ti = tw.cpu(), ti.cpu()
    assert torch.equal(ti.long().sort(1).values, experts.sort(1).values)
    got = torch.zeros(T, 256).scatter_(1, ti.long(), tw)
    exp = torch.zeros(T, 256).scatter_(1, experts, weights / scaling)
    torch.testing.assert_close(got, exp, atol=1e-6, rtol=1e-5)
    ids = M.to_local_ids(ti, offset, LOCAL)
    assert ((ids == -1) == ((ti < offset) | (ti >= offset + LOCAL))).all()

    inter = {}
    out = M.fused_experts_fp8(x.to(DEVICE), xs.to(DEVICE).t(), w1.to(DEVICE), w1s.to(DEVICE),
                              w2.to(DEVICE), w2s.to(DEVICE), tw.to(DEVICE), ids.to(DEVICE),
                              scaling, intermediates=inter)
    inter = {k: v.cpu() if isinstance(v, torch.Tensor) else v for k, v in inter.items()}
    valid = (ids.reshape(-1) >= 0)
    xd = (x.double().view(T, -1, 128) * xs.t().double()[:, :, None]).view(T, HIDDEN)
    for p in range(T * 8):
        t, e = divmod(p, 8)[0], int(ids.reshape(-1)[p])
        if e < 0:  # GEMM1 writes zeros for dropped pairs
            assert (inter["cache1"][p] == 0).all()
            continue
        h = xd[t] @ _dequant_w(w1[e], w1s[e]).t()
        torch.testing.assert_close(inter["cache1"][p].double(), h, atol=1e-2, rtol=1e-2)
    # SiLU on the second half (the definition's order), times the first
    c1 = inter["cache1"][valid].double()
    y = torch.nn.functional.silu(c1[:, INTER:]) * c1[:, :INTER]
    torch.testing.assert_close(inter["cache2"][valid].double(), y, atol=1e-2, rtol=1e-2)
    # per-token-group FP8 quantisation: SGLang's formula, the same codes as torch's cast
    c2 = inter["cache2"].float()[valid]
    scale = (c2.view(-1, INTER // 128, 128).abs().amax(-1).clamp_min(1e-10) / 448.0)
    torch.testing.assert_close(inter["a2_scale"][valid], scale, atol=0, rtol=1e-6)
    codes = (c2.view(-1, INTER // 128, 128) * (1.0 / scale)[:, :, None]).clamp(-448, 448).to(FP8)
    assert (inter["a2"][valid].float() == codes.view(-1, INTER).float()).float().mean() > 0.999
    # GEMM2, the routing weight applied; zeros for dropped pairs
    a2 = (inter["a2"].double().view(-1, INTER // 128, 128)
          * inter["a2_scale"].double()[:, :, None]).view(-1, INTER)
    c3 = inter["cache3"].view(T * 8, HIDDEN)
    for p in range(T * 8):
        e = int(ids.reshape(-1)[p])
        if e < 0:
            assert (c3[p] == 0).all()
            continue
        y2 = (a2[p] @ _dequant_w(w2[e], w2s[e]).t()) * float(tw.reshape(-1)[p])
        torch.testing.assert_close(c3[p].double(), y2, atol=1e-2, rtol=1e-2)
    # combine: sum of the 8 slots times the routed scaling factor
    torch.testing.assert_close(out.cpu().double(), inter["cache3"].double().sum(1) * scaling,
                               atol=1e-2, rtol=1e-2)


@pytest.mark.parametrize("T,block_m", [(5, 16), (40, 32)])
def test_alignment_contract(M, T, block_m):
    """Both align paths give SGLang's moe_align_block_size layout ('+1 offset' convention)."""
    g = torch.Generator().manual_seed(T)
    ids = torch.randint(-1, LOCAL, (T, 8), generator=g, dtype=torch.int32)
    for align in ("torch", "triton"):
        sorted_ids, expert_ids, num_post_pad = M.moe_align_block_size(ids.to(DEVICE), block_m,
                                                                      LOCAL, align)
        sorted_ids, expert_ids = sorted_ids.cpu().long(), expert_ids.cpu().long()
        total = int(num_post_pad)
        counts = torch.bincount(ids.reshape(-1).long() + 1, minlength=LOCAL + 1)
        assert total == int(((counts + block_m - 1) // block_m * block_m).sum())
        used = sorted_ids[:total]
        real = used[used < ids.numel()]
        assert torch.equal(real.sort().values, torch.arange(ids.numel()))  # every pair once
        assert (used[used >= ids.numel()] == ids.numel()).all()  # pads hold numel
        block_expert = expert_ids[: total // block_m].repeat_interleave(block_m)
        assert torch.equal(block_expert[used < ids.numel()], ids.reshape(-1).long()[real])
        assert (expert_ids[: total // block_m].diff() >= 0).all()  # buckets in order, -1 first


@pytest.mark.parametrize("config", [
    dict(BLOCK_SIZE_M=32, BLOCK_SIZE_N=256, BLOCK_SIZE_K=128, GROUP_SIZE_M=8, num_warps=8, num_stages=3),
])
def test_config_override_with_multi_block_experts(M, config):
    """A routing bias sends every token to the same 8 local experts (20 pairs each), so each
    expert spans several BLOCK_SIZE_M blocks; BLOCK_SIZE_N below and above the 128 scale block."""
    args = _inputs(20, seed=5, offset=64)
    bias = args[1].float()
    bias[64:72] += 1.0
    args[1] = bias.to(torch.bfloat16)
    experts, _ = ref._route(args[0], args[1], args[9])
    assert ((experts >= 64) & (experts < 72)).all()
    out = M.moe_fp8_sglang(*_on(DEVICE, args), config=config)
    _check_end_to_end(out, _expected(*args))


def test_no_local_expert_gives_zeros_and_perturbation_fails(M):
    args = _inputs(4, 3, offset=64)
    args[8] = 1000  # no global expert id lands on this rank
    out = M.moe_fp8_sglang(*_on(DEVICE, args))
    assert (out == 0).all()
    args = _inputs(4, 4)
    want = _expected(*args)
    out = M.moe_fp8_sglang(*_on(DEVICE, args)).cpu()
    _check_end_to_end(out, want)
    bad = out.clone()
    row, col = divmod(int(want.abs().argmax()), HIDDEN)
    bad[row, col] += 0.5
    with pytest.raises(AssertionError):
        _check_end_to_end(bad, want)


def test_config_lookup(M):
    """SGLang ships no H100 file for E=32, N=2048, fp8_w8a8, [128, 128]: the default config."""
    name = M.config_file_name(32, 2048, "NVIDIA H100 80GB HBM3")
    assert name == "E=32,N=2048,device_name=NVIDIA_H100_80GB_HBM3,dtype=fp8_w8a8,block_shape=[128, 128].json"
    assert M.moe_config_table(32, 2048, "NVIDIA H100 80GB HBM3") == (None, None)
    up, down = M.moe_configs(32, 2048, 17, "NVIDIA H100 80GB HBM3")
    assert up == M.default_config() and down is None
    # a shipped table is found and the entry nearest M taken (E=256, N=128 for H100, Triton 3.1)
    path, table = M.moe_config_table(256, 128, "NVIDIA H100 80GB HBM3")
    assert path is not None and table
    up, _ = M.moe_configs(256, 128, 17, "NVIDIA H100 80GB HBM3")
    assert up == {k: v for k, v in table[min(table, key=lambda m: abs(m - 17))].items()
                  if k != "USE_TMA"}


_CUDA_HOST_IMPORT = r"""
import sys
from kdispatch.kernels.library import sglang_loader as L
L.SRT_UTILS["is_cuda"] = lambda: True  # take the CUDA branches at import, as on the GPU host
from kdispatch.kernels.library.moe import sglang as M
for module, name in [(M.KERNELS, "invoke_fused_moe_kernel"), (M.KERNELS, "moe_sum_reduce_triton"),
                     (M.FP8_KERNEL, "_per_token_group_quant_8bit_raw"), (M.ROUTER, "moe_fused_gate"),
                     (M.ALIGN_SMALL, "moe_align_small_numel")]:
    M.sglang_function(module, name)
import importlib
assert importlib.import_module(M.KERNELS)._is_cuda and importlib.import_module(M.FP8_KERNEL)._is_cuda
assert sys.modules["sglang"].__file__ is None  # SGLang's package __init__ never ran
heavy = sorted(m for m in ("sgl_kernel", "orjson", "psutil", "zmq", "msgspec", "tvm_ffi", "uvloop",
                           "fastapi", "transformers", "sglang.srt.server_args") if m in sys.modules)
assert not heavy, heavy
print("ok")
"""


def test_imports_as_on_a_cuda_host_without_sgl_kernel():
    """The import chain with SGLang's CUDA branches taken (is_cuda() true), in a fresh process:
    no sgl_kernel, no server-side dependency, SGLang's __init__ not run."""
    env = dict(os.environ, TRITON_INTERPRET="1")
    run = subprocess.run([sys.executable, "-c", _CUDA_HOST_IMPORT], env=env, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0 and run.stdout.strip().endswith("ok"), run.stderr[-3000:]


@pytest.mark.parametrize("builds", [False, True])
def test_flashinfer_router_is_probed_once(M, monkeypatch, caplog, builds):
    """SGLang's first router is flashinfer's JIT kernel; where it cannot be built (a FlashInfer
    without CUDA sources, as on the project's GPU machine) the probe says so once and the Triton
    router serves."""
    import types

    calls = []

    def fused_topk_deepseek(scores, bias, n_group, topk_group, topk, scale, weights, ids, launch_with_pdl):
        calls.append(scores.shape)
        if not builds:
            raise RuntimeError("Ninja build failed. Ninja output:\nmissing sources")

    fake = types.ModuleType("flashinfer.fused_moe")
    fake.fused_topk_deepseek = fused_topk_deepseek
    monkeypatch.setitem(sys.modules, "flashinfer.fused_moe", fake)
    M._flashinfer_router.cache_clear()
    try:
        with caplog.at_level("WARNING"):
            first = M._flashinfer_router(torch.device("cpu"), 256)
            again = M._flashinfer_router(torch.device("cpu"), 256)
    finally:
        M._flashinfer_router.cache_clear()
    assert first is again is builds and calls == [(1, 256)]
    warned = [r for r in caplog.records if "Triton router" in r.getMessage()]
    assert len(warned) == (0 if builds else 1)
