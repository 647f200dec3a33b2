"""Cross-check the project's reference implementations against the official FlashInfer-Bench ones.

The official definitions (with their PyTorch `reference` code) live outside the repository, in
`../shared/fib/definitions` beside the checkout; every comparison is skipped when that folder is
absent. Both implementations run on the same random valid inputs at small shapes, on the CPU, and
are compared the way the FlashInfer-Bench evaluators compare a solution with the reference.

Each comparison helper is also fed a perturbed output once, to show it can fail.

The official MoE reference dequantises all 32 experts to float32 at once (about 17.4 GiB peak RSS
and ~40 s here for 4 tokens), so it runs in a subprocess (`python tests/test_references.py
moe-official ...`), only when /proc/meminfo reports enough MemAvailable, and can be switched off
with KDISPATCH_SKIP_OFFICIAL_MOE=1.
"""
from __future__ import annotations

import ast
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

if __package__ in (None, ""):  # run as a script (the MoE subprocess): make `kdispatch` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from conftest import official_definition, official_run, standalone_run
from kdispatch import definitions
from kdispatch.references import dsa_sparse_attention, dsa_topk_indexer, gdn_decode, gdn_prefill, moe_fp8

REFERENCE_MODULES = {
    "gdn_decode": gdn_decode,
    "gdn_prefill": gdn_prefill,
    "dsa_topk_indexer": dsa_topk_indexer,
    "dsa_sparse_attention": dsa_sparse_attention,
    "moe_fp8": moe_fp8,
}

# Measured on the 24 GiB dev machine: peak RSS of the official MoE reference with 4 tokens.
OFFICIAL_MOE_PEAK_GIB = 17.4
OFFICIAL_MOE_NEEDS_GIB = OFFICIAL_MOE_PEAK_GIB + 1.5


def must_fail(check, *args, **kwargs):
    """The comparison `check` rejects these (perturbed) arguments."""
    with pytest.raises(AssertionError):
        check(*args, **kwargs)


# ---------------------------------------------------------------------------------------------
# The reference modules are self-contained (their text runs standalone inside FlashInfer-Bench).

@pytest.mark.parametrize("short", sorted(REFERENCE_MODULES))
def test_reference_module_is_self_contained(short):
    source = Path(REFERENCE_MODULES[short].__file__).read_text()
    tree = ast.parse(source)
    allowed = {"torch", "math", "torch.nn.functional"}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            assert {alias.name for alias in node.names} <= allowed, ast.unparse(node)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0 and node.module in allowed, ast.unparse(node)
    runs = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "run"]
    assert len(runs) == 1, "exactly one top-level run()"
    run = runs[0]
    assert ast.get_docstring(run), "run() needs a docstring stating the tensor shapes"
    assert any(ast.unparse(d) == "torch.no_grad()" for d in run.decorator_list)
    official_inputs = list(definitions.load(short)["inputs"])
    assert [a.arg for a in run.args.args] == official_inputs
    standalone_run(short)  # the embedded text executes on its own


# ---------------------------------------------------------------------------------------------
# Gated DeltaNet

def _gdn_tensors(lead: tuple, num_states: int, with_state: bool, seed: int):
    """Realistic GDN inputs: q, k L2-normalised per head (as Qwen3-Next does before the kernel)."""
    g = torch.Generator().manual_seed(seed)
    q = F.normalize(torch.randn(*lead, 4, 128, generator=g), dim=-1).to(torch.bfloat16)
    k = F.normalize(torch.randn(*lead, 4, 128, generator=g), dim=-1).to(torch.bfloat16)
    v = torch.randn(*lead, 8, 128, generator=g).to(torch.bfloat16)
    state = 0.1 * torch.randn(num_states, 8, 128, 128, generator=g) if with_state else None
    # Qwen3-Next's initialisation: A in [1, 16), dt_bias = softplus^-1(dt) with dt log-uniform in
    # [1e-3, 0.1]; the decays g then spread over roughly (0.3, 1).
    A_log = torch.log(torch.rand(8, generator=g) * 15 + 1)
    dt = torch.exp(torch.rand(8, generator=g) * (math.log(0.1) - math.log(1e-3)) + math.log(1e-3))
    dt_bias = dt + torch.log(-torch.expm1(-dt))
    a = torch.randn(*lead, 8, generator=g).to(torch.bfloat16)
    b = (torch.randn(*lead, 8, generator=g) * 2).to(torch.bfloat16)
    return q, k, v, state, A_log, a, dt_bias, b


def assert_gdn_close(ours, official, skip_state_rows=()):
    out, state = ours
    ref_out, ref_state = official
    assert out.dtype == torch.bfloat16 and state.dtype == torch.float32
    assert out.shape == ref_out.shape and state.shape == ref_state.shape
    # Outputs are O(0.01..0.1) (scale 1/sqrt(128), unit q): FlashInfer-Bench's atol of 1e-2 would
    # hide real errors, so allow about one bf16 rounding step instead.
    torch.testing.assert_close(out.float(), ref_out.float(), atol=5e-4, rtol=1e-2)
    keep = [i for i in range(state.shape[0]) if i not in skip_state_rows]
    torch.testing.assert_close(state[keep], ref_state[keep], atol=2e-6, rtol=1e-5)


@pytest.mark.parametrize("batch, with_state, scale", [(1, True, None), (3, True, 0.05), (3, False, 0.0)])
def test_gdn_decode_matches_official(batch, with_state, scale):
    official = official_run("gdn_decode")
    q, k, v, state, A_log, a, dt_bias, b = _gdn_tensors((batch, 1), batch, with_state, seed=batch)
    args = (q, k, v, state, A_log, a, dt_bias, b, scale)
    state_before = None if state is None else state.clone()

    ref = official(*args)
    ours = gdn_decode.run(*args)
    assert_gdn_close(ours, ref)
    if state is not None:
        assert torch.equal(state, state_before), "the input state must not be modified"
    # The output really depends on the state update (a stale state would be caught).
    assert ours[1].abs().max() > 0.1 and ours[0].float().abs().max() > 0.01

    out, new_state = ours
    must_fail(assert_gdn_close, (out, new_state * (1 + 1e-3)), ref)
    bumped = out.clone()
    bumped[0, 0, 7, 5] += 0.1
    must_fail(assert_gdn_close, (bumped, new_state), ref)


@pytest.mark.parametrize(
    "cu_seqlens, with_state, scale",
    [
        ([0, 1], True, None),
        ([0, 5, 6, 13], True, 0.0),
        ([0, 1, 2, 3, 4], False, None),
        ([0, 11, 12, 24], True, 0.08),
        ([0, 3, 3, 9], True, None),  # an empty sequence in the middle
    ],
)
def test_gdn_prefill_matches_official(cu_seqlens, with_state, scale):
    official = official_run("gdn_prefill")
    cu = torch.tensor(cu_seqlens, dtype=torch.int64)
    num_seqs, total = len(cu_seqlens) - 1, cu_seqlens[-1]
    q, k, v, state, A_log, a, dt_bias, b = _gdn_tensors((total,), num_seqs, with_state, seed=total)
    args = (q, k, v, state, A_log, a, dt_bias, b, cu, scale)
    state_before = None if state is None else state.clone()

    ref = official(*args)
    ours = gdn_prefill.run(*args)
    empty = [n for n in range(num_seqs) if cu_seqlens[n + 1] == cu_seqlens[n]]
    # The official reference returns a zero state for an empty sequence; ours keeps its state.
    assert_gdn_close(ours, ref, skip_state_rows=empty)
    for n in empty:
        expect = torch.zeros(8, 128, 128) if state is None else state[n]
        assert torch.equal(ours[1][n], expect)
    if state is not None:
        assert torch.equal(state, state_before), "the input state must not be modified"

    out, new_state = ours
    bumped = new_state.clone()
    bumped[-1, 3, 2, 1] += 1e-3
    must_fail(assert_gdn_close, (out, bumped), ref)
    bumped = out.clone()
    bumped[-1, 7, 127] += 0.1
    must_fail(assert_gdn_close, (bumped, new_state), ref)


def test_gdn_prefill_of_one_token_sequences_is_decode():
    """Prefill with every sequence one token long equals a batched decode step (ours vs ours)."""
    q, k, v, state, A_log, a, dt_bias, b = _gdn_tensors((4,), 4, True, seed=7)
    cu = torch.arange(5, dtype=torch.int64)
    out_p, state_p = gdn_prefill.run(q, k, v, state, A_log, a, dt_bias, b, cu, None)
    out_d, state_d = gdn_decode.run(q[:, None], k[:, None], v[:, None], state, A_log, a[:, None], dt_bias,
                                    b[:, None], None)
    torch.testing.assert_close(out_p, out_d[:, 0], atol=0, rtol=0)
    torch.testing.assert_close(state_p, state_d, atol=0, rtol=0)


# ---------------------------------------------------------------------------------------------
# DSA top-k indexer

PAGE = 64


def _indexer_inputs(seq_lens, max_num_pages, num_pages, seed):
    """Valid inputs with a deep_gemm-layout FP8 cache; also returns the dequantised keys [P, 64, 128]."""
    g = torch.Generator().manual_seed(seed)
    batch = len(seq_lens)
    keys = torch.randn(num_pages, PAGE, 128, generator=g) * (torch.rand(num_pages, PAGE, 1, generator=g) + 0.5)
    scale = keys.abs().amax(dim=-1, keepdim=True) / 448.0  # one fp32 scale per token
    key_fp8 = (keys / scale).to(torch.float8_e4m3fn)
    page_bytes = torch.cat(
        [key_fp8.view(torch.uint8).reshape(num_pages, PAGE * 128), scale.view(torch.uint8).reshape(num_pages, PAGE * 4)],
        dim=1,
    )
    cache = page_bytes.view(torch.int8).view(num_pages, PAGE, 1, 132)
    dequant = key_fp8.float() * scale  # [P, 64, 128]

    q = (torch.randn(batch, 64, 128, generator=g) * 2).to(torch.float8_e4m3fn)
    weights = torch.randn(batch, 64, generator=g) / 8
    block_table = torch.full((batch, max_num_pages), -1, dtype=torch.int32)
    for row, length in enumerate(seq_lens):
        used = -(-length // PAGE)
        block_table[row, :used] = torch.randperm(num_pages, generator=g)[:used].to(torch.int32)
    return (q, cache, weights, torch.tensor(seq_lens, dtype=torch.int32), block_table), dequant


def _indexer_scores(q, dequant, weights, seq_len, pages):
    """Float64 score of every token of one sequence, keyed by global token id."""
    keys = dequant[pages.long()].reshape(-1, 128)[:seq_len].double()
    scores = (torch.relu(q.double() @ keys.T) * weights.double()[:, None]).sum(dim=0)
    positions = torch.arange(seq_len)
    ids = pages.long()[positions // PAGE] * PAGE + positions % PAGE
    return dict(zip(ids.tolist(), scores.tolist()))


def assert_topk_equivalent(ours, official, inputs, dequant, topk=2048):
    """FlashInfer-Bench's indexer check: reachable, unique, right count, same sorted scores."""
    q, _, weights, seq_lens, block_table = inputs
    assert isinstance(ours, torch.Tensor), "return the tensor itself, not a tuple"
    assert ours.dtype == torch.int32 and ours.shape == official.shape == (q.shape[0], topk)
    for row in range(q.shape[0]):
        seq_len = int(seq_lens[row])
        expect = min(topk, seq_len)
        scored = _indexer_scores(q[row].float(), dequant, weights[row], seq_len, block_table[row, : -(-seq_len // PAGE)])
        picks = {}
        for name, result in (("ours", ours[row]), ("official", official[row])):
            chosen = result[result != -1].tolist()
            assert len(chosen) == expect, f"row {row} {name}: {len(chosen)} indices, want {expect}"
            assert (result[expect:] == -1).all(), f"row {row} {name}: -1 padding must trail"
            assert len(set(chosen)) == expect, f"row {row} {name}: duplicate indices"
            assert all(c in scored for c in chosen), f"row {row} {name}: index outside the sequence"
            picks[name] = torch.tensor(sorted(scored[c] for c in chosen), dtype=torch.float64)
        torch.testing.assert_close(picks["ours"], picks["official"], atol=1e-4, rtol=1e-5)


@pytest.mark.parametrize(
    "seq_lens, max_num_pages, num_pages",
    [
        ([2560, 0, 2049, 700], 40, 96),  # above, at 0, just above and below topk, small page pool
        ([2048, 64, 1], 32, 40),
        ([3000], 47, 64),
    ],
)
def test_dsa_topk_indexer_matches_official(seq_lens, max_num_pages, num_pages):
    official = official_run("dsa_topk_indexer")
    inputs, dequant = _indexer_inputs(seq_lens, max_num_pages, num_pages, seed=sum(seq_lens))
    ref = official(*inputs)
    ref = ref[0] if isinstance(ref, tuple) else ref
    ours = dsa_topk_indexer.run(*inputs)
    assert_topk_equivalent(ours, ref, inputs, dequant)
    for row, length in enumerate(seq_lens):
        if length == 0:
            assert (ours[row] == -1).all()

    row = max(range(len(seq_lens)), key=lambda r: seq_lens[r])  # a row with more tokens than topk
    if seq_lens[row] > 2048:
        scored = _indexer_scores(inputs[0][row].float(), dequant, inputs[2][row], seq_lens[row],
                                 inputs[4][row, : -(-seq_lens[row] // PAGE)])
        worst_unpicked = min(set(scored) - set(ours[row].tolist()), key=scored.get)
        swapped = ours.clone()
        swapped[row, 0] = worst_unpicked  # a valid but poor choice
        must_fail(assert_topk_equivalent, swapped, ref, inputs, dequant)
    duplicated = ours.clone()
    duplicated[row, 1] = duplicated[row, 0]
    must_fail(assert_topk_equivalent, duplicated, ref, inputs, dequant)


# ---------------------------------------------------------------------------------------------
# DSA sparse attention

def _sparse_attention_inputs(num_tokens, num_pages, seed):
    g = torch.Generator().manual_seed(seed)
    pool = num_pages * PAGE
    q_nope = torch.randn(num_tokens, 16, 512, generator=g).to(torch.bfloat16)
    q_pe = torch.randn(num_tokens, 16, 64, generator=g).to(torch.bfloat16)
    ckv = torch.randn(num_pages, PAGE, 512, generator=g).to(torch.bfloat16)
    kpe = torch.randn(num_pages, PAGE, 64, generator=g).to(torch.bfloat16)
    indices = torch.stack([torch.randperm(pool, generator=g)[:2048] for _ in range(num_tokens)]).to(torch.int32)
    indices[1, 700:] = -1  # trailing padding (a short sequence)
    indices[2] = -1  # no valid index at all
    indices[3, torch.rand(2048, generator=g) < 0.5] = -1  # scattered padding
    indices[4, 1:] = -1  # a single token
    return q_nope, q_pe, ckv, kpe, indices, 1.0 / math.sqrt(192)


def assert_sparse_attention_close(ours, official):
    out, lse = ours
    ref_out, ref_lse = official
    assert out.dtype == torch.bfloat16 and lse.dtype == torch.float32
    torch.testing.assert_close(out.float(), ref_out.float(), atol=1e-2, rtol=1e-2)
    torch.testing.assert_close(lse, ref_lse, atol=1e-4, rtol=1e-5)  # equal infinities compare equal


def test_dsa_sparse_attention_matches_official():
    official = official_run("dsa_sparse_attention")
    inputs = _sparse_attention_inputs(num_tokens=6, num_pages=40, seed=3)
    ref = official(*inputs)
    ours = dsa_sparse_attention.run(*inputs)
    assert_sparse_attention_close(ours, ref)
    out, lse = ours
    assert torch.equal(out[2], torch.zeros_like(out[2])) and torch.isneginf(lse[2]).all()
    assert torch.isfinite(lse[[0, 1, 3, 4, 5]]).all()
    # A single selected token: the output is that token's value row, lse its base-2 logit.
    token = int(inputs[4][4, 0])
    assert torch.equal(out[4], inputs[2].reshape(-1, 512)[token].expand(16, 512))

    bumped = out.clone()
    bumped[0, 3, 100] += 0.05
    must_fail(assert_sparse_attention_close, (bumped, lse), ref)
    must_fail(assert_sparse_attention_close, (out, lse + 1e-3), ref)
    must_fail(assert_sparse_attention_close, (out, lse * math.log(2.0)), ref)  # natural-log lse is wrong


def test_dsa_sparse_attention_blocks_of_tokens():
    """More tokens than one block of the implementation: same as token-by-token (ours vs ours)."""
    g = torch.Generator().manual_seed(11)
    n = dsa_sparse_attention.TOKENS_PER_BLOCK + 3
    q_nope = torch.randn(n, 16, 512, generator=g).to(torch.bfloat16)
    q_pe = torch.randn(n, 16, 64, generator=g).to(torch.bfloat16)
    ckv = torch.randn(4, PAGE, 512, generator=g).to(torch.bfloat16)
    kpe = torch.randn(4, PAGE, 64, generator=g).to(torch.bfloat16)
    indices = torch.randint(-1, 4 * PAGE, (n, 2048), generator=g, dtype=torch.int32)
    out, lse = dsa_sparse_attention.run(q_nope, q_pe, ckv, kpe, indices, 0.1)
    for t in (0, n - 2, n - 1):
        o1, l1 = dsa_sparse_attention.run(q_nope[t:t + 1], q_pe[t:t + 1], ckv, kpe, indices[t:t + 1], 0.1)
        torch.testing.assert_close(out[t:t + 1], o1, atol=0, rtol=0)
        torch.testing.assert_close(lse[t:t + 1], l1, atol=0, rtol=0)


# ---------------------------------------------------------------------------------------------
# FP8 block-scale MoE

MOE_TOKENS, MOE_SEED, MOE_OFFSET = 4, 5, 32


def _random_fp8(shape, g):
    """FP8 e4m3 values of magnitude below 2 (exponent field < 8), never NaN."""
    return (torch.randint(0, 256, shape, dtype=torch.uint8, generator=g) & 0xBF).view(torch.float8_e4m3fn)


def _moe_inputs(num_tokens, seed, offset):
    """Token 0 routes only to this rank's experts, token `num_tokens - 1` to none, the rest mixed."""
    g = torch.Generator().manual_seed(seed)
    local = slice(offset, offset + 32)
    logits = torch.randn(num_tokens, 256, generator=g)
    logits[0, local] += 4.0
    logits[-1, local] -= 8.0
    bias = torch.randn(256, generator=g) * 0.05
    bias[local] += 0.2
    hidden = _random_fp8((num_tokens, 7168), g)
    hidden_scale = torch.rand(56, num_tokens, generator=g) + 0.5
    w13 = torch.empty(32, 4096, 7168, dtype=torch.float8_e4m3fn)
    w2 = torch.empty(32, 7168, 2048, dtype=torch.float8_e4m3fn)
    for e in range(32):
        w13[e] = _random_fp8((4096, 7168), g)
        w2[e] = _random_fp8((7168, 2048), g)
    w13_scale = (torch.rand(32, 32, 56, generator=g) + 0.5) * 0.03
    w2_scale = (torch.rand(32, 56, 16, generator=g) + 0.5) * 0.05
    return (logits, bias.to(torch.bfloat16), hidden, hidden_scale, w13, w13_scale, w2, w2_scale, offset, 2.5)


def _mem_available_gib() -> float:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 2**20
    except OSError:
        pass
    return 0.0


def assert_moe_close(ours, official):
    """Much tighter than the FP8 evaluator (matched ratio of |d| <= 1 or rel <= 0.3 at least 0.9):
    both sides compute in float32, so every element agrees to one bfloat16 rounding step."""
    assert ours.dtype == torch.bfloat16 and ours.shape == official.shape
    x, y = ours.float(), official.float()
    err = (x - y).abs()
    matched = ((err <= 1.0) | (err <= 0.3 * y.abs())).float().mean().item()
    assert matched >= 0.9, f"FP8 evaluator matched ratio {matched}"
    bad = err > 1e-4 + 2.0**-7 * y.abs()
    assert not bad.any(), f"{int(bad.sum())} elements off by more than a bf16 ulp (max {err.max().item()})"
    assert (err == 0).float().mean().item() >= 0.99


def _run_official_moe(out_path):
    """Subprocess body: the official reference on the test inputs, output saved to `out_path`."""
    official = official_run("moe_fp8")
    torch.save(official(*_moe_inputs(MOE_TOKENS, MOE_SEED, MOE_OFFSET)), out_path)


def test_moe_fp8_matches_official(tmp_path):
    official_definition("moe_fp8")
    if os.environ.get("KDISPATCH_SKIP_OFFICIAL_MOE"):
        pytest.skip("KDISPATCH_SKIP_OFFICIAL_MOE is set")
    available = _mem_available_gib()
    if available < OFFICIAL_MOE_NEEDS_GIB:
        pytest.skip(f"the official MoE reference needs ~{OFFICIAL_MOE_NEEDS_GIB:.1f} GiB free memory "
                    f"(it materialises all 32 experts in fp32); MemAvailable is {available:.1f} GiB")
    out_path = tmp_path / "official_moe.pt"
    proc = subprocess.run([sys.executable, __file__, "moe-official", str(out_path)], capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, f"official MoE subprocess failed ({proc.returncode}):\n{proc.stderr[-3000:]}"
    ref = torch.load(out_path)

    inputs = _moe_inputs(MOE_TOKENS, MOE_SEED, MOE_OFFSET)
    ours = moe_fp8.run(*inputs)
    assert_moe_close(ours, ref)
    assert ours[0].float().abs().max() > 0.1, "token 0 routes to local experts"
    assert ours[1:-1].float().abs().amax(dim=1).min() > 0.1, "the mixed tokens reach local experts too"
    assert torch.equal(ours[-1], torch.zeros_like(ours[-1])), "the last token has no local expert"

    bumped = ours.clone()
    bumped[0, 10] += 0.05 + 0.05 * bumped[0, 10].abs()
    must_fail(assert_moe_close, bumped, ref)


def test_moe_fp8_only_local_experts_contribute():
    """Runs without the official reference (small memory): tokens routed off this rank give zeros."""
    inputs = list(_moe_inputs(2, seed=9, offset=64))  # token 0: local experts only; token 1: none
    out = moe_fp8.run(*inputs)
    assert out.shape == (2, 7168) and out.dtype == torch.bfloat16
    assert out[0].float().abs().max() > 0.1 and torch.isfinite(out.float()).all()
    assert torch.equal(out[1], torch.zeros_like(out[1]))
    inputs[8] = 256  # a rank past the last expert holds none of the chosen ones
    assert torch.equal(moe_fp8.run(*inputs), torch.zeros_like(out))


if __name__ == "__main__":
    if sys.argv[1:2] == ["moe-official"] and len(sys.argv) == 3:
        _run_official_moe(sys.argv[2])
    else:
        sys.exit("usage: python tests/test_references.py moe-official OUT.pt")
