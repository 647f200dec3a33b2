"""Speculative verification on the GPU in SGLang's convention (gdn_verify_*; vLLM's, gdn_verify_steps_*, at
the end): every registered variant
(SGLang's Triton verify kernel behind its index guard, where staged: benchmarks/stage_engines.sh)
against the reference on engine layouts (q/k/v split out of one projection row, a pool whose slot
pitch exceeds a slot), on hostile slots, cache rows and boundaries (nothing outside the pool or the
buffer read or written), and inside a CUDA graph. Skipped without CUDA."""
import pytest
import torch

from engine_pool import paged, untouched_margins
from engine_pool import args_for as _args_for
from engine_pool import runnable as _runnable
from kdispatch import arch, registry
from kdispatch.definitions.gdn.names import PACKED_HEADS, verify_name, verify_steps_name

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

HEADS = [(hq, hv) for hq, hv in PACKED_HEADS.values()]
INT32_MIN, INT32_MAX = -2**31, 2**31 - 1
Q, K, V, A, B, A_LOG, DT_BIAS, POOL, IDX, CU, INTER, ROWS, SCALE = range(13)


def variants(hq, hv):
    return [v.name for v in registry.variants(verify_name(hq, hv)) if v.name != registry.REFERENCE]


def args_for(hq, hv, seqs, steps, seed=0, rows=None):
    return _args_for(verify_name(hq, hv), {"num_seqs": seqs, "cache_steps": steps, "total_seq_len": seqs * steps,
                                           "num_slots": seqs + 3, "num_cache_rows": rows or seqs + 2}, seed)


def runnable(hq, hv, name):
    return _runnable(verify_name(hq, hv), name)


def reference(hq, hv, args):
    return registry.get(verify_name(hq, hv), "reference").fn(*[x.clone() if torch.is_tensor(x) else x for x in args])


def check(got, want):
    (out, inter), (want_out, want_inter) = got, want
    assert not torch.isnan(out).any()
    torch.testing.assert_close(out.float(), want_out.float(), rtol=1e-2, atol=1e-2)  # the spec's tolerance
    torch.testing.assert_close(inter, want_inter, rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("hq,hv", HEADS)
@pytest.mark.parametrize("seqs,steps", [(1, 2), (12, 4), (64, 8)])
def test_engine_layouts(hq, hv, seqs, steps):
    for name in variants(hq, hv):
        v = runnable(hq, hv, name)
        args = args_for(hq, hv, seqs, steps, seed=seqs)
        want = reference(hq, hv, args)
        total = seqs * steps
        q, k, vv = args[Q], args[K], args[V]
        row = torch.zeros(total, (2 * hq + hv) * 128 + 64, dtype=q.dtype, device="cuda")
        parts = row[:, 64:].split([hq * 128, hq * 128, hv * 128], dim=1)
        for dst, src in zip(parts, (q, k, vv)):
            dst.copy_(src.reshape(total, -1))
        args[Q], args[K], args[V] = (p.view(total, -1, 128) for p in parts)
        pages, args[POOL] = paged(args[POOL])
        before = pages.clone()
        got = v.fn(*args)
        assert got[1] is args[INTER], name
        check(got, want)
        assert torch.equal(pages, before), f"{name} wrote the pool"


@pytest.mark.parametrize("kind", ["slots", "rows", "boundaries", "long"])
def test_hostile_indices_touch_nothing_outside(kind):
    hq, hv = 4, 8
    for name in variants(hq, hv):
        v = runnable(hq, hv, name)
        args = args_for(hq, hv, 16, 4, seed=3, rows=16)
        edges = torch.tensor([INT32_MIN, -65, -1, 16, 17, 1 << 20, INT32_MAX, -2], dtype=torch.int32)
        if kind == "slots":
            args[IDX][:8] = edges
        elif kind == "rows":
            args[ROWS][:8] = edges
        elif kind == "boundaries":
            args[CU][3] = 1 << 30
        else:  # the last request longer than a row: stores nothing (SGLang's kernel would run past the buffer)
            args[CU][1:-1] = torch.arange(1, 16, dtype=torch.int32, device="cuda")
        inter = args[INTER]
        row = inter[0].numel()
        buf = torch.full((inter.numel() + 2 * row,), 7.0, device="cuda")  # margins that must stay untouched
        args[INTER] = buf[row:row + inter.numel()].view(inter.shape)
        args[INTER].copy_(inter)
        want = reference(hq, hv, args)
        check(v.fn(*args), want)
        assert bool((buf[:row] == 7).all()) and bool((buf[-row:] == 7).all()), name


@pytest.mark.parametrize("hq,hv", HEADS)
def test_in_a_graph(hq, hv):
    for name in variants(hq, hv):
        v = runnable(hq, hv, name)
        args = args_for(hq, hv, 32, 4)
        want = reference(hq, hv, args)
        work = [x.clone() if torch.is_tensor(x) else x for x in args]
        v.fn(*[x.clone() if torch.is_tensor(x) else x for x in args])  # compile and autotune outside the capture
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            got = v.fn(*work)
        work[INTER].copy_(args[INTER])
        g.replay()
        check(got, want)


# ---- vLLM's contract (gdn_verify_steps_*): a slot per draft step, in the pool itself -------------

def steps_args(hq, hv, seqs, steps, seed=0):
    return _args_for(verify_steps_name(hq, hv), {"num_seqs": seqs, "num_steps": steps, "total_seq_len": seqs * steps,
                                                 "num_slots": seqs * steps + 3}, seed)


@pytest.mark.parametrize("hq,hv", HEADS)
@pytest.mark.parametrize("seqs,steps", [(1, 2), (12, 4), (64, 8)])
def test_steps_on_a_paged_pool(hq, hv, seqs, steps):
    """vLLM's pool is a view into cache pages (slot pitch > a slot); the margins stay untouched."""
    name = verify_steps_name(hq, hv)
    for v in [v for v in registry.variants(name) if v.name != registry.REFERENCE]:
        if v.why_not(arch.local_arch()):
            continue
        args = steps_args(hq, hv, seqs, steps, seed=seqs)
        pages, args[POOL] = paged(args[POOL])
        want_out, want_pool = registry.get(name, "reference").fn(*[x.clone() if torch.is_tensor(x) else x
                                                                    for x in args])
        out, got = v.fn(*args)
        assert got is args[POOL], v.name
        torch.testing.assert_close(out.float(), want_out.float(), rtol=1e-2, atol=1e-2)
        torch.testing.assert_close(got, want_pool, rtol=1e-2, atol=1e-2)
        assert untouched_margins(pages, args[POOL][0].numel()), f"{v.name} wrote between slots"
