"""benchmarks/vllm_kernels.py's plumbing on the CPU (the GPU machine runs it for its numbers): vLLM's
FlashInfer prefill function is taken from its layer module's source even where the module itself
cannot import, and the prefill segment around the swapped call gathers, zeroes and scatters the
states as vLLM's layer does."""
import sys
import textwrap
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import vllm_kernels  # noqa: E402


def fake_vllm(root: Path) -> None:
    """A vLLM package whose layer module cannot import (as on the GPU machine) but whose prefill
    function, compiled alone, can run."""
    ops = root / "vllm" / "third_party" / "flash_linear_attention" / "ops"
    layer = root / "vllm" / Path(vllm_kernels.LAYER_FILE)
    for d in (ops, layer.parent):
        d.mkdir(parents=True)
    (root / "vllm" / "__init__.py").write_text("__version__ = 'fake'\n")
    (ops / "__init__.py").write_text("def fused_recurrent_gated_delta_rule_packed_decode(**kw):\n    return 'decode'\n"
                                     "def chunk_gated_delta_rule(**kw):\n    return 'fla'\n")
    (ops / "chunk.py").write_text("def l2norm_fwd(x):\n    return x * 2\n")
    layer.write_text(textwrap.dedent("""\
        import a_module_the_gpu_machine_lacks
        from typing import Literal

        def fi_chunk_gated_delta_rule(q, initial_state, use_qk_l2norm_in_kernel=True, use_cp: Literal["auto"] | bool = "auto"):
            return l2norm_fwd(q) if use_qk_l2norm_in_kernel else torch.zeros_like(q), initial_state
        """))


def test_the_prefill_function_comes_from_the_layer_source_alone(tmp_path, monkeypatch):
    fake_vllm(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in [m for m in sys.modules if m == "vllm" or m.startswith("vllm.")]:
        monkeypatch.delitem(sys.modules, name)
    fns = vllm_kernels.vllm_functions()
    q = torch.ones(3)
    out, state = fns["fi_chunk_gated_delta_rule"](q, "s")
    assert torch.equal(out, q * 2) and state == "s", "vLLM's function body, with vLLM's l2norm_fwd"
    assert fns["fused_recurrent_gated_delta_rule_packed_decode"]() == "decode"
    assert fns["fla_chunk_gated_delta_rule"]() == "fla"


def test_the_prefill_segment_gathers_zeroes_and_scatters_as_vllms_layer():
    pool = torch.arange(6, dtype=torch.float32).view(6, 1, 1, 1).expand(6, 1, 2, 2).contiguous()
    before = pool.clone()
    seen = {}

    def kernel(q, k, v, g, beta, initial_state, output_final_state, cu_seqlens, use_qk_l2norm_in_kernel):
        seen["initial"] = initial_state.clone()
        assert output_final_state and not use_qk_l2norm_in_kernel
        return q + 1, initial_state + 10

    slots = torch.tensor([4, 1, 2])
    call = dict(q=torch.zeros(1, 5, 1, 2), k=None, v=None, g=None, beta=None, pool=pool, slots=slots,
                has_initial=torch.tensor([True, False, True]), cu_seqlens=torch.tensor([0, 1, 3, 5]), lens=[1, 2, 2])
    out = vllm_kernels.prefill_method(kernel, hinted=False)(call)
    assert torch.equal(out, torch.ones(1, 5, 1, 2))
    assert seen["initial"][:, 0, 0, 0].tolist() == [4.0, 0.0, 2.0], "gathered, zeroed where no initial state"
    assert pool[slots, 0, 0, 0].tolist() == [14.0, 10.0, 12.0], "final states scattered back"
    untouched = [0, 3, 5]
    assert torch.equal(pool[untouched], before[untouched])
