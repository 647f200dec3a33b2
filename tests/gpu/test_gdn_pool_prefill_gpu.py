"""The engines' pool prefill on the GPU (gdn_prefill_pool_*): the CUDA recurrence, the staged kernels
(Triton, and with the CUDA walk) and SGLang's default Hopper path (FlashInfer with its gather/scatter;
where staged: benchmarks/stage_engines.sh) against the reference on engine layouts (q/k/v split out of
one projection row, a pool whose slot pitch exceeds a slot), on padding and hostile slot indices
(nothing outside the pool read or written), a malformed cu_seqlens (zero output, pool unchanged), and
inside a CUDA graph. Skipped without CUDA."""
import pytest
import torch

from engine_pool import check_prefill as check
from engine_pool import paged, untouched_margins
from engine_pool import reference as _reference
from engine_pool import args_for as _args_for
from engine_pool import runnable as _runnable
from kdispatch.definitions.gdn.names import PACKED_HEADS, pool_prefill_name

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

HEADS = [(hq, hv) for hq, hv in PACKED_HEADS.values()]
VARIANTS = ["cuda_prefill_pool_rows.k1c8", "cuda_prefill_pool_rows.k2c16", "cuda_prefill_pool_rows.k8c8",
            "cuda_prefill_pool_rows.k16c16", "sglang_flashinfer_prefill", "flashinfer_pool_inplace",
            "flashinfer_direct", "triton_prefill_staged.c16v32", "triton_prefill_staged.c16v64",
            "cuda_prefill_staged.r32s4", "cuda_prefill_staged.r64s4", "cuda_prefill_cp.p4",
            "cuda_prefill_cp.p16"]
INT32_MIN, INT32_MAX = -2**31, 2**31 - 1
Q, K, V, G, BETA, POOL, IDX, INIT, CU, OUT = range(10)


def args_for(hq, hv, total, seqs, slots, seed=0):
    return _args_for(pool_prefill_name(hq, hv), {"total_seq_len": total, "num_seqs": seqs, "num_slots": slots}, seed)


def runnable(hq, hv, name):
    return _runnable(pool_prefill_name(hq, hv), name)


def reference(hq, hv, args):
    return _reference(pool_prefill_name(hq, hv), args)


@pytest.mark.parametrize("name", VARIANTS)
@pytest.mark.parametrize("hq,hv", HEADS)
@pytest.mark.parametrize("total,seqs", [(1, 1), (37, 3), (300, 12), (700, 40)])
def test_engine_layouts(hq, hv, total, seqs, name):
    v = runnable(hq, hv, name)
    args = args_for(hq, hv, total, seqs, seqs + 5, seed=total)
    if seqs >= 3:  # an empty live sequence starting from zeros: its slot is zeroed
        cu = args[CU]
        cu[2] = cu[1]
        args[INIT][1] = False
    want = reference(hq, hv, args)
    # q | k | v as views of one projection row [T, (2 HQ + HV) * 128 + 64], as SGLang splits them
    q, k, vv = args[Q], args[K], args[V]
    row = torch.zeros(total, (2 * hq + hv) * 128 + 64, dtype=q.dtype, device="cuda")
    parts = row[:, 64:].split([hq * 128, hq * 128, hv * 128], dim=1)
    for dst, src in zip(parts, (q, k, vv)):
        dst.copy_(src.reshape(total, -1))
    args[Q], args[K], args[V] = (p.view(total, -1, 128) for p in parts)
    pages, view = paged(args[POOL])
    args[POOL] = view
    got = v.fn(*args)
    assert got[1] is view and got[0] is args[OUT]
    check(got, want)
    assert untouched_margins(pages, view[0].numel()), "written between slots"


@pytest.mark.parametrize("name", VARIANTS)
def test_hostile_slots_touch_nothing_outside_the_pool(name):
    hq, hv = 4, 8
    v = runnable(hq, hv, name)
    args = args_for(hq, hv, 200, 16, 20, seed=3)
    args[IDX][:8] = torch.tensor([INT32_MIN, -65, -1, 20, 21, 1 << 20, INT32_MAX, -2], dtype=torch.int32)
    slot = args[POOL][0].numel()
    buf = torch.full((22 * slot,), 7.0, device="cuda")  # margins that must stay untouched
    pool = buf[slot:21 * slot].view(args[POOL].shape)
    pool.copy_(args[POOL])
    args[POOL] = pool
    want = reference(hq, hv, args)
    got = v.fn(*args)
    check(got, want)
    assert bool((buf[:slot] == 7).all()) and bool((buf[21 * slot:] == 7).all())


@pytest.mark.parametrize("name", VARIANTS)
@pytest.mark.parametrize("hq,hv", [(2, 4), (16, 32)])  # FlashInfer splits 2 sequences x 4 heads across SMs
@pytest.mark.parametrize("padding", ["between", "all"])
def test_padding_sequences_anywhere(name, hq, hv, padding):
    """Padding between live sequences and at the end (the in-place FlashInfer variant joins their tokens
    to the live sequence before them and hands FlashInfer empty sequences in slot 0, which must stay
    untouched by them: a live sequence owns it here), or no live sequence at all."""
    v = runnable(hq, hv, name)
    args = args_for(hq, hv, 300, 7, 9, seed=11)
    live = [0, 3, 4] if padding == "between" else []
    for n in range(7):
        if n not in live:
            args[IDX][n] = -1
    if live:  # a live sequence in slot 0, the slot the in-place FlashInfer variant gives empty sequences
        args[IDX][3] = 0
    want = reference(hq, hv, args)
    got = v.fn(*args)
    check(got, want)


@pytest.mark.parametrize("name", VARIANTS)
@pytest.mark.parametrize("bad", ["first", "decreasing", "last"])
def test_malformed_cu_seqlens_is_a_no_op(name, bad):
    hq, hv = 4, 8
    v = runnable(hq, hv, name)
    args = args_for(hq, hv, 120, 6, 10, seed=5)
    cu = args[CU]
    if bad == "first":
        cu[0] = 3
    elif bad == "decreasing":
        cu[3] = cu[2] - 1
    else:
        cu[-1] = 1 << 30
    before = args[POOL].clone()
    out, pool = v.fn(*args)
    assert torch.equal(out, torch.zeros_like(out))
    assert torch.equal(pool, before)


@pytest.mark.parametrize("name", ["cuda_prefill_cp.p4", "cuda_prefill_cp.p16"])
@pytest.mark.parametrize("hq,hv", [(2, 4), (8, 16)])
@pytest.mark.parametrize("total,seqs", [(2048, 1), (3000, 3)])
def test_context_parallel_on_long_sequences(hq, hv, total, seqs, name):
    """CP's segments, chain and corrections where it is offered, one or a few long sequences (random
    lengths: segment edges fall inside the packed batch's blocks), one of them without an initial state."""
    v = runnable(hq, hv, name)
    args = args_for(hq, hv, total, seqs, seqs + 2, seed=total)
    if seqs > 1:
        args[INIT][1] = False
    want = reference(hq, hv, args)
    check(v.fn(*args), want)


@pytest.mark.parametrize("lengths", [[1801, 3, 0, 300, 129, 700, 17, 255, 256], [5, 4000, 0, 33]])
@pytest.mark.parametrize("name", ["cuda_prefill_cp.p4", "cuda_prefill_cp.p16"])
@pytest.mark.parametrize("hq,hv", [(2, 4), (8, 16)])
def test_context_parallel_fits_segments_to_each_sequence(hq, hv, name, lengths):
    """A long sequence among short ones: each sequence in the segments the .cu's cp_plan gives it (its
    blocks over the larger of CP_SEG_BLOCKS and the batch's unsplit walk time), from the walk alone (one
    segment: no chain, no correction) through fewer segments than the configuration's to all of them (at 4
    value heads 1,801 tokens in 4 or 7 segments, 700 in 2, 4,000 in 4 or 15; at 16, 1,801 in 2 and 4,000
    in 4); an empty sequence, one without an initial state, a sequence starting mid-block."""
    v = runnable(hq, hv, name)
    args = args_for(hq, hv, sum(lengths), len(lengths), len(lengths) + 2, seed=7)
    args[CU].copy_(torch.tensor([0] + lengths, device="cuda").cumsum(0))
    args[INIT][len(lengths) - 1] = False
    want = reference(hq, hv, args)
    args[OUT].fill_(float("nan"))  # every row is a live sequence's: each must be written
    check(v.fn(*args), want)


@pytest.mark.parametrize("name", ["cuda_prefill_pool_rows.k4c16", "sglang_flashinfer_prefill",
                                  "flashinfer_pool_inplace", "flashinfer_direct", "cuda_prefill_cp.p4"])
@pytest.mark.parametrize("hq,hv", HEADS)
def test_in_a_graph(hq, hv, name):
    v = runnable(hq, hv, name)
    args = args_for(hq, hv, 512, 9, 12)
    want = reference(hq, hv, args)
    work = [x.clone() if torch.is_tensor(x) else x for x in args]
    v.fn(*[x.clone() if torch.is_tensor(x) else x for x in args])  # compile and autotune outside the capture
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        got = v.fn(*work)
    for i in (OUT, POOL):
        work[i].copy_(args[i])
    g.replay()
    check(got, want, states=work[POOL])
