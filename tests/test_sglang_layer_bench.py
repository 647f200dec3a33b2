"""benchmarks/sglang_layer.py's plumbing on the CPU (the GPU machine runs it for its numbers): one MTP
verify call built as SGLang's GDN backend makes it, through SGLang's unhooked TritonGDNKernel (its
Triton kernel interpreted) and through the class hooked by kdispatch's plugin (the reference on the
CPU), must agree. Skips where SGLang is not installed."""
import os
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("sglang.srt.layers.attention.linear.kernels.gdn_triton")
pytest.importorskip("sglang.srt.plugins.hook_registry")

from conftest import INTERPRETED  # noqa: E402
from kdispatch.integrations import serving  # noqa: E402
from kdispatch.integrations import sglang as plugin  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import sglang_layer  # noqa: E402

pytestmark = pytest.mark.skipif(not INTERPRETED, reason="the GPU machine runs the benchmark itself")


def test_verify_call_agrees_hooked_and_unhooked(monkeypatch):
    monkeypatch.setattr(serving, "not_served", lambda short, device: None)  # kdispatch takes the call
    monkeypatch.delenv(plugin.SWITCH, raising=False)
    served = plugin.VERIFY_STATS["served"]
    row = sglang_layer.measure("verify", 8, (2, 2), 0, torch.device("cpu"))
    # exactly one: the hooked call reached kdispatch, and the unhooked one did not (a class left hooked by
    # an earlier caller would make the comparison kdispatch against itself)
    assert plugin.VERIFY_STATS["served"] == served + 1
    assert "sglang_error" not in row and "kdispatch_error" not in row, row
    assert row["agree"] is True and row["sets"] == 2
    assert plugin.SWITCH not in os.environ, "the benchmark leaves the switch as it found it"


def test_trimmed_extend_calls_are_valid_new_shapes():
    """The eager_new measurement's calls: each a token count of its own, the boundaries still valid, the
    lengths given to the plugin's metadata hook those of the boundaries."""
    calls, _ = sglang_layer.extend_calls(8, 3, 40, 0, torch.device("cpu"))
    assert calls[0][2] == calls[0][1]["query_start_loc"].diff().tolist()
    for drop in (1, 5, 20):
        (q, k, v, g, beta), kw, lens = sglang_layer.trimmed_extend(calls[0], drop)
        t = 40 - drop
        assert q.shape[1] == k.shape[1] == v.shape[1] == g.shape[1] == beta.shape[1] == kw["output"].shape[1] == t
        cu = kw["query_start_loc"]
        assert cu.dtype == torch.int32 and int(cu[0]) == 0 and int(cu[-1]) == t and bool((cu[1:] >= cu[:-1]).all())
        assert lens == cu.diff().tolist(), "the lengths the metadata hook is given"
        assert kw["output"].is_contiguous() and g.is_contiguous() and beta.is_contiguous()
