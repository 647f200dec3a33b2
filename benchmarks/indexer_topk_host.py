"""Where `triton_fp8_flashinfer_topk`'s eager host time goes, step by step, on the GPU machine.

The indexer variant that serves rows over 8,192 tokens (128 pages) makes five allocations and four
launches: the Triton scoring (a JIT call), the settling kernel, FlashInfer's
`top_k_page_table_transform` and the keep-real kernel. This times each step alone (host: until it
returns, the device idle before; eager: host + device of a synchronised call; `hosttime.host_us`), FlashInfer's two
backends called through its module's wrappers (radix; CUB with its workspace query, which the
public call takes for one row of 32k tokens or more), the scoring through `launch` instead of the JIT
call, and `lean`: the same steps with the scoring through `launch` and the four int32 buffers as
one allocation (checked against the variant's ids). It measures what a leaner variant would save;
the variant itself is unchanged (its scoring module is part of every indexer variant's provenance,
the baseline's too).

    python benchmarks/indexer_topk_host.py        # after the fi-aot (or fi-jit) setup: FlashInfer's top-k
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import flashinfer  # noqa: E402
import torch  # noqa: E402
import triton  # noqa: E402
from flashinfer.topk import get_topk_module  # noqa: E402
from hosttime import host_us  # noqa: E402

from kdispatch import definitions, registry, workloads  # noqa: E402
from kdispatch.kernels.library.dsa import flashinfer_topk as fi_topk  # noqa: E402
from kdispatch.kernels.triton.dsa import indexer_fp8 as ix  # noqa: E402
from kdispatch.kernels.triton.launch import launch  # noqa: E402

SHAPES = ((1, 845), (4, 577), (12, 463), (51, 144))  # (batch, pages): rows of 9k-54k tokens


def steps(batch: int, pages: int) -> dict:
    """name -> zero-argument callable, for one shape of the indexer's first contest workload."""
    full = definitions.resolve_name("dsa_topk_indexer")
    axes = {**dict(workloads.load_workloads("traces", full)[0].axes), "batch_size": batch,
            "max_num_pages": pages, "num_pages": 16384}
    args = workloads.materialize(full, {"axes": axes, "inputs": {}, "uuid": "indexer-topk-host"}, device="cuda")
    q, cache, weights, seq_lens, table = args
    dev, width, num_pages = table.device, pages * ix.PAGE_SIZE, cache.shape[0]
    variant = registry.get(full, "triton_fp8_flashinfer_topk").fn
    page_bytes = cache.view(num_pages, ix.PAGE_BYTES)
    scores = ix.score_pages(q, cache, weights, seq_lens, table)
    settled = torch.empty((batch, pages), dtype=torch.int32, device=dev)
    lens = torch.empty(batch, dtype=torch.int32, device=dev)
    ids, raw, out = (torch.empty((batch, ix.TOPK), dtype=torch.int32, device=dev) for _ in range(3))
    module = get_topk_module()
    row_states = torch.zeros(1 << 20, dtype=torch.uint8, device=dev)

    def score_launch():
        s = torch.empty(batch, width, dtype=torch.float32, device=dev)
        launch(ix._score_pages_kernel, (batch, pages), q, page_bytes.view(torch.float8_e4m3fn),
               page_bytes.view(torch.float32), weights, seq_lens, table, s, pages, num_pages, table.stride(0),
               ix.HEADS, ix.HEAD_DIM, ix.PAGE_SIZE, 1, False, ix.TOPK, False, num_warps=4)
        return s

    def cub():
        size = module.cub_topk_page_table_transform_workspace_size(scores, lens, ix.TOPK, 0, True, False)
        workspace = flashinfer.utils._get_cache_buf("indexer_topk_host_cub", size, dev)
        module.cub_topk_page_table_transform(scores, ix.TOPK, 0, ix.PAGE_SIZE, lens, settled, ids, raw, workspace)

    def lean():
        buf = torch.empty(batch * (2 * ix.TOPK + pages + 1), dtype=torch.int32, device=dev)
        sel_ids, sel_raw = buf[:2 * batch * ix.TOPK].view(2, batch, ix.TOPK).unbind(0)
        tab = buf[2 * batch * ix.TOPK:2 * batch * ix.TOPK + batch * pages].view(batch, pages)
        ln = buf[2 * batch * ix.TOPK + batch * pages:]
        o = torch.empty((batch, ix.TOPK), dtype=torch.int32, device=dev)
        s = score_launch()
        launch(fi_topk._settle_pages_kernel, (batch, triton.cdiv(pages, fi_topk.PAGES_PER_PROGRAM)), table,
               table.stride(0), seq_lens, s, s.stride(0), tab, ln, pages, num_pages, ix.PAGE_SIZE,
               fi_topk.PAGES_PER_PROGRAM)
        flashinfer.top_k_page_table_transform(s, tab, ln, ix.TOPK, page_size=ix.PAGE_SIZE, out=sel_ids,
                                              out_raw_indices=sel_raw)
        launch(fi_topk._keep_real_kernel, (batch,), sel_ids, sel_raw, table, table.stride(0), o, o.stride(0),
               num_pages, ix.PAGE_SIZE, ix.TOPK, num_warps=8)
        return o

    if not torch.equal(lean().sort(1).values, variant(*args).sort(1).values):
        raise SystemExit(f"lean steps select other ids than the variant at {batch} x {pages} pages")
    return {
        "variant": lambda: variant(*args),
        "lean": lean,
        "score_pages (JIT call)": lambda: ix.score_pages(q, cache, weights, seq_lens, table),
        "score (launch)": score_launch,
        "settle": lambda: launch(fi_topk._settle_pages_kernel, (batch, triton.cdiv(pages, fi_topk.PAGES_PER_PROGRAM)),
                                 table, table.stride(0), seq_lens, scores, scores.stride(0), settled, lens, pages,
                                 num_pages, ix.PAGE_SIZE, fi_topk.PAGES_PER_PROGRAM),
        "flashinfer API": lambda: flashinfer.top_k_page_table_transform(
            scores, settled, lens, ix.TOPK, page_size=ix.PAGE_SIZE, out=ids, out_raw_indices=raw),
        "flashinfer radix": lambda: module.radix_topk_page_table_transform(
            scores, ids, settled, None, lens, row_states, ix.TOPK, False, 0, ix.PAGE_SIZE, False, None, None, raw),
        "flashinfer CUB": cub,
        "keep": lambda: launch(fi_topk._keep_real_kernel, (batch,), ids, raw, table, table.stride(0), out,
                               out.stride(0), num_pages, ix.PAGE_SIZE, ix.TOPK, num_warps=8),
        "4 x torch.empty": lambda: [torch.empty((batch, ix.TOPK), dtype=torch.int32, device=dev) for _ in range(4)],
        "one allocation": lambda: torch.empty(4 * batch * ix.TOPK, dtype=torch.int32, device=dev),
    }


def main() -> None:
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, flashinfer {flashinfer.__version__}")
    for batch, pages in SHAPES:
        print(f"\n== B={batch} pages={pages}")
        for name, fn in steps(batch, pages).items():
            print(f"  {name:24s} host {host_us(fn, ()):7.1f} us   eager {host_us(fn, (), until_idle=True):7.1f} us")


if __name__ == "__main__":
    main()
