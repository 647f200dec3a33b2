"""Call modes on the GPU: the dispatcher sees a real CUDA-graph capture and serves a signature whose
graph and eager choices differ with the graph choice inside the capture, the eager one outside."""
import pytest
import torch

import kdispatch
from kdispatch import dispatch, registry
from kdispatch.arch import arch_of
from kdispatch.registry import Variant
from kdispatch.workloads import materialize

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def test_capturing_follows_a_real_capture():
    g = torch.cuda.CUDAGraph()
    x = torch.zeros(4, device="cuda")
    assert not dispatch.capturing()
    with torch.cuda.graph(g):
        seen = dispatch.capturing()
        x += 1
    assert seen and not dispatch.capturing()
    assert torch.cuda.is_current_stream_capturing() is False


def test_two_mode_signature_serves_per_mode():
    d = kdispatch.ops.DISPATCHERS["gdn_decode"]
    calls = []

    def tagged(tag):
        def run(*args):
            calls.append(tag)
            return args[0] + 0, args[3]  # capturable device work, the shapes of no interest here
        return run

    arch = arch_of(torch.device("cuda"))
    registry.register(Variant(d.definition, "graph_tag", tagged("graph"), "torch", (arch,)))
    registry.register(Variant(d.definition, "eager_tag", tagged("eager"), "torch", (arch,)))
    d.set_router(arch, lambda **axes: "graph_tag", lambda **axes: "eager_tag")
    try:
        w = {"uuid": "modes", "axes": {"batch_size": 4}, "inputs": {}}
        args = materialize("gdn_decode", w, device="cuda")
        kdispatch.ops.gdn_decode(*args)
        torch.cuda.synchronize()
        assert calls == ["eager"]
        g = torch.cuda.CUDAGraph()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            kdispatch.ops.gdn_decode(*args)  # warm-up on the side stream, as capture wants
        torch.cuda.current_stream().wait_stream(s)
        with torch.cuda.graph(g):
            kdispatch.ops.gdn_decode(*args)
        assert calls == ["eager", "eager", "graph"]
    finally:
        d.unset_router(arch)  # the committed router again, loaded on the next call
        registry.unregister(d.definition, "graph_tag")
        registry.unregister(d.definition, "eager_tag")
