"""Every moe_fp8 variant that runs here, at full size, on routings crafted to hit none, exactly one and
all of the rank's 32 local experts, with the rank's expert offset at each end of its range (0 and
224: the first and the last expert group), through the tuner's correctness gate against the
reference. Skipped without CUDA."""
import pytest
import torch

from conftest import runnable_variant, variant_cases
from kdispatch.tuner import gate
from kdispatch.workloads import materialize

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

SHORT, LOCAL, GROUP = "moe_fp8", 32, 32  # a rank's experts are one routing group (offsets are multiples of 32)
HITS = {"none": 5, "one": 5, "all": 32}  # local experts hit -> tokens (32: the decode kernels take it too)


def crafted(hits: str, offset: int) -> list:
    """The definition's inputs with routing logits that make each token pick `hits` local experts."""
    tokens = HITS[hits]
    args = list(materialize(SHORT, {"uuid": f"moe-experts-{hits}-{offset}", "axes": {"seq_len": tokens},
                                    "inputs": {}}, device="cuda", seed=3))
    g = torch.Generator(device="cuda").manual_seed(offset + tokens)
    logits = torch.randn(tokens, 256, generator=g, device="cuda") * 0.5 - 2.0  # scores about 0.1
    local = slice(offset, offset + LOCAL)
    if hits == "none":
        logits[:, local] = -20.0  # the local group's best two sum to ~0: never among the 4 groups kept
    elif hits == "one":
        logits[:, local] = -20.0
        logits[:, offset + 5] = 20.0  # its group kept (score ~1), the rest of it below every other kept expert
    else:
        logits[:, local] = -20.0
        i = torch.arange(tokens, device="cuda")
        logits[i, offset + i % LOCAL] = 20.0  # token i: local experts i and i+1 (mod 32): all 32 hit, twice
        logits[i, offset + (i + 1) % LOCAL] = 20.0
    args[0], args[8] = logits, offset
    return args


@pytest.mark.parametrize("offset", [0, 224])
@pytest.mark.parametrize("hits", list(HITS))
@pytest.mark.parametrize("short,name,axes", variant_cases({SHORT: [{"seq_len": 5}]}))
def test_expert_hits(short, name, axes, hits, offset):
    v = runnable_variant(short, name, {"seq_len": HITS[hits]})
    args = crafted(hits, offset)
    from kdispatch.references import moe_fp8 as ref

    experts, _ = ref._route(args[0], args[1], args[9])
    local = experts[(experts >= offset) & (experts < offset + LOCAL)].unique().numel()
    assert local == {"none": 0, "one": 1, "all": LOCAL}[hits], "the crafted routing must hit what it says"
    verdict = gate.run_gate(short, v.fn, [(args, gate.reference(short, args))])
    assert verdict.passed, f"{name} {hits} offset {offset}: {verdict.status} {verdict.reason}"
